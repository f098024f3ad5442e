/* A UCX worker address from a peer, read before UCX reads it.
 *
 * UCX 1.13 takes a worker address without its length and trusts every byte
 * of it: ucp_ep_create walks it by the lengths and flags it contains and
 * stops only at a "last" flag. Measured with ucp_ep_create on mutated
 * copies of a real 215-byte address, each in a fresh process:
 *   - random bytes: 250 of 300 abort() (an assert on the version nibble);
 *   - the address cut short: UCX reads on past the end (the outcome depends
 *     on the bytes that follow: 39 of 300 crashed with 0xff after it);
 *   - one byte changed: ~1% abort or SIGSEGV (a garbled float making a
 *     lane score negative, an interface address length of zero that the
 *     transport then dereferences).
 * ucp_worker_address_query is no help: it reads the same header and asserts
 * the same way. So the address is walked here first, in the layout UCX 1.13
 * emits by default (address v1, not unified mode; net/ucx.c learns the
 * shape of its own address at start and gives peers only basic checks if
 * that does not parse), every length checked against the buffer, and it
 * must end exactly at len. The costs of each transport entry must be finite
 * and sane, and an entry for a transport we have must carry an interface
 * address of the length ours has (device address lengths legitimately
 * differ: IPv4 and IPv6).
 *
 * On the way the walk can collect where the address's TCP transport
 * listens: a peer's, and our own (ucx_peer_abort resets the connections
 * between those, net/tcpreset.h).
 *
 * Residual risk: what is well formed but lies (the id of another shared
 * memory segment or process, another host's port, flags inside a
 * transport's own address) reaches UCX, which will try to attach or
 * connect to it: 1 of 2000 one-byte mutations that pass these checks still
 * made UCX abort (a flag inside the posix transport's address). Peers are
 * trusted to send their own address; this catches corruption and mix-ups,
 * it authenticates no one.
 *
 * Pure functions of their arguments: any thread. */
#ifndef KVCR_NET_UCXADDR_H
#define KVCR_NET_UCXADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* UCP_MAX_RESOURCES in UCX 1.13: more transport entries is not an address. */
#define UCXADDR_MAX_TLS 128
/* TCP interfaces collected at most: one per network device a worker
 * listens on; a host with more has them past this left out. */
#define UCXADDR_TCP_MAX 8

/* What a transport entry of our own address looks like; a peer's entry for
 * the same transport (same name checksum) must look the same. */
typedef struct ucxaddr_tl {
    uint16_t csum;
    uint8_t iface_len;
} ucxaddr_tl;

typedef struct ucxaddr_shape {
    ucxaddr_tl tl[UCXADDR_MAX_TLS];
    unsigned n;
} ucxaddr_shape;

/* Where a worker's TCP transport listens. */
typedef struct ucxaddr_tcp {
    struct sockaddr_storage at[UCXADDR_TCP_MAX];
    unsigned n;
} ucxaddr_tcp;

/* One walk over an address: what it compares the address to, learns from
 * it or collects from it (each optional), and, once it failed, why. */
typedef struct ucxaddr_walk {
    ucxaddr_shape *learn;       /* records the transport entries */
    const ucxaddr_shape *check; /* compares them to these */
    ucxaddr_tcp *tcp;           /* collects where the TCP transport listens */
    uint16_t tcp_csum;          /* the TCP transport's name checksum (ucs_crc16_string) */
    const char *why;            /* what is wrong, once the walk failed */
    /* the walk's own state */
    unsigned n_tls;
    const uint8_t *dev; /* the current device's address */
    uint8_t dev_len;
} ucxaddr_walk;

/* 0 if a[0..len) is a well-formed v1 worker address, doing what w asks on
 * the way (learn, tcp: filled from scratch); else -1 with w->why. */
int ucxaddr_walk_address(const uint8_t *a, size_t len, ucxaddr_walk *w);

#endif
