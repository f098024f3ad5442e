/* Target side of the peer tier: pulls (p2p_spec §4.2–4.3, §4.9–4.10, §5.2,
 * §5.5). A pull is created on the caller's thread under the lock, sent as
 * one start_write by the progress thread, and settled back on the caller's
 * thread in kvcr_poll(). Its destinations (framework blocks of a deliver,
 * KVCR slots of a fetch) are never given back while the source may still
 * write them: past the deadline the pull waits for terminal evidence, past
 * the abandon deadline it is reported uncertain and kept until the source
 * proves it quiet. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ops.h"
#include "core/residency.h"
#include "tiers/remote_int.h"
#include "util/clock.h"
#include "util/event.h"

#define MS 1000000ull

/* ---- hints (p2p_spec §3.4) ------------------------------------------------ */

hint_state *remote_hint(kvcr_t *kv, const char *request_id)
{
    if (kv->remote == NULL || request_id == NULL) return NULL;
    hint_state *st = hint_table_get(&kv->hints, request_id);
    return st && !st->failed ? st : NULL;
}

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

bool remote_accepts(kvcr_t *kv, const hint_state *st, const uint8_t *key, size_t len)
{
    if (st == NULL || st->failed || kv->conf.cb.key_hash == NULL) return false;
    if (hint_state_is_miss(st, index_hash(key, len))) return false;
    if (kv->conf.remote.opportunistic_query) return true;
    uint64_t h;
    kvcr_key k = {key, len};
    if (kv->conf.cb.key_hash(kv->conf.cb.ud, &k, &h) != 0) return false;
    return has_hash(&st->hint, h);
}

/* ---- building a pull ------------------------------------------------------ */

pull *remote_pull_new(kvcr_t *kv, const hint_state *st, kvcr_op_handle op, bool fetch,
                      size_t max_keys, size_t max_refs)
{
    pull *p = calloc(1, sizeof *p);
    if (p == NULL) goto oom;
    p->keys = calloc(max_keys ? max_keys : 1, sizeof *p->keys);
    p->refs = calloc(max_refs ? max_refs : 1, sizeof *p->refs);
    p->request_id = strdup(st->request_id);
    if (p->keys == NULL || p->refs == NULL || p->request_id == NULL) goto oom;
    p->cap_keys = (uint32_t)max_keys;
    p->cap_refs = (uint32_t)max_refs;
    p->handle = fetch ? -(int64_t)op : (int64_t)op;
    p->fetch = fetch;
    snprintf(p->source, sizeof p->source, "%s", st->hint.source);
    p->start_ns = kvcr_now_ns();
    p->deadline_ns = p->start_ns + (uint64_t)kv->conf.operation_timeout_ms * MS;
    p->abandon_ns = p->start_ns + (uint64_t)kv->conf.abandon_timeout_ms * MS;
    return p;
oom:
    kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: no remote pull for this operation");
    remote_pull_free(p);
    return NULL;
}

