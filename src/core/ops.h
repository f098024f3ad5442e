/* Operations: deposit, deliver, fetch, release, abort; their completions,
 * deadlines and results. Entry points take the instance lock themselves
 * unless marked "locked". */
#ifndef KVCR_CORE_OPS_H
#define KVCR_CORE_OPS_H

#include "core/instance.h"

/* hints: the deposit's framework hints (core/tenants.h), NULL: none. */
int ops_deposit(kvcr_t *kv, const kvcr_block *blocks, size_t n, unsigned flags, const char *hints,
                size_t hints_len, kvcr_op_handle *op);
int ops_deliver(kvcr_t *kv, const kvcr_block *blocks, size_t n, const char *request_id,
                kvcr_op_handle *op);
/* hints: the fetch's framework hints (core/tenants.h), NULL: none;
 * flags: KVCR_STRICT_TENANT. */
int ops_fetch(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
              const char *const *layout, size_t layout_len, const char *hints,
              size_t hints_len, unsigned flags, kvcr_op_handle *op);
int ops_release(kvcr_t *kv, const kvcr_release_handle *handles, size_t n, bool *released);
int ops_abort(kvcr_t *kv, kvcr_op_handle op, const kvcr_key *keys, size_t n, size_t *n_aborted);

/* Locked: collects finished copies and expires deadlines. */
void ops_progress(kvcr_t *kv);
/* Locked: the completed operations as one allocation (NULL + 0 if none);
 * KVCR_ENOMEM keeps them queued. */
int ops_take_results(kvcr_t *kv, kvcr_op_result **results, size_t *n);
/* Locked: fails every pending entry with CLOSED and cancels queued copies.
 * Running copies remain; ops_progress collects them once the copy engine
 * has stopped. */
void ops_cancel_all(kvcr_t *kv);
/* Locked: frees the completed operations nobody will collect. */
void ops_discard_done(kvcr_t *kv);

bool ops_valid_key(const kvcr_key *k);
/* A block's framework references, checked as deposit checks them. */
int ops_check_refs(const kvcr_t *kv, const kvcr_mem_ref *refs, size_t n);
/* The framework pieces of a reference (core/conf.h) into out[PIECES_MAX],
 * and the pool its label names; 0 when it does not check. */
uint32_t ops_ref_pieces(const kvcr_t *kv, const kvcr_mem_ref *r, mem_piece *out, uint32_t *pool);

/* Locked: the remote and G3 tiers settle the entries and fills they were
 * given. */
void ops_entry_settle(kvcr_t *kv, op_rec *o, uint32_t i, bool ok, kvcr_reason why);
/* A fetch's deadline passed while a peer may still write the slots: fail
 * the waiters now, keep the slots (G2_DISCARDING) until the pull ends. */
void ops_remote_fill_discard(kvcr_t *kv, struct fill *f);
/* The transfer ended: commit (ok) or free the slots. A discarded fill is
 * only freed. */
void ops_fill_settle(kvcr_t *kv, struct fill *f, bool ok, kvcr_reason why);

#endif
