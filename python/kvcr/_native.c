/* kvcr._native: the CPython binding of libkvcr.
 *
 * A thin layer. It converts Python values to the C API's structs and back,
 * and releases the GIL around every libkvcr call that takes the instance
 * lock: policy hooks and log lines run under that lock on the calling
 * thread and take the GIL themselves (PyGILState_Ensure), so holding the GIL
 * while waiting for the lock would deadlock. Every Python object whose
 * memory libkvcr reads (key bytes, label strings) is held by a strong
 * reference for the whole call, since other threads run while the GIL is
 * released.
 *
 * Results are built from objects made once: the (QueryStatus, CacheTier)
 * pairs and the OpEntryResult of every (status, reason) that carries no
 * handle or slots are cached, so query and poll allocate little. The Python
 * package (kvcr/api.py, kvcr/config.py) checks the types of the
 * configuration and shapes everything else; libkvcr checks the values, and
 * its message is the exception's (raise_rc).
 * The G3 tier needs nothing of its own here: its options arrive as one
 * tuple (parse_g3), and its inventory events, query results (FETCHABLE, G3)
 * and entry reasons (CORRUPT) use the shared tables below.
 *
 * The peer-to-peer tier's callbacks go to small Python objects made by
 * kvcr/api.py: key_hash (under the instance lock, like policy hooks), the
 * pin bridge (request / poll / cancel / release: libkvcr's u64 request and
 * pin ids on one side, the framework's PinRequestId / PinHandle on the
 * other) and the resilience sink. Those run inside kvcr_poll / kvcr_close
 * with no lock held; kvcr_pin_complete, which takes the lock, is called
 * with the GIL released. No Python exception crosses into libkvcr: each
 * callback clears what it raised (the Python side has logged or recorded
 * it already).
 *
 * Guard mode arrives as one tuple (socket path, guard_index, digest) that
 * fills kvcr_config.guard; kvcr_create then claims the pool group itself.
 * Its failures are raised as kvcr.control_channels' service errors (see
 * raise_rc). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvcr/testing.h"
#include "kvcr/kvcr.h"

#define N_STATUS 4  /* kvcr_query_status */
#define N_TIER 6    /* kvcr_tier, KVCR_TIER_NONE included */
#define N_ENTRY 3   /* kvcr_entry_status */
#define N_REASON 32 /* cached kvcr_reason values; larger ones are not cached */

/* Set once by init() from kvcr/api.py. */
static PyObject *g_status[N_STATUS];       /* QueryStatus members by C value */
static PyObject *g_tier[N_TIER];           /* CacheTier members by C value; [0] is None */
static PyObject *g_pair[N_STATUS][N_TIER]; /* (status, tier) result tuples */
static PyObject *g_memref_type;            /* kvcr.types.MemoryRef */
static PyObject *g_entry[N_ENTRY][N_REASON]; /* shared plain OpEntryResults */
static PyObject *s_end_point, *s_label, *s_index; /* interned attribute names */
/* kvcr.control_channels' service errors (NULL until init: RuntimeError). */
static PyObject *g_err_service; /* KVCR_EREFUSED: the service refused */
static PyObject *g_err_socket;  /* KVCR_EUNAVAIL: the service is not reachable */
static PyObject *g_err_proto;   /* KVCR_EPROTO: the service broke the claim protocol */

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

/* The exception for a libkvcr error, with kvcr_last_error() as its
 * message. Only the KVCR service's code returns KVCR_EREFUSED,
 * KVCR_EUNAVAIL and KVCR_EPROTO. */
static PyObject *raise_rc(int rc)
{
    const char *msg = kvcr_last_error();
    if (msg == NULL || msg[0] == '\0') msg = kvcr_strerror(rc);
    PyObject *type = PyExc_RuntimeError; /* ECLOSED, EBUSY, ENOMEM, ESYS, ... */
    if (rc == KVCR_EINVAL) type = PyExc_ValueError;
    else if (rc == KVCR_ENOTSUP) type = PyExc_NotImplementedError; /* "... is not built yet" */
    else if (rc == KVCR_EREFUSED && g_err_service) type = g_err_service;
    else if (rc == KVCR_EPROTO && g_err_proto) type = g_err_proto;
    else if (rc == KVCR_EUNAVAIL && g_err_socket) type = g_err_socket;
    PyErr_SetString(type, msg);
    return NULL;
}

static int ready(void)
{
    if (g_memref_type != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "kvcr._native.init() has not been called");
    return 0;
}

/* A new reference to a callback slot, taken with the GIL held: another
 * thread may drop the slot (close) while this one runs Python code. */
static PyObject *grab(PyObject *slot)
{
    return slot ? Py_NewRef(slot) : NULL;
}

/* ---- callbacks from C (they take the GIL) ------------------------------- */

static PyObject *meta_tuple(const kvcr_block_meta *m)
{
    PyObject *last = m->last_access >= 0 ? PyFloat_FromDouble(m->last_access) : Py_NewRef(Py_None);
    if (last == NULL) return NULL;
    return Py_BuildValue("(y#KKNIL)", (const char *)m->key.data, (Py_ssize_t)m->key.len,
                         (unsigned long long)m->size_bytes, (unsigned long long)m->access_count,
                         last, m->resident_tiers, (long long)m->position);
}

/* policy.<name>(meta, *extra) with a new reference, or NULL (error cleared)
 * when the hook failed; the Python adapter has logged why. */
static PyObject *call_policy(Instance *self, PyObject *name, const kvcr_block_meta *m,
                             PyObject *extra)
{
    PyObject *policy = grab(self->policy), *res = NULL;
    PyObject *meta = policy && extra ? meta_tuple(m) : NULL;
    if (meta != NULL) {
        PyObject *args[4] = {policy, meta, NULL, NULL};
        Py_ssize_t n = 2;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra) && n < 4; i++)
            args[n++] = PyTuple_GET_ITEM(extra, i);
        res = PyObject_VectorcallMethod(name, args, (size_t)n, NULL);
    }
    Py_XDECREF(meta);
    Py_XDECREF(extra);
    Py_XDECREF(policy);
    if (res == Py_None) Py_CLEAR(res);
    if (res == NULL) PyErr_Clear();
    return res;
}

static int placement_from(PyObject *res, kvcr_placement *out)
{
    int action, tier;
    int ok = res != NULL && PyTuple_Check(res) && PyArg_ParseTuple(res, "ii", &action, &tier);
    Py_XDECREF(res);
    if (!ok) {
        PyErr_Clear();
        return -1;
    }
    out->action = (kvcr_action)action;
    out->tier = (kvcr_tier)tier;
    return 0;
}

static PyObject *s_ingest, *s_score, *s_eviction, *s_on_ingest, *s_on_remove, *s_recovery;

static int hook_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source, bool required,
                       kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = placement_from(call_policy(ud, s_ingest, m, Py_BuildValue("(iO)", (int)source,
                                                                    required ? Py_True : Py_False)),
                            out);
    PyGILState_Release(g);
    return rc;
}

static int hook_score(void *ud, const kvcr_block_meta *m, kvcr_tier source, double *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call_policy(ud, s_score, m, Py_BuildValue("(i)", (int)source));
    int rc = -1;
    if (res != NULL && PyFloat_CheckExact(res)) {
        *out = PyFloat_AS_DOUBLE(res);
        rc = 0;
    }
    Py_XDECREF(res);
    PyGILState_Release(g);
    return rc;
}

static int hook_eviction(void *ud, const kvcr_block_meta *m, kvcr_tier source, kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = placement_from(call_policy(ud, s_eviction, m, Py_BuildValue("(i)", (int)source)), out);
    PyGILState_Release(g);
    return rc;
}

static void hook_on_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(call_policy(ud, s_on_ingest, m, Py_BuildValue("(i)", (int)source)));
    PyGILState_Release(g);
}

static void hook_on_remove(void *ud, const kvcr_block_meta *m)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(call_policy(ud, s_on_remove, m, PyTuple_New(0)));
    PyGILState_Release(g);
}

