/* A program of the installed libkvcr, as an engine builds one: include/
 * alone, linked with `pkg-config --cflags --libs kvcr` (tests/abi/run.sh).
 * It checks that the symbols it calls come from the installed libkvcr.so,
 * then moves one block through the public API: deposit from a framework
 * block into KVCR DRAM, deliver into another framework block, bytes
 * compared, every status checked; a key never deposited fails NOT_FOUND.
 * Exits 1 naming the first thing that went wrong.
 *
 *   abi-roundtrip LIBDIR     # the directory libkvcr.so must come from */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvcr/kvcr.h>

#define BS 4096
#define FW_BLOCKS 4
#define SLOTS 4
#define WAIT_S 10

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "abi-roundtrip: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void check(int rc, const char *what)
{
    if (rc != 0) fail("%s: %s (%d: %s)", what, kvcr_strerror(rc), rc, kvcr_last_error());
}

/* kvcr_create must resolve to LIBDIR/libkvcr.so.<major>, not to a copy
 * linked into this program or found elsewhere. */
static void check_origin(const char *libdir)
{
    Dl_info info;
    if (dladdr((void *)&kvcr_create, &info) == 0 || info.dli_fname == NULL)
        fail("dladdr cannot place kvcr_create");
    size_t n = strlen(libdir);
    const char *base = info.dli_fname + n;
    if (strncmp(info.dli_fname, libdir, n) != 0 || strncmp(base, "/libkvcr.so", 11) != 0)
        fail("kvcr_create comes from %s, not from %s/libkvcr.so", info.dli_fname, libdir);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Polls until op completes; its n entries' statuses and reasons. */
static void wait_op(kvcr_t *kv, kvcr_op_handle op, size_t n, kvcr_entry_status *st,
                    kvcr_reason *why)
{
    double until = now_s() + WAIT_S;
    while (now_s() < until) {
        kvcr_op_result *res = NULL;
        size_t got = 0;
        check(kvcr_poll(kv, &res, &got), "kvcr_poll");
        for (size_t i = 0; i < got; i++) {
            if (res[i].op != op) fail("kvcr_poll returned operation %llu, not %llu",
                                      (unsigned long long)res[i].op, (unsigned long long)op);
            if (res[i].n_entries != n)
                fail("operation %llu has %zu entries, not %zu", (unsigned long long)op,
                     res[i].n_entries, n);
            for (size_t j = 0; j < n; j++) {
                st[j] = res[i].entries[j].status;
                why[j] = res[i].entries[j].reason;
            }
            kvcr_results_free(res);
            return;
        }
        kvcr_results_free(res);
        struct timespec pause = {0, 200000};
        nanosleep(&pause, NULL);
    }
    fail("operation %llu did not complete within %d s", (unsigned long long)op, WAIT_S);
}

static kvcr_block block_at(const char *key, kvcr_mem_ref *ref, uint64_t index)
{
    *ref = (kvcr_mem_ref){.end_point = NULL, .label = "", .index = index};
    return (kvcr_block){.key = {(const uint8_t *)key, strlen(key)}, .refs = ref, .n_refs = 1};
}

int main(int argc, char **argv)
{
    if (argc != 2) fail("usage: abi-roundtrip LIBDIR");
    check_origin(argv[1]);
    if (kvcr_version_string() == NULL || kvcr_version_string()[0] == '\0')
        fail("kvcr_version_string is empty");

    static unsigned char fw[FW_BLOCKS * BS], dram[SLOTS * BS];
    for (size_t i = 0; i < BS; i++) fw[i] = (unsigned char)(i * 7 + 3);
    memset(fw + BS, 0, (FW_BLOCKS - 1) * BS);

    kvcr_config cfg;
    kvcr_config_init(&cfg);
    kvcr_pool_layout layout = {.name = "", .block_size = BS};
    kvcr_dram_pool pool = {.name = "", .addr = dram, .size = sizeof dram};
    kvcr_region region = {.addr = fw, .element_size = BS, .count = FW_BLOCKS, .label = ""};
    cfg.agent_name = "abi-roundtrip";
    cfg.pool_layouts = &layout;
    cfg.n_pool_layouts = 1;
    cfg.local_dram = &pool;
    cfg.n_local_dram = 1;
    cfg.framework_regions = &region;
    cfg.n_framework_regions = 1;
    kvcr_t *kv = NULL;
    check(kvcr_create(&cfg, &kv), "kvcr_create");

    kvcr_mem_ref ref;
    kvcr_entry_status st[2];
    kvcr_reason why[2];
    kvcr_op_handle op = 0;
    kvcr_block dep = block_at("abi-key", &ref, 0);
    check(kvcr_deposit(kv, &dep, 1, 0, &op), "kvcr_deposit");
    wait_op(kv, op, 1, st, why);
    if (st[0] != KVCR_ENTRY_SUCCESS) fail("deposit: status %d, reason %d", st[0], why[0]);

    kvcr_query_result q;
    check(kvcr_query(kv, &dep.key, 1, NULL, &q), "kvcr_query");
    if (q.status != KVCR_QUERY_HIT) fail("query after the deposit: status %d, not HIT", q.status);

    memset(fw, 0, BS); /* the deliver must come from KVCR DRAM */
    kvcr_mem_ref refs[2];
    kvcr_block del[2] = {block_at("abi-key", &refs[0], 2), block_at("never-deposited", &refs[1], 3)};
    check(kvcr_deliver(kv, del, 2, NULL, &op), "kvcr_deliver");
    wait_op(kv, op, 2, st, why);
    if (st[0] != KVCR_ENTRY_SUCCESS) fail("deliver: status %d, reason %d", st[0], why[0]);
    if (st[1] != KVCR_ENTRY_FAILED || why[1] != KVCR_REASON_NOT_FOUND)
        fail("deliver of a key never deposited: status %d, reason %d (want FAILED, NOT_FOUND)",
             st[1], why[1]);
    for (size_t i = 0; i < BS; i++)
        if (fw[2 * BS + i] != (unsigned char)(i * 7 + 3))
            fail("delivered byte %zu is %u, not %u", i, fw[2 * BS + i], (unsigned)(i * 7 + 3) & 0xff);
    for (size_t i = 0; i < BS; i++)
        if (fw[3 * BS + i] != 0) fail("a failed deliver wrote byte %zu of its destination", i);

    check(kvcr_close(kv), "kvcr_close");
    kvcr_free(kv);
    printf("abi-roundtrip: one block deposited and delivered through %s/libkvcr.so\n", argv[1]);
    return 0;
}
