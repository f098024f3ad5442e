/* The G3 slot store on real files: every open rule and its message, locks
 * between stores, striping checked by reading the files, round trips at
 * queue depths 1 and 16 (aligned and bounced buffers), restart and scan,
 * flipped bits in data and records, writes started together each sealed
 * with their own checksum, written data freeing the queue depth while the
 * callback still waits for the record, torn writes, wrong sizes, foreign
 * superblocks, injected ENOSPC/EIO, a random workload with faults that
 * must never hand over wrong bytes, 1..4 failed completions at every
 * offset of a queue of same-slot and neighbouring requests (none lost,
 * none stalled), tmpfs refused, and the time to scan
 * 100k slots. Files live in a fresh directory under /tmp (or /var/tmp)
 * that is removed at the end. Every wait polls g3_store_fd with a
 * deadline: a pending request the fd does not announce fails the test. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvcr/error.h"
#include "tiers/g3_store.h"
#include "tiers/g3_store_int.h" /* the depth accounting, checked while it runs */

#define WAIT_MS 60000
#define MAX_FILES 4

static char g_root[256];

/* ---- helpers ----------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct done {
    int calls, result;
} done;

static void on_done(void *ud, int result)
{
    done *d = ud;
    d->calls++;
    d->result = result;
}

/* Progress until nothing is pending, sleeping in poll() on the store's fd.
 * Returns the number of wake-ups it took. */
static unsigned wait_idle(g3_store *st, int ms)
{
    uint64_t deadline = now_ns() + (uint64_t)ms * 1000000u;
    for (unsigned rounds = 0;; rounds++) {
        g3_store_progress(st);
        if (g3_store_pending(st) == 0) return rounds;
        uint64_t t = now_ns();
        if (t >= deadline)
            fail_msg("%zu G3 requests pending after %d ms", g3_store_pending(st), ms);
        struct pollfd p = {g3_store_fd(st), POLLIN, 0};
        int rc = poll(&p, 1, (int)((deadline - t) / 1000000u) + 1);
        if (rc == 0) fail_msg("g3_store_fd did not wake: %zu pending", g3_store_pending(st));
        assert_true(rc == 1 || (rc < 0 && errno == EINTR));
    }
}

typedef struct files {
    char dir[512];
    char buf[MAX_FILES][PATH_MAX];
    const char *p[MAX_FILES];
    size_t n;
} files;

/* n paths "g3-<i>" in a new directory under the test root. */
static void files_init(files *f, size_t n)
{
    snprintf(f->dir, sizeof f->dir, "%s/tXXXXXX", g_root);
    assert_non_null(mkdtemp(f->dir));
    f->n = n;
    for (size_t i = 0; i < n; i++) {
        snprintf(f->buf[i], PATH_MAX, "%s/g3-%zu", f->dir, i);
        f->p[i] = f->buf[i];
    }
}

static g3_store_options options(const files *f, uint64_t slot_size, uint64_t slots_per_file,
                                unsigned qd)
{
    g3_store_options o = {f->p, f->n, slot_size * slots_per_file, slot_size, qd, NULL};
    return o;
}

static g3_store *open_ok(const g3_store_options *o)
{
    g3_store *st = NULL;
    if (g3_store_open(o, &st) != 0) fail_msg("g3_store_open: %s", kvcr_last_error());
    assert_non_null(st);
    return st;
}

static void expect_open_error(const g3_store_options *o, int code, const char *message)
{
    g3_store *st = (g3_store *)1;
    int rc = g3_store_open(o, &st);
    if (rc != code || strstr(kvcr_last_error(), message) == NULL)
        fail_msg("g3_store_open: %d '%s', expected %d '%s'", rc, kvcr_last_error(), code, message);
    assert_null(st);
}

static g3_store *reopen_scanned(const g3_store_options *o, g3_scan_stats *stats,
                                void (*cb)(void *, const g3_slot_info *), void *ud)
{
    g3_store *st = open_ok(o);
    assert_int_equal(g3_store_scan(st, cb, ud, stats), 0);
    return st;
}

static uint8_t *aligned_buf(size_t n)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, G3_ALIGN, n ? n : G3_ALIGN), 0);
    memset(p, 0, n);
    return p;
}

static size_t key_for(char *key, uint64_t slot, unsigned version)
{
    return (size_t)snprintf(key, 64, "block-%llu-v%u", (unsigned long long)slot, version);
}

static uint32_t seed_for(uint64_t slot, unsigned version)
{
    return (uint32_t)(slot * 2654435761u + version * 40503u + 7);
}

/* Synchronous forms, for the simple cases. */
static int write_sync(g3_store *st, uint64_t slot, unsigned version, const uint8_t *data,
                      size_t len, uint64_t *gen)
{
    char key[64];
    size_t kl = key_for(key, slot, version);
    done d = {0, 1};
    assert_int_equal(g3_store_write(st, slot, key, kl, data, len, on_done, &d, gen), 0);
    wait_idle(st, WAIT_MS);
    assert_int_equal(d.calls, 1);
    return d.result;
}

static int read_sync(g3_store *st, uint64_t slot, unsigned version, uint8_t *buf, size_t len)
{
    char key[64];
    size_t kl = key_for(key, slot, version);
    done d = {0, 1};
    assert_int_equal(g3_store_read(st, slot, key, kl, buf, len, on_done, &d), 0);
    wait_idle(st, WAIT_MS);
    assert_int_equal(d.calls, 1);
    return d.result;
}

static int clear_sync(g3_store *st, uint64_t slot)
{
    done d = {0, 1};
    assert_int_equal(g3_store_clear(st, slot, on_done, &d), 0);
    wait_idle(st, WAIT_MS);
    assert_int_equal(d.calls, 1);
    return d.result;
}

/* Writes slot with the pattern of (slot, version); expects success. */
static void put_slot(g3_store *st, uint64_t slot, unsigned version, size_t len)
{
    uint8_t *b = aligned_buf(len);
    fill_pattern(b, len, seed_for(slot, version));
    assert_int_equal(write_sync(st, slot, version, b, len, NULL), 0);
    free(b);
}

/* Reads slot and compares with the pattern of (slot, version); returns the
 * read's result (the bytes are compared only on success). */
static int get_slot(g3_store *st, uint64_t slot, unsigned version, size_t len)
{
    uint8_t *b = aligned_buf(len), *want = aligned_buf(len);
    fill_pattern(want, len, seed_for(slot, version));
    int rc = read_sync(st, slot, version, b, len);
    if (rc == 0) assert_memory_equal(b, want, len);
    free(b);
    free(want);
    return rc;
}

