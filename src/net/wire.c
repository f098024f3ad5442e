/* The peer control messages in msgpack. Every message is one map with str
 * keys, and nothing after it:
 *
 *   key           msgpack     carried by
 *   v             uint        all; == WIRE_VERSION
 *   type          str         all; wire_type_name()
 *   agent         str         all; 1..WIRE_MAX_NAME bytes
 *   inc           bin         all; WIRE_INCARNATION_LEN bytes
 *   from          str         all; 1..WIRE_MAX_NAME bytes
 *   to            str         all; 1..WIRE_MAX_NAME bytes
 *   md            map         metadata (required); start_write, write_probe (optional)
 *   op            int         all but metadata (optional in metadata_ack); int64
 *   remaining_ms  float|uint  start_write; finite, > 0
 *   keys          [bin]       start_write; 1..WIRE_MAX_KEYS keys of 1..WIRE_MAX_KEY bytes
 *   dst           [[ref]]     start_write; one array of 1..WIRE_MAX_REFS refs per key
 *   expected_inc  bin         start_write, write_probe (optional); WIRE_INCARNATION_LEN bytes
 *   success       bool        write_done
 *   terminal      bool        write_done, write_probe_ack
 *   completed     [uint]      write_done, exactly when success; distinct, < WIRE_MAX_KEYS
 *   am_bytes      uint        write_done (optional, only with success): the bytes sent
 *                             as UCX active messages (absent: written with puts, flushed)
 *   dead_inc      bin         write_probe_ack (optional); WIRE_INCARNATION_LEN bytes
 *   busy          bool        write_refused (optional); only true: refused at a limit
 *   inline        bool        start_write (optional); only true: write the bytes in
 *                             write_done, never with UCX
 *   put_min       uint        start_write (optional, never with inline); >= 1: the
 *                             target takes UCX puts for this write even where every
 *                             lane is TCP (net/ucx.h) if every destination piece its
 *                             refs resolve to holds at least put_min bytes (absent:
 *                             such lanes carry messages)
 *   inline_runs   [[addr: uint, len: uint]]  write_done (optional, only with success,
 *                             never with am_bytes, always with inline_data): where the
 *                             inline bytes go; 1..WIRE_MAX_INLINE runs, len >= 1,
 *                             addr + len within u64
 *   inline_data   bin         write_done, exactly with inline_runs: the runs' bytes one
 *                             after another, as many as their lengths sum to (at most
 *                             WIRE_MAX_INLINE)
 *   times         [serve: uint, pin: uint, data: uint]  write_done (optional): the
 *                             source's durations in ns (wire_times): pin + data <=
 *                             serve <= WIRE_MAX_TIME_NS; absent: a source that does
 *                             not measure them
 *
 *   md      {"worker": bin 1..WIRE_MAX_BLOB, "regions": [region] 0..WIRE_MAX_REGIONS}
 *   region  {"label": str, "fw": bool, "addr": uint, "size": uint, "stride": uint,
 *            "count": uint, "rkey": bin 1..WIRE_MAX_BLOB}
 *   ref     [fw: bool, label: str, index: uint]   (a 3-array: a start_write may
 *                                                  carry millions of them)
 *
 * Every str (names, labels, endpoints) is UTF-8 without NUL bytes, so a
 * decoded copy is also a C string; labels may be empty, names may not.
 *
 * Decoding runs in three steps. A pre-scan (net/mpmap.h) walks the encoding
 * without building anything and refuses any length header promising more
 * elements than bytes remain: msgpack-c allocates an object array as soon as
 * it reads an array header, so this bounds its memory by the input size
 * (about 24 bytes per input byte at worst) before it runs. msgpack-c then
 * builds the object tree, and the tree is checked and copied twice by the
 * same code:
 * first with an empty arena, which checks every rule and sums the storage
 * needed, then into one exact allocation that the message owns. */
#include "net/wire.h"

#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "net/mpmap.h"

/* ---- field tables -------------------------------------------------------- */

#define FIELDS(X)                                                                            \
    X(V, "v") X(TYPE, "type") X(AGENT, "agent") X(INC, "inc") X(FROM, "from") X(TO, "to")    \
    X(MD, "md") X(OP, "op") X(REMAINING, "remaining_ms") X(KEYS, "keys") X(DST, "dst")       \
    X(EXPECTED, "expected_inc") X(SUCCESS, "success") X(TERMINAL, "terminal")                \
    X(COMPLETED, "completed") X(DEAD, "dead_inc") X(BUSY, "busy") X(AM_BYTES, "am_bytes")   \
    X(INLINE, "inline") X(RUNS, "inline_runs") X(DATA, "inline_data") X(PUT_MIN, "put_min") \
    X(TIMES, "times")

MPMAP_FIELD_TABLE(FIELDS);
static const char *const missing_why[N_FIELDS] = {
#define X(id, name) "missing field: " name,
    FIELDS(X)
#undef X
};
static const char *const extra_why[N_FIELDS] = {
#define X(id, name) "field not allowed for this type: " name,
    FIELDS(X)
#undef X
};

/* The deepest message: root map, metadata map, regions array, region map,
 * and a little room. */
#define WIRE_MAX_DEPTH 8

#define B(f) (1u << F_##f)
#define COMMON (B(V) | B(TYPE) | B(AGENT) | B(INC) | B(FROM) | B(TO))

