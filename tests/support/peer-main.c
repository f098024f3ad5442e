/* kvcr-test-peer: the peer process of the peer-to-peer tests (see peer.h).
 * argv: block_size deposit_n fw_n slots pins hold_pins port op_ms abandon_ms
 *       service guard_index digest g3_path (service, g3_path "-": none).
 * KVCR_TEST_PEER_AGENT in the environment: its agent name (default "peer");
 * KVCR_TEST_PEER_HOST: the address its control endpoint binds and
 * advertises (default 127.0.0.1); KVCR_TEST_PEER_FDS "<in> <out>": the
 * descriptors of its commands and answers (default 0 and 1).
 * Commands arrive on stdin, answers leave on stdout (see above). No cmocka assertion
 * may fail here: every failure is an exit code the parent sees. */
#include <poll.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"

/* ---- the child ----------------------------------------------------------- */

typedef struct child {
    rig r;
    peer_opts o;
    peer_counts counts;
    uint64_t next_pin;
    struct pending_pin {
        uint64_t req;
        size_t n;
        uint32_t idx[256];
        bool ok[256];
        char names[256][24];
    } pend[64];
    size_t n_pend;
    /* PEER_CMD_DEPOSIT: keys still to deposit, and the deposits in flight. */
    uint32_t dep_next, dep_left;
    kvcr_op_handle dep_ops[8];
    size_t n_dep_ops;
    /* PEER_CMD_PULL: the job, its operations in flight (slot s delivers into
     * framework blocks s * keys_per_op ..), and what they came to. */
    peer_pull pull;
    uint32_t pull_left;
    uint64_t pull_until_ns;
    struct pull_slot {
        kvcr_op_handle op; /* 0: free */
        uint32_t first;
        char req[24];
    } pull_slots[PEER_PULL_MAX_DEPTH];
    peer_pull_stats pulled;
} child;

enum { DEPOSIT_BATCH = 16, CHILD_FW_BLOCKS = 1024 };

static int on_request_pin(void *ud, uint64_t req, const kvcr_key *keys, size_t n)
{
    child *c = ud;
    c->counts.pin_requests++;
    if (c->o.hold_pins || c->n_pend == 64 || n > 256) return c->o.hold_pins ? 0 : -1;
    struct pending_pin *p = &c->pend[c->n_pend++];
    p->req = req;
    p->n = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t h;
        p->ok[i] = tool_key_hash(NULL, &keys[i], &h) == 0 && h < c->o.fw_n;
        snprintf(p->names[i], sizeof p->names[i], "%.*s",
                 (int)(keys[i].len < 23 ? keys[i].len : 23), (const char *)keys[i].data);
        p->idx[i] = p->ok[i] ? (uint32_t)h : 0;
    }
    return 0;
}

static void on_poll_pins(void *ud)
{
    child *c = ud;
    for (size_t k = 0; k < c->n_pend; k++) {
        struct pending_pin *p = &c->pend[k];
        kvcr_block b[256];
        kvcr_mem_ref refs[256];
        for (size_t i = 0; i < p->n; i++) {
            refs[i] = (kvcr_mem_ref){NULL, "", p->idx[i]};
            b[i] = (kvcr_block){key_of(p->names[i]), &refs[i], p->ok[i] ? 1 : 0};
            c->counts.pinned_keys += p->ok[i];
        }
        kvcr_pin_complete(c->r.kv, p->req, ++c->next_pin, b, p->n);
    }
    c->n_pend = 0;
}

static bool on_release_pin(void *ud, uint64_t pin)
{
    child *c = ud;
    (void)pin;
    c->counts.pin_releases++;
    return true;
}

static void on_cancel_pin(void *ud, uint64_t req)
{
    child *c = ud;
    (void)req;
    c->counts.pin_cancels++;
}

