/* kvcr demo: a small cluster on one machine showing what KVCR is for —
 * engines reusing each other's KV blocks peer to peer, steered by a router.
 *
 * This process is the workload driver. It forks the router and the engines
 * (before anything initialises KVCR or UCX), plays multi-turn conversations
 * that share a system prompt through the router, prints progress and then
 * the figures: where every block came from, bytes moved peer to peer, the
 * modelled prefill time saved, and the verification of every delivered
 * byte. Every wait is bounded; the whole run has a wall-clock limit.
 * With --chaos it also injects faults while the workload runs
 * (demo_chaos.c) and restarts the engines it kills. With --hosts every
 * child runs on a host of its own made by the netns rig (tools/netrig.h):
 * forked as always, it joins its host's namespaces before anything else,
 * so the pipes to the driver and the router stay what they are and KVCR's
 * peer traffic (control endpoints, UCX) crosses the rig's links. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo.h"
#include "keygen.h"
#include "netrig.h"

/* ---- options ------------------------------------------------------------------- */

static const char usage_text[] =
    "usage: kvcr demo [options]\n"
    "  --engines N         engine processes, 1..16 (default 3)\n"
    "  --block-size BYTES  bytes per KV block, a multiple of 8, k/m suffixes (default 256k)\n"
    "  --requests N        requests to play (default 300)\n"
    "  --conversations N   conversations played at once (default 16)\n"
    "  --system-blocks N   blocks of the system prompt they all share (default 8)\n"
    "  --slots N           KVCR DRAM slots per engine (default 256)\n"
    "  --in-flight N       requests in flight at once (default: one per engine)\n"
    "  --prefill-ms MS     modelled prefill cost of one block (default 2)\n"
    "  --time-limit S      wall-clock limit of the whole run (default 120)\n"
    "  --seed N            workload seed (default 1)\n"
    "  --local-only        no peer tier: the baseline without peer-to-peer reuse\n"
    "  --curve             CURVE on the control channels: a key pair per engine, each engine\n"
    "                      admitting only the engines' keys (see `kvcr keygen`)\n"
    "  --quick             a short run for ctest (64 KiB blocks, 60 requests, 8 conversations,\n"
    "                      4 system blocks, 128 slots, 60 s limit); options given explicitly win\n"
    "  --json              print the final figures as one JSON object\n"
    "  --kv-events-port P  the router's index comes from KV events (always): engine e's KVCR\n"
    "                      binds tcp://*:(P+e) as a vLLM engine does (the router connects to\n"
    "                      tcp://127.0.0.1:(P+e), and so may any other subscriber while the\n"
    "                      demo runs), topic kv@engine-<e>@demo, replay on\n"
    "                      tcp://127.0.0.1:(P+100+e); without it the demo picks free ports\n"
    "  --hosts N           N hosts on this machine (the netns rig, needs root): the router on\n"
    "                      198.18.0.1, engine e on 198.18.0.<e+2>, each in its own network,\n"
    "                      IPC and UTS namespaces, so blocks cross a network link as between\n"
    "                      machines; runs N-1 engines (2 <= N <= 17); the rig is removed at\n"
    "                      exit; exit status 77 when the rig cannot run here\n"
    "  --chaos             faults while the workload runs: engines SIGKILLed and restarted\n"
    "                      (guard mode on a KVCR service the demo starts; they recover their\n"
    "                      blocks), engines SIGSTOPped for a moment, G3 slot files corrupted,\n"
    "                      the G3 disk filled; every block verified, leaks checked after the\n"
    "                      drain (64 KiB blocks, 64 DRAM slots + 512 G3 slots per engine,\n"
    "                      4 system blocks by default)\n"
    "  --duration S        --chaos: seconds of workload (default 60; --requests is unused)\n"
    "  --faults LIST       --chaos: the kinds, comma-separated, of kill,stop,corrupt,full\n"
    "                      (default all), or none: the same set-up without faults, a baseline\n";

static int bad_option(const char *what, const char *arg)
{
    fprintf(stderr, "kvcr: demo: %s '%s'\n%s", what, arg, usage_text);
    return 2;
}

