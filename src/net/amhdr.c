/* The header of a write message (net/amhdr.h). */
#include "net/amhdr.h"

#include "util/bytes.h"

void amhdr_set_tag(uint8_t *h, uint64_t tag)
{
    put64(h, tag);
}

void amhdr_set_run(uint8_t *h, size_t k, uint64_t addr, uint64_t len)
{
    uint8_t *e = h + 8 + k * AMHDR_RUN;
    put64(e, addr);
    put64(e + 8, len);
}

size_t amhdr_check(const uint8_t *h, size_t hlen, size_t payload)
{
    if (payload == 0) return 0;
    if (hlen == AMHDR_ONE) return 1;
    if (hlen < 8 || (hlen - 8) % AMHDR_RUN != 0) return 0;
    size_t runs = (hlen - 8) / AMHDR_RUN;
    if (runs < 2 || runs > AMHDR_MAX_RUNS) return 0;
    size_t sum = 0;
    for (size_t k = 0; k < runs; k++) {
        uint64_t len = get64(h + 8 + k * AMHDR_RUN + 8);
        if (len == 0 || len > payload - sum) return 0;
        sum += (size_t)len;
    }
    return sum == payload ? runs : 0;
}

uint64_t amhdr_tag(const uint8_t *h)
{
    return get64(h);
}

void amhdr_run(const uint8_t *h, size_t hlen, size_t payload, size_t k, uint64_t *addr,
               size_t *len)
{
    const uint8_t *e = h + 8 + k * AMHDR_RUN;
    *addr = get64(e);
    *len = hlen == AMHDR_ONE ? payload : (size_t)get64(e + 8);
}
