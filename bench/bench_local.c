/* kvcr-bench local: query latency, same-process copy bandwidth against a
 * plain memcpy of the same bytes, metadata per resident block, and the
 * cost of KV events on deposits (against the same deposits without). */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "kvcr/testing.h"
#include "kvcr/kvcr.h"

enum {
    KEY_LEN = 32,
    FILL_BATCH = 4096,  /* blocks per deposit while filling the query set */
    QUERY_BATCH = 32,   /* keys per kvcr_query, an engine's usual batch */
    QUERY_BLOCK = 64,   /* small blocks so 1M of them fit in memory */
    BIG_BLOCK = 2u << 20,
    QUERY_REPS = 5,
    MAX_ROUNDS = 8
};

/* KVCR's own deadline comes first, so a stuck copy is reported with its
 * reason rather than by our wait giving up. */
#define OP_TIMEOUT_MS 30000u
#define WAIT_LIMIT_S 35.0
/* Repetitions of one timed case stop early once this much time went by. */
#define CASE_BUDGET_S 5.0

typedef struct inst {
    kvcr_t *kv;
    int fd;
    uint8_t *fw, *pool;
    size_t block, n_fw, n_slots;
} inst;

/* The blocks of one operation, rebuilt in place for each round. */
typedef struct batch {
    size_t n;
    uint8_t (*keys)[KEY_LEN];
    kvcr_mem_ref *refs;
    kvcr_block *blocks;
} batch;

enum op_kind { DEPOSIT, DELIVER };

static void *xmalloc(size_t size)
{
    void *p = malloc(size);
    if (p == NULL) bench_fail("out of memory (%zu bytes)", size);
    return p;
}

/* aligned_alloc wants a size that is a multiple of the alignment. */
static void *page_alloc(size_t size)
{
    void *p = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (p == NULL) bench_fail("out of memory for the benchmark buffers (%zu bytes)", size);
    return p;
}

/* The key adapter of the KV-events case: a key's first 8 bytes. */
static int first8(void *ud, const kvcr_key *key, uint64_t *hash)
{
    (void)ud;
    memcpy(hash, key->data, 8);
    return 0;
}

/* What a case asks of its instance beyond sizes (NULL: nothing). */
typedef struct inst_opts {
    const char *events;        /* a KV-event endpoint to publish on, or NULL */
    const kvcr_tenant *tenants; /* cfg.tenants */
    size_t n_tenants;
    const char *policy;        /* a built-in policy, or NULL: the default */
} inst_opts;

static void inst_start(inst *in, size_t block, size_t n_fw, size_t n_slots, uint32_t threads,
                       const inst_opts *opts)
{
    const char *events = opts ? opts->events : NULL;
    in->block = block;
    in->n_fw = n_fw;
    in->n_slots = n_slots;
    in->fw = page_alloc(block * n_fw);
    in->pool = page_alloc(block * n_slots);
    /* Touch every page now so no case pays for page faults. */
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
    cfg.operation_timeout_ms = OP_TIMEOUT_MS;
    cfg.abandon_timeout_ms = 2 * OP_TIMEOUT_MS;
    if (events) {
        cfg.callbacks.key_hash = first8;
        cfg.kv_events.endpoint = events;
        cfg.kv_events.topic = "kv@bench@local";
    }
    if (opts && opts->tenants) {
        cfg.tenants = opts->tenants;
        cfg.n_tenants = opts->n_tenants;
    }
    if (opts && opts->policy) cfg.policy = kvcr_policy_builtin(opts->policy);
    bench_check(kvcr_create(&cfg, &in->kv), "kvcr_create");
    in->fd = kvcr_fd(in->kv);
    if (in->fd < 0) bench_check(in->fd, "kvcr_fd");
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

static void batch_init(batch *b, size_t n)
{
    b->n = n;
    b->keys = xmalloc(n * KEY_LEN);
    b->refs = xmalloc(n * sizeof *b->refs);
    b->blocks = xmalloc(n * sizeof *b->blocks);
}

static void batch_free(batch *b)
{
    free(b->keys);
    free(b->refs);
    free(b->blocks);
}

/* Keys [first, first+n) of `round`; key i's framework element is
 * (i + shift) mod n_fw. */
static void batch_set(batch *b, const inst *in, uint64_t round, size_t first, size_t n,
                      size_t shift)
{
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        make_key(b->keys[i], round, first + i);
        b->refs[i] = (kvcr_mem_ref){NULL, "", (first + i + shift) % in->n_fw};
        b->blocks[i] = (kvcr_block){{b->keys[i], KEY_LEN}, &b->refs[i], 1};
    }
}