/* A number with an optional k/m/g (binary) suffix, within [lo, hi]. */
static bool parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0) return false;
    if (*end == 'k' || *end == 'K')
        v *= 1024, end++;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        v *= 1024.0 * 1024 * 1024, end++;
    if (*end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static int parse_opts(int argc, char **argv, demo_opts *o)
{
    *o = (demo_opts){.engines = 3,
                     .block_size = 256 * 1024,
                     .requests = 300,
                     .conversations = 16,
                     .system_blocks = 8,
                     .slots = 256,
                     .prefill_ms = 2.0,
                     .time_limit_s = 120,
                     .seed = 1};
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--chaos") == 0) {
            /* DRAM that overflows into G3 within seconds; explicit options win. */
            o->chaos = true;
            o->block_size = 64 * 1024;
            o->slots = 64;
            o->system_blocks = 4;
            o->duration_s = 60;
            o->faults = DEMO_FAULTS_ALL;
            o->time_limit_s = 0; /* duration + margin, unless given */
        } else if (strcmp(argv[i], "--quick") == 0) {
            /* A few seconds for ctest; explicit options still win. */
            o->quick = true;
            o->block_size = 64 * 1024;
            o->requests = 60;
            o->conversations = 8;
            o->system_blocks = 4;
            o->slots = 128;
            o->time_limit_s = 60;
        }
    const struct {
        const char *name;
        double lo, hi;
        int *i; /* exactly one of the three targets */
        size_t *z;
        double *d;
    } num[] = {
        {"--engines", 1, DEMO_MAX_ENGINES, .i = &o->engines},
        {"--block-size", 64, 64 << 20, .z = &o->block_size},
        {"--requests", 1, 1e7, .i = &o->requests},
        {"--conversations", 1, 1e5, .i = &o->conversations},
        {"--system-blocks", 0, DEMO_MAX_BLOCKS / 2, .i = &o->system_blocks},
        {"--slots", 8, 1 << 24, .i = &o->slots},
        {"--in-flight", 1, 1024, .i = &o->in_flight},
        {"--prefill-ms", 0, 1e4, .d = &o->prefill_ms},
        {"--time-limit", 1, 86400, .d = &o->time_limit_s},
        {"--duration", 1, 86400, .d = &o->duration_s},
        {"--hosts", 2, DEMO_MAX_ENGINES + 1, .i = &o->hosts},
        {"--kv-events-port", 1024, 65535 - 100 - DEMO_MAX_ENGINES, .i = &o->kv_events_port},
    };
    bool engines_given = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0 || strcmp(a, "--chaos") == 0) continue;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage_text, stdout);
            return -1;
        }
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(a, "--local-only") == 0) {
            o->local_only = true;
            continue;
        }
        if (strcmp(a, "--curve") == 0) {
            o->curve = true;
            continue;
        }
        if (strcmp(a, "--faults") == 0) {
            if (i + 1 == argc) return bad_option("missing value for", a);
            if (!o->chaos) return bad_option("needs --chaos:", a);
            if (demo_chaos_kinds(argv[++i], &o->faults) != 0) return bad_option(a, argv[i]);
            continue;
        }
        if (strcmp(a, "--seed") == 0) { /* exact, so not through a double */
            if (i + 1 == argc) return bad_option("missing value for", a);
            char *end;
            errno = 0;
            o->seed = strtoull(argv[++i], &end, 0);
            if (errno != 0 || end == argv[i] || *end != '\0' || argv[i][0] == '-')
                return bad_option(a, argv[i]);
            continue;
        }
        size_t k = 0;
        while (k < sizeof num / sizeof *num && strcmp(a, num[k].name) != 0) k++;
        if (k == sizeof num / sizeof *num) return bad_option("unknown option", a);
        engines_given |= num[k].i == &o->engines;
        if (i + 1 == argc) return bad_option("missing value for", a);
        double v;
        if (!parse_num(argv[++i], num[k].lo, num[k].hi, &v) ||
            (num[k].d == NULL && v != (double)(long long)v))
            return bad_option(a, argv[i]);
        if (num[k].i)
            *num[k].i = (int)v;
        else if (num[k].z)
            *num[k].z = (size_t)v;
        else
            *num[k].d = v;
    }
    if (o->duration_s > 0 && !o->chaos) return bad_option("needs --chaos:", "--duration");
    if (o->chaos && o->local_only)
        return bad_option("--chaos needs the peer tier:", "--local-only");
    if (o->curve && (o->local_only || o->chaos))
        return bad_option("--curve needs the peer tier without guard mode:",
                          o->chaos ? "--chaos" : "--local-only");
    if (o->hosts && o->chaos)
        return bad_option("--chaos (its KVCR service shares memory on this host) cannot run with",
                          "--hosts");
    if (o->hosts && engines_given && o->engines != o->hosts - 1) {
        fprintf(stderr, "kvcr: demo: --hosts %d runs %d engines, not --engines %d\n%s", o->hosts,
                o->hosts - 1, o->engines, usage_text);
        return 2;
    }
    if (o->hosts) o->engines = o->hosts - 1;
    for (int e = 0; o->curve && e < o->engines; e++)
        if (keygen_pair(o->curve_public[e], o->curve_secret[e]) != 0) return 1;
    if (o->chaos) {
        o->g3_slots = 8 * o->slots;
        /* starting, draining and restarting take seconds; the limit is a backstop */
        if (o->time_limit_s == 0) o->time_limit_s = o->duration_s + 120;
    }
    if (o->block_size % 8 != 0) {
        fprintf(stderr, "kvcr: demo: --block-size must be a multiple of 8 (got %zu)\n%s",
                o->block_size, usage_text);
        return 2;
    }
    return 0;
}

