/* The bound on peers (kvcr_config.max_peers, peer_idle_ms) of a source,
 * with real target processes on 127.0.0.1. This test process is the
 * source (its KVCR DRAM holds k1..k<KEYS-1>, pattern i; k0 only in
 * framework memory, served through a pin the test holds); the targets are
 * kvcr-test-peer processes, each with its own agent name, running
 * PEER_CMD_PULL jobs whose every delivered byte they check.
 *
 *   - targets past max_peers are refused (their entries fail SOURCE_BUSY,
 *     the refusal counted as limit "peers" and logged at most once a
 *     second), the table never holds more
 *     routes than the bound, and the admitted targets go on pulling;
 *   - routes idle for peer_idle_ms are reclaimed (counted), a new target
 *     takes the room, and a target whose route was reclaimed pulls again
 *     (its start_write without metadata is refused, then sent again with
 *     it);
 *   - a route with a write in flight (waiting for a pin) is never
 *     reclaimed however long it waits, and holds its place against a new
 *     target until the write ends;
 *   - one process forging metadata under 200 agent names (a worker address
 *     UCX refuses) holds no room a real target needs: the table stays
 *     within the bound, and real targets are admitted and pull;
 *   - as a target (this process pulling from two source processes) at
 *     most max_peers records of sources are kept, the least recently used
 *     reclaimed, and every pull still gets its bytes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "net/wire.h"
#include "peer.h"

#define BS 4096
#define KEYS 16
/* No operation here may meet its deadline, also under sanitizers on a
 * loaded machine: every outcome asserted is a refusal or a success. */
#define OP_MS 60000u
#define NEVER_IDLE_MS 86400000u
/* The idle time of the tests that reclaim. They freeze this process's
 * clock (kvcr/testing.h) and move it on by IDLE_MS at each look until the
 * sweep took the route: a target's metadata retry (every 100 ms of its own
 * time until the source answers) that reaches the source after the
 * route's last use refreshes the route, and the next step makes it idle
 * again. A step well under OP_MS is no stall to the progress thread. */
#define IDLE_MS 1000u
#define MS 1000000ull

/* The pin request for k0, held until the test answers it. */
static uint64_t held_req;
static int held_n;

static int hold_pin(void *ud, uint64_t req, const kvcr_key *keys, size_t n)
{
    (void)ud, (void)keys, (void)n;
    held_req = req;
    held_n++;
    return 0;
}

static bool release_pin(void *ud, uint64_t pin)
{
    (void)ud, (void)pin;
    return true;
}

/* The source's log lines about refusals at max_peers (any thread logs);
 * errors also to stderr. */
static pthread_mutex_t full_lock = PTHREAD_MUTEX_INITIALIZER;
static int full_lines;

static void count_full(void *ud, kvcr_log_level level, const char *msg)
{
    (void)ud;
    if (level == KVCR_LOG_ERROR) fprintf(stderr, "kvcr error: %s\n", msg);
    pthread_mutex_lock(&full_lock);
    full_lines += strstr(msg, "peer table full") != NULL;
    pthread_mutex_unlock(&full_lock);
}

