"""kvcr-bench python: the cost of the Python layer on the hot calls.

    python3 -m kvcr.bench [--json] [--quick]

Cases (best of several runs, ns per call):
  query_32_keys         KVCR.query of 32 resident keys   goal <= 10 us
  poll_completed_empty  KVCR.poll_completed, nothing due  goal <= 2 us
  query_1_key           the vLLM tier's lookup shape     (informative)
With --json: one {"bench":"python","case":...,"value":...,"unit":"ns"} per line.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import sys
import time

import kvcr

GOALS = {"query_32_keys": 10_000.0, "poll_completed_empty": 2_000.0}


def _addr(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _build(slots: int, block: int = 64):
    fw = bytearray(block * 64)
    pool = mmap.mmap(-1, block * slots)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="bench", pool_layouts=[("", block)]),
        kvcr.KVCRBindings(None, None, None),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=_addr(fw), size=block, count=64)],
            local_dram=kvcr.LocalDramOptions(pools=[("", _addr(pool), block * slots)])))
    return kv, fw, pool


def _fill(kv, keys: list) -> bool:
    for first in range(0, len(keys), 1024):
        batch = {k: [kvcr.MemoryRef(end_point_name="bench", element_index=i % 64)]
                 for i, k in enumerate(keys[first:first + 1024])}
        op = kv.deposit(batch)
        deadline = time.monotonic() + 30
        done = False
        for _ in range(10_000_000):
            if any(h == op for h, _ in kv.poll_completed()):
                done = True
                break
            if time.monotonic() > deadline:
                break
        if not done:
            return False
    return True


def _best_ns(fn, calls: int, reps: int = 7) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def main(argv: list) -> int:
    as_json = "--json" in argv
    quick = "--quick" in argv
    unknown = [a for a in argv if a not in ("--json", "--quick")]
    if unknown:
        print("usage: python3 -m kvcr.bench [--json] [--quick]", file=sys.stderr)
        return 2
    slots = 4096
    kv, fw, pool = _build(slots)
    try:
        keys = [i.to_bytes(32, "little") for i in range(slots)]
        if not _fill(kv, keys):
            print("kvcr.bench: filling KVCR DRAM did not complete", file=sys.stderr)
            return 1
        sample = keys[:32]
        if any(s is not kvcr.QueryStatus.HIT for s, _ in kv.query(sample)):
            print("kvcr.bench: resident keys did not answer HIT", file=sys.stderr)
            return 1
        one = (keys[100],)
        calls = 2_000 if quick else 20_000
        figures = [
            ("query_32_keys", _best_ns(lambda: kv.query(sample), calls)),
            ("poll_completed_empty", _best_ns(kv.poll_completed, calls)),
            ("query_1_key", _best_ns(lambda: kv.query(one, "req-1"), calls)),
        ]
    finally:
        kv.close()
        pool.close()
    for case, ns in figures:
        if as_json:
            print(json.dumps({"bench": "python", "case": case, "value": round(ns, 1),
                              "unit": "ns"}, separators=(",", ":")))
        else:
            goal = GOALS.get(case)
            note = f"(goal <= {goal / 1000:g} us{', met' if ns <= goal else ', MISSED'})" \
                if goal else ""
            print(f"{case:<24} {ns:10.1f} ns   {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
