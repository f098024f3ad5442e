/* kvcr demo --chaos: faults while the workload runs, on the driver.
 *
 * The environment: a KVCR service (its claim socket and pool files in a
 * directory under /dev/shm), every engine in guard mode on pool group =
 * its number, and every engine's G3 slot file on a small ext4 file system
 * loop-mounted from an image under /var/tmp (a plain directory when the
 * machine cannot mount one: the disk-full fault is then injected only).
 *
 * The faults, one at a time, at random intervals of 0.4-1.6 s, the kinds
 * (--faults, default all) in a shuffled cycle so that each comes round
 * (all seeded by --seed):
 *   kill     SIGKILL an engine that is up; 0.5-2 s later, once its Guard
 *            serves (at most 10 s more), start it again: it claims its
 *            group back and recovers its blocks, its G3 file's too.
 *   stop     SIGSTOP an engine for 200-600 ms, then SIGCONT.
 *   corrupt  flip 16 bytes in the data of a FULL slot of an engine's G3
 *            file, then ask that engine for exactly that block: the read
 *            must fail its checksum (CORRUPT) and the block be recomputed.
 *   full     fill the G3 file system to ENOSPC for 1-2.5 s. G3 slot files
 *            are preallocated when opened (posix_fallocate), so no slot
 *            write can meet the full disk; for the window every engine's
 *            next G3 I/O completions also fail with ENOSPC through the
 *            I/O-layer hook the G3 tests use (kvcr__test_g3_fail_next).
 *
 * Cleanup: the driver ends the service (SIGTERM, then SIGKILL), removes
 * the files, unmounts and removes the directories at the end of the run,
 * at exit() and after SIGINT/SIGTERM/SIGHUP (the handler only sets a flag
 * that demo_chaos_step turns into a failed run). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo.h"
#include "kvcr/kvcr.h"
#include "daemon/service.h"
#include "tiers/g3_store.h"

#define FAULT_GAP_MIN_S 0.4
#define FAULT_GAP_MAX_S 1.6
#define KIND_PATIENCE_S 5.0  /* a kind that cannot run this long is passed over */
#define GUARD_WAIT_S 10.0    /* a killed engine's Guard is waited for at most this long */
#define HELLO_WAIT_S 60.0    /* a restarted engine must be up within this */
#define REAP_WAIT_S 10.0     /* a SIGKILLed process must be reaped within this */
#define SERVICE_WAIT_S 15.0  /* start and stop of the service */
#define HELPER_WAIT_S 60.0   /* mkfs.ext4, mount */
#define FAIL_IO_N 4          /* G3 completions failed per engine per disk-full window */

/* ---- the environment: directories, the G3 file system, the service ---------------- */

static struct {
    pid_t owner;
    pid_t service;
    int engines;
    bool have_shm, have_var, mounted;
    char shm[64];   /* /dev/shm/kvcr-chaos.XXXXXX: claim socket, pool files */
    char var[64];   /* /var/tmp/kvcr-chaos.XXXXXX: the image and its mount point */
    char img[96], mnt[96], sock[96], log[96], filler[128];
    char g3_dir[96]; /* mnt, or var when nothing could be mounted */
} env;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

static bool reap(pid_t pid, int sig_first, double patience, int *status);

/* Runs a helper (mkfs.ext4, mount) with its output in the service log;
 * true when it exited 0 within HELPER_WAIT_S. */
