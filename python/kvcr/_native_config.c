/* kvcr._native: Instance(...)'s configuration arguments as a kvcr_config
 * (see _native.h), and options(), the rows of libkvcr's options table
 * (kvcr/options.h). kvcr/config.py has checked their types and that each
 * value fits its C field; libkvcr checks the values in kvcr_create, and its
 * message is the exception's. Every scalar option arrives by its path in
 * one dict (set_options); the arrays as arguments of their own: G3 paths
 * and CURVE keys as str sequences, pool layouts, pools, regions and
 * tenants as sequences of dicts by their C struct's field names
 * (record_of). Nothing is passed by position. With the GIL held. */
#include "_native.h"

#include "kvcr/options.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fields of one record of an array (a dict by its C struct's field
 * names, every one required) as PyArg_ParseTupleAndKeywords parses
 * keywords: never by position. */
static int record_of(PyObject *d, const char *what, const char *format, char **names, ...)
{
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "a %s must be a dict by field name, not %.100s", what,
                     Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *none = PyTuple_New(0);
    if (none == NULL) return -1;
    va_list ap;
    va_start(ap, names);
    int ok = PyArg_VaParseTupleAndKeywords(none, d, format, names, ap);
    va_end(ap);
    Py_DECREF(none);
    return ok ? 0 : -1;
}

/* The records of a sequence, *out an allocation of *n (the caller frees
 * it); each filled by one(record, &(*out)[i], keep). */
static int parse_array(PyObject *seq, void **out, size_t *n, size_t size, PyObject *keep,
                       int (*one)(PyObject *, void *, PyObject *))
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = nat_alloc(*n, size)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++)
        rc = one(PyTuple_GET_ITEM(t, (Py_ssize_t)i), (char *)*out + i * size, keep);
    Py_DECREF(t);
    return rc;
}

/* {"name", "block_size"}: a kvcr_pool_layout */
static int layout_of(PyObject *d, void *out, PyObject *keep)
{
    static char *names[] = {"name", "block_size", NULL};
    kvcr_pool_layout *l = out;
    PyObject *name;
    unsigned long long bs;
    if (record_of(d, "pool layout", "OK", names, &name, &bs) != 0 ||
        (l->name = nat_str_of(name, keep, "pool name")) == NULL)
        return -1;
    l->block_size = (size_t)bs;
    return 0;
}

/* A record of a name and two integers (names: their fields), the name
 * held by keep: a pool or a tenant. */
static int named_of(PyObject *d, const char *what, char **names, PyObject *keep,
                    const char **name, unsigned long long *a, unsigned long long *b)
{
    PyObject *n;
    char field[64]; /* "tenant name", for a TypeError */
    snprintf(field, sizeof field, "%s %s", what, names[0]);
    if (record_of(d, what, "OKK", names, &n, a, b) != 0) return -1;
    return (*name = nat_str_of(n, keep, field)) == NULL ? -1 : 0;
}

/* {"name", "addr", "size"}: a kvcr_dram_pool */
static int pool_of(PyObject *d, void *out, PyObject *keep)
{
    static char *names[] = {"name", "addr", "size", NULL};
    kvcr_dram_pool *p = out;
    unsigned long long addr, size;
    if (named_of(d, "local DRAM pool", names, keep, &p->name, &addr, &size) != 0) return -1;
    p->addr = (void *)(uintptr_t)addr;
    p->size = (size_t)size;
    return 0;
}

/* {"addr", "element_size", "count", "stride", "label", "mem_type",
 * "device_id"}: a kvcr_region */
static int region_of(PyObject *d, void *out, PyObject *keep)
{
    static char *names[] = {"addr", "element_size", "count", "stride", "label", "mem_type",
                            "device_id", NULL};
    PyObject *label;
    unsigned long long addr, size, count, stride;
    int mem_type, device;
    const char *l;
    if (record_of(d, "framework region", "KKKKOii", names, &addr, &size, &count, &stride,
                  &label, &mem_type, &device) != 0 ||
        (l = nat_str_of(label, keep, "region label")) == NULL)
        return -1;
    *(kvcr_region *)out = (kvcr_region){(void *)(uintptr_t)addr, (size_t)size, (size_t)count,
                                        (size_t)stride, l, (kvcr_mem_type)mem_type, device};
    return 0;
}

/* {"name", "dram_slots", "g3_slots"}: a kvcr_tenant (libkvcr checks the rules) */
static int tenant_of(PyObject *d, void *out, PyObject *keep)
{
    static char *names[] = {"name", "dram_slots", "g3_slots", NULL};
    kvcr_tenant *e = out;
    unsigned long long dram, g3;
    if (named_of(d, "tenant", names, keep, &e->name, &dram, &g3) != 0) return -1;
    e->dram_slots = dram;
    e->g3_slots = g3;
    return 0;
}

/* A str list for a kvcr_config array (G3 paths, CURVE allowed keys), the
 * strings held by keep. *out is an allocation that the caller frees. */
static int parse_strs(PyObject *seq, const char ***out, size_t *n, PyObject *keep,
                      const char *what)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = nat_alloc(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++)
        if (((*out)[i] = nat_str_of(PyTuple_GET_ITEM(t, (Py_ssize_t)i), keep, what)) == NULL)
            rc = -1;
    Py_DECREF(t);
    return rc;
}

/* The field of one row of the options table (kvcr/options.h) set from a
 * Python value: bool, int (within the C type: kvcr/config.py checked it;
 * else OverflowError), float, str or None (a NULL string). */
