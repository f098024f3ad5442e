/* The block index: one record per key KVCR knows, found by key in O(1).
 *
 * Records live in fixed chunks, so a record's address never moves and a
 * block_id (a 32-bit index) names it compactly. Records keep no hash
 * (it is recomputed when the table grows): the goal is <= 128 bytes of
 * metadata per resident block with keys of up to 32 bytes held inline. The hash table is open
 * addressing with linear probing and backward-shift deletion; each slot
 * keeps 32 bits of the key's hash so that most probes never touch a
 * record. */
#ifndef KVCR_CORE_INDEX_H
#define KVCR_CORE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tier.h"
#include "kvcr/types.h"

typedef uint32_t block_id;
#define BLOCK_NONE UINT32_MAX
#define KEY_INLINE 32

enum g2_state { G2_NONE = 0, G2_FILLING, G2_READY, G2_DISCARDING };

enum block_flag {
    BF_IN_LIST = 1u << 0,   /* queued in the evictable list */
    BF_IN_HEAP = 1u << 1,   /* queued in the evictable heap */
    BF_RETIRE = 1u << 2,    /* free the slots when the last claim ends */
    BF_UNSCORED = 1u << 3,  /* waiting for the policy to score it */
    BF_PROTECTED = 1u << 4, /* part of the batch being allocated for */
    BF_SCORED = 1u << 5     /* score holds a valid previous score */
};

struct fill;

typedef struct block {
    /* What a lookup reads comes first and together: key, length, state. */
    union {
        uint8_t inl[KEY_INLINE];
        uint8_t *heap;
    } key;
    uint16_t key_len;
    uint8_t g2_state;
    uint8_t flags;
    uint8_t n_slots; /* layout length of the G2 residency; 0 if none */
    uint8_t tenant;  /* 0: none; else conf tenant tenant - 1 (core/tenants.h) */
    uint32_t claims;
    uint32_t access_count;
    uint32_t q_prev, q_next; /* list links; q_prev is the heap index in the heap */
    union {
        struct {
            uint32_t slot;
            uint8_t pool;
        } one;              /* n_slots == 1 */
        uint32_t *many;     /* n_slots > 1: pairs (pool, slot) */
    } sl;
    double score;            /* eviction score, valid with BF_SCORED */
    uint64_t seq;            /* when it last entered the evictable set */
    uint64_t last_access_ns; /* 0: never accessed */
    struct fill *fill;       /* the fill in flight while G2_FILLING */
    tier_lower lower;        /* a lower tier's residency (core/tier.h) */
} block;

typedef struct index_slot {
    uint32_t id;  /* BLOCK_NONE when empty */
    uint32_t tag; /* high 32 bits of the hash */
} index_slot;

typedef struct block_index {
    index_slot *table;
    uint64_t mask; /* table size - 1 */
    uint64_t count;
    block **chunks;
    uint32_t n_chunks;
    uint32_t next_unused; /* ids below it have been handed out once */
    uint32_t *free_ids;
    uint32_t n_free, cap_free;
} block_index;

int index_init(block_index *ix);
void index_destroy(block_index *ix);

uint64_t index_hash(const uint8_t *key, size_t len);

#define INDEX_CHUNK_SHIFT 16
static inline block *index_get(const block_index *ix, block_id id)
{
    return &ix->chunks[id >> INDEX_CHUNK_SHIFT][id & ((1u << INDEX_CHUNK_SHIFT) - 1)];
}

static inline const uint8_t *block_key(const block *b)
{
    return b->key_len <= KEY_INLINE ? b->key.inl : b->key.heap;
}

block_id index_find(const block_index *ix, const uint8_t *key, size_t len, uint64_t hash);

/* Warms the cache for a coming index_find: the first table slot whose tag
 * matches, and that record's key. Issued for a batch of keys first, the
 * cache misses of the batch overlap instead of queueing. */
static inline void index_prefetch_record(const block_index *ix, uint64_t hash)
{
    uint32_t tag = (uint32_t)(hash >> 32);
    for (uint64_t i = hash & ix->mask;; i = (i + 1) & ix->mask) {
        const index_slot *s = &ix->table[i];
        if (s->id == BLOCK_NONE) return;
        if (s->tag == tag) {
            const block *b = index_get(ix, s->id);
            __builtin_prefetch(b);
            __builtin_prefetch(&b->g2_state); /* the next line when b straddles two */
            return;
        }
    }
}

static inline void index_prefetch_slot(const block_index *ix, uint64_t hash)
{
    __builtin_prefetch(&ix->table[hash & ix->mask]);
}

/* Makes room for n more records so that index_insert cannot fail. */
int index_reserve(block_index *ix, size_t n);

/* Inserts a new zeroed record for the key (not present). Needs a prior
 * index_reserve; fails only if the long key copy cannot be allocated. */
block_id index_insert(block_index *ix, const uint8_t *key, size_t len, uint64_t hash);

void index_remove(block_index *ix, block_id id);

/* Bytes of index and record memory, for the metadata benchmark. */
size_t index_memory_bytes(const block_index *ix);

#endif
