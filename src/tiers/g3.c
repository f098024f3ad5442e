/* The G3 tier: slots, spills, reads, G3 eviction, warm restart, and the
 * I/O thread that owns the store (see tiers/g3.h). */
#include "tiers/g3.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/host.h"
#include "tiers/g3_format.h"
#include "tiers/g3_store.h"
#include "util/clock.h"
#include "util/event.h"

#define NO_SLOT UINT32_MAX

enum req_kind { REQ_WRITE = 1, REQ_READ_FILL, REQ_READ_DELIVER, REQ_FAULT };

/* The block's lower state, G3's part of it: STORING while a spill is
 * written (not readable yet), READY (LOWER_READY) after. */
enum g3_state { G3_NONE = 0, G3_STORING = 1, G3_READY = LOWER_READY | 1 };

typedef struct g3_req {
    struct g3_req *next;
    struct g3_tier *t;
    uint8_t kind;
    uint32_t slot;
    tier_block block;
    uint8_t *key;        /* owned copy: the I/O thread reads it unlocked */
    uint32_t key_len;
    uint8_t tenant_len, meta_len; /* write: the record's tenant and metadata, */
    uint8_t extra[G3_REC_ROOM];   /* one after the other here */
    void *buf;           /* write: the staging copy; read: the destination */
    tier_token token;    /* reads: whom to settle */
    uint64_t start_ns;
    int result;
} g3_req;

struct g3_tier {
    kvcr_t *kv;
    g3_store *store;     /* the I/O thread's once started */
    size_t slot_size;
    uint32_t n_slots;

    pthread_t thread;
    bool started;
    pthread_mutex_t qlock; /* the two lists and stopping */
    g3_req *q_head, *q_tail;
    g3_req *done_head, *done_tail;
    bool stopping;
    bool held;           /* test hook: requests wait in the queue */
    int wake_fd;
    uint32_t in_store;   /* I/O thread only */

    /* slots, under the instance lock */
    uint32_t *free_ring, free_head, n_free;
    tier_block *owner;   /* per slot: its block, TIER_BLOCK_NONE if free */
    uint32_t *prev, *next; /* the evictable list: READY, unclaimed, oldest first */
    uint32_t ev_head, ev_tail, n_evictable;
    /* With tenants (core/tenants.h): each tenant's evictable slots again,
     * oldest first, and when each slot entered the evictable list, so that
     * quota-first eviction visits only the tenants over their quota. NULL
     * without tenants. */
    uint32_t *tprev, *tnext;
    uint64_t *ev_seq, next_seq;
    uint8_t *slot_tenant;
    uint32_t t_head[KVCR_MAX_TENANTS + 1], t_tail[KVCR_MAX_TENANTS + 1];
    uint32_t n_retired;
    uint64_t tenant_unkept; /* spills whose tenant's name did not fit the record */
    uint64_t staging_bytes;
    uint32_t pending_stores;
    void **stage_free;   /* staging buffers not in use, kept for the next spill */
    uint32_t n_stage_free, stage_cap;
};

/* ---- slots ------------------------------------------------------------------ */

/* A slot joins (or leaves) its tenant's list. */
static void tenant_push(g3_tier *t, uint32_t s)
{
    uint8_t tn = t->slot_tenant[s];
    t->tprev[s] = t->t_tail[tn];
    t->tnext[s] = NO_SLOT;
    if (t->t_tail[tn] != NO_SLOT)
        t->tnext[t->t_tail[tn]] = s;
    else
        t->t_head[tn] = s;
    t->t_tail[tn] = s;
    t->ev_seq[s] = t->next_seq++;
}

static void tenant_unlink(g3_tier *t, uint32_t s)
{
    uint8_t tn = t->slot_tenant[s];
    if (t->tprev[s] != NO_SLOT)
        t->tnext[t->tprev[s]] = t->tnext[s];
    else
        t->t_head[tn] = t->tnext[s];
    if (t->tnext[s] != NO_SLOT)
        t->tprev[t->tnext[s]] = t->tprev[s];
    else
        t->t_tail[tn] = t->tprev[s];
}

