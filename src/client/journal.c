/* The recovery journal (see journal.h for the format and the model).
 *
 * Each side keeps its own cursor and sequence number in its journal struct
 * and stores only its own word of the header (published for the producer,
 * consumed for the consumer, and either may set the invalid flag). The
 * other side's word is loaded, checked against what is possible, and never
 * trusted beyond that.
 *
 * The consumer copies every frame out of the ring into its scratch buffer
 * before it decodes it, not only the frames that wrap: the producer lives
 * in another process and is not trusted, so the bytes that are checked
 * must be bytes it can no longer change. That is one copy of at most
 * FRAME_MAX bytes per frame (1,064 without JFLAG_META). The size that bounds the copy is read with a
 * single load for the same reason.
 *
 * Sequence numbers are not in the header, so a side that attaches at a
 * non-zero cursor counts the frames before it, which it can do only while
 * they are all still in the ring (published <= C: the ring's first lap,
 * which is where a freshly formatted or compacted journal is). Beyond
 * that the next number is unknown, and the journal is made INVALID. */
#include "client/journal.h"

#include <endian.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvcr/error.h"
#include "util/bytes.h"
#include "util/log.h"

#define MAGIC "KVCRJNL1"
#define VERSION 1u

/* Header offsets. */
#define H_VERSION 8
#define H_GENERATION 16
#define H_BYTES 24
#define H_SUM 32 /* XXH3-64 of [0, H_SUM) */
#define H_INVALID 64
#define H_PUBLISHED 128
#define H_CONSUMED 192
#define H_OWNER 256
#define H_N_RETIRED 320
#define H_RETIRED 384
#define H_KV_SEQ 512
#define KV_SEQ_MAX (1ull << 63)

/* Frame head offsets. */
#define F_SIZE 0
#define F_TYPE 2
#define F_FLAGS 3
#define F_KEY_LEN 4
#define F_POOL 6
#define F_SLOT 8
#define F_SEQ 16
#define F_SUM 24

#define HEAD JOURNAL_FRAME_HEAD
#define FRAME_MIN (HEAD + 8)                 /* a 1-byte key, padded */
#define EXTRA_HEAD 3 /* JFLAG_META: u16 metadata length, u8 tenant length */
#define FRAME_MAX (HEAD + KVCR_KEY_MAX + 8 + EXTRA_HEAD + JOURNAL_TENANT_MAX + JOURNAL_META_MAX)
/* The largest frame in the ring (a PUT with all it may carry), padded to 8
 * as the ring holds it: the padding is copied and checked too. */
#define SCRATCH_BYTES ((FRAME_MAX + 7) & ~(uint64_t)7)

/* ---- the words both processes touch ------------------------------------------ */

/* The words both processes touch; base is 8-byte aligned (checked). */
static uint64_t load_word(const uint8_t *base, size_t off)
{
    const uint64_t *w = (const uint64_t *)(const void *)(base + off);
    return le64toh(__atomic_load_n(w, __ATOMIC_ACQUIRE));
}

static void store_word(uint8_t *base, size_t off, uint64_t v)
{
    uint64_t *w = (uint64_t *)(void *)(base + off);
    __atomic_store_n(w, htole64(v), __ATOMIC_RELEASE);
}

static uint64_t round8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

uint64_t journal_frame_bytes(size_t key_len)
{
    return round8(HEAD + (uint64_t)key_len);
}

/* ---- header -------------------------------------------------------------------- */

static int check_mapping(const void *base, uint64_t bytes)
{
    if (base == NULL || ((uintptr_t)base & 7) != 0)
        return kvcr_fail(KVCR_EINVAL, "recovery journal: base must be 8-byte aligned");
    if (bytes < JOURNAL_MIN_BYTES || bytes % 4096 != 0)
        return kvcr_fail(KVCR_EINVAL,
                         "recovery journal: size %" PRIu64 " is not a multiple of 4096 of at "
                         "least %u bytes",
                         bytes, JOURNAL_MIN_BYTES);
    return 0;
}

