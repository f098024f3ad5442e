/* kvcr demo: one engine process. Its "GPU KV buffer" is host memory
 * (FW_ELEMENTS blocks, registered as framework memory); its KVCR
 * instance owns `slots` blocks of DRAM and, unless --local-only, runs the
 * peer tier on 127.0.0.1 (--hosts: on its rig host's address). For each
 * request the router forwards it asks KVCR where every block is, delivers
 * what KVCR has (its own DRAM, or a peer's through the router's hint),
 * verifies every delivered byte, "recomputes" the rest at a modelled cost,
 * and deposits what it computed or pulled so that other engines can pull
 * it from here. A block a failed deliver may still write (UNCERTAIN) sits
 * out until KVCR says it is quiet (QUIESCED), as an engine must keep it:
 * the buffer has room for two requests' blocks, and each request takes
 * free ones.
 *
 * With --chaos its KVCR DRAM is a pool group of the driver's KVCR service
 * (guard mode: group = engine number) and its evictions spill to its own
 * G3 slot file; a restarted engine claims the group back and finds what
 * the Guard kept and what its G3 file holds. At STOP it reports what its
 * KVCR still holds claimed or pinned (a leak once the work is drained). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcr/testing.h"
#include "demo.h"
#include "kvcr/kvcr.h"

#define OP_TIMEOUT_MS 5000u
/* Framework elements: a request's blocks twice over, so that those a failed
 * deliver may still write can sit out while requests go on. */
#define FW_ELEMENTS (2 * DEMO_MAX_BLOCKS)
#define ABANDON_TIMEOUT_MS 10000u
/* Waits for our own operations: past KVCR's deadline, so a stuck transfer
 * is reported by KVCR with its reason rather than by us giving up; and past
 * the 30-40 s stalls of G3 reads seen after injected ENOSPC completions
 * (--chaos), which are reported as slow operations rather than ending the
 * engine. */
#define WAIT_LIMIT_S 60.0
/* A restarted engine's claim may reach the service before it has seen the
 * old process die ("held by another worker"): asked again, this long. */
#define CLAIM_RETRY_S 15.0
/* At STOP: G3 writes still going out, and source writes to a peer that
 * died (resolved by the transport, seen to take over 10 s), are waited
 * for this long; what is still held then is a leak. */
#define DRAIN_LIMIT_S 30.0

typedef struct engine {
    const demo_opts *o;
    int idx, from_router, to_router;
    double deadline;
    kvcr_t *kv;
    int kfd;
    uint8_t *fw, *pool;
    size_t bs;
    uint32_t resilience; /* events since the last request's report */
    demo_split split;    /* its pulls' parts, from every snapshot taken */
    bool uncertain[FW_ELEMENTS]; /* named UNCERTAIN, not yet QUIESCED: not reused */
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

/* A peer transfer that failed may still touch our memory, or one of our
 * source writes stalled: the tier's business, but never silent here. */
static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    engine *e = ud;
    static const char *const state[] = {"uncertain", "quiesced", "source stalled"};
    if (ev->state != KVCR_TRANSFER_QUIESCED) e->resilience++;
    for (size_t i = 0; !ev->source_side && i < ev->n_regions; i++)
        if (ev->regions[i].index < FW_ELEMENTS && ev->state != KVCR_SOURCE_STALLED)
            e->uncertain[ev->regions[i].index] = ev->state == KVCR_TRANSFER_UNCERTAIN;
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
    double t0, done_at; /* submitted, completed */
    bool done;
    const char *what; /* for the message when it does not complete */
} pending;

/* kvcr_stats_take: every snapshot adds its interval's pull parts to the
 * engine's split (a snapshot holds only what came since the last). */
static int take_stats(engine *e, kvcr_stats **s)
{
    int rc = kvcr_stats_take(e->kv, s);
    if (rc == 0) demo_add_split(&e->split, *s);
    return rc;
}

/* KVCR's gauges on stderr: what a stuck operation was waiting behind. */
static void show_state(engine *e)
{
    kvcr_stats *s = NULL;
    if (take_stats(e, &s) != 0 || s == NULL) return;
    fprintf(stderr, "kvcr demo: engine %d: KVCR gauges:", e->idx);
    for (size_t i = 0; i < s->n_gauges; i++)
        fprintf(stderr, " %s=%g", s->gauges[i].resource, s->gauges[i].value);
    fprintf(stderr, "\n");
    kvcr_stats_free(s);
}

/* When a wait that starts now gives up: WAIT_LIMIT_S, or the engine's own
 * deadline if sooner. */
