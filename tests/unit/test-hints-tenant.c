/* Hints are the framework's: with no tenants configured a deposit's and a
 * fetch's hints reach the policy exactly as given, whatever members they
 * have ("tenant" of any value included), and nothing is refused for them;
 * with tenants configured a "tenant" naming none of them gives the blocks
 * no tenant (counted in the gauge hints_unknown_tenant), never refusing
 * the call, unless the call asks for KVCR_STRICT_TENANT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvcr/policy.h"

typedef struct seen {
    int calls;
    char framework[256];
    char tenant[32];
} seen;

/* A version-2 policy recording the hints and tenant of each admission. */
static int see_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source, bool required,
                      const kvcr_hints *h, kvcr_placement *out)
{
    (void)source, (void)required;
    seen *s = ud;
    s->calls++;
    snprintf(s->framework, sizeof s->framework, "%.*s", (int)h->framework_len,
             h->framework ? h->framework : "");
    snprintf(s->tenant, sizeof s->tenant, "%s", m->tenant ? m->tenant : "(none)");
    *out = (kvcr_placement){KVCR_ACTION_KEEP, KVCR_TIER_NONE};
    return 0;
}

static int lru_score(void *ud, const kvcr_block_meta *m, kvcr_tier source, double *out)
{
    (void)ud, (void)source;
    *out = m->last_access;
    return 0;
}

static int drop(void *ud, const kvcr_block_meta *m, kvcr_tier source, kvcr_placement *out)
{
    (void)ud, (void)m, (void)source;
    *out = (kvcr_placement){KVCR_ACTION_DROP, KVCR_TIER_NONE};
    return 0;
}

static void start(rig *r, seen *s, kvcr_policy_ops *p, const kvcr_tenant *t, size_t n_t)
{
    rig_init(r, 256, 8, 8);
    *s = (seen){0};
    *p = (kvcr_policy_ops){.version = KVCR_POLICY_VERSION, .name = "seer",
                           .eviction_score = lru_score, .decide_eviction = drop,
                           .decide_ingest_hints = see_ingest};
    r->cfg.policy = p;
    r->cfg.policy_ud = s;
    r->cfg.enable_telemetry = true;
    r->cfg.tenants = t;
    r->cfg.n_tenants = n_t;
    rig_start(r);
}

static int deposit(rig *r, const char *key, size_t idx, const char *hints, unsigned flags)
{
    kvcr_mem_ref ref = {NULL, "", idx};
    kvcr_block b = {key_of(key), &ref, 1};
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .flags = flags,
                              .hints = hints, .hints_len = strlen(hints)};
    kvcr_op_handle op;
    int rc = kvcr_deposit_ex(r->kv, &b, 1, &o, &op);
    if (rc != 0) return rc;
    kvcr_entry_status st;
    rig_wait(r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    return 0;
}

/* A fetch of key (resident in KVCR DRAM) with these hints; its claim is
 * released again. */
static int fetch(rig *r, const char *key, const char *hints, unsigned flags)
{
    kvcr_key k = key_of(key);
    kvcr_fetch_options fo = {KVCR_FETCH_OPTIONS_VERSION, hints, strlen(hints), flags};
    kvcr_op_handle op;
    int rc = kvcr_fetch_ex(r->kv, &k, 1, NULL, NULL, 0, &fo, &op);
    if (rc != 0) return rc;
    size_t n;
    kvcr_op_result *res = rig_poll_results(r, &n);
    assert_int_equal(n, 1);
    assert_int_equal(res[0].entries[0].status, KVCR_ENTRY_SUCCESS);
    kvcr_release_handle h = res[0].entries[0].release_handle;
    kvcr_results_free(res);
    bool rel;
    assert_int_equal(kvcr_release(r->kv, &h, 1, &rel), 0);
    return 0;
}

