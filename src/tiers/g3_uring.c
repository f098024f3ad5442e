/* The G3 slot store's I/O engine (g3_store.h): requests, index-block
 * updates, completions and close, over one io_uring.
 *
 * Requests are heap allocated at submission and wait in a FIFO; at most
 * queue_depth of them are in their data phase at once (the depth the
 * device sees), and at most 2 * queue_depth are active in all: a read whose
 * bytes are in but not verified yet, or a write whose data is written but
 * whose record update is not back yet, no longer counts against the depth
 * (a write's record is a 4 KiB read-modify-write queued behind the large
 * data I/Os: holding the write's place until it returns kept the device at
 * about half the depth). Memory the kernel reads or writes is aligned:
 * callers' buffers when they qualify, otherwise a bounce buffer per
 * request; record blocks of reads and index blocks being updated come from
 * pools of 2 * queue_depth 4 KiB buffers each. Neither pool can run dry: an
 * active request holds at most one of each.
 *
 * Every SQE's user_data is a pointer with a tag in its low bits saying what
 * completed: a request's data, a read's record block, or an index block.
 * Outstanding I/Os never exceed 2 * the active requests (a read has at most
 * two; a write one and a share of its index block's one; a clear only the
 * latter), so 4 * queue_depth, which is the ring's size: the SQ never fills
 * and the CQ never overflows.
 *
 * Threads: the one thread using the store (g3_store.h); no locks. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Valgrind cannot see the kernel fill a buffer through io_uring: without
 * this, memcheck reports every byte a G3 read brought in as uninitialised.
 * The client request is a few no-op instructions outside valgrind. */
#if defined(__has_include) && __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)(addr), (void)(len))
#endif

#include "kvcr/error.h"
#include "tiers/g3_store_int.h"

#define CLOSE_WAIT_TICKS 600 /* of 100 ms */

/* What a completion is about: the low bits of its user_data. */
enum { TAG_DATA = 0, TAG_RECORD = 1, TAG_BLOCK = 2, TAG_MASK = 3 };

typedef enum { OP_WRITE, OP_READ, OP_CLEAR } g3_op;

struct g3_req {
    g3_req *next;    /* in the FIFO or the done list */
    g3_req *ib_next; /* in an index block's pending or in-flight list */
    g3_op op;
    uint64_t slot, gen, fslot; /* fslot: index within its file */
    uint32_t file;
    uint8_t key_len;
    uint8_t tenant_len, meta_len; /* write: its record's version-2 part */
    uint8_t key[G3_REC_ROOM];     /* the key, then (write) the tenant and the metadata */
    const uint8_t *src; /* write */
    uint8_t *dst;       /* read */
    size_t len;
    g3_done_fn cb;
    void *ud;
    uint8_t *bounce;
    int recbuf;         /* read: its record block buffer, or -1 */
    unsigned active_at; /* index in st->active */
    unsigned ios;       /* own I/Os in flight */
    bool rec_pending;   /* write and clear: its record update is not back yet */
    bool parked;        /* write: data written, only the record update out (st->n_parked) */
    int result;
    uint64_t sum;       /* write: the data's checksum; read of a known slot: the expected one */
    uint8_t record[G3_RECORD_SIZE]; /* write and clear: the record to store */
};

/* An index block being updated (read-modify-write). Always exactly one I/O
 * in flight while in use. */
struct g3_iblock {
    bool used, writing;
    uint32_t file;
    uint64_t block;
    g3_req *pending, *pending_tail; /* not in buf yet */
    g3_req *inflight;               /* in the write in flight */
    uint8_t *buf;
};

static bool direct_ok(const void *p, size_t len)
{
    return ((uintptr_t)p % G3_ALIGN) == 0 && len % G3_ALIGN == 0;
}

/* ---- pools and ring ------------------------------------------------------------ */

static int setup_ring(g3_store *st)
{
    int rc = io_uring_queue_init(4 * st->qd, &st->ring, 0);
    if (rc < 0)
        return kvcr_fail(KVCR_ESYS, "G3 needs io_uring: io_uring_queue_init: %s", strerror(-rc));
    st->ring_ok = true;
    st->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (st->efd < 0) return kvcr_fail(KVCR_ESYS, "G3 eventfd: %s", strerror(errno));
    rc = io_uring_register_eventfd(&st->ring, st->efd);
    if (rc < 0) return kvcr_fail(KVCR_ESYS, "G3 io_uring_register_eventfd: %s", strerror(-rc));
    return 0;
}

