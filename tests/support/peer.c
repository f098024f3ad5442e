#define _GNU_SOURCE /* pipe2 */
#include "peer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- shared ---------------------------------------------------------------- */

const char *peer_key(char *buf, size_t cap, uint32_t i)
{
    snprintf(buf, cap, "k%u", i);
    return buf;
}

void peer_router_block(uint32_t i, peer_router_buf *buf, kvcr_router_block *rb)
{
    for (uint32_t t = 0; t < PEER_BLOCK_TOKENS; t++) buf->tokens[t] = i * 1000 + t;
    snprintf(buf->salt, sizeof buf->salt, "salt-%u", i % 10);
    buf->extra[0] = buf->salt;
    *rb = (kvcr_router_block){.has_parent = i > 0, .parent_hash = i > 0 ? i - 1 : 0,
                              .token_ids = buf->tokens, .block_size_tokens = PEER_BLOCK_TOKENS,
                              .lora_name = "lora-peer", .extra_keys = buf->extra,
                              .n_extra_keys = 1};
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

void peer_hint_hashes(rig *r, const char *request, const char *source, const uint64_t *hashes,
                      size_t n)
{
    char json[8192];
    peer_hint_json(json, sizeof json, source, hashes, n);
    int rc = kvcr_submit_hint(r->kv, request, json, strlen(json));
    if (rc != 0) fprintf(stderr, "submit_hint: %s\n", kvcr_last_error());
    assert_int_equal(rc, 0);
}

void peer_hint_range(rig *r, const char *request, const char *source, uint32_t first, uint32_t n)
{
    uint64_t hashes[256];
    assert_true(n <= 256);
    for (uint32_t i = 0; i < n; i++) hashes[i] = first + i;
    peer_hint_hashes(r, request, source, hashes, n);
}

kvcr_op_handle peer_deliver(rig *r, const uint32_t *keys, const size_t *dst, size_t n,
                            const char *request)
{
    char names[64][24];
    kvcr_block b[64];
    kvcr_mem_ref refs[64];
    assert_true(n <= 64);
    /* The label lives only as long as the call, as a caller's may: a pull
     * that kept it would read freed memory (ASan and valgrind say so). */
    char *label = strdup("");
    assert_non_null(label);
    for (size_t i = 0; i < n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, label, dst[i]};
        b[i] = (kvcr_block){key_of(peer_key(names[i], sizeof names[i], keys[i])), &refs[i], 1};
    }
    kvcr_op_handle op;
    int rc = kvcr_deliver(r->kv, b, n, request, &op);
    free(label);
    if (rc != 0) fprintf(stderr, "deliver: %s\n", kvcr_last_error());
    assert_int_equal(rc, 0);
    return op;
}

kvcr_op_handle peer_deliver_range(rig *r, uint32_t first, uint32_t n, size_t dst,
                                  const char *request)
{
    uint32_t keys[64];
    size_t at[64];
    assert_true(n <= 64);
    for (uint32_t i = 0; i < n; i++) keys[i] = first + i, at[i] = dst + i;
    return peer_deliver(r, keys, at, n, request);
}

/* 30 s: a bound on a wait, never a measure of speed (under valgrind on a
 * loaded machine each counters round trip and each step of the peer take
 * far longer than natively). */
#define PEER_WAIT_MS 30000

peer_counts peer_wait(peer *p, bool (*done)(const peer_counts *c))
{
    peer_counts c = {0};
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int spin = 0; spin < 10 * PEER_WAIT_MS; spin++) {
        peer_counters(p, &c);
        if (done(&c)) return c;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 > PEER_WAIT_MS)
            break;
        usleep(1000);
    }
    fail_msg("the peer's counters did not reach the expected state within %d s",
             PEER_WAIT_MS / 1000);
    return c;
}

void rig_init_remote(rig *r, size_t block_size, size_t fw_count, size_t slots)
{
    rig_init(r, block_size, fw_count, slots);
    if (slots == 0) r->cfg.n_local_dram = 0, r->cfg.local_dram = NULL;
    tool_remote_peer(&r->cfg);
    /* These tests pin what a transfer moves, not when it gives up: the
     * library's 1 s default is too short for a first transfer under valgrind
     * on a loaded 2-core runner (UCX endpoint set-up alone can take it). Tests
     * of deadlines set their own. */
    r->cfg.operation_timeout_ms = 5000;
    r->cfg.abandon_timeout_ms = 10000;
}

const char *peer_zmq_address(char *buf, size_t cap, const char *endpoint)
{
    const char *lane = strstr(endpoint, "#lane=");
    snprintf(buf, cap, "%.*s", lane ? (int)(lane - endpoint) : (int)strlen(endpoint), endpoint);
    return buf;
}

