/* The UCX data plane (net/ucx.h): writes land byte for byte, done is
 * reported exactly once and only from ucx_progress, big and many-segment
 * writes, writes sent as messages taken only through the sink, malformed
 * addresses and rkeys from the wire, a real second process, and a peer
 * killed in the middle of a stream of writes.
 *
 * UCX and fork() do not mix: the helper processes of the two-process tests
 * are forked at the start of main(), before this process makes any UCX
 * context, and each makes its own after the fork. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "core/instance.h"
#include "harness.h"
#include "pipes.h"
#include "kvcr/error.h"
#include "kvcr/stats.h"
#include "net/ucx.h"
#include "peer.h"
#include "tiers/remote_int.h"
#include "util/clock.h"

#define SEC 1000000000ull
#define WAIT_NS (10 * SEC)

/* ---- logging and completions --------------------------------------------- */

static int lanes_logged;
static char lanes_line[512];

static void on_log(void *ud, kvcr_log_level level, const char *msg)
{
    (void)ud;
    if (level == KVCR_LOG_INFO && strstr(msg, "lanes:") != NULL) {
        lanes_logged++;
        snprintf(lanes_line, sizeof lanes_line, "%s", msg);
    }
    if (level <= KVCR_LOG_WARN) fprintf(stderr, "  [ucx %s] %s\n", level ? "warn" : "error", msg);
}

static kvcr_logger test_log;

typedef struct done_rec {
    int calls;
    int status;
    bool inside_write; /* done ran while a ucx_write was on the stack */
} done_rec;

static bool in_write;

static void on_done(void *ud, int status)
{
    done_rec *d = ud;
    d->calls++;
    d->status = status;
    if (in_write) d->inside_write = true;
}

static int do_write(ucx_peer *p, const ucx_seg *segs, size_t n, done_rec *d)
{
    in_write = true;
    int rc = ucx_write(p, segs, n, 0, on_done, d);
    in_write = false;
    return rc;
}

/* Progresses a and b (b may be NULL) until *calls reaches want or the
 * deadline passes, sleeping on their fds whenever both are armed (a lost
 * wakeup shows as slowness, the poll timeout keeps it bounded). */
static bool progress_until(ucx_ctx *a, ucx_ctx *b, const int *calls, int want, uint64_t deadline)
{
    while (*calls < want && kvcr_now_ns() < deadline) {
        ucx_progress(a);
        if (b != NULL) ucx_progress(b);
        if (*calls >= want) break;
        if (!ucx_arm(a) || (b != NULL && !ucx_arm(b))) continue;
        struct pollfd fds[2] = {{ucx_fd(a), POLLIN, 0}, {b ? ucx_fd(b) : -1, POLLIN, 0}};
        poll(fds, 2, 100);
    }
    return *calls >= want;
}

static void wait_done(ucx_ctx *a, ucx_ctx *b, done_rec *d)
{
    assert_true(progress_until(a, b, &d->calls, 1, kvcr_now_ns() + WAIT_NS));
    assert_false(d->inside_write);
    for (int i = 0; i < 100; i++) { /* and never twice */
        ucx_progress(a);
        if (b != NULL) ucx_progress(b);
    }
    assert_int_equal(d->calls, 1);
}

/* ---- two contexts in this process ---------------------------------------- */

typedef struct pair {
    ucx_ctx *a, *b;
    ucx_peer *ab;
    uint8_t *dst;
    size_t dst_len;
    bool alloc; /* dst allocated by UCX, else our registered memory */
    ucx_mem *dst_mem;
    ucx_rkey *rkey;
} pair;

static void pair_open(pair *p, size_t dst_len, bool alloc)
{
    memset(p, 0, sizeof *p);
    assert_int_equal(ucx_ctx_create(&test_log, &p->a), 0);
    assert_int_equal(ucx_ctx_create(&test_log, &p->b), 0);
    p->dst_len = dst_len;
    p->alloc = alloc;
    if (alloc) {
        assert_int_equal(ucx_mem_alloc(p->b, dst_len, &p->dst_mem), 0);
        p->dst = ucx_mem_addr(p->dst_mem);
    } else {
        p->dst = malloc(dst_len);
        assert_non_null(p->dst);
        assert_int_equal(ucx_mem_register(p->b, p->dst, dst_len, &p->dst_mem), 0);
    }
    memset(p->dst, 0xee, dst_len);
    const void *addr, *rkey;
    size_t addr_len, rkey_len;
    ucx_worker_address(p->b, &addr, &addr_len);
    int before = lanes_logged;
    assert_int_equal(ucx_peer_connect(p->a, addr, addr_len, &p->ab), 0);
    assert_int_equal(lanes_logged, before + 1); /* the lanes are logged at info */
    ucx_mem_rkey(p->dst_mem, &rkey, &rkey_len);
    assert_int_equal(ucx_rkey_unpack(p->ab, rkey, rkey_len, &p->rkey), 0);
}

/* Lets the endpoint's wireup finish: a flushing close waits for the peer's
 * answer, and here nobody progresses b while a closes. */
