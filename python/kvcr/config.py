"""Configuration records (frozen dataclasses): fields and defaults.

The records themselves do not validate: `KVCR(...)` checks them before
anything starts. libkvcr checks the values, and its message is the one
raised (ValueError, or NotImplementedError for what this build lacks);
this module checks the types (TypeError) and what libkvcr cannot see (see
"arguments for kvcr._native" below)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Tuple

from . import _native
from .types import BlockKey, InventoryEvent, RegionDescriptor

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

# libkvcr's options table (src/api/options.def, kvcr/options.h): every
# scalar option's path, type, default, range and rule, and the record field
# ("Record.field") that sets it. The records' defaults come from it, and
# their values reach libkvcr by path (_bound), never by position.
OPTIONS = {row["path"]: row for row in _native.options()}


def _default(path: str) -> Any:
    """The default libkvcr's kvcr_config_init gives the option at `path`."""
    return OPTIONS[path]["default"]


def _top(path: str) -> int:
    """The largest value the option's C field holds."""
    return {"bool": 1, "u16": 2**16 - 1, "u32": _U32_MAX, "u64": _U64_MAX}[OPTIONS[path]["type"]]


def _bound(record: Any, **values: Any) -> dict:
    """{path: value} of every table row bound to a field of `record`'s class
    or a base of it (its `py` "Record.field"): the field's value, or
    values[field] when the caller checked or converted it."""
    classes = {c.__name__ for c in type(record).__mro__}
    bound = {}
    for path, row in OPTIONS.items():
        cls, _, name = (row["py"] or "").partition(".")
        if cls in classes:
            bound[path] = values[name] if name in values else getattr(record, name)
    return bound


_KVCR_MEM_TYPE = {"DRAM": 0, "VRAM": 1}  # RegionDescriptor.mem_type -> kvcr_mem_type
FRAMEWORK_MEMORY_TYPES = frozenset(_KVCR_MEM_TYPE)


