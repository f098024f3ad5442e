/* The netns rig (tools/netrig.h): hosts with their own hostname, IPC and
 * network namespaces and no default route, reachable from each other and
 * from nothing in this process's namespace, joined by exec or by a forked
 * child alike; TCP between them with bytes compared; a 1 ms delay each way
 * making round trips of 2 ms or more; a rate holding; a loss fraction
 * holding; partition, link down and loss stopping traffic and their end
 * restoring it; a killed host taking its processes with it; and nothing
 * left after netrig_down, nor after the rig's process dies of SIGKILL or
 * SIGINT.
 *
 * The processes on the hosts are this program again (/proc/self/exe with a
 * mode: serve, client, info, udpsend, udprecv), so the test needs nothing else installed.
 * Without root (or namespaces) it exits 77, which ctest reports as skipped
 * with the reason. Every wait is bounded and every child reaped. */
#define _GNU_SOURCE /* pipe2 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "netrig.h"

#define PORT "7100"
#define WAIT_MS 5000
#define EXIT_NO_CONNECT 2 /* the client's exit code when it could not connect in time */

static char self_exe[4096];

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- the modes run on the hosts ------------------------------------------ */

/* *sa = addr:port: 0, or -1 for an address that is not IPv4's. */
static int sockaddr_of(const char *addr, const char *port, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(port));
    return inet_pton(AF_INET, addr, &sa->sin_addr) == 1 ? 0 : -1;
}

static int tcp_socket(const char *addr, const char *port, struct sockaddr_in *sa)
{
    if (sockaddr_of(addr, port, sa) != 0) return -1;
    return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
}

/* serve <addr> <port>: echoes every connection, one at a time, until
 * killed (60 s at most, in case the test could not kill it). */
static int mode_serve(char **argv)
{
    alarm(60);
    struct sockaddr_in sa;
    int l = tcp_socket(argv[2], argv[3], &sa), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(l, 16) != 0) {
        perror("serve");
        return 4;
    }
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0) continue;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[65536];
        for (ssize_t k; (k = read(c, buf, sizeof buf)) > 0;)
            if (write(c, buf, (size_t)k) != k) break;
        close(c);
    }
}

/* A connected socket to addr:port within ms (a refused connect is retried:
 * the server may not listen yet), or -1. */
static int connect_within(const char *addr, const char *port, int ms)
{
    double end = now_ms() + ms;
    while (now_ms() < end) {
        struct sockaddr_in sa;
        int s = tcp_socket(addr, port, &sa);
        fcntl(s, F_SETFL, O_NONBLOCK);
        int rc = connect(s, (struct sockaddr *)&sa, sizeof sa), err = 0;
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = s, .events = POLLOUT};
            int left = (int)(end - now_ms());
            socklen_t len = sizeof err;
            if (left <= 0 || poll(&p, 1, left) != 1) err = ETIMEDOUT;
            else getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
        } else if (rc != 0) {
            err = errno;
        }
        if (!err) {
            fcntl(s, F_SETFL, 0);
            return s;
        }
        close(s);
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    return -1;
}

static int read_n(int s, uint8_t *buf, size_t n)
{
    for (size_t at = 0; at < n;) {
        ssize_t k = read(s, buf + at, n - at);
        if (k <= 0) return -1;
        at += (size_t)k;
    }
    return 0;
}

/* client <addr> <port> <bytes> <out fd> <connect ms>: sends bytes (a
 * pattern, in 64 KiB rounds) and compares the echo, then times 20 one-byte
 * round trips; writes "rtt_us=<min> xfer_us=<the bytes' time>" to the fd. Exit 0, EXIT_NO_CONNECT,
 * 3 (wrong bytes) or 4 (an I/O error). */
