#include "core/ops.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/residency.h"
#include "core/host.h"
#include "core/lower.h"
#include "util/clock.h"
#include "util/event.h"

/* ---- argument checks (no lock: they read only the immutable config) ----- */

bool ops_valid_key(const kvcr_key *k)
{
    return k->data != NULL && k->len >= 1 && k->len <= KVCR_KEY_MAX;
}

static int check_key(const kvcr_key *k, size_t i)
{
    if (!ops_valid_key(k))
        return kvcr_fail(KVCR_EINVAL, "key %zu must have 1 to %d bytes and non-NULL data", i,
                         KVCR_KEY_MAX);
    return 0;
}

typedef struct hashed {
    uint64_t hash;
    uint32_t idx;
} hashed;

static int by_hash(const void *a, const void *b)
{
    const hashed *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Marks dup[i] for every key equal to an earlier one. Returns how many, or
 * -1 without memory. */
static long mark_duplicates(const kvcr_key *const *keys, size_t n, bool *dup)
{
    hashed *h = malloc((n ? n : 1) * sizeof *h);
    if (h == NULL) return -1;
    for (size_t i = 0; i < n; i++) {
        h[i].hash = index_hash(keys[i]->data, keys[i]->len);
        h[i].idx = (uint32_t)i;
        dup[i] = false;
    }
    qsort(h, n, sizeof *h, by_hash);
    long count = 0;
    for (size_t i = 1; i < n; i++) {
        for (size_t j = i; j-- > 0 && h[j].hash == h[i].hash;) {
            const kvcr_key *a = keys[h[i].idx], *b = keys[h[j].idx];
            if (!dup[h[j].idx] && a->len == b->len && memcmp(a->data, b->data, a->len) == 0) {
                dup[h[i].idx] = true; /* h[j] sorts first, so it came first */
                count++;
                break;
            }
        }
    }
    free(h);
    return count;
}

/* The pieces of a framework reference (core/conf.h): into out[PIECES_MAX],
 * with the pool its label names. 0 or an error naming the rule. */
static int ref_pieces(const kvcr_t *kv, const kvcr_mem_ref *r, mem_piece *out, uint32_t *n,
                      uint32_t *pool)
{
    if (r->end_point != NULL && r->end_point[0] != '\0' &&
        strcmp(r->end_point, kv->conf.agent_name) != 0)
        return kvcr_fail(KVCR_EINVAL, "block descriptor end point '%s' is not this instance ('%s')",
                         r->end_point, kv->conf.agent_name);
    const char *label = r->label ? r->label : "", *why = NULL;
    *n = pieces_resolve(kv->conf.geom, kv->conf.n_regions, true, label, r->index, out, &why);
    if (*n == 0 && strcmp(why, "index out of range") == 0) {
        const fw_region *reg = &kv->conf.regions[out[0].region];
        return kvcr_fail(KVCR_EINVAL,
                         "block descriptor index %llu is out of range for region '%s' (count %zu)",
                         (unsigned long long)r->index, reg->label, reg->count);
    }
    if (*n == 0)
        return kvcr_fail(KVCR_EINVAL,
                         "block descriptors must use configured pools: no framework region is "
                         "labelled '%s'%s",
                         label, strlen(label) > 2 && strcmp(label + strlen(label) - 2, PART_ALL) == 0
                                    ? " (nor any part of that pool)" : "");
    const fw_region *reg = &kv->conf.regions[out[0].region];
    const dram_pool *p = &kv->pools[reg->pool];
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < *n; k++) bytes += out[k].len;
    if (bytes != p->block_size)
        return kvcr_fail(KVCR_EINVAL,
                         "block descriptor has the wrong byte count: region '%s' elements are "
                         "%zu bytes, pool '%s' blocks %zu%s",
                         label, (size_t)bytes, p->name, p->block_size,
                         reg->part ? " (a block in parts is named whole: 'pool:*')" : "");
    *pool = reg->pool;
    return 0;
}

int ops_check_refs(const kvcr_t *kv, const kvcr_mem_ref *refs, size_t n)
{
    if (n == 0 || refs == NULL)
        return kvcr_fail(KVCR_EINVAL, "each block requires at least one descriptor");
    if (n > 255) return kvcr_fail(KVCR_EINVAL, "a block spans at most 255 layout entries");
    mem_piece pc[PIECES_MAX];
    const fw_region *first = NULL;
    for (size_t j = 0; j < n; j++) {
        uint32_t np, pool;
        int rc = ref_pieces(kv, &refs[j], pc, &np, &pool);
        if (rc != 0) return rc;
        const fw_region *reg = &kv->conf.regions[pc[0].region];
        if (first == NULL) first = reg;
        if (reg->mem_type != first->mem_type || reg->device_id != first->device_id)
            return kvcr_fail(KVCR_EINVAL, "block descriptors must share one memory type and device");
    }
    return 0;
}

uint32_t ops_ref_pieces(const kvcr_t *kv, const kvcr_mem_ref *r, mem_piece *out, uint32_t *pool)
{
    uint32_t n = 0;
    return ref_pieces(kv, r, out, &n, pool) == 0 ? n : 0;
}

/* The label peers resolve a checked reference by: the pool's "pool:*" for
 * a block in parts, else the region's own (configuration-owned: it
 * outlives the caller's string). */
static const char *ref_label(const kvcr_t *kv, const mem_piece *first)
{
    const fw_region *reg = &kv->conf.regions[first->region];
    return reg->part ? kv->conf.part_labels[reg->pool] : reg->label;
}

/* Counts the pieces of checked references refs[0..n). */
static size_t count_pieces(const kvcr_t *kv, const kvcr_mem_ref *refs, size_t n)
{
    mem_piece pc[PIECES_MAX];
    size_t total = 0;
    for (size_t j = 0; j < n; j++) total += ops_ref_pieces(kv, &refs[j], pc, &(uint32_t){0});
    return total;
}

/* Validates a deposit's or deliver's blocks completely; *total_refs is the
 * number of layout entries over all blocks. */