int journal_format(void *base, uint64_t bytes, uint64_t generation)
{
    int rc = check_mapping(base, bytes);
    if (rc != 0) return rc;
    uint8_t *h = base;
    memset(h, 0, JOURNAL_HEADER_BYTES);
    memcpy(h, MAGIC, 8);
    put32(h + H_VERSION, VERSION);
    put64(h + H_GENERATION, generation);
    put64(h + H_BYTES, bytes);
    put64(h + H_SUM, XXH3_64bits(h, H_SUM));
    store_word(h, H_PUBLISHED, 0);
    store_word(h, H_CONSUMED, 0);
    store_word(h, H_INVALID, 0);
    return 0;
}

/* ---- incarnations -------------------------------------------------------------- */

/* An incarnation is two shared words: each is written and read atomically
 * (the other process may read while this one writes; a torn pair is only
 * a wrong incarnation, which no peer knows). */
static void store_inc(uint8_t *h, size_t off, const journal_inc inc)
{
    uint64_t w[2];
    memcpy(w, inc, sizeof w);
    store_word(h, off, le64toh(w[0]));
    store_word(h, off + 8, le64toh(w[1]));
}

static void load_inc(const uint8_t *h, size_t off, journal_inc out)
{
    uint64_t w[2] = {htole64(load_word(h, off)), htole64(load_word(h, off + 8))};
    memcpy(out, w, sizeof w);
}

void journal_set_owner(journal *j, const journal_inc inc)
{
    store_inc(j->base, H_OWNER, inc);
}

bool journal_owner(const void *base, journal_inc out)
{
    load_inc(base, H_OWNER, out);
    static const journal_inc none = {0};
    return memcmp(out, none, JOURNAL_INC_LEN) != 0;
}

void journal_set_retired(void *base, const journal_inc *incs, size_t n)
{
    if (n > JOURNAL_RETIRED_MAX) n = JOURNAL_RETIRED_MAX;
    for (size_t i = 0; i < n; i++) store_inc(base, H_RETIRED + i * JOURNAL_INC_LEN, incs[i]);
    store_word(base, H_N_RETIRED, n);
}

size_t journal_retired(const void *base, journal_inc *out)
{
    uint64_t n = load_word(base, H_N_RETIRED);
    if (n > JOURNAL_RETIRED_MAX) n = JOURNAL_RETIRED_MAX;
    for (size_t i = 0; i < n; i++) load_inc(base, H_RETIRED + i * JOURNAL_INC_LEN, out[i]);
    return (size_t)n;
}

void journal_set_kv_seq(void *base, uint64_t next)
{
    store_word(base, H_KV_SEQ, next);
}

uint64_t journal_kv_seq(const void *base)
{
    uint64_t next = load_word(base, H_KV_SEQ);
    return next > KV_SEQ_MAX ? 0 : next;
}

/* Is this a journal of this size and generation? The shared words are not
 * looked at here. */
static int check_header(const uint8_t *h, uint64_t bytes, uint64_t generation)
{
    int rc = check_mapping(h, bytes);
    if (rc != 0) return rc;
    if (memcmp(h, MAGIC, 8) != 0)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: bad magic");
    if (get32(h + H_VERSION) != VERSION)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: version %" PRIu32 ", expected %u",
                         get32(h + H_VERSION), VERSION);
    if (get64(h + H_SUM) != XXH3_64bits(h, H_SUM))
        return kvcr_fail(KVCR_EPROTO, "recovery journal: header fails its checksum");
    if (get64(h + H_BYTES) != bytes)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: %" PRIu64 " bytes, expected %" PRIu64,
                         get64(h + H_BYTES), bytes);
    if (get64(h + H_GENERATION) != generation)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: generation %" PRIu64 ", expected %" PRIu64,
                         get64(h + H_GENERATION), generation);
    return 0;
}

/* ---- frames -------------------------------------------------------------------- */

/* Copies the frame that starts at cursor pos out of the ring into buf
 * (SCRATCH_BYTES), joining the two halves of a frame that wraps. The frame
 * must end by end (the published cursor; pos <= end). *total is its size
 * in the ring. */
