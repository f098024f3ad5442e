/* tcp_reset_peer (net/tcpreset.h) on real sockets over 127.0.0.1 and ::1:
 * a connection to where the peer listens is reset, and so is one the peer
 * opened to where we listen while it holds bytes; what the sender still
 * held never reaches the reader, and every other socket of the process
 * (the accepted end, connections to other addresses, from other hosts, on
 * other listeners, holding nothing) is left alone. Every wait is
 * bounded. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvcr/error.h"
#include "net/tcpreset.h"

#define WAIT_MS 5000
#define SMALL_BUF 4096 /* socket buffers, so that the sender's fill up soon */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A listener on the loopback address of family (port chosen by the
 * kernel), its address in *at; -1 when the family has no loopback here. */
static int listen_on(int family, struct sockaddr_storage *at)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    memset(at, 0, sizeof *at);
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)at;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)at;
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_loopback;
        len = sizeof *in6;
    }
    int small = SMALL_BUF;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small); /* inherited by accepted */
    if (bind(fd, (struct sockaddr *)at, len) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)at, &len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A connection to at from the IPv4 host `from` (NULL: any): the dialled
 * end in *client, the accepted end returned; both non-blocking, with small
 * buffers. */
static int dial_from(int listener, const struct sockaddr_storage *at, const char *from,
                     int *client)
{
    *client = socket(at->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(*client >= 0);
    int small = SMALL_BUF;
    assert_int_equal(setsockopt(*client, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    assert_int_equal(setsockopt(*client, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    if (from != NULL) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        assert_int_equal(inet_pton(AF_INET, from, &src.sin_addr), 1);
        assert_int_equal(bind(*client, (struct sockaddr *)&src, sizeof src), 0);
    }
    socklen_t len = at->ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                             : sizeof(struct sockaddr_in6);
    assert_int_equal(connect(*client, (const struct sockaddr *)at, len), 0);
    int accepted = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    assert_true(accepted >= 0);
    assert_int_equal(setsockopt(accepted, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    assert_int_equal(fcntl(*client, F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(fcntl(accepted, F_SETFL, O_NONBLOCK), 0);
    return accepted;
}

static int connect_pair(int listener, const struct sockaddr_storage *at, int *client)
{
    return dial_from(listener, at, NULL, client);
}

/* The peer listens at *peer; nothing of ours is named. */
static int reset_to(const struct sockaddr_storage *peer)
{
    return tcp_reset_peer(&(tcp_ends){peer, 1, NULL, 0});
}

/* Writes to fd until the kernel takes no more (bounded): the bytes taken. */
static size_t fill(int fd)
{
    static char junk[1 << 16];
    size_t total = 0;
    for (double end = now_ms() + WAIT_MS; now_ms() < end;) {
        ssize_t n = send(fd, junk, sizeof junk, MSG_NOSIGNAL);
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        assert_true(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
        /* Let the bytes in flight land in the reader's buffer, then check
         * that nothing more goes. */
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 50) == 0) return total;
    }
    fail_msg("the sender never filled up");
    return 0;
}

/* Reads fd until the connection ends (bounded): the bytes read; *err is
 * the error it ended with (0: an orderly end). */
static size_t drain(int fd, int *err)
{
    static char buf[1 << 16];
    size_t total = 0;
    for (double end = now_ms() + WAIT_MS; now_ms() < end;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            total += (size_t)n;
            continue;
        }
        *err = n == 0 ? 0 : errno;
        return total;
    }
    fail_msg("the connection never ended");
    return 0;
}

static void reset_drops_unsent(int family)
{
    struct sockaddr_storage at;
    int l = listen_on(family, &at);
    if (l < 0) {
        print_message("no %s loopback here: not tried\n", family == AF_INET ? "IPv4" : "IPv6");
        return;
    }
    int client, server = connect_pair(l, &at, &client);
    size_t sent = fill(client); /* the reader reads nothing meanwhile */

    /* The accepted end's peer is the client's port, not the listener's:
     * exactly one connection is reset. */
    assert_int_equal(reset_to(&at), 1);
    struct sockaddr_storage peer;
    socklen_t len = sizeof peer;
    assert_int_equal(getpeername(client, (struct sockaddr *)&peer, &len), -1);
    assert_int_equal(errno, ENOTCONN);

    int err = -1;
    size_t got = drain(server, &err);
    assert_int_equal(err, ECONNRESET);
    assert_true(got < sent); /* what the sender still held never came */
    close(server);
    close(client);
    close(l);
}

static void test_reset_drops_what_the_peer_has_not_taken(void **state)
{
    (void)state;
    reset_drops_unsent(AF_INET);
    reset_drops_unsent(AF_INET6);
}

/* Bytes still go both ways between the ends a and b. */
static void still_connected(int a, int b)
{
    char buf[8] = {0};
    assert_int_equal(send(a, "ping", 4, MSG_NOSIGNAL), 4);
    struct pollfd p = {b, POLLIN, 0};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    assert_int_equal(recv(b, buf, sizeof buf, 0), 4);
    assert_memory_equal(buf, "ping", 4);
    assert_int_equal(send(b, "pong", 4, MSG_NOSIGNAL), 4);
    p = (struct pollfd){a, POLLIN, 0};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    assert_int_equal(recv(a, buf, sizeof buf, 0), 4);
    assert_memory_equal(buf, "pong", 4);
}

static void test_reset_spares_connections_to_other_addresses(void **state)
{
    (void)state;
    struct sockaddr_storage a, b;
    int la = listen_on(AF_INET, &a), lb = listen_on(AF_INET, &b);
    assert_true(la >= 0 && lb >= 0);
    int ca, cb, sa = connect_pair(la, &a, &ca), sb = connect_pair(lb, &b, &cb);

    assert_int_equal(reset_to(&a), 1);
    still_connected(cb, sb);

    /* An address nothing is connected to resets nothing. */
    struct sockaddr_storage none = a;
    ((struct sockaddr_in *)&none)->sin_port = htons(1);
    assert_int_equal(reset_to(&none), 0);
    close(sa), close(sb), close(ca), close(cb), close(la), close(lb);
}

/* The peer listens at 127.0.0.1 (a listener of this process stands for
 * it) and has opened connections to where we listen: the one whose
 * accepted end still holds bytes for the peer is reset, what it held never
 * reaches the peer; one holding nothing, one from another host (127.0.0.2)
 * and one on a listener of ours not named are left alone, although they
 * hold bytes. */
static void test_reset_finds_the_peers_own_connection_while_it_holds_bytes(void **state)
{
    (void)state;
    struct sockaddr_storage peer, ours, other;
    int lp = listen_on(AF_INET, &peer), lo = listen_on(AF_INET, &ours),
        lx = listen_on(AF_INET, &other);
    assert_true(lp >= 0 && lo >= 0 && lx >= 0);
    int busy_peer, busy = dial_from(lo, &ours, "127.0.0.1", &busy_peer);
    int idle_peer, idle = dial_from(lo, &ours, "127.0.0.1", &idle_peer);
    int stranger_peer, stranger = dial_from(lo, &ours, "127.0.0.2", &stranger_peer);
    int elsewhere_peer, elsewhere = dial_from(lx, &other, "127.0.0.1", &elsewhere_peer);
    size_t sent = fill(busy);
    fill(stranger);
    fill(elsewhere);

    assert_int_equal(tcp_reset_peer(&(tcp_ends){&peer, 1, &ours, 1}), 1);
    int err = -1;
    size_t got = drain(busy_peer, &err);
    assert_int_equal(err, ECONNRESET);
    assert_true(got < sent);
    still_connected(idle, idle_peer);
    /* the others still hold what they were given, and are connected */
    int held = 0;
    assert_int_equal(ioctl(stranger, SIOCOUTQ, &held), 0);
    assert_true(held > 0);
    assert_int_equal(ioctl(elsewhere, SIOCOUTQ, &held), 0);
    assert_true(held > 0);
    struct sockaddr_storage at;
    socklen_t len = sizeof at;
    assert_int_equal(getpeername(stranger, (struct sockaddr *)&at, &len), 0);
    len = sizeof at;
    assert_int_equal(getpeername(elsewhere, (struct sockaddr *)&at, &len), 0);
    int fds[] = {busy, busy_peer, idle, idle_peer, stranger, stranger_peer, elsewhere,
                 elsewhere_peer, lp, lo, lx};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++) close(fds[i]);
}

static void test_reset_arguments(void **state)
{
    (void)state;
    struct sockaddr_storage any = {.ss_family = AF_INET};
    assert_int_equal(tcp_reset_peer(&(tcp_ends){NULL, 0, NULL, 0}), 0);
    assert_int_equal(tcp_reset_peer(NULL), KVCR_EINVAL);
    assert_int_equal(tcp_reset_peer(&(tcp_ends){NULL, 1, NULL, 0}), KVCR_EINVAL);
    assert_int_equal(tcp_reset_peer(&(tcp_ends){&any, 1, NULL, 1}), KVCR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reset_drops_what_the_peer_has_not_taken),
        cmocka_unit_test(test_reset_spares_connections_to_other_addresses),
        cmocka_unit_test(test_reset_finds_the_peers_own_connection_while_it_holds_bytes),
        cmocka_unit_test(test_reset_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