static void ev_push(g3_tier *t, uint32_t s)
{
    if (t->tnext) tenant_push(t, s);
    t->prev[s] = t->ev_tail;
    t->next[s] = NO_SLOT;
    if (t->ev_tail != NO_SLOT)
        t->next[t->ev_tail] = s;
    else
        t->ev_head = s;
    t->ev_tail = s;
    t->n_evictable++;
}

static void ev_unlink(g3_tier *t, uint32_t s)
{
    if (t->tnext) tenant_unlink(t, s);
    if (t->prev[s] != NO_SLOT)
        t->next[t->prev[s]] = t->next[s];
    else
        t->ev_head = t->next[s];
    if (t->next[s] != NO_SLOT)
        t->prev[t->next[s]] = t->prev[s];
    else
        t->ev_tail = t->prev[s];
    t->prev[s] = t->next[s] = NO_SLOT;
    t->n_evictable--;
}

static void free_push(g3_tier *t, uint32_t s)
{
    t->free_ring[(t->free_head + t->n_free) % t->n_slots] = s;
    t->n_free++;
}

/* A slot's block, counted under the block's tenant (core/tenants.h). */
static void set_owner(g3_tier *t, uint32_t s, tier_block id)
{
    if (t->owner[s] != TIER_BLOCK_NONE) host_lower_slots(t->kv, t->owner[s], -1);
    t->owner[s] = id;
    if (id != TIER_BLOCK_NONE) host_lower_slots(t->kv, id, 1);
    if (id != TIER_BLOCK_NONE && t->slot_tenant) t->slot_tenant[s] = host_tenant(t->kv, id);
}

/* A slot that failed its check is never handed out again. */
static void retire_slot(g3_tier *t, uint32_t s)
{
    set_owner(t, s, TIER_BLOCK_NONE);
    t->n_retired++;
}

static g3_tier *G(tier *t)
{
    return (g3_tier *)(void *)t;
}

/* The block leaves G3: inventory, policy, record pruned. */
static void drop_residency(kvcr_t *kv, tier_block id)
{
    tier_lower *lw = host_lower(kv, id);
    lw->state = G3_NONE;
    lw->slot = NO_SLOT;
    host_inventory(kv, KVCR_TIER_G3, true, &id, 1);
    host_lower_gone(kv, id);
}

/* Evicts the evictable slot s unless it is protected or the policy keeps
 * it. */
static bool try_evict(kvcr_t *kv, g3_tier *t, uint32_t s)
{
    tier_block id = t->owner[s];
    if (host_protected(kv, id)) return false;
    if (host_eviction_decision(kv, id, KVCR_TIER_G3) == KVCR_ACTION_KEEP) return false;
    ev_unlink(t, s);
    set_owner(t, s, TIER_BLOCK_NONE);
    drop_residency(kv, id);
    return true;
}

/* The oldest evictable slot the policy lets go, or NO_SLOT. */
static uint32_t evict_one(kvcr_t *kv, g3_tier *t)
{
    for (uint32_t s = t->ev_head; s != NO_SLOT; s = t->next[s])
        if (try_evict(kv, t, s)) return s;
    return NO_SLOT;
}

/* Quota-first: the oldest evictable slot of the tenants over their G3
 * quota (counting the slot `incoming` asks for) that the policy lets go,
 * or NO_SLOT; their lists are merged by the time each slot became
 * evictable, so only their slots are visited. */
static uint32_t evict_over_quota(kvcr_t *kv, g3_tier *t, tier_block incoming)
{
    uint32_t cur[KVCR_MAX_TENANTS + 1], n = host_conf(kv)->n_tenants;
    for (uint32_t tn = 0; tn <= n; tn++)
        cur[tn] = host_lower_over_quota(kv, tn, incoming) ? t->t_head[tn] : NO_SLOT;
    for (;;) {
        uint32_t best = n + 1;
        for (uint32_t tn = 0; tn <= n; tn++)
            if (cur[tn] != NO_SLOT && (best > n || t->ev_seq[cur[tn]] < t->ev_seq[cur[best]]))
                best = tn;
        if (best > n) return NO_SLOT;
        uint32_t s = cur[best];
        cur[best] = t->tnext[s]; /* read before s leaves the list */
        if (try_evict(kv, t, s)) return s;
    }
}

