/* kvcr._native: the CPython binding of libkvcr — what its source files
 * share. Internal to the extension (setup.py lists the files):
 *
 *   _native.c            the module: init(), the Python values of the C
 *                        enums, libkvcr errors as exceptions, PyInit
 *   _native_config.c     Instance(...)'s configuration arguments -> kvcr_config
 *   _native_policy.c     a Python policy as a kvcr_policy_ops table
 *   _native_callbacks.c  libkvcr's callbacks (inventory, capacity, log,
 *                        key hash, pins, resilience) into Python objects
 *   _native_values.c     keys, blocks and request ids in; query pairs and
 *                        entry results out
 *   _native_instance.c   the Instance type: construction, the operations,
 *                        close
 *
 * A thin layer. It converts Python values to the C API's structs and back,
 * and releases the GIL around every libkvcr call that takes the instance
 * lock: policy hooks and key_hash run under that lock on the calling thread
 * and take the GIL themselves (PyGILState_Ensure), so holding the GIL while
 * waiting for the lock would deadlock. (Log lines reach the sink after the
 * lock is let go, and take the GIL too.) Every Python object whose
 * memory libkvcr reads (key bytes, label strings) is held by a strong
 * reference for the whole call, since other threads run while the GIL is
 * released. Every function declared here runs with the GIL held; the
 * callbacks libkvcr calls take it themselves.
 *
 * The Python package (kvcr/api.py, kvcr/config.py) checks the types of the
 * configuration and shapes everything else; libkvcr checks the values, and
 * its message is the exception's (nat_raise). */
#ifndef KVCR_NATIVE_H
#define KVCR_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "kvcr/kvcr.h"

#define N_STATUS 4  /* kvcr_query_status */
#define N_TIER 6    /* kvcr_tier, KVCR_TIER_NONE included */

/* Set once by init() from kvcr/api.py (_native.c). */
extern PyObject *g_status[N_STATUS]; /* QueryStatus members by C value */
extern PyObject *g_tier[N_TIER];     /* CacheTier members by C value; [0] is None */
extern PyObject *g_memref_type;      /* kvcr.types.MemoryRef */

typedef struct {
    PyObject_HEAD
    kvcr_t *kv;
    PyObject *policy;     /* adapter with _decide_ingest etc., or NULL */
    PyObject *inventory;  /* callable(keys tuple, CacheTier, removed) -> bool, or NULL */
    PyObject *capacity;   /* callable(list[(pool, slots)]) -> bool, or NULL */
    PyObject *log;        /* callable(level, message), or NULL */
    PyObject *make_entry; /* callable(status, reason, release_handle, slots) -> OpEntryResult */
    PyObject *key_hash;   /* callable(key bytes) -> int | None, or NULL */
    PyObject *pins;       /* pin bridge: request, poll, cancel, release; or NULL */
    PyObject *resilience; /* callable(state, source_side, op, regions, message), or NULL */
    kvcr_policy_ops ops;
    char policy_name[KVCR_NAME_MAX];
    /* libkvcr calls running with the GIL released; changed only with the
     * GIL held. close() frees the instance at once when no other call runs,
     * else dealloc does. */
    long calls;
    bool closed;
} Instance;

extern PyTypeObject nat_instance_type; /* kvcr._native.Instance */

/* ---- _native.c ---------------------------------------------------------- */

/* Raises the exception for libkvcr error `rc` with kvcr_last_error() as its
 * message; returns NULL. */
PyObject *nat_raise(int rc);
/* The exception of libkvcr code rc (kvcr.errors) with this message. */
PyObject *nat_raise_message(int rc, const char *msg);
/* 1 once init() has run, else 0 with RuntimeError set. */
int nat_ready(void);
/* A new reference to a callback slot (or NULL): another thread may drop
 * the slot (close) while this one runs Python code. */
PyObject *nat_grab(PyObject *slot);
/* calloc of n (at least 1) items, MemoryError set when it fails. */
void *nat_alloc(size_t n, size_t size);
/* UTF-8 of a str, held by appending it to the list `keep` (so the pointer
 * outlives the call); TypeError naming `what` for another type. */
