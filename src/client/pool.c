/* Pool files (see pool.h for the model).
 *
 * Nothing here removes a path on its name alone: a file is unlinked only
 * while the path still names the inode that was opened (same st_dev and
 * st_ino, by lstat so a symlink never matches), and the check is made with
 * the descriptor still open, so that the inode number cannot have been
 * handed to a new file in between.
 *
 * The flock belongs to the open file description, which the service shares
 * with every claimant (SCM_RIGHTS passes the description, not a copy).
 * That is why nothing here ever unlocks: LOCK_UN through any descriptor of
 * the description would drop the lock for everyone. The lock goes when the
 * last descriptor of the description is closed. */
#define _GNU_SOURCE
#include "client/pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvcr/error.h"

#define POOL_PREFIX "kvcr-pool-"
#define ZERO_CHUNK (1u << 20) /* bytes per pwrite when zero-filling */

_Static_assert(sizeof(off_t) >= 8, "pool files need a 64-bit off_t");

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

/* True if path (not followed) names the inode (dev, ino). */
static bool names_inode(const char *path, dev_t dev, ino_t ino)
{
    struct stat s;
    return lstat(path, &s) == 0 && s.st_dev == dev && s.st_ino == ino;
}

/* ---- creation ---------------------------------------------------------------- */

/* The zero-fill for filesystems without fallocate. It writes through the
 * descriptor and never through a mapping: a write that finds no space
 * fails with ENOSPC, a store into a mapping would raise SIGBUS. Returns 0
 * or an errno value. */
static int write_zeros(const pool_file *f)
{
    size_t chunk = f->bytes < ZERO_CHUNK ? (size_t)f->bytes : ZERO_CHUNK;
    char *zeros = calloc(1, chunk);
    if (zeros == NULL) return ENOMEM;
    int err = 0;
    uint64_t off = 0;
    while (off < f->bytes && err == 0) {
        size_t n = f->bytes - off < chunk ? (size_t)(f->bytes - off) : chunk;
        ssize_t w = pwrite(f->fd, zeros, n, (off_t)off);
        if (w > 0)
            off += (uint64_t)w;
        else if (w == 0)
            err = EIO; /* no progress and no reason: do not spin */
        else if (errno != EINTR)
            err = errno;
    }
    free(zeros);
    return err;
}

/* Commits every block of the file now, so that a full tmpfs shows here as
 * ENOSPC rather than later as SIGBUS in whoever touches the mapping. */
static int commit_blocks(const pool_file *f)
{
    int err;
    do
        err = posix_fallocate(f->fd, 0, (off_t)f->bytes);
    while (err == EINTR);
    /* The arguments were checked (offset 0, 0 < bytes <= INT64_MAX), so
     * EINVAL here is posix_fallocate's other meaning: the filesystem does
     * not support the operation. */
    if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) err = write_zeros(f);
    if (err != 0)
        return kvcr_fail(KVCR_ESYS, "pool file %s: cannot reserve %llu bytes: %s", f->path,
                         (unsigned long long)f->bytes, strerror(err));
    return 0;
}

/* Everything after the file exists: lock, mode, size, blocks. */
static int prepare(const pool_file *f)
{
    if (flock(f->fd, LOCK_SH | LOCK_NB) != 0)
        return kvcr_fail(KVCR_ESYS, "pool file %s: cannot take the shared lock: %s", f->path,
                         strerror(errno));
    /* An orphan purge that opened the file before we locked it may have
     * removed it; once we hold the lock no purge can, so look once. */
    if (!names_inode(f->path, f->dev, f->ino))
        return kvcr_fail(KVCR_ESYS,
                         "pool file %s was removed while being created (by an orphan purge?)",
                         f->path);
    /* open() applied the umask to 0600; the mode must be exactly 0600. */
    if (fchmod(f->fd, 0600) != 0)
        return kvcr_fail(KVCR_ESYS, "pool file %s: cannot set mode 0600: %s", f->path,
                         strerror(errno));
    if (ftruncate(f->fd, (off_t)f->bytes) != 0)
        return kvcr_fail(KVCR_ESYS, "pool file %s: cannot set size %llu: %s", f->path,
                         (unsigned long long)f->bytes, strerror(errno));
    return commit_blocks(f);
}

