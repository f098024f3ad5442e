/* Source side of the peer tier.
 *
 * A start_write is checked and fenced on the progress thread, which claims
 * the keys READY in KVCR DRAM at once (the fast path). Keys only the
 * framework holds are pinned through the framework on the polling thread
 * (remote_pin.c); the write waits for its pins and goes on. The progress
 * thread then puts the bytes with UCX, flushes, and only then says
 * write_done; or, when the target asked for them inline (a small pull),
 * copies them into the write_done itself and uses no UCX at all. Claims are
 * held until UCX gives the write back, so KVCR-owned source memory is never
 * reused while a write may read it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/remote_int.h"
#include "util/clock.h"

#define MS 1000000ull

static void copy_str(char *dst, size_t cap, const wire_bytes *b)
{
    snprintf(dst, cap, "%.*s", (int)b->len, (const char *)b->data);
}

/* ---- fences: (target agent, op) -> status --------------------------------- */

static uint32_t wstat_bucket(const remote *r, const char *agent, int64_t op)
{
    uint64_t h = host_key_hash((const uint8_t *)agent, strlen(agent)) ^ (uint64_t)op * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h % r->n_wbuckets);
}

static wstat *wstat_find(remote *r, const char *agent, int64_t op)
{
    if (r->n_wbuckets == 0) return NULL;
    for (wstat *w = r->wstats[wstat_bucket(r, agent, op)]; w; w = w->next)
        if (w->op == op && strcmp(w->agent, agent) == 0) return w;
    return NULL;
}

static wstat *wstat_add(remote *r, const char *agent, int64_t op)
{
    if (r->n_wbuckets == 0) {
        r->wstats = calloc(1024, sizeof *r->wstats);
        if (r->wstats == NULL) return NULL;
        r->n_wbuckets = 1024;
    }
    wstat *w = calloc(1, sizeof *w);
    if (w == NULL) return NULL;
    snprintf(w->agent, sizeof w->agent, "%s", agent);
    w->op = op;
    uint32_t b = wstat_bucket(r, agent, op);
    w->next = r->wstats[b];
    r->wstats[b] = w;
    r->n_wstats++;
    return w;
}

/* Fences of ended writes are kept for twice the abandon timeout: long
 * enough that a late duplicate or probe still finds them. */
static void wstat_prune(remote *r, uint64_t now)
{
    uint64_t keep = 2ull * host_conf(r->kv)->abandon_timeout_ms * MS;
    for (uint32_t b = 0; b < r->n_wbuckets; b++)
        for (wstat **link = &r->wstats[b]; *link;) {
            wstat *w = *link;
            if (w->sw == NULL && w->ended_ns != 0 && now - w->ended_ns > keep) {
                *link = w->next;
                free(w);
                r->n_wstats--;
            } else {
                link = &w->next;
            }
        }
}

/* ---- replies -------------------------------------------------------------- */

/* Without CURVE nothing ties a message's reply endpoint ("from") to its
 * sender, so junk naming endless endpoints could make this process open
 * connections to all of them. Refusals and probe answers (what any
 * stranger's message earns) go to an endpoint we hold no connection to at
 * most STRANGER_REPLIES_PER_S times a second; the rest are dropped and
 * counted (cause reply_limited). A real peer's refusal or probe answer is
 * then late, not lost for good: its operation ends by its deadline and the
 * next attempt finds budget again. Replies that follow a route made from
 * the message's metadata are not limited: a UCX endpoint was made first. */
#define STRANGER_REPLIES_PER_S 16

/* Locked, progress thread: whether a refusal or probe answer may go to to. */
static bool stranger_budget(remote *r, const char *to, const wire_msg *req)
{
    if (ctl_connected(r->ctl, to)) return true;
    uint64_t now = kvcr_now_ns();
    if (now - r->stranger_window_ns >= 1000 * MS) {
        r->stranger_window_ns = now;
        r->stranger_replies = 0;
    }
    if (r->stranger_replies < STRANGER_REPLIES_PER_S) {
        r->stranger_replies++;
        return true;
    }
    remote_drop(r, CTL_DROP_REPLY_LIMITED,
                "no reply to a %s from %.*s: %d replies this second to endpoints without a "
                "connection (%.*s)",
                wire_type_name(req->type), (int)req->agent.len, (const char *)req->agent.data,
                STRANGER_REPLIES_PER_S, (int)req->from.len, (const char *)req->from.data);
    return false;
}

/* Locked, progress thread: m to req's sender; limited: only within the
 * budget of replies to strangers (above). */
static void reply(remote *r, const wire_msg *req, wire_msg *m, bool limited)
{
    char to[CTL_MAX_ENDPOINT + 1];
    copy_str(to, sizeof to, &req->from);
    if (limited && !stranger_budget(r, to, req)) return;
    m->from = req->to; /* our address as the sender used it */
    send_msg(r, to, m, MD_NEVER);
}

