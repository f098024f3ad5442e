/* kvcr._native: the Instance type (see _native.h) — one libkvcr instance:
 * construction from kvcr/api.py's arguments, the operations, close. Each
 * libkvcr call that takes the instance lock runs with the GIL released
 * (self->calls counts them) and with every Python object whose memory it
 * reads held. Methods run with the GIL held. */
#include "_native.h"

#include <stdlib.h>

#include "kvcr/testing.h"

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
    if (self->closed) nat_raise_message(KVCR_ECLOSED, "the instance is closed");
    else PyErr_SetString(PyExc_RuntimeError, "the KVCR instance is not initialised");
    return 0;
}

static int Instance_init(Instance *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"agent_name", "pool_layouts", "local_dram", "regions", "options",
                            "policy", "inventory", "capacity", "log", "make_entry", "key_hash",
                            "pins", "resilience", "g3_paths", "curve_allowed_keys", "tenants",
                            NULL};
    nat_config_args a = {.g3_paths = Py_None, .curve_keys = Py_None, .tenants = Py_None};
    PyObject *policy, *inventory, *capacity, *log, *make_entry;
    PyObject *key_hash = Py_None, *pins = Py_None, *resilience = Py_None;
    if (!nat_ready() ||
        !PyArg_ParseTupleAndKeywords(args, kw, "sOOOO!OOOOO|OOOOOO", names, &a.agent,
                                     &a.layouts, &a.dram, &a.regions, &PyDict_Type, &a.options,
                                     &policy, &inventory, &capacity, &log, &make_entry,
                                     &key_hash, &pins, &resilience, &a.g3_paths, &a.curve_keys,
                                     &a.tenants))
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
    nat_config c;
    int rc = -1;
    if (nat_config_build(&a, &c) != 0 || nat_policy_set(self, policy, &c.cfg) != 0) goto out;
    self->make_entry = Py_NewRef(make_entry);
    self->log = log == Py_None ? NULL : Py_NewRef(log);
    self->inventory = inventory == Py_None ? NULL : Py_NewRef(inventory);
    self->capacity = capacity == Py_None ? NULL : Py_NewRef(capacity);
    self->key_hash = key_hash == Py_None ? NULL : Py_NewRef(key_hash);
    self->pins = pins == Py_None ? NULL : Py_NewRef(pins);
    self->resilience = resilience == Py_None ? NULL : Py_NewRef(resilience);
    c.cfg.callbacks = nat_callbacks_of(self);
    int err;
    kvcr_t *kv = NULL;
    Py_BEGIN_ALLOW_THREADS
    err = kvcr_create(&c.cfg, &kv);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        nat_raise(err);
        drop_callbacks(self);
        Py_CLEAR(self->log);
        Py_CLEAR(self->make_entry);
        goto out;
    }
    self->kv = kv;
    rc = 0;
out:
    nat_config_free(&c);
    return rc;
}

/* ---- methods ------------------------------------------------------------ */

/* query(keys, request_id) -> [(QueryStatus, CacheTier | None)] */
static PyObject *Instance_query(Instance *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!live(self)) return NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "query(keys, request_id=None)");
        return NULL;
    }
    const char *rid;
    if (nat_request_id(nargs > 1 ? args[1] : NULL, &rid) != 0) return NULL;
    keyset k;
    if (nat_keys_of(args[0], &k) != 0) {
        nat_keys_free(&k);
        return NULL;
    }
    kvcr_query_result small[NAT_SMALL], *out = small;
    if (k.n > NAT_SMALL && (out = nat_alloc((size_t)k.n, sizeof *out)) == NULL) {
        nat_keys_free(&k);
        return NULL;
    }
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_query(self->kv, k.keys, (size_t)k.n, rid, out);
    Py_END_ALLOW_THREADS
    self->calls--;
    PyObject *list = rc == 0 ? PyList_New(k.n) : nat_raise(rc);
    for (Py_ssize_t i = 0; list && i < k.n; i++) {
        PyObject *p = nat_query_pair(out[i]);
        if (p == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, p);
    }
    if (out != small) free(out);
    nat_keys_free(&k);
    return list;
}

