/* A source under load from real target processes on 127.0.0.1. This test
 * process is the source (its KVCR DRAM holds k0..k<N-1>, pattern i); the
 * targets are kvcr-test-peer processes running PEER_CMD_PULL jobs.
 *
 *   - a start_write over the per-peer, the total or the pin-request limit
 *     is refused: the target's entries fail SOURCE_BUSY, nothing is written,
 *     the refusal is counted, and the same target is served again once it
 *     is under the limit;
 *   - 8 targets at once, 7 flooding over their per-peer limit and one
 *     well-behaved: every completed transfer's bytes are right, every
 *     failure is a SOURCE_BUSY refusal that the source counted, the
 *     well-behaved target never meets one, the source never holds more
 *     writes than the limits allow, and its memory stays bounded.
 *
 * KVCR_LOAD_FLOOD_MS sets the flood's length (default 4000 ms, 2000 under
 * sanitizers; nothing
 * asserted depends on how many operations fit in it), KVCR_LOAD_OP_MS the
 * source's operation timeout in the flood (default HELD_MS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "peer.h"

#define BS 4096
#define KEYS 256 /* k0..k255 in the source's KVCR DRAM */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1 /* slower, and their own memory (quarantine, shadow) grows */
#else
#define SANITIZED 0
#endif

/* The operation timeout of the source and the targets: no operation here
 * may meet its deadline, nor the source's stall detector (a progress turn
 * later than it) fire, also under sanitizers on a loaded machine. The
 * fences of ended writes are kept four times as long (2 * abandon timeout),
 * so the flood's memory figure uses KVCR_LOAD_OP_MS=2500: the 10 s the
 * defaults (1 s, 5 s) keep. */
#define HELD_MS (SANITIZED ? 120000u : 20000u)

/* ---- the source: this process --------------------------------------------- */

/* Pin requests the source made, held until the test answers them. */
static struct {
    uint64_t req[8];
    int n;
} held;

static int hold_pin(void *ud, uint64_t req, const kvcr_key *keys, size_t n)
{
    (void)ud, (void)keys, (void)n;
    if (held.n < 8) held.req[held.n++] = req;
    return 0;
}

static bool release_any(void *ud, uint64_t pin)
{
    (void)ud, (void)pin;
    return true;
}

/* The source: keys k<fw_only>..k<KEYS-1> READY in KVCR DRAM, k0..k<fw_only-1>
 * only in framework memory (served through held pins). Its operation
 * timeout bounds how long it serves one write; the fences of ended writes
 * are kept twice its abandon timeout (2 * op_ms here). */
static void source_start(rig *r, const kvcr_limits *lim, uint32_t fw_only, uint32_t op_ms)
{
    memset(&held, 0, sizeof held);
    rig_init_remote(r, BS, KEYS, KEYS);
    r->cfg.agent_name = "source";
    r->cfg.enable_telemetry = true;
    r->cfg.operation_timeout_ms = op_ms;
    r->cfg.abandon_timeout_ms = 2 * op_ms;
    r->cfg.limits = *lim;
    if (fw_only > 0) {
        r->cfg.callbacks.request_pin = hold_pin;
        r->cfg.callbacks.release_pin = release_any;
    }
    rig_start(r);
    for (uint32_t i = 0; i < KEYS; i++) rig_pattern(r, i, i);
    for (uint32_t i = fw_only; i < KEYS; i += 16) {
        char names[16][24];
        const char *keys[16];
        size_t at[16];
        for (uint32_t k = 0; k < 16; k++) keys[k] = peer_key(names[k], sizeof names[k], i + k),
                                          at[k] = i + k;
        uint32_t n = KEYS - i < 16 ? KEYS - i : 16;
        kvcr_entry_status st[16];
        assert_int_equal(rig_wait(r, rig_deposit(r, keys, at, n, 0), st, NULL, NULL), n);
        for (uint32_t k = 0; k < n; k++) assert_int_equal(st[k], KVCR_ENTRY_SUCCESS);
    }
}

/* Answers held pin request i with framework block k<key>. */
static void answer_pin(rig *r, int i, uint32_t key)
{
    char k[24];
    kvcr_mem_ref ref = {NULL, "", key};
    kvcr_block b = {key_of(peer_key(k, sizeof k, key)), &ref, 1};
    assert_int_equal(kvcr_pin_complete(r->kv, held.req[i], 100 + (uint64_t)i, &b, 1), 0);
}