static int full_lines_now(void)
{
    pthread_mutex_lock(&full_lock);
    int n = full_lines;
    pthread_mutex_unlock(&full_lock);
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void source_start(rig *r, uint32_t max_peers, uint32_t idle_ms)
{
    held_n = 0;
    rig_init_remote(r, BS, KEYS, KEYS);
    r->cfg.agent_name = "source";
    r->cfg.enable_telemetry = true;
    r->cfg.operation_timeout_ms = OP_MS;
    r->cfg.abandon_timeout_ms = 2 * OP_MS;
    r->cfg.max_peers = max_peers;
    r->cfg.peer_idle_ms = idle_ms;
    r->cfg.callbacks.request_pin = hold_pin;
    r->cfg.callbacks.release_pin = release_pin;
    r->cfg.callbacks.log = count_full;
    full_lines = 0;
    rig_start(r);
    for (uint32_t i = 0; i < KEYS; i++) rig_pattern(r, i, i);
    char names[KEYS][24];
    const char *keys[KEYS];
    size_t at[KEYS];
    for (uint32_t i = 1; i < KEYS; i++)
        keys[i - 1] = peer_key(names[i], sizeof names[i], i), at[i - 1] = i;
    kvcr_entry_status st[KEYS];
    assert_int_equal(rig_wait(r, rig_deposit(r, keys, at, KEYS - 1, 0), st, NULL, NULL), KEYS - 1);
    for (uint32_t i = 0; i < KEYS - 1; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
}

/* The source's peer table, and its refusals at max_peers added up over the
 * intervals taken so far. */
typedef struct table {
    double routes, routes_reclaimed, refusals;
    double records, records_reclaimed; /* as a target: records of sources */
} table;

static void look(rig *r, table *t)
{
    kvcr_stats *s = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &s), 0);
    for (size_t i = 0; i < s->n_counters; i++)
        if (strcmp(s->counters[i].name, KVCR_LIMIT_REFUSALS_METRIC) == 0 &&
            strcmp(s->counters[i].operation, "peers") == 0)
            t->refusals += s->counters[i].value;
    for (size_t i = 0; i < s->n_gauges; i++) {
        if (strcmp(s->gauges[i].resource, "peer_routes") == 0) t->routes = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "peer_routes_reclaimed") == 0)
            t->routes_reclaimed = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "peer_records") == 0) t->records = s->gauges[i].value;
        if (strcmp(s->gauges[i].resource, "peer_records_reclaimed") == 0)
            t->records_reclaimed = s->gauges[i].value;
    }
    kvcr_stats_free(s);
}

/* The source (this process) and n targets "target-a", "target-b", ...,
 * each a process of its own delivering into its framework memory. */
typedef struct scene {
    rig src;
    peer t[4];
    int n;
    table tab;
} scene;

static void scene_start(scene *w, uint32_t max_peers, uint32_t idle_ms, int n)
{
    memset(&w->tab, 0, sizeof w->tab);
    source_start(&w->src, max_peers, idle_ms);
    w->n = n;
    for (int i = 0; i < n; i++) {
        char agent[16];
        snprintf(agent, sizeof agent, "target-%c", 'a' + i);
        peer_opts o;
        peer_opts_init(&o);
        o.slots = 0;
        o.fw_n = KEYS;
        o.op_timeout_ms = OP_MS;
        o.abandon_timeout_ms = 2 * OP_MS;
        o.agent = agent;
        peer_spawn(&w->t[i], &o);
    }
}

static void scene_stop(scene *w)
{
    for (int i = 0; i < w->n; i++) peer_stop(&w->t[i]);
    rig_stop(&w->src);
}

/* One more operation of t: k<key> from the source. */
static void pull_one(rig *src, peer *t, uint32_t key)
{
    peer_pull p = {.first = key, .span = 1, .keys_per_op = 1, .depth = 1, .n_ops = 1,
                   .max_ms = 20000};
    snprintf(p.source, sizeof p.source, "%s", kvcr_control_endpoint(src->kv));
    peer_pull_start(t, &p);
}

/* Serves (the source never holding more than max routes at any look)
 * until t has finished `done` operations, bounded: 30 s. */
static peer_pull_stats serve_until_done(rig *r, peer *t, uint64_t done, double max, table *tab)
{
    peer_pull_stats st = {0};
    for (int spin = 0; spin < 30000; spin++) {
        rig_pump(r);
        if (spin % 50 == 0) {
            look(r, tab);
            assert_true(tab->routes <= max);
        }
        st = peer_pull_stats_get(t);
        if (st.done >= done) return st;
        usleep(1000);
    }
    fail_msg("the target finished %llu of %llu operations within 30 s",
             (unsigned long long)st.done, (unsigned long long)done);
    return st;
}

