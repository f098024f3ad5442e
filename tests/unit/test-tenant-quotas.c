/* Tenants and hints: two tenants share KVCR DRAM (and G3), one floods, and
 * with tenant_lru the other keeps its quota of hits (bytes compared on
 * deliver) while plain LRU loses them; quotas and hints that break a rule
 * are refused and change nothing; a version-2 C policy sees the deposit's
 * and the fetch's hints, the router hint of the fetch's request and the
 * tenant fields of its blocks; a version-1 table still works. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fd_wait.h"
#include "harness.h"
#include "promtool.h"

enum { BS = 512, FW = 64 };

static const kvcr_tenant two[] = {{"alice", 4, 0}, {"bob", 4, 0}};

static void start_tenants(rig *r, size_t slots, const char *policy)
{
    rig_init(r, BS, FW, slots);
    r->cfg.tenants = two;
    r->cfg.n_tenants = 2;
    r->cfg.enable_telemetry = true;
    r->cfg.policy = kvcr_policy_builtin(policy);
    assert_non_null(r->cfg.policy);
    for (size_t i = 0; i < FW; i++) rig_pattern(r, i, (uint32_t)(1000 + i));
    rig_start(r);
}

/* One block from framework block idx, deposited with these hints (JSON
 * text, NULL: none); returns the deposit's status, or the call's error. */
static int deposit_hinted(rig *r, const char *key, size_t idx, const char *hints,
                          kvcr_entry_status *st)
{
    kvcr_mem_ref ref = {NULL, "", idx};
    kvcr_block b = {key_of(key), &ref, 1};
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .hints = hints,
                              .hints_len = hints ? strlen(hints) : 0};
    kvcr_op_handle op;
    int rc = kvcr_deposit_ex(r->kv, &b, 1, &o, &op);
    if (rc == 0) rig_wait(r, op, st, NULL, NULL);
    return rc;
}

static void deposit_as(rig *r, const char *tenant, const char *key, size_t idx)
{
    char hints[64];
    snprintf(hints, sizeof hints, "{\"tenant\":\"%s\"}", tenant);
    kvcr_entry_status st;
    assert_int_equal(deposit_hinted(r, key, idx, hints, &st), 0);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
}

/* Delivers key into framework block dst and checks its bytes are those of
 * framework block src's pattern. */
static bool delivers_exact(rig *r, const char *key, size_t src, size_t dst)
{
    uint8_t *to = r->fw + dst * r->block_size;
    memset(to, 0, r->block_size);
    const char *k[] = {key};
    size_t at[] = {dst};
    kvcr_entry_status st;
    rig_wait(r, rig_deliver(r, k, at, 1), &st, NULL, NULL);
    return st == KVCR_ENTRY_SUCCESS && rig_has_pattern(r, to, (uint32_t)(1000 + src));
}

/* Bob deposits his quota (4 of 8 slots), then alice floods 40 blocks.
 * Returns how many of bob's blocks still deliver exact bytes. */
static int bob_hits_after_alice_floods(rig *r)
{
    char k[32];
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof k, "bob-%d", i);
        deposit_as(r, "bob", k, (size_t)i);
    }
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof k, "alice-%d", i);
        deposit_as(r, "alice", k, (size_t)(4 + i % 40));
    }
    int hits = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof k, "bob-%d", i);
        if (rig_query(r, k) == KVCR_QUERY_HIT && delivers_exact(r, k, (size_t)i, 60)) hits++;
    }
    return hits;
}