static int fetch(const uint8_t *ring, uint64_t cap, uint64_t pos, uint64_t end, uint8_t *buf,
                 uint64_t *total)
{
    if (end - pos < FRAME_MIN)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: frame at %" PRIu64 " crosses the published cursor %"
                         PRIu64, pos, end);
    /* A frame's first 8 bytes never wrap (cursors and C are multiples of
     * 8). One load, so the size checked is the size used. */
    uint64_t off = pos % cap;
    const uint64_t *first = (const uint64_t *)(const void *)(ring + off);
    uint64_t size = le64toh(__atomic_load_n(first, __ATOMIC_RELAXED)) & 0xffff;
    if (size <= HEAD || size > FRAME_MAX)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: frame at %" PRIu64 " has size %" PRIu64,
                         pos, size);
    uint64_t t = round8(size);
    if (t > end - pos)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: frame at %" PRIu64 " (%" PRIu64 " bytes) crosses the "
                         "published cursor %" PRIu64, pos, t, end);
    uint64_t first_part = cap - off < t ? cap - off : t;
    memcpy(buf, ring + off, first_part);
    memcpy(buf + first_part, ring, t - first_part);
    *total = t;
    return 0;
}

/* JFLAG_META's part of a frame at x, with rest bytes after its lengths:
 * a tenant (no NUL) and metadata, not both empty, exactly filling them. */
static int decode_extra(const uint8_t *x, uint64_t rest, jrec *out)
{
    uint64_t ml = get16(x), tl = x[2];
    if (tl + ml == 0 || tl > JOURNAL_TENANT_MAX || ml > JOURNAL_META_MAX || tl + ml != rest ||
        memchr(x + EXTRA_HEAD, 0, tl) != NULL)
        return -1;
    out->tenant = tl ? x + EXTRA_HEAD : NULL;
    out->tenant_len = tl;
    out->meta = ml ? x + EXTRA_HEAD + tl : NULL;
    out->meta_len = ml;
    return 0;
}

/* Verifies the private copy f of the frame at pos (total bytes), which must
 * be number seq, and describes it in *out (key pointing into f). Zeroes
 * the checksum field of f. */
static int decode(uint8_t *f, uint64_t total, uint64_t generation, uint64_t seq, uint64_t pos,
                  jrec *out)
{
    uint64_t size = get16(f + F_SIZE);
    if (size <= HEAD || size > FRAME_MAX || round8(size) != total)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: frame at %" PRIu64 " has size %" PRIu64,
                         pos, size);
    unsigned type = f[F_TYPE];
    if (type != JREC_PUT && type != JREC_REMOVE)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: frame at %" PRIu64 " has type %u", pos,
                         type);
    unsigned flags = f[F_FLAGS];
    if (flags & ~(JFLAG_HASH | JFLAG_META) || (flags && type != JREC_PUT))
        return kvcr_fail(KVCR_EPROTO, "recovery journal: frame at %" PRIu64 " has flags %u",
                         pos, flags);
    uint64_t hash_bytes = flags & JFLAG_HASH ? 8 : 0;
    uint64_t key_len = get16(f + F_KEY_LEN);
    uint64_t fixed = HEAD + key_len + hash_bytes + (flags & JFLAG_META ? EXTRA_HEAD : 0);
    if (key_len < 1 || key_len > KVCR_KEY_MAX || fixed > size ||
        (!(flags & JFLAG_META) && fixed != size))
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: frame at %" PRIu64 " has key length %" PRIu64
                         " for size %" PRIu64, pos, key_len, size);
    out->tenant = out->meta = NULL;
    out->tenant_len = out->meta_len = 0;
    if ((flags & JFLAG_META) && decode_extra(f + fixed - EXTRA_HEAD, size - fixed, out) != 0)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: frame at %" PRIu64 " has a bad tenant or metadata",
                         pos);
    uint32_t pool = get16(f + F_POOL);
    uint64_t slot = get64(f + F_SLOT);
    if (type == JREC_REMOVE && (pool != 0 || slot != 0))
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: REMOVE frame at %" PRIu64 " names pool %" PRIu32
                         " slot %" PRIu64, pos, pool, slot);
    for (uint64_t i = size; i < total; i++)
        if (f[i] != 0)
            return kvcr_fail(KVCR_EPROTO,
                             "recovery journal: frame at %" PRIu64 " has non-zero padding", pos);
    uint64_t sum = get64(f + F_SUM);
    memset(f + F_SUM, 0, 8);
    if (XXH3_64bits_withSeed(f, total, generation) != sum)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: frame at %" PRIu64 " fails its checksum",
                         pos);
    /* Checked after the checksum: a frame that verifies but has the wrong
     * number is a whole frame in the wrong place (stale, or repeated). */
    if (get64(f + F_SEQ) != seq)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: frame at %" PRIu64 " has sequence %" PRIu64
                         ", expected %" PRIu64, pos, get64(f + F_SEQ), seq);
    out->type = (jrec_type)type;
    out->key = f + HEAD;
    out->key_len = (size_t)key_len;
    out->pool = pool;
    out->slot = slot;
    out->has_hash = hash_bytes != 0;
    out->router_hash = hash_bytes ? get64(f + HEAD + key_len) : 0;
    return 0;
}

