"""The G3 tier (local-disk slot files) through the Python package: its
configuration rules and messages, spills from a small KVCR DRAM pool,
deliver and fetch from G3 with the bytes compared, query and inventory,
policies (built-in and Python), warm restart, exclusive files and slots
that fail their checksum.

G3 files live in a fresh directory under /var/tmp (O_DIRECT works there;
libkvcr refuses tmpfs, which /dev/shm is), removed afterwards (the g3_dir
and shm_dir fixtures of conftest.py)."""
import ctypes
import dataclasses
import logging
import mmap
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kvcr
from conftest import WAIT_ROUNDS, WAIT_SECONDS, address_of, poll_until, thread_count
from kvcr import CacheTier, OpEntryStatus, PlacementAction, QueryStatus
from kvcr.policy import native_builtin

BLOCK = 4096
G3_HIT = (QueryStatus.FETCHABLE, CacheTier.G3)
DRAM_HIT = (QueryStatus.HIT, CacheTier.LOCAL_G2)
MISS = (QueryStatus.MISS, None)


def pattern(tag: bytes, size: int = BLOCK) -> bytes:
    return (tag * (size // len(tag) + 1))[:size]


class G3Rig:
    """A KVCR with a framework buffer, a small KVCR DRAM pool and G3 files.
    reopen() closes the instance and starts a new one on the same files and
    the same memory (a restart)."""

    def __init__(self, paths, block=BLOCK, slots=2, g3_slots=8, fw_blocks=8, policy=None,
                 agent="g3rig", **g3_kw):
        self.block, self.agent = block, agent
        self.fw = bytearray(block * fw_blocks)
        self.fw_blocks = fw_blocks
        self.pool = mmap.mmap(-1, block * slots)
        self.slots = slots
        self.g3 = kvcr.G3Options(paths=tuple(paths), capacity_bytes_per_file=g3_slots * block,
                                 **g3_kw)
        self.policy = policy
        self.kv = None
        self.start()

    def start(self):
        self.events = []
        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=self.agent, pool_layouts=[("", self.block)]),
            kvcr.KVCRBindings(None, None, None, inventory_sink=self.events.append,
                              policy=self.policy),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw),
                                                         size=self.block, count=self.fw_blocks)],
                local_dram=kvcr.LocalDramOptions(
                    pools=[("", address_of(self.pool), self.block * self.slots)]),
                g3=self.g3))
        return self.kv

    def reopen(self):
        self.kv.close()
        return self.start()

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.agent, element_index=i)]

    def fill(self, i, tag: bytes) -> bytes:
        data = pattern(tag, self.block)
        self.fw[i * self.block:(i + 1) * self.block] = data
        return data

    def row(self, i) -> bytes:
        return bytes(self.fw[i * self.block:(i + 1) * self.block])

    def wait(self, op):
        return poll_until(self.kv, op)

    def deposit(self, key, i, tag):
        data = self.fill(i, tag)
        entries = self.wait(self.kv.deposit({key: self.ref(i)}))
        assert entries[key].success, entries
        return data

    def g3_keys(self, removed=False):
        return [k for e in self.events if e.tier is CacheTier.G3 and e.removed == removed
                for k in e.keys]

    def wait_in_g3(self, keys, timeout=WAIT_SECONDS):
        """Polls (bounded) until every key's G3 store committed (its G3
        inventory event arrived)."""
        deadline = time.monotonic() + timeout
        for _ in range(WAIT_ROUNDS):
            self.kv.poll_completed()
            if set(keys) <= set(self.g3_keys()):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.0005)
        raise AssertionError(f"{keys} did not reach G3; events {self.events}")

    def close(self):
        if self.kv is not None:
            self.kv.close()
        self.pool.close()