/* Runs one deposit (with these hints, JSON text or NULL) or deliver of the
 * batch to completion; returns the seconds from submission to the last
 * result. */
static double run_op(inst *in, enum op_kind kind, const batch *b, const char *hints)
{
    const char *what = kind == DEPOSIT ? "kvcr_deposit" : "kvcr_deliver";
    kvcr_deposit_options opts = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .hints = hints,
                                 .hints_len = hints ? strlen(hints) : 0};
    kvcr_op_handle op;
    double t0 = tool_now();
    bench_check(kind == DEPOSIT ? kvcr_deposit_ex(in->kv, b->blocks, b->n, &opts, &op)
                                : kvcr_deliver(in->kv, b->blocks, b->n, NULL, &op),
                what);
    const kvcr_op_result *mine;
    kvcr_op_result *res = bench_wait_op(in->kv, in->fd, op, b->n, what, WAIT_LIMIT_S, &mine);
    double s = tool_now() - t0;
    kvcr_results_free(res);
    return s;
}

/* ---- query and metadata ------------------------------------------------- */

typedef struct query_case {
    size_t n_blocks;
    const char *name, *goal;
    const char *meta_name, *meta_goal; /* meta_name NULL: no metadata figure */
} query_case;

static void fill_query_set(inst *in, size_t n_blocks)
{
    batch b;
    batch_init(&b, FILL_BATCH);
    for (size_t first = 0; first < n_blocks; first += FILL_BATCH) {
        size_t n = n_blocks - first < FILL_BATCH ? n_blocks - first : FILL_BATCH;
        batch_set(&b, in, 0, first, n, 0);
        run_op(in, DEPOSIT, &b, NULL);
    }
    batch_free(&b);
}

static void bench_query(bench_out *o, const query_case *c, bool quick)
{
    inst in;
    inst_start(&in, QUERY_BLOCK, FILL_BATCH, c->n_blocks, 2, NULL);
    fill_query_set(&in, c->n_blocks);

    /* The keys sit in a caller buffer, as an engine's freshly built batch
     * would; drawn at random (xorshift64) from the resident set. */
    size_t calls = quick ? 2000 : 25000, n_keys = calls * QUERY_BATCH;
    uint8_t (*qk)[KEY_LEN] = xmalloc(n_keys * KEY_LEN);
    kvcr_key *q = xmalloc(n_keys * sizeof *q);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n_keys; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        make_key(qk[i], 0, x % c->n_blocks);
        q[i] = (kvcr_key){qk[i], KEY_LEN};
    }
    kvcr_query_result out[QUERY_BATCH];
    /* Untimed: every answer must be a HIT. */
    for (size_t k = 0; k < calls; k++) {
        bench_check(kvcr_query(in.kv, q + k * QUERY_BATCH, QUERY_BATCH, NULL, out), "kvcr_query");
        for (size_t j = 0; j < QUERY_BATCH; j++)
            if (out[j].status != KVCR_QUERY_HIT)
                bench_fail("resident key %zu answered %s", k * QUERY_BATCH + j,
                           kvcr_query_status_name(out[j].status));
    }
    double best = 1e30, until = tool_now() + CASE_BUDGET_S;
    size_t hits = 0, done = 0;
    for (int rep = 0; rep < QUERY_REPS && (rep == 0 || tool_now() < until); rep++) {
        double t0 = tool_now();
        for (size_t k = 0; k < calls; k++) {
            bench_check(kvcr_query(in.kv, q + k * QUERY_BATCH, QUERY_BATCH, NULL, out),
                        "kvcr_query");
            hits += out[k % QUERY_BATCH].status == KVCR_QUERY_HIT;
        }
        double ns = (tool_now() - t0) * 1e9 / (double)n_keys;
        if (ns < best) best = ns;
        done += calls;
    }
    if (hits != done) bench_fail("query missed resident blocks (%zu of %zu sampled)", hits, done);
    bench_report(o, &(bench_figure){.name = c->name, .value = best, .unit = "ns", .goal = c->goal});

    if (c->meta_name) {
        uint64_t records;
        size_t bytes = kvcr__test_metadata_bytes(in.kv, &records);
        if (records != c->n_blocks)
            bench_fail("%llu records resident, %zu deposited", (unsigned long long)records,
                       c->n_blocks);
        bench_report(o, &(bench_figure){.name = c->meta_name,
                                        .value = (double)bytes / (double)records,
                                        .unit = "B",
                                        .goal = c->meta_goal});
    }
    free(qk);
    free(q);
    inst_stop(&in);
}

