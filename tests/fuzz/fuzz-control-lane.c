/* libFuzzer target: the control lane's framing (net/lane.h), read as a
 * connection's bytes are: a name first, then messages. Whatever the bytes,
 * every frame taken lies inside them with a length in bounds, a name is
 * accepted only when printable, and a frame cut short anywhere reads as
 * incomplete (0) or as the same verdict, never as another frame. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/lane.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MESSAGE 4096

static void check_prefixes(const uint8_t *buf, size_t len, size_t max, ptrdiff_t whole)
{
    /* Every prefix of the frame's bytes: incomplete, or the whole verdict
     * once the header shows a bad length. */
    size_t end = whole > 0 ? (size_t)whole : (len < 64 ? len : 64);
    for (size_t k = 0; k < end && k < 64; k++) {
        const uint8_t *p;
        size_t n;
        ptrdiff_t got = lane_frame(buf, k, max, &p, &n);
        if (got > 0) abort();
        if (got < 0 && (whole >= 0 || k < LANE_HEADER)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    for (int frame = 0; off < size; frame++) {
        size_t max = frame == 0 ? LANE_MAX_NAME : MAX_MESSAGE;
        const uint8_t *p = NULL;
        size_t n = 0;
        ptrdiff_t got = lane_frame(data + off, size - off, max, &p, &n);
        check_prefixes(data + off, size - off, max, got);
        if (got <= 0) break;
        if (n == 0 || n > max || (size_t)got != LANE_HEADER + n || p != data + off + LANE_HEADER ||
            off + (size_t)got > size)
            abort();
        if (frame == 0 && lane_name_ok(p, n)) {
            for (size_t i = 0; i < n; i++)
                if (p[i] <= 0x20 || p[i] >= 0x7f) abort();
        }
        off += (size_t)got;
    }
    return 0;
}
