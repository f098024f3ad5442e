/* A lower tier in memory for the seam's tests (fake_tier.h). */
#include "fake_tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host.h"

/* The lower state of a block spilled here: readable at once. */
#define FAKE_READY (LOWER_READY | 1)

typedef struct fake_entry {
    bool used;
    uint8_t *key, *bytes;
    uint32_t key_len;
    size_t len;
    tier_block block; /* spilled: the core's record; TIER_BLOCK_NONE: its own */
    uint64_t age;     /* when it came: the oldest spilled one goes first */
    uint32_t busy;    /* reads in flight: never evicted meanwhile */
} fake_entry;

typedef struct pending_read {
    tier_token token;
    tier_block block;
    uint32_t entry;
    uint8_t *dst;
} pending_read;

struct fake_tier {
    tier_ops ops; /* first: the core's tier* is this struct */
    kvcr_t *kv;
    fake_trail *trail;
    fake_entry *e;
    uint32_t n_slots;
    uint64_t next_age;
    pending_read *reads;
    uint32_t n_reads;
    bool held, refuse_spills;
    uint32_t fail_reads;
};

static fake_tier *F(tier *t)
{
    return (fake_tier *)(void *)t;
}

static void note(const fake_tier *f, const char *what)
{
    size_t n = strlen(f->trail->text);
    snprintf(f->trail->text + n, sizeof f->trail->text - n, "%s%s.%s", n ? " " : "",
             f->ops.name, what);
}

static int find(const fake_tier *f, const uint8_t *key, uint32_t len)
{
    for (uint32_t i = 0; i < f->n_slots; i++)
        if (f->e[i].used && f->e[i].key_len == len && memcmp(f->e[i].key, key, len) == 0)
            return (int)i;
    return -1;
}

static void entry_free(fake_entry *e)
{
    free(e->key);
    free(e->bytes);
    *e = (fake_entry){0};
}

/* Locked: a copy of key and bytes in a free slot; false when none is free
 * or out of memory. */
static bool entry_set(fake_tier *f, uint32_t s, const uint8_t *key, uint32_t key_len,
                      const void *bytes, size_t len, tier_block block)
{
    fake_entry *e = &f->e[s];
    *e = (fake_entry){true, malloc(key_len ? key_len : 1), malloc(len ? len : 1), key_len, len,
                      block, f->next_age++, 0};
    if (e->key == NULL || e->bytes == NULL) {
        entry_free(e);
        return false;
    }
    memcpy(e->key, key, key_len);
    memcpy(e->bytes, bytes, len);
    return true;
}

/* ---- spills --------------------------------------------------------------- */

/* Whether spilled entry s may go to make room for `incoming`: not read
 * now, not protected, the policy lets it go, and (quotas first) its tenant
 * over its quota of this tier. */
static bool evictable(fake_tier *f, uint32_t s, tier_block incoming, bool over_only)
{
    const fake_entry *e = &f->e[s];
    if (!e->used || e->block == TIER_BLOCK_NONE || e->busy || host_protected(f->kv, e->block))
        return false;
    if (over_only && !host_lower_over_quota(f->kv, host_tenant(f->kv, e->block), incoming))
        return false;
    return host_eviction_decision(f->kv, e->block, f->ops.id) != KVCR_ACTION_KEEP;
}

static int oldest_evictable(fake_tier *f, tier_block incoming, bool over_only)
{
    int best = -1;
    for (uint32_t s = 0; s < f->n_slots; s++)
        if (evictable(f, s, incoming, over_only) && (best < 0 || f->e[s].age < f->e[best].age))
            best = (int)s;
    return best;
}

/* A spilled block leaves: its slot count, its inventory, its record. */
static void evict(fake_tier *f, uint32_t s)
{
    tier_block id = f->e[s].block;
    entry_free(&f->e[s]);
    host_lower_slots(f->kv, id, -1);
    tier_lower *lw = host_lower(f->kv, id);
    lw->state = 0;
    host_inventory(f->kv, f->ops.id, true, &id, 1);
    host_lower_gone(f->kv, id);
}

