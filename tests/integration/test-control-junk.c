/* Junk at the control endpoint of an instance with the remote tier on
 * 127.0.0.1, from 8 connections at once for about 3 s: raw TCP bytes that
 * fail the ZeroMQ handshake (a greeting naming no mechanism we speak, a
 * greeting cut short, an HTTP request), messages over
 * max_control_message_bytes, and well-framed ZeroMQ messages that are not
 * valid control messages (random bytes, msgpack maps with bad fields, a
 * type this version lacks, valid replies nobody waits for, metadata whose
 * worker address UCX could not use).
 *
 * Each is counted by cause in kvcr_control_dropped_total{cause}, exactly as
 * many as were sent (oversize messages excepted: libzmq closes their
 * connection and reports it as any peer leaving, so they are not counted);
 * the messages also in the dropped-message total. The log sink receives at
 * most one line per second per cause, each after the first saying how many
 * were held back. Afterwards the instance still delivers a block from a
 * source peer with the right bytes.
 *
 * Half the senders of each kind use the control lane instead (its port is
 * in the endpoint, "#lane="): bytes that break its framing (the same raw
 * junk, and a frame over the limit, which the lane does count) are failed
 * handshakes; the framed junk arrives as lane frames and is counted by the
 * same causes.
 *
 * With CURVE, the causes only it has: a key outside the allow-list (auth)
 * and an admitted peer's message that names another key's reply endpoint
 * (bad_sender). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "peer.h"
#include "promtool.h"

#define BS 4096
#define JUNK_MS 3000         /* how long the junk flows */
#define FRAMED_SENDERS 4     /* PUSH sockets, one connection each */
#define RAW_SENDERS 4        /* one raw TCP connection after another */
#define FRAMED_CAP 20000     /* messages per PUSH socket, spread over JUNK_MS */
#define MAX_MESSAGE 65536    /* the instance's max_control_message_bytes */
#define WAIT_MS 20000        /* for the instance to count what was sent */
/* Between two messages of the CURVE peer: dozens a second, a few hundred
 * in all (a sanitizer build decrypts slowly). */
#define CURVE_PACE_MS 20

enum {
    HANDSHAKE, AUTH, MALFORMED, UNKNOWN_TYPE, BAD_SENDER, UNEXPECTED, UNUSABLE, REPLY_LIMITED,
    N_CAUSES
};
static const char *const cause_names[N_CAUSES] = {
    "handshake", "auth", "malformed", "unknown_type", "bad_sender", "unexpected", "unusable",
    "reply_limited"};
/* A phrase of each cause's log line (src/net/control.c, src/tiers/remote_*.c). */
static const char *const cause_lines[N_CAUSES] = {
    "handshake (",          "is not in the allow-list",         "malformed control message",
    "of a type this version lacks", "its connection was admitted for key",
    "that nothing here waits for",  "not usable:", "to endpoints without a connection"};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the log sink ---------------------------------------------------------- */

static struct {
    pthread_mutex_t lock;
    unsigned lines[N_CAUSES], held_lines[N_CAUSES];
    uint64_t held[N_CAUSES]; /* the sum of the held-back counts */
} sink = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, {0}};

static void sink_reset(void)
{
    pthread_mutex_lock(&sink.lock);
    memset(sink.lines, 0, sizeof sink.lines);
    memset(sink.held_lines, 0, sizeof sink.held_lines);
    memset(sink.held, 0, sizeof sink.held);
    pthread_mutex_unlock(&sink.lock);
}

static void count_line(void *ud, kvcr_log_level level, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&sink.lock);
    const char *held = strstr(msg, " more like it not logged)");
    while (held && held > msg && held[-1] >= '0' && held[-1] <= '9') held--;
    for (int c = 0; c < N_CAUSES; c++)
        if (strstr(msg, cause_lines[c])) {
            sink.lines[c]++;
            if (held && held > msg && held[-1] == '(') {
                sink.held_lines[c]++;
                sink.held[c] += strtoull(held, NULL, 10);
            }
        }
    pthread_mutex_unlock(&sink.lock);
}

/* ---- msgpack, by hand (small maps of short strings) ---------------------- */

typedef struct mp {
    uint8_t b[512];
    size_t n;
} mp;

