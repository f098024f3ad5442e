/* The G3 slot store (see g3_store.h for the format and the model).
 *
 * Requests are heap allocated at submission and wait in a FIFO; at most
 * queue_depth of them are active (own I/Os). Memory the kernel reads or
 * writes is aligned: callers' buffers when they qualify, otherwise a
 * bounce buffer per request; record blocks of reads come from a pool of
 * queue_depth 4 KiB buffers, index blocks being updated from a pool of
 * queue_depth cached blocks. Both pools can never run dry: an active
 * request holds at most one of each.
 *
 * Every SQE's user_data is a pointer with a tag in its low bits saying what
 * completed: a request's data, a read's record block, or an index block.
 * Outstanding I/Os never exceed 2 * queue_depth (a request has at most two;
 * an index block has one and stands for the requests waiting on it), which
 * is the ring's size: the SQ never fills and the CQ never overflows. */
#define _GNU_SOURCE /* O_DIRECT */
#include "tiers/g3_store.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Valgrind cannot see the kernel fill a buffer through io_uring: without
 * this, memcheck reports every byte a G3 read brought in as uninitialised.
 * The client request is a few no-op instructions outside valgrind. */
#if defined(__has_include) && __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)(addr), (void)(len))
#endif

#if defined(__x86_64__) || defined(__i386__)
/* libxxhash's xxh_x86dispatch.h declares this, but its declarations turn
 * static under XXH_INLINE_ALL, so the one we use is declared here. */
XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len);
#endif

#include "kvcr/error.h"
#include "util/bytes.h"

#define SB_MAGIC "KVCRG3SB"
#define SB_VERSION 1u
#define SB_USED 128           /* bytes of the superblock in use; the rest is zero */
#define SB_SUM_AT 120         /* its checksum covers [0, SB_SUM_AT) */
#define REC_MAGIC 0x43523347u /* "G3RC" */
#define REC_FULL 1
#define REC_EMPTY 2
#define REC_SUM_AT 248 /* the record checksum covers [0, REC_SUM_AT) */
#define RECS_PER_BLOCK (G3_ALIGN / G3_RECORD_SIZE)
#define SCAN_CHUNK (1u << 20)
#define CLOSE_WAIT_TICKS 600 /* of 100 ms */
#define UUID_LEN 16

#define G3_LOG(st, level, ...)                                                                     \
    do {                                                                                           \
        if ((st)->log) kvcr_log((st)->log, (level), __VA_ARGS__);                                  \
    } while (0)

/* What a completion is about: the low bits of its user_data. */
enum { TAG_DATA = 0, TAG_RECORD = 1, TAG_BLOCK = 2, TAG_MASK = 3 };

typedef enum { OP_WRITE, OP_READ, OP_CLEAR } g3_op;

/* What the store knows of a slot's record without reading it, from the
 * scan and from its own completed writes and clears. A read of a known
 * slot checks the key and length against it and reads only the data (one
 * I/O instead of two); an UNKNOWN slot (files not scanned yet, a write or
 * clear in flight or failed) reads its record from disk as well. */
enum { MEMO_UNKNOWN = 0, MEMO_EMPTY, MEMO_FULL };
typedef struct slot_memo {
    uint64_t sum;      /* FULL: XXH3-64 of the data */
    uint64_t key_hash; /* FULL: XXH3-64 of the key */
    uint64_t len;      /* FULL: data length */
    uint8_t state;
} slot_memo;

typedef struct g3_req g3_req;
struct g3_req {
    g3_req *next;    /* in the FIFO or the done list */
    g3_req *ib_next; /* in an index block's pending or in-flight list */
    g3_op op;
    uint64_t slot, gen, fslot; /* fslot: index within its file */
    uint32_t file;
    uint8_t key_len;
    uint8_t key[G3_KEY_MAX];
    const uint8_t *src; /* write */
    uint8_t *dst;       /* read */
    size_t len;
    g3_done_fn cb;
    void *ud;
    uint8_t *bounce;
    int recbuf;         /* read: its record block buffer, or -1 */
    unsigned active_at; /* index in st->active */
    unsigned ios;       /* own I/Os in flight */
    bool rec_pending;   /* write and clear: its record update is not back yet */
    int result;
    uint64_t sum;       /* write: the data's checksum; read of a known slot: the expected one */
    uint8_t record[G3_RECORD_SIZE]; /* write and clear: the record to store */
};

/* An index block being updated (read-modify-write). Always exactly one I/O
 * in flight while in use. */
typedef struct g3_iblock {
    bool used, writing;
    uint32_t file;
    uint64_t block;
    g3_req *pending, *pending_tail; /* not in buf yet */
    g3_req *inflight;               /* in the write in flight */
    uint8_t *buf;
} g3_iblock;

typedef struct g3_file {
    char path[PATH_MAX];
    int fd;  /* holds the flock; no I/O goes through it */
    int dfd; /* O_DIRECT: all I/O */
    dev_t dev;
    ino_t ino;
    bool created;     /* this open created the file (removed again if the open fails) */
    bool fresh;       /* preallocated by this open */
    bool unformatted; /* no superblock yet */
    uint8_t uuid[UUID_LEN];
} g3_file;

struct g3_store {
    g3_file *files;
    uint32_t n_files;
    uint64_t slot_size, slots_per_file, n_slots;
    uint64_t index_off, index_bytes, data_off, file_size;
    uint8_t uuid[UUID_LEN];
    uint64_t seed; /* of the record checksums: a hash of the uuid */
    const kvcr_logger *log;

    struct io_uring ring;
    bool ring_ok;
    int efd;
    unsigned qd;
    g3_req **active;   /* up to 2 * qd: reads awaiting verification do not */
    unsigned n_active; /* count against the depth (their I/O is done)   */
    g3_req *verify, *verify_tail; /* reads whose I/O is back, to verify */
    unsigned n_verifying;
    g3_req *fifo, *fifo_tail;
    size_t n_fifo;
    g3_req *done, *done_tail;
    size_t n_done;
    uint8_t *recbufs; /* 2 * qd * G3_ALIGN: one per active request */
    int *free_recbufs;
    unsigned n_free_recbufs;
    g3_iblock *blocks; /* qd of them */
    uint8_t *blockbufs;
    unsigned ios;         /* I/Os in flight */
    unsigned unsubmitted; /* SQEs not handed to the kernel yet */

    slot_memo *memo;            /* one per slot */
    uint64_t next_gen;
    bool scanned;               /* the highest generation on disk is known */
    unsigned fail_skip, fail_n; /* fault injection */
    int fail_err;
    bool in_progress, closing;
};

/* ---- little helpers ------------------------------------------------------ */

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* Block checksums take the library's runtime dispatch on x86, which picks
 * AVX2 or AVX-512 where the CPU has them: the inlined code is built for
 * SSE2 only and hashes a cold 2 MiB block at about half the speed. The
 * digest is the same either way. */
