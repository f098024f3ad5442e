/* Router metadata by router hash (api/router_meta.h): a chained hash table
 * that doubles as it fills, and the list of pending entries. */
#include "api/router_meta.h"

#include <stdlib.h>
#include <string.h>

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

int rmeta_put(rmeta_map *m, uint64_t hash, const kvcr_router_block *rb)
{
    rmeta *old = (rmeta *)rmeta_get(m, hash);
    if (old != NULL && old->media != 0) return 0;
    if (old == NULL && m->count + 1 > m->n_buckets && grow(m) != 0) return -1;
    rmeta *e = make(hash, rb);
    if (e == NULL) return -1;
    if (old != NULL) drop(m, old); /* a pending one: the newer deposit's word counts */
    size_t at = bucket_of(m, hash);
    e->next = m->buckets[at];
    m->buckets[at] = e;
    m->count++;
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
