"""KVCR as SGLang's HiCache storage backend, with the real `sglang` package:
the backend built by SGLang's own storage backend factory from the extra
config of `--hicache-storage-backend dynamic`, over SGLang's real host pools
(MHA layer_first, page_first, page_first_direct, page_head; the asymmetric
MHA pool; MLA) on CPU tensors, and driven by SGLang's own HiCacheController
(its backup and prefetch threads) where it can be built on CPU. Every
transfer's bytes are compared. Hinted pulls run between two processes, each
with its own KVCR and control port on 127.0.0.1.

What cannot run here is a GPU: the "device" pools are CPU tensors, host
pools are built unpinned (SGLang's assembler pins with cudaHostRegister).
Peers are child processes (subprocess); every wait is bounded and every
child is reaped."""
import json
import logging
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import sglang_helpers as h
from kvcr.integrations.sglang import KVCRHiCacheStorage
from sglang.srt.managers.kv_hints import KvHintAction, KvHintsEnvelope
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageExtraInfo,
                                                  PoolHitPolicy, PoolName, PoolTransfer,
                                                  PoolTransferResult)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT = 60  # seconds: a peer's start (it imports SGLang), a controller's queue


@pytest.fixture
def backends():
    made = []

    def make(kind="mha", layout="page_first", pool=None, **extra):
        pool = pool if pool is not None else h.host_pool(kind, layout)
        b = h.factory_backend(pool, kind, layout, **extra)
        made.append(b)
        return b, pool

    yield make
    for b in made:
        b.close()


@pytest.fixture(scope="module")
def model_dir():
    d = tempfile.mkdtemp(prefix="kvcr-sgl-model-")
    yield d
    import shutil
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def controllers(model_dir):
    made = []

    def make(kind="mha", layout="page_first", **extra):
        c = h.controller(kind, layout, model_dir, **extra)
        made.append(c)
        return c

    yield make
    for c in made:
        c.detach_storage_backend()


