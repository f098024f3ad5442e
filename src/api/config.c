#include "api/config.h"
#include "api/abi.h"

#include "kvcr/options.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "net/control.h"
#include "net/json.h"
#include "net/wire.h"
#include "tiers/g3_store.h"
#include "util/api.h"

_Static_assert(KVCR_MAX_CONTROL_MESSAGE == WIRE_MAX_MESSAGE, "the public bound is the decoder's");
_Static_assert(KVCR_MAX_HINT_TEXT == JSON_MAX_TEXT, "the public bound is the JSON reader's");
_Static_assert(KVCR_CURVE_KEY_LEN == CTL_KEY_LEN, "the public key length is the channel's");

/* ---- the options table (src/api/options.def, kvcr/options.h) ------------ */

/* What is made of the table: the rows (static), the defaults, the checks.
 * None of it touches an instance or shared state: any thread, no lock. */

/* The named rules a row may have beyond RANGE / BOUNDS / POSITIVE. */
enum opt_rule { OPT_NONE, OPT_RANGE, OPT_BOUNDS, OPT_POSITIVE, OPT_ABANDON, OPT_PER_PEER,
                OPT_DP_RANK };
enum opt_group { OPT_G_CONFIG, OPT_G_LIMITS, OPT_G_REMOTE, OPT_G_G3, OPT_G_GUARD,
                 OPT_G_KV_EVENTS };

#define OPT_V_BOOL .u
#define OPT_V_U16 .u
#define OPT_V_U32 .u
#define OPT_V_U64 .u
#define OPT_V_F64 .d
#define OPT_V_STR .s
#define OPT_C_BOOL bool
#define OPT_C_U16 uint16_t
#define OPT_C_U32 uint32_t
#define OPT_C_U64 uint64_t
#define OPT_C_F64 double
#define OPT_C_STR const char *
#define OPT_NAME_NONE "none"
#define OPT_NAME_RANGE "range"
#define OPT_NAME_BOUNDS "bounds"
#define OPT_NAME_POSITIVE "positive"
#define OPT_NAME_ABANDON "abandon"
#define OPT_NAME_PER_PEER "per_peer"
#define OPT_NAME_DP_RANK "dp_rank"

