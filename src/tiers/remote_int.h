/* The peer-to-peer tier's internals, shared by its sources:
 *   remote_progress.c  the progress thread: UCX, the ZeroMQ channel,
 *                      message sending and dispatch, timers; the tier_ops
 *   remote_peer.c      peers: what we know of a control endpoint
 *   remote_route.c     routes: how to write into a target, their endpoints,
 *                      their bound (config.max_peers), the sweep
 *   remote_target.c    pulls: start_write, write_done, probes, deadlines
 *   remote_source.c    source writes: acceptance, claims, the UCX write
 *   remote_pin.c       framework pins: requests, residencies, releases
 * The tier reaches the core only through core/host.h. Everything below is
 * guarded by the instance lock unless it says "progress only" (touched by
 * the progress thread alone, no lock needed). */
#ifndef KVCR_TIERS_REMOTE_INT_H
#define KVCR_TIERS_REMOTE_INT_H

#include <pthread.h>
#include <semaphore.h>

#include "core/host.h"
#include "core/tier.h"
#include "net/control.h"
#include "net/ucx.h"
#include "net/wire.h"
#include "tiers/remote.h"

typedef struct pull pull;

#define PULL_BUCKETS 1024 /* remote.pull_index */

/* ---- peers: what we know of a control endpoint ----------------------------- */

typedef struct rpeer {
    char endpoint[CTL_MAX_ENDPOINT + 1];
    bool acked;        /* it acknowledged our metadata: later messages omit it */
    uint64_t retry_ns; /* metadata may ride along again from then on */
    bool has_inc;      /* its incarnation, as last learned */
    uint8_t inc[WIRE_INCARNATION_LEN];
    bool messages;     /* the incarnation messages_inc writes to us by messages */
    uint8_t messages_inc[WIRE_INCARNATION_LEN];
    bool eager;        /* a hint asked us to publish our metadata to it */
    uint32_t eager_tries;
    uint64_t last_ns;  /* last looked up: the least recently used is reclaimed first */
    uint64_t heard_ns; /* a message last came from it (0: never) */
} rpeer;

/* ---- routes: how to write into a target (remote_route.c; progress only) ---- */

typedef struct rregion {
    char label[WIRE_MAX_NAME + 1];
    bool framework;
    uint64_t addr, element_size, stride, count;
    uint8_t *rkey_bytes;
    size_t rkey_len;
    ucx_rkey *rkey;
} rregion;

typedef struct route {
    struct route *next;
    char agent[WIRE_MAX_NAME + 1]; /* the target's logical name */
    char key[CTL_KEY_LEN + 1];      /* the CURVE key it was announced with ("": none) */
    uint32_t users;                 /* source writes on it not ended yet (the per-peer limit) */
    uint64_t connect_at;            /* its endpoint is made at the first turn end from
                                     * this time on (0: not asked for) */
    uint32_t acks_due;              /* ... and then its metadata acknowledged to ack_to, */
    char ack_to[CTL_MAX_ENDPOINT + 1];   /* from ack_from (our address as the target */
    char ack_from[CTL_MAX_ENDPOINT + 1]; /* used it); unusable metadata is dropped */
    bool replaced;                  /* the target restarted or changed: nothing more is
                                     * written through it (kept until its users end) */
    uint64_t last_ns;               /* last resolved or released (reclaimed after
                                     * config.peer_idle_ms without users) */
    ucx_peer *peer;
    uint8_t *worker_addr;
    size_t worker_len;
    uint32_t n_regions;
    rregion *regions;
    region_geom *geom;              /* regions[i] as core/conf.h's resolver sees it */
} route;

/* A source's routes, touched by remote_route.c alone: the progress thread
 * under the lock (the gauges read the counts, locked), and the stop once
 * the thread ended. */
typedef struct route_table {
    route *live;                    /* one per target (agent name and key) */
    route *replaced;                /* still used by writes that will fail */
    uint32_t n;                     /* in live <= config.max_peers */
    uint64_t reclaimed;             /* idle or failed routes closed (a gauge) */
    uint64_t connect_next;          /* the earliest connect_at of a route,
                                     * UINT64_MAX: none */
    uint64_t sweep_ns;              /* the next sweep (peers_sweep) */
} route_table;

