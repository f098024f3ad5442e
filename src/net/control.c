/* The control channel over ZeroMQ. Each channel has its own context (and
 * so its own I/O thread): two channels in one process share nothing, which
 * is what the tests and a multi-instance process need. The PUSH sockets sit
 * in a small array searched linearly: a few hundred peers at most, and a
 * control message is rare next to the data it announces.
 *
 * Every socket has linger 0: a closed peer's unsent messages are dropped
 * rather than holding up ctl_forget or ctl_close. The protocol recovers
 * lost messages itself (write_probe), so dropping is always safe.
 *
 * Frames of a multipart message arrive as separate messages; each must then
 * decode on its own, which is no more than a sender could do anyway. */
#include "net/control.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvcr/error.h"

#define CTL_MAX_PEERS 256 /* two fds each; beyond, the least recently used is closed */
#define CTL_SNDHWM 1000   /* messages queued for one peer before sends fail */
#define TCP "tcp://"
/* The longest host that leaves room for "tcp://" and ":65535". */
#define CTL_MAX_HOST (CTL_MAX_ENDPOINT - (sizeof TCP - 1) - 6)

#define CTL_DEBUG(c, ...)                                                  \
    do {                                                                   \
        if ((c)->log) kvcr_log((c)->log, KVCR_LOG_DEBUG, __VA_ARGS__);     \
    } while (0)

typedef struct peer {
    char endpoint[CTL_MAX_ENDPOINT + 1];
    void *sock;
    uint64_t used; /* tick of the last use, for eviction */
} peer;

struct ctl_channel {
    void *ctx, *pull;
    int fd;
    const kvcr_logger *log;
    peer *peers;
    size_t n_peers, cap_peers;
    uint64_t tick;
    char endpoint[CTL_MAX_ENDPOINT + 1];
};

/* ---- endpoint strings -------------------------------------------------------- */

/* A host as ZeroMQ takes it: non-empty printable ASCII without spaces. */
static bool host_ok(const char *h, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)h[i] <= 0x20 || (unsigned char)h[i] >= 0x7f) return false;
    return true;
}

/* 1..65535 in digits, no sign and no leading zero (so that one endpoint
 * has one spelling: the peer table is keyed by the string). */
static bool port_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 5 || s[0] == '0') return false;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    return v <= 65535;
}

int ctl_check_endpoint(const char *endpoint)
{
    if (endpoint == NULL) return kvcr_fail(KVCR_EINVAL, "control endpoint is NULL");
    if (strnlen(endpoint, CTL_MAX_ENDPOINT + 1) > CTL_MAX_ENDPOINT)
        return kvcr_fail(KVCR_EINVAL, "control endpoint longer than %d bytes", CTL_MAX_ENDPOINT);
    bool ok = strncmp(endpoint, TCP, sizeof TCP - 1) == 0;
    if (ok) {
        const char *host = endpoint + sizeof TCP - 1, *colon = strrchr(host, ':');
        size_t n = colon ? (size_t)(colon - host) : 0;
        /* "*" is ZeroMQ's bind wildcard: nothing to connect to. */
        ok = colon && host_ok(host, n) && !(n == 1 && host[0] == '*') && port_ok(colon + 1);
    }
    if (!ok)
        return kvcr_fail(KVCR_EINVAL,
                         "control endpoint '%s' is not tcp://host:port (port 1..65535)", endpoint);
    return 0;
}

/* ---- the peer table ------------------------------------------------------------ */

static peer *find_peer(ctl_channel *c, const char *endpoint)
{
    for (size_t i = 0; i < c->n_peers; i++)
        if (strcmp(c->peers[i].endpoint, endpoint) == 0) return &c->peers[i];
    return NULL;
}

static void drop_peer(ctl_channel *c, peer *p)
{
    zmq_close(p->sock);
    peer *last = &c->peers[--c->n_peers];
    if (p != last) *p = *last;
}

/* Makes room for one more peer: grows the array, or past CTL_MAX_PEERS
 * closes the least recently used one. */
