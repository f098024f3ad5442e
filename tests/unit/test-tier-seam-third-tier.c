/* The tier seam holds for a third tier: in-memory fake tiers
 * (tests/support/fake_tier.h) added beside KVCR DRAM with lower_add, as
 * kvcr_create adds G3 and the peers, and driven through the public API in
 * one process. Reads ask the tiers in read order and the first holder
 * serves (bytes compared); the core settles, stops, closes and destroys
 * them in their documented orders; blocks spill into the third tier and
 * come back by fetch and deliver, byte exact, with failed reads and
 * refused spills reported as the contract says; tenants' quotas are kept
 * per tier; and the table refuses a tier beyond KVCR_MAX_TIERS, or a
 * second tier that takes spills, changing nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/instance.h"
#include "core/lower.h"
#include "fake_tier.h"
#include "harness.h"

enum { BS = 256, FW = 32 };

/* A built-in policy ("g3_lru", "g3_tenant_lru" spill to G3 on eviction)
 * without its need of configured G3: a fake with the G3 id stands in. */
static kvcr_policy_ops policy_of(const char *builtin)
{
    kvcr_policy_ops p = *kvcr_policy_builtin(builtin);
    p.required_tiers = 0;
    return p;
}

typedef struct seam {
    rig r;
    kvcr_policy_ops policy;
    fake_trail trail;
    fake_tier *fake[KVCR_MAX_TIERS];
    uint32_t n;
} seam;

/* An instance of `slots` KVCR DRAM slots with these tenants (n 0: none). */
static void seam_start(seam *s, size_t slots, const char *policy, const kvcr_tenant *tenants,
                       size_t n_tenants)
{
    memset(s, 0, sizeof *s);
    rig_init(&s->r, BS, FW, slots);
    s->r.cfg.tenants = tenants;
    s->r.cfg.n_tenants = n_tenants;
    s->r.cfg.enable_telemetry = true;
    s->policy = policy_of(policy);
    s->r.cfg.policy = &s->policy;
    for (size_t i = 0; i < FW; i++) rig_pattern(&s->r, i, (uint32_t)(100 + i));
    rig_start(&s->r);
}

/* A fake made for s's instance (not added). */
static fake_tier *fake(seam *s, const char *name, kvcr_tier id, bool spills, uint32_t slots)
{
    fake_tier_opts o = {name, id, spills, slots, &s->trail};
    fake_tier *f = fake_tier_new(s->r.kv, &o);
    assert_non_null(f);
    return f;
}

/* Adds a fake after the tiers s has, before the test's first call. */
static fake_tier *add(seam *s, const char *name, kvcr_tier id, bool spills, uint32_t slots)
{
    fake_tier *f = fake(s, name, id, spills, slots);
    assert_int_equal(lower_add(s->r.kv, fake_tier_ops(f), fake_tier_of(f)), 0);
    s->fake[s->n++] = f;
    return f;
}

static void trail_clear(seam *s)
{
    s->trail.text[0] = '\0';
}

static kvcr_query_result query(seam *s, const char *key)
{
    kvcr_key k = key_of(key);
    kvcr_query_result q;
    assert_int_equal(kvcr_query(s->r.kv, &k, 1, NULL, &q), 0);
    return q;
}

/* Delivers key into framework block dst; its status and why. */
static kvcr_entry_status deliver(seam *s, const char *key, size_t dst, kvcr_reason *why)
{
    memset(s->r.fw + dst * BS, 0, BS);
    const char *k[] = {key};
    size_t at[] = {dst};
    kvcr_entry_status st;
    rig_wait(&s->r, rig_deliver(&s->r, k, at, 1), &st, why, NULL);
    return st;
}

/* Whether framework block dst holds the pattern of seed. */
static bool fw_has(seam *s, size_t dst, uint32_t seed)
{
    return rig_has_pattern(&s->r, s->r.fw + dst * BS, seed);
}

static void pattern_of(uint32_t seed, uint8_t *out)
{
    fill_pattern(out, BS, seed);
}

/* Index of the gauge named name in a fresh snapshot, -1 when absent. */
static int gauge_at(seam *s, const char *name)
{
    kvcr_stats *st = NULL;
    assert_int_equal(kvcr_stats_take(s->r.kv, &st), 0);
    int at = -1;
    for (size_t i = 0; i < st->n_gauges; i++)
        if (strcmp(st->gauges[i].resource, name) == 0) at = (int)i;
    kvcr_stats_free(st);
    return at;
}

/* ---- read order, settle order, close order -------------------------------- */

