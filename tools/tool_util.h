/* Plumbing shared by the `kvcr` tool (demo), the benchmarks (kvcr-bench,
 * bench/) and the tests (tests/support): the command tables of the two
 * programs, the monotonic clock, whole reads and writes on pipes, the
 * "k<i>" key adapter of their peers, CURVE keys (keygen.h) and
 * (tool_svc.c) the service's metrics. Built once as the kvcr_tool_util library (tools/CMakeLists.txt),
 * which both link; a program using tool_svc_* also links the daemon
 * (svc_fetch_metrics).
 *
 * Threads: no shared state; every function is safe from any thread. */
#ifndef KVCR_TOOLS_TOOL_UTIL_H
#define KVCR_TOOLS_TOOL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvcr/kvcr.h"

/* A row of a program's command table (`kvcr`, `kvcr-bench`): run gets the
 * arguments after the name. */
typedef struct tool_cmd {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *args;
    const char *help;
} tool_cmd;

/* Prints t's n rows, one a line: the name and its arguments, then the help. */
void tool_cmd_list(FILE *f, const tool_cmd *t, size_t n);

/* The row of t named name, or NULL. */
const tool_cmd *tool_cmd_find(const tool_cmd *t, size_t n, const char *name);

/* Seconds on a monotonic clock. */
double tool_now(void);

/* Reads exactly len bytes of fd, waiting for them until deadline (a
 * tool_now() time). 0, or -1 with errno: ETIMEDOUT, EPIPE (end of file
 * first), or poll's or read's own. EINTR and EAGAIN are retried. */
int tool_read_full(int fd, void *buf, size_t len, double deadline);

/* Writes all len bytes to fd (EINTR retried): 0 or -1 with errno. */
int tool_write_full(int fd, const void *buf, size_t len);

/* The key adapter (kvcr_callbacks.key_hash) of the benches' and tests'
 * peers: key "k<i>", i in decimal, has router hash i; any other key -1. */
int tool_key_hash(void *ud, const kvcr_key *key, uint64_t *hash);

/* Makes cfg a peer of the benches' and tests' transfers: the remote tier
 * on 127.0.0.1 (any port), keys by tool_key_hash. */
void tool_remote_peer(kvcr_config *cfg);

/* A sample in a Prometheus text, by its full name with labels: its value,
 * or -1 when it is absent. */
double tool_metric(const char *text, const char *name);

/* A sample of the service at sock, by its full name with labels: its value,
 * or -1 when it is absent or the service does not answer. */
double tool_svc_metric(const char *sock, const char *name);

/* Waits until Guard guard of the service at sock is serving and, when
 * promotions >= 0, has been promoted exactly that many times (polling every
 * 5 ms): its promotion count, or -1 after limit_s seconds. */
double tool_wait_serving(const char *sock, uint32_t guard, double promotions, double limit_s);

#endif
