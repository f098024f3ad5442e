"""Bytes survive deposit -> query -> fetch -> deliver, with the seed's shapes."""
import ctypes

import pytest

import kvcr
from kvcr import CacheTier, OpEntryStatus, QueryStatus


def test_deposit_query_fetch_deliver_round_trip(rig_factory):
    r = rig_factory(fw_blocks=8, slots=4)
    for i in range(3):
        r.put(i, 10 + i)
    keys = [b"k0", b"k1", b"k2"]
    op = r.kv.deposit({k: r.ref(i) for i, k in enumerate(keys)})
    entries = r.wait(op)
    assert set(entries) == set(keys)
    assert all(e.success and e.status is OpEntryStatus.SUCCESS for e in entries.values())
    assert r.kv.query(keys + [b"nope"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)] * 3 + [
        (QueryStatus.MISS, None)]

    fop = r.kv.fetch([b"k1", b"k1", b"nope"])
    got = r.wait(fop)
    assert list(got) == [b"k1", b"nope"]
    ok, miss = got[b"k1"], got[b"nope"]
    assert ok.success and ok.release_handle is not None
    assert ok.descriptors == [kvcr.MemoryRef(end_point_name="rig", label="", element_index=ok.descriptors[0].element_index)]
    slot = ok.descriptors[0].element_index
    assert r.pool[slot * r.block:(slot + 1) * r.block] == bytes([11]) * r.block
    assert not miss.success and miss.reason == "NOT_FOUND" and miss.release_handle is None
    assert r.kv.release([ok.release_handle, ok.release_handle, 999]) == [
        (ok.release_handle, True), (ok.release_handle, False), (999, False)]

    r.fw[:3 * r.block] = bytes(3 * r.block)  # scribble the sources
    dop = r.kv.deliver({b"k0": r.ref(5), b"k2": r.ref(6)})
    assert all(e.success for e in r.wait(dop).values())
    assert r.block_bytes(5) == bytes([10]) * r.block
    assert r.block_bytes(6) == bytes([12]) * r.block


def test_bad_descriptors_raise_and_change_nothing(rig_factory):
    r = rig_factory()
    with pytest.raises(TypeError, match="block descriptors must be a list"):
        r.kv.deposit({b"a": r.ref(0)[0]})
    with pytest.raises(ValueError, match="each block requires at least one descriptor"):
        r.kv.deposit({b"a": []})
    with pytest.raises(ValueError, match="out of range"):
        r.kv.deposit({b"a": r.ref(99)})
    with pytest.raises(ValueError, match="no framework region is labelled 'x'"):
        r.kv.deliver({b"a": [kvcr.MemoryRef(end_point_name="rig", label="x", element_index=0)]})
    with pytest.raises(ValueError, match="is not this instance"):
        r.kv.deposit({b"a": [kvcr.MemoryRef(end_point_name="other", element_index=0)]})
    with pytest.raises(ValueError, match="expected layout must use configured pools"):
        r.kv.fetch([b"a"], expected_layout=["nope"])
    assert r.kv.query([b"a"]) == [(QueryStatus.MISS, None)]


def test_empty_ops_and_no_evict_claims(rig_factory):
    r = rig_factory(slots=1)
    op = r.kv.deposit({})
    assert r.wait(op) == {}
    r.put(0, 1)
    e = r.wait(r.kv.deposit({b"pinned": r.ref(0)}, no_evict=True))[b"pinned"]
    assert e.success and e.release_handle is not None and e.descriptors is None
    failed = r.wait(r.kv.deposit({b"other": r.ref(1)}))[b"other"]
    assert failed.status is OpEntryStatus.FAILED and failed.reason == "NO_CAPACITY"
    assert r.kv.release([e.release_handle]) == [(e.release_handle, True)]
    assert r.wait(r.kv.deposit({b"other": r.ref(1)}))[b"other"].success
    assert r.kv.query([b"pinned"]) == [(QueryStatus.MISS, None)]


def test_calls_after_close_raise(rig_factory):
    r = rig_factory()
    r.kv.close()
    r.kv.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        r.kv.query([b"a"])
    with pytest.raises(RuntimeError, match="closed"):
        r.kv.poll_completed()


def test_hints_are_validated_and_scoped(rig_factory):
    r = rig_factory()
    hint = {"protocol_version": "0.1", "actions": [{"action_type": "kv.fetch", "action_version": "1.0",
            "payload": {"source_control_endpoint": "tcp://127.0.0.1:1", "block_hashes": [1, 2]}}]}
    r.kv.submit_hint(hint, request_id="r1")
    bad = [
        ({"actions": {}}, "invalid router hint"),
        ({"actions": []}, "invalid router hint"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"no_retain": True}}]}, "no_retain is not currently supported"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"mode": "move"}}]}, "only copy mode is currently supported"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"block_hashes": [1]}}]}, "source-less hints are not currently supported"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"source_control_endpoint": "s", "block_hashes": [True]}}]}, "invalid router hint"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"source_control_endpoint": "s", "block_hashes": [2**64]}}]}, "invalid router hint"),
        ({"actions": [{"action_type": "kv.fetch", "payload": {"source_control_endpoint": "s", "block_hashes": []}}]}, "invalid router hint"),
    ]
    for envelope, message in bad:
        with pytest.raises(ValueError) as info:
            r.kv.submit_hint(envelope, request_id="r2")
        assert str(info.value) == message
    # Peer-to-peer is not built: a hint never makes a key fetchable yet.
    assert r.kv.query([b"x"], request_id="r1") == [(QueryStatus.MISS, None)]
    r.kv.discard_hint("r1")
    r.kv.discard_hint("unknown")