static void on_resilience(void *ud, const kvcr_resilience_event *ev)
{
    child *c = ud;
    (void)ev;
    c->counts.resilience_events++;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One finished pull operation: entries counted, bytes checked, its
 * request's hint forgotten. */
static void pull_settle(child *c, struct pull_slot *s, const kvcr_op_result *res)
{
    size_t slot = (size_t)(s - c->pull_slots);
    bool ok = true, busy = false;
    for (size_t e = 0; e < res->n_entries; e++) {
        const kvcr_entry_result *x = &res->entries[e];
        uint32_t key = c->pull.first + (s->first + (uint32_t)e) % c->pull.span;
        const uint8_t *dst = c->r.fw + (slot * c->pull.keys_per_op + e) * c->r.block_size;
        if (x->status == KVCR_ENTRY_SUCCESS) {
            bool good = rig_has_pattern(&c->r, dst, key);
            c->pulled.ok_entries += good;
            c->pulled.bad_bytes += !good;
            ok &= good;
        } else if (x->reason == KVCR_REASON_SOURCE_BUSY) {
            c->pulled.busy_entries++;
            busy = true;
            ok = false;
        } else {
            c->pulled.other_entries++;
            c->pulled.other_reason = x->reason;
            ok = false;
        }
    }
    c->pulled.done++;
    c->pulled.ok_ops += ok;
    c->pulled.busy_ops += busy;
    kvcr_discard_hint(c->r.kv, s->req);
    s->op = 0;
}

static void pull_absorb(child *c, const kvcr_op_result *res, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < c->pull.depth; k++)
            if (c->pull_slots[k].op == res[i].op) pull_settle(c, &c->pull_slots[k], &res[i]);
}

/* Counts what finished among the asynchronous deposits; true when op (0:
 * none) is among results and all its entries succeeded. */
static bool absorb(child *c, const kvcr_op_result *res, size_t n, kvcr_op_handle op)
{
    bool ok = false;
    pull_absorb(c, res, n);
    for (size_t i = 0; i < n; i++) {
        bool all = true;
        for (size_t e = 0; e < res[i].n_entries; e++)
            all &= res[i].entries[e].status == KVCR_ENTRY_SUCCESS;
        if (res[i].op == op) ok = all;
        for (size_t k = 0; k < c->n_dep_ops; k++) {
            if (c->dep_ops[k] != res[i].op) continue;
            for (size_t e = 0; e < res[i].n_entries; e++)
                c->counts.deposits_done += res[i].entries[e].status == KVCR_ENTRY_SUCCESS;
            c->dep_ops[k] = c->dep_ops[--c->n_dep_ops];
            break;
        }
    }
    return ok;
}

static void child_poll(child *c)
{
    kvcr_op_result *res;
    size_t n;
    if (kvcr_poll(c->r.kv, &res, &n) != 0) return;
    absorb(c, res, n, 0);
    kvcr_results_free(res);
}

/* Polls until op completes (bounded: 10 s); true when every entry succeeded. */
static bool child_wait(child *c, kvcr_op_handle op)
{
    for (uint64_t until = rig_now_ms() + 10000; rig_now_ms() < until;) {
        kvcr_op_result *res;
        size_t n;
        if (kvcr_poll(c->r.kv, &res, &n) != 0) return false;
        bool mine = false;
        for (size_t i = 0; i < n; i++) mine |= res[i].op == op;
        bool ok = absorb(c, res, n, op);
        kvcr_results_free(res);
        if (mine) return ok;
        rig_await(&c->r, 2); /* 2 ms: how late an expired deadline may be seen */
    }
    return false;
}

/* Deposits k<i> from framework block i and waits for it (bounded); with
 * KV events, with what a router needs of it (peer_router_block). */
static bool child_deposit(child *c, uint32_t i)
{
    char k[24];
    kvcr_mem_ref ref = {NULL, "", i};
    kvcr_block b = {key_of(peer_key(k, sizeof k, i)), &ref, 1};
    peer_router_buf buf;
    kvcr_router_block rb;
    peer_router_block(i, &buf, &rb);
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION,
                              .router = c->r.cfg.kv_events.endpoint ? &rb : NULL};
    kvcr_op_handle op;
    if (kvcr_deposit_ex(c->r.kv, &b, 1, &o, &op) != 0 || !child_wait(c, op)) return false;
    c->counts.deposits_done++;
    return true;
}

/* Keeps a few batches of PEER_CMD_DEPOSIT in flight. */
static void deposit_more(child *c)
{
    while (c->dep_left > 0 && c->n_dep_ops < 4) {
        uint32_t n = c->dep_left < DEPOSIT_BATCH ? c->dep_left : DEPOSIT_BATCH;
        char names[DEPOSIT_BATCH][24];
        kvcr_mem_ref refs[DEPOSIT_BATCH];
        kvcr_block b[DEPOSIT_BATCH];
        for (uint32_t i = 0; i < n; i++) {
            uint32_t k = c->dep_next + i;
            refs[i] = (kvcr_mem_ref){NULL, "", k};
            b[i] = (kvcr_block){key_of(peer_key(names[i], sizeof names[i], k)), &refs[i], 1};
        }
        kvcr_op_handle op;
        if (kvcr_deposit(c->r.kv, b, n, 0, &op) != 0) _exit(7);
        c->dep_ops[c->n_dep_ops++] = op;
        c->dep_next += n;
        c->dep_left -= n;
    }
}

