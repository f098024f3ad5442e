/* The limits of kvcr_limits that need no peer: their defaults and ranges
 * (each refused with a message naming it), hints over their size or count
 * (refused with KVCR_ELIMIT, nothing kept), operations refused while the
 * completion queue is full (and no completion lost), and the refusals
 * counted in telemetry. The peer limits are in test-remote-source-load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "peer.h"

#define BS 256

static void test_defaults_are_documented_values(void **state)
{
    (void)state;
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    assert_int_equal(cfg.limits.max_source_writes_per_peer, 64);
    assert_int_equal(cfg.limits.max_source_writes, 1024);
    assert_int_equal(cfg.limits.max_pin_requests, 1024);
    assert_int_equal(cfg.limits.max_control_message_bytes, KVCR_MAX_CONTROL_MESSAGE);
    assert_int_equal(cfg.limits.max_hint_bytes, 1u << 20);
    assert_int_equal(cfg.limits.max_hinted_requests, 65536);
    assert_int_equal(cfg.limits.max_unpolled_operations, 65536);
}

/* A rig with telemetry on and the given limit set (start it after any
 * other change). */
static void rig_limited(rig *r, size_t slots, size_t off, uint32_t value)
{
    rig_init(r, BS, slots, slots);
    r->cfg.enable_telemetry = true;
    memcpy((char *)&r->cfg.limits + off, &value, sizeof value);
}

/* Creates with one limit changed; the return code, and the message checked
 * to name the limit when refused. */
static int create_with(size_t off, uint32_t value, const char *name)
{
    rig r;
    rig_limited(&r, 4, off, value);
    int rc = kvcr_create(&r.cfg, &r.kv);
    if (rc != 0) {
        char want[64];
        snprintf(want, sizeof want, "limits.%s must be between", name);
        if (strstr(kvcr_last_error(), want) == NULL)
            fail_msg("%s = %u: message '%s' lacks '%s'", name, value, kvcr_last_error(), want);
        assert_null(r.kv);
    }
    rig_stop(&r);
    return rc;
}

static void test_each_limit_is_checked_at_both_ends(void **state)
{
    (void)state;
    static const struct {
        size_t off;
        const char *name;
        uint32_t lo, hi;
    } cases[] = {
        {offsetof(kvcr_limits, max_source_writes), "max_source_writes", 1, 1u << 20},
        {offsetof(kvcr_limits, max_pin_requests), "max_pin_requests", 1, 1u << 20},
        {offsetof(kvcr_limits, max_control_message_bytes), "max_control_message_bytes", 4096,
         KVCR_MAX_CONTROL_MESSAGE},
        {offsetof(kvcr_limits, max_hint_bytes), "max_hint_bytes", 64, KVCR_MAX_HINT_TEXT},
        {offsetof(kvcr_limits, max_hinted_requests), "max_hinted_requests", 1, 1u << 24},
        {offsetof(kvcr_limits, max_unpolled_operations), "max_unpolled_operations", 1, 1u << 24},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* max_source_writes of 1 is below the default per-peer limit (64):
         * that rule is tested apart. */
        if (strcmp(cases[i].name, "max_source_writes") != 0)
            assert_int_equal(create_with(cases[i].off, cases[i].lo, cases[i].name), 0);
        assert_int_equal(create_with(cases[i].off, cases[i].hi, cases[i].name), 0);
        assert_int_equal(create_with(cases[i].off, cases[i].hi + 1, cases[i].name), KVCR_EINVAL);
        assert_int_equal(create_with(cases[i].off, cases[i].lo - 1, cases[i].name), KVCR_EINVAL);
    }
}

static void test_per_peer_limit_must_fit_the_total(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 4, 4);
    r.cfg.limits.max_source_writes = 8;
    r.cfg.limits.max_source_writes_per_peer = 9;
    assert_int_equal(kvcr_create(&r.cfg, &r.kv), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "max_source_writes_per_peer must be between 1 and "
                                              "limits.max_source_writes (8) (got 9)"));
    r.cfg.limits.max_source_writes_per_peer = 0;
    assert_int_equal(kvcr_create(&r.cfg, &r.kv), KVCR_EINVAL);
    r.cfg.limits.max_source_writes_per_peer = 8;
    rig_start(&r);
    rig_stop(&r);
}

/* The value of kvcr_limit_refusals_total{limit} in a fresh snapshot (0: absent). */
static double refusals(rig *r, const char *limit)
{
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &s), 0);
    double v = 0;
    for (size_t i = 0; i < s->n_counters; i++)
        if (strcmp(s->counters[i].name, KVCR_LIMIT_REFUSALS_METRIC) == 0 &&
            strcmp(s->counters[i].operation, limit) == 0)
            v = s->counters[i].value;
    char *text;
    size_t len;
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    if (v > 0) { /* rendered with its own label */
        char line[128];
        snprintf(line, sizeof line, "kvcr_limit_refusals_total{limit=\"%s\"} %.0f\n", limit, v);
        assert_non_null(strstr(text, line));
    }
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    return v;
}

static bool kept(rig *r, const char *request)
{
    const char *source;
    size_t n;
    const uint64_t *hashes;
    bool failed;
    return kvcr__test_hint(r->kv, request, &source, &n, &hashes, &failed) != 0;
}

