/* The remote tier's pull state machine (src/tiers/remote_target.c) alone,
 * against a fake host (core/host.h), a fake send (the progress thread's
 * send_msg: every message sent is recorded) and an injected clock: no
 * processes, no sockets, no sleeps. A pull is built through the tier's
 * begin/read/end, sent by target_end (target_adopt once a held pull may
 * go), driven by target_on_message with
 * made-up decoded messages and by target_timers at made-up times, and
 * settled by target_main; the test checks its states, the messages it sent,
 * the tokens it settled (ok, reason) and the resilience events it raised. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tiers/remote_int.h"
#include "util/clock.h"

#define MS 1000000ull
#define T0 (1000 * MS) /* the clock when a pull starts */
#define OP_TIMEOUT_MS 1000
#define ABANDON_MS 4000
#define SOURCE "tcp://10.0.0.2:5555"
#define OTHER "tcp://10.0.0.3:5555"

/* ---- the injected clock ---------------------------------------------------- */

static uint64_t clock_ns;

uint64_t kvcr_now_ns(void)
{
    return clock_ns;
}

/* ---- the fake host --------------------------------------------------------- */

typedef struct settled {
    tier_token tok;
    bool ok;
    kvcr_reason why;
} settled;

static struct {
    kvcr_conf conf;
    kvcr_logger log;
    hint_state hint;
    uint64_t hashes[2];
    settled settles[16];
    size_t n_settles;
    tier_token discards[16];
    size_t n_discards, n_drops, n_wakes;
} host;

static kvcr_t *const KV = (kvcr_t *)&host; /* opaque to the tier */

const kvcr_conf *host_conf(const kvcr_t *kv)
{
    assert_ptr_equal(kv, KV);
    return &host.conf;
}

kvcr_logger *host_logger(kvcr_t *kv)
{
    (void)kv;
    return &host.log;
}

/* One thread drives the pulls here: the lock is a no-op. */
void host_lock(kvcr_t *kv)
{
    assert_ptr_equal(kv, KV);
}

void host_unlock(kvcr_t *kv)
{
    assert_ptr_equal(kv, KV);
}

void host_settle(kvcr_t *kv, tier_token tok, bool ok, kvcr_reason why)
{
    (void)kv;
    assert_true(host.n_settles < 16);
    host.settles[host.n_settles++] = (settled){tok, ok, why};
}

void host_discard(kvcr_t *kv, tier_token tok)
{
    (void)kv;
    assert_true(host.n_discards < 16);
    host.discards[host.n_discards++] = tok;
}

void host_drop(kvcr_t *kv, tier_token tok)
{
    (void)kv, (void)tok;
    host.n_drops++;
}

hint_state *host_hint(kvcr_t *kv, const char *request_id)
{
    (void)kv;
    return strcmp(request_id, host.hint.request_id) == 0 ? &host.hint : NULL;
}

uint64_t host_key_hash(const uint8_t *key, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

void host_observe(kvcr_t *kv, const char *scope, const char *result, double seconds)
{
    (void)kv, (void)scope, (void)result, (void)seconds;
}

void host_count(kvcr_t *kv, const char *operation, uint64_t blocks, uint64_t bytes)
{
    (void)kv, (void)operation, (void)blocks, (void)bytes;
}

int host_pool_named(const kvcr_t *kv, const char *name)
{
    (void)kv;
    return strcmp(name, "p") == 0 ? 0 : -1;
}

void host_pool_info(const kvcr_t *kv, uint32_t pool, host_pool *out)
{
    (void)kv, (void)pool;
    *out = (host_pool){"p", NULL, 4 * 4096, 4096};
}

/* ---- the fake progress thread: sending, waking, resilience events --------- */

typedef struct sent {
    uint8_t type;
    int64_t op;
    char to[CTL_MAX_ENDPOINT + 1];
    int md_rule;
    bool has_expected_inc;
    uint8_t expected_inc[WIRE_INCARNATION_LEN];
    double remaining_ms;
    uint32_t n_keys, n_refs;
    bool framework;   /* of the first ref */
    uint64_t index1;  /* of the second ref */
    bool inline_write;
    bool has_put_min;
    uint64_t put_min;
    uint64_t at_ns;
} sent;

static struct {
    sent msgs[64];
    bool acked; /* the source acknowledged our metadata: sends omit it */
    size_t n_refusals; /* host_refusal("peers") */
    size_t n;
    int fail; /* the rc of the next sends */
    size_t n_wakes;
    kvcr_resilience_state events[8];
    size_t n_events;
} net;

int send_msg(remote *r, const char *endpoint, wire_msg *m, int md_rule)
{
    (void)r;
    assert_true(net.n < 64);
    sent *s = &net.msgs[net.n++];
    m->has_metadata = md_rule != MD_NEVER && !net.acked;
    *s = (sent){.type = m->type, .op = m->op, .md_rule = md_rule,
                .has_expected_inc = m->has_expected_inc, .remaining_ms = m->remaining_ms,
                .n_keys = m->n_keys, .inline_write = m->inline_write,
                .has_put_min = m->has_put_min, .put_min = m->put_min, .at_ns = clock_ns};
    snprintf(s->to, sizeof s->to, "%s", endpoint);
    if (m->has_expected_inc) memcpy(s->expected_inc, m->expected_inc.data, WIRE_INCARNATION_LEN);
    if (m->type == WIRE_START_WRITE) {
        s->n_refs = m->ref_off[m->n_keys];
        s->framework = m->refs[0].framework;
        s->index1 = m->refs[1].index;
    }
    return net.fail;
}

void host_refusal(kvcr_t *kv, const char *limit)
{
    (void)kv;
    assert_string_equal(limit, "peers");
    net.n_refusals++;
}

void remote_wake(remote *r)
{
    (void)r;
    net.n_wakes++;
}

void remote_owe_main(remote *r)
{
    (void)r;
    host.n_wakes++;
}

void rcb_resilience(remote *r, kvcr_resilience_state st, bool source_side, uint64_t op,
                    const kvcr_mem_ref *regions, size_t n, const char *fmt, ...)
{
    (void)r, (void)op, (void)regions, (void)n, (void)fmt;
    assert_false(source_side);
    assert_true(net.n_events < 8);
    net.events[net.n_events++] = st;
}

/* ---- fixtures -------------------------------------------------------------- */

static const uint8_t INC_A[WIRE_INCARNATION_LEN] = {0xa};
static const uint8_t INC_B[WIRE_INCARNATION_LEN] = {0xb};
static int owners[2]; /* what the tokens name (opaque to the tier) */

static void quiet(void *ud, kvcr_log_level level, const char *message)
{
    (void)ud, (void)level, (void)message;
}

static int key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    (void)ud;
    *hash = host_key_hash(key->data, key->len);
    return 0;
}