/* A row's type is its field's: a wrong type column does not compile. */
#define X(group, path, label, type, def, lo, hi, rule, since, py, doc)                        \
    _Static_assert(_Generic(((kvcr_config *)0)->path, OPT_C_##type: 1, default: 0),          \
                   #path " is not " #type);
#include "api/options.def"
#undef X

static const kvcr_option opt_rows[] = {
#define X(group, path, label, type, def, lo, hi, rule, since, py, doc)                        \
    {#path, label, KVCR_OPT_##type, offsetof(kvcr_config, path), {OPT_V_##type = (def)},     \
     {OPT_V_##type = (lo)}, {OPT_V_##type = (hi)}, OPT_NAME_##rule, since, py, doc},
#include "api/options.def"
#undef X
};

#define N_OPTS (sizeof opt_rows / sizeof opt_rows[0])

static const struct {
    enum opt_group group;
    enum opt_rule rule;
} opt_checks[N_OPTS] = {
#define X(group, path, label, type, def, lo, hi, rule, since, py, doc) {group, OPT_##rule},
#include "api/options.def"
#undef X
};

KVCR_API const kvcr_option *kvcr__options(size_t *n)
{
    if (n != NULL) *n = N_OPTS;
    return opt_rows;
}

KVCR_API const kvcr_option *kvcr__option(const char *path)
{
    for (size_t i = 0; path != NULL && i < N_OPTS; i++)
        if (strcmp(opt_rows[i].path, path) == 0) return &opt_rows[i];
    return NULL;
}

void kvcr__config_defaults(kvcr_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
#define X(group, path, label, type, def, lo, hi, rule, since, py, doc) cfg->path = (def);
#include "api/options.def"
#undef X
}

/* The value of an integer row's field, widened. */
static uint64_t opt_uint(const kvcr_config *cfg, const kvcr_option *o)
{
    const char *p = (const char *)cfg + o->offset;
    uint16_t v16;
    uint32_t v32;
    uint64_t v64;
    bool b;
    switch (o->type) {
    case KVCR_OPT_BOOL: memcpy(&b, p, sizeof b); return b;
    case KVCR_OPT_U16: memcpy(&v16, p, sizeof v16); return v16;
    case KVCR_OPT_U32: memcpy(&v32, p, sizeof v32); return v32;
    default: memcpy(&v64, p, sizeof v64); return v64;
    }
}

/* The largest value an integer row's field holds; 0 for F64 and STR. */
static uint64_t opt_top(const kvcr_option *o)
{
    switch (o->type) {
    case KVCR_OPT_BOOL: return 1;
    case KVCR_OPT_U16: return UINT16_MAX;
    case KVCR_OPT_U32: return UINT32_MAX;
    case KVCR_OPT_U64: return UINT64_MAX;
    default: return 0;
    }
}

KVCR_API int kvcr__option_set(kvcr_config *cfg, const kvcr_option *o, uint64_t v)
{
    /* Compared as integers: o may point anywhere. */
    size_t i = ((uintptr_t)o - (uintptr_t)opt_rows) / sizeof *o;
    if (cfg == NULL || o == NULL || i >= N_OPTS || &opt_rows[i] != o)
        return kvcr_fail(KVCR_EINVAL, "kvcr__option_set: NULL or not a row of the table");
    if (o->type == KVCR_OPT_F64 || o->type == KVCR_OPT_STR || v > opt_top(o))
        return kvcr_fail(KVCR_EINVAL, "%s does not hold %" PRIu64, o->path, v);
    char *p = (char *)cfg + o->offset;
    bool b = v != 0;
    uint16_t v16 = (uint16_t)v;
    uint32_t v32 = (uint32_t)v;
    switch (o->type) {
    case KVCR_OPT_BOOL: memcpy(p, &b, sizeof b); break;
    case KVCR_OPT_U16: memcpy(p, &v16, sizeof v16); break;
    case KVCR_OPT_U32: memcpy(p, &v32, sizeof v32); break;
    default: memcpy(p, &v, sizeof v); break;
    }
    return 0;
}

/* The named rules, each with the message it always had. */
static int opt_named(const kvcr_config *cfg, const kvcr_option *o, enum opt_rule rule,
                     uint64_t v)
{
    uint64_t op = cfg->operation_timeout_ms, writes = cfg->limits.max_source_writes;
    switch (rule) {
    case OPT_ABANDON:
        if (v >= 2 * op) return 0;
        /* Frameworks pass both from their own configuration (vLLM's kvcr
         * tier config): say which value would be accepted. */
        return kvcr_fail(KVCR_EINVAL,
                         "abandon_timeout_ms must be at least twice operation_timeout_ms "
                         "(%" PRIu64 " < 2 x %" PRIu64 "): set abandon_timeout_ms to %" PRIu64
                         " or more", v, op, 2 * op);
    case OPT_PER_PEER:
        if (v >= o->min.u && v <= writes) return 0;
        return kvcr_fail(KVCR_EINVAL,
                         "%s must be between %" PRIu64 " and limits.max_source_writes (%" PRIu64
                         ") (got %" PRIu64 ")", o->label, o->min.u, writes, v);
    case OPT_DP_RANK:
        if (v <= o->max.u) return 0;
        /* Dynamo decodes the payload's dp_rank as a signed 32-bit integer
         * and refuses every batch of a larger one. */
        return kvcr_fail(KVCR_EINVAL, "%s must be at most %" PRIu64 " (Dynamo reads it as "
                         "a signed 32-bit integer), got %" PRIu64, o->label, o->max.u, v);
    default: return 0;
    }
}

/* One row's rule on cfg's value. */
static int opt_check(const kvcr_config *cfg, const kvcr_option *o, enum opt_rule rule)
{
    if (o->type == KVCR_OPT_F64) {
        double d;
        memcpy(&d, (const char *)cfg + o->offset, sizeof d);
        if (rule == OPT_NONE || (d >= o->min.d && d <= o->max.d)) return 0; /* NaN is out */
        return kvcr_fail(KVCR_EINVAL, "%s must be between %g and %g", o->label, o->min.d,
                         o->max.d);
    }
    if (o->type == KVCR_OPT_STR || rule == OPT_NONE) return 0;
    uint64_t v = opt_uint(cfg, o);
    if (rule != OPT_RANGE && rule != OPT_BOUNDS && rule != OPT_POSITIVE)
        return opt_named(cfg, o, rule, v);
    if (v >= o->min.u && v <= o->max.u) return 0;
    if (rule == OPT_POSITIVE) return kvcr_fail(KVCR_EINVAL, "%s must be positive", o->label);
    if (rule == OPT_BOUNDS)
        return kvcr_fail(KVCR_EINVAL, "%s must be between %" PRIu64 " and %" PRIu64, o->label,
                         o->min.u, o->max.u);
    return kvcr_fail(KVCR_EINVAL, "%s must be between %" PRIu64 " and %" PRIu64 " (got %" PRIu64
                     ")", o->label, o->min.u, o->max.u, v);
}

/* The rules of one group's rows, in the table's order; the ranges keep
 * every product of a limit and a per-item size far from overflow. */
static int check_group(const kvcr_config *cfg, enum opt_group g)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        if (opt_checks[i].group != g) continue;
        int rc = opt_check(cfg, &opt_rows[i], opt_checks[i].rule);
        if (rc != 0) return rc;
    }
    return 0;
}

static bool name_ok(const char *s)
{
    return s != NULL && strlen(s) < KVCR_NAME_MAX;
}

static int check_pool_layouts(const kvcr_config *cfg)
{
    if (cfg->pool_layouts == NULL || cfg->n_pool_layouts == 0)
        return kvcr_fail(KVCR_EINVAL, "pool_layouts must contain at least one pool");
    if (cfg->n_pool_layouts > KVCR_MAX_POOLS)
        return kvcr_fail(KVCR_EINVAL, "pool_layouts may hold at most %d pools", KVCR_MAX_POOLS);
    for (size_t i = 0; i < cfg->n_pool_layouts; i++) {
        if (cfg->pool_layouts[i].name == NULL)
            return kvcr_fail(KVCR_EINVAL, "pool_layouts pool name must be a string");
        if (!name_ok(cfg->pool_layouts[i].name))
            return kvcr_fail(KVCR_EINVAL, "pool_layouts pool name must be shorter than %d bytes",
                             KVCR_NAME_MAX);
    }
    for (size_t i = 0; i < cfg->n_pool_layouts; i++)
        if (cfg->pool_layouts[i].block_size == 0)
            return kvcr_fail(KVCR_EINVAL, "pool_layouts block size must be a positive integer");
    for (size_t i = 0; i < cfg->n_pool_layouts; i++)
        for (size_t j = i + 1; j < cfg->n_pool_layouts; j++)
            if (strcmp(cfg->pool_layouts[i].name, cfg->pool_layouts[j].name) == 0)
                return kvcr_fail(KVCR_EINVAL, "pool_layouts pool names must be unique");
    if (cfg->n_pool_layouts > 1)
        for (size_t i = 0; i < cfg->n_pool_layouts; i++)
            if (cfg->pool_layouts[i].name[0] == '\0')
                return kvcr_fail(KVCR_EINVAL,
                                 "pool_layouts cannot use an empty name with multiple pools");
    return 0;
}

/* The tier values a policy needs but the configuration lacks, sorted by
 * value ("DRAM, G3"), as the Python package names CacheTier values. */
static int check_policy(const kvcr_config *cfg, const kvcr_policy_ops *p)
{
    int rc = kvcr__policy_check(p); /* its version says which fields it has */
    if (rc != 0) return rc;
    bool ingest = p->decide_ingest != NULL || (p->version >= 2 && p->decide_ingest_hints);
    if (!ingest || p->eviction_score == NULL || p->decide_eviction == NULL)
        return kvcr_fail(KVCR_EINVAL,
                         "policy '%s' must provide decide_ingest, eviction_score and "
                         "decide_eviction",
                         p->name ? p->name : "?");
    if (p->version >= 2 && (p->flags & ~KVCR_POLICY_TENANT_QUOTAS))
        return kvcr_fail(KVCR_EINVAL, "policy '%s' has unknown flags %#x",
                         p->name ? p->name : "?", p->flags & ~KVCR_POLICY_TENANT_QUOTAS);
    bool has_dram = cfg->local_dram != NULL && cfg->n_local_dram > 0;
    bool miss_dram = (p->required_tiers & KVCR_TIER_BIT(KVCR_TIER_LOCAL_G2)) && !has_dram;
    bool miss_g3 = (p->required_tiers & KVCR_TIER_BIT(KVCR_TIER_G3)) && cfg->g3.n_paths == 0;
    if (miss_dram || miss_g3)
        return kvcr_fail(KVCR_EINVAL, "%s requires configured %s%s%s", p->name ? p->name : "policy",
                         miss_dram ? "DRAM" : "", miss_dram && miss_g3 ? ", " : "",
                         miss_g3 ? "G3" : "");
    return 0;
}

/* G3's rules on the rest of the configuration; the files' own rules (paths,
 * slot size, capacity, locks, O_DIRECT) are checked when they are opened. */
static int check_g3(const kvcr_config *cfg)
{
    const kvcr_g3_options *g = &cfg->g3;
    if (g->n_paths == 0 && g->paths == NULL) return 0;
    int rc = g3_paths_check(g->paths, g->n_paths);
    if (rc != 0) return rc;
    if (g->backend != NULL && g->backend[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "G3 backend must be non-empty");
    rc = check_group(cfg, OPT_G_G3);
    if (rc != 0) return rc;
    if (cfg->local_dram == NULL || cfg->n_local_dram == 0)
        return kvcr_fail(KVCR_EINVAL, "G3 requires local DRAM");
    if (cfg->n_pool_layouts != 1)
        return kvcr_fail(KVCR_EINVAL, "G3 supports exactly one pool layout");
    return 0;
}

/* The secret key is never quoted in a message; public keys may be. */
static int check_curve(const kvcr_curve_options *k)
{
    if (k->secret_key == NULL) return 0; /* CURVE off */
    if (!zmq_has("curve"))
        return kvcr_fail(KVCR_ENOTSUP, "remote curve requested, but this libzmq was built "
                                       "without CURVE support (libsodium)");
    if (!ctl_key_ok(k->secret_key))
        return kvcr_fail(KVCR_EINVAL, "remote curve secret_key is not a Z85 key (%d characters)",
                         KVCR_CURVE_KEY_LEN);
    char derived[KVCR_CURVE_KEY_LEN + 1];
    if (zmq_curve_public(derived, k->secret_key) != 0)
        return kvcr_fail(KVCR_EINVAL, "remote curve secret_key: zmq_curve_public failed");
    if (k->public_key != NULL && !ctl_key_ok(k->public_key))
        return kvcr_fail(KVCR_EINVAL, "remote curve public_key '%.48s' is not a Z85 key (%d "
                         "characters)", k->public_key, KVCR_CURVE_KEY_LEN);
    if (k->public_key != NULL && strcmp(k->public_key, derived) != 0)
        return kvcr_fail(KVCR_EINVAL, "remote curve public_key %s does not belong to secret_key "
                         "(its public key is %s)", k->public_key, derived);
    if (k->n_allowed_keys == 0 || k->allowed_keys == NULL)
        return kvcr_fail(KVCR_EINVAL, "remote curve allowed_keys must list at least one peer "
                                      "public key when CURVE is on");
    if (k->n_allowed_keys > KVCR_CURVE_MAX_KEYS)
        return kvcr_fail(KVCR_EINVAL, "remote curve allowed_keys has %zu keys, at most %d",
                         k->n_allowed_keys, KVCR_CURVE_MAX_KEYS);
    for (size_t i = 0; i < k->n_allowed_keys; i++)
        if (!ctl_key_ok(k->allowed_keys[i]))
            return kvcr_fail(KVCR_EINVAL, "remote curve allowed_keys[%zu] '%.48s' is not a Z85 "
                             "key (%d characters)", i, k->allowed_keys[i] ? k->allowed_keys[i] : "(null)",
                             KVCR_CURVE_KEY_LEN);
    return 0;
}

/* Owned copies of the keys (checked), pointed to by out->remote.curve. */
static int copy_curve(const kvcr_curve_options *k, kvcr_conf *out)
{
    if (k->secret_key == NULL) return 0;
    size_t n = k->n_allowed_keys, w = KVCR_CURVE_KEY_LEN + 1;
    out->curve_keys = malloc(n * w);
    out->curve_allowed = calloc(n, sizeof *out->curve_allowed);
    if (out->curve_keys == NULL || out->curve_allowed == NULL)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        memcpy(out->curve_keys + i * w, k->allowed_keys[i], w);
        out->curve_allowed[i] = out->curve_keys + i * w;
    }
    memcpy(out->curve_secret, k->secret_key, w);
    zmq_curve_public(out->curve_public, k->secret_key);
    out->remote.curve = (kvcr_curve_options){out->curve_secret, out->curve_public,
                                             out->curve_allowed, n};
    return 0;
}

/* The options' own rules hold with the tier off as well, so a value is
 * refused wherever it is given (the Python package passes them always);
 * what needs the tier (the transport, keys, hosts) only with it on. */
static int check_remote(const kvcr_config *cfg)
{
    const kvcr_remote_options *r = &cfg->remote;
    int rc = check_group(cfg, OPT_G_REMOTE);
    if (rc != 0) return rc;
    if (r->backend == NULL || r->backend[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "remote backend name must be non-empty");
    const kvcr_curve_options *k = &r->curve;
    if (k->secret_key == NULL &&
        (k->public_key != NULL || k->n_allowed_keys != 0 || k->allowed_keys != NULL))
        return kvcr_fail(KVCR_EINVAL, "remote curve: public_key or allowed_keys given without "
                                      "secret_key (CURVE is on only with a secret key)");
    if (!r->enabled) return 0;
    rc = check_curve(k);
    if (rc != 0) return rc;
    if (strcmp(r->backend, "UCX") != 0)
        return kvcr_fail(KVCR_ENOTSUP, "remote backend '%s' is not supported (only \"UCX\")",
                         r->backend);
    const char *hosts[2] = {r->control_host, r->advertise_host};
    for (int i = 0; i < 2; i++) {
        const char *h = hosts[i];
        if (h == NULL) continue; /* the default */
        bool ok = h[0] != '\0' && strlen(h) < 100;
        for (const char *c = h; ok && *c; c++) ok = *c > ' ' && *c != ':' && *c != '/' && *c < 127;
        if (!ok)
            return kvcr_fail(KVCR_EINVAL, "remote %s '%s' must be a host name or IPv4 address",
                             i == 0 ? "control_host" : "advertise_host", h);
    }
    return 0;
}

/* A KV-event string: NULL when optional, else shorter than the bound;
 * an endpoint also names its transport. */
static int check_kv_string(const char *s, const char *what, bool optional, bool endpoint)
{
    if (s == NULL)
        return optional ? 0 : kvcr_fail(KVCR_EINVAL, "kv_events.%s must be a string", what);
    if (strlen(s) >= KVCR_KV_EVENTS_MAX_NAME)
        return kvcr_fail(KVCR_EINVAL, "kv_events.%s must be shorter than %d bytes", what,
                         KVCR_KV_EVENTS_MAX_NAME);
    if (endpoint && strstr(s, "://") == NULL)
        return kvcr_fail(KVCR_EINVAL, "kv_events.%s must be a ZeroMQ endpoint "
                         "(transport://address, e.g. tcp://*:5557), got '%s'", what, s);
    if (!endpoint && !optional && s[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "kv_events.%s must not be empty", what);
    return 0;
}

/* The KV-event options; the ranges are checked even when no endpoint
 * turns the publisher on. */
static int check_kv_events(const kvcr_config *cfg)
{
    const kvcr_kv_events_options *k = &cfg->kv_events;
    int rc = check_group(cfg, OPT_G_KV_EVENTS);
    if (rc == 0) rc = check_kv_string(k->endpoint, "endpoint", true, true);
    if (rc == 0) rc = check_kv_string(k->replay_endpoint, "replay_endpoint", true, true);
    if (rc == 0) rc = check_kv_string(k->topic, "topic", true, false);
    if (rc == 0) rc = check_kv_string(k->medium_dram, "medium_dram", false, false);
    if (rc == 0) rc = check_kv_string(k->medium_g3, "medium_g3", false, false);
    if (rc == 0 && k->endpoint == NULL && k->replay_endpoint != NULL)
        rc = kvcr_fail(KVCR_EINVAL, "kv_events.replay_endpoint needs kv_events.endpoint");
    if (rc == 0 && k->endpoint != NULL && cfg->callbacks.key_hash == NULL)
        rc = kvcr_fail(KVCR_EINVAL, "kv_events.endpoint needs callbacks.key_hash: events "
                       "name blocks by their router hash");
    return rc;
}

static void copy_kv_events(const kvcr_config *cfg, kvcr_conf *out)
{
    const kvcr_kv_events_options *k = &cfg->kv_events;
    out->kv_events = *k;
    snprintf(out->kv_endpoint, sizeof out->kv_endpoint, "%s", k->endpoint ? k->endpoint : "");
    snprintf(out->kv_replay, sizeof out->kv_replay, "%s",
             k->replay_endpoint ? k->replay_endpoint : "");
    snprintf(out->kv_topic, sizeof out->kv_topic, "%s", k->topic ? k->topic : "");
    snprintf(out->kv_medium_dram, sizeof out->kv_medium_dram, "%s", k->medium_dram);
    snprintf(out->kv_medium_g3, sizeof out->kv_medium_g3, "%s", k->medium_g3);
    out->kv_events.endpoint = out->kv_endpoint;
    out->kv_events.replay_endpoint = out->kv_replay;
    out->kv_events.topic = out->kv_topic;
    out->kv_events.medium_dram = out->kv_medium_dram;
    out->kv_events.medium_g3 = out->kv_medium_g3;
}

static bool spans_overlap(uintptr_t a, size_t alen, uintptr_t b, size_t blen)
{
    return a < b + blen && b < a + alen;
}

static int pool_by_name(const kvcr_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_pool_layouts; i++)
        if (strcmp(cfg->pool_layouts[i].name, name) == 0) return (int)i;
    return -1;
}

const kvcr_dram_pool *dram_pool_for(const kvcr_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_local_dram; i++)
        if (strcmp(cfg->local_dram[i].name, name) == 0) return &cfg->local_dram[i];
    return NULL;
}

static int check_local_dram(const kvcr_config *cfg)
{
    if (cfg->local_dram == NULL && cfg->n_local_dram == 0) return 0;
    if (cfg->local_dram == NULL || cfg->n_local_dram == 0)
        return kvcr_fail(KVCR_EINVAL, "local_dram and n_local_dram must be set together");
    if (cfg->local_dram_backend == NULL || cfg->local_dram_backend[0] == '\0')
        return kvcr_fail(KVCR_EINVAL, "local DRAM backend name must be non-empty");
    const kvcr_dram_pool *d = cfg->local_dram;
    size_t n = cfg->n_local_dram;
    for (size_t i = 0; i < n; i++)
        if (d[i].name == NULL)
            return kvcr_fail(KVCR_EINVAL, "local DRAM pool name must be a string");
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(d[i].name, d[j].name) == 0)
                return kvcr_fail(KVCR_EINVAL, "local DRAM pool names must be unique");
    /* The same set of names as pool_layouts, in any order (names are unique
     * on both sides, so equal counts and every name found means equal sets). */
    bool match = n == cfg->n_pool_layouts;
    for (size_t i = 0; match && i < n; i++)
        match = dram_pool_for(cfg, cfg->pool_layouts[i].name) != NULL;
    if (!match)
        return kvcr_fail(KVCR_EINVAL, "local DRAM pool names must exactly match pool_layouts");
    for (size_t i = 0; i < n; i++) {
        if (d[i].addr == NULL)
            return kvcr_fail(KVCR_EINVAL, "local DRAM address must be a positive integer");
        if (d[i].size == 0 || d[i].size > UINTPTR_MAX - (uintptr_t)d[i].addr)
            return kvcr_fail(KVCR_EINVAL, "local DRAM pool size must be a positive integer");
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (spans_overlap((uintptr_t)d[i].addr, d[i].size, (uintptr_t)d[j].addr, d[j].size))
                return kvcr_fail(KVCR_EINVAL, "local DRAM pool memory regions must not overlap");
    for (size_t i = 0; i < n; i++) {
        size_t bs = cfg->pool_layouts[pool_by_name(cfg, d[i].name)].block_size;
        if (d[i].size % bs != 0)
            return kvcr_fail(KVCR_EINVAL, "local DRAM pool '%s' size must contain complete blocks",
                             d[i].name);
        if (d[i].size / bs >= UINT32_MAX)
            return kvcr_fail(KVCR_EINVAL, "local DRAM pool '%s' holds more than %u blocks",
                             d[i].name, UINT32_MAX - 1);
    }
    return 0;
}

/* A tenant name: 1..KVCR_TENANT_NAME_MAX bytes of [A-Za-z0-9_.-] (it
 * becomes part of a gauge's resource name). */
static bool tenant_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KVCR_TENANT_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '.' || s[i] == '-'))
            return false;
    return true;
}

