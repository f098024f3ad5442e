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
    "usage: kvcr demo [--engines N] [--block-size BYTES] [--requests N] [--conversations N]\n"
    "                 [--system-blocks N] [--slots N] [--prefill-ms MS] [--time-limit S]\n"
    "                 [--seed N] [--local-only] [--quick] [--json]\n";

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
    if (*end == 'k' || *end == 'K') v *= 1024, end++;
    else if (*end == 'm' || *end == 'M') v *= 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G') v *= 1024.0 * 1024 * 1024, end++;
    if (*end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

static int parse_opts(int argc, char **argv, demo_opts *o)
{
    *o = (demo_opts){.engines = 3, .block_size = 256 * 1024, .requests = 300,
                     .conversations = 16, .system_blocks = 8, .slots = 256,
                     .prefill_ms = 2.0, .time_limit_s = 120, .seed = 1};
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
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0) continue;
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(a, "--local-only") == 0) {
            o->local_only = true;
            continue;
        }
        static const struct {
            const char *name;
            double lo, hi;
        } num[] = {{"--engines", 1, DEMO_MAX_ENGINES}, {"--block-size", 64, 64 << 20},
                   {"--requests", 1, 1e7},             {"--conversations", 1, 1e5},
                   {"--system-blocks", 0, DEMO_MAX_BLOCKS / 2}, {"--slots", 8, 1 << 24},
                   {"--prefill-ms", 0, 1e4},           {"--time-limit", 1, 86400},
                   {"--seed", 0, 1.8e19}};
        size_t k = 0;
        while (k < sizeof num / sizeof *num && strcmp(a, num[k].name) != 0) k++;
        if (k == sizeof num / sizeof *num) return bad_option("unknown option", a);
        if (i + 1 == argc) return bad_option("missing value for", a);
        double v;
        if (!parse_num(argv[++i], num[k].lo, num[k].hi, &v))
            return bad_option(num[k].name, argv[i]);
        switch (k) {
        case 0: o->engines = (int)v; break;
        case 1: o->block_size = (size_t)v; break;
        case 2: o->requests = (int)v; break;
        case 3: o->conversations = (int)v; break;
        case 4: o->system_blocks = (int)v; break;
        case 5: o->slots = (int)v; break;
        case 6: o->prefill_ms = v; break;
        case 7: o->time_limit_s = v; break;
        default: o->seed = (uint64_t)v; break;
        }
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
    int n;                      /* children: [0] the router, [1..] the engines */
    pid_t pid[1 + DEMO_MAX_ENGINES];
    int status[1 + DEMO_MAX_ENGINES];
    int to_router, from_router; /* the driver's ends */
} cluster;

enum { P_D2R, P_R2D, P_N };

/* All pipes are made first; each child keeps only its own ends. */
static int pipes[P_N + 2 * DEMO_MAX_ENGINES][2];

static int e2r(int e) { return P_N + 2 * e; }
static int r2e(int e) { return P_N + 2 * e + 1; }

static void close_all_but(int n_pipes, const int *keep, int n_keep)
{
    for (int p = 0; p < n_pipes; p++)
        for (int s = 0; s < 2; s++) {
            bool mine = false;
            for (int k = 0; k < n_keep; k++) mine |= keep[k] == pipes[p][s];
            if (!mine) close(pipes[p][s]);
        }
}

static void kill_all(cluster *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->pid[i] > 0) kill(c->pid[i], SIGKILL);
}

/* Reaps every child, waiting at most `patience` seconds before SIGKILL.
 * 0 when every child exited 0. */