class Peer:
    """A peer process (sglang_peer.py): its control endpoint and page keys."""

    def __init__(self, **opts) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "sglang_peer.py"),
                                      json.dumps(opts)], cwd=HERE, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        first = self.line()
        self.endpoint, self.keys, self.stored = first["endpoint"], first["keys"], first["stored"]
        self.seed = opts["seed"]

    def line(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        assert ready, "the peer said nothing in time"
        text = self.proc.stdout.readline()
        assert text, f"the peer exited ({self.proc.poll()})"
        return json.loads(text)

    def stop(self) -> dict:
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        stats = self.line()["stats"]
        assert self.proc.wait(timeout=WAIT) == 0
        return stats

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


@pytest.fixture
def peers():
    made = []

    def start(**opts):
        opts.setdefault("via", "factory")
        made.append(Peer(**opts))
        return made[-1]

    yield start
    for p in made:
        p.reap()


def envelope(source, hashes):
    return {"protocol_version": "0.1", "message_id": "m-1", "actions": [
        {"action_id": "a-1", "action_type": "kv.fetch", "action_version": "1.0",
         "payload": {"source_control_endpoint": source, "block_hashes": list(hashes)}}]}


def signed(hashes):
    """Hashes as SGLang's own KV events send them (int64)."""
    return [x - (1 << 64) if x >= 1 << 63 else x for x in hashes]


def free_ports(n: int) -> int:
    """A base port with n free ports from it on 127.0.0.1, below the
    kernel's ephemeral range (32768 and up here), where no other process's
    outgoing connection or any-port bind can take one before the backend
    binds it (a peer binds its port seconds later, once SGLang imported)."""
    import random
    errors = []
    for _ in range(100):
        base = random.randrange(20000, 32000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError as exc:
            errors.append(exc)
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} free adjacent ports: {errors[-3:]}")


# ---- the factory-built backend over every real host pool ------------------------------

@pytest.mark.parametrize("kind,layout", h.KINDS)
def test_factory_built_backend_round_trips_pages_of_every_host_pool(backends, kind, layout):
    b, pool = backends(kind, layout)
    # SGLang's factory built it (dynamic: backend_name / module_path / class_name).
    assert type(b) is KVCRHiCacheStorage and isinstance(b, HiCacheStorage)
    assert b.control_endpoint.startswith("tcp://127.0.0.1:")
    # The real pool holds one page more than the device pool x ratio: the
    # padding page, which is a page like any other to storage.
    assert pool.size == (2 * h.DEVICE_PAGES + 1) * h.PAGE
    last = pool.size // h.PAGE - 1
    size = h.page_bytes(pool)
    keys = [h.page_key(i) for i in range(6)]
    where = [0, 1, 2, 3, 4, last]
    data = [h.fill_page(pool, p, i) for i, p in enumerate(where)]
    host_indices = h.indices(pool, where)
    assert host_indices.dtype == torch.int64
    assert b.batch_set_v1(keys, host_indices) == [True] * 6
    assert b.batch_set_v1(keys[:2], h.indices(pool, where[:2])) == [True, True]  # idempotent
    assert b.batch_exists(keys) == 6
    # Leading hits only: a missing key stops the count.
    assert b.batch_exists(keys[:3] + [h.page_key(99)] + keys[3:]) == 3

    h.zero_pool(pool)
    assert b.batch_get_v1(keys, h.indices(pool, range(8, 14))) == [True] * 6
    for i in range(6):
        assert h.read_page(pool, 8 + i) == data[i]
    for p in where:
        assert h.read_page(pool, p) == bytes(size)  # untouched
    assert b.stats()["set_pages"] == 8 and b.stats()["get_pages"] == 6

    assert b.batch_get_v1([h.page_key(99), keys[0]], h.indices(pool, [14, 15])) == \
        [False, True]
    b.clear()
    assert b.batch_exists(keys) == 0
    assert b.batch_get_v1(keys[:1], h.indices(pool, [15])) == [False]


class PoolBefore202602:
    """An MLA host pool as SGLang releases before 2026-02 show it to a
    backend: no kv_cache_dim attribute (those pools size a token by
    kv_lora_rank + qk_rope_head_dim). Stands for an older SGLang, which
    cannot be installed beside this one: every other attribute and method
    is the real 0.5.23 pool's, whose own methods keep their geometry."""

    def __init__(self, pool) -> None:
        self._pool = pool

    def __getattr__(self, name):
        if name == "kv_cache_dim":
            raise AttributeError(name)
        return getattr(self._pool, name)


def test_an_mla_pool_without_kv_cache_dim_attaches(backends):
    real = h.host_pool("mla", "layer_first")
    pool = PoolBefore202602(real)
    assert not hasattr(pool, "kv_cache_dim")
    b, _ = backends("mla", "layer_first", pool=pool)
    data = h.fill_page(real, 3, 7)
    assert b.batch_set_v1([h.page_key(7)], h.indices(real, [3])) == [True]
    assert b.batch_get_v1([h.page_key(7)], h.indices(real, [9])) == [True]
    assert h.read_page(real, 9) == data


def test_keys_carry_the_ranks_namespace_and_ports_the_rank_offset(backends):
    port = free_ports(2)
    b0, _ = backends(control_port=port, tp_rank=0, tp_size=2)
    b1, _ = backends(control_port=port, tp_rank=1, tp_size=2)
    assert b0.control_endpoint.partition("#")[0].endswith(f":{port}")
    assert b1.control_endpoint.partition("#")[0].endswith(f":{port + 1}")
    k = h.page_key(7)
    assert b0._key(k) != b1._key(k)
    assert b0._key(k).startswith(k.encode())
    m, _ = backends("mla", "layer_first", control_port=0, tp_rank=1, tp_size=2)
    assert b"tp1" not in m._key(k)  # MLA pages are the same on every rank


def test_pages_spilled_to_g3_come_back_into_layer_first_pieces(backends):
    d = tempfile.mkdtemp(prefix="kvcr-sgl-g3-", dir="/var/tmp")  # O_DIRECT: not tmpfs
    try:
        # G3 slots are whole 4 KiB sectors: a page of 4 KiB (head_dim 64).
        pool = h.host_pool("mha", "layer_first", head_dim=64)
        page = h.page_bytes(pool)
        assert page == 4096
        b, _ = backends("mha", "layer_first", pool=pool, dram_bytes=4 * page,
                        g3_paths=os.path.join(d, "g3"), g3_bytes_per_file=64 * page)
        keys = [h.page_key(i) for i in range(6)]
        data = [h.fill_page(pool, i, i) for i in range(6)]
        for at in range(0, 6, 2):  # more pages than KVCR DRAM holds: the oldest spill
            assert b.batch_set_v1(keys[at:at + 2], h.indices(pool, range(at, at + 2))) == \
                [True] * 2
        deadline = time.monotonic() + 10
        while b.batch_exists(keys) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.batch_exists(keys) == 6
        import kvcr
        assert [t for _, t in b._kv.query([b._key(k) for k in keys[:2]])] == \
            [kvcr.CacheTier.G3] * 2
        h.zero_pool(pool)
        # Pages 0 and 1 only G3 holds, 4 and 5 KVCR DRAM.
        assert b.batch_get_v1(keys[:2], h.indices(pool, [8, 9])) == [True] * 2
        assert b.batch_get_v1(keys[4:], h.indices(pool, [12, 13])) == [True] * 2
        for i, at in ((0, 8), (1, 9), (4, 12), (5, 13)):
            assert h.read_page(pool, at) == data[i]
        assert os.path.exists(os.path.join(d, "g3.tp0"))
        # libkvcr's G3 takes one KVCR pool, the KV pool's: flat (draft)
        # pages and other host pools are refused, not lost silently.
        assert b.batch_set([keys[0] + ".draft"], [pool.get_data_page(0)]) is False
        b.register_mem_host_pool_v2(h.host_pool("mha", "layer_first", layers=1),
                                    PoolName.DRAFT)
        assert b.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=h.indices(
            pool, [0]), keys=keys[:1])]) == {PoolName.DRAFT: [False]}
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