static void file_io(const char *path, bool write, uint64_t off, void *buf, size_t n)
{
    int fd = open(path, write ? O_RDWR : O_RDONLY);
    assert_true(fd >= 0);
    ssize_t k = write ? pwrite(fd, buf, n, (off_t)off) : pread(fd, buf, n, (off_t)off);
    assert_int_equal(k, (ssize_t)n);
    if (write) assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void flip_bit(const char *path, uint64_t off, unsigned bit)
{
    uint8_t b;
    file_io(path, false, off, &b, 1);
    b ^= (uint8_t)(1u << bit);
    file_io(path, true, off, &b, 1);
}

static off_t file_size(const char *path)
{
    struct stat s;
    assert_int_equal(stat(path, &s), 0);
    return s.st_size;
}

/* Scan results gathered into an array indexed by slot. */
typedef struct seen {
    uint64_t n_slots, reported;
    char (*keys)[G3_KEY_MAX + 1];
    uint64_t *gens, *lens;
} seen;

static void seen_init(seen *s, uint64_t n_slots)
{
    s->n_slots = n_slots;
    s->reported = 0;
    s->keys = calloc(n_slots, sizeof *s->keys);
    s->gens = calloc(n_slots, sizeof *s->gens);
    s->lens = calloc(n_slots, sizeof *s->lens);
    assert_true(s->keys && s->gens && s->lens);
}

static void seen_free(seen *s)
{
    free(s->keys);
    free(s->gens);
    free(s->lens);
}

static void on_slot(void *ud, const g3_slot_info *info)
{
    seen *s = ud;
    assert_true(info->slot < s->n_slots);
    assert_int_equal(s->gens[info->slot], 0); /* once each */
    assert_true(info->key_len >= 1 && info->key_len <= G3_KEY_MAX);
    memcpy(s->keys[info->slot], info->key, info->key_len);
    s->gens[info->slot] = info->generation;
    s->lens[info->slot] = info->data_len;
    s->reported++;
}

/* ---- open rules ------------------------------------------------------------------ */

static void test_open_rules_and_their_messages(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, 8192, 4, 0);

    g3_store_options bad = o;
    bad.n_paths = 0;
    expect_open_error(&bad, KVCR_EINVAL, "G3 requires at least one file path");
    bad.paths = NULL;
    bad.n_paths = 1;
    expect_open_error(&bad, KVCR_EINVAL, "G3 requires at least one file path");

    const uint64_t bad_slots[] = {0, 1000, 4096 + 512, 6144};
    for (size_t i = 0; i < sizeof bad_slots / sizeof bad_slots[0]; i++) {
        bad = o;
        bad.slot_size = bad_slots[i];
        expect_open_error(&bad, KVCR_EINVAL, "G3 slot size must be positive and page aligned");
    }
    const uint64_t bad_caps[] = {0, 4096, 8192 * 3 + 4096};
    for (size_t i = 0; i < sizeof bad_caps / sizeof bad_caps[0]; i++) {
        bad = o;
        bad.capacity_bytes_per_file = bad_caps[i];
        expect_open_error(&bad, KVCR_EINVAL, "G3 file capacity must contain complete slots");
    }
    bad = o;
    bad.queue_depth = G3_MAX_QUEUE_DEPTH + 1;
    expect_open_error(&bad, KVCR_EINVAL, "G3 queue depth must be at most");
    char trailing[PATH_MAX];
    snprintf(trailing, sizeof trailing, "%s/", f.dir);
    const char *odd[] = {f.p[0], ""};
    bad = o;
    bad.paths = odd;
    expect_open_error(&bad, KVCR_EINVAL, "G3 file path 1 is empty");
    odd[1] = trailing;
    expect_open_error(&bad, KVCR_EINVAL, "does not name a file");

    /* Two spellings of one path: equal once the parent is resolved. */
    char alt[PATH_MAX];
    snprintf(alt, sizeof alt, "%s/sub/../g3-0", f.dir);
    const char *dup[] = {f.p[0], alt};
    bad = o;
    bad.paths = dup;
    expect_open_error(&bad, KVCR_EINVAL, "G3 file paths must be unique");
    /* Rules that need no file come first: nothing was created. */
    assert_int_equal(access(f.p[0], F_OK), -1);

    /* A hard link and a symbolic link alias the same file. */
    char hard[PATH_MAX], sym[PATH_MAX];
    snprintf(hard, sizeof hard, "%s/hard", f.dir);
    snprintf(sym, sizeof sym, "%s/sym", f.dir);
    int fd = open(f.p[0], O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(link(f.p[0], hard), 0);
    assert_int_equal(symlink(f.p[0], sym), 0);
    const char *hl[] = {f.p[0], hard}, *sl[] = {sym, f.p[0]};
    bad = o;
    bad.paths = hl;
    expect_open_error(&bad, KVCR_EINVAL, "G3 file paths must not alias the same file");
    bad.paths = sl;
    expect_open_error(&bad, KVCR_EINVAL, "G3 file paths must not alias the same file");
    /* The failed opens released their locks and preallocated nothing. */
    assert_int_equal(file_size(f.p[0]), 0);

    /* Missing parents are created; the file is private and sized:
     * superblock + one index block (4 records) + 4 slots. */
    char deep[PATH_MAX];
    snprintf(deep, sizeof deep, "%s/a/b/c/g3", f.dir);
    const char *dp[] = {deep};
    g3_store_options od = o;
    od.paths = dp;
    od.n_paths = 1;
    g3_store *st = open_ok(&od);
    struct stat s;
    assert_int_equal(stat(deep, &s), 0);
    assert_int_equal(s.st_mode & 0777, 0600);
    assert_int_equal(s.st_size, G3_SUPERBLOCK_SIZE + G3_ALIGN + 4 * 8192);
    assert_int_equal(g3_store_slots(st), 4);
    assert_int_equal(g3_store_slot_size(st), 8192);
    /* A relative path is resolved against the working directory, so the
     * same file spelled absolutely is the same path (and locked). */
    char cwd[PATH_MAX];
    assert_non_null(getcwd(cwd, sizeof cwd));
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/a/b", f.dir);
    assert_int_equal(chdir(sub), 0);
    const char *rel[] = {"c/g3", deep};
    g3_store_options orl = o;
    orl.paths = rel;
    expect_open_error(&orl, KVCR_EINVAL, "G3 file paths must be unique");
    orl.n_paths = 1;
    expect_open_error(&orl, KVCR_EBUSY, "is in use by another process");
    assert_int_equal(chdir(cwd), 0);

    /* Request arguments. */
    uint8_t *buf = aligned_buf(8192);
    char long_key[G3_KEY_MAX + 1];
    memset(long_key, 'k', sizeof long_key);
    done d = {0, 0};
    assert_int_equal(g3_store_write(st, 0, long_key, G3_KEY_MAX + 1, buf, 8192, on_done, &d, NULL),
                     KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "not spillable"));
    assert_int_equal(g3_store_read(st, 0, long_key, G3_KEY_MAX + 1, buf, 8192, on_done, &d),
                     KVCR_EINVAL);
    assert_int_equal(g3_store_write(st, 0, "k", 0, buf, 8192, on_done, &d, NULL), KVCR_EINVAL);
    assert_int_equal(g3_store_write(st, 4, "k", 1, buf, 8192, on_done, &d, NULL), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "out of range"));
    assert_int_equal(g3_store_write(st, 0, "k", 1, buf, 8193, on_done, &d, NULL), KVCR_EINVAL);
    assert_int_equal(g3_store_write(st, 0, "k", 1, buf, 0, on_done, &d, NULL), KVCR_EINVAL);
    assert_int_equal(g3_store_write(st, 0, "k", 1, buf, 8192, NULL, NULL, NULL), KVCR_EINVAL);
    assert_int_equal(g3_store_clear(st, 4, on_done, &d), KVCR_EINVAL);
    g3_location loc;
    assert_int_equal(g3_store_locate(st, 4, &loc), KVCR_EINVAL);
    /* The longest key is fine. */
    assert_int_equal(g3_store_write(st, 3, long_key, G3_KEY_MAX, buf, 8192, on_done, &d, NULL), 0);
    wait_idle(st, WAIT_MS);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.result, 0);
    d.calls = 0;
    assert_int_equal(g3_store_read(st, 3, long_key, G3_KEY_MAX, buf, 8192, on_done, &d), 0);
    wait_idle(st, WAIT_MS);
    assert_int_equal(d.result, 0);
    free(buf);
    g3_store_close(st);
}

static void test_a_second_store_is_refused_until_the_first_closes(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, 4096, 8, 4);
    g3_store *a = open_ok(&o);
    expect_open_error(&o, KVCR_EBUSY, "is in use by another process");
    /* Either file alone too (the second one). */
    g3_store_options one = o;
    one.paths = &f.p[1];
    one.n_paths = 1;
    expect_open_error(&one, KVCR_EBUSY, "is in use by another process");
    g3_store_close(a);
    g3_store *b = open_ok(&o);
    g3_store_close(b);
}

/* ---- placement -------------------------------------------------------------------- */

