/* The bound on the routes to targets (config.max_peers): each holds a UCX
 * endpoint and the target's published regions, made from its metadata
 * (remote_progress.c). Progress thread, locked.
 *
 * A route is reclaimable when no source write uses it and UCX runs nothing
 * on its endpoint, and it has no usable endpoint (failed, or none made
 * for a target it served: metadata whose endpoint UCX refused) or it
 * was idle for config.peer_idle_ms: its endpoint is closed and it is
 * freed, by the sweep (failed or idle ones, at most once a second, a few
 * at a time: each close waits for UCX) or when a new target comes to a
 * full table (those without a usable endpoint first, then the least
 * recently used). Metadata whose endpoint UCX refuses thus never holds
 * room a real target needs.
 * A target whose route went away has its next start_write refused (no
 * metadata here) and sends it again with its metadata (remote_target.c).
 * Metadata a target sent again (a hint's, repeated until answered) before
 * our answer reached it may come after its route went idle and was taken:
 * it makes the route again, which the sweep takes once idle in turn (the
 * target stops once answered, or after EAGER_TRIES: remote_progress.c).
 * With nothing reclaimable a new target's metadata is refused: its
 * start_write with write_refused{busy} (its entries fail SOURCE_BUSY), its
 * metadata alone not acknowledged; counted as
 * kvcr_limit_refusals_total{limit="peers"}, logged at most once a second. */
#include "tiers/remote_int.h"
#include "util/clock.h"

#define SWEEP_NS 1000000000ull /* the sweep runs at most once a second */
#define SWEEP_ROUTES 8         /* endpoints it closes at most */

/* Whether rt's endpoint is coming for a target it served inline
 * (post_inline asks for it a little later): a real target's route, which
 * ranks as one with its endpoint. Metadata alone, acknowledged once its
 * endpoint is made, proves no target. */
static bool endpoint_coming(const route *rt)
{
    return rt->connect_at != 0 && rt->acks_due == 0;
}

/* How cheaply a route no write uses goes: 0, at once (its endpoint
 * failed; or, when a new target needs the room, it has none: metadata
 * whose endpoint could not be made or is not made yet); 1, once idle for
 * peer_idle_ms; 2, not (in use, or not idle long enough). */
static int reclaim_rank(const route *rt, uint64_t now, uint64_t idle, bool pressed)
{
    if (rt->users > 0 || (rt->peer != NULL && ucx_peer_busy(rt->peer) > 0)) return 2;
    if (rt->peer != NULL ? ucx_peer_failed(rt->peer) : pressed && !endpoint_coming(rt)) return 0;
    return rt->last_ns <= now && now - rt->last_ns >= idle ? 1 : 2;
}

/* The reclaimable route of the lowest rank, least recently used first:
 * its endpoint closed, freed. */
static bool route_reclaim_lru(remote *r, uint64_t now, bool pressed)
{
    uint64_t idle = (uint64_t)host_conf(r->kv)->peer_idle_ms * 1000000ull;
    route **best = NULL;
    int best_rank = 2;
    for (route **l = &r->routes; *l; l = &(*l)->next) {
        int rank = reclaim_rank(*l, now, idle, pressed);
        if (rank < best_rank || (rank == best_rank && rank < 2 && (*l)->last_ns < (*best)->last_ns))
            best = l, best_rank = rank;
    }
    if (best == NULL) return false;
    route *rt = *best;
    *best = rt->next;
    r->n_routes--;
    r->routes_reclaimed++;
    kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "route to %s reclaimed (%s)", rt->agent,
             best_rank == 0 ? "no usable endpoint" : "idle");
    route_free(rt);
    return true;
}

int route_admit(remote *r, const wire_bytes *agent)
{
    uint32_t max = host_conf(r->kv)->max_peers;
    if (r->n_routes < max || route_reclaim_lru(r, kvcr_now_ns(), true)) return 0;
    peer_refused(r, "the metadata of target", (int)agent->len, (const char *)agent->data);
    return kvcr_fail(KVCR_ELIMIT, "limit max_peers (%u) reached: no route reclaimable", max);
}

void peers_sweep(remote *r, uint64_t now, uint64_t *next_ns)
{
    if (now < r->peer_sweep_ns) {
        if (r->peer_sweep_ns < *next_ns) *next_ns = r->peer_sweep_ns;
        return;
    }
    r->peer_sweep_ns = now + SWEEP_NS;
    for (int i = 0; i < SWEEP_ROUTES && route_reclaim_lru(r, now, false); i++) continue;
    peer_records_sweep(r, now);
}
