/* The control lane (lane.h): a listener and a fixed table of connections
 * watched by one epoll set, level-triggered. Each connection has a receive
 * buffer that grows to the frame it holds and a send queue bounded by
 * LANE_TXQ_MAX. Slots never move, so an epoll event names its slot by
 * index and generation: a slot closed and taken again while events for it
 * wait is recognised and the stale event skipped.
 *
 * The handler of a message may send, and a send may close a connection
 * (its queue full, a reset): the connection whose message is being handed
 * over keeps its receive buffer until the handler returns. */
#define _GNU_SOURCE /* accept4 */
#include "net/lane.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "util/bytes.h"
#include "util/clock.h"

#define MS 1000000ull
#define RX_MIN 4096        /* the first receive buffer of a connection */
#define EVENTS 64          /* epoll events taken per call */
#define LISTENER UINT32_MAX /* the listener's slot in an event */

typedef struct conn {
    int fd; /* -1: a free slot */
    uint32_t gen;
    bool dialled, connecting, named, vouched, want_out, delivering, doomed;
    bool got_bytes; /* accepted: something arrived (a silent close is no junk) */
    bool corked;    /* on the lane's corked list */
    char name[LANE_MAX_NAME + 1];
    struct sockaddr_storage addr; /* dialled: where */
    socklen_t addr_len;
    uint64_t born_ns, used;
    uint8_t *rx;
    size_t rx_len, rx_cap;
    uint8_t *tx;
    size_t tx_head, tx_len, tx_cap; /* bytes tx[tx_head .. tx_head + tx_len) wait */
} conn;

struct lane {
    int listen_fd, ep;
    uint16_t port;
    size_t max_message;
    size_t txq_max; /* bytes queued on one connection: see enqueue */
    lane_hooks hooks;
    const kvcr_logger *log;
    char name[LANE_MAX_NAME + 1];
    conn conns[LANE_MAX_CONNS];
    /* Slots at and past top are free: slots are taken lowest first, so
     * the scans made on every receive stop at the few in use instead of
     * touching all LANE_MAX_CONNS (a cache line each) twice a turn. */
    uint32_t top;
    bool cork;
    uint32_t n_corked;
    uint32_t corked[LANE_MAX_CONNS]; /* slots with messages held by the cork */
    uint64_t tick, refused;
    const char *refused_why; /* the last refusal's reason: a static string */
};

#define LANE_DEBUG(l, ...)                                                 \
    do {                                                                   \
        if ((l)->log) kvcr_log((l)->log, KVCR_LOG_DEBUG, __VA_ARGS__);     \
    } while (0)

/* ---- the decoders ---------------------------------------------------------- */

ptrdiff_t lane_frame(const uint8_t *buf, size_t len, size_t max, const uint8_t **payload,
                     size_t *plen)
{
    if (len < LANE_HEADER) return 0;
    uint32_t n = get32be(buf);
    if (n == 0 || n > max) return -1;
    if (len - LANE_HEADER < n) return 0;
    *payload = buf + LANE_HEADER;
    *plen = n;
    return (ptrdiff_t)(LANE_HEADER + (size_t)n);
}

bool lane_name_ok(const void *s, size_t n)
{
    const uint8_t *b = s;
    if (b == NULL || n == 0 || n > LANE_MAX_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (b[i] <= 0x20 || b[i] >= 0x7f) return false;
    return true;
}

/* ---- addresses ---------------------------------------------------------------- */

/* A numeric ip and port as a socket address; false when ip is not one. */
static bool numeric_addr(const char *ip, uint16_t port, struct sockaddr_storage *ss,
                         socklen_t *len)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, ip, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        *len = sizeof *v4;
        return true;
    }
    if (inet_pton(AF_INET6, ip, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        *len = sizeof *v6;
        return true;
    }
    return false;
}

bool lane_ip_ok(const char *ip)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    return ip != NULL && numeric_addr(ip, 0, &ss, &sl);
}

