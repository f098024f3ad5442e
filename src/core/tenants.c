/* Tenants: slot counts, per-tenant evictable queues, quota checks, the
 * policy's view and the gauges (core/tenants.h). */
#include "core/tenants.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/instance.h"
#include "net/json.h"

void tenants_init(kvcr_t *kv)
{
    for (uint32_t t = 0; t <= KVCR_MAX_TENANTS; t++) {
        evq_init(&kv->tenants[t].evq);
        kv->tenants[t].evq.shared_seq = &kv->evq.next_seq;
    }
}

void tenants_destroy(kvcr_t *kv)
{
    for (uint32_t t = 0; t <= KVCR_MAX_TENANTS; t++) evq_destroy(&kv->tenants[t].evq);
}

uint8_t tenants_find(const kvcr_t *kv, const void *name, size_t len)
{
    for (uint32_t i = 0; i < kv->conf.n_tenants; i++)
        if (strlen(kv->conf.tenant_names[i]) == len &&
            memcmp(kv->conf.tenant_names[i], name, len) == 0)
            return (uint8_t)(i + 1);
    return 0;
}

const char *tenants_name(const kvcr_t *kv, uint8_t t)
{
    return t ? kv->conf.tenant_names[t - 1] : NULL;
}

/* Unlocked (takes the instance lock to count and warn): a "tenant" member
 * naming no configured tenant, refused when strict (KVCR_EINVAL), else
 * counted (hints_unknown_tenant) and warned of at most once a second, and
 * the blocks take no tenant (0). */
static int unknown_tenant(kvcr_t *kv, const json_doc *d, const json_node *t, bool strict)
{
    int n = (int)(t->type == JSON_STRING ? (t->str_len > 64 ? 64 : t->str_len) : 0);
    const char *name = t->type == JSON_STRING ? json_str(d, t) : "";
    if (strict)
        return t->type == JSON_STRING
                   ? kvcr_fail(KVCR_EINVAL, "hints name tenant '%.*s', which is not configured",
                               n, name)
                   : kvcr_fail(KVCR_EINVAL, "hints' \"tenant\" must be a string or null");
    instance_lock(kv);
    kv->hints_unknown_tenant++;
    kvcr_log_limited(&kv->log, &kv->unknown_tenant_warn, 1000,
                     "hints name tenant '%.*s'%s, which is not configured: the blocks take no "
                     "tenant (gauge hints_unknown_tenant)", n, name,
                     t->type == JSON_STRING ? "" : " (not a string)");
    instance_unlock(kv);
    return 0;
}

/* Unlocked: the "tenant" member of checked hints when tenants are
 * configured, *tenant 0 for none, null or (not strict) a name not
 * configured. Without tenants the hints are the framework's alone and
 * nothing in them is read. */
static int hints_tenant(kvcr_t *kv, const json_doc *d, bool strict, uint8_t *tenant)
{
    if (kv->conf.n_tenants == 0) return 0;
    const json_node *t = json_get(d, json_root(d), "tenant");
    if (t == NULL || t->type == JSON_NULL) return 0;
    if (t->type == JSON_STRING && t->str_len > 0)
        *tenant = tenants_find(kv, json_str(d, t), t->str_len);
    return *tenant ? 0 : unknown_tenant(kv, d, t, strict);
}

