/* The claim socket's protocol (client/frame.h): every message type
 * round-trips, the decoder refuses each rule it enforces (bad messages are
 * made by encoding a valid one, editing its msgpack object tree and packing
 * that again), the encoder refuses what the decoder would, and frames over
 * a socketpair carry 0, 1 or 2 descriptors while every framing error
 * (bad length, EOF mid-frame, too many or misplaced descriptors, other
 * ancillary data, a timeout) fails without leaking a descriptor. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvcr/error.h"
#include "client/frame.h"

/* ---- messages ---------------------------------------------------------------- */

static svc_msg claim(void)
{
    svc_msg m;
    memset(&m, 0, sizeof m);
    m.type = SVC_CLAIM;
    m.guard_index = 3;
    strcpy(m.digest, "sha256:0123456789abcdef");
    strcpy(m.agent, "engine-a");
    m.n_pools = 2;
    strcpy(m.pools[0].name, "");
    m.pools[0].block_size = 4096;
    strcpy(m.pools[1].name, "kv-\xc3\xa9");
    m.pools[1].block_size = 2u << 20;
    strcpy(m.control_host, "10.0.0.7");
    m.control_port = 5555;
    return m;
}

/* Journal 1 MiB, then two pools of 3 and 5 blocks. */
static svc_msg granted(void)
{
    svc_msg m;
    memset(&m, 0, sizeof m);
    m.type = SVC_GRANTED;
    m.guard_index = 3;
    m.generation = 0x123456789abcull;
    m.journal_bytes = 1u << 20;
    m.n_pools = 2;
    m.pools[0] = (svc_pool){"", 4096, 1u << 20, 3 * 4096};
    m.pools[1] = (svc_pool){"big", 2u << 20, (1u << 20) + 3 * 4096, 5 * (2u << 20)};
    m.mapping_bytes = m.pools[1].offset + m.pools[1].size;
    m.control_port = 40001;
    m.recovered = 77;
    return m;
}

static svc_msg simple(svc_type t)
{
    svc_msg m;
    memset(&m, 0, sizeof m);
    m.type = t;
    return m;
}

static svc_msg with_text(svc_type t, const char *text)
{
    svc_msg m = simple(t);
    m.text = (char *)text; /* only read: the test never clears these */
    return m;
}

static void same_fields(const svc_msg *a, const svc_msg *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->guard_index, b->guard_index);
    assert_string_equal(a->digest, b->digest);
    assert_string_equal(a->agent, b->agent);
    assert_int_equal(a->n_pools, b->n_pools);
    for (uint32_t i = 0; i < a->n_pools; i++) {
        assert_string_equal(a->pools[i].name, b->pools[i].name);
        assert_true(a->pools[i].block_size == b->pools[i].block_size);
        assert_true(a->pools[i].offset == b->pools[i].offset);
        assert_true(a->pools[i].size == b->pools[i].size);
    }
    assert_string_equal(a->control_host, b->control_host);
    assert_int_equal(a->control_port, b->control_port);
    assert_true(a->generation == b->generation);
    assert_true(a->mapping_bytes == b->mapping_bytes);
    assert_true(a->journal_bytes == b->journal_bytes);
    assert_true(a->recovered == b->recovered);
    assert_int_equal(a->activated, b->activated);
    assert_string_equal(a->kv_endpoint, b->kv_endpoint);
    assert_string_equal(a->kv_replay, b->kv_replay);
    assert_string_equal(a->kv_topic, b->kv_topic);
    assert_int_equal(a->kv_dp_rank, b->kv_dp_rank);
    assert_string_equal(a->kv_medium_dram, b->kv_medium_dram);
    assert_string_equal(a->kv_medium_g3, b->kv_medium_g3);
    assert_int_equal(a->kv_positional, b->kv_positional);
    if (a->type == SVC_ERROR || a->type == SVC_METRICS) assert_string_equal(a->text, b->text);
    else assert_null(b->text);
}

/* Encodes m, decodes a copy that is then scribbled over and freed (the
 * decoded message owns its text), compares, and re-encodes to the same
 * bytes. */
static void roundtrip(const svc_msg *m)
{
    uint8_t *buf, *again;
    size_t len, again_len;
    if (svc_encode(m, &buf, &len) != 0) fail_msg("encode refused: %s", kvcr_last_error());
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    memcpy(copy, buf, len);
    svc_msg d;
    if (svc_decode(copy, len, &d) != 0) fail_msg("decode refused: %s", kvcr_last_error());
    memset(copy, 0xa5, len);
    free(copy);
    same_fields(m, &d);
    assert_int_equal(svc_encode(&d, &again, &again_len), 0);
    assert_int_equal(again_len, len);
    assert_memory_equal(again, buf, len);
    svc_msg_clear(&d);
    assert_null(d.text);
    free(buf);
    free(again);
}

