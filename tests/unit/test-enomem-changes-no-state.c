/* Out of memory changes nothing: every public call that allocates is run
 * with its Nth allocation failing, for N = 1, 2, ... until the call makes
 * fewer than N allocations. Each failing run must return KVCR_ENOMEM (or
 * KVCR_ESYS where the allocation was pthread_create's) and leave what a
 * caller can observe (query results, gauges and counters, metadata bytes,
 * stored hints, the framework's and KVCR's memory) exactly as before; the
 * run that fails nothing must succeed. The few calls that cannot fail for
 * memory are listed at CASES.
 *
 * The failures come from malloc, calloc and realloc defined here over
 * glibc's (__libc_malloc...), armed only on the calling thread around the
 * call: the library's own threads (copies) allocate as usual. Aligned
 * allocations (posix_memalign, aligned_alloc) are not failed. ASan, TSan
 * and valgrind replace malloc themselves: there the test is skipped, but
 * valgrind --soname-synonyms=somalloc=nouserintercepts keeps ours over its
 * own and checks every failure path for leaks. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FAIL_ALLOCS 0
#else
#define FAIL_ALLOCS 1
#endif

/* ---- failing allocations ------------------------------------------------------ */

#if FAIL_ALLOCS
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);

static __thread unsigned fail_at; /* 0: disarmed */
static __thread unsigned seen;    /* allocations since armed */

/* Whether this allocation may go ahead. */
static bool allowed(void)
{
    if (fail_at == 0 || ++seen != fail_at) return true;
    errno = ENOMEM;
    return false;
}

void *malloc(size_t n)
{
    return allowed() ? __libc_malloc(n) : NULL;
}

void *calloc(size_t n, size_t size)
{
    return allowed() ? __libc_calloc(n, size) : NULL;
}

void *realloc(void *p, size_t n)
{
    return allowed() ? __libc_realloc(p, n) : NULL;
}
#endif

/* The calling thread's nth allocation from now fails. */
static void arm(unsigned n)
{
#if FAIL_ALLOCS
    seen = 0;
    fail_at = n;
#else
    (void)n;
#endif
}

/* Disarms; true if the armed allocation was reached (and failed). */
static bool disarm(void)
{
#if FAIL_ALLOCS
    bool hit = fail_at != 0 && seen >= fail_at;
    fail_at = 0;
    return hit;
#else
    return false;
#endif
}

/* Whether this program's allocations come here: not under a sanitizer,
 * nor under valgrind, which replaces malloc wherever it is defined. */
static bool can_fail_allocations(void)
{
    void *(*volatile alloc)(size_t) = malloc; /* a call the compiler keeps */
    arm(1);
    void *p = alloc(16);
    bool hit = disarm();
    free(p);
    return hit && p == NULL;
}

/* ---- what a caller observes --------------------------------------------------- */

enum { BS = 4096, FW = 16, SLOTS = 8, N_KEYS = 8, MAX_STATS = 256 };
static const char *const KEYS[N_KEYS] = {"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"};
static const char *const HINT =
    "{\"protocol_version\":\"0.1\",\"actions\":[{\"action_type\":\"kv.fetch\","
    "\"action_version\":\"1.0\",\"payload\":{\"source_control_endpoint\":"
    "\"tcp://127.0.0.1:9\",\"block_hashes\":[1,2,3]}}]}";

typedef struct observed {
    size_t md_bytes;
    uint64_t records;
    kvcr_query_status q[N_KEYS];
    int hint; /* kvcr__test_hint of "req" */
    size_t n_gauges, n_counters;
    double gauges[MAX_STATS], counters[MAX_STATS];
    uint8_t fw[FW * BS], dram[SLOTS * BS];
} observed;

static void observe(rig *r, observed *s)
{
    memset(s, 0, sizeof *s);
    s->md_bytes = kvcr__test_metadata_bytes(r->kv, &s->records);
    for (size_t i = 0; i < N_KEYS; i++) s->q[i] = rig_query(r, KEYS[i]);
    const char *src;
    size_t nh;
    const uint64_t *h;
    bool failed;
    s->hint = kvcr__test_hint(r->kv, "req", &src, &nh, &h, &failed);
    kvcr_stats *st;
    assert_int_equal(kvcr_stats_take(r->kv, &st), 0);
    assert_true(st->n_gauges <= MAX_STATS && st->n_counters <= MAX_STATS);
    s->n_gauges = st->n_gauges;
    s->n_counters = st->n_counters;
    for (size_t i = 0; i < st->n_gauges; i++) s->gauges[i] = st->gauges[i].value;
    for (size_t i = 0; i < st->n_counters; i++) s->counters[i] = st->counters[i].value;
    kvcr_stats_free(st);
    memcpy(s->fw, r->fw, sizeof s->fw);
    memcpy(s->dram, r->dram, sizeof s->dram);
}

