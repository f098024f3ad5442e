/* The recovery journal: the header at its documented offsets and the exact
 * bytes of a frame, PUT/REMOVE round trips, a producer thread streaming a
 * million frames through a 64 KiB ring to a consumer thread, frames split
 * by the ring end at every kind of split, a full ring ending recovery,
 * bad records refused without a trace, every corruption a hostile
 * producer can make caught (and the journal INVALID for both sides until
 * the next format), replay of exactly what was published, foreign
 * journals refused, re-attachment, and a forked producer feeding its
 * parent through a MAP_SHARED mapping. */
#include <endian.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "harness.h"
#include "kvcr/error.h"
#include "client/journal.h"

#define GEN 0x6b7663726a6e6c31ull
#define BYTES ((uint64_t)JOURNAL_MIN_BYTES) /* C = 64 KiB */
#define CAP (BYTES - JOURNAL_HEADER_BYTES)
#define MAX_FRAME 1056 /* journal_frame_bytes(KVCR_KEY_MAX) */
#define DEADLINE_NS (120ull * 1000000000u)

/* ---- helpers ----------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static void wr16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}

static void wr64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

/* The header's shared words, as the other process would touch them. */
static uint64_t word(const uint8_t *m, size_t off)
{
    return le64toh(__atomic_load_n((const uint64_t *)(const void *)(m + off), __ATOMIC_ACQUIRE));
}

static void set_word(uint8_t *m, size_t off, uint64_t v)
{
    __atomic_store_n((uint64_t *)(void *)(m + off), htole64(v), __ATOMIC_RELEASE);
}

static uint8_t *ring_of(uint8_t *m)
{
    return m + JOURNAL_HEADER_BYTES;
}

/* A zeroed, page-aligned mapping of n bytes, formatted. */
static uint8_t *new_journal(uint64_t n)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 4096, n), 0);
    memset(p, 0, n);
    assert_int_equal(journal_format(p, n, GEN), 0);
    return p;
}

static void attach_both(uint8_t *m, journal *prod, journal *cons)
{
    if (journal_attach_producer(prod, m, BYTES, GEN) != 0)
        fail_msg("attach producer: %s", kvcr_last_error());
    if (journal_attach_consumer(cons, m, BYTES, GEN) != 0)
        fail_msg("attach consumer: %s", kvcr_last_error());
    assert_false(journal_is_invalid(prod));
    assert_false(journal_is_invalid(cons));
}

/* Record number i of a deterministic stream: keys of 1..120 bytes with a
 * KVCR_KEY_MAX one now and then, one REMOVE in five. */
static void record(uint64_t i, jrec *r, uint8_t *key)
{
    size_t len = i % 997 == 0 ? KVCR_KEY_MAX : 1 + (size_t)(((i * 2654435761u) >> 11) % 120);
    for (size_t k = 0; k < len; k++) key[k] = (uint8_t)(i * 131 + k * 7 + (i >> 8));
    bool put = i % 5 != 4;
    r->type = put ? JREC_PUT : JREC_REMOVE;
    r->key = key;
    r->key_len = len;
    r->pool = put ? (uint32_t)(i % 65536) : 0;
    r->slot = put ? i * 3 + 1 : 0;
    r->has_hash = false; /* frames of journal_frame_bytes(len): see the hash test */
    r->router_hash = 0;
    r->tenant = r->meta = NULL; /* likewise: see the metadata test */
    r->tenant_len = r->meta_len = 0;
}

static bool record_matches(uint64_t i, const jrec *got)
{
    uint8_t key[KVCR_KEY_MAX];
    jrec want;
    record(i, &want, key);
    return got->type == want.type && got->key_len == want.key_len &&
           memcmp(got->key, key, want.key_len) == 0 && got->pool == want.pool &&
           got->slot == want.slot;
}

static void publish_ok(journal *prod, const jrec *r)
{
    if (journal_publish(prod, r) != 0) fail_msg("publish: %s", kvcr_last_error());
}

static void publish_nth(journal *prod, uint64_t i)
{
    uint8_t key[KVCR_KEY_MAX];
    jrec r;
    record(i, &r, key);
    publish_ok(prod, &r);
}

/* A PUT whose frame takes exactly `total` bytes (a multiple of 8, 40..1056). */
static void publish_sized(journal *prod, uint64_t total, uint64_t slot)
{
    uint8_t key[KVCR_KEY_MAX];
    memset(key, 'k', sizeof key);
    jrec r = {JREC_PUT, key, (size_t)total - JOURNAL_FRAME_HEAD, 1, slot};
    assert_int_equal(journal_frame_bytes(r.key_len), total);
    publish_ok(prod, &r);
}

static void read_one(journal *cons, jrec *out)
{
    int rc = journal_read_next(cons, out);
    if (rc != 1) fail_msg("read_next: %d '%s', expected a frame", rc, kvcr_last_error());
}

/* Publishes and consumes filler frames until both cursors are at target. */
static void advance_to(journal *prod, journal *cons, uint64_t target)
{
    jrec r;
    while (prod->cursor < target) {
        uint64_t left = target - prod->cursor;
        uint64_t t = left > MAX_FRAME + 40 ? MAX_FRAME : left <= MAX_FRAME ? left : left - 40;
        publish_sized(prod, t, 0);
        read_one(cons, &r);
    }
    assert_int_equal(prod->cursor, target);
    assert_int_equal(cons->cursor, target);
}

/* Recomputes a frame's checksum, so that a corruption is caught by the
 * rule it breaks and not by the checksum. */
static void reseal(uint8_t *frame, uint64_t total)
{
    memset(frame + 24, 0, 8);
    wr64(frame + 24, XXH3_64bits_withSeed(frame, total, GEN));
}

/* Both sides see INVALID and refuse to go on. */
static void expect_invalid_everywhere(uint8_t *m, journal *prod, journal *cons)
{
    jrec r;
    uint8_t key[1] = {'x'};
    jrec one = {JREC_PUT, key, 1, 0, 0};
    assert_int_equal(word(m, 64), 1);
    assert_true(journal_is_invalid(prod));
    assert_true(journal_is_invalid(cons));
    assert_int_equal(journal_read_next(cons, &r), KVCR_ECLOSED);
    assert_int_equal(journal_publish(prod, &one), KVCR_ECLOSED);
    assert_non_null(strstr(kvcr_last_error(), "INVALID"));
}

/* ---- the format ---------------------------------------------------------------------------- */

