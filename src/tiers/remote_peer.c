/* Peers of the remote tier: what we know of a control endpoint (whether it
 * acknowledged our metadata, its incarnation as last learned, eager
 * publishing asked by a hint), in a table bounded by config.max_peers.
 * Locked; a file of its own so that the pull state machine
 * (remote_target.c) links without the progress thread.
 *
 * A record is reclaimable when no pull names its endpoint and no hint asked
 * for eager metadata: the least recently used makes room for a new one, and
 * the sweep (peers_sweep, remote_route.c) drops those unused for
 * config.peer_idle_ms; losing one costs only our metadata riding along on
 * the next message to that source. With every record in use a new one is not made (counted as
 * kvcr_limit_refusals_total{limit="peers"}, logged at most once a second):
 * our metadata then rides along on every message to that source. */
#include <stdlib.h>
#include <string.h>

#include "tiers/remote_int.h"
#include "util/clock.h"

#define PEER_LOG_MS 1000

void peer_refused(remote *r, const char *what, int len, const char *name)
{
    host_refusal(r->kv, "peers");
    kvcr_log_limited(host_logger(r->kv), &r->peer_log, PEER_LOG_MS,
                     "peer table full (max_peers %u, nothing reclaimable): %s %.*s refused",
                     host_conf(r->kv)->max_peers, what, len, name);
}

static bool has_pull(const remote *r, const char *endpoint)
{
    for (const pull *p = r->pulls; p; p = p->next)
        if (strcmp(p->source, endpoint) == 0) return true;
    return false;
}

static void record_drop(remote *r, uint32_t i)
{
    r->peers[i] = r->peers[--r->n_peers];
    r->peers_reclaimed++;
}

/* Record a is used less recently than b (ties: the lower index). */
static bool before(const rpeer *peers, uint32_t a, uint32_t b)
{
    return peers[a].last_ns < peers[b].last_ns || (peers[a].last_ns == peers[b].last_ns && a < b);
}

/* The least recently used record that no pull or hint needs: dropped.
 * Candidates are taken in that order, each once. */
static bool record_reclaim_lru(remote *r)
{
    uint32_t prev = UINT32_MAX;
    for (;;) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < r->n_peers; i++)
            if (!r->peers[i].eager && (prev == UINT32_MAX || before(r->peers, prev, i)) &&
                (best == UINT32_MAX || before(r->peers, i, best)))
                best = i;
        if (best == UINT32_MAX) return false;
        if (!has_pull(r, r->peers[best].endpoint)) {
            record_drop(r, best);
            return true;
        }
        prev = best;
    }
}

rpeer *peer_get(remote *r, const char *endpoint, bool create)
{
    uint64_t now = kvcr_now_ns();
    for (uint32_t i = 0; i < r->n_peers; i++)
        if (strcmp(r->peers[i].endpoint, endpoint) == 0) {
            r->peers[i].last_ns = now;
            return &r->peers[i];
        }
    if (!create || strlen(endpoint) > CTL_MAX_ENDPOINT) return NULL;
    uint32_t max = host_conf(r->kv)->max_peers;
    if (r->n_peers >= max && !record_reclaim_lru(r)) {
        peer_refused(r, "a record of source", (int)strlen(endpoint), endpoint);
        return NULL;
    }
    if (r->n_peers == r->cap_peers) {
        uint32_t cap = r->cap_peers ? 2 * r->cap_peers : 16;
        if (cap > max) cap = max;
        rpeer *p = realloc(r->peers, cap * sizeof *p);
        if (p == NULL) return NULL;
        r->peers = p;
        r->cap_peers = cap;
    }
    rpeer *p = &r->peers[r->n_peers++];
    memset(p, 0, sizeof *p);
    strcpy(p->endpoint, endpoint);
    p->last_ns = now;
    return p;
}

void peer_invalidate(remote *r, const char *endpoint)
{
    rpeer *p = peer_get(r, endpoint, false);
    if (p != NULL) p->acked = false, p->retry_ns = 0;
}

void peer_heard(remote *r, const void *endpoint, size_t len, uint64_t now)
{
    char ep[CTL_MAX_ENDPOINT + 1];
    if (len > CTL_MAX_ENDPOINT) return;
    memcpy(ep, endpoint, len);
    ep[len] = '\0';
    rpeer *p = peer_get(r, ep, false);
    if (p != NULL) p->heard_ns = now;
}

void peer_records_sweep(remote *r, uint64_t now)
{
    uint64_t idle = (uint64_t)host_conf(r->kv)->peer_idle_ms * 1000000ull;
    for (uint32_t i = 0; i < r->n_peers;) {
        const rpeer *p = &r->peers[i];
        if (!p->eager && p->last_ns <= now && now - p->last_ns >= idle &&
            !has_pull(r, p->endpoint))
            record_drop(r, i);
        else
            i++;
    }
}
