/* CURVE on the control channel, with real sockets on 127.0.0.1: two CURVE
 * instances move blocks with the bytes compared; a peer whose key is not in
 * the allow-list, a plaintext peer, and a message whose reply endpoint names
 * another key than its connection's get nothing processed (counted); hints
 * and configurations that would mix CURVE and plaintext, or name a key
 * outside the allow-list, are refused with their reason.
 *
 * "Processed" is observed through the dropped-message count: a write_done
 * for an operation the instance never started is dropped, and counted, only
 * once it was decoded and dispatched. Each negative case is paired with
 * the same message sent the admitted way, which must be counted. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "kvcr/error.h"
#include "net/control.h"
#include "net/wire.h"
#include "peer.h"

#define BS 4096
#define WAIT_MS 5000  /* how long anything may take to arrive on loopback */
#define QUIET_MS 300  /* how long we watch for something that must not happen */

typedef struct keypair {
    char pub[41], sec[41];
} keypair;

static keypair new_keys(void)
{
    keypair k;
    assert_int_equal(zmq_curve_keypair(k.pub, k.sec), 0);
    return k;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A remote rig with CURVE: own key pair, allowed keys as given. */
static void curve_rig(rig *r, const char *name, const keypair *k, const char *const *allowed,
                      size_t n)
{
    rig_init_remote(r, BS, 8, 8);
    r->cfg.agent_name = name;
    r->cfg.enable_telemetry = true;
    r->cfg.remote.curve = (kvcr_curve_options){k->sec, k->pub, allowed, n};
}

static uint64_t dropped(rig *r)
{
    return kvcr__test_dropped_messages(r->kv);
}

/* A count to wait for: a telemetry gauge, or (gauge NULL) the dropped
 * messages. */
static double count_of(rig *r, const char *gauge)
{
    return gauge ? rig_stat(r, gauge, NULL) : (double)dropped(r);
}

/* Waits (bounded) until the count reaches at least want; returns it. */
static double wait_count(rig *r, const char *gauge, double want)
{
    double v = count_of(r, gauge);
    for (uint64_t end = now_ms() + WAIT_MS; v < want && now_ms() < end; v = count_of(r, gauge))
        poll(NULL, 0, 5);
    return v;
}

/* A write_done for an operation nobody started, from agent "raw", naming
 * from as the place for replies: ctl_send's result. */
static int try_stray_done(ctl_channel *c, const char *to, const char *from)
{
    static const uint8_t inc[WIRE_INCARNATION_LEN] = {1, 2, 3};
    wire_msg m = {.type = WIRE_WRITE_DONE, .agent = {(const uint8_t *)"raw", 3},
                  .incarnation = {inc, sizeof inc},
                  .from = {(const uint8_t *)from, strlen(from)},
                  .to = {(const uint8_t *)to, strlen(to)},
                  .has_op = true, .op = 424242, .success = false, .terminal = true};
    void *buf;
    size_t len;
    assert_int_equal(wire_encode(&m, &buf, &len), 0);
    int rc = ctl_send(c, to, buf, len);
    free(buf);
    return rc;
}

/* The same, to a peer that admits it: the send must be taken. */
static void send_stray_done(ctl_channel *c, const char *to, const char *from)
{
    assert_int_equal(try_stray_done(c, to, from), 0);
}

/* The same, to a peer whose handshake refuses it: once libzmq has seen a
 * refusal its socket may have no connection to queue on for a moment
 * (EAGAIN until it dials again), so a send may fail; what counts is that
 * nothing is processed. */
static void send_refused_stray_done(ctl_channel *c, const char *to, const char *from)
{
    int rc = try_stray_done(c, to, from);
    assert_true(rc == 0 || rc == KVCR_ESYS);
}

/* A raw control channel on 127.0.0.1 (CURVE with k when k is not NULL). */
static ctl_channel *raw_channel(const keypair *k, const char *const *allowed, size_t n)
{
    ctl_curve curve = {k ? k->sec : NULL, k ? k->pub : NULL, allowed, n};
    ctl_channel *c = NULL;
    if (ctl_open("127.0.0.1", 0, -1, "127.0.0.1", WIRE_MAX_MESSAGE, k ? &curve : NULL, NULL, &c) != 0)
        fail_msg("ctl_open: %s", kvcr_last_error());
    return c;
}

/* The endpoint's address part: "tcp://host:port". */
static void address_of(const char *endpoint, char *out, size_t cap)
{
    const char *key = ctl_endpoint_key(endpoint);
    assert_non_null(key);
    snprintf(out, cap, "%.*s", (int)(key - endpoint - (sizeof CTL_CURVE_TAG - 1)), endpoint);
}

/* A CURVE source that holds k0..k<blocks-1> (pattern i) in KVCR DRAM. */
static void start_source(rig *a, const keypair *k, const char *const *allowed, size_t n,
                         uint32_t blocks)
{
    curve_rig(a, "source", k, allowed, n);
    rig_start(a);
    char name[24];
    for (uint32_t i = 0; i < blocks; i++) {
        rig_pattern(a, i, i);
        assert_int_equal(rig_deposit1(a, peer_key(name, sizeof name, i), i, 0, NULL, NULL),
                         KVCR_ENTRY_SUCCESS);
    }
}

static void test_two_curve_instances_move_exact_bytes(void **state)
{
    (void)state;
    keypair ka = new_keys(), kb = new_keys();
    const char *a_allows[] = {kb.pub}, *b_allows[] = {ka.pub};
    rig a, b;
    start_source(&a, &ka, a_allows, 1, 4);
    curve_rig(&b, "target", &kb, b_allows, 1);
    rig_start(&b);

    /* The endpoint carries the public key, for routers to pass on as is. */
    const char *ep = kvcr_control_endpoint(a.kv);
    assert_non_null(strstr(ep, "tcp://127.0.0.1:"));
    const char *key = ctl_endpoint_key(ep);
    assert_non_null(key);
    assert_string_equal(key, ka.pub);

    memset(b.fw, 0, b.fw_count * BS);
    peer_hint_range(&b, "req-1", ep, 0, 4);
    kvcr_entry_status st[4];
    assert_int_equal(rig_wait(&b, peer_deliver_range(&b, 0, 4, 4, "req-1"), st, NULL, NULL), 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&b, b.fw + (4 + i) * BS, i));
    }
    assert_int_equal(rig_stat(&b, NULL, "remote_deliver"), 4 * BS);
    static const char *const refusals[] = {"control_auth_refused_connections",
                                           "control_auth_refused_messages"};
    for (int g = 0; g < 2; g++) {
        assert_int_equal(rig_stat(&a, refusals[g], NULL), 0);
        assert_int_equal(rig_stat(&b, refusals[g], NULL), 0);
    }
    rig_stop(&b);
    rig_stop(&a);
}

