/* The public API: argument guards, locking, lifetime, query, poll, stats.
 * The operations themselves live in ops.c, residencies in residency.c. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "api/abi.h"
#include "api/boot.h"
#include "api/config.h"
#include "api/events.h"
#include "core/gauges.h"
#include "core/instance.h"
#include "core/lower.h"
#include "core/ops.h"
#include "core/recovery.h"
#include "core/residency.h"
#include "kvcr/testing.h"
#include "client/client.h"
#include "client/journal.h"
#include "tiers/g3.h"
#include "net/ucx.h"
#include "tiers/remote.h"
#include "util/api.h"
#include "util/clock.h"

KVCR_API unsigned kvcr_version(void)
{
    return KVCR_VERSION_HEX;
}

KVCR_API const char *kvcr_version_string(void)
{
    return KVCR_VERSION_STRING;
}

static int guard(const kvcr_t *kv, const char *fn)
{
    if (kv == NULL) return kvcr_fail(KVCR_EINVAL, "%s: instance must not be NULL", fn);
    if (instance_held_here(kv))
        return kvcr_fail(KVCR_EBUSY, "%s called from inside a KVCR policy hook", fn);
    return 0;
}

#define GUARD(kv)                               \
    do {                                        \
        int guard_rc_ = guard((kv), __func__); \
        if (guard_rc_ != 0) return guard_rc_;   \
    } while (0)

/* ---- lifetime ----------------------------------------------------------- */

static void release_parts(kvcr_t *kv)
{
    lower_destroy(kv);
    api_events_destroy(kv);
    res_destroy(kv);
    hint_table_destroy(&kv->hints);
    ops_discard_done(kv);
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) dram_pool_destroy(&kv->pools[p]);
    index_destroy(&kv->index);
    evq_destroy(&kv->evq);
    telemetry_free(kv->telemetry);
    if (kv->event_fd >= 0) close(kv->event_fd);
    if (kv->control_listener >= 0) close(kv->control_listener);
    pthread_mutex_destroy(&kv->lock);
    conf_destroy(&kv->conf);
    free(kv);
}

static int init_pools(kvcr_t *kv, const kvcr_config *cfg)
{
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) {
        const kvcr_dram_pool *mem = dram_pool_for(cfg, cfg->pool_layouts[p].name);
        void *base = mem ? mem->addr : NULL;
        size_t size = mem ? mem->size : 0;
        if (dram_pool_init(&kv->pools[p], cfg->pool_layouts[p].name,
                           cfg->pool_layouts[p].block_size, base, size,
                           kv->conf.watermark_percent) != 0)
            return KVCR_ENOMEM;
    }
    return 0;
}

static void log_start(const kvcr_t *kv)
{
    uint64_t slots = 0;
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) slots += kv->pools[p].n_slots;
    kvcr_log(&kv->log, KVCR_LOG_INFO,
             "started: %u pool(s), %llu KVCR DRAM slot(s), %zu framework region(s), %u copy "
             "thread(s), policy '%s', telemetry %s",
             kv->conf.n_pools, (unsigned long long)slots, kv->conf.n_regions,
             kv->conf.copy_threads, kv->conf.policy->name ? kv->conf.policy->name : "custom",
             kv->conf.enable_telemetry ? "on" : "off");
}

/* Adds a started tier to the instance's read order (core/lower.h); one
 * the table refuses is destroyed, as nothing else would free it. */
static int add_tier(kvcr_t *kv, const tier_ops *ops, tier *t)
{
    int rc = lower_add(kv, ops, t);
    if (rc != 0) ops->destroy(t);
    return rc;
}

/* ---- guard mode: the journal the instance publishes to ------------------- */

/* Locked (the recovery sink runs under the instance lock, as key_hash
 * may): a PUT carries the block's router hash, its tenant and its router
 * metadata (block_meta_hook; metadata longer than JOURNAL_META_MAX stays
 * in memory only, counted by the hook), so that the Guard can announce the
 * block to routers while it serves it and a claimant takes all of it back. */
static int journal_sink(void *ud, bool put, const uint8_t *key, size_t key_len, uint32_t pool,
                        uint64_t slot, const char *tenant)
{
    kvcr_t *kv = ud;
    jrec r = {put ? JREC_PUT : JREC_REMOVE, key, key_len, pool, slot, false, 0};
    uint8_t meta[JOURNAL_META_MAX];
    if (put && kv->conf.cb.key_hash) {
        kvcr_key k = {key, key_len};
        r.has_hash = kv->conf.cb.key_hash(kv->conf.cb.ud, &k, &r.router_hash) == 0;
    }
    if (put && tenant) {
        r.tenant = (const uint8_t *)tenant;
        r.tenant_len = strlen(tenant);
    }
    if (put && kv->meta_hook.get) {
        size_t n = kv->meta_hook.get(kv->meta_hook.ud, key, key_len, meta, sizeof meta);
        r.meta = meta;
        r.meta_len = n <= sizeof meta ? n : 0;
    }
    return journal_publish(kv->journal, &r);
}

