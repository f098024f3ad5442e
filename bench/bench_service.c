/* kvcr-bench service: what the KVCR service's Guard buys an engine that
 * dies, with real processes.
 *
 * service_failover_first_block: an engine (guard mode, remote tier on)
 * commits a few blocks and is SIGKILLed; this process, a peer with the
 * remote tier on, submits a hinted one-block kvcr_deliver from the dead
 * engine's control endpoint again and again until one succeeds with the
 * right bytes. Timed from the moment waitpid() returned. Baseline: the same
 * delivery from the live engine just before the kill.
 *
 * service_reattach_<n>k / service_refill_<n>k: an engine deposits n blocks
 * of 4 KiB into its claimed group (timed: the refill a restart without the
 * service would have to redo), and is SIGKILLed; a new engine process times
 * kvcr_create() (claim, handback from the serving Guard, journal replay,
 * install of the n blocks), then checks that every key answers HIT and that
 * a sample comes back with its bytes. Baseline: a cold kvcr_create() of the
 * same configuration on a fresh group with nothing to recover.
 *
 * Processes: the service (`kvcr service`, started through a hidden
 * `kvcr-bench service --exec-service` that ties it to this process's life
 * and execs the build tree's `kvcr`: bench_kvcr_tool) and the engines
 * (`kvcr-bench service --engine ...`) are /proc/self/exe started with
 * posix_spawn, so no fork happens after this process started UCX. Engines
 * take commands on stdin and answer on stdout (a pipe each). Pool files
 * live in a fresh directory under /dev/shm (else /tmp), removed at exit,
 * also after a failure or SIGINT/SIGTERM. Every spawned process is reaped,
 * every wait is bounded, and any failure says what and exits 1. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvcr/kvcr.h"
#include "daemon/service.h"

extern char **environ;

#define MIB (1024ull * 1024ull)
#define BLOCK 4096u              /* every block of every engine */
#define DIGEST "kvcr-bench-service"
#define JOURNAL_MB 64u
#define G_FAILOVER 0u            /* the failover case's group */
#define G_REATTACH 1u            /* the reattach case's group */
#define FAILOVER_BLOCKS 64u      /* committed by the failover case's engine */
#define LIVE_SAMPLES 9           /* live deliveries timed before each kill */
#define SAMPLE 1000u             /* keys delivered back after a reattach */
#define FULL_BLOCKS 100000u
#define QUICK_BLOCKS 10000u
#define MIN_BLOCKS 10000u        /* shrinking for space stops here */
#define SLACK_SLOTS 1024u        /* pool slots beyond the blocks */
#define SPARE_BYTES (64 * MIB)   /* left free on the pool directory's file system */
#define DEPOSIT_BATCH 256u
#define DEPOSIT_WINDOW 8u        /* deposits in flight */
#define QUERY_BATCH 1024u
#define DELIVER_BATCH 250u
#define MAX_REPS 16

/* Bounds. Engines' operations have their own deadlines inside these. */
#define ENGINE_OP_MS 10000u
#define PEER_OP_MS 2000u
#define SERVICE_START_S 10.0
#define SERVICE_STOP_S 30.0
#define ENGINE_START_S 180.0     /* create, deposits or checks; generous for ASan */
#define ENGINE_STOP_S 30.0
#define ENGINE_LIFE_S 900.0      /* an engine not told to stop by then leaves */
#define SERVING_WAIT_S 30.0      /* a Guard's promotion after a death */
#define FIRST_BLOCK_LIMIT_S 30.0 /* the failover loop */
#define MAX_ATTEMPTS 10000
#define WAIT_LIMIT_S 40.0        /* one operation, past its own deadlines */

typedef enum role { ROLE_COLD, ROLE_DEPOSIT, ROLE_RECOVER } role;
static const char *const role_names[] = {"cold", "deposit", "recover"};

/* What an engine tells the parent once it is ready. */
typedef struct engine_report {
    double create_s;   /* kvcr_create(), claim included */
    double deposit_s;  /* ROLE_DEPOSIT: all blocks deposited and committed */
    uint64_t hits;     /* ROLE_RECOVER: keys answering HIT */
    uint64_t sampled, good; /* ROLE_RECOVER: keys delivered back, and with their bytes */
    char endpoint[256];
} engine_report;

static void key_name(char *buf, size_t cap, uint32_t i)
{
    snprintf(buf, cap, "k%" PRIu32, i);
}

static kvcr_key key_of(const char *s)
{
    return (kvcr_key){(const uint8_t *)s, strlen(s)};
}

