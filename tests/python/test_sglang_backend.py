"""KVCR as SGLang's HiCache storage backend (kvcr.integrations.sglang),
against the project's stand-ins of SGLang's interfaces (SGLang cannot be
installed here): loaded the way the `dynamic` backend loads it, zero-copy
pages stored and read back in every host layout (MHA layer_first,
page_first, page_first_direct; MLA layer_first and page_first) with every
byte compared, leading hits, the legacy flat-page calls, a peer pull
between two backends in two processes steered by a router hint in
extra_info, stored pages announced as KV events by their router hash, and
data-path calls that never raise.

Peers run in child processes started with subprocess (fork + exec). Every
wait is bounded and every child is reaped."""
import logging
import os
import shutil
import socket
import sys
import tempfile
import time

import pytest

import kvcr

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stubs"))
import sglang_standins as s  # noqa: E402

s.install()

from kvcr.integrations.sglang import KVCRHiCacheStorage  # noqa: E402
from peer_process import (sglang_backend, sglang_hash, sglang_key, sglang_page,  # noqa: E402
                          sglang_pool)
from test_remote_tier import peers  # noqa: E402,F401 - the fixture: peers reaped after a test

LAYOUTS = [("mha", "layer_first"), ("mha", "page_first"), ("mha", "page_first_direct"),
           ("mla", "layer_first"), ("mla", "page_first")]


def envelope(source, hashes):
    return {"protocol_version": "0.1", "actions": [
        {"action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": source, "block_hashes": list(hashes)}}]}


def hinted(source, hashes, request_id=None):
    info = {"kv_hint": envelope(source, hashes)}
    if request_id is not None:
        info["request_id"] = request_id
    return s.HiCacheStorageExtraInfo(extra_info=info)


def indices(pool, pages):
    """host_indices of whole pages, as the controller passes them."""
    return [p * pool.page_size + t for p in pages for t in range(pool.page_size)]


@pytest.fixture
def backends():
    made = []

    def make(kind="mha", layout="layer_first", pages=16, **extra):
        pool = sglang_pool(kind, layout, pages)
        b = sglang_backend(kind, layout, pool, **extra)
        made.append(b)
        return b, pool

    yield make
    for b in made:
        b.close()


# ---- zero copy in every layout ------------------------------------------------------

@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_pages_round_trip_zero_copy_in_every_host_layout(backends, kind, layout):
    b, pool = backends(kind, layout)
    assert isinstance(b, KVCRHiCacheStorage)
    assert b.control_endpoint.startswith("tcp://127.0.0.1:")
    size = pool.page_bytes()
    keys = [sglang_key(i) for i in range(6)]
    for i in range(6):
        pool.write_page(i * pool.page_size, sglang_page(i, size))
    assert b.batch_set_v1(keys, indices(pool, range(6))) == [True] * 6
    assert b.batch_set_v1(keys[:2], indices(pool, range(2))) == [True, True]  # idempotent
    assert b.batch_exists(keys) == 6
    # Leading hits only: a missing key stops the count.
    assert b.batch_exists(keys[:3] + [sglang_key(99)] + keys[3:]) == 3

    pool.kv_buffer.write(0, bytes(pool.kv_buffer.numel() * pool.dtype.itemsize))
    assert b.batch_get_v1(keys, indices(pool, range(8, 14))) == [True] * 6
    for i in range(6):
        assert pool.read_page((8 + i) * pool.page_size) == sglang_page(i, size)
        assert pool.read_page(i * pool.page_size) == bytes(size)  # untouched
    # Each piece landed where SGLang's own page pointers say it lives.
    ptrs, sizes = pool.get_page_buffer_meta(indices(pool, [8]))
    base, got = pool.kv_buffer.data_ptr(), b""
    for p, n in zip(ptrs, sizes):
        got += pool.kv_buffer.read(p - base, n)
    assert got == sglang_page(0, size)
    assert b.stats()["set_pages"] == 8 and b.stats()["get_pages"] == 6

    assert b.batch_get_v1([sglang_key(99), keys[0]], indices(pool, [14, 15])) == [False, True]
    b.clear()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys[:1], indices(pool, [15])) == [False]