@pytest.fixture
def rigs():
    made = []

    def make(*a, **kw):
        r = G3Rig(*a, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def file_size_for(slots, block=BLOCK):
    """libkvcr's file layout: a 4 KiB superblock, 256-byte records rounded
    up to 4 KiB, then the data (tiers/g3_store.h)."""
    index = -(-slots * 256 // 4096) * 4096
    return 4096 + index + slots * block


# ---- construction ------------------------------------------------------------


def test_construction_creates_locked_files_and_starts_one_io_thread(g3_dir, caplog):
    caplog.set_level(logging.INFO, logger="kvcr")
    before = thread_count()
    paths = (g3_dir / "a" / "g3-0.bin", str(g3_dir / "b" / "g3-1.bin"))  # Path and str
    fw, pool = bytearray(BLOCK * 2), mmap.mmap(-1, BLOCK * 2)
    k = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="c", pool_layouts=[("", BLOCK)], copy_threads=1),
        kvcr.KVCRBindings(None, None, None),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=2)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)]),
            g3=kvcr.G3Options(paths=paths, capacity_bytes_per_file=4 * BLOCK)))
    assert thread_count() == before + 2  # one copy thread, the G3 I/O thread
    for p in paths:  # missing directories and files are created, preallocated, 0600
        st = os.stat(p)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == file_size_for(4)
    # The default policy with G3 is libkvcr's g3_lru; the backend name is
    # G3Options' default (a compatibility name), served by io_uring.
    assert "policy 'g3_lru'" in caplog.text
    assert "io_uring" in caplog.text
    assert k.query([b"nothing"]) == [MISS]
    k.close()
    pool.close()
    assert thread_count() == before
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_paths_are_expanded_and_resolved(g3_dir, monkeypatch, rigs):
    monkeypatch.setenv("HOME", str(g3_dir / "home"))
    (g3_dir / "cwd").mkdir()
    monkeypatch.chdir(g3_dir / "cwd")
    r = rigs(["~/g3/home.bin", Path("relative.bin"), str(g3_dir / "x" / ".." / "dots.bin")],
             g3_slots=2)
    for p in (g3_dir / "home" / "g3" / "home.bin", g3_dir / "cwd" / "relative.bin",
              g3_dir / "dots.bin"):
        assert p.stat().st_size == file_size_for(2), p
    assert not (g3_dir / "cwd" / "~").exists()
    # A restart from another directory finds the same (resolved) files.
    monkeypatch.chdir(g3_dir)
    data = r.deposit(b"k", 0, b"expanded")
    assert r.wait(r.kv.deposit({b"k2": r.ref(1), b"k3": r.ref(2)}))  # evicts k (g3_lru)
    r.wait_in_g3([b"k"])
    r.g3 = dataclasses.replace(r.g3, paths=(g3_dir / "home" / "g3" / "home.bin",
                                            g3_dir / "cwd" / "relative.bin",
                                            g3_dir / "dots.bin"))
    r.reopen()
    r.wait_in_g3([b"k"])  # the restart reports it again
    r.fw[5 * BLOCK:6 * BLOCK] = bytes(BLOCK)
    assert r.wait(r.kv.deliver({b"k": r.ref(5)}))[b"k"].success
    assert r.row(5) == data


def test_tmpfs_is_refused_with_a_clear_message(shm_dir):
    fw, pool = bytearray(BLOCK), mmap.mmap(-1, BLOCK)
    path = shm_dir / "g3.bin"
    before = thread_count()
    with pytest.raises(ValueError) as info:
        kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name="t", pool_layouts=[("", BLOCK)]),
            kvcr.KVCRBindings(None, None, None),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK)],
                local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK)]),
                g3=kvcr.G3Options(paths=(path,), capacity_bytes_per_file=BLOCK)))
    assert str(info.value) == \
        f"G3 file storage requires O_DIRECT (tmpfs of {path} does not support it)"
    assert thread_count() == before
    pool.close()


# ---- G3Options rules ------------------------------------------------------------


@pytest.fixture
def parts(g3_dir):
    fw, pool = bytearray(BLOCK * 4), mmap.mmap(-1, BLOCK * 2)
    config = kvcr.KVCRConfig(nixl_agent_name="v", pool_layouts=[("", BLOCK)])
    bindings = kvcr.KVCRBindings(None, None, None)
    backends = kvcr.KVCRBackendConfigs(
        framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=4)],
        local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * 2)]))
    yield config, bindings, backends
    pool.close()


def g3opts(g3_dir, paths=("g3.bin",), capacity=2 * BLOCK, **kw):
    return kvcr.G3Options(paths=tuple(g3_dir / p if isinstance(p, str) and p else p
                                      for p in paths),
                          capacity_bytes_per_file=capacity, **kw)


def refused(exc, config, bindings, backends):
    before = thread_count()
    with pytest.raises(exc) as info:
        kvcr.KVCR(config, bindings, backends).close()
    assert thread_count() == before  # nothing started
    return str(info.value)


