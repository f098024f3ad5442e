/* Messages as one msgpack map with str keys from a fixed field table: the
 * shape both the peer control messages (net/wire.c) and the claim socket's
 * messages (client/frame.c) have. Decoding is strict and in two passes:
 * mpmap_unpack pre-scans the bytes (net/mpscan.h) before msgpack-c builds
 * anything, then mpmap_fields collects the root's values by field, refusing
 * unknown and duplicate keys; each protocol checks the values itself.
 * Packing writes the fields a mask selects, in table order, into a buffer
 * that refuses to grow past the protocol's limit.
 *
 * Reasons are short static strings; the callers turn them into their own
 * errors. Threads: no state; safe from any thread. */
#ifndef KVCR_NET_MPMAP_H
#define KVCR_NET_MPMAP_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The field table of a message from an X-macro list LIST(X) of
 * X(id, "key") entries: an enum of F_<id> (the field's bit and index) ending
 * in N_FIELDS, and field_names[], the keys in that order. */
#define MPMAP_FIELD_TABLE(LIST)                                                                    \
    enum { LIST(MPMAP_FIELD_ID_) N_FIELDS };                                                       \
    static const char *const field_names[N_FIELDS] = {LIST(MPMAP_FIELD_NAME_)}
#define MPMAP_FIELD_ID_(id, key) F_##id,
#define MPMAP_FIELD_NAME_(id, key) key,

/* Pre-scans buf (one object, at most max_objects objects nested at most
 * max_depth deep: mpscan) and unpacks it into up, which it initialises:
 * the caller destroys up whatever the result. NULL on success, otherwise
 * the pre-scan's reason, "malformed msgpack", or "out of memory" (msgpack-c
 * could not allocate; *nomem is then true). */
const char *mpmap_unpack(const void *buf, size_t len, size_t max_objects, int max_depth,
                         msgpack_unpacked *up, bool *nomem);

/* Whether o is a str holding exactly the bytes of s. */
bool mpmap_str_is(const msgpack_object *o, const char *s);

/* Collects the values of the map o whose str keys are among names[0..n)
 * (n <= 32): vals[f] gets the value of names[f], *present a bit per key
 * found. NULL, or not_map (o is no map), "map key is not a str",
 * "unknown key", or "duplicate key" (*dup, unless dup is NULL, gets its
 * field). */
const char *mpmap_fields(const msgpack_object *o, const char *const *names, int n,
                         const msgpack_object **vals, uint32_t *present, const char *not_map,
                         int *dup);

/* An unsigned integer, a bool: false (and *v untouched) for another type. */
bool mpmap_u64(const msgpack_object *o, uint64_t *v);
bool mpmap_bool(const msgpack_object *o, bool *v);

/* Packs the value of field f of msg (its key is packed already); 0 or -1. */
typedef int (*mpmap_value_fn)(msgpack_packer *pk, const void *msg, int f);

/* A map of the fields of mask (bit f: names[f]), keys from names, values
 * from value, in field order, into a new buffer of at most max bytes.
 * 0 with *buf (free() it) and *len, or -1: a value failed or the message
 * would pass max (or memory ran out). */
int mpmap_pack(uint32_t mask, const char *const *names, int n, mpmap_value_fn value,
               const void *msg, size_t max, void **buf, size_t *len);

/* A str of the bytes of s; a bool. 0 or -1 (the buffer refused). */
int mpmap_pack_cstr(msgpack_packer *pk, const char *s);
int mpmap_pack_bool(msgpack_packer *pk, bool b);

#endif