static void test_a_flooding_tenant_evicts_its_own_blocks(void **state)
{
    (void)state;
    rig r;
    start_tenants(&r, 8, "tenant_lru");
    assert_int_equal(bob_hits_after_alice_floods(&r), 4);
    /* alice kept the newest of hers, as LRU within her share */
    assert_int_equal(rig_query(&r, "alice-39"), KVCR_QUERY_HIT);
    assert_true(delivers_exact(&r, "alice-39", 4 + 39, 61));
    assert_int_equal(rig_query(&r, "alice-35"), KVCR_QUERY_MISS);
    assert_int_equal(rig_stat(&r, "tenant_bob_dram_slots", NULL), 4);
    assert_int_equal(rig_stat(&r, "tenant_bob_dram_quota_slots", NULL), 4);
    assert_int_equal(rig_stat(&r, "tenant_bob_dram_evicted_blocks", NULL), 0);
    assert_int_equal(rig_stat(&r, "tenant_alice_dram_slots", NULL), 4);
    assert_int_equal(rig_stat(&r, "tenant_alice_dram_evicted_blocks", NULL), 36);
    assert_int_equal(rig_stat(&r, "no_tenant_dram_slots", NULL), 0);
    /* A block without a tenant counts against a quota of 0: it goes first,
     * newest as it is, when alice (within her quota) needs a slot. */
    assert_int_equal(rig_deposit1(&r, "nobody", 50, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "alice-36"), KVCR_QUERY_MISS); /* nobody over: plain LRU */
    assert_int_equal(rig_stat(&r, "no_tenant_dram_slots", NULL), 1);
    deposit_as(&r, "alice", "alice-40", 51);
    assert_int_equal(rig_query(&r, "nobody"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "alice-37"), KVCR_QUERY_HIT);
    assert_int_equal(rig_stat(&r, "no_tenant_dram_evicted_blocks", NULL), 1);
    char *text = NULL;
    size_t len;
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r.kv, &s), 0);
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    assert_non_null(strstr(text, "kvcr_state{resource=\"tenant_alice_dram_slots\"} 4"));
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    rig_stop(&r);
}

static void test_tenant_gauges_are_promtool_clean(void **state)
{
    (void)state;
    rig r;
    start_tenants(&r, 8, "tenant_lru");
    deposit_as(&r, "alice", "a", 0);
    char *text = NULL;
    size_t len;
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r.kv, &s), 0);
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    kvcr_stats_free(s);
    rig_stop(&r);
    assert_non_null(strstr(text, "kvcr_state{resource=\"no_tenant_dram_quota_slots\"} 0"));
    assert_promtool_clean(text); /* skips without promtool */
    kvcr_prometheus_free(text);
}

static void test_plain_lru_lets_the_flood_evict_the_other_tenant(void **state)
{
    (void)state;
    rig r;
    start_tenants(&r, 8, "lru"); /* the same tenants, a policy without quotas */
    assert_int_equal(bob_hits_after_alice_floods(&r), 0);
    assert_int_equal(rig_stat(&r, "tenant_bob_dram_evicted_blocks", NULL), 4);
    rig_stop(&r);
}

/* ---- G3 -------------------------------------------------------------------- */

typedef struct g3_files {
    char dir[40], path[64];
    const char *paths[1];
} g3_files;

static void g3_setup(rig *r, g3_files *f, size_t slots)
{
    snprintf(f->dir, sizeof f->dir, "/var/tmp/kvcr-tenant-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/g3", f->dir);
    f->paths[0] = f->path;
    r->cfg.g3.paths = f->paths;
    r->cfg.g3.n_paths = 1;
    r->cfg.g3.capacity_bytes_per_file = slots * r->block_size;
}

static void g3_cleanup(g3_files *f)
{
    unlink(f->path);
    rmdir(f->dir);
}

/* 2 KVCR DRAM slots of 4096 bytes and 8 G3 slots, shared by the two
 * tenants t[0..2). */
static void g3_tenants_init(rig *r, g3_files *f, size_t fw_count, const kvcr_tenant *t)
{
    rig_init(r, 4096, fw_count, 2);
    g3_setup(r, f, 8);
    r->cfg.tenants = t;
    r->cfg.n_tenants = 2;
}

/* KVCR DRAM of 2 slots and G3 of 8, each shared half and half: a block
 * without a tenant comes first, bob stores 5 blocks (1 in DRAM, 4 spilled),
 * then alice floods 30. Returns how many of bob's blocks still deliver exact
 * bytes (from DRAM or straight from G3). */
