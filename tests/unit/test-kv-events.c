/* KV events in the routers' wire format: a subscriber decodes every frame
 * the instance publishes (exactly three frames, the topic, consecutive
 * big-endian sequence numbers, the payload through the strict decoder)
 * and checks the events' types, fields and hashes against what was
 * deposited and evicted; replay answers every kept batch, byte for byte,
 * then the end marker; a subscriber that does not read never holds up an
 * operation (the batches it could not take are counted); the options'
 * rules; the decoder's refusals. */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fd_wait.h"
#include "harness.h"
#include "api/boot.h"
#include "api/router_meta.h"
#include "kvreplay.h"
#include "net/kvev.h"

#define TOPIC "kv@pod-1@model-a"

static uint64_t hash_of(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a; the top bit set half the time */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int key_hash(void *ud, const kvcr_key *k, uint64_t *h)
{
    (void)ud;
    if (k->len > 2 && memcmp(k->data, "nh", 2) == 0) return 1; /* keys without a hash */
    *h = hash_of(k->data, k->len);
    return 0;
}

static uint64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t hash_str(const char *s)
{
    return hash_of((const uint8_t *)s, strlen(s));
}

/* ---- a subscriber --------------------------------------------------------- */

typedef struct msg3 {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
} msg3;

typedef struct sub {
    void *ctx, *sock;
    bool have_seq;
    uint64_t last_seq;
} sub;

static void sub_open(sub *s, const char *where, bool bind)
{
    memset(s, 0, sizeof *s);
    s->ctx = zmq_ctx_new();
    s->sock = zmq_socket(s->ctx, ZMQ_SUB);
    int ms = 100, zero = 0;
    assert_int_equal(zmq_setsockopt(s->sock, ZMQ_RCVTIMEO, &ms, sizeof ms), 0);
    assert_int_equal(zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, TOPIC, strlen(TOPIC)), 0);
    assert_int_equal(bind ? zmq_bind(s->sock, where) : zmq_connect(s->sock, where), 0);
}

static void sub_close(sub *s)
{
    zmq_close(s->sock);
    zmq_ctx_term(s->ctx);
}

/* One message, checked frame by frame: exactly three, the topic, an 8-byte
 * sequence one above the last one seen. false when none came in 100 ms. */
static bool sub_recv(sub *s, msg3 *m)
{
    char topic[64];
    int n = zmq_recv(s->sock, topic, sizeof topic, 0);
    if (n < 0) {
        assert_int_equal(errno, EAGAIN);
        return false;
    }
    assert_int_equal(n, (int)strlen(TOPIC));
    assert_memory_equal(topic, TOPIC, strlen(TOPIC));
    int more;
    size_t sz = sizeof more;
    assert_int_equal(zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &sz), 0);
    assert_true(more);
    uint8_t seq[9];
    assert_int_equal(zmq_recv(s->sock, seq, sizeof seq, 0), 8);
    assert_int_equal(zmq_getsockopt(s->sock, ZMQ_RCVMORE, &more, &sz), 0);
    assert_true(more);
    zmq_msg_t pl;
    zmq_msg_init(&pl);
    assert_true(zmq_msg_recv(&pl, s->sock, 0) >= 0);
    assert_false(zmq_msg_more(&pl)); /* exactly three frames */
    m->seq = kvev_get_be64(seq);
    m->len = zmq_msg_size(&pl);
    m->payload = malloc(m->len);
    memcpy(m->payload, zmq_msg_data(&pl), m->len);
    zmq_msg_close(&pl);
    if (s->have_seq) assert_int_equal(m->seq, s->last_seq + 1);
    s->have_seq = true;
    s->last_seq = m->seq;
    return true;
}

static void decode(const msg3 *m, kvev_batch *b, uint64_t dp_rank, bool positional)
{
    const char *why = kvev_decode_batch(m->payload, m->len, b);
    if (why) fail_msg("batch %llu does not decode: %s", (unsigned long long)m->seq, why);
    assert_int_equal(b->dp_rank, dp_rank);
    assert_true(b->ts > 1.7e9 && b->ts < 4.1e9); /* epoch seconds */
    if (b->n_events > 0) assert_int_equal(b->positional, positional);
}

/* What the stream says: block hashes stored and removed, per medium. */
typedef struct seen {
    int cleared;
    uint64_t stored[256], removed[256];
    size_t n_stored, n_removed;
} seen;

static void account(seen *w, const kvev_batch *b, const char *medium)
{
    for (size_t i = 0; i < b->n_events; i++) {
        const kvev_event *e = &b->events[i];
        if (e->type == KVEV_CLEARED) {
            w->cleared++;
            continue;
        }
        assert_non_null(e->medium);
        assert_string_equal(e->medium, medium);
        if (e->type == KVEV_STORED) {
            /* deposited without metadata: hashes only */
            assert_false(e->has_parent);
            assert_int_equal(e->n_tokens, 0);
            assert_int_equal(e->block_size, 0);
            assert_null(e->lora_name);
            assert_null(e->extra);
        }
        for (size_t j = 0; j < e->n_hashes; j++) {
            if (e->type == KVEV_STORED && w->n_stored < 256) w->stored[w->n_stored++] = e->hashes[j];
            if (e->type == KVEV_REMOVED && w->n_removed < 256)
                w->removed[w->n_removed++] = e->hashes[j];
        }
    }
}

static bool has(const uint64_t *v, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == h) return true;
    return false;
}

/* Polls the instance and reads the stream until the hash is stored
 * (bounded: 200 rounds of 100 ms). */
static void read_until_stored(rig *r, sub *s, seen *w, uint64_t h, const char *medium,
                              bool positional, uint64_t dp)
{
    for (int round = 0; round < 200 && !has(w->stored, w->n_stored, h); round++) {
        rig_pump(r);
        msg3 m;
        while (sub_recv(s, &m)) {
            kvev_batch b;
            decode(&m, &b, dp, positional);
            account(w, &b, medium);
            kvev_batch_free(&b);
            free(m.payload);
        }
    }
    assert_true(has(w->stored, w->n_stored, h));
}

/* The subscription is in place once a deposit made after it is seen. */
static void join_stream(rig *r, sub *s, seen *w, const char *medium, bool positional,
                        uint64_t dp)
{
    char key[32];
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof key, "join-%d", i);
        assert_int_equal(rig_deposit1(r, key, 0, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
        rig_pump(r);
        msg3 m;
        if (!sub_recv(s, &m)) continue;
        kvev_batch b;
        decode(&m, &b, dp, positional);
        account(w, &b, medium);
        kvev_batch_free(&b);
        free(m.payload);
        read_until_stored(r, s, w, hash_str(key), medium, positional, dp);
        return;
    }
    fail_msg("the subscriber never received a batch");
}

