/* Every configuration rule refuses with its own message, before anything
 * starts, and the default configuration over valid memory is accepted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { BS = 4096 };

typedef struct setup {
    kvcr_config cfg;
    kvcr_pool_layout layouts[3];
    kvcr_dram_pool pools[3];
    kvcr_region regions[3];
    uint8_t *mem; /* 3 pools of 2 blocks, then 3 regions of 2 blocks */
} setup;

static uint8_t *pool_mem(setup *s, int i) { return s->mem + (size_t)i * 2 * BS; }
static uint8_t *region_mem(setup *s, int i) { return s->mem + (size_t)(6 + 2 * i) * BS; }

static void base(setup *s)
{
    memset(s, 0, sizeof *s);
    s->mem = aligned_alloc(4096, 12 * BS);
    kvcr_config_init(&s->cfg);
    s->layouts[0] = (kvcr_pool_layout){"", BS};
    s->pools[0] = (kvcr_dram_pool){"", pool_mem(s, 0), 2 * BS};
    s->regions[0] = (kvcr_region){.addr = region_mem(s, 0), .element_size = BS, .count = 2,
                                  .label = ""};
    s->cfg.agent_name = "cfg";
    s->cfg.pool_layouts = s->layouts;
    s->cfg.n_pool_layouts = 1;
    s->cfg.local_dram = s->pools;
    s->cfg.n_local_dram = 1;
    s->cfg.framework_regions = s->regions;
    s->cfg.n_framework_regions = 1;
}

/* Two named pools "k" and "v" with matching memory and regions. */
static void two_pools(setup *s)
{
    s->layouts[0] = (kvcr_pool_layout){"k", BS};
    s->layouts[1] = (kvcr_pool_layout){"v", BS};
    s->pools[0] = (kvcr_dram_pool){"k", pool_mem(s, 0), 2 * BS};
    s->pools[1] = (kvcr_dram_pool){"v", pool_mem(s, 1), 2 * BS};
    s->regions[0].label = "k";
    s->regions[1] = (kvcr_region){.addr = region_mem(s, 1), .element_size = BS, .count = 2,
                                  .label = "v"};
    s->cfg.n_pool_layouts = s->cfg.n_local_dram = s->cfg.n_framework_regions = 2;
}

