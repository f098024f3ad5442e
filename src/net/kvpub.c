/* The KV-event publisher (net/kvpub.h): batches built under a small lock by
 * whoever reports events, sent and kept for replay by the publisher's
 * thread, which alone touches the sockets. */
#include "net/kvpub.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvcr/error.h"
#include "util/clock.h"

#define LINGER_MS 200         /* what close waits for queued messages at most */
#define REPLAYS_PER_TURN 8    /* replay requests served per turn of the thread */
#define SUBSCRIPTIONS_PER_TURN 64

typedef struct batch {
    struct batch *next;
    msgpack_sbuffer events; /* encoded events, back to back */
    uint32_t n;
    uint64_t opened_ns;
} batch;

typedef struct kept {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
} kept;

struct kvpub {
    kvpub_opts o;
    char *topic, *endpoint;
    const kvcr_logger *log;
    kvcr_log_limit replay_warn;

    pthread_mutex_t lock; /* guards the batches and stopping */
    batch *open;
    batch *q_head, *q_tail;
    uint32_t n_queued;
    bool stopping;

    int wake_fd;
    _Atomic uint64_t published, dropped, events_dropped, next_seq;

    /* the thread's own */
    pthread_t thread;
    void *ctx, *pub, *replay;
    kept *ring;
    uint32_t ring_head, ring_n; /* oldest at ring_head */
};

bool kvpub_binds(const char *endpoint)
{
    return strchr(endpoint, '*') != NULL || strstr(endpoint, "::") != NULL ||
           strncmp(endpoint, "ipc://", 6) == 0 || strncmp(endpoint, "inproc://", 9) == 0;
}

/* ---- batches (any thread, under the lock) --------------------------------- */

static void batch_free(batch *b)
{
    msgpack_sbuffer_destroy(&b->events);
    free(b);
}

/* Locked: the open batch goes to the queue, or is dropped when the queue
 * is full. */
static void close_open(kvpub *p)
{
    batch *b = p->open;
    p->open = NULL;
    if (b == NULL) return;
    if (p->n_queued >= p->o.max_queued_batches) {
        p->dropped++;
        p->events_dropped += b->n;
        batch_free(b);
        return;
    }
    b->next = NULL;
    if (p->q_tail)
        p->q_tail->next = b;
    else
        p->q_head = b;
    p->q_tail = b;
    p->n_queued++;
}

static void wake(kvpub *p)
{
    uint64_t one = 1;
    ssize_t w = write(p->wake_fd, &one, sizeof one);
    (void)w; /* a counter already non-zero wakes the thread all the same */
}

int kvpub_add(kvpub *p, const kvev_event *e)
{
    bool full = false;
    int rc = 0;
    pthread_mutex_lock(&p->lock);
    if (p->open == NULL) {
        p->open = calloc(1, sizeof *p->open);
        if (p->open != NULL) {
            msgpack_sbuffer_init(&p->open->events);
            p->open->opened_ns = kvcr_now_ns();
        }
    }
    batch *b = p->open;
    size_t before = b ? b->events.size : 0;
    msgpack_packer pk;
    if (b) msgpack_packer_init(&pk, &b->events, msgpack_sbuffer_write);
    if (b == NULL || kvev_pack_event(&pk, e, p->o.positional) != 0) {
        if (b) b->events.size = before; /* the event's partial bytes are taken back */
        p->events_dropped++;
        rc = -1;
    } else if (++b->n >= p->o.max_batch_events) {
        close_open(p);
        full = true;
    }
    pthread_mutex_unlock(&p->lock);
    if (full) wake(p);
    return rc;
}

void kvpub_counts_get(kvpub *p, kvpub_counts *c)
{
    c->published = p->published;
    c->dropped = p->dropped;
    c->events_dropped = p->events_dropped;
    c->next_seq = p->next_seq;
}