/* The quotas of all tenants together against the slots of a tier. */
static int check_quota_sum(const kvcr_config *cfg, size_t field, const char *what,
                           uint64_t slots)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        uint64_t q;
        memcpy(&q, (const char *)&cfg->tenants[i] + field, sizeof q);
        if (q > slots || sum > slots - q)
            return kvcr_fail(KVCR_EINVAL,
                             "tenants' %s quotas must add up to at most the %s slots (%llu): "
                             "tenant '%s' brings them past it",
                             what, what, (unsigned long long)slots, cfg->tenants[i].name);
        sum += q;
    }
    return 0;
}

static int check_tenants(const kvcr_config *cfg)
{
    if (cfg->n_tenants == 0 && cfg->tenants == NULL) return 0;
    if (cfg->n_tenants == 0 || cfg->tenants == NULL)
        return kvcr_fail(KVCR_EINVAL, "tenants and n_tenants must be set together");
    if (cfg->n_tenants > KVCR_MAX_TENANTS)
        return kvcr_fail(KVCR_EINVAL, "at most %d tenants (got %zu)", KVCR_MAX_TENANTS,
                         cfg->n_tenants);
    const kvcr_tenant *t = cfg->tenants;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        if (!tenant_name_ok(t[i].name))
            return kvcr_fail(KVCR_EINVAL,
                             "tenant %zu's name must be 1 to %d bytes of letters, digits, "
                             "'_', '.' and '-'", i, KVCR_TENANT_NAME_MAX);
        for (size_t j = 0; j < i; j++)
            if (strcmp(t[i].name, t[j].name) == 0)
                return kvcr_fail(KVCR_EINVAL, "tenant names must be unique ('%s' twice)",
                                 t[i].name);
        if (t[i].g3_slots > 0 && cfg->g3.n_paths == 0)
            return kvcr_fail(KVCR_EINVAL, "tenant '%s' has a G3 quota but G3 is not configured",
                             t[i].name);
    }
    uint64_t dram = 0;
    for (size_t i = 0; i < cfg->n_local_dram; i++)
        dram += cfg->local_dram[i].size /
                cfg->pool_layouts[pool_by_name(cfg, cfg->local_dram[i].name)].block_size;
    int rc = cfg->n_local_dram == 0
                 ? 0 : check_quota_sum(cfg, offsetof(kvcr_tenant, dram_slots), "DRAM", dram);
    if (rc == 0 && cfg->g3.n_paths > 0)
        rc = check_quota_sum(cfg, offsetof(kvcr_tenant, g3_slots), "G3",
                             cfg->g3.n_paths *
                                 (cfg->g3.capacity_bytes_per_file / cfg->pool_layouts[0].block_size));
    return rc;
}

