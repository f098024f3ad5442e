#define _GNU_SOURCE /* setns, ppoll */
#include "netrig_fwd.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "netrig.h"

/* Frames waiting at once: at 1500 bytes, 2048 frames in 1 ms is 3 GB/s,
 * more than these links carry; the bound keeps the forwarder at ~4 MiB. */
#define FWD_QUEUE 2048
/* A TAP without IFF_VNET_HDR hands over frames already segmented to the
 * MTU (1500 + a 14-byte header, 18 with a VLAN tag). */
#define FWD_FRAME 2048
#define ETH_ALEN_ 6

typedef struct frame {
    uint64_t due; /* CLOCK_MONOTONIC ns */
    uint16_t len;
    uint8_t from;
    uint8_t data[FWD_FRAME];
} frame;

typedef struct fwd {
    unsigned n;
    uint64_t delay_ns;
    int tap[NETRIG_MAX_HOSTS]; /* -1 once the host is gone */
    bool up[NETRIG_MAX_HOSTS];
    bool known[NETRIG_MAX_HOSTS]; /* mac[h] learnt from h's frames */
    uint8_t mac[NETRIG_MAX_HOSTS][ETH_ALEN_];
    frame *q; /* FIFO ring: every frame waits the same delay, so order is kept */
    unsigned head, count;
    frame spare; /* where a frame over the bound is read, to be dropped */
    uint64_t dropped;
} fwd;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The TAP "eth0" in the namespace of the keeper behind pidfd: its fd, or
 * -errno. The tun device belongs to the namespace /dev/net/tun was opened
 * in; the forwarder returns to its own (home) afterwards. */
static int open_tap(int pidfd, int home)
{
    if (setns(pidfd, CLONE_NEWNET) != 0) return -errno;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
        strcpy(ifr.ifr_name, "eth0");
        if (ioctl(fd, TUNSETIFF, &ifr) != 0) err = errno;
    }
    if (setns(home, CLONE_NEWNET) != 0 && err == 0) err = errno;
    if (err == 0) return fd;
    if (fd >= 0) close(fd);
    return -err;
}

/* Reads what host h sent (at most 64 frames a turn, so one busy host does
 * not starve the rest) into the queue. */
static void take(fwd *f, unsigned h)
{
    for (int i = 0; i < 64; i++) {
        frame *slot = f->count < FWD_QUEUE ? &f->q[(f->head + f->count) % FWD_QUEUE] : &f->spare;
        ssize_t len = read(f->tap[h], slot->data, sizeof slot->data);
        if (len < 0) return;
        if (slot == &f->spare) f->dropped++;
        if (slot == &f->spare || !f->up[h] || len < 2 * ETH_ALEN_) continue;
        memcpy(f->mac[h], slot->data + ETH_ALEN_, ETH_ALEN_);
        f->known[h] = true;
        slot->len = (uint16_t)len;
        slot->from = (uint8_t)h;
        slot->due = now_ns() + f->delay_ns;
        f->count++;
    }
}

/* Hands fr to its destination: the host whose MAC it names, or every other
 * host for a broadcast, a multicast or a MAC not learnt yet (a stack drops
 * unicast frames not for it). Hosts down or gone get nothing. */
static void pass(fwd *f, const frame *fr)
{
    bool group = fr->data[0] & 1;
    for (unsigned h = 0; h < f->n; h++) {
        if (h == fr->from || f->tap[h] < 0 || !f->up[h]) continue;
        if (!group && f->known[h] && memcmp(f->mac[h], fr->data, ETH_ALEN_) != 0) continue;
        if (write(f->tap[h], fr->data, fr->len) != fr->len) f->dropped++;
    }
}

/* Waits for frames, link messages and keepers' exits until ctl ends. */
static void serve(fwd *f, int ctl, const int *pidfd)
{
    struct pollfd p[1 + 2 * NETRIG_MAX_HOSTS];
    unsigned n = f->n;
    for (;;) {
        p[0] = (struct pollfd){.fd = ctl, .events = POLLIN};
        for (unsigned h = 0; h < n; h++) {
            p[1 + h] = (struct pollfd){.fd = f->tap[h], .events = POLLIN};
            p[1 + n + h] = (struct pollfd){.fd = f->tap[h] < 0 ? -1 : pidfd[h], .events = POLLIN};
        }
        struct timespec ts, *wait = NULL;
        if (f->count) {
            uint64_t now = now_ns(), due = f->q[f->head].due;
            uint64_t left = due > now ? due - now : 0;
            ts = (struct timespec){.tv_sec = (time_t)(left / 1000000000u),
                                   .tv_nsec = (long)(left % 1000000000u)};
            wait = &ts;
        }
        if (ppoll(p, 1 + 2 * n, wait, NULL) < 0 && errno != EINTR) return;
        if (p[0].revents) {
            uint8_t m[2];
            ssize_t k = read(ctl, m, sizeof m);
            if (k <= 0 && !(k < 0 && errno == EINTR)) return;
            if (k == 2 && m[0] < n) f->up[m[0]] = m[1] != 0;
        }
        for (unsigned h = 0; h < n; h++) {
            bool gone = p[1 + n + h].revents || (p[1 + h].revents & (POLLERR | POLLHUP | POLLNVAL));
            if (gone && f->tap[h] >= 0) {
                close(f->tap[h]);
                f->tap[h] = -1;
            } else if (p[1 + h].revents & POLLIN) {
                take(f, h);
            }
        }
        uint64_t now = now_ns();
        while (f->count && f->q[f->head].due <= now) {
            pass(f, &f->q[f->head]);
            f->head = (f->head + 1) % FWD_QUEUE;
            f->count--;
        }
    }
}

_Noreturn void netrig_fwd_run(unsigned n_hosts, const int *keeper_pidfd, uint32_t delay_us,
                              int ctl, int ready)
{
    /* A delay of 1 ms is worth keeping to the microsecond: no timer slack. */
    prctl(PR_SET_TIMERSLACK, 1UL);
    static fwd f; /* this process's only one; the spare frame is big */
    f.n = n_hosts;
    f.delay_ns = (uint64_t)delay_us * 1000u;
    f.q = calloc(FWD_QUEUE, sizeof *f.q);
    netrig_fwd_ready r = {f.q ? 0 : ENOMEM, -1};
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0 && r.err == 0) r.err = errno;
    for (unsigned h = 0; h < n_hosts; h++) {
        f.tap[h] = -1;
        f.up[h] = true;
        if (r.err) continue;
        int fd = open_tap(keeper_pidfd[h], home);
        if (fd < 0) r = (netrig_fwd_ready){-fd, (int)h};
        f.tap[h] = fd;
    }
    if (write(ready, &r, sizeof r) != (ssize_t)sizeof r || r.err) _exit(1);
    close(ready);
    serve(&f, ctl, keeper_pidfd);
    if (f.dropped)
        fprintf(stderr, "netrig: the forwarder dropped %llu frames (over %d waiting, or a TAP full)\n",
                (unsigned long long)f.dropped, FWD_QUEUE);
    _exit(0);
}
