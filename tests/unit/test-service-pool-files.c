/* Pool files: the name, mode, size and committed blocks of a new file
 * (whatever the umask), exclusive creation, page-multiple sizes, removal
 * that never unlinks a replacement, the checks pool_map makes before it
 * maps, MAP_SHARED seen from a forked child that maps the same descriptor,
 * MADV_DONTFORK (a child touching the parent's mapping dies of SIGSEGV),
 * the orphan purge (a file a live process holds is kept, symlinks, other
 * file types and other names are left alone), and ENOSPC on a 4 MiB tmpfs
 * (skipped when it cannot be mounted). Files live in a fresh directory
 * under /dev/shm (or /tmp) that is removed at the end. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvcr/error.h"
#include "client/pool.h"

static char g_root[256];
static char g_mount[512]; /* a tmpfs mounted by a test, unmounted by teardown */
static uint64_t g_page;

/* ---- helpers ----------------------------------------------------------------- */

/* A new empty directory under the test root. */
static void new_dir(char *dir, size_t size)
{
    snprintf(dir, size, "%s/tXXXXXX", g_root);
    assert_non_null(mkdtemp(dir));
}

static void join(char *out, size_t size, const char *dir, const char *name)
{
    int n = snprintf(out, size, "%s/%s", dir, name);
    assert_true(n > 0 && (size_t)n < size);
}

static void create_ok(const char *dir, uint32_t index, uint64_t gen, uint64_t bytes, pool_file *f)
{
    if (pool_file_create(dir, index, gen, bytes, f) != 0)
        fail_msg("pool_file_create: %s", kvcr_last_error());
    assert_true(f->fd >= 0);
}

static void expect_error(int rc, int code, const char *message)
{
    if (rc != code || strstr(kvcr_last_error(), message) == NULL)
        fail_msg("got %d '%s', expected %d '%s'", rc, kvcr_last_error(), code, message);
}

static size_t count_entries(const char *dir)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static bool exists(const char *path)
{
    struct stat s;
    return lstat(path, &s) == 0;
}

static void write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* A crashed service: the file stays, its descriptor (and lock) is gone. */
static void abandon(pool_file *f)
{
    close(f->fd);
    f->fd = -1;
}

static int wait_child(pid_t pid)
{
    int status = 0;
    pid_t r;
    do
        r = waitpid(pid, &status, 0);
    while (r < 0 && errno == EINTR);
    assert_int_equal(r, pid);
    return status;
}

typedef struct captured {
    char text[16384];
    size_t len;
} captured;

static void capture(void *ud, kvcr_log_level level, const char *message)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    captured *c = ud;
    int n = snprintf(c->text + c->len, sizeof c->text - c->len, "%s: %s\n",
                     (unsigned)level < 4 ? names[level] : "?", message);
    if (n > 0) c->len += (size_t)n < sizeof c->text - c->len ? (size_t)n : 0;
}

static void expect_logged(const captured *c, const char *level, const char *fmt, const char *path)
{
    char line[POOL_PATH_MAX + 256];
    int n = snprintf(line, sizeof line, "%s: ", level);
    snprintf(line + n, sizeof line - (size_t)n, fmt, path);
    if (strstr(c->text, line) == NULL) fail_msg("log lacks '%s'; it has:\n%s", line, c->text);
}

/* ---- creation ---------------------------------------------------------------- */

static void check_new_file(const pool_file *f, const char *dir, const char *name, uint64_t bytes)
{
    char want[POOL_PATH_MAX];
    join(want, sizeof want, dir, name);
    assert_string_equal(f->path, want);
    assert_int_equal(f->bytes, bytes);
    struct stat s;
    assert_int_equal(lstat(f->path, &s), 0);
    assert_true(S_ISREG(s.st_mode));
    assert_int_equal(s.st_mode & 07777, 0600);
    assert_int_equal(s.st_size, (off_t)bytes);
    if ((uint64_t)s.st_blocks * 512 < bytes)
        fail_msg("%s: %llu bytes committed of %llu", f->path,
                 (unsigned long long)s.st_blocks * 512, (unsigned long long)bytes);
    assert_true(s.st_dev == f->dev && s.st_ino == f->ino);
    assert_int_equal(fcntl(f->fd, F_GETFL) & O_ACCMODE, O_RDWR);
    assert_true(fcntl(f->fd, F_GETFD) & FD_CLOEXEC);
    /* The shared lock is held: another description gets shared, not exclusive. */
    int other = open(f->path, O_RDONLY | O_CLOEXEC);
    assert_true(other >= 0);
    assert_int_equal(flock(other, LOCK_EX | LOCK_NB), -1);
    assert_int_equal(errno, EWOULDBLOCK);
    assert_int_equal(flock(other, LOCK_SH | LOCK_NB), 0);
    close(other);
}

