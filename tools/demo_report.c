/* kvcr demo: the figures. Per-request results from the engines add up
 * into totals; the driver prints progress while they arrive and then the
 * table (or, with --json, one object). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "demo.h"
#include "kvcr/kvcr.h"

/* Keeps a pull's [start, end]; the array grows (a --chaos run has no
 * request count to size it by). */
static void keep_pull(totals *t, double start, double end)
{
    if (t->n_pulls == t->cap_pulls) {
        size_t cap = t->cap_pulls ? 2 * t->cap_pulls : 1024;
        double(*p)[2] = realloc(t->pulls, cap * sizeof *p);
        if (p == NULL) {
            t->pulls_lost = true;
            return;
        }
        t->pulls = p;
        t->cap_pulls = cap;
    }
    t->pulls[t->n_pulls][0] = start;
    t->pulls[t->n_pulls++][1] = end;
}

void demo_add(totals *t, const demo_result *r)
{
    t->requests++;
    if (r->failed != DEMO_FAIL_NONE) { /* no engine answered: nothing else to add */
        t->failed[(unsigned)r->failed < DEMO_FAILS ? r->failed : 0]++;
        return;
    }
    t->blocks += r->n_blocks;
    t->local += r->local_hit;
    t->remote += r->remote_hit;
    t->g3 += r->g3_hit;
    t->guard += r->guard_hit;
    t->slow_ops += r->slow_ops;
    if (r->slowest_op_s > t->slowest_op_s) t->slowest_op_s = r->slowest_op_s;
    t->recomputed += r->recomputed;
    t->remote_failed += r->remote_failed;
    t->local_failed += r->local_failed;
    t->hinted += r->source >= 0;
    t->hint_refused += r->hint_refused;
    t->deposited += r->deposited;
    t->not_stored += r->deposit_not_stored;
    t->verified += r->verified_blocks;
    t->wrong += r->wrong_bytes;
    t->peer_bytes += r->peer_bytes;
    t->resilience += r->resilience;
    t->peer_s += r->peer_s;
    t->local_s += r->local_s;
    for (int i = 0; i < DEMO_REASONS; i++) t->why_failed[i] += r->why_failed[i];
    if (t->keep_pulls && r->peer_s > 0) keep_pull(t, r->peer_t0, r->peer_t0 + r->peer_s);
}

void demo_add_bye(demo_bye *sum, const demo_bye *b)
{
    sum->engine++;
    sum->slots += b->slots;
    sum->g3 += b->g3;
    sum->ops += b->ops;
    sum->pins += b->pins;
    sum->split.pulls += b->split.pulls;
    for (int i = 0; i < KVCR_PULL_PARTS; i++) sum->split.part_s[i] += b->split.part_s[i];
}

static const char *const part_scopes[KVCR_PULL_PARTS] = KVCR_PULL_PART_SCOPES;

void demo_add_split(demo_split *sum, const kvcr_stats *s)
{
    for (size_t h = 0; s && h < s->n_histograms; h++)
        for (int i = 0; i < KVCR_PULL_PARTS; i++) {
            if (strcmp(s->histograms[h].scope, part_scopes[i]) != 0) continue;
            sum->part_s[i] += s->histograms[h].sum;
            if (i == 0) sum->pulls += s->histograms[h].count; /* every part counts each pull */
        }
}

uint64_t demo_leaks(const demo_bye *sum)
{
    return (uint64_t)sum->slots + sum->g3 + sum->ops + sum->pins;
}