/* ---- bandwidth ---------------------------------------------------------- */

/* The baseline: one thread copying the same blocks between the same two
 * buffers, element i to slot i (or back), best of the rounds. */
static double memcpy_gbs(inst *in, int rounds, bool to_pool)
{
    double best = 0, until = tool_now() + CASE_BUDGET_S;
    for (int r = 0; r < rounds && (r == 0 || tool_now() < until); r++) {
        double t0 = tool_now();
        for (size_t i = 0; i < in->n_fw; i++) {
            uint8_t *f = in->fw + i * in->block, *p = in->pool + i * in->block;
            memcpy(to_pool ? p : f, to_pool ? f : p, in->block);
        }
        double v = bench_gbs(in->n_fw * in->block, tool_now() - t0);
        if (v > best) best = v;
    }
    return best;
}

/* After the last deposit: fetch the batch's keys and compare every slot with
 * the framework element it was deposited from. */
static void check_pool(inst *in, const batch *b)
{
    kvcr_key *keys = xmalloc(b->n * sizeof *keys);
    for (size_t i = 0; i < b->n; i++) keys[i] = b->blocks[i].key;
    kvcr_op_handle op;
    bench_check(kvcr_fetch(in->kv, keys, b->n, NULL, NULL, 0, &op), "kvcr_fetch");
    const kvcr_op_result *mine;
    kvcr_op_result *res =
        bench_wait_op(in->kv, in->fd, op, b->n, "kvcr_fetch", WAIT_LIMIT_S, &mine);
    kvcr_release_handle *rh = xmalloc(b->n * sizeof *rh);
    bool *released = xmalloc(b->n * sizeof *released);
    for (size_t i = 0; i < b->n; i++) {
        const kvcr_entry_result *e = &mine->entries[i];
        const uint8_t *src = in->fw + b->refs[i].index * in->block;
        if (e->n_slots != 1 || e->slots[0].size != in->block ||
            memcmp(e->slots[0].addr, src, in->block) != 0)
            bench_fail("deposited block %zu differs from its source", i);
        rh[i] = e->release_handle;
    }
    bench_check(kvcr_release(in->kv, rh, b->n, released), "kvcr_release");
    for (size_t i = 0; i < b->n; i++)
        if (!released[i]) bench_fail("the claim of fetched block %zu was not live", i);
    kvcr_results_free(res);
    free(keys);
    free(rh);
    free(released);
}

/* After the last deliver: every element holds the bytes of the key
 * delivered into it, key i having been deposited from element i. */
static void check_region(const inst *in, const batch *b)
{
    uint8_t *expect = page_alloc(in->block);
    for (size_t i = 0; i < b->n; i++) {
        bench_fill_block(expect, in->block, i + 1);
        if (memcmp(in->fw + b->refs[i].index * in->block, expect, in->block) != 0)
            bench_fail("delivered block %zu differs from what was deposited", i);
    }
    free(expect);
}

static void report_bw(bench_out *o, const char *what, uint32_t threads, double v, double base)
{
    char name[32];
    snprintf(name, sizeof name, "%s_2mib_%ut", what, threads);
    bench_report(o, &(bench_figure){.name = name,
                                    .value = v,
                                    .unit = "GB/s",
                                    .baseline = "memcpy",
                                    .baseline_value = base});
}

