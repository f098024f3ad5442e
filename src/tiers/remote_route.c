/* The peer tier's routes: how this source writes into a target. A route
 * is made from a target's metadata (its UCX worker address, its regions
 * and their rkeys), belongs to the target's agent name and the CURVE key
 * that announced it, and gets its UCX endpoint on first need
 * (route_connect), or at the end of a turn (route_connect_later,
 * route_ack_later: route_connect_due). Metadata that differs replaces it;
 * a replaced route is kept, refusing new writes, until the writes on it
 * end. All of it lives in remote.routes (route_table). Locked, progress
 * thread, unless a function says otherwise.
 *
 * The bound on routes (config.max_peers). A route is reclaimable when no
 * source write uses it and UCX runs nothing on its endpoint, and it has no
 * usable endpoint (failed, or none made for a target it served: metadata
 * whose endpoint UCX refused) or it was idle for config.peer_idle_ms: its
 * endpoint is closed and it is freed, by the sweep (failed or idle ones,
 * at most once a second, a few at a time: each close waits for UCX) or
 * when a new target comes to a full table (those without a usable
 * endpoint first, then the least recently used). Metadata whose endpoint
 * UCX refuses thus never holds room a real target needs.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/remote_int.h"
#include "util/clock.h"

#define SWEEP_NS 1000000000ull /* the sweep runs at most once a second */
#define SWEEP_ROUTES 8         /* endpoints it closes at most */

void route_init(remote *r)
{
    r->routes.connect_next = UINT64_MAX;
}

/* ---- finding and making a route ------------------------------------------- */

/* The CURVE key a message speaks for: the one in its reply endpoint, which
 * on_message checked against its connection's ("" without CURVE). */
static const char *sender_key(const wire_msg *m)
{
    const char *key = ctl_endpoint_key((const char *)m->from.data);
    return key ? key : "";
}

/* A route belongs to an agent name and the key that announced it, so that
 * a peer holding another key cannot replace (hijack) it by using the name. */
static route *route_find(remote *r, const wire_bytes *agent, const char *key)
{
    for (route *rt = r->routes.live; rt; rt = rt->next)
        if (strlen(rt->agent) == agent->len && memcmp(rt->agent, agent->data, agent->len) == 0 &&
            strcmp(rt->key, key) == 0)
            return rt;
    return NULL;
}

static bool bytes_eq(const uint8_t *a, size_t alen, const wire_bytes *b)
{
    return alen == b->len && (alen == 0 || memcmp(a, b->data, alen) == 0);
}

static bool route_same(const route *rt, const wire_metadata *md)
{
    if (!bytes_eq(rt->worker_addr, rt->worker_len, &md->worker_addr) ||
        rt->n_regions != md->n_regions)
        return false;
    for (uint32_t i = 0; i < md->n_regions; i++) {
        const rregion *a = &rt->regions[i];
        const wire_region *b = &md->regions[i];
        if (!bytes_eq((const uint8_t *)a->label, strlen(a->label), &b->label) ||
            a->framework != b->framework || a->addr != b->addr ||
            a->element_size != b->element_size || a->stride != b->stride ||
            a->count != b->count || !bytes_eq(a->rkey_bytes, a->rkey_len, &b->rkey))
            return false;
    }
    return true;
}

/* The route's endpoint and the rkeys unpacked on it, if any. */
static void route_disconnect(route *rt)
{
    for (uint32_t i = 0; i < rt->n_regions; i++) {
        if (rt->regions[i].rkey) ucx_rkey_destroy(rt->regions[i].rkey);
        rt->regions[i].rkey = NULL;
    }
    if (rt->peer) ucx_peer_close(rt->peer);
    rt->peer = NULL;
}

/* Closes its endpoint (none may be running on it) and frees it. */
static void route_free(route *rt)
{
    route_disconnect(rt);
    for (uint32_t i = 0; i < rt->n_regions; i++) free(rt->regions[i].rkey_bytes);
    free(rt->regions);
    free(rt->geom);
    free(rt->worker_addr);
    free(rt);
}

/* A route from m's metadata: its regions and rkeys as bytes; the UCX
 * endpoint is made later, on first need (route_connect). */
