/* Shared pieces of `kvcr demo`: a workload driver, a KV-aware router and
 * N engine processes on one machine, talking over pipes (--hosts: each
 * process on a netns rig host of its own, the pipes unchanged, KVCR's peer
 * traffic between the engines crossing the rig's links).
 *
 *   driver --REQ--> router --REQ + kv_hint--> engine i
 *   engine i --HELLO, DONE--> router --READY, DONE--> driver
 *   engine i's KVCR --KV events (ZeroMQ, vLLM's wire format)--> router
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
#include <sys/types.h>
#include <zmq.h>

#include "kvcr/stats.h"
#include "tool_util.h" /* tool_now, whole reads and writes */

enum {
    DEMO_MAX_ENGINES = 16,
    DEMO_MAX_BLOCKS = 64,     /* blocks per request = the engine's "GPU KV buffer" */
    DEMO_MSG_MAX = 64 * 1024, /* largest message on any pipe */
    DEMO_ENDPOINT_MAX = 256,
    DEMO_REASONS = 16, /* > every kvcr_reason */
    DEMO_HELD_MAX = 1100 /* requests held by one engine at once: > --in-flight + probes */
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
    /* --chaos: every engine in guard mode on the driver's KVCR service, with
     * its own G3 slot file, while the driver kills, stops, corrupts and
     * fills (demo_chaos.c). The workload runs for duration_s seconds. */
    bool chaos;
    double duration_s;
    unsigned faults;            /* the kinds that run: bit (1 << enum demo_fault) */
    int g3_slots;               /* G3 slots per engine */
    const char *service_socket; /* set by demo_chaos_start */
    const char *g3_dir;         /* set by demo_chaos_start */
    const char *digest;         /* the service's compatibility digest */
    /* --curve: CURVE on every engine's control channel. The driver makes a
     * key pair per engine before forking; every engine allows all of the
     * engines' public keys (its own is never dialled). */
    bool curve;
    char curve_public[DEMO_MAX_ENGINES][41], curve_secret[DEMO_MAX_ENGINES][41];
    /* --hosts: the router on netns rig host 0 and engine e on host e + 1
     * (tools/netrig.h), each engine's peer tier bound to and advertised on
     * its host's address; 0: every process on this host, on 127.0.0.1. */
    int hosts;
    char engine_addr[DEMO_MAX_ENGINES][16]; /* set by the driver with the rig */
    /* KV events: engine e's KVCR publishes on kv_pub_port[e] (bound: the
     * router and any other subscriber connect) and answers replay on
     * kv_replay_port[e] (--kv-events-port P: P + e and P + 100 + e;
     * without it, free ports the driver picks). */
    int kv_events_port;
    uint16_t kv_pub_port[DEMO_MAX_ENGINES], kv_replay_port[DEMO_MAX_ENGINES];
} demo_opts;

/* Message types. Payloads are the structs below (one binary, so one layout)
 * followed by variable parts. */
enum demo_msg_type {
    MSG_HELLO = 1, /* engine -> router: demo_hello */
    MSG_READY,     /* router -> driver: no payload */
    MSG_REQ,       /* driver -> router: demo_req + hashes; router -> engine: + hint JSON */
    MSG_DONE,      /* engine -> router: demo_result + hashes; router -> driver: demo_result */
    MSG_STOP,      /* driver -> router -> engines: no payload */
    MSG_FATAL,     /* router -> driver: text */
    MSG_BYE,       /* engine -> router -> driver after STOP: demo_bye */
    MSG_DISK       /* driver -> router -> every engine: demo_disk */
};

typedef struct demo_hello {
    int32_t engine;
    uint32_t recovered_g2, recovered_g3; /* blocks found at start (guard mode, G3 files) */
    char endpoint[DEMO_ENDPOINT_MAX];    /* "" without the peer tier */
} demo_hello;

typedef struct demo_req {
    uint32_t req_no;
    int32_t source; /* engine the hint names, -1: none (set by the router) */
    uint32_t n_blocks;
    uint32_t hint_len; /* bytes of hint JSON after the hashes (router -> engine) */
    int32_t target;    /* driver: the engine that must serve it, -1: the router picks */
    uint32_t flags;    /* router -> engine: DEMO_REQ_* */
} demo_req;