void remote_pull_free(pull *p)
{
    if (p == NULL) return;
    free(p->keys);
    free(p->refs);
    free(p->key_bytes);
    free(p->request_id);
    free(p);
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

void remote_pull_add_deliver(kvcr_t *kv, pull *p, op_rec *o, uint32_t idx, const kvcr_mem_ref *refs,
                             uint32_t n_refs, const uint8_t *key, uint32_t key_len)
{
    pull_key *k = &p->keys[p->n_keys];
    *k = (pull_key){.op = o, .idx = idx, .ref_off = p->n_refs, .n_refs = n_refs};
    if (!add_key_bytes(p, k, key, key_len)) {
        ops_entry_settle(kv, o, idx, false, KVCR_REASON_NO_CAPACITY);
        return;
    }
    for (uint32_t j = 0; j < n_refs; j++) {
        const char *label = refs[j].label ? refs[j].label : "";
        p->refs[p->n_refs++] = (wire_ref){true, {(const uint8_t *)label, strlen(label)},
                                          refs[j].index};
    }
    p->n_keys++;
}

void remote_pull_add_fill(kvcr_t *kv, pull *p, struct fill *f, const uint8_t *key,
                          uint32_t key_len)
{
    const block *b = index_get(&kv->index, f->block);
    pull_key *k = &p->keys[p->n_keys];
    *k = (pull_key){.fill = f, .ref_off = p->n_refs, .n_refs = b->n_slots};
    if (!add_key_bytes(p, k, key, key_len)) {
        ops_fill_settle(kv, f, false, KVCR_REASON_NO_CAPACITY);
        return;
    }
    for (uint32_t j = 0; j < b->n_slots; j++) {
        uint32_t pool, slot;
        res_slot(kv, b, j, &pool, &slot);
        const char *label = kv->pools[pool].name;
        p->refs[p->n_refs++] = (wire_ref){false, {(const uint8_t *)label, strlen(label)}, slot};
    }
    p->n_keys++;
}

void remote_pull_submit(kvcr_t *kv, pull *p)
{
    remote *r = kv->remote;
    if (p->n_keys == 0) {
        remote_pull_free(p);
        return;
    }
    p->state = PULL_START;
    p->next = r->pulls;
    if (r->pulls) r->pulls->prev = p;
    r->pulls = p;
    r->n_pulls++;
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
    event_signal(r->kv->event_fd);
}

static void finish(remote *r, pull *p, bool success, kvcr_reason why)
{
    p->state = PULL_FINISHED;
    p->success = success;
    p->fail_reason = (uint8_t)why;
    owe_main(r, p, PM_FINISHED);
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
        wire_msg m = {.type = WIRE_START_WRITE, .has_op = true, .op = p->handle,
                      .remaining_ms = (double)(p->deadline_ns - now) / 1e6,
                      .n_keys = p->n_keys, .keys = keys, .ref_off = ref_off, .refs = p->refs,
                      .has_expected_inc = p->has_inc,
                      .expected_inc = {p->inc, WIRE_INCARNATION_LEN}};
        rc = send_msg(r, p->source, &m, MD_FORCE);
    }
    free(keys);
    free(ref_off);
    if (rc != 0) {
        kvcr_log(&r->kv->log, KVCR_LOG_WARN, "cannot send start_write %lld to %s: %s",
                 (long long)p->handle, p->source, kvcr_last_error());
        finish(r, p, false, KVCR_REASON_TRANSFER_ERROR);
        return;
    }
    p->state = PULL_WAIT_DONE;
}

void target_adopt(remote *r, uint64_t now)
{
    for (pull *p = r->pulls; p; p = p->next)
        if (p->state == PULL_START) send_start_write(r, p, now);
}