/* ---- sending (the thread) --------------------------------------------------- */

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The thread: the payload joins the ring, evicting the oldest. */
static void keep(kvpub *p, uint64_t seq, uint8_t *payload, size_t len)
{
    uint32_t cap = p->o.buffer_batches;
    if (p->ring_n == cap) {
        free(p->ring[p->ring_head].payload);
        p->ring_head = (p->ring_head + 1) % cap;
        p->ring_n--;
    }
    p->ring[(p->ring_head + p->ring_n) % cap] = (kept){seq, payload, len};
    p->ring_n++;
}

/* The thread: numbers the batch, sends its three frames without waiting,
 * keeps it for replay. */
static void send_batch(kvpub *p, batch *b)
{
    uint8_t *payload;
    size_t len;
    if (kvev_pack_batch(wall_seconds(), b->events.data, b->events.size, b->n, p->o.dp_rank,
                        &payload, &len) != 0) {
        p->dropped++;
        p->events_dropped += b->n;
        return;
    }
    uint64_t seq = p->next_seq++;
    if (p->o.numbered) p->o.numbered(p->o.numbered_ud, seq + 1);
    uint8_t seq_be[8];
    kvev_put_be64(seq_be, seq);
    /* The socket takes a message whole or not at all: it checks its queues
     * on the first frame only. */
    if (zmq_send(p->pub, p->topic, strlen(p->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, seq_be, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, payload, len, ZMQ_DONTWAIT) < 0) {
        p->dropped++;
        p->events_dropped += b->n;
    } else {
        p->published++;
    }
    keep(p, seq, payload, len);
}

/* The thread: subscriptions arrive as messages on the socket (every one:
 * XPUB_VERBOSE). A new subscriber hears nothing of what was sent before it
 * joined, and a router told nothing new does not know it missed anything
 * (a warm start announces its blocks once, at start, before any router
 * could reconnect). So a subscription is answered with an empty batch
 * numbered as the next, once the stream has sent anything: every
 * subscriber sees the stream's current number, and one that joined late
 * asks the replay for what came before. */
static void drain_subscriptions(kvpub *p)
{
    char buf[64];
    bool joined = false;
    for (int i = 0; i < SUBSCRIPTIONS_PER_TURN; i++) {
        int n = zmq_recv(p->pub, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0) break;
        joined |= n > 0 && buf[0] == 1; /* 1: subscribe, 0: unsubscribe */
    }
    if (joined && p->next_seq != p->o.first_seq) { /* else the first batch is still to come */
        batch empty = {0};
        msgpack_sbuffer_init(&empty.events);
        send_batch(p, &empty);
    }
}

/* ---- replay (the thread) ----------------------------------------------------- */

/* Reads one request: up to 3 frames (identity, an optional empty
 * delimiter, the start). Returns the number of envelope frames kept in
 * env (1 or 2) and the start, or 0 for a request to ignore, -1 for none. */
static int read_request(kvpub *p, zmq_msg_t env[2], uint64_t *start)
{
    zmq_msg_t part[4];
    int n = 0;
    bool more = true;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            for (int i = 0; i < n && i < 4; i++) zmq_msg_close(&part[i]);
            return n == 0 ? -1 : 0; /* a message's frames arrive together: never half */
        }
        more = zmq_msg_more(&m);
        if (n < 4)
            part[n] = m;
        else
            zmq_msg_close(&m);
        n++;
    }
    const char *why = n < 2 || n > 3 ? "a replay request has the wrong number of frames" : NULL;
    if (why == NULL && n == 3 && zmq_msg_size(&part[1]) != 0)
        why = "a replay request's delimiter frame is not empty";
    if (why == NULL)
        why = kvev_decode_replay_request(zmq_msg_data(&part[n - 1]), zmq_msg_size(&part[n - 1]),
                                         start);
    if (why) {
        kvcr_log_limited(p->log, &p->replay_warn, 1000, "kv events: replay request ignored: %s",
                         why);
        for (int i = 0; i < n && i < 4; i++) zmq_msg_close(&part[i]);
        return 0;
    }
    for (int i = 0; i < n - 1; i++) env[i] = part[i];
    zmq_msg_close(&part[n - 1]);
    return n - 1;
}