/* Which fields each type requires and allows (beyond COMMON). completed is
 * allowed in write_done but required only when success: checked apart. */
static const struct shape {
    const char *name;
    uint32_t need, allow;
} shapes[] = {
    [WIRE_METADATA] = {"metadata", B(MD), B(MD)},
    [WIRE_METADATA_ACK] = {"metadata_ack", 0, B(OP)},
    [WIRE_START_WRITE] = {"start_write", B(OP) | B(REMAINING) | B(KEYS) | B(DST),
                          B(OP) | B(REMAINING) | B(KEYS) | B(DST) | B(EXPECTED) | B(MD) |
                              B(INLINE) | B(PUT_MIN)},
    [WIRE_WRITE_DONE] = {"write_done", B(OP) | B(SUCCESS) | B(TERMINAL),
                         B(OP) | B(SUCCESS) | B(TERMINAL) | B(COMPLETED) | B(AM_BYTES) |
                             B(RUNS) | B(DATA) | B(TIMES)},
    [WIRE_WRITE_REFUSED] = {"write_refused", B(OP), B(OP) | B(BUSY)},
    [WIRE_WRITE_PROBE] = {"write_probe", B(OP), B(OP) | B(EXPECTED) | B(MD)},
    [WIRE_WRITE_PROBE_ACK] = {"write_probe_ack", B(OP) | B(TERMINAL),
                              B(OP) | B(TERMINAL) | B(DEAD)},
};
#define N_TYPES (sizeof shapes / sizeof shapes[0])

const char wire_unknown_type[] = "unknown message type";

const char *wire_type_name(int type)
{
    return type > 0 && (size_t)type < N_TYPES ? shapes[type].name : NULL;
}

enum { MD_WORKER, MD_REGIONS, N_MD };
static const char *const md_names[N_MD] = {"worker", "regions"};

enum { R_LABEL, R_FW, R_ADDR, R_SIZE, R_STRIDE, R_COUNT, R_RKEY, N_REGION };
static const char *const region_names[N_REGION] = {"label", "fw",    "addr", "size",
                                                   "stride", "count", "rkey"};

/* The fields m carries: the flag of each optional field says whether it is
 * there, the others are there whenever the type allows them. A decoded
 * message's flags are set from what it had, so this is its key set. */
static uint32_t carried(const wire_msg *m)
{
    uint32_t f = ~(B(MD) | B(OP) | B(EXPECTED) | B(DEAD) | B(COMPLETED) | B(BUSY) | B(AM_BYTES) |
                   B(INLINE) | B(RUNS) | B(DATA) | B(PUT_MIN) | B(TIMES));
    if (m->has_metadata) f |= B(MD);
    if (m->has_op) f |= B(OP);
    if (m->has_expected_inc) f |= B(EXPECTED);
    if (m->has_dead_inc) f |= B(DEAD);
    if (m->success) f |= B(COMPLETED);
    if (m->busy) f |= B(BUSY);
    if (m->has_am_bytes) f |= B(AM_BYTES);
    if (m->inline_write) f |= B(INLINE);
    if (m->has_put_min) f |= B(PUT_MIN);
    if (m->has_inline) f |= B(RUNS) | B(DATA);
    if (m->has_times) f |= B(TIMES);
    return COMMON | (f & shapes[m->type].allow);
}

/* ---- rules shared by the decoder and the encoder --------------------------- */