/* ---- replay ---------------------------------------------------------------- */

typedef struct replayed {
    msg3 *m;
    size_t n, cap;
} replayed;

static void keep_replayed(void *ud, uint64_t seq, const void *payload, size_t len)
{
    replayed *r = ud;
    assert_true(r->n < r->cap);
    if (r->n > 0) assert_int_equal(seq, r->m[r->n - 1].seq + 1);
    r->m[r->n] = (msg3){seq, malloc(len ? len : 1), len};
    memcpy(r->m[r->n].payload, payload, len);
    r->n++;
}

/* Every batch from start, in order without a gap, the end marker checked. */
static size_t replay(const char *endpoint, uint64_t start, msg3 *out, size_t cap)
{
    replayed r = {out, 0, cap};
    assert_true(kv_replay_each(endpoint, start, 5000, keep_replayed, &r));
    return r.n;
}

static void free_msgs(msg3 *m, size_t n)
{
    for (size_t i = 0; i < n; i++) free(m[i].payload);
}

/* ---- the stream, end to end ----------------------------------------------- */

typedef struct dirs {
    char dir[64], pub[128], rep[128];
} dirs;

static void make_dirs(dirs *d)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/kvcr-kvev-XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->pub, sizeof d->pub, "ipc://%s/pub", d->dir);
    snprintf(d->rep, sizeof d->rep, "ipc://%s/replay", d->dir);
}

