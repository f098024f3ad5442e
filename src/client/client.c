#include "client/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/frame.h"
#include "client/journal.h"
#include "client/pool.h"
#include "util/log.h"

#define CLAIM_TIMEOUT_MS 60000   /* a Guard handing back waits out its transfers */
#define RELEASE_TIMEOUT_MS 10000

struct svc_hold {
    int sock;
    int pool_fd;              /* keeps the pool's shared lock */
    int listener;             /* until taken */
    uint8_t *base;
    uint64_t mapping_bytes;
    uint16_t control_port;
    size_t n_pools;
    kvcr_dram_pool pools[KVCR_MAX_POOLS];
    char names[KVCR_MAX_POOLS][KVCR_NAME_MAX];
    recovered_block *recovered;
    size_t n_recovered, cap_recovered;
    uint8_t *keys;            /* the recovered keys, back to back */
    size_t keys_used, keys_cap;
    journal jr;
    bool journal_ok;
    journal_inc retired[JOURNAL_RETIRED_MAX]; /* gone from this endpoint (the service says) */
    size_t n_retired;
    uint64_t kv_seq;          /* the group's KV-event stream at the grant */
    kvcr_logger log;
};

/* ---- checks before anything is sent ------------------------------------------------ */

int svc_check_guard(const kvcr_config *cfg)
{
    const kvcr_guard_options *g = &cfg->guard;
    struct sockaddr_un sa;
    /* The conflict first: it is the mistake in the configuration's shape. */
    if (cfg->local_dram != NULL || cfg->n_local_dram != 0)
        return kvcr_fail(KVCR_EINVAL,
                         "guard mode conflicts with local_dram: the KVCR service provides the pools");
    if (g->service_socket_path[0] == '\0' ||
        strlen(g->service_socket_path) >= sizeof sa.sun_path)
        return kvcr_fail(KVCR_EINVAL,
                         "guard service_socket_path must be a Unix socket path of 1..%zu bytes",
                         sizeof sa.sun_path - 1);
    if (g->compatibility_digest == NULL || g->compatibility_digest[0] == '\0' ||
        strlen(g->compatibility_digest) > SVC_DIGEST_MAX)
        return kvcr_fail(KVCR_EINVAL, "guard compatibility_digest must be 1..%d bytes",
                         SVC_DIGEST_MAX);
    if (cfg->n_pool_layouts == 0 || cfg->n_pool_layouts > KVCR_MAX_POOLS)
        return kvcr_fail(KVCR_EINVAL, "pool_layouts must list 1..%d pools", KVCR_MAX_POOLS);
    return 0;
}

/* ---- the claim ----------------------------------------------------------------------- */

static void fill_claim(const kvcr_config *cfg, svc_msg *m)
{
    memset(m, 0, sizeof *m);
    m->type = SVC_CLAIM;
    m->guard_index = cfg->guard.guard_index;
    snprintf(m->digest, sizeof m->digest, "%s", cfg->guard.compatibility_digest);
    snprintf(m->agent, sizeof m->agent, "%s", cfg->agent_name);
    m->n_pools = (uint32_t)cfg->n_pool_layouts;
    for (size_t i = 0; i < cfg->n_pool_layouts; i++) {
        snprintf(m->pools[i].name, sizeof m->pools[i].name, "%s", cfg->pool_layouts[i].name);
        m->pools[i].block_size = cfg->pool_layouts[i].block_size;
    }
    if (cfg->remote.enabled) { /* the service binds the endpoint and keeps it */
        snprintf(m->control_host, sizeof m->control_host, "%s",
                 cfg->remote.control_host ? cfg->remote.control_host : "127.0.0.1");
        m->control_port = cfg->remote.control_port;
    }
    const kvcr_kv_events_options *k = &cfg->kv_events;
    if (k->endpoint != NULL) { /* the Guard speaks for this engine while it serves */
        snprintf(m->kv_endpoint, sizeof m->kv_endpoint, "%s", k->endpoint);
        snprintf(m->kv_replay, sizeof m->kv_replay, "%s", k->replay_endpoint ? k->replay_endpoint : "");
        snprintf(m->kv_topic, sizeof m->kv_topic, "%s", k->topic ? k->topic : "");
        m->kv_dp_rank = k->dp_rank;
        /* The Guard publishes with the same names and form. */
        snprintf(m->kv_medium_dram, sizeof m->kv_medium_dram, "%s", k->medium_dram);
        snprintf(m->kv_medium_g3, sizeof m->kv_medium_g3, "%s", k->medium_g3);
        m->kv_positional = k->legacy_positional;
    }
}