static void test_every_type_round_trips(void **state)
{
    (void)state;
    svc_msg m = claim();
    roundtrip(&m);
    /* The extremes of every claim field. */
    m.guard_index = UINT32_MAX;
    memset(m.digest, 'd', SVC_DIGEST_MAX);
    m.digest[SVC_DIGEST_MAX] = 0;
    memset(m.agent, 'a', KVCR_NAME_MAX - 1);
    memset(m.control_host, 'h', SVC_HOST_MAX);
    m.control_port = 0;
    m.n_pools = KVCR_MAX_POOLS;
    for (uint32_t i = 0; i < KVCR_MAX_POOLS; i++) {
        memset(m.pools[i].name, 'a' + i % 26, KVCR_NAME_MAX - 1);
        m.pools[i].block_size = i == 5 ? UINT64_MAX : i + 1;
    }
    roundtrip(&m);
    m = claim(), m.control_port = 65535, m.n_pools = 1, strcpy(m.digest, "x");
    strcpy(m.agent, "a"), strcpy(m.control_host, "h");
    roundtrip(&m);
    /* KV events: every string at its longest, the positional form. */
    m = claim();
    memset(m.kv_endpoint, 'e', SVC_KV_MAX), memset(m.kv_replay, 'r', SVC_KV_MAX);
    memset(m.kv_topic, 't', SVC_KV_MAX), m.kv_dp_rank = UINT32_MAX;
    memset(m.kv_medium_dram, 'c', SVC_KV_MAX), memset(m.kv_medium_g3, 's', SVC_KV_MAX);
    m.kv_positional = true;
    roundtrip(&m);

    m = granted();
    roundtrip(&m);
    m.guard_index = UINT32_MAX, m.generation = UINT64_MAX, m.recovered = UINT64_MAX;
    m.control_port = 1;
    roundtrip(&m);
    /* One pool ending at the very top of the u64 range. */
    m = granted(), m.n_pools = 1, m.journal_bytes = 0;
    m.pools[0] = (svc_pool){"x", 1, 0, UINT64_MAX};
    m.mapping_bytes = UINT64_MAX, m.control_port = 65535;
    roundtrip(&m);
    m = granted(), m.n_pools = KVCR_MAX_POOLS;
    for (uint32_t i = 0; i < KVCR_MAX_POOLS; i++)
        m.pools[i] = (svc_pool){"p", 512, m.journal_bytes + i * 1024ull, 1024};
    m.mapping_bytes = m.journal_bytes + KVCR_MAX_POOLS * 1024ull;
    roundtrip(&m);

    m = simple(SVC_RELEASE), m.activated = true;
    roundtrip(&m);
    m.activated = false;
    roundtrip(&m);
    m = simple(SVC_RELEASED);
    roundtrip(&m);
    m = simple(SVC_STATS);
    roundtrip(&m);
    m = with_text(SVC_ERROR, "no such guard: 9");
    roundtrip(&m);
    m = with_text(SVC_ERROR, "x");
    roundtrip(&m);
    m = with_text(SVC_METRICS, "");
    roundtrip(&m);
    m = with_text(SVC_METRICS, "# TYPE kvcr_guard_claims counter\nkvcr_guard_claims 3\n");
    roundtrip(&m);
    /* The longest text still fits a frame. */
    char *big = malloc(SVC_TEXT_MAX + 1);
    assert_non_null(big);
    memset(big, 'm', SVC_TEXT_MAX);
    big[SVC_TEXT_MAX] = 0;
    m = with_text(SVC_METRICS, big);
    roundtrip(&m);
    m.type = SVC_ERROR;
    roundtrip(&m);
    free(big);
}

static void test_the_encoder_writes_exactly_the_type_fields(void **state)
{
    (void)state;
    /* Fields a type does not carry are not written (and so decode as 0). */
    svc_msg m = claim();
    m.generation = 9, m.recovered = 9, m.activated = true, m.mapping_bytes = 9;
    uint8_t *buf;
    size_t len;
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    svc_msg d;
    assert_int_equal(svc_decode(buf, len, &d), 0);
    assert_true(d.generation == 0 && d.recovered == 0 && !d.activated && d.mapping_bytes == 0);
    free(buf);
    m = simple(SVC_STATS);
    m.guard_index = 4, m.n_pools = 0, strcpy(m.digest, "ignored");
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    assert_int_equal(svc_decode(buf, len, &d), 0);
    assert_int_equal(d.guard_index, 0);
    assert_string_equal(d.digest, "");
    free(buf);
    /* A stats message is {"v": 3, "type": "stats"}, v first. */
    static const uint8_t stats[] = {0x82, 0xa1, 'v', 0x03, 0xa4, 't', 'y', 'p', 'e',
                                    0xa5, 's', 't', 'a', 't', 's'};
    m = simple(SVC_STATS);
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    assert_int_equal(len, sizeof stats);
    assert_memory_equal(buf, stats, len);
    free(buf);
}

/* ---- editing an encoded message -------------------------------------------------- */

static msgpack_object U(uint64_t v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.u64 = v;
    return o;
}

static msgpack_object NEG(int64_t v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_NEGATIVE_INTEGER};
    o.via.i64 = v;
    return o;
}

static msgpack_object F64(double v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = v;
    return o;
}

static msgpack_object BOOL(bool v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_BOOLEAN};
    o.via.boolean = v;
    return o;
}

static msgpack_object NIL(void)
{
    return (msgpack_object){.type = MSGPACK_OBJECT_NIL};
}

static msgpack_object STRN(const char *s, size_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)n;
    return o;
}
#define STR(s) STRN((s), sizeof(s) - 1)

static msgpack_object BIN(const char *s, size_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_BIN};
    o.via.bin.ptr = s;
    o.via.bin.size = (uint32_t)n;
    return o;
}

static msgpack_object ARR(msgpack_object *p, uint32_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_ARRAY};
    o.via.array.ptr = p;
    o.via.array.size = n;
    return o;
}

static uint8_t *pack(const msgpack_object *o, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(msgpack_pack_object(&pk, *o), 0);
    *len = sb.size;
    return (uint8_t *)msgpack_sbuffer_release(&sb);
}

enum edit { SET, ADD, DEL };

/* The encoding of m with its root map edited: SET replaces key's value
 * (adding it when absent), ADD appends key whatever is there, DEL removes
 * it. The result is malloc'd. */
static uint8_t *edited(const svc_msg *m, enum edit how, const char *key, msgpack_object val,
                       size_t *len)
{
    uint8_t *buf;
    size_t blen, off = 0;
    if (svc_encode(m, &buf, &blen) != 0) fail_msg("encode refused: %s", kvcr_last_error());
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    assert_int_equal(msgpack_unpack_next(&up, (const char *)buf, blen, &off),
                     MSGPACK_UNPACK_SUCCESS);
    msgpack_object_map *root = &up.data.via.map;
    msgpack_object_kv kv[32];
    uint32_t n = 0;
    bool done = false;
    for (uint32_t i = 0; i < root->size; i++) {
        const msgpack_object *k = &root->ptr[i].key;
        size_t n_key = strlen(key);
        bool match = k->via.str.size == n_key && memcmp(k->via.str.ptr, key, n_key) == 0;
        if (match && how == DEL) continue;
        kv[n] = root->ptr[i];
        if (match && how == SET) kv[n].val = val, done = true;
        n++;
    }
    if (how == ADD || (how == SET && !done))
        kv[n++] = (msgpack_object_kv){STRN(key, strlen(key)), val};
    msgpack_object o = {.type = MSGPACK_OBJECT_MAP};
    o.via.map.ptr = kv;
    o.via.map.size = n;
    uint8_t *out = pack(&o, len);
    msgpack_unpacked_destroy(&up);
    free(buf);
    return out;
}

