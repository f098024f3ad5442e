/* The peer control protocol's messages and their one strict decoder
 * (docs/ARCHITECTURE.md, the peer tier). Each ZeroMQ message is exactly one
 * msgpack map with string keys. Every message carries the protocol version,
 * its type, the sender's agent name, its per-process incarnation and the
 * endpoint it was addressed to; replies go to the sender's endpoint.
 *
 *   metadata         target -> source  the target's UCX worker address and
 *                                      regions (rkeys), so the source can write
 *   metadata_ack     source -> target  [op]
 *   start_write      target -> source  op, remaining_ms, [expected_inc], keys,
 *                                      dst refs per key, [metadata], [inline]
 *                                      (inline: the bytes go in write_done, never
 *                                      with UCX; asked for small writes), [put_min]
 *                                      (puts even over TCP lanes when every
 *                                      destination piece is at least this big)
 *   write_done       source -> target  op, success, terminal, completed indices,
 *                                      [am_bytes] (after the UCX flush completed; or,
 *                                      when the data went as active messages, once
 *                                      they were sent: am_bytes says how many bytes
 *                                      the target must have taken before it believes
 *                                      the write complete); or [inline runs and
 *                                      their bytes] when start_write asked so;
 *                                      [times] (the source's own durations: serving
 *                                      the write, of which waiting for pins and
 *                                      writing the data, on its own clock)
 *   write_refused    source -> target  op, [busy] (no route back, or busy: at one of
 *                                      the source's limits; nothing was written)
 *   write_probe      target -> source  op, [expected_inc]
 *   write_probe_ack  source -> target  op, terminal, [dead_inc]
 *
 * Decoding is all-or-nothing: a message with a missing or mistyped field,
 * an unknown or duplicate key, a wrong version, trailing bytes or any bound
 * exceeded is refused whole, and the caller drops and counts it. Decoded
 * byte strings point into the message's own storage (freed by
 * wire_msg_free), never into the input buffer; each is followed there by a
 * NUL (not counted in len), and names, labels and endpoints are UTF-8
 * without NULs, so they can be used as C strings. The encoding itself is
 * described at the top of wire.c. */
#ifndef KVCR_NET_WIRE_H
#define KVCR_NET_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_VERSION 1
#define WIRE_MAX_MESSAGE (16u << 20) /* bytes of one encoded message */
#define WIRE_MAX_KEYS 65536          /* keys of one start_write */
#define WIRE_MAX_REFS 255            /* destination refs of one key */
#define WIRE_MAX_REGIONS 256         /* regions in one metadata */
#define WIRE_MAX_KEY 1024            /* bytes of one key (KVCR_KEY_MAX) */
#define WIRE_MAX_NAME 256            /* agent names, labels, endpoints */
#define WIRE_MAX_BLOB 65536          /* worker address, one packed rkey */
#define WIRE_INCARNATION_LEN 16      /* raw bytes of an incarnation id */
#define WIRE_MAX_INLINE (1u << 20)   /* bytes carried inline by one write_done */
#define WIRE_MAX_TIME_NS ((uint64_t)INT64_MAX) /* a duration in write_done's times */

enum wire_type {
    WIRE_METADATA = 1,
    WIRE_METADATA_ACK,
    WIRE_START_WRITE,
    WIRE_WRITE_DONE,
    WIRE_WRITE_REFUSED,
    WIRE_WRITE_PROBE,
    WIRE_WRITE_PROBE_ACK
};

/* The string form on the wire ("start_write", ...), or NULL. */
const char *wire_type_name(int type);

typedef struct wire_bytes {
    const uint8_t *data;
    size_t len;
} wire_bytes;

/* One registered region of the sender, as the writer needs it. */
typedef struct wire_region {
    wire_bytes label;       /* pool name ("" allowed), <= WIRE_MAX_NAME */
    bool framework;         /* framework region (true) or KVCR DRAM pool (false) */
    uint64_t addr;          /* base address in the sender's process */
    uint64_t element_size;  /* > 0 */
    uint64_t stride;        /* >= element_size */
    uint64_t count;         /* >= 1; addr+(count-1)*stride+element_size must not overflow */
    wire_bytes rkey;        /* UCX packed rkey, 1..WIRE_MAX_BLOB */
} wire_region;

typedef struct wire_metadata {
    wire_bytes worker_addr; /* UCX worker address, 1..WIRE_MAX_BLOB */
    uint32_t n_regions;     /* 0..WIRE_MAX_REGIONS */
    wire_region *regions;
} wire_metadata;

/* One destination element in the target's regions. */
typedef struct wire_ref {
    bool framework;
    wire_bytes label;
    uint64_t index;
} wire_ref;

