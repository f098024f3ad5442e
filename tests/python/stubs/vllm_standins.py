"""Small stand-ins for the vLLM names kvcr.integrations.vllm imports.

vLLM cannot be installed here. These follow vLLM's shapes for exactly the
surface the adapter touches (see the module's imports) and nothing more."""
from __future__ import annotations

import enum
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from standin_modules import register_modules


class LookupResult(enum.Enum):
    HIT = "hit"
    HIT_PENDING = "hit_pending"
    RETRY = "retry"
    MISS = "miss"


class Medium(enum.Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


OffloadKey = bytes


def get_offload_block_hash(key: bytes) -> bytes:
    return bytes(key)[:-4]  # the last 4 bytes are the KV-cache group index


def make_offload_key(block_hash: bytes, group: int) -> bytes:
    return block_hash + group.to_bytes(4, "big")


def maybe_convert_block_hash(block_hash: bytes) -> int:
    return int.from_bytes(block_hash, "big") & (2**64 - 1)


@dataclass
class OffloadingEvent:
    keys: list
    medium: Medium
    removed: bool
    locality: Any = None
    ownership: Optional[str] = None
    removal_expected: bool = False


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Any = None
    kv_hints: Any = None


@dataclass
class RequestOffloadingContext:
    pass


@dataclass
class OffloadingMetricMetadata:
    documentation: str
    labelnames: tuple = ()


class OffloadingCounterMetadata(OffloadingMetricMetadata):
    pass


class OffloadingGaugeMetadata(OffloadingMetricMetadata):
    pass


class OffloadingHistogramMetadata(OffloadingMetricMetadata):
    pass


@dataclass
class TransferJob:
    job_id: int
    keys: list
    chunk_ids: list
    is_promotion: bool
    req_context: ReqContext


@dataclass
class JobResult:
    job_id: int
    success: bool
    successful_keys: Any = None


class ParentManager:
    """Interface only: tests pass their own."""


class SecondaryTierManager:
    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector=None) -> None:
        self.offloading_spec = offloading_spec
        self.primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.bp_detector = backpressure_detector
        self.block_size_bytes = primary_kv_view.nbytes // len(primary_kv_view)


class OffloadingConnectorStats:
    """Records what KVCR reports, sectioned like vLLM's stats."""

    def __init__(self) -> None:
        self.data: dict = {"counters": {}, "gauges": {}, "histograms": {}}

    def increase_counter(self, name, value, labelvalues=()):
        section = self.data["counters"].setdefault(name, {})
        section[tuple(labelvalues)] = section.get(tuple(labelvalues), 0) + value

    def set_gauge(self, name, value, labelvalues=()):
        self.data["gauges"].setdefault(name, {})[tuple(labelvalues)] = value

    def observe_histogram(self, name, value, labelvalues=()):
        self.data["histograms"].setdefault(name, {}).setdefault(tuple(labelvalues), []).append(value)

    def metric_sections(self):
        return list(self.data.values())

    def reduce(self) -> dict:
        out = {}
        for section in ("counters", "gauges"):
            for name, by_label in self.data[section].items():
                for labels, value in by_label.items():
                    out[f"{name}:{labels}"] = value
        for name, by_label in self.data["histograms"].items():
            for labels, values in by_label.items():
                out[f"{name}:{labels}"] = sum(values)
        return out

    def aggregate(self, other: "OffloadingConnectorStats") -> "OffloadingConnectorStats":
        for name, by_label in other.data["counters"].items():
            for labels, value in by_label.items():
                self.increase_counter(name, value, labels)
        for name, by_label in other.data["gauges"].items():
            for labels, value in by_label.items():
                self.set_gauge(name, value, labels)
        for name, by_label in other.data["histograms"].items():
            for labels, values in by_label.items():
                for v in values:
                    self.observe_histogram(name, v, labels)
        return self

    def is_empty(self) -> bool:
        return not any(self.data.values())


def resolve_obj_by_qualname(qualname: str):
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)


_MODULES = {
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics": {
        "OffloadingConnectorStats": OffloadingConnectorStats},
    "vllm.logger": {"init_logger": init_logger},
    "vllm.utils.import_utils": {"resolve_obj_by_qualname": resolve_obj_by_qualname},
    "vllm.v1.core.kv_cache_utils": {"BlockHash": bytes,
                                    "maybe_convert_block_hash": maybe_convert_block_hash},
    "vllm.v1.kv_offload.base": {
        "LookupResult": LookupResult, "Medium": Medium,
        "OffloadingCounterMetadata": OffloadingCounterMetadata,
        "OffloadingEvent": OffloadingEvent, "OffloadingGaugeMetadata": OffloadingGaugeMetadata,
        "OffloadingHistogramMetadata": OffloadingHistogramMetadata,
        "OffloadingMetricMetadata": OffloadingMetricMetadata, "OffloadKey": OffloadKey,
        "ReqContext": ReqContext, "RequestOffloadingContext": RequestOffloadingContext,
        "get_offload_block_hash": get_offload_block_hash},
    "vllm.v1.kv_offload.tiering.base": {
        "JobResult": JobResult, "ParentManager": ParentManager,
        "SecondaryTierManager": SecondaryTierManager, "TransferJob": TransferJob},
}


def install() -> None:
    """Registers the stand-in modules (and their parent packages)."""
    register_modules(_MODULES)
