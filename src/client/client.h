/* The claimant's side of the claim socket: an engine's KVCR in guard mode
 * claims its pool group from the KVCR service, maps the pool, learns what
 * it recovers, and releases the group when it closes. */
#ifndef KVCR_SERVICE_CLIENT_H
#define KVCR_SERVICE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/recovery.h" /* recovered_block, KVCR_INC_LEN */
#include "kvcr/kvcr.h"

typedef struct svc_hold svc_hold;

/* Checks cfg->guard and what guard mode asks of the rest of cfg, without
 * contacting anyone. */
int svc_check_guard(const kvcr_config *cfg);

/* Claims cfg->guard.guard_index: connects, sends the claim (with this
 * process's pidfd), waits for the grant, checks it against cfg, maps the
 * pool, reads the recovered blocks from the journal the Guard compacted and
 * attaches to it as its producer. The service refusing gives
 * KVCR_EREFUSED with its reason; an unreachable service KVCR_EUNAVAIL; a grant
 * that does not fit the request KVCR_EPROTO (the claim is then released
 * as never activated). */
int svc_claim(const kvcr_config *cfg, svc_hold **out);

/* What the claim gave: one kvcr_dram_pool per pool layout (valid while the
 * hold lives), the recovered blocks (empty when the journal could not be
 * believed: recovery refused, logged), the journal to publish to, the
 * control listener (taken once; -1 without the peer tier) and the port it
 * is bound to. */
const kvcr_dram_pool *svc_hold_pools(const svc_hold *h, size_t *n);
const recovered_block *svc_hold_recovered(const svc_hold *h, size_t *n);
/* Incarnations that served this group's endpoint before and are gone. */
const uint8_t (*svc_hold_retired(const svc_hold *h, size_t *n))[KVCR_INC_LEN];
struct journal *svc_hold_journal(svc_hold *h);
int svc_hold_take_listener(svc_hold *h);
uint16_t svc_hold_control_port(const svc_hold *h);
/* The group's KV-event stream as the grant found it: the number the next
 * batch takes (where the Guard's, or the last owner's, stream ended). */
uint64_t svc_hold_kv_seq(const svc_hold *h);

/* Unmaps the pool, tells the service (activated: the instance ran, so the
 * journal is current; false: it never started), waits at most 10 s for the
 * answer and frees h. Returns 0, or the error of the exchange (the lease
 * then ends when this process does). */
int svc_release(svc_hold *h, bool activated);

#endif
