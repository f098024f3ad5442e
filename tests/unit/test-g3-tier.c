/* The G3 tier through the public API, on real files (O_DIRECT, io_uring):
 * blocks spilled on eviction and read back into KVCR DRAM and straight into
 * framework memory with bytes compared; G3 eviction in order when it is
 * full; a second instance on the same files refused; warm restart finding
 * every block again; a flipped bit on disk detected and never served; a
 * failing disk failing entries while the rest keeps working; spills
 * through reused staging buffers verified after a restart, and the
 * staging bound dropping a spill whole. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define BS 4096

typedef struct g3_rig {
    rig r;
    char dir[64];
    char paths[2][96];
    const char *path_ptrs[2];
    size_t n_files;
} g3_rig;

/* slots of KVCR DRAM, files x slots_per_file of G3 */
static void g3_init(g3_rig *g, size_t slots, size_t files, size_t slots_per_file)
{
    rig_init(&g->r, BS, 64, slots);
    snprintf(g->dir, sizeof g->dir, "/var/tmp/kvcr-g3-XXXXXX");
    assert_non_null(mkdtemp(g->dir));
    g->n_files = files;
    for (size_t i = 0; i < files; i++) {
        snprintf(g->paths[i], sizeof g->paths[i], "%s/slots-%zu", g->dir, i);
        g->path_ptrs[i] = g->paths[i];
    }
    g->r.cfg.g3.paths = g->path_ptrs;
    g->r.cfg.g3.n_paths = files;
    g->r.cfg.g3.capacity_bytes_per_file = slots_per_file * BS;
    g->r.cfg.enable_telemetry = true;
    for (size_t i = 0; i < 64; i++) rig_pattern(&g->r, i, (uint32_t)i);
}

static void g3_cleanup(g3_rig *g)
{
    for (size_t i = 0; i < g->n_files; i++) unlink(g->paths[i]);
    rmdir(g->dir);
}

static const char *key(char *buf, size_t cap, int i)
{
    snprintf(buf, cap, "block-%d", i);
    return buf;
}

static void deposit(g3_rig *g, int i)
{
    char k[32];
    assert_int_equal(rig_deposit1(&g->r, key(k, sizeof k, i), (size_t)i, 0, NULL, NULL),
                     KVCR_ENTRY_SUCCESS);
}

static kvcr_query_result query(g3_rig *g, int i)
{
    char k[32];
    kvcr_key kk = key_of(key(k, sizeof k, i));
    kvcr_query_result q;
    assert_int_equal(kvcr_query(g->r.kv, &kk, 1, NULL, &q), 0);
    return q;
}

static double gauge(g3_rig *g, const char *name)
{
    return rig_stat(&g->r, name, NULL);
}

/* Delivers block i into framework block dst; returns status (and reason). */
static kvcr_entry_status deliver(g3_rig *g, int i, size_t dst, kvcr_reason *why)
{
    char k[32];
    const char *keys[] = {key(k, sizeof k, i)};
    size_t at[] = {dst};
    kvcr_entry_status st;
    rig_wait(&g->r, rig_deliver(&g->r, keys, at, 1), &st, why, NULL);
    return st;
}

