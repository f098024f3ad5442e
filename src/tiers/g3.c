/* The G3 tier: slots, spills, reads, G3 eviction, warm restart, and the
 * I/O thread that owns the store (see tiers/g3.h). */
#include "tiers/g3.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/ops.h"
#include "core/residency.h"
#include "core/testing.h"
#include "tiers/g3_store.h"
#include "util/clock.h"
#include "util/event.h"

#define NO_SLOT UINT32_MAX

enum req_kind { REQ_WRITE = 1, REQ_READ_FILL, REQ_READ_DELIVER, REQ_FAULT };

typedef struct g3_req {
    struct g3_req *next;
    struct g3_tier *t;
    uint8_t kind;
    uint32_t slot;
    block_id block;
    uint8_t *key;        /* owned copy: the I/O thread reads it unlocked */
    uint32_t key_len;
    void *buf;           /* write: the staging copy; read: the destination */
    struct fill *fill;   /* REQ_READ_FILL */
    op_rec *op;          /* REQ_READ_DELIVER */
    uint32_t idx;
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
    block_id *owner;     /* per slot: its block, BLOCK_NONE if free */
    uint32_t *prev, *next; /* the evictable list: READY, unclaimed, oldest first */
    uint32_t ev_head, ev_tail, n_evictable;
    uint32_t n_retired;
    uint64_t staging_bytes;
    uint32_t pending_stores;
};

/* ---- slots ------------------------------------------------------------------ */

