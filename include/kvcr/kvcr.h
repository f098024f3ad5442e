/* kvcr/kvcr.h — the KVCR instance: configuration, operations, completion.
 *
 * Model (libuv-style request/completion): deposit, deliver and fetch return
 * an operation handle at once; their per-key results arrive only through
 * kvcr_poll(). Copies run on KVCR's copy threads, never on the caller.
 * Every function may be called from any thread. The inventory and capacity
 * callbacks run only inside kvcr_poll() on the polling thread, with no KVCR
 * lock held (they may call back into KVCR). Policy hooks run inside the
 * call that needs them, under the instance lock: they must not call into
 * the same instance (see kvcr/policy.h). The log callback never runs under
 * the instance lock: a line written while a thread holds it is delivered
 * by that thread right after it lets go (so a log sink may call into
 * KVCR, and may take a lock of its own, such as Python's GIL).
 *
 * ABI (docs/ARCHITECTURE.md "ABI and SONAME"). The structs a caller
 * allocates and the library reads start with a version: kvcr_config
 * (KVCR_CONFIG_VERSION) and kvcr_policy_ops (KVCR_POLICY_VERSION, see
 * kvcr/policy.h). kvcr_config_init writes the version of the kvcr.h the
 * program was built with; a policy table sets .version itself. One config
 * version covers every part of the configuration built with the same
 * header: the parts embedded in it (kvcr_remote_options with its
 * kvcr_curve_options, kvcr_g3_options, kvcr_guard_options, kvcr_limits,
 * kvcr_callbacks, kvcr_kv_events_options), the arrays it points to (kvcr_pool_layout,
 * kvcr_dram_pool, kvcr_region), and every struct that crosses a call or a
 * callback of the instance created from it (kvcr_block, kvcr_query_result
 * arrays the caller passes in, kvcr_poll's results, stats, events). The
 * library reads a config only as far as its version reaches; a field that
 * a later header added takes its kvcr_config_init default, which keeps the
 * behaviour of programs built before it. A version the library does not
 * read (0: the config was not initialised; newer than the library; not one
 * of its versions) is refused with KVCR_EINVAL before anything is read or
 * started. Fields are only ever appended, with a new version; a released
 * version stays readable for the life of the SONAME (libkvcr.so.0 until
 * 1.0).
 *
 * Returned memory. Strings and arrays the library returns are owned as
 * each function says: static ones live as long as the process; the
 * instance's (kvcr_control_endpoint, kvcr_pool_name) until kvcr_free();
 * allocations the caller owns (kvcr_poll's results, kvcr_stats_take's
 * snapshot, the Prometheus text) are released with their own function,
 * never with free(); kvcr_last_error()'s text belongs to the calling
 * thread and stays until that thread's next failing call. Pointers a
 * callback or hook receives are valid only during that call. */
#ifndef KVCR_KVCR_H
#define KVCR_KVCR_H

#include "kvcr/error.h"
#include "kvcr/policy.h"
#include "kvcr/stats.h"
#include "kvcr/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVCR_VERSION_MAJOR 0
#define KVCR_VERSION_MINOR 1
#define KVCR_VERSION_PATCH 0
#define KVCR_VERSION_STRING "0.1.0"
#define KVCR_VERSION_HEX \
    ((KVCR_VERSION_MAJOR << 16) | (KVCR_VERSION_MINOR << 8) | KVCR_VERSION_PATCH)

/* The library's version at run time, as KVCR_VERSION_HEX / _STRING. The
 * string is static. */
unsigned kvcr_version(void);
const char *kvcr_version_string(void);

typedef struct kvcr kvcr_t;

/* ---- configuration ------------------------------------------------------ */

/* The defaults, ranges and rules the field comments below give are rows of
 * one table, src/api/options.def (read at run time through kvcr/options.h):
 * kvcr_config_init and kvcr_create are made from it, and the table decides
 * where a comment and it differ. */

#define KVCR_MAX_POOLS 64
#define KVCR_NAME_MAX 128

typedef struct kvcr_pool_layout {
    const char *name;   /* "" only when it is the only pool */
    size_t block_size;  /* bytes per block in this pool, > 0 */
} kvcr_pool_layout;

/* Caller-provided memory for one KVCR-owned DRAM pool, split into slots of
 * the pool's block size. It must stay valid until kvcr_free(). */