static int submit(rig *r, const char *request, size_t n_hashes)
{
    uint64_t hashes[64];
    for (size_t i = 0; i < n_hashes; i++) hashes[i] = 1000000 + i;
    char json[4096];
    peer_hint_json(json, sizeof json, "tcp://127.0.0.1:5555", hashes, n_hashes);
    return kvcr_submit_hint(r->kv, request, json, strlen(json));
}

static void test_hint_over_its_size_is_refused(void **state)
{
    (void)state;
    char json[4096];
    uint64_t hashes[4] = {1, 2, 3, 4};
    peer_hint_json(json, sizeof json, "tcp://127.0.0.1:5555", hashes, 4);
    rig r; /* exactly this hint fits */
    rig_limited(&r, 4, offsetof(kvcr_limits, max_hint_bytes), (uint32_t)strlen(json));
    rig_start(&r);
    assert_int_equal(kvcr_submit_hint(r.kv, "fits", json, strlen(json)), 0);
    assert_true(kept(&r, "fits"));
    assert_int_equal(submit(&r, "too-long", 5), KVCR_ELIMIT);
    assert_non_null(strstr(kvcr_last_error(), "over limits.max_hint_bytes"));
    assert_false(kept(&r, "too-long"));
    /* Only the length counts: even text that is not JSON is refused for it. */
    char big[512];
    memset(big, 'x', sizeof big);
    assert_int_equal(kvcr_submit_hint(r.kv, NULL, big, sizeof big), KVCR_ELIMIT);
    assert_int_equal(refusals(&r, "hint_bytes"), 2);
    rig_stop(&r);
}

static void test_hinted_requests_over_the_count_are_refused(void **state)
{
    (void)state;
    rig r;
    rig_limited(&r, 4, offsetof(kvcr_limits, max_hinted_requests), 2);
    rig_start(&r);
    assert_int_equal(submit(&r, "r1", 2), 0);
    assert_int_equal(submit(&r, "r2", 2), 0);
    assert_int_equal(submit(&r, "r3", 2), KVCR_ELIMIT);
    assert_non_null(strstr(kvcr_last_error(), "limits.max_hinted_requests (2)"));
    assert_false(kept(&r, "r3"));
    assert_int_equal(submit(&r, NULL, 2), 0); /* keeps nothing: always fine */
    assert_int_equal(submit(&r, "r1", 3), 0); /* a kept request is replaced */
    assert_int_equal(refusals(&r, "hinted_requests"), 1);
    assert_int_equal(rig_stat(&r, "hinted_requests", NULL), 2);
    assert_int_equal(kvcr_discard_hint(r.kv, "r1"), 0);
    assert_int_equal(submit(&r, "r3", 2), 0);
    assert_true(kept(&r, "r3"));
    rig_stop(&r);
}

static kvcr_op_handle deposit_one(rig *r, uint32_t i)
{
    char k[24];
    const char *keys[] = {peer_key(k, sizeof k, i)};
    size_t at[] = {i};
    rig_pattern(r, i, i);
    return rig_deposit(r, keys, at, 1, 0);
}

/* Pending and completed-but-uncollected operations together are bounded:
 * with one deposit still copying and one deliver completed at once (a miss)
 * but not collected, every new operation is refused; both completions then
 * arrive in full, and collecting them makes room. */
static void test_operations_wait_for_the_poll_not_lost(void **state)
{
    (void)state;
    rig r;
    rig_limited(&r, 8, offsetof(kvcr_limits, max_unpolled_operations), 2);
    rig_start(&r);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_QUEUED); /* the deposit stays pending */
    kvcr_op_handle a = deposit_one(&r, 0);
    const char *missing[] = {"missing"};
    size_t at[] = {5};
    kvcr_op_handle b = rig_deliver(&r, missing, at, 1); /* completes at once */
    assert_int_equal(rig_stat(&r, "in_flight_ops", NULL), 1);
    assert_int_equal(rig_stat(&r, "completed", NULL), 1);
    kvcr_op_handle op;
    char k[24];
    kvcr_key key = key_of(peer_key(k, sizeof k, 2));
    kvcr_mem_ref ref = {NULL, "", 2};
    kvcr_block blk = {key, &ref, 1};
    assert_int_equal(kvcr_deposit(r.kv, &blk, 1, 0, &op), KVCR_ELIMIT);
    assert_non_null(strstr(kvcr_last_error(), "limits.max_unpolled_operations (2) reached"));
    assert_int_equal(kvcr_deliver(r.kv, &blk, 1, NULL, &op), KVCR_ELIMIT);
    assert_int_equal(kvcr_fetch(r.kv, &key, 1, NULL, NULL, 0, &op), KVCR_ELIMIT);
    assert_int_equal(refusals(&r, "unpolled_operations"), 3);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    /* Both completions are there, in full. */
    kvcr_entry_status st;
    kvcr_reason why;
    assert_int_equal(rig_wait(&r, a, &st, NULL, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_wait(&r, b, &st, &why, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_NOT_FOUND);
    /* Collected: room again. */
    assert_int_equal(rig_wait(&r, deposit_one(&r, 2), &st, NULL, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_are_documented_values),
        cmocka_unit_test(test_each_limit_is_checked_at_both_ends),
        cmocka_unit_test(test_per_peer_limit_must_fit_the_total),
        cmocka_unit_test(test_hint_over_its_size_is_refused),
        cmocka_unit_test(test_hinted_requests_over_the_count_are_refused),
        cmocka_unit_test(test_operations_wait_for_the_poll_not_lost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