static void mp_byte(mp *m, uint8_t x)
{
    m->b[m->n++] = x;
}

static void mp_str(mp *m, const char *s)
{
    size_t n = strlen(s);
    if (n < 32) {
        mp_byte(m, (uint8_t)(0xa0 | n));
    } else {
        mp_byte(m, 0xd9);
        mp_byte(m, (uint8_t)n);
    }
    memcpy(m->b + m->n, s, n);
    m->n += n;
}

/* {"v": v, "type": type, ...}: the head every message starts with; n is
 * the number of pairs in all. */
static void mp_head(mp *m, unsigned n, unsigned v, const char *type)
{
    m->n = 0;
    mp_byte(m, (uint8_t)(0x80 | n));
    mp_str(m, "v");
    mp_byte(m, (uint8_t)v);
    mp_str(m, "type");
    mp_str(m, type);
}

/* The head of a version-1 message of type from agent "junk" (n pairs in
 * all), then its incarnation, reply endpoint from and addressee to. */
static void mp_junk_head(mp *m, unsigned n, const char *type, const char *from, const char *to)
{
    mp_head(m, n, 1, type);
    mp_str(m, "agent"), mp_str(m, "junk");
    mp_str(m, "inc"), mp_byte(m, 0xc4), mp_byte(m, 16);
    for (int i = 0; i < 16; i++) mp_byte(m, (uint8_t)i);
    mp_str(m, "from"), mp_str(m, from);
    mp_str(m, "to"), mp_str(m, to);
}

/* A write_done as a source at `from` sends it, for an operation the
 * instance never started: valid, and dropped as unexpected once
 * dispatched. */
static void mp_write_done(mp *m, const char *from, const char *to, bool success_as_str)
{
    mp_junk_head(m, 9, "write_done", from, to);
    mp_str(m, "op"), mp_byte(m, 77);
    mp_str(m, "success");
    if (success_as_str)
        mp_str(m, "no");
    else
        mp_byte(m, 0xc2);
    mp_str(m, "terminal"), mp_byte(m, 0xc3);
}

/* ---- framed junk: PUSH sockets --------------------------------------------- */

/* A start_write from agent "junk", which sent no metadata: valid, and
 * refused (to `from`) since no route to it exists. */
static void mp_start_write(mp *m, const char *from, const char *to, uint8_t op)
{
    mp_junk_head(m, 10, "start_write", from, to);
    mp_str(m, "op"), mp_byte(m, op & 0x7f);
    mp_str(m, "remaining_ms"), mp_byte(m, 100);
    mp_str(m, "keys"), mp_byte(m, 0x91), mp_byte(m, 0xc4), mp_byte(m, 1), mp_byte(m, 'k');
    mp_str(m, "dst"), mp_byte(m, 0x91), mp_byte(m, 0x91), mp_byte(m, 0x93);
    mp_byte(m, 0xc3), mp_str(m, "fw"), mp_byte(m, 0);
}

/* Sends on push, after everything it sent, a start_write the instance
 * refuses with a reply to a PULL socket of ours, and waits for that reply
 * (bounded: WAIT_MS). A connection's messages are taken in order: all that
 * push sent before has then been taken, and counted; nothing of it is
 * counted later. pub and sec (NULL without CURVE) are push's key pair: the
 * reply endpoint must carry its key, and the PULL socket serves CURVE with
 * it. 0 or the errno of what failed. */
static int taken_up_to_here(void *ctx, void *push, const char *endpoint, const char *pub,
                            const char *sec)
{
    void *pull = zmq_socket(ctx, ZMQ_PULL);
    int linger = 0, wait = WAIT_MS, server = 1, err = 0;
    zmq_setsockopt(pull, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &wait, sizeof wait);
    if (pub != NULL && (zmq_setsockopt(pull, ZMQ_CURVE_SERVER, &server, sizeof server) != 0 ||
                        zmq_setsockopt(pull, ZMQ_CURVE_SECRETKEY, sec, 41) != 0))
        err = errno;
    char from[128] = "";
    size_t len = sizeof from;
    if (!err && (zmq_bind(pull, "tcp://127.0.0.1:*") != 0 ||
                 zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, from, &len) != 0))
        err = errno;
    size_t at = strlen(from);
    if (!err && pub != NULL) snprintf(from + at, sizeof from - at, "#curve=%s", pub);
    mp m;
    mp_start_write(&m, from, endpoint, 99);
    uint8_t reply[1024];
    if (!err && (zmq_send(push, m.b, m.n, 0) < 0 || zmq_recv(pull, reply, sizeof reply, 0) < 0))
        err = errno;
    zmq_close(pull);
    return err;
}


