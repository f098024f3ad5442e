/* The options table (kvcr/options.h) and libkvcr agree: each row's default
 * is what kvcr_config_init writes and passes the row's own rule, and a
 * value just outside each row's range is refused by kvcr_create with
 * KVCR_EINVAL and a message naming the option. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvcr/options.h"

enum { BS = 4096 };

typedef struct setup {
    kvcr_config cfg;
    kvcr_pool_layout layout;
    kvcr_dram_pool pool;
    uint8_t *mem;
} setup;

/* A valid configuration, with G3 named when g3 (refused rules stop
 * kvcr_create before any file is opened), so that every group's rules
 * run. Its path can never be created: were a rule lost, opening it fails
 * without writing anything. */
static void base(setup *s, bool g3)
{
    static const char *const paths[] = {"/dev/null/kvcr-options-table-g3"};
    memset(s, 0, sizeof *s);
    s->mem = aligned_alloc(4096, 2 * BS);
    kvcr_config_init(&s->cfg);
    s->layout = (kvcr_pool_layout){"", BS};
    s->pool = (kvcr_dram_pool){"", s->mem, 2 * BS};
    s->cfg.agent_name = "opts";
    s->cfg.pool_layouts = &s->layout;
    s->cfg.n_pool_layouts = 1;
    s->cfg.local_dram = &s->pool;
    s->cfg.n_local_dram = 1;
    if (g3) {
        s->cfg.g3.paths = paths;
        s->cfg.g3.n_paths = 1;
        s->cfg.g3.capacity_bytes_per_file = 2 * BS;
    }
}

static uint64_t type_max(kvcr_option_type t)
{
    return t == KVCR_OPT_BOOL ? 1 : t == KVCR_OPT_U16 ? UINT16_MAX
                                  : t == KVCR_OPT_U32 ? UINT32_MAX : UINT64_MAX;
}

static bool has_range(const kvcr_option *o)
{
    return o->type != KVCR_OPT_STR && o->type != KVCR_OPT_BOOL && strcmp(o->rule, "none") != 0;
}

static void test_each_default_is_kvcr_config_init_s_and_within_its_range(void **state)
{
    (void)state;
    size_t n;
    const kvcr_option *rows = kvcr__options(&n);
    assert_true(n > 30);
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    for (size_t i = 0; i < n; i++) {
        const kvcr_option *o = &rows[i];
        assert_ptr_equal(kvcr__option(o->path), o); /* paths are unique */
        assert_true(o->since >= 1 && o->since <= KVCR_CONFIG_VERSION);
        assert_true(o->offset < sizeof cfg && o->doc[0] != '\0');
        if (o->type == KVCR_OPT_STR) {
            const char *s;
            memcpy(&s, (const char *)&cfg + o->offset, sizeof s);
            if (s != o->def.s && (s == NULL || o->def.s == NULL || strcmp(s, o->def.s) != 0))
                fail_msg("%s: kvcr_config_init gives '%s', the table '%s'", o->path, s,
                         o->def.s);
        } else if (o->type == KVCR_OPT_F64) {
            double d;
            memcpy(&d, (const char *)&cfg + o->offset, sizeof d);
            assert_true(d == o->def.d && d >= o->min.d && d <= o->max.d);
        } else {
            kvcr_config with_default;
            memcpy(&with_default, &cfg, sizeof cfg);
            assert_int_equal(kvcr__option_set(&with_default, o, o->def.u), 0);
            if (memcmp(&with_default, &cfg, sizeof cfg) != 0)
                fail_msg("%s: kvcr_config_init does not give the table's %llu", o->path,
                         (unsigned long long)o->def.u);
            assert_true(o->min.u <= o->def.u && o->def.u <= o->max.u);
            assert_true(o->max.u <= type_max(o->type));
        }
    }
    assert_null(kvcr__option("no.such.option"));
    assert_null(kvcr__option(NULL));
}

