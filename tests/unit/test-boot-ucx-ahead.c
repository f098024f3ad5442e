/* A UCX context made ahead (kvcr__ucx_ahead), as the Guard makes one while
 * its owner lives: kvcr__create's boot record hands it to the peer tier,
 * which starts on it, and a create that fails or has no peer tier frees it
 * (the ASan and valgrind runs of this test report a leak or a double free
 * otherwise). That a backup serves peers on such a context, bytes
 * compared, is test-service-guard-failover's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "api/boot.h"
#include "kvcr/kvcr.h"

static kvcr_logger g_log;
static _Alignas(4096) unsigned char g_dram[4 * 4096];

static int setup(void **state)
{
    (void)state;
    kvcr_logger_init(&g_log, "ahead-test", NULL, NULL);
    return 0;
}

static void peer_config(kvcr_config *cfg, const kvcr_pool_layout *layout)
{
    kvcr_config_init(cfg);
    cfg->agent_name = "ahead";
    cfg->pool_layouts = layout;
    cfg->n_pool_layouts = 1;
    cfg->remote.enabled = true;
    cfg->remote.control_host = "127.0.0.1";
}

static void test_null_arguments_are_refused(void **state)
{
    (void)state;
    struct ucx_ctx *c = NULL;
    assert_int_equal(kvcr__ucx_ahead(NULL, &c), KVCR_EINVAL);
    assert_null(c);
    assert_int_equal(kvcr__ucx_ahead(&g_log, NULL), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "must not be NULL"));
    kvcr__ucx_ahead_free(NULL); /* ignored */
}

static void test_the_peer_tier_starts_on_it(void **state)
{
    (void)state;
    kvcr_pool_layout layout = {"", 4096};
    kvcr_config cfg;
    peer_config(&cfg, &layout);
    kvcr_boot boot = {.control_listener = -1};
    assert_int_equal(kvcr__ucx_ahead(&g_log, &boot.ucx), 0);
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr__create(&cfg, &boot, &kv), 0);
    const char *endpoint = kvcr_control_endpoint(kv);
    assert_non_null(endpoint);
    assert_true(strncmp(endpoint, "tcp://127.0.0.1:", 16) == 0);
    kvcr_close(kv);
    kvcr_free(kv);
}

static void test_a_create_without_the_peer_tier_or_that_fails_frees_it(void **state)
{
    (void)state;
    kvcr_pool_layout layout = {"", 4096};
    kvcr_config cfg;
    peer_config(&cfg, &layout);
    cfg.remote.enabled = false;
    kvcr_dram_pool pool = {"", g_dram, sizeof g_dram};
    cfg.local_dram = &pool;
    cfg.n_local_dram = 1;
    kvcr_boot boot = {.control_listener = -1};
    assert_int_equal(kvcr__ucx_ahead(&g_log, &boot.ucx), 0);
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr__create(&cfg, &boot, &kv), 0);
    kvcr_close(kv);
    kvcr_free(kv);

    peer_config(&cfg, &layout);
    cfg.operation_timeout_ms = 0; /* refused before anything starts */
    assert_int_equal(kvcr__ucx_ahead(&g_log, &boot.ucx), 0);
    kv = (kvcr_t *)&kv;
    assert_int_equal(kvcr__create(&cfg, &boot, &kv), KVCR_EINVAL);
    assert_null(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_null_arguments_are_refused, setup),
        cmocka_unit_test_setup(test_the_peer_tier_starts_on_it, setup),
        cmocka_unit_test_setup(test_a_create_without_the_peer_tier_or_that_fails_frees_it, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