static void refuse(remote *r, const wire_msg *req, const char *why)
{
    kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "start_write %lld from %.*s refused: %s",
             (long long)req->op, (int)req->agent.len, (const char *)req->agent.data, why);
    wire_msg m = {.type = WIRE_WRITE_REFUSED, .has_op = true, .op = req->op};
    reply(r, req, &m, true);
}

/* A start_write refused at one of the limits (kvcr_limits): the target
 * fails its entries SOURCE_BUSY and keeps this source (it is not dead). */
static void refuse_busy(remote *r, const char *limit, int64_t op, const char *agent,
                        const char *to, wire_bytes reflected)
{
    host_refusal(r->kv, limit);
    kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "start_write %lld from %s refused: limit %s reached",
             (long long)op, agent, limit);
    wire_msg m = {.type = WIRE_WRITE_REFUSED, .has_op = true, .op = op, .busy = true,
                  .from = reflected};
    send_msg(r, to, &m, MD_NEVER);
}

/* The limit a new write on route rt would break, or NULL. Per peer counts
 * the writes still being served on the peer's route (the target's view: it
 * has not been answered); the total counts every write held, also those
 * ended and waiting for the next poll to release their claims (the memory). */
static const char *write_limit(const remote *r, const route *rt)
{
    const kvcr_limits *l = &host_conf(r->kv)->limits;
    if (rt->users >= l->max_source_writes_per_peer) return "source_writes_per_peer";
    return r->n_swrites >= l->max_source_writes ? "source_writes" : NULL;
}

/* The runs and bytes of an inline write, read from its sources now (the
 * claims and pins it holds keep them): runs contiguous on both sides are
 * merged. False: over WIRE_MAX_INLINE, or out of memory. */
static bool inline_bytes(const swrite *sw, wire_msg *m)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < sw->n_segs; i++) total += sw->segs[i].len;
    if (total == 0 || total > WIRE_MAX_INLINE) return false;
    wire_run *runs = calloc(sw->n_segs, sizeof *runs);
    uint8_t *data = malloc(total);
    if (runs == NULL || data == NULL) {
        free(runs);
        free(data);
        return false;
    }
    uint32_t n = 0;
    size_t off = 0;
    for (uint32_t i = 0; i < sw->n_segs; i++) {
        const ucx_seg *g = &sw->segs[i];
        memcpy(data + off, g->src, g->len);
        off += g->len;
        if (n > 0 && runs[n - 1].addr + runs[n - 1].len == g->remote_addr)
            runs[n - 1].len += g->len;
        else
            runs[n++] = (wire_run){g->remote_addr, g->len};
    }
    m->has_inline = true;
    m->n_runs = n;
    m->runs = runs;
    m->inline_data = (wire_bytes){data, total};
    return true;
}

/* Locked: sw's durations until now, for its write_done (net/wire.h). Its
 * pin wait and data time are disjoint parts of the time served, on one
 * clock; serve is raised to cover them should that clock ever say
 * otherwise, so that the encoder never refuses the answer. */
static wire_times times_of(const swrite *sw)
{
    wire_times t = {kvcr_now_ns() - sw->start_ns, sw->pin_ns, sw->data_ns};
    if (t.pin_ns + t.data_ns > t.serve_ns) t.serve_ns = t.pin_ns + t.data_ns;
    return t;
}

/* The write_done of sw; returns whether it said success (an inline write
 * whose bytes cannot be gathered says failure). */
static bool send_done(remote *r, swrite *sw, bool success, bool terminal)
{
    uint32_t *completed = NULL, n = 0;
    wire_msg in = {0};
    if (success && sw->inline_write && sw->n_segs > 0) {
        uint64_t t0 = kvcr_now_ns(); /* an inline write's data time is its copy */
        if (!inline_bytes(sw, &in)) success = false;
        sw->data_ns = kvcr_now_ns() - t0;
    }
    if (success) {
        completed = calloc(sw->n_keys ? sw->n_keys : 1, sizeof *completed);
        if (completed == NULL) success = false;
        for (uint32_t i = 0; completed && i < sw->n_keys; i++)
            if (sw->keys[i].included) completed[n++] = i;
    }
    wire_msg m = {.type = WIRE_WRITE_DONE, .has_op = true, .op = sw->op, .success = success,
                  .terminal = terminal, .n_completed = n, .completed = completed};
    if (success && sw->state == SW_POSTED && sw->by_messages) {
        /* Sent as messages: the target waits until it has taken them all. */
        m.has_am_bytes = true;
        for (uint32_t i = 0; i < sw->n_segs; i++) m.am_bytes += sw->segs[i].len;
    }
    if (success && in.has_inline) {
        m.has_inline = true;
        m.n_runs = in.n_runs;
        m.runs = in.runs;
        m.inline_data = in.inline_data;
    }
    m.has_times = true;
    m.times = times_of(sw);
    m.from = (wire_bytes){(const uint8_t *)sw->reflected, strlen(sw->reflected)};
    send_msg(r, sw->reply_to, &m, MD_NEVER);
    free(completed);
    free(in.runs);
    free((void *)in.inline_data.data);
    return success;
}