bool lane_ip_is(const char *ip, const struct sockaddr *sa, socklen_t sa_len)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (ip == NULL || !numeric_addr(ip, 0, &ss, &sl) || sa->sa_family != ss.ss_family ||
        sa_len < sl)
        return false;
    if (ss.ss_family == AF_INET)
        return memcmp(&((const struct sockaddr_in *)sa)->sin_addr,
                      &((struct sockaddr_in *)&ss)->sin_addr, sizeof(struct in_addr)) == 0;
    return memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr,
                  &((struct sockaddr_in6 *)&ss)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

/* Low latency (no Nagle), and a connection whose bytes stay unacknowledged
 * for LANE_MAXRT_MS fails instead of backing off for seconds. */
static int tune(int fd)
{
    int one = 1;
    unsigned maxrt = LANE_MAXRT_MS;
    return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
                   setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &maxrt, sizeof maxrt) != 0
               ? -1
               : 0;
}

/* ---- slots -------------------------------------------------------------------- */

static uint64_t event_tag(const lane *l, const conn *c)
{
    return (uint64_t)c->gen << 32 | (uint32_t)(c - l->conns);
}

static int watch(lane *l, conn *c, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | (c->want_out ? EPOLLOUT : 0),
                             .data.u64 = event_tag(l, c)};
    return epoll_ctl(l->ep, op, c->fd, &ev);
}

/* Watches for writability exactly while something waits to be sent or the
 * dial is being made. */
static void want_out(lane *l, conn *c)
{
    bool want = c->connecting || c->tx_len > 0;
    if (want == c->want_out) return;
    c->want_out = want;
    watch(l, c, EPOLL_CTL_MOD);
}

static void free_buffers(conn *c)
{
    free(c->rx);
    free(c->tx);
    c->rx = c->tx = NULL;
    c->rx_len = c->rx_cap = c->tx_head = c->tx_len = c->tx_cap = 0;
}

/* Frees c's slot (its socket closed already); events still queued for it
 * are stale from here on. */
static void release_slot(lane *l, conn *c)
{
    free_buffers(c);
    c->fd = -1;
    c->gen++;
    while (l->top > 0 && l->conns[l->top - 1].fd < 0) l->top--;
}

/* Closes c; a connection whose message is being handed over keeps its
 * receive buffer (and its slot) until the handler returns. */
static void close_conn(lane *l, conn *c, const char *why)
{
    if (c->fd < 0 || c->doomed) return;
    LANE_DEBUG(l, "lane: closing a connection %s %s: %s", c->dialled ? "to" : "from",
               c->named || c->dialled ? c->name : "(unnamed)", why);
    close(c->fd); /* also leaves the epoll set */
    if (c->delivering)
        c->doomed = true;
    else
        release_slot(l, c);
}

/* A junk connection: closed and counted (the channel logs it). */
static void refuse(lane *l, conn *c, const char *why)
{
    l->refused++;
    l->refused_why = why;
    close_conn(l, c, why);
}

/* A free slot; with none, the idlest connection (one that never named
 * itself first) is closed for it. NULL only when that one is busy
 * handing over a message. */
static conn *free_slot(lane *l)
{
    conn *victim = NULL;
    for (size_t i = 0; i < LANE_MAX_CONNS; i++) {
        conn *c = &l->conns[i];
        if (c->fd < 0 && !c->doomed) return c;
        if (c->doomed || c->delivering) continue;
        bool anon = !c->dialled && !c->named;
        bool victim_anon = victim && !victim->dialled && !victim->named;
        if (victim == NULL || (anon && !victim_anon) ||
            (anon == victim_anon && c->used < victim->used))
            victim = c;
    }
    if (victim == NULL) return NULL;
    LANE_DEBUG(l, "lane: %d connections, closing the idlest", LANE_MAX_CONNS);
    close_conn(l, victim, "too many connections");
    return victim;
}

