"""A Python policy is really consulted; callbacks that raise are contained;
stats are filled through the factory."""
import logging

import kvcr
from kvcr import CacheTier, PlacementAction, QueryStatus


class ByKeyPolicy(kvcr.KVCachePolicy):
    """Evicts the largest key first; records every call."""

    def __init__(self):
        self.calls = []

    def decide_ingest(self, meta, source, required_local, router_hints=None, framework_hints=None):
        self.calls.append(("ingest", bytes(meta.block_key), source))
        if bytes(meta.block_key).startswith(b"drop"):
            return (PlacementAction.DROP, None)
        return (PlacementAction.KEEP, None)

    def eviction_score(self, meta, source):
        return -float(meta.block_key[0])

    def decide_eviction(self, meta, source):
        self.calls.append(("evict", bytes(meta.block_key), source))
        return (PlacementAction.DROP, None)

    def on_remove(self, meta):
        self.calls.append(("removed", bytes(meta.block_key)))


def test_python_policy_decides_the_eviction_order(rig_factory):
    p = ByKeyPolicy()
    r = rig_factory(slots=2, policy=p)
    assert r.wait(r.kv.deposit({b"a": r.ref(0)}))[b"a"].success
    assert r.wait(r.kv.deposit({b"z": r.ref(1)}))[b"z"].success
    assert r.wait(r.kv.deposit({b"m": r.ref(2)}))[b"m"].success
    # "z" scores lowest (-122): it goes first, though it arrived last.
    assert [q for q, _ in r.kv.query([b"a", b"z", b"m"])] == [
        QueryStatus.HIT, QueryStatus.MISS, QueryStatus.HIT]
    assert ("evict", b"z", CacheTier.LOCAL_G2) in p.calls
    assert ("removed", b"z") in p.calls
    dropped = r.wait(r.kv.deposit({b"drop-me": r.ref(3)}))[b"drop-me"]
    assert dropped.status is kvcr.OpEntryStatus.DROPPED
    assert ("ingest", b"drop-me", CacheTier.FW_G2) in p.calls


class RaisingPolicy(kvcr.LRUPolicy):
    def decide_ingest(self, *args, **kw):
        raise RuntimeError("boom")


def test_a_raising_policy_hook_is_logged_and_contained(rig_factory, caplog):
    r = rig_factory(policy=RaisingPolicy())
    assert r.wait(r.kv.deposit({b"a": r.ref(0)}))[b"a"].success  # admitted anyway
    assert "RaisingPolicy.decide_ingest raised" in caplog.text
    assert "decide_ingest failed; admitting the block" in caplog.text


def test_inventory_becomes_events_and_a_raising_sink_is_contained(rig_factory, caplog):
    r = rig_factory(slots=1)
    r.wait(r.kv.deposit({b"a": r.ref(0)}))
    r.wait(r.kv.deposit({b"b": r.ref(1)}))
    assert r.events == [
        kvcr.InventoryEvent((b"a",), CacheTier.LOCAL_G2, False),
        kvcr.InventoryEvent((b"a",), CacheTier.LOCAL_G2, True),
        kvcr.InventoryEvent((b"b",), CacheTier.LOCAL_G2, False),
    ]

    def bad_sink(event):
        raise ValueError("sink down")

    r2 = rig_factory(sink=bad_sink)
    assert r2.wait(r2.kv.deposit({b"c": r2.ref(0)}))[b"c"].success
    assert "inventory sink raised" in caplog.text


def test_capacity_callback_fires_once_per_crossing(rig_factory):
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


def test_stats_are_filled_through_the_factory(rig_factory):
    r = rig_factory(telemetry=True)
    first = r.kv.get_stats()
    assert first is r.stats_made[0]
    assert set(first.data["gauges"]) == {kvcr.STATE_METRIC}  # only state right after start
    r.wait(r.kv.deposit({b"a": r.ref(0), b"b": r.ref(1)}))
    stats = r.kv.get_stats()
    assert stats is r.stats_made[1] and len(r.stats_made) == 3
    assert stats.data["counters"][kvcr.TRANSFER_BLOCKS_METRIC][("local_fill",)] == 2
    assert stats.data["counters"][kvcr.TRANSFER_BYTES_METRIC][("local_fill",)] == 2 * r.block
    assert len(stats.data["histograms"][kvcr.DURATION_METRIC][("local_fill", "success")]) == 2
    assert stats.data["gauges"][kvcr.STATE_METRIC][("local_g2_allocated_slots",)] == 2
    assert "kvcr_state{resource=\"local_g2_free_slots\"}" in r.kv.prometheus_text()


def test_no_stats_without_telemetry(rig_factory):
    assert rig_factory().kv.get_stats() is None