# (G3Options fields, exception, exact message). Python checks the types and
# the path spelling (NUL, duplicates, aliases after resolving); libkvcr
# checks the rest (its messages, before any file is opened): the path list
# and paths, slot size, capacity, backend, queue depth and staging bound.
G3_CASES = [
    (dict(paths=()), ValueError, "G3 requires at least one file path"),
    (dict(paths=[]), ValueError, "G3 requires at least one file path"),
    (dict(paths="g3.bin"), TypeError, "G3 paths must be a tuple (or list) of file paths, not str"),
    (dict(paths=Path("g3.bin")), TypeError,
     "G3 paths must be a tuple (or list) of file paths, not PosixPath"),
    (dict(paths=(b"/var/tmp/x",)), TypeError,
     "G3 file paths must be str or os.PathLike of str, not bytes"),
    (dict(paths=(7,)), TypeError, "G3 file paths must be str or os.PathLike of str, not int"),
    (dict(paths=("a", "")), ValueError, "G3 file path 1 must be a non-empty string"),
    (dict(paths=("a", "b\0c")), ValueError, "G3 file path 1 must not contain NUL"),
    (dict(paths=("a", "a")), ValueError, "G3 file paths must be unique"),
    (dict(paths=("a", "sub/../a")), ValueError, "G3 file paths must not alias the same file"),
    (dict(capacity=BLOCK + 1), ValueError, "G3 file capacity must contain complete slots"),
    (dict(capacity=0), ValueError, "G3 file capacity must contain complete slots"),
    (dict(capacity=-BLOCK), ValueError, "G3 file capacity must contain complete slots"),
    (dict(capacity=2**57), ValueError, "G3 file capacity must be at most 2^56 bytes"),
    (dict(capacity=2**80), ValueError, "G3 file capacity must be at most 2^56 bytes"),
    (dict(capacity=True), TypeError, "G3 capacity_bytes_per_file must be an int, not bool"),
    (dict(capacity=4096.0), TypeError, "G3 capacity_bytes_per_file must be an int, not float"),
    (dict(backend=""), ValueError, "G3 backend must be non-empty"),
    (dict(backend=None), TypeError, "G3 backend must be a str, not NoneType"),
    (dict(backend="GDS\0"), ValueError, "G3 backend must not contain NUL"),
    (dict(backend_options={"a": 1}), TypeError, "G3 backend_options must map str to str"),
    (dict(backend_options={1: "a"}), TypeError, "G3 backend_options must map str to str"),
    (dict(backend_options=[("a", "b")]), TypeError, "G3 backend_options must map str to str"),
    (dict(queue_depth=0), ValueError, "G3 queue_depth must be between 1 and 1024"),
    (dict(queue_depth=1025), ValueError, "G3 queue_depth must be between 1 and 1024"),
    (dict(queue_depth=-1), ValueError, "G3 queue_depth must be between 1 and 1024"),
    (dict(queue_depth=2**40), ValueError, "G3 queue_depth must be between 1 and 1024"),
    (dict(queue_depth="16"), TypeError, "G3 queue_depth must be an int, not str"),
    (dict(max_staging_bytes=0), ValueError, "G3 max_staging_bytes must be positive"),
    (dict(max_staging_bytes=-1), ValueError, "G3 max_staging_bytes must be positive"),
    (dict(max_staging_bytes=None), TypeError, "G3 max_staging_bytes must be an int, not NoneType"),
]


@pytest.mark.parametrize("change,exc,message", G3_CASES,
                         ids=[f"{i}-{m[:40]}" for i, (_, _, m) in enumerate(G3_CASES)])
def test_g3_options_rule(g3_dir, parts, change, exc, message):
    config, bindings, backends = parts
    change = dict(change)
    paths = change.pop("paths", ("g3.bin",))
    if isinstance(paths, (tuple, list)) and paths and isinstance(paths[0], str):
        paths = type(paths)(str(g3_dir / p) if p else p for p in paths)
    opts = kvcr.G3Options(paths=paths, capacity_bytes_per_file=change.pop("capacity", 2 * BLOCK),
                          **change)
    got = refused(exc, config, bindings, dataclasses.replace(backends, g3=opts))
    assert got == message
    assert os.listdir(g3_dir) == []  # refused before any file was made


