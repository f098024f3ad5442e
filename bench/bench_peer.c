/* kvcr-bench peer: peer-to-peer bandwidth between two processes on this
 * host, 2 MiB and 16 KiB blocks, against a plain UCX put loop and against
 * Redis GETs, all measured in the same run; once on UCX's default lanes
 * (shared memory between two processes on one host) and once with
 * UCX_TLS=tcp.
 *
 * The parent only orchestrates: every UCX user (the raw UCX pair, the two
 * KVCR instances) is a child forked by it, and the parent itself never
 * initialises UCX (UCX and fork do not mix). Children talk to the parent
 * over pipes in length-prefixed messages; the parent relays what one side
 * of a pair must tell the other (worker address and rkey, or the source's
 * control endpoint). A child that fails prints why and exits 1; the parent
 * then names it, kills and reaps every child and redis-server, and exits 1.
 *
 * The Redis baseline is built only when CMake found hiredis
 * (KVCR_HAVE_HIREDIS); without it the bench says so and measures the rest.
 *
 * --curve measures only what CURVE on the control channel costs: one 4 KiB
 * block per deliver (so the start_write / write_done round trip dominates),
 * between a plaintext pair and a CURVE pair in the same run.
 *
 * --netns runs every pair across two hosts of the netns rig (tools/netrig.h:
 * network, IPC and UTS namespaces joined by veth links, so UCX sees another
 * machine and has only TCP): the source side on host 0, the receiving side
 * on host 1. Children there are this program again (--netns-child, with the
 * role, the job and their pipe descriptors as arguments), since the rig
 * starts programs, not functions. Baselines of the same run: a plain TCP
 * stream (a socket loop, blocking sends and MSG_WAITALL receives), raw UCX
 * in the best of several configurations (then run alternating with ours),
 * and pipelined Redis GETs from a redis-server on host 0. Without
 * root (or without the rig's tools) it says why and prints no figures. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef KVCR_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif
#include <ucp/api/ucp.h>

#include "bench.h"
#include "keygen.h"
#include "kvcr/kvcr.h"
#include "netrig.h"

#define MIB (1024u * 1024u)
/* Every wait is bounded: an operation's own deadline comes first, so a stuck
 * transfer is reported with KVCR's reason rather than by our wait. */
#define OP_TIMEOUT_MS 30000u
#define WAIT_LIMIT_S 35.0
#define START_LIMIT_S 30.0 /* a child's start-up: instance, deposits */
#define CHILD_LIMIT_S 120.0 /* a child's whole life */
#define CASE_BUDGET_S 5.0   /* rounds after the first stop once this went by */
#define REDIS_START_S 10.0
#define RAW_IDLE_SPINS 64   /* idle progress calls before the raw loop yields */
/* The TCP segment sizes KVCR's UCX context uses unless the environment sets
 * them (src/net/ucx.c), as "TX,RX": the raw UCX pairs over TCP use them too. */
#define KVCR_TCP_SEGS "128k,512k"

/* One case: n blocks of `block` bytes (the working set, on each side),
 * moved in batches of `batch` blocks per deliver / put-and-flush /
 * pipelined GETs; a round moves the whole set, best of `rounds`. */
/* CURVE key pairs of a KVCR pair: [0] the source's, [1] the target's. */
typedef struct pair_keys {
    char pub[2][KEYGEN_Z85], sec[2][KEYGEN_Z85];
} pair_keys;

typedef struct job {
    const char *tls; /* NULL: UCX's default lanes, else the value of UCX_TLS */
    size_t block, n, batch;
    int rounds;
    const pair_keys *curve; /* KVCR pairs: NULL for plaintext control */
    const char *seg; /* raw UCX: NULL, UCX's TCP segment sizes, or "TX,RX" sizes */
    uint32_t hint_lead_us; /* KVCR target: round 0's hint this long before its deliver */
} job;

/* What the measuring side of a pair sends the parent. */
typedef struct pair_result {
    double gbs;
    uint64_t shift;  /* the last round, for check_dest */
    double first_s;  /* KVCR: the first round (connections made), */
    double median_s; /* and the median round, seconds */
} pair_result;

/* Where block i lands in round `shift`: element (i * 5 + shift) mod n. The
 * destinations are scattered, as an engine's free blocks are, so that no
 * side can merge neighbouring blocks into one larger transfer; n is a power
 * of two, so this is a permutation. */
static size_t dest(const job *j, size_t i, uint64_t shift)
{
    return (size_t)((i * 5 + shift) % j->n);
}

/* After the last round, every destination must hold its block: a round that
 * moved nothing leaves the previous round's bytes there, which differ. */
static void check_dest(const uint8_t *dst, const job *j, uint64_t shift, const char *who)
{
    for (size_t i = 0; i < j->n; i++)
        if (!bench_has_block(dst + dest(j, i, shift) * j->block, j->block, i + 1))
            bench_fail("%s: block %zu arrived with the wrong bytes", who, i);
}

static const char *size_name(const job *j)
{
    return j->block >= MIB ? "2 MiB" : j->block >= 16 * 1024 ? "16 KiB" : "4 KiB";
}

/* ---- pipes ----------------------------------------------------------------- */

/* Messages are a u32 length and that many bytes, in one write (as far as
 * the pipe allows): a reader never sees a length without its bytes. */
static bool msg_send(int fd, const void *buf, uint32_t len)
{
    uint8_t small[4 + 256];
    if (len > sizeof small - sizeof len)
        return tool_write_full(fd, &len, sizeof len) == 0 && tool_write_full(fd, buf, len) == 0;
    memcpy(small, &len, sizeof len);
    memcpy(small + sizeof len, buf, len);
    return tool_write_full(fd, small, sizeof len + len) == 0;
}

/* Returns the length, or -1 on timeout, end of file or a message longer
 * than cap. */
static long msg_recv(int fd, void *buf, uint32_t cap, double timeout_s)
{
    double until = tool_now() + timeout_s;
    uint32_t len;
    if (tool_read_full(fd, &len, sizeof len, until) != 0 || len > cap) return -1;
    if (tool_read_full(fd, buf, len, until) != 0) return -1;
    return (long)len;
}

/* ---- children -------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    int to, from; /* the parent's ends of the pipes */
    char what[96];
} child;

enum { MAX_LIVE = 4 };
static pid_t g_parent;
/* --netns: the rig (parent), and a child's own host address (children). */
static netrig *g_rig;
static const char *g_bind;
static char g_exe[4096];
static child *g_live[MAX_LIVE];
#ifdef KVCR_HAVE_HIREDIS
static pid_t g_redis;
static char g_redis_log[64];
#endif

static void live_drop(const child *c)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == c) g_live[i] = NULL;
}

static void kill_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

/* At exit of the parent (also after bench_fail): no child outlives it. */
static void cleanup(void)
{
    if (getpid() != g_parent) return;
    for (int i = 0; i < MAX_LIVE; i++) {
        if (g_live[i] == NULL) continue;
        close(g_live[i]->to);
        close(g_live[i]->from);
        kill_reap(g_live[i]->pid);
        g_live[i] = NULL;
    }
#ifdef KVCR_HAVE_HIREDIS
    if (g_redis > 0) {
        kill_reap(g_redis);
        g_redis = 0;
    }
    if (g_redis_log[0]) unlink(g_redis_log);
#endif
    netrig_down(g_rig); /* after its hosts' processes are reaped */
    g_rig = NULL;
}

/* In a child: die with the parent, and hold no other child's pipes (so each
 * child sees end of file when the parent closes its end). Its stdout is the
 * parent's stderr: UCX logs to stdout, and only the parent's figures (one
 * JSON object a line with --json) may appear there. */
static void in_child(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != g_parent) _exit(1);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    for (int i = 0; i < MAX_LIVE; i++) {
        if (g_live[i] == NULL) continue;
        close(g_live[i]->to);
        close(g_live[i]->from);
        g_live[i] = NULL;
    }
}

typedef void (*child_main)(const job *j, int in, int out);

