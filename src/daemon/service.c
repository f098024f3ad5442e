#define _GNU_SOURCE /* accept4, struct ucred */
#include "daemon/service.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/frame.h"
#include "client/journal.h"
#include "client/pool.h"
#include "daemon/guard.h"
#include "daemon/metrics_http.h"
#include "util/clock.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif

#define MAX_CONNS 256
#define MAX_GUARDS 1024
#define IDLE_CLAIM_NS (30ull * 1000000000ull) /* a connection must claim within 30 s */
#define READ_TIMEOUT_MS 1000                  /* per read, once a frame has begun */

typedef struct conn {
    int fd;
    uint64_t deadline_ns; /* until it holds a lease; 0 after */
    int guard;            /* the group it holds, or -1 */
    uint64_t lease;
} conn;

typedef struct service {
    const svc_options *o;
    const kvcr_logger *log;
    guard_terms terms;
    guard **guards;
    int listen_fd;
    dev_t sock_dev;
    ino_t sock_ino;
    conn conns[MAX_CONNS];
    unsigned n_conns;
    uint64_t frames_refused, started_ns;
    svc_http *http; /* the metrics listener, or NULL */
} service;

/* ---- start-up ---------------------------------------------------------------------- */

static int check_pidfd_support(void)
{
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (fd < 0)
        return kvcr_fail(KVCR_ENOTSUP, "KVCR service requires pidfd_open (Linux 5.3+): %s",
                         strerror(errno));
    close(fd);
    return 0;
}

static int check_options(const svc_options *o)
{
    struct sockaddr_un sa;
    if (o->socket_path == NULL || o->socket_path[0] == '\0' ||
        strlen(o->socket_path) >= sizeof sa.sun_path)
        return kvcr_fail(KVCR_EINVAL, "--socket-path must be 1..%zu bytes",
                         sizeof sa.sun_path - 1);
    struct stat st;
    if (o->pool_dir == NULL || stat(o->pool_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return kvcr_fail(KVCR_EINVAL, "--pool-dir must be an existing directory");
    if (o->digest == NULL || o->digest[0] == '\0' || strlen(o->digest) > SVC_DIGEST_MAX)
        return kvcr_fail(KVCR_EINVAL, "--compatibility-digest must be 1..%d bytes",
                         SVC_DIGEST_MAX);
    if (o->guard_count < 1 || o->guard_count > MAX_GUARDS)
        return kvcr_fail(KVCR_EINVAL, "--guard-count must be 1..%d", MAX_GUARDS);
    if (o->n_pools < 1 || o->n_pools > KVCR_MAX_POOLS)
        return kvcr_fail(KVCR_EINVAL, "--pool-sizes-gb must list 1..%d sizes", KVCR_MAX_POOLS);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), total = o->journal_bytes;
    for (uint32_t i = 0; i < o->n_pools; i++) {
        if (o->pool_bytes[i] < page || o->pool_bytes[i] % page != 0)
            return kvcr_fail(KVCR_EINVAL, "pool size %u must be a positive multiple of %llu bytes",
                             i, (unsigned long long)page);
        if (o->pool_bytes[i] > INT64_MAX - total)
            return kvcr_fail(KVCR_EINVAL, "the pool sizes add up to more than 2^63 bytes");
        total += o->pool_bytes[i];
    }
    if (o->journal_bytes < JOURNAL_MIN_BYTES || o->journal_bytes % 4096 != 0)
        return kvcr_fail(KVCR_EINVAL, "the journal must be a multiple of 4096 bytes, at least %u",
                         JOURNAL_MIN_BYTES);
    return check_pidfd_support();
}

/* A socket file left by a service that died is removed; one that answers
 * belongs to a live service, and this one refuses to start. */
static int clear_stale_socket(const service *s)
{
    const char *path = s->o->socket_path;
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0; /* bind reports the rest */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return kvcr_fail(KVCR_ESYS, "socket: %s", strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa), err = errno;
    close(fd);
    if (rc == 0)
        return kvcr_fail(KVCR_EBUSY, "another KVCR service is listening on %s", path);
    if (err != ECONNREFUSED && err != ENOENT)
        return kvcr_fail(KVCR_ESYS, "socket %s is not usable: %s", path, strerror(err));
    kvcr_log(s->log, KVCR_LOG_WARN, "removing the stale socket %s", path);
    unlink(path);
    return 0;
}

static int listen_socket(service *s)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", s->o->socket_path);
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->listen_fd < 0) return kvcr_fail(KVCR_ESYS, "socket: %s", strerror(errno));
    mode_t old = umask(0177); /* the socket is the owner's alone: mode 0600 */
    int rc = bind(s->listen_fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    struct stat st;
    if (rc != 0 || listen(s->listen_fd, 64) != 0 || stat(sa.sun_path, &st) != 0)
        return kvcr_fail(KVCR_ESYS, "cannot listen on %s: %s", sa.sun_path, strerror(errno));
    s->sock_dev = st.st_dev;
    s->sock_ino = st.st_ino;
    return 0;
}