/* A source's durations of one write, in nanoseconds of its own monotonic
 * clock (never a timestamp: the hosts' clocks are not compared). serve runs
 * from taking start_write to sending the write_done; pin (waiting for
 * framework pins) and data (writing the bytes: UCX put to flush, messages
 * sent, or the inline copy) are parts of it: pin + data <= serve <=
 * WIRE_MAX_TIME_NS. */
typedef struct wire_times {
    uint64_t serve_ns, pin_ns, data_ns;
} wire_times;

/* One run of an inline write: len bytes at addr in the target's memory. */
typedef struct wire_run {
    uint64_t addr;
    uint64_t len;              /* >= 1; addr + len does not overflow */
} wire_run;

typedef struct wire_msg {
    uint8_t type;              /* enum wire_type */
    wire_bytes agent;          /* sender agent name, 1..WIRE_MAX_NAME */
    wire_bytes incarnation;    /* exactly WIRE_INCARNATION_LEN bytes */
    wire_bytes from;           /* sender's control endpoint (where replies go), 1..WIRE_MAX_NAME */
    wire_bytes to;             /* endpoint the sender addressed, 1..WIRE_MAX_NAME */

    bool has_metadata;         /* metadata (required), start_write, write_probe (optional) */
    wire_metadata md;

    bool has_op;               /* every type but metadata (where it is absent) */
    int64_t op;                /* metadata_ack: optional */

    /* start_write */
    double remaining_ms;       /* finite, > 0 */
    uint32_t n_keys;           /* 1..WIRE_MAX_KEYS */
    wire_bytes *keys;          /* each 1..WIRE_MAX_KEY bytes */
    uint32_t *ref_off;         /* n_keys + 1 offsets into refs; each key has 1..WIRE_MAX_REFS */
    wire_ref *refs;

    /* start_write, write_probe: the incarnation the target expects of the
     * source (optional: unknown) */
    bool has_expected_inc;
    wire_bytes expected_inc;   /* WIRE_INCARNATION_LEN bytes */
    /* start_write: write the bytes inline in write_done, never with UCX
     * (optional; only true is carried) */
    bool inline_write;
    /* start_write: the target takes UCX puts for this write even where every
     * lane is TCP (net/ucx.h) if every destination piece its refs resolve to
     * holds at least put_min bytes (optional, >= 1, never with inline_write;
     * absent: writes over such lanes go as messages) */
    bool has_put_min;
    uint64_t put_min;

    /* write_done, write_probe_ack */
    bool success;              /* write_done */
    bool terminal;             /* write_done, write_probe_ack */
    uint32_t n_completed;      /* write_done: distinct indices, each < WIRE_MAX_KEYS; */
    uint32_t *completed;       /* only when success (empty otherwise) */
    bool has_am_bytes;         /* write_done with success: the data went as UCX */
    uint64_t am_bytes;         /* active messages, this many bytes (net/ucx.h) */
    bool has_inline;           /* write_done with success, not with am_bytes: */
    uint32_t n_runs;           /* 1..WIRE_MAX_INLINE runs, whose lengths sum to */
    wire_run *runs;            /* inline_data.len (1..WIRE_MAX_INLINE bytes), the */
    wire_bytes inline_data;    /* bytes of the runs one after another */
    bool has_times;            /* write_done (optional): the source's durations */
    wire_times times;

    /* write_refused: refused at one of the source's limits (optional; only
     * true is carried) */
    bool busy;

    /* write_probe_ack: the incarnation known to be dead (optional) */
    bool has_dead_inc;
    wire_bytes dead_inc;

    void *storage;             /* owned by the decoder / wire_msg_free */
} wire_msg;

/* Strictly decodes one message. 0 on success (free with wire_msg_free), or
 * -1 with *why set to a static description of the first rule broken; *out
 * then owns nothing. */
int wire_decode(const void *buf, size_t len, wire_msg *out, const char **why);
/* The *why of a message that is well formed up to its type, which this
 * version does not know (a receiver counts it apart from malformed ones). */
extern const char wire_unknown_type[];
void wire_msg_free(wire_msg *m);

/* Encodes m (storage ignored; fields as the type needs them) into a malloc'd
 * buffer. 0, or -1 when out of memory or m breaks a bound the decoder
 * enforces (an encoder never produces what the decoder refuses). */
int wire_encode(const wire_msg *m, void **buf, size_t *len);

/* Whether a and b carry the same fields with the same values (the fields
 * their type carries; storage ignored). Both must be encodable messages. */
bool wire_msg_equal(const wire_msg *a, const wire_msg *b);

#endif