static const char *role_name(child_main fn);

/* A job's raw UCX segment sizes ("TX,RX") into the environment, before
 * anything initialises UCX in this process. */
static void seg_env(const char *seg)
{
    if (seg == NULL) return;
    char tx[16];
    snprintf(tx, sizeof tx, "%.*s", (int)strcspn(seg, ","), seg);
    setenv("UCX_TCP_TX_SEG_SIZE", tx, 1);
    setenv("UCX_TCP_RX_SEG_SIZE", seg + strcspn(seg, ",") + (seg[strcspn(seg, ",")] != 0), 1);
}

/* --netns: starts fn's role on rig host `host` as this program again, with
 * in and out (the child's pipe ends) as its descriptors. */
static pid_t rig_spawn(child_main fn, const job *j, unsigned host, int in, int out)
{
    char a[10][48];
    snprintf(a[0], sizeof a[0], "%d", in);
    snprintf(a[1], sizeof a[1], "%d", out);
    snprintf(a[2], sizeof a[2], "%zu", j->block);
    snprintf(a[3], sizeof a[3], "%zu", j->n);
    snprintf(a[4], sizeof a[4], "%zu", j->batch);
    snprintf(a[5], sizeof a[5], "%d", j->rounds);
    snprintf(a[6], sizeof a[6], "%s", j->tls ? j->tls : "-");
    snprintf(a[7], sizeof a[7], "%s", j->seg ? j->seg : "-");
    snprintf(a[8], sizeof a[8], "%s", netrig_addr(g_rig, host));
    snprintf(a[9], sizeof a[9], "%u", (unsigned)j->hint_lead_us);
    if (fcntl(in, F_SETFD, 0) != 0 || fcntl(out, F_SETFD, 0) != 0)
        bench_fail("fcntl: %s", strerror(errno));
    char *argv[] = {g_exe, "peer", "--netns-child", (char *)role_name(fn),
                    a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], NULL};
    pid_t pid = netrig_spawn(g_rig, host, argv, NULL);
    if (pid < 0)
        bench_fail("cannot start the %s on rig host %u: %s", argv[3], host,
                   netrig_last_error(g_rig));
    return pid;
}

/* Starts fn as a child: forked here, or with --netns on rig host `host`
 * (0 holds the data, 1 receives it). */
static void child_spawn(child *c, const char *what, child_main fn, const job *j, unsigned host)
{
    snprintf(c->what, sizeof c->what, "%s (%s, %s lanes)", what, size_name(j),
             j->tls ? j->tls : "default");
    int down[2], up[2];
    /* Close-on-exec: no program started later holds another child's pipes. */
    if (pipe(down) != 0 || pipe(up) != 0) bench_fail("pipe: %s", strerror(errno));
    for (int i = 0; i < 2; i++)
        if (fcntl(down[i], F_SETFD, FD_CLOEXEC) != 0 || fcntl(up[i], F_SETFD, FD_CLOEXEC) != 0)
            bench_fail("fcntl: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = g_rig ? rig_spawn(fn, j, host, down[0], up[1]) : fork();
    if (pid < 0) bench_fail("fork: %s", strerror(errno));
    if (pid == 0) {
        in_child();
        close(down[1]);
        close(up[0]);
        /* Before anything initialises UCX in this process. */
        if (j->tls) setenv("UCX_TLS", j->tls, 1);
        seg_env(j->seg);
        fn(j, down[0], up[1]);
        exit(0);
    }
    close(down[0]);
    close(up[1]);
    c->pid = pid;
    c->to = down[1];
    c->from = up[0];
    for (int i = 0; i < MAX_LIVE; i++)
        if (g_live[i] == NULL) {
            g_live[i] = c;
            return;
        }
    bench_fail("internal: more than %d children", MAX_LIVE);
}

/* Waits (bounded) for the child to exit; true if it exited 0. */
static bool child_reap(child *c, double timeout_s, int *status)
{
    close(c->to);
    close(c->from);
    live_drop(c);
    double until = tool_now() + timeout_s;
    for (;;) {
        pid_t r = waitpid(c->pid, status, WNOHANG);
        if (r == c->pid) return WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
        if (r < 0 && errno != EINTR) {
            *status = -1;
            return false;
        }
        if (tool_now() > until) {
            kill_reap(c->pid);
            *status = -1;
            return false;
        }
        usleep(5000);
    }
}

static _Noreturn void child_failed(child *c, const char *doing)
{
    int status = 0;
    child_reap(c, 3.0, &status);
    if (status == -1)
        bench_fail("the %s did not answer while %s (killed)", c->what, doing);
    if (WIFSIGNALED(status))
        bench_fail("the %s died of signal %d while %s", c->what, WTERMSIG(status), doing);
    bench_fail("the %s failed while %s (exit status %d; its message is above)", c->what, doing,
               WIFEXITED(status) ? WEXITSTATUS(status) : status);
}

static void child_done(child *c)
{
    int status = 0;
    if (!child_reap(c, 10.0, &status)) {
        if (status == -1) bench_fail("the %s did not exit within 10 s (killed)", c->what);
        bench_fail("the %s exited with status %d", c->what,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
    }
}

static void to_child(child *c, const void *buf, uint32_t len, const char *doing)
{
    if (!msg_send(c->to, buf, len)) child_failed(c, doing);
}

static long from_child(child *c, void *buf, uint32_t cap, double timeout_s, const char *doing)
{
    long n = msg_recv(c->from, buf, cap, timeout_s);
    if (n < 0) child_failed(c, doing);
    return n;
}

/* In a child: the parent is gone or broke the protocol. */
static void up_send(int out, const void *buf, uint32_t len, const char *who)
{
    if (!msg_send(out, buf, len)) bench_fail("%s: the parent is gone", who);
}

static long down_recv(int in, void *buf, uint32_t cap, double timeout_s, const char *who)
{
    long n = msg_recv(in, buf, cap, timeout_s);
    if (n < 0) bench_fail("%s: the parent is gone or sent nothing within %.0f s", who, timeout_s);
    return n;
}

/* ---- (a) raw UCX: a plain put loop ------------------------------------------- */

/* What the raw target tells the source: where to write. */
typedef struct raw_hello {
    uint64_t base;
    uint32_t addr_len, rkey_len;
    uint8_t bytes[4096]; /* worker address, then packed rkey */
} raw_hello;

typedef struct raw_side {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    uint8_t *buf;
    size_t len;
    const char *who;
} raw_side;

static void ucs_check(ucs_status_t st, const raw_side *s, const char *what)
{
    if (st != UCS_OK) bench_fail("%s: %s: %s", s->who, what, ucs_status_string(st));
}

static void raw_start(raw_side *s, const char *who, const job *j)
{
    s->who = who;
    s->len = j->n * j->block;
    /* The context KVCR creates (src/net/ucx.c): shared memory lanes with
     * peer error handling, keepalive every second, RMA with wakeup. (With
     * UCX_TLS=tcp no shared memory transport reads the variable, and UCX
     * would warn that it is unused.) Its TCP segment sizes come from the
     * job (seg_env, at the child's start). */
    if (j->tls == NULL) setenv("UCX_MM_ERROR_HANDLING", "y", 0);
    ucp_config_t *cfg;
    ucs_check(ucp_config_read(NULL, NULL, &cfg), s, "ucp_config_read");
    if (getenv("UCX_KEEPALIVE_INTERVAL") == NULL)
        (void)ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "1s");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
    ucs_status_t st = ucp_init(&p, cfg, &s->ctx);
    ucp_config_release(cfg);
    ucs_check(st, s, "ucp_init");
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_check(ucp_worker_create(s->ctx, &wp, &s->worker), s, "ucp_worker_create");
    s->buf = bench_xalloc(s->len);
    memset(s->buf, 0, s->len); /* every page touched before timing */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = s->buf,
        .length = s->len};
    ucs_check(ucp_mem_map(s->ctx, &mp, &s->memh), s, "ucp_mem_map");
}

