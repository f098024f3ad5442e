/* The recovery journal: how an engine's KVCR tells the Guard in the KVCR
 * service which blocks of the shared DRAM pool are committed, so that the
 * Guard can serve them after the engine dies and a restarted engine can
 * take them back.
 *
 * It is a single-producer, single-consumer ring of checksummed frames in
 * the first journal_bytes of the pool mapping, shared by two processes:
 * the producer is the engine (under its instance lock), the consumer the
 * Guard. Neither trusts the other: every frame is bounds-checked and
 * verified before it is believed, and anything that does not verify makes
 * the journal INVALID (a flag in the header, permanent until the next
 * journal_format), which means "recovery is off": the Guard recovers
 * nothing rather than something wrong.
 *
 * Layout (little-endian):
 *   [0, 4096)      header:
 *                    0   magic "KVCRJNL1"
 *                    8   u32 format version (1)
 *                   16   u64 generation: the pool's, fixed by the service
 *                   24   u64 journal_bytes
 *                   32   u64 XXH3-64 of [0, 32)
 *                   64   u64 invalid flag (0 valid, 1 invalid)   atomic
 *                  128   u64 published cursor                    atomic
 *                  192   u64 consumed cursor                     atomic
 *                  (the cursors sit on their own cache lines)
 *                  256   owner incarnation, 16 bytes (zero: none) atomic words
 *                  320   u64 number of retired incarnations      atomic
 *                  384   retired incarnations, 8 x 16 bytes      atomic words
 *                  512   u64 the group's KV-event stream: the    atomic
 *                        sequence number its next batch takes
 *                  The incarnations are how peers know a process: the
 *                  producer writes its own at start; when the owner is
 *                  gone the service lists it as retired (dead, or closed
 *                  with its transport destroyed), so that whoever answers
 *                  on its endpoint next can tell a peer that a transfer
 *                  from it is over. They are plain bytes: any value is
 *                  harmless, a count above 8 reads as 8.
 *                  The KV-event word is how the stream of a group's
 *                  events continues from one publisher to the next (the
 *                  engine, the Guard's backup, the restarted engine):
 *                  each stores the number of its next batch before it
 *                  sends a batch, so a SIGKILL leaves the word past every
 *                  number sent. A plain number: a value above 2^63 (that
 *                  no stream reaches) reads as 0.
 *   [4096, journal_bytes)  the ring, capacity C = journal_bytes - 4096.
 * Cursors count bytes ever published / consumed (never wrapped); a frame
 * starts at ring offset cursor mod C and may wrap. Valid cursors are
 * multiples of 8 with consumed <= published <= consumed + C.
 *
 * Frame (32-byte head, then the key, then for a PUT with JFLAG_HASH the
 * block's router hash, then for a PUT with JFLAG_META its tenant and
 * metadata, then zero padding to a multiple of 8):
 *    0  u16 frame_size = 32 + key_len (+ 8 with JFLAG_HASH) (+ 3 + tenant
 *           and metadata lengths with JFLAG_META)
 *    2  u8  type: 1 PUT (key now lives in pool `pool` at `slot`),
 *                 2 REMOVE (key has no DRAM residency any more)
 *    3  u8  flags (PUT only, else 0): JFLAG_HASH: the u64 router hash of the
 *           block (the engine's key adapter) follows the key, so that the
 *           Guard can announce the block to routers; JFLAG_META: then
 *           u16 metadata length, u8 tenant length (at most
 *           JOURNAL_TENANT_MAX, no NUL), the tenant's name and the
 *           metadata (at most JOURNAL_META_MAX bytes, opaque here: what
 *           the engine's deposit told routers of the block), not both
 *           empty. A frame without JFLAG_META (as version 1 wrote them all)
 *           has no tenant and no metadata; a build that knows only
 *           JFLAG_HASH refuses one with JFLAG_META (the journal turns
 *           INVALID: nothing is recovered, nothing misread).
 *    4  u16 key_len, 1 .. KVCR_KEY_MAX
 *    6  u16 pool (PUT; 0 for REMOVE)
 *    8  u64 slot (PUT; 0 for REMOVE)
 *   16  u64 sequence number: frames are numbered 0, 1, 2 ... from the last
 *       journal_format; a frame with the wrong number is invalid
 *   24  u64 XXH3-64, seeded with the generation, of the frame with this
 *       field zero (head, key and padding)
 * A reader rejects: a bad size, type, flag, key length, tenant or
 * metadata length, a NUL in a tenant, non-zero padding, wrong sequence,
 * wrong checksum, or a frame that would cross the published cursor.
 *
 * Memory order: the producer writes a frame, then store-releases published;
 * the consumer acquire-loads published, decodes, then store-releases
 * consumed. The producer acquire-loads consumed to find free space. */
#ifndef KVCR_SERVICE_JOURNAL_H
#define KVCR_SERVICE_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/types.h"

#define JOURNAL_HEADER_BYTES 4096u
#define JOURNAL_FRAME_HEAD 32u
#define JOURNAL_MIN_BYTES (JOURNAL_HEADER_BYTES + 65536u)

