/* The core as a lower tier sees it: the only core functions a tier may
 * call (with core/tier.h and core/conf.h, the only core headers a tier
 * includes). A tier holds the instance as an opaque kvcr_t.
 *
 * Locking: functions marked "locked" need the instance lock, which the
 * tier holds either because the core called it with the lock held (every
 * tier_ops method marked locked) or because its own thread took it with
 * host_lock(). A tier takes the lock only on its own threads, never inside
 * a method the core called. Nothing here calls back into a tier. */
#ifndef KVCR_CORE_HOST_H
#define KVCR_CORE_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/conf.h"
#include "core/tier.h"
#include "kvcr/kvcr.h"
#include "net/hint.h"
#include "util/log.h"

/* ---- the instance ------------------------------------------------------- */

/* From a tier's own thread: the instance lock. */
void host_lock(kvcr_t *kv);
void host_unlock(kvcr_t *kv);
/* Locked: close has begun (no new work may start). */
bool host_closed(const kvcr_t *kv);
/* Any thread: the polling side has tier work to settle (wakes kvcr_poll's
 * eventfd). */
void host_wake(kvcr_t *kv);
/* Any thread: the immutable configuration. */
const kvcr_conf *host_conf(const kvcr_t *kv);
/* Any thread: the logger (log lines are queued and delivered outside the
 * lock, see util/log.h). */
kvcr_logger *host_logger(kvcr_t *kv);

/* One KVCR DRAM pool, as fixed at start (any thread). */
typedef struct host_pool {
    const char *name;
    uint8_t *base;
    size_t bytes;
    size_t block_size;
} host_pool;
void host_pool_info(const kvcr_t *kv, uint32_t pool, host_pool *out);
/* The pool of that name, or -1. */
int host_pool_named(const kvcr_t *kv, const char *name);

/* Who this instance is to peers (16 bytes), and whether an incarnation is
 * one that answered on its endpoint before and is gone for good. */
void host_incarnation(const kvcr_t *kv, uint8_t out[16]);
bool host_retired(const kvcr_t *kv, const uint8_t *inc, size_t len);

/* ---- telemetry (locked; no-ops with telemetry off) ------------------------ */

void host_observe(kvcr_t *kv, const char *scope, const char *result, double seconds);
void host_count(kvcr_t *kv, const char *operation, uint64_t blocks, uint64_t bytes);
void host_refusal(kvcr_t *kv, const char *limit);

/* ---- settling reads (locked) ---------------------------------------------- */

/* A read ended: success (ok) or failure with why. A fill's waiters and
 * its slots are settled with it. */
void host_settle(kvcr_t *kv, tier_token tok, bool ok, kvcr_reason why);
/* A fetch's deadline passed while the bytes may still land: its waiters
 * fail now, the slots stay reserved until host_settle. Deliver tokens:
 * nothing to do. */
void host_discard(kvcr_t *kv, tier_token tok);

/* ---- blocks in KVCR DRAM (locked) ----------------------------------------- */

/* The record of a key, or TIER_BLOCK_NONE. */
tier_block host_find(kvcr_t *kv, const uint8_t *key, uint32_t key_len);
uint64_t host_key_hash(const uint8_t *key, size_t len);
/* A READY KVCR DRAM block of the key whose layout has n_segs segments of
 * these pools, claimed (no eviction until host_unclaim), or
 * TIER_BLOCK_NONE. */
tier_block host_claim_ready(kvcr_t *kv, const uint8_t *key, uint32_t key_len,
                            const uint32_t *pools, uint32_t n_segs);
/* Ends a claim; `used`: the bytes were read (an access for the policy). */
void host_unclaim(kvcr_t *kv, tier_block id, bool used);
/* Segment i of a block's KVCR DRAM residency: address, length, pool, slot. */
bool host_block_segment(const kvcr_t *kv, tier_block id, uint32_t i, tier_dst *out);
uint32_t host_block_segments(const kvcr_t *kv, tier_block id);

/* Framework references, checked as deposit checks them (0 or an error
 * with its message), and a reference's pieces (core/conf.h: at most
 * PIECES_MAX; their regions index host_conf()->regions) and pool: 0 pieces
 * when it does not check. */
int host_check_refs(const kvcr_t *kv, const kvcr_mem_ref *refs, size_t n);
uint32_t host_ref_pieces(const kvcr_t *kv, const kvcr_mem_ref *r, mem_piece *out, uint32_t *pool);
/* The pool a region label names: a pool's own name, else the pool
 * "pool:part" or "pool:*" is part of; -1: none. */