static int check_blocks(const kvcr_t *kv, const kvcr_block *blocks, size_t n, size_t *total_refs,
                        size_t *total_pieces)
{
    if (n > 0 && blocks == NULL) return kvcr_fail(KVCR_EINVAL, "blocks must not be NULL");
    if (n > UINT32_MAX / 2) return kvcr_fail(KVCR_EINVAL, "too many blocks in one call");
    size_t total = 0, pieces = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = check_key(&blocks[i].key, i);
        if (rc == 0) rc = ops_check_refs(kv, blocks[i].refs, blocks[i].n_refs);
        if (rc != 0) return rc;
        total += blocks[i].n_refs;
        pieces += count_pieces(kv, blocks[i].refs, blocks[i].n_refs);
    }
    if (pieces > UINT32_MAX / 2) return kvcr_fail(KVCR_EINVAL, "too many pieces in one call");
    const kvcr_key **keys = calloc(n ? n : 1, sizeof *keys);
    bool *dup = calloc(n ? n : 1, sizeof *dup);
    long dups = keys && dup ? 0 : -1;
    for (size_t i = 0; dups == 0 && i < n; i++) keys[i] = &blocks[i].key;
    if (dups == 0) dups = mark_duplicates(keys, n, dup);
    free(keys);
    free(dup);
    if (dups < 0) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (dups > 0) return kvcr_fail(KVCR_EINVAL, "a batch must not name the same key twice");
    *total_refs = total;
    *total_pieces = pieces;
    return 0;
}

/* ---- operation records -------------------------------------------------- */

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

/* One allocation: the op, its entries, keys, layout (with the framework
 * pieces of each layout entry) and result slots. */
static op_rec *op_new(enum op_kind kind, const kvcr_key *const *keys, size_t n, size_t total_segs,
                      size_t total_pieces)
{
    size_t key_bytes = 0;
    for (size_t i = 0; i < n; i++) key_bytes += keys[i]->len;
    size_t off_e = align8(sizeof(op_rec));
    size_t off_piece = align8(off_e + n * sizeof(op_entry));
    size_t off_pieces = align8(off_piece + (total_segs + 1) * sizeof(uint32_t));
    size_t off_pool = align8(off_pieces + total_pieces * sizeof(mem_piece));
    size_t off_segs = align8(off_pool + total_segs * sizeof(uint32_t));
    size_t off_slots = align8(off_segs + (kind == OP_DELIVER ? total_pieces : 0) * sizeof(copy_seg));
    size_t off_keys = align8(off_slots + (kind == OP_FETCH ? total_segs : 0) * sizeof(kvcr_slot_ref));
    uint8_t *mem = calloc(1, off_keys + key_bytes + 1);
    if (mem == NULL) return NULL;
    op_rec *o = (op_rec *)mem;
    o->kind = (uint8_t)kind;
    o->n = o->pending = (uint32_t)n;
    o->e = (op_entry *)(mem + off_e);
    o->seg_piece = (uint32_t *)(mem + off_piece);
    o->pieces = (mem_piece *)(mem + off_pieces);
    o->seg_pool = (uint32_t *)(mem + off_pool);
    o->segs = (copy_seg *)(mem + off_segs);
    o->slot_refs = (kvcr_slot_ref *)(mem + off_slots);
    o->keys = mem + off_keys;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        o->e[i].block = BLOCK_NONE;
        o->e[i].key_off = (uint32_t)k;
        o->e[i].key_len = (uint32_t)keys[i]->len;
        memcpy(o->keys + k, keys[i]->data, keys[i]->len);
        k += keys[i]->len;
    }
    return o;
}

/* Fills the framework side of a deposit's or deliver's layout: each
 * layout entry's pool and pieces. */
static void op_set_layout(kvcr_t *kv, op_rec *o, const kvcr_block *blocks)
{
    uint32_t s = 0, p = 0;
    for (uint32_t i = 0; i < o->n; i++) {
        o->e[i].seg_off = s;
        o->e[i].n_segs = (uint32_t)blocks[i].n_refs;
        for (size_t j = 0; j < blocks[i].n_refs; j++, s++) {
            o->seg_piece[s] = p;
            p += ops_ref_pieces(kv, &blocks[i].refs[j], &o->pieces[p], &o->seg_pool[s]);
        }
    }
    o->seg_piece[s] = p;
}

/* Framework pieces of an entry, from its first layout entry on. */
static uint32_t entry_pieces(const op_rec *o, const op_entry *e)
{
    return o->seg_piece[e->seg_off + e->n_segs] - o->seg_piece[e->seg_off];
}

/* The copy segments between KVCR slot `slot` and layout entry s's
 * framework pieces (into the framework when to_fw). Returns how many. */
static uint32_t slot_segs(const op_rec *o, uint32_t s, uint8_t *slot, bool to_fw, copy_seg *out)
{
    uint32_t n = 0;
    size_t off = 0;
    for (uint32_t k = o->seg_piece[s]; k < o->seg_piece[s + 1]; k++, n++) {
        uint8_t *fw = (uint8_t *)(uintptr_t)o->pieces[k].addr;
        size_t len = (size_t)o->pieces[k].len;
        out[n] = to_fw ? (copy_seg){fw, slot + off, len} : (copy_seg){slot + off, fw, len};
        off += len;
    }
    return n;
}

static const uint8_t *entry_key(const op_rec *o, const op_entry *e)
{
    return o->keys + e->key_off;
}

static block_id entry_find(const kvcr_t *kv, const op_rec *o, const op_entry *e)
{
    const uint8_t *key = entry_key(o, e);
    return index_find(&kv->index, key, e->key_len, index_hash(key, e->key_len));
}

static void op_start(kvcr_t *kv, op_rec *o)
{
    o->handle = kv->next_op++;
    o->start_ns = kvcr_now_ns();
    o->deadline_ns = o->start_ns + (uint64_t)kv->conf.operation_timeout_ms * 1000000u;
    o->live_prev = kv->live_tail;
    if (kv->live_tail)
        kv->live_tail->live_next = o;
    else
        kv->live_head = o;
    kv->live_tail = o;
    kv->n_live++;
}

