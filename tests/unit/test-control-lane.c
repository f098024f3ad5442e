#define _GNU_SOURCE /* accept4 */
/* The control lane on a loopback address of its own (net/lane.h), then
 * through the control channel (ctl_open_lane): messages both ways over the dialled connection,
 * answers only to a name vouched for, frames split across reads, the max of
 * lane_recv, connections around freed slots, junk and oversized frames
 * refused and counted, the send queue's bound, corking, forgetting, and
 * endpoints with "#lane=". Every wait is bounded. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvcr/error.h"
#include "net/control.h"
#include "net/lane.h"
#include "util/bytes.h"

#define HOST "127.0.0.1"
/* The lanes' own loopback address, private to this process (set in main):
 * tests running beside this one dial ports of 127.0.0.1 they found free,
 * and such a port may be the one a lane here got; their connections would
 * count as refusals here. The control channel's tests keep HOST. */
static char lane_host[32];
static in_addr_t lane_addr;
#define MAX_MESSAGE 4096
#define WAIT_MS 5000

typedef struct inbox {
    size_t n;
    size_t lens[64];
    uint8_t data[64][MAX_MESSAGE];
} inbox;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void collect(void *ud, const void *data, size_t len)
{
    inbox *in = ud;
    if (in->n < 64 && len <= MAX_MESSAGE) {
        memcpy(in->data[in->n], data, len);
        in->lens[in->n] = len;
    }
    in->n++;
}

/* Names starting "good" are vouched for, whatever the address. */
static bool vouch_good(void *ud, const char *name, const struct sockaddr *peer, socklen_t len)
{
    (void)ud, (void)peer, (void)len;
    return strncmp(name, "good", 4) == 0;
}

/* Messages handed back from refused dials, by every lane of a test. */
static struct {
    size_t n;
    char name[64], last[64];
} refused;

static void on_refused(void *ud, const char *name, const void *data, size_t len)
{
    (void)ud;
    snprintf(refused.name, sizeof refused.name, "%s", name);
    snprintf(refused.last, sizeof refused.last, "%.*s", (int)len, (const char *)data);
    refused.n++;
}

static lane *open_lane(const char *name)
{
    lane *l = NULL;
    lane_hooks hooks = {vouch_good, on_refused, NULL};
    assert_int_equal(lane_open(lane_host, MAX_MESSAGE, &hooks, NULL, &l), 0);
    assert_int_equal(lane_set_name(l, name), 0);
    return l;
}

/* Turns every lane (NULL-terminated) until in has want messages or ms
 * passed, sleeping in poll() on the lanes' fds in between. */
static void pump(lane **ls, inbox *in, size_t want, size_t max, int ms)
{
    uint64_t deadline = now_ms() + (uint64_t)ms;
    while (in->n < want) {
        size_t got = 0;
        for (lane **l = ls; *l; l++) got += lane_recv(*l, max, collect, in);
        if (got > 0 || in->n >= want) continue;
        uint64_t t = now_ms();
        if (t >= deadline) fail_msg("%zu of %zu messages after %d ms", in->n, want, ms);
        struct pollfd p[4];
        nfds_t n = 0;
        for (lane **l = ls; *l && n < 4; l++) p[n++] = (struct pollfd){lane_fd(*l), POLLIN, 0};
        poll(p, n, 20);
    }
}

/* Turns the lanes for ms, whatever arrives. */
static void turn_for(lane **ls, inbox *in, int ms)
{
    uint64_t deadline = now_ms() + (uint64_t)ms;
    while (now_ms() < deadline) {
        for (lane **l = ls; *l; l++) lane_recv(*l, 64, collect, in);
        struct pollfd p = {lane_fd(ls[0]), POLLIN, 0};
        poll(&p, 1, 5);
    }
}

static uint64_t taken(lane *l)
{
    const char *why;
    uint64_t n = lane_take_refused(l, &why);
    assert_true(n == 0 ? why == NULL : why != NULL && why[0] != '\0');
    return n;
}

/* A TCP port on addr where nothing listens (bound, then closed). */
static uint16_t dead_port(in_addr_t addr)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = addr};
    socklen_t sl = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sl), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A listener on lane_host (backlog as given) that the test never accepts from
 * unless it says so; *port gets its port. */