#define STRANGER "tcp://127.0.0.1:9" /* where the junk says it comes from */

typedef struct framed {
    pthread_t thread;
    const char *endpoint;
    uint16_t lane_port; /* its messages go over the control lane; 0: ZeroMQ */
    uint64_t start_ms, deadline_ms;
    unsigned seed;
    uint64_t sent[N_CAUSES];
    int failed; /* errno of a send or connect that failed, 0 if none */
    bool held_back; /* the instance took nothing for SNDTIMEO: the flood stopped there */
} framed;

/* Metadata whose worker address is one byte: no UCX address is that
 * short, so it is refused as unusable. */
static void mp_metadata(mp *m, const char *to)
{
    mp_junk_head(m, 7, "metadata", STRANGER, to);
    mp_str(m, "md"), mp_byte(m, 0x82);
    mp_str(m, "worker"), mp_byte(m, 0xc4), mp_byte(m, 1), mp_byte(m, 0);
    mp_str(m, "regions"), mp_byte(m, 0x90);
}

/* Message i of a sender: its bytes in m, its cause returned. */
static int framed_message(framed *f, uint64_t i, mp *m)
{
    switch (i % 8) {
    case 0: /* random bytes */
        m->n = 1 + (size_t)rand_r(&f->seed) % 64;
        for (size_t k = 0; k < m->n; k++) m->b[k] = (uint8_t)rand_r(&f->seed);
        return MALFORMED;
    case 1: m->n = 0; return MALFORMED; /* empty */
    case 2: /* missing fields */
        mp_head(m, 3, 1, "write_done");
        mp_str(m, "agent"), mp_str(m, "junk");
        return MALFORMED;
    case 3: mp_head(m, 2, 2, "write_done"); return MALFORMED; /* another version */
    case 4: mp_write_done(m, STRANGER, f->endpoint, true); return MALFORMED; /* mistyped */
    case 5: mp_head(m, 2, 1, "junk_type"); return UNKNOWN_TYPE;
    case 6: mp_metadata(m, f->endpoint); return UNUSABLE;
    default: mp_write_done(m, STRANGER, f->endpoint, false); return UNEXPECTED;
    }
}

/* A message of a lane sender: the lane has no empty frames (an empty one
 * would end the connection), so one byte no msgpack begins with stands in. */
static void lane_frame_of(mp *m, uint8_t *frame, size_t *n)
{
    if (m->n == 0) m->b[m->n++] = 0xc1;
    frame[0] = (uint8_t)(m->n >> 24), frame[1] = (uint8_t)(m->n >> 16);
    frame[2] = (uint8_t)(m->n >> 8), frame[3] = (uint8_t)m->n;
    memcpy(frame + 4, m->b, m->n);
    *n = 4 + m->n;
}

/* A TCP connection to port on 127.0.0.1, its reads and writes bounded in
 * time; -1 when it cannot be made. */
