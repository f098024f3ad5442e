"""KVCR: the framework-facing object, a thin layer over kvcr._native (libkvcr)."""
from __future__ import annotations

import collections
import collections.abc
import inspect
import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

from . import _native, errors
from .config import (FrameworkControl, InventorySink, KeyAdapter, TelemetryStats,
                     KVCRBackendConfigs, KVCRConfig, KVCRGuardConfig, config_args, g3_args,
                     guard_args, kv_events_args, local_dram_args, region_args, remote_args)
from .config import control_endpoint as control_endpoint_of
from .control_channels import ZmqPeerControlChannel
from .hints import encode_hints, encode_router_hint
from .compat import check_inherited, framework_region, region_of
from .policy import KVCachePolicy, native_builtin
from .types import (BlockKey, BlockMeta, CacheTier, InventoryEvent, KVCRStartupError, MemoryRef,
                    OpEntryResult, OpEntryStatus, OpHandle, PinHandle, PinRequestId,
                    PlacementAction, PlacementFailure, QueryStatus, ReleaseHandle, RouterBlock,
                    TransferError)

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
_RESILIENCE_STATES = ("uncertain", "quiesced", "stalled")  # kvcr_resilience_state
_U64 = 2**64

# libkvcr's service errors, for kvcr._native: KVCR_EREFUSED, KVCR_EUNAVAIL,
# KVCR_EPROTO.
_native.init(_QUERY, _TIERS, MemoryRef, errors.BY_CODE)

# Instances whose start-up failed and could not be stopped (KVCRStartupError).
_RETAINED_INSTANCES: list = []


@dataclass(frozen=True)
class KVCRBindings:
    """Framework callbacks, in their documented order (fields may be given
    positionally).

    framework_control turns the peer-to-peer tier (REMOTE_G2) on and names
    the control endpoint libkvcr binds (see kvcr.control_channels). With it:
    key_adapter.decode maps keys to router hashes (hint matching);
    request_pin / poll_pin_results / release_pin / cancel_pin_request let a
    peer read blocks that only framework memory holds; on_resilience_event
    receives TransferError reports. inventory_sink, capacity_needed_callback,
    stats_factory and policy work with or without it. resize_g2_memory is
    accepted and not used."""

    request_pin: Optional[Callable[[list], PinRequestId]]
    poll_pin_results: Optional[Callable[[], Iterable[tuple]]]
    release_pin: Optional[Callable[[PinHandle], bool]]
    cancel_pin_request: Optional[Callable[[PinRequestId], None]] = None
    framework_control: Optional[FrameworkControl] = None
    key_adapter: Optional[KeyAdapter] = None
    inventory_sink: Optional[InventorySink] = None
    capacity_needed_callback: Optional[Callable[[list], None]] = None
    stats_factory: Optional[Callable[[], TelemetryStats]] = None
    policy: Optional[KVCachePolicy] = None
    on_resilience_event: Optional[Callable[[TransferError], None]] = None
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


def _extra_keys_json(keys) -> Optional[str]:
    """RouterBlock.extra_keys as libkvcr reads them (router_extra): a JSON
    array of what vLLM puts in a block's extra keys, str, non-negative
    int, or a tuple (list) of them; None when there are none."""
    keys = tuple(keys)
    if not keys:
        return None

    def scalar(v):
        return type(v) is str or (type(v) is int and 0 <= v < 2**64)

    out = []
    for k in keys:
        if isinstance(k, (tuple, list)) and all(scalar(v) for v in k):
            out.append(list(k))
        elif scalar(k):
            out.append(k)
        else:
            raise ValueError("RouterBlock.extra_keys hold str, non-negative int, or tuples "
                             f"of them, got {k!r}")
    return json.dumps(out)