static bool all_zero(const svc_msg *m)
{
    const uint8_t *p = (const uint8_t *)m;
    for (size_t i = 0; i < sizeof *m; i++)
        if (p[i] != 0) return false;
    return true;
}

/* Decoding buf fails with KVCR_EPROTO, a message naming why (loosely:
 * a substring) and a zeroed message. Frees buf. */
static void refused_at(uint8_t *buf, size_t len, const char *why, int line)
{
    svc_msg d;
    memset(&d, 0xa5, sizeof d);
    int rc = svc_decode(buf, len, &d);
    if (rc != KVCR_EPROTO || strstr(kvcr_last_error(), why) == NULL || !all_zero(&d))
        fail_msg("line %d: rc %d, error \"%s\", wanted EPROTO and \"%s\"%s", line, rc,
                 kvcr_last_error(), why, all_zero(&d) ? "" : " (message not zeroed)");
    free(buf);
}
#define REFUSED(buf, len, why) refused_at((buf), (len), (why), __LINE__)
#define REFUSED_EDIT(m, how, key, val, why)                                                  \
    do {                                                                                      \
        size_t len_;                                                                          \
        uint8_t *buf_ = edited(&(m), (how), (key), (val), &len_);                             \
        REFUSED(buf_, len_, (why));                                                           \
    } while (0)

/* A pools array of n objects built from p[] (w of 2 or 4 fields each),
 * unvalidated, so layout rules can be broken. */
static msgpack_object pools_of(const svc_pool *p, uint32_t n, uint32_t w, msgpack_object *store)
{
    msgpack_object *rows = store, *cells = store + n;
    for (uint32_t i = 0; i < n; i++) {
        msgpack_object *c = cells + i * w;
        c[0] = STRN(p[i].name, strlen(p[i].name));
        c[1] = U(p[i].block_size);
        if (w == 4) c[2] = U(p[i].offset), c[3] = U(p[i].size);
        rows[i] = ARR(c, w);
    }
    return ARR(rows, n);
}

/* A pools array of one pool of n cells. */
static msgpack_object one_pool(msgpack_object *row, msgpack_object *cells, uint32_t n)
{
    *row = ARR(cells, n);
    return ARR(row, 1);
}

static void test_envelope_rules(void **state)
{
    (void)state;
    svc_msg m = claim();
    REFUSED_EDIT(m, SET, "v", U(SVC_PROTOCOL_VERSION + 1), "version");
    REFUSED_EDIT(m, SET, "v", U(1), "version"); /* before claims carried KV events */
    REFUSED_EDIT(m, SET, "v", U(2), "version 2 (v must be 3"); /* before their media */
    REFUSED_EDIT(m, SET, "v", U(0), "version");
    REFUSED_EDIT(m, SET, "v", STR("2"), "version");
    REFUSED_EDIT(m, DEL, "v", NIL(), "missing field: v");
    REFUSED_EDIT(m, DEL, "type", NIL(), "missing field: type");
    REFUSED_EDIT(m, SET, "type", STR("claims"), "unknown message type");
    REFUSED_EDIT(m, SET, "type", STR(""), "unknown message type");
    REFUSED_EDIT(m, SET, "type", U(1), "type: not a str");
    REFUSED_EDIT(m, ADD, "colour", U(1), "unknown key");
    REFUSED_EDIT(m, ADD, "v", U(1), "duplicate key: v");
    REFUSED_EDIT(m, ADD, "agent", STR("engine-a"), "duplicate key: agent");
    /* Keys must be strs. */
    msgpack_object_kv kv[2] = {{STR("v"), U(1)}, {U(7), STR("stats")}};
    msgpack_object o = {.type = MSGPACK_OBJECT_MAP};
    o.via.map.ptr = kv, o.via.map.size = 2;
    size_t len;
    uint8_t *buf = pack(&o, &len);
    REFUSED(buf, len, "key is not a str");
    /* The root must be a map. */
    msgpack_object items[2] = {STR("v"), U(1)};
    o = ARR(items, 2);
    buf = pack(&o, &len);
    REFUSED(buf, len, "not a map");
    o = STR("stats");
    buf = pack(&o, &len);
    REFUSED(buf, len, "not a map");
}

static void test_fields_each_type_requires_and_allows(void **state)
{
    (void)state;
    static const char *const claim_keys[] = {"guard_index", "digest", "agent", "pools",
                                             "control_host", "control_port"};
    static const char *const granted_keys[] = {"guard_index", "generation", "mapping_bytes",
                                               "journal_bytes", "pools", "control_port",
                                               "recovered"};
    svc_msg m = claim();
    for (size_t i = 0; i < sizeof claim_keys / sizeof *claim_keys; i++)
        REFUSED_EDIT(m, DEL, claim_keys[i], NIL(), claim_keys[i]);
    REFUSED_EDIT(m, SET, "generation", U(1), "claim: field not allowed: generation");
    REFUSED_EDIT(m, SET, "recovered", U(1), "recovered");
    REFUSED_EDIT(m, SET, "text", STR("x"), "text");
    m = granted();
    for (size_t i = 0; i < sizeof granted_keys / sizeof *granted_keys; i++)
        REFUSED_EDIT(m, DEL, granted_keys[i], NIL(), granted_keys[i]);
    REFUSED_EDIT(m, SET, "digest", STR("d"), "granted: field not allowed: digest");
    REFUSED_EDIT(m, SET, "activated", BOOL(true), "activated");
    m = simple(SVC_RELEASE);
    REFUSED_EDIT(m, DEL, "activated", NIL(), "release: missing field: activated");
    REFUSED_EDIT(m, SET, "message", STR("x"), "release: field not allowed: message");
    m = simple(SVC_RELEASED);
    REFUSED_EDIT(m, SET, "activated", BOOL(true), "released: field not allowed");
    m = simple(SVC_STATS);
    REFUSED_EDIT(m, SET, "text", STR(""), "stats: field not allowed");
    m = with_text(SVC_ERROR, "why");
    REFUSED_EDIT(m, DEL, "message", NIL(), "error: missing field: message");
    REFUSED_EDIT(m, SET, "text", STR("why"), "error: field not allowed: text");
    m = with_text(SVC_METRICS, "x 1\n");
    REFUSED_EDIT(m, DEL, "text", NIL(), "metrics: missing field: text");
    REFUSED_EDIT(m, SET, "message", STR("x"), "metrics: field not allowed: message");
}

