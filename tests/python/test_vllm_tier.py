"""The vLLM secondary tier (the seed's adapter, unchanged) over real KVCR DRAM,
G3 files (under /var/tmp) and the peer-to-peer tier (its control channel is
bound on 127.0.0.1, on a free port; test_remote_tier.py has two tiers
loading from each other)."""
import dataclasses
import enum
import mmap
import os
import socket
import time
from types import SimpleNamespace

import pytest
import vllm_standins as v
from conftest import finished_jobs as finished

import kvcr
from kvcr.testing import stored_hint
from kvcr.integrations import vllm as tier_module
from kvcr.integrations.vllm import KVCRSecondaryTierManager

ROW = 4096  # one primary row = one KV block


def spec(rank=None, events=True, self_describing=True):
    return SimpleNamespace(
        config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_rank_local=rank)),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=events,
                                         self_describing_kv_events=self_describing))


def primary(rows=6):
    return memoryview(bytearray(rows * ROW)).cast("B", (rows, ROW))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make(view=None, s=None, **kw):
    args = dict(router_capabilities=["router_hint"], control_host="127.0.0.1",
                control_ports=[free_port()], control_advertise_host="127.0.0.1",
                secondary_g2_slots=2)
    args.update(kw)
    return KVCRSecondaryTierManager(s or spec(), view if view is not None else primary(),
                                    "kvcr", **args)


def key(i, group=0):
    return v.make_offload_key(bytes([i]) * 8, group)


def job(job_id, keys, rows, promotion=False, req="req"):
    return v.TransferJob(job_id, keys, rows, promotion, v.ReqContext(req_id=req))


def row(view, i):
    return bytes(view.obj[i * ROW:(i + 1) * ROW])


def set_row(view, i, data):
    view.obj[i * ROW:(i + 1) * ROW] = data