static void settle(ucx_ctx *a, ucx_ctx *b)
{
    for (int i = 0; i < 100; i++) {
        ucx_progress(a);
        ucx_progress(b);
    }
}

static void pair_close(pair *p)
{
    assert_int_equal(ucx_peer_busy(p->ab), 0);
    settle(p->a, p->b);
    ucx_rkey_destroy(p->rkey);
    ucx_peer_close(p->ab);
    ucx_mem_deregister(p->dst_mem);
    if (!p->alloc) free(p->dst);
    ucx_ctx_destroy(p->a);
    ucx_ctx_destroy(p->b);
}

static ucx_seg seg(const pair *p, const void *src, const ucx_mem *mem, size_t off, size_t len)
{
    return (ucx_seg){src, mem, (uint64_t)(uintptr_t)(p->dst + off), p->rkey, len};
}

/* What the destination must hold after segs: the writes applied in order. */
static void apply(uint8_t *model, const uint8_t *base, const ucx_seg *segs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        memcpy(model + (segs[i].remote_addr - (uint64_t)(uintptr_t)base), segs[i].src, segs[i].len);
}

static void test_write_lands_every_byte_and_reports_once(void **state)
{
    (void)state;
    enum { N = 64 << 10 };
    pair pr;
    pair_open(&pr, N, false);
    uint8_t *src = malloc(N), *model = malloc(N), loose[1000];
    fill_pattern(src, N, 1);
    fill_pattern(loose, sizeof loose, 2);
    ucx_mem *sm;
    assert_int_equal(ucx_mem_register(pr.a, src, N, &sm), 0);
    ucx_seg segs[] = {
        seg(&pr, src, sm, 0, 4096),             /* these two merge: contiguous */
        seg(&pr, src + 4096, sm, 4096, 4096),   /* on both sides */
        seg(&pr, src + 8192, sm, 20000, 100),   /* contiguous at the source only */
        seg(&pr, src + 30000, NULL, 20100, 333), /* at the destination only */
        seg(&pr, src + 40000, sm, 50000, 0),    /* empty: skipped */
        seg(&pr, src + 50000, sm, 60000, 1),
        seg(&pr, loose, NULL, 61000, sizeof loose), /* unregistered source */
        seg(&pr, src + 100, sm, 40000, 7),
        seg(&pr, src + 107, NULL, 40007, 9),    /* merges, one of them unregistered */
    };
    size_t n = sizeof segs / sizeof segs[0];
    memset(model, 0xee, N);
    apply(model, pr.dst, segs, n);

    done_rec d = {0};
    assert_int_equal(do_write(pr.ab, segs, n, &d), 0);
    assert_int_equal(d.calls, 0);
    assert_int_equal(ucx_peer_busy(pr.ab), 1);
    wait_done(pr.a, pr.b, &d);
    assert_int_equal(d.status, 0);
    assert_int_equal(ucx_peer_busy(pr.ab), 0);
    assert_memory_equal(pr.dst, model, N);
    print_message("  %s\n", lanes_line);

    ucx_mem_deregister(sm);
    pair_close(&pr);
    free(src);
    free(model);
}

/* The destination side of writes sent as messages: copies a message into
 * dst when it carries the expected tag and lies inside dst. */
typedef struct sink_rec {
    uint8_t *dst;
    size_t len;
    uint64_t tag;
    uint64_t bytes; /* taken */
    int calls;      /* runs taken */
    int adjacent;   /* runs whose bytes followed the previous run's: one message */
    const uint8_t *last_end;
} sink_rec;

static bool test_sink(void *arg, uint64_t tag, uint64_t addr, const void *data, size_t len)
{
    sink_rec *k = arg;
    uint64_t base = (uint64_t)(uintptr_t)k->dst;
    if (tag != k->tag || addr < base || addr - base > k->len || len > k->len - (addr - base))
        return false;
    memcpy((void *)(uintptr_t)addr, data, len);
    k->bytes += len;
    k->calls++;
    if (data == k->last_end) k->adjacent++;
    k->last_end = (const uint8_t *)data + len;
    return true;
}

/* Writes segs as messages tagged k->tag; done must come with success, and
 * then the sink must take all total bytes (they may arrive after done). */
static void write_and_take(pair *pr, const ucx_seg *segs, size_t n, sink_rec *k, uint64_t total)
{
    done_rec d = {0};
    assert_int_equal(ucx_write(pr->ab, segs, n, k->tag, on_done, &d), 0);
    wait_done(pr->a, pr->b, &d);
    assert_int_equal(d.status, 0);
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (k->bytes < total && kvcr_now_ns() < until) {
        ucx_progress(pr->a);
        ucx_progress(pr->b);
    }
    assert_int_equal(k->bytes, total);
}

/* With KVCR_UCX_WRITES=messages (what a peer reached over TCP alone gets):
 * a write's runs arrive as messages that only the destination's sink
 * copies; done means sent, the bytes are in once the sink took them all.
 * A message the sink refuses (another tag) writes nothing and is counted;
 * a 2 MiB run arrives whole. */