static int bob_g3_hits_after_alice_floods(const char *policy)
{
    rig r;
    g3_files f;
    static const kvcr_tenant t[] = {{"alice", 1, 4}, {"bob", 1, 4}};
    g3_tenants_init(&r, &f, 40, t);
    r.cfg.enable_telemetry = true;
    r.cfg.policy = kvcr_policy_builtin(policy);
    for (size_t i = 0; i < 40; i++) rig_pattern(&r, i, (uint32_t)(1000 + i));
    rig_start(&r);
    char k[32];
    assert_int_equal(rig_deposit1(&r, "nobody", 35, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "bob-%d", i);
        deposit_as(&r, "bob", k, (size_t)i);
        rig_g3_settle(&r);
    }
    assert_int_equal(rig_stat(&r, "no_tenant_g3_slots", NULL), 1); /* spilled first */
    for (int i = 0; i < 30; i++) {
        snprintf(k, sizeof k, "alice-%d", i);
        deposit_as(&r, "alice", k, (size_t)(5 + i));
        rig_g3_settle(&r);
    }
    assert_int_equal(rig_stat(&r, "tenant_alice_g3_quota_slots", NULL), 4);
    double bob_g3 = rig_stat(&r, "tenant_bob_g3_slots", NULL);
    double alice_g3 = rig_stat(&r, "tenant_alice_g3_slots", NULL);
    assert_int_equal(bob_g3 + alice_g3, 8); /* G3 full, every slot counted once */
    int hits = 0;
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "bob-%d", i);
        hits += delivers_exact(&r, k, (size_t)i, 39);
    }
    if (strcmp(policy, "g3_tenant_lru") == 0) {
        /* G3 took its victims from the tenants over their quota, oldest
         * first: the block without a tenant, then alice's own. */
        assert_int_equal(bob_g3, 4);
        assert_int_equal(rig_stat(&r, "no_tenant_g3_slots", NULL), 0);
        assert_int_equal(rig_query(&r, "nobody"), KVCR_QUERY_MISS);
        assert_int_equal(rig_query(&r, "alice-29"), KVCR_QUERY_HIT);
        assert_true(delivers_exact(&r, "alice-25", 5 + 25, 38)); /* G3 keeps her newest */
        assert_int_equal(rig_query(&r, "alice-20"), KVCR_QUERY_MISS);
    }
    rig_stop(&r);
    g3_cleanup(&f);
    return hits;
}

static void test_g3_quotas_keep_the_other_tenants_spilled_blocks(void **state)
{
    (void)state;
    assert_int_equal(bob_g3_hits_after_alice_floods("g3_tenant_lru"), 5);
    assert_true(bob_g3_hits_after_alice_floods("g3_lru") < 5); /* without quotas: lost */
}

/* ---- refusals ------------------------------------------------------------ */

static void expect_refused(rig *r, int want, const char *msg)
{
    kvcr_t *kv = NULL;
    int rc = kvcr_create(&r->cfg, &kv);
    if (rc != want || strstr(kvcr_last_error(), msg) == NULL)
        fail_msg("got %d '%s', want %d '...%s...'", rc, kvcr_last_error(), want, msg);
    assert_null(kv);
}

static void test_invalid_quotas_are_refused(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, FW, 8);
    kvcr_tenant t[KVCR_MAX_TENANTS + 1];
    char names[KVCR_MAX_TENANTS + 1][16];
    for (int i = 0; i <= KVCR_MAX_TENANTS; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        t[i] = (kvcr_tenant){names[i], 0, 0};
    }
    r.cfg.tenants = t;
    r.cfg.n_tenants = KVCR_MAX_TENANTS + 1;
    expect_refused(&r, KVCR_EINVAL, "at most 64 tenants");
    r.cfg.n_tenants = 0;
    expect_refused(&r, KVCR_EINVAL, "tenants and n_tenants must be set together");
    r.cfg.n_tenants = 2;
    t[1].name = "t0";
    expect_refused(&r, KVCR_EINVAL, "tenant names must be unique ('t0' twice)");
    t[1].name = "a b";
    expect_refused(&r, KVCR_EINVAL, "tenant 1's name must be 1 to 63 bytes");
    t[1].name = "";
    expect_refused(&r, KVCR_EINVAL, "tenant 1's name must be 1 to 63 bytes");
    t[1].name = NULL;
    expect_refused(&r, KVCR_EINVAL, "tenant 1's name must be 1 to 63 bytes");
    t[1].name = "t1";
    t[0].dram_slots = 5;
    t[1].dram_slots = 4; /* 9 of 8 slots */
    expect_refused(&r, KVCR_EINVAL, "tenants' DRAM quotas must add up to at most the DRAM "
                                    "slots (8): tenant 't1' brings them past it");
    t[0].dram_slots = UINT64_MAX; /* no wrap-around */
    expect_refused(&r, KVCR_EINVAL, "tenant 't0' brings them past it");
    t[0].dram_slots = 4;
    t[1].g3_slots = 1;
    expect_refused(&r, KVCR_EINVAL, "tenant 't1' has a G3 quota but G3 is not configured");
    t[1].g3_slots = 0;
    /* A policy table with unknown flags. */
    kvcr_policy_ops flagged = *kvcr_policy_builtin("tenant_lru");
    flagged.flags = 0x6;
    r.cfg.policy = &flagged;
    expect_refused(&r, KVCR_EINVAL, "policy 'tenant_lru' has unknown flags 0x6");
    r.cfg.policy = NULL;
    rig_start(&r); /* the same tenants within the rules start */
    rig_stop(&r);
}

