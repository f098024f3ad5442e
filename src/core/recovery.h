/* Guard mode inside an engine's instance: what it recovers when it starts
 * and what it publishes while it runs.
 *
 * Start: the blocks a claim recovered (recovered_block) are installed
 * before any thread runs, READY in the very slots they occupied, with no
 * access history, and announced again to the inventory sink (the router
 * dropped them when the engine died). The list is checked whole first: a slot claimed twice,
 * a slot or pool out of range, a bad key make the instance start cold
 * (every slot free) and say why, never install part of something wrong.
 *
 * Run: every DRAM residency that becomes READY is published to the
 * recovery journal as PUT, and every READY residency that goes away as
 * REMOVE, before its slot can be reused. A journal that refuses a frame
 * (full, or invalidated by the Guard) turns publication off for good: the
 * cache keeps working, the Guard will recover nothing. Blocks of more than
 * one slot are not published (guard mode asks for one slot per block). */
#ifndef KVCR_CORE_RECOVERY_H
#define KVCR_CORE_RECOVERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/index.h"
#include "kvcr/kvcr.h"

#define KVCR_INC_LEN 16     /* bytes of an incarnation (wire and journal alike) */
#define KVCR_RETIRED_MAX 8  /* retired incarnations an instance answers for */

typedef struct recovered_block {
    const uint8_t *key;
    size_t key_len;
    uint32_t pool;
    uint64_t slot;
    /* What the journal kept besides (NULL / 0: nothing): the tenant's name
     * (a name no longer configured: no tenant) and the API layer's bytes
     * (block_meta_hook). */
    const uint8_t *tenant, *meta;
    size_t tenant_len, meta_len;
} recovered_block;

/* The API layer's bytes of a block besides its key (what its deposit told
 * routers: api/events.c), opaque to the core and the tiers, which keep
 * them where they keep the block (the G3 record, the recovery journal) and
 * give them back when the block is found again. Set before any thread
 * runs; NULL functions: none. */
typedef struct block_meta_hook {
    /* Locked (the instance lock): the block's bytes into buf (cap bytes).
     * Returns their length: 0 for none, more than cap when they do not fit
     * (buf unspecified then). */
    size_t (*get)(void *ud, const uint8_t *key, size_t key_len, uint8_t *buf, size_t cap);
    /* Before any thread runs: bytes get gave were found again with the
     * block, now resident in `where` (KVCR_TIER_G3 or KVCR_TIER_LOCAL_G2). */
    void (*found)(void *ud, const uint8_t *key, size_t key_len, const uint8_t *meta, size_t len,
                  kvcr_tier where);
    void *ud;
} block_meta_hook;

/* Installs recovered blocks (under no lock: nothing runs yet). Returns how
 * many were installed; a refused list installs none and logs why. */
size_t recovery_install(kvcr_t *kv, const recovered_block *blocks, size_t n);

/* Where committed and removed residencies are published (guard mode: the
 * recovery journal, wired up by the API layer); a PUT names the block's
 * tenant (NULL: none). publish returns 0, KVCR_EINVAL for a record it
 * cannot carry (skipped), or another error after which nothing more is
 * published. Called with the instance lock held; NULL publish: off. */
typedef struct recovery_sink {
    int (*publish)(void *ud, bool put, const uint8_t *key, size_t key_len, uint32_t pool,
                   uint64_t slot, const char *tenant);
    void *ud;
} recovery_sink;

/* Locked (or before any thread runs). NULL turns publishing off. */
void recovery_set_sink(kvcr_t *kv, const recovery_sink *sink);

/* The publishing hooks (instance lock held); no-ops without a sink. */
void recovery_put(kvcr_t *kv, block_id id);
void recovery_remove(kvcr_t *kv, block_id id);

#endif
