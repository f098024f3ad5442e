/* What a block's G3 record and recovery-journal PUT keep besides its key:
 * the G3 record versions (a version-1 record, laid out by hand as the
 * format describes it, still reads, with no tenant and no metadata; a
 * version-2 record carries its tenant and metadata byte for byte; every
 * deviation reads as damaged, never as something else) and the stored
 * form of a block's router metadata (round trips value for value; the
 * decoder refuses every truncation, trailing byte and broken rule). */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "net/kvev.h"
#include "api/router_meta.h"
#include "tiers/g3_format.h"
#include "util/bytes.h"

#define SEED 0x1234abcdull
#define SLOT_SIZE 65536

/* ---- G3 records ------------------------------------------------------------ */

static g3_rec_check decode_at(const uint8_t *r, uint64_t slot, g3_record *out)
{
    return g3_record_decode(r, SEED, slot, SLOT_SIZE, out);
}

static void test_a_version_1_record_reads_without_tenant_or_metadata(void **state)
{
    (void)state;
    /* Laid out by hand: magic, FULL, key length, two zero bytes, slot,
     * generation, length, data checksum, the key, the seal. */
    uint8_t r[G3_RECORD_SIZE] = {0};
    put32(r, G3_REC_MAGIC);
    r[4] = G3_REC_FULL;
    r[5] = 5;
    put64(r + 8, 9);
    put64(r + 16, 77);
    put64(r + 24, 4096);
    put64(r + 32, 0xfeedull);
    memcpy(r + 40, "k-one", 5);
    g3_record_seal(r, SEED);
    g3_record d;
    assert_int_equal(decode_at(r, 9, &d), G3_REC_OK);
    assert_int_equal(d.state, G3_REC_FULL);
    assert_int_equal(d.key_len, 5);
    assert_memory_equal(d.key, "k-one", 5);
    assert_int_equal(d.gen, 77);
    assert_int_equal(d.len, 4096);
    assert_int_equal(d.tenant_len, 0);
    assert_int_equal(d.meta_len, 0);
    assert_null(d.tenant);
    assert_null(d.meta);
    /* ... and a record without tenant or metadata is still written so */
    uint8_t again[G3_RECORD_SIZE];
    g3_record_encode(again, SEED, &(g3_record){G3_REC_FULL, 5, (const uint8_t *)"k-one", 9, 77,
                                               4096, 0xfeedull});
    assert_memory_equal(again, r, G3_RECORD_SIZE);
}

/* A version-2 record of key "k-two", tenant "alice" and meta_len bytes of
 * metadata. */
static void encode_v2(uint8_t *r, const uint8_t *meta, uint8_t meta_len)
{
    g3_record w = {G3_REC_FULL, 5, (const uint8_t *)"k-two", 3, 8, 100, 0x55,
                   5, meta_len, (const uint8_t *)"alice", meta};
    g3_record_encode(r, SEED, &w);
}

static void test_a_version_2_record_carries_tenant_and_metadata(void **state)
{
    (void)state;
    uint8_t meta[G3_REC_ROOM], r[G3_RECORD_SIZE];
    for (size_t i = 0; i < sizeof meta; i++) meta[i] = (uint8_t)(i * 31 + 7);
    uint8_t most = G3_REC_ROOM - 5 - 5 - 1; /* key, tenant, length byte */
    assert_true(g3_record_fits(5, 5, most));
    assert_false(g3_record_fits(5, 5, most + 1));
    assert_false(g3_record_fits(G3_KEY_MAX, 7, 1));
    assert_true(g3_record_fits(G3_KEY_MAX, 0, 0));
    assert_true(g3_record_fits(G3_KEY_MAX, 0, G3_REC_ROOM - G3_KEY_MAX - 1));
    encode_v2(r, meta, most);
    assert_int_equal(r[6], 2); /* the version byte */
    assert_int_equal(r[7], 5); /* the tenant's length */
    g3_record d;
    assert_int_equal(decode_at(r, 3, &d), G3_REC_OK);
    assert_memory_equal(d.key, "k-two", 5);
    assert_int_equal(d.tenant_len, 5);
    assert_memory_equal(d.tenant, "alice", 5);
    assert_int_equal(d.meta_len, most);
    assert_memory_equal(d.meta, meta, most);
    /* metadata without a tenant, a tenant without metadata */
    g3_record w = {G3_REC_FULL, 5, (const uint8_t *)"k-two", 3, 8, 100, 0x55, 0, 3, NULL, meta};
    g3_record_encode(r, SEED, &w);
    assert_int_equal(decode_at(r, 3, &d), G3_REC_OK);
    assert_null(d.tenant);
    assert_int_equal(d.meta_len, 3);
    assert_memory_equal(d.meta, meta, 3);
    w = (g3_record){G3_REC_FULL, 5, (const uint8_t *)"k-two", 3, 8, 100, 0x55, 3, 0,
                    (const uint8_t *)"bob", NULL};
    g3_record_encode(r, SEED, &w);
    assert_int_equal(decode_at(r, 3, &d), G3_REC_OK);
    assert_memory_equal(d.tenant, "bob", 3);
    assert_null(d.meta);
}

