/* kvcr._native: the CPython binding of libkvcr.
 *
 * A thin layer: it converts Python values to the C API's structs and back,
 * and releases the GIL around every libkvcr call, because policy hooks and
 * log lines run under the instance lock and take the GIL themselves —
 * holding the GIL while waiting for that lock would deadlock. The Python
 * package (kvcr/api.py) validates and shapes everything else. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "kvcr/kvcr.h"

typedef struct {
    PyObject_HEAD
    kvcr_t *kv;
    PyObject *policy;    /* adapter object with _decide_ingest etc., or NULL */
    PyObject *inventory; /* callable(keys tuple, tier, removed) -> bool, or NULL */
    PyObject *capacity;  /* callable(list[(pool, slots)]) -> bool, or NULL */
    PyObject *log;       /* callable(level, message) */
    kvcr_policy_ops ops;
    char policy_name[128];
} Instance;

static PyObject *raise_rc(int rc)
{
    const char *msg = kvcr_last_error();
    PyObject *type = PyExc_RuntimeError;
    if (rc == KVCR_EINVAL) type = PyExc_ValueError;
    else if (rc == KVCR_ENOTSUP) type = PyExc_NotImplementedError;
    else if (rc == KVCR_ENOMEM) type = PyExc_MemoryError;
    PyErr_Format(type, "%s", msg[0] ? msg : kvcr_strerror(rc));
    return NULL;
}

/* ---- callbacks from C (any thread; they take the GIL) ------------------- */

static PyObject *meta_tuple(const kvcr_block_meta *m)
{
    PyObject *last = m->last_access >= 0 ? PyFloat_FromDouble(m->last_access) : Py_NewRef(Py_None);
    if (last == NULL) return NULL;
    return Py_BuildValue("(y#KKNIL)", (const char *)m->key.data, (Py_ssize_t)m->key.len,
                         (unsigned long long)m->size_bytes, (unsigned long long)m->access_count,
                         last, m->resident_tiers, (long long)m->position);
}

/* Calls policy.<name>(meta, *extra); NULL (with the error cleared) when the
 * hook failed: the Python adapter already logged why. */
static PyObject *call_policy(Instance *self, const char *name, const kvcr_block_meta *m,
                             const char *fmt, ...)
{
    PyObject *meta = meta_tuple(m);
    if (meta == NULL) {
        PyErr_Clear();
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    PyObject *extra = fmt ? Py_VaBuildValue(fmt, ap) : PyTuple_New(0);
    va_end(ap);
    PyObject *res = NULL;
    if (extra != NULL) {
        PyObject *args = PyTuple_New(1 + PyTuple_GET_SIZE(extra));
        if (args != NULL) {
            PyTuple_SET_ITEM(args, 0, Py_NewRef(meta));
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra); i++)
                PyTuple_SET_ITEM(args, i + 1, Py_NewRef(PyTuple_GET_ITEM(extra, i)));
            PyObject *fn = PyObject_GetAttrString(self->policy, name);
            if (fn != NULL) res = PyObject_Call(fn, args, NULL);
            Py_XDECREF(fn);
            Py_DECREF(args);
        }
        Py_DECREF(extra);
    }
    Py_DECREF(meta);
    if (res == Py_None) Py_CLEAR(res);
    if (res == NULL) PyErr_Clear();
    return res;
}

static int placement_from(PyObject *res, kvcr_placement *out)
{
    int action, tier;
    int ok = res != NULL && PyArg_ParseTuple(res, "ii", &action, &tier);
    Py_XDECREF(res);
    if (!ok) {
        PyErr_Clear();
        return -1;
    }
    out->action = (kvcr_action)action;
    out->tier = (kvcr_tier)tier;
    return 0;
}

static int hook_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source, bool required,
                       kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = placement_from(call_policy(ud, "_decide_ingest", m, "(iO)", (int)source,
                                        required ? Py_True : Py_False), out);
    PyGILState_Release(g);
    return rc;
}