static void test_slot_s_lives_in_file_s_mod_f(void **state)
{
    (void)state;
    enum { F = 3, PER_FILE = 20, SLOT = 8192 };
    files f;
    files_init(&f, F);
    g3_store_options o = options(&f, SLOT, PER_FILE, 16);
    g3_store *st = open_ok(&o);
    assert_int_equal(g3_store_slots(st), F * PER_FILE);
    /* The documented layout: superblock, index rounded to 4 KiB, data. */
    uint64_t data_off = G3_SUPERBLOCK_SIZE + ((PER_FILE * G3_RECORD_SIZE + 4095) / 4096) * 4096;
    for (size_t i = 0; i < F; i++)
        assert_int_equal(file_size(f.p[i]), (off_t)(data_off + PER_FILE * SLOT));

    uint8_t *want = aligned_buf(SLOT), *got = aligned_buf(SLOT);
    for (uint64_t s = 0; s < F * PER_FILE; s++) put_slot(st, s, 1, SLOT);
    for (uint64_t s = 0; s < F * PER_FILE; s++) {
        g3_location loc;
        assert_int_equal(g3_store_locate(st, s, &loc), 0);
        assert_int_equal(loc.file, s % F);
        assert_string_equal(loc.path, f.p[s % F]);
        assert_int_equal(loc.data_offset, data_off + (s / F) * SLOT);
        assert_int_equal(loc.record_offset, G3_SUPERBLOCK_SIZE + (s / F) * G3_RECORD_SIZE);
        fill_pattern(want, SLOT, seed_for(s, 1));
        file_io(f.p[s % F], false, data_off + (s / F) * SLOT, got, SLOT);
        assert_memory_equal(got, want, SLOT);
        /* The record names the slot and carries the key. */
        uint8_t rec[G3_RECORD_SIZE];
        char key[64];
        size_t kl = key_for(key, s, 1);
        file_io(f.p[s % F], false, loc.record_offset, rec, sizeof rec);
        uint64_t slot_in_rec;
        memcpy(&slot_in_rec, rec + 8, 8);
        assert_int_equal(slot_in_rec, s);
        assert_int_equal(rec[5], kl);
        assert_memory_equal(rec + 40, key, kl);
    }
    free(want);
    free(got);
    g3_store_close(st);
}

/* ---- round trips --------------------------------------------------------------------- */

/* n slots written all at once (the FIFO holds what the queue does not),
 * then read back all at once into separate buffers. Every third slot uses
 * a buffer and a length that are not 4 KiB aligned (bounced). */
static void roundtrip(unsigned qd)
{
    enum { F = 2, PER_FILE = 96, SLOT = 16384, N = F * PER_FILE };
    files f;
    files_init(&f, F);
    g3_store_options o = options(&f, SLOT, PER_FILE, qd);
    g3_store *st = open_ok(&o);
    static uint8_t *src[N], *dst[N];
    static size_t len[N];
    static done wd[N], rd[N];
    static char keys[N][64];
    static size_t kl[N];
    uint64_t gens[N];
    for (size_t s = 0; s < N; s++) {
        bool odd = s % 3 == 2;
        len[s] = odd ? SLOT - 100 - s : SLOT;
        uint8_t *a = aligned_buf(SLOT + 1), *b = aligned_buf(SLOT + 1);
        src[s] = odd ? a + 1 : a;
        dst[s] = odd ? b + 1 : b;
        fill_pattern(src[s], len[s], seed_for(s, qd));
        kl[s] = key_for(keys[s], s, qd);
        wd[s] = rd[s] = (done){0, 1};
        assert_int_equal(
            g3_store_write(st, s, keys[s], kl[s], src[s], len[s], on_done, &wd[s], &gens[s]), 0);
        if (s) assert_true(gens[s] > gens[s - 1]);
    }
    uint64_t t0 = now_ns();
    wait_idle(st, WAIT_MS);
    uint64_t t1 = now_ns();
    for (size_t s = 0; s < N; s++) {
        assert_int_equal(wd[s].calls, 1);
        assert_int_equal(wd[s].result, 0);
        assert_int_equal(g3_store_read(st, s, keys[s], kl[s], dst[s], len[s], on_done, &rd[s]), 0);
    }
    wait_idle(st, WAIT_MS);
    uint64_t t2 = now_ns();
    for (size_t s = 0; s < N; s++) {
        assert_int_equal(rd[s].calls, 1);
        assert_int_equal(rd[s].result, 0);
        assert_memory_equal(dst[s], src[s], len[s]);
    }
    print_message("G3 round trip qd %u: %d slots of %d KiB, writes %.1f ms, reads %.1f ms\n", qd, N,
                  SLOT / 1024, (t1 - t0) / 1e6, (t2 - t1) / 1e6);
    for (size_t s = 0; s < N; s++) {
        free(s % 3 == 2 ? src[s] - 1 : src[s]);
        free(s % 3 == 2 ? dst[s] - 1 : dst[s]);
    }
    g3_store_close(st);
}

static void test_roundtrip_at_queue_depth_1(void **state)
{
    (void)state;
    roundtrip(1);
}

static void test_roundtrip_at_queue_depth_16(void **state)
{
    (void)state;
    roundtrip(16);
}

/* Requests on one slot run in submission order. */
static void test_requests_on_one_slot_run_in_order(void **state)
{
    (void)state;
    enum { SLOT = 4096 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, 4, 16);
    g3_store *st = open_ok(&o);
    uint8_t *a = aligned_buf(SLOT), *b = aligned_buf(SLOT), *r1 = aligned_buf(SLOT),
            *r2 = aligned_buf(SLOT), *r3 = aligned_buf(SLOT);
    fill_pattern(a, SLOT, 1);
    fill_pattern(b, SLOT, 2);
    done d[6] = {{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}};
    assert_int_equal(g3_store_write(st, 1, "ka", 2, a, SLOT, on_done, &d[0], NULL), 0);
    assert_int_equal(g3_store_read(st, 1, "ka", 2, r1, SLOT, on_done, &d[1]), 0);
    assert_int_equal(g3_store_write(st, 1, "kb", 2, b, SLOT, on_done, &d[2], NULL), 0);
    assert_int_equal(g3_store_read(st, 1, "kb", 2, r2, SLOT, on_done, &d[3]), 0);
    assert_int_equal(g3_store_clear(st, 1, on_done, &d[4]), 0);
    assert_int_equal(g3_store_read(st, 1, "kb", 2, r3, SLOT, on_done, &d[5]), 0);
    wait_idle(st, WAIT_MS);
    for (int i = 0; i < 5; i++) assert_int_equal(d[i].result, 0);
    assert_memory_equal(r1, a, SLOT);
    assert_memory_equal(r2, b, SLOT);
    assert_int_equal(d[5].result, G3_CORRUPT); /* cleared: empty */
    free(a);
    free(b);
    free(r1);
    free(r2);
    free(r3);
    g3_store_close(st);
}

/* ---- restart ------------------------------------------------------------------------- */