static uint64_t data_checksum(const void *p, size_t len)
{
#if defined(__x86_64__) || defined(__i386__)
    return XXH3_64bits_dispatch(p, len);
#else
    return XXH3_64bits(p, len);
#endif
}

static void *aligned(size_t len)
{
    void *p = NULL;
    return posix_memalign(&p, G3_ALIGN, len) == 0 ? p : NULL;
}

static bool direct_ok(const void *p, size_t len)
{
    return ((uintptr_t)p % G3_ALIGN) == 0 && len % G3_ALIGN == 0;
}

/* ---- records ---------------------------------------------------------------- */

static void record_encode(const g3_store *st, uint8_t *r, int state, uint64_t slot, uint64_t gen,
                          const uint8_t *key, uint8_t key_len, uint64_t len, uint64_t sum)
{
    memset(r, 0, G3_RECORD_SIZE);
    put32(r, REC_MAGIC);
    r[4] = (uint8_t)state;
    r[5] = key_len;
    put64(r + 8, slot);
    put64(r + 16, gen);
    put64(r + 24, len);
    put64(r + 32, sum);
    if (key_len) memcpy(r + 40, key, key_len);
    put64(r + REC_SUM_AT, XXH3_64bits_withSeed(r, REC_SUM_AT, st->seed));
}

typedef enum { REC_OK, REC_UNWRITTEN, REC_DAMAGED } rec_check;

/* Verifies a record found at slot's place; *state is REC_FULL or REC_EMPTY
 * when it returns REC_OK. */
static rec_check record_check(const g3_store *st, const uint8_t *r, uint64_t slot, int *state)
{
    if (get32(r) != REC_MAGIC) return all_zero(r, G3_RECORD_SIZE) ? REC_UNWRITTEN : REC_DAMAGED;
    if (get64(r + REC_SUM_AT) != XXH3_64bits_withSeed(r, REC_SUM_AT, st->seed)) return REC_DAMAGED;
    *state = r[4];
    uint8_t key_len = r[5];
    uint64_t len = get64(r + 24);
    if (get64(r + 8) != slot) return REC_DAMAGED;
    if (*state == REC_FULL)
        return key_len >= 1 && key_len <= G3_KEY_MAX && len >= 1 && len <= st->slot_size
                   ? REC_OK
                   : REC_DAMAGED;
    return *state == REC_EMPTY && key_len == 0 && len == 0 ? REC_OK : REC_DAMAGED;
}

/* ---- the superblock ----------------------------------------------------------- */

static void sb_encode(const g3_store *st, uint32_t file, uint8_t *b)
{
    memset(b, 0, G3_SUPERBLOCK_SIZE);
    memcpy(b, SB_MAGIC, 8);
    put32(b + 8, SB_VERSION);
    put32(b + 12, G3_RECORD_SIZE);
    put64(b + 16, st->slot_size);
    put64(b + 24, st->slots_per_file);
    put64(b + 32, st->index_off);
    put64(b + 40, st->data_off);
    put64(b + 48, st->file_size);
    put32(b + 56, file);
    put32(b + 60, st->n_files);
    memcpy(b + 64, st->uuid, UUID_LEN);
    put64(b + SB_SUM_AT, XXH3_64bits(b, SB_SUM_AT));
}

/* Checks an existing file's superblock against this store's layout and
 * takes its uuid. An all-zero one marks a file preallocated but never
 * formatted (a crash or a failed open in between). */
static int sb_check(const g3_store *st, uint32_t i, const uint8_t *b, g3_file *f)
{
    if (all_zero(b, G3_SUPERBLOCK_SIZE)) {
        f->unformatted = true;
        return 0;
    }
    if (memcmp(b, SB_MAGIC, 8) != 0 || get64(b + SB_SUM_AT) != XXH3_64bits(b, SB_SUM_AT))
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s is not a G3 store file or its superblock is damaged", f->path);
    if (get32(b + 8) != SB_VERSION)
        return kvcr_fail(KVCR_EINVAL, "G3 file %s has format version %u (this build reads %u)",
                         f->path, get32(b + 8), SB_VERSION);
    uint64_t slot_size = get64(b + 16);
    uint32_t idx = get32(b + 56), n = get32(b + 60);
    if (get32(b + 12) != G3_RECORD_SIZE || slot_size != st->slot_size ||
        get64(b + 24) != st->slots_per_file || get64(b + 32) != st->index_off ||
        get64(b + 40) != st->data_off || get64(b + 48) != st->file_size || idx != i ||
        n != st->n_files)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s was made for another layout (file %u of %u, slot size %llu) "
                         "than configured (file %u of %u, slot size %llu)",
                         f->path, idx + 1, n, (unsigned long long)slot_size, i + 1, st->n_files,
                         (unsigned long long)st->slot_size);
    memcpy(f->uuid, b + 64, UUID_LEN);
    return 0;
}

/* ---- paths -------------------------------------------------------------------- */

/* mkdir -p of dir (0700: the files hold users' KV data). */
static int make_dirs(const char *dir)
{
    char p[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof p) return kvcr_fail(KVCR_EINVAL, "G3 file path too long: %s", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return kvcr_fail(KVCR_ESYS, "G3 cannot create directory %s: %s", p, strerror(errno));
        p[i] = c;
    }
    return 0;
}

/* realpath of the parent (created if missing) + the name, so that two
 * spellings of one path compare equal. The name itself is not resolved:
 * links there are caught by the inode comparison once open. */