/* The record, changed at byte `at` to v and sealed again, is damaged. */
static void expect_damaged(const uint8_t *good, size_t at, uint8_t v)
{
    uint8_t r[G3_RECORD_SIZE];
    memcpy(r, good, sizeof r);
    r[at] = v;
    g3_record_seal(r, SEED);
    g3_record d;
    if (decode_at(r, 3, &d) != G3_REC_DAMAGED)
        fail_msg("byte %zu set to %u still decodes", at, (unsigned)v);
}

static void test_every_deviation_of_a_record_reads_as_damaged(void **state)
{
    (void)state;
    uint8_t meta[4] = {1, 2, 3, 4}, v2[G3_RECORD_SIZE], v1[G3_RECORD_SIZE];
    encode_v2(v2, meta, 4);
    g3_record_encode(v1, SEED, &(g3_record){G3_REC_FULL, 5, (const uint8_t *)"k-two", 3, 8, 100,
                                            0x55});
    expect_damaged(v2, 6, 3);           /* an unknown version */
    expect_damaged(v1, 6, 1);
    expect_damaged(v1, 7, 4);           /* a tenant length in version 1 */
    expect_damaged(v2, 4, G3_REC_EMPTY); /* an EMPTY record of version 2 */
    expect_damaged(v2, 40 + 5 + 5, 200); /* metadata past the record */
    expect_damaged(v2, 7, 250);          /* a tenant past the record */
    expect_damaged(v2, 40 + 5 + 5 + 1 + 4, 9); /* a byte after the metadata */
    expect_damaged(v2, 247, 1);          /* the last byte before the seal */
    uint8_t none[G3_RECORD_SIZE];        /* version 2 saying nothing */
    memcpy(none, v1, sizeof none);
    none[6] = 2;
    g3_record_seal(none, SEED);
    g3_record d;
    assert_int_equal(decode_at(none, 3, &d), G3_REC_DAMAGED);
    /* an unsealed change is caught by the checksum */
    uint8_t r[G3_RECORD_SIZE];
    memcpy(r, v2, sizeof r);
    r[40 + 5 + 2] ^= 1;
    assert_int_equal(decode_at(r, 3, &d), G3_REC_DAMAGED);
    /* and the good ones still read */
    assert_int_equal(decode_at(v2, 3, &d), G3_REC_OK);
    assert_int_equal(decode_at(v1, 3, &d), G3_REC_OK);
}

/* ---- the stored form of router metadata ----------------------------------- */

/* An entry for rb, through a map as deposits make them. */
static size_t stored_form(const kvcr_router_block *rb, uint8_t *out, size_t cap)
{
    rmeta_map m;
    rmeta_init(&m, 8);
    uint8_t *packed = NULL;
    size_t packed_len = 0;
    if (rb->n_extra_keys)
        assert_int_equal(kvev_extra_from_strings(rb->extra_keys, rb->n_extra_keys, &packed,
                                                 &packed_len), 0);
    assert_int_equal(rmeta_put(&m, 99, rb, packed, packed_len), 0);
    free(packed);
    size_t n = rmeta_encode(rmeta_get(&m, 99), out, cap);
    rmeta_destroy(&m);
    return n;
}

