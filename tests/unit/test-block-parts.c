/* Blocks made of parts: a pool's block gathered from several framework
 * regions ("pool:part") into one KVCR slot on deposit and scattered back on
 * deliver ("pool:*"), in several part layouts, with every byte compared,
 * also from G3 (through KVCR DRAM); and the rules that refuse parts that do
 * not make a block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fd_wait.h"
#include "harness.h"

enum { BS = 4096, N = 8, SLOTS = 16 };

/* One layout of parts under test: the regions of pool "kv" (and maybe a
 * whole pool "w" beside it), over one framework buffer. */
typedef struct parts_rig {
    kvcr_t *kv;
    kvcr_config cfg;
    kvcr_pool_layout layouts[2];
    kvcr_dram_pool pools[2];
    kvcr_region regions[16];
    char labels[16][32];
    size_t n_regions;
    uint8_t *fw, *dram;
    size_t fw_bytes;
} parts_rig;

static void prig_init(parts_rig *p, bool with_whole_pool)
{
    memset(p, 0, sizeof *p);
    p->fw_bytes = 4 * (size_t)BS * N;
    p->fw = aligned_alloc(64, p->fw_bytes);
    p->dram = aligned_alloc(64, 2 * (size_t)BS * SLOTS);
    assert_non_null(p->fw);
    assert_non_null(p->dram);
    memset(p->fw, 0, p->fw_bytes);
    kvcr_config_init(&p->cfg);
    p->cfg.agent_name = "parts";
    p->layouts[0] = (kvcr_pool_layout){"kv", BS};
    p->layouts[1] = (kvcr_pool_layout){"w", BS};
    p->pools[0] = (kvcr_dram_pool){"kv", p->dram, (size_t)BS * SLOTS};
    p->pools[1] = (kvcr_dram_pool){"w", p->dram + (size_t)BS * SLOTS, (size_t)BS * SLOTS};
    size_t n_pools = with_whole_pool ? 2 : 1;
    p->cfg.pool_layouts = p->layouts;
    p->cfg.n_pool_layouts = n_pools;
    p->cfg.local_dram = p->pools;
    p->cfg.n_local_dram = n_pools;
    p->cfg.framework_regions = p->regions;
}

/* A region of `count` elements of `size` bytes, `stride` apart, at byte
 * `off` of the framework buffer. */
static void prig_region(parts_rig *p, const char *label, size_t off, size_t size, size_t stride)
{
    size_t i = p->n_regions++;
    snprintf(p->labels[i], sizeof p->labels[i], "%s", label);
    p->regions[i] = (kvcr_region){.addr = p->fw + off, .element_size = size, .count = N,
                                  .stride = stride, .label = p->labels[i]};
    assert_true(off + (N - 1) * (stride ? stride : size) + size <= p->fw_bytes);
    p->cfg.n_framework_regions = p->n_regions;
}

static int prig_start(parts_rig *p)
{
    return kvcr_create(&p->cfg, &p->kv);
}

static void prig_free(parts_rig *p)
{
    if (p->kv) {
        assert_int_equal(kvcr_close(p->kv), 0);
        kvcr_free(p->kv);
    }
    free(p->fw);
    free(p->dram);
}

/* The parts of pool "kv", in registration order. */
static size_t kv_parts(const parts_rig *p, const kvcr_region **out)
{
    size_t n = 0;
    for (size_t i = 0; i < p->n_regions; i++)
        if (strncmp(p->regions[i].label, "kv:", 3) == 0) out[n++] = &p->regions[i];
    return n;
}

static uint8_t *element(const kvcr_region *r, size_t idx)
{
    return (uint8_t *)r->addr + idx * (r->stride ? r->stride : r->element_size);
}

/* The block pattern of `seed` against element idx of each part in order
 * (the parts together hold one block): written (write) or compared. */