def test_g3_rules_about_the_rest_of_the_configuration(g3_dir, parts):
    config, bindings, backends = parts
    opts = g3opts(g3_dir)
    two_pools = dataclasses.replace(config, pool_layouts=[("k", BLOCK), ("v", BLOCK)])
    assert refused(ValueError, two_pools, bindings, dataclasses.replace(backends, g3=opts)) == \
        "G3 supports exactly one pool layout"
    assert refused(ValueError, config, bindings,
                   dataclasses.replace(backends, local_dram=None, g3=opts)) == \
        "G3 requires local DRAM"
    assert refused(TypeError, config, bindings, dataclasses.replace(backends, g3="g3.bin")) == \
        "backend_configs.g3 must be a G3Options"
    small = dataclasses.replace(config, pool_layouts=[("", 16)])
    pool = mmap.mmap(-1, 64)
    small_backends = kvcr.KVCRBackendConfigs(
        local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), 64)]),
        g3=g3opts(g3_dir, capacity=64))
    assert refused(ValueError, small, bindings, small_backends) == \
        "G3 slot size must be positive and page aligned"
    pool.close()
    # The G3 policies pass their tier check once G3 is configured.
    for policy in (kvcr.G3LRUPolicy(), kvcr.G3FIFOPolicy()):
        kvcr.KVCR(config, dataclasses.replace(bindings, policy=policy),
                  dataclasses.replace(backends, g3=opts)).close()
    assert os.listdir(g3_dir) == ["g3.bin"]


def test_aliases_the_file_system_knows_are_refused(g3_dir, parts):
    config, bindings, backends = parts
    (g3_dir / "real.bin").touch()
    os.symlink(g3_dir / "real.bin", g3_dir / "sym.bin")
    os.link(g3_dir / "real.bin", g3_dir / "hard.bin")
    # A symbolic link resolves to the same path: refused in Python, which resolves paths.
    got = refused(ValueError, config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, paths=("real.bin", "sym.bin"))))
    assert got == "G3 file paths must not alias the same file"
    # A hard link only shows once open: libkvcr compares the inodes.
    got = refused(ValueError, config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, paths=("real.bin", "hard.bin"))))
    assert got == ("G3 file paths must not alias the same file "
                   f"({g3_dir / 'real.bin'} and {g3_dir / 'hard.bin'})")
    assert (g3_dir / "real.bin").stat().st_size == 0  # the failed open gave it back
    # Neither a FIFO nor a directory is a slot file.
    os.mkfifo(g3_dir / "fifo.bin")
    got = refused(ValueError, config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, paths=("fifo.bin",))))
    assert got == f"G3 file {g3_dir / 'fifo.bin'} is not a regular file"
    (g3_dir / "dir.bin").mkdir()
    got = refused(RuntimeError, config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, paths=("dir.bin",))))
    assert got == f"G3 file {g3_dir / 'dir.bin'}: cannot open: Is a directory"


def test_existing_files_must_match_the_configured_layout(g3_dir, parts):
    config, bindings, backends = parts
    kvcr.KVCR(config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, capacity=8 * BLOCK))).close()
    path = g3_dir / "g3.bin"
    got = refused(ValueError, config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, capacity=4 * BLOCK)))
    assert got == (f"G3 file {path} has incompatible size ({file_size_for(8)} bytes; "
                   f"these options need {file_size_for(4)})")
    # Same file size, other slot size (8 x 4 KiB vs 4 x 8 KiB, one index block each).
    big = 2 * BLOCK
    pool = mmap.mmap(-1, 2 * big)
    got = refused(ValueError, dataclasses.replace(config, pool_layouts=[("", big)]), bindings,
                  kvcr.KVCRBackendConfigs(
                      local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), 2 * big)]),
                      g3=g3opts(g3_dir, capacity=4 * big)))
    pool.close()
    assert got == (f"G3 file {path} was made for another layout (file 1 of 1, slot size 4096) "
                   "than configured (file 1 of 1, slot size 8192)")


