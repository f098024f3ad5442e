"""Configuration rules, one by one, with their messages and their order,
and what is not built yet (G3's rules are in test_g3_tier.py). libkvcr
checks the values (its message, ValueError); Python the types (TypeError)
and what libkvcr cannot see."""
import dataclasses
import logging
import mmap
import socket
from pathlib import Path

import pytest

import kvcr
from conftest import address_of, thread_count

BLOCK = 4096


@pytest.fixture
def mem():
    fw = bytearray(BLOCK * 4)
    pool = mmap.mmap(-1, BLOCK * 4)
    yield fw, pool
    pool.close()


def parts(mem, layouts=(("", BLOCK),), **cfg):
    fw, pool = mem
    config = kvcr.KVCRConfig(nixl_agent_name="v", pool_layouts=list(layouts), **cfg)
    bindings = kvcr.KVCRBindings(None, None, None)
    backends = kvcr.KVCRBackendConfigs(
        framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4)],
        local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)]))
    return config, bindings, backends


def build(config, bindings, backends, guard=None):
    k = kvcr.KVCR(config, bindings, backends, guard)
    k.close()
    return k


def refused(exc, config, bindings, backends, guard=None):
    before = thread_count()
    with pytest.raises(exc) as info:
        build(config, bindings, backends, guard)
    assert thread_count() == before  # nothing started
    return str(info.value)


def test_a_valid_configuration_starts_copy_threads_and_close_stops_them(mem):
    config, bindings, backends = parts(mem, copy_threads=3)
    before = thread_count()
    k = kvcr.KVCR(config, bindings, backends)
    assert thread_count() == before + 3
    assert k.config is config
    k.close()
    assert thread_count() == before
    k.close()  # idempotent


CONFIG_CASES = [
    (dict(nixl_agent_name=""), ValueError,
     "agent_name must be a non-empty string shorter than 128 bytes"),
    (dict(nixl_agent_name=7), TypeError, "nixl_agent_name must be a str, not int"),
    (dict(pool_layouts=[]), ValueError, "pool_layouts must contain at least one pool"),
    (dict(pool_layouts=[(1, BLOCK)]), TypeError, "pool_layouts pool name must be a str, not int"),
    (dict(pool_layouts=[("", True)]), TypeError,
     "pool_layouts block size must be an int, not bool"),
    (dict(pool_layouts=[("", 0)]), ValueError,
     "pool_layouts block size must be a positive integer"),
    (dict(pool_layouts=[("", 4096.0)]), TypeError,
     "pool_layouts block size must be an int, not float"),
    (dict(pool_layouts=[("a", BLOCK), ("a", BLOCK)]), ValueError,
     "pool_layouts pool names must be unique"),
    (dict(pool_layouts=[("", BLOCK), ("b", BLOCK)]), ValueError,
     "pool_layouts cannot use an empty name with multiple pools"),
    (dict(operation_timeout_ms=0), ValueError, "operation_timeout_ms must be positive"),
    (dict(operation_timeout_ms=True), TypeError, "operation_timeout_ms must be an int, not bool"),
    (dict(abandon_timeout_ms=1999), ValueError,
     "abandon_timeout_ms must be at least twice operation_timeout_ms (1999 < 2 x 1000): "
     "set abandon_timeout_ms to 2000 or more"),
    (dict(capacity_low_watermark_percent=101), ValueError,
     "capacity_low_watermark_percent must be between 0 and 100"),
    (dict(capacity_low_watermark_percent=-0.5), ValueError,
     "capacity_low_watermark_percent must be between 0 and 100"),
    (dict(capacity_low_watermark_percent=float("nan")), ValueError,
     "capacity_low_watermark_percent must be between 0 and 100"),
    (dict(nixl_listen_port=0), ValueError, "nixl_listen_port must be between 1 and 65535"),
    (dict(nixl_listen_port=65536), ValueError, "nixl_listen_port must be between 1 and 65535"),
    (dict(nixl_listen_port=True), ValueError, "nixl_listen_port must be between 1 and 65535"),
    (dict(copy_threads=0), ValueError, "copy_threads must be between 1 and 64"),
]