static void test_header_and_frame_bytes_sit_at_their_documented_offsets(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    assert_memory_equal(m, "KVCRJNL1", 8);
    assert_int_equal(rd32(m + 8), 1);
    assert_int_equal(rd32(m + 12), 0);
    assert_int_equal(rd64(m + 16), GEN);
    assert_int_equal(rd64(m + 24), BYTES);
    assert_int_equal(rd64(m + 32), XXH3_64bits(m, 32));
    for (size_t i = 40; i < JOURNAL_HEADER_BYTES; i++)
        if (m[i] != 0) fail_msg("header byte %zu is %u after format", i, m[i]);

    journal prod, cons;
    attach_both(m, &prod, &cons);
    uint8_t key[5] = {'a', 'b', 'c', 'd', 'e'};
    jrec put = {JREC_PUT, key, 5, 513, 0x0102030405060708ull};
    publish_ok(&prod, &put);
    assert_int_equal(word(m, 128), 40);
    assert_int_equal(word(m, 192), 0);
    assert_int_equal(journal_backlog(&prod), 40);
    assert_int_equal(journal_backlog(&cons), 40);

    uint8_t *f = ring_of(m);
    assert_int_equal(rd16(f + 0), 37);
    assert_int_equal(f[2], JREC_PUT);
    assert_int_equal(f[3], 0);
    assert_int_equal(rd16(f + 4), 5);
    assert_int_equal(rd16(f + 6), 513);
    assert_int_equal(rd64(f + 8), 0x0102030405060708ull);
    assert_int_equal(rd64(f + 16), 0);
    assert_memory_equal(f + 32, key, 5);
    assert_int_equal(f[37] | f[38] | f[39], 0);
    uint8_t copy[40];
    memcpy(copy, f, 40);
    memset(copy + 24, 0, 8);
    assert_int_equal(rd64(f + 24), XXH3_64bits_withSeed(copy, 40, GEN));

    /* The second frame is number 1. */
    jrec rm = {JREC_REMOVE, key, 3, 0, 0};
    publish_ok(&prod, &rm);
    assert_int_equal(rd64(f + 40 + 16), 1);
    assert_int_equal(word(m, 128), 80);

    jrec r;
    read_one(&cons, &r);
    assert_int_equal(word(m, 192), 40);
    read_one(&cons, &r);
    assert_int_equal(word(m, 192), 80);
    assert_int_equal(journal_backlog(&cons), 0);

    assert_int_equal(word(m, 64), 0);
    journal_invalidate(&cons);
    assert_int_equal(word(m, 64), 1);
    assert_true(journal_is_invalid(&prod));
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_frame_bytes_are_head_key_and_padding_to_8(void **state)
{
    (void)state;
    assert_int_equal(journal_frame_bytes(1), 40);
    assert_int_equal(journal_frame_bytes(8), 40);
    assert_int_equal(journal_frame_bytes(9), 48);
    assert_int_equal(journal_frame_bytes(KVCR_KEY_MAX), MAX_FRAME);
}

/* ---- round trips --------------------------------------------------------------------------- */

static void test_put_and_remove_frames_round_trip(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    static uint8_t key[KVCR_KEY_MAX];
    for (size_t i = 0; i < sizeof key; i++) key[i] = (uint8_t)(i * 37 + 1);
    const jrec recs[] = {
        {JREC_PUT, key, 1, 0, 0},
        {JREC_PUT, key, 7, 65535, UINT64_MAX},
        {JREC_REMOVE, key, 8, 0, 0},
        {JREC_PUT, key, 9, 3, 12345},
        {JREC_PUT, key, KVCR_KEY_MAX, 1, 2},
        {JREC_REMOVE, key, KVCR_KEY_MAX, 0, 0},
    };
    size_t n = sizeof recs / sizeof recs[0];
    for (size_t i = 0; i < n; i++) publish_ok(&prod, &recs[i]);
    /* pool and slot of a REMOVE are not the record's business: written 0 */
    jrec rm = {JREC_REMOVE, key, 2, 77, 88};
    publish_ok(&prod, &rm);
    assert_int_equal(prod.seq, n + 1);

    jrec r;
    for (size_t i = 0; i < n; i++) {
        read_one(&cons, &r);
        assert_int_equal(r.type, recs[i].type);
        assert_int_equal(r.key_len, recs[i].key_len);
        assert_memory_equal(r.key, key, r.key_len);
        assert_int_equal(r.pool, recs[i].pool);
        assert_int_equal(r.slot, recs[i].slot);
        assert_int_equal(cons.seq, i + 1);
    }
    read_one(&cons, &r);
    assert_int_equal(r.type, JREC_REMOVE);
    assert_int_equal(r.pool, 0);
    assert_int_equal(r.slot, 0);
    assert_int_equal(journal_read_next(&cons, &r), 0);
    assert_int_equal(journal_read_next(&cons, &r), 0);
    assert_int_equal(cons.cursor, prod.cursor);
    assert_int_equal(journal_backlog(&prod), 0);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* ---- streaming ----------------------------------------------------------------------------- */

#define STREAM_FRAMES 1000000u

typedef struct streamer {
    journal *prod;
    uint64_t n;
    int rc;           /* first publish error, or 1 on timeout */
    char why[256];
} streamer;

/* The producer waits for space itself (the journal never does: a full
 * ring would end recovery). */
static void *stream_producer(void *arg)
{
    streamer *s = arg;
    uint8_t key[KVCR_KEY_MAX];
    uint64_t deadline = now_ns() + DEADLINE_NS;
    for (uint64_t i = 0; i < s->n; i++) {
        jrec r;
        record(i, &r, key);
        while (journal_backlog(s->prod) + journal_frame_bytes(r.key_len) > s->prod->cap) {
            if (now_ns() > deadline) {
                s->rc = 1;
                snprintf(s->why, sizeof s->why, "no space for frame %llu", (unsigned long long)i);
                return NULL;
            }
            sched_yield();
        }
        int rc = journal_publish(s->prod, &r);
        if (rc != 0) {
            s->rc = rc;
            snprintf(s->why, sizeof s->why, "frame %llu: %s", (unsigned long long)i,
                     kvcr_last_error());
            return NULL;
        }
    }
    return NULL;
}

static void test_a_consumer_thread_reads_a_million_frames_as_a_thread_publishes_them(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    streamer s = {&prod, STREAM_FRAMES, 0, ""};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, stream_producer, &s), 0);

    uint64_t deadline = now_ns() + DEADLINE_NS, got = 0, bad = UINT64_MAX;
    int rc = 0;
    while (got < STREAM_FRAMES) {
        jrec r;
        rc = journal_read_next(&cons, &r);
        if (rc < 0) break;
        if (rc == 0) {
            if (now_ns() > deadline) break;
            sched_yield();
            continue;
        }
        if (!record_matches(got, &r) || cons.seq != got + 1) {
            bad = got;
            break;
        }
        got++;
    }
    if (rc < 0 || bad != UINT64_MAX || got < STREAM_FRAMES) journal_invalidate(&cons);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (s.rc != 0) fail_msg("producer: %s", s.why);
    if (rc < 0) fail_msg("consumer at frame %llu: %d %s", (unsigned long long)got, rc,
                         kvcr_last_error());
    if (bad != UINT64_MAX) fail_msg("frame %llu has the wrong content", (unsigned long long)bad);
    assert_int_equal(got, STREAM_FRAMES);
    assert_true(prod.cursor > 1000 * CAP); /* it wrapped, many times */
    assert_int_equal(cons.cursor, prod.cursor);
    jrec r;
    assert_int_equal(journal_read_next(&cons, &r), 0);
    assert_false(journal_is_invalid(&cons));
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* ---- the ring end -------------------------------------------------------------------------- */

static void test_a_frame_split_by_the_ring_end_reads_whole(void **state)
{
    (void)state;
    /* bytes of the frame left before the ring end: only the size word,
     * part of the head, the whole head, head and some key, all but 8 */
    const uint64_t splits[] = {8, 16, 24, 32, 40, 48, 200, 224};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
        uint8_t *m = new_journal(BYTES);
        journal prod, cons;
        attach_both(m, &prod, &cons);
        advance_to(&prod, &cons, CAP - splits[k]);
        uint8_t key[200];
        for (size_t i = 0; i < sizeof key; i++) key[i] = (uint8_t)(i ^ 0x5a);
        jrec w = {JREC_PUT, key, sizeof key, 9, 99 + k};
        publish_ok(&prod, &w); /* 232 bytes: it wraps */
        assert_int_equal(prod.cursor, CAP - splits[k] + 232);
        /* its head at the ring's end, the rest (ending with the key's last
         * byte) at the ring's start */
        assert_int_equal(rd16(ring_of(m) + CAP - splits[k]), 232);
        assert_int_equal(ring_of(m)[232 - splits[k] - 1], key[199]);

        jrec r;
        read_one(&cons, &r);
        assert_int_equal(r.key_len, sizeof key);
        assert_memory_equal(r.key, key, sizeof key);
        assert_int_equal(r.pool, 9);
        assert_int_equal(r.slot, 99 + k);
        /* and the ring goes on from there */
        publish_nth(&prod, 3);
        read_one(&cons, &r);
        assert_true(record_matches(3, &r));
        journal_detach(&prod);
        journal_detach(&cons);
        free(m);
    }
}