static void test_restart_scan_reports_every_written_slot(void **state)
{
    (void)state;
    enum { F = 2, PER_FILE = 40, SLOT = 8192, N = F * PER_FILE };
    files f;
    files_init(&f, F);
    g3_store_options o = options(&f, SLOT, PER_FILE, 8);
    g3_store *st = open_ok(&o);
    uint64_t gens[N] = {0}, max_gen = 0;
    uint8_t *buf = aligned_buf(SLOT);
    /* Slots 0..59 written (lengths vary), 10..19 cleared, 0..4 rewritten. */
    for (uint64_t s = 0; s < 60; s++) {
        size_t len = SLOT - (s % 4) * 1000;
        fill_pattern(buf, len, seed_for(s, 1));
        assert_int_equal(write_sync(st, s, 1, buf, len, &gens[s]), 0);
    }
    for (uint64_t s = 10; s < 20; s++) assert_int_equal(clear_sync(st, s), 0);
    for (uint64_t s = 0; s < 5; s++) {
        fill_pattern(buf, SLOT, seed_for(s, 2));
        assert_int_equal(write_sync(st, s, 2, buf, SLOT, &gens[s]), 0);
    }
    for (uint64_t s = 0; s < N; s++)
        if (gens[s] > max_gen) max_gen = gens[s];
    g3_store_close(st);

    st = open_ok(&o);
    /* Writes wait for the scan (it learns the highest generation). */
    done d = {0, 0};
    assert_int_equal(g3_store_write(st, 70, "k", 1, buf, SLOT, on_done, &d, NULL), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "scanned"));
    assert_int_equal(g3_store_clear(st, 70, on_done, &d), KVCR_EINVAL);
    /* Reads do not. */
    assert_int_equal(get_slot(st, 30, 1, SLOT - (30 % 4) * 1000), 0);
    /* A read expecting another length than the record's is refused. */
    assert_int_equal(get_slot(st, 30, 1, SLOT), G3_CORRUPT);

    seen sn;
    seen_init(&sn, N);
    g3_scan_stats stats;
    assert_int_equal(g3_store_scan(st, on_slot, &sn, &stats), 0);
    assert_int_equal(sn.reported, 50);
    assert_int_equal(stats.slots, N);
    assert_int_equal(stats.full, 50);
    assert_int_equal(stats.empty, 10);
    assert_int_equal(stats.unwritten, N - 60);
    assert_int_equal(stats.damaged, 0);
    for (uint64_t s = 0; s < N; s++) {
        if (s >= 60 || (s >= 10 && s < 20)) {
            assert_int_equal(sn.gens[s], 0);
            continue;
        }
        unsigned v = s < 5 ? 2 : 1;
        char key[64];
        key_for(key, s, v);
        assert_string_equal(sn.keys[s], key);
        assert_int_equal(sn.gens[s], gens[s]);
        size_t len = v == 2 ? SLOT : SLOT - (s % 4) * 1000;
        assert_int_equal(sn.lens[s], len);
        assert_int_equal(get_slot(st, s, v, len), 0);
        /* The old version of a rewritten slot is gone. */
        if (v == 2) assert_int_equal(get_slot(st, s, 1, SLOT), G3_CORRUPT);
    }
    uint64_t g = 0;
    fill_pattern(buf, SLOT, 9);
    assert_int_equal(write_sync(st, 70, 1, buf, SLOT, &g), 0);
    assert_true(g > max_gen);
    seen_free(&sn);
    free(buf);
    g3_store_close(st);
}

/* ---- integrity ----------------------------------------------------------------------- */

static void test_a_flipped_data_bit_reads_as_corrupt(void **state)
{
    (void)state;
    enum { SLOT = 8192 };
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, SLOT, 8, 4);
    g3_store *st = open_ok(&o);
    for (uint64_t s = 0; s < 6; s++) put_slot(st, s, 1, SLOT);
    g3_location loc;
    assert_int_equal(g3_store_locate(st, 3, &loc), 0);
    g3_store_close(st);
    flip_bit(f.p[loc.file], loc.data_offset + 5000, 3);

    seen sn;
    seen_init(&sn, 16);
    st = reopen_scanned(&o, NULL, on_slot, &sn);
    /* The scan verifies records only: slot 3 is still reported. */
    assert_int_equal(sn.reported, 6);
    assert_true(sn.gens[3] != 0);
    assert_int_equal(get_slot(st, 3, 1, SLOT), G3_CORRUPT);
    for (uint64_t s = 0; s < 6; s++)
        if (s != 3) assert_int_equal(get_slot(st, s, 1, SLOT), 0);
    /* The slot is usable again once rewritten. */
    put_slot(st, 3, 2, SLOT);
    assert_int_equal(get_slot(st, 3, 2, SLOT), 0);
    seen_free(&sn);
    g3_store_close(st);
}

/* Writes started together (more than the queue depth, aligned and bounced
 * buffers mixed) are handed to the kernel before any of their checksums is
 * computed; each record must still carry its own block's checksum: after
 * a restart every block reads back exact, and the one whose data was
 * damaged on disk is G3_CORRUPT, never bytes. */
static void test_writes_started_together_each_carry_their_own_checksum(void **state)
{
    (void)state;
    enum { SLOT = 8192, QD = 8, N = 20 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, N, QD);
    g3_store *st = open_ok(&o);
    static uint8_t *bufs[N];
    static done wd[N];
    char key[64];
    for (size_t s = 0; s < N; s++) {
        bufs[s] = aligned_buf(SLOT + 1);
        uint8_t *src = s % 4 == 3 ? bufs[s] + 1 : bufs[s]; /* every 4th through a bounce */
        fill_pattern(src, SLOT, seed_for(s, 1));
        size_t kl = key_for(key, s, 1);
        wd[s] = (done){0, 1};
        assert_int_equal(g3_store_write(st, s, key, kl, src, SLOT, on_done, &wd[s], NULL), 0);
    }
    wait_idle(st, WAIT_MS);
    for (size_t s = 0; s < N; s++) {
        assert_int_equal(wd[s].calls, 1);
        assert_int_equal(wd[s].result, 0);
        memset(bufs[s], 0xEE, SLOT + 1); /* the store must not look at them again */
    }
    g3_location loc;
    assert_int_equal(g3_store_locate(st, 5, &loc), 0);
    g3_store_close(st);
    flip_bit(f.p[0], loc.data_offset + 777, 2);

    seen sn;
    seen_init(&sn, N);
    st = reopen_scanned(&o, NULL, on_slot, &sn);
    assert_int_equal(sn.reported, N);
    for (uint64_t s = 0; s < N; s++) {
        assert_int_equal(sn.lens[s], SLOT);
        assert_int_equal(get_slot(st, s, 1, SLOT), s == 5 ? G3_CORRUPT : 0);
    }
    for (size_t s = 0; s < N; s++) free(bufs[s]);
    seen_free(&sn);
    g3_store_close(st);
}

/* A write whose data is written leaves the queue depth to the next request
 * while its 4 KiB record update is out, but its callback still waits for
 * the record: every callback finds the record (its key) on disk already.
 * Checked after every progress step: at most qd requests moving data, at
 * most 2 * qd active, at most 4 * qd I/Os (the ring's size). */
typedef struct rec_check {
    const char *path;
    uint64_t record_offset;
    char key[64];
    size_t kl;
    int calls, result;
    bool record_on_disk;
} rec_check;

static void on_write_check_record(void *ud, int result)
{
    rec_check *c = ud;
    c->calls++;
    c->result = result;
    uint8_t rec[G3_RECORD_SIZE];
    file_io(c->path, false, c->record_offset, rec, sizeof rec);
    c->record_on_disk = memmem(rec, sizeof rec, c->key, c->kl) != NULL;
}

/* Like wait_idle, checking the depth accounting after every step; returns
 * the most writes seen waiting only for their record update at once. */
static unsigned wait_idle_checking_depth(g3_store *st, unsigned qd)
{
    uint64_t deadline = now_ns() + (uint64_t)WAIT_MS * 1000000u;
    unsigned most_parked = 0;
    while (g3_store_pending(st) > 0) {
        g3_store_progress(st);
        assert_true(st->n_active - st->n_verifying - st->n_parked <= qd);
        assert_true(st->n_active <= 2 * qd);
        assert_true(st->ios <= 4 * qd);
        if (st->n_parked > most_parked) most_parked = st->n_parked;
        if (now_ns() >= deadline) fail_msg("%zu G3 requests pending", g3_store_pending(st));
        struct pollfd p = {g3_store_fd(st), POLLIN, 0};
        if (g3_store_pending(st) > 0) poll(&p, 1, 100);
    }
    return most_parked;
}

