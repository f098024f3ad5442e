/* The test interface: fault injection and introspection for the test
 * suite, the `kvcr` tool's benchmarks and demo, and the Python binding.
 *
 * Not covered by the ABI promise (docs/ARCHITECTURE.md): these functions
 * may change or go in any release, and an engine never calls them. libkvcr
 * exports them (internal prefix kvcr__) so that the tests and the tool
 * reach them through the shared library like any other program, never
 * through the library's private headers. */
#ifndef KVCR_TESTING_H
#define KVCR_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

#define KVCR__TEST_API __attribute__((visibility("default")))

enum kvcr_test_gate {
    KVCR_TEST_GATE_OPEN = 0,
    KVCR_TEST_GATE_HOLD_QUEUED,  /* copy threads start no copy */
    KVCR_TEST_GATE_HOLD_RUNNING  /* copy threads take one copy each, then wait */
};

/* Holds or releases the copy threads. */
KVCR__TEST_API void kvcr__test_copy_gate(kvcr_t *kv, int gate);
/* The next n copies fail as a transfer error would. */
KVCR__TEST_API void kvcr__test_fail_copies(kvcr_t *kv, uint32_t n);
/* Number of copies currently RUNNING (taken by a thread). */
KVCR__TEST_API uint32_t kvcr__test_running_copies(kvcr_t *kv);
/* Bytes of block metadata (index, records, queues) and resident records. */
KVCR__TEST_API size_t kvcr__test_metadata_bytes(kvcr_t *kv, uint64_t *records);

/* The stored hint of a request: 1 with its fields, 0 if none. */
KVCR__TEST_API int kvcr__test_hint(kvcr_t *kv, const char *request_id, const char **source,
                                   size_t *n_hashes, const uint64_t **hashes, bool *failed);

/* Control messages the remote tier dropped (malformed or unexpected). */
KVCR__TEST_API uint64_t kvcr__test_dropped_messages(kvcr_t *kv);

/* The next n G3 I/O completions report -err (the I/O itself happens). */
KVCR__TEST_API void kvcr__test_g3_fail_next(kvcr_t *kv, unsigned n, int err);
/* Holds G3 requests in the I/O thread's queue (reads and spills wait). */
KVCR__TEST_API void kvcr__test_g3_hold(kvcr_t *kv, bool hold);

#endif
