#include "core/residency.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/recovery.h"
#include "core/lower.h"
#include "util/clock.h"

/* ---- layout and policy view ---------------------------------------------- */

void res_slot(const kvcr_t *kv, const block *b, uint32_t i, uint32_t *pool, uint32_t *slot)
{
    (void)kv;
    if (b->n_slots == 1) {
        *pool = b->sl.one.pool;
        *slot = b->sl.one.slot;
    } else {
        *pool = b->sl.many[2 * i];
        *slot = b->sl.many[2 * i + 1];
    }
}

uint64_t res_layout_bytes(const kvcr_t *kv, const uint32_t *pools, uint32_t n)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) bytes += kv->pools[pools[i]].block_size;
    return bytes;
}

static uint64_t block_bytes(const kvcr_t *kv, const block *b)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < b->n_slots; i++) {
        uint32_t pool, slot;
        res_slot(kv, b, i, &pool, &slot);
        bytes += kv->pools[pool].block_size;
    }
    return bytes;
}

void res_meta(const kvcr_t *kv, block_id id, uint64_t size_bytes, kvcr_block_meta *meta)
{
    const block *b = index_get(&kv->index, id);
    meta->key.data = block_key(b);
    meta->key.len = b->key_len;
    meta->size_bytes = b->n_slots ? block_bytes(kv, b) : size_bytes;
    meta->access_count = b->access_count;
    meta->last_access = b->last_access_ns ? kvcr_ns_to_s(b->last_access_ns) : -1.0;
    meta->resident_tiers = (b->g2_state == G2_READY ? KVCR_TIER_BIT(KVCR_TIER_LOCAL_G2) : 0) |
                           (b->lower.state & LOWER_READY && kv->spill_tier
                                ? KVCR_TIER_BIT(kv->spill_tier->ops->id) : 0);
    meta->position = -1;
    tenants_meta(kv, id, meta);
}

static const char *policy_name(const kvcr_t *kv)
{
    return kv->conf.policy->name ? kv->conf.policy->name : "custom";
}

/* The policy's decide_ingest, with the call's hints when its version
 * takes them. */
static int ask_ingest(kvcr_t *kv, const kvcr_block_meta *meta, kvcr_tier source, bool required,
                      kvcr_placement *d)
{
    const kvcr_policy_ops *p = kv->conf.policy;
    if (p->version < 2 || p->decide_ingest_hints == NULL)
        return p->decide_ingest(kv->conf.policy_ud, meta, source, required, d);
    static const kvcr_hints none = {0};
    return p->decide_ingest_hints(kv->conf.policy_ud, meta, source, required,
                                  kv->admit ? &kv->admit->hints : &none, d);
}

bool res_admit(kvcr_t *kv, block_id id, uint64_t size_bytes, kvcr_tier source, bool required)
{
    block *b = index_get(&kv->index, id);
    /* A block takes the call's tenant only while it holds nothing: the
     * slots it holds are counted under the tenant it had. */
    if (kv->admit != NULL && b->g2_state == G2_NONE && b->lower.state == 0)
        b->tenant = kv->admit->tenant;
    kvcr_block_meta meta;
    res_meta(kv, id, size_bytes, &meta);
    kvcr_placement d = {KVCR_ACTION_KEEP, KVCR_TIER_NONE};
    int rc = ask_ingest(kv, &meta, source, required, &d);
    if (rc != 0 || (d.action != KVCR_ACTION_KEEP && d.action != KVCR_ACTION_DROP)) {
        kvcr_log(&kv->log, KVCR_LOG_WARN,
                 "policy '%s' decide_ingest %s; admitting the block", policy_name(kv),
                 rc != 0 ? "failed" : "returned an action other than KEEP or DROP");
        return true;
    }
    if (d.action == KVCR_ACTION_DROP && required) {
        kvcr_log(&kv->log, KVCR_LOG_WARN, "policy '%s' cannot drop required-local work; keeping",
                 policy_name(kv));
        return true;
    }
    return d.action == KVCR_ACTION_KEEP;
}