/* Well-formed UTF-8 (no overlong forms, surrogates or NUL). */
static bool utf8_ok(const uint8_t *s, size_t n)
{
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp;
        if (s[i] == 0) return false;
        if (s[i] < 0x80) k = 1, cp = s[i];
        else if ((s[i] & 0xE0) == 0xC0) k = 2, cp = s[i] & 0x1F;
        else if ((s[i] & 0xF0) == 0xE0) k = 3, cp = s[i] & 0x0F;
        else if ((s[i] & 0xF8) == 0xF0) k = 4, cp = s[i] & 0x07;
        else return false;
        if (k > n - i) return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

static bool str_ok(wire_bytes b, size_t min)
{
    return b.len >= min && b.len <= WIRE_MAX_NAME && (b.data != NULL || b.len == 0) &&
           utf8_ok(b.data, b.len);
}

static bool bin_ok(wire_bytes b, size_t min, size_t max)
{
    return b.len >= min && b.len <= max && (b.data != NULL || b.len == 0);
}

static const char *region_rule(const wire_region *r)
{
    if (!str_ok(r->label, 0)) return "region: label not UTF-8 of 0..256 bytes";
    if (!bin_ok(r->rkey, 1, WIRE_MAX_BLOB)) return "region: rkey not 1..65536 bytes";
    if (r->element_size == 0) return "region: size is 0";
    if (r->stride < r->element_size) return "region: stride smaller than size";
    if (r->count == 0) return "region: count is 0";
    /* The last element ends at addr + (count-1)*stride + size. */
    uint64_t span;
    if (__builtin_mul_overflow(r->count - 1, r->stride, &span) ||
        __builtin_add_overflow(span, r->element_size, &span) ||
        __builtin_add_overflow(span, r->addr, &span))
        return "region: extent overflows u64";
    return NULL;
}

static const char *remaining_rule(double ms)
{
    return isfinite(ms) && ms > 0 ? NULL : "start_write: remaining_ms not a finite number > 0";
}

/* Marks one completed index in a WIRE_MAX_KEYS-bit set. */
static const char *completed_rule(uint64_t *seen, uint64_t idx)
{
    if (idx >= WIRE_MAX_KEYS) return "write_done: completed index out of range";
    if (seen[idx / 64] >> (idx % 64) & 1) return "write_done: duplicate completed index";
    seen[idx / 64] |= 1ull << (idx % 64);
    return NULL;
}

/* Adds one inline run to *sum (the bytes the runs announce). */
static const char *run_rule(const wire_run *run, uint64_t *sum)
{
    uint64_t end;
    if (run->len == 0) return "write_done: an inline run of 0 bytes";
    if (__builtin_add_overflow(run->addr, run->len, &end)) return "write_done: inline run overflows u64";
    if (run->len > WIRE_MAX_INLINE - *sum) return "write_done: inline runs over 1 MiB";
    *sum += run->len;
    return NULL;
}

/* The source's durations: its parts within the whole, the whole bounded. */
static const char *times_rule(const wire_times *t)
{
    uint64_t parts;
    if (t->serve_ns > WIRE_MAX_TIME_NS) return "write_done: times serve over the bound";
    if (__builtin_add_overflow(t->pin_ns, t->data_ns, &parts) || parts > t->serve_ns)
        return "write_done: times pin + data over serve";
    return NULL;
}

/* ---- decoding ---------------------------------------------------------------- */

/* Sizing pass: base NULL, take() only counts. Fill pass: real storage. */
typedef struct arena {
    uint8_t *base;
    size_t used;
} arena;

static void *take(arena *a, size_t n, size_t align)
{
    a->used = (a->used + align - 1) & ~(align - 1);
    void *p = a->base ? a->base + a->used : NULL;
    a->used += n;
    return p;
}

/* A NUL-terminated copy (len excludes the NUL). */
static wire_bytes copy(arena *a, const char *s, size_t n)
{
    uint8_t *p = take(a, n + 1, 1);
    if (p) {
        if (n > 0) memcpy(p, s, n); /* s may be NULL when n is 0 */
        p[n] = 0;
    }
    return (wire_bytes){p, n};
}

/* A str or bin object's bytes, uncopied. */
static bool get_raw(const msgpack_object *o, msgpack_object_type t, wire_bytes *v)
{
    if (o->type != t) return false;
    *v = (wire_bytes){(const uint8_t *)o->via.str.ptr, o->via.str.size};
    return true;
}

static bool get_str(arena *a, const msgpack_object *o, size_t min, wire_bytes *v)
{
    if (!get_raw(o, MSGPACK_OBJECT_STR, v) || !str_ok(*v, min)) return false;
    *v = copy(a, (const char *)v->data, v->len);
    return true;
}

static bool get_bin(arena *a, const msgpack_object *o, size_t min, size_t max, wire_bytes *v)
{
    if (!get_raw(o, MSGPACK_OBJECT_BIN, v) || !bin_ok(*v, min, max)) return false;
    *v = copy(a, (const char *)v->data, v->len);
    return true;
}

static const char *get_op(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) *v = o->via.i64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
        *v = (int64_t)o->via.u64;
    else return "op: not an int64";
    return NULL;
}

static const char *get_remaining(const msgpack_object *o, double *v)
{
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) *v = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) *v = (double)o->via.u64;
    else return "start_write: remaining_ms not a number";
    return remaining_rule(*v);
}

static const char *decode_region(arena *a, const msgpack_object *o, wire_region *r)
{
    const msgpack_object *f[N_REGION] = {0};
    uint32_t present;
    const char *why =
        mpmap_fields(o, region_names, N_REGION, f, &present, "region: not a map", NULL);
    if (why) return why;
    if (present != (1u << N_REGION) - 1) return "region: missing field";
    /* Scalars and raw bytes first: region_rule runs before anything is copied. */
    if (!get_raw(f[R_LABEL], MSGPACK_OBJECT_STR, &r->label)) return "region: label not a str";
    if (!get_raw(f[R_RKEY], MSGPACK_OBJECT_BIN, &r->rkey)) return "region: rkey not a bin";
    if (!mpmap_bool(f[R_FW], &r->framework)) return "region: fw not a bool";
    if (!mpmap_u64(f[R_ADDR], &r->addr) || !mpmap_u64(f[R_SIZE], &r->element_size) ||
        !mpmap_u64(f[R_STRIDE], &r->stride) || !mpmap_u64(f[R_COUNT], &r->count))
        return "region: addr, size, stride and count must be unsigned integers";
    if ((why = region_rule(r))) return why;
    r->label = copy(a, (const char *)r->label.data, r->label.len);
    r->rkey = copy(a, (const char *)r->rkey.data, r->rkey.len);
    return NULL;
}