static int hook_score(void *ud, const kvcr_block_meta *m, kvcr_tier source, double *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = call_policy(ud, "_eviction_score", m, "(i)", (int)source);
    int rc = -1;
    if (res != NULL) {
        *out = PyFloat_AsDouble(res);
        rc = PyErr_Occurred() ? -1 : 0;
        PyErr_Clear();
        Py_DECREF(res);
    }
    PyGILState_Release(g);
    return rc;
}

static int hook_eviction(void *ud, const kvcr_block_meta *m, kvcr_tier source, kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = placement_from(call_policy(ud, "_decide_eviction", m, "(i)", (int)source), out);
    PyGILState_Release(g);
    return rc;
}

static void hook_on_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(call_policy(ud, "_on_ingest", m, "(i)", (int)source));
    PyGILState_Release(g);
}

static void hook_on_remove(void *ud, const kvcr_block_meta *m)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(call_policy(ud, "_on_remove", m, NULL));
    PyGILState_Release(g);
}

/* Callbacks return a truthy value for success. */
static int truthy_call(PyObject *fn, PyObject *args)
{
    if (args == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject *res = PyObject_Call(fn, args, NULL);
    Py_DECREF(args);
    int ok = res != NULL && PyObject_IsTrue(res) == 1;
    Py_XDECREF(res);
    PyErr_Clear();
    return ok ? 0 : -1;
}

static int cb_inventory(void *ud, const kvcr_inventory_event *ev)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *keys = PyTuple_New((Py_ssize_t)ev->n_keys);
    for (size_t i = 0; keys && i < ev->n_keys; i++)
        PyTuple_SET_ITEM(keys, (Py_ssize_t)i,
                         PyBytes_FromStringAndSize((const char *)ev->keys[i].data,
                                                   (Py_ssize_t)ev->keys[i].len));
    int rc = -1;
    if (keys != NULL)
        rc = truthy_call(self->inventory, Py_BuildValue("(NiO)", keys, (int)ev->tier,
                                                        ev->removed ? Py_True : Py_False));
    PyErr_Clear();
    PyGILState_Release(g);
    return rc;
}

static int cb_capacity(void *ud, const kvcr_capacity_need *needs, size_t n)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i,
                        Py_BuildValue("(sK)", needs[i].pool, (unsigned long long)needs[i].slots));
    int rc = list ? truthy_call(self->capacity, Py_BuildValue("(N)", list)) : -1;
    PyErr_Clear();
    PyGILState_Release(g);
    return rc;
}

static void cb_log(void *ud, kvcr_log_level level, const char *message)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *res = PyObject_CallFunction(self->log, "is", (int)level, message);
    Py_XDECREF(res);
    PyErr_Clear();
    PyGILState_Release(g);
}

/* ---- construction ------------------------------------------------------- */

/* Strings borrowed from Python objects stay valid while `keep` holds them. */
static const char *str_of(PyObject *o, PyObject *keep)
{
    if (!PyUnicode_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "expected a str");
        return NULL;
    }
    if (PyList_Append(keep, o) != 0) return NULL;
    return PyUnicode_AsUTF8(o);
}

static int parse_layouts(PyObject *seq, kvcr_pool_layout **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    *out = calloc(*n ? *n : 1, sizeof **out);
    for (size_t i = 0; i < *n; i++) {
        PyObject *name;
        unsigned long long bs;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OK", &name, &bs) ||
            ((*out)[i].name = str_of(name, keep)) == NULL) {
            Py_DECREF(t);
            return -1;
        }
        (*out)[i].block_size = (size_t)bs;
    }
    Py_DECREF(t);
    return 0;
}

static int parse_pools(PyObject *seq, kvcr_dram_pool **out, size_t *n, PyObject *keep)
{
    *n = 0;
    *out = NULL;
    if (seq == Py_None) return 0;
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    *out = calloc(*n ? *n : 1, sizeof **out);
    for (size_t i = 0; i < *n; i++) {
        PyObject *name;
        unsigned long long addr, size;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OKK", &name, &addr, &size) ||
            ((*out)[i].name = str_of(name, keep)) == NULL) {
            Py_DECREF(t);
            return -1;
        }
        (*out)[i].addr = (void *)(uintptr_t)addr;
        (*out)[i].size = (size_t)size;
    }
    Py_DECREF(t);
    return 0;
}