/* ---- pulls: target side ---------------------------------------------------- */

enum pull_state {
    PULL_START = 0,     /* not sent yet */
    PULL_WAIT_DONE,     /* start_write sent, waiting for write_done */
    PULL_WAIT_TERMINAL, /* past the deadline: probed, waiting for terminal evidence */
    PULL_QUARANTINED,   /* past the abandon deadline: reported uncertain */
    PULL_FINISHED
};

/* Work a pull owes the main side (target_main, from the tier's settle). */
enum pull_main {
    PM_DISCARD = 1u << 0,   /* a fetch's deadline passed: fail its waiters now */
    PM_UNCERTAIN = 1u << 1, /* abandoned: report its destinations uncertain */
    PM_FINISHED = 1u << 2   /* terminal: settle and free */
};

typedef struct pull_key {
    uint32_t key_off, key_len;
    uint32_t ref_off, n_refs;
    tier_token tok;     /* the deliver entry or the fetch's fill, to settle */
    bool settled;       /* tok was settled (a deliver reported uncertain) */
    bool completed;
} pull_key;

/* A batch of the core's reads (core/tier.h): the request's hint, and the
 * pull being built (NULL for a query). Valid until end(), under the lock. */
struct tier_batch {
    const hint_state *st;
    pull *p;
};

struct pull {
    tier_batch batch;   /* while the core adds keys: this pull's batch */
    pull *next, *prev;  /* remote.pulls */
    pull *hnext;        /* remote.pull_index: its bucket's chain */
    pull *todo_next;    /* remote.todo (main's work) */
    uint8_t main_flags; /* enum pull_main, pending for main */
    bool in_todo;
    int64_t handle;     /* the op handle; negative for a fetch's fill */
    bool fetch;
    uint8_t state;      /* enum pull_state */
    bool uncertain;
    bool held;          /* waited for a silent source (target_adopt), counted once */
    bool success;
    bool probe_due;      /* the last probe could not be sent: again at the next turn */
    bool discarded;
    bool sent_md;        /* its start_write carried our metadata */
    bool md_resent;      /* refused without it, sent again with it (once) */
    bool inc_adopted;    /* refused by another incarnation than it quoted: sent
                          * again quoting the refuser's (once) */
    uint8_t fail_reason; /* kvcr_reason when it failed */
    char source[CTL_MAX_ENDPOINT + 1];
    char *request_id;
    bool has_inc;        /* the source incarnation this pull quoted */
    uint8_t inc[WIRE_INCARNATION_LEN];
    uint64_t start_ns, deadline_ns, abandon_ns;
    /* Its time in parts (kvcr/stats.h, KVCR_PULL_PART_SCOPES): its last
     * start_write sent, the answer that ended it taken, its end on the
     * progress side, the durations that answer carried (has_times), and
     * when its first and last bytes sent as messages were taken (0: none). */
    uint64_t sent_ns, answer_ns, finished_ns, bytes_first_ns, bytes_last_ns;
    bool has_times;
    wire_times times;
    uint64_t reprobe_ns;  /* waiting for terminal evidence: the next probe */
    uint32_t reprobe_ms;  /* and the interval after it (doubling, at most 30 s) */
    uint32_t n_keys, cap_keys;
    pull_key *keys;
    uint8_t *key_bytes;
    size_t key_used, key_cap;
    wire_ref *refs;     /* labels point into the instance's config */
    uint32_t n_refs, cap_refs;
    /* Writes that come as active messages (net/ucx.h): where they may land
     * (the destinations' pieces, sorted, touching ones merged), whether one
     * came, the bytes taken, and what write_done said was sent. */
    mem_piece *ranges;
    uint32_t n_ranges;
    bool am_seen;
    bool done_pending;  /* write_done came before all its bytes */
    uint64_t am_in, am_expect;
    bool inline_asked;  /* its start_write asks for the bytes inline in write_done
                         * (decided when the pull is ended): nothing but this
                         * process writes its destinations */
    bool puts_agreed;   /* its start_write's put_min covers every destination piece:
                         * the source may put even over message lanes (net/ucx.h) */
};

