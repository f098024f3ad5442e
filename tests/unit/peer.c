#include "peer.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { CMD_COUNTERS = 'c', CMD_STOP = 's' };

/* ---- shared ---------------------------------------------------------------- */

int peer_key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    (void)ud;
    if (key->len < 2 || key->len > 21 || key->data[0] != 'k') return -1;
    uint64_t x = 0;
    for (size_t i = 1; i < key->len; i++) {
        if (key->data[i] < '0' || key->data[i] > '9') return -1;
        x = x * 10 + (uint64_t)(key->data[i] - '0');
    }
    *hash = x;
    return 0;
}

const char *peer_key(char *buf, size_t cap, uint32_t i)
{
    snprintf(buf, cap, "k%u", i);
    return buf;
}

void peer_hint_json(char *buf, size_t cap, const char *source, const uint64_t *hashes, size_t n)
{
    size_t at = (size_t)snprintf(buf, cap,
                                 "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":"
                                 "\"kv.fetch\",\"action_version\":\"1.0\",\"payload\":{"
                                 "\"source_control_endpoint\":\"%s\",\"block_hashes\":[",
                                 source);
    for (size_t i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRIu64, i ? "," : "", hashes[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]}}]}");
}

void rig_init_remote(rig *r, size_t block_size, size_t fw_count, size_t slots)
{
    rig_init(r, block_size, fw_count, slots);
    if (slots == 0) r->cfg.n_local_dram = 0, r->cfg.local_dram = NULL;
    r->cfg.remote.enabled = true;
    r->cfg.remote.control_host = "127.0.0.1";
    r->cfg.callbacks.key_hash = peer_key_hash;
}

uint16_t peer_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

void peer_opts_init(peer_opts *o)
{
    memset(o, 0, sizeof *o);
    o->block_size = 4096;
    o->slots = 64;
    o->op_timeout_ms = 2000;
    o->abandon_timeout_ms = 4000;
}

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
} child;

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
        p->ok[i] = peer_key_hash(NULL, &keys[i], &h) == 0 && h < c->o.fw_n;
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

static void child_poll(child *c)
{
    kvcr_op_result *res;
    size_t n;
    if (kvcr_poll(c->r.kv, &res, &n) == 0) kvcr_results_free(res);
}

static _Noreturn void child_main(const peer_opts *o, int cmd, int out)
{
    static child c;
    c.o = *o;
    rig_init_remote(&c.r, o->block_size, o->fw_n ? o->fw_n : 1, o->slots);
    if (o->deposit_n > c.r.fw_count) {
        /* deposits come from framework blocks: make room */
        free(c.r.fw);
        c.r.fw_count = o->deposit_n;
        c.r.fw = aligned_alloc(64, o->block_size * o->deposit_n);
        c.r.region.addr = c.r.fw;
        c.r.region.count = o->deposit_n;
    }
    for (uint32_t i = 0; i < c.r.fw_count; i++) rig_pattern(&c.r, i, i);
    c.r.cfg.agent_name = "peer";
    c.r.cfg.remote.control_port = o->port;
    c.r.cfg.operation_timeout_ms = o->op_timeout_ms;
    c.r.cfg.abandon_timeout_ms = o->abandon_timeout_ms;
    c.r.cfg.callbacks.ud = &c.r; /* the rig's own callbacks take the rig */
    if (o->pins || o->hold_pins) {
        c.r.cfg.callbacks.request_pin = on_request_pin;
        c.r.cfg.callbacks.poll_pins = on_poll_pins;
        c.r.cfg.callbacks.release_pin = on_release_pin;
        c.r.cfg.callbacks.cancel_pin_request = on_cancel_pin;
    }
    c.r.cfg.callbacks.resilience = on_resilience;
    /* child is the rig's first member, so either pointer works as ud */
    rig_start(&c.r);
    for (uint32_t i = 0; i < o->deposit_n; i++) {
        char k[24];
        assert_int_equal(rig_deposit1(&c.r, peer_key(k, sizeof k, i), i, 0, NULL, NULL),
                         KVCR_ENTRY_SUCCESS);
    }
    if (o->deposit_n > c.r.fw_count || o->fw_n == 0)
        memset(c.r.fw, 0, c.r.fw_count * o->block_size); /* only KVCR DRAM has them now */
    char ep[256];
    snprintf(ep, sizeof ep, "%s", kvcr_control_endpoint(c.r.kv));
    if (write(out, ep, sizeof ep) != (ssize_t)sizeof ep) _exit(3);
    for (;;) {
        struct pollfd fds[2] = {{cmd, POLLIN, 0}, {kvcr_fd(c.r.kv), POLLIN, 0}};
        poll(fds, 2, 5);
        child_poll(&c);
        if (!(fds[0].revents & (POLLIN | POLLHUP))) continue;
        char op;
        if (read(cmd, &op, 1) != 1) op = CMD_STOP; /* the parent is gone */
        if (op == CMD_COUNTERS) {
            c.counts.dropped_messages = kvcr__test_dropped_messages(c.r.kv);
            if (write(out, &c.counts, sizeof c.counts) != (ssize_t)sizeof c.counts) _exit(3);
        } else {
            rig_stop(&c.r);
            _exit(0);
        }
    }
}

/* ---- the parent side ------------------------------------------------------- */

static bool read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, timeout_ms) <= 0) return false;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return true;
}

void peer_spawn(peer *p, const peer_opts *o)
{
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    fflush(NULL);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        close(down[1]);
        close(up[0]);
        child_main(o, down[0], up[1]);
    }
    close(down[0]);
    close(up[1]);
    p->to_child = down[1];
    p->from_child = up[0];
    if (!read_full(p->from_child, p->endpoint, sizeof p->endpoint, 20000)) {
        peer_kill(p);
        fail_msg("the peer process did not start");
    }
}

void peer_counters(peer *p, peer_counts *out)
{
    char op = CMD_COUNTERS;
    assert_int_equal(write(p->to_child, &op, 1), 1);
    assert_true(read_full(p->from_child, out, sizeof *out, 10000));
}

static void reap(peer *p)
{
    close(p->to_child);
    close(p->from_child);
    p->pid = 0;
}

void peer_kill(peer *p)
{
    if (p->pid <= 0) return;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    reap(p);
}

void peer_stop(peer *p)
{
    char op = CMD_STOP;
    assert_int_equal(write(p->to_child, &op, 1), 1);
    int status = 0;
    /* bounded: the child closes within its abandon timeout */
    for (int i = 0; i < 3000; i++) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            reap(p);
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 0);
            return;
        }
        usleep(10000);
    }
    peer_kill(p);
    fail_msg("the peer process did not stop within 30 s");
}