static int tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {WAIT_MS / 2000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The end of a junk connection: its side shut, then what the instance
 * sends read until it hangs up (every byte was taken, and counted, by then). */
static int hang_up(int fd)
{
    int err = shutdown(fd, SHUT_WR) != 0 ? errno : 0;
    char buf[256];
    ssize_t got;
    while (!err && (got = recv(fd, buf, sizeof buf, 0)) != 0)
        if (got < 0) err = errno;
    close(fd);
    return err;
}

static void *framed_main(void *arg)
{
    framed *f = arg;
    void *ctx = NULL, *s = NULL;
    int fd = -1;
    if (f->lane_port) {
        static const uint8_t hello[] = "\0\0\0\x11" STRANGER;
        if ((fd = tcp_connect(f->lane_port)) < 0 ||
            send(fd, hello, sizeof hello - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof hello - 1))
            f->failed = errno ? errno : EIO;
    } else {
        char addr[256];
        ctx = zmq_ctx_new(), s = zmq_socket(ctx, ZMQ_PUSH);
        int linger = WAIT_MS, timeout = WAIT_MS / 2;
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
        zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
        if (zmq_connect(s, peer_zmq_address(addr, sizeof addr, f->endpoint)) != 0) f->failed = errno;
    }
    mp m;
    uint8_t frame[4 + sizeof m.b];
    /* One round of every kind at least, however slow the machine. */
    for (uint64_t i = 0; !f->failed && (i < 8 || (i < FRAMED_CAP && now_ms() < f->deadline_ms));
         i++) {
        /* Paced: message i not before its share of the time. */
        while (now_ms() < f->start_ms + i * JUNK_MS / FRAMED_CAP) usleep(1000);
        int cause = framed_message(f, i, &m);
        size_t n;
        if (fd >= 0) lane_frame_of(&m, frame, &n);
        if (fd >= 0 ? send(fd, frame, n, MSG_NOSIGNAL) != (ssize_t)n : zmq_send(s, m.b, m.n, 0) < 0) {
            /* A PUSH socket whose queue stayed full for SNDTIMEO met the
             * instance's bounded queues (a sanitizer build on a loaded
             * runner drains the flood slower than it comes): what it
             * queued is still delivered within the linger and counted;
             * it sends no more. Any other error fails the test. */
            if (fd < 0 && errno == EAGAIN) f->held_back = true;
            else f->failed = errno;
            if (f->held_back) break;
        } else {
            f->sent[cause]++;
        }
    }
    if (fd >= 0) {
        int err = hang_up(fd);
        if (!f->failed) f->failed = err;
        return NULL;
    }
    if (!f->failed) f->failed = taken_up_to_here(ctx, s, f->endpoint, NULL, NULL);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return NULL;
}

/* ---- raw junk: TCP connections ------------------------------------------- */

typedef struct raw {
    pthread_t thread;
    const char *endpoint;
    uint16_t port;
    bool lane; /* port is the control lane's: every kind fails its framing */
    uint64_t deadline_ms;
    uint64_t handshakes, oversize;
    int failed;
} raw;

/* A ZMTP 3.0 greeting naming a mechanism nobody speaks: refused at once. */
static size_t bad_mechanism(uint8_t *b)
{
    memset(b, 0, 64);
    b[0] = 0xff, b[9] = 0x7f, b[10] = 3, b[11] = 0;
    memcpy(b + 12, "JUNK", 4);
    return 64;
}

/* Sends bytes on a new connection, then waits for the instance to hang up:
 * every connection has ended, and been counted, before the next starts. */
static int raw_connection(uint16_t port, const void *bytes, size_t n)
{
    int fd = tcp_connect(port);
    if (fd < 0) return errno ? errno : EIO;
    if (send(fd, bytes, n, MSG_NOSIGNAL) != (ssize_t)n) {
        int err = errno ? errno : EIO;
        close(fd);
        return err;
    }
    return hang_up(fd);
}

/* One message over max_control_message_bytes from a PUSH socket of its
 * own: libzmq drops the connection, reporting no handshake failure. The
 * socket is closed only once the instance hung up (its monitor says so),
 * and never dials again, so that it never leaves mid-handshake. */
static int oversize_message(const char *endpoint)
{
    static uint8_t big[MAX_MESSAGE + 4096];
    void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_PUSH), *mon = zmq_socket(ctx, ZMQ_PAIR);
    int linger = 0, timeout = WAIT_MS / 2, never = -1, err = 0;
    char addr[256];
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &never, sizeof never);
    zmq_setsockopt(mon, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    if (zmq_socket_monitor(s, "inproc://oversize", ZMQ_EVENT_DISCONNECTED) != 0 ||
        zmq_connect(mon, "inproc://oversize") != 0 ||
        zmq_connect(s, peer_zmq_address(addr, sizeof addr, endpoint)) != 0 ||
        zmq_send(s, big, sizeof big, 0) < 0)
        err = errno;
    zmq_msg_t ev; /* the event, then its address */
    zmq_msg_init(&ev);
    if (!err && (zmq_msg_recv(&ev, mon, 0) < 0 || zmq_msg_recv(&ev, mon, 0) < 0)) err = errno;
    zmq_msg_close(&ev);
    zmq_close(mon);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return err;
}

