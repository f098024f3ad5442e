/* Telemetry recording: event metrics for one interval.
 *
 * Not thread-safe: the instance calls it with its state lock held. Scope,
 * result and operation strings must be static (string literals): they are
 * stored by pointer while recording and copied into snapshots. */
#ifndef KVCR_CORE_TELEMETRY_H
#define KVCR_CORE_TELEMETRY_H

#include <stddef.h>
#include <stdint.h>

#include "kvcr/stats.h"

typedef struct kvcr_telemetry kvcr_telemetry;

kvcr_telemetry *telemetry_new(void);
void telemetry_free(kvcr_telemetry *t);

/* One duration observation for kvcr_duration_seconds{scope,result}. */
void telemetry_observe(kvcr_telemetry *t, const char *scope, const char *result, double seconds);

/* Adds to kvcr_transfer_blocks_total{operation} and kvcr_transfer_bytes_total{operation}. */
void telemetry_count(kvcr_telemetry *t, const char *operation, uint64_t blocks, uint64_t bytes);

/* Adds one to kvcr_limit_refusals_total{limit}: a request refused at a limit. */
void telemetry_refusal(kvcr_telemetry *t, const char *limit);

/* Adds one to kvcr_control_dropped_total{cause}: a message or connection
 * dropped at the peer control endpoint (causes: net/control.h). */
void telemetry_control_drop(kvcr_telemetry *t, const char *cause);

/* Builds a snapshot of the interval plus the given gauges (copied), as one
 * allocation released by kvcr_stats_free(), then starts a new interval.
 * Returns 0 or KVCR_ENOMEM (the interval is then kept). */
int telemetry_take(kvcr_telemetry *t, const kvcr_gauge *gauges, size_t n_gauges, kvcr_stats **out);

#endif
