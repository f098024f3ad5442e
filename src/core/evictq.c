#include "core/evictq.h"

#include <stdlib.h>

#include "kvcr/error.h"

void evq_init(evictq *q)
{
    q->head = q->tail = BLOCK_NONE;
    q->heap = NULL;
    q->heap_n = q->heap_cap = 0;
    q->count = 0;
    q->next_seq = 1;
    q->shared_seq = NULL;
}

void evq_destroy(evictq *q)
{
    free(q->heap);
    q->heap = NULL;
}

static bool before(const block *a, const block *b)
{
    return a->score < b->score || (a->score == b->score && a->seq < b->seq);
}

/* ---- list ---------------------------------------------------------------- */

static void list_append(evictq *q, block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    b->q_prev = q->tail;
    b->q_next = BLOCK_NONE;
    if (q->tail != BLOCK_NONE)
        index_get(ix, q->tail)->q_next = id;
    else
        q->head = id;
    q->tail = id;
    b->flags |= BF_IN_LIST;
}

static void list_prepend(evictq *q, block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    b->q_prev = BLOCK_NONE;
    b->q_next = q->head;
    if (q->head != BLOCK_NONE)
        index_get(ix, q->head)->q_prev = id;
    else
        q->tail = id;
    q->head = id;
    b->flags |= BF_IN_LIST;
}

static void list_unlink(evictq *q, block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    if (b->q_prev != BLOCK_NONE)
        index_get(ix, b->q_prev)->q_next = b->q_next;
    else
        q->head = b->q_next;
    if (b->q_next != BLOCK_NONE)
        index_get(ix, b->q_next)->q_prev = b->q_prev;
    else
        q->tail = b->q_prev;
    b->q_prev = b->q_next = BLOCK_NONE;
    b->flags &= (uint8_t)~BF_IN_LIST;
}

/* ---- heap (the heap index lives in q_prev) ------------------------------ */

static void heap_set(evictq *q, block_index *ix, uint32_t i, block_id id)
{
    q->heap[i] = id;
    index_get(ix, id)->q_prev = i;
}

static void heap_up(evictq *q, block_index *ix, uint32_t i)
{
    block_id id = q->heap[i];
    const block *b = index_get(ix, id);
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!before(b, index_get(ix, q->heap[parent]))) break;
        heap_set(q, ix, i, q->heap[parent]);
        i = parent;
    }
    heap_set(q, ix, i, id);
}

static void heap_down(evictq *q, block_index *ix, uint32_t i)
{
    block_id id = q->heap[i];
    const block *b = index_get(ix, id);
    for (;;) {
        uint32_t child = 2 * i + 1;
        if (child >= q->heap_n) break;
        if (child + 1 < q->heap_n &&
            before(index_get(ix, q->heap[child + 1]), index_get(ix, q->heap[child])))
            child++;
        if (!before(index_get(ix, q->heap[child]), b)) break;
        heap_set(q, ix, i, q->heap[child]);
        i = child;
    }
    heap_set(q, ix, i, id);
}

static int heap_push(evictq *q, block_index *ix, block_id id)
{
    if (q->heap_n == q->heap_cap) {
        uint32_t cap = q->heap_cap ? q->heap_cap * 2 : 256;
        uint32_t *h = realloc(q->heap, cap * sizeof *h);
        if (h == NULL) return KVCR_ENOMEM;
        q->heap = h;
        q->heap_cap = cap;
    }
    q->heap[q->heap_n++] = id;
    heap_up(q, ix, q->heap_n - 1);
    index_get(ix, id)->flags |= BF_IN_HEAP;
    return 0;
}

static void heap_remove_at(evictq *q, block_index *ix, uint32_t i)
{
    block *b = index_get(ix, q->heap[i]);
    b->flags &= (uint8_t)~BF_IN_HEAP;
    b->q_prev = BLOCK_NONE;
    q->heap_n--;
    if (i == q->heap_n) return;
    block_id moved = q->heap[q->heap_n];
    heap_set(q, ix, i, moved);
    if (i > 0 && before(index_get(ix, moved), index_get(ix, q->heap[(i - 1) / 2])))
        heap_up(q, ix, i);
    else
        heap_down(q, ix, i);
}

/* ---- queue --------------------------------------------------------------- */

static int place(evictq *q, block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    if (q->tail == BLOCK_NONE || !before(b, index_get(ix, q->tail))) {
        list_append(q, ix, id);
        return 0;
    }
    return heap_push(q, ix, id);
}

int evq_insert(evictq *q, block_index *ix, block_id id, double score)
{
    block *b = index_get(ix, id);
    b->score = score;
    b->seq = q->shared_seq ? (*q->shared_seq)++ : q->next_seq++;
    int rc = place(q, ix, id);
    if (rc == 0) q->count++;
    return rc;
}

void evq_remove(evictq *q, block_index *ix, block_id id)
{
    block *b = index_get(ix, id);
    if (b->flags & BF_IN_LIST)
        list_unlink(q, ix, id);
    else if (b->flags & BF_IN_HEAP)
        heap_remove_at(q, ix, b->q_prev);
    else
        return;
    q->count--;
}

/* The front of the queue and whether it is the list's. */
static block_id front(const evictq *q, const block_index *ix, bool *from_list)
{
    block_id l = q->head, h = q->heap_n ? q->heap[0] : BLOCK_NONE;
    if (l == BLOCK_NONE && h == BLOCK_NONE) return BLOCK_NONE;
    *from_list = h == BLOCK_NONE || (l != BLOCK_NONE && before(index_get(ix, l), index_get(ix, h)));
    return *from_list ? l : h;
}

block_id evq_front(const evictq *q, const block_index *ix)
{
    bool from_list;
    return front(q, ix, &from_list);
}

bool evq_before(const block_index *ix, block_id a, block_id b)
{
    return before(index_get(ix, a), index_get(ix, b));
}

block_id evq_pop(evictq *q, block_index *ix, bool *from_list)
{
    block_id id = front(q, ix, from_list);
    if (id != BLOCK_NONE) evq_remove(q, ix, id);
    return id;
}

void evq_restore(evictq *q, block_index *ix, block_id id, bool from_list)
{
    if (from_list) {
        list_prepend(q, ix, id);
        q->count++;
    } else {
        /* Popping left the heap's capacity in place, so this cannot fail. */
        (void)heap_push(q, ix, id);
        q->count++;
    }
}