/* ---- the evictable set --------------------------------------------------- */

static void count_evictable(kvcr_t *kv, const block *b, int64_t sign)
{
    for (uint32_t i = 0; i < b->n_slots; i++) {
        uint32_t pool, slot;
        res_slot(kv, b, i, &pool, &slot);
        kv->pools[pool].evictable += (uint64_t)sign;
    }
}

static void remember_unscored(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    if (kv->n_unscored == kv->cap_unscored) {
        uint32_t cap = kv->cap_unscored ? kv->cap_unscored * 2 : 64;
        block_id *u = realloc(kv->unscored, cap * sizeof *u);
        if (u == NULL) {
            kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: a block stays unevictable");
            return;
        }
        kv->unscored = u;
        kv->cap_unscored = cap;
    }
    b->flags |= BF_UNSCORED;
    kv->unscored[kv->n_unscored++] = id;
}

/* Scores a ready, unclaimed block and queues it. A failed score reuses the
 * previous one; with none the block waits in the unscored list. */
static void make_evictable(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    kvcr_block_meta meta;
    res_meta(kv, id, 0, &meta);
    double score = 0;
    int rc = kv->conf.policy->eviction_score(kv->conf.policy_ud, &meta, KVCR_TIER_LOCAL_G2, &score);
    if (rc != 0 || !isfinite(score)) {
        kvcr_log(&kv->log, KVCR_LOG_WARN, "policy '%s' eviction_score %s; %s", policy_name(kv),
                 rc != 0 ? "failed" : "is not finite",
                 (b->flags & BF_SCORED) ? "keeping the previous score"
                                        : "the block is not evictable until it is scored");
        if (!(b->flags & BF_SCORED)) {
            remember_unscored(kv, id);
            return;
        }
        score = b->score;
    }
    if (evq_insert(tenant_queue(kv, id), &kv->index, id, score) != 0) {
        remember_unscored(kv, id);
        return;
    }
    b->flags |= BF_SCORED;
    count_evictable(kv, b, 1);
}

static void unqueue(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    if (b->flags & (BF_IN_LIST | BF_IN_HEAP)) {
        evq_remove(tenant_queue(kv, id), &kv->index, id);
        count_evictable(kv, b, -1);
    }
    b->flags &= (uint8_t)~BF_UNSCORED; /* its unscored-list entry goes stale */
}

static void retry_unscored(kvcr_t *kv)
{
    /* Take the list: scoring may fail again and start a new one. */
    block_id *ids = kv->unscored;
    uint32_t n = kv->n_unscored;
    kv->unscored = NULL;
    kv->n_unscored = kv->cap_unscored = 0;
    for (uint32_t i = 0; i < n; i++) {
        block *b = index_get(&kv->index, ids[i]);
        if (!(b->flags & BF_UNSCORED)) continue;
        b->flags &= (uint8_t)~BF_UNSCORED;
        make_evictable(kv, ids[i]);
    }
    free(ids);
}

/* ---- inventory and capacity notices ------------------------------------- */

void res_queue_event(kvcr_t *kv, kvcr_tier where, bool removed, const block_id *ids, uint32_t n)
{
    if (n == 0 || !kv->inventory_on) return;
    size_t bytes = sizeof(pending_event) + n * sizeof(kvcr_key);
    for (uint32_t i = 0; i < n; i++) bytes += index_get(&kv->index, ids[i])->key_len;
    pending_event *ev = malloc(bytes);
    if (ev == NULL) {
        kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: an inventory event for %u keys is lost",
                 n);
        return;
    }
    uint8_t *kbytes = (uint8_t *)&ev->keys_storage[n];
    for (uint32_t i = 0; i < n; i++) {
        const block *b = index_get(&kv->index, ids[i]);
        memcpy(kbytes, block_key(b), b->key_len);
        ev->keys_storage[i].data = kbytes;
        ev->keys_storage[i].len = b->key_len;
        kbytes += b->key_len;
    }
    ev->next = NULL;
    ev->ev.tier = where;
    ev->ev.removed = removed;
    ev->ev.n_keys = n;
    ev->ev.keys = ev->keys_storage;
    if (kv->events_tail)
        kv->events_tail->next = ev;
    else
        kv->events_head = ev;
    kv->events_tail = ev;
}

