/* A strict, bounded JSON reader for router hints.
 *
 * jansson (the library the design names) stores integers as int64 and
 * refuses anything above INT64_MAX, yet router block hashes are u64: half of
 * them would not parse. This reader keeps every integer token as an exact
 * u64 when it fits, and is otherwise strict RFC 8259: no trailing data, no
 * duplicate object keys, no control characters in strings, valid UTF-8
 * escapes, nesting at most JSON_MAX_DEPTH deep. It builds a small tree in
 * one arena; nothing points into the input. */
#ifndef KVCR_NET_JSON_H
#define KVCR_NET_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 32
#define JSON_MAX_TEXT (16u << 20)

enum json_type { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT };

typedef struct json_node {
    uint8_t type;     /* enum json_type */
    bool is_u64;      /* a number written as a non-negative integer that fits */
    uint64_t u64;
    uint32_t str_off, str_len; /* JSON_STRING: decoded UTF-8 in doc->strings */
    uint32_t key_off, key_len; /* the member name, inside an object */
    uint32_t first_child, next; /* indices into the tree; 0 = none */
    uint32_t n_children;
} json_node;

typedef struct json_doc {
    json_node *nodes; /* nodes[0] is unused so that 0 can mean "none" */
    uint32_t n_nodes, cap_nodes;
    char *strings;
    size_t n_strings, cap_strings;
} json_doc;

/* Parses text; on failure leaves doc empty and returns -1 (not strict
 * JSON, or over the limits) or JSON_ENOMEM (out of memory: the text may be
 * fine, and a caller's error must say so). */
#define JSON_ENOMEM (-2)
int json_parse(const char *text, size_t len, json_doc *doc);
void json_free(json_doc *doc);

static inline const json_node *json_root(const json_doc *d)
{
    return &d->nodes[1];
}

static inline const char *json_str(const json_doc *d, const json_node *n)
{
    return d->strings + n->str_off;
}

/* The member of an object named key, or NULL. */
const json_node *json_get(const json_doc *d, const json_node *obj, const char *key);

static inline const json_node *json_child(const json_doc *d, uint32_t i)
{
    return i ? &d->nodes[i] : NULL;
}

#endif
