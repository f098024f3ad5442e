/* Opening a G3 slot store (g3_store.h): the options, the paths (resolved,
 * parents created), every file opened, locked, probed for O_DIRECT and
 * checked or formatted, then the engine started (g3_uring.c); and the
 * store's geometry for tests and tools. A failed open undoes all of it.
 *
 * Threads: called by the one thread using the store; no locks (the files'
 * flock keeps other processes and stores out). */
#define _GNU_SOURCE /* O_DIRECT, statx */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "tiers/g3_store_int.h"

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

/* Appends component c (not "", ".", "..") of a path to out, resolved:
 * followed to its real path when it exists, as it is spelled when not. */
static int resolve_step(char *out, const char *c, size_t len, const char *path)
{
    size_t n = strlen(out);
    if (n + 1 + len >= PATH_MAX) return kvcr_fail(KVCR_EINVAL, "G3 file path too long: %s", path);
    snprintf(out + n, PATH_MAX - n, "/%.*s", (int)len, c);
    char real[PATH_MAX];
    struct stat s;
    if (lstat(out, &s) == 0 && realpath(out, real) != NULL)
        snprintf(out, PATH_MAX, "%s", strcmp(real, "/") == 0 ? "" : real);
    return 0;
}

/* The G3 path rule's resolution, which touches nothing on disk: the real
 * path of every component that exists (symbolic links followed), the
 * rest as spelled ("." dropped, ".." the parent), relative paths from the
 * working directory. So "sub/../a", "./a" and a link to a are one file. */
static int resolve_spelled(const char *path, char out[PATH_MAX])
{
    out[0] = '\0';
    if (path[0] != '/') {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            return kvcr_fail(KVCR_ESYS, "G3 file path %s: getcwd: %s", path, strerror(errno));
        snprintf(out, PATH_MAX, "%s", strcmp(cwd, "/") == 0 ? "" : cwd);
    }
    for (const char *c = path; *c != '\0';) {
        size_t len = strcspn(c, "/");
        int rc = 0;
        if (len == 2 && c[0] == '.' && c[1] == '.') {
            char *slash = strrchr(out, '/');
            if (slash != NULL) *slash = '\0';
        } else if (len > 0 && !(len == 1 && c[0] == '.')) {
            rc = resolve_step(out, c, len, path);
        }
        if (rc != 0) return rc;
        c += len + (c[len] == '/');
    }
    if (out[0] == '\0') snprintf(out, PATH_MAX, "/");
    return 0;
}

int g3_paths_check(const char *const *paths, size_t n)
{
    if (paths == NULL || n == 0) return kvcr_fail(KVCR_EINVAL, "G3 requires at least one file path");
    if (n > G3_MAX_FILES) return kvcr_fail(KVCR_EINVAL, "G3 supports at most %d files", G3_MAX_FILES);
    for (size_t i = 0; i < n; i++) {
        if (paths[i] == NULL || paths[i][0] == '\0')
            return kvcr_fail(KVCR_EINVAL, "G3 file path %zu must be a non-empty string", i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(paths[i], paths[j]) == 0)
                return kvcr_fail(KVCR_EINVAL, "G3 file paths must be unique");
    }
    char (*real)[PATH_MAX] = malloc(n * sizeof *real);
    if (real == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = resolve_spelled(paths[i], real[i]);
        for (size_t j = 0; j < i && rc == 0; j++)
            if (strcmp(real[i], real[j]) == 0)
                rc = kvcr_fail(KVCR_EINVAL, "G3 file paths must not alias the same file");
    }
    free(real);
    return rc;
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
    int err = posix_fallocate(f->fd, 0, (off_t)st->lay.file_size);
    if (err == 0) {
        f->fresh = f->unformatted = true;
        return 0;
    }
    /* Whatever was allocated goes, or the next open sees a file of another size. */
    int t = ftruncate(f->fd, 0);
    (void)t;
    return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot preallocate %llu bytes: %s", f->path,
                     (unsigned long long)st->lay.file_size, strerror(err));
}

static int read_superblock(const g3_store *st, uint32_t i, g3_file *f)
{
    uint8_t *b = g3_aligned_alloc(G3_SUPERBLOCK_SIZE);
    if (b == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    ssize_t n = pread(f->dfd, b, G3_SUPERBLOCK_SIZE, 0);
    int rc = n == G3_SUPERBLOCK_SIZE
                 ? g3_sb_check(&st->lay, i, b, f->path, f->uuid)
                 : kvcr_fail(KVCR_ESYS, "G3 file %s: cannot read the superblock: %s", f->path,
                             n < 0 ? strerror(errno) : "short read");
    free(b);
    if (rc == 1) { /* all zero: preallocated, never formatted */
        f->unformatted = true;
        rc = 0;
    }
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
    if ((uint64_t)s.st_size != st->lay.file_size)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s has incompatible size (%lld bytes; these options need %llu)",
                         f->path, (long long)s.st_size, (unsigned long long)st->lay.file_size);
    return read_superblock(st, i, f);
}

