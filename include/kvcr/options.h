/* kvcr/options.h — the options table: every scalar option of kvcr_config
 * (path, type, default, range, rule, since-version, one-line doc), read
 * at run time.
 *
 * One owner per option. The table is src/api/options.def, an X-macro
 * file; from it alone come kvcr_config_init's defaults, the range rules
 * kvcr_create checks (with the messages they always had, naming the rule
 * and the option), these rows, and so the Python package's defaults and
 * its binding: kvcr._native.options() returns the rows, kvcr/config.py
 * takes its records' defaults from them and passes values to the C struct
 * by path ({"limits.max_hint_bytes": 4096}), never by position. Arrays
 * (pool layouts, pools, regions, tenants, G3 paths, CURVE allowed keys),
 * the policy and the callbacks are not rows: they are parts of their own.
 *
 * Adding an option costs:
 *   1. the field in kvcr_config (appended, with a new KVCR_CONFIG_VERSION
 *      when it is a new version's; kvcr.h documents it in a line);
 *   2. one row in src/api/options.def (its range and rule included: a
 *      named rule beyond RANGE/BOUNDS/POSITIVE is a case in api/config.c);
 *   3. its consumer (the code that reads it);
 *   4. for Python, one field of the record the row's `py` names, whose
 *      default is config.py's _default("<path>");
 *   5. its test. tests/unit/test-options-table.c and
 *      tests/python/test_options_table.py check every row on both sides
 *      (its default within its range; out-of-range values refused by both
 *      with the same code; the Python default the C one).
 *
 * Not covered by the ABI promise (like kvcr/testing.h): the rows and this
 * struct may change in any release. The strings are static. */
#ifndef KVCR_OPTIONS_H
#define KVCR_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

typedef enum kvcr_option_type {
    KVCR_OPT_BOOL,
    KVCR_OPT_U16,
    KVCR_OPT_U32,
    KVCR_OPT_U64,
    KVCR_OPT_F64,
    KVCR_OPT_STR
} kvcr_option_type;

typedef union kvcr_option_value {
    uint64_t u;    /* BOOL, U16, U32, U64 */
    double d;      /* F64 */
    const char *s; /* STR (NULL: none) */
} kvcr_option_value;

typedef struct kvcr_option {
    const char *path;  /* "limits.max_hint_bytes": the field in kvcr_config */
    const char *label; /* its name in refusals */
    kvcr_option_type type;
    size_t offset;     /* offsetof(kvcr_config, <path>) */
    kvcr_option_value def, min, max;
    const char *rule;  /* "range", "bounds", "positive", "none", or a named rule */
    uint32_t since;    /* config version that added it */
    const char *py;    /* "Record.field" of the Python package, or NULL */
    const char *doc;
} kvcr_option;

/* The rows, in the order kvcr_create checks them within each part; *n
 * their count (n may be NULL). */
__attribute__((visibility("default"))) const kvcr_option *kvcr__options(size_t *n);

/* The row of `path`, or NULL. */
__attribute__((visibility("default"))) const kvcr_option *kvcr__option(const char *path);

/* Writes v into cfg's field of o, a row of kvcr__options() of an integer
 * type (BOOL, U16, U32, U64; a BOOL is v != 0): 0, or KVCR_EINVAL (NULL,
 * not a row, an F64 or STR row, v more than the field holds) with *cfg
 * unchanged. Only the field's type is checked, not the row's rule:
 * kvcr_create checks that. */
__attribute__((visibility("default"))) int kvcr__option_set(kvcr_config *cfg, const kvcr_option *o,
                                                            uint64_t v);

#endif