static void raw_stop(raw_side *s)
{
    ucp_mem_unmap(s->ctx, s->memh);
    ucp_worker_destroy(s->worker);
    ucp_cleanup(s->ctx);
    free(s->buf);
}

/* One progress call. The loops spin on it (the raw loop at its best on an
 * idle host), but give the CPU away after a run of calls that found
 * nothing: with two vCPUs, a peer or any other process that needs the CPU
 * would otherwise wait for the end of our time slice, and the emulated puts
 * need both sides to progress. */
static void raw_progress(raw_side *s, unsigned *idle)
{
    if (ucp_worker_progress(s->worker) != 0) {
        *idle = 0;
    } else if (++*idle == RAW_IDLE_SPINS) {
        *idle = 0;
        sched_yield();
    }
}

/* Progresses until the request completes (bounded); NULL is done already. */
static void raw_wait(raw_side *s, void *req, const char *what)
{
    if (req == NULL) return;
    if (UCS_PTR_IS_ERR(req)) ucs_check(UCS_PTR_STATUS(req), s, what);
    double until = tool_now() + WAIT_LIMIT_S;
    ucs_status_t st;
    unsigned spins = 0, idle = 0;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        raw_progress(s, &idle);
        if ((++spins & 1023) == 0 && tool_now() > until) {
            ucp_request_cancel(s->worker, req);
            bench_fail("%s: %s did not complete within %.0f s", s->who, what, WAIT_LIMIT_S);
        }
    }
    ucp_request_free(req);
    ucs_check(st, s, what);
}

static bool g_raw_ep_failed;

static void raw_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status;
    g_raw_ep_failed = true;
}

/* The target registers its buffer, hands out where to write, and keeps its
 * worker progressing until the source is done (UCX 1.13 emulates these puts
 * with messages the target's worker copies into place, over shared memory
 * and over TCP alike); then it checks the bytes. */
static void raw_target(const job *j, int in, int out)
{
    const char *who = "raw UCX target";
    raw_side s;
    raw_start(&s, who, j);
    ucp_address_t *addr;
    size_t addr_len;
    ucs_check(ucp_worker_get_address(s.worker, &addr, &addr_len), &s, "ucp_worker_get_address");
    void *rkey;
    size_t rkey_len;
    ucs_check(ucp_rkey_pack(s.ctx, s.memh, &rkey, &rkey_len), &s, "ucp_rkey_pack");
    static raw_hello h;
    if (addr_len + rkey_len > sizeof h.bytes)
        bench_fail("%s: worker address and rkey take %zu bytes", who, addr_len + rkey_len);
    h.base = (uint64_t)(uintptr_t)s.buf;
    h.addr_len = (uint32_t)addr_len;
    h.rkey_len = (uint32_t)rkey_len;
    memcpy(h.bytes, addr, addr_len);
    memcpy(h.bytes + addr_len, rkey, rkey_len);
    ucp_rkey_buffer_release(rkey);
    up_send(out, &h, (uint32_t)(offsetof(raw_hello, bytes) + addr_len + rkey_len), who);

    double until = tool_now() + CHILD_LIMIT_S;
    unsigned idle = 0;
    for (unsigned spins = 1;; spins++) {
        raw_progress(&s, &idle);
        if ((spins & 255) != 0) continue;
        struct pollfd p = {in, POLLIN, 0};
        if (poll(&p, 1, 0) > 0) break;
        if (tool_now() > until) bench_fail("%s: the source did not finish", who);
    }
    uint64_t shift;
    if (down_recv(in, &shift, sizeof shift, 1.0, who) != sizeof shift)
        bench_fail("%s: bad message", who);
    check_dest(s.buf, j, shift, who);
    uint8_t ok = 1;
    up_send(out, &ok, 1, who);
    ucp_worker_release_address(s.worker, addr);
    raw_stop(&s);
}

/* The source puts every block of a batch, flushes the endpoint, and counts
 * a round done when every batch's flush completed. */
static void raw_source(const job *j, int in, int out)
{
    const char *who = "raw UCX source";
    raw_side s;
    raw_start(&s, who, j);
    for (size_t i = 0; i < j->n; i++) bench_fill_block(s.buf + i * j->block, j->block, i + 1);
    static raw_hello h;
    long len = down_recv(in, &h, sizeof h, START_LIMIT_S, who);
    if (len < (long)offsetof(raw_hello, bytes) ||
        (size_t)len != offsetof(raw_hello, bytes) + h.addr_len + h.rkey_len)
        bench_fail("%s: bad address message", who);

    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)h.bytes,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {raw_ep_error, NULL}};
    ucp_ep_h ep;
    ucs_check(ucp_ep_create(s.worker, &ep_params, &ep), &s, "ucp_ep_create");
    ucp_rkey_h rkey;
    ucs_check(ucp_ep_rkey_unpack(ep, h.bytes + h.addr_len, &rkey), &s, "ucp_ep_rkey_unpack");

    ucp_request_param_t put = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH, .memh = s.memh};
    ucp_request_param_t flush = {.op_attr_mask = 0};
    double best = 0, until = tool_now() + CASE_BUDGET_S;
    uint64_t shift = 0;
    for (int r = 0; r < j->rounds && (r == 0 || tool_now() < until); r++) {
        shift = (uint64_t)r + 1;
        double t0 = tool_now();
        for (size_t first = 0; first < j->n; first += j->batch) {
            size_t end = first + j->batch < j->n ? first + j->batch : j->n;
            for (size_t i = first; i < end; i++) {
                uint64_t to = h.base + dest(j, i, shift) * j->block;
                void *req = ucp_put_nbx(ep, s.buf + i * j->block, j->block, to, rkey, &put);
                if (UCS_PTR_IS_ERR(req)) ucs_check(UCS_PTR_STATUS(req), &s, "ucp_put_nbx");
                if (req != NULL) ucp_request_free(req); /* the flush covers it */
            }
            raw_wait(&s, ucp_ep_flush_nbx(ep, &flush), "ucp_ep_flush_nbx");
            if (g_raw_ep_failed) bench_fail("%s: the endpoint failed", who);
        }
        double v = bench_gbs(j->n * j->block, tool_now() - t0);
        if (v > best) best = v;
    }
    ucp_rkey_destroy(rkey);
    raw_wait(&s, ucp_ep_close_nbx(ep, &flush), "ucp_ep_close_nbx");
    pair_result res = {best, shift};
    up_send(out, &res, sizeof res, who);
    raw_stop(&s);
}

/* ---- (c) KVCR: two instances, a router hint, deliver ------------------------ */

typedef struct kv_side {
    kvcr_t *kv;
    int fd;
    uint8_t *fw, *pool;
    const char *who;
    char (*names)[24];
    kvcr_mem_ref *refs;
    kvcr_block *blocks;
} kv_side;

static void kv_check(int rc, const kv_side *s, const char *what)
{
    if (rc != 0)
        bench_fail("%s: %s failed: %s: %s", s->who, what, kvcr_strerror(rc), kvcr_last_error());
}

/* A source holds the set in KVCR DRAM; a target has no KVCR DRAM at all, so
 * a deliver can only be served by the peer. */