/* A slot for `incoming`: a free one, else an evicted one (tenants over
 * their quota first when the policy orders by quotas). */
static uint32_t take_slot(kvcr_t *kv, g3_tier *t, tier_block incoming)
{
    if (t->n_free == 0) {
        uint32_t s = t->tnext && host_quota_first(kv) ? evict_over_quota(kv, t, incoming)
                                                      : NO_SLOT;
        return s != NO_SLOT ? s : evict_one(kv, t);
    }
    uint32_t s = t->free_ring[t->free_head];
    t->free_head = (t->free_head + 1) % t->n_slots;
    t->n_free--;
    return s;
}

/* ---- the I/O thread ---------------------------------------------------------- */

static void list_push(g3_req **head, g3_req **tail, g3_req *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

static void on_io_done(void *ud, int result)
{
    g3_req *r = ud;
    g3_tier *t = r->t;
    t->in_store--;
    r->result = result;
    pthread_mutex_lock(&t->qlock);
    list_push(&t->done_head, &t->done_tail, r);
    pthread_mutex_unlock(&t->qlock);
    host_wake(t->kv);
}

static void submit(g3_tier *t, g3_req *r)
{
    if (r->kind == REQ_FAULT) { /* a test hook: the store is this thread's */
        g3_store_fail_next(t->store, r->slot, r->result);
        free(r);
        return;
    }
    g3_rec_extra x = {r->extra, r->tenant_len, r->extra + r->tenant_len, r->meta_len};
    int rc = r->kind == REQ_WRITE
                 ? g3_store_write_ex(t->store, r->slot, r->key, r->key_len, &x, r->buf,
                                     t->slot_size, on_io_done, r, NULL)
                 : g3_store_read(t->store, r->slot, r->key, r->key_len, r->buf, t->slot_size,
                                 on_io_done, r);
    t->in_store++;
    if (rc != 0) on_io_done(r, rc); /* nothing was queued */
}

static void *io_main(void *arg)
{
    g3_tier *t = arg;
    for (;;) {
        pthread_mutex_lock(&t->qlock);
        bool stop = t->stopping;
        g3_req *todo = t->held && !stop ? NULL : t->q_head;
        if (todo) t->q_head = t->q_tail = NULL;
        pthread_mutex_unlock(&t->qlock);
        g3_store_plug(t->store); /* what is queued goes out in one batch */
        for (g3_req *r = todo, *next; r; r = next) {
            next = r->next;
            submit(t, r);
        }
        g3_store_unplug(t->store);
        g3_store_progress(t->store);
        if (stop && todo == NULL && t->in_store == 0) return NULL;
        struct pollfd fds[2] = {{t->wake_fd, POLLIN, 0}, {g3_store_fd(t->store), POLLIN, 0}};
        if (poll(fds, 2, t->in_store ? 1 : 20) > 0 && (fds[0].revents & POLLIN)) {
            uint64_t ticks;
            ssize_t rd = read(t->wake_fd, &ticks, sizeof ticks);
            (void)rd;
        }
    }
}

static g3_req *req_new(g3_tier *t, uint8_t kind, uint32_t slot, tier_block id)
{
    uint32_t key_len;
    const uint8_t *key = host_block_key(t->kv, id, &key_len);
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL || (r->key = malloc(key_len ? key_len : 1)) == NULL) {
        free(r);
        return NULL;
    }
    memcpy(r->key, key, key_len);
    r->key_len = key_len;
    r->t = t;
    r->kind = kind;
    r->slot = slot;
    r->block = id;
    r->start_ns = kvcr_now_ns();
    return r;
}

static void enqueue(g3_tier *t, g3_req *r)
{
    pthread_mutex_lock(&t->qlock);
    list_push(&t->q_head, &t->q_tail, r);
    pthread_mutex_unlock(&t->qlock);
    event_signal(t->wake_fd);
}

