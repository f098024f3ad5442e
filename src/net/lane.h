/* The control lane: control messages between KVCR instances over plain TCP
 * connections of our own framing, which the control channel (control.h)
 * uses in plaintext for every peer whose endpoint offers one ("#lane=").
 *
 * Why not only ZeroMQ: ZMTP's handshake costs 3.5 round trips before a new
 * connection carries its first message, and a PUSH socket's answer needs a
 * second connection made the other way (3.5 more). A lane connection
 * carries its first message 1.5 round trips after the dial and the answer
 * comes back over it, so a first pull from a peer costs 2 round trips; and
 * a message crosses no I/O thread on either side.
 *
 * Frames: a 4-byte big-endian length, then that many bytes, 1..max_message.
 * A dialled connection's first frame is a hello: the dialler's name (its
 * control endpoint, printable ASCII, 1..LANE_MAX_NAME bytes). The accepting
 * side sends to that name over the connection once the vouch callback
 * accepts the name for the connection's peer address (the control channel
 * checks that the name's host is that address), so that a stranger cannot
 * take another peer's answers by claiming its name. Messages of a
 * connection whose name was not vouched for are still delivered: like
 * every plaintext message they speak for nobody.
 *
 * Bounds: at most LANE_MAX_CONNS connections; beyond, the idlest is closed,
 * those that never named themselves first. At most LANE_TXQ_MAX bytes wait
 * to be sent on one connection (or a hello and one message of max_message
 * bytes, when that is more): beyond, it is closed and the send fails.
 * A dial not made within LANE_CONNECT_MS is made again (its queue kept:
 * none of it reached the wire), an accepted
 * connection that has not named itself within LANE_HELLO_MS is closed, and
 * bytes unacknowledged for LANE_MAXRT_MS close theirs (TCP_USER_TIMEOUT):
 * after an outage the next send dials anew instead of waiting out the
 * kernel's retransmission backoff. A closed connection's unsent messages
 * are dropped; the protocol above recovers lost messages.
 *
 * A lane is used by one thread at a time: its user serializes the calls (the
 * peer tier: the instance lock, held by the progress thread or by a caller
 * sending an inline pull). */
#ifndef KVCR_NET_LANE_H
#define KVCR_NET_LANE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "util/log.h"

#define LANE_MAX_CONNS 256
#define LANE_MAX_NAME 256
#define LANE_TXQ_MAX (8u << 20)
#define LANE_CONNECT_MS 500
/* As ZeroMQ's handshake interval: a dialler whose threads a loaded host
 * holds back for seconds still gets its name in (at 2 s, 8 targets
 * flooding one source under ASan lost connections this way); junk that
 * never speaks is bounded by the table and closed first when it is full. */
#define LANE_HELLO_MS 30000
#define LANE_MAXRT_MS 1000
#define LANE_HEADER 4

typedef struct lane lane;

/* Whether the connection from peer may carry messages to name. */
typedef bool lane_vouch_cb(void *ud, const char *name, const struct sockaddr *peer,
                           socklen_t peer_len);

/* A message sent to name on a dial the peer refused (nothing listens at
 * its lane port: a peer restarted with another one), handed back unsent so
 * that its user can send it another way. */
typedef void lane_refused_cb(void *ud, const char *name, const void *data, size_t len);

/* The callbacks of a lane; ud is passed to both. */
typedef struct lane_hooks {
    lane_vouch_cb *vouch;
    lane_refused_cb *refused;
    void *ud;
} lane_hooks;

/* Binds a TCP listener on ip (a numeric IPv4 or IPv6 address), at a port
 * the system chooses. KVCR_EINVAL for an ip that is not numeric or a
 * max_message outside 1..UINT32_MAX, KVCR_ESYS with the reason otherwise. */
int lane_open(const char *ip, size_t max_message, const lane_hooks *hooks,
              const kvcr_logger *log, lane **out);
void lane_close(lane *l);

uint16_t lane_port(const lane *l);

/* The name this lane's dials announce (its control endpoint): must be set
 * before the first send. KVCR_EINVAL unless lane_name_ok. */
int lane_set_name(lane *l, const char *name);

/* An epoll descriptor, readable when some connection has work: call
 * lane_recv when it fires (or at any time). */
int lane_fd(const lane *l);

/* Queues one message to name, over a connection that carries messages to
 * it, or a new one dialled to ip:port (numeric). Never blocks. 0, or a
 * negative code with the reason (the connection, if any, is closed). When
 * the peer refuses the dial, now or later, the messages queued on it go to
 * the refused hook. */
int lane_send(lane *l, const char *name, const char *ip, uint16_t port, const void *data,
              size_t len);

/* Between lane_cork and lane_uncork, messages to connections that are
 * made wait in their queues; lane_uncork sends each connection's queue in
 * one write. The messages a turn of the progress thread sends to one peer
 * (an acknowledgement and the answer after it) then leave in one packet
 * where the window lets them, and wake the peer once. */
void lane_cork(lane *l);
void lane_uncork(lane *l);

/* Dials name at ip:port now, if no connection carries messages to it. */
int lane_dial(lane *l, const char *name, const char *ip, uint16_t port);

/* Whether a connection (made, or being made) carries messages to name. */
bool lane_has(const lane *l, const char *name);

/* Closes every connection that carries messages to name. */
void lane_forget(lane *l, const char *name);

/* Accepts, dials, sends what waits, and hands at most max received
 * messages to cb(ud, data, len) (data valid during the call, which may
 * send on the lane). Returns how much it did: 0 when nothing was to do. */
typedef void lane_recv_cb(void *ud, const void *data, size_t len);
size_t lane_recv(lane *l, size_t max, lane_recv_cb *cb, void *ud);

/* Connections closed for breaking the framing (a bad length or hello,
 * junk, or no hello in time) since the last call; *why the last one's
 * reason (a static string), NULL with none. The lane logs none of them:
 * its user does, within its own limit. */
uint64_t lane_take_refused(lane *l, const char **why);

/* ---- the decoders (pure; fuzzed) ---------------------------------------- */

/* The frame at the start of buf[0..len): its whole size (header included)
 * with *payload and *plen set, 0 when it is not complete yet, -1 when its
 * length is outside 1..max. */
ptrdiff_t lane_frame(const uint8_t *buf, size_t len, size_t max, const uint8_t **payload,
                     size_t *plen);

/* A name: 1..LANE_MAX_NAME bytes of printable ASCII without spaces. */
bool lane_name_ok(const void *s, size_t n);

/* Whether ip is a numeric IPv4 or IPv6 address (what a lane binds and
 * dials: no name is ever resolved on its thread). */
bool lane_ip_ok(const char *ip);

/* Whether ip (numeric) is the address of sa (a vouch hook's peer). */
bool lane_ip_is(const char *ip, const struct sockaddr *sa, socklen_t sa_len);

#endif