static int resolve_path(const char *path, char *out)
{
    char dir[PATH_MAX], real[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof dir)
        return kvcr_fail(KVCR_EINVAL, "G3 file path must be 1..%d bytes", PATH_MAX - 1);
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (*name == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return kvcr_fail(KVCR_EINVAL, "G3 file path %s does not name a file", path);
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int rc = make_dirs(dir);
    if (rc != 0) return rc;
    if (realpath(dir, real) == NULL)
        return kvcr_fail(KVCR_ESYS, "G3 file path %s: %s", path, strerror(errno));
    size_t rl = strlen(real), nl = strlen(name);
    if (rl + nl + 2 > PATH_MAX) return kvcr_fail(KVCR_EINVAL, "G3 file path too long: %s", path);
    memcpy(out, real, rl);
    if (strcmp(real, "/") != 0) out[rl++] = '/';
    memcpy(out + rl, name, nl + 1);
    return 0;
}

/* ---- opening ------------------------------------------------------------------- */

static int check_options(const g3_store_options *o, long page)
{
    if (o->paths == NULL || o->n_paths == 0)
        return kvcr_fail(KVCR_EINVAL, "G3 requires at least one file path");
    if (o->n_paths > G3_MAX_FILES)
        return kvcr_fail(KVCR_EINVAL, "G3 supports at most %d files", G3_MAX_FILES);
    for (size_t i = 0; i < o->n_paths; i++)
        if (o->paths[i] == NULL || o->paths[i][0] == '\0')
            return kvcr_fail(KVCR_EINVAL, "G3 file path %zu is empty", i);
    if (o->slot_size == 0 || o->slot_size % (uint64_t)page != 0 || o->slot_size % G3_ALIGN != 0)
        return kvcr_fail(KVCR_EINVAL, "G3 slot size must be positive and page aligned");
    if (o->slot_size > G3_MAX_SLOT_SIZE)
        return kvcr_fail(KVCR_EINVAL, "G3 slot size must be at most %llu bytes",
                         (unsigned long long)G3_MAX_SLOT_SIZE);
    if (o->capacity_bytes_per_file == 0 || o->capacity_bytes_per_file % o->slot_size != 0)
        return kvcr_fail(KVCR_EINVAL, "G3 file capacity must contain complete slots");
    /* Keeps every offset (and the slot count of all files) far from overflow. */
    if (o->capacity_bytes_per_file > (1ull << 56))
        return kvcr_fail(KVCR_EINVAL, "G3 file capacity must be at most 2^56 bytes");
    if (o->queue_depth > G3_MAX_QUEUE_DEPTH)
        return kvcr_fail(KVCR_EINVAL, "G3 queue depth must be at most %d", G3_MAX_QUEUE_DEPTH);
    return 0;
}

/* A name for the file system of an f_type, for messages. */
static const char *fs_name(long type)
{
    switch ((unsigned long)type) {
    case TMPFS_MAGIC: return "tmpfs";
    case RAMFS_MAGIC: return "ramfs";
    case EXT4_SUPER_MAGIC: return "ext4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case FUSE_SUPER_MAGIC: return "fuse";
    case V9FS_MAGIC: return "9p";
    case 0x6a656a63: return "virtiofs"; /* not in older linux/magic.h */
    case 0x2fc12fc1: return "zfs";
    case 0xff534d42: return "cifs";
    default: return NULL;
    }
}

static int odirect_refused(const g3_file *f, long type)
{
    const char *name = fs_name(type);
    if (name)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file storage requires O_DIRECT (%s of %s does not support it)", name,
                         f->path);
    return kvcr_fail(KVCR_EINVAL,
                     "G3 file storage requires O_DIRECT (the file system (type 0x%lx) of %s "
                     "does not support it)",
                     (unsigned long)type, f->path);
}

/* Everything here is aligned to G3_ALIGN; a file system that says it needs
 * more (or that it cannot do direct I/O on this file at all) is refused now
 * rather than failing every request. Kernels or file systems that do not
 * report it (before Linux 6.1) are taken at their word by the open. */
static int check_dio_align(const g3_file *f, long type)
{
    struct statx sx;
    if (statx(f->dfd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0 ||
        !(sx.stx_mask & STATX_DIOALIGN))
        return 0;
    if (sx.stx_dio_offset_align == 0) return odirect_refused(f, type);
    if (sx.stx_dio_offset_align > G3_ALIGN || sx.stx_dio_mem_align > G3_ALIGN)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s needs O_DIRECT alignment of %u bytes (G3 aligns to %d)",
                         f->path,
                         sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                                        : sx.stx_dio_mem_align,
                         G3_ALIGN);
    return 0;
}

/* The O_DIRECT descriptor. tmpfs and ramfs are refused by type: tmpfs
 * accepts O_DIRECT since Linux 6.6 but keeps the bytes in the page cache,
 * which would make this tier a second copy of DRAM. */
static int open_direct(g3_file *f)
{
    struct statfs sf;
    if (fstatfs(f->fd, &sf) != 0)
        return kvcr_fail(KVCR_ESYS, "G3 file %s: statfs: %s", f->path, strerror(errno));
    if ((unsigned long)sf.f_type == TMPFS_MAGIC || (unsigned long)sf.f_type == RAMFS_MAGIC)
        return odirect_refused(f, sf.f_type);
    f->dfd = open(f->path, O_RDWR | O_DIRECT | O_CLOEXEC);
    if (f->dfd < 0) {
        if (errno == EINVAL) return odirect_refused(f, sf.f_type);
        return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot open with O_DIRECT: %s", f->path,
                         strerror(errno));
    }
    struct stat a;
    if (fstat(f->dfd, &a) != 0 || a.st_dev != f->dev || a.st_ino != f->ino)
        return kvcr_fail(KVCR_EBUSY, "G3 file %s was replaced while being opened", f->path);
    return check_dio_align(f, sf.f_type);
}

/* An empty file gets its full size now, so that a full disk shows at open
 * and never in the middle of a write. */
static int preallocate(const g3_store *st, g3_file *f)
{
    int err = posix_fallocate(f->fd, 0, (off_t)st->file_size);
    if (err == 0) {
        f->fresh = f->unformatted = true;
        return 0;
    }
    /* Whatever was allocated goes, or the next open sees a file of another size. */
    int t = ftruncate(f->fd, 0);
    (void)t;
    return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot preallocate %llu bytes: %s", f->path,
                     (unsigned long long)st->file_size, strerror(err));
}