/* ---- KV events ------------------------------------------------------------------ */

/* A TCP port free on 127.0.0.1 now (the system's choice) and none of
 * taken[0 .. n), or 0. */
static uint16_t free_port(const uint16_t *taken, int n)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        uint16_t port = 0;
        if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(s, (struct sockaddr *)&a, &len) == 0)
            port = ntohs(a.sin_port);
        if (s >= 0) close(s);
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= taken[i] == port;
        if (port == 0 || !seen) return port;
    }
    return 0;
}

/* Every engine's KV-event ports: --kv-events-port's, or free ones. 0, or
 * -1 with a message. */
static int kv_ports(demo_opts *o)
{
    uint16_t taken[2 * DEMO_MAX_ENGINES];
    int n = 0, p = o->kv_events_port;
    for (int e = 0; e < o->engines; e++) {
        if (!p) {
            taken[n] = free_port(taken, n);
            n++;
            taken[n] = free_port(taken, n);
            n++;
        }
        o->kv_pub_port[e] = p ? (uint16_t)(p + e) : taken[n - 2];
        o->kv_replay_port[e] = p ? (uint16_t)(p + 100 + e) : taken[n - 1];
        if (o->kv_pub_port[e] == 0 || o->kv_replay_port[e] == 0) {
            fprintf(stderr, "kvcr demo: no free port for the KV events: %s\n", strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* ---- hosts (--hosts) ----------------------------------------------------------- */

/* The rig of --hosts into *rig (NULL without --hosts), with o's engine
 * addresses: 0; 77 when the rig cannot run here; 1 when it did not come up.
 * The reason on stderr. Made before any pipe, so that no keeper of the rig
 * holds a pipe end open. */
static int hosts_up(demo_opts *o, netrig **rig)
{
    char why[256];
    *rig = NULL;
    if (!o->hosts) return 0;
    if (!netrig_available(why, sizeof why)) {
        fprintf(stderr, "kvcr demo: --hosts needs the netns rig, which cannot run here: %s\n",
                why);
        return 77;
    }
    if (netrig_up(&(netrig_opts){.n_hosts = (unsigned)o->hosts}, rig, why, sizeof why) != 0) {
        fprintf(stderr, "kvcr demo: the netns rig did not come up: %s\n", why);
        return 1;
    }
    for (int e = 0; e < o->engines; e++)
        snprintf(o->engine_addr[e], sizeof o->engine_addr[e], "%s",
                 netrig_addr(*rig, (unsigned)e + 1));
    return 0;
}

/* ---- processes ------------------------------------------------------------------ */

/* P_FDS is a socket pair, [0] the router's end: restarted engines' pipes. */
enum { P_D2R, P_R2D, P_FDS, P_N };

/* All pipes are made first; each child keeps only its own ends. */
static int pipes[P_N + 2 * DEMO_MAX_ENGINES][2];

static int e2r(int e)
{
    return P_N + 2 * e;
}
static int r2e(int e)
{
    return P_N + 2 * e + 1;
}

static void close_all_but(int n_pipes, const int *keep, int n_keep)
{
    for (int p = 0; p < n_pipes; p++)
        for (int s = 0; s < 2; s++) {
            bool mine = false;
            for (int k = 0; k < n_keep; k++) mine |= keep[k] == pipes[p][s];
            if (!mine) close(pipes[p][s]);
        }
}

static const char *who(int i)
{
    static char buf[32];
    if (i == 0)
        snprintf(buf, sizeof buf, "the router");
    else
        snprintf(buf, sizeof buf, "engine %d", i - 1);
    return buf;
}

/* Collects child i if it has ended (or, with block, once it ends). */
static bool collect(cluster *c, int i, bool block)
{
    int st;
    pid_t r = waitpid(c->pid[i], &st, block ? 0 : WNOHANG);
    if (r != c->pid[i] && !(r < 0 && errno == ECHILD)) return false;
    c->status[i] = r == c->pid[i] ? st : 0;
    c->pid[i] = 0;
    return true;
}

/* SIGKILLs every child still running. One that already ended keeps its
 * own status, so a crash is still reported as such; `grace` seconds let a
 * child that is dying (its pipes already closed) finish first. */
static void kill_all(cluster *c, double grace)
{
    for (double until = tool_now() + grace;; usleep(10000)) {
        int left = 0;
        for (int i = 0; i < c->n; i++) left += c->pid[i] > 0 && !collect(c, i, false);
        if (left == 0 || tool_now() >= until) break;
    }
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] <= 0 || collect(c, i, false)) continue;
        kill(c->pid[i], SIGKILL);
        c->killed[i] = true;
    }
}

/* Reaps every child, killing those still running after `patience`
 * seconds. 0 when every child exited 0 by itself; others are named. */
static int reap_all(cluster *c, double patience)
{
    double until = tool_now() + patience;
    int bad = 0;
    for (;;) {
        int left = 0;
        for (int i = 0; i < c->n; i++)
            if (c->pid[i] > 0 && !collect(c, i, c->killed[i])) left++;
        if (left == 0) break;
        if (tool_now() > until) {
            for (int i = 0; i < c->n; i++)
                if (c->pid[i] > 0 && !c->killed[i]) {
                    fprintf(stderr, "kvcr demo: %s did not stop within %.0f s\n", who(i), patience);
                    bad = 1;
                }
            kill_all(c, 0);
        }
        usleep(10000);
    }
    for (int i = 0; i < c->n; i++) {
        int st = c->status[i];
        if (c->killed[i] || (WIFEXITED(st) && WEXITSTATUS(st) == 0)) continue;
        if (WIFSIGNALED(st))
            fprintf(stderr, "kvcr demo: %s was killed by signal %d\n", who(i), WTERMSIG(st));
        else
            fprintf(stderr, "kvcr demo: %s exited with status %d\n", who(i), WEXITSTATUS(st));
        bad = 1;
    }
    return bad;
}

/* Forks the router (child 0) and the engines; with a rig, child i runs on
 * host i. */
static int start_cluster(const demo_opts *o, netrig *rig, cluster *c, double deadline)
{
    int n_pipes = P_N + 2 * o->engines;
    for (int p = 0; p < n_pipes; p++)
        if (p == P_FDS ? socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pipes[p]) != 0
                       : pipe(pipes[p]) != 0) {
            fprintf(stderr, "kvcr demo: pipe: %s\n", strerror(errno));
            return 1;
        }
    pid_t driver = getpid();
    fflush(NULL);
    c->n = 0;
    for (int i = 0; i <= o->engines; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "kvcr demo: fork: %s\n", strerror(errno));
            kill_all(c, 0);
            reap_all(c, 0);
            return 1;
        }
        if (pid == 0) {
            if (rig && netrig_join(rig, (unsigned)i) != 0) { /* first, as netrig.h asks */
                fprintf(stderr, "kvcr demo: %s cannot join its host: %s\n", who(i),
                        netrig_last_error(rig));
                _exit(1);
            }
            demo_child_setup(driver);
            int rc;
            if (i == 0) {
                int keep[3 + 2 * DEMO_MAX_ENGINES], k = 0, from_e[DEMO_MAX_ENGINES],
                                                    to_e[DEMO_MAX_ENGINES];
                keep[k++] = pipes[P_D2R][0];
                keep[k++] = pipes[P_R2D][1];
                keep[k++] = pipes[P_FDS][0];
                for (int e = 0; e < o->engines; e++) {
                    keep[k++] = from_e[e] = pipes[e2r(e)][0];
                    keep[k++] = to_e[e] = pipes[r2e(e)][1];
                }
                close_all_but(n_pipes, keep, k);
                rc = demo_router_main(o, pipes[P_D2R][0], pipes[P_R2D][1], pipes[P_FDS][0], from_e,
                                      to_e, deadline);
            } else {
                int e = i - 1, keep[2] = {pipes[r2e(e)][0], pipes[e2r(e)][1]};
                close_all_but(n_pipes, keep, 2);
                rc = demo_engine_main(o, e, keep[0], keep[1], deadline);
            }
            fflush(NULL);
            _exit(rc);
        }
        c->pid[c->n++] = pid;
    }
    c->to_router = pipes[P_D2R][1];
    c->from_router = pipes[P_R2D][0];
    c->to_router_fds = pipes[P_FDS][1];
    int keep[3] = {c->to_router, c->from_router, c->to_router_fds};
    close_all_but(n_pipes, keep, 3);
    return 0;
}

