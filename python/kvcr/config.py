"""Configuration records (frozen dataclasses) with the reference's fields,
defaults and messages. Record types are checked here; value rules are
checked by libkvcr when KVCR is constructed, in the reference's order and
with the same messages."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Tuple

from .types import RegionDescriptor


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is rejected on purpose


@dataclass(frozen=True)
class KVCRConfig:
    nixl_agent_name: str
    pool_layouts: list
    enable_telemetry: bool = False
    operation_timeout_ms: int = 1000
    abandon_timeout_ms: int = 5000
    capacity_low_watermark_percent: float = 0
    nixl_listen_port: Optional[int] = None
    copy_threads: int = 2


@dataclass(frozen=True)
class LocalDramOptions:
    pools: list
    backend: str = "UCX"

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError("local DRAM NIXL backend must be non-empty")
        for entry in self.pools:
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise TypeError("local DRAM pools must be (name, address, size) tuples")
            name, address, size = entry
            if not isinstance(name, str):
                raise ValueError("local DRAM pool name must be a string")
            if not _is_int(address) or address <= 0:
                raise ValueError("local DRAM address must be a positive integer")
            if not _is_int(size) or size <= 0:
                raise ValueError("local DRAM pool size must be a positive integer")
        names = [p[0] for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("local DRAM pool names must be unique")


@dataclass(frozen=True)
class RemoteFWDramOptions:
    eager_ctrl_connect: bool = True
    opportunistic_query: bool = False
    metadata_retry_interval_ms: int = 100
    backend: str = "UCX"

    def __post_init__(self) -> None:
        if not _is_int(self.metadata_retry_interval_ms) or self.metadata_retry_interval_ms <= 0:
            raise ValueError("metadata_retry_interval_ms must be positive")
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError("remote framework DRAM NIXL backend must be non-empty")


@dataclass(frozen=True, slots=True, kw_only=True)
class G3Options:
    paths: Tuple[Path, ...]
    capacity_bytes_per_file: int
    backend: str = "GDS_MT"
    backend_options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FrameworkDramInput:
    address: int
    length: int


@dataclass(frozen=True)
class KVCRBackendConfigs:
    framework_dram: Optional[FrameworkDramInput] = None
    framework_regions: tuple = ()
    local_dram: Optional[LocalDramOptions] = None
    g3: Optional[G3Options] = None
    remote_fw_dram: RemoteFWDramOptions = field(default_factory=RemoteFWDramOptions)


@dataclass(frozen=True)
class KVCRGuardConfig:
    kvcr_service_socket_path: str
    guard_index: int
    compatibility_digest: str


class KeyAdapter(Protocol):
    def encode(self, framework_key: Any) -> bytes: ...

    def decode(self, key: bytes) -> Any: ...


class FrameworkControl(Protocol):
    def send(self, endpoint: str, message: bytes) -> bool: ...

    def recv(self) -> list: ...


class TelemetryStats(Protocol):
    def increase_counter(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def set_gauge(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...

    def observe_histogram(self, name: str, value: float, labelvalues: tuple = ()) -> None: ...


def check_region(region: Any) -> RegionDescriptor:
    """The record-level rules for one framework region."""
    if not isinstance(region, RegionDescriptor):
        raise TypeError("framework_regions must contain RegionDescriptor values")
    if not _is_int(region.addr) or region.addr <= 0:
        raise ValueError("framework region address must be a positive integer")
    for name in ("size", "count"):
        if not _is_int(getattr(region, name)) or getattr(region, name) <= 0:
            raise ValueError(f"framework region {name} must be a positive integer")
    if not _is_int(region.stride) or region.stride < 0:
        raise ValueError("framework region stride must be 0 or at least its size")
    if region.mem_type not in ("DRAM", "VRAM"):
        raise ValueError(
            f"framework region mem_type must be one of ['DRAM', 'VRAM'], got '{region.mem_type}'")
    if not _is_int(region.device_Id) or region.device_Id < 0:
        raise ValueError("framework region device_id must be a non-negative int")
    if not isinstance(region.label, str):
        raise ValueError("framework region label must be a string")
    return region