@pytest.mark.parametrize("backend", ["GDS_MT", "GDS", "POSIX", "io_uring", "anything"])
def test_any_backend_name_is_served_by_io_uring(g3_dir, parts, backend, caplog):
    config, bindings, backends = parts
    caplog.set_level(logging.INFO, logger="kvcr")
    k = kvcr.KVCR(config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, backend=backend)))
    k.close()
    assert "G3 up: 1 file(s), 2 slot(s) of 4096 bytes, io_uring" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_backend_options_are_ignored_with_a_warning(g3_dir, parts, caplog):
    config, bindings, backends = parts
    k = kvcr.KVCR(config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, backend_options={"thread_count": "4", "batch": "8"})))
    k.close()
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage() == (
        "KVCR G3 backend_options ['batch', 'thread_count'] are ignored: libkvcr serves G3 "
        "backend 'GDS_MT' with io_uring, which takes no options (its tuning is "
        "G3Options.queue_depth and max_staging_bytes)")
    caplog.clear()
    kvcr.KVCR(config, bindings, dataclasses.replace(
        backends, g3=g3opts(g3_dir, backend_options={}))).close()  # empty: nothing to say
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_extras_reach_libkvcr(g3_dir, rigs, caplog):
    """queue_depth and max_staging_bytes are libkvcr's: with room for one
    spill in staging, two blocks evicted by one deposit cannot both move to
    G3 — the second is dropped (and that is logged)."""
    caplog.set_level(logging.INFO, logger="kvcr")
    r = rigs([g3_dir / "g3.bin"], queue_depth=1, max_staging_bytes=BLOCK)
    assert "queue depth 1" in caplog.text
    r.deposit(b"a", 0, b"a")
    r.deposit(b"b", 1, b"b")
    r.fill(2, b"c")
    r.fill(3, b"d")
    entries = r.wait(r.kv.deposit({b"c": r.ref(2), b"d": r.ref(3)}))
    assert all(e.success for e in entries.values())
    assert "moving a block to G3 failed (G3 spill failed); it is dropped" in caplog.text
    r.wait_in_g3([b"a"])
    assert r.kv.query([b"a", b"b", b"c", b"d"]) == [G3_HIT, MISS, DRAM_HIT, DRAM_HIT]
    assert g3opts(g3_dir).queue_depth == 16  # libkvcr's defaults
    assert g3opts(g3_dir).max_staging_bytes == 64 << 20


# ---- data through G3 ------------------------------------------------------------


def test_spill_query_deliver_and_fetch_from_g3(g3_dir, rigs):
    r = rigs([g3_dir / "g3.bin"], slots=2, g3_slots=8)
    keys = [b"k0", b"k1", b"k2", b"k3"]
    data = {k: r.deposit(k, i, b"block-%d|" % i) for i, k in enumerate(keys)}
    r.wait_in_g3([b"k0", b"k1"])  # the two oldest spilled from the 2-slot pool
    assert r.kv.query(keys + [b"nope"]) == [G3_HIT, G3_HIT, DRAM_HIT, DRAM_HIT, MISS]
    # Inventory: each spilled key left DRAM and entered G3.
    dram_removed = [k for e in r.events if e.tier is CacheTier.LOCAL_G2 and e.removed
                    for k in e.keys]
    assert dram_removed == [b"k0", b"k1"]
    assert r.g3_keys() == [b"k0", b"k1"] and r.g3_keys(removed=True) == []
    assert all(isinstance(e, kvcr.InventoryEvent) for e in r.events)

    # deliver from G3 straight into framework memory (sources scribbled first);
    # one operation mixes a G3 key, a DRAM key and a missing one.
    r.fw[:] = bytes(len(r.fw))
    got = r.wait(r.kv.deliver({b"k0": r.ref(4), b"k2": r.ref(5), b"nope": r.ref(6)}))
    assert got[b"k0"].success and got[b"k2"].success
    assert got[b"nope"].status is OpEntryStatus.FAILED and got[b"nope"].reason == "NOT_FOUND"
    assert r.row(4) == data[b"k0"] and r.row(5) == data[b"k2"]
    assert r.row(6) == bytes(BLOCK)
    assert r.kv.query([b"k0"]) == [G3_HIT]  # deliver does not bring it into DRAM

    # fetch reads it back into a KVCR DRAM slot (evicting, i.e. spilling, one).
    got = r.wait(r.kv.fetch([b"k1"]))[b"k1"]
    assert got.success and got.release_handle is not None
    [ref] = got.descriptors
    assert ref == kvcr.MemoryRef(end_point_name=r.agent, label="", element_index=ref.element_index)
    [(addr, size)] = got.addresses
    assert size == BLOCK and addr == address_of(r.pool) + ref.element_index * BLOCK
    assert ctypes.string_at(addr, size) == data[b"k1"]
    assert r.kv.query([b"k1"]) == [DRAM_HIT]
    assert r.kv.release([got.release_handle]) == [(got.release_handle, True)]
    # k3 made room: the deliver above was an access of k2, so k3 was least recent.
    r.wait_in_g3([b"k3"])
    assert r.kv.query(keys) == [G3_HIT, DRAM_HIT, DRAM_HIT, G3_HIT]
    r.fw[:] = bytes(len(r.fw))
    got = r.wait(r.kv.deliver({k: r.ref(i) for i, k in enumerate(keys)}))
    assert all(e.success for e in got.values())
    assert [r.row(i) for i in range(4)] == [data[k] for k in keys]


