/* The claim socket's protocol (client/frame.h): the msgpack messages and
 * the length-prefixed frames that carry them and their descriptors.
 *
 * Decoding follows net/wire.c, through net/mpmap.h. A pre-scan walks the
 * encoding without building anything and refuses a container header that
 * promises more elements than bytes remain, nesting deeper than a granted's
 * pools, or more objects in all than the largest valid message has (a
 * granted with KVCR_MAX_POOLS pools): msgpack-c allocates an object array as
 * soon as it reads an array header, so this bounds its memory by a few KiB
 * whatever the peer sends. msgpack-c then builds the object tree, which is
 * checked field by field into the fixed-size svc_msg;
 * the only allocation the message owns is its text, no longer than the
 * frame. One set of rules (check_msg) serves the decoder, which calls it on
 * what it decoded, and the encoder, which calls it before packing: what one
 * side sends, the other accepts. */
#include "client/frame.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "net/mpmap.h"
#include "util/bytes.h"
#include "util/log.h"

/* ---- field tables -------------------------------------------------------- */

#define FIELDS(X)                                                                          \
    X(V, "v") X(TYPE, "type") X(GUARD, "guard_index") X(DIGEST, "digest")                  \
    X(AGENT, "agent") X(POOLS, "pools") X(HOST, "control_host") X(PORT, "control_port")    \
    X(GEN, "generation") X(MAPPING, "mapping_bytes") X(JOURNAL, "journal_bytes")           \
    X(RECOVERED, "recovered") X(ACTIVATED, "activated") X(MESSAGE, "message") X(TEXT, "text") \
    X(KV_EP, "kv_endpoint") X(KV_REPLAY, "kv_replay") X(KV_TOPIC, "kv_topic")              \
    X(KV_RANK, "kv_dp_rank") X(KV_DRAM, "kv_medium_dram") X(KV_G3, "kv_medium_g3")          \
    X(KV_POSITIONAL, "kv_positional")
MPMAP_FIELD_TABLE(FIELDS);

#define B(f) (1u << F_##f)
#define COMMON (B(V) | B(TYPE))

/* Every field of a type is required: a message carries exactly its type's
 * fields (and v and type), nothing optional. */
static const struct shape {
    const char *name;
    uint32_t fields;
} shapes[] = {
    [SVC_CLAIM] = {"claim", B(GUARD) | B(DIGEST) | B(AGENT) | B(POOLS) | B(HOST) | B(PORT) |
                                B(KV_EP) | B(KV_REPLAY) | B(KV_TOPIC) | B(KV_RANK) |
                                B(KV_DRAM) | B(KV_G3) | B(KV_POSITIONAL)},
    [SVC_GRANTED] = {"granted", B(GUARD) | B(GEN) | B(MAPPING) | B(JOURNAL) | B(POOLS) |
                                    B(PORT) | B(RECOVERED)},
    [SVC_RELEASE] = {"release", B(ACTIVATED)},
    [SVC_RELEASED] = {"released", 0},
    [SVC_ERROR] = {"error", B(MESSAGE)},
    [SVC_STATS] = {"stats", 0},
    [SVC_METRICS] = {"metrics", B(TEXT)},
};
#define N_TYPES (sizeof shapes / sizeof shapes[0])

static const char *type_name(svc_type t)
{
    return t >= SVC_CLAIM && (size_t)t < N_TYPES ? shapes[t].name : NULL;
}

/* A claim's pool is [name, block_size]; a granted one's adds offset, size. */
static uint32_t pool_width(svc_type t)
{
    return t == SVC_CLAIM ? 2 : 4;
}

/* The most msgpack objects a valid message has: the root, a key and a value
 * per field, and each pool's array and elements. The pre-scan refuses more. */
#define MAX_OBJECTS (1 + 2 * N_FIELDS + KVCR_MAX_POOLS * 5)
/* And the deepest: the root map holds pools, an array of pool arrays. */
#define MAX_DEPTH 3

/* ---- rules shared by the decoder and the encoder --------------------------- */

static int check_str(int err, const char *what, const char *s, size_t min, size_t max)
{
    size_t n = strlen(s);
    if (n < min || n > max)
        return kvcr_fail(err, "%s: %zu bytes, must be %zu..%zu", what, n, min, max);
    return 0;
}