static void *raw_main(void *arg)
{
    raw *r = arg;
    static const char http[] = "GET /metrics HTTP/1.1\r\nHost: kvcr\r\n\r\n";
    static const uint8_t cut[] = {0xff, 0, 0, 0, 0};
    /* a name, then a frame over max_control_message_bytes (65536) */
    static const uint8_t lane_oversize[] = "\0\0\0\6junk-x\0\1\0\1";
    uint8_t greeting[64];
    size_t n_greeting = bad_mechanism(greeting);
    /* One round of every kind at least, however slow the machine. */
    for (uint64_t i = 0; !r->failed && (i < 8 || now_ms() < r->deadline_ms); i++) {
        switch (i % 8) {
        case 0:
        case 1: r->failed = raw_connection(r->port, http, sizeof http - 1), r->handshakes++; break;
        case 2:
        case 3: r->failed = raw_connection(r->port, cut, sizeof cut), r->handshakes++; break;
        case 7:
            if (r->lane) {
                r->failed = raw_connection(r->port, lane_oversize, sizeof lane_oversize - 1);
                r->handshakes++;
            } else {
                r->failed = oversize_message(r->endpoint), r->oversize++;
            }
            break;
        default:
            r->failed = raw_connection(r->port, greeting, n_greeting), r->handshakes++;
            break;
        }
    }
    return NULL;
}

/* ---- the instance's side -------------------------------------------------- */

typedef struct seen {
    uint64_t count[N_CAUSES], other_causes;
    bool checked_text; /* promtool ran on a snapshot with the family */
    double auth_refused; /* gauge control_auth_refused_connections, last seen */
} seen;

/* Takes a snapshot and adds its drop counters to s; the first snapshot
 * that has them goes through promtool. */
static void take(rig *r, seen *s)
{
    kvcr_stats *st = NULL;
    assert_int_equal(kvcr_stats_take(r->kv, &st), 0);
    assert_non_null(st);
    bool any = false;
    for (size_t i = 0; i < st->n_counters; i++) {
        const kvcr_counter *c = &st->counters[i];
        if (strcmp(c->name, KVCR_CONTROL_DROPPED_METRIC) != 0) continue;
        any = true;
        int k = 0;
        while (k < N_CAUSES && strcmp(c->operation, cause_names[k]) != 0) k++;
        if (k == N_CAUSES)
            s->other_causes += (uint64_t)c->value;
        else
            s->count[k] += (uint64_t)c->value;
    }
    for (size_t i = 0; i < st->n_gauges; i++)
        if (strcmp(st->gauges[i].resource, "control_auth_refused_connections") == 0)
            s->auth_refused = st->gauges[i].value;
    if (any && !s->checked_text) {
        char *text = NULL;
        size_t len = 0;
        assert_int_equal(kvcr_stats_render_prometheus(st, &text, &len), 0);
        assert_non_null(strstr(text, "# TYPE kvcr_control_dropped_total counter\n"));
        assert_non_null(strstr(text, "kvcr_control_dropped_total{cause=\""));
        assert_promtool_clean(text);
        kvcr_prometheus_free(text);
        s->checked_text = true;
    }
    kvcr_stats_free(st);
}

static bool reached(const seen *s, const uint64_t *want)
{
    for (int c = 0; c < N_CAUSES; c++)
        if (s->count[c] < want[c]) return false;
    return true;
}

/* Takes snapshots until the counts reach want (a poll, bounded: WAIT_MS).
 * The senders saw their last message taken (taken_up_to_here, hang_up)
 * before this: nothing is counted later, so with exact each must equal
 * want (nothing counted twice), else be at least want. */
static seen wait_counts(rig *r, const uint64_t *want, bool exact)
{
    seen s = {0};
    uint64_t give_up = now_ms() + WAIT_MS;
    take(r, &s);
    while (!reached(&s, want) && now_ms() < give_up) {
        usleep(50000);
        take(r, &s);
    }
    for (int c = 0; c < N_CAUSES; c++)
        if (exact ? s.count[c] != want[c] : s.count[c] < want[c])
            fail_msg("cause %s: %llu counted, %s%llu sent", cause_names[c],
                     (unsigned long long)s.count[c], exact ? "" : "at least ",
                     (unsigned long long)want[c]);
    assert_int_equal(s.other_causes, 0);
    assert_true(s.checked_text);
    return s;
}