static void test_writes_as_messages_land_only_through_the_sink(void **state)
{
    (void)state;
    enum { N = 4 << 20 };
    setenv("KVCR_UCX_WRITES", "messages", 1);
    pair pr;
    pair_open(&pr, N, false);
    unsetenv("KVCR_UCX_WRITES");
    assert_true(ucx_peer_messages(pr.ab));
    sink_rec k = {pr.dst, N, 7, 0};
    ucx_set_sink(pr.b, test_sink, &k);
    uint8_t *src = malloc(N), *model = malloc(N);
    fill_pattern(src, N, 3);
    ucx_seg segs[] = {
        seg(&pr, src, NULL, 0, 4096),         /* these two merge into one run, */
        seg(&pr, src + 4096, NULL, 4096, 4096),
        seg(&pr, src + 9000, NULL, 20000, 100), /* gathered with this one */
        seg(&pr, src + (1 << 20), NULL, 1 << 21, 2 << 20), /* 2 MiB, one message */
    };
    size_t n = sizeof segs / sizeof segs[0];
    uint64_t total = 4096 * 2 + 100 + (2 << 20);
    memset(model, 0xee, N);
    apply(model, pr.dst, segs, n);
    write_and_take(&pr, segs, n, &k, total);
    assert_memory_equal(pr.dst, model, N);
    assert_int_equal(ucx_sink_dropped(pr.b), 0);

    /* another tag: refused, nothing written, both messages counted */
    fill_pattern(src, N, 4);
    done_rec d = {0};
    assert_int_equal(ucx_write(pr.ab, segs + 2, 2, 8, on_done, &d), 0);
    wait_done(pr.a, pr.b, &d);
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (ucx_sink_dropped(pr.b) < 2 && kvcr_now_ns() < until) {
        ucx_progress(pr.a);
        ucx_progress(pr.b);
    }
    assert_int_equal(ucx_sink_dropped(pr.b), 2);
    assert_int_equal(k.bytes, total);
    assert_memory_equal(pr.dst, model, N);
    pair_close(&pr);
    free(src);
    free(model);
}

/* Small runs as messages: gathered several to a message at the source,
 * handed to the sink one call per run at the destination (a run's bytes
 * right after the previous run's shows they came in one message); a
 * run of 1 MiB among them goes alone; every byte lands. */
static void test_small_runs_as_messages_are_gathered_and_scattered(void **state)
{
    (void)state;
    enum { N = 4 << 20, SEG = 16 << 10, K = 128 };
    setenv("KVCR_UCX_WRITES", "messages", 1);
    pair pr;
    pair_open(&pr, N, false);
    unsetenv("KVCR_UCX_WRITES");
    sink_rec k = {pr.dst, N, 9, 0, 0, 0, NULL};
    ucx_set_sink(pr.b, test_sink, &k);
    uint8_t *src = malloc(N), *model = malloc(N);
    ucx_seg *segs = malloc((K + 1) * sizeof *segs);
    fill_pattern(src, N, 5);
    for (int i = 0; i < K; i++) /* source chunk i to destination chunk 37 i mod K: no merging */
        segs[i] = seg(&pr, src + (size_t)i * SEG, NULL, (size_t)(i * 37 % K) * SEG, SEG - i);
    segs[K] = segs[K / 2]; /* a long run in the middle */
    segs[K / 2] = seg(&pr, src + (3u << 20), NULL, 3u << 20, 1u << 20);
    memset(model, 0xee, N);
    apply(model, pr.dst, segs, K + 1);
    uint64_t total = 0;
    for (int i = 0; i <= K; i++) total += segs[i].len;
    write_and_take(&pr, segs, K + 1, &k, total);
    assert_int_equal(k.calls, K + 1);
    assert_true(k.adjacent > 0);
    assert_memory_equal(pr.dst, model, N);
    assert_int_equal(ucx_sink_dropped(pr.b), 0);
    pair_close(&pr);
    free(segs);
    free(src);
    free(model);
}

/* A raw UCP sender of write messages, for headers ucx_write never makes. */
typedef struct raw_sender {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    bool own; /* we progress the receiver (else its instance does) */
} raw_sender;

static void raw_open(raw_sender *r, const ucx_ctx *to, bool own)
{
    r->own = own;
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_config_t *cfg;
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    assert_int_equal(ucp_init(&params, cfg, &r->ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(r->ctx, &wp, &r->worker), UCS_OK);
    const void *addr;
    size_t len;
    ucx_worker_address(to, &addr, &len);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    assert_int_equal(ucp_ep_create(r->worker, &ep, &r->ep), UCS_OK);
}

/* Sends one eager message with id 1 and waits until it is sent. The
 * receiver `to` is progressed here when we own it, else by its instance's
 * progress thread. */
static void raw_send(raw_sender *r, ucx_ctx *to, const void *h, size_t hlen, const void *data,
                     size_t len)
{
    bool own = r->own;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_EAGER};
    void *req = ucp_am_send_nbx(r->ep, 1, h, hlen, data, len, &rp);
    assert_false(UCS_PTR_IS_ERR(req));
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           kvcr_now_ns() < until) {
        ucp_worker_progress(r->worker);
        if (own) ucx_progress(to);
    }
    if (UCS_PTR_IS_PTR(req)) {
        assert_int_equal(ucp_request_check_status(req), UCS_OK);
        ucp_request_free(req);
    }
}