static int alloc_pools(g3_store *st)
{
    st->active = calloc(2 * (size_t)st->qd, sizeof *st->active);
    st->free_recbufs = calloc(2 * (size_t)st->qd, sizeof *st->free_recbufs);
    st->blocks = calloc(2 * (size_t)st->qd, sizeof *st->blocks);
    st->recbufs = g3_aligned_alloc(2 * (size_t)st->qd * G3_ALIGN);
    st->blockbufs = g3_aligned_alloc(2 * (size_t)st->qd * G3_ALIGN);
    if (!st->active || !st->free_recbufs || !st->blocks || !st->recbufs || !st->blockbufs)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (unsigned i = 0; i < 2 * st->qd; i++) {
        st->blocks[i].buf = st->blockbufs + (size_t)i * G3_ALIGN;
        st->free_recbufs[i] = (int)i;
    }
    st->n_free_recbufs = 2 * st->qd;
    return 0;
}

int g3_engine_start(g3_store *st)
{
    int rc = alloc_pools(st);
    return rc == 0 ? setup_ring(st) : rc;
}

void g3_engine_free(g3_store *st)
{
    if (st->ring_ok) io_uring_queue_exit(&st->ring);
    if (st->efd >= 0) close(st->efd);
    free(st->active);
    free(st->free_recbufs);
    free(st->blocks);
    free(st->recbufs);
    free(st->blockbufs);
}

/* ---- submitting I/O ------------------------------------------------------------ */

/* Wakes whoever polls the eventfd: work is waiting that no completion
 * will announce (a request failed before its I/O, an SQE not submitted). */
static void poke(g3_store *st)
{
    /* A full counter still leaves the fd readable, which is all we need. */
    int rc = eventfd_write(st->efd, 1);
    (void)rc;
}

static void flush(g3_store *st)
{
    if (st->unsubmitted == 0) return;
    int rc = io_uring_submit(&st->ring);
    if (rc >= 0)
        st->unsubmitted = (unsigned)rc >= st->unsubmitted ? 0 : st->unsubmitted - (unsigned)rc;
    if (st->unsubmitted == 0) return;
    /* What the kernel did not take stays in the ring; the next
     * g3_store_progress tries again. */
    G3_LOG(st, KVCR_LOG_WARN, "G3 io_uring_submit: %s, %u requests not submitted (retrying)",
           rc < 0 ? strerror(-rc) : "partial", st->unsubmitted);
    poke(st);
}

static int queue_io(g3_store *st, bool write, int fd, void *buf, size_t len, uint64_t off,
                    void *owner, unsigned tag)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&st->ring);
    if (sqe == NULL) { /* cannot happen with the ring sized 4 * qd; never block on it */
        io_uring_submit(&st->ring);
        sqe = io_uring_get_sqe(&st->ring);
        if (sqe == NULL) return -EBUSY;
    }
    if (write) {
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    } else {
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
        VALGRIND_MAKE_MEM_DEFINED(buf, len);
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)owner | tag);
    st->unsubmitted++;
    st->ios++;
    return 0;
}

/* ---- finishing requests ----------------------------------------------------------- */

/* Appends r to the list head..tail linked through next (the FIFO, the
 * done, verify and unsealed lists: r is in one of them at a time). */
static void list_append(g3_req **head, g3_req **tail, g3_req *r)
{
    r->next = NULL;
    if (*tail)
        (*tail)->next = r;
    else
        *head = r;
    *tail = r;
}

static void remember(g3_store *st, const g3_req *r)
{
    slot_memo *m = &st->memo[r->slot];
    if (r->op == OP_READ) return;
    if (r->result != 0)
        m->state = MEMO_UNKNOWN; /* what is on disk now is anyone's guess */
    else if (r->op == OP_CLEAR)
        m->state = MEMO_EMPTY;
    else
        *m = (slot_memo){r->sum, g3_key_hash(r->key, r->key_len), r->len, MEMO_FULL};
}

static void finish(g3_store *st, g3_req *r)
{
    remember(st, r);
    if (r->parked) st->n_parked--;
    unsigned at = r->active_at;
    st->active[at] = st->active[--st->n_active];
    st->active[at]->active_at = at;
    if (r->recbuf >= 0) st->free_recbufs[st->n_free_recbufs++] = r->recbuf;
    r->recbuf = -1;
    if (r->op == OP_READ && r->result == 0 && r->bounce) memcpy(r->dst, r->bounce, r->len);
    free(r->bounce);
    r->bounce = NULL;
    list_append(&st->done, &st->done_tail, r);
    st->n_done++;
}