static int by_start(const void *a, const void *b)
{
    const double *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* Seconds during which at least one pull was running, anywhere. */
static double pull_time(totals *t)
{
    qsort(t->pulls, t->n_pulls, sizeof *t->pulls, by_start);
    double sum = 0, start = 0, end = -1;
    for (size_t i = 0; i < t->n_pulls; i++) {
        if (t->pulls[i][0] > end) {
            if (end > start) sum += end - start;
            start = t->pulls[i][0];
            end = t->pulls[i][1];
        } else if (t->pulls[i][1] > end) {
            end = t->pulls[i][1];
        }
    }
    if (end > start) sum += end - start;
    return sum;
}

/* "256 KiB", or "1000 B" when not a whole number of KiB. */
const char *demo_size_text(size_t bytes)
{
    static char buf[32];
    if (bytes % 1024 == 0)
        snprintf(buf, sizeof buf, "%zu KiB", bytes / 1024);
    else
        snprintf(buf, sizeof buf, "%zu B", bytes);
    return buf;
}

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0;
}

/* --chaos: a line every tenth of the duration (there is no request count). */
static void chaos_progress(const demo_opts *o, const totals *t, bool last)
{
    static double start, shown;
    double now = tool_now();
    if (start == 0) start = shown = now;
    if (!last && now - shown < o->duration_s / 10) return;
    shown = now;
    fprintf(stderr,
            "  %.0f s  %" PRIu64 " requests (%" PRIu64 " failed)  hit rate %.1f%% (local %.1f%%, "
            "G3 %.1f%%, peer %.1f%%, Guard %.1f%%)\n",
            now - start, t->requests,
            t->failed[DEMO_FAIL_ENGINE_DIED] + t->failed[DEMO_FAIL_NO_ENGINE],
            pct(t->local + t->remote, t->blocks), pct(t->local - t->g3, t->blocks),
            pct(t->g3, t->blocks), pct(t->remote - t->guard, t->blocks), pct(t->guard, t->blocks));
}

void demo_progress(const demo_opts *o, const totals *t, bool last)
{
    static double shown;
    static int tenth;
    if (o->chaos) {
        chaos_progress(o, t, last);
        return;
    }
    bool tty = isatty(STDERR_FILENO);
    double now = tool_now();
    if (tty) {
        if (!last && now - shown < 0.2) return;
        shown = now;
        fprintf(stderr,
                "\r  %" PRIu64 "/%d requests  hit rate %5.1f%% (local %5.1f%%, peer %5.1f%%)%s",
                t->requests, o->requests, pct(t->local + t->remote, t->blocks),
                pct(t->local, t->blocks), pct(t->remote, t->blocks), last ? "\n" : "");
        return;
    }
    int now_tenth = (int)(t->requests * 10 / (uint64_t)o->requests);
    if (now_tenth == tenth && !last) return;
    if (last && now_tenth == tenth && t->requests != (uint64_t)o->requests) now_tenth = -1;
    tenth = now_tenth;
    fprintf(stderr, "  %" PRIu64 "/%d requests  hit rate %.1f%% (local %.1f%%, peer %.1f%%)\n",
            t->requests, o->requests, pct(t->local + t->remote, t->blocks),
            pct(t->local, t->blocks), pct(t->remote, t->blocks));
}

/* One member of the --json object (first opens it). */
static void ju(const char *name, uint64_t v, bool first)
{
    printf("%s\"%s\":%" PRIu64, first ? "{" : ",", name, v);
}

static void jf(const char *name, double v)
{
    printf(",\"%s\":%.6g", name, v);
}

static const char *const fail_names[DEMO_FAILS] = {"", "engine_died", "no_engine"};

/* "failed_by_reason": requests no engine answered, then blocks whose
 * delivery failed (recomputed), by kvcr_reason name. */
static void json_failures(const totals *t)
{
    printf(",\"failed_by_reason\":{");
    bool first = true;
    for (int i = 1; i < DEMO_FAILS; i++, first = false)
        printf("%s\"%s\":%" PRIu64, first ? "" : ",", fail_names[i], t->failed[i]);
    for (int i = 1; i < DEMO_REASONS; i++)
        if (t->why_failed[i])
            printf(",\"%s\":%" PRIu64, kvcr_reason_name((kvcr_reason)i), t->why_failed[i]);
    printf("}");
}

/* "pull_split": the pulls split, the seconds of their parts summed (by
 * scope name) and of their whole. */
