/* Resetting this process's TCP connections to given peer addresses.
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
 * Which sockets: every connected TCP socket of the process whose peer is
 * one of the given addresses (family, address and port), found in
 * /proc/self/fd. Each is examined and reset through a duplicate of its
 * descriptor, so a descriptor closed and reused meanwhile by another thread
 * is never touched: the duplicate still names the socket that was matched.
 *
 * Thread: any; it reads no state of its own. */
#ifndef KVCR_NET_TCPRESET_H
#define KVCR_NET_TCPRESET_H

#include <stddef.h>
#include <sys/socket.h>

/* Resets every connected TCP socket of this process whose peer is one of
 * peers[0..n). Returns how many were reset (0: none connected there), or a
 * negative code (kvcr_fail) when the process's descriptors cannot be
 * listed; nothing is reset then. */
int tcp_reset_peers(const struct sockaddr_storage *peers, size_t n);

#endif