static void test_reads_ask_the_tiers_in_order_and_close_runs_them_down(void **state)
{
    (void)state;
    seam s;
    seam_start(&s, 4, "g3_lru", NULL, 0);
    fake_tier *a = add(&s, "A", KVCR_TIER_G3, true, 4);
    fake_tier *b = add(&s, "B", KVCR_TIER_REMOTE_G2, false, 4);
    fake_tier *c = add(&s, "C", KVCR_TIER_REMOTE_G2, false, 4);
    uint8_t both_b[BS], both_c[BS], only_c[BS];
    pattern_of(7, both_b);
    pattern_of(8, both_c);
    pattern_of(9, only_c);
    fake_tier_put(b, "both", both_b, BS);
    fake_tier_put(c, "both", both_c, BS);
    fake_tier_put(c, "only-c", only_c, BS);

    /* A query opens a batch with every tier and stops at the first holder. */
    trail_clear(&s);
    kvcr_query_result q = query(&s, "both");
    assert_int_equal(q.status, KVCR_QUERY_FETCHABLE);
    assert_int_equal(q.tier, KVCR_TIER_REMOTE_G2);
    assert_string_equal(s.trail.text, "A.begin B.begin C.begin A.holds B.holds A.end B.end C.end");
    trail_clear(&s);
    assert_int_equal(query(&s, "nowhere").status, KVCR_QUERY_MISS);
    assert_string_equal(s.trail.text,
                        "A.begin B.begin C.begin A.holds B.holds C.holds A.end B.end C.end");

    /* The first holder in read order serves the bytes: B's, not C's. */
    assert_int_equal(deliver(&s, "both", 20, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 20, 7));
    assert_int_equal(deliver(&s, "only-c", 21, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 21, 9));

    /* Held reads stay pending through polls; released, the core settles
     * the later tiers first (the peers before G3, as before the seam). */
    fake_tier_hold(b, true);
    fake_tier_hold(c, true);
    memset(s.r.fw + 22 * BS, 0, 2 * BS);
    const char *keys[] = {"both", "only-c"};
    size_t at[] = {22, 23};
    kvcr_op_handle op = rig_deliver(&s.r, keys, at, 2);
    kvcr_op_result *res = NULL;
    size_t n = 0;
    assert_int_equal(kvcr_poll(s.r.kv, &res, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(fake_tier_pending(b), 1);
    assert_int_equal(fake_tier_pending(c), 1);
    trail_clear(&s);
    fake_tier_hold(b, false);
    fake_tier_hold(c, false);
    kvcr_entry_status st[2];
    assert_int_equal(rig_wait(&s.r, op, st, NULL, NULL), 2);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[1], KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 22, 7) && fw_has(&s, 23, 9));
    assert_string_equal(s.trail.text, "C.settle B.settle");

    /* Every tier's gauges, later tiers first. */
    int ga = gauge_at(&s, "fake_A_blocks"), gb = gauge_at(&s, "fake_B_blocks"),
        gc = gauge_at(&s, "fake_C_blocks");
    assert_true(ga >= 0 && gb >= 0 && gc >= 0);
    assert_true(gc < gb && gb < ga);
    assert_int_equal(rig_stat(&s.r, "fake_C_blocks", NULL), 2);
    assert_int_equal(rig_stat(&s.r, "fake_A_blocks", NULL), 0);
    (void)a;

    /* Close: stop from the last, close from the first; free: destroy from
     * the last. */
    trail_clear(&s);
    assert_int_equal(kvcr_close(s.r.kv), 0);
    assert_string_equal(s.trail.text, "C.stop B.stop A.stop A.close B.close C.close");
    trail_clear(&s);
    rig_stop(&s.r);
    assert_string_equal(s.trail.text, "C.destroy B.destroy A.destroy");
}

/* ---- spills into the third tier and back ------------------------------------ */