static double median(const double *v, int n)
{
    double s[MAX_REPS * LIVE_SAMPLES];
    memcpy(s, v, (size_t)n * sizeof *v);
    for (int i = 1; i < n; i++) /* insertion sort: a few dozen values */
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* ---- the engine (a child: kvcr-bench service --engine ...) ------------------------- */

/* The engine process's own state (the parent's handle on one is `engine`). */
typedef struct eng {
    kvcr_t *kv;
    int fd;
    uint8_t *fw;
    uint32_t n;
    char (*names)[16]; /* "k<i>" for every block */
    const char *who;
} eng;

/* Polls until op completes; every entry must succeed. */
static void eng_wait(eng *e, kvcr_op_handle op, size_t n, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", e->who, what);
    kvcr_results_free(bench_wait_op(e->kv, e->fd, op, n, msg, WAIT_LIMIT_S, NULL));
}

/* Deposits k0..k<n-1> from framework elements 0..n-1, DEPOSIT_WINDOW
 * deposits of DEPOSIT_BATCH blocks in flight; returns when every entry of
 * every deposit succeeded (each is then committed to the journal). */
static void eng_deposit_all(eng *e)
{
    kvcr_mem_ref *refs = calloc(e->n, sizeof *refs);
    kvcr_block *b = calloc(e->n, sizeof *b);
    if (refs == NULL || b == NULL) bench_fail("%s: out of memory", e->who);
    for (uint32_t i = 0; i < e->n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, "", i};
        b[i] = (kvcr_block){key_of(e->names[i]), &refs[i], 1};
    }
    kvcr_op_handle ops[DEPOSIT_WINDOW];
    size_t n_ops = 0;
    uint32_t next = 0, done = 0;
    double until = tool_now() + ENGINE_START_S;
    while (done < e->n) {
        while (next < e->n && n_ops < DEPOSIT_WINDOW) {
            uint32_t k = e->n - next < DEPOSIT_BATCH ? e->n - next : DEPOSIT_BATCH;
            bench_check(kvcr_deposit(e->kv, b + next, k, 0, &ops[n_ops++]), "kvcr_deposit");
            next += k;
        }
        kvcr_op_result *res;
        size_t n_res;
        bench_check(kvcr_poll(e->kv, &res, &n_res), "kvcr_poll");
        for (size_t i = 0; i < n_res; i++) {
            size_t k = 0;
            while (k < n_ops && ops[k] != res[i].op) k++;
            if (k == n_ops) bench_fail("%s: a result for an unknown operation", e->who);
            ops[k] = ops[--n_ops];
            for (size_t j = 0; j < res[i].n_entries; j++)
                if (res[i].entries[j].status != KVCR_ENTRY_SUCCESS)
                    bench_fail("%s: deposit of %.*s: %s (%s)", e->who,
                               (int)res[i].entries[j].key.len,
                               (const char *)res[i].entries[j].key.data,
                               kvcr_entry_status_name(res[i].entries[j].status),
                               kvcr_reason_name(res[i].entries[j].reason));
            done += (uint32_t)res[i].n_entries;
        }
        kvcr_results_free(res);
        if (n_res > 0) continue;
        double left = until - tool_now();
        if (left <= 0)
            bench_fail("%s: %u of %u deposits done after %.0f s", e->who, done, e->n,
                       ENGINE_START_S);
        struct pollfd p = {e->fd, POLLIN, 0};
        poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
    free(refs);
    free(b);
}

/* How many of k0..k<n-1> answer HIT in KVCR DRAM. */
static uint64_t eng_count_hits(eng *e)
{
    kvcr_key keys[QUERY_BATCH];
    kvcr_query_result q[QUERY_BATCH];
    uint64_t hits = 0;
    for (uint32_t first = 0; first < e->n; first += QUERY_BATCH) {
        uint32_t k = e->n - first < QUERY_BATCH ? e->n - first : QUERY_BATCH;
        for (uint32_t i = 0; i < k; i++) keys[i] = key_of(e->names[first + i]);
        bench_check(kvcr_query(e->kv, keys, k, NULL, q), "kvcr_query");
        for (uint32_t i = 0; i < k; i++) hits += q[i].status == KVCR_QUERY_HIT;
    }
    return hits;
}

/* Delivers `want` distinct keys drawn at random (from seed) into their own
 * framework elements, zeroed first; how many came back with their bytes. */
static uint64_t eng_check_sample(eng *e, uint32_t want, uint64_t seed, uint64_t *sampled)
{
    if (want > e->n) want = e->n;
    uint8_t *taken = calloc(e->n, 1);
    uint32_t *pick = calloc(want, sizeof *pick);
    if (taken == NULL || pick == NULL) bench_fail("%s: out of memory", e->who);
    uint64_t x = seed | 1;
    uint32_t got = 0;
    for (uint32_t tries = 0; got < want && tries < 100 * want; tries++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        uint32_t i = (uint32_t)(x % e->n);
        if (!taken[i]) taken[i] = 1, pick[got++] = i;
    }
    want = got;
    kvcr_mem_ref refs[DELIVER_BATCH];
    kvcr_block b[DELIVER_BATCH];
    uint64_t good = 0;
    for (uint32_t first = 0; first < want; first += DELIVER_BATCH) {
        uint32_t k = want - first < DELIVER_BATCH ? want - first : DELIVER_BATCH;
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = pick[first + j];
            memset(e->fw + (size_t)i * BLOCK, 0, BLOCK);
            refs[j] = (kvcr_mem_ref){NULL, "", i};
            b[j] = (kvcr_block){key_of(e->names[i]), &refs[j], 1};
        }
        kvcr_op_handle op;
        bench_check(kvcr_deliver(e->kv, b, k, NULL, &op), "kvcr_deliver");
        eng_wait(e, op, k, "delivering the sample back");
        for (uint32_t j = 0; j < k; j++) {
            uint32_t i = pick[first + j];
            good += bench_has_block(e->fw + (size_t)i * BLOCK, BLOCK, (uint64_t)i + 1);
        }
    }
    *sampled = want;
    free(taken);
    free(pick);
    return good;
}