typedef struct kvcr_dram_pool {
    const char *name;
    void *addr;
    size_t size;
} kvcr_dram_pool;

/* CURVE security of the control channel (CurveZMQ: every control message
 * encrypted and authenticated both ways). Off while secret_key is NULL.
 * Keys are Z85 text, 40 characters (`kvcr keygen` prints a pair). With it
 * the control endpoint carries this instance's public key,
 * "tcp://host:port#curve=<public key>" (kvcr_control_endpoint gives it to
 * the router as is); peers are admitted, and hints' sources accepted, only
 * when their public key is in allowed_keys, and endpoints without a key are
 * refused (as keyed ones are when CURVE is off). Not with guard mode. */
typedef struct kvcr_curve_options {
    const char *secret_key;              /* this instance's secret key, or NULL: off */
    const char *public_key;              /* its public key; NULL: derived from secret_key */
    const char *const *allowed_keys;     /* the peers' public keys, 1..KVCR_CURVE_MAX_KEYS */
    size_t n_allowed_keys;
} kvcr_curve_options;

#define KVCR_CURVE_KEY_LEN 40    /* characters of a Z85 key */
#define KVCR_CURVE_MAX_KEYS 4096 /* allowed_keys */

/* Peer-to-peer (REMOTE_G2) options: the control endpoint this instance
 * binds (ZeroMQ PULL) and advertises to peers, and how hints connect. The
 * interval, backend name and keys without a secret are checked even when
 * `enabled` is false. */
typedef struct kvcr_remote_options {
    bool enabled;
    bool eager_ctrl_connect;            /* default true: a hint's source is contacted at once */
    bool opportunistic_query;           /* default false: any key of a hinted request is FETCHABLE */
    uint32_t metadata_retry_interval_ms; /* default 100, > 0 */
    const char *backend;                /* default "UCX", the only transport (another name:
                                         * KVCR_ENOTSUP when enabled); tuning through UCX_* */
    const char *control_host;           /* address to bind; default "127.0.0.1" */
    uint16_t control_port;              /* 0: any free port (see kvcr_control_endpoint) */
    const char *advertise_host;         /* host peers are told; default control_host */
    kvcr_curve_options curve;           /* default off */
} kvcr_remote_options;

/* The G3 tier: KVCR-owned slot files on local disk (O_DIRECT, io_uring).
 * Blocks the policy evicts from KVCR DRAM with MOVE_TO/COPY_TO G3 are
 * written there; fetch reads them back into KVCR DRAM and deliver straight
 * into framework memory. Every slot carries its key, a generation and an
 * xxHash3 checksum: a slot that does not verify is a miss, never bytes. A
 * restarted instance on the same files finds its blocks again. */
typedef struct kvcr_g3_options {
    const char *const *paths;         /* one slot file per path (striped); NULL: no G3 */
    size_t n_paths;
    uint64_t capacity_bytes_per_file; /* data bytes per file: whole slots */
    const char *backend;              /* a compatibility name: any non-empty one ("GDS_MT",
                                       * "POSIX", ...) is served by io_uring; default "io_uring" */
    uint32_t queue_depth;             /* I/O in flight per store; default 16, 1..1024 */
    uint64_t max_staging_bytes;       /* spills held in DRAM while written; default 64 MiB */
} kvcr_g3_options;

/* Memory that a failed peer transfer may still touch (UNCERTAIN), and later
 * the news that the transport proved it quiet (QUIESCED) or that this
 * instance's source side stalled (SOURCE_STALLED: it serves no more peers). */
typedef enum kvcr_resilience_state {
    KVCR_TRANSFER_UNCERTAIN = 0,
    KVCR_TRANSFER_QUIESCED,
    KVCR_SOURCE_STALLED
} kvcr_resilience_state;

typedef struct kvcr_resilience_event {
    kvcr_resilience_state state;
    bool source_side;              /* true: our sources were being read by a peer */
    uint64_t op;                   /* target: the op handle; source: the source write number */
    const kvcr_mem_ref *regions;   /* framework memory involved (KVCR-owned memory omitted) */
    size_t n_regions;
    const char *message;
} kvcr_resilience_event;