static void kv_start(kv_side *s, const char *who, const job *j, bool source)
{
    s->who = who;
    size_t bytes = j->n * j->block;
    s->fw = bench_xalloc(bytes);
    memset(s->fw, 0, bytes);
    s->pool = NULL;
    kvcr_pool_layout layout = {"", j->block};
    kvcr_dram_pool pool = {"", NULL, bytes};
    kvcr_region region = {.addr = s->fw, .element_size = j->block, .count = j->n, .label = ""};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = source ? "bench-source" : "bench-target";
    cfg.pool_layouts = &layout;
    cfg.n_pool_layouts = 1;
    if (source) {
        s->pool = bench_xalloc(bytes);
        memset(s->pool, 0, bytes);
        pool.addr = s->pool;
        cfg.local_dram = &pool;
        cfg.n_local_dram = 1;
    }
    cfg.framework_regions = &region;
    cfg.n_framework_regions = 1;
    tool_remote_peer(&cfg);
    if (g_bind != NULL) cfg.remote.control_host = g_bind; /* --netns: this host's address */
    cfg.remote.control_port = 0;
    cfg.operation_timeout_ms = OP_TIMEOUT_MS;
    cfg.abandon_timeout_ms = 2 * OP_TIMEOUT_MS;
    const char *other[1];
    if (j->curve) { /* each side admits the other's key only */
        other[0] = j->curve->pub[source ? 1 : 0];
        cfg.remote.curve = (kvcr_curve_options){j->curve->sec[source ? 0 : 1], NULL, other, 1};
    }
    kv_check(kvcr_create(&cfg, &s->kv), s, "kvcr_create");
    s->fd = kvcr_fd(s->kv);
    if (s->fd < 0) kv_check(s->fd, s, "kvcr_fd");
    s->names = malloc(j->batch * sizeof *s->names);
    s->refs = malloc(j->batch * sizeof *s->refs);
    s->blocks = malloc(j->batch * sizeof *s->blocks);
    if (!s->names || !s->refs || !s->blocks) bench_fail("%s: out of memory", who);
}

static void kv_stop(kv_side *s)
{
    kvcr_free(s->kv);
    free(s->fw);
    free(s->pool);
    free(s->names);
    free(s->refs);
    free(s->blocks);
}

/* Keys [first, end) into their destinations of round `shift`. */
static size_t kv_batch(kv_side *s, const job *j, size_t first, uint64_t shift)
{
    size_t end = first + j->batch < j->n ? first + j->batch : j->n;
    for (size_t i = first; i < end; i++) {
        size_t k = i - first;
        int len = snprintf(s->names[k], sizeof s->names[k], "k%zu", i);
        s->refs[k] = (kvcr_mem_ref){NULL, "", dest(j, i, shift)};
        s->blocks[k] = (kvcr_block){{(const uint8_t *)s->names[k], (size_t)len}, &s->refs[k], 1};
    }
    return end - first;
}

/* Polls until op completes; every entry must be a success. */
static void kv_wait(kv_side *s, kvcr_op_handle op, size_t n, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", s->who, what);
    kvcr_results_free(bench_wait_op(s->kv, s->fd, op, n, msg, WAIT_LIMIT_S, NULL));
}

/* Deposits the set into its KVCR DRAM, tells the parent its control
 * endpoint, then serves peers until told to stop. */
static void kv_source(const job *j, int in, int out)
{
    kv_side s;
    kv_start(&s, "KVCR source", j, true);
    for (size_t i = 0; i < j->n; i++) bench_fill_block(s.fw + i * j->block, j->block, i + 1);
    for (size_t first = 0; first < j->n; first += j->batch) {
        size_t n = kv_batch(&s, j, first, 0);
        for (size_t k = 0; k < n; k++) s.refs[k].index = first + k;
        kvcr_op_handle op;
        kv_check(kvcr_deposit(s.kv, s.blocks, n, 0, &op), &s, "kvcr_deposit");
        kv_wait(&s, op, n, "kvcr_deposit");
    }
    /* Only KVCR DRAM holds the blocks now. */
    memset(s.fw, 0, j->n * j->block);
    const char *ep = kvcr_control_endpoint(s.kv);
    if (ep == NULL) bench_fail("%s: kvcr_control_endpoint is NULL with the remote tier on", s.who);
    up_send(out, ep, (uint32_t)strlen(ep), s.who);

    double until = tool_now() + CHILD_LIMIT_S;
    for (;;) {
        struct pollfd fds[2] = {{in, POLLIN, 0}, {s.fd, POLLIN, 0}};
        poll(fds, 2, 5);
        kvcr_op_result *res;
        size_t n_res;
        kv_check(kvcr_poll(s.kv, &res, &n_res), &s, "kvcr_poll");
        kvcr_results_free(res);
        if (fds[0].revents & (POLLIN | POLLHUP)) {
            /* Take the whole stop message before leaving: exiting on its
             * first bytes would fail the parent's write of the rest. */
            uint8_t stop;
            msg_recv(in, &stop, 1, 1.0);
            break; /* stop, or the parent is gone */
        }
        if (tool_now() > until) bench_fail("%s: not told to stop within %.0f s", s.who, CHILD_LIMIT_S);
    }
    kv_stop(&s);
}

/* Each round: a hint for a fresh request id naming every block at the
 * source (untimed: the router's hint precedes the engine's request), then
 * the set delivered batch by batch into framework memory, timed from the
 * first submission to the last result. */
static void kv_target(const job *j, int in, int out)
{
    kv_side s;
    kv_start(&s, "KVCR target", j, false);
    char source[256];
    long len = down_recv(in, source, sizeof source - 1, START_LIMIT_S, s.who);
    source[len] = '\0';

    size_t cap = 256 + strlen(source) + j->n * 21; /* 21: a comma and a u64 */
    char *json = malloc(cap);
    if (json == NULL) bench_fail("%s: out of memory", s.who);
    size_t at = (size_t)snprintf(json, cap,
                                 "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":"
                                 "\"kv.fetch\",\"action_version\":\"1.0\",\"payload\":{"
                                 "\"source_control_endpoint\":\"%s\",\"block_hashes\":[",
                                 source);
    for (size_t i = 0; i < j->n && at < cap; i++)
        at += (size_t)snprintf(json + at, cap - at, "%s%zu", i ? "," : "", i);
    if (at < cap) at += (size_t)snprintf(json + at, cap - at, "]}}]}");
    if (at >= cap) bench_fail("%s: internal: hint longer than %zu bytes", s.who, cap);

    double best = 0, until = tool_now() + CASE_BUDGET_S;
    double *times = malloc((size_t)j->rounds * sizeof *times);
    if (times == NULL) bench_fail("%s: out of memory", s.who);
    uint64_t shift = 0;
    int r = 0;
    for (; r < j->rounds && (r == 0 || tool_now() < until); r++) {
        shift = (uint64_t)r + 1;
        char request[32];
        snprintf(request, sizeof request, "bench-%d", r);
        kv_check(kvcr_submit_hint(s.kv, request, json, at), &s, "kvcr_submit_hint");
        if (r == 0 && j->hint_lead_us > 0) usleep(j->hint_lead_us); /* its thread acts */
        double t0 = tool_now();
        for (size_t first = 0; first < j->n; first += j->batch) {
            size_t n = kv_batch(&s, j, first, shift);
            kvcr_op_handle op;
            kv_check(kvcr_deliver(s.kv, s.blocks, n, request, &op), &s, "kvcr_deliver");
            kv_wait(&s, op, n, "kvcr_deliver");
        }
        times[r] = tool_now() - t0;
        double v = bench_gbs(j->n * j->block, times[r]);
        if (v > best) best = v;
        kv_check(kvcr_discard_hint(s.kv, request), &s, "kvcr_discard_hint");
    }
    check_dest(s.fw, j, shift, s.who);
    free(json);
    pair_result res = {best, shift, times[0], 0};
    res.median_s = bench_median(times, (size_t)r);
    free(times);
    up_send(out, &res, sizeof res, s.who);
    /* The source closes first, while this instance still answers it: a
     * peer that vanished under it would be logged as unreachable. */
    uint8_t stop;
    down_recv(in, &stop, 1, CHILD_LIMIT_S, s.who);
    kv_stop(&s);
}

/* ---- running a pair ----------------------------------------------------------- */

static double raw_pair(const job *j)
{
    child tgt, src;
    child_spawn(&tgt, "raw UCX target", raw_target, j, 1);
    child_spawn(&src, "raw UCX source", raw_source, j, 0);
    static raw_hello h;
    long len = from_child(&tgt, &h, sizeof h, START_LIMIT_S, "starting");
    to_child(&src, &h, (uint32_t)len, "starting");
    pair_result res;
    if (from_child(&src, &res, sizeof res, CHILD_LIMIT_S, "putting") != sizeof res)
        bench_fail("the %s sent a bad result", src.what);
    child_done(&src);
    to_child(&tgt, &res.shift, sizeof res.shift, "checking the bytes");
    uint8_t ok;
    if (from_child(&tgt, &ok, 1, WAIT_LIMIT_S, "checking the bytes") != 1 || ok != 1)
        bench_fail("the %s sent a bad verdict", tgt.what);
    child_done(&tgt);
    return res.gbs;
}

