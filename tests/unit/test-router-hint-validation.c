/* Router hints: the envelope's rules one by one, strict JSON, exact u64
 * hashes, and the request-scoped state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define ENV(payload)                                                                      \
    "{\"protocol_version\":\"0.1\",\"message_id\":\"m\",\"actions\":[{\"action_id\":\"a\"," \
    "\"action_type\":\"kv.fetch\",\"action_version\":\"1.0\",\"payload\":" payload "}]}"
#define SRC "\"source_control_endpoint\":\"tcp://127.0.0.1:5000\""

static int submit(rig *r, const char *rid, const char *json)
{
    return kvcr_submit_hint(r->kv, rid, json, strlen(json));
}

static void test_each_envelope_rule_refuses_with_its_message(void **state)
{
    (void)state;
    static const struct { const char *json, *message; } bad[] = {
        {"[]", "invalid router hint"},
        {"{\"actions\":{}}", "invalid router hint"},
        {"{\"actions\":[]}", "invalid router hint"},
        {"{\"actions\":[1,\"x\",{\"action_type\":\"other\"}]}", "invalid router hint"},
        {ENV("[]"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[1],\"no_retain\":false}"), "no_retain is not currently supported"},
        {ENV("{" SRC ",\"block_hashes\":[1],\"mode\":\"move\"}"), "only copy mode is currently supported"},
        {ENV("{\"block_hashes\":[1]}"), "source-less hints are not currently supported"},
        {ENV("{\"source_control_endpoint\":null,\"block_hashes\":[1]}"), "source-less hints are not currently supported"},
        {ENV("{\"source_control_endpoint\":\"\",\"block_hashes\":[1]}"), "invalid router hint"},
        {ENV("{\"source_control_endpoint\":7,\"block_hashes\":[1]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":{}}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[true]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[-1]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[1.0]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[1e3]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[18446744073709551616]}"), "invalid router hint"},
        {ENV("{" SRC ",\"block_hashes\":[\"1\"]}"), "invalid router hint"},
    };
    rig r;
    rig_init(&r, 64, 1, 1);
    rig_start(&r);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = submit(&r, "req", bad[i].json);
        if (rc != KVCR_EINVAL || strcmp(kvcr_last_error(), bad[i].message) != 0)
            fail_msg("case %zu: rc %d '%s', want '%s'", i, rc, kvcr_last_error(), bad[i].message);
        const char *src;
        size_t n;
        const uint64_t *h;
        bool failed;
        assert_int_equal(kvcr__test_hint(r.kv, "req", &src, &n, &h, &failed), 0);
    }
    rig_stop(&r);
}

static void test_strict_json_is_required(void **state)
{
    (void)state;
    static const char *bad[] = {
        ENV("{" SRC ",\"block_hashes\":[1]}") " x",                    /* trailing data */
        ENV("{" SRC ",\"block_hashes\":[1],\"block_hashes\":[2]}"),    /* duplicate key */
        ENV("{" SRC ",\"block_hashes\":[01]}"),                        /* leading zero */
        ENV("{" SRC ",\"block_hashes\":[1,]}"),                        /* trailing comma */
        ENV("{\"source_control_endpoint\":\"a\\qb\",\"block_hashes\":[1]}"),   /* bad escape */
        ENV("{\"source_control_endpoint\":\"\\udc00\",\"block_hashes\":[1]}"), /* lone surrogate */
        ENV("{\"source_control_endpoint\":\"a\\u0000b\",\"block_hashes\":[1]}"), /* NUL in source */
        "{\"actions\":[\"\xff\"]}",                                    /* invalid UTF-8 */
        "{\"actions\":[\"a\tb\"]}",                                    /* raw control char */
        "{\"actions\":[",                                              /* truncated */
        "",
    };
    rig r;
    rig_init(&r, 64, 1, 1);
    rig_start(&r);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (submit(&r, "req", bad[i]) != KVCR_EINVAL) fail_msg("case %zu was accepted", i);
    /* Nesting is bounded. */
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 99);
    deep[199] = 0;
    assert_int_equal(submit(&r, "req", deep), KVCR_EINVAL);
    assert_int_equal(kvcr_submit_hint(r.kv, "req", NULL, 0), KVCR_EINVAL);
    assert_int_equal(kvcr_discard_hint(r.kv, NULL), KVCR_EINVAL);
    rig_stop(&r);
}

