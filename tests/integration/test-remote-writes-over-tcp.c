/* How a source's UCX writes go where every lane is TCP (the test runs with
 * UCX_TLS=tcp, tests/CMakeLists.txt), with real processes on 127.0.0.1.
 * This test process is the source (its KVCR DRAM holds k0..k<KEYS-1>,
 * pattern i); each target is a kvcr-test-peer process pulling with
 * PEER_CMD_PULL, which checks every delivered byte. The target's put_min
 * (KVCR_TCP_PUT_MIN, read when it starts) decides, per write:
 *
 *   - blocks at least put_min: the writes go as puts + flush;
 *   - blocks below it: as messages the target copies into place;
 *   - a target that sends no put_min (KVCR_TCP_PUT_MIN=0: as one from
 *     before put_min was on the wire): as messages.
 *
 * What went which way is read from the source's gauges ucx_writes_as_puts
 * and ucx_writes_as_messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"

#define BS (64u << 10)
#define KEYS 8
#define KEYS_PER_OP 4 /* 256 KiB a pull: above the inline bound */
#define OPS 6
/* No operation here may meet its deadline, also under sanitizers on a
 * loaded machine: every outcome asserted is a success. */
#define OP_MS 60000u

static void source_start(rig *r)
{
    rig_init_remote(r, BS, KEYS, KEYS);
    r->cfg.agent_name = "source";
    r->cfg.enable_telemetry = true;
    r->cfg.operation_timeout_ms = OP_MS;
    r->cfg.abandon_timeout_ms = 2 * OP_MS;
    rig_start(r);
    char names[KEYS][24];
    const char *keys[KEYS];
    size_t at[KEYS];
    for (uint32_t i = 0; i < KEYS; i++) {
        rig_pattern(r, i, i);
        keys[i] = peer_key(names[i], sizeof names[i], i), at[i] = i;
    }
    kvcr_entry_status st[KEYS];
    assert_int_equal(rig_wait(r, rig_deposit(r, keys, at, KEYS, 0), st, NULL, NULL), KEYS);
    for (uint32_t i = 0; i < KEYS; i++) assert_int_equal(st[i], KVCR_ENTRY_SUCCESS);
}

typedef struct ways {
    double puts, messages;
} ways;

static ways ways_now(rig *src)
{
    ways w = {rig_stat(src, "ucx_writes_as_puts", NULL),
              rig_stat(src, "ucx_writes_as_messages", NULL)};
    assert_true(w.puts >= 0 && w.messages >= 0); /* both gauges are there */
    return w;
}

/* A target (agent `agent`, started with KVCR_TCP_PUT_MIN=put_min) pulls
 * OPS operations of KEYS_PER_OP keys from src, every byte checked by it;
 * returns how the source's writes went meanwhile. */
static ways pull_with_put_min(rig *src, const char *agent, const char *put_min)
{
    setenv("KVCR_TCP_PUT_MIN", put_min, 1);
    peer_opts o;
    peer_opts_init(&o);
    o.block_size = BS;
    o.slots = 0;
    o.fw_n = KEYS;
    o.op_timeout_ms = OP_MS;
    o.abandon_timeout_ms = 2 * OP_MS;
    o.agent = agent;
    peer t;
    peer_spawn(&t, &o);
    unsetenv("KVCR_TCP_PUT_MIN");
    ways before = ways_now(src);
    peer_pull job = {.first = 0, .span = KEYS, .keys_per_op = KEYS_PER_OP, .depth = 1,
                     .n_ops = OPS, .max_ms = 30000};
    snprintf(job.source, sizeof job.source, "%s", kvcr_control_endpoint(src->kv));
    peer_pull_start(&t, &job);
    peer_pull_stats st = {0};
    for (uint64_t until = rig_now_ms() + 30000; st.done < OPS && rig_now_ms() < until;) {
        rig_pump(src);
        st = peer_pull_stats_get(&t);
        if (st.done < OPS) rig_await(src, 1); /* a pin request or a write to settle wakes it */
    }
    if (st.done < OPS) fail_msg("the target finished %llu of %d pulls within 30 s",
                                (unsigned long long)st.done, OPS);
    assert_int_equal(st.ok_ops, OPS);
    assert_int_equal(st.ok_entries, OPS * KEYS_PER_OP);
    assert_int_equal(st.bad_bytes, 0);
    assert_int_equal(st.busy_entries + st.other_entries, 0);
    peer_stop(&t);
    ways after = ways_now(src);
    return (ways){after.puts - before.puts, after.messages - before.messages};
}

static void test_blocks_at_least_put_min_go_as_puts_smaller_ones_as_messages(void **state)
{
    (void)state;
    rig src;
    source_start(&src);
    char at_block[16], above_block[16];
    snprintf(at_block, sizeof at_block, "%u", BS);
    snprintf(above_block, sizeof above_block, "%u", BS + 1);
    ways w = pull_with_put_min(&src, "target-puts", at_block);
    assert_true(w.puts == OPS);
    assert_true(w.messages == 0);
    w = pull_with_put_min(&src, "target-messages", above_block);
    assert_true(w.puts == 0);
    assert_true(w.messages == OPS);
    rig_stop(&src);
}

static void test_a_target_that_sends_no_put_min_gets_messages(void **state)
{
    (void)state;
    rig src;
    source_start(&src);
    ways w = pull_with_put_min(&src, "target-old", "0");
    assert_true(w.puts == 0);
    assert_true(w.messages == OPS);
    rig_stop(&src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_at_least_put_min_go_as_puts_smaller_ones_as_messages),
        cmocka_unit_test(test_a_target_that_sends_no_put_min_gets_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
