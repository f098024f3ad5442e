"""A Python policy is really consulted; callbacks run where promised and are
contained when they raise; stats are filled through the factory."""
import logging
import mmap
import select
import threading
import time

import pytest

import kvcr
from conftest import address_of, poll_until
from kvcr import CacheTier, OpEntryStatus, PlacementAction, QueryStatus
from kvcr.policy import native_builtin

KEEP = (PlacementAction.KEEP, None)
DROP = (PlacementAction.DROP, None)


class PriorityPolicy(kvcr.KVCachePolicy):
    """Evicts by an explicit priority (lowest first); records every call."""

    def __init__(self, priority):
        self.priority = priority
        self.calls = []

    def decide_ingest(self, meta, source, required_local, router_hints=None, framework_hints=None):
        self.calls.append(("ingest", bytes(meta.block_key), source, required_local))
        return DROP if bytes(meta.block_key).startswith(b"drop") else KEEP

    def eviction_score(self, meta, source):
        self.calls.append(("score", bytes(meta.block_key), source))
        return self.priority.get(bytes(meta.block_key), 100)

    def decide_eviction(self, meta, source):
        self.calls.append(("evict", bytes(meta.block_key), source))
        return DROP

    def on_ingest(self, meta, source):
        self.calls.append(("on_ingest", bytes(meta.block_key), meta.size_bytes,
                           meta.resident_tiers, source))

    def on_remove(self, meta):
        self.calls.append(("on_remove", bytes(meta.block_key)))

    def evicted(self):
        return [c[1] for c in self.calls if c[0] == "evict"]


def test_a_python_policy_decides_the_eviction_order(rig_factory):
    # Arrival order a, b, c; priority order b, c, a. FIFO or LRU would evict a first.
    p = PriorityPolicy({b"a": 30, b"b": 10, b"c": 20})
    r = rig_factory(slots=3, fw_blocks=8, policy=p)
    for i, k in enumerate([b"a", b"b", b"c"]):
        r.put(i, i)
        assert r.wait(r.kv.deposit({k: r.ref(i)}))[k].success
    for i, k in enumerate([b"x", b"y", b"z"], start=3):
        r.put(i, i)
        assert r.wait(r.kv.deposit({k: r.ref(i)}))[k].success
    assert p.evicted()[:3] == [b"b", b"c", b"a"]
    removed = [e.keys for e in r.events if e.removed]
    assert removed[:3] == [(b"b",), (b"c",), (b"a",)]
    assert ("on_remove", b"b") in p.calls
    ingest = [c for c in p.calls if c[0] == "on_ingest"]
    assert ingest[0] == ("on_ingest", b"a", r.block, frozenset({CacheTier.LOCAL_G2}),
                         CacheTier.FW_G2)
    assert ("ingest", b"a", CacheTier.FW_G2, False) in p.calls
    assert [q for q, _ in r.kv.query([b"a", b"b", b"c", b"x", b"y", b"z"])] == \
        [QueryStatus.MISS] * 3 + [QueryStatus.HIT] * 3


def test_ingest_drop_is_dropped_but_not_for_required_local_work(rig_factory, caplog):
    p = PriorityPolicy({})
    r = rig_factory(policy=p)
    dropped = r.wait(r.kv.deposit({b"drop-me": r.ref(0)}))[b"drop-me"]
    assert dropped.status is OpEntryStatus.DROPPED and not dropped.success
    assert r.kv.query([b"drop-me"]) == [(QueryStatus.MISS, None)]
    kept = r.wait(r.kv.deposit({b"drop-too": r.ref(1)}, no_evict=True))[b"drop-too"]
    assert kept.success and kept.release_handle is not None
    assert ("ingest", b"drop-too", CacheTier.FW_G2, True) in p.calls
    assert "cannot drop required-local work" in caplog.text  # libkvcr's own log line


class Counting(kvcr.LRUPolicy):
    def __init__(self):
        self.scored = 0

    def eviction_score(self, meta, source):
        self.scored += 1
        return super().eviction_score(meta, source)


