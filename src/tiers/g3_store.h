/* The storage layer of the G3 local-disk tier: fixed-size slots in one or
 * more preallocated files, read and written with O_DIRECT through io_uring,
 * every slot described by a checksummed record so that a restart finds
 * exactly the blocks whose bytes are intact. It knows nothing of the block
 * index or of policies: the instance maps keys to slots and asks for I/O.
 *
 * Striping. Global slot s lives in file s mod F at index s div F, so
 * consecutive slots land on different files (different disks).
 *
 * File format (version 1, little-endian; every file of a store alike):
 *
 *   [0, 4 KiB)        superblock: magic "KVCRG3SB", format version, record
 *                     size, slot size, slot count of this file, index and
 *                     data offsets, file size, file index i, file count F,
 *                     a random 16-byte store uuid shared by the F files, and
 *                     an XXH3-64 of all that. Written once, when the file is
 *                     formatted; never rewritten.
 *   [4 KiB, D)        index: one 256-byte record per slot (16 per 4 KiB
 *                     block), the area rounded up to 4 KiB.
 *   [D, D + capacity) data: slot k of the file at D + k * slot_size.
 *
 * capacity_bytes_per_file is the DATA capacity: the file is larger by the
 * superblock and the index (4 KiB + 256 bytes per slot, rounded up to
 * 4 KiB: 0.4% of 64 KiB slots, 0.01% of 2 MiB slots). g3_store_locate()
 * gives the offsets of a slot.
 *
 * A record: magic, state (FULL or EMPTY), key length, record version,
 * tenant length, global slot number, generation, data length, XXH3-64 of
 * the data, the key (at most G3_KEY_MAX bytes, zero padded) and last an
 * XXH3-64 of the record itself, seeded with a hash of the store uuid, so
 * that records left by another store (a reformatted file) never verify.
 * An all-zero record is a slot never written; anything else that does not
 * verify is damaged. Both read as empty.
 *
 * Record versions (byte 6): 0 is version 1 (byte 7 zero too: the key and
 * zeros). 2 is version 2, a FULL record that also carries what the block's
 * owner said of it (g3_rec_extra): after the key its tenant's name (byte 7
 * bytes), a byte of metadata length and that many bytes of metadata,
 * opaque to the store; key, tenant, length byte and metadata share
 * G3_REC_ROOM bytes, zeros follow. A version-1 record still reads (no
 * tenant, no metadata); any other version byte reads as damaged, never as
 * something else. (A build that knows only version 1 reads a version-2
 * record as its key and data alone.)
 *
 * Generations are store-wide: every write and clear takes the next one, so
 * if two slots claim one key after a crash the higher generation is the
 * newer block. A store opened over existing files learns the highest
 * generation on disk from g3_store_scan(), which must run before the first
 * write or clear (reads may come first).
 *
 * Integrity. A write puts the data, then the record; a clear (eviction)
 * writes an EMPTY record with a new generation, so a stale record can never
 * bring an evicted block back after a restart. Nothing is fsynced per
 * write: what a crash leaves (a record without its data, data without its
 * record, a torn 4 KiB block, even the device reordering the two writes) is
 * caught by the checksums, never handed over as bytes:
 *   - g3_store_scan() verifies the records only (magic, state, slot number,
 *     lengths, record checksum, store uuid) and reports every FULL one; it
 *     does not read the data.
 *   - g3_store_read() verifies the record again (and that it holds the
 *     expected key and data length), then the XXH3-64 of the data. Any
 *     mismatch completes the read with G3_CORRUPT: the caller fails the
 *     entry and retires or rewrites the slot.
 * A write or clear that completes with an error leaves its slot unknown
 * (old record, new record, or damaged) but never wrong: clear it or retire
 * it.
 *
 * Records are smaller than an O_DIRECT block, so updating one rewrites its
 * 4 KiB index block: the block is read, the records waiting for it are
 * copied in, and it is written back. While that block has I/O in flight,
 * other updates of it wait and go out together in the next write
 * (read-modify-write with coalescing). A block is cached only while
 * updates of it are in flight (at most queue_depth blocks), so every
 * write costs the data write plus one 4 KiB read and one 4 KiB write.
 * A torn index write damages at most the 16 records of its block, which
 * then read as empty.
 *
 * I/O. One io_uring per store, with queue_depth (default 16) requests
 * moving data at once; each has at most two I/Os in flight (a read fetches
 * its record block and its data together). A write whose data is written
 * but whose record update is still out, and a read whose bytes are in but
 * not yet verified, leave their place to the next request (at most
 * 2 * queue_depth requests are active in all), so the device sees at most
 * 4 * queue_depth I/Os. Later requests wait in a FIFO inside the store.
 * Requests on one slot run in submission order (a write then a read of the
 * same slot returns the written bytes); the FIFO head waits while a
 * request for its slot is in flight. Completions are reaped by
 * g3_store_progress(), which calls each request's callback; the ring's
 * eventfd (g3_store_fd) becomes readable when completions are waiting.
 *
 * O_DIRECT needs aligned memory, offsets and lengths. Buffers aligned to
 * G3_ALIGN with a length that is a multiple of it (KVCR DRAM slots and
 * framework blocks in practice) are used directly; any other buffer goes
 * through a bounce buffer allocated for the request (one allocation and
 * one memcpy of the block, plus padding up to G3_ALIGN on disk).
 *
 * Run-time errors (EIO, ENOSPC, ...) complete the request with a negative
 * errno; the store keeps serving other slots. A file unlinked while the
 * store is open keeps working (Linux keeps the inode while the descriptor
 * is open); its space is freed at close and the next open starts a new,
 * empty file.
 *
 * Threads: a store is used by one thread at a time, every function (the
 * progress thread, once the instance wires it in). Callbacks run inside
 * g3_store_progress() and g3_store_close() on that thread; they may submit
 * new requests, but must not call g3_store_progress, g3_store_scan or
 * g3_store_close. */