/* Guard mode (Python: KVCRGuardConfig): KVCR DRAM comes from a pool group
 * of the node's KVCR service (`kvcr service`) instead of local_dram. The
 * engine maps the pool directly; every committed block is published to the
 * group's recovery journal, so that when this process dies the service's
 * Guard serves those blocks to peers (on this instance's control endpoint)
 * and a restarted engine claiming the same group gets them back. The
 * service owns the control listener, so the endpoint survives the engine.
 * Requires local_dram unset and blocks of one slot each (one pool per
 * block layout); without the peer tier the Guard recovers but does not
 * serve. */
typedef struct kvcr_guard_options {
    const char *service_socket_path;  /* the service's claim socket; NULL: guard mode off */
    uint32_t guard_index;             /* which pool group to claim */
    const char *compatibility_digest; /* must equal the service's, byte for byte: change it
                                       * whenever the model or KV layout changes */
} kvcr_guard_options;

/* Bounds on what peers and callers can make this instance hold, so that a
 * flooding peer (or a caller that stops polling) meets a clear refusal
 * instead of exhausting memory. Each is enforced, counted in telemetry
 * (kvcr_limit_refusals{limit}) and has the default kvcr_config_init sets.
 *   A start_write is refused with write_refused(busy) when its target agent
 *   already has max_source_writes_per_peer writes being served (accepted,
 *   not yet answered), or when this instance holds max_source_writes
 *   (also ended ones whose claims and pins the next kvcr_poll releases):
 *   nothing is written and the target's entries fail SOURCE_BUSY. With
 *   max_source_writes well above peers * max_source_writes_per_peer no peer
 *   at its limit can keep another peer's requests from being served.
 *   A write whose keys need more framework pins than max_pin_requests
 *   leaves pending is refused the same way (no pin is requested).
 *   A control message over max_control_message_bytes is never received
 *   (ZeroMQ drops the connection that sent it).
 *   kvcr_submit_hint refuses (KVCR_ELIMIT) a hint longer than
 *   max_hint_bytes (kvcr_deposit_ex and kvcr_fetch_ex their hints too),
 *   and a new request_id while max_hinted_requests are
 *   kept (replacing or discarding a kept one is always possible).
 *   deposit / deliver / fetch are refused (KVCR_ELIMIT) while
 *   max_unpolled_operations operations are pending or completed and not yet
 *   collected by kvcr_poll: no completion is ever dropped, so the queue of
 *   completions can never hold more than this. */
#define KVCR_MAX_CONTROL_MESSAGE (16u << 20) /* the protocol's own bound on one message */
#define KVCR_MAX_HINT_TEXT (16u << 20)       /* the JSON reader's own bound */

typedef struct kvcr_limits {
    uint32_t max_source_writes_per_peer; /* default 64; 1..max_source_writes */
    uint32_t max_source_writes;          /* default 1024; 1..1048576 */
    uint32_t max_pin_requests;           /* default 1024; 1..1048576 */
    uint32_t max_control_message_bytes;  /* default 16 MiB; 4096..16 MiB */
    uint32_t max_hint_bytes;             /* default 1 MiB; 64..16 MiB (JSON text) */
    uint32_t max_hinted_requests;        /* default 65536; 1..16777216 */
    uint32_t max_unpolled_operations;    /* default 65536; 1..16777216 */
} kvcr_limits;

typedef struct kvcr_callbacks {
    void *ud;
    /* Inventory of KVCR-owned residencies; non-zero return = the event is
     * lost (logged). Keys are valid only during the call. */
    int (*inventory)(void *ud, const kvcr_inventory_event *event);
    /* Pools that fell below their watermark since the last call. */
    int (*capacity_needed)(void *ud, const kvcr_capacity_need *needs, size_t n);
    /* Log sink, called on the thread that logged (a caller's, the peer
     * tier's progress thread, the G3 I/O thread), never with the instance
     * lock held; NULL logs to stderr at the level of KVCR_LOG_LEVEL
     * (error, warn, info, debug; default warn). */
    void (*log)(void *ud, kvcr_log_level level, const char *message);

    /* The key adapter: a block key's router hash (the u64 that hints list).
     * Returns 0 with *hash set, non-zero when the key has none. Runs under
     * the instance lock (like policy hooks); with kv_events also without
     * it, inside kvcr_poll and kvcr_deposit_ex. Without it no key is ever
     * REMOTE_G2. */
    int (*key_hash)(void *ud, const kvcr_key *key, uint64_t *hash);

    /* Framework pinning, used when a peer asks for blocks that only the
     * framework's memory holds. request_pin asks for an
     * asynchronous pin of keys under id `req` (chosen by KVCR); the
     * framework answers with kvcr_pin_complete(), from poll_pins or from any
     * thread. Non-zero return: no pin this time. Runs inside kvcr_poll()
     * with no lock held, like every callback below. */
    int (*request_pin)(void *ud, uint64_t req, const kvcr_key *keys, size_t n);
    void (*poll_pins)(void *ud);                         /* optional; start of each poll */
    void (*cancel_pin_request)(void *ud, uint64_t req);  /* optional */
    /* Ends a pin; true = accepted. Anything else is retried on every poll
     * (a warning on the first refusal); kvcr_close() reports pins it could
     * not release. */
    bool (*release_pin)(void *ud, uint64_t pin);

    /* Resilience events; NULL logs them (info for QUIESCED, error otherwise). */
    void (*resilience)(void *ud, const kvcr_resilience_event *event);
} kvcr_callbacks;

