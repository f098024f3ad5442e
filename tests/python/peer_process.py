"""A KVCR peer in its own process, for the peer-to-peer tests.

Run as `python peer_process.py '<json options>'` (tests use PeerProcess
below, which starts it with subprocess: fork + exec, never a bare fork of a
process that runs UCX). The child builds one KVCR source on 127.0.0.1,
prints {"endpoint": ...} as a JSON line, then polls its KVCR until told
otherwise on stdin: "counters" prints a JSON line of counters, "stop" closes
KVCR, prints the final counters and exits 0. It also stops by itself when
stdin closes or after `lifetime` seconds, so it never outlives a test.

Modes (option "mode"):
  dram  - keys 0..n-1 are deposited into the source's KVCR DRAM, then the
          framework copy is zeroed: peers can only get them from KVCR DRAM.
  pins  - no KVCR DRAM: framework blocks 0..n-1 hold keys 0..n-1 and peers
          are served through request_pin / poll_pin_results / release_pin
          (optionally raising the first time, or never answering: "hold").
          With "parts" (a list of sizes adding up to the block) each block
          is held in parts, one region ":p<k>" per size, pinned as ":*".
  vllm  - vLLM's KVCRSecondaryTierManager (secondary_g2_slots=0) over the
          stand-ins, serving its primary rows through its pin adapter.

Blocks are pattern(i, block) everywhere, so any side can check any bytes.
"""
from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 4096


def key(i: int) -> bytes:
    """Block key i: a tag and the router hash i (8 bytes, big-endian)."""
    return b"blk:" + i.to_bytes(8, "big")


