/* An instance's stats: state gauges with their documented resource names,
 * transfer counters and durations per interval, and their Prometheus text. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { BS = 2048 };

static double gauge(const kvcr_stats *s, const char *resource)
{
    for (size_t i = 0; i < s->n_gauges; i++)
        if (strcmp(s->gauges[i].resource, resource) == 0) return s->gauges[i].value;
    fail_msg("no gauge %s", resource);
    return -1;
}

static double counter(const kvcr_stats *s, const char *name, const char *operation)
{
    for (size_t i = 0; i < s->n_counters; i++)
        if (strcmp(s->counters[i].name, name) == 0 && strcmp(s->counters[i].operation, operation) == 0)
            return s->counters[i].value;
    return 0;
}

static const kvcr_histogram *histogram(const kvcr_stats *s, const char *scope, const char *result)
{
    for (size_t i = 0; i < s->n_histograms; i++)
        if (strcmp(s->histograms[i].scope, scope) == 0 && strcmp(s->histograms[i].result, result) == 0)
            return &s->histograms[i];
    return NULL;
}

static void test_stats_report_state_transfers_and_durations_per_interval(void **state)
{
    (void)state;
    rig r;
    rig_init(&r, BS, 4, 4);
    r.cfg.enable_telemetry = true;
    /* Deadlines are not what this counts: a copy that waits past the
     * default second under valgrind on a loaded host must not fail. */
    r.cfg.operation_timeout_ms = 30000;
    r.cfg.abandon_timeout_ms = 60000;
    rig_start(&r);
    kvcr_stats *s;
    assert_int_equal(kvcr_stats_take(r.kv, &s), 0);
    assert_non_null(s);
    assert_int_equal(s->n_counters, 0); /* right after start: only gauges */
    assert_int_equal(s->n_histograms, 0);
    assert_true(gauge(s, "local_g2_total_slots") == 4);
    kvcr_stats_free(s);

    const char *keys[] = {"a", "b"};
    size_t src[] = {0, 1}, dst[] = {2};
    rig_wait(&r, rig_deposit(&r, keys, src, 2, 0), NULL, NULL, NULL);
    kvcr__test_fail_copies(r.kv, 1);
    kvcr_entry_status st;
    rig_wait(&r, rig_deliver(&r, keys, dst, 1), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_FAILED);
    rig_wait(&r, rig_deliver(&r, keys, dst, 1), &st, NULL, NULL);
    assert_int_equal(st, KVCR_ENTRY_SUCCESS);

    assert_int_equal(kvcr_stats_take(r.kv, &s), 0);
    assert_true(gauge(s, "block_records") == 2);
    assert_true(gauge(s, "in_flight_ops") == 0);
    assert_true(gauge(s, "local_g2_free_slots") == 2);
    assert_true(gauge(s, "local_g2_allocated_slots") == 2);
    assert_true(gauge(s, "local_g2_evictable_slots") == 2);
    assert_true(gauge(s, "local_g2_allocated_bytes") == 2 * BS);
    assert_true(gauge(s, "local_g2_pool_default_free_slots") == 2);
    assert_true(counter(s, KVCR_TRANSFER_BLOCKS_METRIC, "local_fill") == 2);
    assert_true(counter(s, KVCR_TRANSFER_BYTES_METRIC, "local_fill") == 2 * BS);
    assert_true(counter(s, KVCR_TRANSFER_BLOCKS_METRIC, "local_deliver") == 1);
    const kvcr_histogram *h = histogram(s, "local_fill", "success");
    assert_non_null(h);
    assert_int_equal(h->count, 2);
    h = histogram(s, "local_deliver", "failed");
    assert_non_null(h);
    assert_int_equal(h->count, 1);
    assert_int_equal(s->n_observations, 4);
    char *text;
    size_t len;
    assert_int_equal(kvcr_stats_render_prometheus(s, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    assert_non_null(strstr(text, "kvcr_state{resource=\"local_g2_free_slots\"} 2\n"));
    assert_non_null(strstr(text, "kvcr_transfer_bytes_total{operation=\"local_fill\"} 4096\n"));
    assert_non_null(strstr(text, "kvcr_duration_seconds_count{scope=\"local_fill\",result=\"success\"} 2\n"));
    kvcr_prometheus_free(text);
    kvcr_stats_free(s);

    /* A new interval: the events are gone, the gauges remain. */
    assert_int_equal(kvcr_stats_take(r.kv, &s), 0);
    assert_int_equal(s->n_counters, 0);
    assert_int_equal(s->n_observations, 0);
    assert_true(gauge(s, "block_records") == 2);
    kvcr_stats_free(s);
    rig_stop(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_report_state_transfers_and_durations_per_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
