"""KVCR as an SGLang HiCache storage backend.

SGLang loads it through its `dynamic` storage backend:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
        "backend_name": "kvcr", "module_path": "kvcr.integrations.sglang",
        "class_name": "KVCRHiCacheStorage", "interface_v1": 1,
        "dram_bytes": 34359738368, "control_port": 18000, "hint_port": 18100}'

SGLang's backend factory constructs it as `KVCRHiCacheStorage(storage_config,
kwargs)`; the controller then calls `register_mem_pool_host(host_pool)`,
where the KVCR instance of this TP rank is created:

* With `interface_v1` (zero copy) the host pool's pages are registered as
  framework regions of one KVCR pool "kv" whose block is one page. The
  regions are found from the pool's own `get_page_buffer_meta`, probed on
  its first, second and last page: one region per pointer it gives a page
  (MHA layer_first: K and V of each layer; MHA page_first,
  page_first_direct, page_head and the asymmetric pool whose V head is not
  K's: K and V; MLA layer_first: one per layer; MLA page_first(_direct):
  one), whatever attributes the pool has. `batch_set_v1` deposits pages
  into KVCR DRAM, `batch_get_v1` delivers them back (from KVCR DRAM, G3,
  or the peer a router hint names), each piece where it belongs.
* The legacy calls (`batch_set`, `batch_get`, `set`, `get`) copy flat data
  pages through a staging region into a KVCR pool of their own, "flat",
  with or without `interface_v1`: SGLang sends speculative decoding's draft
  KV (`<key>.draft`) through them even when `interface_v1` is on. A flat
  value may be smaller than a page (a draft page holds fewer layers).
  (Not with `g3_paths` and `interface_v1` together: libkvcr's G3 takes one
  KVCR pool, the KV pool's.)
* SGLang's hybrid controller registers more host pools
  (`register_mem_host_pool_v2`: draft, SWA, Mamba, indexer, ...) and calls
  `batch_exists_v2` / `batch_get_v2` / `batch_set_v2`: each pool becomes a
  KVCR pool of its own, probed as above (a pool whose pages cannot be
  probed is logged, and its transfers fail). When pools are added, KVCR is
  made anew over all of them before the first transfer.
* Keys get this rank's namespace (`<key>@<layout>:tp<r>of<n>:pp<r>of<n>`;
  MLA pages, the same on every rank, without the TP rank; other pools'
  `<key>#<pool>@...`). A KV page's router hash is the first 16 hex digits of
  its key as an unsigned 64-bit integer (SGLang's own events send it signed:
  hints may too).
* Router hints (see docs/SGLANG.md). A hint names a source KVCR
  (`source_control_endpoint`, its TP rank 0) and page hashes; hinted pages
  count as hits in `batch_exists` and `batch_get_v1` pulls them from the
  source (an MHA rank r from the source's rank r: port + r; MLA ranks from
  the source's rank 0, which alone stores MLA pages). It reaches the
  backend by either path:
  - in `extra_info.extra_info`, under "kv_hint" or "kv_hints" (the kv_hint
    envelope as a dict, JSON text or SGLang's KvHintsEnvelope) or
    "kvcc_router_hint" (a bare {source_control_endpoint, block_hashes}),
    with an optional "request_id" — when an SGLang build forwards it;
  - by prefix, from the router itself, ahead of the request: one JSON hint
    per line to the backend's `hint_endpoint` (extra config `hint_port`:
    this rank listens on base + tp_rank), answered "ok" or "error: ...", or
    in process with `submit_prefix_hint(hint)`. A lookup whose keys (or
    prefix keys) a kept hint names uses that hint.
  The last HINTS_KEPT hints of each path are kept.
* MLA: SGLang stores pages from TP rank 0 only. With a `control_port`
  base, the other ranks read them from rank 0's KVCR on the same host
  (advertise_host:base) when no router hint names a source: they count
  every page as a hit (SGLang takes the least count of its ranks, and rank
  0 counts only what it holds) and pull them from rank 0. Without a base
  port they see no pages, and SGLang none from storage.
* Data-path calls never raise and never return None where SGLang expects
  a value (SGLang's controller threads die on an exception): a failure
  returns False / 0 / a miss and is logged.

Configuration (`storage_config.extra_config`, all optional):
  dram_bytes          KVCR DRAM of this rank (default 1 GiB; whole pages),
                      shared by its pools
  legacy_dram_bytes   with interface_v1, the part of it for flat pages
                      (default an eighth; without interface_v1 flat pages
                      have all of it)
  g3_paths            G3 slot files (a list, or one comma-separated string);
                      the rank's files are "<path>.tp<r>". libkvcr's G3 takes
                      one KVCR pool: with interface_v1 it is the KV pool's,
                      and flat pages (draft KV) and other host pools are
                      then refused (logged)
  g3_bytes_per_file   data capacity of each G3 file (default 4 x dram_bytes)
  control_host        address the peer tier binds (default 127.0.0.1)
  control_port        base port: this rank binds base + tp_rank (0: any free)
  advertise_host      address peers are told (default control_host)
  hint_port           base port of the router's hint listener: this rank
                      binds control_host:base + tp_rank (0: any free; absent:
                      no listener)
  kv_events_endpoint  ZeroMQ endpoint of KV events (TP rank 0 publishes; a page
                      is announced by its hash, its parent's and the page size:
                      SGLang gives a backend no token ids)
  kv_events_topic     their topic (default "kv@<host name>@<model name>")
  operation_timeout_ms  libkvcr's operation deadline (default 5000)
`control_endpoint` says where peers (and a router's hints) reach this rank,
`hint_endpoint` where the router hands it hints.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import mmap
import os
import re
import select
import socket
import socketserver
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, List, Optional

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError as exc:  # pragma: no cover - only without SGLang
    raise ImportError("kvcr.integrations.sglang is an SGLang HiCache storage backend: it needs "
                      "SGLang (sglang.srt.mem_cache.hicache_storage)") from exc

import kvcr
from kvcr.hints import fetch_hashes, router_hint_envelope

log = logging.getLogger("kvcr.sglang")

POOL = "kv"           # SGLang's KV pool (PoolName.KV)
FLAT = "flat"         # flat data pages of the legacy calls
STAGE_PAGES = 128     # the controller's largest batch
HINTS_KEPT = 1024     # hints kept per path (per request, per prefix)
HINT_LINE_MAX = 1 << 20  # the longest hint line the listener reads
HINT_CONNECTIONS_MAX = 16  # router connections a rank's hint listener serves at once
HINT_KEYS = ("kv_hint", "kv_hints", "kvcc_router_hint")  # where extra_info carries one
RANK0_REQUEST = "sglang-mla-tp0"  # an MLA rank's reads from its rank 0
DEFAULT_DRAM = 1 << 30
METRIC_BATCHES = 4096  # per-batch samples of each kind kept between two get_stats calls
GIB = float(1 << 30)   # SGLang's storage bandwidths are in GB/s of 2^30 bytes
# Where SGLang keeps StorageMetrics: moved in 2026-02 from the first module.
METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")
ENDPOINT = re.compile(r"^(tcp://.+:)(\d+)(#.*)?$")


class _PageKeys:
    """Key adapter: a namespaced KV page key ("<64 hex>@...") has a router
    hash, the first 16 hex digits of SGLang's key; other pools' keys and
    flat values under other names (a draft page's "<key>.draft") have none,
    so they are never announced as KV blocks."""

    def encode(self, framework_key: Any) -> bytes:
        return bytes(framework_key)

    def decode(self, key: bytes) -> Optional[int]:
        key = bytes(key)
        if key[64:65] != b"@":
            return None
        try:
            return int(key[:16], 16)
        except ValueError:
            return None


def _hash(key: str) -> Optional[int]:
    """The router hash of an SGLang page key, or None."""
    try:
        return int(key[:16], 16) if len(key) >= 16 else None
    except ValueError:
        return None


class _HostPages:
    """One SGLang host pool as KVCR sees it: the pieces of a page (where
    get_page_buffer_meta puts them), found by probing the pool."""

    def __init__(self, name: str, pool) -> None:
        import torch  # SGLang's own dependency: its pools take index tensors
        self.name, self.pool = name, pool
        self.layout = str(getattr(pool, "layout", "?"))
        self.page_size = ps = int(pool.page_size)
        self.pages = int(pool.size) // ps
        if self.pages < 1:
            raise ValueError(f"host pool {name!r} holds no page of {ps} tokens")

        def meta(page):
            ptrs, sizes = pool.get_page_buffer_meta(
                torch.arange(page * ps, (page + 1) * ps, dtype=torch.int64))
            return [int(p) for p in ptrs], [int(s) for s in sizes]

        ptrs, sizes = meta(0)
        if not ptrs or len(ptrs) != len(sizes) or min(sizes) <= 0:
            raise ValueError(f"host pool {name!r} ({self.layout}) describes no page")
        strides = list(sizes)
        if self.pages > 1:
            p1, s1 = meta(1)
            strides = [b - a for a, b in zip(ptrs, p1)]
            if len(p1) != len(ptrs) or s1 != sizes:
                raise ValueError(f"host pool {name!r} ({self.layout}): pages differ in pieces")
        last, sl = meta(self.pages - 1)
        if sl != sizes or any(q != p + (self.pages - 1) * st
                              for p, q, st in zip(ptrs, last, strides)) \
                or any(st < sz for st, sz in zip(strides, sizes)):
            raise ValueError(f"host pool {name!r} ({self.layout}): its pages are not evenly "
                             "strided pieces, which KVCR cannot register")
        self.parts = list(zip(ptrs, sizes, strides))
        self.page_bytes = sum(sizes)
        self.label = name if len(self.parts) == 1 else f"{name}:*"

    def regions(self) -> list:
        if len(self.parts) == 1:
            (addr, size, stride), = self.parts
            return [kvcr.RegionDescriptor(addr=addr, size=size, stride=stride, count=self.pages,
                                          label=self.name)]
        return [kvcr.RegionDescriptor(addr=addr, size=size, stride=stride, count=self.pages,
                                      label=f"{self.name}:p{i}")
                for i, (addr, size, stride) in enumerate(self.parts)]

    def page_of(self, host_indices, n: int) -> Optional[list]:
        """The page (element) index of each of n pages given as host token
        indices (an int64 tensor or a list), or None when they are not n
        whole pages of this pool."""
        ps = self.page_size
        if hasattr(host_indices, "numel"):
            if host_indices.numel() < n * ps:
                return None
            firsts = host_indices[0:n * ps:ps].tolist()
        else:
            idx = list(host_indices)
            if len(idx) < n * ps:
                return None
            firsts = idx[0:n * ps:ps]
        pages = [int(t) // ps for t in firsts]
        if any(int(t) % ps for t in firsts) or any(not 0 <= p < self.pages for p in pages):
            return None
        return pages


def _flat_bytes(pool) -> int:
    """A legacy flat data page's bytes: what SGLang's own dummy page holds."""
    page = pool.get_dummy_flat_data_page()
    return int(page.numel()) * int(page.element_size())


def _buffer(t) -> tuple:
    """(address, bytes) of a contiguous tensor."""
    return t.data_ptr(), t.numel() * t.element_size()


def _address(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _gettable(status, tier) -> bool:
    """Whether a get of a page KVCR answered this for would find it now. A
    page being spilled to G3 (FETCHING in G3) is not readable until its
    write lands: SGLang asks again on its next prefetch."""
    if status is kvcr.QueryStatus.FETCHING:
        return tier is kvcr.CacheTier.LOCAL_G2
    return status is not kvcr.QueryStatus.MISS


class _HintServer(socketserver.ThreadingTCPServer):
    """The rank's hint listener: a thread per router connection, at most
    HINT_CONNECTIONS_MAX at once (a router keeps one; more are refused with
    a line saying so and counted in the backend's stats)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler, backend) -> None:
        self.backend = backend
        self._slots = threading.BoundedSemaphore(HINT_CONNECTIONS_MAX)
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.backend._count("hint_connections_refused", 1)  # before the router hears
            try:
                request.sendall(b"error: too many hint connections\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _HintHandler(socketserver.StreamRequestHandler):
    """One router connection: a JSON hint per line, each answered "ok" or
    "error: <why>"."""

    timeout = 30  # a silent connection is closed, not kept forever

    def handle(self) -> None:
        backend = self.server.backend
        while True:
            try:
                line = self.rfile.readline(HINT_LINE_MAX + 1)
            except OSError:
                return
            if not line:
                return
            if len(line) > HINT_LINE_MAX:
                self.wfile.write(b"error: hint line longer than %d bytes\n" % HINT_LINE_MAX)
                return
            if not line.strip():
                continue
            try:
                n = backend.submit_prefix_hint(line)
                reply = f"ok {n}\n"
            except Exception as exc:  # the router hears why; the listener goes on
                reply = f"error: {exc}\n"
            self.wfile.write(reply.encode())


class KVCRHiCacheStorage(HiCacheStorage):
    """KVCR as SGLang's HiCache L3 storage (see the module docstring)."""

    def __init__(self, storage_config, kwargs=None) -> None:
        self.storage_config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra = extra
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.v1 = bool(extra.get("interface_v1"))
        self.dram_bytes = int(extra.get("dram_bytes", DEFAULT_DRAM))
        paths = extra.get("g3_paths") or []
        if isinstance(paths, str):
            paths = [p for p in paths.split(",") if p.strip()]
        self.g3_paths = [Path(f"{os.path.expanduser(str(p).strip())}.tp{self.tp_rank}")
                         for p in paths]
        # libkvcr's G3 takes one KVCR pool: with it and interface_v1 that is
        # the KV pool alone, and flat pages and other host pools are refused.
        self.one_pool = self.v1 and bool(self.g3_paths)
        self.legacy_bytes = (self.dram_bytes if not self.v1 else 0 if self.one_pool
                             else int(extra.get("legacy_dram_bytes", self.dram_bytes // 8)))
        self.g3_bytes = int(extra.get("g3_bytes_per_file", 4 * self.dram_bytes))
        self.control_host = str(extra.get("control_host", "127.0.0.1"))
        self.control_base = base = int(extra.get("control_port", 0))
        self.control_port = base + self.tp_rank if base else 0
        self.advertise_host = str(extra.get("advertise_host", self.control_host))
        hint_base = extra.get("hint_port")
        self.hint_port = None if hint_base is None else \
            (int(hint_base) + self.tp_rank if int(hint_base) else 0)
        self.kv_events_endpoint = extra.get("kv_events_endpoint")
        self.op_ms = int(extra.get("operation_timeout_ms", 5000))
        if self.dram_bytes <= 0 or self.op_ms <= 0 or not 0 <= self.control_port <= 65535 \
                or not (not self.v1 or self.one_pool or 0 < self.legacy_bytes < self.dram_bytes) \
                or not (self.hint_port is None or 0 <= self.hint_port <= 65535):
            raise ValueError("KVCR HiCache backend: dram_bytes and operation_timeout_ms must be "
                             "positive, legacy_dram_bytes positive and less than dram_bytes, and "
                             "control_port / hint_port + tp_rank port numbers")
        self.control_endpoint: Optional[str] = None
        self.hint_endpoint: Optional[str] = None
        self.mem_pool_host = None
        self._kv = None
        self._host: Optional[_HostPages] = None  # the KV pool (zero copy)
        self._extra_pools: dict = {}            # the hybrid controller's other pools, by name
        self._refused_pools: dict = {}          # ... and why one could not be registered
        self._kv_pools: tuple = ()              # the pools of the running KVCR
        self._start_lock = threading.Lock()     # KVCR made anew over added pools
        self._events = False                # this rank publishes KV events
        self._stage = None                  # the legacy calls' staging region
        self.flat_bytes = 0
        self._arenas: list = []             # KVCR DRAM, one per KVCR pool
        self._cond = threading.Condition()  # the completion table and the poller's stop
        self._done: dict = {}
        self._abandoned: dict = {}          # operations nobody waits for any more
        self._poller: Optional[threading.Thread] = None
        self._stop = False
        self._stage_lock = threading.Lock()  # the legacy staging region
        self._stats_lock = threading.Lock()
        self._hints: OrderedDict = OrderedDict()    # request id -> True, submitted to KVCR
        self._prefix: OrderedDict = OrderedDict()   # prefix hint's request id -> its hashes
        self._by_hash: dict = {}                    # block hash -> newest prefix hint's id
        self._hint_lock = threading.Lock()
        self._hint_server: Optional[_HintServer] = None
        self._stats = {"set_pages": 0, "get_pages": 0, "exists_hits": 0, "hinted_requests": 0,
                       "prefix_hints": 0, "failures": 0, "hint_connections_refused": 0}
        # SGLang's storage metrics (get_stats): pages and GB/s of each batch,
        # kept only when SGLang asks for them, the newest METRIC_BATCHES.
        self._metrics_on = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._samples = {k: deque(maxlen=METRIC_BATCHES) for k in
                         ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
        self.agent = f"sglang-{os.getpid()}-tp{self.tp_rank}-pp{self.pp_rank}"

    # ---- set-up ------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Creates this rank's KVCR over the host pool (see the module
        docstring). Raises on a pool or configuration KVCR refuses: SGLang
        then closes the backend and reports the attach failure."""
        super().register_mem_pool_host(mem_pool_host)
        self.page_size = int(mem_pool_host.page_size)
        if self.v1:
            self._host = _HostPages(POOL, mem_pool_host)
            self.page_bytes = self._host.page_bytes
            layout = self._host.layout
        else:
            self.page_bytes = _flat_bytes(mem_pool_host)
            layout = FLAT
        # Flat values are at most a KV page: draft pages hold fewer layers.
        self.flat_bytes = self.page_bytes
        self._stage = mmap.mmap(-1, STAGE_PAGES * self.flat_bytes)
        rank = "" if self.is_mla else f":tp{self.tp_rank}of{self.tp_size}"
        self._rank_ns = f"{rank}:pp{self.pp_rank}of{self.pp_size}"
        self.namespace = f"@{layout}{self._rank_ns}"
        self._start()
        if self.hint_port is not None:
            self._start_hint_server()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """The hybrid controller's other host pools (draft, SWA, Mamba, ...):
        each becomes a KVCR pool at the next transfer (KVCR is made anew
        over all pools, before any page of them is stored). A pool KVCR
        cannot register is logged; its transfers then fail."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(getattr(host_pool_name, "value", host_pool_name))
        if name == POOL or host_pool is self.mem_pool_host:
            return
        try:
            if self.one_pool:
                raise ValueError("with g3_paths KVCR keeps the KV pool alone")
            self._extra_pools[name] = _HostPages(name, host_pool)
            self._refused_pools.pop(name, None)
        except Exception as exc:
            self._refused_pools[name] = str(exc)
            log.warning("host pool %r is not registered with KVCR (its transfers fail): %s",
                        name, exc)

    def on_host_pools_registered(self) -> None:
        """Every host pool is registered: KVCR is made over them now, so
        that a pool KVCR refuses fails the attach."""
        if self._kv is not None and self._pools_changed():
            with self._start_lock:
                self._restart()

    def _pools_changed(self) -> bool:
        return self.v1 and tuple(self._extra_pools) != self._kv_pools

    def _ensure_pools(self) -> bool:
        """KVCR runs over every registered pool (made anew when one was
        added since). False (logged) when it cannot be made."""
        if not self._pools_changed():
            return self._kv is not None
        with self._start_lock:
            if self._pools_changed():
                try:
                    self._restart()
                except Exception:
                    log.exception("KVCR could not be made over the host pools")
                    return False
        return self._kv is not None

    def _restart(self) -> None:
        log.info("KVCR made anew over the host pools %s", [POOL, *self._extra_pools])
        self._close_kv()
        self._start()

    def _start(self) -> None:
        regions, layouts, dram = [], [], []
        if self.v1:
            hosts = [self._host, *self._extra_pools.values()]
            share = self.dram_bytes - self.legacy_bytes
            slots = share // sum(h.page_bytes for h in hosts)
            if slots < 1:
                raise ValueError(f"dram_bytes {self.dram_bytes} holds no page of "
                                 f"{self.page_bytes} bytes beside legacy_dram_bytes")
            for h in hosts:
                regions += h.regions()
                layouts.append((h.name, h.page_bytes))
                dram.append((h.name, slots * h.page_bytes))
        if not self.one_pool:
            flat_slots = self.legacy_bytes // self.flat_bytes
            if flat_slots < 1:
                raise ValueError(f"dram_bytes {self.legacy_bytes} holds no page of "
                                 f"{self.flat_bytes} bytes")
            regions.append(kvcr.RegionDescriptor(addr=_address(self._stage),
                                                 size=self.flat_bytes, count=STAGE_PAGES,
                                                 label=FLAT))
            layouts.append((FLAT, self.flat_bytes))
            dram.append((FLAT, flat_slots * self.flat_bytes))
        self._arenas = [(name, mmap.mmap(-1, n)) for name, n in dram]
        g3 = None
        if self.g3_paths:
            g3 = kvcr.G3Options(paths=tuple(self.g3_paths),
                                capacity_bytes_per_file=self.g3_bytes
                                // self.page_bytes * self.page_bytes)
        events = None
        self._events = bool(self.kv_events_endpoint) and self.tp_rank == 0
        if self._events:
            model = getattr(self.storage_config, "model_name", None) or "model"
            topic = self.extra.get("kv_events_topic", f"kv@{socket.gethostname()}@{model}")
            events = kvcr.KVEventsOptions(endpoint=str(self.kv_events_endpoint), topic=topic,
                                          dp_rank=int(getattr(self.storage_config, "dp_rank",
                                                              0) or 0))
        control = kvcr.ZmqPeerControlChannel(self.control_host, self.control_port,
                                             self.advertise_host)
        self._kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=self.agent, pool_layouts=layouts,
                            operation_timeout_ms=self.op_ms,
                            abandon_timeout_ms=2 * self.op_ms, kv_events=events),
            kvcr.KVCRBindings(None, None, None, framework_control=control,
                              key_adapter=_PageKeys()),
            kvcr.KVCRBackendConfigs(framework_regions=regions,
                                    local_dram=kvcr.LocalDramOptions(
                                        pools=[(name, _address(buf), len(buf))
                                               for name, buf in self._arenas]),
                                    g3=g3))
        self._kv_pools = tuple(self._extra_pools) if self.v1 else ()
        self.control_endpoint = self._kv.control_endpoint
        self._start_poller()
        log.info("KVCR HiCache backend of TP rank %d: pools %s, %d region(s), peers at %s",
                 self.tp_rank, layouts, len(regions), self.control_endpoint)

    def _start_hint_server(self) -> None:
        server = _HintServer((self.control_host, self.hint_port), _HintHandler, self)
        self._hint_server = server
        host, port = server.server_address[:2]
        self.hint_endpoint = f"tcp://{self.advertise_host}:{port}"
        threading.Thread(target=server.serve_forever, name="kvcr-sglang-hints",
                         daemon=True).start()

    # ---- waiting for KVCR ----------------------------------------------------------

    def _start_poller(self) -> None:
        """One thread polls KVCR for the instance's life: it collects every
        completion for the call waiting on it, and releases what source
        writes to peers held, also while SGLang makes no call."""
        self._stop = False
        self._poller = threading.Thread(target=self._poll_loop, args=(self._kv,),
                                        name="kvcr-sglang-poll", daemon=True)
        self._poller.start()

    def _poll_loop(self, kv) -> None:
        fd = kv.fileno()
        while True:
            select.select([fd], [], [], 0.01)
            with self._cond:
                if self._stop:
                    return
                try:
                    done = kv.poll_completed()
                except Exception:  # logged; the next turn polls again
                    log.exception("KVCR poll failed")
                    done = []
                for handle, entries in done:
                    if not self._abandoned.pop(handle, False):
                        self._done[handle] = entries
                if done:
                    self._cond.notify_all()

    def _stop_poller(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._poller is not None:
            self._poller.join()
        self._poller = None
        self._done.clear()
        self._abandoned.clear()

    def _wait(self, op) -> Optional[dict]:
        """The entries of op, or None when it did not complete within the
        operation deadline and a margin (its result is then dropped when it
        comes). Any thread."""
        with self._cond:
            if not self._cond.wait_for(lambda: op in self._done or self._stop,
                                       timeout=self.op_ms / 1000 + 5) or op not in self._done:
                self._abandoned[op] = True
                return None
            return self._done.pop(op)

    def _run(self, what: str, call, keys: list) -> list:
        """Starts an operation (call() -> handle) over namespaced keys and
        waits: one bool per key, all False on any failure (logged)."""
        try:
            entries = self._wait(call())
        except Exception as exc:  # a refused call: logged, never raised
            self._count("failures", 1)
            log.warning("KVCR %s of %d page(s) refused: %s", what, len(keys), exc)
            return [False] * len(keys)
        if entries is None:
            self._count("failures", 1)
            log.warning("KVCR %s of %d page(s) did not complete in time", what, len(keys))
            return [False] * len(keys)
        out = [bool(entries.get(k) is not None and entries[k].success) for k in keys]
        if not all(out):
            reasons = sorted({str(entries[k].reason) for k, ok in zip(keys, out)
                              if not ok and k in entries})
            log.debug("KVCR %s: %d of %d page(s) failed (%s)", what, out.count(False),
                      len(keys), ", ".join(reasons))
        return out

    # ---- keys and hints ------------------------------------------------------------

    def _key(self, key: str, pool: str = POOL) -> bytes:
        if pool == POOL:
            return f"{key}{self.namespace}".encode()
        if pool == FLAT:
            return f"{key}@{FLAT}{self._rank_ns}".encode()
        host = self._extra_pools.get(pool)
        layout = host.layout if host is not None else "?"
        # MLA models replicate every pool but Mamba state, which is TP-sharded.
        rank = f":tp{self.tp_rank}of{self.tp_size}" if pool == "mamba" else ""
        ns = self._rank_ns if not self.is_mla else f"{rank}:pp{self.pp_rank}of{self.pp_size}"
        return f"{key}#{pool}@{layout}{ns}".encode()

    def _realigned(self, envelope: dict) -> dict:
        """A hint names the source's TP rank 0 (the endpoint SGLang
        publishes): an MHA rank r pulls its own heads from the source's rank
        r, at port + r. MLA ranks pull from rank 0, which alone stores."""
        if self.is_mla or not self.tp_rank:
            return envelope
        actions = []
        for action in envelope.get("actions") or []:
            payload = action.get("payload") if isinstance(action, dict) else None
            src = payload.get("source_control_endpoint") if isinstance(payload, dict) else None
            m = ENDPOINT.match(src) if isinstance(src, str) else None
            if m:
                src = f"{m.group(1)}{int(m.group(2)) + self.tp_rank}{m.group(3) or ''}"
                action = dict(action, payload=dict(payload, source_control_endpoint=src))
            actions.append(action)
        return dict(envelope, actions=actions)

    def _request(self, extra_info, keys: List[str]) -> Optional[str]:
        """The request whose router hint covers this call: one in extra_info
        (submitted to KVCR the first time it is seen), else the newest
        prefix hint naming one of the call's keys or prefix keys, else (an
        MLA rank other than 0) its own rank 0, else None."""
        info = getattr(extra_info, "extra_info", None) if extra_info is not None else None
        found = [k for k in HINT_KEYS if isinstance(info, dict) and info.get(k) is not None]
        if not found:
            return self._prefix_request(extra_info, keys) or self._rank0_request(keys)
        hint = self._realigned(router_hint_envelope(info[found[0]]))
        rid = info.get("request_id")
        if rid is None:
            digest = hashlib.blake2b(json.dumps(hint, sort_keys=True).encode(), digest_size=8)
            rid = "hint-" + digest.hexdigest()
        rid = str(rid)
        with self._hint_lock:
            if rid in self._hints:
                self._hints.move_to_end(rid)
                return rid
            self._kv.submit_hint(hint, request_id=rid)
            self._hints[rid] = True
            self._count("hinted_requests", 1)
            while len(self._hints) > HINTS_KEPT:
                old, _ = self._hints.popitem(last=False)
                self._kv.discard_hint(old)
        return rid

    def submit_prefix_hint(self, hint) -> int:
        """Keeps a router hint for the lookups of the pages it names (by
        their hashes: SGLang's page keys): the path that needs nothing from
        SGLang. The hint in any shape router_hint_envelope takes, or
        {"kv_hint": <that>, "request_id": <id>}. Returns how many page
        hashes it names; raises ValueError on a hint KVCR refuses (this is
        the router's call, not SGLang's data path)."""
        if isinstance(hint, (bytes, bytearray, str)):
            try:
                hint = json.loads(hint)
            except ValueError:
                raise ValueError("invalid router hint: not JSON") from None
        rid = None
        if isinstance(hint, dict) and any(k in hint for k in HINT_KEYS):
            rid = hint.get("request_id")
            hint = next(hint[k] for k in HINT_KEYS if k in hint)
        envelope = self._realigned(router_hint_envelope(hint))
        hashes = fetch_hashes(envelope)
        if not hashes:
            raise ValueError("invalid router hint: it names no page")
        if rid is None:
            digest = hashlib.blake2b(json.dumps(envelope, sort_keys=True).encode(),
                                     digest_size=8)
            rid = "prefix-" + digest.hexdigest()
        rid = str(rid)
        with self._hint_lock:
            if self._kv is None:
                raise ValueError("no host pool registered yet")
            self._kv.submit_hint(envelope, request_id=rid)
            self._drop_prefix(rid)
            self._prefix[rid] = hashes
            for h in hashes:
                self._by_hash[h] = rid
            self._count("prefix_hints", 1)
            while len(self._prefix) > HINTS_KEPT:
                self._drop_prefix(next(iter(self._prefix)), discard=True)
        return len(hashes)

    def _drop_prefix(self, rid: str, discard: bool = False) -> None:
        """Forgets a prefix hint (hint lock held); discard: in KVCR too."""
        for h in self._prefix.pop(rid, ()):
            if self._by_hash.get(h) == rid:
                del self._by_hash[h]
        if discard:
            self._kv.discard_hint(rid)

    def _prefix_request(self, extra_info, keys: List[str]) -> Optional[str]:
        if not self._by_hash:
            return None
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        with self._hint_lock:
            for k in list(keys) + list(prefix or ()):
                rid = self._by_hash.get(_hash(k))
                if rid is not None:
                    return rid
        return None

    def _rank0_request(self, keys: List[str]) -> Optional[str]:
        """MLA pages are the same on every TP rank and SGLang stores them from
        rank 0 alone: another rank reads them from rank 0's KVCR on this
        host (control port base + 0), as if a router had hinted them."""
        if not (self.is_mla and self.tp_rank > 0 and self.control_base):
            return None
        hashes = [h for h in map(_hash, keys) if h is not None]
        if not hashes:
            return None
        source = f"tcp://{self.advertise_host}:{self.control_base}"
        self._kv.submit_hint({"protocol_version": "0.1", "actions": [
            {"action_type": "kv.fetch", "action_version": "1.0",
             "payload": {"source_control_endpoint": source, "block_hashes": hashes}}]},
            request_id=RANK0_REQUEST)
        return RANK0_REQUEST

    def _refs(self, host: _HostPages, page: int) -> list:
        return [kvcr.MemoryRef(end_point_name=self.agent, label=host.label,
                               element_index=page)]

    # ---- the zero-copy interface ---------------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Deposits each key's host page into KVCR DRAM (idempotent)."""
        return self._pages_op(False, POOL, keys, host_indices, extra_info)

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Delivers each key's page into its host page: from KVCR DRAM, G3,
        or the peer the request's router hint names."""
        return self._pages_op(True, POOL, keys, host_indices, extra_info)

    def _pages_op(self, get: bool, pool: str, keys: List[str], host_indices,
                  extra_info) -> List[bool]:
        """A zero-copy set (deposit, with what KV events say of KV pages) or
        get (deliver, under the request's hint) of keys' pages of one host
        pool: one bool per key, never an exception (SGLang's backup and
        prefetch threads would die of one)."""
        call = ("batch_get" if get else "batch_set") + ("_v1" if pool == POOL else "_v2")
        try:
            keys = list(keys or [])
            if not keys:
                return []
            if not self._ready_v1(call) or not self._ensure_pools():
                return [False] * len(keys)
            host = self._host if pool == POOL else self._extra_pools.get(pool)
            if host is None:
                log.warning("%s: host pool %r is not registered with KVCR%s", call, pool,
                            f" ({self._refused_pools[pool]})" if pool in self._refused_pools
                            else "")
                return [False] * len(keys)
            pages = host.page_of(host_indices, len(keys))
            if pages is None:
                log.warning("%s: host indices are not %d whole pages of %r", call, len(keys),
                            pool)
                return [False] * len(keys)
            rid = self._request(extra_info, keys) if get and pool == POOL else None
            nkeys = [self._key(k, pool) for k in keys]
            blocks = {nk: self._refs(host, p) for nk, p in zip(nkeys, pages)}
            router = None if get or pool != POOL or not self._events else \
                self._router(keys, nkeys, extra_info)
            t0 = time.perf_counter()
            out = self._run("get" if get else "set",
                            (lambda: self._kv.deliver(blocks, request_id=rid)) if get
                            else (lambda: self._kv.deposit(blocks, router=router)), nkeys)
            self._count("get_pages" if get else "set_pages", out.count(True))
            self._sample("prefetch" if get else "backup", out.count(True),
                         out.count(True) * host.page_bytes, t0)
            return out
        except Exception:
            log.exception("%s failed", call)
            return [False] * len(keys or [])

    def _router(self, keys: List[str], nkeys: list, extra_info) -> dict:
        """What KV events announce of stored pages: each page's parent (the
        key before it: keys chain page to page; the first's is the last
        prefix key when SGLang passes them) and the page size in tokens.
        SGLang gives a backend no token ids: pages are announced by hash."""
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        parent = _hash(str(prefix[-1])) if prefix else None
        out = {}
        for k, nk in zip(keys, nkeys):
            out[nk] = kvcr.RouterBlock(parent_hash=parent, block_size=self.page_size)
            parent = _hash(k)
        return out

    def _ready_v1(self, call: str) -> bool:
        if self._kv is not None and self.v1:
            return True
        log.warning("%s: %s", call, "no host pool registered" if self._kv is None
                    else "interface_v1 is off in the extra config")
        return False

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        """How many keys from the start are held: in KVCR DRAM or G3, being
        filled, or hinted on a peer."""
        try:
            n = self._leading(POOL if self.v1 else FLAT, keys,
                              self._request(extra_info, keys) if self._kv is not None else None)
            self._count("exists_hits", n)
            return n
        except Exception:
            log.exception("batch_exists failed")
            return 0

    def _leading(self, pool: str, keys: List[str], rid: Optional[str] = None) -> int:
        """How many of keys' pages of a pool KVCR holds (or the hint of rid
        names), from the start."""
        if self._kv is None or not keys:
            return 0
        n = 0
        for status, tier in self._kv.query([self._key(k, pool) for k in keys], rid):
            if not _gettable(status, tier):
                break
            n += 1
        return n

    def exists(self, key: str) -> bool:
        """Whether KVCR holds the page (a KV page, or a flat value such as a
        draft page's `<key>.draft`)."""
        try:
            if self._leading(FLAT, [key]) == 1:
                return True
            return self.v1 and self._leading(POOL, [key]) == 1
        except Exception:
            log.exception("exists failed")
            return False

    # ---- the hybrid controller's pools ----------------------------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers=None, extra_info=None):
        """The usable prefix over the KV pool and each other pool's own hit
        policy (SGLang's PoolTransferResult): ALL_PAGES pools must hold
        every page of the prefix, TRAILING_PAGES pools the last
        len(transfer.keys) pages before its end; a pool of another policy
        holds nothing here (logged). Never raises."""
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
        try:
            keys = list(keys or [])
            self._ensure_pools()
            kv = self.batch_exists(keys, extra_info)
            hits = {POOL: kv} if kv else {}
            restorable = set(range(1, kv + 1))
            for t in pool_transfers or []:
                if not restorable:
                    break
                name = str(getattr(t.name, "value", t.name))
                policy = str(getattr(t.hit_policy, "value", t.hit_policy))
                held = self._held(name, keys[:kv])
                if policy == "all_pages":
                    boundary = next((i for i, h in enumerate(held) if not h), kv)
                    ok = set(range(1, boundary + 1))
                elif policy == "trailing_pages":
                    trailing = max(1, len(t.keys or []))
                    ok = {n for n in range(1, kv + 1)
                          if all(held[max(0, n - trailing):n])}
                    boundary = max(ok, default=0)
                else:
                    log.warning("batch_exists_v2: pool %r's hit policy %r is not one KVCR "
                                "serves", name, policy)
                    ok, boundary = set(), 0
                if boundary:
                    hits[name] = boundary
                restorable &= ok
            pages = sorted(restorable)
            return PoolTransferResult(pages[-1] if pages else 0, hits, pages)
        except Exception:
            log.exception("batch_exists_v2 failed")
            return PoolTransferResult(0, {})

    def _held(self, pool: str, keys: List[str]) -> list:
        """Whether KVCR holds each key's page of a pool."""
        if not keys or pool not in self._extra_pools or self._kv is None:
            return [False] * len(keys)
        return [_gettable(status, tier) for status, tier in
                self._kv.query([self._key(k, pool) for k in keys])]

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        """Each transfer's pages (PoolTransfer: name, keys, host_indices of
        its host pool) read into its host pool: {pool name: [bool per
        key]}. Never raises."""
        return self._transfers(True, transfers, extra_info)

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        """Each transfer's host pages stored: {pool name: [bool per key]}."""
        return self._transfers(False, transfers, extra_info)

    def _transfers(self, get: bool, transfers, extra_info) -> dict:
        out = {}
        for t in transfers or []:
            keys = list(getattr(t, "keys", None) or [])
            try:
                name = str(getattr(t.name, "value", t.name))
                out[t.name] = self._pages_op(get, name, keys, t.host_indices, extra_info)
            except Exception:  # a malformed transfer fails alone
                log.exception("batch_%s_v2 of a transfer failed", "get" if get else "set")
                out[getattr(t, "name", "?")] = [False] * len(keys)
        return out

    # ---- the legacy interface (flat data pages) -------------------------------------

    def batch_set(self, keys: List[str], values=None, target_locations=None,
                  target_sizes=None) -> bool:
        """Copies each flat data page (at most a KV page; a draft page is
        smaller) into the staging region and deposits it into KVCR's flat
        pool: with or without interface_v1 (SGLang sends draft KV here)."""
        try:
            if self._kv is None or self.one_pool or values is None or len(values) != len(keys):
                log.warning("batch_set: %s", "no host pool registered" if self._kv is None
                            else "with g3_paths and interface_v1 KVCR keeps no flat pages"
                            if self.one_pool else "values do not match keys")
                return False
            for at in range(0, len(keys), STAGE_PAGES):
                if not self._set_chunk(keys[at:at + STAGE_PAGES], values[at:at + STAGE_PAGES]):
                    return False
            return True
        except Exception:
            log.exception("batch_set failed")
            return False

    def _set_chunk(self, keys: list, values: list) -> bool:
        with self._stage_lock:  # one user of the staging region at a time
            base, nbytes = _address(self._stage), 0
            for i, v in enumerate(values):
                v = v.contiguous() if hasattr(v, "contiguous") else v
                addr, n = _buffer(v)
                if n > self.flat_bytes:
                    log.warning("batch_set: a page of %d bytes, more than %d", n,
                                self.flat_bytes)
                    return False
                ctypes.memmove(base + i * self.flat_bytes, addr, n)
                ctypes.memset(base + i * self.flat_bytes + n, 0, self.flat_bytes - n)
                nbytes += n
            nkeys = [self._key(k, FLAT) for k in keys]
            blocks = {nk: [kvcr.MemoryRef(end_point_name=self.agent, label=FLAT,
                                          element_index=i)] for i, nk in enumerate(nkeys)}
            t0 = time.perf_counter()
            ok = all(self._run("set", lambda: self._kv.deposit(blocks), nkeys))
        self._count("set_pages", len(keys) if ok else 0)
        self._sample("backup", len(keys) if ok else 0, nbytes, t0)
        return ok

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value] if value is not None else None)

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None) -> list:
        """Fills each target flat page from KVCR's flat pool (fetched into
        KVCR DRAM, copied out, released): the target, or None for a miss."""
        try:
            if self._kv is None or self.one_pool or target_locations is None:
                return [None] * len(keys)
            nkeys = [self._key(k, FLAT) for k in keys]
            t0 = time.perf_counter()
            op = self._kv.fetch(nkeys, expected_layout=[FLAT])
            entries = self._wait(op) or {}
            out, handles, nbytes = [], [], 0
            for nk, target in zip(nkeys, target_locations):
                e = entries.get(nk)
                if e is None or not e.success:
                    out.append(None)
                    continue
                handles.append(e.release_handle)
                addr, n = _buffer(target)
                src, size = e.addresses[0]
                if n > size:
                    out.append(None)
                    continue
                ctypes.memmove(addr, src, n)
                nbytes += n
                out.append(target)
            if handles:
                self._kv.release(handles)
            self._count("get_pages", sum(o is not None for o in out))
            self._sample("prefetch", sum(o is not None for o in out), nbytes, t0)
            return out
        except Exception:
            log.exception("batch_get failed")
            return [None] * len(keys)

    def get(self, key: str, target_location=None, target_sizes=None):
        return self.batch_get([key], [target_location] if target_location is not None
                              else None)[0]

    # ---- housekeeping ---------------------------------------------------------------

    def clear(self) -> None:
        """Forgets every stored page: a fresh KVCR over the same memory (the
        same control port when one was configured), G3 files emptied."""
        try:
            if self._kv is None:
                return
            with self._start_lock:
                self._close_kv()
                for p in self.g3_paths:
                    p.unlink(missing_ok=True)
                self._start()
        except Exception:
            log.exception("clear failed")

    def get_stats(self):
        """SGLang's StorageMetrics of the batches since the last call, as
        SGLang's own backends fill it (one entry per batch that moved pages:
        prefetch_pgs / backup_pgs its pages, prefetch_bandwidth /
        backup_bandwidth its GB/s; kept only with enable_storage_metrics, the
        newest METRIC_BATCHES of each), the samples then dropped. The type
        is taken from where the installed SGLang keeps it; None when none
        has it (see stats() for the backend's counters)."""
        metrics_type = _storage_metrics_type()
        if metrics_type is None:
            return None
        try:
            metrics = metrics_type()
            with self._stats_lock:
                for name, samples in self._samples.items():
                    getattr(metrics, name).extend(samples)
                    samples.clear()
            return metrics
        except Exception:
            log.exception("get_stats failed")
            return None

    def stats(self) -> dict:
        """The backend's counters: pages set and got, leading hits reported,
        hinted requests, prefix hints taken, failed calls."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, name: str, n: int) -> None:
        with self._stats_lock:
            self._stats[name] += n

    def _sample(self, kind: str, pages: int, nbytes: int, t0: float) -> None:
        """One batch's pages and bandwidth for get_stats (kind: "prefetch"
        or "backup"); a batch that moved nothing is no sample."""
        elapsed = time.perf_counter() - t0
        if not self._metrics_on or pages <= 0 or elapsed <= 0:
            return
        with self._stats_lock:
            self._samples[f"{kind}_pgs"].append(pages)
            self._samples[f"{kind}_bandwidth"].append(nbytes / GIB / elapsed)

    def _close_kv(self) -> None:
        with self._hint_lock:
            self._hints.clear()
            self._prefix.clear()
            self._by_hash.clear()
        self._stop_poller()
        kv, self._kv = self._kv, None
        if kv is not None:
            kv.close()
        arenas, self._arenas = self._arenas, []
        for _name, buf in arenas:
            buf.close()

    def close(self) -> None:
        """Closes this rank's KVCR and hint listener and gives back their
        memory (idempotent)."""
        try:
            server, self._hint_server = self._hint_server, None
            if server is not None:
                server.shutdown()
                server.server_close()
            self._close_kv()
            with self._stage_lock:
                stage, self._stage = self._stage, None
            if stage is not None:
                stage.close()
        except Exception:
            log.exception("close failed")


def _storage_metrics_type():
    """SGLang's StorageMetrics class from whichever module the installed
    SGLang keeps it in, or None."""
    import importlib
    for name in METRICS_MODULES:
        try:
            return getattr(importlib.import_module(name), "StorageMetrics")
        except Exception:  # not in this SGLang (or it fails to import): the next one
            continue
    return None
