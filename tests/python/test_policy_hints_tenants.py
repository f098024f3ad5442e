"""Hints reach a Python policy (deposit's and fetch's as framework_hints, the
request's router hint as router_hints), a policy written without them still
runs, and tenants: TenantLRUPolicy (libkvcr's tenant_lru) keeps the quieter
tenant's blocks while another floods, bytes compared; gauges per tenant;
hints are the framework's (an unknown "tenant" gives no tenant, refused
only with strict_tenant); refusals."""
import ctypes
import mmap
import time

import pytest

import kvcr
from conftest import WAIT_ROUNDS, WAIT_SECONDS, address_of, poll_until
from kvcr import CacheTier, PlacementAction, QueryStatus, TenantQuota
from kvcr.policy import native_builtin

KEEP = (PlacementAction.KEEP, None)
BLOCK = 4096

ENVELOPE = {"protocol_version": "0.1", "actions": [{
    "action_type": "kv.fetch", "action_version": "1.0",
    "payload": {"source_control_endpoint": "tcp://127.0.0.1:9",
                "block_hashes": [18446744073709551615, 7]}}]}


class Seer(kvcr.G3LRUPolicy):
    """G3LRU that records what decide_ingest is told."""

    def __init__(self):
        self.seen = []

    def decide_ingest(self, meta, source, required_local, router_hints=None,
                      framework_hints=None):
        self.seen.append((bytes(meta.block_key), source, required_local, framework_hints,
                          router_hints, meta.tenant, meta.tenant_dram_quota,
                          meta.tenant_g3_quota))
        return KEEP


class OldStyle(kvcr.LRUPolicy):
    """A policy written before hints reached policies."""

    def __init__(self):
        self.calls = 0

    def decide_ingest(self, meta, source, required_local):
        self.calls += 1
        return KEEP


def tenants(alice=2, bob=2, g3=0):
    return (TenantQuota("alice", alice, g3), TenantQuota("bob", bob, g3))


def test_deposit_hints_reach_the_policy_as_framework_hints(rig_factory):
    p = Seer()
    p.required_tiers = frozenset()  # no G3 here: the hooks run through Python all the same
    r = rig_factory(slots=4, policy=p, tenants=tenants())
    r.put(0, 1)
    hints = {"tenant": "bob", "priority": 3, "tags": ["a", "b"]}
    got = r.wait(r.kv.deposit({b"k": r.ref(0)}, no_evict=True, hints=hints))[b"k"]
    assert got.success and got.release_handle is not None
    assert p.seen == [(b"k", CacheTier.FW_G2, True, hints, None, "bob", 2, 0)]
    r.wait(r.kv.deposit({b"plain": r.ref(0)}))
    assert p.seen[-1] == (b"plain", CacheTier.FW_G2, False, None, None, None, 0, 0)


def test_a_policy_without_hint_parameters_still_runs(rig_factory):
    p = OldStyle()
    r = rig_factory(policy=p)
    r.put(0, 1)
    assert r.wait(r.kv.deposit({b"k": r.ref(0)}, hints={"x": 1}))[b"k"].success
    assert p.calls == 1