/* Locked: what the spill's record carries besides the key, as far as it
 * fits: the block's tenant, then what the API layer keeps of the block
 * (metadata that does not fit stays in memory only; the API layer counts
 * it). */
static void take_extra(g3_tier *t, g3_req *r)
{
    const char *tenant = host_tenant_name(t->kv, r->block);
    size_t tl = tenant ? strlen(tenant) : 0;
    if (!g3_record_fits(r->key_len, tl, 0)) {
        t->tenant_unkept++;
        tl = 0;
    }
    if (tl) memcpy(r->extra, tenant, tl);
    size_t room = G3_REC_ROOM - r->key_len - tl - 1;
    if (room > UINT8_MAX) room = UINT8_MAX;
    size_t ml = host_block_meta(t->kv, r->block, r->extra + tl, room);
    r->tenant_len = (uint8_t)tl;
    r->meta_len = ml <= room ? (uint8_t)ml : 0;
}

/* ---- staging buffers ------------------------------------------------------------ */

/* A spill's staging buffer. Buffers are kept once allocated (at most
 * max_staging_bytes of them exist, the bound staging_bytes enforces), so a
 * spill copies into memory that is already mapped: a fresh 2 MiB buffer
 * costs 512 page faults before the copy can run, which made the copy, not
 * the disk, the spill's limit. Blocks of 2 MiB and more are aligned to
 * 2 MiB and advised as huge pages: one fault instead of 512, and one
 * physically contiguous segment per 2 MiB for the disk instead of 512
 * pages. Under the instance lock. */
static void *stage_take(g3_tier *t)
{
    if (t->n_stage_free > 0) return t->stage_free[--t->n_stage_free];
    size_t huge = 2u << 20, align = t->slot_size % huge == 0 ? huge : 4096;
    void *p = NULL;
    if (posix_memalign(&p, align, t->slot_size) != 0) return NULL;
    if (align == huge) {
        int rc = madvise(p, t->slot_size, MADV_HUGEPAGE); /* advice: 4 KiB pages also work */
        (void)rc;
    }
    return p;
}

/* Back to the pool; freed if the pool is full (cannot happen while
 * staging_bytes bounds the buffers in use). Under the instance lock. */
static void stage_give(g3_tier *t, void *p)
{
    if (t->n_stage_free < t->stage_cap)
        t->stage_free[t->n_stage_free++] = p;
    else
        free(p);
}

/* ---- spills ------------------------------------------------------------------- */

static bool g3_spill(tier *tt, tier_block id)
{
    g3_tier *t = G(tt);
    kvcr_t *kv = t->kv;
    tier_lower *lw = host_lower(kv, id);
    uint32_t key_len;
    host_block_key(kv, id, &key_len);
    if (lw->state != G3_NONE) return true; /* already there (or on its way) */
    if (host_block_segments(kv, id) != 1 || key_len > G3_KEY_MAX) return false;
    if (t->staging_bytes + t->slot_size > host_conf(kv)->g3.max_staging_bytes) return false;
    host_protect(kv, id, true); /* not its own G3 victim */
    uint32_t s = take_slot(kv, t, id);
    host_protect(kv, id, false);
    if (s == NO_SLOT) return false;
    g3_req *r = req_new(t, REQ_WRITE, s, id);
    if (r != NULL && (r->buf = stage_take(t)) == NULL) {
        free(r->key);
        free(r);
        r = NULL;
    }
    if (r == NULL) {
        free_push(t, s);
        return false;
    }
    take_extra(t, r);
    tier_dst seg;
    host_block_segment(kv, id, 0, &seg);
    memcpy(r->buf, seg.addr, t->slot_size);
    lw->state = G3_STORING;
    lw->slot = s;
    set_owner(t, s, id);
    t->staging_bytes += t->slot_size;
    t->pending_stores++;
    enqueue(t, r);
    return true;
}