/* KV events (config version 2): KVCR's inventory published in the wire
 * format KV-aware routers read (vLLM's ZeroMQ KV events: Dynamo, llm-d).
 * Each batch is one message of exactly three frames: the topic, an 8-byte
 * big-endian sequence number, +1 a batch (from the wall clock in
 * microseconds when the stream opens, past an earlier process's numbers;
 * in guard mode on from where the group's stream stopped), and the msgpack
 * payload [timestamp float64, [events], dp_rank]; a subscription is
 * answered with an empty batch numbered as the next. Hashes are always
 * written in the 8-byte form. Events are BlockStored (a block
 * became resident in KVCR DRAM, medium medium_dram, or in G3, medium
 * medium_g3), BlockRemoved and AllBlocksCleared, as maps whose first key
 * is "type" (legacy_positional: the older arrays, tag first). Block hashes
 * are the key adapter's router hashes (callbacks.key_hash is required);
 * a block deposited without token ids (kvcr_deposit, or kvcr_deposit_ex
 * without them) is announced with its hashes only. Events are batched on
 * the publisher's own thread every batch_interval_ms or at
 * max_batch_events; a batch that finds max_queued_batches waiting, or a
 * subscriber whose queue is full, is dropped and counted (gauges
 * kv_events_dropped_batches), never waited for. The last buffer_batches
 * batches are kept for replay: a ROUTER socket at replay_endpoint takes an
 * 8-byte big-endian start sequence and answers every kept batch from there
 * as [seq, payload], then [0xFFFFFFFFFFFFFFFF, empty]. An endpoint is
 * bound when it holds "*", "::", "ipc://" or "inproc://", connected
 * otherwise. Inventory reaches the publisher inside kvcr_poll(), as it
 * reaches callbacks.inventory. */
typedef struct kvcr_kv_events_options {
    const char *endpoint;        /* ZeroMQ PUB endpoint; NULL: no events */
    const char *replay_endpoint; /* ZeroMQ ROUTER endpoint for replay; NULL: none */
    const char *topic;           /* first frame, e.g. "kv@<pod>@<model>"; default "" */
    uint32_t dp_rank;            /* the payload's data-parallel rank; default 0, at most 2^31-1 */
    uint32_t buffer_batches;     /* batches kept for replay; default 10000, 1..1048576 */
    uint32_t max_batch_events;   /* events per batch; default 256, 1..65536 */
    uint32_t batch_interval_ms;  /* longest wait of an event; default 10, 1..10000 */
    uint32_t max_queued_batches; /* batches waiting for the thread; default 1024, 1..1048576 */
    bool legacy_positional;      /* the older array form of events; default false */
    const char *medium_dram;     /* default "CPU" */
    const char *medium_g3;       /* default "STORAGE" */
} kvcr_kv_events_options;

#define KVCR_KV_EVENTS_MAX_NAME 256 /* bytes of an endpoint, topic or medium */