int tenants_admit_prepare(kvcr_t *kv, const char *json, size_t len, bool strict, admit_ctx *ctx)
{
    *ctx = (admit_ctx){0};
    if (json == NULL)
        return len == 0 ? 0 : kvcr_fail(KVCR_EINVAL, "hints are NULL but hints_len is %zu", len);
    if (len > kv->conf.limits.max_hint_bytes) { /* refused before the text is read at all */
        instance_lock(kv);
        if (kv->telemetry) telemetry_refusal(kv->telemetry, "hint_bytes");
        instance_unlock(kv);
        return kvcr_fail(KVCR_ELIMIT, "hints have %zu bytes, over limits.max_hint_bytes (%u)",
                         len, kv->conf.limits.max_hint_bytes);
    }
    json_doc d;
    int parsed = json_parse(json, len, &d);
    if (parsed == JSON_ENOMEM) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (parsed != 0) return kvcr_fail(KVCR_EINVAL, "hints must be strict JSON text (RFC 8259)");
    int rc = json_root(&d)->type == JSON_OBJECT
                 ? hints_tenant(kv, &d, strict, &ctx->tenant)
                 : kvcr_fail(KVCR_EINVAL, "hints must be a JSON object");
    json_free(&d);
    if (rc == 0 && (ctx->framework_copy = malloc(len + 1)) == NULL)
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (rc != 0) {
        ctx->tenant = 0;
        return rc;
    }
    memcpy(ctx->framework_copy, json, len);
    ctx->framework_copy[len] = '\0';
    ctx->hints.framework = ctx->framework_copy;
    ctx->hints.framework_len = len;
    return 0;
}

void tenants_admit_enter(kvcr_t *kv, admit_ctx *ctx, const char *request_id)
{
    const hint_state *h = request_id ? hint_table_find(&kv->hints, request_id) : NULL;
    ctx->hints.router = h ? h->hint.text : NULL;
    ctx->hints.router_len = h ? h->hint.text_len : 0;
    kv->admit = ctx;
}

void tenants_admit_leave(kvcr_t *kv)
{
    kv->admit = NULL;
}

void tenants_admit_free(admit_ctx *ctx)
{
    free(ctx->framework_copy);
    *ctx = (admit_ctx){0};
}

evictq *tenant_queue(kvcr_t *kv, block_id id)
{
    uint8_t t = index_get(&kv->index, id)->tenant;
    return t ? &kv->tenants[t].evq : &kv->evq;
}

bool tenants_quota_first(const kvcr_t *kv)
{
    const kvcr_policy_ops *p = kv->conf.policy;
    return kv->conf.n_tenants > 0 && p->version >= 2 && (p->flags & KVCR_POLICY_TENANT_QUOTAS);
}

evictq *tenants_first_queue(kvcr_t *kv, const bool *eligible)
{
    evictq *best = NULL;
    block_id best_id = BLOCK_NONE;
    for (uint32_t t = 0; t <= kv->conf.n_tenants; t++) {
        if (eligible && !eligible[t]) continue;
        evictq *q = t ? &kv->tenants[t].evq : &kv->evq;
        block_id id = evq_front(q, &kv->index);
        if (id != BLOCK_NONE && (best_id == BLOCK_NONE || evq_before(&kv->index, id, best_id))) {
            best = q;
            best_id = id;
        }
    }
    return best;
}

static uint64_t dram_quota(const kvcr_t *kv, uint8_t t)
{
    return t ? kv->conf.tenant_dram_quota[t - 1] : 0;
}

/* The lower tiers the configuration gives tenants a quota of, by tier id:
 * where kvcr_conf keeps the quotas and the name the public API gives them
 * (kvcr_block_meta.tenant_g3_*, gauges tenant_<name>_g3_*). A tier with
 * no row still counts its tenants' slots; its quotas are 0. */
static const struct quota_row {
    kvcr_tier id;
    size_t conf_off; /* of a uint64_t[KVCR_MAX_TENANTS] in kvcr_conf */
    const char *name;
} quota_rows[] = {
    {KVCR_TIER_G3, offsetof(kvcr_conf, tenant_g3_quota), "g3"},
};

static const struct quota_row *quota_row_of(kvcr_tier id)
{
    for (size_t i = 0; i < sizeof quota_rows / sizeof quota_rows[0]; i++)
        if (quota_rows[i].id == id) return &quota_rows[i];
    return NULL;
}

void tenants_tier_added(kvcr_t *kv, uint32_t place)
{
    const struct quota_row *row = quota_row_of(kv->tiers[place].ops->id);
    if (row == NULL) return;
    const char *field = (const char *)&kv->conf + row->conf_off;
    const uint64_t *quota = (const uint64_t *)(const void *)field;
    for (uint32_t t = 1; t <= kv->conf.n_tenants; t++)
        kv->tenants[t].lower_quota[place] = quota[t - 1];
}