static int setup(void **state)
{
    memset(&host, 0, sizeof host);
    memset(&net, 0, sizeof net);
    host.conf.operation_timeout_ms = OP_TIMEOUT_MS;
    host.conf.abandon_timeout_ms = ABANDON_MS;
    host.conf.cb.key_hash = key_hash;
    host.conf.limits.max_control_message_bytes = 16u << 20;
    host.conf.max_peers = 1024;
    host.conf.peer_idle_ms = 1000;
    kvcr_logger_init(&host.log, "test", quiet, NULL);
    host.hashes[0] = host_key_hash((const uint8_t *)"k0", 2);
    host.hashes[1] = host_key_hash((const uint8_t *)"k1", 2);
    if (host.hashes[0] > host.hashes[1]) { /* a hint's hashes are sorted */
        uint64_t t = host.hashes[0];
        host.hashes[0] = host.hashes[1];
        host.hashes[1] = t;
    }
    host.hint = (hint_state){.request_id = "req",
                             .hint = {.source = SOURCE, .hashes = host.hashes, .n_hashes = 2}};
    clock_ns = T0;
    remote *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->kv = KV;
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    remote *r = *state;
    target_destroy(r);
    free(r->peers);
    free(r);
    free(host.hint.misses);
    return 0;
}

/* A deliver (or fetch) of keys k0 and k1 for op 7, built and ended as the
 * core does on the caller's thread: sent from there at once, or held
 * (PULL_START) while its source is silent. */
static pull *end_pull(remote *r, bool fetch)
{
    tier_batch_info info = {"req", 7, fetch, 2, 2};
    tier_batch *b = target_begin(r, &info);
    assert_non_null(b);
    for (uint32_t i = 0; i < 2; i++) {
        const char *key = i ? "k1" : "k0";
        assert_true(target_holds(r, b, (const uint8_t *)key, 2));
        kvcr_mem_ref ref = {NULL, "fw", 10 + i};
        tier_dst dst = {NULL, 4096, 0, !fetch, fetch ? "p" : "fw", fetch ? 20 + i : 10 + i};
        tier_read rd = {{&owners[i], i}, TIER_BLOCK_NONE, (const uint8_t *)key, 2, fetch,
                        1, &dst, fetch ? NULL : &ref};
        assert_int_equal(target_read(r, b, &rd), KVCR_REASON_NONE);
    }
    target_end(r, b);
    pull *p = r->pulls;
    assert_non_null(p);
    return p;
}

/* The pull of end_pull, sent (known: its source's incarnation is known
 * already): in PULL_WAIT_DONE. */
static pull *start_pull_from(remote *r, bool fetch, bool known)
{
    size_t wakes = net.n_wakes;
    pull *p = end_pull(r, fetch);
    /* Only a pull whose bytes come inline, or can only come as messages
     * (its source's incarnation writes by them, and it agreed to no puts),
     * goes from the caller's thread; the progress thread hears of the
     * others, and sends them. */
    bool by_caller = p->state == PULL_WAIT_DONE;
    const rpeer *peer = peer_get(r, SOURCE, false);
    bool by_messages = by_caller && !p->puts_agreed && peer->has_inc && peer->messages &&
                       memcmp(peer->messages_inc, peer->inc, sizeof peer->inc) == 0;
    assert_int_equal(net.n_wakes, wakes + !by_caller);
    assert_int_equal(net.n, by_caller);
    if (!by_caller) target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(p->state, PULL_WAIT_DONE);
    assert_int_equal(p->inline_asked || by_messages, by_caller);
    assert_int_equal(net.n, 1);
    const sent *s = &net.msgs[0];
    assert_int_equal(s->type, WIRE_START_WRITE);
    assert_int_equal(s->op, fetch ? -7 : 7); /* a fetch's pull names its fill */
    assert_string_equal(s->to, SOURCE);
    assert_int_equal(s->md_rule, MD_FORCE);
    assert_int_equal(s->has_expected_inc, known); /* what was learned of the source */
    assert_true(s->remaining_ms == OP_TIMEOUT_MS);
    assert_int_equal(s->n_keys, 2);
    assert_int_equal(s->n_refs, 2);
    assert_int_equal(s->framework, !fetch);
    assert_int_equal(s->index1, fetch ? 21 : 11);
    return p;
}

static pull *start_pull(remote *r, bool fetch)
{
    return start_pull_from(r, fetch, false);
}

/* A decoded message from an endpoint about op 7, as incarnation inc. */
static wire_msg from(const char *endpoint, uint8_t type, int64_t op, const uint8_t *inc)
{
    return (wire_msg){.type = type, .agent = {(const uint8_t *)"src", 3},
                      .incarnation = {inc, WIRE_INCARNATION_LEN},
                      .from = {(const uint8_t *)endpoint, strlen(endpoint)},
                      .to = {(const uint8_t *)"tcp://us:1", 10}, .has_op = true, .op = op};
}

