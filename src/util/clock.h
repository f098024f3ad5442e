/* Monotonic time. */
#ifndef KVCR_UTIL_CLOCK_H
#define KVCR_UTIL_CLOCK_H

#include <stdint.h>

uint64_t kvcr_now_ns(void);

static inline double kvcr_ns_to_s(uint64_t ns)
{
    return (double)ns / 1e9;
}

#endif