@pytest.mark.parametrize("change,exc,message", CONFIG_CASES)
def test_config_rule(mem, change, exc, message):
    config, bindings, backends = parts(mem)
    assert refused(exc, dataclasses.replace(config, **change), bindings, backends) == message


def test_listen_port_is_accepted_when_in_range(mem):
    config, bindings, backends = parts(mem, nixl_listen_port=65535)
    build(config, bindings, backends)


def test_config_rules_are_checked_in_order(mem):
    config, bindings, backends = parts(mem)
    bad = dataclasses.replace(config, pool_layouts=[("", 0)], operation_timeout_ms=0,
                              capacity_low_watermark_percent=200)
    assert refused(ValueError, bad, bindings, backends) == \
        "pool_layouts block size must be a positive integer"
    bad = dataclasses.replace(bad, pool_layouts=[("", BLOCK)])
    assert refused(ValueError, bad, bindings, backends) == "operation_timeout_ms must be positive"
    bad = dataclasses.replace(bad, operation_timeout_ms=10)
    assert refused(ValueError, bad, bindings, backends) == \
        "capacity_low_watermark_percent must be between 0 and 100"


def local(pools, backend="UCX"):
    return kvcr.LocalDramOptions(pools=pools, backend=backend)


def test_local_dram_rules(mem):
    fw, pool = mem
    a = address_of(pool)
    config, bindings, backends = parts(mem)
    cases = [
        (local([("", a, BLOCK)], backend=""), ValueError, "local DRAM backend name must be non-empty"),
        (local([("", a)]), TypeError, "local DRAM pools must be (name, address, size) tuples"),
        (local([("", a, BLOCK), ("", a + BLOCK, BLOCK)]), ValueError,
         "local DRAM pool names must be unique"),
        (local([("x", a, BLOCK)]), ValueError, "local DRAM pool names must exactly match pool_layouts"),
        (local([("", 0, BLOCK)]), ValueError, "local DRAM address must be a positive integer"),
        (local([("", -4096, BLOCK)]), ValueError, "local DRAM address must be a positive integer"),
        (local([("", a, True)]), TypeError, "local DRAM pool size must be an int, not bool"),
        (local([("", a, BLOCK + 1)]), ValueError, "local DRAM pool '' size must contain complete blocks"),
    ]
    for dram, exc, message in cases:
        got = refused(exc, config, bindings, dataclasses.replace(backends, local_dram=dram))
        assert got == message, (dram, got)


def test_local_dram_pools_match_layouts_as_a_set_and_must_not_overlap(mem):
    fw, pool = mem
    a = address_of(pool)
    config, bindings, backends = parts(mem, layouts=(("k", BLOCK), ("v", 2 * BLOCK)))
    regions = [kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4, label="k")]
    # Given in another order than pool_layouts: accepted (the names are a set).
    ok = kvcr.KVCRBackendConfigs(framework_regions=regions,
                                 local_dram=local([("v", a + BLOCK, 2 * BLOCK), ("k", a, BLOCK)]))
    build(config, bindings, ok)
    overlapping = dataclasses.replace(ok, local_dram=local([("v", a, 2 * BLOCK), ("k", a, BLOCK)]))
    assert refused(ValueError, config, bindings, overlapping) == \
        "local DRAM pool memory regions must not overlap"


def region(fw, **kw):
    return kvcr.RegionDescriptor(**{**dict(addr=address_of(fw), size=BLOCK, count=4), **kw})


def test_region_record_rules(mem):
    fw, _ = mem
    config, bindings, backends = parts(mem)
    assert refused(TypeError, config, bindings,
                   dataclasses.replace(backends, framework_regions=[(1, 2)])) == \
        "framework_regions must contain RegionDescriptor values"
    for bad, message in [
        (dict(addr=0), "framework region address must be a positive integer"),
        (dict(size=0), "framework region size must be a positive integer"),
        (dict(count=0), "framework region count must be a positive integer"),
        (dict(stride=BLOCK - 1), "framework region stride must be 0 or at least its size"),
        (dict(mem_type="FILE"), "framework region mem_type must be one of ['DRAM', 'VRAM'], got 'FILE'"),
        (dict(device_Id=-1), "framework region device_id must be a non-negative int"),
    ]:
        got = refused(ValueError, config, bindings,
                      dataclasses.replace(backends, framework_regions=[region(fw, **bad)]))
        assert got == message, (bad, got)


