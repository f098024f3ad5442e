/* Pool files: the shared DRAM the KVCR service owns and an engine maps.
 *
 * Each Guard group is one regular file in the pool directory (normally on
 * a tmpfs such as /dev/shm) named kvcr-pool-<guard index>-<generation as 16
 * lowercase hex digits>, mode 0600, holding [journal][pool 0][pool 1]...
 * Its backing pages are committed when it is created (posix_fallocate, or
 * zero pwrites where the filesystem cannot), so that touching the mapping
 * can never SIGBUS for lack of space.
 *
 * Liveness by flock: the service holds a shared lock on the file's open
 * file description for the file's life; a claimant receives that same
 * description over SCM_RIGHTS and keeps it while it maps the file, so the
 * lock outlives a crashed service exactly as long as some worker still
 * uses the pool. An orphan purge at service start takes an exclusive
 * non-blocking lock on each kvcr-pool-* file: it removes only files nobody
 * holds. */
#ifndef KVCR_SERVICE_POOL_H
#define KVCR_SERVICE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/log.h"

#define POOL_PATH_MAX 4096

typedef struct pool_file {
    char path[POOL_PATH_MAX];
    int fd;          /* O_RDWR|O_CLOEXEC, shared flock held; -1 when closed */
    dev_t dev;       /* identity at creation: unlink only this file */
    ino_t ino;
    uint64_t bytes;
} pool_file;

/* Creates <dir>/kvcr-pool-<index>-<generation> exclusively (O_CREAT|O_EXCL|
 * O_NOFOLLOW, 0600), takes the shared lock, sizes it to bytes (a multiple of
 * the page size) and commits its blocks. ENOSPC and other failures give a
 * clear error (KVCR_ESYS) and leave no file behind. */
int pool_file_create(const char *dir, uint32_t guard_index, uint64_t generation, uint64_t bytes,
                     pool_file *out);

/* Closes the descriptor and unlinks the path if it still names the file
 * created (never an unrelated replacement). Idempotent. */
void pool_file_remove(pool_file *f);

/* Maps a pool file received over the claim socket: it must be a regular
 * file, mode 0600, at least bytes long; takes a shared non-blocking lock
 * (refused with KVCR_EBUSY if someone holds it exclusively); maps exactly
 * bytes MAP_SHARED read-write and applies MADV_DONTFORK, so a forked child
 * never sees the pool. All checks happen before the mapping. */
int pool_map(int fd, uint64_t bytes, void **base);
void pool_unmap(void *base, uint64_t bytes);

/* Removes every kvcr-pool-* regular file in dir (not following symlinks)
 * that no live process holds; files held are left and logged at info;
 * errors on one entry are logged and skipped. Returns how many it removed,
 * or a negative KVCR_E* if dir cannot be read. */
int pool_purge_orphans(const char *dir, const kvcr_logger *log);

#endif