static void test_written_data_frees_the_depth_but_callbacks_wait_for_records(void **state)
{
    (void)state;
    enum { SLOT = 65536, QD = 2, N = 48 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, N, QD);
    g3_store *st = open_ok(&o);
    static rec_check c[N];
    uint8_t *data = aligned_buf((size_t)N * SLOT);
    g3_store_plug(st);
    for (uint64_t s = 0; s < N; s++) {
        g3_location loc;
        assert_int_equal(g3_store_locate(st, s, &loc), 0);
        c[s] = (rec_check){.path = f.p[0], .record_offset = loc.record_offset, .result = 1};
        c[s].kl = key_for(c[s].key, s, 1);
        fill_pattern(data + s * SLOT, SLOT, seed_for(s, 1));
        assert_int_equal(g3_store_write(st, s, c[s].key, c[s].kl, data + s * SLOT, SLOT,
                                        on_write_check_record, &c[s], NULL), 0);
    }
    g3_store_unplug(st);
    unsigned parked = wait_idle_checking_depth(st, QD);
    print_message("G3 writes at depth %d: up to %u waited only for their record at once\n", QD,
                  parked);
    for (uint64_t s = 0; s < N; s++) {
        assert_int_equal(c[s].calls, 1);
        assert_int_equal(c[s].result, 0);
        assert_true(c[s].record_on_disk);
    }
    /* Reads in the same queue, and a restart: every block exact. */
    for (uint64_t s = 0; s < N; s++) assert_int_equal(get_slot(st, s, 1, SLOT), 0);
    g3_store_close(st);
    seen sn;
    seen_init(&sn, N);
    st = reopen_scanned(&o, NULL, on_slot, &sn);
    assert_int_equal(sn.reported, N);
    for (uint64_t s = 0; s < N; s++) assert_int_equal(get_slot(st, s, 1, SLOT), 0);
    seen_free(&sn);
    free(data);
    g3_store_close(st);
}

static void test_a_flipped_record_bit_hides_the_slot(void **state)
{
    (void)state;
    enum { SLOT = 4096 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, 40, 4);
    g3_store *st = open_ok(&o);
    for (uint64_t s = 0; s < 40; s++) put_slot(st, s, 1, SLOT);
    g3_location l7, l20;
    assert_int_equal(g3_store_locate(st, 7, &l7), 0);
    assert_int_equal(g3_store_locate(st, 20, &l20), 0);
    g3_store_close(st);
    flip_bit(f.p[l7.file], l7.record_offset + 45, 0);   /* a key byte */
    flip_bit(f.p[l20.file], l20.record_offset + 17, 6); /* the generation */

    seen sn;
    seen_init(&sn, 40);
    g3_scan_stats stats;
    st = reopen_scanned(&o, &stats, on_slot, &sn);
    assert_int_equal(sn.reported, 38);
    assert_int_equal(stats.damaged, 2);
    assert_int_equal(sn.gens[7], 0);
    assert_int_equal(sn.gens[20], 0);
    assert_int_equal(get_slot(st, 7, 1, SLOT), G3_CORRUPT);
    assert_int_equal(get_slot(st, 20, 1, SLOT), G3_CORRUPT);
    /* Its neighbours in the same index block are intact. */
    assert_int_equal(get_slot(st, 6, 1, SLOT), 0);
    assert_int_equal(get_slot(st, 8, 1, SLOT), 0);
    seen_free(&sn);
    g3_store_close(st);
}

/* A crash between the data and the record, two ways: the record never
 * written (zeroed by hand after the store wrote it), and a rewrite whose
 * new data landed while the old record stayed. */
static void test_torn_stores_never_hand_over_bytes(void **state)
{
    (void)state;
    enum { SLOT = 4096 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, 8, 4);
    g3_store *st = open_ok(&o);
    for (uint64_t s = 0; s < 4; s++) put_slot(st, s, 1, SLOT);
    assert_int_equal(clear_sync(st, 3), 0);
    g3_location l1, l2;
    assert_int_equal(g3_store_locate(st, 1, &l1), 0);
    assert_int_equal(g3_store_locate(st, 2, &l2), 0);
    g3_store_close(st);
    uint8_t zero[G3_RECORD_SIZE] = {0};
    file_io(f.p[l1.file], true, l1.record_offset, zero, sizeof zero);
    uint8_t *other = aligned_buf(SLOT);
    fill_pattern(other, SLOT, 12345);
    file_io(f.p[l2.file], true, l2.data_offset, other, SLOT);
    free(other);

    seen sn;
    seen_init(&sn, 8);
    g3_scan_stats stats;
    st = reopen_scanned(&o, &stats, on_slot, &sn);
    assert_int_equal(sn.gens[1], 0); /* record gone: empty */
    assert_true(sn.gens[2] != 0);    /* record intact, data not (seen on read) */
    assert_int_equal(sn.gens[3], 0); /* cleared stays cleared */
    assert_true(sn.gens[0] != 0);
    assert_int_equal(stats.empty, 1);
    assert_int_equal(get_slot(st, 0, 1, SLOT), 0);
    assert_int_equal(get_slot(st, 1, 1, SLOT), G3_CORRUPT);
    assert_int_equal(get_slot(st, 2, 1, SLOT), G3_CORRUPT);
    assert_int_equal(get_slot(st, 3, 1, SLOT), G3_CORRUPT);
    seen_free(&sn);
    g3_store_close(st);
}

static void test_files_of_another_size_are_refused(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, 4096, 16, 4);
    g3_store *st = open_ok(&o);
    put_slot(st, 0, 1, 4096);
    g3_store_close(st);
    off_t full = file_size(f.p[1]);
    assert_int_equal(truncate(f.p[1], full - 4096), 0);
    expect_open_error(&o, KVCR_EINVAL, "has incompatible size");
    assert_int_equal(file_size(f.p[1]), full - 4096); /* left alone */
    /* Another capacity than the files were made with. */
    assert_int_equal(truncate(f.p[1], full), 0);
    g3_store_options bigger = options(&f, 4096, 32, 4);
    expect_open_error(&bigger, KVCR_EINVAL, "has incompatible size");
    /* A file that is not ours. */
    files g;
    files_init(&g, 1);
    int fd = open(g.p[0], O_RDWR | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a G3 file", 13), 13);
    close(fd);
    g3_store_options og = options(&g, 4096, 16, 4);
    expect_open_error(&og, KVCR_EINVAL, "has incompatible size");
    assert_int_equal(file_size(g.p[0]), 13);
    /* The originals still open, with their slot. */
    st = reopen_scanned(&o, NULL, NULL, NULL);
    assert_int_equal(get_slot(st, 0, 1, 4096), 0);
    g3_store_close(st);
}

/* Superblocks: damaged, another layout, another store, zeroed. */
static void test_superblocks_are_checked(void **state)
{
    (void)state;
    files a, b;
    files_init(&a, 2);
    files_init(&b, 2);
    g3_store_options oa = options(&a, 4096, 16, 4), ob = options(&b, 4096, 16, 4);
    g3_store *st = open_ok(&oa);
    for (uint64_t s = 0; s < 8; s++) put_slot(st, s, 1, 4096);
    g3_store_close(st);
    g3_store_close(open_ok(&ob));

    const char *swapped[] = {a.p[1], a.p[0]};
    g3_store_options o = oa;
    o.paths = swapped;
    expect_open_error(&o, KVCR_EINVAL, "was made for another layout (file 2 of 2");
    const char *mixed[] = {a.p[0], b.p[1]};
    o.paths = mixed;
    expect_open_error(&o, KVCR_EINVAL, "belong to different stores");

    flip_bit(a.p[0], 20, 1);
    expect_open_error(&oa, KVCR_EINVAL, "superblock is damaged");
    flip_bit(a.p[0], 20, 1);
    st = reopen_scanned(&oa, NULL, NULL, NULL);
    assert_int_equal(get_slot(st, 2, 1, 4096), 0);
    g3_store_close(st);

    /* A zeroed superblock counts as a file never formatted: it is formatted
     * again (both files then, under a new uuid) and nothing old verifies. */
    uint8_t zero[G3_SUPERBLOCK_SIZE] = {0};
    file_io(a.p[0], true, 0, zero, sizeof zero);
    file_io(a.p[1], true, 0, zero, sizeof zero);
    g3_scan_stats stats;
    st = reopen_scanned(&oa, &stats, NULL, NULL);
    assert_int_equal(stats.full, 0);
    assert_int_equal(stats.damaged, 8);
    assert_int_equal(get_slot(st, 2, 1, 4096), G3_CORRUPT);
    g3_store_close(st);
}

