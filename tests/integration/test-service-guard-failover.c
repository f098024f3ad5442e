/* The KVCR service and its Guard with real processes: a `kvcr service`
 * daemon, engines (kvcr-test-peer in guard mode) that claim its pool
 * groups, and this process as a peer pulling blocks over 127.0.0.1.
 *
 * Pinned: claims refused with their reasons (digest, index, second owner,
 * conflicting local DRAM, no service, tenants' DRAM quotas past the
 * granted pools); an engine SIGKILLed -> the Guard
 * serves a peer's hinted delivery from the pool, bytes compared; the
 * restarted engine recovers every committed block, bytes compared, and
 * takes the group back; a SIGKILL in the middle of deposits loses only
 * what was not committed; DRAM and G3 blocks both back after a restart
 * in guard mode; a corrupt journal frame -> nothing recovered,
 * never wrong bytes; the service itself restarted and SIGKILLed; the
 * failover repeated 20 times with zero blocks lost; the Guard speaking for
 * a SIGKILLed engine to routers (its KV events on the engine's topic, rank,
 * endpoints, medium names and form), and the restarted engine taking its
 * stream back: one stream numbered on across both handovers. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "kvreplay.h"
#include "net/kvev.h"
#include "peer.h"
#include "client/frame.h"
#include "client/journal.h"
#include "daemon/service.h"

#define BS 65536
#define POOL_BLOCKS 512
#define DIGEST "test-model-layout-v1"

typedef struct svc {
    pid_t pid;
    char dir[128], sock[192];
} svc;

static void svc_spawn(svc *s)
{
    char pool_gb[32];
    snprintf(pool_gb, sizeof pool_gb, "%.10f", (double)POOL_BLOCKS * BS / 1073741824.0);
    char *argv[] = {KVCR_TOOL, "service", "--socket-path", s->sock, "--pool-dir", s->dir,
                    "--guard-count", "2", "--pool-sizes-gb", pool_gb,
                    "--compatibility-digest", DIGEST, "--journal-mb", "4", "--log-level", "warn",
                    NULL};
    extern char **environ;
    assert_int_equal(posix_spawn(&s->pid, KVCR_TOOL, NULL, NULL, argv, environ), 0);
    char *text = NULL;
    for (int i = 0; i < 1000 && svc_fetch_metrics(s->sock, &text) != 0; i++) usleep(10000);
    if (text == NULL) fail_msg("the service did not come up: %s", kvcr_last_error());
    free(text);
}

static void svc_start(svc *s)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(s->dir, sizeof s->dir, "%s/kvcr-test-svc.XXXXXX", base);
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->sock, sizeof s->sock, "%s/claim.sock", s->dir);
    svc_spawn(s);
}

static int count_pool_files(const svc *s)
{
    DIR *d = opendir(s->dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, "kvcr-pool-", 10) == 0;
    closedir(d);
    return n;
}

/* SIGTERM: a clean shutdown removes its own pool files and its socket;
 * left is how many files of earlier services must remain. */
static void svc_stop_leaving(svc *s, int left)
{
    kill(s->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 3000 && waitpid(s->pid, &status, WNOHANG) != s->pid; i++) usleep(10000);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    s->pid = 0;
    assert_int_equal(count_pool_files(s), left);
    assert_int_equal(access(s->sock, F_OK), -1);
}

static void svc_stop(svc *s)
{
    svc_stop_leaving(s, 0);
}

static void svc_kill(svc *s)
{
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

static void svc_cleanup(svc *s)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
    assert_int_equal(system(cmd), 0);
}

/* Waits (bounded: 10 s) until guard g is serving; the promotion count. */
static double wait_serving(const svc *s, int g)
{
    double promotions = tool_wait_serving(s->sock, (uint32_t)g, -1, 10);
    if (promotions < 0) fail_msg("guard %d never started serving", g);
    return promotions;
}

static void engine_spawn_at(peer *p, const svc *s, uint32_t guard, uint32_t deposit_n,
                            uint16_t port)
{
    peer_opts o;
    peer_opts_init(&o);
    o.port = port;
    o.block_size = BS;
    o.deposit_n = deposit_n;
    o.service = s->sock;
    o.guard_index = guard;
    o.digest = DIGEST;
    peer_spawn(p, &o);
}

static void engine_spawn(peer *p, const svc *s, uint32_t guard, uint32_t deposit_n)
{
    engine_spawn_at(p, s, guard, deposit_n, 0);
}

/* This process as a peer: no KVCR DRAM, framework blocks to deliver into. */
static void puller_start(rig *r)
{
    rig_init_remote(r, BS, 64, 0);
    r->cfg.operation_timeout_ms = 2000;
    r->cfg.abandon_timeout_ms = 4000;
    rig_start(r);
}

/* Delivers k0..k<n-1> from the endpoint into framework blocks 0..n-1: true
 * when every entry succeeded and every byte is right. A first attempt
 * after a failover may be refused (the Guard has not met this peer yet,
 * which then republishes its metadata); it is retried once. */
