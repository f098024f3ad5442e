/* Eviction follows the policy: FIFO and LRU order, claims and no_evict
 * deposits protect blocks, batches protect their own keys, and a custom
 * policy's scores and decisions are honoured. */
#include <string.h>

#include "harness.h"

enum { BS = 512 };

static kvcr_entry_status deliver1(rig *r, const char *key, size_t idx)
{
    const char *k[] = {key};
    size_t s[] = {idx};
    kvcr_entry_status st;
    rig_wait(r, rig_deliver(r, k, s, 1), &st, NULL, NULL);
    return st;
}

static void start_with_policy(rig *r, size_t slots, const char *policy)
{
    rig_init(r, BS, 8, slots);
    r->cfg.policy = kvcr_policy_builtin(policy);
    rig_start(r);
}

static void test_fifo_evicts_in_arrival_order_even_after_access(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 3, "fifo");
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    rig_deposit1(&r, "c", 2, 0, NULL, NULL);
    /* A plain deliver claims and releases: under FIFO that re-enters a at
     * the back of the evictable set. */
    assert_int_equal(deliver1(&r, "b", 7), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_deposit1(&r, "d", 3, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_MISS);
    assert_int_equal(rig_deposit1(&r, "e", 4, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "c"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "b"), KVCR_QUERY_HIT);
    assert_string_equal(r.inventory_log, "+:a +:b +:c -:a +:d -:c +:e");
    rig_stop(&r);
}

static void test_lru_evicts_the_least_recently_used(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 3, "lru");
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    rig_deposit1(&r, "c", 2, 0, NULL, NULL);
    assert_int_equal(deliver1(&r, "a", 7), KVCR_ENTRY_SUCCESS); /* a is now newest */
    rig_deposit1(&r, "d", 3, 0, NULL, NULL);
    assert_int_equal(rig_query(&r, "b"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_HIT);
    /* A fetch claim taken long ago and released later re-enters by its
     * access time, ahead of blocks used since (the heap path). */
    kvcr_key ka = key_of("a");
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, &ka, 1, NULL, NULL, 0, &op), 0);
    kvcr_release_handle h;
    rig_wait(&r, op, NULL, NULL, &h);
    assert_int_equal(deliver1(&r, "c", 7), KVCR_ENTRY_SUCCESS);
    assert_int_equal(deliver1(&r, "d", 7), KVCR_ENTRY_SUCCESS);
    bool rel;
    assert_int_equal(kvcr_release(r.kv, &h, 1, &rel), 0);
    assert_true(rel);
    rig_deposit1(&r, "e", 4, 0, NULL, NULL);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "c"), KVCR_QUERY_HIT);
    assert_int_equal(rig_query(&r, "d"), KVCR_QUERY_HIT);
    rig_stop(&r);
}

static int align(rig *r, const char *const *names, size_t n, bool now)
{
    kvcr_key keys[8];
    for (size_t i = 0; i < n; i++) keys[i] = key_of(names[i]);
    return kvcr_align_sequence(r->kv, keys, n, now);
}

/* vLLM aligns a request's prefix after its transfers: one recency for the
 * whole sequence, its tail evicted first, so LRU keeps a prefix's head. */
static void test_an_aligned_sequence_shares_one_recency_and_loses_its_tail_first(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 4, "lru");
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    rig_deposit1(&r, "c", 2, 0, NULL, NULL);
    rig_deposit1(&r, "d", 3, 0, NULL, NULL);
    /* Aligned now: a, b, c are newer than d, and c (the tail) goes first.
     * Unknown keys are skipped, a repeated key counts where it first stands. */
    const char *seq[] = {"a", "nope", "b", "c", "a"};
    assert_int_equal(align(&r, seq, 5, true), 0);
    rig_deposit1(&r, "e", 4, 0, NULL, NULL);
    rig_deposit1(&r, "f", 5, 0, NULL, NULL);
    rig_deposit1(&r, "g", 6, 0, NULL, NULL);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_HIT);
    assert_string_equal(r.inventory_log,
                        "+:a +:b +:c +:d -:d +:e -:c +:f -:b +:g");
    rig_stop(&r);
}

