"""Starts and drives vllm_engine_child.py processes (one vLLM engine each).

Shared by the end-to-end test and the TTFT bench. Every wait is bounded;
close() ends the child by its pid (quit, then SIGTERM, then SIGKILL) and
reaps it.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from tiny_model import kv_bytes_per_block  # noqa: E402

# The tiny model's KV bytes per 32-token block (the engine's block, vLLM's
# offloaded chunk and a KVCR block alike): 2 layers x (K, V) x 2 heads x 64
# dims x 32 tokens x 4 bytes.
BLOCK_TOKENS = 32
CHUNK_BYTES = kv_bytes_per_block(BLOCK_TOKENS)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for the KVCR control channel)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvcr_tier(port: int, g2_slots: int, g3: dict | None = None, **extra) -> dict:
    """The `kvcr` secondary tier's options, as in kv_connector_extra_config."""
    tier = {
        "router_capabilities": ["router_hint"],
        "control_host": "127.0.0.1",
        "control_ports": [port],
        "control_advertise_host": "127.0.0.1",
        "secondary_g2_slots": g2_slots,
        "enable_telemetry": True,
    }
    if g3 is not None:
        tier["g3"] = g3
        tier["policy"] = "g3_lru"
    tier.update(extra)
    return tier


def child_env() -> dict:
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # The engine core in the child's own process: the test reads the
        # KVCR tier's state through it, and there is one process to reap.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # vLLM's CPU build sizes its KV cache from this (GiB); the engine's
        # blocks are then cut to a few by num_gpu_blocks_override. (A GPU
        # build ignores it.)
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
    })
    return env



