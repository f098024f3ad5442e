/* kvcr demo: a small cluster on one machine showing what KVCR is for —
 * engines reusing each other's KV blocks peer to peer, steered by a router.
 *
 * This process is the workload driver. It forks the router and the engines
 * (before anything initialises KVCR or UCX), plays multi-turn conversations
 * that share a system prompt through the router, prints progress and then
 * the figures: where every block came from, bytes moved peer to peer, the
 * modelled prefill time saved, and the verification of every delivered
 * byte. Every wait is bounded; the whole run has a wall-clock limit. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo.h"

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
    "  --quick             a short run for ctest (64 KiB blocks, 60 requests, 8 conversations,\n"
    "                      4 system blocks, 128 slots, 60 s limit); options given explicitly win\n"
    "  --json              print the final figures as one JSON object\n";

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
        if (strcmp(argv[i], "--quick") == 0) {
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
    };
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0) continue;
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
    if (o->block_size % 8 != 0) {
        fprintf(stderr, "kvcr: demo: --block-size must be a multiple of 8 (got %zu)\n%s",
                o->block_size, usage_text);
        return 2;
    }
    return 0;
}

/* ---- processes ------------------------------------------------------------------ */

typedef struct cluster {
    int n; /* children: [0] the router, [1..] the engines */
    pid_t pid[1 + DEMO_MAX_ENGINES];
    int status[1 + DEMO_MAX_ENGINES];
    bool killed[1 + DEMO_MAX_ENGINES]; /* by us: its end is not news */
    int to_router, from_router;        /* the driver's ends */
} cluster;