/* The lower tier with this id (the first in read order), or -1. */
static int tier_with_id(const kvcr_t *kv, kvcr_tier id)
{
    for (uint32_t i = 0; i < kv->n_tiers; i++)
        if (kv->tiers[i].ops->id == id) return (int)i;
    return -1;
}

int64_t tenants_dram_excess(const kvcr_t *kv, uint8_t t)
{
    return (int64_t)kv->tenants[t].dram_slots - (int64_t)dram_quota(kv, t);
}

void tenants_dram_add(kvcr_t *kv, const block *b, int64_t slots)
{
    kv->tenants[b->tenant].dram_slots += (uint64_t)slots;
}

void tenants_evicted(kvcr_t *kv, const block *b)
{
    kv->tenants[b->tenant].dram_evicted++;
}

void tenants_lower_add(kvcr_t *kv, uint32_t place, block_id id, int delta)
{
    kv->tenants[index_get(&kv->index, id)->tenant].lower_slots[place] += (uint64_t)(int64_t)delta;
}

bool tenants_lower_over(const kvcr_t *kv, uint32_t place, uint8_t t, block_id incoming)
{
    if (!tenants_quota_first(kv)) return false;
    uint64_t held = kv->tenants[t].lower_slots[place];
    if (incoming != BLOCK_NONE && index_get(&kv->index, incoming)->tenant == t) held++;
    return held > kv->tenants[t].lower_quota[place];
}

void tenants_meta(const kvcr_t *kv, block_id id, kvcr_block_meta *meta)
{
    uint8_t t = index_get(&kv->index, id)->tenant;
    const tenant_use *u = &kv->tenants[t];
    meta->tenant = tenants_name(kv, t);
    meta->tenant_dram_slots = u->dram_slots;
    meta->tenant_dram_quota = dram_quota(kv, t);
    int g3 = tier_with_id(kv, KVCR_TIER_G3);
    meta->tenant_g3_slots = g3 >= 0 ? u->lower_slots[g3] : 0;
    meta->tenant_g3_quota = g3 >= 0 ? u->lower_quota[g3] : 0;
}

/* Tenant t's gauges of each lower tier the configuration gives a quota. */
static void lower_gauges_of(const kvcr_t *kv, uint32_t t, const char *prefix, gauge_sink *s)
{
    for (uint32_t i = 0; i < kv->n_tiers; i++) {
        const struct quota_row *row = quota_row_of(kv->tiers[i].ops->id);
        if (row == NULL) continue;
        char name[32];
        snprintf(name, sizeof name, "%s_slots", row->name);
        gauge_sink_add(s, prefix, name, (double)kv->tenants[t].lower_slots[i]);
        snprintf(name, sizeof name, "%s_quota_slots", row->name);
        gauge_sink_add(s, prefix, name, (double)kv->tenants[t].lower_quota[i]);
    }
}

void tenants_gauges(kvcr_t *kv, gauge_sink *s)
{
    if (kv->conf.n_tenants == 0) return;
    gauge_sink_add(s, "", "hints_unknown_tenant", (double)kv->hints_unknown_tenant);
    for (uint32_t t = 0; t <= kv->conf.n_tenants; t++) {
        char prefix[KVCR_TENANT_NAME_MAX + 16];
        if (t == 0)
            snprintf(prefix, sizeof prefix, "no_tenant_");
        else
            snprintf(prefix, sizeof prefix, "tenant_%s_", kv->conf.tenant_names[t - 1]);
        const tenant_use *u = &kv->tenants[t];
        gauge_sink_add(s, prefix, "dram_slots", (double)u->dram_slots);
        gauge_sink_add(s, prefix, "dram_quota_slots", (double)dram_quota(kv, (uint8_t)t));
        gauge_sink_add(s, prefix, "dram_evicted_blocks", (double)u->dram_evicted);
        lower_gauges_of(kv, t, prefix, s);
    }
}