/* kvcr_create with row o set to v: KVCR_EINVAL naming the option. */
static void expect_refused(const kvcr_option *o, uint64_t v)
{
    setup s;
    base(&s, strncmp(o->path, "g3.", 3) == 0);
    assert_int_equal(kvcr__option_set(&s.cfg, o, v), 0);
    kvcr_t *kv = NULL;
    int rc = kvcr_create(&s.cfg, &kv);
    const char *name = strcmp(o->rule, "abandon") == 0 ? "abandon_timeout_ms" : o->label;
    if (rc != KVCR_EINVAL || strstr(kvcr_last_error(), name) == NULL)
        fail_msg("%s = %llu: got %d '%s', want KVCR_EINVAL naming '%s'", o->path,
                 (unsigned long long)v, rc, kvcr_last_error(), name);
    assert_null(kv);
    free(s.mem);
}

static void test_each_value_outside_a_range_is_refused_naming_the_option(void **state)
{
    (void)state;
    size_t n, checked = 0;
    const kvcr_option *rows = kvcr__options(&n);
    kvcr_config init;
    kvcr_config_init(&init);
    for (size_t i = 0; i < n; i++) {
        const kvcr_option *o = &rows[i];
        if (!has_range(o) || o->type == KVCR_OPT_F64) continue;
        if (strcmp(o->rule, "abandon") == 0) {
            expect_refused(o, 2 * (uint64_t)init.operation_timeout_ms - 1);
        } else if (strcmp(o->rule, "per_peer") == 0) {
            expect_refused(o, init.limits.max_source_writes + 1ull);
        }
        if (o->min.u > 0) expect_refused(o, o->min.u - 1);
        if (o->max.u < type_max(o->type)) expect_refused(o, o->max.u + 1);
        checked++;
    }
    assert_true(checked >= 15);
    /* The F64 row: below, above, NaN. */
    const kvcr_option *w = kvcr__option("capacity_low_watermark_percent");
    assert_non_null(w);
    double bad[] = {w->min.d - 0.5, w->max.d + 0.5};
    for (size_t i = 0; i < 2; i++) {
        setup s;
        base(&s, false);
        s.cfg.capacity_low_watermark_percent = bad[i];
        kvcr_t *kv = NULL;
        assert_int_equal(kvcr_create(&s.cfg, &kv), KVCR_EINVAL);
        assert_non_null(strstr(kvcr_last_error(), w->label));
        free(s.mem);
    }
}

static void test_option_set_refuses_what_the_field_cannot_hold(void **state)
{
    (void)state;
    kvcr_config cfg, before;
    kvcr_config_init(&cfg);
    memcpy(&before, &cfg, sizeof cfg);
    const kvcr_option *port = kvcr__option("remote.control_port");
    const kvcr_option copy = *port; /* not a row of the table */
    assert_int_equal(kvcr__option_set(&cfg, port, UINT16_MAX + 1u), KVCR_EINVAL);
    assert_int_equal(kvcr__option_set(&cfg, kvcr__option("kv_events.topic"), 0), KVCR_EINVAL);
    assert_int_equal(kvcr__option_set(&cfg, kvcr__option("capacity_low_watermark_percent"), 1),
                     KVCR_EINVAL);
    assert_int_equal(kvcr__option_set(&cfg, &copy, 1), KVCR_EINVAL);
    assert_int_equal(kvcr__option_set(NULL, port, 1), KVCR_EINVAL);
    assert_int_equal(kvcr__option_set(&cfg, NULL, 1), KVCR_EINVAL);
    assert_memory_equal(&cfg, &before, sizeof cfg); /* a failing call changes nothing */
    assert_int_equal(kvcr__option_set(&cfg, port, UINT16_MAX), 0);
    assert_int_equal(cfg.remote.control_port, UINT16_MAX);
}

static void test_every_default_is_accepted(void **state)
{
    (void)state;
    setup s;
    base(&s, false);
    kvcr_t *kv = NULL;
    assert_int_equal(kvcr_create(&s.cfg, &kv), 0);
    kvcr_free(kv);
    free(s.mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_default_is_kvcr_config_init_s_and_within_its_range),
        cmocka_unit_test(test_each_value_outside_a_range_is_refused_naming_the_option),
        cmocka_unit_test(test_option_set_refuses_what_the_field_cannot_hold),
        cmocka_unit_test(test_every_default_is_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