static void raw_close(raw_sender *r, ucx_ctx *to)
{
    bool own = r->own;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(r->ep, &rp);
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           kvcr_now_ns() < until) {
        ucp_worker_progress(r->worker);
        if (own) ucx_progress(to);
    }
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    ucp_worker_destroy(r->worker);
    ucp_cleanup(r->ctx);
}

/* Progresses both sides until the receiver has counted want drops. */
static void wait_dropped(raw_sender *r, ucx_ctx *to, uint64_t want)
{
    bool own = r->own;
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (ucx_sink_dropped(to) < want && kvcr_now_ns() < until) {
        ucp_worker_progress(r->worker);
        if (own) ucx_progress(to);
    }
    for (int i = 0; i < 100; i++) {
        ucp_worker_progress(r->worker);
        if (own) ucx_progress(to);
    }
    assert_int_equal(ucx_sink_dropped(to), want);
}

/* A header listing (address, length) runs: tag, then the pairs. */
static size_t runs_header(uint8_t *h, uint64_t tag, const uint64_t *pairs, size_t n_runs)
{
    memcpy(h, &tag, 8);
    memcpy(h + 8, pairs, n_runs * 16);
    return 8 + n_runs * 16;
}

/* Write messages whose header does not add up are dropped whole and
 * counted, and write nothing: too short, a length not of whole entries,
 * one run in the listed layout, too many runs, lengths short of or past
 * the payload, a run of zero bytes. A good one of two runs lands; one
 * whose second run the sink refuses is counted once. */
static void test_malformed_write_messages_are_dropped_and_counted(void **state)
{
    (void)state;
    enum { N = 64 << 10 };
    pair pr;
    pair_open(&pr, N, false);
    sink_rec k = {pr.dst, N, 3, 0, 0, 0, NULL};
    ucx_set_sink(pr.b, test_sink, &k);
    raw_sender r;
    raw_open(&r, pr.b, true);
    uint8_t data[8192], h[8 + 40 * 16];
    fill_pattern(data, sizeof data, 6);
    uint64_t base = (uint64_t)(uintptr_t)pr.dst, pairs[80];
    for (int i = 0; i < 40; i++) pairs[2 * i] = base + (uint64_t)i * 256, pairs[2 * i + 1] = 100;
    uint64_t dropped = 0;

    runs_header(h, 3, pairs, 2);
    raw_send(&r, pr.b, h, 8, data, 200); /* shorter than one run's header */
    raw_send(&r, pr.b, h, 8 + 16 * 2 - 4, data, 200); /* not whole entries */
    raw_send(&r, pr.b, h, runs_header(h, 3, pairs, 1), data, 100); /* one run, listed */
    raw_send(&r, pr.b, h, runs_header(h, 3, pairs, 33), data, 3300); /* too many runs */
    raw_send(&r, pr.b, h, runs_header(h, 3, pairs, 2), data, 199); /* lengths past the payload */
    raw_send(&r, pr.b, h, runs_header(h, 3, pairs, 2), data, 201); /* short of it */
    uint64_t zero[] = {base, 200, base + 1000, 0};
    raw_send(&r, pr.b, h, runs_header(h, 3, zero, 2), data, 200);
    uint64_t huge[] = {base, UINT64_MAX - 50, base + 1000, 251};
    raw_send(&r, pr.b, h, runs_header(h, 3, huge, 2), data, 200); /* sum wraps to 200 */
    dropped += 8;
    wait_dropped(&r, pr.b, dropped);
    assert_int_equal(k.calls, 0);
    for (size_t i = 0; i < N; i++)
        if (pr.dst[i] != 0xee) fail_msg("byte %zu written by a dropped message", i);

    /* well formed: both runs land, in their places */
    uint64_t good[] = {base + 5000, 300, base + 100, 700};
    raw_send(&r, pr.b, h, runs_header(h, 3, good, 2), data, 1000);
    uint64_t until = kvcr_now_ns() + WAIT_NS;
    while (k.calls < 2 && kvcr_now_ns() < until) {
        ucp_worker_progress(r.worker);
        ucx_progress(pr.b);
    }
    assert_int_equal(k.calls, 2);
    assert_memory_equal(pr.dst + 5000, data, 300);
    assert_memory_equal(pr.dst + 100, data + 300, 700);

    /* the second run outside the destination: refused there, counted once */
    uint64_t outside[] = {base + 20000, 100, base + N - 50, 100};
    raw_send(&r, pr.b, h, runs_header(h, 3, outside, 2), data, 200);
    wait_dropped(&r, pr.b, ++dropped);
    assert_int_equal(k.calls, 3);
    raw_close(&r, pr.b);
    pair_close(&pr);
}

/* The line of a gauge in the instance's Prometheus text, "" if absent. */
static void prometheus_line(rig *r, const char *resource, char *out, size_t cap)
{
    kvcr_stats *st = NULL;
    char *text = NULL, key[128];
    size_t len;
    assert_int_equal(kvcr_stats_take(r->kv, &st), 0);
    assert_int_equal(kvcr_stats_render_prometheus(st, &text, &len), 0);
    snprintf(key, sizeof key, "resource=\"%s\"}", resource);
    const char *at = strstr(text, key);
    snprintf(out, cap, "%.*s", at ? (int)strcspn(at, "\n") : 0, at ? at : "");
    kvcr_prometheus_free(text);
    kvcr_stats_free(st);
}