def test_built_ins_run_natively_and_overrides_run_in_python(rig_factory):
    class Plain(kvcr.LRUPolicy):
        pass

    assert native_builtin(kvcr.FIFOPolicy()) == "fifo"
    assert native_builtin(kvcr.LRUPolicy()) == "lru"
    assert native_builtin(Plain()) == "lru"  # changes no hook
    assert native_builtin(Counting()) is None
    odd = kvcr.LRUPolicy()
    odd.eviction_score = lambda meta, source: 0.0
    assert native_builtin(odd) is None  # an instance override counts too
    p = Counting()
    r = rig_factory(policy=p)
    r.wait(r.kv.deposit({b"a": r.ref(0), b"b": r.ref(1)}))
    assert p.scored == 2


class RaisingPolicy(kvcr.LRUPolicy):
    def __init__(self, hook):
        self.hook = hook

    def decide_ingest(self, *args, **kw):
        if self.hook == "ingest":
            raise RuntimeError("boom")
        if self.hook == "ingest-nonsense":
            return "DROP"
        return super().decide_ingest(*args, **kw)

    def eviction_score(self, meta, source):
        if self.hook == "score":
            raise RuntimeError("boom")
        if self.hook == "score-nan":
            return float("nan")
        return super().eviction_score(meta, source)

    def decide_eviction(self, meta, source):
        if self.hook == "evict":
            raise RuntimeError("boom")
        return super().decide_eviction(meta, source)


@pytest.mark.parametrize("hook,python_says,c_says", [
    ("ingest", "RaisingPolicy.decide_ingest raised", "decide_ingest failed; admitting the block"),
    ("ingest-nonsense", "decide_ingest returned 'DROP'", "decide_ingest failed; admitting the block"),
])
def test_a_failing_ingest_hook_admits_the_block(rig_factory, caplog, hook, python_says, c_says):
    r = rig_factory(policy=RaisingPolicy(hook))
    r.put(0, 5)
    assert r.wait(r.kv.deposit({b"a": r.ref(0)}))[b"a"].success
    assert python_says in caplog.text and c_says in caplog.text
    assert r.kv.query([b"a"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)]


@pytest.mark.parametrize("hook,c_says", [
    ("score", "eviction_score failed; the block is not evictable until it is scored"),
    ("score-nan", "eviction_score failed; the block is not evictable until it is scored"),
    ("evict", "decide_eviction failed; keeping the block"),
])
def test_a_failing_eviction_hook_keeps_the_block(rig_factory, caplog, hook, c_says):
    r = rig_factory(slots=1, policy=RaisingPolicy(hook))
    assert r.wait(r.kv.deposit({b"a": r.ref(0)}))[b"a"].success
    second = r.wait(r.kv.deposit({b"b": r.ref(1)}))[b"b"]
    assert second.status is OpEntryStatus.FAILED and second.reason == "NO_CAPACITY"
    assert r.kv.query([b"a"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)]
    assert c_says in caplog.text
    assert "RaisingPolicy" in caplog.text


def test_a_hook_calling_back_into_kvcr_is_refused_not_deadlocked(rig_factory):
    seen = []

    class Reentrant(kvcr.LRUPolicy):
        def decide_ingest(self, meta, source, required_local, router_hints=None,
                          framework_hints=None):
            try:
                holder[0].query([b"x"])
            except RuntimeError as exc:
                seen.append(str(exc))
            return KEEP

    holder = [None]
    r = rig_factory(policy=Reentrant())
    holder[0] = r.kv
    assert r.wait(r.kv.deposit({b"a": r.ref(0)}))[b"a"].success
    assert seen and "inside a KVCR policy hook" in seen[0]