static void copy_tenants(const kvcr_config *cfg, kvcr_conf *out)
{
    out->n_tenants = (uint32_t)cfg->n_tenants;
    for (size_t i = 0; i < cfg->n_tenants; i++) {
        snprintf(out->tenant_names[i], sizeof out->tenant_names[i], "%s", cfg->tenants[i].name);
        out->tenant_dram_quota[i] = cfg->tenants[i].dram_slots;
        out->tenant_g3_quota[i] = cfg->tenants[i].g3_slots;
    }
}

/* The pool a region label names: the pool itself (whole blocks), or
 * "pool:part" (one part of each block; *part set). -1: neither. */
static int region_pool(const kvcr_config *cfg, const char *label, bool *part)
{
    *part = false;
    int p = pool_by_name(cfg, label);
    size_t len = pieces_pool_len(label);
    if (p >= 0 || label[len] != ':' || label[len + 1] == '\0' || strcmp(label + len, PART_ALL) == 0)
        return p;
    char pool[KVCR_NAME_MAX];
    snprintf(pool, sizeof pool, "%.*s", (int)len, label);
    *part = true;
    return pool_by_name(cfg, pool);
}

static size_t region_span(const kvcr_region *r)
{
    size_t stride = r->stride ? r->stride : r->element_size;
    return stride * (r->count - 1) + r->element_size;
}