/* An operation's framework hints: None, or JSON text as bytes (valid while
 * the caller holds the argument). 0, or -1 with TypeError. */
static int hints_of(PyObject *o, const char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (o == Py_None) return 0;
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "hints must be JSON text as bytes or None");
        return -1;
    }
    *text = PyBytes_AS_STRING(o);
    *len = (size_t)PyBytes_GET_SIZE(o);
    return 0;
}

/* What a deposit says of its blocks for the KV events. */
typedef struct routerset {
    kvcr_router_block *rb;     /* n entries, or NULL: none given */
    uint32_t *tokens;          /* every block's token ids, back to back */
    const char **extra;        /* per block: its extra keys as JSON text, or NULL */
    PyObject *keep;            /* the strings libkvcr reads */
} routerset;

static void routers_free(routerset *r)
{
    free(r->rb);
    free(r->tokens);
    free(r->extra);
    Py_CLEAR(r->keep);
}

/* One block's (parent | None, token ids tuple, block_size, lora | None,
 * extra keys as JSON text | None) (kvcr.api shapes it; libkvcr checks the
 * bounds and the keys' types: kvcr_deposit_options.router_extra). */
static int router_one(PyObject *t, kvcr_router_block *rb, uint32_t *tokens, size_t *n_tok,
                      const char **extra, PyObject *keep)
{
    PyObject *parent, *toks, *lora, *keys;
    unsigned int bs;
    if (!PyArg_ParseTuple(t, "OO!IOO", &parent, &PyTuple_Type, &toks, &bs, &lora, &keys))
        return -1;
    *rb = (kvcr_router_block){.block_size_tokens = bs};
    if (parent != Py_None) {
        rb->has_parent = true;
        rb->parent_hash = PyLong_AsUnsignedLongLong(parent);
        if (PyErr_Occurred()) return -1;
    }
    Py_ssize_t nt = PyTuple_GET_SIZE(toks);
    if (nt > 0) rb->token_ids = tokens + *n_tok;
    for (Py_ssize_t i = 0; i < nt; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(toks, i));
        if (PyErr_Occurred()) return -1;
        tokens[(*n_tok)++] = (uint32_t)v;
    }
    if (lora != Py_None && (rb->lora_name = nat_str_of(lora, keep, "lora_name")) == NULL)
        return -1;
    if (keys != Py_None && (*extra = nat_str_of(keys, keep, "extra keys")) == NULL) return -1;
    return 0;
}

/* router: None, or a list of n (tuple | None), one per block in order. */
static int routers_of(PyObject *router, size_t n, routerset *r)
{
    memset(r, 0, sizeof *r);
    if (router == Py_None) return 0;
    if (!PyList_Check(router) || (size_t)PyList_GET_SIZE(router) != n) {
        PyErr_SetString(PyExc_TypeError, "router must be a list of one entry per block");
        return -1;
    }
    size_t n_tok = 0;
    for (size_t i = 0; i < n; i++) { /* sizes first: one allocation of each */
        PyObject *t = PyList_GET_ITEM(router, (Py_ssize_t)i);
        if (t == Py_None) continue;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5 ||
            !PyTuple_Check(PyTuple_GET_ITEM(t, 1))) {
            PyErr_SetString(PyExc_TypeError, "a router entry must be a 5-tuple or None");
            return -1;
        }
        n_tok += (size_t)PyTuple_GET_SIZE(PyTuple_GET_ITEM(t, 1));
    }
    if ((r->keep = PyList_New(0)) == NULL || (r->rb = nat_alloc(n, sizeof *r->rb)) == NULL ||
        (r->tokens = nat_alloc(n_tok, sizeof *r->tokens)) == NULL ||
        (r->extra = nat_alloc(n, sizeof *r->extra)) == NULL)
        return -1;
    n_tok = 0;
    for (size_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(router, (Py_ssize_t)i);
        if (t != Py_None && router_one(t, &r->rb[i], r->tokens, &n_tok, &r->extra[i], r->keep) != 0)
            return -1;
    }
    return 0;
}