#ifndef KVCR_TIERS_G3_STORE_H
#define KVCR_TIERS_G3_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

#define G3_KEY_MAX 200 /* longer keys are refused: not spillable */
#define G3_REC_ROOM 208 /* a record's key, tenant, metadata length byte and metadata */
#define G3_ALIGN 4096  /* O_DIRECT alignment used for everything */
#define G3_SUPERBLOCK_SIZE 4096
#define G3_RECORD_SIZE 256
#define G3_DEFAULT_QUEUE_DEPTH 16
#define G3_MAX_QUEUE_DEPTH 1024
#define G3_MAX_FILES 1024
#define G3_MAX_SLOT_SIZE (1ull << 30) /* one io_uring read or write */

/* A request's result: 0, a negative errno from the kernel (-EIO, -ENOSPC,
 * ...), -ECANCELED for a request still queued at g3_store_close, -ENOMEM
 * if a bounce buffer could not be allocated, or G3_CORRUPT. G3_CORRUPT is
 * outside the errno range (errno values stop at 4095). */
enum { G3_CORRUPT = -4096 };

typedef struct g3_store g3_store;

typedef void (*g3_done_fn)(void *ud, int result);

typedef struct g3_store_options {
    const char *const *paths; /* one file per path, at least one */
    size_t n_paths;
    uint64_t capacity_bytes_per_file; /* data bytes per file, whole slots */
    uint64_t slot_size;               /* > 0, a multiple of the page size */
    unsigned queue_depth;             /* requests in flight; 0: 16 */
    const kvcr_logger *log;           /* may be NULL */
} g3_store_options;

/* The G3 path rule, checked before anything touches the disk (kvcr_create
 * runs it; the Python package through it): at least one path, at most
 * G3_MAX_FILES, each non-empty, no two spelled alike ("G3 file paths must
 * be unique"), none the same file as another once resolved: the real path
 * of what exists (links followed), the rest as spelled, "." and ".."
 * applied ("G3 file paths must not alias the same file"). Hard links and
 * what appears later are caught by the inode check when the files open.
 * KVCR_EINVAL naming the rule; KVCR_ENOMEM, KVCR_ESYS (no working
 * directory). Reads the file system, writes nothing. Any thread. */
int g3_paths_check(const char *const *paths, size_t n);

/* Validates the options, opens (creating if need be), locks and checks
 * every file, formats new ones, and sets up the ring. Rules and their
 * messages (kvcr_last_error):
 *   KVCR_EINVAL "G3 requires at least one file path"
 *               "G3 file paths must be unique" (after resolving: the real
 *                 path of the parent directory, created if missing, + name)
 *               "G3 file paths must not alias the same file" (hard or
 *                 symbolic links: same device and inode once opened)
 *               "G3 slot size must be positive and page aligned"
 *               "G3 file capacity must contain complete slots"
 *               "G3 file <p> has incompatible size" (not empty and not the
 *                 size these options make, e.g. truncated)
 *               "G3 file storage requires O_DIRECT (<fs> of <p> does not
 *                 support it)" (also tmpfs and ramfs, whose O_DIRECT, where
 *                 accepted, is no direct I/O: the bytes stay in memory)
 *               "G3 file <p> needs O_DIRECT alignment of N bytes" (statx
 *                 reports more than G3_ALIGN)
 *               "G3 file <p> ..." for a damaged superblock, another layout
 *                 or another store's file
 *   KVCR_EBUSY  "G3 file <p> is in use by another process" (flock; also a
 *                 second store of this process)
 *   KVCR_ESYS   preallocation (a full disk names the path), io_uring set-up
 * A failure closes everything opened so far (locks released) and truncates
 * back to empty the files this call preallocated. */
int g3_store_open(const g3_store_options *o, g3_store **out);

/* Completes every request, in order: finished ones with their result,
 * queued ones with -ECANCELED, those in flight when their I/O ends
 * (waiting up to 60 s; past that the memory the kernel may still write and
 * the files, still locked, are leaked, with an error logged). Then closes
 * the files, which releases their locks. NULL is ignored. */
void g3_store_close(g3_store *st);

/* The eventfd registered with the ring: poll() it for POLLIN, then call
 * g3_store_progress. */