static void test_evicted_blocks_spill_and_come_back_exact(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 4, 2, 8); /* 4 DRAM slots, 16 G3 slots over 2 files */
    rig_start(&g.r);
    assert_int_equal(gauge(&g, "g3_total_slots"), 16);
    for (int i = 0; i < 10; i++) deposit(&g, i); /* 6 evicted: spilled */
    rig_g3_settle(&g.r);
    assert_int_equal(gauge(&g, "g3_allocated_slots"), 6);
    for (int i = 0; i < 6; i++) {
        kvcr_query_result q = query(&g, i);
        assert_int_equal(q.status, KVCR_QUERY_FETCHABLE);
        assert_int_equal(q.tier, KVCR_TIER_G3);
    }
    assert_int_equal(query(&g, 9).status, KVCR_QUERY_HIT);
    /* G3 -> framework, bytes compared */
    memset(g.r.fw + 40 * BS, 0, BS);
    assert_int_equal(deliver(&g, 2, 40, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&g.r, g.r.fw + 40 * BS, 2));
    /* G3 -> KVCR DRAM (fetch), bytes compared, then a local hit */
    char k[32];
    kvcr_key kk = key_of(key(k, sizeof k, 3));
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(g.r.kv, &kk, 1, NULL, NULL, 0, &op), 0);
    size_t n;
    kvcr_op_result *res = rig_poll_results(&g.r, &n);
    assert_int_equal(n, 1);
    assert_int_equal(res[0].entries[0].status, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&g.r, res[0].entries[0].slots[0].addr, 3));
    kvcr_release_handle rh = res[0].entries[0].release_handle;
    kvcr_results_free(res);
    bool released;
    assert_int_equal(kvcr_release(g.r.kv, &rh, 1, &released), 0);
    assert_true(released);
    assert_int_equal(query(&g, 3).status, KVCR_QUERY_HIT);
    /* inventory: G3 additions were reported */
    assert_non_null(strstr(g.r.inventory_log, "block-0"));
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void test_full_g3_evicts_oldest_first(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 4); /* 2 DRAM slots, 4 G3 slots */
    g.r.cfg.policy = kvcr_policy_builtin("g3_fifo");
    rig_start(&g.r);
    for (int i = 0; i < 8; i++) {
        deposit(&g, i);
        rig_g3_settle(&g.r);
    }
    /* 0..5 were spilled in order; G3 holds 4: 0 and 1 went first */
    assert_int_equal(query(&g, 0).status, KVCR_QUERY_MISS);
    assert_int_equal(query(&g, 1).status, KVCR_QUERY_MISS);
    for (int i = 2; i < 6; i++) assert_int_equal(query(&g, i).tier, KVCR_TIER_G3);
    assert_int_equal(query(&g, 7).status, KVCR_QUERY_HIT);
    assert_int_equal(gauge(&g, "g3_free_slots"), 0);
    rig_stop(&g.r);
    g3_cleanup(&g);
}

/* The spill order is the policy's G2 eviction order: the block used
 * longest ago (a deliver claims and releases, which re-queues it; FIFO and
 * LRU agree on that). */
static void spill_order(const char *policy, int expect_spilled, int expect_kept)
{
    g3_rig g;
    g3_init(&g, 2, 1, 4);
    g.r.cfg.policy = kvcr_policy_builtin(policy);
    rig_start(&g.r);
    deposit(&g, 0);
    deposit(&g, 1);
    assert_int_equal(deliver(&g, 0, 30, NULL), KVCR_ENTRY_SUCCESS); /* block 0 used last */
    deposit(&g, 2);
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, expect_spilled).tier, KVCR_TIER_G3);
    assert_int_equal(query(&g, expect_kept).status, KVCR_QUERY_HIT);
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void test_spill_order_follows_fifo_and_lru(void **state)
{
    (void)state;
    spill_order("g3_fifo", 1, 0);
    spill_order("g3_lru", 1, 0);
}

static void test_failed_spill_and_read_fail_cleanly(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 4);
    rig_start(&g.r);
    deposit(&g, 0);
    deposit(&g, 1);
    kvcr__test_g3_fail_next(g.r.kv, 1, 28 /* ENOSPC */);
    deposit(&g, 2); /* block 0 spills: the disk says full */
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, 0).status, KVCR_QUERY_MISS); /* dropped, not half stored */
    assert_int_equal(gauge(&g, "g3_total_slots"), 3);       /* that slot is retired */
    deposit(&g, 3); /* block 1 spills fine */
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, 1).tier, KVCR_TIER_G3);
    kvcr__test_g3_fail_next(g.r.kv, 1, 5 /* EIO */);
    kvcr_reason why;
    assert_int_equal(deliver(&g, 1, 40, &why), KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_TRANSFER_ERROR);
    /* an I/O error is not corruption: the block stays, and reads again */
    assert_int_equal(deliver(&g, 1, 41, NULL), KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&g.r, g.r.fw + 41 * BS, 1));
    assert_int_equal(query(&g, 3).status, KVCR_QUERY_HIT); /* the other tiers kept serving */
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void test_block_being_read_is_not_evicted(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 2); /* 2 DRAM slots, 2 G3 slots */
    rig_start(&g.r);
    for (int i = 0; i < 4; i++) deposit(&g, i); /* 0 and 1 spilled: G3 full */
    rig_g3_settle(&g.r);
    kvcr__test_g3_hold(g.r.kv, true);
    char k[32];
    const char *keys[] = {key(k, sizeof k, 0)};
    size_t at[] = {40};
    kvcr_op_handle op = rig_deliver(&g.r, keys, at, 1); /* a read of block 0, held */
    deposit(&g, 4); /* spills block 2: G3 must evict, and block 0 is being read */
    kvcr__test_g3_hold(g.r.kv, false);
    kvcr_entry_status st;
    rig_wait(&g.r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&g.r, g.r.fw + 40 * BS, 0));
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, 0).tier, KVCR_TIER_G3);      /* kept */
    assert_int_equal(query(&g, 1).status, KVCR_QUERY_MISS); /* evicted instead */
    assert_int_equal(query(&g, 2).tier, KVCR_TIER_G3);
    rig_stop(&g.r);
    g3_cleanup(&g);
}

