/* libFuzzer target: the recovery journal's consumer and replay (client/
 * journal.h) over a ring and cursors written by a hostile producer.
 *
 * Input: [0] flags, [1, 9) published minus consumed, [9, 17) the consumed
 * cursor, [17, 25) the consumer's next sequence number, then ring bytes.
 * A small journal is formatted with a fixed generation, then its header
 * cursors and ring are overwritten from the input. With flag bit 0 the
 * consumer attaches to that header (counting the frames before the
 * consumed cursor, so the ring bytes go at offset 0); without it, it
 * attaches to the fresh journal and is then moved to the input's cursor
 * (rounded down to a multiple of 8) and number, the ring bytes going at
 * cursor mod C: frames that wrap.
 *
 * Whatever the bytes, replay must not change the mapping, read_next must
 * return <= 0 within the number of frames that fit in the ring, and every
 * record handed over must be well formed (its router hash, tenant and
 * metadata where its frame said, taking exactly the frame's bytes); ASan checks that nothing is
 * read outside the mapping. With flag bit 1 a producer then attaches and
 * publishes a frame: 0 or KVCR_ECLOSED, nothing else. */
#include <endian.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/error.h"
#include "client/journal.h"

#define GEN 0x4655a2a2ull
#define BYTES ((uint64_t)JOURNAL_MIN_BYTES)
#define CAP (BYTES - JOURNAL_HEADER_BYTES)
#define PREFIX 25

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t mem[BYTES] __attribute__((aligned(4096)));
static uint8_t before[BYTES];

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static void set_word(size_t off, uint64_t v)
{
    __atomic_store_n((uint64_t *)(void *)(mem + off), htole64(v), __ATOMIC_RELEASE);
}

/* Touches every key, tenant and metadata byte, so that ASan sees one
 * pointing outside. */
static void check_record(const jrec *r)
{
    if (r->key_len < 1 || r->key_len > KVCR_KEY_MAX) abort();
    if (r->type != JREC_PUT && r->type != JREC_REMOVE) abort();
    if (r->pool > 0xffff) abort();
    if (r->type == JREC_REMOVE && (r->pool != 0 || r->slot != 0 || r->has_hash)) abort();
    if (r->type == JREC_REMOVE && (r->tenant_len || r->meta_len)) abort();
    if (r->tenant_len > JOURNAL_TENANT_MAX || r->meta_len > JOURNAL_META_MAX) abort();
    if ((r->tenant_len == 0) != (r->tenant == NULL) || (r->meta_len == 0) != (r->meta == NULL))
        abort();
    if (r->tenant_len && memchr(r->tenant, 0, r->tenant_len)) abort();
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < r->key_len; i++) sum += r->key[i];
    for (size_t i = 0; i < r->meta_len; i++) sum += r->meta[i];
    (void)sum;
}

/* The ring bytes a frame of this record takes (journal.h's layout). */
static uint64_t frame_bytes(const jrec *r)
{
    uint64_t n = JOURNAL_FRAME_HEAD + r->key_len + (r->has_hash ? 8 : 0);
    if (r->tenant_len + r->meta_len > 0) n += 3 + r->tenant_len + r->meta_len;
    return (n + 7) & ~(uint64_t)7;
}

static int on_replay(void *ud, const jrec *r)
{
    check_record(r);
    if (++*(uint64_t *)ud > CAP / 40) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < PREFIX) return 0;
    unsigned flags = data[0];
    bool attach_at_cursor = flags & 1;
    uint64_t consumed = rd64(data + 9);
    /* A consumer's own cursor is a multiple of 8 (attach and read_next
     * keep it so): the harness keeps that invariant when it sets one. */
    if (!attach_at_cursor) consumed &= ~(uint64_t)7;
    uint64_t published = consumed + rd64(data + 1);
    uint64_t seq = rd64(data + 17);

    memset(mem, 0, sizeof mem);
    if (journal_format(mem, BYTES, GEN) != 0) abort();
    uint8_t *ring = mem + JOURNAL_HEADER_BYTES;
    size_t n = size - PREFIX < CAP ? size - PREFIX : CAP;
    uint64_t off = attach_at_cursor ? 0 : consumed % CAP;
    size_t first = CAP - off < n ? (size_t)(CAP - off) : n;
    memcpy(ring + off, data + PREFIX, first);
    memcpy(ring, data + PREFIX + first, n - first);
    set_word(128, published);

    /* Replay reads [0, published) and changes nothing. */
    memcpy(before, mem, sizeof mem);
    uint64_t replayed = 0;
    int rc = journal_replay(mem, BYTES, GEN, on_replay, &replayed);
    if (rc != 0 && rc != KVCR_EPROTO) abort();
    if (memcmp(before, mem, sizeof mem) != 0) abort();

    journal j;
    if (attach_at_cursor) {
        set_word(192, consumed);
        if (journal_attach_consumer(&j, mem, BYTES, GEN) != 0) abort();
    } else {
        if (journal_attach_consumer(&j, mem, BYTES, GEN) != 0) abort();
        set_word(192, consumed);
        j.cursor = consumed;
        j.seq = seq;
    }

    jrec r;
    uint64_t frames = 0;
    for (;;) {
        uint64_t at = j.cursor;
        rc = journal_read_next(&j, &r);
        if (rc <= 0) break;
        check_record(&r);
        uint64_t step = j.cursor - at;
        if (step != frame_bytes(&r)) abort();
        if (++frames > CAP / 40) abort(); /* more frames than fit in the ring */
    }
    if (rc != 0 && rc != KVCR_EPROTO && rc != KVCR_ECLOSED) abort();
    if (rc != 0) {
        if (!journal_is_invalid(&j)) abort();
        if (journal_read_next(&j, &r) != KVCR_ECLOSED) abort();
    }
    journal_detach(&j);

    if (flags & 2) {
        uint8_t key[3] = {1, 2, 3};
        jrec w = {JREC_PUT, key, sizeof key, 7, seq};
        if (journal_attach_producer(&j, mem, BYTES, GEN) != 0) abort();
        rc = journal_publish(&j, &w);
        if (rc != 0 && rc != KVCR_ECLOSED) abort();
        journal_detach(&j);
    }
    return 0;
}
