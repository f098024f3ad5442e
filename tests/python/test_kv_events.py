"""KV events from Python (KVCRConfig.kv_events = KVEventsOptions): a
subscriber written here from the ZeroMQ wire protocol (ZMTP 3.0, NULL
security) and a strict msgpack reader — no pyzmq, no msgpack package —
decodes every frame: exactly three per message, the topic, consecutive
8-byte big-endian sequence numbers, [ts float64, [events], dp_rank] with
maps whose first key is "type", every hash in the 8-byte form; extra keys
of vLLM's types (str, int, tuples) packed as vLLM packs them; replay
answers every kept batch byte for byte and ends with 0xFFFFFFFFFFFFFFFF;
the options' types and rules (dp_rank at most 2^31-1)."""
import hashlib
import os
import shutil
import socket
import struct
import tempfile
import time

import pytest

import kvcr
from conftest import address_of, poll_until

TOPIC = b"kv@pod-7@model-b"
BLOCK = 4096


# ---- a strict msgpack reader (the subset the wire format uses) ---------------

class Reader:
    def __init__(self, data: bytes):
        self.d, self.i = data, 0

    def take(self, n):
        if self.i + n > len(self.d):
            raise ValueError("truncated msgpack")
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def obj(self):
        t = self.take(1)[0]
        if t <= 0x7F:
            return t
        if t >= 0xE0:
            return t - 0x100
        if 0x80 <= t <= 0x8F:
            return self.map(t & 0x0F)
        if 0x90 <= t <= 0x9F:
            return [self.obj() for _ in range(t & 0x0F)]
        if 0xA0 <= t <= 0xBF:
            return self.take(t & 0x1F).decode()
        fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h",
                 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
        if t in fixed:
            fmt = fixed[t]
            v = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
            return Float64(v) if t == 0xCB else Fixed64(v) if t == 0xCF else v
        if t == 0xC0:
            return None
        if t in (0xC2, 0xC3):
            return t == 0xC3
        if t in (0xD9, 0xDA, 0xDB):
            n = int.from_bytes(self.take(1 << (t - 0xD9)), "big")
            return self.take(n).decode()
        if t in (0xDC, 0xDD):
            n = int.from_bytes(self.take(2 if t == 0xDC else 4), "big")
            return [self.obj() for _ in range(n)]
        if t in (0xDE, 0xDF):
            return self.map(int.from_bytes(self.take(2 if t == 0xDE else 4), "big"))
        raise ValueError(f"msgpack type 0x{t:02x} is not used by the wire format")

    def map(self, n):
        items = [(self.obj(), self.obj()) for _ in range(n)]
        keys = [k for k, _ in items]
        assert len(set(keys)) == len(keys), "duplicate map key"
        return items  # ordered pairs: the order is part of the format


class Float64(float):
    """A float that was encoded as float64 (the timestamp must be)."""


class Fixed64(int):
    """An int that was encoded in the 8-byte unsigned form, 0xcf (hashes
    must be: llm-d's decoder takes no other)."""


def unpack(data: bytes):
    r = Reader(data)
    o = r.obj()
    assert r.i == len(data), "trailing bytes after the payload"
    return o


STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name"]
REMOVED = ["block_hashes", "medium"]


