/* The peer control channel over ZeroMQ (p2p_spec §2.1): one PULL socket
 * bound at this instance's control endpoint, one PUSH socket per peer
 * endpoint, created on first use (or eagerly with ctl_connect) and cached.
 * Sends never block: a full queue or any ZeroMQ error closes and forgets
 * that peer's socket, and the next send makes a new one. The channel knows
 * nothing of message contents (see net/wire.h).
 *
 * A channel is used by one thread at a time (the progress thread). */
#ifndef KVCR_NET_CONTROL_H
#define KVCR_NET_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

#define CTL_MAX_ENDPOINT 256

typedef struct ctl_channel ctl_channel;

/* Binds tcp://bind_host:port (port 0: a free port chosen by the system)
 * and advertises tcp://advertise_host:<port>. KVCR_EINVAL for a bad host,
 * KVCR_ESYS (message with the reason) when the port cannot be bound.
 * listener >= 0: a TCP socket already bound and listening (the KVCR
 * service's, so that the endpoint outlives this process) that ZeroMQ
 * adopts (ZMQ_USE_FD) and closes; port is then the one it is bound to.
 * It is closed on failure too. */
int ctl_open(const char *bind_host, uint16_t port, int listener, const char *advertise_host,
             size_t max_message, const kvcr_logger *log, ctl_channel **out);
void ctl_close(ctl_channel *c);

/* "tcp://<advertise_host>:<port>". */
const char *ctl_endpoint(const ctl_channel *c);

/* A file descriptor to poll() for POLLIN; after it fires (or at any time)
 * call ctl_recv until it returns 0 (ZeroMQ's edge-triggered ZMQ_FD). */
int ctl_fd(const ctl_channel *c);

/* Receives at most max messages without blocking, handing each to
 * cb(ud, data, len) (data valid during the call). Messages larger than
 * max_message never arrive (the connection that sent one is dropped).
 * Returns the number received. */
size_t ctl_recv(ctl_channel *c, size_t max, void (*cb)(void *ud, const void *data, size_t len),
                void *ud);

/* Checks an endpoint string: "tcp://host:port" with a port 1..65535 and
 * at most CTL_MAX_ENDPOINT bytes. 0 or KVCR_EINVAL. */
int ctl_check_endpoint(const char *endpoint);

/* Connects the PUSH socket for endpoint now (no-op if it exists). */
int ctl_connect(ctl_channel *c, const char *endpoint);

/* Queues one message to endpoint without blocking. 0, or a negative code
 * (the peer's socket is then closed and forgotten). */
int ctl_send(ctl_channel *c, const char *endpoint, const void *data, size_t len);

/* Closes and forgets the PUSH socket of endpoint, if any. */
void ctl_forget(ctl_channel *c, const char *endpoint);

#endif