static int check_one_region(const kvcr_config *cfg, const kvcr_region *r)
{
    if (r->addr == NULL)
        return kvcr_fail(KVCR_EINVAL, "framework region address must be a positive integer");
    if (r->element_size == 0)
        return kvcr_fail(KVCR_EINVAL, "framework region size must be a positive integer");
    if (r->count == 0)
        return kvcr_fail(KVCR_EINVAL, "framework region count must be a positive integer");
    if (r->stride != 0 && r->stride < r->element_size)
        return kvcr_fail(KVCR_EINVAL, "framework region stride must be 0 or at least its size");
    size_t stride = r->stride ? r->stride : r->element_size;
    if ((r->count - 1) > (SIZE_MAX - r->element_size) / stride ||
        region_span(r) > UINTPTR_MAX - (uintptr_t)r->addr)
        return kvcr_fail(KVCR_EINVAL, "framework region does not fit in the address space");
    if (r->mem_type != KVCR_MEM_DRAM && r->mem_type != KVCR_MEM_VRAM)
        return kvcr_fail(KVCR_EINVAL,
                         "framework region mem_type must be KVCR_MEM_DRAM or KVCR_MEM_VRAM (got %d)",
                         (int)r->mem_type);
    if (r->device_id < 0)
        return kvcr_fail(KVCR_EINVAL, "framework region device_id must be a non-negative int");
    if (!name_ok(r->label))
        return kvcr_fail(KVCR_EINVAL, "framework region label must be a string shorter than %d "
                                      "bytes",
                         KVCR_NAME_MAX);
    bool part;
    if (region_pool(cfg, r->label, &part) < 0)
        return strchr(r->label, ':')
                   ? kvcr_fail(KVCR_EINVAL,
                               "framework region label '%s' must name a configured pool, or "
                               "one part of one as 'pool:part' (a part name, not '*')",
                               r->label)
                   : kvcr_fail(KVCR_EINVAL,
                               "framework region label '%s' must name a configured pool",
                               r->label);
    if (r->mem_type == KVCR_MEM_VRAM)
        return kvcr_fail(KVCR_ENOTSUP, "VRAM framework regions need a CUDA build of KVCR; this "
                                       "build copies host memory only");
    return 0;
}

