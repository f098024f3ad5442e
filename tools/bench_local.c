/* kvcr bench local: query latency, same-process copy bandwidth against a
 * plain memcpy of the same bytes, and metadata per resident block. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "core/testing.h"
#include "kvcr/kvcr.h"

enum { KEY_LEN = 32, BATCH = 4096, QUERY_BATCH = 32 };

typedef struct inst {
    kvcr_t *kv;
    uint8_t *fw, *pool;
    size_t block, n_fw, n_slots;
} inst;

/* aligned_alloc wants a size that is a multiple of the alignment. */
static void *page_alloc(size_t size)
{
    return aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
}

static void inst_start(inst *in, size_t block, size_t n_fw, size_t n_slots, uint32_t threads)
{
    in->block = block;
    in->n_fw = n_fw;
    in->n_slots = n_slots;
    in->fw = page_alloc(block * n_fw);
    in->pool = page_alloc(block * n_slots);
    if (in->fw == NULL || in->pool == NULL) {
        fprintf(stderr, "kvcr: out of memory for the benchmark buffers\n");
        exit(1);
    }
    memset(in->fw, 1, block * n_fw);
    memset(in->pool, 0, block * n_slots);
    kvcr_pool_layout layout = {"", block};
    kvcr_dram_pool pool = {"", in->pool, block * n_slots};
    kvcr_region region = {.addr = in->fw, .element_size = block, .count = n_fw, .label = ""};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = "bench";
    cfg.pool_layouts = &layout;
    cfg.n_pool_layouts = 1;
    cfg.local_dram = &pool;
    cfg.n_local_dram = 1;
    cfg.framework_regions = &region;
    cfg.n_framework_regions = 1;
    cfg.copy_threads = threads;
    cfg.operation_timeout_ms = 60000;
    cfg.abandon_timeout_ms = 120000;
    bench_check(kvcr_create(&cfg, &in->kv), "kvcr_create");
}

static void inst_stop(inst *in)
{
    kvcr_free(in->kv);
    free(in->fw);
    free(in->pool);
}

static void make_key(uint8_t *k, uint64_t round, uint64_t i)
{
    memset(k, 0, KEY_LEN);
    memcpy(k, &i, sizeof i);
    memcpy(k + 8, &round, sizeof round);
    k[KEY_LEN - 1] = 0x5a;
}

/* Polls until op completes (60 s at most); returns its successful entries. */
static size_t wait_op(kvcr_t *kv, kvcr_op_handle op)
{
    double until = bench_now() + 60;
    while (bench_now() < until) {
        kvcr_op_result *res;
        size_t n, ok = 0;
        bool found = false;
        bench_check(kvcr_poll(kv, &res, &n), "kvcr_poll");
        for (size_t i = 0; i < n; i++) {
            if (res[i].op != op) continue;
            found = true;
            for (size_t j = 0; j < res[i].n_entries; j++)
                ok += res[i].entries[j].status == KVCR_ENTRY_SUCCESS;
        }
        kvcr_results_free(res);
        if (found) return ok;
    }
    fprintf(stderr, "kvcr: an operation did not complete within 60 s\n");
    exit(1);
}

/* Moves keys [first, first+n) of `round` between framework blocks
 * fw_of(i) and KVCR DRAM; returns the successful entries. */
static size_t move(inst *in, bool deliver, uint64_t round, size_t first, size_t n, size_t shift)
{
    uint8_t (*keys)[KEY_LEN] = malloc(n * KEY_LEN);
    kvcr_block *b = malloc(n * sizeof *b);
    kvcr_mem_ref *refs = malloc(n * sizeof *refs);
    for (size_t i = 0; i < n; i++) {
        make_key(keys[i], round, first + i);
        refs[i] = (kvcr_mem_ref){NULL, "", (first + i + shift) % in->n_fw};
        b[i] = (kvcr_block){{keys[i], KEY_LEN}, &refs[i], 1};
    }
    kvcr_op_handle op;
    bench_check(deliver ? kvcr_deliver(in->kv, b, n, NULL, &op) : kvcr_deposit(in->kv, b, n, 0, &op),
                deliver ? "kvcr_deliver" : "kvcr_deposit");
    size_t ok = wait_op(in->kv, op);
    free(keys);
    free(b);
    free(refs);
    return ok;
}

/* ---- query and metadata ------------------------------------------------- */