typedef enum { JREC_PUT = 1, JREC_REMOVE = 2 } jrec_type;

typedef struct jrec {
    jrec_type type;
    const uint8_t *key; /* valid until the next call on the same journal */
    size_t key_len;     /* 1 .. KVCR_KEY_MAX */
    uint32_t pool;      /* PUT only: < 65536 */
    uint64_t slot;      /* PUT only */
    bool has_hash;      /* PUT only: router_hash is the block's router hash */
    uint64_t router_hash;
    /* PUT only (NULL / 0: none): the block's tenant's name and metadata;
     * after journal_read_next they point into the frame like key. */
    const uint8_t *tenant, *meta;
    size_t tenant_len, meta_len;
} jrec;

#define JFLAG_HASH 0x1u
#define JFLAG_META 0x2u
#define JOURNAL_TENANT_MAX 255
#define JOURNAL_META_MAX 4096

/* One side's view of a journal (a producer or a consumer; never both). */
typedef struct journal {
    uint8_t *base;      /* the mapping: header then ring */
    uint64_t bytes;     /* journal_bytes */
    uint64_t cap;       /* ring capacity */
    uint64_t generation;
    uint64_t cursor;    /* own cursor: published (producer) or consumed (consumer) */
    uint64_t seq;       /* the next frame's sequence number */
    bool invalid;       /* seen or made invalid: every later call fails */
    uint8_t *scratch;   /* a frame that wraps is copied here to be decoded */
} journal;

/* Writes a fresh, valid, empty header (cursors 0). Only the service does
 * this, while no producer or consumer is attached. bytes >= JOURNAL_MIN_BYTES
 * and a multiple of 4096. */
int journal_format(void *base, uint64_t bytes, uint64_t generation);

/* Checks the header (magic, version, size, generation, checksum) and takes
 * the current cursors as its own starting point: a producer starts at
 * published, a consumer at consumed. KVCR_EPROTO when the header is not a
 * journal of this generation and size; an INVALID journal attaches
 * (journal_is_invalid tells). */
int journal_attach_producer(journal *j, void *base, uint64_t bytes, uint64_t generation);
int journal_attach_consumer(journal *j, void *base, uint64_t bytes, uint64_t generation);
void journal_detach(journal *j);

/* Producer: appends one frame. 0 when published; KVCR_EINVAL for a bad
 * record (nothing changes); KVCR_ECLOSED when the journal is INVALID or
 * becomes so here (the ring is full, the cursors are impossible): recovery
 * is off from then on, the engine keeps running and the Guard will
 * recover nothing. */
int journal_publish(journal *j, const jrec *r);

/* Consumer: 1 with *out set (its key valid until the next call), 0 when
 * nothing is published beyond the consumed cursor, KVCR_EPROTO when the
 * next frame does not verify or the cursors are impossible (the journal is
 * then marked INVALID), KVCR_ECLOSED when it is INVALID. Advances consumed
 * past every frame it returns. */
int journal_read_next(journal *j, jrec *out);

/* Reads every frame in [0, published) from ring offset 0 without consuming
 * anything: how a claimant learns the state the Guard compacted into a
 * freshly formatted journal. Stops at the first frame that does not verify
 * (KVCR_EPROTO: nothing of the journal may be believed) or when cb returns
 * non-zero (that value is returned). 0 after the last frame. Requires
 * published <= C (a compacted journal never wraps). */
int journal_replay(const void *base, uint64_t bytes, uint64_t generation,
                   int (*cb)(void *ud, const jrec *r), void *ud);

/* Marks the journal INVALID for both sides (logs nothing). */
void journal_invalidate(journal *j);
bool journal_is_invalid(const journal *j);

/* Incarnations in the header (see the layout). base is a journal mapping
 * (8-byte aligned, at least JOURNAL_HEADER_BYTES). */
#define JOURNAL_INC_LEN 16
#define JOURNAL_RETIRED_MAX 8
typedef uint8_t journal_inc[JOURNAL_INC_LEN];

/* Producer, at start: the incarnation peers will know this owner by. */
void journal_set_owner(journal *j, const journal_inc inc);
/* The owner's incarnation: false when none was written since the format. */
bool journal_owner(const void *base, journal_inc out);
/* Service, after journal_format: incarnations that will never write again. */
void journal_set_retired(void *base, const journal_inc *incs, size_t n);
/* Claimant: up to JOURNAL_RETIRED_MAX retired incarnations into out. */
size_t journal_retired(const void *base, journal_inc *out);

/* The group's KV-event stream (see the layout): the next batch's number,
 * stored by its publisher (any thread; atomic), read by the next one.
 * journal_format zeroes it: the service carries it across a format. */
void journal_set_kv_seq(void *base, uint64_t next);
uint64_t journal_kv_seq(const void *base);

/* Bytes a frame with this key takes in the ring (head, key, padding). */
uint64_t journal_frame_bytes(size_t key_len);

/* Published minus consumed, as this side sees it now. */
uint64_t journal_backlog(const journal *j);

#endif