static void no_agent(setup *s) { s->cfg.agent_name = ""; }
static void no_pools(setup *s) { s->cfg.n_pool_layouts = 0; }
static void null_pool_name(setup *s) { s->layouts[0].name = NULL; }
static void zero_block(setup *s) { s->layouts[0].block_size = 0; }
static void dup_pool_names(setup *s) { two_pools(s); s->layouts[1].name = "k"; }
static void empty_name_multi(setup *s) { two_pools(s); s->layouts[0].name = ""; }
static void zero_timeout(setup *s) { s->cfg.operation_timeout_ms = 0; }
static void short_abandon(setup *s) { s->cfg.abandon_timeout_ms = 1999; }
static void watermark_high(setup *s) { s->cfg.capacity_low_watermark_percent = 100.5; }
static void watermark_nan(setup *s) { s->cfg.capacity_low_watermark_percent = NAN; }
static void zero_copy_threads(setup *s) { s->cfg.copy_threads = 0; }
static void g3_policy(setup *s) { static kvcr_policy_ops p; p = *kvcr_policy_builtin("lru"); p.name = "G3LRUPolicy"; p.required_tiers = KVCR_TIER_BIT(KVCR_TIER_G3); s->cfg.policy = &p; }
static void hookless_policy(setup *s) { static kvcr_policy_ops p = {.version = KVCR_POLICY_VERSION, .name = "half"}; s->cfg.policy = &p; }
static void remote_bad_interval(setup *s) { s->cfg.remote.enabled = true; s->cfg.remote.metadata_retry_interval_ms = 0; }
static void remote_empty_backend(setup *s) { s->cfg.remote.enabled = true; s->cfg.remote.backend = ""; }
static void remote_other_backend(setup *s) { s->cfg.remote.enabled = true; s->cfg.remote.backend = "LIBFABRIC"; }
static void remote_bad_host(setup *s) { s->cfg.remote.enabled = true; s->cfg.remote.control_host = "tcp://x"; }
static void remote_bad_advertise(setup *s) { s->cfg.remote.enabled = true; s->cfg.remote.advertise_host = "a b"; }
static int pin_stub(void *ud, uint64_t req, const kvcr_key *k, size_t n) { (void)ud, (void)req, (void)k, (void)n; return 0; }
static void pins_half(setup *s) { s->cfg.callbacks.request_pin = pin_stub; }
static void dram_empty_backend(setup *s) { s->cfg.local_dram_backend = ""; }
static void dram_dup_names(setup *s) { two_pools(s); s->pools[1].name = "k"; }
static void dram_names_differ(setup *s) { s->pools[0].name = "other"; }
static void dram_null_addr(setup *s) { s->pools[0].addr = NULL; }
static void dram_zero_size(setup *s) { s->pools[0].size = 0; }
static void dram_overlap(setup *s) { two_pools(s); s->pools[1].addr = pool_mem(s, 0) + BS; }
static void dram_partial(setup *s) { s->pools[0].size = 2 * BS - 1; }
static void dram_count_mismatch(setup *s) { s->cfg.local_dram = NULL; }
static void region_null(setup *s) { s->regions[0].addr = NULL; }
static void region_zero_size(setup *s) { s->regions[0].element_size = 0; }
static void region_zero_count(setup *s) { s->regions[0].count = 0; }
static void region_small_stride(setup *s) { s->regions[0].stride = BS - 1; }
static void region_bad_type(setup *s) { s->regions[0].mem_type = (kvcr_mem_type)7; }
static void region_bad_device(setup *s) { s->regions[0].device_id = -1; }
static void region_unknown_label(setup *s) { s->regions[0].label = "nope"; }
static void region_vram(setup *s) { s->regions[0].mem_type = KVCR_MEM_VRAM; }
static void region_overlap(setup *s) { s->regions[1] = s->regions[0]; s->regions[1].addr = region_mem(s, 0) + BS; s->regions[1].label = "x"; s->layouts[1] = (kvcr_pool_layout){"x", BS}; s->layouts[0].name = "y"; s->pools[0].name = "y"; s->regions[0].label = "y"; s->cfg.n_pool_layouts = 2; s->cfg.local_dram = NULL; s->cfg.n_local_dram = 0; s->cfg.n_framework_regions = 2; }
static void region_on_pool(setup *s) { s->regions[0].addr = pool_mem(s, 0); }
static void region_dup_label(setup *s) { s->regions[1] = s->regions[0]; s->regions[1].addr = region_mem(s, 1); s->cfg.n_framework_regions = 2; }
static void no_dram_backend(setup *s) { s->cfg.local_dram = NULL; s->cfg.n_local_dram = 0; }
/* The G3 path rule (tiers/g3_store.h g3_paths_check), before any disk access. */
#define G3_MISSING "/nonexistent-kvcr-cfg"
static void g3_paths(setup *s, const char *a, const char *b) { static const char *p[2]; p[0] = a; p[1] = b; s->cfg.g3.paths = p; s->cfg.g3.n_paths = 2; s->cfg.g3.capacity_bytes_per_file = 2 * BS; }
static void g3_empty_path(setup *s) { g3_paths(s, "a", ""); }
static void g3_spelled_twice(setup *s) { g3_paths(s, G3_MISSING "/g3", G3_MISSING "/g3"); }
static void g3_dots(setup *s) { g3_paths(s, G3_MISSING "/sub/../g3", G3_MISSING "/./g3"); }
static void g3_relative(setup *s) { g3_paths(s, "g3.bin", "./x/../g3.bin"); }
static void g3_root_parent(setup *s) { g3_paths(s, "/../" "nonexistent-kvcr-cfg", G3_MISSING); }

typedef struct rule {
    const char *name;
    void (*apply)(setup *s);
    int rc;
    const char *message;
} rule;