/* The hinted source is dead: its Guard serves its blocks. */
#define DEMO_REQ_SOURCE_DOWN 0x1u

/* Why a request got no answer from an engine (demo_result.failed). */
enum demo_fail { DEMO_FAIL_NONE = 0, DEMO_FAIL_ENGINE_DIED, DEMO_FAIL_NO_ENGINE, DEMO_FAILS };

/* One request's outcome, measured by the engine that served it. */
typedef struct demo_result {
    uint32_t req_no;
    int32_t engine, source;
    uint32_t n_blocks;
    int32_t failed; /* enum demo_fail: set by the router, nothing else is */
    uint32_t local_hit, remote_hit, recomputed;
    uint32_t g3_hit;    /* of local_hit: read from the engine's G3 file */
    uint32_t guard_hit; /* of remote_hit: served by a dead engine's Guard */
    uint32_t remote_failed;            /* FETCHABLE but the pull failed: recomputed */
    uint32_t local_failed;             /* HIT but the deliver failed: recomputed */
    uint32_t hint_refused;             /* kvcr_submit_hint refused the router's hint */
    uint32_t why_failed[DEMO_REASONS]; /* failed delivers by kvcr_reason */
    uint32_t deposited, deposit_not_stored;
    uint32_t resilience; /* uncertain / stalled transfer events seen by the engine */
    uint64_t verified_blocks, wrong_bytes;
    uint64_t peer_bytes;
    double peer_t0; /* tool_now() (CLOCK_MONOTONIC, host-wide) at its submit */
    double peer_s;  /* submit to completion of the peer deliver */
    double local_s; /* same for the local deliver */
    double wall_s;  /* the whole request inside the engine */
    double slowest_op_s; /* its longest KVCR operation, submit to result */
    uint32_t slow_ops;   /* operations longer than DEMO_SLOW_OP_S */
    /* Bit i: block i is in the engine's KVCR DRAM after the request (a
     * DRAM hit, or stored by its deposit), so its KV events announce it.
     * engine -> router only: the router holds the answer back (bounded)
     * until its index has heard of these blocks, then sends the driver the
     * result alone. */
    uint64_t held;
} demo_result;

/* An operation this slow outlived even the engines' abandon timeout (10 s). */
#define DEMO_SLOW_OP_S 12.0

/* Where pulls' time went, as their KVCR measured it: the parts' durations
 * (kvcr/stats.h, KVCR_PULL_PART_SCOPES) summed over the pulls they split. */
typedef struct demo_split {
    uint64_t pulls;
    double part_s[KVCR_PULL_PARTS];
} demo_split;

/* An engine's state after the drain, before it closes (kvcr_stats gauges):
 * anything non-zero is a leak. And its pulls' split, taken from every
 * snapshot of its run. */
typedef struct demo_bye {
    int32_t engine;
    uint32_t slots;  /* KVCR DRAM slots allocated but not evictable (claimed) */
    uint32_t g3;     /* G3 slots allocated but not evictable, and stores pending */
    uint32_t ops;    /* operations in flight, hints kept */
    uint32_t pins;   /* framework pins, pinned keys, source writes in flight */
    demo_split split;
} demo_bye;

/* Sent while the G3 file system is full: the next `fail_n` G3 I/O
 * completions of each engine report -err (demo_chaos.c says why). */
typedef struct demo_disk {
    uint32_t fail_n;
    int32_t err;
} demo_disk;

/* Sums of demo_result over requests (the whole cluster, or one engine). */
typedef struct totals {
    uint64_t requests, blocks, local, remote, recomputed, remote_failed, local_failed;
    uint64_t g3, guard;
    uint64_t failed[DEMO_FAILS]; /* requests by enum demo_fail ([0]: unused) */
    uint64_t slow_ops;
    double slowest_op_s;
    uint64_t hinted, hint_refused, deposited, not_stored, verified, wrong, peer_bytes;
    uint64_t resilience;
    uint64_t why_failed[DEMO_REASONS];
    double peer_s, local_s;
    double (*pulls)[2]; /* [start, end] of every pull (the cluster totals only) */
    size_t n_pulls, cap_pulls;
    bool keep_pulls;    /* the cluster totals: pulls are kept */
    bool pulls_lost;    /* a pull's times could not be kept (out of memory) */
} totals;

