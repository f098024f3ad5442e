/* The raw ZeroMQ round trip `kvcr-bench peer` compares a one-block deliver
 * with: two processes on loopback, each with a PULL socket bound and a PUSH
 * socket connected to the other's (the shape of KVCR's control channel), a
 * 64-byte message there and back, the median over the rounds after a
 * warm-up. Built on libzmq directly: the baseline uses no KVCR code. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "bench.h"

#define ZRT_WARMUP 20
#define ZRT_TIMEOUT_MS 5000 /* every receive bounded: a stuck peer fails the bench */
#define ZRT_MSG 64

/* A PULL socket bound on 127.0.0.1 (any port) and a PUSH socket, both
 * with bounded receives and no linger; the bound endpoint in ep. */
static void zrt_sockets(void *ctx, void **pull, void **push, char *ep, size_t cap)
{
    int ms = ZRT_TIMEOUT_MS, zero = 0;
    *pull = zmq_socket(ctx, ZMQ_PULL);
    *push = zmq_socket(ctx, ZMQ_PUSH);
    if (*pull == NULL || *push == NULL || zmq_setsockopt(*pull, ZMQ_RCVTIMEO, &ms, sizeof ms) ||
        zmq_setsockopt(*pull, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(*push, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(*push, ZMQ_SNDTIMEO, &ms, sizeof ms) ||
        zmq_bind(*pull, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(*pull, ZMQ_LAST_ENDPOINT, ep, &cap) != 0)
        bench_fail("raw ZeroMQ: sockets: %s", zmq_strerror(errno));
}

static int zrt_recv(void *pull, void *buf, size_t cap, const char *who)
{
    int n = zmq_recv(pull, buf, cap, 0);
    if (n < 0) bench_fail("raw ZeroMQ %s: receive: %s", who, zmq_strerror(errno));
    return n;
}

static void zrt_send(void *push, const void *buf, size_t len, const char *who)
{
    if (zmq_send(push, buf, len, 0) != (int)len)
        bench_fail("raw ZeroMQ %s: send: %s", who, zmq_strerror(errno));
}

/* The echo process: learns the pinger's endpoint from its first message,
 * then sends every message back until the one-byte stop. */
static _Noreturn void zrt_echo(int up)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    void *ctx = zmq_ctx_new(), *pull, *push;
    char ep[256], buf[256];
    zrt_sockets(ctx, &pull, &push, ep, sizeof ep);
    if (tool_write_full(up, ep, sizeof ep) != 0) bench_fail("raw ZeroMQ echo: parent gone");
    int n = zrt_recv(pull, buf, sizeof buf - 1, "echo");
    buf[n] = '\0';
    if (zmq_connect(push, buf) != 0) bench_fail("raw ZeroMQ echo: connect %s", buf);
    while ((n = zrt_recv(pull, buf, sizeof buf, "echo")) != 1)
        zrt_send(push, buf, (size_t)n, "echo");
    zmq_close(pull);
    zmq_close(push);
    zmq_ctx_term(ctx);
    _exit(0);
}

double bench_zmq_round_trip_s(int rounds)
{
    if (rounds < 1) bench_fail("raw ZeroMQ: no rounds");
    int p[2];
    if (pipe(p) != 0) bench_fail("pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) bench_fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(p[0]);
        zrt_echo(p[1]);
    }
    close(p[1]);
    char echo_ep[256], ep[256];
    if (tool_read_full(p[0], echo_ep, sizeof echo_ep, tool_now() + 10.0) != 0)
        bench_fail("raw ZeroMQ: the echo process did not start");
    close(p[0]);
    echo_ep[sizeof echo_ep - 1] = '\0';
    void *ctx = zmq_ctx_new(), *pull, *push;
    zrt_sockets(ctx, &pull, &push, ep, sizeof ep);
    if (zmq_connect(push, echo_ep) != 0) bench_fail("raw ZeroMQ: connect %s", echo_ep);
    zrt_send(push, ep, strlen(ep), "pinger");
    double *t = malloc((size_t)rounds * sizeof *t);
    if (t == NULL) bench_fail("out of memory");
    uint8_t msg[ZRT_MSG], back[ZRT_MSG];
    for (int r = -ZRT_WARMUP; r < rounds; r++) {
        memset(msg, r & 0xff, sizeof msg);
        double t0 = tool_now();
        zrt_send(push, msg, sizeof msg, "pinger");
        if (zrt_recv(pull, back, sizeof back, "pinger") != ZRT_MSG || memcmp(msg, back, ZRT_MSG))
            bench_fail("raw ZeroMQ: the echo sent other bytes back");
        if (r >= 0) t[r] = tool_now() - t0;
    }
    zrt_send(push, "s", 1, "pinger");
    zmq_close(pull);
    zmq_close(push);
    zmq_ctx_term(ctx);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        bench_fail("raw ZeroMQ: the echo process failed (status %d)", status);
    double median = bench_median(t, (size_t)rounds);
    free(t);
    return median;
}
