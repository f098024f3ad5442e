#include "daemon/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/boot.h"
#include "client/journal.h"
#include "client/pool.h"
#include "daemon/mirror.h"
#include "util/clock.h"

#define FRAMES_PER_TICK 4096 /* bounded work per loop turn; the rest next turn */

enum phase { PH_IDLE = 0, PH_PRIMARY, PH_SERVING, PH_FAILED };
static const char *const phase_names[] = {"idle", "primary", "serving", "failed"};

struct guard {
    uint32_t index;
    const guard_terms *t;
    pool_file file;
    uint8_t *base;
    uint64_t mapping_bytes, generation;
    uint64_t offset[KVCR_MAX_POOLS];
    enum phase phase;
    char failure[320];

    /* Fixed by the first claim for the service's lifetime (unless that
     * claimant gives the group back without ever starting: terms_lease). */
    bool configured;
    uint64_t terms_lease;
    uint32_t n_pools;
    svc_pool layouts[KVCR_MAX_POOLS];
    char host[SVC_HOST_MAX + 1];
    uint32_t requested_port;
    int listener; /* the control endpoint's TCP listener, or -1 */
    uint16_t port;
    /* A UCX context made while the owner lives, for the backup: UCX takes
     * 5-8 ms to start, most of a promotion. One try per lease. */
    struct ucx_ctx *ucx_ahead;
    bool ucx_ahead_tried;

    /* The lease. */
    uint64_t lease, next_lease;
    int pidfd;
    char agent[KVCR_NAME_MAX];
    /* The owner's KV events (its last claim's): the backup publishes on the
     * same endpoint, topic and rank; "" endpoint: none. */
    char kv_endpoint[SVC_KV_MAX + 1], kv_replay[SVC_KV_MAX + 1], kv_topic[SVC_KV_MAX + 1];
    uint32_t kv_dp_rank;
    char kv_medium_dram[SVC_KV_MAX + 1], kv_medium_g3[SVC_KV_MAX + 1];
    bool kv_positional;
    journal jc;        /* consumer of the owner's journal */
    bool reading;      /* jc attached and believed */
    mirror mir;
    bool mirror_ok;    /* the mirror can be trusted (recovery on) */

    /* Serving. */
    kvcr_t *backup;
    char backup_agent[KVCR_NAME_MAX];
    bool resumable;    /* a grant stood the backup down: an unactivated release resumes it */
    uint64_t died_ns;

    /* Incarnations that answered on the endpoint and are gone (newest
     * last): every instance on it after them says so to a probing peer. */
    journal_inc retired[JOURNAL_RETIRED_MAX];
    size_t n_retired;

    /* Metrics. */
    uint64_t claims, refusals, promotions, handbacks, recovery_lost, recovered;
    double last_promotion_s;
};

/* ---- creation ---------------------------------------------------------------------- */

