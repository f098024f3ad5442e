/* libFuzzer target: the KV-event decoders (net/kvev.h), the batch payload
 * and the replay request. Whatever the bytes, they must return cleanly; an
 * accepted batch must encode again (in its own form) and decode again to
 * equal events, and a refused one must leave nothing behind. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/kvev.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* The packed entries byte for byte, and their strings view. */
static bool extra_eq(const kvev_event *a, const kvev_event *b)
{
    if ((a->extra_mp == NULL) != (b->extra_mp == NULL)) return false;
    for (size_t i = 0; a->extra_mp && i < a->n_hashes; i++)
        if (a->extra_mp_len[i] != b->extra_mp_len[i] ||
            memcmp(a->extra_mp[i], b->extra_mp[i], a->extra_mp_len[i]) != 0 ||
            (a->extra_mp_len[i] && kvev_check_extra(a->extra_mp[i], a->extra_mp_len[i])))
            return false;
    if ((a->extra == NULL) != (b->extra == NULL)) return false;
    for (size_t i = 0; a->extra && i < a->n_hashes; i++) {
        if (a->n_extra[i] != b->n_extra[i] || (a->extra[i] == NULL) != (b->extra[i] == NULL))
            return false;
        for (uint32_t j = 0; j < a->n_extra[i]; j++)
            if (!str_eq(a->extra[i][j], b->extra[i][j])) return false;
    }
    return true;
}

static bool event_eq(const kvev_event *a, const kvev_event *b)
{
    return a->type == b->type && a->n_hashes == b->n_hashes &&
           (a->n_hashes == 0 || memcmp(a->hashes, b->hashes, a->n_hashes * 8) == 0) &&
           a->has_parent == b->has_parent && (!a->has_parent || a->parent == b->parent) &&
           a->n_tokens == b->n_tokens &&
           (a->n_tokens == 0 || memcmp(a->tokens, b->tokens, a->n_tokens * 4) == 0) &&
           a->block_size == b->block_size && str_eq(a->medium, b->medium) &&
           str_eq(a->lora_name, b->lora_name) && extra_eq(a, b);
}

static void round_trip(const kvev_batch *a)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (size_t i = 0; i < a->n_events; i++)
        if (kvev_pack_event(&pk, &a->events[i], a->positional) != 0) abort();
    uint8_t *buf;
    size_t len;
    if (kvev_pack_batch(a->ts, sb.data, sb.size, (uint32_t)a->n_events, (uint32_t)a->dp_rank,
                        &buf, &len) != 0)
        abort();
    kvev_batch b;
    if (kvev_decode_batch(buf, len, &b) != NULL) abort();
    if (b.n_events != a->n_events || b.dp_rank != a->dp_rank ||
        memcmp(&b.ts, &a->ts, sizeof b.ts) != 0)
        abort();
    for (size_t i = 0; i < a->n_events; i++)
        if (!event_eq(&a->events[i], &b.events[i])) abort();
    kvev_batch_free(&b);
    free(buf);
    msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t start;
    const char *why = kvev_decode_replay_request(data, size, &start);
    if ((why == NULL) != (size == 8)) abort();
    kvev_batch a;
    if (kvev_decode_batch(data, size, &a) != NULL) {
        if (a.events != NULL || a.n_events != 0) abort();
        return 0;
    }
    /* dp_rank is written back as a u32: a larger one cannot round-trip */
    if (a.dp_rank <= UINT32_MAX) round_trip(&a);
    kvev_batch_free(&a);
    return 0;
}