static bool pull_all(rig *r, const char *endpoint, uint32_t n, const char *req)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        peer_hint_range(r, req, endpoint, 0, n);
        memset(r->fw, 0, (size_t)n * BS);
        kvcr_entry_status st[64];
        assert_int_equal(rig_wait(r, peer_deliver_range(r, 0, n, 0, req), st, NULL, NULL), n);
        bool ok = true;
        for (uint32_t i = 0; i < n; i++) {
            if (st[i] != KVCR_ENTRY_SUCCESS) {
                ok = false;
                continue;
            }
            assert_true(rig_has_pattern(r, r->fw + (size_t)i * BS, i)); /* never a wrong byte */
        }
        if (ok) return true;
    }
    return false;
}

/* ---- claims ------------------------------------------------------------------------ */

static int try_claim_timeout(const svc *s, const char *path, uint32_t guard, const char *digest,
                             bool with_local_dram, uint32_t op_timeout_ms)
{
    rig r;
    rig_init(&r, BS, 4, with_local_dram ? 4 : 0);
    r.cfg.operation_timeout_ms = op_timeout_ms;
    if (!with_local_dram) r.cfg.local_dram = NULL, r.cfg.n_local_dram = 0;
    r.cfg.guard.service_socket_path = path ? path : s->sock;
    r.cfg.guard.guard_index = guard;
    r.cfg.guard.compatibility_digest = digest;
    kvcr_t *kv = NULL;
    int rc = kvcr_create(&r.cfg, &kv);
    if (rc == 0) {
        assert_int_equal(kvcr_close(kv), 0);
        kvcr_free(kv);
    }
    free(r.fw);
    free(r.dram);
    return rc;
}

static int try_claim(const svc *s, const char *path, uint32_t guard, const char *digest,
                     bool with_local_dram)
{
    return try_claim_timeout(s, path, guard, digest, with_local_dram, 1000);
}

/* A claim that is granted, then fails to start: G3 files on tmpfs are
 * refused only when G3 opens, after the claim. */
static int try_claim_failing_g3(const svc *s, uint32_t guard)
{
    rig r;
    rig_init(&r, BS, 4, 0);
    r.cfg.local_dram = NULL, r.cfg.n_local_dram = 0;
    r.cfg.guard = (kvcr_guard_options){s->sock, guard, DIGEST};
    char path[256];
    snprintf(path, sizeof path, "%s/g3-on-tmpfs", s->dir);
    const char *paths[] = {path};
    r.cfg.g3.paths = paths;
    r.cfg.g3.n_paths = 1;
    r.cfg.g3.capacity_bytes_per_file = 4 * BS;
    kvcr_t *kv = NULL;
    int rc = kvcr_create(&r.cfg, &kv);
    kvcr_free(kv);
    free(r.fw);
    free(r.dram);
    return rc;
}

static void test_claims_are_refused_with_their_reasons(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    assert_int_equal(count_pool_files(&s), 2);
    struct stat st;
    assert_int_equal(stat(s.sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    assert_int_equal(try_claim(&s, NULL, 0, "test-model-layout-v2", false), KVCR_EREFUSED);
    assert_non_null(strstr(kvcr_last_error(), "compatibility digest does not match"));
    assert_int_equal(try_claim(&s, NULL, 0, "TEST-MODEL-LAYOUT-V1", false), KVCR_EREFUSED);
    assert_int_equal(try_claim(&s, NULL, 2, DIGEST, false), KVCR_EREFUSED);
    assert_non_null(strstr(kvcr_last_error(), "out of range"));
    assert_int_equal(try_claim(&s, NULL, 0, DIGEST, true), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "conflicts with local_dram"));
    char missing[256];
    snprintf(missing, sizeof missing, "%s/nobody.sock", s.dir);
    assert_int_equal(try_claim(&s, missing, 0, DIGEST, false), KVCR_EUNAVAIL);
    assert_non_null(strstr(kvcr_last_error(), "not reachable"));
    /* A configuration libkvcr refuses is refused before the service is asked. */
    assert_int_equal(try_claim_timeout(&s, NULL, 1, DIGEST, false, 0), KVCR_EINVAL);
    assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_claims_total{guard=\"1\"}"), 0);

    /* A second owner while the first lives is refused; after the first's
     * clean release the group is claimable again. */
    peer a;
    engine_spawn(&a, &s, 0, 4);
    assert_int_equal(try_claim(&s, NULL, 0, DIGEST, false), KVCR_EREFUSED);
    assert_non_null(strstr(kvcr_last_error(), "held by another worker"));
    /* The other group is free. Its first claimant fails to start (after the
     * grant) and so fixes nothing: the next one brings an endpoint. */
    if (strncmp(s.dir, "/dev/shm", 8) == 0) {
        assert_int_equal(try_claim_failing_g3(&s, 1), KVCR_EINVAL);
        assert_non_null(strstr(kvcr_last_error(), "O_DIRECT"));
        assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_claims_total{guard=\"1\"}"), 1);
    }
    peer b;
    engine_spawn(&b, &s, 1, 0);
    peer_stop(&b);
    peer_stop(&a);
    /* The group's first claim fixed its endpoint: one without it is refused... */
    assert_int_equal(try_claim(&s, NULL, 0, DIGEST, false), KVCR_EREFUSED);
    assert_non_null(strstr(kvcr_last_error(), "cannot be moved"));
    /* ...and an engine like the first gets it, blocks and all, also when it
     * names the port the first one was given rather than "any". */
    const char *colon = strrchr(a.endpoint, ':');
    engine_spawn_at(&a, &s, 0, 0, (uint16_t)atoi(colon + 1));
    peer_verdict v = peer_verify(&a, 8);
    assert_int_equal(v.hits, 4);
    assert_int_equal(v.good, 4);
    peer_stop(&a);
    assert_true(tool_svc_metric(s.sock, "kvcr_guard_refusals_total{guard=\"0\"}") >= 2);
    assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_claims_total{guard=\"0\"}"), 2);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* A claim of guard 0 with two tenants of dram_slots each: 0, or the
 * refusal's code. */
