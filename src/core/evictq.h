/* The evictable queue: ready, unclaimed blocks in (score, seq) order.
 *
 * Two structures share the order. A sorted doubly-linked list takes every
 * block whose score is not below the tail's — always for FIFO, and for LRU
 * whenever the block was just used — so insert, claim (remove) and evict
 * (pop) are O(1) for the built-in policies. Blocks that arrive with a lower
 * score (a custom policy, or LRU after a long claim) go to a binary heap,
 * O(log n). Popping takes the smaller of the two fronts. */
#ifndef KVCR_CORE_EVICTQ_H
#define KVCR_CORE_EVICTQ_H

#include <stdbool.h>

#include "core/index.h"

typedef struct evictq {
    uint32_t head, tail; /* list ends, BLOCK_NONE when empty */
    uint32_t *heap;
    uint32_t heap_n, heap_cap;
    uint64_t count;
    uint64_t next_seq;
    uint64_t *shared_seq; /* queues compared with each other share one counter; NULL: next_seq */
} evictq;

void evq_init(evictq *q);
void evq_destroy(evictq *q);

/* Queues b with the given score as the newest entry. KVCR_ENOMEM leaves it
 * unqueued. */
int evq_insert(evictq *q, block_index *ix, block_id id, double score);
void evq_remove(evictq *q, block_index *ix, block_id id);

/* The lowest (score, seq) block, left in place; BLOCK_NONE when empty.
 * With evq_before, the caller picks among several queues (one per
 * tenant, core/tenants.h) whose blocks share one seq counter. */
block_id evq_front(const evictq *q, const block_index *ix);
/* Whether a comes before b in eviction order (score, then seq). */
bool evq_before(const block_index *ix, block_id a, block_id b);

/* Takes the lowest (score, seq) block out; *from_list says where it was. */
block_id evq_pop(evictq *q, block_index *ix, bool *from_list);

/* Puts back a popped block with its old score and seq. Blocks that came
 * from the list must be restored in the reverse order of their popping. */
void evq_restore(evictq *q, block_index *ix, block_id id, bool from_list);

#endif
