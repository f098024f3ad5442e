/* Telemetry for one interval, its snapshots and their Prometheus text.
 *
 * While recording, histograms keep per-bucket (not cumulative) counts and
 * every string by pointer: callers pass literals, so the pointer compare
 * usually settles a lookup before strcmp. A take turns the interval into one
 * self-contained allocation (struct, arrays, string copies) so that the
 * caller can keep it past the instance and release it with a single free(). */
#include "core/telemetry.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/error.h"
#include "util/api.h"
#include "util/log.h"

KVCR_API const double kvcr_histogram_bounds[KVCR_HISTOGRAM_BUCKETS] = {
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.0025, 0.005,
    0.01,    0.025,   0.05,   0.1,    0.5,   1,      5};

typedef struct hist {
    const char *scope, *result;
    uint64_t count;
    double sum;
    uint64_t in_bucket[KVCR_HISTOGRAM_BUCKETS]; /* above the last bound: count only */
} hist;

typedef struct transfer {
    const char *operation;
    uint64_t blocks, bytes;
} transfer;

/* A counter of one family with one label: kvcr_limit_refusals{limit},
 * kvcr_control_dropped{cause}. */
typedef struct tally {
    const char *metric, *label;
    uint64_t count;
} tally;

/* A raw observation names its histogram by index, so a snapshot can point
 * the observation's strings at that histogram's copies. */
typedef struct raw_obs {
    size_t hist;
    double seconds;
} raw_obs;

struct kvcr_telemetry {
    hist *hists;
    size_t n_hists, cap_hists;
    transfer *transfers;
    size_t n_transfers, cap_transfers;
    tally *tallies;
    size_t n_tallies, cap_tallies;
    raw_obs *obs;
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
    free(t->tallies);
    free(t->obs);
    free(t);
}

/* Returns arr with room for element n (of size sz), or NULL with arr intact. */
static void *grow(void *arr, size_t *cap, size_t n, size_t sz)
{
    if (n < *cap) return arr;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(arr, ncap * sz);
    if (p != NULL) *cap = ncap;
    return p;
}

static bool same(const char *a, const char *b)
{
    return a == b || strcmp(a, b) == 0;
}

/* The histogram of (scope, result), created empty on first use; NULL when out
 * of memory. */
static hist *find_hist(kvcr_telemetry *t, const char *scope, const char *result)
{
    for (size_t i = 0; i < t->n_hists; i++)
        if (same(t->hists[i].scope, scope) && same(t->hists[i].result, result))
            return &t->hists[i];
    hist *p = grow(t->hists, &t->cap_hists, t->n_hists, sizeof *p);
    if (p == NULL) return NULL;
    t->hists = p;
    hist *h = &p[t->n_hists++];
    *h = (hist){.scope = scope, .result = result};
    return h;
}

/* Keeps the raw sample unless the interval is full (or memory is short):
 * then only the histogram has it, and the drop is counted. */
static void keep_observation(kvcr_telemetry *t, size_t hist_index, double seconds)
{
    raw_obs *p = NULL;
    if (t->n_obs < KVCR_STATS_MAX_OBSERVATIONS)
        p = grow(t->obs, &t->cap_obs, t->n_obs, sizeof *p);
    if (p == NULL) {
        t->dropped++;
        return;
    }
    t->obs = p;
    p[t->n_obs++] = (raw_obs){hist_index, seconds};
}

void telemetry_observe(kvcr_telemetry *t, const char *scope, const char *result, double seconds)
{
    hist *h = find_hist(t, scope, result);
    if (h == NULL) return; /* out of memory: this sample is lost, nothing else */
    h->count++;
    h->sum += seconds;
    for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++)
        if (seconds <= kvcr_histogram_bounds[b]) {
            h->in_bucket[b]++;
            break;
        }
    keep_observation(t, (size_t)(h - t->hists), seconds);
}

void telemetry_count(kvcr_telemetry *t, const char *operation, uint64_t blocks, uint64_t bytes)
{
    for (size_t i = 0; i < t->n_transfers; i++)
        if (same(t->transfers[i].operation, operation)) {
            t->transfers[i].blocks += blocks;
            t->transfers[i].bytes += bytes;
            return;
        }
    transfer *p = grow(t->transfers, &t->cap_transfers, t->n_transfers, sizeof *p);
    if (p == NULL) return; /* out of memory: this count is lost, nothing else */
    t->transfers = p;
    p[t->n_transfers++] = (transfer){operation, blocks, bytes};
}

