/* The peer-to-peer tier between real processes on 127.0.0.1: hinted
 * deliver and fetch with bytes compared, partial hits and remembered
 * misses, framework pins acquired and released exactly once (also when
 * concurrent requests overlap), and hint rules that fail a request closed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"

#define BS 4096

static kvcr_query_result query_req(rig *r, uint32_t i, const char *request)
{
    char k[24];
    kvcr_key key = key_of(peer_key(k, sizeof k, i));
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r->kv, &key, 1, request, &q), 0);
    return q;
}

static void expect_block(rig *r, size_t fw_idx, uint32_t seed)
{
    assert_true(rig_has_pattern(r, r->fw + fw_idx * r->block_size, seed));
}

static void test_hinted_deliver_and_fetch_move_exact_bytes(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 16);

    rig r;
    rig_init_remote(&r, BS, 32, 32);
    rig_start(&r);
    uint64_t hashes[17];
    for (uint32_t i = 0; i < 16; i++) hashes[i] = i;
    hashes[16] = 100; /* hinted, but the source lacks it */
    peer_hint_hashes(&r, "req-1", src.endpoint, hashes, 17);

    kvcr_query_result q = query_req(&r, 3, "req-1");
    assert_int_equal(q.status, KVCR_QUERY_FETCHABLE);
    assert_int_equal(q.tier, KVCR_TIER_REMOTE_G2);
    assert_int_equal(query_req(&r, 200, "req-1").status, KVCR_QUERY_MISS); /* not hinted */
    assert_int_equal(query_req(&r, 3, NULL).status, KVCR_QUERY_MISS);     /* no request */
    assert_int_equal(query_req(&r, 3, "other").status, KVCR_QUERY_MISS);  /* no hint */

    /* deliver k0..k7 into framework blocks 20..27 */
    uint32_t keys[8];
    size_t dst[8];
    for (uint32_t i = 0; i < 8; i++) keys[i] = i, dst[i] = 20 + i;
    kvcr_entry_status st[16];
    kvcr_reason why[16];
    kvcr_release_handle rh[16];
    assert_int_equal(rig_wait(&r, peer_deliver(&r, keys, dst, 8, "req-1"), st, why, NULL), 8);
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        expect_block(&r, 20 + i, i);
    }

    /* fetch k8..k15 into KVCR DRAM: slots hold the bytes, then a local hit */
    char names[8][24];
    kvcr_key fk[8];
    for (uint32_t i = 0; i < 8; i++) fk[i] = key_of(peer_key(names[i], sizeof names[i], 8 + i));
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, fk, 8, "req-1", NULL, 0, &op), 0);
    size_t n;
    kvcr_op_result *res = rig_poll_results(&r, &n);
    assert_int_equal(n, 1);
    assert_int_equal(res[0].op, op);
    assert_int_equal(res[0].n_entries, 8);
    for (uint32_t i = 0; i < 8; i++) {
        const kvcr_entry_result *e = &res[0].entries[i];
        assert_int_equal(e->status, KVCR_ENTRY_SUCCESS);
        assert_int_equal(e->n_slots, 1);
        assert_true(rig_has_pattern(&r, e->slots[0].addr, 8 + i));
        rh[i] = e->release_handle;
    }
    kvcr_results_free(res);
    bool released[8];
    assert_int_equal(kvcr_release(r.kv, rh, 8, released), 0);
    for (int i = 0; i < 8; i++) assert_true(released[i]);
    q = query_req(&r, 9, NULL);
    assert_int_equal(q.status, KVCR_QUERY_HIT);
    assert_int_equal(q.tier, KVCR_TIER_LOCAL_G2);

    /* a hinted key the source lacks: FAILED, then remembered as a miss */
    uint32_t miss = 100;
    size_t at = 30;
    assert_int_equal(rig_wait(&r, peer_deliver(&r, &miss, &at, 1, "req-1"), st, why, NULL), 1);
    assert_int_equal(st[0], KVCR_ENTRY_FAILED);
    assert_int_equal(why[0], KVCR_REASON_NOT_FOUND);
    assert_int_equal(query_req(&r, 100, "req-1").status, KVCR_QUERY_MISS);
    assert_int_equal(query_req(&r, 5, "req-1").status, KVCR_QUERY_FETCHABLE); /* still healthy */
    uint8_t zero[BS] = {0};
    assert_memory_equal(r.fw + 30 * BS, zero, BS); /* nothing was written there */

    rig_stop(&r);
    peer_stop(&src);
}