static int read_superblock(const g3_store *st, uint32_t i, g3_file *f)
{
    uint8_t *b = aligned(G3_SUPERBLOCK_SIZE);
    if (b == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    ssize_t n = pread(f->dfd, b, G3_SUPERBLOCK_SIZE, 0);
    int rc = n == G3_SUPERBLOCK_SIZE
                 ? sb_check(st, i, b, f)
                 : kvcr_fail(KVCR_ESYS, "G3 file %s: cannot read the superblock: %s", f->path,
                             n < 0 ? strerror(errno) : "short read");
    free(b);
    return rc;
}

/* Opens file i: create, alias check, lock, O_DIRECT, size, superblock. */
static int open_file(g3_store *st, uint32_t i)
{
    g3_file *f = &st->files[i];
    f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    f->created = f->fd >= 0;
    if (f->fd < 0 && errno == EEXIST) f->fd = open(f->path, O_RDWR | O_CLOEXEC);
    if (f->fd < 0)
        return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot open: %s", f->path, strerror(errno));
    struct stat s;
    if (fstat(f->fd, &s) != 0)
        return kvcr_fail(KVCR_ESYS, "G3 file %s: stat: %s", f->path, strerror(errno));
    if (!S_ISREG(s.st_mode))
        return kvcr_fail(KVCR_EINVAL, "G3 file %s is not a regular file", f->path);
    f->dev = s.st_dev;
    f->ino = s.st_ino;
    /* Before the lock: a second descriptor of one file in this process
     * would fail flock and be reported as another process. */
    for (uint32_t j = 0; j < i; j++)
        if (st->files[j].dev == f->dev && st->files[j].ino == f->ino)
            return kvcr_fail(KVCR_EINVAL, "G3 file paths must not alias the same file (%s and %s)",
                             st->files[j].path, f->path);
    if (flock(f->fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return kvcr_fail(KVCR_EBUSY, "G3 file %s is in use by another process (or store)",
                             f->path);
        return kvcr_fail(KVCR_ESYS, "G3 file %s: flock: %s", f->path, strerror(errno));
    }
    if (fchmod(f->fd, 0600) != 0)
        return kvcr_fail(KVCR_ESYS, "G3 file %s: chmod 0600: %s", f->path, strerror(errno));
    int rc = open_direct(f);
    if (rc != 0) return rc;
    if (s.st_size == 0) return preallocate(st, f);
    if ((uint64_t)s.st_size != st->file_size)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s has incompatible size (%lld bytes; these options need %llu)",
                         f->path, (long long)s.st_size, (unsigned long long)st->file_size);
    return read_superblock(st, i, f);
}

/* The store's uuid: the one its existing files agree on, or a new one. */
static int choose_uuid(g3_store *st)
{
    const g3_file *first = NULL;
    for (uint32_t i = 0; i < st->n_files; i++) {
        const g3_file *f = &st->files[i];
        if (f->unformatted) continue;
        if (first == NULL)
            first = f;
        else if (memcmp(first->uuid, f->uuid, UUID_LEN) != 0)
            return kvcr_fail(KVCR_EINVAL, "G3 files %s and %s belong to different stores",
                             first->path, f->path);
    }
    if (first) {
        memcpy(st->uuid, first->uuid, UUID_LEN);
        return 0;
    }
    st->scanned = true; /* nothing on disk: generations start at 1 */
    if (getrandom(st->uuid, UUID_LEN, 0) != UUID_LEN)
        return kvcr_fail(KVCR_ESYS, "G3 getrandom: %s", strerror(errno));
    return 0;
}

/* Writes the superblock of every new file, synced: a file counts as
 * formatted only once its superblock and its allocation are on disk. Its
 * index is all zero (fresh allocation) or holds records of another uuid
 * (which never verify). */
static int format_files(g3_store *st)
{
    uint8_t *b = aligned(G3_SUPERBLOCK_SIZE);
    if (b == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t i = 0; i < st->n_files && rc == 0; i++) {
        g3_file *f = &st->files[i];
        if (!f->unformatted) continue;
        sb_encode(st, i, b);
        if (pwrite(f->dfd, b, G3_SUPERBLOCK_SIZE, 0) != G3_SUPERBLOCK_SIZE ||
            fdatasync(f->dfd) != 0)
            rc = kvcr_fail(KVCR_ESYS, "G3 file %s: cannot write the superblock: %s", f->path,
                           strerror(errno));
        else
            G3_LOG(st, KVCR_LOG_INFO, "G3 file %s formatted (%llu slots)", f->path,
                   (unsigned long long)st->slots_per_file);
    }
    free(b);
    return rc;
}

static int setup_ring(g3_store *st)
{
    int rc = io_uring_queue_init(2 * st->qd, &st->ring, 0);
    if (rc < 0)
        return kvcr_fail(KVCR_ESYS, "G3 needs io_uring: io_uring_queue_init: %s", strerror(-rc));
    st->ring_ok = true;
    st->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (st->efd < 0) return kvcr_fail(KVCR_ESYS, "G3 eventfd: %s", strerror(errno));
    rc = io_uring_register_eventfd(&st->ring, st->efd);
    if (rc < 0) return kvcr_fail(KVCR_ESYS, "G3 io_uring_register_eventfd: %s", strerror(-rc));
    return 0;
}

static int alloc_pools(g3_store *st)
{
    st->active = calloc(2 * (size_t)st->qd, sizeof *st->active);
    st->free_recbufs = calloc(2 * (size_t)st->qd, sizeof *st->free_recbufs);
    st->blocks = calloc(st->qd, sizeof *st->blocks);
    st->recbufs = aligned(2 * (size_t)st->qd * G3_ALIGN);
    st->blockbufs = aligned((size_t)st->qd * G3_ALIGN);
    st->memo = calloc(st->n_slots, sizeof *st->memo);
    if (!st->active || !st->free_recbufs || !st->blocks || !st->recbufs || !st->blockbufs ||
        !st->memo)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (unsigned i = 0; i < st->qd; i++) st->blocks[i].buf = st->blockbufs + (size_t)i * G3_ALIGN;
    for (unsigned i = 0; i < 2 * st->qd; i++) st->free_recbufs[i] = (int)i;
    st->n_free_recbufs = 2 * st->qd;
    return 0;
}

static void free_store(g3_store *st, bool failed)
{
    if (st->ring_ok) io_uring_queue_exit(&st->ring);
    if (st->efd >= 0) close(st->efd);
    for (uint32_t i = 0; st->files && i < st->n_files; i++) {
        g3_file *f = &st->files[i];
        /* A failed open leaves no file it created and no preallocated
         * space behind (we hold the lock, so nobody else uses either). */
        if (failed && f->created && f->fd >= 0) {
            struct stat now;
            if (lstat(f->path, &now) == 0 && now.st_dev == f->dev && now.st_ino == f->ino)
                unlink(f->path);
        } else if (failed && f->fresh && f->fd >= 0) {
            int t = ftruncate(f->fd, 0);
            (void)t;
        }
        if (f->dfd >= 0) close(f->dfd);
        if (f->fd >= 0) close(f->fd);
    }
    free(st->files);
    free(st->memo);
    free(st->active);
    free(st->free_recbufs);
    free(st->blocks);
    free(st->recbufs);
    free(st->blockbufs);
    free(st);
}

static void set_geometry(g3_store *st, const g3_store_options *o)
{
    st->slot_size = o->slot_size;
    st->slots_per_file = o->capacity_bytes_per_file / o->slot_size;
    st->n_slots = st->slots_per_file * st->n_files;
    st->index_off = G3_SUPERBLOCK_SIZE;
    st->index_bytes = round_up(st->slots_per_file * G3_RECORD_SIZE, G3_ALIGN);
    st->data_off = st->index_off + st->index_bytes;
    st->file_size = st->data_off + o->capacity_bytes_per_file;
    st->qd = o->queue_depth ? o->queue_depth : G3_DEFAULT_QUEUE_DEPTH;
    st->next_gen = 1;
}

/* Resolves every path and refuses duplicates, before anything is opened. */
static int resolve_paths(g3_store *st, const g3_store_options *o)
{
    for (uint32_t i = 0; i < st->n_files; i++) {
        int rc = resolve_path(o->paths[i], st->files[i].path);
        if (rc != 0) return rc;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(st->files[j].path, st->files[i].path) == 0)
                return kvcr_fail(KVCR_EINVAL, "G3 file paths must be unique (%s)",
                                 st->files[i].path);
    }
    return 0;
}