def test_store_lookup_load_round_trip_with_inventory_events():
    view = primary()
    a, b = b"A" * ROW, bytes(range(256)) * (ROW // 256)
    set_row(view, 0, a)
    set_row(view, 1, b)
    tier = make(view)
    assert tier._kvcr.config.pool_layouts == [("", ROW)]
    assert tier._kvcr.config.nixl_agent_name.startswith("KVCR-")
    tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    assert finished(tier, 1) == [v.JobResult(1, True)]
    events = tier.take_events()
    # libkvcr batches the commits of one poll into one event: both keys, in
    # request order. (Two copies that finish in different polls give two
    # events; with the peer tier's threads running that happens now and then.)
    assert [k for e in events for k in e.keys] == [key(1), key(2)]
    assert all(e.medium is v.Medium.CPU and not e.removed for e in events)
    assert all(e.ownership == "kvcr" and e.removal_expected for e in events)
    assert tier.take_events() == []
    ctx = v.ReqContext(req_id="r")
    assert tier.lookup(key(1), ctx) is v.LookupResult.HIT
    assert tier.lookup(key(9), ctx) is v.LookupResult.MISS

    set_row(view, 0, bytes(ROW))  # the sources may be reused once stored
    set_row(view, 1, bytes(ROW))
    tier.submit_load(job(2, [key(1), key(2)], [4, 5], promotion=True))
    assert finished(tier, 1) == [v.JobResult(2, True)]
    assert row(view, 4) == a and row(view, 5) == b

    # One key missing: the load fails and names the keys that did arrive.
    tier.submit_load(job(3, [key(1), key(9)], [2, 3], promotion=True))
    assert finished(tier, 1) == [v.JobResult(3, False, {key(1)})]
    assert row(view, 2) == a

    # A third block evicts the oldest (two KVCR slots): its removal is an event.
    set_row(view, 3, b"C" * ROW)
    tier.submit_store(job(4, [key(3)], [3]))
    assert finished(tier, 1) == [v.JobResult(4, True)]
    events = tier.take_events()
    removed = [e for e in events if e.removed]
    # LRU: key(1) was read again by job 3, so key(2) is the least recent.
    assert [e.keys for e in removed] == [[key(2)]]
    assert removed[0].medium is v.Medium.CPU and removed[0].removal_expected
    assert [e.keys for e in events if not e.removed] == [[key(3)]]
    assert tier.lookup(key(2), ctx) is v.LookupResult.MISS
    assert [tier.lookup(key(i), ctx) for i in (1, 3)] == [v.LookupResult.HIT] * 2

    tier.submit_store(job(5, [], []))
    tier.submit_load(job(6, [], []))
    assert finished(tier, 2) == [v.JobResult(5, True), v.JobResult(6, True)]
    tier.drain_jobs()
    tier.shutdown()
    assert tier._local_dram_mmap is None


def test_store_lookup_load_round_trip_through_g3(g3_dir):
    """g3={"paths": [...], "capacity_bytes_per_file": N} as vLLM's config
    gives it: stores beyond the two KVCR DRAM slots spill to G3 (STORAGE
    events), lookups still HIT, loads read them back from disk."""
    view = primary(rows=8)
    data = [bytes([i + 1]) * (ROW // 2) + bytes(range(256)) * (ROW // 512) for i in range(4)]
    for i in range(4):
        set_row(view, i, data[i])
    path = g3_dir / "vllm" / "g3.bin"
    tier = make(view, secondary_g2_slots=2,
                g3={"paths": [str(path)], "capacity_bytes_per_file": 8 * ROW})
    assert tier._kvcr._backends.g3.paths == (path,)  # strings became Paths
    assert path.exists()
    for i in range(4):
        tier.submit_store(job(i + 1, [key(i + 1)], [i]))
        assert finished(tier, 1) == [v.JobResult(i + 1, True)]
    # Bounded wait for the two oldest blocks to reach G3 (their STORAGE events).
    events, deadline = [], time.monotonic() + 10.0
    for _ in range(100_000):
        tier.get_finished_jobs()
        events.extend(tier.take_events())
        stored = [k for e in events if e.medium is v.Medium.STORAGE and not e.removed
                  for k in e.keys]
        if len(stored) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.0002)
    assert stored == [key(1), key(2)]
    cpu_removed = [k for e in events if e.medium is v.Medium.CPU and e.removed for k in e.keys]
    assert cpu_removed == [key(1), key(2)]
    assert all(e.ownership == "kvcr" and e.removal_expected for e in events)
    ctx = v.ReqContext(req_id="r")
    assert [tier.lookup(key(i), ctx) for i in range(1, 6)] == [v.LookupResult.HIT] * 4 + [
        v.LookupResult.MISS]
    assert tier._kvcr.query([key(1), key(3)]) == [
        (kvcr.QueryStatus.FETCHABLE, kvcr.CacheTier.G3),
        (kvcr.QueryStatus.HIT, kvcr.CacheTier.LOCAL_G2)]
    for i in range(4):
        set_row(view, i, bytes(ROW))
    tier.submit_load(job(10, [key(1), key(2), key(3), key(4)], [4, 5, 6, 7], promotion=True))
    assert finished(tier, 1) == [v.JobResult(10, True)]
    assert [row(view, i) for i in range(4, 8)] == data
    tier.drain_jobs()
    tier.shutdown()


def test_drain_waits_for_every_key_of_a_job():
    view = primary()
    tier = make(view, secondary_g2_slots=4)
    tier.submit_store(job(1, [key(1), key(2), key(3)], [0, 1, 2]))
    tier.drain_jobs()
    assert tier._jobs_by_op == {}
    assert tier.get_finished_jobs() == [v.JobResult(1, True)]
    tier.shutdown()


def test_no_events_without_kv_cache_events(caplog):
    tier = make(s=spec(events=False))
    assert "inventory will not be published" in caplog.text
    tier.submit_store(job(1, [key(1)], [0]))
    assert finished(tier, 1) == [v.JobResult(1, True)]
    assert tier.take_events() == []
    tier.shutdown()


class Action(msgspec_like := type("Struct", (), {})):
    """A msgspec-like struct (declares __struct_fields__)."""
    __struct_fields__ = ("action_type", "action_version", "payload")

    def __init__(self, action_type, action_version, payload):
        self.action_type, self.action_version, self.payload = action_type, action_version, payload


class Version(enum.Enum):
    V01 = "0.1"


@dataclasses.dataclass
class Envelope:
    protocol_version: Version
    actions: list


def test_hints_from_the_request_context_are_submitted_and_discarded():
    tier = make()
    env = Envelope(Version.V01, [Action("kv.fetch", "1.0", {
        "source_control_endpoint": "tcp://127.0.0.1:9", "block_hashes": (7, 8)})])
    ctx = v.ReqContext(req_id="r1", kv_hints=env)
    assert tier.on_new_request(ctx) == v.RequestOffloadingContext()
    assert stored_hint(tier._kvcr, "r1") == ("tcp://127.0.0.1:9", (7, 8), False)
    # The hinted keys are loadable from the peer (the adapter's default
    # opportunistic_query=True makes every key of the request so).
    assert tier.lookup(v.make_offload_key((7).to_bytes(8, "big"), 0), ctx) is v.LookupResult.HIT
    assert tier.lookup(v.make_offload_key((9).to_bytes(8, "big"), 3), ctx) is v.LookupResult.HIT
    other = v.ReqContext(req_id="unhinted")
    assert tier.lookup(v.make_offload_key((7).to_bytes(8, "big"), 0), other) is \
        v.LookupResult.MISS
    tier.on_request_finished(ctx)
    assert stored_hint(tier._kvcr, "r1") is None
    assert tier.lookup(v.make_offload_key((7).to_bytes(8, "big"), 0), ctx) is v.LookupResult.MISS
    tier.on_new_request(v.ReqContext(req_id="r2"))  # no hint: nothing submitted
    assert stored_hint(tier._kvcr, "r2") is None
    bad = v.ReqContext(req_id="r3", kv_hints={"actions": []})
    with pytest.raises(ValueError, match="invalid router hint"):
        tier.on_new_request(bad)
    assert tier.has_pending_work()
    tier.shutdown()


def test_msgspec_fallback_converts_recursively():
    to_builtins = tier_module.msgspec.to_builtins
    env = Envelope(Version.V01, [Action("kv.fetch", "1.0", {"h": (1, 2), "s": {3}})])
    assert to_builtins(env) == {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0", "payload": {"h": [1, 2], "s": [3]}}]}


def test_key_adapter_strips_the_group_and_reads_the_hash():
    adapter = tier_module._VllmKeyAdapter()
    assert adapter.encode(key(5)) == key(5) and type(adapter.encode(key(5))) is bytes
    assert adapter.decode(adapter.encode(key(5, group=0))) == adapter.decode(key(5, group=3))
    assert adapter.decode(key(1)) == int.from_bytes(b"\x01" * 8, "big")
    with pytest.raises(TypeError):
        adapter.encode("not bytes")


def test_constructor_errors_come_in_the_seeds_order(g3_dir):
    """Start with every rule broken, then repair them one at a time: each
    step must report the next rule of the seed's constructor, then KVCR's."""
    g3 = {"paths": [str(g3_dir / "order.bin")], "capacity_bytes_per_file": 4 * ROW}
    kw = dict(policy="nope", kvcr_service_socket_path="/tmp/s", router_capabilities=[],
              control_ports=[1, 2], secondary_g2_slots=-1, g3=g3)
    s = spec(rank=None, events=True, self_describing=False)
    steps = [
        (dict(), ValueError, "unknown KVCR policy 'nope'"),
        (dict(policy="lru"), ValueError, "must be configured together"),
        (dict(kvcr_service_socket_path=None), ValueError,
         "requires router capabilities: ['router_hint']"),
        (dict(router_capabilities=["router_hint", "other"]), ValueError,
         "KVCR local G2/G3 inventory requires self_describing_kv_events"),
        ("self-describing", ValueError, "exactly one port when data_parallel_rank_local is unset"),
        (dict(control_ports=[0]), ValueError, "control_ports must be between 1 and 65535"),
        (dict(control_ports=[free_port()]), ValueError,
         "secondary_g2_slots must be non-negative"),
        (dict(secondary_g2_slots=0), ValueError, "G3 requires local DRAM"),
    ]
    for change, exc, message in steps:
        if change == "self-describing":
            s = spec(rank=None, events=True, self_describing=True)
        else:
            kw.update(change)
        with pytest.raises(exc) as info:
            make(s=s, **kw)
        assert message in str(info.value), (change, str(info.value))
    assert not (g3_dir / "order.bin").exists()  # nothing was opened
    kw.update(secondary_g2_slots=2)
    make(s=s, **kw).shutdown()  # everything repaired: it starts, with G3
    assert (g3_dir / "order.bin").exists()
    kw.update(g3=None)
    make(s=s, **kw).shutdown()  # everything repaired: it starts
    kw.update(secondary_g2_slots=0)
    make(s=s, **kw).shutdown()  # and without KVCR DRAM (peer-to-peer only)


@pytest.mark.parametrize("kw,exc,message", [
    (dict(policy="kvcr.types.MemoryRef"), TypeError, "is not a KVCachePolicy subclass"),
    (dict(compatibility_digest="d"), ValueError, "configured together"),
    (dict(kvcr_service_socket_path="/var/tmp/kvcr-never-made/claim.sock",
          compatibility_digest="d"), kvcr.KVCRSocketError,
     "KVCR service at /var/tmp/kvcr-never-made/claim.sock is not reachable"),
    (dict(policy="g3_lru"), ValueError, "g3_lru requires configured G3"),
    (dict(policy="g3_fifo"), ValueError, "g3_fifo requires configured G3"),
    (dict(g3={"paths": [], "capacity_bytes_per_file": 4 * ROW}), ValueError,
     "G3 requires at least one file path"),
    (dict(g3={"paths": ["/var/tmp/kvcr-never-made"], "capacity": 1}), TypeError, "capacity"),
    (dict(g3={"paths": ["/var/tmp/kvcr-never-made"], "capacity_bytes_per_file": ROW + 1}),
     ValueError, "G3 file capacity must contain complete slots"),
])
def test_constructor_errors(kw, exc, message):
    with pytest.raises(exc, match=message):
        make(**kw)
    assert not os.path.exists("/var/tmp/kvcr-never-made")


def test_rank_selects_the_control_port():
    ports = [free_port(), free_port()]
    with pytest.raises(ValueError, match="local data-parallel rank 2"):
        make(s=spec(rank=2), control_ports=ports)
    tier = make(s=spec(rank=1), control_ports=ports)
    # libkvcr bound it (its control lane's port after "#lane=")
    endpoint = tier._kvcr.control_endpoint
    assert endpoint.partition("#lane=")[0] == f"tcp://127.0.0.1:{ports[1]}"
    assert tier._kvcr.bindings.framework_control.endpoint == endpoint
    tier.shutdown()


def test_the_tier_constructs_without_kvcr_dram():
    """secondary_g2_slots=0: peer-to-peer only. The control channel names the
    endpoint libkvcr binds; stores have nowhere to go, loads come from peers."""
    port = free_port()
    tier = make(secondary_g2_slots=0, control_ports=[port], s=spec(events=False))
    assert tier._local_dram_mmap is None
    assert tier._kvcr._backends.local_dram is None
    control = tier._kvcr.bindings.framework_control
    assert isinstance(control, kvcr.ZmqPeerControlChannel)
    assert (control.bind_host, control.bind_port, control.advertise_host) == (
        "127.0.0.1", port, "127.0.0.1")
    assert tier._kvcr.control_endpoint == control.endpoint
    assert control.endpoint.partition("#lane=")[0] == f"tcp://127.0.0.1:{port}"
    # The pin adapter is wired to libkvcr's pin callbacks.
    assert tier._kvcr._pins is not None
    assert tier._kvcr._pins._request_pin == tier._framework_pin_adapter.request_pin
    assert tier.lookup(key(1), v.ReqContext(req_id="r")) is v.LookupResult.MISS
    tier.drain_jobs()
    tier.shutdown()


def test_a_failed_start_closes_the_control_channel_and_the_mapping(monkeypatch, shm_dir):
    made = []

    class Recorded(kvcr.ZmqPeerControlChannel):
        def __init__(self, *a):
            super().__init__(*a)
            made.append(self)

    maps = []
    real_mmap = mmap.mmap

    def recording_mmap(*a, **kw):
        maps.append(real_mmap(*a, **kw))
        return maps[-1]

    monkeypatch.setattr(tier_module, "ZmqPeerControlChannel", Recorded)
    monkeypatch.setattr(tier_module.mmap, "mmap", recording_mmap)
    # libkvcr refuses G3 files on tmpfs once the mapping and the channel exist.
    with pytest.raises(ValueError, match="G3 file storage requires O_DIRECT"):
        make(g3={"paths": [str(shm_dir / "g3.bin")], "capacity_bytes_per_file": 4 * ROW})
    assert made and made[0].closed
    assert maps and maps[0].closed
    assert tier_module._RETAINED_NATIVE_BUFFERS == []


class CustomPolicy(kvcr.LRUPolicy):
    def eviction_score(self, meta, source):
        return -super().eviction_score(meta, source)  # most recent first


@pytest.mark.parametrize("name,cls", [("fifo", kvcr.FIFOPolicy), ("lru", kvcr.LRUPolicy),
                                       (f"{__name__}.CustomPolicy", CustomPolicy)])
def test_selected_policy_reaches_the_bindings(name, cls):
    tier = make(policy=name)
    assert type(tier._kvcr.bindings.policy) is cls
    tier.shutdown()


def test_a_dotted_policy_really_decides_evictions():
    view = primary()
    for i in range(3):
        set_row(view, i, bytes([i + 1]) * ROW)
    tier = make(view, policy=f"{__name__}.CustomPolicy")
    for i in range(3):
        tier.submit_store(job(i, [key(i)], [i]))
        assert finished(tier, 1) == [v.JobResult(i, True)]
    ctx = v.ReqContext(req_id="r")
    # Most-recent-first: key(1) went when key(2) arrived; LRU would drop key(0).
    assert [tier.lookup(key(i), ctx) for i in range(3)] == [
        v.LookupResult.HIT, v.LookupResult.MISS, v.LookupResult.HIT]
    tier.shutdown()


def test_telemetry_is_opt_in_and_namespaced():
    assert KVCRSecondaryTierManager.build_metric_definitions({}) == {}
    defs = KVCRSecondaryTierManager.build_metric_definitions({"enable_telemetry": True})
    assert set(defs) == {"vllm:kvcr_duration_seconds", "vllm:kvcr_transfer_bytes",
                         "vllm:kvcr_transfer_blocks", "vllm:kvcr_state"}
    assert defs["vllm:kvcr_duration_seconds"].labelnames == ("scope", "result")
    assert isinstance(defs["vllm:kvcr_duration_seconds"], v.OffloadingHistogramMetadata)
    tier = make(enable_telemetry=False)
    assert tier.get_stats() is None
    tier.shutdown()
    view = primary()
    tier = make(view, enable_telemetry=True)
    tier.submit_store(job(1, [key(1)], [0]))
    finished(tier, 1)
    stats = tier.get_stats()
    assert isinstance(stats, v.OffloadingConnectorStats)
    assert stats.data["counters"]["vllm:kvcr_transfer_blocks"][("local_fill",)] == 1
    assert stats.data["counters"]["vllm:kvcr_transfer_bytes"][("local_fill",)] == ROW
    assert len(stats.data["histograms"]["vllm:kvcr_duration_seconds"][("local_fill", "success")]) == 1
    assert stats.data["gauges"]["vllm:kvcr_state"][("local_g2_allocated_slots",)] == 1
    assert all(name.startswith("vllm:") for section in stats.metric_sections() for name in section)
    tier.shutdown()


class Parent:
    def __init__(self, job_id=11):
        self.calls = []
        self.job_id = job_id

    def on_new_request(self, ctx):
        self.calls.append(("new", ctx.req_id))

    def lookup(self, k, ctx):
        return v.LookupResult.HIT if k != key(9) else v.LookupResult.MISS

    def create_store_job(self, keys, ctx):
        return v.TransferJob(self.job_id, keys, [3, 4][:len(keys)], False, ctx)

    def on_request_finished(self, ctx):
        self.calls.append(("finished", ctx.req_id))


def test_pin_adapter_serves_hits_and_releases_once():
    tier = make()
    pins = tier._framework_pin_adapter
    rid = pins.request_pin([key(1), key(9)])
    parent = Parent()
    tier.serve_external_requests(parent)
    [(got_id, (handle, mapping))] = pins.poll_pin_results()
    assert got_id == rid and handle == "kvcr-job-11"
    assert mapping[key(9)] is None
    assert mapping[key(1)] == [kvcr.MemoryRef(end_point_name=tier._kvcr.config.nixl_agent_name,
                                              element_index=3)]
    assert [c[0] for c in parent.calls] == ["new", "finished"]
    assert pins.has_active_pins()
    assert pins.release_pin(handle) is True
    assert pins.release_pin(handle) is True  # idempotent: no second job result
    assert tier.get_finished_jobs() == [v.JobResult(11, True)]
    assert not pins.has_active_pins()
    # A request the parent cannot serve: None, and the lifecycle still closes.
    rid2 = pins.request_pin([key(9)])
    tier.serve_external_requests(parent)
    assert pins.poll_pin_results() == [(rid2, None)]
    pins.cancel_pin_request(pins.request_pin([key(1)]))
    tier.serve_external_requests(parent)
    assert pins.poll_pin_results() == []
    tier.drain_jobs()
    tier.shutdown()


def test_tier_is_loadable_by_qualified_name_and_defines_the_seed_helpers():
    cls = v.resolve_obj_by_qualname("kvcr.integrations.vllm.KVCRSecondaryTierManager")
    assert cls is KVCRSecondaryTierManager
    assert tier_module._REQUIRED_ROUTER_CAPABILITIES == kvcr.ROUTER_HINT_CAPABILITIES
    assert tier_module._vllm_metric_name("kvcr_state") == "vllm:kvcr_state"
    assert tier_module._resolve_policy(None) is None
    assert isinstance(tier_module._resolve_policy("g3_lru"), kvcr.G3LRUPolicy)
    assert tier_module.JobResult is v.JobResult