static void drop_dirs(dirs *d)
{
    char p[160];
    snprintf(p, sizeof p, "%s/pub", d->dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/replay", d->dir);
    unlink(p);
    rmdir(d->dir);
}

static void test_stream_is_numbered_decodes_and_replays(void **state)
{
    (void)state;
    dirs d;
    make_dirs(&d);
    rig r;
    rig_init(&r, 256, 16, 8);
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = d.pub; /* ipc://: bound */
    r.cfg.kv_events.replay_endpoint = d.rep;
    r.cfg.kv_events.topic = TOPIC;
    r.cfg.kv_events.dp_rank = 3;
    uint64_t started_us = wall_us();
    rig_start(&r);
    sub s;
    sub_open(&s, d.pub, false);
    seen w = {0};
    join_stream(&r, &s, &w, "CPU", false, 3);

    /* Eight deposits into eight slots: the join keys are evicted. */
    const char *keys[] = {"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7"};
    const size_t idx[] = {0, 1, 2, 3, 4, 5, 6, 7};
    kvcr_entry_status st[8];
    rig_wait(&r, rig_deposit(&r, keys, idx, 8, 0), st, NULL, NULL);
    for (int i = 0; i < 8; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
    for (int i = 0; i < 8; i++) read_until_stored(&r, &s, &w, hash_str(keys[i]), "CPU", false, 3);
    assert_true(w.n_removed >= 1);
    assert_true(has(w.removed, w.n_removed, hash_str("join-0")));
    /* A key without a router hash is left out of the events. */
    assert_int_equal(rig_deposit1(&r, "nh-1", 0, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    assert_int_equal(rig_deposit1(&r, "b0", 1, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    read_until_stored(&r, &s, &w, hash_str("b0"), "CPU", false, 3);
    assert_false(has(w.stored, w.n_stored, hash_str("nh-1")));
    uint64_t last = s.last_seq;

    /* Replay from 0: every batch, numbered without a gap from where the
     * stream started (the wall clock in microseconds when it opened: past
     * an earlier process's numbers), the first one AllBlocksCleared, and
     * byte for byte what the subscriber got. */
    static msg3 all[512];
    size_t n = replay(d.rep, 0, all, 512);
    uint64_t first = all[0].seq;
    assert_true(first >= started_us && first <= wall_us());
    assert_true(n >= last - first + 1);
    kvev_batch b0;
    decode(&all[0], &b0, 3, false);
    assert_int_equal(b0.events[0].type, KVEV_CLEARED);
    kvev_batch_free(&b0);
    seen again = {0};
    for (size_t i = 0; i < n; i++) {
        kvev_batch b;
        decode(&all[i], &b, 3, false);
        account(&again, &b, "CPU");
        kvev_batch_free(&b);
    }
    for (int i = 0; i < 8; i++) assert_true(has(again.stored, again.n_stored, hash_str(keys[i])));
    /* From the middle: the same bytes from there on. */
    static msg3 tail[512];
    size_t n2 = replay(d.rep, last, tail, 512);
    assert_true(n2 >= 1);
    assert_int_equal(tail[0].seq, last);
    assert_int_equal(tail[0].len, all[last - first].len);
    assert_memory_equal(tail[0].payload, all[last - first].payload, tail[0].len);
    free_msgs(tail, n2);
    /* Past the end: only the end marker. */
    assert_int_equal(replay(d.rep, first + n + 1000, tail, 512), 0);
    free_msgs(all, n);

    /* Counted: every batch published, none dropped. */
    assert_true(rig_stat(&r, "kv_events_published_batches", NULL) >= (double)(last - first + 1));
    assert_true(rig_stat(&r, "kv_events_next_seq", NULL) >= (double)(last + 1));
    assert_true(rig_stat(&r, "kv_events_dropped_batches", NULL) == 0);

    /* Close: the blocks are gone for routers too. */
    assert_int_equal(kvcr_close(r.kv), 0);
    bool cleared = false;
    msg3 m;
    for (int i = 0; i < 50 && !cleared; i++)
        while (sub_recv(&s, &m)) {
            kvev_batch b;
            decode(&m, &b, 3, false);
            for (size_t j = 0; j < b.n_events; j++) cleared |= b.events[j].type == KVEV_CLEARED;
            kvev_batch_free(&b);
            free(m.payload);
        }
    assert_true(cleared);
    sub_close(&s);
    rig_stop(&r);
    drop_dirs(&d);
}

/* A literal host is connected to (the router binds), and the older
 * positional form and another medium name are honoured. */
static void test_connected_endpoint_positional_form(void **state)
{
    (void)state;
    sub s;
    sub_open(&s, "tcp://127.0.0.1:0", true);
    char where[128];
    size_t sz = sizeof where;
    assert_int_equal(zmq_getsockopt(s.sock, ZMQ_LAST_ENDPOINT, where, &sz), 0);
    rig r;
    rig_init(&r, 256, 4, 8);
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = where;
    r.cfg.kv_events.topic = TOPIC;
    r.cfg.kv_events.legacy_positional = true;
    r.cfg.kv_events.medium_dram = "CPU_PINNED";
    rig_start(&r);
    seen w = {0};
    join_stream(&r, &s, &w, "CPU_PINNED", true, 0);
    assert_int_equal(rig_deposit1(&r, "p0", 1, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    read_until_stored(&r, &s, &w, hash_str("p0"), "CPU_PINNED", true, 0);
    rig_stop(&r);
    sub_close(&s);
}

/* Nobody reads: operations go on, what cannot be sent is counted. */
static void test_subscriber_that_never_reads_blocks_nothing(void **state)
{
    (void)state;
    dirs d;
    make_dirs(&d);
    rig r;
    rig_init(&r, 64, 64, 64);
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = d.pub;
    r.cfg.kv_events.topic = TOPIC;
    r.cfg.kv_events.buffer_batches = 4;
    r.cfg.kv_events.max_batch_events = 1;
    rig_start(&r);
    void *ctx = zmq_ctx_new(), *lazy = zmq_socket(ctx, ZMQ_SUB);
    int one = 1, zero = 0;
    zmq_setsockopt(lazy, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(lazy, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(lazy, ZMQ_SUBSCRIBE, "", 0);
    assert_int_equal(zmq_connect(lazy, d.pub), 0);
    /* 64 blocks of 64 keys each round, every round evicting the last:
     * far more bytes of events than the socket buffers hold. */
    static char names[64][48];
    const char *keys[64];
    size_t idx[64];
    double dropped = 0;
    for (int round = 0; round < 2000 && dropped == 0; round++) {
        for (int i = 0; i < 64; i++) {
            snprintf(names[i], sizeof names[i], "r%d-%d-with-a-longer-key", round, i);
            keys[i] = names[i];
            idx[i] = (size_t)i;
        }
        kvcr_entry_status st[64];
        rig_wait(&r, rig_deposit(&r, keys, idx, 64, 0), st, NULL, NULL);
        for (int i = 0; i < 64; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
        if (round % 50 == 49) dropped = rig_stat(&r, "kv_events_dropped_batches", NULL);
    }
    assert_true(dropped > 0);
    rig_stop(&r);
    zmq_close(lazy);
    zmq_ctx_term(ctx);
    drop_dirs(&d);
}

/* A deposit that describes its blocks (kvcr_deposit_ex): each is
 * announced with its parent, tokens, block size, LoRA name and extra keys;
 * an undescribed one in the same deposit by its hash alone; the options'
 * version and bounds are checked before anything starts. */
static void test_described_blocks_carry_their_tokens(void **state)
{
    (void)state;
    dirs d;
    make_dirs(&d);
    rig r;
    rig_init(&r, 256, 8, 8);
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = d.pub;
    r.cfg.kv_events.topic = TOPIC;
    rig_start(&r);
    sub s;
    sub_open(&s, d.pub, false);
    seen w = {0};
    join_stream(&r, &s, &w, "CPU", false, 0);

    uint32_t tok[2][4] = {{11, 12, 13, 14}, {15, 16, 17, 18}};
    const char *salt[] = {"salt-a"};
    kvcr_router_block rb[3] = {
        {.token_ids = tok[0], .block_size_tokens = 4, .lora_name = "lora-1"},
        {.has_parent = true, .parent_hash = hash_str("c0"), .token_ids = tok[1],
         .block_size_tokens = 4, .extra_keys = salt, .n_extra_keys = 1},
        {0}, /* nothing known: hashes only */
    };
    kvcr_mem_ref refs[3] = {{NULL, "", 0}, {NULL, "", 1}, {NULL, "", 2}};
    kvcr_block blocks[3] = {{key_of("c0"), &refs[0], 1}, {key_of("c1"), &refs[1], 1},
                            {key_of("c2"), &refs[2], 1}};
    kvcr_deposit_options opts = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .router = rb};
    kvcr_op_handle op;
    /* Refusals first: nothing starts, nothing is kept. */
    opts.version = 0;
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 3, &opts, &op), KVCR_EINVAL);
    opts.version = KVCR_DEPOSIT_OPTIONS_VERSION;
    rb[2].token_ids = tok[0]; /* tokens without a block size */
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 3, &opts, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "router block 2: token_ids need block_size_tokens "
                                           "between 1 and 65536");
    rb[2].token_ids = NULL;
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 3, NULL, &op), KVCR_EINVAL);
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 3, &opts, &op), 0);
    kvcr_entry_status st[3];
    rig_wait(&r, op, st, NULL, NULL);
    for (int i = 0; i < 3; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);

    bool got[3] = {false, false, false};
    for (int round = 0; round < 200 && !(got[0] && got[1] && got[2]); round++) {
        rig_pump(&r);
        msg3 m;
        while (sub_recv(&s, &m)) {
            kvev_batch b;
            decode(&m, &b, 0, false);
            for (size_t i = 0; i < b.n_events; i++) {
                const kvev_event *e = &b.events[i];
                if (e->type != KVEV_STORED) continue;
                for (size_t j = 0; j < e->n_hashes; j++) {
                    if (e->hashes[j] == hash_str("c0")) {
                        assert_int_equal(e->n_hashes, 1);
                        assert_false(e->has_parent);
                        assert_int_equal(e->block_size, 4);
                        assert_int_equal(e->n_tokens, 4);
                        assert_memory_equal(e->tokens, tok[0], sizeof tok[0]);
                        assert_string_equal(e->lora_name, "lora-1");
                        assert_null(e->extra);
                        got[0] = true;
                    } else if (e->hashes[j] == hash_str("c1")) {
                        assert_true(e->has_parent && e->parent == hash_str("c0"));
                        assert_memory_equal(e->tokens, tok[1], sizeof tok[1]);
                        assert_null(e->lora_name);
                        assert_non_null(e->extra);
                        assert_int_equal(e->n_extra[0], 1);
                        assert_string_equal(e->extra[0][0], "salt-a");
                        got[1] = true;
                    } else if (e->hashes[j] == hash_str("c2")) {
                        assert_int_equal(e->n_tokens, 0);
                        assert_int_equal(e->block_size, 0);
                        got[2] = true;
                    }
                }
            }
            kvev_batch_free(&b);
            free(m.payload);
        }
    }
    assert_true(got[0] && got[1] && got[2]);
    rig_stop(&r);
    sub_close(&s);
    drop_dirs(&d);
}

/* ---- what survives a warm restart -------------------------------------------- */

#define WB 4096 /* a G3 slot: page aligned */

typedef struct g3_dir {
    char dir[64], path[96];
    const char *paths[1];
} g3_dir;

/* An instance of 2 KVCR DRAM slots spilling to one G3 file of 8, two
 * tenants, publishing with a replay endpoint. */
static void g3_events_init(rig *r, g3_dir *g, const dirs *d)
{
    static const kvcr_tenant tenants[] = {{"alice", 1, 4}, {"bob", 1, 4}};
    rig_init(r, WB, 16, 2);
    for (size_t i = 0; i < 16; i++) rig_pattern(r, i, (uint32_t)(500 + i));
    r->cfg.enable_telemetry = true;
    r->cfg.callbacks.key_hash = key_hash;
    r->cfg.kv_events.endpoint = d->pub;
    r->cfg.kv_events.replay_endpoint = d->rep;
    r->cfg.kv_events.topic = TOPIC;
    r->cfg.tenants = tenants;
    r->cfg.n_tenants = 2;
    g->paths[0] = g->path;
    r->cfg.g3.paths = g->paths;
    r->cfg.g3.n_paths = 1;
    r->cfg.g3.capacity_bytes_per_file = 8 * WB;
}

/* A BlockStored naming hash h with medium `medium` found in the replayed
 * stream (bounded: 100 rounds of polling, replaying and waiting), copied into *out
 * with its batch kept in *keep (kvev_batch_free it). */
static bool find_stored(rig *r, const char *rep, uint64_t h, const char *medium,
                        kvev_batch *keep, const kvev_event **out)
{
    static msg3 all[512];
    for (int round = 0; round < 100; round++) {
        rig_pump(r);
        size_t n = replay(rep, 0, all, 512);
        bool found = false;
        for (size_t i = 0; i < n && !found; i++) {
            kvev_batch b;
            decode(&all[i], &b, 0, false);
            for (size_t j = 0; j < b.n_events && !found; j++) {
                const kvev_event *e = &b.events[j];
                found = e->type == KVEV_STORED && has(e->hashes, e->n_hashes, h) &&
                        strcmp(e->medium, medium) == 0;
                if (found) *out = e;
            }
            if (found)
                *keep = b;
            else
                kvev_batch_free(&b);
        }
        free_msgs(all, n);
        if (found) return true;
        /* Until a completion (the spill landing) or two batch intervals
         * (10 ms by default): a landed event is replayable once the
         * publisher closes its batch, which nothing signals here. */
        fd_wait(r->kv, fd_wait_now_ms() + 20);
    }
    return false;
}

static void deposit_described(rig *r, const char *key, size_t idx, const kvcr_router_block *rb,
                              const char *hints)
{
    kvcr_mem_ref ref = {NULL, "", idx};
    kvcr_block b = {key_of(key), &ref, 1};
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .router = rb,
                              .hints = hints, .hints_len = hints ? strlen(hints) : 0};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit_ex(r->kv, &b, 1, &o, &op), 0);
    kvcr_entry_status st;
    rig_wait(r, op, &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
}

/* Extra keys as vLLM sends them (strings, integers, tuples: JSON arrays
 * in router_extra) reach the BlockStored packed as vLLM packs them, byte
 * for byte: ["salt", 7, ["mm-a", 3]] is 93 a4'salt' 07 92 a4'mm-a' 03;
 * a list of strings (router.extra_keys) still works beside it; what
 * breaks a rule is refused before anything starts; the packed keys come
 * back unchanged through the stored form a G3 record keeps. */
static void test_extra_keys_take_what_vllm_sends(void **state)
{
    (void)state;
    static const uint8_t want0[] = {0x93, 0xa4, 's', 'a', 'l', 't', 0x07,
                                    0x92, 0xa4, 'm', 'm', '-', 'a', 0x03};
    static const uint8_t want1[] = {0x91, 0xa2, 's', '2'};
    dirs d;
    make_dirs(&d);
    rig r;
    rig_init(&r, 256, 8, 8);
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = d.pub;
    r.cfg.kv_events.replay_endpoint = d.rep;
    r.cfg.kv_events.topic = TOPIC;
    rig_start(&r);

    uint32_t tok[2][2] = {{1, 2}, {3, 4}};
    const char *s2[] = {"s2"};
    kvcr_router_block rb[2] = {{.token_ids = tok[0], .block_size_tokens = 2},
                               {.token_ids = tok[1], .block_size_tokens = 2, .extra_keys = s2,
                                .n_extra_keys = 1}};
    const char *json[2] = {"[\"salt\", 7, [\"mm-a\", 3]]", NULL};
    kvcr_mem_ref refs[2] = {{NULL, "", 0}, {NULL, "", 1}};
    kvcr_block blocks[2] = {{key_of("x0"), &refs[0], 1}, {key_of("x1"), &refs[1], 1}};
    kvcr_deposit_options opts = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .router = rb,
                                 .router_extra = json};
    kvcr_op_handle op;
    /* Refusals: each names the block and the rule; nothing starts. */
    static const struct {
        const char *json, *why;
    } bad[] = {
        {"[-1]", "router block 0: router_extra: an extra key must be a string, a non-negative "
                 "integer or a list of them"},
        {"[1.5]", "router block 0: router_extra: an extra key must be a string, a non-negative "
                  "integer or a list of them"},
        {"[{\"a\": 1}]", "router block 0: router_extra: an extra key must be a string, a "
                         "non-negative integer or a list of them"},
        {"[[[\"deep\"]]]", "router block 0: router_extra: an extra key must be a string, a "
                          "non-negative integer or a list of them"},
        {"{\"a\": 1}", "router block 0: router_extra: extra keys must be a JSON array of at "
                       "most 64 keys"},
        {"[\"x\",", "router block 0: router_extra: extra keys must be JSON text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json[0] = bad[i].json;
        assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 2, &opts, &op), KVCR_EINVAL);
        assert_string_equal(kvcr_last_error(), bad[i].why);
    }
    json[0] = "[\"salt\", 7, [\"mm-a\", 3]]";
    json[1] = "[\"twice\"]";
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 2, &opts, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "router block 1: extra keys given twice (extra_keys "
                                           "and router_extra)");
    json[1] = NULL;
    opts.router = NULL;
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 2, &opts, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "kvcr_deposit_ex: router_extra needs router");
    opts.router = rb;
    assert_int_equal(kvcr_deposit_ex(r.kv, blocks, 2, &opts, &op), 0);
    kvcr_entry_status st[2];
    rig_wait(&r, op, st, NULL, NULL);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(st[1], KVCR_ENTRY_SUCCESS);
    const uint8_t *want[2] = {want0, want1};
    size_t want_len[2] = {sizeof want0, sizeof want1};
    for (int i = 0; i < 2; i++) {
        kvev_batch keep;
        const kvev_event *e;
        assert_true(find_stored(&r, d.rep, hash_str(i ? "x1" : "x0"), "CPU", &keep, &e));
        assert_non_null(e->extra_mp);
        assert_int_equal(e->extra_mp_len[0], want_len[i]);
        assert_memory_equal(e->extra_mp[0], want[i], want_len[i]);
        if (i == 0)
            assert_null(e->extra[0]); /* not strings alone */
        else
            assert_string_equal(e->extra[0][0], "s2");
        kvev_batch_free(&keep);
    }
    rig_stop(&r);
    drop_dirs(&d);

    /* The stored form keeps the packed keys as they are. */
    rmeta_map m;
    rmeta_init(&m, 4);
    assert_int_equal(rmeta_put(&m, 3, &rb[0], want0, sizeof want0), 0);
    uint8_t stored[128];
    size_t n = rmeta_encode(rmeta_get(&m, 3), stored, sizeof stored);
    assert_true(n <= sizeof stored);
    assert_int_equal(stored[1] & RMETA_F_PACKED, RMETA_F_PACKED);
    bool damaged;
    rmeta *back = rmeta_decode(3, stored, n, &damaged);
    assert_non_null(back);
    assert_int_equal(back->extra_len, sizeof want0);
    assert_memory_equal(back->extra, want0, sizeof want0);
    free(back);
    stored[n - 1] = 0xc1; /* never valid msgpack: the record reads as damaged */
    assert_null(rmeta_decode(3, stored, n, &damaged));
    assert_true(damaged);
    rmeta_destroy(&m);
}

