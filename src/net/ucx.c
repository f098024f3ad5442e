#include "net/ucx.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <ucs/algorithm/crc.h>

#include "kvcr/error.h"
#include "net/amhdr.h"
#include "net/tcpreset.h"
#include "net/ucxaddr.h"
#include "util/clock.h"
#include "util/env.h"

/* Bounds on a worker address from the wire: a header, a worker id and at
 * least a byte; real ones are a few hundred bytes (215 on a host with tcp
 * and shared memory), a few KiB with many RDMA devices. */
#define ADDR_MIN 10
#define ADDR_MAX 8192

/* How long ucx_peer_close waits for the endpoint to close. */
#define CLOSE_TIMEOUT_NS (2ull * 1000 * 1000 * 1000)
/* Keepalive interval unless UCX_KEEPALIVE_INTERVAL is set: how soon a dead
 * peer is noticed when nothing else notices it (UCX's default is 20 s). */
#define KEEPALIVE_INTERVAL "1s"
/* TCP segment sizes unless UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE are
 * set. Across hosts without RDMA, UCX 1.13 emulates our puts with active
 * messages over TCP of at most one TX segment each (8 KiB by default), and
 * the target's worker copies each into place: at UCX's defaults a 2 MiB put
 * between two hosts moves at a fraction of the link (docs/BENCHMARKS.md,
 * "Across hosts"). Larger segments cut the per-message cost. The RX
 * segment must hold a whole TX segment and its header. Only the TCP
 * transport reads these; shared memory and RDMA lanes are untouched. */
#define TCP_TX_SEG_SIZE "128k"
#define TCP_RX_SEG_SIZE "512k"
/* The active message that carries a write's bytes when they go as
 * messages (see ucx.h): its id; its header is net/amhdr.h's. Runs shorter
 * than AM_BATCH_BYTES are gathered, in order, into messages of at most
 * AM_BATCH_BYTES and AMHDR_MAX_RUNS runs: one message per small block
 * costs the sender a request and the receiver a callback each, which with
 * 16 KiB blocks over TCP held them to well under half the rate of 2 MiB
 * blocks (docs/BENCHMARKS.md, "Small blocks"); 64 KiB fits one TCP
 * segment (TCP_TX_SEG_SIZE), so UCX neither fragments nor reassembles it.
 * Longer runs go alone. */
#define AM_WRITE_ID 1
#define AM_BATCH_BYTES (64u << 10)
/* KVCR_UCX_BATCH_BYTES overrides AM_BATCH_BYTES (0: every run alone), for
 * comparisons; at most this. */
#define AM_BATCH_BYTES_MAX (16u << 20)
/* Header bytes a write of n runs needs at most: a tag per message and an
 * entry per run. */
#define AM_HDR_BYTES(n) ((n) * (8 + AMHDR_RUN))

typedef struct write_op write_op;

struct ucx_ctx {
    const kvcr_logger *log;
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;
    uint8_t addr_version;  /* low nibble of our own address's first byte */
    bool rkey_sys_dev;     /* packed rkeys end with a system device byte (UCX >= 1.20) */
    bool shape_known;      /* our own address parsed: peers' are checked deeply */
    ucxaddr_shape shape;
    ucxaddr_tcp tcp;       /* where our own TCP transport listens (from our address) */
    write_op *done_head;   /* finished writes, reported by ucx_progress */
    write_op **done_tail;
    int writes_mode;       /* KVCR_UCX_WRITES: -1 puts, 1 messages, 0 by the lanes */
    ucx_sink *sink;        /* where messages' bytes go (ucx_set_sink) */
    void *sink_arg;
    size_t batch_runs;     /* runs per write message at most (AMHDR_MAX_RUNS) */
    size_t batch_bytes;    /* runs shorter than this are gathered (AM_BATCH_BYTES) */
    /* Messages the sink refused or that were malformed: counted by the
     * progress thread, read by any (ucx_sink_dropped). */
    _Atomic uint64_t sink_dropped;
    /* Writes posted as puts and as messages: counted by the progress
     * thread, read by any (ucx_writes_posted). */
    _Atomic uint64_t writes_put, writes_message;
    /* Endpoints closed by force (ucx_peer_abort) and the TCP connections
     * those aborts reset: counted by the progress thread, read by any
     * (ucx_abort_counts). */
    _Atomic uint64_t aborts, tcp_resets;
};

struct ucx_mem {
    ucx_ctx *c;
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
    uintptr_t base;
    size_t len;
};

struct ucx_peer {
    ucx_ctx *c;
    ucp_ep_h ep;
    bool failed;
    bool messages;  /* writes go as active messages (ucx_peer_messages) */
    bool by_lanes;  /* messages chosen by the lanes, not forced by KVCR_UCX_WRITES */
    uint32_t busy;  /* writes accepted and not yet reported */
    ucxaddr_tcp tcp; /* where its TCP transport listens: reset by ucx_peer_abort */
};

struct ucx_rkey {
    ucx_peer *p;
    ucp_rkey_h rkey;
};

struct write_op {
    write_op *next;
    ucx_peer *p;
    void (*done)(void *ud, int status);
    void *ud;
    uint32_t pending;  /* requests UCX still holds */
    bool posted;       /* ucx_write has returned: pending can only fall */
    int status;
    uint8_t *headers;  /* messages: their headers and iov lists, held until done */
    bool messages;     /* sent as messages (ucx_write_messages), else puts + flush */
};

static ucs_status_t set_write_handler(ucx_ctx *c);

