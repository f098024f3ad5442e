"""KVCR's batches read by llm-d's rules (llm-d-kv-cache
pkg/kvevents/engineadapter/vllm_adapter.go, decoded with vmihailenco's
msgpack): the message is exactly three frames with an 8-byte sequence;
the batch an array [ts, events, dp_rank?]; a block hash (and a parent) is
taken only in a sized 8-byte form, uint64 (0xcf) or int64 (0xd3) — a
smaller encoding fails the whole batch ("unsupported hash type"); releases
before its map-form support read only the positional form, [tag, hashes,
parent, token_ids, block_size, lora_id?, medium?, lora_name?], later
elements ignored; the medium is matched lowercased against its backends.
The decoder below is written from those rules with msgpack's raw reader
(no type coercion), and run over a live subscription (pyzmq) to a KVCR
instance in both forms."""
import struct

import pytest
import zmq

import kvcr
from conftest import TOKENS, WAIT_SECONDS, Publisher, chain, drain


class Raw:
    """A msgpack reader keeping each integer's encoding."""

    def __init__(self, data):
        self.d, self.i = data, 0

    def take(self, n):
        assert self.i + n <= len(self.d), "truncated"
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def obj(self):
        t = self.take(1)[0]
        if t <= 0x7F or t >= 0xE0:
            return ("fixint", t if t <= 0x7F else t - 0x100)
        if 0x80 <= t <= 0x8F:
            return ("map", [(self.obj(), self.obj()) for _ in range(t & 0x0F)])
        if 0x90 <= t <= 0x9F:
            return ("array", [self.obj() for _ in range(t & 0x0F)])
        if 0xA0 <= t <= 0xBF:
            return ("str", self.take(t & 0x1F).decode())
        sized = {0xCC: ("u8", ">B"), 0xCD: ("u16", ">H"), 0xCE: ("u32", ">I"),
                 0xCF: ("u64", ">Q"), 0xD0: ("i8", ">b"), 0xD1: ("i16", ">h"),
                 0xD2: ("i32", ">i"), 0xD3: ("i64", ">q"), 0xCB: ("f64", ">d"),
                 0xCA: ("f32", ">f")}
        if t in sized:
            kind, fmt = sized[t]
            return (kind, struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])
        if t == 0xC0:
            return ("nil", None)
        if t in (0xC2, 0xC3):
            return ("bool", t == 0xC3)
        if t == 0xD9:
            return ("str", self.take(self.take(1)[0]).decode())
        if t == 0xDA:
            return ("str", self.take(struct.unpack(">H", self.take(2))[0]).decode())
        if t == 0xDC:
            return ("array", [self.obj() for _ in range(struct.unpack(">H", self.take(2))[0])])
        if t == 0xDE:
            n = struct.unpack(">H", self.take(2))[0]
            return ("map", [(self.obj(), self.obj()) for _ in range(n)])
        raise AssertionError(f"msgpack type 0x{t:02x}")


def hash_of(o):
    """llm-d's getHashAsUint64: uint64 or int64 only."""
    kind, v = o
    if kind == "u64":
        return v
    if kind == "i64":
        return v & (2**64 - 1)
    raise ValueError(f"unsupported hash type: {kind}")  # the whole batch is dropped


