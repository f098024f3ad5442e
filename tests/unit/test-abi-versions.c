/* The versioned ABI: kvcr_config_init writes this header's version; a
 * config is read only as far as its version reaches, the later fields
 * taking their defaults; a config or policy version the library does not
 * read is refused with a message naming it, and nothing is started (no G3
 * slot file appears). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/abi.h"
#include "api/boot.h"
#include "harness.h"

enum { BS = 4096 };

#define READS "libkvcr " KVCR_VERSION_STRING " reads versions 1 to 2" /* policies */
#define READS_CONFIG "libkvcr " KVCR_VERSION_STRING " reads versions 1 to 3"
#define CONFIG_FIX "(kvcr_config_init sets the version of the kvcr.h a program is built with)"
#define POLICY_FIX "(set .version = KVCR_POLICY_VERSION)"

/* A rig whose start creates a G3 slot file: the file is the witness that an
 * instance was (or was not) started. */
typedef struct g3_rig {
    rig r;
    char dir[64];
    char path[96];
    const char *paths[1];
} g3_rig;

static void g3_init(g3_rig *g)
{
    rig_init(&g->r, BS, 2, 2);
    snprintf(g->dir, sizeof g->dir, "/var/tmp/kvcr-abi-XXXXXX");
    assert_non_null(mkdtemp(g->dir));
    snprintf(g->path, sizeof g->path, "%s/slots", g->dir);
    g->paths[0] = g->path;
    g->r.cfg.g3.paths = g->paths;
    g->r.cfg.g3.n_paths = 1;
    g->r.cfg.g3.capacity_bytes_per_file = 4 * BS;
}

static bool g3_file_exists(const g3_rig *g)
{
    if (access(g->path, F_OK) == 0) return true;
    assert_int_equal(errno, ENOENT);
    return false;
}

static void g3_cleanup(g3_rig *g)
{
    rig_stop(&g->r);
    unlink(g->path);
    rmdir(g->dir);
}

/* kvcr_create refuses cfg with exactly `message`, and starts nothing. */
static void assert_refused(g3_rig *g, const char *message)
{
    kvcr_t *kv = (kvcr_t *)&kv; /* must be cleared */
    assert_int_equal(kvcr_create(&g->r.cfg, &kv), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), message);
    assert_null(kv);
    assert_false(g3_file_exists(g));
}

static void test_config_init_writes_this_headers_version(void **state)
{
    (void)state;
    kvcr_config c;
    memset(&c, 0xA5, sizeof c);
    kvcr_config_init(&c);
    assert_int_equal(c.version, KVCR_CONFIG_VERSION);
    assert_int_equal(c.copy_threads, 2);
    assert_int_equal(c.limits.max_hint_bytes, 1u << 20);
    assert_null(c.agent_name);
    assert_null(c.callbacks.log);
    assert_int_equal(kvcr_config_init_version(&c, KVCR_CONFIG_VERSION), 0);

    /* A version the library does not read: only the version is written. */
    const uint32_t unknown[] = {0, KVCR_CONFIG_VERSION + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        memset(&c, 0xA5, sizeof c);
        assert_int_equal(kvcr_config_init_version(&c, unknown[i]), KVCR_EINVAL);
        char want[256];
        snprintf(want, sizeof want, "kvcr_config has version %u; " READS_CONFIG " " CONFIG_FIX,
                 unknown[i]);
        assert_string_equal(kvcr_last_error(), want);
        assert_int_equal(c.version, unknown[i]);
        assert_int_equal(c.copy_threads, 0xA5A5A5A5u);
        assert_int_equal((uintptr_t)c.agent_name, (uintptr_t)0xA5A5A5A5A5A5A5A5ull);
    }
    assert_int_equal(kvcr_config_init_version(NULL, KVCR_CONFIG_VERSION), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "kvcr_config_init: cfg must not be NULL");
}

static void test_unknown_config_versions_are_refused_before_anything_starts(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g);
    const uint32_t unknown[] = {0, KVCR_CONFIG_VERSION + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        g.r.cfg.version = unknown[i];
        char want[256];
        snprintf(want, sizeof want, "kvcr_config has version %u; " READS_CONFIG " " CONFIG_FIX,
                 unknown[i]);
        assert_refused(&g, want);
        /* The daemon's way in reads the same way. */
        kvcr_t *kv = (kvcr_t *)&kv;
        assert_int_equal(kvcr__create(&g.r.cfg, NULL, &kv), KVCR_EINVAL);
        assert_string_equal(kvcr_last_error(), want);
        assert_null(kv);
        assert_false(g3_file_exists(&g));
    }
    /* Guard mode too: the version is read before the service is asked. */
    g.r.cfg.version = 0;
    g.r.cfg.guard.service_socket_path = "/nonexistent/kvcr-abi.sock";
    assert_refused(&g, "kvcr_config has version 0; " READS_CONFIG " " CONFIG_FIX);
    g.r.cfg.guard.service_socket_path = NULL;

    g.r.cfg.version = KVCR_CONFIG_VERSION;
    rig_start(&g.r);
    assert_true(g3_file_exists(&g));
    g3_cleanup(&g);
}

/* Layouts standing in for a release still to come: version 1 is a header
 * from before `limits` (and everything after it) was appended, version 2
 * this one. */