static bool pattern_parts(const parts_rig *p, size_t idx, uint32_t seed, bool write)
{
    uint8_t block[BS];
    fill_pattern(block, BS, seed);
    const kvcr_region *parts[16];
    size_t n = kv_parts(p, parts), off = 0;
    for (size_t k = 0; k < n; k++) {
        uint8_t *at = element(parts[k], idx);
        if (write)
            memcpy(at, block + off, parts[k]->element_size);
        else if (memcmp(at, block + off, parts[k]->element_size) != 0)
            return false;
        off += parts[k]->element_size;
    }
    assert_int_equal(off, BS);
    return true;
}

static void scatter_pattern(const parts_rig *p, size_t idx, uint32_t seed)
{
    pattern_parts(p, idx, seed, true);
}

static bool parts_hold(const parts_rig *p, size_t idx, uint32_t seed)
{
    return pattern_parts(p, idx, seed, false);
}

static void wait_ok(parts_rig *p, kvcr_op_handle op, size_t n)
{
    uint64_t until = fd_wait_now_ms() + 10000;
    do {
        kvcr_op_result *res;
        size_t nr;
        assert_int_equal(kvcr_poll(p->kv, &res, &nr), 0);
        for (size_t i = 0; i < nr; i++) {
            if (res[i].op != op) continue;
            assert_int_equal(res[i].n_entries, n);
            for (size_t e = 0; e < n; e++) {
                if (res[i].entries[e].status != KVCR_ENTRY_SUCCESS)
                    fail_msg("entry %zu: %s", e, kvcr_reason_name(res[i].entries[e].reason));
            }
            kvcr_results_free(res);
            return;
        }
        kvcr_results_free(res);
    } while (fd_wait(p->kv, until));
    fail_msg("operation %llu did not complete in 10 s", (unsigned long long)op);
}

/* Deposits blocks 0..3 from their parts, checks each KVCR slot holds the
 * block whole (the parts gathered in order), clears the framework memory,
 * delivers them into elements 4..7 and compares every part's bytes. With
 * `whole`, each block also spans pool "w" (a whole region) after "kv:*". */
static void round_trip(parts_rig *p, bool whole)
{
    assert_int_equal(prig_start(p), 0);
    kvcr_mem_ref refs[4][2];
    kvcr_block blocks[4];
    char names[4][8];
    for (uint32_t i = 0; i < 4; i++) {
        scatter_pattern(p, i, 100 + i);
        if (whole) fill_pattern(element(&p->regions[p->n_regions - 1], i), BS, 200 + i);
        refs[i][0] = (kvcr_mem_ref){NULL, "kv:*", i};
        refs[i][1] = (kvcr_mem_ref){NULL, "w", i};
        snprintf(names[i], sizeof names[i], "b%u", i);
        blocks[i] = (kvcr_block){key_of(names[i]), refs[i], whole ? 2 : 1};
    }
    kvcr_op_handle op;
    assert_int_equal(kvcr_deposit(p->kv, blocks, 4, 0, &op), 0);
    wait_ok(p, op, 4);

    /* Each slot of pool "kv" holds one block in the parts' order. */
    kvcr_key keys[4];
    for (uint32_t i = 0; i < 4; i++) keys[i] = blocks[i].key;
    const char *layout[2] = {"kv", "w"};
    assert_int_equal(kvcr_fetch(p->kv, keys, 4, NULL, layout, whole ? 2 : 1, &op), 0);
    kvcr_op_result *res = NULL;
    size_t nr = 0;
    uint64_t until = fd_wait_now_ms() + 10000;
    for (;;) {
        assert_int_equal(kvcr_poll(p->kv, &res, &nr), 0);
        if (nr > 0) break;
        kvcr_results_free(res);
        if (!fd_wait(p->kv, until)) break;
    }
    assert_int_equal(nr, 1);
    kvcr_release_handle rh[4];
    for (uint32_t i = 0; i < 4; i++) {
        const kvcr_entry_result *e = &res[0].entries[i];
        assert_int_equal(e->status, KVCR_ENTRY_SUCCESS);
        assert_int_equal(e->n_slots, whole ? 2 : 1);
        uint8_t block[BS];
        fill_pattern(block, BS, 100 + i);
        assert_memory_equal(e->slots[0].addr, block, BS);
        if (whole) {
            fill_pattern(block, BS, 200 + i);
            assert_memory_equal(e->slots[1].addr, block, BS);
        }
        rh[i] = e->release_handle;
    }
    kvcr_results_free(res);
    bool released[4];
    assert_int_equal(kvcr_release(p->kv, rh, 4, released), 0);

    memset(p->fw, 0, p->fw_bytes);
    for (uint32_t i = 0; i < 4; i++) {
        refs[i][0].index = 4 + i;
        refs[i][1].index = 4 + i;
    }
    assert_int_equal(kvcr_deliver(p->kv, blocks, 4, NULL, &op), 0);
    wait_ok(p, op, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_true(parts_hold(p, 4 + i, 100 + i));
        assert_false(parts_hold(p, i, 100 + i)); /* untouched: still zero */
        if (whole) {
            uint8_t block[BS];
            fill_pattern(block, BS, 200 + i);
            assert_memory_equal(element(&p->regions[p->n_regions - 1], 4 + i), block, BS);
        }
    }
}