/* An instance's peer tier exports the write messages its sink dropped, in
 * its gauges and its Prometheus text: a malformed one and one for no pull
 * of the instance each move it by one. */
static void test_dropped_write_messages_show_in_the_instances_gauges(void **state)
{
    (void)state;
    rig a;
    rig_init_remote(&a, 4096, 4, 4);
    a.cfg.enable_telemetry = true;
    rig_start(&a);
    ucx_ctx *c = a.kv->remote->ucx;
    assert_int_equal(rig_stat(&a, "ucx_write_messages_dropped", NULL), 0);
    char line[160];
    prometheus_line(&a, "ucx_write_messages_dropped", line, sizeof line);
    assert_string_equal(line, "resource=\"ucx_write_messages_dropped\"} 0");
    raw_sender r;
    raw_open(&r, c, false);
    uint8_t data[64] = {0}, h[24] = {0};
    uint64_t pairs[] = {1 << 20, 64};
    raw_send(&r, c, h, runs_header(h, 42, pairs, 1), data, sizeof data); /* malformed */
    wait_dropped(&r, c, 1);
    assert_int_equal(rig_stat(&a, "ucx_write_messages_dropped", NULL), 1);
    raw_send(&r, c, h, 16, data, sizeof data); /* well formed, for no pull */
    wait_dropped(&r, c, 2);
    assert_int_equal(rig_stat(&a, "ucx_write_messages_dropped", NULL), 2);
    prometheus_line(&a, "ucx_write_messages_dropped", line, sizeof line);
    assert_string_equal(line, "resource=\"ucx_write_messages_dropped\"} 2");
    raw_close(&r, c);
    rig_stop(&a);
}

/* One 2 MiB segment, then 128 x 16 KiB in shuffled order (nothing merges:
 * 128 puts in flight, one flush), into registered and into UCX-allocated
 * destination memory. */
static void test_big_and_many_segment_writes_land(void **state)
{
    (void)state;
    enum { N = 2 << 20, SEG = 16 << 10, K = N / SEG };
    uint8_t *src = malloc(N), *model = malloc(N);
    ucx_seg *segs = malloc(K * sizeof *segs);
    for (int alloc = 0; alloc <= 1; alloc++) {
        pair pr;
        pair_open(&pr, N, alloc);
        ucx_mem *sm;
        assert_int_equal(ucx_mem_register(pr.a, src, N, &sm), 0);

        fill_pattern(src, N, 10 + alloc);
        ucx_seg one = seg(&pr, src, sm, 0, N);
        done_rec d = {0};
        uint64_t t0 = kvcr_now_ns();
        assert_int_equal(do_write(pr.ab, &one, 1, &d), 0);
        wait_done(pr.a, pr.b, &d);
        uint64_t t1 = kvcr_now_ns();
        assert_int_equal(d.status, 0);
        assert_memory_equal(pr.dst, src, N);

        fill_pattern(src, N, 20 + alloc);
        for (int i = 0; i < K; i++) /* source chunk i to destination chunk 37 i mod K */
            segs[i] = seg(&pr, src + (size_t)i * SEG, sm, (size_t)(i * 37 % K) * SEG, SEG);
        memset(model, 0, N);
        apply(model, pr.dst, segs, K);
        d = (done_rec){0};
        uint64_t t2 = kvcr_now_ns();
        assert_int_equal(do_write(pr.ab, segs, K, &d), 0);
        wait_done(pr.a, pr.b, &d);
        uint64_t t3 = kvcr_now_ns();
        assert_int_equal(d.status, 0);
        assert_memory_equal(pr.dst, model, N);
        print_message("  %s destination: 2 MiB in %.0f us, 128 x 16 KiB in %.0f us\n",
                      alloc ? "UCX-allocated" : "registered", (t1 - t0) / 1e3, (t3 - t2) / 1e3);

        ucx_mem_deregister(sm);
        pair_close(&pr);
    }
    free(segs);
    free(src);
    free(model);
}

typedef struct chain {
    int calls, left, status;
    bool inside_write;
    ucx_peer *p;
    ucx_seg s;
} chain;

static void on_chain_done(void *ud, int status)
{
    chain *c = ud;
    c->calls++;
    if (status != 0) c->status = status;
    if (in_write) c->inside_write = true;
    if (c->left-- > 0) {
        in_write = true;
        if (ucx_write(c->p, &c->s, 1, 0, on_chain_done, c) != 0) c->status = -100;
        in_write = false;
    }
}