/* ---- source writes: life cycle -------------------------------------------- */

static void list_push(swrite **head, swrite **tail, swrite *sw)
{
    sw->list_next = NULL;
    if (*tail)
        (*tail)->list_next = sw;
    else
        *head = sw;
    *tail = sw;
}

static void to_main(remote *r, swrite *sw)
{
    if (sw->on_main) return;
    sw->on_main = true;
    list_push(&r->sw_main, &r->sw_main_tail, sw);
    remote_owe_main(r);
}

static void to_post(remote *r, swrite *sw)
{
    if (sw->pin_from_ns != 0) { /* its wait for pins is over */
        sw->pin_ns = kvcr_now_ns() - sw->pin_from_ns;
        sw->pin_from_ns = 0;
    }
    sw->state = SW_READY;
    if (sw->on_post) return;
    sw->on_post = true;
    list_push(&r->sw_post, &r->sw_post_tail, sw);
    remote_wake(r);
}

/* The write is over on the progress side: main releases what it holds. */
static void sw_end(remote *r, swrite *sw)
{
    r->n_serving--;
    route_release(r, sw->route);
    sw->route = NULL;
    sw->state = SW_DONE;
    if (sw->status) sw->status->ended_ns = kvcr_now_ns();
    to_main(r, sw);
}

static void sw_free(swrite *sw)
{
    free(sw->keys);
    free(sw->key_bytes);
    free(sw->dst);
    free(sw->dpieces);
    free(sw->wait_reqs);
    free(sw->segs);
    free(sw);
}

/* Resolves every destination ref of m against the target's regions
 * (core/conf.h's resolver: a block in parts is several pieces), into
 * sw->dst and its pieces sw->dpieces. */
static const char *resolve_dst(remote *r, const wire_msg *m, const route *rt, swrite *sw)
{
    mem_piece pc[PIECES_MAX];
    for (uint32_t i = 0; i < m->ref_off[m->n_keys]; i++) {
        const wire_ref *ref = &m->refs[i];
        sw_dst *d = &sw->dst[i];
        copy_str(d->label, sizeof d->label, &ref->label);
        const char *why = NULL;
        uint32_t n = pieces_resolve(rt->geom, rt->n_regions, ref->framework, d->label, ref->index,
                                    pc, &why);
        if (n == 0)
            return strcmp(why, "index out of range") == 0
                       ? "a destination index is out of its region"
                       : "a destination names a region the target never published";
        int pool = host_label_pool(r->kv, d->label);
        if (pool < 0) return "a destination names a pool this source does not have";
        host_pool pi;
        host_pool_info(r->kv, (uint32_t)pool, &pi);
        uint64_t bytes = 0;
        for (uint32_t k = 0; k < n; k++) bytes += pc[k].len;
        if (bytes != pi.block_size)
            return "a destination's element size differs from this source's block size";
        if (n > sw->cap_dpieces - sw->n_dpieces) {
            uint32_t cap = sw->cap_dpieces * 2 > sw->n_dpieces + n ? sw->cap_dpieces * 2
                                                                   : sw->n_dpieces + n;
            mem_piece *grown = realloc(sw->dpieces, cap * sizeof *grown);
            if (grown == NULL) return "out of memory";
            sw->dpieces = grown;
            sw->cap_dpieces = cap;
        }
        memcpy(&sw->dpieces[sw->n_dpieces], pc, n * sizeof *pc);
        d->piece_off = sw->n_dpieces;
        d->n_pieces = n;
        sw->n_dpieces += n;
        d->pool = (uint32_t)pool;
        d->framework = ref->framework;
        d->index = ref->index;
    }
    return NULL;
}