def log_tail(path, n: int = 60) -> str:
    """The last n lines of a child's log, for a failing test's message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class EngineChild:
    def __init__(self, model: Path, log: Path, kvcr: dict | None = None,
                 cpu_chunks: int = 4, engine_blocks: int = 10,
                 prefix_caching: bool = True, chunk_bytes: int = CHUNK_BYTES,
                 kv_events: str | None = None, start_timeout: float = 240.0) -> None:
        cfg = {"model": str(model), "kvcr": kvcr, "cpu_chunks": cpu_chunks, "kv_events": kv_events,
               "engine_blocks": engine_blocks, "prefix_caching": prefix_caching,
               "chunk_bytes": chunk_bytes,
               "block_size": BLOCK_TOKENS, "max_model_len": 256}
        self.log = log
        r, w = os.pipe()
        self._logf = open(log, "wb")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "vllm_engine_child.py"), json.dumps(cfg), str(w)],
                stdin=subprocess.PIPE, stdout=self._logf, stderr=subprocess.STDOUT,
                pass_fds=(w,), env=child_env(), cwd=str(log.parent))
        finally:
            os.close(w)
        self._reply = os.fdopen(r, "rb", buffering=0)
        self._buf = b""
        self._recv(start_timeout, "ready")

    def _recv(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"engine child: no {what} in {timeout:.0f} s; "
                                   f"log {self.log}:\n{self.tail()}")
            ready, _, _ = select.select([self._reply], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._reply.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"engine child exited ({self.proc.poll()}) before "
                                       f"{what}; log {self.log}:\n{self.tail()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        ans = json.loads(line)
        if "error" in ans:
            raise RuntimeError(f"engine child: {ans['error']}")
        return ans

    def call(self, op: str, timeout: float = 150.0, **args) -> dict:
        self.proc.stdin.write((json.dumps(dict(args, op=op)) + "\n").encode())
        self.proc.stdin.flush()
        return self._recv(timeout, op)

    def generate(self, tokens, max_tokens: int = 8, kv_hints: dict | None = None) -> dict:
        return self.call("generate", tokens=list(tokens), max_tokens=max_tokens,
                         kv_hints=kv_hints)

    def metrics(self) -> dict:
        return self.call("metrics")["metrics"]

    def tail(self, n: int = 60) -> str:
        return log_tail(self.log, n)

    def close(self) -> int | None:
        """Asks the child to quit (vLLM shuts down its connector and the KVCR
        tier), then SIGTERM, then SIGKILL; always reaps it. Its exit code."""
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=60)
            except (OSError, RuntimeError, TimeoutError, ValueError):
                pass
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            for sig_fn, wait_s in ((None, 60), (self.proc.terminate, 15), (self.proc.kill, 15)):
                if sig_fn is not None:
                    sig_fn()
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._reply.close()
        self._logf.close()
        return self.proc.returncode


def connector_config(tier: dict, cpu_chunks: int = 4, chunk_bytes: int = CHUNK_BYTES,
                     self_describing_events: bool = False) -> dict:
    """--kv-transfer-config: vLLM's OffloadingConnector, its tiering spec and
    the KVCR tier. The spec is vLLM's TieringOffloadingSpec with the host-copy
    worker of vllm_engine_cpu_offload.py (vLLM's CPU platform), or vLLM's spec
    as it is with KVCR_VLLM_OFFLOAD_SPEC=vllm (a CUDA GPU: scripts/vllm-gpu-e2e.sh)."""
    if os.environ.get("KVCR_VLLM_OFFLOAD_SPEC", "host-copy") == "vllm":
        spec = {"spec_name": "TieringOffloadingSpec"}
    else:
        spec = {"spec_name": "HostCopyTieringOffloadingSpec",
                "spec_module_path": "vllm_engine_cpu_offload"}
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": dict(
            spec,
            cpu_bytes_to_use=cpu_chunks * chunk_bytes,
            # With KV events on, vLLM's KVCR tier requires its inventory to be
            # announced with the blocks' metadata (BlockStored carrying tokens).
            self_describing_kv_events=self_describing_events,
            secondary_tiers=[dict(tier, type="kvcr")]),
    }


class ApiServer:
    """vLLM's OpenAI-compatible server (what `vllm serve` runs) in its own
    process group, with the engine core and its worker in processes of
    their own, as deployed. vllm-cpu 0.32.0's `vllm` command fails before
    parsing its arguments (it asks importlib.metadata for the version of a
    distribution named `vllm`; this one is `vllm-cpu`), so it is started as
    `python -m vllm.entrypoints.openai.api_server`, the same server."""

    def __init__(self, model: Path, log: Path, kvcr: dict, start_timeout: float = 240.0,
                 engine_blocks: int = 10, cpu_chunks: int = 4) -> None:
        self.port = free_port()
        self.log = log
        # vLLM names its offload region /dev/shm/vllm_offload_<engine_id>.mmap.
        self.engine_id = f"kvcr-e2e-{os.getpid()}-{self.port}"
        self.region = Path(f"/dev/shm/vllm_offload_{self.engine_id}.mmap")
        self.argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", os.environ.get("KVCR_VLLM_DTYPE", "float32"),
            "--enforce-eager", "--seed", "0",
            "--block-size", str(BLOCK_TOKENS), "--max-model-len", "256",
            "--max-num-batched-tokens", "256", "--max-num-seqs", "4",
            "--num-gpu-blocks-override", str(engine_blocks),
            "--kv-transfer-config", json.dumps(
                dict(connector_config(kvcr, cpu_chunks), engine_id=self.engine_id)),
        ]
        env = child_env()
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the default: an engine core process
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(log.parent), start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}; log {log}:\n"
                                   + self.tail())
            try:
                if self._get("/health", 2.0).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy in {start_timeout:.0f} s; log {log}")
            time.sleep(0.5)  # polling an HTTP endpoint that has no event to wait on

    def _get(self, path: str, timeout: float):
        import urllib.request
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout)

    def complete(self, tokens, max_tokens: int = 8) -> list[int]:
        """POST /v1/completions, greedy, the prompt as token ids; the output ids."""
        import urllib.request
        body = json.dumps({"model": self.argv[self.argv.index("--model") + 1],
                           "prompt": list(tokens), "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True,
                           "return_token_ids": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return list(json.load(r)["choices"][0]["token_ids"])

    def metrics(self) -> dict:
        """GET /metrics: {"name{label=v,...}": value} of the kvcr, offload and
        prefix-cache series (engine and model_name labels left out; counters
        without their _total suffix, as the in-process names)."""
        out = {}
        with self._get("/metrics", 30) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("#") or not any(s in line for s in
                                               ("kvcr", "kv_offload", "prefix_cache")):
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            if name.endswith("_created"):
                continue
            name = name[:-len("_total")] if name.endswith("_total") else name
            pairs = []
            for item in labels.rstrip("}").split(","):
                if "=" in item:
                    k, v = item.split("=", 1)
                    if k not in ("engine", "model_name"):
                        pairs.append(f"{k}={v.strip(chr(34))}")
            out[f"{name}{{{','.join(sorted(pairs))}}}"] = float(value)
        return out

    def tail(self, n: int = 60) -> str:
        return log_tail(self.log, n)

    def close(self) -> int | None:
        """SIGTERM to the server (it stops its engine core and worker), then
        SIGKILL; the server reaped, its process group (engine core, worker)
        killed if anything is left, and the offload region removed: vLLM
        0.32's engine core never goes idle with the KVCR tier (the tier's
        has_pending_work() is always True), so its shutdown ends by killing
        the worker, which leaves the region in /dev/shm."""
        import signal
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group we started
        except ProcessLookupError:
            pass
        self.region.unlink(missing_ok=True)
        self._logf.close()
        return self.proc.returncode


def metric(metrics: dict, name: str, **labels) -> float:
    """The value of one series (0 when absent): name plus its labels."""
    key = name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
    return metrics.get(key, 0)


def settle(engine: EngineChild, prefix, want: list[str], tries: int = 20) -> list[str]:
    """Steps the engine (a short prompt with no full block: it stores
    nothing) until KVCR's query of the prefix's blocks answers `want`
    ("STATUS:TIER" each) and vLLM has no cascade or promotion job of the
    KVCR tier in flight, at most `tries` requests. vLLM submits a step's
    stores at the start of the next step, cascades them to KVCR later, and
    KVCR's spills to G3 finish after the eviction that starts them: all land
    while the engine steps. Returns the last answer."""
    def state():
        m = engine.metrics()
        busy = (metric(m, "vllm:kv_offload_tiering_active_cascade_jobs", tier="1:kvcr")
                + metric(m, "vllm:kv_offload_tiering_active_promotion_jobs", tier="1:kvcr"))
        return engine.call("block_hashes", tokens=list(prefix))["kvcr"], busy

    seen, busy = state()
    for i in range(tries):
        if seen == want and not busy:
            break
        engine.generate([4 + (i % 300)] * 8, max_tokens=4)
        seen, busy = state()
    return seen


def kv_hint(source_endpoint: str, hashes, message_id: str = "m-1") -> dict:
    """The router's kv_hint envelope (protocol 0.1, one kv.fetch action)."""
    return {
        "protocol_version": "0.1",
        "message_id": message_id,
        "actions": [{
            "action_id": "a-1",
            "action_type": "kv.fetch",
            "action_version": "1.0",
            "payload": {"source_control_endpoint": source_endpoint,
                        "block_hashes": [int(h) for h in hashes], "mode": "copy"},
        }],
    }