/* The pools of a granted tile [journal_bytes, mapping_bytes) in order,
 * each a whole number of its blocks. */
static int check_layout(int err, const svc_msg *m)
{
    if (m->journal_bytes >= m->mapping_bytes)
        return kvcr_fail(err, "granted: journal_bytes %llu not below mapping_bytes %llu",
                         (unsigned long long)m->journal_bytes,
                         (unsigned long long)m->mapping_bytes);
    uint64_t end = m->journal_bytes;
    for (uint32_t i = 0; i < m->n_pools; i++) {
        const svc_pool *p = &m->pools[i];
        if (p->offset != end)
            return kvcr_fail(err, "granted: pools[%u] offset %llu, expected %llu (pools follow "
                             "the journal back to back)", i, (unsigned long long)p->offset,
                             (unsigned long long)end);
        if (p->size < p->block_size) /* the tail past the last whole block is unused */
            return kvcr_fail(err, "granted: pools[%u] size %llu holds no block of %llu bytes", i,
                             (unsigned long long)p->size, (unsigned long long)p->block_size);
        if (__builtin_add_overflow(end, p->size, &end) || end > m->mapping_bytes)
            return kvcr_fail(err, "granted: pools[%u] ends beyond mapping_bytes %llu", i,
                             (unsigned long long)m->mapping_bytes);
    }
    if (end != m->mapping_bytes)
        return kvcr_fail(err, "granted: pools end at %llu, not at mapping_bytes %llu",
                         (unsigned long long)end, (unsigned long long)m->mapping_bytes);
    return 0;
}

static int check_pools(int err, const svc_msg *m)
{
    if (m->n_pools < 1 || m->n_pools > KVCR_MAX_POOLS)
        return kvcr_fail(err, "%s: %u pools, must be 1..%d", type_name(m->type), m->n_pools,
                         KVCR_MAX_POOLS);
    for (uint32_t i = 0; i < m->n_pools; i++) {
        const svc_pool *p = &m->pools[i];
        if (p->block_size == 0) return kvcr_fail(err, "pools[%u]: block_size is 0", i);
        if (m->type == SVC_CLAIM && (p->offset != 0 || p->size != 0))
            return kvcr_fail(err, "claim: pools[%u] has an offset or size", i);
    }
    return m->type == SVC_GRANTED ? check_layout(err, m) : 0;
}

/* Everything frame.h says about the values of the fields m's type carries,
 * on a message whose strings are known to be NUL-terminated within their
 * arrays (so pool names, 0 .. KVCR_NAME_MAX-1 bytes, need no check). err
 * is KVCR_EPROTO for the decoder, KVCR_EINVAL for the encoder. */
static int check_msg(int err, const svc_msg *m)
{
    int rc;
    switch (m->type) {
    case SVC_CLAIM:
        if ((rc = check_str(err, "claim: digest", m->digest, 1, SVC_DIGEST_MAX)) ||
            (rc = check_str(err, "claim: agent", m->agent, 1, KVCR_NAME_MAX - 1)) ||
            (rc = check_str(err, "claim: control_host", m->control_host, 0, SVC_HOST_MAX)))
            return rc;
        if (m->control_port > 65535 || (m->control_host[0] == '\0' && m->control_port != 0))
            return kvcr_fail(err, "claim: control_port %u not 0..65535 (0 without a host)",
                             m->control_port);
        if (m->kv_endpoint[0] == '\0' && (m->kv_replay[0] || m->kv_topic[0] || m->kv_dp_rank ||
                                          m->kv_medium_dram[0] || m->kv_medium_g3[0] ||
                                          m->kv_positional))
            return kvcr_fail(err, "claim: KV-event replay, topic, rank, media or form without "
                             "an endpoint");
        if (m->kv_endpoint[0] != '\0' && (m->kv_medium_dram[0] == '\0' || m->kv_medium_g3[0] == '\0'))
            return kvcr_fail(err, "claim: a KV-event endpoint needs both medium names");
        return check_pools(err, m);
    case SVC_GRANTED:
        if (m->control_port > 65535)
            return kvcr_fail(err, "granted: control_port %u not 0..65535", m->control_port);
        return check_pools(err, m);
    case SVC_ERROR:
        /* An empty reason would reach the claimant's kvcr_last_error() as "". */
        if (m->text == NULL) return kvcr_fail(err, "error: no message");
        return check_str(err, "error: message", m->text, 1, SVC_TEXT_MAX);
    case SVC_METRICS:
        if (m->text == NULL) return kvcr_fail(err, "metrics: no text");
        return check_str(err, "metrics: text", m->text, 0, SVC_TEXT_MAX);
    case SVC_RELEASE:
    case SVC_RELEASED:
    case SVC_STATS: return 0;
    }
    return kvcr_fail(err, "unknown message type %d", (int)m->type);
}