static int try_claim_tenants(const svc *s, uint64_t dram_slots)
{
    rig r;
    rig_init(&r, BS, 4, 0);
    r.cfg.local_dram = NULL, r.cfg.n_local_dram = 0;
    r.cfg.operation_timeout_ms = 1000;
    r.cfg.guard = (kvcr_guard_options){s->sock, 0, DIGEST};
    kvcr_tenant tenants[] = {{"alice", dram_slots, 0}, {"bob", dram_slots, 0}};
    r.cfg.tenants = tenants;
    r.cfg.n_tenants = 2;
    r.cfg.enable_telemetry = true;
    int rc = kvcr_create(&r.cfg, &r.kv);
    if (rc == 0) {
        assert_true(rig_stat(&r, "tenant_bob_dram_quota_slots", NULL) == (double)dram_slots);
        assert_int_equal(kvcr_close(r.kv), 0);
    }
    kvcr_free(r.kv);
    free(r.fw);
    free(r.dram);
    return rc;
}

/* In guard mode the tenants' DRAM quotas are checked against the slots of
 * the pools the service grants (unknown before the claim): past them the
 * claim is refused with the reason and the group given back; within them
 * it is granted. */
static void test_tenant_dram_quotas_are_checked_against_the_granted_pools(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    assert_int_equal(try_claim_tenants(&s, POOL_BLOCKS / 2 + 1), KVCR_EINVAL);
    assert_non_null(strstr(kvcr_last_error(), "granted guard 0's pools, given back"));
    char want[128];
    snprintf(want, sizeof want, "DRAM quotas must add up to at most the DRAM slots (%d)",
             POOL_BLOCKS);
    assert_non_null(strstr(kvcr_last_error(), want));
    assert_non_null(strstr(kvcr_last_error(), "tenant 'bob'"));
    assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_claims_total{guard=\"0\"}"), 1);
    /* Given back: the group is claimed again, with quotas that fit. */
    assert_int_equal(try_claim_tenants(&s, POOL_BLOCKS / 2), 0);
    assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_claims_total{guard=\"0\"}"), 2);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* ---- failover ------------------------------------------------------------------------ */

static bool sixteen_announced(const peer_counts *c)
{
    return c->inventory_added >= 16;
}