static conn *take_slot(lane *l, int fd, bool dialled)
{
    conn *c = free_slot(l);
    if (c == NULL) return NULL;
    uint32_t gen = c->gen;
    bool corked = c->corked; /* the slot stays on the corked list once */
    memset(c, 0, sizeof *c);
    c->gen = gen;
    c->corked = corked;
    c->fd = fd;
    c->dialled = dialled;
    c->born_ns = kvcr_now_ns();
    c->used = ++l->tick;
    if ((uint32_t)(c - l->conns) >= l->top) l->top = (uint32_t)(c - l->conns) + 1;
    return c;
}

/* The connection carrying messages to name: one made rather than one
 * being made, then the newest (after an outage a peer's old connection
 * may be dead at its end; its new one is not). */
static conn *find(const lane *l, const char *name)
{
    const conn *best = NULL;
    for (size_t i = 0; i < l->top; i++) {
        const conn *c = &l->conns[i];
        if (c->fd < 0 || c->doomed || !(c->dialled || c->vouched)) continue;
        if (strcmp(c->name, name) != 0) continue;
        if (best == NULL || (best->connecting && !c->connecting) ||
            (best->connecting == c->connecting && c->born_ns > best->born_ns))
            best = c;
    }
    return (conn *)best; /* the table is the lane's own */
}

/* ---- sending -------------------------------------------------------------------- */

/* Appends bytes to c's queue: within LANE_TXQ_MAX, or one message of
 * max_message bytes (with its header) when that is more. */
static int enqueue(const lane *l, conn *c, const void *data, size_t len)
{
    if (c->tx_len + len > l->txq_max) return kvcr_fail(KVCR_ESYS, "queue full");
    if (c->tx_head > 0 && c->tx_head + c->tx_len + len > c->tx_cap) {
        memmove(c->tx, c->tx + c->tx_head, c->tx_len);
        c->tx_head = 0;
    }
    if (c->tx_len + len > c->tx_cap) {
        size_t cap = c->tx_cap ? c->tx_cap : RX_MIN;
        while (cap < c->tx_len + len) cap *= 2;
        uint8_t *tx = realloc(c->tx, cap);
        if (tx == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
        c->tx = tx;
        c->tx_cap = cap;
    }
    memcpy(c->tx + c->tx_head + c->tx_len, data, len);
    c->tx_len += len;
    return 0;
}

/* Sends what waits, without blocking. -1 when the connection failed. */
static int flush(lane *l, conn *c)
{
    while (c->tx_len > 0) {
        ssize_t n = send(c->fd, c->tx + c->tx_head, c->tx_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) return -1;
        c->tx_head += (size_t)n;
        c->tx_len -= (size_t)n;
    }
    if (c->tx_len == 0) c->tx_head = 0;
    want_out(l, c);
    return 0;
}

/* One frame onto c: sent at once when nothing waits before it, queued
 * otherwise (or for what the socket did not take). */
static int put_frame(lane *l, conn *c, const void *data, size_t len)
{
    uint8_t hdr[LANE_HEADER];
    put32be(hdr, (uint32_t)len);
    size_t sent = 0;
    bool hold = l->cork && !c->connecting;
    if (!l->cork && !c->connecting && c->tx_len == 0) {
        struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)data, len}};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t n;
        do n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return kvcr_fail(KVCR_ESYS, "%s", strerror(errno));
        sent = n > 0 ? (size_t)n : 0;
    }
    int rc = 0;
    if (sent < sizeof hdr) rc = enqueue(l, c, hdr + sent, sizeof hdr - sent);
    size_t off = sent > sizeof hdr ? sent - sizeof hdr : 0;
    if (rc == 0 && off < len) rc = enqueue(l, c, (const uint8_t *)data + off, len - off);
    if (rc == 0 && hold && !c->corked) {
        c->corked = true;
        l->corked[l->n_corked++] = (uint32_t)(c - l->conns);
    } else if (rc == 0 && !hold) {
        want_out(l, c);
    }
    return rc;
}