typedef struct worker {
    g3_rig *g;
    int first;
    int failures;
} worker;

/* Deposits its own keys round after round and reads each back from
 * wherever it lives (DRAM or G3), comparing bytes. */
static void *churn(void *arg)
{
    worker *w = arg;
    for (int round = 0; round < 6; round++)
        for (int i = w->first; i < w->first + 8; i++) {
            char k[32];
            const char *keys[] = {key(k, sizeof k, i)};
            size_t src[] = {(size_t)i}, dst[] = {(size_t)(32 + i)};
            kvcr_entry_status st;
            rig_wait(&w->g->r, rig_deposit(&w->g->r, keys, src, 1, 0), &st, NULL, NULL);
            if (st != KVCR_ENTRY_SUCCESS) w->failures++;
            rig_wait(&w->g->r, rig_deliver(&w->g->r, keys, dst, 1), &st, NULL, NULL);
            /* a block whose spill is still being written is not readable yet */
            if (st == KVCR_ENTRY_SUCCESS &&
                !rig_has_pattern(&w->g->r, w->g->r.fw + (size_t)(32 + i) * BS, (uint32_t)i))
                w->failures += 1000;
        }
    return NULL;
}

static void test_concurrent_spills_and_reads(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 4, 2, 16);
    rig_start(&g.r);
    worker w[2] = {{&g, 0, 0}, {&g, 8, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, churn, &w[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    assert_int_equal(w[0].failures, 0);
    assert_int_equal(w[1].failures, 0);
    rig_g3_settle(&g.r);
    /* everything is somewhere: 4 in DRAM, the other 12 in G3 */
    for (int i = 0; i < 16; i++) assert_int_not_equal(query(&g, i).status, KVCR_QUERY_MISS);
    rig_stop(&g.r);
    g3_cleanup(&g);
}

/* Regression: a fetch of a block only a full G3 holds, with DRAM full. The
 * DRAM room it needs spills a victim into G3, whose eviction must not pick
 * the block being fetched (it did, and the next poll spun forever). */
static void test_fetch_from_full_g3_with_full_dram(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 1, 1, 1); /* 1 DRAM slot, 1 G3 slot */
    rig_start(&g.r);
    deposit(&g, 0);
    deposit(&g, 1); /* block 0 spilled: G3 full */
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, 0).tier, KVCR_TIER_G3);
    char k[32];
    kvcr_key kk = key_of(key(k, sizeof k, 0));
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(g.r.kv, &kk, 1, NULL, NULL, 0, &op), 0);
    size_t n;
    kvcr_op_result *res = rig_poll_results(&g.r, &n);
    assert_int_equal(n, 1);
    assert_int_equal(res[0].entries[0].status, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&g.r, res[0].entries[0].slots[0].addr, 0));
    kvcr_results_free(res);
    rig_g3_settle(&g.r);
    assert_int_equal(query(&g, 1).status, KVCR_QUERY_MISS); /* its spill found no room */
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void test_second_instance_on_same_files_is_refused(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 2, 2);
    rig_start(&g.r);
    kvcr_t *other = NULL;
    int rc = kvcr_create(&g.r.cfg, &other);
    assert_int_equal(rc, KVCR_EBUSY);
    assert_null(other);
    assert_non_null(strstr(kvcr_last_error(), "in use"));
    rig_stop(&g.r);
    /* released with the first instance: a new one may open them */
    rig again;
    rig_init(&again, BS, 4, 2);
    again.cfg.g3 = g.r.cfg.g3;
    rig_start(&again);
    rig_stop(&again);
    g3_cleanup(&g);
}