static int open_all(g3_store *st, const g3_store_options *o)
{
    int rc = resolve_paths(st, o);
    for (uint32_t i = 0; i < st->n_files && rc == 0; i++) rc = open_file(st, i);
    if (rc == 0) rc = choose_uuid(st);
    if (rc == 0) {
        st->seed = XXH3_64bits(st->uuid, UUID_LEN);
        rc = format_files(st);
    }
    if (rc == 0) rc = alloc_pools(st);
    if (rc == 0) rc = setup_ring(st);
    return rc;
}

int g3_store_open(const g3_store_options *o, g3_store **out)
{
    if (out == NULL || o == NULL) return kvcr_fail(KVCR_EINVAL, "g3_store_open: NULL argument");
    *out = NULL;
    long page = sysconf(_SC_PAGESIZE);
    int rc = check_options(o, page > 0 ? page : 4096);
    if (rc != 0) return rc;
    g3_store *st = calloc(1, sizeof *st);
    if (st == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    st->efd = -1;
    st->log = o->log;
    st->n_files = (uint32_t)o->n_paths;
    st->files = calloc(st->n_files, sizeof *st->files);
    if (st->files == NULL) {
        free(st);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < st->n_files; i++) st->files[i].fd = st->files[i].dfd = -1;
    set_geometry(st, o);
    rc = open_all(st, o);
    if (rc != 0) {
        free_store(st, true);
        return rc;
    }
    if (st->scanned) /* new files: every slot is known to be empty */
        for (uint64_t i = 0; i < st->n_slots; i++) st->memo[i].state = MEMO_EMPTY;
    G3_LOG(st, KVCR_LOG_INFO, "G3 store open: %u files, %llu slots of %llu bytes, queue depth %u",
           st->n_files, (unsigned long long)st->n_slots, (unsigned long long)st->slot_size, st->qd);
    *out = st;
    return 0;
}

/* ---- submitting I/O ------------------------------------------------------------ */

/* Wakes whoever polls the eventfd: work is waiting that no completion
 * will announce (a request failed before its I/O, an SQE not submitted). */
static void poke(g3_store *st)
{
    /* A full counter still leaves the fd readable, which is all we need. */
    int rc = eventfd_write(st->efd, 1);
    (void)rc;
}

static void flush(g3_store *st)
{
    if (st->unsubmitted == 0) return;
    int rc = io_uring_submit(&st->ring);
    if (rc >= 0)
        st->unsubmitted = (unsigned)rc >= st->unsubmitted ? 0 : st->unsubmitted - (unsigned)rc;
    if (st->unsubmitted == 0) return;
    /* What the kernel did not take stays in the ring; the next
     * g3_store_progress tries again. */
    G3_LOG(st, KVCR_LOG_WARN, "G3 io_uring_submit: %s, %u requests not submitted (retrying)",
           rc < 0 ? strerror(-rc) : "partial", st->unsubmitted);
    poke(st);
}

static int queue_io(g3_store *st, bool write, int fd, void *buf, size_t len, uint64_t off,
                    void *owner, unsigned tag)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);
    if (sqe == NULL) { /* cannot happen with the ring sized 2 * qd; never block on it */
        io_uring_submit(&st->ring);
        sqe = io_uring_get_sqe(&st->ring);
        if (sqe == NULL) return -EBUSY;
    }
    if (write) {
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    } else {
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
        VALGRIND_MAKE_MEM_DEFINED(buf, len);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)owner | tag);
    st->unsubmitted++;
    st->ios++;
    return 0;
}

static uint64_t block_offset(const g3_store *st, uint64_t block)
{
    return st->index_off + block * G3_ALIGN;
}

static uint8_t *record_in_block(uint8_t *block, uint64_t fslot)
{
    return block + (fslot % RECS_PER_BLOCK) * G3_RECORD_SIZE;
}

/* ---- finishing requests ----------------------------------------------------------- */

static void remember(g3_store *st, const g3_req *r)
{
    slot_memo *m = &st->memo[r->slot];
    if (r->op == OP_READ) return;
    if (r->result != 0)
        m->state = MEMO_UNKNOWN; /* what is on disk now is anyone's guess */
    else if (r->op == OP_CLEAR)
        m->state = MEMO_EMPTY;
    else
        *m = (slot_memo){r->sum, XXH3_64bits(r->key, r->key_len), r->len, MEMO_FULL};
}

static void finish(g3_store *st, g3_req *r)
{
    remember(st, r);
    unsigned at = r->active_at;
    st->active[at] = st->active[--st->n_active];
    st->active[at]->active_at = at;
    if (r->recbuf >= 0) st->free_recbufs[st->n_free_recbufs++] = r->recbuf;
    r->recbuf = -1;
    if (r->op == OP_READ && r->result == 0 && r->bounce) memcpy(r->dst, r->bounce, r->len);
    free(r->bounce);
    r->bounce = NULL;
    r->next = NULL;
    if (st->done_tail)
        st->done_tail->next = r;
    else
        st->done = r;
    st->done_tail = r;
    st->n_done++;
}

/* Ends r with err (0: success) once its own I/Os and its record update are
 * back. */
static void settle(g3_store *st, g3_req *r, int err)
{
    if (r->result == 0) r->result = err;
    if (r->ios == 0 && !r->rec_pending) finish(st, r);
}

/* r's record update ended (written, or failed with err). */
static void record_settle(g3_store *st, g3_req *r, int err)
{
    r->rec_pending = false;
    settle(st, r, err);
}

/* ---- index blocks (read-modify-write) --------------------------------------------- */

static void block_release(g3_iblock *b)
{
    b->used = false;
    b->pending = b->pending_tail = b->inflight = NULL;
}

static void settle_list(g3_store *st, g3_req *list, int err)
{
    for (g3_req *r = list, *next; r; r = next) {
        next = r->ib_next;
        record_settle(st, r, err);
    }
}

static void block_read(g3_store *st, g3_iblock *b)
{
    b->writing = false;
    int rc = queue_io(st, false, st->files[b->file].dfd, b->buf, G3_ALIGN,
                      block_offset(st, b->block), b, TAG_BLOCK);
    if (rc == 0) return;
    settle_list(st, b->pending, rc);
    block_release(b);
    poke(st);
}

/* Copies the waiting records in and writes the block. The buffer is only
 * touched here, when no I/O of it is in flight. */
static void block_write(g3_store *st, g3_iblock *b)
{
    for (g3_req *r = b->pending; r; r = r->ib_next)
        memcpy(record_in_block(b->buf, r->fslot), r->record, G3_RECORD_SIZE);
    b->inflight = b->pending;
    b->pending = b->pending_tail = NULL;
    b->writing = true;
    int rc = queue_io(st, true, st->files[b->file].dfd, b->buf, G3_ALIGN,
                      block_offset(st, b->block), b, TAG_BLOCK);
    if (rc == 0) return;
    settle_list(st, b->inflight, rc);
    block_release(b);
    poke(st);
}

/* Hands r's record to its index block, reading the block first unless an
 * update of it is already in flight. */
