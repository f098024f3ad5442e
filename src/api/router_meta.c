/* Router metadata by router hash (api/router_meta.h): a chained hash table
 * that doubles as it fills, and the list of pending entries. */
#include "api/router_meta.h"

#include <stdlib.h>
#include <string.h>

#include "net/kvev.h"
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

/* One allocation: the entry, its tokens, the LoRA name, then the packed
 * extra keys. */
static rmeta *make(uint64_t hash, const kvcr_router_block *rb, const uint8_t *extra,
                   size_t extra_len)
{
    uint32_t nt = rb->token_ids ? rb->block_size_tokens : 0;
    size_t lora = rb->lora_name ? strlen(rb->lora_name) + 1 : 0;
    size_t bytes = sizeof(rmeta) + nt * sizeof(uint32_t) + lora + (extra ? extra_len : 0);
    rmeta *e = calloc(1, bytes);
    if (e == NULL) return NULL;
    e->hash = hash;
    e->has_parent = rb->has_parent;
    e->parent = rb->parent_hash;
    e->block_size = rb->block_size_tokens;
    e->n_tokens = nt;
    if (nt) memcpy(e->tokens, rb->token_ids, nt * sizeof(uint32_t));
    char *text = (char *)&e->tokens[nt];
    if (lora) {
        memcpy(text, rb->lora_name, lora);
        e->lora_name = text;
        text += lora;
    }
    if (extra) {
        memcpy(text, extra, extra_len);
        e->extra = (const uint8_t *)text;
        e->extra_len = (uint32_t)extra_len;
    }
    return e;
}

static void link_in(rmeta_map *m, rmeta *e)
{
    size_t at = bucket_of(m, e->hash);
    e->next = m->buckets[at];
    m->buckets[at] = e;
    m->count++;
}

/* Locked: e joins the pending list; past the bound the oldest pending
 * entry is forgotten. */
static void make_pending(rmeta_map *m, rmeta *e)
{
    pending_append(m, e);
    if (m->n_pending > m->max_pending) {
        drop(m, m->p_head);
        m->forgotten++;
    }
}

int rmeta_put(rmeta_map *m, uint64_t hash, const kvcr_router_block *rb, const uint8_t *extra,
              size_t extra_len)
{
    rmeta *old = (rmeta *)rmeta_get(m, hash);
    if (old != NULL && old->media != 0) return 0;
    if (old == NULL && m->count + 1 > m->n_buckets && grow(m) != 0) return -1;
    rmeta *e = make(hash, rb, extra, extra_len);
    if (e == NULL) return -1;
    if (old != NULL) drop(m, old); /* a pending one: the newer deposit's word counts */
    link_in(m, e);
    make_pending(m, e);
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
    /* Pending again, not dropped: a spill's G3 store comes after its
     * DRAM removal and must find the block's metadata. */
    if (e->media == 0 && !e->pending) make_pending(m, e);
}

/* ---- the stored form ------------------------------------------------------ */