def test_rules_only_libkvcr_checks_arrive_as_value_errors_with_its_text(mem):
    """KVCR_EINVAL -> ValueError(kvcr_last_error()); KVCR_ENOTSUP -> NotImplementedError."""
    fw, pool = mem
    config, bindings, backends = parts(mem)

    def with_regions(*regions):
        return dataclasses.replace(backends, framework_regions=list(regions))

    assert refused(ValueError, config, bindings, with_regions(region(fw, label="nope"))) == \
        "framework region label 'nope' must name a configured pool"
    lo = address_of(fw)
    got = refused(ValueError, config, bindings,
                  with_regions(region(fw, count=2), region(fw, addr=lo + BLOCK, count=2, stride=BLOCK)))
    assert got == "framework region labels must be unique ('')"
    got = refused(ValueError, config, bindings,
                  with_regions(kvcr.RegionDescriptor(addr=address_of(pool), size=BLOCK, count=1)))
    assert got == "framework region '' overlaps local DRAM pool ''"
    got = refused(NotImplementedError, config, bindings, with_regions(region(fw, mem_type="VRAM")))
    assert "VRAM framework regions need a CUDA build" in got
    # Exact duplicates collapse to one registration.
    build(config, bindings, with_regions(region(fw), region(fw)))


def test_remote_options_rules(mem):
    config, bindings, backends = parts(mem)
    for opts, message in [
        (kvcr.RemoteFWDramOptions(metadata_retry_interval_ms=0), "metadata_retry_interval_ms must be positive"),
        (kvcr.RemoteFWDramOptions(backend=""), "remote backend name must be non-empty"),
    ]:
        assert refused(ValueError, config, bindings,
                       dataclasses.replace(backends, remote_fw_dram=opts)) == message
    assert kvcr.KVCRBackendConfigs() == kvcr.KVCRBackendConfigs()  # a default is valid


# G3's rules (G3Options, multiple pools, local DRAM, files) are in test_g3_tier.py.


@pytest.mark.parametrize("policy,message", [
    # The built-ins run as libkvcr's, named as there.
    (kvcr.G3LRUPolicy(), "g3_lru requires configured G3"),
    (kvcr.G3FIFOPolicy(), "g3_fifo requires configured G3"),
])
def test_policies_need_their_tiers(mem, policy, message):
    config, bindings, backends = parts(mem)
    assert refused(ValueError, config, dataclasses.replace(bindings, policy=policy), backends) == message


def test_a_policy_requiring_dram_and_g3_names_both_sorted(mem):
    class Needy(kvcr.LRUPolicy):
        required_tiers = frozenset({kvcr.CacheTier.G3, kvcr.CacheTier.LOCAL_G2})

    config, bindings, backends = parts(mem)
    control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0)
    got = refused(ValueError, config,
                  dataclasses.replace(bindings, policy=Needy(), framework_control=control),
                  dataclasses.replace(backends, local_dram=None))
    assert got == "Needy requires configured DRAM, G3"


def test_policy_must_be_a_kvcache_policy(mem):
    config, bindings, backends = parts(mem)
    assert refused(TypeError, config, dataclasses.replace(bindings, policy=object()), backends) == \
        "bindings.policy must be a KVCachePolicy"


def test_dram_backends_and_the_peer_tier(mem, caplog):
    config, bindings, backends = parts(mem)
    no_dram = dataclasses.replace(backends, local_dram=None)
    assert refused(ValueError, config, bindings, no_dram) == \
        "at least one DRAM backend must be configured"
    assert build(config, bindings, backends).control_endpoint is None  # remote tier off
    # A framework_control turns the peer tier on: local DRAM becomes optional.
    control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0, None)
    with_control = dataclasses.replace(bindings, framework_control=control)
    caplog.clear()
    k = kvcr.KVCR(config, with_control, no_dram)
    assert k.control_endpoint == control.endpoint and control.bind_port > 0
    assert k.bindings.framework_control is control
    k.close()
    k = kvcr.KVCR(config, with_control, backends)  # with local DRAM as well
    assert k.control_endpoint.startswith("tcp://127.0.0.1:")
    k.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # libkvcr checks the hosts it binds and advertises
    bad = dataclasses.replace(bindings,
                              framework_control=kvcr.ZmqPeerControlChannel("::1", 0, "::1"))
    assert "must be a host name or IPv4 address" in refused(ValueError, config, bad, backends)