int pool_file_create(const char *dir, uint32_t guard_index, uint64_t generation, uint64_t bytes,
                     pool_file *out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "pool_file_create: out must not be NULL");
    /* A failed create leaves *out closed, so pool_file_remove on it is a no-op. */
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (dir == NULL || dir[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "pool directory must not be empty");
    uint64_t page = page_size();
    if (bytes == 0 || bytes % page != 0 || bytes > (uint64_t)INT64_MAX)
        return kvcr_fail(KVCR_EINVAL,
                         "pool file size must be a positive multiple of the page size (%llu), "
                         "not %llu",
                         (unsigned long long)page, (unsigned long long)bytes);
    int n = snprintf(out->path, sizeof out->path, "%s/" POOL_PREFIX "%u-%016llx", dir,
                     (unsigned)guard_index, (unsigned long long)generation);
    if (n < 0 || (size_t)n >= sizeof out->path) {
        out->path[0] = '\0';
        return kvcr_fail(KVCR_EINVAL, "pool directory path is too long (%zu bytes)", strlen(dir));
    }
    out->bytes = bytes;

    /* O_EXCL: an existing file (a live pool of the same generation, or
     * anything else) is never taken over, and on EEXIST *out stays closed,
     * so nothing below or in pool_file_remove touches that file. */
    int fd = open(out->path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvcr_fail(KVCR_ESYS, "pool file %s: cannot create: %s", out->path, strerror(errno));
    struct stat s;
    if (fstat(fd, &s) != 0) {
        /* Without the identity the path cannot be unlinked safely; fstat of
         * a descriptor just opened does not fail in practice. */
        int err = errno;
        close(fd);
        return kvcr_fail(KVCR_ESYS, "pool file %s: fstat: %s (the file is left in place)",
                         out->path, strerror(err));
    }
    out->fd = fd;
    out->dev = s.st_dev;
    out->ino = s.st_ino;
    int rc = prepare(out);
    if (rc != 0) pool_file_remove(out); /* keeps the message of prepare */
    return rc;
}

void pool_file_remove(pool_file *f)
{
    /* Only the call that closes the file unlinks it, which makes a second
     * call (or one on a failed create) a no-op. */
    if (f == NULL || f->fd < 0) return;
    /* Check and unlink before closing: our descriptor keeps the inode, and
     * so its number, from being reused by a file that replaced ours. An
     * unlink that fails leaves a file the next orphan purge removes. */
    if (names_inode(f->path, f->dev, f->ino)) (void)unlink(f->path);
    close(f->fd);
    f->fd = -1;
}

/* ---- mapping ----------------------------------------------------------------- */

int pool_map(int fd, uint64_t bytes, void **base)
{
    if (base == NULL) return kvcr_fail(KVCR_EINVAL, "pool_map: base must not be NULL");
    *base = NULL;
    if (fd < 0) return kvcr_fail(KVCR_EINVAL, "pool_map: invalid descriptor %d", fd);
    if (bytes == 0 || bytes > SIZE_MAX)
        return kvcr_fail(KVCR_EINVAL, "pool_map: cannot map %llu bytes",
                         (unsigned long long)bytes);
    struct stat s;
    if (fstat(fd, &s) != 0)
        return kvcr_fail(KVCR_ESYS, "pool file (descriptor %d): fstat: %s", fd, strerror(errno));
    if (!S_ISREG(s.st_mode)) return kvcr_fail(KVCR_EINVAL, "pool file must be a regular file");
    /* Anything wider would let other users read or write the pool. */
    if ((s.st_mode & 0777) != 0600)
        return kvcr_fail(KVCR_EINVAL, "pool file mode must be 0600 (it is %03o)",
                         (unsigned)(s.st_mode & 0777));
    /* Mapping past the end of the file would SIGBUS on first touch. */
    if ((uint64_t)s.st_size < bytes)
        return kvcr_fail(KVCR_EINVAL, "pool file is %lld bytes, shorter than the %llu to map",
                         (long long)s.st_size, (unsigned long long)bytes);
    /* Normally a no-op (the service's lock on this same description); it
     * fails only while an orphan purge holds the file to remove it. */
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return kvcr_fail(KVCR_EBUSY, "pool file is locked exclusively (being purged)");
        return kvcr_fail(KVCR_ESYS, "pool file: flock: %s", strerror(errno));
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return kvcr_fail(KVCR_ESYS, "pool file: cannot map %llu bytes: %s",
                         (unsigned long long)bytes, strerror(errno));
    /* A child forked by the engine must not keep the pool mapped (or write
     * into it after the engine is gone). */
    if (madvise(p, (size_t)bytes, MADV_DONTFORK) != 0) {
        int err = errno;
        munmap(p, (size_t)bytes);
        return kvcr_fail(KVCR_ESYS, "pool file: madvise(MADV_DONTFORK): %s", strerror(err));
    }
    *base = p;
    return 0;
}

void pool_unmap(void *base, uint64_t bytes)
{
    /* No unlock: see the top of this file. */
    if (base != NULL && bytes != 0) munmap(base, (size_t)bytes);
}

/* ---- orphan purge ------------------------------------------------------------ */

/* True for exactly the names pool_file_create makes: the prefix, a guard
 * index in canonical decimal (no leading zero, at most UINT32_MAX), '-',
 * and 16 lowercase hex digits. */
static bool is_pool_name(const char *name)
{
    const size_t plen = sizeof POOL_PREFIX - 1;
    if (strncmp(name, POOL_PREFIX, plen) != 0) return false;
    const char *p = name + plen;
    uint64_t index = 0;
    size_t digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        index = index * 10 + (uint64_t)(*p - '0');
        if (++digits > 10 || index > UINT32_MAX) return false;
    }
    if (digits == 0 || (digits > 1 && name[plen] == '0') || *p++ != '-') return false;
    for (int i = 0; i < 16; i++, p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return *p == '\0';
}

/* Removes dir/name if it is a regular file nobody holds; 1 if removed.
 * path is dir/name, for the log only: everything else is relative to dfd. */
static int purge_one(int dfd, const char *name, const char *path, const kvcr_logger *log)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ELOOP)
            kvcr_log(log, KVCR_LOG_WARN, "pool file %s is a symbolic link: left alone", path);
        else if (errno != ENOENT) /* ENOENT: gone since readdir, nothing to do */
            kvcr_log(log, KVCR_LOG_WARN, "pool file %s: cannot open: %s: left alone", path,
                     strerror(errno));
        return 0;
    }
    int removed = 0;
    struct stat held, now;
    if (fstat(fd, &held) != 0) {
        kvcr_log(log, KVCR_LOG_WARN, "pool file %s: fstat: %s: left alone", path, strerror(errno));
    } else if (!S_ISREG(held.st_mode)) {
        kvcr_log(log, KVCR_LOG_WARN, "pool file %s is not a regular file: left alone", path);
    } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            kvcr_log(log, KVCR_LOG_INFO, "pool file %s is still in use: kept", path);
        else
            kvcr_log(log, KVCR_LOG_WARN, "pool file %s: flock: %s: left alone", path,
                     strerror(errno));
    } else if (fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_dev != held.st_dev ||
               now.st_ino != held.st_ino) {
        /* Renamed over or removed since we opened it: what is there now
         * was not checked. */
        kvcr_log(log, KVCR_LOG_INFO, "pool file %s changed while being checked: left alone", path);
    } else if (unlinkat(dfd, name, 0) != 0) {
        kvcr_log(log, KVCR_LOG_WARN, "pool file %s: cannot remove: %s", path, strerror(errno));
    } else {
        kvcr_log(log, KVCR_LOG_WARN, "removed orphaned pool file %s (%llu bytes)", path,
                 (unsigned long long)held.st_size);
        removed = 1;
    }
    close(fd); /* drops our exclusive lock, if we took it */
    return removed;
}

int pool_purge_orphans(const char *dir, const kvcr_logger *log)
{
    kvcr_logger fallback;
    if (log == NULL) {
        kvcr_logger_init(&fallback, "service", NULL, NULL);
        log = &fallback;
    }
    if (dir == NULL || dir[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "pool directory must not be empty");
    DIR *d = opendir(dir);
    if (d == NULL)
        return kvcr_fail(KVCR_ESYS, "pool directory %s: cannot open: %s", dir, strerror(errno));
    int removed = 0, err;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
            err = errno;
            break;
        }
        if (!is_pool_name(e->d_name)) continue;
        char path[POOL_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        removed += purge_one(dirfd(d), e->d_name, path, log);
    }
    closedir(d);
    if (err != 0)
        return kvcr_fail(KVCR_ESYS, "pool directory %s: cannot read: %s", dir, strerror(err));
    return removed;
}
