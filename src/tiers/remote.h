/* The peer-to-peer tier (REMOTE_G2).
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
 * kvcr_poll() / kvcr_close() on the caller's thread.
 *
 * The core reaches the tier only through remote_tier_ops (core/tier.h).
 * The calls below are the remote-only public ones, for the API layer
 * (src/api/kvcr.c) alone; each says its thread and lock:
 *   remote_start             kvcr_create's thread, before the instance is
 *                            shared; unlocked
 *   remote_tier              any thread
 *   remote_pin_complete      any thread, unlocked (takes the instance lock)
 *   remote_endpoint          any thread (fixed at start)
 *   remote_check_source      any thread, locked or not (reads what start fixed)
 *   remote_hint_source       locked
 *   remote_dropped_messages  locked */
#ifndef KVCR_TIERS_REMOTE_H
#define KVCR_TIERS_REMOTE_H

#include <stdint.h>

#include "core/tier.h"
#include "kvcr/kvcr.h"

typedef struct remote remote;

/* stop, close, destroy, settle, run_callbacks, gauges, begin, holds, read,
 * end; no spills. */
extern const tier_ops remote_tier_ops;

struct ucx_ctx;

/* Registers memory, binds the control channel (on control_listener when it
 * is >= 0: an fd already bound, taken over either way) and starts the
 * progress thread, on the UCX context *ready when there is one (made
 * ahead: UCX takes 5-8 ms to start; taken, *ready set to NULL, once the
 * tier's record exists) or a new one. 0 and *out, or an error with its
 * message (nothing left running, nothing to destroy). */
int remote_start(kvcr_t *kv, int control_listener, struct ucx_ctx **ready, remote **out);
/* The tier the core loops over (with remote_tier_ops). */
tier *remote_tier(remote *r);

/* The framework's answer to request_pin. */
int remote_pin_complete(remote *r, uint64_t req, uint64_t pin, const kvcr_block *blocks,
                        size_t n);
/* Our control endpoint (owned by the tier, valid until it is destroyed). */
const char *remote_endpoint(const remote *r);
/* 0 when this instance may talk to source (its CURVE key present exactly
 * when CURVE is on, and allowed), else KVCR_EINVAL with the reason. */
int remote_check_source(const remote *r, const char *source);
/* A hint named this source: publish our metadata to it now (when
 * eager_ctrl_connect is on). */
void remote_hint_source(remote *r, const char *source);
/* Control messages dropped, whatever the cause (net/control.h's
 * ctl_drop but for handshake and auth, which drop connections). */
uint64_t remote_dropped_messages(const remote *r);

#endif