uint16_t peer_lane_port(const char *endpoint)
{
    const char *lane = strstr(endpoint, "#lane=");
    return lane ? (uint16_t)atoi(lane + strlen("#lane=")) : 0;
}

/* The receive queues of the established sockets bound to port, from one
 * table of /proc/net (tcp or tcp6). */
static uint64_t unread_at(const char *table, uint16_t port)
{
    FILE *f = fopen(table, "r");
    if (f == NULL) return 0; /* no IPv6 here */
    char line[512];
    uint64_t sum = 0;
    while (fgets(line, sizeof line, f)) {
        char local[64];
        unsigned st;
        unsigned long tx, rx;
        /* "sl: local rem st tx_queue:rx_queue ..."; the header line fails */
        if (sscanf(line, " %*s %63s %*s %x %lx:%lx", local, &st, &tx, &rx) != 4) continue;
        const char *colon = strrchr(local, ':');
        if (st == 1 /* ESTABLISHED */ && colon && strtoul(colon + 1, NULL, 16) == port) sum += rx;
    }
    fclose(f);
    return sum;
}

uint64_t peer_unread_bytes(const char *endpoint)
{
    char zmq[256];
    snprintf(zmq, sizeof zmq, "%s", endpoint);
    zmq[strcspn(zmq, "#")] = '\0'; /* the options, whose keys may hold ':' */
    const char *colon = strrchr(zmq, ':');
    assert_non_null(colon);
    uint16_t ports[2] = {(uint16_t)atoi(colon + 1), peer_lane_port(endpoint)};
    uint64_t sum = 0;
    for (int i = 0; i < 2; i++)
        if (ports[i] != 0)
            sum += unread_at("/proc/net/tcp", ports[i]) + unread_at("/proc/net/tcp6", ports[i]);
    return sum;
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

/* ---- the parent side ------------------------------------------------------- */


/* The environment of a peer: ours, plus its agent name (KVCR_TEST_PEER_AGENT),
 * its address (KVCR_TEST_PEER_HOST), its KV events (KVCR_TEST_PEER_KV_EVENTS)
 * and its pipes' descriptors when they are not 0 and 1 (KVCR_TEST_PEER_FDS,
 * "<in> <out>"), each when it has one; the array is the caller's to free. */
static char **peer_env(char **base, const peer_opts *o, int in, int out)
{
    static char vars[4][600];
    size_t n = 0;
    while (base[n]) n++;
    char **env = calloc(n + 5, sizeof *env);
    assert_non_null(env);
    size_t k = 0;
    if (o->agent != NULL) {
        snprintf(vars[0], sizeof vars[0], "KVCR_TEST_PEER_AGENT=%s", o->agent);
        env[k++] = vars[0];
    }
    if (o->host != NULL) {
        snprintf(vars[1], sizeof vars[1], "KVCR_TEST_PEER_HOST=%s", o->host);
        env[k++] = vars[1];
    }
    if (in != 0 || out != 1) {
        snprintf(vars[2], sizeof vars[2], "KVCR_TEST_PEER_FDS=%d %d", in, out);
        env[k++] = vars[2];
    }
    if (o->kv_events != NULL) {
        snprintf(vars[3], sizeof vars[3], "KVCR_TEST_PEER_KV_EVENTS=%s", o->kv_events);
        env[k++] = vars[3];
    }
    for (size_t i = 0; i < n; i++)
        if (strncmp(base[i], "KVCR_TEST_PEER_", 15) != 0) env[k++] = base[i];
    return env;
}

/* The peer's arguments (see peer-main.c) into args, argv pointing at them. */
static void peer_args(const peer_opts *o, char args[13][300], char *argv[15])
{
    snprintf(args[0], 300, "%zu", o->block_size);
    snprintf(args[1], 300, "%u", o->deposit_n);
    snprintf(args[2], 300, "%u", o->fw_n);
    snprintf(args[3], 300, "%u", o->slots);
    snprintf(args[4], 300, "%d", o->pins);
    snprintf(args[5], 300, "%d", o->hold_pins);
    snprintf(args[6], 300, "%u", o->port);
    snprintf(args[7], 300, "%u", o->op_timeout_ms);
    snprintf(args[8], 300, "%u", o->abandon_timeout_ms);
    snprintf(args[9], 300, "%s", o->service ? o->service : "-");
    snprintf(args[10], 300, "%u", o->guard_index);
    snprintf(args[11], 300, "%s", o->digest ? o->digest : "-");
    snprintf(args[12], 300, "%s", o->g3_path ? o->g3_path : "-");
    argv[0] = KVCR_TEST_PEER;
    for (int i = 0; i < 13; i++) argv[i + 1] = args[i];
    argv[14] = NULL;
}

/* The peer at pid was started with the ends down[0] and up[1]: closes them
 * here and waits (bounded: 20 s) for its endpoint. */
static void peer_started(peer *p, pid_t pid, int down[2], int up[2])
{
    close(down[0]);
    close(up[1]);
    p->pid = pid;
    p->to_child = down[1];
    p->from_child = up[0];
    if (tool_read_full(p->from_child, p->endpoint, sizeof p->endpoint, tool_now() + 20) != 0) {
        peer_kill(p);
        fail_msg("the peer process did not start");
    }
}

/* The peer runs in its own program (kvcr-test-peer), started with
 * posix_spawn: no fork handlers run in this multi-threaded process (UCX's
 * would touch locks its threads hold) and nothing of this process's UCX
 * state reaches the child. */
void peer_spawn(peer *p, const peer_opts *o)
{
    int down[2], up[2];
    assert_int_equal(pipe2(down, O_CLOEXEC), 0);
    assert_int_equal(pipe2(up, O_CLOEXEC), 0);
    char args[13][300], *argv[15];
    peer_args(o, args, argv);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, down[0], 0); /* dup2 clears close-on-exec */
    posix_spawn_file_actions_adddup2(&fa, up[1], 1);
    extern char **environ;
    char **env = peer_env(environ, o, 0, 1);
    pid_t pid;
    int rc = posix_spawn(&pid, KVCR_TEST_PEER, &fa, NULL, argv, env);
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) close(down[1]), close(up[0]);
    assert_int_equal(rc, 0);
    peer_started(p, pid, down, up);
}

