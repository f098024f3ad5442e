/* Bytes survive every round trip: deposit -> query -> fetch -> deliver. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BS 4096

static void test_deposit_then_deliver_copies_exact_bytes(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 8, 4);
    rig_start(&r);
    const char *keys[] = {"a", "b", "c", "d"};
    size_t src[] = {0, 1, 2, 3}, dst[] = {4, 5, 6, 7};
    for (size_t i = 0; i < 4; i++) rig_pattern(&r, i, (uint32_t)i + 10);
    kvcr_entry_status st[4];
    assert_int_equal(rig_wait(&r, rig_deposit(&r, keys, src, 4, 0), st, NULL, NULL), 4);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        assert_int_equal(rig_query(&r, keys[i]), KVCR_QUERY_HIT);
    }
    /* Scribble over the sources: deliver must come from KVCR's copy. */
    memset(r.fw, 0, 4 * BS);
    assert_int_equal(rig_wait(&r, rig_deliver(&r, keys, dst, 4), st, NULL, NULL), 4);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&r, r.fw + dst[i] * BS, (uint32_t)i + 10));
    }
    rig_stop(&r);
}

static void test_fetch_returns_claimed_slots_holding_the_bytes(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 2, 2);
    rig_start(&r);
    const char *keys[] = {"x", "y"};
    size_t src[] = {0, 1};
    rig_pattern(&r, 0, 1);
    rig_pattern(&r, 1, 2);
    rig_wait(&r, rig_deposit(&r, keys, src, 2, 0), NULL, NULL, NULL);

    /* Duplicate keys in a fetch are answered once, first occurrence order. */
    kvcr_key fk[] = {key_of("y"), key_of("x"), key_of("y"), key_of("nope")};
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, fk, 4, NULL, NULL, 0, &op), 0);
    kvcr_op_result *res = NULL;
    size_t n = 0;
    for (int tries = 0; n == 0 && tries < 10000; tries++) {
        assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
        if (n == 0) kvcr_results_free(res);
    }
    assert_int_equal(n, 1);
    assert_int_equal(res[0].op, op);
    assert_int_equal(res[0].n_entries, 3);
    const kvcr_entry_result *e = res[0].entries;
    assert_memory_equal(e[0].key.data, "y", 1);
    assert_memory_equal(e[1].key.data, "x", 1);
    assert_int_equal(e[0].status, KVCR_ENTRY_SUCCESS);
    assert_int_equal(e[1].status, KVCR_ENTRY_SUCCESS);
    assert_int_equal(e[2].status, KVCR_ENTRY_FAILED);
    assert_int_equal(e[2].reason, KVCR_REASON_NOT_FOUND);
    assert_int_equal(e[2].release_handle, 0);
    assert_int_equal(e[0].n_slots, 1);
    assert_int_equal(e[0].slots[0].size, BS);
    assert_true(rig_has_pattern(&r, e[0].slots[0].addr, 2));
    assert_true(rig_has_pattern(&r, e[1].slots[0].addr, 1));
    assert_ptr_equal(e[0].slots[0].addr, r.dram + e[0].slots[0].slot * BS);
    kvcr_release_handle h[3] = {e[0].release_handle, e[1].release_handle, e[0].release_handle};
    assert_true(h[0] != 0 && h[1] != 0 && h[0] != h[1]);
    kvcr_results_free(res);

    bool released[3];
    assert_int_equal(kvcr_release(r.kv, h, 3, released), 0);
    assert_true(released[0]);
    assert_true(released[1]);
    assert_false(released[2]); /* the same handle twice */
    kvcr_release_handle bogus = 987654;
    assert_int_equal(kvcr_release(r.kv, &bogus, 1, released), 0);
    assert_false(released[0]);
    rig_stop(&r);
}