/* A successful, terminal write_done from the source naming the keys written. */
static wire_msg done_msg(const uint8_t *inc, uint32_t *completed, uint32_t n)
{
    wire_msg m = from(SOURCE, WIRE_WRITE_DONE, 7, inc);
    m.success = m.terminal = true;
    m.n_completed = n;
    m.completed = completed;
    return m;
}

/* The source acknowledged our metadata: the pull learns its incarnation. */
static void learn_incarnation(remote *r, pull *p, const uint8_t *inc)
{
    wire_msg ack = from(SOURCE, WIRE_METADATA_ACK, p->handle, inc);
    target_on_message(r, &ack);
    assert_true(p->has_inc);
    assert_memory_equal(p->inc, inc, WIRE_INCARNATION_LEN);
}

static void assert_settled(size_t i, uint32_t idx, bool ok, kvcr_reason why)
{
    assert_true(i < host.n_settles);
    assert_ptr_equal(host.settles[i].tok.owner, &owners[idx]);
    assert_int_equal(host.settles[i].tok.idx, idx);
    assert_int_equal(host.settles[i].ok, ok);
    if (!ok) assert_int_equal(host.settles[i].why, why);
}

/* ---- the cases ------------------------------------------------------------- */

static void test_holds_follows_the_hint_and_its_misses(void **state)
{
    remote *r = *state;
    tier_batch_info query = {"req", 0, false, 0, 0};
    tier_batch *b = target_begin(r, &query);
    assert_non_null(b);
    assert_true(target_holds(r, b, (const uint8_t *)"k0", 2));
    assert_false(target_holds(r, b, (const uint8_t *)"zz", 2)); /* not in the hint */
    target_end(r, b);
    assert_null(r->pulls); /* a query builds no pull */
    hint_state_add_miss(&host.hint, host_key_hash((const uint8_t *)"k0", 2));
    b = target_begin(r, &query);
    assert_false(target_holds(r, b, (const uint8_t *)"k0", 2)); /* remembered as a miss */
    target_end(r, b);
    host.hint.failed = true;
    assert_null(target_begin(r, &query));
    tier_batch_info other = {"unknown", 0, false, 0, 0};
    assert_null(target_begin(r, &other));
}

static void test_success_settles_completed_keys_and_remembers_misses(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    clock_ns += 5 * MS;
    uint32_t completed[] = {0};
    wire_msg done = done_msg(INC_A, completed, 1);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_true(p->success);
    assert_int_equal(host.n_settles, 0); /* settled by the polling side only */
    target_main(r);
    assert_int_equal(host.n_settles, 2);
    assert_settled(0, 0, true, KVCR_REASON_NONE);
    assert_settled(1, 1, false, KVCR_REASON_NOT_FOUND); /* the source did not have it */
    assert_true(hint_state_is_miss(&host.hint, host_key_hash((const uint8_t *)"k1", 2)));
    assert_false(host.hint.failed);
    assert_null(r->pulls);
    assert_int_equal(net.n_events, 0);
}

static void test_refusals_fail_the_pull_and_its_hint(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    wire_msg busy = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_A);
    busy.busy = true; /* at a limit of the source: alive, nothing written */
    target_on_message(r, &busy);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_SOURCE_BUSY);
    assert_settled(1, 1, false, KVCR_REASON_SOURCE_BUSY);
    assert_true(host.hint.failed);

    host.hint.failed = false;
    net.n = net.n_wakes = 0;
    p = start_pull(r, false);
    wire_msg refused = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_A);
    target_on_message(r, &refused);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_int_equal(host.n_settles, 4);
    assert_settled(2, 0, false, KVCR_REASON_TRANSFER_ERROR);
    assert_settled(3, 1, false, KVCR_REASON_TRANSFER_ERROR);
    assert_true(host.hint.failed);
    assert_null(r->pulls);
}

/* A source that has no route to us (it reclaimed it, remote_route.c)
 * refuses a start_write that came without our metadata: it is sent once
 * more, with it; a second refusal fails the pull. */
static void test_a_refusal_of_a_start_write_without_metadata_sends_it_again_with_it(void **state)
{
    remote *r = *state;
    net.acked = true;
    pull *p = start_pull(r, false);
    assert_false(p->sent_md);
    wire_msg refused = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_A);
    target_on_message(r, &refused);
    assert_int_equal(p->state, PULL_START);
    net.acked = false; /* the refusal made the peer's record forget the ack */
    assert_false(peer_get(r, SOURCE, false)->acked);
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(net.n, 2);
    assert_int_equal(net.msgs[1].type, WIRE_START_WRITE);
    assert_int_equal(net.msgs[1].op, 7);
    assert_true(p->sent_md);
    assert_int_equal(p->state, PULL_WAIT_DONE);
    target_on_message(r, &refused);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TRANSFER_ERROR);
    assert_settled(1, 1, false, KVCR_REASON_TRANSFER_ERROR);
    assert_int_equal(net.n, 2);
}

/* The records of sources stay within max_peers: the least recently used
 * one no pull or hint needs makes room; with none, no record is made
 * (counted); the sweep drops records unused for peer_idle_ms. */