/* At most one log line per cause per second since the junk began (the
 * first one at once), one at least for each cause counted, and the lines
 * and the held-back counts they carry add up to no more than was counted
 * (the last ones held back are never said). */
static void check_log(const uint64_t *counted, uint64_t start)
{
    unsigned limit = (unsigned)((now_ms() - start) / 1000) + 1;
    pthread_mutex_lock(&sink.lock);
    for (int c = 0; c < N_CAUSES; c++) {
        printf("cause %-12s counted %8llu, %u log lines (%u saying %llu held back), limit %u\n",
               cause_names[c], (unsigned long long)counted[c], sink.lines[c], sink.held_lines[c],
               (unsigned long long)sink.held[c], limit);
        if (counted[c] > 0) assert_true(sink.lines[c] >= 1);
        assert_true(sink.lines[c] <= limit);
        assert_true(sink.lines[c] + sink.held[c] <= counted[c]);
    }
    pthread_mutex_unlock(&sink.lock);
}

static uint16_t port_of(const char *endpoint)
{
    const char *colon = strrchr(endpoint, ':');
    assert_non_null(colon);
    return (uint16_t)atoi(colon + 1);
}

static void test_junk_is_counted_by_cause_and_logged_once_a_second(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, 4);
    rig r;
    rig_init_remote(&r, BS, 8, 8);
    r.cfg.enable_telemetry = true;
    r.cfg.limits.max_control_message_bytes = MAX_MESSAGE;
    r.cfg.callbacks.log = count_line;
    sink_reset();
    rig_start(&r);
    const char *endpoint = kvcr_control_endpoint(r.kv);

    uint64_t start = now_ms();
    framed f[FRAMED_SENDERS];
    raw w[RAW_SENDERS];
    for (int i = 0; i < FRAMED_SENDERS; i++) {
        f[i] = (framed){.endpoint = endpoint, .start_ms = start, .deadline_ms = start + JUNK_MS,
                        .seed = 7u + i, .lane_port = i % 2 ? peer_lane_port(endpoint) : 0};
        assert_int_equal(pthread_create(&f[i].thread, NULL, framed_main, &f[i]), 0);
    }
    for (int i = 0; i < RAW_SENDERS; i++) {
        bool lane = i % 2 && peer_lane_port(endpoint) != 0;
        w[i] = (raw){.endpoint = endpoint, .port = lane ? peer_lane_port(endpoint) : port_of(endpoint),
                     .lane = lane, .deadline_ms = start + JUNK_MS};
        assert_int_equal(pthread_create(&w[i].thread, NULL, raw_main, &w[i]), 0);
    }
    /* Every sender joined before anything is asserted: a failed assertion
     * leaves this frame, and no thread may still use it. */
    for (int i = 0; i < FRAMED_SENDERS; i++) pthread_join(f[i].thread, NULL);
    for (int i = 0; i < RAW_SENDERS; i++) pthread_join(w[i].thread, NULL);
    uint64_t want[N_CAUSES] = {0}, oversize = 0;
    for (int i = 0; i < FRAMED_SENDERS; i++) {
        assert_int_equal(f[i].failed, 0);
        uint64_t sent = 0;
        for (int c = 0; c < N_CAUSES; c++) want[c] += f[i].sent[c], sent += f[i].sent[c];
        if (f[i].held_back)
            print_message("framed sender %d: held back by the instance after %llu messages\n", i,
                          (unsigned long long)sent);
    }
    for (int i = 0; i < RAW_SENDERS; i++) {
        assert_int_equal(w[i].failed, 0);
        want[HANDSHAKE] += w[i].handshakes;
        oversize += w[i].oversize;
    }
    for (int c = 0; c < N_CAUSES; c++)
        if (c != AUTH && c != BAD_SENDER && c != REPLY_LIMITED && want[c] == 0)
            fail_msg("no %s junk sent", cause_names[c]);
    assert_true(oversize > 0);

    /* Everything sent arrives (PUSH sockets lose nothing while connected,
     * and each raw connection ended before the next began). */
    seen s = wait_counts(&r, want, true);
    assert_true(s.auth_refused == 0); /* no CURVE: nothing refused for a key */
    assert_int_equal(kvcr__test_dropped_messages(r.kv),
                     want[MALFORMED] + want[UNKNOWN_TYPE] + want[UNEXPECTED] + want[UNUSABLE]);

    /* A legitimate pull still works, bytes compared. */
    peer_hint_range(&r, "req", src.endpoint, 0, 4);
    kvcr_entry_status st[4];
    assert_int_equal(rig_wait(&r, peer_deliver_range(&r, 0, 4, 0, "req"), st, NULL, NULL), 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        assert_true(rig_has_pattern(&r, r.fw + i * BS, i));
    }

    rig_stop(&r);
    check_log(s.count, start);
    /* The framed junk is spread over JUNK_MS: a second line, with what was
     * held back since the first. */
    assert_true(sink.held_lines[MALFORMED] >= 1 && sink.held[MALFORMED] > 0);
    peer_stop(&src);
}

