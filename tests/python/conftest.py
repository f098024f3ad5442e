import ctypes
import logging
import mmap
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stubs"))
import vllm_standins  # noqa: E402

vllm_standins.install()

import kvcr  # noqa: E402  (the installed package, built from this tree)


def address_of(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Rig:
    """A KVCR over a bytearray of framework blocks and an mmap KVCR pool."""

    def __init__(self, block=4096, fw_blocks=8, slots=4, policy=None, telemetry=False,
                 sink=True, capacity=None, **cfg):
        self.block = block
        self.fw = bytearray(block * fw_blocks)
        self.pool = mmap.mmap(-1, block * slots)
        self.events = []
        self.stats_made = []

        def factory():
            s = vllm_standins.OffloadingConnectorStats()
            self.stats_made.append(s)
            return s

        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name="rig", pool_layouts=[("", block)],
                            enable_telemetry=telemetry, **cfg),
            kvcr.KVCRBindings(None, None, None,
                              inventory_sink=self.events.append if sink is True else sink,
                              capacity_needed_callback=capacity,
                              stats_factory=factory if telemetry else None, policy=policy),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw), size=block,
                                                         count=fw_blocks)],
                local_dram=kvcr.LocalDramOptions(pools=[("", address_of(self.pool), block * slots)])),
        )

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name="rig", element_index=i)]

    def put(self, i, seed):
        self.fw[i * self.block:(i + 1) * self.block] = bytes([seed % 256]) * self.block

    def block_bytes(self, i):
        return bytes(self.fw[i * self.block:(i + 1) * self.block])

    def wait(self, op, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for handle, entries in self.kv.poll_completed():
                if handle == op:
                    return entries
            time.sleep(0.0005)
        raise AssertionError(f"operation {op} did not complete")

    def close(self):
        self.kv.close()
        # The pool may be closed only once KVCR has stopped.
        self.pool.close()


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
