"""Placement and eviction policies.

The built-in FIFOPolicy and LRUPolicy run as libkvcr's C built-ins, with no
Python in the hot path. Any other KVCachePolicy — a subclass of a built-in
that overrides a hook included — is consulted through its Python methods."""
from __future__ import annotations

import logging
import math
from typing import Optional

from .types import BlockMeta, CacheTier, PlacementAction, PlacementDecision, PlacementFailure

logger = logging.getLogger("kvcr")


class KVCachePolicy:
    required_tiers: frozenset = frozenset()

    def decide_ingest(self, meta: BlockMeta, source: CacheTier, required_local: bool,
                      router_hints=None, framework_hints=None) -> PlacementDecision:
        raise NotImplementedError

    def eviction_score(self, meta: BlockMeta, source: CacheTier) -> float:
        raise NotImplementedError

    def decide_eviction(self, meta: BlockMeta, source: CacheTier) -> PlacementDecision:
        raise NotImplementedError

    def on_ingest(self, meta: BlockMeta, source: CacheTier) -> None:
        pass

    def on_remove(self, meta: BlockMeta) -> None:
        pass

    def decide_recovery(self, meta: BlockMeta, failure: PlacementFailure) -> PlacementDecision:
        logger.warning("KVCR placement failed (%s); dropping the source residency",
                       failure.reason)
        return (PlacementAction.DROP, None)


class FIFOPolicy(KVCachePolicy):
    def decide_ingest(self, meta, source, required_local, router_hints=None,
                      framework_hints=None):
        return (PlacementAction.KEEP, None)

    def eviction_score(self, meta, source):
        return 0.0

    def decide_eviction(self, meta, source):
        return (PlacementAction.DROP, None)


class LRUPolicy(FIFOPolicy):
    def eviction_score(self, meta, source):
        return meta.last_access if meta.last_access is not None else -math.inf


class _SpillToG3:
    """Evicted DRAM blocks move to G3 instead of being dropped."""

    required_tiers = frozenset({CacheTier.G3})

    def decide_eviction(self, meta, source):
        if source is CacheTier.LOCAL_G2:
            return (PlacementAction.MOVE_TO, CacheTier.G3)
        return (PlacementAction.DROP, None)


class G3FIFOPolicy(_SpillToG3, FIFOPolicy):
    pass


class G3LRUPolicy(_SpillToG3, LRUPolicy):
    pass


BUILTIN_POLICIES = {"fifo": FIFOPolicy, "lru": LRUPolicy, "g3_fifo": G3FIFOPolicy,
                    "g3_lru": G3LRUPolicy}


def native_builtin(policy: Optional[KVCachePolicy]) -> Optional[str]:
    """The C built-in that behaves exactly like `policy`, if there is one."""
    if policy is None:
        return None  # libkvcr's default: LRU
    if type(policy) is FIFOPolicy:
        return "fifo"
    if type(policy) is LRUPolicy:
        return "lru"
    return None
