/* The data plane: UCX UCP, used by one thread (the progress thread).
 *
 * A ucx_ctx is one ucp_context + ucp_worker. Memory is registered once
 * (ucx_mem) and its packed rkey handed to peers; a peer that wants to write
 * to us unpacks it against its endpoint to us. The source writes: ucx_write
 * puts every segment, then flushes the endpoint, and reports once the bytes
 * are complete at the destination (or the transfer failed).
 *
 * Endpoints use peer error handling, so a dead peer fails its writes
 * instead of hanging them. ucx_ctx_create sets UCX_MM_ERROR_HANDLING=y
 * unless the environment already sets it, so that same-host peers get
 * shared memory lanes (sysv, posix) instead of TCP loopback, and sets
 * UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE (larger TCP segments, for puts
 * across hosts) unless the environment sets them or UCX_TLS leaves TCP out;
 * the values and the lanes chosen for each endpoint are logged at info level. A peer that dies is noticed by
 * UCX keepalive, every 1 s unless UCX_KEEPALIVE_INTERVAL is set.
 *
 * UCX 1.13 on one host: a put into memory registered with ucx_mem_register
 * is emulated in software over the shared-memory message lane, so the
 * destination's progress thread must be running (ucx_progress / ucx_fd) for
 * the write to complete. Memory from ucx_mem_alloc is a shared memory
 * segment that same-host peers map: puts into it are plain one-sided
 * copies that need nothing from the destination.
 *
 * Where every lane to a peer is TCP (another host without RDMA), UCX would
 * only emulate puts, with messages the destination's worker copies, and a
 * flush costs a round trip: there a write goes as eager active messages
 * instead (ucx_peer_messages), carrying the write's tag and the
 * destination address of each run of segments (short runs gathered
 * several to a message, see ucx.c), and the destination's sink
 * (ucx_set_sink), called once per run, copies each into place or refuses
 * it. Nothing but the
 * sink then writes the destination's memory, and only while the sink says
 * yes: a destination that gave up on a write drops its late messages
 * instead of waiting to learn that none is left in flight. Large blocks
 * still move faster as emulated puts over TCP (docs/BENCHMARKS.md,
 * "Across hosts"): a write whose destination agreed to puts for it
 * (ucx_write_as with puts_agreed) goes as puts + flush even there, and the
 * destination must then treat it as it treats any put. KVCR_UCX_WRITES
 * (puts, messages, auto: the default) overrides the choice for every
 * write, for comparisons. */
#ifndef KVCR_NET_UCX_H
#define KVCR_NET_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

typedef struct ucx_ctx ucx_ctx;
typedef struct ucx_mem ucx_mem;
typedef struct ucx_peer ucx_peer;
typedef struct ucx_rkey ucx_rkey;

/* 0, or KVCR_ESYS with UCX's reason in the message. */
int ucx_ctx_create(const kvcr_logger *log, ucx_ctx **out);
/* Every peer must be closed first. NULL is ignored. */
void ucx_ctx_destroy(ucx_ctx *c);
/* Where a context made ahead of its user logs from now on: before any
 * other thread uses it. */
void ucx_ctx_set_logger(ucx_ctx *c, const kvcr_logger *log);

/* Makes progress on every transfer; returns the number of events. */
unsigned ucx_progress(ucx_ctx *c);
/* A file descriptor to poll() for POLLIN, and the arm step before sleeping
 * on it: false means events are pending (progress again, do not sleep). */
int ucx_fd(ucx_ctx *c);
bool ucx_arm(ucx_ctx *c);

/* This worker's address, valid until ucx_ctx_destroy. */
void ucx_worker_address(const ucx_ctx *c, const void **addr, size_t *len);

/* Registers [addr, addr+len) for remote writes. */
int ucx_mem_register(ucx_ctx *c, void *addr, size_t len, ucx_mem **out);
/* Allocates len bytes that UCX registers for remote writes (on one host a
 * shared memory segment, see above); ucx_mem_addr gives the address.
 * Freed by ucx_mem_deregister. */
int ucx_mem_alloc(ucx_ctx *c, size_t len, ucx_mem **out);
void *ucx_mem_addr(const ucx_mem *m);
/* The packed rkey, valid until ucx_mem_deregister. */
void ucx_mem_rkey(const ucx_mem *m, const void **rkey, size_t *len);
void ucx_mem_deregister(ucx_mem *m);

