/* Callbacks: inventory events batched per allocation, capacity_needed once
 * per crossing, and every failing callback or policy hook contained. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { BS = 256 };

static void test_commits_of_one_deposit_are_reported_in_key_order_once(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 8);
    rig_start(&r);
    const char *keys[] = {"k1", "k2", "k3", "k4"};
    size_t src[] = {0, 1, 2, 3};
    kvcr_entry_status st[4];
    rig_wait(&r, rig_deposit(&r, keys, src, 4, 0), st, NULL, NULL);
    /* Copies finish in any order and across polls; each event lists its
     * keys in request order and no key is reported twice. */
    assert_int_equal(r.inventory_added, 4);
    assert_true(r.inventory_calls >= 1 && r.inventory_calls <= 4);
    const char *log = r.inventory_log;
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(log, keys[i]);
        assert_non_null(at);
        assert_null(strstr(at + 1, keys[i]));
        /* The event holding keys[i]: from the space before it to the next. */
        const char *start = at, *end = strchr(at, ' ');
        while (start > log && start[-1] != ' ') start--;
        if (end == NULL) end = log + strlen(log);
        for (int j = i + 1; j < 4; j++) {
            const char *later = strstr(log, keys[j]);
            if (later >= start && later < end) assert_true(later > at);
        }
    }
    rig_stop(&r);
}

static void test_one_allocation_reports_its_victims_in_one_event(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 2);
    rig_start(&r);
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    /* A block of two slots in the one pool evicts both a and b at once. */
    kvcr_mem_ref refs[] = {{NULL, "", 2}, {NULL, "", 3}};
    kvcr_block wide = {key_of("wide"), refs, 2};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(r.kv, &wide, 1, 0, &op), 0);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_string_equal(r.inventory_log, "+:a +:b -:a,b +:wide");
    rig_stop(&r);
}

static void test_failing_sink_is_logged_and_work_goes_on(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 4);
    rig_start(&r);
    r.fail_callbacks = 1;
    assert_int_equal(rig_deposit1(&r, "a", 0, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(r.inventory_calls, 1);
    assert_string_equal(r.last_warning, "inventory sink failed (rc=-1); the event for 1 key(s) is lost");
    r.fail_callbacks = 0;
    assert_int_equal(rig_deposit1(&r, "b", 1, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(r.inventory_calls, 2);
    rig_stop(&r);
}

static void query_from_sink(rig *r, const kvcr_inventory_event *ev)
{
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r->kv, ev->keys, 1, NULL, &q), 0);
    assert_int_equal(q.status, ev->removed ? KVCR_QUERY_MISS : KVCR_QUERY_HIT);
}

static void test_sink_may_call_back_into_kvcr(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 1);
    r.on_event = query_from_sink;
    rig_start(&r);
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL); /* evicts a */
    assert_string_equal(r.inventory_log, "+:a -:a +:b");
    rig_stop(&r);
}

