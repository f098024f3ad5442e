"""vLLM's own KVCR adapter (vllm/v1/kv_offload/tiering/kvcr/manager.py of
the vLLM release under test) and the project's copy of the adapter
(kvcr.integrations.vllm, loaded as an out-of-tree tier) on this package,
driven by vLLM's own TieringOffloadingManager: stores cascade from the
primary tier into KVCR, chunks the primary tier evicted come back from KVCR
DRAM and G3 with their bytes, a second engine pulls a prefix peer to peer by
a router hint while the first serves it from its primary tier through
vLLM's ParentManager, and the adapter's stats and inventory events reach
vLLM. scripts/test-engines.sh runs this file once per vLLM release."""
import gc

import pytest
import vllm_tiering as vt
from vllm.v1.kv_offload.base import LookupResult, Medium
from vllm.v1.kv_offload.tiering.kvcr import manager as adapter_module


def test_the_release_under_test_is_the_one_loaded():
    """The adapter comes from the vLLM release scripts/test-engines.sh named,
    not from this project (which has a copy of its own)."""
    if vt.expected_vllm() is not None:
        assert vt.VLLM_VERSION == vt.expected_vllm()
    assert adapter_module.__file__.endswith("vllm/v1/kv_offload/tiering/kvcr/manager.py")
    assert "site-packages/kvcr" not in adapter_module.__file__


@pytest.mark.skipif(not vt.FACTORY_BREAKS_KVCR, reason="only vLLM 0.31.0's factory")
def test_vllm_0_31_factory_cannot_start_the_kvcr_tier():
    """vLLM's own bug, pinned so that the docs stay true: the release's
    factory hands its KVCR adapter an argument the adapter does not take."""
    with pytest.raises(TypeError, match="backpressure_detector"):
        vt.TieringOffloadingSpec(vt.offloading_config(vt.kvcr_tier(), 4)).get_manager()


@pytest.mark.skipif(vt.SEED_REVISION_RUNS, reason="vLLM 0.33 or later runs the copy")
def test_the_projects_copy_names_the_releases_it_needs():
    with pytest.raises(ImportError, match="the KVCR adapter of vLLM 0.33 and later"):
        import kvcr.integrations.vllm  # noqa: F401


@pytest.fixture(params=vt.ADAPTERS_HERE)
def engines(request):
    """Engines whose KVCR tier runs the adapter under test (vt.ADAPTERS);
    keyword arguments other than primary_chunks and events go into the
    tier's config."""
    made = []

    def make(primary_chunks=4, events=True, **tier):
        engine = vt.Engine(vt.kvcr_tier(request.param, **tier), primary_chunks, events)
        made.append(engine)
        return engine
    yield make
    for engine in reversed(made):
        engine.close()
    gc.collect()


def stored_in_kvcr(engine, keys, medium=Medium.CPU) -> set:
    """Keys KVCR announced as stored (minus removed) on `medium`, from the
    events vLLM takes from its tiers."""
    held = set()
    for event in engine.manager.take_events():
        if event.medium is not medium:
            continue
        for k in event.keys:
            (held.discard if event.removed else held.add)(k)
    return held & set(keys)


def test_stores_cascade_into_kvcr_and_evicted_chunks_come_back_from_it(engines):
    e = engines(primary_chunks=4)
    first = [vt.key(i) for i in range(4)]
    ctx = e.request("fill")
    e.store(ctx, first, [vt.payload(i) for i in range(4)])
    e.until(e.idle, "cascade of the first four chunks into KVCR")
    assert stored_in_kvcr(e, first) == set(first)

    # Four more chunks evict the first four from the four-chunk primary tier.
    more = [vt.key(i) for i in range(4, 8)]
    e.store(ctx, more, [vt.payload(i) for i in range(4, 8)])
    e.until(e.idle, "cascade of the next four")
    e.manager.on_request_finished(ctx)
    assert all(e.manager.primary_tier.lookup(k, ctx) is LookupResult.MISS for k in first)

    reader = e.request("read")
    for i in (0, 2):
        assert e.load(reader, vt.key(i)) == vt.payload(i)
    e.manager.on_request_finished(reader)


