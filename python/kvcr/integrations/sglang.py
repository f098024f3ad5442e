"""KVCR as an SGLang HiCache storage backend.

SGLang loads it through its `dynamic` storage backend:

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
        "backend_name": "kvcr", "module_path": "kvcr.integrations.sglang",
        "class_name": "KVCRHiCacheStorage", "interface_v1": 1,
        "dram_bytes": 34359738368, "control_port": 18000}'

and constructs it as `KVCRHiCacheStorage(storage_config, kwargs)`, then
calls `register_mem_pool_host(host_pool)`, where the KVCR instance of this
TP rank is created:

* With `interface_v1` (zero copy) the host pool's pages are registered as
  framework regions of one pool "kv" whose block is one page: MHA
  page_first and page_first_direct as two parts (K, V), MHA layer_first as
  2 x layers parts (K and V of each layer), MLA layer_first as one part per
  layer, MLA page_first(_direct) as one whole region. `batch_set_v1`
  deposits pages into KVCR DRAM, `batch_get_v1` delivers them back (from
  KVCR DRAM, G3, or the peer a router hint names), each part where it
  belongs. Without it the legacy calls copy flat data pages through a
  staging region of STAGE_PAGES pages.
* Keys get this rank's namespace (`<key>@<layout>:tp<r>of<n>:pp<r>of<n>`;
  MLA pages, the same on every rank, without the TP rank). A page's router
  hash is the first 16 hex digits of its key as an unsigned 64-bit integer
  (SGLang's own events send it signed: hints may too).
* A router hint rides in `extra_info.extra_info["kv_hint"]` (the kv_hint
  envelope, as a dict or JSON text), with an optional
  `extra_info.extra_info["request_id"]`: hinted pages count as hits in
  `batch_exists` and `batch_get_v1` pulls them from the named peer. The
  last HINTS_KEPT requests' hints are kept.
* MLA: SGLang stores pages from TP rank 0 only. With a `control_port`
  base, the other ranks read them from rank 0's KVCR on the same host
  (advertise_host:base) when no router hint names a source: they count
  every page as a hit (SGLang takes the least count of its ranks, and rank
  0 counts only what it holds) and pull them from rank 0. Without a base
  port they see no pages, and SGLang none from storage.
* Data-path calls never raise (SGLang's controller threads die on an
  exception): a failure returns False / 0 / None and is logged.

Configuration (`storage_config.extra_config`, all optional):
  dram_bytes          KVCR DRAM of this rank (default 1 GiB; whole pages)
  g3_paths            G3 slot files (a list, or one comma-separated string);
                      the rank's files are "<path>.tp<r>"
  g3_bytes_per_file   data capacity of each G3 file (default 4 x dram_bytes)
  control_host        address the peer tier binds (default 127.0.0.1)
  control_port        base port: this rank binds base + tp_rank (0: any free)
  advertise_host      address peers are told (default control_host)
  kv_events_endpoint  ZeroMQ endpoint of KV events (TP rank 0 publishes; a page
                      is announced by its hash, its parent's and the page size:
                      SGLang gives a backend no token ids)
  kv_events_topic     their topic (default "kv@<host name>@<model name>")
  operation_timeout_ms  libkvcr's operation deadline (default 5000)
`control_endpoint` says where peers (and a router's hints) reach this rank.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import mmap
import os
import select
import socket
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

log = logging.getLogger("kvcr.sglang")

POOL = "kv"
STAGE_PAGES = 128    # the controller's largest batch
HINTS_KEPT = 1024    # requests whose router hint is kept
RANK0_REQUEST = "sglang-mla-tp0"  # an MLA rank's reads from its rank 0
DEFAULT_DRAM = 1 << 30
METRIC_BATCHES = 4096  # per-batch samples of each kind kept between two get_stats calls
GIB = float(1 << 30)   # SGLang's storage bandwidths are in GB/s of 2^30 bytes
U64 = 1 << 64


class _PageKeys:
    """Key adapter: a namespaced page key's router hash is the first 16 hex
    digits of SGLang's key."""

    def encode(self, framework_key: Any) -> bytes:
        return bytes(framework_key)

    def decode(self, key: bytes) -> Optional[int]:
        try:
            return int(bytes(key[:16]), 16)
        except ValueError:
            return None


