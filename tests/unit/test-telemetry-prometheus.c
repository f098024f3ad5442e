/* Telemetry recording, snapshots and their Prometheus text (0.0.4), which
 * promtool accepts without a remark. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/telemetry.h"
#include "kvcr/error.h"
#include "promtool.h"

static kvcr_stats *take(kvcr_telemetry *t, const kvcr_gauge *g, size_t n)
{
    kvcr_stats *s = NULL;
    assert_int_equal(telemetry_take(t, g, n, &s), 0);
    assert_non_null(s);
    return s;
}

static char *render(const kvcr_stats *s)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    return text;
}

static double counter(const kvcr_stats *s, const char *name, const char *operation)
{
    for (size_t i = 0; i < s->n_counters; i++)
        if (strcmp(s->counters[i].name, name) == 0 &&
            strcmp(s->counters[i].operation, operation) == 0)
            return s->counters[i].value;
    return -1;
}

static void test_buckets_are_cumulative(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.00002); /* le 5e-05 */
    telemetry_observe(t, "local_fill", "success", 0.002);   /* le 0.0025 */
    telemetry_observe(t, "local_fill", "success", 7.0);     /* only +Inf */
    kvcr_stats *s = take(t, NULL, 0);
    assert_int_equal(s->n_histograms, 1);
    const kvcr_histogram *h = &s->histograms[0];
    assert_string_equal(h->scope, "local_fill");
    assert_string_equal(h->result, "success");
    static const uint64_t want[KVCR_HISTOGRAM_BUCKETS] = {0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++) assert_int_equal(h->buckets[b], want[b]);
    assert_int_equal(h->count, 3);
    assert_true(h->sum == 0.00002 + 0.002 + 7.0);
    char *text = render(s);
    assert_non_null(strstr(text, "kvcr_duration_seconds_bucket{scope=\"local_fill\","
                                 "result=\"success\",le=\"5\"} 2\n"));
    assert_non_null(strstr(text, "kvcr_duration_seconds_bucket{scope=\"local_fill\","
                                 "result=\"success\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(text, "kvcr_duration_seconds_count{scope=\"local_fill\","
                                 "result=\"success\"} 3\n"));
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    telemetry_free(t);
}

/* Bucket i counts observations <= bound i: a value on a bound is in it. */
static void test_a_value_on_a_bound_is_in_that_bucket(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++)
        telemetry_observe(t, "local_deliver", "success", kvcr_histogram_bounds[b]);
    kvcr_stats *s = take(t, NULL, 0);
    for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++)
        assert_int_equal(s->histograms[0].buckets[b], b + 1);
    kvcr_stats_free(s);
    telemetry_free(t);
}