/* Verifies the frames of [0, end) from ring offset 0 (end <= C: none
 * wraps), numbered from 0, handing each to cb when there is one; *count
 * is how many there are. Reads the mapping only. */
static int walk(const uint8_t *base, uint64_t bytes, uint64_t generation, uint64_t end,
                int (*cb)(void *ud, const jrec *r), void *ud, uint64_t *count)
{
    const uint8_t *ring = base + JOURNAL_HEADER_BYTES;
    uint64_t cap = bytes - JOURNAL_HEADER_BYTES;
    uint8_t buf[SCRATCH_BYTES];
    uint64_t pos = 0, seq = 0;
    while (pos < end) { /* every turn advances pos by at least FRAME_MIN */
        uint64_t total = 0;
        jrec r;
        int rc = fetch(ring, cap, pos, end, buf, &total);
        if (rc == 0) rc = decode(buf, total, generation, seq, pos, &r);
        if (rc == 0 && cb != NULL) rc = cb(ud, &r);
        if (rc != 0) return rc;
        pos += total;
        seq++;
    }
    *count = seq;
    return 0;
}

/* ---- both sides ---------------------------------------------------------------- */

static void mark_invalid(journal *j)
{
    store_word(j->base, H_INVALID, 1);
    j->invalid = true;
}