/* ---- source writes --------------------------------------------------------- */

enum sw_state {
    SW_PINNING = 0,     /* on main: waiting for framework pins */
    SW_READY,           /* sources fixed: the progress thread posts it */
    SW_POSTED,          /* UCX holds it */
    SW_DONE             /* finished: main releases claims and pins */
};

struct pin;

typedef struct sw_key {
    uint32_t key_off, key_len;
    uint32_t dst_off, n_dst;  /* into swrite.dst */
    tier_block local;         /* claimed KVCR DRAM source, or TIER_BLOCK_NONE */
    struct pin *pin;          /* framework source: the pin it reads through */
    const kvcr_mem_ref *fw_refs;
    uint32_t n_fw;            /* references the pin gave */
    bool included;
    bool asked;               /* a pin was requested for it */
} sw_key;

typedef struct sw_dst {
    uint32_t piece_off;       /* its pieces in the target: swrite.dpieces[piece_off ..], */
    uint32_t n_pieces;        /* regions indexing the route's */
    uint32_t pool;            /* our pool of the same label */
    bool framework;
    char label[WIRE_MAX_NAME + 1];
    uint64_t index;
} sw_dst;

struct wstat;

typedef struct swrite {
    struct swrite *next, *prev;   /* remote.swrites */
    struct swrite *list_next;     /* remote.sw_main or remote.sw_post */
    bool on_main, on_post;
    uint64_t number;              /* source op number (resilience events) */
    struct wstat *status;
    route *route;                 /* holds a use of it until the write ends */
    char agent[WIRE_MAX_NAME + 1];
    char reply_to[CTL_MAX_ENDPOINT + 1];  /* the target's endpoint */
    char reflected[CTL_MAX_ENDPOINT + 1]; /* our address as the target used it */
    int64_t op;
    uint8_t state;                /* enum sw_state */
    bool forced_fail, cancel_pending, abandoned, pins_dropped, success;
    bool inline_write;            /* the bytes go inline in write_done, never with UCX */
    bool puts_agreed;             /* start_write's put_min covers every destination piece */
    bool by_messages;             /* posted as UCX messages (net/ucx.h), not puts */
    const char *busy;             /* refused at this limit before anything was written */
    uint64_t start_ns, deadline_ns, cancel_deadline_ns;
    /* What write_done reports of its time (wire_times): since when it waits
     * for pins (0: not waiting), how long it waited, when its data went to
     * UCX and how long the data took. */
    uint64_t pin_from_ns, pin_ns, data_from_ns, data_ns;
    uint32_t n_keys;
    sw_key *keys;
    uint8_t *key_bytes;
    sw_dst *dst;
    uint32_t n_dst;
    mem_piece *dpieces;           /* the destinations' pieces */
    uint32_t n_dpieces, cap_dpieces;
    uint64_t *wait_reqs;          /* pin requests it waits for */
    uint32_t n_wait;
    ucx_seg *segs;
    uint32_t n_segs, cap_segs;
    uint32_t n_blocks;            /* destination blocks in segs */
    uint64_t bytes;
    int ucx_status;
    struct remote *owner;
    struct swrite *ucx_next;      /* progress only: finished in UCX */
} swrite;

/* The fence of one write id (target agent, op handle): kept after the write
 * ends so that a duplicate or a probe-fenced start_write is never served. */
typedef struct wstat {
    struct wstat *next;
    char agent[WIRE_MAX_NAME + 1];
    int64_t op;
    bool submitted, cancel_requested;
    swrite *sw;                   /* while live */
    uint64_t ended_ns;            /* 0 while live */
} wstat;

/* ---- pins ------------------------------------------------------------------ */

typedef struct pin {
    struct pin *next;
    uint64_t handle;
    uint32_t holders;             /* source writes reading through it */
    bool releasing;               /* release_pin not yet accepted */
    bool release_queued;          /* a release callback is queued */
    bool release_warned;
    uint32_t n_keys;              /* fw residencies it backs */
} pin;

/* A key's framework residency, while a pin backs it. */
typedef struct fwres {
    struct fwres *next;
    pin *pin;
    uint8_t *key;
    uint32_t key_len;
    uint32_t n_refs;
    kvcr_mem_ref *refs;           /* labels owned here */
} fwres;

