/* kvcr._native: libkvcr's callbacks into the Python objects kvcr/api.py
 * makes (see _native.h): the inventory sink, the capacity callback, the log
 * sink, and the peer-to-peer tier's key_hash (under the instance lock, like
 * policy hooks), pin bridge (request / poll / cancel / release: libkvcr's
 * u64 request and pin ids on one side, the framework's PinRequestId /
 * PinHandle on the other) and resilience sink. All but key_hash run inside
 * kvcr_poll / kvcr_close with no lock held; kvcr_pin_complete, which takes
 * the lock, is called with the GIL released. Each takes the GIL itself. No
 * Python exception crosses into libkvcr: each callback clears what it
 * raised (the Python side has logged or recorded it already). */
#include "_native.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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
    PyObject *fn = nat_grab(self->inventory), *args = NULL;
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
    PyObject *fn = nat_grab(self->capacity), *args = NULL;
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
    PyObject *fn = nat_grab(self->log);
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
    PyObject *fn = nat_grab(self->log);
    if (fn != NULL) {
        Py_XDECREF(PyObject_CallFunction(fn, "is", (int)level, buf));
        Py_DECREF(fn);
    }
    PyErr_Clear();
}

static PyObject *s_request, *s_poll, *s_cancel, *s_release;

int nat_callbacks_init(void)
{
    s_request = PyUnicode_InternFromString("request");
    s_poll = PyUnicode_InternFromString("poll");
    s_cancel = PyUnicode_InternFromString("cancel");
    s_release = PyUnicode_InternFromString("release");
    return s_request && s_poll && s_cancel && s_release ? 0 : -1;
}

/* Under the instance lock: only the adapter's pure decode runs here. */
static int cb_key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = nat_grab(self->key_hash), *res = NULL;
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
    PyObject *bridge = nat_grab(self->pins), *res = NULL;
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

static void cb_cancel_pin(void *ud, uint64_t req)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = nat_grab(self->pins);
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
    PyObject *bridge = nat_grab(self->pins), *res = NULL;
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
    PyObject *fn = nat_grab(self->resilience), *res = NULL;
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
        bad = nat_blocks_of(avail, &b) != 0;
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
    if (have) nat_blocks_free(&b);
}

static void cb_poll_pins(void *ud)
{
    Instance *self = ud;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *bridge = nat_grab(self->pins);
    PyObject *list = bridge ? PyObject_CallMethodNoArgs(bridge, s_poll) : NULL;
    if (list != NULL && PyList_Check(list))
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
            complete_pin(self, PyList_GET_ITEM(list, i)); /* the list holds the items */
    Py_XDECREF(list);
    Py_XDECREF(bridge);
    PyErr_Clear();
    PyGILState_Release(g);
}

kvcr_callbacks nat_callbacks_of(Instance *self)
{
    return (kvcr_callbacks){
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
}
