/* Framework pins of the peer tier's source side.
 *
 * A source write whose keys only the framework holds asks for them with
 * request_pin (one pending request per key at a time, at most
 * limits.max_pin_requests pending); the framework answers with
 * kvcr_pin_complete, whose references become framework residencies
 * (fwres) backed by the pin. Pins are shared by every write that reads
 * through them and released (release_pin, retried until accepted) when the
 * last one ends. Everything here runs on the polling thread under the
 * instance lock, except the framework callbacks themselves (unlocked). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tiers/remote_int.h"

/* ---- residencies, pins and requests (locked) ------------------------------- */

fwres *pin_fwres_find(remote *r, const uint8_t *key, uint32_t len)
{
    for (fwres *f = r->fwres; f; f = f->next)
        if (f->key_len == len && memcmp(f->key, key, len) == 0) return f;
    return NULL;
}

static pin *pin_find(remote *r, uint64_t handle)
{
    for (pin *p = r->pins; p; p = p->next)
        if (p->handle == handle) return p;
    return NULL;
}

static void queue_release(remote *r, uint64_t handle)
{
    rcb *cb = calloc(1, sizeof *cb);
    if (cb == NULL) return; /* retried at the next poll */
    cb->kind = RCB_RELEASE_PIN;
    cb->id = handle;
    rcb_push(r, cb);
}

/* The last holder is gone: the pin's residencies stop serving at once and
 * the framework is asked to release it (retried until it accepts). */
static void pin_drop(remote *r, pin *p)
{
    if (p->holders > 0 || p->releasing) return;
    for (fwres **link = &r->fwres; *link;) {
        fwres *f = *link;
        if (f->pin == p) {
            *link = f->next;
            free(f->key);
            free(f->refs);
            free(f);
        } else {
            link = &f->next;
        }
    }
    p->n_keys = 0;
    p->releasing = true;
    p->release_queued = true;
    queue_release(r, p->handle);
}

static bool waits_for(const swrite *sw, uint64_t req)
{
    for (uint32_t i = 0; i < sw->n_wait; i++)
        if (sw->wait_reqs[i] == req) return true;
    return false;
}

bool pin_req_covering(remote *r, const uint8_t *key, uint32_t len, uint64_t *req)
{
    for (pin_req *q = r->pin_reqs; q; q = q->next)
        for (uint32_t i = 0; i < q->n_keys; i++)
            if (q->keys[i].len == len && memcmp(q->keys[i].data, key, len) == 0) {
                *req = q->id;
                return true;
            }
    return false;
}

bool pin_wait_add(swrite *sw, uint64_t req)
{
    if (waits_for(sw, req)) return true;
    uint64_t *w = realloc(sw->wait_reqs, (sw->n_wait + 1) * sizeof *w);
    if (w == NULL) return false;
    sw->wait_reqs = w;
    w[sw->n_wait++] = req;
    return true;
}

static void forget_wait(swrite *sw, uint64_t req)
{
    for (uint32_t i = 0; i < sw->n_wait; i++)
        if (sw->wait_reqs[i] == req) {
            sw->wait_reqs[i] = sw->wait_reqs[--sw->n_wait];
            return;
        }
}

/* Copies the keys idx[0..n) of sw into one allocation. */
static kvcr_key *copy_keys(const swrite *sw, const uint32_t *idx, uint32_t n, uint8_t **store)
{
    size_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) bytes += sw->keys[idx[i]].key_len;
    kvcr_key *keys = calloc(n, sizeof *keys);
    *store = malloc(bytes + 1);
    if (keys == NULL || *store == NULL) {
        free(keys);
        free(*store);
        return NULL;
    }
    uint8_t *at = *store;
    for (uint32_t i = 0; i < n; i++) {
        const sw_key *k = &sw->keys[idx[i]];
        memcpy(at, sw->key_bytes + k->key_off, k->key_len);
        keys[i] = (kvcr_key){at, k->key_len};
        at += k->key_len;
    }
    return keys;
}

static void pin_req_free(pin_req *q)
{
    free(q->keys);
    free(q->store);
    free(q);
}

/* A pending request leaves r->pin_reqs (already unlinked by the caller). */
static void pin_req_drop(remote *r, pin_req *q)
{
    r->n_pin_reqs--;
    pin_req_free(q);
}

/* One request_pin for the keys no pin or pending request covers. */
bool pin_request(remote *r, swrite *sw, const uint32_t *idx, uint32_t n)
{
    pin_req *q = calloc(1, sizeof *q);
    rcb *cb = calloc(1, sizeof *cb);
    uint8_t *cb_store = NULL;
    if (q) q->keys = copy_keys(sw, idx, n, &q->store);
    if (cb) cb->keys = copy_keys(sw, idx, n, &cb_store);
    if (!q || !cb || !q->keys || !cb->keys || !pin_wait_add(sw, r->next_pin_req)) {
        if (q) pin_req_free(q);
        if (cb) free(cb->keys);
        free(cb);
        free(cb_store);
        return false;
    }
    q->id = r->next_pin_req++;
    q->n_keys = n;
    q->next = r->pin_reqs;
    r->pin_reqs = q;
    r->n_pin_reqs++;
    cb->kind = RCB_REQUEST_PIN;
    cb->id = q->id;
    cb->n_keys = n;
    cb->owned = cb_store;
    rcb_push(r, cb);
    return true;
}