static swrite *sw_new(remote *r, const wire_msg *m, route *rt, const char **why)
{
    uint32_t n_refs = m->ref_off[m->n_keys];
    size_t key_bytes = 0;
    for (uint32_t i = 0; i < m->n_keys; i++) key_bytes += m->keys[i].len;
    swrite *sw = calloc(1, sizeof *sw);
    if (sw) {
        sw->keys = calloc(m->n_keys, sizeof *sw->keys);
        sw->key_bytes = malloc(key_bytes);
        sw->dst = calloc(n_refs, sizeof *sw->dst);
    }
    if (!sw || !sw->keys || !sw->key_bytes || !sw->dst) {
        if (sw) sw_free(sw);
        *why = "out of memory";
        return NULL;
    }
    if ((*why = resolve_dst(r, m, rt, sw)) != NULL) {
        sw_free(sw);
        return NULL;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < m->n_keys; i++) {
        sw_key *k = &sw->keys[i];
        memcpy(sw->key_bytes + off, m->keys[i].data, m->keys[i].len);
        *k = (sw_key){.key_off = (uint32_t)off, .key_len = (uint32_t)m->keys[i].len,
                      .dst_off = m->ref_off[i], .n_dst = m->ref_off[i + 1] - m->ref_off[i],
                      .local = TIER_BLOCK_NONE};
        off += m->keys[i].len;
    }
    sw->n_keys = m->n_keys;
    sw->n_dst = n_refs;
    sw->owner = r;
    sw->route = rt;
    sw->op = m->op;
    sw->inline_write = m->inline_write;
    sw->puts_agreed = m->has_put_min;
    for (uint32_t i = 0; i < sw->n_dpieces && sw->puts_agreed; i++)
        sw->puts_agreed = sw->dpieces[i].len >= m->put_min;
    copy_str(sw->agent, sizeof sw->agent, &m->agent);
    copy_str(sw->reply_to, sizeof sw->reply_to, &m->from);
    copy_str(sw->reflected, sizeof sw->reflected, &m->to);
    return sw;
}

/* Claims every key READY in KVCR DRAM (in exactly the destination's
 * layout of pools) that is not claimed yet. */
static bool claim_local(remote *r, swrite *sw)
{
    bool all = true;
    uint32_t pools[256];
    for (uint32_t i = 0; i < sw->n_keys; i++) {
        sw_key *k = &sw->keys[i];
        if (k->local != TIER_BLOCK_NONE) continue;
        const uint8_t *key = sw->key_bytes + k->key_off;
        uint32_t n = k->n_dst < 256 ? k->n_dst : 256;
        for (uint32_t j = 0; j < n; j++) pools[j] = sw->dst[k->dst_off + j].pool;
        if (n == k->n_dst) k->local = host_claim_ready(r->kv, key, k->key_len, pools, n);
        all &= k->local != TIER_BLOCK_NONE;
    }
    return all;
}

/* Where segment j of key k is read from: the claimed KVCR DRAM block,
 * else the framework references its pin gave, as pieces whose region
 * indexes r->mems. 0: not served (no source, or the framework's layout
 * differs). */
static uint32_t segment_source(remote *r, const sw_key *k, uint32_t j, const sw_dst *d,
                               mem_piece *out)
{
    const kvcr_conf *conf = host_conf(r->kv);
    if (k->local != TIER_BLOCK_NONE) {
        tier_dst seg;
        if (!host_block_segment(r->kv, k->local, j, &seg)) return 0;
        out[0] = (mem_piece){(uint64_t)(uintptr_t)seg.addr, seg.len,
                             (uint32_t)conf->n_regions + seg.pool};
        return 1;
    }
    if (k->fw_refs == NULL || k->n_dst != k->n_fw) return 0;
    uint32_t pool;
    uint32_t n = host_ref_pieces(r->kv, &k->fw_refs[j], out, &pool);
    return pool == d->pool ? n : 0; /* another layout: not served */
}

/* Room for n more segments in sw->segs. */
static bool segs_room(swrite *sw, uint32_t n)
{
    if (n <= sw->cap_segs - sw->n_segs) return true;
    uint32_t cap = sw->cap_segs * 2 > sw->n_segs + n ? sw->cap_segs * 2 : sw->n_segs + n;
    ucx_seg *grown = realloc(sw->segs, cap * sizeof *grown);
    if (grown == NULL) return false;
    sw->segs = grown;
    sw->cap_segs = cap;
    return true;
}

/* Key k's segments, appended to sw->segs: each destination's source and
 * target pieces paired (either side may be a block in parts). False: the
 * key is not served (nothing appended). */
static bool key_segments(remote *r, swrite *sw, const sw_key *k, uint64_t *bytes)
{
    mem_piece src[PIECES_MAX];
    piece_pair pairs[2 * PIECES_MAX];
    uint32_t first = sw->n_segs;
    *bytes = 0;
    for (uint32_t j = 0; j < k->n_dst; j++) {
        const sw_dst *d = &sw->dst[k->dst_off + j];
        uint32_t ns = segment_source(r, k, j, d, src);
        host_pool pi;
        host_pool_info(r->kv, d->pool, &pi);
        uint64_t src_bytes = 0;
        for (uint32_t q = 0; q < ns; q++) src_bytes += src[q].len;
        uint32_t np = src_bytes == pi.block_size
                          ? pieces_pair(src, ns, &sw->dpieces[d->piece_off], d->n_pieces, pairs)
                          : 0;
        if (np == 0 || !segs_room(sw, np)) {
            sw->n_segs = first;
            return false;
        }
        for (uint32_t q = 0; q < np; q++)
            sw->segs[sw->n_segs++] =
                (ucx_seg){(const void *)(uintptr_t)pairs[q].a, r->mems[pairs[q].a_region],
                          pairs[q].b, sw->route->regions[pairs[q].b_region].rkey, pairs[q].len};
        *bytes += pi.block_size;
    }
    return true;
}