static int quiet_listener(int backlog, uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = lane_addr};
    socklen_t sl = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sl), 0);
    assert_int_equal(listen(fd, backlog), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A raw TCP connection to port on addr. */
static int raw_connect(in_addr_t addr, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = addr};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void test_answers_come_back_over_the_dialled_connection(void **state)
{
    (void)state;
    lane *a = open_lane("good-a"), *b = open_lane("b");
    lane *both[] = {a, b, NULL};
    inbox *in = calloc(1, sizeof *in);
    /* a's name points at a port where nothing listens: an answer can only
     * come back over the connection a dialled. */
    uint16_t nowhere = dead_port(lane_addr);
    for (int i = 0; i < 3; i++) {
        char msg[16];
        int n = snprintf(msg, sizeof msg, "ask-%d", i);
        assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), msg, (size_t)n), 0);
    }
    assert_true(lane_has(a, "b"));
    pump(both, in, 3, 64, WAIT_MS);
    for (int i = 0; i < 3; i++) {
        char msg[16];
        int n = snprintf(msg, sizeof msg, "ask-%d", i);
        assert_int_equal(in->lens[i], (size_t)n);
        assert_memory_equal(in->data[i], msg, (size_t)n);
    }
    assert_true(lane_has(b, "good-a")); /* vouched: b answers over it */
    assert_int_equal(lane_send(b, "good-a", lane_host, nowhere, "answer", 6), 0);
    pump(both, in, 4, 64, WAIT_MS);
    assert_int_equal(in->lens[3], 6);
    assert_memory_equal(in->data[3], "answer", 6);
    assert_int_equal(taken(a) + taken(b), 0);
    lane_close(a);
    lane_close(b);
    free(in);
}

static void test_a_name_not_vouched_for_gets_no_answers_over_its_connection(void **state)
{
    (void)state;
    lane *a = open_lane("claimed-a"), *b = open_lane("b");
    lane *both[] = {a, b, NULL};
    inbox *in = calloc(1, sizeof *in);
    assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), "hello", 5), 0);
    pump(both, in, 1, 64, WAIT_MS); /* its messages still arrive */
    assert_false(lane_has(b, "claimed-a"));
    /* b dials the name's own address instead: nothing listens there, and
     * the answer comes back to b, refused, never to a. */
    uint16_t nowhere = dead_port(lane_addr);
    refused.n = 0;
    assert_int_equal(lane_send(b, "claimed-a", lane_host, nowhere, "answer", 6), 0);
    turn_for(both, in, 300);
    assert_int_equal(in->n, 1);
    assert_int_equal(refused.n, 1);
    assert_string_equal(refused.name, "claimed-a");
    assert_string_equal(refused.last, "answer");
    assert_false(lane_has(b, "claimed-a")); /* the refused dial was closed */
    lane_close(a);
    lane_close(b);
    free(in);
}

static void test_frames_split_across_reads_arrive_whole(void **state)
{
    (void)state;
    lane *b = open_lane("b");
    lane *one[] = {b, NULL};
    inbox *in = calloc(1, sizeof *in);
    uint8_t stream[4 + 6 + 4 + 1000];
    put32be(stream, 6);
    memcpy(stream + 4, "good-x", 6);
    put32be(stream + 10, 1000);
    for (int i = 0; i < 1000; i++) stream[14 + i] = (uint8_t)(i * 7);
    int fd = raw_connect(lane_addr, lane_port(b));
    for (size_t off = 0; off < sizeof stream;) {
        size_t n = off < 20 ? 1 : 333; /* the header and name a byte at a time */
        if (n > sizeof stream - off) n = sizeof stream - off;
        assert_int_equal(write(fd, stream + off, n), (ssize_t)n);
        off += n;
        turn_for(one, in, 2);
    }
    pump(one, in, 1, 64, WAIT_MS);
    assert_int_equal(in->lens[0], 1000);
    assert_memory_equal(in->data[0], stream + 14, 1000);
    assert_true(lane_has(b, "good-x"));
    assert_int_equal(taken(b), 0);
    close(fd);
    lane_close(b);
    free(in);
}