/* ---- completions ---------------------------------------------------------- */

static void queue_done(ucx_ctx *c, write_op *op)
{
    op->next = NULL;
    *c->done_tail = op;
    c->done_tail = &op->next;
}

static void op_fail(write_op *op, ucs_status_t st)
{
    if (op->status == 0)
        kvcr_log(op->p->c->log, KVCR_LOG_INFO, "ucx write failed: %s", ucs_status_string(st));
    op->status = KVCR_ESYS;
}

/* A request of op finished (UCX calls this from ucp_worker_progress, and
 * could from inside a later post of the same write: so it only counts, and
 * the op is queued, never reported, from here). */
static void request_done(void *request, ucs_status_t st, void *user_data)
{
    write_op *op = user_data;
    if (st != UCS_OK) op_fail(op, st);
    if (--op->pending == 0 && op->posted) queue_done(op->p->c, op);
    /* Only here: a request freed earlier would never call back. */
    ucp_request_free(request);
}

/* Reports every queued write; a done callback may write again (queued for
 * the next call) or close a peer it no longer uses. */
static unsigned report_done(ucx_ctx *c)
{
    write_op *op = c->done_head;
    c->done_head = NULL;
    c->done_tail = &c->done_head;
    unsigned n = 0;
    while (op != NULL) {
        write_op *next = op->next;
        op->p->busy--;
        op->done(op->ud, op->status);
        free(op->headers);
        free(op);
        op = next;
        n++;
    }
    return n;
}

/* ---- context -------------------------------------------------------------- */

static int ctx_fail(ucx_ctx *c, const char *what, ucs_status_t st)
{
    int rc = kvcr_fail(KVCR_ESYS, "%s: %s", what, ucs_status_string(st));
    ucx_ctx_destroy(c);
    return rc;
}

/* Whether the comma-separated list names one of names[0..n). */
static bool tls_lists(const char *list, const char *const *names, size_t n_names)
{
    for (size_t i = 0; i < n_names; i++)
        for (const char *at = strstr(list, names[i]); at; at = strstr(at + 1, names[i])) {
            size_t n = strlen(names[i]);
            bool starts = at == list || at[-1] == ',';
            bool ends = at[n] == '\0' || at[n] == ',';
            if (starts && ends) return true;
        }
    return false;
}

/* Whether UCX_TLS leaves shared memory on (UCX warns about a variable no
 * transport reads, e.g. with UCX_TLS=tcp). */
static bool shared_memory_allowed(void)
{
    const char *tls = getenv("UCX_TLS");
    if (tls == NULL || tls[0] == '^') return true; /* default, or an exclusion list */
    static const char *const shm[] = {"all", "sm", "shm", "mm", "posix", "sysv"};
    return tls_lists(tls, shm, sizeof shm / sizeof shm[0]);
}

/* Whether UCX_TLS leaves the TCP transport on. */
static bool tcp_allowed(void)
{
    const char *tls = getenv("UCX_TLS");
    static const char *const tcp[] = {"all", "tcp"};
    if (tls == NULL) return true;
    if (tls[0] == '^') return !tls_lists(tls + 1, tcp, 2);
    return tls_lists(tls, tcp, 2);
}

/* Sets UCX_TCP_<name>_SEG_SIZE to value unless the environment already
 * does (like UCX_MM_ERROR_HANDLING: the environment is process-wide, so
 * only a value nobody chose is filled in); logs the value in force. The
 * UCX_TCP_ prefix reaches the TCP transport only, where a bare
 * ucp_config_modify key ("TX_SEG_SIZE") would reach any transport with a
 * key of that name. */
static void tcp_seg_size(const ucx_ctx *c, const char *name, const char *value)
{
    char var[40];
    snprintf(var, sizeof var, "UCX_TCP_%s_SEG_SIZE", name);
    const char *user = getenv(var);
    if (user == NULL && setenv(var, value, 0) != 0) {
        kvcr_log(c->log, KVCR_LOG_WARN, "ucx: cannot set %s=%s; UCX's default stays", var, value);
        return;
    }
    kvcr_log(c->log, KVCR_LOG_INFO, "ucx: %s=%s (%s)", var, user ? user : value,
             user ? "from the environment" : "KVCR's default for TCP lanes");
}

/* Whether the UCX loaded at run time (which may be another than the headers
 * this was compiled with) is major.minor or later. Any thread, no lock. */
static bool ucx_at_least(unsigned major, unsigned minor)
{
    unsigned ma, mi, rel;
    ucp_get_version(&ma, &mi, &rel);
    return ma > major || (ma == major && mi >= minor);
}

/* UCX 1.13 (and before) asserts, aborting the process, when a TCP
 * connection to a peer fails while one of its connection set-up messages
 * still waits to be sent on it: a peer that dies, or a link that drops,
 * within about a round trip of the first contact between two workers, on
 * either side (docs/ARCHITECTURE.md, "Peer failures over TCP"). Nothing
 * here can catch it, so whoever runs peers over TCP is told once: a
 * warning when TCP is the only transport, else a note. */
static void note_tcp_setup_abort(const ucx_ctx *c)
{
    if (ucx_at_least(1, 14)) return;
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    kvcr_log(c->log, shared_memory_allowed() ? KVCR_LOG_INFO : KVCR_LOG_WARN,
             "ucx %u.%u.%u: a peer reached over TCP that dies, or a link that drops, while UCX "
             "sets up the connection aborts this process (an assertion inside UCX, removed in "
             "later releases); see docs/ARCHITECTURE.md, \"Peer failures over TCP\"",
             major, minor, release);
}