GUARD_FIELD_CASES = [
    # (socket path, guard_index, digest), exception, message
    ((b"/s", 0, "d"), TypeError, "kvcr_service_socket_path must be a str, not bytes"),
    ((None, 0, "d"), TypeError, "kvcr_service_socket_path must be a str, not NoneType"),
    (("", 0, "d"), ValueError, "service_socket_path must be a Unix socket path of 1..107"),
    (("/" + "s" * 107, 0, "d"), ValueError, "Unix socket path of 1..107 bytes"),
    (("/s\0x", 0, "d"), ValueError, "kvcr_service_socket_path must not contain NUL"),
    (("/s", "0", "d"), TypeError, "guard_index must be an int, not str"),
    (("/s", True, "d"), TypeError, "guard_index must be an int, not bool"),
    (("/s", 1.0, "d"), TypeError, "guard_index must be an int, not float"),
    (("/s", -1, "d"), ValueError, "guard_index must be between 0 and 4294967295, got -1"),
    (("/s", 2**32, "d"), ValueError, "guard_index must be between 0 and 4294967295"),
    (("/s", 0, None), TypeError, "compatibility_digest must be a str, not NoneType"),
    (("/s", 0, b"d"), TypeError, "compatibility_digest must be a str, not bytes"),
    (("/s", 0, ""), ValueError, "compatibility_digest must be 1..256 bytes"),
    (("/s", 0, "d" * 257), ValueError, "compatibility_digest must be 1..256 bytes"),
    (("/s", 0, "d\0"), ValueError, "compatibility_digest must not contain NUL"),
]