int demo_restart_engine(const demo_opts *o, cluster *cl, int e, double deadline)
{
    int down[2], up[2]; /* router -> engine, engine -> router */
    if (pipe(down) != 0) {
        fprintf(stderr, "kvcr demo: pipe: %s\n", strerror(errno));
        return -1;
    }
    if (pipe(up) != 0) {
        fprintf(stderr, "kvcr demo: pipe: %s\n", strerror(errno));
        close(down[0]);
        close(down[1]);
        return -1;
    }
    pid_t driver = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        demo_child_setup(driver);
        close(cl->to_router);
        close(cl->from_router);
        close(cl->to_router_fds);
        close(down[1]);
        close(up[0]);
        int rc = demo_engine_main(o, e, down[0], up[1], deadline);
        fflush(NULL);
        _exit(rc);
    }
    close(down[0]);
    close(up[1]);
    int rc = pid > 0 ? demo_send_fds(cl->to_router_fds, e, up[0], down[1]) : -1;
    if (pid < 0 || rc != 0)
        fprintf(stderr, "kvcr demo: restarting engine %d: %s: %s\n", e,
                pid < 0 ? "fork" : "passing its pipes to the router", strerror(errno));
    close(up[0]);
    close(down[1]);
    if (pid > 0) { /* reaped by the chaos or at the end, whatever happened */
        cl->pid[1 + e] = pid;
        cl->status[1 + e] = 0;
        cl->killed[1 + e] = false;
    }
    return rc;
}