static ucs_status_t read_config(const ucx_ctx *c, ucp_config_t **cfg)
{
    /* Shared memory transports only advertise peer error handling with this
     * set, and endpoints with error handling use only transports that do:
     * without it same-host peers talk over TCP loopback. The environment
     * is process-wide, so only a value nobody chose is filled in. */
    if (shared_memory_allowed()) setenv("UCX_MM_ERROR_HANDLING", "y", 0);
    if (tcp_allowed()) {
        tcp_seg_size(c, "TX", TCP_TX_SEG_SIZE);
        tcp_seg_size(c, "RX", TCP_RX_SEG_SIZE);
        note_tcp_setup_abort(c);
    }
    ucs_status_t st = ucp_config_read(NULL, NULL, cfg);
    if (st != UCS_OK) return st;
    /* A killed same-host peer is only noticed by keepalive (its shared
     * memory stays mapped here), 20 s by default; this context only. */
    if (getenv("UCX_KEEPALIVE_INTERVAL") == NULL)
        (void)ucp_config_modify(*cfg, "KEEPALIVE_INTERVAL", KEEPALIVE_INTERVAL);
    return UCS_OK;
}

/* Learns the layout of our own address, so that peers' can be checked.
 * If it does not parse (another UCX version or UCX_UNIFIED_MODE /
 * UCX_ADDRESS_VERSION settings), only the header and length are checked. */
static void learn_own_address(ucx_ctx *c)
{
    const uint8_t *a = (const uint8_t *)c->addr;
    c->addr_version = a[0] & 0x0f;
    ucxaddr_walk w = {.learn = &c->shape, .tcp = &c->tcp, .tcp_csum = ucs_crc16_string("tcp")};
    c->shape_known = ucxaddr_walk_address(a, c->addr_len, &w) == 0;
    if (!c->shape_known)
        kvcr_log(c->log, KVCR_LOG_WARN,
                 "ucx: own worker address has an unknown layout (%s); peer addresses get only "
                 "basic checks", w.why);
}

/* How many runs one write message may list: AMHDR_MAX_RUNS, or fewer if
 * UCX's limit on an active message's header says so (1: none gathered). */
static ucs_status_t set_batch_runs(ucx_ctx *c)
{
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    ucs_status_t st = ucp_worker_query(c->worker, &wa);
    if (st != UCS_OK) return st;
    size_t fit = wa.max_am_header > 8 ? (wa.max_am_header - 8) / AMHDR_RUN : 0;
    c->batch_runs = fit < 2 ? 1 : fit < AMHDR_MAX_RUNS ? fit : AMHDR_MAX_RUNS;
    c->batch_bytes =
        (size_t)env_bytes(c->log, "KVCR_UCX_BATCH_BYTES", AM_BATCH_BYTES_MAX, AM_BATCH_BYTES);
    return UCS_OK;
}

int ucx_ctx_create(const kvcr_logger *log, ucx_ctx **out)
{
    ucx_ctx *c = calloc(1, sizeof *c);
    if (c == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    c->log = log;
    c->efd = -1;
    c->done_tail = &c->done_head;
    c->rkey_sys_dev = ucx_at_least(1, 20);

    ucp_config_t *cfg;
    ucs_status_t st = read_config(c, &cfg);
    if (st != UCS_OK) return ctx_fail(c, "ucp_config_read", st);
    const char *mode = getenv("KVCR_UCX_WRITES");
    c->writes_mode = mode == NULL ? 0 : strcmp(mode, "puts") == 0 ? -1
                                      : strcmp(mode, "messages") == 0 ? 1 : 0;
    if (mode != NULL && c->writes_mode == 0 && strcmp(mode, "auto") != 0)
        kvcr_log(log, KVCR_LOG_WARN, "ucx: KVCR_UCX_WRITES=%s is not puts, messages or auto: auto",
                 mode);
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
    };
    st = ucp_init(&params, cfg, &c->context);
    ucp_config_release(cfg);
    if (st != UCS_OK) return ctx_fail(c, "ucp_init", st);

    /* One thread (the progress thread) makes every call on this context, so
     * UCX needs no locks. No event mask: every event type wakes the fd,
     * including incoming messages that carry a peer's writes to us. */
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(c->context, &wp, &c->worker);
    if (st != UCS_OK) return ctx_fail(c, "ucp_worker_create", st);
    st = set_write_handler(c);
    if (st != UCS_OK) return ctx_fail(c, "ucp_worker_set_am_recv_handler", st);
    st = set_batch_runs(c);
    if (st != UCS_OK) return ctx_fail(c, "ucp_worker_query", st);
    st = ucp_worker_get_efd(c->worker, &c->efd);
    if (st != UCS_OK) return ctx_fail(c, "ucp_worker_get_efd", st);
    st = ucp_worker_get_address(c->worker, &c->addr, &c->addr_len);
    if (st != UCS_OK) return ctx_fail(c, "ucp_worker_get_address", st);
    learn_own_address(c);
    *out = c;
    return 0;
}

void ucx_ctx_set_logger(ucx_ctx *c, const kvcr_logger *log)
{
    c->log = log;
}

void ucx_ctx_destroy(ucx_ctx *c)
{
    if (c == NULL) return;
    if (c->addr != NULL) ucp_worker_release_address(c->worker, c->addr);
    if (c->worker != NULL) ucp_worker_destroy(c->worker);
    if (c->context != NULL) ucp_cleanup(c->context);
    free(c);
}