static int hook_recovery(void *ud, const kvcr_block_meta *m, const kvcr_placement_failure *f,
                         kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *failure = Py_BuildValue("(iiisI)", (int)f->attempted.action, (int)f->attempted.tier,
                                      (int)f->source, f->reason ? f->reason : "",
                                      (unsigned)f->failure_count);
    int rc = placement_from(call_policy(ud, s_recovery, m,
                                        failure ? Py_BuildValue("(N)", failure) : NULL),
                            out);
    PyGILState_Release(g);
    return rc;
}

/* fn(*args) is truthy: 0, else -1. Steals args. */
static int truthy_call(PyObject *fn, PyObject *args)
{
    int ok = 0;
    if (fn != NULL && args != NULL) {
        PyObject *res = PyObject_Call(fn, args, NULL);
        ok = res != NULL && PyObject_IsTrue(res) == 1;
        Py_XDECREF(res);
    }
    Py_XDECREF(args);
    Py_XDECREF(fn);
    PyErr_Clear();
    return ok ? 0 : -1;
}

static int cb_inventory(void *ud, const kvcr_inventory_event *ev)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = grab(self->inventory), *args = NULL;
    PyObject *keys = fn ? PyTuple_New((Py_ssize_t)ev->n_keys) : NULL;
    for (size_t i = 0; keys && i < ev->n_keys; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)ev->keys[i].data,
                                                (Py_ssize_t)ev->keys[i].len);
        if (k == NULL) Py_CLEAR(keys);
        else PyTuple_SET_ITEM(keys, (Py_ssize_t)i, k);
    }
    if (keys != NULL) {
        PyObject *tier = (unsigned)ev->tier < N_TIER ? g_tier[ev->tier] : Py_None;
        args = Py_BuildValue("(NOO)", keys, tier, ev->removed ? Py_True : Py_False);
    }
    int rc = truthy_call(fn, args);
    PyGILState_Release(g);
    return rc;
}

static int cb_capacity(void *ud, const kvcr_capacity_need *needs, size_t n)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = grab(self->capacity), *args = NULL;
    PyObject *list = fn ? PyList_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; list && i < n; i++) {
        PyObject *t = Py_BuildValue("(sK)", needs[i].pool, (unsigned long long)needs[i].slots);
        if (t == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, t);
    }
    if (list != NULL) args = Py_BuildValue("(N)", list);
    int rc = truthy_call(fn, args);
    PyGILState_Release(g);
    return rc;
}

static void cb_log(void *ud, kvcr_log_level level, const char *message)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = grab(self->log);
    if (fn != NULL) {
        PyObject *res = PyObject_CallFunction(fn, "is", (int)level, message);
        Py_XDECREF(res);
        Py_DECREF(fn);
        PyErr_Clear();
    }
    PyGILState_Release(g);
}

/* A line on the Python log sink (kvcr/api.py), with the GIL held. */
static void log_line(Instance *self, kvcr_log_level level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PyObject *fn = grab(self->log);
    if (fn != NULL) {
        Py_XDECREF(PyObject_CallFunction(fn, "is", (int)level, buf));
        Py_DECREF(fn);
    }
    PyErr_Clear();
}

static PyObject *s_request, *s_poll, *s_cancel, *s_release;

/* Under the instance lock: only the adapter's pure decode runs here. */
static int cb_key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = grab(self->key_hash), *res = NULL;
    int rc = -1;
    if (fn != NULL) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)key->data, (Py_ssize_t)key->len);
        if (k != NULL) res = PyObject_CallOneArg(fn, k);
        Py_XDECREF(k);
        Py_DECREF(fn);
    }
    if (res != NULL && PyLong_CheckExact(res)) {
        unsigned long long v = PyLong_AsUnsignedLongLong(res);
        if (!(v == (unsigned long long)-1 && PyErr_Occurred())) {
            *hash = v;
            rc = 0;
        }
    }
    Py_XDECREF(res);
    PyErr_Clear();
    PyGILState_Release(g);
    return rc;
}

static int cb_request_pin(void *ud, uint64_t req, const kvcr_key *keys, size_t n)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = grab(self->pins), *res = NULL;
    PyObject *t = bridge ? PyTuple_New((Py_ssize_t)n) : NULL;
    for (size_t i = 0; t && i < n; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)keys[i].data,
                                                (Py_ssize_t)keys[i].len);
        if (k == NULL) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, (Py_ssize_t)i, k);
    }
    PyObject *r = t ? PyLong_FromUnsignedLongLong(req) : NULL;
    if (r != NULL) res = PyObject_CallMethodObjArgs(bridge, s_request, r, t, NULL);
    int ok = res != NULL && PyObject_IsTrue(res) == 1;
    Py_XDECREF(res);
    Py_XDECREF(r);
    Py_XDECREF(t);
    Py_XDECREF(bridge);
    PyErr_Clear();
    PyGILState_Release(g);
    return ok ? 0 : -1;
}

static void cb_poll_pins(void *ud); /* after the block conversion below */

static void cb_cancel_pin(void *ud, uint64_t req)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = grab(self->pins);
    PyObject *r = bridge ? PyLong_FromUnsignedLongLong(req) : NULL;
    if (r != NULL) Py_XDECREF(PyObject_CallMethodOneArg(bridge, s_cancel, r));
    Py_XDECREF(r);
    Py_XDECREF(bridge);
    PyErr_Clear();
    PyGILState_Release(g);
}

static bool cb_release_pin(void *ud, uint64_t pin)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = grab(self->pins), *res = NULL;
    PyObject *p = bridge ? PyLong_FromUnsignedLongLong(pin) : NULL;
    if (p != NULL) res = PyObject_CallMethodOneArg(bridge, s_release, p);
    bool ok = res == Py_True;
    Py_XDECREF(res);
    Py_XDECREF(p);
    Py_XDECREF(bridge);
    PyErr_Clear();
    PyGILState_Release(g);
    return ok;
}

/* The sink (kvcr/api.py) turns the event into a TransferError and hands it
 * to on_resilience_event; if even that fails the event is logged here, so
 * it is never silently lost. */
static void cb_resilience(void *ud, const kvcr_resilience_event *ev)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = grab(self->resilience), *res = NULL;
    PyObject *regions = fn ? PyTuple_New((Py_ssize_t)ev->n_regions) : NULL;
    for (size_t i = 0; regions && i < ev->n_regions; i++) {
        const kvcr_mem_ref *m = &ev->regions[i];
        PyObject *t = Py_BuildValue("(ssK)", m->end_point ? m->end_point : "",
                                    m->label ? m->label : "", (unsigned long long)m->index);
        if (t == NULL) Py_CLEAR(regions);
        else PyTuple_SET_ITEM(regions, (Py_ssize_t)i, t);
    }
    if (regions != NULL)
        res = PyObject_CallFunction(fn, "iOKOs", (int)ev->state,
                                    ev->source_side ? Py_True : Py_False,
                                    (unsigned long long)ev->op, regions,
                                    ev->message ? ev->message : "");
    if (res == NULL) {
        PyErr_Clear();
        log_line(self, KVCR_LOG_ERROR, "resilience event (state %d, op %llu) not delivered: %s",
                 (int)ev->state, (unsigned long long)ev->op, ev->message ? ev->message : "");
    }
    Py_XDECREF(res);
    Py_XDECREF(regions);
    Py_XDECREF(fn);
    PyErr_Clear();
    PyGILState_Release(g);
}

/* ---- construction ------------------------------------------------------- */

/* UTF-8 of a str held by `keep` (so the pointer outlives the call). */
static const char *str_of(PyObject *o, PyObject *keep, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8(o);
    if (s == NULL || PyList_Append(keep, o) != 0) return NULL;
    return s;
}

static void *alloc_n(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) PyErr_NoMemory();
    return p;
}

static int parse_layouts(PyObject *seq, kvcr_pool_layout **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = alloc_n(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *name;
        unsigned long long bs;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OK", &name, &bs) ||
            ((*out)[i].name = str_of(name, keep, "pool name")) == NULL)
            rc = -1;
        else
            (*out)[i].block_size = (size_t)bs;
    }
    Py_DECREF(t);
    return rc;
}