static pair_result kvcr_pair(const job *j)
{
    child src, tgt;
    child_spawn(&src, "KVCR source", kv_source, j, 0);
    child_spawn(&tgt, "KVCR target", kv_target, j, 1);
    char ep[256];
    long len = from_child(&src, ep, sizeof ep, START_LIMIT_S, "depositing");
    to_child(&tgt, ep, (uint32_t)len, "starting");
    pair_result res;
    if (from_child(&tgt, &res, sizeof res, CHILD_LIMIT_S, "delivering") != sizeof res)
        bench_fail("the %s sent a bad result", tgt.what);
    uint8_t stop = 's';
    to_child(&src, &stop, 1, "stopping");
    child_done(&src);
    to_child(&tgt, &stop, 1, "stopping");
    child_done(&tgt);
    return res;
}

/* ---- (b) Redis ----------------------------------------------------------------- */
#ifdef KVCR_HAVE_HIREDIS

static uint16_t free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) bench_fail("socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        bench_fail("cannot find a free port on 127.0.0.1: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static void redis_log_tail(void)
{
    FILE *f = fopen(g_redis_log, "r");
    if (f == NULL) return;
    char line[512];
    fprintf(stderr, "kvcr: redis-server's log (%s):\n", g_redis_log);
    while (fgets(line, sizeof line, f)) fprintf(stderr, "  %s", line);
    fclose(f);
}

static redisContext *redis_connect(const char *host, uint16_t port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err) {
        redisFree(c);
        return NULL;
    }
    redisReply *r = redisCommand(c, "PING");
    bool ok = r != NULL && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
    if (r) freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    struct timeval io = {(long)WAIT_LIMIT_S, 0}; /* every read and write bounded */
    redisSetTimeout(c, io);
    return c;
}

/* Starts redis-server without persistence on bind:port, forked here or
 * with --netns on rig host 0; its pid is g_redis. */
static void redis_server_start(const char *bind, const char *port_s)
{
    snprintf(g_redis_log, sizeof g_redis_log, "/tmp/kvcr-bench-redis-%d.log", (int)getpid());
    char *argv[] = {"redis-server", "--port", (char *)port_s, "--bind", (char *)bind,
                    "--protected-mode", "no", "--save", "", "--appendonly", "no",
                    "--daemonize", "no", "--logfile", g_redis_log, NULL};
    fflush(NULL);
    if (g_rig) {
        g_redis = netrig_spawn(g_rig, 0, argv, NULL);
        if (g_redis < 0) {
            g_redis = 0;
            bench_fail("cannot start redis-server on rig host 0: %s", netrig_last_error(g_rig));
        }
        return;
    }
    pid_t pid = fork();
    if (pid < 0) bench_fail("fork: %s", strerror(errno));
    if (pid == 0) {
        in_child();
        execvp("redis-server", argv);
        fprintf(stderr, "kvcr: cannot run redis-server: %s (scripts/setup.sh installs it)\n",
                strerror(errno));
        _exit(127);
    }
    g_redis = pid;
}

/* Starts redis-server on 127.0.0.1; returns a connection once it answers
 * PING (bounded). */
static redisContext *redis_start(void)
{
    uint16_t port = free_port();
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%u", port);
    redis_server_start("127.0.0.1", port_s);
    pid_t pid = g_redis;
    double until = tool_now() + REDIS_START_S;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            g_redis = 0;
            redis_log_tail();
            bench_fail("redis-server exited at start-up (status %d)",
                       WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status));
        }
        redisContext *c = redis_connect("127.0.0.1", port);
        if (c) return c;
        if (tool_now() > until) {
            redis_log_tail();
            bench_fail("redis-server on port %u did not answer PING within %.0f s", port,
                       REDIS_START_S);
        }
        usleep(20000);
    }
}

static void redis_server_stop(void)
{
    kill(g_redis, SIGTERM);
    double until = tool_now() + 5.0;
    int status;
    while (waitpid(g_redis, &status, WNOHANG) != g_redis) {
        if (tool_now() > until) {
            kill_reap(g_redis);
            break;
        }
        usleep(10000);
    }
    g_redis = 0;
    unlink(g_redis_log);
    g_redis_log[0] = '\0';
}

static int redis_key(char *buf, const job *j, size_t i)
{
    return snprintf(buf, 32, "%s:%zu", j->block >= MIB ? "b2m" : "b16k", i);
}

static redisReply *redis_reply(redisContext *c)
{
    void *r = NULL;
    if (redisGetReply(c, &r) != REDIS_OK || r == NULL)
        bench_fail("redis: %s", c->err ? c->errstr : "no reply");
    return r;
}

/* SETs the set, pipelined a batch at a time. */
static void redis_fill(redisContext *c, const job *j)
{
    uint8_t *v = bench_xalloc(j->block);
    char key[32];
    for (size_t first = 0; first < j->n; first += j->batch) {
        size_t end = first + j->batch < j->n ? first + j->batch : j->n;
        for (size_t i = first; i < end; i++) {
            bench_fill_block(v, j->block, i + 1);
            int len = redis_key(key, j, i);
            if (redisAppendCommand(c, "SET %b %b", key, (size_t)len, v, j->block) != REDIS_OK)
                bench_fail("redis: SET: %s", c->errstr);
        }
        for (size_t i = first; i < end; i++) {
            redisReply *r = redis_reply(c);
            if (r->type != REDIS_REPLY_STATUS || strcmp(r->str, "OK") != 0)
                bench_fail("redis: SET of block %zu answered %s", i,
                           r->type == REDIS_REPLY_ERROR ? r->str : "something else");
            freeReplyObject(r);
        }
    }
    free(v);
}

/* GETs the set a pipelined batch at a time and copies each value where a
 * deliver would put it (engine memory); best of the rounds. */
static double redis_get(redisContext *c, const job *j)
{
    uint8_t *dst = bench_xalloc(j->n * j->block);
    memset(dst, 0, j->n * j->block);
    char key[32];
    double best = 0, until = tool_now() + CASE_BUDGET_S;
    uint64_t shift = 0;
    for (int r = 0; r < j->rounds && (r == 0 || tool_now() < until); r++) {
        shift = (uint64_t)r + 1;
        double t0 = tool_now();
        for (size_t first = 0; first < j->n; first += j->batch) {
            size_t end = first + j->batch < j->n ? first + j->batch : j->n;
            for (size_t i = first; i < end; i++) {
                int len = redis_key(key, j, i);
                if (redisAppendCommand(c, "GET %b", key, (size_t)len) != REDIS_OK)
                    bench_fail("redis: GET: %s", c->errstr);
            }
            for (size_t i = first; i < end; i++) {
                redisReply *rep = redis_reply(c);
                if (rep->type != REDIS_REPLY_STRING || rep->len != j->block)
                    bench_fail("redis: GET of block %zu did not answer its %zu bytes", i, j->block);
                memcpy(dst + dest(j, i, shift) * j->block, rep->str, j->block);
                freeReplyObject(rep);
            }
        }
        double v = bench_gbs(j->n * j->block, tool_now() - t0);
        if (v > best) best = v;
    }
    check_dest(dst, j, shift, "redis");
    free(dst);
    return best;
}
#endif

/* ---- (d) --netns: a plain TCP stream, Redis across hosts ------------------------- */

/* Where a child on one host reaches a listener on the other. */
typedef struct net_to {
    char addr[INET_ADDRSTRLEN];
    uint16_t port;
} net_to;

/* Every receive bounded, so a stuck peer fails the bench. */
static void sock_timeout(int fd, const char *who)
{
    struct timeval tv = {(long)WAIT_LIMIT_S, 0};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
        bench_fail("%s: setsockopt: %s", who, strerror(errno));
}