static int parse_regions(PyObject *seq, kvcr_region **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    *out = calloc(*n ? *n : 1, sizeof **out);
    for (size_t i = 0; i < *n; i++) {
        PyObject *label;
        unsigned long long addr, size, count, stride;
        int mem_type, device;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "KKKKOii", &addr, &size, &count, &stride,
                              &label, &mem_type, &device) ||
            ((*out)[i].label = str_of(label, keep)) == NULL) {
            Py_DECREF(t);
            return -1;
        }
        (*out)[i] = (kvcr_region){(void *)(uintptr_t)addr, (size_t)size, (size_t)count,
                                  (size_t)stride, (*out)[i].label, (kvcr_mem_type)mem_type, device};
    }
    Py_DECREF(t);
    return 0;
}

static int set_policy(Instance *self, PyObject *policy, kvcr_config *cfg)
{
    if (policy == Py_None) return 0;
    if (PyUnicode_Check(policy)) {
        cfg->policy = kvcr_policy_builtin(PyUnicode_AsUTF8(policy));
        if (cfg->policy == NULL) {
            PyErr_Format(PyExc_ValueError, "unknown built-in policy %R", policy);
            return -1;
        }
        return 0;
    }
    PyObject *name = PyObject_GetAttrString(policy, "_name");
    PyObject *tiers = PyObject_GetAttrString(policy, "_required_tiers_mask");
    if (name == NULL || tiers == NULL || !PyUnicode_Check(name)) {
        Py_XDECREF(name);
        Py_XDECREF(tiers);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "policy adapter lacks _name");
        return -1;
    }
    snprintf(self->policy_name, sizeof self->policy_name, "%s", PyUnicode_AsUTF8(name));
    self->ops = (kvcr_policy_ops){.name = self->policy_name,
                                  .required_tiers = (unsigned)PyLong_AsUnsignedLong(tiers),
                                  .decide_ingest = hook_ingest,
                                  .eviction_score = hook_score,
                                  .decide_eviction = hook_eviction,
                                  .on_ingest = hook_on_ingest,
                                  .on_remove = hook_on_remove};
    Py_DECREF(name);
    Py_DECREF(tiers);
    self->policy = Py_NewRef(policy);
    cfg->policy = &self->ops;
    cfg->policy_ud = self;
    return 0;
}

static int Instance_init(Instance *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"agent_name", "pool_layouts", "local_dram", "local_backend",
                            "regions", "operation_timeout_ms", "abandon_timeout_ms",
                            "watermark_percent", "telemetry", "copy_threads", "policy",
                            "inventory", "capacity", "log", NULL};
    const char *agent, *backend;
    PyObject *layouts, *dram, *regions, *policy, *inventory, *capacity, *log;
    unsigned int op_ms, abandon_ms, threads;
    double watermark;
    int telemetry;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOOsOIIdpIOOOO", names, &agent, &layouts, &dram,
                                     &backend, &regions, &op_ms, &abandon_ms, &watermark,
                                     &telemetry, &threads, &policy, &inventory, &capacity, &log))
        return -1;
    if (self->kv != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "instance already initialised");
        return -1;
    }
    PyObject *keep = PyList_New(0);
    kvcr_pool_layout *pl = NULL;
    kvcr_dram_pool *dp = NULL;
    kvcr_region *rg = NULL;
    size_t n_pl = 0, n_dp = 0, n_rg = 0;
    int rc = -1;
    if (keep == NULL || parse_layouts(layouts, &pl, &n_pl, keep) || parse_pools(dram, &dp, &n_dp, keep) ||
        parse_regions(regions, &rg, &n_rg, keep))
        goto out;
    kvcr_config cfg;
    kvcr_config_init(&cfg);
    cfg.agent_name = agent;
    cfg.pool_layouts = pl;
    cfg.n_pool_layouts = n_pl;
    cfg.local_dram = dp;
    cfg.n_local_dram = n_dp;
    cfg.local_dram_backend = backend;
    cfg.framework_regions = rg;
    cfg.n_framework_regions = n_rg;
    cfg.operation_timeout_ms = op_ms;
    cfg.abandon_timeout_ms = abandon_ms;
    cfg.capacity_low_watermark_percent = watermark;
    cfg.enable_telemetry = telemetry != 0;
    cfg.copy_threads = threads;
    if (set_policy(self, policy, &cfg) != 0) goto out;
    self->log = Py_NewRef(log);
    self->inventory = inventory == Py_None ? NULL : Py_NewRef(inventory);
    self->capacity = capacity == Py_None ? NULL : Py_NewRef(capacity);
    cfg.callbacks = (kvcr_callbacks){self, self->inventory ? cb_inventory : NULL,
                                     self->capacity ? cb_capacity : NULL, cb_log};
    int err;
    kvcr_t *kv = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = kvcr_create(&cfg, &kv);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        raise_rc(err);
        goto out;
    }
    self->kv = kv;
    rc = 0;
