"""Configuration records (frozen dataclasses) with the reference's fields,
defaults and messages.

The records themselves do not validate: `KVCR(...)` checks everything, in
the reference's order, before anything starts (api_spec §3.1). Rules that
libkvcr knows are checked by libkvcr again with the same messages; the
ones it cannot see (the guard, the NIXL listen port, Python types, G3 path
spelling) are checked only here, and some G3 rules only by libkvcr (see
check_g3)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol, Tuple

from . import _native
from .types import BlockKey, CacheTier, InventoryEvent, RegionDescriptor

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
FRAMEWORK_MEMORY_TYPES = frozenset({"DRAM", "VRAM"})


@dataclass(frozen=True)
class KVCRConfig:
    nixl_agent_name: str
    pool_layouts: list  # [(pool_name, block_size_bytes)]
    enable_telemetry: bool = False
    operation_timeout_ms: int = 1000
    abandon_timeout_ms: int = 5000
    capacity_low_watermark_percent: float = 0
    nixl_listen_port: Optional[int] = None
    # Not in the reference: libkvcr's copy threads (1..64).
    copy_threads: int = 2
    # Not in the reference: libkvcr's resource limits (see KVCRLimits).
    limits: "KVCRLimits" = field(default_factory=lambda: KVCRLimits())


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCRLimits:
    """Not in the reference: libkvcr's bounds (kvcr_limits), so that a
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
    completion is ever dropped). Refusals raise RuntimeError with libkvcr's
    message and are counted in telemetry (kvcr_limit_refusals{limit})."""

    max_source_writes_per_peer: int = _native.LIMIT_DEFAULTS["max_source_writes_per_peer"]
    max_source_writes: int = _native.LIMIT_DEFAULTS["max_source_writes"]
    max_pin_requests: int = _native.LIMIT_DEFAULTS["max_pin_requests"]
    max_control_message_bytes: int = _native.LIMIT_DEFAULTS["max_control_message_bytes"]
    max_hint_bytes: int = _native.LIMIT_DEFAULTS["max_hint_bytes"]
    max_hinted_requests: int = _native.LIMIT_DEFAULTS["max_hinted_requests"]
    max_unpolled_operations: int = _native.LIMIT_DEFAULTS["max_unpolled_operations"]

    def as_tuple(self) -> tuple:
        """The fields in kvcr_limits' order, as kvcr._native takes them."""
        return (self.max_source_writes_per_peer, self.max_source_writes, self.max_pin_requests,
                self.max_control_message_bytes, self.max_hint_bytes, self.max_hinted_requests,
                self.max_unpolled_operations)


@dataclass(frozen=True)
class LocalDramOptions:
    pools: list  # [(pool_name, address, size_bytes)], one per pool_layouts entry
    backend: str = "UCX"


@dataclass(frozen=True)
class RemoteFWDramOptions:
    """Not in the reference: `curve_secret_key` turns CURVE on for the
    control channel (libkvcr's kvcr_curve_options; keys are 40-character
    Z85 strings, `kvcr keygen` prints a pair). `curve_public_key` may be left
    None (derived); `curve_allowed_keys` lists the peers' public keys. The
    control endpoint then ends in "#curve=<public key>", and only listed
    peers are talked to. libkvcr checks the keys (ValueError with its
    reason)."""

    eager_ctrl_connect: bool = True
    opportunistic_query: bool = False
    metadata_retry_interval_ms: int = 100
    backend: str = "UCX"
    curve_secret_key: Optional[str] = None
    curve_public_key: Optional[str] = None
    curve_allowed_keys: Tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class G3Options:
    """The G3 tier: KVCR-owned slot files on local disk (libkvcr: O_DIRECT on
    io_uring, one slot per block of the single pool's block size).

    `paths` (str or os.PathLike, expanded and resolved) name one slot file
    each; missing files and directories are created, existing ones are
    found again (warm restart). `capacity_bytes_per_file` is the data
    capacity of each file, in whole slots. `backend` may be any non-empty
    name (the reference's "GDS_MT", "GDS", "POSIX", ...): libkvcr serves
    every one with io_uring. `backend_options` must map str to str; io_uring
    takes no options, so a non-empty mapping is logged as ignored.

    Not in the reference (libkvcr's kvcr_g3_options, defaults from libkvcr):
    `queue_depth` — I/O requests in flight (1..1024); `max_staging_bytes` —
    DRAM held by spills while they are written (> 0)."""

    paths: Tuple[Path, ...]
    capacity_bytes_per_file: int
    backend: str = "GDS_MT"
    backend_options: Mapping[str, str] = field(default_factory=dict)
    queue_depth: int = _native.G3_QUEUE_DEPTH
    max_staging_bytes: int = _native.G3_MAX_STAGING_BYTES