/* Tenants (config version 2): named shares of KVCR DRAM and G3, counted
 * in slots. A block belongs to at most one tenant, given by the call that
 * first makes it resident (the "tenant" member of a deposit's or fetch's
 * hints, see kvcr/policy.h kvcr_hints); it keeps that tenant while any
 * residency of it lives (a spill to G3 included). A quota is what the
 * tenant keeps when a tier is full: with a policy that has
 * KVCR_POLICY_TENANT_QUOTAS (the built-in "tenant_lru", "g3_tenant_lru")
 * blocks of tenants over their quota are evicted first, so a tenant that
 * floods the cache evicts its own blocks, not those of a tenant within its
 * quota. Free slots are anyone's; blocks without a tenant count against a
 * quota of 0. Rules: at most KVCR_MAX_TENANTS, names 1..KVCR_TENANT_NAME_MAX
 * bytes of [A-Za-z0-9_.-], unique; the dram_slots of all tenants together
 * at most the KVCR DRAM slots of local_dram (in guard mode: of the pools
 * the service grants, checked once the claim is granted; past them the
 * claim is given back and kvcr_create fails), the g3_slots at most
 * G3's slots, and g3_slots 0 without G3. Per-tenant gauges:
 * tenant_<name>_dram_slots, _dram_quota_slots, _g3_slots,
 * _g3_quota_slots, _dram_evicted_blocks (and no_tenant_* for blocks
 * without a tenant). Warm restarts (G3 files, guard mode) do not keep
 * tenants: recovered blocks have none. */
#define KVCR_MAX_TENANTS 64
#define KVCR_TENANT_NAME_MAX 63

typedef struct kvcr_tenant {
    const char *name;
    uint64_t dram_slots; /* KVCR DRAM slots (all pools together) it keeps */
    uint64_t g3_slots;   /* G3 slots it keeps */
} kvcr_tenant;

/* The layout of kvcr_config (and of its parts) this header declares;
 * kvcr_config_init stores it in kvcr_config.version. Version 2 appended
 * kv_events, then tenants; version 3 the peer table's limits. */
#define KVCR_CONFIG_VERSION 3

typedef struct kvcr_config {
    uint32_t version;                       /* first, in every version: kvcr_config_init sets it */
    const char *agent_name;                 /* required: this instance's end point name */
    const kvcr_pool_layout *pool_layouts;   /* required, >= 1 */
    size_t n_pool_layouts;

    const kvcr_dram_pool *local_dram;       /* KVCR-owned DRAM, one per pool (any order), or NULL */
    size_t n_local_dram;
    const char *local_dram_backend;         /* a compatibility name: any non-empty one (default
                                             * "UCX"); KVCR's copy threads memcpy */

    const kvcr_region *framework_regions;   /* framework memory, or NULL */
    size_t n_framework_regions;

    kvcr_remote_options remote;
    kvcr_g3_options g3;
    kvcr_guard_options guard;
    kvcr_limits limits;

    uint32_t operation_timeout_ms;          /* default 1000, > 0 */
    uint32_t abandon_timeout_ms;            /* default 5000, >= 2 * operation */
    double capacity_low_watermark_percent;  /* default 0 (off), 0..100 */
    bool enable_telemetry;                  /* default false */
    uint32_t copy_threads;                  /* default 2, 1..64 */

    const kvcr_policy_ops *policy;          /* NULL: the default (LRU) */
    void *policy_ud;

    kvcr_callbacks callbacks;

    /* version 2 */
    kvcr_kv_events_options kv_events;       /* default off */
    const kvcr_tenant *tenants;             /* default none (copied at create) */
    size_t n_tenants;

    /* version 3 */
    /* Limits of the peer tier's table of peers (kvcr_limits' rules: enforced,
     * counted as kvcr_limit_refusals{limit="peers"}); here, not in
     * kvcr_limits, because a part never grows in place. At most max_peers
     * targets have a route (a UCX endpoint and their published regions) on
     * this instance as a source, and at most max_peers sources a record as
     * a target. A target's metadata beyond it is not acknowledged, its
     * start_write refused with write_refused(busy) (its entries fail
     * SOURCE_BUSY); a route is reclaimed (its endpoint closed) once its
     * endpoint failed, or no write used it for peer_idle_ms, never while
     * a write is on it. Records of sources without a pull are reclaimed
     * least recently used first when the table is full, and after
     * peer_idle_ms. */
    uint32_t max_peers;                     /* default 1024; 1..65536 */
    uint32_t peer_idle_ms;                  /* default 300000; 100..86400000 */
} kvcr_config;

/* Fills *cfg, in the layout of config version `version`, with that
 * version and the defaults above; required fields are left NULL. Only the
 * bytes that version has are written. KVCR_EINVAL for a NULL cfg, and for
 * a version this library does not read: then only cfg->version is written
 * (kvcr_create refuses it with the same message). */
int kvcr_config_init_version(kvcr_config *cfg, uint32_t version);

