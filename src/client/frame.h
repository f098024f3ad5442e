/* The claim socket's protocol: how an engine's KVCR (the claimant) talks
 * to the KVCR service over a Unix stream socket.
 *
 * Framing: every message is a 4-byte big-endian length (1 .. SVC_FRAME_MAX)
 * followed by that many bytes of msgpack. A frame may carry up to
 * SVC_MAX_FDS descriptors (SCM_RIGHTS) attached to its first byte. A
 * receiver takes them with MSG_CMSG_CLOEXEC and refuses (closing them) any
 * other ancillary data, truncated control data, or more than it asked for.
 *
 * Messages are msgpack maps with string keys. Every message has "type"
 * (a string) and "v" (protocol version, 1). The decoder is strict: unknown
 * or duplicate keys, wrong types, out-of-range values, missing required
 * keys and trailing bytes are all KVCR_EPROTO, and nothing the peer sends
 * can make it allocate more than the frame's own size.
 *
 *   claim      claimant -> service    guard_index, digest, pools (name and
 *                                     block_size each), control_host,
 *                                     control_port, agent, the KV events
 *                                     (endpoint, replay, topic, rank,
 *                                     media, positional)
 *              (+ the claimant's pidfd when it could open one)
 *   granted    service -> claimant    guard_index, generation,
 *                                     mapping_bytes, journal_bytes, pools
 *                                     (name, block_size, offset, size),
 *                                     control_port (the bound one),
 *                                     recovered (blocks in the journal)
 *              (+ the pool file, + the control listener)
 *   release    claimant -> service    activated (true: the engine ran;
 *                                     false: it gave up during start-up)
 *   released   service -> claimant
 *   error      service -> claimant    message
 *   stats      anyone -> service      (asks for metrics)
 *   metrics    service -> asker       text (Prometheus text format) */
#ifndef KVCR_SERVICE_FRAME_H
#define KVCR_SERVICE_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

/* 2: claims carry the claimant's KV events; 3: and their medium names and
 * form (an engine and a service of different versions refuse each other
 * with this number, not a field). */
#define SVC_PROTOCOL_VERSION 3u
#define SVC_FRAME_MAX (1u << 20)
#define SVC_MAX_FDS 2
#define SVC_DIGEST_MAX 256
#define SVC_HOST_MAX 255
#define SVC_KV_MAX 255 /* bytes of a claim's KV-event endpoint, replay endpoint or topic */
#define SVC_TEXT_MAX (SVC_FRAME_MAX - 64)

typedef enum svc_type {
    SVC_CLAIM = 1,
    SVC_GRANTED,
    SVC_RELEASE,
    SVC_RELEASED,
    SVC_ERROR,
    SVC_STATS,
    SVC_METRICS
} svc_type;

typedef struct svc_pool {
    char name[KVCR_NAME_MAX];   /* NUL-terminated, 0 .. KVCR_NAME_MAX-1 bytes */
    uint64_t block_size;        /* > 0 */
    uint64_t offset, size;      /* granted only (0 in a claim): contiguous from
                                 * journal_bytes, each >= block_size */
} svc_pool;

typedef struct svc_msg {
    svc_type type;
    uint32_t guard_index;                    /* claim, granted */
    char digest[SVC_DIGEST_MAX + 1];         /* claim: 1 .. SVC_DIGEST_MAX bytes */
    char agent[KVCR_NAME_MAX];               /* claim: 1 .. KVCR_NAME_MAX-1 bytes */
    uint32_t n_pools;                        /* claim, granted: 1 .. KVCR_MAX_POOLS */
    svc_pool pools[KVCR_MAX_POOLS];
    char control_host[SVC_HOST_MAX + 1];     /* claim: 0 .. SVC_HOST_MAX bytes; "": the
                                              * claimant has no control endpoint (port 0) */
    uint32_t control_port;                   /* claim: 0 .. 65535 (0: any); granted: the
                                              * bound port, 0 without an endpoint */
    /* claim: the claimant's KV events (kvcr_config.kv_events), so that the
     * Guard publishes on its topic and rank while it serves; "" endpoint:
     * none (then replay and topic ""); strings 0 .. SVC_KV_MAX bytes */
    char kv_endpoint[SVC_KV_MAX + 1], kv_replay[SVC_KV_MAX + 1], kv_topic[SVC_KV_MAX + 1];
    uint32_t kv_dp_rank;
    /* claim: the media of its events, 1 .. SVC_KV_MAX bytes each (with an
     * endpoint; "" without), and the older positional form */
    char kv_medium_dram[SVC_KV_MAX + 1], kv_medium_g3[SVC_KV_MAX + 1];
    bool kv_positional;
    uint64_t generation;                     /* granted */
    uint64_t mapping_bytes, journal_bytes;   /* granted: journal < mapping */
    uint64_t recovered;                      /* granted */
    bool activated;                          /* release */
    char *text;                              /* error, metrics: malloc'd, NUL-terminated */
} svc_msg;

/* Encodes m into a malloc'd buffer (the frame's payload, no length). */
int svc_encode(const svc_msg *m, uint8_t **out, size_t *len);

/* Decodes one payload strictly. On failure *m is zeroed, KVCR_EPROTO is
 * returned and kvcr_last_error() says what was wrong. */
int svc_decode(const uint8_t *buf, size_t len, svc_msg *m);

/* Frees m->text (and sets it NULL). */
void svc_msg_clear(svc_msg *m);

/* Sends one frame: the length, the payload, the descriptors (n_fds <=
 * SVC_MAX_FDS) with the first byte. Retries EINTR and short writes;
 * MSG_NOSIGNAL. KVCR_ESYS on failure. */
int svc_send_frame(int sock, const uint8_t *payload, size_t len, const int *fds, size_t n_fds);

/* Receives one frame, waiting at most timeout_ms for each read (-1:
 * forever). Returns 0 with a malloc'd *payload and up to max_fds
 * descriptors in fds[] (*n_fds set; the caller owns them); 1 on a clean
 * EOF before any byte; KVCR_EPROTO for a framing error (bad length, EOF
 * mid-frame, unexpected ancillary data: every descriptor received is
 * closed); KVCR_ESYS for a socket error or a timeout. */
int svc_recv_frame(int sock, uint8_t **payload, size_t *len, int *fds, size_t max_fds,
                   size_t *n_fds, int timeout_ms);

/* Connects to the service's socket (blocking, close-on-exec). KVCR_EINVAL
 * for a path that does not fit a Unix socket address; KVCR_ESYS naming the
 * path and the reason when nobody answers there. */
int svc_connect(const char *path, int *fd);

/* svc_encode + svc_send_frame, and svc_recv_frame + svc_decode. */
int svc_send(int sock, const svc_msg *m, const int *fds, size_t n_fds);
int svc_recv(int sock, svc_msg *m, int *fds, size_t max_fds, size_t *n_fds, int timeout_ms);

#endif