void lane_cork(lane *l)
{
    l->cork = true;
}

/* A slot closed while corked (and perhaps taken again) is flushed like any
 * other: flush sends whatever its connection has, if anything. */
void lane_uncork(lane *l)
{
    l->cork = false;
    for (uint32_t i = 0; i < l->n_corked; i++) {
        conn *c = &l->conns[l->corked[i]];
        c->corked = false;
        if (c->fd >= 0 && !c->connecting && flush(l, c) != 0) close_conn(l, c, strerror(errno));
    }
    l->n_corked = 0;
}

/* A non-blocking socket connecting to ss (*made: connected already); -1
 * with the reason (KVCR_EREFUSED when the peer refused at once). */
static int connect_to(const struct sockaddr_storage *ss, socklen_t sl, const char *name,
                      bool *made)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return kvcr_fail(KVCR_ESYS, "lane socket: %s", strerror(errno));
    int rc = tune(fd);
    /* The handshake's last ACK waits for our first bytes (the hello, sent
     * as soon as the dial is made): the peer accepts and reads in one
     * packet and one wake-up (docs/BENCHMARKS.md, "First contact"). An
     * optimisation only, so a kernel without it changes nothing else. */
    int one = 1;
    if (rc == 0) (void)setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &one, sizeof one);
    *made = rc == 0 && connect(fd, (const struct sockaddr *)ss, sl) == 0;
    if (rc == 0 && !*made && errno != EINPROGRESS) rc = -1;
    if (rc != 0) {
        rc = kvcr_fail(errno == ECONNREFUSED ? KVCR_EREFUSED : KVCR_ESYS,
                       "lane: cannot dial %s: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    return fd;
}

static int dial(lane *l, const char *name, const char *ip, uint16_t port, conn **out)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (!lane_name_ok(name, strlen(name)) || !numeric_addr(ip, port, &ss, &sl) || port == 0)
        return kvcr_fail(KVCR_EINVAL, "lane: cannot dial %s at %s port %u", name, ip,
                         (unsigned)port);
    if (l->name[0] == '\0') return kvcr_fail(KVCR_EINVAL, "lane: no name set to announce");
    bool made;
    int rc, fd = connect_to(&ss, sl, name, &made);
    if (fd < 0) return fd;
    conn *c = take_slot(l, fd, true);
    if (c == NULL) {
        close(fd);
        return kvcr_fail(KVCR_ESYS, "lane: every connection busy");
    }
    snprintf(c->name, sizeof c->name, "%s", name);
    c->addr = ss;
    c->addr_len = sl;
    c->connecting = c->want_out = !made;
    if (watch(l, c, EPOLL_CTL_ADD) != 0 || put_frame(l, c, l->name, strlen(l->name)) != 0) {
        rc = kvcr_fail(KVCR_ESYS, "lane: cannot dial %s: %s", name, strerror(errno));
        close_conn(l, c, "dial failed");
        return rc;
    }
    LANE_DEBUG(l, "lane: dialling %s at %s port %u", name, ip, (unsigned)port);
    *out = c;
    return 0;
}

int lane_dial(lane *l, const char *name, const char *ip, uint16_t port)
{
    conn *c = find(l, name);
    return c ? 0 : dial(l, name, ip, port, &c);
}

int lane_send(lane *l, const char *name, const char *ip, uint16_t port, const void *data,
              size_t len)
{
    if (len == 0 || len > l->max_message || data == NULL)
        return kvcr_fail(KVCR_EINVAL, "lane: a message of %zu bytes (1..%zu)", len,
                         l->max_message);
    conn *c = find(l, name);
    int rc = c ? 0 : dial(l, name, ip, port, &c);
    if (rc == KVCR_EREFUSED && l->hooks.refused) {
        l->hooks.refused(l->hooks.ud, name, data, len);
        return 0;
    }
    if (rc != 0) return rc;
    c->used = ++l->tick;
    rc = put_frame(l, c, data, len);
    if (rc != 0) {
        char why[128];
        snprintf(why, sizeof why, "%s", kvcr_last_error());
        close_conn(l, c, why);
        rc = kvcr_fail(KVCR_ESYS, "lane send to %s failed: %s", name, why);
    }
    return rc;
}

