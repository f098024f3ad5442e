/* The built-in policies: FIFO (every block scores the same, so ties — the
 * order of entering the evictable set — decide) and LRU (the score is the
 * last access time). The G3 variants arrive with the G3 tier. */
#include <float.h>
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
    .name = "fifo",
    .decide_ingest = keep_on_ingest,
    .eviction_score = fifo_score,
    .decide_eviction = drop_on_eviction,
};

static const kvcr_policy_ops lru_policy = {
    .name = "lru",
    .decide_ingest = keep_on_ingest,
    .eviction_score = lru_score,
    .decide_eviction = drop_on_eviction,
};

KVCR_API const kvcr_policy_ops *kvcr_policy_builtin(const char *name)
{
    if (name == NULL) return NULL;
    if (strcmp(name, "fifo") == 0) return &fifo_policy;
    if (strcmp(name, "lru") == 0) return &lru_policy;
    return NULL;
}