/* ---- decoding ---------------------------------------------------------------- */

static bool get_u32(const msgpack_object *o, uint32_t *v)
{
    uint64_t u;
    if (!mpmap_u64(o, &u) || u > UINT32_MAX) return false;
    *v = (uint32_t)u;
    return true;
}

/* A str of at most max bytes without NUL, copied NUL-terminated into dst
 * (max + 1 bytes). Minimum lengths are check_msg's business. */
static bool get_str(const msgpack_object *o, char *dst, size_t max)
{
    if (o->type != MSGPACK_OBJECT_STR) return false;
    size_t n = o->via.str.size;
    if (n > max || (n > 0 && memchr(o->via.str.ptr, 0, n) != NULL)) return false;
    if (n > 0) memcpy(dst, o->via.str.ptr, n);
    dst[n] = 0;
    return true;
}

/* Collects the root map's values by field (mpmap_fields); a duplicate key
 * is named. */
static int fields_of(const msgpack_object *o, const msgpack_object **vals, uint32_t *present)
{
    int dup = -1;
    const char *why =
        mpmap_fields(o, field_names, N_FIELDS, vals, present, "message is not a map", &dup);
    if (why == NULL) return 0;
    if (dup >= 0) return kvcr_fail(KVCR_EPROTO, "%s: %s", why, field_names[dup]);
    return kvcr_fail(KVCR_EPROTO, "%s", why);
}

/* v, type, and the key set against the type's fields. */
static int decode_head(const msgpack_object **f, uint32_t present, svc_msg *m)
{
    uint64_t v;
    if (!(present & B(V))) return kvcr_fail(KVCR_EPROTO, "missing field: v");
    if (!mpmap_u64(f[F_V], &v))
        return kvcr_fail(KVCR_EPROTO, "unsupported protocol version (v must be %u)",
                         SVC_PROTOCOL_VERSION);
    if (v != SVC_PROTOCOL_VERSION) /* the engine's and the service's libkvcr differ */
        return kvcr_fail(KVCR_EPROTO, "unsupported protocol version %llu (v must be %u: the "
                         "engine and the KVCR service must run the same KVCR release)",
                         (unsigned long long)v, SVC_PROTOCOL_VERSION);
    if (!(present & B(TYPE))) return kvcr_fail(KVCR_EPROTO, "missing field: type");
    const msgpack_object *t = f[F_TYPE];
    if (t->type != MSGPACK_OBJECT_STR) return kvcr_fail(KVCR_EPROTO, "type: not a str");
    size_t i = SVC_CLAIM;
    while (i < N_TYPES && !mpmap_str_is(t, shapes[i].name)) i++;
    if (i == N_TYPES) return kvcr_fail(KVCR_EPROTO, "unknown message type");
    m->type = (svc_type)i;
    uint32_t want = COMMON | shapes[i].fields;
    uint32_t extra = present & ~want, missing = want & ~present;
    if (extra)
        return kvcr_fail(KVCR_EPROTO, "%s: field not allowed: %s", shapes[i].name,
                         field_names[__builtin_ctz(extra)]);
    if (missing)
        return kvcr_fail(KVCR_EPROTO, "%s: missing field: %s", shapes[i].name,
                         field_names[__builtin_ctz(missing)]);
    return 0;
}

static int decode_pool(const msgpack_object *o, svc_type t, uint32_t i, svc_pool *p)
{
    uint32_t w = pool_width(t);
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != w)
        return kvcr_fail(KVCR_EPROTO, "pools[%u]: not an array of %u (%s)", i, w,
                         t == SVC_CLAIM ? "name, block_size" : "name, block_size, offset, size");
    const msgpack_object *e = o->via.array.ptr;
    if (!get_str(&e[0], p->name, KVCR_NAME_MAX - 1))
        return kvcr_fail(KVCR_EPROTO, "pools[%u]: name not a str of 0..%d bytes without NUL", i,
                         KVCR_NAME_MAX - 1);
    if (!mpmap_u64(&e[1], &p->block_size) ||
        (w == 4 && (!mpmap_u64(&e[2], &p->offset) || !mpmap_u64(&e[3], &p->size))))
        return kvcr_fail(KVCR_EPROTO, "pools[%u]: block_size, offset and size must be unsigned "
                         "integers", i);
    return 0;
}

