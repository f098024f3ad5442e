"""Blocks made of parts from Python: framework regions labelled
"pool:part" hold one block between them, referenced whole as "pool:*";
deposit gathers them into one KVCR slot, deliver scatters it back, and a
peer pull writes each piece where it belongs — also when the source's
framework memory is in parts of other sizes (served through pins), so
pieces on both sides are paired across their boundaries. Bytes are
compared after every transfer; parts that do not make a block are
refused by libkvcr with its rule."""
import pytest

import kvcr
from conftest import address_of, poll_until, read
from peer_process import BLOCK, IntKeyAdapter, PeerProcess, key, pattern
from test_remote_tier import envelope


class PartedKV:
    """A KVCR whose pool "" is held in parts of the given sizes (one
    bytearray each, `count` elements), with KVCR DRAM unless slots is 0."""

    def __init__(self, sizes, count=8, slots=8, remote=False, agent="parted"):
        self.agent = agent
        self.sizes = sizes
        self.parts = [bytearray(size * count) for size in sizes]
        self.pool = bytearray(BLOCK * slots) if slots else None
        regions = [kvcr.RegionDescriptor(addr=address_of(p), size=size, count=count,
                                         label=f":part{k}")
                   for k, (p, size) in enumerate(zip(self.parts, sizes))]
        control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0, "127.0.0.1") if remote else None
        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=agent, pool_layouts=[("", BLOCK)],
                            operation_timeout_ms=5000, abandon_timeout_ms=10000),
            kvcr.KVCRBindings(None, None, None, framework_control=control,
                              key_adapter=IntKeyAdapter() if remote else None),
            kvcr.KVCRBackendConfigs(
                framework_regions=regions,
                local_dram=(kvcr.LocalDramOptions(pools=[("", address_of(self.pool),
                                                          len(self.pool))])
                            if slots else None)))

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.agent, label=":*", element_index=i)]

    def write_block(self, i, data):
        at = 0
        for p, size in zip(self.parts, self.sizes):
            p[i * size:(i + 1) * size] = data[at:at + size]
            at += size

    def block(self, i):
        return b"".join(read(p, i * size, size) for p, size in zip(self.parts, self.sizes))

    def close(self):
        self.kv.close()


@pytest.fixture
def parted():
    made = []

    def make(*args, **kw):
        p = PartedKV(*args, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("sizes", [[2048, 2048], [1000, 96, 3000], [512] * 8])
def test_deposit_gathers_and_deliver_scatters_the_parts(parted, sizes):
    t = parted(sizes)
    for i in range(3):
        t.write_block(i, pattern(i))
    entries = poll_until(t.kv, t.kv.deposit({key(i): t.ref(i) for i in range(3)}))
    assert all(e.success for e in entries.values())
    # The slot holds the block whole, parts in registration order.
    got = poll_until(t.kv, t.kv.fetch([key(1)]))[key(1)]
    addr, size = got.addresses[0]
    assert size == BLOCK and read(t.pool, addr - address_of(t.pool), BLOCK) == pattern(1)
    t.kv.release([got.release_handle])
    entries = poll_until(t.kv, t.kv.deliver({key(i): t.ref(4 + i) for i in range(3)}))
    assert all(e.success for e in entries.values())
    for i in range(3):
        assert t.block(4 + i) == pattern(i)
    assert t.block(7) == bytes(BLOCK)


def test_parts_that_do_not_make_a_block_are_refused(parted):
    with pytest.raises(ValueError, match="the parts of pool '' add up to 3072 bytes, but its "
                                         "blocks are 4096"):
        parted([2048, 1024])
    t = parted([2048, 2048])
    one = [kvcr.MemoryRef(end_point_name="parted", label=":part0", element_index=0)]
    with pytest.raises(ValueError, match="named whole: 'pool:\\*'"):
        t.kv.deposit({key(0): one})


@pytest.mark.parametrize("target_sizes", [[2048, 2048], [BLOCK]])
def test_a_peer_in_parts_writes_across_the_targets_parts(parted, target_sizes):
    src = PeerProcess(mode="pins", n=4, parts=[1000, 3096])
    try:
        t = parted(target_sizes, slots=0, remote=True)
        t.kv.submit_hint(envelope(src.endpoint, range(4)), request_id="req")
        entries = poll_until(t.kv, t.kv.deliver({key(i): t.ref(2 + i) for i in range(4)},
                                                request_id="req"), timeout=30)
        assert all(e.success for e in entries.values()), entries
        for i in range(4):
            assert t.block(2 + i) == pattern(i)
        assert t.block(0) == bytes(BLOCK)
        final = src.stop()
        assert final["pin_requests"] >= 1 and not final["warnings"]
    finally:
        src.kill()
