/* kvcr demo: the KV-aware router. It learns every engine's control
 * endpoint (HELLO) and which block hashes each holds in its KVCR DRAM from
 * the KV events each engine's KVCR publishes (demo_events.c: ZeroMQ, in
 * vLLM's wire format, as Dynamo's or llm-d's router reads them), spreads the driver's requests
 * over the engines by load alone (least busy, random among equals, so a
 * conversation's prefix often lives elsewhere), and attaches a kv_hint
 * naming the engine that holds the longest prefix of the request's blocks.
 *
 * With --chaos an engine may die at any time: the requests it held are
 * answered as failed (never as served), no new one goes to it, hints may
 * still name it (its Guard serves its blocks on its endpoint), and when
 * the driver restarts it the new process's pipes arrive on the descriptor
 * socket; its HELLO brings the endpoint again and its event stream starts
 * afresh (AllBlocksCleared, then the blocks it recovered). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"

/* ---- inventory: block hash -> the engines holding it ----------------------------- */

typedef struct slot {
    uint64_t hash;
    uint32_t mask; /* bit e: engine e holds it in KVCR DRAM */
    uint32_t gone; /* bit e: e's last event of it removed it, no request with it went to e since */
    bool used;
} slot;

typedef struct inventory {
    slot *t;
    size_t cap, used; /* entries are never removed: a hash seen once keeps its slot */
} inventory;

static size_t find(const inventory *inv, uint64_t h)
{
    size_t i = demo_mix(h) & (inv->cap - 1);
    while (inv->t[i].used && inv->t[i].hash != h) i = (i + 1) & (inv->cap - 1);
    return i;
}

static int grow(inventory *inv)
{
    inventory g = {calloc(inv->cap * 2, sizeof(slot)), inv->cap * 2, inv->used};
    if (g.t == NULL) return -1;
    for (size_t i = 0; i < inv->cap; i++)
        if (inv->t[i].used) g.t[find(&g, inv->t[i].hash)] = inv->t[i];
    free(inv->t);
    *inv = g;
    return 0;
}

static int inv_update(inventory *inv, int engine, bool removed, const uint64_t *h, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (2 * (inv->used + 1) > inv->cap && grow(inv) != 0) return -1;
        slot *s = &inv->t[find(inv, h[k])];
        if (!s->used) *s = (slot){h[k], 0, 0, true}, inv->used++;
        if (removed) {
            s->mask &= ~(1u << engine);
            s->gone |= 1u << engine;
        } else {
            s->mask |= 1u << engine;
            s->gone &= ~(1u << engine);
        }
    }
    return 0;
}

static uint32_t inv_mask(const inventory *inv, uint64_t h)
{
    const slot *s = &inv->t[find(inv, h)];
    return s->used ? s->mask : 0;
}

/* A request goes to engine e: a removal heard before it says nothing of
 * what e holds after it. */
static void inv_sent(inventory *inv, int engine, const uint64_t *h, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        slot *s = &inv->t[find(inv, h[k])];
        if (s->used) s->gone &= ~(1u << engine);
    }
}

/* Whether the index has heard of every block in `held` at engine e: it
 * holds it, or heard it removed since the request was sent. */
static bool inv_heard(const inventory *inv, int engine, uint64_t held, const uint64_t *h, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (!(held >> k & 1u)) continue;
        const slot *s = &inv->t[find(inv, h[k])];
        if (!s->used || !((s->mask | s->gone) >> engine & 1u)) return false;
    }
    return true;
}

/* ---- routing ---------------------------------------------------------------------- */

static void inv_forget(inventory *inv, int engine)
{
    for (size_t i = 0; i < inv->cap; i++) inv->t[i].mask &= ~(1u << engine);
}

/* ---- answers held back until the index has their blocks ------------------------------ */

/* An engine's answer lands before its KV events when its publisher is
 * slow (a loaded machine, a sanitizer); routed at once, the next turn of
 * that conversation would get a hint from a stale index (no hint, or one
 * naming blocks the source no longer has). */
#define INDEX_WAIT_S 1.0
/* Waited this long, the engine's replay is asked for what followed the
 * last batch the index has (a lost batch shows as a gap only once a later
 * one comes, and an idle engine sends none). */
#define CATCH_UP_S 0.1

typedef struct waiter {
    double since, until;
    bool asked; /* its engine's replay was asked (once) */
    demo_result res;
    uint64_t h[DEMO_MAX_BLOCKS];
} waiter;

typedef struct index_waits {
    waiter *w;
    size_t n, cap; /* bounded: each is a request its engine held (DEMO_HELD_MAX each) */
    uint64_t held_back, caught_up, gave_up, released; /* released: its engine gone, or STOP */
    double longest_s;
} index_waits;

