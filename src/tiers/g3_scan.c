/* The G3 restart scan (g3_store_scan in g3_store.h): every file's index
 * read sequentially, every record checked by the format codec, the verified
 * FULL ones reported and remembered (the slot memo), the highest generation
 * on disk learnt so that new writes and clears take higher ones.
 *
 * Threads: the one thread using the store, which must be idle; no locks. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "kvcr/error.h"
#include "tiers/g3_store_int.h"

#define SCAN_CHUNK (1u << 20)

typedef struct scan_ctx {
    void (*cb)(void *ud, const g3_slot_info *info);
    void *ud;
    g3_scan_stats stats;
    uint64_t max_gen;
} scan_ctx;

static void scan_record(g3_store *st, scan_ctx *c, const uint8_t *rec, uint64_t slot)
{
    g3_record d;
    c->stats.slots++;
    st->memo[slot].state = MEMO_EMPTY; /* unless it verifies as FULL below */
    switch (g3_record_decode(rec, st->seed, slot, st->lay.slot_size, &d)) {
    case G3_REC_UNWRITTEN: c->stats.unwritten++; return;
    case G3_REC_DAMAGED: c->stats.damaged++; return;
    case G3_REC_OK: break;
    }
    if (d.gen > c->max_gen) c->max_gen = d.gen;
    if (d.state == G3_REC_EMPTY) {
        c->stats.empty++;
        return;
    }
    c->stats.full++;
    st->memo[slot] = (slot_memo){d.sum, g3_key_hash(d.key, d.key_len), d.len, MEMO_FULL};
    if (c->cb == NULL) return;
    g3_slot_info info = {slot, d.key, d.key_len, d.gen, d.len, d.tenant, d.meta,
                         d.tenant_len, d.meta_len};
    c->cb(c->ud, &info);
}

static int read_full(const g3_file *f, uint8_t *buf, size_t n, uint64_t off)
{
    for (size_t got = 0, tries = 0; got < n; tries++) {
        ssize_t k = pread(f->dfd, buf + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR && tries < 16) continue;
        if (k <= 0)
            return kvcr_fail(KVCR_ESYS, "G3 file %s: cannot read the index: %s", f->path,
                             k < 0 ? strerror(errno) : "unexpected end of file");
        got += (size_t)k;
    }
    return 0;
}

static int scan_file(g3_store *st, scan_ctx *c, uint32_t i, uint8_t *buf)
{
    uint64_t bytes = st->lay.index_bytes;
    for (uint64_t off = 0; off < bytes; off += SCAN_CHUNK) {
        size_t n = (size_t)(bytes - off < SCAN_CHUNK ? bytes - off : SCAN_CHUNK);
        int rc = read_full(&st->files[i], buf, n, st->lay.index_off + off);
        if (rc != 0) return rc;
        c->stats.index_bytes += n;
        uint64_t first = off / G3_RECORD_SIZE;
        for (size_t k = 0; k < n / G3_RECORD_SIZE && first + k < st->lay.slots_per_file; k++)
            scan_record(st, c, buf + k * G3_RECORD_SIZE, (first + k) * st->lay.n_files + i);
    }
    return 0;
}

int g3_store_scan(g3_store *st, void (*cb)(void *ud, const g3_slot_info *info), void *ud,
                  g3_scan_stats *stats)
{
    if (st == NULL) return kvcr_fail(KVCR_EINVAL, "G3 store is NULL");
    if (st->in_progress || st->n_active || st->n_fifo || st->n_done)
        return kvcr_fail(KVCR_EBUSY, "G3 scan needs an idle store");
    uint8_t *buf = g3_aligned_alloc(SCAN_CHUNK);
    if (buf == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    scan_ctx c = {cb, ud, {0}, 0};
    st->in_progress = true; /* callbacks must not re-enter */
    int rc = 0;
    for (uint32_t i = 0; i < st->lay.n_files && rc == 0; i++) rc = scan_file(st, &c, i, buf);
    st->in_progress = false;
    free(buf);
    if (rc != 0) return rc;
    if (c.max_gen >= st->next_gen) st->next_gen = c.max_gen + 1;
    st->scanned = true;
    if (stats) *stats = c.stats;
    return 0;
}
