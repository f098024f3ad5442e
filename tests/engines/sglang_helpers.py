"""Real SGLang objects for the engine tests of kvcr.integrations.sglang:
host KV pools (sglang.srt.mem_cache.pool_host) built on CPU tensors the way
SGLang's pool assembler builds them from a device pool's buffer facts, and
the backend built by SGLang's own storage backend factory from the extra
config `--hicache-storage-backend dynamic` takes, attached as SGLang's
cache controller attaches it. The "device" KV buffers are CPU tensors: the
host pools only read their geometry (no GPU here), and storage never
touches them.

Page keys are SGLang's: 64 hex digits whose first 16 are the router hash."""
from __future__ import annotations

import torch
from sglang.srt.mem_cache.device_pool_info import (KVBufferLayout, KVBuffers, MHABufferInfo,
                                                    MLABufferInfo)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import (AsymmetricMHATokenToKVPoolHost,
                                                MHATokenToKVPoolHost)
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

PAGE = 4          # tokens per page
LAYERS = 2
HEADS = 2
HEAD_DIM = 8
V_HEAD_DIM = 4    # the asymmetric pool's V head
KV_LORA_RANK = 16
ROPE_DIM = 8
DEVICE_PAGES = 8  # the device pool; SGLang sizes the host pool from it

KINDS = [("mha", "layer_first"), ("mha", "page_first"), ("mha", "page_first_direct"),
         ("mha", "page_head"), ("asym", "page_first"), ("asym", "page_first_direct"),
         ("mla", "layer_first"), ("mla", "page_first"), ("mla", "page_first_direct")]

EXTRA = {"backend_name": "kvcr", "module_path": "kvcr.integrations.sglang",
         "class_name": "KVCRHiCacheStorage"}


def _ptrs(tensors) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64)


def host_pool(kind: str, layout: str, ratio: float = 2.0, layers: int = LAYERS,
              head_dim: int = HEAD_DIM, dtype=torch.bfloat16):
    """A real SGLang host pool of DEVICE_PAGES x ratio pages (plus the
    padding page SGLang adds), kind "mha", "asym" (V head != K head) or
    "mla"."""
    tokens = DEVICE_PAGES * PAGE
    cpu = torch.device("cpu")
    common = dict(host_to_device_ratio=ratio, host_size=0, page_size=PAGE, layout=layout,
                  pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                  start_layer=0, end_layer=layers)
    if kind in ("mha", "asym"):
        v_dim = V_HEAD_DIM if kind == "asym" else head_dim
        k = tuple(torch.zeros(tokens + PAGE, HEADS, head_dim, dtype=dtype) for _ in range(layers))
        v = tuple(torch.zeros(tokens + PAGE, HEADS, v_dim, dtype=dtype) for _ in range(layers))
        info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=_ptrs(k),
                                               v_data_ptrs=_ptrs(v), layout=KVBufferLayout.NHD),
                             page_size=PAGE, head_num=HEADS, head_dim=head_dim,
                             v_head_dim=v_dim, dtype=dtype, device=cpu)
        cls = AsymmetricMHATokenToKVPoolHost if kind == "asym" else MHATokenToKVPoolHost
        pool = cls(info, **common)
    else:
        dim = KV_LORA_RANK + ROPE_DIM
        bufs = tuple(torch.zeros(tokens + PAGE, 1, dim, dtype=dtype) for _ in range(layers))
        info = MLABufferInfo(buffers=bufs, data_ptrs=_ptrs(bufs),
                             layer_indices=tuple(range(layers)), device_layer_num=layers,
                             page_size=PAGE, kv_lora_rank=KV_LORA_RANK,
                             qk_rope_head_dim=ROPE_DIM, kv_cache_dim=dim, dtype=dtype,
                             device=cpu)
        pool = MLATokenToKVPoolHost(info, target_layer_num=layers, **common)
    pool._kvcr_test_kind = kind
    return pool