/* ---- the workload ----------------------------------------------------------------- */

/* A conversation: the shared system prompt, then its own history, a few
 * blocks more each turn. A conversation that would outgrow the engines'
 * buffer ends and a new one takes its place. */
typedef struct conv {
    uint64_t id;
    int n, turns;
    bool busy;
    uint64_t h[DEMO_MAX_BLOCKS];
} conv;

typedef struct workload {
    const demo_opts *o;
    uint64_t rng, root, next_id;
    conv *c;
    int started;
} workload;

static void conv_extend(workload *w, conv *c, int k)
{
    for (int i = 0; i < k; i++, c->n++) {
        uint64_t prev = c->n ? c->h[c->n - 1] : w->root;
        uint64_t chunk =
            c->n < w->o->system_blocks ? (uint64_t)c->n : (c->id << 20 | (uint64_t)c->n);
        c->h[c->n] = demo_chain(prev, chunk);
    }
}

static int turn_blocks(workload *w)
{
    return 1 + (int)(demo_rand(&w->rng) % 4);
}

static void conv_new(workload *w, conv *c)
{
    *c = (conv){.id = ++w->next_id};
    conv_extend(w, c, w->o->system_blocks);
    conv_extend(w, c, turn_blocks(w));
    w->started++;
}

/* After a turn: the reply and the next user message join the history. */
static void conv_next(workload *w, conv *c)
{
    int k = turn_blocks(w);
    c->turns++;
    if (c->n + k > DEMO_MAX_BLOCKS)
        conv_new(w, c);
    else
        conv_extend(w, c, k);
}

/* ---- the driver ------------------------------------------------------------------- */

enum { CONV_RING = 4096 }; /* > requests in flight (--in-flight <= 1024, + probes) */

typedef struct driver {
    const demo_opts *o;
    cluster *cl;
    double deadline, end; /* end: no new request after it (--chaos) */
    totals *t, *per;
    workload *w;
    demo_chaos *chaos;    /* NULL without --chaos */
    bool stopping;        /* after STOP: the engines end, no chaos any more */
    demo_bye leaks;
    int sent, in_flight;
    int conv_of[CONV_RING]; /* by req_no % CONV_RING: its conversation, -1: a probe */
} driver;