static double wait_until(const engine *e)
{
    double until = tool_now() + WAIT_LIMIT_S;
    return until < e->deadline ? until : e->deadline;
}

/* Polls until every operation in p[0..n) completed (n may be 0). */
static int wait_ops(engine *e, pending *p, int n)
{
    double until = wait_until(e);
    for (;;) {
        kvcr_op_result *res;
        size_t n_res;
        int rc = kvcr_poll(e->kv, &res, &n_res);
        if (rc != 0) return fail(e, "kvcr_poll", rc);
        double now = tool_now();
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
            for (int k = 0; k < n && now <= e->deadline; k++)
                if (!p[k].done)
                    fprintf(stderr,
                            "kvcr demo: engine %d: %s of %zu blocks not completed within "
                            "%.0f s\n",
                            e->idx, p[k].what, p[k].n, WAIT_LIMIT_S);
            show_state(e);
            return 1;
        }
        struct pollfd pfd = {e->kfd, POLLIN, 0};
        poll(&pfd, 1, 1);
    }
}

/* What the router's KV events say of block idx of a request: its parent
 * (the block before it), and DEMO_BLOCK_TOKENS token ids made up from its
 * hash (the demo has no tokenizer; the router only needs them to be the
 * block's own). */
enum { DEMO_BLOCK_TOKENS = 16 };

static void router_block(const kvcr_key *keys, uint32_t idx, uint32_t *tokens,
                         kvcr_router_block *rb)
{
    uint64_t h;
    memcpy(&h, keys[idx].data, 8);
    for (uint32_t t = 0; t < DEMO_BLOCK_TOKENS; t++)
        tokens[t] = (uint32_t)(demo_mix(h + t) % 32000u);
    *rb = (kvcr_router_block){.token_ids = tokens, .block_size_tokens = DEMO_BLOCK_TOKENS};
    if (idx > 0) {
        rb->has_parent = true;
        memcpy(&rb->parent_hash, keys[idx - 1].data, 8);
    }
}

/* Submits a deliver (or deposit when deliver is false) of blocks listed by
 * index: key keys[idx[i]], framework element el[idx[i]]. A deposit tells
 * the KV events each block's parent and tokens. */
static int submit(engine *e, bool deliver, const kvcr_key *keys, const uint32_t *el,
                  const uint32_t *idx, size_t n, const char *rid, pending *p,
                  kvcr_entry_status *st, kvcr_reason *why, const char *what)
{
    *p = (pending){.n = n, .st = st, .why = why, .done = n == 0, .what = what, .t0 = tool_now()};
    if (n == 0) return 0;
    kvcr_mem_ref refs[DEMO_MAX_BLOCKS];
    kvcr_block b[DEMO_MAX_BLOCKS];
    for (size_t i = 0; i < n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, "", el[idx[i]]};
        b[i] = (kvcr_block){keys[idx[i]], &refs[i], 1};
    }
    static uint32_t tokens[DEMO_MAX_BLOCKS][DEMO_BLOCK_TOKENS];
    kvcr_router_block rb[DEMO_MAX_BLOCKS];
    for (size_t i = 0; !deliver && i < n; i++) router_block(keys, idx[i], tokens[i], &rb[i]);
    kvcr_deposit_options opts = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .router = rb};
    int rc = deliver ? kvcr_deliver(e->kv, b, n, rid, &p->op)
                     : kvcr_deposit_ex(e->kv, b, n, &opts, &p->op);
    return rc == 0 ? 0 : fail(e, deliver ? "kvcr_deliver" : "kvcr_deposit_ex", rc);
}

/* ---- one request ---------------------------------------------------------------- */

/* A framework element neither UNCERTAIN nor taken, lowest first. When
 * none is, polls KVCR until a QUIESCED frees one (bounded); only called
 * with none of our operations pending, so no result is lost. */
static int free_element(engine *e, const bool *taken, uint32_t *out)
{
    double until = wait_until(e);
    for (;;) {
        for (uint32_t x = 0; x < FW_ELEMENTS; x++)
            if (!e->uncertain[x] && !taken[x]) {
                *out = x;
                return 0;
            }
        if (tool_now() > until) {
            fprintf(stderr, "kvcr demo: engine %d: no framework block free: the rest are still "
                            "UNCERTAIN (a failed deliver may still write them)\n", e->idx);
            return 1;
        }
        kvcr_op_result *res;
        size_t n_res;
        int rc = kvcr_poll(e->kv, &res, &n_res);
        if (rc != 0) return fail(e, "kvcr_poll", rc);
        kvcr_results_free(res);
        usleep(1000);
    }
}