static void test_capacity_needed_fires_once_per_crossing(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 4);
    r.cfg.capacity_low_watermark_percent = 50; /* watermark: 2 slots */
    rig_start(&r);
    kvcr_release_handle h[4];
    rig_deposit1(&r, "a", 0, KVCR_NO_EVICT, NULL, &h[0]);
    rig_deposit1(&r, "b", 1, KVCR_NO_EVICT, NULL, &h[1]);
    assert_int_equal(r.capacity_calls, 0); /* 2 free: not below 2 */
    rig_deposit1(&r, "c", 2, KVCR_NO_EVICT, NULL, &h[2]);
    assert_int_equal(r.capacity_calls, 1);
    assert_int_equal(r.capacity_slots, 2);
    rig_deposit1(&r, "d", 3, KVCR_NO_EVICT, NULL, &h[3]);
    assert_int_equal(r.capacity_calls, 1); /* still below: silent */
    bool rel[2];
    assert_int_equal(kvcr_release(r.kv, h, 2, rel), 0); /* a, b evictable: 2 */
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
    kvcr_results_free(res);
    assert_int_equal(r.capacity_calls, 1);
    kvcr_key ka = key_of("a");
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, &ka, 1, NULL, NULL, 0, &op), 0); /* claim a again */
    rig_wait(&r, op, NULL, NULL, NULL);
    assert_int_equal(r.capacity_calls, 2); /* a new crossing */
    /* Back above (c released: a-claim, d held; b, c evictable + 0 free = 2)
     * then below again through a failing callback: logged, contained. */
    bool rel1;
    assert_int_equal(kvcr_release(r.kv, &h[2], 1, &rel1), 0);
    assert_true(rel1);
    r.fail_callbacks = 1;
    kvcr_key kb = key_of("b");
    assert_int_equal(kvcr_fetch(r.kv, &kb, 1, NULL, NULL, 0, &op), 0);
    rig_wait(&r, op, NULL, NULL, NULL);
    assert_int_equal(r.capacity_calls, 3);
    assert_string_equal(r.last_warning, "capacity_needed callback failed (rc=-1)");
    rig_stop(&r);
}

/* Policy hooks that fail or misbehave. */
typedef struct flaky {
    int fail_score, fail_ingest, fail_evict;
    kvcr_t *kv; /* to try re-entry */
    int reentry_rc;
} flaky;

static int f_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier s, bool req, kvcr_placement *out)
{
    flaky *f = ud;
    (void)m, (void)s, (void)req;
    if (f->kv) {
        kvcr_key k = key_of("x");
        kvcr_query_result q;
        f->reentry_rc = kvcr_query(f->kv, &k, 1, NULL, &q);
    }
    out->action = (kvcr_action)42; /* nonsense is sanitised to KEEP */
    return f->fail_ingest ? -1 : 0;
}

static int f_score(void *ud, const kvcr_block_meta *m, kvcr_tier s, double *out)
{
    flaky *f = ud;
    (void)m, (void)s;
    *out = 1.0;
    return f->fail_score ? -1 : 0;
}

static int f_evict(void *ud, const kvcr_block_meta *m, kvcr_tier s, kvcr_placement *out)
{
    flaky *f = ud;
    (void)m, (void)s;
    out->action = KVCR_ACTION_DROP;
    return f->fail_evict ? -1 : 0;
}

static const kvcr_policy_ops flaky_ops = {.version = KVCR_POLICY_VERSION, .name = "flaky",
                                          .decide_ingest = f_ingest, .eviction_score = f_score,
                                          .decide_eviction = f_evict};

