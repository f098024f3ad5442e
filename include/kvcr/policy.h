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
    /* policy version 2: the block's tenant (config.tenants) and how many
     * slots that tenant holds and keeps under pressure (its quota), in
     * KVCR DRAM and in G3. NULL and zeros for a block without a tenant;
     * blocks without a tenant together have a quota of 0. */
    const char *tenant;
    uint64_t tenant_dram_slots, tenant_dram_quota;
    uint64_t tenant_g3_slots, tenant_g3_quota;
} kvcr_block_meta;

/* What the caller told KVCR about the work that makes a residency
 * (policy version 2: decide_ingest_hints). Both are JSON text, NUL-
 * terminated, valid only during the hook call:
 *   framework: the hints given to the operation itself (kvcr_deposit_ex,
 *     kvcr_fetch_ex), a JSON object the library checked strictly (at most
 *     limits.max_hint_bytes; a "tenant" member, if any, is a string naming
 *     a configured tenant); NULL when the call gave none.
 *   router: the router's kv_hint kept for the operation's request_id
 *     (kvcr_submit_hint), as submitted; NULL when the operation has no
 *     request_id or no hint is kept for it.
 * A deposit's admission sees its framework hints (source FW_G2,
 * required_local = KVCR_NO_EVICT); a fetch's fills (source G3 or
 * REMOTE_G2, required_local true) see the fetch's framework hints and the
 * router hint of its request. A deliver is admitted only when it stages a
 * block in parts through KVCR DRAM (read from a tier that cannot scatter,
 * G3): with its request's router hint and no framework hints. */
typedef struct kvcr_hints {
    const char *framework;
    size_t framework_len;
    const char *router;
    size_t router_len;
} kvcr_hints;

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
#define KVCR_POLICY_VERSION 2

/* kvcr_policy_ops.flags (version 2). KVCR_POLICY_TENANT_QUOTAS: when
 * KVCR DRAM or G3 must make room, victims come first from tenants over
 * their quota in that tier (config.tenants; the tenant being made room for
 * counts the slots it asks for, and blocks without a tenant have a quota
 * of 0), least recent (lowest score) first; only when none of those can
 * give does eviction fall back to the plain score order. */
#define KVCR_POLICY_TENANT_QUOTAS 0x1u

typedef struct kvcr_policy_ops {
    uint32_t version;        /* first, in every version: KVCR_POLICY_VERSION */
    const char *name;
    unsigned required_tiers; /* KVCR_TIER_BIT()s that must be configured */

    /* Required (version 2: unless decide_ingest_hints is set). Only KEEP
     * and DROP are honoured; DROP of required-local work is overridden to
     * KEEP. */
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

    /* ---- version 2 ---- */
    uint32_t flags; /* KVCR_POLICY_TENANT_QUOTAS */
    /* Optional: decide_ingest with the hints of the call (kvcr_hints).
     * When set it is called instead of decide_ingest (which may then be
     * NULL), with the same rules. */
    int (*decide_ingest_hints)(void *ud, const kvcr_block_meta *meta, kvcr_tier source,
                               bool required_local, const kvcr_hints *hints,
                               kvcr_placement *out);
} kvcr_policy_ops;

/* Built-in policies, by name: "fifo", "lru", "tenant_lru" (LRU with
 * KVCR_POLICY_TENANT_QUOTAS), and (with the G3 tier) "g3_fifo", "g3_lru",
 * "g3_tenant_lru" (the same, spilling to G3). NULL for an unknown name. The tables are
 * static, of this library's KVCR_POLICY_VERSION (a copy keeps that
 * version). */
const kvcr_policy_ops *kvcr_policy_builtin(const char *name);

#ifdef __cplusplus
}
#endif
#endif