/* C allows A, but A does not allow C: A's ZAP handler refuses C's
 * connection, so C's start_write never reaches A and nothing is written. */
static void test_a_key_outside_the_allow_list_gets_nothing_processed(void **state)
{
    (void)state;
    keypair ka = new_keys(), kb = new_keys(), kc = new_keys();
    const char *a_allows[] = {kb.pub}, *c_allows[] = {ka.pub};
    rig a, c;
    start_source(&a, &ka, a_allows, 1, 1);
    curve_rig(&c, "intruder", &kc, c_allows, 1);
    c.cfg.operation_timeout_ms = 300; /* its deliver can only fail: let it fail soon */
    c.cfg.abandon_timeout_ms = 600;
    rig_start(&c);

    memset(c.fw, 0xee, c.fw_count * BS);
    peer_hint_range(&c, "req-1", kvcr_control_endpoint(a.kv), 0, 1);
    kvcr_entry_status st;
    assert_int_equal(rig_wait(&c, peer_deliver_range(&c, 0, 1, 2, "req-1"), &st, NULL, NULL), 1);
    assert_int_not_equal(st, KVCR_ENTRY_SUCCESS);
    for (size_t i = 0; i < BS; i++) assert_int_equal(c.fw[2 * BS + i], 0xee);

    assert_true(wait_count(&a, "control_auth_refused_connections", 1) >= 1);
    assert_int_equal(dropped(&a), 0); /* not one message decoded */
    pthread_mutex_lock(&a.cb_lock);
    if (strstr(a.last_warning, "is not in the allow-list") == NULL ||
        strstr(a.last_warning, kc.pub) == NULL)
        fail_msg("warning: %s", a.last_warning);
    pthread_mutex_unlock(&a.cb_lock);
    assert_int_equal(rig_stat(&c, NULL, "remote_deliver"), -1);
    rig_stop(&c);
    rig_stop(&a);
}