/* The parts of one pool agree: no whole region beside them, one count,
 * one memory type and device, and sizes adding up to the pool's block. */
static int check_pool_parts(const kvcr_config *cfg, const bool *dup, int pool)
{
    const kvcr_region *r = cfg->framework_regions, *first = NULL;
    const char *name = cfg->pool_layouts[pool].name;
    size_t sum = 0;
    bool whole = false;
    for (size_t i = 0; i < cfg->n_framework_regions; i++) {
        bool part;
        if (dup[i] || region_pool(cfg, r[i].label, &part) != pool) continue;
        if (!part) {
            whole = true;
            continue;
        }
        if (first == NULL) first = &r[i];
        if (r[i].count != first->count)
            return kvcr_fail(KVCR_EINVAL,
                             "the parts of pool '%s' must have one count: '%s' has %zu elements, "
                             "'%s' %zu",
                             name, first->label, first->count, r[i].label, r[i].count);
        if (r[i].mem_type != first->mem_type || r[i].device_id != first->device_id)
            return kvcr_fail(KVCR_EINVAL,
                             "the parts of pool '%s' must share one memory type and device", name);
        sum += r[i].element_size;
    }
    if (first == NULL) return 0;
    if (whole)
        return kvcr_fail(KVCR_EINVAL,
                         "pool '%s' has a whole framework region and parts ('%s'): its blocks are "
                         "one or the other",
                         name, first->label);
    if (sum != cfg->pool_layouts[pool].block_size)
        return kvcr_fail(KVCR_EINVAL,
                         "the parts of pool '%s' add up to %zu bytes, but its blocks are %zu",
                         name, sum, cfg->pool_layouts[pool].block_size);
    return 0;
}

