"""kvcr bench python: the cost of the Python layer on the hot calls.

  python3 -m kvcr.bench [--json] [--quick]
"""
from __future__ import annotations

import ctypes
import json
import mmap
import sys
import time

import kvcr


def _build(slots: int, block: int = 64):
    fw = bytearray(block * 64)
    pool = mmap.mmap(-1, block * slots)
    addr = lambda b: ctypes.addressof(ctypes.c_char.from_buffer(b))  # noqa: E731
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="bench", pool_layouts=[("", block)]),
        kvcr.KVCRBindings(None, None, None),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=addr(fw), size=block, count=64)],
            local_dram=kvcr.LocalDramOptions(pools=[("", addr(pool), block * slots)])))
    return kv, fw, pool


def _best_ns(fn, calls: int, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    quick = "--quick" in argv
    unknown = [a for a in argv if a not in ("--json", "--quick")]
    if unknown:
        print("usage: python3 -m kvcr.bench [--json] [--quick]", file=sys.stderr)
        return 2
    slots = 4096
    kv, fw, pool = _build(slots)
    keys = [i.to_bytes(32, "little") for i in range(slots)]
    for first in range(0, slots, 1024):
        batch = {k: [kvcr.MemoryRef(end_point_name="bench", element_index=i % 64)]
                 for i, k in enumerate(keys[first:first + 1024])}
        op = kv.deposit(batch)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(h == op for h, _ in kv.poll_completed()):
                break
    sample = keys[:32]
    if any(s is not kvcr.QueryStatus.HIT for s, _ in kv.query(sample)):
        print("kvcr.bench: resident keys did not answer HIT", file=sys.stderr)
        return 1
    calls = 2000 if quick else 20000
    figures = [
        ("query_32_keys", _best_ns(lambda: kv.query(sample), calls), "<= 10 us per call"),
        ("poll_empty", _best_ns(kv.poll_completed, calls), "<= 2 us"),
    ]
    kv.close()
    pool.close()
    for case, ns, goal in figures:
        if as_json:
            print(json.dumps({"bench": "python", "case": case, "value": round(ns, 1), "unit": "ns"},
                             separators=(",", ":")))
        else:
            print(f"{case:<28} {ns:12.1f} ns     (goal {goal})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