static int create_guards(service *s)
{
    s->guards = calloc(s->o->guard_count, sizeof *s->guards);
    if (s->guards == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < s->o->guard_count; i++) {
        int rc = guard_create(&s->terms, i, &s->guards[i]);
        if (rc != 0) return rc; /* shutdown() gives back the ones made */
    }
    return 0;
}

/* ---- shutdown --------------------------------------------------------------------------- */

static void close_conn(service *s, unsigned i)
{
    close(s->conns[i].fd);
    s->conns[i] = s->conns[--s->n_conns];
}

static void shutdown_service(service *s)
{
    svc_http_close(s->http);
    while (s->n_conns > 0) close_conn(s, s->n_conns - 1);
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        struct stat st; /* only our own socket file: a successor may have replaced it */
        if (stat(s->o->socket_path, &st) == 0 && st.st_dev == s->sock_dev &&
            st.st_ino == s->sock_ino)
            unlink(s->o->socket_path);
    }
    for (uint32_t i = 0; s->guards && i < s->o->guard_count; i++) guard_destroy(s->guards[i]);
    free(s->guards);
}

/* ---- one connection ------------------------------------------------------------------ */

/* The claimant's liveness: the kernel's pidfd of the socket's peer where
 * the kernel has SO_PEERPIDFD, else the pidfd it sent, which must name the
 * process at the other end of the socket. */
static int fdinfo_pid(int fd)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "re");
    if (f == NULL) return -1;
    int pid = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Pid:", 4) == 0) pid = atoi(line + 4);
    fclose(f);
    return pid;
}

static int peer_pidfd(int sock, int sent, int *out)
{
    int pidfd = -1;
    socklen_t len = sizeof pidfd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0) {
        if (sent >= 0) close(sent);
        *out = pidfd;
        return 0;
    }
    if (errno != ENOPROTOOPT && errno != EINVAL) {
        int err = errno;
        if (sent >= 0) close(sent);
        return kvcr_fail(KVCR_ESYS, "SO_PEERPIDFD: %s", strerror(err));
    }
    if (sent < 0)
        return kvcr_fail(KVCR_EREFUSED, "worker pidfd is required without SO_PEERPIDFD");
    struct ucred cred;
    len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        fdinfo_pid(sent) != cred.pid || cred.pid <= 0) {
        close(sent);
        return kvcr_fail(KVCR_EREFUSED, "worker pidfd does not match socket peer");
    }
    *out = sent;
    return 0;
}

static int reply_error(int fd, const char *why)
{
    svc_msg m = {.type = SVC_ERROR};
    m.text = (char *)why;
    return svc_send(fd, &m, NULL, 0);
}

