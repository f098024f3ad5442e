/* kvcr demo: one engine process. Its "GPU KV buffer" is host memory
 * (DEMO_MAX_BLOCKS blocks, registered as framework memory); its KVCR
 * instance owns `slots` blocks of DRAM and, unless --local-only, runs the
 * peer tier on 127.0.0.1. For each request the router forwards it asks KVCR
 * where every block is, delivers what KVCR has (its own DRAM, or a peer's
 * through the router's hint), verifies every delivered byte, "recomputes"
 * the rest at a modelled cost, and deposits what it computed or pulled so
 * that other engines can pull it from here. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo.h"
#include "kvcr/kvcr.h"

#define OP_TIMEOUT_MS 5000u
#define ABANDON_TIMEOUT_MS 10000u
/* Waits for our own operations: past KVCR's deadline, so a stuck transfer
 * is reported by KVCR with its reason rather than by us giving up. */
#define WAIT_LIMIT_S 15.0

typedef struct engine {
    const demo_opts *o;
    int idx, from_router, to_router;
    double deadline;
    kvcr_t *kv;
    int kfd;
    uint8_t *fw, *pool;
    size_t bs;
    bool router_gone;
    uint32_t resilience; /* events since the last request's report */
} engine;

static int fail(const engine *e, const char *what, int rc)
{
    fprintf(stderr, "kvcr demo: engine %d: %s failed: %s: %s\n", e->idx, what, kvcr_strerror(rc),
            kvcr_last_error());
    return 1;
}

/* ---- callbacks ---------------------------------------------------------------- */

/* The key adapter: a key is the 8 bytes of its block's prefix hash. */
static int key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    (void)ud;
    if (key->len != 8) return -1;
    memcpy(hash, key->data, 8);
    return 0;
}

/* Forwards KVCR DRAM inventory to the router, so it knows what we can serve. */
static int on_inventory(void *ud, const kvcr_inventory_event *ev)
{
    engine *e = ud;
    if (ev->tier != KVCR_TIER_LOCAL_G2 || e->router_gone) return 0;
    enum { CHUNK = 4096 };
    static uint64_t h[CHUNK];
    for (size_t at = 0; at < ev->n_keys; at += CHUNK) {
        uint32_t n = 0;
        for (size_t i = at; i < ev->n_keys && i < at + CHUNK; i++)
            if (key_hash(NULL, &ev->keys[i], &h[n]) == 0) n++;
        demo_inv inv = {e->idx, ev->removed, n};
        if (demo_send(e->to_router, MSG_INV, &inv, sizeof inv, h, n * sizeof *h) != 0) {
            e->router_gone = true;
            return -1;
        }
    }
    return 0;
}

/* A peer transfer that failed may still touch our memory, or one of our
 * source writes stalled: the tier's business, but never silent here. */
static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    engine *e = ud;
    static const char *const state[] = {"uncertain", "quiesced", "source stalled"};
    if (ev->state != KVCR_TRANSFER_QUIESCED) e->resilience++;
    fprintf(stderr, "kvcr demo: engine %d: resilience event (%s, %s side): %s\n", e->idx,
            (unsigned)ev->state < 3 ? state[ev->state] : "?", ev->source_side ? "source" : "target",
            ev->message ? ev->message : "");
}

/* ---- operations ----------------------------------------------------------------- */

/* One operation being waited for: its per-entry results land in st/why. */
typedef struct pending {
    kvcr_op_handle op;
    size_t n;
    kvcr_entry_status *st;
    kvcr_reason *why;
    double done_at;
    bool done;
} pending;