static void test_without_tenants_hints_pass_untouched(void **state)
{
    (void)state;
    rig r;
    seen s;
    kvcr_policy_ops p;
    start(&r, &s, &p, NULL, 0);
    static const char *const hints[] = {
        "{\"tenant\":\"t1\",\"priority\":3}",
        "{\"tenant\":7,\"x\":[1,{\"y\":null}]}",
        "{\"tenant\":{\"org\":\"a\"}}",
        "{\"tenant\":\"\"}",
    };
    char key[16];
    for (size_t i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%zu", i);
        assert_int_equal(deposit(&r, key, i, hints[i], 0), 0);
        assert_string_equal(s.framework, hints[i]);
        assert_string_equal(s.tenant, "(none)");
        /* strict mode has no tenant to check against: nothing is read */
        snprintf(key, sizeof key, "s%zu", i);
        assert_int_equal(deposit(&r, key, i, hints[i], KVCR_STRICT_TENANT), 0);
    }
    assert_int_equal(s.calls, 8);
    assert_int_equal(rig_stat(&r, "hints_unknown_tenant", NULL), -1); /* no tenants: no gauge */
    rig_stop(&r);
}

static void test_an_unknown_tenant_gives_no_tenant_unless_strict(void **state)
{
    (void)state;
    static const kvcr_tenant t[] = {{"alice", 2, 0}};
    rig r;
    seen s;
    kvcr_policy_ops p;
    start(&r, &s, &p, t, 1);
    assert_int_equal(deposit(&r, "a0", 0, "{\"tenant\":\"alice\"}", 0), 0);
    assert_string_equal(s.tenant, "alice");
    /* a name the framework or the router chose, not configured here */
    const char *carol = "{\"tenant\":\"carol\",\"why\":\"router\"}";
    assert_int_equal(deposit(&r, "c0", 1, carol, 0), 0);
    assert_string_equal(s.framework, carol);
    assert_string_equal(s.tenant, "(none)");
    assert_int_equal(deposit(&r, "c1", 2, "{\"tenant\":7}", 0), 0);
    assert_string_equal(s.tenant, "(none)");
    assert_int_equal(rig_stat(&r, "hints_unknown_tenant", NULL), 2);
    assert_int_equal(rig_stat(&r, "tenant_alice_dram_slots", NULL), 1);
    assert_int_equal(rig_stat(&r, "no_tenant_dram_slots", NULL), 2);
    /* a fetch too: never refused, counted */
    assert_int_equal(fetch(&r, "a0", carol, 0), 0);
    assert_int_equal(rig_stat(&r, "hints_unknown_tenant", NULL), 3);
    /* strict: refused before anything starts, nothing counted or kept */
    int calls = s.calls;
    assert_int_equal(deposit(&r, "c2", 3, carol, KVCR_STRICT_TENANT), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "hints name tenant 'carol', which is not configured");
    assert_int_equal(deposit(&r, "c2", 3, "{\"tenant\":7}", KVCR_STRICT_TENANT), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "hints' \"tenant\" must be a string or null");
    assert_int_equal(fetch(&r, "a0", carol, KVCR_STRICT_TENANT), KVCR_EINVAL);
    assert_int_equal(rig_query(&r, "c2"), KVCR_QUERY_MISS);
    assert_int_equal(s.calls, calls);
    assert_int_equal(rig_stat(&r, "hints_unknown_tenant", NULL), 3);
    /* strict with a configured name, and unknown flags */
    assert_int_equal(deposit(&r, "a1", 4, "{\"tenant\":\"alice\"}", KVCR_STRICT_TENANT), 0);
    assert_int_equal(rig_stat(&r, "tenant_alice_dram_slots", NULL), 2);
    assert_int_equal(fetch(&r, "a0", "{}", 0x4), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "unknown fetch flags 0x4");
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_tenants_hints_pass_untouched),
        cmocka_unit_test(test_an_unknown_tenant_gives_no_tenant_unless_strict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