def test_pages_spilled_to_g3_come_back_into_layer_first_pieces():
    d = tempfile.mkdtemp(prefix="kvcr-sgl-g3-", dir="/var/tmp")  # O_DIRECT: not tmpfs
    b = None
    try:
        # G3 slots are whole 4 KiB sectors: a page of 4 KiB (head_dim 64).
        pool = s.MHATokenToKVPoolHost(16 * 4, 4, 2, 2, 64, layout="layer_first")
        page = pool.page_bytes()
        assert page == 4096
        b = sglang_backend("mha", "layer_first", pool, dram_bytes=4 * page,
                           g3_paths=os.path.join(d, "g3"), g3_bytes_per_file=64 * page)
        keys = [sglang_key(i) for i in range(6)]
        for i in range(6):
            pool.write_page(i * pool.page_size, sglang_page(i, page))
        for at in range(0, 6, 2):  # more pages than KVCR DRAM holds: the oldest spill
            assert b.batch_set_v1(keys[at:at + 2], indices(pool, range(at, at + 2))) == [True] * 2
        deadline = time.monotonic() + 10
        while b.batch_exists(keys) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.batch_exists(keys) == 6
        assert [t for _, t in b._kv.query([b._key(k) for k in keys[:2]])] == [kvcr.CacheTier.G3] * 2
        pool.kv_buffer.write(0, bytes(pool.kv_buffer.numel() * pool.dtype.itemsize))
        # Pages 0 and 1 only G3 holds, 4 and 5 KVCR DRAM.
        assert b.batch_get_v1(keys[:2], indices(pool, [8, 9])) == [True] * 2
        assert b.batch_get_v1(keys[4:], indices(pool, [12, 13])) == [True] * 2
        for i, at in ((0, 8), (1, 9), (4, 12), (5, 13)):
            assert pool.read_page(at * pool.page_size) == sglang_page(i, page)
        assert os.path.exists(os.path.join(d, "g3.tp0"))
    finally:
        if b is not None:
            b.close()
        shutil.rmtree(d, ignore_errors=True)


def test_keys_carry_the_ranks_namespace_and_ports_the_rank_offset(backends):
    port = free_port_pair()
    b0, _ = backends(control_port=port, tp_rank=0)
    b1, _ = backends(control_port=port, tp_rank=1)
    assert b0.control_endpoint.partition("#")[0].endswith(f":{port}")
    assert b1.control_endpoint.partition("#")[0].endswith(f":{port + 1}")
    k = sglang_key(7)
    assert b0._key(k) != b1._key(k)
    assert b0._key(k).startswith(k.encode())
    m, _ = backends(kind="mla", control_port=0, tp_rank=1)
    assert b"tp1" not in m._key(k)  # MLA pages are the same on every rank


def free_port_pair() -> int:
    for _ in range(100):
        with socket.socket() as a, socket.socket() as c:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                c.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise AssertionError("no two free adjacent ports")


# ---- the legacy interface --------------------------------------------------------------

def test_legacy_flat_pages_round_trip(backends):
    b, pool = backends("mha", "layer_first", interface_v1=0)
    size = pool.page_bytes()
    pages = []
    for i in range(3):
        pool.write_page(i * pool.page_size, sglang_page(i, size))
        pages.append(pool.get_data_page(i * pool.page_size))
    keys = [sglang_key(i) for i in range(3)]
    assert b.batch_set(keys, pages) is True
    assert b.set(sglang_key(3), pages[0]) is True
    assert b.exists(keys[1]) and not b.exists(sglang_key(50))
    targets = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = b.batch_get(keys + [sglang_key(50)], targets)
    assert got[:3] == targets[:3] and got[3] is None
    for i in range(3):
        assert targets[i].read(0, size) == pages[i].read(0, size)
    one = pool.get_dummy_flat_data_page()
    assert b.get(sglang_key(3), one) is one and one.read(0, size) == pages[0].read(0, size)
    # Zero-copy calls are refused (logged) without interface_v1.
    assert b.batch_set_v1(keys, indices(pool, range(3))) == [False] * 3


# ---- SGLang's storage metrics --------------------------------------------------------

def test_get_stats_gives_sglang_the_pages_and_bandwidth_of_each_batch(backends):
    b, pool = backends("mha", "page_first", enable_storage_metrics=True)
    collector = s.StorageMetricsCollector()
    first = b.get_stats()
    assert isinstance(first, s.StorageMetrics) and first == s.StorageMetrics()
    size = pool.page_bytes()
    keys = [sglang_key(i) for i in range(5)]
    for i in range(5):
        pool.write_page(i * pool.page_size, sglang_page(i, size))
    assert b.batch_set_v1(keys[:3], indices(pool, range(3))) == [True] * 3
    assert b.batch_set_v1(keys[3:], indices(pool, range(3, 5))) == [True] * 2
    assert b.batch_get_v1(keys + [sglang_key(60)], indices(pool, range(8, 14))) == \
        [True] * 5 + [False]
    assert b.batch_get_v1([sglang_key(61)], indices(pool, [15])) == [False]  # moved nothing
    m = b.get_stats()
    collector.log_storage_metrics(m)  # what SGLang does with it: the type must be its own
    assert m.backup_pgs == [3, 2] and m.prefetch_pgs == [5]
    assert len(m.backup_bandwidth) == 2 and len(m.prefetch_bandwidth) == 1
    assert all(isinstance(v, float) and v > 0 for v in m.backup_bandwidth + m.prefetch_bandwidth)
    assert collector.histograms["backup_pgs"] == [3, 2]
    for i in range(5):
        assert pool.read_page((8 + i) * pool.page_size) == sglang_page(i, size)
    assert b.get_stats() == s.StorageMetrics()  # each batch is reported once
    # The legacy calls count as batches too.
    legacy, lpool = backends("mha", "layer_first", interface_v1=0, enable_storage_metrics=True)
    lpool.write_page(0, sglang_page(7, lpool.page_bytes()))
    assert legacy.batch_set([sglang_key(7)], [lpool.get_data_page(0)]) is True
    assert legacy.batch_get([sglang_key(7)], [lpool.get_dummy_flat_data_page()])[0] is not None
    lm = legacy.get_stats()
    assert lm.backup_pgs == [1] and lm.prefetch_pgs == [1]


