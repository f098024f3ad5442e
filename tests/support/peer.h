/* Peers for the peer-to-peer tests: each is a real child process running
 * its own KVCR instance with the remote tier on 127.0.0.1, driven through
 * a pipe. Keys are "k<number>" and their router hash is the number
 * (tool_key_hash, tools/tool_util.h, is the key adapter both sides use); block "k<i>" always
 * holds fill_pattern(seed i), so any side can check any block's bytes.
 *
 * Peers are separate programs (kvcr-test-peer) started with posix_spawn,
 * so a test may start them at any time, also after its own instance. */
#ifndef KVCR_TEST_PEER_H
#define KVCR_TEST_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"
#include "tool_util.h"

enum { PEER_CMD_COUNTERS = 'c', PEER_CMD_STOP = 's', PEER_CMD_VERIFY = 'v', PEER_CMD_DEPOSIT = 'd' };
enum { PEER_CMD_PULL = 'p', PEER_CMD_PULL_STATS = 'P' };

typedef struct peer_opts {
    size_t block_size;
    uint32_t deposit_n;   /* keys k0..k<n-1> deposited into its KVCR DRAM at start */
    uint32_t fw_n;        /* framework blocks 0..n-1 hold k0..k<n-1> (served through pins) */
    uint32_t slots;       /* KVCR DRAM slots (0: no KVCR DRAM) */
    bool pins;            /* answer request_pin from its framework blocks */
    bool hold_pins;       /* take pin requests but never answer them */
    uint16_t port;        /* 0: any free port */
    uint32_t op_timeout_ms, abandon_timeout_ms;
    /* Guard mode: KVCR DRAM from this service's group (slots then unused). */
    const char *service;  /* claim socket path, or NULL */
    uint32_t guard_index;
    const char *digest;
    /* G3 on this slot file (capacity PEER_G3_SLOTS blocks), or NULL. */
    const char *g3_path;
    /* Its agent name (NULL: "peer"); targets of one source need their own. */
    const char *agent;
    /* The IPv4 address its control endpoint binds and advertises (NULL:
     * 127.0.0.1), e.g. a netns rig host's (tools/netrig.h). */
    const char *host;
    /* KV events: "<endpoint> <replay endpoint> <topic> <dp rank>", optionally
     * followed by "<medium_dram> <medium_g3> <positional 0|1>" (NULL: none). */
    const char *kv_events;
} peer_opts;

enum { PEER_G3_SLOTS = 1024 };

typedef struct peer_counts {
    uint64_t pin_requests, pinned_keys, pin_releases, pin_cancels;
    uint64_t dropped_messages;
    uint64_t resilience_events;
    uint64_t deposits_done;   /* blocks deposited and committed */
    uint64_t inventory_added; /* keys announced by inventory events (G2 or G3 added) */
    /* As a source: UCX writes sent as puts + flush, and as messages (the
     * gauges ucx_writes_as_puts and ucx_writes_as_messages). */
    uint64_t writes_as_puts, writes_as_messages;
    /* endpoints it closed by force, and the TCP connections those reset
     * (gauges ucx_endpoints_aborted and ucx_tcp_connections_reset) */
    uint64_t endpoints_aborted, tcp_resets;
} peer_counts;

/* What PEER_CMD_VERIFY found among k0..k<n-1>: how many are HIT in KVCR
 * DRAM, how many FETCHABLE from G3, and how many of either delivered back
 * with the right bytes. */
typedef struct peer_verdict {
    uint32_t hits, in_g3, good;
} peer_verdict;

typedef struct peer {
    pid_t pid;
    int to_child, from_child;
    char endpoint[256];
} peer;

void peer_opts_init(peer_opts *o);
/* Starts a peer and waits until its instance is up (bounded: 20 s). */
void peer_spawn(peer *p, const peer_opts *o);
/* Starts a program: argv and envp as for execve, with the peer's ends of
 * its pipes open (not close-on-exec) in this process at the descriptors the
 * environment names. Its pid, or -1. */
typedef pid_t (*peer_launcher)(void *ud, char *const argv[], char *const envp[]);
/* peer_spawn through launch (e.g. netrig_spawn inside a rig host) instead
 * of posix_spawn here. */
void peer_spawn_with(peer *p, const peer_opts *o, peer_launcher launch, void *ud);
/* The same with the default options but for deposit_n: a source holding
 * k0..k<deposit_n - 1> in its KVCR DRAM. */
void peer_spawn_source(peer *p, uint32_t deposit_n);
void peer_counters(peer *p, peer_counts *out);
/* Asks the peer to check k0..k<n-1> in its own KVCR (n <= its fw_n). */
peer_verdict peer_verify(peer *p, uint32_t n);
/* Asks the peer to deposit k<first>..k<first+n-1>, 16 at a time, without
 * waiting (deposits_done counts the committed ones). */