bool lane_has(const lane *l, const char *name)
{
    return find(l, name) != NULL;
}

void lane_forget(lane *l, const char *name)
{
    for (conn *c; (c = find(l, name)) != NULL;) close_conn(l, c, "forgotten");
}

/* ---- receiving ------------------------------------------------------------------ */

/* A frame from c: the hello of an accepted connection, or a message. */
static void on_frame(lane *l, conn *c, const uint8_t *p, size_t n, lane_recv_cb *cb, void *ud)
{
    if (c->dialled || c->named) {
        cb(ud, p, n);
        return;
    }
    if (!lane_name_ok(p, n)) {
        refuse(l, c, "its first frame is not a name");
        return;
    }
    memcpy(c->name, p, n);
    c->name[n] = '\0';
    c->named = true;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    c->vouched = getpeername(c->fd, (struct sockaddr *)&ss, &sl) == 0 && l->hooks.vouch &&
                 l->hooks.vouch(l->hooks.ud, c->name, (struct sockaddr *)&ss, sl);
    LANE_DEBUG(l, "lane: %s connected%s", c->name,
               c->vouched ? "" : " (its name is not its address: no answers over it)");
}

/* The longest frame c may send now: a name until an accepted connection
 * has given one. */
static size_t frame_max(const lane *l, const conn *c)
{
    return c->dialled || c->named ? l->max_message : LANE_MAX_NAME;
}

/* Hands over c's complete frames, at most max; the count. */
static size_t deliver(lane *l, conn *c, size_t max, lane_recv_cb *cb, void *ud)
{
    size_t n = 0, off = 0;
    c->delivering = true;
    while (n < max && !c->doomed && c->fd >= 0) {
        const uint8_t *p;
        size_t plen;
        ptrdiff_t got = lane_frame(c->rx + off, c->rx_len - off, frame_max(l, c), &p, &plen);
        if (got == 0) break;
        if (got < 0) {
            refuse(l, c, c->dialled || c->named ? "a frame length outside 1..max_control_message_bytes" : "a first frame longer than a name");
            break;
        }
        off += (size_t)got;
        on_frame(l, c, p, plen, cb, ud);
        n++;
    }
    c->delivering = false;
    if (c->doomed) {
        c->doomed = false;
        release_slot(l, c);
    } else if (c->fd >= 0 && off > 0) {
        memmove(c->rx, c->rx + off, c->rx_len - off);
        c->rx_len -= off;
    }
    return n;
}

/* Room in c's receive buffer for the frame it is reading. */
static int rx_room(lane *l, conn *c)
{
    size_t need = RX_MIN;
    if (c->rx_len >= LANE_HEADER) {
        size_t n = get32be(c->rx);
        if (n > frame_max(l, c)) return 0; /* deliver refuses it */
        need = LANE_HEADER + n > need ? LANE_HEADER + n : need;
    }
    if (c->rx_cap >= need && c->rx_len < c->rx_cap) return 0;
    size_t cap = need > c->rx_cap ? need : 2 * c->rx_cap;
    uint8_t *rx = realloc(c->rx, cap);
    if (rx == NULL) return -1;
    c->rx = rx;
    c->rx_cap = cap;
    return 0;
}

/* Reads what c has; its frames wait in its buffer for deliver. */
static void readable(lane *l, conn *c)
{
    for (int i = 0; i < 16 && c->fd >= 0; i++) {
        if (rx_room(l, c) != 0) {
            close_conn(l, c, "out of memory");
            return;
        }
        const uint8_t *p;
        size_t plen;
        if (lane_frame(c->rx, c->rx_len, frame_max(l, c), &p, &plen) != 0) return;
        ssize_t n = recv(c->fd, c->rx + c->rx_len, c->rx_cap - c->rx_len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            if (!c->dialled && !c->named && (c->got_bytes || n < 0))
                refuse(l, c, "closed before it named itself");
            else
                close_conn(l, c, n == 0 ? "closed by the peer" : strerror(errno));
            return;
        }
        c->got_bytes = true;
        c->rx_len += (size_t)n;
    }
}

