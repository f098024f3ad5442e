/* An instance's KV events (kvcr_config.kv_events): the inventory the core
 * queues for kvcr_poll, published by a net/kvpub.h publisher in the wire
 * format routers read. The core knows nothing of it: it only queues
 * inventory (kvcr_t.inventory_on), and kvcr_poll hands every event here
 * as well as to the inventory callback.
 *
 * Threads: api_events_feed from the polling thread with no instance lock
 * held; the publisher's own lock makes feed, stop and gauges safe from any
 * thread. */
#ifndef KVCR_API_EVENTS_H
#define KVCR_API_EVENTS_H

#include <stdint.h>

#include "core/instance.h"

/* Where an instance's stream starts and who keeps its next number
 * (kvpub_opts.numbered, on the publisher's thread): in guard mode the
 * group's journal header, so that whoever publishes for the group next
 * continues the numbering. */
typedef struct api_events_stream {
    uint64_t first_seq;
    void (*numbered)(void *ud, uint64_t next_seq);
    void *ud;
} api_events_stream;

/* Starts the publisher when the configuration has an endpoint (before
 * any inventory is queued), its numbering as st says (NULL or no
 * numbered: kept by nobody, from the wall clock in microseconds, past
 * an earlier process's numbers); it first publishes AllBlocksCleared (what a router
 * knew of an earlier life of this endpoint is gone; the blocks found
 * again are announced after it). 0, or the publisher's error (the
 * message names the endpoint). */
int api_events_start(kvcr_t *kv, const api_events_stream *st);

/* Publishes one inventory event: the keys' router hashes (callbacks.key_hash;
 * a key without one is left out), BlockStored or BlockRemoved with the
 * tier's medium. No-op when off or stopped. */
void api_events_feed(kvcr_t *kv, const kvcr_inventory_event *ev);

/* No state: block i's extra keys packed as its BlockStored carries them
 * (*out: free() it; NULL: none), from extra_json (kvcr_deposit_options.
 * router_extra[i], NULL: none) or else rb's strings. 0, or KVCR_EINVAL
 * naming block i and the rule broken. */
int api_events_extra(const kvcr_router_block *rb, const char *extra_json, size_t i,
                     uint8_t **out, size_t *out_len);

/* kvcr_deposit_ex: keeps what the deposit says of its blocks (rb: one
 * per block, or NULL; extra_json: router_extra, or NULL) for their
 * BlockStored, by router hash, before the deposit starts. 0, or
 * KVCR_ENOMEM / KVCR_EINVAL (nothing kept). No-op when off. */
int api_events_remember(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                        const kvcr_router_block *rb, const char *const *extra_json);
/* The deposit was refused: what remember kept for it goes. */
void api_events_forget(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                       const kvcr_router_block *rb);

/* kvcr_close: AllBlocksCleared (nobody serves this instance's blocks any
 * more), what is queued is sent, the sockets close. Feeds after it are
 * ignored. */
void api_events_stop(kvcr_t *kv);

/* kvcr_free: releases what stop left. */
void api_events_destroy(kvcr_t *kv);

/* The publisher's counts as gauges (kv_events_published_batches,
 * kv_events_dropped_batches, kv_events_dropped_events, kv_events_next_seq). */
void api_events_gauges(kvcr_t *kv, gauge_sink *s);

#endif
