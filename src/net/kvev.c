/* KV events in msgpack: the encoder the publisher uses and the strict
 * decoder the tests and the fuzzer use (net/kvev.h). Both read one field
 * table per event type, so the order written is the order checked. */
#include "net/kvev.h"

#include <stdlib.h>
#include <string.h>

#include "net/mpmap.h"

/* ---- the field tables ----------------------------------------------------- */

enum kind { K_HASHES, K_PARENT, K_TOKENS, K_UINT, K_NIL_INT, K_STR_NIL, K_EXTRA, K_STR,
            K_INT_NIL };

enum field_id { F_HASHES, F_PARENT, F_TOKENS, F_BLOCK_SIZE, F_LORA_ID, F_MEDIUM, F_LORA_NAME,
                F_EXTRA, F_GROUP, F_SPEC_KIND, F_SPEC_WINDOW };

typedef struct field {
    const char *name;
    enum field_id id;
    enum kind kind;
    bool required; /* always written; optional ones only when set */
} field;

static const field stored_fields[] = {
    {"block_hashes", F_HASHES, K_HASHES, true},
    {"parent_block_hash", F_PARENT, K_PARENT, true},
    {"token_ids", F_TOKENS, K_TOKENS, true},
    {"block_size", F_BLOCK_SIZE, K_UINT, true},
    {"lora_id", F_LORA_ID, K_NIL_INT, true},
    {"medium", F_MEDIUM, K_STR_NIL, true},
    {"lora_name", F_LORA_NAME, K_STR_NIL, true},
    {"extra_keys", F_EXTRA, K_EXTRA, false},
    {"group_idx", F_GROUP, K_UINT, false},
    {"kv_cache_spec_kind", F_SPEC_KIND, K_STR, false},
    {"kv_cache_spec_sliding_window", F_SPEC_WINDOW, K_INT_NIL, false},
};
static const field removed_fields[] = {
    {"block_hashes", F_HASHES, K_HASHES, true},
    {"medium", F_MEDIUM, K_STR_NIL, true},
    {"group_idx", F_GROUP, K_UINT, false},
};

typedef struct type_desc {
    const char *name;
    const field *fields;
    size_t n_fields;
} type_desc;

static const type_desc types[] = {
    [KVEV_STORED] = {"BlockStored", stored_fields, sizeof stored_fields / sizeof stored_fields[0]},
    [KVEV_REMOVED] = {"BlockRemoved", removed_fields,
                      sizeof removed_fields / sizeof removed_fields[0]},
    [KVEV_CLEARED] = {"AllBlocksCleared", NULL, 0},
};

/* ---- encoding ------------------------------------------------------------- */

static int pack_str(msgpack_packer *pk, const char *s)
{
    if (s == NULL) return msgpack_pack_nil(pk);
    return mpmap_pack_cstr(pk, s);
}

/* Each block's packed entry written as it is (a packer has no call for
 * that: its callback appends bytes), nil for an empty one. */
static int pack_extra(msgpack_packer *pk, const kvev_event *e)
{
    if (msgpack_pack_array(pk, (uint32_t)e->n_hashes) != 0) return -1;
    for (size_t i = 0; i < e->n_hashes; i++) {
        int rc = e->extra_mp_len[i] == 0
                     ? msgpack_pack_nil(pk)
                     : pk->callback(pk->data, (const char *)e->extra_mp[i], e->extra_mp_len[i]);
        if (rc != 0) return -1;
    }
    return 0;
}

/* Whether an optional field has a value to write (required ones always do). */
static bool present(const kvev_event *e, const field *f)
{
    return f->required || (f->id == F_EXTRA && e->extra_mp != NULL);
}