static const kvcr__config_layout before_limits[] = {
    {1, offsetof(kvcr_config, limits)},
    {2, sizeof(kvcr_config)},
};

/* cfg as a program built with an older header hands it over: of that
 * version, exactly as long as its header says (a read past it is a heap
 * overflow, which the ASan build catches). */
static kvcr_config *older_config(kvcr_config *cfg, uint32_t version, size_t size)
{
    cfg->version = version;
    kvcr_config *old = malloc(size);
    assert_non_null(old);
    memcpy(old, cfg, size);
    return old;
}

static void test_an_older_layout_reads_its_later_fields_as_defaults(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g);
    size_t old_size = offsetof(kvcr_config, limits);
    kvcr_config *old = older_config(&g.r.cfg, 1, old_size);

    kvcr_config full, defaults;
    memset(&full, 0x5A, sizeof full);
    kvcr_config_init(&defaults);
    assert_int_equal(kvcr__config_import_from(before_limits, 2, old, &full), 0);
    assert_int_equal(full.version, 2);
    assert_string_equal(full.agent_name, "test");
    assert_ptr_equal(full.pool_layouts, &g.r.layout);
    assert_ptr_equal(full.local_dram, &g.r.pool);
    assert_ptr_equal(full.framework_regions, &g.r.region);
    assert_ptr_equal(full.g3.paths, g.paths);
    assert_memory_equal(&full.limits, &defaults.limits, sizeof full.limits);
    assert_int_equal(full.operation_timeout_ms, 1000);
    assert_int_equal(full.abandon_timeout_ms, 5000);
    assert_int_equal(full.copy_threads, 2);
    assert_false(full.enable_telemetry);
    assert_null(full.policy);
    assert_memory_equal(&full.callbacks, &defaults.callbacks, sizeof full.callbacks);

    /* What it made is a whole config of this header: an instance starts
     * from it (zeros in place of the defaults would be refused). */
    full.version = KVCR_CONFIG_VERSION;
    kvcr_t *kv;
    assert_int_equal(kvcr_create(&full, &kv), 0);
    assert_true(g3_file_exists(&g));
    kvcr_free(kv);

    /* A version that table does not list is refused, naming its range. */
    g.r.cfg.version = 3;
    memcpy(old, &g.r.cfg, old_size);
    assert_int_equal(kvcr__config_import_from(before_limits, 2, old, &full), KVCR_EINVAL);
    assert_string_equal(kvcr_last_error(), "kvcr_config has version 3; libkvcr "
                        KVCR_VERSION_STRING " reads versions 1 to 2 " CONFIG_FIX);
    free(old);
    g3_cleanup(&g);
}

/* A program built with a version-2 header: its config ends before the
 * peer table's limits, which the library reads as their defaults. */
static void test_a_version_2_config_gets_the_peer_limits_defaults(void **state)
{
    (void)state;
    g3_rig g;
    g3_init(&g);
    kvcr_config *old = older_config(&g.r.cfg, 2, offsetof(kvcr_config, max_peers));
    kvcr_config full;
    memset(&full, 0x5A, sizeof full);
    assert_int_equal(kvcr__config_import(old, &full), 0);
    assert_int_equal(full.version, KVCR_CONFIG_VERSION);
    assert_int_equal(full.max_peers, 1024);
    assert_int_equal(full.peer_idle_ms, 300000);
    assert_int_equal(full.limits.max_source_writes, 1024);
    free(old);
    /* Out of range in a version-3 config: refused, nothing started. */
    g.r.cfg.version = KVCR_CONFIG_VERSION;
    g.r.cfg.max_peers = 0;
    assert_refused(&g, "config.max_peers must be between 1 and 65536 (got 0)");
    g.r.cfg.max_peers = 1024;
    g.r.cfg.peer_idle_ms = 99;
    assert_refused(&g, "config.peer_idle_ms must be between 100 and 86400000 (got 99)");
    g.r.cfg.peer_idle_ms = 300000;
    rig_start(&g.r);
    assert_true(g3_file_exists(&g));
    g3_cleanup(&g);
}

static void test_policy_versions(void **state)
{
    (void)state;
    const char *builtin[] = {"fifo", "lru", "g3_fifo", "g3_lru"};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(kvcr_policy_builtin(builtin[i])->version, KVCR_POLICY_VERSION);

    g3_rig g;
    g3_init(&g);
    kvcr_policy_ops p = *kvcr_policy_builtin("g3_lru");
    g.r.cfg.policy = &p;
    p.version = 0;
    assert_refused(&g, "policy 'g3_lru' has version 0; " READS " " POLICY_FIX);
    p.version = KVCR_POLICY_VERSION + 1;
    p.name = NULL;
    char want[256];
    snprintf(want, sizeof want, "policy '?' has version %u; " READS " " POLICY_FIX,
             KVCR_POLICY_VERSION + 1);
    assert_refused(&g, want);

    p.version = KVCR_POLICY_VERSION;
    rig_start(&g.r);
    assert_true(g3_file_exists(&g));
    g3_cleanup(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_init_writes_this_headers_version),
        cmocka_unit_test(test_unknown_config_versions_are_refused_before_anything_starts),
        cmocka_unit_test(test_an_older_layout_reads_its_later_fields_as_defaults),
        cmocka_unit_test(test_a_version_2_config_gets_the_peer_limits_defaults),
        cmocka_unit_test(test_policy_versions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