/* The interval's telemetry, added up: refusals per limit, and the gauges. */
typedef struct source_view {
    double per_peer, total, pins;
    double all; /* every limit's refusals: the three above and any other */
    double in_flight, in_flight_max, held;
    double fences, fences_max; /* ids of ended writes kept for late duplicates */
} source_view;

static void take(rig *r, source_view *v)
{
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &s), 0);
    for (size_t i = 0; i < s->n_counters; i++) {
        const kvcr_counter *c = &s->counters[i];
        if (strcmp(c->name, KVCR_LIMIT_REFUSALS_METRIC) != 0) continue;
        v->all += c->value;
        if (strcmp(c->operation, "source_writes_per_peer") == 0) v->per_peer += c->value;
        if (strcmp(c->operation, "source_writes") == 0) v->total += c->value;
        if (strcmp(c->operation, "pin_requests") == 0) v->pins += c->value;
    }
    for (size_t i = 0; i < s->n_gauges; i++) {
        if (strcmp(s->gauges[i].resource, "source_writes_in_flight") == 0)
            v->in_flight = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "source_writes_in_flight_max") == 0)
            v->in_flight_max = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "source_writes_held") == 0) v->held = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "source_write_fences") == 0) {
            v->fences = s->gauges[i].value;
            if (v->fences > v->fences_max) v->fences_max = v->fences;
        }
    }
    kvcr_stats_free(s);
}

/* ---- targets ---------------------------------------------------------------- */

static void target_spawn(peer *t, const char *agent, uint32_t fw_blocks)
{
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0; /* delivers into framework memory only */
    o.fw_n = fw_blocks;
    o.op_timeout_ms = HELD_MS;
    o.abandon_timeout_ms = 2 * HELD_MS;
    o.agent = agent;
    peer_spawn(t, &o);
}

static peer_pull job(const rig *source, uint32_t first, uint32_t span, uint32_t keys_per_op,
                     uint32_t depth, uint32_t n_ops, uint32_t max_ms)
{
    peer_pull p = {.first = first, .span = span, .keys_per_op = keys_per_op, .depth = depth,
                   .n_ops = n_ops, .max_ms = max_ms};
    snprintf(p.source, sizeof p.source, "%s", kvcr_control_endpoint(source->kv));
    return p;
}

/* Serves until the target's pulls have done `done` operations (bounded:
 * 20 s); returns its stats. */
static peer_pull_stats serve_until(rig *r, peer *t, uint64_t done)
{
    peer_pull_stats st = {0};
    for (uint64_t until = rig_now_ms() + 20000; rig_now_ms() < until;) {
        rig_pump(r);
        st = peer_pull_stats_get(t);
        if (st.done >= done) return st;
        rig_await(r, 1); /* a pin request or a write to settle wakes it */
    }
    fail_msg("the target finished %llu of %llu operations within 20 s",
             (unsigned long long)st.done, (unsigned long long)done);
    return st;
}

/* Serves until the source holds `n` pin requests (bounded: 20 s). */
static void serve_until_pins(rig *r, int n)
{
    for (uint64_t until = rig_now_ms() + 20000; held.n < n && rig_now_ms() < until;) {
        rig_pump(r);
        rig_await(r, 1); /* a pin request wakes it */
    }
    assert_int_equal(held.n, n);
}

/* ---- one limit at a time ---------------------------------------------------- */

static kvcr_limits default_limits(void)
{
    kvcr_config d;
    kvcr_config_init(&d);
    return d.limits;
}

/* Starts the source (k0..k<fw_only-1> behind held pins) and one target
 * whose first write (k0) waits at the source for its pin while its second
 * (k1) is refused busy, nothing written. Its job pulls one key per
 * operation from k0..k<span-1>, two at a time. */
static peer_pull second_write_refused(rig *src, peer *t, const kvcr_limits *lim,
                                      uint32_t fw_only, uint32_t span)
{
    source_start(src, lim, fw_only, HELD_MS);
    target_spawn(t, "target-a", 4);
    peer_pull p = job(src, 0, span, 1, 2, 1, 20000);
    peer_pull_start(t, &p); /* k0 */
    serve_until_pins(src, 1);
    peer_pull_start(t, &p); /* k1 */
    peer_pull_stats st = serve_until(src, t, 1);
    assert_int_equal(st.busy_ops, 1);
    assert_int_equal(st.busy_entries, 1);
    assert_int_equal(st.ok_entries + st.other_entries + st.bad_bytes, 0);
    return p;
}

