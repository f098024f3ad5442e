/* The ZeroMQ control channel on 127.0.0.1: messages both ways in order,
 * poll() on ctl_fd, the max of ctl_recv, oversized messages, sends that
 * never block, endpoint checks, a port already bound, forgetting and the
 * peer table's limit. Every wait is bounded by a deadline. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "kvcr/error.h"
#include "net/control.h"

#define HOST "127.0.0.1"
#define MAX_MESSAGE 4096
#define WAIT_MS 5000 /* how long a message may take to arrive on loopback */

/* Under TSan, libzmq's internal hand-offs are suppressed by tests/tsan.supp
 * (see scripts/test.sh). */
typedef struct inbox {
    size_t n, max_len;
    size_t lens[256];
    uint8_t data[256][MAX_MESSAGE];
} inbox;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void collect(void *ud, const void *data, size_t len, const char *peer_key)
{
    inbox *in = ud;
    assert_null(peer_key); /* plaintext channels */
    if (len > in->max_len) in->max_len = len;
    if (in->n < 256 && len <= MAX_MESSAGE) {
        memcpy(in->data[in->n], data, len);
        in->lens[in->n] = len;
    }
    in->n++;
}

static inbox *inbox_new(void)
{
    inbox *in = calloc(1, sizeof *in);
    assert_non_null(in);
    return in;
}

/* Receives until want messages arrived (or ms passed), at most max per
 * ctl_recv call, sleeping in poll() on ctl_fd in between: the fd must wake
 * us, so a poll that times out while messages are owed fails the test. */
static void drain(ctl_channel *c, inbox *in, size_t want, size_t max, int ms)
{
    uint64_t deadline = now_ms() + (uint64_t)ms;
    while (in->n < want) {
        size_t got = ctl_recv(c, max, collect, in);
        assert_true(got <= max);
        if (got > 0 || in->n >= want) continue;
        uint64_t t = now_ms();
        if (t >= deadline) fail_msg("%zu of %zu messages after %d ms", in->n, want, ms);
        struct pollfd p = {ctl_fd(c), POLLIN, 0};
        int rc = poll(&p, 1, (int)(deadline - t));
        if (rc == 0) fail_msg("ctl_fd did not wake: %zu of %zu messages", in->n, want);
        assert_true(rc == 1 || (rc < 0 && errno == EINTR));
    }
}

/* Receives for ms and expects nothing. */
static void expect_quiet(ctl_channel *c, inbox *in, int ms)
{
    size_t before = in->n;
    uint64_t deadline = now_ms() + (uint64_t)ms;
    for (uint64_t t = now_ms(); t < deadline; t = now_ms()) {
        ctl_recv(c, 16, collect, in);
        struct pollfd p = {ctl_fd(c), POLLIN, 0};
        poll(&p, 1, (int)(deadline - t));
    }
    ctl_recv(c, 16, collect, in);
    assert_int_equal(in->n, before);
}

static ctl_channel *open_channel(void)
{
    ctl_channel *c = NULL;
    if (ctl_open(HOST, 0, -1, HOST, MAX_MESSAGE, NULL, NULL, &c) != 0) fail_msg("ctl_open: %s", kvcr_last_error());
    assert_non_null(c);
    return c;
}

static unsigned port_of(const ctl_channel *c)
{
    const char *colon = strrchr(ctl_endpoint(c), ':');
    assert_non_null(colon);
    return (unsigned)strtoul(colon + 1, NULL, 10);
}

/* A 127.0.0.1 port that was just free: bound by a channel, then closed. */
static unsigned free_port(void)
{
    ctl_channel *c = open_channel();
    unsigned port = port_of(c);
    ctl_close(c);
    return port;
}

static size_t make_message(uint8_t *buf, const char *who, size_t i)
{
    /* Lengths vary from 0 to a few hundred bytes; content names sender and
     * sequence number. */
    size_t len = i == 0 ? 0 : (i * 37) % 400 + 16;
    for (size_t k = 0; k < len; k++) buf[k] = (uint8_t)(i * 131 + k);
    if (len) snprintf((char *)buf, len, "%s#%zu", who, i);
    return len;
}

