/* Router metadata by router hash (api/router_meta.h): a chained hash table
 * that doubles as it fills, and the list of pending entries. */
#include "api/router_meta.h"

#include <stdlib.h>
#include <string.h>

#include "util/bytes.h"

void rmeta_init(rmeta_map *m, size_t max_pending)
{
    memset(m, 0, sizeof *m);
    m->max_pending = max_pending;
}

void rmeta_destroy(rmeta_map *m)
{
    for (size_t i = 0; i < m->n_buckets; i++)
        for (rmeta *e = m->buckets[i], *next; e != NULL; e = next) {
            next = e->next;
            free(e);
        }
    free(m->buckets);
    memset(m, 0, sizeof *m);
}

static size_t bucket_of(const rmeta_map *m, uint64_t hash)
{
    uint64_t h = hash * 0x9E3779B97F4A7C15ull; /* the router's hash may be anything */
    return (size_t)(h >> 32) & (m->n_buckets - 1);
}

const rmeta *rmeta_get(const rmeta_map *m, uint64_t hash)
{
    if (m->n_buckets == 0) return NULL;
    for (rmeta *e = m->buckets[bucket_of(m, hash)]; e != NULL; e = e->next)
        if (e->hash == hash) return e;
    return NULL;
}

static int grow(rmeta_map *m)
{
    size_t n = m->n_buckets ? m->n_buckets * 2 : 256;
    rmeta **b = calloc(n, sizeof *b);
    if (b == NULL) return -1;
    rmeta_map g = *m;
    g.buckets = b;
    g.n_buckets = n;
    for (size_t i = 0; i < m->n_buckets; i++)
        for (rmeta *e = m->buckets[i], *next; e != NULL; e = next) {
            next = e->next;
            size_t at = bucket_of(&g, e->hash);
            e->next = b[at];
            b[at] = e;
        }
    free(m->buckets);
    m->buckets = b;
    m->n_buckets = n;
    return 0;
}

static void pending_unlink(rmeta_map *m, rmeta *e)
{
    if (!e->pending) return;
    if (e->p_prev) e->p_prev->p_next = e->p_next;
    else m->p_head = e->p_next;
    if (e->p_next) e->p_next->p_prev = e->p_prev;
    else m->p_tail = e->p_prev;
    e->p_prev = e->p_next = NULL;
    e->pending = false;
    m->n_pending--;
}

static void pending_append(rmeta_map *m, rmeta *e)
{
    e->pending = true;
    e->p_next = NULL;
    e->p_prev = m->p_tail;
    if (m->p_tail) m->p_tail->p_next = e;
    else m->p_head = e;
    m->p_tail = e;
    m->n_pending++;
}

static void drop(rmeta_map *m, rmeta *e)
{
    rmeta **at = &m->buckets[bucket_of(m, e->hash)];
    while (*at != e) at = &(*at)->next;
    *at = e->next;
    pending_unlink(m, e);
    m->count--;
    free(e);
}

/* One allocation: the entry, its tokens, the extra keys' pointers, then
 * the strings. */
static rmeta *make(uint64_t hash, const kvcr_router_block *rb)
{
    uint32_t nt = rb->token_ids ? rb->block_size_tokens : 0;
    size_t bytes = sizeof(rmeta) + nt * sizeof(uint32_t) + rb->n_extra_keys * sizeof(char *);
    size_t lora = rb->lora_name ? strlen(rb->lora_name) + 1 : 0;
    bytes += lora;
    for (uint32_t i = 0; i < rb->n_extra_keys; i++) bytes += strlen(rb->extra_keys[i]) + 1;
    rmeta *e = calloc(1, bytes);
    if (e == NULL) return NULL;
    e->hash = hash;
    e->has_parent = rb->has_parent;
    e->parent = rb->parent_hash;
    e->block_size = rb->block_size_tokens;
    e->n_tokens = nt;
    if (nt) memcpy(e->tokens, rb->token_ids, nt * sizeof(uint32_t));
    const char **extra = (const char **)(void *)&e->tokens[nt];
    char *text = (char *)&extra[rb->n_extra_keys];
    if (lora) {
        memcpy(text, rb->lora_name, lora);
        e->lora_name = text;
        text += lora;
    }
    for (uint32_t i = 0; i < rb->n_extra_keys; i++) {
        size_t n = strlen(rb->extra_keys[i]) + 1;
        memcpy(text, rb->extra_keys[i], n);
        extra[i] = text;
        text += n;
    }
    e->n_extra = rb->n_extra_keys;
    e->extra = rb->n_extra_keys ? extra : NULL;
    return e;
}