static void on_claim(service *s, conn *c, const svc_msg *m, int sent_pidfd)
{
    int pidfd = -1, rc = 0;
    if (c->guard >= 0)
        rc = kvcr_fail(KVCR_EREFUSED, "this connection already holds guard %d", c->guard);
    if (rc == 0 && strcmp(m->digest, s->o->digest) != 0)
        rc = kvcr_fail(KVCR_EREFUSED, "KVCR compatibility digest does not match the service");
    if (rc == 0 && m->guard_index >= s->o->guard_count)
        rc = kvcr_fail(KVCR_EREFUSED, "guard_index %u is out of range [0, %u)", m->guard_index,
                       s->o->guard_count);
    if (rc == 0) rc = peer_pidfd(c->fd, sent_pidfd, &pidfd);
    else if (sent_pidfd >= 0) close(sent_pidfd);
    svc_msg *grant = rc == 0 ? malloc(sizeof *grant) : NULL;
    if (rc == 0 && grant == NULL) {
        close(pidfd);
        rc = kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    int fds[SVC_MAX_FDS];
    size_t n_fds = 0;
    uint64_t lease = 0;
    if (rc == 0) rc = guard_claim(s->guards[m->guard_index], m, pidfd, grant, fds, &n_fds, &lease);
    if (rc != 0) {
        kvcr_log(s->log, KVCR_LOG_INFO, "claim of guard %u by %s refused: %s", m->guard_index,
                 m->agent, kvcr_last_error());
        reply_error(c->fd, rc == KVCR_ENOMEM || rc == KVCR_ESYS ? "internal KVCR service error"
                                                                : kvcr_last_error());
        free(grant);
        return;
    }
    c->guard = (int)m->guard_index;
    c->lease = lease;
    c->deadline_ns = 0; /* a held connection has no timeout; the lease outlives it */
    if (svc_send(c->fd, grant, fds, n_fds) != 0) /* the claimant may have it: keep the lease */
        kvcr_log(s->log, KVCR_LOG_WARN, "guard %u: the grant could not be sent (%s); the lease "
                 "stands until %s releases it or exits", m->guard_index, kvcr_last_error(),
                 m->agent);
    for (size_t i = 0; i < n_fds; i++) close(fds[i]);
    free(grant);
}

static void on_release(service *s, conn *c, const svc_msg *m)
{
    if (c->guard < 0) {
        reply_error(c->fd, "release without a claim");
        return;
    }
    guard_release(s->guards[c->guard], c->lease, m->activated);
    c->guard = -1;
    c->lease = 0;
    svc_msg ok = {.type = SVC_RELEASED};
    svc_send(c->fd, &ok, NULL, 0);
}

/* ---- metrics --------------------------------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void service_families(FILE *f, const service *s)
{
    family(f, "kvcr_service_up", "gauge", "1 while the KVCR service runs.");
    fprintf(f, "kvcr_service_up 1\n");
    family(f, "kvcr_service_uptime_seconds", "gauge", "Seconds since the KVCR service started.");
    fprintf(f, "kvcr_service_uptime_seconds %.3f\n",
            (double)(kvcr_now_ns() - s->started_ns) / 1e9);
    family(f, "kvcr_service_guards", "gauge", "Pool groups of the KVCR service, a Guard each.");
    fprintf(f, "kvcr_service_guards %u\n", s->o->guard_count);
    family(f, "kvcr_service_connections", "gauge", "Open connections on the claim socket.");
    fprintf(f, "kvcr_service_connections %u\n", s->n_conns);
    family(f, "kvcr_service_frames_refused_total", "counter",
           "Claim socket frames refused for breaking the protocol.");
    fprintf(f, "kvcr_service_frames_refused_total %llu\n", (unsigned long long)s->frames_refused);
    if (s->http == NULL) return;
    family(f, "kvcr_service_http_requests_total", "counter",
           "Requests to the metrics listener by answer status (400 and 431: malformed).");
    const svc_http_count *n;
    for (size_t i = 0, k = svc_http_counts(s->http, &n); i < k; i++)
        fprintf(f, "kvcr_service_http_requests_total{code=\"%d\"} %llu\n", n[i].code,
                (unsigned long long)n[i].n);
}

/* The Guards' families whose value is a uint64_t field of guard_figures. */
static const struct {
    const char *name, *type, *help;
    size_t at;
} guard_counts[] = {
    {"kvcr_guard_claims_total", "counter", "Claims of the group granted.",
     offsetof(guard_figures, claims)},
    {"kvcr_guard_refusals_total", "counter", "Claims of the group refused.",
     offsetof(guard_figures, refusals)},
    {"kvcr_guard_promotions_total", "counter",
     "Times the Guard started serving the group after its owner died.",
     offsetof(guard_figures, promotions)},
    {"kvcr_guard_handbacks_total", "counter",
     "Times the Guard handed a served group back to a claimant.",
     offsetof(guard_figures, handbacks)},
    {"kvcr_guard_recovery_lost_total", "counter",
     "Times the Guard could no longer vouch for the group's recovery record.",
     offsetof(guard_figures, recovery_lost)},
    {"kvcr_guard_mirrored_blocks", "gauge", "Committed blocks the Guard would serve now.",
     offsetof(guard_figures, mirrored_blocks)},
    {"kvcr_guard_pool_bytes", "gauge", "Bytes of the group's mapping (journal and pools).",
     offsetof(guard_figures, pool_bytes)},
};

/* Family by family (Prometheus wants a family's samples together), each
 * Guard's sample in it. */
static void guard_families(FILE *f, const guard_figures *g, uint32_t n)
{
    family(f, "kvcr_guard_phase", "gauge", "1 for the Guard's current phase, 0 for the others.");
    for (uint32_t i = 0; i < n; i++)
        for (unsigned p = 0; guard_phase_name(p) != NULL; p++)
            fprintf(f, "kvcr_guard_phase{guard=\"%u\",phase=\"%s\"} %d\n", i,
                    guard_phase_name(p), g[i].phase == p);
    for (size_t k = 0; k < sizeof guard_counts / sizeof guard_counts[0]; k++) {
        family(f, guard_counts[k].name, guard_counts[k].type, guard_counts[k].help);
        for (uint32_t i = 0; i < n; i++) {
            const uint64_t *v = (const uint64_t *)((const char *)&g[i] + guard_counts[k].at);
            fprintf(f, "%s{guard=\"%u\"} %llu\n", guard_counts[k].name, i, (unsigned long long)*v);
        }
    }
    family(f, "kvcr_guard_last_promotion_seconds", "gauge",
           "Seconds from the owner's death to serving, at the last promotion.");
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, "kvcr_guard_last_promotion_seconds{guard=\"%u\"} %.6f\n", i,
                g[i].last_promotion_s);
}