static void test_peer_records_are_bounded_and_reclaimed(void **state)
{
    remote *r = *state;
    host.conf.max_peers = 2;
    pull *p = start_pull(r, false); /* a record for SOURCE, with a pull */
    assert_non_null(p);
    clock_ns += 1000;
    assert_non_null(peer_get(r, "tcp://127.0.0.1:2", true));
    clock_ns += 1000;
    rpeer *y = peer_get(r, "tcp://127.0.0.1:3", true); /* ...:2 goes, SOURCE has a pull */
    assert_non_null(y);
    y->eager = true;
    assert_int_equal(r->n_peers, 2);
    assert_int_equal(r->peers_reclaimed, 1);
    assert_null(peer_get(r, "tcp://127.0.0.1:2", false));
    assert_non_null(peer_get(r, SOURCE, false));
    assert_null(peer_get(r, "tcp://127.0.0.1:4", true)); /* both in use */
    assert_int_equal(net.n_refusals, 1);
    assert_int_equal(r->n_peers, 2);
    peer_records_sweep(r, clock_ns + 2000000000ull); /* idle, but in use: kept */
    assert_int_equal(r->n_peers, 2);
    peer_get(r, "tcp://127.0.0.1:3", false)->eager = false;
    peer_records_sweep(r, clock_ns + 2000000000ull);
    assert_int_equal(r->n_peers, 1);
    assert_int_equal(r->peers_reclaimed, 2);
    assert_non_null(peer_get(r, SOURCE, false));
}

static void test_deadline_probes_and_a_terminal_answer_frees_a_fetch(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, true);
    learn_incarnation(r, p, INC_A);
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(next, T0 + OP_TIMEOUT_MS * MS); /* the deadline */
    assert_int_equal(net.n, 1);

    clock_ns = next;
    next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_WAIT_TERMINAL);
    assert_int_equal(net.n, 2);
    const sent *probe = &net.msgs[1];
    assert_int_equal(probe->type, WIRE_WRITE_PROBE);
    assert_int_equal(probe->op, -7);
    assert_int_equal(probe->md_rule, MD_RETRY);
    assert_true(probe->has_expected_inc);
    assert_memory_equal(probe->expected_inc, INC_A, WIRE_INCARNATION_LEN);
    assert_int_equal(next, clock_ns + 500 * MS); /* the next probe comes first */
    /* The fetch's waiters fail now; its slots stay until the source is quiet. */
    target_main(r);
    assert_int_equal(host.n_discards, 2);
    assert_int_equal(host.n_settles, 0);

    /* An answer that the write still runs frees nothing. */
    wire_msg running = from(SOURCE, WIRE_WRITE_PROBE_ACK, -7, INC_A);
    target_on_message(r, &running);
    assert_int_equal(p->state, PULL_WAIT_TERMINAL);
    wire_msg over = from(SOURCE, WIRE_WRITE_PROBE_ACK, -7, INC_A);
    over.terminal = true;
    target_on_message(r, &over);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_int_equal(host.n_discards, 2); /* once */
    assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
    assert_settled(1, 1, false, KVCR_REASON_TIMEOUT);
    assert_int_equal(net.n_events, 0); /* never uncertain */
    assert_null(r->pulls);
}

static void test_abandon_reports_uncertain_and_reprobes_until_death_is_proven(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    /* Nothing answers: every timer the pull asks for is run, in order. */
    uint64_t next = T0 + OP_TIMEOUT_MS * MS;
    while (net.n < 10) {
        clock_ns = next;
        next = UINT64_MAX;
        target_timers(r, clock_ns, &next);
        assert_true(next > clock_ns);
        if (p->uncertain && net.n_events == 0) {
            assert_int_equal(clock_ns, T0 + ABANDON_MS * MS);
            assert_int_equal(p->state, PULL_QUARANTINED);
            target_main(r); /* the deliver's entries fail; its blocks are uncertain */
            assert_int_equal(net.n_events, 1);
            assert_int_equal(net.events[0], KVCR_TRANSFER_UNCERTAIN);
            assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
            assert_settled(1, 1, false, KVCR_REASON_TIMEOUT);
            assert_true(host.hint.failed);
        }
    }
    assert_int_equal(p->state, PULL_QUARANTINED);
    /* Probes at the deadline, then backing off 0.5 s, doubling to 30 s; the
     * abandon deadline (3 s after the deadline) probes at once. */
    static const uint64_t gaps_ms[] = {500, 1000, 1500, 4000, 8000, 16000, 30000, 30000};
    for (size_t i = 0; i < 8; i++) {
        const sent *a = &net.msgs[1 + i], *b = &net.msgs[2 + i];
        assert_int_equal(b->type, WIRE_WRITE_PROBE);
        assert_int_equal(b->at_ns - a->at_ns, gaps_ms[i] * MS);
    }
    /* Whoever answers on the endpoint now (a restarted engine) does not
     * prove anything without naming the dead incarnation. */
    wire_msg stranger = from(SOURCE, WIRE_WRITE_PROBE_ACK, 7, INC_B);
    stranger.terminal = true;
    target_on_message(r, &stranger);
    assert_int_equal(p->state, PULL_QUARANTINED);
    wire_msg dead = from(SOURCE, WIRE_WRITE_PROBE_ACK, 7, INC_B);
    dead.has_dead_inc = true;
    dead.dead_inc = (wire_bytes){INC_A, WIRE_INCARNATION_LEN};
    target_on_message(r, &dead);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_memory_equal(peer_get(r, SOURCE, false)->inc, INC_B, WIRE_INCARNATION_LEN);
    target_main(r);
    assert_int_equal(net.n_events, 2);
    assert_int_equal(net.events[1], KVCR_TRANSFER_QUIESCED);
    assert_int_equal(host.n_settles, 2); /* each token once */
    assert_null(r->pulls);
}

