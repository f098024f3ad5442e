/* Links that drop while UCX sets up a TCP connection (net/ucx.h), between
 * two hosts of the netns rig (tools/netrig.h, 10 ms each way): a survivor
 * on host 0 must go on serving. UCX 1.13 aborts a process whose TCP
 * connection fails during set-up (docs/ARCHITECTURE.md "Peer failures over
 * TCP"), so with it the rounds are skipped, saying why; root only (exit 77
 * without it, as the rig's other tests).
 *
 * Each round a connector on host 1 makes its endpoint to the survivor and
 * writes to it; host 1 is partitioned after an offset from 0 to 60 ms
 * (the set-up takes a few 20 ms round trips), then either healed 300 ms
 * later with the connector alive (its write ends, well or not), or the
 * connector is killed behind the partition and the link healed at once (the
 * survivor's UCX, answering it, meets a host without it). Then a fresh
 * connector and the survivor write to each other, bytes compared.
 *
 * This process makes no UCX context: the survivor and the connectors are
 * forked children that join their rig host, then make their own. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "pipes.h"
#include "net/ucx.h"
#include "netrig.h"
#include "util/clock.h"

#define SEC 1000000000ull
#define ROUNDS 14
#define DELAY_US 10000   /* each way */
#define BUF (256u << 10) /* each side's registered buffer */
#define MSG 4096         /* what a connector writes in a round */

/* ---- pipes ------------------------------------------------------------------ */

