/* Telemetry recording and its Prometheus text form. */
#include <stdlib.h>
#include <string.h>

#include "core/telemetry.h"
#include "harness.h"

static void test_buckets_are_cumulative_and_take_resets_the_interval(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.00002);
    telemetry_observe(t, "local_fill", "success", 0.002);
    telemetry_observe(t, "local_fill", "success", 7.0);
    telemetry_count(t, "local_fill", 1, 100);
    telemetry_count(t, "local_fill", 2, 50);
    kvcr_gauge g[] = {{"block_records", 3}};
    kvcr_stats *s;
    assert_int_equal(telemetry_take(t, g, 1, &s), 0);
    g[0].value = 99; /* the snapshot holds its own copy */
    assert_true(s->gauges[0].value == 3);
    assert_int_equal(s->n_histograms, 1);
    const kvcr_histogram *h = &s->histograms[0];
    assert_int_equal(h->count, 3);
    assert_true(h->sum > 7.002 && h->sum < 7.0021);
    /* bounds: 1e-5, 5e-5 (first sample), ..., 2.5e-3 (second), ... 5 */
    assert_int_equal(h->buckets[0], 0);
    assert_int_equal(h->buckets[1], 1);
    assert_int_equal(h->buckets[4], 1);
    assert_int_equal(h->buckets[5], 2);
    assert_int_equal(h->buckets[KVCR_HISTOGRAM_BUCKETS - 1], 2); /* 7 s is only in +Inf */
    assert_int_equal(s->n_counters, 2);
    for (size_t i = 0; i < 2; i++) {
        if (strcmp(s->counters[i].name, KVCR_TRANSFER_BLOCKS_METRIC) == 0)
            assert_true(s->counters[i].value == 3);
        else
            assert_true(s->counters[i].value == 150);
    }
    assert_int_equal(s->n_observations, 3);
    kvcr_stats_free(s);
    assert_int_equal(telemetry_take(t, NULL, 0, &s), 0);
    assert_int_equal(s->n_histograms + s->n_counters + s->n_observations + s->n_gauges, 0);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_observations_are_capped_and_drops_counted(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    for (int i = 0; i < KVCR_STATS_MAX_OBSERVATIONS + 5; i++)
        telemetry_observe(t, "local_deliver", "success", 0.001);
    kvcr_stats *s;
    assert_int_equal(telemetry_take(t, NULL, 0, &s), 0);
    assert_int_equal(s->n_observations, KVCR_STATS_MAX_OBSERVATIONS);
    assert_int_equal(s->observations_dropped, 5);
    assert_int_equal(s->histograms[0].count, KVCR_STATS_MAX_OBSERVATIONS + 5);
    kvcr_stats_free(s);
    telemetry_free(t);
}

static void test_prometheus_text_is_exact_and_escaped(void **state)
{
    (void)state;
    kvcr_telemetry *t = telemetry_new();
    telemetry_observe(t, "local_fill", "success", 0.5);
    telemetry_count(t, "local_fill", 2, 4096);
    kvcr_gauge g[] = {{"a\"b\\c\nd", 1.5}};
    kvcr_stats *s;
    assert_int_equal(telemetry_take(t, g, 1, &s), 0);
    char *text;
    size_t len;
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    const char *want =
        "# HELP kvcr_state KVCR resource state.\n"
        "# TYPE kvcr_state gauge\n"
        "kvcr_state{resource=\"a\\\"b\\\\c\\nd\"} 1.5\n"
        "# HELP kvcr_transfer_bytes Bytes moved by KVCR transfers.\n"
        "# TYPE kvcr_transfer_bytes counter\n"
        "kvcr_transfer_bytes{operation=\"local_fill\"} 4096\n"
        "# HELP kvcr_transfer_blocks Blocks moved by KVCR transfers.\n"
        "# TYPE kvcr_transfer_blocks counter\n"
        "kvcr_transfer_blocks{operation=\"local_fill\"} 2\n"
        "# HELP kvcr_duration_seconds KVCR operation durations in seconds.\n"
        "# TYPE kvcr_duration_seconds histogram\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"1e-05\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"5e-05\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.0001\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.0005\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.001\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.0025\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.005\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.01\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.025\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.05\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.1\"} 0\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"0.5\"} 1\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"1\"} 1\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"5\"} 1\n"
        "kvcr_duration_seconds_bucket{scope=\"local_fill\",result=\"success\",le=\"+Inf\"} 1\n"
        "kvcr_duration_seconds_sum{scope=\"local_fill\",result=\"success\"} 0.5\n"
        "kvcr_duration_seconds_count{scope=\"local_fill\",result=\"success\"} 1\n";
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);
    assert_int_equal(kvcr_stats_render_prometheus(NULL, &text, &len), KVCR_EINVAL);
    assert_int_equal(kvcr_stats_render_prometheus(s, NULL, &len), KVCR_EINVAL);
    kvcr_stats_free(s);
    kvcr_stats_free(NULL);
    telemetry_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_are_cumulative_and_take_resets_the_interval),
        cmocka_unit_test(test_observations_are_capped_and_drops_counted),
        cmocka_unit_test(test_prometheus_text_is_exact_and_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
