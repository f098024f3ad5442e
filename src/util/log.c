#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvcr/error.h"

#include "util/api.h"
#include "util/clock.h"

static _Thread_local char last_error[512];

static kvcr_log_level level_from_env(void)
{
    const char *v = getenv("KVCR_LOG_LEVEL");
    if (v == NULL) return KVCR_LOG_WARN;
    if (strcasecmp(v, "error") == 0) return KVCR_LOG_ERROR;
    if (strcasecmp(v, "info") == 0) return KVCR_LOG_INFO;
    if (strcasecmp(v, "debug") == 0) return KVCR_LOG_DEBUG;
    return KVCR_LOG_WARN;
}

void kvcr_logger_init(kvcr_logger *lg, const char *agent,
                      void (*fn)(void *, kvcr_log_level, const char *), void *ud)
{
    lg->fn = fn;
    lg->ud = ud;
    lg->threshold = level_from_env();
    snprintf(lg->name, sizeof lg->name, "kvcr[%s]", agent ? agent : "?");
}

static const char *level_name(kvcr_log_level level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    return (unsigned)level < 4 ? names[level] : "?";
}

void kvcr_log(const kvcr_logger *lg, kvcr_log_level level, const char *fmt, ...)
{
    if (lg->fn == NULL && level > lg->threshold) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (lg->fn != NULL) {
        lg->fn(lg->ud, level, msg);
        return;
    }
    /* One fprintf per line so concurrent lines do not interleave. */
    fprintf(stderr, "%s %s: %s\n", lg->name, level_name(level), msg);
}

void kvcr_vlog_limited(const kvcr_logger *lg, kvcr_log_limit *lim, uint32_t interval_ms,
                       const char *fmt, va_list ap)
{
    uint64_t now = kvcr_now_ns();
    if (now < lim->next_ns) {
        lim->held++;
        return;
    }
    char msg[900];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (lim->held > 0)
        kvcr_log(lg, KVCR_LOG_WARN, "%s (%llu more like it not logged)", msg,
                 (unsigned long long)lim->held);
    else
        kvcr_log(lg, KVCR_LOG_WARN, "%s", msg);
    lim->held = 0;
    lim->next_ns = now + (uint64_t)interval_ms * 1000000u;
}

void kvcr_log_limited(const kvcr_logger *lg, kvcr_log_limit *lim, uint32_t interval_ms,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvcr_vlog_limited(lg, lim, interval_ms, fmt, ap);
    va_end(ap);
}

int kvcr_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return err;
}

KVCR_API const char *kvcr_last_error(void)
{
    return last_error;
}

KVCR_API const char *kvcr_strerror(int err)
{
    switch (err) {
    case KVCR_OK: return "success";
    case KVCR_EINVAL: return "invalid argument";
    case KVCR_ENOMEM: return "out of memory";
    case KVCR_ECLOSED: return "instance is closed";
    case KVCR_ENOTSUP: return "not supported";
    case KVCR_EBUSY: return "re-entrant call from a callback";
    case KVCR_ENOENT: return "no such object";
    case KVCR_ESYS: return "system call failed";
    case KVCR_EPROTO: return "protocol error";
    case KVCR_EREFUSED: return "refused by the KVCR service";
    case KVCR_ELIMIT: return "a configured limit is reached";
    case KVCR_EUNAVAIL: return "the KVCR service is not reachable";
    default: return "unknown error";
    }
}