static void test_create_names_sizes_and_commits_the_file(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    pool_file a, b;

    /* A permissive umask changes nothing ... */
    mode_t old = umask(0);
    create_ok(dir, 7, 0xdeadbeefu, 256 * g_page, &a);
    /* ... nor does one that would take the owner's write bit. */
    umask(0277);
    create_ok(dir, UINT32_MAX, 0xfedcba9876543210ull, g_page, &b);
    umask(old);

    check_new_file(&a, dir, "kvcr-pool-7-00000000deadbeef", 256 * g_page);
    check_new_file(&b, dir, "kvcr-pool-4294967295-fedcba9876543210", g_page);
    pool_file_remove(&a);
    pool_file_remove(&b);
    assert_int_equal(count_entries(dir), 0);
}

static void test_a_second_create_of_the_same_name_fails_and_changes_nothing(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    pool_file a, b;
    create_ok(dir, 1, 42, 4 * g_page, &a);
    assert_int_equal(pwrite(a.fd, "first", 5, 0), 5);

    expect_error(pool_file_create(dir, 1, 42, 8 * g_page, &b), KVCR_ESYS, "File exists");
    assert_non_null(strstr(kvcr_last_error(), a.path));
    assert_int_equal(b.fd, -1);
    pool_file_remove(&b); /* a no-op on a failed create */

    struct stat s;
    assert_int_equal(lstat(a.path, &s), 0);
    assert_true(s.st_dev == a.dev && s.st_ino == a.ino);
    assert_int_equal(s.st_size, (off_t)(4 * g_page));
    char buf[5];
    assert_int_equal(pread(a.fd, buf, 5, 0), 5);
    assert_memory_equal(buf, "first", 5);
    pool_file_remove(&a);
}

static void test_sizes_that_are_not_page_multiples_are_refused(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    const uint64_t bad[] = {0, 1, 512, g_page - 1, g_page + 1, 3 * g_page + 512, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pool_file f;
        expect_error(pool_file_create(dir, 0, i, bad[i], &f), KVCR_EINVAL,
                     "must be a positive multiple of the page size");
        assert_int_equal(f.fd, -1);
    }
    assert_int_equal(count_entries(dir), 0);

    /* And the other arguments. */
    pool_file f;
    expect_error(pool_file_create(NULL, 0, 0, g_page, &f), KVCR_EINVAL, "directory");
    expect_error(pool_file_create("", 0, 0, g_page, &f), KVCR_EINVAL, "directory");
    char *longdir = malloc(POOL_PATH_MAX + 16);
    assert_non_null(longdir);
    memset(longdir, 'd', POOL_PATH_MAX + 15);
    longdir[POOL_PATH_MAX + 15] = '\0';
    expect_error(pool_file_create(longdir, 0, 0, g_page, &f), KVCR_EINVAL, "too long");
    free(longdir);
    assert_int_equal(pool_file_create(dir, 0, 0, g_page, NULL), KVCR_EINVAL);
    /* A directory that does not exist is a system error, with no file anywhere. */
    char missing[600];
    join(missing, sizeof missing, dir, "missing");
    expect_error(pool_file_create(missing, 0, 0, g_page, &f), KVCR_ESYS,
                 "No such file or directory");
    assert_int_equal(f.fd, -1);
}

static void test_remove_unlinks_only_the_file_it_created(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);

    pool_file f;
    create_ok(dir, 3, 3, g_page, &f);
    pool_file_remove(&f);
    assert_int_equal(f.fd, -1);
    assert_false(exists(f.path));
    pool_file_remove(&f); /* idempotent */
    pool_file_remove(NULL);

    /* Another file renamed into the path is not ours to remove. */
    create_ok(dir, 3, 4, g_page, &f);
    char other[600];
    join(other, sizeof other, dir, "replacement");
    write_file(other, "not a pool");
    struct stat r;
    assert_int_equal(lstat(other, &r), 0);
    assert_int_equal(rename(other, f.path), 0);
    pool_file_remove(&f);
    assert_int_equal(f.fd, -1);
    struct stat s;
    assert_int_equal(lstat(f.path, &s), 0);
    assert_true(s.st_dev == r.st_dev && s.st_ino == r.st_ino);

    /* Nor is a symlink to the file that was created. */
    assert_int_equal(unlink(f.path), 0);
    create_ok(dir, 3, 5, g_page, &f);
    char moved[600];
    join(moved, sizeof moved, dir, "moved");
    assert_int_equal(rename(f.path, moved), 0);
    assert_int_equal(symlink(moved, f.path), 0);
    pool_file_remove(&f);
    assert_int_equal(lstat(f.path, &s), 0);
    assert_true(S_ISLNK(s.st_mode));
    assert_true(exists(moved));
}

