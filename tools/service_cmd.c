#include "service_cmd.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kvcr/kvcr.h"
#include "daemon/service.h"
#include "util/log.h"

static const char service_usage[] =
    "usage: kvcr service --socket-path P --pool-dir D --guard-count N --pool-sizes-gb L\n"
    "                    --compatibility-digest S [--journal-mb M] [--log-level L]\n"
    "                    [--metrics-listen HOST:PORT]\n"
    "  --socket-path P           the claim socket (its directory must exist)\n"
    "  --pool-dir D              where pool files live (an existing directory, e.g. /dev/shm/kvcr)\n"
    "  --guard-count N           pool groups, one Guard each (>= 1)\n"
    "  --pool-sizes-gb L         comma-separated GiB per pool of every group, e.g. 48,16\n"
    "                            (each floored to the page size)\n"
    "  --compatibility-digest S  claims must present exactly this string\n"
    "  --journal-mb M            recovery journal per group, MiB (default 64)\n"
    "  --log-level L             error, warn, info, debug (default $KVCR_LOG_LEVEL, else info)\n"
    "  --metrics-listen H:P      also serve the metrics over HTTP at http://H:P/metrics, for a\n"
    "                            Prometheus server (an IPv6 H in brackets; port 0: any free\n"
    "                            port, named in the log)\n";

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* "48,16" -> bytes per pool, each floored to a page; false on any bad item. */
static bool parse_sizes(const char *list, svc_options *o)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const char *p = list;
    o->n_pools = 0;
    while (*p) {
        if (o->n_pools == KVCR_MAX_POOLS) return false;
        char *end;
        errno = 0;
        double gib = strtod(p, &end);
        if (end == p || errno != 0 || !isfinite(gib) || gib <= 0 || gib > 8.0e9) return false;
        uint64_t bytes = (uint64_t)(gib * 1073741824.0) / page * page;
        if (bytes == 0) return false;
        o->pool_bytes[o->n_pools++] = bytes;
        if (*end == '\0') break;
        if (*end != ',' || end[1] == '\0') return false;
        p = end + 1;
    }
    return o->n_pools > 0;
}

static bool parse_uint(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '-' || end == s || *end != '\0' || errno != 0 || v > max) return false;
    *out = v;
    return true;
}

static bool parse_level(const char *s, kvcr_log_level *level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, names[i]) == 0) {
            *level = (kvcr_log_level)i;
            return true;
        }
    if (strcasecmp(s, "warning") == 0) *level = KVCR_LOG_WARN;
    return strcasecmp(s, "warning") == 0;
}

static int usage_error(const char *what)
{
    fprintf(stderr, "kvcr service: %s\n\n%s", what, service_usage);
    return 2;
}

int cmd_service(int argc, char **argv)
{
    static const struct option opts[] = {
        {"socket-path", required_argument, NULL, 's'},
        {"pool-dir", required_argument, NULL, 'd'},
        {"guard-count", required_argument, NULL, 'g'},
        {"pool-sizes-gb", required_argument, NULL, 'p'},
        {"compatibility-digest", required_argument, NULL, 'c'},
        {"journal-mb", required_argument, NULL, 'j'},
        {"log-level", required_argument, NULL, 'l'},
        {"metrics-listen", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    svc_options o = {.journal_bytes = SVC_DEFAULT_JOURNAL_BYTES};
    kvcr_logger log;
    kvcr_logger_init(&log, "service", NULL, NULL);
    if (getenv("KVCR_LOG_LEVEL") == NULL) log.threshold = KVCR_LOG_INFO;
    unsigned long long v;
    bool sizes = false;
    optind = 0; /* argv[0] is "service": getopt starts after it */
    for (int c; (c = getopt_long(argc + 1, argv - 1, "", opts, NULL)) != -1;) {
        switch (c) {
        case 's': o.socket_path = optarg; break;
        case 'd': o.pool_dir = optarg; break;
        case 'c': o.digest = optarg; break;
        case 'g':
            if (!parse_uint(optarg, 1024, &v) || v < 1)
                return usage_error("--guard-count must be at least 1");
            o.guard_count = (uint32_t)v;
            break;
        case 'p':
            if (!parse_sizes(optarg, &o))
                return usage_error("--pool-sizes-gb must be positive, finite sizes (at least one "
                                   "page each), comma-separated");
            sizes = true;
            break;
        case 'j':
            if (!parse_uint(optarg, 1 << 20, &v) || v < 1)
                return usage_error("--journal-mb must be a positive integer");
            o.journal_bytes = v << 20;
            break;
        case 'l':
            if (!parse_level(optarg, &log.threshold))
                return usage_error("--log-level must be error, warn, info or debug");
            break;
        case 'm': o.metrics_listen = optarg; break;
        case 'h': printf("%s", service_usage); return 0;
        default: return usage_error("unknown option");
        }
    }
    if (optind != argc + 1) return usage_error("unexpected argument");
    if (!o.socket_path || !o.pool_dir || !o.digest || !o.guard_count || !sizes)
        return usage_error("--socket-path, --pool-dir, --guard-count, --pool-sizes-gb and "
                           "--compatibility-digest are required");
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = svc_serve(&o, &log, &stop_requested);
    if (rc != 0) {
        fprintf(stderr, "kvcr service: %s\n", kvcr_last_error());
        return 1;
    }
    return 0;
}

int cmd_stats(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[0], "--socket") != 0) {
        fprintf(stderr, "usage: kvcr stats --socket P   (metrics of a running `kvcr service`, "
                        "Prometheus text)\n");
        return 2;
    }
    char *text = NULL;
    if (svc_fetch_metrics(argv[1], &text) != 0) {
        fprintf(stderr, "kvcr stats: %s\n", kvcr_last_error());
        return 1;
    }
    fputs(text, stdout);
    free(text);
    return 0;
}
