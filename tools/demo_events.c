/* kvcr demo: the router's intake of KV events, as a KV-aware router of
 * Dynamo or llm-d takes them. Engine e's KVCR binds port kv_pub_port[e]
 * on every address as a vLLM engine does (the router connects one
 * SUB socket per engine to tcp://<engine address>:<port>, and any other
 * subscriber may too), topic kv@engine-<e>@demo, and answers replay on
 * its own tcp://<engine address>:<kv_replay_port[e]>. Every message is checked
 * (three frames, the topic, the sequence number) and its payload decoded
 * by libkvcr's strict decoder (compiled into the tool, net/kvev.h). A gap
 * in the numbering (a subscription that came late, a slow reader) is
 * filled from the engine's replay; a number lower than expected is a new
 * process (its first batch clears what the old one announced). A gap
 * nothing follows yet (the first batches, sent before the subscription
 * took) shows only when the router asks: demo_events_catch_up. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "demo.h"
#include "net/kvev.h"

#define REPLAY_WAIT_MS 1000 /* one replay, at most */

typedef struct kv_stream {
    void *sub;
    char topic[64];
    char replay[DEMO_ENDPOINT_MAX];
    bool have_seq;
    uint64_t next_seq;
    /* [dup_lo, dup_hi): batches a catch-up applied from the replay that
     * the SUB socket may still bring (skipped, not taken for a restart) */
    uint64_t dup_lo, dup_hi;
} kv_stream;

struct demo_events {
    void *ctx;
    int engines;
    kv_stream s[DEMO_MAX_ENGINES];
    demo_events_apply apply;
    void *ud;
    demo_events_figures fig;
};

int demo_events_open(const demo_opts *o, demo_events_apply apply, void *ud, demo_events **out)
{
    demo_events *d = calloc(1, sizeof *d);
    if (d == NULL || (d->ctx = zmq_ctx_new()) == NULL) {
        free(d);
        fprintf(stderr, "kvcr demo: router: no ZeroMQ context for the KV events\n");
        return -1;
    }
    d->engines = o->engines;
    d->apply = apply;
    d->ud = ud;
    for (int e = 0; e < o->engines; e++) {
        kv_stream *s = &d->s[e];
        char bound[DEMO_ENDPOINT_MAX], where[DEMO_ENDPOINT_MAX];
        demo_kv_endpoints(o, e, bound, sizeof bound, where, sizeof where, s->replay,
                          sizeof s->replay);
        snprintf(s->topic, sizeof s->topic, "kv@engine-%d@demo", e);
        int zero = 0;
        s->sub = zmq_socket(d->ctx, ZMQ_SUB);
        if (s->sub == NULL || zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, s->topic, strlen(s->topic)) != 0 ||
            zmq_connect(s->sub, where) != 0) {
            fprintf(stderr, "kvcr demo: router: cannot connect to the KV-event endpoint %s: %s\n",
                    where, zmq_strerror(errno));
            demo_events_close(d);
            return -1;
        }
    }
    *out = d;
    return 0;
}

void demo_events_close(demo_events *d)
{
    if (d == NULL) return;
    for (int e = 0; e < d->engines; e++)
        if (d->s[e].sub) zmq_close(d->s[e].sub);
    zmq_ctx_term(d->ctx);
    free(d);
}

int demo_events_items(demo_events *d, zmq_pollitem_t *items)
{
    for (int e = 0; e < d->engines; e++) items[e] = (zmq_pollitem_t){d->s[e].sub, 0, ZMQ_POLLIN, 0};
    return d->engines;
}

const demo_events_figures *demo_events_figures_of(const demo_events *d)
{
    return &d->fig;
}

/* One payload into the index. -1: it does not decode (the stream is broken). */
static int apply_payload(demo_events *d, int e, const void *payload, size_t len)
{
    kvev_batch b;
    const char *why = kvev_decode_batch(payload, len, &b);
    if (why) {
        fprintf(stderr, "kvcr demo: router: engine %d sent a batch that does not decode: %s\n", e,
                why);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < b.n_events; i++) {
        const kvev_event *ev = &b.events[i];
        rc = d->apply(d->ud, e, (int)ev->type, ev->medium, ev->hashes, ev->n_hashes);
        d->fig.events++;
    }
    d->fig.batches++;
    kvev_batch_free(&b);
    return rc;
}

/* Receives one frame into a message; false when there is none (or no
 * more of the message where one was promised). */
static bool recv_frame(void *sock, zmq_msg_t *m, int flags)
{
    zmq_msg_init(m);
    if (zmq_msg_recv(m, sock, flags) >= 0) return true;
    zmq_msg_close(m);
    return false;
}

