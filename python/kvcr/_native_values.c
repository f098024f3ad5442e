/* kvcr._native: keys, blocks and request ids from Python for libkvcr's
 * calls, and query results and entry results back (see _native.h). Results
 * are built from objects made once: the (QueryStatus, CacheTier) pairs and
 * the OpEntryResult of every (status, reason) that carries no handle or
 * slots are cached, so query and poll allocate little. The G3 tier needs
 * nothing of its own here: its query results (FETCHABLE, G3) and entry
 * reasons (CORRUPT) use the same tables. All with the GIL held. */
#include "_native.h"

#include <stdlib.h>
#include <string.h>

#define N_ENTRY 3   /* kvcr_entry_status */
#define N_REASON 32 /* cached kvcr_reason values; larger ones are not cached */

static PyObject *g_pair[N_STATUS][N_TIER];   /* (status, tier) result tuples */
static PyObject *g_entry[N_ENTRY][N_REASON]; /* shared plain OpEntryResults */
static PyObject *s_end_point, *s_label, *s_index; /* MemoryRef's attribute names */

int nat_values_init(void)
{
    s_end_point = PyUnicode_InternFromString("end_point_name");
    s_label = PyUnicode_InternFromString("label");
    s_index = PyUnicode_InternFromString("element_index");
    return s_end_point && s_label && s_index ? 0 : -1;
}

/* ---- keys --------------------------------------------------------------- */

void nat_keys_free(keyset *k)
{
    if (k->keys != k->small) free(k->keys);
    Py_CLEAR(k->held);
}

int nat_keys_of(PyObject *seq, keyset *k)
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
    if (k->n > NAT_SMALL && (k->keys = nat_alloc((size_t)k->n, sizeof *k->keys)) == NULL) return -1;
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

int nat_request_id(PyObject *o, const char **out)
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

void nat_blocks_free(blockset *b)
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

int nat_blocks_of(PyObject *mapping, blockset *b)
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
        Py_ssize_t m = PyList_GET_SIZE(value); /* 0: libkvcr names the rule */
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
    if ((b->n > 16 && (b->blocks = nat_alloc(b->n, sizeof *b->blocks)) == NULL) ||
        (total > 32 && (b->refs = nat_alloc(total, sizeof *b->refs)) == NULL) ||
        (b->n + 2 * total > 80 && (b->held = nat_alloc(b->n + 2 * total, sizeof *b->held)) == NULL))
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

/* ---- results -------------------------------------------------------------- */

PyObject *nat_query_pair(kvcr_query_result q)
{
    unsigned s = (unsigned)q.status, t = (unsigned)q.tier;
    if (s >= N_STATUS || t >= N_TIER) return PyErr_Format(PyExc_RuntimeError,
                                                          "unknown query result %u/%u", s, t);
    if (g_pair[s][t] == NULL) g_pair[s][t] = PyTuple_Pack(2, g_status[s], g_tier[t]);
    return Py_XNewRef(g_pair[s][t]);
}

PyObject *nat_entry(Instance *self, const kvcr_entry_result *e)
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
