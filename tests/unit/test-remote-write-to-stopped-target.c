/* A source whose target stops taking data in the middle of a write. This
 * test process is the source (k0..k<KEYS-1> in its KVCR DRAM, 1 MiB each);
 * the target is a kvcr-test-peer process pulling them, SIGSTOPped while
 * the source's writes to it are in UCX.
 *
 * Both run UCX over TCP only: a put over TCP completes when the target's
 * worker acknowledges it, so a stopped target holds the write in UCX, and
 * nothing in UCX notices (the connection is fine; the process just never
 * answers). Over shared memory the same writes finish without the target.
 *
 * Pinned: at the source's abandon deadline the endpoint is closed by force,
 * every write on it ends (reported UNCERTAIN, then QUIESCED), nothing stays
 * in flight; and the next target is served from the same memory, bytes
 * checked by the target. Before the force close such writes held their
 * memory until the target came back, which a killed target never does. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peer.h"

#define BS (1u << 20)
#define KEYS 64u
#define OP_MS 1000u
#define ABANDON_MS 3000u

static int g_uncertain, g_quiesced; /* source-side resilience events */
static pid_t g_stopped = -1;        /* the stopped target, killed even if the test fails */

static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    (void)ud;
    if (!ev->source_side) return;
    if (ev->state == KVCR_TRANSFER_UNCERTAIN) __atomic_fetch_add(&g_uncertain, 1, __ATOMIC_RELAXED);
    if (ev->state == KVCR_TRANSFER_QUIESCED) __atomic_fetch_add(&g_quiesced, 1, __ATOMIC_RELAXED);
}

static void source_start(rig *r)
{
    rig_init_remote(r, BS, KEYS, KEYS);
    r->cfg.agent_name = "source";
    r->cfg.enable_telemetry = true;
    r->cfg.operation_timeout_ms = OP_MS;
    r->cfg.abandon_timeout_ms = ABANDON_MS;
    r->cfg.callbacks.resilience = on_resilience;
    rig_start(r);
    for (uint32_t i = 0; i < KEYS; i += 16) {
        char names[16][24];
        const char *keys[16];
        size_t at[16];
        for (uint32_t k = 0; k < 16; k++) {
            keys[k] = peer_key(names[k], sizeof names[k], i + k);
            at[k] = i + k;
            rig_pattern(r, i + k, i + k);
        }
        kvcr_entry_status st[16];
        assert_int_equal(rig_wait(r, rig_deposit(r, keys, at, 16, 0), st, NULL, NULL), 16);
        for (uint32_t k = 0; k < 16; k++) assert_int_equal(st[k], KVCR_ENTRY_SUCCESS);
    }
}

static void target_spawn(peer *t, const char *agent)
{
    peer_opts o;
    peer_opts_init(&o);
    o.block_size = BS;
    o.slots = 0; /* delivers into framework memory */
    o.fw_n = KEYS;
    o.agent = agent;
    peer_spawn(t, &o);
}

/* Runs the source's callbacks and settles its finished writes. */
static void pump(rig *r)
{
    kvcr_op_result *res;
    size_t n;
    assert_int_equal(kvcr_poll(r->kv, &res, &n), 0);
    kvcr_results_free(res);
}

static double in_flight(rig *r)
{
    return rig_stat(r, "source_writes_in_flight", NULL);
}

/* The whole key range, 16 keys per operation, four at a time. */
static peer_pull all_keys(const rig *source)
{
    peer_pull p = {.first = 0, .span = KEYS, .keys_per_op = 16, .depth = 4, .n_ops = 4,
                   .max_ms = 10000};
    snprintf(p.source, sizeof p.source, "%s", kvcr_control_endpoint(source->kv));
    return p;
}

/* Starts the target's pulls and stops it while a write is in UCX. False
 * when every write finished before the stop landed (then it is resumed). */
static bool stop_mid_write(rig *r, peer *t)
{
    peer_pull p = all_keys(r);
    peer_pull_start(t, &p);
    for (int spin = 0; spin < 100000 && in_flight(r) < 1; spin++) {
        pump(r);
        usleep(50);
    }
    assert_true(in_flight(r) >= 1);
    g_stopped = t->pid;
    kill(t->pid, SIGSTOP);
    usleep(200 * 1000);
    pump(r);
    if (in_flight(r) >= 1) return true;
    kill(t->pid, SIGCONT);
    for (int spin = 0; spin < 20000 && !peer_pull_stats_get(t).idle; spin++) {
        pump(r);
        usleep(1000);
    }
    return false;
}

static void test_writes_to_a_stopped_target_end_at_the_abandon_deadline(void **state)
{
    (void)state;
    g_uncertain = g_quiesced = 0;
    rig r;
    source_start(&r);
    peer t;
    target_spawn(&t, "stopped");
    bool stopped = false;
    for (int attempt = 0; attempt < 5 && !stopped; attempt++) stopped = stop_mid_write(&r, &t);
    if (!stopped) fail_msg("every write finished before the target stopped, 5 times");

    /* Bounded: the abandon deadline, then a few turns to settle. */
    for (int spin = 0; spin < (int)(ABANDON_MS + 10000) / 10 && in_flight(&r) > 0; spin++) {
        pump(&r);
        usleep(10 * 1000);
    }
    assert_int_equal(in_flight(&r), 0);
    pump(&r); /* events queued by the last settle */
    int uncertain = __atomic_load_n(&g_uncertain, __ATOMIC_RELAXED);
    int quiesced = __atomic_load_n(&g_quiesced, __ATOMIC_RELAXED);
    assert_true(uncertain >= 1);
    assert_int_equal(quiesced, uncertain); /* every write reported uncertain is quiet now */
    peer_kill(&t);
    g_stopped = -1;

    /* the memory those writes read serves the next target, bytes checked */
    peer u;
    target_spawn(&u, "next");
    peer_pull p = all_keys(&r);
    peer_pull_start(&u, &p);
    peer_pull_stats st = {0};
    for (int spin = 0; spin < 20000; spin++) {
        pump(&r);
        st = peer_pull_stats_get(&u);
        if (st.done >= 4) break;
        usleep(1000);
    }
    assert_int_equal(st.done, 4);
    assert_int_equal(st.ok_entries, KEYS);
    assert_int_equal(st.bad_bytes, 0);
    peer_stop(&u);
    rig_stop(&r);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