int guard_create(const guard_terms *t, uint32_t index, guard **out)
{
    guard *g = calloc(1, sizeof *g);
    if (g == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    g->index = index;
    g->t = t;
    g->listener = g->pidfd = -1;
    g->file.fd = -1;
    g->next_lease = 1;
    g->mapping_bytes = t->journal_bytes;
    for (uint32_t i = 0; i < t->n_pools; i++) {
        g->offset[i] = g->mapping_bytes;
        g->mapping_bytes += t->pool_bytes[i];
    }
    int rc = 0;
    if (getrandom(&g->generation, sizeof g->generation, 0) != sizeof g->generation)
        rc = kvcr_fail(KVCR_ESYS, "getrandom: %s", strerror(errno));
    if (rc == 0) rc = pool_file_create(t->pool_dir, index, g->generation, g->mapping_bytes, &g->file);
    if (rc == 0) rc = pool_map(g->file.fd, g->mapping_bytes, (void **)&g->base);
    if (rc == 0) rc = journal_format(g->base, t->journal_bytes, g->generation);
    if (rc != 0) {
        guard_destroy(g);
        return rc;
    }
    kvcr_log(t->log, KVCR_LOG_INFO, "guard %u: pool file %s, %llu bytes (journal %llu)", index,
             g->file.path, (unsigned long long)g->mapping_bytes,
             (unsigned long long)t->journal_bytes);
    *out = g;
    return 0;
}

static void retire(guard *g, const journal_inc inc)
{
    for (size_t i = 0; i < g->n_retired; i++)
        if (memcmp(g->retired[i], inc, JOURNAL_INC_LEN) == 0) return;
    if (g->n_retired == JOURNAL_RETIRED_MAX) {
        memmove(g->retired[0], g->retired[1], (JOURNAL_RETIRED_MAX - 1) * JOURNAL_INC_LEN);
        g->n_retired--;
    }
    memcpy(g->retired[g->n_retired++], inc, JOURNAL_INC_LEN);
}

static void stop_backup(guard *g)
{
    if (g->backup == NULL) return;
    journal_inc inc;
    kvcr__incarnation(g->backup, inc);
    kvcr_close(g->backup); /* waits out its transfers: nothing reads the pool afterwards */
    kvcr_free(g->backup);
    g->backup = NULL;
    retire(g, inc); /* its transport is destroyed: it writes nothing more */
}

/* The owner is gone (dead, or closed: its transport destroyed either way). */
static void end_lease(guard *g)
{
    journal_inc inc;
    if (g->lease != 0 && journal_owner(g->base, inc)) retire(g, inc);
    if (g->reading) journal_detach(&g->jc);
    g->reading = false;
    if (g->pidfd >= 0) close(g->pidfd);
    g->pidfd = -1;
    g->lease = 0;
}

void guard_destroy(guard *g)
{
    if (g == NULL) return;
    stop_backup(g);
    end_lease(g);
    kvcr__ucx_ahead_free(g->ucx_ahead);
    if (g->configured) mirror_destroy(&g->mir);
    if (g->listener >= 0) close(g->listener);
    if (g->base) pool_unmap(g->base, g->mapping_bytes);
    pool_file_remove(&g->file);
    free(g);
}

/* ---- the mirror ---------------------------------------------------------------------- */

static void lose_recovery(guard *g, const char *why)
{
    if (g->mirror_ok)
        kvcr_log(g->t->log, KVCR_LOG_WARN,
                 "guard %u: pool recovery disabled (%s); claimable, but cold if this owner dies",
                 g->index, why);
    g->mirror_ok = false;
    g->recovery_lost++;
    mirror_clear(&g->mir);
    if (g->reading) journal_detach(&g->jc);
    g->reading = false;
}

/* Applies up to max frames; true when more are waiting. */
static bool read_journal(guard *g, unsigned max)
{
    if (!g->reading) return false;
    for (unsigned n = 0; n < max; n++) {
        jrec r;
        int rc = journal_read_next(&g->jc, &r);
        if (rc == 0) return false;
        if (rc < 0 || (rc = mirror_apply(&g->mir, &r)) != 0) {
            if (rc != KVCR_EPROTO) journal_invalidate(&g->jc);
            lose_recovery(g, kvcr_last_error());
            return false;
        }
    }
    return true;
}

static void drain_journal(guard *g)
{
    /* The writer is gone or done: an empty ring is complete. Bounded by
     * the ring's size over the smallest frame. */
    for (uint64_t i = 0; i < g->t->journal_bytes / 32 && read_journal(g, FRAMES_PER_TICK); i++) {
    }
}

/* Formats the journal and writes the mirror into it, one PUT per block,
 * then reads it as the consumer from the start (the owner's frames follow
 * these). A mirror that does not fit goes cold. */
static void compact(guard *g)
{
    uint64_t kv_seq = journal_kv_seq(g->base); /* the group's stream goes on */
    journal_format(g->base, g->t->journal_bytes, g->generation);
    journal_set_kv_seq(g->base, kv_seq);
    recovered_block *list = NULL;
    size_t n = 0;
    journal jp;
    int rc = g->mirror_ok ? mirror_collect(&g->mir, &list, &n) : 0;
    if (rc == 0 && n > 0) rc = journal_attach_producer(&jp, g->base, g->t->journal_bytes, g->generation);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        jrec r = {JREC_PUT, list[i].key, list[i].key_len, list[i].pool, list[i].slot, false, 0};
        r.has_hash = mirror_router_hash(&g->mir, r.key, r.key_len, &r.router_hash);
        r.tenant = list[i].tenant;
        r.tenant_len = list[i].tenant_len;
        r.meta = list[i].meta;
        r.meta_len = list[i].meta_len;
        rc = journal_publish(&jp, &r);
    }
    if (n > 0 && rc != KVCR_ENOMEM) journal_detach(&jp);
    free(list);
    if (rc != 0) {
        kvcr_log(g->t->log, KVCR_LOG_WARN, "guard %u: %zu block(s) do not fit the journal (%s): "
                 "the new owner starts cold", g->index, n, kvcr_last_error());
        journal_format(g->base, g->t->journal_bytes, g->generation);
        journal_set_kv_seq(g->base, kv_seq);
        mirror_clear(&g->mir);
        n = 0;
    }
    journal_set_retired(g->base, g->retired, g->n_retired); /* what the next owner answers for */
    g->recovered = n;
    g->mirror_ok = true;
    g->reading = journal_attach_consumer(&g->jc, g->base, g->t->journal_bytes, g->generation) == 0;
    if (!g->reading) lose_recovery(g, kvcr_last_error());
}