static const char *decode_md(arena *a, const msgpack_object *o, wire_metadata *md)
{
    const msgpack_object *f[N_MD] = {0};
    uint32_t present;
    const char *why = mpmap_fields(o, md_names, N_MD, f, &present, "md: not a map", NULL);
    if (why) return why;
    if (present != (1u << N_MD) - 1) return "md: missing field";
    if (!get_bin(a, f[MD_WORKER], 1, WIRE_MAX_BLOB, &md->worker_addr))
        return "md: worker not a bin of 1..65536 bytes";
    const msgpack_object *rs = f[MD_REGIONS];
    if (rs->type != MSGPACK_OBJECT_ARRAY) return "md: regions not an array";
    if (rs->via.array.size > WIRE_MAX_REGIONS) return "md: too many regions";
    md->n_regions = rs->via.array.size;
    md->regions = take(a, md->n_regions * sizeof *md->regions, _Alignof(wire_region));
    for (uint32_t i = 0; i < md->n_regions; i++) {
        wire_region scratch, *r = md->regions ? &md->regions[i] : &scratch;
        if ((why = decode_region(a, &rs->via.array.ptr[i], r))) return why;
    }
    return NULL;
}

static const char *decode_ref(arena *a, const msgpack_object *o, wire_ref *r)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3)
        return "start_write: ref not a [fw, label, index] array";
    const msgpack_object *e = o->via.array.ptr;
    if (!mpmap_bool(&e[0], &r->framework)) return "start_write: ref fw not a bool";
    if (!get_str(a, &e[1], 0, &r->label)) return "start_write: ref label not UTF-8 of 0..256 bytes";
    if (!mpmap_u64(&e[2], &r->index)) return "start_write: ref index not an unsigned integer";
    return NULL;
}

/* Counts the refs of dst (each key's array checked for 1..WIRE_MAX_REFS). */
static const char *count_refs(const msgpack_object *dst, size_t *total)
{
    *total = 0;
    for (uint32_t i = 0; i < dst->via.array.size; i++) {
        const msgpack_object *d = &dst->via.array.ptr[i];
        if (d->type != MSGPACK_OBJECT_ARRAY) return "start_write: dst entry not an array";
        if (d->via.array.size < 1 || d->via.array.size > WIRE_MAX_REFS)
            return "start_write: refs per key not 1..255";
        *total += d->via.array.size;
    }
    return NULL;
}

static const char *decode_keys(arena *a, const msgpack_object *keys, const msgpack_object *dst,
                               wire_msg *m)
{
    if (keys->type != MSGPACK_OBJECT_ARRAY) return "start_write: keys not an array";
    if (keys->via.array.size == 0) return "start_write: no keys";
    if (keys->via.array.size > WIRE_MAX_KEYS) return "start_write: too many keys";
    if (dst->type != MSGPACK_OBJECT_ARRAY) return "start_write: dst not an array";
    if (dst->via.array.size != keys->via.array.size)
        return "start_write: key count differs from dst count";
    size_t total;
    const char *why = count_refs(dst, &total);
    if (why) return why;
    uint32_t n = m->n_keys = keys->via.array.size;
    m->keys = take(a, n * sizeof *m->keys, _Alignof(wire_bytes));
    m->ref_off = take(a, (n + 1) * sizeof *m->ref_off, _Alignof(uint32_t));
    m->refs = take(a, total * sizeof *m->refs, _Alignof(wire_ref));
    uint32_t r = 0;
    for (uint32_t i = 0; i < n; i++) {
        wire_bytes kscratch, *k = m->keys ? &m->keys[i] : &kscratch;
        if (!get_bin(a, &keys->via.array.ptr[i], 1, WIRE_MAX_KEY, k))
            return "start_write: key not a bin of 1..1024 bytes";
        if (m->ref_off) m->ref_off[i] = r;
        const msgpack_object_array *d = &dst->via.array.ptr[i].via.array;
        for (uint32_t j = 0; j < d->size; j++, r++) {
            wire_ref rscratch;
            if ((why = decode_ref(a, &d->ptr[j], m->refs ? &m->refs[r] : &rscratch))) return why;
        }
    }
    if (m->ref_off) m->ref_off[n] = r;
    return NULL;
}

static const char *decode_completed(arena *a, const msgpack_object *o, wire_msg *m)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) return "write_done: completed not an array";
    if (o->via.array.size > WIRE_MAX_KEYS) return "write_done: too many completed indices";
    m->n_completed = o->via.array.size;
    m->completed = take(a, m->n_completed * sizeof *m->completed, _Alignof(uint32_t));
    uint64_t seen[WIRE_MAX_KEYS / 64] = {0};
    for (uint32_t i = 0; i < m->n_completed; i++) {
        uint64_t idx;
        const char *why;
        if (!mpmap_u64(&o->via.array.ptr[i], &idx))
            return "write_done: completed index not unsigned";
        if ((why = completed_rule(seen, idx))) return why;
        if (m->completed) m->completed[i] = (uint32_t)idx;
    }
    return NULL;
}

/* inline_runs and inline_data, checked against each other: the data is
 * exactly the bytes the runs announce. */