static void test_recv_hands_over_at_most_max(void **state)
{
    (void)state;
    lane *a = open_lane("good-a"), *b = open_lane("b");
    inbox *in = calloc(1, sizeof *in);
    for (int i = 0; i < 10; i++)
        assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), &i, sizeof i), 0);
    uint64_t deadline = now_ms() + WAIT_MS;
    while (in->n < 10 && now_ms() < deadline) {
        lane_recv(a, 64, collect, in);
        size_t before = in->n;
        lane_recv(b, 3, collect, in);
        assert_true(in->n - before <= 3);
        struct pollfd p[2] = {{lane_fd(a), POLLIN, 0}, {lane_fd(b), POLLIN, 0}};
        poll(p, 2, 5);
    }
    assert_int_equal(in->n, 10);
    for (int i = 0; i < 10; i++) assert_memory_equal(in->data[i], &i, sizeof i);
    lane_close(a);
    lane_close(b);
    free(in);
}

/* Each kind of junk closes its connection, is counted once, and changes
 * nothing for a real peer. */
static void test_junk_is_refused_and_counted(void **state)
{
    (void)state;
    lane *a = open_lane("good-a"), *b = open_lane("b");
    lane *both[] = {a, b, NULL};
    inbox *in = calloc(1, sizeof *in);
    uint8_t bad_name[4 + 3] = {0, 0, 0, 3, 'a', 0x01, 'b'};
    uint8_t oversize[4 + 6 + 4];
    put32be(oversize, 6);
    memcpy(oversize + 4, "good-y", 6);
    put32be(oversize + 10, MAX_MESSAGE + 1);
    struct {
        const void *bytes;
        size_t len;
    } junk[] = {
        {"GET / HTTP/1.1\r\n\r\n", 18}, /* a length far past a name */
        {bad_name, sizeof bad_name},    /* a name with a control byte */
        {"\0\0\0\0", 4},                /* an empty frame */
        {oversize, sizeof oversize},    /* a message over max_message */
        {"\xff\0\0\0\0\0\0\0\x01\x7f", 10}, /* a ZeroMQ greeting */
    };
    size_t n_junk = sizeof junk / sizeof junk[0];
    for (size_t i = 0; i < n_junk; i++) {
        int fd = raw_connect(lane_addr, lane_port(b));
        assert_int_equal(write(fd, junk[i].bytes, junk[i].len), (ssize_t)junk[i].len);
        /* the lane closes it: read sees the end (or a reset) */
        uint64_t deadline = now_ms() + WAIT_MS;
        char c;
        ssize_t rd;
        do {
            turn_for(both, in, 5);
            rd = recv(fd, &c, 1, MSG_DONTWAIT);
        } while (rd < 0 && errno == EAGAIN && now_ms() < deadline);
        assert_true(rd == 0 || (rd < 0 && errno == ECONNRESET));
        close(fd);
    }
    assert_int_equal(taken(b), n_junk);
    assert_int_equal(taken(b), 0); /* taken */
    /* A connection that closes without a byte is no junk. */
    close(raw_connect(lane_addr, lane_port(b)));
    turn_for(both, in, 50);
    assert_int_equal(taken(b), 0);
    assert_int_equal(in->n, 0);
    assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), "real", 4), 0);
    pump(both, in, 1, 64, WAIT_MS);
    assert_memory_equal(in->data[0], "real", 4);
    lane_close(a);
    lane_close(b);
    free(in);
}

/* A peer that never reads: the queue fills to LANE_TXQ_MAX, then the send
 * fails and the connection is closed; nothing blocks. */
static void test_the_send_queue_is_bounded(void **state)
{
    (void)state;
    uint16_t port;
    int listener = quiet_listener(4, &port);
    lane *a = open_lane("good-a");
    static uint8_t msg[MAX_MESSAGE];
    int rc = 0;
    size_t sent = 0;
    uint64_t t0 = now_ms();
    for (; sent < 4 * (LANE_TXQ_MAX / MAX_MESSAGE) && rc == 0; sent++)
        rc = lane_send(a, "sink", lane_host, port, msg, sizeof msg);
    assert_int_equal(rc, KVCR_ESYS);
    assert_non_null(strstr(kvcr_last_error(), "queue full"));
    /* it held them all, after the hello */
    assert_true(LANE_HEADER + strlen("good-a") + sent * (MAX_MESSAGE + LANE_HEADER) > LANE_TXQ_MAX);
    assert_false(lane_has(a, "sink"));
    assert_true(now_ms() - t0 < WAIT_MS); /* never blocked for long */
    lane_close(a);
    close(listener);
}

