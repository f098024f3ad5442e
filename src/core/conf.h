/* The validated, immutable configuration of an instance (built by
 * api/config.c before anything starts, never changed afterwards). The
 * core and every tier may read it without the instance lock. */
#ifndef KVCR_CORE_CONF_H
#define KVCR_CORE_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

/* A registered framework region, resolved from kvcr_region. */
typedef struct fw_region {
    uint8_t *addr;
    size_t element_size, count, stride;
    char label[KVCR_NAME_MAX];
    kvcr_mem_type mem_type;
    int device_id;
    uint32_t pool; /* the pool its label names */
} fw_region;

/* The validated, owned copy of kvcr_config. */
typedef struct kvcr_conf {
    char agent_name[KVCR_NAME_MAX];
    uint32_t n_pools;
    bool has_local_dram;
    fw_region *regions;
    size_t n_regions;
    kvcr_remote_options remote; /* strings point into the buffers below */
    char control_host[KVCR_NAME_MAX], advertise_host[KVCR_NAME_MAX];
    /* remote.curve's keys, copied (curve_keys: the allowed ones, each
     * KVCR_CURVE_KEY_LEN + 1 bytes, pointed to by curve_allowed) */
    char curve_secret[KVCR_CURVE_KEY_LEN + 1], curve_public[KVCR_CURVE_KEY_LEN + 1];
    char *curve_keys;
    const char **curve_allowed;
    kvcr_g3_options g3;      /* paths copied into g3_paths; n_paths 0: no G3 */
    char **g3_paths;
    uint32_t operation_timeout_ms, abandon_timeout_ms;
    double watermark_percent;
    bool enable_telemetry;
    uint32_t copy_threads;
    kvcr_limits limits;
    const kvcr_policy_ops *policy;
    void *policy_ud;
    kvcr_callbacks cb;
} kvcr_conf;

#endif
