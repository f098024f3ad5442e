/* kvcr demo's engines bind their KV-event endpoints as vLLM's engines do,
 * so routers and monitors other than the demo's own attach while it runs:
 * a subscriber connected to every engine's documented port
 * (--kv-events-port P: tcp://127.0.0.1:(P+e)) before the demo starts, and
 * a second one connected to engine 0 once the demo is running, each hear
 * batches of exactly three frames (the engine's topic, an 8-byte
 * sequence number, a payload the strict decoder takes); the demo's own
 * router still builds its index (the demo succeeds). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "net/kvev.h"

#define PORT 29400  /* engine e publishes on PORT + e, replays on PORT + 100 + e */
#define ENGINES 2
#define WAIT_MS 60000

extern char **environ;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *sub_to(void *ctx, int engine)
{
    char where[64], topic[32];
    snprintf(where, sizeof where, "tcp://127.0.0.1:%d", PORT + engine);
    snprintf(topic, sizeof topic, "kv@engine-%d@demo", engine);
    void *s = zmq_socket(ctx, ZMQ_SUB);
    int zero = 0;
    assert_non_null(s);
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    assert_int_equal(zmq_setsockopt(s, ZMQ_SUBSCRIBE, topic, strlen(topic)), 0);
    assert_int_equal(zmq_connect(s, where), 0);
    return s;
}

/* One message, if one comes within ms: checked frame by frame and decoded.
 * true when one came. */
static bool hear(void *s, int engine, int ms)
{
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return false;
    char topic[32], want[32];
    snprintf(want, sizeof want, "kv@engine-%d@demo", engine);
    int n = zmq_recv(s, topic, sizeof topic, 0);
    assert_int_equal(n, (int)strlen(want));
    assert_memory_equal(topic, want, (size_t)n);
    uint8_t seq[9];
    assert_int_equal(zmq_recv(s, seq, sizeof seq, 0), 8);
    zmq_msg_t pl;
    zmq_msg_init(&pl);
    assert_true(zmq_msg_recv(&pl, s, 0) >= 0);
    assert_false(zmq_msg_more(&pl)); /* exactly three frames */
    kvev_batch b;
    const char *why = kvev_decode_batch(zmq_msg_data(&pl), zmq_msg_size(&pl), &b);
    if (why) fail_msg("engine %d's batch does not decode: %s", engine, why);
    kvev_batch_free(&b);
    zmq_msg_close(&pl);
    return true;
}

static void test_other_subscribers_attach_to_a_running_demo(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *early[ENGINES];
    for (int e = 0; e < ENGINES; e++) early[e] = sub_to(ctx, e); /* before the engines bind */

    char port[16], engines[8];
    snprintf(port, sizeof port, "%d", PORT);
    snprintf(engines, sizeof engines, "%d", ENGINES);
    char *argv[] = {KVCR_TOOL, "demo", "--quick", "--requests", "600", "--engines", engines,
                    "--kv-events-port", port, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, KVCR_TOOL, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);

    /* Every engine is heard by the early subscriber (bounded). */
    double end = now_ms() + WAIT_MS;
    bool heard[ENGINES] = {false};
    int left = ENGINES;
    while (left > 0 && now_ms() < end)
        for (int e = 0; e < ENGINES; e++)
            if (!heard[e] && hear(early[e], e, 50)) heard[e] = true, left--;
    if (left > 0) kill(pid, SIGKILL);
    assert_int_equal(left, 0);

    /* The demo is running (engine 0 published): one more subscriber joins
     * and is answered at once (an empty batch numbered as the next), then
     * hears the stream go on. */
    void *late = sub_to(ctx, 0);
    bool joined = false;
    while (!joined && now_ms() < end) joined = hear(late, 0, 50);
    if (!joined) kill(pid, SIGKILL);
    assert_true(joined);

    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0); /* the demo's own router did its work too */
    for (int e = 0; e < ENGINES; e++) zmq_close(early[e]);
    zmq_close(late);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_subscribers_attach_to_a_running_demo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