# ---- SGLang's own cache controller --------------------------------------------------

@pytest.mark.parametrize("kind,layout,v1", [
    ("mha", "layer_first", 1), ("mha", "page_first", 1), ("mha", "page_first_direct", 1),
    ("mha", "page_head", 1), ("mla", "layer_first", 1), ("mla", "page_first", 1),
    ("mha", "page_first", 0), ("mla", "layer_first", 0)])
def test_the_controller_backs_up_and_prefetches_pages(controllers, kind, layout, v1):
    ctrl = controllers(kind, layout, interface_v1=v1, metrics=True)
    backend, pool = ctrl.storage_backend, ctrl.mem_pool_host
    assert type(backend) is KVCRHiCacheStorage
    # interface_v1 decides whether SGLang calls the zero-copy or the legacy pair.
    assert ctrl.page_set_func.__name__ == ("_page_set_zero_copy" if v1 else "_generic_page_set")
    tokens = h.token_ids(5, 6)
    where = pool.alloc(6 * h.PAGE)
    data = [h.fill_page(pool, int(where[i * h.PAGE]) // h.PAGE, 50 + i) for i in range(6)]
    assert h.backup(ctrl, where, tokens) == 6 * h.PAGE
    # The controller hashes the tokens to SGLang's own keys; they are stored.
    assert backend.batch_exists(h.storage_keys(tokens)) == 6
    h.zero_pool(pool)
    pool.free(where)
    # A longer request: the stored prefix is a hit, the rest is not.
    got, completed = h.prefetch(ctrl, "req-a", tokens + h.token_ids(6, 2))
    assert completed == 6 * h.PAGE
    for i in range(6):
        assert h.read_page(pool, int(got[i * h.PAGE]) // h.PAGE) == data[i]
    # An unknown request is no hit, and nothing is read.
    assert h.prefetch(ctrl, "req-b", h.token_ids(7, 3)) == (None, 0)
    # SGLang's metrics: the type the installed SGLang's collector takes.
    from sglang.srt.observability.metrics_collector import StorageMetrics
    m = backend.get_stats()
    assert type(m) is StorageMetrics
    assert m.backup_pgs == [6] and m.prefetch_pgs == [6]


def test_a_backend_kvcr_refuses_fails_the_controllers_attach(model_dir):
    with pytest.raises(ValueError, match="holds no page"):
        h.controller("mha", "page_first", model_dir, dram_bytes=16)


def test_the_factory_refuses_a_class_that_is_no_hicache_storage():
    cfg = h.storage_config("mha", "page_first")
    cfg.extra_config.update(module_path="json", class_name="JSONDecoder")
    with pytest.raises(TypeError, match="must inherit from HiCacheStorage"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)


# ---- SGLang's storage metrics ------------------------------------------------------------

def test_get_stats_gives_sglang_the_pages_and_bandwidth_of_each_batch(backends):
    from sglang.srt.observability.metrics_collector import (StorageMetrics,
                                                            StorageMetricsCollector)
    b, pool = backends("mha", "page_first", metrics=True)
    first = b.get_stats()
    assert type(first) is StorageMetrics and first == StorageMetrics()
    keys = [h.page_key(i) for i in range(5)]
    data = [h.fill_page(pool, i, i) for i in range(5)]
    assert b.batch_set_v1(keys[:3], h.indices(pool, range(3))) == [True] * 3
    assert b.batch_set_v1(keys[3:], h.indices(pool, range(3, 5))) == [True] * 2
    assert b.batch_get_v1(keys + [h.page_key(60)], h.indices(pool, range(8, 14))) == \
        [True] * 5 + [False]
    assert b.batch_get_v1([h.page_key(61)], h.indices(pool, [15])) == [False]  # moved nothing
    m = b.get_stats()
    # What SGLang does with it: its own collector observes every entry.
    StorageMetricsCollector(labels={"model_name": "kvcr-test"}).log_storage_metrics(m)
    assert m.backup_pgs == [3, 2] and m.prefetch_pgs == [5]
    assert len(m.backup_bandwidth) == 2 and len(m.prefetch_bandwidth) == 1
    assert all(isinstance(v, float) and v > 0 for v in m.backup_bandwidth + m.prefetch_bandwidth)
    for i in range(5):
        assert h.read_page(pool, 8 + i) == data[i]
    assert b.get_stats() == StorageMetrics()  # each batch is reported once
    # The legacy calls count as batches too.
    legacy, lpool = backends("mha", "layer_first", interface_v1=0, metrics=True)
    h.fill_page(lpool, 0, 7)
    assert legacy.batch_set([h.page_key(7)], [lpool.get_data_page(0)]) is True
    assert legacy.batch_get([h.page_key(7)], [lpool.get_dummy_flat_data_page()])[0] is not None
    lm = legacy.get_stats()
    assert lm.backup_pgs == [1] and lm.prefetch_pgs == [1]


def test_get_stats_finds_the_metrics_type_where_sglang_keeps_it(backends, monkeypatch):
    b, pool = backends("mha", "page_first")  # enable_storage_metrics off: nothing is sampled
    h.fill_page(pool, 0, 1)
    assert b.batch_set_v1([h.page_key(1)], h.indices(pool, [0])) == [True]
    from sglang.srt.observability.metrics_collector import StorageMetrics
    assert b.get_stats() == StorageMetrics()
    # An SGLang from before 2026-02 keeps it in sglang.srt.metrics.collector.
    old = type("module", (), {"StorageMetrics": StorageMetrics})
    monkeypatch.setitem(sys.modules, "sglang.srt.observability.metrics_collector", None)
    monkeypatch.setitem(sys.modules, "sglang.srt.metrics.collector", old)
    assert type(b.get_stats()) is StorageMetrics
    # One with neither gets None, as the base class gives.
    monkeypatch.setitem(sys.modules, "sglang.srt.metrics.collector", None)
    assert b.get_stats() is None


# ---- the legacy calls, and speculative decoding's draft pages ----------------------------

def test_legacy_flat_pages_round_trip(backends):
    b, pool = backends("mha", "layer_first", interface_v1=0)
    keys = [h.page_key(i) for i in range(3)]
    data = [h.fill_page(pool, i, i) for i in range(3)]
    pages = [pool.get_data_page(i * h.PAGE) for i in range(3)]  # SGLang's own flat pages
    assert b.batch_set(keys, pages) is True
    assert b.set(h.page_key(3), pages[0]) is True
    assert b.exists(keys[1]) and not b.exists(h.page_key(50))
    assert b.batch_exists(keys + [h.page_key(50)]) == 3
    targets = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = b.batch_get(keys + [h.page_key(50)], targets)
    assert got[:3] == targets[:3] and got[3] is None
    h.zero_pool(pool)
    for i in range(3):
        pool.set_from_flat_data_page((8 + i) * h.PAGE, targets[i])
        assert h.read_page(pool, 8 + i) == data[i]
    one = pool.get_dummy_flat_data_page()
    assert b.get(h.page_key(3), one) is one
    assert torch.equal(one.view(torch.int16), targets[0].view(torch.int16))  # bytes, NaN too
    # Zero-copy calls are refused (logged) without interface_v1.
    assert b.batch_set_v1(keys, h.indices(pool, range(3))) == [False] * 3


def test_draft_pages_are_stored_and_served_through_the_legacy_calls_with_v1(backends):
    # Speculative decoding's draft KV: "<key>.draft" flat pages of the
    # draft model's (one-layer) host pool, sent through batch_set /
    # batch_get even with interface_v1 on.
    b, pool = backends("mha", "page_first")
    draft = h.host_pool("mha", "page_first", layers=1)
    keys = [h.page_key(i) + ".draft" for i in range(3)]
    data = [h.fill_page(draft, i, 30 + i) for i in range(3)]
    assert b.batch_set(keys, [draft.get_data_page(i * h.PAGE) for i in range(3)]) is True
    assert b.exists(keys[0]) and not b.exists(h.page_key(0))  # not a KV page
    targets = [draft.get_dummy_flat_data_page() for _ in range(4)]
    got = b.batch_get(keys + [h.page_key(9) + ".draft"], targets)
    assert got[:3] == targets[:3] and got[3] is None
    for i in range(3):
        draft.set_from_flat_data_page((5 + i) * h.PAGE, targets[i])
        assert h.read_page(draft, 5 + i) == data[i]
    # KV pages and draft pages do not meet.
    h.fill_page(pool, 0, 1)
    assert b.batch_set_v1([h.page_key(0)], h.indices(pool, [0])) == [True]
    assert b.batch_exists([h.page_key(0)]) == 1 and b.batch_exists([keys[0]]) == 0
    # A flat page larger than a KV page is refused, not truncated.
    big = h.host_pool("mha", "page_first", layers=3)
    assert b.batch_set([h.page_key(5) + ".draft"], [big.get_data_page(0)]) is False


# ---- the hybrid controller's v2 calls ----------------------------------------------------

def test_v2_calls_store_and_serve_other_host_pools(backends, caplog):
    caplog.set_level(logging.WARNING, logger="kvcr.sglang")
    b, pool = backends("mha", "page_first")
    draft = h.host_pool("mha", "page_first", layers=1)
    swa = h.host_pool("mha", "layer_first", layers=1)
    # The hybrid controller's attach: the anchor pool, then every pool by name.
    b.register_mem_host_pool_v2(pool, PoolName.KV)
    b.register_mem_host_pool_v2(draft, PoolName.DRAFT)
    b.register_mem_host_pool_v2(swa, PoolName.SWA)
    b.on_host_pools_registered()
    keys = [h.page_key(i) for i in range(4)]
    kv_data = [h.fill_page(pool, i, i) for i in range(4)]
    draft_data = [h.fill_page(draft, i, 40 + i) for i in range(4)]
    swa_data = [h.fill_page(swa, i, 80 + i) for i in range(4)]
    assert b.batch_set_v1(keys, h.indices(pool, range(4))) == [True] * 4
    out = b.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=h.indices(draft,
                                                                                 range(4)),
                                       keys=keys),
                          PoolTransfer(name=PoolName.SWA, host_indices=h.indices(swa, [2, 3]),
                                       keys=keys[2:])])
    assert out == {PoolName.DRAFT: [True] * 4, PoolName.SWA: [True, True]}

    r = b.batch_exists_v2(keys + [h.page_key(9)], [
        PoolTransfer(name=PoolName.DRAFT, hit_policy=PoolHitPolicy.ALL_PAGES),
        PoolTransfer(name=PoolName.SWA, keys=keys[2:], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert type(r) is PoolTransferResult
    # SWA holds only pages 2 and 3: the prefixes it can restore end at 3 or 4.
    assert r.kv_hit_pages == 4 and r.restorable_prefix_pages == [4]
    assert r.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.DRAFT: 4, PoolName.SWA: 4}
    short = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys[2:],
                                                  hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert short.kv_hit_pages == 0 and short.extra_pool_hit_pages == {PoolName.KV: 4}

    h.zero_pool(draft)
    h.zero_pool(swa)
    got = b.batch_get_v2([
        PoolTransfer(name=PoolName.DRAFT, host_indices=h.indices(draft, range(6, 10)),
                     keys=keys),
        PoolTransfer(name=PoolName.SWA, host_indices=h.indices(swa, [6, 7, 8]),
                     keys=keys[1:])])
    assert got == {PoolName.DRAFT: [True] * 4, PoolName.SWA: [False, True, True]}
    for i in range(4):
        assert h.read_page(draft, 6 + i) == draft_data[i]
    assert [h.read_page(swa, p) for p in (7, 8)] == swa_data[2:]
    # KV pages are served beside them.
    h.zero_pool(pool)
    assert b.batch_get_v1(keys, h.indices(pool, range(10, 14))) == [True] * 4
    assert [h.read_page(pool, 10 + i) for i in range(4)] == kv_data
    # A pool never registered fails its transfers alone; never raises.
    mixed = b.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=h.indices(swa, [0]),
                                         keys=keys[:1]),
                            PoolTransfer(name=PoolName.DRAFT,
                                         host_indices=h.indices(draft, [11]), keys=keys[:1])])
    assert mixed == {PoolName.MAMBA: [False], PoolName.DRAFT: [True]}
    odd = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT,
                                                hit_policy=PoolHitPolicy.BLOCK_GROUPS)])
    assert odd.kv_hit_pages == 0
    assert any("hit policy" in r.getMessage() for r in caplog.records)