static int by_entry(const void *a, const void *b)
{
    const struct commit *x = a, *y = b;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

void res_flush_commits(kvcr_t *kv)
{
    if (kv->n_commit == 0) return;
    /* Copies finish in any order; the event lists keys in request order. */
    qsort(kv->commits, kv->n_commit, sizeof *kv->commits, by_entry);
    block_id ids[64];
    for (uint32_t done = 0; done < kv->n_commit;) {
        uint32_t m = kv->n_commit - done < 64 ? kv->n_commit - done : 64;
        for (uint32_t i = 0; i < m; i++) ids[i] = kv->commits[done + i].block;
        res_queue_event(kv, KVCR_TIER_LOCAL_G2, false, ids, m);
        done += m;
    }
    kv->n_commit = 0;
}

static void batch_commit(kvcr_t *kv, block_id id, kvcr_op_handle origin, uint32_t idx)
{
    if (!kv->inventory_on) return;
    if (kv->n_commit > 0 && kv->commit_origin != origin) res_flush_commits(kv);
    kv->commit_origin = origin;
    if (kv->n_commit == kv->cap_commit) {
        uint32_t cap = kv->cap_commit ? kv->cap_commit * 2 : 64;
        struct commit *c = realloc(kv->commits, cap * sizeof *c);
        if (c == NULL) {
            res_flush_commits(kv); /* makes room rather than losing the key */
            if (kv->cap_commit == 0) return;
        } else {
            kv->commits = c;
            kv->cap_commit = cap;
        }
    }
    kv->commits[kv->n_commit++] = (struct commit){idx, id};
}

void res_check_capacity(kvcr_t *kv)
{
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) {
        dram_pool *pool = &kv->pools[p];
        if (pool->watermark == 0) continue;
        uint64_t reclaimable = pool->n_free + pool->evictable;
        if (reclaimable >= pool->watermark) {
            pool->pressured = false;
        } else if (!pool->pressured) {
            pool->pressured = true;
            if (kv->conf.cb.capacity_needed == NULL) continue;
            kv->pressure[kv->n_pressure].pool = pool->name;
            kv->pressure[kv->n_pressure].slots = pool->watermark;
            kv->n_pressure++;
        }
    }
}

/* ---- residency changes -------------------------------------------------- */

static void give_slots(kvcr_t *kv, block *b)
{
    for (uint32_t i = 0; i < b->n_slots; i++) {
        uint32_t pool, slot;
        res_slot(kv, b, i, &pool, &slot);
        dram_pool_give(&kv->pools[pool], slot);
    }
    tenants_dram_add(kv, b, -(int64_t)b->n_slots);
    if (b->n_slots > 1) free(b->sl.many);
    b->n_slots = 0;
    b->g2_state = G2_NONE;
}

/* A ready block leaves G2: its slots are free, and the policy hears of it
 * unless a lower tier still holds it. */
static void remove_ready(kvcr_t *kv, block_id id)
{
    unqueue(kv, id);
    recovery_remove(kv, id); /* told before the slots can be reused */
    give_slots(kv, index_get(&kv->index, id));
    if (index_get(&kv->index, id)->lower.state == 0) res_removed(kv, id);
}

bool res_same_layout(const kvcr_t *kv, const block *b, const uint32_t *pools, uint32_t n)
{
    if (b->n_slots != n) return false;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pool, slot;
        res_slot(kv, b, i, &pool, &slot);
        if (pool != pools[i]) return false;
    }
    return true;
}

