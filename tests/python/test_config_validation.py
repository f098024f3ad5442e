"""Configuration rules, one by one, with their messages."""
import dataclasses
import mmap

import pytest

import kvcr
from conftest import address_of

BLOCK = 4096


@pytest.fixture
def parts():
    fw = bytearray(BLOCK * 4)
    pool = mmap.mmap(-1, BLOCK * 2)
    yield fw, pool
    pool.close()


def build(parts, config=None, bindings=None, backends=None, guard=None, **cfg):
    fw, pool = parts
    config = config or kvcr.KVCRConfig(nixl_agent_name="v", pool_layouts=[("", BLOCK)], **cfg)
    bindings = bindings or kvcr.KVCRBindings(None, None, None)
    backends = backends or kvcr.KVCRBackendConfigs(
        framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4)],
        local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)]))
    k = kvcr.KVCR(config, bindings, backends, guard)
    k.close()
    return k


CASES = [
    (dict(pool_layouts=[]), ValueError, "pool_layouts must contain at least one pool"),
    (dict(pool_layouts=[(1, BLOCK)]), ValueError, "pool_layouts pool name must be a string"),
    (dict(pool_layouts=[("", True)]), ValueError, "pool_layouts block size must be a positive integer"),
    (dict(pool_layouts=[("", 0)]), ValueError, "pool_layouts block size must be a positive integer"),
    (dict(operation_timeout_ms=0), ValueError, "operation_timeout_ms must be positive"),
    (dict(abandon_timeout_ms=1999), ValueError, "abandon_timeout_ms must be at least twice operation_timeout_ms"),
    (dict(capacity_low_watermark_percent=101), ValueError, "capacity_low_watermark_percent must be between 0 and 100"),
    (dict(nixl_listen_port=70000), ValueError, "nixl_listen_port must be between 1 and 65535"),
    (dict(nixl_agent_name=""), ValueError, "nixl_agent_name must be a non-empty string"),
]


@pytest.mark.parametrize("change,exc,message", CASES)
def test_config_rule(parts, change, exc, message):
    base = kvcr.KVCRConfig(nixl_agent_name="v", pool_layouts=[("", BLOCK)])
    with pytest.raises(exc) as info:
        build(parts, config=dataclasses.replace(base, **change))
    assert str(info.value) == message


def test_pool_names_must_match_local_dram(parts):
    base = kvcr.KVCRConfig(nixl_agent_name="v", pool_layouts=[("k", BLOCK)])
    with pytest.raises(ValueError, match="local DRAM pool names must exactly match pool_layouts"):
        build(parts, config=base)


def test_local_dram_record_rules():
    with pytest.raises(ValueError, match="local DRAM address must be a positive integer"):
        kvcr.LocalDramOptions(pools=[("", 0, BLOCK)])
    with pytest.raises(ValueError, match="local DRAM pool size must be a positive integer"):
        kvcr.LocalDramOptions(pools=[("", 4096, True)])
    with pytest.raises(ValueError, match="local DRAM pool names must be unique"):
        kvcr.LocalDramOptions(pools=[("", 4096, 1), ("", 8192, 1)])
    with pytest.raises(ValueError, match="local DRAM NIXL backend must be non-empty"):
        kvcr.LocalDramOptions(pools=[], backend="")
    with pytest.raises(ValueError, match="metadata_retry_interval_ms must be positive"):
        kvcr.RemoteFWDramOptions(metadata_retry_interval_ms=0)
    with pytest.raises(ValueError, match="remote framework DRAM NIXL backend must be non-empty"):
        kvcr.RemoteFWDramOptions(backend="")


def test_partial_pool_and_overlap_are_refused_by_the_core(parts):
    fw, pool = parts
    regions = [kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4)]
    with pytest.raises(ValueError, match=r"local DRAM pool '' size must contain complete blocks"):
        build(parts, backends=kvcr.KVCRBackendConfigs(
            framework_regions=regions,
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK + 1)])))
    with pytest.raises(ValueError, match="overlaps local DRAM pool"):
        build(parts, backends=kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(pool), size=BLOCK, count=1)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)])))


def test_region_rules(parts):
    fw, _ = parts
    with pytest.raises(TypeError, match="framework_regions must contain RegionDescriptor"):
        build(parts, backends=kvcr.KVCRBackendConfigs(framework_regions=[(1, 2)]))
    for bad, message in [
        (dict(addr=0), "framework region address must be a positive integer"),
        (dict(size=0), "framework region size must be a positive integer"),
        (dict(mem_type="FILE"), "framework region mem_type must be one of ['DRAM', 'VRAM'], got 'FILE'"),
        (dict(device_Id=-1), "framework region device_id must be a non-negative int"),
    ]:
        region = dataclasses.replace(
            kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4), **bad)
        with pytest.raises(ValueError) as info:
            build(parts, backends=kvcr.KVCRBackendConfigs(framework_regions=[region]))
        assert str(info.value) == message


def test_backends_that_are_not_built_say_so(parts):
    fw, pool = parts
    local = kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)])
    with pytest.raises(NotImplementedError, match="G3 tier is not built yet"):
        build(parts, backends=kvcr.KVCRBackendConfigs(
            local_dram=local, g3=kvcr.G3Options(paths=("/tmp/x",), capacity_bytes_per_file=BLOCK)))
    guard = kvcr.KVCRGuardConfig("/tmp/sock", 0, "digest")
    with pytest.raises(ValueError, match="guard_config conflicts with backend_configs.local_dram"):
        build(parts, guard=guard)
    with pytest.raises(NotImplementedError, match="service and Guard are not built yet"):
        build(parts, backends=kvcr.KVCRBackendConfigs(), guard=guard)
    control = kvcr.ZmqPeerControlChannel("127.0.0.1", 5555, None)
    with pytest.raises(NotImplementedError, match="without local DRAM needs the peer-to-peer tier"):
        build(parts, bindings=kvcr.KVCRBindings(None, None, None, framework_control=control),
              backends=kvcr.KVCRBackendConfigs())
    with pytest.raises(ValueError, match="at least one DRAM backend must be configured"):
        build(parts, backends=kvcr.KVCRBackendConfigs())
    with pytest.raises(ValueError, match="G3LRUPolicy requires configured G3"):
        build(parts, bindings=kvcr.KVCRBindings(None, None, None, policy=kvcr.G3LRUPolicy()))


def test_bindings_keep_the_reference_field_order():
    fields = [f.name for f in dataclasses.fields(kvcr.KVCRBindings)]
    assert fields[:11] == ["request_pin", "poll_pin_results", "release_pin", "cancel_pin_request",
                           "framework_control", "key_adapter", "inventory_sink",
                           "capacity_needed_callback", "stats_factory", "policy",
                           "on_resilience_event"]
    assert kvcr.KVCRBackendConfigs() == kvcr.KVCRBackendConfigs()
    assert kvcr.__version__ == "0.1.0"
    assert kvcr.ROUTER_HINT_CAPABILITIES == frozenset({"router_hint"})