def check_batch(payload: bytes, dp_rank: int, medium: str):
    """The payload's shape, field by field; returns [(type, fields dict)]."""
    batch = unpack(payload)
    assert isinstance(batch, list) and len(batch) == 3
    ts, events, rank = batch
    assert isinstance(ts, Float64) and 1.7e9 < ts < 4.1e9
    assert rank == dp_rank
    out = []
    for ev in events:
        assert isinstance(ev, list) and ev[0][0] == "type"
        kind = ev[0][1]
        names = [k for k, _ in ev[1:]]
        fields = dict(ev[1:])
        if kind == "BlockStored":
            assert names[:7] == STORED and names[7:] in ([], ["extra_keys"])
            assert fields["medium"] == medium or (
                medium is None and fields["medium"] in ("CPU", "STORAGE"))
            assert fields["lora_id"] is None
            hashes = fields["block_hashes"]
            assert fields["token_ids"] == [] or (
                len(fields["token_ids"]) == len(hashes) * fields["block_size"])
        elif kind == "BlockRemoved":
            assert names == REMOVED and (fields["medium"] == medium or medium is None)
        else:
            assert kind == "AllBlocksCleared" and names == []
        for h in fields.get("block_hashes", []):
            assert type(h) is Fixed64 and 0 <= h < 2**64
        assert fields.get("parent_block_hash") is None or type(
            fields["parent_block_hash"]) is Fixed64
        out.append((kind, fields))
    return out


# ---- a ZMTP 3.0 peer over a Unix socket --------------------------------------

class ZmtpPeer:
    def __init__(self, path: str, socket_type: bytes):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(5.0)
        self.s.connect(path)
        greeting = (b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
                    + b"\0" + bytes(31))
        self.s.sendall(greeting)
        peer = self.exact(64)
        assert peer[0] == 0xFF and peer[9] == 0x7F and peer[10] == 3
        body = (bytes([5]) + b"READY" + bytes([11]) + b"Socket-Type"
                + struct.pack(">I", len(socket_type)) + socket_type)
        self.s.sendall(bytes([0x04, len(body)]) + body)
        flags, cmd = self.frame()
        assert flags & 0x04 and cmd[1:6] == b"READY"

    def exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("peer closed")
            buf += chunk
        return buf

    def frame(self):
        flags = self.exact(1)[0]
        size = (struct.unpack(">Q", self.exact(8))[0] if flags & 0x02 else self.exact(1)[0])
        return flags, self.exact(size)

    def message(self):
        """One message's frames (commands such as PING skipped)."""
        frames = []
        while True:
            flags, body = self.frame()
            if flags & 0x04:
                continue
            frames.append(body)
            if not flags & 0x01:
                return frames

    def send(self, frames):
        for i, f in enumerate(frames):
            more = 0x01 if i + 1 < len(frames) else 0
            if len(f) > 255:
                self.s.sendall(bytes([more | 0x02]) + struct.pack(">Q", len(f)) + f)
            else:
                self.s.sendall(bytes([more, len(f)]) + f)

    def close(self):
        self.s.close()


# ---- the rig --------------------------------------------------------------------

def router_hash(key: bytes) -> int:
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


class Adapter:
    def encode(self, key):
        return key

    def decode(self, key):
        return router_hash(bytes(key))