/* Ends r with err (0: success) once its own I/Os and its record update are
 * back. */
static void settle(g3_store *st, g3_req *r, int err)
{
    if (r->result == 0) r->result = err;
    if (r->ios == 0 && !r->rec_pending) finish(st, r);
}

/* r's record update ended (written, or failed with err). */
static void record_settle(g3_store *st, g3_req *r, int err)
{
    r->rec_pending = false;
    settle(st, r, err);
}

/* ---- index blocks (read-modify-write) --------------------------------------------- */

static void block_release(g3_iblock *b)
{
    b->used = false;
    b->pending = b->pending_tail = b->inflight = NULL;
}

static void settle_list(g3_store *st, g3_req *list, int err)
{
    for (g3_req *r = list, *next; r; r = next) {
        next = r->ib_next;
        record_settle(st, r, err);
    }
}

static void block_read(g3_store *st, g3_iblock *b)
{
    b->writing = false;
    int rc = queue_io(st, false, st->files[b->file].dfd, b->buf, G3_ALIGN,
                      g3_block_offset(&st->lay, b->block), b, TAG_BLOCK);
    if (rc == 0) return;
    settle_list(st, b->pending, rc);
    block_release(b);
    poke(st);
}

/* Copies the waiting records in and writes the block. The buffer is only
 * touched here, when no I/O of it is in flight. */
static void block_write(g3_store *st, g3_iblock *b)
{
    for (g3_req *r = b->pending; r; r = r->ib_next)
        memcpy(g3_record_in_block(b->buf, r->fslot), r->record, G3_RECORD_SIZE);
    b->inflight = b->pending;
    b->pending = b->pending_tail = NULL;
    b->writing = true;
    int rc = queue_io(st, true, st->files[b->file].dfd, b->buf, G3_ALIGN,
                      g3_block_offset(&st->lay, b->block), b, TAG_BLOCK);
    if (rc == 0) return;
    settle_list(st, b->inflight, rc);
    block_release(b);
    poke(st);
}

/* Hands r's record to its index block, reading the block first unless an
 * update of it is already in flight. */
static void block_join(g3_store *st, g3_req *r)
{
    uint64_t block = r->fslot / G3_RECS_PER_BLOCK;
    g3_iblock *b = NULL, *free_b = NULL;
    for (unsigned i = 0; i < 2 * st->qd && b == NULL; i++) {
        g3_iblock *c = &st->blocks[i];
        if (c->used && c->file == r->file && c->block == block) b = c;
        if (!c->used && free_b == NULL) free_b = c;
    }
    r->ib_next = NULL;
    r->rec_pending = true;
    if (b) {
        if (b->pending_tail)
            b->pending_tail->ib_next = r;
        else
            b->pending = r;
        b->pending_tail = r;
        return;
    }
    if (free_b == NULL) { /* the pool holds 2 * qd blocks, one per active request at most */
        record_settle(st, r, -EBUSY);
        poke(st);
        return;
    }
    b = free_b;
    b->used = true;
    b->file = r->file;
    b->block = block;
    b->pending = b->pending_tail = r;
    block_read(st, b);
}

static void block_done(g3_store *st, g3_iblock *b, int res)
{
    int err = res == G3_ALIGN ? 0 : res < 0 ? res : -EIO;
    if (!b->writing) {
        if (err == 0) {
            block_write(st, b);
        } else {
            settle_list(st, b->pending, err);
            block_release(b);
        }
        return;
    }
    g3_req *written = b->inflight;
    b->inflight = NULL;
    settle_list(st, written, err);
    if (b->pending == NULL)
        block_release(b);
    else if (err != 0)
        block_read(st, b); /* after a failed write the block on disk is unknown */
    else
        block_write(st, b);
}

/* ---- requests ------------------------------------------------------------------------ */

/* The data goes to the kernel first; its checksum is computed while the
 * disk writes it (seal_writes), then the record that carries it goes out
 * alongside. The record may land before the data: a crash in between
 * leaves a record whose data checksum fails, which a read reports as
 * G3_CORRUPT, so the record need not wait (waiting cost two serial 4 KiB
 * I/Os per write). */