static pull *find_pull(remote *r, const wire_msg *m)
{
    if (!m->has_op) return NULL;
    for (pull *p = r->pulls; p; p = p->next)
        if (p->handle == m->op && p->state != PULL_FINISHED && p->state != PULL_START &&
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

static void on_write_done(remote *r, pull *p, const wire_msg *m)
{
    /* A pull that learned its source's incarnation takes news only from it. */
    if (p->has_inc && !inc_is(p->inc, &m->incarnation)) {
        r->dropped_messages++;
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

static void on_refused(remote *r, pull *p, bool busy)
{
    if (busy) { /* at one of the source's limits: alive, and nothing was written */
        if (p->state == PULL_WAIT_DONE && !p->uncertain)
            finish(r, p, false, KVCR_REASON_SOURCE_BUSY);
        else
            on_terminal(r, p, false, NULL, 0);
        return;
    }
    peer_invalidate(r, p->source);
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
    rpeer *peer = peer_get(r, ep, true);
    if (peer == NULL) return;
    peer->has_inc = true;
    memcpy(peer->inc, m->incarnation.data, sizeof peer->inc);
    peer->acked = true;
    peer->retry_ns = 0;
    pull *p = find_pull(r, m);
    if (p && !p->has_inc) p->has_inc = true, memcpy(p->inc, peer->inc, sizeof p->inc);
}

void target_on_message(remote *r, const wire_msg *m)
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
    case WIRE_WRITE_REFUSED: on_refused(r, p, m->busy); break;
    case WIRE_WRITE_PROBE_ACK: on_probe_ack(r, p, m); break;
    default: r->dropped_messages++; break;
    }
}

static void next_at(uint64_t *next_ns, uint64_t t)
{
    if (t < *next_ns) *next_ns = t;
}

void target_timers(remote *r, uint64_t now, uint64_t *next_ns)
{
    for (pull *p = r->pulls; p; p = p->next) {
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
    hint_state *st = hint_table_get(&kv->hints, p->request_id);
    if (st) st->failed = true;
}

static void remember_misses(kvcr_t *kv, const pull *p)
{
    hint_state *st = hint_table_get(&kv->hints, p->request_id);
    for (uint32_t i = 0; st && i < p->n_keys; i++)
        if (!p->keys[i].completed)
            hint_state_add_miss(st, index_hash(p->key_bytes + p->keys[i].key_off,
                                               p->keys[i].key_len));
}

static void settle_deliver_keys(kvcr_t *kv, pull *p, bool ok, kvcr_reason why)
{
    for (uint32_t i = 0; i < p->n_keys; i++) {
        pull_key *k = &p->keys[i];
        if (k->op == NULL) continue;
        bool done = ok && k->completed;
        ops_entry_settle(kv, k->op, k->idx, done, ok ? KVCR_REASON_NOT_FOUND : why);
        k->op = NULL;
    }
}

static void observe(kvcr_t *kv, const pull *p)
{
    if (kv->telemetry == NULL) return;
    const char *scope = p->fetch ? "remote_fetch" : "remote_deliver";
    telemetry_observe(kv->telemetry, scope, p->success ? "success" : "failed",
                      kvcr_ns_to_s(kvcr_now_ns() - p->start_ns));
    uint64_t blocks = 0, bytes = 0;
    for (uint32_t i = 0; p->success && i < p->n_keys; i++) {
        if (!p->keys[i].completed) continue;
        blocks++;
        for (uint32_t j = 0; j < p->keys[i].n_refs; j++) {
            /* every element of a layout is one pool block */
            const wire_ref *ref = &p->refs[p->keys[i].ref_off + j];
            for (uint32_t q = 0; q < kv->conf.n_pools; q++)
                if (strlen(kv->pools[q].name) == ref->label.len &&
                    memcmp(kv->pools[q].name, ref->label.data, ref->label.len) == 0) {
                    bytes += kv->pools[q].block_size;
                    break;
                }
        }
    }
    if (blocks) telemetry_count(kv->telemetry, scope, blocks, bytes);
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
    if (p->fetch) {
        for (uint32_t i = 0; i < p->n_keys; i++) {
            bool ok = p->success && p->keys[i].completed;
            ops_fill_settle(kv, p->keys[i].fill, ok,
                                 p->success ? KVCR_REASON_NOT_FOUND
                                            : (kvcr_reason)p->fail_reason);
        }
    } else {
        settle_deliver_keys(kv, p, p->success, (kvcr_reason)p->fail_reason);
    }
    if (p->prev)
        p->prev->next = p->next;
    else
        r->pulls = p->next;
    if (p->next) p->next->prev = p->prev;
    r->n_pulls--;
    remote_pull_free(p);
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
            for (uint32_t i = 0; i < p->n_keys; i++) ops_remote_fill_discard(kv, p->keys[i].fill);
        }
        if (flags & PM_UNCERTAIN) {
            report(r, p, KVCR_TRANSFER_UNCERTAIN);
            fail_hint(kv, p);
            if (!p->fetch) settle_deliver_keys(kv, p, false, KVCR_REASON_TIMEOUT);
        }
        if (flags & PM_FINISHED) settle_finished(r, p);
    }
}