/* One histogram per (scope, result), matched by content, not only pointer. */
static void test_histograms_are_per_scope_and_result(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    char scope[] = "local_fill";
    telemetry_observe(t, "local_fill", "success", 0.001);
    telemetry_observe(t, scope, "success", 0.001);
    telemetry_observe(t, "local_fill", "failed", 0.001);
    telemetry_observe(t, "local_deliver", "success", 0.001);
    kvcr_stats *s = take(t, NULL, 0);
    assert_int_equal(s->n_histograms, 3);
    assert_int_equal(s->histograms[0].count, 2);
    assert_string_equal(s->histograms[1].result, "failed");
    assert_string_equal(s->histograms[2].scope, "local_deliver");
    assert_int_equal(s->n_observations, 4);
    assert_string_equal(s->observations[2].scope, "local_fill");
    assert_string_equal(s->observations[2].result, "failed");
    assert_string_equal(s->observations[3].scope, "local_deliver");
    assert_true(s->observations[3].seconds == 0.001);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_counters_accumulate_per_operation(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_count(t, "local_fill", 1, 100);
    telemetry_count(t, "local_deliver", 1, 4096);
    telemetry_count(t, "local_fill", 2, 50);
    kvcr_stats *s = take(t, NULL, 0);
    assert_int_equal(s->n_counters, 4);
    assert_true(counter(s, KVCR_TRANSFER_BLOCKS_METRIC, "local_fill") == 3);
    assert_true(counter(s, KVCR_TRANSFER_BYTES_METRIC, "local_fill") == 150);
    assert_true(counter(s, KVCR_TRANSFER_BLOCKS_METRIC, "local_deliver") == 1);
    assert_true(counter(s, KVCR_TRANSFER_BYTES_METRIC, "local_deliver") == 4096);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_take_starts_a_new_interval(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.001);
    telemetry_count(t, "local_fill", 1, 4096);
    kvcr_stats *s = take(t, NULL, 0);
    assert_int_equal(s->n_histograms, 1);
    kvcr_stats_free(s);

    s = take(t, NULL, 0);
    assert_int_equal(s->n_gauges + s->n_counters + s->n_histograms + s->n_observations, 0);
    assert_int_equal(s->observations_dropped, 0);
    char *text = render(s);
    assert_string_equal(text, ""); /* every family is empty, so omitted */
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);

    /* The next interval counts from zero. */
    telemetry_observe(t, "local_fill", "success", 0.002);
    telemetry_count(t, "local_fill", 1, 10);
    s = take(t, NULL, 0);
    assert_int_equal(s->histograms[0].count, 1);
    assert_true(s->histograms[0].sum == 0.002);
    assert_true(counter(s, KVCR_TRANSFER_BYTES_METRIC, "local_fill") == 10);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_observations_are_capped_and_drops_counted(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    for (int i = 0; i < KVCR_STATS_MAX_OBSERVATIONS + 5; i++)
        telemetry_observe(t, "local_deliver", "success", 0.001);
    kvcr_stats *s = take(t, NULL, 0);
    assert_int_equal(s->n_observations, KVCR_STATS_MAX_OBSERVATIONS);
    assert_int_equal(s->observations_dropped, 5);
    assert_int_equal(s->histograms[0].count, KVCR_STATS_MAX_OBSERVATIONS + 5);
    const kvcr_observation *last = &s->observations[KVCR_STATS_MAX_OBSERVATIONS - 1];
    assert_string_equal(last->scope, "local_deliver");
    assert_true(last->seconds == 0.001);
    kvcr_stats_free(s);

    telemetry_observe(t, "local_deliver", "success", 0.001);
    s = take(t, NULL, 0);
    assert_int_equal(s->n_observations, 1);
    assert_int_equal(s->observations_dropped, 0);
    kvcr_stats_free(s);
    telemetry_free(t);
}

/* The snapshot owns copies of the gauges and of every string. */
static void test_snapshot_is_independent_of_its_inputs(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    static const char scope[] = "local_fill";
    telemetry_observe(t, scope, "success", 0.001);
    char resource[] = "local_g2_free_slots";
    kvcr_gauge g[] = {{resource, 10}};
    kvcr_stats *s = take(t, g, 1);
    resource[0] = 'X';
    g[0].value = 99;
    g[0].resource = "other";
    assert_int_equal(s->n_gauges, 1);
    assert_string_equal(s->gauges[0].resource, "local_g2_free_slots");
    assert_true(s->gauges[0].value == 10);
    assert_ptr_not_equal(s->histograms[0].scope, scope);
    assert_ptr_not_equal(s->observations[0].scope, scope);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_prometheus_text_is_exact(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.1); /* on the 0.1 bound */
    telemetry_observe(t, "local_fill", "success", 0.2);
    telemetry_count(t, "local_fill", 1, 4096);
    telemetry_count(t, "local_fill", 1, (uint64_t)1 << 40);
    kvcr_gauge g[] = {{"local_g2_free_slots", 10}, {"hit_ratio", 1.5}};
    kvcr_stats *s = take(t, g, 2);
    char *text = render(s);
#define B "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le="
    const char *want =
        "# HELP kvcr_state KVCR resource state.\n"
        "# TYPE kvcr_state gauge\n"
        "kvcr_state{resource=\"local_g2_free_slots\"} 10\n"
        "kvcr_state{resource=\"hit_ratio\"} 1.5\n"
        "# HELP kvcr_transfer_bytes_total Bytes moved by KVCR transfers.\n"
        "# TYPE kvcr_transfer_bytes_total counter\n"
        "kvcr_transfer_bytes_total{operation=\"local_fill\"} 1099511631872\n"
        "# HELP kvcr_transfer_blocks_total Blocks moved by KVCR transfers.\n"
        "# TYPE kvcr_transfer_blocks_total counter\n"
        "kvcr_transfer_blocks_total{operation=\"local_fill\"} 2\n"
        "# HELP kvcr_duration_seconds KVCR operation durations in seconds.\n"
        "# TYPE kvcr_duration_seconds histogram\n"
        B "\"1e-05\"} 0\n"
        B "\"5e-05\"} 0\n"
        B "\"0.0001\"} 0\n"
        B "\"0.0005\"} 0\n"
        B "\"0.001\"} 0\n"
        B "\"0.0025\"} 0\n"
        B "\"0.005\"} 0\n"
        B "\"0.01\"} 0\n"
        B "\"0.025\"} 0\n"
        B "\"0.05\"} 0\n"
        B "\"0.1\"} 1\n"
        B "\"0.5\"} 2\n"
        B "\"1\"} 2\n"
        B "\"5\"} 2\n"
        B "\"+Inf\"} 2\n"
        "kvcr_duration_seconds_sum{scope=\"local_fill\",result=\"success\"} 0.30000000000000004\n"
        "kvcr_duration_seconds_count{scope=\"local_fill\",result=\"success\"} 2\n";
#undef B
    assert_string_equal(text, want); /* strcmp, printing both on a mismatch */
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_families_without_samples_are_omitted(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    kvcr_gauge g[] = {{"in_flight_ops", 0}};
    kvcr_stats *s = take(t, g, 1);
    char *text = render(s);
    assert_string_equal(text, "# HELP kvcr_state KVCR resource state.\n"
                              "# TYPE kvcr_state gauge\n"
                              "kvcr_state{resource=\"in_flight_ops\"} 0\n");
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_label_values_are_escaped(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "sc\"ope", "re\\sult", 1);
    telemetry_count(t, "op\nline", 1, 1);
    kvcr_gauge g[] = {{"a\"b\\c\nd", 1}};
    kvcr_stats *s = take(t, g, 1);
    char *text = render(s);
    assert_non_null(strstr(text, "kvcr_state{resource=\"a\\\"b\\\\c\\nd\"} 1\n"));
    assert_non_null(strstr(text, "kvcr_transfer_bytes_total{operation=\"op\\nline\"} 1\n"));
    assert_non_null(strstr(text, "kvcr_duration_seconds_count{scope=\"sc\\\"ope\","
                                 "result=\"re\\\\sult\"} 1\n"));
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    telemetry_free(t);
}

/* Every family at once, several label values each: what promtool checks
 * (HELP and TYPE per family, `_total` on counters, units in names, one
 * header per family, histogram series whole) holds for all of them. */
static void test_promtool_accepts_every_family(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.001);
    telemetry_observe(t, "local_fill", "failed", 7.0);
    telemetry_observe(t, "remote_pull", "success", 0.00002);
    telemetry_count(t, "local_fill", 1, 4096);
    telemetry_count(t, "remote_pull", 3, 3 * 4096);
    telemetry_refusal(t, "hint_bytes");
    telemetry_refusal(t, "source_writes_per_peer");
    telemetry_control_drop(t, "malformed");
    telemetry_control_drop(t, "handshake");
    kvcr_gauge g[] = {{"local_g2_free_slots", 10}, {"in_flight_ops", 0}, {"g3_total_slots", 64}};
    kvcr_stats *s = take(t, g, 3);
    char *text = render(s);
    assert_non_null(strstr(text, "# TYPE kvcr_limit_refusals_total counter\n"
                                 "kvcr_limit_refusals_total{limit=\"hint_bytes\"} 1\n"));
    assert_non_null(strstr(text, "# TYPE kvcr_control_dropped_total counter\n"
                                 "kvcr_control_dropped_total{cause=\"malformed\"} 1\n"));
    assert_promtool_clean(text);
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void expect_einval(const kvcr_stats *s, char **text, size_t *len)
{
    assert_int_equal(kvcr_stats_render_prometheus(s, text, len), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "kvcr_stats_render_prometheus"));
}

static void test_invalid_arguments_are_rejected(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    kvcr_stats *s = take(t, NULL, 0);
    char *text = (char *)"untouched";
    size_t len = 7;
    expect_einval(NULL, &text, &len);
    expect_einval(s, NULL, &len);
    expect_einval(s, &text, NULL);
    assert_string_equal(text, "untouched"); /* a failing call changes nothing */
    assert_int_equal(len, 7);
    kvcr_stats_free(s);
    kvcr_stats_free(NULL);
    telemetry_free(t);

    /* A caller-built snapshot must hold what rendering relies on. */
    kvcr_stats bad = {.n_gauges = 1};
    expect_einval(&bad, &text, &len);
    kvcr_gauge nameless = {NULL, 1};
    bad = (kvcr_stats){.n_gauges = 1, .gauges = &nameless};
    expect_einval(&bad, &text, &len);
    kvcr_counter unknown = {"kvcr_other", "local_fill", 1};
    bad = (kvcr_stats){.n_counters = 1, .counters = &unknown};
    expect_einval(&bad, &text, &len);
    kvcr_histogram no_result = {.scope = "local_fill"};
    bad = (kvcr_stats){.n_histograms = 1, .histograms = &no_result};
    expect_einval(&bad, &text, &len);
    assert_string_equal(text, "untouched");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_are_cumulative),
        cmocka_unit_test(test_a_value_on_a_bound_is_in_that_bucket),
        cmocka_unit_test(test_histograms_are_per_scope_and_result),
        cmocka_unit_test(test_counters_accumulate_per_operation),
        cmocka_unit_test(test_take_starts_a_new_interval),
        cmocka_unit_test(test_observations_are_capped_and_drops_counted),
        cmocka_unit_test(test_snapshot_is_independent_of_its_inputs),
        cmocka_unit_test(test_prometheus_text_is_exact),
        cmocka_unit_test(test_families_without_samples_are_omitted),
        cmocka_unit_test(test_label_values_are_escaped),
        cmocka_unit_test(test_promtool_accepts_every_family),
        cmocka_unit_test(test_invalid_arguments_are_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