static void bench_query(const bench_out *o, size_t n_blocks, const char *name, bool quick,
                        bool report_metadata)
{
    inst in;
    inst_start(&in, 64, BATCH, n_blocks, 2);
    for (size_t first = 0; first < n_blocks; first += BATCH) {
        size_t n = n_blocks - first < BATCH ? n_blocks - first : BATCH;
        if (move(&in, false, 0, first, n, 0) != n) {
            fprintf(stderr, "kvcr: deposit of the query set failed\n");
            exit(1);
        }
    }
    size_t calls = quick ? 2000 : 25000;
    uint8_t (*qk)[KEY_LEN] = malloc(calls * QUERY_BATCH * KEY_LEN);
    kvcr_key *q = malloc(calls * QUERY_BATCH * sizeof *q);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < calls * QUERY_BATCH; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        make_key(qk[i], 0, x % n_blocks);
        q[i] = (kvcr_key){qk[i], KEY_LEN};
    }
    kvcr_query_result out[QUERY_BATCH];
    double best = 1e30;
    size_t hits = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = bench_now();
        for (size_t c = 0; c < calls; c++) {
            bench_check(kvcr_query(in.kv, q + c * QUERY_BATCH, QUERY_BATCH, NULL, out), "kvcr_query");
            hits += out[QUERY_BATCH - 1].status == KVCR_QUERY_HIT;
        }
        double ns = (bench_now() - t0) * 1e9 / (double)(calls * QUERY_BATCH);
        if (ns < best) best = ns;
    }
    if (hits != 5 * calls) {
        fprintf(stderr, "kvcr: query missed resident blocks (%zu of %zu hits)\n", hits, 5 * calls);
        exit(1);
    }
    bench_report(o, name, best, "ns", NULL, 0, false, "<= 100 ns/key at 1M");
    if (report_metadata) {
        uint64_t records;
        size_t bytes = kvcr__test_metadata_bytes(in.kv, &records);
        bench_report(o, "metadata_per_block", (double)bytes / (double)records, "B", NULL, 0, false,
                     "<= 128 B");
    }
    free(qk);
    free(q);
    inst_stop(&in);
}

/* ---- bandwidth ---------------------------------------------------------- */

static void fill_block(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++) w[i] = seed * 0x9E3779B97F4A7C15ull + i;
}

static bool block_is(const uint8_t *p, size_t len, uint64_t seed)
{
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != seed * 0x9E3779B97F4A7C15ull + i) return false;
    return true;
}

static double memcpy_gbs(inst *in, size_t n, int rounds, bool to_pool)
{
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        for (size_t i = 0; i < n; i++) {
            uint8_t *f = in->fw + i * in->block, *p = in->pool + i * in->block;
            memcpy(to_pool ? p : f, to_pool ? f : p, in->block);
        }
        double gbs = (double)(n * in->block) / (bench_now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

static void bench_bandwidth(const bench_out *o, uint32_t threads, bool quick)
{
    enum { BLOCK = 2u << 20 };
    size_t n = quick ? 16 : 64;
    int rounds = quick ? 3 : 8;
    inst in;
    inst_start(&in, BLOCK, n, n, threads);
    for (size_t i = 0; i < n; i++) fill_block(in.fw + i * BLOCK, BLOCK, i + 1);
    double base_in = memcpy_gbs(&in, n, rounds, true);
    double best_dep = 0, best_del = 0;
    for (int r = 0; r < rounds; r++) {
        /* New keys each round: LRU evicts the previous round's blocks. */
        double t0 = bench_now();
        if (move(&in, false, (uint64_t)r + 1, 0, n, 0) != n) goto failed;
        double gbs = (double)(n * BLOCK) / (bench_now() - t0) / 1e9;
        if (gbs > best_dep) best_dep = gbs;
    }
    double base_out = memcpy_gbs(&in, n, rounds, false);
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        if (move(&in, true, (uint64_t)rounds, 0, n, 0) != n) goto failed;
        double gbs = (double)(n * BLOCK) / (bench_now() - t0) / 1e9;
        if (gbs > best_del) best_del = gbs;
    }
    /* Verify: deliver key i into framework block i+1 and check every byte.
     * (The pool -> framework baseline only reads KVCR's slots.) */
    if (move(&in, true, (uint64_t)rounds, 0, n, 1) != n) goto failed;
    for (size_t i = 0; i < n; i++)
        if (!block_is(in.fw + ((i + 1) % n) * BLOCK, BLOCK, i + 1)) {
            fprintf(stderr, "kvcr: delivered block %zu has wrong bytes\n", i);
            exit(1);
        }
    char name[64];
    snprintf(name, sizeof name, "deposit_2mib_%ut", threads);
    bench_report(o, name, best_dep, "GB/s", "memcpy", base_in, true, ">= 0.9x memcpy");
    snprintf(name, sizeof name, "deliver_2mib_%ut", threads);
    bench_report(o, name, best_del, "GB/s", "memcpy", base_out, true, ">= 0.9x memcpy");
    inst_stop(&in);
    return;
failed:
    fprintf(stderr, "kvcr: a copy of the bandwidth set failed\n");
    exit(1);
}

int bench_local(int argc, char **argv)
{
    bench_out o = {"local", false};
    bool quick = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            o.json = true;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else {
            fprintf(stderr, "usage: kvcr bench local [--json] [--quick]\n");
            return 2;
        }
    }
    if (!o.json)
        printf("kvcr bench local%s (ratios are ours over the baseline, measured in this run)\n",
               quick ? " --quick" : "");
    bench_query(&o, 10000, "query_10k", quick, false);
    bench_query(&o, quick ? 100000 : 1000000, quick ? "query_100k" : "query_1m", quick, true);
    bench_bandwidth(&o, 1, quick);
    bench_bandwidth(&o, 2, quick);
    return 0;
}