static void op_complete(kvcr_t *kv, op_rec *o)
{
    /* Its keys' inventory event goes out whole, in request order (the
     * copies finish in any order, over several progress turns). */
    if (kv->n_commit > 0 && kv->commit_origin == o->handle) res_flush_commits(kv);
    if (o->live_prev)
        o->live_prev->live_next = o->live_next;
    else
        kv->live_head = o->live_next;
    if (o->live_next)
        o->live_next->live_prev = o->live_prev;
    else
        kv->live_tail = o->live_prev;
    kv->n_live--;
    o->done_next = NULL;
    if (kv->done_tail)
        kv->done_tail->done_next = o;
    else
        kv->done_head = o;
    kv->done_tail = o;
    kv->n_done++;
    event_signal(kv->event_fd);
}

static void entry_finish(kvcr_t *kv, op_rec *o, uint32_t i, kvcr_entry_status st, kvcr_reason why)
{
    op_entry *e = &o->e[i];
    e->done = 1;
    e->wait = WAIT_NONE;
    e->status = (uint8_t)st;
    e->reason = (uint8_t)why;
    if (--o->pending == 0) op_complete(kv, o);
}

/* ---- fills and waiters -------------------------------------------------- */

static void waiter_add(fill *f, op_rec *o, uint32_t i)
{
    o->e[i].w_next_op = f->w_op;
    o->e[i].w_next_idx = f->w_idx;
    o->e[i].wait = WAIT_FILL;
    f->w_op = o;
    f->w_idx = i;
    f->n_w++;
}

static void waiter_remove(fill *f, op_rec *o, uint32_t i)
{
    op_rec **link_op = &f->w_op;
    uint32_t *link_idx = &f->w_idx;
    while (*link_op != NULL) {
        op_entry *e = &(*link_op)->e[*link_idx];
        if (*link_op == o && *link_idx == i) {
            *link_op = e->w_next_op;
            *link_idx = e->w_next_idx;
            f->n_w--;
            return;
        }
        link_op = &e->w_next_op;
        link_idx = &e->w_next_idx;
    }
}

static void start_deliver_copy(kvcr_t *kv, op_rec *o, uint32_t i, block_id id)
{
    op_entry *e = &o->e[i];
    const block *b = index_get(&kv->index, id);
    res_claim(kv, id);
    copy_seg *segs = &o->segs[o->seg_piece[e->seg_off]];
    uint32_t n = 0;
    for (uint32_t j = 0; j < e->n_segs; j++) {
        uint32_t pool, slot;
        res_slot(kv, b, j, &pool, &slot);
        n += slot_segs(o, e->seg_off + j, dram_slot_addr(&kv->pools[pool], slot), true, segs + n);
    }
    e->block = id;
    e->wait = WAIT_COPY;
    e->job = (copy_job){.owner = o, .owner_idx = i, .kind = JOB_DELIVER,
                        .submit_ns = kvcr_now_ns(), .n_segs = n, .segs = segs};
    copy_submit(&kv->copier, &e->job);
}

static void fetch_success(kvcr_t *kv, op_rec *o, uint32_t i, block_id id)
{
    op_entry *e = &o->e[i];
    kvcr_release_handle h = res_claim_public(kv, id);
    if (h == 0) {
        kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: cannot claim a fetched block");
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_CAPACITY);
        return;
    }
    res_access(kv, id);
    const block *b = index_get(&kv->index, id);
    for (uint32_t j = 0; j < e->n_segs; j++) {
        uint32_t pool, slot;
        res_slot(kv, b, j, &pool, &slot);
        o->slot_refs[e->seg_off + j] = (kvcr_slot_ref){pool, slot,
                                                      dram_slot_addr(&kv->pools[pool], slot),
                                                      kv->pools[pool].block_size};
    }
    e->rh = h;
    entry_finish(kv, o, i, KVCR_ENTRY_SUCCESS, KVCR_REASON_NONE);
}

static void deposit_success(kvcr_t *kv, op_rec *o, uint32_t i, block_id id)
{
    if (o->no_evict) {
        o->e[i].rh = res_claim_public(kv, id);
        if (o->e[i].rh == 0) {
            kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: cannot pin a no_evict deposit");
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_CAPACITY);
            return;
        }
    }
    entry_finish(kv, o, i, KVCR_ENTRY_SUCCESS, KVCR_REASON_NONE);
}

/* The fill an entry waited for ended; ok means the block is READY. */
static void waiter_resolve(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, bool ok, kvcr_reason why)
{
    o->e[i].wait = WAIT_NONE;
    if (!ok) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, why);
        return;
    }
    switch (o->kind) {
    case OP_DEPOSIT: deposit_success(kv, o, i, id); break;
    case OP_DELIVER: start_deliver_copy(kv, o, i, id); break;
    default:
        if (kvcr_now_ns() > o->deadline_ns)
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_TIMEOUT);
        else
            fetch_success(kv, o, i, id);
    }
}

static void fill_done(kvcr_t *kv, fill *f, bool ok, kvcr_reason why)
{
    block_id id = f->block;
    index_get(&kv->index, id)->fill = NULL;
    if (kv->telemetry && f->job.submit_ns) {
        double s = kvcr_ns_to_s(kvcr_now_ns() - f->job.submit_ns);
        telemetry_observe(kv->telemetry, "local_fill", ok ? "success" : "failed", s);
        uint64_t bytes = 0;
        for (uint32_t j = 0; j < f->job.n_segs; j++) bytes += f->segs[j].len;
        if (ok) telemetry_count(kv->telemetry, "local_fill", 1, bytes);
    }
    if (ok)
        res_commit(kv, id, f->origin, f->origin_idx);
    else
        res_unfill(kv, id);
    op_rec *wo = f->w_op;
    uint32_t wi = f->w_idx;
    while (wo != NULL) {
        op_rec *next_op = wo->e[wi].w_next_op;
        uint32_t next_idx = wo->e[wi].w_next_idx;
        waiter_resolve(kv, wo, wi, id, ok, why);
        wo = next_op;
        wi = next_idx;
    }
    free(f);
    res_prune(kv, id);
}

/* A fill with room for n copy segments (0: a lower tier fills it). */
static fill *fill_new(uint32_t n)
{
    return calloc(1, sizeof(fill) + n * sizeof(copy_seg));
}

