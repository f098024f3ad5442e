#include "harness.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct stashed {
    kvcr_op_handle op;
    size_t n;
    kvcr_entry_status *st;
    kvcr_reason *why;
    kvcr_release_handle *rh;
} stashed;

static int on_inventory(void *ud, const kvcr_inventory_event *ev)
{
    rig *r = ud;
    pthread_mutex_lock(&r->cb_lock);
    r->inventory_calls++;
    if (ev->removed)
        r->inventory_removed += (int)ev->n_keys;
    else
        r->inventory_added += (int)ev->n_keys;
    size_t used = strlen(r->inventory_log);
    used += (size_t)snprintf(r->inventory_log + used, sizeof r->inventory_log - used, "%s%s:",
                             used ? " " : "", ev->removed ? "-" : "+");
    for (size_t i = 0; i < ev->n_keys && used < sizeof r->inventory_log; i++)
        used += (size_t)snprintf(r->inventory_log + used, sizeof r->inventory_log - used,
                                 "%s%.*s", i ? "," : "", (int)ev->keys[i].len,
                                 (const char *)ev->keys[i].data);
    pthread_mutex_unlock(&r->cb_lock);
    if (r->on_event) r->on_event(r, ev);
    return r->fail_callbacks ? -1 : 0;
}

static int on_capacity(void *ud, const kvcr_capacity_need *needs, size_t n)
{
    rig *r = ud;
    pthread_mutex_lock(&r->cb_lock);
    r->capacity_calls++;
    r->capacity_slots = n ? needs[0].slots : 0;
    pthread_mutex_unlock(&r->cb_lock);
    return r->fail_callbacks ? -1 : 0;
}

static void record_log(void *ud, kvcr_log_level level, const char *msg)
{
    rig *r = ud;
    if (level == KVCR_LOG_ERROR) fprintf(stderr, "kvcr error: %s\n", msg);
    if (level <= KVCR_LOG_WARN) {
        pthread_mutex_lock(&r->cb_lock);
        r->warnings++;
        snprintf(r->last_warning, sizeof r->last_warning, "%s", msg);
        pthread_mutex_unlock(&r->cb_lock);
    }
}

void rig_init(rig *r, size_t block_size, size_t fw_count, size_t slots)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->cb_lock, NULL);
    pthread_mutex_init(&r->stash_lock, NULL);
    r->block_size = block_size;
    r->fw_count = fw_count;
    r->slots = slots;
    r->fw = aligned_alloc(64, block_size * fw_count);
    r->dram = aligned_alloc(64, block_size * slots);
    assert_non_null(r->fw);
    assert_non_null(r->dram);
    memset(r->fw, 0, block_size * fw_count);
    memset(r->dram, 0xEE, block_size * slots);
    kvcr_config_init(&r->cfg);
    r->layout = (kvcr_pool_layout){"", block_size};
    r->pool = (kvcr_dram_pool){"", r->dram, block_size * slots};
    r->region = (kvcr_region){.addr = r->fw, .element_size = block_size, .count = fw_count,
                              .label = ""};
    r->cfg.agent_name = "test";
    r->cfg.pool_layouts = &r->layout;
    r->cfg.n_pool_layouts = 1;
    r->cfg.local_dram = &r->pool;
    r->cfg.n_local_dram = 1;
    r->cfg.framework_regions = &r->region;
    r->cfg.n_framework_regions = 1;
    r->cfg.callbacks = (kvcr_callbacks){r, on_inventory, on_capacity, record_log};
}

void rig_start(rig *r)
{
    int rc = kvcr_create(&r->cfg, &r->kv);
    if (rc != 0) fprintf(stderr, "kvcr_create: %s\n", kvcr_last_error());
    assert_int_equal(rc, 0);
}

void rig_stop(rig *r)
{
    if (r->kv) assert_int_equal(kvcr_close(r->kv), 0);
    kvcr_free(r->kv);
    r->kv = NULL;
    for (size_t i = 0; i < r->n_stash; i++) {
        free(r->stash[i].st);
        free(r->stash[i].why);
        free(r->stash[i].rh);
    }
    free(r->stash);
    pthread_mutex_destroy(&r->cb_lock);
    pthread_mutex_destroy(&r->stash_lock);
    free(r->fw);
    free(r->dram);
}

void fill_pattern(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

void rig_pattern(rig *r, size_t i, uint32_t seed)
{
    fill_pattern(r->fw + i * r->block_size, r->block_size, seed);
}

bool rig_has_pattern(const rig *r, const uint8_t *p, uint32_t seed)
{
    uint8_t *want = malloc(r->block_size);
    fill_pattern(want, r->block_size, seed);
    bool same = memcmp(want, p, r->block_size) == 0;
    free(want);
    return same;
}

kvcr_key key_of(const char *s)
{
    return (kvcr_key){(const uint8_t *)s, strlen(s)};
}

static kvcr_op_handle submit(rig *r, bool deliver, const char *const *keys, const size_t *fw_idx,
                             size_t n, unsigned flags)
{
    kvcr_block *b = calloc(n ? n : 1, sizeof *b);
    kvcr_mem_ref *refs = calloc(n ? n : 1, sizeof *refs);
    for (size_t i = 0; i < n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, "", fw_idx[i]};
        b[i] = (kvcr_block){key_of(keys[i]), &refs[i], 1};
    }
    kvcr_op_handle op = 0;
    int rc = deliver ? kvcr_deliver(r->kv, b, n, NULL, &op) : kvcr_deposit(r->kv, b, n, flags, &op);
    if (rc != 0) fprintf(stderr, "submit: %s\n", kvcr_last_error());
    assert_int_equal(rc, 0);
    free(b);
    free(refs);
    return op;
}