/* argv: parent-pid socket guard blocks role sample seed. */
static int engine_main(int argc, char **argv)
{
    /* stdout is the pipe to the parent: keep it apart, and send anything
     * else written to stdout (UCX logs there) to stderr. */
    int out = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    if (out < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
        bench_fail("engine: dup: %s", strerror(errno));
    if (argc != 7) bench_fail("engine: started by `kvcr-bench service`, not by hand");
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)atol(argv[0])) return 1; /* the parent is gone already */
    const char *socket_path = argv[1];
    uint32_t guard = (uint32_t)atol(argv[2]);
    eng e = {.n = (uint32_t)atol(argv[3]), .who = "engine"};
    role r = ROLE_COLD;
    while (r <= ROLE_RECOVER && strcmp(argv[4], role_names[r]) != 0) r++;
    if (r > ROLE_RECOVER || e.n == 0) bench_fail("engine: bad arguments");
    uint32_t sample = (uint32_t)atol(argv[5]);
    uint64_t seed = strtoull(argv[6], NULL, 10);

    /* The engine's framework memory: one element per block. */
    e.fw = bench_xalloc((size_t)e.n * BLOCK);
    e.names = calloc(e.n, sizeof *e.names);
    if (e.names == NULL) bench_fail("engine: out of memory");
    for (uint32_t i = 0; i < e.n; i++) key_name(e.names[i], sizeof e.names[i], i);
    if (r == ROLE_DEPOSIT)
        for (uint32_t i = 0; i < e.n; i++)
            bench_fill_block(e.fw + (size_t)i * BLOCK, BLOCK, (uint64_t)i + 1);

    kvcr_pool_layout layout = {"", BLOCK};
    kvcr_region region = {.addr = e.fw, .element_size = BLOCK, .count = e.n, .label = ""};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = "bench-engine";
    cfg.pool_layouts = &layout;
    cfg.n_pool_layouts = 1;
    cfg.framework_regions = &region;
    cfg.n_framework_regions = 1;
    tool_remote_peer(&cfg);
    cfg.guard.service_socket_path = socket_path;
    cfg.guard.guard_index = guard;
    cfg.guard.compatibility_digest = DIGEST;
    cfg.operation_timeout_ms = ENGINE_OP_MS;
    cfg.abandon_timeout_ms = 2 * ENGINE_OP_MS;

    engine_report rep;
    memset(&rep, 0, sizeof rep);
    double t0 = tool_now();
    bench_check(kvcr_create(&cfg, &e.kv), "engine: kvcr_create");
    rep.create_s = tool_now() - t0;
    e.fd = kvcr_fd(e.kv);
    if (e.fd < 0) bench_check(e.fd, "engine: kvcr_fd");
    if (r == ROLE_DEPOSIT) {
        t0 = tool_now();
        eng_deposit_all(&e);
        rep.deposit_s = tool_now() - t0;
    } else if (r == ROLE_RECOVER) {
        rep.hits = eng_count_hits(&e);
        rep.good = eng_check_sample(&e, sample, seed, &rep.sampled);
    }
    snprintf(rep.endpoint, sizeof rep.endpoint, "%s", kvcr_control_endpoint(e.kv));
    if (write(out, &rep, sizeof rep) != (ssize_t)sizeof rep)
        bench_fail("engine: the parent is gone");

    /* Serve (peers pull from this instance) until told to stop, the parent
     * goes away, or the life bound passes. */
    double until = tool_now() + ENGINE_LIFE_S;
    while (tool_now() < until) {
        struct pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {e.fd, POLLIN, 0}};
        poll(fds, 2, 5);
        kvcr_op_result *res;
        size_t n_res;
        bench_check(kvcr_poll(e.kv, &res, &n_res), "engine: kvcr_poll");
        kvcr_results_free(res);
        if (fds[0].revents & (POLLIN | POLLHUP)) break; /* 's', or the parent is gone */
    }
    bench_check(kvcr_close(e.kv), "engine: kvcr_close");
    kvcr_free(e.kv);
    free(e.names);
    free(e.fw);
    close(out);
    return 0;
}

/* ---- the parent's processes, and cleanup ---------------------------------------------- */

typedef struct engine {
    pid_t pid;
    int to, from;
    char what[64];
} engine;

static pid_t g_owner;
static char g_dir[64], g_sock[96], g_log[96]; /* the socket path must fit sun_path */
static volatile sig_atomic_t g_have_dir;
static volatile pid_t g_service;
static volatile pid_t g_engine; /* at most one engine lives at a time */

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Async-signal-safe from here to remove_all: kill, waitpid, nanosleep,
 * open, getdents64, unlinkat, rmdir. */