/* A dial whose SYN goes unanswered (the listener's accept queue is full,
 * so the kernel drops it) is made again after LANE_CONNECT_MS with its
 * queue: once there is room, the hello and the message arrive whole. */
static void test_an_unanswered_dial_is_made_again_with_its_queue(void **state)
{
    (void)state;
    uint16_t port;
    int listener = quiet_listener(0, &port);
    /* Fill the accept queue (backlog 0 holds one) with connections nobody
     * accepts; later SYNs are dropped. */
    int filler[2];
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port),
                               .sin_addr.s_addr = lane_addr};
    for (int i = 0; i < 2; i++) {
        filler[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(filler[i], (struct sockaddr *)&addr, sizeof addr);
    }
    lane *a = open_lane("good-a");
    lane *one[] = {a, NULL};
    inbox *in = calloc(1, sizeof *in);
    assert_int_equal(lane_send(a, "sink", lane_host, port, "kept", 4), 0);
    turn_for(one, in, LANE_CONNECT_MS + 300); /* one dial given up and made again */
    assert_true(lane_has(a, "sink"));
    /* Room: accept everything (fillers and the lane's connection) until one
     * of them brings the lane's bytes. */
    uint64_t deadline = now_ms() + WAIT_MS;
    uint8_t got[64];
    size_t n = 0;
    int fds[8], n_fds = 0;
    while (n < 4 + 6 + 4 + 4 && now_ms() < deadline) {
        turn_for(one, in, 20);
        int c = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
        if (c >= 0 && n_fds < 8) fds[n_fds++] = c;
        for (int i = 0; i < n_fds && n < sizeof got; i++) {
            ssize_t r = recv(fds[i], got + n, sizeof got - n, MSG_DONTWAIT);
            if (r > 0) n += (size_t)r;
        }
    }
    assert_int_equal(n, 4 + 6 + 4 + 4);
    assert_memory_equal(got, "\0\0\0\6good-a\0\0\0\4kept", n);
    for (int i = 0; i < n_fds; i++) close(fds[i]);
    for (int i = 0; i < 2; i++) close(filler[i]);
    close(listener);
    lane_close(a);
    free(in);
}

static void test_forget_closes_and_the_next_send_dials_again(void **state)
{
    (void)state;
    lane *a = open_lane("good-a"), *b = open_lane("b");
    lane *both[] = {a, b, NULL};
    inbox *in = calloc(1, sizeof *in);
    assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), "one", 3), 0);
    pump(both, in, 1, 64, WAIT_MS);
    lane_forget(a, "b");
    assert_false(lane_has(a, "b"));
    assert_int_equal(lane_send(a, "b", lane_host, lane_port(b), "two", 3), 0);
    pump(both, in, 2, 64, WAIT_MS);
    assert_memory_equal(in->data[1], "two", 3);
    /* a dial to nothing ends closed, its messages handed back in order */
    refused.n = 0;
    uint16_t nowhere = dead_port(lane_addr);
    assert_int_equal(lane_send(a, "gone", lane_host, nowhere, "x1", 2), 0);
    if (refused.n == 0) assert_int_equal(lane_send(a, "gone", lane_host, nowhere, "x2", 2), 0);
    turn_for(both, in, 200);
    assert_false(lane_has(a, "gone"));
    assert_true(refused.n >= 1 && refused.n <= 2);
    assert_string_equal(refused.last, refused.n == 2 ? "x2" : "x1");
    lane_close(a);
    lane_close(b);
    free(in);
}

/* Reads n bytes from the raw peer fd into buf, turning the lanes while it
 * waits; fails after WAIT_MS. 0 at once when the peer closed. */