def _router_entries(blocks: Mapping, router: Optional[Mapping]) -> Optional[list]:
    """kvcr._native's router list: per block of `blocks`, in its order,
    (parent | None, token ids, block_size, lora_name | None, extra keys as
    JSON text | None) or None for a block `router` does not describe."""
    if router is None:
        return None
    if not isinstance(router, Mapping):
        raise TypeError("router must map keys to RouterBlock")
    out = []
    for key in blocks:
        rb = router.get(key)
        if rb is None:
            out.append(None)
            continue
        if not isinstance(rb, RouterBlock):
            raise TypeError(f"router[{key!r}] must be a RouterBlock")
        tokens = tuple(rb.token_ids)
        if not all(type(t) is int and 0 <= t < 2**32 for t in tokens):
            raise ValueError("RouterBlock.token_ids must be ints in [0, 2**32)")
        if rb.parent_hash is not None and not (
                type(rb.parent_hash) is int and 0 <= rb.parent_hash < 2**64):
            raise ValueError("RouterBlock.parent_hash must be an int in [0, 2**64) or None")
        if type(rb.block_size) is not int or not 0 <= rb.block_size < 2**32:
            raise ValueError("RouterBlock.block_size must be an int in [0, 2**32)")
        out.append((rb.parent_hash, tokens, rb.block_size, rb.lora_name,
                    _extra_keys_json(rb.extra_keys)))
    return out


def _capacity_callback(callback: Callable) -> Callable:
    def deliver(needs: list) -> bool:
        try:
            callback(needs)
            return True
        except Exception:
            logger.warning("KVCR capacity_needed_callback raised", exc_info=True)
            return False
    return deliver


def _router_hash_method(adapter: Any) -> Optional[Callable]:
    """The adapter's key -> router hash method: encode_to_router (its name
    in vLLM 0.34's adapter) or decode (earlier adapters); None if neither."""
    for name in ("encode_to_router", "decode"):
        method = getattr(adapter, name, None)
        if callable(method):
            return method
    return None


def _key_hash_callback(adapter: Any) -> Callable:
    """libkvcr's key_hash through the key adapter (_router_hash_method): the
    key's router hash as an int in [0, 2**64), or None when it has none.

    decode may return an int (used as is when it is a u64) or bytes (read
    big-endian, low 64 bits: vLLM's maybe_convert_block_hash, which is how
    the router turns hash bytes into the u64s that hints list). Anything
    else, or an exception (logged once), means "no hash": the key is never
    REMOTE_G2. It runs under libkvcr's instance lock, holding the GIL: the
    adapter must be pure and must not call KVCR."""
    decode = _router_hash_method(adapter)
    warned = []

    def key_hash(key: bytes) -> Optional[int]:
        try:
            h = decode(BlockKey(key))
        except Exception:
            if not warned:
                warned.append(True)
                logger.warning("KVCR key_adapter.%s raised; such keys are never REMOTE_G2",
                               decode.__name__, exc_info=True)
            return None
        if isinstance(h, int) and not isinstance(h, bool):
            h = int(h)
            return h if 0 <= h < _U64 else None
        if isinstance(h, (bytes, bytearray)) and h:
            return int.from_bytes(h[-8:], "big")
        return None
    return key_hash


_MISSING = object()


