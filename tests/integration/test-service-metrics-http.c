/* The service's metrics, from a real `kvcr service --metrics-listen
 * 127.0.0.1:0`: the text of `kvcr stats` and of GET /metrics passes
 * promtool; the HTTP responder answers each kind of request with its status
 * (200, 404, 405, 400, 431, 408, 503), closes every connection after its
 * answer, logs one line for many malformed requests, counts them all in the
 * metrics, and goes on serving after each.
 *
 * One service for the whole file (group set-up), so the tests run in order
 * and the counts accumulate; the requests are raw bytes over a socket,
 * because malformed ones are the point. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "promtool.h"
#include "tool_util.h"

#define WAIT_S 10.0
#define IDLE_BOUND 16 /* the responder's connection bound (SVC_HTTP_MAX_CONNS) */

typedef struct svc {
    char dir[64], sock[96], log[96];
    pid_t pid;
    int port;
} svc;

static svc g_svc;

/* The whole output of a shell command (malloc'd); its exit status in *status. */
static char *run(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (size_t n; (n = fread(out + len, 1, cap - 1 - len, p)) > 0;) {
        len += n;
        if (cap - 1 - len == 0) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    *status = pclose(p);
    return out;
}

/* What `kvcr stats --socket` prints (malloc'd); NULL when it fails. */
static char *stats_text(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "'%s' stats --socket '%s'", KVCR_TOOL, g_svc.sock);
    int status;
    char *out = run(cmd, &status);
    if (status != 0) {
        free(out);
        return NULL;
    }
    return out;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) return strdup("");
    char *out = calloc(1, 1 << 20);
    fread(out, 1, (1 << 20) - 1, f);
    fclose(f);
    return out;
}

/* Waits for the log line naming the metrics address (bounded: WAIT_S),
 * reading the log again each time it is written to (watch: an inotify fd
 * on it); the port, 0 if none came. */
static int wait_port(int watch)
{
    const char *mark = "metrics at http://127.0.0.1:";
    for (double end = tool_now() + WAIT_S;;) {
        char *log = read_file(g_svc.log);
        char *at = strstr(log, mark);
        int port = at ? atoi(at + strlen(mark)) : 0;
        free(log);
        double left = end - tool_now();
        if (port > 0 || left <= 0) return port;
        struct pollfd p = {watch, POLLIN, 0};
        char events[4096];
        if (poll(&p, 1, (int)(left * 1000) + 1) == 1 && read(watch, events, sizeof events) < 0)
            return 0;
    }
}

/* SIGTERM: the service must exit 0 (it removes its pool files and socket);
 * then the directory goes. */