void res_removed(kvcr_t *kv, block_id id)
{
    if (kv->conf.policy->on_remove == NULL) return;
    kvcr_block_meta meta;
    res_meta(kv, id, 0, &meta);
    meta.resident_tiers = 0;
    kv->conf.policy->on_remove(kv->conf.policy_ud, &meta);
}

static bool frees_short_pool(const kvcr_t *kv, const block *b, const uint64_t *shortage)
{
    for (uint32_t i = 0; i < b->n_slots; i++) {
        uint32_t pool, slot;
        res_slot(kv, b, i, &pool, &slot);
        if (shortage[pool] > 0) return true;
    }
    return false;
}

/* The policy's word on evicting a block from `from`, sanitised: KEEP,
 * DROP, or (from G2, to the lower tier that takes spills) a spill. */
kvcr_action res_eviction_decision(kvcr_t *kv, block_id id, kvcr_tier from)
{
    kvcr_block_meta meta;
    res_meta(kv, id, 0, &meta);
    kvcr_placement d = {KVCR_ACTION_KEEP, KVCR_TIER_NONE};
    int rc = kv->conf.policy->decide_eviction(kv->conf.policy_ud, &meta, from, &d);
    bool spill = (d.action == KVCR_ACTION_MOVE_TO || d.action == KVCR_ACTION_COPY_TO) &&
                 from == KVCR_TIER_LOCAL_G2 && lower_takes_spills(kv, d.tier);
    if (rc != 0 || (d.action != KVCR_ACTION_KEEP && d.action != KVCR_ACTION_DROP && !spill)) {
        kvcr_log(&kv->log, KVCR_LOG_WARN, "policy '%s' decide_eviction %s; keeping the block",
                 policy_name(kv), rc != 0 ? "failed" : "returned an action this build cannot do");
        return KVCR_ACTION_KEEP;
    }
    return spill ? KVCR_ACTION_MOVE_TO : d.action;
}

/* A placement the policy asked for failed: it may only DROP (anything else
 * is logged and dropped all the same: no other recovery exists). */
void res_recovery(kvcr_t *kv, block_id id, kvcr_tier target, kvcr_tier source, const char *why)
{
    kvcr_log(&kv->log, KVCR_LOG_WARN, "moving a block to %s failed (%s); it is dropped",
             kvcr_tier_name(target), why);
    if (kv->conf.policy->decide_recovery == NULL) return;
    kvcr_block_meta meta;
    res_meta(kv, id, 0, &meta);
    kvcr_placement_failure f = {{KVCR_ACTION_MOVE_TO, target}, source, why, 1};
    kvcr_placement d = {KVCR_ACTION_DROP, KVCR_TIER_NONE};
    int rc = kv->conf.policy->decide_recovery(kv->conf.policy_ud, &meta, &f, &d);
    if (rc != 0 || d.action != KVCR_ACTION_DROP)
        kvcr_log(&kv->log, KVCR_LOG_WARN, "policy '%s' decide_recovery %s; the block is dropped",
                 policy_name(kv), rc != 0 ? "failed" : "asked for more than DROP");
}

typedef struct popped {
    block_id id;
    bool from_list;
    bool victim;
    bool spill;
} popped;

/* The next eviction candidate, taken out of its queue: with quota-first
 * eviction (excess not NULL) the first block of a tenant still over its
 * quota, else the first in plain order. */
static block_id next_candidate(kvcr_t *kv, const int64_t *excess, bool *from_list)
{
    evictq *q = NULL;
    if (excess != NULL) {
        bool over[KVCR_MAX_TENANTS + 1];
        for (uint32_t t = 0; t <= kv->conf.n_tenants; t++) over[t] = excess[t] > 0;
        q = tenants_first_queue(kv, over);
    }
    if (q == NULL) q = tenants_first_queue(kv, NULL);
    return q ? evq_pop(q, &kv->index, from_list) : BLOCK_NONE;
}

/* Walks candidates in eviction order until the shortage is covered; the
 * block being made room for is of tenant `tenant` and asks for `asked`
 * slots (what it adds to its tenant's count). All or nothing: if it cannot
 * be covered, every candidate goes back in place. */