class _PinBridge:
    """libkvcr's pin callbacks over the framework's.

    libkvcr names pin requests and pins with u64 ids; the framework chooses
    its own PinRequestId and PinHandle. This maps one onto the other:
    request_pin's id <-> libkvcr's request, and each granted PinHandle gets a
    fresh u64 until release_pin accepts it. Every framework callback that
    raises is logged and contained (it counts as "no pin" / "not released";
    libkvcr retries releases on every poll). It runs inside poll_completed()
    and close(), on the polling thread, with no KVCR lock held."""

    def __init__(self, bindings: "KVCRBindings", legacy=None) -> None:
        self._legacy = legacy  # kvcr.compat's region: pins given as MemDescriptors
        self._request_pin = bindings.request_pin
        self._poll_pin_results = bindings.poll_pin_results
        self._release_pin = bindings.release_pin
        self._cancel_pin_request = bindings.cancel_pin_request
        self._by_framework: dict = {}  # PinRequestId -> libkvcr request
        self._by_native: dict = {}     # libkvcr request -> PinRequestId
        self._handles: dict = {}       # libkvcr pin -> PinHandle
        self._warned: set = set()      # pins whose release raised once already
        self._next_pin = 0

    # -- called by kvcr._native --

    def request(self, req: int, keys: tuple) -> bool:
        try:
            rid = self._request_pin([BlockKey(k) for k in keys])
            hash(rid)
        except Exception:
            logger.warning("KVCR request_pin raised; no pin for this attempt", exc_info=True)
            return False
        if rid in self._by_framework:
            logger.warning("KVCR request_pin returned %r, a request that is still pending; "
                           "the request is ignored", rid)
            return False
        self._by_framework[rid] = req
        self._by_native[req] = rid
        return True

    def poll(self) -> list:
        """[(request, pin, {key: refs} | None, (missing keys))] for
        kvcr_pin_complete: pin 0 fails the request; request 0 (an unknown or
        cancelled one) makes libkvcr release the pin at once; None blocks
        (a result of the wrong shape) make libkvcr refuse and release it."""
        try:
            results = self._poll_pin_results()
            results = list(results) if results else ()
        except Exception:
            logger.warning("KVCR poll_pin_results raised; no pin results this poll",
                           exc_info=True)
            return []
        out = []
        for item in results:
            try:
                rid, result = item
                req = self._by_framework.pop(rid, 0)
            except Exception:
                logger.warning("KVCR poll_pin_results gave %r, not a (PinRequestId, "
                               "PinResult) pair", item)
                continue
            if req:
                del self._by_native[req]
            if result is None:
                if req:
                    out.append((req, 0, None, ()))
                continue
            try:
                handle, mapping = result
            except Exception:
                logger.warning("KVCR pin result %r for request %r is not (pin handle, "
                               "mapping); the pin failed", result, rid)
                if req:
                    out.append((req, 0, None, ()))
                continue
            self._next_pin += 1
            pin = self._next_pin
            self._handles[pin] = handle
            available, missing = self._blocks(rid, mapping, self._legacy)
            out.append((req, pin, available, missing))
        return out

    @staticmethod
    def _blocks(rid, mapping, legacy):
        if not isinstance(mapping, collections.abc.Mapping):
            logger.warning("KVCR pin result for request %r: the mapping is %r, not a Mapping; "
                           "the pin is released", rid, type(mapping).__name__)
            return None, ()
        available, missing = {}, []
        for key, refs in mapping.items():
            if not isinstance(key, bytes):
                break
            if refs is None:
                missing.append(bytes(key))
                continue
            if legacy is not None and isinstance(refs, list):
                try:
                    refs = legacy.refs(refs)
                except (TypeError, ValueError) as exc:
                    logger.warning("KVCR pin result for request %r: %s; the pin is released",
                                   rid, exc)
                    return None, ()
            if isinstance(refs, list) and refs and all(isinstance(r, MemoryRef) for r in refs):
                available[bytes(key)] = refs
            else:
                break
        else:
            return available, tuple(missing)
        logger.warning("KVCR pin result for request %r: key %r maps to %r, not a non-empty "
                       "list of MemoryRef or None; the pin is released", rid, key, refs)
        return None, ()

    def cancel(self, req: int) -> None:
        rid = self._by_native.pop(req, _MISSING)
        if rid is _MISSING:
            return
        del self._by_framework[rid]
        if self._cancel_pin_request is None:
            return
        try:
            self._cancel_pin_request(rid)
        except Exception:
            logger.warning("KVCR cancel_pin_request(%r) raised", rid, exc_info=True)

    def release(self, pin: int) -> bool:
        """True only when release_pin returned True (then the pin is gone)."""
        handle = self._handles.get(pin, _MISSING)
        if handle is _MISSING:
            return True  # not one of ours (or already released)
        try:
            ok = self._release_pin(handle) is True
        except Exception:
            if pin not in self._warned:
                self._warned.add(pin)
                logger.warning("KVCR release_pin(%r) raised; it is retried", handle,
                               exc_info=True)
            ok = False
        if ok:
            del self._handles[pin]
            self._warned.discard(pin)
        return ok

    # -- called by KVCR.close(), after libkvcr stopped --

    def close(self) -> None:
        """libkvcr takes no pin results any more: results still arriving are
        released at once, requests still pending are cancelled, and pins
        never given back are released one last time (no KVCR thread touches
        their memory any more)."""
        for req, pin, _, _ in self.poll():
            pass  # each granted pin now sits in _handles: released below
        for req in list(self._by_native):
            self.cancel(req)
        stuck = [self._handles[pin] for pin in list(self._handles) if not self.release(pin)]
        if stuck:
            logger.error("KVCR could not release framework pins: %r", stuck)