static void test_batch_with_duplicate_keys_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 2, 2);
    rig_start(&r);
    const char *keys[] = {"same", "same"};
    size_t src[] = {0, 1};
    kvcr_mem_ref refs[2] = {{NULL, "", 0}, {NULL, "", 1}};
    kvcr_block b[2] = {{key_of(keys[0]), &refs[0], 1}, {key_of(keys[1]), &refs[1], 1}};
    kvcr_op_handle op = 42;
    assert_int_equal(kvcr_deposit(r.kv, b, 2, 0, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "a batch must not name the same key twice");
    assert_int_equal(kvcr_deliver(r.kv, b, 2, NULL, &op), KVCR_EINVAL);
    assert_int_equal(op, 42);
    assert_int_equal(rig_query(&r, "same"), KVCR_QUERY_MISS);
    (void)src;
    rig_stop(&r);
}

static void test_empty_batches_complete_with_no_entries(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 1, 1);
    rig_start(&r);
    kvcr_op_handle a, b, c;
    assert_int_equal(kvcr_deposit(r.kv, NULL, 0, 0, &a), 0);
    assert_int_equal(kvcr_deliver(r.kv, NULL, 0, NULL, &b), 0);
    assert_int_equal(kvcr_fetch(r.kv, NULL, 0, NULL, NULL, 0, &c), 0);
    assert_true(a < b && b < c);
    assert_int_equal(rig_wait(&r, a, NULL, NULL, NULL), 0);
    assert_int_equal(rig_wait(&r, b, NULL, NULL, NULL), 0);
    assert_int_equal(rig_wait(&r, c, NULL, NULL, NULL), 0);
    rig_stop(&r);
}

static void test_redeposit_of_ready_key_succeeds_without_copy_or_event(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 2, 2);
    rig_start(&r);
    const char *k[] = {"k"};
    size_t s0[] = {0}, s1[] = {1};
    rig_pattern(&r, 0, 5);
    rig_pattern(&r, 1, 6);
    kvcr_entry_status st;
    rig_wait(&r, rig_deposit(&r, k, s0, 1, 0), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_int_equal(r.inventory_added, 1);
    kvcr_release_handle h;
    rig_wait(&r, rig_deposit(&r, k, s1, 1, KVCR_NO_EVICT), &st, NULL, &h);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(h != 0);
    assert_int_equal(r.inventory_added, 1);
    /* The first bytes stayed: a READY block is never overwritten. */
    const char *d[] = {"k"};
    size_t dst[] = {1};
    rig_wait(&r, rig_deliver(&r, d, dst, 1), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, r.fw + BS, 5));
    bool rel;
    assert_int_equal(kvcr_release(r.kv, &h, 1, &rel), 0);
    assert_true(rel);
    rig_stop(&r);
}

static void test_failed_copy_frees_the_slot_and_reports_transfer_error(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 1, 1);
    rig_start(&r);
    const char *k[] = {"f"};
    size_t s[] = {0};
    kvcr__test_fail_copies(r.kv, 1);
    kvcr_entry_status st;
    kvcr_reason why;
    rig_wait(&r, rig_deposit(&r, k, s, 1, 0), &st, &why, NULL);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_TRANSFER_ERROR);
    assert_int_equal(rig_query(&r, "f"), KVCR_QUERY_MISS);
    assert_int_equal(r.inventory_added, 0);
    /* The only slot is free again. */
    rig_pattern(&r, 0, 9);
    rig_wait(&r, rig_deposit(&r, k, s, 1, 0), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    rig_stop(&r);
}