static void ev_push(g3_tier *t, uint32_t s)
{
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

/* A slot that failed its check is never handed out again. */
static void retire_slot(g3_tier *t, uint32_t s)
{
    t->owner[s] = BLOCK_NONE;
    t->n_retired++;
}

/* The block leaves G3: inventory, policy, record pruned. */
static void drop_residency(kvcr_t *kv, block_id id)
{
    block *b = index_get(&kv->index, id);
    b->g3_state = G3_NONE;
    b->g3_slot = NO_SLOT;
    res_queue_event(kv, KVCR_TIER_G3, true, &id, 1);
    if (b->g2_state == G2_NONE) res_removed(kv, id);
    res_prune(kv, id);
}

/* The oldest evictable slot the policy lets go, or NO_SLOT. */
static uint32_t evict_one(kvcr_t *kv, g3_tier *t)
{
    for (uint32_t s = t->ev_head; s != NO_SLOT; s = t->next[s]) {
        block_id id = t->owner[s];
        if (index_get(&kv->index, id)->flags & BF_PROTECTED) continue;
        if (res_eviction_decision(kv, id, KVCR_TIER_G3) == KVCR_ACTION_KEEP) continue;
        ev_unlink(t, s);
        t->owner[s] = BLOCK_NONE;
        drop_residency(kv, id);
        return s;
    }
    return NO_SLOT;
}

static uint32_t take_slot(kvcr_t *kv, g3_tier *t)
{
    if (t->n_free == 0) return evict_one(kv, t);
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
    event_signal(t->kv->event_fd);
}

static void submit(g3_tier *t, g3_req *r)
{
    if (r->kind == REQ_FAULT) { /* a test hook: the store is this thread's */
        g3_store_fail_next(t->store, r->slot, r->result);
        free(r);
        return;
    }
    int rc = r->kind == REQ_WRITE
                 ? g3_store_write(t->store, r->slot, r->key, r->key_len, r->buf, t->slot_size,
                                  on_io_done, r, NULL)
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
        for (g3_req *r = todo, *next; r; r = next) {
            next = r->next;
            submit(t, r);
        }
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

static g3_req *req_new(g3_tier *t, uint8_t kind, uint32_t slot, block_id id)
{
    const block *b = index_get(&t->kv->index, id);
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL || (r->key = malloc(b->key_len)) == NULL) {
        free(r);
        return NULL;
    }
    memcpy(r->key, block_key(b), b->key_len);
    r->key_len = b->key_len;
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

/* ---- spills ------------------------------------------------------------------- */

bool g3_spill(kvcr_t *kv, block_id id)
{
    g3_tier *t = kv->g3;
    block *b = index_get(&kv->index, id);
    if (b->g3_state != G3_NONE) return true; /* already there (or on its way) */
    if (b->n_slots != 1 || b->key_len > G3_KEY_MAX) return false;
    if (t->staging_bytes + t->slot_size > kv->conf.g3.max_staging_bytes) return false;
    b->flags |= BF_PROTECTED; /* not its own G3 victim */
    uint32_t s = take_slot(kv, t);
    b->flags &= (uint8_t)~BF_PROTECTED;
    if (s == NO_SLOT) return false;
    g3_req *r = req_new(t, REQ_WRITE, s, id);
    if (r != NULL && (r->buf = aligned_alloc(4096, t->slot_size)) == NULL) {
        free(r->key);
        free(r);
        r = NULL;
    }
    if (r == NULL) {
        free_push(t, s);
        return false;
    }
    uint32_t pool, slot;
    res_slot(kv, b, 0, &pool, &slot);
    memcpy(r->buf, dram_slot_addr(&kv->pools[pool], slot), t->slot_size);
    b->g3_state = G3_STORING;
    b->g3_slot = s;
    t->owner[s] = id;
    t->staging_bytes += t->slot_size;
    t->pending_stores++;
    enqueue(t, r);
    return true;
}

static void settle_write(kvcr_t *kv, g3_tier *t, g3_req *r, block_id *added, uint32_t *n_added)
{
    block *b = index_get(&kv->index, r->block);
    t->staging_bytes -= t->slot_size;
    t->pending_stores--;
    if (kv->telemetry) {
        telemetry_observe(kv->telemetry, "g3_store", r->result == 0 ? "success" : "failed",
                          kvcr_ns_to_s(kvcr_now_ns() - r->start_ns));
        if (r->result == 0) telemetry_count(kv->telemetry, "g3_store", 1, t->slot_size);
    }
    if (r->result == 0) {
        b->g3_state = G3_READY;
        ev_push(t, r->slot);
        if (added) added[(*n_added)++] = r->block;
        return;
    }
    /* A failed write leaves the slot's record unknown: never reused. */
    kvcr_log(&kv->log, KVCR_LOG_WARN, "G3 store to slot %u failed (%d); the slot is retired",
             r->slot, r->result);
    b->g3_state = G3_NONE;
    retire_slot(t, r->slot);
    res_recovery(kv, r->block, KVCR_TIER_G3, KVCR_TIER_LOCAL_G2, "transfer failed");
    if (b->g2_state == G2_NONE) res_removed(kv, r->block);
    res_prune(kv, r->block);
}

/* ---- reads ---------------------------------------------------------------------- */

static kvcr_reason start_read(kvcr_t *kv, block_id id, g3_req **out, uint8_t kind, void *dst)
{
    g3_tier *t = kv->g3;
    block *b = index_get(&kv->index, id);
    g3_req *r = req_new(t, kind, b->g3_slot, id);
    if (r == NULL) return KVCR_REASON_NO_CAPACITY;
    r->buf = dst;
    if (b->g3_claims++ == 0) ev_unlink(t, b->g3_slot);
    *out = r;
    return KVCR_REASON_NONE;
}

kvcr_reason g3_read_fill(kvcr_t *kv, block_id id, struct fill *f, void *dst)
{
    g3_req *r;
    kvcr_reason why = start_read(kv, id, &r, REQ_READ_FILL, dst);
    if (why != KVCR_REASON_NONE) return why;
    r->fill = f;
    enqueue(kv->g3, r);
    return KVCR_REASON_NONE;
}

kvcr_reason g3_read_deliver(kvcr_t *kv, block_id id, op_rec *o, uint32_t idx, void *dst)
{
    g3_req *r;
    kvcr_reason why = start_read(kv, id, &r, REQ_READ_DELIVER, dst);
    if (why != KVCR_REASON_NONE) return why;
    r->op = o;
    r->idx = idx;
    enqueue(kv->g3, r);
    return KVCR_REASON_NONE;
}

/* A read ended: the slot is evictable again (at the tail: recently used),
 * or retired if it did not verify. */
static void settle_read(kvcr_t *kv, g3_tier *t, g3_req *r)
{
    block *b = index_get(&kv->index, r->block);
    bool ok = r->result == 0;
    bool corrupt = r->result == G3_CORRUPT;
    const char *scope = r->kind == REQ_READ_FILL ? "g3_fill" : "g3_deliver";
    if (kv->telemetry) {
        telemetry_observe(kv->telemetry, scope, ok ? "success" : "failed",
                          kvcr_ns_to_s(kvcr_now_ns() - r->start_ns));
        if (ok) telemetry_count(kv->telemetry, scope, 1, t->slot_size);
    }
    if (corrupt)
        kvcr_log(&kv->log, KVCR_LOG_ERROR,
                 "G3 slot %u failed its key or checksum check: the block is dropped and the "
                 "slot retired", r->slot);
    else if (!ok)
        kvcr_log(&kv->log, KVCR_LOG_WARN, "G3 read of slot %u failed (%d)", r->slot, r->result);
    kvcr_reason why = ok ? KVCR_REASON_NONE : corrupt ? KVCR_REASON_CORRUPT
                                                      : KVCR_REASON_TRANSFER_ERROR;
    if (--b->g3_claims == 0) {
        if (corrupt) {
            retire_slot(t, r->slot);
            drop_residency(kv, r->block);
        } else {
            ev_push(t, r->slot);
        }
    }
    if (ok) res_access(kv, r->block);
    if (r->kind == REQ_READ_FILL)
        ops_fill_settle(kv, r->fill, ok, why);
    else
        ops_entry_settle(kv, r->op, r->idx, ok, why);
}

void g3_settle(kvcr_t *kv)
{
    g3_tier *t = kv->g3;
    if (t == NULL) return;
    pthread_mutex_lock(&t->qlock);
    g3_req *done = t->done_head;
    t->done_head = t->done_tail = NULL;
    pthread_mutex_unlock(&t->qlock);
    uint32_t n = 0;
    for (g3_req *r = done; r; r = r->next) n++;
    block_id *added = malloc((n ? n : 1) * sizeof *added);
    uint32_t n_added = 0;
    if (added == NULL) kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: G3 inventory events lost");
    for (g3_req *r = done, *next; r; r = next) {
        next = r->next;
        if (r->kind == REQ_WRITE) {
            settle_write(kv, t, r, added, &n_added);
            free(r->buf);
        } else {
            settle_read(kv, t, r);
        }
        free(r->key);
        free(r);
    }
    res_queue_event(kv, KVCR_TIER_G3, false, added, n_added);
    free(added);
}

/* ---- start, restart, stop ---------------------------------------------------------- */

typedef struct found {
    uint32_t slot;
    uint64_t generation;
    uint8_t *key;
    uint32_t key_len;
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
    uint8_t *k = malloc(key_len ? key_len : 1);
    if (k == NULL) {
        a->oom = true;
        return;
    }
    memcpy(k, key, key_len);
    a->v[a->n++] = (found){(uint32_t)slot, generation, k, (uint32_t)key_len};
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
    if (rc == 0 && index_reserve(&kv->index, a.n) != 0)
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory rebuilding the G3 index");
    if (rc == 0 && a.n > 1) qsort(a.v, a.n, sizeof *a.v, by_generation);
    block_id *ids = rc == 0 ? malloc((a.n ? a.n : 1) * sizeof *ids) : NULL;
    if (rc == 0 && ids == NULL) rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    uint32_t n_ids = 0;
    for (size_t i = a.n; rc == 0 && i-- > 0;) { /* newest first: it wins a duplicate */
        uint64_t h = index_hash(a.v[i].key, a.v[i].key_len);
        if (index_find(&kv->index, a.v[i].key, a.v[i].key_len, h) != BLOCK_NONE) {
            a.v[i].slot = NO_SLOT; /* an older copy: its slot is free */
            continue;
        }
        block_id id = index_insert(&kv->index, a.v[i].key, a.v[i].key_len, h);
        if (id == BLOCK_NONE) {
            rc = kvcr_fail(KVCR_ENOMEM, "out of memory rebuilding the G3 index");
            break;
        }
        block *b = index_get(&kv->index, id);
        b->g3_state = G3_READY;
        b->g3_slot = a.v[i].slot;
        t->owner[a.v[i].slot] = id;
    }
    for (size_t i = 0; rc == 0 && i < a.n; i++) /* oldest first: evicted first */
        if (a.v[i].slot != NO_SLOT) {
            ev_push(t, a.v[i].slot);
            ids[n_ids++] = t->owner[a.v[i].slot];
        }
    for (uint32_t s = 0; rc == 0 && s < t->n_slots; s++)
        if (t->owner[s] == BLOCK_NONE) free_push(t, s);
    if (rc == 0) {
        res_queue_event(kv, KVCR_TIER_G3, false, ids, n_ids);
        kvcr_log(&kv->log, stats.damaged ? KVCR_LOG_WARN : KVCR_LOG_INFO,
                 "G3: %u block(s) found again on disk, %u slot(s) free, %llu damaged record(s) "
                 "discarded",
                 n_ids, t->n_free, (unsigned long long)stats.damaged);
    }
    for (size_t i = 0; i < a.n; i++) free(a.v[i].key);
    free(a.v);
    free(ids);
    return rc;
}

int g3_start(kvcr_t *kv)
{
    g3_tier *t = calloc(1, sizeof *t);
    if (t == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    kv->g3 = t;
    t->kv = kv;
    t->wake_fd = -1;
    pthread_mutex_init(&t->qlock, NULL);
    t->slot_size = kv->pools[0].block_size;
    g3_store_options o = {.paths = kv->conf.g3.paths, .n_paths = kv->conf.g3.n_paths,
                          .capacity_bytes_per_file = kv->conf.g3.capacity_bytes_per_file,
                          .slot_size = t->slot_size, .queue_depth = kv->conf.g3.queue_depth,
                          .log = &kv->log};
    int rc = g3_store_open(&o, &t->store);
    if (rc != 0) return rc;
    uint64_t n = g3_store_slots(t->store);
    if (n >= NO_SLOT) return kvcr_fail(KVCR_EINVAL, "G3 has too many slots (%llu)",
                                       (unsigned long long)n);
    t->n_slots = (uint32_t)n;
    t->free_ring = calloc(n, sizeof *t->free_ring);
    t->owner = malloc(n * sizeof *t->owner);
    t->prev = malloc(n * sizeof *t->prev);
    t->next = malloc(n * sizeof *t->next);
    if (!t->free_ring || !t->owner || !t->prev || !t->next)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t s = 0; s < t->n_slots; s++) t->owner[s] = BLOCK_NONE;
    t->ev_head = t->ev_tail = NO_SLOT;
    if ((rc = recover(kv, t)) != 0) return rc;
    if ((t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        return kvcr_fail(KVCR_ESYS, "eventfd failed: %s", strerror(errno));
    if (pthread_create(&t->thread, NULL, io_main, t) != 0)
        return kvcr_fail(KVCR_ESYS, "cannot start the G3 I/O thread");
    t->started = true;
    kvcr_log(&kv->log, KVCR_LOG_INFO, "G3 up: %zu file(s), %u slot(s) of %zu bytes, io_uring",
             kv->conf.g3.n_paths, t->n_slots, t->slot_size);
    return 0;
}

void g3_stop(kvcr_t *kv)
{
    g3_tier *t = kv->g3;
    if (t == NULL || !t->started) return;
    pthread_mutex_lock(&t->qlock);
    t->stopping = true;
    pthread_mutex_unlock(&t->qlock);
    event_signal(t->wake_fd);
    pthread_join(t->thread, NULL);
    t->started = false;
}

void g3_destroy(kvcr_t *kv)
{
    g3_tier *t = kv->g3;
    if (t == NULL) return;
    g3_stop(kv);
    for (g3_req *r = t->done_head, *next; r; r = next) { /* never settled */
        next = r->next;
        if (r->kind == REQ_WRITE) free(r->buf);
        free(r->key);
        free(r);
    }
    if (t->store) g3_store_close(t->store);
    if (t->wake_fd >= 0) close(t->wake_fd);
    pthread_mutex_destroy(&t->qlock);
    free(t->free_ring);
    free(t->owner);
    free(t->prev);
    free(t->next);
    free(t);
    kv->g3 = NULL;
}

void g3_gauges(const kvcr_t *kv, double *total, double *free_, double *evictable,
               double *pending)
{
    const g3_tier *t = kv->g3;
    *total = t->n_slots - t->n_retired;
    *free_ = t->n_free;
    *evictable = t->n_evictable;
    *pending = t->pending_stores;
}

void kvcr__test_g3_fail_next(kvcr_t *kv, unsigned n, int err)
{
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL || kv->g3 == NULL) {
        free(r);
        return;
    }
    r->kind = REQ_FAULT;
    r->slot = n;
    r->result = err;
    enqueue(kv->g3, r);
}

void kvcr__test_g3_hold(kvcr_t *kv, bool hold)
{
    g3_tier *t = kv->g3;
    pthread_mutex_lock(&t->qlock);
    t->held = hold;
    pthread_mutex_unlock(&t->qlock);
    event_signal(t->wake_fd);
}
