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

/* The test clock. Every deadline, timer and duration of the library (an
 * operation's deadline, the peer tier's probes, reprobes, idle reclaim and
 * stall check, metadata retries) reads one process-wide clock, by default
 * CLOCK_MONOTONIC. A test freezes it, then moves it forward by exact
 * amounts: what is due at t runs on the first look at the clock at or
 * after t and never before, however loaded the machine.
 *
 * Who looks: the core's deadlines are checked in kvcr_poll, so a test
 * advances then calls kvcr_poll. The peer tier's progress thread caps each
 * sleep at 20 ms of real time and rereads the clock after it, so after an
 * advance its timers run within that nap: the test then waits (bounded)
 * for their effect, a gauge or a result. No thread sleeps until a time of
 * this clock.
 *
 * What a jump means to the library: an advance of operation_timeout_ms or
 * more in one step is, to the peer tier, a progress thread that stalled
 * that long (it reports KVCR_SOURCE_STALLED and takes no new source
 * writes), so a test of the source side advances in smaller steps. Frozen,
 * time does not pass, so a bounded wait of the library does not end by
 * itself either (closing a UCX endpoint, the progress thread's give-up at
 * close: a test resumes the clock before kvcr_close), and the progress
 * thread with a transfer in flight yields instead of napping (its spin is
 * timed by this clock).
 *
 * The clock never goes back: kvcr__test_clock_run resumes from the frozen
 * time. Freeze, advance and run are called from one thread at a time; any
 * thread reads. */
/* Freezes the clock at its current time, returned. */
KVCR__TEST_API uint64_t kvcr__test_clock_freeze(void);
/* Moves the clock forward by ns (frozen or not); returns the new time. */
KVCR__TEST_API uint64_t kvcr__test_clock_advance(uint64_t ns);
/* The clock runs again, from the time it was frozen at. */
KVCR__TEST_API void kvcr__test_clock_run(void);

#endif
