"""One side of `kvcr-bench anchors`: the same calls on whichever `kvcr` the
interpreter running this file imports -- this tree's package (system python)
or the reference implementation 0.1.1 (the anchors venv). Both take the
seed's API, so one script measures both and neither gets a kinder workload.

    python kvcr_side.py query  '{"blocks": 1000000, "calls": 20000}'  # then "run" lines
    python kvcr_side.py bw     '{"block": 2097152, "count": 64, "rounds": 8}'
    python kvcr_side.py source '{"block": 16384, "count": 256, "host": "127.0.0.1"}'
    python kvcr_side.py pull   '{"block": 16384, "count": 256, "rounds": 8, "endpoint": ...}'
    python kvcr_side.py engine '{"block": 16384, "count": 64, "socket": ..., "digest": ...}'
    python kvcr_side.py failover '{"block": 16384, "count": 64, "endpoint": ...}'  # "dead"

Each mode prints JSON lines: {"case": ..., "value": ..., "unit": ...} (the
median of its rounds), or for `source` first {"endpoint": ...}; errors go to
stderr with exit status 1. Every wait is bounded. Blocks carry a pattern of
their index, checked after the first round of every copy.
"""
from __future__ import annotations

import json
import mmap
import os
import random
import select
import socket
import statistics
import sys
import time

import kvcr
import kvcr.config
import kvcr.control_channels
import kvcr.types
from side_common import addr, pattern

# Peers need distinct NIXL agent names: sources and targets set their own.
AGENT = "anchors"
WAIT_S = 60.0


def is_reference() -> bool:
    # This tree's package carries KVCR's own config fields; the reference does not.
    return "copy_threads" not in kvcr.config.KVCRConfig.__dataclass_fields__


def key(i: int) -> bytes:
    """Key i: a tag and the router hash i, as a peer's hint names it."""
    return b"blk:" + i.to_bytes(8, "big")


class IntKeyAdapter:
    def encode(self, framework_key):
        return bytes(framework_key)

    def decode(self, k):
        return int.from_bytes(bytes(k)[4:], "big")


def fill(buf, i: int, block: int) -> None:
    buf[i * block:(i + 1) * block] = pattern(i, block)


def check(buf, i: int, block: int, want: int) -> None:
    if buf[i * block:(i + 1) * block] != pattern(want, block):
        fail(f"element {i} does not hold block {want}")


def fail(msg: str) -> None:
    print(f"kvcr_side ({'reference' if is_reference() else 'kvcr'}): {msg}", file=sys.stderr)
    sys.exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_pins():
    """Pin bindings that never pin: the reference requires callables, and
    these benches serve peers from KVCR DRAM only."""
    return dict(request_pin=lambda keys: 0, poll_pin_results=lambda: (),
                release_pin=lambda handle: True)


def make_kvcr(block: int, fw_blocks: int, slots: int, control=None, guard=None,
              op_ms: int = int(WAIT_S * 1000)):
    fw = mmap.mmap(-1, block * fw_blocks)
    pool = mmap.mmap(-1, block * slots) if slots else None
    config = dict(nixl_agent_name=AGENT, pool_layouts=[("", block)],
                  operation_timeout_ms=op_ms, abandon_timeout_ms=2 * op_ms)
    if is_reference():
        config["nixl_listen_port"] = 0  # the reference refuses to start without one
    backends = dict(framework_regions=[kvcr.types.RegionDescriptor(addr=addr(fw), size=block,
                                                                   count=fw_blocks)])
    if pool is not None:
        backends["local_dram"] = kvcr.config.LocalDramOptions(pools=[("", addr(pool),
                                                                      block * slots)])
    bindings = dict(no_pins())
    if control is not None:
        bindings.update(framework_control=control, key_adapter=IntKeyAdapter())
    kv = kvcr.KVCR(kvcr.config.KVCRConfig(**config), kvcr.KVCRBindings(**bindings),
                   kvcr.config.KVCRBackendConfigs(**backends), guard)
    return kv, fw, pool