static void bench_bandwidth(bench_out *o, uint32_t threads, bool quick)
{
    /* 64 x 2 MiB on each side: 256 MiB in all, well past the caches. */
    size_t n = quick ? 16 : 64;
    int rounds = quick ? 3 : MAX_ROUNDS;
    size_t bytes = n * BIG_BLOCK;
    inst in;
    inst_start(&in, BIG_BLOCK, n, n, threads, NULL);
    for (size_t i = 0; i < n; i++) bench_fill_block(in.fw + i * BIG_BLOCK, BIG_BLOCK, i + 1);
    batch b;
    batch_init(&b, n);

    /* The pool holds nothing yet, so the baseline may write it. */
    double base_in = memcpy_gbs(&in, rounds, true);
    double dep = 0, until = tool_now() + CASE_BUDGET_S;
    uint64_t round = 0;
    while (round < (uint64_t)rounds && (round == 0 || tool_now() < until)) {
        /* New keys each round: LRU evicts the previous round's blocks. */
        batch_set(&b, &in, ++round, 0, n, 0);
        double v = bench_gbs(bytes, run_op(&in, DEPOSIT, &b, NULL));
        if (v > dep) dep = v;
    }
    check_pool(&in, &b);

    /* From here the baseline only reads KVCR's slots. */
    double base_out = memcpy_gbs(&in, rounds, false);
    double del = 0;
    until = tool_now() + CASE_BUDGET_S;
    for (int r = 0; r < rounds && (r == 0 || tool_now() < until); r++) {
        /* A new destination each round, so a deliver that copied nothing
         * would leave the wrong bytes behind for check_region. */
        batch_set(&b, &in, round, 0, n, (size_t)r + 1);
        double v = bench_gbs(bytes, run_op(&in, DELIVER, &b, NULL));
        if (v > del) del = v;
    }
    check_region(&in, &b);

    report_bw(o, "deposit", threads, dep, base_in);
    report_bw(o, "deliver", threads, del, base_out);
    batch_free(&b);
    inst_stop(&in);
}

/* ---- KV events ------------------------------------------------------------ */

/* Small-block deposits per second (each deposit of FILL_BATCH blocks into
 * a pool that evicts as much: a BlockStored and a BlockRemoved per block),
 * polled to completion. With tenants (BENCH_TENANTS) the pool is twice as
 * large and a quiet tenant's FILL_BATCH blocks fill half of it first; the
 * rounds are then the flooding tenant's, and *quiet_kept (if not NULL)
 * says how many of the quiet tenant's blocks are resident at the end. */
#define BENCH_QUIET "{\"tenant\":\"quiet\"}"
#define BENCH_FLOOD "{\"tenant\":\"flood\"}"
static const kvcr_tenant BENCH_TENANTS[] = {{"quiet", FILL_BATCH, 0}, {"flood", FILL_BATCH, 0}};

static double deposit_rate(const inst_opts *opts, bool quick, size_t *quiet_kept)
{
    bool tenants = opts->tenants != NULL;
    size_t slots = tenants ? 2 * FILL_BATCH : FILL_BATCH;
    inst in;
    inst_start(&in, QUERY_BLOCK, FILL_BATCH, slots, 2, opts);
    batch b;
    batch_init(&b, FILL_BATCH);
    if (tenants) {
        batch_set(&b, &in, 0, 0, FILL_BATCH, 0); /* round 0: the quiet tenant's keys */
        run_op(&in, DEPOSIT, &b, BENCH_QUIET);
    }
    int rounds = quick ? 20 : 200;
    double best = 0, until = tool_now() + CASE_BUDGET_S;
    for (int r = 0; r < rounds && (r < 2 || tool_now() < until); r++) {
        batch_set(&b, &in, (uint64_t)r + 1, 0, FILL_BATCH, 0);
        double s = run_op(&in, DEPOSIT, &b, tenants ? BENCH_FLOOD : NULL);
        double v = (double)FILL_BATCH / s / 1e6;
        if (r > 0 && v > best) best = v; /* the first round fills an empty pool */
    }
    if (quiet_kept != NULL) {
        batch_set(&b, &in, 0, 0, FILL_BATCH, 0);
        kvcr_key *k = xmalloc(FILL_BATCH * sizeof *k);
        kvcr_query_result *q = xmalloc(FILL_BATCH * sizeof *q);
        for (size_t i = 0; i < FILL_BATCH; i++) k[i] = b.blocks[i].key;
        bench_check(kvcr_query(in.kv, k, FILL_BATCH, NULL, q), "kvcr_query");
        *quiet_kept = 0;
        for (size_t i = 0; i < FILL_BATCH; i++) *quiet_kept += q[i].status == KVCR_QUERY_HIT;
        free(k);
        free(q);
    }
    batch_free(&b);
    inst_stop(&in);
    return best;
}