static void test_invalid_hints_are_refused_and_change_nothing(void **state)
{
    (void)state;
    rig r;
    start_tenants(&r, 8, "tenant_lru");
    static const struct {
        const char *hints;
        int rc;
        const char *msg;
    } bad[] = {
        {"{\"tenant\":\"carol\"}", KVCR_EINVAL, "hints name tenant 'carol', which is not configured"},
        {"{\"tenant\":7}", KVCR_EINVAL, "hints' \"tenant\" must be a string or null"},
        {"[\"bob\"]", KVCR_EINVAL, "hints must be a JSON object"},
        {"{\"tenant\":\"bob\"", KVCR_EINVAL, "hints must be strict JSON text"},
        {"{\"a\":1,\"a\":2}", KVCR_EINVAL, "hints must be strict JSON text"},
    };
    kvcr_entry_status st;
    /* In strict mode (KVCR_STRICT_TENANT) a tenant not configured is
     * refused too; without it, it gives no tenant (test-hints-tenant). */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvcr_mem_ref xr = {NULL, "", 0};
        kvcr_block xb = {key_of("x"), &xr, 1};
        kvcr_deposit_options xo = {.version = KVCR_DEPOSIT_OPTIONS_VERSION,
                                   .flags = KVCR_STRICT_TENANT, .hints = bad[i].hints,
                                   .hints_len = strlen(bad[i].hints)};
        kvcr_op_handle xop;
        int rc = kvcr_deposit_ex(r.kv, &xb, 1, &xo, &xop);
        if (rc != bad[i].rc || strstr(kvcr_last_error(), bad[i].msg) == NULL)
            fail_msg("hints %s: got %d '%s'", bad[i].hints, rc, kvcr_last_error());
        kvcr_key k = key_of("x");
        kvcr_fetch_options fo = {KVCR_FETCH_OPTIONS_VERSION, bad[i].hints, strlen(bad[i].hints),
                                 KVCR_STRICT_TENANT};
        kvcr_op_handle op;
        assert_int_equal(kvcr_fetch_ex(r.kv, &k, 1, NULL, NULL, 0, &fo, &op), bad[i].rc);
    }
    /* NULL text with a length; text over limits.max_hint_bytes. */
    kvcr_mem_ref ref = {NULL, "", 0};
    kvcr_block b = {key_of("x"), &ref, 1};
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .hints_len = 3};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit_ex(r.kv, &b, 1, &o, &op), KVCR_EINVAL);
    size_t big = (1u << 20) + 1;
    char *text = malloc(big);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    o.hints = text;
    o.hints_len = big;
    assert_int_equal(kvcr_deposit_ex(r.kv, &b, 1, &o, &op), KVCR_ELIMIT);
    free(text);
    kvcr_stats *snap = NULL; /* the refusal is counted as the hint_bytes limit's */
    assert_int_equal(kvcr_stats_take(r.kv, &snap), 0);
    double refused = 0;
    for (size_t i = 0; i < snap->n_counters; i++)
        if (strcmp(snap->counters[i].operation, "hint_bytes") == 0) refused = snap->counters[i].value;
    kvcr_stats_free(snap);
    assert_int_equal(refused, 1);
    assert_int_equal(rig_query(&r, "x"), KVCR_QUERY_MISS);
    assert_int_equal(rig_stat(&r, "local_g2_allocated_slots", NULL), 0);
    /* null names no tenant */
    assert_int_equal(deposit_hinted(&r, "x", 0, "{\"tenant\":null,\"k\":[1]}", &st), 0);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_stat(&r, "no_tenant_dram_slots", NULL), 1);
    rig_stop(&r);
}

