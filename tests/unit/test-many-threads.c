/* Many threads call in at once: every delivered byte is right, every
 * operation completes exactly once, and the index stays consistent (run
 * under TSan and ASan in CI). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

enum { BS = 1024, THREADS = 4, PER = 4, ROUNDS = 150, SLOTS = 24 };

/* Results land wherever a poll happens to collect them. */
typedef struct board {
    pthread_mutex_t lock;
    struct { kvcr_op_handle op; int ok, n; kvcr_release_handle rh[PER]; } done[THREADS * ROUNDS * 4];
    size_t n_done;
} board;

typedef struct ctx {
    rig *r;
    board *b;
    int id;
    int delivered_ok, verified;
} ctx;

static void collect(rig *r, board *b)
{
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r->kv, &res, &n), 0);
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < n; i++) {
        assert_true(b->n_done < sizeof b->done / sizeof b->done[0]);
        typeof(b->done[0]) *d = &b->done[b->n_done++];
        d->op = res[i].op;
        d->n = (int)res[i].n_entries;
        d->ok = 0;
        for (size_t j = 0; j < res[i].n_entries; j++) {
            d->ok += res[i].entries[j].status == KVCR_ENTRY_SUCCESS;
            if (j < PER) d->rh[j] = res[i].entries[j].release_handle;
        }
    }
    pthread_mutex_unlock(&b->lock);
    kvcr_results_free(res);
}

static int await(ctx *c, kvcr_op_handle op, kvcr_release_handle *rh)
{
    for (int tries = 0; tries < 200000; tries++) {
        pthread_mutex_lock(&c->b->lock);
        for (size_t i = 0; i < c->b->n_done; i++)
            if (c->b->done[i].op == op) {
                int ok = c->b->done[i].ok;
                if (rh) memcpy(rh, c->b->done[i].rh, sizeof c->b->done[i].rh);
                c->b->done[i] = c->b->done[--c->b->n_done];
                pthread_mutex_unlock(&c->b->lock);
                return ok;
            }
        pthread_mutex_unlock(&c->b->lock);
        collect(c->r, c->b);
        /* A stress test's contention pause, not an event wait: the op may
         * be collected by any thread's poll (kvcr_fd's wake goes to one of
         * them), so each looks again after letting the others poll. The
         * wait is bounded by the tries; no assertion counts on its length. */
        usleep(50);
    }
    fail_msg("thread %d: op never completed", c->id);
    return -1;
}

static void *worker(void *arg)
{
    ctx *c = arg;
    rig *r = c->r;
    char names[PER][32];
    const char *keys[PER];
    size_t src[PER], dst[PER];
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 0; k < PER; k++) {
            snprintf(names[k], sizeof names[k], "t%d-r%d-k%d", c->id, round % 7, k);
            keys[k] = names[k];
            src[k] = (size_t)(c->id * 2 * PER + k);
            dst[k] = src[k] + PER;
            /* Same name, same bytes: a re-deposit of a resident key is a hit. */
            fill_pattern(r->fw + src[k] * BS, BS, (uint32_t)(c->id * 1000 + round % 7 * 10 + k));
        }
        await(c, rig_deposit(r, keys, src, PER, 0), NULL);
        memset(r->fw + dst[0] * BS, 0, PER * BS);
        int ok = await(c, rig_deliver(r, keys, dst, PER), NULL);
        c->delivered_ok += ok;
        /* Entries that succeeded hold exactly their producer's bytes. */
        for (int k = 0; k < PER; k++) {
            uint8_t *p = r->fw + dst[k] * BS;
            bool zero = p[0] == 0 && memcmp(p, p + 1, BS - 1) == 0;
            if (!zero) {
                assert_true(rig_has_pattern(r, p, (uint32_t)(c->id * 1000 + round % 7 * 10 + k)));
                c->verified++;
            }
        }
        kvcr_key fk[PER];
        for (int k = 0; k < PER; k++) fk[k] = key_of(keys[k]);
        kvcr_op_handle op;
        assert_int_equal(kvcr_fetch(r->kv, fk, PER, NULL, NULL, 0, &op), 0);
        kvcr_release_handle rh[PER];
        await(c, op, rh);
        bool rel[PER];
        assert_int_equal(kvcr_release(r->kv, rh, PER, rel), 0);
        kvcr_query_result q[PER];
        assert_int_equal(kvcr_query(r->kv, fk, PER, NULL, q), 0);
    }
    return NULL;
}

static void test_threads_deposit_deliver_fetch_and_query_at_once(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, THREADS * 2 * PER, SLOTS);
    r.cfg.enable_telemetry = true;
    r.cfg.capacity_low_watermark_percent = 10;
    rig_start(&r);
    board *b = calloc(1, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    ctx c[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i] = (ctx){&r, b, i, 0, 0};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &c[i]), 0);
    }
    for (int i = 0; i < 50; i++) {
        kvcr_stats *st;
        assert_int_equal(kvcr_stats_take(r.kv, &st), 0);
        kvcr_stats_free(st);
        /* Spreads the stats calls over the workers' run, to contend with
         * them for the instance lock; orders nothing. */
        usleep(1000);
    }
    int verified = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        verified += c[i].verified;
        assert_int_equal(c[i].verified, c[i].delivered_ok);
    }
    assert_true(verified > 0);
    pthread_mutex_destroy(&b->lock);
    free(b);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_deposit_deliver_fetch_and_query_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