/* Fixes the sources: KVCR DRAM first, then framework pins; builds the
 * segments of the included keys and hands the write to the progress
 * thread. */
static void assemble(remote *r, swrite *sw)
{
    sw->n_segs = 0;
    sw->n_blocks = 0;
    sw->bytes = 0;
    for (uint32_t i = 0; i < sw->n_keys && !sw->forced_fail; i++) {
        sw_key *k = &sw->keys[i];
        uint64_t bytes = 0;
        k->included = key_segments(r, sw, k, &bytes);
        if (!k->included) continue;
        sw->n_blocks += k->n_dst;
        sw->bytes += bytes;
    }
    to_post(r, sw);
}

/* ---- accepting start_write (progress thread, locked) ---------------------- */

static bool inc_ours(const remote *r, const wire_bytes *b)
{
    return b->len == WIRE_INCARNATION_LEN && memcmp(b->data, r->inc, WIRE_INCARNATION_LEN) == 0;
}

static void on_start_write(remote *r, const wire_msg *m)
{
    kvcr_t *kv = r->kv;
    uint64_t taken_ns = kvcr_now_ns(); /* served from here: a first endpoint counts */
    route *rt = NULL;
    int rc = route_resolve(r, m, &rt);
    if (rc != 0 || (!m->inline_write && route_connect(r, rt) != 0)) {
        if (rc == KVCR_ELIMIT) { /* a new target past max_peers (counted): SOURCE_BUSY */
            wire_msg busy = {.type = WIRE_WRITE_REFUSED, .has_op = true, .op = m->op, .busy = true};
            reply(r, m, &busy, true);
        } else {
            refuse(r, m, kvcr_last_error());
        }
        return;
    }
    /* An inline write makes no UCX endpoint first: a target we hold neither
     * an endpoint nor a control connection to is a stranger (see above). */
    char from[CTL_MAX_ENDPOINT + 1];
    copy_str(from, sizeof from, &m->from);
    if (m->inline_write && rt->peer == NULL && !stranger_budget(r, from, m)) return;
    const char *why = NULL;
    swrite *sw = sw_new(r, m, rt, &why);
    if (sw == NULL) {
        refuse(r, m, why);
        return;
    }
    sw->start_ns = taken_ns;
    if (m->has_metadata) {
        wire_msg ack = {.type = WIRE_METADATA_ACK, .has_op = true, .op = m->op};
        reply(r, m, &ack, false);
    }
    wstat *st = wstat_find(r, sw->agent, m->op);
    if (st != NULL) { /* a duplicate, or fenced by a probe that overtook it */
        if (st->cancel_requested && !st->submitted) send_done(r, sw, false, true);
        sw_free(sw);
        return;
    }
    const char *refusal = r->stop ? "stopping"
                          : r->stalled ? "source_stalled"
                          : m->has_expected_inc && !inc_ours(r, &m->expected_inc)
                              ? "incarnation_mismatch"
                              : NULL;
    const char *limit = refusal == NULL ? write_limit(r, rt) : NULL;
    if (limit != NULL) { /* no fence: nothing was accepted */
        refuse_busy(r, limit, m->op, sw->agent, sw->reply_to, m->to);
        sw_free(sw);
        return;
    }
    if (refusal == NULL && (st = wstat_add(r, sw->agent, m->op)) == NULL) refusal = "out of memory";
    if (refusal != NULL) { /* nothing was accepted: a refusal, honoured by any incarnation */
        refuse(r, m, refusal);
        sw_free(sw);
        return;
    }
    uint64_t now = kvcr_now_ns();
    const kvcr_conf *conf = host_conf(kv);
    double budget = m->remaining_ms < conf->operation_timeout_ms ? m->remaining_ms
                                                                 : conf->operation_timeout_ms;
    sw->deadline_ns = now + (uint64_t)(budget * 1e6);
    sw->number = r->next_source_no++;
    route_use(rt);
    sw->status = st;
    st->sw = sw;
    sw->next = r->swrites;
    if (r->swrites) r->swrites->prev = sw;
    r->swrites = sw;
    r->n_swrites++;
    if (++r->n_serving > r->max_serving_seen) r->max_serving_seen = r->n_serving;
    if (claim_local(r, sw) || conf->cb.request_pin == NULL) {
        assemble(r, sw);
    } else {
        sw->state = SW_PINNING; /* the polling thread asks the framework */
        sw->pin_from_ns = now;
        to_main(r, sw);
    }
}

