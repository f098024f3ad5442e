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
 * decode on its own, which is no more than a sender could do anyway.
 *
 * CURVE: libzmq consults the ZAP handler bound at inproc://zeromq.zap.01
 * in the socket's own context, and admits every client when none is bound
 * (libzmq 4.3 has ZMQ_ZAP_ENFORCE_DOMAIN only as a draft). So the handler
 * is bound before the PULL socket and closed after it: no connection is
 * ever admitted without it. Its requests wait in the REP socket until the
 * progress thread answers them (ctl_serve_handshakes); libzmq holds the
 * handshake meanwhile, so a slow answer delays a peer, never admits one.
 *
 * Failed handshakes, with or without CURVE, are counted from the PULL
 * socket's monitor, which reports every one: refused by ZAP, and those
 * that fail before ZAP is asked or without it (bytes that are not ZMTP, a
 * plaintext peer, one that dialled with another server key), which are
 * seen nowhere else; it is read in the same call as the ZAP handler. Junk
 * that libzmq takes for a ZMTP 1.0 peer (a first byte other than 0xff) is
 * no handshake failure: it arrives as messages, or as a frame over
 * ZMQ_MAXMSGSIZE, for which libzmq closes the connection and reports only
 * a disconnection, as for any peer that leaves (so oversize messages
 * cannot be counted). */
#include "net/control.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "kvcr/error.h"
#include "net/lane.h"
#include "util/clock.h"

#define CTL_MAX_PEERS 256 /* two fds each; beyond, the least recently used is closed */
#define CTL_SNDHWM 1000   /* messages queued for one peer before sends fail */
/* A peer connection whose bytes stay unacknowledged this long is dropped
 * and made anew (ZMQ_TCP_MAXRT: TCP_USER_TIMEOUT), and an attempt to make
 * one is given up and retried after CTL_CONNECT_MS: otherwise, after a
 * partition or a link down, the kernel's retransmission backoff holds every
 * later message behind the lost ones for seconds past the outage (3 s after
 * one of 10 s), and a SYN sent during the outage waits as long. */
#define CTL_MAXRT_MS 1000
#define CTL_CONNECT_MS 500
/* The longest pause between attempts: with CTL_CONNECT_MS, a peer that
 * comes back is tried within 0.75 s (1.5 s with a 1 s pause: most of the
 * 2 s in which pulls must work again after an outage). */
#define CTL_RECONNECT_MAX_MS 250
/* The first pause after a connection to a peer broke (ZeroMQ adds up to as
 * much again at random, then doubles it up to CTL_RECONNECT_MAX_MS). A
 * process replaced at the same endpoint (a Guard serving for a dead
 * engine, which holds its listening socket) is reached again within
 * 2-4 ms; a peer that stays away costs seven more dials before the pause
 * reaches its maximum. */
#define CTL_RECONNECT_FIRST_MS 2
/* A peer whose lane refused a dial (restarted with another lane port: its
 * endpoint named by a router before the restart) is reached over ZeroMQ at
 * its address for this long, then its lane is tried again; this many such
 * peers are remembered at once. */
#define CTL_LANELESS_MS 10000
#define CTL_LANELESS 16
#define TCP "tcp://"
/* The longest host that leaves room for "tcp://" and ":65535". */
#define CTL_MAX_HOST (CTL_MAX_ENDPOINT - (sizeof TCP - 1) - 6)
/* "#curve=" and the key, at the end of a keyed endpoint. */
#define CTL_KEY_SUFFIX (sizeof CTL_CURVE_TAG - 1 + CTL_KEY_LEN)
#define ZAP_ENDPOINT "inproc://zeromq.zap.01" /* fixed by RFC 27 */
#define ZAP_FRAMES 7                          /* a CURVE request: 6 + the client key */
#define MONITOR_ENDPOINT "inproc://kvcr-control-monitor" /* per context, as all inproc */