/* ---- claims -------------------------------------------------------------------------- */

static int refuse(guard *g, int rc)
{
    g->refusals++;
    return rc;
}

static void endpoint_text(char *buf, size_t cap, const char *host, uint32_t port)
{
    if (host[0] == '\0')
        snprintf(buf, cap, "no control endpoint");
    else
        snprintf(buf, cap, "%s:%u", host, port);
}

/* The first claim fixes the layout and the endpoint; later ones must match. */
static int check_terms(guard *g, const svc_msg *c)
{
    if (c->n_pools != g->t->n_pools)
        return kvcr_fail(KVCR_EREFUSED, "pool layout must match the number of pools in the Guard "
                         "(%u, not %u)", g->t->n_pools, c->n_pools);
    for (uint32_t i = 0; i < c->n_pools; i++)
        if (c->pools[i].block_size > g->t->pool_bytes[i])
            return kvcr_fail(KVCR_EREFUSED, "pool %u of %llu bytes cannot hold one complete KV "
                             "block of %llu bytes", i, (unsigned long long)g->t->pool_bytes[i],
                             (unsigned long long)c->pools[i].block_size);
    if (!g->configured) return 0;
    for (uint32_t i = 0; i < c->n_pools; i++)
        if (strcmp(c->pools[i].name, g->layouts[i].name) != 0 ||
            c->pools[i].block_size != g->layouts[i].block_size)
            return kvcr_fail(KVCR_EREFUSED, "KVCR pool was claimed with another tier configuration");
    /* The port as first asked for, or as bound (a claimant that asked for
     * any port and was told P may ask for P). */
    bool same_port = c->control_port == g->requested_port || (g->port && c->control_port == g->port);
    if (strcmp(c->control_host, g->host) != 0 || !same_port) {
        char was[SVC_HOST_MAX + 16], now[SVC_HOST_MAX + 16];
        endpoint_text(was, sizeof was, g->host, g->port);
        endpoint_text(now, sizeof now, c->control_host, c->control_port);
        return kvcr_fail(KVCR_EREFUSED, "KVCR Guard %u answers on %s and cannot be moved to %s",
                         g->index, was, now);
    }
    return 0;
}

