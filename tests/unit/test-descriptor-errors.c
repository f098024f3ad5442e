/* Bad descriptors are refused whole, with a message, and change nothing. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { BS = 1024 };

static void expect_refusal(rig *r, const kvcr_mem_ref *ref, size_t n_refs, const char *msg_part)
{
    kvcr_block b = {key_of("good"), NULL, 0};
    kvcr_mem_ref ok = {NULL, "", 0};
    kvcr_block pair[2] = {{key_of("good"), &ok, 1}, {key_of("bad"), ref, n_refs}};
    kvcr_op_handle op = 77;
    for (int deliver = 0; deliver < 2; deliver++) {
        int rc = deliver ? kvcr_deliver(r->kv, pair, 2, NULL, &op)
                         : kvcr_deposit(r->kv, pair, 2, 0, &op);
        assert_int_equal(rc, KVCR_EINVAL);
        if (strstr(kvcr_last_error(), msg_part) == NULL)
            fail_msg("message '%s' lacks '%s'", kvcr_last_error(), msg_part);
        assert_int_equal(op, 77);
    }
    /* Even the good block of the batch was not stored. */
    assert_int_equal(rig_query(r, "good"), KVCR_QUERY_MISS);
    (void)b;
}

static void test_unknown_label_out_of_range_index_and_foreign_end_point(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 4, 4);
    rig_start(&r);
    kvcr_mem_ref unknown = {NULL, "kv-cache", 0};
    expect_refusal(&r, &unknown, 1, "no framework region is labelled 'kv-cache'");
    kvcr_mem_ref far = {NULL, "", 4};
    expect_refusal(&r, &far, 1, "index 4 is out of range for region '' (count 4)");
    kvcr_mem_ref foreign = {"someone-else", "", 0};
    expect_refusal(&r, &foreign, 1, "end point 'someone-else' is not this instance ('test')");
    kvcr_mem_ref own = {"test", "", 1};
    expect_refusal(&r, &own, 0, "each block requires at least one descriptor");
    rig_stop(&r);
}

static void test_wrong_size_and_mixed_devices(void **state)
{
    (void)state;
    enum { N = 4 };
    uint8_t *pool = aligned_alloc(64, N * BS), *fw = aligned_alloc(64, 4 * N * BS);
    kvcr_pool_layout layouts[] = {{"a", BS}, {"b", BS}};
    kvcr_dram_pool pools[] = {{"a", pool, N / 2 * BS}, {"b", pool + N / 2 * BS, N / 2 * BS}};
    kvcr_region regions[] = {
        {.addr = fw, .element_size = BS, .count = N, .label = "a"},
        {.addr = fw + N * BS, .element_size = 2 * BS, .count = N, .label = "b"}, /* wrong size */
    };
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = "d";
    cfg.pool_layouts = layouts;
    cfg.n_pool_layouts = 2;
    cfg.local_dram = pools;
    cfg.n_local_dram = 2;
    cfg.framework_regions = regions;
    cfg.n_framework_regions = 2;
    rig r = {0};
    assert_int_equal(kvcr_create(&cfg, &r.kv), 0);
    kvcr_mem_ref ref = {NULL, "b", 0};
    kvcr_block b = {key_of("k"), &ref, 1};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(r.kv, &b, 1, 0, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(),
                        "block descriptor has the wrong byte count: region 'b' elements are 2048 "
                        "bytes, pool 'b' blocks 1024");
    kvcr_free(r.kv);

    /* The same label on another device: a block must not mix them. */
    regions[1] = (kvcr_region){.addr = fw + N * BS, .element_size = BS, .count = N, .label = "b",
                               .device_id = 1};
    assert_int_equal(kvcr_create(&cfg, &r.kv), 0);
    kvcr_mem_ref mixed[] = {{NULL, "a", 0}, {NULL, "b", 0}};
    kvcr_block bm = {key_of("k"), mixed, 2};
    assert_int_equal(kvcr_deposit(r.kv, &bm, 1, 0, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "block descriptors must share one memory type and device");
    kvcr_free(r.kv);
    free(pool);
    free(fw);
}

static void test_bad_keys_and_flags(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 1, 1);
    rig_start(&r);
    kvcr_mem_ref ref = {NULL, "", 0};
    uint8_t big[KVCR_KEY_MAX + 1] = {0};
    kvcr_block bad[] = {{{NULL, 1}, &ref, 1}, {{big, 0}, &ref, 1}, {{big, sizeof big}, &ref, 1}};
    kvcr_op_handle op;
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(kvcr_deposit(r.kv, &bad[i], 1, 0, &op), KVCR_EINVAL);
        assert_string_equal(kvcr_last_error(), "key 0 must have 1 to 1024 bytes and non-NULL data");
        kvcr_query_result q;
        assert_int_equal(kvcr_query(r.kv, &bad[i].key, 1, NULL, &q), KVCR_EINVAL);
        assert_int_equal(kvcr_fetch(r.kv, &bad[i].key, 1, NULL, NULL, 0, &op), KVCR_EINVAL);
    }
    kvcr_block good = {key_of("k"), &ref, 1};
    assert_int_equal(kvcr_deposit(r.kv, &good, 1, 0x8, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "unknown deposit flags 0x8");
    assert_int_equal(kvcr_deposit(r.kv, &good, 1, 0, NULL), KVCR_EINVAL);
    assert_int_equal(kvcr_deposit(r.kv, NULL, 1, 0, &op), KVCR_EINVAL);
    /* A key of the maximum length works end to end. */
    memset(big, 'z', KVCR_KEY_MAX);
    kvcr_block longest = {{big, KVCR_KEY_MAX}, &ref, 1};
    assert_int_equal(kvcr_deposit(r.kv, &longest, 1, 0, &op), 0);
    kvcr_entry_status st;
    rig_wait(&r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r.kv, &longest.key, 1, NULL, &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_HIT);
    assert_int_equal(q.tier, KVCR_TIER_LOCAL_G2);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_label_out_of_range_index_and_foreign_end_point),
        cmocka_unit_test(test_wrong_size_and_mixed_devices),
        cmocka_unit_test(test_bad_keys_and_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
