/* libFuzzer target: the G3 tier's on-disk decoders (tiers/g3_format.c),
 * the superblock check of the open and the record check of the restart
 * scan and of reads, on bytes a damaged disk or another program could have
 * left. The codec is linked as the library builds it: no test-only entry
 * point. A layout of fixed geometry stands in for an opened store.
 *
 * Input: the first G3_SUPERBLOCK_SIZE bytes are a superblock; the rest is
 * cut into G3_RECORD_SIZE records, checked as slots 0, 1, 2 ... A record
 * whose magic is right gets its checksum fixed with probability 1/2
 * (flag byte), so the fuzzer reaches the field checks behind it.
 * Whatever the bytes: no read outside them (ASan), and every record that
 * verifies is one the scan may report: for its slot, FULL with a key of
 * 1..G3_KEY_MAX bytes inside the record and 1..slot_size data (and in
 * record version 2 a tenant and metadata inside the record, fitting
 * beside the key), or EMPTY with neither. A record's metadata goes through
 * the router metadata's strict decoder (api/router_meta.c), which the
 * warm restart hands it to: whatever decodes encodes back to the very
 * same bytes. */
#include <stdlib.h>
#include <string.h>

#include "api/router_meta.h"
#include "tiers/g3_format.h"
#include "util/bytes.h"

/* Checked in release builds too (assert() is compiled out there). */
#define CHECK(x) ((x) ? (void)0 : abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { SLOTS = 64, SLOT_SIZE = 65536 };
static const uint64_t SEED = 0x5eed;

/* Stored router metadata decodes strictly: what decodes is exactly what
 * its entry encodes to, but for extra keys in the older form (a list of
 * strings), which are read into today's packed form; that form then
 * decodes and encodes to itself. */
static void check_meta(const uint8_t *b, size_t len)
{
    bool damaged;
    rmeta *e = rmeta_decode(7, b, len, &damaged);
    if (e == NULL) {
        CHECK(damaged);
        return;
    }
    CHECK(e->hash == 7 && e->media == 0 && !e->pending);
    uint8_t again[G3_RECORD_SIZE], third[G3_RECORD_SIZE];
    size_t n = rmeta_encode(e, again, sizeof again);
    free(e);
    CHECK(n >= 6 && n <= sizeof again);
    if (n == len && memcmp(again, b, len) == 0) return;
    /* Only the older form's extra keys are written anew, packed. */
    CHECK(!(b[1] & RMETA_F_PACKED) && (again[1] & RMETA_F_PACKED));
    e = rmeta_decode(7, again, n, &damaged);
    CHECK(e != NULL);
    CHECK(rmeta_encode(e, third, sizeof third) == n && memcmp(third, again, n) == 0);
    free(e);
}

static void check_record(const g3_layout *l, const uint8_t *r, uint64_t slot)
{
    g3_record d;
    if (g3_record_decode(r, SEED, slot, l->slot_size, &d) != G3_REC_OK) return;
    CHECK(d.slot == slot);
    if (d.state == G3_REC_EMPTY) {
        CHECK(d.key_len == 0 && d.len == 0);
        return;
    }
    CHECK(d.state == G3_REC_FULL);
    CHECK(d.key_len >= 1 && d.key_len <= G3_KEY_MAX);
    CHECK(d.key >= r && d.key + d.key_len <= r + G3_RECORD_SIZE);
    CHECK(d.len >= 1 && d.len <= SLOT_SIZE);
    CHECK(g3_record_fits(d.key_len, d.tenant_len, d.meta_len));
    CHECK((d.tenant_len == 0) == (d.tenant == NULL) && (d.meta_len == 0) == (d.meta == NULL));
    if (d.tenant) CHECK(d.tenant >= d.key + d.key_len && d.tenant + d.tenant_len <= r + G3_RECORD_SIZE - 8);
    if (d.meta) CHECK(d.meta >= d.key + d.key_len && d.meta + d.meta_len <= r + G3_RECORD_SIZE - 8);
    if (d.meta) check_meta(d.meta, d.meta_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g3_layout l;
    g3_layout_init(&l, SLOT_SIZE, SLOTS, 1);
    if (size < G3_SUPERBLOCK_SIZE + 1) return 0;
    uint8_t *sb = malloc(G3_SUPERBLOCK_SIZE);
    memcpy(sb, data, G3_SUPERBLOCK_SIZE);
    uint8_t uuid[G3_UUID_LEN];
    int rc = g3_sb_check(&l, 0, sb, "fuzz", uuid);
    CHECK(rc == 0 || rc == 1 || rc < 0);
    free(sb);
    uint8_t flags = data[G3_SUPERBLOCK_SIZE];
    const uint8_t *recs = data + G3_SUPERBLOCK_SIZE + 1;
    size_t n = (size - G3_SUPERBLOCK_SIZE - 1) / G3_RECORD_SIZE;
    for (size_t i = 0; i < n && i < SLOTS; i++) {
        uint8_t r[G3_RECORD_SIZE];
        memcpy(r, recs + i * G3_RECORD_SIZE, G3_RECORD_SIZE);
        if ((flags >> (i % 8) & 1) && get32(r) == G3_REC_MAGIC) g3_record_seal(r, SEED);
        check_record(&l, r, i);
    }
    return 0;
}