/* A plaintext sender at a CURVE instance's address, and a CURVE sender
 * that believes the address has another key: neither handshake can
 * succeed (each counted), so nothing is decoded; the same message from an
 * admitted CURVE sender is. */
static void test_plaintext_and_misdialled_peers_get_nothing_processed(void **state)
{
    (void)state;
    keypair ka = new_keys(), kx = new_keys(), kw = new_keys();
    const char *a_allows[] = {kx.pub}, *x_allows[] = {ka.pub};
    rig a;
    curve_rig(&a, "curved", &ka, a_allows, 1);
    rig_start(&a);
    const char *ep = kvcr_control_endpoint(a.kv);
    char addr[CTL_MAX_ENDPOINT + 1];
    address_of(ep, addr, sizeof addr);

    ctl_channel *plain = raw_channel(NULL, NULL, 0);
    for (int i = 0; i < 5; i++) send_refused_stray_done(plain, addr, ctl_endpoint(plain));
    assert_true(wait_count(&a, "control_auth_refused_connections", 1) >= 1);
    poll(NULL, 0, QUIET_MS);
    assert_int_equal(dropped(&a), 0);

    /* x's key is admitted, but it dials a's address with the wrong server key. */
    const char *w_allows[] = {kw.pub};
    ctl_channel *misdial = raw_channel(&kx, w_allows, 1);
    char wrong[2 * CTL_MAX_ENDPOINT];
    snprintf(wrong, sizeof wrong, "%s" CTL_CURVE_TAG "%s", addr, kw.pub);
    double before = rig_stat(&a, "control_auth_refused_connections", NULL);
    send_refused_stray_done(misdial, wrong, ctl_endpoint(misdial));
    assert_true(wait_count(&a, "control_auth_refused_connections", before + 1) >= before + 1);
    ctl_close(misdial);
    poll(NULL, 0, QUIET_MS);
    assert_int_equal(dropped(&a), 0);

    ctl_channel *x = raw_channel(&kx, x_allows, 1);
    send_stray_done(x, ep, ctl_endpoint(x));
    assert_int_equal(wait_count(&a, NULL, 1), 1);
    assert_int_equal(rig_stat(&a, "control_auth_refused_messages", NULL), 0);
    ctl_close(x);
    ctl_close(plain);
    rig_stop(&a);
}

/* X holds an admitted key but names Y's endpoint for replies: dropped and
 * counted, while the same message naming X's own endpoint is processed. */
static void test_a_reply_endpoint_with_another_key_is_dropped(void **state)
{
    (void)state;
    keypair ka = new_keys(), kx = new_keys(), ky = new_keys();
    const char *a_allows[] = {kx.pub, ky.pub}, *x_allows[] = {ka.pub};
    rig a;
    curve_rig(&a, "curved", &ka, a_allows, 2);
    rig_start(&a);
    const char *ep = kvcr_control_endpoint(a.kv);
    ctl_channel *x = raw_channel(&kx, x_allows, 1);
    char third[CTL_MAX_ENDPOINT + 1];
    snprintf(third, sizeof third, "tcp://127.0.0.1:9" CTL_CURVE_TAG "%s", ky.pub);

    send_stray_done(x, ep, third);
    assert_true(wait_count(&a, "control_auth_refused_messages", 1) >= 1);
    assert_int_equal(dropped(&a), 1);
    send_stray_done(x, ep, "tcp://127.0.0.1:9"); /* no key at all */
    assert_true(wait_count(&a, "control_auth_refused_messages", 2) >= 2);

    send_stray_done(x, ep, ctl_endpoint(x));
    assert_int_equal(wait_count(&a, NULL, 3), 3);
    assert_int_equal(rig_stat(&a, "control_auth_refused_messages", NULL), 2);
    assert_int_equal(rig_stat(&a, "control_auth_refused_connections", NULL), 0);
    ctl_close(x);
    rig_stop(&a);
}

