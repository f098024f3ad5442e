#include "core/telemetry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/error.h"
#include "util/api.h"
#include "util/log.h"

KVCR_API const double kvcr_histogram_bounds[KVCR_HISTOGRAM_BUCKETS] = {
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.0025, 0.005,
    0.01,    0.025,   0.05,   0.1,    0.5,   1,     5};

typedef struct hist {
    const char *scope, *result;
    uint64_t count;
    double sum;
    uint64_t in_bucket[KVCR_HISTOGRAM_BUCKETS]; /* not cumulative while recording */
} hist;

typedef struct transfer {
    const char *operation;
    uint64_t blocks, bytes;
} transfer;

struct kvcr_telemetry {
    hist *hists;
    size_t n_hists, cap_hists;
    transfer *transfers;
    size_t n_transfers, cap_transfers;
    kvcr_observation *obs;
    size_t n_obs, cap_obs;
    uint64_t dropped;
};

kvcr_telemetry *telemetry_new(void)
{
    return calloc(1, sizeof(kvcr_telemetry));
}

void telemetry_free(kvcr_telemetry *t)
{
    if (t == NULL) return;
    free(t->hists);
    free(t->transfers);
    free(t->obs);
    free(t);
}

/* Grows *arr (of elements of size sz) to hold one more. */
static int grow(void **arr, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap) return 0;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, ncap * sz);
    if (p == NULL) return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

static hist *find_hist(kvcr_telemetry *t, const char *scope, const char *result)
{
    for (size_t i = 0; i < t->n_hists; i++)
        if (strcmp(t->hists[i].scope, scope) == 0 && strcmp(t->hists[i].result, result) == 0)
            return &t->hists[i];
    if (grow((void **)&t->hists, &t->cap_hists, t->n_hists, sizeof *t->hists) != 0) return NULL;
    hist *h = &t->hists[t->n_hists++];
    memset(h, 0, sizeof *h);
    h->scope = scope;
    h->result = result;
    return h;
}

void telemetry_observe(kvcr_telemetry *t, const char *scope, const char *result, double seconds)
{
    hist *h = find_hist(t, scope, result);
    if (h == NULL) return; /* out of memory: the sample is lost, nothing else */
    h->count++;
    h->sum += seconds;
    for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++)
        if (seconds <= kvcr_histogram_bounds[b]) {
            h->in_bucket[b]++;
            break;
        }
    if (t->n_obs >= KVCR_STATS_MAX_OBSERVATIONS ||
        grow((void **)&t->obs, &t->cap_obs, t->n_obs, sizeof *t->obs) != 0) {
        t->dropped++;
        return;
    }
    t->obs[t->n_obs++] = (kvcr_observation){scope, result, seconds};
}

void telemetry_count(kvcr_telemetry *t, const char *operation, uint64_t blocks, uint64_t bytes)
{
    for (size_t i = 0; i < t->n_transfers; i++)
        if (strcmp(t->transfers[i].operation, operation) == 0) {
            t->transfers[i].blocks += blocks;
            t->transfers[i].bytes += bytes;
            return;
        }
    if (grow((void **)&t->transfers, &t->cap_transfers, t->n_transfers, sizeof *t->transfers))
        return;
    t->transfers[t->n_transfers++] = (transfer){operation, blocks, bytes};
}

/* ---- snapshots: one allocation, strings copied into its tail ------------ */

typedef struct strpool {
    char *next;
} strpool;

static const char *keep(strpool *p, const char *s)
{
    size_t n = strlen(s) + 1;
    memcpy(p->next, s, n);
    const char *out = p->next;
    p->next += n;
    return out;
}

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

int telemetry_take(kvcr_telemetry *t, const kvcr_gauge *gauges, size_t n_gauges, kvcr_stats **out)
{
    size_t n_counters = 2 * t->n_transfers;
    size_t strings = 0;
    for (size_t i = 0; i < n_gauges; i++) strings += strlen(gauges[i].resource) + 1;
    for (size_t i = 0; i < t->n_transfers; i++)
        strings += 2 * (strlen(t->transfers[i].operation) + 1) + sizeof KVCR_TRANSFER_BYTES_METRIC +
                   sizeof KVCR_TRANSFER_BLOCKS_METRIC;
    for (size_t i = 0; i < t->n_hists; i++)
        strings += strlen(t->hists[i].scope) + strlen(t->hists[i].result) + 2;
    for (size_t i = 0; i < t->n_obs; i++)
        strings += strlen(t->obs[i].scope) + strlen(t->obs[i].result) + 2;

    size_t off_g = align8(sizeof(kvcr_stats));
    size_t off_c = align8(off_g + n_gauges * sizeof(kvcr_gauge));
    size_t off_h = align8(off_c + n_counters * sizeof(kvcr_counter));
    size_t off_o = align8(off_h + t->n_hists * sizeof(kvcr_histogram));
    size_t off_s = align8(off_o + t->n_obs * sizeof(kvcr_observation));
    uint8_t *mem = malloc(off_s + strings + 1);
    if (mem == NULL) return KVCR_ENOMEM;

    kvcr_stats *s = (kvcr_stats *)mem;
    kvcr_gauge *g = (kvcr_gauge *)(mem + off_g);
    kvcr_counter *c = (kvcr_counter *)(mem + off_c);
    kvcr_histogram *h = (kvcr_histogram *)(mem + off_h);
    kvcr_observation *o = (kvcr_observation *)(mem + off_o);
    strpool pool = {(char *)(mem + off_s)};

    for (size_t i = 0; i < n_gauges; i++) g[i] = (kvcr_gauge){keep(&pool, gauges[i].resource), gauges[i].value};
    for (size_t i = 0; i < t->n_transfers; i++) {
        const transfer *x = &t->transfers[i];
        c[2 * i] = (kvcr_counter){keep(&pool, KVCR_TRANSFER_BLOCKS_METRIC),
                                  keep(&pool, x->operation), (double)x->blocks};
        c[2 * i + 1] = (kvcr_counter){keep(&pool, KVCR_TRANSFER_BYTES_METRIC),
                                      keep(&pool, x->operation), (double)x->bytes};
    }
    for (size_t i = 0; i < t->n_hists; i++) {
        const hist *src = &t->hists[i];
        h[i].scope = keep(&pool, src->scope);
        h[i].result = keep(&pool, src->result);
        h[i].count = src->count;
        h[i].sum = src->sum;
        uint64_t run = 0;
        for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++) h[i].buckets[b] = run += src->in_bucket[b];
    }
    for (size_t i = 0; i < t->n_obs; i++)
        o[i] = (kvcr_observation){keep(&pool, t->obs[i].scope), keep(&pool, t->obs[i].result),
                                  t->obs[i].seconds};
    *s = (kvcr_stats){n_gauges, g, n_counters, c, t->n_hists, h, t->n_obs, o, t->dropped};

    t->n_hists = t->n_transfers = t->n_obs = 0;
    t->dropped = 0;
    *out = s;
    return 0;
}