static int route_load(const wire_msg *m, route **out)
{
    const wire_bytes *agent = &m->agent;
    const wire_metadata *md = &m->md;
    route *rt = calloc(1, sizeof *rt);
    if (rt == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    memcpy(rt->agent, agent->data, agent->len);
    snprintf(rt->key, sizeof rt->key, "%s", sender_key(m));
    rt->worker_addr = malloc(md->worker_addr.len);
    rt->regions = calloc(md->n_regions ? md->n_regions : 1, sizeof *rt->regions);
    rt->geom = calloc(md->n_regions ? md->n_regions : 1, sizeof *rt->geom);
    if (rt->worker_addr == NULL || rt->regions == NULL || rt->geom == NULL) {
        route_free(rt);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    memcpy(rt->worker_addr, md->worker_addr.data, md->worker_addr.len);
    rt->worker_len = md->worker_addr.len;
    int rc = 0;
    for (uint32_t i = 0; i < md->n_regions; i++) {
        const wire_region *w = &md->regions[i];
        rregion *g = &rt->regions[i];
        rt->n_regions = i + 1;
        memcpy(g->label, w->label.data, w->label.len);
        g->framework = w->framework;
        g->addr = w->addr;
        g->element_size = w->element_size;
        g->stride = w->stride;
        g->count = w->count;
        rt->geom[i] = (region_geom){g->label, g->framework, g->addr, g->element_size, g->stride,
                                    g->count};
        g->rkey_bytes = malloc(w->rkey.len);
        if (g->rkey_bytes == NULL) {
            rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
            break;
        }
        memcpy(g->rkey_bytes, w->rkey.data, w->rkey.len);
        g->rkey_len = w->rkey.len;
    }
    if (rc != 0) {
        route_free(rt);
        return rc;
    }
    *out = rt;
    return 0;
}

/* ---- the bound on routes (config.max_peers) ------------------------------- */

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
    for (route **l = &r->routes.live; *l; l = &(*l)->next) {
        int rank = reclaim_rank(*l, now, idle, pressed);
        if (rank < best_rank || (rank == best_rank && rank < 2 && (*l)->last_ns < (*best)->last_ns))
            best = l, best_rank = rank;
    }
    if (best == NULL) return false;
    route *rt = *best;
    *best = rt->next;
    r->routes.n--;
    r->routes.reclaimed++;
    kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "route to %s reclaimed (%s)", rt->agent,
             best_rank == 0 ? "no usable endpoint" : "idle");
    route_free(rt);
    return true;
}

/* Before a route to a new target is made: 0 when there is room for it (a
 * reclaimable route closed if need be), else KVCR_ELIMIT, counted and
 * logged at most once a second. */
static int route_admit(remote *r, const wire_bytes *agent)
{
    uint32_t max = host_conf(r->kv)->max_peers;
    if (r->routes.n < max || route_reclaim_lru(r, kvcr_now_ns(), true)) return 0;
    peer_refused(r, "the metadata of target", (int)agent->len, (const char *)agent->data);
    return kvcr_fail(KVCR_ELIMIT, "limit max_peers (%u) reached: no route reclaimable", max);
}

/* The route to the message's sender (its agent name is the logical name).
 * Metadata in the message replaces a route that differs (a restarted or
 * reconfigured target) unless writes to it are running in UCX; writes
 * queued on the old route fail instead of writing through the new one. */
int route_resolve(remote *r, const wire_msg *m, route **out)
{
    route *rt = route_find(r, &m->agent, sender_key(m));
    /* A route whose endpoint failed is made again from the next metadata. */
    bool usable = rt != NULL && (rt->peer == NULL || !ucx_peer_failed(rt->peer));
    if (!m->has_metadata || (usable && route_same(rt, &m->md))) {
        *out = rt;
        if (rt != NULL) rt->last_ns = kvcr_now_ns();
        return rt ? 0 : kvcr_fail(KVCR_ENOENT, "no metadata from this target yet");
    }
    if (rt == NULL && route_admit(r, &m->agent) != 0) return KVCR_ELIMIT;
    if (rt != NULL) {
        if (rt->peer != NULL && ucx_peer_busy(rt->peer) > 0)
            return kvcr_fail(KVCR_EBUSY, "target replaced while writes to it are running");
        route **link = &r->routes.live;
        while (*link != rt) link = &(*link)->next;
        *link = rt->next;
        r->routes.n--;
        rt->replaced = true;
        if (rt->users > 0) {
            rt->next = r->routes.replaced;
            r->routes.replaced = rt;
        } else {
            route_free(rt);
        }
        kvcr_log(host_logger(r->kv), KVCR_LOG_INFO, "target %.*s %s: route replaced",
                 (int)m->agent.len, (const char *)m->agent.data,
                 usable ? "changed its metadata" : "sent metadata after its endpoint failed");
    }
    int rc = route_load(m, &rt);
    if (rc != 0) return rc;
    rt->last_ns = kvcr_now_ns();
    rt->next = r->routes.live;
    r->routes.live = rt;
    r->routes.n++;
    *out = rt;
    return 0;
}

