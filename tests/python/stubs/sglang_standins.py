"""Small stand-ins for the SGLang names kvcr.integrations.sglang uses.

SGLang cannot be installed here. These follow SGLang's HiCache storage
interface for exactly the surface a storage backend meets: the abstract
HiCacheStorage (with its default register_mem_pool_host, batch_exists,
clear, get_stats), HiCacheStorageConfig and HiCacheStorageExtraInfo
(sglang/srt/mem_cache/hicache_storage.py), the `dynamic` backend factory's
import-check-construct (storage/backend_factory.py), and host KV pools
(pool_host: MHA and MLA, layouts layer_first, page_first,
page_first_direct) over plain memory with SGLang's kv_buffer dimensions and
get_page_buffer_meta pointer order, and the storage metrics a backend's
get_stats returns with the collector that consumes them
(sglang/srt/metrics/collector.py: StorageMetrics,
StorageMetricsCollector.log_storage_metrics). Tensors are a tiny class with
the methods the backend reads (data_ptr, numel, element_size)."""
from __future__ import annotations

import ctypes
import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional

from standin_modules import register_modules


class DType:
    def __init__(self, itemsize: int) -> None:
        self.itemsize = itemsize


class Tensor:
    """A flat byte buffer standing in for a torch tensor (uint8 view)."""

    def __init__(self, nbytes: int, itemsize: int = 2) -> None:
        self._buf = (ctypes.c_uint8 * nbytes)()
        self.dtype = DType(itemsize)
        self._nbytes = nbytes

    def data_ptr(self) -> int:
        return ctypes.addressof(self._buf)

    def numel(self) -> int:
        return self._nbytes // self.dtype.itemsize

    def element_size(self) -> int:
        return self.dtype.itemsize

    def read(self, off: int, n: int) -> bytes:
        return bytes(self._buf[off:off + n])

    def write(self, off: int, data: bytes) -> None:
        ctypes.memmove(self.data_ptr() + off, data, len(data))


# ---- sglang.srt.mem_cache.hicache_storage ------------------------------------------------

@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    is_mla_model: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    enable_storage_metrics: bool = False
    dp_rank: int = 0


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pass

    def batch_set_v1(self, keys: List[str], host_indices: Any,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pass

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        pass

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> Any:
        pass

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


# ---- sglang.srt.metrics.collector (what get_stats returns, and who reads it) --------------

@dataclass
class StorageMetrics:
    """One entry per storage batch since the backend's last get_stats:
    pages of each prefetch (storage -> host) and backup (host -> storage)
    batch, and their bandwidths in GB/s."""
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class StorageMetricsCollector:
    """SGLang's consumer of get_stats (the HiCache controller hands it what
    the backend returns): None is skipped, anything else must be a
    StorageMetrics, each entry observed in its histogram (here: a list of
    observations per histogram)."""

    def __init__(self) -> None:
        self.histograms = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                           "backup_bandwidth": []}

    def log_storage_metrics(self, storage_metrics: Optional[StorageMetrics] = None) -> None:
        if storage_metrics is None:
            return
        assert isinstance(storage_metrics, StorageMetrics)
        for name, observed in self.histograms.items():
            observed.extend(getattr(storage_metrics, name))


# ---- sglang.srt.mem_cache.storage.backend_factory (the `dynamic` path) ------------------

class StorageBackendFactory:
    @staticmethod
    def create_dynamic(storage_config: HiCacheStorageConfig, mem_pool_host) -> HiCacheStorage:
        """What `--hicache-storage-backend dynamic` does with the extra
        config's module_path / class_name, then the controller's attach."""
        extra = storage_config.extra_config or {}
        module = importlib.import_module(extra["module_path"])
        cls = getattr(module, extra["class_name"])
        if not issubclass(cls, HiCacheStorage):
            raise TypeError(f"{cls} is not a subclass of HiCacheStorage")
        backend = cls(storage_config, {})
        try:
            backend.register_mem_pool_host(mem_pool_host)
        except Exception:
            backend.close()
            raise
        return backend


# ---- sglang.srt.mem_cache.memory_pool_host ---------------------------------------------