def test_chunks_spilled_to_g3_come_back_from_disk(engines, tmp_path):
    """Two KVCR DRAM slots: the rest of what cascades spills to a G3 file
    (STORAGE events), and chunks the primary tier lost are read back."""
    g3 = {"paths": [str(tmp_path / "g3" / "slots.bin")], "capacity_bytes_per_file": 16 * vt.ROW}
    e = engines(primary_chunks=4, secondary_g2_slots=2, g3=g3)
    ctx = e.request("fill")
    for first in range(0, 8, 2):  # two at a time: one cascade fits KVCR DRAM
        keys = [vt.key(i) for i in range(first, first + 2)]
        e.store(ctx, keys, [vt.payload(i) for i in range(first, first + 2)])
        e.until(e.idle, "cascade into KVCR")
    e.manager.on_request_finished(ctx)
    # Spills are written behind the evictions: wait until G3 holds them.
    on_disk = [vt.key(i) for i in range(4)]
    e.until(lambda: [(s.name, t and t.name) for s, t in e.kvcr_tier._kvcr.query(on_disk)]
            == [("FETCHABLE", "G3")] * 4, "the spills of the first four chunks")
    assert stored_in_kvcr(e, on_disk, Medium.STORAGE) == set(on_disk)
    reader = e.request("read")
    for i in range(4):
        assert e.load(reader, vt.key(i)) == vt.payload(i)
    e.manager.on_request_finished(reader)


def test_a_hinted_prefix_is_pulled_from_a_peer_engine_that_serves_it_through_its_parent(engines):
    """Engine B's request carries the router's hint naming engine A. B's
    lookups HIT in its KVCR tier, its promotion pulls the chunks from A,
    and A, which has them only in its primary tier (no KVCR DRAM), pins
    them through vLLM's ParentManager (a store job of A's manager, released
    when the pull is done)."""
    a = engines(primary_chunks=8, events=False, secondary_g2_slots=0)
    b = engines(primary_chunks=8, events=False, secondary_g2_slots=0)
    prefix = [vt.key(100 + i) for i in range(3)]
    ctx = a.request("a-prefill")
    a.store(ctx, prefix, [vt.payload(100 + i) for i in range(3)])
    a.until(a.idle, "A's own cascade")
    hint = {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": a.control_endpoint,
                     "block_hashes": [vt.router_hash(k) for k in prefix]}}]}
    req = b.request("b-hinted", hint)
    plain = b.request("b-plain")
    assert b.manager.lookup(prefix[0], plain) is LookupResult.MISS
    for i, k in enumerate(prefix):
        assert b.load(req, k, others=[a]) == vt.payload(100 + i)
    # A's pins were store jobs of its own manager, each finished and gone.
    a.until(lambda: a.idle() and not a.kvcr_tier._framework_pin_adapter.has_active_pins(),
            "A's pins released", others=[b])
    b.manager.on_request_finished(req)
    b.manager.on_request_finished(plain)
    a.manager.on_request_finished(ctx)


def metric_values(stats, name: str) -> list:
    """Every value recorded under `name` in a vLLM OffloadingConnectorStats,
    whatever the release's layout of it (nested mappings and sequences)."""
    found = []

    def walk(node, under):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, under or k == name)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, under)
        elif under and isinstance(node, (int, float)) and not isinstance(node, bool):
            found.append(node)
    walk(stats.data, False)
    return found


def test_stats_reach_vllm_with_the_kvcr_transfers(engines):
    e = engines(primary_chunks=4)
    ctx = e.request("fill")
    e.store(ctx, [vt.key(i) for i in range(4)], [vt.payload(i) for i in range(4)])
    e.until(e.idle, "cascade")
    stats = e.kvcr_tier.get_stats()
    assert stats is not None
    blocks = metric_values(stats, "vllm:kvcr_transfer_blocks")
    assert sum(blocks) >= 4, stats.data
    assert metric_values(stats, "vllm:kvcr_transfer_bytes"), stats.data
    e.manager.on_request_finished(ctx)