/* Fills [from, to) from the engine's replay. The batches arrive in order;
 * one the index already has is skipped; *next (may be NULL) gets one past
 * the last applied. 0 (filled or not: a gap that stays is counted), -1
 * when a replayed batch does not decode. */
static int replay(demo_events *d, int e, uint64_t from, uint64_t to, uint64_t *next)
{
    kv_stream *s = &d->s[e];
    void *dealer = zmq_socket(d->ctx, ZMQ_DEALER);
    int zero = 0, wait = REPLAY_WAIT_MS;
    uint8_t be[8];
    kvev_put_be64(be, from);
    int rc = 0;
    bool ended = false;
    if (dealer && zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
        zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &wait, sizeof wait) == 0 &&
        zmq_connect(dealer, s->replay) == 0 && zmq_send(dealer, "", 0, ZMQ_SNDMORE) == 0 &&
        zmq_send(dealer, be, 8, 0) == 8) {
        /* bounded: the batches asked for and the end marker, or one ring's worth */
        for (uint64_t got = 0; rc == 0 && !ended && got <= to - from && got <= 10000; got++) {
            zmq_msg_t f[3];
            int n = 0;
            while (n < 3 && recv_frame(dealer, &f[n], 0)) {
                n++;
                if (!zmq_msg_more(&f[n - 1])) break;
            }
            if (n == 3 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[1]) == 8) {
                uint64_t seq = kvev_get_be64(zmq_msg_data(&f[1]));
                ended = seq == KVEV_END_SEQ;
                if (!ended && seq >= from && seq < to) {
                    rc = apply_payload(d, e, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
                    if (next) *next = seq + 1;
                }
                ended |= seq + 1 >= to;
            } else {
                ended = true; /* timed out, or not a replay answer: what is missing stays */
            }
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
        }
    }
    if (dealer) zmq_close(dealer);
    d->fig.replays++;
    if (!ended) d->fig.unfilled++;
    return rc;
}

/* One message of engine e's stream, checked frame by frame. 1 when there
 * was one, 0 when none waits, -1 on a broken stream. */
static int read_one(demo_events *d, int e)
{
    kv_stream *s = &d->s[e];
    zmq_msg_t f[3];
    int n = 0;
    if (!recv_frame(s->sub, &f[0], ZMQ_DONTWAIT)) return 0;
    n = 1;
    while (zmq_msg_more(&f[n - 1]) && n < 3 && recv_frame(s->sub, &f[n], 0)) n++;
    int rc = 1;
    if (n != 3 || zmq_msg_more(&f[2]) || zmq_msg_size(&f[1]) != 8 ||
        zmq_msg_size(&f[0]) != strlen(s->topic) ||
        memcmp(zmq_msg_data(&f[0]), s->topic, strlen(s->topic)) != 0) {
        fprintf(stderr, "kvcr demo: router: engine %d sent a message that is not three frames "
                        "(topic, sequence, payload)\n", e);
        rc = -1;
    } else {
        uint64_t seq = kvev_get_be64(zmq_msg_data(&f[1]));
        bool dup = seq >= s->dup_lo && seq < s->dup_hi;
        if (seq >= s->dup_hi) s->dup_lo = s->dup_hi = 0; /* past what a catch-up brought */
        if (dup) {
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            return 1;
        }
        if (s->have_seq && seq < s->next_seq) s->have_seq = false; /* a new process */
        uint64_t want = s->have_seq ? s->next_seq : 0;
        if (seq > want && replay(d, e, want, seq, NULL) != 0) rc = -1;
        if (rc == 1 && apply_payload(d, e, zmq_msg_data(&f[2]), zmq_msg_size(&f[2])) != 0)
            rc = -1;
        s->have_seq = true;
        s->next_seq = seq + 1;
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    return rc;
}

int demo_events_catch_up(demo_events *d, int e)
{
    kv_stream *s = &d->s[e];
    uint64_t want = s->have_seq ? s->next_seq : 0, next = want;
    d->fig.catch_ups++;
    if (replay(d, e, want, KVEV_END_SEQ, &next) != 0) return -1;
    if (next > want) {
        s->have_seq = true;
        s->next_seq = next;
        s->dup_lo = want;
        s->dup_hi = next;
    }
    return 0;
}

int demo_events_read(demo_events *d, int e)
{
    for (int i = 0; i < 1024; i++) { /* bounded: the pipes get their turn */
        int rc = read_one(d, e);
        if (rc <= 0) return rc;
    }
    return 0;
}