static void test_guard_serves_after_sigkill_and_hands_back_on_restart(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    rig r;
    puller_start(&r);
    peer a;
    engine_spawn(&a, &s, 0, 16);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", a.endpoint);
    assert_true(pull_all(&r, endpoint, 16, "before"));

    peer_kill(&a); /* SIGKILL: no release, no goodbye */
    assert_int_equal(wait_serving(&s, 0), 1);
    assert_true(pull_all(&r, endpoint, 16, "from-guard")); /* the Guard, on the same endpoint */

    engine_spawn(&a, &s, 0, 0); /* the restarted engine takes the group back */
    assert_string_equal(a.endpoint, endpoint);
    peer_wait(&a, sixteen_announced); /* the router hears of the recovered blocks again */
    peer_verdict v = peer_verify(&a, 32);
    assert_int_equal(v.hits, 16);
    assert_int_equal(v.good, 16);
    assert_int_equal(tool_svc_metric(s.sock, "kvcr_guard_phase{guard=\"0\",phase=\"primary\"}"), 1);
    assert_true(pull_all(&r, endpoint, 16, "after"));
    peer_stop(&a);
    rig_stop(&r);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* ---- a pull from an engine that dies under it ------------------------------------ */

static int g_uncertain; /* UNCERTAIN events the puller reported */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void count_uncertain(void *ud, const kvcr_resilience_event *ev)
{
    (void)ud;
    if (ev->state == KVCR_TRANSFER_UNCERTAIN) __atomic_fetch_add(&g_uncertain, 1, __ATOMIC_RELAXED);
}

/* The engine is stopped (SIGSTOP) so that our start_write sits unread in
 * its socket, then SIGKILLed: the write never happened, and only the
 * service knows that the incarnation we quoted is dead. Whoever answers on
 * the endpoint next (the Guard's backup, or the restarted engine told by
 * the service) must say so when we probe at our deadline: the pull then
 * fails by TIMEOUT with its memory free, never quarantined as UNCERTAIN
 * (which, for lack of an answer, used to last until the puller closed). */
static void pull_through_a_death(bool restart)
{
    g_uncertain = 0;
    svc s;
    svc_start(&s);
    rig r;
    rig_init_remote(&r, BS, 64, 0);
    r.cfg.operation_timeout_ms = restart ? 8000 : 3000; /* the restart fits before it */
    r.cfg.abandon_timeout_ms = 20000;
    r.cfg.callbacks.resilience = count_uncertain;
    rig_start(&r);
    peer a;
    engine_spawn(&a, &s, 0, 16);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", a.endpoint);
    assert_true(pull_all(&r, endpoint, 16, "before")); /* we learn its incarnation */

    peer_freeze(&a);
    peer_hint_range(&r, "stuck", endpoint, 0, 8);
    memset(r.fw, 0, 8 * BS);
    uint64_t unread = peer_unread_bytes(endpoint);
    uint64_t t0 = mono_ms();
    kvcr_op_handle op = peer_deliver_range(&r, 0, 8, 0, "stuck");
    /* The kill comes once our start_write sits in the engine's socket:
     * bytes it cannot read have arrived since the deliver (a poll, bounded:
     * 30 s, for a sanitizer or valgrind on a loaded machine). */
    for (int i = 0; i < 3000 && peer_unread_bytes(endpoint) <= unread; i++) usleep(10000);
    if (peer_unread_bytes(endpoint) <= unread)
        fail_msg("the deliver sent nothing to the stopped engine within 30 s");
    peer_kill(&a);
    assert_true(wait_serving(&s, 0) >= 1);
    if (restart) {
        engine_spawn(&a, &s, 0, 0); /* takes the group back: the backup is gone */
        assert_string_equal(a.endpoint, endpoint);
        if (mono_ms() - t0 >= r.cfg.operation_timeout_ms)
            print_message("note: the engine restarted after the deadline; the Guard answered\n");
    }
    rig_wait_all_failed(&r, op, 8, KVCR_REASON_TIMEOUT);
    /* No byte may land in a failed deliver's memory. Should one, the
     * message says whose bytes they are and when the failure was seen. */
    uint8_t zero[BS] = {0};
    uint64_t failed_ms = mono_ms() - t0;
    for (int i = 0; i < 8; i++) {
        const uint8_t *b = r.fw + (size_t)i * BS;
        if (memcmp(b, zero, BS) != 0)
            fail_msg("block %d of the failed deliver holds %s (failure seen %llu ms after the "
                     "deliver, %d UNCERTAIN event(s))",
                     i, rig_has_pattern(&r, b, (uint32_t)i) ? "its own bytes" : "other bytes",
                     (unsigned long long)failed_ms, __atomic_load_n(&g_uncertain, __ATOMIC_RELAXED));
    }
    kvcr_op_result *none = NULL;
    size_t n_none = 0;
    assert_int_equal(kvcr_poll(r.kv, &none, &n_none), 0); /* events still queued are delivered */
    assert_int_equal(n_none, 0);
    kvcr_results_free(none);
    assert_int_equal(__atomic_load_n(&g_uncertain, __ATOMIC_RELAXED), 0);

    /* and the endpoint serves again, bytes compared */
    assert_true(pull_all(&r, endpoint, 16, "after"));
    if (restart) peer_stop(&a);
    rig_stop(&r);
    svc_stop(&s);
    svc_cleanup(&s);
}

static void test_pull_from_killed_engine_is_ended_by_the_guard(void **state)
{
    (void)state;
    pull_through_a_death(false);
}

static void test_pull_from_killed_engine_is_ended_by_its_restart(void **state)
{
    (void)state;
    pull_through_a_death(true);
}

static bool some_deposited(const peer_counts *c)
{
    return c->deposits_done >= 64;
}

static void test_sigkill_during_deposits_keeps_every_committed_block(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    peer a;
    engine_spawn(&a, &s, 0, 0);
    peer_deposit_async(&a, 0, 480);
    peer_counts c = peer_wait(&a, some_deposited);
    peer_kill(&a);
    engine_spawn(&a, &s, 0, 0);
    peer_verdict v = peer_verify(&a, 480);
    assert_true(v.hits >= c.deposits_done); /* every block seen committed is back */
    assert_int_equal(v.good, v.hits);       /* and nothing half-written is */
    peer_stop(&a);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* An engine in guard mode with G3: the group's pool holds POOL_BLOCKS, the
 * rest of its blocks spill to its slot file. After a SIGKILL the restarted
 * engine gets both back: the DRAM blocks from the journal, the G3 blocks
 * from the file's records, bytes compared. */
static void test_restart_recovers_dram_and_g3_blocks(void **state)
{
    (void)state;
    enum { N = POOL_BLOCKS + 88 };
    svc s;
    svc_start(&s);
    char dir[] = "/var/tmp/kvcr-test-guard-g3.XXXXXX"; /* O_DIRECT: not on tmpfs */
    assert_non_null(mkdtemp(dir));
    char g3[sizeof dir + 16];
    snprintf(g3, sizeof g3, "%s/slots", dir);
    peer_opts o;
    peer_opts_init(&o);
    o.block_size = BS;
    o.deposit_n = N;
    o.service = s.sock;
    o.digest = DIGEST;
    o.g3_path = g3;
    peer a;
    peer_spawn(&a, &o);
    /* Spills finish in the background: wait until every block is somewhere. */
    peer_verdict before = {0, 0, 0};
    for (int i = 0; i < 200 && before.hits + before.in_g3 < N; i++) {
        before = peer_verify(&a, N);
        if (before.hits + before.in_g3 < N) usleep(20000);
    }
    assert_int_equal(before.hits + before.in_g3, N);
    assert_int_equal(before.good, N);
    assert_true(before.in_g3 >= N - POOL_BLOCKS);

    peer_kill(&a);
    o.deposit_n = 0;
    peer_spawn(&a, &o);
    peer_verdict after = peer_verify(&a, N);
    assert_int_equal(after.hits, before.hits);   /* from the journal */
    assert_int_equal(after.in_g3, before.in_g3); /* from the slot file */
    assert_int_equal(after.good, N);             /* every byte right */
    peer_stop(&a);
    svc_stop(&s);
    svc_cleanup(&s);
    assert_int_equal(unlink(g3), 0);
    assert_int_equal(rmdir(dir), 0);
}

/* Writes a frame with a wrong checksum at the published cursor, as a buggy
 * or hostile engine could: the Guard must stop believing the journal. */
static void corrupt_next_frame(const svc *s, uint32_t guard)
{
    char path[400];
    DIR *d = opendir(s->dir);
    assert_non_null(d);
    path[0] = '\0';
    char prefix[32];
    snprintf(prefix, sizeof prefix, "kvcr-pool-%u-", guard);
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            snprintf(path, sizeof path, "%s/%s", s->dir, e->d_name);
    closedir(d);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t *j = mmap(NULL, 4u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(j != MAP_FAILED);
    uint64_t published = __atomic_load_n((uint64_t *)(j + 128), __ATOMIC_ACQUIRE);
    uint64_t cap = (4u << 20) - JOURNAL_HEADER_BYTES;
    uint8_t *f = j + JOURNAL_HEADER_BYTES + published % cap;
    memset(f, 0, 40);
    f[0] = 33;  /* frame size: head + 1 key byte */
    f[2] = JREC_REMOVE;
    f[4] = 1;   /* key length */
    f[24] = 0x5a; /* a checksum that cannot match */
    f[32] = 'x';
    __atomic_store_n((uint64_t *)(j + 128), published + 40, __ATOMIC_RELEASE);
    munmap(j, 4u << 20);
    close(fd);
}

static void test_corrupt_journal_frame_recovers_nothing(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    rig r;
    puller_start(&r);
    peer a;
    engine_spawn(&a, &s, 1, 8);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", a.endpoint);
    corrupt_next_frame(&s, 1);
    const char *lost = "kvcr_guard_recovery_lost_total{guard=\"1\"}";
    for (int i = 0; i < 500 && tool_svc_metric(s.sock, lost) < 1; i++) usleep(10000);
    assert_true(tool_svc_metric(s.sock, lost) >= 1);
    peer_kill(&a);
    wait_serving(&s, 1);
    assert_false(pull_all(&r, endpoint, 8, "cold")); /* refused, never wrong bytes */
    engine_spawn(&a, &s, 1, 0);
    peer_verdict v = peer_verify(&a, 8);
    assert_int_equal(v.hits, 0);
    peer_stop(&a);
    rig_stop(&r);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* ---- the service itself ---------------------------------------------------------- */

static void test_service_restart_and_sigkill_keep_a_live_engine_working(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    svc_stop(&s);
    svc_spawn(&s); /* the same socket path and directory: a clean restart */
    peer a;
    engine_spawn(&a, &s, 0, 8);
    svc_kill(&s); /* the engine keeps its mapping and its blocks */
    peer_verdict v = peer_verify(&a, 8);
    assert_int_equal(v.good, 8);
    svc_spawn(&s); /* a stale socket is replaced; the engine's pool file is kept */
    assert_int_equal(count_pool_files(&s), 3);
    peer_stop(&a);           /* its release finds no service: logged, and it exits cleanly */
    svc_stop_leaving(&s, 1); /* removes its own files; the old one is not its to remove */
    svc_spawn(&s);           /* nobody holds the old one any more: the purge takes it */
    assert_int_equal(count_pool_files(&s), 2);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* Bytes that break the protocol, sent to a live service: each connection
 * is refused and closed, the service counts them and goes on serving. */
static void send_raw(const svc *s, const void *bytes, size_t len)
{
    int fd;
    assert_int_equal(svc_connect(s->sock, &fd), 0);
    assert_int_equal(write(fd, bytes, len), (ssize_t)len);
    shutdown(fd, SHUT_WR);
    char buf[4096];
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 100 && read(fd, buf, sizeof buf) > 0; i++) {
    } /* an error reply, then EOF: the service closed it */
    close(fd);
}

static void test_malformed_frames_are_refused_and_the_service_goes_on(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    static const uint8_t too_long[] = {0xff, 0xff, 0xff, 0xff, 0x80};
    static const uint8_t zero_len[] = {0, 0, 0, 0};
    static const uint8_t not_msgpack[] = {0, 0, 0, 3, 0xc1, 0xc1, 0xc1};
    static const uint8_t not_a_map[] = {0, 0, 0, 2, 0x92, 0x01};
    static const uint8_t truncated[] = {0, 0, 0, 9, 0x81, 0xa4, 't'};
    static const uint8_t unknown_type[] = {0, 0, 0, 0x0e, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xa1,
                                           'x', 0xa1, 'v', 0x01, 0, 0, 0};
    send_raw(&s, too_long, sizeof too_long);
    send_raw(&s, zero_len, sizeof zero_len);
    send_raw(&s, not_msgpack, sizeof not_msgpack);
    send_raw(&s, not_a_map, sizeof not_a_map);
    send_raw(&s, truncated, sizeof truncated);
    send_raw(&s, unknown_type, sizeof unknown_type);
    assert_true(tool_svc_metric(s.sock, "kvcr_service_frames_refused_total") >= 5);
    peer a; /* and claims still work */
    engine_spawn(&a, &s, 0, 2);
    assert_int_equal(peer_verify(&a, 2).good, 2);
    peer_stop(&a);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* ---- the failover, twenty times -------------------------------------------------- */

static void test_failover_twenty_times_loses_nothing(void **state)
{
    (void)state;
    svc s;
    svc_start(&s);
    rig r;
    puller_start(&r);
    peer a;
    engine_spawn(&a, &s, 0, 0);
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", a.endpoint);
    uint32_t committed = 0;
    for (int round = 0; round < 20; round++) {
        peer_deposit_async(&a, committed, 2);
        uint32_t want = committed + 2;
        peer_counts c;
        for (int i = 0; i < 500; i++) {
            peer_counters(&a, &c);
            if (c.deposits_done >= 2) break;
            usleep(2000);
        }
        assert_int_equal(c.deposits_done, 2);
        committed = want;
        peer_kill(&a);
        assert_int_equal(wait_serving(&s, 0), round + 1);
        assert_true(pull_all(&r, endpoint, committed < 40 ? committed : 40, "served"));
        engine_spawn(&a, &s, 0, 0);
        peer_verdict v = peer_verify(&a, committed);
        assert_int_equal(v.hits, committed); /* zero committed blocks lost */
        assert_int_equal(v.good, committed); /* zero wrong bytes */
    }
    peer_stop(&a);
    rig_stop(&r);
    svc_stop(&s);
    svc_cleanup(&s);
}

/* ---- the Guard speaks for a dead engine to routers ------------------------------- */

#define KV_TOPIC "kv@engine-0@failover"
#define KV_RANK 3
#define KV_DRAM "CPU_PINNED" /* the engine's medium names, not the defaults */
#define KV_G3 "DISK"

/* A router's view of one topic across the processes that publish on it:
 * every batch, live or filled from the replay of whoever publishes now,
 * must carry the number after the last one (a number going back is a
 * restart or a duplicate, and fails the test). Each batch is decoded and
 * checked (rank, form, medium names); stored: the hashes stored after the
 * last AllBlocksCleared (bit i: hash i, of 64). */
typedef struct kv_stream {
    void *ctx, *sub;
    const char *replay;
    uint64_t next;   /* the number the next batch must carry */
    uint64_t live_seq; /* a gap's end while it is filled */
    uint64_t replayed_end; /* batches below it came from a catch-up replay */
    size_t clears;   /* AllBlocksCleared events seen */
    uint64_t stored;
} kv_stream;

/* A BlockStored says of its block, value for value, what the engine's
 * deposit said (peer_router_block): the engine's own, the Guard's from the
 * journal, the restarted engine's from the journal the Guard compacted. */
static void kv_check_described(const kvev_event *ev)
{
    assert_int_equal(ev->n_hashes, 1);
    uint64_t h = ev->hashes[0];
    peer_router_buf buf;
    kvcr_router_block rb;
    peer_router_block((uint32_t)h, &buf, &rb);
    assert_int_equal(ev->has_parent, rb.has_parent);
    if (rb.has_parent) assert_true(ev->parent == rb.parent_hash);
    assert_int_equal(ev->block_size, PEER_BLOCK_TOKENS);
    assert_int_equal(ev->n_tokens, PEER_BLOCK_TOKENS);
    assert_memory_equal(ev->tokens, buf.tokens, sizeof buf.tokens);
    assert_string_equal(ev->lora_name, "lora-peer");
    assert_non_null(ev->extra);
    assert_int_equal(ev->n_extra[0], 1);
    assert_string_equal(ev->extra[0][0], buf.salt);
}

/* One batch, in order. */
static void kv_stream_apply(kv_stream *k, uint64_t seq, const void *payload, size_t len)
{
    if (seq != k->next)
        fail_msg("batch %llu where %llu was due: the stream %s", (unsigned long long)seq,
                 (unsigned long long)k->next, seq < k->next ? "went back" : "skipped");
    kvev_batch b;
    const char *why = kvev_decode_batch(payload, len, &b);
    if (why) fail_msg("batch %llu: %s", (unsigned long long)seq, why);
    assert_int_equal(b.dp_rank, KV_RANK);
    /* the engine's form, the Guard's as well (an empty batch, a subscription's answer,
     * has no form) */
    assert_true(b.positional || b.n_events == 0);
    for (size_t e = 0; e < b.n_events; e++) {
        const kvev_event *ev = &b.events[e];
        if (ev->type == KVEV_CLEARED) {
            k->stored = 0;
            k->clears++;
            continue;
        }
        assert_string_equal(ev->medium, KV_DRAM);
        if (ev->type == KVEV_STORED) kv_check_described(ev);
        for (size_t h = 0; h < ev->n_hashes; h++) {
            assert_true(ev->hashes[h] < 64);
            if (ev->type == KVEV_STORED)
                k->stored |= 1ull << ev->hashes[h];
            else
                k->stored &= ~(1ull << ev->hashes[h]);
        }
    }
    kvev_batch_free(&b);
    k->next++;
}

/* A replayed batch: those before the gap's end are the gap, in order. */
static void kv_stream_fill(void *ud, uint64_t seq, const void *payload, size_t len)
{
    kv_stream *k = ud;
    if (seq < k->live_seq) kv_stream_apply(k, seq, payload, len);
}

static void kv_stream_open(kv_stream *k, const char *pub, const char *replay)
{
    memset(k, 0, sizeof *k);
    k->replay = replay;
    k->ctx = zmq_ctx_new();
    k->sub = zmq_socket(k->ctx, ZMQ_SUB);
    int zero = 0, ivl = 20;
    zmq_setsockopt(k->sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(k->sub, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    assert_int_equal(zmq_setsockopt(k->sub, ZMQ_SUBSCRIBE, KV_TOPIC, strlen(KV_TOPIC)), 0);
    assert_int_equal(zmq_connect(k->sub, pub), 0); /* the publisher binds; it may come later */
}

static void kv_stream_close(kv_stream *k)
{
    zmq_close(k->sub);
    zmq_ctx_term(k->ctx);
}

/* One live message (three frames: the topic, an 8-byte number, the
 * payload), a gap before it filled from the replay. False when none came
 * within 100 ms. */
static bool kv_stream_take(kv_stream *k)
{
    zmq_pollitem_t it = {.socket = k->sub, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 100) != 1) return false;
    zmq_msg_t f[3];
    int n = 0;
    for (bool more = true; more && n < 3; n++) {
        zmq_msg_init(&f[n]);
        assert_true(zmq_msg_recv(&f[n], k->sub, 0) >= 0);
        more = zmq_msg_more(&f[n]);
    }
    assert_int_equal(n, 3);
    assert_false(zmq_msg_more(&f[2]));
    assert_int_equal(zmq_msg_size(&f[0]), strlen(KV_TOPIC));
    assert_memory_equal(zmq_msg_data(&f[0]), KV_TOPIC, strlen(KV_TOPIC));
    assert_int_equal(zmq_msg_size(&f[1]), 8);
    const uint8_t *be = zmq_msg_data(&f[1]);
    uint64_t seq = 0;
    for (int i = 0; i < 8; i++) seq = seq << 8 | be[i];
    if (seq < k->next && seq < k->replayed_end) { /* had from the replay already */
        for (int i = 0; i < 3; i++) zmq_msg_close(&f[i]);
        return true;
    }
    if (seq > k->next) { /* joined late or fell behind: the replay has the rest */
        k->live_seq = seq;
        if (!kv_replay_each(k->replay, k->next, 1000, kv_stream_fill, k) || k->next != seq)
            fail_msg("batches %llu..%llu are missing and the replay at %s lacks them",
                     (unsigned long long)k->next, (unsigned long long)seq - 1, k->replay);
    }
    kv_stream_apply(k, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
    for (int i = 0; i < 3; i++) zmq_msg_close(&f[i]);
    return true;
}

/* A subscriber that reconnects to a new publisher on the same endpoint
 * misses what was sent before it joined; with nothing live after that, no
 * gap shows. So after 500 ms of silence it asks the replay for everything
 * from the number it expects, as a router that suspects a loss would (the
 * replay may not be up between publishers: then nothing is filled). */
static void kv_stream_catch_up(kv_stream *k)
{
    k->live_seq = UINT64_MAX;
    (void)kv_replay_each(k->replay, k->next, 500, kv_stream_fill, k);
    k->replayed_end = k->next;
}

/* Takes messages until `clears` AllBlocksCleared have come and blocks
 * k0..k15 are stored after the last (bounded: 300 waits of 100 ms with
 * nothing new). */
static void kv_stream_wait(kv_stream *k, size_t clears, const char *who)
{
    for (int idle = 0; idle < 300;) {
        if (k->clears >= clears && (k->stored & 0xffff) == 0xffff) return;
        idle = kv_stream_take(k) ? 0 : idle + 1;
        if (idle > 0 && idle % 5 == 0) kv_stream_catch_up(k);
    }
    fail_msg("%s: %zu AllBlocksCleared, stored 0x%llx, next %llu", who, k->clears,
             (unsigned long long)k->stored, (unsigned long long)k->next);
}

/* The engine's stream, the Guard's after a SIGKILL and the restarted
 * engine's are one stream to a router: numbered on without a restart or a
 * duplicate, with the engine's medium names and form throughout. */
static void test_guard_and_restart_continue_the_engines_kv_stream(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvcr-test-kvev-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char replay[128], pub[128], events[400];
    snprintf(replay, sizeof replay, "ipc://%s/replay", dir);
    snprintf(pub, sizeof pub, "ipc://%s/pub", dir);
    snprintf(events, sizeof events, "%s %s %s %d %s %s 1", pub, replay, KV_TOPIC, KV_RANK,
             KV_DRAM, KV_G3);
    kv_stream k;
    kv_stream_open(&k, pub, replay);
    svc s;
    svc_start(&s);
    peer_opts o;
    peer_opts_init(&o);
    o.block_size = BS;
    o.deposit_n = 16;
    o.service = s.sock;
    o.guard_index = 0;
    o.digest = DIGEST;
    o.kv_events = events;
    peer a;
    peer_spawn(&a, &o);
    kv_stream_wait(&k, 1, "the engine"); /* from 0: AllBlocksCleared, its 16 blocks */
    uint64_t engine_end = k.next;

    peer_kill(&a); /* SIGKILL: the engine's stream ends without a word */
    assert_int_equal(wait_serving(&s, 0), 1);
    /* The Guard on the same endpoints, numbered on from the engine's last
     * batch: AllBlocksCleared, then what it serves. */
    kv_stream_wait(&k, 2, "the Guard");
    assert_true(k.next > engine_end);
    uint64_t guard_end = k.next;

    o.deposit_n = 0;
    peer_spawn(&a, &o); /* the restarted engine takes the group and the stream back */
    peer_wait(&a, sixteen_announced);
    /* The Guard's close (AllBlocksCleared), the engine's start (another),
     * then the blocks it recovered. */
    kv_stream_wait(&k, 4, "the restarted engine");
    assert_true(k.next > guard_end + 1);
    peer_stop(&a);
    kv_stream_close(&k);
    svc_stop(&s);
    svc_cleanup(&s);
    char path[160];
    snprintf(path, sizeof path, "%s/replay", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/pub", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claims_are_refused_with_their_reasons),
        cmocka_unit_test(test_tenant_dram_quotas_are_checked_against_the_granted_pools),
        cmocka_unit_test(test_guard_serves_after_sigkill_and_hands_back_on_restart),
        cmocka_unit_test(test_sigkill_during_deposits_keeps_every_committed_block),
        cmocka_unit_test(test_pull_from_killed_engine_is_ended_by_the_guard),
        cmocka_unit_test(test_pull_from_killed_engine_is_ended_by_its_restart),
        cmocka_unit_test(test_restart_recovers_dram_and_g3_blocks),
        cmocka_unit_test(test_corrupt_journal_frame_recovers_nothing),
        cmocka_unit_test(test_service_restart_and_sigkill_keep_a_live_engine_working),
        cmocka_unit_test(test_malformed_frames_are_refused_and_the_service_goes_on),
        cmocka_unit_test(test_failover_twenty_times_loses_nothing),
        cmocka_unit_test(test_guard_and_restart_continue_the_engines_kv_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