/* The first part of the observed state that differs. */
static const char *what_changed(const observed *a, const observed *b)
{
    static char what[128];
    if (a->md_bytes != b->md_bytes || a->records != b->records) return "metadata bytes";
    for (size_t i = 0; i < N_KEYS; i++)
        if (a->q[i] != b->q[i]) return snprintf(what, sizeof what, "query of %s", KEYS[i]), what;
    if (a->hint != b->hint) return "the stored hint";
    for (size_t i = 0; i < a->n_gauges; i++)
        if (a->gauges[i] != b->gauges[i])
            return snprintf(what, sizeof what, "gauge %zu: %g -> %g", i, a->gauges[i], b->gauges[i]), what;
    for (size_t i = 0; i < a->n_counters; i++)
        if (a->counters[i] != b->counters[i])
            return snprintf(what, sizeof what, "counter %zu: %g -> %g", i, a->counters[i], b->counters[i]), what;
    return memcmp(a->fw, b->fw, sizeof a->fw) ? "framework memory" : "KVCR DRAM";
}

/* ---- the calls ---------------------------------------------------------------- */

/* What a case's setup leaves for its call. */
typedef struct scene {
    rig r;
    char g3_file[64];
    const char *g3_paths[1];
    kvcr_op_handle op;
    kvcr_release_handle rh[2];
    kvcr_t *created;
} scene;

/* Deposits (or delivers) keys first, first + 1 from (into) framework
 * blocks at, at + 1. */
static int submit(scene *s, bool deliver, size_t first, size_t at, unsigned flags)
{
    kvcr_mem_ref refs[2] = {{NULL, "", at}, {NULL, "", at + 1}};
    kvcr_block b[2] = {{key_of(KEYS[first]), &refs[0], 1}, {key_of(KEYS[first + 1]), &refs[1], 1}};
    return deliver ? kvcr_deliver(s->r.kv, b, 2, NULL, &s->op)
                   : kvcr_deposit(s->r.kv, b, 2, flags, &s->op);
}

static int call_create(scene *s)
{
    return kvcr_create(&s->r.cfg, &s->created);
}

static int call_deposit(scene *s)
{
    return submit(s, false, 4, 4, 0);
}

static int call_deposit_ex(scene *s)
{
    kvcr_mem_ref ref = {NULL, "", 6};
    kvcr_block b = {key_of(KEYS[6]), &ref, 1};
    const char *hints = "{\"tenant\":\"alice\"}";
    kvcr_deposit_options o = {.version = KVCR_DEPOSIT_OPTIONS_VERSION, .flags = KVCR_NO_EVICT,
                              .hints = hints, .hints_len = strlen(hints)};
    return kvcr_deposit_ex(s->r.kv, &b, 1, &o, &s->op);
}

static int call_deliver(scene *s)
{
    return submit(s, true, 0, 8, 0);
}

static int call_fetch(scene *s)
{
    kvcr_key k[2] = {key_of(KEYS[0]), key_of(KEYS[1])};
    return kvcr_fetch(s->r.kv, k, 2, "req", NULL, 0, &s->op);
}

static int call_query(scene *s)
{
    kvcr_key k[N_KEYS];
    kvcr_query_result q[N_KEYS];
    for (size_t i = 0; i < N_KEYS; i++) k[i] = key_of(KEYS[i]);
    return kvcr_query(s->r.kv, k, N_KEYS, "req", q);
}

static int call_submit_hint(scene *s)
{
    return kvcr_submit_hint(s->r.kv, "req", HINT, strlen(HINT));
}

static int call_align(scene *s)
{
    kvcr_key k[4] = {key_of(KEYS[3]), key_of(KEYS[2]), key_of(KEYS[1]), key_of(KEYS[0])};
    return kvcr_align_sequence(s->r.kv, k, 4, true);
}

static int call_release(scene *s)
{
    bool released[2];
    return kvcr_release(s->r.kv, s->rh, 2, released);
}

static int call_abort(scene *s)
{
    size_t aborted;
    return kvcr_abort(s->r.kv, s->op, NULL, 0, &aborted);
}

static int call_fetch_ex(scene *s)
{
    kvcr_key k[2] = {key_of(KEYS[2]), key_of(KEYS[3])};
    const char *hints = "{\"tenant\":\"bob\"}";
    kvcr_fetch_options o = {.version = KVCR_FETCH_OPTIONS_VERSION, .hints = hints,
                            .hints_len = strlen(hints)};
    return kvcr_fetch_ex(s->r.kv, k, 2, "req", NULL, 0, &o, &s->op);
}