static void link_in(rmeta_map *m, rmeta *e)
{
    size_t at = bucket_of(m, e->hash);
    e->next = m->buckets[at];
    m->buckets[at] = e;
    m->count++;
}

int rmeta_put(rmeta_map *m, uint64_t hash, const kvcr_router_block *rb)
{
    rmeta *old = (rmeta *)rmeta_get(m, hash);
    if (old != NULL && old->media != 0) return 0;
    if (old == NULL && m->count + 1 > m->n_buckets && grow(m) != 0) return -1;
    rmeta *e = make(hash, rb);
    if (e == NULL) return -1;
    if (old != NULL) drop(m, old); /* a pending one: the newer deposit's word counts */
    link_in(m, e);
    pending_append(m, e);
    if (m->n_pending > m->max_pending) {
        drop(m, m->p_head);
        m->forgotten++;
    }
    return 0;
}

void rmeta_unput(rmeta_map *m, uint64_t hash)
{
    rmeta *e = (rmeta *)rmeta_get(m, hash);
    if (e != NULL && e->pending && e->media == 0) drop(m, e);
}

void rmeta_stored(rmeta_map *m, uint64_t hash, unsigned medium)
{
    rmeta *e = (rmeta *)rmeta_get(m, hash);
    if (e == NULL) return;
    pending_unlink(m, e);
    e->media |= medium;
}

void rmeta_removed(rmeta_map *m, uint64_t hash, unsigned medium)
{
    rmeta *e = (rmeta *)rmeta_get(m, hash);
    if (e == NULL) return;
    e->media &= ~medium;
    if (e->media == 0 && !e->pending) drop(m, e);
}

/* ---- the stored form ------------------------------------------------------ */

size_t rmeta_encode(const rmeta *e, uint8_t *buf, size_t cap)
{
    size_t lora = e->lora_name ? strlen(e->lora_name) : 0;
    size_t need = 2 + 4 + (e->has_parent ? 8 : 0) + (size_t)e->n_tokens * 4 +
                  (e->lora_name ? 1 + lora : 0) + 1;
    for (uint32_t i = 0; i < e->n_extra; i++) need += 1 + strlen(e->extra[i]);
    if (need > cap) return need;
    uint8_t *p = buf;
    *p++ = RMETA_FORMAT;
    *p++ = (uint8_t)((e->has_parent ? RMETA_F_PARENT : 0) | (e->n_tokens ? RMETA_F_TOKENS : 0) |
                     (e->lora_name ? RMETA_F_LORA : 0));
    put32(p, e->block_size);
    p += 4;
    if (e->has_parent) put64(p, e->parent), p += 8;
    for (uint32_t i = 0; i < e->n_tokens; i++, p += 4) put32(p, e->tokens[i]);
    if (e->lora_name) {
        *p++ = (uint8_t)lora;
        memcpy(p, e->lora_name, lora);
        p += lora;
    }
    *p++ = (uint8_t)e->n_extra;
    for (uint32_t i = 0; i < e->n_extra; i++) {
        size_t n = strlen(e->extra[i]);
        *p++ = (uint8_t)n;
        memcpy(p, e->extra[i], n);
        p += n;
    }
    return need;
}

/* A reader of stored bytes that fails for good at the first overrun. */
typedef struct reader {
    const uint8_t *p;
    size_t left;
    bool bad;
} reader;

static const uint8_t *take(reader *r, size_t n)
{
    if (r->bad || n > r->left) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *at = r->p;
    r->p += n;
    r->left -= n;
    return at;
}

/* A u8 length and that many bytes without a NUL; NULL when bad. */
static const uint8_t *take_string(reader *r, uint8_t *len)
{
    const uint8_t *n = take(r, 1);
    const uint8_t *s = n ? take(r, *n) : NULL;
    if (s == NULL || memchr(s, 0, *n) != NULL) {
        r->bad = true;
        return NULL;
    }
    *len = *n;
    return s;
}