/* A free slot, evicting for `incoming` when none is; -1: none. */
static int take_slot(fake_tier *f, tier_block incoming)
{
    for (uint32_t s = 0; s < f->n_slots; s++)
        if (!f->e[s].used) return (int)s;
    int s = host_quota_first(f->kv) ? oldest_evictable(f, incoming, true) : -1;
    if (s < 0) s = oldest_evictable(f, incoming, false);
    if (s >= 0) evict(f, (uint32_t)s);
    return s;
}

static bool fake_spill(tier *t, tier_block id)
{
    fake_tier *f = F(t);
    note(f, "spill");
    tier_lower *lw = host_lower(f->kv, id);
    if (f->refuse_spills || host_block_segments(f->kv, id) != 1) return false;
    if (lw->state != 0) return true; /* already here */
    host_protect(f->kv, id, true); /* not its own victim */
    int s = take_slot(f, id);
    host_protect(f->kv, id, false);
    uint32_t key_len;
    const uint8_t *key = host_block_key(f->kv, id, &key_len);
    tier_dst seg;
    host_block_segment(f->kv, id, 0, &seg);
    if (s < 0 || !entry_set(f, (uint32_t)s, key, key_len, seg.addr, seg.len, id)) return false;
    lw->state = FAKE_READY;
    lw->slot = (uint32_t)s;
    host_lower_slots(f->kv, id, 1);
    host_inventory(f->kv, f->ops.id, false, &id, 1);
    return true;
}

/* ---- reads ---------------------------------------------------------------- */

static tier_batch *fake_begin(tier *t, const tier_batch_info *info)
{
    (void)info;
    note(F(t), "begin");
    return (tier_batch *)(void *)t;
}

static bool fake_holds(tier *t, tier_batch *b, tier_block id, const uint8_t *key, uint32_t len)
{
    (void)b, (void)id;
    note(F(t), "holds");
    return find(F(t), key, len) >= 0;
}

static kvcr_reason fake_read(tier *t, tier_batch *b, const tier_read *rd)
{
    (void)b;
    fake_tier *f = F(t);
    note(f, "read");
    int s = find(f, rd->key, rd->key_len);
    if (s < 0) return KVCR_REASON_NOT_FOUND;
    if (rd->n_dst != 1 || rd->dst[0].len != f->e[s].len || rd->dst[0].addr == NULL)
        return KVCR_REASON_LAYOUT_MISMATCH;
    pending_read *grown = realloc(f->reads, (f->n_reads + 1) * sizeof *grown);
    if (grown == NULL) return KVCR_REASON_NO_CAPACITY;
    f->reads = grown;
    f->reads[f->n_reads++] = (pending_read){rd->token, rd->block, (uint32_t)s, rd->dst[0].addr};
    f->e[s].busy++;
    if (!f->held) host_wake(f->kv);
    return KVCR_REASON_NONE;
}

static void fake_end(tier *t, tier_batch *b)
{
    (void)b;
    note(F(t), "end");
}

static void fake_settle(tier *t)
{
    fake_tier *f = F(t);
    if (f->held || f->n_reads == 0) return;
    note(f, "settle");
    for (uint32_t i = 0; i < f->n_reads; i++) {
        pending_read *r = &f->reads[i];
        fake_entry *e = &f->e[r->entry];
        bool ok = f->fail_reads == 0;
        if (!ok) f->fail_reads--;
        if (ok) memcpy(r->dst, e->bytes, e->len);
        e->busy--;
        if (ok && r->block != TIER_BLOCK_NONE) host_access(f->kv, r->block);
        host_settle(f->kv, r->token, ok, ok ? KVCR_REASON_NONE : KVCR_REASON_TRANSFER_ERROR);
    }
    f->n_reads = 0;
}

/* ---- lifetime and gauges --------------------------------------------------- */

static void fake_stop(tier *t)
{
    note(F(t), "stop");
}

