#include "net/hint.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvcr/error.h"
#include "net/json.h"

#define INVALID "invalid router hint"

/* Version mismatches are warned about once per process and kind. */
static atomic_bool warned_protocol, warned_action;

static void warn_once(atomic_bool *flag, const kvcr_logger *log, const char *what,
                      const json_doc *d, const json_node *n)
{
    if (atomic_exchange(flag, true)) return;
    kvcr_log(log, KVCR_LOG_WARN, "router hint %s is '%s', not the supported one; reading it as such",
             what, n && n->type == JSON_STRING ? json_str(d, n) : "(missing)");
}

static bool is_string(const json_doc *d, const json_node *n, const char *want)
{
    return n && n->type == JSON_STRING && n->str_len == strlen(want) &&
           memcmp(json_str(d, n), want, n->str_len) == 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int read_hashes(const json_doc *d, const json_node *list, hint *out)
{
    if (list == NULL || list->type != JSON_ARRAY || list->n_children == 0)
        return kvcr_fail(KVCR_EINVAL, INVALID);
    uint64_t *h = malloc(list->n_children * sizeof *h);
    if (h == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    size_t n = 0;
    for (const json_node *e = json_child(d, list->first_child); e; e = json_child(d, e->next)) {
        if (e->type != JSON_NUMBER || !e->is_u64) {
            free(h);
            return kvcr_fail(KVCR_EINVAL, INVALID);
        }
        h[n++] = e->u64;
    }
    qsort(h, n, sizeof *h, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || h[i] != h[u - 1]) h[u++] = h[i];
    out->hashes = h;
    out->n_hashes = u;
    return 0;
}

/* The first kv.fetch action of the envelope, checked; its payload or NULL. */
static const json_node *fetch_payload(const json_doc *d, const kvcr_logger *log)
{
    const json_node *root = json_root(d);
    if (root->type != JSON_OBJECT) return NULL;
    if (!is_string(d, json_get(d, root, "protocol_version"), "0.1"))
        warn_once(&warned_protocol, log, "protocol_version", d, json_get(d, root, "protocol_version"));
    const json_node *actions = json_get(d, root, "actions");
    if (actions == NULL || actions->type != JSON_ARRAY) return NULL;
    for (const json_node *a = json_child(d, actions->first_child); a; a = json_child(d, a->next)) {
        if (a->type != JSON_OBJECT || !is_string(d, json_get(d, a, "action_type"), "kv.fetch"))
            continue;
        if (!is_string(d, json_get(d, a, "action_version"), "1.0"))
            warn_once(&warned_action, log, "action_version", d, json_get(d, a, "action_version"));
        const json_node *p = json_get(d, a, "payload");
        return p && p->type == JSON_OBJECT ? p : NULL;
    }
    return NULL;
}

static int read_payload(const json_doc *d, const json_node *p, hint *out)
{
    if (json_get(d, p, "no_retain")) return kvcr_fail(KVCR_EINVAL, "no_retain is not currently supported");
    const json_node *mode = json_get(d, p, "mode");
    if (mode && !is_string(d, mode, "copy"))
        return kvcr_fail(KVCR_EINVAL, "only copy mode is currently supported");
    const json_node *src = json_get(d, p, "source_control_endpoint");
    if (src == NULL || src->type == JSON_NULL)
        return kvcr_fail(KVCR_EINVAL, "source-less hints are not currently supported");
    if (src->type != JSON_STRING || src->str_len == 0 || strlen(json_str(d, src)) != src->str_len)
        return kvcr_fail(KVCR_EINVAL, INVALID);
    int rc = read_hashes(d, json_get(d, p, "block_hashes"), out);
    if (rc != 0) return rc;
    out->source = strdup(json_str(d, src));
    if (out->source == NULL) {
        hint_clear(out);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    return 0;
}

int hint_parse(const char *text, size_t len, const kvcr_logger *log, hint *out)
{
    memset(out, 0, sizeof *out);
    json_doc d;
    int parsed = json_parse(text, len, &d);
    if (parsed == JSON_ENOMEM) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (parsed != 0) return kvcr_fail(KVCR_EINVAL, INVALID);
    const json_node *payload = fetch_payload(&d, log);
    int rc = payload ? read_payload(&d, payload, out) : kvcr_fail(KVCR_EINVAL, INVALID);
    json_free(&d);
    if (rc == 0 && (out->text = malloc(len + 1)) == NULL) {
        hint_clear(out);
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    if (rc == 0) {
        memcpy(out->text, text, len);
        out->text[len] = '\0';
        out->text_len = len;
    }
    return rc;
}

void hint_clear(hint *h)
{
    free(h->source);
    free(h->hashes);
    free(h->text);
    memset(h, 0, sizeof *h);
}

/* ---- request-scoped state ------------------------------------------------ */

static size_t bucket_of(const hint_table *t, const char *rid)
{
    return (size_t)XXH3_64bits(rid, strlen(rid)) & (t->n_buckets - 1);
}

static hint_state **slot_of(const hint_table *t, const char *rid)
{
    if (t->n_buckets == 0) return NULL;
    hint_state **s = &t->buckets[bucket_of(t, rid)];
    while (*s && strcmp((*s)->request_id, rid) != 0) s = &(*s)->next;
    return s;
}

const hint_state *hint_table_find(const hint_table *t, const char *request_id)
{
    hint_state **s = slot_of(t, request_id);
    return s ? *s : NULL;
}

static int rehash(hint_table *t)
{
    size_t n = t->n_buckets ? t->n_buckets * 2 : 64;
    hint_state **b = calloc(n, sizeof *b);
    if (b == NULL) return -1;
    hint_table grown = {b, n, t->count};
    for (size_t i = 0; i < t->n_buckets; i++)
        for (hint_state *s = t->buckets[i], *next; s; s = next) {
            next = s->next;
            size_t at = bucket_of(&grown, s->request_id);
            s->next = b[at];
            b[at] = s;
        }
    free(t->buckets);
    *t = grown;
    return 0;
}

int hint_table_submit(hint_table *t, const char *request_id, hint *h, uint64_t now_ns)
{
    hint_state **s = slot_of(t, request_id);
    if (s && *s) {
        if (strcmp((*s)->hint.source, h->source) == 0) {
            hint_clear(&(*s)->hint); /* same source: a fresh hash set */
            (*s)->hint = *h;
            (*s)->failed = false;
            (*s)->n_misses = 0;
        } else {
            (*s)->failed = true; /* two sources: fail the request closed */
            hint_clear(h);
        }
        memset(h, 0, sizeof *h);
        return 0;
    }
    if (t->count >= t->n_buckets && rehash(t) != 0) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    hint_state *n = calloc(1, sizeof *n);
    char *rid = strdup(request_id);
    if (n == NULL || rid == NULL) {
        free(n);
        free(rid);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    n->request_id = rid;
    n->hint = *h;
    n->submitted_ns = now_ns;
    s = slot_of(t, request_id);
    n->next = *s;
    *s = n;
    t->count++;
    memset(h, 0, sizeof *h);
    return 0;
}

bool hint_table_discard(hint_table *t, const char *request_id)
{
    hint_state **s = slot_of(t, request_id);
    if (s == NULL || *s == NULL) return false;
    hint_state *gone = *s;
    *s = gone->next;
    hint_clear(&gone->hint);
    free(gone->misses);
    free(gone->request_id);
    free(gone);
    t->count--;
    return true;
}

void hint_table_destroy(hint_table *t)
{
    for (size_t i = 0; i < t->n_buckets; i++)
        for (hint_state *s = t->buckets[i], *next; s; s = next) {
            next = s->next;
            hint_clear(&s->hint);
            free(s->misses);
            free(s->request_id);
            free(s);
        }
    free(t->buckets);
    memset(t, 0, sizeof *t);
}

hint_state *hint_table_get(hint_table *t, const char *request_id)
{
    hint_state **s = slot_of(t, request_id);
    return s ? *s : NULL;
}

static size_t miss_pos(const hint_state *s, uint64_t key_hash)
{
    size_t lo = 0, hi = s->n_misses;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->misses[mid] < key_hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool hint_state_is_miss(const hint_state *s, uint64_t key_hash)
{
    size_t i = miss_pos(s, key_hash);
    return i < s->n_misses && s->misses[i] == key_hash;
}

int hint_state_add_miss(hint_state *s, uint64_t key_hash)
{
    size_t i = miss_pos(s, key_hash);
    if (i < s->n_misses && s->misses[i] == key_hash) return 0;
    if (s->n_misses == s->cap_misses) {
        size_t cap = s->cap_misses ? 2 * s->cap_misses : 16;
        uint64_t *m = realloc(s->misses, cap * sizeof *m);
        if (m == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
        s->misses = m;
        s->cap_misses = cap;
    }
    memmove(&s->misses[i + 1], &s->misses[i], (s->n_misses - i) * sizeof *s->misses);
    s->misses[i] = key_hash;
    s->n_misses++;
    return 0;
}