/* Serves until the source reclaimed `n` routes in all and holds none,
 * the frozen clock moved on by IDLE_MS at each look; bounded: 30 s. */
static void serve_until_reclaimed(rig *r, double n, table *tab)
{
    for (int spin = 0; spin < 3000; spin++) {
        rig_pump(r);
        look(r, tab);
        if (tab->routes_reclaimed >= n && tab->routes == 0) return;
        kvcr__test_clock_advance(IDLE_MS * MS);
        usleep(10000);
    }
    fail_msg("%.0f routes reclaimed within 30 s (not %.0f), %.0f held", tab->routes_reclaimed, n,
             tab->routes);
}

/* Serves until t finished `done` operations, every one a success (bytes
 * checked by t) or, with busy, every one refused SOURCE_BUSY (nothing
 * written). */
static void serve_all(rig *r, peer *t, uint64_t done, double max, table *tab, bool busy)
{
    peer_pull_stats st = serve_until_done(r, t, done, max, tab);
    assert_int_equal(busy ? st.busy_ops : st.ok_ops, done);
    assert_int_equal(busy ? st.busy_entries : st.ok_entries, done);
    assert_int_equal((busy ? st.ok_entries : st.busy_entries) + st.other_entries + st.bad_bytes,
                     0);
}

static void serve_ok(rig *r, peer *t, uint64_t done, double max, table *tab)
{
    serve_all(r, t, done, max, tab, false);
}

static void serve_busy(rig *r, peer *t, uint64_t done, double max, table *tab)
{
    serve_all(r, t, done, max, tab, true);
}

/* max_peers 2, four targets: a and b are admitted, c and d refused
 * (SOURCE_BUSY, counted, logged at most once a second); a and b keep
 * pulling, c is still refused. */
static void test_targets_past_max_peers_are_refused_and_the_admitted_still_pull(void **state)
{
    (void)state;
    scene w;
    double t0 = now_s();
    scene_start(&w, 2, NEVER_IDLE_MS, 4);
    for (int i = 0; i < 4; i++) {
        pull_one(&w.src, &w.t[i], 1 + (uint32_t)i);
        if (i < 2)
            serve_ok(&w.src, &w.t[i], 1, 2, &w.tab);
        else
            serve_busy(&w.src, &w.t[i], 1, 2, &w.tab);
    }
    look(&w.src, &w.tab);
    assert_true(w.tab.refusals >= 2); /* c's and d's start_write, and their eager metadata */
    assert_int_equal(w.tab.routes, 2);
    for (uint32_t round = 0; round < 3; round++)
        for (int i = 0; i < 2; i++) {
            pull_one(&w.src, &w.t[i], 5 + round);
            serve_ok(&w.src, &w.t[i], 2 + round, 2, &w.tab);
        }
    double before = w.tab.refusals;
    pull_one(&w.src, &w.t[2], 9);
    serve_busy(&w.src, &w.t[2], 2, 2, &w.tab);
    look(&w.src, &w.tab);
    assert_true(w.tab.refusals > before);
    assert_int_equal(w.tab.routes_reclaimed, 0);
    int lines = full_lines_now();
    assert_true(lines >= 1);
    assert_true(lines <= 1 + (int)(now_s() - t0)); /* one a second at most */
    scene_stop(&w);
}

/* max_peers 1, idle after IDLE_MS: a's route is reclaimed, b is admitted in
 * its place; once b's is reclaimed too, a pulls again (its start_write
 * without metadata refused, then sent with it). Nothing refused at the
 * limit, every byte right. */