/* A PUSH socket to addr with CURVE: server key, own key pair. */
static void *curve_push(void *ctx, const char *addr, const char *server, const char *pub,
                        const char *sec)
{
    void *s = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0;
    assert_non_null(s);
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger), 0);
    if (server != NULL) {
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server, 41), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 41), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 41), 0);
    }
    assert_int_equal(zmq_connect(s, addr), 0);
    return s;
}

/* At a CURVE endpoint: a plaintext peer fails the handshake and a key
 * outside the allow-list is refused (each at least once: their sockets
 * keep retrying), and an admitted peer's junk and its messages whose reply
 * endpoint names another key than its connection's are counted exactly. */
static void test_curve_junk_is_counted_by_cause(void **state)
{
    (void)state;
    char spub[41], ssec[41], cpub[41], csec[41], xpub[41], xsec[41];
    assert_int_equal(zmq_curve_keypair(spub, ssec), 0);
    assert_int_equal(zmq_curve_keypair(cpub, csec), 0);
    assert_int_equal(zmq_curve_keypair(xpub, xsec), 0);
    const char *allowed[] = {cpub};
    rig r;
    rig_init_remote(&r, BS, 8, 8);
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.log = count_line;
    r.cfg.remote.curve = (kvcr_curve_options){ssec, spub, allowed, 1};
    sink_reset();
    rig_start(&r);
    const char *endpoint = kvcr_control_endpoint(r.kv);
    char addr[256], from[128];
    snprintf(addr, sizeof addr, "%.*s", (int)(strstr(endpoint, "#curve=") - endpoint), endpoint);
    snprintf(from, sizeof from, STRANGER "#curve=%s", xpub); /* not the admitted key */

    void *ctx = zmq_ctx_new();
    void *admitted = curve_push(ctx, addr, spub, cpub, csec);
    void *stranger = curve_push(ctx, addr, spub, xpub, xsec);
    void *plain = curve_push(ctx, addr, NULL, NULL, NULL);
    uint64_t start = now_ms(), want[N_CAUSES] = {0};
    for (uint64_t i = 0; now_ms() < start + JUNK_MS; i++) {
        mp m;
        int cause = MALFORMED;
        if (i % 2 == 0) {
            mp_write_done(&m, from, endpoint, false);
            cause = BAD_SENDER;
        } else {
            m.n = 1 + i % 64;
            memset(m.b, 0xc1, m.n); /* a byte msgpack never uses */
        }
        assert_int_equal(zmq_send(admitted, m.b, m.n, 0), (int)m.n);
        want[cause]++;
        zmq_send(stranger, m.b, m.n, ZMQ_DONTWAIT); /* never delivered */
        zmq_send(plain, m.b, m.n, ZMQ_DONTWAIT);
        usleep(CURVE_PACE_MS * 1000);
    }
    zmq_close(stranger);
    zmq_close(plain);
    assert_int_equal(taken_up_to_here(ctx, admitted, endpoint, cpub, csec), 0);
    want[HANDSHAKE] = want[AUTH] = 1; /* at least */
    seen s = wait_counts(&r, want, false);
    assert_int_equal(s.count[MALFORMED], want[MALFORMED]);
    assert_int_equal(s.count[BAD_SENDER], want[BAD_SENDER]);
    assert_int_equal(s.count[UNKNOWN_TYPE] + s.count[UNEXPECTED] + s.count[UNUSABLE], 0);
    /* The CURVE gauge counts the same failed handshakes. */
    assert_true(s.auth_refused == (double)(s.count[HANDSHAKE] + s.count[AUTH]));
    assert_int_equal(kvcr__test_dropped_messages(r.kv), want[MALFORMED] + want[BAD_SENDER]);
    zmq_close(admitted);
    zmq_ctx_term(ctx);
    rig_stop(&r);
    check_log(s.count, start);
}

