/* The documented internal way in for the node daemon (src/daemon): an
 * instance created with a boot record (a claim's pools, journal and
 * recovered blocks, or the Guard's backup of a dead engine). Not part of
 * the public API; libkvcr exports these names with the internal prefix
 * kvcr__ so that the daemon library links them. */
#ifndef KVCR_API_BOOT_H
#define KVCR_API_BOOT_H

#include "core/recovery.h"
#include "util/api.h"
#include "util/log.h"

struct journal;
struct svc_hold;
struct ucx_ctx;

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
    /* The KV-event stream this instance continues: its first number, and
     * who keeps its next one (called on the publisher's thread; NULL:
     * nobody). */
    uint64_t kv_first_seq;
    void (*kv_numbered)(void *ud, uint64_t next_seq);
    void *kv_numbered_ud;
    /* A UCX context made ahead (kvcr__ucx_ahead) for the peer tier, which
     * then starts without waiting for UCX. Consumed, either way. */
    struct ucx_ctx *ucx;
} kvcr_boot;

/* kvcr_create with a boot record. */
KVCR_API int kvcr__create(const kvcr_config *cfg, const kvcr_boot *boot, kvcr_t **out);

/* A UCX context for a later kvcr__create's boot record (the Guard makes
 * one while its owner lives, so that serving after a death does not wait
 * for UCX to start), logging to log until an instance takes it. 0, or
 * KVCR_ESYS / KVCR_ENOMEM with the message. Any thread. */
KVCR_API int kvcr__ucx_ahead(const kvcr_logger *log, struct ucx_ctx **out);
/* Frees a context no instance took (NULL is ignored). Any thread. */
KVCR_API void kvcr__ucx_ahead_free(struct ucx_ctx *c);

/* Takes what boot gives before any thread runs: the journal (the
 * instance's incarnation is written into its header), the retired
 * incarnations, and the recovered blocks (recovery_install). */
void recovery_boot(kvcr_t *kv, const kvcr_boot *boot);

/* The incarnation peers know this instance by (the Guard retires its
 * backup's when it stops it). */
KVCR_API void kvcr__incarnation(const kvcr_t *kv, uint8_t out[KVCR_INC_LEN]);

#endif
