/* Little-endian fields in byte buffers (on-disk records, shared-memory
 * frames), and the big-endian 32-bit length that prefixes a frame on a
 * stream socket (the claim socket, the control lane): memcpy, so any
 * alignment is fine. */
#ifndef KVCR_UTIL_BYTES_H
#define KVCR_UTIL_BYTES_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}

static inline uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static inline void put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}

static inline void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static inline uint32_t get32be(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return be32toh(v);
}

static inline void put32be(uint8_t *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, 4);
}

#endif