/* Reserves the block's slots and prepares (not submits) the fill copy. */
static fill *start_fill(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, fill *f)
{
    op_entry *e = &o->e[i];
    block *b = index_get(&kv->index, id);
    uint32_t n = 0;
    for (uint32_t j = 0; j < e->n_segs && o->kind == OP_DEPOSIT; j++) { /* else external */
        uint32_t pool, slot;
        res_slot(kv, b, j, &pool, &slot);
        n += slot_segs(o, e->seg_off + j, dram_slot_addr(&kv->pools[pool], slot), false,
                       f->segs + n);
    }
    f->block = id;
    f->origin = o->handle;
    f->origin_idx = i;
    f->job = (copy_job){.owner = f, .kind = JOB_FILL, .n_segs = n, .segs = f->segs};
    b->fill = f;
    e->block = id;
    waiter_add(f, o, i);
    return f;
}

/* ---- deposit ------------------------------------------------------------ */

static void protect_batch(kvcr_t *kv, op_rec *o, bool on)
{
    for (uint32_t i = 0; i < o->n; i++) {
        block_id id = entry_find(kv, o, &o->e[i]);
        if (id == BLOCK_NONE) continue;
        block *b = index_get(&kv->index, id);
        if (on)
            b->flags |= BF_PROTECTED;
        else
            b->flags &= (uint8_t)~BF_PROTECTED;
    }
}

/* Gives entry i's block (created if *id is BLOCK_NONE) G2 slots for the
 * entry's layout, after the policy admits it from `source`. On false the
 * entry is finished: refused admission with `refused`, no room FAILED. */
static bool reserve_slots(kvcr_t *kv, op_rec *o, uint32_t i, block_id *id, kvcr_tier source,
                          bool required, kvcr_entry_status refused)
{
    op_entry *e = &o->e[i];
    const uint32_t *layout = &o->seg_pool[e->seg_off];
    if (*id == BLOCK_NONE) {
        const uint8_t *key = entry_key(o, e);
        *id = index_insert(&kv->index, key, e->key_len, index_hash(key, e->key_len));
        if (*id == BLOCK_NONE) {
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_CAPACITY);
            return false;
        }
    }
    uint64_t bytes = res_layout_bytes(kv, layout, e->n_segs);
    if (!res_admit(kv, *id, bytes, source, required)) {
        res_prune(kv, *id);
        entry_finish(kv, o, i, refused, KVCR_REASON_POLICY);
        return false;
    }
    if (!res_alloc(kv, *id, layout, e->n_segs)) {
        res_prune(kv, *id);
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_CAPACITY);
        return false;
    }
    return true;
}

static void deposit_entry(kvcr_t *kv, op_rec *o, uint32_t i, fill **spare)
{
    op_entry *e = &o->e[i];
    const uint32_t *layout = &o->seg_pool[e->seg_off];
    if (!kv->conf.has_local_dram) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_LOCAL_DRAM);
        return;
    }
    block_id id = entry_find(kv, o, e);
    block *b = id != BLOCK_NONE ? index_get(&kv->index, id) : NULL;
    if (b != NULL && b->g2_state != G2_NONE) {
        if (!res_same_layout(kv, b, layout, e->n_segs))
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_LAYOUT_MISMATCH);
        else if (b->g2_state == G2_READY)
            deposit_success(kv, o, i, id);
        else if (b->g2_state == G2_FILLING)
            waiter_add(b->fill, o, i), e->block = id;
        else
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_DISCARDING);
        return;
    }
    if (!reserve_slots(kv, o, i, &id, KVCR_TIER_FW_G2, o->no_evict, KVCR_ENTRY_DROPPED)) return;
    start_fill(kv, o, i, id, spare[i]);
    spare[i] = NULL;
}

/* Takes the lock and the memory an operation may need, so that the
 * per-entry work cannot fail half-way. */
static int op_admit(kvcr_t *kv, op_rec *o, size_t claims)
{
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ECLOSED, "the instance is closed");
    }
    /* Every admitted operation completes exactly once and waits in the
     * queue until polled: bounding pending + uncollected bounds the queue
     * without ever dropping a completion. */
    uint32_t max_ops = kv->conf.limits.max_unpolled_operations;
    if (kv->n_live + kv->n_done >= max_ops) {
        if (kv->telemetry) telemetry_refusal(kv->telemetry, "unpolled_operations");
        instance_unlock(kv);
        return kvcr_fail(KVCR_ELIMIT,
                         "limits.max_unpolled_operations (%u) reached: %llu operations are "
                         "pending or completed and not yet collected; call kvcr_poll",
                         max_ops, (unsigned long long)(kv->n_live + kv->n_done));
    }
    if (index_reserve(&kv->index, o->n) != 0 || res_reserve_claims(kv, claims) != 0) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    op_start(kv, o);
    return 0;
}

static void op_admitted(kvcr_t *kv, op_rec *o, kvcr_op_handle *out)
{
    *out = o->handle;
    if (o->n == 0) op_complete(kv, o); /* entries complete it otherwise */
    res_check_capacity(kv);
    instance_unlock(kv);
}

static const kvcr_key **block_keys(const kvcr_block *blocks, size_t n)
{
    const kvcr_key **keys = malloc((n ? n : 1) * sizeof *keys);
    for (size_t i = 0; keys && i < n; i++) keys[i] = &blocks[i].key;
    return keys;
}

static op_rec *op_from_blocks(kvcr_t *kv, enum op_kind kind, const kvcr_block *blocks, size_t n,
                              size_t total_refs, size_t total_pieces)
{
    const kvcr_key **keys = block_keys(blocks, n);
    op_rec *o = keys ? op_new(kind, keys, n, total_refs, total_pieces) : NULL;
    free(keys);
    if (o != NULL) op_set_layout(kv, o, blocks);
    return o;
}

