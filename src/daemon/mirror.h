/* The Guard's picture of a pool group: key -> (pool, slot), router hash,
 * tenant and router metadata (when the owner's frames carried them) of
 * every block the current (or last) owner committed, built by applying the recovery
 * journal's frames in order. A PUT replaces the key's place wholesale, a
 * REMOVE deletes it. Frames are checked against the group's geometry: a
 * slot outside its pool means the journal lies, and the whole mirror is
 * dropped (mirror_apply fails) rather than trusted in part. */
#ifndef KVCR_SERVICE_MIRROR_H
#define KVCR_SERVICE_MIRROR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/index.h"
#include "api/boot.h"
#include "client/journal.h"

typedef struct mirror {
    block_index ix;     /* records use key, sl.one.pool and sl.one.slot only, and
                         * seq for the router hash when flags has MIRROR_HASHED */
    uint32_t n_pools;
    uint64_t slots[KVCR_MAX_POOLS]; /* per pool */
    /* By block id: a PUT's tenant and metadata (u8 tenant length, u16
     * metadata length, the two), NULL when it carried neither. */
    uint8_t **extra;
    size_t extra_cap;
} mirror;

int mirror_init(mirror *m, uint32_t n_pools, const uint64_t *slots);
void mirror_destroy(mirror *m);
void mirror_clear(mirror *m);
uint64_t mirror_count(const mirror *m);

/* 0, or KVCR_EPROTO (a frame the geometry refutes), KVCR_ENOMEM. */
int mirror_apply(mirror *m, const jrec *r);

/* The router hash of key's block: false when the mirror has no such block
 * or its frame carried none. */
bool mirror_router_hash(const mirror *m, const uint8_t *key, size_t key_len, uint64_t *hash);

/* Every block, as a malloc'd array whose keys, tenants and metadata point
 * into the mirror (valid until it changes). */
int mirror_collect(const mirror *m, recovered_block **out, size_t *n);

#endif