static const rule rules[] = {
    {"agent", no_agent, KVCR_EINVAL, "agent_name must be a non-empty string shorter than 128 bytes"},
    {"no pools", no_pools, KVCR_EINVAL, "pool_layouts must contain at least one pool"},
    {"pool name", null_pool_name, KVCR_EINVAL, "pool_layouts pool name must be a string"},
    {"block size", zero_block, KVCR_EINVAL, "pool_layouts block size must be a positive integer"},
    {"unique", dup_pool_names, KVCR_EINVAL, "pool_layouts pool names must be unique"},
    {"empty name", empty_name_multi, KVCR_EINVAL, "pool_layouts cannot use an empty name with multiple pools"},
    {"timeout", zero_timeout, KVCR_EINVAL, "operation_timeout_ms must be positive"},
    {"abandon", short_abandon, KVCR_EINVAL, "abandon_timeout_ms must be at least twice operation_timeout_ms (1999 < 2 x 1000): set abandon_timeout_ms to 2000 or more"},
    {"watermark", watermark_high, KVCR_EINVAL, "capacity_low_watermark_percent must be between 0 and 100"},
    {"watermark nan", watermark_nan, KVCR_EINVAL, "capacity_low_watermark_percent must be between 0 and 100"},
    {"copy threads", zero_copy_threads, KVCR_EINVAL, "copy_threads must be between 1 and 64"},
    {"policy tiers", g3_policy, KVCR_EINVAL, "G3LRUPolicy requires configured G3"},
    {"policy hooks", hookless_policy, KVCR_EINVAL, "policy 'half' must provide decide_ingest, eviction_score and decide_eviction"},
    {"retry interval", remote_bad_interval, KVCR_EINVAL, "metadata_retry_interval_ms must be positive"},
    {"remote backend", remote_empty_backend, KVCR_EINVAL, "remote backend name must be non-empty"},
    {"remote backend kind", remote_other_backend, KVCR_ENOTSUP, "remote backend 'LIBFABRIC' is not supported (only \"UCX\")"},
    {"control host", remote_bad_host, KVCR_EINVAL, "remote control_host 'tcp://x' must be a host name or IPv4 address"},
    {"advertise host", remote_bad_advertise, KVCR_EINVAL, "remote advertise_host 'a b' must be a host name or IPv4 address"},
    {"dram backend", dram_empty_backend, KVCR_EINVAL, "local DRAM backend name must be non-empty"},
    {"dram unique", dram_dup_names, KVCR_EINVAL, "local DRAM pool names must be unique"},
    {"dram names", dram_names_differ, KVCR_EINVAL, "local DRAM pool names must exactly match pool_layouts"},
    {"dram addr", dram_null_addr, KVCR_EINVAL, "local DRAM address must be a positive integer"},
    {"dram size", dram_zero_size, KVCR_EINVAL, "local DRAM pool size must be a positive integer"},
    {"dram overlap", dram_overlap, KVCR_EINVAL, "local DRAM pool memory regions must not overlap"},
    {"dram blocks", dram_partial, KVCR_EINVAL, "local DRAM pool '' size must contain complete blocks"},
    {"dram count", dram_count_mismatch, KVCR_EINVAL, "local_dram and n_local_dram must be set together"},
    {"region addr", region_null, KVCR_EINVAL, "framework region address must be a positive integer"},
    {"region size", region_zero_size, KVCR_EINVAL, "framework region size must be a positive integer"},
    {"region count", region_zero_count, KVCR_EINVAL, "framework region count must be a positive integer"},
    {"region stride", region_small_stride, KVCR_EINVAL, "framework region stride must be 0 or at least its size"},
    {"region type", region_bad_type, KVCR_EINVAL, "framework region mem_type must be KVCR_MEM_DRAM or KVCR_MEM_VRAM (got 7)"},
    {"region device", region_bad_device, KVCR_EINVAL, "framework region device_id must be a non-negative int"},
    {"region label", region_unknown_label, KVCR_EINVAL, "framework region label 'nope' must name a configured pool"},
    {"region vram", region_vram, KVCR_ENOTSUP, "VRAM framework regions need a CUDA build of KVCR; this build copies host memory only"},
    {"region dup label", region_dup_label, KVCR_EINVAL, "framework region labels must be unique ('')"},
    {"region on pool", region_on_pool, KVCR_EINVAL, "framework region '' overlaps local DRAM pool ''"},
    {"pins half", pins_half, KVCR_EINVAL, "request_pin and release_pin must be given together"},
    {"no backend", no_dram_backend, KVCR_EINVAL, "at least one DRAM backend must be configured"},
    {"g3 empty path", g3_empty_path, KVCR_EINVAL, "G3 file path 1 must be a non-empty string"},
    {"g3 spelled twice", g3_spelled_twice, KVCR_EINVAL, "G3 file paths must be unique"},
    {"g3 dots", g3_dots, KVCR_EINVAL, "G3 file paths must not alias the same file"},
    {"g3 relative", g3_relative, KVCR_EINVAL, "G3 file paths must not alias the same file"},
    {"g3 root parent", g3_root_parent, KVCR_EINVAL, "G3 file paths must not alias the same file"},
};