out:
    free(pl);
    free(dp);
    free(rg);
    Py_XDECREF(keep);
    return rc;
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
    Py_XDECREF(self->policy);
    Py_XDECREF(self->inventory);
    Py_XDECREF(self->capacity);
    Py_XDECREF(self->log);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int live(Instance *self)
{
    if (self->kv != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "KVCR instance is not initialised");
    return 0;
}

/* ---- keys and blocks ---------------------------------------------------- */

/* keys: a tuple of bytes (the caller keeps it alive). */
static kvcr_key *keys_of(PyObject *t, Py_ssize_t *n)
{
    *n = PyTuple_GET_SIZE(t);
    kvcr_key *keys = calloc(*n > 0 ? (size_t)*n : 1, sizeof *keys);
    if (keys == NULL) return (kvcr_key *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *k = PyTuple_GET_ITEM(t, i);
        if (!PyBytes_Check(k)) {
            free(keys);
            PyErr_SetString(PyExc_TypeError, "block keys must be bytes");
            return NULL;
        }
        keys[i] = (kvcr_key){(const uint8_t *)PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k)};
    }
    return keys;
}

typedef struct blockset {
    kvcr_block *blocks;
    kvcr_mem_ref *refs;
    Py_ssize_t n;
    PyObject *keep;
} blockset;

static void blockset_free(blockset *b)
{
    free(b->blocks);
    free(b->refs);
    Py_XDECREF(b->keep);
}

/* items: tuple of (key bytes, tuple of (end_point str|None, label str, index int)). */
static int blocks_of(PyObject *items, blockset *b)
{
    memset(b, 0, sizeof *b);
    if (!PyTuple_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "blocks must be a tuple");
        return -1;
    }
    b->keep = PyList_New(0);
    b->n = PyTuple_GET_SIZE(items);
    size_t total = 0;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(it, 1))) {
            PyErr_SetString(PyExc_TypeError, "each block must be (key, refs)");
            return -1;
        }
        total += (size_t)PyTuple_GET_SIZE(PyTuple_GET_ITEM(it, 1));
    }
    b->blocks = calloc(b->n > 0 ? (size_t)b->n : 1, sizeof *b->blocks);
    b->refs = calloc(total ? total : 1, sizeof *b->refs);
    if (b->keep == NULL || b->blocks == NULL || b->refs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t r = 0;
    for (Py_ssize_t i = 0; i < b->n; i++) {
        PyObject *it = PyTuple_GET_ITEM(items, i), *key = PyTuple_GET_ITEM(it, 0);
        PyObject *refs = PyTuple_GET_ITEM(it, 1);
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "block keys must be bytes");
            return -1;
        }
        b->blocks[i] = (kvcr_block){{(const uint8_t *)PyBytes_AS_STRING(key),
                                     (size_t)PyBytes_GET_SIZE(key)},
                                    &b->refs[r], (size_t)PyTuple_GET_SIZE(refs)};
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(refs); j++, r++) {
            PyObject *ep, *label;
            unsigned long long index;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(refs, j), "OOK", &ep, &label, &index))
                return -1;
            b->refs[r].end_point = ep == Py_None ? NULL : str_of(ep, b->keep);
            b->refs[r].label = str_of(label, b->keep);
            if ((ep != Py_None && b->refs[r].end_point == NULL) || b->refs[r].label == NULL)
                return -1;
            b->refs[r].index = index;
        }
    }
    return 0;
}