static void expect_messages(const inbox *in, const char *who, size_t n)
{
    uint8_t want[MAX_MESSAGE];
    assert_int_equal(in->n, n);
    for (size_t i = 0; i < n; i++) {
        size_t len = make_message(want, who, i);
        assert_int_equal(in->lens[i], len);
        if (len) assert_memory_equal(in->data[i], want, len);
    }
}

static void test_two_channels_exchange_messages_both_ways_in_order(void **state)
{
    (void)state;
    enum { N = 200 };
    ctl_channel *a = open_channel(), *b = open_channel();
    assert_int_equal(strncmp(ctl_endpoint(a), "tcp://" HOST ":", strlen("tcp://" HOST ":")), 0);
    assert_int_equal(ctl_check_endpoint(ctl_endpoint(a)), 0);
    assert_int_not_equal(port_of(a), port_of(b));
    assert_true(ctl_fd(a) >= 0 && ctl_fd(b) >= 0);

    uint8_t buf[MAX_MESSAGE];
    for (size_t i = 0; i < N; i++) {
        size_t len = make_message(buf, "a", i);
        assert_int_equal(ctl_send(a, ctl_endpoint(b), buf, len), 0);
        len = make_message(buf, "b", i);
        assert_int_equal(ctl_send(b, ctl_endpoint(a), buf, len), 0);
    }
    inbox *at_a = inbox_new(), *at_b = inbox_new();
    drain(b, at_b, N, 64, WAIT_MS);
    drain(a, at_a, N, 64, WAIT_MS);
    expect_messages(at_b, "a", N);
    expect_messages(at_a, "b", N);

    /* Drained: a new message wakes ctl_fd again. */
    assert_int_equal(ctl_recv(a, 64, collect, at_a), 0);
    assert_int_equal(ctl_send(b, ctl_endpoint(a), "late", 4), 0);
    drain(a, at_a, N + 1, 64, WAIT_MS);
    assert_memory_equal(at_a->data[N], "late", 4);

    ctl_close(a);
    ctl_close(b);
    ctl_close(NULL);
    free(at_a);
    free(at_b);
}

static void test_recv_hands_over_at_most_max(void **state)
{
    (void)state;
    enum { N = 10 };
    ctl_channel *a = open_channel(), *b = open_channel();
    uint8_t buf[MAX_MESSAGE];
    for (size_t i = 0; i < N; i++)
        assert_int_equal(ctl_send(a, ctl_endpoint(b), buf, make_message(buf, "a", i)), 0);
    inbox *in = inbox_new();
    assert_int_equal(ctl_recv(b, 0, collect, in), 0);
    drain(b, in, N, 3, WAIT_MS); /* asserts every call returns <= 3 */
    expect_messages(in, "a", N);
    drain(b, in, N, 1, WAIT_MS);
    assert_int_equal(ctl_recv(b, 1000, collect, in), 0);
    ctl_close(a);
    ctl_close(b);
    free(in);
}

static void test_a_message_over_max_never_arrives(void **state)
{
    (void)state;
    ctl_channel *a = NULL, *b = open_channel();
    /* a may send more than b accepts: max_message only bounds receiving. */
    assert_int_equal(ctl_open(HOST, 0, -1, HOST, 4 * MAX_MESSAGE, NULL, NULL, &a), 0);
    static uint8_t big[MAX_MESSAGE + 1];
    memset(big, 'x', sizeof big);
    inbox *in = inbox_new();

    assert_int_equal(ctl_send(a, ctl_endpoint(b), big, MAX_MESSAGE), 0); /* exactly max: fine */
    drain(b, in, 1, 16, WAIT_MS);
    assert_int_equal(in->lens[0], MAX_MESSAGE);

    assert_int_equal(ctl_send(a, ctl_endpoint(b), big, MAX_MESSAGE + 1), 0);
    expect_quiet(b, in, 300);
    assert_int_equal(in->max_len, MAX_MESSAGE);

    /* b dropped that connection but still serves: a fresh socket gets through. */
    ctl_forget(a, ctl_endpoint(b));
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "small", 5), 0);
    drain(b, in, 2, 16, WAIT_MS);
    assert_int_equal(in->lens[1], 5);
    assert_memory_equal(in->data[1], "small", 5);
    assert_int_equal(in->max_len, MAX_MESSAGE);
    ctl_close(a);
    ctl_close(b);
    free(in);
}