static void test_restart_finds_every_block_again(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 2, 8);
    rig_start(&g.r);
    for (int i = 0; i < 10; i++) deposit(&g, i);
    rig_g3_settle(&g.r);
    rig_stop(&g.r); /* the process's memory is gone; the files stay */

    rig_init(&g.r, BS, 64, 2);
    g.r.cfg.g3.paths = g.path_ptrs;
    g.r.cfg.g3.n_paths = 2;
    g.r.cfg.g3.capacity_bytes_per_file = 8 * BS;
    g.r.cfg.enable_telemetry = true;
    rig_start(&g.r);
    assert_int_equal(gauge(&g, "g3_allocated_slots"), 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(query(&g, i).tier, KVCR_TIER_G3);
        assert_int_equal(deliver(&g, i, (size_t)i, NULL), KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&g.r, g.r.fw + (size_t)i * BS, (uint32_t)i));
    }
    /* the recovered blocks were announced */
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(g.r.kv, &res, &n), 0);
    kvcr_results_free(res);
    assert_non_null(strstr(g.r.inventory_log, "block-7"));
    rig_stop(&g.r);
    g3_cleanup(&g);
}

/* Flips one bit of every data slot in the file, behind KVCR's back. */
static void flip_data_bits(const char *path)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    /* the data area is the end of the file: slots of BS bytes */
    for (off_t off = st.st_size - BS; off >= st.st_size - 8 * BS; off -= BS) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, off + 100), 1);
        b ^= 0x10;
        assert_int_equal(pwrite(fd, &b, 1, off + 100), 1);
    }
    fsync(fd);
    close(fd);
}

static void test_flipped_bit_is_a_miss_never_served(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 8);
    rig_start(&g.r);
    for (int i = 0; i < 6; i++) deposit(&g, i); /* 0..3 spilled */
    rig_g3_settle(&g.r);
    flip_data_bits(g.paths[0]);
    memset(g.r.fw + 50 * BS, 0xAB, BS);
    kvcr_reason why;
    assert_int_equal(deliver(&g, 0, 50, &why), KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_CORRUPT);
    /* the caller's memory is not reported as filled; the block is gone */
    assert_int_equal(query(&g, 0).status, KVCR_QUERY_MISS);
    assert_non_null(strstr(g.r.inventory_log, "-:block-0"));
    assert_int_equal(gauge(&g, "g3_total_slots"), 7); /* its slot is retired */
    rig_stop(&g.r);
    g3_cleanup(&g);
}

/* Flips one bit of the data of the file's first slot, behind KVCR's back. */
static void flip_first_slot(const g3_rig *g, size_t slots_per_file)
{
    int fd = open(g->paths[0], O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    off_t off = st.st_size - (off_t)(slots_per_file * BS) + 123;
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x04;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    fsync(fd);
    close(fd);
}

/* Spills go through a pool of staging buffers kept between spills: 18
 * spills through 2 buffers. Each block's bytes must come back exact after
 * a restart (a reused buffer holds the last block's bytes until the copy),
 * and the one whose slot was damaged on disk is a miss, never bytes. */
static void test_spills_reuse_staging_buffers_and_verify_after_restart(void **state)
{
    (void)state;
    enum { DRAM = 2, SLOTS = 24, N = 20 };
    g3_rig g;
    g3_init(&g, DRAM, 1, SLOTS);
    g.r.cfg.g3.max_staging_bytes = 2 * BS;
    rig_start(&g.r);
    for (int i = 0; i < N; i++) {
        deposit(&g, i);
        rig_g3_settle(&g.r); /* the buffer is back in the pool before the next spill */
    }
    assert_int_equal(gauge(&g, "g3_allocated_slots"), N - DRAM);
    rig_stop(&g.r);
    flip_first_slot(&g, SLOTS);

    rig_init(&g.r, BS, 64, DRAM);
    g.r.cfg.g3.paths = g.path_ptrs;
    g.r.cfg.g3.n_paths = 1;
    g.r.cfg.g3.capacity_bytes_per_file = SLOTS * BS;
    g.r.cfg.enable_telemetry = true;
    rig_start(&g.r);
    assert_int_equal(gauge(&g, "g3_allocated_slots"), N - DRAM);
    int corrupt = 0;
    for (int i = 0; i < N - DRAM; i++) {
        memset(g.r.fw + 40 * BS, 0, BS);
        kvcr_reason why = KVCR_REASON_NONE;
        kvcr_entry_status st = deliver(&g, i, 40, &why);
        if (st == KVCR_ENTRY_SUCCESS) {
            assert_true(rig_has_pattern(&g.r, g.r.fw + 40 * BS, (uint32_t)i));
            continue;
        }
        assert_int_equal(st, KVCR_ENTRY_FAILED);
        assert_int_equal(why, KVCR_REASON_CORRUPT);
        assert_int_equal(query(&g, i).status, KVCR_QUERY_MISS);
        corrupt++;
    }
    assert_int_equal(corrupt, 1); /* exactly the block in the damaged slot */
    rig_stop(&g.r);
    g3_cleanup(&g);
}

/* While the staging buffers are all in use (the disk has not taken their
 * writes yet), a further spill is refused and its block dropped; the
 * staged ones, in buffers taken from the pool, land exact once the disk
 * moves again. */
static void test_spill_past_the_staging_bound_is_dropped_whole(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 8);
    g.r.cfg.g3.max_staging_bytes = 2 * BS;
    rig_start(&g.r);
    for (int i = 0; i < 4; i++) deposit(&g, i); /* 0 and 1 spilled: two buffers in the pool */
    rig_g3_settle(&g.r);
    kvcr__test_g3_hold(g.r.kv, true); /* the writes wait in the I/O thread's queue */
    deposit(&g, 4);                   /* spills block 2 */
    deposit(&g, 5);                   /* spills block 3: staging full */
    deposit(&g, 6);                   /* block 4 cannot be staged: dropped */
    assert_int_equal(gauge(&g, "g3_pending_stores"), 2);
    assert_int_equal(query(&g, 4).status, KVCR_QUERY_MISS);
    /* A spill still being written is on its way, not gone. */
    assert_int_equal(query(&g, 2).status, KVCR_QUERY_FETCHING);
    assert_int_equal(query(&g, 2).tier, KVCR_TIER_G3);
    kvcr__test_g3_hold(g.r.kv, false);
    rig_g3_settle(&g.r);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(query(&g, i).tier, KVCR_TIER_G3);
        assert_int_equal(deliver(&g, i, (size_t)(40 + i), NULL), KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&g.r, g.r.fw + (size_t)(40 + i) * BS, (uint32_t)i));
    }
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void expect_refused(void (*tweak)(g3_rig *g), const char *message)
{
    g3_rig g;
    g3_init(&g, 2, 1, 2);
    tweak(&g);
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr_create(&g.r.cfg, &kv), KVCR_EINVAL);
    assert_null(kv);
    if (strstr(kvcr_last_error(), message) == NULL)
        fail_msg("got '%s', want '%s'", kvcr_last_error(), message);
    rig_stop(&g.r);
    g3_cleanup(&g);
}