typedef struct pin_req {
    struct pin_req *next;
    uint64_t id;
    uint32_t n_keys;
    kvcr_key *keys;               /* copies in store */
    uint8_t *store;
} pin_req;

/* ---- callbacks queued for the polling thread -------------------------------- */

enum rcb_kind { RCB_REQUEST_PIN = 1, RCB_CANCEL_PIN, RCB_RELEASE_PIN, RCB_RESILIENCE };

typedef struct rcb {
    struct rcb *next;
    uint8_t kind;
    uint64_t id;                  /* pin request or pin handle */
    kvcr_key *keys;               /* request_pin: owned copies */
    size_t n_keys;
    kvcr_resilience_event ev;
    kvcr_mem_ref *regions;        /* owned */
    void *owned;                  /* label or key storage */
    char message[200];
} rcb;

void rcb_free(rcb *cb);

/* ---- the tier ------------------------------------------------------------- */

struct remote {
    kvcr_t *kv;                   /* the instance, reached through core/host.h */
    pthread_t thread;
    bool thread_started;
    sem_t thread_ready;           /* remote_start: posted once the thread touched its memory */
    int wake_fd;                  /* eventfd: work for the progress thread */
    bool stop;                    /* close asked the progress thread to finish */
    bool exited;

    /* progress only (set up before the thread starts) */
    ucx_ctx *ucx;
    ucx_mem **mems;               /* framework regions, then pools */
    uint32_t n_mems;
    wire_region *md_regions;
    wire_metadata md;
    region_geom *own_geom;        /* md's regions as core/conf.h's resolver sees them */
    ctl_channel *ctl;             /* also a caller's, locked (target_end) */
    route_table routes;           /* remote_route.c's (its gauges read locked) */
    swrite *ucx_done;             /* finished in UCX, to settle under the lock */
    bool progress_locked;         /* the progress thread holds the lock: UCX calls made
                                   * under it (closing an endpoint) may run the sink */
    bool main_owed;               /* the polling thread is to be woken (remote_owe_main) */
    bool ucx_fence;               /* a pull ended without its write: UCX runs again before
                                   * the polling thread hears of it (target.c, finish) */
    uint64_t last_turn_ns;

    char endpoint[CTL_MAX_ENDPOINT + 1];
    uint8_t inc[WIRE_INCARNATION_LEN];

    rpeer *peers;
    uint32_t n_peers, cap_peers;  /* n_peers <= config.max_peers */
    uint64_t peers_reclaimed;     /* records of unused sources dropped (a gauge) */
    kvcr_log_limit peer_log;      /* refusals at max_peers, logged once a second */
    uint64_t pulls_held;          /* pulls that waited for a silent source */
    kvcr_log_limit held_log;      /* and their log line, once a second */

    pull *pulls;                  /* every live pull */
    pull *pull_index[PULL_BUCKETS]; /* ... by handle (target_take_bytes, replies) */
    uint32_t inline_max;          /* pulls of at most this many bytes ask for them inline
                                   * (0: never); set before the thread starts */
    uint64_t put_min;             /* start_write's put_min (0: not sent); set so too */
    pull *todo, *todo_tail;       /* pulls with work for main */
    uint64_t n_pulls;
    tier_batch query;             /* the batch of a query (no pull) */

    swrite *swrites;              /* every live source write */
    uint32_t n_swrites;           /* ... counted (limits.max_source_writes) */
    uint32_t n_serving;           /* ... not ended yet (limits.max_source_writes_per_peer) */
    uint32_t max_serving_seen;    /* the most ever served at once (a gauge) */
    swrite *sw_main, *sw_main_tail; /* pin work or settling, for main */
    swrite *sw_post, *sw_post_tail; /* ready for the progress thread */
    uint64_t next_source_no;
    bool stalled;
    uint64_t last_prune_ns;       /* progress only */

    wstat **wstats;               /* fences, by (agent, op) */
    uint32_t n_wbuckets;
    uint64_t n_wstats;