static int pack_value(msgpack_packer *pk, const kvev_event *e, enum field_id id)
{
    switch (id) {
    case F_HASHES:
        if (msgpack_pack_array(pk, (uint32_t)e->n_hashes) != 0) return -1;
        for (size_t i = 0; i < e->n_hashes; i++)
            if (msgpack_pack_fix_uint64(pk, e->hashes[i]) != 0) return -1;
        return 0;
    case F_PARENT:
        return e->has_parent ? msgpack_pack_fix_uint64(pk, e->parent) : msgpack_pack_nil(pk);
    case F_TOKENS:
        if (msgpack_pack_array(pk, (uint32_t)e->n_tokens) != 0) return -1;
        for (size_t i = 0; i < e->n_tokens; i++)
            if (msgpack_pack_uint32(pk, e->tokens[i]) != 0) return -1;
        return 0;
    case F_BLOCK_SIZE:
        return msgpack_pack_uint32(pk, e->block_size);
    case F_LORA_ID:
        return msgpack_pack_nil(pk); /* deprecated: routers read lora_name */
    case F_MEDIUM:
        return pack_str(pk, e->medium);
    case F_LORA_NAME:
        return pack_str(pk, e->lora_name);
    case F_EXTRA:
        return pack_extra(pk, e);
    default:
        return -1; /* the encoder never writes the engine-only fields */
    }
}

int kvev_pack_event(msgpack_packer *pk, const kvev_event *e, bool positional)
{
    const type_desc *t = &types[e->type];
    uint32_t n = 1;
    for (size_t i = 0; i < t->n_fields; i++) n += present(e, &t->fields[i]);
    int rc = positional ? msgpack_pack_array(pk, n) : msgpack_pack_map(pk, n);
    if (rc == 0 && !positional) rc = mpmap_pack_cstr(pk, "type");
    if (rc == 0) rc = mpmap_pack_cstr(pk, t->name);
    for (size_t i = 0; rc == 0 && i < t->n_fields; i++) {
        if (!present(e, &t->fields[i])) continue;
        if (!positional) rc = mpmap_pack_cstr(pk, t->fields[i].name);
        if (rc == 0) rc = pack_value(pk, e, t->fields[i].id);
    }
    return rc == 0 ? 0 : -1;
}

int kvev_pack_batch(double ts, const void *events, size_t len, uint32_t n_events,
                    uint32_t dp_rank, uint8_t **out, size_t *out_len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = msgpack_pack_array(&pk, 3);
    if (rc == 0) rc = msgpack_pack_double(&pk, ts);
    if (rc == 0) rc = msgpack_pack_array(&pk, n_events);
    if (rc == 0 && len > 0) rc = msgpack_sbuffer_write(&sb, events, len);
    if (rc == 0) rc = msgpack_pack_uint32(&pk, dp_rank);
    if (rc != 0) {
        msgpack_sbuffer_destroy(&sb);
        return -1;
    }
    *out = (uint8_t *)sb.data;
    *out_len = sb.size;
    return 0;
}

/* ---- decoding ------------------------------------------------------------- */

static bool is_nil(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_NIL;
}

/* A NUL-free str of at most KVEV_MAX_STR bytes, copied as a C string. */
static const char *take_str(const msgpack_object *o, char **out)
{
    if (o->type != MSGPACK_OBJECT_STR) return "a str was expected";
    if (o->via.str.size > KVEV_MAX_STR) return "str too long";
    if (memchr(o->via.str.ptr, '\0', o->via.str.size)) return "str holds a NUL byte";
    char *s = malloc(o->via.str.size + 1);
    if (s == NULL) return "out of memory";
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = '\0';
    *out = s;
    return NULL;
}

static const char *take_hashes(const msgpack_object *o, kvev_event *e)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) return "block_hashes is not an array";
    uint32_t n = o->via.array.size;
    if (n == 0 || n > KVEV_MAX_HASHES) return "block_hashes must hold 1 to 65536 hashes";
    uint64_t *h = malloc(n * sizeof *h);
    if (h == NULL) return "out of memory";
    e->hashes = h;
    e->n_hashes = n;
    for (uint32_t i = 0; i < n; i++)
        if (!mpmap_u64(&o->via.array.ptr[i], &h[i])) return "a block hash is not a u64";
    return NULL;
}