/* A key reads through a pinned framework residency: the write holds the
 * pin (once per pin) from now until it ends. */
void pin_bind(swrite *sw, sw_key *k, const fwres *f)
{
    if (k->pin != NULL) return;
    bool held = false;
    for (uint32_t i = 0; i < sw->n_keys && !held; i++) held = sw->keys[i].pin == f->pin;
    k->pin = f->pin;
    k->fw_refs = f->refs;
    k->n_fw = f->n_refs;
    if (!held) f->pin->holders++;
}

void pin_unhold(remote *r, swrite *sw)
{
    if (sw->pins_dropped) return;
    sw->pins_dropped = true;
    for (uint32_t i = 0; i < sw->n_keys; i++) {
        pin *p = sw->keys[i].pin;
        if (p == NULL) continue;
        bool seen = false;
        for (uint32_t j = 0; j < i && !seen; j++) seen = sw->keys[j].pin == p;
        if (seen) continue;
        p->holders--;
        pin_drop(r, p);
    }
}

void pin_cancel_orphans(remote *r)
{
    for (pin_req **link = &r->pin_reqs; *link;) {
        pin_req *q = *link;
        bool waited = false;
        for (swrite *sw = r->swrites; sw && !waited; sw = sw->next)
            waited = sw->state == SW_PINNING && waits_for(sw, q->id);
        if (waited) {
            link = &q->next;
            continue;
        }
        *link = q->next;
        rcb *cb = calloc(1, sizeof *cb);
        if (cb) cb->kind = RCB_CANCEL_PIN, cb->id = q->id, rcb_push(r, cb);
        pin_req_drop(r, q);
    }
}

static int check_pin_result(remote *r, const pin_req *q, const kvcr_block *blocks, size_t n)
{
    if (n != q->n_keys)
        return kvcr_fail(KVCR_EINVAL, "pin result for request %llu names %zu key(s), %u requested",
                         (unsigned long long)q->id, n, q->n_keys);
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        const kvcr_block *b = &blocks[i];
        bool asked = false;
        for (uint32_t j = 0; j < q->n_keys && !asked; j++)
            asked = q->keys[j].len == b->key.len && b->key.data &&
                    memcmp(q->keys[j].data, b->key.data, b->key.len) == 0;
        for (size_t j = 0; asked && j < i; j++)
            asked = !(blocks[j].key.len == b->key.len &&
                      memcmp(blocks[j].key.data, b->key.data, b->key.len) == 0);
        if (!asked)
            return kvcr_fail(KVCR_EINVAL, "pin result key %zu was not requested (or repeats)", i);
        if (b->n_refs == 0) continue;
        int rc = host_check_refs(r->kv, b->refs, b->n_refs);
        if (rc != 0) return rc;
        any = true;
    }
    if (!any) return kvcr_fail(KVCR_EINVAL, "a pin result must make at least one key available");
    return 0;
}

static bool install(remote *r, pin *p, const kvcr_block *b)
{
    fwres *f = calloc(1, sizeof *f);
    size_t label_bytes = 0;
    for (size_t j = 0; j < b->n_refs; j++) label_bytes += strlen(b->refs[j].label ? b->refs[j].label : "") + 1;
    uint8_t *key = f ? malloc(b->key.len + label_bytes) : NULL;
    kvcr_mem_ref *refs = f ? calloc(b->n_refs, sizeof *refs) : NULL;
    if (!f || !key || !refs) {
        free(f), free(key), free(refs);
        return false;
    }
    memcpy(key, b->key.data, b->key.len);
    char *labels = (char *)key + b->key.len;
    for (size_t j = 0; j < b->n_refs; j++) {
        strcpy(labels, b->refs[j].label ? b->refs[j].label : "");
        refs[j] = (kvcr_mem_ref){NULL, labels, b->refs[j].index};
        labels += strlen(labels) + 1;
    }
    *f = (fwres){r->fwres, p, key, (uint32_t)b->key.len, (uint32_t)b->n_refs, refs};
    r->fwres = f;
    p->n_keys++;
    return true;
}

