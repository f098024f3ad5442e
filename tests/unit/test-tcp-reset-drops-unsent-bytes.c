/* tcp_reset_peers (net/tcpreset.h) on real sockets over 127.0.0.1 and ::1:
 * a connection to a given address is reset, what its sender still held
 * never reaches the reader, and every other socket of the process (the
 * accepted end, connections to other addresses) is left alone. Every wait
 * is bounded. */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
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

/* A connection to at: the dialled end in *client (non-blocking, small
 * send buffer), the accepted end returned. */
static int connect_pair(int listener, const struct sockaddr_storage *at, int *client)
{
    *client = socket(at->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(*client >= 0);
    int small = SMALL_BUF;
    assert_int_equal(setsockopt(*client, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    socklen_t len = at->ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                             : sizeof(struct sockaddr_in6);
    assert_int_equal(connect(*client, (const struct sockaddr *)at, len), 0);
    int accepted = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    assert_true(accepted >= 0);
    assert_int_equal(fcntl(*client, F_SETFL, O_NONBLOCK), 0);
    return accepted;
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
    assert_int_equal(tcp_reset_peers(&at, 1), 1);
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

static void test_reset_spares_connections_to_other_addresses(void **state)
{
    (void)state;
    struct sockaddr_storage a, b;
    int la = listen_on(AF_INET, &a), lb = listen_on(AF_INET, &b);
    assert_true(la >= 0 && lb >= 0);
    int ca, cb, sa = connect_pair(la, &a, &ca), sb = connect_pair(lb, &b, &cb);

    assert_int_equal(tcp_reset_peers(&a, 1), 1);
    /* b's connection still carries bytes both ways. */
    assert_int_equal(send(cb, "ping", 4, MSG_NOSIGNAL), 4);
    char buf[8] = {0};
    struct pollfd p = {sb, POLLIN, 0};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    assert_int_equal(recv(sb, buf, sizeof buf, 0), 4);
    assert_memory_equal(buf, "ping", 4);
    assert_int_equal(send(sb, "pong", 4, MSG_NOSIGNAL), 4);
    p = (struct pollfd){cb, POLLIN, 0};
    assert_int_equal(poll(&p, 1, WAIT_MS), 1);
    assert_int_equal(recv(cb, buf, sizeof buf, 0), 4);
    assert_memory_equal(buf, "pong", 4);

    /* An address nothing is connected to resets nothing. */
    struct sockaddr_storage none = a;
    ((struct sockaddr_in *)&none)->sin_port = htons(1);
    assert_int_equal(tcp_reset_peers(&none, 1), 0);
    close(sa), close(sb), close(ca), close(cb), close(la), close(lb);
}

static void test_reset_arguments(void **state)
{
    (void)state;
    assert_int_equal(tcp_reset_peers(NULL, 0), 0);
    assert_int_equal(tcp_reset_peers(NULL, 1), KVCR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reset_drops_what_the_peer_has_not_taken),
        cmocka_unit_test(test_reset_spares_connections_to_other_addresses),
        cmocka_unit_test(test_reset_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
