/* G2 residencies: slot allocation with policy-driven eviction, claims, the
 * evictable queue, policy calls and the inventory/capacity notices they
 * cause. Every function here runs with the instance lock held. */
#ifndef KVCR_CORE_RESIDENCY_H
#define KVCR_CORE_RESIDENCY_H

#include "core/instance.h"

/* The policy's view of a block; size_bytes from its residency if any. */
void res_meta(const kvcr_t *kv, block_id id, uint64_t size_bytes, kvcr_block_meta *meta);
uint64_t res_layout_bytes(const kvcr_t *kv, const uint32_t *pools, uint32_t n);

/* The policy's admission decision, sanitised: true = admit. */
bool res_admit(kvcr_t *kv, block_id id, uint64_t size_bytes, kvcr_tier source, bool required);

/* Gives the block slots for the layout, evicting unprotected blocks as the
 * policy decides. Returns false (nothing changed) when it cannot. On true
 * the block is G2_FILLING. */
bool res_alloc(kvcr_t *kv, block_id id, const uint32_t *pools, uint32_t n);

/* FILLING -> READY: records the fill time, tells the policy, makes the
 * block evictable and adds it to the open inventory batch of `origin`
 * (entry origin_idx of that operation). */
void res_commit(kvcr_t *kv, block_id id, kvcr_op_handle origin, uint32_t origin_idx);

/* Returns a failed fill's slots; the block is left without residency. */
void res_unfill(kvcr_t *kv, block_id id);
/* A block recovered from a recovery journal, READY in (pool, slot) with no
 * access history, admitted to the policy as LOCAL_G2 (no inventory event).
 * The caller made sure the slot is not on the free list. False when the
 * policy declined it (nothing changed). */
bool res_adopt(kvcr_t *kv, block_id id, uint32_t pool, uint32_t slot);

void res_access(kvcr_t *kv, block_id id);
/* One recency for ids[0..n) (a prefix sequence, in order): see
 * kvcr_align_sequence. Needs the instance lock. */
void res_align(kvcr_t *kv, const block_id *ids, uint32_t n, bool use_current_time);
void res_claim(kvcr_t *kv, block_id id);
void res_unclaim(kvcr_t *kv, block_id id);

/* A public claim with a release handle; 0 if the claim map is full (call
 * res_reserve_claims first). */
kvcr_release_handle res_claim_public(kvcr_t *kv, block_id id);
bool res_release_public(kvcr_t *kv, kvcr_release_handle h);
int res_reserve_claims(kvcr_t *kv, size_t n);

/* The policy's sanitised eviction decision for a block leaving `tier`:
 * KEEP, DROP, or MOVE_TO (a spill to G3). */
kvcr_action res_eviction_decision(kvcr_t *kv, block_id id, kvcr_tier tier);
/* A spill (or move) the policy asked for failed: decide_recovery, DROP. */
void res_recovery(kvcr_t *kv, block_id id, kvcr_tier target, kvcr_tier source, const char *why);
/* The block's last managed residency went away: policy on_remove. */
void res_removed(kvcr_t *kv, block_id id);
/* Queues an inventory event for the blocks. */
void res_queue_event(kvcr_t *kv, kvcr_tier tier, bool removed, const block_id *ids, uint32_t n);

/* Drops the record if nothing refers to it any more. */
void res_prune(kvcr_t *kv, block_id id);

/* Whether the block's residency has exactly this layout of pools. */
bool res_same_layout(const kvcr_t *kv, const block *b, const uint32_t *pools, uint32_t n);
/* Slot index i of the block's layout. */
void res_slot(const kvcr_t *kv, const block *b, uint32_t i, uint32_t *pool, uint32_t *slot);

/* Inventory: closes the open commit batch into a queued event. */
void res_flush_commits(kvcr_t *kv);
/* Capacity pressure: queues pools that newly fell below their watermark. */
void res_check_capacity(kvcr_t *kv);

/* Public claims and batches end with the instance. */
void res_destroy(kvcr_t *kv);

#endif
