/* kvcr/types.h — value types shared by the whole API. */
#ifndef KVCR_TYPES_H
#define KVCR_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Keys are opaque byte strings compared bytewise. */
#define KVCR_KEY_MAX 1024

typedef struct kvcr_key {
    const uint8_t *data;
    size_t len; /* 1 .. KVCR_KEY_MAX */
} kvcr_key;

/* Cache tiers. The string forms (kvcr_tier_name) are the values the
 * Python package and the router's events use. */
typedef enum kvcr_tier {
    KVCR_TIER_NONE = 0,
    KVCR_TIER_FW_G1,     /* "HBM": framework GPU memory */
    KVCR_TIER_FW_G2,     /* "FW_DRAM": framework host memory */
    KVCR_TIER_LOCAL_G2,  /* "DRAM": KVCR-owned host DRAM */
    KVCR_TIER_REMOTE_G2, /* "REMOTE_G2": a peer's memory, through a hint */
    KVCR_TIER_G3         /* "G3": KVCR-owned local disk */
} kvcr_tier;

#define KVCR_TIER_BIT(t) (1u << (unsigned)(t))

const char *kvcr_tier_name(kvcr_tier tier); /* "DRAM", "G3", ... or "": static */

typedef enum kvcr_query_status {
    KVCR_QUERY_MISS = 0,
    KVCR_QUERY_HIT,       /* READY in KVCR DRAM */
    KVCR_QUERY_FETCHING,  /* being filled into KVCR DRAM (tier LOCAL_G2), or evicted
                           * from it while its spill is written (tier G3) */
    KVCR_QUERY_FETCHABLE  /* a lower tier or a hinted peer has it */
} kvcr_query_status;

typedef struct kvcr_query_result {
    kvcr_query_status status;
    kvcr_tier tier; /* KVCR_TIER_NONE on a miss */
} kvcr_query_result;

/* "HIT", "MISS", ...: static strings, as every *_name function returns. */
const char *kvcr_query_status_name(kvcr_query_status status);

/* Framework memory: a registered region of equal elements. */
typedef enum kvcr_mem_type {
    KVCR_MEM_DRAM = 0,
    KVCR_MEM_VRAM
} kvcr_mem_type;

typedef struct kvcr_region {
    void *addr;          /* base address, non-NULL */
    size_t element_size; /* bytes per element (one block's span in one pool) */
    size_t count;        /* number of elements, >= 1 */
    size_t stride;       /* bytes between elements; 0 means element_size */
    const char *label;   /* the pool this region's elements belong to: its name (each
                          * element one whole block), or "pool:part" (each element one
                          * part of a block: the pool's parts, in registration order,
                          * have one count and add up to its block size, and no whole
                          * region of the pool is registered beside them) */
    kvcr_mem_type mem_type;
    int device_id;       /* >= 0 */
} kvcr_region;

/* A reference to one element of a registered region: the seed's MemoryRef.
 * end_point names the instance that owns the memory; NULL or "" means this
 * instance. label selects the region, index the element within it; for a
 * pool held in parts, "pool:*" selects element `index` of every part (one
 * block: gathered into one KVCR slot, scattered back, written by peers
 * piece by piece). */
typedef struct kvcr_mem_ref {
    const char *end_point;
    const char *label;
    uint64_t index;
} kvcr_mem_ref;

/* One block of a deposit or deliver: its key and one reference per layout
 * entry (the labels, in order, are the block's layout of pools). */
typedef struct kvcr_block {
    kvcr_key key;
    const kvcr_mem_ref *refs;
    size_t n_refs;
} kvcr_block;

typedef uint64_t kvcr_op_handle;
typedef uint64_t kvcr_release_handle; /* 0 means "no handle" */

/* Per-entry result of an operation. */
typedef enum kvcr_entry_status {
    KVCR_ENTRY_SUCCESS = 0,
    KVCR_ENTRY_DROPPED, /* the policy declined an optional admission */
    KVCR_ENTRY_FAILED
} kvcr_entry_status;

typedef enum kvcr_reason {
    KVCR_REASON_NONE = 0,
    KVCR_REASON_TIMEOUT,         /* the operation deadline passed */
    KVCR_REASON_ABORTED,         /* kvcr_abort() cancelled the entry */
    KVCR_REASON_NO_CAPACITY,     /* no slot could be had */
    KVCR_REASON_NOT_FOUND,       /* no tier holds the block */
    KVCR_REASON_TRANSFER_ERROR,  /* the copy or transfer failed */
    KVCR_REASON_LAYOUT_MISMATCH, /* resident with another layout of pools */
    KVCR_REASON_DISCARDING,      /* the residency is being discarded */
    KVCR_REASON_NO_LOCAL_DRAM,   /* the operation needs KVCR DRAM */
    KVCR_REASON_CLOSED,          /* the instance closed first */
    KVCR_REASON_POLICY,          /* the policy declined a required admission */
    KVCR_REASON_CORRUPT,         /* a stored block failed its checksum or key check */
    KVCR_REASON_SOURCE_BUSY      /* the peer refused the pull at one of its limits
                                  * (kvcr_limits): nothing was written */
} kvcr_reason;

const char *kvcr_entry_status_name(kvcr_entry_status status);
const char *kvcr_reason_name(kvcr_reason reason);

/* A KVCR-owned DRAM location handed out by a successful fetch. */
typedef struct kvcr_slot_ref {
    uint32_t pool;  /* index into the configured pool layouts */
    uint64_t slot;  /* slot index within the pool (the element index) */
    void *addr;     /* pool base + slot * block size */
    size_t size;    /* the pool's block size */
} kvcr_slot_ref;

typedef struct kvcr_entry_result {
    kvcr_key key;
    kvcr_entry_status status;
    kvcr_reason reason;                 /* KVCR_REASON_NONE on success */
    kvcr_release_handle release_handle; /* fetch, no_evict deposit */
    const kvcr_slot_ref *slots;         /* fetch success: layout order */
    size_t n_slots;
} kvcr_entry_result;

typedef struct kvcr_op_result {
    kvcr_op_handle op;
    size_t n_entries;
    const kvcr_entry_result *entries; /* request order (fetch: deduplicated) */
} kvcr_op_result;

/* Inventory: KVCR-owned residencies that appeared or went away. */
typedef struct kvcr_inventory_event {
    kvcr_tier tier;
    bool removed;
    size_t n_keys;
    const kvcr_key *keys;
} kvcr_inventory_event;

/* Capacity pressure: a pool whose reclaimable slots fell below its
 * watermark. */
typedef struct kvcr_capacity_need {
    const char *pool;
    uint64_t slots; /* the pool's watermark, in slots */
} kvcr_capacity_need;

typedef enum kvcr_log_level {
    KVCR_LOG_ERROR = 0,
    KVCR_LOG_WARN,
    KVCR_LOG_INFO,
    KVCR_LOG_DEBUG
} kvcr_log_level;

#ifdef __cplusplus
}
#endif
#endif