static int reap_all(cluster *c, double patience)
{
    double until = demo_now() + patience;
    int left = 0;
    for (int i = 0; i < c->n; i++) left += c->pid[i] > 0;
    while (left > 0) {
        for (int i = 0; i < c->n; i++) {
            if (c->pid[i] <= 0) continue;
            int st;
            pid_t r = waitpid(c->pid[i], &st, demo_now() > until ? 0 : WNOHANG);
            if (r == c->pid[i] || (r < 0 && errno == ECHILD)) {
                c->status[i] = r == c->pid[i] ? st : 0;
                c->pid[i] = 0;
                left--;
            }
        }
        if (left > 0 && demo_now() > until) kill_all(c); /* then the blocking waits end */
        if (left > 0) usleep(10000);
    }
    int bad = 0;
    for (int i = 0; i < c->n; i++) {
        int st = c->status[i];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        char who[32];
        if (i == 0) snprintf(who, sizeof who, "the router");
        else snprintf(who, sizeof who, "engine %d", i - 1);
        if (WIFSIGNALED(st))
            fprintf(stderr, "kvcr demo: %s was killed by signal %d\n", who, WTERMSIG(st));
        else
            fprintf(stderr, "kvcr demo: %s exited with status %d\n", who, WEXITSTATUS(st));
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
            kill_all(c);
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
        uint64_t chunk = c->n < w->o->system_blocks ? (uint64_t)c->n
                                                     : (c->id << 20 | (uint64_t)c->n);
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

/* ---- figures ---------------------------------------------------------------------- */

typedef struct totals {
    uint64_t requests, blocks, local, remote, recomputed, remote_failed, local_failed;
    uint64_t hinted, hint_refused, deposited, not_stored, verified, wrong, peer_bytes;
    double peer_s, local_s;
} totals;

static void add(totals *t, const demo_result *r)
{
    t->requests++;
    t->blocks += r->n_blocks;
    t->local += r->local_hit;
    t->remote += r->remote_hit;
    t->recomputed += r->recomputed;
    t->remote_failed += r->remote_failed;
    t->local_failed += r->local_failed;
    t->hinted += r->source >= 0;
    t->hint_refused += r->hint_refused;
    t->deposited += r->deposited;
    t->not_stored += r->deposit_not_stored;
    t->verified += r->verified_blocks;
    t->wrong += r->wrong_bytes;
    t->peer_bytes += r->peer_bytes;
    t->peer_s += r->peer_s;
    t->local_s += r->local_s;
}

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0;
}

static void progress(const demo_opts *o, const totals *t, bool last)
{
    static double shown;
    static int tenth;
    bool tty = isatty(STDERR_FILENO);
    double now = demo_now();
    if (tty) {
        if (!last && now - shown < 0.2) return;
        shown = now;
        fprintf(stderr, "\r  %" PRIu64 "/%d requests  hit rate %5.1f%% (local %5.1f%%, peer %5.1f%%)%s",
                t->requests, o->requests, pct(t->local + t->remote, t->blocks),
                pct(t->local, t->blocks), pct(t->remote, t->blocks), last ? "\n" : "");
        return;
    }
    int now_tenth = (int)(t->requests * 10 / (uint64_t)o->requests);
    if (now_tenth == tenth && !last) return;
    if (last && now_tenth == tenth && t->requests != (uint64_t)o->requests) now_tenth = -1;
    tenth = now_tenth;
    fprintf(stderr, "  %" PRIu64 "/%d requests  hit rate %.1f%% (local %.1f%%, peer %.1f%%)\n",
            t->requests, o->requests, pct(t->local + t->remote, t->blocks),
            pct(t->local, t->blocks), pct(t->remote, t->blocks));
}

static void report(const demo_opts *o, const totals *t, const totals *per, int started,
                   double wall)
{
    double mb = (double)o->block_size / 1e6, cost = o->prefill_ms / 1e3;
    double gbs = t->peer_s > 0 ? (double)t->peer_bytes / t->peer_s / 1e9 : 0;
    double all_s = (double)t->blocks * cost;
    double kvcr_s = (double)t->recomputed * cost + t->peer_s + t->local_s;
    if (o->json) {
        printf("{\"engines\":%d,\"requests\":%" PRIu64 ",\"conversations\":%d,\"block_size\":%zu,"
               "\"blocks\":%" PRIu64 ",\"local_g2_hit\":%" PRIu64 ",\"remote_g2_pulled\":%" PRIu64
               ",\"recomputed\":%" PRIu64 ",\"hit_rate\":%.4f,\"local_hit_rate\":%.4f,"
               "\"remote_hit_rate\":%.4f,\"hinted_requests\":%" PRIu64
               ",\"remote_failed\":%" PRIu64 ",\"peer_bytes\":%" PRIu64 ",\"peer_transfer_s\":%.6f,"
               "\"peer_gbps\":%.4f,\"prefill_ms_per_block\":%.4g,\"prefill_all_s\":%.4f,"
               "\"prefill_with_kvcr_s\":%.4f,\"prefill_saved_s\":%.4f,\"verified_blocks\":%" PRIu64
               ",\"wrong_bytes\":%" PRIu64 ",\"wall_s\":%.3f,\"peer_tier\":%s}\n",
               o->engines, t->requests, started, o->block_size, t->blocks, t->local, t->remote,
               t->recomputed, pct(t->local + t->remote, t->blocks) / 100,
               pct(t->local, t->blocks) / 100, pct(t->remote, t->blocks) / 100, t->hinted,
               t->remote_failed, t->peer_bytes, t->peer_s, gbs, o->prefill_ms, all_s, kvcr_s,
               all_s - kvcr_s, t->verified, t->wrong, wall, o->local_only ? "false" : "true");
        return;
    }
    printf("\n%-22s %" PRIu64 " in %.1f s (%d conversations, %" PRIu64 " with a router hint)\n",
           "requests", t->requests, wall, started, t->hinted);
    printf("%-22s %" PRIu64 " of %zu KiB (%.1f MB)\n", "blocks", t->blocks, o->block_size / 1024,
           (double)t->blocks * mb);
    printf("  %-20s %8" PRIu64 "  %5.1f%%\n", "local G2 hit", t->local, pct(t->local, t->blocks));
    printf("  %-20s %8" PRIu64 "  %5.1f%%\n", "remote G2 pulled", t->remote,
           pct(t->remote, t->blocks));
    printf("  %-20s %8" PRIu64 "  %5.1f%%", "recomputed", t->recomputed,
           pct(t->recomputed, t->blocks));
    if (t->remote_failed || t->local_failed)
        printf("  (%" PRIu64 " hinted pulls and %" PRIu64 " local hits failed and were recomputed)",
               t->remote_failed, t->local_failed);
    printf("\n%-22s %.1f%%\n", "hit rate", pct(t->local + t->remote, t->blocks));
    printf("%-22s %.1f MB in %.3f s of transfers: %.2f GB/s\n", "peer to peer",
           (double)t->peer_bytes / 1e6, t->peer_s, gbs);
    printf("%-22s %.2f ms/block: %.2f s recomputing everything, %.2f s with KVCR "
           "(%.2f s recompute + %.3f s deliveries)\n",
           "prefill (modelled)", o->prefill_ms, all_s, kvcr_s, (double)t->recomputed * cost,
           t->peer_s + t->local_s);
    printf("%-22s %.2f s (%.1f%%)\n", "prefill time saved", all_s - kvcr_s,
           all_s > 0 ? 100 * (all_s - kvcr_s) / all_s : 0);
    printf("%-22s %" PRIu64 " blocks delivered and verified, %" PRIu64 " wrong bytes%s\n",
           "verification", t->verified, t->wrong, t->wrong ? "  <-- FAILED" : "");
    printf("\n%-8s %8s %8s %8s %10s %10s\n", "engine", "requests", "local", "pulled", "recomputed",
           "peer MB");
    for (int e = 0; e < o->engines; e++)
        printf("%-8d %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %10.1f\n", e,
               per[e].requests, per[e].local, per[e].remote, per[e].recomputed,
               (double)per[e].peer_bytes / 1e6);
    fflush(stdout);
}

/* ---- the driver ------------------------------------------------------------------- */

/* Sends requests (one in flight per engine) until all are answered. */
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
    int sent = 0, in_flight = 0, max_in_flight = o->engines;
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
            progress(o, t, true);
            fprintf(stderr, "kvcr demo: FAILED: the time limit of %.0f s passed with %" PRIu64
                            " of %d requests answered\n",
                    o->time_limit_s, t->requests, o->requests);
            rc = 1;
            goto out;
        }
        if (demo_recv(cl->from_router, &type, msg, sizeof msg - 1, &len, deadline) != 0) {
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
        add(t, &r);
        add(&per[r.engine], &r);
        in_flight--;
        conv *c = &w->c[conv_of[r.req_no]];
        c->busy = false;
        conv_next(w, c);
        progress(o, t, t->requests == (uint64_t)o->requests);
    }
