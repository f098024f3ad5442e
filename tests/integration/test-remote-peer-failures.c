/* The peer tier when peers fail or misbehave, with real processes on
 * 127.0.0.1: a source killed mid-transfer (the target fails by the abandon
 * deadline, reports its destinations uncertain, and nothing is written),
 * a source restarted at the same address (the old incarnation is fenced),
 * and a peer that sends garbage (dropped, counted, no harm). */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "peer.h"

#define BS 4096

typedef struct events {
    pthread_mutex_t lock;
    int uncertain, quiesced, other;
    size_t regions;
} events;

static events g_events = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0};

static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    (void)ud;
    pthread_mutex_lock(&g_events.lock);
    if (ev->state == KVCR_TRANSFER_UNCERTAIN) {
        g_events.uncertain++;
        g_events.regions += ev->n_regions;
    } else if (ev->state == KVCR_TRANSFER_QUIESCED) {
        g_events.quiesced++;
    } else {
        g_events.other++;
    }
    pthread_mutex_unlock(&g_events.lock);
}

static int reset_events(void **state)
{
    (void)state;
    pthread_mutex_lock(&g_events.lock);
    g_events.uncertain = g_events.quiesced = g_events.other = 0;
    g_events.regions = 0;
    pthread_mutex_unlock(&g_events.lock);
    return 0;
}

static bool pin_requested(const peer_counts *c)
{
    return c->pin_requests >= 1;
}

static bool six_dropped(const peer_counts *c)
{
    return c->dropped_messages >= 6;
}

static bool all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i]) return false;
    return true;
}

/* Set by tests/CMakeLists.txt for the run over TCP alone with a UCX that
 * aborts a process whose TCP connection fails during set-up (UCX <= 1.13,
 * docs/ARCHITECTURE.md "Peer failures over TCP"): a scenario that kills a
 * peer while UCX may still be connecting to it is skipped, saying why. */
static bool skip_kill_during_setup(void)
{
    if (getenv("KVCR_TEST_UCX_TCP_SETUP_ABORTS") == NULL) return false;
    print_message("skipped: over TCP, this UCX aborts a process whose peer dies while UCX "
                  "sets up the connection (docs/ARCHITECTURE.md, \"Peer failures over TCP\")\n");
    return true;
}

/* The deadline of a pull that must succeed: a first contact over UCX's
 * TCP, under valgrind with other tests at once, took more than 2 s. */
#define SURE_MS 20000u

static void rig_remote(rig *r, uint32_t op_ms, uint32_t abandon_ms)
{
    rig_init_remote(r, BS, 16, 8);
    r->cfg.operation_timeout_ms = op_ms;
    r->cfg.abandon_timeout_ms = abandon_ms;
    r->cfg.callbacks.resilience = on_resilience;
    rig_start(r);
}

/* The target's bound on pulls that ask for their bytes inline in
 * write_done (KVCR_INLINE_WRITE_MAX, read when an instance starts), set
 * for one scenario and put back after it. */
static char saved_inline[32];
static bool had_inline;

static void inline_max_set(const char *v)
{
    const char *old = getenv("KVCR_INLINE_WRITE_MAX");
    had_inline = old != NULL;
    snprintf(saved_inline, sizeof saved_inline, "%s", old ? old : "");
    setenv("KVCR_INLINE_WRITE_MAX", v, 1);
}

static void inline_max_restore(void)
{
    if (had_inline)
        setenv("KVCR_INLINE_WRITE_MAX", saved_inline, 1);
    else
        unsetenv("KVCR_INLINE_WRITE_MAX");
}

/* A deliver of 4 blocks from a source that accepts the write, then never
 * gets its sources (its pins are held) and is killed: fails TIMEOUT. */
static void deliver_from_a_source_killed_mid_transfer(rig *r, uint32_t abandon_ms)
{
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0;
    o.fw_n = 8;
    o.hold_pins = true;
    peer src;
    peer_spawn(&src, &o);
    rig_remote(r, 1500, abandon_ms); /* room for a slow (sanitized, loaded) start-up */
    peer_hint_range(r, "req", src.endpoint, 0, 8);
    kvcr_op_handle op = peer_deliver_range(r, 0, 4, 0, "req");
    peer_wait(&src, pin_requested);
    peer_kill(&src);
    rig_wait_all_failed(r, op, 4, KVCR_REASON_TIMEOUT);
}

/* Writes with UCX (inline writes off): the source may still write until it
 * is proven quiet, so the destinations are reported uncertain at the
 * abandon deadline. */
