/* The core's side of the lower-tier seam (core/host.h): each function is a
 * thin, checked door into the instance for a tier, which sees kvcr_t as
 * opaque. Lock notes are in host.h. */
#include "core/host.h"

#include <stdlib.h>
#include <string.h>

#include "core/instance.h"
#include "core/lower.h"
#include "core/ops.h"
#include "core/residency.h"
#include "util/event.h"

void host_lock(kvcr_t *kv)
{
    instance_lock(kv);
}

void host_unlock(kvcr_t *kv)
{
    instance_unlock(kv);
}

bool host_closed(const kvcr_t *kv)
{
    return kv->closed;
}

void host_wake(kvcr_t *kv)
{
    event_signal(kv->event_fd);
}

const kvcr_conf *host_conf(const kvcr_t *kv)
{
    return &kv->conf;
}

kvcr_logger *host_logger(kvcr_t *kv)
{
    return &kv->log;
}

void host_pool_info(const kvcr_t *kv, uint32_t pool, host_pool *out)
{
    const dram_pool *p = &kv->pools[pool];
    *out = (host_pool){p->name, p->base, (size_t)p->n_slots * p->block_size, p->block_size};
}

int host_pool_named(const kvcr_t *kv, const char *name)
{
    for (uint32_t p = 0; p < kv->conf.n_pools; p++)
        if (strcmp(kv->pools[p].name, name) == 0) return (int)p;
    return -1;
}

int host_label_pool(const kvcr_t *kv, const char *label)
{
    int p = host_pool_named(kv, label);
    size_t len = pieces_pool_len(label);
    if (p >= 0 || label[len] == '\0' || len >= KVCR_NAME_MAX) return p;
    char pool[KVCR_NAME_MAX];
    memcpy(pool, label, len);
    pool[len] = '\0';
    return host_pool_named(kv, pool);
}

void host_incarnation(const kvcr_t *kv, uint8_t out[16])
{
    _Static_assert(KVCR_INC_LEN == 16, "one incarnation size");
    memcpy(out, kv->incarnation, KVCR_INC_LEN);
}

bool host_retired(const kvcr_t *kv, const uint8_t *inc, size_t len)
{
    for (size_t i = 0; len == KVCR_INC_LEN && i < kv->n_retired; i++)
        if (memcmp(inc, kv->retired[i], KVCR_INC_LEN) == 0) return true;
    return false;
}

/* ---- telemetry ------------------------------------------------------------ */

void host_observe(kvcr_t *kv, const char *scope, const char *result, double seconds)
{
    if (kv->telemetry) telemetry_observe(kv->telemetry, scope, result, seconds);
}

void host_count(kvcr_t *kv, const char *operation, uint64_t blocks, uint64_t bytes)
{
    if (kv->telemetry) telemetry_count(kv->telemetry, operation, blocks, bytes);
}

void host_refusal(kvcr_t *kv, const char *limit)
{
    if (kv->telemetry) telemetry_refusal(kv->telemetry, limit);
}

/* ---- settling reads ------------------------------------------------------- */

/* A fill's token has no entry index: the fill settles all its waiters. */
#define TOKEN_FILL UINT32_MAX

tier_token ops_entry_token(op_rec *o, uint32_t idx)
{
    return (tier_token){o, idx};
}

tier_token ops_fill_token(struct fill *f)
{
    return (tier_token){f, TOKEN_FILL};
}

void host_settle(kvcr_t *kv, tier_token tok, bool ok, kvcr_reason why)
{
    if (tok.idx == TOKEN_FILL)
        ops_fill_settle(kv, tok.owner, ok, why);
    else
        ops_entry_settle(kv, tok.owner, tok.idx, ok, why);
}

void host_discard(kvcr_t *kv, tier_token tok)
{
    if (tok.idx == TOKEN_FILL) ops_remote_fill_discard(kv, tok.owner);
}

void host_drop(kvcr_t *kv, tier_token tok)
{
    (void)kv;
    if (tok.idx == TOKEN_FILL) free(tok.owner);
}

/* ---- blocks in KVCR DRAM -------------------------------------------------- */

uint64_t host_key_hash(const uint8_t *key, size_t len)
{
    return index_hash(key, len);
}

tier_block host_find(kvcr_t *kv, const uint8_t *key, uint32_t key_len)
{
    return index_find(&kv->index, key, key_len, index_hash(key, key_len));
}

tier_block host_claim_ready(kvcr_t *kv, const uint8_t *key, uint32_t key_len,
                            const uint32_t *pools, uint32_t n_segs)
{
    block_id id = host_find(kv, key, key_len);
    const block *b = id != BLOCK_NONE ? index_get(&kv->index, id) : NULL;
    if (b == NULL || b->g2_state != G2_READY || !res_same_layout(kv, b, pools, n_segs))
        return TIER_BLOCK_NONE;
    res_claim(kv, id);
    return id;
}

void host_unclaim(kvcr_t *kv, tier_block id, bool used)
{
    if (used) res_access(kv, id);
    res_unclaim(kv, id);
}

uint32_t host_block_segments(const kvcr_t *kv, tier_block id)
{
    return index_get(&kv->index, id)->n_slots;
}