/* A dial the peer refused: closed, and every message queued on it (the
 * frames after the hello) handed to the refused hook. */
static void hand_back(lane *l, conn *c)
{
    char name[LANE_MAX_NAME + 1];
    memcpy(name, c->name, sizeof name);
    uint8_t *q = c->tx; /* the queue outlives the connection */
    size_t off = c->tx_head, end = c->tx_head + c->tx_len;
    c->tx = NULL;
    c->tx_head = c->tx_len = c->tx_cap = 0;
    close_conn(l, c, "refused");
    for (bool hello = true; off < end; hello = false) {
        const uint8_t *p;
        size_t n;
        ptrdiff_t got = lane_frame(q + off, end - off, SIZE_MAX, &p, &n);
        if (got <= 0) break;
        off += (size_t)got;
        if (!hello && l->hooks.refused) l->hooks.refused(l->hooks.ud, name, p, n);
    }
    free(q);
}

static void writable(lane *l, conn *c)
{
    if (c->connecting) {
        int err = 0;
        socklen_t sl = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) err = errno;
        if (err == ECONNREFUSED) {
            hand_back(l, c);
            return;
        }
        if (err != 0) {
            close_conn(l, c, strerror(err));
            return;
        }
        c->connecting = false;
    }
    if (flush(l, c) != 0) close_conn(l, c, strerror(errno));
}