static int decode_pools(const msgpack_object *o, svc_msg *m)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) return kvcr_fail(KVCR_EPROTO, "pools: not an array");
    if (o->via.array.size < 1 || o->via.array.size > KVCR_MAX_POOLS)
        return kvcr_fail(KVCR_EPROTO, "pools: %u pools, must be 1..%d", o->via.array.size,
                         KVCR_MAX_POOLS);
    m->n_pools = o->via.array.size;
    for (uint32_t i = 0; i < m->n_pools; i++) {
        int rc = decode_pool(&o->via.array.ptr[i], m->type, i, &m->pools[i]);
        if (rc) return rc;
    }
    return 0;
}

/* The text of an error or a metrics message, in its own allocation. */
static int decode_text(const msgpack_object *o, const char *what, svc_msg *m)
{
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > SVC_TEXT_MAX)
        return kvcr_fail(KVCR_EPROTO, "%s: not a str of at most %u bytes", what, SVC_TEXT_MAX);
    m->text = malloc(o->via.str.size + 1);
    if (m->text == NULL) return kvcr_fail(KVCR_ENOMEM, "%s: out of memory", what);
    if (!get_str(o, m->text, SVC_TEXT_MAX))
        return kvcr_fail(KVCR_EPROTO, "%s: contains a NUL byte", what);
    return 0;
}

/* Each field's type and width; the rules on values are check_msg's. */
static int decode_body(const msgpack_object **f, uint32_t present, svc_msg *m)
{
    int rc;
    if (present & B(GUARD) && !get_u32(f[F_GUARD], &m->guard_index))
        return kvcr_fail(KVCR_EPROTO, "guard_index: not an unsigned 32-bit integer");
    if (present & B(DIGEST) && !get_str(f[F_DIGEST], m->digest, SVC_DIGEST_MAX))
        return kvcr_fail(KVCR_EPROTO, "digest: not a str of 1..%d bytes without NUL",
                         SVC_DIGEST_MAX);
    if (present & B(AGENT) && !get_str(f[F_AGENT], m->agent, KVCR_NAME_MAX - 1))
        return kvcr_fail(KVCR_EPROTO, "agent: not a str of 1..%d bytes without NUL",
                         KVCR_NAME_MAX - 1);
    if (present & B(HOST) && !get_str(f[F_HOST], m->control_host, SVC_HOST_MAX))
        return kvcr_fail(KVCR_EPROTO, "control_host: not a str of 1..%d bytes without NUL",
                         SVC_HOST_MAX);
    if (present & B(PORT) && !get_u32(f[F_PORT], &m->control_port))
        return kvcr_fail(KVCR_EPROTO, "control_port: not an unsigned integer");
    if ((present & B(KV_EP) && !get_str(f[F_KV_EP], m->kv_endpoint, SVC_KV_MAX)) ||
        (present & B(KV_REPLAY) && !get_str(f[F_KV_REPLAY], m->kv_replay, SVC_KV_MAX)) ||
        (present & B(KV_TOPIC) && !get_str(f[F_KV_TOPIC], m->kv_topic, SVC_KV_MAX)))
        return kvcr_fail(KVCR_EPROTO, "kv_endpoint, kv_replay, kv_topic: not a str of 0..%d "
                         "bytes without NUL", SVC_KV_MAX);
    if (present & B(KV_RANK) && !get_u32(f[F_KV_RANK], &m->kv_dp_rank))
        return kvcr_fail(KVCR_EPROTO, "kv_dp_rank: not an unsigned 32-bit integer");
    if ((present & B(KV_DRAM) && !get_str(f[F_KV_DRAM], m->kv_medium_dram, SVC_KV_MAX)) ||
        (present & B(KV_G3) && !get_str(f[F_KV_G3], m->kv_medium_g3, SVC_KV_MAX)))
        return kvcr_fail(KVCR_EPROTO, "kv_medium_dram, kv_medium_g3: not a str of 0..%d bytes "
                         "without NUL", SVC_KV_MAX);
    if (present & B(KV_POSITIONAL) && !mpmap_bool(f[F_KV_POSITIONAL], &m->kv_positional))
        return kvcr_fail(KVCR_EPROTO, "kv_positional: not a bool");
    if (present & B(GEN) && !mpmap_u64(f[F_GEN], &m->generation))
        return kvcr_fail(KVCR_EPROTO, "generation: not an unsigned integer");
    if (present & B(MAPPING) && !mpmap_u64(f[F_MAPPING], &m->mapping_bytes))
        return kvcr_fail(KVCR_EPROTO, "mapping_bytes: not an unsigned integer");
    if (present & B(JOURNAL) && !mpmap_u64(f[F_JOURNAL], &m->journal_bytes))
        return kvcr_fail(KVCR_EPROTO, "journal_bytes: not an unsigned integer");
    if (present & B(RECOVERED) && !mpmap_u64(f[F_RECOVERED], &m->recovered))
        return kvcr_fail(KVCR_EPROTO, "recovered: not an unsigned integer");
    if (present & B(ACTIVATED) && !mpmap_bool(f[F_ACTIVATED], &m->activated))
        return kvcr_fail(KVCR_EPROTO, "activated: not a bool");
    if (present & B(POOLS) && (rc = decode_pools(f[F_POOLS], m))) return rc;
    if (present & B(MESSAGE) && (rc = decode_text(f[F_MESSAGE], "error: message", m))) return rc;
    if (present & B(TEXT) && (rc = decode_text(f[F_TEXT], "metrics: text", m))) return rc;
    return check_msg(KVCR_EPROTO, m);
}