static void json_split(const demo_split *sp)
{
    printf(",\"pull_split\":");
    ju("pulls", sp->pulls, true);
    double total = 0;
    for (int i = 0; i < KVCR_PULL_PARTS; i++) {
        jf(part_scopes[i], sp->part_s[i]);
        total += sp->part_s[i];
    }
    jf("total", total);
    printf("}");
}

/* The parts for the table: a short name, and what each is. */
static const struct {
    const char *name, *what;
} part_text[KVCR_PULL_PARTS] = {
    {"queued", "submit to start_write sent"},
    {"control", "the control round trip, less the source's time"},
    {"pin wait", "the source waiting for framework pins"},
    {"source", "the source's own work: claims, hand-offs between its threads"},
    {"data", "the source writing the bytes (UCX puts to flush, or messages)"},
    {"settle", "the pull's end to its result in kvcr_poll"},
};

static void text_split(const demo_split *sp)
{
    double total = 0;
    for (int i = 0; i < KVCR_PULL_PARTS; i++) total += sp->part_s[i];
    double n = (double)sp->pulls;
    printf("%-20s %" PRIu64 " pulls, %.3f ms each on average, split by the pulling KVCR "
           "(durations its sources reported)\n",
           "where a pull's time", sp->pulls, 1e3 * total / n);
    for (int i = 0; i < KVCR_PULL_PARTS; i++)
        printf("  %-18s %8.3f ms %5.1f%%  %s\n", part_text[i].name, 1e3 * sp->part_s[i] / n,
               total > 0 ? 100 * sp->part_s[i] / total : 0, part_text[i].what);
}

static void json_leaks(const demo_bye *l)
{
    ju("engines_reported", (uint64_t)l->engine, false);
    ju("leaked_slots", l->slots, false);
    ju("leaked_g3_slots", l->g3, false);
    ju("leaked_ops", l->ops, false);
    ju("leaked_pins", l->pins, false);
    ju("leaks", demo_leaks(l), false);
}

static void json_chaos(const totals *t, const demo_chaos_figures *c)
{
    printf(",\"chaos\":");
    ju("kills", c->kills, true);
    ju("restarts", c->restarts, false);
    ju("stops", c->stops, false);
    ju("corruptions", c->corruptions, false);
    ju("disk_fulls", c->disk_fulls, false);
    ju("probes", c->probes, false);
    ju("checksum_misses", t->why_failed[KVCR_REASON_CORRUPT], false);
    ju("recovered_g2", c->recovered_g2, false);
    ju("recovered_g3", c->recovered_g3, false);
    ju("endpoint_changes", c->endpoint_changes, false);
    ju("disk_fill_bytes", c->disk_fill_bytes, false);
    ju("enospc_injected", c->enospc_injected, false);
    printf(",\"disk_real\":%s", c->disk_real ? "true" : "false");
    ju("unreaped", c->unreaped, false);
    ju("unexpected_exits", c->unexpected_exits, false);
    jf("chaos_s", c->chaos_s);
    printf("}");
}

static void text_chaos(const totals *t, const demo_chaos_figures *c)
{
    printf("%-20s %.0f s: %" PRIu64 " engines SIGKILLed (%" PRIu64 " restarted, %" PRIu64
           " on another endpoint), %" PRIu64 " stopped for a moment, %" PRIu64
           " G3 slots corrupted (%" PRIu64 " probed), the G3 disk filled %" PRIu64 " times\n",
           "chaos", c->chaos_s, c->kills, c->restarts, c->endpoint_changes, c->stops,
           c->corruptions, c->probes, c->disk_fulls);
    printf("%-20s %" PRIu64 " blocks back in KVCR DRAM from the Guard, %" PRIu64
           " in G3 files; %" PRIu64 " blocks pulled from a Guard, %" PRIu64 " read from G3\n",
           "recovered", c->recovered_g2, c->recovered_g3, t->guard, t->g3);
    printf("%-20s %" PRIu64
           " checksum misses (corrupt slots refused, recomputed); disk full: %s%.1f MB "
           "filled, %" PRIu64 " G3 completions set to fail with ENOSPC\n",
           "faults seen", t->why_failed[KVCR_REASON_CORRUPT],
           c->disk_real ? "a loop-mounted ext4, " : "no real file system (injection only), ",
           (double)c->disk_fill_bytes / 1e6, c->enospc_injected);
    if (c->unreaped || c->unexpected_exits)
        printf("%-20s %" PRIu64 " processes not reaped, %" PRIu64 " engines ended on their own"
               "  <-- FAILED\n",
               "processes", c->unreaped, c->unexpected_exits);
}

