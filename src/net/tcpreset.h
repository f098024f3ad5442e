/* Resetting this process's TCP connections with a peer.
 *
 * Why: a TCP socket closed with bytes still unsent does not drop them. The
 * kernel (or a library that flushes before it closes) goes on sending them
 * for as long as TCP retransmits: after a partition heals, seconds later,
 * they reach the peer. When those bytes are writes into the peer's memory
 * (UCX puts over TCP, executed by the peer's worker on arrival), the peer
 * would be written after it was told the writes had ended. A reset
 * (connect() with AF_UNSPEC: tcp_disconnect, an RST, the send queue
 * purged) ends the connection where it stands: nothing it held is sent
 * afterwards.
 *
 * Which sockets, of those connected, found in /proc/self/fd:
 *   - every one to one of the peer's listening addresses (address and
 *     port): the connections this process opened to the peer;
 *   - every one accepted on one of this process's listening addresses from
 *     one of the peer's hosts (address, any port) that still holds bytes
 *     either way (sent and not yet acknowledged, or received and not yet
 *     read). A peer's own connection can carry this process's bytes too:
 *     UCX 1.13 uses one connection for both directions once both ends have
 *     an endpoint. Which process on that host opened it cannot be told from
 *     the socket, so another one at the same address may be reset with it;
 *     only a connection that holds bytes is, and ending it is safe (its
 *     endpoint fails and what was on it is reported uncertain).
 * Each is examined and reset through a duplicate of its descriptor, so a
 * descriptor closed and reused meanwhile by another thread is never
 * touched: the duplicate still names the socket that was matched.
 *
 * Thread: any; it reads no state of its own. */
#ifndef KVCR_NET_TCPRESET_H
#define KVCR_NET_TCPRESET_H

#include <stddef.h>
#include <sys/socket.h>

/* The two ends of a peer's connections with this process. */
typedef struct tcp_ends {
    const struct sockaddr_storage *peer; /* where the peer listens */
    size_t n_peer;
    const struct sockaddr_storage *ours; /* where this process listens */
    size_t n_ours;
} tcp_ends;

/* Resets this process's TCP connections with the peer, as above. Returns
 * how many were reset (0: none), or a negative code (kvcr_fail) when the
 * arguments are wrong or the process's descriptors cannot be listed;
 * nothing is reset then. */
int tcp_reset_peer(const tcp_ends *e);

#endif
