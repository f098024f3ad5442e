/* The block index and the evictable queue against simple models. */
#include <stdlib.h>
#include <string.h>

#include "core/evictq.h"
#include "core/index.h"
#include "harness.h"

static void make_key(uint8_t *k, size_t *len, uint32_t i)
{
    /* Lengths vary across the inline/heap boundary (32 bytes); at least 4,
     * so that the first 4 bytes (i itself) keep keys unique. */
    *len = 4 + (i * 7) % 45;
    for (size_t j = 0; j < *len; j++) k[j] = (uint8_t)(i >> (8 * (j % 4))) ^ (uint8_t)j;
    k[0] = (uint8_t)i, k[*len - 1] ^= (uint8_t)(i >> 8);
    memcpy(k, &i, 4);
}

static void test_index_finds_every_inserted_key_and_forgets_removed_ones(void **state)
{
    (void)state;
    enum { N = 50000 };
    block_index ix;
    assert_int_equal(index_init(&ix), 0);
    block_id *ids = malloc(N * sizeof *ids);
    uint8_t key[64];
    size_t len;
    for (uint32_t i = 0; i < N; i++) {
        make_key(key, &len, i);
        uint64_t h = index_hash(key, len);
        assert_int_equal(index_find(&ix, key, len, h), BLOCK_NONE);
        assert_int_equal(index_reserve(&ix, 1), 0);
        ids[i] = index_insert(&ix, key, len, h);
        assert_int_not_equal(ids[i], BLOCK_NONE);
    }
    assert_int_equal(ix.count, N);
    /* Remove every third key, then check all of them. */
    for (uint32_t i = 0; i < N; i += 3) index_remove(&ix, ids[i]);
    for (uint32_t i = 0; i < N; i++) {
        make_key(key, &len, i);
        block_id got = index_find(&ix, key, len, index_hash(key, len));
        if (i % 3 == 0)
            assert_int_equal(got, BLOCK_NONE);
        else {
            assert_int_equal(got, ids[i]);
            const block *b = index_get(&ix, got);
            assert_int_equal(b->key_len, len);
            assert_memory_equal(block_key(b), key, len);
        }
    }
    /* Freed ids are reused. */
    assert_int_equal(index_reserve(&ix, 1), 0);
    uint8_t fresh[] = "a brand new key that is longer than thirty-two bytes";
    block_id id = index_insert(&ix, fresh, sizeof fresh, index_hash(fresh, sizeof fresh));
    assert_true(id < N);
    free(ids);
    index_destroy(&ix);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_evictq_pops_in_score_then_arrival_order(void **state)
{
    (void)state;
    enum { N = 5000 };
    block_index ix;
    evictq q;
    assert_int_equal(index_init(&ix), 0);
    evq_init(&q);
    assert_int_equal(index_reserve(&ix, N), 0);
    double *scores = malloc(N * sizeof *scores);
    srand(7);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t k = i + 1;
        block_id id = index_insert(&ix, (uint8_t *)&k, sizeof k, index_hash((uint8_t *)&k, 4));
        /* Half monotone (the list path), half random (the heap path), with
         * many ties. */
        scores[i] = i % 2 ? (double)i : (double)(rand() % 100);
        assert_int_equal(evq_insert(&q, &ix, id, scores[i]), 0);
    }
    /* Remove a few from the middle, restore a popped one. */
    for (uint32_t i = 100; i < 200; i++) {
        evq_remove(&q, &ix, i);
        scores[i] = 1e300; /* gone: sorts last and is never popped */
    }
    assert_int_equal(q.count, N - 100);
    bool from_list;
    block_id first = evq_pop(&q, &ix, &from_list);
    evq_restore(&q, &ix, first, from_list);
    qsort(scores, N, sizeof *scores, cmp_double);
    double prev = -1;
    uint64_t prev_seq = 0;
    for (uint32_t i = 0; i < N - 100; i++) {
        block_id id = evq_pop(&q, &ix, &from_list);
        assert_int_not_equal(id, BLOCK_NONE);
        const block *b = index_get(&ix, id);
        assert_true(b->score == scores[i]);
        if (b->score == prev) assert_true(b->seq > prev_seq); /* ties: earliest first */
        prev = b->score;
        prev_seq = b->seq;
    }
    assert_int_equal(evq_pop(&q, &ix, &from_list), BLOCK_NONE);
    assert_int_equal(q.count, 0);
    free(scores);
    evq_destroy(&q);
    index_destroy(&ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_finds_every_inserted_key_and_forgets_removed_ones),
        cmocka_unit_test(test_evictq_pops_in_score_then_arrival_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