int ops_deposit(kvcr_t *kv, const kvcr_block *blocks, size_t n, unsigned flags, const char *hints,
                size_t hints_len, kvcr_op_handle *out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "op must not be NULL");
    if (flags & ~(KVCR_NO_EVICT | KVCR_STRICT_TENANT))
        return kvcr_fail(KVCR_EINVAL, "unknown deposit flags %#x", flags);
    size_t total_refs, total_pieces;
    int rc = check_blocks(kv, blocks, n, &total_refs, &total_pieces);
    if (rc != 0) return rc;
    op_rec *o = op_from_blocks(kv, OP_DEPOSIT, blocks, n, total_refs, total_pieces);
    for (uint32_t i = 0; o != NULL && rc == 0 && i < o->n; i++)
        rc = lower_layout_check(kv, &o->seg_pool[o->e[i].seg_off], o->e[i].n_segs);
    if (rc != 0) {
        free(o);
        return rc;
    }
    fill **spare = calloc(n ? n : 1, sizeof *spare);
    bool ok = o != NULL && spare != NULL;
    for (size_t i = 0; ok && i < n; i++) ok = (spare[i] = fill_new(entry_pieces(o, &o->e[i]))) != NULL;
    if (ok) o->no_evict = (flags & KVCR_NO_EVICT) != 0;
    admit_ctx ctx;
    rc = ok ? tenants_admit_prepare(kv, hints, hints_len, (flags & KVCR_STRICT_TENANT) != 0, &ctx)
            : kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (rc == 0 && (rc = op_admit(kv, o, o->no_evict ? n : 0)) != 0) tenants_admit_free(&ctx);
    if (rc == 0) {
        tenants_admit_enter(kv, &ctx, NULL);
        protect_batch(kv, o, true);
        for (uint32_t i = 0; i < o->n; i++) deposit_entry(kv, o, i, spare);
        protect_batch(kv, o, false);
        tenants_admit_leave(kv);
        /* Submit after every allocation so a copy never races an eviction
         * decided later in the same batch. */
        for (uint32_t i = 0; i < o->n; i++) {
            op_entry *e = &o->e[i];
            if (e->wait != WAIT_FILL) continue;
            fill *f = index_get(&kv->index, e->block)->fill;
            if (f->origin == o->handle && f->job.state == COPY_IDLE) {
                f->job.submit_ns = kvcr_now_ns();
                copy_submit(&kv->copier, &f->job);
            }
        }
        op_admitted(kv, o, out);
        tenants_admit_free(&ctx);
    } else {
        free(o);
    }
    for (size_t i = 0; spare && i < n; i++) free(spare[i]);
    free(spare);
    return rc;
}

/* ---- deliver ------------------------------------------------------------ */

/* Entry i's destination segments, as a lower tier is given them; true
 * when one of them is a block in parts (no single address: addr NULL). */
static bool deliver_dsts(kvcr_t *kv, const op_rec *o, const op_entry *e, const kvcr_block *blk,
                         tier_dst *dst)
{
    bool parts = false;
    for (uint32_t j = 0; j < e->n_segs; j++) {
        uint32_t s = e->seg_off + j, pool = o->seg_pool[s];
        const mem_piece *first = &o->pieces[o->seg_piece[s]];
        bool whole = o->seg_piece[s + 1] - o->seg_piece[s] == 1;
        /* The configured label: the caller's string is gone once
         * kvcr_deliver returns, the read may outlive it. */
        dst[j] = (tier_dst){whole ? (uint8_t *)(uintptr_t)first->addr : NULL,
                            kv->pools[pool].block_size, pool, true, ref_label(kv, first),
                            blk->refs[j].index};
        parts |= !whole;
    }
    return parts;
}

static void fetch_below(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, lower_reads *tr,
                        uint32_t t);

/* A key KVCR DRAM lacks, read by the lower tier that holds it straight
 * into the framework's memory; a block in parts, by a tier that writes
 * only whole blocks, through KVCR DRAM (read into slots, then copied out
 * piece by piece as any deliver from DRAM). */
static void deliver_below(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, lower_reads *tr,
                          uint32_t t, const kvcr_block *blk)
{
    op_entry *e = &o->e[i];
    const tier_slot *ts = &kv->tiers[t];
    if (ts->ops->layout_ok && !ts->ops->layout_ok(ts->t, &o->seg_pool[e->seg_off], e->n_segs)) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_LAYOUT_MISMATCH);
        return;
    }
    tier_dst dst[LOWER_MAX_SEGMENTS];
    if (deliver_dsts(kv, o, e, blk, dst) && !ts->ops->scatters) {
        if (!kv->conf.has_local_dram)
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_LOCAL_DRAM);
        else if (id != BLOCK_NONE && index_get(&kv->index, id)->g2_state == G2_DISCARDING)
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_DISCARDING);
        else
            fetch_below(kv, o, i, id, tr, t);
        return;
    }
    tier_read rd = {ops_entry_token(o, i), id, entry_key(o, e), e->key_len, false, e->n_segs, dst,
                    blk->refs};
    e->wait = WAIT_TRANSFER;
    kvcr_reason why = ts->ops->read(ts->t, tr->batch[t], &rd);
    if (why != KVCR_REASON_NONE) entry_finish(kv, o, i, KVCR_ENTRY_FAILED, why);
}

static void deliver_entry(kvcr_t *kv, op_rec *o, uint32_t i, lower_reads *tr,
                          const kvcr_block *blk)
{
    op_entry *e = &o->e[i];
    block_id id = entry_find(kv, o, e);
    block *b = id != BLOCK_NONE ? index_get(&kv->index, id) : NULL;
    if (b == NULL || b->g2_state == G2_NONE || b->g2_state == G2_DISCARDING) {
        kvcr_reason why = b && b->g2_state == G2_DISCARDING ? KVCR_REASON_DISCARDING
                                                            : KVCR_REASON_NOT_FOUND;
        int t = lower_reads_holder(kv, tr, id, entry_key(o, e), e->key_len);
        if (t >= 0)
            deliver_below(kv, o, i, id, tr, (uint32_t)t, blk);
        else
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, why);
    } else if (!res_same_layout(kv, b, &o->seg_pool[e->seg_off], e->n_segs)) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_LAYOUT_MISMATCH);
    } else if (b->g2_state == G2_FILLING) {
        waiter_add(b->fill, o, i), e->block = id;
    } else {
        start_deliver_copy(kv, o, i, id);
    }
}