static size_t read_within(lane **ls, inbox *in, int fd, uint8_t *buf, size_t n)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    size_t got = 0;
    while (got < n) {
        turn_for(ls, in, 5);
        ssize_t r = recv(fd, buf + got, n - got, MSG_DONTWAIT);
        if (r == 0) break;
        if (r > 0) got += (size_t)r;
        if (now_ms() > deadline) fail_msg("%zu of %zu bytes after %d ms", got, n, WAIT_MS);
    }
    return got;
}

/* One frame on a raw connection. */
static void raw_frame(int fd, const char *data, size_t len)
{
    uint8_t buf[4 + 64];
    assert_true(len <= 64);
    put32be(buf, (uint32_t)len);
    memcpy(buf + 4, data, len);
    assert_int_equal(write(fd, buf, 4 + len), (ssize_t)(4 + len));
}

/* Turns the lane until it no longer holds a connection named name. */
static void wait_gone(lane **ls, inbox *in, const char *name)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    while (lane_has(ls[0], name)) {
        if (now_ms() > deadline) fail_msg("%s still connected after %d ms", name, WAIT_MS);
        turn_for(ls, in, 5);
    }
}

/* Slots are taken lowest first and the scans of a receive stop past the
 * highest in use: with the slots below and above a connection freed, it
 * still delivers and is answered; a new connection takes the freed slot
 * below it, and still delivers once the one above it closed too. */
static void test_connections_around_freed_slots_are_still_served(void **state)
{
    (void)state;
    lane *b = open_lane("b");
    lane *one[] = {b, NULL};
    inbox *in = calloc(1, sizeof *in);
    int fd[4];
    for (int i = 0; i < 3; i++) { /* one at a time: slots 0, 1, 2 */
        char name[8];
        snprintf(name, sizeof name, "good-%d", i);
        fd[i] = raw_connect(lane_addr, lane_port(b));
        raw_frame(fd[i], name, 6);
        raw_frame(fd[i], "hello", 5);
        pump(one, in, (size_t)i + 1, 64, WAIT_MS);
    }
    close(fd[2]);
    close(fd[0]);
    wait_gone(one, in, "good-2");
    wait_gone(one, in, "good-0");
    raw_frame(fd[1], "still", 5);
    pump(one, in, 4, 64, WAIT_MS);
    assert_int_equal(in->lens[3], 5);
    assert_memory_equal(in->data[3], "still", 5);
    /* Answered over its own connection: nothing listens at the port given. */
    assert_int_equal(lane_send(b, "good-1", lane_host, dead_port(lane_addr), "answer", 6), 0);
    uint8_t got[10];
    assert_int_equal(read_within(one, in, fd[1], got, sizeof got), sizeof got);
    assert_int_equal(get32be(got), 6);
    assert_memory_equal(got + 4, "answer", 6);
    fd[3] = raw_connect(lane_addr, lane_port(b));
    raw_frame(fd[3], "good-3", 6);
    raw_frame(fd[3], "new", 3);
    pump(one, in, 5, 64, WAIT_MS);
    close(fd[1]);
    wait_gone(one, in, "good-1");
    raw_frame(fd[3], "last", 4);
    pump(one, in, 6, 64, WAIT_MS);
    assert_int_equal(in->lens[5], 4);
    assert_memory_equal(in->data[5], "last", 4);
    assert_int_equal(taken(b), 0);
    close(fd[3]);
    lane_close(b);
    free(in);
}

/* Corked, messages to a made connection wait in its queue however long
 * the lane turns; uncorking sends them, in order. A connection forgotten
 * while corked takes its messages with it, and the uncork that follows
 * sends nothing. */
