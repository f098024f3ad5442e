/* libFuzzer target: the router hint decoder (strict JSON + envelope rules).
 * Whatever the bytes, it must return cleanly, and an accepted hint must be
 * well formed: a non-empty source and sorted, unique hashes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/error.h"
#include "net/hint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(void *ud, kvcr_log_level level, const char *msg)
{
    (void)ud, (void)level, (void)msg;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvcr_logger log;
    if (log.fn == NULL) kvcr_logger_init(&log, "fuzz", quiet, NULL);
    hint h;
    int rc = hint_parse((const char *)data, size, &log, &h);
    if (rc == 0) {
        if (h.source == NULL || h.source[0] == '\0' || h.n_hashes == 0) abort();
        for (size_t i = 1; i < h.n_hashes; i++)
            if (h.hashes[i - 1] >= h.hashes[i]) abort();
    } else if (rc != KVCR_EINVAL && rc != KVCR_ENOMEM) {
        abort();
    }
    hint_clear(&h);
    return 0;
}