static bool plan_evictions(kvcr_t *kv, uint64_t *shortage, uint8_t tenant, uint64_t asked,
                           popped **out, uint32_t *n_out)
{
    popped *list = NULL;
    uint32_t n = 0, cap = 0;
    uint64_t left = 0;
    for (uint32_t p = 0; p < kv->conf.n_pools; p++) left += shortage[p];
    int64_t excess_v[KVCR_MAX_TENANTS + 1], *excess = NULL;
    if (tenants_quota_first(kv)) {
        excess = excess_v;
        for (uint32_t t = 0; t <= kv->conf.n_tenants; t++)
            excess[t] = tenants_dram_excess(kv, (uint8_t)t);
        excess[tenant] += (int64_t)asked;
    }
    while (left > 0) {
        bool from_list;
        block_id id = next_candidate(kv, excess, &from_list);
        if (id == BLOCK_NONE) break;
        if (n == cap) {
            uint32_t ncap = cap ? cap * 2 : 16;
            popped *l = realloc(list, ncap * sizeof *l);
            if (l == NULL) {
                evq_restore(tenant_queue(kv, id), &kv->index, id, from_list);
                break;
            }
            list = l;
            cap = ncap;
        }
        list[n] = (popped){id, from_list, false, false};
        block *b = index_get(&kv->index, id);
        kvcr_action act = KVCR_ACTION_KEEP;
        if (!(b->flags & BF_PROTECTED) && frees_short_pool(kv, b, shortage))
            act = res_eviction_decision(kv, id, KVCR_TIER_LOCAL_G2);
        if (act != KVCR_ACTION_KEEP) {
            list[n].victim = true;
            list[n].spill = act == KVCR_ACTION_MOVE_TO;
            if (excess != NULL) excess[b->tenant] -= b->n_slots;
            for (uint32_t i = 0; i < b->n_slots; i++) {
                uint32_t pool, slot;
                res_slot(kv, b, i, &pool, &slot);
                if (shortage[pool] > 0) shortage[pool]--, left--;
            }
        }
        n++;
    }
    /* Put back, newest first, whatever is not evicted. */
    for (uint32_t i = n; i-- > 0;)
        if (left > 0 || !list[i].victim)
            evq_restore(tenant_queue(kv, list[i].id), &kv->index, list[i].id,
                        list[i].from_list);
    *out = list;
    *n_out = n;
    return left == 0;
}

static void evict_victims(kvcr_t *kv, const popped *list, uint32_t n)
{
    block_id *ids = malloc((n ? n : 1) * sizeof *ids);
    uint32_t n_ids = 0;
    if (ids == NULL)
        kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: an eviction event is lost");
    for (uint32_t i = 0; i < n; i++)
        if (list[i].victim && ids) ids[n_ids++] = list[i].id;
    res_queue_event(kv, KVCR_TIER_LOCAL_G2, true, ids, n_ids);
    for (uint32_t i = 0; i < n; i++) {
        if (!list[i].victim) continue;
        /* A spill copies the bytes out before the slots go back. */
        if (list[i].spill && !kv->spill_tier->ops->spill(kv->spill_tier->t, list[i].id)) {
            char why[64];
            snprintf(why, sizeof why, "%s spill failed", kv->spill_tier->ops->name);
            res_recovery(kv, list[i].id, kv->spill_tier->ops->id, KVCR_TIER_LOCAL_G2, why);
        }
        block *b = index_get(&kv->index, list[i].id);
        /* Popping took it out of the queue but not out of the counts. */
        count_evictable(kv, b, -1);
        tenants_evicted(kv, b);
        remove_ready(kv, list[i].id);
        res_prune(kv, list[i].id);
    }
    free(ids);
}

static bool enough_free(const kvcr_t *kv, const uint64_t *need)
{
    for (uint32_t p = 0; p < kv->conf.n_pools; p++)
        if (need[p] > kv->pools[p].n_free) return false;
    return true;
}

