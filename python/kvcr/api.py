"""KVCR: the framework-facing object, a thin layer over kvcr._native (libkvcr)."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from . import _native
from .config import (KVCRBackendConfigs, KVCRConfig, KVCRGuardConfig, check_config, check_g3,
                     check_local_dram, check_policy_tiers, check_regions, check_remote)
from .hints import encode_router_hint
from .policy import KVCachePolicy, native_builtin
from .types import (BlockKey, BlockMeta, CacheTier, InventoryEvent, KVCRStartupError, MemoryRef,
                    OpEntryResult, OpEntryStatus, OpHandle, PlacementAction, PlacementFailure,
                    QueryStatus, ReleaseHandle)

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
_ACTIONS = (PlacementAction.KEEP, PlacementAction.DROP, PlacementAction.COPY_TO,
            PlacementAction.MOVE_TO)
_ACTION_INT = {a: i for i, a in enumerate(_ACTIONS)}
_LOG_LEVELS = (logging.ERROR, logging.WARNING, logging.INFO, logging.DEBUG)
_MEM_TYPES = {"DRAM": 0, "VRAM": 1}

_native.init(_QUERY, _TIERS, MemoryRef)

# Instances whose start-up failed and could not be stopped (KVCRStartupError).
_RETAINED_INSTANCES: list = []


@dataclass(frozen=True)
class KVCRBindings:
    """Framework callbacks, in the reference's order (fields may be given
    positionally).

    Used by this build: key_adapter (kept for hint matching), inventory_sink,
    capacity_needed_callback, stats_factory, policy. The pin callbacks,
    framework_control, on_resilience_event and resize_g2_memory are accepted
    and kept for the peer-to-peer tier, which is not built yet; nothing calls
    them today."""

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


# ---- callbacks handed to libkvcr (they never reference the KVCR object) ---

def _log_from_native(level: int, message: str) -> None:
    logger.log(_LOG_LEVELS[level] if 0 <= level < 4 else logging.INFO, "%s", message)


def _inventory_callback(sink: Callable) -> Callable:
    def deliver(keys: tuple, tier: CacheTier, removed: bool) -> bool:
        try:
            sink(InventoryEvent(keys, tier, removed))
            return True
        except Exception:
            logger.warning("KVCR inventory sink raised; the event is lost", exc_info=True)
            return False
    return deliver


def _capacity_callback(callback: Callable) -> Callable:
    def deliver(needs: list) -> bool:
        try:
            callback(needs)
            return True
        except Exception:
            logger.warning("KVCR capacity_needed_callback raised", exc_info=True)
            return False
    return deliver


def _entry_factory(agent: str, pool_names: list) -> Callable:
    def make(status: int, reason: Optional[str], release_handle: int, slots) -> OpEntryResult:
        descriptors = addresses = None
        if slots:
            descriptors = [MemoryRef(end_point_name=agent, label=pool_names[pool],
                                     element_index=slot) for pool, slot, _, _ in slots]
            addresses = [(addr, size) for _, _, addr, size in slots]
        return OpEntryResult(_ENTRY[status], descriptors,
                             ReleaseHandle(release_handle) if release_handle else None,
                             reason, addresses)
    return make


def _meta(t: tuple) -> BlockMeta:
    key, size, count, last, tiers, position = t
    resident = frozenset(tier for i, tier in enumerate(_TIERS) if tier and tiers & (1 << i))
    return BlockMeta(BlockKey(key), size, count, last, resident, position)


class _PolicyAdapter:
    """What libkvcr's policy vtable calls (through kvcr._native): tuples in,
    ints out. A hook that raises or returns something invalid is logged here
    and reported as failed (None); libkvcr then logs its fallback and applies
    the reference's rule."""

    def __init__(self, policy: KVCachePolicy) -> None:
        self.policy = policy
        self._name = type(policy).__name__
        self._required_tiers_mask = sum(1 << _TIER_INT[t] for t in policy.required_tiers)
        cls = type(policy)
        own = getattr(policy, "__dict__", {})

        def overridden(hook: str) -> bool:
            return hook in own or getattr(cls, hook) is not getattr(KVCachePolicy, hook)
        self._wants_on_ingest = overridden("on_ingest")
        self._wants_on_remove = overridden("on_remove")
        self._wants_recovery = overridden("decide_recovery")

    def _fail(self, hook: str, detail: Optional[str] = None) -> None:
        if detail is None:
            logger.warning("policy %s.%s raised", self._name, hook, exc_info=True)
        else:
            logger.warning("policy %s.%s returned %s", self._name, hook, detail)
        return None

    def _decision(self, hook: str, decision) -> Optional[tuple]:
        if (isinstance(decision, tuple) and len(decision) == 2
                and isinstance(decision[0], PlacementAction)
                and (decision[1] is None or isinstance(decision[1], CacheTier))):
            return (_ACTION_INT[decision[0]], _TIER_INT.get(decision[1], 0))
        return self._fail(hook, f"{decision!r}, not a (PlacementAction, CacheTier | None)")

    def _decide_ingest(self, meta, source, required):
        try:
            d = self.policy.decide_ingest(_meta(meta), _TIERS[source], required)
        except Exception:
            return self._fail("decide_ingest")
        return self._decision("decide_ingest", d)

    def _eviction_score(self, meta, source):
        try:
            score = self.policy.eviction_score(_meta(meta), _TIERS[source])
        except Exception:
            return self._fail("eviction_score")
        if type(score) not in (int, float) or not math.isfinite(score):
            return self._fail("eviction_score", f"{score!r}, not a finite int or float")
        return float(score)

    def _decide_eviction(self, meta, source):
        try:
            d = self.policy.decide_eviction(_meta(meta), _TIERS[source])
        except Exception:
            return self._fail("decide_eviction")
        return self._decision("decide_eviction", d)

    def _decide_recovery(self, meta, failure):
        action, tier, source, reason, count = failure
        try:
            d = self.policy.decide_recovery(
                _meta(meta), PlacementFailure((_ACTIONS[action], _TIERS[tier]), _TIERS[source],
                                              reason, count))
        except Exception:
            return self._fail("decide_recovery")
        return self._decision("decide_recovery", d)

    def _on_ingest(self, meta, source):
        try:
            self.policy.on_ingest(_meta(meta), _TIERS[source])
        except Exception:
            self._fail("on_ingest")

    def _on_remove(self, meta):
        try:
            self.policy.on_remove(_meta(meta))
        except Exception:
            self._fail("on_remove")