static void test_news_from_another_incarnation_or_endpoint_is_dropped(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    uint32_t completed[] = {0, 1};
    wire_msg done = done_msg(INC_B, completed, 2);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_WAIT_DONE);
    assert_int_equal(r->dropped_messages, 1);
    wire_msg elsewhere = from(OTHER, WIRE_WRITE_DONE, 7, INC_A);
    elsewhere.success = elsewhere.terminal = true;
    target_on_message(r, &elsewhere);
    assert_int_equal(p->state, PULL_WAIT_DONE);
    assert_int_equal(r->dropped_messages, 2);
    target_main(r);
    assert_int_equal(host.n_settles, 0);

    done.incarnation = (wire_bytes){INC_A, WIRE_INCARNATION_LEN};
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, true, KVCR_REASON_NONE);
    assert_settled(1, 1, true, KVCR_REASON_NONE);
}

static void test_a_probe_that_cannot_be_sent_is_sent_at_the_next_turn(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    net.fail = KVCR_ESYS;
    clock_ns = p->deadline_ns;
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_WAIT_TERMINAL);
    assert_true(p->probe_due);
    size_t tried = net.n;
    net.fail = 0;
    clock_ns += MS; /* long before the next probe was due */
    target_timers(r, clock_ns, &next);
    assert_false(p->probe_due);
    assert_int_equal(net.n, tried + 1);
    assert_int_equal(net.msgs[tried].type, WIRE_WRITE_PROBE);
    assert_false(net.msgs[tried].has_expected_inc); /* it never learned the source's */
}

/* A source that speaks again (an outage ended) makes a pull whose probes
 * backed off probe at the next turn instead of seconds later; a second
 * message right after asks for nothing more. */
static void test_news_from_a_quiet_source_makes_its_backed_off_probe_come_at_once(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    uint64_t next = T0 + OP_TIMEOUT_MS * MS;
    while (net.n < 6) { /* start_write, then probes 0.5, 1, 1.5 and 4 s apart */
        clock_ns = next;
        next = UINT64_MAX;
        target_timers(r, clock_ns, &next);
    }
    assert_int_equal(p->state, PULL_QUARANTINED);
    assert_true(next - clock_ns >= 4000 * MS); /* the next probe is seconds away */
    size_t probes = net.n;

    clock_ns += 10 * MS;
    wire_msg ack = from(SOURCE, WIRE_METADATA_ACK, 0, INC_A);
    target_on_message(r, &ack);
    next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(net.n, probes + 1);
    assert_int_equal(net.msgs[probes].type, WIRE_WRITE_PROBE);
    assert_int_equal(net.msgs[probes].at_ns, clock_ns);

    clock_ns += 10 * MS;
    target_on_message(r, &ack);
    target_timers(r, clock_ns, &next);
    assert_int_equal(net.n, probes + 1);

    /* A message from another endpoint changes nothing. */
    wire_msg other = from(OTHER, WIRE_METADATA_ACK, 0, INC_A);
    target_on_message(r, &other);
    target_timers(r, clock_ns + MS, &next);
    assert_int_equal(net.n, probes + 1);
}

/* ---- inline writes ---------------------------------------------------------- */

/* The framework region "fw" the deliver's destinations (elements 10 and 11)
 * lie in, published as our own: where inline bytes may land. */
#define ELEM 4096
static uint8_t fw_mem[16 * ELEM];
static const uint8_t zeros[sizeof fw_mem];

static void publish_fw(remote *r, uint32_t inline_max)
{
    static region_geom geom;
    geom = (region_geom){"fw", true, (uint64_t)(uintptr_t)fw_mem, ELEM, ELEM, 16};
    r->own_geom = &geom;
    r->md.n_regions = 1;
    r->inline_max = inline_max;
    memset(fw_mem, 0, sizeof fw_mem);
}

static uint64_t elem(uint32_t i)
{
    return (uint64_t)(uintptr_t)&fw_mem[i * ELEM];
}

/* Distinct bytes for destination elements 10 and 11, one after another. */
static uint8_t payload[2 * ELEM];

static wire_msg inline_msg(const uint8_t *inc, uint32_t *completed, uint32_t n, wire_run *runs,
                           uint32_t n_runs)
{
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 7 + 1);
    wire_msg m = done_msg(inc, completed, n);
    uint64_t len = 0;
    for (uint32_t i = 0; i < n_runs; i++) len += runs[i].len;
    m.has_inline = true;
    m.n_runs = n_runs;
    m.runs = runs;
    m.inline_data = (wire_bytes){payload, len};
    return m;
}

static void test_a_small_pull_takes_its_inline_bytes_into_its_destinations(void **state)
{
    remote *r = *state;
    publish_fw(r, 2 * ELEM);
    pull *p = start_pull(r, false);
    assert_true(p->inline_asked);
    assert_true(net.msgs[0].inline_write);
    /* Open, but nothing for UCX to move: the progress thread may sleep. */
    assert_false(target_idle(r));
    assert_false(target_moving(r));
    learn_incarnation(r, p, INC_A);
    /* Element 11's bytes first: runs may come in any order. */
    wire_run runs[] = {{elem(11), ELEM}, {elem(10), ELEM}};
    uint32_t completed[] = {1, 0};
    wire_msg done = inline_msg(INC_A, completed, 2, runs, 2);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_true(p->success);
    assert_memory_equal(&fw_mem[11 * ELEM], payload, ELEM);
    assert_memory_equal(&fw_mem[10 * ELEM], payload + ELEM, ELEM);
    assert_memory_equal(fw_mem, zeros, 10 * ELEM);         /* nothing else written */
    assert_memory_equal(&fw_mem[12 * ELEM], zeros, 4 * ELEM);
    assert_int_equal(r->dropped_messages, 0);
    target_main(r);
    assert_settled(0, 0, true, KVCR_REASON_NONE);
    assert_settled(1, 1, true, KVCR_REASON_NONE);
    assert_null(r->pulls);
}

/* Runs that are not exactly the completed keys' destinations are refused
 * whole: counted, nothing written, the pull failed (the source said it is
 * done). */
