/* Growable gauge lists (core/gauges.h). */
#include "core/gauges.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gauge_sink_init(gauge_sink *s)
{
    *s = (gauge_sink){0};
}

static bool grow(gauge_sink *s)
{
    size_t cap = s->cap ? 2 * s->cap : 64;
    kvcr_gauge *g = realloc(s->g, cap * sizeof *g);
    if (g == NULL) return false;
    s->g = g;
    char **names = realloc(s->names, cap * sizeof *names);
    if (names == NULL) return false;
    s->names = names;
    s->cap = cap;
    return true;
}

void gauge_sink_add(gauge_sink *s, const char *pool, const char *name, double value)
{
    if (s->oom || (s->n == s->cap && !grow(s))) {
        s->oom = true;
        return;
    }
    size_t len = strlen(pool) + strlen(name) + 1;
    char *full = malloc(len);
    if (full == NULL) {
        s->oom = true;
        return;
    }
    snprintf(full, len, "%s%s", pool, name);
    s->names[s->n] = full;
    s->g[s->n] = (kvcr_gauge){.resource = full, .value = value};
    s->n++;
}

void gauge_sink_free(gauge_sink *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    free(s->g);
    *s = (gauge_sink){0};
}