static void block_join(g3_store *st, g3_req *r)
{
    uint64_t block = r->fslot / RECS_PER_BLOCK;
    g3_iblock *b = NULL, *free_b = NULL;
    for (unsigned i = 0; i < st->qd && b == NULL; i++) {
        g3_iblock *c = &st->blocks[i];
        if (c->used && c->file == r->file && c->block == block) b = c;
        if (!c->used && free_b == NULL) free_b = c;
    }
    r->ib_next = NULL;
    r->rec_pending = true;
    if (b) {
        if (b->pending_tail)
            b->pending_tail->ib_next = r;
        else
            b->pending = r;
        b->pending_tail = r;
        return;
    }
    if (free_b == NULL) { /* the pool holds qd blocks, one per active request at most */
        record_settle(st, r, -EBUSY);
        poke(st);
        return;
    }
    b = free_b;
    b->used = true;
    b->file = r->file;
    b->block = block;
    b->pending = b->pending_tail = r;
    block_read(st, b);
}

static void block_done(g3_store *st, g3_iblock *b, int res)
{
    int err = res == G3_ALIGN ? 0 : res < 0 ? res : -EIO;
    if (!b->writing) {
        if (err == 0) {
            block_write(st, b);
        } else {
            settle_list(st, b->pending, err);
            block_release(b);
        }
        return;
    }
    g3_req *written = b->inflight;
    b->inflight = NULL;
    settle_list(st, written, err);
    if (b->pending == NULL)
        block_release(b);
    else if (err != 0)
        block_read(st, b); /* after a failed write the block on disk is unknown */
    else
        block_write(st, b);
}

/* ---- requests ------------------------------------------------------------------------ */

/* The data goes to the kernel first; its checksum is computed while the
 * disk writes it, then the record that carries it goes out alongside. The
 * record may land before the data: a crash in between leaves a record
 * whose data checksum fails, which a read reports as G3_CORRUPT, so the
 * record need not wait (waiting cost two serial 4 KiB I/Os per write). */
static int start_write(g3_store *st, g3_req *r)
{
    const uint8_t *buf = r->src;
    size_t n = round_up(r->len, G3_ALIGN);
    if (!direct_ok(r->src, r->len)) {
        r->bounce = aligned(n);
        if (r->bounce == NULL) return -ENOMEM;
        memcpy(r->bounce, r->src, r->len);
        memset(r->bounce + r->len, 0, n - r->len);
        buf = r->bounce;
    }
    uint64_t off = st->data_off + r->fslot * st->slot_size;
    int rc = queue_io(st, true, st->files[r->file].dfd, (void *)buf, n, off, r, TAG_DATA);
    if (rc != 0) return rc;
    r->ios++;
    flush(st);
    r->sum = data_checksum(r->src, r->len);
    record_encode(st, r->record, REC_FULL, r->slot, r->gen, r->key, r->key_len, r->len, r->sum);
    block_join(st, r);
    return 0;
}

static int refuse_read(g3_store *st, const g3_req *r, const char *why)
{
    G3_LOG(st, KVCR_LOG_WARN, "G3 slot %llu (%s): %s", (unsigned long long)r->slot,
           st->files[r->file].path, why);
    return G3_CORRUPT;
}

/* A known slot is checked against its memo and only its data is read; an
 * unknown one reads its record block and its data together. */
static int start_read(g3_store *st, g3_req *r)
{
    const slot_memo *m = &st->memo[r->slot];
    if (m->state == MEMO_EMPTY) return refuse_read(st, r, "empty slot");
    if (m->state == MEMO_FULL && m->key_hash != XXH3_64bits(r->key, r->key_len))
        return refuse_read(st, r, "another key");
    if (m->state == MEMO_FULL && m->len != r->len)
        return refuse_read(st, r, "another data length");
    size_t n = round_up(r->len, G3_ALIGN);
    uint8_t *buf = r->dst;
    if (!direct_ok(r->dst, r->len)) {
        r->bounce = aligned(n);
        if (r->bounce == NULL) return -ENOMEM;
        buf = r->bounce;
    }
    int fd = st->files[r->file].dfd;
    if (m->state == MEMO_FULL) {
        r->sum = m->sum;
        int rc = queue_io(st, false, fd, buf, n, st->data_off + r->fslot * st->slot_size, r,
                          TAG_DATA);
        if (rc == 0) r->ios++;
        return rc;
    }
    r->recbuf = st->free_recbufs[--st->n_free_recbufs];
    uint8_t *rb = st->recbufs + (size_t)r->recbuf * G3_ALIGN;
    int rc = queue_io(st, false, fd, rb, G3_ALIGN, block_offset(st, r->fslot / RECS_PER_BLOCK), r,
                      TAG_RECORD);
    if (rc != 0) return rc;
    r->ios++;
    rc = queue_io(st, false, fd, buf, n, st->data_off + r->fslot * st->slot_size, r, TAG_DATA);
    if (rc == 0) r->ios++;
    return rc;
}

static void activate(g3_store *st, g3_req *r)
{
    r->active_at = st->n_active;
    st->active[st->n_active++] = r;
    if (r->op != OP_READ) st->memo[r->slot].state = MEMO_UNKNOWN; /* until it is back */
    int rc = 0;
    switch (r->op) {
    case OP_WRITE: rc = start_write(st, r); break;
    case OP_READ: rc = start_read(st, r); break;
    case OP_CLEAR:
        record_encode(st, r->record, REC_EMPTY, r->slot, r->gen, NULL, 0, 0, 0);
        block_join(st, r);
        break;
    }
    if (rc != 0) {
        settle(st, r, rc);
        poke(st); /* its callback runs in the next progress */
    }
}

static bool slot_busy(const g3_store *st, uint64_t slot)
{
    for (unsigned i = 0; i < st->n_active; i++)
        if (st->active[i]->slot == slot) return true;
    return false;
}

/* Starts queued requests while there is room, in order; the head waits
 * while a request for its slot is in flight (or being verified). */
static void pump(g3_store *st)
{
    while (st->fifo && st->n_active - st->n_verifying < st->qd && st->n_active < 2 * st->qd &&
           !slot_busy(st, st->fifo->slot)) {
        g3_req *r = st->fifo;
        st->fifo = r->next;
        if (st->fifo == NULL) st->fifo_tail = NULL;
        st->n_fifo--;
        activate(st, r);
    }
}