def test_get_stats_is_empty_without_storage_metrics_and_none_without_the_type(backends,
                                                                              monkeypatch):
    b, pool = backends("mha", "page_first")  # enable_storage_metrics off: nothing is sampled
    pool.write_page(0, sglang_page(1, pool.page_bytes()))
    assert b.batch_set_v1([sglang_key(1)], indices(pool, [0])) == [True]
    assert b.get_stats() == s.StorageMetrics()
    # An SGLang whose metrics module cannot be imported gets None, as the base class gives.
    monkeypatch.setitem(sys.modules, "sglang.srt.metrics.collector", None)
    assert b.get_stats() is None


# ---- a peer pull steered by a hint --------------------------------------------------------

@pytest.mark.parametrize("kind,layout", [("mha", "layer_first"), ("mla", "page_first")])
def test_hinted_pages_are_hits_and_pulled_from_the_peer(backends, peers, kind, layout):
    src = peers(mode="sglang", pool=kind, layout=layout, n=6)
    b, pool = backends(kind, layout)
    size = pool.page_bytes()
    keys = [sglang_key(i) for i in range(6)]
    assert b.batch_exists(keys) == 0  # no hint: nothing here
    # SGLang's own events carry hashes signed: either form names the page.
    hashes = [sglang_hash(i) for i in range(6)]
    signed = [h - (1 << 64) if h >= 1 << 63 and i % 2 else h for i, h in enumerate(hashes)]
    assert any(h < 0 for h in signed)
    info = hinted(src.endpoint, signed, request_id="req-1")
    assert b.batch_exists(keys, info) == 6
    assert b.batch_exists(keys + [sglang_key(40)], info) == 6
    assert b.batch_get_v1(keys, indices(pool, range(4, 10)), info) == [True] * 6
    for i in range(6):
        assert pool.read_page((4 + i) * pool.page_size) == sglang_page(i, size)
    assert b.stats()["hinted_requests"] == 1
    # Without a request id the hint's own digest names the request.
    again = hinted(src.endpoint, hashes[:2])
    assert b.batch_get_v1(keys[:2], indices(pool, [12, 13]), again) == [True, True]
    assert pool.read_page(13 * pool.page_size) == sglang_page(1, size)
    assert b.stats()["hinted_requests"] == 2
    final = src.stop()
    assert final["set_pages"] == 6 and not final["warnings"]


def test_an_mla_rank_reads_the_pages_its_rank_0_stored(backends, peers):
    base = free_port_pair()
    src = peers(mode="sglang", pool="mla", layout="layer_first", n=4, port=base)
    assert src.endpoint.partition("#")[0].endswith(f":{base}")
    b, pool = backends("mla", "layer_first", control_port=base, tp_rank=1)
    keys = [sglang_key(i) for i in range(4)]
    # No router hint: every page counts as rank 0's (SGLang takes the least
    # of its ranks' counts, and rank 0 counts only what it holds) ...
    assert b.batch_exists(keys + [sglang_key(30)]) == 5
    # ... and the reads pull from rank 0 what it has.
    got = b.batch_get_v1(keys + [sglang_key(30)], indices(pool, range(8, 13)))
    assert got == [True] * 4 + [False]
    for i in range(4):
        assert pool.read_page((8 + i) * pool.page_size) == sglang_page(i, pool.page_bytes())
    mha, _ = backends("mha", "layer_first", control_port=base + 2, tp_rank=1)
    assert mha.batch_exists(keys) == 0  # MHA ranks hold their own heads: never rank 0's
    src.stop()


# ---- errors never raise ------------------------------------------------------------------

