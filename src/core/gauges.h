/* A growable list of gauges for kvcr_stats_take: the core and each lower
 * tier append theirs (gauge_sink_add, declared in core/tier.h). An
 * allocation failure is remembered and reported once, at the end. */
#ifndef KVCR_CORE_GAUGES_H
#define KVCR_CORE_GAUGES_H

#include <stdbool.h>
#include <stddef.h>

#include "core/tier.h"
#include "kvcr/stats.h"

struct gauge_sink {
    kvcr_gauge *g;
    char **names; /* owned: the gauges' resource strings */
    size_t n, cap;
    bool oom;
};

void gauge_sink_init(gauge_sink *s);
void gauge_sink_free(gauge_sink *s);

#endif