/* The grant must answer exactly this claim. */
static int check_grant(const kvcr_config *cfg, const svc_msg *g, size_t n_fds)
{
    if (g->guard_index != cfg->guard.guard_index)
        return kvcr_fail(KVCR_EPROTO, "the grant names guard %u, not %u", g->guard_index,
                         cfg->guard.guard_index);
    if (g->n_pools != cfg->n_pool_layouts)
        return kvcr_fail(KVCR_EPROTO, "the grant has %u pools for %zu layouts", g->n_pools,
                         cfg->n_pool_layouts);
    for (size_t i = 0; i < cfg->n_pool_layouts; i++)
        if (strcmp(g->pools[i].name, cfg->pool_layouts[i].name) != 0 ||
            g->pools[i].block_size != cfg->pool_layouts[i].block_size)
            return kvcr_fail(KVCR_EPROTO, "granted pool %zu is not the layout claimed", i);
    size_t want = cfg->remote.enabled ? 2 : 1;
    if (n_fds != want)
        return kvcr_fail(KVCR_EPROTO, "the grant carried %zu descriptor(s), not %zu", n_fds,
                         want);
    return 0;
}

/* Copies len bytes of a frame (a key, a tenant, metadata) into the keys
 * buffer; *at is their offset until the buffer settles. */
static int keep_bytes(svc_hold *h, const uint8_t *p, size_t len, const uint8_t **at)
{
    if (h->keys_used + len > h->keys_cap) {
        size_t cap = h->keys_cap ? h->keys_cap * 2 : 1 << 16;
        while (cap < h->keys_used + len) cap *= 2;
        uint8_t *k = realloc(h->keys, cap);
        if (k == NULL) return KVCR_ENOMEM;
        h->keys = k;
        h->keys_cap = cap;
    }
    if (len) memcpy(h->keys + h->keys_used, p, len);
    *at = (const uint8_t *)(uintptr_t)h->keys_used;
    h->keys_used += len;
    return 0;
}