static void no_dram(g3_rig *g)
{
    g->r.cfg.n_local_dram = 0;
    g->r.cfg.local_dram = NULL;
    g->r.cfg.remote.enabled = true;
}
static void no_paths(g3_rig *g) { g->r.cfg.g3.paths = NULL, g->r.cfg.g3.n_paths = 0, g->r.cfg.g3.paths = g->path_ptrs; }
static void partial_slot(g3_rig *g) { g->r.cfg.g3.capacity_bytes_per_file = BS + 1; }
static void no_staging(g3_rig *g) { g->r.cfg.g3.max_staging_bytes = 0; }

static void test_g3_config_rules(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g, 2, 1, 2);
    rig_start(&g.r);
    kvcr_mem_ref refs[2] = {{NULL, "", 0}, {NULL, "", 1}};
    kvcr_block b = {key_of("two"), refs, 2};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(g.r.kv, &b, 1, 0, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "G3 does not support multi-block layouts");
    const char *layout[] = {"", ""};
    assert_int_equal(kvcr_fetch(g.r.kv, &b.key, 1, NULL, layout, 2, &op), KVCR_EINVAL);
    rig_stop(&g.r);
    g3_cleanup(&g);
    expect_refused(no_dram, "G3 requires local DRAM");
    expect_refused(no_paths, "G3 requires at least one file path");
    expect_refused(partial_slot, "complete slots");
    expect_refused(no_staging, "max_staging_bytes must be positive");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evicted_blocks_spill_and_come_back_exact),
        cmocka_unit_test(test_full_g3_evicts_oldest_first),
        cmocka_unit_test(test_spill_order_follows_fifo_and_lru),
        cmocka_unit_test(test_failed_spill_and_read_fail_cleanly),
        cmocka_unit_test(test_block_being_read_is_not_evicted),
        cmocka_unit_test(test_concurrent_spills_and_reads),
        cmocka_unit_test(test_fetch_from_full_g3_with_full_dram),
        cmocka_unit_test(test_second_instance_on_same_files_is_refused),
        cmocka_unit_test(test_restart_finds_every_block_again),
        cmocka_unit_test(test_flipped_bit_is_a_miss_never_served),
        cmocka_unit_test(test_spills_reuse_staging_buffers_and_verify_after_restart),
        cmocka_unit_test(test_spill_past_the_staging_bound_is_dropped_whole),
        cmocka_unit_test(test_g3_config_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
