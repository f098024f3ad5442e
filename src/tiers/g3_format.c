/* The G3 on-disk format codec (see g3_format.h; the format is described in
 * g3_store.h). */
#include "tiers/g3_format.h"

#include <stdbool.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__) || defined(__i386__)
/* libxxhash's xxh_x86dispatch.h declares this, but its declarations turn
 * static under XXH_INLINE_ALL, so the one we use is declared here. */
XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len);
#endif

#include "kvcr/error.h"
#include "util/bytes.h"
#include "util/log.h"

#define SB_MAGIC "KVCRG3SB"
#define SB_VERSION 1u
#define SB_SUM_AT 120  /* its checksum covers [0, SB_SUM_AT); zeros follow it */
#define REC_SUM_AT 248 /* the record checksum covers [0, REC_SUM_AT) */
#define REC_KEY_AT 40
#define REC_VERSION_AT 6 /* 0: version 1; REC_V2: key, tenant, meta length, meta */
#define REC_TENANT_LEN_AT 7
#define REC_V2 2

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

void g3_layout_init(g3_layout *l, uint64_t slot_size, uint64_t slots_per_file, uint32_t n_files)
{
    l->slot_size = slot_size;
    l->slots_per_file = slots_per_file;
    l->n_files = n_files;
    l->index_off = G3_SUPERBLOCK_SIZE;
    l->index_bytes = g3_aligned_len(slots_per_file * G3_RECORD_SIZE);
    l->data_off = l->index_off + l->index_bytes;
    l->file_size = l->data_off + slots_per_file * slot_size;
}

uint64_t g3_block_offset(const g3_layout *l, uint64_t block)
{
    return l->index_off + block * G3_ALIGN;
}

uint64_t g3_record_offset(const g3_layout *l, uint64_t fslot)
{
    return l->index_off + fslot * G3_RECORD_SIZE;
}

uint64_t g3_data_offset(const g3_layout *l, uint64_t fslot)
{
    return l->data_off + fslot * l->slot_size;
}

uint8_t *g3_record_in_block(uint8_t *block, uint64_t fslot)
{
    return block + (fslot % G3_RECS_PER_BLOCK) * G3_RECORD_SIZE;
}

uint64_t g3_record_seed(const uint8_t uuid[G3_UUID_LEN])
{
    return XXH3_64bits(uuid, G3_UUID_LEN);
}

/* Block checksums take the library's runtime dispatch on x86, which picks
 * AVX2 or AVX-512 where the CPU has them: the inlined code is built for
 * SSE2 only and hashes a cold 2 MiB block at about half the speed. The
 * digest is the same either way. */
uint64_t g3_data_checksum(const void *p, size_t len)
{
#if defined(__x86_64__) || defined(__i386__)
    return XXH3_64bits_dispatch(p, len);
#else
    return XXH3_64bits(p, len);
#endif
}

/* ---- records ------------------------------------------------------------ */

void g3_record_seal(uint8_t *r, uint64_t seed)
{
    put64(r + REC_SUM_AT, XXH3_64bits_withSeed(r, REC_SUM_AT, seed));
}

bool g3_record_fits(size_t key_len, size_t tenant_len, size_t meta_len)
{
    size_t v2 = tenant_len + meta_len > 0 ? tenant_len + 1 + meta_len : 0;
    return key_len <= G3_KEY_MAX && tenant_len <= UINT8_MAX && meta_len <= UINT8_MAX &&
           key_len + v2 <= G3_REC_ROOM;
}

void g3_record_encode(uint8_t *r, uint64_t seed, const g3_record *rec)
{
    memset(r, 0, G3_RECORD_SIZE);
    put32(r, G3_REC_MAGIC);
    r[4] = (uint8_t)rec->state;
    r[5] = rec->key_len;
    put64(r + 8, rec->slot);
    put64(r + 16, rec->gen);
    put64(r + 24, rec->len);
    put64(r + 32, rec->sum);
    if (rec->key_len) memcpy(r + REC_KEY_AT, rec->key, rec->key_len);
    if (rec->state == G3_REC_FULL && rec->tenant_len + rec->meta_len > 0) {
        uint8_t *p = r + REC_KEY_AT + rec->key_len;
        r[REC_VERSION_AT] = REC_V2;
        r[REC_TENANT_LEN_AT] = rec->tenant_len;
        if (rec->tenant_len) memcpy(p, rec->tenant, rec->tenant_len);
        p[rec->tenant_len] = rec->meta_len;
        if (rec->meta_len) memcpy(p + rec->tenant_len + 1, rec->meta, rec->meta_len);
    }
    g3_record_seal(r, seed);
}

/* The version-2 part of a FULL record: tenant, metadata length, metadata,
 * then zeros up to the checksum. False when it does not fit or anything
 * after it is not zero. */
