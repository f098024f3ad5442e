/* Field-table msgpack maps (see mpmap.h). */
#include "net/mpmap.h"

#include <string.h>

#include "net/mpscan.h"

const char *mpmap_unpack(const void *buf, size_t len, size_t max_objects, int max_depth,
                         msgpack_unpacked *up, bool *nomem)
{
    *nomem = false;
    msgpack_unpacked_init(up);
    const char *why = mpscan(buf, len, max_objects, max_depth);
    if (why) return why;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(up, buf, len, &off);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
        *nomem = true;
        return "out of memory";
    }
    return r != MSGPACK_UNPACK_SUCCESS || off != len ? "malformed msgpack" : NULL;
}

bool mpmap_str_is(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && strlen(s) == o->via.str.size &&
           memcmp(s, o->via.str.ptr, o->via.str.size) == 0;
}

const char *mpmap_fields(const msgpack_object *o, const char *const *names, int n,
                         const msgpack_object **vals, uint32_t *present, const char *not_map,
                         int *dup)
{
    if (o->type != MSGPACK_OBJECT_MAP) return not_map;
    *present = 0;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) return "map key is not a str";
        int f = 0;
        while (f < n && !mpmap_str_is(k, names[f])) f++;
        if (f == n) return "unknown key";
        if (*present & 1u << f) {
            if (dup) *dup = f;
            return "duplicate key";
        }
        *present |= 1u << f;
        vals[f] = &o->via.map.ptr[i].val;
    }
    return NULL;
}

bool mpmap_u64(const msgpack_object *o, uint64_t *v)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
    *v = o->via.u64;
    return true;
}

bool mpmap_bool(const msgpack_object *o, bool *v)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return false;
    *v = o->via.boolean;
    return true;
}

/* ---- packing ------------------------------------------------------------- */

typedef struct bounded {
    msgpack_sbuffer sb;
    size_t max;
} bounded;

/* msgpack_sbuffer_write that stops at the limit, so an oversized message
 * fails early instead of growing the buffer. */
static int write_bounded(void *data, const char *buf, size_t len)
{
    bounded *b = data;
    if (len > b->max - b->sb.size) return -1;
    return msgpack_sbuffer_write(&b->sb, buf, len);
}

int mpmap_pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

int mpmap_pack_bool(msgpack_packer *pk, bool b)
{
    return b ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

int mpmap_pack(uint32_t mask, const char *const *names, int n, mpmap_value_fn value,
               const void *msg, size_t max, void **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    bounded b = {.max = max};
    msgpack_sbuffer_init(&b.sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b, write_bounded);
    int rc = msgpack_pack_map(&pk, (size_t)__builtin_popcount(mask));
    for (int f = 0; f < n && rc == 0; f++)
        if (mask & 1u << f) rc = mpmap_pack_cstr(&pk, names[f]) || value(&pk, msg, f);
    if (rc != 0) {
        msgpack_sbuffer_destroy(&b.sb);
        return -1;
    }
    *len = b.sb.size;
    *buf = msgpack_sbuffer_release(&b.sb);
    return 0;
}