static void test_idle_routes_are_reclaimed_and_their_targets_pull_again(void **state)
{
    (void)state;
    scene w;
    scene_start(&w, 1, IDLE_MS, 2);
    kvcr__test_clock_freeze();
    pull_one(&w.src, &w.t[0], 1);
    serve_ok(&w.src, &w.t[0], 1, 1, &w.tab);
    serve_until_reclaimed(&w.src, 1, &w.tab);
    pull_one(&w.src, &w.t[1], 2);
    serve_ok(&w.src, &w.t[1], 1, 1, &w.tab);
    serve_until_reclaimed(&w.src, 2, &w.tab);
    pull_one(&w.src, &w.t[0], 3);
    serve_ok(&w.src, &w.t[0], 2, 1, &w.tab);
    look(&w.src, &w.tab);
    assert_int_equal(w.tab.routes, 1);
    assert_int_equal(w.tab.refusals, 0);
    kvcr__test_clock_run();
    scene_stop(&w);
}

/* max_peers 1, idle after IDLE_MS: a's write of k0 waits for a pin the test
 * holds while the clock moves 3 x IDLE_MS on: b, coming after that, is
 * refused (the reclaim at admission and the sweep of that turn pass a's
 * route over). The pin answered, a's bytes are right; once its route is
 * idle and reclaimed, b is admitted. */
static void test_a_route_with_a_write_in_flight_is_never_reclaimed(void **state)
{
    (void)state;
    scene w;
    scene_start(&w, 1, IDLE_MS, 2);
    kvcr__test_clock_freeze();
    pull_one(&w.src, &w.t[0], 0);
    for (int spin = 0; spin < 20000 && held_n == 0; spin++) {
        rig_pump(&w.src);
        usleep(1000);
    }
    assert_int_equal(held_n, 1);
    for (int step = 0; step < 3; step++) kvcr__test_clock_advance(IDLE_MS * MS);
    /* b's refusal leaves at the end of the turn that read b's request: that
     * turn's sweep, on the moved clock, is done when b has its answer. */
    pull_one(&w.src, &w.t[1], 1);
    serve_busy(&w.src, &w.t[1], 1, 1, &w.tab);
    look(&w.src, &w.tab);
    assert_int_equal(w.tab.routes_reclaimed, 0);
    assert_int_equal(w.tab.routes, 1);
    assert_true(w.tab.refusals >= 1);
    char k[24];
    kvcr_mem_ref ref = {NULL, "", 0};
    kvcr_block blk = {key_of(peer_key(k, sizeof k, 0)), &ref, 1};
    assert_int_equal(kvcr_pin_complete(w.src.kv, held_req, 100, &blk, 1), 0);
    serve_ok(&w.src, &w.t[0], 1, 1, &w.tab);
    serve_until_reclaimed(&w.src, 1, &w.tab);
    pull_one(&w.src, &w.t[1], 2);
    peer_pull_stats st = serve_until_done(&w.src, &w.t[1], 2, 1, &w.tab);
    assert_int_equal(st.ok_entries, 1);
    assert_int_equal(st.busy_entries, 1);
    assert_int_equal(st.other_entries + st.bad_bytes, 0);
    kvcr__test_clock_run();
    scene_stop(&w);
}

/* n metadata messages to endpoint, agent "forged-<i>" each, from one PUSH
 * socket: well formed, with a one-byte worker address no UCX takes. */
static void forge_metadata(const char *endpoint, int n)
{
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 5000;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger), 0);
    char addr[256];
    assert_int_equal(zmq_connect(s, peer_zmq_address(addr, sizeof addr, endpoint)), 0);
    static const uint8_t worker[1] = {0};
    for (int i = 0; i < n; i++) {
        char agent[32];
        uint8_t inc[WIRE_INCARNATION_LEN];
        snprintf(agent, sizeof agent, "forged-%d", i);
        memset(inc, i + 1, sizeof inc);
        wire_msg m = {.type = WIRE_METADATA, .has_metadata = true};
        m.agent = (wire_bytes){(const uint8_t *)agent, strlen(agent)};
        m.incarnation = (wire_bytes){inc, sizeof inc};
        m.from = (wire_bytes){(const uint8_t *)"tcp://127.0.0.1:9", 17};
        m.to = (wire_bytes){(const uint8_t *)endpoint, strlen(endpoint)};
        m.md.worker_addr = (wire_bytes){worker, sizeof worker};
        void *buf;
        size_t len;
        assert_int_equal(wire_encode(&m, &buf, &len), 0);
        assert_int_equal(zmq_send(s, buf, len, 0), (int)len);
        free(buf);
    }
    zmq_close(s); /* the queue is delivered within the linger */
    zmq_ctx_term(ctx);
}