/* ---- faults ---------------------------------------------------------------------------- */

static void test_injected_faults_reach_the_callback_and_the_store_goes_on(void **state)
{
    (void)state;
    enum { SLOT = 8192 };
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, SLOT, 16, 4);
    g3_store *st = open_ok(&o);
    uint8_t *buf = aligned_buf(SLOT);
    fill_pattern(buf, SLOT, seed_for(5, 1));

    g3_store_fail_next(st, 1, ENOSPC); /* the data write */
    assert_int_equal(write_sync(st, 5, 1, buf, SLOT, NULL), -ENOSPC);
    g3_store_fail_after(st, 1, 1, EIO); /* the index block read */
    assert_int_equal(write_sync(st, 5, 1, buf, SLOT, NULL), -EIO);
    g3_store_fail_after(st, 2, 1, ENOSPC); /* the index block write */
    assert_int_equal(write_sync(st, 5, 1, buf, SLOT, NULL), -ENOSPC);
    assert_int_equal(write_sync(st, 5, 1, buf, SLOT, NULL), 0);

    /* The store wrote slot 5 itself, so it knows its record: a read is one
     * I/O, the data. */
    g3_store_fail_next(st, 1, EIO);
    assert_int_equal(get_slot(st, 5, 1, SLOT), -EIO);
    assert_int_equal(get_slot(st, 5, 1, SLOT), 0);

    g3_store_fail_next(st, 1, EIO);
    assert_int_equal(clear_sync(st, 5), -EIO);
    /* After a failed clear the store no longer trusts what it knew: the
     * read takes the record from disk (two I/Os), where the clear never
     * happened. */
    g3_store_fail_after(st, 1, 1, EIO);
    assert_int_equal(get_slot(st, 5, 1, SLOT), -EIO);
    assert_int_equal(get_slot(st, 5, 1, SLOT), 0);
    assert_int_equal(clear_sync(st, 5), 0);
    assert_int_equal(get_slot(st, 5, 1, SLOT), G3_CORRUPT);

    for (uint64_t s = 0; s < 8; s++) put_slot(st, s, 2, SLOT);
    for (uint64_t s = 0; s < 8; s++) assert_int_equal(get_slot(st, s, 2, SLOT), 0);
    free(buf);
    g3_store_close(st);
}

/* Random writes, clears and reads in rounds, with injected faults; slots
 * share index blocks (coalesced updates, re-reads after failed writes).
 * Every key names one version of one slot's bytes, so a read that
 * succeeds must return exactly that version. A slot whose last write or
 * clear failed may hold either version or nothing; the others are known. */
enum { RW_SLOTS = 48, RW_SLOT = 4096 };
typedef enum { KNOWN_EMPTY, KNOWN_FULL, UNKNOWN } slot_state;
typedef struct rw_model {
    slot_state state[RW_SLOTS];
    unsigned version[RW_SLOTS]; /* of the last write submitted */
} rw_model;

typedef struct rw_op {
    done d;
    int kind; /* 0 write, 1 clear, 2 read */
    uint64_t slot;
    unsigned version;
    uint8_t *buf;
} rw_op;

static void rw_check_read(const rw_model *m, const rw_op *op, bool faults)
{
    uint8_t *want = aligned_buf(RW_SLOT);
    fill_pattern(want, RW_SLOT, seed_for(op->slot, op->version));
    if (op->d.result == 0)
        assert_memory_equal(op->buf, want, RW_SLOT);
    else if (op->d.result == G3_CORRUPT)
        assert_true(m->state[op->slot] != KNOWN_FULL);
    else
        assert_true(faults && op->d.result == -EIO);
    free(want);
}

static void rw_round(g3_store *st, rw_model *m, unsigned round, bool faults)
{
    enum { OPS = 24 };
    rw_op ops[OPS];
    bool used[RW_SLOTS] = {false};
    if (faults) g3_store_fail_after(st, (unsigned)rand() % 20, 1 + (unsigned)rand() % 2, EIO);
    for (size_t i = 0; i < OPS; i++) {
        rw_op *op = &ops[i];
        uint64_t s = (uint64_t)rand() % RW_SLOTS;
        for (int k = 0; k < RW_SLOTS && used[s]; k++) s = (s + 1) % RW_SLOTS;
        used[s] = true;
        *op = (rw_op){{0, 1}, rand() % 3, s, 0, aligned_buf(RW_SLOT)};
        char key[64];
        if (op->kind == 0) {
            op->version = m->version[s] = round * 1000 + (unsigned)i + 1;
            fill_pattern(op->buf, RW_SLOT, seed_for(s, op->version));
            key_for(key, s, op->version);
            assert_int_equal(
                g3_store_write(st, s, key, strlen(key), op->buf, RW_SLOT, on_done, &op->d, NULL),
                0);
        } else if (op->kind == 1) {
            assert_int_equal(g3_store_clear(st, s, on_done, &op->d), 0);
        } else {
            op->version = m->version[s];
            key_for(key, s, op->version);
            assert_int_equal(
                g3_store_read(st, s, key, strlen(key), op->buf, RW_SLOT, on_done, &op->d), 0);
        }
    }
    wait_idle(st, WAIT_MS);
    g3_store_fail_next(st, 0, 0);
    for (size_t i = 0; i < OPS; i++) {
        rw_op *op = &ops[i];
        assert_int_equal(op->d.calls, 1);
        if (!faults)
            assert_true(op->d.result == 0 || (op->kind == 2 && op->d.result == G3_CORRUPT));
        if (op->kind == 2)
            rw_check_read(m, op, faults);
        else if (op->d.result != 0)
            m->state[op->slot] = UNKNOWN;
        else
            m->state[op->slot] = op->kind == 0 ? KNOWN_FULL : KNOWN_EMPTY;
        free(op->buf);
    }
}

static void test_random_workload_with_faults_never_returns_wrong_bytes(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, RW_SLOT, RW_SLOTS / 2, 16);
    g3_store *st = open_ok(&o);
    rw_model m;
    memset(&m, 0, sizeof m);
    srand(42);
    for (unsigned r = 1; r <= 150; r++) rw_round(st, &m, r, r % 3 == 0);
    g3_store_close(st);

    /* After a restart: what is known is what the scan says. */
    seen sn;
    seen_init(&sn, RW_SLOTS);
    st = reopen_scanned(&o, NULL, on_slot, &sn);
    for (uint64_t s = 0; s < RW_SLOTS; s++) {
        char key[64];
        key_for(key, s, m.version[s]);
        if (m.state[s] == KNOWN_FULL) assert_string_equal(sn.keys[s], key);
        if (m.state[s] == KNOWN_EMPTY) assert_int_equal(sn.gens[s], 0);
        if (sn.gens[s] == 0) continue;
        unsigned v = 0;
        assert_int_equal(sscanf(sn.keys[s], "block-%*u-v%u", &v), 1);
        int rc = get_slot(st, s, v, RW_SLOT); /* compares bytes on success */
        assert_true(rc == 0 || (rc == G3_CORRUPT && m.state[s] == UNKNOWN));
    }
    seen_free(&sn);
    g3_store_close(st);
}

/* Every pattern of 1..4 failed completions, at every offset, while writes,
 * reads and clears of one slot, of its neighbours in one index block and of
 * a slot in another block are queued behind each other (requests on one
 * slot wait for the one before; a read waits behind a write that fails):
 * every callback runs exactly once, the store goes idle within a bounded
 * number of wake-ups of its fd (each must come: wait_idle fails on a
 * silent fd), a read that succeeds returns the bytes of the write before it, and
 * the store serves normally once the faults stop. The chaos soak saw G3
 * reads wait for tens of seconds after injected ENOSPC completions; this
 * pins that no failed completion, in any position, loses a request. */