static int bind_listener(guard *g, const char *host, uint32_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return kvcr_fail(KVCR_EREFUSED, "control host %s is not a literal IPv4 address", host);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    socklen_t len = sizeof sa;
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 256) != 0 ||
        getsockname(s, (struct sockaddr *)&sa, &len) != 0) {
        int err = errno;
        if (s >= 0) close(s);
        return kvcr_fail(KVCR_EREFUSED, "KVCR Guard %u control listener %s:%u is unavailable: %s",
                         g->index, host, port, strerror(err));
    }
    g->listener = s;
    g->port = ntohs(sa.sin_port);
    return 0;
}

static int configure(guard *g, const svc_msg *c)
{
    uint64_t slots[KVCR_MAX_POOLS];
    for (uint32_t i = 0; i < c->n_pools; i++) slots[i] = g->t->pool_bytes[i] / c->pools[i].block_size;
    if (c->control_host[0] != '\0') {
        int rc = bind_listener(g, c->control_host, c->control_port);
        if (rc != 0) return rc;
    }
    if (mirror_init(&g->mir, c->n_pools, slots) != 0) {
        if (g->listener >= 0) close(g->listener);
        g->listener = -1;
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    g->n_pools = c->n_pools;
    memcpy(g->layouts, c->pools, c->n_pools * sizeof *c->pools);
    snprintf(g->host, sizeof g->host, "%s", c->control_host);
    g->requested_port = c->control_port;
    g->mirror_ok = true;
    g->configured = true;
    return 0;
}

/* The claimant that fixed the terms never started: nothing depends on
 * them, and the next claim may fix others. */
static void unconfigure(guard *g)
{
    if (g->listener >= 0) close(g->listener);
    g->listener = -1;
    kvcr__ucx_ahead_free(g->ucx_ahead);
    g->ucx_ahead = NULL;
    g->port = 0;
    mirror_destroy(&g->mir);
    g->configured = false;
    g->terms_lease = 0;
    kvcr_log(g->t->log, KVCR_LOG_INFO, "guard %u: its first claimant never started; the group "
             "takes the terms of its next claim", g->index);
}

static bool pidfd_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void fill_grant(const guard *g, svc_msg *grant)
{
    memset(grant, 0, sizeof *grant);
    grant->type = SVC_GRANTED;
    grant->guard_index = g->index;
    grant->generation = g->generation;
    grant->mapping_bytes = g->mapping_bytes;
    grant->journal_bytes = g->t->journal_bytes;
    grant->n_pools = g->n_pools;
    for (uint32_t i = 0; i < g->n_pools; i++) {
        grant->pools[i] = g->layouts[i];
        grant->pools[i].offset = g->offset[i];
        grant->pools[i].size = g->t->pool_bytes[i];
    }
    grant->control_port = g->port;
    grant->recovered = g->recovered;
}

int guard_claim(guard *g, const svc_msg *c, int pidfd, svc_msg *grant, int *fds, size_t *n_fds,
                uint64_t *lease)
{
    int rc = 0;
    if (g->phase == PH_PRIMARY && pidfd_exited(g->pidfd)) guard_on_death(g);
    if (g->phase == PH_FAILED)
        rc = kvcr_fail(KVCR_EREFUSED, "KVCR Guard %u failed: %s", g->index, g->failure);
    else if (g->phase == PH_PRIMARY)
        rc = kvcr_fail(KVCR_EREFUSED, "KVCR Guard %u is held by another worker (%s)", g->index,
                       g->agent);
    if (rc == 0) rc = check_terms(g, c);
    bool first = !g->configured;
    if (rc == 0 && first) rc = configure(g, c);
    fds[0] = fds[1] = -1;
    if (rc == 0 && ((fds[0] = fcntl(g->file.fd, F_DUPFD_CLOEXEC, 0)) < 0 ||
                    (g->listener >= 0 && (fds[1] = fcntl(g->listener, F_DUPFD_CLOEXEC, 0)) < 0)))
        rc = kvcr_fail(KVCR_ESYS, "dup: %s", strerror(errno));
    if (rc != 0) {
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0) close(fds[i]);
        close(pidfd);
        return refuse(g, rc);
    }
    /* Everything that can refuse has passed: the group moves. */
    g->resumable = g->phase == PH_SERVING;
    if (g->phase == PH_SERVING) {
        stop_backup(g);
        g->handbacks++;
    }
    compact(g);
    g->phase = PH_PRIMARY;
    g->pidfd = pidfd;
    g->lease = g->next_lease++;
    g->ucx_ahead_tried = false; /* a new lease: one more try */
    snprintf(g->agent, sizeof g->agent, "%s", c->agent);
    snprintf(g->kv_endpoint, sizeof g->kv_endpoint, "%s", c->kv_endpoint);
    snprintf(g->kv_replay, sizeof g->kv_replay, "%s", c->kv_replay);
    snprintf(g->kv_topic, sizeof g->kv_topic, "%s", c->kv_topic);
    g->kv_dp_rank = c->kv_dp_rank;
    snprintf(g->kv_medium_dram, sizeof g->kv_medium_dram, "%s", c->kv_medium_dram);
    snprintf(g->kv_medium_g3, sizeof g->kv_medium_g3, "%s", c->kv_medium_g3);
    g->kv_positional = c->kv_positional;
    g->claims++;
    *n_fds = g->listener >= 0 ? 2 : 1;
    fill_grant(g, grant);
    *lease = g->lease;
    g->terms_lease = first ? g->lease : 0;
    kvcr_log(g->t->log, KVCR_LOG_INFO,
             "guard %u: granted to %s (lease %llu), %llu block(s) to recover, control port %u",
             g->index, g->agent, (unsigned long long)g->lease, (unsigned long long)g->recovered,
             g->port);
    return 0;
}