static int parse_pools(PyObject *seq, kvcr_dram_pool **out, size_t *n, PyObject *keep)
{
    *n = 0;
    *out = NULL;
    if (seq == Py_None) return 0;
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = alloc_n(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *name;
        unsigned long long addr, size;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OKK", &name, &addr, &size) ||
            ((*out)[i].name = str_of(name, keep, "pool name")) == NULL) {
            rc = -1;
        } else {
            (*out)[i].addr = (void *)(uintptr_t)addr;
            (*out)[i].size = (size_t)size;
        }
    }
    Py_DECREF(t);
    return rc;
}

static int parse_regions(PyObject *seq, kvcr_region **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = alloc_n(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *label;
        unsigned long long addr, size, count, stride;
        int mem_type, device;
        const char *l = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "KKKKOii", &addr, &size, &count, &stride,
                              &label, &mem_type, &device) ||
            (l = str_of(label, keep, "region label")) == NULL) {
            rc = -1;
        } else {
            (*out)[i] = (kvcr_region){(void *)(uintptr_t)addr, (size_t)size, (size_t)count,
                                      (size_t)stride, l, (kvcr_mem_type)mem_type, device};
        }
    }
    Py_DECREF(t);
    return rc;
}

static int has_flag(PyObject *o, const char *name)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int r = PyObject_IsTrue(v) == 1;
    Py_DECREF(v);
    return r;
}

/* policy: None (libkvcr's default), a built-in's name, or a Python adapter
 * with _name, _required_tiers_mask, _decide_ingest, ... */
static int set_policy(Instance *self, PyObject *policy, kvcr_config *cfg)
{
    if (policy == Py_None) return 0;
    if (PyUnicode_Check(policy)) {
        const char *name = PyUnicode_AsUTF8(policy);
        if (name == NULL) return -1;
        cfg->policy = kvcr_policy_builtin(name);
        if (cfg->policy == NULL) {
            PyErr_Format(PyExc_ValueError, "libkvcr has no built-in policy %R", policy);
            return -1;
        }
        return 0;
    }
    PyObject *name = PyObject_GetAttrString(policy, "_name");
    PyObject *tiers = name ? PyObject_GetAttrString(policy, "_required_tiers_mask") : NULL;
    const char *n = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    unsigned long mask = tiers ? PyLong_AsUnsignedLong(tiers) : 0;
    Py_XDECREF(name);
    Py_XDECREF(tiers);
    if (n == NULL || PyErr_Occurred()) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a KVCR policy adapter");
        return -1;
    }
    snprintf(self->policy_name, sizeof self->policy_name, "%s", n);
    self->ops = (kvcr_policy_ops){
        .version = KVCR_POLICY_VERSION,
        .name = self->policy_name,
        .required_tiers = (unsigned)mask,
        .decide_ingest = hook_ingest,
        .eviction_score = hook_score,
        .decide_eviction = hook_eviction,
        /* The optional hooks cost a GIL round trip: only when overridden. */
        .on_ingest = has_flag(policy, "_wants_on_ingest") ? hook_on_ingest : NULL,
        .on_remove = has_flag(policy, "_wants_on_remove") ? hook_on_remove : NULL,
        .decide_recovery = has_flag(policy, "_wants_recovery") ? hook_recovery : NULL,
    };
    self->policy = Py_NewRef(policy);
    cfg->policy = &self->ops;
    cfg->policy_ud = self;
    return 0;
}

/* g3: (paths tuple of str, capacity, backend str, queue_depth, max_staging_bytes), checked
 * for types and C ranges by kvcr/config.py; libkvcr checks the rest (and opens the files in
 * kvcr_create). *paths is an allocation that the caller frees; the strings are held by keep. */
static int parse_g3(PyObject *g3, kvcr_g3_options *out, const char ***paths, PyObject *keep)
{
    PyObject *seq, *backend;
    unsigned long long capacity, staging;
    unsigned int depth;
    if (!PyArg_ParseTuple(g3, "O!KOIK", &PyTuple_Type, &seq, &capacity, &backend, &depth,
                          &staging))
        return -1;
    size_t n = (size_t)PyTuple_GET_SIZE(seq);
    if ((*paths = alloc_n(n, sizeof **paths)) == NULL) return -1;
    for (size_t i = 0; i < n; i++)
        if (((*paths)[i] = str_of(PyTuple_GET_ITEM(seq, (Py_ssize_t)i), keep, "G3 path")) == NULL)
            return -1;
    if ((out->backend = str_of(backend, keep, "G3 backend")) == NULL) return -1;
    /* A non-NULL array even when empty: libkvcr then says "G3 requires at least one file
     * path" instead of taking NULL/0 for "no G3". */
    out->paths = *paths;
    out->n_paths = n;
    out->capacity_bytes_per_file = capacity;
    out->queue_depth = depth;
    out->max_staging_bytes = staging;
    return 0;
}

/* CURVE keys: (secret or None, public or None, allowed keys); no secret
 * means CURVE off. The keys are checked by libkvcr, whose message the
 * caller sees. */
static int parse_curve(PyObject *curve, kvcr_curve_options *out, const char ***keys,
                       PyObject *keep)
{
    PyObject *secret, *pub, *allowed;
    if (!PyArg_ParseTuple(curve, "OOO!", &secret, &pub, &PyTuple_Type, &allowed)) return -1;
    size_t n = (size_t)PyTuple_GET_SIZE(allowed);
    if ((*keys = alloc_n(n, sizeof **keys)) == NULL) return -1;
    for (size_t i = 0; i < n; i++)
        if (((*keys)[i] = str_of(PyTuple_GET_ITEM(allowed, (Py_ssize_t)i), keep,
                                 "curve allowed key")) == NULL)
            return -1;
    if ((secret != Py_None &&
         (out->secret_key = str_of(secret, keep, "curve secret key")) == NULL) ||
        (pub != Py_None && (out->public_key = str_of(pub, keep, "curve public key")) == NULL))
        return -1;
    out->allowed_keys = n ? *keys : NULL; /* libkvcr: keys without a secret are refused */
    out->n_allowed_keys = n;
    return 0;
}

/* remote: (eager, opportunistic, retry_ms, backend, curve, endpoint), the
 * options libkvcr checks with the peer tier on or off; endpoint (bind host,
 * port 0..65535 as kvcr/config.py checked it, advertise host) turns it on,
 * None leaves it off. */
static int parse_remote(PyObject *remote, kvcr_remote_options *out, const char ***curve_keys,
                        PyObject *keep)
{
    int eager, opportunistic;
    unsigned int retry_ms, port;
    PyObject *backend, *curve, *endpoint, *host, *adv;
    if (!PyArg_ParseTuple(remote, "ppIOOO", &eager, &opportunistic, &retry_ms, &backend, &curve,
                          &endpoint) ||
        parse_curve(curve, &out->curve, curve_keys, keep) != 0 ||
        (out->backend = str_of(backend, keep, "remote backend")) == NULL)
        return -1;
    out->eager_ctrl_connect = eager != 0;
    out->opportunistic_query = opportunistic != 0;
    out->metadata_retry_interval_ms = retry_ms;
    if (endpoint == Py_None) return 0;
    if (!PyArg_ParseTuple(endpoint, "OIO", &host, &port, &adv) ||
        (out->control_host = str_of(host, keep, "control host")) == NULL ||
        (out->advertise_host = str_of(adv, keep, "advertise host")) == NULL)
        return -1;
    out->control_port = (uint16_t)port;
    out->enabled = true;
    return 0;
}