static void test_each_rule_is_refused_with_its_message(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        setup s;
        base(&s);
        rules[i].apply(&s);
        kvcr_t *kv = (kvcr_t *)&s; /* must be reset to NULL on failure */
        int rc = kvcr_create(&s.cfg, &kv);
        if (rc != rules[i].rc || strcmp(kvcr_last_error(), rules[i].message) != 0)
            fail_msg("rule '%s': got %d '%s', want %d '%s'", rules[i].name, rc, kvcr_last_error(),
                     rules[i].rc, rules[i].message);
        assert_null(kv);
        free(s.mem);
    }
    assert_int_equal(access(G3_MISSING, F_OK), -1); /* the path rule created nothing */
}

static void test_overlapping_regions_message_names_both_spans(void **state)
{
    (void)state;
    setup s;
    base(&s);
    region_overlap(&s);
    kvcr_t *kv;
    assert_int_equal(kvcr_create(&s.cfg, &kv), KVCR_EINVAL);
    /* The refusal ranks 'no DRAM backend' after the region rules. */
    assert_non_null(strstr(kvcr_last_error(), "framework regions must not overlap: [0x"));
    assert_non_null(strstr(kvcr_last_error(), "(DRAM of device 0)"));
    free(s.mem);
}

static void test_exact_duplicate_regions_collapse_and_touching_ones_are_fine(void **state)
{
    (void)state;
    setup s;
    base(&s);
    s.regions[1] = s.regions[0];
    s.cfg.n_framework_regions = 2;
    kvcr_t *kv;
    assert_int_equal(kvcr_create(&s.cfg, &kv), 0);
    kvcr_free(kv);
    /* Same span on another device does not conflict; touching spans neither. */
    two_pools(&s);
    s.regions[1].addr = region_mem(&s, 0) + 2 * BS;
    assert_int_equal(kvcr_create(&s.cfg, &kv), 0);
    kvcr_free(kv);
    free(s.mem);
}

static void test_local_dram_pools_may_come_in_any_order(void **state)
{
    (void)state;
    setup s;
    base(&s);
    two_pools(&s);
    kvcr_dram_pool k = s.pools[0];
    s.pools[0] = s.pools[1];
    s.pools[1] = k;
    s.layouts[1].block_size = 2 * BS; /* "v": its 2-block memory holds 1 slot */
    s.regions[1].element_size = 2 * BS;
    s.regions[1].count = 1;
    rig r = {0};
    assert_int_equal(kvcr_create(&s.cfg, &r.kv), 0);
    /* Each pool got its own memory: "v" has one slot of 2 blocks' size. */
    kvcr_mem_ref refs[] = {{NULL, "k", 0}, {NULL, "v", 0}};
    kvcr_block b = {key_of("kv"), refs, 2};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(r.kv, &b, 1, 0, &op), 0);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    kvcr_key key = key_of("kv");
    const char *layout[] = {"k", "v"};
    kvcr_release_handle h;
    assert_int_equal(kvcr_fetch(r.kv, &key, 1, NULL, layout, 2, &op), 0);
    kvcr_op_result *res = NULL;
    size_t n = 0;
    for (int i = 0; i < 10000 && n == 0; i++) {
        assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
        if (n == 0) kvcr_results_free(res);
    }
    assert_int_equal(n, 1);
    assert_ptr_equal(res[0].entries[0].slots[0].addr, pool_mem(&s, 0)); /* "k" */
    assert_ptr_equal(res[0].entries[0].slots[1].addr, pool_mem(&s, 1)); /* "v" */
    assert_int_equal(res[0].entries[0].slots[1].size, 2 * BS);
    h = res[0].entries[0].release_handle;
    kvcr_results_free(res);
    bool rel;
    kvcr_release(r.kv, &h, 1, &rel);
    kvcr_free(r.kv);
    free(r.stash);
    free(s.mem);
}

