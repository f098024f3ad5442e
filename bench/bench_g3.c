/* kvcr-bench g3: the G3 disk tier against fio on the same file, and its
 * warm restart.
 *
 * Bandwidth, 2 MiB blocks, queue depths 1, 4 and 16: the slot store
 * (g3_store_write / g3_store_read, driven by its eventfd and
 * g3_store_progress as the tier's I/O thread drives it) against fio with
 * O_DIRECT on io_uring over the same byte range of the same file, same block
 * size, same depth, the same kind of memory (4 KiB pages: neither side asks
 * for huge pages), measured in the same run, each side first in every other
 * repetition, the median of each side reported. Then one end-to-end figure of
 * each direction through the public API: spills of blocks evicted from a
 * small KVCR DRAM pool, and deliver from G3 into framework memory. Last,
 * the warm restart: kvcr_create() of an instance whose G3 file holds 100
 * thousand written slots.
 *
 * Everything lives in a fresh directory under /var/tmp (O_DIRECT needs a
 * real file system, not tmpfs), removed at exit, also after a failure or
 * SIGINT/SIGTERM. Every wait is bounded; any failure says what and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "kvcr/kvcr.h"
#include "tiers/g3_store.h"
#include "util/log.h"

extern char **environ;

#define MIB (1024ull * 1024ull)
#define BIG (2 * MIB)    /* the bandwidth cases' block and slot */
#define SMALL 4096ull    /* the restart case's slot */
#define KEY_LEN 16
#define N_PATTERNS 32    /* distinct 2 MiB contents, 64 MiB */
#define BASE_DIR "/var/tmp"
#define GOAL_RATIO 0.85  /* of fio, every bandwidth case (spill and deliver too) */
#define RESTART_GOAL_S 1.0
#define SPILL_QD 16      /* the instance's queue depth: the default */
#define FILL_QD 64       /* filling the restart file (untimed) */
#define RESTART_SAMPLE 256
#define RESTART_POOL 64  /* KVCR DRAM slots of the restarted instance (G3 needs some) */

/* Bounds: one pass of the store over its file, one fio run (fio's own
 * --runtime is below it), a case's repetitions after the first, and
 * KVCR's operation deadline before our wait on it. */
#define PASS_LIMIT_S 120.0
#define FIO_LIMIT_S 120.0
#define FIO_RUNTIME "--runtime=100"
#define CASE_BUDGET_S 30.0
#define MAX_REPS 8 /* samples kept of one figure */
#define OP_TIMEOUT_MS 30000u
#define WAIT_LIMIT_S 35.0

/* ---- files, cleanup ------------------------------------------------------- */

enum { F_STORE, F_SPILL, F_RESTART, F_FIO_ERR, N_FILES };
static const char *const file_names[N_FILES] = {"store.g3", "spill.g3", "restart.g3",
                                                 "fio.stderr"};
static char g_dir[PATH_MAX];
static char g_path[N_FILES][PATH_MAX];
static volatile sig_atomic_t g_have_dir;
static volatile pid_t g_child; /* a running fio */
static pid_t g_owner;

/* Async-signal-safe: only kill, waitpid, unlink and rmdir. */
static void remove_all(void)
{
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
        g_child = 0;
    }
    if (!g_have_dir) return;
    for (int i = 0; i < N_FILES; i++) unlink(g_path[i]);
    rmdir(g_dir);
    g_have_dir = 0;
}

static void cleanup(void)
{
    if (getpid() == g_owner) remove_all();
}

static void on_signal(int sig)
{
    remove_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void setup_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "%s/kvcr-bench-g3.XXXXXX", BASE_DIR);
    if (mkdtemp(g_dir) == NULL)
        bench_fail("cannot create a directory under %s: %s", BASE_DIR, strerror(errno));
    for (int i = 0; i < N_FILES; i++)
        if (snprintf(g_path[i], sizeof g_path[i], "%s/%s", g_dir, file_names[i]) >=
            (int)sizeof g_path[i])
            bench_fail("path too long under %s", g_dir);
    g_owner = getpid();
    g_have_dir = 1;
    atexit(cleanup);
    bench_trap_signals(on_signal);
}

