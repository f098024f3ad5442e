/* KVCR-owned DRAM (tier LOCAL_G2): caller-provided memory per pool, cut into
 * slots of the pool's block size, with a FIFO free list (allocation takes the
 * front, freeing appends at the back: slots are reused oldest first). */
#ifndef KVCR_CORE_LOCAL_DRAM_H
#define KVCR_CORE_LOCAL_DRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

typedef struct dram_pool {
    char name[KVCR_NAME_MAX];
    size_t block_size;
    uint8_t *base;      /* NULL when no local DRAM is configured */
    uint32_t n_slots;
    uint32_t *ring;     /* free slots, FIFO */
    uint32_t head, n_free;
    uint64_t evictable; /* slots held by evictable blocks */
    uint64_t watermark; /* capacity_needed threshold in slots; 0 = off */
    bool pressured;
} dram_pool;

/* Sets up a pool's metadata; base may be NULL (no memory, no slots). */
int dram_pool_init(dram_pool *p, const char *name, size_t block_size, void *base, size_t size,
                   double watermark_percent);
void dram_pool_destroy(dram_pool *p);

uint32_t dram_pool_take(dram_pool *p); /* requires n_free > 0 */
/* Rebuilds the free list with every slot whose bit is clear in used (a
 * bitmap of n_slots bits): recovered blocks keep the slots they had. Only
 * before the first take. */
void dram_pool_exclude(dram_pool *p, const uint64_t *used);
void dram_pool_give(dram_pool *p, uint32_t slot);

static inline uint8_t *dram_slot_addr(const dram_pool *p, uint32_t slot)
{
    return p->base + (size_t)slot * p->block_size;
}

#endif