/* Blocks spilled to G3 with their router metadata and tenant are found
 * again by the next instance on the same files: their BlockStored (medium
 * STORAGE) carries the parent, tokens, block size, LoRA name and extra
 * keys given at deposit, value for value; their G3 slots count under their
 * tenant again; metadata too long for a G3 record is counted and the block
 * announced by its hash alone; a block without metadata stays hashes-only. */
static void test_g3_warm_restart_announces_what_the_deposit_said(void **state)
{
    (void)state;
    dirs d;
    make_dirs(&d);
    g3_dir g;
    snprintf(g.dir, sizeof g.dir, "/var/tmp/kvcr-kvev-g3-XXXXXX");
    assert_non_null(mkdtemp(g.dir));
    snprintf(g.path, sizeof g.path, "%s/slots", g.dir);
    rig r;
    g3_events_init(&r, &g, &d);
    rig_start(&r);

    static uint32_t tok[3][16], big[64];
    for (uint32_t i = 0; i < 16; i++)
        for (uint32_t b = 0; b < 3; b++) tok[b][i] = 0xfffff000u + 100 * b + i; /* u32 range */
    for (uint32_t i = 0; i < 64; i++) big[i] = i;
    const char *salt[] = {"salt-a", "mm-hash-b"};
    kvcr_router_block rb[4] = {
        {.token_ids = tok[0], .block_size_tokens = 16, .lora_name = "lora-x"},
        {.has_parent = true, .parent_hash = hash_str("w0"), .token_ids = tok[1],
         .block_size_tokens = 16, .extra_keys = salt, .n_extra_keys = 2},
        {.has_parent = true, .parent_hash = 0xffffffffffffffffull, .token_ids = tok[2],
         .block_size_tokens = 16, .lora_name = ""},
        {.token_ids = big, .block_size_tokens = 64}, /* 263 bytes: no room in a record */
    };
    const char *keys[4] = {"w0", "w1", "w2", "w-big"};
    for (size_t i = 0; i < 4; i++) {
        deposit_described(&r, keys[i], i, &rb[i], i < 3 ? "{\"tenant\":\"alice\"}" : NULL);
        rig_g3_settle(&r);
    }
    deposit_described(&r, "w-plain", 4, NULL, "{\"tenant\":\"bob\"}");
    rig_g3_settle(&r);
    /* Two more push all five out of KVCR DRAM into G3. */
    assert_int_equal(rig_deposit1(&r, "p0", 5, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    rig_g3_settle(&r);
    assert_int_equal(rig_deposit1(&r, "p1", 6, 0, NULL, NULL), KVCR_ENTRY_SUCCESS);
    rig_g3_settle(&r);
    for (size_t i = 0; i < 4; i++) assert_int_equal(rig_query(&r, keys[i]), KVCR_QUERY_FETCHABLE);
    /* The live spill already says it all: each block's BlockStored(STORAGE)
     * follows its BlockRemoved(CPU) and still carries its metadata (the
     * block too long for a G3 record included: it is in memory). */
    for (size_t i = 0; i < 4; i++) {
        kvev_batch keep;
        const kvev_event *e;
        assert_true(find_stored(&r, d.rep, hash_str(keys[i]), "STORAGE", &keep, &e));
        assert_int_equal(e->n_hashes, 1);
        assert_int_equal(e->has_parent, rb[i].has_parent);
        if (rb[i].has_parent) assert_true(e->parent == rb[i].parent_hash);
        assert_int_equal(e->block_size, rb[i].block_size_tokens);
        assert_int_equal(e->n_tokens, rb[i].block_size_tokens);
        assert_memory_equal(e->tokens, rb[i].token_ids, e->n_tokens * sizeof(uint32_t));
        if (i == 1) assert_string_equal(e->extra[0][1], "mm-hash-b");
        kvev_batch_free(&keep);
    }
    assert_int_equal(rig_stat(&r, "tenant_alice_g3_slots", NULL), 3);
    assert_int_equal(rig_stat(&r, "tenant_bob_g3_slots", NULL), 1);
    assert_int_equal(rig_stat(&r, "kv_events_meta_unkept", NULL), 1); /* w-big */
    rig_stop(&r); /* the process's memory is gone; the G3 file stays */

    g3_events_init(&r, &g, &d);
    rig_start(&r);
    assert_int_equal(rig_stat(&r, "tenant_alice_g3_slots", NULL), 3);
    assert_int_equal(rig_stat(&r, "tenant_bob_g3_slots", NULL), 1);
    assert_int_equal(rig_stat(&r, "no_tenant_g3_slots", NULL), 1); /* w-big */
    for (size_t i = 0; i < 4; i++) {
        kvev_batch keep;
        const kvev_event *e;
        assert_true(find_stored(&r, d.rep, hash_str(keys[i]), "STORAGE", &keep, &e));
        if (i < 3) { /* described: an event of its own */
            assert_int_equal(e->n_hashes, 1);
            assert_int_equal(e->has_parent, rb[i].has_parent);
            if (rb[i].has_parent) assert_true(e->parent == rb[i].parent_hash);
            assert_int_equal(e->block_size, 16);
            assert_int_equal(e->n_tokens, 16);
            assert_memory_equal(e->tokens, rb[i].token_ids, 16 * sizeof(uint32_t));
        } else { /* too long for the record: its hash alone */
            assert_false(e->has_parent);
            assert_int_equal(e->n_tokens, 0);
            assert_int_equal(e->block_size, 0);
        }
        if (rb[i].lora_name && i < 3)
            assert_string_equal(e->lora_name, rb[i].lora_name);
        else
            assert_null(e->lora_name);
        if (i == 1) {
            assert_non_null(e->extra);
            assert_int_equal(e->n_extra[0], 2);
            assert_string_equal(e->extra[0][0], "salt-a");
            assert_string_equal(e->extra[0][1], "mm-hash-b");
        } else {
            assert_null(e->extra);
        }
        kvev_batch_free(&keep);
    }
    kvev_batch keep;
    const kvev_event *e;
    assert_true(find_stored(&r, d.rep, hash_str("w-plain"), "STORAGE", &keep, &e));
    assert_int_equal(e->n_tokens, 0);
    kvev_batch_free(&keep);
    /* The bytes came back too. */
    const char *k[] = {"w1"};
    size_t at[] = {15};
    kvcr_entry_status st;
    rig_wait(&r, rig_deliver(&r, k, at, 1), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    assert_true(rig_has_pattern(&r, r.fw + 15 * WB, 501));
    rig_stop(&r);
    unlink(g.path);
    rmdir(g.dir);
    drop_dirs(&d);
}

/* Blocks a claim recovers from the journal (what the Guard compacted) come
 * with their tenant and router metadata: each takes its tenant back (a
 * name no longer configured: none) and its BlockStored carries what its
 * deposit said, value for value; a block without metadata is announced by
 * its hash alone. */
static void test_recovered_blocks_take_their_tenant_and_metadata(void **state)
{
    (void)state;
    dirs d;
    make_dirs(&d);
    static const kvcr_tenant tenants[] = {{"alice", 2, 0}, {"bob", 2, 0}};
    rig r;
    rig_init(&r, 256, 8, 8);
    r.cfg.enable_telemetry = true;
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = d.pub;
    r.cfg.kv_events.replay_endpoint = d.rep;
    r.cfg.kv_events.topic = TOPIC;
    r.cfg.tenants = tenants;
    r.cfg.n_tenants = 2;

    uint32_t tok[16];
    for (uint32_t i = 0; i < 16; i++) tok[i] = 70000 + i;
    const char *salt[] = {"salt-r"};
    kvcr_router_block rb = {.has_parent = true, .parent_hash = hash_str("g-parent"),
                            .token_ids = tok, .block_size_tokens = 16, .lora_name = "lora-r",
                            .extra_keys = salt, .n_extra_keys = 1};
    rmeta_map m;
    rmeta_init(&m, 4);
    uint8_t *packed;
    size_t packed_len;
    assert_int_equal(kvev_extra_from_strings(salt, 1, &packed, &packed_len), 0);
    assert_int_equal(rmeta_put(&m, 1, &rb, packed, packed_len), 0);
    free(packed);
    uint8_t meta[256];
    size_t ml = rmeta_encode(rmeta_get(&m, 1), meta, sizeof meta);
    assert_true(ml > 0 && ml <= sizeof meta);
    rmeta_destroy(&m);
    recovered_block blocks[3] = {
        {(const uint8_t *)"g0", 2, 0, 0, (const uint8_t *)"alice", meta, 5, ml},
        {(const uint8_t *)"g1", 2, 0, 1, (const uint8_t *)"bob", NULL, 3, 0},
        {(const uint8_t *)"g2", 2, 0, 2, (const uint8_t *)"carol", meta, 5, ml},
    };
    kvcr_boot boot = {.blocks = blocks, .n_blocks = 3, .control_listener = -1,
                      .role = "claimant"};
    int rc = kvcr__create(&r.cfg, &boot, &r.kv);
    if (rc != 0) fail_msg("kvcr__create: %s", kvcr_last_error());
    assert_int_equal(rig_stat(&r, "tenant_alice_dram_slots", NULL), 1);
    assert_int_equal(rig_stat(&r, "tenant_bob_dram_slots", NULL), 1);
    assert_int_equal(rig_stat(&r, "no_tenant_dram_slots", NULL), 1); /* carol is gone */

    const char *keys[] = {"g0", "g2"};
    for (size_t i = 0; i < 2; i++) {
        kvev_batch keep;
        const kvev_event *e;
        assert_true(find_stored(&r, d.rep, hash_str(keys[i]), "CPU", &keep, &e));
        assert_int_equal(e->n_hashes, 1);
        assert_true(e->has_parent && e->parent == hash_str("g-parent"));
        assert_int_equal(e->block_size, 16);
        assert_int_equal(e->n_tokens, 16);
        assert_memory_equal(e->tokens, tok, sizeof tok);
        assert_string_equal(e->lora_name, "lora-r");
        assert_non_null(e->extra);
        assert_int_equal(e->n_extra[0], 1);
        assert_string_equal(e->extra[0][0], "salt-r");
        kvev_batch_free(&keep);
    }
    kvev_batch keep;
    const kvev_event *e;
    assert_true(find_stored(&r, d.rep, hash_str("g1"), "CPU", &keep, &e));
    assert_int_equal(e->n_tokens, 0);
    assert_false(e->has_parent);
    kvev_batch_free(&keep);
    rig_stop(&r);
    drop_dirs(&d);
}

/* ---- the options' rules ------------------------------------------------------ */

static void expect_refused(rig *r, int code, const char *msg)
{
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr_create(&r->cfg, &kv), code);
    assert_null(kv);
    assert_string_equal(kvcr_last_error(), msg);
}

static void test_options_are_checked(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, 256, 4, 4);
    r.cfg.kv_events.endpoint = "tcp://*:0";
    expect_refused(&r, KVCR_EINVAL, "kv_events.endpoint needs callbacks.key_hash: events name "
                                    "blocks by their router hash");
    r.cfg.callbacks.key_hash = key_hash;
    r.cfg.kv_events.endpoint = "localhost:5557";
    expect_refused(&r, KVCR_EINVAL, "kv_events.endpoint must be a ZeroMQ endpoint "
                                    "(transport://address, e.g. tcp://*:5557), got "
                                    "'localhost:5557'");
    r.cfg.kv_events.endpoint = NULL;
    r.cfg.kv_events.replay_endpoint = "tcp://*:0";
    expect_refused(&r, KVCR_EINVAL, "kv_events.replay_endpoint needs kv_events.endpoint");
    r.cfg.kv_events.replay_endpoint = NULL;
    r.cfg.kv_events.buffer_batches = 0; /* checked with the publisher off too */
    expect_refused(&r, KVCR_EINVAL, "kv_events.buffer_batches must be between 1 and 1048576 "
                                    "(got 0)");
    r.cfg.kv_events.buffer_batches = 10;
    r.cfg.kv_events.batch_interval_ms = 10001;
    expect_refused(&r, KVCR_EINVAL, "kv_events.batch_interval_ms must be between 1 and 10000 "
                                    "(got 10001)");
    r.cfg.kv_events.batch_interval_ms = 5;
    r.cfg.kv_events.medium_g3 = "";
    expect_refused(&r, KVCR_EINVAL, "kv_events.medium_g3 must not be empty");
    r.cfg.kv_events.medium_g3 = "DISK";
    r.cfg.kv_events.dp_rank = 1u << 31; /* Dynamo refuses every batch of it */
    expect_refused(&r, KVCR_EINVAL, "kv_events.dp_rank must be at most 2147483647 (Dynamo "
                                    "reads it as a signed 32-bit integer), got 2147483648");
    r.cfg.kv_events.dp_rank = UINT32_MAX;
    expect_refused(&r, KVCR_EINVAL, "kv_events.dp_rank must be at most 2147483647 (Dynamo "
                                    "reads it as a signed 32-bit integer), got 4294967295");
    r.cfg.kv_events.dp_rank = INT32_MAX; /* the largest taken: it fails at the endpoint below */
    /* An endpoint another socket holds: nothing starts. */
    void *ctx = zmq_ctx_new(), *holder = zmq_socket(ctx, ZMQ_PUB);
    assert_int_equal(zmq_bind(holder, "tcp://127.0.0.1:0"), 0);
    char where[128], wild[160];
    size_t sz = sizeof where;
    zmq_getsockopt(holder, ZMQ_LAST_ENDPOINT, where, &sz);
    snprintf(wild, sizeof wild, "tcp://*:%s", strrchr(where, ':') + 1);
    r.cfg.kv_events.endpoint = wild;
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr_create(&r.cfg, &kv), KVCR_ESYS);
    assert_null(kv);
    assert_non_null(strstr(kvcr_last_error(), "cannot bind"));
    zmq_close(holder);
    zmq_ctx_term(ctx);
    /* The defaults kvcr_config_init writes. */
    kvcr_config c;
    kvcr_config_init(&c);
    assert_null(c.kv_events.endpoint);
    assert_int_equal(c.kv_events.buffer_batches, 10000);
    assert_string_equal(c.kv_events.medium_dram, "CPU");
    assert_string_equal(c.kv_events.medium_g3, "STORAGE");
    assert_string_equal(c.kv_events.topic, "");
    free(r.fw);
    free(r.dram);
}