static void test_types_and_ranges(void **state)
{
    (void)state;
    svc_msg m = claim();
    static char long_str[SVC_TEXT_MAX + 2];
    memset(long_str, 'x', sizeof long_str);
    /* guard_index: a u32. */
    REFUSED_EDIT(m, SET, "guard_index", U(1ull << 32), "guard_index");
    REFUSED_EDIT(m, SET, "guard_index", NEG(-1), "guard_index");
    REFUSED_EDIT(m, SET, "guard_index", F64(1.0), "guard_index");
    REFUSED_EDIT(m, SET, "guard_index", STR("3"), "guard_index");
    /* digest: 1..SVC_DIGEST_MAX bytes, no NUL, a str (not a bin). */
    REFUSED_EDIT(m, SET, "digest", STR(""), "digest");
    REFUSED_EDIT(m, SET, "digest", STRN(long_str, SVC_DIGEST_MAX + 1), "digest");
    REFUSED_EDIT(m, SET, "digest", STR("ab\0cd"), "digest");
    REFUSED_EDIT(m, SET, "digest", BIN("abcd", 4), "digest");
    /* agent: 1..KVCR_NAME_MAX-1 bytes, no NUL. */
    REFUSED_EDIT(m, SET, "agent", STR(""), "agent");
    REFUSED_EDIT(m, SET, "agent", STRN(long_str, KVCR_NAME_MAX), "agent");
    REFUSED_EDIT(m, SET, "agent", STR("\0"), "agent");
    REFUSED_EDIT(m, SET, "agent", NIL(), "agent");
    /* control_host: 0..SVC_HOST_MAX bytes, no NUL; empty (no endpoint) only with port 0. */
    REFUSED_EDIT(m, SET, "control_host", STR(""), "control_port");
    REFUSED_EDIT(m, SET, "control_host", STRN(long_str, SVC_HOST_MAX + 1), "control_host");
    REFUSED_EDIT(m, SET, "control_host", STR("host\0"), "control_host");
    /* control_port: 0..65535. */
    REFUSED_EDIT(m, SET, "control_port", U(65536), "control_port");
    REFUSED_EDIT(m, SET, "control_port", U(1ull << 40), "control_port");
    REFUSED_EDIT(m, SET, "control_port", NEG(-1), "control_port");
    /* The KV events' media (strs of 0..SVC_KV_MAX bytes, both with an
     * endpoint, none without) and form (a bool). */
    REFUSED_EDIT(m, SET, "kv_medium_dram", U(1), "kv_medium_dram");
    REFUSED_EDIT(m, SET, "kv_medium_g3", STRN(long_str, SVC_KV_MAX + 1), "kv_medium_g3");
    REFUSED_EDIT(m, SET, "kv_medium_g3", STR("CPU"), "without an endpoint");
    REFUSED_EDIT(m, SET, "kv_positional", U(1), "kv_positional: not a bool");
    REFUSED_EDIT(m, SET, "kv_positional", BOOL(true), "without an endpoint");
    REFUSED_EDIT(m, DEL, "kv_medium_dram", NIL(), "missing field: kv_medium_dram");
    m = granted();
    REFUSED_EDIT(m, SET, "control_port", U(65536), "control_port");
    REFUSED_EDIT(m, SET, "generation", NEG(-5), "generation");
    REFUSED_EDIT(m, SET, "recovered", BOOL(false), "recovered");
    REFUSED_EDIT(m, SET, "mapping_bytes", STR("1"), "mapping_bytes");
    REFUSED_EDIT(m, SET, "journal_bytes", F64(4096), "journal_bytes");
    /* activated: a bool, not 0/1. */
    m = simple(SVC_RELEASE);
    REFUSED_EDIT(m, SET, "activated", U(1), "activated");
    REFUSED_EDIT(m, SET, "activated", NIL(), "activated");
    /* Texts: strs without NUL; an error's is not empty; at most SVC_TEXT_MAX. */
    m = with_text(SVC_ERROR, "x");
    REFUSED_EDIT(m, SET, "message", STR(""), "message");
    REFUSED_EDIT(m, SET, "message", STR("bad\0news"), "NUL");
    REFUSED_EDIT(m, SET, "message", BIN("x", 1), "message");
    REFUSED_EDIT(m, SET, "message", STRN(long_str, SVC_TEXT_MAX + 1), "message");
    m = with_text(SVC_METRICS, "x");
    REFUSED_EDIT(m, SET, "text", STR("a 1\n\0"), "NUL");
    REFUSED_EDIT(m, SET, "text", U(0), "text");
    REFUSED_EDIT(m, SET, "text", STRN(long_str, SVC_TEXT_MAX + 1), "text");
}

