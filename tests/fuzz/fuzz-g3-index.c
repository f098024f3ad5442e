/* libFuzzer target: the G3 tier's on-disk decoders, the superblock check
 * and the index record check of the restart scan (tiers/g3_store.c), on
 * bytes a damaged disk or another program could have left.
 *
 * The store's source is included whole so that its static decoders are
 * fuzzed as they are, with no test-only entry point in the library. A
 * store of fixed geometry stands in for an opened one (no file, no ring).
 *
 * Input: the first G3_SUPERBLOCK_SIZE bytes are a superblock; the rest is
 * cut into G3_RECORD_SIZE records, scanned as slots 0, 1, 2 ... A record
 * whose magic is right gets its checksum fixed with probability 1/2
 * (flag byte), so the fuzzer reaches the field checks behind it.
 * Whatever the bytes: no read outside them (ASan), and every slot the
 * scan reports has a key of 1..G3_KEY_MAX bytes and 1..slot_size data. */
#include "tiers/g3_store.c"

/* Checked in release builds too (assert() is compiled out there). */
#define CHECK(x) ((x) ? (void)0 : abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { SLOTS = 64, SLOT_SIZE = 65536 };

static void on_slot(void *ud, const g3_slot_info *info)
{
    (void)ud;
    CHECK(info->slot < SLOTS);
    CHECK(info->key_len >= 1 && info->key_len <= G3_KEY_MAX);
    CHECK(info->data_len >= 1 && info->data_len <= SLOT_SIZE);
}

static void fake_store(g3_store *st, g3_file *f, slot_memo *memo)
{
    memset(st, 0, sizeof *st);
    memset(f, 0, sizeof *f);
    st->files = f;
    st->n_files = 1;
    st->slot_size = SLOT_SIZE;
    st->slots_per_file = st->n_slots = SLOTS;
    st->index_off = G3_SUPERBLOCK_SIZE;
    st->index_bytes = round_up((uint64_t)SLOTS * G3_RECORD_SIZE, G3_ALIGN);
    st->data_off = st->index_off + st->index_bytes;
    st->file_size = st->data_off + (uint64_t)SLOTS * SLOT_SIZE;
    st->seed = 0x5eed;
    st->memo = memo;
    snprintf(f->path, sizeof f->path, "fuzz");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static slot_memo memo[SLOTS];
    g3_store st;
    g3_file f;
    fake_store(&st, &f, memo);
    if (size < G3_SUPERBLOCK_SIZE + 1) return 0;
    uint8_t *sb = malloc(G3_SUPERBLOCK_SIZE);
    memcpy(sb, data, G3_SUPERBLOCK_SIZE);
    (void)sb_check(&st, 0, sb, &f);
    free(sb);
    uint8_t flags = data[G3_SUPERBLOCK_SIZE];
    const uint8_t *recs = data + G3_SUPERBLOCK_SIZE + 1;
    size_t n = (size - G3_SUPERBLOCK_SIZE - 1) / G3_RECORD_SIZE;
    scan_ctx c = {on_slot, NULL, {0}, 0};
    for (size_t i = 0; i < n && i < SLOTS; i++) {
        uint8_t r[G3_RECORD_SIZE];
        memcpy(r, recs + i * G3_RECORD_SIZE, G3_RECORD_SIZE);
        if ((flags >> (i % 8) & 1) && get32(r) == REC_MAGIC)
            put64(r + REC_SUM_AT, XXH3_64bits_withSeed(r, REC_SUM_AT, st.seed));
        scan_record(&st, &c, r, i);
    }
    CHECK(c.stats.full + c.stats.empty + c.stats.unwritten + c.stats.damaged == c.stats.slots);
    return 0;
}