/* Polls until every operation in p[0..n) completed (n may be 0). */
static int wait_ops(engine *e, pending *p, int n)
{
    double until = demo_now() + WAIT_LIMIT_S;
    if (until > e->deadline) until = e->deadline;
    for (;;) {
        kvcr_op_result *res;
        size_t n_res;
        int rc = kvcr_poll(e->kv, &res, &n_res);
        if (rc != 0) return fail(e, "kvcr_poll", rc);
        double now = demo_now();
        for (size_t r = 0; r < n_res; r++)
            for (int k = 0; k < n; k++) {
                if (p[k].done || res[r].op != p[k].op) continue;
                if (res[r].n_entries != p[k].n) {
                    fprintf(stderr, "kvcr demo: engine %d: %zu results for %zu blocks\n", e->idx,
                            res[r].n_entries, p[k].n);
                    kvcr_results_free(res);
                    return 1;
                }
                for (size_t j = 0; j < p[k].n; j++) {
                    p[k].st[j] = res[r].entries[j].status;
                    p[k].why[j] = res[r].entries[j].reason;
                }
                p[k].done = true;
                p[k].done_at = now;
            }
        kvcr_results_free(res);
        int left = 0;
        for (int k = 0; k < n; k++) left += !p[k].done;
        if (left == 0) return 0;
        if (now > until) {
            if (now > e->deadline)
                fprintf(stderr, "kvcr demo: engine %d: the time limit passed\n", e->idx);
            else
                fprintf(stderr,
                        "kvcr demo: engine %d: %d operation(s) not completed within "
                        "%.0f s\n",
                        e->idx, left, WAIT_LIMIT_S);
            return 1;
        }
        struct pollfd pfd = {e->kfd, POLLIN, 0};
        poll(&pfd, 1, 1);
    }
}

/* Submits a deliver (or deposit when deliver is false) of blocks listed by
 * index: key keys[idx[i]], framework element idx[i]. */
static int submit(engine *e, bool deliver, const kvcr_key *keys, const uint32_t *idx, size_t n,
                  const char *rid, pending *p, kvcr_entry_status *st, kvcr_reason *why)
{
    *p = (pending){.n = n, .st = st, .why = why, .done = n == 0};
    if (n == 0) return 0;
    kvcr_mem_ref refs[DEMO_MAX_BLOCKS];
    kvcr_block b[DEMO_MAX_BLOCKS];
    for (size_t i = 0; i < n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, "", idx[i]};
        b[i] = (kvcr_block){keys[idx[i]], &refs[i], 1};
    }
    int rc =
        deliver ? kvcr_deliver(e->kv, b, n, rid, &p->op) : kvcr_deposit(e->kv, b, n, 0, &p->op);
    return rc == 0 ? 0 : fail(e, deliver ? "kvcr_deliver" : "kvcr_deposit", rc);
}

/* ---- one request ---------------------------------------------------------------- */