/* max_peers 2: a holds a route; 200 forged targets come and go through the
 * other place (a forgery's route has no endpoint: the next one takes it),
 * never past the bound and never refused; b then takes that place, and a
 * and b pull. */
static void test_forged_targets_hold_no_room_a_real_target_needs(void **state)
{
    (void)state;
    scene w;
    scene_start(&w, 2, NEVER_IDLE_MS, 2);
    pull_one(&w.src, &w.t[0], 1);
    serve_ok(&w.src, &w.t[0], 1, 2, &w.tab);
    forge_metadata(kvcr_control_endpoint(w.src.kv), 200);
    for (int spin = 0; spin < 3000 && w.tab.routes_reclaimed < 199; spin++) {
        rig_pump(&w.src);
        look(&w.src, &w.tab);
        assert_true(w.tab.routes <= 2);
        usleep(10000);
    }
    assert_int_equal(w.tab.routes_reclaimed, 199); /* each forgery took the last one's place */
    assert_int_equal(w.tab.refusals, 0);
    pull_one(&w.src, &w.t[1], 2);
    serve_ok(&w.src, &w.t[1], 1, 2, &w.tab);
    pull_one(&w.src, &w.t[0], 3);
    serve_ok(&w.src, &w.t[0], 2, 2, &w.tab);
    look(&w.src, &w.tab);
    assert_int_equal(w.tab.routes, 2);
    assert_int_equal(w.tab.routes_reclaimed, 200);
    assert_int_equal(w.tab.refusals, 0);
    scene_stop(&w);
}

/* This process as a target with max_peers 1 pulls k0..k5 from two source
 * processes in turn: each pull's record takes the other's place, and each
 * block arrives with its bytes. */
static void test_a_target_keeps_max_peers_records_and_pulls_from_every_source(void **state)
{
    (void)state;
    peer s[2];
    peer_spawn_source(&s[0], 8);
    peer_spawn_source(&s[1], 8);
    rig r;
    rig_init_remote(&r, BS, 8, 0);
    r.cfg.agent_name = "target";
    r.cfg.enable_telemetry = true;
    r.cfg.max_peers = 1;
    rig_start(&r);
    table tab = {0};
    for (uint32_t i = 0; i < 6; i++) {
        char req[16];
        snprintf(req, sizeof req, "r%u", i);
        peer_hint_range(&r, req, s[i % 2].endpoint, 0, 8);
        kvcr_entry_status st;
        assert_int_equal(rig_wait(&r, peer_deliver_range(&r, i, 1, i, req), &st, NULL, NULL), 1);
        assert_int_equal(st, KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&r, r.fw + i * BS, i));
        look(&r, &tab);
        assert_int_equal(tab.records, 1);
    }
    assert_true(tab.records_reclaimed >= 5);
    assert_int_equal(tab.refusals, 0);
    rig_stop(&r);
    peer_stop(&s[0]);
    peer_stop(&s[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_targets_past_max_peers_are_refused_and_the_admitted_still_pull),
        cmocka_unit_test(test_idle_routes_are_reclaimed_and_their_targets_pull_again),
        cmocka_unit_test(test_a_route_with_a_write_in_flight_is_never_reclaimed),
        cmocka_unit_test(test_forged_targets_hold_no_room_a_real_target_needs),
        cmocka_unit_test(test_a_target_keeps_max_peers_records_and_pulls_from_every_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