static int room_for_peer(ctl_channel *c)
{
    if (c->n_peers == CTL_MAX_PEERS) {
        peer *lru = &c->peers[0];
        for (size_t i = 1; i < c->n_peers; i++)
            if (c->peers[i].used < lru->used) lru = &c->peers[i];
        CTL_DEBUG(c, "control: %d peers, closing the idlest (%s)", CTL_MAX_PEERS, lru->endpoint);
        drop_peer(c, lru);
    }
    if (c->n_peers < c->cap_peers) return 0;
    size_t cap = c->cap_peers ? 2 * c->cap_peers : 8;
    if (cap > CTL_MAX_PEERS) cap = CTL_MAX_PEERS;
    peer *p = realloc(c->peers, cap * sizeof *p);
    if (p == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    c->peers = p;
    c->cap_peers = cap;
    return 0;
}

static int set_int(void *sock, int option, int value)
{
    return zmq_setsockopt(sock, option, &value, sizeof value);
}

/* A new PUSH socket connected to endpoint (already checked). ZMQ_IMMEDIATE
 * off: messages queue while the connection is being made, up to SNDHWM.
 * Reconnects start after 10 ms, backing off to 1 s: with ZeroMQ's default
 * (100 ms, plus as much again at random) a peer whose process was replaced
 * at the same endpoint (a restart, a Guard taking over) heard nothing for
 * 100-200 ms, which was nearly all of the failover time. */
static int open_peer(ctl_channel *c, const char *endpoint, peer **out)
{
    int rc = room_for_peer(c);
    if (rc != 0) return rc;
    void *s = zmq_socket(c->ctx, ZMQ_PUSH);
    if (s == NULL) return kvcr_fail(KVCR_ESYS, "control socket: %s", zmq_strerror(errno));
    if (set_int(s, ZMQ_LINGER, 0) != 0 || set_int(s, ZMQ_SNDHWM, CTL_SNDHWM) != 0 ||
        set_int(s, ZMQ_IMMEDIATE, 0) != 0 || set_int(s, ZMQ_RECONNECT_IVL, 10) != 0 ||
        set_int(s, ZMQ_RECONNECT_IVL_MAX, 1000) != 0 || zmq_connect(s, endpoint) != 0) {
        rc = kvcr_fail(KVCR_ESYS, "cannot connect to control endpoint %s: %s", endpoint,
                       zmq_strerror(errno));
        zmq_close(s);
        return rc;
    }
    peer *p = &c->peers[c->n_peers++];
    snprintf(p->endpoint, sizeof p->endpoint, "%s", endpoint);
    p->sock = s;
    p->used = ++c->tick;
    CTL_DEBUG(c, "control: connecting to %s", endpoint);
    *out = p;
    return 0;
}

int ctl_connect(ctl_channel *c, const char *endpoint)
{
    int rc = ctl_check_endpoint(endpoint);
    if (rc != 0) return rc;
    peer *p = find_peer(c, endpoint);
    return p ? 0 : open_peer(c, endpoint, &p);
}

int ctl_send(ctl_channel *c, const char *endpoint, const void *data, size_t len)
{
    int rc = ctl_check_endpoint(endpoint);
    if (rc != 0) return rc;
    if (data == NULL && len > 0) return kvcr_fail(KVCR_EINVAL, "control message data is NULL");
    peer *p = find_peer(c, endpoint);
    if (p == NULL && (rc = open_peer(c, endpoint, &p)) != 0) return rc;
    p->used = ++c->tick;
    if (zmq_send(p->sock, data, len, ZMQ_DONTWAIT) >= 0) return 0;
    /* A full queue (EAGAIN) means the peer is gone or far behind: start
     * over with a fresh socket on the next send. */
    int err = errno;
    drop_peer(c, p);
    CTL_DEBUG(c, "control: send to %s failed (%s), socket closed", endpoint, zmq_strerror(err));
    return kvcr_fail(KVCR_ESYS, "control send to %s failed: %s", endpoint,
                     err == EAGAIN ? "queue full" : zmq_strerror(err));
}

void ctl_forget(ctl_channel *c, const char *endpoint)
{
    peer *p = endpoint ? find_peer(c, endpoint) : NULL;
    if (p == NULL) return;
    CTL_DEBUG(c, "control: forgetting %s", endpoint);
    drop_peer(c, p);
}

/* ---- the channel --------------------------------------------------------------- */

/* The port ZeroMQ bound, from ZMQ_LAST_ENDPOINT ("tcp://0.0.0.0:41234"). */
static int bound_port(void *sock, unsigned *port)
{
    char last[CTL_MAX_ENDPOINT + 64];
    size_t sz = sizeof last;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last, &sz) != 0) return -1;
    last[sizeof last - 1] = '\0';
    const char *colon = strrchr(last, ':');
    if (colon == NULL || !port_ok(colon + 1)) return -1;
    *port = (unsigned)strtoul(colon + 1, NULL, 10);
    return 0;
}

