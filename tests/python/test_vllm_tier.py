"""The vLLM secondary tier (the seed's adapter) over real KVCR DRAM."""
import dataclasses
import time
from types import SimpleNamespace

import pytest
import vllm_standins as v

import kvcr
from kvcr.integrations import vllm as tier_module
from kvcr.integrations.vllm import KVCRSecondaryTierManager

ROW = 16


def spec(rank=None, events=True, self_describing=True):
    return SimpleNamespace(
        config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_rank_local=rank)),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=events,
                                         self_describing_kv_events=self_describing))


def primary(rows=6):
    return memoryview(bytearray(rows * ROW)).cast("B", (rows, ROW))


def make(view=None, s=None, **kw):
    args = dict(router_capabilities=["router_hint"], control_ports=[7001],
                control_advertise_host="127.0.0.1", secondary_g2_slots=2)
    args.update(kw)
    return KVCRSecondaryTierManager(s or spec(), view if view is not None else primary(), "kvcr", **args)


def key(i, group=0):
    return v.make_offload_key(bytes([i]) * 8, group)


def finished(tier, want, timeout=10.0):
    deadline = time.monotonic() + timeout
    got = []
    while time.monotonic() < deadline and len(got) < want:
        got.extend(tier.get_finished_jobs())
        time.sleep(0.0005)
    assert len(got) == want, got
    return got


def job(job_id, keys, rows, promotion=False, req="req"):
    return v.TransferJob(job_id, keys, rows, promotion, v.ReqContext(req_id=req))


def test_store_lookup_load_round_trip_with_inventory_events():
    view = primary()
    raw = view.obj
    raw[0:ROW] = b"A" * ROW
    raw[ROW:2 * ROW] = b"B" * ROW
    tier = make(view)
    tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    assert finished(tier, 1) == [v.JobResult(1, True)]
    events = tier.take_events()
    assert [sorted(e.keys) for e in events] == [sorted([key(1), key(2)])]
    assert events[0].medium is v.Medium.CPU and not events[0].removed
    assert events[0].ownership == "kvcr" and events[0].removal_expected
    assert tier.take_events() == []
    ctx = v.ReqContext(req_id="r")
    assert tier.lookup(key(1), ctx) is v.LookupResult.HIT
    assert tier.lookup(key(9), ctx) is v.LookupResult.MISS

    tier.submit_load(job(2, [key(1), key(2)], [4, 5], promotion=True))
    assert finished(tier, 1) == [v.JobResult(2, True)]
    assert bytes(raw[4 * ROW:5 * ROW]) == b"A" * ROW
    assert bytes(raw[5 * ROW:6 * ROW]) == b"B" * ROW

    # One key missing: the load fails and names the keys that did arrive.
    tier.submit_load(job(3, [key(1), key(9)], [2, 3], promotion=True))
    assert finished(tier, 1) == [v.JobResult(3, False, {key(1)})]
    assert bytes(raw[2 * ROW:3 * ROW]) == b"A" * ROW

    # A third block evicts the oldest: a removal event for it.
    raw[3 * ROW:4 * ROW] = b"C" * ROW
    tier.submit_store(job(4, [key(3)], [3]))
    finished(tier, 1)
    removed = [e for e in tier.take_events() if e.removed]
    assert len(removed) == 1 and len(removed[0].keys) == 1
    tier.submit_store(job(5, [], []))
    assert finished(tier, 1) == [v.JobResult(5, True)]
    tier.drain_jobs()
    tier.shutdown()


@dataclasses.dataclass
class Envelope:
    protocol_version: str
    actions: list


def test_hints_from_the_request_context_are_submitted_and_discarded():
    tier = make()
    env = Envelope("0.1", [{"action_type": "kv.fetch", "action_version": "1.0",
                            "payload": {"source_control_endpoint": "tcp://127.0.0.1:9",
                                        "block_hashes": [7]}}])
    ctx = v.ReqContext(req_id="r1", kv_hints=env)
    tier.on_new_request(ctx)
    assert "r1" in tier._kvcr._hints
    tier.on_request_finished(ctx)
    assert "r1" not in tier._kvcr._hints
    tier.on_new_request(v.ReqContext(req_id="r2"))  # no hint: nothing submitted
    assert tier._kvcr._hints == {}
    assert tier.has_pending_work()
    tier.shutdown()