static void test_router_metadata_round_trips_value_for_value(void **state)
{
    (void)state;
    uint32_t tok[16];
    for (uint32_t i = 0; i < 16; i++) tok[i] = 0xffffff00u + i;
    const char *extra[] = {"salt-a", "", "mm-0123"};
    kvcr_router_block full = {.has_parent = true, .parent_hash = 0x8877665544332211ull,
                              .token_ids = tok, .block_size_tokens = 16, .lora_name = "lora-7",
                              .extra_keys = extra, .n_extra_keys = 3};
    uint8_t b[512];
    size_t n = stored_form(&full, b, sizeof b);
    /* the extra keys packed: a u16 length, fixarray, three fixstr */
    assert_int_equal(n, 2 + 4 + 8 + 64 + 1 + 6 + 2 + 1 + (1 + 6) + 1 + (1 + 7));
    assert_int_equal(b[0], RMETA_FORMAT);
    assert_int_equal(b[1], RMETA_F_PARENT | RMETA_F_TOKENS | RMETA_F_LORA | RMETA_F_PACKED);
    assert_int_equal(get32(b + 2), 16);
    assert_true(get64(b + 6) == 0x8877665544332211ull);
    assert_int_equal(get32(b + 14), 0xffffff00u);
    /* too small a buffer: the length it needs, nothing written */
    uint8_t small[8] = {0};
    assert_int_equal(stored_form(&full, small, sizeof small), n);
    assert_int_equal(small[0], 0);
    bool damaged;
    rmeta *e = rmeta_decode(5, b, n, &damaged);
    assert_non_null(e);
    assert_true(e->hash == 5 && e->has_parent && e->parent == 0x8877665544332211ull);
    assert_int_equal(e->block_size, 16);
    assert_int_equal(e->n_tokens, 16);
    assert_memory_equal(e->tokens, tok, sizeof tok);
    assert_string_equal(e->lora_name, "lora-7");
    static const uint8_t keys[] = {0x93, 0xa6, 's', 'a', 'l', 't', '-', 'a', 0xa0,
                                   0xa7, 'm', 'm', '-', '0', '1', '2', '3'};
    assert_int_equal(e->extra_len, sizeof keys);
    assert_memory_equal(e->extra, keys, sizeof keys);
    free(e);
    /* the older form (a count and strings) still reads, as the same keys */
    uint8_t old[] = {RMETA_FORMAT, 0, 4, 0, 0, 0, 3, 6, 's', 'a', 'l', 't', '-', 'a', 0,
                     7, 'm', 'm', '-', '0', '1', '2', '3'};
    e = rmeta_decode(4, old, sizeof old, &damaged);
    assert_non_null(e);
    assert_int_equal(e->extra_len, sizeof keys);
    assert_memory_equal(e->extra, keys, sizeof keys);
    free(e);

    /* the least: a block size alone */
    kvcr_router_block least = {.block_size_tokens = 32};
    n = stored_form(&least, b, sizeof b);
    assert_int_equal(n, 7);
    e = rmeta_decode(6, b, n, &damaged);
    assert_non_null(e);
    assert_false(e->has_parent);
    assert_int_equal(e->n_tokens, 0);
    assert_int_equal(e->block_size, 32);
    assert_null(e->lora_name);
    assert_null(e->extra);
    free(e);
}

static void expect_refused(const uint8_t *b, size_t n, const char *why)
{
    bool damaged = false;
    rmeta *e = rmeta_decode(1, b, n, &damaged);
    if (e != NULL || !damaged) fail_msg("decoded: %s", why);
}