/* Per peer 1: the target's first write (k0, waiting for a pin) is held;
 * its second (k1, in KVCR DRAM) is refused busy; the pin answered, the first
 * succeeds and a third (k2) is served. */
static void test_per_peer_limit_refuses_busy(void **state)
{
    (void)state;
    kvcr_limits lim = default_limits();
    lim.max_source_writes_per_peer = 1;
    lim.max_source_writes = 8;
    rig src;
    peer t;
    peer_pull p = second_write_refused(&src, &t, &lim, 1, 4);
    source_view v = {0};
    take(&src, &v);
    assert_int_equal(v.per_peer, 1);
    assert_int_equal(v.total, 0);
    assert_int_equal(v.in_flight, 1);
    assert_int_equal(v.in_flight_max, 1);
    answer_pin(&src, 0, 0);
    peer_pull_stats st = serve_until(&src, &t, 2);
    assert_int_equal(st.ok_ops, 1);
    peer_pull_start(&t, &p); /* k2 */
    st = serve_until(&src, &t, 3);
    assert_int_equal(st.ok_ops, 2);
    assert_int_equal(st.ok_entries, 2);
    assert_int_equal(st.busy_ops, 1);
    assert_int_equal(st.other_entries, 0);
    assert_int_equal(st.bad_bytes, 0);
    peer_stop(&t);
    rig_stop(&src);
}

/* Total 1: target A's write waits for a pin; B's is refused busy (the total
 * limit); A answered, B is served. */
static void test_total_limit_refuses_busy(void **state)
{
    (void)state;
    kvcr_limits lim = default_limits();
    lim.max_source_writes_per_peer = 1;
    lim.max_source_writes = 1;
    rig src;
    source_start(&src, &lim, 1, HELD_MS);
    peer a, b;
    target_spawn(&a, "target-a", 4);
    target_spawn(&b, "target-b", 4);
    peer_pull pa = job(&src, 0, 1, 1, 1, 1, 20000); /* k0 */
    peer_pull pb = job(&src, 1, 1, 1, 1, 1, 20000); /* k1 */
    peer_pull_start(&a, &pa);
    serve_until_pins(&src, 1);
    peer_pull_start(&b, &pb);
    peer_pull_stats sb = serve_until(&src, &b, 1);
    assert_int_equal(sb.busy_entries, 1);
    source_view v = {0};
    take(&src, &v);
    assert_int_equal(v.total, 1);
    assert_int_equal(v.per_peer, 0);
    answer_pin(&src, 0, 0);
    peer_pull_stats sa = serve_until(&src, &a, 1);
    assert_int_equal(sa.ok_entries, 1);
    peer_pull_start(&b, &pb);
    sb = serve_until(&src, &b, 2);
    assert_int_equal(sb.ok_entries, 1);
    assert_int_equal(sa.bad_bytes + sb.bad_bytes + sa.other_entries + sb.other_entries, 0);
    peer_stop(&a);
    peer_stop(&b);
    rig_stop(&src);
}

/* One pending pin request at most: a second write that needs a pin (k1) is
 * refused busy and no pin is asked for it; the first is served. */
static void test_pin_request_limit_refuses_busy(void **state)
{
    (void)state;
    kvcr_limits lim = default_limits();
    lim.max_pin_requests = 1;
    rig src;
    peer t;
    second_write_refused(&src, &t, &lim, 2, 2);
    assert_int_equal(held.n, 1); /* none asked for k1 */
    source_view v = {0};
    take(&src, &v);
    assert_int_equal(v.pins, 1);
    answer_pin(&src, 0, 0);
    peer_pull_stats st = serve_until(&src, &t, 2);
    assert_int_equal(st.ok_entries, 1);
    assert_int_equal(st.bad_bytes + st.other_entries, 0);
    peer_stop(&t);
    rig_stop(&src);
}

/* ---- the flood -------------------------------------------------------------- */

enum { FLOODERS = 7, PER_PEER = 4, FLOOD_DEPTH = 16, KEYS_PER_OP = 4 };

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* VmRSS / VmHWM of this process, in KiB. */
static long vm_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    assert_true(v > 0);
    return v;
}

#define RSS_GROWTH_KIB (32 * 1024)

typedef struct flood {
    peer t[FLOODERS + 1]; /* the last one is well-behaved */
    peer_pull_stats st[FLOODERS + 1];
    source_view v;
    uint64_t ops;
} flood;