/* The publisher's thread: the group's KV-event stream goes on from here
 * whoever publishes for it next. The journal's mapping outlives the
 * publisher (kvcr_close stops it before the group is given back). */
static void journal_kv_seq_sink(void *ud, uint64_t next_seq)
{
    journal_set_kv_seq(((journal *)ud)->base, next_seq);
}

_Static_assert(KVCR_INC_LEN == JOURNAL_INC_LEN, "one incarnation size");
_Static_assert(KVCR_RETIRED_MAX == JOURNAL_RETIRED_MAX, "one retired list size");

/* Takes what boot gives before any thread runs: the journal (the
 * instance's incarnation is written into its header), the retired
 * incarnations, and the recovered blocks. */
static void take_boot(kvcr_t *kv, const kvcr_boot *boot)
{
    if (boot->journal) {
        /* Before the control channel opens: a peer can only learn an
         * incarnation the service will find when this process is gone. */
        journal_set_owner(boot->journal, kv->incarnation);
        kv->journal = boot->journal;
        recovery_set_sink(kv, &(recovery_sink){journal_sink, kv});
    }
    size_t n = boot->n_retired < KVCR_RETIRED_MAX ? boot->n_retired : KVCR_RETIRED_MAX;
    if (n > 0) memcpy(kv->retired, boot->retired, n * KVCR_INC_LEN);
    kv->n_retired = n;
    recovery_install(kv, boot->blocks, boot->n_blocks);
}

void kvcr__incarnation(const kvcr_t *kv, uint8_t out[KVCR_INC_LEN])
{
    memcpy(out, kv->incarnation, KVCR_INC_LEN);
}