static int decode_tree(const msgpack_object *root, svc_msg *m)
{
    const msgpack_object *f[N_FIELDS] = {0};
    uint32_t present = 0;
    int rc = fields_of(root, f, &present);
    if (rc == 0) rc = decode_head(f, present, m);
    if (rc == 0) rc = decode_body(f, present, m);
    return rc;
}

int svc_decode(const uint8_t *buf, size_t len, svc_msg *m)
{
    memset(m, 0, sizeof *m);
    int rc = 0;
    const char *why;
    if (len == 0)
        rc = kvcr_fail(KVCR_EPROTO, "empty message");
    else if (len > SVC_FRAME_MAX)
        rc = kvcr_fail(KVCR_EPROTO, "message of %zu bytes is over %u", len, SVC_FRAME_MAX);
    if (rc == 0) {
        msgpack_unpacked up;
        bool nomem;
        if ((why = mpmap_unpack(buf, len, MAX_OBJECTS, MAX_DEPTH, &up, &nomem)) == NULL)
            rc = decode_tree(&up.data, m);
        else if (nomem)
            rc = kvcr_fail(KVCR_ENOMEM, "msgpack: out of memory");
        else
            rc = kvcr_fail(KVCR_EPROTO, "%s", why);
        msgpack_unpacked_destroy(&up);
    }
    if (rc != 0) {
        svc_msg_clear(m);
        memset(m, 0, sizeof *m);
    }
    return rc;
}

void svc_msg_clear(svc_msg *m)
{
    free(m->text);
    m->text = NULL;
}

/* ---- encoding ---------------------------------------------------------------- */

/* Whether a caller's string ends within its array (check_msg needs that). */
static bool terminated(const char *s, size_t size)
{
    return memchr(s, 0, size) != NULL;
}

static int check_encodable(const svc_msg *m)
{
    if (type_name(m->type) == NULL)
        return kvcr_fail(KVCR_EINVAL, "unknown message type %d", (int)m->type);
    uint32_t fields = shapes[m->type].fields;
    if (fields & B(POOLS)) {
        if (m->n_pools > KVCR_MAX_POOLS)
            return kvcr_fail(KVCR_EINVAL, "%u pools, must be 1..%d", m->n_pools, KVCR_MAX_POOLS);
        for (uint32_t i = 0; i < m->n_pools; i++)
            if (!terminated(m->pools[i].name, sizeof m->pools[i].name))
                return kvcr_fail(KVCR_EINVAL, "pools[%u]: name not NUL-terminated", i);
    }
    if (fields & B(DIGEST) && (!terminated(m->digest, sizeof m->digest) ||
                               !terminated(m->agent, sizeof m->agent) ||
                               !terminated(m->control_host, sizeof m->control_host) ||
                               !terminated(m->kv_endpoint, sizeof m->kv_endpoint) ||
                               !terminated(m->kv_replay, sizeof m->kv_replay) ||
                               !terminated(m->kv_topic, sizeof m->kv_topic) ||
                               !terminated(m->kv_medium_dram, sizeof m->kv_medium_dram) ||
                               !terminated(m->kv_medium_g3, sizeof m->kv_medium_g3)))
        return kvcr_fail(KVCR_EINVAL, "claim: digest, agent, control_host or a KV-event string "
                         "not NUL-terminated");
    return check_msg(KVCR_EINVAL, m);
}