int ops_deliver(kvcr_t *kv, const kvcr_block *blocks, size_t n, const char *request_id,
                kvcr_op_handle *out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "op must not be NULL");
    size_t total_refs, total_pieces;
    int rc = check_blocks(kv, blocks, n, &total_refs, &total_pieces);
    if (rc != 0) return rc;
    op_rec *o = op_from_blocks(kv, OP_DELIVER, blocks, n, total_refs, total_pieces);
    rc = o ? op_admit(kv, o, 0) : kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (rc != 0) {
        free(o);
        return rc;
    }
    /* A block in parts read from a tier that cannot scatter is staged in
     * KVCR DRAM: its admission hears the request's router hint. */
    admit_ctx ctx = {0};
    tenants_admit_enter(kv, &ctx, request_id);
    lower_reads tr;
    lower_reads_begin(kv, &tr, request_id, o->handle, false, n, total_refs);
    for (uint32_t i = 0; i < o->n; i++) deliver_entry(kv, o, i, &tr, &blocks[i]);
    lower_reads_end(kv, &tr);
    tenants_admit_leave(kv);
    op_admitted(kv, o, out);
    return 0;
}

static void deliver_done(kvcr_t *kv, op_rec *o, uint32_t i, bool ok)
{
    op_entry *e = &o->e[i];
    if (kv->telemetry) {
        double s = kvcr_ns_to_s(kvcr_now_ns() - e->job.submit_ns);
        telemetry_observe(kv->telemetry, "local_deliver", ok ? "success" : "failed", s);
        uint64_t bytes = 0;
        for (uint32_t j = 0; j < e->n_segs; j++) bytes += o->segs[e->seg_off + j].len;
        if (ok) telemetry_count(kv->telemetry, "local_deliver", 1, bytes);
    }
    if (ok) res_access(kv, e->block);
    res_unclaim(kv, e->block);
    entry_finish(kv, o, i, ok ? KVCR_ENTRY_SUCCESS : KVCR_ENTRY_FAILED,
                 ok ? KVCR_REASON_NONE : KVCR_REASON_TRANSFER_ERROR);
}

/* ---- fetch -------------------------------------------------------------- */

/* A fetch of a key only G3 or the hinted peer has (or a deliver of a block
 * in parts staged through KVCR DRAM): KVCR slots now, filled by the disk
 * read or the peer's write. NULL when the entry failed. */
static fill *fetch_external(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, kvcr_tier source)
{
    fill *f = fill_new(0);
    if (f == NULL) {
        kvcr_log(&kv->log, KVCR_LOG_ERROR, "out of memory: cannot start a fetch from %s",
                 kvcr_tier_name(source));
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_CAPACITY);
        return NULL;
    }
    if (!reserve_slots(kv, o, i, &id, source, true, KVCR_ENTRY_FAILED)) {
        free(f);
        return NULL;
    }
    start_fill(kv, o, i, id, f);
    f->external = true;
    return f;
}

/* A key KVCR DRAM lacks, read by the lower tier that holds it into KVCR
 * slots reserved now. */
static void fetch_below(kvcr_t *kv, op_rec *o, uint32_t i, block_id id, lower_reads *tr,
                        uint32_t t)
{
    op_entry *e = &o->e[i];
    const tier_slot *ts = &kv->tiers[t];
    if (ts->ops->layout_ok && !ts->ops->layout_ok(ts->t, &o->seg_pool[e->seg_off], e->n_segs)) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_LAYOUT_MISMATCH);
        return;
    }
    /* Making DRAM room may spill a block into a full lower tier, whose
     * eviction must not pick the very block this fetch is about to read. */
    if (id != BLOCK_NONE) index_get(&kv->index, id)->flags |= BF_PROTECTED;
    fill *f = fetch_external(kv, o, i, id, ts->ops->id);
    if (id != BLOCK_NONE) index_get(&kv->index, id)->flags &= (uint8_t)~BF_PROTECTED;
    if (f == NULL) return;
    tier_dst dst[LOWER_MAX_SEGMENTS];
    for (uint32_t j = 0; j < e->n_segs; j++) host_block_segment(kv, f->block, j, &dst[j]);
    tier_read rd = {ops_fill_token(f), f->block, entry_key(o, e), e->key_len, true, e->n_segs,
                    dst, NULL};
    kvcr_reason why = ts->ops->read(ts->t, tr->batch[t], &rd);
    if (why != KVCR_REASON_NONE) fill_done(kv, f, false, why);
}

static void fetch_entry(kvcr_t *kv, op_rec *o, uint32_t i, lower_reads *tr)
{
    op_entry *e = &o->e[i];
    if (!kv->conf.has_local_dram) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NO_LOCAL_DRAM);
        return;
    }
    block_id id = entry_find(kv, o, e);
    block *b = id != BLOCK_NONE ? index_get(&kv->index, id) : NULL;
    if (b == NULL || b->g2_state == G2_NONE) {
        int t = lower_reads_holder(kv, tr, id, entry_key(o, e), e->key_len);
        if (t >= 0)
            fetch_below(kv, o, i, id, tr, (uint32_t)t);
        else
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_NOT_FOUND);
    } else if (!res_same_layout(kv, b, &o->seg_pool[e->seg_off], e->n_segs)) {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_LAYOUT_MISMATCH);
    } else if (b->g2_state == G2_READY) {
        fetch_success(kv, o, i, id);
    } else if (b->g2_state == G2_FILLING) {
        waiter_add(b->fill, o, i), e->block = id;
    } else {
        entry_finish(kv, o, i, KVCR_ENTRY_FAILED, KVCR_REASON_DISCARDING);
    }
}

static int layout_pools(const kvcr_t *kv, const char *const *layout, size_t len, uint32_t *pools)
{
    if (layout == NULL && len == 0) {
        for (uint32_t p = 0; p < kv->conf.n_pools; p++)
            if (kv->pools[p].name[0] == '\0') {
                pools[0] = p;
                return 1;
            }
        return kvcr_fail(KVCR_EINVAL, "expected layout must use configured pools (no pool '')");
    }
    if (layout == NULL || len == 0 || len > 255)
        return kvcr_fail(KVCR_EINVAL, "expected layout must name 1 to 255 pools");
    for (size_t i = 0; i < len; i++) {
        uint32_t p = 0;
        while (p < kv->conf.n_pools && (layout[i] == NULL || strcmp(kv->pools[p].name, layout[i])))
            p++;
        if (p == kv->conf.n_pools)
            return kvcr_fail(KVCR_EINVAL, "expected layout must use configured pools");
        pools[i] = p;
    }
    return (int)len;
}

