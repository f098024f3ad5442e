/* KV events in the wire format KV-aware routers read (vLLM's ZeroMQ KV
 * events, as Dynamo and llm-d consume them): the msgpack encoding of events
 * and batches, and one strict decoder of a batch (for the tests and the
 * fuzzer: the library only ever encodes).
 *
 * A batch's payload is [ts float64, [events], dp_rank int]. An event is a
 * map whose first key is "type", then its fields in this order (fields
 * marked * are written only when set):
 *   BlockStored       block_hashes [u64], parent_block_hash u64|nil,
 *                     token_ids [u32] (n blocks x block_size, or empty),
 *                     block_size uint, lora_id nil, medium str|nil,
 *                     lora_name str|nil, *extra_keys [[key]|nil] (one per
 *                     block; a key is a str, an int, or an array of str
 *                     and int: vLLM's tuples)
 *   BlockRemoved      block_hashes [u64], medium str|nil
 *   AllBlocksCleared  (nothing else)
 * The legacy positional form is the same fields as an array, the type's
 * name first. The decoder also takes the optional group_idx,
 * kv_cache_spec_kind and kv_cache_spec_sliding_window that engines may
 * send, in their place after extra_keys, and refuses everything else.
 *
 * Hashes (block_hashes, parent_block_hash) are always written in the
 * 8-byte unsigned form (0xcf), whatever their value: llm-d's decoder
 * takes only the sized 8-byte forms and drops a batch holding a smaller
 * one, and Dynamo reads them as u64 either way.
 *
 * Threads: no state; safe from any thread. */
#ifndef KVCR_NET_KVEV_H
#define KVCR_NET_KVEV_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvev_type { KVEV_STORED = 0, KVEV_REMOVED, KVEV_CLEARED } kvev_type;

#define KVEV_MAX_HASHES 65536   /* blocks in one event */
#define KVEV_MAX_TOKENS 4194304 /* token ids in one event */
#define KVEV_MAX_EXTRA 64       /* extra keys of one block */
#define KVEV_MAX_STR 256        /* bytes of a medium, LoRA name or extra key */
#define KVEV_MAX_EXTRA_BYTES 4096 /* packed extra keys of one block */

/* One event. For an encoder the pointers are the caller's; a decoded
 * event owns them (kvev_batch_free). */
typedef struct kvev_event {
    kvev_type type;
    const uint64_t *hashes;
    size_t n_hashes;
    bool has_parent;
    uint64_t parent;
    const uint32_t *tokens;  /* n_hashes * block_size, or none */
    size_t n_tokens;
    uint32_t block_size;     /* tokens per block; 0 when unknown */
    const char *medium;      /* NULL: nil */
    const char *lora_name;   /* NULL: nil */
    /* Per block (n_hashes entries) or NULL: no extra_keys field. Block
     * i's entry is extra_mp[i], extra_mp_len[i] bytes of msgpack (one
     * array, kvev_check_extra), written as they are; length 0 is nil. */
    const uint8_t *const *extra_mp;
    const uint32_t *extra_mp_len;
    /* Decoded events only, beside extra_mp: the entries that hold strings
     * alone, as extra[i][0 .. n_extra[i]) (extra[i] NULL: nil, or not
     * strings alone). The encoder reads extra_mp. */
    const char *const *const *extra;
    const uint32_t *n_extra;
} kvev_event;

/* Whether len bytes are one block's extra keys as this format carries
 * them: exactly one msgpack array of at most KVEV_MAX_EXTRA keys, each a
 * str (at most KVEV_MAX_STR bytes, no NUL), an int, or an array of at
 * most KVEV_MAX_EXTRA str and int; at most KVEV_MAX_EXTRA_BYTES bytes.
 * NULL, or a short static reason. */
const char *kvev_check_extra(const void *buf, size_t len);

/* A list of n strings as extra keys (*out: free() it). 0, or -1 (out of
 * memory, or more than KVEV_MAX_EXTRA_BYTES). */
int kvev_extra_from_strings(const char *const *keys, uint32_t n, uint8_t **out,
                            size_t *out_len);

/* The packer's bytes (at most KVEV_MAX_EXTRA_BYTES) as a block's packed
 * extra keys: 0 with *out (the buffer's own data: free() it), or -1 when
 * over the bound or empty (the buffer left to its owner). */
int kvev_take_packed(msgpack_sbuffer *sb, uint8_t **out, size_t *out_len);

/* Appends one event (map form, or positional) to pk. 0, or -1 when the
 * packer's buffer failed. */
int kvev_pack_event(msgpack_packer *pk, const kvev_event *e, bool positional);

/* Writes the payload of a batch: [ts, [events], dp_rank], the events being
 * n_events encoded events back to back in events[0 .. len). 0 with *out
 * (free() it) and *out_len, or -1 (out of memory). */
int kvev_pack_batch(double ts, const void *events, size_t len, uint32_t n_events,
                    uint32_t dp_rank, uint8_t **out, size_t *out_len);

/* A decoded batch. */
typedef struct kvev_batch {
    double ts;
    uint64_t dp_rank;
    bool positional; /* the events were arrays (all of them: forms never mix) */
    size_t n_events;
    kvev_event *events;
} kvev_batch;

/* Decodes a payload strictly: exactly one msgpack object, the shape above,
 * every type and count checked, the fields of each event in order, the
 * token ids whole blocks. NULL with *out filled (kvev_batch_free it), or a
 * short static reason with *out empty. */
const char *kvev_decode_batch(const void *buf, size_t len, kvev_batch *out);
void kvev_batch_free(kvev_batch *b);

/* The replay request: exactly 8 bytes, the big-endian start sequence.
 * NULL with *start, or a reason. */
const char *kvev_decode_replay_request(const void *buf, size_t len, uint64_t *start);

static inline void kvev_put_be64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (uint8_t)v;
}

static inline uint64_t kvev_get_be64(const uint8_t in[8])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | in[i];
    return v;
}

#define KVEV_END_SEQ UINT64_MAX /* the replay's last frame */

#endif
