/* kvcr/stats.h — telemetry snapshots and their Prometheus text form.
 *
 * With telemetry on, KVCR records event metrics as they happen and keeps
 * state gauges. kvcr_stats_take() returns everything recorded since the last
 * take (one interval, as Python's get_stats) plus the current gauges.
 * Metric names and labels, as the Prometheus text writes them:
 *   kvcr_duration_seconds{scope,result}     histogram, seconds
 *   kvcr_transfer_bytes_total{operation}    counter
 *   kvcr_transfer_blocks_total{operation}   counter
 *   kvcr_limit_refusals_total{limit}        counter (requests refused at a kvcr_limits
 *                                           bound, by the limit's name)
 *   kvcr_control_dropped_total{cause}       counter (input dropped at the peer control
 *                                           endpoint: handshake, auth, malformed,
 *                                           unknown_type, bad_sender, unexpected,
 *                                           unusable)
 *   kvcr_state{resource}                    gauge
 * A counter in a snapshot is named by its family's base name (the
 * KVCR_*_METRIC constants, without `_total`), as Prometheus client libraries
 * name counters; the text adds the `_total` suffix to its samples. */
#ifndef KVCR_STATS_H
#define KVCR_STATS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVCR_DURATION_METRIC "kvcr_duration_seconds"
#define KVCR_TRANSFER_BYTES_METRIC "kvcr_transfer_bytes"
#define KVCR_TRANSFER_BLOCKS_METRIC "kvcr_transfer_blocks"
#define KVCR_STATE_METRIC "kvcr_state"
#define KVCR_LIMIT_REFUSALS_METRIC "kvcr_limit_refusals"
#define KVCR_CONTROL_DROPPED_METRIC "kvcr_control_dropped"

/* The parts of a peer pull's time, as the pulling (target) side sees it:
 * each a kvcr_duration_seconds scope, with the pull's result. A pull whose
 * source answered with its own durations (every KVCR source does) adds one
 * observation to each part, and its parts sum to its remote_fetch or
 * remote_deliver duration; the source measures its parts with its own clock
 * and sends durations, never timestamps, so the hosts' clocks need not
 * agree. In order:
 *   pull_queue     from the operation's submit to its start_write being sent
 *                  (held while the source is silent, sent again after a refusal)
 *   pull_control   the control round trip: start_write sent to the answer
 *                  (write_done) taken, less the time the source served it
 *   pull_pin_wait  the source waiting for framework pins (request_pin)
 *   pull_source    the source's other work on it: claims, hand-offs between its
 *                  threads, a first UCX endpoint to the target
 *   pull_data      the source writing the bytes (UCX puts until flushed, active
 *                  messages until sent, or an inline copy), and any of them
 *                  taken here after the answer
 *   pull_settle    from the pull's end on the progress thread to its result
 *                  handed to kvcr_poll */
#define KVCR_PULL_PARTS 6
#define KVCR_PULL_PART_SCOPES                                                                  \
    {"pull_queue", "pull_control", "pull_pin_wait", "pull_source", "pull_data", "pull_settle"}

/* Upper bounds (seconds) of the duration histogram's buckets; +Inf is
 * implicit. */
#define KVCR_HISTOGRAM_BUCKETS 14
extern const double kvcr_histogram_bounds[KVCR_HISTOGRAM_BUCKETS];

typedef struct kvcr_gauge {
    const char *resource;
    double value;
} kvcr_gauge;

typedef struct kvcr_counter {
    const char *name;      /* KVCR_TRANSFER_BYTES_METRIC, _BLOCKS_, KVCR_LIMIT_REFUSALS_METRIC
                            * or KVCR_CONTROL_DROPPED_METRIC */
    const char *operation; /* the scope: "local_fill", "local_deliver", ...; for
                            * KVCR_LIMIT_REFUSALS_METRIC the limit ("source_writes_per_peer",
                            * rendered as the label limit); for
                            * KVCR_CONTROL_DROPPED_METRIC the cause (label cause) */
    double value;
} kvcr_counter;

typedef struct kvcr_histogram {
    const char *scope;
    const char *result;
    uint64_t count;
    double sum;
    uint64_t buckets[KVCR_HISTOGRAM_BUCKETS]; /* cumulative, as Prometheus */
} kvcr_histogram;

/* One raw duration observation, kept so that a framework's own stats object
 * can be fed observation by observation (observe_histogram). At most
 * KVCR_STATS_MAX_OBSERVATIONS are kept per interval; the rest are counted in
 * observations_dropped (the histograms still include them). */
#define KVCR_STATS_MAX_OBSERVATIONS 65536
typedef struct kvcr_observation {
    const char *scope;
    const char *result;
    double seconds;
} kvcr_observation;

typedef struct kvcr_stats {
    size_t n_gauges;
    const kvcr_gauge *gauges;
    size_t n_counters;
    const kvcr_counter *counters;
    size_t n_histograms;
    const kvcr_histogram *histograms;
    size_t n_observations;
    const kvcr_observation *observations;
    uint64_t observations_dropped;
} kvcr_stats;

/* Renders a snapshot in the Prometheus text exposition format (0.0.4); the
 * text of a kvcr_stats_take() snapshot passes `promtool check metrics`
 * without a remark. On success *text is a NUL-terminated allocation of *len
 * bytes (plus the NUL) that the caller owns and releases with
 * kvcr_prometheus_free(); it does not refer to the snapshot, which may be
 * freed first. On failure *text and *len are left unchanged. */
int kvcr_stats_render_prometheus(const kvcr_stats *stats, char **text, size_t *len);

/* Releases a text returned by kvcr_stats_render_prometheus(). NULL is fine. */
void kvcr_prometheus_free(char *text);

/* Releases a snapshot returned by kvcr_stats_take(). NULL is fine. */
void kvcr_stats_free(kvcr_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