def test_fetch_hints_and_the_router_hint_reach_the_policy(g3_dir):
    p = Seer()
    fw = bytearray(BLOCK * 8)
    pool = mmap.mmap(-1, BLOCK * 2)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="seer", pool_layouts=[("", BLOCK)],
                        tenants=tenants(alice=1, bob=1, g3=4)),
        kvcr.KVCRBindings(None, None, None, policy=p),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=8)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)]),
            g3=kvcr.G3Options(paths=(g3_dir / "g3.bin",), capacity_bytes_per_file=8 * BLOCK)))
    try:
        ref = lambda i: [kvcr.MemoryRef(end_point_name="seer", element_index=i)]  # noqa: E731
        fw[0:BLOCK] = bytes(range(256)) * (BLOCK // 256)
        assert poll_until(kv, kv.deposit({b"a": ref(0)}, hints={"tenant": "alice"}))[b"a"].success
        for k in (b"b", b"c"):  # a is spilled to G3, keeping its tenant
            assert poll_until(kv, kv.deposit({k: ref(1)}))[k].success
        deadline = time.monotonic() + WAIT_SECONDS  # the spill lands on the disk first
        for _ in range(WAIT_ROUNDS):
            if kv.query([b"a"]) == [(QueryStatus.FETCHABLE, CacheTier.G3)] or \
                    time.monotonic() > deadline:
                break
            kv.poll_completed()
            time.sleep(0.001)
        assert kv.query([b"a"]) == [(QueryStatus.FETCHABLE, CacheTier.G3)]
        kv.submit_hint(ENVELOPE, request_id="req-1")
        got = poll_until(kv, kv.fetch([b"a"], request_id="req-1", hints={"why": "prefill"}))
        assert got[b"a"].success
        assert ctypes.string_at(got[b"a"].addresses[0][0], BLOCK) == bytes(fw[0:BLOCK])
        key, source, required, fw_hints, router, tenant, q_dram, q_g3 = p.seen[-1]
        assert (key, source, required) == (b"a", CacheTier.G3, True)
        assert fw_hints == {"why": "prefill"}
        assert router == ENVELOPE  # u64 hashes exact
        assert (tenant, q_dram, q_g3) == ("alice", 1, 4)
        kv.release([got[b"a"].release_handle])
    finally:
        kv.close()
        pool.close()


def flood(r, rounds=10):
    """bob deposits 2 blocks (his quota), alice 10; returns bob's blocks that
    still deliver their exact bytes."""
    for i in range(2):
        r.fill_pattern(i, b"bob-%d" % i)
        assert r.wait(r.kv.deposit({b"bob-%d" % i: r.ref(i)}, hints={"tenant": "bob"}))[
            b"bob-%d" % i].success
    for i in range(rounds):
        r.fill_pattern(2 + i % 4, b"alice-%d" % i)
        k = b"alice-%d" % i
        assert r.wait(r.kv.deposit({k: r.ref(2 + i % 4)}, hints={"tenant": "alice"}))[k].success
    hits = 0
    for i in range(2):
        k = b"bob-%d" % i
        want = bytes(r.fw[i * r.block:(i + 1) * r.block])
        r.fw[7 * r.block:8 * r.block] = bytes(r.block)
        if r.wait(r.kv.deliver({k: r.ref(7)}))[k].success and \
                bytes(r.fw[7 * r.block:8 * r.block]) == want:
            hits += 1
    return hits


class ScoredTenantLRU(kvcr.TenantLRUPolicy):
    """tenant_lru's rule, scored in Python: the quota flag reaches libkvcr
    through the adapter."""

    def eviction_score(self, meta, source):
        return super().eviction_score(meta, source)


@pytest.mark.parametrize("policy, bob_keeps", [
    (kvcr.TenantLRUPolicy(), 2), (ScoredTenantLRU(), 2), (kvcr.LRUPolicy(), 0)])
def test_tenant_lru_keeps_the_quiet_tenants_blocks(rig_factory, policy, bob_keeps):
    r = rig_factory(slots=4, fw_blocks=8, policy=policy, telemetry=True, tenants=tenants())
    assert flood(r) == bob_keeps
    text = r.kv.prometheus_text()
    assert 'kvcr_state{resource="tenant_alice_dram_quota_slots"} 2' in text
    assert f'kvcr_state{{resource="tenant_bob_dram_slots"}} {bob_keeps}' in text
    assert f'kvcr_state{{resource="tenant_bob_dram_evicted_blocks"}} {2 - bob_keeps}' in text


def test_tenant_lru_runs_natively():
    assert native_builtin(kvcr.TenantLRUPolicy()) == "tenant_lru"
    assert native_builtin(kvcr.G3TenantLRUPolicy()) == "g3_tenant_lru"
    assert native_builtin(ScoredTenantLRU()) is None
    flagged = kvcr.LRUPolicy()
    flagged.tenant_quotas = True
    assert native_builtin(flagged) is None


def test_hints_are_the_frameworks_without_tenants(rig_factory):
    """No tenants configured: whatever the hints hold ("tenant" of any
    value included) reaches the policy untouched, and nothing is refused."""
    p = Seer()
    p.required_tiers = frozenset()
    r = rig_factory(slots=4, policy=p)
    r.put(0, 1)
    for i, hints in enumerate(({"tenant": "t1", "x": [1, None]}, {"tenant": 3},
                               {"tenant": {"org": "a"}})):
        key = b"k%d" % i
        assert r.wait(r.kv.deposit({key: r.ref(0)}, hints=hints))[key].success
        assert p.seen[-1][3] == hints and p.seen[-1][5] is None
    assert r.wait(r.kv.deposit({b"s": r.ref(0)}, hints={"tenant": "t1"},
                               strict_tenant=True))[b"s"].success


def test_an_unknown_tenant_gives_no_tenant_unless_strict(rig_factory):
    p = Seer()
    p.required_tiers = frozenset()
    r = rig_factory(slots=4, policy=p, telemetry=True, tenants=tenants())
    r.put(0, 1)
    for key, hints in ((b"c", {"tenant": "carol"}), (b"n", {"tenant": 3})):
        assert r.wait(r.kv.deposit({key: r.ref(0)}, hints=hints))[key].success
        assert p.seen[-1][3] == hints and p.seen[-1][5] is None
    text = r.kv.prometheus_text()
    assert 'kvcr_state{resource="hints_unknown_tenant"} 2' in text
    assert 'kvcr_state{resource="no_tenant_dram_slots"} 2' in text


def test_bad_hints_and_tenants_are_refused(rig_factory):
    r = rig_factory(tenants=tenants())
    with pytest.raises(ValueError, match="tenant 'carol', which is not configured"):
        r.kv.deposit({b"k": r.ref(0)}, hints={"tenant": "carol"}, strict_tenant=True)
    with pytest.raises(ValueError, match="\"tenant\" must be a string or null"):
        r.kv.deposit({b"k": r.ref(0)}, hints={"tenant": 3}, strict_tenant=True)
    with pytest.raises(ValueError, match="tenant 'carol', which is not configured"):
        r.kv.fetch([b"k"], hints={"tenant": "carol"}, strict_tenant=True)
    with pytest.raises(TypeError, match="hints must be a Mapping"):
        r.kv.deposit({b"k": r.ref(0)}, hints=["bob"])
    with pytest.raises(ValueError, match="JSON-encodable"):
        r.kv.fetch([b"k"], hints={"x": float("nan")})
    assert r.kv.query([b"k"]) == [(QueryStatus.MISS, None)]
    with pytest.raises(ValueError, match="tenant names must be unique"):
        rig_factory(tenants=(TenantQuota("a", 1), TenantQuota("a", 1)))
    with pytest.raises(ValueError, match="DRAM quotas must add up to at most the DRAM slots"):
        rig_factory(slots=4, tenants=(TenantQuota("a", 3), TenantQuota("b", 2)))
    with pytest.raises(ValueError, match="dram_slots must be between 0"):
        rig_factory(tenants=(TenantQuota("a", -1),))
    with pytest.raises(TypeError, match="tenants must be a list of TenantQuota"):
        rig_factory(tenants=(("a", 1, 0),))