/* The store's uuid: the one its existing files agree on, or a new one. */
static int choose_uuid(g3_store *st)
{
    const g3_file *first = NULL;
    for (uint32_t i = 0; i < st->lay.n_files; i++) {
        const g3_file *f = &st->files[i];
        if (f->unformatted) continue;
        if (first == NULL)
            first = f;
        else if (memcmp(first->uuid, f->uuid, G3_UUID_LEN) != 0)
            return kvcr_fail(KVCR_EINVAL, "G3 files %s and %s belong to different stores",
                             first->path, f->path);
    }
    if (first) {
        memcpy(st->uuid, first->uuid, G3_UUID_LEN);
        return 0;
    }
    st->scanned = true; /* nothing on disk: generations start at 1 */
    if (getrandom(st->uuid, G3_UUID_LEN, 0) != G3_UUID_LEN)
        return kvcr_fail(KVCR_ESYS, "G3 getrandom: %s", strerror(errno));
    return 0;
}

/* Writes the superblock of every new file, synced: a file counts as
 * formatted only once its superblock and its allocation are on disk. Its
 * index is all zero (fresh allocation) or holds records of another uuid
 * (which never verify). */
static int format_files(g3_store *st)
{
    uint8_t *b = g3_aligned_alloc(G3_SUPERBLOCK_SIZE);
    if (b == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    int rc = 0;
    for (uint32_t i = 0; i < st->lay.n_files && rc == 0; i++) {
        g3_file *f = &st->files[i];
        if (!f->unformatted) continue;
        g3_sb_encode(&st->lay, i, st->uuid, b);
        if (pwrite(f->dfd, b, G3_SUPERBLOCK_SIZE, 0) != G3_SUPERBLOCK_SIZE ||
            fdatasync(f->dfd) != 0)
            rc = kvcr_fail(KVCR_ESYS, "G3 file %s: cannot write the superblock: %s", f->path,
                           strerror(errno));
        else
            G3_LOG(st, KVCR_LOG_INFO, "G3 file %s formatted (%llu slots)", f->path,
                   (unsigned long long)st->lay.slots_per_file);
    }
    free(b);
    return rc;
}

void g3_store_free(g3_store *st, bool failed)
{
    g3_engine_free(st);
    for (uint32_t i = 0; st->files && i < st->lay.n_files; i++) {
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
    free(st);
}

static void set_geometry(g3_store *st, const g3_store_options *o)
{
    g3_layout_init(&st->lay, o->slot_size, o->capacity_bytes_per_file / o->slot_size,
                   (uint32_t)o->n_paths);
    st->n_slots = st->lay.slots_per_file * st->lay.n_files;
    st->qd = o->queue_depth ? o->queue_depth : G3_DEFAULT_QUEUE_DEPTH;
    st->next_gen = 1;
}

/* Resolves every path and refuses duplicates, before anything is opened. */
static int resolve_paths(g3_store *st, const g3_store_options *o)
{
    for (uint32_t i = 0; i < st->lay.n_files; i++) {
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
    for (uint32_t i = 0; i < st->lay.n_files && rc == 0; i++) rc = open_file(st, i);
    if (rc == 0) rc = choose_uuid(st);
    if (rc == 0) {
        st->seed = g3_record_seed(st->uuid);
        rc = format_files(st);
    }
    if (rc == 0 && (st->memo = calloc(st->n_slots, sizeof *st->memo)) == NULL)
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (rc == 0) rc = g3_engine_start(st);
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
    st->lay.n_files = (uint32_t)o->n_paths;
    st->files = calloc(st->lay.n_files, sizeof *st->files);
    if (st->files == NULL) {
        free(st);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < st->lay.n_files; i++) st->files[i].fd = st->files[i].dfd = -1;
    set_geometry(st, o);
    rc = open_all(st, o);
    if (rc != 0) {
        g3_store_free(st, true);
        return rc;
    }
    if (st->scanned) /* new files: every slot is known to be empty */
        for (uint64_t i = 0; i < st->n_slots; i++) st->memo[i].state = MEMO_EMPTY;
    G3_LOG(st, KVCR_LOG_INFO, "G3 store open: %u files, %llu slots of %llu bytes, queue depth %u",
           st->lay.n_files, (unsigned long long)st->n_slots,
           (unsigned long long)st->lay.slot_size, st->qd);
    *out = st;
    return 0;
}

/* ---- geometry ---------------------------------------------------------------- */

uint64_t g3_store_slots(const g3_store *st)
{
    return st->n_slots;
}

uint64_t g3_store_slot_size(const g3_store *st)
{
    return st->lay.slot_size;
}

int g3_store_locate(const g3_store *st, uint64_t slot, g3_location *loc)
{
    if (slot >= st->n_slots)
        return kvcr_fail(KVCR_EINVAL, "G3 slot %llu out of range (%llu slots)",
                         (unsigned long long)slot, (unsigned long long)st->n_slots);
    uint64_t fslot = slot / st->lay.n_files;
    loc->file = (uint32_t)(slot % st->lay.n_files);
    loc->path = st->files[loc->file].path;
    loc->record_offset = g3_record_offset(&st->lay, fslot);
    loc->data_offset = g3_data_offset(&st->lay, fslot);
    return 0;
}
