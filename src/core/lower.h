/* The core's loop over its lower tiers (core/tier.h): reads in batches,
 * the layouts a spilling tier can keep, and each tier's part of close,
 * progress, callbacks and gauges. Functions say which side of the
 * instance lock they run on. */
#ifndef KVCR_CORE_LOWER_H
#define KVCR_CORE_LOWER_H

#include "core/instance.h"

/* Before any thread calls a tier (kvcr_create; a test before its first
 * call): adds a started tier after the others in read order. Refused, with
 * nothing changed and the tier still the caller's: a tier_ops of another
 * version (KVCR_EINVAL), a table already holding KVCR_MAX_TIERS tiers
 * (KVCR_ELIMIT), a second tier that takes spills (KVCR_EINVAL: a block
 * record has one lower-tier state, core/tier.h). */
int lower_add(kvcr_t *kv, const tier_ops *ops, tier *t);

/* An operation's (or a query's) open batch with every tier. */
typedef struct lower_reads {
    tier_batch *batch[KVCR_MAX_TIERS];
} lower_reads;

/* The most segments a block's layout has (an entry's destinations). */
#define LOWER_MAX_SEGMENTS 255

/* Locked. Opens a batch with every tier for this request. */
void lower_reads_begin(kvcr_t *kv, lower_reads *lr, const char *request_id, kvcr_op_handle op,
                       bool fetch, size_t max_keys, size_t max_refs);
/* Locked. The first tier (in read order) that holds the key, or -1. */
int lower_reads_holder(kvcr_t *kv, lower_reads *lr, tier_block id, const uint8_t *key,
                       uint32_t key_len);
/* Locked. Closes every batch (submits the reads). */
void lower_reads_end(kvcr_t *kv, lower_reads *lr);

/* Locked or before any thread runs. 0 when the tier that takes spills can
 * keep this layout (or there is none), else KVCR_EINVAL naming the tier. */
int lower_layout_check(const kvcr_t *kv, const uint32_t *pools, uint32_t n_segs);

/* Whether some tier takes spills to `target`. */
bool lower_takes_spills(const kvcr_t *kv, kvcr_tier target);

/* Close, in order: stop (unlocked), close (locked), run callbacks
 * (unlocked), destroy (unlocked, at free). */
void lower_stop(kvcr_t *kv);
void lower_close(kvcr_t *kv);
void lower_run_callbacks(kvcr_t *kv);
void lower_destroy(kvcr_t *kv);
/* Locked. Every tier's gauges. */
void lower_gauges(kvcr_t *kv, gauge_sink *s);

/* Locked: the tokens a tier settles through core/host.h. */
tier_token ops_entry_token(op_rec *o, uint32_t idx);
tier_token ops_fill_token(struct fill *f);

#endif