/* deposit(blocks, flags, hints, router) / deliver(blocks, request_id) -> op handle */
static PyObject *submit_blocks(Instance *self, PyObject *args, int deliver)
{
    PyObject *mapping, *extra = Py_None, *hints_o = Py_None, *router = Py_None;
    kvcr_deposit_options opts = {.version = KVCR_DEPOSIT_OPTIONS_VERSION};
    if (!live(self) || !PyArg_ParseTuple(args, "O|OOO", &mapping, &extra, &hints_o, &router) ||
        hints_of(hints_o, &opts.hints, &opts.hints_len) != 0)
        return NULL;
    unsigned flags = 0;
    const char *rid = NULL;
    if (deliver) {
        if (nat_request_id(extra, &rid) != 0) return NULL;
    } else if (extra != Py_None) {
        flags = (unsigned)PyLong_AsUnsignedLong(extra);
        if (PyErr_Occurred()) return NULL;
    }
    blockset b;
    routerset rs = {0};
    if (nat_blocks_of(mapping, &b) != 0 || routers_of(router, b.n, &rs) != 0) {
        nat_blocks_free(&b);
        routers_free(&rs);
        return NULL;
    }
    opts.router = rs.rb;
    opts.router_extra = rs.rb ? rs.extra : NULL;
    kvcr_op_handle op = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    opts.flags = flags;
    rc = deliver ? kvcr_deliver(self->kv, b.blocks, b.n, rid, &op)
                 : kvcr_deposit_ex(self->kv, b.blocks, b.n, &opts, &op);
    Py_END_ALLOW_THREADS
    self->calls--;
    nat_blocks_free(&b);
    routers_free(&rs);
    return rc == 0 ? PyLong_FromUnsignedLongLong(op) : nat_raise(rc);
}

static PyObject *Instance_deposit(Instance *self, PyObject *args)
{
    return submit_blocks(self, args, 0);
}

static PyObject *Instance_deliver(Instance *self, PyObject *args)
{
    return submit_blocks(self, args, 1);
}

