"""KVCR, the KV Cache Runner: a KV-cache tier beside an LLM inference engine."""
from .api import (DURATION_METRIC, KVCR, STATE_METRIC, TRANSFER_BLOCKS_METRIC,
                  TRANSFER_BYTES_METRIC, KVCRBindings)
from .config import (FrameworkDramInput, G3Options, KeyAdapter, KVCRBackendConfigs, KVCRConfig,
                     KVCRGuardConfig, LocalDramOptions, RemoteFWDramOptions)
from .control_channels import ZmqPeerControlChannel
from .hints import ROUTER_HINT_CAPABILITIES, ROUTER_HINT_KEY
from .policy import FIFOPolicy, G3FIFOPolicy, G3LRUPolicy, KVCachePolicy, LRUPolicy
from .types import (BlockKey, BlockMeta, CacheTier, InventoryEvent, KVCRStartupError, MemoryRef,
                    OpEntryResult, OpEntryStatus, OpHandle, PinRequestId, PinResult,
                    PlacementAction, QueryStatus, RegionDescriptor, TransferError)

__version__ = "0.1.0"

__all__ = [
    "KVCR", "KVCRBindings", "ROUTER_HINT_KEY", "ROUTER_HINT_CAPABILITIES", "DURATION_METRIC",
    "TRANSFER_BYTES_METRIC", "TRANSFER_BLOCKS_METRIC", "STATE_METRIC", "KVCRConfig",
    "KVCRBackendConfigs", "LocalDramOptions", "G3Options", "RemoteFWDramOptions",
    "KVCRGuardConfig", "KeyAdapter", "FrameworkDramInput", "BlockKey", "RegionDescriptor",
    "MemoryRef", "QueryStatus", "CacheTier", "InventoryEvent", "OpHandle", "OpEntryStatus",
    "OpEntryResult", "PinRequestId", "PinResult", "PlacementAction", "BlockMeta",
    "KVCRStartupError", "TransferError", "KVCachePolicy", "FIFOPolicy", "LRUPolicy",
    "G3FIFOPolicy", "G3LRUPolicy", "ZmqPeerControlChannel", "__version__",
]