static bool region_equal(const kvcr_region *a, const kvcr_region *b)
{
    return a->addr == b->addr && a->element_size == b->element_size && a->count == b->count &&
           a->stride == b->stride && a->mem_type == b->mem_type && a->device_id == b->device_id &&
           strcmp(a->label, b->label) == 0;
}

/* Exact duplicates collapse to the first; labels must then be unique; spans
 * on one (mem_type, device) must not overlap each other or a KVCR pool. */
static int check_regions(const kvcr_config *cfg, bool *dup)
{
    const kvcr_region *r = cfg->framework_regions;
    size_t n = cfg->n_framework_regions;
    if (n > 0 && r == NULL)
        return kvcr_fail(KVCR_EINVAL, "framework_regions is NULL but n_framework_regions is %zu", n);
    for (size_t i = 0; i < n; i++) {
        int rc = check_one_region(cfg, &r[i]);
        if (rc != 0) return rc;
    }
    for (size_t i = 0; i < n; i++) {
        dup[i] = false;
        for (size_t j = 0; j < i && !dup[i]; j++) dup[i] = !dup[j] && region_equal(&r[i], &r[j]);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++) {
            if (dup[i] || dup[j]) continue;
            if (strcmp(r[i].label, r[j].label) == 0)
                return kvcr_fail(KVCR_EINVAL, "framework region labels must be unique ('%s')",
                                 r[i].label);
            uintptr_t a = (uintptr_t)r[i].addr, b = (uintptr_t)r[j].addr;
            size_t alen = region_span(&r[i]), blen = region_span(&r[j]);
            if (r[i].mem_type == r[j].mem_type && r[i].device_id == r[j].device_id &&
                spans_overlap(a, alen, b, blen)) {
                uintptr_t lo = a < b ? a : b, hi = a < b ? b : a;
                size_t lolen = a < b ? alen : blen, hilen = a < b ? blen : alen;
                return kvcr_fail(KVCR_EINVAL,
                                 "framework regions must not overlap: [%#zx, %#zx) and "
                                 "[%#zx, %#zx) (DRAM of device %d)",
                                 (size_t)lo, (size_t)(lo + lolen), (size_t)hi,
                                 (size_t)(hi + hilen), r[i].device_id);
            }
        }
    for (size_t i = 0; i < n; i++)
        for (size_t p = 0; p < cfg->n_local_dram; p++)
            if (!dup[i] && r[i].mem_type == KVCR_MEM_DRAM &&
                spans_overlap((uintptr_t)r[i].addr, region_span(&r[i]),
                              (uintptr_t)cfg->local_dram[p].addr, cfg->local_dram[p].size))
                return kvcr_fail(KVCR_EINVAL,
                                 "framework region '%s' overlaps local DRAM pool '%s'",
                                 r[i].label, cfg->local_dram[p].name);
    for (size_t p = 0; p < cfg->n_pool_layouts; p++) {
        int rc = check_pool_parts(cfg, dup, (int)p);
        if (rc != 0) return rc;
    }
    return 0;
}

/* Every pool in parts gets its "pool:*" label, the one references use. */
static int copy_part_labels(const kvcr_config *cfg, kvcr_conf *out)
{
    out->part_labels = calloc(cfg->n_pool_layouts, sizeof *out->part_labels);
    if (out->part_labels == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < out->n_regions; i++) {
        const fw_region *f = &out->regions[i];
        if (!f->part || out->part_labels[f->pool]) continue;
        const char *name = cfg->pool_layouts[f->pool].name;
        size_t len = strlen(name) + sizeof PART_ALL;
        if ((out->part_labels[f->pool] = malloc(len)) == NULL)
            return kvcr_fail(KVCR_ENOMEM, "out of memory");
        snprintf(out->part_labels[f->pool], len, "%s%s", name, PART_ALL);
    }
    return 0;
}

static int copy_regions(const kvcr_config *cfg, const bool *dup, kvcr_conf *out)
{
    size_t n = cfg->n_framework_regions;
    out->regions = n ? calloc(n, sizeof *out->regions) : NULL;
    if (n && out->regions == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (dup[i]) continue;
        const kvcr_region *r = &cfg->framework_regions[i];
        fw_region *f = &out->regions[out->n_regions++];
        f->addr = r->addr;
        f->element_size = r->element_size;
        f->count = r->count;
        f->stride = r->stride ? r->stride : r->element_size;
        strcpy(f->label, r->label);
        f->mem_type = r->mem_type;
        f->device_id = r->device_id;
        f->pool = (uint32_t)region_pool(cfg, r->label, &f->part);
    }
    out->geom = calloc(out->n_regions ? out->n_regions : 1, sizeof *out->geom);
    if (out->geom == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < out->n_regions; i++) {
        const fw_region *f = &out->regions[i];
        out->geom[i] = (region_geom){f->label, true, (uint64_t)(uintptr_t)f->addr,
                                     f->element_size, f->stride, f->count};
    }
    return copy_part_labels(cfg, out);
}