/* Sends every target of the round its job: n_ops more operations, none
 * started after max_ms (n_ops 0, max_ms 0: stop starting). */
static void round_jobs(const rig *src, flood *f, bool flooders, uint32_t n_ops, uint32_t max_ms)
{
    for (int i = flooders ? 0 : FLOODERS; i <= FLOODERS; i++) {
        bool steady = i == FLOODERS;
        peer_pull p = job(src, 0, KEYS, KEYS_PER_OP, steady ? 1 : FLOOD_DEPTH, n_ops, max_ms);
        peer_pull_start(&f->t[i], &p);
    }
}

/* Runs one round: every flooder FLOOD_DEPTH deep (without flooders: only
 * the well-behaved target), the well-behaved one 1 deep, for at least ms
 * and until the well-behaved target has min_ok more successes, so that
 * they all happen while the others flood whatever the machine's speed.
 * Then every target stops starting, and the source is served and sampled
 * until all are idle (bounded: ms + 180 s). One deep, the well-behaved
 * target waits a whole round trip per operation; on a loaded machine under
 * TSan that is seconds, hence fewer there. */
#define STEADY_MIN (SANITIZED ? 3u : 10u)

static void flood_round(rig *src, flood *f, uint32_t ms, bool flooders, uint64_t min_ok)
{
    uint64_t ok0 = f->st[FLOODERS].ok_ops, t0 = now_ms();
    round_jobs(src, f, flooders, 1u << 30, ms + 180000);
    uint64_t give_up = t0 + ms + 180000, next_look = 0;
    bool idle = false, stopping = false;
    while (!idle && now_ms() < give_up) {
        rig_pump(src);
        usleep(2000); /* pacing, not a wait: finished writes wait for the next poll (pressure) */
        if (now_ms() < next_look) continue;
        next_look = now_ms() + 100;
        take(src, &f->v);
        idle = true;
        for (int i = 0; i <= FLOODERS; i++) {
            f->st[i] = peer_pull_stats_get(&f->t[i]);
            idle &= f->st[i].idle != 0;
        }
        if (!stopping && now_ms() - t0 >= ms && f->st[FLOODERS].ok_ops - ok0 >= min_ok) {
            round_jobs(src, f, flooders, 0, 0);
            stopping = true;
        }
    }
    if (!idle) {
        for (int i = 0; i <= FLOODERS; i++)
            fprintf(stderr, "target %d: %llu started, %llu done, %llu ok, %llu busy, idle %u\n", i,
                    (unsigned long long)f->st[i].started, (unsigned long long)f->st[i].done,
                    (unsigned long long)f->st[i].ok_ops, (unsigned long long)f->st[i].busy_ops,
                    f->st[i].idle);
        fail_msg("the round did not end within %u ms + 180 s", ms);
    }
    rig_pump(src);
    take(src, &f->v);
}