/* The framework elements of a request's n blocks (el[i] for block i). */
static int take_elements(engine *e, uint32_t *el, size_t n)
{
    bool taken[FW_ELEMENTS] = {false};
    for (size_t i = 0; i < n; i++) {
        if (free_element(e, taken, &el[i]) != 0) return 1;
        taken[el[i]] = true;
    }
    return 0;
}

/* Blocks listed in pos[0..n_pos) whose element a failed deliver left
 * UNCERTAIN move to a free one before anything is written there. */
static int move_off_uncertain(engine *e, uint32_t *el, size_t n, const uint32_t *pos,
                              size_t n_pos)
{
    bool taken[FW_ELEMENTS] = {false};
    for (size_t i = 0; i < n; i++) taken[el[i]] = true;
    for (size_t i = 0; i < n_pos; i++) {
        if (!e->uncertain[el[pos[i]]]) continue;
        if (free_element(e, taken, &el[pos[i]]) != 0) return 1;
        taken[el[pos[i]]] = true;
    }
    return 0;
}

/* The request's slowest operations, of p[0..n) (completed; n == 0 ones count 0 s). */
static void timed(demo_result *out, const pending *p, int n)
{
    for (int k = 0; k < n; k++) {
        double s = p[k].n ? p[k].done_at - p[k].t0 : 0;
        if (s > out->slowest_op_s) out->slowest_op_s = s;
        out->slow_ops += s > DEMO_SLOW_OP_S;
    }
}

static int serve(engine *e, const demo_req *rq, const uint64_t *hashes, const char *hint,
                 demo_result *out)
{
    double t0 = tool_now();
    size_t n = rq->n_blocks, bs = e->bs;
    char rid[32];
    snprintf(rid, sizeof rid, "req-%" PRIu32, rq->req_no);
    *out = (demo_result){
        .req_no = rq->req_no, .engine = e->idx, .source = rq->source, .n_blocks = (uint32_t)n};
    uint32_t el[DEMO_MAX_BLOCKS];
    if (take_elements(e, el, n) != 0) return 1;
    /* Last request's blocks must not pass for this one's. */
    for (size_t i = 0; i < n; i++) memset(e->fw + el[i] * bs, 0xA5, bs);

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

    /* loc: this engine's own tiers (KVCR DRAM, its G3 file); rem: a peer's. */
    uint32_t loc[DEMO_MAX_BLOCKS], rem[DEMO_MAX_BLOCKS], redo[DEMO_MAX_BLOCKS];
    uint32_t keep[DEMO_MAX_BLOCKS];
    size_t n_loc = 0, n_rem = 0, n_redo = 0, n_keep = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* A block whose spill to G3 is still written (FETCHING in G3)
         * cannot be delivered yet: recomputed, as a miss is. */
        if (q[i].status == KVCR_QUERY_HIT ||
            (q[i].status == KVCR_QUERY_FETCHING && q[i].tier == KVCR_TIER_LOCAL_G2) ||
            (q[i].status == KVCR_QUERY_FETCHABLE && q[i].tier == KVCR_TIER_G3))
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
    double r0 = tool_now();
    if (submit(e, true, keys, el, rem, n_rem, rid, &p[0], st[0], why[0],
               "a deliver from a peer") != 0)
        return 1;
    double l0 = tool_now();
    if (submit(e, true, keys, el, loc, n_loc, rid, &p[1], st[1], why[1],
               "a deliver from KVCR DRAM and G3") != 0)
        return 1;
    if (wait_ops(e, p, 2) != 0) return 1;
    if (n_rem) {
        out->peer_t0 = r0;
        out->peer_s = p[0].done_at - r0;
    }
    if (n_loc) out->local_s = p[1].done_at - l0;
    timed(out, p, 2);

    for (size_t i = 0; i < n_rem; i++) {
        if (st[0][i] == KVCR_ENTRY_SUCCESS) {
            out->remote_hit++;
            out->guard_hit += (rq->flags & DEMO_REQ_SOURCE_DOWN) != 0;
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
            if (q[loc[i]].status == KVCR_QUERY_HIT && q[loc[i]].tier == KVCR_TIER_LOCAL_G2)
                out->held |= 1ull << loc[i];
            out->local_hit++;
            out->g3_hit += q[loc[i]].tier == KVCR_TIER_G3;
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
            uint64_t bad = demo_verify(e->fw + el[idx[i]] * bs, bs, hashes[idx[i]]);
            out->verified_blocks++;
            out->wrong_bytes += bad;
            if (bad)
                fprintf(stderr,
                        "kvcr demo: engine %d: block %" PRIu32 " of request %" PRIu32
                        " (%s) has %" PRIu64 " wrong bytes\n",
                        e->idx, idx[i], rq->req_no,
                        k == 1 ? (q[idx[i]].tier == KVCR_TIER_G3 ? "G3" : "local")
                        : rq->flags & DEMO_REQ_SOURCE_DOWN ? "from a Guard"
                                                            : "pulled from a peer",
                        bad);
        }
    }
    /* "Prefill": the KV of the blocks nobody had. Its cost is modelled by
     * the driver (prefill_ms per block), not slept. */
    if (move_off_uncertain(e, el, n, redo, n_redo) != 0) return 1;
    for (size_t i = 0; i < n_redo; i++) {
        demo_fill(e->fw + el[redo[i]] * bs, bs, hashes[redo[i]]);
        keep[n_keep++] = redo[i];
    }
    out->recomputed = (uint32_t)n_redo;

    if (submit(e, false, keys, el, keep, n_keep, NULL, &p[0], st[0], why[0], "a deposit") != 0)
        return 1;
    if (wait_ops(e, p, 1) != 0) return 1;
    timed(out, p, 1);
    for (size_t i = 0; i < n_keep; i++) {
        if (st[0][i] == KVCR_ENTRY_SUCCESS) {
            out->deposited++;
            out->held |= 1ull << keep[i];
        } else {
            out->deposit_not_stored++;
        }
    }
    /* One more poll: the inventory of that deposit goes to the KV events
     * (the router holds this answer back until its index has it: the
     * request's next turn may need it). */
    kvcr_op_result *res;
    size_t n_res;
    if ((rc = kvcr_poll(e->kv, &res, &n_res)) != 0) return fail(e, "kvcr_poll", rc);
    kvcr_results_free(res);
    if ((rc = kvcr_discard_hint(e->kv, rid)) != 0) return fail(e, "kvcr_discard_hint", rc);
    out->resilience = e->resilience;
    e->resilience = 0;
    out->wall_s = tool_now() - t0;
    return 0;
}