static int Instance_init(Instance *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"agent_name", "pool_layouts", "local_dram", "local_backend",
                            "regions", "operation_timeout_ms", "abandon_timeout_ms",
                            "watermark_percent", "telemetry", "copy_threads", "policy",
                            "inventory", "capacity", "log", "make_entry", "remote", "key_hash",
                            "pins", "resilience", "g3", "guard", "limits", NULL};
    const char *agent, *backend;
    PyObject *layouts, *dram, *regions, *policy, *inventory, *capacity, *log, *make_entry;
    PyObject *remote = Py_None, *key_hash = Py_None, *pins = Py_None, *resilience = Py_None;
    PyObject *g3 = Py_None, *guard = Py_None, *limits = Py_None;
    unsigned int op_ms, abandon_ms, threads;
    double watermark;
    int telemetry;
    if (!ready() ||
        !PyArg_ParseTupleAndKeywords(args, kw, "sOOsOIIdpIOOOOO|OOOOOOO", names, &agent,
                                     &layouts, &dram, &backend, &regions, &op_ms, &abandon_ms,
                                     &watermark, &telemetry, &threads, &policy, &inventory,
                                     &capacity, &log, &make_entry, &remote, &key_hash, &pins,
                                     &resilience, &g3, &guard, &limits))
        return -1;
    if (self->kv != NULL || self->make_entry != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "instance already initialised");
        return -1;
    }
    if (!PyCallable_Check(make_entry)) {
        PyErr_SetString(PyExc_TypeError, "make_entry must be callable");
        return -1;
    }
    if ((key_hash != Py_None && !PyCallable_Check(key_hash)) ||
        (resilience != Py_None && !PyCallable_Check(resilience))) {
        PyErr_SetString(PyExc_TypeError, "key_hash and resilience must be callable or None");
        return -1;
    }
    PyObject *keep = PyList_New(0);
    kvcr_pool_layout *pl = NULL;
    kvcr_dram_pool *dp = NULL;
    kvcr_region *rg = NULL;
    const char **g3_paths = NULL, **curve_keys = NULL;
    size_t n_pl = 0, n_dp = 0, n_rg = 0;
    int rc = -1;
    if (keep == NULL || parse_layouts(layouts, &pl, &n_pl, keep) ||
        parse_pools(dram, &dp, &n_dp, keep) || parse_regions(regions, &rg, &n_rg, keep))
        goto out;
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = agent;
    cfg.pool_layouts = pl;
    cfg.n_pool_layouts = n_pl;
    cfg.local_dram = n_dp ? dp : NULL;
    cfg.n_local_dram = n_dp;
    cfg.local_dram_backend = backend;
    cfg.framework_regions = n_rg ? rg : NULL;
    cfg.n_framework_regions = n_rg;
    cfg.operation_timeout_ms = op_ms;
    cfg.abandon_timeout_ms = abandon_ms;
    cfg.capacity_low_watermark_percent = watermark;
    cfg.enable_telemetry = telemetry != 0;
    cfg.copy_threads = threads;
    if (remote != Py_None && parse_remote(remote, &cfg.remote, &curve_keys, keep) != 0)
        goto out;
    if (g3 != Py_None && parse_g3(g3, &cfg.g3, &g3_paths, keep) != 0) goto out;
    if (guard != Py_None) {
        /* (service socket path, guard_index, compatibility digest) */
        PyObject *path, *digest;
        unsigned int index;
        if (!PyArg_ParseTuple(guard, "OIO", &path, &index, &digest) ||
            (cfg.guard.service_socket_path = str_of(path, keep, "guard socket path")) == NULL ||
            (cfg.guard.compatibility_digest = str_of(digest, keep, "guard digest")) == NULL)
            goto out;
        cfg.guard.guard_index = index;
    }
    /* limits: the seven kvcr_limits fields in their C order (libkvcr checks the ranges) */
    if (limits != Py_None) {
        kvcr_limits *l = &cfg.limits;
        if (!PyArg_ParseTuple(limits, "IIIIIII", &l->max_source_writes_per_peer,
                              &l->max_source_writes, &l->max_pin_requests,
                              &l->max_control_message_bytes, &l->max_hint_bytes,
                              &l->max_hinted_requests, &l->max_unpolled_operations))
            goto out;
    }
    if (set_policy(self, policy, &cfg) != 0) goto out;
    self->make_entry = Py_NewRef(make_entry);
    self->log = log == Py_None ? NULL : Py_NewRef(log);
    self->inventory = inventory == Py_None ? NULL : Py_NewRef(inventory);
    self->capacity = capacity == Py_None ? NULL : Py_NewRef(capacity);
    self->key_hash = key_hash == Py_None ? NULL : Py_NewRef(key_hash);
    self->pins = pins == Py_None ? NULL : Py_NewRef(pins);
    self->resilience = resilience == Py_None ? NULL : Py_NewRef(resilience);
    cfg.callbacks = (kvcr_callbacks){
        .ud = self,
        .inventory = self->inventory ? cb_inventory : NULL,
        .capacity_needed = self->capacity ? cb_capacity : NULL,
        .log = self->log ? cb_log : NULL,
        .key_hash = self->key_hash ? cb_key_hash : NULL,
        .request_pin = self->pins ? cb_request_pin : NULL,
        .poll_pins = self->pins ? cb_poll_pins : NULL,
        .cancel_pin_request = self->pins ? cb_cancel_pin : NULL,
        .release_pin = self->pins ? cb_release_pin : NULL,
        .resilience = self->resilience ? cb_resilience : NULL,
    };
    int err;
    kvcr_t *kv = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = kvcr_create(&cfg, &kv);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        raise_rc(err);
        Py_CLEAR(self->policy);
        Py_CLEAR(self->inventory);
        Py_CLEAR(self->capacity);
        Py_CLEAR(self->log);
        Py_CLEAR(self->make_entry);
        Py_CLEAR(self->key_hash);
        Py_CLEAR(self->pins);
        Py_CLEAR(self->resilience);
        goto out;
    }
    self->kv = kv;
    rc = 0;
out:
    free(pl);
    free(dp);
    free(rg);
    free(g3_paths);
    free(curve_keys);
    Py_XDECREF(keep);
    return rc;
}

static void drop_callbacks(Instance *self)
{
    Py_CLEAR(self->policy);
    Py_CLEAR(self->inventory);
    Py_CLEAR(self->capacity);
    Py_CLEAR(self->key_hash);
    Py_CLEAR(self->pins);
    Py_CLEAR(self->resilience);
}

static void Instance_dealloc(Instance *self)
{
    if (self->kv != NULL) {
        kvcr_t *kv = self->kv;
        self->kv = NULL;
        Py_BEGIN_ALLOW_THREADS
        kvcr_free(kv);
        Py_END_ALLOW_THREADS
    }
    drop_callbacks(self);
    Py_CLEAR(self->log);
    Py_CLEAR(self->make_entry);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int live(Instance *self)
{
    if (self->kv != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, self->closed ? "the instance is closed"
                                                     : "the KVCR instance is not initialised");
    return 0;
}

/* ---- keys --------------------------------------------------------------- */

#define SMALL 64

/* The keys of a sequence of bytes. *held (a tuple) keeps them alive. */
typedef struct keyset {
    kvcr_key *keys;
    Py_ssize_t n;
    PyObject *held;
    kvcr_key small[SMALL];
} keyset;

static void keyset_free(keyset *k)
{
    if (k->keys != k->small) free(k->keys);
    Py_CLEAR(k->held);
}

static int keyset_of(PyObject *seq, keyset *k)
{
    k->keys = k->small;
    k->held = PyTuple_CheckExact(seq) ? Py_NewRef(seq) : PySequence_Tuple(seq);
    if (k->held == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "keys must be a sequence of bytes");
        }
        return -1;
    }
    k->n = PyTuple_GET_SIZE(k->held);
    if (k->n > SMALL && (k->keys = alloc_n((size_t)k->n, sizeof *k->keys)) == NULL) return -1;
    for (Py_ssize_t i = 0; i < k->n; i++) {
        PyObject *o = PyTuple_GET_ITEM(k->held, i);
        if (!PyBytes_Check(o)) {
            PyErr_Format(PyExc_TypeError, "block keys must be bytes, not %.80s",
                         Py_TYPE(o)->tp_name);
            return -1;
        }
        k->keys[i] = (kvcr_key){(const uint8_t *)PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o)};
    }
    return 0;
}

