/* The built-in policies: FIFO (every block scores the same, so ties — the
 * order of entering the evictable set — decide) and LRU (the score is the
 * last access time), and their G3 variants, which spill what KVCR DRAM
 * evicts to G3 instead of dropping it (and drop what G3 evicts).
 * tenant_lru is LRU with KVCR_POLICY_TENANT_QUOTAS: the core then takes
 * victims first from tenants over their quota (core/tenants.h). */
#include <float.h>
#include <stdbool.h>
#include <string.h>

#include "kvcr/policy.h"
#include "util/api.h"

static int keep_on_ingest(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                          bool required_local, kvcr_placement *out)
{
    (void)ud, (void)meta, (void)source, (void)required_local;
    out->action = KVCR_ACTION_KEEP;
    out->tier = KVCR_TIER_NONE;
    return 0;
}

static int drop_on_eviction(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                            kvcr_placement *out)
{
    (void)ud, (void)meta, (void)source;
    out->action = KVCR_ACTION_DROP;
    out->tier = KVCR_TIER_NONE;
    return 0;
}

static int spill_on_eviction(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                             kvcr_placement *out)
{
    (void)ud, (void)meta;
    bool from_dram = source == KVCR_TIER_LOCAL_G2;
    out->action = from_dram ? KVCR_ACTION_MOVE_TO : KVCR_ACTION_DROP;
    out->tier = from_dram ? KVCR_TIER_G3 : KVCR_TIER_NONE;
    return 0;
}

static int fifo_score(void *ud, const kvcr_block_meta *meta, kvcr_tier source, double *out)
{
    (void)ud, (void)meta, (void)source;
    *out = 0.0;
    return 0;
}

static int lru_score(void *ud, const kvcr_block_meta *meta, kvcr_tier source, double *out)
{
    (void)ud, (void)source;
    *out = meta->last_access >= 0 ? meta->last_access : -DBL_MAX;
    return 0;
}

static const kvcr_policy_ops fifo_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "fifo",
    .decide_ingest = keep_on_ingest,
    .eviction_score = fifo_score,
    .decide_eviction = drop_on_eviction,
};

static const kvcr_policy_ops lru_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "lru",
    .decide_ingest = keep_on_ingest,
    .eviction_score = lru_score,
    .decide_eviction = drop_on_eviction,
};

static const kvcr_policy_ops g3_fifo_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "g3_fifo",
    .required_tiers = KVCR_TIER_BIT(KVCR_TIER_G3),
    .decide_ingest = keep_on_ingest,
    .eviction_score = fifo_score,
    .decide_eviction = spill_on_eviction,
};

static const kvcr_policy_ops g3_lru_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "g3_lru",
    .required_tiers = KVCR_TIER_BIT(KVCR_TIER_G3),
    .decide_ingest = keep_on_ingest,
    .eviction_score = lru_score,
    .decide_eviction = spill_on_eviction,
};

static const kvcr_policy_ops tenant_lru_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "tenant_lru",
    .decide_ingest = keep_on_ingest,
    .eviction_score = lru_score,
    .decide_eviction = drop_on_eviction,
    .flags = KVCR_POLICY_TENANT_QUOTAS,
};

static const kvcr_policy_ops g3_tenant_lru_policy = {
    .version = KVCR_POLICY_VERSION,
    .name = "g3_tenant_lru",
    .required_tiers = KVCR_TIER_BIT(KVCR_TIER_G3),
    .decide_ingest = keep_on_ingest,
    .eviction_score = lru_score,
    .decide_eviction = spill_on_eviction,
    .flags = KVCR_POLICY_TENANT_QUOTAS,
};

KVCR_API const kvcr_policy_ops *kvcr_policy_builtin(const char *name)
{
    static const kvcr_policy_ops *const all[] = {&fifo_policy,       &lru_policy,
                                                 &g3_fifo_policy,    &g3_lru_policy,
                                                 &tenant_lru_policy, &g3_tenant_lru_policy};
    for (size_t i = 0; name != NULL && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}