static const char *copy_string(char *to, const uint8_t *s, size_t n)
{
    memcpy(to, s, n);
    to[n] = '\0';
    return to;
}

/* The stored bytes as a kvcr_router_block whose strings and tokens live in
 * `text` and `tokens` (NULL: only checked and sized). */
static bool parse(const uint8_t *b, size_t len, kvcr_router_block *rb, uint32_t *tokens,
                  char *text, const char **extra, size_t *text_len)
{
    reader r = {b, len, false};
    const uint8_t *head = take(&r, 6);
    if (head == NULL || head[0] != RMETA_FORMAT ||
        (head[1] & ~(RMETA_F_PARENT | RMETA_F_TOKENS | RMETA_F_LORA)) != 0)
        return false;
    unsigned flags = head[1];
    *rb = (kvcr_router_block){.block_size_tokens = get32(head + 2)};
    if (rb->block_size_tokens > KVCR_ROUTER_MAX_TOKENS) return false;
    if (flags & RMETA_F_PARENT) {
        const uint8_t *p = take(&r, 8);
        if (p == NULL) return false;
        rb->has_parent = true;
        rb->parent_hash = get64(p);
    }
    if (flags & RMETA_F_TOKENS) {
        if (rb->block_size_tokens == 0) return false;
        const uint8_t *p = take(&r, (size_t)rb->block_size_tokens * 4);
        if (p == NULL) return false;
        for (uint32_t i = 0; tokens && i < rb->block_size_tokens; i++) tokens[i] = get32(p + 4 * i);
        rb->token_ids = tokens;
    }
    size_t at = 0;
    uint8_t n;
    if (flags & RMETA_F_LORA) {
        const uint8_t *s = take_string(&r, &n);
        if (s == NULL) return false;
        if (text) rb->lora_name = copy_string(text + at, s, n);
        at += (size_t)n + 1;
    }
    const uint8_t *count = take(&r, 1);
    if (count == NULL || *count > KVCR_ROUTER_MAX_EXTRA) return false;
    rb->n_extra_keys = *count;
    for (uint32_t i = 0; i < rb->n_extra_keys; i++) {
        const uint8_t *s = take_string(&r, &n);
        if (s == NULL) return false;
        if (text) extra[i] = copy_string(text + at, s, n);
        at += (size_t)n + 1;
    }
    rb->extra_keys = extra;
    *text_len = at;
    return r.left == 0 && !r.bad;
}

rmeta *rmeta_decode(uint64_t hash, const uint8_t *b, size_t len, bool *damaged)
{
    kvcr_router_block rb;
    size_t text_len;
    *damaged = b == NULL || !parse(b, len, &rb, NULL, NULL, NULL, &text_len);
    if (*damaged) return NULL;
    /* The strings' pointers, the tokens and the strings for make(), which
     * copies them. */
    size_t nt = (b[1] & RMETA_F_TOKENS) ? rb.block_size_tokens : 0;
    void *tmp = malloc(rb.n_extra_keys * sizeof(char *) + nt * 4 + text_len + 1);
    if (tmp == NULL) return NULL;
    const char **extra = tmp;
    uint32_t *tokens = (uint32_t *)(void *)(extra + rb.n_extra_keys);
    char *text = (char *)(tokens + nt);
    parse(b, len, &rb, tokens, text, extra, &text_len);
    rmeta *e = make(hash, &rb);
    free(tmp);
    return e;
}

int rmeta_found(rmeta_map *m, uint64_t hash, const uint8_t *b, size_t len, unsigned medium)
{
    rmeta *old = (rmeta *)rmeta_get(m, hash);
    if (old != NULL) {
        rmeta_stored(m, hash, medium);
        return 0;
    }
    if (m->count + 1 > m->n_buckets && grow(m) != 0) return -1;
    bool damaged;
    rmeta *e = rmeta_decode(hash, b, len, &damaged);
    if (e == NULL) return damaged ? 1 : -1;
    e->media = medium;
    link_in(m, e);
    return 0;
}
