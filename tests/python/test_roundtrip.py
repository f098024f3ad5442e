"""Bytes survive deposit -> query -> fetch -> deliver, with the seed's shapes."""
import ctypes
import mmap
import threading
import time

import pytest

import kvcr
from kvcr.testing import stored_hint
from conftest import address_of, poll_until, read, thread_count, write
from kvcr import CacheTier, OpEntryResult, OpEntryStatus, QueryStatus


@pytest.mark.parametrize("fw_kind", ["bytearray", "mmap", "ctypes"])
def test_deposit_query_fetch_deliver_round_trip(rig_factory, fw_kind):
    r = rig_factory(fw_blocks=8, slots=4, fw_kind=fw_kind)
    keys = [b"k0", b"k1", b"k2"]
    data = [r.fill_pattern(i, b"blk%d-" % i) for i in range(3)]
    op = r.kv.deposit({k: r.ref(i) for i, k in enumerate(keys)})
    assert isinstance(op, int)
    entries = r.wait(op)
    assert list(entries) == keys  # request order
    assert all(e.success and e.status is OpEntryStatus.SUCCESS and e.reason is None
               and e.descriptors is None and e.release_handle is None for e in entries.values())
    assert r.kv.query(keys + [b"nope"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)] * 3 + [
        (QueryStatus.MISS, None)]
    assert r.kv.query(tuple(keys[:1]), "some-request") == [(QueryStatus.HIT, CacheTier.LOCAL_G2)]
    assert r.kv.query([]) == []

    # fetch: KVCR-owned slots, readable through the descriptors' addresses.
    fop = r.kv.fetch([b"k1", b"k1", b"nope"])
    got = r.wait(fop)
    assert list(got) == [b"k1", b"nope"]  # deduplicated, first order
    ok, miss = got[b"k1"], got[b"nope"]
    assert ok.success and ok.release_handle is not None
    [ref] = ok.descriptors
    assert ref == kvcr.MemoryRef(end_point_name="rig", label="", element_index=ref.element_index)
    [(addr, size)] = ok.addresses
    assert size == r.block and addr == address_of(r.pool) + ref.element_index * r.block
    assert ctypes.string_at(addr, size) == data[1]
    assert r.pool[ref.element_index * r.block:(ref.element_index + 1) * r.block] == data[1]
    assert miss.status is OpEntryStatus.FAILED and miss.reason == "NOT_FOUND"
    assert miss.release_handle is None and miss.descriptors is None
    assert r.kv.release([ok.release_handle, ok.release_handle, 999, "junk"]) == [
        (ok.release_handle, True), (ok.release_handle, False), (999, False), ("junk", False)]

    # deliver into other framework blocks, after scribbling over the sources.
    write(r.fw, 0, bytes(3 * r.block))
    dop = r.kv.deliver({b"k0": r.ref(5), b"k2": r.ref(6), b"gone": r.ref(7)}, request_id="req")
    result = r.wait(dop)
    assert result[b"k0"].success and result[b"k2"].success
    assert result[b"gone"].status is OpEntryStatus.FAILED and result[b"gone"].reason == "NOT_FOUND"
    assert r.block_bytes(5) == data[0]
    assert r.block_bytes(6) == data[2]
    assert r.block_bytes(7) == bytes(r.block)  # untouched


def test_poll_shapes_are_what_the_seed_reads(rig_factory):
    r = rig_factory()
    r.put(0, 1)
    op = r.kv.deposit({b"a": r.ref(0)})
    polled = []
    deadline = time.monotonic() + 10
    for _ in range(100_000):
        polled.extend(r.kv.poll_completed())
        if polled or time.monotonic() > deadline:
            break
        time.sleep(0.0001)
    assert isinstance(r.kv.poll_completed(), list)
    [item] = polled
    op_handle, entries = item  # each item unpacks as a pair
    assert op_handle == op and isinstance(entries, dict)
    for key, entry in entries.items():
        assert type(key) is bytes and isinstance(entry, OpEntryResult)
        assert entry.success is True
    assert r.kv.poll_completed() == []  # each result is returned once
    d = r.kv.deliver({b"a": r.ref(1)}, request_id="r")
    assert all(e.success for e in r.wait(d).values())
    assert r.block_bytes(1) == bytes([1]) * r.block