void peer_deposit_async(peer *p, uint32_t first, uint32_t n);
/* Kills with SIGKILL and reaps. */
void peer_kill(peer *p);
/* SIGSTOP, and returns once every thread of the process has stopped: a
 * stop is asynchronous, and under load the threads of a multi-threaded
 * process go on running until one of them is scheduled to start the group
 * stop (milliseconds later) — long enough to take a message sent after
 * kill() returned. Fails the test if the stop is not reported in 10 s. */
void peer_freeze(peer *p);
/* Closes its instance cleanly, reaps, and checks it exited 0. */
void peer_stop(peer *p);

/* PEER_CMD_PULL: the peer, as a target, delivers keys of source into its
 * framework blocks, one operation (its own request and hint) per
 * keys_per_op keys, at most depth at a time: operation n pulls
 * k<first + (n * keys_per_op) % span> and the next keys_per_op - 1. A
 * command adds n_ops operations to those left; none starts after max_ms. */
enum { PEER_PULL_MAX_KEYS = 16, PEER_PULL_MAX_DEPTH = 64 };

typedef struct peer_pull {
    char source[256];
    uint32_t first, span, keys_per_op, depth, n_ops, max_ms;
} peer_pull;

/* What the pulls came to so far. Every SUCCESS entry's bytes are checked
 * (bad_bytes counts those that differ); a FAILED entry counts as busy when
 * its reason is SOURCE_BUSY, else as other (other_reason: the last one). */
typedef struct peer_pull_stats {
    uint64_t started, done, ok_ops, busy_ops;
    uint64_t ok_entries, busy_entries, other_entries, bad_bytes;
    uint32_t other_reason;
    uint32_t idle; /* nothing in flight and nothing left to start */
} peer_pull_stats;

void peer_pull_start(peer *p, const peer_pull *job);
peer_pull_stats peer_pull_stats_get(peer *p);

/* A free TCP port on 127.0.0.1 (for a restart at the same address). */
uint16_t peer_free_port(void);

/* A control endpoint's ZeroMQ address: the endpoint without "#lane=<port>",
 * for a test that speaks ZeroMQ to an instance (into buf). */
const char *peer_zmq_address(char *buf, size_t cap, const char *endpoint);

/* The port of an endpoint's control lane, 0 when it offers none. */
uint16_t peer_lane_port(const char *endpoint);

/* Bytes that arrived on the TCP connections accepted at an endpoint's
 * ports (ZeroMQ and lane) and that its process has not read yet: with that
 * process stopped (peer_freeze), what was sent to it since. */
uint64_t peer_unread_bytes(const char *endpoint);

/* "k<i>" into buf. */
const char *peer_key(char *buf, size_t cap, uint32_t i);
/* What a peer publishing KV events says of block "k<i>" at its deposit:
 * PEER_BLOCK_TOKENS tokens i * 1000 + t, the parent k<i-1> (none for k0),
 * LoRA "lora-peer", one extra key "salt-<i % 10>" (kept in buf). */
#define PEER_BLOCK_TOKENS 16
typedef struct peer_router_buf {
    uint32_t tokens[PEER_BLOCK_TOKENS];
    char salt[16];
    const char *extra[1];
} peer_router_buf;
void peer_router_block(uint32_t i, peer_router_buf *buf, kvcr_router_block *rb);
/* The kv_hint envelope naming source and the hashes. */
void peer_hint_json(char *buf, size_t cap, const char *source, const uint64_t *hashes, size_t n);

/* Submits a kv_hint naming source and hashes (or first..first+n-1) for
 * the request (NULL: eager metadata only); asserts it was accepted. */
void peer_hint_hashes(rig *r, const char *request, const char *source, const uint64_t *hashes,
                      size_t n);
void peer_hint_range(rig *r, const char *request, const char *source, uint32_t first, uint32_t n);

/* Delivers k<keys[i]> into framework block dst[i] for the request. */
kvcr_op_handle peer_deliver(rig *r, const uint32_t *keys, const size_t *dst, size_t n,
                            const char *request);
/* Delivers k<first..first+n-1> into framework blocks dst.. */
kvcr_op_handle peer_deliver_range(rig *r, uint32_t first, uint32_t n, size_t dst,
                                  const char *request);

/* Polls the peer's counters until done(counts) holds (bounded: 30 s, see peer.c). */
peer_counts peer_wait(peer *p, bool (*done)(const peer_counts *c));

/* A rig with the remote tier on (key adapter set); adjust, then rig_start. */
void rig_init_remote(rig *r, size_t block_size, size_t fw_count, size_t slots);

#endif