@dataclass(frozen=True)
class FrameworkDramInput:
    """Legacy single framework region (address, length). Not supported by
    this build: register framework_regions of RegionDescriptor instead."""

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
    """Guard mode (api_spec §3.3): KVCR DRAM comes from pool group
    `guard_index` of the node's KVCR service (`kvcr service`), claimed over
    its Unix socket `kvcr_service_socket_path`, instead of local_dram.
    Every committed block is journalled for the group's Guard: when this
    process dies the Guard keeps the blocks (and, with the peer tier, serves
    them on this worker's control endpoint, which the service owns), and the
    next KVCR claiming the same group gets them back.

    `compatibility_digest` must equal the service's
    --compatibility-digest byte for byte: change it whenever the model or
    the KV layout changes. Like the other records it is checked by
    `KVCR(...)` (check_guard), before anything is contacted: the socket
    path a non-empty str (or os.PathLike of str) of at most 107 bytes
    without NUL, guard_index an int in [0, 2**32), the digest a str of
    1..256 bytes without NUL."""

    kvcr_service_socket_path: str
    guard_index: int
    compatibility_digest: str


class KeyAdapter(Protocol):
    def encode(self, framework_key: Any) -> BlockKey: ...

    def decode(self, key: BlockKey) -> "int | bytes": ...


class FrameworkControl(Protocol):
    def send(self, endpoint: str, message: bytes) -> bool: ...

    def recv(self) -> list: ...