static void test_sends_to_nothing_listening_never_block(void **state)
{
    (void)state;
    char nobody[64];
    snprintf(nobody, sizeof nobody, "tcp://" HOST ":%u", free_port());
    ctl_channel *a = open_channel();
    uint8_t buf[100] = {0};
    int failed = 0;
    /* The queue fills at the send high-water mark (1000): that send fails,
     * the socket is dropped, and the next one starts a new queue. A bound
     * of 1 s for 3000 sends is correctness (nothing blocks), not speed. */
    uint64_t t0 = now_ms();
    for (int i = 0; i < 3000; i++) {
        int rc = ctl_send(a, nobody, buf, sizeof buf);
        if (rc != 0) {
            assert_int_equal(rc, KVCR_ESYS);
            assert_non_null(strstr(kvcr_last_error(), nobody));
            failed++;
        }
    }
    uint64_t took = now_ms() - t0;
    if (took >= 1000) fail_msg("3000 sends took %llu ms", (unsigned long long)took);
    assert_true(failed >= 1);
    assert_int_equal(ctl_connect(a, nobody), 0);
    t0 = now_ms();
    ctl_close(a); /* linger 0: closing does not wait for the unsent messages */
    assert_true(now_ms() - t0 < 1000);
}

static void test_endpoint_strings_are_checked(void **state)
{
    (void)state;
    static const char *const good[] = {
        "tcp://127.0.0.1:1", "tcp://127.0.0.1:65535", "tcp://host-name.example:5000",
        "tcp://[::1]:80",    "tcp://h:9",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (ctl_check_endpoint(good[i]) != 0) fail_msg("%s refused: %s", good[i], kvcr_last_error());
    static const char *const bad[] = {
        "",
        "tcp://",
        "tcp://:5000",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:65536",
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:123456",
        "tcp://127.0.0.1:080",
        "tcp://127.0.0.1:+80",
        "tcp://127.0.0.1:-1",
        "tcp://127.0.0.1:80 ",
        "tcp://127.0.0.1:80x",
        "tcp://127 .0.0.1:80",
        "tcp://h\t:80",
        "tcp://h\x7f:80",
        "tcp://*:80",
        "udp://127.0.0.1:80",
        "TCP://127.0.0.1:80",
        "tcp:/127.0.0.1:80",
        "127.0.0.1:80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (ctl_check_endpoint(bad[i]) != KVCR_EINVAL) fail_msg("'%s' accepted", bad[i]);
        assert_true(kvcr_last_error()[0] != '\0');
    }
    assert_int_equal(ctl_check_endpoint(NULL), KVCR_EINVAL);

    /* CTL_MAX_ENDPOINT bytes exactly, then one more. */
    char ep[CTL_MAX_ENDPOINT + 2];
    memset(ep, 'h', sizeof ep);
    memcpy(ep, "tcp://", 6);
    memcpy(ep + CTL_MAX_ENDPOINT - 5, ":5000", 5);
    ep[CTL_MAX_ENDPOINT] = '\0';
    assert_int_equal(ctl_check_endpoint(ep), 0);
    memcpy(ep + CTL_MAX_ENDPOINT - 4, ":5000", 6);
    assert_int_equal(ctl_check_endpoint(ep), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "longer than"));

    /* The channel checks before it makes a socket. */
    ctl_channel *a = open_channel();
    assert_int_equal(ctl_send(a, "tcp://127.0.0.1:0", "x", 1), KVCR_EINVAL);
    assert_int_equal(ctl_connect(a, "nonsense"), KVCR_EINVAL);
    assert_int_equal(ctl_send(a, NULL, "x", 1), KVCR_EINVAL);
    ctl_close(a);
}