static void test_two_halves_round_trip(void **state)
{
    (void)state;
    parts_rig p;
    prig_init(&p, false);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, BS / 2, 0);
    round_trip(&p, false);
    prig_free(&p);
}

/* SGLang's layer-first host pool: per layer a K and a V region, each
 * page's piece of a layer a slice of that layer's span. */
static void test_layer_first_pieces_round_trip(void **state)
{
    (void)state;
    enum { LAYERS = 4, PIECE = BS / (2 * LAYERS) };
    parts_rig p;
    prig_init(&p, false);
    size_t layer_span = (size_t)PIECE * N, v_off = LAYERS * layer_span;
    for (int l = 0; l < LAYERS; l++) {
        char k[16], v[16];
        snprintf(k, sizeof k, "kv:k%d", l);
        snprintf(v, sizeof v, "kv:v%d", l);
        prig_region(&p, k, l * layer_span, PIECE, 0);
        prig_region(&p, v, v_off + l * layer_span, PIECE, 0);
    }
    round_trip(&p, false);
    prig_free(&p);
}

/* Parts of unequal sizes with gaps between elements, and a second pool
 * whose block is one whole region: a block spans both. */
static void test_uneven_strided_parts_beside_a_whole_pool(void **state)
{
    (void)state;
    parts_rig p;
    prig_init(&p, true);
    prig_region(&p, "kv:a", 0, 100, 128);
    prig_region(&p, "kv:b", 2048, 1000, 1024 + 512);
    prig_region(&p, "kv:c", 2048 + 1536 * N, BS - 1100, BS);
    prig_region(&p, "w", 2048 + 1536 * N + (size_t)BS * N, BS, 0);
    round_trip(&p, true);
    prig_free(&p);
}

static void expect_config_refused(parts_rig *p, const char *msg)
{
    assert_int_equal(prig_start(p), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), msg);
    assert_null(p->kv);
}

