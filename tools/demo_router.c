/* kvcr demo: the KV-aware router. It learns every engine's control
 * endpoint (HELLO) and which block hashes each holds in its KVCR DRAM (the
 * engines forward their inventory events), spreads the driver's requests
 * over the engines by load alone (least busy, random among equals, so a
 * conversation's prefix often lives elsewhere), and attaches a kv_hint
 * naming the engine that holds the longest prefix of the request's blocks. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"

/* ---- inventory: block hash -> the engines holding it ----------------------------- */

typedef struct slot {
    uint64_t hash;
    uint32_t mask; /* bit e: engine e holds it in KVCR DRAM */
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
        if (!s->used) *s = (slot){h[k], 0, true}, inv->used++;
        if (removed)
            s->mask &= ~(1u << engine);
        else
            s->mask |= 1u << engine;
    }
    return 0;
}

static uint32_t inv_mask(const inventory *inv, uint64_t h)
{
    const slot *s = &inv->t[find(inv, h)];
    return s->used ? s->mask : 0;
}

/* ---- routing ---------------------------------------------------------------------- */

typedef struct router {
    const demo_opts *o;
    int from_driver, to_driver;
    const int *from_engine, *to_engine;
    double deadline;
    char endpoint[DEMO_MAX_ENGINES][DEMO_ENDPOINT_MAX];
    int busy[DEMO_MAX_ENGINES];
    int hello;
    inventory inv;
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

static int pick_target(router *r)
{
    int best = 0, ties = 0;
    for (int e = 0; e < r->o->engines; e++) {
        if (e > 0 && r->busy[e] > r->busy[best]) continue;
        if (e == 0 || r->busy[e] < r->busy[best]) {
            best = e, ties = 1;
        } else if (demo_rand(&r->rng) % (uint64_t)++ties == 0) {
            best = e; /* reservoir choice among the least busy */
        }
    }
    return best;
}

/* Forwards a request to its target, with a hint when another engine holds
 * a longer prefix than the target does. */
static int route(router *r, const demo_req *in, const uint64_t *h)
{
    int t = pick_target(r), n = (int)in->n_blocks;
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
    }
    static uint8_t msg[DEMO_MSG_MAX];
    memcpy(msg, &out, sizeof out);
    memcpy(msg + sizeof out, h, (size_t)n * 8);
    if (demo_send(r->to_engine[t], MSG_REQ, msg, sizeof out + (size_t)n * 8, json, out.hint_len) !=
        0)
        return fatal(r, "router: engine %d does not take requests (%s)", t, strerror(errno));
    r->busy[t]++;
    return 0;
}

/* One message from the driver (e < 0) or from engine e: 0 to go on, 1 to
 * stop cleanly, -1 on failure. */
static int handle(router *r, int e, uint32_t type, const uint8_t *msg, size_t len)
{
    if (e < 0 && type == MSG_STOP) {
        for (int i = 0; i < r->o->engines; i++)
            demo_send(r->to_engine[i], MSG_STOP, NULL, 0, NULL, 0);
        return 1;
    }
    if (e < 0 && type == MSG_REQ && len >= sizeof(demo_req)) {
        demo_req rq;
        memcpy(&rq, msg, sizeof rq);
        if (rq.n_blocks == 0 || rq.n_blocks > DEMO_MAX_BLOCKS || len != sizeof rq + rq.n_blocks * 8)
            return fatal(r, "router: a malformed request from the driver");
        uint64_t h[DEMO_MAX_BLOCKS];
        memcpy(h, msg + sizeof rq, rq.n_blocks * 8);
        return route(r, &rq, h) != 0 ? -1 : 0;
    }
    if (e >= 0 && type == MSG_HELLO && len == sizeof(demo_hello)) {
        const demo_hello *hl = (const void *)msg;
        snprintf(r->endpoint[e], sizeof r->endpoint[e], "%s", hl->endpoint);
        if (++r->hello == r->o->engines &&
            demo_send(r->to_driver, MSG_READY, NULL, 0, NULL, 0) != 0)
            return -1;
        return 0;
    }
    if (e >= 0 && type == MSG_INV && len >= sizeof(demo_inv)) {
        demo_inv iv;
        memcpy(&iv, msg, sizeof iv);
        if (len != sizeof iv + iv.n * 8)
            return fatal(r, "router: malformed inventory from engine %d", e);
        uint64_t *h = malloc(iv.n * 8 + 8);
        if (h == NULL) return fatal(r, "router: out of memory");
        memcpy(h, msg + sizeof iv, iv.n * 8);
        int rc = inv_update(&r->inv, e, iv.removed != 0, h, iv.n);
        free(h);
        return rc != 0 ? fatal(r, "router: out of memory") : 0;
    }
    if (e >= 0 && type == MSG_DONE && len == sizeof(demo_result)) {
        r->busy[e]--;
        return demo_send(r->to_driver, MSG_DONE, msg, len, NULL, 0) != 0 ? -1 : 0;
    }
    return e < 0 ? fatal(r, "router: unexpected message %u from the driver", type)
                 : fatal(r, "router: unexpected message %u from engine %d", type, e);
}

int demo_router_main(const demo_opts *o, int from_driver, int to_driver, const int *from_engine,
                     const int *to_engine, double deadline)
{
    router r = {.o = o,
                .from_driver = from_driver,
                .to_driver = to_driver,
                .from_engine = from_engine,
                .to_engine = to_engine,
                .deadline = deadline,
                .rng = o->seed ^ 0x726f75746572ull};
    r.inv.cap = 1u << 14;
    r.inv.t = calloc(r.inv.cap, sizeof(slot));
    if (r.inv.t == NULL) {
        fatal(&r, "router: out of memory");
        return 1;
    }
    static uint8_t msg[DEMO_MSG_MAX];
    int rc = 0;
    while (rc == 0) {
        if (demo_now() > deadline) {
            rc = fatal(&r, "router: the time limit passed");
            break;
        }
        struct pollfd fds[1 + DEMO_MAX_ENGINES];
        fds[0] = (struct pollfd){from_driver, POLLIN, 0};
        for (int e = 0; e < o->engines; e++)
            fds[1 + e] = (struct pollfd){from_engine[e], POLLIN, 0};
        if (poll(fds, (nfds_t)(1 + o->engines), 100) <= 0) continue;
        for (int i = 0; i <= o->engines && rc == 0; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            uint32_t type;
            size_t len;
            if (demo_recv(fds[i].fd, &type, msg, sizeof msg, &len, deadline) != 0) {
                if (i == 0)
                    rc = -1; /* the driver is gone */
                else
                    rc = fatal(&r, "engine %d stopped talking to the router (%s)", i - 1,
                               strerror(errno));
                break;
            }
            rc = handle(&r, i - 1, type, msg, len);
        }
    }
    free(r.inv.t);
    return rc == 1 ? 0 : 1;
}
