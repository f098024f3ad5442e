/* Shared pieces of `kvcr demo`: a workload driver, a KV-aware router and
 * N engine processes on one machine, talking over pipes.
 *
 *   driver --REQ--> router --REQ + kv_hint--> engine i
 *   engine i --HELLO, INV, DONE--> router --READY, DONE--> driver
 *
 * Every process is forked by the driver before any KVCR (or UCX)
 * initialisation anywhere; only the engines create a KVCR instance. Blocks
 * are named by prefix hashes (hash_i = H(hash_{i-1}, chunk i)); a block's
 * key is the 8 bytes of its hash and its bytes are a deterministic function
 * of the hash, so any process can verify any block. */
#ifndef KVCR_TOOLS_DEMO_H
#define KVCR_TOOLS_DEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    DEMO_MAX_ENGINES = 16,
    DEMO_MAX_BLOCKS = 64,     /* blocks per request = the engine's "GPU KV buffer" */
    DEMO_MSG_MAX = 64 * 1024, /* largest message on any pipe */
    DEMO_ENDPOINT_MAX = 256,
    DEMO_REASONS = 16 /* > every kvcr_reason */
};

typedef struct demo_opts {
    int engines;
    size_t block_size;
    int requests;
    int conversations;
    int in_flight;       /* requests in flight at once; 0: one per engine */
    int system_blocks;   /* the shared system prompt */
    int slots;           /* KVCR DRAM slots per engine */
    double prefill_ms;   /* modelled prefill cost of one block */
    double time_limit_s; /* the whole run, wall clock */
    uint64_t seed;
    bool quick, json, local_only;
} demo_opts;

/* Message types. Payloads are the structs below (one binary, so one layout)
 * followed by variable parts. */
enum demo_msg_type {
    MSG_HELLO = 1, /* engine -> router: demo_hello */
    MSG_READY,     /* router -> driver: no payload */
    MSG_REQ,       /* driver -> router: demo_req + hashes; router -> engine: + hint JSON */
    MSG_INV,       /* engine -> router: demo_inv + hashes */
    MSG_DONE,      /* engine -> router -> driver: demo_result */
    MSG_STOP,      /* driver -> router -> engines: no payload */
    MSG_FATAL      /* router -> driver: text */
};

typedef struct demo_hello {
    int32_t engine;
    char endpoint[DEMO_ENDPOINT_MAX]; /* "" without the peer tier */
} demo_hello;

typedef struct demo_req {
    uint32_t req_no;
    int32_t source; /* engine the hint names, -1: none (set by the router) */
    uint32_t n_blocks;
    uint32_t hint_len; /* bytes of hint JSON after the hashes (router -> engine) */
} demo_req;

typedef struct demo_inv {
    int32_t engine;
    uint32_t removed;
    uint32_t n;
} demo_inv;

/* One request's outcome, measured by the engine that served it. */
typedef struct demo_result {
    uint32_t req_no;
    int32_t engine, source;
    uint32_t n_blocks;
    uint32_t local_hit, remote_hit, recomputed;
    uint32_t remote_failed;            /* FETCHABLE but the pull failed: recomputed */
    uint32_t local_failed;             /* HIT but the deliver failed: recomputed */
    uint32_t hint_refused;             /* kvcr_submit_hint refused the router's hint */
    uint32_t why_failed[DEMO_REASONS]; /* failed delivers by kvcr_reason */
    uint32_t deposited, deposit_not_stored;
    uint32_t resilience; /* uncertain / stalled transfer events seen by the engine */
    uint64_t verified_blocks, wrong_bytes;
    uint64_t peer_bytes;
    double peer_t0; /* demo_now() (CLOCK_MONOTONIC, host-wide) at its submit */
    double peer_s;  /* submit to completion of the peer deliver */
    double local_s; /* same for the local deliver */
    double wall_s;  /* the whole request inside the engine */
} demo_result;

/* Sums of demo_result over requests (the whole cluster, or one engine). */
typedef struct totals {
    uint64_t requests, blocks, local, remote, recomputed, remote_failed, local_failed;
    uint64_t hinted, hint_refused, deposited, not_stored, verified, wrong, peer_bytes;
    uint64_t resilience;
    uint64_t why_failed[DEMO_REASONS];
    double peer_s, local_s;
    double (*pulls)[2]; /* [start, end] of every pull (the cluster totals only) */
    size_t n_pulls;
} totals;

/* ---- demo_common.c ---------------------------------------------------------- */

double demo_now(void);
uint64_t demo_mix(uint64_t x);
/* hash_i from hash_{i-1} and chunk i's content id. */
uint64_t demo_chain(uint64_t prev, uint64_t chunk);
uint64_t demo_rand(uint64_t *state);
/* A block's bytes: xorshift64 words seeded by its hash (size % 8 == 0). */
void demo_fill(uint8_t *p, size_t size, uint64_t hash);
/* Bytes of p that differ from demo_fill(hash). */
uint64_t demo_verify(const uint8_t *p, size_t size, uint64_t hash);

/* Writes one message (header + two parts); 0 or -1 (peer gone, errno). */
int demo_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen);
/* Reads one message into buf (cap bytes), waiting at most until deadline
 * (demo_now seconds). 0, or -1 with errno: EPIPE at end of file, ETIMEDOUT,
 * EMSGSIZE for a message larger than cap. */
int demo_recv(int fd, uint32_t *type, void *buf, size_t cap, size_t *len, double deadline);

/* Child processes: die with the driver, ignore SIGPIPE (writes fail). */
void demo_child_setup(int driver_pid);

/* ---- demo_report.c: the figures ----------------------------------------------- */

void demo_add(totals *t, const demo_result *r);
/* A progress line on stderr (redrawn on a terminal, every 10% otherwise). */
void demo_progress(const demo_opts *o, const totals *t, bool last);
/* The final table, or one JSON object with --json. Sorts t->pulls. */
void demo_report(const demo_opts *o, totals *t, const totals *per, int started, double wall);
/* "256 KiB", or "1000 B" when not a whole number of KiB (a static buffer). */
const char *demo_size_text(size_t bytes);

/* ---- the processes --------------------------------------------------------- */

/* Each returns the process's exit status. */
int demo_engine_main(const demo_opts *o, int engine, int from_router, int to_router,
                     double deadline);
int demo_router_main(const demo_opts *o, int from_driver, int to_driver, const int *from_engine,
                     const int *to_engine, double deadline);

int cmd_demo(int argc, char **argv);

#endif
