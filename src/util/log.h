/* Logging and the per-thread last-error message. */
#ifndef KVCR_UTIL_LOG_H
#define KVCR_UTIL_LOG_H

#include <stdarg.h>

#include "kvcr/types.h"
#include "util/api.h"

/* libkvcr exports the functions below (as kvcr__logger_init, kvcr__log,
 * kvcr__log_limited, kvcr__fail): the daemon library and the `kvcr` tool,
 * linked against the shared library, log and fail through the library's
 * own copy, so one per-thread message answers kvcr_last_error() whichever
 * side failed. */

typedef struct kvcr_logger {
    void (*fn)(void *ud, kvcr_log_level level, const char *message);
    void *ud;
    kvcr_log_level threshold; /* for the default stderr sink */
    char name[64];            /* "kvcr[<agent>]" */
} kvcr_logger;

/* Sets up a logger; fn NULL means stderr at the KVCR_LOG_LEVEL threshold. */
void kvcr_logger_init(kvcr_logger *lg, const char *agent,
                      void (*fn)(void *, kvcr_log_level, const char *), void *ud)
    KVCR_INTERNAL(logger_init);

void kvcr_log(const kvcr_logger *lg, kvcr_log_level level, const char *fmt, ...)
    KVCR_INTERNAL(log) __attribute__((format(printf, 3, 4)));

/* A warning that a peer can make repeat without bound (a refused
 * connection): logged the first time, then at most once per interval_ms
 * with the number held back meanwhile, so that no peer can flood the log. */
typedef struct kvcr_log_limit {
    uint64_t next_ns; /* nothing is logged before then */
    uint64_t held;    /* warnings not logged since the last one */
} kvcr_log_limit;

void kvcr_log_limited(const kvcr_logger *lg, kvcr_log_limit *lim, uint32_t interval_ms,
                      const char *fmt, ...) KVCR_INTERNAL(log_limited)
    __attribute__((format(printf, 4, 5)));
/* The same with a va_list, for a caller that counts and logs one event of
 * several kinds (one limit each) in one function; libkvcr's own. */
void kvcr_vlog_limited(const kvcr_logger *lg, kvcr_log_limit *lim, uint32_t interval_ms,
                       const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

/* Records a message for kvcr_last_error() and returns err, so that a
 * validation reads: return kvcr_fail(KVCR_EINVAL, "x must be positive"); */
int kvcr_fail(int err, const char *fmt, ...) KVCR_INTERNAL(fail)
    __attribute__((format(printf, 2, 3)));

#endif