def test_handles_increase_and_empty_operations_complete_at_once(rig_factory):
    r = rig_factory()
    ops = [r.kv.deposit({}), r.kv.deliver({}), r.kv.fetch([])]
    assert ops == sorted(ops) and len(set(ops)) == 3
    seen = {}
    deadline = time.monotonic() + 10
    for _ in range(10_000):
        seen.update(r.kv.poll_completed())
        if len(seen) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.0001)
    assert seen == {op: {} for op in ops}


def test_bad_arguments_raise_and_change_nothing(rig_factory):
    r = rig_factory()
    r.put(0, 9)
    with pytest.raises(TypeError, match="block descriptors must be a list"):
        r.kv.deposit({b"a": r.ref(0)[0]})
    with pytest.raises(ValueError, match="each block requires at least one descriptor"):
        r.kv.deposit({b"a": []})
    with pytest.raises(ValueError, match="each block requires at least one descriptor"):
        r.kv.deposit({b"a": [("rig", "", 0)]})
    with pytest.raises(TypeError, match="block keys must be bytes"):
        r.kv.deposit({"a": r.ref(0)})
    with pytest.raises(TypeError, match="block keys must be bytes"):
        r.kv.query(["a"])
    with pytest.raises(TypeError, match="block keys must be bytes"):
        r.kv.fetch([bytearray(b"a")])
    with pytest.raises(TypeError, match="request_id must be a str or None"):
        r.kv.query([b"a"], 5)
    with pytest.raises(ValueError, match="element_index must be a non-negative int"):
        r.kv.deposit({b"a": [kvcr.MemoryRef(end_point_name="rig", element_index=-1)]})
    with pytest.raises(ValueError, match="out of range"):
        r.kv.deposit({b"a": r.ref(99)})
    with pytest.raises(ValueError, match="no framework region is labelled 'x'"):
        r.kv.deliver({b"a": [kvcr.MemoryRef(end_point_name="rig", label="x", element_index=0)]})
    with pytest.raises(ValueError, match="is not this instance"):
        r.kv.deposit({b"a": [kvcr.MemoryRef(end_point_name="other", element_index=0)]})
    with pytest.raises(ValueError, match="key 0 must have 1 to 1024 bytes"):
        r.kv.deposit({b"": r.ref(0)})
    with pytest.raises(ValueError, match="expected layout must use configured pools"):
        r.kv.fetch([b"a"], expected_layout=["nope"])
    with pytest.raises(ValueError, match="expected layout must name 1 to 255 pools"):
        r.kv.fetch([b"a"], expected_layout=[])
    assert r.kv.query([b"a"]) == [(QueryStatus.MISS, None)]
    assert r.kv.poll_completed() == []  # no operation was started


def test_no_evict_claims_keep_blocks_and_capacity_failures_say_why(rig_factory):
    r = rig_factory(slots=1)
    r.put(0, 1)
    e = r.wait(r.kv.deposit({b"pinned": r.ref(0)}, no_evict=True))[b"pinned"]
    assert e.success and e.release_handle is not None and e.descriptors is None
    r.put(1, 2)
    failed = r.wait(r.kv.deposit({b"other": r.ref(1)}))[b"other"]
    assert failed.status is OpEntryStatus.FAILED and failed.reason == "NO_CAPACITY"
    assert r.kv.query([b"pinned", b"other"]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2),
                                                 (QueryStatus.MISS, None)]
    assert r.kv.release([e.release_handle]) == [(e.release_handle, True)]
    assert r.wait(r.kv.deposit({b"other": r.ref(1)}))[b"other"].success
    assert r.kv.query([b"pinned", b"other"]) == [(QueryStatus.MISS, None),
                                                 (QueryStatus.HIT, CacheTier.LOCAL_G2)]
    out = r.wait(r.kv.deliver({b"other": r.ref(2)}))
    assert out[b"other"].success and r.block_bytes(2) == bytes([2]) * r.block


