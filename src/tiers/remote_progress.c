/* The peer tier's progress thread and its plumbing: start and stop, the
 * loop, message sending and dispatch, the callbacks queued for the polling
 * thread, and the tier_ops the core calls (routes: remote_route.c).
 *
 * One turn of the loop: drive UCX (unlocked), then under the instance lock
 * settle UCX completions, receive and dispatch up to 64 control messages,
 * adopt new pulls, publish eager metadata and run the timers, with the lane
 * corked so that what the turn sends one peer leaves in one write; then wake
 * the polling thread if the turn gave it work, make the UCX endpoints due,
 * post the source writes that became ready (unlocked) and sleep in ppoll()
 * on the wake eventfd, the ZeroMQ fd, the lane's and (when armed) the UCX
 * fd until the next timer. */
#define _GNU_SOURCE /* ppoll */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "tiers/remote_int.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/event.h"
#include "util/prefault.h"

#define MSG_BATCH 64
#define IDLE_WAIT_MS 20
#define EAGER_TRIES 50
#define ACTIVE_WAIT_NS 20000 /* between polls while transfers are in flight */
/* While a transfer is in flight and the last event is younger than this,
 * the thread yields the CPU instead of napping: on one host a write's
 * fragments go through a shared memory FIFO that both sides' progress
 * drains, and a nap (70 us or more with the kernel's timer slack, whole
 * scheduler slices on a loaded host) between two fragments stalls both
 * sides; a 4 MiB write of 16 KiB blocks took 0.1-0.15 ms longer per
 * deliver with naps (docs/BENCHMARKS.md, "Small blocks"). A longer gap is
 * a wait on the peer, and the thread naps as before, so an open transfer
 * whose peer is slow or gone costs no CPU. */
#define ACTIVE_SPIN_NS 250000
#define MS 1000000ull

/* ---- sending -------------------------------------------------------------- */

static wire_bytes str_bytes(const char *s)
{
    return (wire_bytes){(const uint8_t *)s, strlen(s)};
}

int send_msg(remote *r, const char *endpoint, wire_msg *m, int md_rule)
{
    kvcr_t *kv = r->kv;
    const kvcr_conf *conf = host_conf(kv);
    /* Only metadata needs the peer's record: a reply (which may go to a
     * stranger's endpoint) adds none. Without a record (the table full of
     * peers in use) the metadata rides along every time. */
    rpeer *p = peer_get(r, endpoint, md_rule != MD_NEVER);
    uint64_t now = kvcr_now_ns();
    m->agent = str_bytes(conf->agent_name);
    m->incarnation = (wire_bytes){r->inc, WIRE_INCARNATION_LEN};
    if (m->from.len == 0) m->from = str_bytes(r->endpoint);
    m->to = str_bytes(endpoint);
    bool attach = md_rule != MD_NEVER &&
                  (p == NULL || (!p->acked && (md_rule == MD_FORCE || now >= p->retry_ns)));
    m->has_metadata = attach;
    if (attach) m->md = r->md;
    void *buf = NULL;
    size_t len = 0;
    int rc = wire_encode(m, &buf, &len);
    if (rc != 0) {
        kvcr_log(host_logger(kv), KVCR_LOG_ERROR, "cannot encode a %s message for %s",
                 wire_type_name(m->type), endpoint);
        return KVCR_ENOMEM;
    }
    rc = ctl_send(r->ctl, endpoint, buf, len);
    free(buf);
    if (rc != 0) {
        /* Debug only: a dead peer makes every probe fail until the abandon
         * deadline; what the failure means is logged by the caller. */
        kvcr_log(host_logger(kv), KVCR_LOG_DEBUG, "cannot send %s to %s: %s", wire_type_name(m->type),
                 endpoint, kvcr_last_error());
        peer_invalidate(r, endpoint);
        return rc;
    }
    if (attach && p != NULL)
        p->retry_ns = now + (uint64_t)conf->remote.metadata_retry_interval_ms * MS;
    return 0;
}

/* ---- callbacks for the polling thread ------------------------------------- */

void rcb_free(rcb *cb)
{
    free(cb->keys);
    free(cb->regions);
    free(cb->owned);
    free(cb);
}