def test_a_wrong_destination_size_fails_the_g3_entry(g3_dir, rigs):
    r = rigs([g3_dir / "g3.bin"], slots=1)
    r.deposit(b"a", 0, b"a")
    r.deposit(b"b", 1, b"b")
    r.wait_in_g3([b"a"])
    got = r.wait(r.kv.deliver({b"a": r.ref(2) + r.ref(3)}))[b"a"]
    assert got.status is OpEntryStatus.FAILED and got.reason == "LAYOUT_MISMATCH"


class SpillingPolicy(kvcr.KVCachePolicy):
    """A Python policy (FIFO order) that moves DRAM victims to G3 and drops
    G3 victims; it records what it was asked."""

    def __init__(self):
        self.calls = []

    def decide_ingest(self, meta, source, required_local, router_hints=None,
                      framework_hints=None):
        self.calls.append(("ingest", bytes(meta.block_key), source))
        return (PlacementAction.KEEP, None)

    def eviction_score(self, meta, source):
        return 0.0

    def decide_eviction(self, meta, source):
        self.calls.append(("evict", bytes(meta.block_key), source))
        if source is CacheTier.LOCAL_G2:
            return (PlacementAction.MOVE_TO, CacheTier.G3)
        return (PlacementAction.DROP, None)

    def on_remove(self, meta):
        self.calls.append(("remove", bytes(meta.block_key)))


def test_a_python_policy_moves_blocks_to_g3_through_the_vtable(g3_dir, rigs):
    p = SpillingPolicy()
    assert native_builtin(p) is None  # consulted through Python
    r = rigs([g3_dir / "g3.bin"], slots=1, g3_slots=2, policy=p)
    data = {}
    for i, k in enumerate([b"a", b"b", b"c", b"d"]):
        data[k] = r.deposit(k, i, k * 3)
        if i:
            r.wait_in_g3([bytes([k[0] - 1])])  # the previous one went to G3
    evictions = [c[1:] for c in p.calls if c[0] == "evict"]
    # DRAM victims move; when G3 (2 slots) is full its oldest is asked and dropped.
    assert evictions == [(b"a", CacheTier.LOCAL_G2), (b"b", CacheTier.LOCAL_G2),
                         (b"c", CacheTier.LOCAL_G2), (b"a", CacheTier.G3)]
    assert ("remove", b"a") in p.calls and ("remove", b"b") not in p.calls
    assert r.g3_keys(removed=True) == [b"a"]
    assert r.kv.query([b"a", b"b", b"c", b"d"]) == [MISS, G3_HIT, G3_HIT, DRAM_HIT]
    # Fetching c back into DRAM moves d to G3, which evicts its oldest (b).
    # (Fetching b here would hit the libkvcr bug of
    # test_fetch_while_g3_evicts_the_fetched_block.)
    got = r.wait(r.kv.fetch([b"c"]))[b"c"]
    assert got.success and ctypes.string_at(*got.addresses[0]) == data[b"c"]
    assert ("ingest", b"c", CacheTier.G3) in p.calls  # a fill from G3 is an ingest
    r.wait_in_g3([b"d"])
    assert [c[1:] for c in p.calls if c[0] == "evict"][4:] == [
        (b"d", CacheTier.LOCAL_G2), (b"b", CacheTier.G3)]
    assert r.kv.query([b"b", b"c", b"d"]) == [MISS, DRAM_HIT, G3_HIT]
    r.kv.release([got.release_handle])


class KeepsMovingToG3(kvcr.LRUPolicy):
    def decide_eviction(self, meta, source):
        return (PlacementAction.MOVE_TO, CacheTier.G3)


def test_a_move_to_g3_from_g3_keeps_the_block(g3_dir, rigs, caplog):
    r = rigs([g3_dir / "g3.bin"], slots=1, g3_slots=1, policy=KeepsMovingToG3())
    r.deposit(b"a", 0, b"a")
    r.deposit(b"b", 1, b"b")
    r.wait_in_g3([b"a"])
    r.deposit(b"c", 2, b"c")  # b cannot move: G3's only block refuses to go
    assert "decide_eviction returned an action this build cannot do; keeping the block" \
        in caplog.text
    assert "moving a block to G3 failed (G3 spill failed); it is dropped" in caplog.text
    assert r.kv.query([b"a", b"b", b"c"]) == [G3_HIT, MISS, DRAM_HIT]