static void on_metadata(remote *r, const wire_msg *m)
{
    route *rt;
    if (route_resolve(r, m, &rt) != 0) {
        remote_drop(r, CTL_DROP_UNUSABLE, "metadata from %.*s not usable: %s", (int)m->agent.len,
                    (const char *)m->agent.data, kvcr_last_error());
        return;
    }
    if (rt->peer != NULL) {
        wire_msg ack = {.type = WIRE_METADATA_ACK};
        reply(r, m, &ack, false);
        return;
    }
    /* The endpoint is made ahead of the writes that will need it, but after
     * this turn's messages: a start_write right behind the metadata (a
     * hint's eager connect just before its deliver) is answered first. The
     * metadata is acknowledged once the endpoint is made. */
    route_ack_later(r, rt, m);
}

/* A probe: fence the write, say whether it can still happen. A probe
 * for a retired incarnation is answered with its death, which frees the
 * target's memory at once instead of never. */
static void on_probe(remote *r, const wire_msg *m)
{
    char agent[WIRE_MAX_NAME + 1];
    copy_str(agent, sizeof agent, &m->agent);
    wstat *st = wstat_find(r, agent, m->op);
    bool ours = !m->has_expected_inc || inc_ours(r, &m->expected_inc);
    if (ours) {
        if (st == NULL) st = wstat_add(r, agent, m->op);
        if (st != NULL) {
            st->cancel_requested = true;
            if (st->sw == NULL && st->ended_ns == 0) st->ended_ns = kvcr_now_ns();
        }
    }
    /* Terminal: never posted to UCX, or over in UCX (ended_ns is set only
     * once its completion came). A write whose write_done was lost (a
     * connection that failed with it queued) is over too: without this its
     * target's memory would wait for the UCX endpoint to die. */
    wire_msg ack = {.type = WIRE_WRITE_PROBE_ACK, .has_op = true, .op = m->op,
                    .terminal = ours && (st == NULL || !st->submitted || st->ended_ns != 0)};
    if (!ours && host_retired(r->kv, m->expected_inc.data, m->expected_inc.len)) {
        ack.has_dead_inc = true;
        ack.dead_inc = m->expected_inc;
        kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "probe from %s for a retired incarnation: over",
                 agent);
    }
    reply(r, m, &ack, true);
}

void source_on_message(remote *r, const wire_msg *m)
{
    switch (m->type) {
    case WIRE_METADATA: on_metadata(r, m); break;
    case WIRE_START_WRITE: on_start_write(r, m); break;
    default: on_probe(r, m); break;
    }
}

/* ---- posting and UCX completion (progress thread) ------------------------- */

/* Locked, progress thread: the write's outcome in the metrics. */
static void account(remote *r, swrite *sw)
{
    host_observe(r->kv, "source_write", sw->success ? "success" : "failed",
                 kvcr_ns_to_s(kvcr_now_ns() - sw->start_ns));
    if (sw->success) host_count(r->kv, "source_write", sw->n_blocks, sw->bytes);
}

/* docs/BENCHMARKS.md, "First contact": a first inline answer's tail. */
#define INLINE_CONNECT_DELAY_MS 10

/* Locked, progress thread: an inline write is over at once: its bytes go
 * in its write_done, nothing goes with UCX (so it is never "submitted": a
 * probe finds it terminal). The route's endpoint is made for the writes
 * that will need it, INLINE_CONNECT_DELAY_MS later: an endpoint over TCP
 * costs both hosts CPU time (the target's UCX answers its connection),
 * which would compete with the target taking this answer. A write that
 * needs the endpoint sooner makes it at once (on_start_write). */
static void post_inline(remote *r, swrite *sw)
{
    route_connect_later(r, sw->route, INLINE_CONNECT_DELAY_MS * 1000000ull);
    sw->success = send_done(r, sw, true, true);
    account(r, sw);
    sw_end(r, sw);
}