static int serve(engine *e, const demo_req *rq, const uint64_t *hashes, const char *hint,
                 demo_result *out)
{
    double t0 = demo_now();
    size_t n = rq->n_blocks, bs = e->bs;
    char rid[32];
    snprintf(rid, sizeof rid, "req-%" PRIu32, rq->req_no);
    *out = (demo_result){
        .req_no = rq->req_no, .engine = e->idx, .source = rq->source, .n_blocks = (uint32_t)n};
    /* Last request's blocks must not pass for this one's. */
    memset(e->fw, 0xA5, n * bs);

    int rc;
    if (rq->hint_len > 0 && (rc = kvcr_submit_hint(e->kv, rid, hint, rq->hint_len)) != 0) {
        fprintf(stderr, "kvcr demo: engine %d: the router's hint was refused: %s\n", e->idx,
                kvcr_last_error());
        out->hint_refused = 1;
    }
    uint8_t kb[DEMO_MAX_BLOCKS][8];
    kvcr_key keys[DEMO_MAX_BLOCKS];
    for (size_t i = 0; i < n; i++) {
        memcpy(kb[i], &hashes[i], 8);
        keys[i] = (kvcr_key){kb[i], 8};
    }
    kvcr_query_result q[DEMO_MAX_BLOCKS];
    if ((rc = kvcr_query(e->kv, keys, n, rid, q)) != 0) return fail(e, "kvcr_query", rc);

    uint32_t loc[DEMO_MAX_BLOCKS], rem[DEMO_MAX_BLOCKS], redo[DEMO_MAX_BLOCKS];
    uint32_t keep[DEMO_MAX_BLOCKS];
    size_t n_loc = 0, n_rem = 0, n_redo = 0, n_keep = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (q[i].status == KVCR_QUERY_HIT || q[i].status == KVCR_QUERY_FETCHING)
            loc[n_loc++] = i;
        else if (q[i].status == KVCR_QUERY_FETCHABLE)
            rem[n_rem++] = i;
        else
            redo[n_redo++] = i;
    }

    /* The peer pull first, so its clock does not include the local copy. */
    kvcr_entry_status st[2][DEMO_MAX_BLOCKS];
    kvcr_reason why[2][DEMO_MAX_BLOCKS];
    pending p[2];
    double r0 = demo_now();
    if (submit(e, true, keys, rem, n_rem, rid, &p[0], st[0], why[0]) != 0) return 1;
    double l0 = demo_now();
    if (submit(e, true, keys, loc, n_loc, rid, &p[1], st[1], why[1]) != 0) return 1;
    if (wait_ops(e, p, 2) != 0) return 1;
    if (n_rem) {
        out->peer_t0 = r0;
        out->peer_s = p[0].done_at - r0;
    }
    if (n_loc) out->local_s = p[1].done_at - l0;

    for (size_t i = 0; i < n_rem; i++) {
        if (st[0][i] == KVCR_ENTRY_SUCCESS) {
            out->remote_hit++;
            out->peer_bytes += bs;
            keep[n_keep++] = rem[i]; /* offloaded here too: shareable from now on */
        } else {
            out->remote_failed++;
            out->why_failed[(unsigned)why[0][i] < DEMO_REASONS ? (unsigned)why[0][i] : 0]++;
            redo[n_redo++] = rem[i];
        }
    }
    for (size_t i = 0; i < n_loc; i++) {
        if (st[1][i] == KVCR_ENTRY_SUCCESS) {
            out->local_hit++;
        } else {
            out->local_failed++;
            out->why_failed[(unsigned)why[1][i] < DEMO_REASONS ? (unsigned)why[1][i] : 0]++;
            redo[n_redo++] = loc[i];
        }
    }
    /* Every delivered block, byte for byte. */
    for (size_t k = 0; k < 2; k++) {
        const uint32_t *idx = k == 0 ? rem : loc;
        for (size_t i = 0; i < (k == 0 ? n_rem : n_loc); i++) {
            if (st[k][i] != KVCR_ENTRY_SUCCESS) continue;
            uint64_t bad = demo_verify(e->fw + idx[i] * bs, bs, hashes[idx[i]]);
            out->verified_blocks++;
            out->wrong_bytes += bad;
            if (bad)
                fprintf(stderr,
                        "kvcr demo: engine %d: block %" PRIu32 " of request %" PRIu32
                        " (%s) has %" PRIu64 " wrong bytes\n",
                        e->idx, idx[i], rq->req_no, k == 0 ? "pulled from a peer" : "local", bad);
        }
    }
    /* "Prefill": the KV of the blocks nobody had. Its cost is modelled by
     * the driver (prefill_ms per block), not slept. */
    for (size_t i = 0; i < n_redo; i++) {
        demo_fill(e->fw + redo[i] * bs, bs, hashes[redo[i]]);
        keep[n_keep++] = redo[i];
    }
    out->recomputed = (uint32_t)n_redo;

    if (submit(e, false, keys, keep, n_keep, NULL, &p[0], st[0], why[0]) != 0) return 1;
    if (wait_ops(e, p, 1) != 0) return 1;
    for (size_t i = 0; i < n_keep; i++) {
        if (st[0][i] == KVCR_ENTRY_SUCCESS)
            out->deposited++;
        else
            out->deposit_not_stored++;
    }
    /* One more poll: the inventory of that deposit reaches the router before
     * the driver hears the request is done (its next turn may need it). */
    kvcr_op_result *res;
    size_t n_res;
    if ((rc = kvcr_poll(e->kv, &res, &n_res)) != 0) return fail(e, "kvcr_poll", rc);
    kvcr_results_free(res);
    if ((rc = kvcr_discard_hint(e->kv, rid)) != 0) return fail(e, "kvcr_discard_hint", rc);
    out->resilience = e->resilience;
    e->resilience = 0;
    out->wall_s = demo_now() - t0;
    return 0;
}

/* ---- the process ------------------------------------------------------------------ */