static void settle_write(kvcr_t *kv, g3_tier *t, g3_req *r, tier_block *added,
                         uint32_t *n_added)
{
    tier_lower *lw = host_lower(kv, r->block);
    t->staging_bytes -= t->slot_size;
    t->pending_stores--;
    host_observe(kv, "g3_store", r->result == 0 ? "success" : "failed",
                 kvcr_ns_to_s(kvcr_now_ns() - r->start_ns));
    if (r->result == 0) host_count(kv, "g3_store", 1, t->slot_size);
    if (r->result == 0) {
        lw->state = G3_READY;
        ev_push(t, r->slot);
        if (added) added[(*n_added)++] = r->block;
        return;
    }
    /* A failed write leaves the slot's record unknown: never reused. */
    kvcr_log(host_logger(kv), KVCR_LOG_WARN, "G3 store to slot %u failed (%d); the slot is retired",
             r->slot, r->result);
    lw->state = G3_NONE;
    retire_slot(t, r->slot);
    host_recovery(kv, r->block, KVCR_TIER_G3, KVCR_TIER_LOCAL_G2, "transfer failed");
    host_lower_gone(kv, r->block);
}

/* ---- reads ---------------------------------------------------------------------- */

static bool g3_layout_ok(const tier *t, const uint32_t *pools, uint32_t n_segs)
{
    (void)t;
    return n_segs == 1 && pools[0] == 0; /* one slot of the single pool's block size */
}

/* G3's batches carry nothing: every read stands alone. */
static tier_batch *g3_begin(tier *t, const tier_batch_info *info)
{
    (void)info;
    return (tier_batch *)(void *)t;
}

static bool g3_holds(tier *t, tier_batch *b, tier_block id, const uint8_t *key, uint32_t len)
{
    (void)b, (void)key, (void)len;
    return id != TIER_BLOCK_NONE && host_lower(G(t)->kv, id)->state == G3_READY;
}

/* Claims the slot (no eviction under a read) and queues the read. */
static kvcr_reason g3_read(tier *tt, tier_batch *batch, const tier_read *rd)
{
    (void)batch;
    g3_tier *t = G(tt);
    tier_lower *lw = host_lower(t->kv, rd->block);
    g3_req *r = req_new(t, rd->fetch ? REQ_READ_FILL : REQ_READ_DELIVER, lw->slot, rd->block);
    if (r == NULL) return KVCR_REASON_NO_CAPACITY;
    r->buf = rd->dst[0].addr;
    r->token = rd->token;
    if (lw->busy++ == 0) ev_unlink(t, lw->slot);
    enqueue(t, r);
    return KVCR_REASON_NONE;
}

static void g3_end(tier *t, tier_batch *b)
{
    (void)t, (void)b;
}

/* A read ended: the slot is evictable again (at the tail: recently used),
 * or retired if it did not verify. */
static void settle_read(kvcr_t *kv, g3_tier *t, g3_req *r)
{
    tier_lower *lw = host_lower(kv, r->block);
    bool ok = r->result == 0;
    bool corrupt = r->result == G3_CORRUPT;
    const char *scope = r->kind == REQ_READ_FILL ? "g3_fill" : "g3_deliver";
    host_observe(kv, scope, ok ? "success" : "failed", kvcr_ns_to_s(kvcr_now_ns() - r->start_ns));
    if (ok) host_count(kv, scope, 1, t->slot_size);
    if (corrupt)
        kvcr_log(host_logger(kv), KVCR_LOG_ERROR,
                 "G3 slot %u failed its key or checksum check: the block is dropped and the "
                 "slot retired", r->slot);
    else if (!ok)
        kvcr_log(host_logger(kv), KVCR_LOG_WARN, "G3 read of slot %u failed (%d)", r->slot,
                 r->result);
    kvcr_reason why = ok ? KVCR_REASON_NONE : corrupt ? KVCR_REASON_CORRUPT
                                                      : KVCR_REASON_TRANSFER_ERROR;
    if (--lw->busy == 0) {
        if (corrupt) {
            retire_slot(t, r->slot);
            drop_residency(kv, r->block);
        } else {
            ev_push(t, r->slot);
        }
    }
    if (ok) host_access(kv, r->block);
    host_settle(kv, r->token, ok, why);
}