static int copy_g3(const kvcr_config *cfg, kvcr_conf *out)
{
    out->g3 = cfg->g3;
    out->g3.backend = NULL; /* only io_uring exists; the name was checked */
    out->g3_paths = calloc(cfg->g3.n_paths, sizeof *out->g3_paths);
    if (out->g3_paths == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (size_t i = 0; i < cfg->g3.n_paths; i++)
        if ((out->g3_paths[i] = strdup(cfg->g3.paths[i])) == NULL)
            return kvcr_fail(KVCR_ENOMEM, "out of memory");
    out->g3.paths = (const char *const *)out->g3_paths;
    return 0;
}

int conf_build(const kvcr_config *cfg, kvcr_conf *out)
{
    memset(out, 0, sizeof *out);
    if (cfg == NULL) return kvcr_fail(KVCR_EINVAL, "config must not be NULL");
    if (cfg->agent_name == NULL || cfg->agent_name[0] == '\0' || !name_ok(cfg->agent_name))
        return kvcr_fail(KVCR_EINVAL, "agent_name must be a non-empty string shorter than %d bytes",
                         KVCR_NAME_MAX);
    int rc = check_pool_layouts(cfg);
    if (rc == 0) rc = check_group(cfg, OPT_G_CONFIG);
    if (rc == 0) rc = check_group(cfg, OPT_G_LIMITS);
    /* The default policy spills to G3 when there is one. */
    const kvcr_policy_ops *policy =
        cfg->policy ? cfg->policy : kvcr_policy_builtin(cfg->g3.n_paths ? "g3_lru" : "lru");
    if (rc == 0) rc = check_policy(cfg, policy);
    if (rc == 0) rc = check_remote(cfg);
    if (rc == 0) rc = check_g3(cfg);
    if (rc == 0) rc = check_kv_events(cfg);
    if (rc == 0) rc = check_local_dram(cfg);
    if (rc == 0) rc = check_tenants(cfg);
    bool *dup = NULL;
    if (rc == 0 && cfg->n_framework_regions > 0) {
        dup = calloc(cfg->n_framework_regions, sizeof *dup);
        rc = dup ? check_regions(cfg, dup) : kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    if (rc == 0 && (cfg->callbacks.request_pin == NULL) != (cfg->callbacks.release_pin == NULL))
        rc = kvcr_fail(KVCR_EINVAL, "request_pin and release_pin must be given together");
    if (rc == 0 && cfg->n_local_dram == 0 && !cfg->remote.enabled)
        rc = kvcr_fail(KVCR_EINVAL, "at least one DRAM backend must be configured");
    out->n_pools = rc == 0 ? (uint32_t)cfg->n_pool_layouts : 0; /* conf_destroy's bound */
    if (rc == 0) rc = copy_regions(cfg, dup, out);
    /* Peers learn every region in one metadata message (blocks in parts
     * make many): more than it carries could never be pulled into. */
    size_t published = out->n_regions + cfg->n_local_dram;
    if (rc == 0 && cfg->remote.enabled && published > WIRE_MAX_REGIONS)
        rc = kvcr_fail(KVCR_EINVAL,
                       "the peer tier publishes at most %d regions (framework regions and KVCR "
                       "DRAM pools); %zu are configured",
                       WIRE_MAX_REGIONS, published);
    free(dup);
    if (rc != 0) {
        conf_destroy(out);
        return rc;
    }
    strcpy(out->agent_name, cfg->agent_name);
    out->has_local_dram = cfg->n_local_dram > 0;
    out->remote = cfg->remote;
    out->remote.backend = "UCX"; /* the only transport; the caller's name was checked */
    if (cfg->g3.n_paths > 0 && (rc = copy_g3(cfg, out)) != 0) {
        conf_destroy(out);
        return rc;
    }
    if (out->remote.enabled) {
        const char *host = cfg->remote.control_host ? cfg->remote.control_host : "127.0.0.1";
        snprintf(out->control_host, sizeof out->control_host, "%s", host);
        snprintf(out->advertise_host, sizeof out->advertise_host, "%s",
                 cfg->remote.advertise_host ? cfg->remote.advertise_host : host);
        out->remote.control_host = out->control_host;
        out->remote.advertise_host = out->advertise_host;
        if ((rc = copy_curve(&cfg->remote.curve, out)) != 0) {
            conf_destroy(out);
            return rc;
        }
    } else {
        out->remote.curve = (kvcr_curve_options){0};
    }
    out->operation_timeout_ms = cfg->operation_timeout_ms;
    out->abandon_timeout_ms = cfg->abandon_timeout_ms;
    out->watermark_percent = cfg->capacity_low_watermark_percent;
    out->enable_telemetry = cfg->enable_telemetry;
    out->copy_threads = cfg->copy_threads;
    out->limits = cfg->limits;
    out->max_peers = cfg->max_peers;
    out->peer_idle_ms = cfg->peer_idle_ms;
    out->policy = policy;
    out->policy_ud = cfg->policy ? cfg->policy_ud : NULL;
    out->cb = cfg->callbacks;
    copy_kv_events(cfg, out);
    copy_tenants(cfg, out);
    return 0;
}

void conf_destroy(kvcr_conf *c)
{
    for (size_t i = 0; c->g3_paths && i < c->g3.n_paths; i++) free(c->g3_paths[i]);
    free(c->g3_paths);
    c->g3_paths = NULL;
    for (uint32_t p = 0; c->part_labels && p < c->n_pools; p++) free(c->part_labels[p]);
    free(c->part_labels);
    c->part_labels = NULL;
    free(c->geom);
    c->geom = NULL;
    free(c->regions);
    c->regions = NULL;
    c->n_regions = 0;
    free(c->curve_keys);
    free(c->curve_allowed);
    c->curve_keys = NULL;
    c->curve_allowed = NULL;
}