/* The TCP sink, on the receiving host: listens on its address, tells the
 * parent its port, then each round asks the source for the set with one
 * byte and receives every block straight into its round's destination
 * (blocking MSG_WAITALL receives: the kernel's copy, nothing more); best
 * of the rounds, timed from the request to the last byte. */
static void tcp_sink(const job *j, int in, int out)
{
    const char *who = "TCP sink";
    (void)in;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0 || inet_pton(AF_INET, g_bind, &a.sin_addr) != 1 ||
        bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &alen) != 0)
        bench_fail("%s: cannot listen on %s: %s", who, g_bind, strerror(errno));
    uint16_t port = ntohs(a.sin_port);
    up_send(out, &port, sizeof port, who);
    struct pollfd p = {ls, POLLIN, 0};
    if (poll(&p, 1, (int)(START_LIMIT_S * 1000)) != 1) bench_fail("%s: no connection", who);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) bench_fail("%s: accept: %s", who, strerror(errno));
    close(ls);
    sock_timeout(fd, who);
    uint8_t *dst = bench_xalloc(j->n * j->block);
    memset(dst, 0, j->n * j->block);
    double *times = malloc((size_t)j->rounds * sizeof *times);
    if (times == NULL) bench_fail("%s: out of memory", who);
    double best = 0, until = tool_now() + CASE_BUDGET_S;
    uint64_t shift = 0;
    int r = 0;
    for (; r < j->rounds && (r == 0 || tool_now() < until); r++) {
        shift = (uint64_t)r + 1;
        double t0 = tool_now();
        if (send(fd, "g", 1, MSG_NOSIGNAL) != 1) bench_fail("%s: send: %s", who, strerror(errno));
        for (size_t i = 0; i < j->n; i++)
            if (recv(fd, dst + dest(j, i, shift) * j->block, j->block, MSG_WAITALL) !=
                (ssize_t)j->block)
                bench_fail("%s: block %zu: %s", who, i, strerror(errno));
        times[r] = tool_now() - t0;
        double v = bench_gbs(j->n * j->block, times[r]);
        if (v > best) best = v;
    }
    if (send(fd, "s", 1, MSG_NOSIGNAL) != 1) bench_fail("%s: send: %s", who, strerror(errno));
    close(fd);
    check_dest(dst, j, shift, who);
    free(dst);
    pair_result res = {best, shift, times[0], 0};
    res.median_s = bench_median(times, (size_t)r);
    free(times);
    up_send(out, &res, sizeof res, who);
}

/* The TCP source, on the host that holds the data: sends the whole set
 * each time the sink asks, until it says stop. */