static int new_request(g3_store *st, g3_op op, uint64_t slot, g3_done_fn cb, void *ud, g3_req **out)
{
    if (st == NULL) return kvcr_fail(KVCR_EINVAL, "G3 store is NULL");
    if (st->closing) return kvcr_fail(KVCR_ECLOSED, "G3 store is closing");
    if (slot >= st->n_slots)
        return kvcr_fail(KVCR_EINVAL, "G3 slot %llu out of range (%llu slots)",
                         (unsigned long long)slot, (unsigned long long)st->n_slots);
    if (cb == NULL) return kvcr_fail(KVCR_EINVAL, "G3 request callback is NULL");
    if (op != OP_READ && !st->scanned)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 store over existing files must be scanned before its first write");
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    r->op = op;
    r->slot = slot;
    r->file = (uint32_t)(slot % st->n_files);
    r->fslot = slot / st->n_files;
    r->cb = cb;
    r->ud = ud;
    r->recbuf = -1;
    *out = r;
    return 0;
}

static int check_key(const void *key, size_t key_len)
{
    if (key == NULL || key_len == 0 || key_len > G3_KEY_MAX)
        return kvcr_fail(KVCR_EINVAL, "G3 key must be 1..%d bytes (longer keys are not spillable)",
                         G3_KEY_MAX);
    return 0;
}

static int check_data(const g3_store *st, const void *p, size_t len)
{
    if (p == NULL || len == 0 || len > st->slot_size)
        return kvcr_fail(KVCR_EINVAL, "G3 data must be 1..%llu bytes (the slot size)",
                         (unsigned long long)st->slot_size);
    return 0;
}

static void enqueue(g3_store *st, g3_req *r)
{
    r->next = NULL;
    if (st->fifo_tail)
        st->fifo_tail->next = r;
    else
        st->fifo = r;
    st->fifo_tail = r;
    st->n_fifo++;
    pump(st);
    flush(st);
}

int g3_store_write(g3_store *st, uint64_t slot, const void *key, size_t key_len, const void *data,
                   size_t len, g3_done_fn cb, void *ud, uint64_t *generation)
{
    int rc = check_key(key, key_len);
    if (rc == 0 && st) rc = check_data(st, data, len);
    g3_req *r = NULL;
    if (rc == 0) rc = new_request(st, OP_WRITE, slot, cb, ud, &r);
    if (rc != 0) return rc;
    memcpy(r->key, key, key_len);
    r->key_len = (uint8_t)key_len;
    r->src = data;
    r->len = len;
    r->gen = st->next_gen++;
    if (generation) *generation = r->gen;
    enqueue(st, r);
    return 0;
}

int g3_store_read(g3_store *st, uint64_t slot, const void *key, size_t key_len, void *buf,
                  size_t len, g3_done_fn cb, void *ud)
{
    int rc = check_key(key, key_len);
    if (rc == 0 && st) rc = check_data(st, buf, len);
    g3_req *r = NULL;
    if (rc == 0) rc = new_request(st, OP_READ, slot, cb, ud, &r);
    if (rc != 0) return rc;
    memcpy(r->key, key, key_len);
    r->key_len = (uint8_t)key_len;
    r->dst = buf;
    r->len = len;
    enqueue(st, r);
    return 0;
}

int g3_store_clear(g3_store *st, uint64_t slot, g3_done_fn cb, void *ud)
{
    g3_req *r = NULL;
    int rc = new_request(st, OP_CLEAR, slot, cb, ud, &r);
    if (rc != 0) return rc;
    r->gen = st->next_gen++;
    enqueue(st, r);
    return 0;
}

/* ---- completions ----------------------------------------------------------------- */

/* A read whose I/Os all succeeded: the record must be a verified FULL one
 * for this slot, key and length, and the data must match its checksum. */
static void read_verify(g3_store *st, g3_req *r)
{
    const uint8_t *data = r->bounce ? r->bounce : r->dst;
    if (r->recbuf < 0) { /* a known slot: its key and length were checked at the start */
        if (data_checksum(data, r->len) != r->sum) {
            r->result = G3_CORRUPT;
            refuse_read(st, r, "data checksum mismatch");
        }
        return;
    }
    const uint8_t *rec = record_in_block(st->recbufs + (size_t)r->recbuf * G3_ALIGN, r->fslot);
    int state = 0;
    const char *why = NULL;
    if (record_check(st, rec, r->slot, &state) != REC_OK)
        why = "no valid record";
    else if (state != REC_FULL)
        why = "empty slot";
    else if (rec[5] != r->key_len || memcmp(rec + 40, r->key, r->key_len) != 0)
        why = "another key";
    else if (get64(rec + 24) != r->len)
        why = "another data length";
    else if (get64(rec + 32) != data_checksum(data, r->len))
        why = "data checksum mismatch";
    if (why == NULL) return;
    r->result = G3_CORRUPT;
    refuse_read(st, r, why);
}

static void request_io_done(g3_store *st, g3_req *r, unsigned tag, int res)
{
    size_t want = tag == TAG_RECORD ? G3_ALIGN : round_up(r->len, G3_ALIGN);
    int err = res >= 0 && (size_t)res == want ? 0 : res < 0 ? res : -EIO;
    r->ios--;
    if (err != 0 && r->result == 0) r->result = err;
    if (r->ios > 0) return;
    if (r->op == OP_READ && r->result == 0) {
        /* Verified after the next requests are started (g3_store_progress):
         * hashing a large block here would leave the disk idle meanwhile. */
        r->next = NULL;
        if (st->verify_tail)
            st->verify_tail->next = r;
        else
            st->verify = r;
        st->verify_tail = r;
        st->n_verifying++;
        return;
    }
    settle(st, r, 0);
}

static void verify_reads(g3_store *st)
{
    g3_req *list = st->verify;
    st->verify = st->verify_tail = NULL;
    for (g3_req *r = list, *next; r; r = next) {
        next = r->next;
        st->n_verifying--;
        read_verify(st, r);
        finish(st, r);
    }
}

static void complete(g3_store *st, uint64_t data, int res)
{
    if (st->fail_skip > 0) {
        st->fail_skip--;
    } else if (st->fail_n > 0) {
        st->fail_n--;
        res = -st->fail_err;
    }
    st->ios--;
    unsigned tag = (unsigned)(data & TAG_MASK);
    void *owner = (void *)(uintptr_t)(data & ~(uint64_t)TAG_MASK);
    if (tag == TAG_BLOCK)
        block_done(st, owner, res);
    else
        request_io_done(st, owner, tag, res);
}

/* Takes every completion waiting in the CQ. */
static void reap(g3_store *st)
{
    struct io_uring_cqe *cqe;
    /* Bounded: each I/O in flight completes once. */
    for (unsigned n = st->ios; n > 0 && io_uring_peek_cqe(&st->ring, &cqe) == 0; n--) {
        uint64_t data = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&st->ring, cqe);
        complete(st, data, res);
    }
}

static unsigned run_callbacks(g3_store *st)
{
    g3_req *list = st->done;
    st->done = st->done_tail = NULL;
    unsigned n = 0;
    for (g3_req *r = list, *next; r; r = next, n++) {
        next = r->next;
        st->n_done--;
        r->cb(r->ud, r->result);
        free(r);
    }
    return n;
}