def test_data_path_calls_never_raise(backends, caplog):
    caplog.set_level(logging.WARNING, logger="kvcr.sglang")
    cfg = s.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                 is_mla_model=False, is_page_first_layout=False,
                                 model_name="m", extra_config={"interface_v1": 1})
    bare = KVCRHiCacheStorage(cfg, {})  # no host pool registered yet
    assert bare.batch_get_v1(["a"], [0, 1, 2, 3]) == [False]
    assert bare.batch_set_v1(["a"], [0, 1, 2, 3]) == [False]
    assert bare.batch_exists(["a"]) == 0
    assert bare.batch_get(["a"], [None]) == [None]
    assert bare.batch_set(["a"], [None]) is False
    bare.close()

    b, pool = backends()
    key = sglang_key(1)
    assert b.batch_set_v1([key], [1, 2, 3, 4]) == [False]        # not a whole page
    assert b.batch_set_v1([key], indices(pool, [99])) == [False]  # beyond the host pool
    bad = s.HiCacheStorageExtraInfo(extra_info={"kv_hint": {"protocol_version": "9"}})
    assert b.batch_exists([key], bad) == 0
    assert b.batch_get_v1([key], indices(pool, [0]), bad) == [False]
    torn = s.HiCacheStorageExtraInfo(extra_info={"kv_hint": "{not json"})
    assert b.batch_exists([key], torn) == 0
    assert b.batch_set([key], [pool.get_dummy_flat_data_page()]) is False  # v1 is on
    assert any("batch_set" in r.getMessage() for r in caplog.records)

    def boom(*a, **k):
        raise RuntimeError("KVCR went away")
    b._kv.deliver = boom
    assert b.batch_get_v1([key], indices(pool, [0])) == [False]
    assert b.stats()["failures"] >= 1
    b.close()
    assert b.batch_get_v1([key], indices(pool, [0])) == [False]
    assert b.batch_exists([key]) == 0
    b.close()  # twice is fine


def test_a_configuration_kvcr_refuses_fails_the_attach(backends):
    pool = sglang_pool("mha", "layer_first")
    with pytest.raises(ValueError, match="holds no page"):
        sglang_backend("mha", "layer_first", pool, dram_bytes=16)
    cfg = s.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                 is_mla_model=False, is_page_first_layout=False,
                                 model_name="m", extra_config={"module_path":
                                                               "json", "class_name": "JSONDecoder"})
    with pytest.raises(TypeError, match="not a subclass of HiCacheStorage"):
        s.StorageBackendFactory.create_dynamic(cfg, pool)


# ---- KV events ------------------------------------------------------------------------

def test_stored_pages_are_announced_by_their_router_hash(backends):
    from test_kv_events import ZmtpPeer, check_batch
    topic = b"kv@sglang-pod@test-model"
    d = tempfile.mkdtemp(prefix="kvcr-pytest-sgl-")
    try:
        b, pool = backends(kv_events_endpoint=f"ipc://{d}/pub", kv_events_topic=topic.decode())
        sub = ZmtpPeer(f"{d}/pub", b"SUB")
        sub.send([b"\x01" + topic])
        sub.s.settimeout(0.05)
        stored, parents = set(), {}

        def read_for(seconds):
            deadline = time.monotonic() + seconds
            for _ in range(10_000):
                if time.monotonic() > deadline:
                    return
                try:
                    frames = sub.message()
                except (socket.timeout, TimeoutError):
                    continue
                assert len(frames) == 3 and frames[0] == topic
                for kind, fields in check_batch(frames[2], 0, "CPU"):
                    if kind == "BlockStored":
                        stored.update(fields["block_hashes"])
                        assert fields["block_size"] == pool.page_size
                        assert fields["token_ids"] == []  # SGLang gives a backend none
                        parents[fields["block_hashes"][0]] = fields["parent_block_hash"]

        # The subscription joins some time after connecting: pages are set
        # until one is announced, then four more must all be.
        for i in range(40):
            assert b.batch_set_v1([sglang_key(i)], indices(pool, [i % 16])) == [True]
            read_for(0.1)
            if sglang_hash(i) in stored:
                break
        assert sglang_hash(i) in stored
        keys = [sglang_key(100 + j) for j in range(4)]
        info = s.HiCacheStorageExtraInfo(prefix_keys=[sglang_key(99)])
        assert b.batch_set_v1(keys, indices(pool, range(4)), info) == [True] * 4
        want = {sglang_hash(100 + j) for j in range(4)}
        for _ in range(100):
            if want <= stored:
                break
            read_for(0.1)
        assert want <= stored
        # An event names its first page's parent: the page before it (for
        # the batch's first, the last prefix key).
        assert parents[sglang_hash(100)] == sglang_hash(99)
        for j in range(1, 4):
            if sglang_hash(100 + j) in parents:
                assert parents[sglang_hash(100 + j)] == sglang_hash(99 + j)
        sub.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