void rcb_push(remote *r, rcb *cb)
{
    cb->next = NULL;
    if (r->cbs_tail)
        r->cbs_tail->next = cb;
    else
        r->cbs = cb;
    r->cbs_tail = cb;
    remote_owe_main(r);
}

void rcb_resilience(remote *r, kvcr_resilience_state st, bool source_side, uint64_t op,
                    const kvcr_mem_ref *regions, size_t n, const char *fmt, ...)
{
    rcb *cb = calloc(1, sizeof *cb);
    kvcr_mem_ref *copy = n ? calloc(n, sizeof *copy) : NULL;
    char *labels = NULL;
    size_t label_bytes = 0;
    for (size_t i = 0; i < n; i++) label_bytes += strlen(regions[i].label ? regions[i].label : "") + 1;
    if (n) labels = malloc(label_bytes);
    if (cb == NULL || (n && (copy == NULL || labels == NULL))) {
        kvcr_log(host_logger(r->kv), KVCR_LOG_ERROR, "out of memory: a resilience event is lost");
        free(cb), free(copy), free(labels);
        return;
    }
    char *at = labels;
    for (size_t i = 0; i < n; i++) {
        strcpy(at, regions[i].label ? regions[i].label : "");
        copy[i] = (kvcr_mem_ref){NULL, at, regions[i].index};
        at += strlen(at) + 1;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cb->message, sizeof cb->message, fmt, ap);
    va_end(ap);
    cb->kind = RCB_RESILIENCE;
    cb->regions = copy;
    cb->ev = (kvcr_resilience_event){st, source_side, op, copy, n, cb->message};
    cb->owned = labels;
    rcb_push(r, cb);
}

/* ---- dropped input -------------------------------------------------------- */

/* Locked, progress thread: counts by cause and logs at most once per
 * CTL_DROP_LOG_MS per cause: junk from many connections costs a counter
 * each, never a log line each. */
static void count_drop(remote *r, ctl_drop cause, const char *fmt, va_list ap)
{
    host_control_drop(r->kv, ctl_drop_name(cause));
    kvcr_vlog_limited(host_logger(r->kv), &r->drop_log[cause], CTL_DROP_LOG_MS, fmt, ap);
}

void remote_drop(remote *r, ctl_drop cause, const char *fmt, ...)
{
    r->dropped_messages++;
    va_list ap;
    va_start(ap, fmt);
    count_drop(r, cause, fmt, ap);
    va_end(ap);
}

/* Locked, progress thread: a message the handlers already counted in the
 * total (they know only that nothing waits for it), counted by cause. */
static void __attribute__((format(printf, 2, 3))) note_unexpected(remote *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    count_drop(r, CTL_DROP_UNEXPECTED, fmt, ap);
    va_end(ap);
}

/* Locked, progress thread: a connection whose handshake failed (logged by
 * the channel, which knows why). */
static void on_handshake_failed(void *ud, ctl_drop cause)
{
    remote *r = ud;
    host_control_drop(r->kv, ctl_drop_name(cause));
}

/* ---- dispatch ------------------------------------------------------------- */

/* With CURVE a message speaks only for the key its connection was
 * admitted with: the endpoint it gives for replies ("from") must carry that
 * key. Otherwise a key holder could make us answer, and write with UCX,
 * for a third party. */
static bool sender_authentic(remote *r, const wire_msg *m, const char *peer_key)
{
    if (!ctl_curve_on(r->ctl)) return true; /* a keyed "from" fails at the reply */
    const char *claimed = ctl_endpoint_key((const char *)m->from.data);
    if (peer_key != NULL && claimed != NULL && strcmp(claimed, peer_key) == 0) return true;
    r->refused_messages++;
    remote_drop(r, CTL_DROP_BAD_SENDER,
                "dropped a %s message from %.*s: its connection was admitted for key %s, "
                "not the key of its reply endpoint %.*s",
                wire_type_name(m->type), (int)m->agent.len, (const char *)m->agent.data,
                peer_key ? peer_key : "(none)", (int)m->from.len, (const char *)m->from.data);
    return false;
}