/* ---- methods ------------------------------------------------------------ */

static PyObject *Instance_query(Instance *self, PyObject *args)
{
    PyObject *t;
    const char *rid = NULL;
    if (!live(self) || !PyArg_ParseTuple(args, "O!|z", &PyTuple_Type, &t, &rid)) return NULL;
    Py_ssize_t n;
    kvcr_key *keys = keys_of(t, &n);
    if (keys == NULL) return NULL;
    kvcr_query_result stack[64], *out = n <= 64 ? stack : malloc((size_t)n * sizeof *out);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_query(self->kv, keys, (size_t)n, rid, out);
    Py_END_ALLOW_THREADS
    free(keys);
    PyObject *list = rc == 0 ? PyList_New(n) : raise_rc(rc);
    for (Py_ssize_t i = 0; list && i < n; i++)
        PyList_SET_ITEM(list, i, Py_BuildValue("(ii)", (int)out[i].status, (int)out[i].tier));
    if (out != stack) free(out);
    return list;
}

static PyObject *submit_blocks(Instance *self, PyObject *args, int deliver)
{
    PyObject *items;
    unsigned flags = 0;
    const char *rid = NULL;
    int ok = deliver ? PyArg_ParseTuple(args, "O|z", &items, &rid)
                     : PyArg_ParseTuple(args, "O|I", &items, &flags);
    if (!live(self) || !ok) return NULL;
    blockset b;
    if (blocks_of(items, &b) != 0) {
        blockset_free(&b);
        return NULL;
    }
    kvcr_op_handle op = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = deliver ? kvcr_deliver(self->kv, b.blocks, (size_t)b.n, rid, &op)
                 : kvcr_deposit(self->kv, b.blocks, (size_t)b.n, flags, &op);
    Py_END_ALLOW_THREADS
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

static PyObject *Instance_fetch(Instance *self, PyObject *args)
{
    PyObject *t, *layout = Py_None;
    const char *rid = NULL;
    if (!live(self) || !PyArg_ParseTuple(args, "O!|zO", &PyTuple_Type, &t, &rid, &layout))
        return NULL;
    Py_ssize_t n;
    kvcr_key *keys = keys_of(t, &n);
    if (keys == NULL) return NULL;
    PyObject *keep = PyList_New(0);
    const char **names = NULL;
    Py_ssize_t n_names = 0;
    PyObject *lt = layout == Py_None ? NULL : PySequence_Tuple(layout);
    if (lt != NULL) {
        n_names = PyTuple_GET_SIZE(lt);
        names = calloc(n_names ? (size_t)n_names : 1, sizeof *names);
        for (Py_ssize_t i = 0; i < n_names; i++)
            if ((names[i] = str_of(PyTuple_GET_ITEM(lt, i), keep)) == NULL) break;
    }
    PyObject *result = NULL;
    if (!PyErr_Occurred()) {
        kvcr_op_handle op = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = kvcr_fetch(self->kv, keys, (size_t)n, rid, names, (size_t)n_names, &op);
        Py_END_ALLOW_THREADS
        result = rc == 0 ? PyLong_FromUnsignedLongLong(op) : raise_rc(rc);
    }
    free(keys);
    free(names);
    Py_XDECREF(lt);
    Py_XDECREF(keep);
    return result;
}

static PyObject *Instance_release(Instance *self, PyObject *args)
{
    PyObject *seq;
    if (!live(self) || !PyArg_ParseTuple(args, "O", &seq)) return NULL;
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    kvcr_release_handle *h = calloc(n > 0 ? (size_t)n : 1, sizeof *h);
    bool *rel = calloc(n > 0 ? (size_t)n : 1, sizeof *rel);
    for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); i++) {
        PyObject *v = PyTuple_GET_ITEM(t, i);
        /* Anything that is not a live handle simply is not released. */
        h[i] = PyLong_Check(v) ? PyLong_AsUnsignedLongLongMask(v) : 0;
    }
    PyObject *list = NULL;
    if (!PyErr_Occurred()) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = kvcr_release(self->kv, h, (size_t)n, rel);
        Py_END_ALLOW_THREADS
        list = rc == 0 ? PyList_New(n) : raise_rc(rc);
        for (Py_ssize_t i = 0; list && i < n; i++)
            PyList_SET_ITEM(list, i, PyBool_FromLong(rel[i]));
    }
    free(h);
    free(rel);
    Py_DECREF(t);
    return list;
}