/* A compacted journal holds one PUT per recovered block and nothing else. */
static int on_frame(void *ud, const jrec *r)
{
    svc_hold *h = ud;
    if (r->type != JREC_PUT)
        return kvcr_fail(KVCR_EPROTO, "recovery journal: a compacted journal holds a removal");
    if (h->n_recovered == h->cap_recovered) {
        size_t cap = h->cap_recovered ? h->cap_recovered * 2 : 1024;
        recovered_block *b = realloc(h->recovered, cap * sizeof *b);
        if (b == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
        h->recovered = b;
        h->cap_recovered = cap;
    }
    recovered_block *b = &h->recovered[h->n_recovered];
    if (keep_bytes(h, r->key, r->key_len, &b->key) != 0 ||
        keep_bytes(h, r->tenant, r->tenant_len, &b->tenant) != 0 ||
        keep_bytes(h, r->meta, r->meta_len, &b->meta) != 0)
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    b->key_len = r->key_len;
    b->tenant_len = r->tenant_len;
    b->meta_len = r->meta_len;
    b->pool = r->pool;
    b->slot = r->slot;
    h->n_recovered++;
    return 0;
}

/* Reads what the Guard compacted into the journal. A journal that cannot
 * be believed recovers nothing (logged): the claim still stands, cold. */
static void read_recovered(svc_hold *h, const svc_msg *g)
{
    int rc = journal_replay(h->base, g->journal_bytes, g->generation, on_frame, h);
    if (rc != 0) {
        kvcr_log(&h->log, KVCR_LOG_ERROR,
                 "recovery refused, starting cold: %s (no recovered block is trusted)",
                 kvcr_last_error());
        h->n_recovered = 0;
        return;
    }
    for (size_t i = 0; i < h->n_recovered; i++) {
        recovered_block *b = &h->recovered[i];
        b->key = h->keys + (uintptr_t)b->key;
        b->tenant = b->tenant_len ? h->keys + (uintptr_t)b->tenant : NULL;
        b->meta = b->meta_len ? h->keys + (uintptr_t)b->meta : NULL;
    }
}

static void free_hold(svc_hold *h)
{
    if (h->journal_ok) journal_detach(&h->jr);
    if (h->base) pool_unmap(h->base, h->mapping_bytes);
    if (h->sock >= 0) close(h->sock);
    if (h->pool_fd >= 0) close(h->pool_fd);
    if (h->listener >= 0) close(h->listener);
    free(h->recovered);
    free(h->keys);
    free(h);
}

/* Maps the granted pool and gets ready to publish. */
static int take_grant(svc_hold *h, const svc_msg *g)
{
    int rc = pool_map(h->pool_fd, g->mapping_bytes, (void **)&h->base);
    if (rc != 0) return rc;
    h->mapping_bytes = g->mapping_bytes;
    h->control_port = (uint16_t)g->control_port;
    h->n_pools = g->n_pools;
    for (uint32_t i = 0; i < g->n_pools; i++) {
        snprintf(h->names[i], sizeof h->names[i], "%s", g->pools[i].name);
        h->pools[i] = (kvcr_dram_pool){h->names[i], h->base + g->pools[i].offset, g->pools[i].size};
    }
    read_recovered(h, g);
    rc = journal_attach_producer(&h->jr, h->base, g->journal_bytes, g->generation);
    if (rc != 0) return rc;
    h->journal_ok = true;
    h->n_retired = journal_retired(h->base, h->retired);
    h->kv_seq = journal_kv_seq(h->base);
    return 0;
}

/* A claim that never got an answer from the service — no socket, connection
 * refused, the conversation broken off or timed out (KVCR_ESYS of the frame
 * layer) — is KVCR_EUNAVAIL, with the failing step's message. */
static int unreachable(int rc)
{
    return rc == KVCR_ESYS ? KVCR_EUNAVAIL : rc;
}

static int refused(const svc_msg *m)
{
    return kvcr_fail(KVCR_EREFUSED, "the KVCR service refused the claim: %s",
                     m->text ? m->text : "(no reason given)");
}

/* Sends the claim and takes the answer: 0 with h holding the grant. */
static int exchange(svc_hold *h, const kvcr_config *cfg, svc_msg *g)
{
    svc_msg *claim = malloc(sizeof *claim);
    if (claim == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    fill_claim(cfg, claim);
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0); /* the service may use its own */
    int rc = svc_send(h->sock, claim, &pidfd, pidfd >= 0 ? 1 : 0);
    if (pidfd >= 0) close(pidfd);
    free(claim);
    if (rc != 0) return unreachable(rc);
    int fds[SVC_MAX_FDS];
    size_t n_fds = 0;
    rc = svc_recv(h->sock, g, fds, SVC_MAX_FDS, &n_fds, CLAIM_TIMEOUT_MS);
    if (rc == 1) return kvcr_fail(KVCR_EUNAVAIL, "the KVCR service closed the claim socket");
    if (rc != 0) return unreachable(rc);
    if (n_fds > 0) h->pool_fd = fds[0];
    if (n_fds > 1) h->listener = fds[1];
    if (g->type == SVC_ERROR) return refused(g);
    if (g->type != SVC_GRANTED)
        return kvcr_fail(KVCR_EPROTO, "the KVCR service answered a claim with message type %d",
                         (int)g->type);
    return check_grant(cfg, g, n_fds);
}

int svc_claim(const kvcr_config *cfg, svc_hold **out)
{
    *out = NULL;
    int rc = svc_check_guard(cfg);
    if (rc != 0) return rc;
    svc_hold *h = calloc(1, sizeof *h);
    svc_msg *g = calloc(1, sizeof *g);
    if (h == NULL || g == NULL) {
        free(h);
        free(g);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    h->sock = h->pool_fd = h->listener = -1;
    kvcr_logger_init(&h->log, cfg->agent_name, cfg->callbacks.log, cfg->callbacks.ud);
    rc = unreachable(svc_connect(cfg->guard.service_socket_path, &h->sock));
    bool granted = false;
    if (rc == 0) rc = exchange(h, cfg, g);
    granted = rc == 0 || (g->type == SVC_GRANTED);
    if (rc == 0) rc = take_grant(h, g);
    svc_msg_clear(g);
    free(g);
    if (rc != 0) {
        if (granted) { /* give the group back at once, keeping our error */
            char why[512];
            snprintf(why, sizeof why, "%s", kvcr_last_error());
            svc_release(h, false);
            return kvcr_fail(rc, "%s", why);
        }
        free_hold(h);
        return rc;
    }
    kvcr_log(&h->log, KVCR_LOG_INFO,
             "claimed guard %u of the KVCR service at %s: %zu pool(s), %zu block(s) recovered",
             cfg->guard.guard_index, cfg->guard.service_socket_path, h->n_pools, h->n_recovered);
    *out = h;
    return 0;
}

const kvcr_dram_pool *svc_hold_pools(const svc_hold *h, size_t *n)
{
    *n = h->n_pools;
    return h->pools;
}

const recovered_block *svc_hold_recovered(const svc_hold *h, size_t *n)
{
    *n = h->n_recovered;
    return h->recovered;
}

const uint8_t (*svc_hold_retired(const svc_hold *h, size_t *n))[KVCR_INC_LEN]
{
    *n = h->n_retired;
    return (const uint8_t (*)[KVCR_INC_LEN])h->retired;
}

struct journal *svc_hold_journal(svc_hold *h)
{
    return h->journal_ok ? &h->jr : NULL;
}

int svc_hold_take_listener(svc_hold *h)
{
    int fd = h->listener;
    h->listener = -1;
    return fd;
}

uint16_t svc_hold_control_port(const svc_hold *h)
{
    return h->control_port;
}

uint64_t svc_hold_kv_seq(const svc_hold *h)
{
    return h->kv_seq;
}

/* ---- release -------------------------------------------------------------------------- */

int svc_release(svc_hold *h, bool activated)
{
    if (h == NULL) return 0;
    if (h->journal_ok) journal_detach(&h->jr);
    h->journal_ok = false;
    if (h->base) pool_unmap(h->base, h->mapping_bytes); /* before the service may reuse it */
    h->base = NULL;
    svc_msg m = {.type = SVC_RELEASE, .activated = activated};
    int rc = svc_send(h->sock, &m, NULL, 0);
    if (rc == 0) {
        size_t n_fds = 0;
        int fds[SVC_MAX_FDS];
        rc = svc_recv(h->sock, &m, fds, SVC_MAX_FDS, &n_fds, RELEASE_TIMEOUT_MS);
        for (size_t i = 0; i < n_fds; i++) close(fds[i]);
        if (rc == 1) rc = kvcr_fail(KVCR_ESYS, "the KVCR service closed the socket on a release");
        else if (rc == 0 && m.type == SVC_ERROR)
            rc = kvcr_fail(KVCR_EREFUSED, "the KVCR service refused the release: %s",
                           m.text ? m.text : "(no reason)");
        else if (rc == 0 && m.type != SVC_RELEASED)
            rc = kvcr_fail(KVCR_EPROTO, "the KVCR service answered a release with type %d",
                           (int)m.type);
        svc_msg_clear(&m);
    }
    if (rc != 0)
        kvcr_log(&h->log, KVCR_LOG_WARN,
                 "release of the pool group failed (%s): the service ends the lease when this "
                 "process exits", kvcr_last_error());
    free_hold(h);
    return rc;
}