bool host_block_segment(const kvcr_t *kv, tier_block id, uint32_t i, tier_dst *out)
{
    const block *b = index_get(&kv->index, id);
    if (i >= b->n_slots) return false;
    uint32_t pool, slot;
    res_slot(kv, b, i, &pool, &slot);
    const dram_pool *p = &kv->pools[pool];
    *out = (tier_dst){dram_slot_addr(p, slot), p->block_size, pool, false, p->name, slot};
    return true;
}

int host_check_refs(const kvcr_t *kv, const kvcr_mem_ref *refs, size_t n)
{
    return ops_check_refs(kv, refs, n);
}

uint32_t host_ref_pieces(const kvcr_t *kv, const kvcr_mem_ref *r, mem_piece *out, uint32_t *pool)
{
    return ops_ref_pieces(kv, r, out, pool);
}

/* ---- lower-tier residencies ---------------------------------------------- */

const uint8_t *host_block_key(kvcr_t *kv, tier_block id, uint32_t *len)
{
    const block *b = index_get(&kv->index, id);
    *len = b->key_len;
    return block_key(b);
}

void host_protect(kvcr_t *kv, tier_block id, bool on)
{
    block *b = index_get(&kv->index, id);
    if (on)
        b->flags |= BF_PROTECTED;
    else
        b->flags &= (uint8_t)~BF_PROTECTED;
}

bool host_protected(kvcr_t *kv, tier_block id)
{
    return (index_get(&kv->index, id)->flags & BF_PROTECTED) != 0;
}

int host_reserve(kvcr_t *kv, size_t n)
{
    return index_reserve(&kv->index, n);
}

tier_lower *host_lower(kvcr_t *kv, tier_block id)
{
    return &index_get(&kv->index, id)->lower;
}

tier_block host_lower_adopt(kvcr_t *kv, const uint8_t *key, uint32_t key_len)
{
    return index_insert(&kv->index, key, key_len, index_hash(key, key_len));
}

void host_lower_gone(kvcr_t *kv, tier_block id)
{
    if (index_get(&kv->index, id)->g2_state == G2_NONE) res_removed(kv, id);
    res_prune(kv, id);
}

/* ---- the policy and the inventory ----------------------------------------- */

void host_access(kvcr_t *kv, tier_block id)
{
    res_access(kv, id);
}

kvcr_action host_eviction_decision(kvcr_t *kv, tier_block id, kvcr_tier from)
{
    return res_eviction_decision(kv, id, from);
}

/* The tier that calls for lower slots is the one that takes spills (the
 * owner of the block records' lower state, core/tier.h): its place in
 * kvcr_t.tiers keys its tenants' counts. Before it is added it can only be
 * starting (G3's warm restart adopts its blocks then): the place it is
 * added to next. */
static uint32_t spill_place(const kvcr_t *kv)
{
    return kv->spill_tier ? (uint32_t)(kv->spill_tier - kv->tiers) : kv->n_tiers;
}

void host_lower_slots(kvcr_t *kv, tier_block id, int delta)
{
    tenants_lower_add(kv, spill_place(kv), id, delta);
}

bool host_quota_first(const kvcr_t *kv)
{
    return tenants_quota_first(kv);
}

uint8_t host_tenant(const kvcr_t *kv, tier_block id)
{
    return index_get(&kv->index, id)->tenant;
}

const char *host_tenant_name(const kvcr_t *kv, tier_block id)
{
    return tenants_name(kv, index_get(&kv->index, id)->tenant);
}

void host_adopt_tenant(kvcr_t *kv, tier_block id, const void *name, size_t len)
{
    index_get(&kv->index, id)->tenant = len ? tenants_find(kv, name, len) : 0;
}

size_t host_block_meta(kvcr_t *kv, tier_block id, uint8_t *buf, size_t cap)
{
    if (kv->meta_hook.get == NULL) return 0;
    const block *b = index_get(&kv->index, id);
    return kv->meta_hook.get(kv->meta_hook.ud, block_key(b), b->key_len, buf, cap);
}

void host_meta_found(kvcr_t *kv, tier_block id, const void *meta, size_t len, kvcr_tier where)
{
    if (kv->meta_hook.found == NULL || len == 0) return;
    const block *b = index_get(&kv->index, id);
    kv->meta_hook.found(kv->meta_hook.ud, block_key(b), b->key_len, meta, len, where);
}

bool host_lower_over_quota(const kvcr_t *kv, uint32_t tenant, tier_block incoming)
{
    return tenants_lower_over(kv, spill_place(kv), (uint8_t)tenant, incoming);
}

void host_recovery(kvcr_t *kv, tier_block id, kvcr_tier target, kvcr_tier source,
                   const char *why)
{
    res_recovery(kv, id, target, source, why);
}

void host_inventory(kvcr_t *kv, kvcr_tier where, bool removed, const tier_block *ids,
                    uint32_t n)
{
    res_queue_event(kv, where, removed, ids, n);
}

/* ---- requests ------------------------------------------------------------- */

hint_state *host_hint(kvcr_t *kv, const char *request_id)
{
    return request_id ? hint_table_get(&kv->hints, request_id) : NULL;
}

/* ---- added for the remote tier -------------------------------------------- */

void host_control_drop(kvcr_t *kv, const char *cause)
{
    if (kv->telemetry) telemetry_control_drop(kv->telemetry, cause);
}
