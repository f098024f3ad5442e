/* The G3 slot store's insides, shared by its files and by nothing else:
 *   g3_open.c   options, paths, opening and O_DIRECT probing, formatting,
 *               the store's geometry and its release
 *   g3_uring.c  the io_uring engine: requests, index-block updates,
 *               completions, close
 *   g3_scan.c   the restart scan
 * and g3_format.c, the on-disk codec they all use. g3_store.h is the
 * contract; this header only says what the files share.
 *
 * Threads: as g3_store.h (one thread at a time per store); nothing here
 * takes a lock. */
#ifndef KVCR_TIERS_G3_STORE_INT_H
#define KVCR_TIERS_G3_STORE_INT_H

#include <limits.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/types.h>
#include <xxhash.h>

#include "tiers/g3_format.h"
#include "tiers/g3_store.h"
#include "util/log.h"

#define G3_LOG(st, level, ...)                                                                     \
    do {                                                                                           \
        if ((st)->log) kvcr_log((st)->log, (level), __VA_ARGS__);                                  \
    } while (0)

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

typedef struct g3_req g3_req;       /* a request (g3_uring.c) */
typedef struct g3_iblock g3_iblock; /* an index block being updated (g3_uring.c) */

typedef struct g3_file {
    char path[PATH_MAX];
    int fd;  /* holds the flock; no I/O goes through it */
    int dfd; /* O_DIRECT: all I/O */
    dev_t dev;
    ino_t ino;
    bool created;     /* this open created the file (removed again if the open fails) */
    bool fresh;       /* preallocated by this open */
    bool unformatted; /* no superblock yet */
    uint8_t uuid[G3_UUID_LEN];
} g3_file;

struct g3_store {
    g3_file *files;
    g3_layout lay;
    uint64_t n_slots;
    uint8_t uuid[G3_UUID_LEN];
    uint64_t seed; /* of the record checksums: a hash of the uuid */
    const kvcr_logger *log;

    struct io_uring ring;
    bool ring_ok;
    int efd;
    unsigned qd;
    g3_req **active;   /* up to 2 * qd: reads awaiting verification and  */
    unsigned n_active; /* writes awaiting only their record update do not */
                       /* count against the depth (their data I/O is done) */
    g3_req *verify, *verify_tail; /* reads whose I/O is back, to verify */
    unsigned n_verifying;
    unsigned n_parked; /* writes whose data is written, record update out */
    g3_req *unsealed, *unsealed_tail; /* writes whose data is queued, checksum not yet */
    bool plugged;                     /* g3_store_plug: submissions only queue */
    g3_req *fifo, *fifo_tail;
    size_t n_fifo;
    g3_req *done, *done_tail;
    size_t n_done;
    uint8_t *recbufs; /* 2 * qd * G3_ALIGN: one per active request */
    int *free_recbufs;
    unsigned n_free_recbufs;
    g3_iblock *blocks; /* 2 * qd of them */
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

/* O_DIRECT memory: aligned to G3_ALIGN. NULL when out of memory. */
static inline void *g3_aligned_alloc(size_t len)
{
    void *p = NULL;
    return posix_memalign(&p, G3_ALIGN, len) == 0 ? p : NULL;
}

/* The memo's key hash (XXH3-64 of the key). */
static inline uint64_t g3_key_hash(const void *key, size_t key_len)
{
    return XXH3_64bits(key, key_len);
}

/* g3_uring.c: the request pools and the ring of a store whose geometry and
 * queue depth are set (KVCR_ENOMEM, KVCR_ESYS); released again by
 * g3_engine_free, also after a failed start. */
int g3_engine_start(g3_store *st);
void g3_engine_free(g3_store *st);

/* g3_open.c: closes the files and frees st. failed: the open failed, so
 * the files it created are removed and those it preallocated truncated. */
void g3_store_free(g3_store *st, bool failed);

#endif