typedef char z85_key[CTL_KEY_LEN + 1];

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
    /* CURVE (curve false: plaintext, the rest unused) */
    bool curve;
    z85_key secret, public;
    z85_key *allowed;
    size_t n_allowed;
    void *zap;     /* the ZAP handler's REP socket */
    int zap_fd;
    uint64_t refused; /* CURVE: handshakes that failed (monitor) */
    /* the PULL socket's failed handshakes, with or without CURVE */
    void *monitor; /* PAIR */
    int monitor_fd;
    kvcr_log_limit handshake_log, auth_log; /* per cause: CTL_DROP_LOG_MS */
    /* the lane (ctl_open_lane), NULL without */
    lane *lane;
    bool adopted;          /* bound on a listener handed over: see ctl_open_lane */
    size_t max_message;
    char bind_host[CTL_MAX_HOST + 1], advertise_host[CTL_MAX_HOST + 1];
    ctl_recv_cb *lane_cb;  /* ctl_recv's, while it reads the lane */
    void *lane_ud;
    /* endpoints whose lane refused a dial, sent to over ZeroMQ until then */
    struct laneless {
        char endpoint[CTL_MAX_ENDPOINT + 1];
        uint64_t until_ns;
    } laneless[CTL_LANELESS];
};

/* ---- endpoint strings -------------------------------------------------------- */

/* A host as ZeroMQ takes it: non-empty printable ASCII without spaces,
 * and without '#', which would make a keyed endpoint ambiguous. */
static bool host_ok(const char *h, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)h[i] <= 0x20 || (unsigned char)h[i] >= 0x7f || h[i] == '#') return false;
    return true;
}

bool ctl_key_ok(const char *key)
{
    uint8_t raw[32];
    return key != NULL && strnlen(key, CTL_KEY_LEN + 1) == CTL_KEY_LEN &&
           zmq_z85_decode(raw, key) != NULL;
}

const char *ctl_endpoint_key(const char *endpoint)
{
    size_t n = endpoint ? strlen(endpoint) : 0;
    if (n <= CTL_KEY_SUFFIX) return NULL;
    const char *tag = endpoint + n - CTL_KEY_SUFFIX;
    return strncmp(tag, CTL_CURVE_TAG, sizeof CTL_CURVE_TAG - 1) == 0 ? endpoint + n - CTL_KEY_LEN
                                                                        : NULL;
}

/* Where an endpoint's "#lane=<port>" starts, or NULL. */
static const char *lane_tag(const char *endpoint)
{
    const char *tag = strstr(endpoint, CTL_LANE_TAG);
    return tag && strchr(tag + 1, '#') == NULL ? tag : NULL;
}

/* The endpoint without its key or lane: what ZeroMQ connects to. */
static void endpoint_address(const char *endpoint, char *out, size_t cap)
{
    const char *key = ctl_endpoint_key(endpoint), *tag = lane_tag(endpoint);
    size_t n = key ? (size_t)(key - endpoint) - (sizeof CTL_CURVE_TAG - 1) : strlen(endpoint);
    if (tag) n = (size_t)(tag - endpoint);
    snprintf(out, cap, "%.*s", (int)n, endpoint);
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
    const char *key = ctl_endpoint_key(endpoint);
    if (key != NULL && !ctl_key_ok(key))
        return kvcr_fail(KVCR_EINVAL, "control endpoint '%s': the key after " CTL_CURVE_TAG
                         " is not %d characters of Z85", endpoint, CTL_KEY_LEN);
    const char *tag = lane_tag(endpoint);
    if (tag != NULL && (key != NULL || !port_ok(tag + sizeof CTL_LANE_TAG - 1)))
        return kvcr_fail(KVCR_EINVAL, "control endpoint '%s': " CTL_LANE_TAG
                         " must end it with a port 1..65535, and never with a key", endpoint);
    char addr[CTL_MAX_ENDPOINT + 1];
    endpoint_address(endpoint, addr, sizeof addr);
    bool ok = strncmp(addr, TCP, sizeof TCP - 1) == 0;
    if (ok) {
        const char *host = addr + sizeof TCP - 1, *colon = strrchr(host, ':');
        size_t n = colon ? (size_t)(colon - host) : 0;
        /* "*" is ZeroMQ's bind wildcard: nothing to connect to. */
        ok = colon && host_ok(host, n) && !(n == 1 && host[0] == '*') && port_ok(colon + 1);
    }
    if (!ok)
        return kvcr_fail(KVCR_EINVAL,
                         "control endpoint '%s' is not tcp://host:port (port 1..65535), "
                         "optionally followed by " CTL_CURVE_TAG "<key> or " CTL_LANE_TAG
                         "<port>", endpoint);
    return 0;
}