def storage_config(kind: str, layout: str, tp_rank: int = 0, tp_size: int = 1,
                   metrics: bool = False, **extra) -> HiCacheStorageConfig:
    """What SGLang's controller gives a backend (_generate_storage_config)."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=kind == "mla", enable_storage_metrics=metrics,
        is_page_first_layout=layout == "page_first", model_name="kvcr-test-model",
        extra_config=dict(EXTRA, **extra))


def factory_backend(pool, kind: str, layout: str, tp_rank: int = 0, tp_size: int = 1,
                    metrics: bool = False, **extra):
    """The backend as SGLang attaches it (HiCacheController.attach_storage_backend):
    StorageBackendFactory.create_backend("dynamic", ...), then
    register_mem_pool_host, then on_host_pools_registered; close() when the
    attach fails."""
    extra.setdefault("interface_v1", 1)
    extra.setdefault("dram_bytes", 1 << 20)
    cfg = storage_config(kind, layout, tp_rank, tp_size, metrics, **extra)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    try:
        backend.register_mem_pool_host(pool)
        backend.on_host_pools_registered()
    except Exception:
        backend.close()
        raise
    return backend


def page_key(i: int) -> str:
    """SGLang page key i: 64 hex digits, its router hash page_hash(i)."""
    return format(page_hash(i), "016x") + "5a" * 24


def page_hash(i: int) -> int:
    """Router hash of page i (odd pages have the top bit set: SGLang's own
    events send those negative)."""
    return ((0x9E3779B97F4A7C15 * (i + 1)) ^ (i << 7)) % (1 << 64) | (1 << 63 if i % 2 else 0)


def indices(pool, pages) -> torch.Tensor:
    """host_indices of whole pages, as the controller passes them (int64)."""
    ps = pool.page_size
    return torch.tensor([p * ps + t for p in pages for t in range(ps)], dtype=torch.int64)


def page_pieces(pool, page: int) -> list:
    """The byte views of one host page, where SGLang's own
    get_page_buffer_meta says its pieces are."""
    import ctypes
    ptrs, sizes = pool.get_page_buffer_meta(indices(pool, [page]))
    return [(ctypes.c_char * n).from_address(p) for p, n in zip(ptrs, sizes)]


def read_page(pool, page: int) -> bytes:
    return b"".join(bytes(v) for v in page_pieces(pool, page))


def page_bytes(pool) -> int:
    return sum(len(v) for v in page_pieces(pool, 0))


def fill_page(pool, page: int, seed: int) -> bytes:
    """Writes page seed's bytes into host page `page`; returns them."""
    data = page_data(seed, page_bytes(pool))
    at = 0
    for v in page_pieces(pool, page):
        v[:] = data[at:at + len(v)]
        at += len(v)
    return data


def page_data(seed: int, n: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return bytes(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).tolist())


def zero_pool(pool) -> None:
    bufs = pool.kv_buffer if isinstance(pool.kv_buffer, (tuple, list)) else [pool.kv_buffer]
    for b in bufs:
        b.zero_()


# ---- SGLang's own cache controller ------------------------------------------------------

_PUBLISHED = []


def publish_runtime(model_dir: str, layout: str) -> None:
    """SGLang's process-wide runtime context, as a scheduler process has it
    (the controller reads its TP rank and widths from there): server
    arguments for a tiny model whose config.json is written here (no hub),
    TP 1, world rank 0. Once per process."""
    if _PUBLISHED:
        return
    import os
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs
    from transformers import LlamaConfig
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                    architectures=["LlamaForCausalLM"]).save_pretrained(model_dir)
    args = ServerArgs(model_path=model_dir, device="cpu", page_size=PAGE,
                      enable_hierarchical_cache=True, hicache_mem_layout=layout,
                      hicache_ratio=2.0, skip_tokenizer_init=True)
    runtime_context.publish(args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=0))
    _PUBLISHED.append(layout)


def controller(kind: str, layout: str, model_dir: str, metrics: bool = False, **extra):
    """SGLang's HiCacheController over a CPU device pool (MHATokenToKVPool
    or MLATokenToKVPool) and a host pool built from its buffer facts, its
    storage the `dynamic` backend of `extra` (the controller calls SGLang's
    factory, register_mem_pool_host and on_host_pools_registered itself).
    The host pool is built directly, not by SGLang's assembler
    (build_kv_host_pool), because the assembler pins host memory with
    cudaHostRegister, which needs an NVIDIA driver."""
    import threading
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    publish_runtime(model_dir, layout)
    tokens = DEVICE_PAGES * PAGE
    common = dict(host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                  pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                  start_layer=0, end_layer=LAYERS)
    if kind == "mla":
        device = MLATokenToKVPool(tokens, PAGE, torch.bfloat16, KV_LORA_RANK, ROPE_DIM, LAYERS,
                                  "cpu", False)
        host = MLATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info,
                                    target_layer_num=LAYERS, **common)
    else:
        device = MHATokenToKVPool(tokens, PAGE, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu",
                                  False)
        host = MHATokenToKVPoolHost(device._mha_buffer_info(), **common)
    allocator = PagedTokenToKVPoolAllocator(tokens, PAGE, torch.bfloat16, "cpu", device,
                                            need_sort=False)
    extra.setdefault("interface_v1", 1)
    extra.setdefault("dram_bytes", 1 << 20)
    return HiCacheController(allocator, host, PAGE, None, threading.Event(),
                             storage_backend="dynamic", model_name="kvcr-test-model",
                             storage_backend_extra_config=dict(EXTRA, **extra),
                             enable_storage_metrics=metrics)