static const char *take_tokens(const msgpack_object *o, kvev_event *e)
{
    if (o->type != MSGPACK_OBJECT_ARRAY) return "token_ids is not an array";
    uint32_t n = o->via.array.size;
    if (n > KVEV_MAX_TOKENS) return "too many token_ids";
    if (n == 0) return NULL;
    uint32_t *t = malloc(n * sizeof *t);
    if (t == NULL) return "out of memory";
    e->tokens = t;
    e->n_tokens = n;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if (!mpmap_u64(&o->via.array.ptr[i], &v) || v > UINT32_MAX)
            return "a token id is not a u32";
        t[i] = (uint32_t)v;
    }
    return NULL;
}

static void free_extra(kvev_event *e)
{
    for (size_t i = 0; e->extra && i < e->n_hashes; i++) {
        char **k = (char **)e->extra[i];
        for (uint32_t j = 0; k && j < e->n_extra[i]; j++) free(k[j]);
        free(k);
    }
    for (size_t i = 0; e->extra_mp && i < e->n_hashes; i++) free((void *)e->extra_mp[i]);
    free((void *)e->extra);
    free((void *)e->n_extra);
    free((void *)e->extra_mp);
    free((void *)e->extra_mp_len);
    e->extra = NULL;
    e->n_extra = NULL;
    e->extra_mp = NULL;
    e->extra_mp_len = NULL;
}

/* No state: a str key within the bounds; NULL, or why not. */
static const char *check_key_str(const msgpack_object *o)
{
    if (o->via.str.size > KVEV_MAX_STR) return "an extra key's str is too long";
    if (memchr(o->via.str.ptr, '\0', o->via.str.size)) return "an extra key's str holds a NUL byte";
    return NULL;
}

/* No state: one block's entry (not nil), an array of str, int and arrays
 * of them within the bounds; NULL, or why not. */
static const char *check_extra_obj(const msgpack_object *b)
{
    if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size > KVEV_MAX_EXTRA)
        return "a block's extra keys must be nil or an array of at most 64 keys";
    for (uint32_t j = 0; j < b->via.array.size; j++) {
        const msgpack_object *k = &b->via.array.ptr[j];
        const char *why = NULL;
        if (k->type == MSGPACK_OBJECT_STR) {
            why = check_key_str(k);
        } else if (k->type == MSGPACK_OBJECT_ARRAY) {
            if (k->via.array.size > KVEV_MAX_EXTRA) return "an extra key's array is too long";
            for (uint32_t x = 0; why == NULL && x < k->via.array.size; x++) {
                const msgpack_object *v = &k->via.array.ptr[x];
                if (v->type == MSGPACK_OBJECT_STR)
                    why = check_key_str(v);
                else if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                         v->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
                    why = "an extra key's array holds other than str and int";
            }
        } else if (k->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
                   k->type != MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            why = "an extra key is not a str, an int or an array of them";
        }
        if (why) return why;
    }
    return NULL;
}

const char *kvev_check_extra(const void *buf, size_t len)
{
    if (buf == NULL || len == 0 || len > KVEV_MAX_EXTRA_BYTES)
        return "extra keys take 1 to 4096 bytes";
    msgpack_unpacked up;
    bool nomem;
    const char *why = mpmap_unpack(buf, len, len + 1, 2, &up, &nomem);
    if (why == NULL) why = check_extra_obj(&up.data);
    msgpack_unpacked_destroy(&up);
    return why;
}

int kvev_take_packed(msgpack_sbuffer *sb, uint8_t **out, size_t *out_len)
{
    if (sb->size > KVEV_MAX_EXTRA_BYTES || sb->data == NULL) return -1;
    *out = (uint8_t *)sb->data;
    *out_len = sb->size;
    return 0;
}