int g3_store_fd(const g3_store *st);

/* Reaps completions, starts queued requests and calls the callbacks of
 * finished ones. Never blocks. Returns the number of callbacks called. */
unsigned g3_store_progress(g3_store *st);

/* Requests submitted whose callback has not run yet. */
size_t g3_store_pending(const g3_store *st);

uint64_t g3_store_slots(const g3_store *st);
uint64_t g3_store_slot_size(const g3_store *st);

/* Queues a write of len bytes (1..slot_size) from data into slot under key
 * (1..G3_KEY_MAX bytes). data must stay unchanged until the callback.
 * *generation (if not NULL) gets the write's generation. The callback gets
 * 0 once the data and the record are written. Synchronous errors (no
 * callback): KVCR_EINVAL (bad slot, key, length; a store with existing
 * files not scanned yet), KVCR_ENOMEM, KVCR_ECLOSED. */
int g3_store_write(g3_store *st, uint64_t slot, const void *key, size_t key_len, const void *data,
                   size_t len, g3_done_fn cb, void *ud, uint64_t *generation);

/* What a version-2 record carries besides the key (lengths of at most 255;
 * with the key and one length byte, at most G3_REC_ROOM bytes). */
typedef struct g3_rec_extra {
    const void *tenant;
    size_t tenant_len;
    const void *meta;
    size_t meta_len;
} g3_rec_extra;

/* g3_store_write whose record also carries x (NULL or nothing in it: a
 * version-1 record). KVCR_EINVAL "G3 record has no room for ..." when x
 * does not fit with the key. */
int g3_store_write_ex(g3_store *st, uint64_t slot, const void *key, size_t key_len,
                      const g3_rec_extra *x, const void *data, size_t len, g3_done_fn cb,
                      void *ud, uint64_t *generation);

/* Queues a read of slot into buf. len is the data length that was written
 * (g3_slot_info.data_len after a scan). The callback gets 0 when the record
 * holds key and len and the data matches its checksum, G3_CORRUPT when
 * anything does not (including an empty slot); on any failure buf holds
 * unspecified bytes. Synchronous errors as for g3_store_write. */
int g3_store_read(g3_store *st, uint64_t slot, const void *key, size_t key_len, void *buf,
                  size_t len, g3_done_fn cb, void *ud);

/* Queues a clear: slot gets an EMPTY record (eviction). */
int g3_store_clear(g3_store *st, uint64_t slot, g3_done_fn cb, void *ud);

/* Batching. After g3_store_plug, requests submitted are only queued;
 * g3_store_unplug starts as many as the queue depth allows, hands all of
 * their I/O to the kernel in one submission and only then computes the
 * checksums of the writes among them (while the disk writes). Unplugged,
 * every submission starts at once, alone. Both are ignored inside a
 * callback; g3_store_progress starts queued requests either way. */
void g3_store_plug(g3_store *st);
void g3_store_unplug(g3_store *st);

/* ---- warm restart ------------------------------------------------------- */

typedef struct g3_slot_info {
    uint64_t slot;
    const void *key; /* valid during the callback */
    size_t key_len;
    uint64_t generation;
    uint64_t data_len;
    const void *tenant, *meta; /* version 2 (valid during the callback); else NULL */
    size_t tenant_len, meta_len;
} g3_slot_info;

typedef struct g3_scan_stats {
    uint64_t slots;       /* records examined */
    uint64_t full;        /* reported */
    uint64_t empty;       /* cleared */
    uint64_t unwritten;   /* all zero: never written */
    uint64_t damaged;     /* anything else: torn, flipped bits, another store */
    uint64_t index_bytes; /* read from disk */
} g3_scan_stats;

/* Reads every index sequentially (1 MiB O_DIRECT reads) and calls cb for
 * each slot holding a verified FULL record (see "Integrity" above for what
 * is verified). Needs an idle store (KVCR_EBUSY otherwise); KVCR_ESYS if an
 * index cannot be read. cb may be NULL; stats may be NULL. */
int g3_store_scan(g3_store *st, void (*cb)(void *ud, const g3_slot_info *info), void *ud,
                  g3_scan_stats *stats);

/* ---- layout, for tests and tools ----------------------------------------- */

typedef struct g3_location {
    uint32_t file;          /* index in the options' paths */
    const char *path;       /* resolved; valid until g3_store_close */
    uint64_t record_offset; /* of the slot's 256-byte record */
    uint64_t data_offset;   /* of the slot's data */
} g3_location;

/* KVCR_EINVAL if slot is out of range. */
int g3_store_locate(const g3_store *st, uint64_t slot, g3_location *loc);

/* Fault injection for tests: after skip more I/O completions, the next n
 * (data, record block or index block, in completion order) report -err
 * instead of their result; the I/O itself did happen. A write completes
 * its data, then reads and writes its index block; a clear only the latter
 * two; a read its record block and data in either order. n = 0 turns it
 * off. */
void g3_store_fail_after(g3_store *st, unsigned skip, unsigned n, int err);
void g3_store_fail_next(g3_store *st, unsigned n, int err); /* skip 0 */

#endif