def test_a_block_spanning_two_pools(rig_factory):
    """Two pools (K and V halves of different sizes), one key over both."""
    k_size, v_size = 4096, 8192
    fw_k, fw_v = bytearray(k_size * 4), mmap.mmap(-1, v_size * 4)
    pool_k, pool_v = mmap.mmap(-1, k_size * 2), mmap.mmap(-1, v_size * 2)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="two", pool_layouts=[("k", k_size), ("v", v_size)]),
        kvcr.KVCRBindings(None, None, None),
        kvcr.KVCRBackendConfigs(
            framework_regions=[
                kvcr.RegionDescriptor(addr=address_of(fw_k), size=k_size, count=4, label="k"),
                kvcr.RegionDescriptor(addr=address_of(fw_v), size=v_size, count=4, label="v")],
            local_dram=kvcr.LocalDramOptions(pools=[("k", address_of(pool_k), len(pool_k)),
                                                    ("v", address_of(pool_v), len(pool_v))])))
    try:
        write(fw_k, 0, b"K" * k_size)
        write(fw_v, 0, b"V" * v_size)

        def refs(i):
            return [kvcr.MemoryRef(end_point_name="two", label="k", element_index=i),
                    kvcr.MemoryRef(end_point_name="two", label="v", element_index=i)]

        assert poll_until(kv, kv.deposit({b"x": refs(0)}))[b"x"].success
        got = poll_until(kv, kv.fetch([b"x"], expected_layout=["k", "v"]))[b"x"]
        assert [d.label for d in got.descriptors] == ["k", "v"]
        assert [s for _, s in got.addresses] == [k_size, v_size]
        assert ctypes.string_at(*got.addresses[0]) == b"K" * k_size
        assert ctypes.string_at(*got.addresses[1]) == b"V" * v_size
        kv.release([got.release_handle])
        wrong = poll_until(kv, kv.fetch([b"x"], expected_layout=["k"]))[b"x"]
        assert wrong.status is OpEntryStatus.FAILED and wrong.reason == "LAYOUT_MISMATCH"
        assert poll_until(kv, kv.deliver({b"x": refs(3)}))[b"x"].success
        assert read(fw_k, 3 * k_size, k_size) == b"K" * k_size
        assert read(fw_v, 3 * v_size, v_size) == b"V" * v_size
    finally:
        kv.close()
        for m in (fw_v, pool_k, pool_v):
            m.close()


def test_abort_cancels_copies_that_have_not_started(rig_factory):
    n = 256
    r = rig_factory(block=256 * 1024, fw_blocks=n, slots=n, copy_threads=1)
    for i in range(n):
        r.put(i, i)
    keys = [b"big%d" % i for i in range(n)]
    op = r.kv.deposit({k: r.ref(i) for i, k in enumerate(keys)})
    assert r.kv.abort(op) is True
    entries = r.wait(op)
    assert list(entries) == keys
    aborted = [k for k, e in entries.items() if e.reason == "ABORTED"]
    stored = [k for k, e in entries.items() if e.success]
    assert aborted and len(aborted) + len(stored) == n
    assert all(entries[k].status is OpEntryStatus.FAILED for k in aborted)
    for k in aborted[:3]:
        assert r.kv.query([k]) == [(QueryStatus.MISS, None)]
    assert r.kv.abort(op) is False  # no longer pending
    assert r.kv.abort(12345) is False
    if stored:
        i = keys.index(stored[-1])
        assert r.wait(r.kv.deliver({stored[-1]: r.ref(0)}))[stored[-1]].success
        assert r.block_bytes(0) == bytes([i % 256]) * r.block


def test_calls_after_close_raise(rig_factory):
    r = rig_factory()
    r.kv.close()
    r.kv.close()  # idempotent
    for call in (lambda: r.kv.query([b"a"]), r.kv.poll_completed,
                 lambda: r.kv.deposit({b"a": r.ref(0)}), lambda: r.kv.release([1]),
                 lambda: r.kv.submit_hint(HINT, request_id="x")):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_pending_work_fails_at_close_and_memory_may_then_be_released(rig_factory):
    before = thread_count()
    r = rig_factory(block=256 * 1024, fw_blocks=64, slots=64, copy_threads=1)
    assert thread_count() > before
    r.kv.deposit({b"c%d" % i: r.ref(i) for i in range(64)})
    r.kv.close()  # running copies are waited for, queued ones cancelled
    # Every KVCR thread is gone: nothing can write into the pool any more.
    assert thread_count() == before
    r.pool[:] = bytes(len(r.pool))
    with pytest.raises(kvcr.KVCRClosedError):
        r.kv.poll_completed()