static const char *decode_inline(arena *a, const msgpack_object *runs, const msgpack_object *data,
                                 wire_msg *m)
{
    if (runs->type != MSGPACK_OBJECT_ARRAY) return "write_done: inline_runs not an array";
    if (runs->via.array.size == 0) return "write_done: no inline runs";
    if (runs->via.array.size > WIRE_MAX_INLINE) return "write_done: too many inline runs";
    wire_bytes raw;
    if (!get_raw(data, MSGPACK_OBJECT_BIN, &raw)) return "write_done: inline_data not a bin";
    m->n_runs = runs->via.array.size;
    m->runs = take(a, m->n_runs * sizeof *m->runs, _Alignof(wire_run));
    uint64_t sum = 0;
    for (uint32_t i = 0; i < m->n_runs; i++) {
        const msgpack_object *o = &runs->via.array.ptr[i];
        wire_run run;
        const char *why;
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 ||
            !mpmap_u64(&o->via.array.ptr[0], &run.addr) || !mpmap_u64(&o->via.array.ptr[1], &run.len))
            return "write_done: inline run not an [addr, len] array of unsigned integers";
        if ((why = run_rule(&run, &sum))) return why;
        if (m->runs) m->runs[i] = run;
    }
    if (raw.len != sum) return "write_done: inline_data is not the bytes its runs announce";
    m->inline_data = copy(a, (const char *)raw.data, raw.len);
    m->has_inline = true;
    return NULL;
}

static const char *decode_times(const msgpack_object *o, wire_msg *m)
{
    wire_times *t = &m->times;
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3 ||
        !mpmap_u64(&o->via.array.ptr[0], &t->serve_ns) ||
        !mpmap_u64(&o->via.array.ptr[1], &t->pin_ns) ||
        !mpmap_u64(&o->via.array.ptr[2], &t->data_ns))
        return "write_done: times not a [serve, pin, data] array of unsigned integers";
    m->has_times = true;
    return times_rule(t);
}

static const char *decode_incs(arena *a, const msgpack_object **f, wire_msg *m)
{
    if (!get_bin(a, f[F_INC], WIRE_INCARNATION_LEN, WIRE_INCARNATION_LEN, &m->incarnation))
        return "inc: not a bin of 16 bytes";
    if (m->has_expected_inc && !get_bin(a, f[F_EXPECTED], WIRE_INCARNATION_LEN,
                                        WIRE_INCARNATION_LEN, &m->expected_inc))
        return "expected_inc: not a bin of 16 bytes";
    if (m->has_dead_inc &&
        !get_bin(a, f[F_DEAD], WIRE_INCARNATION_LEN, WIRE_INCARNATION_LEN, &m->dead_inc))
        return "dead_inc: not a bin of 16 bytes";
    return NULL;
}

/* Everything but v and type; present was checked against the type. Runs
 * once to check and size, once to fill (and cannot fail then). */
static const char *decode_body(arena *a, const msgpack_object **f, uint32_t present, wire_msg *m)
{
    const char *why;
    if (!get_str(a, f[F_AGENT], 1, &m->agent)) return "agent: not UTF-8 of 1..256 bytes";
    if (!get_str(a, f[F_FROM], 1, &m->from)) return "from: not UTF-8 of 1..256 bytes";
    if (!get_str(a, f[F_TO], 1, &m->to)) return "to: not UTF-8 of 1..256 bytes";
    if ((why = decode_incs(a, f, m))) return why;
    if (m->has_op && (why = get_op(f[F_OP], &m->op))) return why;
    if (m->has_metadata && (why = decode_md(a, f[F_MD], &m->md))) return why;
    if (present & B(REMAINING) && (why = get_remaining(f[F_REMAINING], &m->remaining_ms)))
        return why;
    if (present & B(KEYS) && (why = decode_keys(a, f[F_KEYS], f[F_DST], m))) return why;
    if (present & B(TERMINAL) && !mpmap_bool(f[F_TERMINAL], &m->terminal))
        return "terminal: not a bool";
    if (present & B(SUCCESS)) {
        if (!mpmap_bool(f[F_SUCCESS], &m->success)) return "write_done: success not a bool";
        if (m->success && !(present & B(COMPLETED)))
            return "write_done: completed required when success";
        if (!m->success && present & B(COMPLETED)) return "write_done: completed only with success";
    }
    if (present & B(COMPLETED) && (why = decode_completed(a, f[F_COMPLETED], m))) return why;
    if (present & B(AM_BYTES)) {
        if (!m->success) return "write_done: am_bytes only with success";
        if (!mpmap_u64(f[F_AM_BYTES], &m->am_bytes)) return "write_done: am_bytes not unsigned";
        m->has_am_bytes = true;
    }
    if ((present & B(RUNS)) != 0 || (present & B(DATA)) != 0) {
        if (!(present & B(RUNS)) || !(present & B(DATA)))
            return "write_done: inline_runs and inline_data go together";
        if (!m->success) return "write_done: inline bytes only with success";
        if (m->has_am_bytes) return "write_done: inline bytes and am_bytes are exclusive";
        if ((why = decode_inline(a, f[F_RUNS], f[F_DATA], m))) return why;
    }
    if (present & B(TIMES) && (why = decode_times(f[F_TIMES], m))) return why;
    if (present & B(INLINE) && !(mpmap_bool(f[F_INLINE], &m->inline_write) && m->inline_write))
        return "start_write: inline must be true when present";
    if (present & B(PUT_MIN)) {
        if (!mpmap_u64(f[F_PUT_MIN], &m->put_min) || m->put_min == 0)
            return "start_write: put_min not an unsigned integer >= 1";
        if (m->inline_write) return "start_write: put_min and inline are exclusive";
        m->has_put_min = true;
    }
    /* Absent means not busy: false is not a second spelling of it. */
    if (present & B(BUSY) && !(mpmap_bool(f[F_BUSY], &m->busy) && m->busy))
        return "write_refused: busy must be true when present";
    return NULL;
}

