"""The peer-to-peer tier (REMOTE_G2) from Python, between real processes on
127.0.0.1: hinted keys are FETCHABLE, deliver / fetch with the request id
pull the exact bytes from a peer's KVCR DRAM or — through the pin bindings —
from a peer's framework memory, pins are released exactly once, callbacks
that raise are contained, resilience events arrive as TransferError, and two
vLLM tiers without KVCR DRAM load from each other.

Peers run in child processes started with subprocess (fork + exec): this
process runs UCX and must never fork bare. Every wait is bounded and every
child is reaped."""
import ctypes
import logging
import mmap
import socket
import time
from types import SimpleNamespace

import pytest
import vllm_standins as v

import kvcr
from conftest import address_of, poll_until, read
from kvcr import CacheTier, OpEntryStatus, QueryStatus
from kvcr.api import _key_hash_callback, _PinBridge
from kvcr.config import control_endpoint
from peer_process import (BLOCK, BytesKeyAdapter, IntKeyAdapter, PeerProcess, key, pattern,
                          vllm_key)

REMOTE_WAIT = 30.0


def envelope(source, hashes):
    return {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": source, "block_hashes": list(hashes)}}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    """A KVCR with the remote tier on 127.0.0.1 (port chosen by libkvcr)."""

    def __init__(self, slots=8, fw_blocks=16, adapter=None, on_event=None, op_ms=5000,
                 abandon_ms=None, agent="target", **remote):
        self.agent = agent
        self.fw = bytearray(fw_blocks * BLOCK)
        self.pool = mmap.mmap(-1, slots * BLOCK) if slots else None
        self.control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0, "127.0.0.1")
        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", BLOCK)],
                            operation_timeout_ms=op_ms,
                            abandon_timeout_ms=abandon_ms or 2 * op_ms),
            kvcr.KVCRBindings(None, None, None, framework_control=self.control,
                              key_adapter=adapter if adapter is not None else IntKeyAdapter(),
                              on_resilience_event=on_event),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw), size=BLOCK,
                                                         count=fw_blocks)],
                local_dram=(kvcr.LocalDramOptions(pools=[("", address_of(self.pool),
                                                          slots * BLOCK)])
                            if slots else None),
                remote_fw_dram=kvcr.RemoteFWDramOptions(**remote)))

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.agent, element_index=i)]

    def block(self, i):
        return read(self.fw, i * BLOCK, BLOCK)

    def wait(self, op, timeout=REMOTE_WAIT):
        return poll_until(self.kv, op, timeout=timeout)

    def close(self):
        self.kv.close()
        if self.pool is not None:
            self.pool.close()


@pytest.fixture
def peers():
    made = []

    def spawn(**options):
        p = PeerProcess(**options)
        made.append(p)
        return p

    yield spawn
    for p in made:
        p.kill()


@pytest.fixture
def targets():
    made = []

    def make(**kw):
        t = Target(**kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def stopped(peer):
    """Stops the peer cleanly (exit 0) and returns its final counters."""
    return peer.stop()


# ---- two processes ---------------------------------------------------------------

def test_hinted_keys_are_pulled_from_a_peers_kvcr_dram_with_exact_bytes(peers, targets):
    src = peers(mode="dram", n=8)
    assert src.endpoint.startswith("tcp://127.0.0.1:")
    t = targets(slots=8)
    assert t.kv.control_endpoint.startswith("tcp://127.0.0.1:")
    assert t.control.bind_port == int(t.kv.control_endpoint.partition("#")[0].rpartition(":")[2]) != 0
    t.kv.submit_hint(envelope(src.endpoint, list(range(8)) + [100]), request_id="req-1")

    fetchable = (QueryStatus.FETCHABLE, CacheTier.REMOTE_G2)
    assert t.kv.query([key(3), key(100), key(200)], "req-1") == [
        fetchable, fetchable, (QueryStatus.MISS, None)]        # 200 is not hinted
    assert t.kv.query([key(3)]) == [(QueryStatus.MISS, None)]  # no request id
    assert t.kv.query([key(3)], "other") == [(QueryStatus.MISS, None)]

    # deliver(request_id=...) pulls straight into framework blocks 8..13
    op = t.kv.deliver({key(i): t.ref(8 + i) for i in range(6)}, request_id="req-1")
    entries = t.wait(op)
    assert list(entries) == [key(i) for i in range(6)]
    assert all(e.success for e in entries.values()), entries
    for i in range(6):
        assert t.block(8 + i) == pattern(i)

    # fetch(request_id=...) pulls into KVCR DRAM slots and claims them
    got = t.wait(t.kv.fetch([key(6), key(7)], request_id="req-1"))
    assert all(e.success for e in got.values()), got
    for i in (6, 7):
        [(addr, size)] = got[key(i)].addresses
        assert size == BLOCK and ctypes.string_at(addr, size) == pattern(i)
    assert t.kv.release([e.release_handle for e in got.values()]) == [
        (e.release_handle, True) for e in got.values()]
    assert t.kv.query([key(6)]) == [(QueryStatus.HIT, CacheTier.LOCAL_G2)]

    # a hinted key the source does not have fails, and is then remembered
    miss = t.wait(t.kv.deliver({key(100): t.ref(15)}, request_id="req-1"))[key(100)]
    assert miss.status is OpEntryStatus.FAILED and miss.reason == "NOT_FOUND"
    assert t.block(15) == bytes(BLOCK)
    assert t.kv.query([key(100), key(5)], "req-1") == [(QueryStatus.MISS, None), fetchable]
    t.kv.discard_hint("req-1")
    assert t.kv.query([key(5)], "req-1") == [(QueryStatus.MISS, None)]
    final = stopped(src)
    assert final["resilience"] == []


def test_a_source_without_kvcr_dram_serves_framework_memory_through_pins(peers, targets):
    src = peers(mode="pins", n=8)
    # No KVCR DRAM here either; the key adapter returns the hash as bytes.
    t = targets(slots=0, adapter=BytesKeyAdapter())
    for request in ("a", "b"):
        t.kv.submit_hint(envelope(src.endpoint, range(8)), request_id=request)
    assert t.kv.query([key(1)], "a") == [(QueryStatus.FETCHABLE, CacheTier.REMOTE_G2)]
    # two overlapping requests in flight at once: keys 0..5 and 3..7
    op_a = t.kv.deliver({key(i): t.ref(i) for i in range(6)}, request_id="a")
    op_b = t.kv.deliver({key(i): t.ref(10 + i - 3) for i in range(3, 8)}, request_id="b")
    done = {}
    deadline = time.monotonic() + REMOTE_WAIT
    for _ in range(1_000_000):
        done.update(t.kv.poll_completed())
        if (op_a in done and op_b in done) or time.monotonic() > deadline:
            break
        time.sleep(0.0005)
    assert op_a in done and op_b in done, f"peer stderr:\n{src.stderr()}"
    assert all(e.success for e in done[op_a].values()), done[op_a]
    assert all(e.success for e in done[op_b].values()), done[op_b]
    for i in range(6):
        assert t.block(i) == pattern(i)
    for i in range(3, 8):
        assert t.block(10 + i - 3) == pattern(i)

    c = src.wait_counters(lambda c: c["granted"] and
                          sorted(c["released"]) == sorted(c["granted"]))
    assert c["pin_requests"] >= 1
    assert c["granted"], c
    assert sorted(c["released"]) == sorted(c["granted"]), c
    assert set(c["released"].values()) == {1}, c  # each pin released exactly once
    requested = [h for keys in c["requested"] for h in keys]
    assert set(requested) == set(range(8))
    final = stopped(src)
    assert final["released"] == c["released"]  # nothing released again at close
    assert final["cancels"] == []
    assert not [w for w in final["warnings"] if "release" in w or "pin" in w], final["warnings"]


def test_raising_pin_callbacks_are_contained(peers, targets):
    # The first request_pin raises; every pin's first release_pin raises too.
    src = peers(mode="pins", n=4, raise_request=1, raise_release=1)
    t = targets(slots=4)
    t.kv.submit_hint(envelope(src.endpoint, range(4)), request_id="first")
    failed = t.wait(t.kv.deliver({key(0): t.ref(0)}, request_id="first"))[key(0)]
    assert failed.status is OpEntryStatus.FAILED
    assert t.block(0) == bytes(BLOCK)

    t.kv.submit_hint(envelope(src.endpoint, range(4)), request_id="second")
    ok = t.wait(t.kv.deliver({key(i): t.ref(i) for i in range(4)}, request_id="second"))
    assert all(e.success for e in ok.values()), ok
    assert all(t.block(i) == pattern(i) for i in range(4))

    c = src.wait_counters(lambda c: c["granted"] and
                          sorted(c["released"]) == sorted(c["granted"]))
    assert c["pin_requests"] >= 2
    assert sorted(c["released"]) == sorted(c["granted"]), c
    assert set(c["released"].values()) == {1}, c
    # each refused (raising) release was retried: two calls, one accepted
    assert set(c["release_calls"].values()) == {2}, c
    warnings = "\n".join(c["warnings"])
    assert "request_pin raised" in warnings and "release_pin(" in warnings
    final = stopped(src)  # the source is alive and closes cleanly
    assert final["released"] == c["released"]


def test_closing_a_source_cancels_its_pending_pin_requests(peers, targets):
    src = peers(mode="pins", n=4, hold=True)  # takes the pin request, never answers
    t = targets(slots=4, op_ms=500)
    t.kv.submit_hint(envelope(src.endpoint, range(4)), request_id="req")
    op = t.kv.deliver({key(i): t.ref(i) for i in range(2)}, request_id="req")
    c = src.wait_counters(lambda c: c["pin_requests"] >= 1)
    assert c["pin_requests"] >= 1 and c["cancels"] == [], c
    final = stopped(src)  # a clean close: the framework hears the request is off
    assert final["granted"] == [] and final["released"] == {}
    assert len(final["cancels"]) == final["pin_requests"], final
    entries = t.wait(op)
    assert all(not e.success for e in entries.values()), entries
    assert t.fw[:2 * BLOCK] == bytes(2 * BLOCK)


@pytest.fixture
def ucx_writes(monkeypatch):
    """Pulls this small would ask for their bytes inline (in the source's
    write_done, which only the target copies: quiet at once at the deadline,
    nothing uncertain); 0 makes the target's instances ask for UCX writes,
    which a killed source may leave in flight. Read when an instance
    starts."""
    monkeypatch.setenv("KVCR_INLINE_WRITE_MAX", "0")


def test_a_source_killed_before_an_inline_write_leaves_nothing_uncertain(peers, targets):
    events = []
    src = peers(mode="pins", n=8, hold=True)  # takes the pin request, never answers
    t = targets(slots=4, on_event=events.append, op_ms=300, abandon_ms=900)
    t.kv.submit_hint(envelope(src.endpoint, range(8)), request_id="req")
    op = t.kv.deliver({key(i): t.ref(i) for i in range(4)}, request_id="req")
    src.wait_counters(lambda c: c["pin_requests"] >= 1)
    src.kill()
    entries = t.wait(op)
    assert all(e.status is OpEntryStatus.FAILED and e.reason == "TIMEOUT"
               for e in entries.values()), entries
    assert t.fw[:4 * BLOCK] == bytes(4 * BLOCK)  # nothing was written
    assert [e for e in events if e.state == "uncertain"] == [], events


def test_a_source_killed_mid_transfer_reports_uncertain_destinations(peers, targets, ucx_writes):
    events = []
    src = peers(mode="pins", n=8, hold=True)  # takes the pin request, never answers
    t = targets(slots=4, on_event=events.append, op_ms=300, abandon_ms=900)
    t.kv.submit_hint(envelope(src.endpoint, range(8)), request_id="req")
    op = t.kv.deliver({key(i): t.ref(i) for i in range(4)}, request_id="req")
    c = src.wait_counters(lambda c: c["pin_requests"] >= 1)
    assert c["pin_requests"] >= 1
    src.kill()
    entries = t.wait(op)
    assert all(e.status is OpEntryStatus.FAILED and e.reason == "TIMEOUT"
               for e in entries.values()), entries
    assert t.fw[:4 * BLOCK] == bytes(4 * BLOCK)  # nothing was written
    uncertain = [e for e in events if e.state == "uncertain"]
    assert len(uncertain) == 1, events
    [err] = uncertain
    assert isinstance(err, kvcr.TransferError) and err.op_handle == op
    assert not err.source_side and err.source_blocks is None
    assert sorted(r.element_index for r in err.destination_regions) == [0, 1, 2, 3]
    assert t.kv.query([key(5)], "req") == [(QueryStatus.MISS, None)]  # failed closed


def test_a_raising_resilience_callback_propagates_and_loses_nothing(peers, targets, ucx_writes):
    seen = []

    def on_event(err):
        seen.append(err)
        raise RuntimeError("framework refused the event")

    src = peers(mode="pins", n=8, hold=True)
    t = targets(slots=4, on_event=on_event, op_ms=300, abandon_ms=900)
    t.kv.submit_hint(envelope(src.endpoint, range(8)), request_id="req")
    op = t.kv.deliver({key(i): t.ref(i) for i in range(2)}, request_id="req")
    src.wait_counters(lambda c: c["pin_requests"] >= 1)
    src.kill()
    results, raised = {}, 0
    deadline = time.monotonic() + REMOTE_WAIT
    for _ in range(1_000_000):
        try:
            for handle, entries in t.kv.poll_completed():
                assert handle not in results  # each operation once
                results[handle] = entries
        except RuntimeError as exc:
            assert str(exc) == "framework refused the event"
            raised += 1
        if (op in results and seen) or time.monotonic() > deadline:
            break
        time.sleep(0.0005)
    assert op in results and all(not e.success for e in results[op].values())
    assert raised == len(seen) >= 1  # each event delivered once, its exception raised once
    assert seen[0].state == "uncertain" and seen[0].op_handle == op
    assert t.kv.poll_completed() == []


def test_two_vllm_tiers_without_kvcr_dram_load_from_each_other(peers):
    from kvcr.integrations.vllm import KVCRSecondaryTierManager

    src = peers(mode="vllm", n=6, port=free_port())
    rows = 6
    view = memoryview(bytearray(rows * BLOCK)).cast("B", (rows, BLOCK))
    spec = SimpleNamespace(
        config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_rank_local=None)),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=False,
                                         self_describing_kv_events=False))
    tier = KVCRSecondaryTierManager(
        spec, view, "kvcr", router_capabilities=["router_hint"], control_host="127.0.0.1",
        control_ports=[free_port()], control_advertise_host="127.0.0.1", secondary_g2_slots=0,
        operation_timeout_ms=5000, abandon_timeout_ms=10000)
    try:
        ctx = v.ReqContext(req_id="r1", kv_hints=envelope(src.endpoint, [0, 1, 2, 3]))
        tier.on_new_request(ctx)
        assert tier.lookup(vllm_key(2), ctx) is v.LookupResult.HIT
        assert tier.lookup(vllm_key(2), v.ReqContext(req_id="r2")) is v.LookupResult.MISS
        tier.submit_load(v.TransferJob(7, [vllm_key(i) for i in range(4)], [2, 3, 4, 5], True,
                                       ctx))
        got = []
        deadline = time.monotonic() + REMOTE_WAIT
        for _ in range(1_000_000):
            got.extend(tier.get_finished_jobs())
            if got or time.monotonic() > deadline:
                break
            time.sleep(0.0005)
        assert got == [v.JobResult(7, True)], f"peer stderr:\n{src.stderr()}"
        for i in range(4):
            assert bytes(view.obj[(2 + i) * BLOCK:(3 + i) * BLOCK]) == pattern(i)
        c = src.wait_counters(lambda c: c["store_jobs"] and not c["active_pins"]
                              and len(c["finished"]) == len(c["store_jobs"]))
        # every pin (a store job of the source's parent) came back, successfully
        assert c["store_jobs"] and not c["active_pins"], c
        assert sorted(c["finished"]) == [[j, True] for j in c["store_jobs"]], c
        tier.on_request_finished(ctx)
        assert tier.lookup(vllm_key(2), ctx) is v.LookupResult.MISS
    finally:
        tier.shutdown()
    stopped(src)


# ---- one process: construction and the Python halves ---------------------------------

def test_kvcr_without_local_dram_runs_with_a_framework_control(targets):
    t = targets(slots=0)
    assert t.kv.control_endpoint == t.control.endpoint
    assert t.control.endpoint.startswith("tcp://127.0.0.1:") and t.control.bind_port > 0
    t.kv.submit_hint(envelope("tcp://127.0.0.1:9", [1]), request_id="r")
    assert t.kv.query([key(1), key(2)], "r") == [(QueryStatus.FETCHABLE, CacheTier.REMOTE_G2),
                                                 (QueryStatus.MISS, None)]
    # nothing to store into: deposits fail, the instance keeps working
    entry = t.wait(t.kv.deposit({key(1): t.ref(0)}))[key(1)]
    assert not entry.success


def test_opportunistic_query_makes_any_key_of_a_hinted_request_fetchable(targets):
    t = targets(slots=2, opportunistic_query=True)
    t.kv.submit_hint(envelope("tcp://127.0.0.1:9", [1]), request_id="r")
    assert t.kv.query([key(77)], "r") == [(QueryStatus.FETCHABLE, CacheTier.REMOTE_G2)]
    assert t.kv.query([key(77)], "none") == [(QueryStatus.MISS, None)]


def test_without_a_key_adapter_nothing_is_remote(targets):
    t = targets(slots=2)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="plain", pool_layouts=[("", BLOCK)]),
        kvcr.KVCRBindings(None, None, None,
                          framework_control=kvcr.ZmqPeerControlChannel("127.0.0.1", 0)),
        kvcr.KVCRBackendConfigs(local_dram=kvcr.LocalDramOptions(
            pools=[("", address_of(t.pool), BLOCK)])))
    try:
        kv.submit_hint(envelope("tcp://127.0.0.1:9", [1]), request_id="r")
        assert kv.query([key(1)], "r") == [(QueryStatus.MISS, None)]
        assert kv.control_endpoint.startswith("tcp://127.0.0.1:")
    finally:
        kv.close()


def test_key_adapter_results_become_router_hashes(caplog):
    class Adapter:
        def __init__(self, value):
            self.value = value

        def decode(self, k):
            if isinstance(self.value, Exception):
                raise self.value
            return self.value

    def h(value):
        return _key_hash_callback(Adapter(value))(b"key")

    assert h(7) == 7 and h(2**64 - 1) == 2**64 - 1
    assert h(b"\x00" * 7 + b"\x05") == 5
    assert h(b"\xff" * 24 + (9).to_bytes(8, "big")) == 9  # low 64 bits, big-endian
    assert h(bytearray(b"\x01\x00")) == 256
    for none in (-1, 2**64, True, 1.0, "7", None, b""):
        assert h(none) is None, none
    fn = _key_hash_callback(Adapter(KeyError("no hash")))
    assert fn(b"a") is None and fn(b"b") is None
    assert caplog.text.count("key_adapter.decode raised") == 1  # logged once


class Framework:
    """Pin callbacks that record, and raise or refuse when told to."""

    def __init__(self):
        self.calls = []
        self.results = []
        self.refuse = set()
        self.raise_on = set()

    def request_pin(self, keys):
        self.calls.append(("request", list(keys)))
        if "request" in self.raise_on:
            raise RuntimeError("request boom")
        return 40 + len(self.calls)

    def poll_pin_results(self):
        self.calls.append(("poll",))
        if "poll" in self.raise_on:
            raise RuntimeError("poll boom")
        out, self.results = self.results, []
        return out

    def release_pin(self, handle):
        self.calls.append(("release", handle))
        if "release" in self.raise_on:
            raise RuntimeError("release boom")
        return handle not in self.refuse

    def cancel_pin_request(self, rid):
        self.calls.append(("cancel", rid))
        if "cancel" in self.raise_on:
            raise RuntimeError("cancel boom")


def bridge(fw):
    return _PinBridge(kvcr.KVCRBindings(fw.request_pin, fw.poll_pin_results, fw.release_pin,
                                        fw.cancel_pin_request))


def test_pin_bridge_maps_ids_and_contains_raising_callbacks(caplog):
    caplog.set_level(logging.DEBUG, logger="kvcr")
    fw = Framework()
    b = bridge(fw)
    ref = kvcr.MemoryRef(end_point_name="a", element_index=1)
    assert b.request(7, (b"k1", b"k2")) is True
    assert fw.calls[-1] == ("request", [b"k1", b"k2"])
    rid = 41
    fw.results = [(rid, ("handle-x", {b"k1": [ref], b"k2": None})),
                  (999, ("late", {b"k1": [ref]})),  # a request nobody made
                  (rid, None)]                       # repeated: unknown by now
    out = b.poll()
    assert out[0] == (7, 1, {b"k1": [ref]}, (b"k2",))
    assert out[1][0] == 0 and out[1][1] == 2  # unknown: libkvcr releases pin 2 at once
    assert len(out) == 2
    # releases: only True counts; raising and refusing both leave it pending
    fw.raise_on = {"release"}
    assert b.release(1) is False and b.release(1) is False
    assert caplog.text.count("release_pin('handle-x') raised") == 1  # warned once
    fw.raise_on = set()
    fw.refuse = {"handle-x"}
    assert b.release(1) is False
    fw.refuse = set()
    assert b.release(1) is True
    assert b.release(1) is True  # gone: not asked again
    assert [c for c in fw.calls if c[0] == "release"].count(("release", "handle-x")) == 4
    # a raising request_pin is "no pin"; a repeated id is ignored
    fw.raise_on = {"request"}
    assert b.request(8, (b"k3",)) is False
    fw.raise_on = set()
    assert b.request(9, (b"k3",)) is True
    rid9 = b._by_native[9]
    b._request_pin = lambda keys: rid9  # a framework that repeats a pending id
    assert b.request(10, (b"k4",)) is False
    assert "still pending" in caplog.text
    # cancel reaches the framework with its own id, once; raising is contained
    fw.raise_on = {"cancel"}
    b.cancel(9)
    b.cancel(9)
    assert [c for c in fw.calls if c[0] == "cancel"] == [("cancel", rid9)]
    assert "cancel_pin_request(%d) raised" % rid9 in caplog.text
    # a raising poll yields nothing this time
    fw.raise_on = {"poll"}
    assert b.poll() == []
    assert "poll_pin_results raised" in caplog.text


def test_pin_bridge_refuses_results_of_the_wrong_shape(caplog):
    fw = Framework()
    b = bridge(fw)
    ref = kvcr.MemoryRef(end_point_name="a", element_index=1)
    for i, result in enumerate([("h1", [ref]), ("h2", {b"k": []}), ("h3", {b"k": [("a", 1)]}),
                                ("h4", {"k": [ref]}), "junk"]):
        assert b.request(i + 1, (b"k",))
        fw.results = [(b._by_native[i + 1], result)]
        [out] = b.poll()
        assert out[0] == i + 1
        if result == "junk":
            assert out[1:] == (0, None, ())  # no handle to give back: the pin failed
        else:
            assert out[2] is None and out[1] > 0  # libkvcr refuses it and releases the pin
    assert caplog.text.count("the pin is released") == 4


def test_pin_bridge_close_releases_late_pins_and_cancels_pending_requests(caplog):
    fw = Framework()
    b = bridge(fw)
    ref = kvcr.MemoryRef(end_point_name="a", element_index=1)
    assert b.request(1, (b"k",)) and b.request(2, (b"j",))
    fw.results = [(41, ("late-handle", {b"k": [ref]}))]
    fw.refuse = {"stuck"}
    b._handles[77] = "stuck"
    b.close()
    assert ("release", "late-handle") in fw.calls
    assert ("cancel", 42) in fw.calls
    assert "could not release framework pins: ['stuck']" in caplog.text


def test_control_endpoint_description():
    assert control_endpoint(kvcr.ZmqPeerControlChannel("0.0.0.0", 7001, "10.0.0.1")) == (
        "0.0.0.0", 7001, "10.0.0.1")
    assert control_endpoint(kvcr.ZmqPeerControlChannel("127.0.0.1", 0)) == (
        "127.0.0.1", 0, "127.0.0.1")
    stub = SimpleNamespace(endpoint="tcp://127.0.0.1:7005", send=lambda e, m: False,
                           recv=lambda: [], close=lambda: None)
    assert control_endpoint(stub) == ("127.0.0.1", 7005, "127.0.0.1")
    with pytest.raises(TypeError, match="must describe its endpoint"):
        control_endpoint(object())
    with pytest.raises(ValueError, match="is not 'tcp://host:port'"):
        control_endpoint(SimpleNamespace(endpoint="tcp://nohost"))


def test_a_framework_control_of_another_type_is_bound_at_its_endpoint():
    port = free_port()
    stub = SimpleNamespace(endpoint=f"tcp://127.0.0.1:{port}", send=lambda e, m: False,
                           recv=lambda: [], close=lambda: None)
    pool = mmap.mmap(-1, BLOCK)
    kv = kvcr.KVCR(kvcr.KVCRConfig(nixl_agent_name="stubbed", pool_layouts=[("", BLOCK)]),
                   kvcr.KVCRBindings(None, None, None, framework_control=stub),
                   kvcr.KVCRBackendConfigs(local_dram=kvcr.LocalDramOptions(
                       pools=[("", address_of(pool), BLOCK)])))
    try:
        # bound at its address; "#lane=<port>" names the control lane
        assert kv.control_endpoint.partition("#lane=")[0] == f"tcp://127.0.0.1:{port}"
    finally:
        kv.close()
        pool.close()


@pytest.mark.parametrize("bindings,exc,message", [
    (dict(request_pin=lambda keys: 1), TypeError, "must be callables given together"),
    (dict(request_pin=lambda k: 1, poll_pin_results=lambda: [], release_pin=lambda h: True,
          cancel_pin_request=5), TypeError, "cancel_pin_request must be callable"),
    (dict(key_adapter=object()), TypeError, "key_adapter must have a decode"),
    (dict(on_resilience_event=5), TypeError, "on_resilience_event must be callable"),
])
def test_remote_binding_rules(bindings, exc, message):
    args = dict(request_pin=None, poll_pin_results=None, release_pin=None,
                framework_control=kvcr.ZmqPeerControlChannel("127.0.0.1", 0))
    args.update(bindings)
    with pytest.raises(exc, match=message):
        kvcr.KVCR(kvcr.KVCRConfig(nixl_agent_name="x", pool_layouts=[("", BLOCK)]),
                  kvcr.KVCRBindings(**args), kvcr.KVCRBackendConfigs())


def test_remote_options_libkvcr_refuses():
    control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0)
    for opts, exc, message in [
        (kvcr.RemoteFWDramOptions(backend="TCP"), NotImplementedError,
         "remote backend 'TCP' is not supported"),
        (kvcr.RemoteFWDramOptions(metadata_retry_interval_ms=2**32), ValueError,
         "metadata_retry_interval_ms must be at most"),
    ]:
        with pytest.raises(exc, match=message):
            kvcr.KVCR(kvcr.KVCRConfig(nixl_agent_name="x", pool_layouts=[("", BLOCK)]),
                      kvcr.KVCRBindings(None, None, None, framework_control=control),
                      kvcr.KVCRBackendConfigs(remote_fw_dram=opts))