#define STRANGERS 48 /* reply endpoints named by the junk, all different */
#define STRANGER_BUDGET 16 /* replies a second to unconnected endpoints */

/* Junk start_writes, each naming another reply endpoint (all of them ports
 * of one PULL socket here, so that what the instance sends there can be
 * counted), sent within a fraction of a second: each is refused only
 * within the budget of replies to endpoints the instance holds no
 * connection to, at most two seconds' worth (the burst may straddle a
 * second), and every other one is dropped and counted as reply_limited;
 * nothing is both. */
static void test_replies_to_strangers_are_bounded_and_counted(void **state)
{
    (void)state;
    rig r;
    rig_init_remote(&r, BS, 8, 8);
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.log = count_line;
    sink_reset();
    rig_start(&r);
    const char *endpoint = kvcr_control_endpoint(r.kv);

    void *ctx = zmq_ctx_new();
    void *pull = zmq_socket(ctx, ZMQ_PULL), *push = zmq_socket(ctx, ZMQ_PUSH);
    int linger = 0, wait = 100;
    zmq_setsockopt(push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(pull, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &wait, sizeof wait);
    char from[STRANGERS][64];
    for (int i = 0; i < STRANGERS; i++) {
        size_t len = sizeof from[i];
        assert_int_equal(zmq_bind(pull, "tcp://127.0.0.1:*"), 0);
        assert_int_equal(zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, from[i], &len), 0);
    }
    char addr[256];
    assert_int_equal(zmq_connect(push, peer_zmq_address(addr, sizeof addr, endpoint)), 0);
    uint64_t start = now_ms();
    for (int i = 0; i < STRANGERS; i++) {
        mp m;
        mp_start_write(&m, from[i], endpoint, (uint8_t)i);
        assert_int_equal(zmq_send(push, m.b, m.n, 0), (int)m.n);
    }

    /* Until every start_write is accounted for: answered here, or counted
     * (each snapshot holds only its own interval's drops: they add up). */
    uint64_t replies = 0, give_up = now_ms() + WAIT_MS;
    seen s = {0};
    while (now_ms() < give_up) {
        uint8_t buf[1024];
        while (zmq_recv(pull, buf, sizeof buf, 0) >= 0) replies++;
        take(&r, &s);
        if (replies + s.count[REPLY_LIMITED] >= STRANGERS) break;
    }
    uint8_t buf[1024];
    while (zmq_recv(pull, buf, sizeof buf, 0) >= 0) replies++; /* none more expected */
    printf("%d junk start_writes: %llu refusals sent, %llu dropped as reply_limited\n", STRANGERS,
           (unsigned long long)replies, (unsigned long long)s.count[REPLY_LIMITED]);
    assert_true(replies >= 1);
    assert_true(replies <= 2 * STRANGER_BUDGET);
    assert_int_equal(replies + s.count[REPLY_LIMITED], STRANGERS);
    for (int c = 0; c < N_CAUSES; c++)
        if (c != REPLY_LIMITED) assert_int_equal(s.count[c], 0);
    assert_int_equal(s.other_causes, 0);
    zmq_close(push);
    zmq_close(pull);
    zmq_ctx_term(ctx);
    rig_stop(&r);
    check_log(s.count, start);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_junk_is_counted_by_cause_and_logged_once_a_second),
        cmocka_unit_test(test_curve_junk_is_counted_by_cause),
        cmocka_unit_test(test_replies_to_strangers_are_bounded_and_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