static int start_write(g3_store *st, g3_req *r)
{
    const uint8_t *buf = r->src;
    size_t n = g3_aligned_len(r->len);
    if (!direct_ok(r->src, r->len)) {
        r->bounce = g3_aligned_alloc(n);
        if (r->bounce == NULL) return -ENOMEM;
        memcpy(r->bounce, r->src, r->len);
        memset(r->bounce + r->len, 0, n - r->len);
        buf = r->bounce;
    }
    uint64_t off = g3_data_offset(&st->lay, r->fslot);
    int rc = queue_io(st, true, st->files[r->file].dfd, (void *)buf, n, off, r, TAG_DATA);
    if (rc != 0) return rc;
    r->ios++;
    /* sealed by seal_writes once every write started with it is out */
    list_append(&st->unsealed, &st->unsealed_tail, r);
    return 0;
}

/* The writes pump just started: their data is handed to the kernel in one
 * submission first, then each checksum is computed (a 2 MiB block takes
 * about 0.2 ms) while the disk writes all of them, and each record joins
 * its index block. Hashing between submissions instead would hold the
 * second write of a batch back by the first one's hash. */
static void seal_writes(g3_store *st)
{
    if (st->unsealed == NULL) return;
    flush(st);
    g3_req *list = st->unsealed;
    st->unsealed = st->unsealed_tail = NULL;
    for (g3_req *r = list, *next; r; r = next) {
        next = r->next;
        r->sum = g3_data_checksum(r->src, r->len);
        const uint8_t *tenant = r->key + r->key_len;
        g3_record rec = {G3_REC_FULL, r->key_len, r->key, r->slot, r->gen, r->len, r->sum,
                         r->tenant_len, r->meta_len, tenant, tenant + r->tenant_len};
        g3_record_encode(r->record, st->seed, &rec);
        block_join(st, r);
    }
}

static int refuse_read(g3_store *st, const g3_req *r, const char *why)
{
    G3_LOG(st, KVCR_LOG_WARN, "G3 slot %llu (%s): %s", (unsigned long long)r->slot,
           st->files[r->file].path, why);
    return G3_CORRUPT;
}

/* A known slot is checked against its memo and only its data is read; an
 * unknown one reads its record block and its data together. */
static int start_read(g3_store *st, g3_req *r)
{
    const slot_memo *m = &st->memo[r->slot];
    if (m->state == MEMO_EMPTY) return refuse_read(st, r, "empty slot");
    if (m->state == MEMO_FULL && m->key_hash != g3_key_hash(r->key, r->key_len))
        return refuse_read(st, r, "another key");
    if (m->state == MEMO_FULL && m->len != r->len)
        return refuse_read(st, r, "another data length");
    size_t n = g3_aligned_len(r->len);
    uint8_t *buf = r->dst;
    if (!direct_ok(r->dst, r->len)) {
        r->bounce = g3_aligned_alloc(n);
        if (r->bounce == NULL) return -ENOMEM;
        buf = r->bounce;
    }
    int fd = st->files[r->file].dfd;
    if (m->state == MEMO_FULL) {
        r->sum = m->sum;
        int rc = queue_io(st, false, fd, buf, n, g3_data_offset(&st->lay, r->fslot), r,
                          TAG_DATA);
        if (rc == 0) r->ios++;
        return rc;
    }
    r->recbuf = st->free_recbufs[--st->n_free_recbufs];
    uint8_t *rb = st->recbufs + (size_t)r->recbuf * G3_ALIGN;
    uint64_t block = g3_block_offset(&st->lay, r->fslot / G3_RECS_PER_BLOCK);
    int rc = queue_io(st, false, fd, rb, G3_ALIGN, block, r, TAG_RECORD);
    if (rc != 0) return rc;
    r->ios++;
    rc = queue_io(st, false, fd, buf, n, g3_data_offset(&st->lay, r->fslot), r, TAG_DATA);
    if (rc == 0) r->ios++;
    return rc;
}

