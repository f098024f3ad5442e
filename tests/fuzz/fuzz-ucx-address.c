/* libFuzzer target: a peer's UCX worker address (net/ucxaddr.h), walked
 * the three ways net/ucx.c walks it: learning a shape (our own address at
 * start), and checked against a shape with the TCP interfaces collected (a
 * peer's). Whatever the bytes, no read leaves the buffer, a failed walk
 * says why, and what a successful one learned or collected is within its
 * bounds: shapes of 1..UCXADDR_MAX_TLS entries, TCP interfaces of a socket
 * family. The corpus holds two real addresses of UCX 1.13 (shared memory
 * and TCP; TCP only). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "net/ucxaddr.h"

#define TCP_CSUM 0x19cf /* ucs_crc16_string("tcp") */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A shape like this machine's: TCP with a 2-byte interface address (its
 * port), posix and sysv with theirs. */
static const ucxaddr_shape ours = {
    .tl = {{TCP_CSUM, 2}, {0xd3a7, 8}, {0x538d, 8}},
    .n = 3,
};

static void check_walk(int rc, const ucxaddr_walk *w)
{
    if (rc != 0 && w->why == NULL) abort();
    if (rc == 0 && w->why != NULL) abort();
    if (rc == 0 && (w->n_tls == 0 || w->n_tls > UCXADDR_MAX_TLS)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ucxaddr_shape learned;
    ucxaddr_walk a = {.learn = &learned};
    int rc = ucxaddr_walk_address(data, size, &a);
    check_walk(rc, &a);
    if (rc == 0 && (learned.n == 0 || learned.n > a.n_tls)) abort();

    ucxaddr_tcp tcp;
    ucxaddr_walk b = {.check = &ours, .tcp = &tcp, .tcp_csum = TCP_CSUM};
    int rc2 = ucxaddr_walk_address(data, size, &b);
    check_walk(rc2, &b);
    if (tcp.n > UCXADDR_TCP_MAX) abort();
    for (unsigned i = 0; i < tcp.n; i++)
        if (tcp.at[i].ss_family != AF_INET && tcp.at[i].ss_family != AF_INET6) abort();
    /* Checking only adds refusals to learning. */
    if (rc != 0 && rc2 == 0) abort();

    /* The walk is a function of the bytes. */
    ucxaddr_tcp again;
    ucxaddr_walk c = {.check = &ours, .tcp = &again, .tcp_csum = TCP_CSUM};
    if (ucxaddr_walk_address(data, size, &c) != rc2 || again.n != tcp.n ||
        memcmp(again.at, tcp.at, tcp.n * sizeof tcp.at[0]) != 0)
        abort();
    return 0;
}