static void test_pool_rules(void **state)
{
    (void)state;
    msgpack_object store[KVCR_MAX_POOLS * 5 + 5], cells[4], row;
    svc_pool p[KVCR_MAX_POOLS + 1];
    svc_msg m = claim();
    /* 1..KVCR_MAX_POOLS pools. */
    REFUSED_EDIT(m, SET, "pools", ARR(NULL, 0), "pools");
    for (uint32_t i = 0; i <= KVCR_MAX_POOLS; i++) p[i] = (svc_pool){"p", 64, 0, 0};
    REFUSED_EDIT(m, SET, "pools", pools_of(p, KVCR_MAX_POOLS + 1, 2, store), "pools");
    REFUSED_EDIT(m, SET, "pools", U(1), "pools: not an array");
    /* Each pool is [name, block_size] in a claim. */
    p[0] = (svc_pool){"p", 0, 0, 0};
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 1, 2, store), "block_size is 0");
    p[0] = (svc_pool){"p", 64, 0, 64};
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 1, 4, store), "pools[0]: not an array of 2");
    cells[0] = STR("p");
    REFUSED_EDIT(m, SET, "pools", one_pool(&row, cells, 1), "not an array of 2");
    cells[1] = NEG(-64);
    REFUSED_EDIT(m, SET, "pools", one_pool(&row, cells, 2), "pools[0]");
    cells[0] = U(1), cells[1] = U(64);
    REFUSED_EDIT(m, SET, "pools", one_pool(&row, cells, 2), "name");
    cells[0] = STR("a\0b");
    REFUSED_EDIT(m, SET, "pools", one_pool(&row, cells, 2), "name");
    char long_name[KVCR_NAME_MAX];
    memset(long_name, 'n', sizeof long_name);
    cells[0] = STRN(long_name, KVCR_NAME_MAX);
    REFUSED_EDIT(m, SET, "pools", one_pool(&row, cells, 2), "name");
    row = NIL();
    REFUSED_EDIT(m, SET, "pools", ARR(&row, 1), "pools[0]");

    /* A granted's pools: [name, block_size, offset, size], back to back
     * from journal_bytes to mapping_bytes, whole blocks each. */
    m = granted();
    svc_pool g[2] = {m.pools[0], m.pools[1]};
    REFUSED_EDIT(m, SET, "pools", pools_of(g, 2, 2, store), "not an array of 4");
    p[0] = g[0], p[1] = g[1], p[0].offset -= 4096; /* starts inside the journal */
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "pools[0] offset");
    p[0] = g[0], p[1] = g[1], p[1].offset += 4096; /* a gap */
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "pools[1] offset");
    p[0] = g[0], p[1] = g[1], p[1].offset -= 4096; /* an overlap */
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "pools[1] offset");
    p[0] = g[0], p[1] = g[1], p[0].size = 0, p[1].offset = g[0].offset;
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "holds no block");
    p[0] = g[0], p[1] = g[1], p[0].size = 4095, p[1].offset = g[0].offset + 4095;
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "holds no block");
    p[0] = g[0], p[1] = g[1], p[1].block_size = 0;
    REFUSED_EDIT(m, SET, "pools", pools_of(p, 2, 4, store), "block_size is 0");
    REFUSED_EDIT(m, SET, "pools", pools_of(g, 1, 4, store), "mapping_bytes"); /* ends short */
    REFUSED_EDIT(m, SET, "mapping_bytes", U(m.mapping_bytes + 4096), "mapping_bytes");
    REFUSED_EDIT(m, SET, "mapping_bytes", U(m.mapping_bytes - 4096), "mapping_bytes");
    REFUSED_EDIT(m, SET, "journal_bytes", U(m.mapping_bytes), "journal_bytes");
    REFUSED_EDIT(m, SET, "journal_bytes", U(UINT64_MAX), "journal_bytes");
    /* Sizes that wrap the u64 range. */
    p[0] = (svc_pool){"a", 1, 4096, UINT64_MAX - 4095};
    p[1] = (svc_pool){"b", 1, 0, 8192};
    svc_msg w = m;
    w.journal_bytes = 4096, w.mapping_bytes = 4096 + 8192, w.n_pools = 1;
    w.pools[0] = (svc_pool){"b", 1, 4096, 8192};
    REFUSED_EDIT(w, SET, "pools", pools_of(p, 2, 4, store), "beyond mapping_bytes");
    p[0].size = UINT64_MAX; /* 4096 + size overflows */
    REFUSED_EDIT(w, SET, "pools", pools_of(p, 1, 4, store), "beyond mapping_bytes");
}

/* Hand-made bytes: what the pre-scan stops before msgpack-c allocates. */
static uint8_t *bytes(const void *p, size_t n)
{
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    memcpy(b, p, n);
    return b;
}
#define REFUSED_RAW(lit, why) REFUSED(bytes((lit), sizeof(lit) - 1), sizeof(lit) - 1, (why))

static void test_malformed_and_hostile_msgpack(void **state)
{
    (void)state;
    REFUSED_RAW("", "empty");
    REFUSED_RAW("\xdf\xff\xff\xff\xff", "container longer"); /* map32 of 4 G entries */
    REFUSED_RAW("\xdd\xff\xff\xff\xff\xc0", "container longer");
    REFUSED_RAW("\x81\xa1v\xdc\x7f\xff\xc0\xc0", "container longer");
    REFUSED_RAW("\x81\xa1v\xdb\xff\xff\xff\xff" "abc", "truncated");
    REFUSED_RAW("\x81\xa1v\xc6\x00\x00\x10\x00", "truncated");
    REFUSED_RAW("\x81\xa1v\xcf\x00\x00", "truncated");
    REFUSED_RAW("\x81\xa1v\xc1", "0xc1");
    REFUSED_RAW("\x81\xa1v\xd4\x01\x02", "ext");
    REFUSED_RAW("\x81\xa1v\xc7\x01\x05\x00", "ext");
    REFUSED_RAW("\x82\xa1v\x01\xa1t", "truncated");
    /* Anything after the message. */
    svc_msg m = simple(SVC_STATS);
    uint8_t *buf;
    size_t len;
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    uint8_t *more = realloc(buf, len + 1);
    assert_non_null(more);
    more[len] = 0xc0;
    REFUSED(more, len + 1, "trailing");
    /* Every proper prefix of a valid message is refused. */
    m = granted();
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    for (size_t i = 0; i < len; i++) REFUSED(bytes(buf, i), i, "");
    free(buf);
    /* Many small objects where a few are expected: refused before msgpack-c
     * builds them, however well they fit the bytes. */
    static msgpack_object nils[1000];
    for (int i = 0; i < 1000; i++) nils[i] = NIL();
    m = claim();
    REFUSED_EDIT(m, SET, "pools", ARR(nils, 1000), "more msgpack objects");
    /* Nesting deeper than a granted's pools (msgpack-c itself would stop
     * at 32 levels, calling it out of memory). */
    msgpack_object cell = U(1), lvl[40];
    lvl[0] = ARR(&cell, 1);
    for (int i = 1; i < 40; i++) lvl[i] = ARR(&lvl[i - 1], 1);
    m = claim();
    REFUSED_EDIT(m, SET, "pools", ARR(&lvl[0], 1), "not an array of 2"); /* depth 3: fine */
    REFUSED_EDIT(m, SET, "pools", ARR(&lvl[1], 1), "nested deeper");
    REFUSED_EDIT(m, SET, "pools", lvl[39], "nested deeper");
    REFUSED_RAW("\x81\xa1v\x81\xa1v\x81\xa1v\x81\xa1v\x01", "nested deeper");
    /* Over SVC_FRAME_MAX bytes, whatever they are. */
    uint8_t *huge = calloc(SVC_FRAME_MAX + 1, 1);
    assert_non_null(huge);
    REFUSED(huge, SVC_FRAME_MAX + 1, "over");
}