class _ResilienceSink:
    """Turns libkvcr's resilience events into TransferError objects for
    on_resilience_event.

    The callback runs inside poll_completed() (and close()), as libkvcr
    reports each event, so it sees the event before any pin is released or
    result returned after it. libkvcr cannot carry a Python exception, so a
    raising callback is recorded: poll_completed() raises it once libkvcr's
    poll has returned, and keeps that poll's results for the next call.
    Events reported after the raise are queued and delivered first on the
    next call. Each event is delivered exactly once. At close() a raising
    callback is logged instead (close always finishes)."""

    def __init__(self, callback: Callable) -> None:
        self._callback = callback
        self._queue: collections.deque = collections.deque()
        self._raised: Optional[BaseException] = None
        self._stash: list = []  # results of a poll that raised

    def event(self, state: int, source_side: bool, op: int, regions: tuple,
              message: str) -> bool:
        refs = [MemoryRef(end_point_name=ep, label=label, element_index=index)
                for ep, label, index in regions]
        err = TransferError(
            message, op,
            state=_RESILIENCE_STATES[state] if 0 <= state < 3 else f"state-{state}",
            destination_regions=None if source_side else refs,
            source_regions=refs if source_side else None, source_side=bool(source_side))
        if self._queue or self._raised is not None:
            self._queue.append(err)
            return True
        try:
            self._callback(err)
        except BaseException as exc:  # noqa: B902 - re-raised from poll_completed
            self._raised = exc
        return True

    def poll(self, native_poll: Callable) -> list:
        while self._queue:
            self._callback(self._queue.popleft())  # a raise leaves the rest queued
        results = native_poll()
        if self._stash:
            results, self._stash = self._stash + results, []
        if self._raised is not None:
            exc, self._raised = self._raised, None
            self._stash = results
            raise exc
        return results

    def close(self) -> None:
        if self._raised is not None:
            exc, self._raised = self._raised, None
            logger.error("KVCR on_resilience_event raised during close", exc_info=exc)
        while self._queue:
            try:
                self._callback(self._queue.popleft())
            except Exception:
                logger.error("KVCR on_resilience_event raised during close", exc_info=True)


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
    key, size, count, last, tiers, position, tenant, t_dram, q_dram, t_g3, q_g3 = t
    resident = frozenset(tier for i, tier in enumerate(_TIERS) if tier and tiers & (1 << i))
    return BlockMeta(BlockKey(key), size, count, last, resident, position, tenant, t_dram,
                     q_dram, t_g3, q_g3)