enum { P_D2R, P_R2D, P_N };

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
    for (double until = demo_now() + grace;; usleep(10000)) {
        int left = 0;
        for (int i = 0; i < c->n; i++) left += c->pid[i] > 0 && !collect(c, i, false);
        if (left == 0 || demo_now() >= until) break;
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
    double until = demo_now() + patience;
    int bad = 0;
    for (;;) {
        int left = 0;
        for (int i = 0; i < c->n; i++)
            if (c->pid[i] > 0 && !collect(c, i, c->killed[i])) left++;
        if (left == 0) break;
        if (demo_now() > until) {
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

static int start_cluster(const demo_opts *o, cluster *c, double deadline)
{
    int n_pipes = P_N + 2 * o->engines;
    for (int p = 0; p < n_pipes; p++)
        if (pipe(pipes[p]) != 0) {
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
            demo_child_setup(driver);
            int rc;
            if (i == 0) {
                int keep[2 + 2 * DEMO_MAX_ENGINES], k = 0, from_e[DEMO_MAX_ENGINES],
                                                    to_e[DEMO_MAX_ENGINES];
                keep[k++] = pipes[P_D2R][0];
                keep[k++] = pipes[P_R2D][1];
                for (int e = 0; e < o->engines; e++) {
                    keep[k++] = from_e[e] = pipes[e2r(e)][0];
                    keep[k++] = to_e[e] = pipes[r2e(e)][1];
                }
                close_all_but(n_pipes, keep, k);
                rc = demo_router_main(o, pipes[P_D2R][0], pipes[P_R2D][1], from_e, to_e, deadline);
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
    int keep[2] = {c->to_router, c->from_router};
    close_all_but(n_pipes, keep, 2);
    return 0;
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

/* Sends requests (--in-flight at once, default one per engine) until all
 * are answered. */
static int drive(const demo_opts *o, cluster *cl, double deadline, totals *t, totals *per,
                 workload *w)
{
    static uint8_t msg[DEMO_MSG_MAX];
    uint32_t type = 0;
    size_t len = 0;
    double ready_by = demo_now() + 30 < deadline ? demo_now() + 30 : deadline;
    if (demo_recv(cl->from_router, &type, msg, sizeof msg - 1, &len, ready_by) != 0 ||
        type != MSG_READY) {
        msg[type == MSG_FATAL ? len : 0] = '\0';
        fprintf(stderr, "kvcr demo: the engines did not come up: %s\n",
                type == MSG_FATAL ? (char *)msg : strerror(errno));
        return 1;
    }
    int *conv_of = calloc((size_t)o->requests, sizeof *conv_of);
    if (conv_of == NULL) return 1;
    int sent = 0, in_flight = 0, max_in_flight = o->in_flight ? o->in_flight : o->engines;
    int rc = 0;
    while (t->requests < (uint64_t)o->requests) {
        while (sent < o->requests && in_flight < max_in_flight) {
            /* A random idle conversation takes the next turn. */
            int idle = 0, pick = -1;
            for (int i = 0; i < o->conversations; i++)
                if (!w->c[i].busy && demo_rand(&w->rng) % (uint64_t)++idle == 0) pick = i;
            if (pick < 0) break;
            conv *c = &w->c[pick];
            demo_req rq = {.req_no = (uint32_t)sent, .source = -1, .n_blocks = (uint32_t)c->n};
            if (demo_send(cl->to_router, MSG_REQ, &rq, sizeof rq, c->h, (size_t)c->n * 8) != 0) {
                fprintf(stderr, "kvcr demo: the router does not take requests\n");
                rc = 1;
                goto out;
            }
            c->busy = true;
            conv_of[sent++] = pick;
            in_flight++;
        }
        if (demo_now() > deadline) {
            demo_progress(o, t, true);
            fprintf(stderr,
                    "kvcr demo: the time limit of %.0f s passed with %" PRIu64
                    " of %d requests answered\n",
                    o->time_limit_s, t->requests, o->requests);
            rc = 1;
            goto out;
        }
        if (demo_recv(cl->from_router, &type, msg, sizeof msg - 1, &len, deadline) != 0) {
            if (errno == ETIMEDOUT) continue; /* the time limit, reported above */
            fprintf(stderr, "kvcr demo: the router stopped answering: %s\n", strerror(errno));
            rc = 1;
            goto out;
        }
        if (type == MSG_FATAL) {
            msg[len] = '\0';
            fprintf(stderr, "kvcr demo: %s\n", (char *)msg);
            rc = 1;
            goto out;
        }
        demo_result r;
        if (type != MSG_DONE || len != sizeof r) {
            fprintf(stderr, "kvcr demo: unexpected message %u from the router\n", type);
            rc = 1;
            goto out;
        }
        memcpy(&r, msg, sizeof r);
        if (r.req_no >= (uint32_t)sent || r.engine < 0 || r.engine >= o->engines) {
            fprintf(stderr, "kvcr demo: a result for an unknown request\n");
            rc = 1;
            goto out;
        }
        demo_add(t, &r);
        demo_add(&per[r.engine], &r);
        in_flight--;
        conv *c = &w->c[conv_of[r.req_no]];
        c->busy = false;
        conv_next(w, c);
        demo_progress(o, t, t->requests == (uint64_t)o->requests);
    }
out:
    free(conv_of);
    return rc;
}

int cmd_demo(int argc, char **argv)
{
    demo_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0) return rc < 0 ? 0 : rc; /* -1: --help */
    double t0 = demo_now(), deadline = t0 + o.time_limit_s;
    signal(SIGPIPE, SIG_IGN);
    if (!o.json)
        printf(
            "kvcr demo: %d engines + a router, %d requests over %d conversations, "
            "%s blocks, %d KVCR DRAM slots per engine, seed %" PRIu64 "%s\n",
            o.engines, o.requests, o.conversations, demo_size_text(o.block_size), o.slots, o.seed,
            o.local_only ? " (peer tier off)" : "");

    cluster cl = {0};
    /* Children stop on their own only if the driver could not stop them. */
    if (start_cluster(&o, &cl, deadline + 10) != 0) return 1;

    workload w = {.o = &o, .rng = o.seed, .root = demo_mix(o.seed ^ 0x726f6f74ull)};
    w.c = calloc((size_t)o.conversations, sizeof *w.c);
    totals t = {0}, per[DEMO_MAX_ENGINES] = {{0}};
    t.pulls = calloc((size_t)o.requests, sizeof *t.pulls);
    if (w.c == NULL || t.pulls == NULL) {
        fprintf(stderr, "kvcr demo: out of memory\n");
        rc = 1;
    } else {
        for (int i = 0; i < o.conversations; i++) conv_new(&w, &w.c[i]);
        rc = drive(&o, &cl, deadline, &t, per, &w);
    }
    double wall = demo_now() - t0;
    if (rc == 0) {
        demo_send(cl.to_router, MSG_STOP, NULL, 0, NULL, 0);
        /* engines close within their abandon timeout */
        if (reap_all(&cl, 30) != 0) rc = 1;
    } else {
        kill_all(&cl, 0.2);
        reap_all(&cl, 5);
    }
    close(cl.to_router);
    close(cl.from_router);
    if (rc == 0) demo_report(&o, &t, per, w.started, wall);
    free(w.c);
    free(t.pulls);
    if (rc != 0) {
        fprintf(stderr, "kvcr demo: FAILED\n");
        return 1;
    }
    if (t.wrong > 0 || t.hint_refused > 0) {
        fprintf(stderr,
                "kvcr demo: FAILED: %" PRIu64 " wrong bytes in delivered blocks, %" PRIu64
                " router hints refused\n",
                t.wrong, t.hint_refused);
        return 1;
    }
    if (!o.local_only && t.hinted > 0 && t.remote == 0) {
        fprintf(stderr,
                "kvcr demo: FAILED: %" PRIu64
                " requests carried a router hint but no "
                "block was pulled from a peer (%" PRIu64 " pulls failed)\n",
                t.hinted, t.remote_failed);
        return 1;
    }
    return 0;
}