static int mode_client(char **argv)
{
    alarm(30);
    size_t bytes = (size_t)atol(argv[4]);
    int out = atoi(argv[5]);
    int s = connect_within(argv[2], argv[3], atoi(argv[6]));
    if (s < 0) return EXIT_NO_CONNECT;
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static uint8_t tx[65536], rx[65536];
    double t0 = now_ms();
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < sizeof tx ? bytes - done : sizeof tx;
        for (size_t i = 0; i < n; i++) tx[i] = (uint8_t)((done + i) * 131 + 7);
        if (write(s, tx, n) != (ssize_t)n || read_n(s, rx, n) != 0) return 4;
        if (memcmp(tx, rx, n) != 0) return 3;
        done += n;
    }
    double xfer = now_ms() - t0, best = 1e9;
    for (int i = 0; i < 20; i++) {
        double t1 = now_ms();
        if (write(s, "x", 1) != 1 || read_n(s, rx, 1) != 0) return 4;
        double t = now_ms() - t1;
        if (t < best) best = t;
    }
    dprintf(out, "rtt_us=%ld xfer_us=%ld\n", (long)(best * 1000), (long)(xfer * 1000));
    close(s);
    return 0;
}

/* udprecv <addr> <port> <out fd>: counts the datagrams that arrive until
 * none has for 0.5 s (after the first, or 5 s without any) and writes
 * "got=<n>" to the fd. */
static int mode_udprecv(char **argv)
{
    alarm(30);
    struct sockaddr_in sa;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), big = 8 << 20;
    if (s < 0 || sockaddr_of(argv[2], argv[3], &sa) != 0) return 4;
    /* Room for every datagram: what is lost is the rig's loss, not ours. */
    setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0) return 4;
    int out = atoi(argv[4]), got = 0;
    dprintf(out, "ready\n");
    for (;;) {
        struct pollfd p = {.fd = s, .events = POLLIN};
        char buf[64];
        if (poll(&p, 1, got ? 500 : 5000) != 1 || recv(s, buf, sizeof buf, 0) < 0) break;
        got++;
    }
    dprintf(out, "got=%d\n", got);
    return 0;
}

/* udpsend <addr> <port> <n>: n datagrams of 32 bytes, paced (10 per 0.1 ms). */
static int mode_udpsend(char **argv)
{
    alarm(30);
    struct sockaddr_in sa;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), n = atoi(argv[4]);
    if (s < 0 || sockaddr_of(argv[2], argv[3], &sa) != 0) return 4;
    char buf[32] = "datagram";
    for (int i = 0; i < n; i++) {
        if (sendto(s, buf, sizeof buf, 0, (struct sockaddr *)&sa, sizeof sa) != sizeof buf) return 4;
        if (i % 10 == 9) nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    return 0;
}

static long ns_inode(const char *pid, const char *ns)
{
    char path[300];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, ns);
    return stat(path, &st) == 0 ? (long)st.st_ino : -1;
}

/* Whether this namespace has a default route (/proc/net/route is the
 * reader's namespace's table; destination 00000000 is the default). */
static int has_default_route(void)
{
    FILE *f = fopen("/proc/net/route", "r");
    if (!f) return -1;
    char line[256], ifname[32];
    unsigned dest;
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%31s %x", ifname, &dest) == 2 && dest == 0) found = 1;
    fclose(f);
    return found;
}

/* info <out fd>: "host=<hostname> ipc=<inode> net=<inode> default=<0|1>". */
static int mode_info(char **argv)
{
    char host[64] = "";
    gethostname(host, sizeof host);
    dprintf(atoi(argv[2]), "host=%s ipc=%ld net=%ld default=%d\n", host, ns_inode("self", "ipc"),
            ns_inode("self", "net"), has_default_route());
    return 0;
}

/* ---- the test's side --------------------------------------------------------- */