def _hint_params(fn) -> tuple:
    """Whether a decide_ingest takes router_hints and framework_hints (by
    name or **kwargs): a policy written before hints reached policies is
    called as it was."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return (False, False)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return (var_kw or "router_hints" in params, var_kw or "framework_hints" in params)


class _HintCache:
    """JSON text from libkvcr as Python objects, the last text kept decoded:
    a deposit's or fetch's entries share theirs (policies must not change
    the objects they are given)."""

    def __init__(self) -> None:
        self._text = None
        self._obj = None

    def get(self, text: Optional[str]):
        if text is None:
            return None
        if text != self._text:
            self._obj = json.loads(text)
            self._text = text
        return self._obj


class _PolicyAdapter:
    """What libkvcr's policy vtable calls (through kvcr._native): tuples in,
    ints out. A hook that raises or returns something invalid is logged here
    and reported as failed (None); libkvcr then logs its fallback and applies
    the built-in rule for that hook."""

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
        self._tenant_quotas = bool(getattr(policy, "tenant_quotas", False))
        self._takes_router, self._takes_framework = _hint_params(policy.decide_ingest)
        self._router = _HintCache()
        self._framework = _HintCache()

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

    def _decide_ingest(self, meta, source, required, framework=None, router=None):
        try:
            kw = {}
            if self._takes_router:
                kw["router_hints"] = self._router.get(router)
            if self._takes_framework:
                kw["framework_hints"] = self._framework.get(framework)
            d = self.policy.decide_ingest(_meta(meta), _TIERS[source], required, **kw)
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

    Built: KVCR-owned DRAM (LOCAL_G2) with deposit / deliver / fetch /
    release / abort / poll_completed, Python and built-in policies,
    inventory, capacity and telemetry, and — with a framework_control — the
    peer-to-peer tier (REMOTE_G2): a router hint submitted for a request
    makes its hinted keys FETCHABLE from the hinted peer, deliver and fetch
    with that request_id pull them, and peers read our KVCR DRAM or, through
    the pin bindings, framework memory. Local DRAM is then optional.
    With backend_configs.g3, the G3 tier (KVCR-owned slot files on local
    disk): blocks the policy evicts from KVCR DRAM with (MOVE_TO, G3) — the
    default policy g3_lru does — are written there, query says (FETCHABLE,
    G3), deliver reads them straight into framework memory and fetch back
    into KVCR DRAM; a new KVCR on the same files finds them again. A G3
    copy that fails its key or checksum check is never handed over: its
    entry fails with reason "CORRUPT" and the block leaves G3.
    With a guard_config (KVCRGuardConfig), guard mode: KVCR DRAM is the pool
    group guard_index of the node's KVCR service (`kvcr service`), claimed
    when KVCR starts (backend_configs.local_dram must be unset: libkvcr's
    ValueError "guard mode conflicts with local_dram: ...", raised before
    anything is contacted). Committed blocks are journalled for the group's
    Guard; a later KVCR claiming the same group recovers them (query HIT,
    announced to the inventory sink again), and with a framework_control the
    service owns the control endpoint, so peers reach the Guard on it while
    no engine holds the group (it needs no control_bind_address /
    adopt_listener: libkvcr and the service hand the listener over
    themselves). close() gives the group back. A claim that fails raises
    KVCRServiceError (refused: digest mismatch, guard_index out of range,
    group held by another worker, endpoint that cannot be moved),
    KVCRSocketError (service not reachable: KVCR_EUNAVAIL) or
    KVCRGuardProtocolError.

    Configuration errors: libkvcr checks every value before anything starts
    and its message is raised (KVCR_EINVAL: ValueError; KVCR_ENOTSUP:
    NotImplementedError); a field of the wrong type raises TypeError first
    (kvcr.config).

    Callbacks (inventory sink, capacity callback, pin callbacks, resilience
    events, log) run only inside poll_completed() or close() on the calling
    thread, without KVCR's lock; policy hooks and key_adapter.decode inside
    the call that needs them, under it. A callback that raises is logged on
    the "kvcr" logger and contained — except on_resilience_event, whose
    exception poll_completed() raises (see _ResilienceSink). Call
    poll_completed() regularly even when idle (peers' reads, pins and
    deadlines progress there) and close() when done: it stops every KVCR
    thread; only then may registered memory be released."""

    def __init__(self, config: KVCRConfig, bindings: KVCRBindings,
                 backend_configs: KVCRBackendConfigs,
                 guard_config: Optional[KVCRGuardConfig] = None) -> None:
        self._closed = False
        self._native = None
        self._pins = self._sink = self._endpoint = None
        self._config = config
        self._bindings = bindings
        self._backends = backend_configs
        args = self._validate(config, bindings, backend_configs, guard_config)
        # framework_dram's region, when the first API registered memory:
        # its MemDescriptors become MemoryRefs (kvcr.compat).
        self._legacy = args.pop("legacy")
        policy = bindings.policy
        # No policy: libkvcr's default (g3_lru with G3, else lru). A built-in
        # (or a subclass changing no hook) runs as libkvcr's C policy; any
        # other through _PolicyAdapter.
        builtin = native_builtin(policy)
        adapter = _PolicyAdapter(policy) if policy is not None and builtin is None else None
        self._telemetry = bool(config.enable_telemetry) and bindings.stats_factory is not None
        peer = bindings.framework_control is not None  # the peer-to-peer tier is on
        self._pins = (_PinBridge(bindings, self._legacy)
                      if peer and bindings.request_pin is not None else None)
        self._sink = (_ResilienceSink(bindings.on_resilience_event)
                      if peer and bindings.on_resilience_event is not None else None)
        self._stats = bindings.stats_factory() if self._telemetry else None
        self._warned_dropped = False
        pool_names = [name for name, _ in config.pool_layouts]
        args["options"]["enable_telemetry"] = self._telemetry  # the stats need a sink too
        native = _native.Instance(
            **args,
            policy=adapter if adapter is not None else builtin,
            inventory=(_inventory_callback(bindings.inventory_sink)
                       if bindings.inventory_sink is not None else None),
            capacity=(_capacity_callback(bindings.capacity_needed_callback)
                      if bindings.capacity_needed_callback is not None else None),
            log=_log_from_native,
            make_entry=_entry_factory(config.nixl_agent_name, pool_names),
            key_hash=(_key_hash_callback(bindings.key_adapter)
                      if (peer or config.kv_events is not None)
                      and bindings.key_adapter is not None else None),
            pins=self._pins,
            resilience=self._sink.event if self._sink is not None else None,
        )
        # From here native work runs: anything that fails must stop it.
        try:
            self._native = native
            self._query = native.query
            self._poll = native.poll
            self._endpoint = native.endpoint()
            control = bindings.framework_control
            if isinstance(control, ZmqPeerControlChannel) and self._endpoint is not None:
                control._bound(self._endpoint)
            g3 = backend_configs.g3
            if g3 is not None and g3.backend_options:
                logger.warning("KVCR G3 backend_options %s are ignored: libkvcr serves G3 "
                               "backend %r with io_uring, which takes no options (its "
                               "tuning is G3Options.queue_depth and max_staging_bytes)",
                               sorted(g3.backend_options), g3.backend)
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

    # ---- arguments for kvcr._native, before anything starts -----------------

    @staticmethod
    def _validate(config, bindings, backends, guard) -> dict:
        """kvcr._native.Instance's arguments, with the types checked (and what
        libkvcr cannot see, kvcr.config): libkvcr checks the values when the
        instance is created, before anything starts."""
        if not isinstance(config, KVCRConfig):
            raise TypeError("config must be a KVCRConfig")
        if not isinstance(bindings, KVCRBindings):
            raise TypeError("bindings must be a KVCRBindings")
        if not isinstance(backends, KVCRBackendConfigs):
            raise TypeError("backend_configs must be a KVCRBackendConfigs")
        if guard is not None and not isinstance(guard, KVCRGuardConfig):
            raise TypeError("guard_config must be a KVCRGuardConfig or None")
        check_inherited(config, backends.g3)
        args = config_args(config)
        policy = bindings.policy
        if policy is not None and not isinstance(policy, KVCachePolicy):
            raise TypeError("bindings.policy must be a KVCachePolicy")
        local, g3 = backends.local_dram, backends.g3
        pools, options = local_dram_args(local) if local is not None else (None, {})
        legacy = framework_region(backends.framework_dram, config.nixl_agent_name,
                                  config.pool_layouts)
        regions = region_args(backends, region_of(legacy) if legacy is not None else None)
        endpoint = None
        if bindings.framework_control is not None:
            endpoint = control_endpoint_of(bindings.framework_control)
            pins = (bindings.request_pin, bindings.poll_pin_results, bindings.release_pin)
            if any(p is not None for p in pins) and not all(callable(p) for p in pins):
                raise TypeError("request_pin, poll_pin_results and release_pin must be "
                                "callables given together")
            if bindings.cancel_pin_request is not None and not callable(
                    bindings.cancel_pin_request):
                raise TypeError("cancel_pin_request must be callable or None")
            if bindings.key_adapter is not None and \
                    _router_hash_method(bindings.key_adapter) is None:
                raise TypeError("key_adapter must have a decode(key) or encode_to_router(key) "
                                "method")
            if bindings.on_resilience_event is not None and not callable(
                    bindings.on_resilience_event):
                raise TypeError("on_resilience_event must be callable or None")
        remote, curve_keys = remote_args(backends.remote_fw_dram, endpoint)
        block_size = args["pool_layouts"][0]["block_size"] if args["pool_layouts"] else 0
        g3_paths, g3_options = g3_args(g3, block_size) if g3 is not None else (None, {})
        # Every option by its path in libkvcr's options table (kvcr.config.OPTIONS).
        options = dict(args.pop("options"), **options, **remote, **g3_options,
                       **kv_events_args(config.kv_events),
                       **(guard_args(guard) if guard is not None else {}))
        return dict(
            args,
            legacy=legacy,
            options=options,
            local_dram=pools,
            regions=regions,
            g3_paths=g3_paths,
            curve_allowed_keys=curve_keys,
        )

    # ---- the API ----------------------------------------------------------

    @property
    def config(self) -> KVCRConfig:
        return self._config

    @property
    def bindings(self) -> KVCRBindings:
        return self._bindings

    @property
    def control_endpoint(self) -> Optional[str]:
        """"tcp://<advertise host>:<port>" of the control channel libkvcr
        bound (the port it chose when the channel asked for port 0): what
        peers and router hints name as this instance's source, followed by
        "#curve=<public key>" with CURVE (pass it on unchanged). None without
        a framework_control."""
        return self._endpoint

    def query(self, keys, request_id: Optional[str] = None) -> list:
        """[(QueryStatus, CacheTier | None)] per key, in order: (HIT, LOCAL_G2)
        when READY in KVCR DRAM, (FETCHING, LOCAL_G2) while being filled,
        (FETCHING, G3) while its spill from KVCR DRAM is written,
        (FETCHABLE, G3) when a G3 slot holds it (written and committed),
        (FETCHABLE, REMOTE_G2) when the router hint kept for request_id
        covers the key (its key_adapter hash is hinted, or any key with
        opportunistic_query) and the peer has not reported it missing, else
        (MISS, None). Advisory; changes nothing."""
        return self._query(keys, request_id)

    def deposit(self, blocks: Mapping, no_evict: bool = False, hints=None,
                router: Optional[Mapping] = None, strict_tenant: bool = False) -> OpHandle:
        """Copies {key: [MemoryRef, ...]} framework blocks into KVCR DRAM.
        With no_evict each stored entry carries a release_handle that keeps
        the block resident. `hints` (a Mapping, JSON-encodable, or None)
        are the framework's: they reach the policy's decide_ingest as
        framework_hints as given (with required_local = no_evict). Only
        with KVCRConfig.tenants is a "tenant" key read: a configured name
        is the tenant new blocks take; another value gives them none
        (gauge hints_unknown_tenant), or with strict_tenant raises
        ValueError. Hints that are not a JSON object raise ValueError and
        start nothing. `router` maps keys to RouterBlock: what the KV events
        announce of them (KVCRConfig.kv_events; ignored without). A
        RouterBlock that breaks a rule (token ids without a block_size, too
        many extra keys, an extra key not a str, int or tuple of them)
        raises ValueError and starts nothing."""
        flags = (_native.NO_EVICT if no_evict else 0) | \
            (_native.STRICT_TENANT if strict_tenant else 0)
        if self._legacy is not None:
            blocks = self._legacy.blocks(blocks)
        return self._native.deposit(blocks, flags, encode_hints(hints),
                                    _router_entries(blocks, router))

    def deliver(self, blocks: Mapping, request_id: Optional[str] = None) -> OpHandle:
        """Copies cached blocks into the {key: [MemoryRef, ...]} framework
        destinations: from KVCR DRAM, else straight from G3 (one descriptor
        of the slot size: else LAYOUT_MISMATCH; a slot that does not verify:
        CORRUPT; a block in parts, "pool:*", is read into KVCR DRAM first),
        else — for keys request_id's hint covers — straight from the hinted
        peer (each part where it belongs). Other keys fail (NOT_FOUND)."""
        if self._legacy is not None:
            blocks = self._legacy.blocks(blocks)
        return self._native.deliver(blocks, request_id)

    def fetch(self, keys, request_id: Optional[str] = None,
              expected_layout: Optional[list] = None, hints=None,
              strict_tenant: bool = False) -> OpHandle:
        """Claims keys in KVCR DRAM — resident ones, or ones read first from G3
        or pulled from the peer that request_id's hint names. Each success
        carries the slots' MemoryRefs (and their addresses) and a
        release_handle. Each fill (from G3 or the peer) asks the policy's
        decide_ingest with `hints` as framework_hints (a "tenant" key names
        the tenant of blocks that have none, as for deposit, strict_tenant
        included) and the router hint kept for request_id as router_hints."""
        if isinstance(expected_layout, (str, bytes)):
            raise TypeError("expected_layout must be a list of pool names")
        return self._native.fetch(keys, request_id, expected_layout, encode_hints(hints),
                                  _native.STRICT_TENANT if strict_tenant else 0)

    def release(self, handles: Iterable) -> list:
        """[(handle, released)] in order; False for unknown or repeated handles."""
        return self._native.release(handles)

    def abort(self, op_handle: OpHandle, keys=None) -> bool:
        """Best-effort cancellation of entries whose copy has not started;
        True if any entry was cancelled (they report FAILED, "ABORTED")."""
        return self._native.abort(op_handle, keys)

    def poll_completed(self) -> list:
        """[(op handle, {key: OpEntryResult})] for every operation completed
        since the last call, in completion order; runs pending callbacks
        (pins, resilience events, inventory, capacity). Call it regularly.
        If on_resilience_event raises, the exception propagates from here;
        nothing is lost (see _ResilienceSink)."""
        if self._sink is None:
            return self._poll()
        return self._sink.poll(self._poll)

    def submit_hint(self, hints: Mapping, request_id: Optional[str] = None) -> None:
        """libkvcr validates the router's kv_hint envelope (a bad one raises
        ValueError naming the rule) and, with a request_id, keeps it for
        that request (the same source again replaces the hash set, a
        different source fails the request's hint closed).

        With the peer-to-peer tier on (a framework_control), the request's
        hinted keys become FETCHABLE / REMOTE_G2 and deliver / fetch with
        that request_id pull them from the source; with eager_ctrl_connect
        this instance introduces itself to the source at once. Without it
        the hint is only kept."""
        self._native.submit_hint(request_id, encode_router_hint(hints))

    def discard_hint(self, request_id: str) -> None:
        """Forgets the request's hint; an unknown request is not an error."""
        self._native.discard_hint(request_id)

    def align_sequence(self, ordered_keys, use_current_time: bool = False) -> None:
        """Gives the keys, one prefix sequence in its order, one recency in
        KVCR DRAM: each block held READY there takes the newest last access
        among them (now, with use_current_time) and its eviction score
        again, and among equal scores the sequence's tail is evicted first.
        Keys not in KVCR DRAM are skipped; G3 keeps its own order. Python
        policies are not told (they score from BlockMeta.last_access)."""
        self._native.align_sequence(ordered_keys, bool(use_current_time))

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
        get_stats); None with telemetry off. The text passes `promtool check
        metrics`: its counters carry the `_total` suffix (kvcr_transfer_bytes_total),
        while get_stats() names them by their base names (TRANSFER_BYTES_METRIC)."""
        if not self._telemetry:
            return None
        snapshot = self._native.stats(True)
        return None if snapshot is None else snapshot["prometheus"]

    def __enter__(self) -> "KVCR":
        return self

    def __exit__(self, *exc_info) -> None:
        """`with KVCR(...) as kv:` closes it at the end of the block, also
        when the block raises (close() stops every KVCR thread first)."""
        self.close()

    def fileno(self) -> int:
        """A descriptor readable while poll_completed() has results to collect."""
        return self._native.fd()

    def close(self) -> None:
        """Stops KVCR: queued copies are cancelled, running ones waited for,
        peer transfers end (or are reported uncertain), pending entries
        fail. Resilience events still due are delivered, pin results that
        arrive too late are released, pending pin requests cancelled.
        Afterwards no KVCR thread touches registered memory and every other
        call raises RuntimeError. Idempotent."""
        if self._closed or self._native is None:
            return
        self._native.close()
        self._closed = True
        if self._sink is not None:
            self._sink.close()
        if self._pins is not None:
            self._pins.close()


def _record(stats, method: str, *args) -> None:
    fn = getattr(stats, method, None)
    if fn is None:
        return
    try:
        fn(*args)
    except Exception:
        logger.warning("KVCR stats %s raised", method, exc_info=True)
