/* The header of a write message (net/ucx.h: writes sent as UCX active
 * messages), little-endian u64 throughout, in one of two layouts told
 * apart by the header's length:
 * - one run (AMHDR_ONE bytes): the write's tag and the destination
 *   address; the payload is the run.
 * - several runs (AMHDR_LEN(n) = 8 + 16 n bytes, n in 2..AMHDR_MAX_RUNS):
 *   the tag, then (destination address, length) for each run; the payload
 *   is the runs one after the other, their lengths summing to it exactly.
 * The one-run layout is the first AMHDR_ONE bytes of the other, so a
 * sender fills one layout and sends as many bytes as the count says.
 * Pure functions, no UCX: the decoder is fuzzed alone
 * (tests/fuzz/fuzz-ucx-write-header.c). Any thread. */
#ifndef KVCR_NET_AMHDR_H
#define KVCR_NET_AMHDR_H

#include <stddef.h>
#include <stdint.h>

#define AMHDR_ONE 16
#define AMHDR_RUN 16
#define AMHDR_MAX_RUNS 32
#define AMHDR_LEN(n) ((n) == 1 ? (size_t)AMHDR_ONE : 8 + (size_t)(n) * AMHDR_RUN)

/* Writes the tag, then run k's entry (k from 0), into a header at h. */
void amhdr_set_tag(uint8_t *h, uint64_t tag);
void amhdr_set_run(uint8_t *h, size_t k, uint64_t addr, uint64_t len);

/* Checks a received header of hlen bytes against its payload's length:
 * the number of runs, or 0 when it is malformed (a length that is neither
 * layout, a count outside 2..AMHDR_MAX_RUNS, a run of zero bytes, lengths
 * that do not sum to the payload exactly, or an empty payload). */
size_t amhdr_check(const uint8_t *h, size_t hlen, size_t payload);
uint64_t amhdr_tag(const uint8_t *h);
/* Run k of a header amhdr_check accepted: its destination address and
 * length (one run: the whole payload). */
void amhdr_run(const uint8_t *h, size_t hlen, size_t payload, size_t k, uint64_t *addr,
               size_t *len);

#endif
