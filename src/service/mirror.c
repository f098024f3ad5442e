#include "service/mirror.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#define MIRROR_HASHED 0x1u /* block.flags in the mirror: seq holds the router hash */

int mirror_init(mirror *m, uint32_t n_pools, const uint64_t *slots)
{
    memset(m, 0, sizeof *m);
    m->n_pools = n_pools;
    memcpy(m->slots, slots, n_pools * sizeof *slots);
    return index_init(&m->ix) == 0 ? 0 : kvcr_fail(KVCR_ENOMEM, "out of memory");
}

void mirror_destroy(mirror *m)
{
    index_destroy(&m->ix);
}

void mirror_clear(mirror *m)
{
    index_destroy(&m->ix);
    if (index_init(&m->ix) != 0) memset(&m->ix, 0, sizeof m->ix);
}

uint64_t mirror_count(const mirror *m)
{
    return m->ix.count;
}

int mirror_apply(mirror *m, const jrec *r)
{
    uint64_t hash = index_hash(r->key, r->key_len);
    block_id id = index_find(&m->ix, r->key, r->key_len, hash);
    if (r->type == JREC_REMOVE) {
        if (id != BLOCK_NONE) index_remove(&m->ix, id);
        return 0;
    }
    if (r->pool >= m->n_pools || r->slot >= m->slots[r->pool])
        return kvcr_fail(KVCR_EPROTO, "recovery journal: slot %llu of pool %u is outside the group",
                         (unsigned long long)r->slot, r->pool);
    if (id == BLOCK_NONE) {
        if (index_reserve(&m->ix, 1) != 0) return kvcr_fail(KVCR_ENOMEM, "out of memory");
        id = index_insert(&m->ix, r->key, r->key_len, hash);
        if (id == BLOCK_NONE) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    block *b = index_get(&m->ix, id);
    b->n_slots = 1;
    b->sl.one.pool = (uint8_t)r->pool;
    b->sl.one.slot = (uint32_t)r->slot;
    b->flags = r->has_hash ? MIRROR_HASHED : 0;
    b->seq = r->has_hash ? r->router_hash : 0;
    return 0;
}

bool mirror_router_hash(const mirror *m, const uint8_t *key, size_t key_len, uint64_t *hash)
{
    block_id id = index_find(&m->ix, key, key_len, index_hash(key, key_len));
    if (id == BLOCK_NONE) return false;
    const block *b = index_get(&m->ix, id);
    if (!(b->flags & MIRROR_HASHED)) return false;
    *hash = b->seq;
    return true;
}

int mirror_collect(const mirror *m, recovered_block **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (m->ix.count == 0) return 0;
    recovered_block *list = malloc(m->ix.count * sizeof *list);
    if (list == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    size_t k = 0;
    for (uint64_t i = 0; i <= m->ix.mask && k < m->ix.count; i++) {
        block_id id = m->ix.table[i].id;
        if (id == BLOCK_NONE) continue;
        const block *b = index_get(&m->ix, id);
        list[k++] = (recovered_block){block_key(b), b->key_len, b->sl.one.pool, b->sl.one.slot};
    }
    *out = list;
    *n = k;
    return 0;
}
