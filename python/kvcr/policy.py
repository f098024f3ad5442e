"""Placement and eviction policies.

FIFOPolicy, LRUPolicy, G3FIFOPolicy, G3LRUPolicy, TenantLRUPolicy and
G3TenantLRUPolicy run as libkvcr's C built-ins ("fifo", "lru", "g3_fifo",
"g3_lru", "tenant_lru", "g3_tenant_lru"), with no Python in the hot
path; with no policy libkvcr picks "g3_lru" when G3 is configured, else
"lru". Any other KVCachePolicy — including a subclass of
a built-in that overrides one of its hooks — drives libkvcr's policy vtable
through its Python methods: each hook takes the GIL, runs on the thread of
the KVCR call that needs the decision, under the instance lock (so a hook
must not block and must not call back into the same KVCR: such a call
raises RuntimeError). A hook that raises or returns something invalid is
logged on the "kvcr" logger and KVCR falls back to the built-in rule
(admit, keep the previous score, keep the block, drop after a failed move).

decide_eviction may return (MOVE_TO, G3) (or COPY_TO, done as a move) for a
block evicted from KVCR DRAM (source LOCAL_G2) when G3 is configured: the
block is spilled to G3 instead of dropped. For source G3 (G3 is full) only
KEEP and DROP mean anything; anything else keeps the block. G3FIFOPolicy and
G3LRUPolicy need G3 configured ("G3LRUPolicy requires configured G3").

decide_ingest receives framework_hints (the Mapping given to deposit or
fetch, as JSON decoded it) and router_hints (the kv_hint envelope submitted
for the fetch's request_id, or a deliver's that stages a block in parts
through KVCR DRAM), each None when there is none; a policy whose
decide_ingest takes neither keyword is called without them. Treat them as
read-only. BlockMeta carries the block's tenant and that tenant's slots and
quotas. A policy with tenant_quotas = True (TenantLRUPolicy) has libkvcr take
eviction victims first from tenants over their quota (KVCRConfig.tenants),
least recent first, before any block of a tenant within its quota."""
from __future__ import annotations

import logging
import sys
from typing import Optional

from .types import BlockMeta, CacheTier, PlacementAction, PlacementDecision, PlacementFailure

logger = logging.getLogger("kvcr")

_MOST_NEGATIVE = -sys.float_info.max


class KVCachePolicy:
    """Base class. Lower eviction scores are evicted first; ties go to the
    block that entered the evictable set first."""

    required_tiers: frozenset = frozenset()
    # libkvcr takes victims first from tenants over their quota (KVCR_POLICY_TENANT_QUOTAS).
    tenant_quotas: bool = False

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

    def on_align_sequence(self, blocks: list, use_current_time: bool) -> None:
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
        # The same score as libkvcr's built-in "lru".
        return meta.last_access if meta.last_access is not None else _MOST_NEGATIVE


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


class TenantLRUPolicy(LRUPolicy):
    """LRU in which a tenant over its quota gives its own blocks first."""

    tenant_quotas = True


class G3TenantLRUPolicy(_SpillToG3, TenantLRUPolicy):
    pass


BUILTIN_POLICIES = {"fifo": FIFOPolicy, "lru": LRUPolicy, "g3_fifo": G3FIFOPolicy,
                    "g3_lru": G3LRUPolicy, "tenant_lru": TenantLRUPolicy,
                    "g3_tenant_lru": G3TenantLRUPolicy}

HOOKS = ("decide_ingest", "eviction_score", "decide_eviction", "on_ingest", "on_remove",
         "on_align_sequence", "decide_recovery")

_NATIVE = {FIFOPolicy: "fifo", LRUPolicy: "lru", G3FIFOPolicy: "g3_fifo",
           G3LRUPolicy: "g3_lru", TenantLRUPolicy: "tenant_lru",
           G3TenantLRUPolicy: "g3_tenant_lru"}


def native_builtin(policy: Optional[KVCachePolicy]) -> Optional[str]:
    """The name of the C built-in that behaves exactly like `policy`, or
    None when the policy must be consulted through Python (or, for None, when
    there is none: libkvcr then runs its default, "g3_lru" with G3 and
    "lru" without). An exact FIFOPolicy / LRUPolicy / G3FIFOPolicy /
    G3LRUPolicy (or tenant variant) qualifies; so does a subclass that
    changes no hook (in its class or on the instance) nor required_tiers nor
    tenant_quotas."""
    if policy is None:
        return None
    own = getattr(policy, "__dict__", {})
    if any(h in own for h in HOOKS) or "tenant_quotas" in own:
        return None  # a hook (or the flag) replaced on the instance
    for cls, name in _NATIVE.items():
        if type(policy) is cls:
            return name
    for cls, name in _NATIVE.items():
        if (isinstance(policy, cls) and type(policy).required_tiers == cls.required_tiers
                and type(policy).tenant_quotas == cls.tenant_quotas
                and all(getattr(type(policy), h) is getattr(cls, h) for h in HOOKS)):
            return name
    return None