/* Starts operation number c->pulled.started in slot s: its own request,
 * hinted at the source, delivering into the slot's zeroed blocks. A refused
 * call is an exit code (the parent sees the peer die). */
static void pull_one(child *c, struct pull_slot *s)
{
    const peer_pull *p = &c->pull;
    size_t slot = (size_t)(s - c->pull_slots);
    s->first = (uint32_t)((c->pulled.started * p->keys_per_op) % p->span);
    snprintf(s->req, sizeof s->req, "pull-%llu", (unsigned long long)c->pulled.started);
    uint64_t hashes[PEER_PULL_MAX_KEYS];
    char names[PEER_PULL_MAX_KEYS][24];
    kvcr_mem_ref refs[PEER_PULL_MAX_KEYS];
    kvcr_block b[PEER_PULL_MAX_KEYS];
    for (uint32_t i = 0; i < p->keys_per_op; i++) {
        uint32_t key = p->first + (s->first + i) % p->span;
        size_t dst = slot * p->keys_per_op + i;
        hashes[i] = key;
        memset(c->r.fw + dst * c->r.block_size, 0, c->r.block_size);
        refs[i] = (kvcr_mem_ref){NULL, "", dst};
        b[i] = (kvcr_block){key_of(peer_key(names[i], sizeof names[i], key)), &refs[i], 1};
    }
    char json[2048];
    peer_hint_json(json, sizeof json, p->source, hashes, p->keys_per_op);
    if (kvcr_submit_hint(c->r.kv, s->req, json, strlen(json)) != 0 ||
        kvcr_deliver(c->r.kv, b, p->keys_per_op, s->req, &s->op) != 0) {
        fprintf(stderr, "peer: pull: %s\n", kvcr_last_error());
        _exit(8);
    }
    c->pulled.started++;
}

/* Keeps the pull job's operations in flight, while it has any left. */
static void pull_more(child *c)
{
    if (c->pull_left > 0 && now_ns() >= c->pull_until_ns) c->pull_left = 0;
    bool busy = false;
    for (uint32_t k = 0; k < c->pull.depth; k++) {
        if (c->pull_slots[k].op == 0 && c->pull_left > 0) {
            pull_one(c, &c->pull_slots[k]);
            c->pull_left--;
        }
        busy |= c->pull_slots[k].op != 0;
    }
    c->pulled.idle = !busy && c->pull_left == 0;
}

/* PEER_CMD_PULL: a new job (parameters checked: a bad one is an exit). */
static void pull_command(child *c, int cmd)
{
    peer_pull p;
    size_t got = 0;
    while (got < sizeof p) {
        ssize_t n = read(cmd, (char *)&p + got, sizeof p - got);
        if (n <= 0) _exit(3);
        got += (size_t)n;
    }
    p.source[sizeof p.source - 1] = '\0';
    if (p.keys_per_op < 1 || p.keys_per_op > PEER_PULL_MAX_KEYS || p.depth < 1 ||
        p.depth > PEER_PULL_MAX_DEPTH || p.span < p.keys_per_op ||
        (size_t)p.depth * p.keys_per_op > c->r.fw_count)
        _exit(9);
    for (uint32_t k = 0; k < c->pull.depth; k++) /* slots in flight keep their old layout */
        if (c->pull_slots[k].op != 0 && (p.keys_per_op != c->pull.keys_per_op ||
                                         p.first != c->pull.first || p.span != c->pull.span))
            _exit(9);
    if (p.depth < c->pull.depth)
        for (uint32_t k = p.depth; k < c->pull.depth; k++)
            if (c->pull_slots[k].op != 0) _exit(9);
    c->pull = p;
    c->pull_left += p.n_ops;
    c->pull_until_ns = now_ns() + (uint64_t)p.max_ms * 1000000u;
    c->pulled.idle = 0;
}

/* PEER_CMD_VERIFY: which of k0..k<n-1> this instance holds in KVCR DRAM
 * or in G3, and whether each comes back with its bytes. */
static peer_verdict child_verify(child *c, uint32_t n)
{
    peer_verdict v = {0, 0, 0};
    for (uint32_t i = 0; i < n && i < c->r.fw_count; i++) {
        char k[24];
        kvcr_key key = key_of(peer_key(k, sizeof k, i));
        kvcr_query_result q;
        if (kvcr_query(c->r.kv, &key, 1, NULL, &q) != 0) continue;
        if (q.status == KVCR_QUERY_HIT)
            v.hits++;
        else if (q.status == KVCR_QUERY_FETCHABLE && q.tier == KVCR_TIER_G3)
            v.in_g3++;
        else
            continue;
        uint8_t *dst = c->r.fw + (size_t)i * c->r.block_size;
        memset(dst, 0, c->r.block_size);
        kvcr_mem_ref ref = {NULL, "", i};
        kvcr_block b = {key, &ref, 1};
        kvcr_op_handle op;
        if (kvcr_deliver(c->r.kv, &b, 1, NULL, &op) == 0 && child_wait(c, op) &&
            rig_has_pattern(&c->r, dst, i))
            v.good++;
    }
    return v;
}