unsigned ucx_progress(ucx_ctx *c)
{
    unsigned n = 0, got;
    /* Bounded, so that a stream of events cannot starve the caller. */
    for (int i = 0; i < 64 && (got = ucp_worker_progress(c->worker)) != 0; i++) n += got;
    return n + report_done(c);
}

int ucx_fd(ucx_ctx *c)
{
    return c->efd;
}

bool ucx_arm(ucx_ctx *c)
{
    /* A write that finished inside ucx_write is only reported by the next
     * ucx_progress, and no fd event will announce it. */
    if (c->done_head != NULL) return false;
    return ucp_worker_arm(c->worker) == UCS_OK;
}

void ucx_worker_address(const ucx_ctx *c, const void **addr, size_t *len)
{
    *addr = c->addr;
    *len = c->addr_len;
}

/* ---- memory --------------------------------------------------------------- */

static int mem_map(ucx_ctx *c, ucp_mem_map_params_t *mp, ucx_mem **out)
{
    ucx_mem *m = calloc(1, sizeof *m);
    if (m == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    m->c = c;
    ucs_status_t st = ucp_mem_map(c->context, mp, &m->memh);
    if (st != UCS_OK) {
        free(m);
        return kvcr_fail(KVCR_ESYS, "ucp_mem_map: %s", ucs_status_string(st));
    }
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    const char *what = "ucp_mem_query";
    st = ucp_mem_query(m->memh, &attr);
    if (st == UCS_OK) {
        what = "ucp_rkey_pack";
        st = ucp_rkey_pack(c->context, m->memh, &m->rkey, &m->rkey_len);
    }
    if (st != UCS_OK) {
        ucp_mem_unmap(c->context, m->memh);
        free(m);
        return kvcr_fail(KVCR_ESYS, "%s: %s", what, ucs_status_string(st));
    }
    m->base = (uintptr_t)attr.address;
    m->len = attr.length;
    *out = m;
    return 0;
}

int ucx_mem_register(ucx_ctx *c, void *addr, size_t len, ucx_mem **out)
{
    if (addr == NULL || len == 0) return kvcr_fail(KVCR_EINVAL, "ucx: empty memory region");
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    return mem_map(c, &mp, out);
}

int ucx_mem_alloc(ucx_ctx *c, size_t len, ucx_mem **out)
{
    if (len == 0) return kvcr_fail(KVCR_EINVAL, "ucx: empty memory region");
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .length = len,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    return mem_map(c, &mp, out);
}

void *ucx_mem_addr(const ucx_mem *m)
{
    return (void *)m->base;
}

void ucx_mem_rkey(const ucx_mem *m, const void **rkey, size_t *len)
{
    *rkey = m->rkey;
    *len = m->rkey_len;
}

void ucx_mem_deregister(ucx_mem *m)
{
    if (m == NULL) return;
    ucp_rkey_buffer_release(m->rkey);
    ucs_status_t st = ucp_mem_unmap(m->c->context, m->memh);
    if (st != UCS_OK)
        kvcr_log(m->c->log, KVCR_LOG_WARN, "ucp_mem_unmap: %s", ucs_status_string(st));
    free(m);
}

/* ---- peer addresses ------------------------------------------------------- */

/* UCX trusts every byte of a worker address: net/ucxaddr.h walks it first.
 * 0, or KVCR_EINVAL naming what is wrong with a peer's worker address;
 * fills tcp with where its TCP transport listens (none when our own
 * address's layout is unknown: then it is not walked). */
static int check_address(const ucx_ctx *c, const uint8_t *a, size_t len, ucxaddr_tcp *tcp)
{
    tcp->n = 0;
    if (len < ADDR_MIN || len > ADDR_MAX)
        return kvcr_fail(KVCR_EINVAL, "malformed UCX worker address: %zu bytes", len);
    /* UCX aborts on an address version it does not know. */
    if ((a[0] & 0x0f) != c->addr_version)
        return kvcr_fail(KVCR_EINVAL, "UCX worker address version %u, this host uses %u",
                         a[0] & 0x0f, c->addr_version);
    ucxaddr_walk w = {.check = &c->shape, .tcp = tcp, .tcp_csum = ucs_crc16_string("tcp")};
    if (c->shape_known && ucxaddr_walk_address(a, len, &w) != 0)
        return kvcr_fail(KVCR_EINVAL, "malformed UCX worker address: %s", w.why);
    return 0;
}

/* ---- peers ---------------------------------------------------------------- */

static void peer_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)ep;
    ucx_peer *p = arg;
    if (!p->failed)
        kvcr_log(p->c->log, KVCR_LOG_WARN, "ucx peer unreachable: %s", ucs_status_string(st));
    p->failed = true;
}

/* The transport of a lane line: "  lane[0]:  3:sysv/memory.0 md[2] ..."
 * gives "sysv/memory.0 md[2] ...", or NULL. */
static const char *lane_transport(const char *line)
{
    const char *s = strchr(strstr(line, "lane["), ':');
    if (s == NULL) return NULL;
    s += strspn(s + 1, " ") + 1;
    return s + strspn(s, "0123456789:");
}

/* "  lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am keepalive"
 * becomes "sysv/memory.0 (am keepalive)". */