int ops_fetch(kvcr_t *kv, const kvcr_key *keys, size_t n, const char *request_id,
              const char *const *layout, size_t layout_len, const char *hints,
              size_t hints_len, unsigned flags, kvcr_op_handle *out)
{
    if (out == NULL) return kvcr_fail(KVCR_EINVAL, "op must not be NULL");
    if (flags & ~KVCR_STRICT_TENANT) return kvcr_fail(KVCR_EINVAL, "unknown fetch flags %#x", flags);
    if (n > 0 && keys == NULL) return kvcr_fail(KVCR_EINVAL, "keys must not be NULL");
    if (n > UINT32_MAX / 256) return kvcr_fail(KVCR_EINVAL, "too many keys in one call");
    uint32_t pools[255];
    int len = layout_pools(kv, layout, layout_len, pools);
    if (len < 0) return len;
    int layout_rc = lower_layout_check(kv, pools, (uint32_t)len);
    if (layout_rc != 0) return layout_rc;
    for (size_t i = 0; i < n; i++) {
        int rc = check_key(&keys[i], i);
        if (rc != 0) return rc;
    }
    const kvcr_key **uniq = calloc(n ? n : 1, sizeof *uniq);
    bool *dup = calloc(n ? n : 1, sizeof *dup);
    long dups = uniq && dup ? 0 : -1;
    for (size_t i = 0; dups == 0 && i < n; i++) uniq[i] = &keys[i];
    if (dups == 0) dups = mark_duplicates(uniq, n, dup);
    size_t m = 0;
    for (size_t i = 0; dups >= 0 && i < n; i++)
        if (!dup[i]) uniq[m++] = &keys[i];
    op_rec *o = dups >= 0 ? op_new(OP_FETCH, uniq, m, m * (size_t)len, 0) : NULL;
    free(uniq);
    free(dup);
    admit_ctx ctx;
    int rc = o ? tenants_admit_prepare(kv, hints, hints_len, (flags & KVCR_STRICT_TENANT) != 0, &ctx)
               : kvcr_fail(KVCR_ENOMEM, "out of memory");
    if (rc == 0 && (rc = op_admit(kv, o, m)) != 0) tenants_admit_free(&ctx);
    if (rc != 0) {
        free(o);
        return rc;
    }
    tenants_admit_enter(kv, &ctx, request_id);
    lower_reads tr;
    lower_reads_begin(kv, &tr, kv->conf.has_local_dram ? request_id : NULL, o->handle, true, m,
                     m * (size_t)len);
    for (uint32_t i = 0; i < o->n; i++) {
        o->e[i].seg_off = i * (uint32_t)len;
        o->e[i].n_segs = (uint32_t)len;
        memcpy(&o->seg_pool[i * (uint32_t)len], pools, (size_t)len * sizeof *pools);
        fetch_entry(kv, o, i, &tr);
    }
    lower_reads_end(kv, &tr);
    tenants_admit_leave(kv);
    op_admitted(kv, o, out);
    tenants_admit_free(&ctx);
    return 0;
}

/* ---- release ------------------------------------------------------------ */

int ops_release(kvcr_t *kv, const kvcr_release_handle *handles, size_t n, bool *released)
{
    if (n > 0 && (handles == NULL || released == NULL))
        return kvcr_fail(KVCR_EINVAL, "handles and released must not be NULL");
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ECLOSED, "the instance is closed");
    }
    for (size_t i = 0; i < n; i++) released[i] = res_release_public(kv, handles[i]);
    res_check_capacity(kv);
    instance_unlock(kv);
    return 0;
}

/* ---- cancellation: deadlines, abort, close ------------------------------- */

static bool entry_matches(const op_rec *o, const op_entry *e, const kvcr_key *keys, size_t n)
{
    if (keys == NULL) return true;
    for (size_t k = 0; k < n; k++)
        if (keys[k].len == e->key_len && memcmp(keys[k].data, entry_key(o, e), e->key_len) == 0)
            return true;
    return false;
}

/* Fails the pending entries of o that have not started moving bytes.
 * A deposit whose fill copy has started is left to finish: the data will
 * be committed and the deposit counts as done (an abort cannot unwrite it). */
static size_t cancel_entries(kvcr_t *kv, op_rec *o, const kvcr_key *keys, size_t n, kvcr_reason why)
{
    size_t cancelled = 0;
    uint32_t total = o->n;
    for (uint32_t i = 0; i < total && o->pending > 0; i++) {
        op_entry *e = &o->e[i];
        if (e->done || !entry_matches(o, e, keys, n)) continue;
        if (e->wait == WAIT_FILL) {
            fill *f = index_get(&kv->index, e->block)->fill;
            if (o->kind == OP_DEPOSIT && copy_job_started(&kv->copier, &f->job)) continue;
            waiter_remove(f, o, i);
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, why);
            cancelled++;
            /* Nobody wants the fill any more: stop it if it has not started. */
            if (f->n_w == 0 && copy_cancel(&kv->copier, &f->job)) fill_done(kv, f, false, why);
        } else if (e->wait == WAIT_COPY && copy_cancel(&kv->copier, &e->job)) {
            res_unclaim(kv, e->block);
            entry_finish(kv, o, i, KVCR_ENTRY_FAILED, why);
            cancelled++;
        }
    }
    return cancelled;
}

static void expire_deadlines(kvcr_t *kv)
{
    uint64_t now = kvcr_now_ns();
    op_rec *o = kv->live_head;
    while (o != NULL && o->deadline_ns <= now) {
        op_rec *next = o->live_next; /* o may complete and leave the list */
        if (!o->expired) {
            o->expired = true;
            cancel_entries(kv, o, NULL, 0, KVCR_REASON_TIMEOUT);
        }
        o = next;
    }
}