def test_policy_hooks_never_deadlock_against_python_threads(rig_factory):
    """A hook holds the instance lock and needs the GIL; other threads hold
    the GIL and call KVCR. Every call releases the GIL, so both progress."""
    class Slow(kvcr.LRUPolicy):
        def decide_ingest(self, *a, **kw):
            time.sleep(0.002)  # lets the other threads grab the GIL
            return KEEP

    r = rig_factory(slots=16, fw_blocks=16, policy=Slow())
    stop = threading.Event()
    done = []

    def hammer():
        for _ in range(100_000):
            if stop.is_set():
                break
            r.kv.query([b"k1", b"k2"])
        done.append(True)

    t = threading.Thread(target=hammer)
    t.start()
    op = r.kv.deposit({b"k%d" % i: r.ref(i) for i in range(16)})
    entries = r.wait(op, timeout=20)
    stop.set()
    t.join(timeout=20)
    assert not t.is_alive() and done == [True]
    assert all(e.success for e in entries.values())


def test_inventory_events_arrive_only_inside_poll_on_the_polling_thread(rig_factory):
    threads = []
    events = []

    def sink(event):
        threads.append(threading.get_ident())
        events.append(event)

    r = rig_factory(slots=1, sink=sink)
    op = r.kv.deposit({b"a": r.ref(0)})
    # The copy finished (the fd is readable, bounded wait): no callback ran
    # outside poll.
    readable, _, _ = select.select([r.kv.fileno()], [], [], 10)
    assert readable
    assert events == []
    result = []
    worker = threading.Thread(target=lambda: result.append(r.wait(op)))
    worker.start()
    worker.join(timeout=20)
    assert result and events == [kvcr.InventoryEvent((b"a",), CacheTier.LOCAL_G2, False)]
    assert threads == [worker.ident]
    r.wait(r.kv.deposit({b"b": r.ref(1)}))
    assert events[1:] == [kvcr.InventoryEvent((b"a",), CacheTier.LOCAL_G2, True),
                          kvcr.InventoryEvent((b"b",), CacheTier.LOCAL_G2, False)]
    assert isinstance(events[0].keys, tuple)


def test_one_deposit_reports_its_keys_in_request_order(rig_factory):
    r = rig_factory(slots=8, fw_blocks=8)
    keys = [b"d", b"a", b"c", b"b"]
    r.wait(r.kv.deposit({k: r.ref(i) for i, k in enumerate(keys)}))
    added = [k for e in r.events if not e.removed for k in e.keys]
    assert added == keys


def test_a_raising_sink_is_logged_and_contained_and_a_sink_may_call_kvcr(rig_factory, caplog):
    def bad_sink(event):
        raise ValueError("sink down")

    r = rig_factory(sink=bad_sink)
    assert r.wait(r.kv.deposit({b"c": r.ref(0)}))[b"c"].success
    assert "inventory sink raised" in caplog.text and "sink down" in caplog.text
    assert r.kv.query([b"c"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)]

    seen = []
    holder = []

    def querying_sink(event):  # callbacks run without the instance lock
        seen.append(holder[0].query(list(event.keys)))

    r2 = rig_factory(sink=querying_sink)
    holder.append(r2.kv)
    r2.wait(r2.kv.deposit({b"q": r2.ref(0)}))
    assert seen == [[(QueryStatus.HIT, CacheTier.LOCAL_G2)]]


def test_capacity_callback_fires_once_per_crossing_and_is_contained(rig_factory, caplog):
    needs = []
    r = rig_factory(slots=4, capacity=needs.append, capacity_low_watermark_percent=50)
    handles = []
    for i in range(3):
        e = r.wait(r.kv.deposit({bytes([65 + i]): r.ref(i)}, no_evict=True))
        handles.append(next(iter(e.values())).release_handle)
    assert needs == [[("", 2)]]
    r.kv.release(handles)
    r.kv.poll_completed()
    assert needs == [[("", 2)]]

    def boom(needs):
        raise OSError("no")

    r2 = rig_factory(slots=2, capacity=boom, capacity_low_watermark_percent=100)
    assert r2.wait(r2.kv.deposit({b"a": r2.ref(0)}, no_evict=True))[b"a"].success
    assert "capacity_needed_callback raised" in caplog.text