static int request_id_of(PyObject *o, const char **out)
{
    *out = NULL;
    if (o == NULL || o == Py_None) return 0;
    if (!PyUnicode_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "request_id must be a str or None");
        return -1;
    }
    return (*out = PyUnicode_AsUTF8(o)) ? 0 : -1;
}

/* ---- blocks: {key: [MemoryRef, ...]} ------------------------------------ */

typedef struct blockset {
    kvcr_block *blocks;
    kvcr_mem_ref *refs;
    PyObject **held; /* keys and label / end point strings */
    size_t n, n_refs, n_held;
    kvcr_block sb[16];
    kvcr_mem_ref sr[32];
    PyObject *sh[80];
} blockset;

static void blockset_free(blockset *b)
{
    for (size_t i = 0; i < b->n_held; i++) Py_DECREF(b->held[i]);
    if (b->blocks != b->sb) free(b->blocks);
    if (b->refs != b->sr) free(b->refs);
    if (b->held != b->sh) free(b->held);
}

static int ref_of(blockset *b, PyObject *ref, kvcr_mem_ref *out)
{
    PyObject *ep = PyObject_GetAttr(ref, s_end_point);
    if (ep == NULL) return -1;
    b->held[b->n_held++] = ep;
    PyObject *label = PyObject_GetAttr(ref, s_label);
    if (label == NULL) return -1;
    b->held[b->n_held++] = label;
    if (!PyUnicode_Check(ep) || !PyUnicode_Check(label)) {
        PyErr_SetString(PyExc_TypeError, "MemoryRef end_point_name and label must be str");
        return -1;
    }
    PyObject *index = PyObject_GetAttr(ref, s_index);
    if (index == NULL) return -1;
    unsigned long long v = 0;
    int bad = !PyLong_Check(index) || PyBool_Check(index);
    if (!bad) {
        v = PyLong_AsUnsignedLongLong(index);
        bad = v == (unsigned long long)-1 && PyErr_Occurred();
        PyErr_Clear();
    }
    Py_DECREF(index);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "MemoryRef element_index must be a non-negative int");
        return -1;
    }
    out->end_point = PyUnicode_AsUTF8(ep);
    out->label = PyUnicode_AsUTF8(label);
    out->index = v;
    return out->end_point && out->label ? 0 : -1;
}

static int blocks_of(PyObject *mapping, blockset *b)
{
    memset(b, 0, offsetof(blockset, sb));
    b->blocks = b->sb;
    b->refs = b->sr;
    b->held = b->sh;
    PyObject *items = NULL;
    if (!PyDict_Check(mapping)) {
        if (!PyMapping_Check(mapping) || (items = PyMapping_Items(mapping)) == NULL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "blocks must be a mapping of key to descriptors");
            return -1;
        }
    }
    /* Pass 1: shapes and sizes. No Python code runs between the passes. */
    Py_ssize_t pos = 0, n = items ? PyList_GET_SIZE(items) : PyDict_GET_SIZE(mapping);
    PyObject *key, *value;
    size_t total = 0;
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items) {
            PyObject *it = PyList_GET_ITEM(items, i);
            key = PyTuple_GET_ITEM(it, 0);
            value = PyTuple_GET_ITEM(it, 1);
        } else {
            PyDict_Next(mapping, &pos, &key, &value);
        }
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "block keys must be bytes, not %.80s",
                         Py_TYPE(key)->tp_name);
            goto out;
        }
        if (!PyList_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "block descriptors must be a list");
            goto out;
        }
        Py_ssize_t m = PyList_GET_SIZE(value);
        if (m == 0) {
            PyErr_SetString(PyExc_ValueError, "each block requires at least one descriptor");
            goto out;
        }
        for (Py_ssize_t j = 0; j < m; j++)
            if (!PyObject_TypeCheck(PyList_GET_ITEM(value, j), (PyTypeObject *)g_memref_type)) {
                PyErr_SetString(PyExc_ValueError, "each block requires at least one descriptor "
                                                  "(a list of MemoryRef)");
                goto out;
            }
        total += (size_t)m;
    }
    b->n = (size_t)n;
    b->n_refs = total;
    if ((b->n > 16 && (b->blocks = alloc_n(b->n, sizeof *b->blocks)) == NULL) ||
        (total > 32 && (b->refs = alloc_n(total, sizeof *b->refs)) == NULL) ||
        (b->n + 2 * total > 80 && (b->held = alloc_n(b->n + 2 * total, sizeof *b->held)) == NULL))
        goto out;
    /* Pass 2: hold everything libkvcr will read, and fill the structs. The
     * lists are copied first: attribute reads could run Python code. */
    pos = 0;
    size_t r = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items) {
            PyObject *it = PyList_GET_ITEM(items, i);
            key = PyTuple_GET_ITEM(it, 0);
            value = PyTuple_GET_ITEM(it, 1);
        } else if (!PyDict_Next(mapping, &pos, &key, &value)) {
            PyErr_SetString(PyExc_RuntimeError, "blocks changed during the call");
            goto out;
        }
        if (!PyBytes_Check(key) || !PyList_Check(value)) {
            PyErr_SetString(PyExc_RuntimeError, "blocks changed during the call");
            goto out;
        }
        b->held[b->n_held++] = Py_NewRef(key);
        PyObject *refs = PyList_AsTuple(value);
        if (refs == NULL) goto out;
        Py_ssize_t m = PyTuple_GET_SIZE(refs);
        if ((size_t)m + r > total) { /* changed under us */
            Py_DECREF(refs);
            PyErr_SetString(PyExc_RuntimeError, "blocks changed during the call");
            goto out;
        }
        b->blocks[i] = (kvcr_block){{(const uint8_t *)PyBytes_AS_STRING(key),
                                     (size_t)PyBytes_GET_SIZE(key)},
                                    &b->refs[r], (size_t)m};
        for (Py_ssize_t j = 0; j < m; j++, r++)
            if (ref_of(b, PyTuple_GET_ITEM(refs, j), &b->refs[r]) != 0) {
                Py_DECREF(refs);
                goto out;
            }
        Py_DECREF(refs);
    }
    rc = 0;
out:
    Py_XDECREF(items);
    return rc;
}

/* ---- pin results ---------------------------------------------------------- */

/* One kvcr_pin_complete from the bridge's (req, pin, {key: refs} | None,
 * (missing keys)). None blocks: the result had the wrong shape; libkvcr
 * refuses it (no keys) and releases the pin. */
static void complete_pin(Instance *self, PyObject *item)
{
    unsigned long long req, pin;
    PyObject *avail, *missing;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "KKOO!", &req, &pin, &avail,
                                                  &PyTuple_Type, &missing)) {
        PyErr_Clear();
        log_line(self, KVCR_LOG_ERROR, "internal: a pin result of the wrong shape was dropped");
        return;
    }
    blockset b;
    int have = 0, bad = 0;
    if (avail != Py_None) {
        have = 1;
        bad = blocks_of(avail, &b) != 0;
    }
    Py_ssize_t n_miss = PyTuple_GET_SIZE(missing);
    size_t n = bad ? 0 : (have ? b.n : 0) + (size_t)n_miss;
    kvcr_block *all = n ? calloc(n, sizeof *all) : NULL;
    if (n && all == NULL) n = 0; /* out of memory: refused, so released */
    for (size_t i = 0; all && have && i < b.n; i++) all[i] = b.blocks[i];
    for (Py_ssize_t i = 0, at = have ? (Py_ssize_t)b.n : 0; all && i < n_miss; i++) {
        PyObject *k = PyTuple_GET_ITEM(missing, i);
        if (!PyBytes_Check(k)) {
            n = 0;
            break;
        }
        all[at + i] = (kvcr_block){{(const uint8_t *)PyBytes_AS_STRING(k),
                                    (size_t)PyBytes_GET_SIZE(k)}, NULL, 0};
    }
    PyErr_Clear();
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_pin_complete(self->kv, req, pin, all, n);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0)
        log_line(self, rc == KVCR_ENOENT ? KVCR_LOG_DEBUG : KVCR_LOG_WARN,
                 "pin result for request %llu refused (pin released): %s", req,
                 kvcr_last_error());
    free(all);
    if (have) blockset_free(&b);
}

