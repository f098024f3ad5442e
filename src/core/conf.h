/* The validated, immutable configuration of an instance (built by
 * api/config.c before anything starts, never changed afterwards). The
 * core and every tier may read it without the instance lock. */
#ifndef KVCR_CORE_CONF_H
#define KVCR_CORE_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

/* A registered framework region, resolved from kvcr_region. */
typedef struct fw_region {
    uint8_t *addr;
    size_t element_size, count, stride;
    char label[KVCR_NAME_MAX];
    kvcr_mem_type mem_type;
    int device_id;
    uint32_t pool; /* the pool its label names */
    bool part;     /* labelled "pool:part": one part of each of the pool's blocks */
} fw_region;

/* ---- framework memory: references to pieces (core/pieces.c) ----------------
 *
 * A block of one pool lives in the framework's memory either whole, in the
 * element of one region labelled with the pool's name, or in parts: one
 * element of each region labelled "pool:<part>", in registration order (a
 * layer-first host layout: a K and a V piece per layer). A reference names
 * a whole region by its label, or every part at once with "pool:*". The
 * same resolution serves our own regions (copies, checks) and a peer's
 * published ones (where a source writes a pull), so both sides agree on
 * what each byte of a block is. */

/* One region as the resolver sees it: ours, or one a peer published. */
typedef struct region_geom {
    const char *label;
    bool framework;                /* framework memory, or a KVCR DRAM pool */
    uint64_t addr, element_size, stride, count;
} region_geom;

/* A contiguous piece of one element: where, how long, which region. */
typedef struct mem_piece {
    uint64_t addr;
    uint64_t len;
    uint32_t region;
} mem_piece;

#define PIECES_MAX 256 /* pieces of one reference: a pool's parts */
#define PART_ALL ":*"  /* the suffix that names every part of a pool */

/* Any thread, no lock: resolves (framework, label, index) against the
 * regions g[0..n): a label names one region exactly; "pool:*" names every
 * framework region labelled "pool:<part>", in table order. Writes the
 * pieces to out[PIECES_MAX] and returns their count, or 0 with *why set
 * to the rule broken (no such region, or "index out of range": then
 * out[0].region is the region the index is out of). */
uint32_t pieces_resolve(const region_geom *g, size_t n, bool framework, const char *label,
                        uint64_t index, mem_piece *out, const char **why);
/* The length of the pool name a region label starts with: the whole label,
 * or what precedes its last ':' when it has one (pool names themselves are
 * looked up whole first, see the callers). */
size_t pieces_pool_len(const char *label);

/* A copy or a write between two lists of pieces covering the same bytes
 * (a KVCR slot and a framework block, or a source and a peer's block). */
typedef struct piece_pair {
    uint64_t a, b, len;
    uint32_t a_region, b_region;
} piece_pair;
/* Walks a[0..na) and b[0..nb) side by side: one pair per run that stays
 * within one piece of each (at most na + nb - 1). Both lists must cover the
 * same number of bytes (checked by the caller); returns the pairs written. */
uint32_t pieces_pair(const mem_piece *a, uint32_t na, const mem_piece *b, uint32_t nb,
                     piece_pair *out);

/* The validated, owned copy of kvcr_config. */
typedef struct kvcr_conf {
    char agent_name[KVCR_NAME_MAX];
    uint32_t n_pools;
    bool has_local_dram;
    fw_region *regions;
    size_t n_regions;
    region_geom *geom;          /* regions[i] as the resolver sees it */
    char **part_labels;         /* per pool: "pool:*" when its blocks are in parts, else NULL */
    kvcr_remote_options remote; /* strings point into the buffers below */
    char control_host[KVCR_NAME_MAX], advertise_host[KVCR_NAME_MAX];
    /* remote.curve's keys, copied (curve_keys: the allowed ones, each
     * KVCR_CURVE_KEY_LEN + 1 bytes, pointed to by curve_allowed) */
    char curve_secret[KVCR_CURVE_KEY_LEN + 1], curve_public[KVCR_CURVE_KEY_LEN + 1];
    char *curve_keys;
    const char **curve_allowed;
    kvcr_g3_options g3;      /* paths copied into g3_paths; n_paths 0: no G3 */
    char **g3_paths;
    uint32_t operation_timeout_ms, abandon_timeout_ms;
    double watermark_percent;
    bool enable_telemetry;
    uint32_t copy_threads;
    kvcr_limits limits;
    uint32_t max_peers, peer_idle_ms; /* the peer table's limits (kvcr_config) */
    const kvcr_policy_ops *policy;
    void *policy_ud;
    kvcr_callbacks cb;
    /* KV events: the strings copied into the buffers below (endpoint ""
     * when off, replay "" when none) */
    kvcr_kv_events_options kv_events;
    char kv_endpoint[KVCR_KV_EVENTS_MAX_NAME], kv_replay[KVCR_KV_EVENTS_MAX_NAME],
        kv_topic[KVCR_KV_EVENTS_MAX_NAME], kv_medium_dram[KVCR_KV_EVENTS_MAX_NAME],
        kv_medium_g3[KVCR_KV_EVENTS_MAX_NAME];
    /* Tenants (core/tenants.h): tenant i + 1 is tenants[i]; names copied */
    uint32_t n_tenants;
    char tenant_names[KVCR_MAX_TENANTS][KVCR_TENANT_NAME_MAX + 1];
    uint64_t tenant_dram_quota[KVCR_MAX_TENANTS], tenant_g3_quota[KVCR_MAX_TENANTS];
} kvcr_conf;

#endif