/* v and type, then the field set against the type's shape. */
static const char *decode_head(const msgpack_object **f, uint32_t present, wire_msg *m)
{
    uint64_t v;
    if (!(present & B(V))) return missing_why[F_V];
    if (!mpmap_u64(f[F_V], &v) || v != WIRE_VERSION) return "unsupported version";
    if (!(present & B(TYPE))) return missing_why[F_TYPE];
    const msgpack_object *t = f[F_TYPE];
    if (t->type != MSGPACK_OBJECT_STR) return "type: not a str";
    for (m->type = 1; m->type < N_TYPES; m->type++)
        if (mpmap_str_is(t, shapes[m->type].name)) break;
    if (m->type == N_TYPES) return wire_unknown_type;
    const struct shape *s = &shapes[m->type];
    uint32_t extra = present & ~(COMMON | s->allow), missing = (COMMON | s->need) & ~present;
    if (extra) return extra_why[__builtin_ctz(extra)];
    if (missing) return missing_why[__builtin_ctz(missing)];
    m->has_metadata = present & B(MD);
    m->has_op = present & B(OP);
    m->has_expected_inc = present & B(EXPECTED);
    m->has_dead_inc = present & B(DEAD);
    return NULL;
}

static const char *decode_tree(const msgpack_object *root, wire_msg *m)
{
    const msgpack_object *f[N_FIELDS] = {0};
    uint32_t present;
    const char *why =
        mpmap_fields(root, field_names, N_FIELDS, f, &present, "message is not a map", NULL);
    if (why || (why = decode_head(f, present, m))) return why;
    arena a = {NULL, 0};
    if ((why = decode_body(&a, f, present, m))) return why;
    size_t size = a.used;
    a = (arena){malloc(size), 0};
    if (a.base == NULL) return "out of memory";
    m->storage = a.base;
    why = decode_body(&a, f, present, m);
    return why ? why : a.used == size ? NULL : "internal error: sizing differs";
}

int wire_decode(const void *buf, size_t len, wire_msg *out, const char **why)
{
    memset(out, 0, sizeof *out);
    const char *w = "message too large";
    if (len <= WIRE_MAX_MESSAGE) {
        msgpack_unpacked up;
        bool nomem;
        w = mpmap_unpack(buf, len, SIZE_MAX, WIRE_MAX_DEPTH, &up, &nomem);
        if (w == NULL) w = decode_tree(&up.data, out);
        msgpack_unpacked_destroy(&up);
    }
    if (w == NULL) return 0;
    wire_msg_free(out);
    *why = w;
    return -1;
}

void wire_msg_free(wire_msg *m)
{
    free(m->storage);
    memset(m, 0, sizeof *m);
}

/* ---- encoding ---------------------------------------------------------------- */

static bool region_ok(const wire_region *r)
{
    return region_rule(r) == NULL;
}

static bool md_ok(const wire_metadata *md)
{
    if (!bin_ok(md->worker_addr, 1, WIRE_MAX_BLOB) || md->n_regions > WIRE_MAX_REGIONS ||
        (md->n_regions > 0 && md->regions == NULL))
        return false;
    for (uint32_t i = 0; i < md->n_regions; i++)
        if (!region_ok(&md->regions[i])) return false;
    return true;
}

static bool keys_ok(const wire_msg *m)
{
    if (m->n_keys < 1 || m->n_keys > WIRE_MAX_KEYS || !m->keys || !m->ref_off || !m->refs ||
        m->ref_off[0] != 0)
        return false;
    for (uint32_t i = 0; i < m->n_keys; i++) {
        uint32_t lo = m->ref_off[i], hi = m->ref_off[i + 1];
        if (!bin_ok(m->keys[i], 1, WIRE_MAX_KEY) || hi <= lo || hi - lo > WIRE_MAX_REFS)
            return false;
        for (uint32_t r = lo; r < hi; r++)
            if (!str_ok(m->refs[r].label, 0)) return false;
    }
    return true;
}

static bool completed_ok(const wire_msg *m)
{
    if (m->n_completed > WIRE_MAX_KEYS || (m->n_completed > 0 && m->completed == NULL))
        return false;
    uint64_t seen[WIRE_MAX_KEYS / 64] = {0};
    for (uint32_t i = 0; i < m->n_completed; i++)
        if (completed_rule(seen, m->completed[i]) != NULL) return false;
    return true;
}

static bool inline_ok(const wire_msg *m)
{
    if (!m->success || m->has_am_bytes || m->n_runs == 0 || m->n_runs > WIRE_MAX_INLINE ||
        m->runs == NULL || !bin_ok(m->inline_data, 1, WIRE_MAX_INLINE))
        return false;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < m->n_runs; i++)
        if (run_rule(&m->runs[i], &sum) != NULL) return false;
    return sum == m->inline_data.len;
}