static void lane_summary(const char *line, char *out, size_t size)
{
    const char *s = lane_transport(line);
    if (s == NULL) return;
    size_t tl = strcspn(s, " \n");
    const char *roles = strstr(s, "->");
    size_t used = strlen(out);
    snprintf(out + used, size - used, "%s%.*s", used ? ", " : "", (int)tl, s);
    if (roles == NULL) return;
    roles += 2 + strspn(roles + 2, " ");
    roles += strcspn(roles, " \n");
    roles += strspn(roles, " ");
    size_t rl = strcspn(roles, "\n");
    used = strlen(out);
    if (rl > 0) snprintf(out + used, size - used, " (%.*s)", (int)rl, roles);
}

/* Logs the lanes UCX chose (the whole description at debug, a one-line
 * list of transports at info) and returns whether every one is TCP: then
 * UCX would only emulate puts, and writes go as active messages instead. */
static bool lanes_all_tcp(const ucx_peer *p)
{
    const kvcr_logger *log = p->c->log;
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (f == NULL) return false;
    ucp_ep_print_info(p->ep, f);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        return false;
    }
    kvcr_log(log, KVCR_LOG_DEBUG, "ucx endpoint %p:\n%s", (void *)p->ep, text);
    char summary[512] = "", *save = NULL;
    bool lanes = false, all_tcp = true;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strstr(line, "lane[") == NULL) continue;
        const char *tl = lane_transport(line);
        lanes = true;
        all_tcp &= tl != NULL && strncmp(tl, "tcp/", 4) == 0;
        lane_summary(line, summary, sizeof summary);
    }
    kvcr_log(log, KVCR_LOG_INFO, "ucx endpoint %p lanes: %s", (void *)p->ep,
             summary[0] ? summary : "(none listed)");
    free(text);
    return lanes && all_tcp;
}

int ucx_peer_connect(ucx_ctx *c, const void *worker_addr, size_t len, ucx_peer **out)
{
    if (worker_addr == NULL) return kvcr_fail(KVCR_EINVAL, "malformed UCX worker address: none");
    ucxaddr_tcp listens;
    int rc = check_address(c, worker_addr, len, &listens);
    if (rc != 0) return rc;
    /* UCX reads it with aligned loads; wire bytes may sit anywhere. */
    void *addr = malloc(len);
    ucx_peer *p = calloc(1, sizeof *p);
    if (addr == NULL || p == NULL) {
        free(addr);
        free(p);
        return kvcr_fail(KVCR_ENOMEM, "out of memory");
    }
    memcpy(addr, worker_addr, len);
    p->c = c;
    p->tcp = listens;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {peer_error, p},
    };
    ucs_status_t st = ucp_ep_create(c->worker, &ep, &p->ep);
    free(addr); /* UCX keeps what it needs */
    if (st != UCS_OK) {
        free(p);
        return kvcr_fail(KVCR_ESYS, "ucp_ep_create: %s", ucs_status_string(st));
    }
    bool tcp = lanes_all_tcp(p);
    p->messages = c->writes_mode > 0 || (c->writes_mode == 0 && tcp);
    p->by_lanes = c->writes_mode == 0 && tcp;
    kvcr_log(c->log, KVCR_LOG_INFO, "ucx endpoint %p: writes as %s", (void *)p->ep,
             p->messages ? "active messages (the target copies them into place)"
                         : "puts (one-sided, then a flush)");
    *out = p;
    return 0;
}

bool ucx_peer_messages(const ucx_peer *p)
{
    return p->messages;
}

bool ucx_write_messages(const ucx_peer *p, bool puts_agreed)
{
    return p->messages && !(puts_agreed && p->by_lanes);
}

void ucx_writes_posted(const ucx_ctx *c, uint64_t *puts, uint64_t *messages)
{
    *puts = atomic_load_explicit(&c->writes_put, memory_order_relaxed);
    *messages = atomic_load_explicit(&c->writes_message, memory_order_relaxed);
}

bool ucx_peer_failed(const ucx_peer *p)
{
    return p->failed;
}

uint32_t ucx_peer_busy(const ucx_peer *p)
{
    return p->busy;
}

/* Closes the endpoint, waiting at most 2 s; a forced close does not flush. */
static void close_ep(ucx_peer *p, bool force)
{
    ucx_ctx *c = p->c;
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    void *req = ucp_ep_close_nbx(p->ep, &rp);
    p->ep = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        uint64_t deadline = kvcr_now_ns() + CLOSE_TIMEOUT_NS;
        ucs_status_t st;
        while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && kvcr_now_ns() < deadline)
            ucp_worker_progress(c->worker);
        if (st == UCS_INPROGRESS)
            kvcr_log(c->log, KVCR_LOG_WARN,
                     "ucx endpoint close still running after 2 s; left to UCX");
        else if (st != UCS_OK)
            kvcr_log(c->log, KVCR_LOG_INFO, "ucx endpoint close: %s", ucs_status_string(st));
        /* Freed now, or by UCX when it completes. */
        ucp_request_free(req);
    } else if (UCS_PTR_IS_ERR(req)) {
        kvcr_log(c->log, KVCR_LOG_INFO, "ucx endpoint close: %s",
                 ucs_status_string(UCS_PTR_STATUS(req)));
    }
}

void ucx_peer_close(ucx_peer *p)
{
    if (p == NULL) return;
    if (p->busy != 0) {
        /* Its writes still point at it: leaking beats a use after free. */
        kvcr_log(p->c->log, KVCR_LOG_ERROR,
                 "ucx_peer_close with %u writes running; endpoint left open", p->busy);
        return;
    }
    /* A failed endpoint cannot flush; a live one finishes what it has. */
    if (p->ep != NULL) close_ep(p, p->failed);
    free(p);
}