static void activate(g3_store *st, g3_req *r)
{
    r->active_at = st->n_active;
    st->active[st->n_active++] = r;
    if (r->op != OP_READ) st->memo[r->slot].state = MEMO_UNKNOWN; /* until it is back */
    int rc = 0;
    switch (r->op) {
    case OP_WRITE: rc = start_write(st, r); break;
    case OP_READ: rc = start_read(st, r); break;
    case OP_CLEAR:
        g3_record_encode(r->record, st->seed,
                         &(g3_record){.state = G3_REC_EMPTY, .slot = r->slot, .gen = r->gen});
        block_join(st, r);
        break;
    }
    if (rc != 0) {
        settle(st, r, rc);
        poke(st); /* its callback runs in the next progress */
    }
}

static bool slot_busy(const g3_store *st, uint64_t slot)
{
    for (unsigned i = 0; i < st->n_active; i++)
        if (st->active[i]->slot == slot) return true;
    return false;
}

/* Starts queued requests while there is room, in order: reads being
 * verified and writes waiting only for their record update leave the
 * depth to others (but stay active). The head waits while a request for
 * its slot is active. */
static void pump(g3_store *st)
{
    while (st->fifo && st->n_active - st->n_verifying - st->n_parked < st->qd &&
           st->n_active < 2 * st->qd &&
           !slot_busy(st, st->fifo->slot)) {
        g3_req *r = st->fifo;
        st->fifo = r->next;
        if (st->fifo == NULL) st->fifo_tail = NULL;
        st->n_fifo--;
        activate(st, r);
    }
    seal_writes(st);
}