static void accept_all(lane *l)
{
    for (int i = 0; i < 16; i++) {
        int fd = accept4(l->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        conn *c = tune(fd) == 0 ? take_slot(l, fd, false) : NULL;
        if (c == NULL)
            close(fd);
        else if (watch(l, c, EPOLL_CTL_ADD) != 0)
            close_conn(l, c, "cannot watch");
        else
            readable(l, c); /* a dialler's first bytes may be here with its handshake */
    }
}

/* A dial not made within LANE_CONNECT_MS (its SYN or the answer lost, or
 * the peer unreachable): dialled again with a new socket, keeping its
 * queue, whose messages never reached the wire. A lost SYN would otherwise
 * cost the first messages to a peer (the kernel tries again only after a
 * second), and a pull whose start_write never left knows no incarnation
 * to take proof of quiet from. */
static void redial(lane *l, conn *c, uint64_t now)
{
    bool made;
    int fd = connect_to(&c->addr, c->addr_len, c->name, &made);
    if (fd < 0) {
        close_conn(l, c, "cannot dial again");
        return;
    }
    close(c->fd);
    c->fd = fd;
    c->gen++; /* events of the old socket are stale */
    c->born_ns = now;
    c->connecting = !made;
    c->want_out = true; /* connecting, or the queue to send */
    if (watch(l, c, EPOLL_CTL_ADD) != 0) close_conn(l, c, "cannot watch");
}

/* Dials past LANE_CONNECT_MS, and silent accepted connections past
 * LANE_HELLO_MS. */
static void expire(lane *l, uint64_t now)
{
    for (size_t i = 0; i < l->top; i++) {
        conn *c = &l->conns[i];
        if (c->fd < 0) continue;
        if (c->connecting && now - c->born_ns > LANE_CONNECT_MS * MS)
            redial(l, c, now);
        else if (!c->dialled && !c->named && now - c->born_ns > LANE_HELLO_MS * MS)
            refuse(l, c, "no name in time");
    }
}

size_t lane_recv(lane *l, size_t max, lane_recv_cb *cb, void *ud)
{
    struct epoll_event evs[EVENTS];
    int got = epoll_wait(l->ep, evs, EVENTS, 0);
    size_t done = 0;
    for (int i = 0; i < got; i++) {
        uint32_t slot = (uint32_t)evs[i].data.u64, gen = (uint32_t)(evs[i].data.u64 >> 32);
        if (slot == LISTENER) {
            accept_all(l);
            done++;
            continue;
        }
        conn *c = &l->conns[slot];
        if (c->fd < 0 || c->gen != gen) continue; /* closed since: stale */
        if (evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) writable(l, c);
        if (c->fd >= 0 && (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) readable(l, c);
        done++;
    }
    /* Frames read now or left over by an earlier call (past max). */
    size_t msgs = 0;
    for (size_t i = 0; i < l->top && msgs < max; i++) {
        conn *c = &l->conns[i];
        if (c->fd >= 0 && c->rx_len >= LANE_HEADER) msgs += deliver(l, c, max - msgs, cb, ud);
    }
    expire(l, kvcr_now_ns());
    return done + msgs;
}

uint64_t lane_take_refused(lane *l, const char **why)
{
    uint64_t n = l->refused;
    *why = n ? l->refused_why : NULL;
    l->refused = 0;
    return n;
}

/* ---- the lane -------------------------------------------------------------------- */

int lane_open(const char *ip, size_t max_message, const lane_hooks *hooks,
              const kvcr_logger *log, lane **out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "lane_open: out is NULL");
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (ip == NULL || !numeric_addr(ip, 0, &ss, &sl))
        return kvcr_fail(KVCR_EINVAL, "control lane: '%s' is not a numeric IP address",
                         ip ? ip : "(null)");
    if (max_message == 0 || max_message > UINT32_MAX)
        return kvcr_fail(KVCR_EINVAL, "control lane: max_message must be 1..%u", UINT32_MAX);
    lane *l = calloc(1, sizeof *l);
    if (l == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < LANE_MAX_CONNS; i++) l->conns[i].fd = -1;
    l->max_message = max_message;
    size_t one_message = max_message + 2 * LANE_HEADER + LANE_MAX_NAME; /* and a hello */
    l->txq_max = one_message > LANE_TXQ_MAX ? one_message : LANE_TXQ_MAX;
    if (hooks) l->hooks = *hooks;
    l->log = log;
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    l->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = LISTENER};
    if (l->ep < 0 || l->listen_fd < 0 ||
        setsockopt(l->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(l->listen_fd, (struct sockaddr *)&ss, sl) != 0 || listen(l->listen_fd, 128) != 0 ||
        getsockname(l->listen_fd, (struct sockaddr *)&ss, &sl) != 0 ||
        epoll_ctl(l->ep, EPOLL_CTL_ADD, l->listen_fd, &ev) != 0) {
        int rc = kvcr_fail(KVCR_ESYS, "control lane: cannot listen on %s: %s", ip, strerror(errno));
        lane_close(l);
        return rc;
    }
    l->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    LANE_DEBUG(l, "lane: listening on %s port %u", ip, (unsigned)l->port);
    *out = l;
    return 0;
}

void lane_close(lane *l)
{
    if (l == NULL) return;
    for (size_t i = 0; i < LANE_MAX_CONNS; i++) {
        conn *c = &l->conns[i];
        if (c->fd >= 0) close(c->fd);
        free_buffers(c);
    }
    if (l->listen_fd >= 0) close(l->listen_fd);
    if (l->ep >= 0) close(l->ep);
    free(l);
}

uint16_t lane_port(const lane *l)
{
    return l->port;
}

int lane_set_name(lane *l, const char *name)
{
    if (name == NULL || !lane_name_ok(name, strlen(name)))
        return kvcr_fail(KVCR_EINVAL, "lane: a name is 1..%d printable characters", LANE_MAX_NAME);
    snprintf(l->name, sizeof l->name, "%s", name);
    return 0;
}

int lane_fd(const lane *l)
{
    return l->ep;
}
