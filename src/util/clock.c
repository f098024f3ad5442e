#include "util/clock.h"

#include <stdatomic.h>
#include <time.h>

#include "kvcr/testing.h"

/* The test clock (kvcr/testing.h): while frozen_at is not 0 the clock
 * reads it; while running it reads CLOCK_MONOTONIC plus offset, the time
 * that tests advanced by or that was frozen beyond the real clock, so that
 * it never goes back. */
static _Atomic uint64_t frozen_at;
static _Atomic uint64_t offset;

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Any thread, lock-free. */
uint64_t kvcr_now_ns(void)
{
    uint64_t f = atomic_load_explicit(&frozen_at, memory_order_acquire);
    if (f != 0) return f;
    return monotonic_ns() + atomic_load_explicit(&offset, memory_order_acquire);
}

/* The test clock's controls: one thread at a time (kvcr/testing.h). */
uint64_t kvcr__test_clock_freeze(void)
{
    uint64_t now = kvcr_now_ns();
    atomic_store_explicit(&frozen_at, now, memory_order_release);
    return now;
}

uint64_t kvcr__test_clock_advance(uint64_t ns)
{
    if (atomic_load_explicit(&frozen_at, memory_order_acquire) != 0)
        return atomic_fetch_add_explicit(&frozen_at, ns, memory_order_acq_rel) + ns;
    atomic_fetch_add_explicit(&offset, ns, memory_order_acq_rel);
    return kvcr_now_ns();
}

void kvcr__test_clock_run(void)
{
    uint64_t f = atomic_load_explicit(&frozen_at, memory_order_acquire);
    if (f == 0) return;
    /* The offset first: a reader that still sees frozen_at reads f, one
     * that sees it cleared reads at least f. */
    uint64_t real = monotonic_ns();
    atomic_store_explicit(&offset, f > real ? f - real : 0, memory_order_release);
    atomic_store_explicit(&frozen_at, 0, memory_order_release);
}