/* A forced close alone does not stop what the endpoint's TCP connections
 * still hold: UCX 1.13 ends a connection with a plain close(), and the
 * kernel sends what the socket holds when the link comes back; the peer's
 * worker executes those puts then, after it was told that the writes ended
 * (`ss` showed a UCX connection holding 70 KB through a partition, sent
 * when it healed; docs/RELIABILITY.md). So the connections with the peer
 * are reset first (net/tcpreset.h): those to where it listens, and those
 * it opened to where we listen, which UCX uses for our writes too once the
 * peer has an endpoint to us. */
static void reset_tcp(ucx_peer *p)
{
    if (p->tcp.n == 0) return;
    tcp_ends ends = {p->tcp.at, p->tcp.n, p->c->tcp.at, p->c->tcp.n};
    int n = tcp_reset_peer(&ends);
    if (n < 0) {
        kvcr_log(p->c->log, KVCR_LOG_ERROR,
                 "ucx peer abort: its TCP connections could not be reset (%s): bytes they "
                 "hold may still reach the peer",
                 kvcr_last_error());
        return;
    }
    atomic_fetch_add_explicit(&p->c->tcp_resets, (uint64_t)n, memory_order_relaxed);
    if (n > 0)
        kvcr_log(p->c->log, KVCR_LOG_INFO, "ucx peer abort: %d TCP connection(s) with it reset", n);
}

void ucx_peer_abort(ucx_peer *p)
{
    if (p->ep == NULL) return;
    kvcr_log(p->c->log, KVCR_LOG_WARN,
             "ucx peer unanswering: endpoint closed by force, %u write(s) on it fail", p->busy);
    p->failed = true;
    atomic_fetch_add_explicit(&p->c->aborts, 1, memory_order_relaxed);
    reset_tcp(p);
    close_ep(p, true);
}

void ucx_abort_counts(const ucx_ctx *c, uint64_t *aborts, uint64_t *tcp_resets)
{
    *aborts = atomic_load_explicit(&c->aborts, memory_order_relaxed);
    *tcp_resets = atomic_load_explicit(&c->tcp_resets, memory_order_relaxed);
}