static void test_an_aligned_sequence_takes_its_newest_access_without_the_clock(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 3, "lru");
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    rig_deposit1(&r, "c", 2, 0, NULL, NULL);
    /* a takes b's access time and b, the tail, goes first; c stays newest. */
    const char *seq[] = {"a", "b"};
    assert_int_equal(align(&r, seq, 2, false), 0);
    rig_deposit1(&r, "d", 3, 0, NULL, NULL);
    rig_deposit1(&r, "e", 4, 0, NULL, NULL);
    assert_string_equal(r.inventory_log, "+:a +:b +:c -:b +:d -:a +:e");
    /* Bad arguments change nothing; a closed instance refuses. */
    assert_int_equal(kvcr_align_sequence(r.kv, NULL, 1, true), KVCR_EINVAL);
    kvcr_key empty = {NULL, 0};
    assert_int_equal(kvcr_align_sequence(r.kv, &empty, 1, true), KVCR_EINVAL);
    assert_int_equal(kvcr_align_sequence(r.kv, NULL, 0, true), 0);
    assert_int_equal(kvcr_close(r.kv), 0);
    assert_int_equal(align(&r, seq, 2, true), KVCR_ECLOSED);
    kvcr_free(r.kv);
    r.kv = NULL;
    rig_stop(&r);
}

static void test_claims_and_no_evict_block_eviction_until_released(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 2, "fifo");
    kvcr_release_handle h1, h2;
    assert_int_equal(rig_deposit1(&r, "p1", 0, KVCR_NO_EVICT, NULL, &h1), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_deposit1(&r, "p2", 1, KVCR_NO_EVICT, NULL, &h2), KVCR_ENTRY_SUCCESS);
    assert_true(h1 != 0 && h2 != 0);
    kvcr_reason why;
    assert_int_equal(rig_deposit1(&r, "x", 2, 0, &why, NULL), KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_NO_CAPACITY);
    assert_int_equal(r.inventory_removed, 0); /* nothing was evicted trying */
    bool rel;
    assert_int_equal(kvcr_release(r.kv, &h2, 1, &rel), 0);
    assert_true(rel);
    assert_int_equal(rig_deposit1(&r, "x", 2, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "p2"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "p1"), KVCR_QUERY_HIT);
    /* A fetch claim protects the same way. */
    kvcr_key kx = key_of("x");
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, &kx, 1, NULL, NULL, 0, &op), 0);
    kvcr_release_handle hx;
    rig_wait(&r, op, NULL, NULL, &hx);
    assert_int_equal(rig_deposit1(&r, "y", 3, 0, &why, NULL), KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_NO_CAPACITY);
    kvcr_release_handle both[] = {h1, hx};
    bool r2[2];
    assert_int_equal(kvcr_release(r.kv, both, 2, r2), 0);
    assert_true(r2[0] && r2[1]);
    assert_int_equal(rig_deposit1(&r, "y", 3, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "p1"), KVCR_QUERY_MISS); /* p1 re-entered first */
    rig_stop(&r);
}

static void test_a_batch_never_evicts_its_own_keys(void **state)
{
    (void)state;
    rig r;
    start_with_policy(&r, 2, "fifo");
    rig_deposit1(&r, "a", 0, 0, NULL, NULL);
    rig_deposit1(&r, "b", 1, 0, NULL, NULL);
    const char *keys[] = {"a", "c", "d"};
    size_t src[] = {0, 2, 3};
    kvcr_entry_status st[3];
    kvcr_reason why[3];
    rig_wait(&r, rig_deposit(&r, keys, src, 3, 0), st, why, NULL);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS); /* already resident */
    assert_int_equal(st[1], KVCR_ENTRY_SUCCESS); /* evicted b */
    assert_int_equal(st[2], KVCR_ENTRY_FAILED);  /* only a was left, protected */
    assert_int_equal(why[2], KVCR_REASON_NO_CAPACITY);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_HIT);
    assert_int_equal(rig_query(&r, "b"), KVCR_QUERY_MISS);
    rig_stop(&r);
}

/* A policy that scores by the key's first byte, descending ('z' goes first),
 * keeps 'k*' keys, and drops ingest of 'n*' keys. */
typedef struct custom {
    int ingest_calls, score_calls, evict_calls, ingested, removed;
} custom;

static int c_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier src, bool req, kvcr_placement *out)
{
    custom *c = ud;
    c->ingest_calls++;
    assert_int_equal(src, KVCR_TIER_FW_G2);
    assert_int_equal(m->size_bytes, BS);
    out->action = m->key.data[0] == 'n' && !req ? KVCR_ACTION_DROP : KVCR_ACTION_KEEP;
    return 0;
}