/* Whether the decoder would accept m's carried fields. */
static bool msg_ok(const wire_msg *m)
{
    if (wire_type_name(m->type) == NULL) return false;
    uint32_t f = carried(m);
    size_t inc = WIRE_INCARNATION_LEN;
    if ((COMMON | shapes[m->type].need) & ~f) return false; /* a required flag is unset */
    if (!str_ok(m->agent, 1) || !str_ok(m->from, 1) || !str_ok(m->to, 1) ||
        !bin_ok(m->incarnation, inc, inc))
        return false;
    if (f & B(EXPECTED) && !bin_ok(m->expected_inc, inc, inc)) return false;
    if (f & B(DEAD) && !bin_ok(m->dead_inc, inc, inc)) return false;
    if (f & B(MD) && !md_ok(&m->md)) return false;
    if (f & B(REMAINING) && remaining_rule(m->remaining_ms) != NULL) return false;
    if (f & B(KEYS) && !keys_ok(m)) return false;
    if (m->type == WIRE_WRITE_DONE && !m->success && m->n_completed > 0) return false;
    if (f & B(COMPLETED) && !completed_ok(m)) return false;
    if (f & B(AM_BYTES) && !m->success) return false;
    if (f & B(PUT_MIN) && (m->put_min == 0 || m->inline_write)) return false;
    if (f & B(RUNS) && !inline_ok(m)) return false;
    if (f & B(TIMES) && times_rule(&m->times) != NULL) return false;
    return true;
}

static int pack_str(msgpack_packer *pk, wire_bytes b)
{
    return msgpack_pack_str(pk, b.len) || msgpack_pack_str_body(pk, b.data, b.len);
}

static int pack_bin(msgpack_packer *pk, wire_bytes b)
{
    return msgpack_pack_bin(pk, b.len) || msgpack_pack_bin_body(pk, b.data, b.len);
}

static int pack_region(msgpack_packer *pk, const wire_region *r)
{
    const char *const *k = region_names;
    return msgpack_pack_map(pk, N_REGION) ||
           mpmap_pack_cstr(pk, k[R_LABEL]) || pack_str(pk, r->label) ||
           mpmap_pack_cstr(pk, k[R_FW]) || mpmap_pack_bool(pk, r->framework) ||
           mpmap_pack_cstr(pk, k[R_ADDR]) || msgpack_pack_uint64(pk, r->addr) ||
           mpmap_pack_cstr(pk, k[R_SIZE]) || msgpack_pack_uint64(pk, r->element_size) ||
           mpmap_pack_cstr(pk, k[R_STRIDE]) || msgpack_pack_uint64(pk, r->stride) ||
           mpmap_pack_cstr(pk, k[R_COUNT]) || msgpack_pack_uint64(pk, r->count) ||
           mpmap_pack_cstr(pk, k[R_RKEY]) || pack_bin(pk, r->rkey);
}

static int pack_md(msgpack_packer *pk, const wire_metadata *md)
{
    if (msgpack_pack_map(pk, N_MD) || mpmap_pack_cstr(pk, md_names[MD_WORKER]) ||
        pack_bin(pk, md->worker_addr) || mpmap_pack_cstr(pk, md_names[MD_REGIONS]) ||
        msgpack_pack_array(pk, md->n_regions))
        return -1;
    for (uint32_t i = 0; i < md->n_regions; i++)
        if (pack_region(pk, &md->regions[i])) return -1;
    return 0;
}

static int pack_keys(msgpack_packer *pk, const wire_msg *m)
{
    if (msgpack_pack_array(pk, m->n_keys)) return -1;
    for (uint32_t i = 0; i < m->n_keys; i++)
        if (pack_bin(pk, m->keys[i])) return -1;
    return 0;
}

static int pack_dst(msgpack_packer *pk, const wire_msg *m)
{
    if (msgpack_pack_array(pk, m->n_keys)) return -1;
    for (uint32_t i = 0; i < m->n_keys; i++) {
        if (msgpack_pack_array(pk, m->ref_off[i + 1] - m->ref_off[i])) return -1;
        for (uint32_t r = m->ref_off[i]; r < m->ref_off[i + 1]; r++) {
            const wire_ref *ref = &m->refs[r];
            if (msgpack_pack_array(pk, 3) || mpmap_pack_bool(pk, ref->framework) ||
                pack_str(pk, ref->label) || msgpack_pack_uint64(pk, ref->index))
                return -1;
        }
    }
    return 0;
}

static int pack_completed(msgpack_packer *pk, const wire_msg *m)
{
    if (msgpack_pack_array(pk, m->n_completed)) return -1;
    for (uint32_t i = 0; i < m->n_completed; i++)
        if (msgpack_pack_uint32(pk, m->completed[i])) return -1;
    return 0;
}

static int pack_runs(msgpack_packer *pk, const wire_msg *m)
{
    if (msgpack_pack_array(pk, m->n_runs)) return -1;
    for (uint32_t i = 0; i < m->n_runs; i++)
        if (msgpack_pack_array(pk, 2) || msgpack_pack_uint64(pk, m->runs[i].addr) ||
            msgpack_pack_uint64(pk, m->runs[i].len))
            return -1;
    return 0;
}

static int pack_times(msgpack_packer *pk, const wire_times *t)
{
    return msgpack_pack_array(pk, 3) || msgpack_pack_uint64(pk, t->serve_ns) ||
           msgpack_pack_uint64(pk, t->pin_ns) || msgpack_pack_uint64(pk, t->data_ns);
}