static int send_envelope(kvpub *p, zmq_msg_t *env, int n_env)
{
    for (int i = 0; i < n_env; i++)
        if (zmq_send(p->replay, zmq_msg_data(&env[i]), zmq_msg_size(&env[i]),
                     ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
            return -1;
    return 0;
}

static int send_answer(kvpub *p, zmq_msg_t *env, int n_env, uint64_t seq, const void *payload,
                       size_t len)
{
    uint8_t seq_be[8];
    kvev_put_be64(seq_be, seq);
    if (send_envelope(p, env, n_env) != 0 ||
        zmq_send(p->replay, seq_be, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->replay, payload, len, ZMQ_DONTWAIT) < 0)
        return -1;
    return 0;
}

static void serve_replays(kvpub *p)
{
    for (int r = 0; r < REPLAYS_PER_TURN; r++) {
        zmq_msg_t env[2];
        uint64_t start;
        int n_env = read_request(p, env, &start);
        if (n_env < 0) return;
        if (n_env == 0) continue;
        int rc = 0;
        for (uint32_t i = 0; rc == 0 && i < p->ring_n; i++) {
            const kept *k = &p->ring[(p->ring_head + i) % p->o.buffer_batches];
            if (k->seq >= start) rc = send_answer(p, env, n_env, k->seq, k->payload, k->len);
        }
        if (rc == 0) rc = send_answer(p, env, n_env, KVEV_END_SEQ, "", 0);
        if (rc != 0)
            kvcr_log_limited(p->log, &p->replay_warn, 1000,
                             "kv events: a replay was cut short: %s", zmq_strerror(errno));
        for (int i = 0; i < n_env; i++) zmq_msg_close(&env[i]);
    }
}

/* ---- the thread ---------------------------------------------------------------- */

/* Locked: the batches ready to send (every one when stopping). */
static batch *take_ready(kvpub *p, bool *stopping)
{
    *stopping = p->stopping;
    if (p->open != NULL && p->open->n > 0 &&
        (p->stopping ||
         kvcr_now_ns() - p->open->opened_ns >= (uint64_t)p->o.batch_interval_ms * 1000000u))
        close_open(p);
    batch *b = p->q_head;
    p->q_head = p->q_tail = NULL;
    p->n_queued = 0;
    return b;
}

static void *run(void *arg)
{
    kvpub *p = arg;
    for (;;) {
        zmq_pollitem_t items[3] = {{p->pub, 0, ZMQ_POLLIN, 0}, {NULL, p->wake_fd, ZMQ_POLLIN, 0},
                                   {p->replay, 0, ZMQ_POLLIN, 0}};
        int n_items = p->replay ? 3 : 2;
        if (zmq_poll(items, n_items, (long)p->o.batch_interval_ms) < 0 && errno != EINTR)
            kvcr_log(p->log, KVCR_LOG_ERROR, "kv events: poll failed: %s", zmq_strerror(errno));
        uint64_t ticks;
        if (items[1].revents & ZMQ_POLLIN) {
            ssize_t got = read(p->wake_fd, &ticks, sizeof ticks);
            (void)got;
        }
        drain_subscriptions(p);
        if (p->replay) serve_replays(p);
        bool stopping;
        pthread_mutex_lock(&p->lock);
        batch *b = take_ready(p, &stopping);
        pthread_mutex_unlock(&p->lock);
        while (b != NULL) {
            batch *next = b->next;
            send_batch(p, b);
            batch_free(b);
            b = next;
        }
        if (stopping) return NULL;
    }
}

/* ---- open and close ------------------------------------------------------------ */

static int set_int(void *s, int option, int value)
{
    return zmq_setsockopt(s, option, &value, sizeof value);
}

static int open_sockets(kvpub *p, const char *replay_endpoint)
{
    int hwm = p->o.buffer_batches > INT32_MAX - 2 ? INT32_MAX : (int)p->o.buffer_batches + 2;
    p->pub = zmq_socket(p->ctx, ZMQ_XPUB);
    if (p->pub == NULL || set_int(p->pub, ZMQ_LINGER, LINGER_MS) != 0 ||
        set_int(p->pub, ZMQ_SNDHWM, hwm) != 0 || set_int(p->pub, ZMQ_XPUB_NODROP, 1) != 0 ||
        set_int(p->pub, ZMQ_XPUB_VERBOSE, 1) != 0)
        return kvcr_fail(KVCR_ESYS, "kv events socket: %s", zmq_strerror(errno));
    bool bind = kvpub_binds(p->endpoint);
    if ((bind ? zmq_bind(p->pub, p->endpoint) : zmq_connect(p->pub, p->endpoint)) != 0)
        return kvcr_fail(errno == EADDRINUSE || errno == EACCES ? KVCR_ESYS : KVCR_EINVAL,
                         "kv_events.endpoint %s: cannot %s: %s", p->endpoint,
                         bind ? "bind" : "connect", zmq_strerror(errno));
    if (replay_endpoint == NULL) return 0;
    p->replay = zmq_socket(p->ctx, ZMQ_ROUTER);
    if (p->replay == NULL || set_int(p->replay, ZMQ_LINGER, 0) != 0 ||
        set_int(p->replay, ZMQ_SNDHWM, hwm) != 0 || set_int(p->replay, ZMQ_RCVHWM, 64) != 0 ||
        set_int(p->replay, ZMQ_ROUTER_MANDATORY, 1) != 0)
        return kvcr_fail(KVCR_ESYS, "kv events replay socket: %s", zmq_strerror(errno));
    if (zmq_bind(p->replay, replay_endpoint) != 0)
        return kvcr_fail(errno == EADDRINUSE || errno == EACCES ? KVCR_ESYS : KVCR_EINVAL,
                         "kv_events.replay_endpoint %s: cannot bind: %s", replay_endpoint,
                         zmq_strerror(errno));
    return 0;
}

static void destroy(kvpub *p)
{
    if (p->pub) zmq_close(p->pub);
    if (p->replay) zmq_close(p->replay);
    if (p->ctx) zmq_ctx_term(p->ctx);
    for (uint32_t i = 0; p->ring && i < p->ring_n; i++)
        free(p->ring[(p->ring_head + i) % p->o.buffer_batches].payload);
    free(p->ring);
    for (batch *b = p->q_head, *next; b != NULL; b = next) {
        next = b->next;
        batch_free(b);
    }
    if (p->open) batch_free(p->open);
    if (p->wake_fd >= 0) close(p->wake_fd);
    pthread_mutex_destroy(&p->lock);
    free(p->topic);
    free(p->endpoint);
    free(p);
}

int kvpub_open(const kvpub_opts *o, const kvcr_logger *log, kvpub **out)
{
    *out = NULL;
    kvpub *p = calloc(1, sizeof *p);
    if (p == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    p->o = *o;
    p->log = log;
    p->wake_fd = -1;
    p->next_seq = o->first_seq;
    pthread_mutex_init(&p->lock, NULL);
    p->topic = strdup(o->topic ? o->topic : "");
    p->endpoint = strdup(o->endpoint);
    p->ring = calloc(o->buffer_batches, sizeof *p->ring);
    if (p->topic == NULL || p->endpoint == NULL || p->ring == NULL) {
        destroy(p);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    p->o.replay_endpoint = NULL; /* the caller's strings are not kept */
    p->o.endpoint = p->o.topic = NULL;
    p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->ctx = zmq_ctx_new();
    if (p->wake_fd < 0 || p->ctx == NULL) {
        destroy(p);
        return kvcr_fail(KVCR_ESYS, "kv events: %s", p->wake_fd < 0 ? "eventfd failed" :
                         "no ZeroMQ context");
    }
    int rc = open_sockets(p, o->replay_endpoint);
    if (rc == 0 && (rc = pthread_create(&p->thread, NULL, run, p)) != 0)
        rc = kvcr_fail(KVCR_ESYS, "kv events: cannot start the thread: %s", strerror(rc));
    if (rc != 0) {
        destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void kvpub_close(kvpub *p, kvpub_counts *last)
{
    if (p == NULL) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_mutex_unlock(&p->lock);
    wake(p);
    pthread_join(p->thread, NULL);
    if (last) kvpub_counts_get(p, last);
    destroy(p);
}