static void test_parts_that_do_not_make_a_block_are_refused(void **state)
{
    (void)state;
    parts_rig p;
    prig_init(&p, false);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, BS / 4, 0);
    expect_config_refused(&p, "the parts of pool 'kv' add up to 3072 bytes, but its blocks are 4096");
    prig_free(&p);

    prig_init(&p, false);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv", (size_t)BS * N, BS, 0);
    expect_config_refused(&p, "pool 'kv' has a whole framework region and parts ('kv:k'): its "
                              "blocks are one or the other");
    prig_free(&p);

    prig_init(&p, false);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, BS / 2, 0);
    p.regions[1].count = N - 1;
    expect_config_refused(&p, "the parts of pool 'kv' must have one count: 'kv:k' has 8 "
                              "elements, 'kv:v' 7");
    prig_free(&p);

    const char *bad[] = {"kv:*", "nope:k", "kv:"};
    for (size_t i = 0; i < 3; i++) {
        prig_init(&p, false);
        prig_region(&p, bad[i], 0, BS, 0);
        char msg[256];
        snprintf(msg, sizeof msg,
                 "framework region label '%s' must name a configured pool, or one part of one as "
                 "'pool:part' (a part name, not '*')",
                 bad[i]);
        expect_config_refused(&p, msg);
        prig_free(&p);
    }

    prig_init(&p, false);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, BS / 2, 0);
    p.regions[1].device_id = 1;
    expect_config_refused(&p, "the parts of pool 'kv' must share one memory type and device");
    prig_free(&p);
}

/* Peers learn every region from one metadata message: a configuration
 * with more regions than it carries is refused with the peer tier on. */
static void test_more_parts_than_peers_can_learn_are_refused_with_the_peer_tier(void **state)
{
    (void)state;
    enum { PARTS = 256, PART = BS / PARTS };
    uint8_t *mem = aligned_alloc(64, (size_t)BS * N);
    assert_non_null(mem);
    kvcr_region *regions = calloc(PARTS, sizeof *regions);
    char (*labels)[16] = calloc(PARTS, sizeof *labels);
    assert_non_null(regions);
    assert_non_null(labels);
    for (size_t k = 0; k < PARTS; k++) {
        snprintf(labels[k], sizeof labels[k], "kv:p%zu", k);
        regions[k] = (kvcr_region){.addr = mem + k * PART * N, .element_size = PART, .count = N,
                                   .label = labels[k]};
    }
    parts_rig p;
    prig_init(&p, false);
    p.cfg.framework_regions = regions;
    p.cfg.n_framework_regions = PARTS;
    assert_int_equal(prig_start(&p), 0); /* without the peer tier: fine */
    assert_int_equal(kvcr_close(p.kv), 0);
    kvcr_free(p.kv);
    p.kv = NULL;
    p.cfg.remote.enabled = true;
    expect_config_refused(&p, "the peer tier publishes at most 256 regions (framework regions "
                              "and KVCR DRAM pools); 257 are configured");
    prig_free(&p);
    free(regions);
    free(labels);
    free(mem);
}

static void expect_ref_refused(parts_rig *p, const kvcr_mem_ref *ref, const char *msg)
{
    kvcr_block b = {key_of("x"), ref, 1};
    kvcr_op_handle op = 5;
    assert_int_equal(kvcr_deposit(p->kv, &b, 1, 0, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), msg);
    assert_int_equal(kvcr_deliver(p->kv, &b, 1, NULL, &op), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), msg);
    assert_int_equal(op, 5);
}

static void test_references_to_parts_are_checked(void **state)
{
    (void)state;
    parts_rig p;
    prig_init(&p, true);
    prig_region(&p, "kv:k", 0, BS / 2, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, BS / 2, 0);
    prig_region(&p, "w", 2 * (size_t)BS * N, BS, 0);
    assert_int_equal(prig_start(&p), 0);
    kvcr_mem_ref one = {NULL, "kv:k", 0};
    expect_ref_refused(&p, &one,
                       "block descriptor has the wrong byte count: region 'kv:k' elements are "
                       "2048 bytes, pool 'kv' blocks 4096 (a block in parts is named whole: "
                       "'pool:*')");
    kvcr_mem_ref far = {NULL, "kv:*", N};
    expect_ref_refused(&p, &far, "block descriptor index 8 is out of range for region 'kv:k' "
                                 "(count 8)");
    kvcr_mem_ref none = {NULL, "w:*", 0};
    expect_ref_refused(&p, &none, "block descriptors must use configured pools: no framework "
                                  "region is labelled 'w:*' (nor any part of that pool)");
    /* Nothing was stored by the refused calls. */
    kvcr_key k = key_of("x");
    kvcr_query_result q;
    assert_int_equal(kvcr_query(p.kv, &k, 1, NULL, &q), 0);
    assert_int_equal(q.status, KVCR_QUERY_MISS);
    prig_free(&p);
}