/* kvcr_config_init_version with the version of this header: the way to
 * start every configuration (the library is told which layout the program
 * was built with). */
static inline void kvcr_config_init(kvcr_config *cfg)
{
    (void)kvcr_config_init_version(cfg, KVCR_CONFIG_VERSION);
}

/* ---- lifetime ----------------------------------------------------------- */

/* Validates *cfg completely, then starts the copy threads. Nothing is
 * started when validation fails. cfg->version says how much of *cfg there
 * is (see "ABI" above); an unknown version is refused first. The
 * configuration is copied, and so are its strings and key lists; the
 * memory it points at (pools, regions) and the policy table must outlive
 * the instance. */
int kvcr_create(const kvcr_config *cfg, kvcr_t **out);

/* Stops the instance: queued copies are cancelled, running ones are waited
 * for, every pending entry fails with KVCR_REASON_CLOSED, claims are
 * dropped. Later calls fail with KVCR_ECLOSED. A second close returns 0.
 * With the remote tier: poll_pins runs once more, pulls already sent are
 * probed and waited for (at most the abandon timeout; what is left is
 * reported UNCERTAIN through the resilience callback), pending pin requests
 * are cancelled, pins are released, and the control port and UCX are given
 * up. After close returns no KVCR thread touches registered memory. */
int kvcr_close(kvcr_t *kv);

/* Closes if needed, then releases the instance. No other thread may be
 * inside a call on it, and it must not be called from a callback. NULL is
 * fine. */
void kvcr_free(kvcr_t *kv);

/* A file descriptor that becomes readable when copies or operations
 * complete. Deadline expiry is found by kvcr_poll() itself and does not make
 * the fd readable: an event loop should wait on it with a timeout no longer
 * than operation_timeout_ms. */
int kvcr_fd(const kvcr_t *kv);

/* ---- operations ---------------------------------------------------------- */

/* deposit, deliver and fetch return KVCR_ELIMIT (and start nothing) while
 * limits.max_unpolled_operations operations are pending or completed and
 * not yet collected by kvcr_poll(). */

/* Where each key is now (advisory; changes nothing). request_id may be NULL.
 * out is the caller's array of n results, written in the layout of the
 * instance's config version. */
int kvcr_query(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
               kvcr_query_result *out);

#define KVCR_NO_EVICT 0x1u
/* kvcr_deposit_ex's flags and kvcr_fetch_options.flags: a hints' "tenant"
 * naming no configured tenant refuses the call (KVCR_EINVAL) instead of
 * giving its blocks no tenant (see kvcr_deposit_options.hints). */
#define KVCR_STRICT_TENANT 0x2u

/* Copies framework memory into KVCR DRAM. With KVCR_NO_EVICT each stored
 * entry also returns a release handle that keeps the block resident. */
int kvcr_deposit(kvcr_t *kv, const kvcr_block *blocks, size_t n, unsigned flags,
                 kvcr_op_handle *op);

/* What a router needs to know of a block besides its router hash, so
 * that the KV events (kvcr_config.kv_events) announce it the way engines
 * do: given at deposit, kept while KVCR holds the block (by its router
 * hash, while a residency of it lives), announced in its BlockStored.
 * Every field is optional. Without token ids a block is announced with
 * its hashes only (llm-d then only updates where known blocks live;
 * Dynamo, which computes its hashes from the tokens, drops it). Kept in
 * the block's G3 record and recovery-journal PUT as well, so that a warm
 * restart (G3 files) and the Guard announce it again, as far as it fits
 * (a G3 record: 208 bytes of key, tenant and metadata together, e.g. 16
 * tokens and a parent in 79 of them; a journal PUT: 4 KiB): beyond, in
 * memory only (gauge kv_events_meta_unkept), and after a restart the block
 * is announced by its hashes alone. Ignored without kv_events. */
#define KVCR_ROUTER_MAX_TOKENS 65536 /* tokens of one block */
#define KVCR_ROUTER_MAX_EXTRA 64     /* extra keys of one block */

typedef struct kvcr_router_block {
    bool has_parent;               /* parent_hash is the previous block's router hash */
    uint64_t parent_hash;
    const uint32_t *token_ids;     /* the block's block_size_tokens tokens, or NULL */
    uint32_t block_size_tokens;    /* tokens per block; 0: unknown (no token ids then) */
    const char *lora_name;         /* NULL: none */
    const char *const *extra_keys; /* n_extra_keys strings (multimodal hashes, cache salt) */
    uint32_t n_extra_keys;         /* 0..KVCR_ROUTER_MAX_EXTRA */
} kvcr_router_block;