static void test_done_is_never_called_inside_ucx_write(void **state)
{
    (void)state;
    /* Into UCX-allocated memory on this host the puts and the flush may all
     * complete inside ucx_write; an empty write certainly does. */
    pair pr;
    pair_open(&pr, 4096, true);
    uint8_t src[4096];
    fill_pattern(src, sizeof src, 3);
    settle(pr.a, pr.b); /* nothing outstanding, wireup included */
    done_rec d = {0};
    assert_int_equal(do_write(pr.ab, NULL, 0, &d), 0);
    assert_int_equal(d.calls, 0);
    assert_false(ucx_arm(pr.a)); /* a queued completion means: do not sleep */
    ucx_progress(pr.a);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.status, 0);
    assert_false(d.inside_write);

    ucx_seg s = seg(&pr, src, NULL, 0, sizeof src);
    d = (done_rec){0};
    assert_int_equal(do_write(pr.ab, &s, 1, &d), 0);
    assert_int_equal(d.calls, 0);
    wait_done(pr.a, pr.b, &d);
    assert_int_equal(d.status, 0);
    assert_memory_equal(pr.dst, src, sizeof src);

    /* Each done starts the next write: still never reported from inside. */
    chain c = {.left = 4, .p = pr.ab, .s = s};
    in_write = true;
    assert_int_equal(ucx_write(pr.ab, &s, 1, 0, on_chain_done, &c), 0);
    in_write = false;
    assert_int_equal(c.calls, 0);
    assert_true(progress_until(pr.a, pr.b, &c.calls, 5, kvcr_now_ns() + WAIT_NS));
    assert_int_equal(c.calls, 5);
    assert_int_equal(c.status, 0);
    assert_false(c.inside_write);
    pair_close(&pr);
}

static void test_bad_segments_are_refused_before_anything_is_posted(void **state)
{
    (void)state;
    pair pr, other;
    pair_open(&pr, 4096, false);
    pair_open(&other, 4096, false);
    uint8_t src[256];
    ucx_mem *sm;
    assert_int_equal(ucx_mem_register(pr.a, src, sizeof src, &sm), 0);
    done_rec d = {0};
    ucx_seg good = seg(&pr, src, sm, 0, 16);
    ucx_seg outside = seg(&pr, src + 200, sm, 0, 100); /* runs past the registration */
    ucx_seg foreign = good;
    foreign.rkey = other.rkey; /* unpacked on another endpoint */
    ucx_seg no_rkey = good;
    no_rkey.rkey = NULL;
    ucx_seg wraps = good;
    wraps.remote_addr = UINT64_MAX - 4;
    const ucx_seg *bad[] = {&outside, &foreign, &no_rkey, &wraps};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ucx_seg two[2] = {good, *bad[i]};
        assert_int_equal(do_write(pr.ab, two, 2, &d), KVCR_EINVAL);
        assert_int_equal(ucx_peer_busy(pr.ab), 0);
    }
    in_write = true;
    assert_int_equal(ucx_write(pr.ab, &good, 1, 0, NULL, NULL), KVCR_EINVAL);
    in_write = false;
    for (int i = 0; i < 100; i++) ucx_progress(pr.a), ucx_progress(pr.b);
    assert_int_equal(d.calls, 0);
    ucx_mem_deregister(sm);
    pair_close(&other);
    pair_close(&pr);
}

static uint32_t rnd(uint32_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 17, *x ^= *x << 5;
    return *x;
}

static void expect_bad_address(ucx_ctx *a, const void *addr, size_t len)
{
    ucx_peer *p = NULL;
    assert_int_equal(ucx_peer_connect(a, addr, len, &p), KVCR_EINVAL);
    assert_null(p);
    assert_non_null(strstr(kvcr_last_error(), "UCX worker address"));
}

/* UCX 1.13 aborts or crashes on most of these (see ucx.c): each must be
 * refused before UCX sees it. */
static void test_malformed_addresses_and_rkeys_fail_cleanly(void **state)
{
    (void)state;
    pair pr;
    pair_open(&pr, 4096, false);
    const void *va;
    size_t vlen;
    ucx_worker_address(pr.b, &va, &vlen);
    uint8_t *buf = calloc(1, 10000);
    memcpy(buf, va, vlen);

    assert_int_equal(ucx_peer_connect(pr.a, NULL, vlen, &(ucx_peer *){NULL}), KVCR_EINVAL);
    for (size_t len = 0; len < vlen; len++) expect_bad_address(pr.a, buf, len); /* cut short */
    buf[vlen] = 0;
    expect_bad_address(pr.a, buf, vlen + 1); /* a byte too many */
    expect_bad_address(pr.a, buf, 10000);
    for (uint8_t v = 1; v < 16; v++) { /* versions UCX does not know: it asserts */
        buf[0] = (uint8_t)((((const uint8_t *)va)[0] & 0xf0) | v);
        expect_bad_address(pr.a, buf, vlen);
    }
    memcpy(buf, va, vlen);
    memset(buf + 9, 0xff, vlen - 9); /* every length and flag byte garbled */
    buf[9] = 0x20;
    expect_bad_address(pr.a, buf, vlen);
    uint32_t x = 12345;
    for (int i = 0; i < 2000; i++) { /* random bytes, some with a valid header */
        size_t len = 1 + rnd(&x) % 400;
        for (size_t j = 0; j < len; j++) buf[j] = (uint8_t)rnd(&x);
        if (i % 2) buf[0] = ((const uint8_t *)va)[0];
        expect_bad_address(pr.a, buf, len);
    }

    /* Still usable, and the real address still connects. */
    ucx_peer *p;
    assert_int_equal(ucx_peer_connect(pr.a, va, vlen, &p), 0);

    const void *rk;
    size_t rlen;
    ucx_mem_rkey(pr.dst_mem, &rk, &rlen);
    memcpy(buf, rk, rlen);
    ucx_rkey *r = NULL;
    assert_int_equal(ucx_rkey_unpack(p, NULL, rlen, &r), KVCR_EINVAL);
    for (size_t len = 0; len < rlen; len++)
        assert_int_equal(ucx_rkey_unpack(p, buf, len, &r), KVCR_EINVAL);
    assert_int_equal(ucx_rkey_unpack(p, buf, rlen + 1, &r), KVCR_EINVAL);
    buf[0] ^= 0x80; /* one more memory domain than keys */
    assert_int_equal(ucx_rkey_unpack(p, buf, rlen, &r), KVCR_EINVAL);
    buf[0] ^= 0x80;
    buf[8] = 1; /* not host memory */
    assert_int_equal(ucx_rkey_unpack(p, buf, rlen, &r), KVCR_EINVAL);
    assert_null(r);
    assert_int_equal(ucx_rkey_unpack(p, rk, rlen, &r), 0);
    ucx_rkey_destroy(r);
    settle(pr.a, pr.b);
    ucx_peer_close(p);
    free(buf);
    pair_close(&pr);
}

