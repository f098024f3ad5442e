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

struct journal;
struct svc_hold;

typedef struct recovered_block {
    const uint8_t *key;
    size_t key_len;
    uint32_t pool;
    uint64_t slot;
} recovered_block;

/* What an instance starts from besides its configuration: given by the
 * service client for a claimant, and by the Guard for its serving
 * instance. Everything is optional (zero / -1 / NULL). */
typedef struct kvcr_boot {
    const recovered_block *blocks; /* installed at start */
    size_t n_blocks;
    struct journal *journal;       /* publish here (owned by hold, or by the caller) */
    int control_listener;          /* a listening TCP socket the control channel adopts;
                                    * -1: bind control_host:control_port. Consumed. */
    struct svc_hold *hold;         /* the claim, released when the instance closes */
    const char *role;              /* for the start log line ("claimant", "guard") */
    const uint8_t (*retired)[KVCR_INC_LEN]; /* incarnations that served this endpoint */
    size_t n_retired;                       /* before and are gone (at most KVCR_RETIRED_MAX) */
} kvcr_boot;

/* kvcr_create with a boot record. */
int kvcr__create(const kvcr_config *cfg, const kvcr_boot *boot, kvcr_t **out);

/* Takes what boot gives before any thread runs: the journal (the
 * instance's incarnation is written into its header), the retired
 * incarnations, and the recovered blocks (recovery_install). */
void recovery_boot(kvcr_t *kv, const kvcr_boot *boot);

/* Installs recovered blocks (under no lock: nothing runs yet). Returns how
 * many were installed; a refused list installs none and logs why. */
size_t recovery_install(kvcr_t *kv, const recovered_block *blocks, size_t n);

/* The incarnation peers know this instance by (the Guard retires its
 * backup's when it stops it). */
void kvcr__incarnation(const kvcr_t *kv, uint8_t out[KVCR_INC_LEN]);

/* The publishing hooks (instance lock held); no-ops without a journal. */
void recovery_put(kvcr_t *kv, block_id id);
void recovery_remove(kvcr_t *kv, block_id id);

#endif