static int pack_pools(msgpack_packer *pk, const svc_msg *m)
{
    uint32_t w = pool_width(m->type);
    if (msgpack_pack_array(pk, m->n_pools)) return -1;
    for (uint32_t i = 0; i < m->n_pools; i++) {
        const svc_pool *p = &m->pools[i];
        if (msgpack_pack_array(pk, w) || mpmap_pack_cstr(pk, p->name) ||
            msgpack_pack_uint64(pk, p->block_size) ||
            (w == 4 && (msgpack_pack_uint64(pk, p->offset) || msgpack_pack_uint64(pk, p->size))))
            return -1;
    }
    return 0;
}

static int pack_value(msgpack_packer *pk, const void *msg, int f)
{
    const svc_msg *m = msg;
    switch (f) {
    case F_V: return msgpack_pack_uint32(pk, SVC_PROTOCOL_VERSION);
    case F_TYPE: return mpmap_pack_cstr(pk, shapes[m->type].name);
    case F_GUARD: return msgpack_pack_uint32(pk, m->guard_index);
    case F_DIGEST: return mpmap_pack_cstr(pk, m->digest);
    case F_AGENT: return mpmap_pack_cstr(pk, m->agent);
    case F_POOLS: return pack_pools(pk, m);
    case F_HOST: return mpmap_pack_cstr(pk, m->control_host);
    case F_PORT: return msgpack_pack_uint32(pk, m->control_port);
    case F_KV_EP: return mpmap_pack_cstr(pk, m->kv_endpoint);
    case F_KV_REPLAY: return mpmap_pack_cstr(pk, m->kv_replay);
    case F_KV_TOPIC: return mpmap_pack_cstr(pk, m->kv_topic);
    case F_KV_RANK: return msgpack_pack_uint32(pk, m->kv_dp_rank);
    case F_KV_DRAM: return mpmap_pack_cstr(pk, m->kv_medium_dram);
    case F_KV_G3: return mpmap_pack_cstr(pk, m->kv_medium_g3);
    case F_KV_POSITIONAL: return mpmap_pack_bool(pk, m->kv_positional);
    case F_GEN: return msgpack_pack_uint64(pk, m->generation);
    case F_MAPPING: return msgpack_pack_uint64(pk, m->mapping_bytes);
    case F_JOURNAL: return msgpack_pack_uint64(pk, m->journal_bytes);
    case F_RECOVERED: return msgpack_pack_uint64(pk, m->recovered);
    case F_ACTIVATED: return mpmap_pack_bool(pk, m->activated);
    case F_MESSAGE:
    case F_TEXT: return mpmap_pack_cstr(pk, m->text);
    }
    return -1;
}

int svc_encode(const svc_msg *m, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int rc = check_encodable(m);
    if (rc) return rc;
    uint32_t f = COMMON | shapes[m->type].fields;
    void *buf;
    /* Every field is bounded, so only the buffer can fail here. */
    if (mpmap_pack(f, field_names, N_FIELDS, pack_value, m, SVC_FRAME_MAX, &buf, len) != 0)
        return kvcr_fail(KVCR_ENOMEM, "encoding a %s: out of memory", shapes[m->type].name);
    *out = buf;
    return 0;
}

/* ---- frames ------------------------------------------------------------------ */

/* Room for one descriptor more than a frame may carry, so that a peer
 * sending too many is seen (and its descriptors closed) rather than
 * truncated; anything beyond that is MSG_CTRUNC, closed by the kernel. */