static void expect_hint_refused(rig *r, const char *source, const char *words)
{
    char json[1024];
    uint64_t h = 1;
    peer_hint_json(json, sizeof json, source, &h, 1);
    assert_int_equal(kvcr_submit_hint(r->kv, "req-x", json, strlen(json)), KVCR_EINVAL);
    if (strstr(kvcr_last_error(), words) == NULL) fail_msg("message: %s", kvcr_last_error());
}

static void test_hints_that_mix_curve_and_plaintext_are_refused(void **state)
{
    (void)state;
    keypair ka = new_keys(), kb = new_keys(), kz = new_keys();
    const char *a_allows[] = {kb.pub};
    rig a, p;
    curve_rig(&a, "curved", &ka, a_allows, 1);
    rig_start(&a);
    rig_init_remote(&p, BS, 4, 4);
    p.cfg.agent_name = "plain";
    rig_start(&p);
    char ep[CTL_MAX_ENDPOINT + 1];

    expect_hint_refused(&a, "tcp://127.0.0.1:5555", "no CURVE key");
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:5555" CTL_CURVE_TAG "%s", kz.pub);
    expect_hint_refused(&a, ep, "not in this instance's allow-list");
    expect_hint_refused(&p, kvcr_control_endpoint(a.kv), "CURVE is off here");
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:5555" CTL_CURVE_TAG "%.39s~", kb.pub);
    expect_hint_refused(&a, ep, "not 40 characters of Z85");

    /* Allowed: accepted. */
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:5555" CTL_CURVE_TAG "%s", kb.pub);
    peer_hint_range(&a, "req-ok", ep, 0, 1);
    rig_stop(&p);
    rig_stop(&a);
}

static void expect_config_refused(const kvcr_curve_options *curve, int code, const char *words)
{
    rig r;
    rig_init_remote(&r, BS, 4, 4);
    r.cfg.remote.curve = *curve;
    kvcr_t *kv = (kvcr_t *)1;
    assert_int_equal(kvcr_create(&r.cfg, &kv), code);
    assert_null(kv);
    if (strstr(kvcr_last_error(), words) == NULL) fail_msg("message: %s", kvcr_last_error());
    rig_stop(&r);
}

