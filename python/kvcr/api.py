"""KVCR: the framework-facing object, a thin layer over kvcr._native."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import _native
from .config import KVCRBackendConfigs, KVCRConfig, KVCRGuardConfig, check_region
from .hints import HintState, parse_router_hint
from .policy import KVCachePolicy, native_builtin
from .types import (BlockKey, BlockMeta, CacheTier, InventoryEvent, MemoryRef, OpEntryResult,
                    OpEntryStatus, PlacementAction, QueryStatus, ReleaseHandle)

logger = logging.getLogger("kvcr")

DURATION_METRIC = "kvcr_duration_seconds"
TRANSFER_BYTES_METRIC = "kvcr_transfer_bytes"
TRANSFER_BLOCKS_METRIC = "kvcr_transfer_blocks"
STATE_METRIC = "kvcr_state"

# The C enums, by value.
_TIERS = (None, CacheTier.FW_G1, CacheTier.FW_G2, CacheTier.LOCAL_G2, CacheTier.REMOTE_G2,
          CacheTier.G3)
_TIER_INT = {t: i for i, t in enumerate(_TIERS) if t is not None}
_QUERY = (QueryStatus.MISS, QueryStatus.HIT, QueryStatus.FETCHING, QueryStatus.FETCHABLE)
_ENTRY = (OpEntryStatus.SUCCESS, OpEntryStatus.DROPPED, OpEntryStatus.FAILED)
_ACTION_INT = {PlacementAction.KEEP: 0, PlacementAction.DROP: 1, PlacementAction.COPY_TO: 2,
               PlacementAction.MOVE_TO: 3}
_LOG_LEVELS = (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)
_NO_EVICT = 0x1


@dataclass(frozen=True)
class KVCRBindings:
    request_pin: Callable
    poll_pin_results: Callable
    release_pin: Callable
    cancel_pin_request: Optional[Callable] = None
    framework_control: Any = None
    key_adapter: Any = None
    inventory_sink: Optional[Callable] = None
    capacity_needed_callback: Optional[Callable] = None
    stats_factory: Optional[Callable] = None
    policy: Optional[KVCachePolicy] = None
    on_resilience_event: Optional[Callable] = None
    resize_g2_memory: Optional[Callable] = None


def _meta(t: tuple) -> BlockMeta:
    key, size, count, last, tiers, position = t
    resident = frozenset(tier for i, tier in enumerate(_TIERS) if tier and tiers & (1 << i))
    return BlockMeta(BlockKey(key), size, count, last, resident, position)


def _decision(d) -> Optional[tuple]:
    action, tier = d
    return (_ACTION_INT[action], _TIER_INT.get(tier, 0))


class _PolicyAdapter:
    """What libkvcr's policy vtable calls: tuples in, ints out. A hook that
    raises or returns nonsense is logged here and reported as failed (None),
    which libkvcr sanitises as the reference does."""

    def __init__(self, policy: KVCachePolicy) -> None:
        self.policy = policy
        self._name = type(policy).__name__
        self._required_tiers_mask = sum(1 << _TIER_INT[t] for t in policy.required_tiers)

    def _guard(self, hook: str, fn: Callable, convert: Callable):
        try:
            return convert(fn())
        except Exception:
            logger.warning("policy %s.%s raised", self._name, hook, exc_info=True)
            return None

    def _decide_ingest(self, meta, source, required):
        return self._guard("decide_ingest", lambda: self.policy.decide_ingest(
            _meta(meta), _TIERS[source], required), _decision)

    def _eviction_score(self, meta, source):
        def check(score):
            if type(score) not in (int, float) or not math.isfinite(score):
                raise TypeError(f"eviction_score returned {score!r}")
            return float(score)
        return self._guard("eviction_score",
                           lambda: self.policy.eviction_score(_meta(meta), _TIERS[source]), check)

    def _decide_eviction(self, meta, source):
        return self._guard("decide_eviction", lambda: self.policy.decide_eviction(
            _meta(meta), _TIERS[source]), _decision)

    def _on_ingest(self, meta, source):
        self._guard("on_ingest", lambda: self.policy.on_ingest(_meta(meta), _TIERS[source]),
                    lambda r: None)

    def _on_remove(self, meta):
        self._guard("on_remove", lambda: self.policy.on_remove(_meta(meta)), lambda r: None)


def _log_from_native(level: int, message: str) -> None:
    logger.log(_LOG_LEVELS[level] if 0 <= level < 4 else logging.INFO, "%s", message)


class KVCR:
    """KV Cache Runner.

    Built today: KVCR-owned DRAM (LOCAL_G2), deposit / deliver / fetch /
    release / abort / poll, policies, inventory, capacity and telemetry. Not
    built yet: the peer-to-peer tier (hints are validated and stored but never
    make a key FETCHABLE), G3, and the service Guard (both refused at
    construction)."""

    def __init__(self, config: KVCRConfig, bindings: KVCRBindings,
                 backend_configs: KVCRBackendConfigs, guard_config: Optional[KVCRGuardConfig] = None):
        self._config = config
        self._bindings = bindings
        self._backends = backend_configs
        self._hints: dict = {}
        self._closed = False
        self._stats = None
        local = backend_configs.local_dram
        if guard_config is not None:
            if local is not None:
                raise ValueError("guard_config conflicts with backend_configs.local_dram")
            raise NotImplementedError("the KVCR service and Guard are not built yet")
        if backend_configs.g3 is not None:
            raise NotImplementedError("the G3 tier is not built yet")
        if backend_configs.framework_dram is not None:
            raise NotImplementedError(
                "framework_dram (a raw address range) is not supported; register "
                "framework_regions of RegionDescriptor instead")
        if config.nixl_listen_port is not None and (
                type(config.nixl_listen_port) is not int or not 1 <= config.nixl_listen_port <= 65535):
            raise ValueError("nixl_listen_port must be between 1 and 65535")
        self._check_types(config)
        regions = [check_region(r) for r in backend_configs.framework_regions]
        if bindings.framework_control is not None:
            if local is None:
                raise NotImplementedError(
                    "KVCR without local DRAM needs the peer-to-peer tier (REMOTE_G2), which is "
                    "not built yet")
            logger.warning("the peer-to-peer tier (REMOTE_G2) is not built yet: framework_control "
                           "is kept but no peer is contacted")
        policy = bindings.policy
        builtin = native_builtin(policy)
        self._policy_adapter = None if policy is None or builtin else _PolicyAdapter(policy)
        self._stats = (bindings.stats_factory()
                       if config.enable_telemetry and bindings.stats_factory else None)
        self._pool_names = [name for name, _ in config.pool_layouts]
        self._native = _native.Instance(
            agent_name=config.nixl_agent_name,
            pool_layouts=[(n, s) for n, s in config.pool_layouts],
            local_dram=list(local.pools) if local is not None else None,
            local_backend=local.backend if local is not None else "UCX",
            regions=[(r.addr, r.size, r.count, r.stride, r.label,
                      0 if r.mem_type == "DRAM" else 1, r.device_Id) for r in regions],
            operation_timeout_ms=config.operation_timeout_ms,
            abandon_timeout_ms=config.abandon_timeout_ms,
            watermark_percent=float(config.capacity_low_watermark_percent),
            telemetry=self._stats is not None,
            copy_threads=config.copy_threads,
            policy=builtin or self._policy_adapter,
            inventory=self._on_inventory if bindings.inventory_sink else None,
            capacity=self._on_capacity if bindings.capacity_needed_callback else None,
            log=_log_from_native,
        )
        # The memory behind these must outlive every copy: keep the owners.
        self._owners = [local, regions]

    @staticmethod
    def _check_types(config: KVCRConfig) -> None:
        if not isinstance(config.nixl_agent_name, str) or not config.nixl_agent_name:
            raise ValueError("nixl_agent_name must be a non-empty string")
        layouts = config.pool_layouts
        if not isinstance(layouts, (list, tuple)) or not layouts:
            raise ValueError("pool_layouts must contain at least one pool")
        for entry in layouts:
            if not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str):
                raise ValueError("pool_layouts pool name must be a string")
            if type(entry[1]) is not int or entry[1] <= 0:
                raise ValueError("pool_layouts block size must be a positive integer")
        for name in ("operation_timeout_ms", "abandon_timeout_ms", "copy_threads"):
            if type(getattr(config, name)) is not int or getattr(config, name) < 0:
                raise ValueError(f"{name} must be a positive integer")
        if type(config.capacity_low_watermark_percent) not in (int, float):
            raise ValueError("capacity_low_watermark_percent must be between 0 and 100")

    # ---- callbacks (run inside poll_completed, on the polling thread) ----

    def _on_inventory(self, keys, tier, removed) -> bool:
        try:
            self._bindings.inventory_sink(
                InventoryEvent(tuple(BlockKey(k) for k in keys), _TIERS[tier], removed))
            return True
        except Exception:
            logger.warning("KVCR inventory sink raised; the event is lost", exc_info=True)
            return False

    def _on_capacity(self, needs) -> bool:
        try:
            self._bindings.capacity_needed_callback(list(needs))
            return True
        except Exception:
            logger.warning("KVCR capacity_needed_callback raised", exc_info=True)
            return False

    # ---- the API ----------------------------------------------------------

    @property
    def config(self) -> KVCRConfig:
        return self._config

    def query(self, keys, request_id: Optional[str] = None) -> list:
        raw = self._native.query(tuple(keys), request_id)
        return [(_QUERY[s], _TIERS[t]) for s, t in raw]

    @staticmethod
    def _blocks(blocks: Mapping) -> tuple:
        out = []
        for key, refs in blocks.items():
            if not isinstance(refs, list):
                raise TypeError("block descriptors must be a list")
            if not refs or not all(isinstance(r, MemoryRef) for r in refs):
                raise ValueError("each block requires at least one descriptor")
            out.append((bytes(key), tuple((r.end_point_name, r.label, r.element_index)
                                          for r in refs)))
        return tuple(out)

    def deposit(self, blocks: Mapping, no_evict: bool = False, hints=None) -> int:
        return self._native.deposit(self._blocks(blocks), _NO_EVICT if no_evict else 0)

    def deliver(self, blocks: Mapping, request_id: Optional[str] = None) -> int:
        return self._native.deliver(self._blocks(blocks), request_id)

    def fetch(self, keys, request_id: Optional[str] = None, expected_layout=None, hints=None) -> int:
        layout = None if expected_layout is None else tuple(expected_layout)
        return self._native.fetch(tuple(bytes(k) for k in keys), request_id, layout)

    def release(self, handles: Iterable) -> list:
        handles = list(handles)
        return list(zip(handles, self._native.release(handles)))

    def abort(self, op_handle: int, keys=None) -> bool:
        keys = None if keys is None else tuple(bytes(k) for k in keys)
        return self._native.abort(op_handle, keys) > 0

    def poll_completed(self) -> list:
        agent = self._config.nixl_agent_name
        names = self._pool_names
        results = []
        for op, entries in self._native.poll():
            mapped = {}
            for key, status, reason, rh, slots in entries:
                descriptors = [MemoryRef(end_point_name=agent, label=names[pool],
                                         element_index=slot)
                               for pool, slot, _addr, _size in slots] or None
                mapped[BlockKey(key)] = OpEntryResult(
                    _ENTRY[status], descriptors, ReleaseHandle(rh) if rh else None,
                    None if reason == "NONE" else reason)
            results.append((op, mapped))
        return results

    def submit_hint(self, hints: Mapping, request_id: Optional[str] = None) -> None:
        """Validates and stores the router's hint. The peer-to-peer tier is
        not built yet, so a stored hint does not make keys FETCHABLE."""
        parsed = parse_router_hint(hints)
        if request_id is None:
            return
        state = self._hints.get(request_id)
        if state is None:
            self._hints[request_id] = HintState(parsed.source, parsed.block_hashes, time.monotonic())
        elif state.source == parsed.source:
            state.block_hashes = parsed.block_hashes
        else:
            state.failed = True

    def discard_hint(self, request_id: str) -> None:
        self._hints.pop(request_id, None)

    def get_stats(self):
        if self._stats is None:
            return None
        snapshot = self._native.stats()
        stats = self._stats
        for resource, value in snapshot["gauges"]:
            _call(stats, "set_gauge", STATE_METRIC, value, (resource,))
        for name, operation, value in snapshot["counters"]:
            _call(stats, "increase_counter", name, value, (operation,))
        for scope, result, seconds in snapshot["observations"]:
            _call(stats, "observe_histogram", DURATION_METRIC, seconds, (scope, result))
        self._stats = self._bindings.stats_factory()
        return stats

    def prometheus_text(self) -> Optional[str]:
        """The current interval in the Prometheus text format (consumes it)."""
        snapshot = self._native.stats()
        return None if snapshot is None else snapshot["prometheus"]

    def close(self) -> None:
        if self._closed:
            return
        self._native.close()
        self._closed = True


def _call(stats, method: str, *args) -> None:
    fn = getattr(stats, method, None)
    if fn is not None:
        fn(*args)