static int stop_service(void **state)
{
    (void)state;
    int status = -1;
    if (g_svc.pid > 0) {
        kill(g_svc.pid, SIGTERM);
        waitpid(g_svc.pid, &status, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_svc.dir);
    if (system(cmd) != 0) return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int start_service(void **state)
{
    (void)state;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_svc.dir, sizeof g_svc.dir, "%s/kvcr-metrics-http-XXXXXX", base);
    if (mkdtemp(g_svc.dir) == NULL) return -1;
    snprintf(g_svc.sock, sizeof g_svc.sock, "%s/claim.sock", g_svc.dir);
    snprintf(g_svc.log, sizeof g_svc.log, "%s/service.log", g_svc.dir);
    int log_fd = open(g_svc.log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int watch = inotify_init1(IN_CLOEXEC);
    if (log_fd < 0 || watch < 0 || inotify_add_watch(watch, g_svc.log, IN_MODIFY) < 0) return -1;
    close(log_fd);
    g_svc.pid = fork();
    if (g_svc.pid == 0) {
        int fd = open(g_svc.log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(KVCR_TOOL, "kvcr", "service", "--socket-path", g_svc.sock, "--pool-dir", g_svc.dir,
              "--guard-count", "2", "--pool-sizes-gb", "0.03125", "--compatibility-digest",
              "metrics-test", "--journal-mb", "4", "--log-level", "info", "--metrics-listen",
              "127.0.0.1:0", (char *)NULL);
        _exit(127);
    }
    g_svc.port = wait_port(watch);
    close(watch);
    /* Then the claim socket: `kvcr stats` asked until it answers (a poll
     * for the service's readiness, bounded). */
    for (double end = tool_now() + WAIT_S; g_svc.port > 0 && tool_now() < end; usleep(10000)) {
        char *text = stats_text();
        bool up = text != NULL;
        free(text);
        if (up) return 0;
    }
    char *log = read_file(g_svc.log);
    fprintf(stderr, "kvcr service did not come up:\n%s\n", log);
    free(log);
    stop_service(state); /* cmocka runs no teardown after a failed set-up */
    return -1;
}

/* ---- a raw HTTP client ------------------------------------------------------------------ */

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_svc.port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Everything the server sends until it closes (bounded: fails after WAIT_S). */
static char *read_to_close(int fd)
{
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (double end = tool_now() + WAIT_S;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)((end - tool_now()) * 1e3);
        if (left <= 0 || poll(&pf, 1, left) <= 0) fail_msg("no close from the server in time");
        ssize_t n = recv(fd, out + len, cap - 1 - len, 0);
        if (n <= 0) break; /* closed (a reset after the answer counts as closed too) */
        len += (size_t)n;
        if (cap - 1 - len == 0) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    return out;
}

/* Sends request (len bytes), returns the whole answer; the server closed. */
static char *exchange(const char *request, size_t len)
{
    int fd = dial();
    assert_int_equal(send(fd, request, len, MSG_NOSIGNAL), (ssize_t)len);
    char *reply = read_to_close(fd);
    close(fd);
    return reply;
}

static int status_of(const char *reply)
{
    int status = 0;
    if (sscanf(reply, "HTTP/1.1 %d ", &status) != 1) fail_msg("not an HTTP answer: %s", reply);
    return status;
}

static void expect_status(const char *request, int want)
{
    char *reply = exchange(request, strlen(request));
    if (status_of(reply) != want)
        fail_msg("%d expected for %s\ngot:\n%s", want, request, reply);
    free(reply);
}

static const char *body_of(const char *reply)
{
    const char *b = strstr(reply, "\r\n\r\n");
    assert_non_null(b);
    return b + 4;
}

static double service_metric(const char *name)
{
    char *text = stats_text();
    assert_non_null(text);
    double v = tool_metric(text, name);
    free(text);
    return v;
}

#define GET_METRICS "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: t\r\n\r\n"

/* ---- tests ------------------------------------------------------------------------------- */

static void test_kvcr_stats_text_passes_promtool(void **state)
{
    (void)state;
    char *text = stats_text();
    assert_non_null(text);
    assert_non_null(strstr(text, "# TYPE kvcr_guard_claims_total counter\n"
                                 "kvcr_guard_claims_total{guard=\"0\"} 0\n"
                                 "kvcr_guard_claims_total{guard=\"1\"} 0\n"));
    assert_true(tool_metric(text, "kvcr_guard_phase{guard=\"1\",phase=\"idle\"}") == 1);
    assert_true(tool_metric(text, "kvcr_service_guards") == 2);
    assert_true(tool_metric(text, "kvcr_service_http_requests_total{code=\"200\"}") == 0);
    assert_promtool_clean(text);
    free(text);
}

static void test_get_metrics(void **state)
{
    (void)state;
    char *reply = exchange(GET_METRICS, strlen(GET_METRICS));
    assert_int_equal(status_of(reply), 200);
    assert_non_null(strstr(reply, "\r\nContent-Type: text/plain; version=0.0.4\r\n"));
    assert_non_null(strstr(reply, "\r\nConnection: close\r\n"));
    const char *body = body_of(reply);
    char want[64];
    snprintf(want, sizeof want, "\r\nContent-Length: %zu\r\n", strlen(body));
    assert_non_null(strstr(reply, want));
    assert_true(tool_metric(body, "kvcr_service_up") == 1);
    assert_true(tool_metric(body, "kvcr_guard_pool_bytes{guard=\"0\"}") > 0);
    assert_promtool_clean(body);
    free(reply);

    /* HTTP/1.0 needs no Host; a query is ignored; HEAD has the headers only. */
    expect_status("GET /metrics?x=1 HTTP/1.0\r\n\r\n", 200);
    const char *head = "HEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
    reply = exchange(head, strlen(head));
    assert_int_equal(status_of(reply), 200);
    assert_string_equal(body_of(reply), "");
    assert_null(strstr(reply, "\r\nContent-Length: 0\r\n"));
    free(reply);
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"200\"}") == 3);
}

static void test_other_paths_and_methods(void **state)
{
    (void)state;
    expect_status("GET / HTTP/1.1\r\nHost: a\r\n\r\n", 404);
    expect_status("GET /metricsx HTTP/1.1\r\nHost: a\r\n\r\n", 404);
    expect_status("POST /other HTTP/1.1\r\nHost: a\r\n\r\n", 404);
    const char *post = "POST /metrics HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc";
    char *reply = exchange(post, strlen(post));
    assert_int_equal(status_of(reply), 405);
    assert_non_null(strstr(reply, "\r\nAllow: GET, HEAD\r\n"));
    free(reply);
    expect_status("DELETE /metrics HTTP/1.1\r\nHost: a\r\n\r\n", 405);
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"404\"}") == 3);
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"405\"}") == 2);
}