def refs(indices):
    return [[kvcr.types.MemoryRef(end_point_name=AGENT, element_index=i)] for i in indices]


def idle(kv) -> None:
    """Between two polls, each side waits the way its API offers: this
    tree's KVCR has a descriptor readable when poll_completed() has results
    (kvcr_fd), slept on as the C benches sleep on it, so the caller does not
    take the vCPU its copy threads need; the reference has none, and
    time.sleep(0) gives the GIL to its progress thread without adding a
    timer's delay."""
    fileno = getattr(kv, "fileno", None)
    if fileno is None:
        time.sleep(0)
    else:
        select.select([fileno()], [], [], 0.1)


def serve(kv, lifetime: float) -> None:
    """A source's main thread until stdin closes or says "stop". The
    reference serves peers partly in the caller's poll_completed() (its
    pins and writes start there), so it is polled every 50 us -- what an
    engine's busy loop would give it without taking a whole vCPU; this
    tree's KVCR serves from its own threads and is polled only when its
    descriptor says results are due."""
    fileno = getattr(kv, "fileno", None)
    watch = [sys.stdin] + ([fileno()] if fileno is not None else [])
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline:
        ready, _, _ = select.select(watch, [], [], 1.0 if fileno is not None else 50e-6)
        if sys.stdin in ready:
            line = sys.stdin.readline()
            if not line or line.strip() == "stop":
                return
        kv.poll_completed()


