/* The metrics listener: accept, read a request head line by line, answer,
 * write the answer across poll turns, close.
 *
 * A connection goes READ -> WRITE -> LINGER -> closed. LINGER exists because
 * closing a socket that still has unread input makes the kernel send a reset,
 * which can destroy an answer the client has not read yet (a 431 to a client
 * still sending, a request with a body): after the answer is written the
 * write side is shut and input is drained until the client closes, for at
 * most SVC_HTTP_LINGER_MS. */
#define _GNU_SOURCE /* accept4 */
#include "daemon/metrics_http.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "util/clock.h"

#define SVC_HTTP_LINGER_MS 1000
#define ACCEPTS_PER_TURN 16
#define NS_PER_MS 1000000ull

enum hstate { H_READ, H_WRITE, H_LINGER };

typedef struct hconn {
    int fd;
    enum hstate state;
    uint64_t deadline_ns;
    size_t got, parsed;     /* bytes read; bytes of the whole lines checked */
    bool have_request_line; /* what the request line said: */
    bool http11, get, head, metrics_path;
    int hosts;              /* Host header lines */
    char *out;              /* the answer being written */
    size_t out_len, out_off;
    char in[SVC_HTTP_MAX_HEAD];
} hconn;

static const int statuses[] = {200, 400, 404, 405, 408, 431, 500, 503};
#define N_STATUSES (sizeof statuses / sizeof statuses[0])

struct svc_http {
    int fd;
    const kvcr_logger *log;
    hconn *conns[SVC_HTTP_MAX_CONNS];
    unsigned n_conns;
    svc_http_count counts[N_STATUSES];
    uint64_t malformed_unlogged, last_log_ns;
};

/* ---- listening ------------------------------------------------------------------------ */

#define ADDR_RULE "--metrics-listen must be HOST:PORT (an IPv6 address in brackets), PORT 0..65535"

/* "host:port", "[v6]:port" or ":port" into its parts. */
static int split_address(const char *hp, char *host, size_t host_cap, char *port)
{
    const char *colon = hp ? strrchr(hp, ':') : NULL;
    if (colon == NULL) return kvcr_fail(KVCR_EINVAL, ADDR_RULE);
    const char *h = hp;
    size_t n = (size_t)(colon - hp);
    if (n > 0 && h[0] == '[') {
        if (n < 3 || h[n - 1] != ']') return kvcr_fail(KVCR_EINVAL, ADDR_RULE);
        h++, n -= 2;
    } else if (memchr(h, ':', n) != NULL) {
        return kvcr_fail(KVCR_EINVAL, ADDR_RULE);
    }
    size_t p = strlen(colon + 1);
    if (n >= host_cap || p < 1 || p > 5 || strspn(colon + 1, "0123456789") != p ||
        atol(colon + 1) > 65535)
        return kvcr_fail(KVCR_EINVAL, ADDR_RULE);
    memcpy(host, h, n);
    host[n] = '\0';
    memcpy(port, colon + 1, p + 1);
    return 0;
}

static int bind_first(const struct addrinfo *list)
{
    int err = 0;
    for (const struct addrinfo *a = list; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1; /* a restarted service rebinds while old connections sit in TIME_WAIT */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0)
            return fd;
        err = errno;
        close(fd);
    }
    errno = err;
    return -1;
}