KVCR_API void kvcr_stats_free(kvcr_stats *stats)
{
    free(stats);
}

/* ---- Prometheus text exposition format 0.0.4 --------------------------- */

static void put_escaped(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            fputs("\\\\", f);
        else if (*v == '"')
            fputs("\\\"", f);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

static void put_number(FILE *f, double v)
{
    if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (isnan(v))
        fputs("NaN", f);
    else if (v == floor(v) && fabs(v) < 1e15)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.17g", v);
}

static void put_label(FILE *f, const char *name, const char *value, bool first)
{
    fprintf(f, "%s%s=\"", first ? "" : ",", name);
    put_escaped(f, value);
    fputc('"', f);
}

static void render_gauges(FILE *f, const kvcr_stats *s)
{
    if (s->n_gauges == 0) return;
    fputs("# HELP " KVCR_STATE_METRIC " KVCR resource state.\n# TYPE " KVCR_STATE_METRIC
          " gauge\n", f);
    for (size_t i = 0; i < s->n_gauges; i++) {
        fputs(KVCR_STATE_METRIC "{", f);
        put_label(f, "resource", s->gauges[i].resource, true);
        fputs("} ", f);
        put_number(f, s->gauges[i].value);
        fputc('\n', f);
    }
}

static void render_counters(FILE *f, const kvcr_stats *s, const char *name, const char *help)
{
    bool header = false;
    for (size_t i = 0; i < s->n_counters; i++) {
        if (strcmp(s->counters[i].name, name) != 0) continue;
        if (!header) fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
        header = true;
        fprintf(f, "%s{", name);
        put_label(f, "operation", s->counters[i].operation, true);
        fputs("} ", f);
        put_number(f, s->counters[i].value);
        fputc('\n', f);
    }
}

static void render_sample(FILE *f, const char *suffix, const kvcr_histogram *h, const char *le,
                          double value)
{
    fprintf(f, KVCR_DURATION_METRIC "%s{", suffix);
    put_label(f, "scope", h->scope, true);
    put_label(f, "result", h->result, false);
    if (le) put_label(f, "le", le, false);
    fputs("} ", f);
    put_number(f, value);
    fputc('\n', f);
}

static void render_histograms(FILE *f, const kvcr_stats *s)
{
    if (s->n_histograms == 0) return;
    fputs("# HELP " KVCR_DURATION_METRIC " KVCR operation durations in seconds.\n# TYPE "
          KVCR_DURATION_METRIC " histogram\n", f);
    for (size_t i = 0; i < s->n_histograms; i++) {
        const kvcr_histogram *h = &s->histograms[i];
        for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++) {
            char le[32];
            snprintf(le, sizeof le, "%g", kvcr_histogram_bounds[b]);
            render_sample(f, "_bucket", h, le, (double)h->buckets[b]);
        }
        render_sample(f, "_bucket", h, "+Inf", (double)h->count);
        render_sample(f, "_sum", h, NULL, h->sum);
        render_sample(f, "_count", h, NULL, (double)h->count);
    }
}

KVCR_API int kvcr_stats_render_prometheus(const kvcr_stats *stats, char **text, size_t *len)
{
    if (stats == NULL || text == NULL || len == NULL)
        return kvcr_fail(KVCR_EINVAL, "kvcr_stats_render_prometheus: arguments must not be NULL");
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (f == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory rendering stats");
    render_gauges(f, stats);
    render_counters(f, stats, KVCR_TRANSFER_BYTES_METRIC, "Bytes moved by KVCR transfers.");
    render_counters(f, stats, KVCR_TRANSFER_BLOCKS_METRIC, "Blocks moved by KVCR transfers.");
    render_histograms(f, stats);
    if (fclose(f) != 0) {
        free(buf);
        return kvcr_fail(KVCR_ENOMEM, "out of memory rendering stats");
    }
    *text = buf;
    *len = size;
    return 0;
}