/* Deposits of 64-byte blocks with KV events published (bound on an ipc
 * endpoint, no subscriber: the encoding, batching and sending all run)
 * against the same deposits without events, in this run. */
static void bench_events(bench_out *o, bool quick)
{
    char dir[] = "/tmp/kvcr-bench-events-XXXXXX", endpoint[96], path[64];
    if (mkdtemp(dir) == NULL) bench_fail("mkdtemp failed");
    snprintf(path, sizeof path, "%s/pub", dir);
    snprintf(endpoint, sizeof endpoint, "ipc://%s", path);
    double base = deposit_rate(&(inst_opts){0}, quick, NULL);
    double with = deposit_rate(&(inst_opts){.events = endpoint}, quick, NULL);
    unlink(path);
    rmdir(dir);
    bench_report(o, &(bench_figure){.name = "deposit_kv_events_64b",
                                    .value = with,
                                    .unit = "Mblocks/s",
                                    .baseline = "deposit without events",
                                    .baseline_value = base});
}

/* ---- tenants -------------------------------------------------------------- */

/* Evicting deposits of a flooding tenant while a quiet one holds its
 * quota: tenant_lru (victims from tenants over their quota first) against
 * plain lru over the same tenants, in this run. tenant_lru must keep every
 * quiet block; lru evicts them. */
static void bench_tenants(bench_out *o, bool quick)
{
    size_t kept_lru, kept_quota;
    const inst_opts lru = {.tenants = BENCH_TENANTS, .n_tenants = 2, .policy = "lru"};
    const inst_opts quota = {.tenants = BENCH_TENANTS, .n_tenants = 2, .policy = "tenant_lru"};
    double base = deposit_rate(&lru, quick, &kept_lru);
    double with = deposit_rate(&quota, quick, &kept_quota);
    if (kept_quota != FILL_BATCH)
        bench_fail("tenant_lru kept %zu of the quiet tenant's %u blocks", kept_quota, FILL_BATCH);
    if (kept_lru != 0)
        bench_fail("lru kept %zu of the quiet tenant's blocks through the flood", kept_lru);
    bench_report(o, &(bench_figure){.name = "deposit_tenant_lru_64b",
                                    .value = with,
                                    .unit = "Mblocks/s",
                                    .baseline = "the same deposits under lru",
                                    .baseline_value = base});
}

/* ---- entry -------------------------------------------------------------- */

static const query_case full_sizes[] = {
    {10000, "query_10k", NULL, NULL, NULL},
    {1000000, "query_1m", "<= 100 ns", "metadata_1m", "<= 128 B"},
};
/* Goals are set at 1M blocks; the quick sizes carry none. */
static const query_case quick_sizes[] = {
    {10000, "query_10k", NULL, NULL, NULL},
    {100000, "query_100k", NULL, "metadata_100k", NULL},
};
_Static_assert(sizeof full_sizes == sizeof quick_sizes, "the quick run has the same cases");

int bench_local(int argc, char **argv)
{
    bench_out o = {.bench = "local"};
    bool quick;
    if (!bench_options(argc, argv, &o, &quick)) return 2;
    if (!o.json)
        printf("kvcr-bench local%s: ratio = ours / baseline, both measured in this run\n\n",
               quick ? " --quick" : "");
    const query_case *sizes = quick ? quick_sizes : full_sizes;
    for (size_t i = 0; i < sizeof full_sizes / sizeof *full_sizes; i++)
        bench_query(&o, &sizes[i], quick);
    bench_bandwidth(&o, 1, quick);
    bench_bandwidth(&o, 2, quick);
    bench_events(&o, quick);
    bench_tenants(&o, quick);
    return 0;
}