static void stop_service_now(void)
{
    pid_t pid = g_service;
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < (int)(SERVICE_STOP_S * 100); i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            g_service = 0;
            return;
        }
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    g_service = 0;
}

/* Empties and removes the directory (the service removes its own files on
 * a clean stop; this also takes what a killed one left). */
static void remove_dir(void)
{
    if (!g_have_dir) return;
    int fd = open(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        for (int round = 0; round < 64; round++) { /* bounded: a few files */
            long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
            if (n <= 0) break;
            for (long at = 0; at < n;) {
                struct dirent64 *d = (struct dirent64 *)(buf + at);
                if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0)
                    unlinkat(fd, d->d_name, 0);
                at += d->d_reclen;
            }
        }
        close(fd);
    }
    rmdir(g_dir);
    g_have_dir = 0;
}

static void remove_all(void)
{
    if (g_engine > 0) {
        kill(g_engine, SIGKILL);
        waitpid(g_engine, NULL, 0);
        g_engine = 0;
    }
    stop_service_now();
    remove_dir();
}

/* The service's log (its stderr), shown when something failed. */
static void show_service_log(void)
{
    FILE *f = g_have_dir ? fopen(g_log, "re") : NULL;
    if (f == NULL) return;
    char line[512];
    bool first = true;
    for (int i = 0; i < 200 && fgets(line, sizeof line, f); i++) {
        if (first) fprintf(stderr, "kvcr: the service's log (%s):\n", g_log);
        first = false;
        fprintf(stderr, "  %s", line);
    }
    fclose(f);
}

static bool g_ok; /* set when the run finished: no log to show */

static void cleanup(void)
{
    if (getpid() != g_owner) return;
    if (!g_ok) show_service_log();
    remove_all();
}

static void on_signal(int sig)
{
    remove_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A directory for the pools: under /dev/shm if it has `need` bytes free,
 * else under /tmp. Returns `need` when it made one, else the most bytes
 * free in either (nothing is made). */
static uint64_t setup_dir(uint64_t need)
{
    static const char *const bases[] = {"/dev/shm", "/tmp"};
    uint64_t best = 0;
    int pick = -1;
    for (int i = 0; i < 2 && pick < 0; i++) {
        struct statvfs v;
        if (access(bases[i], W_OK) != 0 || statvfs(bases[i], &v) != 0) continue;
        uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize;
        if (avail >= need) pick = i;
        if (avail > best) best = avail;
    }
    if (pick < 0) return best; /* the caller shrinks or refuses */
    snprintf(g_dir, sizeof g_dir, "%s/kvcr-bench-svc.XXXXXX", bases[pick]);
    if (mkdtemp(g_dir) == NULL)
        bench_fail("cannot create a directory under %s: %s", bases[pick], strerror(errno));
    snprintf(g_sock, sizeof g_sock, "%s/s.sock", g_dir);
    snprintf(g_log, sizeof g_log, "%s/service.log", g_dir);
    g_have_dir = 1;
    return need;
}

static void install_cleanup(void)
{
    g_owner = getpid();
    atexit(cleanup);
    bench_trap_signals(on_signal);
    signal(SIGPIPE, SIG_IGN); /* a dead engine's pipe is an error, not a signal */
}

static double guard_metric(const char *what, uint32_t guard)
{
    char name[128];
    snprintf(name, sizeof name, "%s{guard=\"%u\"}", what, guard);
    return tool_svc_metric(g_sock, name);
}

static const char *exit_text(char *buf, size_t cap, int status)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "signal %d", WTERMSIG(status));
    else
        snprintf(buf, cap, "status %d", status);
    return buf;
}

/* posix_spawn of /proc/self/exe; stdin and stdout from the two fds (-1:
 * inherited), stderr and stdout into `log` when it is not NULL. */
static pid_t spawn_self(char *const argv[], int in, int out, const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (in >= 0) posix_spawn_file_actions_adddup2(&fa, in, STDIN_FILENO);
    if (out >= 0) posix_spawn_file_actions_adddup2(&fa, out, STDOUT_FILENO);
    if (log) {
        posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, log, O_WRONLY | O_CREAT | O_APPEND,
                                         0600);
        posix_spawn_file_actions_adddup2(&fa, STDERR_FILENO, STDOUT_FILENO);
    }
    fflush(NULL);
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) bench_fail("cannot start /proc/self/exe: %s", strerror(rc));
    return pid;
}

/* `kvcr service` with two groups of `slots` 4 KiB slots each; returns once
 * it answers a metrics request (bounded). */