static void test_partial_hit_completes_present_keys_only(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 4);
    rig r;
    rig_init_remote(&r, BS, 8, 8);
    rig_start(&r);
    const uint64_t hashes[] = {0, 1, 2, 3, 50, 51}; /* 50 and 51: the source lacks them */
    peer_hint_hashes(&r, "req-p", src.endpoint, hashes, 6);
    uint32_t keys[] = {1, 50, 2, 51};
    size_t dst[] = {0, 1, 2, 3};
    kvcr_entry_status st[4];
    kvcr_reason why[4];
    assert_int_equal(rig_wait(&r, peer_deliver(&r, keys, dst, 4, "req-p"), st, why, NULL), 4);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[1], KVCR_ENTRY_FAILED);
    assert_int_equal(why[1], KVCR_REASON_NOT_FOUND);
    assert_int_equal(st[2], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[3], KVCR_ENTRY_FAILED);
    expect_block(&r, 0, 1);
    expect_block(&r, 2, 2);
    /* misses are remembered for the request; present keys stay fetchable */
    assert_int_equal(query_req(&r, 50, "req-p").status, KVCR_QUERY_MISS);
    assert_int_equal(query_req(&r, 3, "req-p").status, KVCR_QUERY_FETCHABLE);
    rig_stop(&r);
    peer_stop(&src);
}

static bool all_pins_released(const peer_counts *c)
{
    return c->pin_releases == c->pin_requests;
}