static int new_request(g3_store *st, g3_op op, uint64_t slot, g3_done_fn cb, void *ud, g3_req **out)
{
    if (st == NULL) return kvcr_fail(KVCR_EINVAL, "G3 store is NULL");
    if (st->closing) return kvcr_fail(KVCR_ECLOSED, "G3 store is closing");
    if (slot >= st->n_slots)
        return kvcr_fail(KVCR_EINVAL, "G3 slot %llu out of range (%llu slots)",
                         (unsigned long long)slot, (unsigned long long)st->n_slots);
    if (cb == NULL) return kvcr_fail(KVCR_EINVAL, "G3 request callback is NULL");
    if (op != OP_READ && !st->scanned)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 store over existing files must be scanned before its first write");
    g3_req *r = calloc(1, sizeof *r);
    if (r == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    r->op = op;
    r->slot = slot;
    r->file = (uint32_t)(slot % st->lay.n_files);
    r->fslot = slot / st->lay.n_files;
    r->cb = cb;
    r->ud = ud;
    r->recbuf = -1;
    *out = r;
    return 0;
}

static int check_key(const void *key, size_t key_len)
{
    if (key == NULL || key_len == 0 || key_len > G3_KEY_MAX)
        return kvcr_fail(KVCR_EINVAL, "G3 key must be 1..%d bytes (longer keys are not spillable)",
                         G3_KEY_MAX);
    return 0;
}

static int check_data(const g3_store *st, const void *p, size_t len)
{
    if (p == NULL || len == 0 || len > st->lay.slot_size)
        return kvcr_fail(KVCR_EINVAL, "G3 data must be 1..%llu bytes (the slot size)",
                         (unsigned long long)st->lay.slot_size);
    return 0;
}

static void enqueue(g3_store *st, g3_req *r)
{
    list_append(&st->fifo, &st->fifo_tail, r);
    st->n_fifo++;
    if (st->plugged) return; /* g3_store_unplug starts it */
    pump(st);
    flush(st);
}

/* Inside a callback (in_progress) both are ignored: progress starts what
 * the callbacks queued. */
void g3_store_plug(g3_store *st)
{
    if (!st->in_progress) st->plugged = true;
}

void g3_store_unplug(g3_store *st)
{
    if (st->in_progress) return;
    st->plugged = false;
    pump(st);
    flush(st);
}

static int check_extra(size_t key_len, const g3_rec_extra *x)
{
    if (x == NULL) return 0;
    if ((x->tenant_len && x->tenant == NULL) || (x->meta_len && x->meta == NULL))
        return kvcr_fail(KVCR_EINVAL, "G3 record extra: a length without its bytes");
    if (!g3_record_fits(key_len, x->tenant_len, x->meta_len))
        return kvcr_fail(KVCR_EINVAL,
                         "G3 record has no room for a %zu-byte tenant and %zu bytes of metadata "
                         "beside a %zu-byte key (%d bytes in all)",
                         x->tenant_len, x->meta_len, key_len, G3_REC_ROOM);
    return 0;
}

int g3_store_write(g3_store *st, uint64_t slot, const void *key, size_t key_len, const void *data,
                   size_t len, g3_done_fn cb, void *ud, uint64_t *generation)
{
    return g3_store_write_ex(st, slot, key, key_len, NULL, data, len, cb, ud, generation);
}

int g3_store_write_ex(g3_store *st, uint64_t slot, const void *key, size_t key_len,
                      const g3_rec_extra *x, const void *data, size_t len, g3_done_fn cb,
                      void *ud, uint64_t *generation)
{
    int rc = check_key(key, key_len);
    if (rc == 0) rc = check_extra(key_len, x);
    if (rc == 0 && st) rc = check_data(st, data, len);
    g3_req *r = NULL;
    if (rc == 0) rc = new_request(st, OP_WRITE, slot, cb, ud, &r);
    if (rc != 0) return rc;
    memcpy(r->key, key, key_len);
    r->key_len = (uint8_t)key_len;
    if (x != NULL) {
        r->tenant_len = (uint8_t)x->tenant_len;
        r->meta_len = (uint8_t)x->meta_len;
        if (x->tenant_len) memcpy(r->key + key_len, x->tenant, x->tenant_len);
        if (x->meta_len) memcpy(r->key + key_len + x->tenant_len, x->meta, x->meta_len);
    }
    r->src = data;
    r->len = len;
    r->gen = st->next_gen++;
    if (generation) *generation = r->gen;
    enqueue(st, r);
    return 0;
}

int g3_store_read(g3_store *st, uint64_t slot, const void *key, size_t key_len, void *buf,
                  size_t len, g3_done_fn cb, void *ud)
{
    int rc = check_key(key, key_len);
    if (rc == 0 && st) rc = check_data(st, buf, len);
    g3_req *r = NULL;
    if (rc == 0) rc = new_request(st, OP_READ, slot, cb, ud, &r);
    if (rc != 0) return rc;
    memcpy(r->key, key, key_len);
    r->key_len = (uint8_t)key_len;
    r->dst = buf;
    r->len = len;
    enqueue(st, r);
    return 0;
}

int g3_store_clear(g3_store *st, uint64_t slot, g3_done_fn cb, void *ud)
{
    g3_req *r = NULL;
    int rc = new_request(st, OP_CLEAR, slot, cb, ud, &r);
    if (rc != 0) return rc;
    r->gen = st->next_gen++;
    enqueue(st, r);
    return 0;
}

/* ---- completions ----------------------------------------------------------------- */

/* A read whose I/Os all succeeded: the record must be a verified FULL one
 * for this slot, key and length, and the data must match its checksum. */
static void read_verify(g3_store *st, g3_req *r)
{
    const uint8_t *data = r->bounce ? r->bounce : r->dst;
    if (r->recbuf < 0) { /* a known slot: its key and length were checked at the start */
        if (g3_data_checksum(data, r->len) != r->sum) {
            r->result = G3_CORRUPT;
            refuse_read(st, r, "data checksum mismatch");
        }
        return;
    }
    const uint8_t *rec = g3_record_in_block(st->recbufs + (size_t)r->recbuf * G3_ALIGN, r->fslot);
    g3_record d;
    const char *why = NULL;
    if (g3_record_decode(rec, st->seed, r->slot, st->lay.slot_size, &d) != G3_REC_OK)
        why = "no valid record";
    else if (d.state != G3_REC_FULL)
        why = "empty slot";
    else if (d.key_len != r->key_len || memcmp(d.key, r->key, r->key_len) != 0)
        why = "another key";
    else if (d.len != r->len)
        why = "another data length";
    else if (d.sum != g3_data_checksum(data, r->len))
        why = "data checksum mismatch";
    if (why == NULL) return;
    r->result = G3_CORRUPT;
    refuse_read(st, r, why);
}

static void request_io_done(g3_store *st, g3_req *r, unsigned tag, int res)
{
    size_t want = tag == TAG_RECORD ? G3_ALIGN : g3_aligned_len(r->len);
    int err = res >= 0 && (size_t)res == want ? 0 : res < 0 ? res : -EIO;
    r->ios--;
    if (err != 0 && r->result == 0) r->result = err;
    if (r->ios > 0) return;
    if (r->op == OP_READ && r->result == 0) {
        /* Verified after the next requests are started (g3_store_progress):
         * hashing a large block here would leave the disk idle meanwhile. */
        list_append(&st->verify, &st->verify_tail, r);
        st->n_verifying++;
        return;
    }
    if (r->rec_pending) { /* a write: the rest is a 4 KiB record update */
        r->parked = true;
        st->n_parked++;
    }
    settle(st, r, 0);
}

static void verify_reads(g3_store *st)
{
    g3_req *list = st->verify;
    st->verify = st->verify_tail = NULL;
    for (g3_req *r = list, *next; r; r = next) {
        next = r->next;
        st->n_verifying--;
        read_verify(st, r);
        finish(st, r);
    }
}

static void complete(g3_store *st, uint64_t data, int res)
{
    if (st->fail_skip > 0) {
        st->fail_skip--;
    } else if (st->fail_n > 0) {
        st->fail_n--;
        res = -st->fail_err;
    }
    st->ios--;
    unsigned tag = (unsigned)(data & TAG_MASK);
    void *owner = (void *)(uintptr_t)(data & ~(uint64_t)TAG_MASK);
    if (tag == TAG_BLOCK)
        block_done(st, owner, res);
    else
        request_io_done(st, owner, tag, res);
}

/* Takes every completion waiting in the CQ. */
static void reap(g3_store *st)
{
    struct io_uring_cqe *cqe;
    /* Bounded: each I/O in flight completes once. */
    for (unsigned n = st->ios; n > 0 && io_uring_peek_cqe(&st->ring, &cqe) == 0; n--) {
        uint64_t data = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&st->ring, cqe);
        complete(st, data, res);
    }
}