class KVCR:
    """KV Cache Runner over libkvcr.

    Built today: KVCR-owned DRAM (LOCAL_G2) with deposit / deliver / fetch /
    release / abort / poll_completed, Python and built-in policies,
    inventory, capacity and telemetry. Not built yet:

    * the peer-to-peer tier (REMOTE_G2): router hints are validated and
      stored per request, but never make a key FETCHABLE, and deliver never
      pulls from a peer. A framework_control is accepted and kept (one
      warning says REMOTE_G2 is not built); KVCR without local DRAM needs
      the peer tier and is refused.
    * G3 and the KVCR service / Guard: refused at construction, after every
      validation rule passed, with NotImplementedError.

    Callbacks (inventory sink, capacity callback, log) run only inside
    poll_completed() on the polling thread; policy hooks inside the call
    that needs the decision. A callback that raises is logged on the "kvcr"
    logger and contained. Call close() when done: it stops the copy threads;
    only then may registered memory be released."""

    def __init__(self, config: KVCRConfig, bindings: KVCRBindings,
                 backend_configs: KVCRBackendConfigs,
                 guard_config: Optional[KVCRGuardConfig] = None) -> None:
        self._closed = False
        self._native = None
        self._config = config
        self._bindings = bindings
        self._backends = backend_configs
        args = self._validate(config, bindings, backend_configs, guard_config)
        policy = bindings.policy
        builtin = native_builtin(policy)
        adapter = None if builtin is not None else _PolicyAdapter(policy)
        self._telemetry = bool(config.enable_telemetry) and bindings.stats_factory is not None
        self._stats = bindings.stats_factory() if self._telemetry else None
        self._warned_dropped = False
        pool_names = [name for name, _ in config.pool_layouts]
        native = _native.Instance(
            **args,
            watermark_percent=float(config.capacity_low_watermark_percent),
            telemetry=self._telemetry,
            policy=builtin if builtin is not None else adapter,
            inventory=(_inventory_callback(bindings.inventory_sink)
                       if bindings.inventory_sink is not None else None),
            capacity=(_capacity_callback(bindings.capacity_needed_callback)
                      if bindings.capacity_needed_callback is not None else None),
            log=_log_from_native,
            make_entry=_entry_factory(config.nixl_agent_name, pool_names),
        )
        # From here native work runs: anything that fails must stop it.
        try:
            self._native = native
            self._query = native.query
            self._poll = native.poll
            if bindings.framework_control is not None:
                logger.warning(
                    "KVCR %s: the peer-to-peer tier (REMOTE_G2) is not built yet; "
                    "framework_control is kept but no peer is contacted",
                    config.nixl_agent_name)
        except BaseException as exc:
            try:
                native.close()
            except BaseException:
                # Native work may still touch registered memory: keep the
                # instance (and so its threads' targets) for good.
                _RETAINED_INSTANCES.append(native)
                if isinstance(exc, Exception):
                    raise KVCRStartupError(str(exc)) from exc
            raise

    # ---- validation (api_spec §3, §5.1), before anything starts -----------

    @staticmethod
    def _validate(config, bindings, backends, guard) -> dict:
        if not isinstance(config, KVCRConfig):
            raise TypeError("config must be a KVCRConfig")
        if not isinstance(bindings, KVCRBindings):
            raise TypeError("bindings must be a KVCRBindings")
        if not isinstance(backends, KVCRBackendConfigs):
            raise TypeError("backend_configs must be a KVCRBackendConfigs")
        if guard is not None and not isinstance(guard, KVCRGuardConfig):
            raise TypeError("guard_config must be a KVCRGuardConfig or None")
        check_config(config)  # rules 1-8, agent name, listen port
        local, g3 = backends.local_dram, backends.g3
        if guard is not None:
            if local is not None:
                raise ValueError("guard_config conflicts with backend_configs.local_dram")
            raise NotImplementedError(
                "the KVCR service and Guard are not built yet: guard_config cannot be used "
                "with this build")
        layouts = list(config.pool_layouts)
        if g3 is not None and len(layouts) > 1:
            raise ValueError("G3 does not support multiple pools")  # rule 9
        policy = bindings.policy
        if policy is not None and not isinstance(policy, KVCachePolicy):
            raise TypeError("bindings.policy must be a KVCachePolicy")
        if policy is not None:
            check_policy_tiers(policy, local is not None, g3 is not None)  # rule 10
        if g3 is not None and local is None:
            raise ValueError("G3 requires configured local DRAM")  # rule 11
        regions = check_regions(backends)  # rule 12: backend records
        pools = check_local_dram(local, layouts) if local is not None else None
        check_remote(backends.remote_fw_dram)
        if g3 is not None:
            check_g3(g3, layouts)
        if local is None and bindings.framework_control is None:
            raise ValueError("at least one DRAM backend must be configured")  # rule 13
        # Everything below is valid but needs a part that is not built.
        if g3 is not None:
            raise NotImplementedError(
                "G3 tier is not built yet: backend_configs.g3 cannot be used with this build")
        if backends.framework_dram is not None:
            raise NotImplementedError(
                "framework_dram (a raw address range) is not supported by this build: "
                "register framework_regions of RegionDescriptor instead")
        if local is None:
            raise NotImplementedError(
                "KVCR without local DRAM needs the peer-to-peer tier, which is not built yet")
        return dict(
            agent_name=config.nixl_agent_name,
            pool_layouts=layouts,
            local_dram=pools,
            local_backend=local.backend,
            regions=[(r.addr, r.size, r.count, r.stride, r.label, _MEM_TYPES[r.mem_type],
                      r.device_Id) for r in regions],
            operation_timeout_ms=config.operation_timeout_ms,
            abandon_timeout_ms=config.abandon_timeout_ms,
            copy_threads=config.copy_threads,
        )

    # ---- the API ----------------------------------------------------------

    @property
    def config(self) -> KVCRConfig:
        return self._config

    @property
    def bindings(self) -> KVCRBindings:
        return self._bindings

    def query(self, keys, request_id: Optional[str] = None) -> list:
        """[(QueryStatus, CacheTier | None)] per key, in order: (HIT, LOCAL_G2)
        when READY in KVCR DRAM, (FETCHING, LOCAL_G2) while being filled,
        else (MISS, None). Advisory; changes nothing. request_id is accepted
        for hints, which do not make keys FETCHABLE yet."""
        return self._query(keys, request_id)

    def deposit(self, blocks: Mapping, no_evict: bool = False, hints=None) -> OpHandle:
        """Copies {key: [MemoryRef, ...]} framework blocks into KVCR DRAM.
        With no_evict each stored entry carries a release_handle that keeps
        the block resident. `hints` is accepted and not used yet."""
        return self._native.deposit(blocks, _native.NO_EVICT if no_evict else 0)

    def deliver(self, blocks: Mapping, request_id: Optional[str] = None) -> OpHandle:
        """Copies cached blocks into the {key: [MemoryRef, ...]} framework
        destinations. Keys not resident in KVCR DRAM fail (NOT_FOUND): no
        peer source exists yet."""
        return self._native.deliver(blocks, request_id)

    def fetch(self, keys, request_id: Optional[str] = None,
              expected_layout: Optional[list] = None, hints=None) -> OpHandle:
        """Claims resident keys in KVCR DRAM. Each success carries the
        slots' MemoryRefs (and their addresses) and a release_handle."""
        if isinstance(expected_layout, (str, bytes)):
            raise TypeError("expected_layout must be a list of pool names")
        return self._native.fetch(keys, request_id, expected_layout)

    def release(self, handles: Iterable) -> list:
        """[(handle, released)] in order; False for unknown or repeated handles."""
        return self._native.release(handles)

    def abort(self, op_handle: OpHandle, keys=None) -> bool:
        """Best-effort cancellation of entries whose copy has not started;
        True if any entry was cancelled (they report FAILED, "ABORTED")."""
        return self._native.abort(op_handle, keys)

    def poll_completed(self) -> list:
        """[(op handle, {key: OpEntryResult})] for every operation completed
        since the last call, in completion order; runs pending callbacks.
        Call it regularly."""
        return self._poll()

    def submit_hint(self, hints: Mapping, request_id: Optional[str] = None) -> None:
        """Validates the router's kv_hint envelope (api_spec §6.1; a bad one
        raises ValueError naming the rule) and, with a request_id, keeps it
        for that request (§6.2: the same source again replaces the hash set,
        a different source fails the request's hint closed).

        The peer-to-peer tier is not built yet: a stored hint never makes a
        key FETCHABLE, and no peer is contacted."""
        self._native.submit_hint(request_id, encode_router_hint(hints))

    def discard_hint(self, request_id: str) -> None:
        """Forgets the request's hint; an unknown request is not an error."""
        self._native.discard_hint(request_id)

    def stored_hint(self, request_id: str) -> Optional[tuple]:
        """(source endpoint, sorted unique block hashes, failed) of the hint
        kept for request_id, or None. For tests and diagnostics."""
        return self._native.hint(request_id)

    def get_stats(self):
        """The interval's telemetry in a stats_factory() object (filled with
        set_gauge / increase_counter / observe_histogram), replaced by a
        fresh one; None with telemetry off."""
        if not self._telemetry:
            return None
        snapshot = self._native.stats(False)
        stats = self._stats
        if stats is None:
            stats = self._new_stats()
        if snapshot is not None and stats is not None:
            for resource, value in snapshot["gauges"]:
                _record(stats, "set_gauge", STATE_METRIC, value, (resource,))
            for name, operation, value in snapshot["counters"]:
                _record(stats, "increase_counter", name, value, (operation,))
            for scope, result, seconds in snapshot["observations"]:
                _record(stats, "observe_histogram", DURATION_METRIC, seconds, (scope, result))
            if snapshot["observations_dropped"] and not self._warned_dropped:
                self._warned_dropped = True
                logger.warning("KVCR kept at most 65536 duration observations per interval; "
                               "%d were not replayed into the stats object (call get_stats "
                               "more often)", snapshot["observations_dropped"])
        self._stats = self._new_stats()
        return stats

    def _new_stats(self):
        try:
            return self._bindings.stats_factory()
        except Exception:
            logger.warning("KVCR stats_factory raised", exc_info=True)
            return None

    def prometheus_text(self) -> Optional[str]:
        """The interval in the Prometheus text format (consumes it, like
        get_stats); None with telemetry off."""
        if not self._telemetry:
            return None
        snapshot = self._native.stats(True)
        return None if snapshot is None else snapshot["prometheus"]

    def fileno(self) -> int:
        """A descriptor readable while poll_completed() has results to collect."""
        return self._native.fd()

    def close(self) -> None:
        """Stops KVCR: queued copies are cancelled, running ones waited for,
        pending entries fail. Afterwards no KVCR thread touches registered
        memory and every other call raises RuntimeError. Idempotent."""
        if self._closed or self._native is None:
            return
        self._native.close()
        self._closed = True


def _record(stats, method: str, *args) -> None:
    fn = getattr(stats, method, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception:
        logger.warning("KVCR stats %s raised", method, exc_info=True)