static void test_hashes_are_exact_u64_deduplicated_and_scoped_per_request(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, 64, 1, 1);
    rig_start(&r);
    /* Extra keys and other actions are ignored; the first kv.fetch wins;
     * unicode escapes decode. */
    const char *json =
        "{\"protocol_version\":\"0.1\",\"extra\":{\"x\":[null,true]},\"actions\":["
        "{\"action_type\":\"kv.other\"},"
        "{\"action_type\":\"kv.fetch\",\"action_version\":\"1.0\",\"payload\":{"
        "\"source_control_endpoint\":\"tcp://h\\u00e9:1\",\"mode\":\"copy\",\"x\":1,"
        "\"block_hashes\":[18446744073709551615, 9223372036854775808, 5, 5, 0]}},"
        "{\"action_type\":\"kv.fetch\",\"payload\":{\"source_control_endpoint\":\"other\","
        "\"block_hashes\":[1]}}]}";
    assert_int_equal(submit(&r, "r1", json), 0);
    const char *src;
    size_t n;
    const uint64_t *h;
    bool failed;
    assert_int_equal(kvcr__test_hint(r.kv, "r1", &src, &n, &h, &failed), 1);
    assert_string_equal(src, "tcp://h\xc3\xa9:1");
    assert_int_equal(n, 4);
    assert_true(h[0] == 0 && h[1] == 5 && h[2] == 9223372036854775808ull &&
                h[3] == 18446744073709551615ull);
    assert_false(failed);

    /* Same source: the hash set is replaced. */
    assert_int_equal(submit(&r, "r1", ENV("{\"source_control_endpoint\":\"tcp://h\\u00e9:1\","
                                          "\"block_hashes\":[42]}")), 0);
    assert_int_equal(kvcr__test_hint(r.kv, "r1", &src, &n, &h, &failed), 1);
    assert_int_equal(n, 1);
    assert_true(h[0] == 42);
    /* A different source fails the request closed, and keeps it failed. */
    assert_int_equal(submit(&r, "r1", ENV("{\"source_control_endpoint\":\"tcp://x:2\","
                                          "\"block_hashes\":[1]}")), 0);
    assert_int_equal(kvcr__test_hint(r.kv, "r1", &src, &n, &h, &failed), 1);
    assert_true(failed);
    assert_int_equal(n, 1);

    /* No request id: validated, nothing stored. */
    assert_int_equal(submit(&r, NULL, ENV("{" SRC ",\"block_hashes\":[1]}")), 0);
    assert_int_equal(submit(&r, NULL, ENV("{" SRC ",\"block_hashes\":[]}")), KVCR_EINVAL);

    /* Many requests at once (the table grows), then all discarded. */
    char rid[32];
    for (int i = 0; i < 500; i++) {
        snprintf(rid, sizeof rid, "req-%d", i);
        assert_int_equal(submit(&r, rid, ENV("{" SRC ",\"block_hashes\":[7]}")), 0);
    }
    for (int i = 0; i < 500; i++) {
        snprintf(rid, sizeof rid, "req-%d", i);
        assert_int_equal(kvcr__test_hint(r.kv, rid, &src, &n, &h, &failed), 1);
        assert_int_equal(kvcr_discard_hint(r.kv, rid), 0);
        assert_int_equal(kvcr__test_hint(r.kv, rid, &src, &n, &h, &failed), 0);
    }
    assert_int_equal(kvcr_discard_hint(r.kv, "never-seen"), 0);
    /* A hint does not make keys fetchable until the peer tier exists. */
    kvcr_key k = key_of("k");
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r.kv, &k, 1, "r1", &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_MISS);
    assert_int_equal(kvcr_close(r.kv), 0);
    assert_int_equal(submit(&r, "r1", ENV("{" SRC ",\"block_hashes\":[1]}")), KVCR_ECLOSED);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_envelope_rule_refuses_with_its_message),
        cmocka_unit_test(test_strict_json_is_required),
        cmocka_unit_test(test_hashes_are_exact_u64_deduplicated_and_scoped_per_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
