"""The first KVCR API that vLLM 0.30 and 0.31's own adapters call:
framework memory as one FrameworkDramInput, blocks named by MemDescriptor
(an absolute address). Each descriptor becomes the element it covers, with
its bytes; one that is not exactly a block of the range is refused before
anything is copied."""
import dataclasses
import mmap

import pytest

import kvcr
from kvcr import compat
from conftest import address_of, poll_until

BLOCK = 4096


@pytest.fixture
def legacy_kv():
    fw = bytearray(BLOCK * 4)
    pool = mmap.mmap(-1, BLOCK * 2)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="old", pool_layouts=[("", BLOCK)]),
        kvcr.KVCRBindings(None, None, None),
        kvcr.KVCRBackendConfigs(
            framework_dram=kvcr.FrameworkDramInput(address_of(fw), len(fw)),
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), len(pool))])))
    yield kv, fw
    kv.close()
    pool.close()


def at(fw, i, size=BLOCK, agent="old", mem_type="DRAM"):
    return [kvcr.MemDescriptor(agent, mem_type, address_of(fw) + i * BLOCK, size)]


def test_memdescriptors_deposit_and_deliver_the_blocks_they_address(legacy_kv):
    kv, fw = legacy_kv
    fw[BLOCK:2 * BLOCK] = bytes(range(256)) * (BLOCK // 256)
    entries = poll_until(kv, kv.deposit({b"k": at(fw, 1)}))
    assert entries[b"k"].success
    op = kv.deliver({b"k": at(fw, 3)})
    assert poll_until(kv, op)[b"k"].success
    assert fw[3 * BLOCK:] == fw[BLOCK:2 * BLOCK]
    # MemoryRefs still work beside them.
    ref = [kvcr.MemoryRef(end_point_name="old", element_index=0)]
    assert poll_until(kv, kv.deliver({b"k": ref}))[b"k"].success
    assert fw[:BLOCK] == fw[BLOCK:2 * BLOCK]


@pytest.mark.parametrize("bad, why", [
    (dict(i=4), "is not a block of framework_dram"),
    (dict(i=-1), "is not a block of framework_dram"),
    (dict(i=0, size=BLOCK // 2), "is not the block size 4096"),
    (dict(i=0, agent="other"), "is not this KVCR's agent 'old'"),
    (dict(i=0, mem_type="VRAM"), "framework_dram is DRAM"),
])
def test_a_descriptor_that_is_not_exactly_a_block_is_refused_before_any_copy(legacy_kv, bad,
                                                                            why):
    kv, fw = legacy_kv
    with pytest.raises(ValueError, match=why):
        kv.deposit({b"k": at(fw, **bad)})
    misaligned = [kvcr.MemDescriptor("old", "DRAM", address_of(fw) + 1, BLOCK)]
    with pytest.raises(ValueError, match="is not a block of framework_dram"):
        kv.deliver({b"k": misaligned})
    assert kv.poll_completed() == []
    assert kv.query([b"k"]) == [(kvcr.QueryStatus.MISS, None)]


def test_every_inherited_name_is_a_field_of_its_record():
    """kvcr.compat's table names fields that exist, each with what it means
    here; a field renamed or dropped without the table fails."""
    import dataclasses

    from kvcr import compat
    records = {"KVCRConfig": kvcr.KVCRConfig, "LocalDramOptions": kvcr.LocalDramOptions,
               "RemoteFWDramOptions": kvcr.RemoteFWDramOptions, "G3Options": kvcr.G3Options,
               "KVCRBackendConfigs": kvcr.KVCRBackendConfigs, "MemoryRef": kvcr.MemoryRef}
    assert {record for record, _ in compat.INHERITED} == set(records)
    for (record, name), meaning in compat.INHERITED.items():
        assert name in {f.name for f in dataclasses.fields(records[record])}, (record, name)
        assert meaning.strip(), (record, name)