size_t rmeta_encode(const rmeta *e, uint8_t *buf, size_t cap)
{
    size_t lora = e->lora_name ? strlen(e->lora_name) : 0;
    size_t need = 2 + 4 + (e->has_parent ? 8 : 0) + (size_t)e->n_tokens * 4 +
                  (e->lora_name ? 1 + lora : 0) + (e->extra ? 2 + (size_t)e->extra_len : 1);
    if (need > cap) return need;
    uint8_t *p = buf;
    *p++ = RMETA_FORMAT;
    *p++ = (uint8_t)((e->has_parent ? RMETA_F_PARENT : 0) | (e->n_tokens ? RMETA_F_TOKENS : 0) |
                     (e->lora_name ? RMETA_F_LORA : 0) | (e->extra ? RMETA_F_PACKED : 0));
    put32(p, e->block_size);
    p += 4;
    if (e->has_parent) put64(p, e->parent), p += 8;
    for (uint32_t i = 0; i < e->n_tokens; i++, p += 4) put32(p, e->tokens[i]);
    if (e->lora_name) {
        *p++ = (uint8_t)lora;
        memcpy(p, e->lora_name, lora);
        p += lora;
    }
    if (e->extra) {
        put16(p, (uint16_t)e->extra_len);
        memcpy(p + 2, e->extra, e->extra_len);
    } else {
        *p = 0; /* the older form's count: no extra keys */
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

/* The stored bytes, checked and located (pointers into them). */
typedef struct parsed {
    kvcr_router_block rb;    /* without tokens, LoRA name or extra keys */
    const uint8_t *tokens;   /* rb.block_size_tokens little-endian u32, or NULL */
    const uint8_t *lora;     /* lora_len bytes, or NULL */
    uint8_t lora_len;
    const uint8_t *packed;   /* RMETA_F_PACKED: packed_len bytes of msgpack */
    size_t packed_len;
    const uint8_t *old_keys; /* the older form: n_old keys, each a u8 length and bytes */
    uint8_t n_old;
} parsed;

/* No state: the stored bytes checked strictly (the format in
 * router_meta.h) and located in *out; false at any deviation. */
static bool parse(const uint8_t *b, size_t len, parsed *out)
{
    reader r = {b, len, false};
    *out = (parsed){0};
    const uint8_t *head = take(&r, 6);
    if (head == NULL || head[0] != RMETA_FORMAT ||
        (head[1] & ~(RMETA_F_PARENT | RMETA_F_TOKENS | RMETA_F_LORA | RMETA_F_PACKED)) != 0)
        return false;
    unsigned flags = head[1];
    out->rb.block_size_tokens = get32(head + 2);
    if (out->rb.block_size_tokens > KVCR_ROUTER_MAX_TOKENS) return false;
    if (flags & RMETA_F_PARENT) {
        const uint8_t *p = take(&r, 8);
        if (p == NULL) return false;
        out->rb.has_parent = true;
        out->rb.parent_hash = get64(p);
    }
    if (flags & RMETA_F_TOKENS) {
        if (out->rb.block_size_tokens == 0) return false;
        if ((out->tokens = take(&r, (size_t)out->rb.block_size_tokens * 4)) == NULL) return false;
    }
    if ((flags & RMETA_F_LORA) && (out->lora = take_string(&r, &out->lora_len)) == NULL)
        return false;
    if (flags & RMETA_F_PACKED) {
        const uint8_t *n = take(&r, 2);
        out->packed_len = n ? get16(n) : 0;
        out->packed = n ? take(&r, out->packed_len) : NULL;
        if (out->packed == NULL || kvev_check_extra(out->packed, out->packed_len) != NULL)
            return false;
    } else {
        const uint8_t *count = take(&r, 1);
        if (count == NULL || *count > KVCR_ROUTER_MAX_EXTRA) return false;
        out->n_old = *count;
        out->old_keys = r.p;
        uint8_t n;
        for (uint32_t i = 0; i < out->n_old; i++)
            if (take_string(&r, &n) == NULL) return false;
    }
    return r.left == 0 && !r.bad;
}

/* No state: the older form's list of strings (checked by parse), packed
 * as a list of str. -1: out of memory. */
static int pack_old_keys(const parsed *p, uint8_t **out, size_t *out_len)
{
    char *text = malloc((size_t)p->n_old * 256);
    const char **keys = malloc((p->n_old ? p->n_old : 1) * sizeof *keys);
    int rc = text && keys ? 0 : -1;
    const uint8_t *at = p->old_keys;
    for (uint32_t i = 0; rc == 0 && i < p->n_old; i++) {
        char *k = text + (size_t)i * 256;
        memcpy(k, at + 1, at[0]);
        k[at[0]] = '\0';
        keys[i] = k;
        at += 1 + at[0];
    }
    if (rc == 0) rc = kvev_extra_from_strings(keys, p->n_old, out, out_len);
    free(keys);
    free(text);
    return rc;
}

rmeta *rmeta_decode(uint64_t hash, const uint8_t *b, size_t len, bool *damaged)
{
    parsed p;
    *damaged = b == NULL || !parse(b, len, &p);
    if (*damaged) return NULL;
    /* The tokens and the LoRA name as make() takes them (it copies). */
    uint32_t nt = p.tokens ? p.rb.block_size_tokens : 0;
    uint32_t *tokens = malloc(nt * sizeof *tokens + p.lora_len + 1);
    uint8_t *old = NULL;
    size_t old_len = 0;
    rmeta *e = NULL;
    if (tokens != NULL && (p.n_old == 0 || pack_old_keys(&p, &old, &old_len) == 0)) {
        for (uint32_t i = 0; i < nt; i++) tokens[i] = get32(p.tokens + 4 * i);
        p.rb.token_ids = nt ? tokens : NULL;
        if (p.lora) {
            char *lora = (char *)(tokens + nt);
            memcpy(lora, p.lora, p.lora_len);
            lora[p.lora_len] = '\0';
            p.rb.lora_name = lora;
        }
        e = p.packed ? make(hash, &p.rb, p.packed, p.packed_len) : make(hash, &p.rb, old, old_len);
    }
    free(old);
    free(tokens);
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