void peer_spawn_with(peer *p, const peer_opts *o, peer_launcher launch, void *ud)
{
    int down[2], up[2];
    assert_int_equal(pipe2(down, O_CLOEXEC), 0);
    assert_int_equal(pipe2(up, O_CLOEXEC), 0);
    /* Only the peer's ends cross the exec; the others stay close-on-exec. */
    assert_int_equal(fcntl(down[0], F_SETFD, 0), 0);
    assert_int_equal(fcntl(up[1], F_SETFD, 0), 0);
    char args[13][300], *argv[15];
    peer_args(o, args, argv);
    extern char **environ;
    char **env = peer_env(environ, o, down[0], up[1]);
    pid_t pid = launch(ud, argv, env);
    free(env);
    if (pid < 0) close(down[0]), close(up[1]), close(down[1]), close(up[0]);
    assert_true(pid > 0);
    peer_started(p, pid, down, up);
}

void peer_spawn_source(peer *p, uint32_t deposit_n)
{
    peer_opts o;
    peer_opts_init(&o);
    o.deposit_n = deposit_n;
    peer_spawn(p, &o);
}

void peer_counters(peer *p, peer_counts *out)
{
    char op = PEER_CMD_COUNTERS;
    assert_int_equal(write(p->to_child, &op, 1), 1);
    assert_int_equal(tool_read_full(p->from_child, out, sizeof *out, tool_now() + 10), 0);
}

peer_verdict peer_verify(peer *p, uint32_t n)
{
    char op[5] = {PEER_CMD_VERIFY};
    memcpy(op + 1, &n, 4);
    assert_int_equal(write(p->to_child, op, 5), 5);
    peer_verdict v;
    assert_int_equal(tool_read_full(p->from_child, &v, sizeof v, tool_now() + 20), 0);
    return v;
}

void peer_deposit_async(peer *p, uint32_t first, uint32_t n)
{
    char op[9] = {PEER_CMD_DEPOSIT};
    memcpy(op + 1, &first, 4);
    memcpy(op + 5, &n, 4);
    assert_int_equal(write(p->to_child, op, 9), 9);
}

void peer_pull_start(peer *p, const peer_pull *job)
{
    char op = PEER_CMD_PULL;
    assert_int_equal(write(p->to_child, &op, 1), 1);
    assert_int_equal(write(p->to_child, job, sizeof *job), (ssize_t)sizeof *job);
}

peer_pull_stats peer_pull_stats_get(peer *p)
{
    char op = PEER_CMD_PULL_STATS;
    assert_int_equal(write(p->to_child, &op, 1), 1);
    peer_pull_stats st;
    assert_int_equal(tool_read_full(p->from_child, &st, sizeof st, tool_now() + 10), 0);
    return st;
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

void peer_freeze(peer *p)
{
    assert_true(p->pid > 0);
    assert_int_equal(kill(p->pid, SIGSTOP), 0);
    int status = 0;
    for (int i = 0; i < 1000; i++) { /* the parent hears of a stop once the group has stopped */
        pid_t w = waitpid(p->pid, &status, WNOHANG | WUNTRACED);
        if (w == p->pid && WIFSTOPPED(status)) return;
        assert_int_equal(w, 0);
        usleep(10000);
    }
    fail_msg("the peer process did not stop within 10 s of SIGSTOP");
}

void peer_stop(peer *p)
{
    char op = PEER_CMD_STOP;
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
