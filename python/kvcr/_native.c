/* kvcr._native: the CPython binding of libkvcr — the module (see
 * _native.h for its files): init() with the Python values of the C enums
 * and the KVCR service's exception types, libkvcr errors as exceptions,
 * and the helpers the other files share. With the GIL held. */
#include "_native.h"

#include <stdlib.h>

PyObject *g_status[N_STATUS];
PyObject *g_tier[N_TIER];
PyObject *g_memref_type;
/* kvcr.errors' classes by -code (NULL until init: RuntimeError). */
#define N_ERR 12
static PyObject *g_err[N_ERR];

PyObject *nat_raise_message(int rc, const char *msg)
{
    PyObject *type = rc < 0 && -rc < N_ERR && g_err[-rc] ? g_err[-rc] : PyExc_RuntimeError;
    PyErr_SetString(type, msg);
    return NULL;
}

PyObject *nat_raise(int rc)
{
    const char *msg = kvcr_last_error();
    return nat_raise_message(rc, msg == NULL || msg[0] == '\0' ? kvcr_strerror(rc) : msg);
}

int nat_ready(void)
{
    if (g_memref_type != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "kvcr._native.init() has not been called");
    return 0;
}

PyObject *nat_grab(PyObject *slot)
{
    return slot ? Py_NewRef(slot) : NULL;
}

const char *nat_str_of(PyObject *o, PyObject *keep, const char *what)
{
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        return NULL;
    }
    const char *s = PyUnicode_AsUTF8(o);
    if (s == NULL || PyList_Append(keep, o) != 0) return NULL;
    return s;
}

void *nat_alloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) PyErr_NoMemory();
    return p;
}

/* init(query_statuses, tiers, memory_ref_type, errors=None): the Python
 * values of the C enums, by C value (tiers[0] is None, for KVCR_TIER_NONE),
 * and kvcr.errors' class for each KVCR_E* code, by -code (errors[0] is
 * None; without them: RuntimeError). */
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
        if (PyTuple_GET_SIZE(errors) != N_ERR) {
            PyErr_Format(PyExc_ValueError, "init needs %d error types", N_ERR);
            return NULL;
        }
        for (Py_ssize_t i = 1; i < N_ERR; i++) {
            PyObject *t = PyTuple_GET_ITEM(errors, i);
            if (!PyType_Check(t) ||
                !PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)PyExc_Exception)) {
                PyErr_SetString(PyExc_TypeError, "error types must be exception classes");
                return NULL;
            }
        }
    }
    if (g_memref_type != NULL) Py_RETURN_NONE; /* once per process */
    for (Py_ssize_t i = 1; errors != NULL && i < N_ERR; i++)
        g_err[i] = Py_NewRef(PyTuple_GET_ITEM(errors, i));
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
     "init(query_statuses, tiers, MemoryRef, errors by -code)"},
    {"reason_name", mod_reason_name, METH_O, "reason_name(value) -> kvcr_reason_name(value)"},
    {"options", nat_options, METH_NOARGS,
     "options() -> the rows of libkvcr's options table (kvcr/options.h), as dicts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvcr._native",
                                    "CPython binding of libkvcr.", -1, module_methods};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&nat_instance_type) < 0 || nat_values_init() != 0 ||
        nat_policy_init() != 0 || nat_callbacks_init() != 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&nat_instance_type);
    if (PyModule_AddObject(m, "Instance", (PyObject *)&nat_instance_type) != 0 ||
        PyModule_AddStringConstant(m, "LIBRARY_VERSION", kvcr_version_string()) != 0 ||
        PyModule_AddIntConstant(m, "NO_EVICT", KVCR_NO_EVICT) != 0 ||
        PyModule_AddIntConstant(m, "STRICT_TENANT", KVCR_STRICT_TENANT) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
