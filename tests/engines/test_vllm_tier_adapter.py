"""vLLM's own KVCR adapter (vllm/v1/kv_offload/tiering/kvcr/manager.py of
the vLLM release under test, not the project's copy) on this kvcr package,
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


@pytest.fixture
def engines():
    made = []

    def make(tier=None, **kw):
        engine = vt.Engine(tier if tier is not None else vt.kvcr_tier(), **kw)
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
