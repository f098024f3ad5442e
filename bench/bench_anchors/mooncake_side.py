"""Mooncake's transfer engine over its TCP transport, the same pulls as
kvcr_side.py's `pull`: the target reads count blocks of `block` bytes from
the source's registered host memory (batch_transfer_sync_read, one call a
round), with no metadata server (P2PHANDSHAKE: peers are "host:rpc_port").

    python mooncake_side.py source '{"block": 16384, "count": 256, "host": "198.18.0.1"}'
    python mooncake_side.py pull   '{"block": 16384, "count": 256, "rounds": 8, "host": ...}'

The source prints {"peer": "<host>:<rpc port>", "addr": <base>} and serves
until stdin closes or says "stop"; the target reads that line from its
stdin. The first round (the handshake) is checked and not counted. Prints
{"case", "value", "unit"}: GB/s, or ns for one block.
"""
from __future__ import annotations

import json
import mmap
import os
import sys

from mooncake.engine import TransferEngine
from side_common import addr, filled, main, report_pull, timed_rounds, wait_for_stop


def fail(msg: str) -> None:
    print(f"mooncake_side: {msg}", file=sys.stderr, flush=True)
    os._exit(1)


def engine(host: str) -> TransferEngine:
    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        fail(f"initialize({host!r}, P2PHANDSHAKE, tcp) returned {rc}")
    return te


def mode_source(o: dict) -> None:
    block, count = o["block"], o["count"]
    buf = filled(block, count)
    te = engine(o["host"])
    if te.register_memory(addr(buf), block * count) != 0:
        fail("register_memory failed")
    print(json.dumps({"peer": f"{o['host']}:{te.get_rpc_port()}", "addr": addr(buf)}), flush=True)
    wait_for_stop(o.get("lifetime", 600))
    te.unregister_memory(addr(buf))


def mode_pull(o: dict) -> None:
    block, count, rounds = o["block"], o["count"], o["rounds"]
    peer = json.loads(sys.stdin.readline())
    buf = mmap.mmap(-1, block * count)
    te = engine(o["host"])
    if te.register_memory(addr(buf), block * count) != 0:
        fail("register_memory failed")
    local = [addr(buf) + i * block for i in range(count)]
    far = [peer["addr"] + i * block for i in range(count)]
    sizes = [block] * count

    def pull_once(r: int) -> None:
        rc = te.batch_transfer_sync_read(peer["peer"], local, far, sizes)
        if rc != 0:
            fail(f"batch_transfer_sync_read round {r} returned {rc}")

    dt = timed_rounds(buf, block, count, rounds, pull_once, fail)
    te.unregister_memory(addr(buf))
    report_pull(o["case"], block, count, dt)


MODES = {"source": mode_source, "pull": mode_pull}

if __name__ == "__main__":
    main(MODES, __doc__)