static kvcr_query_result query1(parts_rig *p, const char *name)
{
    kvcr_key k = key_of(name);
    kvcr_query_result q;
    assert_int_equal(kvcr_query(p->kv, &k, 1, NULL, &q), 0);
    return q;
}

/* G3 writes whole blocks only: a block in parts that G3 holds is read into
 * KVCR DRAM first and copied out part by part, bytes intact. */
static void test_deliver_from_g3_into_parts_goes_through_kvcr_dram(void **state)
{
    (void)state;
    char dir[64], path[96];
    snprintf(dir, sizeof dir, "/var/tmp/kvcr-parts-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/g3", dir);
    const char *paths[] = {path};
    parts_rig p;
    prig_init(&p, false);
    p.pools[0].size = 2 * BS; /* two DRAM slots: the third deposit spills */
    p.cfg.g3.paths = paths;
    p.cfg.g3.n_paths = 1;
    p.cfg.g3.capacity_bytes_per_file = 8 * BS;
    prig_region(&p, "kv:k", 0, BS / 4, 0);
    prig_region(&p, "kv:v", (size_t)BS * N, 3 * BS / 4, 0);
    assert_int_equal(prig_start(&p), 0);
    char names[4][8];
    for (uint32_t i = 0; i < 4; i++) {
        scatter_pattern(&p, i, 300 + i);
        snprintf(names[i], sizeof names[i], "g%u", i);
        kvcr_mem_ref ref = {NULL, "kv:*", i};
        kvcr_block b = {key_of(names[i]), &ref, 1};
        kvcr_op_handle op;
        assert_int_equal(kvcr_deposit(p.kv, &b, 1, 0, &op), 0);
        wait_ok(&p, op, 1);
    }
    bool in_g3 = false;
    for (uint64_t until = fd_wait_now_ms() + 5000; !in_g3;) {
        kvcr_op_result *res;
        size_t nr;
        assert_int_equal(kvcr_poll(p.kv, &res, &nr), 0);
        kvcr_results_free(res);
        kvcr_query_result q = query1(&p, "g0"); /* FETCHING while the spill is written */
        in_g3 = q.status == KVCR_QUERY_FETCHABLE && q.tier == KVCR_TIER_G3;
        if (!in_g3 && !fd_wait(p.kv, until)) break;
    }
    assert_true(in_g3);
    assert_int_equal(query1(&p, "g0").status, KVCR_QUERY_FETCHABLE);
    memset(p.fw, 0, p.fw_bytes);
    kvcr_mem_ref ref = {NULL, "kv:*", 6};
    kvcr_block b = {key_of("g0"), &ref, 1};
    kvcr_op_handle op;
    assert_int_equal(kvcr_deliver(p.kv, &b, 1, NULL, &op), 0);
    wait_ok(&p, op, 1);
    assert_true(parts_hold(&p, 6, 300));
    assert_int_equal(query1(&p, "g0").status, KVCR_QUERY_HIT); /* staged in KVCR DRAM */
    prig_free(&p);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_halves_round_trip),
        cmocka_unit_test(test_layer_first_pieces_round_trip),
        cmocka_unit_test(test_uneven_strided_parts_beside_a_whole_pool),
        cmocka_unit_test(test_parts_that_do_not_make_a_block_are_refused),
        cmocka_unit_test(test_more_parts_than_peers_can_learn_are_refused_with_the_peer_tier),
        cmocka_unit_test(test_references_to_parts_are_checked),
        cmocka_unit_test(test_deliver_from_g3_into_parts_goes_through_kvcr_dram),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