enum { FP_SLOT = 4096, FP_OPS = 10, FP_MAX_FAILED = 4, FP_OFFSETS = 24 };
typedef struct fp_op {
    done d;
    int kind; /* 0 write, 1 clear, 2 read */
    uint64_t slot;
    unsigned version;
    int after; /* read: the write or clear of its slot before it, or -1 */
    uint8_t *buf;
} fp_op;

static void fp_submit(g3_store *st, fp_op *op)
{
    char key[64];
    size_t kl = key_for(key, op->slot, op->version);
    op->d = (done){0, 1};
    if (op->kind == 0) {
        fill_pattern(op->buf, FP_SLOT, seed_for(op->slot, op->version));
        assert_int_equal(g3_store_write(st, op->slot, key, kl, op->buf, FP_SLOT, on_done, &op->d,
                                        NULL),
                         0);
    } else if (op->kind == 1) {
        assert_int_equal(g3_store_clear(st, op->slot, on_done, &op->d), 0);
    } else {
        assert_int_equal(
            g3_store_read(st, op->slot, key, kl, op->buf, FP_SLOT, on_done, &op->d), 0);
    }
}

static void fp_check_read(const fp_op *ops, const fp_op *op, int err)
{
    const fp_op *before = op->after >= 0 ? &ops[op->after] : NULL;
    if (op->d.result == 0) {
        uint8_t *want = aligned_buf(FP_SLOT);
        fill_pattern(want, FP_SLOT, seed_for(op->slot, op->version));
        assert_memory_equal(op->buf, want, FP_SLOT);
        free(want);
        assert_false(before && before->kind == 1 && before->d.result == 0);
        return;
    }
    assert_true(op->d.result == -err || op->d.result == G3_CORRUPT);
    /* What the store wrote itself it knows: only a failed I/O of the read
     * can fail it, or the slot being empty. */
    if (op->d.result == G3_CORRUPT && before && before->d.result == 0)
        assert_int_equal(before->kind, 1);
}

static void fp_round(g3_store *st, fp_op *ops, unsigned skip, unsigned n, int err)
{
    /* slot, kind, version; reads name the version the write before wrote */
    static const struct { uint64_t slot; int kind; unsigned version; } plan[FP_OPS] = {
        {0, 0, 2}, {0, 2, 2}, {2, 0, 2}, {1, 2, 1}, {1, 1, 0},
        {1, 2, 1}, {0, 0, 3}, {0, 2, 3}, {2, 2, 2}, {16, 2, 1},
    };
    for (uint64_t s = 0; s < 3; s++) put_slot(st, s, 1, FP_SLOT);
    put_slot(st, 16, 1, FP_SLOT);
    g3_store_fail_after(st, skip, n, err);
    for (int i = 0; i < FP_OPS; i++) {
        fp_op *op = &ops[i];
        op->slot = plan[i].slot;
        op->kind = plan[i].kind;
        op->version = plan[i].version;
        op->after = -1;
        for (int j = 0; j < i; j++)
            if (ops[j].slot == op->slot && ops[j].kind != 2) op->after = j;
        fp_submit(st, op);
    }
    unsigned rounds = wait_idle(st, WAIT_MS);
    g3_store_fail_next(st, 0, 0);
    /* A request is at most five I/Os (data, index block read, write, and a
     * re-read and rewrite after a failed write), each at most two wake-ups
     * (one may find its completion reaped already). */
    if (rounds > FP_OPS * 5 * 2)
        fail_msg("%u wake-ups for %d requests (skip %u, n %u)", rounds, FP_OPS, skip, n);
    for (int i = 0; i < FP_OPS; i++) {
        const fp_op *op = &ops[i];
        if (op->d.calls != 1)
            fail_msg("request %d: %d callbacks (skip %u, n %u)", i, op->d.calls, skip, n);
        if (op->kind == 2)
            fp_check_read(ops, op, err);
        else
            assert_true(op->d.result == 0 || op->d.result == -err);
    }
}

static void failed_completions_at_every_offset(unsigned qd)
{
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, FP_SLOT, 32, qd);
    g3_store *st = open_ok(&o);
    fp_op ops[FP_OPS];
    for (int i = 0; i < FP_OPS; i++) ops[i].buf = aligned_buf(FP_SLOT);
    for (unsigned n = 1; n <= FP_MAX_FAILED; n++)
        for (unsigned skip = 0; skip < FP_OFFSETS; skip++)
            fp_round(st, ops, skip, n, n % 2 ? ENOSPC : EIO);
    /* Served normally afterwards. */
    for (uint64_t s = 0; s < 32; s++) put_slot(st, s, 9, FP_SLOT);
    for (uint64_t s = 0; s < 32; s++) assert_int_equal(get_slot(st, s, 9, FP_SLOT), 0);
    for (int i = 0; i < FP_OPS; i++) free(ops[i].buf);
    g3_store_close(st);
}

static void test_failed_completions_at_every_offset_lose_no_request(void **state)
{
    (void)state;
    failed_completions_at_every_offset(2);  /* requests wait in the FIFO */
    failed_completions_at_every_offset(16); /* all in flight at once */
}

/* Close with requests queued and in flight: every callback runs once,
 * queued ones with -ECANCELED, in-flight ones with their result; a
 * request submitted from a callback meanwhile is refused. */
typedef struct close_probe {
    g3_store *st;
    int calls, refused;
} close_probe;

typedef struct close_req {
    close_probe *probe;
    int calls, result;
} close_req;

static void on_close_done(void *ud, int result)
{
    close_req *r = ud;
    r->calls++;
    r->result = result;
    r->probe->calls++;
    uint8_t b[1] = {0};
    if (g3_store_write(r->probe->st, 0, "x", 1, b, 1, on_close_done, r, NULL) == KVCR_ECLOSED)
        r->probe->refused++;
}

static void test_close_completes_every_request(void **state)
{
    (void)state;
    enum { N = 40, QD = 2, SLOT = 4096 };
    files f;
    files_init(&f, 1);
    g3_store_options o = options(&f, SLOT, N, QD);
    g3_store *st = open_ok(&o);
    uint8_t *buf = aligned_buf(SLOT);
    fill_pattern(buf, SLOT, 5);
    close_probe probe = {st, 0, 0};
    static close_req reqs[N];
    for (uint64_t s = 0; s < N; s++) {
        reqs[s] = (close_req){&probe, 0, 1};
        char key[64];
        size_t kl = key_for(key, s, 1);
        assert_int_equal(g3_store_write(st, s, key, kl, buf, SLOT, on_close_done, &reqs[s], NULL),
                         0);
    }
    assert_int_equal(g3_store_pending(st), N);
    g3_store_close(st);
    assert_int_equal(probe.calls, N);
    assert_int_equal(probe.refused, N);
    int ok = 0;
    for (uint64_t s = 0; s < N; s++) {
        assert_int_equal(reqs[s].calls, 1);
        assert_true(reqs[s].result == 0 || reqs[s].result == -ECANCELED);
        ok += reqs[s].result == 0;
    }
    assert_int_equal(ok, QD); /* the two started at submission */

    seen sn;
    seen_init(&sn, N);
    st = reopen_scanned(&o, NULL, on_slot, &sn);
    assert_int_equal(sn.reported, QD);
    for (uint64_t s = 0; s < N; s++) assert_int_equal(sn.gens[s] != 0, reqs[s].result == 0);
    seen_free(&sn);
    free(buf);
    g3_store_close(st);
}

/* Callbacks may submit: a chain of writes, each started by the previous
 * one's callback. Progress and scan are refused from inside. */
typedef struct chain {
    g3_store *st;
    uint8_t *bufs[32];
    unsigned next, n, failures, reentered;
} chain;

