/* The G3 on-disk format (version 1): the layout of a store file, the
 * superblock and the slot records, encoded and checked here and nowhere
 * else (g3_store.h describes the format and what the checks guarantee).
 * Pure functions over caller-owned bytes: no file, no ring, no allocation,
 * so that the restart scan, the I/O engine and the fuzz target
 * (tests/fuzz/fuzz-g3-index.c) use the same decoders.
 *
 * Threads: none of its own; every function is safe from any thread on
 * distinct buffers. */
#ifndef KVCR_TIERS_G3_FORMAT_H
#define KVCR_TIERS_G3_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiers/g3_store.h"

#define G3_UUID_LEN 16
#define G3_REC_MAGIC 0x43523347u /* "G3RC" */
#define G3_REC_FULL 1
#define G3_REC_EMPTY 2
#define G3_RECS_PER_BLOCK (G3_ALIGN / G3_RECORD_SIZE)

/* Where everything is in each file of a store; every file alike. */
typedef struct g3_layout {
    uint64_t slot_size, slots_per_file;
    uint32_t n_files;
    uint64_t index_off, index_bytes, data_off, file_size;
} g3_layout;

/* A slot record, decoded (or to encode). key, tenant and meta point into
 * the record bytes after g3_record_decode. A FULL record with a tenant or
 * metadata is written in record version 2 (g3_store.h), any other in
 * version 1; tenant_len and meta_len are 0 for a version-1 record. */
typedef struct g3_record {
    int state; /* G3_REC_FULL or G3_REC_EMPTY */
    uint8_t key_len;
    const uint8_t *key;
    uint64_t slot, gen, len, sum;
    uint8_t tenant_len, meta_len;
    const uint8_t *tenant, *meta;
} g3_record;

typedef enum { G3_REC_OK, G3_REC_UNWRITTEN, G3_REC_DAMAGED } g3_rec_check;

/* len rounded up to G3_ALIGN: what a slot's data, or the index, occupies. */
static inline uint64_t g3_aligned_len(uint64_t len)
{
    return (len + G3_ALIGN - 1) / G3_ALIGN * G3_ALIGN;
}

/* The layout of files of slots_per_file slots of slot_size bytes. */
void g3_layout_init(g3_layout *l, uint64_t slot_size, uint64_t slots_per_file, uint32_t n_files);

/* Offsets, within its file, of the index block (of G3_RECS_PER_BLOCK
 * records) numbered block, and of the record and data of the file's slot
 * fslot. */
uint64_t g3_block_offset(const g3_layout *l, uint64_t block);
uint64_t g3_record_offset(const g3_layout *l, uint64_t fslot);
uint64_t g3_data_offset(const g3_layout *l, uint64_t fslot);

/* The record of the file's slot fslot inside its G3_ALIGN index block. */
uint8_t *g3_record_in_block(uint8_t *block, uint64_t fslot);

/* The seed of a store's record checksums: a hash of its uuid. */
uint64_t g3_record_seed(const uint8_t uuid[G3_UUID_LEN]);

/* XXH3-64 of a slot's data, as records carry it. */
uint64_t g3_data_checksum(const void *p, size_t len);

/* Whether a FULL record with a key, tenant and metadata of these lengths
 * fits in a record (version 2 when tenant_len + meta_len > 0). */
bool g3_record_fits(size_t key_len, size_t tenant_len, size_t meta_len);

/* Writes the G3_RECORD_SIZE bytes of rec into r, checksum included (rec
 * fits: g3_record_fits). */
void g3_record_encode(uint8_t *r, uint64_t seed, const g3_record *rec);

/* Rewrites the checksum of the record r (the last field), so that it
 * verifies under seed. */
void g3_record_seal(uint8_t *r, uint64_t seed);

/* Checks the record r found at the place of global slot slot, in a store of
 * slot_size slots: G3_REC_OK (with *out filled: a FULL record has a key of
 * 1..G3_KEY_MAX bytes and 1..slot_size data, and in version 2 a tenant
 * and metadata that fit with zeros after them; an EMPTY one neither),
 * G3_REC_UNWRITTEN for all zero bytes, G3_REC_DAMAGED for anything else. */
g3_rec_check g3_record_decode(const uint8_t *r, uint64_t seed, uint64_t slot, uint64_t slot_size,
                              g3_record *out);

/* Writes the G3_SUPERBLOCK_SIZE bytes of the superblock of file (0-based)
 * of a store of layout l and uuid into b. */
void g3_sb_encode(const g3_layout *l, uint32_t file, const uint8_t uuid[G3_UUID_LEN], uint8_t *b);

/* Checks the superblock b read from file (0-based, named path in messages)
 * against layout l. Returns 1 for an all-zero block (a file preallocated
 * but never formatted: a crash or a failed open in between), 0 when it
 * belongs to l (uuid gets the store's uuid), or fails with KVCR_EINVAL
 * "G3 file <path> ..." (damaged, another format version, another layout).
 * uuid is left alone unless it returns 0. */
int g3_sb_check(const g3_layout *l, uint32_t file, const uint8_t *b, const char *path,
                uint8_t uuid[G3_UUID_LEN]);

#endif