static void add_tally(kvcr_telemetry *t, const char *metric, const char *label, uint64_t n)
{
    for (size_t i = 0; i < t->n_tallies; i++)
        if (same(t->tallies[i].metric, metric) && same(t->tallies[i].label, label)) {
            t->tallies[i].count += n;
            return;
        }
    tally *p = grow(t->tallies, &t->cap_tallies, t->n_tallies, sizeof *p);
    if (p == NULL) return; /* out of memory: this count is lost, nothing else */
    t->tallies = p;
    p[t->n_tallies++] = (tally){metric, label, n};
}

void telemetry_refusal(kvcr_telemetry *t, const char *limit)
{
    add_tally(t, KVCR_LIMIT_REFUSALS_METRIC, limit, 1);
}

void telemetry_control_drop(kvcr_telemetry *t, const char *cause)
{
    add_tally(t, KVCR_CONTROL_DROPPED_METRIC, cause, 1);
}

/* ---- snapshots ----------------------------------------------------------- */

/* Bytes of string copies a snapshot needs: each distinct string once. */
static size_t strings_size(const kvcr_telemetry *t, const kvcr_gauge *gauges, size_t n_gauges)
{
    size_t n = sizeof KVCR_TRANSFER_BLOCKS_METRIC + sizeof KVCR_TRANSFER_BYTES_METRIC;
    for (size_t i = 0; i < n_gauges; i++) n += strlen(gauges[i].resource) + 1;
    for (size_t i = 0; i < t->n_transfers; i++) n += strlen(t->transfers[i].operation) + 1;
    for (size_t i = 0; i < t->n_tallies; i++)
        n += strlen(t->tallies[i].metric) + strlen(t->tallies[i].label) + 2;
    for (size_t i = 0; i < t->n_hists; i++)
        n += strlen(t->hists[i].scope) + strlen(t->hists[i].result) + 2;
    return n;
}

/* Copies s to the cursor *next and advances it. */
static const char *keep_string(char **next, const char *s)
{
    size_t n = strlen(s) + 1;
    char *out = memcpy(*next, s, n);
    *next += n;
    return out;
}

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static void copy_counters(const kvcr_telemetry *t, kvcr_counter *c, char **next)
{
    const char *blocks = keep_string(next, KVCR_TRANSFER_BLOCKS_METRIC);
    const char *bytes = keep_string(next, KVCR_TRANSFER_BYTES_METRIC);
    for (size_t i = 0; i < t->n_transfers; i++) {
        const transfer *x = &t->transfers[i];
        const char *op = keep_string(next, x->operation);
        c[2 * i] = (kvcr_counter){blocks, op, (double)x->blocks};
        c[2 * i + 1] = (kvcr_counter){bytes, op, (double)x->bytes};
    }
    c += 2 * t->n_transfers;
    for (size_t i = 0; i < t->n_tallies; i++) {
        const char *metric = keep_string(next, t->tallies[i].metric);
        c[i] = (kvcr_counter){metric, keep_string(next, t->tallies[i].label),
                              (double)t->tallies[i].count};
    }
}

static void copy_histograms(const kvcr_telemetry *t, kvcr_histogram *h, char **next)
{
    for (size_t i = 0; i < t->n_hists; i++) {
        const hist *src = &t->hists[i];
        h[i].scope = keep_string(next, src->scope);
        h[i].result = keep_string(next, src->result);
        h[i].count = src->count;
        h[i].sum = src->sum;
        uint64_t run = 0;
        for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++) h[i].buckets[b] = run += src->in_bucket[b];
    }
}

