/* Waking a thread that sleeps in poll() on an eventfd. */
#ifndef KVCR_UTIL_EVENT_H
#define KVCR_UTIL_EVENT_H

#include <stdint.h>
#include <unistd.h>

/* Makes the eventfd readable. A saturated counter still leaves it readable,
 * which is all a waiter needs, so the result is not checked. */
static inline void event_signal(int fd)
{
    uint64_t one = 1;
    ssize_t rc = write(fd, &one, sizeof one);
    (void)rc;
}

#endif
