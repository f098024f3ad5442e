/* kvcr._native: Instance(...)'s configuration arguments as a kvcr_config
 * (see _native.h). kvcr/config.py has checked their types and that each
 * value fits its C field; libkvcr checks the values in kvcr_create, and its
 * message is the exception's. The G3 tier's options arrive as one tuple
 * (parse_g3); guard mode's as one tuple (socket path, guard_index, digest)
 * that fills kvcr_config.guard, and kvcr_create then claims the pool group
 * itself. With the GIL held. */
#include "_native.h"

#include <stdlib.h>
#include <string.h>

static int parse_layouts(PyObject *seq, kvcr_pool_layout **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = nat_alloc(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *name;
        unsigned long long bs;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OK", &name, &bs) ||
            ((*out)[i].name = nat_str_of(name, keep, "pool name")) == NULL)
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
    int rc = (*out = nat_alloc(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *name;
        unsigned long long addr, size;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OKK", &name, &addr, &size) ||
            ((*out)[i].name = nat_str_of(name, keep, "pool name")) == NULL) {
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
    int rc = (*out = nat_alloc(*n, sizeof **out)) ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *label;
        unsigned long long addr, size, count, stride;
        int mem_type, device;
        const char *l = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "KKKKOii", &addr, &size, &count, &stride,
                              &label, &mem_type, &device) ||
            (l = nat_str_of(label, keep, "region label")) == NULL) {
            rc = -1;
        } else {
            (*out)[i] = (kvcr_region){(void *)(uintptr_t)addr, (size_t)size, (size_t)count,
                                      (size_t)stride, l, (kvcr_mem_type)mem_type, device};
        }
    }
    Py_DECREF(t);
    return rc;
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
    if ((*paths = nat_alloc(n, sizeof **paths)) == NULL) return -1;
    for (size_t i = 0; i < n; i++)
        if (((*paths)[i] = nat_str_of(PyTuple_GET_ITEM(seq, (Py_ssize_t)i), keep, "G3 path")) == NULL)
            return -1;
    if ((out->backend = nat_str_of(backend, keep, "G3 backend")) == NULL) return -1;
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
    if ((*keys = nat_alloc(n, sizeof **keys)) == NULL) return -1;
    for (size_t i = 0; i < n; i++)
        if (((*keys)[i] = nat_str_of(PyTuple_GET_ITEM(allowed, (Py_ssize_t)i), keep,
                                 "curve allowed key")) == NULL)
            return -1;
    if ((secret != Py_None &&
         (out->secret_key = nat_str_of(secret, keep, "curve secret key")) == NULL) ||
        (pub != Py_None && (out->public_key = nat_str_of(pub, keep, "curve public key")) == NULL))
        return -1;
    out->allowed_keys = n ? *keys : NULL; /* libkvcr: keys without a secret are refused */
    out->n_allowed_keys = n;
    return 0;
}

/* guard: (service socket path, guard_index, compatibility digest) */
static int parse_guard(PyObject *guard, kvcr_guard_options *out, PyObject *keep)
{
    PyObject *path, *digest;
    unsigned int index;
    if (!PyArg_ParseTuple(guard, "OIO", &path, &index, &digest) ||
        (out->service_socket_path = nat_str_of(path, keep, "guard socket path")) == NULL ||
        (out->compatibility_digest = nat_str_of(digest, keep, "guard digest")) == NULL)
        return -1;
    out->guard_index = index;
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
        (out->backend = nat_str_of(backend, keep, "remote backend")) == NULL)
        return -1;
    out->eager_ctrl_connect = eager != 0;
    out->opportunistic_query = opportunistic != 0;
    out->metadata_retry_interval_ms = retry_ms;
    if (endpoint == Py_None) return 0;
    if (!PyArg_ParseTuple(endpoint, "OIO", &host, &port, &adv) ||
        (out->control_host = nat_str_of(host, keep, "control host")) == NULL ||
        (out->advertise_host = nat_str_of(adv, keep, "advertise host")) == NULL)
        return -1;
    out->control_port = (uint16_t)port;
    out->enabled = true;
    return 0;
}

/* kv_events: (endpoint, replay or None, topic, dp_rank, buffer_batches,
 * max_batch_events, batch_interval_ms, max_queued_batches, positional,
 * medium_dram, medium_g3) (libkvcr checks the values) */