/* ---- a C policy sees the hints -------------------------------------------- */

typedef struct seen {
    int calls;
    char framework[256], router[1024];
    kvcr_tier source;
    bool required;
    char tenant[32];
    uint64_t tenant_dram_slots, tenant_dram_quota, tenant_g3_quota;
} seen;

static void copy_text(char *dst, size_t cap, const char *src, size_t len)
{
    if (src == NULL) {
        snprintf(dst, cap, "(null)");
        return;
    }
    assert_true(len < cap && strlen(src) == len); /* NUL-terminated at len */
    memcpy(dst, src, len + 1);
}

static int see_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source, bool required,
                      const kvcr_hints *h, kvcr_placement *out)
{
    seen *s = ud;
    s->calls++;
    copy_text(s->framework, sizeof s->framework, h->framework, h->framework_len);
    copy_text(s->router, sizeof s->router, h->router, h->router_len);
    s->source = source;
    s->required = required;
    snprintf(s->tenant, sizeof s->tenant, "%s", m->tenant ? m->tenant : "(none)");
    s->tenant_dram_slots = m->tenant_dram_slots;
    s->tenant_dram_quota = m->tenant_dram_quota;
    s->tenant_g3_quota = m->tenant_g3_quota;
    *out = (kvcr_placement){KVCR_ACTION_KEEP, KVCR_TIER_NONE};
    return 0;
}

static int lru_score(void *ud, const kvcr_block_meta *m, kvcr_tier source, double *out)
{
    (void)ud, (void)source;
    *out = m->last_access;
    return 0;
}

static int spill(void *ud, const kvcr_block_meta *m, kvcr_tier source, kvcr_placement *out)
{
    (void)ud, (void)m;
    bool dram = source == KVCR_TIER_LOCAL_G2;
    *out = (kvcr_placement){dram ? KVCR_ACTION_MOVE_TO : KVCR_ACTION_DROP,
                            dram ? KVCR_TIER_G3 : KVCR_TIER_NONE};
    return 0;
}

/* The recording policy above, set up as r's (version 2, spilling to G3). */
static void use_seer(rig *r, seen *s, kvcr_policy_ops *p)
{
    *s = (seen){0};
    *p = (kvcr_policy_ops){.version = KVCR_POLICY_VERSION, .name = "seer",
                           .eviction_score = lru_score, .decide_eviction = spill,
                           .decide_ingest_hints = see_ingest};
    r->cfg.policy = p;
    r->cfg.policy_ud = s;
}

/* Polls until the key is FETCHABLE from G3: its spill landed (bounded: 5 s;
 * while it is written it queries FETCHING). */
static void wait_in_g3(rig *r, const kvcr_key *k)
{
    kvcr_query_result q = {0};
    uint64_t until = fd_wait_now_ms() + 5000;
    do {
        rig_pump(r);
        assert_int_equal(kvcr_query(r->kv, k, 1, NULL, &q), 0);
    } while (q.status != KVCR_QUERY_FETCHABLE && fd_wait(r->kv, until));
    assert_int_equal(q.status, KVCR_QUERY_FETCHABLE);
    assert_int_equal(q.tier, KVCR_TIER_G3);
}

static const char *const HINT =
    "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":\"kv.fetch\","
    "\"action_version\":\"1.0\",\"payload\":{\"source_control_endpoint\":"
    "\"tcp://127.0.0.1:9\",\"block_hashes\":[18446744073709551615]}}]}";

