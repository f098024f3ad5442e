/* A source whose target stops taking data in the middle of a write. This
 * test process is the source (k0..k<KEYS-1> in its framework memory, 1 MiB
 * each, served through pins it answers itself); the target is a
 * kvcr-test-peer process pulling them, SIGSTOPped while the source's writes
 * to it are in UCX.
 *
 * Both run UCX over TCP only: a put over TCP completes when the target's
 * worker acknowledges it, so a stopped target holds the write in UCX, and
 * nothing in UCX notices (the connection is fine; the process just never
 * answers). Over shared memory the same writes finish without the target.
 * The first pins are answered only once the target is stopped, so that
 * every write of that round is posted to a stopped process.
 *
 * Pinned: at the source's abandon deadline the endpoint is closed by force,
 * its TCP connections with the target reset first (so that nothing they
 * hold reaches the target later: net/tcpreset.h), also when the connection
 * carrying the writes is one the target opened; every write on it ends
 * (reported UNCERTAIN, then QUIESCED), nothing stays in flight; and the
 * next target is served from the same memory, bytes checked by the target.
 * Before the force close such writes held their memory until the target
 * came back, which a killed target never does. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peer.h"

#define BS (1u << 20)
#define KEYS 64u
/* The source's deadlines. Its operation timeout is also its stall limit (a
 * progress turn later than it disables the source for good), and a turn
 * that sets up a TCP endpoint under valgrind on a loaded runner can take
 * more than a second: 4 s, like the targets' generous deadlines below. */
#define OP_MS 4000u
#define ABANDON_MS 8000u
#define MAX_HELD 64

static int g_uncertain, g_quiesced, g_stalled; /* source-side resilience events */
static pid_t g_stopped = -1;        /* the stopped target, killed even if the test fails */

static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    (void)ud;
    if (!ev->source_side) return;
    if (ev->state == KVCR_TRANSFER_UNCERTAIN) __atomic_fetch_add(&g_uncertain, 1, __ATOMIC_RELAXED);
    if (ev->state == KVCR_TRANSFER_QUIESCED) __atomic_fetch_add(&g_quiesced, 1, __ATOMIC_RELAXED);
    if (ev->state == KVCR_SOURCE_STALLED) __atomic_fetch_add(&g_stalled, 1, __ATOMIC_RELAXED);
}

/* Pin requests, held until the test answers them (request_pin runs inside
 * kvcr_poll on this thread). */
static struct {
    uint64_t req;
    size_t n;
    uint32_t key[16];
} held[MAX_HELD];
static int n_held;

static int hold_pin(void *ud, uint64_t req, const kvcr_key *keys, size_t n)
{
    (void)ud;
    if (n_held == MAX_HELD || n > 16) return -1;
    held[n_held].req = req;
    held[n_held].n = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = 0;
        assert_int_equal(tool_key_hash(NULL, &keys[i], &k), 0);
        assert_true(k < KEYS);
        held[n_held].key[i] = (uint32_t)k;
    }
    n_held++;
    return 0;
}

static bool release_any(void *ud, uint64_t pin)
{
    (void)ud, (void)pin;
    return true;
}

/* Answers every held pin request with the keys' framework blocks (k<i> is
 * block i). */
static void answer_pins(rig *r)
{
    static uint64_t next_pin = 1;
    for (int h = 0; h < n_held; h++) {
        char names[16][24];
        kvcr_mem_ref refs[16];
        kvcr_block b[16];
        for (size_t i = 0; i < held[h].n; i++) {
            refs[i] = (kvcr_mem_ref){NULL, "", held[h].key[i]};
            b[i] = (kvcr_block){key_of(peer_key(names[i], sizeof names[i], held[h].key[i])),
                                &refs[i], 1};
        }
        assert_int_equal(kvcr_pin_complete(r->kv, held[h].req, next_pin++, b, held[h].n), 0);
    }
    n_held = 0;
}

static void source_start(rig *r)
{
    rig_init_remote(r, BS, KEYS, 0); /* no KVCR DRAM: every block through a pin */
    r->cfg.agent_name = "source";
    r->cfg.enable_telemetry = true;
    r->cfg.operation_timeout_ms = OP_MS;
    r->cfg.abandon_timeout_ms = ABANDON_MS;
    r->cfg.callbacks.resilience = on_resilience;
    r->cfg.callbacks.request_pin = hold_pin;
    r->cfg.callbacks.release_pin = release_any;
    rig_start(r);
    for (uint32_t i = 0; i < KEYS; i++) rig_pattern(r, i, i);
}

/* serves: the target also answers pins from its framework blocks, so that
 * this process can pull from it. */
static void target_spawn(peer *t, const char *agent, bool serves)
{
    peer_opts o;
    peer_opts_init(&o);
    o.pins = serves;
    o.block_size = BS;
    o.slots = 0; /* delivers into framework memory */
    o.fw_n = KEYS;
    o.agent = agent;
    /* the target waits long: its first pulls meet a cold UCX (slow under
     * valgrind), and its deadlines are not what is tested */
    o.op_timeout_ms = 10000;
    o.abandon_timeout_ms = 20000;
    peer_spawn(t, &o);
}

static double in_flight(rig *r)
{
    return rig_stat(r, "source_writes_in_flight", NULL);
}

/* The whole key range, four operations at a time. */
static peer_pull all_keys(const rig *source, uint32_t keys_per_op)
{
    peer_pull p = {.first = 0, .span = KEYS, .keys_per_op = keys_per_op, .depth = 4,
                   .n_ops = KEYS / keys_per_op, .max_ms = 20000};
    snprintf(p.source, sizeof p.source, "%s", kvcr_control_endpoint(source->kv));
    return p;
}

