/* kvcr-bench: the benchmarks, a program of the build tree that is never
 * installed (`kvcr` is what a user runs). Each case is a row of one table,
 * so a tier's bench is one line when it arrives. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvcr/kvcr.h"

/* ---- shared benchmark pieces (bench.h) ----------------------------------- */

void *bench_xalloc(size_t size)
{
    void *p = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
    if (p == NULL) bench_fail("out of memory (%zu bytes)", size);
    return p;
}

double bench_gbs(uint64_t bytes, double seconds)
{
    return (double)bytes / seconds / 1e9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, by_value);
    return v[n / 2];
}

void bench_fill_block(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t *w = (uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++) w[i] = seed * 0x9E3779B97F4A7C15ull + i;
}

bool bench_has_block(const uint8_t *p, size_t len, uint64_t seed)
{
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != seed * 0x9E3779B97F4A7C15ull + i) return false;
    return true;
}

kvcr_op_result *bench_wait_op(kvcr_t *kv, int fd, kvcr_op_handle op, size_t n, const char *what,
                              double limit_s, const kvcr_op_result **mine)
{
    double until = tool_now() + limit_s;
    for (;;) {
        kvcr_op_result *res;
        size_t n_res;
        bench_check(kvcr_poll(kv, &res, &n_res), "kvcr_poll");
        for (size_t i = 0; i < n_res; i++) {
            if (res[i].op != op) continue;
            if (res[i].n_entries != n)
                bench_fail("%s: %zu entries answered for %zu blocks", what, res[i].n_entries, n);
            for (size_t j = 0; j < n; j++) {
                const kvcr_entry_result *e = &res[i].entries[j];
                if (e->status != KVCR_ENTRY_SUCCESS)
                    bench_fail("%s: entry %zu of %zu is %s (%s)", what, j, n,
                               kvcr_entry_status_name(e->status), kvcr_reason_name(e->reason));
            }
            if (mine) *mine = &res[i];
            return res;
        }
        kvcr_results_free(res);
        double left = until - tool_now();
        if (left <= 0) bench_fail("%s did not complete within %.0f s", what, limit_s);
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
}

const char *bench_kvcr_tool(void)
{
    const char *tool = getenv("KVCR_TOOL");
    return tool != NULL ? tool : KVCR_TOOL;
}

void bench_trap_signals(void (*handler)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

void bench_check(int rc, const char *what)
{
    if (rc == 0) return;
    fprintf(stderr, "kvcr: %s failed: %s: %s\n", what, kvcr_strerror(rc), kvcr_last_error());
    exit(1);
}

_Noreturn void bench_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvcr: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

bool bench_options(int argc, char **argv, bench_out *o, bool *quick)
{
    *quick = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            *quick = true;
        } else {
            fprintf(stderr, "kvcr: unknown option '%s'\nusage: kvcr-bench %s [--json] [--quick]\n",
                    argv[i], o->bench);
            return false;
        }
    }
    return true;
}

void bench_report(bench_out *o, const bench_figure *f)
{
    double ratio = 0;
    if (f->baseline)
        ratio = f->lower_is_better ? f->baseline_value / f->value : f->value / f->baseline_value;
    if (o->json) {
        printf("{\"bench\":\"%s\",\"case\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"", o->bench,
               f->name, f->value, f->unit);
        if (f->baseline)
            printf(",\"baseline\":\"%s\",\"baseline_value\":%.6g,\"ratio\":%.4g", f->baseline,
                   f->baseline_value, ratio);
        printf("}\n");
        fflush(stdout);
        return;
    }
    if (!o->header_done) {
        printf("%-18s %10s %-5s  %-19s %6s  %s\n", "case", "value", "unit", "baseline (this run)",
               "ratio", "goal");
        o->header_done = true;
    }
    char base[64] = "-", rat[16] = "-";
    if (f->baseline) {
        snprintf(base, sizeof base, "%s %.2f", f->baseline, f->baseline_value);
        snprintf(rat, sizeof rat, "%.2f", ratio);
    }
    printf("%-18s %10.2f %-5s  %-19s %6s  %s\n", f->name, f->value, f->unit, base, rat,
           f->goal ? f->goal : "-");
    fflush(stdout);
}

/* ---- cases --------------------------------------------------------------- */

/* The Python layer's costs are measured from Python itself. */
static int bench_python(int argc, char **argv)
{
    char *args[16] = {"python3", "-m", "kvcr.bench"};
    int n = 3;
    for (int i = 0; i < argc && n < 15; i++) args[n++] = argv[i];
    args[n] = NULL;
    execvp(args[0], args);
    fprintf(stderr, "kvcr: cannot run python3 -m kvcr.bench: %s\n", strerror(errno));
    return 1;
}

/* The anchors (the reference kvcr, NIXL, Mooncake's transfer engine) are
 * Python packages in a virtual environment of their own, beside this tree's
 * package on another interpreter: a Python driver runs both sides. */
static int bench_anchors(int argc, char **argv)
{
    const char *driver = getenv("KVCR_ANCHORS_DRIVER");
    if (driver == NULL) driver = KVCR_ANCHORS_DRIVER;
    /* The driver starts `kvcr service` for the Guard's case. */
    setenv("KVCR_TOOL", bench_kvcr_tool(), 1);
    char *args[16] = {"/usr/bin/python3", (char *)driver};
    int n = 2;
    for (int i = 0; i < argc && n < 15; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(args[0], args);
    fprintf(stderr, "kvcr: cannot run %s %s: %s\n", args[0], driver, strerror(errno));
    return 1;
}

static const tool_cmd benches[] = {
    {"local", bench_local, "[--json] [--quick]",
     "query latency, deposit/deliver bandwidth vs memcpy, metadata size"},
    {"peer", bench_peer, "[--json] [--quick] [--curve | --netns]",
     "peer-to-peer bandwidth vs raw UCX and Redis; --curve: CURVE's cost; --netns: across hosts"},
    {"g3", bench_g3, "[--json] [--quick]",
     "G3 disk bandwidth vs fio on the same file, spill, deliver, restart"},
    {"service", bench_service, "[--json] [--quick]",
     "KVCR service: first block served after an engine's SIGKILL, reattach of 100k blocks"},
    {"python", bench_python, "[--json] [--quick]",
     "query and poll_completed cost from Python (needs the package)"},
    {"anchors", bench_anchors, "[--json] [--quick] [--runs N]",
     "beside the reference kvcr, NIXL and Mooncake, alternating (scripts/anchors-env.sh)"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: kvcr-bench <case> [options]\n\ncases:\n");
    tool_cmd_list(f, benches, COUNT(benches));
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    const tool_cmd *c = tool_cmd_find(benches, COUNT(benches), argv[1]);
    if (c != NULL) return c->run(argc - 2, argv + 2);
    fprintf(stderr, "kvcr-bench: unknown benchmark '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