/* ---- the process ------------------------------------------------------------------ */

/* A gauge of a kvcr_stats snapshot by resource name; 0 when it has none. */
static double gauge(const kvcr_stats *s, const char *name)
{
    for (size_t i = 0; s && i < s->n_gauges; i++)
        if (strcmp(s->gauges[i].resource, name) == 0) return s->gauges[i].value;
    return 0;
}

static uint32_t count_of(double v)
{
    return v > 0 ? (uint32_t)v : 0;
}

/* kvcr_create, asked again while a restarted engine's claim is refused
 * because the service has not yet seen the old process die. */
static int create(engine *e, const kvcr_config *cfg)
{
    double until = tool_now() + CLAIM_RETRY_S;
    for (;;) {
        int rc = kvcr_create(cfg, &e->kv);
        if (rc != KVCR_EREFUSED || !e->o->chaos || tool_now() > until) return rc;
        usleep(50000);
    }
}

/* What is in this engine's tiers right after it started: blocks the Guard
 * handed back and blocks its G3 file still holds. */
static void recovered(engine *e, demo_hello *h)
{
    kvcr_stats *s = NULL;
    if (take_stats(e, &s) != 0) return;
    h->recovered_g2 = count_of(gauge(s, "local_g2_allocated_slots"));
    h->recovered_g3 = count_of(gauge(s, "g3_allocated_slots"));
    kvcr_stats_free(s);
}

