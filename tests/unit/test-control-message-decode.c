/* The peer control messages: every type round-trips with and without each
 * optional field, and the one decoder refuses each rule it enforces. Bad
 * messages are made by encoding a valid one, editing its msgpack object
 * tree and packing that again with msgpack_pack_object. */
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "net/wire.h"

#define WB(s) ((wire_bytes){(const uint8_t *)(s), sizeof(s) - 1})

static const uint8_t INC_A[WIRE_INCARNATION_LEN] = {1, 2, 3, 4, 5, 6, 7, 8,
                                                    9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t INC_B[WIRE_INCARNATION_LEN] = {0xff, 0, 0xfe, 1, 0xfd, 2, 0xfc, 3,
                                                    0xfb, 4, 0xfa, 5, 0xf9, 6, 0xf8, 0};
static const uint8_t INC_C[WIRE_INCARNATION_LEN] = {0};

static wire_region regions[2] = {
    {{(const uint8_t *)"", 0}, true, 0x7f0000001000ull, 4096, 8192, 100, WB("rkey-of-fw")},
    {WB("pool-\xc3\xa9"), false, 0x7f0000100000ull, 65536, 65536, 16, WB("rkey\0with-nul")},
};

static wire_msg base(int type)
{
    wire_msg m;
    memset(&m, 0, sizeof m);
    m.type = (uint8_t)type;
    m.agent = WB("agent-a");
    m.incarnation = (wire_bytes){INC_A, WIRE_INCARNATION_LEN};
    m.from = WB("tcp://127.0.0.1:5001");
    m.to = WB("tcp://127.0.0.1:5002");
    return m;
}

static void with_md(wire_msg *m, uint32_t n_regions)
{
    m->has_metadata = true;
    m->md.worker_addr = WB("ucx-worker-address\x00\x01\x02");
    m->md.n_regions = n_regions;
    m->md.regions = n_regions ? regions : NULL;
}

/* Three keys with 1, 2 and 255 refs (the most one key may have). */
static wire_bytes sw_keys[3];
static uint32_t sw_off[4];
static wire_ref sw_refs[1 + 2 + WIRE_MAX_REFS];

static wire_msg start_write(void)
{
    static uint8_t long_key[WIRE_MAX_KEY];
    memset(long_key, 0xab, sizeof long_key);
    sw_keys[0] = WB("k");
    sw_keys[1] = WB("key\0two");
    sw_keys[2] = (wire_bytes){long_key, sizeof long_key};
    sw_off[0] = 0, sw_off[1] = 1, sw_off[2] = 3, sw_off[3] = 3 + WIRE_MAX_REFS;
    for (uint32_t i = 0; i < sw_off[3]; i++)
        sw_refs[i] = (wire_ref){i % 2 == 0, i % 3 ? WB("pool-\xc3\xa9") : WB(""), i * 977ull};
    sw_refs[1].index = UINT64_MAX;
    wire_msg m = base(WIRE_START_WRITE);
    m.has_op = true;
    m.op = INT64_MIN;
    m.remaining_ms = 1500.25;
    m.n_keys = 3;
    m.keys = sw_keys;
    m.ref_off = sw_off;
    m.refs = sw_refs;
    return m;
}

static uint32_t done_idx[] = {7, 0, WIRE_MAX_KEYS - 1, 3};

static wire_msg write_done(bool success, uint32_t n_completed)
{
    wire_msg m = base(WIRE_WRITE_DONE);
    m.has_op = true;
    m.op = 42;
    m.success = success;
    m.terminal = !success;
    m.n_completed = n_completed;
    m.completed = n_completed ? done_idx : NULL;
    return m;
}

/* ---- checking a decoded message field by field ------------------------------ */

static void same_bytes(wire_bytes a, wire_bytes b)
{
    assert_int_equal(a.len, b.len);
    if (a.len) assert_memory_equal(a.data, b.data, a.len);
    assert_int_equal(b.data[b.len], 0); /* decoded copies are NUL-terminated */
}

static void none(wire_bytes b)
{
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

static bool carries(int type, int what)
{
    switch (what) {
    case 'o': return type != WIRE_METADATA;
    case 'm': return type == WIRE_METADATA || type == WIRE_START_WRITE || type == WIRE_WRITE_PROBE;
    case 'e': return type == WIRE_START_WRITE || type == WIRE_WRITE_PROBE;
    case 'd': return type == WIRE_WRITE_PROBE_ACK;
    case 't': return type == WIRE_WRITE_DONE || type == WIRE_WRITE_PROBE_ACK;
    }
    return false;
}

/* Every field of d against m, independently of wire_msg_equal; what the
 * type does not carry must be zero in d. */
static void same_fields(const wire_msg *m, const wire_msg *d)
{
    assert_int_equal(d->type, m->type);
    same_bytes(m->agent, d->agent);
    same_bytes(m->incarnation, d->incarnation);
    same_bytes(m->from, d->from);
    same_bytes(m->to, d->to);
    assert_int_equal(d->has_op, carries(m->type, 'o') && m->has_op);
    assert_true(d->op == (d->has_op ? m->op : 0));
    assert_int_equal(d->has_metadata, carries(m->type, 'm') && m->has_metadata);
    if (d->has_metadata) {
        same_bytes(m->md.worker_addr, d->md.worker_addr);
        assert_int_equal(d->md.n_regions, m->md.n_regions);
        for (uint32_t i = 0; i < m->md.n_regions; i++) {
            const wire_region *a = &m->md.regions[i], *b = &d->md.regions[i];
            same_bytes(a->label, b->label);
            same_bytes(a->rkey, b->rkey);
            assert_int_equal(a->framework, b->framework);
            assert_true(a->addr == b->addr && a->element_size == b->element_size &&
                        a->stride == b->stride && a->count == b->count);
        }
    } else {
        none(d->md.worker_addr);
        assert_int_equal(d->md.n_regions, 0);
    }
    bool sw = m->type == WIRE_START_WRITE;
    assert_true(d->remaining_ms == (sw ? m->remaining_ms : 0));
    assert_int_equal(d->n_keys, sw ? m->n_keys : 0);
    if (sw) {
        for (uint32_t i = 0; i < m->n_keys; i++) same_bytes(m->keys[i], d->keys[i]);
        for (uint32_t i = 0; i <= m->n_keys; i++) assert_int_equal(d->ref_off[i], m->ref_off[i]);
        for (uint32_t r = 0; r < m->ref_off[m->n_keys]; r++) {
            assert_int_equal(d->refs[r].framework, m->refs[r].framework);
            assert_true(d->refs[r].index == m->refs[r].index);
            same_bytes(m->refs[r].label, d->refs[r].label);
        }
    } else {
        assert_null(d->keys);
        assert_null(d->refs);
    }
    assert_int_equal(d->has_expected_inc, carries(m->type, 'e') && m->has_expected_inc);
    if (d->has_expected_inc) same_bytes(m->expected_inc, d->expected_inc);
    else none(d->expected_inc);
    assert_int_equal(d->has_dead_inc, carries(m->type, 'd') && m->has_dead_inc);
    if (d->has_dead_inc) same_bytes(m->dead_inc, d->dead_inc);
    else none(d->dead_inc);
    bool wd = m->type == WIRE_WRITE_DONE;
    assert_int_equal(d->success, wd && m->success);
    assert_int_equal(d->terminal, carries(m->type, 't') && m->terminal);
    assert_int_equal(d->busy, m->type == WIRE_WRITE_REFUSED && m->busy);
    assert_int_equal(d->n_completed, wd && m->success ? m->n_completed : 0);
    for (uint32_t i = 0; i < d->n_completed; i++) assert_int_equal(d->completed[i], m->completed[i]);
    assert_int_equal(d->inline_write, sw && m->inline_write);
    assert_int_equal(d->has_put_min, sw && m->has_put_min);
    assert_true(d->put_min == (d->has_put_min ? m->put_min : 0));
    assert_int_equal(d->has_inline, wd && m->has_inline);
    assert_int_equal(d->n_runs, d->has_inline ? m->n_runs : 0);
    for (uint32_t i = 0; i < d->n_runs; i++)
        assert_true(d->runs[i].addr == m->runs[i].addr && d->runs[i].len == m->runs[i].len);
    if (d->has_inline) same_bytes(m->inline_data, d->inline_data);
    else none(d->inline_data);
    assert_int_equal(d->has_times, wd && m->has_times);
    const wire_times zero = {0, 0, 0}, *want = d->has_times ? &m->times : &zero;
    assert_true(d->times.serve_ns == want->serve_ns && d->times.pin_ns == want->pin_ns &&
                d->times.data_ns == want->data_ns);
}

/* Encodes m, decodes it from a copy that is then scribbled over and freed
 * (the decoded message must own its bytes), and compares. */
static void roundtrip(const wire_msg *m)
{
    void *buf, *again;
    size_t len, again_len;
    assert_int_equal(wire_encode(m, &buf, &len), 0);
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    memcpy(copy, buf, len);
    wire_msg d;
    const char *why = NULL;
    if (wire_decode(copy, len, &d, &why) != 0) fail_msg("%s refused: %s", wire_type_name(m->type), why);
    memset(copy, 0xa5, len);
    free(copy);
    same_fields(m, &d);
    assert_true(wire_msg_equal(m, &d));
    assert_true(wire_msg_equal(&d, m));
    /* Re-encoding the decoded message gives the same bytes. */
    assert_int_equal(wire_encode(&d, &again, &again_len), 0);
    assert_int_equal(again_len, len);
    assert_memory_equal(again, buf, len);
    wire_msg_free(&d);
    free(buf);
    free(again);
}

static void test_every_type_round_trips_with_and_without_optional_fields(void **state)
{
    (void)state;
    wire_msg m = base(WIRE_METADATA);
    with_md(&m, 2);
    roundtrip(&m);
    with_md(&m, 0);
    roundtrip(&m);

    m = base(WIRE_METADATA_ACK);
    roundtrip(&m);
    m.has_op = true;
    m.op = -1;
    roundtrip(&m);

    for (int opt = 0; opt < 4; opt++) {
        m = start_write();
        if (opt & 1) m.has_expected_inc = true, m.expected_inc = (wire_bytes){INC_B, 16};
        if (opt & 2) with_md(&m, 2);
        roundtrip(&m);
        m.remaining_ms = 1e-300; /* tiny but > 0 */
        roundtrip(&m);
    }

    m = write_done(true, 4);
    roundtrip(&m);
    m = write_done(true, 0); /* success with nothing completed: an empty array */
    roundtrip(&m);
    m = write_done(false, 0);
    roundtrip(&m);
    m = write_done(true, 4); /* sent as messages: the bytes the target must take */
    m.has_am_bytes = true;
    m.am_bytes = UINT64_MAX;
    roundtrip(&m);

    m = base(WIRE_WRITE_REFUSED);
    m.has_op = true;
    m.op = INT64_MAX;
    roundtrip(&m);

    for (int opt = 0; opt < 4; opt++) {
        m = base(WIRE_WRITE_PROBE);
        m.has_op = true;
        m.op = 9;
        if (opt & 1) m.has_expected_inc = true, m.expected_inc = (wire_bytes){INC_C, 16};
        if (opt & 2) with_md(&m, 1);
        roundtrip(&m);
    }

    for (int opt = 0; opt < 4; opt++) {
        m = base(WIRE_WRITE_PROBE_ACK);
        m.has_op = true;
        m.op = 0;
        m.terminal = opt & 2;
        if (opt & 1) m.has_dead_inc = true, m.dead_inc = (wire_bytes){INC_B, 16};
        roundtrip(&m);
    }
}

static void test_the_encoder_writes_only_what_the_type_carries(void **state)
{
    (void)state;
    /* A write_refused with every other field set encodes as a bare one. */
    wire_msg m = start_write();
    with_md(&m, 2);
    m.type = WIRE_WRITE_REFUSED;
    m.has_expected_inc = m.has_dead_inc = m.success = m.terminal = true;
    m.expected_inc = m.dead_inc = (wire_bytes){INC_B, 16};
    m.completed = done_idx;
    m.n_completed = 2;
    roundtrip(&m);
    void *a, *b;
    size_t alen, blen;
    wire_msg bare = base(WIRE_WRITE_REFUSED);
    bare.has_op = true;
    bare.op = m.op;
    assert_int_equal(wire_encode(&m, &a, &alen), 0);
    assert_int_equal(wire_encode(&bare, &b, &blen), 0);
    assert_int_equal(alen, blen);
    assert_memory_equal(a, b, alen);
    free(a);
    free(b);
    /* op is never part of a metadata message. */
    m = base(WIRE_METADATA);
    with_md(&m, 0);
    m.has_op = true;
    roundtrip(&m);
}

static void test_equal_notices_every_field(void **state)
{
    (void)state;
    wire_msg a = start_write();
    with_md(&a, 2);
    a.has_expected_inc = true;
    a.expected_inc = (wire_bytes){INC_B, 16};
    wire_region r2[2];
    wire_ref refs2[sizeof sw_refs / sizeof sw_refs[0]];
    wire_bytes keys2[3];
    uint32_t off2[4];
    for (int i = 0;; i++) {
        wire_msg b = a;
        memcpy(r2, regions, sizeof r2);
        memcpy(refs2, sw_refs, sizeof refs2);
        memcpy(keys2, sw_keys, sizeof keys2);
        memcpy(off2, sw_off, sizeof off2);
        b.md.regions = r2, b.refs = refs2, b.keys = keys2, b.ref_off = off2;
        assert_true(wire_msg_equal(&a, &b));
        switch (i) {
        case 0: b.agent = WB("agent-b"); break;
        case 1: b.incarnation = (wire_bytes){INC_C, 16}; break;
        case 2: b.from = WB("tcp://127.0.0.1:5003"); break;
        case 3: b.to = WB("tcp://127.0.0.1:5001"); break;
        case 4: b.op++; break;
        case 5: b.remaining_ms = 1500.5; break;
        case 6: keys2[1] = WB("key\0twp"); break;
        case 7: keys2[0] = WB("kk"); break;
        case 8: refs2[5].framework = !refs2[5].framework; break;
        case 9: refs2[7].label = WB("other"); break;
        case 10: refs2[100].index++; break;
        case 11: off2[1] = 2; break; /* same refs, split differently */
        case 12: b.md.worker_addr = WB("other-worker"); break;
        case 13: b.md.n_regions = 1; break;
        case 14: r2[1].label = WB("pool-e"); break;
        case 15: r2[0].framework = false; break;
        case 16: r2[0].addr++; break;
        case 17: r2[0].element_size++; break;
        case 18: r2[1].stride++; break;
        case 19: r2[1].count--; break;
        case 20: r2[1].rkey = WB("rkey"); break;
        case 21: b.expected_inc = (wire_bytes){INC_C, 16}; break;
        case 22: b.has_expected_inc = false; break;
        case 23: b.has_metadata = false; break;
        case 24: b.type = WIRE_WRITE_PROBE; break;
        default: goto done_sw;
        }
        if (wire_msg_equal(&a, &b)) fail_msg("start_write mutation %d not noticed", i);
    }
done_sw:;
    wire_msg d = write_done(true, 4), e;
    uint32_t idx2[4];
    for (int i = 0; i < 4; i++) {
        e = d;
        memcpy(idx2, done_idx, sizeof idx2);
        e.completed = idx2;
        if (i == 0) e.success = false, e.n_completed = 0;
        if (i == 1) e.terminal = !e.terminal;
        if (i == 2) e.n_completed = 3;
        if (i == 3) idx2[2] = 5;
        if (wire_msg_equal(&d, &e)) fail_msg("write_done mutation %d not noticed", i);
    }
    e = d;
    e.has_am_bytes = true;
    assert_false(wire_msg_equal(&d, &e));
    wire_msg e2 = e;
    e2.am_bytes = 1;
    assert_false(wire_msg_equal(&e, &e2));
    wire_msg p = base(WIRE_WRITE_PROBE_ACK), q;
    p.has_op = p.has_dead_inc = true;
    p.dead_inc = (wire_bytes){INC_B, 16};
    for (int i = 0; i < 3; i++) {
        q = p;
        if (i == 0) q.terminal = true;
        if (i == 1) q.has_dead_inc = false;
        if (i == 2) q.dead_inc = (wire_bytes){INC_A, 16};
        if (wire_msg_equal(&p, &q)) fail_msg("write_probe_ack mutation %d not noticed", i);
    }
}

/* ---- refusals ---------------------------------------------------------------- */

/* A valid message's object tree, to edit and pack again. */
typedef struct tree {
    void *buf; /* the encoding the objects point into */
    size_t len;
    msgpack_unpacked up;
} tree;

static tree *tree_of(const wire_msg *m)
{
    tree *t = calloc(1, sizeof *t);
    assert_non_null(t);
    assert_int_equal(wire_encode(m, &t->buf, &t->len), 0);
    msgpack_unpacked_init(&t->up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&t->up, t->buf, t->len, &off), MSGPACK_UNPACK_SUCCESS);
    return t;
}

static msgpack_object *root(tree *t)
{
    return &t->up.data;
}

static void *zalloc(tree *t, size_t n)
{
    void *p = msgpack_zone_malloc(t->up.zone, n);
    assert_non_null(p);
    return p;
}

static msgpack_object str_obj(const char *s, size_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_STR};
    o.via.str.ptr = s, o.via.str.size = (uint32_t)n;
    return o;
}
#define STR(s) str_obj(s, sizeof(s) - 1)