static int pin_complete(remote *r, uint64_t req, uint64_t handle, const kvcr_block *blocks,
                        size_t n)
{
    pin_req **link = &r->pin_reqs;
    while (*link && (*link)->id != req) link = &(*link)->next;
    if (*link == NULL) {
        if (handle != 0) queue_release(r, handle); /* late or unknown: give it back */
        return kvcr_fail(KVCR_ENOENT, "no pending pin request %llu", (unsigned long long)req);
    }
    pin_req *q = *link;
    int rc = handle != 0 ? check_pin_result(r, q, blocks, n) : 0;
    pin *p = NULL;
    if (rc == 0 && handle != 0 && (pin_find(r, handle) != NULL || (p = calloc(1, sizeof *p)) == NULL))
        rc = p ? 0 : kvcr_fail(KVCR_EINVAL, "pin handle %llu is already in use",
                               (unsigned long long)handle);
    if (rc != 0 && handle != 0) queue_release(r, handle);
    *link = q->next;
    pin_req_drop(r, q);
    if (p != NULL) {
        p->handle = handle;
        p->next = r->pins;
        r->pins = p;
        for (size_t i = 0; i < n; i++)
            if (blocks[i].n_refs > 0 && pin_fwres_find(r, blocks[i].key.data, (uint32_t)blocks[i].key.len) == NULL)
                install(r, p, &blocks[i]);
    }
    for (swrite *sw = r->swrites; sw; sw = sw->next) {
        if (sw->state != SW_PINNING || !waits_for(sw, req)) continue;
        forget_wait(sw, req);
        for (uint32_t i = 0; p && i < sw->n_keys; i++) {
            sw_key *k = &sw->keys[i];
            fwres *f = k->local == TIER_BLOCK_NONE && k->pin == NULL
                           ? pin_fwres_find(r, sw->key_bytes + k->key_off, k->key_len) : NULL;
            if (f != NULL && f->pin == p) pin_bind(sw, k, f);
        }
        if (sw->n_wait == 0) source_resume(r, sw);
    }
    if (p != NULL) pin_drop(r, p); /* nobody held it: give it back */
    return rc;
}

int remote_pin_complete(remote *r, uint64_t req, uint64_t handle, const kvcr_block *blocks,
                        size_t n)
{
    host_lock(r->kv);
    int rc = host_closed(r->kv) ? kvcr_fail(KVCR_ECLOSED, "the instance is closed")
                                : pin_complete(r, req, handle, blocks, n);
    host_unlock(r->kv);
    return rc;
}

/* ---- callbacks (polling thread, unlocked) ---------------------------------- */

/* The framework's answer to release_pin: a pin it accepted is gone; one it
 * refused is asked again every poll (also one we never installed). */
static void released(remote *r, uint64_t handle, bool ok)
{
    host_lock(r->kv);
    pin *p = pin_find(r, handle);
    if (p == NULL && !ok && (p = calloc(1, sizeof *p)) != NULL) {
        /* A pin we never installed (late, refused): retried all the same. */
        *p = (pin){r->pins, handle, 0, true, true, false, 0};
        r->pins = p;
    }
    if (p != NULL) {
        p->release_queued = false;
        if (ok) {
            pin **link = &r->pins;
            while (*link != p) link = &(*link)->next;
            *link = p->next;
            free(p);
        } else if (!p->release_warned) {
            p->release_warned = true;
            kvcr_log(host_logger(r->kv), KVCR_LOG_WARN,
                     "release_pin(%llu) refused; retried every poll", (unsigned long long)handle);
        }
    }
    host_unlock(r->kv);
}

void pin_run_callback(remote *r, const rcb *cb)
{
    const kvcr_callbacks *c = &host_conf(r->kv)->cb;
    switch (cb->kind) {
    case RCB_REQUEST_PIN:
        if (c->request_pin(c->ud, cb->id, cb->keys, cb->n_keys) != 0) {
            kvcr_log(host_logger(r->kv), KVCR_LOG_WARN, "request_pin failed for request %llu",
                     (unsigned long long)cb->id);
            remote_pin_complete(r, cb->id, 0, NULL, 0);
        }
        break;
    case RCB_CANCEL_PIN:
        if (c->cancel_pin_request) c->cancel_pin_request(c->ud, cb->id);
        break;
    default: /* RCB_RELEASE_PIN */
        released(r, cb->id, c->release_pin(c->ud, cb->id));
    }
}

/* ---- close ------------------------------------------------------------------ */

void pin_retry_releases(remote *r)
{
    for (pin *p = r->pins; p; p = p->next)
        if (p->releasing && !p->release_queued) {
            p->release_queued = true;
            queue_release(r, p->handle);
        }
}

/* kvcr_close, after the last settling: pending pin requests are
 * cancelled, and pins still being released get one more attempt. */
void pin_close(remote *r)
{
    while (r->pin_reqs) {
        pin_req *q = r->pin_reqs;
        r->pin_reqs = q->next;
        rcb *cb = calloc(1, sizeof *cb);
        if (cb) cb->kind = RCB_CANCEL_PIN, cb->id = q->id, rcb_push(r, cb);
        pin_req_drop(r, q);
    }
    pin_retry_releases(r);
}

void pin_destroy(remote *r)
{
    for (pin *p = r->pins; p; p = p->next)
        kvcr_log(host_logger(r->kv), KVCR_LOG_ERROR, "KVCR could not release framework pin %llu",
                 (unsigned long long)p->handle);
    while (r->pins) {
        pin *p = r->pins;
        r->pins = p->next;
        free(p);
    }
    while (r->fwres) {
        fwres *f = r->fwres;
        r->fwres = f->next;
        free(f->key);
        free(f->refs);
        free(f);
    }
    while (r->pin_reqs) {
        pin_req *q = r->pin_reqs;
        r->pin_reqs = q->next;
        pin_req_drop(r, q);
    }
}
