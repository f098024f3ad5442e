/* The core's loop over its lower tiers (core/lower.h). */
#include "core/lower.h"

int lower_add(kvcr_t *kv, const tier_ops *ops, tier *t)
{
    if (ops == NULL || ops->version != TIER_OPS_VERSION)
        return kvcr_fail(KVCR_EINVAL, "a tier's tier_ops must be version %d", TIER_OPS_VERSION);
    if (kv->n_tiers == KVCR_MAX_TIERS)
        return kvcr_fail(KVCR_ELIMIT,
                         "tier '%s' does not fit: an instance keeps at most %d lower tiers "
                         "(KVCR_MAX_TIERS)", ops->name, KVCR_MAX_TIERS);
    if (ops->spill && kv->spill_tier)
        return kvcr_fail(KVCR_EINVAL,
                         "tier '%s' takes spills but '%s' already does: a block keeps one "
                         "lower-tier residency", ops->name, kv->spill_tier->ops->name);
    uint32_t i = kv->n_tiers++;
    kv->tiers[i] = (tier_slot){ops, t};
    if (ops->spill) kv->spill_tier = &kv->tiers[i];
    tenants_tier_added(kv, i);
    return 0;
}

void lower_reads_begin(kvcr_t *kv, lower_reads *lr, const char *request_id, kvcr_op_handle op,
                       bool fetch, size_t max_keys, size_t max_refs)
{
    tier_batch_info info = {request_id, op, fetch, max_keys, max_refs};
    for (uint32_t t = 0; t < kv->n_tiers; t++)
        lr->batch[t] = kv->tiers[t].ops->begin(kv->tiers[t].t, &info);
}

int lower_reads_holder(kvcr_t *kv, lower_reads *lr, tier_block id, const uint8_t *key,
                       uint32_t key_len)
{
    for (uint32_t t = 0; t < kv->n_tiers; t++)
        if (lr->batch[t] && kv->tiers[t].ops->holds(kv->tiers[t].t, lr->batch[t], id, key, key_len))
            return (int)t;
    return -1;
}

void lower_reads_end(kvcr_t *kv, lower_reads *lr)
{
    for (uint32_t t = 0; t < kv->n_tiers; t++)
        if (lr->batch[t]) kv->tiers[t].ops->end(kv->tiers[t].t, lr->batch[t]);
}

int lower_layout_check(const kvcr_t *kv, const uint32_t *pools, uint32_t n_segs)
{
    const tier_slot *ts = kv->spill_tier;
    if (ts == NULL || ts->ops->layout_ok == NULL || ts->ops->layout_ok(ts->t, pools, n_segs))
        return 0;
    return kvcr_fail(KVCR_EINVAL, "%s does not support multi-block layouts", ts->ops->name);
}

bool lower_takes_spills(const kvcr_t *kv, kvcr_tier target)
{
    return kv->spill_tier != NULL && kv->spill_tier->ops->id == target;
}

void lower_stop(kvcr_t *kv)
{
    for (uint32_t t = kv->n_tiers; t-- > 0;) /* the peers first: disk reads land meanwhile */
        kv->tiers[t].ops->stop(kv->tiers[t].t);
}

void lower_close(kvcr_t *kv)
{
    for (uint32_t t = 0; t < kv->n_tiers; t++)
        if (kv->tiers[t].ops->close) kv->tiers[t].ops->close(kv->tiers[t].t);
}

void lower_run_callbacks(kvcr_t *kv)
{
    for (uint32_t t = 0; t < kv->n_tiers; t++)
        if (kv->tiers[t].ops->run_callbacks) kv->tiers[t].ops->run_callbacks(kv->tiers[t].t);
}

void lower_destroy(kvcr_t *kv)
{
    for (uint32_t t = kv->n_tiers; t-- > 0;)
        kv->tiers[t].ops->destroy(kv->tiers[t].t);
    kv->n_tiers = 0;
    kv->spill_tier = NULL;
}

void lower_gauges(kvcr_t *kv, gauge_sink *s)
{
    for (uint32_t t = kv->n_tiers; t-- > 0;) /* the peers' gauges first, as before the seam */
        kv->tiers[t].ops->gauges(kv->tiers[t].t, s);
}
