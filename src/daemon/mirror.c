#include "daemon/mirror.h"

#include <stdlib.h>
#include <string.h>

#include "util/bytes.h"
#include "util/log.h"

#define MIRROR_HASHED 0x1u /* block.flags in the mirror: seq holds the router hash */

int mirror_init(mirror *m, uint32_t n_pools, const uint64_t *slots)
{
    memset(m, 0, sizeof *m);
    m->n_pools = n_pools;
    memcpy(m->slots, slots, n_pools * sizeof *slots);
    return index_init(&m->ix) == 0 ? 0 : kvcr_fail(KVCR_ENOMEM, "out of memory");
}

static void free_extra(mirror *m)
{
    for (size_t i = 0; i < m->extra_cap; i++) free(m->extra[i]);
    free(m->extra);
    m->extra = NULL;
    m->extra_cap = 0;
}

void mirror_destroy(mirror *m)
{
    free_extra(m);
    index_destroy(&m->ix);
}

void mirror_clear(mirror *m)
{
    free_extra(m);
    index_destroy(&m->ix);
    if (index_init(&m->ix) != 0) memset(&m->ix, 0, sizeof m->ix);
}

/* Block id's tenant and metadata become r's (none: NULL). 0 or -1 out of
 * memory (the old ones are gone either way). */
static int set_extra(mirror *m, block_id id, const jrec *r)
{
    if (id < m->extra_cap) {
        free(m->extra[id]);
        m->extra[id] = NULL;
    }
    if (r == NULL || r->tenant_len + r->meta_len == 0) return 0;
    if (id >= m->extra_cap) {
        size_t cap = m->extra_cap ? m->extra_cap : 1024;
        while (cap <= id) cap *= 2;
        uint8_t **v = realloc(m->extra, cap * sizeof *v);
        if (v == NULL) return -1;
        memset(v + m->extra_cap, 0, (cap - m->extra_cap) * sizeof *v);
        m->extra = v;
        m->extra_cap = cap;
    }
    uint8_t *x = malloc(3 + r->tenant_len + r->meta_len);
    if (x == NULL) return -1;
    x[0] = (uint8_t)r->tenant_len;
    put16(x + 1, (uint16_t)r->meta_len);
    if (r->tenant_len) memcpy(x + 3, r->tenant, r->tenant_len);
    if (r->meta_len) memcpy(x + 3 + r->tenant_len, r->meta, r->meta_len);
    m->extra[id] = x;
    return 0;
}

/* Block id's tenant and metadata into b (none: NULL, 0). */
static void extra_into(const mirror *m, block_id id, recovered_block *b)
{
    const uint8_t *x = id < m->extra_cap ? m->extra[id] : NULL;
    b->tenant_len = x ? x[0] : 0;
    b->meta_len = x ? get16(x + 1) : 0;
    b->tenant = b->tenant_len ? x + 3 : NULL;
    b->meta = b->meta_len ? x + 3 + b->tenant_len : NULL;
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
        if (id != BLOCK_NONE) {
            set_extra(m, id, NULL);
            index_remove(&m->ix, id);
        }
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
    return set_extra(m, id, r) == 0 ? 0 : kvcr_fail(KVCR_ENOMEM, "out of memory");
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
        list[k] = (recovered_block){block_key(b), b->key_len, b->sl.one.pool, b->sl.one.slot};
        extra_into(m, id, &list[k++]);
    }
    *out = list;
    *n = k;
    return 0;
}
