/* Deadlines, abort and close: copies that have not started are cancelled
 * and their slots freed; copies already running are waited for, never
 * abandoned while they may still write. */
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { BS = 4096 };

enum { DEADLINE_MS = 20 };
#define MS 1000000ull

static void start_rig(rig *r, uint32_t timeout_ms, uint32_t threads)
{
    rig_init(r, BS, 8, 4);
    r->cfg.operation_timeout_ms = timeout_ms;
    r->cfg.abandon_timeout_ms = 2 * timeout_ms;
    r->cfg.copy_threads = threads;
    rig_start(r);
}

/* Waits (bounded) until n copies are RUNNING on the copy threads. */
static void wait_running(rig *r, uint32_t n)
{
    for (int i = 0; i < 5000 && kvcr__test_running_copies(r->kv) < n; i++) usleep(1000);
    assert_int_equal(kvcr__test_running_copies(r->kv), n);
}

/* Deposits (or delivers) n <= 4 keys from (or into) framework blocks at;
 * every entry succeeds. The deadline tests freeze the clock (kvcr/testing.h):
 * however slowly the machine starts a copy, it cannot miss its deadline. */
static void all_succeed(rig *r, bool deliver, const char *const *keys, const size_t *at, size_t n)
{
    kvcr_entry_status st[4];
    assert_true(n <= 4);
    assert_int_equal(rig_wait(r, deliver ? rig_deliver(r, keys, at, n) : rig_deposit(r, keys, at, n, 0),
                              st, NULL, NULL),
                     n);
    for (size_t i = 0; i < n; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
}

static void test_deposit_queued_past_its_deadline_fails_and_frees_slots(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, DEADLINE_MS, 1);
    kvcr__test_clock_freeze();
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_QUEUED);
    const char *keys[] = {"a", "b"};
    size_t src[] = {0, 1};
    kvcr_op_handle op = rig_deposit(&r, keys, src, 2, 0);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_FETCHING);
    /* Just before the deadline nothing expires. */
    kvcr__test_clock_advance(DEADLINE_MS * MS - 1);
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
    assert_int_equal(n, 0);
    kvcr_results_free(res);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_FETCHING);
    /* At it, both entries do. */
    kvcr__test_clock_advance(1);
    rig_wait_all_failed(&r, op, 2, KVCR_REASON_TIMEOUT);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_MISS);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    /* All four slots are free again: no NO_CAPACITY, nothing evicted. */
    const char *more[] = {"c", "d", "e", "f"};
    size_t idx[] = {2, 3, 4, 5};
    all_succeed(&r, false, more, idx, 4);
    assert_int_equal(r.inventory_removed, 0);
    kvcr__test_clock_run();
    rig_stop(&r);
}

static void test_deposit_running_at_its_deadline_completes_with_the_bytes(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, DEADLINE_MS, 1);
    kvcr__test_clock_freeze();
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_RUNNING);
    rig_pattern(&r, 0, 77);
    const char *keys[] = {"slow"};
    size_t src[] = {0};
    kvcr_op_handle op = rig_deposit(&r, keys, src, 1, 0);
    wait_running(&r, 1);
    kvcr__test_clock_advance(2 * DEADLINE_MS * MS);
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r.kv, &res, &n), 0); /* past the deadline */
    assert_int_equal(n, 0);                          /* but the copy is running */
    kvcr_results_free(res);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    const char *d[] = {"slow"};
    size_t dst[] = {5};
    all_succeed(&r, true, d, dst, 1);
    assert_true(rig_has_pattern(&r, r.fw + 5 * BS, 77));
    kvcr__test_clock_run();
    rig_stop(&r);
}

static void test_fetch_waiting_on_a_fill_times_out(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, DEADLINE_MS, 1);
    kvcr__test_clock_freeze();
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_QUEUED);
    const char *keys[] = {"f"};
    size_t src[] = {0};
    kvcr_op_handle dep = rig_deposit(&r, keys, src, 1, 0);
    kvcr_key k = key_of("f");
    kvcr_op_handle fop;
    assert_int_equal(kvcr_fetch(r.kv, &k, 1, NULL, NULL, 0, &fop), 0);
    kvcr__test_clock_advance(2 * DEADLINE_MS * MS);
    /* Both expire; the fill had not started, so it is cancelled. */
    kvcr_entry_status st;
    kvcr_reason why;
    rig_wait(&r, fop, &st, &why, NULL);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_TIMEOUT);
    rig_wait(&r, dep, &st, &why, NULL);
    assert_int_equal(why, KVCR_REASON_TIMEOUT);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    kvcr__test_clock_run();
    rig_stop(&r);
}

/* The test clock moves by exactly what a test advances it by, and running
 * again it goes on from there, never back. */
