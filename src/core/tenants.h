/* Tenants: each tenant's slots in KVCR DRAM and in each lower tier, the
 * queue of its evictable KVCR DRAM blocks, the quota checks eviction
 * makes, the policy's view of them and their gauges; and the admission
 * context a deposit or fetch gives its entries (the hints and the tenant
 * of the call). Tenant 0 is "none"; tenant t > 0 is configured tenant t - 1
 * (kvcr_conf.tenant_names). Every function runs with the instance lock
 * held unless it says otherwise. */
#ifndef KVCR_CORE_TENANTS_H
#define KVCR_CORE_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/evictq.h"
#include "core/tier.h"
#include "kvcr/kvcr.h"

typedef struct tenant_use {
    evictq evq;            /* its ready, unclaimed KVCR DRAM blocks (tenant 0: kvcr_t.evq) */
    uint64_t dram_slots;   /* KVCR DRAM slots its blocks hold (FILLING ones too) */
    uint64_t dram_evicted; /* blocks of it evicted from KVCR DRAM, since start */
    /* Per lower tier, by its place in kvcr_t.tiers: the slots its blocks
     * hold there (being written too) and its quota of them (0 for tenant
     * 0, and in a tier the configuration gives no quota). */
    uint64_t lower_slots[KVCR_MAX_TIERS];
    uint64_t lower_quota[KVCR_MAX_TIERS];
} tenant_use;

/* What the entries of one deposit or fetch are admitted with: the
 * policy's kvcr_hints and the tenant new residencies take. Lives on the
 * caller's stack for the call; kvcr_t.admit points at it while the call
 * holds the lock. */
typedef struct admit_ctx {
    kvcr_hints hints;
    uint8_t tenant;
    char *framework_copy; /* hints.framework, owned (NUL-terminated for the policy) */
} admit_ctx;

/* No lock (before any thread runs): the tenants' queues share the main
 * queue's order counter, so their fronts compare. */
void tenants_init(kvcr_t *kv);
void tenants_destroy(kvcr_t *kv);

/* Unlocked (takes the lock only to count a refusal or an unknown
 * tenant), before the call changes anything: checks the call's hints,
 * JSON text of len bytes (NULL: none; strict JSON; an object; at most
 * limits.max_hint_bytes, else KVCR_ELIMIT counted as the hint_bytes
 * refusal), and fills *ctx with a copy of them and their tenant. The
 * hints are the framework's: only with tenants configured is a "tenant"
 * member read, a string naming a configured tenant giving that tenant;
 * anything else (another name, a number) gives none, counted
 * (hints_unknown_tenant) and logged at most once a second, or with
 * strict is refused. KVCR_EINVAL names the rule broken; nothing is kept
 * then. */
int tenants_admit_prepare(kvcr_t *kv, const char *json, size_t len, bool strict,
                          admit_ctx *ctx);
/* Locked: the context is in effect for the entries admitted from now on
 * (the router hint kept for request_id, NULL: none, joins it) until
 * tenants_admit_leave. */
void tenants_admit_enter(kvcr_t *kv, admit_ctx *ctx, const char *request_id);
void tenants_admit_leave(kvcr_t *kv);
/* No lock: frees what prepare kept. */
void tenants_admit_free(admit_ctx *ctx);

/* Any thread (the configuration is fixed): the tenant named name (len
 * bytes), 0 when none is configured by that name; and tenant t's name,
 * NULL for 0. */
uint8_t tenants_find(const kvcr_t *kv, const void *name, size_t len);
const char *tenants_name(const kvcr_t *kv, uint8_t t);

/* The evictable queue a block belongs in, by its tenant. */
evictq *tenant_queue(kvcr_t *kv, block_id id);
/* Whether eviction puts tenants over their quota first: the policy asks
 * for it (KVCR_POLICY_TENANT_QUOTAS) and tenants are configured. */
bool tenants_quota_first(const kvcr_t *kv);
/* The queue whose front comes first in eviction order among the tenants
 * with eligible[t] (NULL: all), or NULL when they are all empty. */
evictq *tenants_first_queue(kvcr_t *kv, const bool *eligible);
/* How far tenant t is over its KVCR DRAM quota (negative: under it). */
int64_t tenants_dram_excess(const kvcr_t *kv, uint8_t t);

/* A block's KVCR DRAM residency gained (slots > 0) or gave back slots. */
void tenants_dram_add(kvcr_t *kv, const block *b, int64_t slots);
void tenants_evicted(kvcr_t *kv, const block *b);
/* Before any thread runs: the lower tier at `place` in kvcr_t.tiers was
 * just added; its tenants' quotas are the configuration's for its id
 * (G3: kvcr_tenant.g3_slots), none for an id without one. */
void tenants_tier_added(kvcr_t *kv, uint32_t place);
/* A block took (1) or gave back (-1) a slot of the lower tier at
 * `place`. */
void tenants_lower_add(kvcr_t *kv, uint32_t place, block_id id, int delta);
/* With quota-first eviction: whether tenant t is over its quota of the lower
 * tier at `place`, counting the slot the incoming block (TIER_BLOCK_NONE:
 * none) asks for. False when quotas do not order eviction. */
bool tenants_lower_over(const kvcr_t *kv, uint32_t place, uint8_t t, block_id incoming);

/* The policy's view of the block's tenant (kvcr_block_meta, version 2;
 * its G3 fields are those of the lower tier with the G3 id). */
void tenants_meta(const kvcr_t *kv, block_id id, kvcr_block_meta *meta);

/* The tenants' gauges (tenant_<name>_*, no_tenant_*; a lower tier's
 * under the name the configuration gives its quota, g3_*). */
void tenants_gauges(kvcr_t *kv, gauge_sink *s);

#endif