static int set_option(kvcr_config *cfg, const kvcr_option *o, PyObject *v, PyObject *keep)
{
    char *field = (char *)cfg + o->offset;
    if (o->type == KVCR_OPT_STR) {
        const char *s = v == Py_None ? NULL : nat_str_of(v, keep, o->path);
        if (s == NULL && v != Py_None) return -1;
        memcpy(field, &s, sizeof s);
        return 0;
    }
    if (o->type == KVCR_OPT_F64) {
        double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        memcpy(field, &d, sizeof d);
        return 0;
    }
    int truth = o->type == KVCR_OPT_BOOL ? PyObject_IsTrue(v) : 0;
    unsigned long long u = o->type == KVCR_OPT_BOOL ? (unsigned long long)truth
                                                    : PyLong_AsUnsignedLongLong(v);
    if (truth < 0 || PyErr_Occurred()) return -1;
    if (kvcr__option_set(cfg, o, u) != 0) {
        PyErr_SetString(PyExc_OverflowError, kvcr_last_error());
        return -1;
    }
    return 0;
}

/* options: {path: value} of rows of the options table, by name (libkvcr
 * checks the values); a path that is no row is a KeyError. */
static int set_options(kvcr_config *cfg, PyObject *options, PyObject *keep)
{
    if (!PyDict_Check(options)) {
        PyErr_SetString(PyExc_TypeError, "options must be a dict {path: value}");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(options, &pos, &key, &value)) {
        const char *path = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        const kvcr_option *o = path ? kvcr__option(path) : NULL;
        if (o == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no option %R", key);
            return -1;
        }
        if (set_option(cfg, o, value, keep) != 0) return -1;
    }
    return 0;
}

/* A row's value as Python: bool, int, float, str or None. */
static PyObject *option_value(const kvcr_option *o, kvcr_option_value v)
{
    switch (o->type) {
    case KVCR_OPT_BOOL: return PyBool_FromLong(v.u != 0);
    case KVCR_OPT_F64: return PyFloat_FromDouble(v.d);
    case KVCR_OPT_STR: return v.s ? PyUnicode_FromString(v.s) : Py_NewRef(Py_None);
    default: return PyLong_FromUnsignedLongLong(v.u);
    }
}

PyObject *nat_options(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    static const char *const types[] = {"bool", "u16", "u32", "u64", "f64", "str"};
    size_t n;
    const kvcr_option *rows = kvcr__options(&n);
    PyObject *out = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; out != NULL && i < n; i++) {
        const kvcr_option *o = &rows[i];
        bool ranged = o->type != KVCR_OPT_STR && o->type != KVCR_OPT_BOOL;
        PyObject *def = option_value(o, o->def);
        PyObject *lo = ranged ? option_value(o, o->min) : Py_NewRef(Py_None);
        PyObject *hi = ranged ? option_value(o, o->max) : Py_NewRef(Py_None);
        PyObject *row = def && lo && hi
            ? Py_BuildValue("{sssssssOsOsOsssIszss}", "path", o->path, "label", o->label,
                            "type", types[o->type], "default", def, "min", lo, "max", hi,
                            "rule", o->rule, "since", o->since, "py", o->py, "doc", o->doc)
            : NULL;
        Py_XDECREF(def);
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        if (row == NULL) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    return out;
}

int nat_config_build(const nat_config_args *a, nat_config *c)
{
    memset(c, 0, sizeof *c);
    kvcr_config *cfg = &c->cfg;
    kvcr_config_init(cfg);
    size_t n_pl = 0, n_dp = 0, n_rg = 0, n_keys = 0;
    if ((c->keep = PyList_New(0)) == NULL ||
        parse_array(a->layouts, (void **)&c->layouts, &n_pl, sizeof *c->layouts, c->keep,
                    layout_of) != 0 ||
        (a->dram != Py_None && parse_array(a->dram, (void **)&c->pools, &n_dp,
                                           sizeof *c->pools, c->keep, pool_of) != 0) ||
        parse_array(a->regions, (void **)&c->regions, &n_rg, sizeof *c->regions, c->keep,
                    region_of) != 0 ||
        set_options(cfg, a->options, c->keep) != 0)
        return -1;
    cfg->agent_name = a->agent;
    cfg->pool_layouts = c->layouts;
    cfg->n_pool_layouts = n_pl;
    cfg->local_dram = n_dp ? c->pools : NULL;
    cfg->n_local_dram = n_dp;
    cfg->framework_regions = n_rg ? c->regions : NULL;
    cfg->n_framework_regions = n_rg;
    /* A non-NULL array even when empty: libkvcr then says "G3 requires at
     * least one file path" instead of taking NULL/0 for "no G3". */
    if (a->g3_paths != Py_None &&
        parse_strs(a->g3_paths, &c->g3_paths, &cfg->g3.n_paths, c->keep, "G3 path") != 0)
        return -1;
    cfg->g3.paths = c->g3_paths;
    if (a->curve_keys != Py_None &&
        parse_strs(a->curve_keys, &c->curve_keys, &n_keys, c->keep, "curve allowed key") != 0)
        return -1;
    cfg->remote.curve.allowed_keys = n_keys ? c->curve_keys : NULL; /* none: not given */
    cfg->remote.curve.n_allowed_keys = n_keys;
    if (a->tenants != Py_None &&
        parse_array(a->tenants, (void **)&c->tenants, &cfg->n_tenants, sizeof *c->tenants,
                    c->keep, tenant_of) != 0)
        return -1;
    cfg->tenants = cfg->n_tenants ? c->tenants : NULL;
    return 0;
}

void nat_config_free(nat_config *c)
{
    free(c->layouts);
    free(c->pools);
    free(c->regions);
    free(c->g3_paths);
    free(c->curve_keys);
    free(c->tenants);
    Py_CLEAR(c->keep);
}