static void test_the_test_clock_never_goes_back(void **state)
{
    (void)state;
    uint64_t t = kvcr__test_clock_freeze();
    assert_int_equal(kvcr__test_clock_advance(DEADLINE_MS * MS), t + DEADLINE_MS * MS);
    assert_int_equal(kvcr__test_clock_freeze(), t + DEADLINE_MS * MS);
    kvcr__test_clock_run();
    uint64_t later = kvcr__test_clock_advance(1);
    assert_true(later > t + DEADLINE_MS * MS);
    assert_true(kvcr__test_clock_freeze() >= later);
    kvcr__test_clock_run();
}

static void test_abort_of_whole_op_and_of_single_keys(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, 5000, 1);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_QUEUED);
    const char *keys[] = {"a", "b", "c"};
    size_t src[] = {0, 1, 2};
    for (int i = 0; i < 3; i++) rig_pattern(&r, (size_t)i, (uint32_t)i + 1);
    kvcr_op_handle op = rig_deposit(&r, keys, src, 3, 0);
    kvcr_key kb = key_of("b"), unknown = key_of("zz");
    size_t aborted = 99;
    assert_int_equal(kvcr_abort(r.kv, op, &unknown, 1, &aborted), 0);
    assert_int_equal(aborted, 0);
    assert_int_equal(kvcr_abort(r.kv, op, &kb, 1, &aborted), 0);
    assert_int_equal(aborted, 1);
    assert_int_equal(rig_query(&r, "b"), KVCR_QUERY_MISS);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    kvcr_entry_status st[3];
    kvcr_reason why[3];
    rig_wait(&r, op, st, why, NULL);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[1], KVCR_ENTRY_FAILED);
    assert_int_equal(why[1], KVCR_REASON_ABORTED);
    assert_int_equal(st[2], KVCR_ENTRY_SUCCESS);
    assert_int_equal(kvcr_abort(r.kv, op, NULL, 0, &aborted), KVCR_ENOENT);

    /* A whole deliver, held before copying. */
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_QUEUED);
    const char *d[] = {"a", "c"};
    size_t dst[] = {6, 7};
    memset(r.fw + 6 * BS, 0, 2 * BS);
    kvcr_op_handle dop = rig_deliver(&r, d, dst, 2);
    assert_int_equal(kvcr_abort(r.kv, dop, NULL, 0, &aborted), 0);
    assert_int_equal(aborted, 2);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    rig_wait(&r, dop, st, why, NULL);
    assert_int_equal(why[0], KVCR_REASON_ABORTED);
    assert_int_equal(why[1], KVCR_REASON_ABORTED);
    uint8_t zero[2 * BS] = {0};
    assert_memory_equal(r.fw + 6 * BS, zero, 2 * BS); /* nothing was written */
    /* The delivered blocks' internal claims were dropped: they can go. */
    const char *fill[] = {"w", "x", "y", "z"};
    size_t fi[] = {0, 1, 2, 3};
    kvcr_entry_status st4[4];
    rig_wait(&r, rig_deposit(&r, fill, fi, 4, 0), st4, NULL, NULL);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_MISS);
    rig_stop(&r);
}

static void test_running_copy_cannot_be_aborted(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, 5000, 1);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_RUNNING);
    const char *keys[] = {"r"};
    size_t src[] = {0};
    rig_pattern(&r, 0, 3);
    kvcr_op_handle op = rig_deposit(&r, keys, src, 1, 0);
    wait_running(&r, 1);
    size_t aborted = 99;
    assert_int_equal(kvcr_abort(r.kv, op, NULL, 0, &aborted), 0);
    assert_int_equal(aborted, 0);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_OPEN);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    rig_stop(&r);
}

static void test_close_with_work_in_flight_drains_and_returns(void **state)
{
    (void)state;
    rig r;
    start_rig(&r, 5000, 2);
    const char *keys[] = {"a", "b", "c", "d"};
    size_t src[] = {0, 1, 2, 3};
    rig_wait(&r, rig_deposit(&r, keys, src, 2, 0), NULL, NULL, NULL);
    kvcr__test_copy_gate(r.kv, KVCR_TEST_GATE_HOLD_RUNNING);
    kvcr_op_handle op1 = rig_deliver(&r, keys, src + 2, 2); /* both running */
    wait_running(&r, 2);
    kvcr_op_handle op2 = rig_deposit(&r, keys + 2, src + 2, 2, 0); /* queued */
    (void)op1, (void)op2;
    /* The gate is released by close itself: running copies must finish. */
    assert_int_equal(kvcr_close(r.kv), 0);
    assert_int_equal(kvcr__test_running_copies(r.kv), 0);
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r.kv, &res, &n), KVCR_ECLOSED);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_test_clock_never_goes_back),
        cmocka_unit_test(test_deposit_queued_past_its_deadline_fails_and_frees_slots),
        cmocka_unit_test(test_deposit_running_at_its_deadline_completes_with_the_bytes),
        cmocka_unit_test(test_fetch_waiting_on_a_fill_times_out),
        cmocka_unit_test(test_abort_of_whole_op_and_of_single_keys),
        cmocka_unit_test(test_running_copy_cannot_be_aborted),
        cmocka_unit_test(test_close_with_work_in_flight_drains_and_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
