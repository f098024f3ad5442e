"""Value types shared by the KVCR API (names and shapes frameworks use)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, NewType, Optional, Tuple, Union

BlockKey = NewType("BlockKey", bytes)
PinHandle = str
PinRequestId = NewType("PinRequestId", int)
OpHandle = int
ReleaseHandle = NewType("ReleaseHandle", int)
ReleaseResult = Tuple[ReleaseHandle, bool]
LocalDramRegions = list  # [(pool_name, address, size_bytes)]
PoolBlockLayouts = list  # [(pool_name, block_size_bytes)]


class QueryStatus(enum.Enum):
    HIT = "HIT"
    FETCHING = "FETCHING"
    FETCHABLE = "FETCHABLE"
    MISS = "MISS"


class CacheTier(enum.Enum):
    FW_G1 = "HBM"
    FW_G2 = "FW_DRAM"
    LOCAL_G2 = "DRAM"
    REMOTE_G2 = "REMOTE_G2"
    G3 = "G3"


class OpEntryStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    DROPPED = "DROPPED"
    FAILED = "FAILED"


class PlacementAction(enum.Enum):
    KEEP = "KEEP"
    DROP = "DROP"
    COPY_TO = "COPY_TO"
    MOVE_TO = "MOVE_TO"


PlacementDecision = Tuple[PlacementAction, Optional[CacheTier]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionDescriptor:
    """A registered region: `count` elements of `size` bytes from `addr`.

    `stride` 0 means the elements are contiguous; `label` names the pool the
    elements belong to and is unique among registrations."""

    mem_type: str = "DRAM"
    device_Id: int = 0
    addr: int
    stride: int = 0
    count: int = 1
    size: int
    label: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRef:
    """One element of a registered region (or, in fetch results, of a KVCR
    pool): `end_point_name` is the owning instance's agent name, `label` the
    region (pool) name and `element_index` the element (slot)."""

    end_point_name: str
    label: str = ""
    element_index: int


@dataclass(frozen=True, slots=True)
class MemDescriptor:
    """The first API's block reference (vLLM 0.30 and 0.31 adapters): one
    block at an absolute address of framework_dram. KVCR turns it into the
    MemoryRef of that element (kvcr.compat), or refuses it."""

    end_point_name: str
    mem_type: str
    addr: int
    size: int
    device_Id: int = 0
    info: str = ""


PinResult = Optional[Tuple[PinHandle, Mapping[BlockKey, Optional[list]]]]


@dataclass(frozen=True, slots=True)
class OpEntryResult:
    """The result of one key of an operation.

    * fetch success: `descriptors` are MemoryRefs of the KVCR-owned slots
      (end_point_name = this agent, label = pool name, element_index = slot)
      in layout order, valid until `release_handle` is released;
      `addresses` holds the matching (address, size) of each slot.
    * no_evict deposit success: `release_handle` is set.
    * otherwise both are None.

    `reason` (extra, not compared) is libkvcr's reason for a failure, e.g.
    "NOT_FOUND", "NO_CAPACITY", "TIMEOUT", "LAYOUT_MISMATCH", or "CORRUPT"
    (the G3 copy failed its key or checksum check and the block left G3; as
    after any failed deliver, the destination's content is unspecified);
    None on success."""

    status: OpEntryStatus
    descriptors: Optional[list] = None
    release_handle: Optional[ReleaseHandle] = None
    reason: Optional[str] = field(default=None, compare=False)
    addresses: Optional[list] = field(default=None, compare=False, repr=False)

    @property
    def success(self) -> bool:
        return self.status is OpEntryStatus.SUCCESS


OpResult = Tuple[OpHandle, Mapping[BlockKey, OpEntryResult]]


@dataclass(frozen=True)
class InventoryEvent:
    keys: Tuple[BlockKey, ...]
    tier: CacheTier
    removed: bool


@dataclass(frozen=True)
class BlockMeta:
    block_key: BlockKey
    size_bytes: int
    access_count: int
    last_access: Optional[float]
    resident_tiers: frozenset
    position: int = -1
    # KVCR's own: the block's tenant (KVCRConfig.tenants, None: none) and how
    # many slots that tenant holds and keeps under pressure (its quota), in
    # KVCR DRAM and in G3; blocks without a tenant share a quota of 0.
    tenant: Optional[str] = None
    tenant_dram_slots: int = 0
    tenant_dram_quota: int = 0
    tenant_g3_slots: int = 0
    tenant_g3_quota: int = 0


@dataclass(frozen=True)
class RouterBlock:
    """KVCR's own: what KV-aware routers need to know of a deposited block
    besides its router hash (KVCR.deposit(router=...)), announced in its
    BlockStored KV event (KVEventsOptions): the previous block's router
    hash, the block's token ids (block_size of them, or none), the LoRA
    adapter's name and extra keys as vLLM has them (str, non-negative int,
    or tuples of them: multimodal hashes with their offsets, cache salt),
    packed as vLLM packs them (a tuple as an array). Without token ids the
    block is announced by its hash alone."""

    parent_hash: Optional[int] = None
    token_ids: tuple = ()
    block_size: int = 0
    lora_name: Optional[str] = None
    extra_keys: tuple = ()


@dataclass(frozen=True)
class PlacementFailure:
    attempted: PlacementDecision
    source: CacheTier
    reason: str
    failure_count: int


class RecoveryMirrorError(RuntimeError):
    """The recovery stream cannot describe a valid cache state."""


class KVCRStartupError(RuntimeError):
    """Start-up failed and native work could not be stopped: keep every
    buffer registered with KVCR alive until the process exits.

    libkvcr's own start-up stops everything it began when it fails, so this
    build raises it only when stopping an instance that had already started
    failed (see KVCR.__init__)."""


class TransferError(RuntimeError):
    """Memory exposed by a failed transfer, as given to on_resilience_event.

    `state` is "uncertain" (the transport may still read or write the
    memory: keep it) until a later event for the same `op_handle` says
    "quiesced" (that hazard is over; the failed data is still not valid).
    This build also reports "stalled": this instance's source side stopped
    serving peers (memory it was reading stays uncertain).

    Target side (a deliver or fetch that pulled from a peer):
    `destination_regions` lists the framework MemoryRefs being written and
    `op_handle` is the operation's handle. Source side (a peer read our
    memory; `source_side` is True): `op_handle` is libkvcr's number for that
    peer write, `source_regions` lists the framework MemoryRefs being read,
    and `source_blocks` is None (libkvcr reports regions, not keys).
    KVCR-owned memory is never listed."""

    def __init__(self, message: str, op_handle: OpHandle, *, state: str = "uncertain",
                 source_blocks: Union[dict, None] = None,
                 destination_regions: Union[list, None] = None,
                 source_regions: Union[list, None] = None, source_side: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.op_handle = op_handle
        self.state = state
        self.source_blocks = source_blocks
        self.destination_regions = destination_regions
        self.source_regions = source_regions
        self.source_side = source_side

    def __str__(self) -> str:
        return (f"{self.message}: state={self.state}, op={self.op_handle}, "
                f"sources={self.source_blocks!r}, destinations={self.destination_regions!r}")