typedef struct router {
    const demo_opts *o;
    int from_driver, to_driver, fds_from_driver;
    int from_engine[DEMO_MAX_ENGINES], to_engine[DEMO_MAX_ENGINES]; /* -1: no process */
    double deadline;
    char endpoint[DEMO_MAX_ENGINES][DEMO_ENDPOINT_MAX];
    bool up[DEMO_MAX_ENGINES];                  /* said HELLO, pipes open */
    uint32_t held[DEMO_MAX_ENGINES][DEMO_HELD_MAX]; /* req_no of requests sent to it */
    int busy[DEMO_MAX_ENGINES];                 /* entries of held */
    bool ready, stopping;
    inventory inv;
    index_waits iw;
    demo_events *ev;
    uint64_t rng;
} router;

/* Tells the driver why the router gives up; returns -1. */
static int fatal(router *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fatal(router *r, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    demo_send(r->to_driver, MSG_FATAL, text, strlen(text) + 1, NULL, 0);
    return -1;
}

/* Whether the index has heard of w's blocks: 1 or 0, after asking the
 * engine's replay once when w has waited CATCH_UP_S; -1: a broken stream. */
static int index_heard(router *r, waiter *w, double now)
{
    int e = w->res.engine;
    if (inv_heard(&r->inv, e, w->res.held, w->h, w->res.n_blocks)) return 1;
    if (w->asked || now - w->since < CATCH_UP_S) return 0;
    w->asked = true;
    if (demo_events_catch_up(r->ev, e) != 0) return -1;
    return inv_heard(&r->inv, e, w->res.held, w->h, w->res.n_blocks);
}

/* Sends the answers done() held back on: those whose blocks the index has
 * heard of, those waited for INDEX_WAIT_S, and every one of engine `all`
 * (-2: of every engine; -1: none) whatever the index says. */
static int send_waiting(router *r, int all)
{
    index_waits *iw = &r->iw;
    double now = tool_now();
    int heard;
    for (size_t i = 0; i < iw->n;) {
        waiter *w = &iw->w[i];
        int e = w->res.engine;
        if (all == e || all == -2)
            iw->released++;
        else if ((heard = index_heard(r, w, now)) < 0)
            return -1;
        else if (heard)
            iw->caught_up++;
        else if (now >= w->until)
            iw->gave_up++;
        else {
            i++;
            continue;
        }
        if (now - w->since > iw->longest_s) iw->longest_s = now - w->since;
        if (demo_send(r->to_driver, MSG_DONE, &w->res, sizeof w->res, NULL, 0) != 0) return -1;
        *w = iw->w[--iw->n];
    }
    return 0;
}

/* The least busy engine that is up, random among equals; -1: none is up. */
static int pick_target(router *r)
{
    int best = -1, ties = 0;
    for (int e = 0; e < r->o->engines; e++) {
        if (!r->up[e] || (best >= 0 && r->busy[e] > r->busy[best])) continue;
        if (best < 0 || r->busy[e] < r->busy[best]) {
            best = e, ties = 1;
        } else if (demo_rand(&r->rng) % (uint64_t)++ties == 0) {
            best = e; /* reservoir choice among the least busy */
        }
    }
    return best;
}

/* Answers a request no engine served: counted as failed by the driver. */
static int answer_failed(router *r, uint32_t req_no, int engine, enum demo_fail why)
{
    demo_result res = {.req_no = req_no, .engine = engine, .source = -1, .failed = why};
    return demo_send(r->to_driver, MSG_DONE, &res, sizeof res, NULL, 0);
}

/* Engine e's process is gone (or must be given up): its pipes are closed
 * and every request it held is answered as failed. Without --chaos that
 * ends the run. */
static int engine_gone(router *r, int e, const char *why)
{
    if (!r->o->chaos && !r->stopping)
        return fatal(r, "engine %d stopped talking to the router (%s)", e, why);
    if (send_waiting(r, e) != 0) return -1;
    close(r->from_engine[e]);
    close(r->to_engine[e]);
    r->from_engine[e] = r->to_engine[e] = -1;
    r->up[e] = false;
    for (int k = 0; k < r->busy[e]; k++)
        if (answer_failed(r, r->held[e][k], e, DEMO_FAIL_ENGINE_DIED) != 0) return -1;
    r->busy[e] = 0;
    return 0;
}

/* A restarted engine's pipe ends, from the driver. Its blocks are
 * announced again by its KV events. */
static int engine_back(router *r)
{
    int32_t e;
    int from, to;
    if (demo_recv_fds(r->fds_from_driver, &e, &from, &to) != 0)
        return fatal(r, "router: no engine pipes from the driver (%s)", strerror(errno));
    if (e < 0 || e >= r->o->engines) {
        close(from);
        close(to);
        return fatal(r, "router: pipes for engine %d of %d", (int)e, r->o->engines);
    }
    /* The driver reaped the old process first: an end of file not read yet. */
    if (r->from_engine[e] >= 0 && engine_gone(r, e, "replaced") != 0) return -1;
    r->from_engine[e] = from;
    r->to_engine[e] = to;
    inv_forget(&r->inv, e);
    return 0;
}

/* Forwards a request to its target, with a hint when another engine holds
 * a longer prefix than the target does. */
static int route(router *r, const demo_req *in, const uint64_t *h)
{
    int t = in->target >= 0 ? in->target : pick_target(r), n = (int)in->n_blocks;
    if (t >= r->o->engines)
        return fatal(r, "router: a request for engine %d of %d", t, r->o->engines);
    if (t < 0 || !r->up[t] || r->busy[t] == DEMO_HELD_MAX)
        return answer_failed(r, in->req_no, t, DEMO_FAIL_NO_ENGINE) != 0 ? -1 : 0;
    int prefix[DEMO_MAX_ENGINES] = {0};
    uint32_t mask[DEMO_MAX_BLOCKS];
    for (int i = 0; i < n; i++) mask[i] = inv_mask(&r->inv, h[i]);
    for (int e = 0; e < r->o->engines; e++)
        while (prefix[e] < n && (mask[prefix[e]] >> e & 1u)) prefix[e]++;
    int s = -1;
    for (int e = 0; e < r->o->engines; e++)
        if (e != t && prefix[e] > prefix[t] && (s < 0 || prefix[e] > prefix[s])) s = e;

    demo_req out = *in;
    out.source = -1;
    out.hint_len = 0;
    out.flags = 0;
    char json[4096];
    if (s >= 0 && !r->o->local_only) {
        /* The prefix blocks the target lacks, all held by s. */
        size_t at = (size_t)snprintf(json, sizeof json,
                                     "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":"
                                     "\"kv.fetch\",\"action_version\":\"1.0\",\"payload\":{"
                                     "\"source_control_endpoint\":\"%s\",\"block_hashes\":[",
                                     r->endpoint[s]);
        bool first = true;
        for (int i = 0; i < prefix[s] && at < sizeof json; i++) {
            if (mask[i] >> t & 1u) continue;
            at +=
                (size_t)snprintf(json + at, sizeof json - at, "%s%" PRIu64, first ? "" : ",", h[i]);
            first = false;
        }
        if (at < sizeof json) at += (size_t)snprintf(json + at, sizeof json - at, "]}}]}");
        if (at >= sizeof json)
            return fatal(r, "router: a hint did not fit in %zu bytes", sizeof json);
        out.source = s;
        out.hint_len = (uint32_t)at;
        if (!r->up[s]) out.flags |= DEMO_REQ_SOURCE_DOWN;
    }
    static uint8_t msg[DEMO_MSG_MAX];
    memcpy(msg, &out, sizeof out);
    memcpy(msg + sizeof out, h, (size_t)n * 8);
    r->held[t][r->busy[t]++] = in->req_no;
    inv_sent(&r->inv, t, h, (size_t)n);
    if (demo_send(r->to_engine[t], MSG_REQ, msg, sizeof out + (size_t)n * 8, json, out.hint_len) !=
        0)
        return engine_gone(r, t, strerror(errno)); /* the request with the rest */
    return 0;
}

/* An engine's answer: to the driver once the index has heard of the
 * blocks the engine holds after it, or INDEX_WAIT_S later (counted). */
static int done(router *r, int e, const uint8_t *msg, size_t len)
{
    demo_result res;
    memcpy(&res, msg, sizeof res);
    if (res.n_blocks == 0 || res.n_blocks > DEMO_MAX_BLOCKS ||
        len != sizeof res + res.n_blocks * 8)
        return fatal(r, "router: a malformed answer from engine %d", e);
    int k = 0;
    while (k < r->busy[e] && r->held[e][k] != res.req_no) k++;
    if (k == r->busy[e] || res.failed != DEMO_FAIL_NONE || res.engine != e)
        return fatal(r, "router: engine %d answered request %" PRIu32 ", not one of its own", e,
                     res.req_no);
    r->held[e][k] = r->held[e][--r->busy[e]];
    waiter w = {.since = tool_now(), .res = res};
    memcpy(w.h, msg + sizeof res, res.n_blocks * 8);
    if (inv_heard(&r->inv, e, res.held, w.h, res.n_blocks))
        return demo_send(r->to_driver, MSG_DONE, &res, sizeof res, NULL, 0) != 0 ? -1 : 0;
    index_waits *iw = &r->iw;
    if (iw->n == iw->cap) {
        size_t cap = iw->cap ? 2 * iw->cap : 64;
        waiter *g = realloc(iw->w, cap * sizeof *g);
        if (g == NULL) return fatal(r, "router: out of memory");
        iw->w = g, iw->cap = cap;
    }
    w.until = w.since + INDEX_WAIT_S;
    iw->w[iw->n++] = w;
    iw->held_back++;
    return 0;
}

/* Every engine with pipes: STOP. The run ends once each said BYE or died. */
static int stop_all(router *r)
{
    r->stopping = true;
    if (send_waiting(r, -2) != 0) return -1;
    for (int i = 0; i < r->o->engines; i++)
        if (r->to_engine[i] >= 0 && demo_send(r->to_engine[i], MSG_STOP, NULL, 0, NULL, 0) != 0 &&
            engine_gone(r, i, strerror(errno)) != 0)
            return -1;
    return 0;
}

static int forward_disk(router *r, const uint8_t *msg, size_t len)
{
    if (len != sizeof(demo_disk)) return fatal(r, "router: a malformed disk message");
    for (int i = 0; i < r->o->engines; i++)
        if (r->up[i] && demo_send(r->to_engine[i], MSG_DISK, msg, len, NULL, 0) != 0 &&
            engine_gone(r, i, strerror(errno)) != 0)
            return -1;
    return 0;
}

static int hello(router *r, int e, const uint8_t *msg)
{
    demo_hello hl;
    memcpy(&hl, msg, sizeof hl);
    hl.endpoint[sizeof hl.endpoint - 1] = '\0';
    snprintf(r->endpoint[e], sizeof r->endpoint[e], "%s", hl.endpoint);
    r->up[e] = true;
    /* the driver learns the endpoint, and after a restart what it recovered */
    if (demo_send(r->to_driver, MSG_HELLO, &hl, sizeof hl, NULL, 0) != 0) return -1;
    if (r->ready) return 0;
    for (int i = 0; i < r->o->engines; i++)
        if (!r->up[i]) return 0;
    r->ready = true;
    return demo_send(r->to_driver, MSG_READY, NULL, 0, NULL, 0) != 0 ? -1 : 0;
}

/* One message from the driver (e < 0) or from engine e: 0 to go on, -1
 * on failure. */
static int handle(router *r, int e, uint32_t type, const uint8_t *msg, size_t len)
{
    if (e < 0 && type == MSG_STOP) return stop_all(r);
    if (e < 0 && type == MSG_DISK) return forward_disk(r, msg, len);
    if (e < 0 && type == MSG_REQ && len >= sizeof(demo_req)) {
        demo_req rq;
        memcpy(&rq, msg, sizeof rq);
        if (rq.n_blocks == 0 || rq.n_blocks > DEMO_MAX_BLOCKS || len != sizeof rq + rq.n_blocks * 8)
            return fatal(r, "router: a malformed request from the driver");
        uint64_t h[DEMO_MAX_BLOCKS];
        memcpy(h, msg + sizeof rq, rq.n_blocks * 8);
        return route(r, &rq, h) != 0 ? -1 : 0;
    }
    if (e >= 0 && type == MSG_HELLO && len == sizeof(demo_hello)) return hello(r, e, msg);
    if (e >= 0 && type == MSG_DONE && len > sizeof(demo_result)) return done(r, e, msg, len);
    if (e >= 0 && type == MSG_BYE && len == sizeof(demo_bye) && r->stopping) {
        if (demo_send(r->to_driver, MSG_BYE, msg, len, NULL, 0) != 0) return -1;
        return engine_gone(r, e, "said goodbye");
    }
    return e < 0 ? fatal(r, "router: unexpected message %u from the driver", type)
                 : fatal(r, "router: unexpected message %u from engine %d", type, e);
}

/* Still routing: before STOP, or while an engine has not said BYE. */
static bool running(const router *r)
{
    if (!r->stopping) return true;
    for (int e = 0; e < r->o->engines; e++)
        if (r->from_engine[e] >= 0) return true;
    return false;
}

/* One KV event into the index: only KVCR DRAM ("CPU") is what peers pull. */
static int apply_event(void *ud, int engine, int type, const char *medium, const uint64_t *h,
                       size_t n)
{
    router *r = ud;
    if (type == 2) {
        inv_forget(&r->inv, engine);
        return 0;
    }
    if (medium == NULL || strcmp(medium, "CPU") != 0) return 0;
    return inv_update(&r->inv, engine, type == 1, h, n) != 0 ? fatal(r, "router: out of memory")
                                                             : 0;
}

/* The router's summary line of what the events brought. */
static void events_line(const router *r)
{
    const demo_events_figures *f = demo_events_figures_of(r->ev);
    fprintf(stderr,
            "kvcr demo: router: index from KV events: %" PRIu64 " batches, %" PRIu64
            " events, %" PRIu64 " gaps filled by replay and %" PRIu64
            " catch-ups asked of it (%" PRIu64 " not whole)\n",
            f->batches, f->events, f->replays - f->catch_ups, f->catch_ups, f->unfilled);
    const index_waits *w = &r->iw;
    fprintf(stderr,
            "kvcr demo: router: %" PRIu64 " answers held back until the index had their blocks: %"
            PRIu64 " caught up, %" PRIu64 " gave up after %.0f s, %" PRIu64
            " released (engine gone, STOP); longest %.0f ms\n",
            w->held_back, w->caught_up, w->gave_up, INDEX_WAIT_S, w->released,
            w->longest_s * 1e3);
}

int demo_router_main(const demo_opts *o, int from_driver, int to_driver, int fds_from_driver,
                     const int *from_engine, const int *to_engine, double deadline)
{
    router r = {.o = o,
                .from_driver = from_driver,
                .to_driver = to_driver,
                .fds_from_driver = fds_from_driver,
                .deadline = deadline,
                .rng = o->seed ^ 0x726f75746572ull};
    for (int e = 0; e < o->engines; e++) {
        r.from_engine[e] = from_engine[e];
        r.to_engine[e] = to_engine[e];
    }
    r.inv.cap = 1u << 14;
    r.inv.t = calloc(r.inv.cap, sizeof(slot));
    if (r.inv.t == NULL) {
        fatal(&r, "router: out of memory");
        return 1;
    }
    if (demo_events_open(o, apply_event, &r, &r.ev) != 0) {
        fatal(&r, "router: the KV-event endpoints could not be bound");
        free(r.inv.t);
        return 1;
    }
    static uint8_t msg[DEMO_MSG_MAX];
    int rc = 0;
    while (rc == 0 && running(&r)) {
        if (tool_now() > deadline) {
            rc = fatal(&r, "router: the time limit passed");
            break;
        }
        /* the engines' KV events first, then [0] the driver, [1] the
         * descriptor socket, then the engines with pipes */
        zmq_pollitem_t fds[2 * DEMO_MAX_ENGINES + 2];
        int who[2 * DEMO_MAX_ENGINES + 2];
        int n_ev = demo_events_items(r.ev, fds), n = n_ev;
        fds[n] = (zmq_pollitem_t){NULL, from_driver, ZMQ_POLLIN, 0}, who[n++] = -1;
        fds[n] = (zmq_pollitem_t){NULL, fds_from_driver, ZMQ_POLLIN, 0}, who[n++] = -2;
        for (int e = 0; e < o->engines; e++)
            if (r.from_engine[e] >= 0)
                fds[n] = (zmq_pollitem_t){NULL, r.from_engine[e], ZMQ_POLLIN, 0}, who[n++] = e;
        if (send_waiting(&r, -1) != 0) {
            rc = -1;
            break;
        }
        if (zmq_poll(fds, n, r.iw.n ? 10 : 100) <= 0) continue;
        for (int e = 0; e < n_ev && rc == 0; e++)
            if (fds[e].revents & ZMQ_POLLIN) rc = demo_events_read(r.ev, e);
        for (int i = n_ev; i < n && rc == 0; i++) {
            if (!(fds[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) continue;
            if (who[i] == -2) {
                rc = engine_back(&r);
                continue;
            }
            int e = who[i];
            if (e >= 0 && r.from_engine[e] != fds[i].fd) continue; /* gone meanwhile */
            /* What an engine published before its answer goes into the
             * index before the answer reaches the driver. */
            if (e >= 0 && (rc = demo_events_read(r.ev, e)) != 0) continue;
            uint32_t type;
            size_t len;
            if (demo_recv(fds[i].fd, &type, msg, sizeof msg, &len, deadline) != 0) {
                rc = e < 0 ? -1 /* the driver is gone */ : engine_gone(&r, e, strerror(errno));
                continue;
            }
            rc = handle(&r, e, type, msg, len);
        }
    }
    if (!o->json) events_line(&r);
    demo_events_close(r.ev);
    free(r.inv.t);
    free(r.iw.w);
    return rc == 0 ? 0 : 1;
}
