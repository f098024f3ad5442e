/* Settings read from the environment: the overrides the library documents
 * for comparisons and tuning (KVCR_INLINE_WRITE_MAX, KVCR_TCP_PUT_MIN,
 * KVCR_UCX_BATCH_BYTES, ...). */
#ifndef KVCR_UTIL_ENV_H
#define KVCR_UTIL_ENV_H

#include <stdint.h>

#include "util/log.h"

/* The byte count in environment variable `name`, at most max; dflt when it
 * is unset or empty, or when it is not such a count (then logged as a
 * warning on log). Any thread. */
uint64_t env_bytes(const kvcr_logger *log, const char *name, uint64_t max, uint64_t dflt);

#endif