/* ---- a second process ----------------------------------------------------- */

enum { HELPER_BUF = 1 << 20 };

static pipe_child verifier, victim;

/* The helper: a context and a registered buffer, announced to the parent,
 * then progress (the parent's writes need it) until told to verify the
 * buffer: exit 0 only if it holds the pattern. sibling (may be NULL) is a
 * helper forked before it, whose pipe ends are not this one's to hold
 * open. */
static int helper_main(int cmd, int resp, void *sibling)
{
    const pipe_child *older = sibling;
    if (older != NULL && older->pid > 0) {
        close(older->cmd);
        close(older->resp);
    }
    kvcr_logger lg;
    kvcr_logger_init(&lg, "ucx-helper", NULL, NULL);
    ucx_ctx *c;
    ucx_mem *m;
    uint8_t *buf = calloc(1, HELPER_BUF);
    if (buf == NULL || ucx_ctx_create(&lg, &c) != 0) return 2;
    if (ucx_mem_register(c, buf, HELPER_BUF, &m) != 0) return 2;
    const void *addr, *rkey;
    size_t addr_len, rkey_len;
    ucx_worker_address(c, &addr, &addr_len);
    ucx_mem_rkey(m, &rkey, &rkey_len);
    uint32_t al = (uint32_t)addr_len, rl = (uint32_t)rkey_len;
    uint64_t where = (uint64_t)(uintptr_t)buf;
    pipe_put_all(resp, &al, sizeof al);
    pipe_put_all(resp, addr, al);
    pipe_put_all(resp, &rl, sizeof rl);
    pipe_put_all(resp, rkey, rl);
    pipe_put_all(resp, &where, sizeof where);
    for (;;) {
        ucx_progress(c);
        struct pollfd fds[2] = {{cmd, POLLIN, 0}, {ucx_fd(c), POLLIN, 0}};
        bool armed = ucx_arm(c);
        poll(fds, armed ? 2 : 1, armed ? 1000 : 0);
        if (fds[0].revents == 0) continue;
        uint32_t seed = 0;
        if (!pipe_get_all(cmd, &seed, sizeof seed)) return 3; /* parent gone */
        uint8_t *want = malloc(HELPER_BUF);
        fill_pattern(want, HELPER_BUF, seed);
        int rc = memcmp(want, buf, HELPER_BUF) == 0 ? 0 : 1;
        ucx_mem_deregister(m);
        ucx_ctx_destroy(c);
        free(want);
        free(buf);
        return rc;
    }
}

typedef struct far_end {
    ucx_ctx *c;
    ucx_peer *p;
    ucx_rkey *rkey;
    uint64_t buf;
} far_end;

static void connect_helper(const pipe_child *h, far_end *r)
{
    struct pollfd pf = {h->resp, POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 10000), 1);
    uint32_t al, rl;
    uint8_t addr[8192], rkey[4096];
    assert_true(pipe_get_all(h->resp, &al, sizeof al) && al <= sizeof addr);
    assert_true(pipe_get_all(h->resp, addr, al));
    assert_true(pipe_get_all(h->resp, &rl, sizeof rl) && rl <= sizeof rkey);
    assert_true(pipe_get_all(h->resp, rkey, rl));
    assert_true(pipe_get_all(h->resp, &r->buf, sizeof r->buf));
    assert_int_equal(ucx_ctx_create(&test_log, &r->c), 0);
    assert_int_equal(ucx_peer_connect(r->c, addr, al, &r->p), 0);
    assert_int_equal(ucx_rkey_unpack(r->p, rkey, rl, &r->rkey), 0);
}

/* The helper's whole buffer in segments: 16 KiB ones in reverse order and
 * a few small odd ones, so that some merge and most do not. */