static void test_framework_pins_shared_and_released_exactly_once(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0; /* no KVCR DRAM: every block comes from pinned framework memory */
    o.fw_n = 8;
    o.pins = true;
    peer src;
    peer_spawn(&src, &o);
    rig r;
    rig_init_remote(&r, BS, 32, 8);
    rig_start(&r);
    peer_hint_range(&r, "a", src.endpoint, 0, 8);
    peer_hint_range(&r, "b", src.endpoint, 0, 8);
    /* two overlapping requests at once: k0..k5 and k3..k7 */
    uint32_t ka[6], kb[5];
    size_t da[6], db[5];
    for (uint32_t i = 0; i < 6; i++) ka[i] = i, da[i] = i;
    for (uint32_t i = 0; i < 5; i++) kb[i] = 3 + i, db[i] = 10 + i;
    kvcr_op_handle opa = peer_deliver(&r, ka, da, 6, "a");
    kvcr_op_handle opb = peer_deliver(&r, kb, db, 5, "b");
    kvcr_entry_status st[8];
    assert_int_equal(rig_wait(&r, opa, st, NULL, NULL), 6);
    for (int i = 0; i < 6; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_wait(&r, opb, st, NULL, NULL), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    for (uint32_t i = 0; i < 6; i++) expect_block(&r, i, i);
    for (uint32_t i = 0; i < 5; i++) expect_block(&r, 10 + i, 3 + i);

    /* every pin the framework granted comes back exactly once, and no key
     * was pinned twice while its pin was held */
    peer_counts c = peer_wait(&src, all_pins_released);
    assert_true(c.pin_requests >= 1);
    assert_int_equal(c.pin_releases, c.pin_requests);
    assert_true(c.pinned_keys >= 8 && c.pinned_keys <= 11);
    assert_int_equal(c.pin_cancels, 0);
    rig_stop(&r);
    peer_stop(&src);
}

static void test_second_source_fails_request_closed(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 2);
    rig r;
    rig_init_remote(&r, BS, 4, 4);
    rig_start(&r);
    peer_hint_range(&r, "mixed", src.endpoint, 0, 2);
    assert_int_equal(query_req(&r, 0, "mixed").status, KVCR_QUERY_FETCHABLE);
    peer_hint_range(&r, "mixed", "tcp://127.0.0.1:9", 0, 2); /* a different source */
    assert_int_equal(query_req(&r, 0, "mixed").status, KVCR_QUERY_MISS);
    uint32_t k = 0;
    size_t d = 0;
    kvcr_entry_status st;
    kvcr_reason why;
    assert_int_equal(rig_wait(&r, peer_deliver(&r, &k, &d, 1, "mixed"), &st, &why, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_NOT_FOUND);
    uint8_t zero[BS] = {0};
    assert_memory_equal(r.fw, zero, BS);
    /* discarding the hint forgets the request */
    assert_int_equal(kvcr_discard_hint(r.kv, "mixed"), 0);
    peer_hint_range(&r, "mixed", src.endpoint, 0, 2);
    assert_int_equal(rig_wait(&r, peer_deliver(&r, &k, &d, 1, "mixed"), &st, &why, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    expect_block(&r, 0, 0);
    rig_stop(&r);
    peer_stop(&src);
}

/* Three processes: one target pulls from two sources at once, each request
 * hinted to the source that has its blocks; with opportunistic_query every
 * key of a hinted request is fetchable, and a key its source lacks fails. */
static void test_two_sources_serve_one_target_concurrently(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.deposit_n = 8;
    peer a, b;
    peer_spawn(&a, &o);
    o.deposit_n = 16; /* b also holds k8..k15 */
    peer_spawn(&b, &o);
    rig r;
    rig_init_remote(&r, BS, 32, 8);
    r.cfg.remote.opportunistic_query = true;
    rig_start(&r);
    peer_hint_range(&r, "from-a", a.endpoint, 0, 1); /* hashes do not matter now */
    peer_hint_range(&r, "from-b", b.endpoint, 0, 1);
    assert_int_equal(query_req(&r, 12, "from-b").status, KVCR_QUERY_FETCHABLE);
    assert_int_equal(query_req(&r, 12, "from-a").status, KVCR_QUERY_FETCHABLE);
    kvcr_op_handle op_a = peer_deliver_range(&r, 0, 8, 0, "from-a");
    kvcr_op_handle op_b = peer_deliver_range(&r, 8, 8, 8, "from-b");
    uint32_t lacking = 12; /* a does not hold k12 */
    size_t at = 20;
    kvcr_op_handle op_miss = peer_deliver(&r, &lacking, &at, 1, "from-a");
    kvcr_entry_status st[8];
    kvcr_reason why[8];
    assert_int_equal(rig_wait(&r, op_a, st, NULL, NULL), 8);
    for (int i = 0; i < 8; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_wait(&r, op_b, st, NULL, NULL), 8);
    for (int i = 0; i < 8; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    for (uint32_t i = 0; i < 16; i++) expect_block(&r, i, i);
    assert_int_equal(rig_wait(&r, op_miss, st, why, NULL), 1);
    assert_int_equal(st[0], KVCR_ENTRY_FAILED);
    assert_int_equal(why[0], KVCR_REASON_NOT_FOUND);
    uint8_t zero[BS] = {0};
    assert_memory_equal(r.fw + 20 * BS, zero, BS);
    assert_int_equal(query_req(&r, 12, "from-a").status, KVCR_QUERY_MISS); /* remembered */
    rig_stop(&r);
    peer_stop(&a);
    peer_stop(&b);
}

/* Every observation of a pull part (kvcr/stats.h) in a fresh snapshot:
 * n pulls, each part observed once a pull and above 0 (pin_wait: above 0
 * exactly when the source pinned), and the parts' sums within the pulls'
 * total, together making it. */
static void expect_split(rig *r, uint64_t n, bool pinned)
{
    static const char *const parts[KVCR_PULL_PARTS] = KVCR_PULL_PART_SCOPES;
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &s), 0);
    double total = 0, sum[KVCR_PULL_PARTS] = {0}, all = 0;
    uint64_t pulls = 0, count[KVCR_PULL_PARTS] = {0};
    for (size_t h = 0; h < s->n_histograms; h++) {
        const kvcr_histogram *g = &s->histograms[h];
        assert_string_equal(g->result, "success");
        if (strcmp(g->scope, "remote_deliver") == 0) total += g->sum, pulls += g->count;
        for (int i = 0; i < KVCR_PULL_PARTS; i++)
            if (strcmp(g->scope, parts[i]) == 0) sum[i] += g->sum, count[i] += g->count;
    }
    assert_int_equal(pulls, n);
    for (int i = 0; i < KVCR_PULL_PARTS; i++) {
        assert_int_equal(count[i], n);
        assert_true(sum[i] <= total);
        all += sum[i];
    }
    assert_true(all > total * (1 - 1e-9) && all < total * (1 + 1e-9));
    for (size_t i = 0; i < s->n_observations; i++) {
        const kvcr_observation *o = &s->observations[i];
        if (strcmp(o->scope, "pull_pin_wait") == 0)
            assert_true(pinned ? o->seconds > 0 : o->seconds == 0);
        else if (strncmp(o->scope, "pull_", 5) == 0)
            assert_true(o->seconds > 0);
    }
    kvcr_stats_free(s);
}

/* A pull's time in parts, as the target's telemetry reports it, with the
 * bytes as UCX puts (inline writes off), from a source holding them in
 * KVCR DRAM and from one that pins them in framework memory. */
static void test_pull_time_is_split_into_parts(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0; /* the second source pins framework memory */
    o.fw_n = 8;
    o.pins = true;
    peer dram, pinning;
    peer_spawn_source(&dram, 8);
    peer_spawn(&pinning, &o);
    rig r;
    rig_init_remote(&r, BS, 32, 8);
    r.cfg.enable_telemetry = true;
    assert_int_equal(setenv("KVCR_INLINE_WRITE_MAX", "0", 1), 0); /* read at start */
    rig_start(&r);
    assert_int_equal(unsetenv("KVCR_INLINE_WRITE_MAX"), 0);
    peer_hint_range(&r, "dram", dram.endpoint, 0, 8);
    peer_hint_range(&r, "pins", pinning.endpoint, 0, 8);
    kvcr_entry_status st[8];
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 0, 8, 0, "dram"), st, NULL, NULL), 8);
    for (uint32_t i = 0; i < 8; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    expect_split(&r, 1, false);
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 0, 8, 8, "pins"), st, NULL, NULL), 8);
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        expect_block(&r, 8 + i, i);
    }
    expect_split(&r, 1, true);
    rig_stop(&r);
    peer_stop(&dram);
    peer_stop(&pinning);
}

static void test_without_key_adapter_nothing_is_remote(void **state)
{
    (void)state;
    rig r;
    rig_init_remote(&r, BS, 4, 4);
    r.cfg.callbacks.key_hash = NULL;
    rig_start(&r);
    peer_hint_range(&r, "x", "tcp://127.0.0.1:9", 0, 4);
    assert_int_equal(query_req(&r, 1, "x").status, KVCR_QUERY_MISS);
    assert_non_null(kvcr_control_endpoint(r.kv));
    assert_int_equal(strncmp(kvcr_control_endpoint(r.kv), "tcp://127.0.0.1:", 16), 0);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hinted_deliver_and_fetch_move_exact_bytes),
        cmocka_unit_test(test_partial_hit_completes_present_keys_only),
        cmocka_unit_test(test_framework_pins_shared_and_released_exactly_once),
        cmocka_unit_test(test_second_source_fails_request_closed),
        cmocka_unit_test(test_two_sources_serve_one_target_concurrently),
        cmocka_unit_test(test_pull_time_is_split_into_parts),
        cmocka_unit_test(test_without_key_adapter_nothing_is_remote),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