static void service_start(uint64_t slots)
{
    char parent[24], gb[48];
    snprintf(parent, sizeof parent, "%ld", (long)getpid());
    snprintf(gb, sizeof gb, "%.12f", (double)(slots * BLOCK) / 1073741824.0);
    char journal[16];
    snprintf(journal, sizeof journal, "%u", JOURNAL_MB);
    char *argv[] = {"kvcr-bench", "service", "--exec-service", parent,
                    "service", "--socket-path", g_sock, "--pool-dir", g_dir,
                    "--guard-count", "2", "--pool-sizes-gb", gb,
                    "--compatibility-digest", DIGEST, "--journal-mb", journal,
                    "--log-level", "warn", NULL};
    g_service = spawn_self(argv, -1, -1, g_log);
    double until = tool_now() + SERVICE_START_S;
    for (int i = 0; i < 100000; i++) {
        char *text = NULL;
        if (svc_fetch_metrics(g_sock, &text) == 0) {
            free(text);
            return;
        }
        int status;
        if (waitpid(g_service, &status, WNOHANG) == g_service) {
            g_service = 0;
            char s[48];
            bench_fail("the service exited at start-up (%s)", exit_text(s, sizeof s, status));
        }
        if (tool_now() > until) break;
        sleep_ms(10);
    }
    bench_fail("the service did not answer on %s within %.0f s: %s", g_sock, SERVICE_START_S,
               kvcr_last_error());
}

/* SIGTERM, reaped (bounded); a clean shutdown exits 0. */
static void service_stop(void)
{
    pid_t pid = g_service;
    kill(pid, SIGTERM);
    int status = 0;
    double until = tool_now() + SERVICE_STOP_S;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && tool_now() < until) sleep_ms(10);
    if (r != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        g_service = 0;
        bench_fail("the service did not stop within %.0f s of SIGTERM (killed)", SERVICE_STOP_S);
    }
    g_service = 0;
    char s[48];
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        bench_fail("the service stopped with %s", exit_text(s, sizeof s, status));
}

/* `kvcr-bench service --exec-service <parent> service ...`: dies with the
 * parent (it cannot clean up after a SIGKILL otherwise), then becomes the
 * service. */
static int exec_service(int argc, char **argv)
{
    if (argc < 3) return 2;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != (pid_t)atol(argv[1])) return 1;
    argv[1] = "kvcr"; /* argv[1..] is now: kvcr service --socket-path ... */
    execv(bench_kvcr_tool(), argv + 1);
    fprintf(stderr, "kvcr: cannot exec the service: %s\n", strerror(errno));
    return 1;
}

static _Noreturn void engine_failed(engine *e, const char *doing)
{
    int status = 0;
    double until = tool_now() + 3.0;
    pid_t r;
    while ((r = waitpid(e->pid, &status, WNOHANG)) == 0 && tool_now() < until) sleep_ms(10);
    if (r != e->pid) {
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
        g_engine = 0;
        bench_fail("the %s did not answer while %s (killed)", e->what, doing);
    }
    g_engine = 0;
    char s[48];
    bench_fail("the %s ended with %s while %s (its message is above)", e->what,
               exit_text(s, sizeof s, status), doing);
}

/* Starts an engine on `guard` and waits for its report. */
static void engine_start(engine *e, uint32_t guard, uint32_t n, role r, uint64_t seed,
                         engine_report *rep)
{
    snprintf(e->what, sizeof e->what, "engine (%s, group %u, %u blocks)", role_names[r], guard, n);
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0)
        bench_fail("pipe: %s", strerror(errno));
    char parent[24], g[16], blocks[16], sample[16], seed_s[24];
    snprintf(parent, sizeof parent, "%ld", (long)getpid());
    snprintf(g, sizeof g, "%u", guard);
    snprintf(blocks, sizeof blocks, "%u", n);
    snprintf(sample, sizeof sample, "%u", SAMPLE);
    snprintf(seed_s, sizeof seed_s, "%" PRIu64, seed);
    char *argv[] = {"kvcr-bench", "service", "--engine", parent, g_sock, g,
                    blocks, (char *)role_names[r], sample, seed_s, NULL};
    e->pid = g_engine = spawn_self(argv, down[0], up[1], NULL);
    close(down[0]);
    close(up[1]);
    e->to = down[1];
    e->from = up[0];
    if (tool_read_full(e->from, rep, sizeof *rep, tool_now() + ENGINE_START_S) != 0) {
        close(e->to);
        close(e->from);
        engine_failed(e, "starting");
    }
}

