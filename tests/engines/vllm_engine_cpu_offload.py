"""vLLM's tiering offload spec with a host-memory copy worker, for vLLM's CPU build.

The one test double of the vLLM engine tests, and why: vLLM 0.32's offloading
worker (`CPUOffloadingSpec.get_worker`, inherited by `TieringOffloadingSpec`)
copies between the engine's KV cache and the offload region with CUDA/XPU
streams and refuses any other platform ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs"). On vLLM's CPU platform the engine's
KV cache is itself host memory, so this worker does the same copies with
memmove, synchronously. Everything else is vLLM's own: the offloading
connector, `TieringOffloadingSpec` (subclassed only to hand out this worker),
its CPU primary tier, the shared offload region, the secondary-tier factory
and vLLM's KVCR adapter (`vllm/v1/kv_offload/tiering/kvcr/manager.py`).

vLLM loads this out-of-tree spec by name:
    "spec_name": "HostCopyTieringOffloadingSpec",
    "spec_module_path": "vllm_engine_cpu_offload"   (this file on sys.path)
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import torch

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class _HostCopyDirection:
    """One direction (engine cache -> offload region, or back) of the copies
    vLLM's SingleDirectionOffloadingHandler makes, for its direct layout."""

    def __init__(self, engine_tensors, region_tensors, blocks_per_chunk,
                 layer_refs_per_group, to_region: bool) -> None:
        self.src = engine_tensors if to_region else region_tensors
        self.dst = region_tensors if to_region else engine_tensors
        self.refs = layer_refs_per_group
        self.src_bpc = 1 if to_region else blocks_per_chunk
        self.dst_bpc = blocks_per_chunk if to_region else 1
        self.to_region = to_region

    def copy(self, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> int:
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        engine_spec = src_spec if self.to_region else dst_spec
        assert isinstance(engine_spec, GPULoadStoreSpec)
        src_blocks, dst_blocks = src_spec.block_ids, dst_spec.block_ids
        src_off = dst_off = 0
        total = 0
        for g_idx, (size, first) in enumerate(
                zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if size == 0:
                continue
            src_skip, dst_skip = first % self.src_bpc, first % self.dst_bpc
            src_end = src_off + cdiv(size + src_skip, self.src_bpc)
            dst_end = dst_off + cdiv(size + dst_skip, self.dst_bpc)
            for ref in self.refs[g_idx]:
                s = np.empty(size, dtype=np.uint64)
                d = np.empty(size, dtype=np.uint64)
                compute_sub_block_ptrs(src_blocks[src_off:src_end], self.src_bpc, s,
                                       self.src[ref.tensor_idx], skip_count=src_skip)
                compute_sub_block_ptrs(dst_blocks[dst_off:dst_end], self.dst_bpc, d,
                                       self.dst[ref.tensor_idx], skip_count=dst_skip)
                for sp, dp in zip(s.tolist(), d.tolist()):
                    ctypes.memmove(dp, sp, ref.page_size_bytes)
                total += size * ref.page_size_bytes
            src_off, dst_off = src_end, dst_end
        assert src_off == len(src_blocks) and dst_off == len(dst_blocks)
        return total


class HostCopyOffloadingWorker(OffloadingWorker):
    """vLLM's CPUOffloadingWorker, with memmove for the CUDA copy engine."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int,
                 region: SharedOffloadRegion) -> None:
        self._region = region
        engine, host = [], []
        for t in kv_caches.tensors:
            page = t.page_size_bytes
            engine.append(t.tensor.view(torch.int8).view((-1, page)))
            host.append(region.create_next_worker_view(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = _HostCopyDirection(engine, host, blocks_per_chunk, refs, True)
        self._load = _HostCopyDirection(engine, host, blocks_per_chunk, refs, False)
        self._done: list[TransferResult] = []

    def _run(self, direction, job_id, src_spec, dst_spec) -> bool:
        t0 = time.perf_counter()
        n = direction.copy(src_spec, dst_spec)
        self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=n,
                                         transfer_time=time.perf_counter() - t0))
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._run(self._store, job_id, src_spec, dst_spec)

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        return self._run(self._load, job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        pass  # every copy completed in its submit

    def shutdown(self) -> None:
        # Drop the views of the region first, as vLLM's worker does: a
        # mapping with views into it cannot be closed.
        self._store = self._load = None
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class HostCopyTieringOffloadingSpec(TieringOffloadingSpec):
    """TieringOffloadingSpec whose worker copies with memmove (see above)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not self._worker:
            if self.config.canonical_layout:
                raise NotImplementedError("canonical_layout: not in the host copy worker")
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                self._worker = HostCopyOffloadingWorker(
                    kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._worker