HINT = {"protocol_version": "0.1", "message_id": "m", "actions": [
    {"action_id": "a0", "action_type": "other", "action_version": "9", "payload": {}},
    {"action_id": "a1", "action_type": "kv.fetch", "action_version": "1.0",
     "payload": {"source_control_endpoint": "tcp://127.0.0.1:1", "block_hashes": [2, 1, 2],
                 "mode": "copy"}}]}


def envelope(**payload):
    return {"protocol_version": "0.1",
            "actions": [{"action_type": "kv.fetch", "action_version": "1.0", "payload": payload}]}


def test_hints_are_validated_and_kept_per_request(rig_factory):
    r = rig_factory()
    r.kv.submit_hint(HINT, request_id="r1")
    assert stored_hint(r.kv, "r1") == ("tcp://127.0.0.1:1", (1, 2), False)
    # Same source: the hash set is replaced.
    r.kv.submit_hint(envelope(source_control_endpoint="tcp://127.0.0.1:1", block_hashes=[7]),
                     request_id="r1")
    assert stored_hint(r.kv, "r1") == ("tcp://127.0.0.1:1", (7,), False)
    # A different source fails the request's hint closed.
    r.kv.submit_hint(envelope(source_control_endpoint="tcp://other:2", block_hashes=[8]),
                     request_id="r1")
    assert stored_hint(r.kv, "r1")[2] is True
    # No request id: validated, nothing kept.
    r.kv.submit_hint(HINT)
    assert stored_hint(r.kv, "None") is None
    # Without a framework_control the peer tier is off: a hint never makes a key fetchable.
    r.kv.submit_hint(envelope(source_control_endpoint="s", block_hashes=[1]), request_id="r2")
    assert r.kv.query([b"\x00" * 7 + b"\x01"], request_id="r2") == [(QueryStatus.MISS, None)]
    r.kv.discard_hint("r1")
    assert stored_hint(r.kv, "r1") is None
    r.kv.discard_hint("unknown")


@pytest.mark.parametrize("hint,message", [
    ("not a mapping", "invalid router hint"),
    ({"actions": {}}, "invalid router hint"),
    ({"actions": []}, "invalid router hint"),
    ({"actions": [{"action_type": "other", "payload": {}}]}, "invalid router hint"),
    ({"actions": [{"action_type": "kv.fetch", "payload": []}]}, "invalid router hint"),
    (envelope(no_retain=False, source_control_endpoint="s", block_hashes=[1]),
     "no_retain is not currently supported"),
    (envelope(mode="move", source_control_endpoint="s", block_hashes=[1]),
     "only copy mode is currently supported"),
    (envelope(block_hashes=[1]), "source-less hints are not currently supported"),
    (envelope(source_control_endpoint=None, block_hashes=[1]),
     "source-less hints are not currently supported"),
    (envelope(source_control_endpoint="", block_hashes=[1]), "invalid router hint"),
    (envelope(source_control_endpoint=5, block_hashes=[1]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=(1,)), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[True]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[1.0]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[-1]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[2**64]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[]), "invalid router hint"),
    (envelope(source_control_endpoint="s", block_hashes=[1], extra=object()), "invalid router hint"),
])
def test_invalid_hints_are_refused_with_the_rule(rig_factory, hint, message):
    r = rig_factory()
    with pytest.raises(ValueError) as info:
        r.kv.submit_hint(hint, request_id="r")
    assert str(info.value) == message
    assert stored_hint(r.kv, "r") is None


def test_calls_from_many_threads(rig_factory):
    r = rig_factory(fw_blocks=16, slots=16)
    for i in range(16):
        r.put(i, i)
    errors = []

    def worker(t):
        try:
            for round_ in range(50):
                key = b"t%d-%d" % (t, round_ % 4)
                r.kv.deposit({key: r.ref(t * 4 + round_ % 4)})
                r.kv.query([key])
                r.kv.poll_completed()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    assert errors == []