void demo_report(const demo_opts *o, totals *t, const totals *per, int started, double wall,
                 const demo_bye *leaks, const struct demo_chaos_figures *chaos)
{
    double cost = o->prefill_ms / 1e3, busy = pull_time(t);
    double gbs = t->peer_s > 0 ? (double)t->peer_bytes / t->peer_s / 1e9 : 0;
    double agg = busy > 0 ? (double)t->peer_bytes / busy / 1e9 : 0;
    double all_s = (double)t->blocks * cost;
    double kvcr_s = (double)t->recomputed * cost + t->peer_s + t->local_s;
    if (o->json) {
        ju("engines", (uint64_t)o->engines, true);
        if (o->hosts) ju("hosts", (uint64_t)o->hosts, false);
        ju("requests", t->requests, false);
        ju("conversations_started", (uint64_t)started, false);
        ju("block_size", o->block_size, false);
        ju("blocks", t->blocks, false);
        ju("local_g2_hit", t->local, false);
        ju("remote_g2_pulled", t->remote, false);
        ju("recomputed", t->recomputed, false);
        jf("hit_rate", pct(t->local + t->remote, t->blocks) / 100);
        jf("local_hit_rate", pct(t->local, t->blocks) / 100);
        jf("remote_hit_rate", pct(t->remote, t->blocks) / 100);
        ju("hinted_requests", t->hinted, false);
        ju("remote_failed", t->remote_failed, false);
        ju("local_failed", t->local_failed, false);
        ju("peer_pulls", t->n_pulls, false);
        ju("peer_bytes", t->peer_bytes, false);
        jf("peer_transfer_s", t->peer_s);
        jf("peer_gbps", gbs);
        jf("peer_busy_s", busy);
        jf("peer_aggregate_gbps", agg);
        json_split(&leaks->split);
        jf("prefill_ms_per_block", o->prefill_ms);
        jf("prefill_all_s", all_s);
        jf("prefill_with_kvcr_s", kvcr_s);
        jf("prefill_saved_s", all_s - kvcr_s);
        ju("local_g3_hit", t->g3, false);
        ju("guard_pulled", t->guard, false);
        ju("failed_requests", t->failed[DEMO_FAIL_ENGINE_DIED] + t->failed[DEMO_FAIL_NO_ENGINE],
           false);
        json_failures(t);
        ju("slow_ops", t->slow_ops, false);
        jf("slowest_op_s", t->slowest_op_s);
        json_leaks(leaks);
        if (chaos) json_chaos(t, chaos);
        ju("verified_blocks", t->verified, false);
        ju("wrong_bytes", t->wrong, false);
        ju("resilience_events", t->resilience, false);
        jf("wall_s", wall);
        printf(",\"peer_tier\":%s}\n", o->local_only ? "false" : "true");
        fflush(stdout);
        return;
    }
    printf("\n%-20s %" PRIu64 " in %.1f s (%d conversations started, %" PRIu64
           " with a router hint)\n",
           "requests", t->requests, wall, started, t->hinted);
    printf("%-20s %" PRIu64 " x %s = %.1f MB\n", "blocks", t->blocks, demo_size_text(o->block_size),
           (double)t->blocks * (double)o->block_size / 1e6);
    printf("  %-18s %8" PRIu64 "  %5.1f%%\n", "local G2 hit", t->local, pct(t->local, t->blocks));
    printf("  %-18s %8" PRIu64 "  %5.1f%%\n", "remote G2 pulled", t->remote,
           pct(t->remote, t->blocks));
    printf("  %-18s %8" PRIu64 "  %5.1f%%", "recomputed", t->recomputed,
           pct(t->recomputed, t->blocks));
    if (t->remote_failed || t->local_failed) {
        printf("  (failed deliveries, recomputed: %" PRIu64 " pulls, %" PRIu64 " local;",
               t->remote_failed, t->local_failed);
        for (int i = 0; i < DEMO_REASONS; i++)
            if (t->why_failed[i])
                printf(" %s %" PRIu64, kvcr_reason_name((kvcr_reason)i), t->why_failed[i]);
        printf(")");
    }
    printf("\n%-20s %.1f%% (local %.1f%% + peer %.1f%%)\n", "hit rate",
           pct(t->local + t->remote, t->blocks), pct(t->local, t->blocks),
           pct(t->remote, t->blocks));
    if (o->local_only)
        printf("%-20s off (--local-only): no control endpoints, no router hints\n", "peer to peer");
    else
        printf(
            "%-20s %.1f MB in %zu pulls: %.2f GB/s (%.3f s of pulls summed); "
            "%.2f GB/s aggregate (%.3f s with a pull running)\n",
            "peer to peer", (double)t->peer_bytes / 1e6, t->n_pulls, gbs, t->peer_s, agg, busy);
    if (leaks->split.pulls > 0) text_split(&leaks->split);
    printf(
        "%-20s %.2f ms/block: %.2f s recomputing everything, %.2f s with KVCR "
        "(%.2f s recompute + %.3f s deliveries)\n",
        "prefill (modelled)", o->prefill_ms, all_s, kvcr_s, (double)t->recomputed * cost,
        t->peer_s + t->local_s);
    printf("%-20s %.2f s (%.1f%%)\n", "prefill time saved", all_s - kvcr_s,
           all_s > 0 ? 100 * (all_s - kvcr_s) / all_s : 0);
    printf("%-20s %" PRIu64 " blocks delivered, every byte checked: %" PRIu64 " wrong bytes%s\n",
           "verification", t->verified, t->wrong, t->wrong ? "  <-- FAILED" : "");
    if (t->resilience)
        printf("%-20s %" PRIu64 " uncertain or stalled peer transfers (see stderr)\n",
               "resilience events", t->resilience);
    if (t->failed[DEMO_FAIL_ENGINE_DIED] || t->failed[DEMO_FAIL_NO_ENGINE])
        printf("%-20s %" PRIu64 " requests held by an engine that died, %" PRIu64
               " with no engine up (never answered, never counted as served)\n",
               "failed requests", t->failed[DEMO_FAIL_ENGINE_DIED], t->failed[DEMO_FAIL_NO_ENGINE]);
    if (t->slow_ops)
        printf("%-20s %" PRIu64 " KVCR operations took longer than %.0f s (the slowest %.1f s)\n",
               "slow operations", t->slow_ops, DEMO_SLOW_OP_S, t->slowest_op_s);
    printf("%-20s %d engines reported after the drain: %" PRIu64 " claimed DRAM slots, %" PRIu64
           " G3 slots, %" PRIu64 " operations or hints, %" PRIu64 " pins left%s\n",
           "leaks", leaks->engine, (uint64_t)leaks->slots, (uint64_t)leaks->g3,
           (uint64_t)leaks->ops, (uint64_t)leaks->pins, demo_leaks(leaks) ? "  <-- FAILED" : "");
    if (chaos) text_chaos(t, chaos);
    printf("\n%-8s %8s %8s %8s %10s %10s\n", "engine", "requests", "local", "pulled", "recomputed",
           "pulled MB");
    for (int e = 0; e < o->engines; e++)
        printf("%-8d %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %10.1f\n", e,
               per[e].requests, per[e].local, per[e].remote, per[e].recomputed,
               (double)per[e].peer_bytes / 1e6);
    fflush(stdout);
}