void route_use(route *rt)
{
    rt->users++;
}

void route_release(remote *r, route *rt)
{
    rt->last_ns = kvcr_now_ns(); /* idle from now on, if it was the last user */
    if (--rt->users > 0 || !rt->replaced) return;
    route **link = &r->routes.replaced;
    while (*link != rt) link = &(*link)->next;
    *link = rt->next;
    route_free(rt);
}

/* ---- endpoints ------------------------------------------------------------ */

int route_connect(remote *r, route *rt)
{
    if (rt->peer != NULL) return 0;
    int rc = ucx_peer_connect(r->ucx, rt->worker_addr, rt->worker_len, &rt->peer);
    for (uint32_t i = 0; rc == 0 && i < rt->n_regions; i++) {
        rregion *g = &rt->regions[i];
        rc = ucx_rkey_unpack(rt->peer, g->rkey_bytes, g->rkey_len, &g->rkey);
    }
    if (rc != 0) route_disconnect(rt);
    return rc;
}

void route_connect_later(remote *r, route *rt, uint64_t delay_ns)
{
    if (rt->peer != NULL) return;
    uint64_t at = kvcr_now_ns() + delay_ns;
    if (rt->connect_at == 0 || at < rt->connect_at) rt->connect_at = at;
    if (at < r->routes.connect_next) r->routes.connect_next = at;
}

void route_ack_later(remote *r, route *rt, const wire_msg *m)
{
    snprintf(rt->ack_to, sizeof rt->ack_to, "%.*s", (int)m->from.len, (const char *)m->from.data);
    snprintf(rt->ack_from, sizeof rt->ack_from, "%.*s", (int)m->to.len, (const char *)m->to.data);
    rt->acks_due++; /* each message is counted if unusable */
    route_connect_later(r, rt, 0);
}

/* A route whose endpoint fails to be made keeps none, and the next write
 * that needs one tries again. */
void route_connect_due(remote *r, uint64_t *next_ns)
{
    uint64_t now = kvcr_now_ns();
    if (r->routes.connect_next > now) {
        if (r->routes.connect_next < *next_ns) *next_ns = r->routes.connect_next;
        return;
    }
    r->routes.connect_next = UINT64_MAX;
    for (route *rt = r->routes.live; rt; rt = rt->next) {
        if (rt->connect_at == 0) continue;
        if (rt->connect_at > now) {
            if (rt->connect_at < r->routes.connect_next) r->routes.connect_next = rt->connect_at;
            continue;
        }
        rt->connect_at = 0;
        bool ok = route_connect(r, rt) == 0;
        if (!ok)
            kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "no UCX endpoint to %s yet: %s",
                     rt->agent, kvcr_last_error());
        uint32_t n = rt->acks_due;
        rt->acks_due = 0;
        if (n == 0) continue;
        if (!ok) {
            for (uint32_t i = 0; i < n; i++)
                remote_drop(r, CTL_DROP_UNUSABLE, "metadata from %s not usable: %s", rt->agent,
                            kvcr_last_error());
            continue;
        }
        wire_bytes from = {(const uint8_t *)rt->ack_from, strlen(rt->ack_from)};
        wire_msg ack = {.type = WIRE_METADATA_ACK, .from = from};
        send_msg(r, rt->ack_to, &ack, MD_NEVER);
    }
}

/* ---- the sweep, the gauges, the end --------------------------------------- */

void peers_sweep(remote *r, uint64_t now, uint64_t *next_ns)
{
    if (now < r->routes.sweep_ns) {
        if (r->routes.sweep_ns < *next_ns) *next_ns = r->routes.sweep_ns;
        return;
    }
    r->routes.sweep_ns = now + SWEEP_NS;
    for (int i = 0; i < SWEEP_ROUTES && route_reclaim_lru(r, now, false); i++) continue;
    peer_records_sweep(r, now);
}

void route_gauges(const remote *r, gauge_sink *s)
{
    gauge_sink_add(s, "", "peer_routes", (double)r->routes.n);
    gauge_sink_add(s, "", "peer_routes_reclaimed", (double)r->routes.reclaimed);
}

static void free_routes(route **list)
{
    while (*list) {
        route *rt = *list;
        *list = rt->next;
        route_free(rt);
    }
}

void route_close_all(remote *r)
{
    free_routes(&r->routes.live);
    free_routes(&r->routes.replaced);
}
