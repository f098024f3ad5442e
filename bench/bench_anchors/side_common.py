"""What every side of `kvcr-bench anchors` shares. Each side runs in its
own interpreter (the anchors' environment, or the one with this tree's
kvcr), so this module uses the standard library only."""
from __future__ import annotations

import ctypes
import mmap
import json
import select
import statistics
import sys
import time


def addr(buf) -> int:
    """The address of a writable buffer (an mmap)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def pattern(i: int, block: int) -> bytes:
    """Block i's bytes on every side, so any side can check any block."""
    stamp = b"%010d|" % i
    return (stamp * (block // len(stamp) + 1))[:block]


def filled(block: int, count: int) -> mmap.mmap:
    """count blocks, block i holding pattern(i)."""
    buf = mmap.mmap(-1, block * count)
    for i in range(count):
        buf[i * block:(i + 1) * block] = pattern(i, block)
    return buf


def wait_for_stop(lifetime: float) -> None:
    """Returns when the driver closes stdin or writes "stop", or after
    lifetime seconds (a source whose driver died does not linger)."""
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], 0.05)
        if ready:
            line = sys.stdin.readline()
            if not line or line.strip() == "stop":
                return


def timed_rounds(buf, block: int, count: int, rounds: int, pull_once, fail) -> float:
    """Runs pull_once(r) for r = 0..rounds: round 0 (not timed) must leave
    every block's bytes right, the others are timed. Block 0 is cleared
    after each round, so a round that moved nothing cannot pass. Returns
    the median time of the timed rounds."""
    times = []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        pull_once(r)
        dt = time.perf_counter() - t0
        if r == 0:
            for i in range(count):
                if buf[i * block:(i + 1) * block] != pattern(i, block):
                    fail(f"block {i} arrived wrong")
        else:
            times.append(dt)
        buf[:block] = bytes(block)
    return statistics.median(times)


def report_pull(case: str, block: int, count: int, dt: float) -> None:
    """One JSON row: a one-block pull's time in ns, else the rate in GB/s."""
    if count == 1:
        print(json.dumps({"case": case, "value": dt * 1e9, "unit": "ns"}), flush=True)
    else:
        print(json.dumps({"case": case, "value": count * block / dt / 1e9, "unit": "GB/s"}),
              flush=True)


def main(modes: dict, doc: str) -> None:
    """`side.py MODE JSON`: runs modes[MODE] with the decoded options."""
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        print(doc, file=sys.stderr)
        sys.exit(2)
    modes[sys.argv[1]](json.loads(sys.argv[2]))
    sys.stdout.flush()