static void on_message(void *ud, const void *data, size_t len, const char *peer_key)
{
    remote *r = ud;
    wire_msg m;
    const char *why = NULL;
    if (wire_decode(data, len, &m, &why) != 0) {
        if (why == wire_unknown_type)
            remote_drop(r, CTL_DROP_UNKNOWN_TYPE,
                        "dropped a control message (%zu bytes) of a type this version lacks", len);
        else
            remote_drop(r, CTL_DROP_MALFORMED, "dropped a malformed control message (%zu bytes): %s",
                        len, why);
        return;
    }
    if (!sender_authentic(r, &m, peer_key)) {
        wire_msg_free(&m);
        return;
    }
    peer_heard(r, m.from.data, m.from.len, kvcr_now_ns());
    /* The source's handlers count what they drop through remote_drop; the
     * target's only in the total: a valid reply that nothing here waits for
     * (a late one, a stranger's, another incarnation's). */
    uint64_t dropped = r->dropped_messages;
    switch (m.type) {
    case WIRE_METADATA:
    case WIRE_START_WRITE:
    case WIRE_WRITE_PROBE: source_on_message(r, &m); break;
    default:
        target_on_message(r, &m);
        if (r->dropped_messages != dropped)
            note_unexpected(r, "dropped a %s message from %.*s (%.*s) that nothing here waits for",
                            wire_type_name(m.type), (int)m.agent.len, (const char *)m.agent.data,
                            (int)m.from.len, (const char *)m.from.data);
        break;
    }
    wire_msg_free(&m);
}

/* Eager metadata: a hint named a source that has not acknowledged ours.
 * Published again every metadata_retry_interval_ms until it answers, for
 * at most EAGER_TRIES attempts (a source that never answers is left to the
 * start_write of a real request). */
static void publish_eager(remote *r, uint64_t now, uint64_t *next_ns)
{
    for (uint32_t i = 0; i < r->n_peers; i++) {
        rpeer *p = &r->peers[i];
        if (!p->eager) continue;
        if (p->acked || p->eager_tries >= EAGER_TRIES) {
            p->eager = false;
            continue;
        }
        if (now >= p->retry_ns) {
            wire_msg m = {.type = WIRE_METADATA};
            p->eager_tries++;
            if (send_msg(r, p->endpoint, &m, MD_FORCE) != 0)
                p->retry_ns = now + (uint64_t)host_conf(r->kv)->remote.metadata_retry_interval_ms * MS;
        }
        if (p->retry_ns < *next_ns) *next_ns = p->retry_ns;
    }
}

void remote_owe_main(remote *r)
{
    if (r->progress_locked)
        r->main_owed = true;
    else
        host_wake(r->kv);
}

/* Locked, progress thread: wakes the polling thread if the turn owes it. */
static void wake_main_owed(remote *r)
{
    if (!r->main_owed) return;
    r->main_owed = false;
    host_wake(r->kv);
}

void remote_wake(remote *r)
{
    event_signal(r->wake_fd);
}

/* ---- the loop ------------------------------------------------------------- */

/* The source stalls if a turn came too late: its writes could outlive the
 * deadlines its peers were promised. */
static void check_stall(remote *r, uint64_t now)
{
    uint64_t gap = now - r->last_turn_ns;
    r->last_turn_ns = now;
    uint32_t timeout_ms = host_conf(r->kv)->operation_timeout_ms;
    uint64_t limit = (uint64_t)timeout_ms * MS;
    if (r->stalled || gap < limit) return;
    r->stalled = true;
    rcb_resilience(r, KVCR_SOURCE_STALLED, true, 0, NULL, 0,
                   "source progress stalled for %llu ms (timeout: %u ms); new source writes "
                   "disabled until restart",
                   (unsigned long long)(gap / MS), timeout_ms);
}

static bool turn_locked(remote *r, uint64_t *next_ns)
{
    uint64_t now = kvcr_now_ns();
    check_stall(r, now);
    source_ucx_settle(r);
    size_t got = ctl_serve_handshakes(r->ctl, MSG_BATCH, on_handshake_failed, r) +
                 ctl_recv(r->ctl, MSG_BATCH, on_message, r);
    target_adopt(r, now, next_ns);
    publish_eager(r, now, next_ns);
    peers_sweep(r, now, next_ns);
    if (r->stop) {
        target_stop(r, now);
        source_stop(r);
    }
    target_timers(r, now, next_ns);
    source_timers(r, now, next_ns);
    return got > 0;
}