static void cb_poll_pins(void *ud)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = grab(self->pins);
    PyObject *list = bridge ? PyObject_CallMethodNoArgs(bridge, s_poll) : NULL;
    if (list != NULL && PyList_Check(list))
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
            complete_pin(self, PyList_GET_ITEM(list, i)); /* the list holds the items */
    Py_XDECREF(list);
    Py_XDECREF(bridge);
    PyErr_Clear();
    PyGILState_Release(g);
}

/* ---- methods ------------------------------------------------------------ */

static PyObject *pair(kvcr_query_result q)
{
    unsigned s = (unsigned)q.status, t = (unsigned)q.tier;
    if (s >= N_STATUS || t >= N_TIER) return PyErr_Format(PyExc_RuntimeError,
                                                          "unknown query result %u/%u", s, t);
    if (g_pair[s][t] == NULL) g_pair[s][t] = PyTuple_Pack(2, g_status[s], g_tier[t]);
    return Py_XNewRef(g_pair[s][t]);
}

/* query(keys, request_id) -> [(QueryStatus, CacheTier | None)] */
static PyObject *Instance_query(Instance *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!live(self)) return NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "query(keys, request_id=None)");
        return NULL;
    }
    const char *rid;
    if (request_id_of(nargs > 1 ? args[1] : NULL, &rid) != 0) return NULL;
    keyset k;
    if (keyset_of(args[0], &k) != 0) {
        keyset_free(&k);
        return NULL;
    }
    kvcr_query_result small[SMALL], *out = small;
    if (k.n > SMALL && (out = alloc_n((size_t)k.n, sizeof *out)) == NULL) {
        keyset_free(&k);
        return NULL;
    }
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_query(self->kv, k.keys, (size_t)k.n, rid, out);
    Py_END_ALLOW_THREADS
    self->calls--;
    PyObject *list = rc == 0 ? PyList_New(k.n) : raise_rc(rc);
    for (Py_ssize_t i = 0; list && i < k.n; i++) {
        PyObject *p = pair(out[i]);
        if (p == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, p);
    }
    if (out != small) free(out);
    keyset_free(&k);
    return list;
}

/* deposit(blocks, flags) / deliver(blocks, request_id) -> op handle */
static PyObject *submit_blocks(Instance *self, PyObject *args, int deliver)
{
    PyObject *mapping, *extra = Py_None;
    if (!live(self) || !PyArg_ParseTuple(args, "O|O", &mapping, &extra)) return NULL;
    unsigned flags = 0;
    const char *rid = NULL;
    if (deliver) {
        if (request_id_of(extra, &rid) != 0) return NULL;
    } else if (extra != Py_None) {
        flags = (unsigned)PyLong_AsUnsignedLong(extra);
        if (PyErr_Occurred()) return NULL;
    }
    blockset b;
    if (blocks_of(mapping, &b) != 0) {
        blockset_free(&b);
        return NULL;
    }
    kvcr_op_handle op = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = deliver ? kvcr_deliver(self->kv, b.blocks, b.n, rid, &op)
                 : kvcr_deposit(self->kv, b.blocks, b.n, flags, &op);
    Py_END_ALLOW_THREADS
    self->calls--;
    blockset_free(&b);
    return rc == 0 ? PyLong_FromUnsignedLongLong(op) : raise_rc(rc);
}

static PyObject *Instance_deposit(Instance *self, PyObject *args)
{
    return submit_blocks(self, args, 0);
}

static PyObject *Instance_deliver(Instance *self, PyObject *args)
{
    return submit_blocks(self, args, 1);
}

/* fetch(keys, request_id, layout | None) -> op handle */
static PyObject *Instance_fetch(Instance *self, PyObject *args)
{
    PyObject *seq, *rid_o = Py_None, *layout = Py_None;
    if (!live(self) || !PyArg_ParseTuple(args, "O|OO", &seq, &rid_o, &layout)) return NULL;
    const char *rid;
    if (request_id_of(rid_o, &rid) != 0) return NULL;
    PyObject *lt = NULL, *keep = PyList_New(0), *result = NULL;
    const char **names = NULL;
    Py_ssize_t n_names = 0;
    keyset k;
    if (keyset_of(seq, &k) != 0 || keep == NULL) goto out;
    if (layout != Py_None) {
        if ((lt = PySequence_Tuple(layout)) == NULL) goto out;
        n_names = PyTuple_GET_SIZE(lt);
        if ((names = alloc_n((size_t)n_names, sizeof *names)) == NULL) goto out;
        for (Py_ssize_t i = 0; i < n_names; i++)
            if ((names[i] = str_of(PyTuple_GET_ITEM(lt, i), keep, "expected_layout entry")) ==
                NULL)
                goto out;
        if (n_names == 0) {
            PyErr_SetString(PyExc_ValueError, "expected layout must use configured pools");
            goto out;
        }
    }
    kvcr_op_handle op = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_fetch(self->kv, k.keys, (size_t)k.n, rid, names, (size_t)n_names, &op);
    Py_END_ALLOW_THREADS
    self->calls--;
    result = rc == 0 ? PyLong_FromUnsignedLongLong(op) : raise_rc(rc);
out:
    keyset_free(&k);
    free(names);
    Py_XDECREF(lt);
    Py_XDECREF(keep);
    return result;
}

/* release(handles) -> [(handle, bool)] */
static PyObject *Instance_release(Instance *self, PyObject *seq)
{
    if (!live(self)) return NULL;
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    kvcr_release_handle *h = alloc_n((size_t)n, sizeof *h);
    bool *rel = alloc_n((size_t)n, sizeof *rel);
    PyObject *list = NULL;
    if (h != NULL && rel != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *v = PyTuple_GET_ITEM(t, i);
            /* Anything that is not a live handle simply is not released. */
            h[i] = 0;
            if (PyLong_Check(v) && !PyBool_Check(v)) {
                unsigned long long x = PyLong_AsUnsignedLongLong(v);
                if (!(x == (unsigned long long)-1 && PyErr_Occurred())) h[i] = x;
                PyErr_Clear();
            }
        }
        int rc;
        self->calls++;
        Py_BEGIN_ALLOW_THREADS
        rc = kvcr_release(self->kv, h, (size_t)n, rel);
        Py_END_ALLOW_THREADS
        self->calls--;
        list = rc == 0 ? PyList_New(n) : raise_rc(rc);
        for (Py_ssize_t i = 0; list && i < n; i++) {
            PyObject *p = PyTuple_Pack(2, PyTuple_GET_ITEM(t, i), rel[i] ? Py_True : Py_False);
            if (p == NULL) Py_CLEAR(list);
            else PyList_SET_ITEM(list, i, p);
        }
    }
    free(h);
    free(rel);
    Py_DECREF(t);
    return list;
}

/* abort(op, keys | None) -> bool: whether any entry was cancelled */
static PyObject *Instance_abort(Instance *self, PyObject *args)
{
    PyObject *op_o, *seq = Py_None;
    if (!live(self) || !PyArg_ParseTuple(args, "O|O", &op_o, &seq)) return NULL;
    if (!PyLong_Check(op_o) || PyBool_Check(op_o)) {
        PyErr_SetString(PyExc_TypeError, "abort: the operation handle must be an int");
        return NULL;
    }
    unsigned long long op = PyLong_AsUnsignedLongLong(op_o);
    if (op == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_FALSE; /* never a handle */
    }
    keyset k = {0};
    if (seq != Py_None && keyset_of(seq, &k) != 0) {
        keyset_free(&k);
        return NULL;
    }
    size_t aborted = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_abort(self->kv, op, seq != Py_None ? k.keys : NULL, (size_t)k.n, &aborted);
    Py_END_ALLOW_THREADS
    self->calls--;
    keyset_free(&k);
    if (rc == KVCR_ENOENT) Py_RETURN_FALSE;
    if (rc != 0) return raise_rc(rc);
    return PyBool_FromLong(aborted > 0);
}

