"""One vLLM engine in a process of its own, driven line by line by a test.

    python vllm_engine_child.py CONFIG_JSON REPLY_FD

CONFIG_JSON: {"model": dir, "kvcr": null | {tier options}, "cpu_chunks": n,
"engine_blocks": n, "prefix_caching": bool, "kv_events": null | "tcp://127.0.0.1:port"}. With "kvcr", the engine offloads through vLLM's
OffloadingConnector, its tiering spec and vLLM's KVCR tier
(vllm_engine_proc.connector_config: on the CPU platform with
vllm_engine_cpu_offload's host-copy worker, vLLM's own worker needing CUDA;
with KVCR_VLLM_OFFLOAD_SPEC=vllm, vLLM's TieringOffloadingSpec as it is, for
a GPU); without, it has no connector at all (the baseline).

Commands, one JSON object a line on stdin; one JSON reply a line on
REPLY_FD (vLLM logs on stdout/stderr, which the test sends to a file):
  {"op": "generate", "tokens": [...], "max_tokens": n, "kv_hints": env|null}
      -> {"tokens": [...], "cached": n, "ttft_s": s}
  {"op": "metrics"}        -> {"metrics": {"name{label=v,...}": value}} (vllm:kvcr*,
                               tiering, prefix-cache and offload series)
  {"op": "block_hashes", "tokens": [...]}
      -> {"hashes": [router hash of each full block],
          "kvcr": ["STATUS:TIER" of KVCR's query of its offload key, e.g. "HIT:LOCAL_G2"]}
  {"op": "endpoint"}       -> {"endpoint": KVCR's control endpoint or null}
  {"op": "quit"}           -> {"bye": true}, then the engine shuts down
Errors come back as {"error": traceback}.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid


def _engine(cfg: dict):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kw = dict(
        model=cfg["model"], tokenizer=cfg["model"],
        dtype=os.environ.get("KVCR_VLLM_DTYPE", "float32"), enforce_eager=True,
        seed=0, block_size=cfg.get("block_size", 32),
        max_model_len=cfg.get("max_model_len", 256),
        max_num_seqs=4, max_num_batched_tokens=cfg.get("max_model_len", 256),
        num_gpu_blocks_override=cfg.get("engine_blocks", 10),
        enable_prefix_caching=cfg.get("prefix_caching", True), disable_log_stats=False,
    )
    tier = cfg.get("kvcr")
    if tier is not None:
        chunk_bytes = cfg["chunk_bytes"]
        from vllm_engine_proc import connector_config
        events = cfg.get("kv_events")
        kw["kv_transfer_config"] = KVTransferConfig(
            **connector_config(tier, cfg.get("cpu_chunks", 4), chunk_bytes,
                               self_describing_events=events is not None))
        if events is not None:
            from vllm.config import KVEventsConfig
            # vLLM connects its PUB socket to a tcp://host:port endpoint;
            # the test's subscriber (the router) binds it.
            kw["kv_events_config"] = KVEventsConfig(
                enable_kv_cache_events=True, publisher="zmq", endpoint=events,
                topic="kvcr-e2e")
    return LLM(**kw)


def _kvcr_tier(llm):
    core = llm.llm_engine.engine_core.engine_core  # in-process engine core
    connector = core.scheduler.connector
    if connector is None:
        return None
    return connector.connector_scheduler.manager.secondary_tiers[0]


def _metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if not any(s in m.name for s in ("kvcr", "kv_offload", "prefix_cache")):
            continue
        value = getattr(m, "value", None)
        if value is None:
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items())
                          if k not in ("engine", "model_name"))
        out[f"{m.name}{{{labels}}}"] = value
    return out


def _generate(llm, tokens, max_tokens, kv_hints):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    env = None
    if kv_hints is not None:
        env = KvHintsEnvelope(
            protocol_version=kv_hints["protocol_version"],
            message_id=kv_hints["message_id"],
            actions=[KvHintAction(**a) for a in kv_hints["actions"]])
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    req_id = f"req-{uuid.uuid4().hex[:12]}"
    engine = llm.llm_engine
    t0 = time.perf_counter()
    engine.add_request(req_id, TokensPrompt(prompt_token_ids=list(tokens)), params,
                       kv_hints=env)
    ttft = None
    final = None
    deadline = time.monotonic() + 120
    while final is None:
        if time.monotonic() > deadline:
            engine.abort_request([req_id])
            raise TimeoutError(f"{req_id} did not finish in 120 s")
        for out in engine.step():
            if out.request_id != req_id:
                continue
            if ttft is None and out.outputs and out.outputs[0].token_ids:
                ttft = time.perf_counter() - t0
            if out.finished:
                final = out
    return {"tokens": list(final.outputs[0].token_ids),
            "cached": final.num_cached_tokens or 0, "ttft_s": ttft}


def _block_hashes(llm, tokens):
    """Router hashes (vLLM's block hash, low 64 bits) of the full blocks of
    `tokens`, as vLLM's scheduler computes them, and what this process's
    KVCR says of each block's offload key."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, maybe_convert_block_hash
    from vllm.v1.kv_offload.base import make_offload_key

    cache = llm.llm_engine.vllm_config.cache_config
    hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
    bs = cache.block_size
    parent, hashes, keys = None, [], []
    for i in range(len(tokens) // bs):
        parent = hash_block_tokens(hash_fn, parent, tokens[i * bs:(i + 1) * bs])
        hashes.append(maybe_convert_block_hash(parent))
        keys.append(make_offload_key(parent, 0))
    tier = _kvcr_tier(llm)
    status = []
    if tier is not None:
        status = [f"{s.name}:{t.name if t is not None else None}"
                  for s, t in tier._kvcr.query(tuple(keys))]
    return {"hashes": hashes, "kvcr": status}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    reply = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    llm = _engine(cfg)
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "generate":
                ans = _generate(llm, cmd["tokens"], cmd.get("max_tokens", 8),
                                cmd.get("kv_hints"))
            elif op == "metrics":
                ans = {"metrics": _metrics(llm)}
            elif op == "block_hashes":
                ans = _block_hashes(llm, cmd["tokens"])
            elif op == "endpoint":
                tier = _kvcr_tier(llm)
                ans = {"endpoint": tier._kvcr.control_endpoint if tier else None}
            elif op == "quit":
                reply.write(json.dumps({"bye": True}) + "\n")
                break
            else:
                ans = {"error": f"unknown op {op!r}"}
        except Exception:
            ans = {"error": traceback.format_exc()}
        reply.write(json.dumps(ans) + "\n")
    # vLLM's own shutdown: the connector's scheduler side shuts the KVCR
    # tier down (drain, close) and removes the offload region.
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
