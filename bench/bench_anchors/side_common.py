"""What every side of `kvcr-bench anchors` shares. Each side runs in its
own interpreter (the anchors' environment, or the one with this tree's
kvcr), so this module uses the standard library only."""
from __future__ import annotations

import ctypes
import mmap
import select
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