static bool sending(const driver *d)
{
    return d->chaos ? tool_now() < d->end : d->sent < d->o->requests;
}

static int send_req(driver *d, int conv_no, const uint64_t *h, int n, int target)
{
    demo_req rq = {.req_no = (uint32_t)d->sent, .source = -1, .n_blocks = (uint32_t)n,
                   .target = target};
    if (demo_send(d->cl->to_router, MSG_REQ, &rq, sizeof rq, h, (size_t)n * 8) != 0) {
        fprintf(stderr, "kvcr demo: the router does not take requests\n");
        return -1;
    }
    d->conv_of[d->sent++ % CONV_RING] = conv_no;
    d->in_flight++;
    return 0;
}

/* Requests up to --in-flight at once (default one per engine). */
static int send_more(driver *d)
{
    int max_in_flight = d->o->in_flight ? d->o->in_flight : d->o->engines;
    while (sending(d) && d->in_flight < max_in_flight) {
        /* A random idle conversation takes the next turn. */
        int idle = 0, pick = -1;
        for (int i = 0; i < d->o->conversations; i++)
            if (!d->w->c[i].busy && demo_rand(&d->w->rng) % (uint64_t)++idle == 0) pick = i;
        if (pick < 0) break;
        conv *c = &d->w->c[pick];
        if (send_req(d, pick, c->h, c->n, -1) != 0) return -1;
        c->busy = true;
    }
    return 0;
}

/* Faults and repairs that are due; a probe of a corrupted slot is sent
 * like any request. */
static int chaos_step(driver *d)
{
    int probe = -1;
    uint64_t hash = 0;
    if (demo_chaos_step(d->chaos, d->cl, d->deadline + 10, &probe, &hash) != 0) return -1;
    return probe >= 0 ? send_req(d, -1, &hash, 1, probe) : 0;
}

static int on_done(driver *d, const uint8_t *msg, size_t len)
{
    demo_result r;
    if (len != sizeof r) {
        fprintf(stderr, "kvcr demo: a malformed result from the router\n");
        return -1;
    }
    memcpy(&r, msg, sizeof r);
    if (r.req_no >= (uint32_t)d->sent || r.engine >= d->o->engines ||
        (r.engine < 0 && r.failed == DEMO_FAIL_NONE)) {
        fprintf(stderr, "kvcr demo: a result for an unknown request\n");
        return -1;
    }
    demo_add(d->t, &r);
    if (r.engine >= 0) demo_add(&d->per[r.engine], &r);
    d->in_flight--;
    int k = d->conv_of[r.req_no % CONV_RING];
    if (k >= 0) { /* a failed turn is over too: the conversation goes on */
        conv *c = &d->w->c[k];
        c->busy = false;
        conv_next(d->w, c);
    }
    demo_progress(d->o, d->t, !sending(d) && d->in_flight == 0);
    return 0;
}

/* One message from the router: 0, 1 when it was the last BYE, -1 on failure. */
static int on_message(driver *d, uint32_t type, uint8_t *msg, size_t len)
{
    if (type == MSG_FATAL) {
        msg[len] = '\0';
        fprintf(stderr, "kvcr demo: %s\n", (char *)msg);
        return -1;
    }
    if (type == MSG_DONE) return on_done(d, msg, len);
    if (type == MSG_HELLO && len == sizeof(demo_hello)) {
        demo_hello h;
        memcpy(&h, msg, sizeof h);
        if (d->chaos) demo_chaos_hello(d->chaos, &h);
        return 0;
    }
    if (type == MSG_BYE && len == sizeof(demo_bye)) {
        demo_bye b;
        memcpy(&b, msg, sizeof b);
        demo_add_bye(&d->leaks, &b);
        return d->leaks.engine == d->o->engines;
    }
    fprintf(stderr, "kvcr demo: unexpected message %u from the router\n", type);
    return -1;
}

/* Waits for the next message from the router until `until` (running the
 * chaos meanwhile): 1 with one read, 0 at `until`, -1 on failure. Only a
 * readable pipe is read, so a message is never cut by a timeout. */