static bool key_allowed(const ctl_channel *c, const char *key)
{
    for (size_t i = 0; i < c->n_allowed; i++)
        if (strcmp(c->allowed[i], key) == 0) return true;
    return false;
}

/* The mode and allow-list half of ctl_check_peer (endpoint well formed). */
static int peer_allowed(const ctl_channel *c, const char *endpoint)
{
    const char *key = ctl_endpoint_key(endpoint);
    if (!c->curve && key != NULL)
        return kvcr_fail(KVCR_EINVAL,
                         "control endpoint %s carries a CURVE key but CURVE is off here "
                         "(refused rather than sent in plaintext)", endpoint);
    if (c->curve && key == NULL)
        return kvcr_fail(KVCR_EINVAL,
                         "control endpoint %s has no CURVE key (" CTL_CURVE_TAG "<key>) and "
                         "CURVE is on here: plaintext peers are refused", endpoint);
    if (c->curve && !key_allowed(c, key))
        return kvcr_fail(KVCR_EINVAL,
                         "control endpoint %s: its CURVE key is not in this instance's "
                         "allow-list (curve allowed_keys)", endpoint);
    return 0;
}

int ctl_check_peer(const ctl_channel *c, const char *endpoint)
{
    int rc = ctl_check_endpoint(endpoint);
    return rc != 0 ? rc : peer_allowed(c, endpoint);
}

/* ---- the peer table ------------------------------------------------------------ */

static peer *find_peer(ctl_channel *c, const char *endpoint)
{
    for (size_t i = 0; i < c->n_peers; i++)
        if (strcmp(c->peers[i].endpoint, endpoint) == 0) return &c->peers[i];
    return NULL;
}

bool ctl_connected(const ctl_channel *c, const char *endpoint)
{
    return (c->lane && lane_has(c->lane, endpoint)) ||
           find_peer((ctl_channel *)c, endpoint) != NULL; /* it only reads */
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

/* A CURVE client socket: our key pair, and the server key the endpoint
 * names (the handshake fails unless the server holds its secret key). */
static int set_client_keys(const ctl_channel *c, void *s, const char *endpoint)
{
    if (!c->curve) return 0;
    const char *server = ctl_endpoint_key(endpoint);
    return zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server, CTL_KEY_LEN + 1) != 0 ||
                   zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, c->public, CTL_KEY_LEN + 1) != 0 ||
                   zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c->secret, CTL_KEY_LEN + 1) != 0
               ? -1
               : 0;
}

/* A new PUSH socket connected to endpoint (its syntax checked; its mode
 * and key are checked against the allow-list here, once: a socket in the
 * table was admitted when it was made). ZMQ_IMMEDIATE off: messages queue
 * while the connection is being made, up to SNDHWM.
 * Reconnects start after CTL_RECONNECT_FIRST_MS, backing off to
 * CTL_RECONNECT_MAX_MS: with ZeroMQ's default (100 ms, plus as much again
 * at random) a peer whose process was replaced at the same endpoint (a
 * restart, a Guard taking over) heard nothing for 100-200 ms, which was
 * nearly all of the failover time. */