int telemetry_take(kvcr_telemetry *t, const kvcr_gauge *gauges, size_t n_gauges, kvcr_stats **out)
{
    size_t n_counters = 2 * t->n_transfers + t->n_tallies;
    size_t off_g = align_up(sizeof(kvcr_stats), _Alignof(kvcr_gauge));
    size_t off_c = align_up(off_g + n_gauges * sizeof(kvcr_gauge), _Alignof(kvcr_counter));
    size_t off_h = align_up(off_c + n_counters * sizeof(kvcr_counter), _Alignof(kvcr_histogram));
    size_t off_o =
        align_up(off_h + t->n_hists * sizeof(kvcr_histogram), _Alignof(kvcr_observation));
    size_t off_s = off_o + t->n_obs * sizeof(kvcr_observation);
    char *mem = malloc(off_s + strings_size(t, gauges, n_gauges));
    if (mem == NULL) return KVCR_ENOMEM;

    kvcr_gauge *g = (kvcr_gauge *)(mem + off_g);
    kvcr_counter *c = (kvcr_counter *)(mem + off_c);
    kvcr_histogram *h = (kvcr_histogram *)(mem + off_h);
    kvcr_observation *o = (kvcr_observation *)(mem + off_o);
    char *next = mem + off_s;
    for (size_t i = 0; i < n_gauges; i++)
        g[i] = (kvcr_gauge){keep_string(&next, gauges[i].resource), gauges[i].value};
    copy_counters(t, c, &next);
    copy_histograms(t, h, &next);
    for (size_t i = 0; i < t->n_obs; i++) {
        const kvcr_histogram *of = &h[t->obs[i].hist];
        o[i] = (kvcr_observation){of->scope, of->result, t->obs[i].seconds};
    }
    kvcr_stats *s = (kvcr_stats *)mem;
    *s = (kvcr_stats){n_gauges, g, n_counters, c, t->n_hists, h, t->n_obs, o, t->dropped};

    /* A new interval; the arrays keep their capacity for it. */
    t->n_hists = t->n_transfers = t->n_tallies = t->n_obs = 0;
    t->dropped = 0;
    *out = s;
    return 0;
}

KVCR_API void kvcr_stats_free(kvcr_stats *stats)
{
    free(stats);
}

/* ---- Prometheus text exposition format 0.0.4 ----------------------------- */

/* Every double from 2^53 up is an integer; below that the cast is exact. The
 * range stops at 2^64 so that any uint64_t counter still prints in full. */
static bool is_integral(double v)
{
    if (!(v >= -0x1p64 && v <= 0x1p64)) return false;
    return v >= 0x1p53 || v <= -0x1p53 || v == (double)(int64_t)v;
}

/* Integral values print as integers; the others in the shortest %g form that
 * reads back as the same double (%.17g always does), so that bucket bounds
 * read le="1e-05" as client libraries write them rather than
 * le="1.0000000000000001e-05". */
static void format_number(char *buf, size_t size, double v)
{
    if (isnan(v)) {
        snprintf(buf, size, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, size, "%s", v > 0 ? "+Inf" : "-Inf");
    } else if (is_integral(v)) {
        snprintf(buf, size, "%.0f", v);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, size, "%.*g", prec, v);
            if (strtod(buf, NULL) == v) break;
        }
    }
}

/* A label value escapes backslash, double quote and newline. */
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

static void put_label(FILE *f, const char *name, const char *value, bool first)
{
    fprintf(f, "%s%s=\"", first ? "" : ",", name);
    put_escaped(f, value);
    fputc('"', f);
}

/* Ends a sample line: "} <value>\n". */
static void put_value(FILE *f, double v)
{
    char num[40];
    format_number(num, sizeof num, v);
    fprintf(f, "} %s\n", num);
}

static void put_header(FILE *f, const char *name, const char *help, const char *type)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_gauges(FILE *f, const kvcr_stats *s)
{
    if (s->n_gauges == 0) return;
    put_header(f, KVCR_STATE_METRIC, "KVCR resource state.", "gauge");
    for (size_t i = 0; i < s->n_gauges; i++) {
        fputs(KVCR_STATE_METRIC "{", f);
        put_label(f, "resource", s->gauges[i].resource, true);
        put_value(f, s->gauges[i].value);
    }
}

/* One counter family: the counters named name, under one header; the
 * counter's operation is the value of the label `label`. A counter's name is
 * its family's base name: its samples carry the `_total` suffix that
 * Prometheus requires of counters (its client libraries add it the same way). */
static void render_counters(FILE *f, const kvcr_stats *s, const char *name, const char *label,
                            const char *help)
{
    char family[64];
    snprintf(family, sizeof family, "%s_total", name);
    bool header = false;
    for (size_t i = 0; i < s->n_counters; i++) {
        if (strcmp(s->counters[i].name, name) != 0) continue;
        if (!header) put_header(f, family, help, "counter");
        header = true;
        fprintf(f, "%s{", family);
        put_label(f, label, s->counters[i].operation, true);
        put_value(f, s->counters[i].value);
    }
}

