#include "net/mpscan.h"

/* One header at p[*i]: how many elements a container promises (*elems, a
 * map counting two per entry) or how many payload bytes follow (*skip). */
static const char *header(const uint8_t *p, size_t len, size_t *i, uint64_t *elems, uint64_t *skip)
{
    uint8_t b = p[(*i)++];
    *elems = *skip = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return NULL;
    if (b <= 0x8f) *elems = 2u * (b & 0x0f);
    else if (b <= 0x9f) *elems = b & 0x0f;
    else if (b <= 0xbf) *skip = b & 0x1f;
    else if (b == 0xca || b == 0xcb) *skip = b == 0xca ? 4 : 8;   /* float32, float64 */
    else if (b >= 0xcc && b <= 0xd3) *skip = 1u << (b & 3);        /* [u]int8..64 */
    else if (b == 0xc1) return "invalid msgpack byte 0xc1";
    else if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8))
        return "msgpack ext types are not allowed";
    else {
        /* bin8/16/32 (c4-c6), str8/16/32 (d9-db), array16/32 (dc, dd),
         * map16/32 (de, df): a big-endian length of 1, 2 or 4 bytes. */
        unsigned width = b <= 0xc6 ? 1u << (b - 0xc4) : b <= 0xdb ? 1u << (b - 0xd9)
                                                                  : 2u << (b & 1);
        uint64_t n = 0;
        if (width > len - *i) return "truncated message";
        for (unsigned k = 0; k < width; k++) n = n << 8 | p[(*i)++];
        if (b >= 0xde) *elems = 2 * n;
        else if (b >= 0xdc) *elems = n;
        else *skip = n;
    }
    return NULL;
}

const char *mpscan(const uint8_t *p, size_t len, size_t max_objects, int max_depth)
{
    if (max_depth > MPSCAN_MAX_DEPTH) max_depth = MPSCAN_MAX_DEPTH;
    uint64_t left[MPSCAN_MAX_DEPTH + 1] = {1}; /* objects still to read at each depth */
    uint64_t need = 1;                         /* their sum; always <= len - i */
    size_t i = 0, seen = 0;
    int depth = 0;
    while (need > 0) {
        while (left[depth] == 0) depth--;
        if (i >= len) return "truncated message";
        if (++seen > max_objects) return "more msgpack objects than any message has";
        uint64_t elems, skip;
        const char *why = header(p, len, &i, &elems, &skip);
        if (why) return why;
        left[depth]--;
        need--;
        if (skip > len - i) return "truncated message";
        i += skip;
        /* Each object still to read takes at least a byte. */
        if (elems > len - i || need + elems > len - i)
            return elems ? "container longer than the message" : "truncated message";
        if (elems > 0) {
            /* msgpack-c reports nesting beyond its own stack as out of
             * memory: refused here, it is the protocol error it is. */
            if (depth == max_depth) return "msgpack nested deeper than any message";
            left[++depth] = elems;
            need += elems;
        }
    }
    return i == len ? NULL : "trailing bytes after the message";
}
