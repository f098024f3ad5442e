/* Router hints: the kv_hint envelope (protocol 0.1, action kv.fetch 1.0)
 * and the request-scoped state it leaves (docs/ARCHITECTURE.md, the peer tier). */
#ifndef KVCR_NET_HINT_H
#define KVCR_NET_HINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

typedef struct hint {
    char *source;      /* source_control_endpoint */
    uint64_t *hashes;  /* sorted, unique, at least one */
    size_t n_hashes;
    char *text;        /* the JSON text as submitted, NUL-terminated (what policies see) */
    size_t text_len;
} hint;

/* Validates JSON text strictly. On failure returns KVCR_EINVAL (or ENOMEM)
 * with a message naming the rule and leaves *out empty. */
int hint_parse(const char *text, size_t len, const kvcr_logger *log, hint *out);
void hint_clear(hint *h);

typedef struct hint_state {
    struct hint_state *next;
    char *request_id;
    hint hint;
    uint64_t submitted_ns; /* the first submission; kept when replaced */
    bool failed;           /* two sources, or a failed pull: fail closed */
    uint64_t *misses;      /* key hashes the source did not have: sorted */
    size_t n_misses, cap_misses;
} hint_state;

typedef struct hint_table {
    hint_state **buckets;
    size_t n_buckets, count;
} hint_table;

void hint_table_destroy(hint_table *t);
/* Takes *h (cleared on return) for request_id, by the rules of §3.4. */
int hint_table_submit(hint_table *t, const char *request_id, hint *h, uint64_t now_ns);
bool hint_table_discard(hint_table *t, const char *request_id);
const hint_state *hint_table_find(const hint_table *t, const char *request_id);
hint_state *hint_table_get(hint_table *t, const char *request_id);

/* Remembered misses, by the key's index hash: a key the
 * source answered without is not asked for again in this request. */
int hint_state_add_miss(hint_state *s, uint64_t key_hash);
bool hint_state_is_miss(const hint_state *s, uint64_t key_hash);

#endif