/* kvcr__create's work; the peer tier takes *ucx when it starts on it. */
static int create(const kvcr_config *user, const kvcr_boot *boot, ucx_ctx **ucx, kvcr_t **out)
{
    int listener = boot ? boot->control_listener : -1;
    if (out == NULL) {
        if (listener >= 0) close(listener);
        return kvcr_fail(KVCR_EINVAL, "kvcr_create: out must not be NULL");
    }
    *out = NULL;
    kvcr_config full; /* the caller's config in this header's layout (api/abi.h) */
    int rc = kvcr__config_import(user, &full);
    if (rc != 0) {
        if (listener >= 0) close(listener);
        return rc;
    }
    const kvcr_config *cfg = &full;
    kvcr_t *kv = calloc(1, sizeof *kv);
    if (kv == NULL) {
        if (listener >= 0) close(listener);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    kv->control_listener = listener; /* released with the instance from here on */
    rc = conf_build(cfg, &kv->conf);
    if (rc != 0) {
        if (listener >= 0) close(listener);
        free(kv);
        return rc;
    }
    kv->event_fd = -1;
    pthread_mutex_init(&kv->lock, NULL);
    instance_logger_init(kv);
    evq_init(&kv->evq);
    tenants_init(kv);
    kv->next_op = kvcr_now_ns(); /* a handle from before a restart never matches */
    kv->next_release = 1;
    if (index_init(&kv->index) != 0 || init_pools(kv, cfg) != 0 ||
        (kv->conf.enable_telemetry && (kv->telemetry = telemetry_new()) == NULL)) {
        release_parts(kv);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    kv->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (kv->event_fd < 0) {
        release_parts(kv);
        return kvcr_fail(KVCR_ESYS, "eventfd failed: %m");
    }
    /* Before anything can queue inventory (the G3 scan, recovered blocks). */
    kv->inventory_on = kv->conf.cb.inventory != NULL;
    api_events_stream stream = {0};
    if (boot) stream = (api_events_stream){boot->kv_first_seq, boot->kv_numbered,
                                           boot->kv_numbered_ud};
    if ((rc = api_events_start(kv, &stream)) != 0) {
        release_parts(kv);
        return rc; /* the publisher named the endpoint */
    }
    if (kv->conf.g3.n_paths > 0) {
        if ((rc = g3_start(kv, &kv->g3)) != 0 ||
            (rc = add_tier(kv, &g3_tier_ops, g3_tier_of(kv->g3))) != 0) {
            kv->g3 = NULL;
            release_parts(kv);
            return rc; /* g3_start or lower_add named the cause */
        }
    }
    if (getrandom(kv->incarnation, sizeof kv->incarnation, 0) != (ssize_t)sizeof kv->incarnation) {
        release_parts(kv);
        return kvcr_fail(KVCR_ESYS, "getrandom failed: %m");
    }
    if (boot) take_boot(kv, boot); /* after the G3 scan, which may know some of the keys */
    rc = copy_engine_start(&kv->copier, kv->conf.copy_threads, kv->event_fd);
    if (rc != 0) {
        release_parts(kv);
        return kvcr_fail(rc, "cannot start the copy threads");
    }
    if (kv->conf.remote.enabled) {
        rc = remote_start(kv, kv->control_listener, ucx, &kv->remote);
        kv->control_listener = -1; /* consumed, either way */
        if (rc == 0 && (rc = add_tier(kv, &remote_tier_ops, remote_tier(kv->remote))) != 0)
            kv->remote = NULL;
        if (rc != 0) {
            copy_engine_stop(&kv->copier);
            copy_engine_destroy(&kv->copier);
            release_parts(kv);
            return rc; /* remote_start or lower_add named the cause */
        }
    }
    kv->hold = boot ? boot->hold : NULL;
    log_start(kv);
    *out = kv;
    return 0;
}

int kvcr__create(const kvcr_config *user, const kvcr_boot *boot, kvcr_t **out)
{
    ucx_ctx *ucx = boot ? boot->ucx : NULL;
    int rc = create(user, boot, &ucx, out);
    ucx_ctx_destroy(ucx); /* not taken: no peer tier, or a failure before it started */
    return rc;
}

int kvcr__ucx_ahead(const kvcr_logger *log, ucx_ctx **out)
{
    if (log == NULL || out == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr__ucx_ahead: log and out must not be NULL");
    return ucx_ctx_create(log, out);
}

void kvcr__ucx_ahead_free(ucx_ctx *c)
{
    ucx_ctx_destroy(c);
}

/* Everything kvcr_create would check, before the service is asked: the
 * pools the service will provide stand in as addresses near the top of the
 * address space (validated, never touched), one block each, so the
 * tenants' DRAM quotas are left out here: their sum is checked against the
 * granted pools' slots once the claim is granted (create_claimed). */
static int precheck_claimed(const kvcr_config *cfg)
{
    int rc = svc_check_guard(cfg);
    if (rc != 0) return rc;
    if (cfg->remote.enabled && cfg->remote.curve.secret_key != NULL)
        return kvcr_fail(KVCR_ENOTSUP, "remote curve with guard mode is not built: the Guard "
                                       "would serve this endpoint without the engine's keys");
    kvcr_dram_pool pools[KVCR_MAX_POOLS];
    uintptr_t at = UINTPTR_MAX / 2;
    for (size_t i = 0; i < cfg->n_pool_layouts; i++) {
        size_t bs = cfg->pool_layouts[i].block_size ? cfg->pool_layouts[i].block_size : 1;
        pools[i] = (kvcr_dram_pool){cfg->pool_layouts[i].name, (void *)at, bs};
        at += (bs + 4095) / 4096 * 4096;
    }
    kvcr_config c = *cfg;
    c.guard = (kvcr_guard_options){0};
    c.local_dram = pools;
    c.n_local_dram = cfg->n_pool_layouts;
    if (c.local_dram_backend == NULL) c.local_dram_backend = "UCX";
    kvcr_tenant tenants[KVCR_MAX_TENANTS];
    if (cfg->tenants != NULL && cfg->n_tenants <= KVCR_MAX_TENANTS) {
        memcpy(tenants, cfg->tenants, cfg->n_tenants * sizeof *tenants);
        for (size_t i = 0; i < cfg->n_tenants; i++) tenants[i].dram_slots = 0;
        c.tenants = tenants;
    }
    kvcr_conf conf;
    rc = conf_build(&c, &conf);
    if (rc == 0) conf_destroy(&conf);
    return rc;
}

/* Guard mode: the pools come from a claim on the KVCR service; a failed
 * start gives the group straight back. The pools' slot counts are known
 * only now: kvcr__create checks the tenants' DRAM quotas against them. */
static int create_claimed(const kvcr_config *cfg, kvcr_t **out)
{
    int rc = precheck_claimed(cfg);
    if (rc != 0) return rc;
    svc_hold *h;
    rc = svc_claim(cfg, &h);
    if (rc != 0) return rc;
    kvcr_config c = *cfg;
    c.guard = (kvcr_guard_options){0};
    c.local_dram = svc_hold_pools(h, &c.n_local_dram);
    if (c.local_dram_backend == NULL) c.local_dram_backend = "UCX";
    if (c.remote.enabled) c.remote.control_port = svc_hold_control_port(h);
    kvcr_boot boot = {.journal = svc_hold_journal(h), .hold = h, .role = "claimant"};
    boot.blocks = svc_hold_recovered(h, &boot.n_blocks);
    boot.retired = svc_hold_retired(h, &boot.n_retired);
    boot.control_listener = svc_hold_take_listener(h);
    boot.kv_first_seq = svc_hold_kv_seq(h); /* the stream the last publisher left */
    boot.kv_numbered = journal_kv_seq_sink;
    boot.kv_numbered_ud = boot.journal;
    rc = kvcr__create(&c, &boot, out);
    if (rc != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", kvcr_last_error());
        svc_release(h, false);
        return kvcr_fail(rc, "the KVCR service granted guard %u's pools, given back: %s",
                         cfg->guard.guard_index, why);
    }
    return 0;
}

KVCR_API int kvcr_create(const kvcr_config *user, kvcr_t **out)
{
    kvcr_config full; /* the caller's config in this header's layout (api/abi.h) */
    int rc = kvcr__config_import(user, &full);
    if (rc != 0) {
        if (out != NULL) *out = NULL;
        return rc;
    }
    const kvcr_config *cfg = &full;
    if (cfg->guard.service_socket_path != NULL) {
        if (out == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_create: out must not be NULL");
        *out = NULL;
        return create_claimed(cfg, out);
    }
    return kvcr__create(cfg, NULL, out);
}

KVCR_API int kvcr_close(kvcr_t *kv)
{
    GUARD(kv);
    /* Pin results the framework holds are taken while they still count. */
    instance_lock(kv);
    bool was_open = !kv->closed;
    instance_unlock(kv);
    if (was_open && kv->remote && kv->conf.cb.poll_pins) kv->conf.cb.poll_pins(kv->conf.cb.ud);
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return 0;
    }
    kv->closed = true;
    ops_cancel_all(kv);
    instance_unlock(kv);
    /* Running copies finish; the threads need no state lock to do so. Peer
     * transfers end (or are reported uncertain) before the progress thread
     * stops. */
    copy_engine_stop(&kv->copier);
    lower_stop(kv);
    instance_lock(kv);
    ops_progress(kv);
    if (kv->live_head != NULL)
        kvcr_log(&kv->log, KVCR_LOG_ERROR, "%llu operation(s) still pending after close",
                 (unsigned long long)kv->n_live);
    ops_discard_done(kv);
    lower_close(kv);
    pending_event *events = kv->events_head;
    kv->events_head = kv->events_tail = NULL;
    instance_unlock(kv);
    lower_run_callbacks(kv); /* resilience events and pin releases first */
    instance_lock(kv);
    recovery_set_sink(kv, NULL); /* nothing is published once the group is given back */
    svc_hold *hold = kv->hold;
    kv->hold = NULL;
    instance_unlock(kv);
    api_events_stop(kv); /* before the group is given back */
    if (hold) svc_release(hold, true); /* nothing touches the pool any more */
    while (events != NULL) { /* nobody polls any more: inventory is not reported at close */
        pending_event *next = events->next;
        free(events);
        events = next;
    }
    kvcr_log(&kv->log, KVCR_LOG_INFO, "closed");
    return 0;
}

KVCR_API void kvcr_free(kvcr_t *kv)
{
    if (kv == NULL || instance_held_here(kv)) return;
    kvcr_close(kv);
    copy_engine_destroy(&kv->copier);
    if (kv->conf.policy->destroy) kv->conf.policy->destroy(kv->conf.policy_ud);
    release_parts(kv);
}

KVCR_API int kvcr_fd(const kvcr_t *kv)
{
    if (kv == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_fd: instance must not be NULL");
    return kv->event_fd;
}

KVCR_API const char *kvcr_pool_name(const kvcr_t *kv, uint32_t pool)
{
    if (kv == NULL || pool >= kv->conf.n_pools) return NULL;
    return kv->pools[pool].name;
}

/* ---- query -------------------------------------------------------------- */

static kvcr_query_result query_one(kvcr_t *kv, const kvcr_key *k, uint64_t hash,
                                   lower_reads *lr)
{
    block_id id = index_find(&kv->index, k->data, k->len, hash);
    if (id != BLOCK_NONE) {
        uint8_t state = index_get(&kv->index, id)->g2_state;
        if (state == G2_READY) return (kvcr_query_result){KVCR_QUERY_HIT, KVCR_TIER_LOCAL_G2};
        if (state == G2_FILLING)
            return (kvcr_query_result){KVCR_QUERY_FETCHING, KVCR_TIER_LOCAL_G2};
    }
    int t = lower_reads_holder(kv, lr, id, k->data, (uint32_t)k->len);
    if (t >= 0) return (kvcr_query_result){KVCR_QUERY_FETCHABLE, kv->tiers[t].ops->id};
    /* Evicted from KVCR DRAM while its spill is still being written: not
     * readable yet, but soon. A MISS here made engines recompute blocks
     * KVCR was about to hold (FETCHING makes them ask again). */
    if (id != BLOCK_NONE && kv->spill_tier != NULL) {
        uint8_t lower = index_get(&kv->index, id)->lower.state;
        if (lower != 0 && !(lower & LOWER_READY))
            return (kvcr_query_result){KVCR_QUERY_FETCHING, kv->spill_tier->ops->id};
    }
    return (kvcr_query_result){KVCR_QUERY_MISS, KVCR_TIER_NONE};
}

#define QUERY_CHUNK 32

KVCR_API int kvcr_query(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
                        kvcr_query_result *out)
{
    GUARD(kv);
    if (n > 0 && (keys == NULL || out == NULL))
        return kvcr_fail(KVCR_EINVAL, "kvcr_query: keys and out must not be NULL");
    for (size_t i = 0; i < n; i++)
        if (!ops_valid_key(&keys[i]))
            return kvcr_fail(KVCR_EINVAL, "key %zu must have 1 to %d bytes and non-NULL data", i,
                             KVCR_KEY_MAX);
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ECLOSED, "the instance is closed");
    }
    /* Three passes over a chunk — table slots, then records, then the
     * lookups — so the cache misses of its keys overlap. */
    lower_reads lr;
    lower_reads_begin(kv, &lr, request_id, 0, false, 0, 0);
    uint64_t hash[QUERY_CHUNK];
    for (size_t base = 0; base < n; base += QUERY_CHUNK) {
        size_t m = n - base < QUERY_CHUNK ? n - base : QUERY_CHUNK;
        for (size_t i = 0; i < m; i++) {
            hash[i] = index_hash(keys[base + i].data, keys[base + i].len);
            index_prefetch_slot(&kv->index, hash[i]);
        }
        for (size_t i = 0; i < m; i++) index_prefetch_record(&kv->index, hash[i]);
        for (size_t i = 0; i < m; i++) out[base + i] = query_one(kv, &keys[base + i], hash[i], &lr);
    }
    lower_reads_end(kv, &lr);
    instance_unlock(kv);
    return 0;
}

/* ---- operations --------------------------------------------------------- */

KVCR_API int kvcr_deposit(kvcr_t *kv, const kvcr_block *blocks, size_t n, unsigned flags,
                          kvcr_op_handle *op)
{
    GUARD(kv);
    return ops_deposit(kv, blocks, n, flags, NULL, 0, op);
}

/* One block's router metadata within its bounds. */
static int check_router_block(const kvcr_router_block *rb, size_t i)
{
    if (rb->token_ids != NULL &&
        (rb->block_size_tokens == 0 || rb->block_size_tokens > KVCR_ROUTER_MAX_TOKENS))
        return kvcr_fail(KVCR_EINVAL, "router block %zu: token_ids need block_size_tokens "
                         "between 1 and %d", i, KVCR_ROUTER_MAX_TOKENS);
    if (rb->block_size_tokens > KVCR_ROUTER_MAX_TOKENS)
        return kvcr_fail(KVCR_EINVAL, "router block %zu: block_size_tokens must be at most %d",
                         i, KVCR_ROUTER_MAX_TOKENS);
    if (rb->lora_name != NULL && strlen(rb->lora_name) >= KVCR_KV_EVENTS_MAX_NAME)
        return kvcr_fail(KVCR_EINVAL, "router block %zu: lora_name must be shorter than %d "
                         "bytes", i, KVCR_KV_EVENTS_MAX_NAME);
    if (rb->n_extra_keys > KVCR_ROUTER_MAX_EXTRA || (rb->n_extra_keys > 0 && !rb->extra_keys))
        return kvcr_fail(KVCR_EINVAL, "router block %zu: extra_keys must hold n_extra_keys "
                         "(at most %d) strings", i, KVCR_ROUTER_MAX_EXTRA);
    for (uint32_t j = 0; j < rb->n_extra_keys; j++)
        if (rb->extra_keys[j] == NULL || strlen(rb->extra_keys[j]) >= KVCR_KV_EVENTS_MAX_NAME)
            return kvcr_fail(KVCR_EINVAL, "router block %zu: extra key %u must be a string "
                             "shorter than %d bytes", i, j, KVCR_KV_EVENTS_MAX_NAME);
    return 0;
}

KVCR_API int kvcr_deposit_ex(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                             const kvcr_deposit_options *opts, kvcr_op_handle *op)
{
    GUARD(kv);
    if (opts == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_deposit_ex: opts must not be NULL");
    if (opts->version < 1 || opts->version > KVCR_DEPOSIT_OPTIONS_VERSION)
        return kvcr_fail(KVCR_EINVAL, "kvcr_deposit_options has version %u; libkvcr %s reads "
                         "version 1 to %d (set .version = KVCR_DEPOSIT_OPTIONS_VERSION)",
                         opts->version, KVCR_VERSION_STRING, KVCR_DEPOSIT_OPTIONS_VERSION);
    const kvcr_router_block *rb = opts->router;
    const char *const *extra = opts->version >= 2 ? opts->router_extra : NULL;
    if (extra != NULL && rb == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr_deposit_ex: router_extra needs router");
    for (size_t i = 0; rb != NULL && i < n; i++) {
        int rc = check_router_block(&rb[i], i);
        uint8_t *packed = NULL; /* checked here, so that a refusal does not need events on */
        size_t len;
        if (rc == 0) rc = api_events_extra(&rb[i], extra ? extra[i] : NULL, i, &packed, &len);
        free(packed);
        if (rc != 0) return rc;
    }
    if (n > 0 && blocks == NULL)
        return ops_deposit(kv, blocks, n, opts->flags, opts->hints, opts->hints_len, op);
    /* Kept before the deposit starts: its commit may be polled at once. */
    int rc = api_events_remember(kv, blocks, n, rb, extra);
    if (rc != 0) return rc;
    rc = ops_deposit(kv, blocks, n, opts->flags, opts->hints, opts->hints_len, op);
    if (rc != 0) api_events_forget(kv, blocks, n, rb);
    return rc;
}

KVCR_API int kvcr_deliver(kvcr_t *kv, const kvcr_block *blocks, size_t n, const char *request_id,
                          kvcr_op_handle *op)
{
    GUARD(kv);
    return ops_deliver(kv, blocks, n, request_id, op);
}

KVCR_API int kvcr_fetch(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
                        const char *const *expected_layout, size_t layout_len,
                        kvcr_op_handle *op)
{
    GUARD(kv);
    return ops_fetch(kv, keys, n, request_id, expected_layout, layout_len, NULL, 0, 0, op);
}

KVCR_API int kvcr_fetch_ex(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
                           const char *const *expected_layout, size_t layout_len,
                           const kvcr_fetch_options *opts, kvcr_op_handle *op)
{
    GUARD(kv);
    if (opts != NULL && (opts->version < 1 || opts->version > KVCR_FETCH_OPTIONS_VERSION))
        return kvcr_fail(KVCR_EINVAL, "kvcr_fetch_options has version %u; libkvcr %s reads "
                         "version 1 to %d (set .version = KVCR_FETCH_OPTIONS_VERSION)",
                         opts->version, KVCR_VERSION_STRING, KVCR_FETCH_OPTIONS_VERSION);
    return ops_fetch(kv, keys, n, request_id, expected_layout, layout_len,
                     opts ? opts->hints : NULL, opts ? opts->hints_len : 0,
                     opts && opts->version >= 2 ? opts->flags : 0, op);
}

KVCR_API int kvcr_release(kvcr_t *kv, const kvcr_release_handle *handles, size_t n,
                          bool *released)
{
    GUARD(kv);
    return ops_release(kv, handles, n, released);
}

KVCR_API int kvcr_abort(kvcr_t *kv, kvcr_op_handle op, const kvcr_key *keys, size_t n,
                        size_t *n_aborted)
{
    GUARD(kv);
    return ops_abort(kv, op, keys, n, n_aborted);
}

/* ---- hints -------------------------------------------------------------- */

KVCR_API int kvcr_submit_hint(kvcr_t *kv, const char *request_id, const char *json, size_t len)
{
    GUARD(kv);
    if (json == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_submit_hint: json must not be NULL");
    const kvcr_limits *lim = &kv->conf.limits;
    if (len > lim->max_hint_bytes) { /* refused before the text is read at all */
        instance_lock(kv);
        if (kv->telemetry) telemetry_refusal(kv->telemetry, "hint_bytes");
        instance_unlock(kv);
        return kvcr_fail(KVCR_ELIMIT, "kvcr_submit_hint: the hint has %zu bytes, over "
                         "limits.max_hint_bytes (%u)", len, lim->max_hint_bytes);
    }
    hint h;
    int rc = hint_parse(json, len, &kv->log, &h); /* no lock: parsing touches no state */
    if (rc != 0) {
        hint_clear(&h);
        return rc;
    }
    instance_lock(kv);
    rc = kv->closed ? kvcr_fail(KVCR_ECLOSED, "the instance is closed") : 0;
    /* A kept request may always be replaced; a new one needs room. */
    if (rc == 0 && request_id != NULL && kv->hints.count >= lim->max_hinted_requests &&
        hint_table_find(&kv->hints, request_id) == NULL) {
        if (kv->telemetry) telemetry_refusal(kv->telemetry, "hinted_requests");
        rc = kvcr_fail(KVCR_ELIMIT, "kvcr_submit_hint: limits.max_hinted_requests (%u) "
                       "requests are kept; discard finished ones (kvcr_discard_hint)",
                       lim->max_hinted_requests);
    }
    if (rc == 0 && kv->remote) /* CURVE: a source we may talk to; eager metadata, if on */
        if ((rc = remote_check_source(kv->remote, h.source)) == 0)
            remote_hint_source(kv->remote, h.source);
    if (rc == 0 && request_id != NULL)
        rc = hint_table_submit(&kv->hints, request_id, &h, kvcr_now_ns());
    instance_unlock(kv);
    hint_clear(&h);
    return rc;
}

KVCR_API int kvcr_discard_hint(kvcr_t *kv, const char *request_id)
{
    GUARD(kv);
    if (request_id == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_discard_hint: request_id must not be NULL");
    instance_lock(kv);
    int rc = kv->closed ? kvcr_fail(KVCR_ECLOSED, "the instance is closed") : 0;
    if (rc == 0) hint_table_discard(&kv->hints, request_id);
    instance_unlock(kv);
    return rc;
}

KVCR_API int kvcr_align_sequence(kvcr_t *kv, const kvcr_key *keys, size_t n,
                                 bool use_current_time)
{
    GUARD(kv);
    if (n > 0 && keys == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr_align_sequence: keys must not be NULL");
    if (n > UINT32_MAX)
        return kvcr_fail(KVCR_EINVAL, "kvcr_align_sequence: at most %u keys", UINT32_MAX);
    for (size_t i = 0; i < n; i++)
        if (!ops_valid_key(&keys[i]))
            return kvcr_fail(KVCR_EINVAL, "key %zu must have 1 to %d bytes and non-NULL data", i,
                             KVCR_KEY_MAX);
    block_id *ids = malloc((n ? n : 1) * sizeof *ids);
    if (ids == NULL) return kvcr_fail(KVCR_ENOMEM, "kvcr_align_sequence: out of memory");
    instance_lock(kv);
    int rc = kv->closed ? kvcr_fail(KVCR_ECLOSED, "the instance is closed") : 0;
    uint32_t held = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        block_id id = index_find(&kv->index, keys[i].data, keys[i].len,
                                 index_hash(keys[i].data, keys[i].len));
        if (id != BLOCK_NONE && index_get(&kv->index, id)->g2_state == G2_READY) ids[held++] = id;
    }
    if (rc == 0) res_align(kv, ids, held, use_current_time);
    instance_unlock(kv);
    free(ids);
    return rc;
}

/* ---- the peer tier ------------------------------------------------------- */

KVCR_API int kvcr_pin_complete(kvcr_t *kv, uint64_t req, uint64_t pin, const kvcr_block *blocks,
                               size_t n)
{
    GUARD(kv);
    if (n > 0 && blocks == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr_pin_complete: blocks must not be NULL");
    if (kv->remote == NULL)
        return kvcr_fail(KVCR_ENOENT, "no pin request %llu: the remote tier is off",
                         (unsigned long long)req);
    return remote_pin_complete(kv->remote, req, pin, blocks, n);
}

KVCR_API const char *kvcr_control_endpoint(const kvcr_t *kv)
{
    return kv && kv->remote ? remote_endpoint(kv->remote) : NULL;
}

/* ---- poll --------------------------------------------------------------- */

static void deliver_notices(kvcr_t *kv, pending_event *events, const kvcr_capacity_need *needs,
                            uint32_t n_needs)
{
    while (events != NULL) {
        pending_event *next = events->next;
        api_events_feed(kv, &events->ev);
        int rc = kv->conf.cb.inventory ? kv->conf.cb.inventory(kv->conf.cb.ud, &events->ev) : 0;
        if (rc != 0)
            kvcr_log(&kv->log, KVCR_LOG_WARN,
                     "inventory sink failed (rc=%d); the event for %zu key(s) is lost", rc,
                     events->ev.n_keys);
        free(events);
        events = next;
    }
    if (n_needs > 0) {
        int rc = kv->conf.cb.capacity_needed(kv->conf.cb.ud, needs, n_needs);
        if (rc != 0)
            kvcr_log(&kv->log, KVCR_LOG_WARN, "capacity_needed callback failed (rc=%d)", rc);
    }
}

KVCR_API int kvcr_poll(kvcr_t *kv, kvcr_op_result **results, size_t *n)
{
    GUARD(kv);
    if (results == NULL || n == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr_poll: results and n must not be NULL");
    *results = NULL;
    *n = 0;
    if (kv->remote && kv->conf.cb.poll_pins) kv->conf.cb.poll_pins(kv->conf.cb.ud);
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ECLOSED, "the instance is closed");
    }
    /* Drain the fd before the completion list: a copy finishing in between
     * then leaves the fd readable again. */
    uint64_t ticks;
    ssize_t got = read(kv->event_fd, &ticks, sizeof ticks);
    (void)got;
    ops_progress(kv);
    int rc = ops_take_results(kv, results, n);
    pending_event *events = kv->events_head;
    kv->events_head = kv->events_tail = NULL;
    kvcr_capacity_need needs[KVCR_MAX_POOLS];
    uint32_t n_needs = kv->n_pressure;
    memcpy(needs, kv->pressure, n_needs * sizeof *needs);
    kv->n_pressure = 0;
    instance_unlock(kv);
    lower_run_callbacks(kv);
    deliver_notices(kv, events, needs, n_needs);
    return rc;
}

KVCR_API void kvcr_results_free(kvcr_op_result *results)
{
    free(results);
}

/* ---- stats -------------------------------------------------------------- */

static void pool_gauges(gauge_sink *s, const char *prefix, const dram_pool *pools, uint32_t n)
{
    double total = 0, free_ = 0, evict = 0, total_b = 0, free_b = 0, evict_b = 0;
    for (uint32_t p = 0; p < n; p++) {
        double bs = (double)pools[p].block_size;
        total += pools[p].n_slots;
        free_ += pools[p].n_free;
        evict += (double)pools[p].evictable;
        total_b += pools[p].n_slots * bs;
        free_b += pools[p].n_free * bs;
        evict_b += (double)pools[p].evictable * bs;
    }
    gauge_sink_add(s, prefix, "total_slots", total);
    gauge_sink_add(s, prefix, "free_slots", free_);
    gauge_sink_add(s, prefix, "allocated_slots", total - free_);
    gauge_sink_add(s, prefix, "evictable_slots", evict);
    gauge_sink_add(s, prefix, "total_bytes", total_b);
    gauge_sink_add(s, prefix, "free_bytes", free_b);
    gauge_sink_add(s, prefix, "allocated_bytes", total_b - free_b);
    gauge_sink_add(s, prefix, "evictable_bytes", evict_b);
}

/* Locked: the core's gauges, then each lower tier's, then the pools'. */
static void instance_gauges(kvcr_t *kv, gauge_sink *s)
{
    gauge_sink_add(s, "", "block_records", (double)kv->index.count);
    gauge_sink_add(s, "", "in_flight_ops", (double)kv->n_live);
    gauge_sink_add(s, "", "completed", (double)kv->n_done);
    gauge_sink_add(s, "", "hinted_requests", (double)kv->hints.count);
    api_events_gauges(kv, s);
    lower_gauges(kv, s);
    if (!kv->conf.has_local_dram) return;
    pool_gauges(s, "local_g2_", kv->pools, kv->conf.n_pools);
    tenants_gauges(kv, s);
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) {
        char prefix[KVCR_NAME_MAX + 32];
        const char *name = kv->pools[p].name[0] ? kv->pools[p].name : "default";
        snprintf(prefix, sizeof prefix, "local_g2_pool_%s_", name);
        pool_gauges(s, prefix, &kv->pools[p], 1);
    }
}

KVCR_API int kvcr_stats_take(kvcr_t *kv, kvcr_stats **out)
{
    GUARD(kv);
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_stats_take: out must not be NULL");
    *out = NULL;
    if (kv->telemetry == NULL) return 0;
    gauge_sink s;
    gauge_sink_init(&s);
    instance_lock(kv);
    int rc = kv->closed ? kvcr_fail(KVCR_ECLOSED, "the instance is closed") : 0;
    if (rc == 0) instance_gauges(kv, &s);
    if (rc == 0 && s.oom) rc = kvcr_fail(KVCR_ENOMEM, "out of memory taking stats");
    if (rc == 0) {
        rc = telemetry_take(kv->telemetry, s.g, s.n, out);
        if (rc != 0) kvcr_fail(rc, "out of memory taking stats");
    }
    instance_unlock(kv);
    gauge_sink_free(&s);
    return rc;
}

/* ---- test hooks (include/kvcr/testing.h) -------------------------------- */

void kvcr__test_copy_gate(kvcr_t *kv, int gate)
{
    copy_set_gate(&kv->copier, gate);
}

void kvcr__test_fail_copies(kvcr_t *kv, uint32_t n)
{
    copy_fail_next(&kv->copier, n);
}

uint32_t kvcr__test_running_copies(kvcr_t *kv)
{
    pthread_mutex_lock(&kv->copier.lock);
    uint32_t n = kv->copier.running;
    pthread_mutex_unlock(&kv->copier.lock);
    return n;
}

int kvcr__test_hint(kvcr_t *kv, const char *request_id, const char **source, size_t *n_hashes,
                    const uint64_t **hashes, bool *failed)
{
    instance_lock(kv);
    const hint_state *st = hint_table_find(&kv->hints, request_id);
    if (st != NULL) {
        *source = st->hint.source;
        *n_hashes = st->hint.n_hashes;
        *hashes = st->hint.hashes;
        *failed = st->failed;
    }
    instance_unlock(kv);
    return st != NULL;
}

uint64_t kvcr__test_dropped_messages(kvcr_t *kv)
{
    instance_lock(kv);
    uint64_t n = kv->remote ? remote_dropped_messages(kv->remote) : 0;
    instance_unlock(kv);
    return n;
}

size_t kvcr__test_metadata_bytes(kvcr_t *kv, uint64_t *records)
{
    instance_lock(kv);
    size_t bytes = index_memory_bytes(&kv->index) + kv->evq.heap_cap * sizeof(uint32_t) +
                   (kv->claims.mask + 1) * (sizeof(uint64_t) + sizeof(block_id));
    for (uint32_t t = 1; t <= kv->conf.n_tenants; t++) /* the tenants' evictable heaps */
        bytes += kv->tenants[t].evq.heap_cap * sizeof(uint32_t);
    *records = kv->index.count;
    instance_unlock(kv);
    return bytes;
}

void kvcr__test_g3_fail_next(kvcr_t *kv, unsigned n, int err)
{
    if (kv->g3) g3_test_fail_next(kv->g3, n, err);
}

void kvcr__test_g3_hold(kvcr_t *kv, bool hold)
{
    if (kv->g3) g3_test_hold(kv->g3, hold);
}