/* ---- the encoding and the decoder's rules -------------------------------------- */

static size_t pack_one(const kvev_event *e, bool positional, uint8_t **out)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(kvev_pack_event(&pk, e, positional), 0);
    size_t len;
    assert_int_equal(kvev_pack_batch(1.8e9, sb.data, sb.size, 1, 7, out, &len), 0);
    msgpack_sbuffer_destroy(&sb);
    return len;
}

static void test_every_field_round_trips(void **state)
{
    (void)state;
    const uint64_t hashes[] = {1, UINT64_MAX};
    const uint32_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const char *salt[] = {"salt-1", "mm:abc"};
    uint8_t *packed;
    size_t packed_len;
    assert_int_equal(kvev_extra_from_strings(salt, 2, &packed, &packed_len), 0);
    const uint8_t *extra[] = {packed, NULL};
    const uint32_t extra_len[] = {(uint32_t)packed_len, 0};
    kvev_event e = {.type = KVEV_STORED, .hashes = hashes, .n_hashes = 2, .has_parent = true,
                    .parent = 1ull << 63, .tokens = tokens, .n_tokens = 8, .block_size = 4,
                    .medium = "STORAGE", .lora_name = "adapter-x", .extra_mp = extra,
                    .extra_mp_len = extra_len};
    for (int positional = 0; positional <= 1; positional++) {
        uint8_t *buf;
        size_t len = pack_one(&e, positional, &buf);
        kvev_batch b;
        assert_null(kvev_decode_batch(buf, len, &b));
        assert_int_equal(b.n_events, 1);
        assert_int_equal(b.dp_rank, 7);
        assert_true(b.ts == 1.8e9);
        const kvev_event *g = &b.events[0];
        assert_int_equal(g->type, KVEV_STORED);
        assert_int_equal(g->n_hashes, 2);
        assert_true(g->hashes[1] == UINT64_MAX);
        assert_true(g->has_parent && g->parent == 1ull << 63);
        assert_int_equal(g->n_tokens, 8);
        assert_memory_equal(g->tokens, tokens, sizeof tokens);
        assert_int_equal(g->block_size, 4);
        assert_string_equal(g->medium, "STORAGE");
        assert_string_equal(g->lora_name, "adapter-x");
        assert_int_equal(g->n_extra[0], 2);
        assert_string_equal(g->extra[0][1], "mm:abc");
        assert_null(g->extra[1]);
        assert_int_equal(g->extra_mp_len[0], packed_len);
        assert_memory_equal(g->extra_mp[0], packed, packed_len);
        assert_int_equal(g->extra_mp_len[1], 0);
        kvev_batch_free(&b);
        if (!positional) {
            /* The map's keys, in order: "type" first. */
            const char *order[] = {"type", "block_hashes", "parent_block_hash", "token_ids",
                                   "block_size", "lora_id", "medium", "lora_name",
                                   "extra_keys"};
            const uint8_t *at = buf;
            for (size_t i = 0; i < 9; i++) {
                const uint8_t *hit = memmem(at, len - (size_t)(at - buf), order[i],
                                            strlen(order[i]));
                assert_non_null(hit);
                at = hit + strlen(order[i]);
            }
        }
        free(buf);
    }
    /* Removal and clear: only their own fields. */
    kvev_event rm = {.type = KVEV_REMOVED, .hashes = hashes, .n_hashes = 1, .medium = "CPU"};
    uint8_t *buf;
    size_t len = pack_one(&rm, false, &buf);
    kvev_batch b;
    assert_null(kvev_decode_batch(buf, len, &b));
    assert_int_equal(b.events[0].type, KVEV_REMOVED);
    assert_string_equal(b.events[0].medium, "CPU");
    kvev_batch_free(&b);
    free(buf);
    len = pack_one(&(kvev_event){.type = KVEV_CLEARED}, false, &buf);
    assert_int_equal(len, 1 + 9 + 1 + 1 + 5 + 17 + 1); /* [f64, [{"type": str}], 7] */
    assert_null(kvev_decode_batch(buf, len, &b));
    assert_int_equal(b.events[0].type, KVEV_CLEARED);
    kvev_batch_free(&b);
    free(buf);
    free(packed);
}