/* Takes a write's bytes at the destination: tag and addr from the
 * message, len bytes at data (valid during the call only). Copies them
 * and returns true, or refuses them (false: counted, nothing written).
 * Called by ucx_progress, on its thread. */
typedef bool ucx_sink(void *arg, uint64_t tag, uint64_t addr, const void *data, size_t len);
/* Installs the sink of the writes peers send us as messages (before any
 * peer writes; without one every such message is dropped). */
void ucx_set_sink(ucx_ctx *c, ucx_sink *sink, void *arg);
/* Messages dropped: malformed, not eager, or with a run the sink refused.
 * An atomic counter: any thread may read it. */
uint64_t ucx_sink_dropped(const ucx_ctx *c);

/* Creates an endpoint to a peer worker from its address (bytes from the
 * wire: a malformed address gives an error, never a crash; see ucx.c for
 * what is checked and what UCX is still trusted with). */
int ucx_peer_connect(ucx_ctx *c, const void *worker_addr, size_t len, ucx_peer **out);
/* True when writes to this peer go as active messages (see above). */
bool ucx_peer_messages(const ucx_peer *p);
/* Whether a write to this peer goes as messages when its destination
 * agreed (puts_agreed) or not to puts over message lanes: messages when
 * the peer takes them, unless the destination agreed and the choice is
 * the lanes' (KVCR_UCX_WRITES forces it otherwise). */
bool ucx_write_messages(const ucx_peer *p, bool puts_agreed);
/* Writes posted so far as puts and as messages (any thread). */
void ucx_writes_posted(const ucx_ctx *c, uint64_t *puts, uint64_t *messages);
/* True once UCX reported the peer unreachable; its writes fail. */
bool ucx_peer_failed(const ucx_peer *p);
/* Writes still running on the peer's endpoint. */
uint32_t ucx_peer_busy(const ucx_peer *p);
/* Closes the endpoint. Only with no write running (ucx_peer_busy == 0:
 * otherwise it logs an error and leaves the endpoint open); rkeys unpacked
 * on it must be destroyed first. Waits at most 2 s for a live peer. */
void ucx_peer_close(ucx_peer *p);
/* Gives up on a peer that stopped answering: its endpoint is closed by
 * force, which completes every write still running on it as failed (they
 * are reported by the next ucx_progress); UCX reads none of their sources
 * after that, and the process's TCP connections with the peer are reset
 * first, so that nothing they held reaches the peer later (see ucx.c,
 * reset_tcp). The peer is failed from then on; ucx_peer_close
 * frees it. */
void ucx_peer_abort(ucx_peer *p);
/* Endpoints aborted so far, and the TCP connections those aborts reset
 * (any thread). */
void ucx_abort_counts(const ucx_ctx *c, uint64_t *aborts, uint64_t *tcp_resets);

/* buf is a packed rkey from ucx_mem_rkey on the peer; its layout is checked
 * before UCX reads it. */
int ucx_rkey_unpack(ucx_peer *p, const void *buf, size_t len, ucx_rkey **out);
void ucx_rkey_destroy(ucx_rkey *r);

/* One segment of a write: len bytes from local src (inside registered
 * memory `mem`, or NULL if unregistered) to remote_addr under rkey. */
typedef struct ucx_seg {
    const void *src;
    const ucx_mem *mem;
    uint64_t remote_addr;
    const ucx_rkey *rkey;
    size_t len;
} ucx_seg;

/* Puts every segment (segments contiguous on both sides are merged), then
 * flushes the endpoint; or, to a peer that takes messages, sends the runs
 * as messages tagged `tag` (no flush). done(ud, status) is called exactly
 * once, from ucx_progress (never from inside ucx_write), with 0 when every
 * byte is in place at the destination (messages: sent, for the
 * destination's sink to take) or a negative code when any part failed; it
 * is called only when UCX holds no more requests of this write, so the
 * source memory is quiet from then on. Returns 0, or a negative code (done
 * is then never called, and nothing was posted). */
int ucx_write(ucx_peer *p, const ucx_seg *segs, size_t n, uint64_t tag,
              void (*done)(void *ud, int status), void *ud);
/* ucx_write, as puts + flush even to a peer that takes messages when
 * puts_agreed (the destination agreed to puts for this write) and
 * ucx_write_messages says so. */
int ucx_write_as(ucx_peer *p, const ucx_seg *segs, size_t n, uint64_t tag, bool puts_agreed,
                 void (*done)(void *ud, int status), void *ud);

#endif