static void expect_unencodable(const svc_msg *m, const char *why, int line)
{
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    int rc = svc_encode(m, &buf, &len);
    if (rc != KVCR_EINVAL || strstr(kvcr_last_error(), why) == NULL)
        fail_msg("line %d: rc %d, error \"%s\", wanted EINVAL and \"%s\"", line, rc,
                 kvcr_last_error(), why);
    assert_null(buf);
    assert_int_equal(len, 0);
}
#define UNENCODABLE(m, why) expect_unencodable(&(m), (why), __LINE__)

static void test_encoder_refuses_what_the_decoder_refuses(void **state)
{
    (void)state;
    svc_msg m = simple(0);
    UNENCODABLE(m, "type");
    m.type = SVC_METRICS + 1;
    UNENCODABLE(m, "type");
    m = claim(), m.digest[0] = 0;
    UNENCODABLE(m, "digest");
    m = claim(), memset(m.digest, 'd', sizeof m.digest); /* not terminated */
    UNENCODABLE(m, "NUL-terminated");
    m = claim(), memset(m.digest, 'd', SVC_DIGEST_MAX), m.digest[SVC_DIGEST_MAX] = 0;
    roundtrip(&m);
    m = claim(), m.agent[0] = 0;
    UNENCODABLE(m, "agent");
    m = claim(), memset(m.pools[1].name, 'n', KVCR_NAME_MAX);
    UNENCODABLE(m, "name");
    m = claim(), memset(m.control_host, 'h', sizeof m.control_host);
    UNENCODABLE(m, "control_host");
    m = claim(), m.control_port = 65536;
    UNENCODABLE(m, "control_port");
    m = claim(), m.n_pools = 0;
    UNENCODABLE(m, "pools");
    m = claim(), m.n_pools = KVCR_MAX_POOLS + 1;
    UNENCODABLE(m, "pools");
    m = claim(), m.pools[1].block_size = 0;
    UNENCODABLE(m, "block_size");
    m = claim(), m.pools[0].size = 4096; /* a claim's pools have no place */
    UNENCODABLE(m, "offset or size");
    m = claim(), m.control_host[0] = '\0', m.control_port = 80;
    UNENCODABLE(m, "control_port");
    /* KV events: media and form only with an endpoint, and both media
     * with one. */
    m = claim(), m.kv_positional = true;
    UNENCODABLE(m, "without an endpoint");
    m = claim(), strcpy(m.kv_medium_g3, "STORAGE");
    UNENCODABLE(m, "without an endpoint");
    m = claim(), strcpy(m.kv_endpoint, "tcp://*:5600"), strcpy(m.kv_medium_dram, "CPU");
    UNENCODABLE(m, "both medium names");
    strcpy(m.kv_medium_g3, "DISK");
    roundtrip(&m);
    m.kv_medium_g3[0] = '\0', memset(m.kv_medium_dram, 'c', sizeof m.kv_medium_dram);
    UNENCODABLE(m, "NUL-terminated");
    m = granted(), m.pools[1].offset += 1;
    UNENCODABLE(m, "offset");
    m = granted(), m.mapping_bytes += 4096;
    UNENCODABLE(m, "mapping_bytes");
    m = granted(), m.journal_bytes = m.mapping_bytes;
    UNENCODABLE(m, "journal_bytes");
    m = granted(), m.pools[0].size = 4095, m.pools[1].offset = m.pools[0].offset + 4095;
    m.mapping_bytes = m.pools[1].offset + m.pools[1].size;
    UNENCODABLE(m, "holds no block");
    m = with_text(SVC_ERROR, NULL);
    UNENCODABLE(m, "message");
    m = with_text(SVC_ERROR, "");
    UNENCODABLE(m, "message");
    m = with_text(SVC_METRICS, NULL);
    UNENCODABLE(m, "text");
    char *big = malloc(SVC_TEXT_MAX + 2);
    assert_non_null(big);
    memset(big, 't', SVC_TEXT_MAX + 1);
    big[SVC_TEXT_MAX + 1] = 0;
    m = with_text(SVC_METRICS, big);
    UNENCODABLE(m, "text");
    free(big);
    /* Fields of other types do not matter: a release with junk pools. */
    m = simple(SVC_RELEASE), m.n_pools = 1000, memset(m.digest, 'x', sizeof m.digest);
    uint8_t *buf;
    size_t len;
    assert_int_equal(svc_encode(&m, &buf, &len), 0);
    free(buf);
}

/* ---- frames ------------------------------------------------------------------- */

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL) n++;
    closedir(d);
    return n;
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

static void send_raw(int sock, const void *data, size_t len, const int *fds, size_t n_fds)
{
    struct iovec iov = {(void *)data, len};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * 16)];
    } ctrl;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n_fds > 0) {
        memset(&ctrl, 0, sizeof ctrl);
        mh.msg_control = ctrl.b;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
    }
    assert_int_equal(sendmsg(sock, &mh, MSG_NOSIGNAL), (ssize_t)len);
}

