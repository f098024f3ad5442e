/* An instance's KV events (api/events.h): inventory turned into events by
 * router hash and handed to the publisher. */
#include "api/events.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/router_meta.h"
#include "net/json.h"
#include "net/kvpub.h"

#define HASHES_PER_EVENT 1024 /* a long inventory event is split into events this long */
#define MAX_PENDING_META 65536 /* router metadata of deposits not resident yet */

struct api_events {
    pthread_mutex_t lock; /* orders feeds against stop; guards meta */
    kvpub *pub;           /* NULL once stopped */
    kvpub_counts last;    /* the counts when it stopped */
    rmeta_map meta;       /* what deposits said of their blocks, by router hash */
    uint64_t meta_unkept; /* G3 records and journal PUTs written without the metadata: too long */
    uint64_t meta_damaged; /* stored metadata found again that did not decode */
};

/* Locked (the instance lock; takes the events' lock after it, never the
 * other way round): the stored form of what the block's deposit said
 * (block_meta_hook.get). */
static size_t meta_get(void *ud, const uint8_t *key, size_t key_len, uint8_t *buf, size_t cap)
{
    kvcr_t *kv = ud;
    struct api_events *e = kv->kv_events;
    uint64_t h;
    if (kv->conf.cb.key_hash(kv->conf.cb.ud, &(kvcr_key){key, key_len}, &h) != 0) return 0;
    pthread_mutex_lock(&e->lock);
    const rmeta *m = rmeta_get(&e->meta, h);
    size_t n = m ? rmeta_encode(m, buf, cap) : 0;
    if (n > cap) e->meta_unkept++;
    pthread_mutex_unlock(&e->lock);
    return n;
}

/* Before any thread runs: stored metadata found again with its block (a G3
 * record, a recovered journal PUT); its BlockStored carries it. */
static void meta_found(void *ud, const uint8_t *key, size_t key_len, const uint8_t *b, size_t len,
                       kvcr_tier where)
{
    kvcr_t *kv = ud;
    struct api_events *e = kv->kv_events;
    uint64_t h;
    if (kv->conf.cb.key_hash(kv->conf.cb.ud, &(kvcr_key){key, key_len}, &h) != 0) return;
    pthread_mutex_lock(&e->lock);
    int rc = rmeta_found(&e->meta, h, b, len, where == KVCR_TIER_G3 ? RMETA_G3 : RMETA_DRAM);
    if (rc > 0) e->meta_damaged++;
    pthread_mutex_unlock(&e->lock);
    if (rc < 0) kvcr_log(&kv->log, KVCR_LOG_WARN, "kv events: out of memory restoring a block's "
                         "router metadata (it is announced by its hash alone)");
}

/* No state: where a stream starts. One that a successor continues (guard
 * mode: the journal header keeps its next number) goes on from there. One
 * nobody continues starts at the wall clock in microseconds, past every
 * number an earlier process on the same endpoint sent (it closes at most
 * one batch a millisecond per max_batch_events events): Dynamo's
 * standalone indexer drops every batch numbered at or below the last one
 * it applied, so a restarted stream from 0 would go unheard (its
 * AllBlocksCleared and its warm start's blocks included) until it passed
 * the old numbers, while a jump forward is a gap every consumer fills from
 * the replay or skips. */