static int open_peer(ctl_channel *c, const char *endpoint, peer **out)
{
    int rc = peer_allowed(c, endpoint);
    if (rc == 0) rc = room_for_peer(c);
    if (rc != 0) return rc;
    void *s = zmq_socket(c->ctx, ZMQ_PUSH);
    if (s == NULL) return kvcr_fail(KVCR_ESYS, "control socket: %s", zmq_strerror(errno));
    char addr[CTL_MAX_ENDPOINT + 1];
    endpoint_address(endpoint, addr, sizeof addr);
    if (set_int(s, ZMQ_LINGER, 0) != 0 || set_int(s, ZMQ_SNDHWM, CTL_SNDHWM) != 0 ||
        set_int(s, ZMQ_IMMEDIATE, 0) != 0 || set_int(s, ZMQ_RECONNECT_IVL, CTL_RECONNECT_FIRST_MS) != 0 ||
        set_int(s, ZMQ_RECONNECT_IVL_MAX, CTL_RECONNECT_MAX_MS) != 0 ||
        set_int(s, ZMQ_TCP_MAXRT, CTL_MAXRT_MS) != 0 ||
        set_int(s, ZMQ_CONNECT_TIMEOUT, CTL_CONNECT_MS) != 0 ||
        set_client_keys(c, s, endpoint) != 0 || zmq_connect(s, addr) != 0) {
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

/* ---- the lane ------------------------------------------------------------------- */

/* The host of an endpoint, brackets of an IPv6 address taken off. */
static void endpoint_host(const char *endpoint, char *out, size_t cap)
{
    char addr[CTL_MAX_ENDPOINT + 1];
    endpoint_address(endpoint, addr, sizeof addr);
    const char *host = addr + sizeof TCP - 1, *colon = strrchr(host, ':');
    size_t n = colon ? (size_t)(colon - host) : 0;
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        host++;
        n -= 2;
    }
    snprintf(out, cap, "%.*s", (int)n, host);
}

static bool laneless(const ctl_channel *c, const char *endpoint)
{
    uint64_t now = kvcr_now_ns();
    for (size_t i = 0; i < CTL_LANELESS; i++)
        if (c->laneless[i].until_ns > now && strcmp(c->laneless[i].endpoint, endpoint) == 0)
            return true;
    return false;
}

/* Whether messages to endpoint (checked) go over the lane: this channel
 * has one and the endpoint offers one at a numeric host; ip and port
 * then say where. */
static bool lane_route(const ctl_channel *c, const char *endpoint, char *ip, size_t cap,
                       uint16_t *port)
{
    const char *tag = c->lane ? lane_tag(endpoint) : NULL;
    if (tag == NULL || laneless(c, endpoint)) return false;
    endpoint_host(endpoint, ip, cap);
    *port = (uint16_t)strtoul(tag + sizeof CTL_LANE_TAG - 1, NULL, 10);
    return lane_ip_ok(ip);
}

/* The lane's vouch: a connection from peer may carry messages to name when
 * name is an endpoint whose host is peer's address. */
static bool vouch(void *ud, const char *name, const struct sockaddr *from, socklen_t from_len)
{
    (void)ud;
    char host[CTL_MAX_ENDPOINT + 1];
    if (ctl_check_endpoint(name) != 0) return false;
    endpoint_host(name, host, sizeof host);
    return lane_ip_is(host, from, from_len);
}

static int zmq_send_to(ctl_channel *c, const char *endpoint, const void *data, size_t len);

/* The lane's refused hook: the peer is reached over ZeroMQ for a while
 * (the oldest mark makes room), this message first. */
static void lane_refused(void *ud, const char *name, const void *data, size_t len)
{
    ctl_channel *c = ud;
    uint64_t now = kvcr_now_ns();
    if (!laneless(c, name)) {
        struct laneless *slot = &c->laneless[0];
        for (size_t i = 1; i < CTL_LANELESS; i++)
            if (c->laneless[i].until_ns < slot->until_ns) slot = &c->laneless[i];
        snprintf(slot->endpoint, sizeof slot->endpoint, "%s", name);
        slot->until_ns = now + CTL_LANELESS_MS * 1000000ull;
        CTL_DEBUG(c, "control: %s refused its lane; ZeroMQ at its address for %d ms", name,
                  CTL_LANELESS_MS);
    }
    zmq_send_to(c, name, data, len);
}

int ctl_open_lane(ctl_channel *c)
{
    if (c->lane) return 0;
    if (c->curve)
        return kvcr_fail(KVCR_EINVAL, "the control lane is plaintext: off with CURVE");
    if (c->adopted)
        return kvcr_fail(KVCR_EINVAL, "the control lane is off on an endpoint handed over by "
                                      "the KVCR service (its port would not outlive this process)");
    const char *bind = strcmp(c->bind_host, "*") == 0 ? "0.0.0.0" : c->bind_host;
    if (!lane_ip_ok(bind) || !lane_ip_ok(c->advertise_host))
        return kvcr_fail(KVCR_EINVAL, "the control lane needs numeric IP addresses to bind and "
                                      "advertise (control_host '%s', advertise_host '%s')",
                         c->bind_host, c->advertise_host);
    size_t n = strlen(c->endpoint);
    if (n + sizeof CTL_LANE_TAG - 1 + 5 > CTL_MAX_ENDPOINT)
        return kvcr_fail(KVCR_EINVAL, "control endpoint too long for " CTL_LANE_TAG "<port>");
    lane_hooks hooks = {vouch, lane_refused, c};
    int rc = lane_open(bind, c->max_message, &hooks, c->log, &c->lane);
    if (rc != 0) return rc;
    snprintf(c->endpoint + n, sizeof c->endpoint - n, CTL_LANE_TAG "%u",
             (unsigned)lane_port(c->lane));
    lane_set_name(c->lane, c->endpoint);
    CTL_DEBUG(c, "control: advertising %s", c->endpoint);
    return 0;
}

int ctl_lane_fd(const ctl_channel *c)
{
    return c->lane ? lane_fd(c->lane) : -1;
}

/* ---- sending -------------------------------------------------------------------- */

int ctl_connect(ctl_channel *c, const char *endpoint)
{
    int rc = ctl_check_endpoint(endpoint);
    if (rc != 0) return rc;
    char ip[CTL_MAX_ENDPOINT + 1];
    uint16_t port;
    if (lane_route(c, endpoint, ip, sizeof ip, &port)) return lane_dial(c->lane, endpoint, ip, port);
    peer *p = find_peer(c, endpoint);
    return p ? 0 : open_peer(c, endpoint, &p);
}

int ctl_send(ctl_channel *c, const char *endpoint, const void *data, size_t len)
{
    int rc = ctl_check_endpoint(endpoint);
    if (rc != 0) return rc;
    if (data == NULL && len > 0) return kvcr_fail(KVCR_EINVAL, "control message data is NULL");
    char ip[CTL_MAX_ENDPOINT + 1];
    uint16_t port;
    if (lane_route(c, endpoint, ip, sizeof ip, &port))
        return lane_send(c->lane, endpoint, ip, port, data, len);
    return zmq_send_to(c, endpoint, data, len);
}

/* ctl_send over ZeroMQ (endpoint checked). */
static int zmq_send_to(ctl_channel *c, const char *endpoint, const void *data, size_t len)
{
    int rc;
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

void ctl_cork(ctl_channel *c)
{
    if (c->lane) lane_cork(c->lane);
}

void ctl_uncork(ctl_channel *c)
{
    if (c->lane) lane_uncork(c->lane);
}

void ctl_forget(ctl_channel *c, const char *endpoint)
{
    if (endpoint && c->lane) lane_forget(c->lane, endpoint);
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
        (*listener >= 0 && set_int(c->pull, ZMQ_USE_FD, *listener) != 0) ||
        (c->curve && (set_int(c->pull, ZMQ_CURVE_SERVER, 1) != 0 ||
                      zmq_setsockopt(c->pull, ZMQ_CURVE_SECRETKEY, c->secret, CTL_KEY_LEN + 1) != 0 ||
                      zmq_setsockopt(c->pull, ZMQ_ZAP_DOMAIN, "kvcr", 4) != 0)))
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

/* Copies the keys and binds the ZAP handler (before the PULL socket: see
 * the top of this file). */
static int curve_setup(ctl_channel *c, const ctl_curve *k)
{
    if (k->secret_key == NULL || k->public_key == NULL || !ctl_key_ok(k->secret_key) ||
        !ctl_key_ok(k->public_key) || k->n_allowed == 0 || k->allowed == NULL)
        return kvcr_fail(KVCR_EINVAL, "control CURVE keys must be Z85 and the allow-list non-empty");
    c->allowed = calloc(k->n_allowed, sizeof *c->allowed);
    if (c->allowed == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < k->n_allowed; i++) {
        if (k->allowed[i] == NULL || !ctl_key_ok(k->allowed[i]))
            return kvcr_fail(KVCR_EINVAL, "control CURVE allowed key %zu is not Z85", i);
        memcpy(c->allowed[i], k->allowed[i], sizeof c->allowed[i]);
    }
    c->n_allowed = k->n_allowed;
    memcpy(c->secret, k->secret_key, sizeof c->secret);
    memcpy(c->public, k->public_key, sizeof c->public);
    c->curve = true;
    c->zap = zmq_socket(c->ctx, ZMQ_REP);
    size_t sz = sizeof c->zap_fd;
    if (c->zap == NULL || set_int(c->zap, ZMQ_LINGER, 0) != 0 ||
        zmq_bind(c->zap, ZAP_ENDPOINT) != 0 || zmq_getsockopt(c->zap, ZMQ_FD, &c->zap_fd, &sz) != 0)
        return kvcr_fail(KVCR_ESYS, "control CURVE: cannot bind the ZAP handler: %s",
                         zmq_strerror(errno));
    return 0;
}

/* Failed handshakes of the PULL socket, on a PAIR socket read without
 * blocking. libzmq reports each failed connection once: refused by ZAP
 * (AUTH), a greeting or command that breaks the protocol (bytes that are
 * not ZMTP, a plaintext peer, a HELLO not encrypted to our key: PROTOCOL),
 * or closed before the handshake ended (NO_DETAIL: which of the two sides
 * saw a plaintext peer's mismatch first is a race, and the loser sees only
 * the close). */
#define MONITOR_EVENTS                                                                   \
    (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |             \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)

static int monitor_setup(ctl_channel *c)
{
    size_t sz = sizeof c->monitor_fd;
    if (zmq_socket_monitor(c->pull, MONITOR_ENDPOINT, MONITOR_EVENTS) != 0 ||
        (c->monitor = zmq_socket(c->ctx, ZMQ_PAIR)) == NULL ||
        set_int(c->monitor, ZMQ_LINGER, 0) != 0 || zmq_connect(c->monitor, MONITOR_ENDPOINT) != 0 ||
        zmq_getsockopt(c->monitor, ZMQ_FD, &c->monitor_fd, &sz) != 0)
        return kvcr_fail(KVCR_ESYS, "control: cannot monitor handshakes: %s", zmq_strerror(errno));
    return 0;
}

static int open_channel(const char *bind_host, uint16_t port, int *listener,
                        const char *advertise_host, size_t max_message, const ctl_curve *curve,
                        const kvcr_logger *log, ctl_channel **out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "ctl_open: out is NULL");
    *out = NULL;
    if (bind_host == NULL || strnlen(bind_host, CTL_MAX_HOST + 1) > CTL_MAX_HOST ||
        !host_ok(bind_host, strlen(bind_host)))
        return kvcr_fail(KVCR_EINVAL, "bad control bind host");
    size_t max_adv = curve ? CTL_MAX_HOST - CTL_KEY_SUFFIX : CTL_MAX_HOST;
    if (advertise_host == NULL || strnlen(advertise_host, max_adv + 1) > max_adv ||
        !host_ok(advertise_host, strlen(advertise_host)) || strcmp(advertise_host, "*") == 0)
        return kvcr_fail(KVCR_EINVAL, "bad control advertise host");
    if (max_message == 0 || max_message > INT64_MAX)
        return kvcr_fail(KVCR_EINVAL, "control max_message must be 1..INT64_MAX");
    ctl_channel *c = calloc(1, sizeof *c);
    if (c == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    c->log = log;
    c->max_message = max_message;
    c->adopted = *listener >= 0;
    snprintf(c->bind_host, sizeof c->bind_host, "%s", bind_host);
    snprintf(c->advertise_host, sizeof c->advertise_host, "%s", advertise_host);
    c->zap_fd = -1;
    c->monitor_fd = -1;
    c->ctx = zmq_ctx_new();
    if (c->ctx == NULL) {
        free(c);
        return kvcr_fail(KVCR_ESYS, "zmq_ctx_new: %s", zmq_strerror(errno));
    }
    unsigned bound;
    int rc = curve ? curve_setup(c, curve) : 0;
    if (rc == 0) rc = bind_pull(c, bind_host, port, listener, max_message, &bound);
    if (rc == 0) rc = monitor_setup(c);
    if (rc != 0) {
        ctl_close(c);
        return rc;
    }
    snprintf(c->endpoint, sizeof c->endpoint, TCP "%s:%u%s%s", advertise_host, bound,
             curve ? CTL_CURVE_TAG : "", curve ? c->public : "");
    CTL_DEBUG(c, "control: advertising %s", c->endpoint);
    *out = c;
    return 0;
}

int ctl_open(const char *bind_host, uint16_t port, int listener, const char *advertise_host,
             size_t max_message, const ctl_curve *curve, const kvcr_logger *log,
             ctl_channel **out)
{
    int rc =
        open_channel(bind_host, port, &listener, advertise_host, max_message, curve, log, out);
    if (listener >= 0) close(listener); /* never handed to ZeroMQ */
    return rc;
}

void ctl_close(ctl_channel *c)
{
    if (c == NULL) return;
    while (c->n_peers > 0) drop_peer(c, &c->peers[c->n_peers - 1]);
    lane_close(c->lane);
    if (c->monitor) zmq_close(c->monitor);
    if (c->pull) zmq_close(c->pull);
    if (c->zap) zmq_close(c->zap); /* after the PULL socket: see the top */
    /* Every socket has linger 0, so this does not wait for the network;
     * EINTR is the only reason to call it again. */
    for (int i = 0; i < 100 && zmq_ctx_term(c->ctx) != 0 && errno == EINTR; i++) {
    }
    free(c->peers);
    free(c->allowed);
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

/* A lane message: plaintext, so no key speaks for it. */
static void on_lane_message(void *ud, const void *data, size_t len)
{
    ctl_channel *c = ud;
    c->lane_cb(c->lane_ud, data, len, NULL);
}

size_t ctl_recv(ctl_channel *c, size_t max, ctl_recv_cb *cb, void *ud)
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
        /* "User-Id" is what the ZAP reply named: the client's key. */
        const char *key = c->curve ? zmq_msg_gets(&msg, "User-Id") : NULL;
        cb(ud, zmq_msg_data(&msg), zmq_msg_size(&msg), key);
        n++;
    }
    zmq_msg_close(&msg);
    if (c->lane && n < max) {
        c->lane_cb = cb;
        c->lane_ud = ud;
        n += lane_recv(c->lane, max - n, on_lane_message, c);
    }
    return n;
}

/* ---- the ZAP handler (RFC 27) ------------------------------------------------ */

int ctl_auth_fd(const ctl_channel *c)
{
    return c->zap_fd;
}

uint64_t ctl_auth_refused(const ctl_channel *c)
{
    return c->refused;
}

bool ctl_curve_on(const ctl_channel *c)
{
    return c->curve;
}

static bool frame_is(zmq_msg_t *f, const char *s)
{
    return zmq_msg_size(f) == strlen(s) && memcmp(zmq_msg_data(f), s, strlen(s)) == 0;
}

/* The verdict on one request: 200 with the client key (Z85) as User-Id,
 * 400 for a key outside the allow-list, 500 for a request that is not a
 * CURVE one (libzmq sends only CURVE requests here: the PULL socket is the
 * only one with a ZAP domain). */
static const char *zap_verdict(ctl_channel *c, zmq_msg_t *f, size_t n, z85_key user)
{
    user[0] = '\0';
    if (n != ZAP_FRAMES || !frame_is(&f[0], "1.0") || !frame_is(&f[5], "CURVE") ||
        zmq_msg_size(&f[6]) != 32)
        return "500";
    zmq_z85_encode(user, zmq_msg_data(&f[6]), 32);
    if (key_allowed(c, user)) return "200";
    if (c->log) /* counted when the monitor reports the failed handshake */
        kvcr_log_limited(c->log, &c->auth_log, CTL_DROP_LOG_MS,
                         "control: refused a CURVE connection from %.*s: key %s is not in the "
                         "allow-list",
                         (int)zmq_msg_size(&f[3]), (const char *)zmq_msg_data(&f[3]), user);
    user[0] = '\0';
    return "400";
}

/* Reads and drops the frames after last, if any: whether there were. */
static bool discard_rest(void *sock, zmq_msg_t *last)
{
    bool more = zmq_msg_more(last), any = more;
    zmq_msg_t extra;
    zmq_msg_init(&extra);
    while (more && zmq_msg_recv(&extra, sock, 0) >= 0) more = zmq_msg_more(&extra);
    zmq_msg_close(&extra);
    return any;
}

/* Reads one whole request, then answers it: a REP socket takes no new
 * request before it replied. */
static bool zap_one(ctl_channel *c)
{
    zmq_msg_t f[ZAP_FRAMES];
    zmq_msg_init(&f[0]);
    if (zmq_msg_recv(&f[0], c->zap, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f[0]);
        return false;
    }
    size_t n = 1;
    while (n < ZAP_FRAMES && zmq_msg_more(&f[n - 1])) {
        zmq_msg_init(&f[n]);
        zmq_msg_recv(&f[n++], c->zap, 0); /* the rest of a multipart message is there */
    }
    bool excess = discard_rest(c->zap, &f[n - 1]);
    z85_key user;
    const char *status = zap_verdict(c, f, excess ? n + 1 : n, user);
    bool ok = status[0] == '2';
    zmq_send(c->zap, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(c->zap, n > 1 ? zmq_msg_data(&f[1]) : "", n > 1 ? zmq_msg_size(&f[1]) : 0,
             ZMQ_SNDMORE);
    zmq_send(c->zap, status, 3, ZMQ_SNDMORE);
    zmq_send(c->zap, ok ? "OK" : "refused", ok ? 2 : 7, ZMQ_SNDMORE);
    zmq_send(c->zap, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(c->zap, "", 0, 0);
    for (size_t i = 0; i < n; i++) zmq_msg_close(&f[i]);
    return true;
}

/* One monitor event (two frames: event id and value, then an address),
 * if one is queued: counted, logged unless ZAP did, handed to cb. */
static bool monitor_one(ctl_channel *c, ctl_drop_cb *cb, void *ud)
{
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, c->monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        return false;
    }
    uint16_t id = 0;
    if (zmq_msg_size(&ev) == 6) memcpy(&id, zmq_msg_data(&ev), sizeof id);
    discard_rest(c->monitor, &ev);
    zmq_msg_close(&ev);
    if ((id & MONITOR_EVENTS) == 0) return true;
    bool auth = id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (c->curve) c->refused++;
    if (!auth && c->log) /* ZAP logged the AUTH ones, with the key */
        kvcr_log_limited(c->log, &c->handshake_log, CTL_DROP_LOG_MS,
                         "control: a connection failed the %s handshake (%s, or one that "
                         "closed early)",
                         c->curve ? "CURVE" : "ZeroMQ",
                         c->curve ? "a plaintext peer, bytes that are not ZeroMQ, one that "
                                    "dialled another server key"
                                  : "bytes that are not ZeroMQ");
    cb(ud, auth ? CTL_DROP_AUTH : CTL_DROP_HANDSHAKE);
    return true;
}

size_t ctl_serve_handshakes(ctl_channel *c, size_t max, ctl_drop_cb *cb, void *ud)
{
    size_t n = 0;
    while (c->curve && n < max && zap_one(c)) n++;
    while (n < max && monitor_one(c, cb, ud)) n++;
    /* The lane's junk connections: failed handshakes too, under the same
     * log limit. */
    const char *why;
    for (uint64_t junk = c->lane ? lane_take_refused(c->lane, &why) : 0; junk > 0; junk--, n++) {
        if (c->log)
            kvcr_log_limited(c->log, &c->handshake_log, CTL_DROP_LOG_MS,
                             "control: a connection failed the lane's handshake (%s)", why);
        cb(ud, CTL_DROP_HANDSHAKE);
    }
    return n;
}

int ctl_monitor_fd(const ctl_channel *c)
{
    return c->monitor_fd;
}

const char *ctl_drop_name(ctl_drop cause)
{
    static const char *const names[CTL_N_DROPS] = {
        [CTL_DROP_HANDSHAKE] = "handshake",   [CTL_DROP_AUTH] = "auth",
        [CTL_DROP_MALFORMED] = "malformed",   [CTL_DROP_UNKNOWN_TYPE] = "unknown_type",
        [CTL_DROP_BAD_SENDER] = "bad_sender", [CTL_DROP_UNEXPECTED] = "unexpected",
        [CTL_DROP_UNUSABLE] = "unusable",     [CTL_DROP_REPLY_LIMITED] = "reply_limited"};
    return (unsigned)cause < CTL_N_DROPS ? names[cause] : "?";
}