kvcr_op_handle rig_deposit(rig *r, const char *const *keys, const size_t *fw_idx, size_t n,
                           unsigned flags)
{
    return submit(r, false, keys, fw_idx, n, flags);
}

kvcr_op_handle rig_deliver(rig *r, const char *const *keys, const size_t *fw_idx, size_t n)
{
    return submit(r, true, keys, fw_idx, n, 0);
}

uint64_t rig_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void stash(rig *r, const kvcr_op_result *res)
{
    r->stash = realloc(r->stash, (r->n_stash + 1) * sizeof *r->stash);
    stashed *s = &r->stash[r->n_stash++];
    s->op = res->op;
    s->n = res->n_entries;
    s->st = calloc(s->n + 1, sizeof *s->st);
    s->why = calloc(s->n + 1, sizeof *s->why);
    s->rh = calloc(s->n + 1, sizeof *s->rh);
    for (size_t j = 0; j < s->n; j++) {
        s->st[j] = res->entries[j].status;
        s->why[j] = res->entries[j].reason;
        s->rh[j] = res->entries[j].release_handle;
    }
}

static bool unstash(rig *r, kvcr_op_handle op, kvcr_entry_status *st, kvcr_reason *why,
                    kvcr_release_handle *rh, size_t *n)
{
    for (size_t i = 0; i < r->n_stash; i++) {
        stashed *s = &r->stash[i];
        if (s->op != op) continue;
        for (size_t j = 0; j < s->n; j++) {
            if (st) st[j] = s->st[j];
            if (why) why[j] = s->why[j];
            if (rh) rh[j] = s->rh[j];
        }
        *n = s->n;
        free(s->st);
        free(s->why);
        free(s->rh);
        r->stash[i] = r->stash[--r->n_stash];
        return true;
    }
    return false;
}

size_t rig_wait(rig *r, kvcr_op_handle op, kvcr_entry_status *st, kvcr_reason *why,
                kvcr_release_handle *rh)
{
    uint64_t until = rig_now_ms() + 10000;
    size_t m;
    while (rig_now_ms() < until) {
        kvcr_op_result *res;
        size_t n;
        assert_int_equal(kvcr_poll(r->kv, &res, &n), 0);
        pthread_mutex_lock(&r->stash_lock);
        for (size_t i = 0; i < n; i++) stash(r, &res[i]);
        bool found = unstash(r, op, st, why, rh, &m);
        pthread_mutex_unlock(&r->stash_lock);
        kvcr_results_free(res);
        if (found) return m;
        rig_await(r, 2); /* 2 ms: how late an expired deadline may be seen */
    }
    fail_msg("operation %llu did not complete within 10 s", (unsigned long long)op);
    return 0;
}

bool rig_await(rig *r, int max_ms)
{
    struct pollfd p = {kvcr_fd(r->kv), POLLIN, 0};
    int n;
    while ((n = poll(&p, 1, max_ms)) < 0 && errno == EINTR) {
    }
    return n == 1 && (p.revents & POLLIN);
}

void rig_pump(rig *r)
{
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r->kv, &res, &n), 0);
    kvcr_results_free(res);
}

void rig_wait_all_failed(rig *r, kvcr_op_handle op, size_t n, kvcr_reason why)
{
    kvcr_entry_status *st = calloc(n, sizeof *st);
    kvcr_reason *reasons = calloc(n, sizeof *reasons);
    assert_true(st != NULL && reasons != NULL);
    assert_int_equal(rig_wait(r, op, st, reasons, NULL), n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_FAILED);
        assert_int_equal(reasons[i], why);
    }
    free(st);
    free(reasons);
}

kvcr_op_result *rig_poll_results(rig *r, size_t *n)
{
    uint64_t until = rig_now_ms() + 10000;
    kvcr_op_result *res = NULL;
    *n = 0;
    while (rig_now_ms() < until) {
        assert_int_equal(kvcr_poll(r->kv, &res, n), 0);
        if (*n > 0) return res;
        kvcr_results_free(res);
        rig_await(r, 2);
    }
    fail_msg("no operation completed within 10 s");
    return NULL;
}

double rig_stat(rig *r, const char *gauge, const char *counter_scope)
{
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &s), 0);
    assert_non_null(s);
    double v = -1;
    for (size_t i = 0; gauge && i < s->n_gauges; i++)
        if (strcmp(s->gauges[i].resource, gauge) == 0) v = s->gauges[i].value;
    for (size_t i = 0; counter_scope && i < s->n_counters; i++)
        if (strcmp(s->counters[i].operation, counter_scope) == 0 &&
            strstr(s->counters[i].name, "bytes") != NULL)
            v = s->counters[i].value;
    kvcr_stats_free(s);
    return v;
}

void rig_g3_settle(rig *r)
{
    for (uint64_t until = rig_now_ms() + 5000; rig_now_ms() < until;) {
        rig_pump(r);
        if (rig_stat(r, "g3_pending_stores", NULL) == 0) return;
        rig_await(r, 1); /* a store landing wakes it */
    }
    fail_msg("G3 stores did not land within 5 s");
}

kvcr_query_status rig_query(rig *r, const char *key)
{
    kvcr_key k = key_of(key);
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r->kv, &k, 1, NULL, &q), 0);
    return q.status;
}

kvcr_entry_status rig_deposit1(rig *r, const char *key, size_t idx, unsigned flags,
                               kvcr_reason *why, kvcr_release_handle *rh)
{
    const char *k[] = {key};
    size_t s[] = {idx};
    kvcr_entry_status st;
    rig_wait(r, rig_deposit(r, k, s, 1, flags), &st, why, rh);
    return st;
}