def _page_layout(pool, mla: bool) -> tuple:
    """(page bytes, [(label, offset in kv_buffer, piece bytes)], pages):
    one page's pieces in get_page_buffer_meta's order."""
    ps, size, L = pool.page_size, pool.size, pool.layer_num
    itemsize = pool.dtype.itemsize
    tok = (pool.kv_cache_dim if mla else pool.head_num * pool.head_dim) * itemsize
    layout = pool.layout
    if layout not in ("layer_first", "page_first", "page_first_direct"):
        raise ValueError(f"host pool layout {layout!r} is not one KVCR registers")
    if size % ps:
        raise ValueError(f"host pool size {size} is not a whole number of pages of {ps}")
    if layout == "layer_first":
        piece = ps * tok
        if mla:
            parts = [(f"{POOL}:l{l}", l * size * tok) for l in range(L)]
        else:
            v_off = L * size * tok
            parts = []
            for l in range(L):
                parts += [(f"{POOL}:k{l}", l * size * tok), (f"{POOL}:v{l}", v_off + l * size * tok)]
    else:  # one piece per K / V (MHA) or per page (MLA) holding every layer
        piece = L * ps * tok
        parts = [(POOL, 0)] if mla else [(f"{POOL}:k", 0), (f"{POOL}:v", L * size * tok)]
    return piece * len(parts), [(label, off, piece) for label, off in parts], size // ps


def _buffer(t) -> tuple:
    """(address, bytes) of a contiguous tensor."""
    return t.data_ptr(), t.numel() * t.element_size()