/* ---- demo_common.c ---------------------------------------------------------- */

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
 * (tool_now seconds). 0, or -1 with errno: EPIPE at end of file, ETIMEDOUT,
 * EMSGSIZE for a message larger than cap. */
int demo_recv(int fd, uint32_t *type, void *buf, size_t cap, size_t *len, double deadline);

/* Engine e's KV-event endpoints, as vLLM's engines have them: where it
 * publishes (pub, "tcp://" "*:<port>": bound, so that any number of routers
 * and monitors connect), where a subscriber connects to it (sub, its own
 * address) and where it answers replay (its own address, bound). */
void demo_kv_endpoints(const demo_opts *o, int e, char *pub, size_t pub_len, char *sub,
                       size_t sub_len, char *replay,
                       size_t replay_len);

/* Child processes: die with the driver, ignore SIGPIPE (writes fail),
 * SIGINT and SIGHUP (the driver's). */
void demo_child_setup(int driver_pid);

/* ---- demo_report.c: the figures ----------------------------------------------- */

void demo_add(totals *t, const demo_result *r);
/* A progress line on stderr (redrawn on a terminal, every 10% otherwise). */
void demo_progress(const demo_opts *o, const totals *t, bool last);
struct demo_chaos_figures;
/* Adds an engine's state after the drain into *sum (sum->engine counts them). */
void demo_add_bye(demo_bye *sum, const demo_bye *b);
/* Adds the pull parts' histograms of a kvcr_stats snapshot (one interval:
 * each snapshot of an instance is added once) into *sum. */
void demo_add_split(demo_split *sum, const kvcr_stats *s);
/* Leaked slots, operations and pins in a sum of demo_bye. */
uint64_t demo_leaks(const demo_bye *sum);
/* The final table, or one JSON object with --json. Sorts t->pulls. chaos:
 * its figures, NULL without --chaos. */
void demo_report(const demo_opts *o, totals *t, const totals *per, int started, double wall,
                 const demo_bye *leaks, const struct demo_chaos_figures *chaos);
/* "256 KiB", or "1000 B" when not a whole number of KiB (a static buffer). */
const char *demo_size_text(size_t bytes);

/* ---- the processes --------------------------------------------------------- */

/* The driver's children: [0] the router, [1..] the engines. */
typedef struct cluster {
    int n;
    pid_t pid[1 + DEMO_MAX_ENGINES];
    int status[1 + DEMO_MAX_ENGINES];
    bool killed[1 + DEMO_MAX_ENGINES]; /* by us: its end is not news */
    int to_router, from_router;        /* the driver's ends */
    int to_router_fds;                 /* a restarted engine's pipes go to the router here */
} cluster;

/* Each returns the process's exit status. fds_from_driver: a Unix socket
 * bringing a restarted engine's pipe ends (demo_recv_fds). */
int demo_engine_main(const demo_opts *o, int engine, int from_router, int to_router,
                     double deadline);
int demo_router_main(const demo_opts *o, int from_driver, int to_driver, int fds_from_driver,
                     const int *from_engine, const int *to_engine, double deadline);

/* Starts engine e again (its earlier process reaped): new pipes, whose
 * router ends go to the router. 0, or -1 with a message on stderr. */
int demo_restart_engine(const demo_opts *o, cluster *cl, int e, double deadline);

/* Passes two descriptors and an engine number over a Unix socket, and
 * takes them (the receiver owns them). 0 or -1 with errno. */
int demo_send_fds(int sock, int32_t engine, int fd0, int fd1);
int demo_recv_fds(int sock, int32_t *engine, int *fd0, int *fd1);

/* ---- demo_events.c: the router's KV events --------------------------------------- */

typedef struct demo_events demo_events;

typedef struct demo_events_figures {
    uint64_t batches, events; /* decoded, from every engine */
    uint64_t replays;         /* gaps in an engine's numbering, filled from its replay */
    uint64_t unfilled;        /* replays that did not bring the whole gap */
    uint64_t catch_ups;       /* replays asked for what follows the last batch (of those) */
} demo_events_figures;

