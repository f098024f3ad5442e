/* libFuzzer target: the claim socket's message decoder (client/frame.h).
 * Whatever the bytes, it must return cleanly, and a refusal must leave the
 * message zeroed; an accepted message must encode again, decode again to
 * the same fields, and that one must encode to the very same bytes (the
 * encoding of a message is canonical). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/error.h"
#include "client/frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool zeroed(const svc_msg *m)
{
    const uint8_t *p = (const uint8_t *)m;
    for (size_t i = 0; i < sizeof *m; i++)
        if (p[i] != 0) return false;
    return true;
}

static bool same_pool(const svc_pool *a, const svc_pool *b)
{
    return strcmp(a->name, b->name) == 0 && a->block_size == b->block_size &&
           a->offset == b->offset && a->size == b->size;
}

/* Every field (a decoded message has zeros where its type carries none). */
static bool same_msg(const svc_msg *a, const svc_msg *b)
{
    if (a->type != b->type || a->guard_index != b->guard_index || a->n_pools != b->n_pools ||
        strcmp(a->digest, b->digest) != 0 || strcmp(a->agent, b->agent) != 0 ||
        strcmp(a->control_host, b->control_host) != 0 || a->control_port != b->control_port ||
        a->generation != b->generation || a->mapping_bytes != b->mapping_bytes ||
        a->journal_bytes != b->journal_bytes || a->recovered != b->recovered ||
        a->activated != b->activated || strcmp(a->kv_endpoint, b->kv_endpoint) != 0 ||
        strcmp(a->kv_replay, b->kv_replay) != 0 || strcmp(a->kv_topic, b->kv_topic) != 0 ||
        a->kv_dp_rank != b->kv_dp_rank || strcmp(a->kv_medium_dram, b->kv_medium_dram) != 0 ||
        strcmp(a->kv_medium_g3, b->kv_medium_g3) != 0 || a->kv_positional != b->kv_positional ||
        (a->text == NULL) != (b->text == NULL) ||
        (a->text && strcmp(a->text, b->text) != 0))
        return false;
    for (uint32_t i = 0; i < a->n_pools; i++)
        if (!same_pool(&a->pools[i], &b->pools[i])) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static svc_msg a, b; /* 20 KiB each: off the stack */
    int rc = svc_decode(data, size, &a);
    if (rc != 0) {
        if (rc != KVCR_EPROTO || !zeroed(&a)) abort();
        return 0;
    }
    uint8_t *buf, *again;
    size_t len, again_len;
    if (svc_encode(&a, &buf, &len) != 0) abort();
    if (svc_decode(buf, len, &b) != 0) abort();
    if (!same_msg(&a, &b)) abort();
    if (svc_encode(&b, &again, &again_len) != 0) abort();
    if (again_len != len || memcmp(again, buf, len) != 0) abort();
    free(buf);
    free(again);
    svc_msg_clear(&a);
    svc_msg_clear(&b);
    return 0;
}