static void on_chain(void *ud, int result)
{
    chain *c = ud;
    if (result != 0) c->failures++;
    if (g3_store_progress(c->st) != 0 || g3_store_scan(c->st, NULL, NULL, NULL) != KVCR_EBUSY)
        c->reentered++;
    if (c->next >= c->n) return;
    char key[64];
    size_t kl = key_for(key, c->next, 1);
    if (g3_store_write(c->st, c->next, key, kl, c->bufs[c->next], 4096, on_chain, c, NULL) != 0)
        c->failures++;
    c->next++;
}

static void test_callbacks_may_submit_requests(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, 4096, 16, 4);
    g3_store *st = open_ok(&o);
    chain c = {st, {NULL}, 1, 32, 0, 0};
    for (unsigned i = 0; i < c.n; i++) {
        c.bufs[i] = aligned_buf(4096);
        fill_pattern(c.bufs[i], 4096, seed_for(i, 1));
    }
    char key[64];
    size_t kl = key_for(key, 0, 1);
    assert_int_equal(g3_store_write(st, 0, key, kl, c.bufs[0], 4096, on_chain, &c, NULL), 0);
    assert_int_equal(g3_store_scan(st, NULL, NULL, NULL), KVCR_EBUSY);
    assert_non_null(strstr(kvcr_last_error(), "idle"));
    wait_idle(st, WAIT_MS);
    assert_int_equal(c.next, c.n);
    assert_int_equal(c.failures, 0);
    assert_int_equal(c.reentered, 0);
    for (unsigned i = 0; i < c.n; i++) {
        assert_int_equal(get_slot(st, i, 1, 4096), 0);
        free(c.bufs[i]);
    }
    g3_store_close(st);
}

/* ---- the file system ------------------------------------------------------------------- */

static void test_tmpfs_is_refused_for_want_of_o_direct(void **state)
{
    (void)state;
    char dir[] = "/dev/shm/kvcr-g3-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        print_message("no /dev/shm here: %s\n", strerror(errno));
        skip();
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/g3-0", dir);
    const char *p[] = {path};
    g3_store_options o = {p, 1, 16 * 4096, 4096, 0, NULL};
    expect_open_error(&o, KVCR_EINVAL, "G3 file storage requires O_DIRECT (tmpfs of ");
    assert_non_null(strstr(kvcr_last_error(), "does not support it"));
    /* The refused open created the file, and took it away again. */
    assert_int_equal(access(path, F_OK), -1);
    /* A file that was there before stays. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    expect_open_error(&o, KVCR_EINVAL, "G3 file storage requires O_DIRECT (tmpfs of ");
    assert_int_equal(access(path, F_OK), 0);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

/* Unlinked underneath: the descriptor keeps the inode; the next open
 * starts a new, empty file. */
static void test_a_file_removed_underneath_keeps_working(void **state)
{
    (void)state;
    files f;
    files_init(&f, 2);
    g3_store_options o = options(&f, 4096, 8, 4);
    g3_store *st = open_ok(&o);
    put_slot(st, 0, 1, 4096);
    assert_int_equal(unlink(f.p[0]), 0);
    put_slot(st, 2, 1, 4096);
    assert_int_equal(get_slot(st, 0, 1, 4096), 0);
    assert_int_equal(get_slot(st, 2, 1, 4096), 0);
    g3_store_close(st);
    g3_scan_stats stats;
    st = reopen_scanned(&o, &stats, NULL, NULL);
    assert_int_equal(stats.full, 0); /* file 0 is new; its uuid is file 1's */
    g3_store_close(st);
}

/* ---- scale --------------------------------------------------------------------------------- */

static void test_scan_of_100k_slots(void **state)
{
    (void)state;
    enum { F = 2, SLOT = 4096, N = 100000, WINDOW = 512 };
    files f;
    files_init(&f, F);
    g3_store_options o = options(&f, SLOT, N / F, 64);
    g3_store *st = open_ok(&o);
    uint8_t *buf = aligned_buf(SLOT);
    fill_pattern(buf, SLOT, 77);
    static done d[WINDOW];
    uint64_t t0 = now_ns();
    for (uint64_t base = 0; base < N; base += WINDOW) {
        for (uint64_t i = 0; i < WINDOW && base + i < N; i++) {
            char key[64];
            size_t kl = key_for(key, base + i, 1);
            d[i] = (done){0, 1};
            assert_int_equal(g3_store_write(st, base + i, key, kl, buf, SLOT, on_done, &d[i], NULL),
                             0);
        }
        wait_idle(st, WAIT_MS);
        for (uint64_t i = 0; i < WINDOW && base + i < N; i++) assert_int_equal(d[i].result, 0);
    }
    uint64_t t1 = now_ns();
    g3_store_close(st);

    seen sn;
    seen_init(&sn, N);
    g3_scan_stats stats;
    st = open_ok(&o);
    uint64_t t2 = now_ns();
    assert_int_equal(g3_store_scan(st, on_slot, &sn, &stats), 0);
    uint64_t t3 = now_ns();
    assert_int_equal(sn.reported, N);
    assert_int_equal(stats.full, N);
    print_message("G3 100k slots: written in %.2f s; scan %.1f ms (%.1f MiB of index, %.0f "
                  "records/s)\n",
                  (t1 - t0) / 1e9, (t3 - t2) / 1e6, stats.index_bytes / 1048576.0,
                  N / ((t3 - t2) / 1e9));
    uint8_t *back = aligned_buf(SLOT);
    assert_int_equal(read_sync(st, N - 1, 1, back, SLOT), 0);
    assert_memory_equal(back, buf, SLOT);
    free(back);
    seen_free(&sn);
    free(buf);
    g3_store_close(st);
}

/* ---- set-up ------------------------------------------------------------------------------ */

static bool odirect_works(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/probe", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0) close(fd);
    unlink(p);
    return fd >= 0;
}

static int setup(void **state)
{
    (void)state;
    const char *bases[] = {"/tmp", "/var/tmp"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(g_root, sizeof g_root, "%s/kvcr-g3-test-XXXXXX", bases[i]);
        if (mkdtemp(g_root) == NULL) continue;
        if (odirect_works(g_root)) return 0;
        rmdir(g_root);
    }
    fprintf(stderr, "no directory with O_DIRECT support in /tmp or /var/tmp\n");
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
    return nftw(g_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_rules_and_their_messages),
        cmocka_unit_test(test_a_second_store_is_refused_until_the_first_closes),
        cmocka_unit_test(test_slot_s_lives_in_file_s_mod_f),
        cmocka_unit_test(test_roundtrip_at_queue_depth_1),
        cmocka_unit_test(test_roundtrip_at_queue_depth_16),
        cmocka_unit_test(test_requests_on_one_slot_run_in_order),
        cmocka_unit_test(test_restart_scan_reports_every_written_slot),
        cmocka_unit_test(test_a_flipped_data_bit_reads_as_corrupt),
        cmocka_unit_test(test_writes_started_together_each_carry_their_own_checksum),
        cmocka_unit_test(test_written_data_frees_the_depth_but_callbacks_wait_for_records),
        cmocka_unit_test(test_a_flipped_record_bit_hides_the_slot),
        cmocka_unit_test(test_torn_stores_never_hand_over_bytes),
        cmocka_unit_test(test_files_of_another_size_are_refused),
        cmocka_unit_test(test_superblocks_are_checked),
        cmocka_unit_test(test_injected_faults_reach_the_callback_and_the_store_goes_on),
        cmocka_unit_test(test_random_workload_with_faults_never_returns_wrong_bytes),
        cmocka_unit_test(test_failed_completions_at_every_offset_lose_no_request),
        cmocka_unit_test(test_close_completes_every_request),
        cmocka_unit_test(test_callbacks_may_submit_requests),
        cmocka_unit_test(test_tmpfs_is_refused_for_want_of_o_direct),
        cmocka_unit_test(test_a_file_removed_underneath_keeps_working),
        cmocka_unit_test(test_scan_of_100k_slots),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