static PyObject *Instance_abort(Instance *self, PyObject *args)
{
    unsigned long long op;
    PyObject *t = Py_None;
    if (!live(self) || !PyArg_ParseTuple(args, "K|O", &op, &t)) return NULL;
    Py_ssize_t n = 0;
    kvcr_key *keys = NULL;
    if (t != Py_None && (keys = keys_of(t, &n)) == NULL) return NULL;
    size_t aborted = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_abort(self->kv, op, keys, (size_t)n, &aborted);
    Py_END_ALLOW_THREADS
    free(keys);
    if (rc == KVCR_ENOENT) return PyLong_FromLong(0);
    return rc == 0 ? PyLong_FromSize_t(aborted) : raise_rc(rc);
}

static PyObject *entry_tuple(const kvcr_entry_result *e)
{
    PyObject *slots = PyList_New((Py_ssize_t)e->n_slots);
    for (size_t s = 0; slots && s < e->n_slots; s++)
        PyList_SET_ITEM(slots, (Py_ssize_t)s,
                        Py_BuildValue("(IKKK)", e->slots[s].pool, (unsigned long long)e->slots[s].slot,
                                      (unsigned long long)(uintptr_t)e->slots[s].addr,
                                      (unsigned long long)e->slots[s].size));
    if (slots == NULL) return NULL;
    return Py_BuildValue("(y#isKN)", (const char *)e->key.data, (Py_ssize_t)e->key.len,
                         (int)e->status, kvcr_reason_name(e->reason),
                         (unsigned long long)e->release_handle, slots);
}

static PyObject *Instance_poll(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (!live(self)) return NULL;
    kvcr_op_result *res = NULL;
    size_t n = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_poll(self->kv, &res, &n);
    Py_END_ALLOW_THREADS
    if (rc != 0) return raise_rc(rc);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *entries = PyList_New((Py_ssize_t)res[i].n_entries);
        for (size_t j = 0; entries && j < res[i].n_entries; j++) {
            PyObject *e = entry_tuple(&res[i].entries[j]);
            if (e == NULL) Py_CLEAR(entries);
            else PyList_SET_ITEM(entries, (Py_ssize_t)j, e);
        }
        if (entries == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, Py_BuildValue("(KN)", (unsigned long long)res[i].op, entries));
    }
    kvcr_results_free(res);
    return list;
}