static bool read_u32(int fd, uint32_t *v)
{
    return read(fd, v, 4) == 4;
}

static _Noreturn void child_main(const peer_opts *o, int cmd, int out)
{
    static child c;
    c.o = *o;
    rig_init_remote(&c.r, o->block_size, o->fw_n ? o->fw_n : 1, o->service ? 0 : o->slots);
    if (o->service) { /* deposits and verification use framework block i for k<i> */
        free(c.r.fw);
        c.r.fw_count = CHILD_FW_BLOCKS;
        c.r.fw = aligned_alloc(4096, o->block_size * CHILD_FW_BLOCKS);
        c.r.region.addr = c.r.fw;
        c.r.region.count = CHILD_FW_BLOCKS;
        c.r.cfg.guard.service_socket_path = o->service;
        c.r.cfg.guard.guard_index = o->guard_index;
        c.r.cfg.guard.compatibility_digest = o->digest;
    } else if (o->deposit_n > c.r.fw_count) {
        /* deposits come from framework blocks: make room */
        free(c.r.fw);
        c.r.fw_count = o->deposit_n;
        c.r.fw = aligned_alloc(64, o->block_size * o->deposit_n);
        c.r.region.addr = c.r.fw;
        c.r.region.count = o->deposit_n;
    }
    for (uint32_t i = 0; i < c.r.fw_count; i++) rig_pattern(&c.r, i, i);
    if (o->g3_path) {
        c.r.cfg.g3.paths = &o->g3_path;
        c.r.cfg.g3.n_paths = 1;
        c.r.cfg.g3.capacity_bytes_per_file = (uint64_t)PEER_G3_SLOTS * o->block_size;
    }
    const char *agent = getenv("KVCR_TEST_PEER_AGENT");
    c.r.cfg.agent_name = agent ? agent : "peer";
    c.r.cfg.remote.control_port = o->port;
    if (o->host) c.r.cfg.remote.control_host = o->host;
    c.r.cfg.operation_timeout_ms = o->op_timeout_ms;
    c.r.cfg.enable_telemetry = true; /* PEER_CMD_COUNTERS reads gauges */
    c.r.cfg.abandon_timeout_ms = o->abandon_timeout_ms;
    c.r.cfg.callbacks.ud = &c.r; /* the rig's own callbacks take the rig */
    if (o->pins || o->hold_pins) {
        c.r.cfg.callbacks.request_pin = on_request_pin;
        c.r.cfg.callbacks.poll_pins = on_poll_pins;
        c.r.cfg.callbacks.release_pin = on_release_pin;
        c.r.cfg.callbacks.cancel_pin_request = on_cancel_pin;
    }
    c.r.cfg.callbacks.resilience = on_resilience;
    static char kv_ep[256], kv_replay[256], kv_topic[256], kv_dram[256], kv_g3[256];
    unsigned kv_rank = 0, kv_positional = 0;
    const char *kv = getenv("KVCR_TEST_PEER_KV_EVENTS");
    int kv_n = kv ? sscanf(kv, "%255s %255s %255s %u %255s %255s %u", kv_ep, kv_replay, kv_topic,
                           &kv_rank, kv_dram, kv_g3, &kv_positional) : 0;
    if (kv_n >= 4) {
        c.r.cfg.kv_events.endpoint = kv_ep;
        c.r.cfg.kv_events.replay_endpoint = kv_replay;
        c.r.cfg.kv_events.topic = kv_topic;
        c.r.cfg.kv_events.dp_rank = kv_rank;
    }
    if (kv_n == 7) { /* the medium names and the form as well */
        c.r.cfg.kv_events.medium_dram = kv_dram;
        c.r.cfg.kv_events.medium_g3 = kv_g3;
        c.r.cfg.kv_events.legacy_positional = kv_positional != 0;
    }
    /* child is the rig's first member, so either pointer works as ud.
     * No cmocka assertion may fail in the child (it would carry on with the
     * parent's test run): every failure here is an exit code. */
    if (kvcr_create(&c.r.cfg, &c.r.kv) != 0) {
        fprintf(stderr, "peer: kvcr_create: %s\n", kvcr_last_error());
        _exit(4);
    }
    for (uint32_t i = 0; i < o->deposit_n; i++)
        if (!child_deposit(&c, i)) _exit(5);
    char ep[256] = {0}; /* all of it goes down the pipe */
    snprintf(ep, sizeof ep, "%s", kvcr_control_endpoint(c.r.kv));
    if (write(out, ep, sizeof ep) != (ssize_t)sizeof ep) _exit(3);
    for (;;) {
        struct pollfd fds[2] = {{cmd, POLLIN, 0}, {kvcr_fd(c.r.kv), POLLIN, 0}};
        poll(fds, 2, 5);
        child_poll(&c);
        deposit_more(&c);
        pull_more(&c);
        if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
        char op;
        if (read(cmd, &op, 1) != 1) op = PEER_CMD_STOP; /* the parent is gone */
        if (op == PEER_CMD_VERIFY) {
            uint32_t n;
            if (!read_u32(cmd, &n)) _exit(3);
            peer_verdict v = child_verify(&c, n);
            if (write(out, &v, sizeof v) != (ssize_t)sizeof v) _exit(3);
        } else if (op == PEER_CMD_DEPOSIT) {
            uint32_t first, n;
            if (!read_u32(cmd, &first) || !read_u32(cmd, &n) || first + n > c.r.fw_count) _exit(3);
            for (uint32_t i = first; i < first + n; i++) rig_pattern(&c.r, i, i);
            c.dep_next = first;
            c.dep_left = n;
        } else if (op == PEER_CMD_PULL) {
            pull_command(&c, cmd);
            pull_more(&c);
        } else if (op == PEER_CMD_PULL_STATS) {
            if (write(out, &c.pulled, sizeof c.pulled) != (ssize_t)sizeof c.pulled) _exit(3);
        } else if (op == PEER_CMD_COUNTERS) {
            c.counts.dropped_messages = kvcr__test_dropped_messages(c.r.kv);
            c.counts.inventory_added = (uint64_t)c.r.inventory_added;
            c.counts.writes_as_puts = (uint64_t)rig_stat(&c.r, "ucx_writes_as_puts", NULL);
            c.counts.writes_as_messages = (uint64_t)rig_stat(&c.r, "ucx_writes_as_messages", NULL);
            c.counts.endpoints_aborted = (uint64_t)rig_stat(&c.r, "ucx_endpoints_aborted", NULL);
            c.counts.tcp_resets = (uint64_t)rig_stat(&c.r, "ucx_tcp_connections_reset", NULL);
            if (write(out, &c.counts, sizeof c.counts) != (ssize_t)sizeof c.counts) _exit(3);
        } else {
            int rc = kvcr_close(c.r.kv);
            kvcr_free(c.r.kv);
            _exit(rc == 0 ? 0 : 6);
        }
    }
}