/* ---- mapping ----------------------------------------------------------------- */

static void expect_map_error(int fd, uint64_t bytes, int code, const char *message)
{
    void *base = (void *)1;
    expect_error(pool_map(fd, bytes, &base), code, message);
    assert_null(base);
}

static void test_pool_map_refuses_wrong_files(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    pool_file f;
    create_ok(dir, 0, 1, 2 * g_page, &f);

    /* Too short: mapping past the end would SIGBUS. */
    expect_map_error(f.fd, 3 * g_page, KVCR_EINVAL, "shorter than");
    expect_map_error(f.fd, 0, KVCR_EINVAL, "cannot map 0 bytes");
    expect_map_error(-1, g_page, KVCR_EINVAL, "invalid descriptor");
    assert_int_equal(pool_map(f.fd, g_page, NULL), KVCR_EINVAL);

    /* Readable or writable by others. */
    assert_int_equal(fchmod(f.fd, 0644), 0);
    expect_map_error(f.fd, g_page, KVCR_EINVAL, "pool file mode must be 0600");
    assert_int_equal(fchmod(f.fd, 0660), 0);
    expect_map_error(f.fd, g_page, KVCR_EINVAL, "pool file mode must be 0600");
    assert_int_equal(fchmod(f.fd, 0600), 0);

    /* Not a regular file. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(dfd >= 0);
    expect_map_error(dfd, g_page, KVCR_EINVAL, "regular file");
    close(dfd);

    /* A read-only descriptor passes the checks and fails at mmap. */
    int ro = open(f.path, O_RDONLY | O_CLOEXEC);
    assert_true(ro >= 0);
    expect_map_error(ro, g_page, KVCR_ESYS, "Permission denied");
    close(ro);

    /* Someone holds it exclusively (a purge about to remove it): EBUSY. The
     * creator's description is closed first, or the purge could not lock. */
    abandon(&f);
    int rw = open(f.path, O_RDWR | O_CLOEXEC);
    int purger = open(f.path, O_RDONLY | O_CLOEXEC);
    assert_true(rw >= 0 && purger >= 0);
    assert_int_equal(flock(purger, LOCK_EX | LOCK_NB), 0);
    expect_map_error(rw, g_page, KVCR_EBUSY, "locked exclusively");
    close(purger);
    void *base = NULL;
    assert_int_equal(pool_map(rw, 2 * g_page, &base), 0);
    assert_non_null(base);
    pool_unmap(base, 2 * g_page);
    close(rw);
    assert_int_equal(unlink(f.path), 0);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed + i * 7 + (i >> 12));
}

static bool filled(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(seed + i * 7 + (i >> 12))) return false;
    return true;
}

static void test_the_mapping_is_shared_with_a_forked_child(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    const uint64_t bytes = 16 * g_page;
    pool_file f;
    create_ok(dir, 2, 9, bytes, &f);
    uint8_t *base = NULL;
    assert_int_equal(pool_map(f.fd, bytes, (void **)&base), 0);
    fill(base, (size_t)bytes / 2, 11);

    /* The child is a claimant: it maps the same descriptor itself, checks
     * the parent's bytes and answers in the second half. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t *mine = NULL;
        if (pool_map(f.fd, bytes, (void **)&mine) != 0) _exit(2);
        if (!filled(mine, (size_t)bytes / 2, 11)) _exit(3);
        fill(mine + bytes / 2, (size_t)bytes / 2, 99);
        pool_unmap(mine, bytes);
        _exit(0);
    }
    int status = wait_child(pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child: status %#x (2: map failed, 3: wrong bytes)", status);
    assert_true(filled(base + bytes / 2, (size_t)bytes / 2, 99));
    pool_unmap(base, bytes);
    pool_file_remove(&f);
}

static void test_a_forked_child_does_not_inherit_the_mapping(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    pool_file f;
    create_ok(dir, 2, 10, 4 * g_page, &f);
    volatile uint8_t *base = NULL;
    assert_int_equal(pool_map(f.fd, 4 * g_page, (void **)&base), 0);
    base[0] = 1;

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Die of the signal itself (not a sanitizer's report), without a core. */
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGSEGV, SIG_DFL);
        uint8_t v = base[0];
        _exit(v == 1 ? 0 : 4);
    }
    int status = wait_child(pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
        fail_msg("the child read the pool: status %#x (exit 0: the mapping was inherited)",
                 status);
    assert_int_equal(base[0], 1);
    pool_unmap((void *)base, 4 * g_page);
    pool_file_remove(&f);
}