static void test_corked_messages_wait_for_the_uncork(void **state)
{
    (void)state;
    uint16_t port;
    int listener = quiet_listener(4, &port);
    lane *a = open_lane("good-a");
    lane *one[] = {a, NULL};
    inbox *in = calloc(1, sizeof *in);
    assert_int_equal(lane_send(a, "sink", lane_host, port, "m1", 2), 0);
    int fd = -1;
    for (uint64_t deadline = now_ms() + WAIT_MS; fd < 0 && now_ms() < deadline;) {
        turn_for(one, in, 5);
        fd = accept4(listener, NULL, NULL, 0);
    }
    assert_true(fd >= 0);
    uint8_t got[64];
    assert_int_equal(read_within(one, in, fd, got, 4 + 6 + 4 + 2), 4 + 6 + 4 + 2);
    assert_memory_equal(got, "\0\0\0\6good-a\0\0\0\2m1", 16);

    lane_cork(a);
    assert_int_equal(lane_send(a, "sink", lane_host, port, "m2", 2), 0);
    assert_int_equal(lane_send(a, "sink", lane_host, port, "m3", 2), 0);
    turn_for(one, in, 100);
    assert_int_equal(recv(fd, got, sizeof got, MSG_DONTWAIT), -1);
    assert_int_equal(errno, EAGAIN);
    lane_uncork(a);
    assert_int_equal(read_within(one, in, fd, got, 12), 12);
    assert_memory_equal(got, "\0\0\0\2m2\0\0\0\2m3", 12);

    lane_cork(a);
    assert_int_equal(lane_send(a, "sink", lane_host, port, "m4", 2), 0);
    lane_forget(a, "sink");
    lane_uncork(a);
    assert_int_equal(read_within(one, in, fd, got, sizeof got), 0); /* closed, m4 dropped */
    assert_false(lane_has(a, "sink"));
    assert_int_equal(in->n, 0);
    close(fd);
    close(listener);
    lane_close(a);
    free(in);
}

static void test_bad_arguments_change_nothing(void **state)
{
    (void)state;
    lane *l = NULL;
    assert_int_equal(lane_open("localhost", MAX_MESSAGE, NULL, NULL, &l), KVCR_EINVAL);
    assert_null(l);
    assert_int_equal(lane_open(lane_host, 0, NULL, NULL, &l), KVCR_EINVAL);
    l = open_lane("good-a");
    assert_int_equal(lane_set_name(l, "has space"), KVCR_EINVAL);
    assert_int_equal(lane_send(l, "b", lane_host, 1, "x", 0), KVCR_EINVAL);
    assert_int_equal(lane_send(l, "b", lane_host, 1, "x", MAX_MESSAGE + 1), KVCR_EINVAL);
    assert_int_equal(lane_send(l, "b", "not-an-ip", 1, "x", 1), KVCR_EINVAL);
    assert_false(lane_has(l, "b"));
    const uint8_t *p;
    size_t plen;
    assert_int_equal(lane_frame((const uint8_t *)"\0\0\0\2ab", 6, 8, &p, &plen), 6);
    assert_int_equal(plen, 2);
    assert_int_equal(lane_frame((const uint8_t *)"\0\0\0\2a", 5, 8, &p, &plen), 0);
    assert_int_equal(lane_frame((const uint8_t *)"\0\0\0\x09", 4, 8, &p, &plen), -1);
    lane_close(l);
}

/* ---- through the control channel ------------------------------------------- */

typedef struct ctl_inbox {
    size_t n;
    char last[64];
} ctl_inbox;

static void ctl_collect(void *ud, const void *data, size_t len, const char *key)
{
    ctl_inbox *in = ud;
    assert_null(key);
    snprintf(in->last, sizeof in->last, "%.*s", (int)len, (const char *)data);
    in->n++;
}

static size_t junk_seen;
static void count_junk(void *ud, ctl_drop cause)
{
    (void)ud;
    assert_int_equal(cause, CTL_DROP_HANDSHAKE);
    junk_seen++;
}

static void ctl_pump(ctl_channel **cs, ctl_inbox *in, size_t want)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    while (in->n < want && now_ms() < deadline) {
        for (ctl_channel **c = cs; *c; c++) {
            ctl_recv(*c, 64, ctl_collect, in);
            ctl_serve_handshakes(*c, 64, count_junk, NULL);
        }
        struct pollfd p[4];
        nfds_t n = 0;
        for (ctl_channel **c = cs; *c && n < 4; c++) {
            p[n++] = (struct pollfd){ctl_fd(*c), POLLIN, 0};
            p[n++] = (struct pollfd){ctl_lane_fd(*c), POLLIN, 0};
        }
        poll(p, n, 5);
    }
    assert_int_equal(in->n, want);
}