/* Marks the journal INVALID and fails with err and "recovery journal: ...". */
static int give_up(journal *j, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int give_up(journal *j, int err, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mark_invalid(j);
    return kvcr_fail(err, "recovery journal: %s", msg);
}

/* INVALID, as we last knew or as the other side has since said? */
static bool closed(journal *j)
{
    if (!j->invalid && load_word(j->base, H_INVALID) != 0) j->invalid = true;
    if (j->invalid)
        (void)kvcr_fail(KVCR_ECLOSED, "recovery journal: INVALID (recovery is off until the "
                                      "journal is formatted again)");
    return j->invalid;
}

/* Takes the cursor in own_word as j's own and numbers the next frame by
 * counting the frames before it. */
static int attach(journal *j, void *base, uint64_t bytes, uint64_t generation, size_t own_word)
{
    if (j == NULL) return kvcr_fail(KVCR_EINVAL, "recovery journal: no journal");
    memset(j, 0, sizeof *j);
    int rc = check_header(base, bytes, generation);
    if (rc != 0) return rc;
    j->scratch = malloc(SCRATCH_BYTES);
    if (j->scratch == NULL)
        return kvcr_fail(KVCR_ENOMEM, "recovery journal: no memory for a frame");
    j->base = base;
    j->bytes = bytes;
    j->cap = bytes - JOURNAL_HEADER_BYTES;
    j->generation = generation;
    if (load_word(j->base, H_INVALID) != 0) {
        j->invalid = true;
        return 0;
    }
    j->cursor = load_word(j->base, own_word);
    if (j->cursor == 0) return 0;
    /* An attachment that cannot know its sequence number attaches INVALID
     * (it says why in the last error): recovery is off, nothing is wrong. */
    uint64_t published = load_word(j->base, H_PUBLISHED);
    if (published > j->cap || j->cursor > published) {
        (void)give_up(j, KVCR_EPROTO,
                      "cannot attach at cursor %" PRIu64 " (published %" PRIu64
                      ", capacity %" PRIu64 "): the frames before it are not all in the ring",
                      j->cursor, published, j->cap);
        return 0;
    }
    if (walk(j->base, j->bytes, j->generation, j->cursor, NULL, NULL, &j->seq) != 0)
        mark_invalid(j);
    return 0;
}

int journal_attach_producer(journal *j, void *base, uint64_t bytes, uint64_t generation)
{
    return attach(j, base, bytes, generation, H_PUBLISHED);
}

int journal_attach_consumer(journal *j, void *base, uint64_t bytes, uint64_t generation)
{
    return attach(j, base, bytes, generation, H_CONSUMED);
}

void journal_detach(journal *j)
{
    if (j == NULL) return;
    free(j->scratch);
    memset(j, 0, sizeof *j);
}

void journal_invalidate(journal *j)
{
    if (j->base != NULL) mark_invalid(j);
    j->invalid = true;
}

bool journal_is_invalid(const journal *j)
{
    return j->invalid || j->base == NULL || load_word(j->base, H_INVALID) != 0;
}

/* Both words are read from the header: each side's own word there is its
 * own cursor, so this is right for either side without knowing which. */
uint64_t journal_backlog(const journal *j)
{
    if (j->base == NULL) return 0;
    uint64_t consumed = load_word(j->base, H_CONSUMED);
    uint64_t published = load_word(j->base, H_PUBLISHED);
    return published > consumed ? published - consumed : 0;
}

/* ---- producer ------------------------------------------------------------------ */

static int check_record(const jrec *r)
{
    if (r == NULL) return kvcr_fail(KVCR_EINVAL, "recovery journal: no record");
    if (r->type != JREC_PUT && r->type != JREC_REMOVE)
        return kvcr_fail(KVCR_EINVAL, "recovery journal: record type %d is neither PUT nor REMOVE",
                         (int)r->type);
    if (r->key == NULL || r->key_len < 1 || r->key_len > KVCR_KEY_MAX)
        return kvcr_fail(KVCR_EINVAL, "recovery journal: key of %zu bytes (1 .. %d, not NULL)",
                         r->key_len, KVCR_KEY_MAX);
    if (r->type == JREC_PUT && r->pool > 0xffff)
        return kvcr_fail(KVCR_EINVAL, "recovery journal: pool %" PRIu32 " beyond 65535", r->pool);
    if (r->type == JREC_PUT &&
        (r->tenant_len > JOURNAL_TENANT_MAX || r->meta_len > JOURNAL_META_MAX ||
         (r->tenant_len && (r->tenant == NULL || memchr(r->tenant, 0, r->tenant_len))) ||
         (r->meta_len && r->meta == NULL)))
        return kvcr_fail(KVCR_EINVAL,
                         "recovery journal: a tenant of at most %d bytes without NUL and metadata "
                         "of at most %d bytes, each with its bytes", JOURNAL_TENANT_MAX,
                         JOURNAL_META_MAX);
    return 0;
}

int journal_publish(journal *j, const jrec *r)
{
    int rc = check_record(r);
    if (rc != 0) return rc;
    if (j->base == NULL) return kvcr_fail(KVCR_EINVAL, "recovery journal: not attached");
    if (closed(j)) return KVCR_ECLOSED;

    uint64_t consumed = load_word(j->base, H_CONSUMED);
    if (consumed % 8 != 0 || consumed > j->cursor || j->cursor - consumed > j->cap)
        return give_up(j, KVCR_ECLOSED,
                       "consumed cursor %" PRIu64 " impossible (published %" PRIu64
                       ", capacity %" PRIu64 ")", consumed, j->cursor, j->cap);
    /* The engine never waits for the Guard: a full ring ends recovery. */
    bool hashed = r->type == JREC_PUT && r->has_hash;
    bool extra = r->type == JREC_PUT && r->tenant_len + r->meta_len > 0;
    uint64_t fixed = HEAD + r->key_len + (hashed ? 8 : 0);
    uint64_t size = fixed + (extra ? EXTRA_HEAD + r->tenant_len + r->meta_len : 0);
    uint64_t total = round8(size);
    uint64_t free_bytes = j->cap - (j->cursor - consumed);
    if (total > free_bytes)
        return give_up(j, KVCR_ECLOSED,
                       "ring full (%" PRIu64 " bytes free, frame of %" PRIu64 ")", free_bytes,
                       total);

    uint8_t *f = j->scratch;
    bool put = r->type == JREC_PUT;
    memset(f, 0, total);
    put16(f + F_SIZE, (uint16_t)size);
    f[F_TYPE] = (uint8_t)r->type;
    f[F_FLAGS] = (uint8_t)((hashed ? JFLAG_HASH : 0) | (extra ? JFLAG_META : 0));
    put16(f + F_KEY_LEN, (uint16_t)r->key_len);
    put16(f + F_POOL, put ? (uint16_t)r->pool : 0);
    put64(f + F_SLOT, put ? r->slot : 0);
    put64(f + F_SEQ, j->seq);
    memcpy(f + HEAD, r->key, r->key_len);
    if (hashed) put64(f + HEAD + r->key_len, r->router_hash);
    if (extra) {
        put16(f + fixed, (uint16_t)r->meta_len);
        f[fixed + 2] = (uint8_t)r->tenant_len;
        if (r->tenant_len) memcpy(f + fixed + EXTRA_HEAD, r->tenant, r->tenant_len);
        if (r->meta_len) memcpy(f + fixed + EXTRA_HEAD + r->tenant_len, r->meta, r->meta_len);
    }
    put64(f + F_SUM, XXH3_64bits_withSeed(f, total, j->generation));

    uint8_t *ring = j->base + JOURNAL_HEADER_BYTES;
    uint64_t off = j->cursor % j->cap;
    uint64_t first_part = j->cap - off < total ? j->cap - off : total;
    memcpy(ring + off, f, first_part);
    memcpy(ring, f + first_part, total - first_part);
    j->cursor += total;
    j->seq++;
    store_word(j->base, H_PUBLISHED, j->cursor);
    return 0;
}

/* ---- consumer ------------------------------------------------------------------ */

int journal_read_next(journal *j, jrec *out)
{
    if (j->base == NULL) return kvcr_fail(KVCR_EINVAL, "recovery journal: not attached");
    if (closed(j)) return KVCR_ECLOSED;

    uint64_t published = load_word(j->base, H_PUBLISHED);
    uint64_t pos = j->cursor;
    if (published % 8 != 0 || published < pos || published - pos > j->cap)
        return give_up(j, KVCR_EPROTO,
                       "published cursor %" PRIu64 " impossible (consumed %" PRIu64
                       ", capacity %" PRIu64 ")", published, pos, j->cap);
    if (published == pos) return 0;

    uint64_t total = 0;
    int rc = fetch(j->base + JOURNAL_HEADER_BYTES, j->cap, pos, published, j->scratch, &total);
    if (rc == 0) rc = decode(j->scratch, total, j->generation, j->seq, pos, out);
    if (rc != 0) {
        mark_invalid(j);
        return rc;
    }
    j->cursor += total;
    j->seq++;
    store_word(j->base, H_CONSUMED, j->cursor);
    return 1;
}

/* ---- replay -------------------------------------------------------------------- */

int journal_replay(const void *base, uint64_t bytes, uint64_t generation,
                   int (*cb)(void *ud, const jrec *r), void *ud)
{
    const uint8_t *h = base;
    int rc = check_header(h, bytes, generation);
    if (rc != 0) return rc;
    if (cb == NULL) return kvcr_fail(KVCR_EINVAL, "recovery journal: no replay callback");
    if (load_word(h, H_INVALID) != 0)
        return kvcr_fail(KVCR_ECLOSED, "recovery journal: INVALID, nothing to replay");
    uint64_t published = load_word(h, H_PUBLISHED);
    uint64_t cap = bytes - JOURNAL_HEADER_BYTES;
    if (published % 8 != 0 || published > cap)
        return kvcr_fail(KVCR_EPROTO,
                         "recovery journal: published cursor %" PRIu64 " impossible for a "
                         "replay (capacity %" PRIu64 ")", published, cap);
    uint64_t count;
    return walk(h, bytes, generation, published, cb, ud, &count);
}
