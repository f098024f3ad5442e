/* The `kvcr` command: benchmarks now; demo, service and stats arrive with
 * their tiers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvcr/kvcr.h"

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void bench_check(int rc, const char *what)
{
    if (rc == 0) return;
    fprintf(stderr, "kvcr: %s failed: %s: %s\n", what, kvcr_strerror(rc), kvcr_last_error());
    exit(1);
}

void bench_report(const bench_out *o, const char *name, double value, const char *unit,
                  const char *baseline, double baseline_value, bool higher_is_better,
                  const char *goal)
{
    double ratio = 0;
    if (baseline)
        ratio = higher_is_better ? value / baseline_value : baseline_value / value;
    if (o->json) {
        printf("{\"bench\":\"%s\",\"case\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"", o->bench, name,
               value, unit);
        if (baseline)
            printf(",\"baseline\":\"%s\",\"baseline_value\":%.6g,\"ratio\":%.4g", baseline,
                   baseline_value, ratio);
        printf("}\n");
    } else {
        printf("%-28s %12.2f %-5s", name, value, unit);
        if (baseline) printf("  %s %10.2f  ratio %.2f", baseline, baseline_value, ratio);
        if (goal) printf("  (goal %s)", goal);
        printf("\n");
    }
    fflush(stdout);
}

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

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

static const command benches[] = {
    {"local", bench_local, "query latency, deposit/deliver bandwidth vs memcpy, metadata size"},
    {"python", bench_python, "query and poll_completed cost from Python (needs the package)"},
};

static int usage(FILE *f)
{
    fprintf(f, "usage: kvcr <command> [options]\n\n"
               "commands:\n"
               "  bench <case> [--json] [--quick]   run a benchmark\n"
               "  version                           print the library version\n"
               "  help                              this text\n\nbenchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(f, "  %-8s %s\n", benches[i].name, benches[i].help);
    return f == stderr ? 2 : 0;
}

static int run_bench(int argc, char **argv)
{
    if (argc < 1) return usage(stderr);
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (strcmp(argv[0], benches[i].name) == 0) return benches[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvcr: unknown benchmark '%s'\n", argv[0]);
    return usage(stderr);
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage(stderr);
    if (strcmp(argv[1], "bench") == 0) return run_bench(argc - 2, argv + 2);
    if (strcmp(argv[1], "version") == 0) {
        printf("kvcr %s\n", kvcr_version_string());
        return 0;
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout);
    fprintf(stderr, "kvcr: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
