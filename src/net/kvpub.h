/* The KV-event publisher: events (net/kvev.h) gathered into batches and
 * sent on a ZeroMQ publisher socket by a thread of its own, with a ring of
 * the last batches for replay.
 *
 * A message is exactly three frames: the topic, the batch's sequence
 * number (8 bytes big-endian, from first_seq, +1 per batch sent) and the
 * payload [ts, [events], dp_rank]. A batch closes when it holds
 * max_batch_events events or its first event is batch_interval_ms old.
 * Memory is bounded: at most max_queued_batches closed batches wait for the
 * thread (a batch that finds the queue full is dropped and counted), the
 * socket holds at most buffer_batches messages per subscriber, and the
 * ring keeps the last buffer_batches batches. Nothing waits on a
 * subscriber: the socket refuses a message when a subscriber's queue is
 * full (the batch is counted dropped, keeps its number and stays in the
 * ring, so a subscriber sees the gap and can replay it).
 *
 * Every subscription (XPUB_VERBOSE: a second subscriber of the same
 * topic too) is answered with an empty batch, [ts, [], dp_rank], numbered
 * as the next: a subscriber that joined late learns the stream's number
 * and replays what it missed (Dynamo's listeners and kvcr demo's router
 * do), where otherwise it would wait for the next event to notice.
 *
 * Replay (replay_endpoint, a ROUTER socket, always bound): a request is one
 * frame of 8 bytes, the big-endian start sequence (after the client's
 * identity, and the empty delimiter a REQ client adds); the answer is
 * [seq, payload] for every kept batch from there, then
 * [0xFFFFFFFFFFFFFFFF, empty], each with the request's envelope.
 *
 * Threads: kvpub_add and kvpub_counts from any thread (the publisher's
 * lock, held only to append bytes); the sockets belong to the publisher's
 * thread alone. */
#ifndef KVCR_NET_KVPUB_H
#define KVCR_NET_KVPUB_H

#include <stdbool.h>
#include <stdint.h>

#include "net/kvev.h"
#include "util/log.h"

typedef struct kvpub kvpub;

typedef struct kvpub_opts {
    const char *endpoint;        /* bound when it holds "*", "::", "ipc://" or "inproc://" */
    const char *replay_endpoint; /* NULL: no replay */
    const char *topic;
    uint32_t dp_rank;
    uint32_t buffer_batches, max_batch_events, batch_interval_ms, max_queued_batches;
    bool positional;
    uint64_t first_seq;          /* where the numbering starts */
    /* Called on the publisher's thread when a batch has taken its number,
     * before it is sent, with the number the next batch gets: where a
     * successor continues the stream if this process dies now (it never
     * reuses a number sent). NULL: nobody continues it. */
    void (*numbered)(void *ud, uint64_t next_seq);
    void *numbered_ud;
} kvpub_opts;

typedef struct kvpub_counts {
    uint64_t published; /* batches sent */
    uint64_t dropped;   /* batches refused: queue full, or a subscriber's queue full */
    uint64_t events_dropped;
    uint64_t next_seq;  /* the number the next batch gets */
} kvpub_counts;

/* Whether an endpoint is bound rather than connected. */
bool kvpub_binds(const char *endpoint);

/* Opens the sockets (on the caller's thread, so a bad endpoint is
 * reported here: KVCR_EINVAL / KVCR_ESYS with the reason) and starts the
 * thread. */
int kvpub_open(const kvpub_opts *o, const kvcr_logger *log, kvpub **out);

/* Appends an event to the open batch. 0, or -1 when it was dropped (out of
 * memory, or its batch found the queue full; counted). */
int kvpub_add(kvpub *p, const kvev_event *e);

void kvpub_counts_get(kvpub *p, kvpub_counts *c);

/* Sends what is queued (the sockets linger at most 200 ms for it), stops
 * the thread, closes the sockets and frees; *last (may be NULL) gets the
 * final counts. NULL p is fine. */
void kvpub_close(kvpub *p, kvpub_counts *last);

#endif