static void test_inline_bytes_that_do_not_match_their_destinations_write_nothing(void **state)
{
    remote *r = *state;
    wire_run outside[] = {{elem(10), ELEM}, {elem(12), ELEM}};        /* element 12 is not ours */
    wire_run overlap[] = {{elem(10), ELEM}, {elem(10) + 1, ELEM - 1}, {elem(11), 1}};
    wire_run straddle[] = {{elem(10) + 1, 2 * ELEM - 1}, {elem(10), 1}}; /* fine: both keys */
    wire_run one_key[] = {{elem(10), ELEM}, {elem(11), ELEM}};        /* key 1 not completed */
    struct {
        wire_run *runs;
        uint32_t n_runs, n_completed;
        bool ok;
    } cases[] = {{outside, 2, 2, false}, {overlap, 3, 2, false}, {one_key, 2, 1, false},
                 {straddle, 2, 2, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        publish_fw(r, 2 * ELEM);
        net.n = net.n_wakes = host.n_settles = 0;
        host.hint.failed = false; /* a failed pull fails its hint */
        r->dropped_messages = 0;
        pull *p = start_pull(r, false);
        uint32_t completed[] = {0, 1};
        wire_msg done = inline_msg(INC_A, completed, cases[c].n_completed, cases[c].runs,
                                   cases[c].n_runs);
        target_on_message(r, &done);
        assert_int_equal(p->state, PULL_FINISHED);
        assert_int_equal(p->success, cases[c].ok);
        assert_int_equal(r->dropped_messages, cases[c].ok ? 0 : 1);
        if (cases[c].ok) { /* the runs' bytes one after another: 10+1.., then 10 */
            assert_memory_equal(&fw_mem[10 * ELEM + 1], payload, 2 * ELEM - 1);
            assert_int_equal(fw_mem[10 * ELEM], payload[2 * ELEM - 1]);
        } else
            assert_memory_equal(fw_mem, zeros, sizeof fw_mem);
        target_main(r);
        assert_settled(0, 0, cases[c].ok, KVCR_REASON_TRANSFER_ERROR);
        assert_null(r->pulls);
    }
}

/* Inline bytes from another endpoint, another incarnation, for another op,
 * for a pull that did not ask for them, or after the deadline: nothing is
 * written. */
static void test_stale_or_foreign_inline_bytes_write_nothing(void **state)
{
    remote *r = *state;
    publish_fw(r, 2 * ELEM);
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    wire_run runs[] = {{elem(10), 2 * ELEM}};
    uint32_t completed[] = {0, 1};
    wire_msg done = inline_msg(INC_B, completed, 2, runs, 1); /* another incarnation */
    target_on_message(r, &done);
    done = inline_msg(INC_A, completed, 2, runs, 1);
    done.from = (wire_bytes){(const uint8_t *)OTHER, strlen(OTHER)};
    target_on_message(r, &done);
    done = inline_msg(INC_A, completed, 2, runs, 1);
    done.op = 8;
    target_on_message(r, &done);
    assert_int_equal(r->dropped_messages, 3);
    assert_int_equal(p->state, PULL_WAIT_DONE);
    assert_memory_equal(fw_mem, zeros, sizeof fw_mem);
    /* The source's write-by-messages path cannot write an inline pull either. */
    assert_false(target_take_bytes(r, 7, elem(10), payload, ELEM));
    assert_memory_equal(fw_mem, zeros, sizeof fw_mem);

    /* At its deadline the pull is quiet at once (only we write it): no
     * answer awaited, never uncertain; the late bytes are not taken. */
    clock_ns = p->deadline_ns;
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_int_equal(net.msgs[net.n - 1].type, WIRE_WRITE_PROBE); /* the source is fenced */
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
    assert_settled(1, 1, false, KVCR_REASON_TIMEOUT);
    assert_int_equal(net.n_events, 0);
    assert_null(r->pulls);
    done = inline_msg(INC_A, completed, 2, runs, 1);
    target_on_message(r, &done);
    assert_memory_equal(fw_mem, zeros, sizeof fw_mem);

    /* Turned off (or a pull too large): the start_write does not ask, and
     * bytes sent inline anyway are refused. */
    publish_fw(r, 2 * ELEM - 1);
    net.n = net.n_wakes = host.n_settles = 0;
    host.hint.failed = false;
    r->dropped_messages = 0;
    r->n_peers = 0; /* a source not heard of yet, as start_pull wants */
    clock_ns = T0;
    p = start_pull(r, false);
    assert_false(p->inline_asked);
    assert_false(net.msgs[0].inline_write);
    done = inline_msg(INC_A, completed, 2, runs, 1);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_false(p->success);
    assert_int_equal(r->dropped_messages, 1);
    assert_memory_equal(fw_mem, zeros, sizeof fw_mem);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TRANSFER_ERROR);
}

/* A success without its inline bytes, for a pull that asked for them, is
 * refused too: the source may not have written any other way. */
static void test_an_inline_pull_refuses_a_success_without_its_bytes(void **state)
{
    remote *r = *state;
    publish_fw(r, 2 * ELEM);
    pull *p = start_pull(r, false);
    uint32_t completed[] = {0};
    wire_msg done = done_msg(INC_A, completed, 1);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_false(p->success);
    assert_int_equal(r->dropped_messages, 1);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TRANSFER_ERROR);
}

/* The next pull of k0, k1 from the same source, its incarnation known. */
static pull *next_pull(remote *r)
{
    net.n = net.n_wakes = host.n_settles = 0;
    host.hint.failed = false;
    return start_pull_from(r, false, true);
}

/* A process replaced at the source's endpoint (a Guard serving for a dead
 * engine, a restart) refuses a pull that quoted the old incarnation and
 * came without our metadata. Nothing was accepted, so the pull goes once
 * more with our metadata, quoting the refuser, and succeeds; a refusal
 * after that fails it. */