static void test_a_c_policy_sees_the_hints_and_the_tenant(void **state)
{
    (void)state;
    rig r;
    g3_files f;
    static const kvcr_tenant t[] = {{"alice", 1, 3}, {"bob", 1, 5}};
    g3_tenants_init(&r, &f, 8, t);
    seen s;
    kvcr_policy_ops p;
    use_seer(&r, &s, &p);
    for (size_t i = 0; i < 8; i++) rig_pattern(&r, i, (uint32_t)(7 + i));
    rig_start(&r);
    kvcr_entry_status st;
    const char *fw = "{\"tenant\":\"bob\",\"priority\":3}";
    /* deposit: its hints as framework hints, no router hint, required = no_evict */
    assert_int_equal(deposit_hinted(&r, "b0", 0, fw, &st), 0);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_int_equal(s.calls, 1);
    assert_string_equal(s.framework, fw);
    assert_string_equal(s.router, "(null)");
    assert_int_equal(s.source, KVCR_TIER_FW_G2);
    assert_false(s.required);
    assert_string_equal(s.tenant, "bob");
    assert_int_equal(s.tenant_dram_slots, 0); /* asked before its slot is taken */
    assert_int_equal(s.tenant_dram_quota, 1);
    assert_int_equal(s.tenant_g3_quota, 5);
    /* plain kvcr_deposit: no hints, no tenant */
    assert_int_equal(rig_deposit1(&r, "n0", 1, KVCR_NO_EVICT, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_string_equal(s.framework, "(null)");
    assert_string_equal(s.tenant, "(none)");
    assert_true(s.required);
    /* b0 is spilled to G3 (n0 is pinned), keeping its tenant */
    assert_int_equal(rig_deposit1(&r, "n1", 2, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    kvcr_key k = key_of("b0");
    wait_in_g3(&r, &k);
    /* fetch back from G3 for a request with a router hint: both reach the policy */
    assert_int_equal(kvcr_submit_hint(r.kv, "req-1", HINT, strlen(HINT)), 0);
    const char *ff = "{\"tenant\":\"alice\",\"why\":\"prefill\"}";
    kvcr_fetch_options fo = {KVCR_FETCH_OPTIONS_VERSION, ff, strlen(ff)};
    kvcr_op_handle op;
    int calls = s.calls;
    fo.version = 0; /* not made for this library */
    assert_int_equal(kvcr_fetch_ex(r.kv, &k, 1, "req-1", NULL, 0, &fo, &op), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "kvcr_fetch_options has version 0"));
    fo.version = KVCR_FETCH_OPTIONS_VERSION;
    assert_int_equal(kvcr_fetch_ex(r.kv, &k, 1, "req-1", NULL, 0, &fo, &op), 0);
    size_t n;
    kvcr_op_result *res = rig_poll_results(&r, &n);
    assert_int_equal(n, 1);
    assert_int_equal(res[0].entries[0].status, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, res[0].entries[0].slots[0].addr, 7));
    kvcr_release_handle h = res[0].entries[0].release_handle;
    kvcr_results_free(res);
    assert_int_equal(s.calls, calls + 1);
    assert_string_equal(s.framework, ff);
    assert_string_equal(s.router, HINT);
    assert_int_equal(s.source, KVCR_TIER_G3);
    assert_true(s.required);
    assert_string_equal(s.tenant, "bob"); /* a block keeps its tenant while it is held */
    bool rel;
    assert_int_equal(kvcr_release(r.kv, &h, 1, &rel), 0);
    rig_stop(&r);
    g3_cleanup(&f);
}

/* A block in parts that only G3 holds is delivered through KVCR DRAM: that
 * staging is admitted with the deliver's router hint. */
static void test_a_staged_deliver_admits_with_its_router_hint(void **state)
{
    (void)state;
    enum { PB = 4096, N = 8 };
    rig r;
    g3_files f;
    rig_init(&r, PB, N, 2);
    g3_setup(&r, &f, 8);
    r.layout.name = "kv";
    r.pool.name = "kv";
    kvcr_region parts[2] = {
        {.addr = r.fw, .element_size = PB / 2, .count = N, .label = "kv:k"},
        {.addr = r.fw + N * PB / 2, .element_size = PB / 2, .count = N, .label = "kv:v"}};
    r.cfg.framework_regions = parts;
    r.cfg.n_framework_regions = 2;
    seen s;
    kvcr_policy_ops p;
    use_seer(&r, &s, &p);
    for (uint32_t i = 0; i < N; i++) { /* part k of element i, then part v */
        fill_pattern(r.fw + i * PB / 2, PB / 2, 500 + i);
        fill_pattern(r.fw + N * PB / 2 + i * PB / 2, PB / 2, 600 + i);
    }
    rig_start(&r);
    const char *names[] = {"p0", "p1", "p2"};
    for (uint32_t i = 0; i < 3; i++) { /* two DRAM slots: p0 is spilled */
        kvcr_mem_ref ref = {NULL, "kv:*", i};
        kvcr_block b = {key_of(names[i]), &ref, 1};
        kvcr_op_handle op;
        kvcr_entry_status st;
        assert_int_equal(kvcr_deposit(r.kv, &b, 1, 0, &op), 0);
        rig_wait(&r, op, &st, NULL, NULL);
        assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    }
    kvcr_key k = key_of("p0");
    wait_in_g3(&r, &k);
    assert_int_equal(kvcr_submit_hint(r.kv, "req-2", HINT, strlen(HINT)), 0);
    memset(r.fw + 5 * PB / 2, 0, PB / 2);
    memset(r.fw + N * PB / 2 + 5 * PB / 2, 0, PB / 2);
    kvcr_mem_ref ref = {NULL, "kv:*", 5};
    kvcr_block b = {k, &ref, 1};
    kvcr_op_handle op;
    kvcr_entry_status st;
    int calls = s.calls;
    assert_int_equal(kvcr_deliver(r.kv, &b, 1, "req-2", &op), 0);
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_int_equal(s.calls, calls + 1);
    assert_string_equal(s.router, HINT);
    assert_string_equal(s.framework, "(null)");
    assert_int_equal(s.source, KVCR_TIER_G3);
    uint8_t *want = malloc(PB / 2);
    fill_pattern(want, PB / 2, 500);
    assert_memory_equal(r.fw + 5 * PB / 2, want, PB / 2);
    fill_pattern(want, PB / 2, 600);
    assert_memory_equal(r.fw + N * PB / 2 + 5 * PB / 2, want, PB / 2);
    free(want);
    rig_stop(&r);
    g3_cleanup(&f);
}

/* ---- version 1 tables ------------------------------------------------------- */

static int v1_calls;

static int v1_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier src, bool req,
                     kvcr_placement *out)
{
    (void)ud, (void)m, (void)src, (void)req;
    v1_calls++;
    *out = (kvcr_placement){KVCR_ACTION_KEEP, KVCR_TIER_NONE};
    return 0;
}

static void test_a_version_1_table_still_works(void **state)
{
    (void)state;
    rig r;
    /* Exactly as long as a version-1 table: reading a version-2 field of it
     * would be out of bounds (ASan). */
    size_t v1_size = offsetof(kvcr_policy_ops, flags);
    kvcr_policy_ops full = *kvcr_policy_builtin("lru");
    full.version = 1;
    full.name = "old";
    full.decide_ingest = v1_ingest;
    kvcr_policy_ops *old = malloc(v1_size);
    memcpy(old, &full, v1_size);
    rig_init(&r, BS, FW, 8);
    r.cfg.policy = old;
    r.cfg.tenants = two;
    r.cfg.n_tenants = 2;
    rig_start(&r);
    v1_calls = 0;
    deposit_as(&r, "bob", "b", 0);
    assert_int_equal(v1_calls, 1);
    rig_stop(&r);
    free(old);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_flooding_tenant_evicts_its_own_blocks),
        cmocka_unit_test(test_plain_lru_lets_the_flood_evict_the_other_tenant),
        cmocka_unit_test(test_tenant_gauges_are_promtool_clean),
        cmocka_unit_test(test_g3_quotas_keep_the_other_tenants_spilled_blocks),
        cmocka_unit_test(test_invalid_quotas_are_refused),
        cmocka_unit_test(test_invalid_hints_are_refused_and_change_nothing),
        cmocka_unit_test(test_a_c_policy_sees_the_hints_and_the_tenant),
        cmocka_unit_test(test_a_staged_deliver_admits_with_its_router_hint),
        cmocka_unit_test(test_a_version_1_table_still_works),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
