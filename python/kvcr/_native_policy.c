/* kvcr._native: a Python policy as libkvcr's kvcr_policy_ops (see
 * _native.h). The hooks call the adapter kvcr/api.py makes (_PolicyAdapter:
 * tuples in, ints out) and run under libkvcr's instance lock on the thread
 * of the call that needs them, taking the GIL themselves. A hook that
 * raises or answers something invalid reports failure (the adapter has
 * logged why); libkvcr then applies its fallback. */
#include "_native.h"

#include <stdio.h>

static PyObject *meta_tuple(const kvcr_block_meta *m)
{
    PyObject *last = m->last_access >= 0 ? PyFloat_FromDouble(m->last_access) : Py_NewRef(Py_None);
    if (last == NULL) return NULL;
    return Py_BuildValue("(y#KKNILzKKKK)", (const char *)m->key.data, (Py_ssize_t)m->key.len,
                         (unsigned long long)m->size_bytes, (unsigned long long)m->access_count,
                         last, m->resident_tiers, (long long)m->position, m->tenant,
                         (unsigned long long)m->tenant_dram_slots,
                         (unsigned long long)m->tenant_dram_quota,
                         (unsigned long long)m->tenant_g3_slots,
                         (unsigned long long)m->tenant_g3_quota);
}

/* policy.<name>(meta, *extra) with a new reference, or NULL (error cleared)
 * when the hook failed; the Python adapter has logged why. */
static PyObject *call_policy(Instance *self, PyObject *name, const kvcr_block_meta *m,
                             PyObject *extra)
{
    PyObject *policy = nat_grab(self->policy), *res = NULL;
    PyObject *meta = policy && extra ? meta_tuple(m) : NULL;
    if (meta != NULL) {
        PyObject *args[6] = {policy, meta, NULL, NULL, NULL, NULL};
        Py_ssize_t n = 2;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(extra) && n < 6; i++)
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

int nat_policy_init(void)
{
    s_ingest = PyUnicode_InternFromString("_decide_ingest");
    s_score = PyUnicode_InternFromString("_eviction_score");
    s_eviction = PyUnicode_InternFromString("_decide_eviction");
    s_on_ingest = PyUnicode_InternFromString("_on_ingest");
    s_on_remove = PyUnicode_InternFromString("_on_remove");
    s_recovery = PyUnicode_InternFromString("_decide_recovery");
    return s_ingest && s_score && s_eviction && s_on_ingest && s_on_remove && s_recovery ? 0
                                                                                           : -1;
}

/* decide_ingest with the call's hints, each JSON text as a str or None
 * (the adapter decodes them). */
static int hook_ingest(void *ud, const kvcr_block_meta *m, kvcr_tier source, bool required,
                       const kvcr_hints *h, kvcr_placement *out)
{
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *extra = Py_BuildValue("(iOs#s#)", (int)source, required ? Py_True : Py_False,
                                    h->framework, (Py_ssize_t)h->framework_len, h->router,
                                    (Py_ssize_t)h->router_len);
    int rc = placement_from(call_policy(ud, s_ingest, m, extra), out);
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
int nat_policy_set(Instance *self, PyObject *policy, kvcr_config *cfg)
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
        .decide_ingest_hints = hook_ingest,
        .eviction_score = hook_score,
        .decide_eviction = hook_eviction,
        /* The optional hooks cost a GIL round trip: only when overridden. */
        .on_ingest = has_flag(policy, "_wants_on_ingest") ? hook_on_ingest : NULL,
        .on_remove = has_flag(policy, "_wants_on_remove") ? hook_on_remove : NULL,
        .decide_recovery = has_flag(policy, "_wants_recovery") ? hook_recovery : NULL,
        .flags = has_flag(policy, "_tenant_quotas") ? KVCR_POLICY_TENANT_QUOTAS : 0,
    };
    self->policy = Py_NewRef(policy);
    cfg->policy = &self->ops;
    cfg->policy_ud = self;
    return 0;
}