static PyObject *entry_object(Instance *self, const kvcr_entry_result *e)
{
    unsigned st = (unsigned)e->status, why = (unsigned)e->reason;
    int plain = e->release_handle == 0 && e->n_slots == 0;
    if (plain && st < N_ENTRY && why < N_REASON && g_entry[st][why] != NULL)
        return Py_NewRef(g_entry[st][why]);
    PyObject *slots = Py_None, *res;
    if (e->n_slots > 0) {
        slots = PyTuple_New((Py_ssize_t)e->n_slots);
        for (size_t s = 0; slots && s < e->n_slots; s++) {
            PyObject *t = Py_BuildValue("(IKKK)", e->slots[s].pool,
                                        (unsigned long long)e->slots[s].slot,
                                        (unsigned long long)(uintptr_t)e->slots[s].addr,
                                        (unsigned long long)e->slots[s].size);
            if (t == NULL) Py_CLEAR(slots);
            else PyTuple_SET_ITEM(slots, (Py_ssize_t)s, t);
        }
        if (slots == NULL) return NULL;
    } else {
        Py_INCREF(slots);
    }
    const char *reason = e->reason == KVCR_REASON_NONE ? NULL : kvcr_reason_name(e->reason);
    res = PyObject_CallFunction(self->make_entry, "IzKO", st, reason,
                                (unsigned long long)e->release_handle, slots);
    Py_DECREF(slots);
    if (res != NULL && plain && st < N_ENTRY && why < N_REASON && g_entry[st][why] == NULL)
        g_entry[st][why] = Py_NewRef(res); /* immutable: shared from now on */
    return res;
}