static void test_source_killed_mid_transfer_fails_by_abandon_deadline(void **state)
{
    (void)state;
    if (skip_kill_during_setup()) skip();
    inline_max_set("0");
    rig r;
    deliver_from_a_source_killed_mid_transfer(&r, 3000);
    /* the destinations were reported uncertain, one region per block */
    pthread_mutex_lock(&g_events.lock);
    assert_int_equal(g_events.uncertain, 1);
    assert_int_equal(g_events.regions, 4);
    assert_int_equal(g_events.quiesced, 0);
    pthread_mutex_unlock(&g_events.lock);
    assert_true(all_zero(r.fw, 4 * BS)); /* nothing was written */
    /* the request is failed closed: nothing more is fetched for it */
    char k[24];
    kvcr_key key = key_of(peer_key(k, sizeof k, 5));
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r.kv, &key, 1, "req", &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_MISS);
    rig_stop(&r);
    inline_max_restore();
}

/* The same with the bytes asked for inline: nothing but the target writes
 * its destinations, so the deliver fails at its operation deadline and
 * nothing is uncertain, though the source never answers. */
static void test_source_killed_mid_inline_pull_fails_at_its_deadline_never_uncertain(void **state)
{
    (void)state;
    if (skip_kill_during_setup()) skip();
    inline_max_set("65536");
    rig r;
    deliver_from_a_source_killed_mid_transfer(&r, 60000); /* never reached in this test */
    pthread_mutex_lock(&g_events.lock);
    assert_int_equal(g_events.uncertain, 0);
    assert_int_equal(g_events.quiesced, 0);
    pthread_mutex_unlock(&g_events.lock);
    assert_true(all_zero(r.fw, 4 * BS));
    rig_stop(&r); /* at once: nothing is left waiting for the dead source */
    inline_max_restore();
}

static void test_restarted_source_at_same_address_is_fenced(void **state)
{
    (void)state;
    if (skip_kill_during_setup()) skip();
    uint16_t port = peer_free_port();
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0;
    o.fw_n = 8;
    o.hold_pins = true;
    o.slots = 4;
    o.deposit_n = 1; /* k0 in KVCR DRAM; k1.. only through (held) pins */
    o.port = port;
    peer old;
    peer_spawn(&old, &o);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", old.endpoint);

    rig r;
    rig_remote(&r, 1500, 3000); /* room for a slow (sanitized, loaded) start-up */
    /* a first transfer teaches the target which process serves there */
    peer_hint_range(&r, "r0", endpoint, 0, 8);
    kvcr_entry_status s0;
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 0, 1, 8, "r0"), &s0, NULL, NULL), 1);
    assert_int_equal(s0, KVCR_ENTRY_SUCCESS);
    peer_hint_range(&r, "r1", endpoint, 0, 8);
    kvcr_op_handle op1 = peer_deliver_range(&r, 1, 2, 0, "r1");
    peer_wait(&old, pin_requested);
    peer_kill(&old);

    /* a new process at the same address, holding every block */
    peer_opts n;
    peer_opts_init(&n);
    n.deposit_n = 8;
    n.port = port;
    peer fresh;
    peer_spawn(&fresh, &n);
    /* The same address; its lane's port is another, so the old endpoint's
     * lane refuses and the target reaches it over ZeroMQ at the address. */
    char was[256], now[256];
    assert_string_equal(peer_zmq_address(now, sizeof now, fresh.endpoint),
                        peer_zmq_address(was, sizeof was, endpoint));

    /* op1 belonged to the dead incarnation: the new one never completes it */
    kvcr_entry_status st[2];
    kvcr_reason why[2];
    assert_int_equal(rig_wait(&r, op1, st, why, NULL), 2);
    assert_int_equal(st[0], KVCR_ENTRY_FAILED);
    assert_int_equal(st[1], KVCR_ENTRY_FAILED);
    assert_true(all_zero(r.fw, 2 * BS));

    /* A new request still quotes the old incarnation: the new process
     * refuses it, having accepted nothing, and the same pull goes once more
     * quoting the refuser, which serves it. */
    peer_hint_range(&r, "r2", endpoint, 0, 8);
    kvcr_entry_status s;
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 3, 1, 3, "r2"), &s, NULL, NULL), 1);
    assert_int_equal(s, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, r.fw + 3 * BS, 3));
    rig_stop(&r);
    peer_stop(&fresh);
}