/* Starts the target's pulls, stops the target once the source holds its
 * first pin request, then answers the pins: the source's writes go to a
 * process that cannot take them. */
static void stop_mid_write(rig *r, peer *t)
{
    peer_pull p = all_keys(r, 16);
    peer_pull_start(t, &p);
    /* A first contact can fail (a cold UCX under valgrind on a loaded
     * runner): a round that ended without asking for a pin starts again. */
    int rounds = 1;
    uint64_t give_up = rig_now_ms() + 60000, next_look = rig_now_ms() + 100;
    while (n_held == 0 && rig_now_ms() < give_up) {
        rig_pump(r);
        if (rig_now_ms() >= next_look && rounds < 5) {
            next_look = rig_now_ms() + 100;
            peer_pull_stats st = peer_pull_stats_get(t);
            if (st.idle) {
                print_message("round %d ended without a pin request (%llu ok, %llu failed, "
                              "reason %u): again\n", rounds, (unsigned long long)st.ok_entries,
                              (unsigned long long)st.other_entries, st.other_reason);
                peer_pull_start(t, &p);
                rounds++;
            }
        }
        rig_await(r, 1); /* a pin request wakes it */
    }
    if (n_held == 0)
        fail_msg("no pin request in %d rounds of pulls%s", rounds,
                 g_stalled ? " (the source reported itself stalled)" : "");
    g_stopped = t->pid;
    peer_freeze(t);
    answer_pins(r);
}

/* This process pulls k0 from the target into its block 0 (the same bytes),
 * so that the target's endpoint to us exists first: UCX then carries our
 * writes to the target on the connection the target opened (one TCP
 * connection for both directions), whose peer is the target's ephemeral
 * port, not where it listens. */
static void pull_from_target_first(rig *r, const peer *t)
{
    peer_hint_range(r, "first", t->endpoint, 0, 1);
    kvcr_entry_status st[1];
    assert_int_equal(rig_wait(r, peer_deliver_range(r, 0, 1, 0, "first"), st, NULL, NULL), 1);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(r, r->fw, 0));
}

static void writes_to_a_stopped_target(bool target_connected_first)
{
    g_uncertain = g_quiesced = g_stalled = 0;
    rig r;
    source_start(&r);
    peer t;
    target_spawn(&t, "stopped", target_connected_first);
    if (target_connected_first) pull_from_target_first(&r, &t);
    stop_mid_write(&r, &t);
    rig_pump(&r);
    assert_true(in_flight(&r) >= 1);

    /* Bounded: the abandon deadline, then a few turns to settle. The
     * abandon timer does not wake the fd: a poll, every 10 ms at most. */
    for (uint64_t until = rig_now_ms() + ABANDON_MS + 10000;
         in_flight(&r) > 0 && rig_now_ms() < until;) {
        rig_pump(&r);
        answer_pins(&r); /* pins the target's later operations asked for */
        rig_await(&r, 10);
    }
    assert_int_equal(in_flight(&r), 0);
    rig_pump(&r); /* events queued by the last settle */
    int uncertain = __atomic_load_n(&g_uncertain, __ATOMIC_RELAXED);
    int quiesced = __atomic_load_n(&g_quiesced, __ATOMIC_RELAXED);
    assert_true(uncertain >= 1);
    assert_int_equal(quiesced, uncertain); /* every write reported uncertain is quiet now */
    assert_true(rig_stat(&r, "ucx_endpoints_aborted", NULL) >= 1);
    assert_true(rig_stat(&r, "ucx_tcp_connections_reset", NULL) >= 1);
    peer_kill(&t);
    g_stopped = -1;

    /* the memory those writes read serves the next target, bytes checked;
     * a block per operation, so that each fits the deadline even under
     * valgrind */
    peer u;
    target_spawn(&u, "next", false);
    peer_pull p = all_keys(&r, 1);
    peer_pull_start(&u, &p);
    peer_pull_stats st = {0};
    for (uint64_t until = rig_now_ms() + 30000; rig_now_ms() < until;) {
        rig_pump(&r);
        answer_pins(&r);
        st = peer_pull_stats_get(&u);
        if (st.done >= KEYS) break;
        rig_await(&r, 1); /* a pin request or a write to settle wakes it */
    }
    assert_int_equal(st.done, KEYS);
    assert_int_equal(st.ok_entries, KEYS);
    assert_int_equal(st.bad_bytes, 0);
    peer_stop(&u);
    rig_stop(&r);
}

static void test_writes_to_a_stopped_target_end_at_the_abandon_deadline(void **state)
{
    (void)state;
    writes_to_a_stopped_target(false);
}

/* The same when the connection carrying the writes is one the target
 * opened: the abort must find it too. */
static void test_writes_on_the_targets_own_connection_are_reset_too(void **state)
{
    (void)state;
    writes_to_a_stopped_target(true);
}

static int kill_stopped(void **state)
{
    (void)state;
    if (g_stopped > 0) {
        kill(g_stopped, SIGKILL);
        waitpid(g_stopped, NULL, 0);
    }
    g_stopped = -1;
    return 0;
}

int main(void)
{
    /* Before any UCX context: this process and the targets it spawns. */
    setenv("UCX_TLS", "tcp", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_writes_to_a_stopped_target_end_at_the_abandon_deadline,
                                  kill_stopped),
        cmocka_unit_test_teardown(test_writes_on_the_targets_own_connection_are_reset_too,
                                  kill_stopped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
