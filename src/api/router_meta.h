/* What routers need to know of a block besides its router hash
 * (kvcr_router_block), kept by router hash for the KV events while a
 * residency of the block lives.
 *
 * An entry is pending from its deposit until the block is announced
 * stored; then it lives while the block is resident in KVCR DRAM or G3
 * (a bit per medium). When its last residency goes it turns pending
 * again rather than going at once: a spill to G3 announces the block's
 * removal from KVCR DRAM before its G3 write completes, and the G3
 * store must still find the metadata. Pending entries (a dropped or
 * failed deposit, a block gone for good) are bounded: past max_pending
 * the oldest is forgotten (counted). One allocation per entry: its
 * tokens and strings follow it.
 *
 * Threads: none of its own; the caller serialises (api/events.c's lock). */
#ifndef KVCR_API_ROUTER_META_H
#define KVCR_API_ROUTER_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

#define RMETA_DRAM 0x1u
#define RMETA_G3 0x2u

typedef struct rmeta {
    struct rmeta *next;              /* the bucket's chain */
    struct rmeta *p_prev, *p_next;   /* the pending list, oldest first */
    uint64_t hash;
    unsigned media;                  /* RMETA_* where the block is resident */
    bool pending;
    bool has_parent;
    uint64_t parent;
    uint32_t block_size, n_tokens;
    const char *lora_name;           /* NULL: none */
    /* The block's extra keys as vLLM packs them: one msgpack array of
     * str, int and arrays of them (net/kvev.h kvev_check_extra), extra_len
     * bytes; NULL: none. */
    const uint8_t *extra;
    uint32_t extra_len;
    uint32_t tokens[];
} rmeta;

typedef struct rmeta_map {
    rmeta **buckets;
    size_t n_buckets, count;
    rmeta *p_head, *p_tail;
    size_t n_pending, max_pending;
    uint64_t forgotten;              /* pending entries pushed out */
} rmeta_map;

void rmeta_init(rmeta_map *m, size_t max_pending);
void rmeta_destroy(rmeta_map *m);

/* Keeps rb for the block of router hash `hash`, pending, its extra keys
 * being the packed extra_len bytes of extra (kvev_extra_*; NULL: none;
 * rb's own extra_keys are not read); a resident block's entry is kept as
 * it is (its metadata cannot have changed). 0, or -1 out of memory. */
int rmeta_put(rmeta_map *m, uint64_t hash, const kvcr_router_block *rb, const uint8_t *extra,
              size_t extra_len);

/* A pending entry whose deposit was refused goes again. */
void rmeta_unput(rmeta_map *m, uint64_t hash);

const rmeta *rmeta_get(const rmeta_map *m, uint64_t hash);

/* The stored form of an entry (what the G3 record and the recovery
 * journal keep, opaque to them; little-endian):
 *   u8 format (1), u8 flags (RMETA_F_*; other bits zero), u32 block size,
 *   [u64 parent: RMETA_F_PARENT], [block size x u32 tokens: RMETA_F_TOKENS],
 *   [u8 length, LoRA name: RMETA_F_LORA], then the extra keys:
 *   with RMETA_F_PACKED a u16 length and that many bytes of msgpack (one
 *   array, as kvev_check_extra reads it); without it (what builds before
 *   extra keys took integers and lists wrote; still read) a u8 count and
 *   each key as u8 length and bytes, a list of strings.
 * Strings hold no NUL byte; nothing follows the last field. An entry
 * without extra keys is written in the older form (count 0), so that it
 * reads the same in both.
 * rmeta_encode returns the bytes e takes (written only when they fit in
 * cap). */
#define RMETA_FORMAT 1
#define RMETA_F_PARENT 0x1u
#define RMETA_F_TOKENS 0x2u
#define RMETA_F_LORA 0x4u
#define RMETA_F_PACKED 0x8u
size_t rmeta_encode(const rmeta *e, uint8_t *buf, size_t cap);

/* The entry of router hash `hash` that the stored bytes describe (one
 * allocation, free() it; not in any map), or NULL when they do not decode
 * exactly (strict: any deviation from the format above) or out of memory
 * (*damaged tells which). */
rmeta *rmeta_decode(uint64_t hash, const uint8_t *b, size_t len, bool *damaged);

/* Stored bytes found again with a block resident in medium: its entry,
 * resident (not pending). 0; 1 when the bytes do not decode (nothing
 * kept); -1 out of memory. An entry already there is kept. */
int rmeta_found(rmeta_map *m, uint64_t hash, const uint8_t *b, size_t len, unsigned medium);

/* The block became resident in / left a medium (RMETA_*). */
void rmeta_stored(rmeta_map *m, uint64_t hash, unsigned medium);
void rmeta_removed(rmeta_map *m, uint64_t hash, unsigned medium);

#endif