int kvev_extra_from_strings(const char *const *keys, uint32_t n, uint8_t **out, size_t *out_len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = msgpack_pack_array(&pk, n);
    for (uint32_t i = 0; rc == 0 && i < n; i++) rc = mpmap_pack_cstr(&pk, keys[i]);
    if (rc == 0) rc = kvev_take_packed(&sb, out, out_len);
    if (rc != 0) msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* extra_keys: one entry per block (the hashes come first in every form),
 * kept packed, and as strings when they are strings alone. */
static const char *take_extra(const msgpack_object *o, kvev_event *e)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != e->n_hashes)
        return "extra_keys must hold one entry per block";
    const char ***ex = calloc(e->n_hashes, sizeof *ex);
    uint32_t *nx = calloc(e->n_hashes, sizeof *nx);
    uint8_t **mp = calloc(e->n_hashes, sizeof *mp);
    uint32_t *mpl = calloc(e->n_hashes, sizeof *mpl);
    e->extra = (const char *const *const *)ex;
    e->n_extra = nx;
    e->extra_mp = (const uint8_t *const *)mp;
    e->extra_mp_len = mpl;
    if (ex == NULL || nx == NULL || mp == NULL || mpl == NULL) return "out of memory";
    for (size_t i = 0; i < e->n_hashes; i++) {
        const msgpack_object *b = &o->via.array.ptr[i];
        if (is_nil(b)) continue;
        const char *why = check_extra_obj(b);
        if (why) return why;
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        size_t len;
        if (msgpack_pack_object(&pk, *b) != 0 || kvev_take_packed(&sb, &mp[i], &len) != 0) {
            msgpack_sbuffer_destroy(&sb);
            return "a block's extra keys are too long or out of memory";
        }
        mpl[i] = (uint32_t)len;
        bool strings = true;
        for (uint32_t j = 0; j < b->via.array.size; j++)
            strings = strings && b->via.array.ptr[j].type == MSGPACK_OBJECT_STR;
        if (!strings) continue;
        char **keys = calloc(b->via.array.size ? b->via.array.size : 1, sizeof *keys);
        if (keys == NULL) return "out of memory";
        ex[i] = (const char **)keys;
        for (uint32_t j = 0; j < b->via.array.size; j++, nx[i]++) {
            why = take_str(&b->via.array.ptr[j], &keys[j]);
            if (why) return why;
        }
    }
    return NULL;
}

static const char *take_opt_str(const msgpack_object *o, const char **out)
{
    if (is_nil(o)) return NULL;
    char *s = NULL;
    const char *why = take_str(o, &s);
    *out = s;
    return why;
}

static const char *take_field(const field *f, const msgpack_object *o, kvev_event *e)
{
    uint64_t v;
    switch (f->id) {
    case F_HASHES: return take_hashes(o, e);
    case F_PARENT:
        if (is_nil(o)) return NULL;
        if (!mpmap_u64(o, &e->parent)) return "parent_block_hash is not a u64 or nil";
        e->has_parent = true;
        return NULL;
    case F_TOKENS: return take_tokens(o, e);
    case F_BLOCK_SIZE:
        if (!mpmap_u64(o, &v) || v > UINT32_MAX) return "block_size is not a u32";
        e->block_size = (uint32_t)v;
        return NULL;
    case F_LORA_ID:
        return is_nil(o) || mpmap_u64(o, &v) ? NULL : "lora_id is not an int or nil";
    case F_MEDIUM: return take_opt_str(o, &e->medium);
    case F_LORA_NAME: return take_opt_str(o, &e->lora_name);
    case F_EXTRA: return take_extra(o, e);
    case F_GROUP: return mpmap_u64(o, &v) ? NULL : "group_idx is not a uint";
    case F_SPEC_KIND: return o->type == MSGPACK_OBJECT_STR ? NULL : "kv_cache_spec_kind is not a str";
    case F_SPEC_WINDOW:
        return is_nil(o) || mpmap_u64(o, &v) ? NULL : "kv_cache_spec_sliding_window is not a uint";
    }
    return "unknown field";
}

/* A map's keys in table order (optional ones may be left out), or the
 * positional elements in the same order. */