static void test_eight_targets_flood_one_source(void **state)
{
    (void)state;
    const char *env = getenv("KVCR_LOAD_FLOOD_MS"), *op_env = getenv("KVCR_LOAD_OP_MS");
    uint32_t flood_ms = env ? (uint32_t)strtoul(env, NULL, 10) : SANITIZED ? 2000 : 4000;
    uint32_t op_ms = op_env ? (uint32_t)strtoul(op_env, NULL, 10) : HELD_MS;
    kvcr_limits lim = default_limits();
    lim.max_source_writes_per_peer = PER_PEER;
    /* A total far above 8 * PER_PEER: every peer fits, also with ended
     * writes waiting for the source's next poll, which this thread may
     * give late on a loaded machine (the ended writes count toward the
     * total until then). */
    lim.max_source_writes = 1u << 16;
    rig src;
    source_start(&src, &lim, 0, op_ms);
    static flood f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i <= FLOODERS; i++) {
        char agent[32];
        snprintf(agent, sizeof agent, i < FLOODERS ? "flood-%d" : "steady", i);
        target_spawn(&f.t[i], agent, FLOOD_DEPTH * KEYS_PER_OP);
    }
    /* A short round first: routes, sockets and allocator pools settle. Then
     * the well-behaved target alone, the baseline of its rate. */
    flood_round(&src, &f, 500, true, 1);
    uint64_t alone0 = f.st[FLOODERS].ok_ops, t_alone = now_ms();
    flood_round(&src, &f, 1000, false, STEADY_MIN);
    double alone_rate = 1000.0 * (double)(f.st[FLOODERS].ok_ops - alone0) /
                        (double)(now_ms() - t_alone);
    long rss0 = vm_kib("VmRSS"), hwm0 = vm_kib("VmHWM");
    peer_pull_stats warm[FLOODERS + 1];
    memcpy(warm, f.st, sizeof warm);
    uint64_t t0 = now_ms();
    flood_round(&src, &f, flood_ms, true, STEADY_MIN);
    uint64_t elapsed = now_ms() - t0;
    long rss1 = vm_kib("VmRSS"), hwm1 = vm_kib("VmHWM");

    uint64_t done = 0, ok = 0, busy = 0, busy_ops = 0;
    for (int i = 0; i <= FLOODERS; i++) {
        const peer_pull_stats *s = &f.st[i];
        if (s->other_entries != 0)
            fail_msg("target %d: %llu entries failed with reason %s", i,
                     (unsigned long long)s->other_entries, kvcr_reason_name(s->other_reason));
        assert_int_equal(s->bad_bytes, 0);
        assert_int_equal(s->done, s->started);
        assert_int_equal(s->ok_entries + s->busy_entries, s->done * KEYS_PER_OP);
        done += s->done - warm[i].done, ok += s->ok_ops - warm[i].ok_ops;
        busy += s->busy_entries - warm[i].busy_entries, busy_ops += s->busy_ops;
    }
    const peer_pull_stats *steady = &f.st[FLOODERS];
    /* The well-behaved target was never refused, and was served. */
    assert_int_equal(steady->busy_entries, 0);
    assert_true(steady->ok_ops - warm[FLOODERS].ok_ops >= STEADY_MIN);
    assert_int_equal(steady->ok_ops, steady->done);
    /* Every refusal the targets saw is one the source counted, nearly all
     * at the per-peer limit (the total one is never reached: all peers
     * fit); the breakdown is printed when the sums differ. */
    assert_true(busy_ops > 0);
    if (f.v.all != (double)busy_ops)
        fprintf(stderr, "refusals counted: %.0f per peer, %.0f total, %.0f pins, %.0f in all; "
                        "operations refused at the targets: %llu\n",
                f.v.per_peer, f.v.total, f.v.pins, f.v.all, (unsigned long long)busy_ops);
    assert_int_equal(f.v.all, (double)busy_ops);
    assert_true(f.v.per_peer > 0);
    assert_int_equal(f.v.total, 0);
    /* Being served at once: at most PER_PEER per flooder and one for the
     * well-behaved target (the gauge is the maximum since the start). */
    assert_true(f.v.in_flight_max >= 1);
    assert_true(f.v.in_flight_max <= FLOODERS * PER_PEER + 1);
    assert_int_equal(f.v.in_flight, 0);
    assert_int_equal(f.v.held, 0);

    uint64_t refused = busy_ops;
    for (int i = 0; i <= FLOODERS; i++) refused -= warm[i].busy_ops;
    printf("flood: 8 targets, %u ms (%llu ms with the drain): %llu operations (%.0f/s) of %d keys, "
           "%llu succeeded (well-behaved target %llu/%llu, %.0f/s; alone before: %.0f/s), %llu "
           "refused SOURCE_BUSY (%llu entries), 0 bad bytes; most writes served at once %.0f "
           "(limit %d per peer); write fences at most %.0f; source VmRSS %ld -> %ld KiB, "
           "VmHWM %ld -> %ld KiB\n",
           flood_ms, (unsigned long long)elapsed, (unsigned long long)done,
           1000.0 * (double)done / (double)elapsed, KEYS_PER_OP, (unsigned long long)ok,
           (unsigned long long)(steady->ok_ops - warm[FLOODERS].ok_ops),
           (unsigned long long)(steady->done - warm[FLOODERS].done),
           1000.0 * (double)(steady->ok_ops - warm[FLOODERS].ok_ops) / (double)elapsed, alone_rate,
           (unsigned long long)refused,
           (unsigned long long)busy, f.v.in_flight_max, PER_PEER, f.v.fences_max, rss0, rss1, hwm0,
           hwm1);
    if (!SANITIZED) assert_true(rss1 - rss0 < RSS_GROWTH_KIB);
    for (int i = 0; i <= FLOODERS; i++) peer_stop(&f.t[i]);
    rig_stop(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_peer_limit_refuses_busy),
        cmocka_unit_test(test_total_limit_refuses_busy),
        cmocka_unit_test(test_pin_request_limit_refuses_busy),
        cmocka_unit_test(test_eight_targets_flood_one_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
