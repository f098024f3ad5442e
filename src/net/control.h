/* The peer control channel over ZeroMQ: one PULL socket
 * bound at this instance's control endpoint, one PUSH socket per peer
 * endpoint, created on first use (or eagerly with ctl_connect) and cached;
 * in plaintext, for peers that offer one, the lane (ctl_open_lane).
 * Sends never block: a full queue or any ZeroMQ error closes and forgets
 * that peer's socket, and the next send makes a new one. The channel knows
 * nothing of message contents (see net/wire.h).
 *
 * With CURVE (ctl_curve), every connection is encrypted and authenticated
 * both ways: the channel is a CURVE server to its peers' PUSH sockets and a
 * CURVE client on its own, with one key pair. An endpoint then carries the
 * server's public key: "tcp://host:port#curve=<40 characters of Z85>", so
 * that whoever learns an endpoint (a router hint, a message's reply
 * address) also learns which key must answer there. Incoming connections
 * are admitted by a ZAP handler served in ctl_serve_handshakes, which
 * takes only keys of the allow-list; outgoing ones are made only to
 * endpoints whose key is in it. Plaintext and CURVE never mix: a keyed endpoint is refused
 * by a plaintext channel and an unkeyed one by a CURVE channel.
 *
 * A channel is used by one thread at a time (the progress thread). */
#ifndef KVCR_NET_CONTROL_H
#define KVCR_NET_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

#define CTL_MAX_ENDPOINT 256
#define CTL_KEY_LEN 40          /* a CURVE key in Z85 */

/* A CURVE key: CTL_KEY_LEN characters that decode as Z85 (32 bytes);
 * false for NULL. */
bool ctl_key_ok(const char *key);
#define CTL_CURVE_TAG "#curve=" /* between an endpoint's address and its key */
#define CTL_LANE_TAG "#lane="   /* between an endpoint's address and its lane's port */

typedef struct ctl_channel ctl_channel;

/* CURVE keys of a channel, all Z85 (checked by the caller: config.c). */
typedef struct ctl_curve {
    const char *secret_key, *public_key; /* this instance's key pair */
    const char *const *allowed;          /* the peers' public keys, >= 1 */
    size_t n_allowed;
} ctl_curve;

/* Binds tcp://bind_host:port (port 0: a free port chosen by the system)
 * and advertises tcp://advertise_host:<port> (with "#curve=<public key>"
 * when curve is not NULL: see above). KVCR_EINVAL for a bad host,
 * KVCR_ESYS (message with the reason) when the port cannot be bound.
 * listener >= 0: a TCP socket already bound and listening (the KVCR
 * service's, so that the endpoint outlives this process) that ZeroMQ
 * adopts (ZMQ_USE_FD) and closes; port is then the one it is bound to.
 * It is closed on failure too. */
int ctl_open(const char *bind_host, uint16_t port, int listener, const char *advertise_host,
             size_t max_message, const ctl_curve *curve, const kvcr_logger *log,
             ctl_channel **out);
void ctl_close(ctl_channel *c);

/* "tcp://<advertise_host>:<port>", plus "#curve=<public key>" with CURVE
 * or "#lane=<port>" with the lane. */
const char *ctl_endpoint(const ctl_channel *c);

/* Opens the channel's lane (net/lane.h) on the bind host, at a port the
 * system chooses, and adds "#lane=<port>" to the endpoint: from then on
 * messages to every endpoint that offers a lane go over it, both ways,
 * and the others over ZeroMQ. Peers without the lane still reach this
 * channel's PULL socket at the address; a peer whose lane refuses a dial
 * (restarted: its lane port is another, its address the same when
 * control_port was fixed) is sent to there for CTL_LANELESS_MS (control.c),
 * the refused messages first. KVCR_EINVAL (nothing changed)
 * with CURVE (the lane is plaintext), on a listener handed over by the
 * KVCR service (the lane's port would not outlive this process), or when
 * the bind or advertise host is not a numeric IP address ("*" binds
 * 0.0.0.0); KVCR_ESYS when no port can be bound. */
int ctl_open_lane(ctl_channel *c);

/* The lane's descriptor to poll() for POLLIN (then call ctl_recv), or -1
 * without a lane. */
int ctl_lane_fd(const ctl_channel *c);

/* A file descriptor to poll() for POLLIN; after it fires (or at any time)
 * call ctl_recv until it returns 0 (ZeroMQ's edge-triggered ZMQ_FD). */
int ctl_fd(const ctl_channel *c);

/* With CURVE, the ZAP handler's file descriptor (-1 without): when it
 * fires (or at any time) call ctl_serve_handshakes until it returns 0.
 * Nothing arrives from a new connection before its ZAP request is
 * answered. */
int ctl_auth_fd(const ctl_channel *c);

/* Why input at the control endpoint was dropped: the closed set of causes
 * counted in kvcr_control_dropped_total{cause} (names: ctl_drop_name). The
 * channel tells the first two apart, from the PULL socket's monitor; the
 * receiver of the messages tells the others. */