static void deposit_n(seam *s, int from, int to)
{
    char k[32];
    for (int i = from; i < to; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(rig_deposit1(&s->r, k, (size_t)i, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    }
}

static void test_blocks_spill_into_the_third_tier_and_come_back_byte_exact(void **state)
{
    (void)state;
    seam s;
    seam_start(&s, 4, "g3_lru", NULL, 0);
    /* G3's place and the peers' are taken by readers; the third tier
     * takes the spills. */
    add(&s, "B", KVCR_TIER_REMOTE_G2, false, 1);
    add(&s, "C", KVCR_TIER_REMOTE_G2, false, 1);
    fake_tier *a = add(&s, "A", KVCR_TIER_G3, true, 8);
    deposit_n(&s, 0, 6); /* 4 DRAM slots: k0 and k1 spill */
    assert_int_equal(rig_stat(&s.r, "fake_A_blocks", NULL), 2);
    uint8_t want[BS];
    size_t len;
    const uint8_t *kept = fake_tier_bytes(a, "k0", &len);
    pattern_of(100, want);
    assert_non_null(kept);
    assert_int_equal(len, BS);
    assert_memory_equal(kept, want, BS);
    kvcr_query_result q = query(&s, "k0");
    assert_int_equal(q.status, KVCR_QUERY_FETCHABLE);
    assert_int_equal(q.tier, KVCR_TIER_G3);

    /* Straight into framework memory. */
    assert_int_equal(deliver(&s, "k1", 30, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 30, 101));
    /* A read that fails fails its entry; the block is still there. */
    fake_tier_fail_reads(a, 1);
    kvcr_reason why;
    assert_int_equal(deliver(&s, "k1", 30, &why), KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_TRANSFER_ERROR);
    assert_int_equal(deliver(&s, "k1", 30, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 30, 101));

    /* Fetched back into KVCR DRAM (evicting, so spilling, another). */
    kvcr_key k = key_of("k0");
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(s.r.kv, &k, 1, NULL, NULL, 0, &op), 0);
    kvcr_entry_status st;
    kvcr_release_handle rh;
    rig_wait(&s.r, op, &st, NULL, &rh);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    bool released;
    assert_int_equal(kvcr_release(s.r.kv, &rh, 1, &released), 0);
    assert_true(released);
    assert_int_equal(query(&s, "k0").tier, KVCR_TIER_LOCAL_G2);
    assert_int_equal(rig_stat(&s.r, "fake_A_blocks", NULL), 3);
    memset(s.r.fw + 31 * BS, 0, BS);
    assert_int_equal(deliver(&s, "k0", 31, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 31, 100));

    /* A refused spill: the evicted block is gone, not half-kept. */
    fake_tier_refuse_spills(a, true);
    deposit_n(&s, 6, 7);
    assert_int_equal(rig_stat(&s.r, "fake_A_blocks", NULL), 3);
    int lost = 0;
    char key[32];
    for (int i = 0; i < 7; i++) {
        snprintf(key, sizeof key, "k%d", i);
        lost += query(&s, key).status == KVCR_QUERY_MISS;
    }
    assert_int_equal(lost, 1);
    rig_stop(&s.r);
}

/* ---- quotas per tier ---------------------------------------------------------- */

static const kvcr_tenant two[] = {{"alice", 2, 0}, {"bob", 2, 0}};

static void deposit_as(seam *s, const char *tenant, const char *key, size_t idx)
{
    char hints[64];
    snprintf(hints, sizeof hints, "{\"tenant\":\"%s\"}", tenant);
    kvcr_mem_ref ref = {NULL, "", idx};
    kvcr_block b = {key_of(key), &ref, 1};
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .hints = hints,
                              .hints_len = strlen(hints)};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit_ex(s->r.kv, &b, 1, &o, &op), 0);
    kvcr_entry_status st;
    rig_wait(&s->r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
}

/* Bob's block spills into the third tier (2 slots), then alice floods it;
 * returns whether bob's block is still there. */
static bool bob_kept_below(const char *policy, seam *s)
{
    seam_start(s, 4, policy, two, 2);
    add(s, "B", KVCR_TIER_REMOTE_G2, false, 1);
    add(s, "A", KVCR_TIER_G3, true, 2);
    /* The configuration has quotas of G3 alone (kvcr_tenant.g3_slots, 0
     * without configured G3): the fake, serving the G3 id, took those
     * zeros; its tenants' quotas are set where the core keeps them, per
     * tier (a new tier's quota option fills the same place). */
    assert_int_equal(s->r.kv->tenants[1].lower_quota[1], 0);
    s->r.kv->tenants[1].lower_quota[1] = 1;
    s->r.kv->tenants[2].lower_quota[1] = 1;
    deposit_as(s, "bob", "bob-0", 0);
    deposit_as(s, "bob", "bob-1", 1);
    deposit_as(s, "bob", "bob-2", 2); /* bob over his DRAM quota: bob-0 spills */
    char k[32];
    for (int i = 0; i < 6; i++) {
        snprintf(k, sizeof k, "alice-%d", i);
        deposit_as(s, "alice", k, (size_t)(3 + i));
    }
    kvcr_query_result q = query(s, "bob-0");
    return q.status == KVCR_QUERY_FETCHABLE && q.tier == KVCR_TIER_G3;
}

