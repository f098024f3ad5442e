/* `kvcr service`: the node daemon that owns KVCR DRAM pools so that cached
 * blocks outlive an engine crash. One Guard per pool group (guard.h); a
 * Unix claim socket (frame.h) on which engines claim a group, release it,
 * and anyone asks for metrics; optionally the same metrics over HTTP
 * (metrics_http.h). One thread runs it all: the sockets, the claims, the
 * owners' pidfds, the journals and the serving instances' bookkeeping (their
 * transfers run on their own progress threads).
 *
 * The metrics are Prometheus text (format 0.0.4) that `promtool check
 * metrics` accepts: every family has HELP and TYPE, counters end in _total. */
#ifndef KVCR_SERVICE_SERVICE_H
#define KVCR_SERVICE_SERVICE_H

#include <signal.h>
#include <stdint.h>

#include "kvcr/kvcr.h"
#include "util/log.h"

#define SVC_DEFAULT_JOURNAL_BYTES (64ull << 20)

typedef struct svc_options {
    const char *socket_path;     /* its parent directory must exist */
    const char *pool_dir;        /* an existing directory, normally on /dev/shm */
    const char *digest;          /* compared byte for byte with every claim */
    uint32_t guard_count;        /* >= 1 */
    uint32_t n_pools;            /* pools per group, 1 .. KVCR_MAX_POOLS */
    uint64_t pool_bytes[KVCR_MAX_POOLS]; /* each a positive multiple of the page size */
    uint64_t journal_bytes;      /* per group; default SVC_DEFAULT_JOURNAL_BYTES */
    const char *metrics_listen;  /* HOST:PORT serving GET /metrics over HTTP, or NULL */
} svc_options;

/* Runs the service until *stop becomes non-zero (a signal handler sets it)
 * or it cannot continue. 0 after a clean shutdown (pool files removed,
 * socket unlinked); a negative KVCR_E* with kvcr_last_error() when it could
 * not start. */
int svc_serve(const svc_options *o, const kvcr_logger *log, volatile sig_atomic_t *stop);

/* `kvcr stats --socket P`: asks a running service for its metrics
 * (Prometheus text format) into a malloc'd string. */
int svc_fetch_metrics(const char *socket_path, char **text);

#endif
