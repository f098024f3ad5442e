/* Monotonic time: the one clock of the library's deadlines, timers and
 * durations. It reads CLOCK_MONOTONIC unless a test froze or advanced it
 * (kvcr__test_clock_* in kvcr/testing.h, defined in clock.c). */
#ifndef KVCR_UTIL_CLOCK_H
#define KVCR_UTIL_CLOCK_H

#include <stdint.h>

#include "util/api.h"

/* Exported as kvcr__now_ns, like the logging functions (util/log.h). */
uint64_t kvcr_now_ns(void) KVCR_INTERNAL(now_ns);

static inline double kvcr_ns_to_s(uint64_t ns)
{
    return (double)ns / 1e9;
}

#endif