static unsigned run_callbacks(g3_store *st)
{
    g3_req *list = st->done;
    st->done = st->done_tail = NULL;
    unsigned n = 0;
    for (g3_req *r = list, *next; r; r = next, n++) {
        next = r->next;
        st->n_done--;
        r->cb(r->ud, r->result);
        free(r);
    }
    return n;
}

unsigned g3_store_progress(g3_store *st)
{
    if (st == NULL || st->in_progress) return 0;
    st->in_progress = true;
    eventfd_t v;
    /* Drained before reaping: a completion posted after this wakes the fd again. */
    int rc = eventfd_read(st->efd, &v);
    (void)rc;
    reap(st);
    pump(st);
    flush(st);
    if (st->verify) {
        verify_reads(st);
        pump(st); /* their places are free now */
        flush(st);
    }
    unsigned n = run_callbacks(st);
    st->in_progress = false;
    return n;
}

/* ---- close -------------------------------------------------------------------------- */

/* Waits (bounded) for every request in flight: freeing memory the kernel
 * may still write into is not an option. */
static bool drain(g3_store *st)
{
    for (int i = 0; i < CLOSE_WAIT_TICKS && st->n_active > 0; i++) {
        flush(st);
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {0, 100 * 1000 * 1000};
        if (st->ios > 0) io_uring_wait_cqe_timeout(&st->ring, &cqe, &ts);
        reap(st);
        verify_reads(st);
        run_callbacks(st);
    }
    return st->n_active == 0;
}

void g3_store_close(g3_store *st)
{
    if (st == NULL) return;
    st->closing = true; /* callbacks from here on cannot submit */
    st->in_progress = true;
    run_callbacks(st); /* finished before the queued ones: callbacks stay in order */
    for (g3_req *r = st->fifo, *next; r; r = next) {
        next = r->next;
        r->cb(r->ud, -ECANCELED);
        free(r);
    }
    st->fifo = st->fifo_tail = NULL;
    st->n_fifo = 0;
    if (!drain(st)) {
        /* The files stay locked too: the kernel may still write to them. */
        G3_LOG(st, KVCR_LOG_ERROR,
               "G3 close: %u requests still in the kernel after %d s; "
               "leaking their memory and files",
               st->n_active, CLOSE_WAIT_TICKS / 10);
        return;
    }
    g3_store_free(st, false);
}

/* ---- small accessors ------------------------------------------------------------------ */

int g3_store_fd(const g3_store *st)
{
    return st->efd;
}

size_t g3_store_pending(const g3_store *st)
{
    return st->n_active + st->n_fifo + st->n_done;
}

void g3_store_fail_after(g3_store *st, unsigned skip, unsigned n, int err)
{
    st->fail_skip = skip;
    st->fail_n = n;
    st->fail_err = err < 0 ? -err : err;
}

void g3_store_fail_next(g3_store *st, unsigned n, int err)
{
    g3_store_fail_after(st, 0, n, err);
}