static int parse_kv_events(PyObject *t, kvcr_kv_events_options *out, PyObject *keep)
{
    PyObject *endpoint, *replay, *topic, *dram, *g3;
    int positional;
    if (!PyArg_ParseTuple(t, "OOOIIIIIpOO", &endpoint, &replay, &topic, &out->dp_rank,
                          &out->buffer_batches, &out->max_batch_events,
                          &out->batch_interval_ms, &out->max_queued_batches, &positional,
                          &dram, &g3) ||
        (out->endpoint = nat_str_of(endpoint, keep, "kv_events.endpoint")) == NULL ||
        (out->topic = nat_str_of(topic, keep, "kv_events.topic")) == NULL ||
        (out->medium_dram = nat_str_of(dram, keep, "kv_events.medium_dram")) == NULL ||
        (out->medium_g3 = nat_str_of(g3, keep, "kv_events.medium_g3")) == NULL)
        return -1;
    out->legacy_positional = positional != 0;
    if (replay != Py_None &&
        (out->replay_endpoint = nat_str_of(replay, keep, "kv_events.replay_endpoint")) == NULL)
        return -1;
    return 0;
}

/* tenants: ((name, dram_slots, g3_slots), ...) (libkvcr checks the rules) */
static int parse_tenants(PyObject *seq, kvcr_tenant **out, size_t *n, PyObject *keep)
{
    PyObject *t = PySequence_Tuple(seq);
    if (t == NULL) return -1;
    *n = (size_t)PyTuple_GET_SIZE(t);
    int rc = (*out = nat_alloc(*n, sizeof **out)) == NULL ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < *n; i++) {
        PyObject *name;
        kvcr_tenant *e = &(*out)[i];
        unsigned long long dram, g3;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(t, i), "OKK", &name, &dram, &g3) ||
            (e->name = nat_str_of(name, keep, "tenant name")) == NULL)
            rc = -1;
        e->dram_slots = dram;
        e->g3_slots = g3;
    }
    Py_DECREF(t);
    return rc;
}

int nat_config_build(const nat_config_args *a, nat_config *c)
{
    memset(c, 0, sizeof *c);
    kvcr_config *cfg = &c->cfg;
    kvcr_config_init(cfg);
    size_t n_pl = 0, n_dp = 0, n_rg = 0;
    if ((c->keep = PyList_New(0)) == NULL ||
        parse_layouts(a->layouts, &c->layouts, &n_pl, c->keep) ||
        parse_pools(a->dram, &c->pools, &n_dp, c->keep) ||
        parse_regions(a->regions, &c->regions, &n_rg, c->keep))
        return -1;
    cfg->agent_name = a->agent;
    cfg->pool_layouts = c->layouts;
    cfg->n_pool_layouts = n_pl;
    cfg->local_dram = n_dp ? c->pools : NULL;
    cfg->n_local_dram = n_dp;
    cfg->local_dram_backend = a->local_backend;
    cfg->framework_regions = n_rg ? c->regions : NULL;
    cfg->n_framework_regions = n_rg;
    cfg->operation_timeout_ms = a->op_ms;
    cfg->abandon_timeout_ms = a->abandon_ms;
    cfg->capacity_low_watermark_percent = a->watermark;
    cfg->enable_telemetry = a->telemetry != 0;
    cfg->copy_threads = a->threads;
    if (a->remote != Py_None && parse_remote(a->remote, &cfg->remote, &c->curve_keys, c->keep))
        return -1;
    if (a->g3 != Py_None && parse_g3(a->g3, &cfg->g3, &c->g3_paths, c->keep) != 0) return -1;
    if (a->guard != Py_None && parse_guard(a->guard, &cfg->guard, c->keep) != 0) return -1;
    if (a->kv_events != Py_None && parse_kv_events(a->kv_events, &cfg->kv_events, c->keep) != 0)
        return -1;
    if (a->tenants != Py_None &&
        parse_tenants(a->tenants, &c->tenants, &cfg->n_tenants, c->keep) != 0)
        return -1;
    cfg->tenants = cfg->n_tenants ? c->tenants : NULL;
    /* limits: the seven kvcr_limits fields in their C order, then the peer
     * table's two (libkvcr checks the ranges) */
    if (a->limits != Py_None) {
        kvcr_limits *l = &cfg->limits;
        if (!PyArg_ParseTuple(a->limits, "IIIIIIIII", &l->max_source_writes_per_peer,
                              &l->max_source_writes, &l->max_pin_requests,
                              &l->max_control_message_bytes, &l->max_hint_bytes,
                              &l->max_hinted_requests, &l->max_unpolled_operations,
                              &cfg->max_peers, &cfg->peer_idle_ms))
            return -1;
    }
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