static PyObject *Instance_stats(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (!live(self)) return NULL;
    kvcr_stats *s = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_stats_take(self->kv, &s);
    Py_END_ALLOW_THREADS
    if (rc != 0) return raise_rc(rc);
    if (s == NULL) Py_RETURN_NONE;
    PyObject *g = PyList_New((Py_ssize_t)s->n_gauges), *c = PyList_New((Py_ssize_t)s->n_counters);
    PyObject *o = PyList_New((Py_ssize_t)s->n_observations);
    for (size_t i = 0; g && i < s->n_gauges; i++)
        PyList_SET_ITEM(g, (Py_ssize_t)i, Py_BuildValue("(sd)", s->gauges[i].resource, s->gauges[i].value));
    for (size_t i = 0; c && i < s->n_counters; i++)
        PyList_SET_ITEM(c, (Py_ssize_t)i, Py_BuildValue("(ssd)", s->counters[i].name,
                                                        s->counters[i].operation, s->counters[i].value));
    for (size_t i = 0; o && i < s->n_observations; i++)
        PyList_SET_ITEM(o, (Py_ssize_t)i, Py_BuildValue("(ssd)", s->observations[i].scope,
                                                        s->observations[i].result, s->observations[i].seconds));
    char *text = NULL;
    size_t len = 0;
    PyObject *prom = kvcr_stats_render_prometheus(s, &text, &len) == 0
                         ? PyUnicode_FromStringAndSize(text, (Py_ssize_t)len) : Py_NewRef(Py_None);
    free(text);
    kvcr_stats_free(s);
    if (g == NULL || c == NULL || o == NULL || prom == NULL) {
        Py_XDECREF(g), Py_XDECREF(c), Py_XDECREF(o), Py_XDECREF(prom);
        return NULL;
    }
    return Py_BuildValue("{sNsNsNsN}", "gauges", g, "counters", c, "observations", o,
                         "prometheus", prom);
}

static PyObject *Instance_close(Instance *self, PyObject *noargs)
{
    (void)noargs;
    if (self->kv == NULL) Py_RETURN_NONE;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_close(self->kv);
    Py_END_ALLOW_THREADS
    if (rc != 0) return raise_rc(rc);
    Py_RETURN_NONE;
}

static PyObject *Instance_pool_name(Instance *self, PyObject *args)
{
    unsigned int pool;
    if (!live(self) || !PyArg_ParseTuple(args, "I", &pool)) return NULL;
    const char *name = kvcr_pool_name(self->kv, pool);
    if (name == NULL) return PyErr_Format(PyExc_IndexError, "no pool %u", pool);
    return PyUnicode_FromString(name);
}

static PyObject *Instance_fd(Instance *self, PyObject *noargs)
{
    (void)noargs;
    return live(self) ? PyLong_FromLong(kvcr_fd(self->kv)) : NULL;
}

static PyMethodDef Instance_methods[] = {
    {"query", (PyCFunction)Instance_query, METH_VARARGS, "query(keys, request_id)"},
    {"deposit", (PyCFunction)Instance_deposit, METH_VARARGS, "deposit(blocks, flags)"},
    {"deliver", (PyCFunction)Instance_deliver, METH_VARARGS, "deliver(blocks, request_id)"},
    {"fetch", (PyCFunction)Instance_fetch, METH_VARARGS, "fetch(keys, request_id, layout)"},
    {"release", (PyCFunction)Instance_release, METH_VARARGS, "release(handles)"},
    {"abort", (PyCFunction)Instance_abort, METH_VARARGS, "abort(op, keys)"},
    {"poll", (PyCFunction)Instance_poll, METH_NOARGS, "poll()"},
    {"stats", (PyCFunction)Instance_stats, METH_NOARGS, "stats()"},
    {"close", (PyCFunction)Instance_close, METH_NOARGS, "close()"},
    {"pool_name", (PyCFunction)Instance_pool_name, METH_VARARGS, "pool_name(index)"},
    {"fd", (PyCFunction)Instance_fd, METH_NOARGS, "fd()"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject InstanceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvcr._native.Instance",
    .tp_basicsize = sizeof(Instance),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Instance_init,
    .tp_dealloc = (destructor)Instance_dealloc,
    .tp_methods = Instance_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvcr._native",
                                    "CPython binding of libkvcr.", -1, NULL};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&InstanceType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&InstanceType);
    PyModule_AddObject(m, "Instance", (PyObject *)&InstanceType);
    PyModule_AddStringConstant(m, "LIBRARY_VERSION", kvcr_version_string());
    return m;
}