/* One event of engine e: type 0 BlockStored, 1 BlockRemoved, 2
 * AllBlocksCleared; medium NULL for the last. 0, or -1 to stop. */
typedef int (*demo_events_apply)(void *ud, int engine, int type, const char *medium,
                                 const uint64_t *hashes, size_t n);

/* Binds one SUB socket per engine (the message says why it could not). */
int demo_events_open(const demo_opts *o, demo_events_apply apply, void *ud, demo_events **out);
void demo_events_close(demo_events *d);
/* Fills items[0 .. engines) with the sockets to poll (items[e]: engine e). */
int demo_events_items(demo_events *d, zmq_pollitem_t *items);
/* Applies what engine e's stream holds now (bounded). 0, or -1: broken. */
int demo_events_read(demo_events *d, int e);
/* Asks engine e's replay for every batch after the last one applied (what
 * the SUB socket lost with no later batch to show the gap) and applies
 * them; the SUB socket's copies of those are skipped. 0, or -1: broken. */
int demo_events_catch_up(demo_events *d, int e);
const demo_events_figures *demo_events_figures_of(const demo_events *d);

/* ---- demo_chaos.c: faults while the workload runs ------------------------------- */

typedef struct demo_chaos demo_chaos;

enum demo_fault {
    DEMO_FAULT_KILL,
    DEMO_FAULT_STOP,
    DEMO_FAULT_CORRUPT,
    DEMO_FAULT_FULL,
    DEMO_FAULTS
};
#define DEMO_FAULTS_ALL ((1u << DEMO_FAULTS) - 1)

/* "kill,stop,corrupt,full" (any of them, once each) or "none" into *mask;
 * -1 on anything else. */
int demo_chaos_kinds(const char *list, unsigned *mask);

/* What the chaos did and saw, for the report. */
typedef struct demo_chaos_figures {
    uint64_t kills, restarts, stops, corruptions, disk_fulls;
    uint64_t probes;                     /* requests sent to read a corrupted slot */
    uint64_t recovered_g2, recovered_g3; /* blocks the restarted engines found */
    uint64_t endpoint_changes;           /* restarts that came back on another endpoint */
    uint64_t disk_fill_bytes;            /* written to fill the G3 file system, summed */
    uint64_t enospc_injected;            /* G3 I/O completions set to fail with ENOSPC */
    bool disk_real;                      /* the G3 files are on a small loop-mounted ext4 */
    uint64_t unreaped, unexpected_exits;
    double chaos_s;                      /* seconds the faults ran */
} demo_chaos_figures;

/* Makes the temporary directories, the G3 file system and the service
 * (before any other child is forked), and fills o's chaos paths. Cleans up
 * after itself on failure and, from then on, at exit and on SIGINT/TERM/HUP. */
int demo_chaos_start(demo_opts *o, demo_chaos **out);
/* The workload runs (every engine up): the faults begin. */
void demo_chaos_begin(demo_chaos *c);
/* The time (tool_now) of the next fault or repair. */
double demo_chaos_due(const demo_chaos *c);
/* Runs the faults and repairs due (restarted engines die at deadline).
 * *probe_engine >= 0 asks the driver to send a one-block request for
 * *probe_hash to that engine. 0, or -1 when the run cannot go on (also
 * after SIGINT, SIGTERM or SIGHUP). */
int demo_chaos_step(demo_chaos *c, cluster *cl, double deadline, int *probe_engine,
                    uint64_t *probe_hash);
/* From the driver's end of the workload on: no new faults, and every
 * engine brought back. True once all are up again. */
bool demo_chaos_settle(demo_chaos *c, cluster *cl);
/* An engine said HELLO: before demo_chaos_begin its first start, after it
 * a restart (what it recovered is counted). */
void demo_chaos_hello(demo_chaos *c, const demo_hello *h);
const demo_chaos_figures *demo_chaos_figures_of(const demo_chaos *c);
/* Stops the service, unmounts, removes every file. */
void demo_chaos_stop(demo_chaos *c);

int cmd_demo(int argc, char **argv);

#endif