static msgpack_object bin_obj(const void *p, size_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_BIN};
    o.via.bin.ptr = p, o.via.bin.size = (uint32_t)n;
    return o;
}

static msgpack_object u64_obj(uint64_t v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_POSITIVE_INTEGER};
    o.via.u64 = v;
    return o;
}

static msgpack_object neg_obj(int64_t v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_NEGATIVE_INTEGER};
    o.via.i64 = v;
    return o;
}

static msgpack_object f64_obj(double v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_FLOAT64};
    o.via.f64 = v;
    return o;
}

static msgpack_object bool_obj(bool v)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_BOOLEAN};
    o.via.boolean = v;
    return o;
}

static msgpack_object nil_obj(void)
{
    return (msgpack_object){.type = MSGPACK_OBJECT_NIL};
}

static msgpack_object arr_obj(tree *t, uint32_t n)
{
    msgpack_object o = {.type = MSGPACK_OBJECT_ARRAY};
    o.via.array.size = n;
    o.via.array.ptr = zalloc(t, (n ? n : 1) * sizeof(msgpack_object));
    return o;
}

static msgpack_object *get(msgpack_object *map, const char *key)
{
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
            return &kv->val;
    }
    fail_msg("no key %s", key);
    return NULL;
}

static void del(msgpack_object *map, const char *key)
{
    msgpack_object *v = get(map, key);
    msgpack_object_kv *kv = (msgpack_object_kv *)((char *)v - offsetof(msgpack_object_kv, val));
    size_t at = (size_t)(kv - map->via.map.ptr);
    memmove(kv, kv + 1, (map->via.map.size - at - 1) * sizeof *kv);
    map->via.map.size--;
}