static void test_the_stored_form_decoder_refuses_what_breaks_a_rule(void **state)
{
    (void)state;
    uint32_t tok[4] = {1, 2, 3, 4};
    const char *extra[] = {"x1"};
    kvcr_router_block rb = {.has_parent = true, .parent_hash = 3, .token_ids = tok,
                            .block_size_tokens = 4, .lora_name = "l", .extra_keys = extra,
                            .n_extra_keys = 1};
    uint8_t good[128], b[129];
    size_t n = stored_form(&rb, good, sizeof good);
    for (size_t cut = 0; cut < n; cut++) expect_refused(good, cut, "a truncation");
    memcpy(b, good, n);
    b[n] = 0;
    expect_refused(b, n + 1, "a trailing byte");
    expect_refused(NULL, 0, "nothing");
    memcpy(b, good, n);
    b[0] = 2;
    expect_refused(b, n, "another format");
    memcpy(b, good, n);
    b[1] |= 0x10;
    expect_refused(b, n, "an unknown flag");
    memcpy(b, good, n);
    b[n - 4] = 0xc1; /* the packed keys' array header: never valid msgpack */
    expect_refused(b, n, "packed keys that do not decode");
    memcpy(b, good, n);
    put32(b + 2, KVCR_ROUTER_MAX_TOKENS + 1);
    expect_refused(b, n, "a block size past the limit");
    /* tokens with a block size of 0 */
    uint8_t z[] = {RMETA_FORMAT, RMETA_F_TOKENS, 0, 0, 0, 0, 0};
    expect_refused(z, sizeof z, "tokens of a zero block size");
    /* a NUL inside the LoRA name (at 2 + 4 + 8 + 16 + 1) */
    memcpy(b, good, n);
    b[31] = 0;
    expect_refused(b, n, "a NUL in a string");
    /* more extra keys than a block may have */
    uint8_t many[7 + 1 + 65 * 1] = {RMETA_FORMAT, 0, 1, 0, 0, 0, 65};
    expect_refused(many, 7, "65 extra keys");
    bool damaged;
    rmeta *e = rmeta_decode(1, good, n, &damaged);
    assert_non_null(e);
    assert_false(damaged);
    free(e);
}

/* Found again with its block: resident at once (not pending), kept over a
 * later find, pending again with the block's last residency (a spill's G3
 * store follows its DRAM removal), forgotten past the pending bound. */
static void test_found_metadata_lives_with_its_residency(void **state)
{
    (void)state;
    kvcr_router_block rb = {.block_size_tokens = 8, .lora_name = "l"};
    uint8_t b[64];
    size_t n = stored_form(&rb, b, sizeof b);
    rmeta_map m;
    rmeta_init(&m, 1);
    assert_int_equal(rmeta_found(&m, 10, b, n, RMETA_G3), 0);
    assert_int_equal(rmeta_found(&m, 10, b, n, RMETA_DRAM), 0);
    assert_int_equal(rmeta_found(&m, 11, b, n - 1, RMETA_G3), 1); /* damaged: nothing kept */
    assert_null(rmeta_get(&m, 11));
    const rmeta *e = rmeta_get(&m, 10);
    assert_non_null(e);
    assert_false(e->pending);
    assert_int_equal(e->media, RMETA_G3 | RMETA_DRAM);
    assert_int_equal(m.n_pending, 0);
    rmeta_removed(&m, 10, RMETA_G3);
    assert_non_null(rmeta_get(&m, 10));
    rmeta_removed(&m, 10, RMETA_DRAM);
    e = rmeta_get(&m, 10);
    assert_non_null(e);
    assert_true(e->pending && e->media == 0);
    assert_int_equal(rmeta_found(&m, 12, b, n, RMETA_G3), 0);
    rmeta_removed(&m, 12, RMETA_G3); /* a second pending entry: past the bound of 1 */
    assert_null(rmeta_get(&m, 10));
    assert_non_null(rmeta_get(&m, 12));
    assert_int_equal(m.forgotten, 1);
    rmeta_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_version_1_record_reads_without_tenant_or_metadata),
        cmocka_unit_test(test_a_version_2_record_carries_tenant_and_metadata),
        cmocka_unit_test(test_every_deviation_of_a_record_reads_as_damaged),
        cmocka_unit_test(test_router_metadata_round_trips_value_for_value),
        cmocka_unit_test(test_the_stored_form_decoder_refuses_what_breaks_a_rule),
        cmocka_unit_test(test_found_metadata_lives_with_its_residency),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