@pytest.fixture
def ipc_dir():
    d = tempfile.mkdtemp(prefix="kvcr-pytest-kvev-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_kv(ipc_dir, slots=4, g3=None, **opts):
    fw = bytearray(BLOCK * 8)
    pool = bytearray(BLOCK * slots)
    events = kvcr.KVEventsOptions(endpoint=f"ipc://{ipc_dir}/pub",
                                  replay_endpoint=f"ipc://{ipc_dir}/replay",
                                  topic=TOPIC.decode(), **opts)
    kv = kvcr.KVCR(
        kvcr.KVCRConfig(nixl_agent_name="py-kvev", pool_layouts=[("", BLOCK)],
                        kv_events=events),
        kvcr.KVCRBindings(None, None, None, key_adapter=Adapter()),
        kvcr.KVCRBackendConfigs(
            framework_regions=[kvcr.RegionDescriptor(addr=address_of(fw), size=BLOCK, count=8)],
            local_dram=kvcr.LocalDramOptions(pools=[("", address_of(pool), BLOCK * slots)]),
            g3=g3))
    return kv, fw, pool


def ref(i):
    return [kvcr.MemoryRef(end_point_name="py-kvev", element_index=i)]


def subscribe(ipc_dir):
    sub = ZmtpPeer(f"{ipc_dir}/pub", b"SUB")
    sub.send([b"\x01" + TOPIC])  # ZMTP 3.0: a subscription is a message
    return sub


def read_stream(kv, sub, want, seen, dp_rank=0, medium="CPU"):
    """Reads messages until every hash of `want` was stored (bounded)."""
    deadline = time.monotonic() + 10
    sub.s.settimeout(0.05)
    last = seen.get("last")
    for _ in range(2000):
        if want <= seen["stored"] or time.monotonic() > deadline:
            break
        kv.poll_completed()
        try:
            frames = sub.message()
        except (socket.timeout, TimeoutError):
            continue
        assert len(frames) == 3 and frames[0] == TOPIC and len(frames[1]) == 8
        seq = int.from_bytes(frames[1], "big")
        if last is not None:
            assert seq == last + 1
        last = seq
        seen.setdefault("payloads", {})[seq] = frames[2]
        for kind, fields in check_batch(frames[2], dp_rank, medium):
            if kind == "BlockStored":
                seen["stored"].update(fields["block_hashes"])
            elif kind == "BlockRemoved":
                seen["removed"].update(fields["block_hashes"])
    seen["last"] = last
    assert want <= seen["stored"]


def replay_all(ipc_dir):
    """Every batch the replay endpoint keeps, from 0, as (seq, payload)."""
    rep = ZmtpPeer(f"{ipc_dir}/replay", b"DEALER")
    rep.send([b"", (0).to_bytes(8, "big")])
    got = []
    for _ in range(100_000):
        frames = rep.message()
        assert len(frames) == 3 and frames[0] == b""
        seq = int.from_bytes(frames[1], "big")
        if seq == 2**64 - 1:
            assert frames[2] == b""
            break
        got.append((seq, frames[2]))
    rep.close()
    return got


def test_stream_and_replay_decode_frame_by_frame(ipc_dir):
    started_us = time.time_ns() // 1000
    kv, fw, pool = make_kv(ipc_dir, dp_rank=5)
    sub = subscribe(ipc_dir)
    seen = {"stored": set(), "removed": set()}
    try:
        # The subscription reaches the publisher some time after connecting:
        # deposits go on until one is seen.
        for i in range(50):
            key = b"join-%d" % i
            poll_until(kv, kv.deposit({key: ref(0)}))
            try:
                read_stream(kv, sub, {router_hash(key)}, seen, dp_rank=5)
                break
            except AssertionError:
                continue
        keys = [b"blk-%d" % i for i in range(6)]  # 4 slots: the first ones are evicted
        for i, k in enumerate(keys):
            [entry] = poll_until(kv, kv.deposit({k: ref(i)})).values()
            assert entry.success
        read_stream(kv, sub, {router_hash(k) for k in keys}, seen, dp_rank=5)
        assert seen["removed"], "evictions are announced"

        got = replay_all(ipc_dir)
        # numbered without a gap from the wall clock in microseconds when the
        # stream opened: past any earlier process's numbers on the endpoint
        first = got[0][0]
        assert started_us <= first <= time.time_ns() // 1000
        assert [s for s, _ in got] == list(range(first, first + len(got)))
        assert check_batch(got[0][1], 5, "CPU")[0][0] == "AllBlocksCleared"
        for seq, payload in seen["payloads"].items():
            assert got[seq - first][1] == payload  # byte for byte what the subscriber got
    finally:
        sub.close()
        kv.close()


def test_deposit_router_blocks_reach_the_events(ipc_dir):
    kv, fw, pool = make_kv(ipc_dir)
    sub = subscribe(ipc_dir)
    seen = {"stored": set(), "removed": set()}
    try:
        for i in range(50):  # until the subscription is in place
            key = b"join-%d" % i
            poll_until(kv, kv.deposit({key: ref(0)}))
            try:
                read_stream(kv, sub, {router_hash(key)}, seen)
                break
            except AssertionError:
                continue
        parent = router_hash(b"d0")
        router = {b"d0": kvcr.RouterBlock(token_ids=(1, 2, 3, 4), block_size=4,
                                          lora_name="lora-x"),
                  b"d1": kvcr.RouterBlock(parent_hash=parent, token_ids=(5, 6, 7, 8),
                                          block_size=4, extra_keys=("salt",)),
                  b"d2": kvcr.RouterBlock(extra_keys=("salt", 7, ("mm-a", 3)))}
        with pytest.raises(TypeError, match="must be a RouterBlock"):
            kv.deposit({b"d0": ref(1)}, router={b"d0": (1, 2)})
        with pytest.raises(ValueError, match="token_ids need block_size_tokens"):
            kv.deposit({b"d0": ref(1)}, router={b"d0": kvcr.RouterBlock(token_ids=(1,))})
        for bad in ((-1,), (1.5,), ({"a": 1},), (("x", ("y",)),), (True,)):
            with pytest.raises(ValueError, match="extra keys|extra_keys"):
                kv.deposit({b"d0": ref(1)}, router={b"d0": kvcr.RouterBlock(extra_keys=bad)})
        blocks = {b"d0": ref(1), b"d1": ref(2), b"d2": ref(3)}
        poll_until(kv, kv.deposit(blocks, router=router))
        want = {router_hash(k) for k in blocks}
        described = {}
        deadline = time.monotonic() + 10
        sub.s.settimeout(0.05)
        while not want <= set(described) and time.monotonic() < deadline:
            kv.poll_completed()
            try:
                frames = sub.message()
            except (socket.timeout, TimeoutError):
                continue
            for kind, fields in check_batch(frames[2], 0, "CPU"):
                if kind == "BlockStored":
                    for h in fields["block_hashes"]:
                        described[h] = fields
        d0, d1, d2 = (described[router_hash(k)] for k in (b"d0", b"d1", b"d2"))
        assert d0["token_ids"] == [1, 2, 3, 4] and d0["block_size"] == 4
        assert d0["lora_name"] == "lora-x" and d0["parent_block_hash"] is None
        assert d1["parent_block_hash"] == parent and d1["token_ids"] == [5, 6, 7, 8]
        assert d1["extra_keys"] == [["salt"]]
        assert d2["token_ids"] == [] and d2["block_size"] == 0  # no tokens: hashes only
        assert d2["extra_keys"] == [["salt", 7, ["mm-a", 3]]]  # a tuple is an array
    finally:
        sub.close()
        kv.close()


def test_a_warm_restart_announces_what_the_deposit_said(ipc_dir):
    """Blocks spilled to G3 with their router metadata are found again by the
    next instance on the same file, and its stream's BlockStored (medium
    STORAGE) carries the parent, tokens, block size, LoRA name and extra
    keys given at deposit, value for value; the bytes come back too."""
    g3_dir = tempfile.mkdtemp(prefix="kvcr-pytest-kvev-g3-", dir="/var/tmp")
    g3 = kvcr.G3Options(paths=(os.path.join(g3_dir, "slots"),),
                        capacity_bytes_per_file=8 * BLOCK)
    parent = router_hash(b"r0")
    router = {b"r0": kvcr.RouterBlock(token_ids=tuple(range(2**32 - 16, 2**32)),
                                      block_size=16, lora_name="lora-y"),
              b"r1": kvcr.RouterBlock(parent_hash=parent, token_ids=tuple(range(16)),
                                      block_size=16, extra_keys=("salt-b", "mm-1"))}
    try:
        kv, fw, pool = make_kv(ipc_dir, slots=2, g3=g3)
        try:
            for i in range(4):
                fw[i * BLOCK:(i + 1) * BLOCK] = bytes([0x40 + i]) * BLOCK
            poll_until(kv, kv.deposit({b"r0": ref(0), b"r1": ref(1)}, router=router))
            in_g3 = (kvcr.QueryStatus.FETCHABLE, kvcr.CacheTier.G3)
            for i, k in enumerate((b"p0", b"p1")):  # two more: r0 and r1 go to G3
                poll_until(kv, kv.deposit({k: ref(2 + i)}))
                for _ in range(500):  # until the spill's store committed (bounded)
                    kv.poll_completed()
                    if kv.query([b"r0", b"r1"][:i + 1]) == [in_g3] * (i + 1):
                        break
                    time.sleep(0.01)
            assert kv.query([b"r0", b"r1"]) == [in_g3, in_g3]
        finally:
            kv.close()
        kv, fw, pool = make_kv(ipc_dir, slots=2, g3=g3)
        try:
            described = {}
            deadline = time.monotonic() + 10
            while len(described) < 2 and time.monotonic() < deadline:
                kv.poll_completed()
                time.sleep(0.05)
                for _, payload in replay_all(ipc_dir):
                    for kind, fields in check_batch(payload, 0, None):
                        if kind == "BlockStored" and fields["medium"] == "STORAGE":
                            for h in fields["block_hashes"]:
                                if h in (parent, router_hash(b"r1")):
                                    assert fields["block_hashes"] == [h]
                                    described[h] = fields
            r0, r1 = described[parent], described[router_hash(b"r1")]
            assert r0["token_ids"] == list(range(2**32 - 16, 2**32))
            assert r0["block_size"] == 16 and r0["parent_block_hash"] is None
            assert r0["lora_name"] == "lora-y" and r0.get("extra_keys") is None
            assert r1["parent_block_hash"] == parent and r1["token_ids"] == list(range(16))
            assert r1["lora_name"] is None and r1["extra_keys"] == [["salt-b", "mm-1"]]
            fw[7 * BLOCK:8 * BLOCK] = bytes(BLOCK)
            [entry] = poll_until(kv, kv.deliver({b"r1": ref(7)})).values()
            assert entry.success and bytes(fw[7 * BLOCK:8 * BLOCK]) == bytes([0x41]) * BLOCK
        finally:
            kv.close()
    finally:
        shutil.rmtree(g3_dir, ignore_errors=True)


def test_options_types_and_rules(ipc_dir):
    with pytest.raises(TypeError, match="kv_events must be a KVEventsOptions"):
        kvcr.config.kv_events_args("tcp://*:5557")
    with pytest.raises(TypeError, match="kv_events.topic must be a str"):
        kvcr.config.kv_events_args(kvcr.KVEventsOptions(endpoint="tcp://*:1", topic=7))
    with pytest.raises(ValueError, match="kv_events.dp_rank must be between 0 and"):
        kvcr.config.kv_events_args(kvcr.KVEventsOptions(endpoint="tcp://*:1", dp_rank=-1))
    assert kvcr.KVEventsOptions(endpoint="x").buffer_batches == 10000
    # Dynamo reads dp_rank as a signed 32-bit integer: refused above it
    with pytest.raises(ValueError, match=r"kv_events.dp_rank must be at most 2147483647"):
        make_kv(ipc_dir, dp_rank=2**31)
    with pytest.raises(ValueError, match="kv_events.max_batch_events must be between 1 and"):
        make_kv(ipc_dir, max_batch_events=0)
    with pytest.raises(ValueError, match="must be a ZeroMQ endpoint"):
        kvcr.KVCR(kvcr.KVCRConfig(nixl_agent_name="x", pool_layouts=[("", BLOCK)],
                                  kv_events=kvcr.KVEventsOptions(endpoint="localhost:1")),
                  kvcr.KVCRBindings(None, None, None, key_adapter=Adapter()),
                  kvcr.KVCRBackendConfigs(local_dram=kvcr.LocalDramOptions(
                      pools=[("", address_of(bytearray(BLOCK)), BLOCK)])))