static void g3_settle(tier *tt)
{
    g3_tier *t = G(tt);
    kvcr_t *kv = t->kv;
    pthread_mutex_lock(&t->qlock);
    g3_req *done = t->done_head;
    t->done_head = t->done_tail = NULL;
    pthread_mutex_unlock(&t->qlock);
    uint32_t n = 0;
    for (g3_req *r = done; r; r = r->next) n++;
    tier_block *added = malloc((n ? n : 1) * sizeof *added);
    uint32_t n_added = 0;
    if (added == NULL)
        kvcr_log(host_logger(kv), KVCR_LOG_ERROR, "out of memory: G3 inventory events lost");
    for (g3_req *r = done, *next; r; r = next) {
        next = r->next;
        if (r->kind == REQ_WRITE) {
            settle_write(kv, t, r, added, &n_added);
            stage_give(t, r->buf);
        } else {
            settle_read(kv, t, r);
        }
        free(r->key);
        free(r);
    }
    host_inventory(kv, KVCR_TIER_G3, false, added, n_added);
    free(added);
}

/* ---- start, restart, stop ---------------------------------------------------------- */

typedef struct found {
    uint32_t slot;
    uint64_t generation;
    uint8_t *key; /* the key, then its tenant's name, then its metadata */
    uint32_t key_len;
    uint8_t tenant_len, meta_len;
} found;

typedef struct scan_acc {
    found *v;
    size_t n, cap;
    bool oom;
} scan_acc;

static void on_found(void *ud, const g3_slot_info *info)
{
    scan_acc *a = ud;
    uint64_t slot = info->slot, generation = info->generation;
    size_t key_len = info->key_len;
    const uint8_t *key = info->key;
    if (a->oom) return;
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        found *v = realloc(a->v, cap * sizeof *v);
        if (v == NULL) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    uint8_t *k = malloc(key_len + info->tenant_len + info->meta_len + 1);
    if (k == NULL) {
        a->oom = true;
        return;
    }
    memcpy(k, key, key_len);
    if (info->tenant_len) memcpy(k + key_len, info->tenant, info->tenant_len);
    if (info->meta_len) memcpy(k + key_len + info->tenant_len, info->meta, info->meta_len);
    a->v[a->n++] = (found){(uint32_t)slot, generation, k, (uint32_t)key_len,
                           (uint8_t)info->tenant_len, (uint8_t)info->meta_len};
}

static int by_generation(const void *x, const void *y)
{
    const found *a = x, *b = y;
    if (a->generation != b->generation) return a->generation < b->generation ? -1 : 1;
    return a->slot < b->slot ? -1 : a->slot > b->slot;
}

/* Warm restart: every slot that verifies becomes a READY block again, in
 * the order it was written; a key found twice keeps its newest copy. */