int ucx_rkey_unpack(ucx_peer *p, const void *buf, size_t len, ucx_rkey **out)
{
    /* A packed rkey is a memory domain map (8 bytes), a memory type byte and
     * one length-prefixed key per domain in the map: checked like the
     * address. From UCX 1.20 on a non-empty map is followed by the memory's
     * system device, 0xff for host memory (unknown), which UCX reads
     * whatever the length: any other value makes it read a list of device
     * distances up to a terminator, past what we hold, and a missing one is
     * read past the buffer. So exactly that byte there, nothing before. */
    const uint8_t *b = buf;
    if (p->ep == NULL) return kvcr_fail(KVCR_ESYS, "ucx rkey: the peer's endpoint was aborted");
    if (p->failed) return kvcr_fail(KVCR_ESYS, "ucx rkey: the peer is unreachable");
    if (b == NULL || len < 9 || len > 4096)
        return kvcr_fail(KVCR_EINVAL, "malformed UCX rkey: %zu bytes", len);
    uint64_t md_map;
    memcpy(&md_map, b, sizeof md_map);
    if (b[8] != UCS_MEMORY_TYPE_HOST)
        return kvcr_fail(KVCR_EINVAL, "UCX rkey is not for host memory");
    size_t pos = 9;
    for (int i = 0; i < __builtin_popcountll(md_map); i++) {
        if (pos >= len || b[pos] > len - pos - 1)
            return kvcr_fail(KVCR_EINVAL, "malformed UCX rkey: truncated");
        pos += 1 + b[pos];
    }
    if (md_map != 0 && p->c->rkey_sys_dev) {
        if (pos >= len || b[pos] != 0xff)
            return kvcr_fail(KVCR_EINVAL, "UCX rkey: not for host memory (system device)");
        pos++;
    }
    if (pos != len) return kvcr_fail(KVCR_EINVAL, "malformed UCX rkey: trailing bytes");

    ucx_rkey *r = calloc(1, sizeof *r);
    if (r == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    ucs_status_t st = ucp_ep_rkey_unpack(p->ep, buf, &r->rkey);
    if (st != UCS_OK) {
        free(r);
        return kvcr_fail(KVCR_ESYS, "ucp_ep_rkey_unpack: %s", ucs_status_string(st));
    }
    r->p = p;
    *out = r;
    return 0;
}

void ucx_rkey_destroy(ucx_rkey *r)
{
    if (r == NULL) return;
    ucp_rkey_destroy(r->rkey);
    free(r);
}

/* ---- writes --------------------------------------------------------------- */

static bool mem_holds(const ucx_mem *m, const void *src, size_t len)
{
    uintptr_t a = (uintptr_t)src;
    return a >= m->base && len <= m->len && a - m->base <= m->len - len;
}

static int check_segs(const ucx_peer *p, const ucx_seg *segs, size_t n)
{
    if (n > 0 && segs == NULL) return kvcr_fail(KVCR_EINVAL, "ucx write: no segments");
    for (size_t i = 0; i < n; i++) {
        const ucx_seg *s = &segs[i];
        if (s->len == 0) continue;
        if (s->src == NULL || s->rkey == NULL)
            return kvcr_fail(KVCR_EINVAL, "ucx write: segment %zu has no source or rkey", i);
        if (s->rkey->p != p)
            return kvcr_fail(KVCR_EINVAL, "ucx write: segment %zu: rkey of another peer", i);
        if (s->remote_addr + s->len < s->remote_addr)
            return kvcr_fail(KVCR_EINVAL, "ucx write: segment %zu wraps around", i);
        if (s->mem != NULL && (s->mem->c != p->c || !mem_holds(s->mem, s->src, s->len)))
            return kvcr_fail(KVCR_EINVAL, "ucx write: segment %zu is not inside its memory", i);
    }
    return 0;
}

/* Segments from i on that continue each other on both sides under one
 * rkey: their total length; *end is the first one not merged. The memory
 * handle is kept only if they all lie in the same registration. */
static size_t merge_run(const ucx_seg *segs, size_t n, size_t i, size_t *end, const ucx_mem **mem)
{
    const ucx_seg *first = &segs[i];
    size_t len = first->len;
    *mem = first->mem;
    size_t j = i + 1;
    for (; j < n; j++) {
        const ucx_seg *s = &segs[j];
        if (s->len == 0) continue;
        bool follows = (const uint8_t *)s->src == (const uint8_t *)first->src + len &&
                       s->remote_addr == first->remote_addr + len;
        if (s->rkey != first->rkey || !follows) break;
        if (s->mem != *mem) *mem = NULL;
        len += s->len;
    }
    *end = j;
    return len;
}

/* The next run of non-empty segments from *i on: its length (0: none
 * left), its first segment segs[*first]; *i moves past it. */
static size_t next_run(const ucx_seg *segs, size_t n, size_t *i, size_t *first,
                       const ucx_mem **mem)
{
    while (*i < n && segs[*i].len == 0) (*i)++;
    if (*i == n) return 0;
    *first = *i;
    return merge_run(segs, n, *first, i, mem);
}

/* Whether op may post another request on its endpoint (the progress
 * thread): never once UCX reported the peer failed (peer_error). UCX
 * marks an endpoint failed and tears its lanes down before it calls the
 * error callback, and UCX 1.22 crashes on a put or get posted on such an
 * endpoint (seen in NIXL's tests; UCX's own fix was not merged). Both
 * happen inside one call into UCX, which runs only request_done (it posts
 * nothing) in between: so once that call returns the endpoint is failed
 * only if p->failed says so, and a check before every post holds even if
 * UCX fails the endpoint inside one of this write's own posts. The rest
 * of the write fails. */
static bool may_post(write_op *op)
{
    if (!op->p->failed) return true;
    op_fail(op, UCS_ERR_UNREACHABLE);
    return false;
}

/* Posts one request of op; false once the write has failed. */
static bool post(write_op *op, void *req)
{
    if (req == NULL) return true; /* done already */
    if (UCS_PTR_IS_ERR(req)) {
        op_fail(op, UCS_PTR_STATUS(req));
        return false;
    }
    op->pending++; /* request_done frees it */
    return true;
}

/* One run of segments as a put (mem: the source's registration, or NULL). */
static void *put_run(write_op *op, const ucx_seg *first, size_t len, const ucx_mem *mem)
{
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = request_done,
        .user_data = op,
    };
    /* UCX 1.13 accepts the handle but its RMA path ignores it (user
     * handles for RMA came in 1.14); its shared memory and emulated puts
     * need no source registration anyway. A newer UCX skips a lookup. */
    if (mem != NULL) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = mem->memh;
    }
    return ucp_put_nbx(op->p->ep, first->src, len, first->remote_addr, first->rkey->rkey, &rp);
}

/* One message of a write, eager: the target's sink copies its runs into
 * place once the whole message has arrived, and nothing but that copy
 * writes its memory. count bytes at buf, or (iov) count runs listed at buf. */
static void *send_message(write_op *op, const uint8_t *h, size_t hlen, const void *buf,
                          size_t count, bool iov)
{
    ucp_request_param_t rp = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = request_done,
        .user_data = op,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    if (iov) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        rp.datatype = ucp_dt_make_iov();
    }
    return ucp_am_send_nbx(op->p->ep, AM_WRITE_ID, h, hlen, buf, count, &rp);
}

/* The runs gathered for the next message of a write: its header at h (the
 * tag, then one entry per run), its runs at iov. Both stay in op->headers
 * until the write is done: UCX reads them until each send completes. */
typedef struct am_batch {
    uint8_t *h;
    ucp_dt_iov_t *iov;
    size_t runs, bytes;
} am_batch;

static void batch_add(am_batch *b, uint64_t tag, const ucx_seg *first, size_t len)
{
    if (b->runs == 0) amhdr_set_tag(b->h, tag);
    amhdr_set_run(b->h, b->runs, first->remote_addr, len);
    b->iov[b->runs] = (ucp_dt_iov_t){.buffer = (void *)(uintptr_t)first->src, .length = len};
    b->runs++;
    b->bytes += len;
}

/* Sends the gathered runs as one message (one run: the one-run layout,
 * which is the first 16 bytes of the gathered header) and starts the
 * next batch after them; false once the write has failed. */
static bool batch_send(write_op *op, am_batch *b)
{
    if (b->runs == 0) return true;
    if (!may_post(op)) return false;
    void *req = b->runs == 1
                    ? send_message(op, b->h, AMHDR_ONE, b->iov[0].buffer, b->iov[0].length, false)
                    : send_message(op, b->h, AMHDR_LEN(b->runs), b->iov, b->runs, true);
    b->h += 8 + b->runs * AMHDR_RUN;
    b->iov += b->runs;
    b->runs = 0;
    b->bytes = 0;
    return post(op, req);
}

