/* Shared pieces of the benchmarks (kvcr-bench, a program of the build tree,
 * never installed): timing, error checks and the result lines every case
 * prints the same way. */
#ifndef KVCR_BENCH_BENCH_H
#define KVCR_BENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"
#include "tool_util.h" /* tool_now, whole reads and writes, the "k<i>" key adapter */

typedef struct bench_out {
    const char *bench; /* "local", ... */
    bool json;
    bool header_done;  /* the human table's header is printed once */
} bench_out;

/* One figure. Units are exactly "ns", "GB/s", "B" or "s". */
typedef struct bench_figure {
    const char *name;       /* the case, e.g. "query_1m" */
    double value;
    const char *unit;
    const char *baseline;   /* NULL: no baseline was measured in this run */
    double baseline_value;  /* in the figure's unit */
    bool lower_is_better;   /* a latency: the ratio is then baseline / value */
    const char *goal;       /* NULL: none */
} bench_figure;

/* Page-aligned memory (exits 1 without it). */
void *bench_xalloc(size_t size);
/* 10^9 bytes per second. */
double bench_gbs(uint64_t bytes, double seconds);
/* Sorts v[0..n) ascending (n > 0) and returns its middle value, the upper
 * of the two middle ones when n is even. */
double bench_median(double *v, size_t n);
/* A block's bytes from its seed, the same in every process, and the check. */
void bench_fill_block(uint8_t *p, size_t len, uint64_t seed);
bool bench_has_block(const uint8_t *p, size_t len, uint64_t seed);

/* Prints a figure: a table row, or with --json one object per line whose
 * ratio (when a baseline exists) is always "higher is better". */
void bench_report(bench_out *o, const bench_figure *f);

/* Polls kv until op completes, sleeping on fd (its kvcr_fd) in between so
 * that the copy threads keep the CPUs, for at most limit_s seconds; each of
 * its n entries must be a success, or the bench fails with a message that
 * starts with what. Results of other operations are dropped. Returns the
 * poll's results (for kvcr_results_free) with *mine, unless mine is NULL,
 * at op's. */
kvcr_op_result *bench_wait_op(kvcr_t *kv, int fd, kvcr_op_handle op, size_t n, const char *what,
                              double limit_s, const kvcr_op_result **mine);

/* handler for SIGINT, SIGTERM and SIGHUP (a bench's clean-up on ^C, kill
 * or a closed terminal). */
void bench_trap_signals(void (*handler)(int));

/* The `kvcr` program the benches start `kvcr service` from: $KVCR_TOOL,
 * else the one of this build tree. */
const char *bench_kvcr_tool(void);

/* Exits 1 with the library's message when rc is an error. */
void bench_check(int rc, const char *what);

/* Exits 1 after printing what failed; for checks the library cannot make. */
_Noreturn void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parses the options every benchmark takes ([--json] [--quick]) into *o
 * and *quick; prints the usage of `kvcr-bench <o->bench>` and returns
 * false on anything else. */
bool bench_options(int argc, char **argv, bench_out *o, bool *quick);

/* The median round trip of a 64-byte message between two processes on
 * loopback over raw ZeroMQ PUSH/PULL sockets (bench/bench_zmq.c), in
 * seconds, over `rounds` rounds after a warm-up. */
double bench_zmq_round_trip_s(int rounds);

int bench_local(int argc, char **argv);
int bench_peer(int argc, char **argv);
int bench_g3(int argc, char **argv);
int bench_service(int argc, char **argv);

#endif