typedef enum ctl_drop {
    CTL_DROP_HANDSHAKE,    /* a connection that failed the ZeroMQ handshake: not
                            * ZMTP, a broken greeting, closed mid-handshake, or
                            * (CURVE) a plaintext peer or another server key */
    CTL_DROP_AUTH,         /* CURVE: a client key outside the allow-list */
    CTL_DROP_MALFORMED,    /* a message the decoder refused (net/wire.h) */
    CTL_DROP_UNKNOWN_TYPE, /* well formed but of a type this version lacks */
    CTL_DROP_BAD_SENDER,   /* CURVE: its reply endpoint names another key than
                            * its connection's */
    CTL_DROP_UNEXPECTED,   /* valid, but nothing here waits for it (a late or
                            * stray reply) */
    CTL_DROP_UNUSABLE,     /* valid, but its metadata cannot be used (a worker
                            * address or rkey UCX refuses, a target replaced
                            * while writes to it run) */
    CTL_DROP_REPLY_LIMITED, /* a refusal or probe answer for an endpoint we have
                             * no connection to, over the budget of such
                             * replies (remote_source.c): not sent */
    CTL_N_DROPS
} ctl_drop;

/* "handshake", "auth", "malformed", "unknown_type", "bad_sender",
 * "unexpected", "unusable", "reply_limited": static strings. */
const char *ctl_drop_name(ctl_drop cause);

/* Drops are logged at most once per this many ms per cause, each line with
 * the number held back since the last (kvcr_log_limited). */
#define CTL_DROP_LOG_MS 1000

/* Answers at most max pending ZAP requests without blocking (CURVE only):
 * a client key in the allow-list is admitted (its Z85 becomes the
 * connection's User-Id), any other refused and logged. Then reads the
 * monitor's failed handshakes (refused by ZAP, not ZMTP, a plaintext peer,
 * a wrong server key, a close mid-handshake), logged likewise, and hands
 * each to cb(ud, cause) with cause CTL_DROP_HANDSHAKE or CTL_DROP_AUTH.
 * Logs are rate-limited per cause (CTL_DROP_LOG_MS). Returns the number of
 * requests and events handled (0 when drained). */
typedef void ctl_drop_cb(void *ud, ctl_drop cause);
size_t ctl_serve_handshakes(ctl_channel *c, size_t max, ctl_drop_cb *cb, void *ud);

/* The monitor's file descriptor: when it fires (or at any time) call
 * ctl_serve_handshakes until it returns 0. */
int ctl_monitor_fd(const ctl_channel *c);

/* With CURVE, incoming connections whose handshake failed so far (see
 * above); 0 without. */
uint64_t ctl_auth_refused(const ctl_channel *c);

/* Whether the channel runs CURVE. */
bool ctl_curve_on(const ctl_channel *c);

/* Receives at most max messages without blocking, handing each to
 * cb(ud, data, len, peer_key) (data valid during the call); peer_key is
 * the Z85 public key ZAP admitted for the connection the message came on,
 * NULL without CURVE. Messages larger than max_message never arrive (the
 * connection that sent one is dropped). Returns the number received. */
typedef void ctl_recv_cb(void *ud, const void *data, size_t len, const char *peer_key);
size_t ctl_recv(ctl_channel *c, size_t max, ctl_recv_cb *cb, void *ud);

/* Checks an endpoint string: "tcp://host:port" with a port 1..65535 and
 * no '#' in the host, optionally followed by "#curve=" and a 40-character
 * Z85 key or by "#lane=" and a port 1..65535, at most CTL_MAX_ENDPOINT
 * bytes in all. 0 or KVCR_EINVAL. */
int ctl_check_endpoint(const char *endpoint);

/* ctl_check_endpoint, and whether this channel may talk to it: a key
 * exactly when CURVE is on, and then one of the allow-list. 0, or
 * KVCR_EINVAL with the reason. */
int ctl_check_peer(const ctl_channel *c, const char *endpoint);

/* The key of a NUL-terminated endpoint (CTL_KEY_LEN characters at its
 * end, after CTL_CURVE_TAG), or NULL when it has none. Syntax only. */
const char *ctl_endpoint_key(const char *endpoint);

/* Connects the PUSH socket for endpoint now (no-op if it exists). This
 * and ctl_send refuse (KVCR_EINVAL) what ctl_check_peer refuses. */
int ctl_connect(ctl_channel *c, const char *endpoint);

/* Queues one message to endpoint without blocking. 0, or a negative code
 * (the peer's socket is then closed and forgotten). */
int ctl_send(ctl_channel *c, const char *endpoint, const void *data, size_t len);

/* Holds the lane's messages until ctl_uncork, which sends each peer's in
 * one write (lane_cork); ZeroMQ's go as before. No-ops without a lane. */
void ctl_cork(ctl_channel *c);
void ctl_uncork(ctl_channel *c);

/* Whether a PUSH socket to endpoint is open (a send there opens no new
 * connection). */
bool ctl_connected(const ctl_channel *c, const char *endpoint);

/* Closes and forgets the PUSH socket of endpoint, if any. */
void ctl_forget(ctl_channel *c, const char *endpoint);

#endif
