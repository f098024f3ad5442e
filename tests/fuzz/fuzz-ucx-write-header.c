/* libFuzzer target: the header of a write message (net/amhdr.h). The
 * first four bytes are the payload's length (little-endian), the rest the
 * header. Whatever the bytes, an accepted header lists 1..AMHDR_MAX_RUNS
 * runs of non-zero length that cover the payload exactly, one after the
 * other. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/amhdr.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    uint32_t payload;
    memcpy(&payload, data, 4);
    const uint8_t *h = data + 4;
    size_t hlen = size - 4;
    if (hlen < AMHDR_ONE) return 0; /* the receiver drops these before decoding */
    size_t runs = amhdr_check(h, hlen, payload);
    if (runs > AMHDR_MAX_RUNS) abort();
    if (runs == 0) return 0;
    if (hlen != AMHDR_LEN(runs)) abort();
    size_t sum = 0;
    for (size_t k = 0; k < runs; k++) {
        uint64_t addr;
        size_t len;
        amhdr_run(h, hlen, payload, k, &addr, &len);
        if (len == 0 || len > payload - sum) abort();
        sum += len;
    }
    if (sum != payload) abort();
    return 0;
}
