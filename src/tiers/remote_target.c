/* Target side of the peer tier: pulls. A pull is built on the caller's
 * thread under the lock (the core's begin/read/end of core/tier.h), sent as
 * one start_write from there (by the progress thread when it was held),
 * driven by the progress thread, and settled back on the caller's
 * thread in kvcr_poll() (the tier's settle). Its destinations (framework blocks of a deliver,
 * KVCR slots of a fetch) are never given back while the source may still
 * write them: past the deadline the pull waits for terminal evidence, past
 * the abandon deadline it is reported uncertain and kept until the source
 * proves it quiet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/stats.h"
#include "tiers/remote_int.h"
#include "util/clock.h"

#define MS 1000000ull

/* ---- hints ---------------------------------------------------------------- */

static bool has_hash(const hint *h, uint64_t x)
{
    size_t lo = 0, hi = h->n_hashes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (h->hashes[mid] == x) return true;
        if (h->hashes[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

bool target_holds(remote *r, const tier_batch *b, const uint8_t *key, uint32_t key_len)
{
    const kvcr_conf *conf = host_conf(r->kv);
    const hint_state *st = b->st;
    if (st->failed || conf->cb.key_hash == NULL) return false;
    if (hint_state_is_miss(st, host_key_hash(key, key_len))) return false;
    if (conf->remote.opportunistic_query) return true;
    uint64_t h;
    kvcr_key k = {key, key_len};
    if (conf->cb.key_hash(conf->cb.ud, &k, &h) != 0) return false;
    return has_hash(&st->hint, h);
}

/* ---- building a pull (main thread, locked) --------------------------------- */

static void pull_free(pull *p)
{
    if (p == NULL) return;
    free(p->keys);
    free(p->refs);
    free(p->key_bytes);
    free(p->request_id);
    free(p->ranges);
    free(p);
}

static pull *pull_new(remote *r, const hint_state *st, const tier_batch_info *info)
{
    const kvcr_conf *conf = host_conf(r->kv);
    pull *p = calloc(1, sizeof *p);
    if (p == NULL) goto oom;
    p->keys = calloc(info->max_keys ? info->max_keys : 1, sizeof *p->keys);
    p->refs = calloc(info->max_refs ? info->max_refs : 1, sizeof *p->refs);
    p->request_id = strdup(st->request_id);
    if (p->keys == NULL || p->refs == NULL || p->request_id == NULL) goto oom;
    p->batch = (tier_batch){st, p};
    p->cap_keys = (uint32_t)info->max_keys;
    p->cap_refs = (uint32_t)info->max_refs;
    p->handle = info->fetch ? -(int64_t)info->op : (int64_t)info->op;
    p->fetch = info->fetch;
    snprintf(p->source, sizeof p->source, "%s", st->hint.source);
    p->start_ns = kvcr_now_ns();
    p->deadline_ns = p->start_ns + (uint64_t)conf->operation_timeout_ms * MS;
    p->abandon_ns = p->start_ns + (uint64_t)conf->abandon_timeout_ms * MS;
    return p;
oom:
    kvcr_log(host_logger(r->kv), KVCR_LOG_ERROR, "out of memory: no remote pull for this operation");
    pull_free(p);
    return NULL;
}

/* A query's batch is only the request's usable hint; an operation's is a
 * new pull. NULL: no usable hint (or no memory), the tier has nothing. */
tier_batch *target_begin(remote *r, const tier_batch_info *info)
{
    hint_state *st = info->request_id ? host_hint(r->kv, info->request_id) : NULL;
    if (st == NULL || st->failed) return NULL;
    if (info->op == 0) {
        r->query = (tier_batch){st, NULL};
        return &r->query;
    }
    pull *p = pull_new(r, st, info);
    return p ? &p->batch : NULL;
}

static bool add_key_bytes(pull *p, pull_key *k, const uint8_t *key, uint32_t len)
{
    if (p->key_used + len > p->key_cap) {
        size_t cap = p->key_cap ? 2 * p->key_cap : 256;
        while (cap < p->key_used + len) cap *= 2;
        uint8_t *b = realloc(p->key_bytes, cap);
        if (b == NULL) return false;
        p->key_bytes = b;
        p->key_cap = cap;
    }
    memcpy(p->key_bytes + p->key_used, key, len);
    k->key_off = (uint32_t)p->key_used;
    k->key_len = len;
    p->key_used += len;
    return true;
}

/* The destinations travel as references the source resolves against our
 * metadata: (region label, element index) of a deliver's framework blocks,
 * (pool name, slot) of a fetch's KVCR slots. The pull keeps the labels'
 * pointers until it is freed, long after the call: core/tier.h has them
 * owned by the configuration. */
kvcr_reason target_read(remote *r, tier_batch *b, const tier_read *rd)
{
    (void)r;
    pull *p = b->p;
    if (p == NULL || p->n_keys == p->cap_keys || rd->n_dst > p->cap_refs - p->n_refs)
        return KVCR_REASON_NO_CAPACITY; /* beyond the bounds begin() was given */
    pull_key *k = &p->keys[p->n_keys];
    *k = (pull_key){.tok = rd->token, .ref_off = p->n_refs, .n_refs = rd->n_dst};
    if (!add_key_bytes(p, k, rd->key, rd->key_len)) return KVCR_REASON_NO_CAPACITY;
    for (uint32_t j = 0; j < rd->n_dst; j++) {
        const tier_dst *d = &rd->dst[j];
        const char *label = d->label ? d->label : "";
        p->refs[p->n_refs++] =
            (wire_ref){d->framework, {(const uint8_t *)label, strlen(label)}, d->index};
    }
    p->n_keys++;
    return KVCR_REASON_NONE;
}

/* ---- pulls by handle (locked) ---------------------------------------------- */

static uint32_t pull_bucket(int64_t handle)
{
    return (uint32_t)(((uint64_t)handle * 0x9e3779b97f4a7c15ull) >> 32) % PULL_BUCKETS;
}

static void index_add(remote *r, pull *p)
{
    pull **b = &r->pull_index[pull_bucket(p->handle)];
    p->hnext = *b;
    *b = p;
}

static void index_remove(remote *r, pull *p)
{
    pull **link = &r->pull_index[pull_bucket(p->handle)];
    while (*link != p) link = &(*link)->hnext;
    *link = p->hnext;
}

/* The live pull of an op handle (handles are unique among live pulls). */
static pull *pull_by_handle(remote *r, int64_t handle)
{
    pull *p = r->pull_index[pull_bucket(handle)];
    while (p != NULL && p->handle != handle) p = p->hnext;
    return p;
}

static bool ask_inline(remote *r, const pull *p);
static bool comes_by_messages(remote *r, const pull *p);
static bool adopt(remote *r, pull *p, uint64_t now, uint64_t *next_ns);

/* Hands the pull to the progress thread (frees it when it has no keys).
 * A pull whose bytes come inline in its write_done is sent from here: on
 * one host the hand-off to the progress thread was 15-20 us of a one-block
 * deliver (docs/BENCHMARKS.md), and its answer wakes that thread anyway.
 * So is one whose bytes can only come as messages (comes_by_messages):
 * the sink takes the lock before it copies them. Across hosts under load
 * the hand-off was 0.2-1.5 ms of a pull in `kvcr demo --hosts` (the
 * thread busy in UCX, or waiting for a CPU). Other pulls are sent by the
 * progress thread: their bytes may come as puts our UCX worker copies into
 * the destinations, within a ucx_progress call that began before a send
 * from here. The network orders those copies after the caller's own
 * writes, but a race detector sees only the lock, which the progress
 * thread takes from us before it sends. */
void target_end(remote *r, tier_batch *b)
{
    pull *p = b->p;
    if (p == NULL) return; /* a query */
    if (p->n_keys == 0) {
        pull_free(p);
        return;
    }
    p->batch = (tier_batch){NULL, NULL};
    p->state = PULL_START;
    p->next = r->pulls;
    if (r->pulls) r->pulls->prev = p;
    r->pulls = p;
    index_add(r, p);
    r->n_pulls++;
    uint64_t ignored = UINT64_MAX;
    p->inline_asked = ask_inline(r, p); /* fixed by the pull's destinations */
    if ((p->inline_asked || comes_by_messages(r, p)) && adopt(r, p, kvcr_now_ns(), &ignored))
        return;
    remote_wake(r);
}

/* ---- progress side -------------------------------------------------------- */

static void owe_main(remote *r, pull *p, uint8_t flag)
{
    p->main_flags |= flag;
    if (p->in_todo) return;
    p->in_todo = true;
    p->todo_next = NULL;
    if (r->todo_tail)
        r->todo_tail->todo_next = p;
    else
        r->todo = p;
    r->todo_tail = p;
    remote_owe_main(r);
}

/* A pull that ends without its write may still have its source's bytes
 * unread in our UCX (a socket's receive queue, a shared-memory FIFO) when
 * we were stopped and the answer came first: the progress thread runs UCX
 * once more before the polling thread can reuse the blocks (ucx_fence). */
static void finish(remote *r, pull *p, bool success, kvcr_reason why)
{
    if (!success) r->ucx_fence = true;
    p->state = PULL_FINISHED;
    p->finished_ns = kvcr_now_ns();
    p->success = success;
    p->fail_reason = (uint8_t)why;
    owe_main(r, p, PM_FINISHED);
}

static int by_addr(const void *a, const void *b)
{
    const mem_piece *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

/* Where writes sent as messages may land for this pull (made at its first
 * message): its destinations' pieces in our own regions, sorted, touching
 * or overlapping ones merged (a source merges a run of neighbouring blocks
 * into one message). False, with no ranges: out of memory, or a
 * destination that does not resolve (then no message is taken). */
static bool ranges_room(mem_piece **g, uint32_t *cap, uint32_t need)
{
    if (need <= *cap) return true;
    mem_piece *grown = realloc(*g, 2 * (size_t)need * sizeof *grown);
    if (grown == NULL) return false;
    *g = grown;
    *cap = 2 * need;
    return true;
}

/* Appends the pieces of refs [lo, hi) of p to *g. False: out of memory
 * or a ref that does not resolve (*g is then freed). */
static bool add_ref_pieces(remote *r, const pull *p, uint32_t lo, uint32_t hi, mem_piece **g,
                           uint32_t *n, uint32_t *cap)
{
    mem_piece one[PIECES_MAX];
    for (uint32_t i = lo; i < hi; i++) {
        const wire_ref *ref = &p->refs[i];
        const char *why = NULL;
        uint32_t k = pieces_resolve(r->own_geom, r->md.n_regions, ref->framework,
                                    (const char *)ref->label.data, ref->index, one, &why);
        if (k == 0 || !ranges_room(g, cap, *n + k)) {
            free(*g);
            *g = NULL;
            return false;
        }
        memcpy(&(*g)[*n], one, k * sizeof *one);
        *n += k;
    }
    return true;
}

/* Sorts g[0..n) and merges touching or overlapping pieces; the count left. */
static uint32_t merge_ranges(mem_piece *g, uint32_t n)
{
    qsort(g, n, sizeof *g, by_addr);
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        mem_piece *last = m ? &g[m - 1] : NULL;
        if (last && g[i].addr <= last->addr + last->len) {
            uint64_t end = g[i].addr + g[i].len;
            if (end > last->addr + last->len) last->len = end - last->addr;
        } else {
            g[m++] = g[i];
        }
    }
    return m;
}

static bool build_ranges(remote *r, pull *p)
{
    uint32_t n = 0, cap = 0;
    mem_piece *g = NULL;
    if (!add_ref_pieces(r, p, 0, p->n_refs, &g, &n, &cap) || g == NULL) return false;
    p->ranges = g;
    p->n_ranges = merge_ranges(g, n);
    return true;
}

/* Whether [addr, addr + len) lies inside one of the sorted, merged ranges
 * g[0..n). */
static bool in_ranges(const mem_piece *g, uint32_t n, uint64_t addr, uint64_t len)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) { /* the last range that starts at or before addr */
        uint32_t mid = lo + (hi - lo) / 2;
        if (g[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return false;
    const mem_piece *at = &g[lo - 1];
    return addr - at->addr <= at->len && len <= at->len - (addr - at->addr);
}

/* The destination pieces of the pull's ref i, resolved as the source
 * resolves them (0: it does not resolve). Progress thread, locked. */
static uint32_t ref_pieces(remote *r, const pull *p, uint32_t i, mem_piece *one)
{
    const wire_ref *ref = &p->refs[i];
    const char *why = NULL;
    return pieces_resolve(r->own_geom, r->md.n_regions, ref->framework,
                          (const char *)ref->label.data, ref->index, one, &why);
}

/* Whether the pull asks for its bytes inline in write_done: inline writes
 * are on (r->inline_max), its destinations hold at most that many bytes,
 * and the write_done fits the control messages we receive (its other
 * fields: the envelope, an index per key, a run of at most 19 bytes per
 * piece pair, 2 * PIECES_MAX at most per destination). */
static bool ask_inline(remote *r, const pull *p)
{
    if (r->inline_max == 0) return false;
    mem_piece one[PIECES_MAX];
    uint64_t total = 0;
    for (uint32_t i = 0; i < p->n_refs; i++) {
        uint32_t k = ref_pieces(r, p, i, one);
        if (k == 0) return false;
        for (uint32_t j = 0; j < k; j++) total += one[j].len;
        if (total > r->inline_max) return false;
    }
    uint64_t other = 4096 + 5ull * p->n_keys + 19ull * 2 * PIECES_MAX * p->n_refs;
    return total + other <= host_conf(r->kv)->limits.max_control_message_bytes;
}

/* Whether every destination piece of the pull holds at least min bytes
 * (as the source sees them: ref_pieces). Locked. */
static bool pieces_at_least(remote *r, const pull *p, uint64_t min)
{
    mem_piece one[PIECES_MAX];
    for (uint32_t i = 0; i < p->n_refs; i++) {
        uint32_t k = ref_pieces(r, p, i, one);
        if (k == 0) return false;
        for (uint32_t j = 0; j < k; j++)
            if (one[j].len < min) return false;
    }
    return true;
}

/* Whether the pull's bytes can only come as messages, which our sink
 * copies under the lock (target_take_bytes): the source's incarnation we
 * know (the one start_write will expect, so that no other serves it)
 * writes to us by messages, and the pull will not agree to puts
 * (send_start_write's put_min). Locked. */
static bool comes_by_messages(remote *r, const pull *p)
{
    const rpeer *peer = peer_get(r, p->source, false);
    if (peer == NULL || !peer->has_inc || !peer->messages ||
        memcmp(peer->messages_inc, peer->inc, sizeof peer->inc) != 0)
        return false;
    return r->put_min == 0 || !pieces_at_least(r, p, r->put_min);
}

static void send_start_write(remote *r, pull *p, uint64_t now)
{
    rpeer *peer = peer_get(r, p->source, true);
    if (peer && peer->has_inc) {
        p->has_inc = true;
        memcpy(p->inc, peer->inc, sizeof p->inc);
    }
    if (now >= p->deadline_ns) {
        finish(r, p, false, KVCR_REASON_TIMEOUT);
        return;
    }
    wire_bytes *keys = calloc(p->n_keys, sizeof *keys);
    uint32_t *ref_off = calloc(p->n_keys + 1, sizeof *ref_off);
    int rc = keys && ref_off ? 0 : KVCR_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < p->n_keys; i++) {
        keys[i] = (wire_bytes){p->key_bytes + p->keys[i].key_off, p->keys[i].key_len};
        ref_off[i] = p->keys[i].ref_off;
    }
    if (rc == 0) {
        ref_off[p->n_keys] = p->n_refs;
        bool put_min = !p->inline_asked && r->put_min > 0;
        p->puts_agreed = put_min && pieces_at_least(r, p, r->put_min);
        wire_msg m = {.type = WIRE_START_WRITE, .has_op = true, .op = p->handle,
                      .remaining_ms = (double)(p->deadline_ns - now) / 1e6,
                      .n_keys = p->n_keys, .keys = keys, .ref_off = ref_off, .refs = p->refs,
                      .has_expected_inc = p->has_inc,
                      .expected_inc = {p->inc, WIRE_INCARNATION_LEN},
                      .inline_write = p->inline_asked,
                      .has_put_min = put_min, .put_min = r->put_min};
        p->sent_ns = kvcr_now_ns();
        rc = send_msg(r, p->source, &m, MD_FORCE);
        p->sent_md = m.has_metadata;
    }
    free(keys);
    free(ref_off);
    if (rc != 0) {
        kvcr_log(host_logger(r->kv), KVCR_LOG_WARN, "cannot send start_write %lld to %s: %s",
                 (long long)p->handle, p->source, kvcr_last_error());
        finish(r, p, false, KVCR_REASON_TRANSFER_ERROR);
        return;
    }
    p->state = PULL_WAIT_DONE;
}

static void next_at(uint64_t *next_ns, uint64_t t)
{
    if (t < *next_ns) *next_ns = t;
}

/* An earlier pull from p's source still waits, past its deadline, for
 * proof that the source is quiet (it may have put into our memory), and
 * nothing came from the source since that deadline: the source is silent. */
static pull *silent_source(remote *r, const pull *p)
{
    const rpeer *peer = peer_get(r, p->source, false);
    if (peer == NULL) return NULL;
    for (pull *q = r->pulls; q; q = q->next)
        if ((q->state == PULL_WAIT_TERMINAL || q->state == PULL_QUARANTINED) &&
            peer->heard_ns < q->deadline_ns && strcmp(q->source, p->source) == 0)
            return q;
    return NULL;
}

/* New pulls are sent, but not to a silent source: every write sent there
 * that may put would hold its destination until the source answers, so a
 * source that vanished would take a slot with each pull. A held pull goes
 * when the source answers anything (its earlier pulls are probed at least
 * every HOLD_PROBE_MS while pulls wait for it), or fails with TIMEOUT at its
 * deadline with nothing sent and its memory free. */
#define HOLD_PROBE_MS 250u

/* Sends a new pull's start_write, or holds it (false) while its source is
 * silent. */
static bool adopt(remote *r, pull *p, uint64_t now, uint64_t *next_ns)
{
    pull *q = now < p->deadline_ns ? silent_source(r, p) : NULL;
    if (q == NULL) {
        send_start_write(r, p, now);
        return true;
    }
    if (!p->held) {
        p->held = true;
        r->pulls_held++;
        kvcr_log_limited(host_logger(r->kv), &r->held_log, 1000,
                         "pull %lld from %s waits: the source has not answered since an "
                         "earlier pull's deadline",
                         (long long)p->handle, p->source);
    }
    if (q->reprobe_ns > now + HOLD_PROBE_MS * MS) q->reprobe_ns = now + HOLD_PROBE_MS * MS;
    next_at(next_ns, q->reprobe_ns);
    next_at(next_ns, p->deadline_ns);
    return false;
}

/* Pulls the callers left waiting (held) go once their source answers. */
void target_adopt(remote *r, uint64_t now, uint64_t *next_ns)
{
    for (pull *p = r->pulls; p; p = p->next)
        if (p->state == PULL_START) adopt(r, p, now, next_ns);
}

static pull *find_pull(remote *r, const wire_msg *m)
{
    pull *p = m->has_op ? pull_by_handle(r, m->op) : NULL;
    if (p != NULL && p->state != PULL_FINISHED && p->state != PULL_START &&
        strlen(p->source) == m->from.len && memcmp(p->source, m->from.data, m->from.len) == 0)
        return p;
    return NULL;
}

static bool inc_is(const uint8_t *inc, const wire_bytes *b)
{
    return b->len == WIRE_INCARNATION_LEN && memcmp(inc, b->data, WIRE_INCARNATION_LEN) == 0;
}

/* A pull waiting for terminal evidence probes again and again, backing off:
 * the answer that frees it may come only later, from whoever answers on the
 * source's endpoint next (a Guard or a restarted engine that knows the
 * incarnation is retired), and a single probe may be lost with the dead. */
#define REPROBE_FIRST_MS 500u
#define REPROBE_MAX_MS 30000u

static void send_probe(remote *r, pull *p)
{
    wire_msg m = {.type = WIRE_WRITE_PROBE, .has_op = true, .op = p->handle,
                  .has_expected_inc = p->has_inc, .expected_inc = {p->inc, WIRE_INCARNATION_LEN}};
    p->probe_due = send_msg(r, p->source, &m, MD_RETRY) != 0;
    p->reprobe_ms = p->reprobe_ms == 0 ? REPROBE_FIRST_MS
                    : p->reprobe_ms < REPROBE_MAX_MS / 2 ? 2 * p->reprobe_ms
                                                         : REPROBE_MAX_MS;
    p->reprobe_ns = kvcr_now_ns() + (uint64_t)p->reprobe_ms * MS;
}

/* Past the deadline (or told the source cancelled): wait for terminal
 * evidence until the abandon deadline, asking for it with a probe. */
static void enter_wait_terminal(remote *r, pull *p)
{
    p->state = PULL_WAIT_TERMINAL;
    peer_invalidate(r, p->source);
    send_probe(r, p);
    if (p->fetch) owe_main(r, p, PM_DISCARD);
}

/* Terminal evidence: the source will not write any more. */
static void on_terminal(remote *r, pull *p, bool success, const uint32_t *completed, uint32_t n)
{
    if (p->uncertain) {
        finish(r, p, false, KVCR_REASON_TIMEOUT); /* main reports it quiesced */
        return;
    }
    bool ok = success && p->state == PULL_WAIT_DONE &&
              (!p->fetch || kvcr_now_ns() < p->deadline_ns);
    for (uint32_t i = 0; ok && i < n; i++) ok = completed[i] < p->n_keys;
    for (uint32_t i = 0; ok && i < n; i++) p->keys[completed[i]].completed = true;
    finish(r, p, ok, p->state == PULL_WAIT_DONE ? KVCR_REASON_TRANSFER_ERROR : KVCR_REASON_TIMEOUT);
}

/* The pull's source writes by messages: one of its writes came so, or an
 * earlier pull's from the same incarnation did (how a peer writes to us is
 * fixed by the lanes between us, net/ucx.h, but for pulls that agreed to
 * puts: see writes_by_messages). Remembered for the peer. */
static void saw_messages(remote *r, pull *p)
{
    p->am_seen = true;
    rpeer *peer = p->has_inc ? peer_get(r, p->source, false) : NULL;
    if (peer == NULL) return;
    peer->messages = true;
    memcpy(peer->messages_inc, p->inc, sizeof peer->messages_inc);
}

/* A pull whose source may put (puts_agreed) is never taken for one that
 * writes by messages until a message of its own came. */
static bool writes_by_messages(remote *r, const pull *p)
{
    if (p->am_seen) return true;
    if (p->puts_agreed) return false;
    const rpeer *peer = p->has_inc ? peer_get(r, p->source, false) : NULL;
    return peer != NULL && peer->messages &&
           memcmp(peer->messages_inc, p->inc, sizeof peer->messages_inc) == 0;
}

/* A write that came as messages is complete once write_done came and
 * every byte it announced was taken. */
static void check_taken(remote *r, pull *p)
{
    if (p->done_pending && p->am_in >= p->am_expect) on_terminal(r, p, true, NULL, 0);
}

/* write_done of a write sent as messages, while the pull is live: its keys
 * are marked, and it ends when the bytes are all in (they may trail the
 * message: UCX and ZeroMQ are separate paths) or at its deadline. */
static void on_messages_done(remote *r, pull *p, const wire_msg *m)
{
    for (uint32_t i = 0; i < m->n_completed; i++)
        if (m->completed[i] >= p->n_keys) {
            on_terminal(r, p, false, NULL, 0);
            return;
        }
    for (uint32_t i = 0; i < m->n_completed; i++) p->keys[m->completed[i]].completed = true;
    p->am_expect = m->am_bytes;
    p->done_pending = true;
    check_taken(r, p);
}

static int by_run_addr(const void *a, const void *b)
{
    const wire_run *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

/* Whether m's inline runs cover exactly the destinations of the keys it
 * says completed (the only memory the pull may write): each run inside
 * them (the sink's range check), no two runs overlapping, and as many
 * bytes as they hold. Progress thread, locked. */
static bool inline_matches(remote *r, const pull *p, const wire_msg *m)
{
    uint32_t n = 0, cap = 0;
    mem_piece *g = NULL;
    for (uint32_t i = 0; i < m->n_completed; i++) {
        uint32_t c = m->completed[i];
        if (c >= p->n_keys) {
            free(g);
            return false;
        }
        const pull_key *k = &p->keys[c];
        if (!add_ref_pieces(r, p, k->ref_off, k->ref_off + k->n_refs, &g, &n, &cap)) return false;
    }
    wire_run *runs = malloc(m->n_runs * sizeof *runs);
    bool ok = g != NULL && runs != NULL;
    if (ok) {
        n = merge_ranges(g, n);
        uint64_t want = 0;
        for (uint32_t i = 0; i < n; i++) want += g[i].len;
        memcpy(runs, m->runs, m->n_runs * sizeof *runs);
        qsort(runs, m->n_runs, sizeof *runs, by_run_addr);
        ok = want == m->inline_data.len; /* the runs' lengths sum to it (the decoder's rule) */
        for (uint32_t i = 0; ok && i < m->n_runs; i++)
            ok = in_ranges(g, n, runs[i].addr, runs[i].len) &&
                 (i == 0 || runs[i].addr >= runs[i - 1].addr + runs[i - 1].len);
    }
    free(g);
    free(runs);
    return ok;
}

/* The answer to a pull that asked for its bytes inline, or one carrying
 * inline bytes: they are copied, straight from the message into place,
 * only into a pull still waiting for its write that asked for them, and
 * only when they match its completed keys' destinations exactly. Anything
 * else (a success without its bytes, bytes the pull did not ask for, runs
 * that do not match) is refused whole: counted, nothing written, and the
 * pull fails, since the source said it writes nothing more. */
static void on_inline_done(remote *r, pull *p, const wire_msg *m)
{
    bool live = p->state == PULL_WAIT_DONE && !p->uncertain;
    bool ok = live && p->inline_asked && m->has_inline && m->terminal &&
              (!p->fetch || kvcr_now_ns() < p->deadline_ns); /* as on_terminal */
    if (ok && !inline_matches(r, p, m)) {
        /* Debug only: counted, and logged at most once a second by the
         * dispatcher with the other drops. */
        kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG,
                 "write_done %lld from %s: inline bytes that do not match the destinations "
                 "refused; nothing written",
                 (long long)p->handle, p->source);
        ok = false;
    }
    if (live && !ok) r->dropped_messages++; /* not what this pull asked for, or a mismatch */
    if (ok) {
        size_t off = 0;
        for (uint32_t i = 0; i < m->n_runs; i++) {
            memcpy((void *)(uintptr_t)m->runs[i].addr, m->inline_data.data + off, m->runs[i].len);
            off += m->runs[i].len;
        }
    }
    on_terminal(r, p, ok, m->completed, m->n_completed);
}

static void on_write_done(remote *r, pull *p, const wire_msg *m)
{
    /* A pull that learned its source's incarnation takes news only from it. */
    if (p->has_inc && !inc_is(p->inc, &m->incarnation)) {
        r->dropped_messages++;
        return;
    }
    if (m->terminal) { /* the answer: the pull ends on it (its bytes may trail it) */
        p->answer_ns = kvcr_now_ns();
        p->has_times = m->has_times;
        p->times = m->times;
    }
    if (m->has_inline || (p->inline_asked && m->success && m->terminal && m->n_completed > 0)) {
        on_inline_done(r, p, m);
        return;
    }
    if (m->has_am_bytes) saw_messages(r, p);
    if (m->success && m->has_am_bytes && m->terminal && p->state == PULL_WAIT_DONE &&
        !p->uncertain) {
        on_messages_done(r, p, m);
        return;
    }
    if (!m->terminal) {
        if (p->state == PULL_WAIT_DONE) enter_wait_terminal(r, p);
        return;
    }
    /* A failed write may mean the source lost its endpoint to us: the next
     * pull carries our metadata again, from which it makes a new one. */
    if (!m->success) peer_invalidate(r, p->source);
    on_terminal(r, p, m->success, m->completed, m->n_completed);
}

/* Every start_write of a pull goes out only after the one before it was
 * refused, and a refusal means the refuser accepted nothing: so while a
 * pull waits for its first answer, a refusal proves no process holds any
 * of its writes, and it may start once more with what the refusal showed
 * missing: our metadata (the source reclaimed its route to us, or is new),
 * and the refuser's incarnation where it quoted another (the source
 * restarted, or a Guard serves in its place). Each at most once. */
static bool restart_refused(remote *r, pull *p, const wire_msg *m)
{
    if (p->state != PULL_WAIT_DONE || p->uncertain) return false;
    bool want_md = !p->sent_md && !p->md_resent;
    bool want_inc = p->has_inc && !p->inc_adopted && !inc_is(p->inc, &m->incarnation);
    if (!want_md && !want_inc) return false;
    if (want_md) p->md_resent = true;
    if (want_inc) { /* the peer's record too, unless it learned another since */
        rpeer *peer = peer_get(r, p->source, false);
        if (peer && peer->has_inc && memcmp(peer->inc, p->inc, sizeof p->inc) == 0)
            memcpy(peer->inc, m->incarnation.data, sizeof peer->inc);
        p->inc_adopted = true;
        memcpy(p->inc, m->incarnation.data, sizeof p->inc);
    }
    p->state = PULL_START;
    return true;
}

static void on_refused(remote *r, pull *p, const wire_msg *m)
{
    if (m->busy) { /* at one of the source's limits: alive, and nothing was written */
        if (p->state == PULL_WAIT_DONE && !p->uncertain)
            finish(r, p, false, KVCR_REASON_SOURCE_BUSY);
        else
            on_terminal(r, p, false, NULL, 0);
        return;
    }
    peer_invalidate(r, p->source);
    if (restart_refused(r, p, m)) return;
    rpeer *peer = peer_get(r, p->source, false);
    /* A delayed refusal never evicts an incarnation learned later. */
    if (peer && peer->has_inc && p->has_inc && memcmp(peer->inc, p->inc, sizeof p->inc) == 0)
        peer->has_inc = false;
    on_terminal(r, p, false, NULL, 0);
}

static void on_probe_ack(remote *r, pull *p, const wire_msg *m)
{
    if (p->has_inc && m->has_dead_inc && inc_is(p->inc, &m->dead_inc)) {
        /* Verified death of the original source: the replier knows. */
        rpeer *peer = peer_get(r, p->source, true);
        if (peer) peer->has_inc = true, memcpy(peer->inc, m->incarnation.data, sizeof peer->inc);
        on_terminal(r, p, false, NULL, 0);
    } else if (p->has_inc && inc_is(p->inc, &m->incarnation) && m->terminal) {
        on_terminal(r, p, false, NULL, 0);
    }
    /* Otherwise a replacement without proof, a write still running, or a
     * pull that never learned which process it talks to: nothing is freed
     * before the abandon deadline. */
}

static void on_metadata_ack(remote *r, const wire_msg *m)
{
    char ep[CTL_MAX_ENDPOINT + 1];
    snprintf(ep, sizeof ep, "%.*s", (int)m->from.len, (const char *)m->from.data);
    rpeer *peer = peer_get(r, ep, false); /* only a peer we sent metadata to */
    if (peer == NULL) return;
    peer->has_inc = true;
    memcpy(peer->inc, m->incarnation.data, sizeof peer->inc);
    peer->acked = true;
    peer->retry_ns = 0;
    pull *p = find_pull(r, m);
    if (p && !p->has_inc) p->has_inc = true, memcpy(p->inc, peer->inc, sizeof p->inc);
}

static void on_message(remote *r, const wire_msg *m)
{
    if (m->type == WIRE_METADATA_ACK) {
        on_metadata_ack(r, m);
        return;
    }
    pull *p = find_pull(r, m);
    if (p == NULL) { /* unknown, finished, or not from its source */
        r->dropped_messages++;
        return;
    }
    switch (m->type) {
    case WIRE_WRITE_DONE: on_write_done(r, p, m); break;
    case WIRE_WRITE_REFUSED: on_refused(r, p, m); break;
    case WIRE_WRITE_PROBE_ACK: on_probe_ack(r, p, m); break;
    default: r->dropped_messages++; break;
    }
}

/* A message from a source shows it reachable again: its pulls still
 * waiting for terminal evidence whose probes have backed off probe again at
 * the next turn, from the first interval. A probe lost with a connection
 * dropped during an outage (control.c's CTL_MAXRT_MS) would otherwise be
 * repeated only after its backed-off interval, seconds after the source is
 * back, keeping a fetch's slots quarantined that long. At most one such
 * probe per pull each REPROBE_FIRST_MS. */
static void reprobe_on_contact(remote *r, const wire_msg *m)
{
    for (pull *p = r->pulls; p; p = p->next) {
        bool waiting = p->state == PULL_WAIT_TERMINAL || p->state == PULL_QUARANTINED;
        if (waiting && p->reprobe_ms > REPROBE_FIRST_MS && strlen(p->source) == m->from.len &&
            memcmp(p->source, m->from.data, m->from.len) == 0) {
            p->reprobe_ms = 0;
            p->probe_due = true;
        }
    }
}

bool target_take_bytes(void *arg, uint64_t tag, uint64_t addr, const void *data, size_t len)
{
    remote *r = arg;
    bool relock = !r->progress_locked;
    if (relock) host_lock(r->kv);
    pull *p = pull_by_handle(r, (int64_t)tag);
    /* An inline pull's bytes come only in its write_done. */
    bool take = p != NULL && p->state == PULL_WAIT_DONE && !p->inline_asked &&
                (p->ranges != NULL || build_ranges(r, p)) &&
                in_ranges(p->ranges, p->n_ranges, addr, len);
    if (p != NULL) saw_messages(r, p); /* see target_timers */
    if (relock) host_unlock(r->kv);
    if (!take) return false;
    /* Unlocked (unless a UCX call under the lock brought us here): only the
     * progress thread, this one, ends a pull, so it stays live and its
     * destinations ours until the copy is done. */
    memcpy((void *)(uintptr_t)addr, data, len);
    if (relock) host_lock(r->kv);
    p->bytes_last_ns = kvcr_now_ns();
    if (p->bytes_first_ns == 0) p->bytes_first_ns = p->bytes_last_ns;
    p->am_in += len;
    check_taken(r, p);
    if (relock) host_unlock(r->kv);
    return true;
}

void target_on_message(remote *r, const wire_msg *m)
{
    on_message(r, m);
    reprobe_on_contact(r, m);
}

void target_timers(remote *r, uint64_t now, uint64_t *next_ns)
{
    for (pull *p = r->pulls; p; p = p->next) {
        /* A source that writes by messages writes nothing but what our
         * sink copies, and the sink copies only into pulls still waiting
         * for their write: one past its deadline is quiet already, with no
         * answer needed from a source that may be gone. The same holds for
         * a pull that asked for its bytes inline: only we write them. The
         * probe still fences the write at the source. */
        if (now >= p->deadline_ns && (writes_by_messages(r, p) || p->inline_asked) &&
            (p->state == PULL_WAIT_DONE || p->state == PULL_WAIT_TERMINAL ||
             p->state == PULL_QUARANTINED)) {
            if (p->state == PULL_WAIT_DONE) send_probe(r, p);
            p->state = PULL_WAIT_TERMINAL;
            on_terminal(r, p, false, NULL, 0);
            continue;
        }
        if (p->state == PULL_WAIT_DONE && now >= p->deadline_ns) enter_wait_terminal(r, p);
        if (p->state == PULL_WAIT_TERMINAL && now >= p->abandon_ns) {
            p->state = PULL_QUARANTINED;
            p->uncertain = true;
            owe_main(r, p, PM_UNCERTAIN);
            peer_invalidate(r, p->source);
            send_probe(r, p);
        }
        bool waiting = p->state == PULL_WAIT_TERMINAL || p->state == PULL_QUARANTINED;
        if (p->probe_due || (waiting && now >= p->reprobe_ns)) send_probe(r, p);
        if (p->state == PULL_WAIT_DONE) next_at(next_ns, p->deadline_ns);
        if (p->state == PULL_WAIT_TERMINAL) next_at(next_ns, p->abandon_ns);
        if (waiting) next_at(next_ns, p->reprobe_ns);
    }
}

bool target_moving(const remote *r)
{
    for (const pull *p = r->pulls; p; p = p->next)
        if (p->state != PULL_START && p->state != PULL_FINISHED && !p->inline_asked) return true;
    return false;
}

bool target_idle(const remote *r)
{
    for (const pull *p = r->pulls; p; p = p->next)
        if (p->state != PULL_START && p->state != PULL_FINISHED) return false;
    return true;
}

/* Closing: unsent pulls fail; sent ones are probed at once for terminal
 * evidence instead of waiting for their deadline. */
void target_stop(remote *r, uint64_t now)
{
    (void)now;
    for (pull *p = r->pulls; p; p = p->next) {
        if (p->state == PULL_START) finish(r, p, false, KVCR_REASON_CLOSED);
        if (p->state == PULL_WAIT_DONE) enter_wait_terminal(r, p);
    }
}

/* Close gave up waiting: whatever may still be written is uncertain. */
void target_abandon_all(remote *r)
{
    for (pull *p = r->pulls; p; p = p->next) {
        if (p->state == PULL_FINISHED || p->state == PULL_START) continue;
        if (!p->uncertain) {
            p->uncertain = true;
            owe_main(r, p, PM_UNCERTAIN);
        }
        p->state = PULL_QUARANTINED;
    }
}

/* ---- main side ------------------------------------------------------------ */

static void report(remote *r, pull *p, kvcr_resilience_state st)
{
    size_t n = p->fetch ? 0 : p->n_refs; /* KVCR-owned destinations are not the framework's */
    kvcr_mem_ref *regions = n ? calloc(n, sizeof *regions) : NULL;
    char (*labels)[WIRE_MAX_NAME + 1] = n ? calloc(n, sizeof *labels) : NULL;
    if (n && (regions == NULL || labels == NULL)) n = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(labels[i], sizeof labels[i], "%.*s", (int)p->refs[i].label.len,
                 (const char *)p->refs[i].label.data);
        regions[i] = (kvcr_mem_ref){NULL, labels[i], p->refs[i].index};
    }
    rcb_resilience(r, st, false, (uint64_t)(p->handle < 0 ? -p->handle : p->handle), regions, n,
                   st == KVCR_TRANSFER_UNCERTAIN
                       ? "%s from %s for op %lld outlived its abandon deadline: %u destination "
                         "block(s) may still be written"
                       : "%s from %s for op %lld is quiet now (%u block(s))",
                   p->fetch ? "fetch" : "deliver", p->source, (long long)p->handle, p->n_keys);
    free(regions);
    free(labels);
}

static void fail_hint(kvcr_t *kv, const pull *p)
{
    hint_state *st = host_hint(kv, p->request_id);
    if (st) st->failed = true;
}

static void remember_misses(kvcr_t *kv, const pull *p)
{
    hint_state *st = host_hint(kv, p->request_id);
    for (uint32_t i = 0; st && i < p->n_keys; i++)
        if (!p->keys[i].completed)
            hint_state_add_miss(st, host_key_hash(p->key_bytes + p->keys[i].key_off,
                                                  p->keys[i].key_len));
}

/* Each key's token is settled once: deliver keys may be settled early
 * (uncertain), the rest when the pull finishes. */
static void settle_keys(kvcr_t *kv, pull *p, bool ok, kvcr_reason why)
{
    for (uint32_t i = 0; i < p->n_keys; i++) {
        pull_key *k = &p->keys[i];
        if (k->settled) continue;
        k->settled = true;
        host_settle(kv, k->tok, ok && k->completed, ok ? KVCR_REASON_NOT_FOUND : why);
    }
}

static uint64_t ref_bytes(const kvcr_t *kv, const wire_ref *ref)
{
    char label[WIRE_MAX_NAME + 1];
    snprintf(label, sizeof label, "%.*s", (int)ref->label.len, (const char *)ref->label.data);
    int pool = host_pool_named(kv, label);
    if (pool < 0) return 0;
    host_pool pi;
    host_pool_info(kv, (uint32_t)pool, &pi);
    return pi.block_size;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* The pull's time in parts (kvcr/stats.h), when its source's answer said
 * how it served it: start <= sent <= answer <= finished <= end, so the
 * parts sum to the whole. Of the round trip, what the source says it
 * served is the source's (at most all of it: the clocks' rates may differ
 * a little); its pin wait and data time are parts of that. Bytes sent as
 * messages are sent for the source once they left it, and cross while
 * its answer does: how long they took arriving here before the answer,
 * beyond the source's data time, is data too, not control. */
static void observe_parts(kvcr_t *kv, const pull *p, const char *result, uint64_t end)
{
    static const char *const scopes[KVCR_PULL_PARTS] = KVCR_PULL_PART_SCOPES;
    if (!p->has_times) return;
    uint64_t rtt = p->answer_ns - p->sent_ns;
    uint64_t served = min_u64(p->times.serve_ns, rtt);
    uint64_t pins = min_u64(p->times.pin_ns, served);
    uint64_t data = min_u64(p->times.data_ns, served - pins), control = rtt - served;
    uint64_t own = served - pins - data;
    uint64_t seen = min_u64(p->bytes_last_ns, p->answer_ns), crossing = 0;
    if (p->bytes_first_ns != 0 && seen > p->bytes_first_ns + data)
        crossing = min_u64(seen - p->bytes_first_ns - data, control);
    control -= crossing;
    data += crossing;
    uint64_t part[KVCR_PULL_PARTS] = {p->sent_ns - p->start_ns,
                                      control,
                                      pins,
                                      own,
                                      data + (p->finished_ns - p->answer_ns),
                                      end - p->finished_ns};
    for (int i = 0; i < KVCR_PULL_PARTS; i++)
        host_observe(kv, scopes[i], result, kvcr_ns_to_s(part[i]));
}

static void observe(kvcr_t *kv, const pull *p)
{
    const char *scope = p->fetch ? "remote_fetch" : "remote_deliver";
    const char *result = p->success ? "success" : "failed";
    uint64_t end = kvcr_now_ns();
    host_observe(kv, scope, result, kvcr_ns_to_s(end - p->start_ns));
    observe_parts(kv, p, result, end);
    uint64_t blocks = 0, bytes = 0;
    for (uint32_t i = 0; p->success && i < p->n_keys; i++) {
        if (!p->keys[i].completed) continue;
        blocks++;
        /* every element of a layout is one pool block */
        for (uint32_t j = 0; j < p->keys[i].n_refs; j++)
            bytes += ref_bytes(kv, &p->refs[p->keys[i].ref_off + j]);
    }
    if (blocks) host_count(kv, scope, blocks, bytes);
}

static void settle_finished(remote *r, pull *p)
{
    kvcr_t *kv = r->kv;
    if (p->uncertain) {
        report(r, p, KVCR_TRANSFER_QUIESCED);
    } else if (!p->success) {
        fail_hint(kv, p);
    } else {
        remember_misses(kv, p);
    }
    observe(kv, p);
    settle_keys(kv, p, p->success, (kvcr_reason)p->fail_reason);
    if (p->prev)
        p->prev->next = p->next;
    else
        r->pulls = p->next;
    if (p->next) p->next->prev = p->prev;
    index_remove(r, p);
    r->n_pulls--;
    pull_free(p);
}

void target_main(remote *r)
{
    kvcr_t *kv = r->kv;
    while (r->todo) {
        pull *p = r->todo;
        r->todo = p->todo_next;
        if (r->todo == NULL) r->todo_tail = NULL;
        p->in_todo = false;
        uint8_t flags = p->main_flags;
        p->main_flags = 0;
        if ((flags & PM_DISCARD) && !p->discarded) {
            p->discarded = true;
            for (uint32_t i = 0; i < p->n_keys; i++) host_discard(kv, p->keys[i].tok);
        }
        if (flags & PM_UNCERTAIN) {
            report(r, p, KVCR_TRANSFER_UNCERTAIN);
            fail_hint(kv, p);
            if (!p->fetch) settle_keys(kv, p, false, KVCR_REASON_TIMEOUT);
        }
        if (flags & PM_FINISHED) settle_finished(r, p);
    }
}

/* The instance is going away with pulls close gave up on: their tokens are
 * never settled, the core frees what it keeps for them. */
void target_destroy(remote *r)
{
    memset(r->pull_index, 0, sizeof r->pull_index);
    while (r->pulls) {
        pull *p = r->pulls;
        r->pulls = p->next;
        for (uint32_t i = 0; i < p->n_keys; i++)
            if (!p->keys[i].settled) host_drop(r->kv, p->keys[i].tok);
        pull_free(p);
    }
}
