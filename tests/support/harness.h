/* Test harness: an instance over a framework buffer and a KVCR DRAM pool,
 * with helpers to fill, deposit, deliver and wait for results. */
#ifndef KVCR_TEST_HARNESS_H
#define KVCR_TEST_HARNESS_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kvcr/testing.h"
#include "kvcr/kvcr.h"

typedef struct rig {
    kvcr_t *kv;
    kvcr_config cfg;
    kvcr_pool_layout layout;
    kvcr_dram_pool pool;
    kvcr_region region;
    uint8_t *fw;     /* framework memory: fw_count blocks */
    uint8_t *dram;   /* KVCR DRAM: slots blocks */
    size_t block_size, fw_count, slots;
    /* recorded callbacks (several polling threads may call them at once) */
    pthread_mutex_t cb_lock;
    int inventory_calls, inventory_added, inventory_removed;
    char inventory_log[4096];
    int capacity_calls;
    uint64_t capacity_slots;
    int fail_callbacks; /* callbacks return -1 while set */
    char last_warning[1024];
    int warnings;
    /* called from the inventory sink, to test re-entry from callbacks */
    void (*on_event)(struct rig *r, const kvcr_inventory_event *ev);
    /* results polled while waiting for another operation (any thread may
     * wait: stash_lock guards them) */
    pthread_mutex_t stash_lock;
    struct stashed *stash;
    size_t n_stash;
} rig;

/* cfg is filled with defaults; adjust r->cfg before rig_start(). */
void rig_init(rig *r, size_t block_size, size_t fw_count, size_t slots);
void rig_start(rig *r);
void rig_stop(rig *r);

/* Writes a pattern derived from seed into framework block i. */
void rig_pattern(rig *r, size_t i, uint32_t seed);
bool rig_has_pattern(const rig *r, const uint8_t *p, uint32_t seed);
void fill_pattern(uint8_t *p, size_t len, uint32_t seed);

kvcr_key key_of(const char *s);

/* Deposits/delivers one key per framework block index; returns the op. */
kvcr_op_handle rig_deposit(rig *r, const char *const *keys, const size_t *fw_idx, size_t n,
                           unsigned flags);
kvcr_op_handle rig_deliver(rig *r, const char *const *keys, const size_t *fw_idx, size_t n);

/* Polls until op completes (bounded: 10 s; results of other operations
 * polled meanwhile are kept for their own rig_wait); the result is copied into
 * *statuses / reasons / rh (arrays of at least the op's size, may be NULL)
 * in request order. Returns the number of entries. */
size_t rig_wait(rig *r, kvcr_op_handle op, kvcr_entry_status *st, kvcr_reason *why,
                kvcr_release_handle *rh);

/* One poll: runs the instance's callbacks (pins, resilience events) and
 * settles finished source writes; any results are discarded. For a test
 * that serves peers rather than waiting for its own operations. */
void rig_pump(rig *r);

/* CLOCK_MONOTONIC in ms: the bounds of a test's waits. */
uint64_t rig_now_ms(void);

/* Waits until the instance's fd is readable (a copy or an operation
 * completed, or the remote tier owes the polling thread work: pins, source
 * writes to settle) or max_ms passed; true when readable. kvcr_poll() finds
 * expired deadlines itself without waking the fd, so a loop that also waits
 * for a deadline passes a bound no longer than the lateness it tolerates. */
bool rig_await(rig *r, int max_ms);

/* rig_wait, then every one of the op's n entries must have FAILED for why. */
void rig_wait_all_failed(rig *r, kvcr_op_handle op, size_t n, kvcr_reason why);

/* Polls (bounded: 10 s) until a poll returns results, for a test that
 * reads them whole (a fetch's slots); the caller checks and frees them. */
kvcr_op_result *rig_poll_results(rig *r, size_t *n);

/* A gauge's value, or (gauge NULL) the byte counter of a telemetry scope,
 * from a fresh stats snapshot (telemetry on); -1 when absent. */
double rig_stat(rig *r, const char *gauge, const char *counter_scope);

/* Polls until no spill to G3 is being written (gauge g3_pending_stores;
 * telemetry on), failing the test after 5 s. */
void rig_g3_settle(rig *r);

kvcr_query_status rig_query(rig *r, const char *key);

/* One key from framework block idx, waited for; why and rh may be NULL. */
kvcr_entry_status rig_deposit1(rig *r, const char *key, size_t idx, unsigned flags,
                               kvcr_reason *why, kvcr_release_handle *rh);

#endif