static int next_message(driver *d, double until, uint32_t *type, uint8_t *msg, size_t cap,
                        size_t *len)
{
    for (;;) {
        if (d->chaos && !d->stopping && chaos_step(d) != 0) return -1;
        double now = tool_now(), wake = until;
        if (d->chaos && !d->stopping && demo_chaos_due(d->chaos) < wake)
            wake = demo_chaos_due(d->chaos);
        if (now >= until) return 0;
        struct pollfd pfd = {d->cl->from_router, POLLIN, 0};
        int ms = wake > now ? (int)((wake - now) * 1000) + 1 : 0;
        int r = poll(&pfd, 1, ms > 100 ? 100 : ms);
        if (r < 0 && errno != EINTR) return -1;
        if (r <= 0) continue;
        if (demo_recv(d->cl->from_router, type, msg, cap, len, d->deadline) != 0) {
            fprintf(stderr, "kvcr demo: the router stopped answering: %s\n", strerror(errno));
            return -1;
        }
        return 1;
    }
}

static int wait_ready(driver *d, uint8_t *msg, size_t cap)
{
    double ready_by = tool_now() + 30 < d->deadline ? tool_now() + 30 : d->deadline;
    for (int hellos = 0; hellos <= d->o->engines; hellos++) { /* their HELLOs, then READY */
        uint32_t type = 0;
        size_t len = 0;
        int r = next_message(d, ready_by, &type, msg, cap, &len);
        if (r > 0 && type == MSG_READY) return 0;
        if (r > 0 && type == MSG_HELLO && on_message(d, type, msg, len) == 0) continue;
        if (r > 0 && type == MSG_FATAL) on_message(d, type, msg, len);
        else
            fprintf(stderr, "kvcr demo: the engines did not come up%s\n",
                    r == 0 ? " in time" : "");
        return -1;
    }
    fprintf(stderr, "kvcr demo: the router sent more HELLOs than there are engines\n");
    return -1;
}

/* Plays requests until all are answered (--chaos: until the duration is
 * over, the faults repaired and every request answered). */
static int drive(driver *d)
{
    static uint8_t msg[DEMO_MSG_MAX];
    if (wait_ready(d, msg, sizeof msg - 1) != 0) return 1;
    if (d->chaos) {
        d->end = tool_now() + d->o->duration_s;
        demo_chaos_begin(d->chaos);
    }
    for (;;) {
        if (send_more(d) != 0) return 1;
        bool settled = d->chaos ? !sending(d) && demo_chaos_settle(d->chaos, d->cl) : true;
        if (!sending(d) && d->in_flight == 0 && settled) return 0;
        if (tool_now() > d->deadline) {
            demo_progress(d->o, d->t, true);
            fprintf(stderr,
                    "kvcr demo: the time limit of %.0f s passed with %" PRIu64
                    " requests answered, %d in flight\n",
                    d->o->time_limit_s, d->t->requests, d->in_flight);
            return 1;
        }
        uint32_t type;
        size_t len;
        int r = next_message(d, d->chaos ? tool_now() + 0.1 : d->deadline, &type, msg,
                             sizeof msg - 1, &len);
        if (r < 0 || (r > 0 && on_message(d, type, msg, len) != 0)) return 1;
    }
}

/* STOP, then every engine's state after the drain (BYE), bounded. */
static int stop_and_collect(driver *d)
{
    static uint8_t msg[DEMO_MSG_MAX];
    d->stopping = true;
    if (demo_send(d->cl->to_router, MSG_STOP, NULL, 0, NULL, 0) != 0) return 1;
    double until = tool_now() + 60; /* each engine waits at most 30 s (DRAIN_LIMIT_S) */
    for (;;) {
        uint32_t type;
        size_t len;
        int r = next_message(d, until, &type, msg, sizeof msg - 1, &len);
        if (r == 0) {
            fprintf(stderr, "kvcr demo: %d of %d engines reported their state after the drain\n",
                    d->leaks.engine, d->o->engines);
            return 1;
        }
        if (r < 0) return 1;
        r = on_message(d, type, msg, len);
        if (r != 0) return r > 0 ? 0 : 1;
    }
}