int host_label_pool(const kvcr_t *kv, const char *label);

/* ---- lower-tier residencies (locked) ------------------------------------ */

/* A block's key (valid while the record exists). */
const uint8_t *host_block_key(kvcr_t *kv, tier_block id, uint32_t *len);
/* Marks a block as part of the batch being made room for: no eviction
 * (DRAM or lower) picks it meanwhile. */
void host_protect(kvcr_t *kv, tier_block id, bool on);
bool host_protected(kvcr_t *kv, tier_block id);
/* Room for n more records before a run of host_lower_adopt (0 or
 * KVCR_ENOMEM). */
int host_reserve(kvcr_t *kv, size_t n);

/* The block record's lower-tier state (core/tier.h). The pointer stays
 * valid while the record exists. */
tier_lower *host_lower(kvcr_t *kv, tier_block id);
/* A record for a key found below at start (warm restart), or
 * TIER_BLOCK_NONE when the index is full. */
tier_block host_lower_adopt(kvcr_t *kv, const uint8_t *key, uint32_t key_len);
/* The lower residency ended (state already 0): the policy hears of it if
 * nothing else holds the block, and an unused record is dropped. */
void host_lower_gone(kvcr_t *kv, tier_block id);

/* ---- the policy and the inventory (locked) ------------------------------ */

void host_access(kvcr_t *kv, tier_block id);
/* The policy's sanitised eviction decision for a block leaving `from`. */
kvcr_action host_eviction_decision(kvcr_t *kv, tier_block id, kvcr_tier from);
/* Tenants (core/tenants.h), for the tier that takes spills: a block took
 * (delta 1) or gave back (-1) one of its slots (from its start on: a warm
 * restart's blocks count before kvcr_create adds the tier); a block's tenant (0: none,
 * else 1..host_conf()->n_tenants); whether the policy orders eviction by
 * tenant quotas; and whether a tenant is over its quota in that tier,
 * counting the slot the incoming block (TIER_BLOCK_NONE: none) asks for
 * (false when the policy does not order by quotas). */
void host_lower_slots(kvcr_t *kv, tier_block id, int delta);
uint8_t host_tenant(const kvcr_t *kv, tier_block id);
/* The name of the block's tenant, NULL for none. */
const char *host_tenant_name(const kvcr_t *kv, tier_block id);
/* A record host_lower_adopt just made takes the tenant named name (a name
 * no longer configured: none), before it holds any slot. */
void host_adopt_tenant(kvcr_t *kv, tier_block id, const void *name, size_t len);
/* The API layer's opaque bytes of the block (core/recovery.h
 * block_meta_hook.get): their length, 0 for none, more than cap when they
 * do not fit. */
size_t host_block_meta(kvcr_t *kv, tier_block id, uint8_t *buf, size_t cap);
/* Before any thread runs: such bytes found again with a block now
 * resident in `where`. */
void host_meta_found(kvcr_t *kv, tier_block id, const void *meta, size_t len, kvcr_tier where);
bool host_quota_first(const kvcr_t *kv);
bool host_lower_over_quota(const kvcr_t *kv, uint32_t tenant, tier_block incoming);
/* A move the policy asked for failed: decide_recovery, DROP. */
void host_recovery(kvcr_t *kv, tier_block id, kvcr_tier target, kvcr_tier source,
                   const char *why);
/* Queues an inventory event for the blocks. */
void host_inventory(kvcr_t *kv, kvcr_tier where, bool removed, const tier_block *ids,
                    uint32_t n);

/* ---- requests ----------------------------------------------------------- */

/* Locked: the router hint stored for a request, or NULL. */
hint_state *host_hint(kvcr_t *kv, const char *request_id);

/* ---- added for the remote tier ---- */

/* Unlocked, from a tier's destroy: a token the tier will never settle (close
 * gave up on its read while the source might still write): the core frees
 * what it keeps for that token alone (a fetch's fill, which nothing else
 * frees) and settles nothing. Deliver tokens: nothing to do. */
void host_drop(kvcr_t *kv, tier_token tok);

/* Locked: one message or connection dropped at the peer control endpoint,
 * counted in kvcr_control_dropped_total{cause} (a static string:
 * net/control.h's ctl_drop_name); a no-op with telemetry off. */
void host_control_drop(kvcr_t *kv, const char *cause);

#endif