def _address(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


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
        self.g3_bytes = int(extra.get("g3_bytes_per_file", 4 * self.dram_bytes))
        self.control_host = str(extra.get("control_host", "127.0.0.1"))
        self.control_base = base = int(extra.get("control_port", 0))
        self.control_port = base + self.tp_rank if base else 0
        self.advertise_host = str(extra.get("advertise_host", self.control_host))
        self.kv_events_endpoint = extra.get("kv_events_endpoint")
        self.op_ms = int(extra.get("operation_timeout_ms", 5000))
        if self.dram_bytes <= 0 or not 0 <= self.control_port <= 65535 or self.op_ms <= 0:
            raise ValueError("KVCR HiCache backend: dram_bytes and operation_timeout_ms must be "
                             "positive and control_port + tp_rank a port number")
        self.control_endpoint: Optional[str] = None
        self.mem_pool_host = None
        self._kv = None
        self._events = False                # this rank publishes KV events
        self._stage = None                  # legacy interface: the staging region
        self._dram = None                   # KVCR DRAM
        self._cond = threading.Condition()  # the completion table and the poller's stop
        self._done: dict = {}
        self._abandoned: dict = {}          # operations nobody waits for any more
        self._poller: Optional[threading.Thread] = None
        self._stop = False
        self._stage_lock = threading.Lock()  # the legacy staging region
        self._stats_lock = threading.Lock()
        self._hints: OrderedDict = OrderedDict()
        self._hint_lock = threading.Lock()
        self._stats = {"set_pages": 0, "get_pages": 0, "exists_hits": 0, "hinted_requests": 0,
                       "failures": 0}
        # SGLang's storage metrics (get_stats): pages and GB/s of each batch,
        # kept only when SGLang asks for them, the newest METRIC_BATCHES.
        self._metrics_on = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._samples = {k: deque(maxlen=METRIC_BATCHES) for k in
                         ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
        self.agent = f"sglang-{os.getpid()}-tp{self.tp_rank}-pp{self.pp_rank}"

    # ---- set-up ------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Creates this rank's KVCR over the host pool (see the module
        docstring). Raises on a configuration KVCR refuses: SGLang then
        closes the backend and reports the attach failure."""
        super().register_mem_pool_host(mem_pool_host)
        self.page_size = mem_pool_host.page_size
        self.page_bytes, parts, pages = _page_layout(mem_pool_host, self.is_mla)
        layout = mem_pool_host.layout if self.v1 else "flat"
        if self.v1:
            base = mem_pool_host.kv_buffer.data_ptr()
            regions = [kvcr.RegionDescriptor(addr=base + off, size=piece, stride=piece,
                                             count=pages, label=label)
                       for label, off, piece in parts]
            self.label = f"{POOL}:*" if len(parts) > 1 else POOL
        else:
            self._stage = mmap.mmap(-1, STAGE_PAGES * self.page_bytes)
            regions = [kvcr.RegionDescriptor(addr=_address(self._stage), size=self.page_bytes,
                                             count=STAGE_PAGES, label=POOL)]
            self.label = POOL
        rank = "" if self.is_mla else f":tp{self.tp_rank}of{self.tp_size}"
        self.namespace = f"@{layout}{rank}:pp{self.pp_rank}of{self.pp_size}"
        self._start(regions)

    def _start(self, regions: list) -> None:
        slots = self.dram_bytes // self.page_bytes
        if slots < 1:
            raise ValueError(f"dram_bytes {self.dram_bytes} holds no page of {self.page_bytes}")
        self._dram = dram = mmap.mmap(-1, slots * self.page_bytes)
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
            kvcr.KVCRConfig(nixl_agent_name=self.agent, pool_layouts=[(POOL, self.page_bytes)],
                            operation_timeout_ms=self.op_ms,
                            abandon_timeout_ms=2 * self.op_ms, kv_events=events),
            kvcr.KVCRBindings(None, None, None, framework_control=control,
                              key_adapter=_PageKeys()),
            kvcr.KVCRBackendConfigs(framework_regions=regions,
                                    local_dram=kvcr.LocalDramOptions(
                                        pools=[(POOL, _address(dram), len(dram))]),
                                    g3=g3))
        self._regions = regions
        self.control_endpoint = self._kv.control_endpoint
        self._start_poller()
        log.info("KVCR HiCache backend of TP rank %d: %d KVCR DRAM pages of %d bytes, %d "
                 "region(s), peers at %s", self.tp_rank, slots, self.page_bytes,
                 len(self._regions), self.control_endpoint)

    # ---- waiting for KVCR ----------------------------------------------------------

    def _start_poller(self) -> None:
        """One thread polls KVCR for the instance's life: it collects every
        completion for the call waiting on it, and releases what source
        writes to peers held, also while SGLang makes no call."""
        self._stop = False
        self._poller = threading.Thread(target=self._poll_loop, name="kvcr-sglang-poll",
                                        daemon=True)
        self._poller.start()

    def _poll_loop(self) -> None:
        kv, fd = self._kv, self._kv.fileno()
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

    def _key(self, key: str) -> bytes:
        return f"{key}{self.namespace}".encode()

    def _request(self, extra_info, keys: List[str]) -> Optional[str]:
        """The request whose router hint covers this call, submitted to KVCR
        the first time it is seen; without one, an MLA rank other than 0
        hints its own rank 0 (below); else None."""
        info = getattr(extra_info, "extra_info", None) if extra_info is not None else None
        if not isinstance(info, dict) or info.get("kv_hint") is None:
            return self._rank0_request(keys)
        hint = info["kv_hint"]
        if isinstance(hint, (str, bytes)):
            hint = json.loads(hint)
        hint = _unsigned_hashes(hint)
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

    def _rank0_request(self, keys: List[str]) -> Optional[str]:
        """MLA pages are the same on every TP rank and SGLang stores them from
        rank 0 alone: another rank reads them from rank 0's KVCR on this
        host (control port base + 0), as if a router had hinted them."""
        if not (self.is_mla and self.tp_rank > 0 and self.control_base):
            return None
        hashes = [h for h in map(_PageKeys().decode, (k.encode() for k in keys)) if h is not None]
        if not hashes:
            return None
        source = f"tcp://{self.advertise_host}:{self.control_base}"
        self._kv.submit_hint({"protocol_version": "0.1", "actions": [
            {"action_type": "kv.fetch", "action_version": "1.0",
             "payload": {"source_control_endpoint": source, "block_hashes": hashes}}]},
            request_id=RANK0_REQUEST)
        return RANK0_REQUEST

    def _pages(self, host_indices, n: int) -> Optional[list]:
        """The host pool page of each of n keys, or None when the indices
        are not n whole pages."""
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        ps = self.page_size
        if len(idx) < n * ps:
            return None
        pages = [int(idx[i * ps]) for i in range(n)]
        return pages if all(t % ps == 0 for t in pages) else None

    def _refs(self, page: int) -> list:
        return [kvcr.MemoryRef(end_point_name=self.agent, label=self.label, element_index=page)]

    # ---- the zero-copy interface ---------------------------------------------------

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Deposits each key's host page into KVCR DRAM (idempotent)."""
        return self._pages_op("batch_set_v1", keys, host_indices, extra_info)

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        """Delivers each key's page into its host page: from KVCR DRAM, G3,
        or the peer the request's router hint names."""
        return self._pages_op("batch_get_v1", keys, host_indices, extra_info)

    def _pages_op(self, call: str, keys: List[str], host_indices, extra_info) -> List[bool]:
        """A zero-copy set (deposit, with what KV events say of the pages)
        or get (deliver, under the request's hint) of keys' host pages: one
        bool per key, never an exception (SGLang's backup and prefetch
        threads would die of one)."""
        get = call == "batch_get_v1"
        try:
            if not self._ready_v1(call):
                return [False] * len(keys)
            pages = self._pages(host_indices, len(keys))
            if pages is None:
                log.warning("%s: host indices are not %d whole pages", call, len(keys))
                return [False] * len(keys)
            rid = self._request(extra_info, keys) if get else None
            nkeys = [self._key(k) for k in keys]
            blocks = {nk: self._refs(p // self.page_size) for nk, p in zip(nkeys, pages)}
            router = None if get or not self._events else self._router(keys, nkeys, extra_info)
            t0 = time.perf_counter()
            out = self._run("get" if get else "set",
                            (lambda: self._kv.deliver(blocks, request_id=rid)) if get
                            else (lambda: self._kv.deposit(blocks, router=router)), nkeys)
            self._count("get_pages" if get else "set_pages", out.count(True))
            self._sample("prefetch" if get else "backup", out.count(True), t0)
            return out
        except Exception:
            log.exception("%s failed", call)
            return [False] * len(keys)

    def _router(self, keys: List[str], nkeys: list, extra_info) -> dict:
        """What KV events announce of stored pages: each page's parent (the
        key before it: keys chain page to page; the first's is the last
        prefix key when SGLang passes them) and the page size in tokens.
        SGLang gives a backend no token ids: pages are announced by hash."""
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        parent = _PageKeys().decode(str(prefix[-1]).encode()) if prefix else None
        out = {}
        for k, nk in zip(keys, nkeys):
            out[nk] = kvcr.RouterBlock(parent_hash=parent, block_size=self.page_size)
            parent = _PageKeys().decode(k.encode())
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
            if self._kv is None:
                return 0
            rid = self._request(extra_info, keys)
            n = 0
            for status, _tier in self._kv.query([self._key(k) for k in keys], rid):
                if status is kvcr.QueryStatus.MISS:
                    break
                n += 1
            self._count("exists_hits", n)
            return n
        except Exception:
            log.exception("batch_exists failed")
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- the legacy interface (flat data pages) -------------------------------------

    def batch_set(self, keys: List[str], values=None, target_locations=None,
                  target_sizes=None) -> bool:
        """Copies each flat data page into the staging region and deposits
        it (legacy interface only: with interface_v1 the pool's pages are
        registered instead, and this is refused)."""
        try:
            if self._kv is None or self.v1 or values is None or len(values) != len(keys):
                log.warning("batch_set: %s", "interface_v1 is on: use batch_set_v1" if self.v1
                            else "no host pool registered or values do not match keys")
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
            base = _address(self._stage)
            for i, v in enumerate(values):
                addr, n = _buffer(v)
                if n != self.page_bytes:
                    log.warning("batch_set: a page of %d bytes, not %d", n, self.page_bytes)
                    return False
                ctypes.memmove(base + i * self.page_bytes, addr, n)
            nkeys = [self._key(k) for k in keys]
            blocks = {nk: self._refs(i) for i, nk in enumerate(nkeys)}
            t0 = time.perf_counter()
            ok = all(self._run("set", lambda: self._kv.deposit(blocks), nkeys))
        self._count("set_pages", len(keys) if ok else 0)
        self._sample("backup", len(keys) if ok else 0, t0)
        return ok

    def set(self, key: str, value=None, target_location=None, target_sizes=None) -> bool:
        return self.batch_set([key], [value] if value is not None else None)

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None) -> list:
        """Fills each target flat page from KVCR (fetched into KVCR DRAM,
        copied out, released): the target, or None for a miss."""
        try:
            if self._kv is None or target_locations is None:
                return [None] * len(keys)
            nkeys = [self._key(k) for k in keys]
            t0 = time.perf_counter()
            op = self._kv.fetch(nkeys, expected_layout=[POOL])
            entries = self._wait(op) or {}
            out, handles = [], []
            for nk, target in zip(nkeys, target_locations):
                e = entries.get(nk)
                if e is None or not e.success:
                    out.append(None)
                    continue
                handles.append(e.release_handle)
                addr, n = _buffer(target)
                src, size = e.addresses[0]
                if n != size:
                    out.append(None)
                    continue
                ctypes.memmove(addr, src, n)
                out.append(target)
            if handles:
                self._kv.release(handles)
            self._count("get_pages", sum(o is not None for o in out))
            self._sample("prefetch", sum(o is not None for o in out), t0)
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
            self._close_kv()
            for p in self.g3_paths:
                p.unlink(missing_ok=True)
            self._start(self._regions)
        except Exception:
            log.exception("clear failed")

    def get_stats(self):
        """SGLang's StorageMetrics of the batches since the last call, as
        SGLang's own backends fill it (one entry per batch that moved pages:
        prefetch_pgs / backup_pgs its pages, prefetch_bandwidth /
        backup_bandwidth its GB/s; kept only with enable_storage_metrics, the
        newest METRIC_BATCHES of each), the samples then dropped. None when
        SGLang's metrics type cannot be imported (see stats() for the
        backend's counters)."""
        try:
            from sglang.srt.metrics.collector import StorageMetrics
        except Exception:  # an SGLang without it, or one that fails to import
            return None
        try:
            metrics = StorageMetrics()
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
        hinted requests, failed calls."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, name: str, n: int) -> None:
        with self._stats_lock:
            self._stats[name] += n

    def _sample(self, kind: str, pages: int, t0: float) -> None:
        """One batch's pages and bandwidth for get_stats (kind: "prefetch"
        or "backup"); a batch that moved nothing is no sample."""
        elapsed = time.perf_counter() - t0
        if not self._metrics_on or pages <= 0 or elapsed <= 0:
            return
        with self._stats_lock:
            self._samples[f"{kind}_pgs"].append(pages)
            self._samples[f"{kind}_bandwidth"].append(pages * self.page_bytes / GIB / elapsed)

    def _close_kv(self) -> None:
        with self._hint_lock:
            self._hints.clear()
        self._stop_poller()
        kv, self._kv = self._kv, None
        if kv is not None:
            kv.close()
        dram, self._dram = self._dram, None
        if dram is not None:
            dram.close()

    def close(self) -> None:
        """Closes this rank's KVCR and gives back its memory (idempotent)."""
        try:
            self._close_kv()
            with self._stage_lock:
                stage, self._stage = self._stage, None
            if stage is not None:
                stage.close()
        except Exception:
            log.exception("close failed")


def _unsigned_hashes(hint: Any) -> Any:
    """The kv_hint envelope with SGLang's signed block hashes as unsigned
    64-bit integers (the router hash KVCR keeps)."""
    if not isinstance(hint, dict):
        return hint
    out = dict(hint)
    actions = []
    for action in out.get("actions") or []:
        if isinstance(action, dict) and isinstance(action.get("payload"), dict):
            payload = dict(action["payload"])
            hashes = payload.get("block_hashes")
            if isinstance(hashes, list):
                payload["block_hashes"] = [h % U64 if isinstance(h, int) and not
                                           isinstance(h, bool) else h for h in hashes]
            action = dict(action, payload=payload)
        actions.append(action)
    if "actions" in out:
        out["actions"] = actions
    return out
