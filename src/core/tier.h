/* The lower-tier seam: what the core asks of a tier that holds blocks
 * outside KVCR DRAM (G3 on local disk, REMOTE_G2 on peers).
 *
 * The core knows tiers only through this table. It calls them in its
 * configured order (G3 before the peers: a block on our own disk is
 * cheaper than a pull) and never by name. A tier answers through
 * core/host.h alone and never takes the instance lock inside a method the
 * core called with it held (methods say which side of the lock they run
 * on). This is the contract nng's transports keep with their socket: the
 * layer below never re-enters the layer above while it is being called.
 *
 * Reads: for each operation (and for a query) the core opens a batch with
 * begin(), asks holds() for every key it lacks in KVCR DRAM, hands the
 * keys it wants read() with a completion token and their destinations, and
 * closes the batch with end(). A tier settles every token it accepted,
 * exactly once, through host_settle() (or host_discard() first for a
 * fetch whose deadline passed while the bytes may still land). */
#ifndef KVCR_CORE_TIER_H
#define KVCR_CORE_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/conf.h"
#include "kvcr/kvcr.h"

/* A block record of the core's index; BLOCK_NONE when there is none. */
typedef uint32_t tier_block;
#define TIER_BLOCK_NONE UINT32_MAX

/* Who to settle when a read ends: an operation's entry, or the fill of
 * KVCR slots a fetch (and the entries waiting on it) shares. Opaque to the
 * tier; copied by value. */
typedef struct tier_token {
    void *owner;
    uint32_t idx;
} tier_token;

/* One destination segment of a read: `len` bytes at `addr`, and the same
 * place as a reference peers understand (a framework region label and
 * element index, or a KVCR pool name and slot). A framework block in parts
 * (core/conf.h) has no single address: addr is NULL, the label "pool:*",
 * and only a tier that scatters (tier_ops.scatters) is given it. */
typedef struct tier_dst {
    uint8_t *addr;
    size_t len;
    uint32_t pool;       /* the pool of the segment's layout */
    bool framework;      /* framework memory (deliver) or a KVCR slot (fetch) */
    const char *label;   /* region label or pool name (owned by the configuration) */
    uint64_t index;      /* element index in the region, or slot in the pool */
} tier_dst;

typedef struct tier_read {
    tier_token token;
    tier_block block;    /* the core's record of the key, or TIER_BLOCK_NONE */
    const uint8_t *key;
    uint32_t key_len;
    bool fetch;          /* into KVCR slots the core reserved; else framework memory */
    uint32_t n_dst;
    const tier_dst *dst;
    const kvcr_mem_ref *refs; /* deliver: the caller's references, as given */
} tier_read;

/* The block record's lower-tier state, owned by the tier that keeps the
 * block below KVCR DRAM (one tier at most: the one that takes spills).
 * state 0 = none; LOWER_READY marks it readable (the policy sees the
 * tier in the block's residencies); the other bits, busy and slot are the
 * tier's. */
#define LOWER_READY 0x80u
typedef struct tier_lower {
    uint8_t state;
    uint16_t busy;
    uint32_t slot;
} tier_lower;

/* What a batch is for. */
typedef struct tier_batch_info {
    const char *request_id; /* NULL: none */
    kvcr_op_handle op;      /* 0 for a query */
    bool fetch;
    size_t max_keys, max_refs; /* bounds of the reads to come (0 for a query) */
} tier_batch_info;

typedef struct tier tier;             /* a tier's own state */
typedef struct tier_batch tier_batch; /* a tier's state for one batch */

/* A growable list of gauges (name, pool label, value); the tier appends. */
typedef struct gauge_sink gauge_sink;
void gauge_sink_add(gauge_sink *s, const char *pool, const char *name, double value);

#define TIER_OPS_VERSION 1

typedef struct tier_ops {
    int version;       /* TIER_OPS_VERSION */
    const char *name;  /* for logs */
    kvcr_tier id;      /* the tier it serves: G3 or REMOTE_G2 */

    /* Unlocked, at close after kv is marked closed: lets transfers in
     * flight end (bounded) and stops the tier's threads. */
    void (*stop)(tier *t);
    /* Locked, at close after the last settle: gives back what it still
     * holds of the framework's (pins). May be NULL. */
    void (*close)(tier *t);
    /* Unlocked, the instance is going away: frees the tier. */
    void (*destroy)(tier *t);

    /* Locked, from the core's progress (every poll): settles what the
     * tier's threads finished. */
    void (*settle)(tier *t);
    /* Unlocked, on the polling thread: runs framework callbacks the tier
     * queued while settling. May be NULL. */
    void (*run_callbacks)(tier *t);
    /* Locked: the tier's gauges. */
    void (*gauges)(tier *t, gauge_sink *s);

    /* Locked. A batch of reads (or a query). NULL: the tier has nothing
     * for this request (holds() and read() are not called). */
    tier_batch *(*begin)(tier *t, const tier_batch_info *info);
    /* Locked. Whether the tier can produce the key for this batch. */
    bool (*holds)(tier *t, tier_batch *b, tier_block id, const uint8_t *key, uint32_t key_len);
    /* Locked. Starts the read of a key holds() accepted. KVCR_REASON_NONE:
     * the token is the tier's to settle; any other reason: the entry fails
     * with it at once and the tier keeps nothing of it. */
    kvcr_reason (*read)(tier *t, tier_batch *b, const tier_read *rd);
    /* Locked. Closes the batch: submits what read() collected. */
    void (*end)(tier *t, tier_batch *b);

    /* Locked. Takes a READY KVCR DRAM block the policy evicts to this tier
     * (before its slots are given back). False: it could not (logged; the
     * core runs the policy's recovery). NULL: the tier takes no spills. */
    bool (*spill)(tier *t, tier_block id);
    /* Whether a layout of n_segs segments of these pools can be kept by
     * this tier (G3 keeps one slot of the first pool). NULL: any. */
    bool (*layout_ok)(const tier *t, const uint32_t *pools, uint32_t n_segs);
    /* Whether the tier writes a deliver's destination from its reference
     * (label, index), so a framework block in parts lands piece by piece.
     * False: the core reads such a block into KVCR DRAM first and copies it
     * out from there. */
    bool scatters;
} tier_ops;

/* The most lower tiers an instance keeps (core/lower.c lower_add refuses
 * one more): G3 and the peers today, with room for a third (the tests
 * register one, tests/support/fake_tier.h). */
#define KVCR_MAX_TIERS 4

/* A tier as the instance keeps it. */
typedef struct tier_slot {
    const tier_ops *ops;
    tier *t;
} tier_slot;

#endif