static ctl_channel *open_ctl(bool with_lane)
{
    ctl_channel *c = NULL;
    assert_int_equal(ctl_open(HOST, 0, -1, HOST, MAX_MESSAGE, NULL, NULL, &c), 0);
    if (with_lane) assert_int_equal(ctl_open_lane(c), 0);
    return c;
}

static void test_channels_with_lanes_talk_over_them_and_to_those_without(void **state)
{
    (void)state;
    ctl_channel *a = open_ctl(true), *b = open_ctl(true), *z = open_ctl(false);
    assert_non_null(strstr(ctl_endpoint(a), CTL_LANE_TAG));
    assert_null(strstr(ctl_endpoint(z), "#"));
    assert_int_equal(ctl_check_endpoint(ctl_endpoint(a)), 0);
    ctl_inbox in = {0};
    ctl_channel *ab[] = {a, b, NULL};
    assert_int_equal(ctl_send(a, ctl_endpoint(b), "a to b", 6), 0);
    ctl_pump(ab, &in, 1);
    assert_string_equal(in.last, "a to b");
    assert_true(ctl_connected(b, ctl_endpoint(a))); /* a's connection, vouched for */
    assert_int_equal(ctl_send(b, ctl_endpoint(a), "b to a", 6), 0);
    ctl_pump(ab, &in, 2);
    assert_string_equal(in.last, "b to a");
    /* Without a lane, z reaches a's ZeroMQ socket at the same address. */
    ctl_channel *za[] = {z, a, NULL};
    assert_int_equal(ctl_send(z, ctl_endpoint(a), "z to a", 6), 0);
    ctl_pump(za, &in, 3);
    assert_string_equal(in.last, "z to a");
    /* Junk at a's lane is a failed handshake. */
    const char *tag = strstr(ctl_endpoint(a), CTL_LANE_TAG);
    int fd = raw_connect(htonl(INADDR_LOOPBACK), (uint16_t)atoi(tag + strlen(CTL_LANE_TAG)));
    assert_int_equal(write(fd, "junk junk junk", 14), 14);
    junk_seen = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (junk_seen == 0 && now_ms() < deadline) {
        ctl_recv(a, 64, ctl_collect, &in);
        ctl_serve_handshakes(a, 64, count_junk, NULL);
        poll(&(struct pollfd){ctl_lane_fd(a), POLLIN, 0}, 1, 5);
    }
    assert_int_equal(junk_seen, 1);
    close(fd);
    ctl_close(a);
    ctl_close(b);
    ctl_close(z);
}

static void test_lane_endpoints_are_checked_and_the_lane_refused_where_it_cannot_work(void **state)
{
    (void)state;
    assert_int_equal(ctl_check_endpoint("tcp://1.2.3.4:5#lane=6"), 0);
    assert_int_equal(ctl_check_endpoint("tcp://1.2.3.4:5#lane="), KVCR_EINVAL);
    assert_int_equal(ctl_check_endpoint("tcp://1.2.3.4:5#lane=0"), KVCR_EINVAL);
    assert_int_equal(ctl_check_endpoint("tcp://1.2.3.4:5#lane=65536"), KVCR_EINVAL);
    assert_int_equal(ctl_check_endpoint("tcp://1.2.3.4:5#lane=6#lane=7"), KVCR_EINVAL);
    ctl_channel *c = NULL;
    assert_int_equal(ctl_open(HOST, 0, -1, "localhost", MAX_MESSAGE, NULL, NULL, &c), 0);
    char before[CTL_MAX_ENDPOINT + 1];
    snprintf(before, sizeof before, "%s", ctl_endpoint(c));
    assert_int_equal(ctl_open_lane(c), KVCR_EINVAL); /* a host name is advertised */
    assert_string_equal(ctl_endpoint(c), before);
    assert_int_equal(ctl_lane_fd(c), -1);
    ctl_close(c);
}

/* A peer whose lane refuses (restarted: another lane port at the same
 * address) is reached over ZeroMQ at its address, the refused message
 * first, and later ones too while the mark lasts. */