/* SIGKILL, then waitpid: the engine's death as the service sees it. */
static void engine_kill(engine *e)
{
    kill(e->pid, SIGKILL);
    while (waitpid(e->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    g_engine = 0;
    close(e->to);
    close(e->from);
}

/* A clean stop: the engine closes its instance (releasing its group) and
 * must exit 0. */
static void engine_stop(engine *e)
{
    if (write(e->to, "s", 1) != 1) {
        close(e->to);
        close(e->from);
        engine_failed(e, "being told to stop");
    }
    close(e->to);
    close(e->from);
    int status = 0;
    double until = tool_now() + ENGINE_STOP_S;
    pid_t r;
    while ((r = waitpid(e->pid, &status, WNOHANG)) == 0 && tool_now() < until) sleep_ms(5);
    if (r != e->pid) {
        kill(e->pid, SIGKILL);
        waitpid(e->pid, NULL, 0);
        g_engine = 0;
        bench_fail("the %s did not stop within %.0f s (killed)", e->what, ENGINE_STOP_S);
    }
    g_engine = 0;
    char s[48];
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        bench_fail("the %s stopped with %s", e->what, exit_text(s, sizeof s, status));
}

/* Waits until `guard` serves for the promotions-th time (bounded). */
static void wait_serving(uint32_t guard, double promotions)
{
    if (tool_wait_serving(g_sock, guard, promotions, SERVING_WAIT_S) >= 0) return;
    bench_fail("guard %u did not start serving within %.0f s of its owner's death", guard,
               SERVING_WAIT_S);
}

/* After a death: the Guard mirrored exactly the blocks committed, and
 * never stopped believing the journal. */
static void check_mirror(uint32_t guard, uint32_t n)
{
    double mirrored = guard_metric("kvcr_guard_mirrored_blocks", guard);
    double lost = guard_metric("kvcr_guard_recovery_lost_total", guard);
    if (mirrored != (double)n || lost != 0)
        bench_fail("guard %u mirrors %.0f blocks (recovery lost %.0f times); %u were committed",
                   guard, mirrored, lost, n);
}

/* ---- this process as a peer ------------------------------------------------------------ */

typedef struct puller {
    kvcr_t *kv;
    int fd;
    uint8_t *fw; /* FAILOVER_BLOCKS elements: k<i> lands in element i */
    kvcr_pool_layout layout;
    kvcr_region region;
    uint64_t requests;
    kvcr_reason last_reason;
    int refusals; /* failed attempts of the last pull_until_success */
} puller;

static void puller_start(puller *p)
{
    memset(p, 0, sizeof *p);
    p->fw = bench_xalloc((size_t)FAILOVER_BLOCKS * BLOCK);
    memset(p->fw, 0, (size_t)FAILOVER_BLOCKS * BLOCK);
    p->layout = (kvcr_pool_layout){"", BLOCK};
    p->region = (kvcr_region){.addr = p->fw, .element_size = BLOCK, .count = FAILOVER_BLOCKS,
                              .label = ""};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = "bench-peer";
    cfg.pool_layouts = &p->layout;
    cfg.n_pool_layouts = 1;
    cfg.framework_regions = &p->region;
    cfg.n_framework_regions = 1;
    tool_remote_peer(&cfg); /* and no KVCR DRAM: every block comes from the source */
    cfg.operation_timeout_ms = PEER_OP_MS;
    cfg.abandon_timeout_ms = 2 * PEER_OP_MS;
    bench_check(kvcr_create(&cfg, &p->kv), "kvcr_create (the peer)");
    p->fd = kvcr_fd(p->kv);
    if (p->fd < 0) bench_check(p->fd, "kvcr_fd");
}

static void puller_stop(puller *p)
{
    kvcr_free(p->kv);
    free(p->fw);
}

/* One hinted delivery of k<x> from source into element x, as a router
 * and an engine would do it: a kv_hint for a fresh request naming the
 * block, then kvcr_deliver under that request, waited for. True on
 * success, where the bytes must be right; false with p->last_reason. */
static bool pull_one(puller *p, const char *source, uint32_t x)
{
    char req[32], json[512], key[16];
    snprintf(req, sizeof req, "bench-%" PRIu64, ++p->requests);
    int len = snprintf(json, sizeof json,
                       "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":\"kv.fetch\","
                       "\"action_version\":\"1.0\",\"payload\":{\"source_control_endpoint\":"
                       "\"%s\",\"block_hashes\":[%" PRIu32 "]}}]}",
                       source, x);
    bench_check(kvcr_submit_hint(p->kv, req, json, (size_t)len), "kvcr_submit_hint");
    uint8_t *dst = p->fw + (size_t)x * BLOCK;
    memset(dst, 0, BLOCK);
    key_name(key, sizeof key, x);
    kvcr_mem_ref ref = {NULL, "", x};
    kvcr_block b = {key_of(key), &ref, 1};
    kvcr_op_handle op;
    bench_check(kvcr_deliver(p->kv, &b, 1, req, &op), "kvcr_deliver");
    double until = tool_now() + WAIT_LIMIT_S;
    int status = -1;
    while (status < 0) {
        kvcr_op_result *res;
        size_t n;
        bench_check(kvcr_poll(p->kv, &res, &n), "kvcr_poll");
        for (size_t i = 0; i < n; i++) {
            if (res[i].op != op || res[i].n_entries != 1)
                bench_fail("the peer: an unexpected operation result");
            status = (int)res[i].entries[0].status;
            p->last_reason = res[i].entries[0].reason;
        }
        kvcr_results_free(res);
        if (status >= 0) break;
        double left = until - tool_now();
        if (left <= 0)
            bench_fail("the peer: a delivery did not complete within %.0f s", WAIT_LIMIT_S);
        struct pollfd pf = {p->fd, POLLIN, 0};
        poll(&pf, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
    bench_check(kvcr_discard_hint(p->kv, req), "kvcr_discard_hint");
    if (status != KVCR_ENTRY_SUCCESS) return false;
    if (!bench_has_block(dst, BLOCK, (uint64_t)x + 1))
        bench_fail("k%" PRIu32 " was delivered from %s with the wrong bytes", x, source);
    return true;
}

/* Pulls k<x> until one delivery succeeds (bounded in attempts and time).
 * A pull refused by a new process at the endpoint goes again within the
 * same delivery (remote_target.c, restart_refused), so a failed attempt
 * after a failover or a restart is a fault the figures count. */
static void pull_until_success(puller *p, const char *source, uint32_t x, const char *when)
{
    double until = tool_now() + FIRST_BLOCK_LIMIT_S;
    for (p->refusals = 0; p->refusals < MAX_ATTEMPTS; p->refusals++) {
        if (pull_one(p, source, x)) return;
        if (tool_now() > until) break;
        sleep_ms(1);
    }
    bench_fail("%s: no delivery from %s succeeded in %d attempts / %.0f s (last: %s)", when,
               source, p->refusals, FIRST_BLOCK_LIMIT_S, kvcr_reason_name(p->last_reason));
}

/* ---- the cases ------------------------------------------------------------------------- */

typedef struct failover_figures {
    double first, live;
    double promotion;             /* the Guard's own figure, death to serving */
    int min_refused, max_refused; /* attempts refused before the first block */
} failover_figures;

/* Each repetition: an engine holding the group (the first deposits the
 * blocks, the next ones recover them), LIVE_SAMPLES timed deliveries from
 * it, SIGKILL, then the first block from the Guard. */
static failover_figures bench_failover(int reps)
{
    puller p;
    puller_start(&p);
    double first[MAX_REPS], live[MAX_REPS * LIVE_SAMPLES], promotion[MAX_REPS];
    int n_live = 0;
    failover_figures f = {.min_refused = MAX_ATTEMPTS};
    char endpoint[256] = "";
    for (int rep = 0; rep < reps; rep++) {
        engine e;
        engine_report r;
        role ro = rep == 0 ? ROLE_DEPOSIT : ROLE_RECOVER;
        engine_start(&e, G_FAILOVER, FAILOVER_BLOCKS, ro, (uint64_t)rep + 1, &r);
        if (rep == 0) {
            snprintf(endpoint, sizeof endpoint, "%s", r.endpoint);
        } else {
            if (strcmp(r.endpoint, endpoint) != 0)
                bench_fail("the restarted engine answers on %s, not on %s", r.endpoint, endpoint);
            if (r.hits != FAILOVER_BLOCKS || r.good != r.sampled)
                bench_fail("the restarted engine recovered %" PRIu64 " of %u blocks, %" PRIu64
                           " of %" PRIu64 " with their bytes",
                           r.hits, FAILOVER_BLOCKS, r.good, r.sampled);
        }
        uint32_t x = (uint32_t)(rep * 7) % FAILOVER_BLOCKS;
        pull_until_success(&p, endpoint, x, "before the kill"); /* meets the new owner */
        for (int k = 0; k < LIVE_SAMPLES; k++) {
            uint32_t y = (x + 1 + (uint32_t)k) % FAILOVER_BLOCKS;
            double t0 = tool_now();
            if (!pull_one(&p, endpoint, y))
                bench_fail("a delivery from the live engine failed: %s",
                           kvcr_reason_name(p.last_reason));
            live[n_live++] = tool_now() - t0;
        }
        engine_kill(&e);
        double t0 = tool_now();
        pull_until_success(&p, endpoint, x, "after the kill");
        first[rep] = tool_now() - t0;
        if (p.refusals < f.min_refused) f.min_refused = p.refusals;
        if (p.refusals > f.max_refused) f.max_refused = p.refusals;
        wait_serving(G_FAILOVER, rep + 1);
        check_mirror(G_FAILOVER, FAILOVER_BLOCKS);
        promotion[rep] = guard_metric("kvcr_guard_last_promotion_seconds", G_FAILOVER);
    }
    puller_stop(&p);
    f.first = median(first, reps);
    f.live = median(live, n_live);
    f.promotion = median(promotion, reps);
    return f;
}

typedef struct reattach_figures {
    double reattach, cold, refill;
} reattach_figures;

/* Cold creates on the fresh group; one engine deposits n blocks and is
 * killed; then each repetition reattaches (timed), checks everything, and
 * is killed again (the last one stops cleanly). */
static reattach_figures bench_reattach(uint32_t n, int cold_reps, int reps)
{
    reattach_figures f;
    double cold[MAX_REPS], reattach[MAX_REPS];
    engine e;
    engine_report r;
    for (int rep = 0; rep < cold_reps; rep++) {
        engine_start(&e, G_REATTACH, n, ROLE_COLD, 0, &r);
        cold[rep] = r.create_s;
        engine_stop(&e);
    }
    engine_start(&e, G_REATTACH, n, ROLE_DEPOSIT, 0, &r);
    f.refill = r.deposit_s;
    engine_kill(&e);
    wait_serving(G_REATTACH, 1);
    check_mirror(G_REATTACH, n);
    for (int rep = 0; rep < reps; rep++) {
        engine_start(&e, G_REATTACH, n, ROLE_RECOVER, (uint64_t)rep + 1, &r);
        reattach[rep] = r.create_s;
        if (r.hits != n)
            bench_fail("after the reattach %" PRIu64 " of %u keys answer HIT", r.hits, n);
        if (r.sampled != (n < SAMPLE ? n : SAMPLE) || r.good != r.sampled)
            bench_fail("after the reattach %" PRIu64 " of %" PRIu64
                       " sampled blocks came back with their bytes",
                       r.good, r.sampled);
        if (rep + 1 < reps) {
            engine_kill(&e);
            wait_serving(G_REATTACH, rep + 2);
            check_mirror(G_REATTACH, n);
        } else {
            engine_stop(&e);
        }
    }
    f.cold = median(cold, cold_reps);
    f.reattach = median(reattach, reps);
    return f;
}

/* ---- entry ------------------------------------------------------------------------------- */

/* Two groups (journal + pool each) and the spare. */
static uint64_t dir_need(uint32_t n)
{
    return 2 * ((uint64_t)JOURNAL_MB * MIB + ((uint64_t)n + SLACK_SLOTS) * BLOCK) + SPARE_BYTES;
}

int bench_service(int argc, char **argv)
{
    if (argc >= 1 && strcmp(argv[0], "--engine") == 0) return engine_main(argc - 1, argv + 1);
    if (argc >= 1 && strcmp(argv[0], "--exec-service") == 0) return exec_service(argc, argv);
    bench_out o = {.bench = "service"};
    bool quick;
    if (!bench_options(argc, argv, &o, &quick)) return 2;
    install_cleanup();

    uint32_t n = quick ? QUICK_BLOCKS : FULL_BLOCKS;
    uint64_t avail = 0;
    while ((avail = setup_dir(dir_need(n))) < dir_need(n) && n / 2 >= MIN_BLOCKS) n /= 2;
    if (!g_have_dir)
        bench_fail("the pools need %llu MiB free in /dev/shm or /tmp (at most %llu MiB free)",
                   (unsigned long long)(dir_need(n) / MIB), (unsigned long long)(avail / MIB));
    int failover_reps = quick ? 2 : 5, cold_reps = quick ? 2 : 3, reattach_reps = quick ? 2 : 3;
    if (!o.json)
        printf("kvcr-bench service%s: ratio = value / baseline, except refill: reattach / refill "
               "(times: lower is better), all measured in this run\n"
               "pools in %s: 2 groups of %u + %u slots of %u bytes, journal %u MiB each\n\n",
               quick ? " --quick" : "", g_dir, n, SLACK_SLOTS, BLOCK, JOURNAL_MB);
    service_start((uint64_t)n + SLACK_SLOTS);

    failover_figures fo = bench_failover(failover_reps);
    reattach_figures ra = bench_reattach(n, cold_reps, reattach_reps);
    service_stop();

    char reattach_name[40], refill_name[40];
    if (n % 1000 == 0) {
        snprintf(reattach_name, sizeof reattach_name, "service_reattach_%uk", n / 1000);
        snprintf(refill_name, sizeof refill_name, "service_refill_%uk", n / 1000);
    } else {
        snprintf(reattach_name, sizeof reattach_name, "service_reattach_%u", n);
        snprintf(refill_name, sizeof refill_name, "service_refill_%u", n);
    }
    /* The ratios say how much the Guard's path costs next to the other
     * way: time over time, lower is better (the definition; with
     * bench.h's lower_is_better the first one would print as 0.00). */
    bench_report(&o, &(bench_figure){.name = "service_failover_first_block",
                                     .value = fo.first * 1e3, .unit = "ms",
                                     .baseline = "live deliver", .baseline_value = fo.live * 1e3});
    bench_report(&o, &(bench_figure){.name = reattach_name, .value = ra.reattach, .unit = "s",
                                     .baseline = "cold create", .baseline_value = ra.cold});
    bench_report(&o, &(bench_figure){.name = refill_name, .value = ra.refill, .unit = "s",
                                     .baseline = "reattach", .baseline_value = ra.reattach,
                                     .lower_is_better = true /* reattach / refill */});
    if (!o.json)
        printf("\nfailover: first block %.1f ms after the death, live delivery %.3f ms (medians "
               "of %d kills); the Guard served %.1f ms after it saw the death (its "
               "kvcr_guard_last_promotion_seconds); %d-%d attempt(s) refused first\n"
               "reattach %.1f ms (median of %d), cold create %.1f ms (median of %d), refill "
               "%.1f ms\n",
               fo.first * 1e3, fo.live * 1e3, failover_reps, fo.promotion * 1e3, fo.min_refused,
               fo.max_refused, ra.reattach * 1e3, reattach_reps, ra.cold * 1e3, cold_reps,
               ra.refill * 1e3);
    g_ok = true;
    remove_dir();
    return 0;
}