static int call_discard_hint(scene *s)
{
    return kvcr_discard_hint(s->r.kv, "req");
}

static int call_poll(scene *s)
{
    kvcr_op_result *res;
    size_t n;
    int rc = kvcr_poll(s->r.kv, &res, &n);
    if (rc == 0) {
        assert_int_equal(n, 1); /* the deposit's result, due (setup_completed) */
        assert_true(res[0].op == s->op);
        kvcr_results_free(res);
    }
    return rc;
}

static int call_stats(scene *s)
{
    kvcr_stats *st = NULL;
    int rc = kvcr_stats_take(s->r.kv, &st);
    kvcr_stats_free(st);
    return rc;
}

/* Blocks k0..k3 stored (k0, k1 held by release handles); "req" hinted. */
static void setup_stored(scene *s)
{
    kvcr_entry_status st[2];
    assert_int_equal(submit(s, false, 0, 0, KVCR_NO_EVICT), 0);
    assert_int_equal(rig_wait(&s->r, s->op, st, NULL, s->rh), 2);
    assert_int_equal(st[0], KVCR_ENTRY_SUCCESS);
    assert_int_equal(submit(s, false, 2, 2, 0), 0);
    rig_wait(&s->r, s->op, NULL, NULL, NULL);
    assert_int_equal(kvcr_submit_hint(s->r.kv, "req", HINT, strlen(HINT)), 0);
    for (size_t i = 0; i < FW; i++) rig_pattern(&s->r, i, (uint32_t)i + 1);
}

/* As setup_stored, and a deposit of k4, k5 held before its copies. */
static void setup_held(scene *s)
{
    setup_stored(s);
    kvcr__test_copy_gate(s->r.kv, KVCR_TEST_GATE_HOLD_QUEUED);
    assert_int_equal(submit(s, false, 4, 4, 0), 0);
}

/* As setup_stored, and a deposit of k4 whose copy completed: its result
 * waits for kvcr_poll. With nothing else in flight once the fd is drained,
 * the copy's completion is what makes it readable again. */
static void setup_completed(scene *s)
{
    setup_stored(s);
    rig_pump(&s->r);
    kvcr_mem_ref ref = {NULL, "", 4};
    kvcr_block b = {key_of(KEYS[4]), &ref, 1};
    assert_int_equal(kvcr_deposit(s->r.kv, &b, 1, 0, &s->op), 0);
    struct pollfd p = {kvcr_fd(s->r.kv), POLLIN, 0};
    assert_int_equal(poll(&p, 1, 10000), 1);
}

typedef struct enomem_case {
    const char *name;
    bool started;             /* the instance is running before the call */
    bool absorbs;             /* succeeds without the allocation (see CASES) */
    bool g3;                  /* the instance has a G3 tier */
    void (*setup)(scene *s);  /* NULL: none */
    int (*call)(scene *s);
} enomem_case;

/* Calls that cannot fail for memory: kvcr_release (a released block its
 * eviction queue has no room for waits on the unscored list, queued by a
 * later call), kvcr_abort (an aborted block's index id that the free list
 * has no room for is never reused) and kvcr_poll, for what it settles
 * (an inventory event it has no memory for is lost, and logged as an
 * error); kvcr_poll's results are another matter: see run_failing. */
static const enomem_case CASES[] = {
    {"kvcr_create", false, false, false, NULL, call_create},
    {"kvcr_create (G3)", false, false, true, NULL, call_create},
    {"kvcr_deposit", true, false, false, setup_stored, call_deposit},
    {"kvcr_deposit_ex", true, false, false, setup_stored, call_deposit_ex},
    {"kvcr_deliver", true, false, false, setup_stored, call_deliver},
    {"kvcr_fetch", true, false, false, setup_stored, call_fetch},
    {"kvcr_fetch_ex", true, false, false, setup_stored, call_fetch_ex},
    {"kvcr_query", true, false, false, setup_stored, call_query},
    {"kvcr_submit_hint", true, false, false, setup_stored, call_submit_hint},
    {"kvcr_discard_hint", true, false, false, setup_stored, call_discard_hint},
    {"kvcr_align_sequence", true, false, false, setup_stored, call_align},
    {"kvcr_release", true, true, false, setup_stored, call_release},
    {"kvcr_abort", true, true, false, setup_held, call_abort},
    {"kvcr_poll", true, true, false, setup_completed, call_poll},
    {"kvcr_stats_take", true, false, false, setup_stored, call_stats},
    {"kvcr_stats_take (G3)", true, false, true, setup_stored, call_stats},
};