static const char *const malformed[] = {
    "GARBAGE\r\n\r\n",                               /* no target, no version */
    "GET /metrics HTTP/1.1\n\n",                     /* bare LF */
    "GET /metrics HTTP/1.1\r\n\r\n",                 /* HTTP/1.1 without Host */
    "GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", /* two Hosts */
    "GET /metrics HTTP/2.0\r\nHost: a\r\n\r\n",      /* another version */
    "GET  /metrics HTTP/1.1\r\nHost: a\r\n\r\n",     /* two spaces */
    "GET metrics HTTP/1.1\r\nHost: a\r\n\r\n",       /* not an origin-form target */
    "GET /met rics HTTP/1.1\r\nHost: a\r\n\r\n",     /* a space in the target */
    "GET /metrics HTTP/1.1 \r\nHost: a\r\n\r\n",     /* a trailing space */
    "G(T /metrics HTTP/1.1\r\nHost: a\r\n\r\n",      /* not a token */
    "GET /metrics HTTP/1.1\r\nHost a\r\n\r\n",       /* a header without a colon */
    "GET /metrics HTTP/1.1\r\n Host: a\r\n\r\n",     /* a folded line */
    "GET /metrics HTTP/1.1\r\nHost: a\001\r\n\r\n",  /* a control character */
    "\r\nGET /metrics HTTP/1.1\r\nHost: a\r\n\r\n",  /* an empty first line */
};
#define N_MALFORMED (sizeof malformed / sizeof malformed[0])

static size_t count_lines(const char *text, const char *what)
{
    size_t n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
    return n;
}

static void test_malformed_requests_are_400_and_logged_once(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_MALFORMED; i++) expect_status(malformed[i], 400);
    /* A malformed request line is answered at once, before any header. */
    char *reply = exchange("BAD\r\n", 5);
    assert_int_equal(status_of(reply), 400);
    free(reply);
    expect_status(GET_METRICS, 200); /* it goes on */
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"400\"}") ==
                N_MALFORMED + 1);
    char *log = read_file(g_svc.log);
    assert_int_equal(count_lines(log, "malformed request"), 1); /* one a minute at most */
    free(log);
}

static void test_an_oversized_head_is_431(void **state)
{
    (void)state;
    size_t len = 20000; /* over the 8 KiB bound, sent whole before the answer is read */
    char *req = malloc(len + 1);
    int n = snprintf(req, len, "GET /metrics HTTP/1.1\r\nHost: a\r\nX-Pad: ");
    memset(req + n, 'a', len - (size_t)n);
    req[len] = '\0';
    char *reply = exchange(req, len);
    assert_int_equal(status_of(reply), 431);
    free(reply);
    free(req);
    expect_status(GET_METRICS, 200);
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"431\"}") == 1);
}