static size_t cover(const far_end *r, const uint8_t *src, ucx_seg *segs)
{
    size_t n = 0;
    for (size_t off = HELPER_BUF; off > 16384;) {
        off -= 16384;
        segs[n++] = (ucx_seg){src + off, NULL, r->buf + off, r->rkey, 16384};
    }
    static const size_t small[] = {1, 7, 4088, 1000, 11296}; /* = 16384 */
    for (size_t i = 0, off = 0; i < sizeof small / sizeof small[0]; off += small[i++])
        segs[n++] = (ucx_seg){src + off, NULL, r->buf + off, r->rkey, small[i]};
    return n;
}

static void test_second_process_receives_the_bytes(void **state)
{
    (void)state;
    far_end r;
    connect_helper(&verifier, &r);
    uint8_t *src = malloc(HELPER_BUF);
    ucx_seg *segs = malloc(128 * sizeof *segs);
    fill_pattern(src, HELPER_BUF, 77);
    size_t n = cover(&r, src, segs);
    done_rec d = {0};
    assert_int_equal(do_write(r.p, segs, n, &d), 0);
    wait_done(r.c, NULL, &d); /* the helper progresses on its own */
    assert_int_equal(d.status, 0);
    ucx_rkey_destroy(r.rkey);
    ucx_peer_close(r.p);

    uint32_t seed = 77;
    pipe_put_all(verifier.cmd, &seed, sizeof seed);
    int ws = pipe_child_reap(&verifier, false);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ucx_ctx_destroy(r.c);
    free(segs);
    free(src);
}

static void test_killed_peer_fails_later_writes_in_bounded_time(void **state)
{
    (void)state;
    far_end r;
    connect_helper(&victim, &r);
    uint8_t *src = malloc(HELPER_BUF);
    ucx_seg *segs = malloc(128 * sizeof *segs);
    fill_pattern(src, HELPER_BUF, 5);
    size_t n = cover(&r, src, segs);
    done_rec d = {0};
    assert_int_equal(do_write(r.p, segs, n, &d), 0);
    wait_done(r.c, NULL, &d);
    assert_int_equal(d.status, 0);

    assert_true(WIFSIGNALED(pipe_child_reap(&victim, true)));
    uint64_t t0 = kvcr_now_ns(), deadline = t0 + WAIT_NS;
    int writes = 0, refused = 0, failed = 0;
    while (refused + failed == 0 && kvcr_now_ns() < deadline) {
        d = (done_rec){0};
        int rc = do_write(r.p, segs, n, &d);
        writes++;
        if (rc != 0) {
            assert_int_equal(rc, KVCR_ESYS);
            refused++;
            break;
        }
        /* Every accepted write is reported, even after the peer died. */
        assert_true(progress_until(r.c, NULL, &d.calls, 1, deadline + WAIT_NS));
        assert_false(d.inside_write);
        if (d.status < 0) failed++;
    }
    double secs = kvcr_ns_to_s(kvcr_now_ns() - t0);
    print_message("  peer killed: %d writes, first failure after %.2f s (%s)\n", writes, secs,
                  failed ? "done with an error" : "refused by ucx_write");
    assert_true(refused + failed > 0);
    for (uint64_t end = kvcr_now_ns() + WAIT_NS; !ucx_peer_failed(r.p) && kvcr_now_ns() < end;)
        ucx_progress(r.c);
    assert_true(ucx_peer_failed(r.p));
    assert_int_equal(ucx_peer_busy(r.p), 0);
    ucx_rkey_destroy(r.rkey);
    uint64_t c0 = kvcr_now_ns();
    ucx_peer_close(r.p); /* forced: must not wait for the dead peer */
    assert_true(kvcr_now_ns() - c0 < 3 * SEC);
    ucx_ctx_destroy(r.c);
    free(segs);
    free(src);
}

int main(void)
{
    /* Before any UCX context exists in this process. */
    pipe_child_fork(&verifier, helper_main, NULL);
    pipe_child_fork(&victim, helper_main, &verifier);
    kvcr_logger_init(&test_log, "ucx-test", on_log, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_lands_every_byte_and_reports_once),
        cmocka_unit_test(test_big_and_many_segment_writes_land),
        cmocka_unit_test(test_writes_as_messages_land_only_through_the_sink),
        cmocka_unit_test(test_small_runs_as_messages_are_gathered_and_scattered),
        cmocka_unit_test(test_malformed_write_messages_are_dropped_and_counted),
        cmocka_unit_test(test_dropped_write_messages_show_in_the_instances_gauges),
        cmocka_unit_test(test_done_is_never_called_inside_ucx_write),
        cmocka_unit_test(test_bad_segments_are_refused_before_anything_is_posted),
        cmocka_unit_test(test_malformed_addresses_and_rkeys_fail_cleanly),
        cmocka_unit_test(test_second_process_receives_the_bytes),
        cmocka_unit_test(test_killed_peer_fails_later_writes_in_bounded_time),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* A failed test may have left a helper running: no child outlives us. */
    pipe_child_reap(&verifier, true);
    pipe_child_reap(&victim, true);
    return failed;
}