static int recover(kvcr_t *kv, g3_tier *t)
{
    scan_acc a = {0};
    g3_scan_stats stats;
    int rc = g3_store_scan(t->store, on_found, &a, &stats);
    if (rc == 0 && a.oom) rc = kvcr_fail(KVCR_ENOMEM, "out of memory rebuilding the G3 index");
    if (rc == 0 && host_reserve(kv, a.n) != 0)
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory rebuilding the G3 index");
    if (rc == 0 && a.n > 1) qsort(a.v, a.n, sizeof *a.v, by_generation);
    tier_block *ids = rc == 0 ? malloc((a.n ? a.n : 1) * sizeof *ids) : NULL;
    if (rc == 0 && ids == NULL) rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    uint32_t n_ids = 0;
    for (size_t i = a.n; rc == 0 && i-- > 0;) { /* newest first: it wins a duplicate */
        if (host_find(kv, a.v[i].key, a.v[i].key_len) != TIER_BLOCK_NONE) {
            a.v[i].slot = NO_SLOT; /* an older copy: its slot is free */
            continue;
        }
        const found *f = &a.v[i];
        tier_block id = host_lower_adopt(kv, f->key, f->key_len);
        if (id == TIER_BLOCK_NONE) {
            rc = kvcr_fail(KVCR_ENOMEM, "out of memory rebuilding the G3 index");
            break;
        }
        host_adopt_tenant(kv, id, f->key + f->key_len, f->tenant_len); /* before set_owner */
        host_meta_found(kv, id, f->key + f->key_len + f->tenant_len, f->meta_len, KVCR_TIER_G3);
        tier_lower *lw = host_lower(kv, id);
        lw->state = G3_READY;
        lw->slot = a.v[i].slot;
        set_owner(t, a.v[i].slot, id);
    }
    for (size_t i = 0; rc == 0 && i < a.n; i++) /* oldest first: evicted first */
        if (a.v[i].slot != NO_SLOT) {
            ev_push(t, a.v[i].slot);
            ids[n_ids++] = t->owner[a.v[i].slot];
        }
    for (uint32_t s = 0; rc == 0 && s < t->n_slots; s++)
        if (t->owner[s] == TIER_BLOCK_NONE) free_push(t, s);
    if (rc == 0) {
        host_inventory(kv, KVCR_TIER_G3, false, ids, n_ids);
        kvcr_log(host_logger(kv), stats.damaged ? KVCR_LOG_WARN : KVCR_LOG_INFO,
                 "G3: %u block(s) found again on disk, %u slot(s) free, %llu damaged record(s) "
                 "discarded",
                 n_ids, t->n_free, (unsigned long long)stats.damaged);
    }
    for (size_t i = 0; i < a.n; i++) free(a.v[i].key);
    free(a.v);
    free(ids);
    return rc;
}

static void g3_destroy(tier *tt);

/* The per-tenant lists, empty (only with tenants configured). */
static int tenant_lists_init(g3_tier *t)
{
    size_t n = t->n_slots;
    t->tprev = malloc(n * sizeof *t->tprev);
    t->tnext = malloc(n * sizeof *t->tnext);
    t->ev_seq = malloc(n * sizeof *t->ev_seq);
    t->slot_tenant = calloc(n, sizeof *t->slot_tenant);
    if (!t->tprev || !t->tnext || !t->ev_seq || !t->slot_tenant)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t tn = 0; tn <= KVCR_MAX_TENANTS; tn++) t->t_head[tn] = t->t_tail[tn] = NO_SLOT;
    return 0;
}

static int open_store(kvcr_t *kv, g3_tier *t)
{
    const kvcr_conf *conf = host_conf(kv);
    host_pool pool;
    host_pool_info(kv, 0, &pool);
    t->slot_size = pool.block_size;
    g3_store_options o = {.paths = conf->g3.paths, .n_paths = conf->g3.n_paths,
                          .capacity_bytes_per_file = conf->g3.capacity_bytes_per_file,
                          .slot_size = t->slot_size, .queue_depth = conf->g3.queue_depth,
                          .log = host_logger(kv)};
    int rc = g3_store_open(&o, &t->store);
    if (rc != 0) return rc;
    uint64_t n = g3_store_slots(t->store);
    if (n >= NO_SLOT) return kvcr_fail(KVCR_EINVAL, "G3 has too many slots (%llu)",
                                       (unsigned long long)n);
    t->n_slots = (uint32_t)n;
    uint64_t cap = conf->g3.max_staging_bytes / t->slot_size;
    t->stage_cap = (uint32_t)(cap < t->n_slots ? cap : t->n_slots);
    t->stage_free = calloc(t->stage_cap ? t->stage_cap : 1, sizeof *t->stage_free);
    t->free_ring = calloc(n, sizeof *t->free_ring);
    t->owner = malloc(n * sizeof *t->owner);
    t->prev = malloc(n * sizeof *t->prev);
    t->next = malloc(n * sizeof *t->next);
    if (!t->stage_free || !t->free_ring || !t->owner || !t->prev || !t->next)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t s = 0; s < t->n_slots; s++) t->owner[s] = TIER_BLOCK_NONE;
    t->ev_head = t->ev_tail = NO_SLOT;
    return conf->n_tenants > 0 ? tenant_lists_init(t) : 0;
}