static const char *take_fields(const type_desc *t, const msgpack_object *o, bool positional,
                               kvev_event *e)
{
    uint32_t n = positional ? o->via.array.size : o->via.map.size;
    size_t f = 0;
    for (uint32_t i = 1; i < n; i++, f++) {
        const msgpack_object *val;
        if (positional) {
            if (f >= t->n_fields) return "too many elements in an event";
            val = &o->via.array.ptr[i];
        } else {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            while (f < t->n_fields && !mpmap_str_is(k, t->fields[f].name)) {
                if (t->fields[f].required) return "an event's field is missing or out of order";
                f++;
            }
            if (f == t->n_fields) return "unknown, repeated or out-of-order key in an event";
            val = &o->via.map.ptr[i].val;
        }
        const char *why = take_field(&t->fields[f], val, e);
        if (why) return why;
    }
    for (; f < t->n_fields; f++)
        if (t->fields[f].required) return "an event's field is missing";
    return NULL;
}

static const char *take_event(const msgpack_object *o, bool positional, kvev_event *e)
{
    const msgpack_object *tag;
    if (positional) {
        if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0)
            return "a positional event is not a non-empty array";
        tag = &o->via.array.ptr[0];
    } else {
        if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size == 0) return "an event is not a map";
        if (!mpmap_str_is(&o->via.map.ptr[0].key, "type")) return "an event's first key is not type";
        tag = &o->via.map.ptr[0].val;
    }
    size_t t = 0;
    while (t < sizeof types / sizeof types[0] && !mpmap_str_is(tag, types[t].name)) t++;
    if (t == sizeof types / sizeof types[0]) return "unknown event type";
    e->type = (kvev_type)t;
    const char *why = take_fields(&types[t], o, positional, e);
    if (why == NULL && e->type == KVEV_STORED && e->n_tokens > 0 &&
        (e->block_size == 0 || e->n_tokens != e->n_hashes * (size_t)e->block_size))
        why = "token_ids must be whole blocks: block_size per block hash";
    return why;
}

static void event_free(kvev_event *e)
{
    free((void *)e->hashes);
    free((void *)e->tokens);
    free((void *)e->medium);
    free((void *)e->lora_name);
    free_extra(e);
}

void kvev_batch_free(kvev_batch *b)
{
    for (size_t i = 0; b->events && i < b->n_events; i++) event_free(&b->events[i]);
    free(b->events);
    memset(b, 0, sizeof *b);
}

static const char *take_batch(const msgpack_object *root, kvev_batch *out)
{
    if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size != 3)
        return "a batch is not an array of three";
    const msgpack_object *ts = &root->via.array.ptr[0], *evs = &root->via.array.ptr[1];
    if (ts->type != MSGPACK_OBJECT_FLOAT64) return "the timestamp is not a float64";
    out->ts = ts->via.f64;
    if (!mpmap_u64(&root->via.array.ptr[2], &out->dp_rank)) return "dp_rank is not a uint";
    if (evs->type != MSGPACK_OBJECT_ARRAY) return "the events are not an array";
    out->n_events = evs->via.array.size;
    if (out->n_events == 0) return NULL;
    out->positional = evs->via.array.ptr[0].type == MSGPACK_OBJECT_ARRAY;
    out->events = calloc(out->n_events, sizeof *out->events);
    if (out->events == NULL) return "out of memory";
    for (size_t i = 0; i < out->n_events; i++) {
        const char *why = take_event(&evs->via.array.ptr[i], out->positional, &out->events[i]);
        if (why) return why;
    }
    return NULL;
}

const char *kvev_decode_batch(const void *buf, size_t len, kvev_batch *out)
{
    memset(out, 0, sizeof *out);
    msgpack_unpacked up;
    bool nomem;
    /* [batch [events {event [extra_keys [entry [tuple]]]}]]: six levels
     * at most. */
    const char *why = mpmap_unpack(buf, len, len + 1, 6, &up, &nomem);
    if (why == NULL) why = take_batch(&up.data, out);
    msgpack_unpacked_destroy(&up);
    if (why) kvev_batch_free(out);
    return why;
}

const char *kvev_decode_replay_request(const void *buf, size_t len, uint64_t *start)
{
    if (buf == NULL || len != 8) return "a replay request is exactly 8 bytes";
    *start = kvev_get_be64(buf);
    return NULL;
}
