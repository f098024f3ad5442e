/* kvcr/policy.h — the placement and eviction policy.
 *
 * A policy is a table of hooks plus a user pointer. KVCR calls the hooks on
 * the thread of the public call that needs a decision (deposit, fetch,
 * release, poll), with the instance's state lock held: a hook must not call
 * back into the same instance (such a call fails with KVCR_EBUSY) and must
 * not block. A hook that returns non-zero "failed": KVCR logs it and falls
 * back to a fixed rule for that hook (admit, keep the previous score,
 * keep the block, drop after a failed move). */
#ifndef KVCR_POLICY_H
#define KVCR_POLICY_H

#include "kvcr/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvcr_action {
    KVCR_ACTION_KEEP = 0,
    KVCR_ACTION_DROP,
    KVCR_ACTION_COPY_TO,
    KVCR_ACTION_MOVE_TO
} kvcr_action;

typedef struct kvcr_placement {
    kvcr_action action;
    kvcr_tier tier; /* the target of COPY_TO / MOVE_TO, else KVCR_TIER_NONE */
} kvcr_placement;

/* What a policy sees of a block. Valid only during the hook call. */
typedef struct kvcr_block_meta {
    kvcr_key key;
    uint64_t size_bytes;     /* all pool extents of the block together */
    uint64_t access_count;
    double last_access;      /* monotonic seconds; negative if never */
    unsigned resident_tiers; /* KVCR_TIER_BIT()s of FW_G2, LOCAL_G2, G3 */
    int64_t position;        /* -1 when never aligned */
} kvcr_block_meta;

typedef struct kvcr_placement_failure {
    kvcr_placement attempted;
    kvcr_tier source;
    const char *reason;
    uint32_t failure_count;
} kvcr_placement_failure;

/* The layout of kvcr_policy_ops this header declares. Like iVersion first
 * in sqlite3_vfs: a table says which version it is, later versions only
 * append hooks, and the library reads a hook only from tables whose
 * version has it (the arguments hooks receive, kvcr_block_meta and the
 * rest, are in that version's layout too). A table whose version the
 * library does not read (0, or newer than the library) is refused by
 * kvcr_create with KVCR_EINVAL. */
#define KVCR_POLICY_VERSION 1

typedef struct kvcr_policy_ops {
    uint32_t version;        /* first, in every version: KVCR_POLICY_VERSION */
    const char *name;
    unsigned required_tiers; /* KVCR_TIER_BIT()s that must be configured */

    /* Required. Only KEEP and DROP are honoured; DROP of required-local
     * work is overridden to KEEP. */
    int (*decide_ingest)(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                         bool required_local, kvcr_placement *out);
    /* Required. Lower scores are evicted first; ties go to the block that
     * entered the evictable set first. A non-finite score counts as failed. */
    int (*eviction_score)(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                          double *out);
    /* Required. KEEP skips the victim, DROP evicts it; MOVE_TO G3 is honoured
     * once the G3 tier is configured. */
    int (*decide_eviction)(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                           kvcr_placement *out);
    /* Optional. The block's first KVCR-managed residency became ready. */
    void (*on_ingest)(void *ud, const kvcr_block_meta *meta, kvcr_tier source);
    /* Optional. The block's last KVCR-managed residency went away. */
    void (*on_remove)(void *ud, const kvcr_block_meta *meta);
    /* Optional. A policy-requested move failed; only DROP is honoured. */
    int (*decide_recovery)(void *ud, const kvcr_block_meta *meta,
                           const kvcr_placement_failure *failure, kvcr_placement *out);
    /* Optional. Called once when the instance is freed. */
    void (*destroy)(void *ud);
} kvcr_policy_ops;

/* Built-in policies, by name: "fifo", "lru", and (with the
 * G3 tier) "g3_fifo", "g3_lru". NULL for an unknown name. The tables are
 * static, of this library's KVCR_POLICY_VERSION (a copy keeps that
 * version). */
const kvcr_policy_ops *kvcr_policy_builtin(const char *name);

#ifdef __cplusplus
}
#endif
#endif
