/* A lower tier in memory, for the tests of the tier seam (src/core/tier.h):
 * it keeps whole one-segment blocks by key, of its own (fake_tier_put, as
 * a peer would have them) or spilled to it by the core when it takes
 * spills (full: it evicts its oldest spilled block, tenants over their
 * quota of it first when the policy orders by quotas). Reads are settled
 * on the core's next progress, bytes copied; knobs make spills refuse,
 * reads fail, or reads wait until released. Every call the core makes is
 * appended to a trail shared by the fakes of one instance ("A.begin
 * B.holds ..."), so a test reads the order the core called its tiers in;
 * settle is written down only when it settles a read (the core calls it
 * on every poll).
 *
 * It uses core/tier.h and core/host.h alone, as a tier must: a test
 * links it with kvcr_internal and adds it with lower_add (core/lower.h)
 * before its first call. Locking: the tier_ops methods run on the core's
 * side of the lock as tier.h says; the knobs below take the instance lock
 * (host_lock) and may be called from the test's thread at any time. */
#ifndef KVCR_TEST_FAKE_TIER_H
#define KVCR_TEST_FAKE_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/tier.h"

typedef struct fake_trail {
    char text[8192];
} fake_trail;

typedef struct fake_tier fake_tier;

typedef struct fake_tier_opts {
    const char *name;   /* its tier_ops.name and its name in the trail */
    kvcr_tier id;       /* the tier it says it serves */
    bool spills;        /* takes spills (tier_ops.spill set) */
    uint32_t slots;     /* blocks it keeps, its own and spilled */
    fake_trail *trail;  /* shared by the fakes of one instance */
} fake_tier_opts;

/* NULL when out of memory. Freed by its destroy (lower_destroy at
 * kvcr_free), or by fake_tier_free when lower_add refused it. */
fake_tier *fake_tier_new(kvcr_t *kv, const fake_tier_opts *o);
void fake_tier_free(fake_tier *f);
const tier_ops *fake_tier_ops(const fake_tier *f);
tier *fake_tier_of(fake_tier *f);

/* A block of its own under key (len bytes): holds() says yes to it. */
void fake_tier_put(fake_tier *f, const char *key, const void *bytes, size_t len);
/* The bytes it keeps under key (its own or spilled), or NULL. */
const uint8_t *fake_tier_bytes(fake_tier *f, const char *key, size_t *len);
/* Reads wait (hold true) until released; released, the core is woken. */
void fake_tier_hold(fake_tier *f, bool hold);
/* The next n reads it settles fail (KVCR_REASON_TRANSFER_ERROR). */
void fake_tier_fail_reads(fake_tier *f, uint32_t n);
/* spill() refuses (the core runs the policy's recovery). */
void fake_tier_refuse_spills(fake_tier *f, bool refuse);
/* Reads accepted and not settled yet. */
uint32_t fake_tier_pending(fake_tier *f);

#endif