/* fetch(keys, request_id, layout | None, hints | None, flags) -> op handle */
static PyObject *Instance_fetch(Instance *self, PyObject *args)
{
    PyObject *seq, *rid_o = Py_None, *layout = Py_None, *hints_o = Py_None;
    kvcr_fetch_options opts = {.version = KVCR_FETCH_OPTIONS_VERSION};
    if (!live(self) ||
        !PyArg_ParseTuple(args, "O|OOOI", &seq, &rid_o, &layout, &hints_o, &opts.flags) ||
        hints_of(hints_o, &opts.hints, &opts.hints_len) != 0)
        return NULL;
    const char *rid;
    if (nat_request_id(rid_o, &rid) != 0) return NULL;
    PyObject *lt = NULL, *keep = PyList_New(0), *result = NULL;
    const char **names = NULL;
    Py_ssize_t n_names = 0;
    keyset k;
    if (nat_keys_of(seq, &k) != 0 || keep == NULL) goto out;
    if (layout != Py_None) { /* never NULL then: libkvcr refuses [] as naming no pool */
        if ((lt = PySequence_Tuple(layout)) == NULL) goto out;
        n_names = PyTuple_GET_SIZE(lt);
        if ((names = nat_alloc((size_t)n_names, sizeof *names)) == NULL) goto out;
        for (Py_ssize_t i = 0; i < n_names; i++)
            if ((names[i] = nat_str_of(PyTuple_GET_ITEM(lt, i), keep, "expected_layout entry")) ==
                NULL)
                goto out;
    }
    kvcr_op_handle op = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_fetch_ex(self->kv, k.keys, (size_t)k.n, rid, names, (size_t)n_names, &opts, &op);
    Py_END_ALLOW_THREADS
    self->calls--;
    result = rc == 0 ? PyLong_FromUnsignedLongLong(op) : nat_raise(rc);
out:
    nat_keys_free(&k);
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
    kvcr_release_handle *h = nat_alloc((size_t)n, sizeof *h);
    bool *rel = nat_alloc((size_t)n, sizeof *rel);
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
        list = rc == 0 ? PyList_New(n) : nat_raise(rc);
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
    if (seq != Py_None && nat_keys_of(seq, &k) != 0) {
        nat_keys_free(&k);
        return NULL;
    }
    size_t aborted = 0;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_abort(self->kv, op, seq != Py_None ? k.keys : NULL, (size_t)k.n, &aborted);
    Py_END_ALLOW_THREADS
    self->calls--;
    nat_keys_free(&k);
    if (rc == KVCR_ENOENT) Py_RETURN_FALSE;
    if (rc != 0) return nat_raise(rc);
    return PyBool_FromLong(aborted > 0);
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
    if (rc != 0) return nat_raise(rc);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *entries = PyDict_New();
        for (size_t j = 0; entries && j < res[i].n_entries; j++) {
            const kvcr_entry_result *e = &res[i].entries[j];
            PyObject *key = PyBytes_FromStringAndSize((const char *)e->key.data,
                                                      (Py_ssize_t)e->key.len);
            PyObject *value = key ? nat_entry(self, e) : NULL;
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
    if (rc != 0) return nat_raise(rc);
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
        prom = r == 0 ? PyUnicode_FromStringAndSize(text, (Py_ssize_t)len) : nat_raise(r);
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
    if (rc != 0) return nat_raise(rc);
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
        nat_request_id(rid_o, &rid) != 0)
        return NULL;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_submit_hint(self->kv, rid, json, (size_t)len);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return nat_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *Instance_discard_hint(Instance *self, PyObject *rid_o)
{
    const char *rid;
    if (!live(self) || nat_request_id(rid_o, &rid) != 0) return NULL;
    if (rid == NULL) Py_RETURN_NONE;
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_discard_hint(self->kv, rid);
    Py_END_ALLOW_THREADS
    self->calls--;
    if (rc != 0) return nat_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *Instance_align_sequence(Instance *self, PyObject *args)
{
    PyObject *keys_o;
    int now = 0;
    if (!live(self) || !PyArg_ParseTuple(args, "O|p", &keys_o, &now)) return NULL;
    keyset k;
    if (nat_keys_of(keys_o, &k) != 0) {
        nat_keys_free(&k);
        return NULL;
    }
    int rc;
    self->calls++;
    Py_BEGIN_ALLOW_THREADS
    rc = kvcr_align_sequence(self->kv, k.keys, (size_t)k.n, now != 0);
    Py_END_ALLOW_THREADS
    self->calls--;
    nat_keys_free(&k);
    if (rc != 0) return nat_raise(rc);
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
    if (!live(self) || nat_request_id(rid_o, &rid) != 0) return NULL;
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
    {"deposit", (PyCFunction)Instance_deposit, METH_VARARGS,
     "deposit(blocks, flags=0, hints=None) -> op"},
    {"deliver", (PyCFunction)Instance_deliver, METH_VARARGS,
     "deliver(blocks, request_id=None) -> op"},
    {"fetch", (PyCFunction)Instance_fetch, METH_VARARGS,
     "fetch(keys, request_id=None, layout=None, hints=None) -> op"},
    {"release", (PyCFunction)Instance_release, METH_O, "release(handles) -> [(handle, bool)]"},
    {"abort", (PyCFunction)Instance_abort, METH_VARARGS, "abort(op, keys=None) -> bool"},
    {"poll", (PyCFunction)Instance_poll, METH_NOARGS, "poll() -> [(op, {key: entry})]"},
    {"stats", (PyCFunction)Instance_stats, METH_VARARGS, "stats(render=False) -> dict | None"},
    {"close", (PyCFunction)Instance_close, METH_NOARGS, "close()"},
    {"submit_hint", (PyCFunction)Instance_submit_hint, METH_VARARGS,
     "submit_hint(request_id, json_bytes)"},
    {"discard_hint", (PyCFunction)Instance_discard_hint, METH_O, "discard_hint(request_id)"},
    {"align_sequence", (PyCFunction)Instance_align_sequence, METH_VARARGS,
     "align_sequence(keys, use_current_time=False)"},
    {"hint", (PyCFunction)Instance_hint, METH_O, "hint(request_id) -> (source, hashes, failed)"},
    {"fd", (PyCFunction)Instance_fd, METH_NOARGS, "fd() -> readable while poll has work"},
    {"endpoint", (PyCFunction)Instance_endpoint, METH_NOARGS,
     "endpoint() -> the control endpoint, or None without the remote tier"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject nat_instance_type = {
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
