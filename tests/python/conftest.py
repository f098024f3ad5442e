"""Shared fixtures: a KVCR over real framework memory and a KVCR DRAM pool.

Tests run against the installed package (scripts/install-python.sh). Every
wait is bounded both in iterations and in time."""
import ctypes
import logging
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stubs"))
import vllm_standins  # noqa: E402

vllm_standins.install()

import kvcr  # noqa: E402

WAIT_SECONDS = 10.0
WAIT_ROUNDS = 200_000


def address_of(buf) -> int:
    """The base address of a writable buffer (bytearray, mmap, ctypes array)."""
    if isinstance(buf, ctypes.Array):
        return ctypes.addressof(buf)
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def thread_count(settle: float = 1.0) -> int:
    """Threads of this process, C threads included. A joined thread can
    stay listed in /proc for a moment after it exited, so the count is read
    until it holds still for 20 ms (bounded by `settle` seconds)."""
    deadline = time.monotonic() + settle
    last, since = len(os.listdir("/proc/self/task")), time.monotonic()
    for _ in range(10_000):
        time.sleep(0.002)
        now = len(os.listdir("/proc/self/task"))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.02 or time.monotonic() > deadline:
            break
    return last


def make_buffer(kind: str, size: int):
    if kind == "bytearray":
        return bytearray(size)
    if kind == "mmap":
        return mmap.mmap(-1, size)
    if kind == "ctypes":
        return (ctypes.c_char * size)()
    raise ValueError(kind)


def read(buf, start: int, length: int) -> bytes:
    if isinstance(buf, ctypes.Array):
        return ctypes.string_at(ctypes.addressof(buf) + start, length)
    return bytes(buf[start:start + length])


def write(buf, start: int, data: bytes) -> None:
    if isinstance(buf, ctypes.Array):
        ctypes.memmove(ctypes.addressof(buf) + start, data, len(data))
    else:
        buf[start:start + len(data)] = data


def poll_until(kv, op, timeout=WAIT_SECONDS, rounds=WAIT_ROUNDS, sink=None):
    """Polls until op completes; returns its entries. Other completions go
    to `sink` (a list) if given. Bounded in rounds and time."""
    deadline = time.monotonic() + timeout
    for _ in range(rounds):
        for handle, entries in kv.poll_completed():
            if handle == op:
                return entries
            if sink is not None:
                sink.append((handle, entries))
        if time.monotonic() > deadline:
            break
        time.sleep(0.0002)
    raise AssertionError(f"operation {op} did not complete within {timeout}s")


def finished_jobs(tier, want, timeout=WAIT_SECONDS, rounds=WAIT_ROUNDS):
    """Collects a vLLM tier's finished jobs until there are `want` of them
    (bounded in rounds and time); asserts exactly `want` came."""
    deadline = time.monotonic() + timeout
    got = []
    for _ in range(rounds):
        got.extend(tier.get_finished_jobs())
        if len(got) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.0002)
    assert len(got) == want, got
    return got


class Rig:
    """A KVCR over a framework buffer and an mmap KVCR DRAM pool."""

    def __init__(self, block=4096, fw_blocks=8, slots=4, policy=None, telemetry=False,
                 sink=True, capacity=None, fw_kind="bytearray", agent="rig", **cfg):
        self.block = block
        self.fw = make_buffer(fw_kind, block * fw_blocks)
        self.pool = mmap.mmap(-1, block * slots)
        self.events = []
        self.stats_made = []
        self.agent = agent

        def factory():
            s = RecordingStats()
            self.stats_made.append(s)
            return s

        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", block)],
                            enable_telemetry=telemetry, **cfg),
            kvcr.KVCRBindings(None, None, None,
                              inventory_sink=self.events.append if sink is True else sink,
                              capacity_needed_callback=capacity,
                              stats_factory=factory if telemetry else None, policy=policy),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw), size=block,
                                                         count=fw_blocks)],
                local_dram=kvcr.LocalDramOptions(pools=[("", address_of(self.pool),
                                                         block * slots)])),
        )

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.agent, element_index=i)]

    def put(self, i, seed):
        write(self.fw, i * self.block, bytes([seed % 256]) * self.block)

    def fill_pattern(self, i, tag: bytes):
        data = (tag * (self.block // len(tag) + 1))[:self.block]
        write(self.fw, i * self.block, data)
        return data

    def block_bytes(self, i):
        return read(self.fw, i * self.block, self.block)

    def wait(self, op, **kw):
        return poll_until(self.kv, op, **kw)

    def close(self):
        self.kv.close()
        # The memory may be released only once KVCR has stopped.
        self.pool.close()
        if isinstance(self.fw, mmap.mmap):
            self.fw.close()


class RecordingStats:
    """A stats_factory product that records every call, in order."""

    def __init__(self):
        self.calls = []

    def increase_counter(self, name, value, labelvalues=()):
        self.calls.append(("counter", name, value, tuple(labelvalues)))

    def set_gauge(self, name, value, labelvalues=()):
        self.calls.append(("gauge", name, value, tuple(labelvalues)))

    def observe_histogram(self, name, value, labelvalues=()):
        self.calls.append(("histogram", name, value, tuple(labelvalues)))

    def of(self, kind):
        return [c[1:] for c in self.calls if c[0] == kind]


@pytest.fixture
def rig_factory():
    made = []

    def make(**kw):
        r = Rig(**kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture(autouse=True)
def _kvcr_logs(caplog):
    caplog.set_level(logging.WARNING, logger="kvcr")
    yield


@pytest.fixture
def g3_dir():
    """A fresh directory for G3 slot files on /var/tmp (a disk file system:
    O_DIRECT works there), removed afterwards. Resolved, so that it reads
    the way libkvcr names paths in its messages."""
    d = Path(os.path.realpath(tempfile.mkdtemp(prefix="kvcr-pytest-g3-", dir="/var/tmp")))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shm_dir():
    """A fresh directory on tmpfs (/dev/shm), which libkvcr refuses for G3."""
    d = Path(os.path.realpath(tempfile.mkdtemp(prefix="kvcr-pytest-g3-", dir="/dev/shm")))
    yield d
    shutil.rmtree(d, ignore_errors=True)
