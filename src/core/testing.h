/* Hooks for the test suite and the benchmarks. They are not part of the
 * public API (the shared library does not export them); tests and tools
 * link the static library. */
#ifndef KVCR_CORE_TESTING_H
#define KVCR_CORE_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

enum kvcr_test_gate {
    KVCR_TEST_GATE_OPEN = 0,
    KVCR_TEST_GATE_HOLD_QUEUED,  /* copy threads start no copy */
    KVCR_TEST_GATE_HOLD_RUNNING  /* copy threads take one copy each, then wait */
};

/* Holds or releases the copy threads. */
void kvcr__test_copy_gate(kvcr_t *kv, int gate);
/* The next n copies fail as a transfer error would. */
void kvcr__test_fail_copies(kvcr_t *kv, uint32_t n);
/* Number of copies currently RUNNING (taken by a thread). */
uint32_t kvcr__test_running_copies(kvcr_t *kv);
/* Bytes of block metadata (index, records, queues) and resident records. */
size_t kvcr__test_metadata_bytes(kvcr_t *kv, uint64_t *records);

/* The stored hint of a request: 1 with its fields, 0 if none. */
int kvcr__test_hint(kvcr_t *kv, const char *request_id, const char **source, size_t *n_hashes,
                    const uint64_t **hashes, bool *failed);

/* Control messages the remote tier dropped (malformed or unexpected). */
uint64_t kvcr__test_dropped_messages(kvcr_t *kv);

/* The next n G3 I/O completions report -err (the I/O itself happens). */
void kvcr__test_g3_fail_next(kvcr_t *kv, unsigned n, int err);
/* Holds G3 requests in the I/O thread's queue (reads and spills wait). */
void kvcr__test_g3_hold(kvcr_t *kv, bool hold);

#endif