/* poll() -> [(op handle, {key: OpEntryResult})] */
static PyObject *Instance_poll(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (!live(self)) return NULL;
    kvcr_op_result *res = NULL;
    size_t n = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_poll(self->kv, &res, &n);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return raise_rc(rc);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *entries = PyDict_New();
        for (size_t j = 0; entries && j < res[i].n_entries; j++) {
            const kvcr_entry_result *e = &res[i].entries[j];
            PyObject *key = PyBytes_FromStringAndSize((const char *)e->key.data,
                                                      (Py_ssize_t)e->key.len);
            PyObject *value = key ? entry_object(self, e) : NULL;
            if (value == NULL || PyDict_SetItem(entries, key, value) != 0) Py_CLEAR(entries);
            Py_XDECREF(key);
            Py_XDECREF(value);
        }
        PyObject *item = entries ? Py_BuildValue("(KN)", (unsigned long long)res[i].op, entries)
                                 : NULL;
        if (item == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    kvcr_results_free(res);
    return list;
}

/* stats(render) -> None | {"gauges": [(resource, value)], "counters": [(name,
 * operation, value)], "observations": [(scope, result, seconds)],
 * "observations_dropped": int, "prometheus": str | None} */
static PyObject *Instance_stats(Instance *self, PyObject *args)
{
    int render = 0;
    if (!live(self) || !PyArg_ParseTuple(args, "|p", &render)) return NULL;
    kvcr_stats *s = NULL;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_stats_take(self->kv, &s);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return raise_rc(rc);
    if (s == NULL) Py_RETURN_NONE;
    PyObject *g = PyList_New((Py_ssize_t)s->n_gauges), *c = PyList_New((Py_ssize_t)s->n_counters);
    PyObject *o = PyList_New((Py_ssize_t)s->n_observations), *prom = NULL;
    int ok = g && c && o;
    for (size_t i = 0; ok && i < s->n_gauges; i++) {
        PyObject *t = Py_BuildValue("(sd)", s->gauges[i].resource, s->gauges[i].value);
        if ((ok = t != NULL)) PyList_SET_ITEM(g, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; ok && i < s->n_counters; i++) {
        PyObject *t = Py_BuildValue("(ssd)", s->counters[i].name, s->counters[i].operation,
                                    s->counters[i].value);
        if ((ok = t != NULL)) PyList_SET_ITEM(c, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; ok && i < s->n_observations; i++) {
        PyObject *t = Py_BuildValue("(ssd)", s->observations[i].scope, s->observations[i].result,
                                    s->observations[i].seconds);
        if ((ok = t != NULL)) PyList_SET_ITEM(o, (Py_ssize_t)i, t);
    }
    if (ok && render) {
        char *text = NULL;
        size_t len = 0;
        int r = kvcr_stats_render_prometheus(s, &text, &len);
        prom = r == 0 ? PyUnicode_FromStringAndSize(text, (Py_ssize_t)len) : raise_rc(r);
        kvcr_prometheus_free(text);
        ok = prom != NULL;
    } else if (ok) {
        prom = Py_NewRef(Py_None);
    }
    unsigned long long dropped = s->observations_dropped;
    kvcr_stats_free(s);
    if (!ok) {
        Py_XDECREF(g), Py_XDECREF(c), Py_XDECREF(o), Py_XDECREF(prom);
        return NULL;
    }
    return Py_BuildValue("{sNsNsNsKsN}", "gauges", g, "counters", c, "observations", o,
                         "observations_dropped", dropped, "prometheus", prom);
}

/* close(): stops the instance; afterwards no callback runs again, so the
 * references to them are dropped (they may form cycles through the
 * framework's objects). When no other thread is inside a call the
 * instance is freed here too (kvcr_free), so what kvcr_close keeps (the
 * event fd, the index, UCX state on older libkvcr) goes at once instead of
 * at garbage collection, which a framework cycle may delay indefinitely;
 * otherwise dealloc frees it. Later calls raise "the instance is closed". */
static PyObject *Instance_close(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (self->kv == NULL) Py_RETURN_NONE;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_close(self->kv);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return raise_rc(rc);
    self->closed = true;
    drop_callbacks(self);
    if (self->calls == 0 && self->kv != NULL) {
        kvcr_t *kv = self->kv;
        self->kv = NULL; /* later calls: "the instance is closed" */
        Py_BEGIN_ALLOW_THREADS
        kvcr_free(kv);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* submit_hint(request_id | None, json bytes): libkvcr validates the kv_hint
 * envelope and keeps it for the request. */
static PyObject *Instance_submit_hint(Instance *self, PyObject *args)
{
    PyObject *rid_o;
    const char *rid, *json;
    Py_ssize_t len;
    if (!live(self) || !PyArg_ParseTuple(args, "Oy#", &rid_o, &json, &len) ||
        request_id_of(rid_o, &rid) != 0)
        return NULL;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_submit_hint(self->kv, rid, json, (size_t)len);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject *Instance_discard_hint(Instance *self, PyObject *rid_o)
{
    const char *rid;
    if (!live(self) || request_id_of(rid_o, &rid) != 0) return NULL;
    if (rid == NULL) Py_RETURN_NONE;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_discard_hint(self->kv, rid);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return raise_rc(rc);
    Py_RETURN_NONE;
}

/* For tests and diagnostics: (source, hashes, failed) of the hint stored for
 * a request, or None (libkvcr's test hook, kvcr/testing.h). */
static PyObject *Instance_hint(Instance *self, PyObject *rid_o)
{
    const char *rid, *source = NULL;
    size_t n = 0;
    const uint64_t *hashes = NULL;
    bool failed = false;
    if (!live(self) || request_id_of(rid_o, &rid) != 0) return NULL;
    if (rid == NULL) Py_RETURN_NONE;
    int found;
    /* The hook takes the instance lock: release the GIL like every other
     * call. (It returns pointers into the state after unlocking, so a
     * concurrent discard_hint of the same request must not race this.) */
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    found = kvcr__test_hint(self->kv, rid, &source, &n, &hashes, &failed);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (!found) Py_RETURN_NONE;
    PyObject *h = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; h && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(hashes[i]);
        if (v == NULL) Py_CLEAR(h);
        else PyTuple_SET_ITEM(h, (Py_ssize_t)i, v);
    }
    return h ? Py_BuildValue("(sNO)", source, h, failed ? Py_True : Py_False) : NULL;
}

/* endpoint() -> "tcp://host:port" of the control channel, or None */
static PyObject *Instance_endpoint(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (!live(self)) return NULL;
    const char *ep = kvcr_control_endpoint(self->kv);
    if (ep == NULL) Py_RETURN_NONE;
    return PyUnicode_FromString(ep);
}

static PyObject *Instance_fd(Instance *self, PyObject *noargs)
{
    (void)noargs;
    return live(self) ? PyLong_FromLong(kvcr_fd(self->kv)) : NULL;
}

static PyMethodDef Instance_methods[] = {
    {"query", (PyCFunction)(void (*)(void))Instance_query, METH_FASTCALL,
     "query(keys, request_id=None) -> [(QueryStatus, CacheTier | None)]"},
    {"deposit", (PyCFunction)Instance_deposit, METH_VARARGS, "deposit(blocks, flags=0) -> op"},
    {"deliver", (PyCFunction)Instance_deliver, METH_VARARGS,
     "deliver(blocks, request_id=None) -> op"},
    {"fetch", (PyCFunction)Instance_fetch, METH_VARARGS,
     "fetch(keys, request_id=None, layout=None) -> op"},
    {"release", (PyCFunction)Instance_release, METH_O, "release(handles) -> [(handle, bool)]"},
    {"abort", (PyCFunction)Instance_abort, METH_VARARGS, "abort(op, keys=None) -> bool"},
    {"poll", (PyCFunction)Instance_poll, METH_NOARGS, "poll() -> [(op, {key: entry})]"},
    {"stats", (PyCFunction)Instance_stats, METH_VARARGS, "stats(render=False) -> dict | None"},
    {"close", (PyCFunction)Instance_close, METH_NOARGS, "close()"},
    {"submit_hint", (PyCFunction)Instance_submit_hint, METH_VARARGS,
     "submit_hint(request_id, json_bytes)"},
    {"discard_hint", (PyCFunction)Instance_discard_hint, METH_O, "discard_hint(request_id)"},
    {"hint", (PyCFunction)Instance_hint, METH_O, "hint(request_id) -> (source, hashes, failed)"},
    {"fd", (PyCFunction)Instance_fd, METH_NOARGS, "fd() -> readable while poll has work"},
    {"endpoint", (PyCFunction)Instance_endpoint, METH_NOARGS,
     "endpoint() -> the control endpoint, or None without the remote tier"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject InstanceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcr._native.Instance",
    .tp_basicsize = sizeof(Instance),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One libkvcr instance (kvcr_t).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Instance_init,
    .tp_dealloc = (destructor)Instance_dealloc,
    .tp_methods = Instance_methods,
};

/* init(query_statuses, tiers, memory_ref_type, service_errors=None): the
 * Python values of the C enums, by C value (tiers[0] is None, for
 * KVCR_TIER_NONE), and the exception types for KVCR_EREFUSED, KVCR_EUNAVAIL
 * and KVCR_EPROTO (without them: RuntimeError). */
static PyObject *mod_init(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *statuses, *tiers, *memref, *errors = NULL;
    if (!PyArg_ParseTuple(args, "O!O!O!|O!", &PyTuple_Type, &statuses, &PyTuple_Type, &tiers,
                          &PyType_Type, &memref, &PyTuple_Type, &errors))
        return NULL;
    if (PyTuple_GET_SIZE(statuses) != N_STATUS || PyTuple_GET_SIZE(tiers) != N_TIER) {
        PyErr_Format(PyExc_ValueError, "init needs %d statuses and %d tiers", N_STATUS, N_TIER);
        return NULL;
    }
    if (errors != NULL) {
        if (PyTuple_GET_SIZE(errors) != 3) {
            PyErr_SetString(PyExc_ValueError, "init needs 3 service error types");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < 3; i++) {
            PyObject *t = PyTuple_GET_ITEM(errors, i);
            if (!PyType_Check(t) ||
                !PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)PyExc_RuntimeError)) {
                PyErr_SetString(PyExc_TypeError, "service error types must subclass RuntimeError");
                return NULL;
            }
        }
    }
    if (g_memref_type != NULL) Py_RETURN_NONE; /* once per process */
    if (errors != NULL) {
        g_err_service = Py_NewRef(PyTuple_GET_ITEM(errors, 0));
        g_err_socket = Py_NewRef(PyTuple_GET_ITEM(errors, 1));
        g_err_proto = Py_NewRef(PyTuple_GET_ITEM(errors, 2));
    }
    for (int i = 0; i < N_STATUS; i++) g_status[i] = Py_NewRef(PyTuple_GET_ITEM(statuses, i));
    for (int i = 0; i < N_TIER; i++) g_tier[i] = Py_NewRef(PyTuple_GET_ITEM(tiers, i));
    g_memref_type = Py_NewRef(memref);
    Py_RETURN_NONE;
}

static PyObject *mod_reason_name(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(kvcr_reason_name((kvcr_reason)v));
}

static PyMethodDef module_methods[] = {
    {"init", mod_init, METH_VARARGS,
     "init(query_statuses, tiers, MemoryRef, (service, socket, protocol error types))"},
    {"reason_name", mod_reason_name, METH_O, "reason_name(value) -> kvcr_reason_name(value)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvcr._native",
                                    "CPython binding of libkvcr.", -1, module_methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&InstanceType) < 0) return NULL;
    s_end_point = PyUnicode_InternFromString("end_point_name");
    s_label = PyUnicode_InternFromString("label");
    s_index = PyUnicode_InternFromString("element_index");
    s_ingest = PyUnicode_InternFromString("_decide_ingest");
    s_score = PyUnicode_InternFromString("_eviction_score");
    s_eviction = PyUnicode_InternFromString("_decide_eviction");
    s_on_ingest = PyUnicode_InternFromString("_on_ingest");
    s_on_remove = PyUnicode_InternFromString("_on_remove");
    s_recovery = PyUnicode_InternFromString("_decide_recovery");
    s_request = PyUnicode_InternFromString("request");
    s_poll = PyUnicode_InternFromString("poll");
    s_cancel = PyUnicode_InternFromString("cancel");
    s_release = PyUnicode_InternFromString("release");
    if (!s_end_point || !s_label || !s_index || !s_ingest || !s_score || !s_eviction ||
        !s_on_ingest || !s_on_remove || !s_recovery || !s_request || !s_poll || !s_cancel ||
        !s_release)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    kvcr_config defaults; /* libkvcr's defaults of the G3 extras (kvcr.config.G3Options) */
    kvcr_config_init(&defaults);
    PyObject *staging = PyLong_FromUnsignedLongLong(defaults.g3.max_staging_bytes);
    const kvcr_limits *dl = &defaults.limits; /* kvcr.config.KVCRLimits' defaults */
    PyObject *limits = Py_BuildValue(
        "{sIsIsIsIsIsIsI}", "max_source_writes_per_peer", dl->max_source_writes_per_peer,
        "max_source_writes", dl->max_source_writes, "max_pin_requests", dl->max_pin_requests,
        "max_control_message_bytes", dl->max_control_message_bytes, "max_hint_bytes",
        dl->max_hint_bytes, "max_hinted_requests", dl->max_hinted_requests,
        "max_unpolled_operations", dl->max_unpolled_operations);
    Py_INCREF(&InstanceType);
    if (staging == NULL || limits == NULL ||
        PyModule_AddObjectRef(m, "LIMIT_DEFAULTS", limits) != 0 ||
        PyModule_AddObject(m, "Instance", (PyObject *)&InstanceType) != 0 ||
        PyModule_AddStringConstant(m, "LIBRARY_VERSION", kvcr_version_string()) != 0 ||
        PyModule_AddIntConstant(m, "NO_EVICT", KVCR_NO_EVICT) != 0 ||
        PyModule_AddIntConstant(m, "G3_QUEUE_DEPTH", (long)defaults.g3.queue_depth) != 0 ||
        PyModule_AddObjectRef(m, "G3_MAX_STAGING_BYTES", staging) != 0) {
        Py_XDECREF(staging);
        Py_XDECREF(limits);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(staging);
    Py_DECREF(limits);
    return m;
}