bool res_alloc(kvcr_t *kv, block_id id, const uint32_t *pools, uint32_t n)
{
    uint64_t need[KVCR_MAX_POOLS] = {0};
    for (uint32_t i = 0; i < n; i++) need[pools[i]]++;
    uint32_t *many = NULL;
    if (n > 1 && (many = malloc(2 * n * sizeof *many)) == NULL) return false;
    if (!enough_free(kv, need)) {
        retry_unscored(kv);
        uint64_t shortage[KVCR_MAX_POOLS] = {0};
        for (uint32_t p = 0; p < kv->conf.n_pools; p++) {
            const dram_pool *pool = &kv->pools[p];
            if (need[p] > pool->n_free + pool->evictable) {
                free(many);
                return false; /* the policy is not even asked */
            }
            shortage[p] = need[p] > pool->n_free ? need[p] - pool->n_free : 0;
        }
        popped *list;
        uint32_t n_list;
        bool ok = plan_evictions(kv, shortage, index_get(&kv->index, id)->tenant, n, &list,
                                 &n_list);
        if (ok) evict_victims(kv, list, n_list);
        free(list);
        if (!ok) {
            free(many);
            return false;
        }
    }
    block *b = index_get(&kv->index, id);
    b->n_slots = (uint8_t)n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = dram_pool_take(&kv->pools[pools[i]]);
        if (n == 1) {
            b->sl.one.pool = (uint8_t)pools[0];
            b->sl.one.slot = slot;
        } else {
            many[2 * i] = pools[i];
            many[2 * i + 1] = slot;
        }
    }
    if (n > 1) b->sl.many = many;
    b->g2_state = G2_FILLING;
    tenants_dram_add(kv, b, n);
    return true;
}

void res_commit(kvcr_t *kv, block_id id, kvcr_op_handle origin, uint32_t origin_idx)
{
    block *b = index_get(&kv->index, id);
    b->g2_state = G2_READY;
    b->last_access_ns = kvcr_now_ns();
    if (kv->conf.policy->on_ingest) {
        kvcr_block_meta meta;
        res_meta(kv, id, 0, &meta);
        kv->conf.policy->on_ingest(kv->conf.policy_ud, &meta, KVCR_TIER_FW_G2);
    }
    batch_commit(kv, id, origin, origin_idx);
    recovery_put(kv, id);
    if (b->claims == 0) make_evictable(kv, id);
}

bool res_adopt(kvcr_t *kv, block_id id, uint32_t pool, uint32_t slot)
{
    block *b = index_get(&kv->index, id);
    b->n_slots = 1;
    b->sl.one.pool = (uint8_t)pool;
    b->sl.one.slot = slot;
    b->g2_state = G2_READY;
    if (!res_admit(kv, id, kv->pools[pool].block_size, KVCR_TIER_LOCAL_G2, false)) {
        b->n_slots = 0;
        b->g2_state = G2_NONE;
        return false;
    }
    tenants_dram_add(kv, b, 1);
    make_evictable(kv, id);
    return true;
}

void res_unfill(kvcr_t *kv, block_id id)
{
    give_slots(kv, index_get(&kv->index, id));
}

void res_access(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    b->access_count++;
    b->last_access_ns = kvcr_now_ns();
}

void res_align(kvcr_t *kv, const block_id *ids, uint32_t n, bool use_current_time)
{
    uint64_t t = use_current_time ? kvcr_now_ns() : 0;
    for (uint32_t i = 0; i < n && !use_current_time; i++) {
        const block *b = index_get(&kv->index, ids[i]);
        if (b->last_access_ns > t) t = b->last_access_ns;
    }
    if (t == 0) return; /* none was ever accessed: nothing to align to */
    /* Re-queued tail first: blocks of equal score leave the queue in the
     * order they entered it. A key listed twice is re-queued last where it
     * first stands, so that place counts. */
    for (uint32_t i = n; i-- > 0;) {
        block *b = index_get(&kv->index, ids[i]);
        b->last_access_ns = t;
        if (b->claims == 0 && (b->flags & (BF_IN_LIST | BF_IN_HEAP))) {
            unqueue(kv, ids[i]);
            make_evictable(kv, ids[i]);
        }
    }
}