static int start(engine *e)
{
    const demo_opts *o = e->o;
    e->bs = o->block_size;
    size_t fw_bytes = e->bs * DEMO_MAX_BLOCKS, pool_bytes = e->bs * (size_t)o->slots;
    e->fw = aligned_alloc(4096, fw_bytes);
    e->pool = aligned_alloc(4096, pool_bytes);
    if (e->fw == NULL || e->pool == NULL) {
        fprintf(stderr, "kvcr demo: engine %d: out of memory (%zu bytes)\n", e->idx,
                fw_bytes + pool_bytes);
        return 1;
    }
    memset(e->fw, 0, fw_bytes); /* fault the pages in now, not while timing */
    memset(e->pool, 0, pool_bytes);

    char name[32];
    snprintf(name, sizeof name, "engine-%d", e->idx);
    kvcr_pool_layout layout = {"", e->bs};
    kvcr_dram_pool pool = {"", e->pool, pool_bytes};
    kvcr_region fw = {.addr = e->fw, .element_size = e->bs, .count = DEMO_MAX_BLOCKS, .label = ""};
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = name;
    cfg.pool_layouts = &layout;
    cfg.n_pool_layouts = 1;
    cfg.local_dram = &pool;
    cfg.n_local_dram = 1;
    cfg.framework_regions = &fw;
    cfg.n_framework_regions = 1;
    cfg.operation_timeout_ms = OP_TIMEOUT_MS;
    cfg.abandon_timeout_ms = ABANDON_TIMEOUT_MS;
    cfg.remote.enabled = !o->local_only;
    cfg.remote.control_host = "127.0.0.1";
    cfg.remote.control_port = 0;
    cfg.callbacks.ud = e;
    cfg.callbacks.key_hash = key_hash;
    cfg.callbacks.inventory = on_inventory;
    cfg.callbacks.resilience = on_resilience;
    int rc = kvcr_create(&cfg, &e->kv);
    if (rc != 0) return fail(e, "kvcr_create", rc);
    e->kfd = kvcr_fd(e->kv);
    if (e->kfd < 0) return fail(e, "kvcr_fd", e->kfd);

    demo_hello h = {.engine = e->idx};
    const char *ep = kvcr_control_endpoint(e->kv);
    if (!o->local_only && ep == NULL) {
        fprintf(stderr, "kvcr demo: engine %d: the peer tier has no control endpoint\n", e->idx);
        return 1;
    }
    snprintf(h.endpoint, sizeof h.endpoint, "%s", ep ? ep : "");
    if (demo_send(e->to_router, MSG_HELLO, &h, sizeof h, NULL, 0) != 0) return 1;
    return 0;
}

/* Serves requests until STOP; polls KVCR at least every 10 ms meanwhile,
 * so peers pulling from us make progress. */
static int loop(engine *e)
{
    static uint8_t msg[DEMO_MSG_MAX];
    for (;;) {
        if (demo_now() > e->deadline) {
            fprintf(stderr, "kvcr demo: engine %d: the time limit passed\n", e->idx);
            return 1;
        }
        struct pollfd fds[2] = {{e->from_router, POLLIN, 0}, {e->kfd, POLLIN, 0}};
        poll(fds, 2, 10);
        kvcr_op_result *res;
        size_t n_res;
        int rc = kvcr_poll(e->kv, &res, &n_res);
        if (rc != 0) return fail(e, "kvcr_poll", rc);
        kvcr_results_free(res);
        if (e->router_gone) return 1;
        if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
        uint32_t type;
        size_t len;
        if (demo_recv(e->from_router, &type, msg, sizeof msg, &len, e->deadline) != 0)
            return 1; /* the router is gone: it reports why */
        if (type == MSG_STOP) return 0;
        demo_req rq;
        if (type != MSG_REQ || len < sizeof rq) return 1;
        memcpy(&rq, msg, sizeof rq);
        if (rq.n_blocks == 0 || rq.n_blocks > DEMO_MAX_BLOCKS ||
            len != sizeof rq + rq.n_blocks * 8 + rq.hint_len)
            return 1;
        uint64_t hashes[DEMO_MAX_BLOCKS];
        memcpy(hashes, msg + sizeof rq, rq.n_blocks * 8);
        const char *hint = (const char *)msg + sizeof rq + rq.n_blocks * 8;
        demo_result out;
        if (serve(e, &rq, hashes, hint, &out) != 0) return 1;
        if (demo_send(e->to_router, MSG_DONE, &out, sizeof out, NULL, 0) != 0) return 1;
    }
}

int demo_engine_main(const demo_opts *o, int idx, int from_router, int to_router, double deadline)
{
    engine e = {.o = o,
                .idx = idx,
                .from_router = from_router,
                .to_router = to_router,
                .deadline = deadline};
    int rc = start(&e);
    if (rc == 0) rc = loop(&e);
    kvcr_free(e.kv); /* waits for transfers in flight, bounded by the abandon timeout */
    free(e.fw);
    free(e.pool);
    return rc;
}