static void scene_start(scene *s, const enomem_case *c)
{
    static const kvcr_tenant tenants[] = {{"alice", 4, 0}, {"bob", 4, 0}};
    memset(s, 0, sizeof *s);
    rig_init(&s->r, BS, FW, SLOTS);
    s->r.cfg.enable_telemetry = true;
    s->r.cfg.tenants = tenants;
    s->r.cfg.n_tenants = 2;
    if (c->g3) { /* a fresh name: the instance makes the file */
        snprintf(s->g3_file, sizeof s->g3_file, "/var/tmp/kvcr-enomem-XXXXXX");
        int fd = mkstemp(s->g3_file);
        assert_true(fd >= 0);
        close(fd);
        unlink(s->g3_file);
        s->g3_paths[0] = s->g3_file;
        s->r.cfg.g3.paths = s->g3_paths;
        s->r.cfg.g3.n_paths = 1;
        s->r.cfg.g3.capacity_bytes_per_file = 2 * SLOTS * BS;
    }
    if (!c->started) return;
    rig_start(&s->r);
    if (c->setup) c->setup(s);
    /* Counters count since the last kvcr_stats_take: from here on, what
     * the call under test adds. */
    kvcr_stats *st;
    assert_int_equal(kvcr_stats_take(s->r.kv, &st), 0);
    kvcr_stats_free(st);
}

static void scene_stop(scene *s)
{
    if (s->r.kv) kvcr__test_copy_gate(s->r.kv, KVCR_TEST_GATE_OPEN);
    if (s->created) {
        assert_int_equal(kvcr_close(s->created), 0);
        kvcr_free(s->created);
    }
    rig_stop(&s->r);
    if (s->g3_file[0]) unlink(s->g3_file);
}

/* What one run with a failing allocation came to. */
typedef enum outcome { RAN_OUT, FAILED_ENOMEM, FAILED_ESYS, ABSORBED } outcome;

/* Runs case c with its nth allocation failing. RAN_OUT: the call made
 * fewer than n allocations, and succeeded. Else the call failed, with
 * KVCR_ENOMEM, or KVCR_ESYS where the allocation was a system call's
 * (pthread_create's, for a thread), and changed nothing; or, for a case
 * that absorbs a failure, succeeded: ABSORBED. */
static outcome run_failing(const enomem_case *c, unsigned n)
{
    static observed before, after;
    scene s;
    scene_start(&s, c);
    if (s.r.kv) observe(&s.r, &before);
    arm(n);
    int rc = c->call(&s);
    bool hit = disarm();
    if (!hit) {
        if (rc != 0) fail_msg("%s: %s", c->name, kvcr_last_error());
        scene_stop(&s);
        return RAN_OUT;
    }
    if (rc == 0 && c->absorbs) {
        scene_stop(&s);
        return ABSORBED;
    }
    if (rc != KVCR_ENOMEM && rc != KVCR_ESYS)
        fail_msg("%s with allocation %u failing returned %d (%s), not KVCR_ENOMEM", c->name, n, rc,
                 rc ? kvcr_last_error() : "success");
    if (c->call == call_poll) {
        /* kvcr_poll settles what completed before it fails: the instance
         * moves on, and the result that was due comes in a later poll. */
        kvcr_entry_status st;
        assert_int_equal(rig_wait(&s.r, s.op, &st, NULL, NULL), 1);
        assert_int_equal(st, KVCR_ENTRY_SUCCESS);
    } else if (s.r.kv) {
        observe(&s.r, &after);
        if (memcmp(&before, &after, sizeof before) != 0)
            fail_msg("%s with allocation %u failing changed the instance's state: %s", c->name, n,
                     what_changed(&before, &after));
    } else {
        assert_null(s.created);
    }
    scene_stop(&s);
    return rc == KVCR_ENOMEM ? FAILED_ENOMEM : FAILED_ESYS;
}

static void test_every_enomem_path_changes_no_state(void **state)
{
    (void)state;
    if (!can_fail_allocations()) {
        print_message("skipped: malloc is the sanitizer's or valgrind's here\n");
        skip();
    }
    unsigned paths = 0;
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        unsigned n = 1, count[4] = {0};
        outcome o;
        while ((o = run_failing(&CASES[i], n)) != RAN_OUT) n++, count[o]++;
        print_message("%-20s %3u allocations: %u KVCR_ENOMEM, %u KVCR_ESYS, %u absorbed\n",
                      CASES[i].name, n - 1, count[FAILED_ENOMEM], count[FAILED_ESYS],
                      count[ABSORBED]);
        paths += count[FAILED_ENOMEM];
    }
    print_message("%u KVCR_ENOMEM paths in all\n", paths);
    assert_true(paths > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_enomem_path_changes_no_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