/* Options of kvcr_deposit_ex, a struct of its own version (fields are only
 * appended, with a new version; see "ABI" above). */
#define KVCR_DEPOSIT_OPTIONS_VERSION 2

typedef struct kvcr_deposit_options {
    uint32_t version;                 /* KVCR_DEPOSIT_OPTIONS_VERSION */
    unsigned flags;                   /* KVCR_NO_EVICT, KVCR_STRICT_TENANT */
    const kvcr_router_block *router;  /* NULL, or one per block */
    /* The deposit's framework hints, a JSON object (kvcr/policy.h
     * kvcr_hints: a version-2 policy's decide_ingest_hints sees them as
     * they are). They are the framework's: KVCR reads only a "tenant"
     * member, and only when config.tenants are configured: a string
     * naming a configured tenant gives the new blocks that tenant; any
     * other value (another name, a number) gives them none, counted in
     * the gauge hints_unknown_tenant and logged at most once a second
     * (KVCR_STRICT_TENANT: refused instead, KVCR_EINVAL). Checked before
     * anything starts: strict JSON, an object (KVCR_EINVAL), at most
     * limits.max_hint_bytes (KVCR_ELIMIT). */
    const char *hints;                /* JSON text, NULL: none */
    size_t hints_len;
    /* version 2 */
    /* NULL, or one per block (router required): NULL, or the block's
     * extra keys as JSON text, an array of strings, non-negative integers
     * and arrays of them, e.g. ["salt", ["mm-hash", 0]]: vLLM's extra keys
     * (a tuple is an array). Its BlockStored carries them packed as vLLM
     * packs them (str, int, array), at most 64 keys, 64 per array, strings
     * of at most 256 bytes, 4096 bytes packed. Given for a block, the
     * block's router.extra_keys must be empty (KVCR_EINVAL). */
    const char *const *router_extra;
} kvcr_deposit_options;

/* kvcr_deposit with options: opts->flags as kvcr_deposit's flags, and per
 * block what a router needs (kvcr_router_block; strings at most
 * KVCR_KV_EVENTS_MAX_NAME - 1 bytes). A refused call starts nothing and
 * keeps nothing. */
int kvcr_deposit_ex(kvcr_t *kv, const kvcr_block *blocks, size_t n,
                    const kvcr_deposit_options *opts, kvcr_op_handle *op);

/* Copies cached blocks into framework destinations. */
int kvcr_deliver(kvcr_t *kv, const kvcr_block *blocks, size_t n, const char *request_id,
                 kvcr_op_handle *op);

/* Makes keys resident in KVCR DRAM and claims them; each success carries the
 * slots and a release handle. expected_layout names the pool of each layout
 * entry (NULL: the single pool ""). Duplicate keys are answered once. */
int kvcr_fetch(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
               const char *const *expected_layout, size_t layout_len, kvcr_op_handle *op);

/* What a fetch may say beyond its keys, a struct of its own version
 * (fields are only appended, with a new version). hints: the
 * fetch's framework hints, a JSON object (see kvcr/policy.h kvcr_hints: the
 * policy's decide_ingest_hints sees them for every fill the fetch starts,
 * with the router hint kept for request_id; a "tenant" member names the
 * tenant the filled blocks take when they have none). Checked before
 * anything starts: strict JSON, an object, a tenant that is configured
 * (KVCR_EINVAL), at most limits.max_hint_bytes (KVCR_ELIMIT). */
#define KVCR_FETCH_OPTIONS_VERSION 2

typedef struct kvcr_fetch_options {
    uint32_t version;  /* KVCR_FETCH_OPTIONS_VERSION */
    const char *hints; /* JSON text, NULL: none (as kvcr_deposit_options.hints) */
    size_t hints_len;
    /* version 2 */
    unsigned flags;    /* KVCR_STRICT_TENANT */
} kvcr_fetch_options;

/* kvcr_fetch with options; opts NULL is kvcr_fetch. */
int kvcr_fetch_ex(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
                  const char *const *expected_layout, size_t layout_len,
                  const kvcr_fetch_options *opts, kvcr_op_handle *op);

