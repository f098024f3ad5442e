/* Waiting on the instance's fd (kvcr_fd) instead of sleeping: a unit test
 * that polls until the library reaches a state (an operation completed, a
 * spill landed) sleeps here between two looks, and wakes as soon as a copy,
 * an operation or a tier's I/O completes. The bound is real time
 * (CLOCK_MONOTONIC, not the library's clock, which a test may freeze). */
#ifndef KVCR_TESTS_FD_WAIT_H
#define KVCR_TESTS_FD_WAIT_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "kvcr/kvcr.h"

/* Real milliseconds, for the bound of a wait. */
static inline uint64_t fd_wait_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Sleeps until kvcr_fd is readable (kvcr_poll has work) or the real time
 * until_ms; false once until_ms has passed. The caller calls kvcr_poll and
 * looks again: kvcr_poll drains the fd before it collects, so a completion
 * between the look and this wait leaves the fd readable. */
static inline bool fd_wait(kvcr_t *kv, uint64_t until_ms)
{
    uint64_t now = fd_wait_now_ms();
    if (now >= until_ms) return false;
    struct pollfd p = {kvcr_fd(kv), POLLIN, 0};
    (void)poll(&p, 1, (int)(until_ms - now));
    return true;
}

#endif