/* One histogram sample; le NULL for _sum and _count. */
static void render_sample(FILE *f, const char *suffix, const kvcr_histogram *h, const char *le,
                          double value)
{
    fprintf(f, KVCR_DURATION_METRIC "%s{", suffix);
    put_label(f, "scope", h->scope, true);
    put_label(f, "result", h->result, false);
    if (le != NULL) put_label(f, "le", le, false);
    put_value(f, value);
}

static void render_histograms(FILE *f, const kvcr_stats *s)
{
    if (s->n_histograms == 0) return;
    put_header(f, KVCR_DURATION_METRIC, "KVCR operation durations in seconds.", "histogram");
    for (size_t i = 0; i < s->n_histograms; i++) {
        const kvcr_histogram *h = &s->histograms[i];
        for (int b = 0; b < KVCR_HISTOGRAM_BUCKETS; b++) {
            char le[40];
            format_number(le, sizeof le, kvcr_histogram_bounds[b]);
            render_sample(f, "_bucket", h, le, (double)h->buckets[b]);
        }
        render_sample(f, "_bucket", h, "+Inf", (double)h->count);
        render_sample(f, "_sum", h, NULL, h->sum);
        render_sample(f, "_count", h, NULL, (double)h->count);
    }
}

#define RENDER "kvcr_stats_render_prometheus: "

/* A snapshot may be built by the caller, so check what rendering relies on:
 * the arrays and label values are there, and every counter is one of the
 * families rendered (none would be left out silently). */
static int check_stats(const kvcr_stats *s)
{
    if ((s->n_gauges && s->gauges == NULL) || (s->n_counters && s->counters == NULL) ||
        (s->n_histograms && s->histograms == NULL))
        return kvcr_fail(KVCR_EINVAL, RENDER "an array with entries is NULL");
    for (size_t i = 0; i < s->n_gauges; i++)
        if (s->gauges[i].resource == NULL)
            return kvcr_fail(KVCR_EINVAL, RENDER "gauges[%zu].resource is NULL", i);
    for (size_t i = 0; i < s->n_counters; i++) {
        const kvcr_counter *c = &s->counters[i];
        if (c->name == NULL || c->operation == NULL ||
            (strcmp(c->name, KVCR_TRANSFER_BYTES_METRIC) != 0 &&
             strcmp(c->name, KVCR_TRANSFER_BLOCKS_METRIC) != 0 &&
             strcmp(c->name, KVCR_LIMIT_REFUSALS_METRIC) != 0 &&
             strcmp(c->name, KVCR_CONTROL_DROPPED_METRIC) != 0))
            return kvcr_fail(KVCR_EINVAL,
                             RENDER "counters[%zu] needs an operation and the name "
                             KVCR_TRANSFER_BYTES_METRIC ", " KVCR_TRANSFER_BLOCKS_METRIC ", "
                             KVCR_LIMIT_REFUSALS_METRIC " or " KVCR_CONTROL_DROPPED_METRIC, i);
    }
    for (size_t i = 0; i < s->n_histograms; i++)
        if (s->histograms[i].scope == NULL || s->histograms[i].result == NULL)
            return kvcr_fail(KVCR_EINVAL, RENDER "histograms[%zu] needs a scope and a result", i);
    return 0;
}

KVCR_API int kvcr_stats_render_prometheus(const kvcr_stats *stats, char **text, size_t *len)
{
    if (stats == NULL || text == NULL || len == NULL)
        return kvcr_fail(KVCR_EINVAL, RENDER "stats, text and len must not be NULL");
    int rc = check_stats(stats);
    if (rc != 0) return rc;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (f == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory rendering stats");
    render_gauges(f, stats);
    render_counters(f, stats, KVCR_TRANSFER_BYTES_METRIC, "operation",
                    "Bytes moved by KVCR transfers.");
    render_counters(f, stats, KVCR_TRANSFER_BLOCKS_METRIC, "operation",
                    "Blocks moved by KVCR transfers.");
    render_counters(f, stats, KVCR_LIMIT_REFUSALS_METRIC, "limit",
                    "Requests KVCR refused at a configured limit.");
    render_counters(f, stats, KVCR_CONTROL_DROPPED_METRIC, "cause",
                    "Input KVCR dropped at its peer control endpoint, by cause.");
    render_histograms(f, stats);
    /* A failed write (the stream could not grow) only sets the error flag. */
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed) {
        free(buf);
        return kvcr_fail(KVCR_ENOMEM, "out of memory rendering stats");
    }
    *text = buf;
    *len = size;
    return 0;
}

KVCR_API void kvcr_prometheus_free(char *text)
{
    free(text);
}