def state_resources(stats):
    return {labels[0] for name, _, labels in stats.of("gauge") if name == kvcr.STATE_METRIC}


def test_stats_are_filled_through_the_factory(rig_factory):
    r = rig_factory(telemetry=True)
    assert len(r.stats_made) == 1  # one object at construction
    first = r.kv.get_stats()
    assert first is r.stats_made[0] and len(r.stats_made) == 2
    assert {c[0] for c in first.calls} == {"gauge"}  # only state right after start
    assert {"block_records", "in_flight_ops", "local_g2_free_slots",
            "local_g2_pool_default_total_slots"} <= state_resources(first)
    r.put(0, 1)
    r.put(1, 2)
    r.wait(r.kv.deposit({b"a": r.ref(0), b"b": r.ref(1)}))
    r.wait(r.kv.deliver({b"a": r.ref(2)}))
    stats = r.kv.get_stats()
    assert stats is r.stats_made[1] and len(r.stats_made) == 3
    counters = {(name, labels): value for name, value, labels in stats.of("counter")}
    assert counters[(kvcr.TRANSFER_BLOCKS_METRIC, ("local_fill",))] == 2
    assert counters[(kvcr.TRANSFER_BYTES_METRIC, ("local_fill",))] == 2 * r.block
    assert counters[(kvcr.TRANSFER_BLOCKS_METRIC, ("local_deliver",))] == 1
    durations = [(labels, v) for name, v, labels in stats.of("histogram")
                 if name == kvcr.DURATION_METRIC]
    fills = [v for labels, v in durations if labels == ("local_fill", "success")]
    assert len(fills) == 2 and all(0 <= v < 10 for v in fills)
    gauges = {labels[0]: v for name, v, labels in stats.of("gauge")}
    assert gauges["local_g2_allocated_slots"] == 2
    assert gauges["local_g2_total_slots"] == 4
    # The interval was consumed: the next one has no transfers.
    assert r.kv.get_stats().of("counter") == []
    assert 'kvcr_state{resource="local_g2_free_slots"}' in r.kv.prometheus_text()


def test_a_raising_stats_object_is_contained(rig_factory, caplog):
    class Flaky:
        def set_gauge(self, *a):
            raise RuntimeError("gauge down")

        def increase_counter(self, *a):
            self.counted = True

    made = []

    def factory():
        made.append(Flaky())
        return made[-1]

    fw = bytearray(4096 * 2)
    pool = mmap.mmap(-1, 4096 * 2)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="s", pool_layouts=[("", 4096)], enable_telemetry=True),
        kvcr.KVCRBindings(None, None, None, stats_factory=factory),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=4096, count=2)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), 4096 * 2)])))
    try:
        poll_until(kv, kv.deposit({b"a": [kvcr.MemoryRef(end_point_name="s", element_index=0)]}))
        stats = kv.get_stats()
        assert stats is made[0] and stats.counted  # the counters still arrived
        assert "stats set_gauge raised" in caplog.text
    finally:
        kv.close()
        pool.close()


def test_no_stats_without_telemetry_or_factory(rig_factory):
    assert rig_factory().kv.get_stats() is None
    r = rig_factory()
    assert r.kv.prometheus_text() is None


def test_native_log_lines_reach_the_kvcr_logger(rig_factory, caplog):
    caplog.set_level(logging.INFO, logger="kvcr")
    r = rig_factory()
    assert any(rec.name == "kvcr" and "started: 1 pool(s)" in rec.getMessage()
               for rec in caplog.records)
    r.kv.close()
    assert any(rec.name == "kvcr" and rec.getMessage() == "closed" for rec in caplog.records)


def test_fileno_becomes_readable_when_results_wait(rig_factory):
    r = rig_factory()
    r.kv.poll_completed()
    r.put(0, 1)
    op = r.kv.deposit({b"a": r.ref(0)})
    readable, _, _ = select.select([r.kv.fileno()], [], [], 10)
    assert readable
    assert r.wait(op)[b"a"].success