static bool decode_v2(const uint8_t *r, g3_record *out)
{
    size_t at = REC_KEY_AT + (size_t)out->key_len, tl = r[REC_TENANT_LEN_AT];
    if (at + tl + 1 > REC_SUM_AT) return false;
    size_t ml = r[at + tl];
    if (tl + ml == 0 || at + tl + 1 + ml > REC_SUM_AT) return false;
    if (!all_zero(r + at + tl + 1 + ml, REC_SUM_AT - (at + tl + 1 + ml))) return false;
    out->tenant_len = (uint8_t)tl;
    out->tenant = tl ? r + at : NULL;
    out->meta_len = (uint8_t)ml;
    out->meta = ml ? r + at + tl + 1 : NULL;
    return true;
}

g3_rec_check g3_record_decode(const uint8_t *r, uint64_t seed, uint64_t slot, uint64_t slot_size,
                              g3_record *out)
{
    if (get32(r) != G3_REC_MAGIC)
        return all_zero(r, G3_RECORD_SIZE) ? G3_REC_UNWRITTEN : G3_REC_DAMAGED;
    if (get64(r + REC_SUM_AT) != XXH3_64bits_withSeed(r, REC_SUM_AT, seed)) return G3_REC_DAMAGED;
    *out = (g3_record){r[4], r[5], r + REC_KEY_AT, get64(r + 8), get64(r + 16), get64(r + 24),
                       get64(r + 32), 0, 0, NULL, NULL};
    if (out->slot != slot) return G3_REC_DAMAGED;
    /* Version 1 wrote zeros in both bytes; anything else is unknown. */
    uint8_t version = r[REC_VERSION_AT];
    if (version != 0 && !(version == REC_V2 && out->state == G3_REC_FULL)) return G3_REC_DAMAGED;
    if (version == 0 && r[REC_TENANT_LEN_AT] != 0) return G3_REC_DAMAGED;
    if (out->state == G3_REC_FULL)
        return out->key_len >= 1 && out->key_len <= G3_KEY_MAX && out->len >= 1 &&
                       out->len <= slot_size && (version == 0 || decode_v2(r, out))
                   ? G3_REC_OK
                   : G3_REC_DAMAGED;
    return out->state == G3_REC_EMPTY && out->key_len == 0 && out->len == 0 ? G3_REC_OK
                                                                             : G3_REC_DAMAGED;
}

/* ---- the superblock ------------------------------------------------------- */

void g3_sb_encode(const g3_layout *l, uint32_t file, const uint8_t uuid[G3_UUID_LEN], uint8_t *b)
{
    memset(b, 0, G3_SUPERBLOCK_SIZE);
    memcpy(b, SB_MAGIC, 8);
    put32(b + 8, SB_VERSION);
    put32(b + 12, G3_RECORD_SIZE);
    put64(b + 16, l->slot_size);
    put64(b + 24, l->slots_per_file);
    put64(b + 32, l->index_off);
    put64(b + 40, l->data_off);
    put64(b + 48, l->file_size);
    put32(b + 56, file);
    put32(b + 60, l->n_files);
    memcpy(b + 64, uuid, G3_UUID_LEN);
    put64(b + SB_SUM_AT, XXH3_64bits(b, SB_SUM_AT));
}

int g3_sb_check(const g3_layout *l, uint32_t file, const uint8_t *b, const char *path,
                uint8_t uuid[G3_UUID_LEN])
{
    if (all_zero(b, G3_SUPERBLOCK_SIZE)) return 1;
    if (memcmp(b, SB_MAGIC, 8) != 0 || get64(b + SB_SUM_AT) != XXH3_64bits(b, SB_SUM_AT))
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s is not a G3 store file or its superblock is damaged", path);
    if (get32(b + 8) != SB_VERSION)
        return kvcr_fail(KVCR_EINVAL, "G3 file %s has format version %u (this build reads %u)",
                         path, get32(b + 8), SB_VERSION);
    uint64_t slot_size = get64(b + 16);
    uint32_t idx = get32(b + 56), n = get32(b + 60);
    if (get32(b + 12) != G3_RECORD_SIZE || slot_size != l->slot_size ||
        get64(b + 24) != l->slots_per_file || get64(b + 32) != l->index_off ||
        get64(b + 40) != l->data_off || get64(b + 48) != l->file_size || idx != file ||
        n != l->n_files)
        return kvcr_fail(KVCR_EINVAL,
                         "G3 file %s was made for another layout (file %u of %u, slot size %llu) "
                         "than configured (file %u of %u, slot size %llu)",
                         path, idx + 1, n, (unsigned long long)slot_size, file + 1, l->n_files,
                         (unsigned long long)l->slot_size);
    memcpy(uuid, b + 64, G3_UUID_LEN);
    return 0;
}