void res_claim(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    if (b->claims++ == 0) unqueue(kv, id);
}

void res_unclaim(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    if (--b->claims > 0) return;
    if (b->flags & BF_RETIRE) {
        b->flags &= (uint8_t)~BF_RETIRE;
        res_queue_event(kv, KVCR_TIER_LOCAL_G2, true, &id, 1);
        remove_ready(kv, id);
        res_prune(kv, id);
    } else if (b->g2_state == G2_READY) {
        make_evictable(kv, id);
    }
}

void res_prune(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    if (b->g2_state == G2_NONE && b->fill == NULL && b->claims == 0 && b->lower.state == 0)
        index_remove(&kv->index, id);
}

/* ---- public claims: release handle -> block ---------------------------- */

static uint64_t claim_home(const claim_map *m, uint64_t h)
{
    return (h * 0x9E3779B97F4A7C15ull) & m->mask;
}

static void claim_place(claim_map *m, uint64_t h, block_id id)
{
    uint64_t i = claim_home(m, h);
    while (m->handle[i] != 0) i = (i + 1) & m->mask;
    m->handle[i] = h;
    m->block[i] = id;
    m->count++;
}

int res_reserve_claims(kvcr_t *kv, size_t n)
{
    claim_map *m = &kv->claims;
    uint64_t size = m->mask + 1;
    if (m->handle != NULL && (m->count + n) * 2 <= size) return 0;
    if (m->handle == NULL) size = 64;
    while ((m->count + n) * 2 > size) size *= 2;
    claim_map grown = {calloc(size, sizeof(uint64_t)), calloc(size, sizeof(block_id)), size - 1, 0};
    if (grown.handle == NULL || grown.block == NULL) {
        free(grown.handle);
        free(grown.block);
        return KVCR_ENOMEM;
    }
    for (uint64_t i = 0; m->handle && i <= m->mask; i++)
        if (m->handle[i] != 0) claim_place(&grown, m->handle[i], m->block[i]);
    free(m->handle);
    free(m->block);
    *m = grown;
    return 0;
}

kvcr_release_handle res_claim_public(kvcr_t *kv, block_id id)
{
    if (res_reserve_claims(kv, 1) != 0) return 0;
    kvcr_release_handle h = kv->next_release++;
    claim_place(&kv->claims, h, id);
    res_claim(kv, id);
    return h;
}

bool res_release_public(kvcr_t *kv, kvcr_release_handle h)
{
    claim_map *m = &kv->claims;
    if (h == 0 || m->handle == NULL) return false;
    uint64_t i = claim_home(m, h);
    while (m->handle[i] != h) {
        if (m->handle[i] == 0) return false;
        i = (i + 1) & m->mask;
    }
    block_id id = m->block[i];
    /* Backward-shift deletion, as in the block index. */
    uint64_t hole = i;
    for (uint64_t j = (hole + 1) & m->mask; m->handle[j] != 0; j = (j + 1) & m->mask) {
        uint64_t home = claim_home(m, m->handle[j]);
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            m->handle[hole] = m->handle[j];
            m->block[hole] = m->block[j];
            hole = j;
        }
    }
    m->handle[hole] = 0;
    m->count--;
    res_unclaim(kv, id);
    return true;
}

void res_destroy(kvcr_t *kv)
{
    free(kv->claims.handle);
    free(kv->claims.block);
    memset(&kv->claims, 0, sizeof kv->claims);
    free(kv->unscored);
    kv->unscored = NULL;
    free(kv->commits);
    kv->commits = NULL;
    while (kv->events_head) {
        pending_event *next = kv->events_head->next;
        free(kv->events_head);
        kv->events_head = next;
    }
    kv->events_tail = NULL;
    tenants_destroy(kv);
}