swrite *source_take_posts(remote *r)
{
    swrite *ready = NULL, *tail = NULL;
    while (r->sw_post) {
        swrite *sw = r->sw_post;
        r->sw_post = sw->list_next;
        sw->on_post = false;
        bool fenced = sw->status && sw->status->cancel_requested;
        bool late = kvcr_now_ns() >= sw->deadline_ns;
        bool unreachable = sw->route->replaced ||
                           (!sw->inline_write && ucx_peer_failed(sw->route->peer));
        if (sw->busy != NULL) { /* nothing was posted: refused like a new write */
            wire_bytes us = {(const uint8_t *)sw->reflected, strlen(sw->reflected)};
            refuse_busy(r, sw->busy, sw->op, sw->agent, sw->reply_to, us);
            sw_end(r, sw);
        } else if (sw->forced_fail || fenced || late || r->stalled || unreachable) {
            send_done(r, sw, false, true);
            sw_end(r, sw);
        } else if (sw->n_segs == 0) {
            send_done(r, sw, true, true); /* nothing to write: every key is a miss */
            sw_end(r, sw);
        } else if (sw->inline_write) {
            post_inline(r, sw);
        } else {
            sw->state = SW_POSTED;
            sw->status->submitted = true;
            list_push(&ready, &tail, sw);
        }
    }
    r->sw_post_tail = NULL;
    return ready;
}

static void on_ucx_done(void *ud, int status)
{
    swrite *sw = ud;
    sw->ucx_status = status;
    sw->data_ns = kvcr_now_ns() - sw->data_from_ns;
    sw->ucx_next = sw->owner->ucx_done;
    sw->owner->ucx_done = sw;
}

void source_post(remote *r, swrite *sw)
{
    /* Puts over message lanes only where the target agreed (put_min): it
     * then treats the write as a put, never as quiet at its deadline. */
    sw->by_messages = ucx_write_messages(sw->route->peer, sw->puts_agreed);
    sw->data_from_ns = kvcr_now_ns();
    int rc = ucx_write_as(sw->route->peer, sw->segs, sw->n_segs, (uint64_t)sw->op,
                          sw->puts_agreed, on_ucx_done, sw);
    if (rc != 0) on_ucx_done(sw, rc); /* nothing was posted */
    (void)r;
}

void source_ucx_settle(remote *r)
{
    kvcr_t *kv = r->kv;
    swrite *list = r->ucx_done;
    r->ucx_done = NULL;
    for (swrite *sw = list, *next; sw; sw = next) {
        next = sw->ucx_next;
        sw->success = sw->ucx_status == 0 && !sw->cancel_pending;
        if (sw->ucx_status != 0)
            kvcr_log(host_logger(kv), KVCR_LOG_WARN, "write %llu to %s failed in UCX (%d)",
                     (unsigned long long)sw->number, sw->agent, sw->ucx_status);
        send_done(r, sw, sw->success, true);
        if (sw->abandoned)
            rcb_resilience(r, KVCR_TRANSFER_QUIESCED, true, sw->number, NULL, 0,
                           "source write %llu to %s is quiet now",
                           (unsigned long long)sw->number, sw->agent);
        account(r, sw);
        sw_end(r, sw);
    }
}

/* Framework references of the included keys: what an abandoned write may
 * still read. */
static void report_abandoned(remote *r, swrite *sw)
{
    size_t n = 0;
    for (uint32_t i = 0; i < sw->n_keys; i++)
        if (sw->keys[i].included && sw->keys[i].local == TIER_BLOCK_NONE) n += sw->keys[i].n_dst;
    kvcr_mem_ref *refs = n ? calloc(n, sizeof *refs) : NULL;
    size_t k = 0;
    for (uint32_t i = 0; refs && i < sw->n_keys; i++) {
        const sw_key *key = &sw->keys[i];
        if (!key->included || key->local != TIER_BLOCK_NONE) continue;
        for (uint32_t j = 0; j < key->n_dst; j++) refs[k++] = key->fw_refs[j];
    }
    rcb_resilience(r, KVCR_TRANSFER_UNCERTAIN, true, sw->number, refs, refs ? n : 0,
                   "source write %llu to %s outlived its abandon deadline: its sources may still "
                   "be read",
                   (unsigned long long)sw->number, sw->agent);
    free(refs);
}

void source_timers(remote *r, uint64_t now, uint64_t *next_ns)
{
    static const uint64_t prune_every = 1000 * MS;
    const kvcr_conf *conf = host_conf(r->kv);
    uint64_t extra = (uint64_t)(conf->abandon_timeout_ms - conf->operation_timeout_ms) * MS;
    for (swrite *sw = r->swrites; sw; sw = sw->next) {
        if (sw->state != SW_POSTED) continue;
        bool fenced = sw->status && sw->status->cancel_requested;
        if (!sw->cancel_pending && (fenced || now >= sw->deadline_ns)) {
            sw->cancel_pending = true;
            sw->cancel_deadline_ns = sw->deadline_ns + extra;
            send_done(r, sw, false, false); /* a non-terminal notice */
        }
        if (sw->cancel_pending && !sw->abandoned && now >= sw->cancel_deadline_ns) {
            sw->abandoned = true;
            report_abandoned(r, sw);
            to_main(r, sw); /* framework pins go back now; claims stay */
            /* A target that has not taken a write for a whole abandon
             * timeout is dead or stuck: the endpoint is closed by force,
             * which ends every write on it (settled at the next turn, each
             * then QUIESCED) instead of holding their claims for ever. */
            ucx_peer_abort(sw->route->peer);
        }
        uint64_t t = sw->cancel_pending ? sw->cancel_deadline_ns : sw->deadline_ns;
        if (!sw->abandoned && t < *next_ns) *next_ns = t;
    }
    if (now - r->last_prune_ns > prune_every) {
        r->last_prune_ns = now;
        wstat_prune(r, now);
    }
}

