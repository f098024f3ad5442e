"""KVCR, the KV Cache Runner: a KV-cache tier beside an LLM inference engine.

This package is a thin layer over libkvcr (C), compiled into the extension
kvcr._native. Built: KVCR-owned host DRAM (tier LOCAL_G2), deposit /
deliver / fetch / release / abort / poll_completed, built-in and Python
policies, inventory events, capacity callbacks, telemetry, the
peer-to-peer tier (REMOTE_G2) and the local-disk tier (G3).

Peer-to-peer: a `framework_control` in KVCRBindings (a ZmqPeerControlChannel
describing the endpoint) turns it on; libkvcr binds that control endpoint
(ZeroMQ) and moves blocks with UCX. A router hint submitted for a request
makes its hinted keys FETCHABLE / REMOTE_G2 (matched through
key_adapter.decode) and deliver / fetch with that request_id pull them from
the hinted source. As a source, KVCR serves peers from its DRAM or, through
request_pin / poll_pin_results / release_pin, from framework memory — so
local DRAM is optional with a framework_control. on_resilience_event
receives TransferError reports about memory a failed transfer may still
touch.

G3: a G3Options in KVCRBackendConfigs (slot files on a local file system
that supports O_DIRECT; one pool layout; KVCR DRAM required) makes blocks
evicted from KVCR DRAM spill to disk (the default policy is then
G3LRUPolicy, libkvcr's "g3_lru"); query reports them (FETCHABLE, G3),
deliver and fetch read them back, a new KVCR on the same files finds them
again, and a copy that fails its checksum fails its entry ("CORRUPT").
G3FIFOPolicy / G3LRUPolicy without G3 raise ValueError("g3_lru requires
configured G3").

Guard mode: a KVCRGuardConfig(kvcr_service_socket_path, guard_index,
compatibility_digest) as KVCR's fourth argument takes KVCR DRAM from a pool
group of the node's KVCR service (`kvcr service`) instead of local_dram
(both together: ValueError "guard mode conflicts with local_dram: ...").
Committed blocks are journalled for the group's Guard, which keeps them
(and serves them to peers on this worker's control endpoint) when the
process dies; the next KVCR claiming the group recovers them.

Errors: every libkvcr failure raises the kvcr.errors class of its code, a
KVCRError with `.code` (KVCR_E*) that is also the builtin raised before
those classes existed: KVCRInvalidArgument (a ValueError: libkvcr's text
names the rule), KVCRNotSupported (NotImplementedError), KVCRClosedError,
KVCRLimitError, KVCROutOfMemory, KVCRServiceError / KVCRSocketError /
KVCRGuardProtocolError (guard mode) and the rest (RuntimeError). A field of
the wrong type raises TypeError, checked in Python before anything starts.
"""
from . import config, errors, policy, types  # noqa: F401  (submodules users import)
from .api import (DURATION_METRIC, KVCR, STATE_METRIC, TRANSFER_BLOCKS_METRIC,
                  TRANSFER_BYTES_METRIC, KVCRBindings)
from .config import (FRAMEWORK_MEMORY_TYPES, FrameworkControl, FrameworkDramInput, G3Options,
                     InventorySink, KeyAdapter, KVCRBackendConfigs, KVCRConfig, KVCRGuardConfig,
                     KVCRLimits, KVEventsOptions, LocalDramOptions, RemoteFWDramOptions,
                     TelemetryStats, TenantQuota)
from .control_channels import ZmqPeerControlChannel
from .errors import (KVCRBusyError, KVCRClosedError, KVCRError, KVCRGuardProtocolError,
                     KVCRInvalidArgument, KVCRLimitError, KVCRMsgFramingError, KVCRNotFound,
                     KVCRNotSupported, KVCROutOfMemory, KVCRServiceError, KVCRSocketError,
                     KVCRSystemError)
from .hints import ROUTER_HINT_CAPABILITIES, ROUTER_HINT_KEY
from .policy import (FIFOPolicy, G3FIFOPolicy, G3LRUPolicy, G3TenantLRUPolicy, KVCachePolicy,
                     LRUPolicy, TenantLRUPolicy)
from .types import (BlockKey, BlockMeta, CacheTier, InventoryEvent, KVCRStartupError,
                    LocalDramRegions, MemDescriptor, MemoryRef, OpEntryResult, OpEntryStatus,
                    OpHandle, OpResult,
                    PinHandle, PinRequestId, PinResult, PlacementAction, PlacementDecision,
                    PlacementFailure, PoolBlockLayouts, QueryStatus, RecoveryMirrorError,
                    RegionDescriptor, ReleaseHandle, ReleaseResult, RouterBlock, TransferError)

__version__ = "0.1.0"

__all__ = [
    # kvcr
    "KVCR", "KVCRBindings", "ROUTER_HINT_KEY", "ROUTER_HINT_CAPABILITIES", "DURATION_METRIC",
    "TRANSFER_BYTES_METRIC", "TRANSFER_BLOCKS_METRIC", "STATE_METRIC",
    # kvcr.config
    "KVCRConfig", "KVCRBackendConfigs", "LocalDramOptions", "G3Options", "RemoteFWDramOptions",
    "KVCRGuardConfig", "KeyAdapter", "FrameworkDramInput", "FrameworkControl", "TelemetryStats",
    "InventorySink", "FRAMEWORK_MEMORY_TYPES", "KVCRLimits", "KVEventsOptions",
    # kvcr.types
    "BlockKey", "RegionDescriptor", "MemoryRef", "MemDescriptor", "QueryStatus", "CacheTier",
    "InventoryEvent",
    "OpHandle", "OpEntryStatus", "OpEntryResult", "OpResult", "PinHandle", "PinRequestId",
    "PinResult", "PlacementAction", "PlacementDecision", "PlacementFailure", "BlockMeta",
    "ReleaseHandle", "ReleaseResult", "LocalDramRegions", "PoolBlockLayouts",
    "KVCRStartupError", "TransferError", "RecoveryMirrorError", "RouterBlock",
    # kvcr.policy
    "KVCachePolicy", "FIFOPolicy", "LRUPolicy", "G3FIFOPolicy", "G3LRUPolicy",
    "TenantLRUPolicy", "G3TenantLRUPolicy", "TenantQuota",
    # kvcr.control_channels
    "ZmqPeerControlChannel",
    # kvcr.errors
    "KVCRError", "KVCRInvalidArgument", "KVCROutOfMemory", "KVCRClosedError",
    "KVCRNotSupported", "KVCRBusyError", "KVCRNotFound", "KVCRSystemError", "KVCRServiceError",
    "KVCRGuardProtocolError", "KVCRMsgFramingError", "KVCRLimitError", "KVCRSocketError",
    "__version__",
]