static void test_a_refusal_by_a_new_incarnation_sends_it_again_quoting_it(void **state)
{
    remote *r = *state;
    pull *p = start_pull(r, false);
    learn_incarnation(r, p, INC_A);
    uint32_t completed[] = {0, 1};
    wire_msg first = done_msg(INC_A, completed, 2);
    target_on_message(r, &first);
    target_main(r);
    assert_int_equal(host.n_settles, 2);

    net.acked = true; /* INC_A had our metadata: the next pull omits it */
    p = next_pull(r);
    assert_false(p->sent_md);
    assert_memory_equal(net.msgs[0].expected_inc, INC_A, WIRE_INCARNATION_LEN);
    wire_msg refused = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_B);
    target_on_message(r, &refused);
    assert_int_equal(p->state, PULL_START);
    net.acked = false;
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(net.n, 2);
    assert_int_equal(net.msgs[1].type, WIRE_START_WRITE);
    assert_true(p->sent_md);
    assert_true(net.msgs[1].has_expected_inc);
    assert_memory_equal(net.msgs[1].expected_inc, INC_B, WIRE_INCARNATION_LEN);
    assert_memory_equal(peer_get(r, SOURCE, false)->inc, INC_B, WIRE_INCARNATION_LEN);
    wire_msg done = done_msg(INC_B, completed, 2);
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, true, KVCR_REASON_NONE);
    assert_settled(1, 1, true, KVCR_REASON_NONE);

    /* Each restart once: quoting INC_B, refused by INC_A, then by INC_B: failed. */
    p = next_pull(r);
    wire_msg by_a = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_A);
    target_on_message(r, &by_a); /* quoted INC_B: once more, quoting INC_A */
    assert_int_equal(p->state, PULL_START);
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_memory_equal(net.msgs[1].expected_inc, INC_A, WIRE_INCARNATION_LEN);
    wire_msg by_b = from(SOURCE, WIRE_WRITE_REFUSED, 7, INC_B);
    target_on_message(r, &by_b);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TRANSFER_ERROR);
    assert_int_equal(net.n, 2);
}

/* At its deadline the pull ends at once, failed, never uncertain. */
static void assert_quiet_at_deadline(remote *r, pull *p)
{
    clock_ns = p->deadline_ns;
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
    assert_settled(1, 1, false, KVCR_REASON_TIMEOUT);
    assert_int_equal(net.n_events, 0);
    assert_null(r->pulls);
}

/* Over TCP lanes a source writes by messages, which the target remembers
 * for its incarnation: a pull of it is quiet at its deadline. But a pull
 * whose start_write let it put (put_min, reached by every destination
 * piece) may be written by puts: at its deadline it goes the probe /
 * abandon path like any put, until a message of its own shows it came by
 * messages. A target with put_min 0 sends none and keeps the memory's
 * rule. */
static void test_a_pull_that_let_its_source_put_is_not_quiet_at_its_deadline(void **state)
{
    remote *r = *state;
    publish_fw(r, 0); /* no inline pulls */
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 7 + 1);
    r->put_min = 2 * ELEM; /* above the elements: messages */
    pull *p = start_pull(r, false);
    assert_true(target_moving(r)); /* its bytes come through UCX */
    assert_true(net.msgs[0].has_put_min);
    assert_int_equal(net.msgs[0].put_min, 2 * ELEM);
    assert_false(p->puts_agreed);
    learn_incarnation(r, p, INC_A);
    assert_true(target_take_bytes(r, 7, elem(10), payload, ELEM));
    assert_true(target_take_bytes(r, 7, elem(11), payload + ELEM, ELEM));
    uint32_t completed[] = {0, 1};
    wire_msg done = done_msg(INC_A, completed, 2);
    done.has_am_bytes = true;
    done.am_bytes = 2 * ELEM;
    target_on_message(r, &done);
    assert_int_equal(p->state, PULL_FINISHED);
    assert_true(p->success);
    assert_memory_equal(&fw_mem[10 * ELEM], payload, 2 * ELEM);
    target_main(r);
    assert_settled(0, 0, true, KVCR_REASON_NONE);
    assert_settled(1, 1, true, KVCR_REASON_NONE);
    assert_null(r->pulls);
    assert_true(peer_get(r, SOURCE, false)->messages);

    /* Every piece reaches put_min: not quiet at the deadline, and sent by
     * the progress thread (the source may put). */
    r->put_min = ELEM;
    p = next_pull(r);
    assert_int_equal(net.n_wakes, 1);
    assert_true(net.msgs[0].has_put_min);
    assert_int_equal(net.msgs[0].put_min, ELEM);
    assert_true(p->puts_agreed);
    clock_ns = p->deadline_ns;
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_WAIT_TERMINAL);
    assert_int_equal(net.msgs[net.n - 1].type, WIRE_WRITE_PROBE);
    target_main(r);
    assert_int_equal(host.n_settles, 0); /* held until the source is quiet */
    clock_ns = p->abandon_ns;
    next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_QUARANTINED);
    target_main(r);
    assert_int_equal(net.n_events, 1);
    assert_int_equal(net.events[0], KVCR_TRANSFER_UNCERTAIN);
    assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
    wire_msg over = from(SOURCE, WIRE_WRITE_PROBE_ACK, 7, INC_A);
    over.terminal = true;
    target_on_message(r, &over);
    assert_int_equal(p->state, PULL_FINISHED);
    target_main(r);
    assert_null(r->pulls);

    /* The same pull once a message of its own came: quiet at once. */
    net.n_events = 0;
    clock_ns = T0;
    p = next_pull(r);
    assert_true(p->puts_agreed);
    assert_true(target_take_bytes(r, 7, elem(10), payload, ELEM));
    assert_quiet_at_deadline(r, p);

    /* put_min off: none sent, and the memory makes the pull quiet; its
     * bytes can only come as messages, so it went from the caller's thread. */
    r->put_min = 0;
    clock_ns = T0;
    p = next_pull(r);
    assert_int_equal(net.n_wakes, 0);
    assert_false(net.msgs[0].has_put_min);
    assert_false(p->puts_agreed);
    assert_quiet_at_deadline(r, p);
}