static void tcp_source(const job *j, int in, int out)
{
    const char *who = "TCP source";
    uint8_t *buf = bench_xalloc(j->n * j->block);
    for (size_t i = 0; i < j->n; i++) bench_fill_block(buf + i * j->block, j->block, i + 1);
    net_to to;
    if (down_recv(in, &to, sizeof to, START_LIMIT_S, who) != sizeof to)
        bench_fail("%s: bad address message", who);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(to.port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || inet_pton(AF_INET, to.addr, &a.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        bench_fail("%s: cannot connect to %s:%u: %s", who, to.addr, to.port, strerror(errno));
    sock_timeout(fd, who);
    char cmd;
    while (recv(fd, &cmd, 1, 0) == 1 && cmd == 'g')
        for (size_t i = 0; i < j->n; i++)
            if (send(fd, buf + i * j->block, j->block, MSG_NOSIGNAL) != (ssize_t)j->block)
                bench_fail("%s: block %zu: %s", who, i, strerror(errno));
    close(fd);
    free(buf);
    uint8_t ok = 1;
    up_send(out, &ok, 1, who);
}

/* A plain TCP stream between the rig's hosts: best GB/s, and the median
 * round (with a 1-byte set: the round trip). */
static pair_result tcp_pair(const job *j)
{
    child sink, src;
    child_spawn(&sink, "TCP sink", tcp_sink, j, 1);
    child_spawn(&src, "TCP source", tcp_source, j, 0);
    net_to to = {.port = 0};
    if (from_child(&sink, &to.port, sizeof to.port, START_LIMIT_S, "listening") != sizeof to.port)
        bench_fail("the %s sent a bad port", sink.what);
    snprintf(to.addr, sizeof to.addr, "%s", netrig_addr(g_rig, 1));
    to_child(&src, &to, sizeof to, "connecting");
    pair_result res;
    if (from_child(&sink, &res, sizeof res, CHILD_LIMIT_S, "receiving") != sizeof res)
        bench_fail("the %s sent a bad result", sink.what);
    uint8_t ok;
    if (from_child(&src, &ok, 1, WAIT_LIMIT_S, "sending") != 1 || ok != 1)
        bench_fail("the %s sent a bad verdict", src.what);
    child_done(&src);
    child_done(&sink);
    return res;
}

#ifdef KVCR_HAVE_HIREDIS
/* On the receiving host: fills this size's set into the redis-server on
 * host 0 (untimed, the other way), then GETs it as redis_get does. */
static void redis_client(const job *j, int in, int out)
{
    const char *who = "Redis client";
    net_to to;
    if (down_recv(in, &to, sizeof to, START_LIMIT_S, who) != sizeof to)
        bench_fail("%s: bad address message", who);
    double until = tool_now() + REDIS_START_S;
    redisContext *c;
    while ((c = redis_connect(to.addr, to.port)) == NULL) {
        if (tool_now() > until)
            bench_fail("%s: redis-server on %s:%u did not answer PING within %.0f s", who,
                       to.addr, to.port, REDIS_START_S);
        usleep(20000);
    }
    redis_fill(c, j);
    pair_result res = {redis_get(c, j), 0};
    redisFree(c);
    up_send(out, &res, sizeof res, who);
}

/* Pipelined GETs across the rig: redis-server on host 0, the client on 1. */
static double redis_netns(const job *j)
{
    enum { PORT = 6379 }; /* the host's namespace is new: nothing else listens */
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%d", PORT);
    redis_server_start(netrig_addr(g_rig, 0), port_s);
    child cl;
    child_spawn(&cl, "Redis client", redis_client, j, 1);
    net_to to = {.port = PORT};
    snprintf(to.addr, sizeof to.addr, "%s", netrig_addr(g_rig, 0));
    to_child(&cl, &to, sizeof to, "connecting");
    pair_result res;
    if (from_child(&cl, &res, sizeof res, CHILD_LIMIT_S, "getting") != sizeof res)
        bench_fail("the %s sent a bad result", cl.what);
    child_done(&cl);
    redis_server_stop();
    return res.gbs;
}
#endif

/* The roles a --netns child can take, by name on its command line. */
static const struct {
    const char *name;
    child_main fn;
} g_roles[] = {
    {"raw-target", raw_target}, {"raw-source", raw_source}, {"kv-source", kv_source},
    {"kv-target", kv_target},   {"tcp-sink", tcp_sink},     {"tcp-source", tcp_source},
#ifdef KVCR_HAVE_HIREDIS
    {"redis-client", redis_client},
#endif
};

static const char *role_name(child_main fn)
{
    for (size_t i = 0; i < sizeof g_roles / sizeof *g_roles; i++)
        if (g_roles[i].fn == fn) return g_roles[i].name;
    bench_fail("internal: a child without a role name");
}

/* kvcr-bench peer --netns-child ROLE IN OUT BLOCK N BATCH ROUNDS TLS SEG ADDR
 * LEAD_US: one child of a --netns run, on its rig host (see rig_spawn). */
static int netns_child(int argc, char **argv)
{
    if (argc != 12) {
        fprintf(stderr, "kvcr: bench peer --netns-child is started by bench peer --netns\n");
        return 2;
    }
    child_main fn = NULL;
    for (size_t i = 0; i < sizeof g_roles / sizeof *g_roles; i++)
        if (strcmp(argv[1], g_roles[i].name) == 0) fn = g_roles[i].fn;
    if (fn == NULL) bench_fail("bench peer --netns-child: unknown role %s", argv[1]);
    static job j;
    j.block = strtoull(argv[4], NULL, 10);
    j.n = strtoull(argv[5], NULL, 10);
    j.batch = strtoull(argv[6], NULL, 10);
    j.rounds = atoi(argv[7]);
    j.tls = strcmp(argv[8], "-") ? argv[8] : NULL;
    j.seg = strcmp(argv[9], "-") ? argv[9] : NULL;
    g_bind = argv[10], j.hint_lead_us = (uint32_t)strtoul(argv[11], NULL, 10);
    /* As in_child: die with the parent, UCX's stdout goes to stderr. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    signal(SIGPIPE, SIG_IGN);
    if (j.tls) setenv("UCX_TLS", j.tls, 1);
    seg_env(j.seg);
    fn(&j, atoi(argv[2]), atoi(argv[3]));
    return 0;
}

/* Raw UCX configurations --netns tries; the best is the baseline: UCX's
 * own TCP segment sizes, KVCR's, and larger ones. */
static const char *const g_raw_segs[] = {NULL, KVCR_TCP_SEGS, "1m,2m"};

static const char *goal(char *buf, size_t cap, bool quick, const char *what, bool met)
{
    if (quick) return NULL; /* goals are set for the full sizes */
    snprintf(buf, cap, "%s: %s", what, met ? "met" : "MISSED");
    return buf;
}

/* --netns with 1 ms each way (the rig's delaying forwarder): one 4 KiB
 * block per deliver, in round trips of the same link measured in the same
 * rig (a 1-byte TCP ping-pong, median). netns_1block_rtts: the median
 * deliver to a peer already connected; netns_first_contact_rtts: a pair's
 * first (no control connection or UCX endpoint yet; median over the pairs);
 * netns_hinted_first_rtts: the same with the hint 20 round trips ahead. */
static void netns_rtts(bench_out *o, bool quick)
{
    netrig_opts ro = {.n_hosts = 2, .delay_us = 1000};
    char why[256], g[64];
    if (netrig_up(&ro, &g_rig, why, sizeof why) != 0) {
        fprintf(stderr, "kvcr-bench peer --netns: no delayed link (%s); no netns_*_rtts figures\n",
                why);
        return;
    }
    job ping = {NULL, 1, 1, 1, quick ? 20 : 200};
    double rtt = tcp_pair(&ping).median_s;
    job one = {NULL, 4096, 1, 1, quick ? 20 : 200};
    enum { PAIRS = 3 };
    job hinted = {NULL, 4096, 1, 1, 1, NULL, NULL, (uint32_t)(20 * rtt * 1e6)};
    double med[PAIRS], first[PAIRS], ahead[PAIRS];
    size_t pairs = quick ? 1 : PAIRS;
    for (size_t p = 0; p < pairs; p++) {
        pair_result k = kvcr_pair(&one);
        med[p] = k.median_s, first[p] = k.first_s, ahead[p] = kvcr_pair(&hinted).first_s;
    }
    double known = bench_median(med, pairs) / rtt, fresh = bench_median(first, pairs) / rtt;
    double lead = bench_median(ahead, pairs) / rtt;
    if (!o->json) fprintf(stderr, "  round trip (1-byte TCP ping-pong): %.0f us\n", rtt * 1e6);
    bench_report(o, &(bench_figure){.name = "netns_1block_rtts", .value = known, .unit = "rtt",
                                    .goal = goal(g, sizeof g, quick, "<= 1.3", known <= 1.3)});
    bench_report(o, &(bench_figure){.name = "netns_first_contact_rtts", .value = fresh, .unit = "rtt",
                                    .goal = goal(g, sizeof g, quick, "<= 2.5", fresh <= 2.5)});
    bench_report(o, &(bench_figure){.name = "netns_hinted_first_rtts", .value = lead, .unit = "rtt",
                                    .goal = goal(g, sizeof g, quick, "<= 2.5", lead <= 2.5)});
    netrig_down(g_rig);
    g_rig = NULL;
}

/* --netns: every figure across two rig hosts. */
static int netns_run(bench_out *o, bool quick)
{
    char why[256];
    if (!netrig_available(why, sizeof why)) {
        fprintf(stderr, "kvcr-bench peer --netns: no hosts: %s; no netns figures\n", why);
        return 0;
    }
    ssize_t len = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    if (len <= 0) bench_fail("readlink /proc/self/exe: %s", strerror(errno));
    g_exe[len] = '\0';
    netrig_opts ro = {.n_hosts = 2};
    if (netrig_up(&ro, &g_rig, why, sizeof why) != 0) bench_fail("netrig_up: %s", why);

    size_t set = quick ? 4 * MIB : 128 * MIB;
    int rounds = quick ? 2 : 8;
    job big = {NULL, 2 * MIB, set / (2 * MIB), quick ? 2 : 16, rounds};
    job small = {NULL, 16 * 1024, set / (16 * 1024), 256, rounds};
    double tcp = tcp_pair(&big).gbs, best = 0;
    job raw_job = big;
    for (size_t k = 0; k < sizeof g_raw_segs / sizeof *g_raw_segs; k++) {
        job r = big;
        r.seg = g_raw_segs[k];
        double v = raw_pair(&r);
        if (!o->json)
            fprintf(stderr, "  raw UCX, TCP segments %s: %.2f GB/s\n",
                    r.seg ? r.seg : "UCX's (8k,64k)", v);
        if (v > best) best = v, raw_job = r;
    }
    /* The best single run is that configuration's luckiest: it runs again,
     * alternating with ours, and each side's median is its figure. */
    enum { PAIRS_2M = 3 };
    double raws[PAIRS_2M], kvs[PAIRS_2M];
    size_t pairs = quick ? 1 : PAIRS_2M;
    for (size_t p = 0; p < pairs; p++) {
        kvs[p] = kvcr_pair(&big).gbs, raws[p] = raw_pair(&raw_job);
        if (!o->json)
            fprintf(stderr, "  ours %.2f GB/s, raw UCX (segments %s) %.2f\n", kvs[p],
                    raw_job.seg ? raw_job.seg : "UCX's", raws[p]);
    }
    double kv = bench_median(kvs, pairs), raw = bench_median(raws, pairs);
    double kv16 = kvcr_pair(&small).gbs;
    char g[64];
    bench_report(o, &(bench_figure){.name = "netns_2m", .value = kv, .unit = "GB/s",
                                    .baseline = "tcp", .baseline_value = tcp,
                                    .goal = goal(g, sizeof g, quick, ">= 1.0x", kv >= tcp)});
    bench_report(o, &(bench_figure){.name = "netns_2m", .value = kv, .unit = "GB/s",
                                    .baseline = "raw UCX", .baseline_value = raw,
                                    .goal = goal(g, sizeof g, quick, ">= 0.9x", kv >= 0.9 * raw)});
#ifdef KVCR_HAVE_HIREDIS
    double redis = redis_netns(&big);
    bench_report(o, &(bench_figure){.name = "netns_2m_redis", .value = kv, .unit = "GB/s",
                                    .baseline = "redis", .baseline_value = redis,
                                    .goal = goal(g, sizeof g, quick, ">= 1.5x",
                                                 kv >= 1.5 * redis)});
#else
    fprintf(stderr, "kvcr-bench peer --netns: no netns_2m_redis (built without hiredis)\n");
#endif
    bench_report(o, &(bench_figure){.name = "netns_16k", .value = kv16, .unit = "GB/s"});
    bench_report(o, &(bench_figure){.name = "netns_16k_of_2m", .value = kv16, .unit = "GB/s",
                                    .baseline = "netns_2m", .baseline_value = kv,
                                    .goal = goal(g, sizeof g, quick, ">= 0.5x",
                                                 kv16 >= 0.5 * kv)});
    netrig_down(g_rig);
    g_rig = NULL;
    netns_rtts(o, quick);
    return 0;
}

/* ---- entry ------------------------------------------------------------------------ */

typedef struct figures {
    double raw, kv, redis;
} figures;

static void report(bench_out *o, const char *sfx, const figures *big, const figures *small,
                   bool quick)
{
    char name[32], base[32], g[64];
    snprintf(name, sizeof name, "peer_2m%s", sfx);
    bench_report(o, &(bench_figure){.name = name, .value = big->kv, .unit = "GB/s",
                                    .baseline = "raw UCX", .baseline_value = big->raw,
                                    .goal = goal(g, sizeof g, quick, ">= 0.9x",
                                                 big->kv >= 0.9 * big->raw)});
    snprintf(name, sizeof name, "peer_16k%s", sfx);
    bench_report(o, &(bench_figure){.name = name, .value = small->kv, .unit = "GB/s",
                                    .baseline = "raw UCX", .baseline_value = small->raw});
#ifdef KVCR_HAVE_HIREDIS
    snprintf(name, sizeof name, "peer_2m_redis%s", sfx);
    bench_report(o, &(bench_figure){.name = name, .value = big->kv, .unit = "GB/s",
                                    .baseline = "redis", .baseline_value = big->redis,
                                    .goal = goal(g, sizeof g, quick, ">= 3x",
                                                 big->kv >= 3 * big->redis)});
    snprintf(name, sizeof name, "peer_16k_redis%s", sfx);
    bench_report(o, &(bench_figure){.name = name, .value = small->kv, .unit = "GB/s",
                                    .baseline = "redis", .baseline_value = small->redis,
                                    .goal = goal(g, sizeof g, quick, ">= 3x",
                                                 small->kv >= 3 * small->redis)});
#endif
    snprintf(name, sizeof name, "peer_16k_of_2m%s", sfx);
    snprintf(base, sizeof base, "peer_2m%s", sfx);
    bench_report(o, &(bench_figure){.name = name, .value = small->kv, .unit = "GB/s",
                                    .baseline = base, .baseline_value = big->kv,
                                    .goal = goal(g, sizeof g, quick, ">= 0.5x",
                                                 small->kv >= 0.5 * big->kv)});
}

/* --curve: the same 4 KiB deliver over a plaintext and a CURVE control
 * channel, pair after pair; the median over PAIRS pairs of each pair's
 * median round, and of its first round (which includes connecting, and for
 * CURVE the handshake and the ZAP check). */
static void curve_cost(bench_out *o, bool quick)
{
    static pair_keys keys;
    for (int i = 0; i < 2; i++)
        if (keygen_pair(keys.pub[i], keys.sec[i]) != 0) bench_fail("no CURVE keys");
    job plain = {NULL, 4096, 1, 1, quick ? 50 : 2000, NULL}, curved = plain;
    curved.curve = &keys;
    enum { PAIRS = 3 };
    double med[2][PAIRS], first[2][PAIRS];
    for (int p = 0; p < PAIRS; p++) {
        pair_result a = kvcr_pair(&plain), b = kvcr_pair(&curved);
        med[0][p] = a.median_s, first[0][p] = a.first_s;
        med[1][p] = b.median_s, first[1][p] = b.first_s;
    }
    bench_report(o, &(bench_figure){.name = "peer_4k_deliver_curve",
                                    .value = bench_median(med[1], PAIRS) * 1e6, .unit = "us",
                                    .baseline = "plaintext",
                                    .baseline_value = bench_median(med[0], PAIRS) * 1e6,
                                    .lower_is_better = true});
    bench_report(o, &(bench_figure){.name = "peer_4k_first_deliver_curve",
                                    .value = bench_median(first[1], PAIRS) * 1e6, .unit = "us",
                                    .baseline = "plaintext",
                                    .baseline_value = bench_median(first[0], PAIRS) * 1e6,
                                    .lower_is_better = true});
}

int bench_peer(int argc, char **argv)
{
    bench_out o = {.bench = "peer"};
    bool quick, curve = false, netns = false;
    if (argc > 0 && strcmp(argv[0], "--netns-child") == 0) return netns_child(argc, argv);
    char *rest[16]; /* the options but --curve and --netns */
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--curve") == 0)
            curve = true;
        else if (strcmp(argv[i], "--netns") == 0)
            netns = true;
        else if (n < 16)
            rest[n++] = argv[i];
    }
    if (curve && netns) {
        fprintf(stderr, "kvcr: bench peer: --curve and --netns are separate runs\n");
        return 2;
    }
    if (argc - (curve ? 1 : 0) - (netns ? 1 : 0) > n) {
        fprintf(stderr, "kvcr: bench peer: too many options\n");
        return 2;
    }
    if (!bench_options(n, rest, &o, &quick)) return 2;
    g_parent = getpid();
    signal(SIGPIPE, SIG_IGN); /* a dead child's pipe is an error, not a signal */
    atexit(cleanup);
    if (curve) {
        if (!o.json)
            printf("kvcr-bench peer --curve%s: one 4 KiB block per deliver, median of 3 pairs' "
                   "median rounds; ratio = plaintext / CURVE\n\n", quick ? " --quick" : "");
        curve_cost(&o, quick);
        return 0;
    }
    if (netns) {
        if (!o.json)
            printf("kvcr-bench peer --netns%s: two hosts (network namespaces, veth); ratio = "
                   "ours / baseline, both measured in this run\n\n", quick ? " --quick" : "");
        return netns_run(&o, quick);
    }
    if (!o.json)
        printf("kvcr-bench peer%s: ratio = ours / baseline, both measured in this run\n\n",
               quick ? " --quick" : "");

    /* 128 MiB on each side (4 MiB with --quick) as 2 MiB or 16 KiB blocks;
     * 32 MiB / 4 MiB per deliver; up to 8 rounds (1 GiB per case). */
    size_t set = quick ? 4 * MIB : 128 * MIB;
    int rounds = quick ? 2 : 8;
    job big = {NULL, 2 * MIB, set / (2 * MIB), quick ? 2 : 16, rounds};
    job small = {NULL, 16 * 1024, set / (16 * 1024), 256, rounds};

#ifdef KVCR_HAVE_HIREDIS
    redisContext *rc = redis_start();
    redis_fill(rc, &big);
    redis_fill(rc, &small);
#else
    fprintf(stderr, "kvcr-bench peer: no Redis baseline (this kvcr was built without hiredis)\n");
#endif
    static const char *const lanes[] = {NULL, "tcp"};
    for (size_t l = 0; l < sizeof lanes / sizeof *lanes; l++) {
        big.tls = small.tls = lanes[l];
        big.seg = small.seg = lanes[l] ? KVCR_TCP_SEGS : NULL;
        figures f[2];
        job *jobs[2] = {&big, &small};
        for (int k = 0; k < 2; k++) {
            f[k].raw = raw_pair(jobs[k]);
            f[k].kv = kvcr_pair(jobs[k]).gbs;
#ifdef KVCR_HAVE_HIREDIS
            f[k].redis = redis_get(rc, jobs[k]);
#endif
        }
        char sfx[16] = "";
        if (lanes[l]) snprintf(sfx, sizeof sfx, "_%s", lanes[l]);
        report(&o, sfx, &f[0], &f[1], quick);
    }
#ifdef KVCR_HAVE_HIREDIS
    redisFree(rc);
    redis_server_stop();
#endif
    /* One 4 KiB block per deliver to a connected peer, on the default
     * lanes, over a raw ZeroMQ round trip between two processes (medians). */
    job one = {NULL, 4096, 1, 1, quick ? 20 : 1000};
    double rtt = bench_zmq_round_trip_s(quick ? 50 : 2000), rtts = kvcr_pair(&one).median_s / rtt;
    char g[64];
    if (!o.json) fprintf(stderr, "  raw ZeroMQ round trip: %.0f us\n", rtt * 1e6);
    bench_report(&o, &(bench_figure){.name = "peer_1block_zmq_rtts", .value = rtts, .unit = "rtt",
                                     .goal = goal(g, sizeof g, quick, "<= 1.3", rtts <= 1.3)});
    return 0;
}