/* Ends claims. released[i] tells whether handles[i] was a live claim. */
int kvcr_release(kvcr_t *kv, const kvcr_release_handle *handles, size_t n, bool *released);

/* Best-effort cancellation of a pending operation, whole (keys NULL) or for
 * the listed keys. Entries whose copy has not started fail with
 * KVCR_REASON_ABORTED; running copies finish normally. *n_aborted (may be
 * NULL) counts the entries cancelled; KVCR_ENOENT if op is not pending. */
int kvcr_abort(kvcr_t *kv, kvcr_op_handle op, const kvcr_key *keys, size_t n,
               size_t *n_aborted);

/* Collects every operation completed since the last poll, in completion
 * order, and runs pending callbacks. *results is one allocation (NULL when
 * *n is 0) that the caller owns, with everything it points to (entries,
 * keys' bytes, slots) inside it: valid until kvcr_results_free(), also
 * after kvcr_free(). The slots' addresses are KVCR DRAM, which stays
 * claimed until the entry's release handle is released. */
int kvcr_poll(kvcr_t *kv, kvcr_op_result **results, size_t *n);
void kvcr_results_free(kvcr_op_result *results);

/* Router hints: the router's kv_hint envelope (protocol 0.1, action
 * kv.fetch 1.0) as JSON text, validated strictly (block hashes are exact
 * u64 integers); a refused hint changes nothing and its message names the
 * rule. With a request_id the hint is kept for that request: the same source
 * again replaces the hash set, a different source fails the request closed.
 * request_id NULL stores nothing. With the remote tier on, the hinted keys
 * of the request are FETCHABLE / REMOTE_G2 (every key with
 * opportunistic_query), deliver and fetch pull them from the source, and
 * eager_ctrl_connect publishes this instance to the source at once. A
 * source this instance may not talk to (CURVE: no key or a key not
 * allowed; plaintext: a keyed endpoint) is refused with KVCR_EINVAL.
 * KVCR_ELIMIT: the text is longer than limits.max_hint_bytes, or a new
 * request_id would keep more than limits.max_hinted_requests. */
int kvcr_submit_hint(kvcr_t *kv, const char *request_id, const char *json, size_t len);
/* Forgets the request's hint; an unknown request_id is not an error. */
int kvcr_discard_hint(kvcr_t *kv, const char *request_id);

/* Gives keys[0..n), one prefix sequence in its order, one recency in KVCR
 * DRAM: every block among them that is READY there takes the newest
 * last-access time among them (the current time with use_current_time),
 * and the policy is asked for its eviction score again. Among blocks of
 * equal score the sequence's tail is evicted first, so LRU keeps a
 * prefix's head longest. Keys KVCR DRAM does not hold are skipped; a key
 * listed twice counts where it first stands. G3 keeps its own order. */
int kvcr_align_sequence(kvcr_t *kv, const kvcr_key *keys, size_t n, bool use_current_time);

/* Answer to request_pin: pin is the framework's non-zero handle for the
 * pin, or 0 when the pin failed. blocks lists exactly the requested keys,
 * each with its framework references, or n_refs 0 when that key is not
 * available. A result that breaks a rule is refused with KVCR_EINVAL and its
 * pin released; a result nobody waits for any more is released too. */
int kvcr_pin_complete(kvcr_t *kv, uint64_t req, uint64_t pin, const kvcr_block *blocks,
                      size_t n);

/* "tcp://<advertise_host>:<port>" of this instance's control channel (the
 * port chosen when control_port was 0), followed by "#curve=<public key>"
 * with CURVE, or NULL without the remote tier. The string belongs to the
 * instance and does not change: valid until kvcr_free(), also after
 * kvcr_close(). */
const char *kvcr_control_endpoint(const kvcr_t *kv);

/* The interval's telemetry (see kvcr/stats.h). *out is NULL when telemetry
 * is off. The snapshot is one allocation the caller owns, every string
 * and array it points to inside it: valid until kvcr_stats_free(), also
 * after kvcr_free(). */
int kvcr_stats_take(kvcr_t *kv, kvcr_stats **out);

/* The pool layouts' names, as configured (index = kvcr_slot_ref.pool), or
 * NULL for an index out of range. The instance's own copy: valid until
 * kvcr_free(). */
const char *kvcr_pool_name(const kvcr_t *kv, uint32_t pool);

#ifdef __cplusplus
}
#endif
#endif
