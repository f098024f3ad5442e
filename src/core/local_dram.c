#include "core/local_dram.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int dram_pool_init(dram_pool *p, const char *name, size_t block_size, void *base, size_t size,
                   double watermark_percent)
{
    memset(p, 0, sizeof *p);
    strncpy(p->name, name, sizeof p->name - 1);
    p->block_size = block_size;
    if (base == NULL) return 0;
    p->base = base;
    p->n_slots = (uint32_t)(size / block_size);
    p->ring = malloc((size_t)p->n_slots * sizeof *p->ring);
    if (p->ring == NULL) return KVCR_ENOMEM;
    for (uint32_t i = 0; i < p->n_slots; i++) p->ring[i] = i;
    p->n_free = p->n_slots;
    p->watermark = (uint64_t)ceil((double)p->n_slots * watermark_percent / 100.0);
    return 0;
}

void dram_pool_destroy(dram_pool *p)
{
    free(p->ring);
    p->ring = NULL;
}

uint32_t dram_pool_take(dram_pool *p)
{
    uint32_t slot = p->ring[p->head];
    p->head = p->head + 1 == p->n_slots ? 0 : p->head + 1;
    p->n_free--;
    return slot;
}

void dram_pool_exclude(dram_pool *p, const uint64_t *used)
{
    p->head = 0;
    p->n_free = 0;
    for (uint32_t i = 0; i < p->n_slots; i++)
        if (!(used[i / 64] >> (i % 64) & 1)) p->ring[p->n_free++] = i;
}

void dram_pool_give(dram_pool *p, uint32_t slot)
{
    uint64_t tail = (uint64_t)p->head + p->n_free;
    if (tail >= p->n_slots) tail -= p->n_slots;
    p->ring[tail] = slot;
    p->n_free++;
}