/* Appends key (any object) to map; returns the new value slot. */
static msgpack_object *add(tree *t, msgpack_object *map, msgpack_object key)
{
    uint32_t n = map->via.map.size;
    msgpack_object_kv *kv = zalloc(t, (n + 1) * sizeof *kv);
    memcpy(kv, map->via.map.ptr, n * sizeof *kv);
    kv[n].key = key;
    kv[n].val = nil_obj();
    map->via.map.ptr = kv;
    map->via.map.size = n + 1;
    return &kv[n].val;
}

static void pack(const msgpack_object *o, msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    assert_int_equal(msgpack_pack_object(&pk, *o), 0);
}

/* Decodes len bytes from an exact-size copy (so ASan sees any overread);
 * checks the refusal leaves *out empty and returns why. */
static const char *refused_bytes(const void *bytes, size_t len)
{
    void *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    if (len) memcpy(copy, bytes, len);
    wire_msg out;
    memset(&out, 0x5a, sizeof out);
    const char *why = NULL;
    int rc = wire_decode(copy, len, &out, &why);
    free(copy);
    if (rc == 0) {
        wire_msg_free(&out);
        fail_msg("accepted");
    }
    assert_int_equal(rc, -1);
    assert_non_null(why);
    assert_null(out.storage);
    assert_int_equal(out.type, 0);
    wire_msg_free(&out); /* safe on what a refusal leaves */
    return why;
}

/* Packs the (edited) tree, expects a refusal with the given why (NULL: any)
 * and frees the tree. */
static void refused_at(tree *t, const char *want, int line)
{
    msgpack_sbuffer sb;
    pack(root(t), &sb);
    const char *why = refused_bytes(sb.data, sb.size);
    if (want && strcmp(why, want) != 0) fail_msg("line %d: why '%s', want '%s'", line, why, want);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&t->up);
    free(t->buf);
    free(t);
}
#define REFUSED(t, want) refused_at(t, want, __LINE__)

/* Packs the tree and expects it accepted (the bound's other side). */
static void accepted(tree *t)
{
    msgpack_sbuffer sb;
    pack(root(t), &sb);
    wire_msg d;
    const char *why = NULL;
    if (wire_decode(sb.data, sb.size, &d, &why) != 0) fail_msg("refused: %s", why);
    wire_msg_free(&d);
    msgpack_sbuffer_destroy(&sb);
    msgpack_unpacked_destroy(&t->up);
    free(t->buf);
    free(t);
}

static wire_msg full_start_write(void)
{
    wire_msg m = start_write();
    with_md(&m, 2);
    m.has_expected_inc = true;
    m.expected_inc = (wire_bytes){INC_B, 16};
    return m;
}