/* A memfd holding text, to pass and read back. */
static int memfd_with(const char *text)
{
    int fd = memfd_create("kvcr-frame-test", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

static void same_file(int a, int b)
{
    struct stat sa, sb;
    assert_int_equal(fstat(a, &sa), 0);
    assert_int_equal(fstat(b, &sb), 0);
    assert_true(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
    assert_true(fcntl(b, F_GETFD) & FD_CLOEXEC); /* MSG_CMSG_CLOEXEC */
}

static void recv_expect(int sock, size_t max_fds, int want, const char *why, int line)
{
    uint8_t *payload = (uint8_t *)1;
    size_t len = 1, n_fds = 9;
    int fds[SVC_MAX_FDS + 1] = {-1, -1, -1};
    int rc = svc_recv_frame(sock, &payload, &len, fds, max_fds, &n_fds, 2000);
    if (rc != want || (why && strstr(kvcr_last_error(), why) == NULL))
        fail_msg("line %d: rc %d, error \"%s\", wanted %d and \"%s\"", line, rc, kvcr_last_error(),
                 want, why ? why : "");
    assert_null(payload);
    assert_int_equal(len, 0);
    assert_int_equal(n_fds, 0);
}
#define RECV_FAILS(sock, max_fds, want, why) recv_expect((sock), (max_fds), (want), (why), __LINE__)

static void test_frames_carry_zero_one_and_two_descriptors(void **state)
{
    (void)state;
    int before = open_fds();
    int sv[2], p[2];
    pair(sv);
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    int mfd = memfd_with("pool file contents");

    /* No descriptors, then one (a pipe's read end), then two. */
    svc_msg m = simple(SVC_STATS), d;
    int fds[SVC_MAX_FDS], got[SVC_MAX_FDS] = {-1, -1};
    size_t n;
    assert_int_equal(svc_send(sv[0], &m, NULL, 0), 0);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    assert_int_equal(d.type, SVC_STATS);
    assert_int_equal(n, 0);

    m = claim();
    fds[0] = p[0];
    assert_int_equal(svc_send(sv[0], &m, fds, 1), 0);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    same_fields(&m, &d);
    assert_int_equal(n, 1);
    same_file(p[0], got[0]);
    assert_int_equal(write(p[1], "ping", 4), 4);
    char buf[32] = {0};
    assert_int_equal(read(got[0], buf, sizeof buf), 4); /* read through the received end */
    assert_string_equal(buf, "ping");
    close(got[0]);

    m = granted();
    fds[0] = mfd, fds[1] = p[0];
    assert_int_equal(svc_send(sv[0], &m, fds, 2), 0);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    same_fields(&m, &d);
    assert_int_equal(n, 2);
    same_file(mfd, got[0]);
    same_file(p[0], got[1]);
    memset(buf, 0, sizeof buf);
    assert_int_equal(pread(got[0], buf, sizeof buf, 0), 18);
    assert_string_equal(buf, "pool file contents");
    close(got[0]);
    close(got[1]);

    /* Frames queued back to back keep their own descriptors. */
    m = with_text(SVC_ERROR, "first");
    assert_int_equal(svc_send(sv[0], &m, &mfd, 1), 0);
    m = with_text(SVC_METRICS, "second");
    assert_int_equal(svc_send(sv[0], &m, &p[0], 1), 0);
    m = simple(SVC_RELEASED);
    assert_int_equal(svc_send(sv[0], &m, NULL, 0), 0);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    assert_string_equal(d.text, "first");
    assert_int_equal(n, 1);
    same_file(mfd, got[0]);
    close(got[0]);
    svc_msg_clear(&d);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    assert_string_equal(d.text, "second");
    assert_int_equal(n, 1);
    same_file(p[0], got[0]);
    close(got[0]);
    svc_msg_clear(&d);
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), 0);
    assert_int_equal(d.type, SVC_RELEASED);
    assert_int_equal(n, 0);

    /* A raw frame reads back as its own bytes. */
    assert_int_equal(svc_send_frame(sv[0], (const uint8_t *)"\xc0", 1, NULL, 0), 0);
    uint8_t *payload;
    size_t len;
    assert_int_equal(svc_recv_frame(sv[1], &payload, &len, NULL, 0, &n, 2000), 0);
    assert_int_equal(len, 1);
    assert_int_equal(payload[0], 0xc0);
    free(payload);

    close(sv[0]), close(sv[1]), close(p[0]), close(p[1]), close(mfd);
    assert_int_equal(open_fds(), before);
}

struct big_send {
    int sock;
    const svc_msg *m;
    int rc;
};

static void *send_big(void *arg)
{
    struct big_send *b = arg;
    b->rc = svc_send(b->sock, b->m, NULL, 0);
    return NULL;
}

/* The largest frame, through a socket buffer far smaller: short writes on
 * one side, short reads on the other. */
static void test_largest_frame(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    char *big = malloc(SVC_TEXT_MAX + 1);
    assert_non_null(big);
    for (size_t i = 0; i < SVC_TEXT_MAX; i++) big[i] = (char)('a' + i % 26);
    big[SVC_TEXT_MAX] = 0;
    svc_msg m = with_text(SVC_METRICS, big), d;
    struct big_send b = {sv[0], &m, -1};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, send_big, &b), 0);
    size_t n;
    assert_int_equal(svc_recv(sv[1], &d, NULL, 0, &n, 5000), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(b.rc, 0);
    assert_string_equal(d.text, big);
    svc_msg_clear(&d);
    free(big);
    close(sv[0]), close(sv[1]);
}

static void test_framing_errors(void **state)
{
    (void)state;
    int before = open_fds();
    int sv[2];

    /* A clean EOF before any byte is 1, for svc_recv too. */
    pair(sv);
    shutdown(sv[0], SHUT_WR);
    RECV_FAILS(sv[1], SVC_MAX_FDS, 1, NULL);
    svc_msg d;
    size_t n;
    assert_int_equal(svc_recv(sv[1], &d, NULL, 0, &n, 2000), 1);
    close(sv[0]), close(sv[1]);

    /* Lengths of 0 and over SVC_FRAME_MAX. */
    static const char *const heads[] = {"\x00\x00\x00\x00", "\x00\x10\x00\x01",
                                        "\xff\xff\xff\xff"};
    for (int i = 0; i < 3; i++) {
        pair(sv);
        send_raw(sv[0], heads[i], 4, NULL, 0);
        RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "frame length");
        close(sv[0]), close(sv[1]);
    }

    /* EOF inside the length, and inside the payload. */
    pair(sv);
    send_raw(sv[0], "\x00\x00", 2, NULL, 0);
    close(sv[0]);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "mid-frame");
    close(sv[1]);
    pair(sv);
    send_raw(sv[0], "\x00\x00\x00\x0a" "abcde", 9, NULL, 0);
    close(sv[0]);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "mid-frame");
    close(sv[1]);

    /* ... with a descriptor that came with the first byte: closed. */
    int mfd = memfd_with("x");
    int middle = open_fds();
    pair(sv);
    send_raw(sv[0], "\x00\x00\x00\x0a" "abcde", 9, &mfd, 1);
    close(sv[0]);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "mid-frame");
    close(sv[1]);
    assert_int_equal(open_fds(), middle);

    /* A bad length with a descriptor: closed too. */
    pair(sv);
    send_raw(sv[0], "\x00\x00\x00\x00", 4, &mfd, 1);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "frame length");
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), middle);
    close(mfd);
    assert_int_equal(open_fds(), before);
}