int ops_abort(kvcr_t *kv, kvcr_op_handle handle, const kvcr_key *keys, size_t n, size_t *n_aborted)
{
    if (keys == NULL && n > 0) return kvcr_fail(KVCR_EINVAL, "keys must not be NULL");
    for (size_t i = 0; keys && i < n; i++) {
        int rc = check_key(&keys[i], i);
        if (rc != 0) return rc;
    }
    instance_lock(kv);
    if (kv->closed) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ECLOSED, "the instance is closed");
    }
    op_rec *o = kv->live_head;
    while (o != NULL && o->handle != handle) o = o->live_next;
    if (o == NULL) {
        instance_unlock(kv);
        return kvcr_fail(KVCR_ENOENT, "operation %llu is not pending",
                         (unsigned long long)handle);
    }
    size_t done = cancel_entries(kv, o, keys, keys ? n : 0, KVCR_REASON_ABORTED);
    res_check_capacity(kv);
    instance_unlock(kv);
    if (n_aborted) *n_aborted = done;
    return 0;
}

void ops_cancel_all(kvcr_t *kv)
{
    op_rec *o = kv->live_head;
    while (o != NULL) {
        op_rec *next = o->live_next;
        cancel_entries(kv, o, NULL, 0, KVCR_REASON_CLOSED);
        o = next;
    }
}

/* ---- progress and results ----------------------------------------------- */

/* Locked: whether the operation whose commits are batched is still
 * pending (bounded by the live operations, limits.max_unpolled_operations). */
static bool commit_origin_live(const kvcr_t *kv)
{
    for (const op_rec *o = kv->live_head; kv->n_commit > 0 && o != NULL; o = o->live_next)
        if (o->handle == kv->commit_origin) return true;
    return false;
}

void ops_progress(kvcr_t *kv)
{
    for (uint32_t t = kv->n_tiers; t-- > 0;) /* the peers first, as before the seam */
        kv->tiers[t].ops->settle(kv->tiers[t].t);
    copy_job *job = copy_take_done(&kv->copier);
    while (job != NULL) {
        copy_job *next = job->next;
        bool ok = job->result == 0;
        if (job->kind == JOB_FILL)
            fill_done(kv, job->owner, ok, KVCR_REASON_TRANSFER_ERROR);
        else
            deliver_done(kv, job->owner, job->owner_idx, ok);
        job = next;
    }
    if (!commit_origin_live(kv)) res_flush_commits(kv); /* else when it completes */
    expire_deadlines(kv);
    res_check_capacity(kv);
}

int ops_take_results(kvcr_t *kv, kvcr_op_result **results, size_t *n)
{
    *results = NULL;
    *n = 0;
    if (kv->done_head == NULL) return 0;
    size_t n_ops = 0, n_entries = 0, n_slots = 0, key_bytes = 0;
    for (op_rec *o = kv->done_head; o; o = o->done_next) {
        n_ops++;
        n_entries += o->n;
        for (uint32_t i = 0; i < o->n; i++) {
            key_bytes += o->e[i].key_len;
            if (o->kind == OP_FETCH && o->e[i].status == KVCR_ENTRY_SUCCESS)
                n_slots += o->e[i].n_segs;
        }
    }
    size_t off_e = align8(n_ops * sizeof(kvcr_op_result));
    size_t off_s = align8(off_e + n_entries * sizeof(kvcr_entry_result));
    size_t off_k = align8(off_s + n_slots * sizeof(kvcr_slot_ref));
    uint8_t *mem = malloc(off_k + key_bytes + 1);
    if (mem == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory collecting results");
    kvcr_op_result *res = (kvcr_op_result *)mem;
    kvcr_entry_result *ent = (kvcr_entry_result *)(mem + off_e);
    kvcr_slot_ref *slots = (kvcr_slot_ref *)(mem + off_s);
    uint8_t *kb = mem + off_k;
    size_t r = 0;
    for (op_rec *o = kv->done_head; o; r++) {
        res[r] = (kvcr_op_result){o->handle, o->n, ent};
        for (uint32_t i = 0; i < o->n; i++, ent++) {
            const op_entry *e = &o->e[i];
            memcpy(kb, entry_key(o, e), e->key_len);
            *ent = (kvcr_entry_result){{kb, e->key_len}, e->status, e->reason, e->rh, NULL, 0};
            kb += e->key_len;
            if (o->kind == OP_FETCH && e->status == KVCR_ENTRY_SUCCESS) {
                memcpy(slots, &o->slot_refs[e->seg_off], e->n_segs * sizeof *slots);
                ent->slots = slots;
                ent->n_slots = e->n_segs;
                slots += e->n_segs;
            }
        }
        op_rec *next = o->done_next;
        free(o);
        o = next;
    }
    kv->done_head = kv->done_tail = NULL;
    kv->n_done = 0;
    *results = res;
    *n = n_ops;
    return 0;
}

void ops_discard_done(kvcr_t *kv)
{
    while (kv->done_head) {
        op_rec *next = kv->done_head->done_next;
        free(kv->done_head);
        kv->done_head = next;
    }
    kv->done_tail = NULL;
    kv->n_done = 0;
}

/* ---- lower tiers settle their entries and fills (through core/host.c) ------ */

void ops_entry_settle(kvcr_t *kv, op_rec *o, uint32_t i, bool ok, kvcr_reason why)
{
    entry_finish(kv, o, i, ok ? KVCR_ENTRY_SUCCESS : KVCR_ENTRY_FAILED,
                 ok ? KVCR_REASON_NONE : why);
}

void ops_remote_fill_discard(kvcr_t *kv, fill *f)
{
    index_get(&kv->index, f->block)->g2_state = G2_DISCARDING;
    op_rec *wo = f->w_op;
    uint32_t wi = f->w_idx;
    f->w_op = NULL;
    f->n_w = 0;
    while (wo != NULL) {
        op_rec *next_op = wo->e[wi].w_next_op;
        uint32_t next_idx = wo->e[wi].w_next_idx;
        waiter_resolve(kv, wo, wi, f->block, false, KVCR_REASON_TIMEOUT);
        wo = next_op;
        wi = next_idx;
    }
}

void ops_fill_settle(kvcr_t *kv, fill *f, bool ok, kvcr_reason why)
{
    if (index_get(&kv->index, f->block)->g2_state == G2_DISCARDING) ok = false;
    fill_done(kv, f, ok, why);
}