static int finish(const demo_opts *o, const totals *t, const demo_bye *leaks,
                  const demo_chaos_figures *cf)
{
    if (t->wrong > 0 || t->hint_refused > 0 || demo_leaks(leaks) > 0) {
        fprintf(stderr,
                "kvcr demo: FAILED: %" PRIu64 " wrong bytes in delivered blocks, %" PRIu64
                " router hints refused, %" PRIu64 " slots, operations or pins leaked\n",
                t->wrong, t->hint_refused, demo_leaks(leaks));
        return 1;
    }
    if (cf && (cf->unreaped || cf->unexpected_exits)) {
        fprintf(stderr,
                "kvcr demo: FAILED: %" PRIu64 " processes could not be reaped, %" PRIu64
                " engines ended without being killed\n",
                cf->unreaped, cf->unexpected_exits);
        return 1;
    }
    if (!o->local_only && !o->chaos && t->hinted > 0 && t->remote == 0) {
        fprintf(stderr,
                "kvcr demo: FAILED: %" PRIu64
                " requests carried a router hint but no "
                "block was pulled from a peer (%" PRIu64 " pulls failed)\n",
                t->hinted, t->remote_failed);
        return 1;
    }
    return 0;
}

int cmd_demo(int argc, char **argv)
{
    demo_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0) return rc < 0 ? 0 : rc; /* -1: --help */
    double t0 = tool_now(), deadline = t0 + o.time_limit_s;
    signal(SIGPIPE, SIG_IGN);
    netrig *rig; /* SIGINT or SIGKILL here: its keepers remove it (netrig.h) */
    if ((rc = hosts_up(&o, &rig)) != 0) return rc;
    if (kv_ports(&o) != 0) {
        netrig_down(rig);
        return 1;
    }
    if (!o.json && o.chaos)
        printf("kvcr demo --chaos: %d engines + a router + the KVCR service for %.0f s, "
               "%s blocks, %d DRAM slots (guard mode) and %d G3 slots per engine, seed %" PRIu64
               "\n",
               o.engines, o.duration_s, demo_size_text(o.block_size), o.slots, o.g3_slots, o.seed);
    else if (!o.json)
        printf(
            "kvcr demo: %d engines + a router, %d requests over %d conversations, "
            "%s blocks, %d KVCR DRAM slots per engine, seed %" PRIu64 "%s\n",
            o.engines, o.requests, o.conversations, demo_size_text(o.block_size), o.slots, o.seed,
            o.local_only ? " (peer tier off)" : "");
    if (!o.json && rig)
        printf("kvcr demo: %d hosts (netns rig): the router on %s, engines on %s .. %s\n", o.hosts,
               netrig_addr(rig, 0), netrig_addr(rig, 1), netrig_addr(rig, (unsigned)o.engines));

    demo_chaos *chaos = NULL;
    if (o.chaos && demo_chaos_start(&o, &chaos) != 0) return 1;
    cluster cl = {0};
    /* Children stop on their own only if the driver could not stop them. */
    if (start_cluster(&o, rig, &cl, deadline + 10) != 0) {
        demo_chaos_stop(chaos);
        netrig_down(rig);
        return 1;
    }

    workload w = {.o = &o, .rng = o.seed, .root = demo_mix(o.seed ^ 0x726f6f74ull)};
    w.c = calloc((size_t)o.conversations, sizeof *w.c);
    totals t = {.keep_pulls = true}, per[DEMO_MAX_ENGINES] = {{0}};
    driver d = {.o = &o, .cl = &cl, .deadline = deadline, .t = &t, .per = per, .w = &w,
                .chaos = chaos};
    if (w.c == NULL) {
        fprintf(stderr, "kvcr demo: out of memory\n");
        rc = 1;
    } else {
        for (int i = 0; i < o.conversations; i++) conv_new(&w, &w.c[i]);
        rc = drive(&d);
    }
    double wall = tool_now() - t0;
    if (rc == 0) rc = stop_and_collect(&d);
    if (rc == 0) {
        /* engines close within their abandon timeout */
        if (reap_all(&cl, 30) != 0) rc = 1;
    } else {
        kill_all(&cl, 0.2);
        reap_all(&cl, 5);
    }
    close(cl.to_router);
    close(cl.from_router);
    close(cl.to_router_fds);
    demo_chaos_figures cf = {0};
    if (chaos) cf = *demo_chaos_figures_of(chaos);
    demo_chaos_stop(chaos);
    netrig_down(rig); /* every child reaped: nothing of ours is left in it */
    if (rc == 0) demo_report(&o, &t, per, w.started, wall, &d.leaks, chaos ? &cf : NULL);
    free(w.c);
    free(t.pulls);
    if (rc != 0) {
        fprintf(stderr, "kvcr demo: FAILED\n");
        return 1;
    }
    return finish(&o, &t, &d.leaks, chaos ? &cf : NULL);
}