static int pack_value(msgpack_packer *pk, const void *msg, int f)
{
    const wire_msg *m = msg;
    switch (f) {
    case F_V: return msgpack_pack_uint32(pk, WIRE_VERSION);
    case F_TYPE: return mpmap_pack_cstr(pk, shapes[m->type].name);
    case F_AGENT: return pack_str(pk, m->agent);
    case F_INC: return pack_bin(pk, m->incarnation);
    case F_FROM: return pack_str(pk, m->from);
    case F_TO: return pack_str(pk, m->to);
    case F_MD: return pack_md(pk, &m->md);
    case F_OP: return msgpack_pack_int64(pk, m->op);
    case F_REMAINING: return msgpack_pack_double(pk, m->remaining_ms);
    case F_KEYS: return pack_keys(pk, m);
    case F_DST: return pack_dst(pk, m);
    case F_EXPECTED: return pack_bin(pk, m->expected_inc);
    case F_SUCCESS: return mpmap_pack_bool(pk, m->success);
    case F_TERMINAL: return mpmap_pack_bool(pk, m->terminal);
    case F_COMPLETED: return pack_completed(pk, m);
    case F_DEAD: return pack_bin(pk, m->dead_inc);
    case F_BUSY: return mpmap_pack_bool(pk, m->busy);
    case F_AM_BYTES: return msgpack_pack_uint64(pk, m->am_bytes);
    case F_INLINE: return mpmap_pack_bool(pk, m->inline_write);
    case F_RUNS: return pack_runs(pk, m);
    case F_DATA: return pack_bin(pk, m->inline_data);
    case F_PUT_MIN: return msgpack_pack_uint64(pk, m->put_min);
    case F_TIMES: return pack_times(pk, &m->times);
    }
    return -1;
}

int wire_encode(const wire_msg *m, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    if (!msg_ok(m)) return -1;
    return mpmap_pack(carried(m), field_names, N_FIELDS, pack_value, m, WIRE_MAX_MESSAGE, buf,
                      len);
}

/* ---- equality ---------------------------------------------------------------- */

static bool bytes_eq(wire_bytes a, wire_bytes b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static bool region_eq(const wire_region *a, const wire_region *b)
{
    return bytes_eq(a->label, b->label) && a->framework == b->framework && a->addr == b->addr &&
           a->element_size == b->element_size && a->stride == b->stride && a->count == b->count &&
           bytes_eq(a->rkey, b->rkey);
}

static bool md_eq(const wire_metadata *a, const wire_metadata *b)
{
    if (!bytes_eq(a->worker_addr, b->worker_addr) || a->n_regions != b->n_regions) return false;
    for (uint32_t i = 0; i < a->n_regions; i++)
        if (!region_eq(&a->regions[i], &b->regions[i])) return false;
    return true;
}

static bool keys_eq(const wire_msg *a, const wire_msg *b)
{
    if (a->n_keys != b->n_keys) return false;
    for (uint32_t i = 0; i < a->n_keys; i++)
        if (!bytes_eq(a->keys[i], b->keys[i]) || a->ref_off[i + 1] != b->ref_off[i + 1])
            return false;
    for (uint32_t r = 0; r < a->ref_off[a->n_keys]; r++)
        if (a->refs[r].framework != b->refs[r].framework || a->refs[r].index != b->refs[r].index ||
            !bytes_eq(a->refs[r].label, b->refs[r].label))
            return false;
    return true;
}

static bool completed_eq(const wire_msg *a, const wire_msg *b)
{
    return a->n_completed == b->n_completed &&
           (a->n_completed == 0 ||
            memcmp(a->completed, b->completed, a->n_completed * sizeof *a->completed) == 0);
}

static bool runs_eq(const wire_msg *a, const wire_msg *b)
{
    return a->n_runs == b->n_runs && memcmp(a->runs, b->runs, a->n_runs * sizeof *a->runs) == 0 &&
           bytes_eq(a->inline_data, b->inline_data);
}

bool wire_msg_equal(const wire_msg *a, const wire_msg *b)
{
    if (a->type != b->type || wire_type_name(a->type) == NULL) return false;
    uint32_t f = carried(a);
    if (f != carried(b)) return false;
    if (!bytes_eq(a->agent, b->agent) || !bytes_eq(a->incarnation, b->incarnation) ||
        !bytes_eq(a->from, b->from) || !bytes_eq(a->to, b->to))
        return false;
    return (!(f & B(MD)) || md_eq(&a->md, &b->md)) && (!(f & B(OP)) || a->op == b->op) &&
           (!(f & B(REMAINING)) || a->remaining_ms == b->remaining_ms) &&
           (!(f & B(KEYS)) || keys_eq(a, b)) &&
           (!(f & B(EXPECTED)) || bytes_eq(a->expected_inc, b->expected_inc)) &&
           (!(f & B(SUCCESS)) || a->success == b->success) &&
           (!(f & B(TERMINAL)) || a->terminal == b->terminal) &&
           (!(f & B(COMPLETED)) || completed_eq(a, b)) &&
           (!(f & B(DEAD)) || bytes_eq(a->dead_inc, b->dead_inc)) &&
           (!(f & B(AM_BYTES)) || a->am_bytes == b->am_bytes) &&
           (!(f & B(PUT_MIN)) || a->put_min == b->put_min) &&
           (!(f & B(RUNS)) || runs_eq(a, b)) &&
           (!(f & B(TIMES)) || memcmp(&a->times, &b->times, sizeof a->times) == 0);
}