/* The service's metrics (a service *): a malloc'd text, NULL when out of memory. */
static char *metrics_text(const void *arg)
{
    const service *s = arg;
    guard_figures *g = calloc(s->o->guard_count, sizeof *g);
    char *text = NULL;
    size_t len = 0;
    FILE *f = g ? open_memstream(&text, &len) : NULL;
    if (f == NULL) {
        free(g);
        return NULL;
    }
    for (uint32_t i = 0; i < s->o->guard_count; i++) guard_get_figures(s->guards[i], &g[i]);
    service_families(f, s);
    guard_families(f, g, s->o->guard_count);
    bool failed = ferror(f) != 0; /* a write the stream could not grow for */
    if (fclose(f) != 0 || failed) {
        free(text);
        text = NULL;
    }
    free(g);
    return text;
}

static void on_stats(service *s, conn *c)
{
    svc_msg m = {.type = SVC_METRICS};
    m.text = metrics_text(s);
    if (m.text == NULL)
        reply_error(c->fd, "internal KVCR service error");
    else
        svc_send(c->fd, &m, NULL, 0);
    free(m.text);
}

/* Reads and handles one message; false when the connection is done. */
static bool on_readable(service *s, conn *c)
{
    svc_msg *m = malloc(sizeof *m);
    if (m == NULL) return false;
    int fds[1];
    size_t n_fds = 0;
    int rc = svc_recv(c->fd, m, fds, 1, &n_fds, READ_TIMEOUT_MS);
    if (rc != 0) { /* EOF, a socket error, or bytes that break the protocol */
        if (rc == KVCR_EPROTO) {
            s->frames_refused++;
            kvcr_log(s->log, KVCR_LOG_WARN, "claim socket: %s", kvcr_last_error());
            reply_error(c->fd, kvcr_last_error());
        }
        free(m);
        return false; /* a held lease stays: only a release or death ends it */
    }
    int sent = n_fds ? fds[0] : -1;
    bool keep = true;
    switch (m->type) {
    case SVC_CLAIM: on_claim(s, c, m, sent); sent = -1; break;
    case SVC_RELEASE: on_release(s, c, m); keep = false; break;
    case SVC_STATS: on_stats(s, c); break;
    default: reply_error(c->fd, "unexpected message type"); break;
    }
    if (sent >= 0) close(sent);
    svc_msg_clear(m);
    free(m);
    return keep;
}

static void accept_conns(service *s)
{
    for (int i = 0; i < 64; i++) { /* bounded per turn */
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) return;
        if (s->n_conns == MAX_CONNS) {
            reply_error(fd, "too many connections to the KVCR service");
            close(fd);
            continue;
        }
        s->conns[s->n_conns++] = (conn){fd, kvcr_now_ns() + IDLE_CLAIM_NS, -1, 0};
    }
}

/* ---- the loop ---------------------------------------------------------------------------- */

static int poll_timeout(const service *s, bool backlog)
{
    if (backlog) return 0;
    for (uint32_t i = 0; i < s->o->guard_count; i++)
        if (guard_pidfd(s->guards[i]) >= 0 || guard_backup_fd(s->guards[i]) >= 0) return 2;
    return 200;
}