/* ---- release, death, serving ------------------------------------------------------------ */

static void promote(guard *g);

int guard_release(guard *g, uint64_t lease, bool activated)
{
    if (g->phase != PH_PRIMARY || lease != g->lease) return 0; /* stale: death won */
    drain_journal(g);
    end_lease(g);
    g->phase = PH_IDLE;
    kvcr_log(g->t->log, KVCR_LOG_INFO, "guard %u: released by %s (%s), %llu block(s) kept",
             g->index, g->agent, activated ? "activated" : "never activated",
             (unsigned long long)mirror_count(&g->mir));
    if (!activated && g->terms_lease == lease && mirror_count(&g->mir) == 0)
        unconfigure(g);
    else if (!activated && g->resumable)
        promote(g); /* the grant never took over: serve again */
    g->terms_lease = 0;
    return 0;
}

int guard_pidfd(const guard *g)
{
    return g->phase == PH_PRIMARY ? g->pidfd : -1;
}

int guard_backup_fd(const guard *g)
{
    return g->backup ? kvcr_fd(g->backup) : -1;
}

static void fail(guard *g, const char *why)
{
    snprintf(g->failure, sizeof g->failure, "%s", why);
    g->phase = PH_FAILED;
    kvcr_log(g->t->log, KVCR_LOG_ERROR, "guard %u failed: %s", g->index, why);
}

void guard_on_death(guard *g)
{
    if (g->phase != PH_PRIMARY) return;
    g->died_ns = kvcr_now_ns();
    drain_journal(g); /* the writer is dead: what is published is all there is */
    kvcr_log(g->t->log, KVCR_LOG_WARN, "guard %u: owner %s exited; %llu committed block(s) mirrored",
             g->index, g->agent, (unsigned long long)(g->mirror_ok ? mirror_count(&g->mir) : 0));
    end_lease(g);
    g->phase = PH_IDLE;
    g->resumable = false;
    promote(g);
}