@pytest.fixture
def claim_socket(tmp_path):
    """A listening Unix socket in place of the KVCR service: the test can
    tell whether anything connected (accept() would not block)."""
    path = str(tmp_path / "claim.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(4)
        listener.setblocking(False)

        def contacted():
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return False
            conn.close()
            return True
        yield path, contacted


def test_guard_config_rules_come_before_any_claim(mem, claim_socket):
    """local_dram with a guard_config is refused (libkvcr, KVCR_EINVAL), and
    so are bad KVCRGuardConfig fields (types and NUL by Python, lengths by
    libkvcr); the service is never contacted."""
    path, contacted = claim_socket
    config, bindings, backends = parts(mem)
    guard = kvcr.KVCRGuardConfig(path, 0, "digest")
    assert refused(ValueError, config, bindings, backends, guard) == \
        "guard mode conflicts with local_dram: the KVCR service provides the pools"
    bad = kvcr.KVCRGuardConfig(path, 0, "")  # libkvcr names the conflict first
    assert "conflicts" in refused(ValueError, config, bindings, backends, bad)
    # A value libkvcr's field cannot hold is refused by Python, before libkvcr is asked.
    bad = kvcr.KVCRGuardConfig(path, -1, "")
    assert "guard_index" in refused(ValueError, config, bindings, backends, bad)
    no_dram = dataclasses.replace(backends, local_dram=None)
    for (p, index, digest), exc, message in GUARD_FIELD_CASES:
        got = refused(exc, config, bindings, no_dram, kvcr.KVCRGuardConfig(p, index, digest))
        assert message in got, (p, index, digest, got)
        assert got.startswith(("guard_config.", "guard "))  # Python's or libkvcr's
    assert refused(TypeError, config, bindings, no_dram, object()) == \
        "guard_config must be a KVCRGuardConfig or None"
    assert not contacted()


def test_guard_config_record(tmp_path):
    assert kvcr.KVCRGuardConfig("/s", 1, "d") == kvcr.KVCRGuardConfig(
        kvcr_service_socket_path="/s", guard_index=1, compatibility_digest="d")
    assert [f.name for f in dataclasses.fields(kvcr.KVCRGuardConfig)] == \
        ["kvcr_service_socket_path", "guard_index", "compatibility_digest"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        kvcr.KVCRGuardConfig("/s", 1, "d").guard_index = 2
    assert issubclass(kvcr.KVCRSocketError, kvcr.KVCRServiceError)
    assert issubclass(kvcr.KVCRMsgFramingError, kvcr.KVCRServiceError)
    assert issubclass(kvcr.KVCRGuardProtocolError, kvcr.KVCRServiceError)
    assert issubclass(kvcr.KVCRServiceError, RuntimeError)


def test_guard_mode_needs_no_other_dram_backend(mem, tmp_path):
    """The service's pool group is KVCR DRAM: without local_dram or a
    framework_control the configuration is valid, so the claim is tried (a
    socket path and os.PathLike both accepted) and fails to connect."""
    config, bindings, backends = parts(mem)
    no_dram = dataclasses.replace(backends, local_dram=None)
    assert "at least one DRAM backend" in refused(ValueError, config, bindings, no_dram)
    missing = tmp_path / "nobody.sock"
    for path in (str(missing), missing):
        got = refused(kvcr.KVCRSocketError, config, bindings, no_dram,
                      kvcr.KVCRGuardConfig(path, 0, "digest"))
        assert f"the KVCR service at {missing} is not reachable" in got


def test_legacy_framework_dram(mem):
    fw, _ = mem
    config, bindings, backends = parts(mem)
    legacy = kvcr.FrameworkDramInput(address_of(fw), len(fw))
    assert refused(ValueError, config, bindings, dataclasses.replace(backends, framework_dram=legacy)) \
        == "configure either framework_dram or framework_regions, not both"
    # The first API's rules (kvcr.compat); test_legacy_api.py runs it.
    alone = dataclasses.replace(backends, framework_dram=legacy, framework_regions=())
    assert refused(ValueError, config, bindings,
                   dataclasses.replace(alone, framework_dram=kvcr.FrameworkDramInput(
                       address_of(fw), len(fw) - 1))).startswith(
        "framework_dram must be a non-empty range at a non-zero address whose length is a "
        "multiple of the block size 4096")
    two = [("", BLOCK), ("b", BLOCK)]
    assert "needs exactly one pool layout" in refused(
        ValueError, dataclasses.replace(config, pool_layouts=two), bindings, alone)
    assert refused(TypeError, config, bindings,
                   dataclasses.replace(alone, framework_dram=(address_of(fw), len(fw)))) \
        == "framework_dram must be a FrameworkDramInput or None"


def test_argument_types(mem):
    config, bindings, backends = parts(mem)
    assert refused(TypeError, object(), bindings, backends) == "config must be a KVCRConfig"
    assert refused(TypeError, config, object(), backends) == "bindings must be a KVCRBindings"
    assert refused(TypeError, config, bindings, object()) == \
        "backend_configs must be a KVCRBackendConfigs"


def test_records_are_frozen_dataclasses_with_their_fields():
    fields = [f.name for f in dataclasses.fields(kvcr.KVCRBindings)]
    assert fields == ["request_pin", "poll_pin_results", "release_pin", "cancel_pin_request",
                      "framework_control", "key_adapter", "inventory_sink",
                      "capacity_needed_callback", "stats_factory", "policy",
                      "on_resilience_event", "resize_g2_memory"]
    c = kvcr.KVCRConfig(nixl_agent_name="a", pool_layouts=[("", 1)])
    assert (c.enable_telemetry, c.operation_timeout_ms, c.abandon_timeout_ms,
            c.capacity_low_watermark_percent, c.nixl_listen_port) == (False, 1000, 5000, 0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.operation_timeout_ms = 5
    r = kvcr.RemoteFWDramOptions()
    assert (r.eager_ctrl_connect, r.opportunistic_query, r.metadata_retry_interval_ms, r.backend) \
        == (True, False, 100, "UCX")
    assert kvcr.LocalDramOptions(pools=[]).backend == "UCX"
    g = kvcr.G3Options(paths=(Path("/a"),), capacity_bytes_per_file=1)
    assert (g.backend, dict(g.backend_options)) == ("GDS_MT", {})
    # KVCR's extras, with libkvcr's defaults (kvcr_config_init).
    assert (g.queue_depth, g.max_staging_bytes) == (16, 64 << 20)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.queue_depth = 2
    with pytest.raises(TypeError):
        kvcr.G3Options((Path("/a"),), 1)  # keyword-only
    rd = kvcr.RegionDescriptor(addr=1, size=2)
    assert (rd.mem_type, rd.device_Id, rd.stride, rd.count, rd.label) == ("DRAM", 0, 0, 1, "")
    with pytest.raises(TypeError):
        kvcr.RegionDescriptor(1, 2)  # keyword-only
    m = kvcr.MemoryRef(end_point_name="a", element_index=3)
    assert m == kvcr.MemoryRef(end_point_name="a", label="", element_index=3) and m.label == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.element_index = 4


def test_public_names_import_from_their_modules_and_the_top_level():
    import kvcr.config
    import kvcr.control_channels
    import kvcr.policy
    import kvcr.types
    modules = {
        kvcr: ["KVCR", "KVCRBindings", "ROUTER_HINT_KEY", "ROUTER_HINT_CAPABILITIES",
               "DURATION_METRIC", "TRANSFER_BYTES_METRIC", "TRANSFER_BLOCKS_METRIC", "STATE_METRIC"],
        kvcr.config: ["KVCRConfig", "KVCRBackendConfigs", "LocalDramOptions", "G3Options",
                      "RemoteFWDramOptions", "KVCRGuardConfig", "KeyAdapter"],
        kvcr.types: ["BlockKey", "RegionDescriptor", "MemoryRef", "QueryStatus", "CacheTier",
                     "InventoryEvent", "OpHandle", "OpEntryStatus", "OpEntryResult",
                     "PinRequestId", "PinResult", "PlacementAction", "BlockMeta",
                     "KVCRStartupError", "TransferError"],
        kvcr.policy: ["KVCachePolicy", "FIFOPolicy", "LRUPolicy", "G3FIFOPolicy", "G3LRUPolicy"],
        kvcr.control_channels: ["ZmqPeerControlChannel"],
    }
    for module, names in modules.items():
        for name in names:
            assert getattr(kvcr, name) is getattr(module, name), name
            assert name in kvcr.__all__
    assert kvcr.__version__ == "0.1.0" == kvcr._native.LIBRARY_VERSION
    assert kvcr.ROUTER_HINT_KEY == "kv_hint"
    assert kvcr.ROUTER_HINT_CAPABILITIES == frozenset({"router_hint"})
    assert (kvcr.DURATION_METRIC, kvcr.TRANSFER_BYTES_METRIC, kvcr.TRANSFER_BLOCKS_METRIC,
            kvcr.STATE_METRIC) == ("kvcr_duration_seconds", "kvcr_transfer_bytes",
                                   "kvcr_transfer_blocks", "kvcr_state")
    assert [t.value for t in kvcr.CacheTier] == ["HBM", "FW_DRAM", "DRAM", "REMOTE_G2", "G3"]
    assert issubclass(kvcr.KVCRStartupError, RuntimeError)
    assert issubclass(kvcr.TransferError, RuntimeError)
    err = kvcr.TransferError("copy failed", 7, state="quiesced", source_blocks={b"k": []})
    assert str(err) == "copy failed: state=quiesced, op=7, sources={b'k': []}, destinations=None"


def test_control_channel_stand_in():
    c = kvcr.ZmqPeerControlChannel("0.0.0.0", 7001, "10.0.0.1")
    assert c.endpoint == "tcp://10.0.0.1:7001"
    assert c.send("tcp://x:1", b"m") is False and c.recv() == []
    c.close()
    assert c.closed
    assert kvcr.ZmqPeerControlChannel("::", 7001, "fe80::1").endpoint == "tcp://[fe80::1]:7001"
    for port in (-1, 65536, True, "7001"):
        with pytest.raises(ValueError, match="between 1 and 65535"):
            kvcr.ZmqPeerControlChannel("0.0.0.0", port)
    any_port = kvcr.ZmqPeerControlChannel("127.0.0.1", 0)  # 0: KVCR picks a free port
    assert any_port.endpoint == "tcp://127.0.0.1:0"
    any_port._bound("tcp://127.0.0.1:7009#lane=7500")  # what libkvcr bound and tells peers
    assert (any_port.bind_port, any_port.endpoint) == (7009, "tcp://127.0.0.1:7009#lane=7500")