static uint64_t free_bytes(void)
{
    struct statvfs v;
    if (statvfs(g_dir, &v) != 0) bench_fail("statvfs %s: %s", g_dir, strerror(errno));
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* ---- small helpers --------------------------------------------------------- */

/* Block keys, the same for the store and for an instance on its file. */
static void make_key(uint8_t *k, uint64_t id)
{
    char t[KEY_LEN + 1];
    snprintf(t, sizeof t, "g3bench-%08llx", (unsigned long long)(id & 0xffffffffu));
    memcpy(k, t, KEY_LEN);
}

static const char *io_error(int err)
{
    return err == G3_CORRUPT ? "G3_CORRUPT (record, key or checksum did not verify)"
                             : strerror(-err);
}

/* ---- the store, driven as the tier's I/O thread drives it ---------------------- */

typedef struct drive drive;

typedef struct io_req {
    drive *d;
    uint64_t slot;
    uint32_t idx; /* its place in reqs, and its buffer */
} io_req;

/* Up to `window` requests outstanding. Writes take their bytes from one of
 * N_PATTERNS pattern blocks (patterns set) or fill their own buffer for the
 * slot (patterns NULL); reads land in their own buffer. Slot s of a pass
 * with salt t holds pattern (s + t) mod N_PATTERNS, or fill_block seed
 * t + s + 1: every write pass changes every slot's bytes. */
struct drive {
    g3_store *st;
    size_t block;
    const uint8_t *patterns;
    uint8_t *bufs;
    size_t window;
    io_req *reqs;
    uint32_t *free_idx;
    size_t n_free;
    /* the pass */
    bool write, check;
    uint64_t salt;
    size_t done;
    int err;
    uint64_t err_slot;
    bool mismatch;
    uint64_t bad_slot;
};

static void drive_init(drive *d, g3_store *st, size_t block, size_t window,
                       const uint8_t *patterns)
{
    memset(d, 0, sizeof *d);
    d->st = st;
    d->block = block;
    d->patterns = patterns;
    d->window = window;
    d->bufs = bench_xalloc(window * block);
    memset(d->bufs, 0, window * block); /* no page faults while timed */
    d->reqs = calloc(window, sizeof *d->reqs);
    d->free_idx = calloc(window, sizeof *d->free_idx);
    if (d->reqs == NULL || d->free_idx == NULL) bench_fail("out of memory");
    for (size_t i = 0; i < window; i++) d->free_idx[d->n_free++] = (uint32_t)(window - 1 - i);
}

static void drive_free(drive *d)
{
    free(d->bufs);
    free(d->reqs);
    free(d->free_idx);
}

static const uint8_t *pattern_of(const drive *d, uint64_t slot)
{
    return d->patterns + ((slot + d->salt) % N_PATTERNS) * d->block;
}

static bool holds_written(const drive *d, const uint8_t *p, uint64_t slot)
{
    if (d->patterns) return memcmp(p, pattern_of(d, slot), d->block) == 0;
    return bench_has_block(p, d->block, d->salt + slot + 1);
}

static void on_io(void *ud, int result)
{
    io_req *r = ud;
    drive *d = r->d;
    if (result != 0 && d->err == 0) {
        d->err = result;
        d->err_slot = r->slot;
    } else if (result == 0 && !d->write && d->check && !d->mismatch &&
               !holds_written(d, d->bufs + (size_t)r->idx * d->block, r->slot)) {
        d->mismatch = true;
        d->bad_slot = r->slot;
    }
    d->free_idx[d->n_free++] = r->idx;
    d->done++;
}

/* Writes or reads slots first, first + stride, ... (n of them); returns the
 * seconds from the first submission to the last callback. check: compare
 * what every read returned with what the last write pass (salt) wrote. */
static double drive_pass(drive *d, bool write, uint64_t first, size_t n, uint64_t stride,
                         bool check, const char *what)
{
    d->write = write;
    d->check = check;
    d->done = 0;
    d->err = 0;
    d->mismatch = false;
    size_t submitted = 0;
    double t0 = tool_now(), until = t0 + PASS_LIMIT_S;
    while (d->done < n) {
        g3_store_plug(d->st); /* as the tier's I/O thread submits what it finds queued */
        while (submitted < n && d->n_free > 0) {
            uint32_t k = d->free_idx[--d->n_free];
            io_req *r = &d->reqs[k];
            uint64_t slot = first + submitted * stride;
            *r = (io_req){d, slot, k};
            uint8_t key[KEY_LEN];
            make_key(key, slot);
            uint8_t *buf = d->bufs + (size_t)k * d->block;
            int rc;
            if (write) {
                const uint8_t *src = buf;
                if (d->patterns)
                    src = pattern_of(d, slot);
                else
                    bench_fill_block(buf, d->block, d->salt + slot + 1);
                rc = g3_store_write(d->st, slot, key, KEY_LEN, src, d->block, on_io, r, NULL);
            } else {
                rc = g3_store_read(d->st, slot, key, KEY_LEN, buf, d->block, on_io, r);
            }
            bench_check(rc, write ? "g3_store_write" : "g3_store_read");
            submitted++;
        }
        g3_store_unplug(d->st);
        double left = until - tool_now();
        if (left <= 0)
            bench_fail("%s: %zu of %zu requests done after %.0f s", what, d->done, n,
                       PASS_LIMIT_S);
        struct pollfd p = {g3_store_fd(d->st), POLLIN, 0};
        poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        g3_store_progress(d->st);
        if (d->err)
            bench_fail("%s: slot %llu completed with %s", what, (unsigned long long)d->err_slot,
                       io_error(d->err));
        if (d->mismatch)
            bench_fail("%s: slot %llu read back other bytes than were written", what,
                       (unsigned long long)d->bad_slot);
    }
    return tool_now() - t0;
}

static kvcr_logger g_log; /* the store's warnings go to stderr */

static g3_store *store_open(const char *path, uint64_t slots, uint64_t slot_size, unsigned qd)
{
    const char *paths[1] = {path};
    g3_store_options so = {.paths = paths,
                           .n_paths = 1,
                           .capacity_bytes_per_file = slots * slot_size,
                           .slot_size = slot_size,
                           .queue_depth = qd,
                           .log = &g_log};
    g3_store *st;
    bench_check(g3_store_open(&so, &st), "g3_store_open");
    /* Writes over existing files need the highest generation on disk. */
    bench_check(g3_store_scan(st, NULL, NULL, NULL), "g3_store_scan");
    return st;
}

/* ---- fio ------------------------------------------------------------------------ */

/* Runs argv (a child, bounded by limit_s) with stdout captured into out and
 * stderr into the fio.stderr file, which is shown if it fails. */
static void run_capture(char *const argv[], char *out, size_t cap, double limit_s)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) bench_fail("pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, g_path[F_FIO_ERR], O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        bench_fail("cannot run %s: %s (scripts/setup.sh installs the fio package)", argv[0],
                   strerror(rc));
    }
    g_child = pid;
    size_t got = 0;
    double until = tool_now() + limit_s;
    for (;;) {
        double left = until - tool_now();
        if (left <= 0) bench_fail("%s did not finish within %.0f s", argv[0], limit_s);
        struct pollfd pf = {p[0], POLLIN, 0};
        int n = poll(&pf, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR) bench_fail("poll: %s", strerror(errno));
        if (n <= 0) continue;
        ssize_t r = read(p[0], out + got, cap - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) bench_fail("reading %s's output: %s", argv[0], strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
        if (got == cap - 1) bench_fail("%s printed more than %zu bytes", argv[0], cap - 1);
    }
    close(p[0]);
    out[got] = '\0';
    int status = 0;
    for (;;) { /* its output ended: it is exiting */
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) bench_fail("waitpid %s: %s", argv[0], strerror(errno));
        if (tool_now() > until) bench_fail("%s did not exit within %.0f s", argv[0], limit_s);
        usleep(1000);
    }
    g_child = 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    char err[2048] = "";
    int fd = open(g_path[F_FIO_ERR], O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, err, sizeof err - 1);
        err[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    fprintf(stderr, "%s", err);
    if (WIFEXITED(status))
        bench_fail("%s exited with status %d", argv[0], WEXITSTATUS(status));
    bench_fail("%s was killed by signal %d", argv[0], WTERMSIG(status));
}

