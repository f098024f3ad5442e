/* The instance: everything kvcr_t holds, shared by the core's sources. */
#ifndef KVCR_CORE_INSTANCE_H
#define KVCR_CORE_INSTANCE_H

#include <pthread.h>

#include "core/conf.h"
#include "core/copy.h"
#include "core/evictq.h"
#include "core/index.h"
#include "core/recovery.h"
#include "core/telemetry.h"
#include "core/tenants.h"
#include "core/tier.h"
#include "kvcr/kvcr.h"
#include "net/hint.h"
#include "core/local_dram.h"
#include "util/log.h"

enum op_kind { OP_DEPOSIT = 0, OP_DELIVER, OP_FETCH };

/* copy_job.kind: whose job it is. */
enum job_kind { JOB_FILL = 1, JOB_DELIVER };

/* What a pending entry waits for. WAIT_TRANSFER: a peer or the disk writes
 * the bytes; no deadline or abort can stop that, the transfer settles the
 * entry. */
enum entry_wait { WAIT_NONE = 0, WAIT_FILL, WAIT_COPY, WAIT_TRANSFER };

typedef struct op_rec op_rec;

typedef struct op_entry {
    block_id block;      /* the record it works on, while pending */
    uint8_t done;
    uint8_t wait;        /* enum entry_wait */
    uint8_t status;      /* kvcr_entry_status, once done */
    uint8_t reason;      /* kvcr_reason, once done */
    uint32_t key_off, key_len;
    uint32_t seg_off;    /* its layout: seg_pool/seg_piece[seg_off ..] */
    uint32_t n_segs;
    kvcr_release_handle rh;
    op_rec *w_next_op;       /* next waiter of the same fill */
    uint32_t w_next_idx;
    copy_job job;        /* a deliver's copy; owner = the op_rec */
} op_entry;

struct op_rec {
    kvcr_op_handle handle;
    uint8_t kind; /* enum op_kind */
    bool no_evict;
    bool expired; /* its deadline was handled */
    uint64_t start_ns, deadline_ns;
    uint32_t n, pending;
    op_entry *e;
    uint8_t *keys;            /* all keys, back to back */
    uint32_t *seg_piece;      /* per layout entry (and one past the last): its first
                               * framework piece in `pieces` (deposit, deliver) */
    mem_piece *pieces;        /* framework pieces of every layout entry, in order */
    uint32_t *seg_pool;       /* pool per layout entry */
    copy_seg *segs;           /* a deliver's copy segments, one per piece */
    kvcr_slot_ref *slot_refs; /* a fetch's result slots, n_segs per entry */
    op_rec *live_prev, *live_next; /* pending ops in deadline order */
    op_rec *done_next;             /* completed ops in completion order */
};

/* An in-flight fill of one block's G2 slots, shared by every entry that
 * waits for it (the deposit that started it and any later ones). Waiters
 * form a list through their entries. */
typedef struct fill {
    block_id block;
    bool external;       /* a peer or G3 fills it (never a copy job) */
    kvcr_op_handle origin;
    uint32_t origin_idx; /* the entry of `origin` that started it */
    op_rec *w_op;
    uint32_t w_idx;
    uint32_t n_w;
    copy_job job; /* owner = this fill */
    copy_seg segs[];
} fill;

/* One fill committed, waiting in the inventory batch of its operation. */
struct commit {
    uint32_t idx; /* entry index in the operation: the batch's key order */
    block_id block;
};

/* Queued for delivery outside the lock, in kvcr_poll(). */
typedef struct pending_event {
    struct pending_event *next;
    kvcr_inventory_event ev;
    kvcr_key keys_storage[];
} pending_event;

/* Release handle -> block, open addressing on the handle. */
typedef struct claim_map {
    uint64_t *handle; /* 0 = empty */
    block_id *block;
    uint64_t mask, count;
} claim_map;

struct kvcr {
    pthread_mutex_t lock;
    kvcr_conf conf;
    kvcr_logger log;
    dram_pool pools[KVCR_MAX_POOLS];
    block_index index;
    evictq evq;
    claim_map claims;
    copy_engine copier;
    int event_fd;
    kvcr_telemetry *telemetry;

    kvcr_op_handle next_op;
    kvcr_release_handle next_release;
    op_rec *live_head, *live_tail;
    op_rec *done_head, *done_tail;
    uint64_t n_live, n_done;

    /* Per tenant (core/tenants.h; 0: blocks without one): slots held and
     * the evictable queue of its blocks (tenant 0's is evq above). */
    tenant_use tenants[KVCR_MAX_TENANTS + 1];
    /* Calls whose hints named no configured tenant (their blocks took
     * none), and the limit of their warning; under the lock. */
    uint64_t hints_unknown_tenant;
    kvcr_log_limit unknown_tenant_warn;
    const admit_ctx *admit;  /* the deposit or fetch admitting entries now, or NULL */

    block_id *unscored;      /* blocks the policy failed to score */
    uint32_t n_unscored, cap_unscored;

    struct commit *commits;  /* the open inventory batch of fills committed */
    uint32_t n_commit, cap_commit;
    kvcr_op_handle commit_origin;

    hint_table hints;
    /* The lower tiers, in the order reads look for a key (G3 before the
     * peers: our own disk is cheaper than a pull), added by lower_add
     * (bounded by KVCR_MAX_TIERS). The core knows them only through their
     * tier_ops; a tier's place here keys its tenant counts. */
    tier_slot tiers[KVCR_MAX_TIERS];
    uint32_t n_tiers;
    const tier_slot *spill_tier;   /* the one that takes spills, or NULL */
    /* The API layer's handles for the calls only one tier serves (the
     * core never uses them). */
    struct remote *remote;   /* the peer-to-peer tier, NULL when off */
    struct g3_tier *g3;      /* the G3 tier, NULL when off */
    recovery_sink sink;       /* guard mode: where residencies are published */
    block_meta_hook meta_hook; /* the API layer's bytes of a block (router metadata) */
    struct svc_hold *hold;    /* guard mode: the claim, released at close */
    struct journal *journal;  /* guard mode: where the recovery sink publishes */
    int control_listener;     /* guard mode: adopted by the control channel; -1 */
    /* Who this instance is to peers, and the incarnations that answered on
     * its endpoint before and are gone for good (guard mode: the dead
     * owner, a stopped Guard backup): a peer probing a transfer of one of
     * them is told it is over. */
    uint8_t incarnation[KVCR_INC_LEN];
    uint8_t retired[KVCR_RETIRED_MAX][KVCR_INC_LEN];
    size_t n_retired;

    /* Whether inventory events are queued for kvcr_poll: someone takes
     * them (the inventory callback, the API layer's KV-event publisher).
     * Set before any thread runs. */
    bool inventory_on;
    struct api_events *kv_events; /* the API layer's publisher, NULL when off */
    pending_event *events_head, *events_tail;
    kvcr_capacity_need pressure[KVCR_MAX_POOLS];
    uint32_t n_pressure;

    struct log_line *log_head, *log_tail; /* written under the lock, not delivered yet */
    uint32_t n_log;
    uint64_t log_dropped;

    bool closed;
    bool polling;
};

/* The instance lock (core/instance.c). Unlocking delivers the log lines
 * queued while it was held, on the unlocking thread, after the unlock. */
void instance_lock(kvcr_t *kv);
void instance_unlock(kvcr_t *kv);
/* Whether this thread holds the instance's lock. */
bool instance_held_here(const kvcr_t *kv);
/* Sets up kv->log from the configuration: a log callback is never called
 * with the instance lock held. */
void instance_logger_init(kvcr_t *kv);

#endif