@dataclass(frozen=True)
class KVCRConfig:
    nixl_agent_name: str
    pool_layouts: list  # [(pool_name, block_size_bytes)]
    enable_telemetry: bool = _default("enable_telemetry")
    operation_timeout_ms: int = _default("operation_timeout_ms")
    abandon_timeout_ms: int = _default("abandon_timeout_ms")
    capacity_low_watermark_percent: float = _default("capacity_low_watermark_percent")
    nixl_listen_port: Optional[int] = None
    # KVCR's own: libkvcr's copy threads (1..64).
    copy_threads: int = _default("copy_threads")
    # KVCR's own: libkvcr's resource limits (see KVCRLimits).
    limits: "KVCRLimits" = field(default_factory=lambda: KVCRLimits())
    # KVCR's own: KV events for routers (see KVEventsOptions); None: off.
    kv_events: Optional["KVEventsOptions"] = None
    # KVCR's own: tenants and their quotas (see TenantQuota); () : none.
    tenants: tuple = ()


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """KVCR's own: a tenant (libkvcr's kvcr_tenant) and the KVCR DRAM and G3
    slots it keeps when the tier is full. A block takes the tenant its
    deposit's (or fetch's) hints name ({"tenant": name}) and keeps it while
    KVCR holds it. With TenantLRUPolicy / G3TenantLRUPolicy a tenant over its
    quota has its own blocks evicted first, so one tenant's flood does not
    evict another's blocks within its quota; free slots are anyone's. Rules
    (checked by libkvcr, ValueError naming the rule): at most 64 tenants,
    names of 1..63 letters, digits, '_', '.', '-', unique; quotas together
    at most the tier's slots; g3_slots 0 without G3."""

    name: str
    dram_slots: int = 0
    g3_slots: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCRLimits:
    """KVCR's own: libkvcr's bounds (kvcr_limits), so that a
    flooding peer or a caller that stops polling meets a clear refusal
    instead of exhausting memory; defaults from libkvcr, ranges checked by
    libkvcr (ValueError naming the limit).

    `max_source_writes_per_peer` / `max_source_writes` — a peer's pull over
    either is refused (its entries fail with reason "SOURCE_BUSY", nothing
    is written); `max_pin_requests` — pending request_pin calls, beyond which
    a peer's pull that needs a pin is refused the same way;
    `max_control_message_bytes` — larger control messages are never
    received; `max_hint_bytes` / `max_hinted_requests` — submit_hint refuses
    a longer hint or one more kept request; `max_unpolled_operations` —
    deposit/deliver/fetch are refused while that many operations are
    pending or completed and not yet collected by poll_completed (no
    completion is ever dropped); `max_peers` — peers in the peer tier's
    table (as a source: targets with a route and a UCX endpoint; as a
    target: sources with a record): a target beyond it is refused (its
    pulls fail "SOURCE_BUSY"); `peer_idle_ms` — a peer unused that long is
    reclaimed (its endpoint closed; never while a transfer is on it).
    Refusals raise RuntimeError with libkvcr's
    message and are counted in telemetry (kvcr_limit_refusals_total{limit})."""

    max_source_writes_per_peer: int = _default("limits.max_source_writes_per_peer")
    max_source_writes: int = _default("limits.max_source_writes")
    max_pin_requests: int = _default("limits.max_pin_requests")
    max_control_message_bytes: int = _default("limits.max_control_message_bytes")
    max_hint_bytes: int = _default("limits.max_hint_bytes")
    max_hinted_requests: int = _default("limits.max_hinted_requests")
    max_unpolled_operations: int = _default("limits.max_unpolled_operations")
    max_peers: int = _default("max_peers")
    peer_idle_ms: int = _default("peer_idle_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class KVEventsOptions:
    """KVCR's own: KVCR's inventory published as KV events in the ZeroMQ wire
    format KV-aware routers read (vLLM's KV events, as Dynamo and llm-d
    consume them); libkvcr's kvcr_kv_events_options, defaults from libkvcr,
    values checked by libkvcr (ValueError naming the option).

    `endpoint` — the ZeroMQ PUB endpoint: bound when it holds "*", "::",
    "ipc://" or "inproc://" ("tcp://*:5557"), connected otherwise (a
    router's bound SUB socket). `replay_endpoint` — an optional ROUTER
    endpoint (always bound) answering an 8-byte start sequence with every
    kept batch from there. `topic` — the first frame, "kv@<pod>@<model>"
    for llm-d. `dp_rank` — the payload's data-parallel rank, at most
    2**31 - 1 (Dynamo reads it as a signed 32-bit integer; libkvcr checks).
    `buffer_batches` — batches kept for replay (10,000). Events wait at
    most `batch_interval_ms` and a batch holds at most `max_batch_events`;
    `max_queued_batches` bound what waits for the publisher's thread (a
    batch that finds them full, or a subscriber's queue full, is dropped
    and counted: the gauge kv_events_dropped_batches). `legacy_positional`
    — the older array form of events. `medium_dram` / `medium_g3` — the
    medium named for KVCR DRAM ("CPU") and G3 ("STORAGE").

    Events name blocks by their router hash: bindings.key_adapter.decode
    must give an int for every key to be announced. A block deposited
    without token ids (KVCR.deposit's router=, RouterBlock) is announced with its
    hashes only: llm-d then only updates where blocks it already knows
    live, Dynamo drops it (it computes its hashes from the tokens)."""

    endpoint: str
    replay_endpoint: Optional[str] = _default("kv_events.replay_endpoint")
    topic: str = _default("kv_events.topic")
    dp_rank: int = _default("kv_events.dp_rank")
    buffer_batches: int = _default("kv_events.buffer_batches")
    max_batch_events: int = _default("kv_events.max_batch_events")
    batch_interval_ms: int = _default("kv_events.batch_interval_ms")
    max_queued_batches: int = _default("kv_events.max_queued_batches")
    legacy_positional: bool = _default("kv_events.legacy_positional")
    medium_dram: str = _default("kv_events.medium_dram")
    medium_g3: str = _default("kv_events.medium_g3")


@dataclass(frozen=True)
class LocalDramOptions:
    """KVCR-owned DRAM: one (pool name, address, size) per pool_layouts
    entry, in any order. `backend` is a compatibility name: any non-empty
    name is accepted and none changes anything (KVCR's copy threads move
    the bytes; libkvcr's kvcr_config.local_dram_backend)."""

    pools: list  # [(pool_name, address, size_bytes)], one per pool_layouts entry
    backend: str = _default("local_dram_backend")


@dataclass(frozen=True)
class RemoteFWDramOptions:
    """Options of the peer-to-peer tier, which a framework_control turns on;
    libkvcr checks them with the tier on or off. `backend` names the
    transport: "UCX", the only one, is accepted (any other non-empty name
    only while the tier is off; then it is a compatibility name).

    KVCR's own: `curve_secret_key` turns CURVE on for the control channel
    (libkvcr's kvcr_curve_options; keys are 40-character Z85 strings,
    `kvcr keygen` prints a pair). `curve_public_key` may be left
    None (derived); `curve_allowed_keys` lists the peers' public keys. The
    control endpoint then ends in "#curve=<public key>", and only listed
    peers are talked to. libkvcr checks the keys (ValueError with its
    reason)."""

    eager_ctrl_connect: bool = _default("remote.eager_ctrl_connect")
    opportunistic_query: bool = _default("remote.opportunistic_query")
    metadata_retry_interval_ms: int = _default("remote.metadata_retry_interval_ms")
    backend: str = _default("remote.backend")
    curve_secret_key: Optional[str] = _default("remote.curve.secret_key")
    curve_public_key: Optional[str] = _default("remote.curve.public_key")
    curve_allowed_keys: Tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class G3Options:
    """The G3 tier: KVCR-owned slot files on local disk (libkvcr: O_DIRECT on
    io_uring, one slot per block of the single pool's block size).

    `paths` (str or os.PathLike, expanded and resolved) name one slot file
    each; missing files and directories are created, existing ones are
    found again (warm restart). `capacity_bytes_per_file` is the data
    capacity of each file, in whole slots. `backend` is a compatibility
    name: any non-empty name ("GDS_MT", "GDS", "POSIX", ...) is accepted and
    libkvcr serves every one with io_uring. `backend_options` must map str
    to str; io_uring takes no options, so a non-empty mapping is logged as
    ignored.

    KVCR's own (libkvcr's kvcr_g3_options, defaults from libkvcr):
    `queue_depth` — I/O requests in flight (1..1024); `max_staging_bytes` —
    DRAM held by spills while they are written (> 0)."""

    paths: Tuple[Path, ...]
    capacity_bytes_per_file: int
    backend: str = "GDS_MT"
    backend_options: Mapping[str, str] = field(default_factory=dict)
    queue_depth: int = _default("g3.queue_depth")
    max_staging_bytes: int = _default("g3.max_staging_bytes")


@dataclass(frozen=True)
class FrameworkDramInput:
    """The first API's framework memory: one DRAM range (address, length) of
    whole blocks of the single pool, referenced by MemDescriptor (vLLM 0.30
    and 0.31 adapters). KVCR registers it as one region (kvcr.compat); new
    code registers framework_regions of RegionDescriptor instead."""

    address: int
    length: int


@dataclass(frozen=True)
class KVCRBackendConfigs:
    framework_dram: Optional[FrameworkDramInput] = None
    framework_regions: tuple = ()  # RegionDescriptor values
    local_dram: Optional[LocalDramOptions] = None
    g3: Optional[G3Options] = None
    remote_fw_dram: RemoteFWDramOptions = field(default_factory=RemoteFWDramOptions)


@dataclass(frozen=True)
class KVCRGuardConfig:
    """Guard mode: KVCR DRAM comes from pool group
    `guard_index` of the node's KVCR service (`kvcr service`), claimed over
    its Unix socket `kvcr_service_socket_path`, instead of local_dram.
    Every committed block is journalled for the group's Guard: when this
    process dies the Guard keeps the blocks (and, with the peer tier, serves
    them on this worker's control endpoint, which the service owns), and the
    next KVCR claiming the same group gets them back.

    `compatibility_digest` must equal the service's
    --compatibility-digest byte for byte: change it whenever the model or
    the KV layout changes. Like the other records it is checked by
    `KVCR(...)` before anything is contacted: the socket path a str (or
    os.PathLike of str) of 1..107 bytes without NUL, guard_index an int in
    [0, 2**32), the digest a str of 1..256 bytes without NUL (the types
    here, the lengths by libkvcr)."""

    kvcr_service_socket_path: str
    guard_index: int
    compatibility_digest: str


class KeyAdapter(Protocol):
    """How KVCR learns a key's router hash (the hash hints and KV events
    name): `decode(key)`, or under its newer name `encode_to_router(key)`
    (vLLM 0.34's adapter), an int or hash bytes. The framework-side
    conversions (encode / decode_from_framework and their inverses) are
    the framework's own; KVCR never calls them."""

    def decode(self, key: BlockKey) -> "int | bytes": ...


class FrameworkControl(Protocol):
    def send(self, endpoint: str, message: bytes) -> bool: ...

    def recv(self) -> list: ...


class TelemetryStats(Protocol):
    def increase_counter(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def set_gauge(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def observe_histogram(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...


InventorySink = Callable[[InventoryEvent], None]


# ---- arguments for kvcr._native (built by KVCR before anything starts) ------
#
# Each rule has one home. libkvcr checks the values (src/api/config.c and
# its options table, the G3 path rule, src/client/client.c) and its
# kvcr_last_error() text is the message raised. Here: the types of the
# fields, values a C field cannot hold, the fields libkvcr does not have
# (the framework_control endpoint; the inherited names are kvcr.compat's),
# memory type names, and "~" in G3 paths.

_I32_MIN, _I32_MAX = -2**31, 2**31 - 1


def _int(name: str, value: Any) -> int:
    if type(value) is not int:  # bool is refused on purpose
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def _c_int(name: str, value: Any, lo: int, hi: int) -> int:
    """`value` for a C integer field that holds lo..hi, where every such
    value reaches libkvcr's rule (or is valid)."""
    if not lo <= _int(name, value) <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _c_uint(name: str, value: Any, top: int, clamp: bool = False) -> int:
    """`value` for a C unsigned field of 0..`top` whose libkvcr rule refuses
    0: a negative becomes 0, so that libkvcr names the rule it breaks. Over
    `top`: with `clamp` (the field's rule refuses `top` as well, without
    quoting the value) `top`, for the same reason; else ValueError here,
    since only Python sees a value the field cannot hold."""
    if _int(name, value) > top and not clamp:
        raise ValueError(f"{name} must be at most {top}")
    return min(max(value, 0), top)


def _c_str(name: str, value: Any) -> str:
    """A str for a C string: its length and content rules are libkvcr's, but
    a NUL would end it early."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{name} must not contain NUL")
    return value


def _c_float(name: str, value: Any) -> float:
    if type(value) not in (int, float):
        raise TypeError(f"{name} must be an int or float, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        return math.inf  # outside every range libkvcr accepts


def config_args(config: KVCRConfig) -> dict:
    """KVCRConfig as kvcr._native.Instance's arguments (its options by path
    in "options"); the inherited names libkvcr has no field for are
    kvcr.compat's."""
    layouts = config.pool_layouts
    if not isinstance(layouts, (list, tuple)) or not all(
            isinstance(e, tuple) and len(e) == 2 for e in layouts):
        raise TypeError("pool_layouts must be a list of (pool name, block size) tuples")
    limits = config.limits
    if not isinstance(limits, KVCRLimits):
        raise TypeError("limits must be a KVCRLimits")
    options = _bound(
        config,
        operation_timeout_ms=_c_uint("operation_timeout_ms", config.operation_timeout_ms,
                                     _top("operation_timeout_ms")),
        abandon_timeout_ms=_c_uint("abandon_timeout_ms", config.abandon_timeout_ms,
                                   _top("abandon_timeout_ms")),
        capacity_low_watermark_percent=_c_float("capacity_low_watermark_percent",
                                                config.capacity_low_watermark_percent),
        copy_threads=_c_uint("copy_threads", config.copy_threads, _top("copy_threads"),
                             clamp=True))
    # libkvcr's messages quote these values: they reach it as given or not at all.
    options.update({path: _c_int("limits." + OPTIONS[path]["py"].split(".")[1], value, 0,
                                 _top(path))
                    for path, value in _bound(limits).items()})
    return dict(
        agent_name=_c_str("nixl_agent_name", config.nixl_agent_name),
        pool_layouts=[dict(name=_c_str("pool_layouts pool name", name),
                           block_size=_c_uint("pool_layouts block size", size, _U64_MAX))
                      for name, size in layouts],
        options=options,
        tenants=_tenants_args(config.tenants),
    )


def _tenants_args(tenants) -> tuple:
    if not isinstance(tenants, (list, tuple)) or not all(
            isinstance(t, TenantQuota) for t in tenants):
        raise TypeError("tenants must be a list of TenantQuota")
    return tuple(dict(name=_c_str("tenant name", t.name),
                      dram_slots=_c_int(f"tenant {t.name!r} dram_slots", t.dram_slots, 0,
                                        _U64_MAX),
                      g3_slots=_c_int(f"tenant {t.name!r} g3_slots", t.g3_slots, 0, _U64_MAX))
                 for t in tenants)


def kv_events_args(events: Optional[KVEventsOptions]) -> dict:
    """KVEventsOptions as options by path (kv_events.*); {}: off."""
    if events is None:
        return {}
    if not isinstance(events, KVEventsOptions):
        raise TypeError("config.kv_events must be a KVEventsOptions or None")
    optional = {f.name for f in fields(events) if f.default is None}
    checked = {}
    for path, value in _bound(events).items():
        name = OPTIONS[path]["label"]
        if OPTIONS[path]["type"] == "str":
            field_name = OPTIONS[path]["py"].split(".")[1]
            checked[path] = None if value is None and field_name in optional \
                else _c_str(name, value)
        elif OPTIONS[path]["type"] == "bool":
            checked[path] = bool(value)
        else:
            checked[path] = _c_int(name, value, 0, _top(path))
    return checked


def local_dram_args(local: LocalDramOptions) -> tuple:
    """(pools as dicts by kvcr_dram_pool's field names, options by path)
    for kvcr._native.Instance."""
    if not isinstance(local, LocalDramOptions):
        raise TypeError("backend_configs.local_dram must be a LocalDramOptions")
    pools = local.pools
    if not isinstance(pools, (list, tuple)) or not all(
            isinstance(p, tuple) and len(p) == 3 for p in pools):
        raise TypeError("local DRAM pools must be (name, address, size) tuples")
    return ([dict(name=_c_str("local DRAM pool name", name),
                  addr=_c_uint("local DRAM address", address, _U64_MAX),
                  size=_c_uint("local DRAM pool size", size, _U64_MAX))
             for name, address, size in pools],
            _bound(local, backend=_c_str("local DRAM backend", local.backend)))


def _region(region: Any) -> dict:
    if not isinstance(region, RegionDescriptor):
        raise TypeError("framework_regions must contain RegionDescriptor values")
    if region.mem_type not in _KVCR_MEM_TYPE:
        raise ValueError("framework region mem_type must be one of ['DRAM', 'VRAM'], "
                         f"got {region.mem_type!r}")
    return dict(addr=_c_uint("framework region address", region.addr, _U64_MAX),
                element_size=_c_uint("framework region size", region.size, _U64_MAX),
                count=_c_uint("framework region count", region.count, _U64_MAX),
                stride=_c_int("framework region stride", region.stride, 0, _U64_MAX),
                label=_c_str("framework region label", region.label),
                mem_type=_KVCR_MEM_TYPE[region.mem_type],
                device_id=_c_int("framework region device_id", region.device_Id, _I32_MIN,
                                 _I32_MAX))


def region_args(backends: KVCRBackendConfigs, legacy=None) -> list:
    """framework_regions (or the region `legacy`, kvcr.compat's, made of
    framework_dram) as kvcr._native.Instance's records, dicts by
    kvcr_region's field names."""
    if backends.framework_dram is not None and backends.framework_regions:
        raise ValueError("configure either framework_dram or framework_regions, not both")
    regions = backends.framework_regions if legacy is None else [legacy]
    if isinstance(regions, (str, bytes)) or not hasattr(regions, "__iter__"):
        raise TypeError("framework_regions must contain RegionDescriptor values")
    return [_region(r) for r in regions]


def remote_args(remote: RemoteFWDramOptions, endpoint: Optional[tuple]) -> tuple:
    """(options by path, CURVE allowed keys) for kvcr._native.Instance:
    libkvcr checks these options with the tier on or off; `endpoint`
    (control_endpoint's triple, or None) turns it on."""
    if not isinstance(remote, RemoteFWDramOptions):
        raise TypeError("backend_configs.remote_fw_dram must be a RemoteFWDramOptions")
    for name in ("curve_secret_key", "curve_public_key"):
        if not isinstance(getattr(remote, name), (str, type(None))):
            raise TypeError(f"{name} must be a str (Z85) or None")
    allowed = remote.curve_allowed_keys
    if isinstance(allowed, (str, bytes)) or not all(isinstance(k, str) for k in allowed):
        raise TypeError("curve_allowed_keys must be a sequence of str (Z85 public keys)")
    options = _bound(
        remote, eager_ctrl_connect=bool(remote.eager_ctrl_connect),
        opportunistic_query=bool(remote.opportunistic_query),
        metadata_retry_interval_ms=_c_uint("metadata_retry_interval_ms",
                                           remote.metadata_retry_interval_ms,
                                           _top("remote.metadata_retry_interval_ms")),
        backend=_c_str("remote backend", remote.backend))
    if endpoint is not None:
        host, port, advertise = endpoint
        options.update({"remote.enabled": True, "remote.control_host": host,
                        "remote.control_port": port, "remote.advertise_host": advertise})
    return options, tuple(allowed)


def control_endpoint(control: Any) -> Tuple[str, int, str]:
    """(bind host, bind port, advertise host) of a framework_control: its
    bind_host / bind_port / advertise_host attributes (ZmqPeerControlChannel),
    else its `endpoint` "tcp://host:port", bound and advertised as is.
    libkvcr checks the hosts themselves (a host name or IPv4 address)."""
    host = getattr(control, "bind_host", None)
    port = getattr(control, "bind_port", None)
    if host is None or port is None:
        endpoint = getattr(control, "endpoint", None)
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
            raise TypeError("framework_control must describe its endpoint: bind_host, bind_port "
                            "(and advertise_host), or endpoint 'tcp://host:port'")
        host, sep, port_text = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not host or not port_text.isdigit():
            raise ValueError(f"framework_control endpoint {endpoint!r} is not 'tcp://host:port'")
        port = int(port_text)
        advertise = host
    else:
        advertise = getattr(control, "advertise_host", None) or host
    if not isinstance(host, str) or not host or not isinstance(advertise, str):
        raise ValueError("framework_control hosts must be non-empty strings")
    if type(port) is not int or not 0 <= port <= 65535:
        raise ValueError("control port must be between 1 and 65535 (or 0: any free port)")
    return host, port, advertise


def _g3_path(i: int, p: Any) -> str:
    """Path `i` with "~" expanded, as libkvcr gets it (which resolves it:
    the G3 path rule is libkvcr's, src/tiers/g3_store.h g3_paths_check)."""
    if isinstance(p, (str, os.PathLike)):
        s = os.fspath(p)
        if isinstance(s, str):
            return os.path.expanduser(_c_str(f"G3 file path {i}", s))
    raise TypeError(f"G3 file paths must be str or os.PathLike of str, not {type(p).__name__}")


def g3_args(g3: G3Options, block_size: int) -> tuple:
    """G3Options as kvcr._native.Instance's (paths, options by path).

    The paths are expanded ("~") here; libkvcr checks the rest before it
    opens the files: the G3 path rule (an empty path list or path, two
    paths spelled alike, "G3 file paths must be unique", or resolving to
    one file, "... must not alias the same file", without touching the
    disk), the slot size, the capacity, an empty backend name, queue_depth
    and max_staging_bytes; then hard links to one file, file systems
    without O_DIRECT (tmpfs), files in use or of another layout.
    `block_size` is the single pool's (as passed to libkvcr)."""
    if not isinstance(g3, G3Options):
        raise TypeError("backend_configs.g3 must be a G3Options")
    paths = g3.paths
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, (list, tuple)):
        raise TypeError("G3 paths must be a tuple (or list) of file paths, not "
                        f"{type(paths).__name__}")
    expanded = tuple(_g3_path(i, p) for i, p in enumerate(paths))
    backend = _c_str("G3 backend", g3.backend)
    # The largest whole number of slots a u64 holds breaks libkvcr's 2^56 bound.
    top = _U64_MAX // block_size * block_size if block_size > 0 else _U64_MAX
    options = _bound(
        g3,
        capacity_bytes_per_file=_c_uint("G3 capacity_bytes_per_file", g3.capacity_bytes_per_file,
                                        top, clamp=True),
        queue_depth=_c_uint("G3 queue_depth", g3.queue_depth, _top("g3.queue_depth"),
                            clamp=True),
        # More than a u64 is just "unbounded".
        max_staging_bytes=_c_uint("G3 max_staging_bytes", g3.max_staging_bytes,
                                  _top("g3.max_staging_bytes"), clamp=True))
    # Python's compatibility default ("GDS_MT") is not libkvcr's: no `py` row.
    options["g3.backend"] = backend
    return expanded, options


def guard_args(guard: KVCRGuardConfig) -> dict:
    """Guard mode's options by path (guard.*) for kvcr._native.Instance.
    libkvcr checks the path and digest lengths, and the conflict with
    local_dram, before it contacts the service; the service checks the rest
    (index range, digest match)."""
    path = guard.kvcr_service_socket_path
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    return _bound(
        guard,
        kvcr_service_socket_path=_c_str("guard_config.kvcr_service_socket_path", path),
        guard_index=_c_int("guard_config.guard_index", guard.guard_index, 0,
                           _top("guard.guard_index")),
        compatibility_digest=_c_str("guard_config.compatibility_digest",
                                    guard.compatibility_digest))
