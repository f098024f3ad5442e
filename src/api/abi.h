/* The versioned ABI (kvcr/kvcr.h "ABI", docs/ARCHITECTURE.md "ABI and
 * SONAME"): a caller's kvcr_config is read in the layout of the header it
 * was built with, whose version it carries, and turned into a config of
 * this header's layout with kvcr_config_init's defaults in every field the
 * caller's version does not have; a policy table's version is checked. The
 * rest of the library sees only full-size configs. An unknown version is
 * refused with a message that names it, before anything is read or started.
 *
 * None of these functions touches an instance: any thread, no lock. */
#ifndef KVCR_API_ABI_H
#define KVCR_API_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

/* One released layout of kvcr_config: a version and how many leading bytes
 * of this header's kvcr_config it has. Every version so far only appended
 * fields, so its layout is a prefix of the newest; bytes ends at the first
 * field the next version added (its offsetof, not the older sizeof: that
 * may include padding the newer field now occupies). */
typedef struct kvcr__config_layout {
    uint32_t version;
    size_t bytes;
} kvcr__config_layout;

/* Reads *user (its version says how far) into *full, a config of this
 * header's layout (full->version is KVCR_CONFIG_VERSION). 0, or
 * KVCR_EINVAL (user NULL or an unknown version) with *full unspecified. */
int kvcr__config_import(const kvcr_config *user, kvcr_config *full);

/* kvcr__config_import over a given table of layouts (known[n], newest
 * last): the library's own table, or a test's that stands in for releases
 * still to come. full->version is the newest entry's. */
int kvcr__config_import_from(const kvcr__config_layout *known, size_t n,
                             const kvcr_config *user, kvcr_config *full);

/* 0 when the library reads p's version; otherwise KVCR_EINVAL with a
 * message naming the policy and its version. */
int kvcr__policy_check(const kvcr_policy_ops *p);

#endif
