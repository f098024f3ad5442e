/* The `kvcr` command, what a user installs: the demo, the node's service
 * and its metrics, CURVE keys. Commands are rows of one table, one line
 * each. The benchmarks are another program, kvcr-bench (bench/), built in
 * the build tree and never installed. */
#include <stdio.h>
#include <string.h>

#include "demo.h"
#include "keygen.h"
#include "kvcr/kvcr.h"
#include "service_cmd.h"
#include "tool_util.h"

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const tool_cmd commands[] = {
    {"demo", cmd_demo, "[--quick] [--json] [...]",
     "engines + router on this machine: peer-to-peer KV reuse"},
    {"service", cmd_service, "--socket-path P --pool-dir D ...",
     "the node daemon: pools that outlive an engine, and their Guards"},
    {"stats", cmd_stats, "--socket P", "a running service's metrics (Prometheus text)"},
    {"keygen", cmd_keygen, "", "a new CURVE key pair for the control channel"},
    {"version", cmd_version, "", "print the library version"},
    {"help", cmd_help, "", "this text"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: kvcr <command> [arguments]\n\ncommands:\n");
    tool_cmd_list(f, commands, COUNT(commands));
    fprintf(f, "\nThe benchmarks are kvcr-bench, in a build tree (bench/; not installed).\n");
}

/* Commands without arguments refuse any, so a typo is never ignored. */
static int no_args(const char *name, int argc, char **argv)
{
    if (argc == 0) return 0;
    fprintf(stderr, "kvcr: %s takes no arguments (got '%s')\n\n", name, argv[0]);
    usage(stderr);
    return 2;
}

static int cmd_version(int argc, char **argv)
{
    int rc = no_args("version", argc, argv);
    if (rc == 0) printf("kvcr %s\n", kvcr_version_string());
    return rc;
}

static int cmd_help(int argc, char **argv)
{
    int rc = no_args("help", argc, argv);
    if (rc == 0) usage(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) return cmd_help(0, NULL);
    const tool_cmd *c = tool_cmd_find(commands, COUNT(commands), argv[1]);
    if (c != NULL) return c->run(argc - 2, argv + 2);
    fprintf(stderr, "kvcr: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