static void run_turn(service *s, struct pollfd *pf, bool *backlog)
{
    size_t n = 0;
    pf[n++] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    for (unsigned i = 0; i < s->n_conns; i++)
        pf[n++] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
    size_t first_guard = n;
    for (uint32_t i = 0; i < s->o->guard_count; i++)
        pf[n++] = (struct pollfd){.fd = guard_pidfd(s->guards[i]), .events = POLLIN};
    size_t first_http = n;
    if (s->http) n += svc_http_pollfds(s->http, pf + n);
    if (poll(pf, n, poll_timeout(s, *backlog)) < 0 && errno != EINTR) return;
    if (s->http) svc_http_serve(s->http, pf + first_http, metrics_text, s);
    for (uint32_t i = 0; i < s->o->guard_count; i++)
        if (pf[first_guard + i].fd >= 0 && (pf[first_guard + i].revents & POLLIN))
            guard_on_death(s->guards[i]);
    uint64_t now = kvcr_now_ns();
    for (unsigned i = s->n_conns; i-- > 0;) {
        conn *c = &s->conns[i];
        short ev = pf[1 + i].revents;
        bool keep = !(ev & (POLLIN | POLLHUP | POLLERR)) || on_readable(s, c);
        if (keep && c->deadline_ns && now > c->deadline_ns) keep = false;
        if (!keep) close_conn(s, i);
    }
    if (pf[0].revents & POLLIN) accept_conns(s);
    *backlog = false;
    for (uint32_t i = 0; i < s->o->guard_count; i++) *backlog |= guard_tick(s->guards[i]);
}

int svc_serve(const svc_options *o, const kvcr_logger *log, volatile sig_atomic_t *stop)
{
    int rc = check_options(o);
    if (rc != 0) return rc;
    service *s = calloc(1, sizeof *s);
    struct pollfd *pf = calloc(1 + MAX_CONNS + o->guard_count + SVC_HTTP_POLLFDS, sizeof *pf);
    if (s == NULL || pf == NULL) {
        free(s);
        free(pf);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    s->o = o;
    s->log = log;
    s->listen_fd = -1;
    s->started_ns = kvcr_now_ns();
    s->terms = (guard_terms){o->pool_dir, o->digest, o->n_pools, {0}, o->journal_bytes, log};
    memcpy(s->terms.pool_bytes, o->pool_bytes, sizeof o->pool_bytes);
    rc = clear_stale_socket(s);
    if (rc == 0) {
        int purged = pool_purge_orphans(o->pool_dir, log);
        if (purged > 0) kvcr_log(log, KVCR_LOG_WARN, "removed %d orphaned pool file(s)", purged);
        if (purged < 0) /* not fatal: creating the new files will say what is wrong */
            kvcr_log(log, KVCR_LOG_WARN, "no orphan purge in %s: %s", o->pool_dir,
                     kvcr_last_error());
        rc = create_guards(s);
    }
    if (rc == 0 && o->metrics_listen) rc = svc_http_listen(o->metrics_listen, log, &s->http);
    if (rc == 0) rc = listen_socket(s); /* last: nobody can claim a half-built service */
    if (rc == 0) {
        kvcr_log(log, KVCR_LOG_INFO, "KVCR service ready: socket=%s guards=%u pools=%u "
                 "journal_bytes=%llu", o->socket_path, o->guard_count, o->n_pools,
                 (unsigned long long)o->journal_bytes);
        bool backlog = false;
        while (!*stop) run_turn(s, pf, &backlog);
        kvcr_log(log, KVCR_LOG_INFO, "KVCR service stopping");
    }
    char why[512];
    snprintf(why, sizeof why, "%s", kvcr_last_error());
    shutdown_service(s);
    free(s);
    free(pf);
    return rc == 0 ? 0 : kvcr_fail(rc, "%s", why);
}

/* ---- a client asking for metrics ------------------------------------------------------- */

int svc_fetch_metrics(const char *socket_path, char **text)
{
    *text = NULL;
    int fd, rc = svc_connect(socket_path, &fd);
    if (rc != 0) return rc;
    svc_msg m = {.type = SVC_STATS};
    rc = svc_send(fd, &m, NULL, 0);
    size_t n_fds = 0;
    int fds[SVC_MAX_FDS];
    if (rc == 0) rc = svc_recv(fd, &m, fds, SVC_MAX_FDS, &n_fds, 10000);
    for (size_t i = 0; i < n_fds; i++) close(fds[i]);
    close(fd);
    if (rc == 1) rc = kvcr_fail(KVCR_ESYS, "the KVCR service closed the connection");
    if (rc != 0) return rc;
    if (m.type != SVC_METRICS) {
        rc = kvcr_fail(KVCR_EPROTO, "the KVCR service answered: %s", m.text ? m.text : "?");
        svc_msg_clear(&m);
        return rc;
    }
    *text = m.text;
    return 0;
}
