/* A peer pull into a block made of parts: the target's framework memory
 * holds each block in 2 x layers pieces ("pool:part" regions, SGLang's
 * layer-first host layout), the source holds the block whole (in its KVCR
 * DRAM, or in framework memory served through pins), and a hinted deliver
 * of "pool:*" makes the source write every piece where the target's
 * metadata says, with every byte compared; a key the source lacks fails
 * and leaves its pieces untouched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"

enum { BS = 4096, LAYERS = 4, PIECE = BS / (2 * LAYERS), N = 16 };

typedef struct parted {
    rig r;
    kvcr_region regions[2 * LAYERS];
    char labels[2 * LAYERS][16];
    uint8_t *mem; /* K of every layer, then V of every layer */
} parted;

/* Byte j of block i's piece p (K_l = 2l, V_l = 2l + 1), as the pieces
 * stand in the block: the block's bytes in order. */
static const uint8_t *piece_at(const parted *t, size_t p, size_t idx)
{
    size_t layer = p / 2, layer_span = (size_t)PIECE * N;
    size_t base = (p % 2 ? LAYERS * layer_span : 0) + layer * layer_span;
    return t->mem + base + idx * PIECE;
}

static void parted_start(parted *t)
{
    rig_init_remote(&t->r, BS, 1, 32);
    t->mem = aligned_alloc(64, (size_t)BS * N);
    assert_non_null(t->mem);
    memset(t->mem, 0, (size_t)BS * N);
    size_t layer_span = (size_t)PIECE * N;
    for (int l = 0; l < LAYERS; l++)
        for (int v = 0; v < 2; v++) {
            int p = 2 * l + v;
            snprintf(t->labels[p], sizeof t->labels[p], ":%c%d", v ? 'v' : 'k', l);
            t->regions[p] = (kvcr_region){
                .addr = t->mem + (v ? LAYERS * layer_span : 0) + l * layer_span,
                .element_size = PIECE, .count = N, .label = t->labels[p]};
        }
    t->r.cfg.framework_regions = t->regions;
    t->r.cfg.n_framework_regions = 2 * LAYERS;
    rig_start(&t->r);
}

static void parted_stop(parted *t)
{
    rig_stop(&t->r);
    free(t->mem);
}

/* Element idx's pieces, in order, hold block k<seed>'s bytes. */
static bool holds_block(const parted *t, size_t idx, uint32_t seed)
{
    uint8_t block[BS];
    fill_pattern(block, BS, seed);
    for (size_t p = 0; p < 2 * LAYERS; p++)
        if (memcmp(piece_at(t, p, idx), block + p * PIECE, PIECE) != 0) return false;
    return true;
}

static bool untouched(const parted *t, size_t idx)
{
    for (size_t p = 0; p < 2 * LAYERS; p++)
        for (size_t j = 0; j < PIECE; j++)
            if (piece_at(t, p, idx)[j] != 0) return false;
    return true;
}

/* Delivers k<first..first+n-1> into elements dst.. of "pool:*" (the pool
 * is ""); the label is freed right after the call, as a caller's may be. */
static kvcr_op_handle deliver_parts(parted *t, uint32_t first, uint32_t n, size_t dst,
                                    const char *request)
{
    char names[N][24];
    kvcr_mem_ref refs[N];
    kvcr_block b[N];
    char *label = strdup(":*");
    assert_non_null(label);
    for (uint32_t i = 0; i < n; i++) {
        refs[i] = (kvcr_mem_ref){NULL, label, dst + i};
        b[i] = (kvcr_block){key_of(peer_key(names[i], sizeof names[i], first + i)), &refs[i], 1};
    }
    kvcr_op_handle op;
    int rc = kvcr_deliver(t->r.kv, b, n, request, &op);
    free(label);
    if (rc != 0) fprintf(stderr, "deliver: %s\n", kvcr_last_error());
    assert_int_equal(rc, 0);
    return op;
}

static void pull_and_compare(peer *src, const char *request)
{
    parted t;
    parted_start(&t);
    uint64_t hashes[9];
    for (uint32_t i = 0; i < 8; i++) hashes[i] = i;
    hashes[8] = 100; /* hinted, but the source lacks it */
    peer_hint_hashes(&t.r, request, src->endpoint, hashes, 9);

    kvcr_entry_status st[8];
    kvcr_reason why[8];
    assert_int_equal(rig_wait(&t.r, deliver_parts(&t, 0, 8, 4, request), st, why, NULL), 8);
    for (uint32_t i = 0; i < 8; i++) {
        if (st[i] != KVCR_ENTRY_SUCCESS) fail_msg("k%u: %s", i, kvcr_reason_name(why[i]));
        assert_true(holds_block(&t, 4 + i, i));
    }
    for (size_t idx = 0; idx < 4; idx++) assert_true(untouched(&t, idx));
    for (size_t idx = 12; idx < N; idx++) assert_true(untouched(&t, idx));

    /* The key the source lacks fails NOT_FOUND and leaves its pieces alone. */
    assert_int_equal(rig_wait(&t.r, deliver_parts(&t, 100, 1, 0, request), st, why, NULL), 1);
    assert_int_equal(st[0], KVCR_ENTRY_FAILED);
    assert_int_equal(why[0], KVCR_REASON_NOT_FOUND);
    assert_true(untouched(&t, 0));
    parted_stop(&t);
}

static void test_pull_from_kvcr_dram_into_layer_pieces(void **state)
{
    (void)state;
    peer src;
    peer_spawn_source(&src, N);
    pull_and_compare(&src, "req-dram");
    peer_stop(&src);
}

static void test_pull_from_pinned_framework_into_layer_pieces(void **state)
{
    (void)state;
    peer_opts o;
    peer_opts_init(&o);
    o.fw_n = N;
    o.pins = true;
    o.slots = 0; /* no KVCR DRAM: every block is served from the framework's */
    peer src;
    peer_spawn(&src, &o);
    pull_and_compare(&src, "req-pins");
    peer_counts c;
    peer_counters(&src, &c);
    assert_true(c.pin_requests >= 1);
    peer_stop(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_from_kvcr_dram_into_layer_pieces),
        cmocka_unit_test(test_pull_from_pinned_framework_into_layer_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