/* A fetch past its deadline waiting for its source's word (it may have put
 * into the slots), the source silent since: the next pull to it, a deliver,
 * is queued and held back. Returns it; *before is the messages sent before it. */
static pull *hold_behind_a_silent_source(remote *r, size_t *before)
{
    pull *old = start_pull(r, true);
    learn_incarnation(r, old, INC_A);
    clock_ns = old->deadline_ns;
    uint64_t next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(old->state, PULL_WAIT_TERMINAL);
    assert_int_equal(net.msgs[net.n - 1].type, WIRE_WRITE_PROBE);
    *before = net.n;

    clock_ns += MS;
    size_t wakes = net.n_wakes;
    pull *p = end_pull(r, false);
    assert_int_equal(p->state, PULL_START); /* nothing sent */
    assert_int_equal(net.n_wakes, wakes + 1);
    next = UINT64_MAX;
    target_adopt(r, clock_ns, &next);
    assert_int_equal(p->state, PULL_START); /* still nothing */
    assert_int_equal(net.n, *before);
    assert_int_equal(r->pulls_held, 1);
    /* The waiting fetch is probed again sooner than its backoff says. */
    assert_int_equal(next, clock_ns + 250 * MS);
    clock_ns = next;
    next = UINT64_MAX;
    target_timers(r, clock_ns, &next);
    assert_int_equal(net.n, *before + 1);
    assert_int_equal(net.msgs[net.n - 1].type, WIRE_WRITE_PROBE);
    assert_int_equal(net.msgs[net.n - 1].op, -7);
    *before = net.n;
    return p;
}

/* Any answer (the dispatcher notes each message's sender), even one that
 * frees nothing: the source is back, and the pull held behind it (before:
 * the messages sent until then) goes, as the only message since. */
static void source_answers(remote *r, pull *p, size_t before)
{
    peer_heard(r, SOURCE, strlen(SOURCE), clock_ns);
    wire_msg running = from(SOURCE, WIRE_WRITE_PROBE_ACK, -7, INC_A);
    target_on_message(r, &running);
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(p->state, PULL_WAIT_DONE);
    assert_int_equal(net.n, before + 1);
    assert_int_equal(net.msgs[before].type, WIRE_START_WRITE);
    assert_int_equal(net.msgs[before].op, 7);
}

static void test_a_pull_to_a_silent_source_waits_until_it_answers(void **state)
{
    remote *r = *state;
    size_t before;
    pull *p = hold_behind_a_silent_source(r, &before);
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(net.n, before); /* still silent */

    source_answers(r, p, before);
    assert_int_equal(r->pulls_held, 1); /* counted once */
}

static void test_a_pull_held_to_its_deadline_fails_with_nothing_sent(void **state)
{
    remote *r = *state;
    size_t before;
    pull *p = hold_behind_a_silent_source(r, &before);
    host.n_settles = 0;
    clock_ns = p->deadline_ns;
    target_adopt(r, clock_ns, &(uint64_t){UINT64_MAX});
    assert_int_equal(p->state, PULL_FINISHED);
    assert_int_equal(net.n, before);
    target_main(r);
    assert_settled(0, 0, false, KVCR_REASON_TIMEOUT);
    assert_settled(1, 1, false, KVCR_REASON_TIMEOUT);
    assert_int_equal(net.n_events, 0); /* nothing was sent: nothing uncertain */
}

/* An inline pull to a silent source is held like any other: not sent from
 * the caller's thread, and the progress thread woken to time it. It goes,
 * still asking for its bytes inline, once the source answers. */
static void test_an_inline_pull_to_a_silent_source_is_held_then_sent_inline(void **state)
{
    remote *r = *state;
    publish_fw(r, 2 * ELEM);
    size_t before;
    pull *p = hold_behind_a_silent_source(r, &before);
    source_answers(r, p, before);
    assert_true(net.msgs[before].inline_write);
    assert_true(p->inline_asked);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_holds_follows_the_hint_and_its_misses, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_success_settles_completed_keys_and_remembers_misses,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals_fail_the_pull_and_its_hint, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_deadline_probes_and_a_terminal_answer_frees_a_fetch,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_pull_to_a_silent_source_waits_until_it_answers,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_an_inline_pull_to_a_silent_source_is_held_then_sent_inline,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_pull_held_to_its_deadline_fails_with_nothing_sent,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_abandon_reports_uncertain_and_reprobes_until_death_is_proven, setup, teardown),
        cmocka_unit_test_setup_teardown(test_news_from_another_incarnation_or_endpoint_is_dropped,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_news_from_a_quiet_source_makes_its_backed_off_probe_come_at_once, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_a_probe_that_cannot_be_sent_is_sent_at_the_next_turn,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_small_pull_takes_its_inline_bytes_into_its_destinations, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_inline_bytes_that_do_not_match_their_destinations_write_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_or_foreign_inline_bytes_write_nothing, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_an_inline_pull_refuses_a_success_without_its_bytes,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_refusal_by_a_new_incarnation_sends_it_again_quoting_it, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_a_refusal_of_a_start_write_without_metadata_sends_it_again_with_it, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_a_pull_that_let_its_source_put_is_not_quiet_at_its_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_records_are_bounded_and_reclaimed, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