static int c_score(void *ud, const kvcr_block_meta *m, kvcr_tier src, double *out)
{
    custom *c = ud;
    c->score_calls++;
    assert_int_equal(src, KVCR_TIER_LOCAL_G2);
    *out = 255.0 - m->key.data[0];
    return 0;
}

static int c_evict(void *ud, const kvcr_block_meta *m, kvcr_tier src, kvcr_placement *out)
{
    custom *c = ud;
    (void)src;
    c->evict_calls++;
    out->action = m->key.data[0] == 'k' ? KVCR_ACTION_KEEP : KVCR_ACTION_DROP;
    return 0;
}

static void c_ingested(void *ud, const kvcr_block_meta *m, kvcr_tier src)
{
    (void)m, (void)src;
    ((custom *)ud)->ingested++;
}

static void c_removed(void *ud, const kvcr_block_meta *m)
{
    assert_int_equal(m->resident_tiers, 0);
    ((custom *)ud)->removed++;
}

static void test_custom_policy_scores_and_decisions_are_honoured(void **state)
{
    (void)state;
    static const kvcr_policy_ops ops = {.version = KVCR_POLICY_VERSION, .name = "custom",
                                        .decide_ingest = c_ingest, .eviction_score = c_score,
                                        .decide_eviction = c_evict,
                                        .on_ingest = c_ingested, .on_remove = c_removed};
    custom c = {0};
    rig r;
    rig_init(&r, BS, 8, 3);
    r.cfg.policy = &ops;
    r.cfg.policy_ud = &c;
    rig_start(&r);
    kvcr_reason why;
    assert_int_equal(rig_deposit1(&r, "nope", 0, 0, &why, NULL), KVCR_ENTRY_DROPPED);
    assert_int_equal(why, KVCR_REASON_POLICY);
    assert_int_equal(rig_query(&r, "nope"), KVCR_QUERY_MISS);
    /* Required-local work cannot be dropped. */
    kvcr_release_handle h;
    assert_int_equal(rig_deposit1(&r, "nreq", 0, KVCR_NO_EVICT, NULL, &h), KVCR_ENTRY_SUCCESS);
    bool rel;
    kvcr_release(r.kv, &h, 1, &rel);
    /* Scores (lower goes first): z 133, nreq 145, m 146, k 148, b 157, a 158. */
    rig_deposit1(&r, "m", 1, 0, NULL, NULL);
    rig_deposit1(&r, "k", 2, 0, NULL, NULL);
    assert_int_equal(rig_deposit1(&r, "z", 3, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "nreq"), KVCR_QUERY_MISS); /* lowest of nreq, m, k */
    /* z entered last but scores lowest (the heap path): it goes next. */
    assert_int_equal(rig_deposit1(&r, "a", 4, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "z"), KVCR_QUERY_MISS);
    assert_int_equal(rig_deposit1(&r, "b", 5, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "m"), KVCR_QUERY_MISS);
    /* Now k is the lowest, but the policy keeps it: b goes instead. */
    assert_int_equal(rig_deposit1(&r, "c", 6, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_query(&r, "k"), KVCR_QUERY_HIT);
    assert_int_equal(rig_query(&r, "b"), KVCR_QUERY_MISS);
    assert_int_equal(rig_query(&r, "a"), KVCR_QUERY_HIT);
    assert_int_equal(c.ingested, 7);
    assert_int_equal(c.removed, 4);
    assert_int_equal(c.evict_calls, 5); /* nreq, z, m, then k (kept) and b */
    assert_int_equal(c.ingest_calls, 8);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_evicts_in_arrival_order_even_after_access),
        cmocka_unit_test(test_lru_evicts_the_least_recently_used),
        cmocka_unit_test(test_an_aligned_sequence_shares_one_recency_and_loses_its_tail_first),
        cmocka_unit_test(test_an_aligned_sequence_takes_its_newest_access_without_the_clock),
        cmocka_unit_test(test_claims_and_no_evict_block_eviction_until_released),
        cmocka_unit_test(test_a_batch_never_evicts_its_own_keys),
        cmocka_unit_test(test_custom_policy_scores_and_decisions_are_honoured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