#define CTRL_FDS (SVC_MAX_FDS + 1)
#define CTRL_SPACE CMSG_SPACE(sizeof(int) * CTRL_FDS)

typedef union ctrl_buf {
    struct cmsghdr align;
    char buf[CTRL_SPACE];
} ctrl_buf;

int svc_send_frame(int sock, const uint8_t *payload, size_t len, const int *fds, size_t n_fds)
{
    if (len < 1 || len > SVC_FRAME_MAX || payload == NULL)
        return kvcr_fail(KVCR_EINVAL, "frame payload of %zu bytes, must be 1..%u", len,
                         SVC_FRAME_MAX);
    if (n_fds > SVC_MAX_FDS || (n_fds > 0 && fds == NULL))
        return kvcr_fail(KVCR_EINVAL, "%zu descriptors, a frame carries at most %d", n_fds,
                         SVC_MAX_FDS);
    uint8_t head[4];
    put32be(head, (uint32_t)len);
    ctrl_buf ctrl;
    memset(&ctrl, 0, sizeof ctrl);
    size_t total = sizeof head + len, sent = 0;
    while (sent < total) {
        /* Whatever of the head and the payload is left. */
        struct iovec iov[2];
        int n_iov = 0;
        if (sent < sizeof head)
            iov[n_iov++] = (struct iovec){head + sent, sizeof head - sent};
        size_t in_payload = sent < sizeof head ? 0 : sent - sizeof head;
        iov[n_iov++] = (struct iovec){(void *)(payload + in_payload), len - in_payload};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        /* The descriptors ride with the first byte: only until a send
         * succeeds (one that fails with EINTR sent nothing, fds included). */
        if (sent == 0 && n_fds > 0) {
            mh.msg_control = ctrl.buf;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        /* EAGAIN means a non-blocking socket or SO_SNDTIMEO ran out: the
         * caller asked not to wait, so the frame (maybe half sent) fails. */
        if (n < 0)
            return kvcr_fail(KVCR_ESYS, "claim socket: send: %s", strerror(errno));
        sent += (size_t)n;
    }
    return 0;
}

/* One frame being received: the descriptors taken so far and where. */
typedef struct rx {
    int sock, timeout_ms;
    size_t room;          /* descriptors the caller accepts */
    int fds[CTRL_FDS];
    size_t n_fds;
    bool started;         /* a byte of the frame was read */
} rx;

static void rx_close_fds(rx *r)
{
    for (size_t i = 0; i < r->n_fds; i++) close(r->fds[i]);
    r->n_fds = 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until the socket is readable (or hung up), at most timeout_ms. */
static int rx_wait(const rx *r)
{
    int64_t deadline = r->timeout_ms < 0 ? -1 : now_ms() + r->timeout_ms;
    for (;;) {
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            wait = left > 0 ? (int)left : 0;
        }
        struct pollfd p = {.fd = r->sock, .events = POLLIN};
        int n = poll(&p, 1, wait);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return kvcr_fail(KVCR_ESYS, "claim socket: poll: %s", strerror(errno));
        if (n == 0) {
            errno = ETIMEDOUT;
            return kvcr_fail(KVCR_ESYS, "claim socket: nothing received for %d ms",
                             r->timeout_ms);
        }
        if (p.revents & POLLNVAL) return kvcr_fail(KVCR_ESYS, "claim socket: not open");
        return 0; /* POLLIN, POLLHUP or POLLERR: recvmsg tells which */
    }
}

/* Takes the descriptors one recvmsg brought, whatever else is wrong (so
 * that all of them get closed), then judges the control data. first: this
 * recvmsg read the frame's first byte, the only one descriptors may ride. */
static int rx_control(rx *r, struct msghdr *mh, bool first)
{
    bool other = false, late = false, too_many = false;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            other = true;
            continue;
        }
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (r->n_fds < CTRL_FDS) {
                r->fds[r->n_fds++] = fd;
            } else {
                close(fd);
                too_many = true;
            }
            if (!first) late = true;
        }
    }
    /* Other data first: credentials (SO_PASSCRED) also truncate the
     * control data when descriptors come along, and are the better clue. */
    if (other) return kvcr_fail(KVCR_EPROTO, "claim socket: unexpected ancillary data");
    if (mh->msg_flags & MSG_CTRUNC)
        return kvcr_fail(KVCR_EPROTO, "claim socket: control data truncated "
                         "(too many descriptors)");
    if (late)
        return kvcr_fail(KVCR_EPROTO, "claim socket: descriptors not on a frame's first byte");
    if (too_many || r->n_fds > r->room)
        return kvcr_fail(KVCR_EPROTO, "claim socket: more than %zu descriptors with a frame",
                         r->room);
    return 0;
}