int g3_start(kvcr_t *kv, g3_tier **out)
{
    g3_tier *t = calloc(1, sizeof *t);
    if (t == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    t->kv = kv;
    t->wake_fd = -1;
    pthread_mutex_init(&t->qlock, NULL);
    int rc = open_store(kv, t);
    if (rc == 0) rc = recover(kv, t);
    if (rc == 0 && (t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        rc = kvcr_fail(KVCR_ESYS, "eventfd failed: %s", strerror(errno));
    if (rc == 0 && pthread_create(&t->thread, NULL, io_main, t) != 0)
        rc = kvcr_fail(KVCR_ESYS, "cannot start the G3 I/O thread");
    if (rc != 0) {
        g3_destroy((tier *)(void *)t);
        return rc;
    }
    t->started = true;
    kvcr_log(host_logger(kv), KVCR_LOG_INFO,
             "G3 up: %zu file(s), %u slot(s) of %zu bytes, io_uring", host_conf(kv)->g3.n_paths,
             t->n_slots, t->slot_size);
    *out = t;
    return 0;
}

/* Waits for the I/O in flight and stops the thread; what landed is
 * settled by the core's last progress. */
static void g3_stop(tier *tt)
{
    g3_tier *t = G(tt);
    if (!t->started) return;
    pthread_mutex_lock(&t->qlock);
    t->stopping = true;
    pthread_mutex_unlock(&t->qlock);
    event_signal(t->wake_fd);
    pthread_join(t->thread, NULL);
    t->started = false;
}

static void g3_destroy(tier *tt)
{
    g3_tier *t = G(tt);
    g3_stop(tt);
    for (g3_req *r = t->done_head, *next; r; r = next) { /* never settled */
        next = r->next;
        if (r->kind == REQ_WRITE) free(r->buf);
        free(r->key);
        free(r);
    }
    if (t->store) g3_store_close(t->store);
    if (t->wake_fd >= 0) close(t->wake_fd);
    pthread_mutex_destroy(&t->qlock);
    for (uint32_t i = 0; i < t->n_stage_free; i++) free(t->stage_free[i]);
    free(t->stage_free);
    free(t->free_ring);
    free(t->owner);
    free(t->prev);
    free(t->next);
    free(t->tprev);
    free(t->tnext);
    free(t->ev_seq);
    free(t->slot_tenant);
    free(t);
}

static void g3_gauges(tier *tt, gauge_sink *s)
{
    const g3_tier *t = G(tt);
    double total = t->n_slots - t->n_retired;
    gauge_sink_add(s, "", "g3_total_slots", total);
    gauge_sink_add(s, "", "g3_free_slots", t->n_free);
    gauge_sink_add(s, "", "g3_allocated_slots", total - t->n_free);
    gauge_sink_add(s, "", "g3_evictable_slots", t->n_evictable);
    gauge_sink_add(s, "", "g3_pending_stores", t->pending_stores);
    gauge_sink_add(s, "", "g3_tenant_unkept", (double)t->tenant_unkept);
}

const tier_ops g3_tier_ops = {
    .version = TIER_OPS_VERSION,
    .name = "G3",
    .id = KVCR_TIER_G3,
    .stop = g3_stop,
    .destroy = g3_destroy,
    .settle = g3_settle,
    .gauges = g3_gauges,
    .begin = g3_begin,
    .holds = g3_holds,
    .read = g3_read,
    .end = g3_end,
    .spill = g3_spill,
    .layout_ok = g3_layout_ok,
};

tier *g3_tier_of(g3_tier *t)
{
    return (tier *)(void *)t;
}

void g3_test_fail_next(g3_tier *t, unsigned n, int err)
{
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL) return;
    r->kind = REQ_FAULT;
    r->slot = n;
    r->result = err;
    enqueue(t, r);
}

void g3_test_hold(g3_tier *t, bool hold)
{
    pthread_mutex_lock(&t->qlock);
    t->held = hold;
    pthread_mutex_unlock(&t->qlock);
    event_signal(t->wake_fd);
}