static void test_a_frame_ending_at_the_ring_end_is_followed_by_one_at_offset_0(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    advance_to(&prod, &cons, CAP - 48);
    publish_sized(&prod, 48, 1);
    publish_sized(&prod, 40, 2);
    assert_int_equal(rd16(ring_of(m)), 40); /* the second frame's size */
    jrec r;
    read_one(&cons, &r);
    assert_int_equal(r.slot, 1);
    read_one(&cons, &r);
    assert_int_equal(r.slot, 2);
    assert_int_equal(cons.cursor, CAP + 40);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void test_a_full_ring_ends_recovery_for_both_sides(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    /* 62 frames of 1056 and one of 64 fill the 65536 bytes exactly: allowed */
    for (int i = 0; i < 62; i++) publish_sized(&prod, MAX_FRAME, (uint64_t)i);
    publish_sized(&prod, CAP - 62 * MAX_FRAME, 62);
    assert_int_equal(journal_backlog(&prod), CAP);
    assert_false(journal_is_invalid(&prod));

    uint8_t key[1] = {'z'};
    jrec one = {JREC_PUT, key, 1, 0, 0};
    assert_int_equal(journal_publish(&prod, &one), KVCR_ECLOSED);
    assert_non_null(strstr(kvcr_last_error(), "ring full"));
    assert_int_equal(word(m, 128), CAP); /* nothing more was published */
    expect_invalid_everywhere(m, &prod, &cons);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_a_bad_record_is_refused_and_changes_nothing(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    publish_nth(&prod, 1);

    static uint8_t key[KVCR_KEY_MAX + 1];
    const jrec bad[] = {
        {JREC_PUT, key, KVCR_KEY_MAX + 1, 0, 0},
        {JREC_REMOVE, key, KVCR_KEY_MAX + 1, 0, 0},
        {JREC_PUT, key, 0, 0, 0},
        {JREC_PUT, NULL, 4, 0, 0},
        {(jrec_type)0, key, 4, 0, 0},
        {(jrec_type)3, key, 4, 0, 0},
        {JREC_PUT, key, 4, 65536, 0},
    };
    uint8_t *before = malloc(BYTES);
    memcpy(before, m, BYTES);
    journal saved = prod;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = journal_publish(&prod, &bad[i]);
        if (rc != KVCR_EINVAL) fail_msg("bad record %zu: %d '%s'", i, rc, kvcr_last_error());
        assert_memory_equal(m, before, BYTES);
        assert_memory_equal(&prod, &saved, sizeof prod);
    }
    assert_int_equal(journal_publish(&prod, NULL), KVCR_EINVAL);
    assert_false(journal_is_invalid(&prod));

    /* and the journal goes on as if nothing had been asked */
    publish_nth(&prod, 2);
    jrec r;
    read_one(&cons, &r);
    assert_true(record_matches(1, &r));
    read_one(&cons, &r);
    assert_true(record_matches(2, &r));
    free(before);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void expect_attach_refused(uint8_t *m, uint64_t bytes, uint64_t gen, int code,
                                  const char *message)
{
    journal j;
    int rc = journal_attach_consumer(&j, m, bytes, gen);
    if (rc != code || strstr(kvcr_last_error(), message) == NULL)
        fail_msg("attach consumer: %d '%s', expected %d '%s'", rc, kvcr_last_error(), code,
                 message);
    assert_null(j.scratch);
    rc = journal_attach_producer(&j, m, bytes, gen);
    if (rc != code) fail_msg("attach producer: %d '%s', expected %d", rc, kvcr_last_error(), code);
    assert_null(j.scratch);
}

static int count_cb(void *ud, const jrec *r)
{
    (void)r;
    (*(int *)ud)++;
    return 0;
}

static void test_a_journal_of_another_generation_or_size_refuses_to_attach(void **state)
{
    (void)state;
    uint64_t big = BYTES + 4096;
    uint8_t *m = new_journal(big);
    expect_attach_refused(m, big, GEN + 1, KVCR_EPROTO, "generation");
    expect_attach_refused(m, BYTES, GEN, KVCR_EPROTO, "bytes, expected");
    int n = 0;
    assert_int_equal(journal_replay(m, big, GEN + 1, count_cb, &n), KVCR_EPROTO);
    assert_int_equal(journal_replay(m, BYTES, GEN, count_cb, &n), KVCR_EPROTO);

    /* a damaged header is not a journal either */
    m[3] ^= 1;
    expect_attach_refused(m, big, GEN, KVCR_EPROTO, "magic");
    m[3] ^= 1;
    m[33] ^= 0x40;
    expect_attach_refused(m, big, GEN, KVCR_EPROTO, "header fails its checksum");
    m[33] ^= 0x40;
    m[17] ^= 2;
    expect_attach_refused(m, big, GEN, KVCR_EPROTO, "header fails its checksum");
    m[17] ^= 2;
    m[8] = 2;
    wr64(m + 32, XXH3_64bits(m, 32));
    expect_attach_refused(m, big, GEN, KVCR_EPROTO, "version 2");
    assert_int_equal(journal_replay(m, big, GEN, count_cb, &n), KVCR_EPROTO);
    assert_int_equal(n, 0);

    /* sizes a journal cannot have, and memory it cannot use */
    assert_int_equal(journal_format(m, big - 8, GEN), KVCR_EINVAL);
    assert_int_equal(journal_format(m, JOURNAL_MIN_BYTES - 4096, GEN), KVCR_EINVAL);
    assert_int_equal(journal_format(m + 4, BYTES, GEN), KVCR_EINVAL);
    assert_int_equal(journal_format(NULL, BYTES, GEN), KVCR_EINVAL);
    assert_int_equal(journal_format(m, big, GEN), 0);
    expect_attach_refused(m, big - 8, GEN, KVCR_EINVAL, "multiple of 4096");
    expect_attach_refused(m + 8, big - 4096, GEN, KVCR_EPROTO, "magic");
    journal j;
    assert_int_equal(journal_attach_consumer(&j, m, big, GEN), 0);
    journal_detach(&j);
    free(m);
}

/* ---- corruption ---------------------------------------------------------------------------- */

/* The scene of every corruption: frames 0, 1, 2 (keys of 5, 13 and 20
 * bytes: 40, 48 and 56 bytes at ring offsets 0, 40, 88) are published and
 * frame 0 is consumed; the damage is then done to frame 1 or the cursors. */
#define VICTIM 40
#define VICTIM_BYTES 48
#define LAST 88
#define END 144

typedef void (*damage_fn)(uint8_t *m);

static void flip_key_bit(uint8_t *m) { ring_of(m)[VICTIM + 32 + 6] ^= 0x10; }
static void flip_checksum_bit(uint8_t *m) { ring_of(m)[VICTIM + 24 + 7] ^= 0x80; }
static void flip_sequence_bit(uint8_t *m) { ring_of(m)[VICTIM + 16] ^= 0x04; }
static void flip_size_high_bit(uint8_t *m) { ring_of(m)[VICTIM + 1] ^= 0x80; }
static void flip_size_low_bit(uint8_t *m) { ring_of(m)[VICTIM] ^= 0x01; }

static void sealed_wrong_sequence(uint8_t *m)
{
    wr64(ring_of(m) + VICTIM + 16, 0); /* frame 0's number, well sealed: a stale frame */
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_size_too_small(uint8_t *m)
{
    wr16(ring_of(m) + VICTIM, 32); /* a key of 0 bytes */
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_nonzero_padding(uint8_t *m)
{
    ring_of(m)[VICTIM + VICTIM_BYTES - 1] = 1;
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_bad_type(uint8_t *m)
{
    ring_of(m)[VICTIM + 2] = 3;
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_unknown_flag(uint8_t *m)
{
    ring_of(m)[VICTIM + 3] = 4;
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

/* The victim (a 13-byte key, size 45) made a JFLAG_META frame by a
 * shorter key: its last 13 - key_len key bytes become the lengths (u16
 * metadata, u8 tenant) and the tenant and metadata. */
static void as_meta_frame(uint8_t *m, uint16_t key_len, const uint8_t *tail, size_t n)
{
    uint8_t *f = ring_of(m) + VICTIM;
    f[3] = JFLAG_META;
    wr16(f + 4, key_len);
    memcpy(f + 32 + key_len, tail, n);
    reseal(f, VICTIM_BYTES);
}

static void sealed_meta_lengths_past_the_frame(uint8_t *m)
{
    as_meta_frame(m, 10, (const uint8_t[]){4, 0, 0}, 3); /* 4 bytes of metadata, none left */
}

static void sealed_meta_flag_with_nothing(uint8_t *m)
{
    as_meta_frame(m, 10, (const uint8_t[]){0, 0, 0}, 3);
}

static void sealed_meta_tenant_with_a_nul(uint8_t *m)
{
    as_meta_frame(m, 8, (const uint8_t[]){0, 0, 2, 'a', 0}, 5);
}

static void sealed_meta_flag_without_room(uint8_t *m)
{
    as_meta_frame(m, 11, (const uint8_t[]){0, 0}, 2); /* 2 bytes after the key, not 3 */
}

static void sealed_meta_on_a_remove(uint8_t *m)
{
    uint8_t *f = ring_of(m) + VICTIM;
    f[2] = JREC_REMOVE;
    wr16(f + 6, 0);
    wr64(f + 8, 0);
    as_meta_frame(m, 10, (const uint8_t[]){0, 0, 0}, 3);
}

/* The hash flag on a frame that has no room for the hash. */
static void sealed_hash_flag_without_a_hash(uint8_t *m)
{
    ring_of(m)[VICTIM + 3] = JFLAG_HASH;
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_key_length_mismatch(uint8_t *m)
{
    wr16(ring_of(m) + VICTIM + 4, 12);
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void sealed_remove_with_a_slot(uint8_t *m)
{
    ring_of(m)[VICTIM + 2] = JREC_REMOVE;
    wr16(ring_of(m) + VICTIM + 6, 0);
    wr64(ring_of(m) + VICTIM + 8, 5);
    reseal(ring_of(m) + VICTIM, VICTIM_BYTES);
}

static void published_beyond_consumed_plus_c(uint8_t *m) { set_word(m, 128, 40 + CAP + 8); }
static void published_not_a_multiple_of_8(uint8_t *m) { set_word(m, 128, END - 4); }
static void published_behind_consumed(uint8_t *m) { set_word(m, 128, 32); }
static void published_inside_a_frame(uint8_t *m) { set_word(m, 128, LAST + 40); }
static void published_past_zero_bytes(uint8_t *m) { set_word(m, 128, END + 64); } /* torn */

static void published_past_a_half_written_frame(uint8_t *m)
{
    /* a whole head, the key not yet written */
    memcpy(ring_of(m) + END, ring_of(m) + LAST, 32);
    wr64(ring_of(m) + END + 16, 3);
    set_word(m, 128, END + 56);
}

static void expect_caught(damage_fn damage, const char *message)
{
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    uint8_t key[20];
    memset(key, 'q', sizeof key);
    const size_t lens[] = {5, 13, 20};
    for (uint64_t i = 0; i < 3; i++) {
        jrec w = {JREC_PUT, key, lens[i], 1, i};
        publish_ok(&prod, &w);
    }
    assert_int_equal(prod.cursor, END);
    jrec r;
    read_one(&cons, &r);

    damage(m);
    /* frames before the damage are still handed over, never one after */
    int rc, n = 0;
    while ((rc = journal_read_next(&cons, &r)) == 1 && n < 3) n++;
    if (rc != KVCR_EPROTO || strstr(kvcr_last_error(), message) == NULL)
        fail_msg("read_next: %d '%s', expected %d '%s'", rc, kvcr_last_error(), KVCR_EPROTO,
                 message);
    assert_true(strncmp(kvcr_last_error(), "recovery journal: ", 18) == 0);
    assert_true(n <= 2);
    expect_invalid_everywhere(m, &prod, &cons);
    journal_detach(&prod);
    journal_detach(&cons);

    /* INVALID is permanent: a new attachment sees it ... */
    journal again;
    assert_int_equal(journal_attach_consumer(&again, m, BYTES, GEN), 0);
    assert_true(journal_is_invalid(&again));
    assert_int_equal(journal_read_next(&again, &r), KVCR_ECLOSED);
    journal_detach(&again);

    /* ... until the next format */
    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    attach_both(m, &prod, &cons);
    publish_nth(&prod, 7);
    read_one(&cons, &r);
    assert_true(record_matches(7, &r));
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_a_flipped_key_bit_is_caught(void **state)
{
    (void)state;
    expect_caught(flip_key_bit, "frame at 40 fails its checksum");
}

static void test_a_flipped_checksum_bit_is_caught(void **state)
{
    (void)state;
    expect_caught(flip_checksum_bit, "fails its checksum");
}

static void test_a_flipped_sequence_bit_is_caught(void **state)
{
    (void)state;
    expect_caught(flip_sequence_bit, "fails its checksum");
    expect_caught(sealed_wrong_sequence, "has sequence 0, expected 1");
}

static void test_a_flipped_size_bit_is_caught(void **state)
{
    (void)state;
    expect_caught(flip_size_high_bit, "has size");
    expect_caught(flip_size_low_bit, "key length 13 for size 44");
    expect_caught(sealed_size_too_small, "has size 32");
}

/* A PUT may carry its block's router hash (8 bytes after the key, the
 * flag set); it comes back exactly, a REMOVE never carries one, and a
 * record without a hash keeps its frame size. */
static void test_put_frames_carry_the_router_hash(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    const uint8_t key[13] = "block-key-013";
    jrec put = {JREC_PUT, key, sizeof key, 2, 77, true, 0xFEDCBA9876543210ull};
    jrec plain = {JREC_PUT, key, sizeof key, 2, 78, false, 0};
    jrec rm = {JREC_REMOVE, key, sizeof key, 0, 0, true, 5}; /* a REMOVE drops the hash */
    publish_ok(&prod, &put);
    assert_int_equal(prod.cursor, 56); /* 32 + 13 + 8, rounded up to 8 */
    publish_ok(&prod, &plain);
    assert_int_equal(prod.cursor, 56 + journal_frame_bytes(sizeof key));
    publish_ok(&prod, &rm);
    jrec r;
    read_one(&cons, &r);
    assert_int_equal(r.type, JREC_PUT);
    assert_true(r.has_hash);
    assert_true(r.router_hash == 0xFEDCBA9876543210ull);
    assert_int_equal(r.slot, 77);
    assert_memory_equal(r.key, key, sizeof key);
    read_one(&cons, &r);
    assert_false(r.has_hash);
    assert_int_equal(r.slot, 78);
    read_one(&cons, &r);
    assert_int_equal(r.type, JREC_REMOVE);
    assert_false(r.has_hash);
    assert_int_equal(journal_read_next(&cons, &r), 0);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* A PUT carries its tenant and metadata byte for byte, with or without
 * the router hash; a frame without them (as version 1 wrote every frame)
 * reads with none; a REMOVE drops them; what is too long, or a tenant
 * with a NUL, is refused at publish and changes nothing. */
/* The largest frame a PUT may make (the longest key, a router hash, the
 * longest tenant and metadata: 5,418 bytes, 5,424 in the ring) is written,
 * read and replayed whole (the scratch copies hold it with its padding:
 * under ASan an overrun fails here). */
static void test_the_largest_frame_round_trips_with_its_padding(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    static uint8_t key[KVCR_KEY_MAX], meta[JOURNAL_META_MAX], tenant[JOURNAL_TENANT_MAX];
    for (size_t i = 0; i < sizeof key; i++) key[i] = (uint8_t)(i * 3 + 1);
    for (size_t i = 0; i < sizeof meta; i++) meta[i] = (uint8_t)(i * 7 + 1);
    memset(tenant, 'T', sizeof tenant);
    jrec big = {JREC_PUT, key, sizeof key, 1, 5, true, 42, tenant, meta,
                JOURNAL_TENANT_MAX, JOURNAL_META_MAX};
    publish_ok(&prod, &big);
    assert_int_equal(prod.cursor, 5424); /* 32 + 1024 + 8 + 3 + 255 + 4096 = 5418 */
    jrec r;
    read_one(&cons, &r);
    assert_int_equal(r.key_len, KVCR_KEY_MAX);
    assert_memory_equal(r.key, key, KVCR_KEY_MAX);
    assert_true(r.has_hash && r.router_hash == 42);
    assert_int_equal(r.tenant_len, JOURNAL_TENANT_MAX);
    assert_memory_equal(r.tenant, tenant, JOURNAL_TENANT_MAX);
    assert_int_equal(r.meta_len, JOURNAL_META_MAX);
    assert_memory_equal(r.meta, meta, JOURNAL_META_MAX);
    int n = 0;
    assert_int_equal(journal_replay(m, BYTES, GEN, count_cb, &n), 0);
    assert_int_equal(n, 1);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_put_frames_carry_the_tenant_and_metadata(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    const uint8_t key[13] = "block-key-013";
    static uint8_t meta[JOURNAL_META_MAX + 1], tenant[JOURNAL_TENANT_MAX + 1];
    for (size_t i = 0; i < sizeof meta; i++) meta[i] = (uint8_t)(i * 7 + 1);
    memset(tenant, 't', sizeof tenant);
    jrec full = {JREC_PUT, key, sizeof key, 2, 77, true, 0xFEDCBA9876543210ull,
                 (const uint8_t *)"alice", meta, 5, 300};
    jrec only_meta = {JREC_PUT, key, sizeof key, 2, 78, false, 0, NULL, meta, 0,
                      JOURNAL_META_MAX};
    jrec only_tenant = {JREC_PUT, key, sizeof key, 2, 79, false, 0, tenant, NULL,
                        JOURNAL_TENANT_MAX, 0};
    jrec plain = {JREC_PUT, key, sizeof key, 2, 80, false, 0};
    jrec rm = {JREC_REMOVE, key, sizeof key, 0, 0, false, 0, tenant, meta, 3, 3};
    publish_ok(&prod, &full);
    assert_int_equal(prod.cursor, 368); /* 32 + 13 + 8 + 3 + 5 + 300 = 361, rounded up */
    publish_ok(&prod, &only_meta);
    publish_ok(&prod, &only_tenant);
    publish_ok(&prod, &plain);
    uint64_t before = prod.cursor;
    publish_ok(&prod, &rm);
    assert_int_equal(prod.cursor - before, journal_frame_bytes(sizeof key));

    /* refused, nothing published */
    before = prod.cursor;
    jrec bad = full;
    bad.meta_len = JOURNAL_META_MAX + 1;
    assert_int_equal(journal_publish(&prod, &bad), KVCR_EINVAL);
    bad = full;
    bad.tenant = tenant;
    bad.tenant_len = JOURNAL_TENANT_MAX + 1;
    assert_int_equal(journal_publish(&prod, &bad), KVCR_EINVAL);
    bad.tenant = (const uint8_t *)"a\0b";
    bad.tenant_len = 3;
    assert_int_equal(journal_publish(&prod, &bad), KVCR_EINVAL);
    bad = full;
    bad.meta = NULL;
    assert_int_equal(journal_publish(&prod, &bad), KVCR_EINVAL);
    assert_int_equal(prod.cursor, before);

    jrec r;
    read_one(&cons, &r);
    assert_true(r.has_hash && r.router_hash == 0xFEDCBA9876543210ull);
    assert_int_equal(r.slot, 77);
    assert_memory_equal(r.key, key, sizeof key);
    assert_int_equal(r.tenant_len, 5);
    assert_memory_equal(r.tenant, "alice", 5);
    assert_int_equal(r.meta_len, 300);
    assert_memory_equal(r.meta, meta, 300);
    read_one(&cons, &r);
    assert_int_equal(r.slot, 78);
    assert_false(r.has_hash);
    assert_null(r.tenant);
    assert_int_equal(r.tenant_len, 0);
    assert_int_equal(r.meta_len, JOURNAL_META_MAX);
    assert_memory_equal(r.meta, meta, JOURNAL_META_MAX);
    read_one(&cons, &r);
    assert_int_equal(r.slot, 79);
    assert_int_equal(r.tenant_len, JOURNAL_TENANT_MAX);
    assert_memory_equal(r.tenant, tenant, JOURNAL_TENANT_MAX);
    assert_null(r.meta);
    assert_int_equal(r.meta_len, 0);
    read_one(&cons, &r);
    assert_int_equal(r.slot, 80);
    assert_null(r.tenant);
    assert_null(r.meta);
    read_one(&cons, &r);
    assert_int_equal(r.type, JREC_REMOVE);
    assert_null(r.tenant);
    assert_null(r.meta);
    assert_int_equal(journal_read_next(&cons, &r), 0);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_bad_fields_are_caught_even_when_sealed(void **state)
{
    (void)state;
    expect_caught(sealed_nonzero_padding, "non-zero padding");
    expect_caught(sealed_bad_type, "has type 3");
    expect_caught(sealed_unknown_flag, "has flags 4");
    expect_caught(sealed_meta_lengths_past_the_frame, "has a bad tenant or metadata");
    expect_caught(sealed_meta_flag_with_nothing, "has a bad tenant or metadata");
    expect_caught(sealed_meta_tenant_with_a_nul, "has a bad tenant or metadata");
    expect_caught(sealed_meta_flag_without_room, "key length 11 for size 45");
    expect_caught(sealed_meta_on_a_remove, "has flags 2");
    expect_caught(sealed_hash_flag_without_a_hash, "key length 13 for size 45");
    expect_caught(sealed_key_length_mismatch, "key length 12 for size 45");
    expect_caught(sealed_remove_with_a_slot, "REMOVE frame at 40 names pool 0 slot 5");
}

static void test_impossible_published_cursors_are_caught(void **state)
{
    (void)state;
    expect_caught(published_beyond_consumed_plus_c, "published cursor");
    expect_caught(published_not_a_multiple_of_8, "published cursor 140 impossible");
    expect_caught(published_behind_consumed, "published cursor 32 impossible");
    expect_caught(published_inside_a_frame, "frame at 88 (56 bytes) crosses the published cursor");
}

static void test_a_torn_frame_is_caught(void **state)
{
    (void)state;
    expect_caught(published_past_zero_bytes, "frame at 144 has size 0");
    expect_caught(published_past_a_half_written_frame, "frame at 144 fails its checksum");
}

static void test_a_producer_seeing_an_impossible_consumed_cursor_ends_recovery(void **state)
{
    (void)state;
    const uint64_t bad[] = {8 * 1000, 4, 3 * 8};
    for (size_t k = 0; k < 3; k++) {
        uint8_t *m = new_journal(BYTES);
        journal prod, cons;
        attach_both(m, &prod, &cons);
        if (k < 2)
            publish_sized(&prod, 40, 0);
        else
            advance_to(&prod, &cons, CAP + 80); /* 24 is then more than C behind */
        set_word(m, 192, bad[k]);
        uint8_t key[1] = {'c'};
        jrec one = {JREC_PUT, key, 1, 0, 0};
        assert_int_equal(journal_publish(&prod, &one), KVCR_ECLOSED);
        assert_non_null(strstr(kvcr_last_error(), "consumed cursor"));
        assert_true(journal_is_invalid(&cons));
        journal_detach(&prod);
        journal_detach(&cons);
        free(m);
    }
}

static void test_invalid_set_by_the_other_side_is_seen_on_the_next_call(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    publish_nth(&prod, 0);
    set_word(m, 64, 1); /* as the other process would */
    expect_invalid_everywhere(m, &prod, &cons);
    journal_detach(&prod);
    journal_detach(&cons);

    /* and either side's journal_invalidate reaches the other */
    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    attach_both(m, &prod, &cons);
    journal_invalidate(&prod);
    expect_invalid_everywhere(m, &prod, &cons);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_format_makes_an_invalid_journal_valid_and_empty(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    for (uint64_t i = 0; i < 20; i++) publish_nth(&prod, i);
    journal_invalidate(&cons);
    journal_detach(&prod);
    journal_detach(&cons);
    memset(m + 200, 0xee, 100); /* and some damage to the header's spare bytes */

    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    attach_both(m, &prod, &cons);
    assert_int_equal(prod.cursor, 0);
    assert_int_equal(prod.seq, 0);
    assert_int_equal(journal_backlog(&cons), 0);
    jrec r;
    assert_int_equal(journal_read_next(&cons, &r), 0);
    /* the old frames are not believed: numbering starts again */
    publish_nth(&prod, 100);
    read_one(&cons, &r);
    assert_true(record_matches(100, &r));
    assert_int_equal(journal_read_next(&cons, &r), 0);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* ---- incarnations -------------------------------------------------------------------------- */

static void test_incarnations_sit_in_the_header_and_a_format_clears_them(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal_inc got, list[JOURNAL_RETIRED_MAX + 1];
    assert_false(journal_owner(m, got)); /* none written since the format */
    assert_int_equal(journal_retired(m, list), 0);

    journal prod;
    assert_int_equal(journal_attach_producer(&prod, m, BYTES, GEN), 0);
    journal_inc owner;
    for (int i = 0; i < JOURNAL_INC_LEN; i++) owner[i] = (uint8_t)(0xa0 + i);
    journal_set_owner(&prod, owner);
    assert_memory_equal(m + 256, owner, JOURNAL_INC_LEN); /* raw bytes, at the documented offset */
    assert_true(journal_owner(m, got));
    assert_memory_equal(got, owner, JOURNAL_INC_LEN);
    journal_detach(&prod);

    journal_inc retired[3];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < JOURNAL_INC_LEN; i++) retired[k][i] = (uint8_t)(16 * k + i);
    journal_set_retired(m, retired, 3);
    assert_int_equal(rd64(m + 320), 3);
    assert_memory_equal(m + 384, retired, sizeof retired);
    assert_int_equal(journal_retired(m, list), 3);
    assert_memory_equal(list, retired, sizeof retired);

    /* a count beyond the list (from a damaged or hostile header) reads as
     * the list's size, never past it */
    uint64_t huge = UINT64_MAX;
    memcpy(m + 320, &huge, 8);
    assert_int_equal(journal_retired(m, list), JOURNAL_RETIRED_MAX);

    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    assert_false(journal_owner(m, got));
    assert_int_equal(journal_retired(m, list), 0);
    free(m);
}

/* ---- replay -------------------------------------------------------------------------------- */

typedef struct collected {
    uint64_t n, first;  /* frames seen; the record number of the first */
    uint64_t stop_at;   /* return stop_rc after this many */
    int stop_rc;
    bool mismatch;
} collected;

static int collect(void *ud, const jrec *r)
{
    collected *c = ud;
    if (!record_matches(c->first + c->n, r)) c->mismatch = true;
    c->n++;
    return c->n == c->stop_at ? c->stop_rc : 0;
}

static void test_replay_returns_exactly_the_frames_published(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    /* a previous life leaves valid-looking frames all over the ring */
    attach_both(m, &prod, &cons);
    jrec r;
    for (uint64_t i = 0; i < 2000; i++) {
        publish_nth(&prod, i);
        read_one(&cons, &r);
    }
    assert_true(prod.cursor > CAP);
    journal_detach(&prod);
    journal_detach(&cons);

    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    collected c = {0};
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), 0);
    assert_int_equal(c.n, 0);

    assert_int_equal(journal_attach_producer(&prod, m, BYTES, GEN), 0);
    const uint64_t n = 40, first = 500;
    uint64_t at[40], off = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t key[KVCR_KEY_MAX];
        jrec w;
        record(first + i, &w, key);
        at[i] = off;
        off += journal_frame_bytes(w.key_len);
        publish_ok(&prod, &w);
    }
    assert_int_equal(off, prod.cursor);

    uint8_t *before = malloc(BYTES);
    memcpy(before, m, BYTES);
    c = (collected){0, first, 0, 0, false};
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), 0);
    assert_int_equal(c.n, n);
    assert_false(c.mismatch);
    assert_memory_equal(m, before, BYTES); /* it changed nothing */

    /* the callback can stop it */
    c = (collected){0, first, 11, 7, false};
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), 7);
    assert_int_equal(c.n, 11);

    /* it stops at a corrupt frame, having handed over those before it,
     * and leaves the journal as it found it */
    ring_of(m)[at[25] + 33] ^= 1;
    memcpy(before, m, BYTES);
    c = (collected){0, first, 0, 0, false};
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), KVCR_EPROTO);
    assert_non_null(strstr(kvcr_last_error(), "fails its checksum"));
    assert_int_equal(c.n, 25);
    assert_false(c.mismatch);
    assert_memory_equal(m, before, BYTES);
    ring_of(m)[at[25] + 33] ^= 1;

    /* a compacted journal never wraps: a published cursor beyond C, or
     * not a multiple of 8, is nothing to replay */
    set_word(m, 128, CAP + 8);
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), KVCR_EPROTO);
    set_word(m, 128, off - 4);
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), KVCR_EPROTO);
    set_word(m, 128, off);
    /* nor is an INVALID journal */
    journal_invalidate(&prod);
    c = (collected){0, first, 0, 0, false};
    assert_int_equal(journal_replay(m, BYTES, GEN, collect, &c), KVCR_ECLOSED);
    assert_int_equal(c.n, 0);
    free(before);
    journal_detach(&prod);
    free(m);
}

/* ---- attaching again ----------------------------------------------------------------------- */

static void test_a_new_attachment_continues_at_the_cursors_and_numbering(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    jrec r;
    for (uint64_t i = 0; i < 10; i++) publish_nth(&prod, i);
    for (uint64_t i = 0; i < 4; i++) read_one(&cons, &r);
    journal_detach(&prod);
    journal_detach(&cons);

    attach_both(m, &prod, &cons);
    assert_int_equal(prod.cursor, word(m, 128));
    assert_int_equal(prod.seq, 10);
    assert_int_equal(cons.cursor, word(m, 192));
    assert_int_equal(cons.seq, 4);
    for (uint64_t i = 10; i < 15; i++) publish_nth(&prod, i);
    for (uint64_t i = 4; i < 15; i++) {
        read_one(&cons, &r);
        assert_true(record_matches(i, &r));
    }
    assert_int_equal(journal_read_next(&cons, &r), 0);

    /* once the ring has wrapped the frames before the cursor are gone, and
     * with them the next frame's number: recovery is off */
    advance_to(&prod, &cons, CAP + 800);
    journal_detach(&prod);
    assert_int_equal(journal_attach_producer(&prod, m, BYTES, GEN), 0);
    assert_true(journal_is_invalid(&prod));
    assert_non_null(strstr(kvcr_last_error(), "cannot attach at cursor"));
    assert_int_equal(journal_read_next(&cons, &r), KVCR_ECLOSED);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

static void test_a_corrupt_frame_before_the_cursor_makes_an_attachment_invalid(void **state)
{
    (void)state;
    uint8_t *m = new_journal(BYTES);
    journal prod, cons;
    attach_both(m, &prod, &cons);
    publish_sized(&prod, 40, 0);
    publish_sized(&prod, 40, 1);
    publish_sized(&prod, 40, 2);
    journal_detach(&prod);
    ring_of(m)[40 + 35] ^= 2;
    assert_int_equal(journal_attach_producer(&prod, m, BYTES, GEN), 0);
    assert_true(journal_is_invalid(&prod));
    assert_non_null(strstr(kvcr_last_error(), "frame at 40 fails its checksum"));
    jrec r;
    assert_int_equal(journal_read_next(&cons, &r), KVCR_ECLOSED);
    journal_detach(&prod);
    journal_detach(&cons);
    free(m);
}

/* ---- two processes ------------------------------------------------------------------------- */

#define FORK_FRAMES 200000u

/* The child's whole life: publish FORK_FRAMES records as space allows. */
static int child_produce(uint8_t *m)
{
    journal prod;
    if (journal_attach_producer(&prod, m, BYTES, GEN) != 0) return 10;
    uint64_t deadline = now_ns() + DEADLINE_NS;
    uint8_t key[KVCR_KEY_MAX];
    for (uint64_t i = 0; i < FORK_FRAMES; i++) {
        jrec r;
        record(i, &r, key);
        while (journal_backlog(&prod) + journal_frame_bytes(r.key_len) > prod.cap) {
            if (now_ns() > deadline) return 12;
            sched_yield();
        }
        if (journal_publish(&prod, &r) != 0) return 11;
    }
    journal_detach(&prod);
    return 0;
}

static void test_a_forked_producer_feeds_its_parent_through_a_shared_mapping(void **state)
{
    (void)state;
    uint8_t *m = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(journal_format(m, BYTES, GEN), 0);
    journal cons;
    assert_int_equal(journal_attach_consumer(&cons, m, BYTES, GEN), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_produce(m));

    uint64_t deadline = now_ns() + DEADLINE_NS, got = 0;
    int rc = 0, status = 0;
    bool exited = false, wrong = false;
    while (got < FORK_FRAMES && !wrong) {
        jrec r;
        rc = journal_read_next(&cons, &r);
        if (rc < 0) break;
        if (rc == 1) {
            wrong = !record_matches(got, &r) || cons.seq != got + 1;
            got += !wrong;
            continue;
        }
        /* nothing new: the child may have died, or be slow */
        if (exited || now_ns() > deadline) break;
        exited = waitpid(pid, &status, WNOHANG) == pid; /* one more look after this */
        sched_yield();
    }
    if (!exited) {
        if (got < FORK_FRAMES) kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
    }
    if (rc < 0) fail_msg("read_next at frame %llu: %d %s", (unsigned long long)got, rc,
                         kvcr_last_error());
    if (wrong) fail_msg("frame %llu has the wrong content", (unsigned long long)got);
    if (got < FORK_FRAMES) fail_msg("%llu frames of %u", (unsigned long long)got, FORK_FRAMES);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(cons.cursor, word(m, 128));
    assert_true(cons.cursor > 100 * CAP);
    journal_detach(&cons);
    assert_int_equal(munmap(m, BYTES), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_and_frame_bytes_sit_at_their_documented_offsets),
        cmocka_unit_test(test_frame_bytes_are_head_key_and_padding_to_8),
        cmocka_unit_test(test_incarnations_sit_in_the_header_and_a_format_clears_them),
        cmocka_unit_test(test_put_and_remove_frames_round_trip),
        cmocka_unit_test(test_a_consumer_thread_reads_a_million_frames_as_a_thread_publishes_them),
        cmocka_unit_test(test_a_frame_split_by_the_ring_end_reads_whole),
        cmocka_unit_test(test_a_frame_ending_at_the_ring_end_is_followed_by_one_at_offset_0),
        cmocka_unit_test(test_a_full_ring_ends_recovery_for_both_sides),
        cmocka_unit_test(test_a_bad_record_is_refused_and_changes_nothing),
        cmocka_unit_test(test_a_journal_of_another_generation_or_size_refuses_to_attach),
        cmocka_unit_test(test_a_flipped_key_bit_is_caught),
        cmocka_unit_test(test_a_flipped_checksum_bit_is_caught),
        cmocka_unit_test(test_a_flipped_sequence_bit_is_caught),
        cmocka_unit_test(test_a_flipped_size_bit_is_caught),
        cmocka_unit_test(test_bad_fields_are_caught_even_when_sealed),
        cmocka_unit_test(test_put_frames_carry_the_router_hash),
        cmocka_unit_test(test_the_largest_frame_round_trips_with_its_padding),
        cmocka_unit_test(test_put_frames_carry_the_tenant_and_metadata),
        cmocka_unit_test(test_impossible_published_cursors_are_caught),
        cmocka_unit_test(test_a_torn_frame_is_caught),
        cmocka_unit_test(test_a_producer_seeing_an_impossible_consumed_cursor_ends_recovery),
        cmocka_unit_test(test_invalid_set_by_the_other_side_is_seen_on_the_next_call),
        cmocka_unit_test(test_format_makes_an_invalid_journal_valid_and_empty),
        cmocka_unit_test(test_replay_returns_exactly_the_frames_published),
        cmocka_unit_test(test_a_new_attachment_continues_at_the_cursors_and_numbering),
        cmocka_unit_test(test_a_corrupt_frame_before_the_cursor_makes_an_attachment_invalid),
        cmocka_unit_test(test_a_forked_producer_feeds_its_parent_through_a_shared_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