static void test_defaults_and_null_arguments(void **state)
{
    (void)state;
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    assert_int_equal(cfg.operation_timeout_ms, 1000);
    assert_int_equal(cfg.abandon_timeout_ms, 5000);
    assert_int_equal(cfg.copy_threads, 2);
    assert_true(cfg.remote.eager_ctrl_connect);
    assert_false(cfg.remote.opportunistic_query);
    assert_int_equal(cfg.remote.metadata_retry_interval_ms, 100);
    assert_string_equal(cfg.remote.backend, "UCX");
    assert_string_equal(cfg.local_dram_backend, "UCX");
    assert_null(cfg.policy);
    kvcr_config_init(NULL); /* harmless */
    kvcr_t *kv;
    assert_int_equal(kvcr_create(NULL, &kv), KVCR_EINVAL);
    assert_int_equal(kvcr_create(&cfg, NULL), KVCR_EINVAL);
    assert_string_equal(kvcr_strerror(KVCR_EINVAL), "invalid argument");
    assert_string_equal(kvcr_strerror(KVCR_EUNAVAIL), "the KVCR service is not reachable");
    assert_string_equal(kvcr_strerror(12345), "unknown error");
    assert_int_equal(kvcr_version(), KVCR_VERSION_HEX);
    assert_string_equal(kvcr_version_string(), KVCR_VERSION_STRING);
    assert_null(kvcr_policy_builtin("nope"));
    assert_string_equal(kvcr_policy_builtin("fifo")->name, "fifo");
}

static void test_calls_on_null_or_closed_instances_fail_cleanly(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 1, 1);
    rig_start(&r);
    kvcr_key k = key_of("k");
    kvcr_query_result q;
    kvcr_op_handle op;
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_query(NULL, &k, 1, NULL, &q), KVCR_EINVAL);
    assert_int_equal(kvcr_poll(NULL, &res, &n), KVCR_EINVAL);
    assert_int_equal(kvcr_poll(r.kv, NULL, &n), KVCR_EINVAL);
    assert_int_equal(kvcr_close(r.kv), 0);
    assert_int_equal(kvcr_close(r.kv), 0); /* twice is fine */
    assert_int_equal(kvcr_query(r.kv, &k, 1, NULL, &q), KVCR_ECLOSED);
    assert_int_equal(kvcr_fetch(r.kv, &k, 1, NULL, NULL, 0, &op), KVCR_ECLOSED);
    assert_int_equal(kvcr_poll(r.kv, &res, &n), KVCR_ECLOSED);
    assert_int_equal(kvcr_abort(r.kv, 1, NULL, 0, NULL), KVCR_ECLOSED);
    kvcr_release_handle h = 1;
    bool rel;
    assert_int_equal(kvcr_release(r.kv, &h, 1, &rel), KVCR_ECLOSED);
    const char *keys[] = {"k"};
    size_t idx[] = {0};
    kvcr_mem_ref ref = {NULL, "", idx[0]};
    kvcr_block b = {key_of(keys[0]), &ref, 1};
    assert_int_equal(kvcr_deposit(r.kv, &b, 1, 0, &op), KVCR_ECLOSED);
    kvcr_stats *st;
    assert_int_equal(kvcr_stats_take(r.kv, &st), 0); /* telemetry off: nothing */
    assert_null(st);
    rig_stop(&r);
    kvcr_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_rule_is_refused_with_its_message),
        cmocka_unit_test(test_overlapping_regions_message_names_both_spans),
        cmocka_unit_test(test_exact_duplicate_regions_collapse_and_touching_ones_are_fine),
        cmocka_unit_test(test_local_dram_pools_may_come_in_any_order),
        cmocka_unit_test(test_defaults_and_null_arguments),
        cmocka_unit_test(test_calls_on_null_or_closed_instances_fail_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