/* Every run of a write as messages tagged tag: short runs gathered (see
 * AM_BATCH_BYTES), long ones alone, in order. */
static bool message_runs(write_op *op, const ucx_seg *segs, size_t n, uint64_t tag)
{
    size_t per_run = 8 + AMHDR_RUN + sizeof(ucp_dt_iov_t);
    if (n > SIZE_MAX / per_run || (op->headers = malloc(n * per_run)) == NULL) {
        op->status = KVCR_ENOMEM;
        return false;
    }
    am_batch b = {op->headers, (ucp_dt_iov_t *)(void *)(op->headers + AM_HDR_BYTES(n)), 0, 0};
    size_t max_runs = op->p->c->batch_runs, max_bytes = op->p->c->batch_bytes;
    const ucx_mem *mem;
    for (size_t i = 0, first, len; (len = next_run(segs, n, &i, &first, &mem)) != 0;) {
        bool alone = len >= max_bytes;
        bool full = b.runs == max_runs || b.bytes + len > max_bytes;
        if ((alone || full) && !batch_send(op, &b)) return false;
        batch_add(&b, tag, &segs[first], len);
        if (alone && !batch_send(op, &b)) return false;
    }
    return batch_send(op, &b);
}

/* Every run of segments: puts, or (to a peer that takes messages)
 * messages, whose headers op holds until it is done. */
static bool post_runs(write_op *op, const ucx_seg *segs, size_t n, uint64_t tag)
{
    if (op->messages) return message_runs(op, segs, n, tag);
    const ucx_mem *mem;
    for (size_t i = 0, first, len; (len = next_run(segs, n, &i, &first, &mem)) != 0;)
        if (!may_post(op) || !post(op, put_run(op, &segs[first], len, mem))) return false;
    return true;
}

/* Hands a write message's runs to the sink, one call per run, after
 * checking the whole header (amhdr_check): false if it is malformed or
 * the sink refused a run (the runs after it are not offered). */
static bool sink_runs(ucx_ctx *c, const uint8_t *h, size_t hlen, const uint8_t *data, size_t length)
{
    size_t runs = amhdr_check(h, hlen, length);
    uint64_t tag = amhdr_tag(h), addr;
    for (size_t k = 0, off = 0, len; k < runs; k++, off += len) {
        amhdr_run(h, hlen, length, k, &addr, &len);
        if (!c->sink(c->sink_arg, tag, addr, data + off, len)) return false;
    }
    return runs > 0;
}

/* An active message carrying a write's bytes (ucx_progress, the progress
 * thread): well formed and taken by the sink, or dropped and counted. A
 * message that came by rendezvous is dropped: writes are sent eager only,
 * and the sink must not hand a descriptor out for later. */
static ucs_status_t on_write_message(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ucx_ctx *c = arg;
    bool eager = !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
    if (header_length < AMHDR_ONE || !eager || c->sink == NULL ||
        !sink_runs(c, header, header_length, data, length))
        atomic_fetch_add_explicit(&c->sink_dropped, 1, memory_order_relaxed);
    return UCS_OK;
}

void ucx_set_sink(ucx_ctx *c, ucx_sink *sink, void *arg)
{
    c->sink = sink;
    c->sink_arg = arg;
}

/* The handler of write messages, from the start: a peer may send one
 * before a sink is set (it is then dropped), and UCX 1.13 crashes on a
 * message whose id has no handler. */
static ucs_status_t set_write_handler(ucx_ctx *c)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = AM_WRITE_ID,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = on_write_message,
        .arg = c,
    };
    return ucp_worker_set_am_recv_handler(c->worker, &hp);
}

uint64_t ucx_sink_dropped(const ucx_ctx *c)
{
    return atomic_load_explicit(&c->sink_dropped, memory_order_relaxed);
}

int ucx_write(ucx_peer *p, const ucx_seg *segs, size_t n, uint64_t tag,
              void (*done)(void *ud, int status), void *ud)
{
    return ucx_write_as(p, segs, n, tag, false, done, ud);
}

int ucx_write_as(ucx_peer *p, const ucx_seg *segs, size_t n, uint64_t tag, bool puts_agreed,
                 void (*done)(void *ud, int status), void *ud)
{
    if (done == NULL) return kvcr_fail(KVCR_EINVAL, "ucx write: no completion callback");
    int rc = check_segs(p, segs, n);
    if (rc != 0) return rc;
    if (p->failed) return kvcr_fail(KVCR_ESYS, "ucx write: peer is unreachable");
    write_op *op = calloc(1, sizeof *op);
    if (op == NULL) return kvcr_fail(KVCR_ENOMEM, "out of memory");
    op->p = p;
    op->done = done;
    op->ud = ud;
    op->messages = ucx_write_messages(p, puts_agreed);
    atomic_fetch_add_explicit(op->messages ? &p->c->writes_message : &p->c->writes_put, 1,
                              memory_order_relaxed);
    p->busy++;
    /* Messages: each complete once sent; no flush, the target counts the
     * bytes it took. Puts: every put first, then one flush; the puts
     * pipeline, and the flush completes once all of them are complete at
     * the destination. */
    if (post_runs(op, segs, n, tag) && !op->messages && may_post(op)) {
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = request_done,
            .user_data = op,
        };
        post(op, ucp_ep_flush_nbx(p->ep, &rp));
    }
    op->posted = true;
    if (op->pending == 0) queue_done(p->c, op);
    return 0;
}