/* The PULL socket, bound; *where gets the address it was bound at. */
static int bind_pull(ctl_channel *c, const char *host, uint16_t port, int *listener,
                     size_t max_message, unsigned *bound)
{
    char where[CTL_MAX_ENDPOINT + 1], num[8] = "*";
    int64_t max = (int64_t)max_message;
    if (port != 0) snprintf(num, sizeof num, "%u", (unsigned)port);
    snprintf(where, sizeof where, TCP "%s:%s", host, num);
    c->pull = zmq_socket(c->ctx, ZMQ_PULL);
    if (c->pull == NULL) return kvcr_fail(KVCR_ESYS, "control socket: %s", zmq_strerror(errno));
    if (set_int(c->pull, ZMQ_LINGER, 0) != 0 ||
        zmq_setsockopt(c->pull, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0 ||
        (*listener >= 0 && set_int(c->pull, ZMQ_USE_FD, *listener) != 0))
        return kvcr_fail(KVCR_ESYS, "control socket options: %s", zmq_strerror(errno));
    int adopted = *listener;
    *listener = -1; /* from here on ZeroMQ closes it */
    if (zmq_bind(c->pull, where) != 0) {
        int err = errno; /* a host ZeroMQ cannot use is the caller's mistake */
        if (adopted >= 0) close(adopted);
        return kvcr_fail(err == EINVAL || err == ENODEV ? KVCR_EINVAL : KVCR_ESYS,
                         "cannot bind control endpoint %s: %s", where, zmq_strerror(err));
    }
    size_t sz = sizeof c->fd;
    if (bound_port(c->pull, bound) != 0 || zmq_getsockopt(c->pull, ZMQ_FD, &c->fd, &sz) != 0)
        return kvcr_fail(KVCR_ESYS, "control socket %s: %s", where, zmq_strerror(errno));
    CTL_DEBUG(c, "control: bound %s (port %u)", where, *bound);
    return 0;
}

static int open_channel(const char *bind_host, uint16_t port, int *listener,
                        const char *advertise_host, size_t max_message, const kvcr_logger *log,
                        ctl_channel **out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "ctl_open: out is NULL");
    *out = NULL;
    if (bind_host == NULL || strnlen(bind_host, CTL_MAX_HOST + 1) > CTL_MAX_HOST ||
        !host_ok(bind_host, strlen(bind_host)))
        return kvcr_fail(KVCR_EINVAL, "bad control bind host");
    if (advertise_host == NULL || strnlen(advertise_host, CTL_MAX_HOST + 1) > CTL_MAX_HOST ||
        !host_ok(advertise_host, strlen(advertise_host)) || strcmp(advertise_host, "*") == 0)
        return kvcr_fail(KVCR_EINVAL, "bad control advertise host");
    if (max_message == 0 || max_message > INT64_MAX)
        return kvcr_fail(KVCR_EINVAL, "control max_message must be 1..INT64_MAX");
    ctl_channel *c = calloc(1, sizeof *c);
    if (c == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    c->log = log;
    c->ctx = zmq_ctx_new();
    if (c->ctx == NULL) {
        free(c);
        return kvcr_fail(KVCR_ESYS, "zmq_ctx_new: %s", zmq_strerror(errno));
    }
    unsigned bound;
    int rc = bind_pull(c, bind_host, port, listener, max_message, &bound);
    if (rc != 0) {
        ctl_close(c);
        return rc;
    }
    snprintf(c->endpoint, sizeof c->endpoint, TCP "%s:%u", advertise_host, bound);
    CTL_DEBUG(c, "control: advertising %s", c->endpoint);
    *out = c;
    return 0;
}

int ctl_open(const char *bind_host, uint16_t port, int listener, const char *advertise_host,
             size_t max_message, const kvcr_logger *log, ctl_channel **out)
{
    int rc = open_channel(bind_host, port, &listener, advertise_host, max_message, log, out);
    if (listener >= 0) close(listener); /* never handed to ZeroMQ */
    return rc;
}

void ctl_close(ctl_channel *c)
{
    if (c == NULL) return;
    while (c->n_peers > 0) drop_peer(c, &c->peers[c->n_peers - 1]);
    if (c->pull) zmq_close(c->pull);
    /* Every socket has linger 0, so this does not wait for the network;
     * EINTR is the only reason to call it again. */
    for (int i = 0; i < 100 && zmq_ctx_term(c->ctx) != 0 && errno == EINTR; i++) {
    }
    free(c->peers);
    free(c);
}

const char *ctl_endpoint(const ctl_channel *c)
{
    return c->endpoint;
}

int ctl_fd(const ctl_channel *c)
{
    return c->fd;
}

size_t ctl_recv(ctl_channel *c, size_t max, void (*cb)(void *ud, const void *data, size_t len),
                void *ud)
{
    size_t n = 0;
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    /* EAGAIN ends it (the queue is empty: ZMQ_FD will fire again); EINTR
     * is retried a few times so that 0 keeps meaning "drained". */
    for (int eintr = 0; n < max && eintr < 8;) {
        if (zmq_msg_recv(&msg, c->pull, ZMQ_DONTWAIT) < 0) {
            if (errno != EINTR) break;
            eintr++;
            continue;
        }
        cb(ud, zmq_msg_data(&msg), zmq_msg_size(&msg));
        n++;
    }
    zmq_msg_close(&msg);
    return n;
}
