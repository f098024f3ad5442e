/* libFuzzer target: the peer control message decoder (msgpack, net/wire.h).
 * Whatever the bytes, it must return cleanly; an accepted message must
 * encode again, decode again to an equal message, and that one must encode
 * to the very same bytes (the encoding of a message is canonical). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    wire_msg a, b;
    const char *why = NULL;
    if (wire_decode(data, size, &a, &why) != 0) {
        if (why == NULL || a.storage != NULL) abort();
        return 0;
    }
    void *buf, *again;
    size_t len, again_len;
    if (wire_encode(&a, &buf, &len) != 0) abort();
    if (wire_decode(buf, len, &b, &why) != 0) abort();
    if (!wire_msg_equal(&a, &b) || !wire_msg_equal(&b, &a)) abort();
    if (wire_encode(&b, &again, &again_len) != 0) abort();
    if (again_len != len || memcmp(again, buf, len) != 0) abort();
    free(buf);
    free(again);
    wire_msg_free(&a);
    wire_msg_free(&b);
    return 0;
}