static bool run(const char *const argv[])
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(env.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    return pid > 0 && reap(pid, 0, HELPER_WAIT_S, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static const char *first_existing(const char *a, const char *b)
{
    return access(a, X_OK) == 0 ? a : b;
}

/* A small ext4 for the G3 files, so that "full" is a real full disk: the
 * files, the filler and ext4's own overhead. */
static bool mount_g3_disk(uint64_t g3_bytes)
{
    snprintf(env.img, sizeof env.img, "%s/g3.img", env.var);
    snprintf(env.mnt, sizeof env.mnt, "%s/g3", env.var);
    uint64_t size = g3_bytes + g3_bytes / 8 + (24u << 20);
    int fd = open(env.img, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && ftruncate(fd, (off_t)size) == 0;
    if (fd >= 0) close(fd);
    if (!ok || mkdir(env.mnt, 0700) != 0) return false;
    const char *mkfs[] = {first_existing("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"),
                          "-q", "-F", "-m", "0", env.img, NULL};
    const char *mnt[] = {first_existing("/usr/bin/mount", "/bin/mount"), "-o", "loop", env.img,
                         env.mnt, NULL};
    if (!run(mkfs) || !run(mnt)) return false;
    env.mounted = true;
    return true;
}

static void unmount_g3_disk(void)
{
    if (!env.mounted) return;
    /* The engines are gone by now; lazily if something still holds it. */
    if (umount2(env.mnt, 0) != 0 && umount2(env.mnt, MNT_DETACH) != 0)
        fprintf(stderr, "kvcr demo: cannot unmount %s: %s\n", env.mnt, strerror(errno));
    else
        env.mounted = false;
}

/* The service: its own process group (a terminal's ^C is the driver's to
 * handle), dies with the driver (SIGTERM: it removes its pool files). */
static int service_start(const demo_opts *o)
{
    char groups[16], gb[64];
    snprintf(groups, sizeof groups, "%d", o->engines);
    snprintf(gb, sizeof gb, "%.15g", (double)o->slots * (double)o->block_size / 1073741824.0);
    const char *argv[] = {"kvcr", "service", "--socket-path", env.sock, "--pool-dir", env.shm,
                          "--guard-count", groups, "--pool-sizes-gb", gb,
                          "--compatibility-digest", o->digest, "--journal-mb", "8",
                          "--log-level", "warn", NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != env.owner) _exit(1);
        setpgid(0, 0);
        int fd = open(env.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    if (pid < 0) return -1;
    env.service = pid;
    for (double until = tool_now() + SERVICE_WAIT_S; tool_now() < until; usleep(10000)) {
        char *text = NULL;
        if (svc_fetch_metrics(env.sock, &text) == 0) {
            free(text);
            return 0;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            env.service = 0;
            break;
        }
    }
    fprintf(stderr, "kvcr demo: the KVCR service did not come up; its log:\n");
    FILE *f = fopen(env.log, "re");
    char line[512];
    for (int i = 0; f && i < 40 && fgets(line, sizeof line, f); i++) fprintf(stderr, "  %s", line);
    if (f) fclose(f);
    return -1;
}

/* Sends sig_first (0: none), waits `patience` s for pid to end, then
 * SIGKILLs it: true once reaped (*status, may be NULL, its status; a
 * SIGKILLed helper's is a failure). */
static bool reap(pid_t pid, int sig_first, double patience, int *status)
{
    if (sig_first) kill(pid, sig_first);
    for (double until = tool_now() + patience; tool_now() < until; usleep(5000))
        if (waitpid(pid, status, WNOHANG) == pid) return true;
    kill(pid, SIGKILL);
    for (double until = tool_now() + REAP_WAIT_S; tool_now() < until; usleep(5000))
        if (waitpid(pid, status, WNOHANG) == pid) return true;
    return false;
}

static void remove_in(const char *dir, const char *name)
{
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return; /* not ours */
    if (unlink(path) != 0 && errno == EISDIR) rmdir(path);
}

/* Empties a directory (its files, and directories that are empty such as
 * lost+found), bounded. */
static void sweep(const char *dir)
{
    DIR *d = opendir(dir);
    for (int i = 0; d && i < 4096; i++) {
        struct dirent *de = readdir(d);
        if (de == NULL) break;
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            remove_in(dir, de->d_name);
    }
    if (d) closedir(d);
}

static void remove_dir(const char *dir)
{
    sweep(dir);
    if (rmdir(dir) != 0) fprintf(stderr, "kvcr demo: cannot remove %s: %s\n", dir, strerror(errno));
}

/* Everything the run made, in the order that lets each step succeed: the
 * service removes its pool files and socket on SIGTERM (a killed one
 * leaves them to the sweep). */
static void cleanup(void)
{
    if (env.owner != getpid()) return; /* a child's exit() */
    if (env.service > 0 && !reap(env.service, SIGTERM, SERVICE_WAIT_S, NULL))
        fprintf(stderr, "kvcr demo: the KVCR service (pid %d) could not be reaped\n",
                (int)env.service);
    env.service = 0;
    if (env.mounted) {
        sweep(env.mnt); /* the G3 files, the filler, lost+found */
        unmount_g3_disk();
    }
    if (env.have_var) {
        remove_dir(env.var); /* the image, the mount point, the log, or the G3 files */
        env.have_var = false;
    }
    if (env.have_shm) {
        remove_dir(env.shm);
        env.have_shm = false;
    }
}

/* ---- the faults ----------------------------------------------------------------------- */

static const char *const kind_names[DEMO_FAULTS] = {"kill", "stop", "corrupt", "full"};

int demo_chaos_kinds(const char *list, unsigned *mask)
{
    *mask = 0;
    if (strcmp(list, "none") == 0) return 0;
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        int k = 0;
        while (k < DEMO_FAULTS && (strlen(kind_names[k]) != len || strncmp(p, kind_names[k], len)))
            k++;
        if (k == DEMO_FAULTS || (*mask & 1u << k)) return -1;
        *mask |= 1u << k;
        if (p[len] == '\0') return 0;
        p += len + 1;
    }
}

enum state { E_UP, E_STOPPED, E_DOWN, E_STARTING };

struct demo_chaos {
    demo_opts *o;
    demo_chaos_figures f;
    uint64_t rng;
    bool begun, settling;
    double start, next; /* the run's first fault; the next one */
    int order[DEMO_FAULTS], n_order, at; /* the kinds --faults names */
    double kind_since;  /* when order[at] became the next kind */
    struct {
        enum state state;
        double since, until;
        char endpoint[DEMO_ENDPOINT_MAX];
    } eng[DEMO_MAX_ENGINES];
    double full_until; /* > 0: the G3 disk is full until then */
};

static double uniform(demo_chaos *c, double lo, double hi)
{
    return lo + (hi - lo) * (double)(demo_rand(&c->rng) >> 11) / 9007199254740992.0;
}

static void shuffle(demo_chaos *c)
{
    c->n_order = 0;
    for (int k = 0; k < DEMO_FAULTS; k++)
        if (c->o->faults & 1u << k) c->order[c->n_order++] = k;
    for (int i = c->n_order - 1; i > 0; i--) {
        int j = (int)(demo_rand(&c->rng) % (uint64_t)(i + 1)), t = c->order[i];
        c->order[i] = c->order[j];
        c->order[j] = t;
    }
    c->at = 0;
}

/* A random engine in state s, -1 if none. */
static int pick(demo_chaos *c, enum state s)
{
    int e = -1, seen = 0;
    for (int i = 0; i < c->o->engines; i++)
        if (c->eng[i].state == s && demo_rand(&c->rng) % (uint64_t)++seen == 0) e = i;
    return e;
}

static bool any_down(const demo_chaos *c)
{
    for (int i = 0; i < c->o->engines; i++)
        if (c->eng[i].state == E_DOWN || c->eng[i].state == E_STARTING) return true;
    return false;
}

/* One engine at a time: a second kill waits until the first is back. */
static int kill_one(demo_chaos *c, cluster *cl, double now)
{
    int e = any_down(c) ? -1 : pick(c, E_UP);
    if (e < 0) return 0;
    if (!reap(cl->pid[1 + e], SIGKILL, REAP_WAIT_S, NULL)) {
        c->f.unreaped++;
        fprintf(stderr, "kvcr demo: engine %d (pid %d) could not be reaped after SIGKILL\n", e,
                (int)cl->pid[1 + e]);
        return -1;
    }
    cl->pid[1 + e] = 0;
    cl->killed[1 + e] = true;
    c->eng[e].state = E_DOWN;
    c->eng[e].since = now;
    c->eng[e].until = now + uniform(c, 0.5, 2.0); /* after its Guard serves */
    c->f.kills++;
    return 1;
}

static int stop_one(demo_chaos *c, cluster *cl, double now)
{
    int e = pick(c, E_UP);
    if (e < 0) return 0;
    kill(cl->pid[1 + e], SIGSTOP);
    c->eng[e].state = E_STOPPED;
    c->eng[e].until = now + uniform(c, 0.2, 0.6);
    c->f.stops++;
    return 1;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Byte offsets of the G3 file format (src/tiers/g3_store.h, "File format"),
 * private to the store: should the format change, corruptions find no
 * slot, the report counts none and test-demo-chaos fails. */
enum { SB_SLOT_SIZE = 16, SB_SLOTS = 24, SB_INDEX_OFF = 32, SB_DATA_OFF = 40, SB_READ = 48 };
enum { REC_STATE = 4, REC_KEY_LEN = 5, REC_LEN = 24, REC_KEY = 40, REC_FULL_STATE = 1 };
#define REC_MAGIC_LE 0x43523347u /* "G3RC" */
#define FLIP_BYTES 16

/* A random FULL slot of engine e's G3 file whose key is a block hash:
 * FLIP_BYTES of its data inverted, on disk. *hash: its block. */
static bool corrupt_slot(demo_chaos *c, int e, uint64_t *hash)
{
    char path[160];
    snprintf(path, sizeof path, "%s/engine-%d.g3", env.g3_dir, e);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return false;
    uint8_t sb[SB_READ];
    bool ok = pread(fd, sb, sizeof sb, 0) == (ssize_t)sizeof sb && memcmp(sb, "KVCRG3SB", 8) == 0;
    uint64_t slot_size = le64(sb + SB_SLOT_SIZE), slots = le64(sb + SB_SLOTS);
    ok = ok && slots > 0 && slots <= (1u << 24) && slot_size > FLIP_BYTES;
    size_t index_bytes = ok ? (size_t)slots * G3_RECORD_SIZE : 0;
    uint8_t *index = ok ? malloc(index_bytes) : NULL;
    ok = index && pread(fd, index, index_bytes, (off_t)le64(sb + SB_INDEX_OFF)) ==
                      (ssize_t)index_bytes;
    uint64_t chosen = UINT64_MAX, seen = 0;
    for (uint64_t k = 0; ok && k < slots; k++) {
        const uint8_t *r = index + k * G3_RECORD_SIZE;
        uint64_t len = le64(r + REC_LEN);
        if (le64(r) % (1ull << 32) == REC_MAGIC_LE && r[REC_STATE] == REC_FULL_STATE &&
            r[REC_KEY_LEN] == 8 && len > FLIP_BYTES && len <= slot_size &&
            demo_rand(&c->rng) % ++seen == 0)
            chosen = k;
    }
    ok = ok && chosen != UINT64_MAX;
    if (ok) {
        const uint8_t *r = index + chosen * G3_RECORD_SIZE;
        memcpy(hash, r + REC_KEY, 8);
        off_t at = (off_t)(le64(sb + SB_DATA_OFF) + chosen * slot_size +
                           demo_rand(&c->rng) % (le64(r + REC_LEN) - FLIP_BYTES));
        uint8_t b[FLIP_BYTES];
        ok = pread(fd, b, sizeof b, at) == (ssize_t)sizeof b;
        for (int i = 0; i < FLIP_BYTES; i++) b[i] ^= 0xff; /* every bit: surely different */
        /* buffered: the kernel writes it back before the store's next O_DIRECT read */
        ok = ok && pwrite(fd, b, sizeof b, at) == (ssize_t)sizeof b && fdatasync(fd) == 0;
    }
    free(index);
    close(fd);
    return ok;
}

/* Any engine's G3 file with a written slot; the engine is asked for that
 * block at once when it is up (a probe), so the miss is seen. */
static int corrupt_one(demo_chaos *c, int *probe, uint64_t *hash)
{
    int first = (int)(demo_rand(&c->rng) % (uint64_t)c->o->engines);
    for (int i = 0; i < c->o->engines; i++) {
        int e = (first + i) % c->o->engines;
        if (!corrupt_slot(c, e, hash)) continue;
        c->f.corruptions++;
        if (c->eng[e].state == E_UP || c->eng[e].state == E_STOPPED) {
            *probe = e;
            c->f.probes++;
        }
        return 1;
    }
    return 0;
}

/* Writes zeros until the G3 file system says ENOSPC (never more than its
 * size); the filler stays until unfill. */
static uint64_t fill_disk(void)
{
    static const uint8_t zero[1 << 16];
    struct statvfs v;
    if (statvfs(env.g3_dir, &v) != 0) return 0;
    uint64_t cap = (uint64_t)v.f_blocks * v.f_frsize, bytes = 0;
    int fd = open(env.filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    for (size_t chunk = sizeof zero; chunk >= 4096; chunk /= 16) /* 64 KiB, then 4 KiB */
        for (ssize_t n = 1; n > 0 && bytes <= cap; bytes += n > 0 ? (uint64_t)n : 0)
            n = write(fd, zero, chunk);
    fsync(fd);
    close(fd);
    return bytes;
}

static int full_one(demo_chaos *c, cluster *cl, double now)
{
    if (c->full_until > 0) return 0;
    if (c->f.disk_real) c->f.disk_fill_bytes += fill_disk();
    demo_disk d = {FAIL_IO_N, ENOSPC};
    if (demo_send(cl->to_router, MSG_DISK, &d, sizeof d, NULL, 0) != 0) return -1;
    for (int i = 0; i < c->o->engines; i++)
        c->f.enospc_injected += c->eng[i].state == E_UP ? FAIL_IO_N : 0;
    c->full_until = now + uniform(c, 1.0, 2.5);
    c->f.disk_fulls++;
    return 1;
}

static void unfill(demo_chaos *c)
{
    if (c->full_until > 0 && c->f.disk_real) unlink(env.filler);
    c->full_until = 0;
}

/* The next fault of the cycle; a kind that cannot run now (nothing
 * written to G3 yet, an engine still down) is tried again shortly, and
 * passed over after KIND_PATIENCE_S. */
static int fault(demo_chaos *c, cluster *cl, double now, int *probe, uint64_t *hash)
{
    int rc;
    switch (c->order[c->at]) {
    case DEMO_FAULT_KILL: rc = kill_one(c, cl, now); break;
    case DEMO_FAULT_STOP: rc = stop_one(c, cl, now); break;
    case DEMO_FAULT_CORRUPT: rc = corrupt_one(c, probe, hash); break;
    default: rc = full_one(c, cl, now); break;
    }
    if (rc < 0) return -1;
    if (rc == 0 && now - c->kind_since < KIND_PATIENCE_S) {
        c->next = now + 0.2;
        return 0;
    }
    if (++c->at == c->n_order) shuffle(c);
    c->kind_since = now;
    c->next = now + uniform(c, FAULT_GAP_MIN_S, FAULT_GAP_MAX_S);
    return 0;
}

/* Is engine e's Guard serving (the service's metrics)? */
static bool guard_serving(int e)
{
    char name[96];
    snprintf(name, sizeof name, "kvcr_guard_phase{guard=\"%d\",phase=\"serving\"}", e);
    return tool_svc_metric(env.sock, name) == 1;
}

/* An engine that died, stopped or came back: its repairs. */
static int tend(demo_chaos *c, cluster *cl, int e, double now, double deadline)
{
    pid_t *pid = &cl->pid[1 + e];
    int st;
    if (c->eng[e].state != E_DOWN && *pid > 0 && waitpid(*pid, &st, WNOHANG) == *pid) {
        fprintf(stderr, "kvcr demo: engine %d ended by itself (%s %d); restarting it\n", e,
                WIFSIGNALED(st) ? "signal" : "status",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        *pid = 0;
        c->f.unexpected_exits++;
        c->eng[e].state = E_DOWN;
        c->eng[e].since = c->eng[e].until = now;
    }
    switch (c->eng[e].state) {
    case E_STOPPED:
        if (now >= c->eng[e].until || c->settling) {
            kill(*pid, SIGCONT);
            c->eng[e].state = E_UP;
        }
        return 0;
    case E_DOWN:
        if (now < c->eng[e].until) return 0;
        if (!guard_serving(e) && now < c->eng[e].since + GUARD_WAIT_S) {
            c->eng[e].until = now + 0.05;
            return 0;
        }
        if (demo_restart_engine(c->o, cl, e, deadline) != 0) return -1;
        c->eng[e].state = E_STARTING;
        c->eng[e].since = now;
        return 0;
    case E_STARTING:
        if (now < c->eng[e].since + HELLO_WAIT_S) return 0;
        fprintf(stderr, "kvcr demo: engine %d did not come back within %.0f s\n", e, HELLO_WAIT_S);
        return -1;
    default:
        return 0;
    }
}

/* ---- the driver's interface ------------------------------------------------------ */

int demo_chaos_start(demo_opts *o, demo_chaos **out)
{
    static char digest[64];
    static bool registered;
    *out = NULL;
    env.owner = getpid();
    env.engines = o->engines;
    if (!registered && atexit(cleanup) == 0) registered = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: waits end early */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    snprintf(env.shm, sizeof env.shm, "%s/kvcr-chaos.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    env.have_shm = mkdtemp(env.shm) != NULL;
    snprintf(env.var, sizeof env.var, "/var/tmp/kvcr-chaos.XXXXXX");
    env.have_var = mkdtemp(env.var) != NULL;
    demo_chaos *c = calloc(1, sizeof *c);
    if (!env.have_shm || !env.have_var || c == NULL) {
        fprintf(stderr, "kvcr demo: cannot make the chaos directories: %s\n", strerror(errno));
        free(c);
        cleanup();
        return -1;
    }
    snprintf(env.sock, sizeof env.sock, "%s/claim.sock", env.shm);
    snprintf(env.log, sizeof env.log, "%s/service.log", env.var);
    snprintf(digest, sizeof digest, "kvcr-demo-chaos-bs%zu", o->block_size);
    o->digest = digest;

    uint64_t index = ((uint64_t)o->g3_slots * G3_RECORD_SIZE + G3_ALIGN - 1) / G3_ALIGN * G3_ALIGN;
    uint64_t file = G3_SUPERBLOCK_SIZE + index + (uint64_t)o->g3_slots * o->block_size;
    c->f.disk_real = mount_g3_disk((uint64_t)o->engines * file);
    snprintf(env.g3_dir, sizeof env.g3_dir, "%s", c->f.disk_real ? env.mnt : env.var);
    if (!c->f.disk_real)
        fprintf(stderr, "kvcr demo: no loop-mounted ext4 for G3 (needs root and mkfs.ext4; see "
                        "%s): the disk-full fault is injected only\n", env.log);
    snprintf(env.filler, sizeof env.filler, "%s/filler", env.g3_dir);
    o->service_socket = env.sock;
    o->g3_dir = env.g3_dir;
    c->o = o;
    c->rng = o->seed ^ 0x6368616f73ull;
    if (service_start(o) != 0) {
        free(c);
        cleanup();
        return -1;
    }
    *out = c;
    return 0;
}

void demo_chaos_begin(demo_chaos *c)
{
    c->begun = true;
    c->start = c->kind_since = tool_now();
    c->next = c->start + uniform(c, FAULT_GAP_MIN_S, FAULT_GAP_MAX_S);
    shuffle(c);
}

double demo_chaos_due(const demo_chaos *c)
{
    return c->begun ? tool_now() + 0.05 : tool_now() + 1; /* repairs are checked often */
}

int demo_chaos_step(demo_chaos *c, cluster *cl, double deadline, int *probe, uint64_t *hash)
{
    *probe = -1;
    if (interrupted) {
        fprintf(stderr, "kvcr demo: interrupted (signal %d)\n", (int)interrupted);
        return -1;
    }
    if (env.service > 0 && waitpid(env.service, NULL, WNOHANG) == env.service) {
        env.service = 0;
        fprintf(stderr, "kvcr demo: the KVCR service ended\n");
        return -1;
    }
    if (!c->begun) return 0;
    double now = tool_now();
    for (int e = 0; e < c->o->engines; e++)
        if (tend(c, cl, e, now, deadline) != 0) return -1;
    if (c->full_until > 0 && (now >= c->full_until || c->settling)) unfill(c);
    bool due = !c->settling && c->n_order > 0 && now >= c->next;
    return due ? fault(c, cl, now, probe, hash) : 0;
}

bool demo_chaos_settle(demo_chaos *c, cluster *cl)
{
    if (!c->settling) c->f.chaos_s = tool_now() - c->start;
    c->settling = true;
    bool all_up = true;
    for (int e = 0; e < c->o->engines; e++) {
        if (c->eng[e].state == E_STOPPED) {
            kill(cl->pid[1 + e], SIGCONT);
            c->eng[e].state = E_UP;
        }
        all_up &= c->eng[e].state == E_UP;
    }
    return all_up;
}

void demo_chaos_hello(demo_chaos *c, const demo_hello *h)
{
    if (h->engine < 0 || h->engine >= c->o->engines) return;
    int e = h->engine;
    if (c->begun) {
        c->f.restarts++;
        c->f.recovered_g2 += h->recovered_g2;
        c->f.recovered_g3 += h->recovered_g3;
        if (strncmp(c->eng[e].endpoint, h->endpoint, DEMO_ENDPOINT_MAX) != 0) {
            c->f.endpoint_changes++;
            fprintf(stderr, "kvcr demo: engine %d came back on %.*s (was %s)\n", e,
                    DEMO_ENDPOINT_MAX - 1, h->endpoint, c->eng[e].endpoint);
        }
    }
    snprintf(c->eng[e].endpoint, sizeof c->eng[e].endpoint, "%.*s", DEMO_ENDPOINT_MAX - 1,
             h->endpoint);
    c->eng[e].state = E_UP;
}

const demo_chaos_figures *demo_chaos_figures_of(const demo_chaos *c)
{
    return &c->f;
}

void demo_chaos_stop(demo_chaos *c)
{
    if (c == NULL) return;
    cleanup();
    free(c);
}