/* The value after "name" : (whitespace allowed), at or after p, or NULL.
 * want_object: only a key whose value is an object counts (fio's "rw" option
 * has the value "read", the job's "read" key an object). */
static const char *json_value(const char *p, const char *name, bool want_object)
{
    size_t n = strlen(name);
    for (const char *q = p; (q = strstr(q, name)) != NULL; q += n) {
        const char *r = q + n;
        while (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r') r++;
        if (*r != ':') continue;
        r++;
        while (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r') r++;
        if (!want_object || *r == '{') return r;
    }
    return NULL;
}

typedef struct fio_job {
    const char *path;
    uint64_t offset, size;
    unsigned qd;
    bool write;
} fio_job;

/* fio over the same bytes, same block size and depth: GB/s from its bw_bytes. */
static double fio_gbs(const fio_job *j)
{
    char file[PATH_MAX + 16], depth[32], rw[16], offset[48], size[48];
    snprintf(file, sizeof file, "--filename=%s", j->path);
    snprintf(depth, sizeof depth, "--iodepth=%u", j->qd);
    snprintf(rw, sizeof rw, "--rw=%s", j->write ? "write" : "read");
    snprintf(offset, sizeof offset, "--offset=%llu", (unsigned long long)j->offset);
    snprintf(size, sizeof size, "--size=%llu", (unsigned long long)j->size);
    char *argv[] = {"fio", "--name=kvcr-bench-g3", file, "--direct=1", "--ioengine=io_uring",
                    "--bs=2M", depth, rw, offset, size, "--numjobs=1", "--thread",
                    "--fallocate=none", FIO_RUNTIME, "--output-format=json", NULL};
    static char out[1 << 20];
    run_capture(argv, out, sizeof out, FIO_LIMIT_S);
    const char *what = j->write ? "write" : "read";
    const char *jobs = json_value(out, "\"jobs\"", false);
    const char *e = jobs ? json_value(jobs, "\"error\"", false) : NULL;
    const char *sec = jobs ? json_value(jobs, j->write ? "\"write\"" : "\"read\"", true) : NULL;
    const char *io = sec ? json_value(sec, "\"io_bytes\"", false) : NULL;
    const char *bw = sec ? json_value(sec, "\"bw_bytes\"", false) : NULL;
    if (e == NULL || io == NULL || bw == NULL)
        bench_fail("fio (%s, depth %u): no job, io_bytes or bw_bytes in its JSON output", what,
                   j->qd);
    if (strtol(e, NULL, 10) != 0)
        bench_fail("fio (%s, depth %u) reports error %ld", what, j->qd, strtol(e, NULL, 10));
    unsigned long long moved = strtoull(io, NULL, 10);
    double bytes_s = strtod(bw, NULL);
    if (moved != j->size)
        bench_fail("fio (%s, depth %u) moved %llu bytes of %llu", what, j->qd, moved,
                   (unsigned long long)j->size);
    if (!(bytes_s > 0)) bench_fail("fio (%s, depth %u) reports no bandwidth", what, j->qd);
    return bytes_s / 1e9;
}

static void fio_version(char *buf, size_t cap)
{
    char *argv[] = {"fio", "--version", NULL};
    static char out[4096];
    run_capture(argv, out, sizeof out, 30.0);
    size_t n = strcspn(out, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(buf, out, n);
    buf[n] = '\0';
}

/* ---- sizes, goals ------------------------------------------------------------------ */

typedef struct sizes {
    size_t bw_slots;    /* 2 MiB slots of the bandwidth file */
    int reps;           /* repetitions of every bandwidth case */
    size_t pool, batch; /* end to end: KVCR DRAM slots, blocks per deposit */
    size_t spilled;     /* blocks spilled per round (= G3 slots) */
    int rounds;
    size_t restart_slots;
    int restart_reps;
} sizes;

static const sizes full_sizes = {512, 5, 16, 8, 256, 3, 100000, 3};
static const sizes quick_sizes = {16, 1, 4, 2, 8, 1, 10000, 1};

static const char *goal(char *buf, size_t cap, bool quick, const char *what, bool met)
{
    if (quick) return NULL; /* goals are set for the full sizes */
    snprintf(buf, cap, "%s: %s", what, met ? "met" : "MISSED");
    return buf;
}

/* ---- store bandwidth against fio ------------------------------------------------------ */

/* Every repetition's figure of one side of a case. The median is reported:
 * fio's own figure on this kind of device moves by 2-3x between
 * repetitions (the host's cache), so the best of N compares the luckiest
 * draw of the noisier side with the other's, and that is what the median
 * of both sides, measured in the same alternating repetitions, avoids. */
typedef struct samples {
    double v[MAX_REPS];
    int n;
} samples;

static void sample_add(samples *s, double v)
{
    if (s->n < MAX_REPS) s->v[s->n++] = v;
}

static double median(const samples *s)
{
    if (s->n == 0) return 0;
    double v[MAX_REPS];
    memcpy(v, s->v, (size_t)s->n * sizeof *v);
    double upper = bench_median(v, (size_t)s->n); /* sorts v */
    return s->n % 2 ? upper : (v[s->n / 2 - 1] + upper) / 2;
}

typedef struct bw_figures {
    samples write, read, fio_write, fio_read;
} bw_figures;

static uint64_t g_salt; /* a new one for every write pass */

/* One untimed write of the whole file: both sides then overwrite written
 * blocks (a first write of a preallocated extent costs the file system
 * more), and the first read finds data. */
static void prefill(const sizes *z, const uint8_t *patterns)
{
    g3_store *st = store_open(g_path[F_STORE], z->bw_slots, BIG, 16);
    drive d;
    drive_init(&d, st, BIG, 32, patterns);
    d.salt = ++g_salt;
    drive_pass(&d, true, 0, z->bw_slots, 1, false, "prefill");
    drive_free(&d);
    g3_store_close(st);
}

static void fio_write(fio_job *fj, bw_figures *f)
{
    fj->write = true;
    double v = fio_gbs(fj);
    sample_add(&f->fio_write, v);
}

static void fio_read(fio_job *fj, bw_figures *f)
{
    fj->write = false;
    double v = fio_gbs(fj);
    sample_add(&f->fio_read, v);
}

static void store_write(drive *d, const sizes *z, bw_figures *f)
{
    char what[64];
    snprintf(what, sizeof what, "store write, depth %u", (unsigned)(d->window / 2));
    d->salt = ++g_salt;
    double v = bench_gbs(z->bw_slots * BIG, drive_pass(d, true, 0, z->bw_slots, 1, false, what));
    sample_add(&f->write, v);
}

/* Timed, then (untimed) a sample of slots, all with --quick, must hold the
 * bytes of the last write pass; the store verified the key and checksum of
 * every read. */
static void store_read(drive *d, const sizes *z, bw_figures *f)
{
    char what[64];
    snprintf(what, sizeof what, "store read, depth %u", (unsigned)(d->window / 2));
    double v = bench_gbs(z->bw_slots * BIG, drive_pass(d, false, 0, z->bw_slots, 1, false, what));
    sample_add(&f->read, v);
    uint64_t stride = z->bw_slots / 16 ? z->bw_slots / 16 : 1;
    snprintf(what, sizeof what, "checking reads, depth %u", (unsigned)(d->window / 2));
    drive_pass(d, false, 0, (z->bw_slots + stride - 1) / stride, stride, true, what);
}

static void bench_bw(bench_out *o, const sizes *z, unsigned qd, const uint8_t *patterns,
                     bool quick, bw_figures *f)
{
    g3_store *st = store_open(g_path[F_STORE], z->bw_slots, BIG, qd);
    g3_location first, last;
    bench_check(g3_store_locate(st, 0, &first), "g3_store_locate");
    bench_check(g3_store_locate(st, z->bw_slots - 1, &last), "g3_store_locate");
    uint64_t bytes = z->bw_slots * BIG;
    if (last.data_offset + BIG - first.data_offset != bytes)
        bench_fail("the store's slots are not one contiguous range of its file");
    /* fio covers exactly the slots' data: same file, same offsets. */
    fio_job fj = {first.path, first.data_offset, bytes, qd, true};
    drive d;
    /* Twice the depth outstanding: the store's FIFO always holds the next
     * requests, as it does behind the I/O thread. */
    drive_init(&d, st, BIG, 2 * qd, patterns);
    *f = (bw_figures){0};
    char name[64];
    /* Each side goes first in every other repetition. The store reads only
     * right after its own writes (no fio write in between); fio reads
     * whatever was last written, the store's bytes. */
    double until = tool_now() + CASE_BUDGET_S;
    for (int rep = 0; rep < z->reps && rep < MAX_REPS && (rep == 0 || tool_now() < until); rep++) {
        if (rep % 2 == 0) {
            fio_write(&fj, f);
            store_write(&d, z, f);
            store_read(&d, z, f);
            fio_read(&fj, f);
        } else {
            fio_read(&fj, f);
            store_read(&d, z, f);
            store_write(&d, z, f);
            fio_write(&fj, f);
        }
    }
    drive_free(&d);
    g3_store_close(st);

    char g[64], base[32];
    snprintf(base, sizeof base, "fio qd%u", qd);
    snprintf(name, sizeof name, "g3_write_2m_qd%u", qd);
    double w = median(&f->write), fw = median(&f->fio_write);
    double r = median(&f->read), fr = median(&f->fio_read);
    bench_report(o, &(bench_figure){.name = name, .value = w, .unit = "GB/s",
                                    .baseline = base, .baseline_value = fw,
                                    .goal = goal(g, sizeof g, quick, ">= 0.85x",
                                                 w >= GOAL_RATIO * fw)});
    snprintf(name, sizeof name, "g3_read_2m_qd%u", qd);
    bench_report(o, &(bench_figure){.name = name, .value = r, .unit = "GB/s",
                                    .baseline = base, .baseline_value = fr,
                                    .goal = goal(g, sizeof g, quick, ">= 0.85x",
                                                 r >= GOAL_RATIO * fr)});
}

/* ---- the public API ---------------------------------------------------------------------- */

typedef struct inst {
    kvcr_t *kv;
    int fd;
} inst;

static void inst_start(inst *in, kvcr_config *cfg)
{
    bench_check(kvcr_create(cfg, &in->kv), "kvcr_create");
    in->fd = kvcr_fd(in->kv);
    if (in->fd < 0) bench_check(in->fd, "kvcr_fd");
}

static void base_config(kvcr_config *cfg, kvcr_pool_layout *layout, kvcr_dram_pool *pool,
                        kvcr_region *region, const char *const *path, uint64_t capacity)
{
    kvcr_config_init(cfg);
    cfg->agent_name = "bench-g3";
    cfg->pool_layouts = layout;
    cfg->n_pool_layouts = 1;
    cfg->local_dram = pool;
    cfg->n_local_dram = 1;
    cfg->framework_regions = region;
    cfg->n_framework_regions = 1;
    cfg->operation_timeout_ms = OP_TIMEOUT_MS;
    cfg->abandon_timeout_ms = 2 * OP_TIMEOUT_MS;
    cfg->enable_telemetry = true;
    cfg->g3.paths = path;
    cfg->g3.n_paths = 1;
    cfg->g3.capacity_bytes_per_file = capacity;
}

/* A gauge of the instance now (kvcr_stats_take; telemetry is on). */
static double gauge(inst *in, const char *name)
{
    kvcr_stats *s;
    bench_check(kvcr_stats_take(in->kv, &s), "kvcr_stats_take");
    if (s == NULL) bench_fail("kvcr_stats_take returned nothing with telemetry on");
    for (size_t i = 0; i < s->n_gauges; i++)
        if (strcmp(s->gauges[i].resource, name) == 0) {
            double v = s->gauges[i].value;
            kvcr_stats_free(s);
            return v;
        }
    kvcr_stats_free(s);
    bench_fail("no gauge %s in kvcr_stats_take", name);
}

/* Polls until op completes; every entry must succeed. */
static void wait_op(inst *in, kvcr_op_handle op, size_t n, const char *what)
{
    kvcr_results_free(bench_wait_op(in->kv, in->fd, op, n, what, WAIT_LIMIT_S, NULL));
}

/* Polls (which settles finished spills) until at most `most` spills are
 * still being written. */
static void wait_stores(inst *in, double most, const char *what)
{
    double until = tool_now() + WAIT_LIMIT_S;
    for (;;) {
        kvcr_op_result *res;
        size_t n_res;
        bench_check(kvcr_poll(in->kv, &res, &n_res), "kvcr_poll");
        kvcr_results_free(res);
        if (n_res) bench_fail("%s: an unexpected operation result", what);
        double pending = gauge(in, "g3_pending_stores");
        if (pending <= most) return;
        double left = until - tool_now();
        if (left <= 0)
            bench_fail("%s: %.0f spills still pending after %.0f s", what, pending, WAIT_LIMIT_S);
        struct pollfd p = {in->fd, POLLIN, 0};
        poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
}

/* ---- end to end: spill and deliver -------------------------------------------------------- */

/* One round: deposit spilled + pool blocks of 2 MiB through a pool of
 * `pool` slots, batch by batch, each deposit waited for; the policy
 * (g3_lru) moves every evicted block to G3. Timed from the first deposit
 * until no spill is pending. Then one deliver of every spilled block from
 * G3 into the framework region, timed to its result. */
static void e2e_round(const sizes *z, int round, uint8_t *fw, uint8_t *pool, double *spill,
                      double *deliver)
{
    size_t n = z->spilled + z->pool;
    uint64_t salt = (uint64_t)(round + 1) << 32;
    for (size_t i = 0; i < n; i++) bench_fill_block(fw + i * BIG, BIG, salt + i + 1);
    kvcr_pool_layout layout = {"", BIG};
    kvcr_dram_pool dram = {"", pool, z->pool * BIG};
    kvcr_region region = {.addr = fw, .element_size = BIG, .count = n, .label = ""};
    const char *path[1] = {g_path[F_SPILL]};
    kvcr_config cfg;
    base_config(&cfg, &layout, &dram, &region, path, z->spilled * BIG);
    cfg.g3.queue_depth = SPILL_QD;
    cfg.policy = kvcr_policy_builtin("g3_lru");
    if (cfg.policy == NULL) bench_fail("no built-in policy g3_lru");
    /* From the second round on, the file holds the last round's blocks:
     * they are found again, and the new spills evict them from G3. */
    inst in;
    inst_start(&in, &cfg);

    uint8_t (*keys)[KEY_LEN] = calloc(n, KEY_LEN);
    kvcr_mem_ref *refs = calloc(n, sizeof *refs);
    kvcr_block *blocks = calloc(n, sizeof *blocks);
    kvcr_key *qkeys = calloc(n, sizeof *qkeys);
    kvcr_query_result *q = calloc(n, sizeof *q);
    if (!keys || !refs || !blocks || !qkeys || !q) bench_fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        make_key(keys[i], ((uint64_t)round << 24) | i);
        refs[i] = (kvcr_mem_ref){NULL, "", i};
        blocks[i] = (kvcr_block){{keys[i], KEY_LEN}, &refs[i], 1};
        qkeys[i] = blocks[i].key;
    }
    /* Spills wait in staging (max_staging_bytes) while they are written; a
     * spill that finds it full is dropped. Like an engine that does not
     * outrun the disk, the next deposit waits until its evictions fit. */
    double most = (double)(cfg.g3.max_staging_bytes / BIG) - (double)z->batch;
    if (most < 0) bench_fail("a batch of %zu blocks does not fit in the G3 staging", z->batch);
    double t0 = tool_now();
    for (size_t first = 0; first < n; first += z->batch) {
        size_t k = n - first < z->batch ? n - first : z->batch;
        wait_stores(&in, most, "spill");
        kvcr_op_handle op;
        bench_check(kvcr_deposit(in.kv, blocks + first, k, 0, &op), "kvcr_deposit");
        wait_op(&in, op, k, "kvcr_deposit");
    }
    wait_stores(&in, 0, "spill");
    *spill = bench_gbs(z->spilled * BIG, tool_now() - t0);

    /* Every evicted block is in G3 (none dropped), the rest in KVCR DRAM. */
    bench_check(kvcr_query(in.kv, qkeys, n, NULL, q), "kvcr_query");
    for (size_t i = 0; i < n; i++) {
        bool in_g3 = i < z->spilled;
        if (in_g3 ? q[i].status != KVCR_QUERY_FETCHABLE || q[i].tier != KVCR_TIER_G3
                  : q[i].status != KVCR_QUERY_HIT)
            bench_fail("block %zu of the spill round answers %s in %s, expected %s", i,
                       kvcr_query_status_name(q[i].status), kvcr_tier_name(q[i].tier),
                       in_g3 ? "FETCHABLE in G3" : "HIT in DRAM");
    }
    double alloc = gauge(&in, "g3_allocated_slots");
    if (alloc != (double)z->spilled)
        bench_fail("g3_allocated_slots is %.0f after spilling %zu blocks", alloc, z->spilled);

    /* Deliver block i to element (i + shift) mod n: not where it came from,
     * so a deliver that moved nothing leaves other bytes there. */
    size_t shift = (size_t)round + 1;
    for (size_t i = 0; i < z->spilled; i++) refs[i].index = (i + shift) % n;
    kvcr_op_handle op;
    t0 = tool_now();
    bench_check(kvcr_deliver(in.kv, blocks, z->spilled, NULL, &op), "kvcr_deliver");
    wait_op(&in, op, z->spilled, "kvcr_deliver");
    *deliver = bench_gbs(z->spilled * BIG, tool_now() - t0);
    for (size_t i = 0; i < z->spilled; i++)
        if (!bench_has_block(fw + refs[i].index * BIG, BIG, salt + i + 1))
            bench_fail("block %zu delivered from G3 holds other bytes than were deposited", i);

    kvcr_free(in.kv);
    free(keys);
    free(refs);
    free(blocks);
    free(qkeys);
    free(q);
}

static void bench_e2e(bench_out *o, const sizes *z, const bw_figures *qd16, bool quick)
{
    size_t n = z->spilled + z->pool;
    uint8_t *fw = bench_xalloc(n * BIG), *pool = bench_xalloc(z->pool * BIG);
    memset(pool, 0, z->pool * BIG);
    samples spill = {0}, deliver = {0};
    double until = tool_now() + CASE_BUDGET_S;
    for (int r = 0; r < z->rounds && r < MAX_REPS && (r == 0 || tool_now() < until); r++) {
        double s, d;
        e2e_round(z, r, fw, pool, &s, &d);
        sample_add(&spill, s);
        sample_add(&deliver, d);
    }
    free(fw);
    free(pool);
    unlink(g_path[F_SPILL]);
    double s = median(&spill), fio_w = median(&qd16->fio_write);
    double d = median(&deliver), fio_r = median(&qd16->fio_read);
    char g[64], h[64];
    bench_report(o, &(bench_figure){.name = "g3_spill_2m", .value = s, .unit = "GB/s",
                                    .baseline = "fio qd16", .baseline_value = fio_w,
                                    .goal = goal(g, sizeof g, quick, ">= 0.85x",
                                                 s >= GOAL_RATIO * fio_w)});
    bench_report(o, &(bench_figure){.name = "g3_deliver_2m", .value = d, .unit = "GB/s",
                                    .baseline = "fio qd16", .baseline_value = fio_r,
                                    .goal = goal(h, sizeof h, quick, ">= 0.85x",
                                                 d >= GOAL_RATIO * fio_r)});
}

/* ---- warm restart ---------------------------------------------------------------------------- */

static void bench_restart(bench_out *o, const sizes *z, bool quick)
{
    size_t n = z->restart_slots;
    const uint64_t salt = 0x5157000000ull;
    /* The file: n slots of 4 KiB, each written (data and record) by the
     * store with its key and its own bytes. */
    g3_store *st = store_open(g_path[F_RESTART], n, SMALL, FILL_QD);
    drive d;
    drive_init(&d, st, SMALL, 2 * FILL_QD, NULL);
    d.salt = salt;
    drive_pass(&d, true, 0, n, 1, false, "filling the restart file");
    drive_free(&d);
    g3_store_close(st);

    uint8_t *fw = bench_xalloc(RESTART_SAMPLE * SMALL), *pool = bench_xalloc(RESTART_POOL * SMALL);
    memset(pool, 0, RESTART_POOL * SMALL);
    kvcr_pool_layout layout = {"", SMALL};
    kvcr_dram_pool dram = {"", pool, RESTART_POOL * SMALL};
    kvcr_region region = {.addr = fw, .element_size = SMALL, .count = RESTART_SAMPLE, .label = ""};
    const char *path[1] = {g_path[F_RESTART]};
    kvcr_config cfg;
    base_config(&cfg, &layout, &dram, &region, path, n * SMALL);

    uint8_t (*keys)[KEY_LEN] = calloc(RESTART_SAMPLE, KEY_LEN);
    kvcr_mem_ref *refs = calloc(RESTART_SAMPLE, sizeof *refs);
    kvcr_block *blocks = calloc(RESTART_SAMPLE, sizeof *blocks);
    uint64_t *slot_of = calloc(RESTART_SAMPLE, sizeof *slot_of);
    if (!keys || !refs || !blocks || !slot_of) bench_fail("out of memory");
    double best = 1e30, until = tool_now() + CASE_BUDGET_S;
    for (int rep = 0; rep < z->restart_reps && (rep == 0 || tool_now() < until); rep++) {
        inst in;
        double t0 = tool_now();
        inst_start(&in, &cfg); /* open, scan, index rebuild */
        double s = tool_now() - t0;
        if (s < best) best = s;

        double alloc = gauge(&in, "g3_allocated_slots");
        if (alloc != (double)n)
            bench_fail("after the restart g3_allocated_slots is %.0f, the file holds %zu", alloc,
                       n);
        /* A sample spread over the file (first and last slot included),
         * delivered from G3 into framework memory and compared. */
        memset(fw, 0, RESTART_SAMPLE * SMALL);
        for (size_t k = 0; k < RESTART_SAMPLE; k++) {
            slot_of[k] = (uint64_t)k * (n - 1) / (RESTART_SAMPLE - 1);
            make_key(keys[k], slot_of[k]);
            refs[k] = (kvcr_mem_ref){NULL, "", (k * 7 + (size_t)rep) % RESTART_SAMPLE};
            blocks[k] = (kvcr_block){{keys[k], KEY_LEN}, &refs[k], 1};
        }
        kvcr_op_handle op;
        bench_check(kvcr_deliver(in.kv, blocks, RESTART_SAMPLE, NULL, &op), "kvcr_deliver");
        wait_op(&in, op, RESTART_SAMPLE, "kvcr_deliver after the restart");
        for (size_t k = 0; k < RESTART_SAMPLE; k++)
            if (!bench_has_block(fw + refs[k].index * SMALL, SMALL, salt + slot_of[k] + 1))
                bench_fail("slot %llu delivered after the restart holds other bytes than written",
                           (unsigned long long)slot_of[k]);
        kvcr_free(in.kv);
    }
    free(keys);
    free(refs);
    free(blocks);
    free(slot_of);
    free(fw);
    free(pool);
    unlink(g_path[F_RESTART]);

    char name[32], g[64];
    if (n % 1000 == 0)
        snprintf(name, sizeof name, "g3_restart_%zuk", n / 1000);
    else
        snprintf(name, sizeof name, "g3_restart_%zu", n);
    bench_report(o, &(bench_figure){.name = name, .value = best, .unit = "s",
                                    .lower_is_better = true,
                                    .goal = n == 100000 ? goal(g, sizeof g, quick, "< 1 s",
                                                               best < RESTART_GOAL_S)
                                                        : NULL});
}

/* ---- entry ---------------------------------------------------------------------------------- */

int bench_g3(int argc, char **argv)
{
    bench_out o = {.bench = "g3"};
    bool quick;
    if (!bench_options(argc, argv, &o, &quick)) return 2;
    kvcr_logger_init(&g_log, "bench-g3", NULL, NULL);
    setup_dir();
    char version[128];
    fio_version(version, sizeof version);

    sizes z = quick ? quick_sizes : full_sizes;
    /* One file at a time (each case removes its own); keep 1 GiB spare. */
    uint64_t avail = free_bytes(), spare = quick ? 256 * MIB : 1024 * MIB;
    uint64_t restart_need = z.restart_slots * (SMALL + G3_RECORD_SIZE) + 2 * MIB;
    while (!quick && z.bw_slots > 64 && z.bw_slots * BIG + spare > avail) z.bw_slots /= 2;
    while (!quick && z.spilled > 32 && z.spilled * BIG + spare > avail) z.spilled /= 2;
    uint64_t need = z.bw_slots * BIG;
    if (z.spilled * BIG > need) need = z.spilled * BIG;
    if (restart_need > need) need = restart_need;
    if (need + spare > avail)
        bench_fail("%s needs %llu MiB free (has %llu MiB)", BASE_DIR,
                   (unsigned long long)((need + spare) / MIB), (unsigned long long)(avail / MIB));
    if (!o.json)
        printf("kvcr-bench g3%s: ratio = ours / baseline, both measured in this run\n"
               "files in %s; %llu MiB per bandwidth case, 2 MiB blocks; %s, O_DIRECT, io_uring\n\n",
               quick ? " --quick" : "", g_dir, (unsigned long long)(z.bw_slots * BIG / MIB),
               version);

    uint8_t *patterns = bench_xalloc(N_PATTERNS * BIG);
    for (size_t i = 0; i < N_PATTERNS; i++) bench_fill_block(patterns + i * BIG, BIG, i + 1);
    prefill(&z, patterns);
    static const unsigned depths[] = {1, 4, 16};
    bw_figures f[3];
    for (size_t i = 0; i < 3; i++) bench_bw(&o, &z, depths[i], patterns, quick, &f[i]);
    free(patterns);
    unlink(g_path[F_STORE]);

    bench_e2e(&o, &z, &f[2], quick);
    bench_restart(&o, &z, quick);
    return 0;
}