def decode_llmd(frames, positional_only):
    """[(tag, fields)] of one message as llm-d reads it; raises where llm-d
    drops the message."""
    assert len(frames) == 3, "expected 3 message parts"
    assert len(frames[1]) == 8, "invalid sequence bytes length"
    r = Raw(frames[2])
    kind, batch = r.obj()
    assert r.i == len(frames[2])
    assert kind == "array" and len(batch) in (2, 3) and batch[0][0] == "f64"
    assert batch[1][0] == "array"
    out = []
    for kind, ev in batch[1][1]:
        if kind == "array":
            tag = ev[0]
            assert tag[0] == "str"
            f = ev[1:]
            if tag[1] == "BlockStored":
                hashes = [hash_of(h) for h in f[0][1]]
                parent = None if f[1][0] == "nil" else hash_of(f[1])
                tokens = [v for _, v in f[2][1]]
                assert all(0 <= t < 2**32 for t in tokens)
                medium = f[5][1] if len(f) > 5 else None
                lora = f[6][1] if len(f) > 6 else None
                out.append(("BlockStored", dict(hashes=hashes, parent=parent, tokens=tokens,
                                                block_size=f[3][1], medium=medium, lora=lora)))
            elif tag[1] == "BlockRemoved":
                out.append(("BlockRemoved", dict(hashes=[hash_of(h) for h in f[0][1]],
                                                 medium=f[1][1] if len(f) > 1 else None)))
            else:
                assert tag[1] == "AllBlocksCleared"
                out.append(("AllBlocksCleared", {}))
        else:
            assert not positional_only, "an older llm-d reads only the positional form"
            assert kind == "map" and ev[0][0] == ("str", "type")
            fields = {k[1]: v for k, v in ev[1:]}
            tag = ev[0][1][1]
            if tag == "AllBlocksCleared":
                out.append((tag, {}))
                continue
            hashes = [hash_of(h) for h in fields["block_hashes"][1]]
            if tag == "BlockRemoved":
                out.append((tag, dict(hashes=hashes, medium=fields["medium"][1])))
                continue
            p = fields["parent_block_hash"]
            out.append((tag, dict(hashes=hashes, parent=None if p[0] == "nil" else hash_of(p),
                                  tokens=[v for _, v in fields["token_ids"][1]],
                                  block_size=fields["block_size"][1],
                                  medium=fields["medium"][1], lora=fields["lora_name"][1])))
    return out


def test_the_decoder_drops_what_llmd_drops():
    """The rule that matters: a hash below 2^32 in its smallest form fails
    the batch (as it did for KVCR before hashes were always 8 bytes)."""
    small = b"\x93\xcb" + struct.pack(">d", 1.8e9) + b"\x91" + \
        b"\x96\xabBlockStored\x91\x05\xc0\x90\x10\xc0"
    with pytest.raises(ValueError, match="unsupported hash type: fixint"):
        decode_llmd([b"t", bytes(8), small + b"\x00"], True)
    wide = small.replace(b"\x91\x05", b"\x91\xcf" + (5).to_bytes(8, "big"))
    assert decode_llmd([b"t", bytes(8), wide + b"\x00"], True)[0][1]["hashes"] == [5]


@pytest.mark.parametrize("positional", [True, False])
def test_every_batch_reads_by_llmds_rules(ipc_dir, positional):
    pub = Publisher(ipc_dir, slots=2, topic="kv@pod-9@model-l", legacy_positional=positional)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@pod-9@model-l")
    sub.connect(pub.endpoint)
    try:
        # The subscription is in place once a message comes: the stream's
        # AllBlocksCleared, or the empty batch a subscription is answered with.
        heard = []
        for _ in range(WAIT_SECONDS * 100):
            pub.kv.poll_completed()
            heard += drain(sub, 0.01)
            if heard:
                break
        assert heard, "the subscription never took"
        # small hashes on purpose (5, 6, 7: fixints unless written 8 bytes wide)
        blocks = chain(list(range(1, 1 + 3 * TOKENS)), keys=[b"small:5", b"small:6", b"small:7"])
        for i, (k, _, rb) in enumerate(blocks):  # 2 slots: the first is evicted
            pub.deposit({k: pub.ref(i)}, router={k: rb})
            pub.kv.poll_completed()
            heard += drain(sub, 0.05)
        deadline_rounds = 200
        while deadline_rounds and not any(
                ev[0] == "BlockRemoved" for m in heard for ev in decode_llmd(m, positional)):
            pub.kv.poll_completed()
            heard += drain(sub, 0.05)
            deadline_rounds -= 1
    finally:
        pub.close()
        sub.close()
    events = [ev for m in heard for ev in decode_llmd(m, positional)]
    stored = {h: f for tag, f in events if tag == "BlockStored" for h in f["hashes"]}
    assert sorted(stored) == [5, 6, 7]
    for k, h, rb in blocks:
        f = stored[h]
        assert f["parent"] == rb.parent_hash and f["tokens"] == list(rb.token_ids)
        assert f["block_size"] == TOKENS and f["medium"].lower() == "cpu"
    assert any(tag == "BlockRemoved" and f["medium"].lower() == "cpu" for tag, f in events)
