/* Deadlines and probes between real processes: a fetch whose source cannot
 * get its sources in time fails at the operation deadline, the probe fences
 * the source's pending write and its terminal answer frees the KVCR slots
 * before the abandon deadline (no uncertain event); a hint without a
 * request publishes our metadata to the source at once (eager connect);
 * telemetry counts remote bytes; a taken control port is a clear error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"

#define BS 4096
#define OP_MS 1500u
#define MS 1000000ull

static int uncertain_events;

static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    (void)ud;
    if (ev->state == KVCR_TRANSFER_UNCERTAIN) uncertain_events++;
}

static bool pin_cancelled(const peer_counts *c)
{
    return c->pin_cancels >= 1;
}

static bool pin_requested(const peer_counts *c)
{
    return c->pin_requests >= 1;
}

static void test_fetch_deadline_probe_frees_slots_without_uncertainty(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.slots = 0;
    o.fw_n = 4;
    o.hold_pins = true; /* the source accepts, then never gets its sources */
    peer src;
    peer_spawn(&src, &o);

    rig r;
    rig_init_remote(&r, BS, 4, 4);
    r.cfg.operation_timeout_ms = OP_MS;
    r.cfg.abandon_timeout_ms = 5000;
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.resilience = on_resilience;
    uncertain_events = 0;
    rig_start(&r);
    peer_hint_range(&r, "f", src.endpoint, 0, 4);
    /* This process's clock stands still (kvcr/testing.h) until the test
     * moves it: the deadline passes when the source holds the write, never
     * before, however loaded the machine; and the abandon deadline never
     * passes, so the slot can only come back through the probe's answer.
     * (The advance reads to the progress thread as a stall of its source
     * side, which this process, a target only, does not use.) */
    kvcr__test_clock_freeze();
    kvcr_key k = key_of("k1");
    kvcr_op_handle op;
    assert_int_equal(kvcr_fetch(r.kv, &k, 1, "f", NULL, 0, &op), 0);
    kvcr_query_result q;
    assert_int_equal(kvcr_query(r.kv, &k, 1, NULL, &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_FETCHING); /* a slot is being filled */
    assert_int_equal(rig_stat(&r, "local_g2_free_slots", NULL), 3);
    peer_wait(&src, pin_requested); /* the source took the write */

    kvcr__test_clock_advance(OP_MS * MS); /* the deadline */
    kvcr_entry_status st;
    kvcr_reason why;
    assert_int_equal(rig_wait(&r, op, &st, &why, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    assert_int_equal(why, KVCR_REASON_TIMEOUT);

    /* The probe's terminal answer (the clock short of the 5 s abandon
     * deadline) gives the slot back; nothing was reported uncertain. */
    double free_slots = 0;
    for (int spin = 0; spin < 3000 && free_slots != 4; spin++) {
        kvcr_op_result *res;
        size_t n;
        assert_int_equal(kvcr_poll(r.kv, &res, &n), 0);
        kvcr_results_free(res);
        free_slots = rig_stat(&r, "local_g2_free_slots", NULL);
        if (free_slots != 4) usleep(1000);
    }
    assert_int_equal(free_slots, 4);
    assert_int_equal(uncertain_events, 0);
    assert_int_equal(kvcr_query(r.kv, &k, 1, "f", &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_MISS); /* the failed request stays failed */

    /* the source gave up its pin request once the write was fenced */
    peer_counts c = peer_wait(&src, pin_cancelled);
    assert_int_equal(c.pin_requests, 1);
    assert_int_equal(c.pin_cancels, 1);
    kvcr__test_clock_run(); /* close's bounded waits count on it */
    rig_stop(&r);
    peer_stop(&src);
}

static void test_hint_without_request_connects_eagerly(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 2);
    rig r;
    rig_init_remote(&r, BS, 4, 4);
    r.cfg.enable_telemetry = true;
    rig_start(&r);
    assert_int_equal(rig_stat(&r, "connected_remotes", NULL), 0);
    peer_hint_range(&r, NULL, src.endpoint, 0, 2); /* no request: only the eager metadata */
    double peers = 0;
    for (int spin = 0; spin < 3000 && peers != 1; spin++) {
        peers = rig_stat(&r, "connected_remotes", NULL);
        if (peers != 1) usleep(1000);
    }
    assert_int_equal(peers, 1); /* the source acknowledged our metadata */

    /* a transfer afterwards is counted in the remote telemetry */
    peer_hint_range(&r, "t", src.endpoint, 0, 2);
    kvcr_mem_ref ref = {NULL, "", 0};
    kvcr_block b = {key_of("k1"), &ref, 1};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deliver(r.kv, &b, 1, "t", &op), 0);
    kvcr_entry_status st;
    assert_int_equal(rig_wait(&r, op, &st, NULL, NULL), 1);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, r.fw, 1));
    assert_int_equal(rig_stat(&r, NULL, "remote_deliver"), BS);
    rig_stop(&r);
    peer_stop(&src);
}

static void test_second_instance_on_a_taken_port_is_refused(void **state)
{
    (void)state;
    rig a, b;
    rig_init_remote(&a, BS, 4, 4);
    rig_start(&a);
    const char *ep = kvcr_control_endpoint(a.kv);
    const char *colon = strrchr(ep, ':');
    assert_non_null(colon);
    rig_init_remote(&b, BS, 4, 4);
    b.cfg.remote.control_port = (uint16_t)atoi(colon + 1);
    b.cfg.agent_name = "second";
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr_create(&b.cfg, &kv), KVCR_ESYS);
    assert_null(kv);
    assert_non_null(strstr(kvcr_last_error(), "Address already in use"));
    rig_stop(&b);
    rig_stop(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_deadline_probe_frees_slots_without_uncertainty),
        cmocka_unit_test(test_hint_without_request_connects_eagerly),
        cmocka_unit_test(test_second_instance_on_a_taken_port_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