static void test_tenant_quotas_are_kept_per_tier(void **state)
{
    (void)state;
    seam s;
    assert_true(bob_kept_below("g3_tenant_lru", &s));
    assert_int_equal(deliver(&s, "bob-0", 30, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(fw_has(&s, 30, 100));
    /* The G3 id's tier keys the public names. */
    assert_int_equal(rig_stat(&s.r, "tenant_bob_g3_slots", NULL), 1);
    assert_int_equal(rig_stat(&s.r, "tenant_bob_g3_quota_slots", NULL), 1);
    assert_int_equal(rig_stat(&s.r, "tenant_alice_g3_slots", NULL), 1);
    assert_int_equal(rig_stat(&s.r, "tenant_alice_g3_quota_slots", NULL), 1);
    assert_int_equal(rig_stat(&s.r, "no_tenant_g3_slots", NULL), 0);
    /* Counted in the spilling tier's place only. */
    assert_int_equal(s.r.kv->tenants[2].lower_slots[1], 1);
    assert_int_equal(s.r.kv->tenants[2].lower_slots[0], 0);
    rig_stop(&s.r);

    /* Without quota-first eviction the oldest goes: bob's. */
    assert_false(bob_kept_below("g3_lru", &s));
    rig_stop(&s.r);
}

/* ---- the table's bounds --------------------------------------------------------- */

static void test_the_tier_table_refuses_what_does_not_fit(void **state)
{
    (void)state;
    seam s;
    seam_start(&s, 4, "g3_lru", NULL, 0);
    /* A tier_ops of another version. */
    fake_tier *extra = fake(&s, "S", KVCR_TIER_REMOTE_G2, true, 1);
    tier_ops old = *fake_tier_ops(extra);
    old.version = TIER_OPS_VERSION + 1;
    assert_int_equal(lower_add(s.r.kv, &old, fake_tier_of(extra)), KVCR_EINVAL);
    assert_int_equal(s.r.kv->n_tiers, 0);
    /* A second tier that takes spills: a block has one lower residency. */
    add(&s, "A", KVCR_TIER_G3, true, 2);
    assert_int_equal(lower_add(s.r.kv, fake_tier_ops(extra), fake_tier_of(extra)), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "'S' takes spills but 'A' already does"));
    assert_int_equal(s.r.kv->n_tiers, 1);
    fake_tier_free(extra);
    /* Up to KVCR_MAX_TIERS, then no more. */
    static const char *const names[] = {"B", "C", "D", "E", "F", "G", "H"};
    _Static_assert(KVCR_MAX_TIERS <= 8, "a name for every tier after A");
    for (uint32_t i = 1; i < KVCR_MAX_TIERS; i++)
        add(&s, names[i - 1], KVCR_TIER_REMOTE_G2, false, 1);
    extra = fake(&s, "X", KVCR_TIER_REMOTE_G2, false, 1);
    assert_int_equal(lower_add(s.r.kv, fake_tier_ops(extra), fake_tier_of(extra)), KVCR_ELIMIT);
    char want[128];
    snprintf(want, sizeof want, "tier 'X' does not fit: an instance keeps at most %d lower tiers "
                                "(KVCR_MAX_TIERS)", KVCR_MAX_TIERS);
    assert_string_equal(kvcr_last_error(), want);
    assert_int_equal(s.r.kv->n_tiers, KVCR_MAX_TIERS);
    assert_ptr_equal(s.r.kv->spill_tier, &s.r.kv->tiers[0]);
    fake_tier_free(extra);
    /* Adding calls no tier, refused or not; a read asks every added one. */
    assert_string_equal(s.trail.text, "");
    assert_int_equal(query(&s, "x").status, KVCR_QUERY_MISS);
    char trail[512] = "";
    static const char *const steps[] = {"begin", "holds", "end"};
    for (size_t k = 0; k < 3; k++)
        for (uint32_t i = 0; i < KVCR_MAX_TIERS; i++)
            snprintf(trail + strlen(trail), sizeof trail - strlen(trail), "%s%s.%s",
                     k + i ? " " : "", i ? names[i - 1] : "A", steps[k]);
    assert_string_equal(s.trail.text, trail);
    deposit_n(&s, 0, 5); /* the spill goes to A */
    assert_int_equal(rig_stat(&s.r, "fake_A_blocks", NULL), 1);
    rig_stop(&s.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_ask_the_tiers_in_order_and_close_runs_them_down),
        cmocka_unit_test(test_blocks_spill_into_the_third_tier_and_come_back_byte_exact),
        cmocka_unit_test(test_tenant_quotas_are_kept_per_tier),
        cmocka_unit_test(test_the_tier_table_refuses_what_does_not_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