/* Reads n bytes within ms: false on end of file, error or time out. */
static bool get_within(int fd, void *p, size_t n, int ms)
{
    uint64_t end = kvcr_now_ns() + (uint64_t)ms * 1000000u;
    for (size_t done = 0; done < n;) {
        uint64_t now = kvcr_now_ns();
        if (now >= end) return false;
        struct pollfd pf = {fd, POLLIN, 0};
        int left = (int)((end - now) / 1000000u) + 1;
        if (poll(&pf, 1, left) < 0 && errno != EINTR) return false;
        if (pf.revents == 0) continue;
        ssize_t r = read(fd, (char *)p + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        done += (size_t)r;
    }
    return true;
}

/* What one side tells another to reach it. */
typedef struct card {
    uint32_t addr_len, rkey_len;
    uint8_t addr[8192], rkey[4096];
    uint64_t buf;
} card;

/* ---- one side: a context, a registered buffer, a sink into it ------------- */

typedef struct side {
    ucx_ctx *c;
    ucx_mem *m;
    uint8_t *buf;
} side;

/* The sink of writes sent as messages (TCP alone: every write): copies a
 * run that lies inside the buffer. The side's own (progress) thread. */
static bool sink(void *arg, uint64_t tag, uint64_t addr, const void *data, size_t len)
{
    (void)tag;
    side *s = arg;
    uint64_t base = (uint64_t)(uintptr_t)s->buf;
    if (addr < base || len > BUF || addr - base > BUF - len) return false;
    memcpy(s->buf + (addr - base), data, len);
    return true;
}

static void side_open(side *s, card *k)
{
    static kvcr_logger lg;
    kvcr_logger_init(&lg, "rig-side", NULL, NULL);
    if (ucx_ctx_create(&lg, &s->c) != 0 || ucx_mem_alloc(s->c, BUF, &s->m) != 0) _exit(2);
    s->buf = ucx_mem_addr(s->m);
    memset(s->buf, 0, BUF);
    ucx_set_sink(s->c, sink, s);
    const void *a, *r;
    size_t al, rl;
    ucx_worker_address(s->c, &a, &al);
    ucx_mem_rkey(s->m, &r, &rl);
    if (al > sizeof k->addr || rl > sizeof k->rkey) _exit(2);
    k->addr_len = (uint32_t)al;
    k->rkey_len = (uint32_t)rl;
    memcpy(k->addr, a, al);
    memcpy(k->rkey, r, rl);
    k->buf = (uint64_t)(uintptr_t)s->buf;
}

typedef struct done_rec {
    int calls, status;
} done_rec;

static void on_done(void *ud, int status)
{
    done_rec *d = ud;
    d->calls++;
    d->status = status;
}

/* Connects to far and writes len bytes of pattern seed to its buffer: 0
 * once the write is done well, else non-zero. */
static int write_pattern(side *s, const card *far, uint32_t seed, size_t len, done_rec *d)
{
    ucx_peer *p;
    ucx_rkey *rk;
    if (ucx_peer_connect(s->c, far->addr, far->addr_len, &p) != 0) return 1;
    if (ucx_rkey_unpack(p, far->rkey, far->rkey_len, &rk) != 0) return 1;
    uint8_t *src = malloc(len);
    fill_pattern(src, len, seed);
    ucx_seg seg = {src, NULL, far->buf, rk, len};
    if (ucx_write(p, &seg, 1, 0, on_done, d) != 0) return 1;
    for (uint64_t end = kvcr_now_ns() + 30 * SEC; d->calls == 0 && kvcr_now_ns() < end;)
        ucx_progress(s->c);
    free(src); /* done was called: UCX reads it no more; or we exit now */
    if (d->calls == 0) _exit(7);
    return d->status != 0;
}

/* Progresses s until its buffer holds pattern seed over len bytes. */
static int wait_pattern(side *s, uint32_t seed, size_t len)
{
    uint8_t *want = malloc(len);
    fill_pattern(want, len, seed);
    for (uint64_t end = kvcr_now_ns() + 30 * SEC;
         memcmp(want, s->buf, len) != 0 && kvcr_now_ns() < end;)
        ucx_progress(s->c);
    int rc = memcmp(want, s->buf, len) != 0;
    free(want);
    return rc;
}

/* ---- the processes ---------------------------------------------------------- */

static netrig *g_rig;

/* What a helper runs, and on which rig host. */
typedef struct on_host {
    unsigned host;
    int (*fn)(int cmd, int resp);
} on_host;

static int run_on_host(int cmd, int resp, void *arg)
{
    const on_host *h = arg;
    if (netrig_join(g_rig, h->host) != 0) return 5;
    return h->fn(cmd, resp);
}

/* Forks fn on rig host `host` with two pipes to it; fn's result is its
 * exit status. */
static void fork_on(pipe_child *ch, unsigned host, int (*fn)(int cmd, int resp))
{
    on_host h = {host, fn};
    pipe_child_fork(ch, run_on_host, &h);
}

/* The survivor: sends its card, then progresses until told a seed and a
 * card; writes that pattern to the card's buffer, waits for the next
 * pattern in its own, and answers 0 if both held. */
static int survivor(int cmd, int resp)
{
    side s;
    static card mine, far;
    side_open(&s, &mine);
    pipe_put_all(resp, &mine, sizeof mine);
    for (;;) {
        ucx_progress(s.c);
        struct pollfd fds[2] = {{cmd, POLLIN, 0}, {ucx_fd(s.c), POLLIN, 0}};
        bool armed = ucx_arm(s.c);
        poll(fds, armed ? 2 : 1, armed ? 100 : 0);
        if (fds[0].revents != 0) break;
    }
    uint32_t seed;
    if (!get_within(cmd, &seed, sizeof seed, 1000) || !get_within(cmd, &far, sizeof far, 1000))
        return 3;
    done_rec d = {0};
    int rc = write_pattern(&s, &far, seed, BUF, &d) != 0 ? 1 : wait_pattern(&s, seed + 1, BUF);
    pipe_put_all(resp, &rc, sizeof rc);
    return rc;
}

/* A connector: told the survivor's card, makes its endpoint to it and
 * writes MSG bytes, says so ('c'), progresses until the write is done and
 * answers its status, then progresses until killed. */
static int connector(int cmd, int resp)
{
    static card far;
    if (!get_within(cmd, &far, sizeof far, 30000)) return 3;
    side s;
    static card mine;
    side_open(&s, &mine);
    ucx_peer *p;
    ucx_rkey *rk;
    if (ucx_peer_connect(s.c, far.addr, far.addr_len, &p) != 0 ||
        ucx_rkey_unpack(p, far.rkey, far.rkey_len, &rk) != 0)
        return 2;
    static uint8_t src[MSG];
    fill_pattern(src, MSG, 3);
    done_rec d = {0};
    ucx_seg seg = {src, NULL, far.buf, rk, MSG};
    if (ucx_write(p, &seg, 1, 0, on_done, &d) != 0) return 2;
    pipe_put_all(resp, "c", 1);
    while (d.calls == 0) ucx_progress(s.c);
    pipe_put_all(resp, &d.status, sizeof d.status);
    for (;;) ucx_progress(s.c);
}

/* The last connector: sends its card, is told the survivor's and a seed,
 * writes the next pattern to the survivor, waits for the seed's pattern in
 * its own buffer, and answers 0 if both held. */
static int partner(int cmd, int resp)
{
    side s;
    static card mine, far;
    side_open(&s, &mine);
    pipe_put_all(resp, &mine, sizeof mine);
    uint32_t seed;
    if (!get_within(cmd, &far, sizeof far, 30000) || !get_within(cmd, &seed, sizeof seed, 1000))
        return 3;
    done_rec d = {0};
    int rc = write_pattern(&s, &far, seed + 1, BUF, &d) != 0 ? 1 : wait_pattern(&s, seed, BUF);
    pipe_put_all(resp, &rc, sizeof rc);
    return rc;
}

/* ---- the test --------------------------------------------------------------- */

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void test_survivor_serves_after_links_drop_during_setup(void **state)
{
    (void)state;
    if (getenv("KVCR_TEST_UCX_TCP_SETUP_ABORTS") != NULL) {
        print_message("skipped: over TCP, this UCX aborts a process whose link to a peer drops "
                      "while UCX sets up the connection (docs/ARCHITECTURE.md, \"Peer failures "
                      "over TCP\")\n");
        skip();
    }
    char why[320];
    netrig_opts o = {.n_hosts = 2, .delay_us = DELAY_US};
    if (netrig_up(&o, &g_rig, why, sizeof why) != 0) fail_msg("netrig_up: %s", why);
    pipe_child surv;
    static card surv_card;
    fork_on(&surv, 0, survivor);
    assert_true(get_within(surv.resp, &surv_card, sizeof surv_card, 30000));
    int healed_ok = 0, healed_failed = 0, killed = 0;
    for (unsigned r = 0; r < ROUNDS; r++) {
        pipe_child c;
        fork_on(&c, 1, connector);
        pipe_put_all(c.cmd, &surv_card, sizeof surv_card);
        char got = 0;
        assert_true(get_within(c.resp, &got, 1, 30000));
        assert_int_equal(got, 'c');
        /* The cut falls somewhere in the set-up: the outcome must not
         * depend on where (this delay places it; it orders nothing the
         * test asserts). */
        sleep_ms(10 * (r / 2));
        assert_int_equal(netrig_partition(g_rig, 1, true), 0);
        if (r % 2 == 0) {
            sleep_ms(300); /* the partition's length, not a wait: either outcome is counted */
            assert_int_equal(netrig_partition(g_rig, 1, false), 0);
            int status = 1;
            assert_true(get_within(c.resp, &status, sizeof status, 60000)); /* it ended */
            status == 0 ? healed_ok++ : healed_failed++;
            pipe_child_reap(&c, true);
        } else {
            assert_true(WIFSIGNALED(pipe_child_reap(&c, true)));
            assert_int_equal(netrig_partition(g_rig, 1, false), 0);
            killed++;
        }
        assert_int_equal(waitpid(surv.pid, NULL, WNOHANG), 0); /* the survivor lives */
    }
    print_message("  %d links healed (writes: %d done, %d failed), %d connectors killed behind "
                  "the partition\n",
                  healed_ok + healed_failed, healed_ok, healed_failed, killed);
    pipe_child last;
    static card last_card;
    fork_on(&last, 1, partner);
    assert_true(get_within(last.resp, &last_card, sizeof last_card, 30000));
    uint32_t seed = 61;
    pipe_put_all(last.cmd, &surv_card, sizeof surv_card);
    pipe_put_all(last.cmd, &seed, sizeof seed);
    pipe_put_all(surv.cmd, &seed, sizeof seed);
    pipe_put_all(surv.cmd, &last_card, sizeof last_card);
    int rc_last = -1, rc_surv = -1;
    assert_true(get_within(last.resp, &rc_last, sizeof rc_last, 60000));
    assert_true(get_within(surv.resp, &rc_surv, sizeof rc_surv, 60000));
    assert_int_equal(rc_last, 0); /* it got the survivor's bytes, and wrote its own */
    assert_int_equal(rc_surv, 0); /* the survivor got them, and wrote its own */
    int ws = pipe_child_reap(&surv, false);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    pipe_child_reap(&last, true);
    netrig_down(g_rig);
    g_rig = NULL;
}

int main(void)
{
    char why[320];
    if (!netrig_available(why, sizeof why)) {
        printf("skipped: %s\n", why);
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_survivor_serves_after_links_drop_during_setup),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    netrig_down(g_rig); /* a failed test left it up */
    return failed;
}