out:
    free(conv_of);
    return rc;
}

int cmd_demo(int argc, char **argv)
{
    demo_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0) return rc;
    double t0 = demo_now(), deadline = t0 + o.time_limit_s;
    signal(SIGPIPE, SIG_IGN);
    if (!o.json)
        printf("kvcr demo: %d engines + a router, %d requests over %d conversations, "
               "%zu KiB blocks, %d KVCR DRAM slots per engine, seed %" PRIu64 "%s\n",
               o.engines, o.requests, o.conversations, o.block_size / 1024, o.slots, o.seed,
               o.local_only ? " (peer tier off)" : "");

    cluster cl = {0};
    if (start_cluster(&o, &cl, deadline) != 0) return 1;

    workload w = {.o = &o, .rng = o.seed, .root = demo_mix(o.seed ^ 0x726f6f74ull)};
    w.c = calloc((size_t)o.conversations, sizeof *w.c);
    totals t = {0}, per[DEMO_MAX_ENGINES] = {{0}};
    if (w.c == NULL) {
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
        kill_all(&cl);
        reap_all(&cl, 5);
    }
    close(cl.to_router);
    close(cl.from_router);
    if (rc == 0) report(&o, &t, per, w.started, wall);
    free(w.c);
    if (rc != 0) {
        fprintf(stderr, "kvcr demo: FAILED\n");
        return 1;
    }
    if (t.wrong > 0 || t.hint_refused > 0) {
        fprintf(stderr, "kvcr demo: FAILED: %" PRIu64 " wrong bytes in delivered blocks, %" PRIu64
                        " router hints refused\n", t.wrong, t.hint_refused);
        return 1;
    }
    if (!o.local_only && t.hinted > 0 && t.remote == 0) {
        fprintf(stderr, "kvcr demo: FAILED: %" PRIu64 " requests carried a router hint but no "
                        "block was pulled from a peer (%" PRIu64 " pulls failed)\n",
                t.hinted, t.remote_failed);
        return 1;
    }
    return 0;
}