class _HostPool:
    """Common host-pool attributes; kv_buffer is one flat allocation."""

    def __init__(self, size: int, page_size: int, layer_num: int, layout: str,
                 itemsize: int, token_bytes: int, dims: tuple) -> None:
        assert size % page_size == 0
        self.size = size
        self.page_size = page_size
        self.layer_num = layer_num
        self.layout = layout
        self.dtype = DType(itemsize)
        self.token_bytes = token_bytes  # one token of one layer (K or the MLA latent)
        self.kv_buffer = Tensor(self._total_bytes(), itemsize)
        self.kv_buffer.shape = dims

    def page_bytes(self) -> int:
        """A flat data page: every piece of one page."""
        return len(self._pieces(0)) * self._piece_bytes()

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for t in list(indices)[0::self.page_size]:
            for p in self._pieces(int(t)):
                ptrs.append(p)
                sizes.append(self._piece_bytes())
        return ptrs, sizes

    # The page's bytes in its pieces' order, for tests.
    def read_page(self, t: int) -> bytes:
        base = self.kv_buffer.data_ptr()
        return b"".join(self.kv_buffer.read(p - base, self._piece_bytes())
                        for p in self._pieces(t))

    def write_page(self, t: int, data: bytes) -> None:
        base, n = self.kv_buffer.data_ptr(), self._piece_bytes()
        for i, p in enumerate(self._pieces(t)):
            self.kv_buffer.write(p - base, data[i * n:(i + 1) * n])

    def _flat_pieces(self, t: int) -> list:
        """A flat data page is kv_buffer's slice of the page flattened: the
        pieces in the buffer's own order (MHA layer_first: every K, then
        every V), not get_page_buffer_meta's."""
        return self._pieces(t)

    def get_data_page(self, index: int, flat: bool = True) -> Tensor:
        page = Tensor(self.page_bytes(), self.dtype.itemsize)
        base, n = self.kv_buffer.data_ptr(), self._piece_bytes()
        for i, p in enumerate(self._flat_pieces(index)):
            page.write(i * n, self.kv_buffer.read(p - base, n))
        return page

    def get_dummy_flat_data_page(self) -> Tensor:
        return Tensor(self.page_bytes(), self.dtype.itemsize)

    def set_from_flat_data_page(self, index: int, data_page: Tensor) -> None:
        base, n = self.kv_buffer.data_ptr(), self._piece_bytes()
        for i, p in enumerate(self._flat_pieces(index)):
            self.kv_buffer.write(p - base, data_page.read(i * n, n))


class MHATokenToKVPoolHost(_HostPool):
    """kv_buffer dims: layer_first (2, L, size, H, D), page_first (2, size, L, H, D),
    page_first_direct (2, page_num, L, ps, H, D)."""

    def __init__(self, size: int, page_size: int, layer_num: int, head_num: int,
                 head_dim: int, layout: str = "layer_first", itemsize: int = 2) -> None:
        self.head_num = head_num
        self.head_dim = head_dim
        tok = head_num * head_dim * itemsize
        dims = {"layer_first": (2, layer_num, size, head_num, head_dim),
                "page_first": (2, size, layer_num, head_num, head_dim),
                "page_first_direct": (2, size // page_size, layer_num, page_size, head_num,
                                      head_dim)}[layout]
        super().__init__(size, page_size, layer_num, layout, itemsize, tok, dims)

    def _total_bytes(self) -> int:
        return 2 * self.layer_num * self.size * self.token_bytes

    def _piece_bytes(self) -> int:
        ps, tok = self.page_size, self.token_bytes
        return ps * tok if self.layout == "layer_first" else self.layer_num * ps * tok

    def _pieces(self, t: int) -> list:
        base, tok, L = self.kv_buffer.data_ptr(), self.token_bytes, self.layer_num
        v_off = L * self.size * tok
        if self.layout == "layer_first":
            out = []
            for layer in range(L):
                k = base + t * tok + layer * self.size * tok
                out += [k, k + v_off]
            return out
        k = base + t * L * tok
        return [k, k + v_off]

    def _flat_pieces(self, t: int) -> list:
        pieces = self._pieces(t)
        return pieces[0::2] + pieces[1::2] if self.layout == "layer_first" else pieces


class MLATokenToKVPoolHost(_HostPool):
    """kv_buffer dims: layer_first (L, size, 1, kvdim), page_first (size, L, 1, kvdim),
    page_first_direct (page_num, L, ps, 1, kvdim)."""

    def __init__(self, size: int, page_size: int, layer_num: int, kv_cache_dim: int,
                 layout: str = "layer_first", itemsize: int = 2) -> None:
        self.kv_cache_dim = kv_cache_dim
        tok = kv_cache_dim * itemsize
        dims = {"layer_first": (layer_num, size, 1, kv_cache_dim),
                "page_first": (size, layer_num, 1, kv_cache_dim),
                "page_first_direct": (size // page_size, layer_num, page_size, 1,
                                      kv_cache_dim)}[layout]
        super().__init__(size, page_size, layer_num, layout, itemsize, tok, dims)

    def _total_bytes(self) -> int:
        return self.layer_num * self.size * self.token_bytes

    def _piece_bytes(self) -> int:
        ps, tok = self.page_size, self.token_bytes
        return ps * tok if self.layout == "layer_first" else self.layer_num * ps * tok

    def _pieces(self, t: int) -> list:
        base, tok, L = self.kv_buffer.data_ptr(), self.token_bytes, self.layer_num
        if self.layout == "layer_first":
            return [base + t * tok + layer * self.size * tok for layer in range(L)]
        return [base + t * L * tok]


_MODULES = {
    "sglang.srt.mem_cache.hicache_storage": {
        "HiCacheStorage": HiCacheStorage,
        "HiCacheStorageConfig": HiCacheStorageConfig,
        "HiCacheStorageExtraInfo": HiCacheStorageExtraInfo,
    },
    "sglang.srt.metrics.collector": {
        "StorageMetrics": StorageMetrics,
        "StorageMetricsCollector": StorageMetricsCollector,
    },
    "sglang.srt.mem_cache.storage.backend_factory": {
        "StorageBackendFactory": StorageBackendFactory,
    },
    "sglang.srt.mem_cache.memory_pool_host": {
        "MHATokenToKVPoolHost": MHATokenToKVPoolHost,
        "MLATokenToKVPoolHost": MLATokenToKVPoolHost,
    },
}


def install() -> None:
    """Registers the stand-in modules (and their parent packages)."""
    register_modules(_MODULES)