def test_built_in_g3_policies_run_natively(g3_dir, rigs, caplog):
    class Plain(kvcr.G3LRUPolicy):
        pass

    class Rescored(kvcr.G3LRUPolicy):
        def eviction_score(self, meta, source):
            return 0.0

    class G3Flagged(kvcr.LRUPolicy):  # spills nothing: not g3_lru
        required_tiers = frozenset({CacheTier.G3})

    assert native_builtin(kvcr.G3LRUPolicy()) == "g3_lru"
    assert native_builtin(kvcr.G3FIFOPolicy()) == "g3_fifo"
    assert native_builtin(Plain()) == "g3_lru"
    assert native_builtin(Rescored()) is None
    assert native_builtin(G3Flagged()) is None
    assert native_builtin(None) is None  # libkvcr's default
    caplog.set_level(logging.INFO, logger="kvcr")
    # a is read (fetch: an access, and a claim) before b arrives, and released
    # after: it re-enters the evictable set behind b but was used before b.
    # FIFO evicts by entry (b), LRU by last access (a).
    for i, (policy, name, spilled) in enumerate([(kvcr.G3FIFOPolicy(), "g3_fifo", b"b"),
                                                 (kvcr.G3LRUPolicy(), "g3_lru", b"a"),
                                                 (None, "g3_lru", b"a")]):
        caplog.clear()
        r = rigs([g3_dir / f"g3-{i}.bin"], slots=2, policy=policy)
        assert f"policy '{name}'" in caplog.text
        r.deposit(b"a", 0, b"a")
        claim = r.wait(r.kv.fetch([b"a"]))[b"a"].release_handle
        r.deposit(b"b", 1, b"b")
        assert r.kv.release([claim]) == [(claim, True)]
        r.deposit(b"c", 2, b"c")
        r.wait_in_g3([spilled])
        assert r.g3_keys() == [spilled]


# ---- restart, exclusivity, corruption ----------------------------------------------------


def test_a_restart_finds_the_blocks_again(g3_dir, rigs):
    paths = [g3_dir / "g3-0.bin", g3_dir / "g3-1.bin"]  # striped over two files
    r = rigs(paths, slots=2, g3_slots=4)
    keys = [b"k%d" % i for i in range(6)]
    data = {k: r.deposit(k, i, b"restart-%d/" % i) for i, k in enumerate(keys)}
    r.wait_in_g3(keys[:4])
    before = r.kv.query(keys)
    assert before == [G3_HIT] * 4 + [DRAM_HIT] * 2
    r.fw[:] = bytes(len(r.fw))
    r.reopen()  # a new KVCR on the same files (and the same memory)
    # The first poll reports what the files hold, oldest first.
    r.wait_in_g3(keys[:4])
    assert r.g3_keys() == keys[:4]
    assert r.kv.query(keys) == [G3_HIT] * 4 + [MISS] * 2  # DRAM does not survive
    got = r.wait(r.kv.deliver({k: r.ref(i) for i, k in enumerate(keys[:4])}))
    assert all(e.success for e in got.values())
    assert [r.row(i) for i in range(4)] == [data[k] for k in keys[:4]]
    got = r.wait(r.kv.fetch([b"k3"]))[b"k3"]
    assert got.success and ctypes.string_at(*got.addresses[0]) == data[b"k3"]
    r.kv.release([got.release_handle])
    # The restarted store keeps working: new spills, then another restart.
    data[b"new"] = r.deposit(b"new", 6, b"new/")
    r.deposit(b"newer", 7, b"newer/")
    r.deposit(b"newest", 4, b"newest/")
    r.wait_in_g3([b"new"])
    r.reopen()
    r.wait_in_g3([b"new"])
    r.fw[:BLOCK] = bytes(BLOCK)
    assert r.wait(r.kv.deliver({b"new": r.ref(0)}))[b"new"].success
    assert r.row(0) == data[b"new"]


def test_two_instances_cannot_share_the_files(g3_dir, rigs):
    path = g3_dir / "g3.bin"
    first = rigs([path])
    data = first.deposit(b"a", 0, b"first")
    first.deposit(b"b", 1, b"b")
    first.deposit(b"c", 2, b"c")
    first.wait_in_g3([b"a"])
    before = thread_count()
    with pytest.raises(RuntimeError) as info:
        rigs([path])
    assert str(info.value) == f"G3 file {path} is in use by another process (or store)"
    assert thread_count() == before
    # The first is unharmed, and once it is closed the files can be opened.
    first.fw[:BLOCK] = bytes(BLOCK)
    assert first.wait(first.kv.deliver({b"a": first.ref(0)}))[b"a"].success
    assert first.row(0) == data
    first.kv.close()
    second = rigs([path])
    second.wait_in_g3([b"a"])
    assert second.kv.query([b"a"]) == [G3_HIT]