/* Over the connection bound a connection is answered 503 at once; the idle
 * ones hold nothing else up once they are gone. (A connection still open
 * from an earlier test only moves the 503 one connection earlier.) */
static void test_connections_are_bounded(void **state)
{
    (void)state;
    int idle[IDLE_BOUND];
    for (int i = 0; i < IDLE_BOUND; i++) idle[i] = dial();
    int extra = dial();
    char *reply = read_to_close(extra);
    assert_int_equal(status_of(reply), 503);
    free(reply);
    close(extra);
    /* Each idle client leaves without finishing a request; the service
     * closes it without an answer (or a 408 past the head deadline, on a
     * slow runner), which frees its place. */
    for (int i = 0; i < IDLE_BOUND; i++) {
        shutdown(idle[i], SHUT_WR);
        reply = read_to_close(idle[i]);
        if (reply[0] != '\0' && status_of(reply) != 503 && status_of(reply) != 408)
            fail_msg("an idle connection was answered: %s", reply);
        free(reply);
        close(idle[i]);
    }
    expect_status(GET_METRICS, 200);
    assert_true(service_metric("kvcr_service_http_requests_total{code=\"503\"}") >= 1);
}

/* A request that never ends is answered 408 after the head deadline (5 s);
 * other clients are served meanwhile. */
static void test_a_slow_request_times_out(void **state)
{
    (void)state;
    int slow = dial();
    const char *part = "GET /metrics HTTP/1.1\r\nHost: a\r\n";
    assert_int_equal(send(slow, part, strlen(part), MSG_NOSIGNAL), (ssize_t)strlen(part));
    expect_status(GET_METRICS, 200);
    char *reply = read_to_close(slow);
    assert_int_equal(status_of(reply), 408);
    free(reply);
    close(slow);

    /* Every status has been answered by now: the counts pass promtool too. */
    char *text = stats_text();
    assert_non_null(text);
    assert_true(tool_metric(text, "kvcr_service_http_requests_total{code=\"408\"}") == 1);
    assert_promtool_clean(text);
    free(text);
}

/* A second service that cannot listen where it is told: it does not start,
 * says why, and leaves nothing behind (its pool files are removed). Bounded
 * by timeout(1), should one start after all. */
static void expect_refused(const char *listen, const char *why)
{
    char dir[128], cmd[1024];
    snprintf(dir, sizeof dir, "%s/other", g_svc.dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' service --socket-path '%s/claim.sock' --pool-dir '%s' "
             "--guard-count 1 --pool-sizes-gb 0.03125 --compatibility-digest x --journal-mb 4 "
             "--metrics-listen '%s' 2>&1", KVCR_TOOL, dir, dir, listen);
    int status;
    char *out = run(cmd, &status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || strstr(out, why) == NULL)
        fail_msg("--metrics-listen %s: exit 1 and \"%s\" expected, got:\n%s", listen, why, out);
    free(out);
    assert_int_equal(rmdir(dir), 0); /* empty again */
}

static void test_bad_listen_addresses_are_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {"127.0.0.1", "127.0.0.1:", "127.0.0.1:65536",
                                      "127.0.0.1:80x", "::1:80", "[::1:80", "[]:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_refused(bad[i], "--metrics-listen must be HOST:PORT");
    char taken[32];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", g_svc.port);
    expect_refused(taken, "cannot listen for metrics on");
    expect_status(GET_METRICS, 200); /* the first service is untouched */
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kvcr_stats_text_passes_promtool),
        cmocka_unit_test(test_get_metrics),
        cmocka_unit_test(test_other_paths_and_methods),
        cmocka_unit_test(test_malformed_requests_are_400_and_logged_once),
        cmocka_unit_test(test_an_oversized_head_is_431),
        cmocka_unit_test(test_connections_are_bounded),
        cmocka_unit_test(test_a_slow_request_times_out),
        cmocka_unit_test(test_bad_listen_addresses_are_refused),
    };
    return cmocka_run_group_tests(tests, start_service, stop_service);
}