const char *nat_str_of(PyObject *o, PyObject *keep, const char *what);

/* ---- _native_config.c --------------------------------------------------- */

/* The configuration arguments of Instance(...), as its init parses them. */
typedef struct nat_config_args {
    const char *agent;
    PyObject *layouts, *dram, *regions; /* dicts by kvcr_pool_layout / _dram_pool / _region
                                         * field name; dram Py_None: no local DRAM */
    PyObject *options;    /* {path: value} of the options table's rows */
    PyObject *g3_paths;   /* (str, ...) or Py_None: no G3 */
    PyObject *curve_keys; /* CURVE allowed keys (str, ...) or Py_None */
    PyObject *tenants;    /* ({"name", "dram_slots", "g3_slots"}, ...) or Py_None */
} nat_config_args;

/* A kvcr_config and what it points into: the arrays it owns and `keep`,
 * the Python strings whose UTF-8 it reads. */
typedef struct nat_config {
    kvcr_config cfg;
    PyObject *keep;
    kvcr_pool_layout *layouts;
    kvcr_dram_pool *pools;
    kvcr_region *regions;
    const char **g3_paths, **curve_keys;
    kvcr_tenant *tenants;
} nat_config;

/* Fills c->cfg from `a` (no policy, no callbacks): 0, or -1 with a Python
 * error set. nat_config_free releases *c either way. */
int nat_config_build(const nat_config_args *a, nat_config *c);
void nat_config_free(nat_config *c);
/* kvcr._native.options(): the options table's rows as dicts (path, label,
 * type, default, min, max, rule, since, py, doc). */
PyObject *nat_options(PyObject *mod, PyObject *unused);

/* ---- _native_policy.c --------------------------------------------------- */

int nat_policy_init(void); /* at import: 0, or -1 with an error set */
/* cfg->policy from `policy`: None (libkvcr's default), a built-in's name,
 * or the Python adapter (self->policy, called through self->ops). */
int nat_policy_set(Instance *self, PyObject *policy, kvcr_config *cfg);

/* ---- _native_callbacks.c ------------------------------------------------ */

int nat_callbacks_init(void); /* at import: 0, or -1 with an error set */
/* The libkvcr callbacks for the slots of `self` that are set. */
kvcr_callbacks nat_callbacks_of(Instance *self);

/* ---- _native_values.c --------------------------------------------------- */

int nat_values_init(void); /* at import: 0, or -1 with an error set */

#define NAT_SMALL 64 /* keys converted without an allocation */

/* The keys of a sequence of bytes. `held` (a tuple) keeps them alive. */
typedef struct keyset {
    kvcr_key *keys;
    Py_ssize_t n;
    PyObject *held;
    kvcr_key small[NAT_SMALL];
} keyset;

int nat_keys_of(PyObject *seq, keyset *k); /* nat_keys_free either way */
void nat_keys_free(keyset *k);
/* A request id: None (or a missing argument, NULL) or a str. */
int nat_request_id(PyObject *o, const char **out);

/* The blocks of {key: [MemoryRef, ...]}, with everything libkvcr reads
 * held. */
typedef struct blockset {
    kvcr_block *blocks;
    kvcr_mem_ref *refs;
    PyObject **held; /* keys and label / end point strings */
    size_t n, n_refs, n_held;
    kvcr_block sb[16];
    kvcr_mem_ref sr[32];
    PyObject *sh[80];
} blockset;

int nat_blocks_of(PyObject *mapping, blockset *b); /* nat_blocks_free either way */
void nat_blocks_free(blockset *b);

/* A new reference to the (QueryStatus, CacheTier | None) of a result. */
PyObject *nat_query_pair(kvcr_query_result q);
/* A new reference to the OpEntryResult of an entry. */
PyObject *nat_entry(Instance *self, const kvcr_entry_result *e);

#endif