static void test_failing_policy_hooks_are_contained(void **state)
{
    (void)state;
    flaky f = {0};
    rig r;
    rig_init(&r, BS, 8, 1);
    r.cfg.policy = &flaky_ops;
    r.cfg.policy_ud = &f;
    rig_start(&r);
    f.kv = r.kv;
    f.fail_ingest = 1;
    assert_int_equal(rig_deposit1(&r, "a", 0, 0, NULL, NULL), KVCR_ENTRY_SUCCESS); /* admitted anyway */
    assert_int_equal(f.reentry_rc, KVCR_EBUSY);
    f.kv = NULL;
    assert_string_equal(r.last_warning, "policy 'flaky' decide_ingest failed; admitting the block");
    f.fail_ingest = 0;
    /* A failing decide_eviction keeps the victim: no room. */
    f.fail_evict = 1;
    assert_int_equal(rig_deposit1(&r, "b", 1, 0, NULL, NULL), KVCR_ENTRY_FAILED);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_HIT);
    f.fail_evict = 0;
    assert_int_equal(rig_deposit1(&r, "b", 1, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    /* b was scored fine; now scoring fails for c: c is not evictable until a
     * later allocation scores it. */
    f.fail_score = 1;
    assert_int_equal(rig_deposit1(&r, "c", 2, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_non_null(strstr(r.last_warning, "eviction_score failed"));
    assert_int_equal(rig_deposit1(&r, "d", 3, 0, NULL, NULL), KVCR_ENTRY_FAILED);
    f.fail_score = 0;
    assert_int_equal(rig_deposit1(&r, "d", 3, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "c"), KVCR_QUERY_MISS);
    rig_stop(&r);
}

/* A log sink that calls back into the instance, as a framework's logging
 * bridge may: it must run with the instance lock released. */
typedef struct relog {
    rig *r;
    int lines, reentry_failures, dropped_notes;
    char first[256];
} relog;

static void reentrant_log(void *ud, kvcr_log_level level, const char *msg)
{
    relog *l = ud;
    (void)level;
    kvcr_key k = key_of("x");
    kvcr_query_result q;
    if (kvcr_query(l->r->kv, &k, 1, NULL, &q) != 0) l->reentry_failures++;
    if (l->lines++ == 0) snprintf(l->first, sizeof l->first, "%s", msg);
    if (strstr(msg, "log line(s) dropped")) l->dropped_notes++;
}

/* A started rig of fw_count framework blocks whose policy is f and whose
 * only callback is the reentrant log sink l (counting from now on). */
static void start_relog(rig *r, relog *l, flaky *f, size_t fw_count)
{
    rig_init(r, BS, fw_count, 8);
    *l = (relog){.r = r};
    r->cfg.policy = &flaky_ops;
    r->cfg.policy_ud = f;
    r->cfg.callbacks = (kvcr_callbacks){.ud = l, .log = reentrant_log};
    rig_start(r);
    l->lines = l->reentry_failures = 0; /* the start-up lines came before r->kv was set */
}

static void test_log_lines_written_under_the_lock_arrive_after_it_is_released(void **state)
{
    (void)state;
    flaky f = {.fail_ingest = 1};
    rig r;
    relog l;
    start_relog(&r, &l, &f, 8);
    /* decide_ingest fails inside the deposit, with the lock held: the line
     * reaches the sink once the deposit let go of it. */
    assert_int_equal(rig_deposit1(&r, "a", 0, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(l.lines >= 1);
    assert_non_null(strstr(l.first, "policy 'flaky' decide_ingest failed; admitting the block"));
    assert_int_equal(l.reentry_failures, 0);
    rig_stop(&r);
}

static void test_a_flood_of_log_lines_under_the_lock_is_bounded_and_counted(void **state)
{
    (void)state;
    enum { N = 1100 }; /* one failing hook a block, all in one locked call */
    flaky f = {.fail_ingest = 1};
    rig r;
    relog l;
    start_relog(&r, &l, &f, N);
    static char names[N][8];
    const char *keys[N];
    size_t idx[N];
    for (size_t i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "k%zu", i);
        keys[i] = names[i];
        idx[i] = i;
    }
    rig_deposit(&r, keys, idx, N, 0);
    /* Every line of the call was delivered before it returned: at most the
     * queue's bound of them, then one line counting the rest. */
    assert_int_equal(l.dropped_notes, 1);
    assert_true(l.lines > 1000 && l.lines <= 1025);
    assert_int_equal(l.reentry_failures, 0);
    rig_pump(&r);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commits_of_one_deposit_are_reported_in_key_order_once),
        cmocka_unit_test(test_one_allocation_reports_its_victims_in_one_event),
        cmocka_unit_test(test_failing_sink_is_logged_and_work_goes_on),
        cmocka_unit_test(test_sink_may_call_back_into_kvcr),
        cmocka_unit_test(test_capacity_needed_fires_once_per_crossing),
        cmocka_unit_test(test_failing_policy_hooks_are_contained),
        cmocka_unit_test(test_log_lines_written_under_the_lock_arrive_after_it_is_released),
        cmocka_unit_test(test_a_flood_of_log_lines_under_the_lock_is_bounded_and_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
