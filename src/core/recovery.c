#include "core/recovery.h"

#include <stdlib.h>
#include <string.h>

#include "core/instance.h"
#include "core/residency.h"

/* ---- publishing ------------------------------------------------------------ */

void recovery_set_sink(kvcr_t *kv, const recovery_sink *sink)
{
    kv->sink = sink ? *sink : (recovery_sink){0};
}

static void publish(kvcr_t *kv, bool put, const uint8_t *key, size_t key_len, uint32_t pool,
                    uint64_t slot, const char *tenant)
{
    if (kv->sink.publish == NULL) return;
    int rc = kv->sink.publish(kv->sink.ud, put, key, key_len, pool, slot, tenant);
    if (rc == 0 || rc == KVCR_EINVAL) return; /* EINVAL: a key the sink cannot carry */
    kvcr_log(&kv->log, KVCR_LOG_WARN,
             "recovery publication disabled after the journal refused a frame (%s): the cache "
             "keeps working, but the Guard will recover nothing if this process dies",
             kvcr_last_error());
    kv->sink = (recovery_sink){0};
}

/* ---- installing ----------------------------------------------------------- */

/* Why the list cannot be installed, or NULL. Marks every slot in used[]. */
static const char *check_blocks(const kvcr_t *kv, const recovered_block *blocks, size_t n,
                                uint64_t **used)
{
    for (size_t i = 0; i < n; i++) {
        const recovered_block *r = &blocks[i];
        if (r->key == NULL || r->key_len == 0 || r->key_len > KVCR_KEY_MAX) return "a bad key";
        if (r->pool >= kv->conf.n_pools || used[r->pool] == NULL) return "a pool out of range";
        const dram_pool *p = &kv->pools[r->pool];
        if (r->slot >= p->n_slots) return "a slot out of range";
        uint64_t *word = &used[r->pool][r->slot / 64], bit = 1ull << (r->slot % 64);
        if (*word & bit) return "a slot claimed twice";
        *word |= bit;
    }
    return NULL;
}

typedef struct keyed {
    uint64_t hash;
    const recovered_block *r;
} keyed;

static int by_hash(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    return (x->hash > y->hash) - (x->hash < y->hash);
}

static bool same_key(const recovered_block *a, const recovered_block *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/* Why the keys cannot be installed (one listed twice), or NULL. */
static const char *check_keys(const recovered_block *blocks, size_t n)
{
    keyed *k = malloc(n * sizeof *k);
    if (k == NULL) return "out of memory";
    for (size_t i = 0; i < n; i++) k[i] = (keyed){index_hash(blocks[i].key, blocks[i].key_len),
                                                  &blocks[i]};
    qsort(k, n, sizeof *k, by_hash);
    const char *why = NULL;
    for (size_t i = 1; i < n && why == NULL; i++)
        for (size_t j = i; j-- > 0 && k[j].hash == k[i].hash && why == NULL;)
            if (same_key(k[j].r, k[i].r)) why = "a key listed twice";
    free(k);
    return why;
}

/* The router forgot this engine's blocks when it died: they are announced
 * again (with the first poll), in batches as deposits are. */
static void announce(kvcr_t *kv, block_id *ids, size_t *n, bool flush)
{
    if (*n == 0 || (!flush && *n < 64)) return;
    res_queue_event(kv, KVCR_TIER_LOCAL_G2, false, ids, (uint32_t)*n);
    *n = 0;
}

static size_t install_all(kvcr_t *kv, const recovered_block *blocks, size_t n)
{
    size_t installed = 0, n_ids = 0;
    block_id ids[64];
    for (size_t i = 0; i < n; i++) {
        const recovered_block *r = &blocks[i];
        uint64_t hash = index_hash(r->key, r->key_len);
        block_id id = index_find(&kv->index, r->key, r->key_len, hash);
        if (id == BLOCK_NONE) {
            id = index_insert(&kv->index, r->key, r->key_len, hash);
            /* A new record holds nothing yet: it may take its tenant (one
             * the G3 scan found already keeps the tenant its slot counts). */
            index_get(&kv->index, id)->tenant =
                r->tenant_len ? tenants_find(kv, r->tenant, r->tenant_len) : 0;
        }
        if (res_adopt(kv, id, r->pool, (uint32_t)r->slot)) {
            if (r->meta_len && kv->meta_hook.found)
                kv->meta_hook.found(kv->meta_hook.ud, r->key, r->key_len, r->meta, r->meta_len,
                                    KVCR_TIER_LOCAL_G2);
            installed++;
            ids[n_ids++] = id;
            announce(kv, ids, &n_ids, false);
            continue;
        }
        /* The policy declined it: its slot goes back and the Guard hears so. */
        dram_pool_give(&kv->pools[r->pool], (uint32_t)r->slot);
        publish(kv, false, r->key, r->key_len, 0, 0, NULL);
        res_prune(kv, id);
    }
    announce(kv, ids, &n_ids, true);
    return installed;
}

size_t recovery_install(kvcr_t *kv, const recovered_block *blocks, size_t n)
{
    if (n == 0) return 0;
    uint64_t *used[KVCR_MAX_POOLS] = {0};
    const char *why = NULL;
    for (uint32_t p = 0; p < kv->conf.n_pools && why == NULL; p++)
        if (kv->pools[p].n_slots > 0 &&
            (used[p] = calloc((kv->pools[p].n_slots + 63) / 64, sizeof(uint64_t))) == NULL)
            why = "out of memory";
    if (why == NULL) why = check_blocks(kv, blocks, n, used);
    if (why == NULL) why = check_keys(blocks, n);
    if (why == NULL && index_reserve(&kv->index, n) != 0) why = "out of memory";
    size_t installed = 0;
    if (why == NULL) {
        for (uint32_t p = 0; p < kv->conf.n_pools; p++)
            if (used[p]) dram_pool_exclude(&kv->pools[p], used[p]);
        installed = install_all(kv, blocks, n);
    }
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) free(used[p]);
    if (why != NULL)
        kvcr_log(&kv->log, KVCR_LOG_ERROR,
                 "recovery refused: the %zu recovered block(s) include %s; starting cold", n,
                 why);
    else
        kvcr_log(&kv->log, KVCR_LOG_INFO, "recovered %zu block(s) into KVCR DRAM (%zu offered)",
                 installed, n);
    return installed;
}

void recovery_put(kvcr_t *kv, block_id id)
{
    const block *b = index_get(&kv->index, id);
    if (b->n_slots == 1)
        publish(kv, true, block_key(b), b->key_len, b->sl.one.pool, b->sl.one.slot,
                tenants_name(kv, b->tenant));
}

void recovery_remove(kvcr_t *kv, block_id id)
{
    const block *b = index_get(&kv->index, id);
    if (b->n_slots == 1) publish(kv, false, block_key(b), b->key_len, 0, 0, NULL);
}