/* ---- orphan purge ------------------------------------------------------------ */

/* A worker that still uses a pool: it opens path, takes the shared lock,
 * says so on ready and waits for go to close. */
static pid_t start_holder(const char *path, int *go_write)
{
    int ready[2], go[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || flock(fd, LOCK_SH | LOCK_NB) != 0) _exit(2);
        if (write(ready[1], "r", 1) != 1) _exit(3);
        char c;
        while (read(go[0], &c, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char c;
    ssize_t n;
    do
        n = read(ready[0], &c, 1);
    while (n < 0 && errno == EINTR);
    close(ready[0]);
    if (n != 1) fail_msg("the holder did not lock %s (status %#x)", path, wait_child(pid));
    *go_write = go[1];
    return pid;
}

static void test_purge_removes_only_orphans_nobody_holds(void **state)
{
    (void)state;
    char dir[512];
    new_dir(dir, sizeof dir);
    pool_file held, orphan, live;
    create_ok(dir, 1, 1, 2 * g_page, &held);
    create_ok(dir, 2, 2, 3 * g_page, &orphan);
    create_ok(dir, 6, 6, g_page, &live); /* this process is its service */
    abandon(&held);
    abandon(&orphan);
    int go;
    pid_t holder = start_holder(held.path, &go);

    /* A symlink named like a pool file, to an unheld file it must not reach. */
    char target[600], link[600], sub[600], fifo[600], p[600];
    join(target, sizeof target, dir, "target");
    write_file(target, "x");
    join(link, sizeof link, dir, "kvcr-pool-3-0000000000000003");
    assert_int_equal(symlink(target, link), 0);
    /* A directory and a FIFO named like pool files. */
    join(sub, sizeof sub, dir, "kvcr-pool-5-0000000000000005");
    assert_int_equal(mkdir(sub, 0700), 0);
    join(fifo, sizeof fifo, dir, "kvcr-pool-8-0000000000000008");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    /* Names that are almost right. */
    static const char *const others[] = {
        "kvcr-pool-4-000000000000000",      "kvcr-pool-4-00000000000000000",
        "kvcr-pool-4-ABCDEF0123456789",     "kvcr-pool-4-000000000000000g",
        "kvcr-pool--0000000000000004",      "kvcr-pool-04-0000000000000004",
        "kvcr-pool-+4-0000000000000004",    "kvcr-pool-4294967296-0000000000000004",
        "xkvcr-pool-4-0000000000000004",    "kvcr-pool-4-0000000000000004.tmp",
        "kvcr-pool-4_0000000000000004",     "kvcr-pool-",
    };
    const size_t n_others = sizeof others / sizeof others[0];
    for (size_t i = 0; i < n_others; i++) {
        join(p, sizeof p, dir, others[i]);
        write_file(p, "other");
    }
    const size_t entries = count_entries(dir);

    captured c = {{0}, 0};
    kvcr_logger lg;
    kvcr_logger_init(&lg, "test", capture, &c);
    assert_int_equal(pool_purge_orphans(dir, &lg), 1);
    assert_false(exists(orphan.path));
    assert_int_equal(count_entries(dir), entries - 1);
    assert_true(exists(held.path) && exists(live.path) && exists(link) && exists(target) &&
                exists(sub) && exists(fifo));
    for (size_t i = 0; i < n_others; i++) {
        join(p, sizeof p, dir, others[i]);
        assert_true(exists(p));
    }
    expect_logged(&c, "info", "pool file %s is still in use: kept", held.path);
    expect_logged(&c, "info", "pool file %s is still in use: kept", live.path);
    char removed[64];
    snprintf(removed, sizeof removed, "removed orphaned pool file %%s (%llu bytes)",
             (unsigned long long)(3 * g_page));
    expect_logged(&c, "warn", removed, orphan.path);
    expect_logged(&c, "warn", "pool file %s is a symbolic link: left alone", link);
    expect_logged(&c, "warn", "pool file %s is not a regular file: left alone", sub);
    expect_logged(&c, "warn", "pool file %s is not a regular file: left alone", fifo);

    /* The worker exits: its pool is an orphan now. */
    close(go);
    int status = wait_child(holder);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    c.len = 0;
    c.text[0] = '\0';
    assert_int_equal(pool_purge_orphans(dir, &lg), 1);
    assert_false(exists(held.path));
    assert_true(exists(live.path));
    snprintf(removed, sizeof removed, "removed orphaned pool file %%s (%llu bytes)",
             (unsigned long long)(2 * g_page));
    expect_logged(&c, "warn", removed, held.path);

    /* Nothing left to remove; the default logger stands in for NULL. */
    assert_int_equal(pool_purge_orphans(dir, NULL), 0);
    pool_file_remove(&live);
    assert_int_equal(unlink(link) | rmdir(sub) | unlink(fifo), 0);
    assert_int_equal(pool_purge_orphans(dir, &lg), 0);

    char missing[600];
    join(missing, sizeof missing, dir, "missing");
    expect_error(pool_purge_orphans(missing, &lg), KVCR_ESYS, "cannot open");
    expect_error(pool_purge_orphans(NULL, &lg), KVCR_EINVAL, "directory");
}

/* ---- no space ---------------------------------------------------------------- */

static void test_no_space_is_a_clear_error_and_leaves_no_file(void **state)
{
    (void)state;
    new_dir(g_mount, sizeof g_mount);
    if (mount("tmpfs", g_mount, "tmpfs", 0, "size=4m,mode=0700") != 0) {
        fprintf(stderr, "skipped: cannot mount a 4 MiB tmpfs on %s: %s (needs root)\n", g_mount,
                strerror(errno));
        rmdir(g_mount);
        g_mount[0] = '\0';
        skip();
    }
    pool_file f, g;
    expect_error(pool_file_create(g_mount, 0, 1, 8u << 20, &f), KVCR_ESYS, "No space");
    char want[700];
    snprintf(want, sizeof want, "pool file %s/kvcr-pool-0-0000000000000001: cannot reserve %u bytes",
             g_mount, 8u << 20);
    if (strstr(kvcr_last_error(), want) == NULL)
        fail_msg("'%s' does not say '%s'", kvcr_last_error(), want);
    assert_int_equal(f.fd, -1);
    assert_int_equal(count_entries(g_mount), 0);

    /* A failure part way gives back what it had reserved: with 1 MiB used,
     * 4 MiB fails and then 2 MiB still fits. */
    create_ok(g_mount, 0, 2, 1u << 20, &g);
    expect_error(pool_file_create(g_mount, 0, 3, 4u << 20, &f), KVCR_ESYS, "No space");
    assert_int_equal(count_entries(g_mount), 1);
    create_ok(g_mount, 0, 4, 2u << 20, &f);
    pool_file_remove(&f);
    pool_file_remove(&g);
    assert_int_equal(count_entries(g_mount), 0);

    assert_int_equal(umount(g_mount), 0);
    assert_int_equal(rmdir(g_mount), 0);
    g_mount[0] = '\0';
}

/* ---- setup ------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    g_page = (uint64_t)sysconf(_SC_PAGESIZE);
    const char *bases[] = {"/dev/shm", "/tmp"};
    for (size_t i = 0; i < 2; i++) {
        if (access(bases[i], W_OK) != 0) continue;
        snprintf(g_root, sizeof g_root, "%s/kvcr-pooltest-XXXXXX", bases[i]);
        if (mkdtemp(g_root) != NULL) return 0;
    }
    fprintf(stderr, "no writable /dev/shm or /tmp\n");
    return -1;
}

static int remove_entry(const char *path, const struct stat *s, int type, struct FTW *ftw)
{
    (void)s;
    (void)type;
    (void)ftw;
    return remove(path);
}

static int teardown(void **state)
{
    (void)state;
    if (g_mount[0] != '\0') umount2(g_mount, MNT_DETACH); /* a test failed with it mounted */
    return nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_names_sizes_and_commits_the_file),
        cmocka_unit_test(test_a_second_create_of_the_same_name_fails_and_changes_nothing),
        cmocka_unit_test(test_sizes_that_are_not_page_multiples_are_refused),
        cmocka_unit_test(test_remove_unlinks_only_the_file_it_created),
        cmocka_unit_test(test_pool_map_refuses_wrong_files),
        cmocka_unit_test(test_the_mapping_is_shared_with_a_forked_child),
        cmocka_unit_test(test_a_forked_child_does_not_inherit_the_mapping),
        cmocka_unit_test(test_purge_removes_only_orphans_nobody_holds),
        cmocka_unit_test(test_no_space_is_a_clear_error_and_leaves_no_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
