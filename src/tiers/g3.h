/* The G3 tier, as the core sees it: KVCR-owned slot files on local disk
 * (net of the on-disk format, which is tiers/g3_store.h).
 *
 * Spills: when the policy evicts a block from KVCR DRAM with MOVE_TO or
 * COPY_TO G3, its bytes are copied into a staging buffer (so the DRAM slots
 * are free at once and allocation never waits for a disk) and written to a
 * G3 slot; the block is G3_STORING until the write lands, then G3_READY.
 * Staging memory is bounded (max_staging_bytes): past it a spill fails and
 * the policy's decide_recovery runs (only DROP exists). Staging buffers are
 * kept for the next spill once allocated (huge pages advised for 2 MiB
 * blocks), so a spill's copy never waits on page faults. The I/O thread
 * hands every spill it finds queued to the store at once: their writes go
 * out together and their checksums are computed while the disk writes.
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
 * The tier reaches the core only through core/host.h. */
#ifndef KVCR_TIERS_G3_H
#define KVCR_TIERS_G3_H

#include "core/tier.h"

typedef struct g3_tier g3_tier;

/* The tier's methods (core/tier.h): spills, reads, settling, gauges. */
extern const tier_ops g3_tier_ops;

/* Opens the files, rebuilds the index from them (warm restart), starts the
 * I/O thread. Unlocked, from kvcr_create, before any other thread runs.
 * On failure nothing is left open. */
int g3_start(kvcr_t *kv, g3_tier **out);
tier *g3_tier_of(g3_tier *t);

/* Test interface: the next n I/O completions report -err (the I/O itself
 * happens); requests held in the I/O thread's queue. Any thread. */
void g3_test_fail_next(g3_tier *t, unsigned n, int err);
void g3_test_hold(g3_tier *t, bool hold);

#endif
