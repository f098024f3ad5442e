/* The router's side of KV-event replay, for the tests: a DEALER that asks
 * a publisher's replay endpoint for every kept batch from a start sequence
 * and hands each [seq, payload] over in order. */
#ifndef KVCR_TEST_KVREPLAY_H
#define KVCR_TEST_KVREPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*kv_replay_fn)(void *ud, uint64_t seq, const void *payload, size_t len);

/* Sends the 8-byte big-endian start (after an empty delimiter, as a REQ
 * client does) and calls each() for every batch answered, each frame
 * checked: the delimiter echoed, an 8-byte sequence, the payload last.
 * True once the end marker (0xFFFFFFFFFFFFFFFF, empty payload) came;
 * false when nothing answered within timeout_ms (per frame) or an answer
 * broke the form. Bounded: at most 1,048,576 batches. */
bool kv_replay_each(const char *endpoint, uint64_t start, int timeout_ms, kv_replay_fn each,
                    void *ud);

#endif