/* Reads exactly n bytes of the frame. 1 on EOF before the frame's first
 * byte; EOF later is a truncated frame. */
static int rx_read(rx *r, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        int rc = rx_wait(r);
        if (rc) return rc;
        ctrl_buf ctrl;
        struct iovec iov = {buf + got, n - got};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
                            .msg_controllen = sizeof ctrl.buf};
        /* MSG_DONTWAIT: poll said readable, but another reader may have
         * been first; then EAGAIN sends us back to poll. */
        ssize_t k = recvmsg(r->sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) return kvcr_fail(KVCR_ESYS, "claim socket: recvmsg: %s", strerror(errno));
        if ((rc = rx_control(r, &mh, !r->started && k > 0))) return rc;
        if (k == 0) {
            if (!r->started) return 1;
            return kvcr_fail(KVCR_EPROTO, "claim socket: connection closed mid-frame");
        }
        r->started = true;
        got += (size_t)k;
    }
    return 0;
}

int svc_recv_frame(int sock, uint8_t **payload, size_t *len, int *fds, size_t max_fds,
                   size_t *n_fds, int timeout_ms)
{
    *payload = NULL;
    *len = 0;
    *n_fds = 0;
    if (max_fds > 0 && fds == NULL) return kvcr_fail(KVCR_EINVAL, "max_fds > 0 but no fds array");
    rx r = {.sock = sock, .timeout_ms = timeout_ms,
            .room = max_fds < SVC_MAX_FDS ? max_fds : SVC_MAX_FDS};
    uint8_t head[4], *buf = NULL;
    uint32_t n = 0;
    int rc = rx_read(&r, head, sizeof head);
    if (rc == 0) {
        n = get32be(head);
        if (n < 1 || n > SVC_FRAME_MAX)
            rc = kvcr_fail(KVCR_EPROTO, "claim socket: frame length %u not 1..%u", n,
                           SVC_FRAME_MAX);
        else if ((buf = malloc(n)) == NULL)
            rc = kvcr_fail(KVCR_ENOMEM, "claim socket: no memory for a %u-byte frame", n);
        else rc = rx_read(&r, buf, n);
    }
    if (rc != 0) {
        /* The caller gets nothing of a failed frame, descriptors included. */
        free(buf);
        rx_close_fds(&r);
        return rc;
    }
    if (r.n_fds > 0) memcpy(fds, r.fds, r.n_fds * sizeof(int));
    *n_fds = r.n_fds;
    *payload = buf;
    *len = n;
    return 0;
}

int svc_send(int sock, const svc_msg *m, const int *fds, size_t n_fds)
{
    uint8_t *buf;
    size_t len;
    int rc = svc_encode(m, &buf, &len);
    if (rc) return rc;
    rc = svc_send_frame(sock, buf, len, fds, n_fds);
    free(buf);
    return rc;
}

int svc_recv(int sock, svc_msg *m, int *fds, size_t max_fds, size_t *n_fds, int timeout_ms)
{
    uint8_t *buf;
    size_t len;
    memset(m, 0, sizeof *m);
    int rc = svc_recv_frame(sock, &buf, &len, fds, max_fds, n_fds, timeout_ms);
    if (rc) return rc;
    rc = svc_decode(buf, len, m);
    free(buf);
    if (rc) {
        /* A message that does not decode owns no descriptors either. */
        for (size_t i = 0; i < *n_fds; i++) close(fds[i]);
        *n_fds = 0;
    }
    return rc;
}

int svc_connect(const char *path, int *fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof sa.sun_path)
        return kvcr_fail(KVCR_EINVAL, "socket path must be 1..%zu bytes", sizeof sa.sun_path - 1);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return kvcr_fail(KVCR_ESYS, "socket: %s", strerror(errno));
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int err = errno;
        close(s);
        return kvcr_fail(KVCR_ESYS, "the KVCR service at %s is not reachable: %s", path,
                         strerror(err));
    }
    *fd = s;
    return 0;
}