static void test_open_refuses_bad_arguments_and_a_bound_port(void **state)
{
    (void)state;
    ctl_channel *a = open_channel(), *b = (ctl_channel *)1;
    char where[64];
    snprintf(where, sizeof where, "tcp://" HOST ":%u", port_of(a));
    assert_int_equal(ctl_open(HOST, (uint16_t)port_of(a), -1, HOST, MAX_MESSAGE, NULL, NULL, &b), KVCR_ESYS);
    assert_null(b);
    const char *msg = kvcr_last_error();
    if (strstr(msg, where) == NULL || strstr(msg, "Address already in use") == NULL)
        fail_msg("message: %s", msg);

    b = (ctl_channel *)1;
    assert_int_equal(ctl_open("", 0, -1, HOST, MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_null(b);
    assert_int_equal(ctl_open("127.0.0.1 ", 0, -1, HOST, MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(NULL, 0, -1, HOST, MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(HOST, 0, -1, "*", MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(HOST, 0, -1, "", MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(HOST, 0, -1, NULL, MAX_MESSAGE, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(HOST, 0, -1, HOST, 0, NULL, NULL, &b), KVCR_EINVAL);
    assert_int_equal(ctl_open(HOST, 0, -1, HOST, MAX_MESSAGE, NULL, NULL, NULL), KVCR_EINVAL);
    assert_null(b);

    /* The advertised host is used as given, with the bound port. */
    assert_int_equal(ctl_open(HOST, 0, -1, "kvcr-node-7", MAX_MESSAGE, NULL, NULL, &b), 0);
    snprintf(where, sizeof where, "tcp://kvcr-node-7:%u", port_of(b));
    assert_string_equal(ctl_endpoint(b), where);
    ctl_close(b);
    ctl_close(a);
}

static void test_forget_then_send_again(void **state)
{
    (void)state;
    ctl_channel *a = open_channel(), *b = open_channel();
    inbox *in = inbox_new();
    assert_int_equal(ctl_connect(a, ctl_endpoint(b)), 0);
    assert_int_equal(ctl_connect(a, ctl_endpoint(b)), 0); /* no-op */
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "one", 3), 0);
    drain(b, in, 1, 16, WAIT_MS);
    ctl_forget(a, ctl_endpoint(b));
    ctl_forget(a, ctl_endpoint(b)); /* already gone */
    ctl_forget(a, "tcp://127.0.0.1:1");
    ctl_forget(a, NULL);
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "two", 3), 0);
    drain(b, in, 2, 16, WAIT_MS);
    assert_memory_equal(in->data[0], "one", 3);
    assert_memory_equal(in->data[1], "two", 3);
    ctl_close(a);
    ctl_close(b);
    free(in);
}

/* More peers than the table keeps: the idlest are closed, and a send to
 * one of them simply opens it again. */
static void test_many_peers(void **state)
{
    (void)state;
    enum { PEERS = 300 };
    static unsigned ports[PEERS];
    size_t n = 0;
    /* a and b first: then no port found free below is one of theirs. */
    ctl_channel *a = open_channel(), *b = open_channel();
    for (int tries = 0; n < PEERS && tries < 10 * PEERS; tries++) {
        unsigned p = free_port();
        bool seen = false;
        for (size_t i = 0; i < n; i++) seen |= ports[i] == p;
        if (!seen) ports[n++] = p;
    }
    assert_int_equal(n, PEERS);
    inbox *in = inbox_new();
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "first", 5), 0);
    drain(b, in, 1, 16, WAIT_MS); /* before b's socket is evicted (linger 0 drops) */
    char ep[64];
    for (size_t i = 0; i < PEERS; i++) {
        snprintf(ep, sizeof ep, "tcp://" HOST ":%u", ports[i]);
        assert_int_equal(ctl_send(a, ep, "x", 1), 0);
    }
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "again", 5), 0);
    drain(b, in, 2, 16, WAIT_MS);
    assert_int_equal(in->lens[1], 5);
    assert_memory_equal(in->data[1], "again", 5);
    expect_quiet(b, in, 100);
    ctl_close(a);
    ctl_close(b);
    free(in);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_channels_exchange_messages_both_ways_in_order),
        cmocka_unit_test(test_recv_hands_over_at_most_max),
        cmocka_unit_test(test_a_message_over_max_never_arrives),
        cmocka_unit_test(test_sends_to_nothing_listening_never_block),
        cmocka_unit_test(test_endpoint_strings_are_checked),
        cmocka_unit_test(test_open_refuses_bad_arguments_and_a_bound_port),
        cmocka_unit_test(test_forget_then_send_again),
        cmocka_unit_test(test_many_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