/* A target that comes back under the same agent name (new memory, new
 * endpoint) gets a fresh route; the write queued for the old one fails
 * instead of writing through the new one, and the old route goes away
 * once that write ends. By UCX, not inline, as in the garbage test below:
 * a target closed while its source still makes the endpoint an inline
 * pull asked for aborts inside UCX 1.13 over TCP. */
static void test_target_back_under_same_name_gets_a_fresh_route(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.hold_pins = true; /* k1.. wait for pins forever */
    o.fw_n = 4;
    o.slots = 4;
    o.deposit_n = 1; /* k0 in KVCR DRAM */
    peer src;
    peer_spawn(&src, &o);

    inline_max_set("0");
    rig old;
    rig_remote(&old, 1500, 3000);
    peer_hint_range(&old, "r", src.endpoint, 0, 4);
    kvcr_op_handle stuck = peer_deliver_range(&old, 1, 1, 1, "r");
    peer_wait(&src, pin_requested);

    rig fresh; /* same agent name "test", other memory and endpoint */
    rig_remote(&fresh, SURE_MS, 2 * SURE_MS);
    peer_hint_range(&fresh, "r", src.endpoint, 0, 4);
    kvcr_entry_status st;
    assert_int_equal(rig_wait(&fresh, peer_deliver_range(&fresh, 0, 1, 2, "r"), &st, NULL, NULL),
                     1);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&fresh, fresh.fw + 2 * BS, 0));
    assert_true(all_zero(fresh.fw + 1 * BS, BS)); /* the old request wrote nothing here */

    assert_int_equal(rig_wait(&old, stuck, &st, NULL, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_true(all_zero(old.fw + 1 * BS, BS));
    rig_stop(&old);
    rig_stop(&fresh);
    inline_max_restore();
    peer_stop(&src); /* exits 0 only if its close was clean */
}

static void send_raw(void *sock, const void *data, size_t len)
{
    assert_int_equal(zmq_send(sock, data, len, 0), (int)len);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void test_garbage_from_a_peer_is_dropped_and_counted(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 2);

    void *ctx = zmq_ctx_new();
    void *push = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    char addr[256];
    assert_int_equal(zmq_connect(push, peer_zmq_address(addr, sizeof addr, src.endpoint)), 0);
    send_raw(push, "\xff\xfe garbage", 10);
    send_raw(push, "", 0);
    send_raw(push, "\x93\x01\x02", 3); /* an array, truncated */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2); /* a map with an unknown type */
    pack_str(&pk, "v");
    msgpack_pack_int(&pk, 1);
    pack_str(&pk, "type");
    pack_str(&pk, "launch_missiles");
    send_raw(push, sb.data, sb.size);
    msgpack_sbuffer_clear(&sb);
    msgpack_pack_map(&pk, 1); /* a start_write with nothing in it */
    pack_str(&pk, "type");
    pack_str(&pk, "start_write");
    send_raw(push, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    uint8_t big[70000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7);
    send_raw(push, big, sizeof big);

    peer_counts c = peer_wait(&src, six_dropped);
    assert_int_equal(c.dropped_messages, 6);
    zmq_close(push);
    zmq_ctx_term(ctx);

    /* The source still serves a well-formed peer. By UCX, not inline: after
     * an inline pull the source makes its endpoint to us in the background,
     * and closing this instance within that round trip aborts it inside UCX
     * 1.13 over TCP (docs/ARCHITECTURE.md, "Peer failures over TCP"); a UCX
     * write completes only once that endpoint is made. */
    inline_max_set("0");
    rig r;
    rig_remote(&r, SURE_MS, 2 * SURE_MS);
    peer_hint_range(&r, "ok", src.endpoint, 0, 2);
    kvcr_entry_status st[2];
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 0, 2, 5, "ok"), st, NULL, NULL), 2);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[1], KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, r.fw + 5 * BS, 0));
    assert_true(rig_has_pattern(&r, r.fw + 6 * BS, 1));
    rig_stop(&r);
    inline_max_restore();
    peer_stop(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_source_killed_mid_transfer_fails_by_abandon_deadline,
                               reset_events),
        cmocka_unit_test_setup(
            test_source_killed_mid_inline_pull_fails_at_its_deadline_never_uncertain,
            reset_events),
        cmocka_unit_test_setup(test_restarted_source_at_same_address_is_fenced, reset_events),
        cmocka_unit_test_setup(test_garbage_from_a_peer_is_dropped_and_counted, reset_events),
        cmocka_unit_test_setup(test_target_back_under_same_name_gets_a_fresh_route, reset_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
