/* A Guard: the KVCR service's keeper of one pool group.
 *
 * Phases:
 *   IDLE     nobody holds the group; the mirror holds what the last owner
 *            committed (after a clean release) or nothing.
 *   PRIMARY  an engine holds it (its lease is its pidfd). The Guard reads
 *            the recovery journal as the engine writes it, keeping the
 *            mirror current.
 *   SERVING  the owner died: the Guard runs a backup KVCR instance over the
 *            pool, on the owner's control endpoint, that serves the
 *            mirrored blocks to peers and never writes the pool.
 *   FAILED   something the Guard cannot vouch for happened; claims are
 *            refused with the reason.
 * A claim while SERVING stops the backup instance first (handback), then
 * compacts the mirror into a freshly formatted journal, from which the new
 * owner learns what it recovers. Two owners never hold a group: a claim
 * while PRIMARY is refused unless the holder's pidfd says it exited. */
#ifndef KVCR_SERVICE_GUARD_H
#define KVCR_SERVICE_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "client/frame.h"
#include "util/log.h"

typedef struct guard guard;

/* What every Guard of a service shares. */
typedef struct guard_terms {
    const char *pool_dir;
    const char *digest;
    uint32_t n_pools;
    uint64_t pool_bytes[KVCR_MAX_POOLS]; /* page multiples */
    uint64_t journal_bytes;
    const kvcr_logger *log;
} guard_terms;

/* Creates the group's pool file and formats its journal. */
int guard_create(const guard_terms *t, uint32_t index, guard **out);

/* Stops serving, closes the lease, removes the pool file. */
void guard_destroy(guard *g);

/* A claim from a process whose liveness is pidfd (taken over, closed on
 * refusal). On success fills *grant and fds (the pool file, then the
 * control listener when the claim asked for an endpoint; the caller closes
 * its copies after sending), and *lease identifies the lease. On refusal a
 * negative KVCR_E* with kvcr_last_error() saying why. */
int guard_claim(guard *g, const svc_msg *claim, int pidfd, svc_msg *grant, int *fds,
                size_t *n_fds, uint64_t *lease);

/* The owner of lease releases the group (a stale lease: no-op, returns 0). */
int guard_release(guard *g, uint64_t lease, bool activated);

/* The lease's pidfd while PRIMARY (the service loop polls it), and the
 * backup instance's event fd while SERVING; -1 otherwise. The loop wakes
 * every 2 ms while either exists (journal frames have no fd to wake it). */
int guard_pidfd(const guard *g);
int guard_backup_fd(const guard *g);

/* The holder's pidfd is readable: it exited. Promotes. */
void guard_on_death(guard *g);

/* Periodic work: read journal frames (PRIMARY), poll the backup instance
 * (SERVING). Returns true when frames are still waiting. */
bool guard_tick(guard *g);

/* What the service's metrics report about a Guard. */
typedef struct guard_figures {
    unsigned phase; /* the current phase: guard_phase_name(phase) */
    uint64_t claims, refusals, promotions, handbacks, recovery_lost;
    uint64_t mirrored_blocks; /* committed blocks a promotion would serve now */
    uint64_t pool_bytes;      /* the group's mapping: journal and pools */
    double last_promotion_s;  /* from the owner's death to serving, the last time */
} guard_figures;

void guard_get_figures(const guard *g, guard_figures *out);

/* The name of phase i ("idle", "primary", "serving", "failed"); NULL past
 * the last, so that a caller can list them all. */
const char *guard_phase_name(unsigned i);

#endif