class TelemetryStats(Protocol):
    def increase_counter(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def set_gauge(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def observe_histogram(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...


InventorySink = Callable[[InventoryEvent], None]


# ---- validation (called by KVCR before anything starts) --------------------

def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is rejected on purpose


def check_config(config: KVCRConfig) -> None:
    """api_spec §3.1 rules 1-8, plus the agent name and the listen port."""
    name = config.nixl_agent_name
    if not isinstance(name, str) or not name:
        raise ValueError("nixl_agent_name must be a non-empty string")
    if len(name.encode()) >= 128 or "\0" in name:
        raise ValueError("nixl_agent_name must be shorter than 128 bytes, without NUL")
    layouts = config.pool_layouts
    if not isinstance(layouts, (list, tuple)) or not layouts:
        raise ValueError("pool_layouts must contain at least one pool")
    for entry in layouts:
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise ValueError("pool_layouts entries must be (pool name, block size) tuples")
        if not isinstance(entry[0], str):
            raise ValueError("pool_layouts pool name must be a string")
        if len(entry[0].encode()) >= 128 or "\0" in entry[0]:
            raise ValueError("pool_layouts pool name must be shorter than 128 bytes, without NUL")
    for _, size in layouts:
        if not _is_int(size) or size <= 0:
            raise ValueError("pool_layouts block size must be a positive integer")
    names = [n for n, _ in layouts]
    if len(set(names)) != len(names):
        raise ValueError("pool_layouts pool names must be unique")
    if len(names) > 1 and "" in names:
        raise ValueError("pool_layouts cannot use an empty name with multiple pools")
    if len(names) > 64:
        raise ValueError("pool_layouts may hold at most 64 pools")
    op = config.operation_timeout_ms
    if not _is_int(op) or op <= 0:
        raise ValueError("operation_timeout_ms must be positive")
    if op > _U32_MAX:
        raise ValueError(f"operation_timeout_ms must be at most {_U32_MAX}")
    ab = config.abandon_timeout_ms
    if not _is_int(ab) or ab < 2 * op:
        raise ValueError("abandon_timeout_ms must be at least twice operation_timeout_ms")
    if ab > _U32_MAX:
        raise ValueError(f"abandon_timeout_ms must be at most {_U32_MAX}")
    w = config.capacity_low_watermark_percent
    if type(w) not in (int, float) or not (0 <= w <= 100):  # NaN fails the range
        raise ValueError("capacity_low_watermark_percent must be between 0 and 100")
    port = config.nixl_listen_port
    if port is not None and (not _is_int(port) or not 1 <= port <= 65535):
        raise ValueError("nixl_listen_port must be between 1 and 65535")
    if not _is_int(config.copy_threads) or not 1 <= config.copy_threads <= 64:
        raise ValueError("copy_threads must be between 1 and 64")
    limits = config.limits
    if not isinstance(limits, KVCRLimits):
        raise TypeError("limits must be a KVCRLimits")
    for name, value in zip(KVCRLimits.__slots__, limits.as_tuple()):
        if not _is_int(value) or not 0 <= value <= _U32_MAX:  # ranges: libkvcr's message
            raise ValueError(f"limits.{name} must be an int of 0..{_U32_MAX}")


def check_local_dram(local: LocalDramOptions, layouts: list) -> list:
    """LocalDramOptions rules (api_spec §3.2), in the reference's order.
    Returns the pools in pool_layouts order, as libkvcr wants them."""
    if not isinstance(local, LocalDramOptions):
        raise TypeError("backend_configs.local_dram must be a LocalDramOptions")
    if not isinstance(local.backend, str) or not local.backend:
        raise ValueError("local DRAM NIXL backend must be non-empty")
    pools = local.pools
    if not isinstance(pools, (list, tuple)) or not all(
            isinstance(p, tuple) and len(p) == 3 for p in pools):
        raise TypeError("local DRAM pools must be (name, address, size) tuples")
    if not all(isinstance(p[0], str) for p in pools):
        raise ValueError("local DRAM pool name must be a string")
    names = [p[0] for p in pools]
    if len(set(names)) != len(names):
        raise ValueError("local DRAM pool names must be unique")
    if set(names) != {n for n, _ in layouts}:
        raise ValueError("local DRAM pool names must exactly match pool_layouts")
    for _, address, size in pools:
        if not _is_int(address) or address <= 0:
            raise ValueError("local DRAM address must be a positive integer")
        if not _is_int(size) or size <= 0:
            raise ValueError("local DRAM pool size must be a positive integer")
    spans = sorted((a, a + s) for _, a, s in pools)
    if any(prev[1] > nxt[0] for prev, nxt in zip(spans, spans[1:])):
        raise ValueError("local DRAM pool memory regions must not overlap")
    by_name = {p[0]: p for p in pools}
    for name, block in layouts:
        size = by_name[name][2]
        if size % block:
            raise ValueError(f"local DRAM pool '{name}' size must contain complete blocks")
        if size // block == 0:
            raise ValueError(f"local DRAM pool '{name}' must hold at least one block")
    return [by_name[name] for name, _ in layouts]


def check_region(region: Any) -> RegionDescriptor:
    """The record-level rules for one framework region. Labels naming a
    pool, duplicates and overlaps are libkvcr's (same messages)."""
    if not isinstance(region, RegionDescriptor):
        raise TypeError("framework_regions must contain RegionDescriptor values")
    if not _is_int(region.addr) or region.addr <= 0:
        raise ValueError("framework region address must be a positive integer")
    if not _is_int(region.size) or region.size <= 0:
        raise ValueError("framework region size must be a positive integer")
    if not _is_int(region.count) or region.count <= 0:
        raise ValueError("framework region count must be a positive integer")
    if not _is_int(region.stride) or (region.stride != 0 and region.stride < region.size):
        raise ValueError("framework region stride must be 0 or at least its size")
    if region.mem_type not in FRAMEWORK_MEMORY_TYPES:
        raise ValueError("framework region mem_type must be one of ['DRAM', 'VRAM'], "
                         f"got '{region.mem_type}'")
    if not _is_int(region.device_Id) or region.device_Id < 0:
        raise ValueError("framework region device_id must be a non-negative int")
    if not isinstance(region.label, str) or len(region.label.encode()) >= 128 \
            or "\0" in region.label:
        raise ValueError("framework region label must be a string shorter than 128 bytes")
    span = (region.stride or region.size) * (region.count - 1) + region.size
    if region.addr + span > 2**64:
        raise ValueError("framework region does not fit in the address space")
    return region


def check_regions(backends: KVCRBackendConfigs) -> list:
    if backends.framework_dram is not None and backends.framework_regions:
        raise ValueError("configure either framework_dram or framework_regions, not both")
    regions = backends.framework_regions
    if isinstance(regions, (str, bytes)) or not hasattr(regions, "__iter__"):
        raise TypeError("framework_regions must contain RegionDescriptor values")
    return [check_region(r) for r in regions]


def check_remote(remote: RemoteFWDramOptions) -> None:
    if not isinstance(remote, RemoteFWDramOptions):
        raise TypeError("backend_configs.remote_fw_dram must be a RemoteFWDramOptions")
    if not _is_int(remote.metadata_retry_interval_ms) or remote.metadata_retry_interval_ms <= 0:
        raise ValueError("metadata_retry_interval_ms must be positive")
    if remote.metadata_retry_interval_ms > _U32_MAX:
        raise ValueError(f"metadata_retry_interval_ms must be at most {_U32_MAX}")
    if not isinstance(remote.backend, str) or not remote.backend:
        raise ValueError("remote framework DRAM NIXL backend must be non-empty")
    for name in ("curve_secret_key", "curve_public_key"):
        if not isinstance(getattr(remote, name), (str, type(None))):
            raise TypeError(f"{name} must be a str (Z85) or None")
    allowed = remote.curve_allowed_keys
    if isinstance(allowed, (str, bytes)) or not all(isinstance(k, str) for k in allowed):
        raise TypeError("curve_allowed_keys must be a sequence of str (Z85 public keys)")
    if remote.curve_secret_key is None and (remote.curve_public_key is not None or allowed):
        raise ValueError("curve_public_key or curve_allowed_keys given without curve_secret_key")


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
    if not _is_int(port) or not 0 <= port <= 65535:
        raise ValueError("control port must be between 1 and 65535 (or 0: any free port)")
    return host, port, advertise


def _c_range(value: int, top: int) -> int:
    """`value` clamped into [0, top], so that a C field can hold it. libkvcr's
    rule for the field then refuses an out-of-range value with its own
    message: a negative becomes 0, which breaks every lower bound, and the
    caller picks `top` to break the upper bound where there is one
    (max_staging_bytes has none: more than a u64 is just "unbounded")."""
    return min(max(value, 0), top)


def _g3_path(i: int, p: Any) -> str:
    if isinstance(p, (str, os.PathLike)):
        s = os.fspath(p)
        if isinstance(s, str):
            if not s:
                raise ValueError(f"G3 file path {i} must be a non-empty string")
            if "\0" in s:
                raise ValueError(f"G3 file path {i} must not contain NUL")
            return os.path.expanduser(s)
    raise TypeError(f"G3 file paths must be str or os.PathLike of str, not {type(p).__name__}")


def check_g3(g3: G3Options, layouts: list) -> tuple:
    """The G3 rules that need no file system (api_spec §3.2), and the
    arguments of kvcr._native.Instance(g3=...): (resolved paths,
    capacity, backend, queue_depth, max_staging_bytes).

    Here: types; paths empty, duplicated ("G3 file paths must be unique")
    or resolving to one file ("... must not alias the same file") — with
    the reference's messages and before anything touches the disk. Paths
    are expanded (~) and resolved (realpath) as the reference does, and
    handed to libkvcr resolved. libkvcr checks the rest when KVCR(...)
    opens the files, with its messages: the slot size ("G3 slot size must
    be positive and page aligned"), the capacity ("G3 file capacity must
    contain complete slots", "... at most 2^56 bytes"), an empty backend,
    queue_depth and max_staging_bytes, hard links to one file, file
    systems without O_DIRECT (tmpfs), files in use or of another layout."""
    if not isinstance(g3, G3Options):
        raise TypeError("backend_configs.g3 must be a G3Options")
    paths = g3.paths
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, (list, tuple)):
        raise TypeError("G3 paths must be a tuple (or list) of file paths, not "
                        f"{type(paths).__name__}")
    if not paths:
        raise ValueError("G3 requires at least one file path")
    expanded = [_g3_path(i, p) for i, p in enumerate(paths)]
    if len(set(expanded)) != len(expanded):
        raise ValueError("G3 file paths must be unique")
    resolved = [os.path.realpath(p) for p in expanded]
    if len(set(resolved)) != len(resolved):
        raise ValueError("G3 file paths must not alias the same file")
    for name in ("capacity_bytes_per_file", "queue_depth", "max_staging_bytes"):
        if not _is_int(getattr(g3, name)):
            raise TypeError(f"G3 {name} must be an int, not "
                            f"{type(getattr(g3, name)).__name__}")
    if not isinstance(g3.backend, str):
        raise TypeError(f"G3 backend must be a str, not {type(g3.backend).__name__}")
    if "\0" in g3.backend:
        raise ValueError("G3 backend must not contain NUL")
    opts = g3.backend_options
    if not isinstance(opts, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in opts.items()):
        raise TypeError("G3 backend_options must map str to str")
    slot = layouts[0][1]
    # The largest whole number of slots a u64 holds breaks libkvcr's 2^56 bound.
    capacity = _c_range(g3.capacity_bytes_per_file, _U64_MAX // slot * slot)
    return (tuple(resolved), capacity, g3.backend, _c_range(g3.queue_depth, _U32_MAX),
            _c_range(g3.max_staging_bytes, _U64_MAX))


_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1
_DIGEST_MAX = 256    # the service's limit on compatibility digests


def check_guard(guard: KVCRGuardConfig) -> tuple:
    """The KVCRGuardConfig field rules; returns (socket path, guard_index,
    digest) for kvcr._native.Instance(guard=...). libkvcr checks the path
    and digest lengths again; the service checks the rest (index range,
    digest match)."""
    path = guard.kvcr_service_socket_path
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError("guard_config.kvcr_service_socket_path must be a str, not "
                        f"{type(guard.kvcr_service_socket_path).__name__}")
    if not path or "\0" in path or len(path.encode()) > _SUN_PATH_MAX:
        raise ValueError("guard_config.kvcr_service_socket_path must be a Unix socket path of "
                         f"1..{_SUN_PATH_MAX} bytes without NUL")
    index = guard.guard_index
    if not _is_int(index):
        raise TypeError(f"guard_config.guard_index must be an int, not {type(index).__name__}")
    if not 0 <= index <= _U32_MAX:
        raise ValueError(f"guard_config.guard_index must be between 0 and {_U32_MAX}, "
                         f"got {index}")
    digest = guard.compatibility_digest
    if not isinstance(digest, str):
        raise TypeError("guard_config.compatibility_digest must be a str, not "
                        f"{type(digest).__name__}")
    if not digest or "\0" in digest or len(digest.encode()) > _DIGEST_MAX:
        raise ValueError(f"guard_config.compatibility_digest must be 1..{_DIGEST_MAX} bytes "
                         "without NUL")
    return path, index, digest


def check_policy_tiers(policy: Any, has_local_dram: bool, has_g3: bool) -> None:
    """api_spec §7.1: "<PolicyClassName> requires configured <values>"."""
    configured = set()
    if has_local_dram:
        configured.add(CacheTier.LOCAL_G2)
    if has_g3:
        configured.add(CacheTier.G3)
    missing = set(getattr(policy, "required_tiers", ())) - configured
    if missing:
        values = ", ".join(sorted(t.value for t in missing))
        raise ValueError(f"{type(policy).__name__} requires configured {values}")