static void test_a_refused_lane_falls_back_to_zeromq_at_the_address(void **state)
{
    (void)state;
    ctl_channel *a = open_ctl(true), *b = open_ctl(true);
    char stale[CTL_MAX_ENDPOINT + 1];
    const char *tag = strstr(ctl_endpoint(b), CTL_LANE_TAG);
    snprintf(stale, sizeof stale, "%.*s" CTL_LANE_TAG "%u", (int)(tag - ctl_endpoint(b)),
             ctl_endpoint(b), (unsigned)dead_port(htonl(INADDR_LOOPBACK)));
    ctl_inbox in = {0};
    ctl_channel *ab[] = {a, b, NULL};
    assert_int_equal(ctl_send(a, stale, "first", 5), 0);
    ctl_pump(ab, &in, 1);
    assert_string_equal(in.last, "first");
    assert_int_equal(ctl_send(a, stale, "second", 6), 0);
    ctl_pump(ab, &in, 2);
    assert_string_equal(in.last, "second");
    ctl_close(a);
    ctl_close(b);
}

/* A raw connection to port that names itself name, then sends one
 * message; the caller closes it. */
static int claim(uint16_t port, const char *name, const char *msg)
{
    uint8_t buf[512];
    size_t n = strlen(name), m = strlen(msg);
    put32be(buf, (uint32_t)n);
    memcpy(buf + 4, name, n);
    put32be(buf + 4 + n, (uint32_t)m);
    memcpy(buf + 8 + n, msg, m);
    int fd = raw_connect(htonl(INADDR_LOOPBACK), port);
    assert_int_equal(write(fd, buf, 8 + n + m), (ssize_t)(8 + n + m));
    return fd;
}

/* The channel answers over a connection only when the name it gave is an
 * endpoint whose host is the connection's own address (127.0.0.1 here). */
static void test_the_channel_vouches_only_for_a_name_at_the_connections_address(void **state)
{
    (void)state;
    ctl_channel *a = open_ctl(true);
    uint16_t port = (uint16_t)atoi(strstr(ctl_endpoint(a), CTL_LANE_TAG) + strlen(CTL_LANE_TAG));
    const char *elsewhere = "tcp://127.0.0.2:9" CTL_LANE_TAG "9";
    const char *here = "tcp://127.0.0.1:9" CTL_LANE_TAG "9";
    ctl_inbox in = {0};
    ctl_channel *one[] = {a, NULL};
    int f1 = claim(port, elsewhere, "from a stranger");
    ctl_pump(one, &in, 1);
    assert_string_equal(in.last, "from a stranger"); /* delivered: plaintext speaks for nobody */
    assert_false(ctl_connected(a, elsewhere));
    int f2 = claim(port, here, "from here");
    ctl_pump(one, &in, 2);
    assert_string_equal(in.last, "from here");
    assert_true(ctl_connected(a, here));
    close(f1);
    close(f2);
    ctl_close(a);
}

int main(void)
{
    unsigned pid = (unsigned)getpid();
    snprintf(lane_host, sizeof lane_host, "127.%u.%u.%u", 100 + (pid >> 16) % 100,
             (pid >> 8) & 255, 2 + pid % 250);
    lane_addr = inet_addr(lane_host);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_come_back_over_the_dialled_connection),
        cmocka_unit_test(test_a_name_not_vouched_for_gets_no_answers_over_its_connection),
        cmocka_unit_test(test_frames_split_across_reads_arrive_whole),
        cmocka_unit_test(test_recv_hands_over_at_most_max),
        cmocka_unit_test(test_connections_around_freed_slots_are_still_served),
        cmocka_unit_test(test_junk_is_refused_and_counted),
        cmocka_unit_test(test_the_send_queue_is_bounded),
        cmocka_unit_test(test_an_unanswered_dial_is_made_again_with_its_queue),
        cmocka_unit_test(test_forget_closes_and_the_next_send_dials_again),
        cmocka_unit_test(test_corked_messages_wait_for_the_uncork),
        cmocka_unit_test(test_bad_arguments_change_nothing),
        cmocka_unit_test(test_channels_with_lanes_talk_over_them_and_to_those_without),
        cmocka_unit_test(test_lane_endpoints_are_checked_and_the_lane_refused_where_it_cannot_work),
        cmocka_unit_test(test_a_refused_lane_falls_back_to_zeromq_at_the_address),
        cmocka_unit_test(test_the_channel_vouches_only_for_a_name_at_the_connections_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