static void fake_close(tier *t)
{
    note(F(t), "close");
}

static void fake_destroy(tier *t)
{
    note(F(t), "destroy");
    fake_tier_free(F(t));
}

static void fake_gauges(tier *t, gauge_sink *s)
{
    fake_tier *f = F(t);
    uint32_t used = 0;
    for (uint32_t i = 0; i < f->n_slots; i++) used += f->e[i].used;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "fake_%s_", f->ops.name);
    gauge_sink_add(s, prefix, "blocks", used);
    gauge_sink_add(s, prefix, "pending_reads", f->n_reads);
}

static bool fake_layout_ok(const tier *t, const uint32_t *pools, uint32_t n_segs)
{
    (void)t, (void)pools;
    return n_segs == 1;
}

fake_tier *fake_tier_new(kvcr_t *kv, const fake_tier_opts *o)
{
    fake_tier *f = calloc(1, sizeof *f);
    if (f == NULL || (f->e = calloc(o->slots ? o->slots : 1, sizeof *f->e)) == NULL) {
        free(f);
        return NULL;
    }
    f->ops = (tier_ops){.version = TIER_OPS_VERSION,
                        .name = o->name,
                        .id = o->id,
                        .stop = fake_stop,
                        .close = fake_close,
                        .destroy = fake_destroy,
                        .settle = fake_settle,
                        .gauges = fake_gauges,
                        .begin = fake_begin,
                        .holds = fake_holds,
                        .read = fake_read,
                        .end = fake_end,
                        .spill = o->spills ? fake_spill : NULL,
                        .layout_ok = fake_layout_ok};
    f->kv = kv;
    f->trail = o->trail;
    f->n_slots = o->slots;
    return f;
}

void fake_tier_free(fake_tier *f)
{
    for (uint32_t i = 0; i < f->n_slots; i++) entry_free(&f->e[i]);
    free(f->e);
    free(f->reads);
    free(f);
}

const tier_ops *fake_tier_ops(const fake_tier *f)
{
    return &f->ops;
}

tier *fake_tier_of(fake_tier *f)
{
    return (tier *)(void *)f;
}

/* ---- knobs (the test's thread, under the instance lock) -------------------- */

void fake_tier_put(fake_tier *f, const char *key, const void *bytes, size_t len)
{
    host_lock(f->kv);
    int s = -1;
    for (uint32_t i = 0; s < 0 && i < f->n_slots; i++)
        if (!f->e[i].used) s = (int)i;
    bool ok = s >= 0 && entry_set(f, (uint32_t)s, (const uint8_t *)key, (uint32_t)strlen(key),
                                  bytes, len, TIER_BLOCK_NONE);
    host_unlock(f->kv);
    if (!ok) abort(); /* a test sizes its fakes for what it puts */
}

const uint8_t *fake_tier_bytes(fake_tier *f, const char *key, size_t *len)
{
    host_lock(f->kv);
    int s = find(f, (const uint8_t *)key, (uint32_t)strlen(key));
    const uint8_t *p = s >= 0 ? f->e[s].bytes : NULL;
    *len = s >= 0 ? f->e[s].len : 0;
    host_unlock(f->kv);
    return p;
}

void fake_tier_hold(fake_tier *f, bool hold)
{
    host_lock(f->kv);
    f->held = hold;
    if (!hold && f->n_reads > 0) host_wake(f->kv);
    host_unlock(f->kv);
}

void fake_tier_fail_reads(fake_tier *f, uint32_t n)
{
    host_lock(f->kv);
    f->fail_reads = n;
    host_unlock(f->kv);
}

void fake_tier_refuse_spills(fake_tier *f, bool refuse)
{
    host_lock(f->kv);
    f->refuse_spills = refuse;
    host_unlock(f->kv);
}

uint32_t fake_tier_pending(fake_tier *f)
{
    host_lock(f->kv);
    uint32_t n = f->n_reads;
    host_unlock(f->kv);
    return n;
}