bool source_idle(const remote *r)
{
    for (const swrite *sw = r->swrites; sw; sw = sw->next)
        if (sw->state == SW_POSTED) return false;
    return true;
}

/* Closing: writes not posted yet end failed; posted ones finish in UCX. */
void source_stop(remote *r)
{
    for (swrite *sw = r->swrites; sw; sw = sw->next)
        if (sw->state == SW_PINNING && !sw->forced_fail) {
            sw->forced_fail = true;
            to_post(r, sw);
        }
}

/* ---- the main side (polling thread, locked) ------------------------------ */

/* Claim what KVCR DRAM has, reuse pins, join pending pin
 * requests, ask for the rest; once nothing is pending, fix the sources. */
void source_resume(remote *r, swrite *sw)
{
    uint64_t now = kvcr_now_ns();
    if (sw->forced_fail || r->exited || now >= sw->deadline_ns ||
        (sw->status && sw->status->cancel_requested)) {
        sw->forced_fail = true;
        sw->n_wait = 0;
        to_post(r, sw);
        return;
    }
    claim_local(r, sw);
    uint32_t *need = calloc(sw->n_keys, sizeof *need), n_need = 0;
    for (uint32_t i = 0; i < sw->n_keys; i++) {
        sw_key *k = &sw->keys[i];
        if (k->local != TIER_BLOCK_NONE || k->fw_refs != NULL) continue;
        const uint8_t *key = sw->key_bytes + k->key_off;
        fwres *f = pin_fwres_find(r, key, k->key_len);
        uint64_t req;
        if (f != NULL) {
            pin_bind(sw, k, f);
        } else if (pin_req_covering(r, key, k->key_len, &req)) {
            pin_wait_add(sw, req);
        } else if (need != NULL && !k->asked) { /* each key is asked for once per write */
            k->asked = true;
            need[n_need++] = i;
        }
    }
    if (n_need > 0 && r->n_pin_reqs >= host_conf(r->kv)->limits.max_pin_requests) {
        /* Not asked: the write is refused whole, before anything is written. */
        free(need);
        sw->busy = "pin_requests";
        sw->forced_fail = true;
        sw->n_wait = 0;
        to_post(r, sw);
        return;
    }
    if (n_need > 0 && !pin_request(r, sw, need, n_need))
        kvcr_log(host_logger(r->kv), KVCR_LOG_ERROR,
                 "out of memory: no pin request for a peer's write");
    free(need);
    if (sw->n_wait == 0) assemble(r, sw);
}

/* Ends what a write holds on the polling thread: pin holds, and claims
 * (only once UCX gave it back). */
static void settle_done(remote *r, swrite *sw)
{
    pin_unhold(r, sw);
    for (uint32_t i = 0; i < sw->n_keys; i++) {
        tier_block id = sw->keys[i].local;
        if (id != TIER_BLOCK_NONE) host_unclaim(r->kv, id, sw->success && sw->keys[i].included);
    }
    if (sw->status) sw->status->sw = NULL;
    if (sw->prev)
        sw->prev->next = sw->next;
    else
        r->swrites = sw->next;
    if (sw->next) sw->next->prev = sw->prev;
    r->n_swrites--;
    sw_free(sw);
}

void source_main(remote *r)
{
    pin_retry_releases(r);
    swrite *list = r->sw_main;
    r->sw_main = r->sw_main_tail = NULL;
    for (swrite *sw = list, *next; sw; sw = next) {
        next = sw->list_next;
        sw->on_main = false;
        if (sw->state == SW_DONE)
            settle_done(r, sw);
        else if (sw->state == SW_PINNING)
            source_resume(r, sw);
        else if (sw->abandoned)
            pin_unhold(r, sw);
    }
    /* Pinning writes past their deadline give up. */
    uint64_t now = kvcr_now_ns();
    for (swrite *sw = r->swrites; sw; sw = sw->next)
        if (sw->state == SW_PINNING && sw->n_wait > 0 && now >= sw->deadline_ns)
            source_resume(r, sw);
    pin_cancel_orphans(r);
}

/* Unlocked, at destroy: writes never settled (close gave up on them). */
void source_destroy(remote *r)
{
    while (r->swrites) {
        swrite *sw = r->swrites;
        r->swrites = sw->next;
        sw_free(sw);
    }
}