static void test_envelope_rules(void **state)
{
    (void)state;
    wire_msg sw = full_start_write(), ack = base(WIRE_METADATA_ACK);
    tree *t;

    t = tree_of(&ack), *get(root(t), "v") = u64_obj(2);
    REFUSED(t, "unsupported version");
    t = tree_of(&ack), *get(root(t), "v") = u64_obj(0);
    REFUSED(t, "unsupported version");
    t = tree_of(&ack), *get(root(t), "v") = neg_obj(-1);
    REFUSED(t, "unsupported version");
    t = tree_of(&ack), *get(root(t), "v") = STR("1");
    REFUSED(t, "unsupported version");
    t = tree_of(&ack), *get(root(t), "v") = f64_obj(1.0);
    REFUSED(t, "unsupported version");
    t = tree_of(&ack), del(root(t), "v");
    REFUSED(t, "missing field: v");

    t = tree_of(&ack), *add(t, root(t), STR("extra")) = u64_obj(1);
    REFUSED(t, "unknown key");
    t = tree_of(&ack), *add(t, root(t), STR("V")) = u64_obj(1);
    REFUSED(t, "unknown key");
    t = tree_of(&ack), *add(t, root(t), STR("agent")) = STR("agent-a"); /* same value twice */
    REFUSED(t, "duplicate key");
    t = tree_of(&ack), *add(t, root(t), u64_obj(1)) = u64_obj(1);
    REFUSED(t, "map key is not a str");
    t = tree_of(&ack), *add(t, root(t), bin_obj("op", 2)) = u64_obj(1);
    REFUSED(t, "map key is not a str");

    t = tree_of(&ack), *get(root(t), "type") = STR("nope");
    REFUSED(t, "unknown message type");
    t = tree_of(&ack), *get(root(t), "type") = u64_obj(WIRE_METADATA_ACK);
    REFUSED(t, "type: not a str");
    t = tree_of(&ack), del(root(t), "type");
    REFUSED(t, "missing field: type");

    /* Names: str, UTF-8 without NUL, 1..256 bytes (0..256 for labels). */
    static char name256[WIRE_MAX_NAME + 1];
    memset(name256, 'n', sizeof name256);
    t = tree_of(&ack), *get(root(t), "agent") = STR("");
    REFUSED(t, "agent: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "agent") = str_obj(name256, WIRE_MAX_NAME + 1);
    REFUSED(t, "agent: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "agent") = str_obj(name256, WIRE_MAX_NAME);
    accepted(t);
    t = tree_of(&ack), *get(root(t), "agent") = bin_obj("agent", 5);
    REFUSED(t, "agent: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "agent") = STR("a\0b");
    REFUSED(t, "agent: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "from") = STR("");
    REFUSED(t, "from: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "from") = STR("\xff");
    REFUSED(t, "from: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "to") = STR("\xc0\xaf"); /* overlong '/' */
    REFUSED(t, "to: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "to") = STR("\xed\xa0\x80"); /* a surrogate */
    REFUSED(t, "to: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), *get(root(t), "to") = STR("\xe2\x82"); /* cut short */
    REFUSED(t, "to: not UTF-8 of 1..256 bytes");
    t = tree_of(&ack), del(root(t), "to");
    REFUSED(t, "missing field: to");

    /* Incarnations: bin of exactly 16 bytes. */
    t = tree_of(&ack), *get(root(t), "inc") = bin_obj(INC_A, 15);
    REFUSED(t, "inc: not a bin of 16 bytes");
    t = tree_of(&ack), *get(root(t), "inc") = bin_obj("0123456789abcdefg", 17);
    REFUSED(t, "inc: not a bin of 16 bytes");
    t = tree_of(&ack), *get(root(t), "inc") = STR("0123456789abcdef");
    REFUSED(t, "inc: not a bin of 16 bytes");
    t = tree_of(&sw), *get(root(t), "expected_inc") = bin_obj(INC_A, 0);
    REFUSED(t, "expected_inc: not a bin of 16 bytes");
    wire_msg pa = base(WIRE_WRITE_PROBE_ACK);
    pa.has_op = pa.has_dead_inc = true;
    pa.dead_inc = (wire_bytes){INC_C, 16};
    t = tree_of(&pa), *get(root(t), "dead_inc") = bin_obj(INC_A, 8);
    REFUSED(t, "dead_inc: not a bin of 16 bytes");
    t = tree_of(&pa), *get(root(t), "dead_inc") = nil_obj();
    REFUSED(t, "dead_inc: not a bin of 16 bytes");
}

static void test_fields_each_type_requires_and_allows(void **state)
{
    (void)state;
    wire_msg md = base(WIRE_METADATA), sw = full_start_write(), done = write_done(true, 2);
    wire_msg probe = base(WIRE_WRITE_PROBE), pa = base(WIRE_WRITE_PROBE_ACK);
    wire_msg refused = base(WIRE_WRITE_REFUSED);
    with_md(&md, 1);
    probe.has_op = pa.has_op = refused.has_op = true;
    tree *t;

    t = tree_of(&md), *add(t, root(t), STR("op")) = u64_obj(1);
    REFUSED(t, "field not allowed for this type: op");
    t = tree_of(&md), del(root(t), "md");
    REFUSED(t, "missing field: md");
    t = tree_of(&done), *add(t, root(t), STR("md")) = *get(root(t), "op");
    REFUSED(t, "field not allowed for this type: md");
    t = tree_of(&refused), *add(t, root(t), STR("completed")) = arr_obj(t, 0);
    REFUSED(t, "field not allowed for this type: completed");
    t = tree_of(&probe), *add(t, root(t), STR("remaining_ms")) = f64_obj(5);
    REFUSED(t, "field not allowed for this type: remaining_ms");
    t = tree_of(&pa), *add(t, root(t), STR("expected_inc")) = bin_obj(INC_A, 16);
    REFUSED(t, "field not allowed for this type: expected_inc");
    t = tree_of(&probe), *add(t, root(t), STR("dead_inc")) = bin_obj(INC_A, 16);
    REFUSED(t, "field not allowed for this type: dead_inc");
    t = tree_of(&refused), *add(t, root(t), STR("terminal")) = bool_obj(true);
    REFUSED(t, "field not allowed for this type: terminal");

    static const char *const sw_need[] = {"op", "remaining_ms", "keys", "dst"};
    for (size_t i = 0; i < 4; i++) {
        char want[64];
        snprintf(want, sizeof want, "missing field: %s", sw_need[i]);
        t = tree_of(&sw), del(root(t), sw_need[i]);
        REFUSED(t, want);
    }
    t = tree_of(&done), del(root(t), "success");
    REFUSED(t, "missing field: success");
    t = tree_of(&done), del(root(t), "terminal");
    REFUSED(t, "missing field: terminal");
    t = tree_of(&pa), del(root(t), "terminal");
    REFUSED(t, "missing field: terminal");
    t = tree_of(&probe), del(root(t), "op");
    REFUSED(t, "missing field: op");
    t = tree_of(&refused), del(root(t), "op");
    REFUSED(t, "missing field: op");

    /* write_done: completed exactly when success. */
    t = tree_of(&done), del(root(t), "completed");
    REFUSED(t, "write_done: completed required when success");
    t = tree_of(&done), *get(root(t), "success") = bool_obj(false);
    REFUSED(t, "write_done: completed only with success");
    t = tree_of(&done), *get(root(t), "success") = u64_obj(1);
    REFUSED(t, "write_done: success not a bool");
    t = tree_of(&done), *get(root(t), "terminal") = nil_obj();
    REFUSED(t, "terminal: not a bool");

    /* write_done: am_bytes (the bytes sent as messages) only with success,
     * and unsigned; the encoder makes no such message either. */
    wire_msg amd = write_done(true, 2);
    amd.has_am_bytes = true;
    amd.am_bytes = 2u << 20;
    t = tree_of(&amd), *get(root(t), "am_bytes") = nil_obj();
    REFUSED(t, "write_done: am_bytes not unsigned");
    t = tree_of(&amd), *get(root(t), "success") = bool_obj(false), del(root(t), "completed");
    REFUSED(t, "write_done: am_bytes only with success");
    amd.success = false;
    amd.n_completed = 0;
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(wire_encode(&amd, &buf, &len), -1);
    assert_null(buf);
}

/* write_refused's busy flag (a refusal at one of the source's limits):
 * carried only as true, only by write_refused. */
static void test_write_refused_busy(void **state)
{
    (void)state;
    wire_msg busy = base(WIRE_WRITE_REFUSED), plain = base(WIRE_WRITE_REFUSED);
    busy.has_op = plain.has_op = true;
    busy.op = plain.op = 7;
    busy.busy = true;
    roundtrip(&busy);
    roundtrip(&plain);
    assert_false(wire_msg_equal(&busy, &plain));
    wire_msg done = write_done(false, 0);
    done.busy = true; /* not carried by write_done: encodes as without it */
    roundtrip(&done);
    tree *t;
    t = tree_of(&busy), *get(root(t), "busy") = bool_obj(false);
    REFUSED(t, "write_refused: busy must be true when present");
    t = tree_of(&busy), *get(root(t), "busy") = u64_obj(1);
    REFUSED(t, "write_refused: busy must be true when present");
    t = tree_of(&done), *add(t, root(t), STR("busy")) = bool_obj(true);
    REFUSED(t, "field not allowed for this type: busy");
}

static void test_integer_and_number_rules(void **state)
{
    (void)state;
    wire_msg sw = full_start_write(), done = write_done(true, 4);
    tree *t;

    t = tree_of(&sw), *get(root(t), "op") = f64_obj(1.0);
    REFUSED(t, "op: not an int64");
    t = tree_of(&sw), *get(root(t), "op") = bool_obj(true);
    REFUSED(t, "op: not an int64");
    t = tree_of(&sw), *get(root(t), "op") = u64_obj((uint64_t)INT64_MAX + 1);
    REFUSED(t, "op: not an int64");
    t = tree_of(&sw), *get(root(t), "op") = STR("1");
    REFUSED(t, "op: not an int64");
    t = tree_of(&sw), *get(root(t), "op") = u64_obj(INT64_MAX);
    accepted(t);

    static const double bad_ms[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, -1.0, -1e-300};
    for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++) {
        t = tree_of(&sw), *get(root(t), "remaining_ms") = f64_obj(bad_ms[i]);
        REFUSED(t, "start_write: remaining_ms not a finite number > 0");
    }
    t = tree_of(&sw), *get(root(t), "remaining_ms") = u64_obj(0);
    REFUSED(t, "start_write: remaining_ms not a finite number > 0");
    t = tree_of(&sw), *get(root(t), "remaining_ms") = neg_obj(-5);
    REFUSED(t, "start_write: remaining_ms not a number");
    t = tree_of(&sw), *get(root(t), "remaining_ms") = bool_obj(true);
    REFUSED(t, "start_write: remaining_ms not a number");
    t = tree_of(&sw), *get(root(t), "remaining_ms") = STR("5");
    REFUSED(t, "start_write: remaining_ms not a number");
    /* An integer and a float32 are numbers too. */
    t = tree_of(&sw), *get(root(t), "remaining_ms") = u64_obj(250);
    accepted(t);
    msgpack_object f32 = {.type = MSGPACK_OBJECT_FLOAT32};
    f32.via.f64 = 0.5;
    t = tree_of(&sw), *get(root(t), "remaining_ms") = f32;
    accepted(t);

    /* Ref indices and completed indices are unsigned. */
    t = tree_of(&sw), get(root(t), "dst")->via.array.ptr[1].via.array.ptr[0].via.array.ptr[2] =
                          neg_obj(-1);
    REFUSED(t, "start_write: ref index not an unsigned integer");
    t = tree_of(&sw), get(root(t), "dst")->via.array.ptr[0].via.array.ptr[0].via.array.ptr[2] =
                          f64_obj(3.0);
    REFUSED(t, "start_write: ref index not an unsigned integer");
    t = tree_of(&done), get(root(t), "completed")->via.array.ptr[1] = neg_obj(-1);
    REFUSED(t, "write_done: completed index not unsigned");
    t = tree_of(&done), get(root(t), "completed")->via.array.ptr[1] = bool_obj(false);
    REFUSED(t, "write_done: completed index not unsigned");
    t = tree_of(&done), get(root(t), "completed")->via.array.ptr[3] = u64_obj(7);
    REFUSED(t, "write_done: duplicate completed index");
    t = tree_of(&done), get(root(t), "completed")->via.array.ptr[0] = u64_obj(WIRE_MAX_KEYS);
    REFUSED(t, "write_done: completed index out of range");
    t = tree_of(&done), get(root(t), "completed")->via.array.ptr[0] = u64_obj(UINT64_MAX);
    REFUSED(t, "write_done: completed index out of range");
    t = tree_of(&done), *get(root(t), "completed") = u64_obj(1);
    REFUSED(t, "write_done: completed not an array");
}

static void test_start_write_bounds(void **state)
{
    (void)state;
    wire_msg sw = full_start_write();
    static uint8_t big[WIRE_MAX_KEY + 1];
    tree *t;

    t = tree_of(&sw), get(root(t), "keys")->via.array.ptr[0] = bin_obj(big, WIRE_MAX_KEY + 1);
    REFUSED(t, "start_write: key not a bin of 1..1024 bytes");
    t = tree_of(&sw), get(root(t), "keys")->via.array.ptr[0] = bin_obj(big, 0);
    REFUSED(t, "start_write: key not a bin of 1..1024 bytes");
    t = tree_of(&sw), get(root(t), "keys")->via.array.ptr[0] = STR("k");
    REFUSED(t, "start_write: key not a bin of 1..1024 bytes");
    t = tree_of(&sw), *get(root(t), "keys") = arr_obj(t, 0);
    REFUSED(t, "start_write: no keys");
    t = tree_of(&sw), *get(root(t), "keys") = bin_obj("k", 1);
    REFUSED(t, "start_write: keys not an array");
    t = tree_of(&sw), get(root(t), "dst")->via.array.size = 2;
    REFUSED(t, "start_write: key count differs from dst count");
    t = tree_of(&sw), *get(root(t), "dst") = nil_obj();
    REFUSED(t, "start_write: dst not an array");
    t = tree_of(&sw), get(root(t), "dst")->via.array.ptr[0] = arr_obj(t, 0);
    REFUSED(t, "start_write: refs per key not 1..255");
    t = tree_of(&sw), get(root(t), "dst")->via.array.ptr[0] = u64_obj(0);
    REFUSED(t, "start_write: dst entry not an array");

    /* 256 refs for one key: one too many. */
    t = tree_of(&sw);
    msgpack_object *refs = &get(root(t), "dst")->via.array.ptr[2];
    msgpack_object more = arr_obj(t, WIRE_MAX_REFS + 1);
    memcpy(more.via.array.ptr, refs->via.array.ptr, WIRE_MAX_REFS * sizeof(msgpack_object));
    more.via.array.ptr[WIRE_MAX_REFS] = refs->via.array.ptr[0];
    *refs = more;
    REFUSED(t, "start_write: refs per key not 1..255");

    /* A ref is exactly [bool, str 0..256, uint]. */
    msgpack_object *ref;
#define REF0(t) (&get(root(t), "dst")->via.array.ptr[0].via.array.ptr[0])
    t = tree_of(&sw), REF0(t)->via.array.size = 2;
    REFUSED(t, "start_write: ref not a [fw, label, index] array");
    t = tree_of(&sw), ref = REF0(t), *ref = arr_obj(t, 4);
    ref->via.array.ptr[0] = bool_obj(true), ref->via.array.ptr[1] = STR("");
    ref->via.array.ptr[2] = ref->via.array.ptr[3] = u64_obj(1);
    REFUSED(t, "start_write: ref not a [fw, label, index] array");
    t = tree_of(&sw), *REF0(t) = u64_obj(1);
    REFUSED(t, "start_write: ref not a [fw, label, index] array");
    t = tree_of(&sw), REF0(t)->via.array.ptr[0] = u64_obj(1);
    REFUSED(t, "start_write: ref fw not a bool");
    t = tree_of(&sw), REF0(t)->via.array.ptr[1] = bin_obj("pool", 4);
    REFUSED(t, "start_write: ref label not UTF-8 of 0..256 bytes");
    static char label[WIRE_MAX_NAME + 1];
    memset(label, 'l', sizeof label);
    t = tree_of(&sw), REF0(t)->via.array.ptr[1] = str_obj(label, WIRE_MAX_NAME + 1);
    REFUSED(t, "start_write: ref label not UTF-8 of 0..256 bytes");
    t = tree_of(&sw), REF0(t)->via.array.ptr[1] = str_obj(label, WIRE_MAX_NAME);
    accepted(t);
#undef REF0
}

/* 65536 keys are allowed, 65537 are not; built as trees, one ref each. */
static void test_key_count_bound(void **state)
{
    (void)state;
    wire_msg sw = start_write();
    for (uint32_t n = WIRE_MAX_KEYS; n <= WIRE_MAX_KEYS + 1; n++) {
        tree *t = tree_of(&sw);
        msgpack_object keys = arr_obj(t, n), dst = arr_obj(t, n);
        uint32_t *raw = zalloc(t, n * sizeof *raw);
        msgpack_object one_ref = get(root(t), "dst")->via.array.ptr[0];
        for (uint32_t i = 0; i < n; i++) {
            raw[i] = i;
            keys.via.array.ptr[i] = bin_obj(&raw[i], sizeof raw[i]);
            dst.via.array.ptr[i] = one_ref;
        }
        *get(root(t), "keys") = keys;
        *get(root(t), "dst") = dst;
        if (n == WIRE_MAX_KEYS) accepted(t);
        else REFUSED(t, "start_write: too many keys");
    }
}

static void test_metadata_region_rules(void **state)
{
    (void)state;
    wire_msg md = base(WIRE_METADATA);
    with_md(&md, 2);
    static uint8_t blob[WIRE_MAX_BLOB + 1];
    tree *t;
#define MD(t) get(root(t), "md")
#define REG(t) (&get(MD(t), "regions")->via.array.ptr[1])

    t = tree_of(&md), *MD(t) = nil_obj();
    REFUSED(t, "md: not a map");
    t = tree_of(&md), del(MD(t), "worker");
    REFUSED(t, "md: missing field");
    t = tree_of(&md), *add(t, MD(t), STR("extra")) = u64_obj(0);
    REFUSED(t, "unknown key");
    t = tree_of(&md), *add(t, MD(t), STR("worker")) = bin_obj("w", 1);
    REFUSED(t, "duplicate key");
    t = tree_of(&md), *get(MD(t), "worker") = bin_obj(blob, 0);
    REFUSED(t, "md: worker not a bin of 1..65536 bytes");
    t = tree_of(&md), *get(MD(t), "worker") = bin_obj(blob, WIRE_MAX_BLOB + 1);
    REFUSED(t, "md: worker not a bin of 1..65536 bytes");
    t = tree_of(&md), *get(MD(t), "worker") = bin_obj(blob, WIRE_MAX_BLOB);
    accepted(t);
    t = tree_of(&md), *get(MD(t), "regions") = u64_obj(0);
    REFUSED(t, "md: regions not an array");

    for (uint32_t n = WIRE_MAX_REGIONS; n <= WIRE_MAX_REGIONS + 1; n++) {
        t = tree_of(&md);
        msgpack_object rs = arr_obj(t, n);
        for (uint32_t i = 0; i < n; i++) rs.via.array.ptr[i] = *REG(t);
        *get(MD(t), "regions") = rs;
        if (n == WIRE_MAX_REGIONS) accepted(t);
        else REFUSED(t, "md: too many regions");
    }

    t = tree_of(&md), *REG(t) = arr_obj(t, 0);
    REFUSED(t, "region: not a map");
    static const char *const keys[] = {"label", "fw", "addr", "size", "stride", "count", "rkey"};
    for (size_t i = 0; i < 7; i++) {
        t = tree_of(&md), del(REG(t), keys[i]);
        REFUSED(t, "region: missing field");
    }
    t = tree_of(&md), *add(t, REG(t), STR("label")) = STR("");
    REFUSED(t, "duplicate key");
    t = tree_of(&md), *get(REG(t), "label") = STR("a\0");
    REFUSED(t, "region: label not UTF-8 of 0..256 bytes");
    t = tree_of(&md), *get(REG(t), "label") = nil_obj();
    REFUSED(t, "region: label not a str");
    t = tree_of(&md), *get(REG(t), "fw") = u64_obj(1);
    REFUSED(t, "region: fw not a bool");
    t = tree_of(&md), *get(REG(t), "rkey") = bin_obj(blob, 0);
    REFUSED(t, "region: rkey not 1..65536 bytes");
    t = tree_of(&md), *get(REG(t), "rkey") = STR("rkey");
    REFUSED(t, "region: rkey not a bin");
    t = tree_of(&md), *get(REG(t), "addr") = neg_obj(-4096);
    REFUSED(t, "region: addr, size, stride and count must be unsigned integers");
    t = tree_of(&md), *get(REG(t), "count") = f64_obj(2);
    REFUSED(t, "region: addr, size, stride and count must be unsigned integers");

    /* size > 0, stride >= size, count >= 1, and the extent fits in u64. */
    struct { uint64_t addr, size, stride, count; const char *why; } r[] = {
        {0, 0, 0, 1, "region: size is 0"},
        {0, 64, 63, 1, "region: stride smaller than size"},
        {0, 64, 64, 0, "region: count is 0"},
        {0, 4, 4, (UINT64_C(1) << 62) - 1, NULL},                           /* ends at 2^64-4 */
        {0, 4, 4, UINT64_C(1) << 62, "region: extent overflows u64"},       /* ends at 2^64 */
        {0, 4, 8, (UINT64_C(1) << 61) + 1, "region: extent overflows u64"},
        {0, 1, UINT64_MAX, 2, "region: extent overflows u64"},
        {0, UINT64_MAX, UINT64_MAX, 1, NULL},
        {1, UINT64_MAX, UINT64_MAX, 1, "region: extent overflows u64"},
        {UINT64_MAX - 15, 16, 16, 1, "region: extent overflows u64"},
        {UINT64_MAX - 16, 16, 16, 1, NULL},
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        t = tree_of(&md);
        *get(REG(t), "addr") = u64_obj(r[i].addr);
        *get(REG(t), "size") = u64_obj(r[i].size);
        *get(REG(t), "stride") = u64_obj(r[i].stride);
        *get(REG(t), "count") = u64_obj(r[i].count);
        if (r[i].why) REFUSED(t, r[i].why);
        else accepted(t);
    }
#undef MD
#undef REG
}

/* Every proper prefix of each valid message is refused (from an
 * exact-size copy, so an overread shows under ASan). */
static void test_truncation_at_every_offset(void **state)
{
    (void)state;
    wire_msg ms[7] = {base(WIRE_METADATA), base(WIRE_METADATA_ACK), full_start_write(),
                      write_done(true, 4), base(WIRE_WRITE_REFUSED), base(WIRE_WRITE_PROBE),
                      base(WIRE_WRITE_PROBE_ACK)};
    with_md(&ms[0], 2);
    for (int i = 1; i < 7; i++) ms[i].has_op = true;
    ms[6].has_dead_inc = true, ms[6].dead_inc = (wire_bytes){INC_B, 16};
    for (int i = 0; i < 7; i++) {
        void *buf;
        size_t len;
        assert_int_equal(wire_encode(&ms[i], &buf, &len), 0);
        for (size_t cut = 0; cut < len; cut++) refused_bytes(buf, cut);
        /* And one byte more is trailing garbage. */
        uint8_t *longer = malloc(len + 1);
        memcpy(longer, buf, len);
        longer[len] = 0xc0;
        assert_string_equal(refused_bytes(longer, len + 1), "trailing bytes after the message");
        free(longer);
        free(buf);
    }
}

static void test_malformed_msgpack(void **state)
{
    (void)state;
    /* A length header promising far more than the message holds is refused
     * before msgpack-c would allocate an object array for it. */
    static const uint8_t huge_array[] = {0x81, 0xa4, 'k', 'e', 'y', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff};
    static const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t huge_inner_map[] = {0x81, 0xa2, 'm', 'd', 0xdf, 0x10, 0, 0, 0, 0xc0, 0xc0};
    static const uint8_t huge_str[] = {0x81, 0xdb, 0xff, 0xff, 0xff, 0xff, 'v'};
    static const uint8_t huge_bin[] = {0x81, 0xa3, 'i', 'n', 'c', 0xc6, 0x80, 0, 0, 0};
    assert_string_equal(refused_bytes(huge_array, sizeof huge_array), "container longer than the message");
    assert_string_equal(refused_bytes(huge_map, sizeof huge_map), "container longer than the message");
    assert_string_equal(refused_bytes(huge_inner_map, sizeof huge_inner_map),
                        "container longer than the message");
    assert_string_equal(refused_bytes(huge_str, sizeof huge_str), "truncated message");
    assert_string_equal(refused_bytes(huge_bin, sizeof huge_bin), "truncated message");

    static const uint8_t not_map_int[] = {0x05};
    static const uint8_t not_map_arr[] = {0x91, 0x80};
    static const uint8_t not_map_nil[] = {0xc0};
    assert_string_equal(refused_bytes(not_map_int, 1), "message is not a map");
    assert_string_equal(refused_bytes(not_map_arr, 2), "message is not a map");
    assert_string_equal(refused_bytes(not_map_nil, 1), "message is not a map");
    assert_string_equal(refused_bytes(NULL, 0), "truncated message");
    static const uint8_t two_maps[] = {0x80, 0x80};
    assert_string_equal(refused_bytes(two_maps, 2), "trailing bytes after the message");
    static const uint8_t c1[] = {0x81, 0xa1, 'v', 0xc1};
    assert_string_equal(refused_bytes(c1, sizeof c1), "invalid msgpack byte 0xc1");
    static const uint8_t ext[] = {0x81, 0xa1, 'v', 0xd4, 0x01, 0x01};
    assert_string_equal(refused_bytes(ext, sizeof ext), "msgpack ext types are not allowed");
    static const uint8_t ext8[] = {0x81, 0xa1, 'v', 0xc7, 0x01, 0x05, 0x00};
    assert_string_equal(refused_bytes(ext8, sizeof ext8), "msgpack ext types are not allowed");

    /* Nesting deeper than msgpack-c's stack: refused, not a crash. */
    uint8_t deep[3 + 200];
    memcpy(deep, (const uint8_t[]){0x81, 0xa1, 'v'}, 3);
    memset(deep + 3, 0x91, 199);
    deep[3 + 199] = 0xc0;
    refused_bytes(deep, sizeof deep);

    /* A message over WIRE_MAX_MESSAGE is refused on its length alone. */
    size_t n = WIRE_MAX_MESSAGE + 1;
    uint8_t *big = calloc(1, n);
    assert_non_null(big);
    big[0] = 0x80;
    wire_msg out;
    const char *why;
    assert_int_equal(wire_decode(big, n, &out, &why), -1);
    assert_string_equal(why, "message too large");
    free(big);

    wire_msg zero;
    memset(&zero, 0, sizeof zero);
    wire_msg_free(&zero); /* safe on a zeroed message */
}

static void expect_unencodable(const wire_msg *m, int line)
{
    void *buf = (void *)1;
    size_t len = 1;
    if (wire_encode(m, &buf, &len) != -1) fail_msg("line %d: encoded", line);
    assert_null(buf);
    assert_int_equal(len, 0);
}
#define UNENCODABLE(m) expect_unencodable(&(m), __LINE__)

static void test_encoder_refuses_what_the_decoder_refuses(void **state)
{
    (void)state;
    static uint8_t big[WIRE_MAX_KEY + 1];
    static char name[WIRE_MAX_NAME + 1];
    memset(name, 'x', sizeof name);
    wire_msg m, good = full_start_write();
    wire_region rs[2];
    uint32_t off[4];
    wire_ref refs[sizeof sw_refs / sizeof sw_refs[0]];

    m = good, m.type = 0;
    UNENCODABLE(m);
    m = good, m.type = WIRE_WRITE_PROBE_ACK + 1;
    UNENCODABLE(m);
    m = good, m.agent = WB("");
    UNENCODABLE(m);
    m = good, m.from = (wire_bytes){(const uint8_t *)name, WIRE_MAX_NAME + 1};
    UNENCODABLE(m);
    m = good, m.to = WB("a\0b");
    UNENCODABLE(m);
    m = good, m.to = WB("\xff");
    UNENCODABLE(m);
    m = good, m.incarnation.len = 15;
    UNENCODABLE(m);
    m = good, m.expected_inc.len = 17;
    UNENCODABLE(m);
    m = good, m.has_op = false; /* op is required */
    UNENCODABLE(m);
    m = base(WIRE_METADATA); /* md is required */
    UNENCODABLE(m);
    m = good, m.remaining_ms = NAN;
    UNENCODABLE(m);
    m = good, m.remaining_ms = 0;
    UNENCODABLE(m);
    m = good, m.n_keys = 0;
    UNENCODABLE(m);
    m = good, m.n_keys = WIRE_MAX_KEYS + 1;
    UNENCODABLE(m);
    m = good, m.keys = NULL;
    UNENCODABLE(m);
    wire_bytes keys[3];
    memcpy(keys, sw_keys, sizeof keys);
    m = good, m.keys = keys, keys[1] = (wire_bytes){big, WIRE_MAX_KEY + 1};
    UNENCODABLE(m);
    keys[1] = (wire_bytes){big, 0};
    UNENCODABLE(m);
    memcpy(off, sw_off, sizeof off);
    m = good, m.ref_off = off, off[1] = 0; /* a key without refs */
    UNENCODABLE(m);
    off[1] = 1, off[3] = off[2] + WIRE_MAX_REFS + 1;
    UNENCODABLE(m);
    memcpy(off, sw_off, sizeof off);
    off[0] = 1;
    UNENCODABLE(m);
    memcpy(refs, sw_refs, sizeof refs);
    m = good, m.refs = refs, refs[2].label = (wire_bytes){(const uint8_t *)name, WIRE_MAX_NAME + 1};
    UNENCODABLE(m);
    memcpy(rs, regions, sizeof rs);
    m = good, m.md.regions = rs, rs[1].stride = rs[1].element_size - 1;
    UNENCODABLE(m);
    rs[1] = regions[1], rs[1].count = UINT64_MAX;
    UNENCODABLE(m);
    rs[1] = regions[1], rs[1].rkey.len = 0;
    UNENCODABLE(m);
    m = good, m.md.n_regions = WIRE_MAX_REGIONS + 1;
    UNENCODABLE(m);
    m = good, m.md.worker_addr.len = 0;
    UNENCODABLE(m);

    m = write_done(false, 2); /* completed only with success */
    UNENCODABLE(m);
    uint32_t dup[] = {4, 9, 4};
    m = write_done(true, 3), m.completed = dup;
    UNENCODABLE(m);
    dup[2] = WIRE_MAX_KEYS;
    UNENCODABLE(m);
    m = base(WIRE_WRITE_PROBE_ACK), m.has_op = m.has_dead_inc = true, m.dead_inc.len = 16;
    UNENCODABLE(m); /* dead_inc data NULL */

    /* Over WIRE_MAX_MESSAGE: 65536 keys of 1024 bytes is 64 MiB. */
    static uint8_t kbytes[WIRE_MAX_KEY];
    wire_bytes *many = malloc(WIRE_MAX_KEYS * sizeof *many);
    uint32_t *moff = malloc((WIRE_MAX_KEYS + 1) * sizeof *moff);
    wire_ref *mref = malloc(WIRE_MAX_KEYS * sizeof *mref);
    for (uint32_t i = 0; i < WIRE_MAX_KEYS; i++) {
        many[i] = (wire_bytes){kbytes, WIRE_MAX_KEY};
        moff[i] = i;
        mref[i] = (wire_ref){true, WB(""), i};
    }
    moff[WIRE_MAX_KEYS] = WIRE_MAX_KEYS;
    m = start_write(), m.n_keys = WIRE_MAX_KEYS, m.keys = many, m.ref_off = moff, m.refs = mref;
    UNENCODABLE(m);
    /* With 1-byte keys it fits, and round-trips. */
    for (uint32_t i = 0; i < WIRE_MAX_KEYS; i++) many[i].len = 1;
    roundtrip(&m);
    free(many);
    free(moff);
    free(mref);
}

/* Inline writes: start_write's inline flag (only true, only there), and
 * write_done's runs and bytes: together, only with success, never with
 * am_bytes, the bytes exactly what the runs announce, every run >= 1 byte
 * and inside u64, at most WIRE_MAX_INLINE bytes in all. */
static wire_run inl_runs[2] = {{0x7f0000001000ull, 3}, {UINT64_MAX - 2, 2}};

static wire_msg inline_done(void)
{
    wire_msg m = write_done(true, 2);
    m.has_inline = true;
    m.n_runs = 2;
    m.runs = inl_runs;
    m.inline_data = WB("abc\0e");
    return m;
}

/* put_min: start_write only, an unsigned count >= 1 (absent is the only
 * "never"), never beside inline; its value takes part in equality. */
static void test_put_min_rides_start_write_only_as_a_positive_count(void **state)
{
    (void)state;
    wire_msg sw = full_start_write();
    sw.has_put_min = true;
    sw.put_min = 1u << 20;
    roundtrip(&sw);
    wire_msg big = sw;
    big.put_min = UINT64_MAX;
    roundtrip(&big);
    assert_false(wire_msg_equal(&sw, &big));
    wire_msg none_sent = full_start_write();
    assert_false(wire_msg_equal(&sw, &none_sent));
    wire_msg zero = sw, both = sw;
    zero.put_min = 0;
    both.inline_write = true;
    void *buf;
    size_t len;
    assert_int_equal(wire_encode(&zero, &buf, &len), -1); /* the encoder keeps the rules */
    assert_int_equal(wire_encode(&both, &buf, &len), -1);
    wire_msg probe = base(WIRE_WRITE_PROBE); /* a type without it: encodes as bare */
    probe.has_op = true, probe.has_put_min = true, probe.put_min = 5;
    roundtrip(&probe);

    tree *t;
    t = tree_of(&sw), *get(root(t), "put_min") = u64_obj(0);
    REFUSED(t, "start_write: put_min not an unsigned integer >= 1");
    t = tree_of(&sw), *get(root(t), "put_min") = neg_obj(-1);
    REFUSED(t, "start_write: put_min not an unsigned integer >= 1");
    t = tree_of(&sw), *get(root(t), "put_min") = bool_obj(true);
    REFUSED(t, "start_write: put_min not an unsigned integer >= 1");
    t = tree_of(&sw), *add(t, root(t), STR("inline")) = bool_obj(true);
    REFUSED(t, "start_write: put_min and inline are exclusive");
    wire_msg done = write_done(true, 2);
    t = tree_of(&done), *add(t, root(t), STR("put_min")) = u64_obj(4096);
    REFUSED(t, "field not allowed for this type: put_min");
}

static void test_inline_writes(void **state)
{
    (void)state;
    wire_msg sw = full_start_write(), done = inline_done();
    sw.inline_write = true;
    roundtrip(&sw);
    roundtrip(&done);
    wire_msg plain = write_done(true, 2), e = done;
    assert_false(wire_msg_equal(&done, &plain));
    wire_run other[2] = {inl_runs[0], {UINT64_MAX - 2, 1}};
    e.runs = other, e.inline_data = WB("abc\0");
    assert_false(wire_msg_equal(&done, &e));
    e = done, e.inline_data = WB("abc\0f");
    assert_false(wire_msg_equal(&done, &e));
    wire_msg nsw = full_start_write();
    assert_false(wire_msg_equal(&sw, &nsw));
    wire_msg refused = base(WIRE_WRITE_REFUSED); /* a type without them: encodes as bare */
    refused.has_op = true, refused.inline_write = refused.has_inline = true;
    refused.n_runs = 2, refused.runs = inl_runs, refused.inline_data = done.inline_data;
    roundtrip(&refused);

    tree *t;
    t = tree_of(&sw), *get(root(t), "inline") = bool_obj(false);
    REFUSED(t, "start_write: inline must be true when present");
    t = tree_of(&sw), *get(root(t), "inline") = u64_obj(1);
    REFUSED(t, "start_write: inline must be true when present");
    t = tree_of(&done), *add(t, root(t), STR("inline")) = bool_obj(true);
    REFUSED(t, "field not allowed for this type: inline");
    t = tree_of(&sw), *add(t, root(t), STR("inline_data")) = bin_obj("x", 1);
    REFUSED(t, "field not allowed for this type: inline_data");
    t = tree_of(&done), del(root(t), "inline_data");
    REFUSED(t, "write_done: inline_runs and inline_data go together");
    t = tree_of(&done), del(root(t), "inline_runs");
    REFUSED(t, "write_done: inline_runs and inline_data go together");
    t = tree_of(&done), *get(root(t), "success") = bool_obj(false), del(root(t), "completed");
    REFUSED(t, "write_done: inline bytes only with success");
    t = tree_of(&done), *add(t, root(t), STR("am_bytes")) = u64_obj(5);
    REFUSED(t, "write_done: inline bytes and am_bytes are exclusive");
    t = tree_of(&done), *get(root(t), "inline_data") = bin_obj("abcd", 4); /* one short */
    REFUSED(t, "write_done: inline_data is not the bytes its runs announce");
    t = tree_of(&done), *get(root(t), "inline_data") = bin_obj("abcdef", 6); /* one over */
    REFUSED(t, "write_done: inline_data is not the bytes its runs announce");
    t = tree_of(&done), *get(root(t), "inline_data") = STR("abc\0e");
    REFUSED(t, "write_done: inline_data not a bin");
    t = tree_of(&done), *get(root(t), "inline_runs") = arr_obj(t, 0);
    REFUSED(t, "write_done: no inline runs");
    t = tree_of(&done), *get(root(t), "inline_runs") = u64_obj(5);
    REFUSED(t, "write_done: inline_runs not an array");
    static const char *const bad_run = "write_done: inline run not an [addr, len] array of unsigned integers";
    t = tree_of(&done), get(root(t), "inline_runs")->via.array.ptr[0].via.array.size = 1;
    REFUSED(t, bad_run);
    t = tree_of(&done), get(root(t), "inline_runs")->via.array.ptr[1].via.array.ptr[0] = neg_obj(-1);
    REFUSED(t, bad_run);
    t = tree_of(&done), get(root(t), "inline_runs")->via.array.ptr[0] = u64_obj(3);
    REFUSED(t, bad_run);
    /* A run of 0 bytes; a run past the end of the address space. */
    t = tree_of(&done), get(root(t), "inline_runs")->via.array.ptr[0].via.array.ptr[1] = u64_obj(0);
    REFUSED(t, "write_done: an inline run of 0 bytes");
    t = tree_of(&done), get(root(t), "inline_runs")->via.array.ptr[1].via.array.ptr[1] = u64_obj(3);
    REFUSED(t, "write_done: inline run overflows u64");
    /* The bound on the bytes: WIRE_MAX_INLINE in all, however split. */
    static uint8_t big[WIRE_MAX_INLINE + 1];
    wire_run one = {0x1000, WIRE_MAX_INLINE};
    wire_msg most = write_done(true, 1);
    most.has_inline = true, most.n_runs = 1, most.runs = &one;
    most.inline_data = (wire_bytes){big, WIRE_MAX_INLINE};
    roundtrip(&most);
    t = tree_of(&most), get(root(t), "inline_runs")->via.array.ptr[0].via.array.ptr[1] =
                           u64_obj(WIRE_MAX_INLINE + 1);
    *get(root(t), "inline_data") = bin_obj(big, WIRE_MAX_INLINE + 1);
    REFUSED(t, "write_done: inline runs over 1 MiB");

    /* The encoder makes none of these. */
    e = done, e.inline_data = WB("abcd");
    UNENCODABLE(e);
    e = done, e.n_runs = 0;
    UNENCODABLE(e);
    e = done, e.has_am_bytes = true;
    UNENCODABLE(e);
    e = done, e.success = false, e.n_completed = 0;
    UNENCODABLE(e);
    one.len = WIRE_MAX_INLINE + 1;
    most.inline_data = (wire_bytes){big, WIRE_MAX_INLINE + 1};
    UNENCODABLE(most);
}

/* A well-formed times array [serve, pin, data]. */
static msgpack_object times_obj(tree *t, uint64_t serve, uint64_t pin, uint64_t data)
{
    msgpack_object o = arr_obj(t, 3);
    o.via.array.ptr[0] = u64_obj(serve);
    o.via.array.ptr[1] = u64_obj(pin);
    o.via.array.ptr[2] = u64_obj(data);
    return o;
}

/* write_done's times: the source's durations, [serve, pin, data], unsigned,
 * pin + data within serve, serve within WIRE_MAX_TIME_NS; optional (a
 * source that does not send them is understood), only in write_done. */
static void test_write_done_times(void **state)
{
    (void)state;
    wire_msg done = write_done(true, 4);
    done.has_times = true;
    done.times = (wire_times){1500000, 400000, 900000};
    roundtrip(&done);
    wire_msg failed = write_done(false, 0); /* a failure says how it was served too */
    failed.has_times = true;
    failed.times = (wire_times){7, 0, 0};
    roundtrip(&failed);
    wire_msg most = done, full = done, zero = done, none_sent = write_done(true, 4);
    most.times = (wire_times){WIRE_MAX_TIME_NS, WIRE_MAX_TIME_NS / 2, WIRE_MAX_TIME_NS / 2 + 1};
    full.times = (wire_times){10, 3, 7}; /* the parts may fill the whole */
    zero.times = (wire_times){0, 0, 0};
    roundtrip(&most);
    roundtrip(&full);
    roundtrip(&zero);
    roundtrip(&none_sent);
    wire_msg inl = inline_done(), am = write_done(true, 2); /* beside either way of writing */
    inl.has_times = am.has_times = true;
    inl.times = am.times = done.times;
    am.has_am_bytes = true, am.am_bytes = 4096;
    roundtrip(&inl);
    roundtrip(&am);
    /* Equality sees each duration and the field itself. */
    assert_false(wire_msg_equal(&done, &none_sent));
    for (int i = 0; i < 3; i++) {
        wire_msg e = done;
        uint64_t *f[] = {&e.times.serve_ns, &e.times.pin_ns, &e.times.data_ns};
        (*f[i])--;
        if (wire_msg_equal(&done, &e)) fail_msg("times mutation %d not noticed", i);
    }
    wire_msg probe = base(WIRE_WRITE_PROBE_ACK); /* a type without it: encodes as bare */
    probe.has_op = probe.has_times = true, probe.times = done.times;
    roundtrip(&probe);

    static const char *const bad = "write_done: times not a [serve, pin, data] array of unsigned integers";
    tree *t;
    t = tree_of(&done), *get(root(t), "times") = u64_obj(5);
    REFUSED(t, bad);
    t = tree_of(&done), get(root(t), "times")->via.array.size = 2;
    REFUSED(t, bad);
    t = tree_of(&done);
    msgpack_object four = arr_obj(t, 4);
    for (uint32_t i = 0; i < 4; i++) four.via.array.ptr[i] = u64_obj(1);
    *get(root(t), "times") = four;
    REFUSED(t, bad);
    for (uint32_t i = 0; i < 3; i++) {
        t = tree_of(&done), get(root(t), "times")->via.array.ptr[i] = neg_obj(-1);
        REFUSED(t, bad);
        t = tree_of(&done), get(root(t), "times")->via.array.ptr[i] = f64_obj(1.0);
        REFUSED(t, bad);
    }
    t = tree_of(&full), get(root(t), "times")->via.array.ptr[0] = u64_obj(9); /* one short */
    REFUSED(t, "write_done: times pin + data over serve");
    t = tree_of(&full), get(root(t), "times")->via.array.ptr[2] = u64_obj(8);
    REFUSED(t, "write_done: times pin + data over serve");
    t = tree_of(&most), get(root(t), "times")->via.array.ptr[1] = u64_obj(UINT64_MAX);
    REFUSED(t, "write_done: times pin + data over serve"); /* the sum overflows */
    t = tree_of(&most), get(root(t), "times")->via.array.ptr[0] = u64_obj(WIRE_MAX_TIME_NS + 1);
    REFUSED(t, "write_done: times serve over the bound");
    t = tree_of(&full), get(root(t), "times")->via.array.ptr[0] = u64_obj(10);
    accepted(t); /* the bound's other side */
    wire_msg sw = full_start_write(), refused = base(WIRE_WRITE_REFUSED);
    refused.has_op = true;
    t = tree_of(&sw), *add(t, root(t), STR("times")) = times_obj(t, 3, 1, 1);
    REFUSED(t, "field not allowed for this type: times");
    t = tree_of(&refused), *add(t, root(t), STR("times")) = times_obj(t, 3, 1, 1);
    REFUSED(t, "field not allowed for this type: times");
    t = tree_of(&none_sent), *add(t, root(t), STR("times")) = times_obj(t, 3, 1, 1);
    accepted(t);

    /* The encoder makes none of these. */
    wire_msg e = full;
    e.times.serve_ns = 9;
    UNENCODABLE(e);
    e = most, e.times.pin_ns = UINT64_MAX;
    UNENCODABLE(e);
    e = most, e.times.serve_ns = WIRE_MAX_TIME_NS + 1;
    UNENCODABLE(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_round_trips_with_and_without_optional_fields),
        cmocka_unit_test(test_the_encoder_writes_only_what_the_type_carries),
        cmocka_unit_test(test_equal_notices_every_field),
        cmocka_unit_test(test_envelope_rules),
        cmocka_unit_test(test_fields_each_type_requires_and_allows),
        cmocka_unit_test(test_write_refused_busy),
        cmocka_unit_test(test_inline_writes),
        cmocka_unit_test(test_put_min_rides_start_write_only_as_a_positive_count),
        cmocka_unit_test(test_write_done_times),
        cmocka_unit_test(test_integer_and_number_rules),
        cmocka_unit_test(test_start_write_bounds),
        cmocka_unit_test(test_key_count_bound),
        cmocka_unit_test(test_metadata_region_rules),
        cmocka_unit_test(test_truncation_at_every_offset),
        cmocka_unit_test(test_malformed_msgpack),
        cmocka_unit_test(test_encoder_refuses_what_the_decoder_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