unsigned g3_store_progress(g3_store *st)
{
    if (st == NULL || st->in_progress) return 0;
    st->in_progress = true;
    eventfd_t v;
    /* Drained before reaping: a completion posted after this wakes the fd again. */
    int rc = eventfd_read(st->efd, &v);
    (void)rc;
    reap(st);
    pump(st);
    flush(st);
    if (st->verify) {
        verify_reads(st);
        pump(st); /* their places are free now */
        flush(st);
    }
    unsigned n = run_callbacks(st);
    st->in_progress = false;
    return n;
}

/* ---- close -------------------------------------------------------------------------- */

/* Waits (bounded) for every request in flight: freeing memory the kernel
 * may still write into is not an option. */
static bool drain(g3_store *st)
{
    for (int i = 0; i < CLOSE_WAIT_TICKS && st->n_active > 0; i++) {
        flush(st);
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {0, 100 * 1000 * 1000};
        if (st->ios > 0) io_uring_wait_cqe_timeout(&st->ring, &cqe, &ts);
        reap(st);
        verify_reads(st);
        run_callbacks(st);
    }
    return st->n_active == 0;
}

void g3_store_close(g3_store *st)
{
    if (st == NULL) return;
    st->closing = true; /* callbacks from here on cannot submit */
    st->in_progress = true;
    run_callbacks(st); /* finished before the queued ones: callbacks stay in order */
    for (g3_req *r = st->fifo, *next; r; r = next) {
        next = r->next;
        r->cb(r->ud, -ECANCELED);
        free(r);
    }
    st->fifo = st->fifo_tail = NULL;
    st->n_fifo = 0;
    if (!drain(st)) {
        /* The files stay locked too: the kernel may still write to them. */
        G3_LOG(st, KVCR_LOG_ERROR,
               "G3 close: %u requests still in the kernel after %d s; "
               "leaking their memory and files",
               st->n_active, CLOSE_WAIT_TICKS / 10);
        return;
    }
    free_store(st, false);
}

/* ---- scan ------------------------------------------------------------------------------ */

typedef struct scan_ctx {
    void (*cb)(void *ud, const g3_slot_info *info);
    void *ud;
    g3_scan_stats stats;
    uint64_t max_gen;
} scan_ctx;

static void scan_record(g3_store *st, scan_ctx *c, const uint8_t *rec, uint64_t slot)
{
    int state = 0;
    c->stats.slots++;
    st->memo[slot].state = MEMO_EMPTY; /* unless it verifies as FULL below */
    switch (record_check(st, rec, slot, &state)) {
    case REC_UNWRITTEN: c->stats.unwritten++; return;
    case REC_DAMAGED: c->stats.damaged++; return;
    case REC_OK: break;
    }
    uint64_t gen = get64(rec + 16);
    if (gen > c->max_gen) c->max_gen = gen;
    if (state == REC_EMPTY) {
        c->stats.empty++;
        return;
    }
    c->stats.full++;
    st->memo[slot] = (slot_memo){get64(rec + 32), XXH3_64bits(rec + 40, rec[5]), get64(rec + 24),
                                 MEMO_FULL};
    if (c->cb == NULL) return;
    g3_slot_info info = {slot, rec + 40, rec[5], gen, get64(rec + 24)};
    c->cb(c->ud, &info);
}

static int read_full(const g3_file *f, uint8_t *buf, size_t n, uint64_t off)
{
    for (size_t got = 0, tries = 0; got < n; tries++) {
        ssize_t k = pread(f->dfd, buf + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR && tries < 16) continue;
        if (k <= 0)
            return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot read the index: %s", f->path,
                             k < 0 ? strerror(errno) : "unexpected end of file");
        got += (size_t)k;
    }
    return 0;
}

static int scan_file(g3_store *st, scan_ctx *c, uint32_t i, uint8_t *buf)
{
    for (uint64_t off = 0; off < st->index_bytes; off += SCAN_CHUNK) {
        size_t n =
            (size_t)(st->index_bytes - off < SCAN_CHUNK ? st->index_bytes - off : SCAN_CHUNK);
        int rc = read_full(&st->files[i], buf, n, st->index_off + off);
        if (rc != 0) return rc;
        c->stats.index_bytes += n;
        uint64_t first = off / G3_RECORD_SIZE;
        for (size_t k = 0; k < n / G3_RECORD_SIZE && first + k < st->slots_per_file; k++)
            scan_record(st, c, buf + k * G3_RECORD_SIZE, (first + k) * st->n_files + i);
    }
    return 0;
}

int g3_store_scan(g3_store *st, void (*cb)(void *ud, const g3_slot_info *info), void *ud,
                  g3_scan_stats *stats)
{
    if (st == NULL) return kvcr_fail(KVCR_EINVAL, "G3 store is NULL");
    if (st->in_progress || st->n_active || st->n_fifo || st->n_done)
        return kvcr_fail(KVCR_EBUSY, "G3 scan needs an idle store");
    uint8_t *buf = aligned(SCAN_CHUNK);
    if (buf == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    scan_ctx c = {cb, ud, {0}, 0};
    st->in_progress = true; /* callbacks must not re-enter */
    int rc = 0;
    for (uint32_t i = 0; i < st->n_files && rc == 0; i++) rc = scan_file(st, &c, i, buf);
    st->in_progress = false;
    free(buf);
    if (rc != 0) return rc;
    if (c.max_gen >= st->next_gen) st->next_gen = c.max_gen + 1;
    st->scanned = true;
    if (stats) *stats = c.stats;
    return 0;
}

/* ---- small accessors ------------------------------------------------------------------ */

int g3_store_fd(const g3_store *st)
{
    return st->efd;
}

size_t g3_store_pending(const g3_store *st)
{
    return st->n_active + st->n_fifo + st->n_done;
}

uint64_t g3_store_slots(const g3_store *st)
{
    return st->n_slots;
}

uint64_t g3_store_slot_size(const g3_store *st)
{
    return st->slot_size;
}

int g3_store_locate(const g3_store *st, uint64_t slot, g3_location *loc)
{
    if (slot >= st->n_slots)
        return kvcr_fail(KVCR_EINVAL, "G3 slot %llu out of range (%llu slots)",
                         (unsigned long long)slot, (unsigned long long)st->n_slots);
    uint64_t fslot = slot / st->n_files;
    loc->file = (uint32_t)(slot % st->n_files);
    loc->path = st->files[loc->file].path;
    loc->record_offset = st->index_off + fslot * G3_RECORD_SIZE;
    loc->data_offset = st->data_off + fslot * st->slot_size;
    return 0;
}

void g3_store_fail_after(g3_store *st, unsigned skip, unsigned n, int err)
{
    st->fail_skip = skip;
    st->fail_n = n;
    st->fail_err = err < 0 ? -err : err;
}

void g3_store_fail_next(g3_store *st, unsigned n, int err)
{
    g3_store_fail_after(st, 0, n, err);
}
