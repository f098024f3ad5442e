/* Shared pieces of the `kvcr` benchmarks: timing and result lines. */
#ifndef KVCR_TOOLS_BENCH_H
#define KVCR_TOOLS_BENCH_H

#include <stdbool.h>

typedef struct bench_out {
    const char *bench; /* "local", ... */
    bool json;
} bench_out;

double bench_now(void);

/* One figure. baseline NULL: no baseline was measured. goal: text or NULL. */
void bench_report(const bench_out *o, const char *name, double value, const char *unit,
                  const char *baseline, double baseline_value, bool higher_is_better,
                  const char *goal);

/* Exits 1 with the library's message when rc is an error. */
void bench_check(int rc, const char *what);

int bench_local(int argc, char **argv);

#endif
