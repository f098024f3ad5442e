/* The service's metrics over HTTP (`kvcr service --metrics-listen`): a
 * small HTTP/1.1 responder for `GET /metrics`, driven by the service's
 * one-thread poll loop, so that a Prometheus server scrapes the daemon.
 *
 * One request per connection, answered, then closed (`Connection: close`):
 * no keep-alive or pipelining state. What a client can make it hold is
 * bounded: SVC_HTTP_MAX_CONNS connections (one more is answered 503 and
 * closed), a request head of SVC_HTTP_MAX_HEAD bytes (431 past it) that must
 * arrive within SVC_HTTP_HEAD_MS (408, closed), and SVC_HTTP_REPLY_MS to take
 * the answer. Parsing is strict: lines end in CRLF, the request line is
 * `METHOD SP /target SP HTTP/1.0|HTTP/1.1`, header lines are `name: value`
 * with a token name, an HTTP/1.1 request has exactly one Host; anything else
 * is 400 and answered as soon as it is seen. /metrics (a query is ignored)
 * answers GET and HEAD with 200 and Content-Type `text/plain; version=0.0.4`;
 * another method gets 405, another path 404. Request bodies are not read.
 *
 * Every answer is counted by status (svc_http_counts, rendered in the
 * service's metrics). A malformed request (400, 431) logs one warning at most
 * every SVC_HTTP_LOG_EVERY_S seconds, with how many came since the last one;
 * nothing else is logged per request.
 *
 * Not thread-safe: only the service loop's thread calls these. */
#ifndef KVCR_SERVICE_METRICS_HTTP_H
#define KVCR_SERVICE_METRICS_HTTP_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

#define SVC_HTTP_MAX_CONNS 16
#define SVC_HTTP_MAX_HEAD 8192
#define SVC_HTTP_HEAD_MS 5000
#define SVC_HTTP_REPLY_MS 10000
#define SVC_HTTP_LOG_EVERY_S 60
#define SVC_HTTP_POLLFDS (1 + SVC_HTTP_MAX_CONNS) /* the most svc_http_pollfds writes */

typedef struct svc_http svc_http;

/* The body of a 200: a malloc'd NUL-terminated text (released by the
 * listener), or NULL when it cannot be made (the answer is then 500). */
typedef char *(*svc_http_body)(const void *arg);

/* Listens on "HOST:PORT": HOST a name or a numeric address (an IPv6 one in
 * brackets; empty: every interface), PORT 0..65535 (0: the kernel picks
 * one). Logs the address it listens on at info level. */
int svc_http_listen(const char *host_port, const kvcr_logger *log, svc_http **out);

/* Closes the listener and every connection. NULL is fine. */
void svc_http_close(svc_http *h);

/* Fills the poll entries of this turn (at most SVC_HTTP_POLLFDS); their number. */
size_t svc_http_pollfds(const svc_http *h, struct pollfd *pf);

/* After poll(): pf as svc_http_pollfds filled it, with revents. Reads,
 * answers, writes and closes what is ready or past its deadline; accepts. */
void svc_http_serve(svc_http *h, const struct pollfd *pf, svc_http_body body, const void *arg);

/* Answers by status since the start: n entries of {code, count} in *out
 * (owned by h, valid until its next call), every status it can answer. */
typedef struct svc_http_count {
    int code;
    uint64_t n;
} svc_http_count;
size_t svc_http_counts(const svc_http *h, const svc_http_count **out);

#endif
