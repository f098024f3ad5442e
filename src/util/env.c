#include "util/env.h"

#include <errno.h>
#include <stdlib.h>

uint64_t env_bytes(const kvcr_logger *log, const char *name, uint64_t max, uint64_t dflt)
{
    const char *v = getenv(name);
    if (v == NULL || *v == 0) return dflt;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    /* strtoull takes a sign and wraps a negative number round: refused */
    if (*end != 0 || errno != 0 || n > max || v[0] == '-') {
        kvcr_log(log, KVCR_LOG_WARN, "%s=%s is not a byte count of 0..%llu: %llu", name, v,
                 (unsigned long long)max, (unsigned long long)dflt);
        return dflt;
    }
    return n;
}