/* Whether the bytes hold `want` (n bytes) somewhere. */
static bool holds(const uint8_t *buf, size_t len, const uint8_t *want, size_t n)
{
    return memmem(buf, len, want, n) != NULL;
}

/* Every hash is written in msgpack's 8-byte unsigned form (0xcf), however
 * small: llm-d's decoder takes only the sized 8-byte forms and drops the
 * whole batch otherwise. Hashes 5 and 2^32 + 1, parent 7, in both forms
 * and in a removal. */
static void test_hashes_are_always_eight_bytes(void **state)
{
    (void)state;
    const uint64_t hashes[] = {5, (1ull << 32) + 1};
    const uint32_t tokens[] = {9, 10};
    static const uint8_t want_hashes[] = {0x92, 0xcf, 0, 0, 0, 0, 0, 0, 0, 5,
                                          0xcf, 0, 0, 0, 1, 0, 0, 0, 1};
    static const uint8_t want_parent[] = {0xcf, 0, 0, 0, 0, 0, 0, 0, 7};
    kvev_event e = {.type = KVEV_STORED, .hashes = hashes, .n_hashes = 2, .has_parent = true,
                    .parent = 7, .tokens = tokens, .n_tokens = 2, .block_size = 1,
                    .medium = "CPU"};
    for (int positional = 0; positional <= 1; positional++) {
        uint8_t *buf;
        size_t len = pack_one(&e, positional, &buf);
        assert_true(holds(buf, len, want_hashes, sizeof want_hashes));
        assert_true(holds(buf, len, want_parent, sizeof want_parent));
        kvev_batch b;
        assert_null(kvev_decode_batch(buf, len, &b));
        assert_true(b.events[0].hashes[0] == 5 && b.events[0].parent == 7);
        kvev_batch_free(&b);
        free(buf);
    }
    kvev_event rm = {.type = KVEV_REMOVED, .hashes = hashes, .n_hashes = 2, .medium = "CPU"};
    uint8_t *buf;
    size_t len = pack_one(&rm, false, &buf);
    assert_true(holds(buf, len, want_hashes, sizeof want_hashes));
    free(buf);
}

