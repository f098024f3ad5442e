/* The versioned ABI: a caller's kvcr_config read in its own header's layout,
 * kvcr_config_init for any version this library reads, and the policy
 * table's version check (api/abi.h). */
#include "api/abi.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "api/config.h"
#include "util/api.h"
#include "util/log.h"

/* Every kvcr_config layout this library reads, oldest first. Version 1 is
 * the first versioned layout (KVCR 0.1.0). A new version appends its entry
 * and sets the previous entry's bytes to the offsetof of its first new
 * field; a version that grows a part in place is not a prefix any more and
 * needs a conversion here instead (docs/ARCHITECTURE.md "ABI and SONAME"). */
static const kvcr__config_layout config_layouts[] = {
    {1, offsetof(kvcr_config, kv_events)},
    {2, offsetof(kvcr_config, max_peers)},
    {3, sizeof(kvcr_config)},
};
#define N_CONFIG_LAYOUTS (sizeof config_layouts / sizeof config_layouts[0])
_Static_assert(N_CONFIG_LAYOUTS == KVCR_CONFIG_VERSION,
               "every config version from 1 to KVCR_CONFIG_VERSION has its layout");

static const kvcr__config_layout *layout_of(const kvcr__config_layout *known, size_t n,
                                            uint32_t version)
{
    for (size_t i = 0; i < n; i++)
        if (known[i].version == version) return &known[i];
    return NULL;
}

/* The one refusal of a version: what carries it, which versions this
 * library reads, and how a caller sets a right one. */
static int refuse_version(const char *what, uint32_t version, uint32_t lo, uint32_t hi,
                          const char *fix)
{
    char reads[48];
    if (lo == hi)
        snprintf(reads, sizeof reads, "version %u", lo);
    else
        snprintf(reads, sizeof reads, "versions %u to %u", lo, hi);
    return kvcr_fail(KVCR_EINVAL, "%s has version %u; libkvcr %s reads %s (%s)", what, version,
                     KVCR_VERSION_STRING, reads, fix);
}

static int refuse_config(const kvcr__config_layout *known, size_t n, uint32_t version)
{
    return refuse_version("kvcr_config", version, known[0].version, known[n - 1].version,
                          "kvcr_config_init sets the version of the kvcr.h a program is built "
                          "with");
}

int kvcr__config_import_from(const kvcr__config_layout *known, size_t n,
                             const kvcr_config *user, kvcr_config *full)
{
    if (user == NULL) return kvcr_fail(KVCR_EINVAL, "config must not be NULL");
    const kvcr__config_layout *l = layout_of(known, n, user->version);
    if (l == NULL) return refuse_config(known, n, user->version);
    kvcr__config_defaults(full);
    memcpy(full, user, l->bytes); /* never past the caller's own struct */
    full->version = known[n - 1].version;
    return 0;
}

int kvcr__config_import(const kvcr_config *user, kvcr_config *full)
{
    return kvcr__config_import_from(config_layouts, N_CONFIG_LAYOUTS, user, full);
}

KVCR_API int kvcr_config_init_version(kvcr_config *cfg, uint32_t version)
{
    if (cfg == NULL) return kvcr_fail(KVCR_EINVAL, "kvcr_config_init: cfg must not be NULL");
    const kvcr__config_layout *l = layout_of(config_layouts, N_CONFIG_LAYOUTS, version);
    if (l == NULL) {
        cfg->version = version; /* first in every layout: kvcr_create refuses it the same way */
        return refuse_config(config_layouts, N_CONFIG_LAYOUTS, version);
    }
    kvcr_config full;
    kvcr__config_defaults(&full);
    full.version = version;
    memcpy(cfg, &full, l->bytes); /* the caller's layout may be shorter than this header's */
    return 0;
}

int kvcr__policy_check(const kvcr_policy_ops *p)
{
    if (p->version >= 1 && p->version <= KVCR_POLICY_VERSION) return 0;
    char what[96];
    snprintf(what, sizeof what, "policy '%.64s'", p->name ? p->name : "?");
    return refuse_version(what, p->version, 1, KVCR_POLICY_VERSION,
                          "set .version = KVCR_POLICY_VERSION");
}