def test_the_hybrid_controller_backs_up_and_prefetches_a_draft_sidecar(model_dir):
    # SGLang's own HybridCacheController: it registers the draft pool
    # (register_mem_host_pool_v2, on_host_pools_registered), backs the
    # draft sidecar up with batch_set_v2 beside batch_set_v1, asks
    # batch_exists_v2, and reads the draft pages with batch_get_v2 into the
    # KV pages' host indices.
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
    ctrl, kv, draft = h.hybrid_controller(model_dir)
    try:
        backend = ctrl.storage_backend
        assert list(backend._extra_pools) == [str(PoolName.DRAFT)]
        sidecar = [PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV)]
        tokens = h.token_ids(9, 4)
        where = kv.alloc(4 * h.PAGE)
        pages = [int(where[i * h.PAGE]) // h.PAGE for i in range(4)]
        kv_data = [h.fill_page(kv, p, i) for i, p in enumerate(pages)]
        draft_data = [h.fill_page(draft, p, 100 + i) for i, p in enumerate(pages)]
        ctrl.write_storage(where, tokens, hash_value=h.storage_keys(tokens), prefix_keys=[],
                           extra_pools=sidecar)
        op = ctrl.ack_backup_queue.get(timeout=WAIT)
        assert op.completed_tokens == 4 * h.PAGE
        assert op.pool_storage_result.extra_pool_hit_pages == {PoolName.DRAFT: 4}
        h.zero_pool(kv)
        h.zero_pool(draft)
        kv.free(where)
        ctrl.prefetch(CacheRequestHandle("req-h", 0), tokens, None, [],
                      extra_pools=[PoolTransfer(name=PoolName.DRAFT,
                                                indices_from_pool=PoolName.KV)])
        op = ctrl.prefetch_hit_queue.get(timeout=WAIT)
        assert op.storage_hit_count == 4 * h.PAGE
        op.host_indices = ctrl.alloc_prefetch_host_buffers(op, op.storage_hit_count)
        ctrl.prefetch_buffer.put(op)
        completed = 0
        for _ in range(100):
            ack = ctrl.ack_prefetch_queue.get(timeout=WAIT)
            completed = max(completed, ack.completed_tokens or 0)
            if ack.completed_req:
                break
        assert ack.completed_req and completed == 4 * h.PAGE
        got = [int(op.host_indices[i * h.PAGE]) // h.PAGE for i in range(4)]
        assert [h.read_page(kv, p) for p in got] == kv_data
        assert [h.read_page(draft, p) for p in got] == draft_data
    finally:
        ctrl.detach_storage_backend()


# ---- router hints: the shapes SGLang carries -----------------------------------------------

@pytest.mark.parametrize("kind,layout", [("mha", "layer_first"), ("mla", "page_first")])
def test_hints_in_every_shape_sglang_carries_pull_pages_from_the_peer(backends, peers, kind,
                                                                      layout):
    src = peers(kind=kind, layout=layout, n=6, seed=3)
    assert src.stored == 6
    b, pool = backends(kind, layout)
    size = h.page_bytes(pool)
    keys = [h.page_key(i) for i in range(6)]
    hashes = [h.page_hash(i) for i in range(6)]
    assert any(x < 0 for x in signed(hashes))
    assert b.batch_exists(keys) == 0  # no hint: nothing here
    shapes = [
        # the kv_hint envelope (hashes signed, as SGLang's events send them)
        {"kv_hint": envelope(src.endpoint, signed(hashes)), "request_id": "req-1"},
        # SGLang's request field, a msgspec KvHintsEnvelope
        {"kv_hints": KvHintsEnvelope(protocol_version="0.1", message_id="m-2", actions=[
            KvHintAction(action_id="a", action_type="kv.fetch", action_version="1.0",
                         payload={"source_control_endpoint": src.endpoint,
                                  "block_hashes": hashes})])},
        # one SGLang branch's bare payload
        {"kvcc_router_hint": {"source_control_endpoint": src.endpoint,
                              "block_hashes": signed(hashes)}},
        # JSON text, hashes as 16 hex digits
        {"kv_hint": json.dumps(envelope(src.endpoint, [format(x, "016x") for x in hashes]))},
    ]
    for n, shape in enumerate(shapes):
        info = HiCacheStorageExtraInfo(prefix_keys=[], extra_info=shape)
        assert b.batch_exists(keys + [h.page_key(40)], info) == 6
        at = 1 + n * 4
        assert b.batch_get_v1(keys[n:n + 2], h.indices(pool, [at, at + 1]), info) == [True] * 2
        for j in range(2):
            assert h.read_page(pool, at + j) == h.page_data(3000 + n + j, size)
    assert b.stats()["hinted_requests"] == 4
    final = src.stop()
    assert final["set_pages"] == 6 and final["warnings"] == []


def test_an_mha_rank_pulls_from_the_same_rank_of_the_hinted_source(backends, peers):
    base = free_ports(2)
    # The source's TP rank 1 binds base + 1; the hint names base (rank 0's,
    # what SGLang publishes).
    src = peers(kind="mha", layout="page_first", n=3, seed=4, tp_rank=1, tp_size=2,
                control_port=base)
    assert src.endpoint.partition("#")[0].endswith(f":{base + 1}")
    b, pool = backends("mha", "page_first", tp_rank=1, tp_size=2)
    rank0 = src.endpoint.replace(f":{base + 1}", f":{base}")
    info = HiCacheStorageExtraInfo(extra_info={"kv_hint": envelope(
        rank0, [h.page_hash(i) for i in range(3)])})
    assert b.batch_get_v1([h.page_key(i) for i in range(3)], h.indices(pool, [5, 6, 7]),
                          info) == [True] * 3
    for i in range(3):
        assert h.read_page(pool, 5 + i) == h.page_data(4000 + i, h.page_bytes(pool))


def test_an_mla_rank_reads_the_pages_its_rank_0_stored(backends, peers):
    base = free_ports(3)
    src = peers(kind="mla", layout="layer_first", n=4, seed=5, control_port=base)
    assert src.endpoint.partition("#")[0].endswith(f":{base}")
    b, pool = backends("mla", "layer_first", control_port=base, tp_rank=1, tp_size=2)
    keys = [h.page_key(i) for i in range(4)]
    # No router hint: every page counts as rank 0's (SGLang takes the least
    # of its ranks' counts, and rank 0 counts only what it holds) ...
    assert b.batch_exists(keys + [h.page_key(30)]) == 5
    # ... and the reads pull from rank 0 what it has.
    got = b.batch_get_v1(keys + [h.page_key(30)], h.indices(pool, range(8, 13)))
    assert got == [True] * 4 + [False]
    for i in range(4):
        assert h.read_page(pool, 8 + i) == h.page_data(5000 + i, h.page_bytes(pool))
    mha, _ = backends("mha", "layer_first", control_port=base + 2, tp_rank=1, tp_size=2)
    assert mha.batch_exists(keys) == 0  # MHA ranks hold their own heads: never rank 0's
    src.stop()


# ---- router hints by prefix: what needs nothing from SGLang ------------------------------

def send_hints(endpoint: str, lines: list) -> list:
    """The router's side of the hint listener: a JSON hint per line, one
    answer per line."""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as s:
        f = s.makefile("rwb")
        out = []
        for line in lines:
            f.write(line.encode() + b"\n")
            f.flush()
            out.append(f.readline().decode().strip())
        return out


def test_a_router_hint_by_prefix_steers_the_controllers_prefetch(controllers, peers,
                                                                 model_dir):
    # The source: another SGLang process whose own controller backed the
    # pages of a prompt up into its KVCR.
    src = peers(kind="mha", layout="page_first", n=5, seed=6, via="controller",
                model_dir=model_dir)
    assert src.stored == 5
    tokens = h.token_ids(6, 5)
    assert src.keys == h.storage_keys(tokens)
    # The target: SGLang's controller; SGLang passes the backend no hint
    # (HiCacheStorageExtraInfo(prefix_keys=...) only).
    ctrl = controllers("mha", "page_first", hint_port=0)
    backend, pool = ctrl.storage_backend, ctrl.mem_pool_host
    assert backend.hint_endpoint.startswith("tcp://127.0.0.1:")
    assert h.prefetch(ctrl, "before", tokens) == (None, 0)
    # The router hands the target's KVCR the hint, keyed by the pages'
    # hashes, before it sends the request; bad lines are answered, and the
    # listener goes on.
    hint = envelope(src.endpoint, signed([int(k[:16], 16) for k in src.keys]))
    answers = send_hints(backend.hint_endpoint, [
        "{not json", json.dumps({"protocol_version": "0.1", "actions": [
            {"action_type": "kv.fetch", "action_version": "1.0",
             "payload": {"block_hashes": [True]}}]}),
        json.dumps(hint)])
    assert answers[0].startswith("error: invalid router hint")
    assert answers[1].startswith("error: invalid router hint")
    assert answers[2] == "ok 5"
    got, completed = h.prefetch(ctrl, "req-p", tokens + h.token_ids(60, 1))
    assert completed == 5 * h.PAGE
    size = h.page_bytes(pool)
    for i in range(5):
        assert h.read_page(pool, int(got[i * h.PAGE]) // h.PAGE) == \
            h.page_data(6000 + i, size)
    assert backend.stats()["prefix_hints"] == 1
    # In process, the same: submit_prefix_hint (here with a request id).
    assert backend.submit_prefix_hint({"kv_hint": hint, "request_id": "r-2"}) == 5
    with pytest.raises(ValueError, match="invalid router hint"):
        backend.submit_prefix_hint({"kvcc_router_hint": {"block_hashes": "nope"}})
    assert src.stop()["set_pages"] == 5


def test_the_hint_listener_serves_a_bounded_number_of_routers(backends):
    from kvcr.integrations.sglang import HINT_CONNECTIONS_MAX
    b, _ = backends(hint_port=0)
    host, port = b.hint_endpoint[len("tcp://"):].rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10)
            for _ in range(HINT_CONNECTIONS_MAX)]
    try:
        for s in held:  # each is served: a blank line is read and skipped
            s.sendall(b"\n{not json\n")
            assert s.makefile("rb").readline().startswith(b"error: invalid router hint")
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            assert extra.makefile("rb").readline() == b"error: too many hint connections\n"
        assert b.stats()["hint_connections_refused"] == 1
    finally:
        for s in held:
            s.close()


# ---- errors never raise --------------------------------------------------------------------

def test_data_path_calls_never_raise(backends, caplog):
    caplog.set_level(logging.WARNING, logger="kvcr.sglang")
    bare = KVCRHiCacheStorage(h.storage_config("mha", "page_first", interface_v1=1), {})
    ps = h.PAGE
    idx = torch.arange(ps, dtype=torch.int64)
    assert bare.batch_get_v1(["a"], idx) == [False]  # no host pool registered yet
    assert bare.batch_set_v1(["a"], idx) == [False]
    assert bare.batch_exists(["a"]) == 0
    assert bare.batch_get(["a"], [None]) == [None]
    assert bare.batch_set(["a"], [None]) is False
    assert bare.batch_exists_v2(["a"]).kv_hit_pages == 0
    assert bare.batch_get_v2([PoolTransfer(name=PoolName.KV, host_indices=idx,
                                           keys=["a"])]) == {PoolName.KV: [False]}
    bare.close()

    b, pool = backends()
    key = h.page_key(1)
    pages = pool.size // ps
    assert b.batch_set_v1([key], torch.arange(1, 5, dtype=torch.int64)) == [False]  # unaligned
    assert b.batch_set_v1([key], idx[:2]) == [False]                        # not a whole page
    assert b.batch_set_v1([key], h.indices(pool, [pages])) == [False]      # beyond the pool
    for bad in ({"kv_hint": {"protocol_version": "9"}}, {"kv_hint": "{not json"},
                {"kvcc_router_hint": {"source_control_endpoint": "tcp://127.0.0.1:1",
                                      "block_hashes": [1.5]}},
                {"kv_hints": {"actions": "none"}}):
        info = HiCacheStorageExtraInfo(extra_info=bad)
        assert b.batch_exists([key], info) == 0
        assert b.batch_get_v1([key], h.indices(pool, [0]), info) == [False]

    def boom(*a, **k):
        raise RuntimeError("KVCR went away")
    b._kv.deliver = boom
    assert b.batch_get_v1([key], h.indices(pool, [0])) == [False]
    assert any("not 1 whole pages" in r.getMessage() for r in caplog.records)
    assert b.stats()["failures"] >= 1
    b.close()
    assert b.batch_get_v1([key], h.indices(pool, [0])) == [False]
    assert b.batch_exists([key]) == 0
    b.close()  # twice is fine


# ---- KV events ------------------------------------------------------------------------------

def test_stored_pages_are_announced_by_their_router_hash(backends):
    import msgspec
    import zmq
    topic = b"kv@sglang-pod@test-model"
    d = tempfile.mkdtemp(prefix="kvcr-sgl-ev-")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        b, pool = backends(kv_events_endpoint=f"ipc://{d}/pub", kv_events_topic=topic.decode())
        sub.connect(f"ipc://{d}/pub")
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        stored, parents = set(), {}

        def read_for(seconds):
            deadline = time.monotonic() + seconds
            while sub.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                frames = sub.recv_multipart()
                assert len(frames) == 3 and frames[0] == topic
                ts, events, rank = msgspec.msgpack.decode(frames[2])
                assert rank == 0
                for ev in events:
                    kind, fields = ev["type"], ev
                    if kind == "BlockStored":
                        stored.update(fields["block_hashes"])
                        assert fields["block_size"] == h.PAGE
                        assert fields["token_ids"] == []  # SGLang gives a backend none
                        parents[fields["block_hashes"][0]] = fields["parent_block_hash"]
                if time.monotonic() > deadline:
                    return

        # The subscription joins some time after connecting: pages are set
        # until one is announced, then four more must all be.
        for i in range(40):
            assert b.batch_set_v1([h.page_key(i)], h.indices(pool, [i % 16])) == [True]
            read_for(0.1)
            if h.page_hash(i) in stored:
                break
        assert h.page_hash(i) in stored
        keys = [h.page_key(100 + j) for j in range(4)]
        info = HiCacheStorageExtraInfo(prefix_keys=[h.page_key(99)])
        assert b.batch_set_v1(keys, h.indices(pool, range(4)), info) == [True] * 4
        want = {h.page_hash(100 + j) for j in range(4)}
        for _ in range(100):
            if want <= stored:
                break
            read_for(0.1)
        assert want <= stored
        # An event names its first page's parent: the page before it (for
        # the batch's first, the last prefix key).
        assert parents[h.page_hash(100)] == h.page_hash(99)
        for j in range(1, 4):
            if h.page_hash(100 + j) in parents:
                assert parents[h.page_hash(100 + j)] == h.page_hash(99 + j)
        # Draft pages (flat, "<key>.draft") are no KV blocks: never announced.
        draft = h.host_pool("mha", "page_first", layers=1)
        assert b.batch_set([h.page_key(200) + ".draft"], [draft.get_data_page(0)]) is True
        read_for(0.3)
        assert h.page_hash(200) not in stored
    finally:
        sub.close(linger=0)
        ctx.term()
        import shutil
        shutil.rmtree(d, ignore_errors=True)