/* Waits for child pid (ms at most, then SIGKILL): its wait status. */
static int reap_within(pid_t pid, int ms)
{
    int st = 0;
    double end = now_ms() + ms;
    for (;;) {
        pid_t got = waitpid(pid, &st, WNOHANG);
        if (got == pid) return st;
        if (got < 0) return -1;
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

static pid_t spawn(netrig *r, unsigned host, char *const argv[])
{
    pid_t pid = netrig_spawn(r, host, argv, NULL);
    if (pid < 0) fprintf(stderr, "spawn: %s\n", netrig_last_error(r));
    assert_true(pid > 0);
    return pid;
}

static pid_t start_server(netrig *r, unsigned host)
{
    char *argv[] = {self_exe, "serve", (char *)netrig_addr(r, host), PORT, NULL};
    return spawn(r, host, argv);
}

typedef struct timing {
    long rtt_us, xfer_us; /* the best round trip; the time of the bytes' echo */
} timing;

/* Runs the client on host from to host to's server: its exit code, and in
 * *t (unless NULL) what it measured. */
static int run_client(netrig *r, unsigned from, unsigned to, size_t bytes, int connect_ms,
                      timing *t)
{
    int p[2];
    assert_int_equal(pipe(p), 0); /* inherited by the client: its report */
    char nbytes[24], fd[12], ms[12];
    snprintf(nbytes, sizeof nbytes, "%zu", bytes);
    snprintf(fd, sizeof fd, "%d", p[1]);
    snprintf(ms, sizeof ms, "%d", connect_ms);
    char *argv[] = {self_exe, "client", (char *)netrig_addr(r, to), PORT, nbytes, fd, ms, NULL};
    pid_t pid = spawn(r, from, argv);
    close(p[1]);
    int st = reap_within(pid, connect_ms + 15000);
    char out[64] = "";
    struct pollfd pl = {.fd = p[0], .events = POLLIN};
    if (poll(&pl, 1, 0) == 1 && read(p[0], out, sizeof out - 1) < 0) out[0] = 0;
    close(p[0]);
    if (t && sscanf(out, "rtt_us=%ld xfer_us=%ld", &t->rtt_us, &t->xfer_us) != 2)
        *t = (timing){-1, -1};
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct info {
    char host[64];
    long ipc, net;
    int dflt;
} info;

static info host_info(netrig *r, unsigned host)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    char fd[12];
    snprintf(fd, sizeof fd, "%d", p[1]);
    char *argv[] = {self_exe, "info", fd, NULL};
    pid_t pid = spawn(r, host, argv);
    close(p[1]);
    int st = reap_within(pid, WAIT_MS);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char out[256] = "";
    assert_true(read(p[0], out, sizeof out - 1) > 0);
    close(p[0]);
    info i;
    assert_int_equal(sscanf(out, "host=%63s ipc=%ld net=%ld default=%d", i.host, &i.ipc, &i.net,
                            &i.dflt),
                     4);
    return i;
}

static netrig *rig_of(const netrig_opts *o)
{
    netrig *r;
    char why[400];
    int rc = netrig_up(o, &r, why, sizeof why);
    if (rc != 0) fprintf(stderr, "netrig_up: %s\n", why);
    assert_int_equal(rc, 0);
    return r;
}

static netrig *rig_up(unsigned n, uint32_t delay_us)
{
    return rig_of(&(netrig_opts){.n_hosts = n, .delay_us = delay_us});
}

/* Asserts that a netrig call (its result rc) succeeded, printing why not. */
static void rig_ok(netrig *r, int rc)
{
    if (rc != 0) fprintf(stderr, "netrig: %s\n", netrig_last_error(r));
    assert_int_equal(rc, 0);
}

static void stop_server(pid_t pid)
{
    kill(pid, SIGKILL);
    assert_true(reap_within(pid, WAIT_MS) >= 0);
}

/* The names of this namespace's interfaces, sorted by index, in buf. */
static void root_interfaces(char *buf, size_t cap)
{
    struct if_nameindex *ifs = if_nameindex();
    assert_non_null(ifs);
    size_t at = 0;
    buf[0] = 0;
    for (struct if_nameindex *i = ifs; i->if_index && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%u:%s ", i->if_index, i->if_name);
    if_freenameindex(ifs);
}

/* The names under /run/netns (`ip netns` entries), in buf. */
static void named_netns(char *buf, size_t cap)
{
    buf[0] = 0;
    DIR *d = opendir("/run/netns");
    if (!d) return;
    size_t at = 0;
    for (struct dirent *e; (e = readdir(d)) && at < cap;)
        if (e->d_name[0] != '.') at += (size_t)snprintf(buf + at, cap - at, "%s ", e->d_name);
    closedir(d);
}

/* Whether an address of 198.18.0.0/15 is on an interface of this namespace. */
static bool rig_address_here(void)
{
    struct ifaddrs *all, *a;
    bool found = false;
    assert_int_equal(getifaddrs(&all), 0);
    for (a = all; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
        uint32_t ip = ntohl(((struct sockaddr_in *)a->ifa_addr)->sin_addr.s_addr);
        if ((ip >> 17) == (0xC6120000u >> 17)) found = true;
    }
    freeifaddrs(all);
    return found;
}

/* The number of processes in the network namespaces of the inodes nets. */
static int processes_in(const long *nets, size_t n)
{
    int found = 0;
    DIR *d = opendir("/proc");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (atoi(e->d_name) <= 0) continue;
        long net = ns_inode(e->d_name, "net");
        for (size_t i = 0; i < n; i++) found += net == nets[i];
    }
    closedir(d);
    return found;
}

/* Whether pid is gone: no process, or a zombie (which holds no namespace;
 * the machine's init reaps orphans when it does). */
static bool gone(pid_t pid)
{
    char path[64], stat_line[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    bool zombie = fgets(stat_line, sizeof stat_line, f) && strstr(stat_line, ") Z ");
    fclose(f);
    return zombie;
}

/* ---- the tests ----------------------------------------------------------------- */

/* Each host is another machine to what runs on it; the calling namespace
 * gains no interface and no address, so it has no way to them. */
static void test_hosts_are_isolated(void **state)
{
    (void)state;
    char before[4096], during[4096], after[4096];
    root_interfaces(before, sizeof before);
    double t0 = now_ms();
    netrig *r = rig_up(3, 0);
    printf("3 bridged hosts up in %.0f ms\n", now_ms() - t0);
    root_interfaces(during, sizeof during);
    assert_string_equal(before, during);
    assert_false(rig_address_here());
    long my_ipc = ns_inode("self", "ipc"), my_net = ns_inode("self", "net");
    info seen[3];
    for (unsigned h = 0; h < 3; h++) {
        char want[16];
        snprintf(want, sizeof want, "kvcr-h%u", h);
        seen[h] = host_info(r, h);
        assert_string_equal(seen[h].host, want);
        assert_int_equal(seen[h].dflt, 0);
        assert_true(seen[h].ipc != my_ipc && seen[h].net != my_net);
        for (unsigned o = 0; o < h; o++)
            assert_true(seen[h].ipc != seen[o].ipc && seen[h].net != seen[o].net);
        assert_string_equal(netrig_addr(r, h), h == 0 ? "198.18.0.1" : h == 1 ? "198.18.0.2"
                                                                             : "198.18.0.3");
    }
    assert_null(netrig_addr(r, 3));
    /* A forked child that joins a host without exec is there too. */
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        char name[64] = "";
        _exit(netrig_join(r, 2) == 0 && gethostname(name, sizeof name) == 0 &&
                      strcmp(name, "kvcr-h2") == 0 && ns_inode("self", "net") == seen[2].net
                  ? 0
                  : 1);
    }
    int st = reap_within(child, WAIT_MS);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    netrig_down(r);
    root_interfaces(after, sizeof after);
    assert_string_equal(before, after);
}

/* Bytes cross between two hosts intact, both ways of the bridge. */
static void test_tcp_between_hosts(void **state)
{
    (void)state;
    netrig *r = rig_up(3, 0);
    pid_t server = start_server(r, 1);
    timing t;
    assert_int_equal(run_client(r, 0, 1, 4u << 20, WAIT_MS, &t), 0);
    printf("bridged round trip: %ld us\n", t.rtt_us);
    assert_true(t.rtt_us >= 0);
    assert_int_equal(run_client(r, 2, 1, 1u << 20, WAIT_MS, NULL), 0);
    stop_server(server);
    netrig_down(r);
}

/* Host from's client reaches host to's server (64 KiB echoed), or (cut)
 * cannot connect within 0.4 s. */
static void expect_link(netrig *r, unsigned from, unsigned to, bool cut)
{
    assert_int_equal(run_client(r, from, to, 65536, cut ? 400 : WAIT_MS, NULL),
                     cut ? EXIT_NO_CONNECT : 0);
}

/* Each fault stops the traffic while it lasts and the link carries it
 * again once it ends. */
static void test_partition_link_loss(void **state)
{
    (void)state;
    netrig *r = rig_up(3, 0);
    pid_t server = start_server(r, 1);
    expect_link(r, 0, 1, false);
    rig_ok(r, netrig_partition(r, 1, true));
    expect_link(r, 0, 1, true);
    expect_link(r, 2, 1, true);
    rig_ok(r, netrig_partition(r, 1, false));
    expect_link(r, 0, 1, false);
    rig_ok(r, netrig_link(r, 1, false));
    expect_link(r, 0, 1, true);
    rig_ok(r, netrig_link(r, 1, true));
    expect_link(r, 0, 1, false);
    rig_ok(r, netrig_set_loss(r, 0, 1.0));
    expect_link(r, 0, 1, true);
    rig_ok(r, netrig_set_loss(r, 0, 0.0));
    expect_link(r, 0, 1, false);
    assert_int_equal(netrig_set_loss(r, 0, 1.5), -1);
    assert_non_null(strstr(netrig_last_error(r), "[0, 1]"));
    stop_server(server);
    netrig_down(r);
}

/* A delayed rig (TAPs and the forwarder): 1 ms each way makes every round
 * trip at least 2 ms; its links go down and up too. */
static void test_delay(void **state)
{
    (void)state;
    netrig *r = rig_up(2, 1000);
    pid_t server = start_server(r, 1);
    timing t;
    assert_int_equal(run_client(r, 0, 1, 1u << 20, WAIT_MS, &t), 0);
    printf("round trip with 1 ms each way: %ld us\n", t.rtt_us);
    assert_true(t.rtt_us >= 2000);
    assert_true(t.rtt_us < 20000);
    rig_ok(r, netrig_link(r, 1, false));
    expect_link(r, 0, 1, true);
    rig_ok(r, netrig_link(r, 1, true));
    expect_link(r, 0, 1, false);
    stop_server(server);
    netrig_down(r);
}

/* A rig at 100 Mbit/s: 2 MiB echoed take at least 0.9 × their time at
 * that rate (the echo streams back through the other host's TBF while the
 * bytes go out, so both ways take about one direction's time). */
static void test_rate(void **state)
{
    (void)state;
    netrig *r = rig_of(&(netrig_opts){.n_hosts = 2, .rate_bps = 100000000});
    pid_t server = start_server(r, 1);
    timing t;
    size_t bytes = 2u << 20;
    double at_rate_us = (double)bytes * 8 / 1e8 * 1e6;
    assert_int_equal(run_client(r, 0, 1, bytes, WAIT_MS, &t), 0);
    printf("2 MiB echoed at 100 Mbit/s: %ld us (%.0f us at the rate)\n", t.xfer_us, at_rate_us);
    assert_true((double)t.xfer_us >= 0.9 * at_rate_us);
    stop_server(server);
    netrig_down(r);
}

/* Loss 0.5 on host 0 drops about half of what it sends: of 1000 datagrams
 * host 1 gets 500 ± 5 standard deviations (16 each). */
static void test_loss_fraction(void **state)
{
    (void)state;
    netrig *r = rig_up(2, 0);
    pid_t server = start_server(r, 1);
    expect_link(r, 0, 1, false); /* both ARP entries learnt before the loss */
    rig_ok(r, netrig_set_loss(r, 0, 0.5));
    int p[2];
    assert_int_equal(pipe(p), 0);
    char fd[12];
    snprintf(fd, sizeof fd, "%d", p[1]);
    char *recv_argv[] = {self_exe, "udprecv", (char *)netrig_addr(r, 1), PORT, fd, NULL};
    char *send_argv[] = {self_exe, "udpsend", (char *)netrig_addr(r, 1), PORT, "1000", NULL};
    pid_t receiver = spawn(r, 1, recv_argv);
    close(p[1]);
    char out[64] = "";
    struct pollfd pl = {.fd = p[0], .events = POLLIN};
    assert_int_equal(poll(&pl, 1, WAIT_MS), 1);
    assert_int_equal(read(p[0], out, 6), 6); /* "ready\n" */
    int st = reap_within(spawn(r, 0, send_argv), WAIT_MS);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    st = reap_within(receiver, 2 * WAIT_MS);
    assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int got = -1;
    assert_true(read(p[0], out, sizeof out - 1) > 0);
    close(p[0]);
    assert_int_equal(sscanf(out, "got=%d", &got), 1);
    printf("loss 0.5: %d of 1000 datagrams arrived\n", got);
    assert_true(got >= 420 && got <= 580);
    stop_server(server);
    netrig_down(r);
}

/* A killed host ends every process in it, mid-connection, and only it. */
static void test_kill_host(void **state)
{
    (void)state;
    netrig *r = rig_up(3, 0);
    long net = host_info(r, 2).net;
    pid_t doomed = start_server(r, 2), server = start_server(r, 1);
    expect_link(r, 0, 2, false);
    rig_ok(r, netrig_kill_host(r, 2));
    int st = reap_within(doomed, WAIT_MS);
    assert_true(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_int_equal(processes_in(&net, 1), 0);
    char *argv[] = {self_exe, "info", "1", NULL};
    assert_int_equal(netrig_spawn(r, 2, argv, NULL), -1);
    assert_non_null(strstr(netrig_last_error(r), "killed"));
    assert_int_equal(netrig_kill_host(r, 2), -1);
    expect_link(r, 0, 1, false);
    stop_server(server);
    netrig_down(r);
}

/* What a rig's process reports to the test: its child processes (keepers,
 * forwarder, servers) and its hosts' network namespaces. */
typedef struct made {
    int n_pids, n_nets;
    pid_t pids[32];
    long nets[8];
} made;

/* The rig's process (a fork of the test): a bridged and a delayed rig, a
 * server on each host; reports, then waits for the end of go (or a signal)
 * and takes the rigs down. */
static _Noreturn void rig_process(int report, int go)
{
    signal(SIGINT, SIG_DFL);
    /* No cmocka assertion here: this is a fork, outside the test's runner. */
    netrig_opts o[2] = {{.n_hosts = 2}, {.n_hosts = 2, .delay_us = 500}};
    netrig *r[2];
    char why[320];
    for (int i = 0; i < 2; i++)
        if (netrig_up(&o[i], &r[i], why, sizeof why) != 0) _exit(1);
    made m = {0};
    pid_t servers[4];
    for (int i = 0; i < 4; i++) {
        unsigned host = (unsigned)i % 2;
        char *argv[] = {self_exe, "serve", (char *)netrig_addr(r[i / 2], host), PORT, NULL};
        servers[i] = netrig_spawn(r[i / 2], host, argv, NULL);
        if (servers[i] < 0) _exit(1);
        char pid[16];
        snprintf(pid, sizeof pid, "%d", (int)servers[i]);
        m.nets[m.n_nets++] = ns_inode(pid, "net");
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(path, "r");
    while (f && m.n_pids < 32 && fscanf(f, "%d", &m.pids[m.n_pids]) == 1) m.n_pids++;
    if (f) fclose(f);
    if (write(report, &m, sizeof m) != (ssize_t)sizeof m) _exit(1);
    char c;
    while (read(go, &c, 1) < 0 && errno == EINTR) continue;
    netrig_down(r[0]);
    netrig_down(r[1]);
    for (int i = 0; i < 4; i++) waitpid(servers[i], NULL, 0);
    _exit(0);
}

/* Runs rig_process ending by sig from here, or (0) by netrig_down, then checks that every process it made is gone, and every
 * namespace, interface and name with them, within WAIT_MS. */
static void check_nothing_left(const char *how, int sig)
{
    char ifs_before[4096], ifs_after[4096], named_before[1024], named_after[1024];
    root_interfaces(ifs_before, sizeof ifs_before);
    named_netns(named_before, sizeof named_before);
    int p[2], go[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(go[1]);
        rig_process(p[1], go[0]);
    }
    close(p[1]);
    close(go[0]);
    made m;
    struct pollfd pl = {.fd = p[0], .events = POLLIN};
    assert_int_equal(poll(&pl, 1, 20000), 1);
    assert_int_equal(read(p[0], &m, sizeof m), (ssize_t)sizeof m);
    close(p[0]);
    assert_int_equal(m.n_nets, 4);
    assert_true(m.n_pids >= 2 * 2 + 1 + 1 + 4); /* keepers, switch, forwarder, servers */
    assert_int_equal(processes_in(m.nets, 4), 4 + 4);  /* the keepers and the servers */
    if (sig) kill(pid, sig);
    close(go[1]);
    int st = reap_within(pid, 20000);
    if (sig) assert_true(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == sig);
    else assert_true(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    double end = now_ms() + WAIT_MS;
    int left = -1;
    while (left != 0 && now_ms() < end) {
        left = processes_in(m.nets, 4);
        for (int i = 0; i < m.n_pids; i++) left += !gone(m.pids[i]);
        if (left) nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    printf("%s: everything gone after %.0f ms\n", how, now_ms() - (end - WAIT_MS));
    assert_int_equal(left, 0);
    root_interfaces(ifs_after, sizeof ifs_after);
    named_netns(named_after, sizeof named_after);
    assert_string_equal(ifs_before, ifs_after);
    assert_string_equal(named_before, named_after);
}

static void test_nothing_left_after_down(void **state)
{
    (void)state;
    check_nothing_left("down", 0);
}

static void test_nothing_left_after_sigkill(void **state)
{
    (void)state;
    check_nothing_left("SIGKILL", SIGKILL);
}

static void test_nothing_left_after_sigint(void **state)
{
    (void)state;
    check_nothing_left("SIGINT", SIGINT);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "info") == 0) return mode_info(argv);
    if (argc >= 4 && strcmp(argv[1], "serve") == 0) return mode_serve(argv);
    if (argc >= 7 && strcmp(argv[1], "client") == 0) return mode_client(argv);
    if (argc >= 5 && strcmp(argv[1], "udprecv") == 0) return mode_udprecv(argv);
    if (argc >= 5 && strcmp(argv[1], "udpsend") == 0) return mode_udpsend(argv);
    char why[320];
    if (!netrig_available(why, sizeof why)) {
        printf("skipped: %s\n", why);
        return 77;
    }
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0) return 1;
    self_exe[n] = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hosts_are_isolated),
        cmocka_unit_test(test_tcp_between_hosts),
        cmocka_unit_test(test_partition_link_loss),
        cmocka_unit_test(test_delay),
        cmocka_unit_test(test_rate),
        cmocka_unit_test(test_loss_fraction),
        cmocka_unit_test(test_kill_host),
        cmocka_unit_test(test_nothing_left_after_down),
        cmocka_unit_test(test_nothing_left_after_sigkill),
        cmocka_unit_test(test_nothing_left_after_sigint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