def pattern(i: int, size: int = BLOCK) -> bytes:
    unit = b"block-%06d|" % i
    return (unit * (size // len(unit) + 1))[:size]


class IntKeyAdapter:
    def encode(self, framework_key):
        return bytes(framework_key)

    def decode(self, k):
        return int.from_bytes(bytes(k)[4:], "big")


class BytesKeyAdapter(IntKeyAdapter):
    """decode gives the hash as bytes, like vLLM without int block hashes."""

    def decode(self, k):
        return bytes(k)[4:]


def vllm_key(i: int, group: int = 0) -> bytes:
    """A vLLM offload key: 8 hash bytes (router hash i) + the group index."""
    return i.to_bytes(8, "big") + group.to_bytes(4, "big")


# ---- the parent side ----------------------------------------------------------

class PeerProcess:
    """A running peer. Every wait is bounded; stop() / kill() reap it."""

    def __init__(self, start_timeout: float = 30.0, **options) -> None:
        options.setdefault("lifetime", 180)
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer_process.py"), json.dumps(options)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, cwd=HERE)
        self._buf = b""
        try:
            hello = self._line(start_timeout)
        except BaseException:
            self.kill()
            raise
        self.endpoint = hello["endpoint"]
        self.agent = hello.get("agent")

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def _line(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the peer did not answer within {timeout}s; "
                                     f"stderr:\n{self.stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait(timeout=10)
                    raise AssertionError(f"the peer exited ({self.proc.returncode}); "
                                         f"stderr:\n{self.stderr()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _ask(self, command: str, timeout: float = 15.0) -> dict:
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def counters(self) -> dict:
        return self._ask("counters")

    def wait_counters(self, predicate, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        c = self.counters()
        for _ in range(100_000):
            if predicate(c) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
            c = self.counters()
        return c

    def stop(self, timeout: float = 30.0) -> dict:
        """Closes the peer's KVCR; its final counters. It must exit 0."""
        final = self._ask("stop", timeout)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the peer did not exit; stderr:\n{self.stderr()}")
        self._close_pipes()
        assert rc == 0, f"the peer exited {rc}; stderr:\n{self.stderr()}"
        return final

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignored
                pass
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (OSError, ValueError):
                pass


# ---- the child ------------------------------------------------------------------

class _Counting(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class _Pins:
    """The framework's pin callbacks over its own framework blocks."""

    def __init__(self, agent: str, available: int, raise_request: int, raise_release: int,
                 hold: bool, label: str = "") -> None:
        self.agent = agent
        self.label = label                  # what a pinned block's reference names
        self.available = available
        self.raise_request = raise_request  # this many request_pin calls raise
        self.raise_release = raise_release  # each handle's first N releases raise
        self.hold = hold                    # take requests, never answer
        self.requests = []                  # [[hash, ...]] per request_pin call
        self.queued = []
        self.granted = []
        self.released = {}
        self.release_calls = {}
        self.cancels = []
        self.next_id = 100

    def request_pin(self, keys):
        self.requests.append([int.from_bytes(bytes(k)[4:], "big") for k in keys])
        if len(self.requests) <= self.raise_request:
            raise RuntimeError("request_pin failed on purpose")
        self.next_id += 1
        if not self.hold:
            self.queued.append((self.next_id, list(keys)))
        return self.next_id

    def poll_pin_results(self):
        import kvcr
        out = []
        for rid, keys in self.queued:
            handle = f"pin-{rid}"
            mapping = {}
            for k in keys:
                i = int.from_bytes(bytes(k)[4:], "big")
                mapping[k] = ([kvcr.MemoryRef(end_point_name=self.agent, label=self.label,
                                              element_index=i)]
                              if i < self.available else None)
            self.granted.append(handle)
            out.append((rid, (handle, mapping)))
        self.queued = []
        return out

    def release_pin(self, handle):
        calls = self.release_calls[handle] = self.release_calls.get(handle, 0) + 1
        if calls <= self.raise_release:
            raise RuntimeError("release_pin failed on purpose")
        self.released[handle] = self.released.get(handle, 0) + 1
        return True

    def cancel_pin_request(self, rid):
        self.cancels.append(rid)

    def counters(self) -> dict:
        return {"pin_requests": len(self.requests), "requested": self.requests,
                "granted": self.granted, "released": self.released,
                "release_calls": self.release_calls, "cancels": self.cancels}


class _VllmParent:
    """vLLM's parent manager, as far as the pin adapter uses it."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.jobs = []

    def on_new_request(self, ctx):
        pass

    def lookup(self, k, ctx):
        import vllm_standins as v
        i = int.from_bytes(bytes(k)[:8], "big")
        return v.LookupResult.HIT if i < self.rows else v.LookupResult.MISS

    def create_store_job(self, keys, ctx):
        import vllm_standins as v
        self.jobs.append(len(self.jobs) + 1)
        rows = [int.from_bytes(bytes(k)[:8], "big") for k in keys]
        return v.TransferJob(self.jobs[-1], list(keys), rows, False, ctx)

    def on_request_finished(self, ctx):
        pass


def _child(options: dict) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="peer %(levelname)s %(name)s: %(message)s")
    counting = _Counting()
    logging.getLogger("kvcr").addHandler(counting)
    mode = options["mode"]
    n = options.get("n", 8)
    op_ms = options.get("op_ms", 5000)
    state: dict = {"resilience": []}
    keep = []

    if mode == "vllm":
        sys.path.insert(0, os.path.join(HERE, "stubs"))
        import vllm_standins as v
        v.install()
        from types import SimpleNamespace

        from kvcr.integrations.vllm import KVCRSecondaryTierManager
        view = memoryview(bytearray(n * BLOCK)).cast("B", (n, BLOCK))
        for i in range(n):
            view.obj[i * BLOCK:(i + 1) * BLOCK] = pattern(i)
        spec = SimpleNamespace(
            config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_rank_local=None)),
            kv_events_config=SimpleNamespace(enable_kv_cache_events=False,
                                             self_describing_kv_events=False))
        tier = KVCRSecondaryTierManager(
            spec, view, "kvcr", router_capabilities=["router_hint"],
            control_host="127.0.0.1", control_ports=[options["port"]],
            control_advertise_host="127.0.0.1", secondary_g2_slots=0,
            operation_timeout_ms=op_ms, abandon_timeout_ms=2 * op_ms)
        parent = _VllmParent(options.get("available", n))
        finished = []
        kv = tier._kvcr

        def step():
            finished.extend(tier.get_finished_jobs())
            tier.serve_external_requests(parent)

        def counters():
            return {"store_jobs": parent.jobs, "finished": [(j.job_id, j.success)
                                                            for j in finished],
                    "active_pins": tier._framework_pin_adapter.has_active_pins(),
                    "warnings": counting.messages}

        def close():
            tier.shutdown()
    else:
        import ctypes
        import mmap

        import kvcr
        agent = options.get("agent", "source")
        fw_n = max(n, 1)
        fw = mmap.mmap(-1, fw_n * BLOCK)
        keep.append(fw)
        for i in range(fw_n):
            fw[i * BLOCK:(i + 1) * BLOCK] = pattern(i)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(fw))
        regions = [kvcr.RegionDescriptor(addr=addr, size=BLOCK, count=fw_n)]
        if options.get("parts"):
            regions = []
            at = 0
            for k, size in enumerate(options["parts"]):
                part = mmap.mmap(-1, fw_n * size)
                keep.append(part)
                for i in range(fw_n):
                    part[i * size:(i + 1) * size] = pattern(i)[at:at + size]
                regions.append(kvcr.RegionDescriptor(
                    addr=ctypes.addressof(ctypes.c_char.from_buffer(part)), size=size,
                    count=fw_n, label=f":p{k}"))
                at += size
        pins = None
        local = None
        if mode == "dram":
            pool = mmap.mmap(-1, options.get("slots", n) * BLOCK)
            keep.append(pool)
            local = kvcr.LocalDramOptions(pools=[("", ctypes.addressof(
                ctypes.c_char.from_buffer(pool)), len(pool))])
            bindings = kvcr.KVCRBindings(None, None, None)
        else:
            pins = _Pins(agent, options.get("available", n), options.get("raise_request", 0),
                         options.get("raise_release", 0), options.get("hold", False),
                         ":*" if options.get("parts") else "")
            bindings = kvcr.KVCRBindings(pins.request_pin, pins.poll_pin_results,
                                         pins.release_pin, pins.cancel_pin_request)
        bindings = kvcr.KVCRBindings(
            bindings.request_pin, bindings.poll_pin_results, bindings.release_pin,
            bindings.cancel_pin_request,
            framework_control=kvcr.ZmqPeerControlChannel("127.0.0.1", options.get("port", 0),
                                                         "127.0.0.1"),
            key_adapter=IntKeyAdapter(), on_resilience_event=state["resilience"].append)
        kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", BLOCK)],
                            operation_timeout_ms=op_ms, abandon_timeout_ms=2 * op_ms),
            bindings,
            kvcr.KVCRBackendConfigs(
                framework_regions=regions,
                local_dram=local))
        if mode == "dram":
            refs = {key(i): [kvcr.MemoryRef(end_point_name=agent, element_index=i)]
                    for i in range(n)}
            op = kv.deposit(refs)
            done = None
            deadline = time.monotonic() + 20
            while done is None and time.monotonic() < deadline:
                done = dict(kv.poll_completed()).get(op)
                time.sleep(0.001)
            if done is None or not all(e.success for e in done.values()):
                print(f"peer: deposit failed: {done}", file=sys.stderr)
                return 3
            fw[:] = bytes(len(fw))  # only KVCR DRAM holds the blocks now

        def step():
            kv.poll_completed()

        def counters():
            c = pins.counters() if pins is not None else {}
            c["resilience"] = [(e.state, e.source_side) for e in state["resilience"]]
            c["warnings"] = counting.messages
            return c

        def close():
            kv.close()

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    agent_name = kv.config.nixl_agent_name
    emit({"endpoint": kv.control_endpoint, "agent": agent_name})
    deadline = time.monotonic() + options["lifetime"]
    buf = b""
    stop = False
    while not stop and time.monotonic() < deadline:
        ready, _, _ = select.select([0], [], [], 0.002)
        if ready:
            chunk = os.read(0, 4096)
            if not chunk:
                break  # the test is gone
            buf += chunk
        while b"\n" in buf and not stop:
            line, buf = buf.split(b"\n", 1)
            if line == b"counters":
                step()
                emit(counters())
            elif line == b"stop":
                stop = True
        step()
    close()
    emit(counters())
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))