static uint64_t first_seq(const api_events_stream *st)
{
    if (st != NULL && st->numbered != NULL) return st->first_seq;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int api_events_start(kvcr_t *kv, const api_events_stream *st)
{
    const kvcr_kv_events_options *k = &kv->conf.kv_events;
    if (k->endpoint[0] == '\0') return 0;
    struct api_events *e = calloc(1, sizeof *e);
    if (e == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    kvpub_opts o = {
        .endpoint = k->endpoint,
        .replay_endpoint = k->replay_endpoint[0] ? k->replay_endpoint : NULL,
        .topic = k->topic,
        .dp_rank = k->dp_rank,
        .buffer_batches = k->buffer_batches,
        .max_batch_events = k->max_batch_events,
        .batch_interval_ms = k->batch_interval_ms,
        .max_queued_batches = k->max_queued_batches,
        .positional = k->legacy_positional,
        .first_seq = first_seq(st),
        .numbered = st ? st->numbered : NULL,
        .numbered_ud = st ? st->ud : NULL,
    };
    int rc = kvpub_open(&o, &kv->log, &e->pub);
    if (rc != 0) {
        free(e);
        return rc;
    }
    pthread_mutex_init(&e->lock, NULL);
    rmeta_init(&e->meta, MAX_PENDING_META);
    kvpub_add(e->pub, &(kvev_event){.type = KVEV_CLEARED});
    kv->kv_events = e;
    kv->inventory_on = true;
    kv->meta_hook = (block_meta_hook){meta_get, meta_found, kv};
    kvcr_log(&kv->log, KVCR_LOG_INFO, "kv events: %s %s, topic '%s'%s%s, from sequence %llu",
             kvpub_binds(k->endpoint) ? "bound" : "connected to", k->endpoint, k->topic,
             o.replay_endpoint ? ", replay at " : "", o.replay_endpoint ? o.replay_endpoint : "",
             (unsigned long long)o.first_seq);
    return 0;
}

static const char *medium_of(const kvcr_t *kv, kvcr_tier where)
{
    return where == KVCR_TIER_G3 ? kv->conf.kv_events.medium_g3 : kv->conf.kv_events.medium_dram;
}

/* Locked: a block its deposit described, in an event of its own (its
 * parent, tokens, LoRA name and extra keys are its alone). */
static void publish_described(kvpub *pub, uint64_t hash, const rmeta *m, const char *medium)
{
    const uint8_t *extra[1] = {m->extra};
    uint32_t extra_len[1] = {m->extra_len};
    kvev_event ev = {.type = KVEV_STORED, .hashes = &hash, .n_hashes = 1,
                     .has_parent = m->has_parent, .parent = m->parent,
                     .tokens = m->n_tokens ? m->tokens : NULL, .n_tokens = m->n_tokens,
                     .block_size = m->block_size, .medium = medium, .lora_name = m->lora_name,
                     .extra_mp = m->extra ? extra : NULL,
                     .extra_mp_len = m->extra ? extra_len : NULL};
    kvpub_add(pub, &ev);
}

/* Locked (the events' lock): described blocks one by one, the others by
 * their hashes alone, in events of at most HASHES_PER_EVENT. */
static void publish_keys(kvcr_t *kv, struct api_events *e, const kvcr_inventory_event *ev)
{
    const char *medium = medium_of(kv, ev->tier);
    unsigned bit = ev->tier == KVCR_TIER_G3 ? RMETA_G3 : RMETA_DRAM;
    kvev_event plain = {.type = ev->removed ? KVEV_REMOVED : KVEV_STORED, .medium = medium};
    uint64_t hashes[HASHES_PER_EVENT];
    size_t n = 0;
    for (size_t i = 0; i < ev->n_keys; i++) {
        uint64_t h;
        if (kv->conf.cb.key_hash(kv->conf.cb.ud, &ev->keys[i], &h) != 0) continue;
        if (ev->removed) {
            rmeta_removed(&e->meta, h, bit);
        } else {
            const rmeta *m = rmeta_get(&e->meta, h);
            rmeta_stored(&e->meta, h, bit);
            if (m != NULL) {
                publish_described(e->pub, h, m, medium);
                continue;
            }
        }
        hashes[n++] = h;
        if (n == HASHES_PER_EVENT) {
            plain.hashes = hashes;
            plain.n_hashes = n;
            kvpub_add(e->pub, &plain);
            n = 0;
        }
    }
    if (n > 0) {
        plain.hashes = hashes;
        plain.n_hashes = n;
        kvpub_add(e->pub, &plain);
    }
}

void api_events_feed(kvcr_t *kv, const kvcr_inventory_event *ev)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL) return;
    pthread_mutex_lock(&e->lock);
    if (e->pub) publish_keys(kv, e, ev);
    pthread_mutex_unlock(&e->lock);
}

/* No state: one JSON key or tuple element, a str or a non-negative
 * integer, packed. NULL, or the rule it breaks. */
static const char *pack_json_scalar(msgpack_packer *pk, const json_doc *d, const json_node *v)
{
    if (v->type == JSON_STRING) {
        if (v->str_len > KVEV_MAX_STR) return "an extra key's string is too long (256 bytes)";
        if (memchr(json_str(d, v), '\0', v->str_len)) return "an extra key holds a NUL";
        return msgpack_pack_str_with_body(pk, json_str(d, v), v->str_len) ? "out of memory" : NULL;
    }
    if (v->type == JSON_NUMBER && v->is_u64)
        return msgpack_pack_uint64(pk, v->u64) ? "out of memory" : NULL;
    return "an extra key must be a string, a non-negative integer or a list of them";
}

/* No state: router_extra's JSON text as a block's packed extra keys (the
 * array vLLM would send: a str, an int, a tuple as an array). NULL with
 * *out (free() it), or the rule broken (nothing allocated). */
