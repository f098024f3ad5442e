/* kvcr demo: block naming and contents, and the framed messages on the
 * pipes between the driver, the router and the engines. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

/* splitmix64's finaliser. */
uint64_t demo_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t demo_chain(uint64_t prev, uint64_t chunk)
{
    return demo_mix(prev ^ demo_mix(chunk ^ 0x6b76637220626c6bull));
}

uint64_t demo_rand(uint64_t *state)
{
    *state += 0x9E3779B97F4A7C15ull;
    return demo_mix(*state);
}

static uint64_t pattern_seed(uint64_t hash)
{
    uint64_t x = demo_mix(hash ^ 0x5eed5eed5eed5eedull);
    return x ? x : 1; /* xorshift must not start at 0 */
}

void demo_fill(uint8_t *p, size_t size, uint64_t hash)
{
    uint64_t x = pattern_seed(hash);
    for (size_t i = 0; i < size / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i * 8, &x, 8);
    }
}

uint64_t demo_verify(const uint8_t *p, size_t size, uint64_t hash)
{
    uint64_t x = pattern_seed(hash), wrong = 0;
    for (size_t i = 0; i < size / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t w;
        memcpy(&w, p + i * 8, 8);
        if (w == x) continue;
        for (uint64_t d = w ^ x; d != 0; d >>= 8) wrong += (d & 0xff) != 0;
    }
    return wrong;
}

/* ---- messages ---------------------------------------------------------------- */

typedef struct hdr {
    uint32_t type, len;
} hdr;

int demo_send(int fd, uint32_t type, const void *a, size_t alen, const void *b, size_t blen)
{
    if (alen + blen > DEMO_MSG_MAX) {
        errno = EMSGSIZE;
        return -1;
    }
    /* One write when it fits, so a message is never interleaved with a
     * partial one even if a reader gives up half way. */
    static _Thread_local uint8_t buf[sizeof(hdr) + DEMO_MSG_MAX];
    hdr h = {type, (uint32_t)(alen + blen)};
    memcpy(buf, &h, sizeof h);
    if (alen) memcpy(buf + sizeof h, a, alen);
    if (blen) memcpy(buf + sizeof h + alen, b, blen);
    return tool_write_full(fd, buf, sizeof h + alen + blen);
}

int demo_recv(int fd, uint32_t *type, void *buf, size_t cap, size_t *len, double deadline)
{
    hdr h;
    if (tool_read_full(fd, &h, sizeof h, deadline) != 0) return -1;
    if (h.len > cap) {
        errno = EMSGSIZE;
        return -1;
    }
    if (h.len > 0 && tool_read_full(fd, buf, h.len, deadline) != 0) return -1;
    *type = h.type;
    *len = h.len;
    return 0;
}

int demo_send_fds(int sock, int32_t engine, int fd0, int fd1)
{
    int fds[2] = {fd0, fd1};
    char ctl[CMSG_SPACE(sizeof fds)];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {&engine, sizeof engine};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t n;
    do n = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof engine ? 0 : -1;
}

int demo_recv_fds(int sock, int32_t *engine, int *fd0, int *fd1)
{
    char ctl[CMSG_SPACE(2 * sizeof(int))];
    struct iovec iov = {engine, sizeof *engine};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = sizeof ctl};
    ssize_t n;
    do n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    int fds[2] = {-1, -1}, got = 0;
    struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        if (got > 2) got = 2; /* cannot be: ctl holds two (MSG_CTRUNC otherwise) */
        memcpy(fds, CMSG_DATA(c), (size_t)got * sizeof(int));
    }
    if (got != 2 || n != (ssize_t)sizeof *engine || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < got; i++) close(fds[i]); /* nothing of an odd message is kept */
        errno = n == 0 ? EPIPE : EPROTO;
        return -1;
    }
    *fd0 = fds[0];
    *fd1 = fds[1];
    return 0;
}

void demo_kv_endpoints(const demo_opts *o, int e, char *pub, size_t pub_len, char *sub,
                       size_t sub_len, char *replay, size_t replay_len)
{
    snprintf(pub, pub_len, "tcp://*:%u", (unsigned)o->kv_pub_port[e]);
    snprintf(sub, sub_len, "tcp://%s:%u", o->hosts ? o->engine_addr[e] : "127.0.0.1",
             (unsigned)o->kv_pub_port[e]);
    snprintf(replay, replay_len, "tcp://%s:%u", o->hosts ? o->engine_addr[e] : "127.0.0.1",
             (unsigned)o->kv_replay_port[e]);
}

void demo_child_setup(int driver_pid)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != driver_pid) _exit(1); /* the driver died before we got here */
    signal(SIGPIPE, SIG_IGN);
    /* A terminal's ^C or hang-up is the driver's to handle (--chaos cleans
     * up first); the children end with it. */
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGTERM, SIG_DFL); /* not the driver's --chaos handler */
}