def test_key_adapter_strips_the_group_and_reads_the_hash():
    adapter = tier_module._VllmKeyAdapter()
    assert adapter.decode(adapter.encode(key(5, group=0))) == adapter.decode(key(5, group=3))
    assert adapter.decode(key(1)) == int.from_bytes(b"\x01" * 8, "big")
    with pytest.raises(TypeError):
        adapter.encode("not bytes")


@pytest.mark.parametrize("kw,exc,message", [
    (dict(policy="nope"), ValueError, "unknown KVCR policy 'nope'"),
    (dict(policy="kvcr.types.MemoryRef"), TypeError, "is not a KVCachePolicy subclass"),
    (dict(kvcr_service_socket_path="/tmp/s"), ValueError, "configured together"),
    (dict(router_capabilities=[]), ValueError, "requires router capabilities"),
    (dict(control_ports=[1, 2]), ValueError, "exactly one port"),
    (dict(control_ports=[0]), ValueError, "between 1 and 65535"),
    (dict(secondary_g2_slots=-1), ValueError, "must be non-negative"),
    (dict(secondary_g2_slots=0), NotImplementedError, "peer-to-peer tier"),
    (dict(g3={"paths": ["/tmp/g3"], "capacity_bytes_per_file": 4096}), NotImplementedError, "G3 tier is not built yet"),
    (dict(kvcr_service_socket_path="/tmp/s", compatibility_digest="d"), NotImplementedError, "not built yet"),
])
def test_constructor_errors(kw, exc, message):
    with pytest.raises(exc, match=message):
        make(**kw)


def test_constructor_order_and_event_rules():
    # Policy is resolved before the service pair is checked (the seed's order).
    with pytest.raises(ValueError, match="unknown KVCR policy"):
        make(policy="nope", kvcr_service_socket_path="/tmp/s")
    with pytest.raises(ValueError, match="requires self_describing_kv_events"):
        make(s=spec(self_describing=False))
    with pytest.raises(ValueError, match="local data-parallel rank 2"):
        make(s=spec(rank=2), control_ports=[7001, 7002])


class CustomPolicy(kvcr.LRUPolicy):
    pass


@pytest.mark.parametrize("name,cls", [("fifo", kvcr.FIFOPolicy), ("lru", kvcr.LRUPolicy),
                                       (f"{__name__}.CustomPolicy", CustomPolicy)])
def test_selected_policy_reaches_the_bindings(name, cls):
    tier = make(policy=name)
    assert type(tier._kvcr._bindings.policy) is cls
    tier.shutdown()


def test_telemetry_is_opt_in_and_namespaced():
    assert KVCRSecondaryTierManager.build_metric_definitions({}) == {}
    defs = KVCRSecondaryTierManager.build_metric_definitions({"enable_telemetry": True})
    assert "vllm:kvcr_duration_seconds" in defs and "vllm:kvcr_state" in defs
    view = primary()
    tier = make(view, enable_telemetry=True)
    tier.submit_store(job(1, [key(1)], [0]))
    finished(tier, 1)
    stats = tier.get_stats()
    assert stats.data["counters"]["vllm:kvcr_transfer_blocks"][("local_fill",)] == 1
    assert "vllm:kvcr_state" in stats.data["gauges"]
    tier.shutdown()


def test_pin_adapter_serves_hits_and_releases_once():
    tier = make()

    class Parent:
        def __init__(self):
            self.calls = []

        def on_new_request(self, ctx):
            self.calls.append(("new", ctx.req_id))

        def lookup(self, k, ctx):
            return v.LookupResult.HIT if k != key(9) else v.LookupResult.MISS

        def create_store_job(self, keys, ctx):
            return v.TransferJob(11, keys, [3, 4][:len(keys)], False, ctx)

        def on_request_finished(self, ctx):
            self.calls.append(("finished", ctx.req_id))

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
    tier.shutdown()


def test_tier_is_loadable_by_qualified_name():
    cls = v.resolve_obj_by_qualname("kvcr.integrations.vllm.KVCRSecondaryTierManager")
    assert cls is KVCRSecondaryTierManager