static const char *extra_from_json(const char *json, size_t len, uint8_t **out, size_t *out_len)
{
    json_doc d;
    if (json == NULL || json_parse(json, len, &d) != 0) return "extra keys must be JSON text";
    const json_node *root = json_root(&d);
    const char *why = NULL;
    if (root->type != JSON_ARRAY || root->n_children > KVEV_MAX_EXTRA)
        why = "extra keys must be a JSON array of at most 64 keys";
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (why == NULL && msgpack_pack_array(&pk, root->n_children) != 0) why = "out of memory";
    for (const json_node *k = json_child(&d, root->first_child); why == NULL && k;
         k = json_child(&d, k->next)) {
        if (k->type != JSON_ARRAY) {
            why = pack_json_scalar(&pk, &d, k);
            continue;
        }
        if (k->n_children > KVEV_MAX_EXTRA) why = "an extra key's list is too long (64)";
        else if (msgpack_pack_array(&pk, k->n_children) != 0) why = "out of memory";
        for (const json_node *v = json_child(&d, k->first_child); why == NULL && v;
             v = json_child(&d, v->next))
            why = pack_json_scalar(&pk, &d, v);
    }
    json_free(&d);
    if (why == NULL && kvev_take_packed(&sb, out, out_len) != 0)
        why = "extra keys take more than 4096 bytes packed";
    if (why != NULL) msgpack_sbuffer_destroy(&sb);
    return why;
}

int api_events_extra(const kvcr_router_block *rb, const char *extra_json, size_t i,
                     uint8_t **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (extra_json != NULL) {
        if (rb->n_extra_keys > 0)
            return kvcr_fail(KVCR_EINVAL, "router block %zu: extra keys given twice "
                             "(extra_keys and router_extra)", i);
        const char *why = extra_from_json(extra_json, strlen(extra_json), out, out_len);
        return why ? kvcr_fail(KVCR_EINVAL, "router block %zu: router_extra: %s", i, why) : 0;
    }
    if (rb->n_extra_keys == 0) return 0;
    if (kvev_extra_from_strings(rb->extra_keys, rb->n_extra_keys, out, out_len) != 0)
        return kvcr_fail(KVCR_EINVAL, "router block %zu: extra keys take more than %d bytes "
                         "packed (or out of memory)", i, KVEV_MAX_EXTRA_BYTES);
    return 0;
}

int api_events_remember(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                        const kvcr_router_block *rb, const char *const *extra_json)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL || rb == NULL) return 0;
    int rc = 0;
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint64_t h;
        if (kv->conf.cb.key_hash(kv->conf.cb.ud, &blocks[i].key, &h) != 0) continue;
        uint8_t *extra;
        size_t extra_len;
        rc = api_events_extra(&rb[i], extra_json ? extra_json[i] : NULL, i, &extra, &extra_len);
        if (rc == 0 && rmeta_put(&e->meta, h, &rb[i], extra, extra_len) != 0)
            rc = kvcr_fail(KVCR_ENOMEM, "out of memory keeping blocks' router metadata");
        free(extra);
    }
    pthread_mutex_unlock(&e->lock);
    if (rc != 0) api_events_forget(kv, blocks, n, rb);
    return rc;
}

void api_events_forget(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                       const kvcr_router_block *rb)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL || rb == NULL) return;
    pthread_mutex_lock(&e->lock);
    for (size_t i = 0; i < n; i++) {
        uint64_t h;
        if (kv->conf.cb.key_hash(kv->conf.cb.ud, &blocks[i].key, &h) == 0)
            rmeta_unput(&e->meta, h);
    }
    pthread_mutex_unlock(&e->lock);
}

void api_events_stop(kvcr_t *kv)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL) return;
    pthread_mutex_lock(&e->lock);
    kvpub *pub = e->pub;
    if (pub) {
        kvpub_add(pub, &(kvev_event){.type = KVEV_CLEARED});
        kvpub_close(pub, &e->last); /* sends what is queued, the cleared event last */
        e->pub = NULL;
    }
    pthread_mutex_unlock(&e->lock);
}

void api_events_destroy(kvcr_t *kv)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL) return;
    api_events_stop(kv);
    rmeta_destroy(&e->meta);
    pthread_mutex_destroy(&e->lock);
    free(e);
    kv->kv_events = NULL;
}

void api_events_gauges(kvcr_t *kv, gauge_sink *s)
{
    struct api_events *e = kv->kv_events;
    if (e == NULL) return;
    kvpub_counts c;
    pthread_mutex_lock(&e->lock);
    if (e->pub) kvpub_counts_get(e->pub, &e->last);
    c = e->last;
    pthread_mutex_unlock(&e->lock);
    gauge_sink_add(s, "", "kv_events_published_batches", (double)c.published);
    gauge_sink_add(s, "", "kv_events_dropped_batches", (double)c.dropped);
    gauge_sink_add(s, "", "kv_events_dropped_events", (double)c.events_dropped);
    gauge_sink_add(s, "", "kv_events_next_seq", (double)c.next_seq);
    pthread_mutex_lock(&e->lock);
    double unkept = (double)e->meta_unkept, damaged = (double)e->meta_damaged;
    pthread_mutex_unlock(&e->lock);
    gauge_sink_add(s, "", "kv_events_meta_unkept", unkept);
    gauge_sink_add(s, "", "kv_events_meta_damaged", damaged);
}
