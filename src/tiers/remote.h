/* The peer-to-peer tier (REMOTE_G2), as the core sees it.
 *
 * Target side: a deliver or fetch of keys that a request's router hint
 * places on another KVCR becomes one "pull": a start_write to the hinted
 * source, which writes the bytes into our memory with UCX and then says
 * write_done. Source side: start_write requests from peers are served from
 * READY KVCR DRAM, or from framework memory pinned through the framework's
 * pin callbacks.
 *
 * One progress thread owns UCX and the ZeroMQ channel. Every piece of
 * shared state is guarded by the instance lock; framework callbacks (pins,
 * resilience events) and anything that may call the policy run only inside
 * kvcr_poll() / kvcr_close() on the caller's thread. Functions marked
 * "locked" run with the instance lock held. */
#ifndef KVCR_TIERS_REMOTE_H
#define KVCR_TIERS_REMOTE_H

#include "core/instance.h"

typedef struct remote remote;
typedef struct pull pull;

/* Registers memory, binds the control channel and starts the progress
 * thread. 0, or an error with its message (nothing left running). */
int remote_start(kvcr_t *kv);
/* Stops the progress thread after the transfers in flight ended (bounded
 * by the abandon timeout; what is left is reported as uncertain), then
 * releases UCX and the control socket. Call without the lock, after
 * kv->closed is set. */
void remote_stop(kvcr_t *kv);
/* Locked, at close after the last settling: cancels pending pin requests
 * and asks once more for pins not yet released. */
void remote_close(kvcr_t *kv);
void remote_destroy(kvcr_t *kv);

const char *remote_endpoint(const kvcr_t *kv);

/* Locked. Whether a key may be pulled for this request (p2p_spec §3.4). */
bool remote_accepts(kvcr_t *kv, const hint_state *st, const uint8_t *key, size_t len);
/* Locked. The request's usable hint, or NULL. */
hint_state *remote_hint(kvcr_t *kv, const char *request_id);

/* Locked. Building one pull per operation: new, add keys, submit. Deliver
 * keys name the op entry; fetch keys name the fill (KVCR slots). */
pull *remote_pull_new(kvcr_t *kv, const hint_state *st, kvcr_op_handle op, bool fetch,
                      size_t max_keys, size_t max_refs);
void remote_pull_add_deliver(kvcr_t *kv, pull *p, op_rec *o, uint32_t idx, const kvcr_mem_ref *refs,
                             uint32_t n_refs, const uint8_t *key, uint32_t key_len);
void remote_pull_add_fill(kvcr_t *kv, pull *p, struct fill *f, const uint8_t *key,
                          uint32_t key_len);
/* Hands the pull to the progress thread (frees it when it has no keys). */
void remote_pull_submit(kvcr_t *kv, pull *p);
void remote_pull_free(pull *p);

/* Locked, from ops_progress(): settles what the progress thread handed
 * back (finished pulls, finished source writes, pin work). */
void remote_main(kvcr_t *kv);

/* Locked. A hint named this source: publish our metadata to it now. */
void remote_hint_source(kvcr_t *kv, const char *source);

/* The framework's answer to request_pin. */
int remote_pin_complete(kvcr_t *kv, uint64_t req, uint64_t pin, const kvcr_block *blocks,
                        size_t n);

/* Runs the framework callbacks that remote_main queued (pins, resilience
 * events). Unlocked, on the polling thread. */
void remote_run_callbacks(kvcr_t *kv);

/* Locked. Control messages dropped as malformed or unexpected. */
uint64_t remote_dropped_messages(const kvcr_t *kv);

/* Locked. What CURVE refused so far: connections (ZAP) and messages whose
 * reply endpoint named another key than their connection's. */
void remote_refused(const kvcr_t *kv, double *connections, double *messages);

/* 0 when this instance may talk to source (its CURVE key present exactly
 * when CURVE is on, and allowed), else KVCR_EINVAL with the reason. */
int remote_check_source(const kvcr_t *kv, const char *source);

/* Gauges: connected peers, framework pins, pinned keys. Locked. */
void remote_gauges(const kvcr_t *kv, double *peers, double *pins, double *pinned_keys);
/* Gauges of the limits: source writes being served now and at most so far
 * (since the instance started), source writes held (also ended ones not yet
 * settled by a poll), fences of write ids (kept twice the abandon timeout
 * after their write ended), pin requests pending. Locked. */
void remote_limit_gauges(const kvcr_t *kv, double *serving, double *serving_max, double *held,
                         double *fences, double *pin_reqs);

#endif