def corrupt_data(path: Path, capacity: int) -> None:
    """Overwrites the data area of a closed G3 file (its last `capacity`
    bytes) — the records still verify, the data checksums do not."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size - capacity)
        f.write(b"\xa5" * capacity)
        f.flush()
        os.fsync(f.fileno())


def test_a_slot_that_fails_its_checksum_is_a_failed_entry(g3_dir, rigs, caplog):
    path = g3_dir / "g3.bin"
    r = rigs([path], slots=2, g3_slots=8)
    for i, k in enumerate([b"a", b"b", b"c", b"d"]):
        r.deposit(k, i, k * 5)
    r.wait_in_g3([b"a", b"b"])
    r.kv.close()
    corrupt_data(path, 8 * BLOCK)
    r.start()
    r.wait_in_g3([b"a", b"b"])  # the records verify: found again
    assert r.kv.query([b"a", b"b"]) == [G3_HIT, G3_HIT]
    got = r.wait(r.kv.deliver({b"a": r.ref(5)}))[b"a"]
    assert got.status is OpEntryStatus.FAILED and not got.success and got.reason == "CORRUPT"
    assert got.descriptors is None and got.release_handle is None
    got = r.wait(r.kv.fetch([b"b"]))[b"b"]
    assert got.status is OpEntryStatus.FAILED and got.reason == "CORRUPT"
    assert got.descriptors is None and got.release_handle is None
    # The bad copies are gone: a miss from now on, reported as removed.
    assert r.kv.query([b"a", b"b"]) == [MISS, MISS]
    r.kv.poll_completed()
    assert sorted(r.g3_keys(removed=True)) == [b"a", b"b"]
    assert "failed its key or checksum check" in caplog.text
    got = r.wait(r.kv.fetch([b"a"]))[b"a"]
    assert got.reason == "NOT_FOUND"


FETCH_EVICTS_ITSELF = textwrap.dedent("""
    import ctypes, mmap, sys, time
    import kvcr
    B = 4096
    fw, pool = bytearray(4 * B), mmap.mmap(-1, B)
    addr = lambda b: ctypes.addressof(ctypes.c_char.from_buffer(b))
    events = []
    k = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="x", pool_layouts=[("", B)]),
        kvcr.KVCRBindings(None, None, None, inventory_sink=events.append),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=addr(fw), size=B, count=4)],
            local_dram=kvcr.LocalDramOptions(pools=[("", addr(pool), B)]),
            g3=kvcr.G3Options(paths=(sys.argv[1],), capacity_bytes_per_file=2 * B)))
    ref = lambda i: [kvcr.MemoryRef(end_point_name="x", element_index=i)]
    def wait(op):
        for _ in range(20000):
            for h, e in k.poll_completed():
                if h == op:
                    return e
            time.sleep(0.0005)
        raise SystemExit("no result")
    for i, key in enumerate([b"a", b"b", b"c"]):
        fw[i * B:(i + 1) * B] = key * B
        assert wait(k.deposit({key: ref(i)}))[key].success
    for _ in range(20000):
        k.poll_completed()
        if sum(len(e.keys) for e in events if e.tier is kvcr.CacheTier.G3) == 2:
            break
        time.sleep(0.0005)
    e = wait(k.fetch([b"a"]))[b"a"]
    print(e.status.name, e.reason, flush=True)
    k.close()
""")


def test_fetch_while_g3_evicts_the_fetched_block(g3_dir):
    # Regression (fixed in libkvcr): the block being fetched is protected
    # while its DRAM slots are reserved, so a spill into the full G3 cannot
    # evict it; before the fix the next poll spun for ever.
    """1 KVCR DRAM slot, 2 G3 slots: deposit a, b, c (a and b spill; G3 is
    full), then fetch a. Reserving a DRAM slot moves c to G3, and G3's
    oldest block is a itself. Run in a child process: with the bug it never
    returns and is killed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kvcr.__file__))] +
        ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    try:
        out = subprocess.run([sys.executable, "-c", FETCH_EVICTS_ITSELF, str(g3_dir / "g3.bin")],
                             env=env, capture_output=True, text=True, timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("the fetch never completed (the child was killed)")
    assert out.returncode == 0, out.stderr
    # Either answer is fine once it completes: the bytes, or a clean failure.
    assert out.stdout.split()[0] == "SUCCESS", out.stdout
