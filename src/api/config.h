/* Configuration validation: every rule, in a fixed order (the first
 * broken rule is the one reported), before anything starts. The scalar
 * options' defaults and ranges are rows of src/api/options.def (see
 * kvcr/options.h); config.c makes kvcr__config_defaults, their checks and
 * kvcr__options() of it. */
#ifndef KVCR_API_CONFIG_H
#define KVCR_API_CONFIG_H

#include "core/instance.h"

/* Checks cfg and fills the owned copy *out. On failure returns the error
 * (the message names the rule) and leaves nothing allocated. */
int conf_build(const kvcr_config *cfg, kvcr_conf *out);
void conf_destroy(kvcr_conf *c);

/* Fills *cfg (this header's layout) with kvcr_config_init's defaults,
 * version 0: api/abi.c sets the version. */
void kvcr__config_defaults(kvcr_config *cfg);

/* The local DRAM memory configured for the named pool, or NULL. */
const kvcr_dram_pool *dram_pool_for(const kvcr_config *cfg, const char *name);

#endif