static void test_descriptor_rules(void **state)
{
    (void)state;
    int sv[2], fds[8];
    int mfd = memfd_with("x");
    for (int i = 0; i < 8; i++) fds[i] = mfd;
    int before = open_fds();
    static const char frame[] = "\x00\x00\x00\x01\xc0";

    /* More than max_fds (2 sent, 1 accepted; 1 sent, 0 accepted). */
    /* (A framing error leaves the stream out of step: a fresh pair each.) */
    pair(sv);
    assert_int_equal(svc_send_frame(sv[0], (const uint8_t *)"\xc0", 1, fds, 2), 0);
    RECV_FAILS(sv[1], 1, KVCR_EPROTO, "more than 1 descriptors");
    close(sv[0]), close(sv[1]);
    pair(sv);
    assert_int_equal(svc_send_frame(sv[0], (const uint8_t *)"\xc0", 1, fds, 1), 0);
    RECV_FAILS(sv[1], 0, KVCR_EPROTO, "descriptors");
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), before);

    /* More than SVC_MAX_FDS, whatever max_fds says: one over (seen), and
     * many over (the control data is truncated, MSG_CTRUNC). */
    pair(sv);
    send_raw(sv[0], frame, 5, fds, SVC_MAX_FDS + 1);
    RECV_FAILS(sv[1], 16, KVCR_EPROTO, "descriptors");
    close(sv[0]), close(sv[1]);
    pair(sv);
    send_raw(sv[0], frame, 5, fds, 8);
    RECV_FAILS(sv[1], 16, KVCR_EPROTO, "truncated");
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), before);

    /* Descriptors on a later byte than the first. */
    pair(sv);
    send_raw(sv[0], "\x00\x00\x00\x02", 4, NULL, 0);
    send_raw(sv[0], "\xc0\xc0", 2, fds, 1);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "first byte");
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), before);

    /* Other ancillary data: credentials (the receiver asked for them). */
    pair(sv);
    int on = 1;
    assert_int_equal(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    send_raw(sv[0], frame, 5, fds, 1);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "ancillary");
    close(sv[0]), close(sv[1]);
    pair(sv);
    assert_int_equal(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    send_raw(sv[0], frame, 5, NULL, 0);
    RECV_FAILS(sv[1], SVC_MAX_FDS, KVCR_EPROTO, "ancillary");
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), before);

    /* A frame that arrives whole but does not decode: svc_recv closes its
     * descriptors. */
    pair(sv);
    assert_int_equal(svc_send_frame(sv[0], (const uint8_t *)"\xc0", 1, fds, 2), 0);
    svc_msg d;
    int got[SVC_MAX_FDS] = {-1, -1};
    size_t n = 9;
    assert_int_equal(svc_recv(sv[1], &d, got, SVC_MAX_FDS, &n, 2000), KVCR_EPROTO);
    assert_int_equal(n, 0);
    assert_true(all_zero(&d));
    close(sv[0]), close(sv[1]);
    assert_int_equal(open_fds(), before);
    close(mfd);
}

static double since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

static void test_timeouts_and_socket_errors(void **state)
{
    (void)state;
    int before = open_fds();
    int sv[2];
    uint8_t *payload;
    size_t len, n;
    struct timespec t0;

    /* Nothing comes: KVCR_ESYS after about timeout_ms. */
    pair(sv);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(svc_recv_frame(sv[1], &payload, &len, NULL, 0, &n, 100), KVCR_ESYS);
    double took = since(&t0);
    assert_true(took >= 0.09 && took < 1.0);
    assert_non_null(strstr(kvcr_last_error(), "100 ms"));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(svc_recv_frame(sv[1], &payload, &len, NULL, 0, &n, 0), KVCR_ESYS);
    assert_true(since(&t0) < 0.5);

    /* The length and a descriptor come, then nothing: the descriptor is
     * closed. */
    int mfd = memfd_with("x");
    int middle = open_fds();
    send_raw(sv[0], "\x00\x00\x00\x05" "ab", 6, &mfd, 1);
    int got[SVC_MAX_FDS];
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(svc_recv_frame(sv[1], &payload, &len, got, SVC_MAX_FDS, &n, 100), KVCR_ESYS);
    assert_true(since(&t0) < 1.0);
    assert_int_equal(n, 0);
    assert_null(payload);
    assert_int_equal(open_fds(), middle);
    close(mfd);
    close(sv[0]), close(sv[1]);

    /* Sending to a closed peer: KVCR_ESYS (EPIPE), no SIGPIPE. */
    pair(sv);
    close(sv[1]);
    svc_msg m = simple(SVC_STATS);
    assert_int_equal(svc_send(sv[0], &m, NULL, 0), KVCR_ESYS);
    close(sv[0]);
    /* A socket that is not one. */
    assert_int_equal(svc_send(sv[0], &m, NULL, 0), KVCR_ESYS);
    assert_int_equal(svc_recv_frame(sv[0], &payload, &len, NULL, 0, &n, 100), KVCR_ESYS);

    /* The sender's own rules. */
    int fds[3] = {0, 1, 2};
    assert_int_equal(svc_send_frame(0, (const uint8_t *)"x", 0, NULL, 0), KVCR_EINVAL);
    assert_int_equal(svc_send_frame(0, (const uint8_t *)"x", SVC_FRAME_MAX + 1, NULL, 0),
                     KVCR_EINVAL);
    assert_int_equal(svc_send_frame(0, (const uint8_t *)"x", 1, fds, SVC_MAX_FDS + 1),
                     KVCR_EINVAL);
    assert_int_equal(svc_recv_frame(0, &payload, &len, NULL, 1, &n, 0), KVCR_EINVAL);
    assert_int_equal(open_fds(), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_round_trips),
        cmocka_unit_test(test_the_encoder_writes_exactly_the_type_fields),
        cmocka_unit_test(test_envelope_rules),
        cmocka_unit_test(test_fields_each_type_requires_and_allows),
        cmocka_unit_test(test_types_and_ranges),
        cmocka_unit_test(test_pool_rules),
        cmocka_unit_test(test_malformed_and_hostile_msgpack),
        cmocka_unit_test(test_encoder_refuses_what_the_decoder_refuses),
        cmocka_unit_test(test_frames_carry_zero_one_and_two_descriptors),
        cmocka_unit_test(test_largest_frame),
        cmocka_unit_test(test_framing_errors),
        cmocka_unit_test(test_descriptor_rules),
        cmocka_unit_test(test_timeouts_and_socket_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