/* The start-up line: where to scrape (the port the kernel picked for 0). */
static void log_address(const svc_http *h)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char host[NI_MAXHOST], port[NI_MAXSERV];
    if (getsockname(h->fd, (struct sockaddr *)&sa, &len) != 0 ||
        getnameinfo((struct sockaddr *)&sa, len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return;
    bool v6 = sa.ss_family == AF_INET6;
    kvcr_log(h->log, KVCR_LOG_INFO, "KVCR service metrics at http://%s%s%s:%s/metrics",
             v6 ? "[" : "", host, v6 ? "]" : "", port);
}

int svc_http_listen(const char *host_port, const kvcr_logger *log, svc_http **out)
{
    char host[NI_MAXHOST], port[8];
    int rc = split_address(host_port, host, sizeof host, port);
    if (rc != 0) return rc;
    struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_NUMERICSERV, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &list);
    if (gai != 0)
        return kvcr_fail(KVCR_EINVAL, "--metrics-listen %s: %s", host_port, gai_strerror(gai));
    int fd = bind_first(list);
    int err = errno;
    freeaddrinfo(list);
    if (fd < 0)
        return kvcr_fail(KVCR_ESYS, "cannot listen for metrics on %s: %s", host_port,
                         strerror(err));
    svc_http *h = calloc(1, sizeof *h);
    if (h == NULL) {
        close(fd);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    h->fd = fd;
    h->log = log;
    for (size_t i = 0; i < N_STATUSES; i++) h->counts[i].code = statuses[i];
    log_address(h);
    *out = h;
    return 0;
}

static void close_conn(svc_http *h, unsigned i)
{
    hconn *c = h->conns[i];
    close(c->fd);
    free(c->out);
    free(c);
    h->conns[i] = h->conns[--h->n_conns];
}

void svc_http_close(svc_http *h)
{
    if (h == NULL) return;
    while (h->n_conns > 0) close_conn(h, h->n_conns - 1);
    close(h->fd);
    free(h);
}

size_t svc_http_counts(const svc_http *h, const svc_http_count **out)
{
    *out = h->counts;
    return N_STATUSES;
}

/* ---- answers -------------------------------------------------------------------------- */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

static void count(svc_http *h, int status)
{
    for (size_t i = 0; i < N_STATUSES; i++)
        if (h->counts[i].code == status) h->counts[i].n++;
}

/* A whole answer; a 200 carries the metrics (without them for HEAD), the
 * others their reason. NULL when out of memory. */
static char *answer(int status, const char *metrics, bool head, size_t *len)
{
    char fallback[64];
    snprintf(fallback, sizeof fallback, "%s\n", reason(status));
    const char *body = status == 200 ? metrics : fallback;
    char *out = NULL;
    int n = asprintf(&out,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "%sConnection: close\r\n\r\n%s",
                     status, reason(status),
                     status == 200 ? "text/plain; version=0.0.4" : "text/plain; charset=utf-8",
                     strlen(body), status == 405 ? "Allow: GET, HEAD\r\n" : "",
                     head ? "" : body);
    if (n < 0) return NULL;
    *len = (size_t)n;
    return out;
}

/* Answers a connection that gets nothing else (over the bound, too slow):
 * one try, without waiting; the caller closes it. */
static void answer_once(svc_http *h, int fd, int status)
{
    count(h, status);
    size_t len;
    char *out = answer(status, NULL, false, &len);
    if (out != NULL) send(fd, out, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(out);
}

static void note_malformed(svc_http *h, int status)
{
    uint64_t now = kvcr_now_ns();
    h->malformed_unlogged++;
    uint64_t every = SVC_HTTP_LOG_EVERY_S * 1000 * NS_PER_MS;
    if (h->last_log_ns != 0 && now - h->last_log_ns < every) return;
    kvcr_log(h->log, KVCR_LOG_WARN, "metrics listener: %llu malformed request(s) since the last "
             "such line, the last one answered %d (a line a minute at most; every one is "
             "counted in kvcr_service_http_requests_total)",
             (unsigned long long)h->malformed_unlogged, status);
    h->malformed_unlogged = 0;
    h->last_log_ns = now;
}

/* Writes what the socket takes; false when the connection is done with. */
static bool write_some(hconn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    shutdown(c->fd, SHUT_WR);
    c->state = H_LINGER;
    uint64_t linger = kvcr_now_ns() + SVC_HTTP_LINGER_MS * NS_PER_MS;
    if (linger < c->deadline_ns) c->deadline_ns = linger;
    return true;
}

static bool respond(svc_http *h, hconn *c, int status, svc_http_body body, const void *arg)
{
    char *metrics = status == 200 ? body(arg) : NULL;
    if (status == 200 && metrics == NULL) status = 500;
    count(h, status);
    if (status == 400 || status == 431) note_malformed(h, status);
    c->out = answer(status, metrics, c->head, &c->out_len);
    free(metrics);
    if (c->out == NULL) return false;
    c->state = H_WRITE;
    c->deadline_ns = kvcr_now_ns() + SVC_HTTP_REPLY_MS * NS_PER_MS;
    return write_some(c);
}

/* ---- requests ------------------------------------------------------------------------- */

/* Length of the token (RFC 9110 tchar) that starts l. */
static size_t token_len(const char *l, size_t n)
{
    size_t i = 0;
    while (i < n && l[i] > 0x20 && l[i] < 0x7f && !strchr("\"(),/:;<=>?@[\\]{}", l[i])) i++;
    return i;
}

static bool is_word(const char *l, size_t n, const char *word)
{
    return n == strlen(word) && memcmp(l, word, n) == 0;
}

/* METHOD SP /target SP HTTP/1.x, nothing more. */
static bool request_line(hconn *c, const char *l, size_t n)
{
    size_t m = token_len(l, n);
    if (m == 0 || m >= n || l[m] != ' ') return false;
    c->get = is_word(l, m, "GET");
    c->head = is_word(l, m, "HEAD");
    const char *t = l + m + 1, *end = l + n;
    const char *sp = memchr(t, ' ', (size_t)(end - t));
    if (sp == NULL || t[0] != '/') return false;
    for (const char *p = t; p < sp; p++)
        if (*p <= 0x20 || *p >= 0x7f) return false;
    const char *v = sp + 1;
    if (end - v != 8 || memcmp(v, "HTTP/1.", 7) != 0 || (v[7] != '0' && v[7] != '1'))
        return false;
    c->http11 = v[7] == '1';
    const char *q = memchr(t, '?', (size_t)(sp - t));
    c->metrics_path = is_word(t, (size_t)((q ? q : sp) - t), "/metrics");
    return true;
}

/* name: value, the name a token, the value without control characters. */
static bool header_line(hconn *c, const char *l, size_t n)
{
    size_t m = token_len(l, n);
    if (m == 0 || m >= n || l[m] != ':') return false;
    for (size_t i = m + 1; i < n; i++) {
        unsigned char ch = (unsigned char)l[i];
        if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return false;
    }
    if (m == 4 && strncasecmp(l, "host", 4) == 0) c->hosts++;
    return true;
}

static int route(const hconn *c)
{
    if (c->hosts > 1 || (c->http11 && c->hosts != 1)) return 400;
    if (!c->metrics_path) return 404;
    return c->get || c->head ? 200 : 405;
}

/* Checks the whole lines read so far: the status once it is decided (an
 * empty line ends the head; a bad line decides 400), else 0. */
static int scan_lines(hconn *c)
{
    const char *nl;
    while ((nl = memchr(c->in + c->parsed, '\n', c->got - c->parsed)) != NULL) {
        size_t end = (size_t)(nl - c->in);
        if (end == c->parsed || c->in[end - 1] != '\r') return 400; /* a bare LF */
        const char *line = c->in + c->parsed;
        size_t len = end - 1 - c->parsed;
        c->parsed = end + 1;
        if (!c->have_request_line) {
            if (!request_line(c, line, len)) return 400;
            c->have_request_line = true;
        } else if (len == 0) {
            return route(c);
        } else if (!header_line(c, line, len)) {
            return 400;
        }
    }
    return c->got == sizeof c->in ? 431 : 0;
}

/* Reads what came; false when the connection is done with. */
static bool read_some(svc_http *h, hconn *c, svc_http_body body, const void *arg)
{
    ssize_t n = recv(c->fd, c->in + c->got, sizeof c->in - c->got, MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false; /* the client left before its request was whole */
    c->got += (size_t)n;
    int status = scan_lines(c);
    return status == 0 || respond(h, c, status, body, arg);
}

/* Discards input until the client closes; false when it has. */
static bool drain(hconn *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->in, sizeof c->in, MSG_DONTWAIT);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        if (n == 0) return false;
    }
}

/* ---- the loop's turn ------------------------------------------------------------------ */

size_t svc_http_pollfds(const svc_http *h, struct pollfd *pf)
{
    pf[0] = (struct pollfd){.fd = h->fd, .events = POLLIN};
    for (unsigned i = 0; i < h->n_conns; i++)
        pf[1 + i] = (struct pollfd){.fd = h->conns[i]->fd,
                                    .events = h->conns[i]->state == H_WRITE ? POLLOUT : POLLIN};
    return 1 + h->n_conns;
}

static bool on_event(svc_http *h, hconn *c, short ev, svc_http_body body, const void *arg)
{
    if (!(ev & (POLLIN | POLLOUT | POLLHUP | POLLERR))) return true;
    switch (c->state) {
    case H_READ: return read_some(h, c, body, arg);
    case H_WRITE: return write_some(c);
    default: return drain(c);
    }
}

static void accept_conns(svc_http *h)
{
    for (int i = 0; i < ACCEPTS_PER_TURN; i++) {
        int fd = accept4(h->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return;
        hconn *c = h->n_conns < SVC_HTTP_MAX_CONNS ? calloc(1, sizeof *c) : NULL;
        if (c == NULL) {
            answer_once(h, fd, 503);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->deadline_ns = kvcr_now_ns() + SVC_HTTP_HEAD_MS * NS_PER_MS;
        h->conns[h->n_conns++] = c;
    }
}

void svc_http_serve(svc_http *h, const struct pollfd *pf, svc_http_body body, const void *arg)
{
    /* Backwards: closing i moves the last connection, already seen, into i. */
    for (unsigned i = h->n_conns; i-- > 0;) {
        hconn *c = h->conns[i];
        bool keep = on_event(h, c, pf[1 + i].revents, body, arg);
        if (keep && kvcr_now_ns() > c->deadline_ns) {
            if (c->state == H_READ) answer_once(h, c->fd, 408); /* too slow to ask */
            keep = false;
        }
        if (!keep) close_conn(h, i);
    }
    if (pf[0].revents & POLLIN) accept_conns(h);
}