static void test_curve_configuration_is_checked(void **state)
{
    (void)state;
    keypair k = new_keys(), other = new_keys();
    const char *allows[] = {other.pub}, *bad_allows[] = {other.pub, "short"},
               *null_allows[] = {NULL};
    char bad_z85[41];
    memcpy(bad_z85, k.sec, sizeof bad_z85);
    bad_z85[7] = '~'; /* not a Z85 character */

    expect_config_refused(&(kvcr_curve_options){bad_z85, NULL, allows, 1}, KVCR_EINVAL,
                          "secret_key is not a Z85 key");
    expect_config_refused(&(kvcr_curve_options){"tooshort", NULL, allows, 1}, KVCR_EINVAL,
                          "secret_key is not a Z85 key");
    expect_config_refused(&(kvcr_curve_options){k.sec, other.pub, allows, 1}, KVCR_EINVAL,
                          "does not belong to secret_key");
    expect_config_refused(&(kvcr_curve_options){k.sec, "nope", allows, 1}, KVCR_EINVAL,
                          "public_key 'nope' is not a Z85 key");
    expect_config_refused(&(kvcr_curve_options){k.sec, k.pub, NULL, 0}, KVCR_EINVAL,
                          "allowed_keys must list at least one");
    expect_config_refused(&(kvcr_curve_options){k.sec, k.pub, bad_allows, 2}, KVCR_EINVAL,
                          "allowed_keys[1] 'short' is not a Z85 key");
    expect_config_refused(&(kvcr_curve_options){k.sec, k.pub, null_allows, 1}, KVCR_EINVAL,
                          "allowed_keys[0] '(null)'");
    expect_config_refused(&(kvcr_curve_options){NULL, k.pub, allows, 1}, KVCR_EINVAL,
                          "without secret_key");
    /* The secret key itself is never quoted. */
    expect_config_refused(&(kvcr_curve_options){k.sec, other.pub, allows, 1}, KVCR_EINVAL,
                          k.pub);
    assert_null(strstr(kvcr_last_error(), k.sec));

    /* Guard mode would hand the endpoint to a Guard without the keys. */
    rig g;
    curve_rig(&g, "guarded", &k, allows, 1);
    g.cfg.local_dram = NULL;
    g.cfg.n_local_dram = 0;
    g.cfg.guard = (kvcr_guard_options){.service_socket_path = "/nonexistent/kvcr.sock",
                                       .compatibility_digest = "d"};
    kvcr_t *kv = (kvcr_t *)1;
    assert_int_equal(kvcr_create(&g.cfg, &kv), KVCR_ENOTSUP);
    assert_null(kv);
    assert_non_null(strstr(kvcr_last_error(), "guard mode is not built"));
    rig_stop(&g);

    /* public_key may be left out: derived from the secret key. */
    rig r;
    curve_rig(&r, "derived", &k, allows, 1);
    r.cfg.remote.curve.public_key = NULL;
    rig_start(&r);
    assert_string_equal(ctl_endpoint_key(kvcr_control_endpoint(r.kv)), k.pub);
    rig_stop(&r);
}

static void test_keyed_endpoint_strings(void **state)
{
    (void)state;
    keypair k = new_keys();
    char ep[CTL_MAX_ENDPOINT + 2];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:80" CTL_CURVE_TAG "%s", k.pub);
    assert_int_equal(ctl_check_endpoint(ep), 0);
    assert_string_equal(ctl_endpoint_key(ep), k.pub);
    assert_null(ctl_endpoint_key("tcp://127.0.0.1:80"));
    static const char *const bad[] = {
        "tcp://h#x:80",                 /* '#' never in a host */
        "tcp://127.0.0.1:80#curve=",    /* no key */
        "tcp://127.0.0.1:80#curve=abc", /* too short */
        "tcp://127.0.0.1#curve=0123456789012345678901234567890123456789", /* no port */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (ctl_check_endpoint(bad[i]) != KVCR_EINVAL) fail_msg("'%s' accepted", bad[i]);
    /* 40 characters, one of them outside Z85 (a space is refused earlier). */
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:80" CTL_CURVE_TAG "%.39s~", k.pub);
    assert_int_equal(ctl_check_endpoint(ep), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "Z85"));
    /* A plaintext channel will not send to a keyed endpoint, nor the
     * reverse. */
    ctl_channel *plain = raw_channel(NULL, NULL, 0);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:80" CTL_CURVE_TAG "%s", k.pub);
    assert_int_equal(ctl_send(plain, ep, "x", 1), KVCR_EINVAL);
    keypair mine = new_keys();
    const char *allows[] = {k.pub};
    ctl_channel *curved = raw_channel(&mine, allows, 1);
    assert_int_equal(ctl_send(curved, "tcp://127.0.0.1:80", "x", 1), KVCR_EINVAL);
    assert_int_equal(ctl_send(curved, ep, "x", 1), 0);
    ctl_close(curved);
    ctl_close(plain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_curve_instances_move_exact_bytes),
        cmocka_unit_test(test_a_key_outside_the_allow_list_gets_nothing_processed),
        cmocka_unit_test(test_plaintext_and_misdialled_peers_get_nothing_processed),
        cmocka_unit_test(test_a_reply_endpoint_with_another_key_is_dropped),
        cmocka_unit_test(test_hints_that_mix_curve_and_plaintext_are_refused),
        cmocka_unit_test(test_curve_configuration_is_checked),
        cmocka_unit_test(test_keyed_endpoint_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