def wait(kv, op, n: int, what: str) -> None:
    """Polls until op completes; every entry must succeed."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for handle, entries in kv.poll_completed():
            if handle != op:
                continue
            bad = [e for e in entries.values() if not e.success]
            if len(entries) != n or bad:
                fail(f"{what}: {len(entries)} entries for {n} blocks, {len(bad)} failed "
                     f"({bad[0].status if bad else ''})")
            return
        idle(kv)
    fail(f"{what} did not complete within {WAIT_S:.0f} s")


def emit(case: str, value: float, unit: str) -> None:
    print(json.dumps({"case": case, "value": value, "unit": unit}), flush=True)


# ---- modes -----------------------------------------------------------------------

def mode_query(o: dict) -> None:
    """KVCR.query of 32 resident keys drawn at random, at `blocks` resident
    64-byte blocks: filled once (the reference fills about 5 k blocks/s
    here), then one figure, ns per call (median of 5 repetitions of `calls`
    calls), for each "run" line on stdin, so that the driver can alternate
    the two sides without filling again. Prints {"ready": n} when filled."""
    n, fw_blocks = o["blocks"], 64
    batch = o.get("batch", 4096)
    kv, fw, pool = make_kvcr(64, fw_blocks, n)
    try:
        keys = [i.to_bytes(32, "little") for i in range(n)]
        for first in range(0, n, batch):
            part = keys[first:first + batch]
            op = kv.deposit(dict(zip(part, refs(i % fw_blocks for i in range(len(part))))))
            wait(kv, op, len(part), "filling")
        rng = random.Random(1)
        samples = [rng.sample(keys, 32) for _ in range(64)]
        for s in samples:
            if any(st is not kvcr.types.QueryStatus.HIT for st, _ in kv.query(s)):
                fail("a resident key did not answer HIT")
        print(json.dumps({"ready": n}), flush=True)
        for line in sys.stdin:
            if line.strip() != "run":
                break
            calls, times = o["calls"], []
            for _ in range(5):
                t0 = time.perf_counter_ns()
                for c in range(calls):
                    kv.query(samples[c & 63])
                times.append((time.perf_counter_ns() - t0) / calls)
            emit(o["case"], statistics.median(times), "ns")
    finally:
        kv.close()


def mode_bw(o: dict) -> None:
    """Deposit and deliver of `count` blocks of `block` bytes per round
    (region and pool each count x block, past the L3 at the sizes used):
    each deposit round under new keys evicts the last one; each deliver round
    writes the resident blocks to other elements. GB/s, median of rounds."""
    block, count, rounds = o["block"], o["count"], o["rounds"]
    kv, fw, pool = make_kvcr(block, count, count)
    try:
        for i in range(count):
            fill(fw, i, block)
        deposit, deliver = [], []
        resident = []
        for r in range(rounds):
            resident = [key(r * count + i) for i in range(count)]
            t0 = time.perf_counter()
            op = kv.deposit(dict(zip(resident, refs(range(count)))))
            wait(kv, op, count, "deposit")
            deposit.append(count * block / (time.perf_counter() - t0) / 1e9)
        for r in range(rounds):
            shift = r % count + 1
            t0 = time.perf_counter()
            op = kv.deliver(dict(zip(resident, refs((i + shift) % count for i in range(count)))))
            wait(kv, op, count, "deliver")
            deliver.append(count * block / (time.perf_counter() - t0) / 1e9)
            if r == 0:
                for i in range(count):
                    check(fw, (i + shift) % count, block, i)
        emit(o["case"] + "_deposit", statistics.median(deposit), "GB/s")
        emit(o["case"] + "_deliver", statistics.median(deliver), "GB/s")
    finally:
        kv.close()


def control_channel(host: str):
    """A control endpoint on host: ours picks its port when it binds; the
    reference needs one named."""
    port = 0 if not is_reference() else free_port()
    return kvcr.control_channels.ZmqPeerControlChannel(host, port, host)


def deposit_all(kv, fw, block: int, count: int, what: str) -> None:
    """Blocks 0..count-1 deposited into KVCR DRAM from the framework
    buffer, which is zeroed after: what is served comes from KVCR."""
    for i in range(count):
        fill(fw, i, block)
    op = kv.deposit({key(i): ref for i, ref in enumerate(refs(range(count)))})
    wait(kv, op, count, what)
    fw[:] = bytes(len(fw))


def mode_source(o: dict) -> None:
    """A peer holding blocks 0..count-1 in its KVCR DRAM (the framework copy
    zeroed), serving until stdin closes or says "stop"."""
    global AGENT
    AGENT = "anchors-source"
    block, count = o["block"], o["count"]
    host = o.get("host", "127.0.0.1")
    control = control_channel(host)
    kv, fw, pool = make_kvcr(block, count, count, control)
    try:
        deposit_all(kv, fw, block, count, "source deposit")
        endpoint = kv.control_endpoint if not is_reference() else control.endpoint
        print(json.dumps({"endpoint": endpoint}), flush=True)
        serve(kv, o.get("lifetime", 600))
    finally:
        kv.close()


def mode_pull(o: dict) -> None:
    """Pulls blocks 0..count-1 from the source at `endpoint` into framework
    memory (no KVCR DRAM here, so every round crosses the lane): a hint, then
    deliver with its request id, timed until the result is polled. The first
    round (connection set-up) is checked and not counted."""
    global AGENT
    AGENT = "anchors-target"
    block, count, rounds = o["block"], o["count"], o["rounds"]
    host = o.get("host", "127.0.0.1")
    control = control_channel(host)
    kv, fw, pool = make_kvcr(block, count, 0, control)
    envelope = {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": o["endpoint"],
                     "block_hashes": list(range(count))}}]}
    keys = [key(i) for i in range(count)]
    try:
        times = []
        for r in range(rounds + 1):
            request = f"pull-{r}"
            kv.submit_hint(envelope, request_id=request)
            t0 = time.perf_counter()
            op = kv.deliver(dict(zip(keys, refs(range(count)))), request_id=request)
            wait(kv, op, count, "pull")
            dt = time.perf_counter() - t0
            kv.discard_hint(request)
            if r == 0:
                for i in range(count):
                    check(fw, i, block, i)
            else:
                times.append(dt)
            fw[:block] = bytes(block)
        dt = statistics.median(times)
        if count == 1:
            emit(o["case"], dt * 1e9, "ns")
        else:
            emit(o["case"], count * block / dt / 1e9, "GB/s")
    finally:
        kv.close()


def mode_engine(o: dict) -> None:
    """An engine in guard mode: its KVCR DRAM is pool group 0 of the node's
    service at `socket`, its blocks 0..count-1 deposited there (so the
    group's Guard holds them too); serves until the driver SIGKILLs it."""
    global AGENT
    AGENT = "anchors-engine"
    block, count, host = o["block"], o["count"], o.get("host", "127.0.0.1")
    control = control_channel(host)
    guard = kvcr.config.KVCRGuardConfig(kvcr_service_socket_path=o["socket"], guard_index=0,
                                        compatibility_digest=o["digest"])
    kv, fw, _ = make_kvcr(block, count, 0, control, guard)
    deposit_all(kv, fw, block, count, "engine deposit")
    endpoint = kv.control_endpoint if not is_reference() else control.endpoint
    print(json.dumps({"endpoint": endpoint, "pid": os.getpid()}), flush=True)
    serve(kv, o.get("lifetime", 600))
    kv.close()


def mode_failover(o: dict) -> None:
    """A peer of the engine at `endpoint`: one-block pulls until one succeeds,
    9 more timed ({"live": ns, median}); then, once the driver says "dead"
    (it has SIGKILLed and reaped the engine), pulls the same way, 1 ms apart
    after a failure, until one succeeds: {"case", "value": ns since "dead"}.
    Every served block is checked. Operation timeout 2 s, as bench service's
    peer."""
    global AGENT
    AGENT = "anchors-peer"
    block, count, host = o["block"], o["count"], o.get("host", "127.0.0.1")
    control = control_channel(host)
    kv, fw, _ = make_kvcr(block, 1, 0, control, op_ms=2000)
    attempt = [0]

    def pull_one() -> bool:
        attempt[0] += 1
        i = attempt[0] % count
        request = f"fo-{attempt[0]}"
        kv.submit_hint({"protocol_version": "0.1", "actions": [
            {"action_type": "kv.fetch", "action_version": "1.0",
             "payload": {"source_control_endpoint": o["endpoint"], "block_hashes": [i]}}]},
            request_id=request)
        fw[:] = bytes(block)
        op = kv.deliver({key(i): refs([0])[0]}, request_id=request)
        deadline = time.monotonic() + 10
        ok = None
        while ok is None and time.monotonic() < deadline:
            for handle, entries in kv.poll_completed():
                if handle == op:
                    ok = all(e.success for e in entries.values()) and len(entries) == 1
            if ok is None:
                idle(kv)
        kv.discard_hint(request)
        if ok:
            check(fw, 0, block, i)
        return bool(ok)

    def until_served(limit_s: float) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit_s:
            if pull_one():
                return time.perf_counter() - t0
            time.sleep(0.001)
        fail(f"no block served within {limit_s:.0f} s")
        return 0.0

    try:
        until_served(30)
        live = [until_served(10) for _ in range(9)]
        print(json.dumps({"live": statistics.median(live) * 1e9}), flush=True)
        if sys.stdin.readline().strip() != "dead":
            return
        emit(o["case"], until_served(30) * 1e9, "ns")
    finally:
        kv.close()


MODES = {"query": mode_query, "bw": mode_bw, "source": mode_source, "pull": mode_pull,
         "engine": mode_engine, "failover": mode_failover}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODES:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    # The reference logs every failed poll of pins it never asked for at
    # WARNING; its logger stays quiet unless the driver asks for it.
    if not os.environ.get("KVCR_ANCHORS_LOG"):
        import logging
        logging.disable(logging.WARNING)
    MODES[sys.argv[1]](json.loads(sys.argv[2]))
    # NIXL 1.5.1's agent dies of SIGSEGV in interpreter teardown here, even
    # one that was created and never used; everything is closed by now, so
    # teardown is skipped and a crash there cannot pass for the bench's.
    sys.stdout.flush()
    os._exit(0)
