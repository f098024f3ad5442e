/* The G3 tier, as the core sees it: KVCR-owned slot files on local disk
 * (net of the on-disk format, which is tiers/g3_store.h).
 *
 * Spills: when the policy evicts a block from KVCR DRAM with MOVE_TO or
 * COPY_TO G3, its bytes are copied into a staging buffer (so the DRAM slots
 * are free at once and allocation never waits for a disk) and written to a
 * G3 slot; the block is G3_STORING until the write lands, then G3_READY.
 * Staging memory is bounded (max_staging_bytes): past it a spill fails and
 * the policy's decide_recovery runs (only DROP exists).
 *
 * Reads: fetch reads a READY slot back into KVCR DRAM slots, deliver
 * straight into framework memory. Each read claims the slot (no eviction
 * under it) and verifies key and checksum: a slot that does not verify is a
 * miss (KVCR_REASON_CORRUPT), its slot retired, an inventory removal sent.
 * (A deliver reads straight into the framework's block, so after a
 * CORRUPT entry that block holds unverified bytes: the entry is FAILED and
 * the block must be treated as not loaded, as after any failed transfer.)
 *
 * One I/O thread owns the store (io_uring); requests and completions cross
 * over through two lists, completions signalled on the instance eventfd.
 * Everything here runs with the instance lock held unless it says
 * otherwise. */
#ifndef KVCR_TIERS_G3_H
#define KVCR_TIERS_G3_H

#include "core/instance.h"

typedef struct g3_tier g3_tier;

/* Opens the files, rebuilds the index from them (warm restart), starts the
 * I/O thread. Unlocked, from kvcr_create. */
int g3_start(kvcr_t *kv);
/* Waits for the I/O in flight, stops the thread, closes the files.
 * Unlocked, from kvcr_close; settle with g3_settle afterwards. */
void g3_stop(kvcr_t *kv);
void g3_destroy(kvcr_t *kv);

/* Eviction of a READY G2 block the policy sent to G3 (before its DRAM
 * slots are given back). False: the spill failed (logged; the caller
 * drops the block). */
bool g3_spill(kvcr_t *kv, block_id id);

/* A G3 read for a fetch's fill (dst: the fill's single DRAM slot) or a
 * deliver entry (dst: framework memory). 0, or a reason the entry fails
 * with at once. */
kvcr_reason g3_read_fill(kvcr_t *kv, block_id id, struct fill *f, void *dst);
kvcr_reason g3_read_deliver(kvcr_t *kv, block_id id, op_rec *o, uint32_t idx, void *dst);

/* Completions: spills committed or rolled back, reads settled. */
void g3_settle(kvcr_t *kv);

/* Gauges. */
void g3_gauges(const kvcr_t *kv, double *total, double *free_, double *evictable,
               double *pending);

#endif