static unsigned long arg(char **argv, int i)
{
    char *end;
    unsigned long v = strtoul(argv[i], &end, 10);
    if (*end != '\0') {
        fprintf(stderr, "kvcr-test-peer: bad argument %d '%s'\n", i, argv[i]);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 14) {
        fprintf(stderr, "kvcr-test-peer: started by the tests (peer.c), not by hand\n");
        return 2;
    }
    peer_opts o = {.block_size = arg(argv, 1), .deposit_n = (uint32_t)arg(argv, 2),
                   .fw_n = (uint32_t)arg(argv, 3), .slots = (uint32_t)arg(argv, 4),
                   .pins = arg(argv, 5) != 0, .hold_pins = arg(argv, 6) != 0,
                   .port = (uint16_t)arg(argv, 7), .op_timeout_ms = (uint32_t)arg(argv, 8),
                   .abandon_timeout_ms = (uint32_t)arg(argv, 9),
                   .service = strcmp(argv[10], "-") ? argv[10] : NULL,
                   .guard_index = (uint32_t)arg(argv, 11),
                   .digest = strcmp(argv[12], "-") ? argv[12] : NULL,
                   .g3_path = strcmp(argv[13], "-") ? argv[13] : NULL,
                   .host = getenv("KVCR_TEST_PEER_HOST")};
    int in = 0, out = 1;
    const char *fds = getenv("KVCR_TEST_PEER_FDS");
    if (fds && sscanf(fds, "%d %d", &in, &out) != 2) {
        fprintf(stderr, "kvcr-test-peer: bad KVCR_TEST_PEER_FDS '%s'\n", fds);
        return 2;
    }
    child_main(&o, in, out);
}