static void *progress_main(void *arg)
{
    remote *r = arg;
    kvcr_t *kv = r->kv;
    uint64_t give_up = 0, last_busy_ns = 0;
    thread_prefault(); /* before a first contact has to wait for it */
    sem_post(&r->thread_ready);
    r->last_turn_ns = kvcr_now_ns();
    for (;;) {
        bool busy = ucx_progress(r->ucx) > 0;
        uint64_t next_ns = kvcr_now_ns() + IDLE_WAIT_MS * MS;
        host_lock(kv);
        r->progress_locked = true;
        ctl_cork(r->ctl); /* what this turn sends a peer leaves in one write */
        busy |= turn_locked(r, &next_ns);
        if (r->ucx_fence) { /* under the lock: the polling thread waits for it */
            r->ucx_fence = false;
            busy |= ucx_progress(r->ucx) > 0;
        }
        swrite *posts = source_take_posts(r);
        ctl_uncork(r->ctl); /* before endpoints are made: they may take a while */
        wake_main_owed(r);
        route_connect_due(r, &next_ns);
        bool transfers = posts != NULL || !source_idle(r) || target_moving(r);
        bool done = r->stop && target_idle(r) && source_idle(r);
        if (r->stop && give_up == 0)
            give_up = kvcr_now_ns() + (uint64_t)host_conf(kv)->abandon_timeout_ms * MS + 1000 * MS;
        if (r->stop && !done && kvcr_now_ns() >= give_up) {
            target_abandon_all(r);
            done = true;
        }
        if (done) r->exited = true;
        wake_main_owed(r);
        r->progress_locked = false;
        host_unlock(kv);
        for (swrite *sw = posts, *next; sw; sw = next) {
            next = sw->list_next;
            source_post(r, sw);
            busy = true;
        }
        if (done) break;
        if (busy) {
            last_busy_ns = kvcr_now_ns();
            continue;
        }
        struct timespec wait = {0, 0};
        bool armed = false;
        if (transfers) {
            /* Active wait: on one host UCX moves a put in fragments that
             * only progress on both sides drives, and not every step
             * raises an fd event. A pull whose bytes come inline waits
             * only for a control message, in poll (target_moving): its
             * spin would take a CPU its source needs on a small host. */
            if (kvcr_now_ns() - last_busy_ns >= ACTIVE_SPIN_NS) wait.tv_nsec = ACTIVE_WAIT_NS;
        } else {
            if (!ucx_arm(r->ucx)) continue;
            armed = true;
            uint64_t now = kvcr_now_ns();
            uint64_t ns = next_ns > now ? next_ns - now : 0;
            if (ns > IDLE_WAIT_MS * MS) ns = IDLE_WAIT_MS * MS;
            wait = (struct timespec){(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        }
        /* The UCX fd only when armed: unarmed it stays readable from the
         * last event on, so every nap and yield of an active wait returned
         * at once, and the two progress threads of a one-host transfer
         * became busy loops that held a CPU until the scheduler took it
         * (a 4 MiB deliver used 20-150 ms of CPU on each side under load
         * where it needs about 1, docs/BENCHMARKS.md "Under load"). */
        struct pollfd fds[6] = {{r->wake_fd, POLLIN, 0},
                                {ctl_fd(r->ctl), POLLIN, 0},
                                {armed ? ucx_fd(r->ucx) : -1, POLLIN, 0},
                                {ctl_auth_fd(r->ctl), POLLIN, 0},
                                {ctl_monitor_fd(r->ctl), POLLIN, 0},
                                {ctl_lane_fd(r->ctl), POLLIN, 0}};
        /* A nap between two looks at UCX is a ppoll on the fds too: a
         * control message (a write's answer) ends it at once instead of
         * waiting out the nap and the kernel's timer slack (docs/BENCHMARKS.md,
         * "Small blocks"). No ZAP handler or lane: fd -1, ignored. */
        int ready = ppoll(fds, 6, &wait, NULL);
        if (ready > 0 && (fds[0].revents & POLLIN)) {
            uint64_t ticks;
            ssize_t rd = read(r->wake_fd, &ticks, sizeof ticks);
            (void)rd;
        } else if (ready == 0 && transfers && wait.tv_nsec == 0) {
            sched_yield();
        }
    }
    return NULL;
}

/* ---- start, stop ---------------------------------------------------------- */

static int register_memory(remote *r)
{
    kvcr_t *kv = r->kv;
    const kvcr_conf *conf = host_conf(kv);
    uint32_t n = (uint32_t)conf->n_regions + (conf->has_local_dram ? conf->n_pools : 0);
    r->mems = calloc(n ? n : 1, sizeof *r->mems);
    r->md_regions = calloc(n ? n : 1, sizeof *r->md_regions);
    if (r->mems == NULL || r->md_regions == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        bool fw = i < conf->n_regions;
        wire_region *w = &r->md_regions[i];
        if (fw) {
            const fw_region *g = &conf->regions[i];
            *w = (wire_region){str_bytes(g->label), true, (uint64_t)(uintptr_t)g->addr,
                               g->element_size, g->stride, g->count, {NULL, 0}};
        } else {
            host_pool p;
            host_pool_info(kv, i - (uint32_t)conf->n_regions, &p);
            size_t slots = p.block_size ? p.bytes / p.block_size : 0;
            *w = (wire_region){str_bytes(p.name), false, (uint64_t)(uintptr_t)p.base,
                               p.block_size, p.block_size, slots, {NULL, 0}};
            if (slots == 0) continue; /* nothing to register */
        }
        size_t len = (size_t)((w->count - 1) * w->stride + w->element_size);
        int rc = ucx_mem_register(r->ucx, (void *)(uintptr_t)w->addr, len, &r->mems[i]);
        if (rc != 0) return rc;
        r->n_mems = i + 1;
        const void *rkey;
        ucx_mem_rkey(r->mems[i], &rkey, &w->rkey.len);
        w->rkey.data = rkey;
    }
    /* Pools without memory are not announced. */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (r->md_regions[i].rkey.len > 0) r->md_regions[k++] = r->md_regions[i];
    const void *addr;
    ucx_worker_address(r->ucx, &addr, &r->md.worker_addr.len);
    r->md.worker_addr.data = addr;
    r->md.n_regions = k;
    r->md.regions = r->md_regions;
    /* Our regions as a writer sees them: where the bytes of writes that
     * come as messages may land (labels are the config's C strings). */
    r->own_geom = calloc(k ? k : 1, sizeof *r->own_geom);
    if (r->own_geom == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < k; i++) {
        const wire_region *w = &r->md_regions[i];
        r->own_geom[i] = (region_geom){(const char *)w->label.data, w->framework, w->addr,
                                       w->element_size, w->stride, w->count};
    }
    ucx_set_sink(r->ucx, target_take_bytes, r);
    return 0;
}

static void remote_destroy(tier *t);

/* Pulls of at most this many bytes ask for them inline in write_done
 * (docs/ARCHITECTURE.md, the peer tier); KVCR_INLINE_WRITE_MAX overrides
 * it, 0 turning inline writes off. */
#define INLINE_WRITE_MAX_DEFAULT (64u << 10)
/* Pulls whose every destination piece holds at least this many bytes let
 * their source put even over TCP lanes (start_write's put_min: large
 * blocks move faster so, docs/BENCHMARKS.md "Across hosts");
 * KVCR_TCP_PUT_MIN overrides it, 0 never letting it. */
#define TCP_PUT_MIN_DEFAULT (1ull << 20)

/* The control channel, bound on control_listener when one was handed over
 * (ctl_open owns it from then on, failing or not). */
static int open_control(remote *r, int control_listener)
{
    const kvcr_conf *conf = host_conf(r->kv);
    const kvcr_curve_options *k = &conf->remote.curve;
    ctl_curve curve = {k->secret_key, k->public_key, k->allowed_keys, k->n_allowed_keys};
    int rc = ctl_open(conf->remote.control_host, conf->remote.control_port, control_listener,
                      conf->remote.advertise_host, conf->limits.max_control_message_bytes,
                      k->secret_key ? &curve : NULL, host_logger(r->kv), &r->ctl);
    if (rc != 0) return rc;
    /* The lane is the fast way between peers in plaintext (net/lane.h);
     * KVCR_CONTROL_LANE=0 keeps every message on ZeroMQ, for comparison. */
    if (!ctl_curve_on(r->ctl) && env_bytes(host_logger(r->kv), "KVCR_CONTROL_LANE", 1, 1) == 1 &&
        ctl_open_lane(r->ctl) != 0)
        kvcr_log(host_logger(r->kv), KVCR_LOG_INFO,
                 "control channel: no lane, every message goes over ZeroMQ: %s", kvcr_last_error());
    snprintf(r->endpoint, sizeof r->endpoint, "%s", ctl_endpoint(r->ctl));
    if (ctl_curve_on(r->ctl))
        kvcr_log(host_logger(r->kv), KVCR_LOG_INFO,
                 "control channel: CURVE on, %zu peer key(s) allowed", k->n_allowed_keys);
    return 0;
}

/* Starts the progress thread and waits until it has touched its memory
 * (util/prefault.h): a pull right after kvcr_create does not pay that. */
static int start_thread(remote *r)
{
    if (sem_init(&r->thread_ready, 0, 0) != 0)
        return kvcr_fail(KVCR_ESYS, "sem_init failed: %s", strerror(errno));
    int rc = 0;
    if (pthread_create(&r->thread, NULL, progress_main, r) != 0) {
        rc = kvcr_fail(KVCR_ESYS, "cannot start the progress thread");
    } else {
        r->thread_started = true;
        while (sem_wait(&r->thread_ready) != 0 && errno == EINTR) continue;
    }
    sem_destroy(&r->thread_ready);
    return rc;
}

int remote_start(kvcr_t *kv, int control_listener, ucx_ctx **ready, remote **out)
{
    remote *r = calloc(1, sizeof *r);
    if (r == NULL) {
        if (control_listener >= 0) close(control_listener);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    r->kv = kv;
    r->wake_fd = -1;
    route_init(r);
    r->next_source_no = 1;
    r->next_pin_req = 1;
    host_incarnation(kv, r->inc);
    r->inline_max =
        (uint32_t)env_bytes(host_logger(kv), "KVCR_INLINE_WRITE_MAX", WIRE_MAX_INLINE,
                            INLINE_WRITE_MAX_DEFAULT);
    r->put_min = env_bytes(host_logger(kv), "KVCR_TCP_PUT_MIN", UINT64_MAX, TCP_PUT_MIN_DEFAULT);
    int rc = 0;
    if ((r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        rc = kvcr_fail(KVCR_ESYS, "eventfd failed: %s", strerror(errno));
    if (rc == 0 && ready != NULL && *ready != NULL) {
        r->ucx = *ready;
        *ready = NULL;
        ucx_ctx_set_logger(r->ucx, host_logger(kv));
    } else if (rc == 0) {
        rc = ucx_ctx_create(host_logger(kv), &r->ucx);
    }
    if (rc == 0) rc = register_memory(r);
    if (rc == 0)
        rc = open_control(r, control_listener);
    else if (control_listener >= 0)
        close(control_listener); /* taken over either way */
    if (rc == 0) rc = start_thread(r);
    if (rc != 0) {
        remote_destroy((tier *)r);
        return rc;
    }
    char inc[2 * WIRE_INCARNATION_LEN + 1];
    for (int i = 0; i < WIRE_INCARNATION_LEN; i++) sprintf(inc + 2 * i, "%02x", r->inc[i]);
    kvcr_log(host_logger(kv), KVCR_LOG_INFO,
             "remote tier up: control endpoint %s, incarnation %s, %u region(s) registered, "
             "pulls of up to %u bytes inline",
             r->endpoint, inc, r->md.n_regions, r->inline_max);
    *out = r;
    return 0;
}

tier *remote_tier(remote *r)
{
    return (tier *)r;
}

static remote *of(tier *t)
{
    return (remote *)t;
}

/* Unlocked, after close marked the instance closed: stops the progress
 * thread once the transfers in flight ended (bounded by the abandon
 * timeout; what is left is reported uncertain), then gives up what only it
 * used: the control socket (its port is free again once kvcr_close
 * returns), the endpoints, the registrations and the UCX context. Pulls
 * and writes stay for the polling thread to settle. */
static void remote_stop(tier *t)
{
    remote *r = of(t);
    kvcr_t *kv = r->kv;
    if (r->thread_started) {
        host_lock(kv);
        r->stop = true;
        host_unlock(kv);
        remote_wake(r);
        pthread_join(r->thread, NULL);
        r->thread_started = false;
        if (!target_idle(r) || !source_idle(r))
            kvcr_log(host_logger(kv), KVCR_LOG_ERROR,
                     "closing with peer transfers unresolved: their memory was reported uncertain");
    }
    /* Endpoints first: closing one ends the writes still on it (their
     * completions land on ucx_done, never read again). */
    route_close_all(r);
    for (uint32_t i = 0; i < r->n_mems; i++)
        if (r->mems[i]) ucx_mem_deregister(r->mems[i]);
    r->n_mems = 0;
    if (r->ctl) ctl_close(r->ctl);
    r->ctl = NULL;
    if (r->ucx) ucx_ctx_destroy(r->ucx);
    r->ucx = NULL;
}

/* Unlocked, the instance is going away. */
static void remote_destroy(tier *t)
{
    remote *r = of(t);
    remote_stop(t);
    source_destroy(r);
    pin_destroy(r);
    target_destroy(r);
    for (rcb *cb = r->cbs, *next; cb; cb = next) {
        next = cb->next;
        rcb_free(cb);
    }
    for (wstat **b = r->wstats; b && b < r->wstats + r->n_wbuckets; b++)
        for (wstat *w = *b, *next; w; w = next) next = w->next, free(w);
    free(r->wstats);
    free(r->mems);
    free(r->md_regions);
    free(r->own_geom);
    free(r->peers);
    if (r->wake_fd >= 0) close(r->wake_fd);
    free(r);
}

/* ---- the remote-only public calls (remote.h) ------------------------------ */

const char *remote_endpoint(const remote *r)
{
    return r->endpoint;
}

void remote_hint_source(remote *r, const char *source)
{
    if (!host_conf(r->kv)->remote.eager_ctrl_connect) return;
    if (strcmp(source, r->endpoint) == 0) return; /* ourselves */
    rpeer *p = peer_get(r, source, true);
    if (p == NULL || p->acked || p->eager) return;
    p->eager = true;
    p->eager_tries = 0;
    /* The connection is dialled now, not when the progress thread gets to
     * the metadata: a deliver right behind the hint finds its handshake
     * under way (docs/BENCHMARKS.md, "First contact"). A dial that fails
     * is made again by the metadata's send. */
    if (ctl_connect(r->ctl, source) != 0)
        kvcr_log(host_logger(r->kv), KVCR_LOG_DEBUG, "eager connect to %s: %s", source,
                 kvcr_last_error());
    remote_wake(r);
}

uint64_t remote_dropped_messages(const remote *r)
{
    return r->dropped_messages;
}

/* Reads only what ctl_open fixed (the keys), so any thread may ask. */
int remote_check_source(const remote *r, const char *source)
{
    return r->ctl ? ctl_check_peer(r->ctl, source) : 0;
}

/* ---- the core's side (tier_ops) ------------------------------------------- */

/* Locked: connected peers, the peer table (records of sources, routes to
 * targets, and how many of each were reclaimed), framework pins and the keys they back, the
 * limits (source writes being served now and at most so far, source writes
 * held — also ended ones not yet settled by a poll —, fences of write ids,
 * pin requests pending) and what CURVE refused: connections (ZAP) and
 * messages whose reply endpoint named another key than their connection's;
 * and the write messages from peers that the sink dropped (malformed, or
 * not for a pull waiting for them: ucx_sink_dropped, an atomic the
 * progress thread counts); the UCX writes this source posted as puts and
 * as messages (ucx_writes_posted, atomics too), and the endpoints it
 * closed by force with the TCP connections that reset (ucx_abort_counts). */
static void remote_gauges(tier *t, gauge_sink *s)
{
    const remote *r = of(t);
    double peers = 0, pins = 0, pinned_keys = 0;
    for (uint32_t i = 0; i < r->n_peers; i++) peers += r->peers[i].acked;
    for (const pin *p = r->pins; p; p = p->next) pins += 1, pinned_keys += p->n_keys;
    gauge_sink_add(s, "", "framework_pins", pins);
    gauge_sink_add(s, "", "pinned_keys", pinned_keys);
    gauge_sink_add(s, "", "connected_remotes", peers);
    gauge_sink_add(s, "", "peer_records", (double)r->n_peers);
    gauge_sink_add(s, "", "peer_records_reclaimed", (double)r->peers_reclaimed);
    route_gauges(r, s);
    gauge_sink_add(s, "", "source_writes_in_flight", (double)r->n_serving);
    gauge_sink_add(s, "", "source_writes_in_flight_max", (double)r->max_serving_seen);
    gauge_sink_add(s, "", "source_writes_held", (double)r->n_swrites);
    gauge_sink_add(s, "", "source_write_fences", (double)r->n_wstats);
    gauge_sink_add(s, "", "pin_requests_pending", (double)r->n_pin_reqs);
    gauge_sink_add(s, "", "control_auth_refused_connections",
                   r->ctl ? (double)ctl_auth_refused(r->ctl) : 0);
    gauge_sink_add(s, "", "control_auth_refused_messages", (double)r->refused_messages);
    gauge_sink_add(s, "", "ucx_write_messages_dropped",
                   r->ucx ? (double)ucx_sink_dropped(r->ucx) : 0);
    uint64_t puts = 0, messages = 0;
    if (r->ucx) ucx_writes_posted(r->ucx, &puts, &messages);
    gauge_sink_add(s, "", "ucx_writes_as_puts", (double)puts);
    gauge_sink_add(s, "", "ucx_writes_as_messages", (double)messages);
    uint64_t aborts = 0, resets = 0;
    if (r->ucx) ucx_abort_counts(r->ucx, &aborts, &resets);
    gauge_sink_add(s, "", "ucx_endpoints_aborted", (double)aborts);
    gauge_sink_add(s, "", "ucx_tcp_connections_reset", (double)resets);
    gauge_sink_add(s, "", "pulls_held_for_silent_source", (double)r->pulls_held);
}

/* Locked, every poll: what the progress thread handed back (finished
 * pulls, finished source writes, pin work). */
static void remote_settle(tier *t)
{
    target_main(of(t));
    source_main(of(t));
}

/* Locked, at close after the last settling: pending pin requests are
 * cancelled, pins not yet released are asked for once more. */
static void remote_close(tier *t)
{
    pin_close(of(t));
}

static void log_resilience(remote *r, const kvcr_resilience_event *ev)
{
    kvcr_log(host_logger(r->kv),
             ev->state == KVCR_TRANSFER_QUIESCED ? KVCR_LOG_INFO : KVCR_LOG_ERROR,
             "resilience: %s", ev->message);
}

/* Unlocked, on the polling thread: the framework callbacks queued while
 * settling (pins, resilience events), each taken off the queue under the
 * lock and run without it. */
static void remote_run_callbacks(tier *t)
{
    remote *r = of(t);
    const kvcr_callbacks *c = &host_conf(r->kv)->cb;
    for (;;) {
        host_lock(r->kv);
        rcb *cb = r->cbs;
        if (cb) {
            r->cbs = cb->next;
            if (r->cbs == NULL) r->cbs_tail = NULL;
        }
        host_unlock(r->kv);
        if (cb == NULL) return;
        if (cb->kind != RCB_RESILIENCE)
            pin_run_callback(r, cb);
        else if (c->resilience)
            c->resilience(c->ud, &cb->ev);
        else
            log_resilience(r, &cb->ev);
        rcb_free(cb);
    }
}

static tier_batch *remote_begin(tier *t, const tier_batch_info *info)
{
    return target_begin(of(t), info);
}

static bool remote_holds(tier *t, tier_batch *b, tier_block id, const uint8_t *key,
                         uint32_t key_len)
{
    (void)id; /* a pull is asked for by key alone */
    return target_holds(of(t), b, key, key_len);
}

static kvcr_reason remote_read(tier *t, tier_batch *b, const tier_read *rd)
{
    return target_read(of(t), b, rd);
}

static void remote_end(tier *t, tier_batch *b)
{
    target_end(of(t), b);
}

const tier_ops remote_tier_ops = {
    .version = TIER_OPS_VERSION,
    .name = "remote",
    .id = KVCR_TIER_REMOTE_G2,
    .stop = remote_stop,
    .close = remote_close,
    .destroy = remote_destroy,
    .settle = remote_settle,
    .run_callbacks = remote_run_callbacks,
    .gauges = remote_gauges,
    .begin = remote_begin,
    .holds = remote_holds,
    .read = remote_read,
    .end = remote_end,
    .spill = NULL,
    .layout_ok = NULL,
    .scatters = true, /* the source writes each part where the target's metadata says */
};