static int start(engine *e)
{
    const demo_opts *o = e->o;
    e->bs = o->block_size;
    size_t fw_bytes = e->bs * FW_ELEMENTS;
    size_t pool_bytes = o->chaos ? e->bs : e->bs * (size_t)o->slots; /* guard mode: unused */
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
    kvcr_region fw = {.addr = e->fw, .element_size = e->bs, .count = FW_ELEMENTS, .label = ""};
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
    /* --hosts: bound to and advertised on this engine's rig address, which
     * UCX also reaches the other hosts by */
    cfg.remote.control_host = o->hosts ? o->engine_addr[e->idx] : "127.0.0.1";
    const char *allowed[DEMO_MAX_ENGINES];
    for (int i = 0; o->curve && i < o->engines; i++) allowed[i] = o->curve_public[i];
    if (o->curve)
        cfg.remote.curve = (kvcr_curve_options){o->curve_secret[e->idx], o->curve_public[e->idx],
                                                allowed, (size_t)o->engines};
    cfg.remote.control_port = 0;
    cfg.callbacks.ud = e;
    cfg.callbacks.key_hash = key_hash;
    cfg.callbacks.resilience = on_resilience;
    /* The router's index: KV events on our bound socket (as a vLLM
     * engine binds its port on every address), replay on ours. */
    char kv_pub[DEMO_ENDPOINT_MAX], kv_sub[DEMO_ENDPOINT_MAX], kv_replay[DEMO_ENDPOINT_MAX];
    char topic[64];
    demo_kv_endpoints(o, e->idx, kv_pub, sizeof kv_pub, kv_sub, sizeof kv_sub, kv_replay,
                      sizeof kv_replay);
    snprintf(topic, sizeof topic, "kv@engine-%d@demo", e->idx);
    cfg.kv_events.endpoint = kv_pub;
    cfg.kv_events.replay_endpoint = kv_replay;
    cfg.kv_events.topic = topic;
    cfg.kv_events.batch_interval_ms = 1;
    cfg.enable_telemetry = true; /* the gauges: what was recovered, what leaked */
    char g3_path[512];
    const char *g3_paths[1] = {g3_path};
    if (o->chaos) {
        cfg.local_dram = NULL;
        cfg.n_local_dram = 0;
        cfg.guard.service_socket_path = o->service_socket;
        cfg.guard.guard_index = (uint32_t)e->idx;
        cfg.guard.compatibility_digest = o->digest;
        snprintf(g3_path, sizeof g3_path, "%s/engine-%d.g3", o->g3_dir, e->idx);
        cfg.g3.paths = g3_paths;
        cfg.g3.n_paths = 1;
        cfg.g3.capacity_bytes_per_file = (uint64_t)o->g3_slots * e->bs;
    }
    int rc = create(e, &cfg);
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
    recovered(e, &h);
    if (demo_send(e->to_router, MSG_HELLO, &h, sizeof h, NULL, 0) != 0) return 1;
    return 0;
}

/* After STOP, with every request answered: waits (bounded) for G3 writes
 * still going out, then tells the router what KVCR still holds. */
static int bye(engine *e)
{
    demo_bye b = {.engine = e->idx};
    double until = tool_now() + DRAIN_LIMIT_S;
    for (;;) {
        kvcr_op_result *res;
        size_t n_res;
        int rc = kvcr_poll(e->kv, &res, &n_res);
        if (rc != 0) return fail(e, "kvcr_poll", rc);
        kvcr_results_free(res);
        kvcr_stats *s = NULL;
        if ((rc = take_stats(e, &s)) != 0) return fail(e, "kvcr_stats_take", rc);
        b.slots = count_of(gauge(s, "local_g2_allocated_slots") -
                           gauge(s, "local_g2_evictable_slots"));
        b.g3 = count_of(gauge(s, "g3_allocated_slots") - gauge(s, "g3_evictable_slots") +
                        gauge(s, "g3_pending_stores"));
        b.ops = count_of(gauge(s, "in_flight_ops") + gauge(s, "hinted_requests"));
        b.pins = count_of(gauge(s, "framework_pins") + gauge(s, "pinned_keys") +
                          gauge(s, "source_writes_in_flight"));
        kvcr_stats_free(s);
        if ((b.slots == 0 && b.g3 == 0 && b.ops == 0 && b.pins == 0) || tool_now() > until) break;
        usleep(10000);
    }
    b.split = e->split;
    return demo_send(e->to_router, MSG_BYE, &b, sizeof b, NULL, 0) != 0;
}

/* While the G3 file system is full (--chaos): see demo_chaos.c. */
static void disk_full(engine *e, const uint8_t *msg, size_t len)
{
    demo_disk d;
    if (len != sizeof d) return;
    memcpy(&d, msg, sizeof d);
    kvcr__test_g3_fail_next(e->kv, d.fail_n, d.err);
}

/* Serves requests until STOP; polls KVCR at least every 10 ms meanwhile,
 * so peers pulling from us make progress. */
static int loop(engine *e)
{
    static uint8_t msg[DEMO_MSG_MAX];
    for (;;) {
        if (tool_now() > e->deadline) {
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
        if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
        uint32_t type;
        size_t len;
        if (demo_recv(e->from_router, &type, msg, sizeof msg, &len, e->deadline) != 0)
            return 1; /* the router is gone: it reports why */
        if (type == MSG_STOP) return bye(e);
        if (type == MSG_DISK) {
            disk_full(e, msg, len);
            continue;
        }
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
        if (demo_send(e->to_router, MSG_DONE, &out, sizeof out, hashes, rq.n_blocks * 8) != 0)
            return 1;
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