def token_ids(seed: int, pages: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (pages * PAGE,), generator=g).tolist()


def storage_keys(tokens: list) -> list:
    """SGLang's own page keys of a token sequence (what the controller
    hashes them to)."""
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    return get_storage_hash_str(tokens, None, page_size=PAGE)


def backup(ctrl, host_indices, tokens: list, timeout: float = 30) -> int:
    """The controller's write-back to storage (write_storage, its backup
    thread): the tokens it reports written."""
    op_id = ctrl.write_storage(host_indices, tokens, hash_value=storage_keys(tokens),
                               prefix_keys=[])
    op = ctrl.ack_backup_queue.get(timeout=timeout)
    assert op.id == op_id
    return op.completed_tokens


def prefetch(ctrl, request_id: str, tokens: list, timeout: float = 30):
    """The controller's prefetch from storage, as SGLang's radix cache runs
    it: prefetch() queues the request, the prefetch thread asks the backend
    how many pages it has (batch_exists), the scheduler allocates host
    pages for the hit and hands the operation to the IO thread
    (batch_get_v1), which reports through PrefetchAcks until completed_req.
    Returns (host indices of the hit, tokens completed)."""
    ctrl.prefetch(request_id, tokens, None, [])
    op = ctrl.prefetch_hit_queue.get(timeout=timeout)
    if op.storage_hit_count == 0:
        return None, 0
    op.host_indices = ctrl.mem_pool_host.alloc(op.storage_hit_count)
    ctrl.prefetch_buffer.put(op)
    completed = 0
    for _ in range(1000):
        ack = ctrl.ack_prefetch_queue.get(timeout=timeout)
        if ack.completed_tokens is not None:
            completed = max(completed, ack.completed_tokens)
        if ack.completed_req:
            return op.host_indices, completed
    raise AssertionError("no completed_req PrefetchAck")


def hybrid_controller(model_dir: str, **extra):
    """SGLang's HybridCacheController over a host pool group: the KV pool
    (the index anchor) and a one-layer draft pool (speculative decoding's
    draft KV, a sidecar taking the KV pool's indices), MHA page_first on
    CPU. Returns (controller, KV host pool, draft host pool)."""
    import threading
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry
    publish_runtime(model_dir, "page_first")
    tokens = DEVICE_PAGES * PAGE

    def pools(layers):
        device = MHATokenToKVPool(tokens, PAGE, torch.bfloat16, HEADS, HEAD_DIM, layers, "cpu",
                                  False)
        host = MHATokenToKVPoolHost(device._mha_buffer_info(), 2.0, 0, PAGE, "page_first",
                                    pin_memory=False, device="cpu",
                                    device_capacity_tokens=tokens, start_layer=0,
                                    end_layer=layers)
        return device, host

    kv_device, kv_host = pools(LAYERS)
    draft_device, draft_host = pools(1)
    group = HostPoolGroup([
        PoolEntry(PoolName.KV, kv_host, kv_device, lambda layer: layer,
                  is_primary_index_anchor=True),
        PoolEntry(PoolName.DRAFT, draft_host, draft_device, lambda layer: layer)])
    allocator = PagedTokenToKVPoolAllocator(tokens, PAGE, torch.bfloat16, "cpu", kv_device,
                                            need_sort=False)
    extra.setdefault("interface_v1", 1)
    extra.setdefault("dram_bytes", 1 << 20)
    ctrl = HybridCacheController(allocator, group, PAGE, None, threading.Event(),
                                 storage_backend="dynamic", model_name="kvcr-test-model",
                                 storage_backend_extra_config=dict(EXTRA, **extra))
    return ctrl, kv_host, draft_host
