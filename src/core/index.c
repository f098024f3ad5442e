#include "core/index.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvcr/error.h"
#include "util/bigmem.h"

#define CHUNK_RECORDS (1u << INDEX_CHUNK_SHIFT)
#define INITIAL_TABLE 1024u

uint64_t index_hash(const uint8_t *key, size_t len)
{
    return XXH3_64bits(key, len);
}

int index_init(block_index *ix)
{
    memset(ix, 0, sizeof *ix);
    ix->table = kvcr_big_alloc(INITIAL_TABLE * sizeof *ix->table);
    if (ix->table == NULL) return KVCR_ENOMEM;
    for (uint32_t i = 0; i < INITIAL_TABLE; i++) ix->table[i].id = BLOCK_NONE;
    ix->mask = INITIAL_TABLE - 1;
    return 0;
}

void index_destroy(block_index *ix)
{
    for (uint32_t c = 0; c < ix->n_chunks; c++) {
        block *chunk = ix->chunks[c];
        uint32_t used = ix->next_unused - c * CHUNK_RECORDS;
        if (used > CHUNK_RECORDS) used = CHUNK_RECORDS;
        for (uint32_t i = 0; i < used; i++) {
            if (chunk[i].key_len > KEY_INLINE) free(chunk[i].key.heap);
            if (chunk[i].n_slots > 1) free(chunk[i].sl.many);
        }
        kvcr_big_free(chunk, CHUNK_RECORDS * sizeof(block));
    }
    free(ix->chunks);
    kvcr_big_free(ix->table, (ix->mask + 1) * sizeof *ix->table);
    free(ix->free_ids);
    memset(ix, 0, sizeof *ix);
}

static bool key_equal(const block *b, const uint8_t *key, size_t len)
{
    return b->key_len == len && memcmp(block_key(b), key, len) == 0;
}

block_id index_find(const block_index *ix, const uint8_t *key, size_t len, uint64_t hash)
{
    uint32_t tag = (uint32_t)(hash >> 32);
    for (uint64_t i = hash & ix->mask;; i = (i + 1) & ix->mask) {
        const index_slot *s = &ix->table[i];
        if (s->id == BLOCK_NONE) return BLOCK_NONE;
        if (s->tag == tag) {
            if (key_equal(index_get(ix, s->id), key, len)) return s->id;
        }
    }
}

static uint64_t block_hash(const block *b)
{
    return index_hash(block_key(b), b->key_len);
}

static void table_place(index_slot *table, uint64_t mask, uint32_t id, uint64_t hash)
{
    uint64_t i = hash & mask;
    while (table[i].id != BLOCK_NONE) i = (i + 1) & mask;
    table[i].id = id;
    table[i].tag = (uint32_t)(hash >> 32);
}

/* Grows the table so that `want` entries stay under a 3/4 load. */
static int table_grow(block_index *ix, uint64_t want)
{
    uint64_t size = ix->mask + 1;
    if (want * 4 <= size * 3) return 0;
    while (want * 4 > size * 3) size *= 2;
    index_slot *t = kvcr_big_alloc(size * sizeof *t);
    if (t == NULL) return KVCR_ENOMEM;
    for (uint64_t i = 0; i < size; i++) t[i].id = BLOCK_NONE;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        uint32_t id = ix->table[i].id;
        if (id != BLOCK_NONE) table_place(t, size - 1, id, block_hash(index_get(ix, id)));
    }
    kvcr_big_free(ix->table, (ix->mask + 1) * sizeof *ix->table);
    ix->table = t;
    ix->mask = size - 1;
    return 0;
}

int index_reserve(block_index *ix, size_t n)
{
    if (ix->count + n >= BLOCK_NONE) return KVCR_ENOMEM;
    if (table_grow(ix, ix->count + n) != 0) return KVCR_ENOMEM;
    /* Records: reuse freed ids first, then fresh ones from new chunks. */
    uint64_t fresh = n > ix->n_free ? n - ix->n_free : 0;
    uint64_t need = (uint64_t)ix->next_unused + fresh;
    uint32_t chunks = (uint32_t)((need + CHUNK_RECORDS - 1) / CHUNK_RECORDS);
    if (chunks > ix->n_chunks) {
        block **c = realloc(ix->chunks, chunks * sizeof *c);
        if (c == NULL) return KVCR_ENOMEM;
        ix->chunks = c;
        while (ix->n_chunks < chunks) {
            c[ix->n_chunks] = kvcr_big_alloc(CHUNK_RECORDS * sizeof(block));
            if (c[ix->n_chunks] == NULL) return KVCR_ENOMEM;
            ix->n_chunks++;
        }
    }
    return 0;
}

block_id index_insert(block_index *ix, const uint8_t *key, size_t len, uint64_t hash)
{
    uint8_t *heap_key = NULL;
    if (len > KEY_INLINE) {
        heap_key = malloc(len);
        if (heap_key == NULL) return BLOCK_NONE;
        memcpy(heap_key, key, len);
    }
    block_id id = ix->n_free > 0 ? ix->free_ids[--ix->n_free] : ix->next_unused++;
    block *b = index_get(ix, id);
    memset(b, 0, sizeof *b);
    b->key_len = (uint16_t)len;
    b->q_prev = b->q_next = BLOCK_NONE;
    if (heap_key != NULL)
        b->key.heap = heap_key;
    else
        memcpy(b->key.inl, key, len);
    table_place(ix->table, ix->mask, id, hash);
    ix->count++;
    return id;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void table_delete_at(block_index *ix, uint64_t hole)
{
    for (uint64_t i = (hole + 1) & ix->mask;; i = (i + 1) & ix->mask) {
        index_slot *s = &ix->table[i];
        if (s->id == BLOCK_NONE) break;
        uint64_t home = block_hash(index_get(ix, s->id)) & ix->mask;
        /* Move s into the hole unless its home lies cyclically in (hole, i]. */
        bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (!stays) {
            ix->table[hole] = *s;
            hole = i;
        }
    }
    ix->table[hole].id = BLOCK_NONE;
}

void index_remove(block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    for (uint64_t i = block_hash(b) & ix->mask;; i = (i + 1) & ix->mask) {
        if (ix->table[i].id == id) {
            table_delete_at(ix, i);
            break;
        }
    }
    if (b->key_len > KEY_INLINE) free(b->key.heap);
    if (b->n_slots > 1) free(b->sl.many);
    memset(b, 0, sizeof *b);
    ix->count--;
    if (ix->n_free == ix->cap_free) {
        uint32_t cap = ix->cap_free ? ix->cap_free * 2 : 1024;
        uint32_t *f = realloc(ix->free_ids, cap * sizeof *f);
        if (f == NULL) return; /* the id is simply never reused */
        ix->free_ids = f;
        ix->cap_free = cap;
    }
    ix->free_ids[ix->n_free++] = id;
}

size_t index_memory_bytes(const block_index *ix)
{
    size_t bytes = (ix->mask + 1) * sizeof(index_slot);
    bytes += (size_t)ix->n_chunks * CHUNK_RECORDS * sizeof(block);
    bytes += ix->cap_free * sizeof(uint32_t);
    return bytes;
}