/* K and V in separate pools: one block spans one slot in each. */
static void test_block_spanning_two_pools_round_trips_and_checks_layout(void **state)
{
    (void)state;
    enum { KB = 4096, VB = 8192 };
    uint8_t *kmem = aligned_alloc(64, 2 * KB), *vmem = aligned_alloc(64, 2 * VB);
    uint8_t *fk = aligned_alloc(64, 2 * KB), *fv = aligned_alloc(64, 2 * VB);
    fill_pattern(fk, KB, 1);
    fill_pattern(fv, VB, 2);
    memset(fk + KB, 0, KB);
    memset(fv + VB, 0, VB);
    kvcr_pool_layout layouts[] = {{"k", KB}, {"v", VB}};
    kvcr_dram_pool pools[] = {{"k", kmem, 2 * KB}, {"v", vmem, 2 * VB}};
    kvcr_region regions[] = {{.addr = fk, .element_size = KB, .count = 2, .label = "k"},
                             {.addr = fv, .element_size = VB, .count = 2, .label = "v"}};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = "kv";
    cfg.pool_layouts = layouts;
    cfg.n_pool_layouts = 2;
    cfg.local_dram = pools;
    cfg.n_local_dram = 2;
    cfg.framework_regions = regions;
    cfg.n_framework_regions = 2;
    kvcr_t *kv;
    assert_int_equal(kvcr_create(&cfg, &kv), 0);
    rig r = {.kv = kv};

    kvcr_mem_ref src[] = {{"kv", "k", 0}, {NULL, "v", 0}};
    kvcr_block b = {key_of("blk"), src, 2};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(kv, &b, 1, 0, &op), 0);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);

    /* Deliver with the layout in the wrong order fails cleanly. */
    kvcr_mem_ref swapped[] = {{NULL, "v", 1}, {NULL, "k", 1}};
    kvcr_block bs = {key_of("blk"), swapped, 2};
    kvcr_reason why;
    assert_int_equal(kvcr_deliver(kv, &bs, 1, NULL, &op), 0);
    rig_wait(&r, op, &st, &why, NULL);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_LAYOUT_MISMATCH);

    kvcr_mem_ref dst[] = {{NULL, "k", 1}, {NULL, "v", 1}};
    kvcr_block bd = {key_of("blk"), dst, 2};
    assert_int_equal(kvcr_deliver(kv, &bd, 1, NULL, &op), 0);
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_memory_equal(fk, fk + KB, KB);
    assert_memory_equal(fv, fv + VB, VB);

    const char *want[] = {"k", "v"}, *wrong[] = {"k"};
    kvcr_key key = key_of("blk");
    assert_int_equal(kvcr_fetch(kv, &key, 1, NULL, wrong, 1, &op), 0);
    rig_wait(&r, op, &st, &why, NULL);
    assert_int_equal(why, KVCR_REASON_LAYOUT_MISMATCH);
    kvcr_release_handle h;
    assert_int_equal(kvcr_fetch(kv, &key, 1, NULL, want, 2, &op), 0);
    rig_wait(&r, op, &st, NULL, &h);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    const char *bad[] = {"k", "nope"};
    assert_int_equal(kvcr_fetch(kv, &key, 1, NULL, bad, 2, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "expected layout must use configured pools");
    /* The default layout [""] does not exist with named pools. */
    assert_int_equal(kvcr_fetch(kv, &key, 1, NULL, NULL, 0, &op), KVCR_EINVAL);
    bool rel;
    kvcr_release(kv, &h, 1, &rel);
    assert_true(rel);
    kvcr_free(kv);
    free(r.stash);
    free(kmem), free(vmem), free(fk), free(fv);
}

static bool fd_readable(int fd, int timeout_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

static void test_event_fd_is_readable_exactly_while_results_wait(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 1, 1);
    rig_start(&r);
    int fd = kvcr_fd(r.kv);
    assert_true(fd >= 0);
    assert_false(fd_readable(fd, 0));
    const char *k[] = {"k"};
    size_t s[] = {0};
    kvcr_op_handle op = rig_deposit(&r, k, s, 1, 0);
    assert_true(fd_readable(fd, 10000)); /* bounded wait for the copy */
    /* The first poll may catch the copy mid-way; keep polling until the
     * result arrives, then the fd must be quiet. */
    rig_wait(&r, op, NULL, NULL, NULL);
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
    kvcr_results_free(res);
    assert_false(fd_readable(fd, 0));
    assert_int_equal(kvcr_fd(NULL), KVCR_EINVAL);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deposit_then_deliver_copies_exact_bytes),
        cmocka_unit_test(test_fetch_returns_claimed_slots_holding_the_bytes),
        cmocka_unit_test(test_batch_with_duplicate_keys_is_refused_and_changes_nothing),
        cmocka_unit_test(test_empty_batches_complete_with_no_entries),
        cmocka_unit_test(test_redeposit_of_ready_key_succeeds_without_copy_or_event),
        cmocka_unit_test(test_failed_copy_frees_the_slot_and_reports_transfer_error),
        cmocka_unit_test(test_block_spanning_two_pools_round_trips_and_checks_layout),
        cmocka_unit_test(test_event_fd_is_readable_exactly_while_results_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