    pin *pins;
    fwres *fwres;
    pin_req *pin_reqs;
    uint32_t n_pin_reqs;          /* limits.max_pin_requests */
    uint64_t next_pin_req;

    rcb *cbs, *cbs_tail;          /* callbacks for the polling thread */

    uint64_t dropped_messages;    /* malformed, unexpected or from a bad sender */
    uint64_t refused_messages;    /* CURVE: reply endpoint key not the connection's */
    kvcr_log_limit drop_log[CTL_N_DROPS]; /* per cause; progress only */
    uint64_t stranger_window_ns;  /* replies to unconnected endpoints: this second's */
    uint32_t stranger_replies;    /* start and count (remote_source.c) */
};

/* remote_progress.c (locked, progress thread unless noted) */
/* Any thread: the progress thread has work. */
void remote_wake(remote *r);
/* Any thread, locked: the polling thread has work (kvcr_poll). Woken at
 * once off the progress thread; on it, once the turn's messages left
 * (main_owed): woken first, the polling thread took the CPU the send of an
 * answer needed, 10 us at the median of a one-block pull on one host. */
void remote_owe_main(remote *r);
/* A control message dropped for cause: counted in the total and by cause,
 * logged at most once per CTL_DROP_LOG_MS per cause. */
void remote_drop(remote *r, ctl_drop cause, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sends m (common fields filled in here) to endpoint; md_rule says when our
 * metadata rides along (MD_RETRY: the peer has not acknowledged it and its
 * retry time came; MD_FORCE: whenever not acknowledged). 0 or negative; a
 * failure invalidates the peer. */
int send_msg(remote *r, const char *endpoint, wire_msg *m, int md_rule);
enum { MD_NEVER = 0, MD_RETRY, MD_FORCE };
/* Any thread holding the lock: queues a callback for the polling thread. */
void rcb_push(remote *r, rcb *cb);
void rcb_resilience(remote *r, kvcr_resilience_state st, bool source_side, uint64_t op,
                    const kvcr_mem_ref *regions, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* remote_peer.c (locked) */
/* The record of endpoint (touched: now its most recent use), or with
 * create a new one; NULL when there is none, or the table is at
 * config.max_peers with every record in use (a refusal, counted). */
rpeer *peer_get(remote *r, const char *endpoint, bool create);
/* A failed send, a timeout or a refusal: the peer may have lost our
 * metadata (a restart), so the next message publishes it again. */
void peer_invalidate(remote *r, const char *endpoint);
/* A valid message came from endpoint (its reply endpoint, len bytes): the
 * record, if there is one, notes when (rpeer.heard_ns). */
void peer_heard(remote *r, const void *endpoint, size_t len, uint64_t now);
/* A refusal at config.max_peers of what (name: len bytes): counted,
 * logged at most once a second. */
void peer_refused(remote *r, const char *what, int len, const char *name);
/* Records unused for config.peer_idle_ms that no pull or hint needs are
 * dropped. */
void peer_records_sweep(remote *r, uint64_t now);

/* remote_route.c (locked, progress thread unless noted) */
/* Before the thread starts: no route, no endpoint due. */
void route_init(remote *r);
/* The route to m's sender, made or replaced from the metadata m carries
 * (a new target within config.max_peers: KVCR_ELIMIT, counted and logged,
 * when no route is reclaimable); 0, or the error. */
int route_resolve(remote *r, const wire_msg *m, route **out);
/* The route's UCX endpoint and rkeys, made on first need (a write that goes
 * with UCX, or metadata alone): an inline write needs none. 0, or the
 * error (the route stays, without an endpoint, to try again). */
int route_connect(remote *r, route *rt);
/* The same, at the end of a turn of the progress thread at least delay_ns
 * from now: after the turn's replies went out, so that ucp_ep_create's CPU
 * time delays none. */
void route_connect_later(remote *r, route *rt, uint64_t delay_ns);
/* Metadata m made or confirmed rt, which has no endpoint yet: the endpoint
 * is made at the end of the turn and m acknowledged only once it is (else
 * m is dropped as unusable). */
void route_ack_later(remote *r, route *rt, const wire_msg *m);
/* At the end of a turn: the endpoints asked for by now made, the metadata
 * waiting for them acknowledged or dropped as unusable; *next_ns lowered
 * to when the next one is due. */
void route_connect_due(remote *r, uint64_t *next_ns);
/* A source write was accepted on rt: it uses the route until it ends. */
void route_use(route *rt);
/* A source write ended on the progress thread: its use of the route too. */
void route_release(remote *r, route *rt);
/* At most once a second: routes without users idle for
 * config.peer_idle_ms or failed, and records unused that long
 * (peer_records_sweep), are reclaimed. */
void peers_sweep(remote *r, uint64_t now, uint64_t *next_ns);
/* Locked, any thread: the routes' gauges (peer_routes, peer_routes_reclaimed). */
void route_gauges(const remote *r, gauge_sink *s);
/* Unlocked, once the progress thread ended: every route's endpoint closed
 * (ending the writes still on it) and the routes freed. */
void route_close_all(remote *r);

/* remote_target.c (locked, progress thread unless noted) */
void target_adopt(remote *r, uint64_t now, uint64_t *next_ns);
void target_timers(remote *r, uint64_t now, uint64_t *next_ns);
void target_on_message(remote *r, const wire_msg *m);
bool target_idle(const remote *r);     /* nothing may still write our memory */
/* A pull whose bytes come through UCX (not inline) is open: the progress
 * thread keeps UCX moving actively. */
bool target_moving(const remote *r);
/* ucx_sink: a write's bytes sent as a message, copied into a live pull's
 * destinations (progress thread, unlocked: it takes the lock itself). */
bool target_take_bytes(void *arg, uint64_t tag, uint64_t addr, const void *data, size_t len);
void target_stop(remote *r, uint64_t now);
void target_abandon_all(remote *r);
/* The core's side (main thread, locked): tier_ops begin/holds/read/end,
 * settle, and (unlocked, at destroy) dropping pulls never settled. */
tier_batch *target_begin(remote *r, const tier_batch_info *info);
bool target_holds(remote *r, const tier_batch *b, const uint8_t *key, uint32_t key_len);
kvcr_reason target_read(remote *r, tier_batch *b, const tier_read *rd);
void target_end(remote *r, tier_batch *b);
void target_main(remote *r);
void target_destroy(remote *r);

/* remote_source.c (locked, progress thread unless noted) */
void source_on_message(remote *r, const wire_msg *m);
void source_timers(remote *r, uint64_t now, uint64_t *next_ns);
/* Takes the writes ready to post; post them unlocked with source_post. */
swrite *source_take_posts(remote *r);
void source_post(remote *r, swrite *sw);  /* unlocked, progress thread */
void source_ucx_settle(remote *r);      /* UCX completions */
void source_main(remote *r);            /* main thread */
/* Main thread: a pinning write goes on (its pins came, or it gives up). */
void source_resume(remote *r, swrite *sw);
bool source_idle(const remote *r);
void source_stop(remote *r);
void source_destroy(remote *r);

/* remote_pin.c (main thread, locked unless noted) */
fwres *pin_fwres_find(remote *r, const uint8_t *key, uint32_t len);
/* k of sw reads through f's pin: the write holds the pin until it ends. */
void pin_bind(swrite *sw, sw_key *k, const fwres *f);
/* A pending pin request asking for the key: its id. */
bool pin_req_covering(remote *r, const uint8_t *key, uint32_t len, uint64_t *req);
bool pin_wait_add(swrite *sw, uint64_t req);
/* One request_pin for keys idx[0..n) of sw; false: out of memory. */
bool pin_request(remote *r, swrite *sw, const uint32_t *idx, uint32_t n);
/* The write ended (or was abandoned): it holds its pins no more. */
void pin_unhold(remote *r, swrite *sw);
/* Pins whose release the framework refused are asked again. */
void pin_retry_releases(remote *r);
/* Pin requests no pinning write waits for any more are cancelled. */
void pin_cancel_orphans(remote *r);
/* Runs one queued pin callback unlocked (request, cancel, release). */
void pin_run_callback(remote *r, const rcb *cb);
void pin_close(remote *r);            /* at close */
void pin_destroy(remote *r);          /* unlocked, at destroy */

#endif