/* Hand-made payloads, each breaking one rule. */
typedef void (*maker)(msgpack_packer *pk);

static void head(msgpack_packer *pk, uint32_t n_events)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_double(pk, 1.8e9);
    msgpack_pack_array(pk, n_events);
}

static void str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void removed_head(msgpack_packer *pk, uint32_t n_fields)
{
    head(pk, 1);
    msgpack_pack_map(pk, n_fields);
    str(pk, "type");
    str(pk, "BlockRemoved");
}

static void m_float32_ts(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_float(pk, 1.0f);
    msgpack_pack_array(pk, 0);
    msgpack_pack_uint8(pk, 0);
}
static void m_two_elements(msgpack_packer *pk)
{
    msgpack_pack_array(pk, 2);
    msgpack_pack_double(pk, 1.0);
    msgpack_pack_array(pk, 0);
}
static void m_type_not_first(msgpack_packer *pk)
{
    head(pk, 1);
    msgpack_pack_map(pk, 2);
    str(pk, "medium");
    str(pk, "CPU");
    str(pk, "type");
    str(pk, "AllBlocksCleared");
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_unknown_type(msgpack_packer *pk)
{
    head(pk, 1);
    msgpack_pack_map(pk, 1);
    str(pk, "type");
    str(pk, "BlockMoved");
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_out_of_order(msgpack_packer *pk)
{
    removed_head(pk, 3);
    str(pk, "medium");
    str(pk, "CPU");
    str(pk, "block_hashes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_missing_medium(msgpack_packer *pk)
{
    removed_head(pk, 2);
    str(pk, "block_hashes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_negative_hash(msgpack_packer *pk)
{
    removed_head(pk, 3);
    str(pk, "block_hashes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_int64(pk, -5);
    str(pk, "medium");
    msgpack_pack_nil(pk);
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_unknown_key(msgpack_packer *pk)
{
    removed_head(pk, 4);
    str(pk, "block_hashes");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 5);
    str(pk, "medium");
    msgpack_pack_nil(pk);
    str(pk, "colour");
    msgpack_pack_nil(pk);
    msgpack_pack_uint8(pk, 0); /* dp_rank */
}
static void m_partial_block(msgpack_packer *pk)
{
    head(pk, 1);
    msgpack_pack_array(pk, 8);
    str(pk, "BlockStored");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 3); /* 3 tokens for a block of 4 */
    for (int i = 0; i < 3; i++) msgpack_pack_uint32(pk, (uint32_t)i);
    msgpack_pack_uint32(pk, 4);
    msgpack_pack_nil(pk);
    str(pk, "CPU");
    msgpack_pack_nil(pk);
    msgpack_pack_uint8(pk, 0);
}
static void m_trailing(msgpack_packer *pk)
{
    head(pk, 0);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint8(pk, 0); /* a second object after the batch */
}

static void test_decoder_refuses_what_breaks_a_rule(void **state)
{
    (void)state;
    static const struct {
        maker make;
        const char *why;
    } cases[] = {
        {m_float32_ts, "the timestamp is not a float64"},
        {m_two_elements, "a batch is not an array of three"},
        {m_type_not_first, "an event's first key is not type"},
        {m_unknown_type, "unknown event type"},
        {m_out_of_order, "an event's field is missing or out of order"},
        {m_missing_medium, "an event's field is missing"},
        {m_negative_hash, "a block hash is not a u64"},
        {m_unknown_key, "unknown, repeated or out-of-order key in an event"},
        {m_partial_block, "token_ids must be whole blocks: block_size per block hash"},
        {m_trailing, "trailing bytes after the message"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        cases[i].make(&pk);
        kvev_batch b;
        const char *why = kvev_decode_batch(sb.data, sb.size, &b);
        if (why == NULL || strcmp(why, cases[i].why) != 0)
            fail_msg("case %zu: got '%s', want '%s'", i, why ? why : "(accepted)", cases[i].why);
        assert_int_equal(b.n_events, 0);
        assert_null(b.events);
        msgpack_sbuffer_destroy(&sb);
    }
    uint64_t start = 0;
    assert_string_equal(kvev_decode_replay_request("1234567", 7, &start),
                        "a replay request is exactly 8 bytes");
    assert_null(kvev_decode_replay_request("\0\0\0\0\0\0\1\2", 8, &start));
    assert_int_equal(start, 0x102);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_field_round_trips),
        cmocka_unit_test(test_hashes_are_always_eight_bytes),
        cmocka_unit_test(test_extra_keys_take_what_vllm_sends),
        cmocka_unit_test(test_decoder_refuses_what_breaks_a_rule),
        cmocka_unit_test(test_options_are_checked),
        cmocka_unit_test(test_stream_is_numbered_decodes_and_replays),
        cmocka_unit_test(test_connected_endpoint_positional_form),
        cmocka_unit_test(test_subscriber_that_never_reads_blocks_nothing),
        cmocka_unit_test(test_described_blocks_carry_their_tokens),
        cmocka_unit_test(test_g3_warm_restart_announces_what_the_deposit_said),
        cmocka_unit_test(test_recovered_blocks_take_their_tenant_and_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