static void guard_log_sink(void *ud, kvcr_log_level level, const char *message)
{
    const guard *g = ud;
    kvcr_log(g->t->log, level, "guard %u backup: %s", g->index, message);
}

/* The backup's key adapter: the router hash the owner journalled with the
 * block. Called by the backup (its poll on the Guard's thread, its progress
 * thread) while the mirror does not change: nobody writes the journal
 * while the Guard serves. */
static int backup_key_hash(void *ud, const kvcr_key *key, uint64_t *hash)
{
    const guard *g = ud;
    return mirror_router_hash(&g->mir, key->data, key->len, hash) ? 0 : 1;
}

/* The backup's publisher thread: the group's stream goes on from here when
 * the owner comes back. The mapping outlives the backup. */
static void backup_kv_seq(void *ud, uint64_t next_seq)
{
    const guard *g = ud;
    journal_set_kv_seq(g->base, next_seq);
}

/* The backup speaks for the owner to routers: its KV events on the owner's
 * endpoint, topic and rank, with its media and form, numbered on from the
 * owner's last batch. Its stream starts with AllBlocksCleared (what the
 * owner announced and the Guard does not serve is gone), then the blocks it
 * serves. */
static void backup_events(guard *g, kvcr_config *c, kvcr_boot *boot)
{
    if (g->kv_endpoint[0] == '\0') return;
    c->callbacks.key_hash = backup_key_hash;
    c->kv_events.endpoint = g->kv_endpoint;
    c->kv_events.replay_endpoint = g->kv_replay[0] ? g->kv_replay : NULL;
    c->kv_events.topic = g->kv_topic;
    c->kv_events.dp_rank = g->kv_dp_rank;
    c->kv_events.medium_dram = g->kv_medium_dram;
    c->kv_events.medium_g3 = g->kv_medium_g3;
    c->kv_events.legacy_positional = g->kv_positional;
    boot->kv_first_seq = journal_kv_seq(g->base); /* the dead owner stored it before each send */
    boot->kv_numbered = backup_kv_seq;
    boot->kv_numbered_ud = g;
}

/* The backup instance: the group's pools at the Guard's own mapping, the
 * mirrored blocks installed, the owner's endpoint, a new agent name (peers
 * never mistake it for the dead one), nothing of the framework's; with
 * events, the owner's KV events. */
static int create_backup(guard *g, const recovered_block *list, size_t n, bool events)
{
    kvcr_pool_layout layouts[KVCR_MAX_POOLS];
    kvcr_dram_pool pools[KVCR_MAX_POOLS];
    for (uint32_t i = 0; i < g->n_pools; i++) {
        layouts[i] = (kvcr_pool_layout){g->layouts[i].name, g->layouts[i].block_size};
        pools[i] = (kvcr_dram_pool){g->layouts[i].name, g->base + g->offset[i], g->t->pool_bytes[i]};
    }
    uint32_t tag = 0;
    if (getrandom(&tag, sizeof tag, 0) != sizeof tag) tag = (uint32_t)kvcr_now_ns();
    snprintf(g->backup_agent, sizeof g->backup_agent, "kvcr-guard-%u-%08x", g->index, tag);
    kvcr_config c;
    kvcr_config_init(&c);
    c.agent_name = g->backup_agent;
    c.pool_layouts = layouts;
    c.n_pool_layouts = g->n_pools;
    c.local_dram = pools;
    c.n_local_dram = g->n_pools;
    c.remote.enabled = true;
    c.remote.control_host = g->host;
    c.remote.control_port = g->port;
    c.callbacks.log = guard_log_sink;
    c.callbacks.ud = g;
    kvcr_boot boot = {.blocks = list, .n_blocks = n, .role = "guard",
                      .retired = (const uint8_t (*)[KVCR_INC_LEN])g->retired,
                      .n_retired = g->n_retired};
    if (events) backup_events(g, &c, &boot);
    boot.control_listener = fcntl(g->listener, F_DUPFD_CLOEXEC, 0);
    if (boot.control_listener < 0) return kvcr_fail(KVCR_ESYS, "dup: %s", strerror(errno));
    boot.ucx = g->ucx_ahead; /* consumed */
    g->ucx_ahead = NULL;
    return kvcr__create(&c, &boot, &g->backup);
}

/* Serving does not wait for KV events: a backup whose events cannot start
 * (the owner's endpoint taken) serves without them. */
static int start_backup(guard *g, const recovered_block *list, size_t n)
{
    int rc = create_backup(g, list, n, g->kv_endpoint[0] != '\0');
    if (rc == 0 || g->kv_endpoint[0] == '\0') return rc;
    kvcr_log(g->t->log, KVCR_LOG_WARN, "guard %u: serving without KV events: %s", g->index,
             kvcr_last_error());
    return create_backup(g, list, n, false);
}

/* Serves what the mirror holds, on the owner's endpoint. Without an
 * endpoint there is nobody to serve: the mirror waits for the next owner. */
static void promote(guard *g)
{
    if (g->listener < 0) return;
    uint64_t t0 = kvcr_now_ns();
    recovered_block *list = NULL;
    size_t n = 0;
    int rc = g->mirror_ok ? mirror_collect(&g->mir, &list, &n) : 0;
    if (rc == 0) rc = start_backup(g, list, n);
    free(list);
    if (rc != 0) {
        char why[300];
        snprintf(why, sizeof why, "cannot start serving: %s", kvcr_last_error());
        fail(g, why);
        return;
    }
    g->phase = PH_SERVING;
    g->promotions++;
    g->last_promotion_s = (double)(kvcr_now_ns() - (g->died_ns ? g->died_ns : t0)) / 1e9;
    kvcr_log(g->t->log, KVCR_LOG_INFO,
             "KVCR_EVENT guard_promoted guard=%u recovered_blocks=%zu agent=%s control=%s:%u "
             "promotion_ms=%.1f", g->index, n, g->backup_agent, g->host, g->port,
             g->last_promotion_s * 1e3);
}

/* While an owner lives: the backup's UCX context, made once per lease
 * (without one, a promotion makes its own). Service thread. */
static void make_ucx_ahead(guard *g)
{
    if (g->listener < 0 || g->ucx_ahead != NULL || g->ucx_ahead_tried) return;
    g->ucx_ahead_tried = true;
    if (kvcr__ucx_ahead(g->t->log, &g->ucx_ahead) != 0)
        kvcr_log(g->t->log, KVCR_LOG_WARN, "guard %u: no UCX context made ahead (%s): a "
                 "promotion starts UCX itself", g->index, kvcr_last_error());
}

bool guard_tick(guard *g)
{
    if (g->phase == PH_PRIMARY) {
        make_ucx_ahead(g);
        return read_journal(g, FRAMES_PER_TICK);
    }
    if (g->phase == PH_SERVING && g->backup) {
        kvcr_op_result *done = NULL;
        size_t n = 0;
        /* The backup makes no requests of its own; polling runs its
         * bookkeeping (claims released after each write). */
        if (kvcr_poll(g->backup, &done, &n) == 0) kvcr_results_free(done);
    }
    return false;
}

void guard_get_figures(const guard *g, guard_figures *out)
{
    *out = (guard_figures){
        .phase = (unsigned)g->phase,
        .claims = g->claims,
        .refusals = g->refusals,
        .promotions = g->promotions,
        .handbacks = g->handbacks,
        .recovery_lost = g->recovery_lost,
        .mirrored_blocks = g->configured && g->mirror_ok ? mirror_count(&g->mir) : 0,
        .pool_bytes = g->mapping_bytes,
        .last_promotion_s = g->last_promotion_s,
    };
}

const char *guard_phase_name(unsigned i)
{
    return i < sizeof phase_names / sizeof phase_names[0] ? phase_names[i] : NULL;
}
