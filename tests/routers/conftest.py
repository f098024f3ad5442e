"""The routers' tests: KVCR's KV events read by the real consumers' code
(Dynamo's KV indexer from the ai-dynamo-runtime package, vLLM's kv_events
structs with msgspec, llm-d's decoding rules). Run by the environment
scripts/routers-env.sh makes (scripts/test-routers.sh)."""
import hashlib
import os
import shutil
import tempfile
import time

import pytest
import zmq

import kvcr

BLOCK = 4096          # bytes of a KVCR block
TOKENS = 16           # tokens per block, as the engine (and the router) count them
WAIT_SECONDS = int(os.environ.get("KVCR_ROUTERS_WAIT", "20"))  # every wait below is bounded by this


def router_hash(key: bytes) -> int:
    """The block's router hash: vLLM's (the last 8 bytes of a SHA-256, read
    big-endian); a key b"small:<n>" hashes to n, for hashes below 2^32."""
    if key.startswith(b"small:"):
        return int(key[6:])
    return int.from_bytes(hashlib.sha256(key).digest()[24:], "big")


class Adapter:
    def encode(self, h):
        raise NotImplementedError

    def decode(self, key):
        return router_hash(bytes(key))


def address_of(buf) -> int:
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


class Publisher:
    """One KVCR instance publishing its KV events on an ipc endpoint (bound,
    as vLLM binds ipc://), with KVCR DRAM of `slots` blocks and, with g3, a
    G3 file of `g3_slots`."""

    def __init__(self, where, slots=4, g3_path=None, g3_slots=8, name="router-pub", **opts):
        self.where = where
        self.endpoint = f"ipc://{where}/pub"
        self.replay = f"ipc://{where}/replay"
        self.fw = bytearray(BLOCK * 16)
        self.pool = bytearray(BLOCK * slots)
        self.name = name
        events = kvcr.KVEventsOptions(endpoint=self.endpoint, replay_endpoint=self.replay,
                                      topic=opts.pop("topic", "kv@pod-1@model-r"), **opts)
        g3 = kvcr.G3Options(paths=(g3_path,), capacity_bytes_per_file=g3_slots * BLOCK) \
            if g3_path else None
        policy = kvcr.G3LRUPolicy() if g3_path else None
        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=name, pool_layouts=[("", BLOCK)], kv_events=events),
            kvcr.KVCRBindings(None, None, None, key_adapter=Adapter(), policy=policy),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw), size=BLOCK,
                                                         count=16)],
                local_dram=kvcr.LocalDramOptions(pools=[("", address_of(self.pool),
                                                         BLOCK * slots)]),
                g3=g3))

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.name, element_index=i)]

    def wait(self, op):
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            for handle, entries in self.kv.poll_completed():
                if handle == op:
                    return entries
            time.sleep(0.002)
        raise AssertionError(f"operation {op} did not complete in {WAIT_SECONDS} s")

    def deposit(self, blocks, router=None, **kw):
        done = self.wait(self.kv.deposit(blocks, router=router, **kw))
        assert all(e.success for e in done.values()), done
        return done

    def close(self):
        self.kv.close()


def chain(tokens, prefix=b"blk", keys=None):
    """A request's token sequence cut into blocks of TOKENS: per block its
    key (keys[i], or prefix-i), its router hash and its RouterBlock
    (parent: the previous block)."""
    out, parent = [], None
    for i in range(len(tokens) // TOKENS):
        key = keys[i] if keys else prefix + b"-%d" % i
        rb = kvcr.RouterBlock(parent_hash=parent, token_ids=tuple(tokens[i * TOKENS:(i + 1) * TOKENS]),
                              block_size=TOKENS)
        out.append((key, router_hash(key), rb))
        parent = router_hash(key)
    return out


@pytest.fixture
def ipc_dir():
    d = tempfile.mkdtemp(prefix="kvcr-routers-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def g3_dir():
    d = tempfile.mkdtemp(prefix="kvcr-routers-g3-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def drain(sock, seconds=0.0):
    """Every message the socket holds now (and for `seconds` more)."""
    out = []
    deadline = time.monotonic() + seconds
    while True:
        timeout = max(0, int((deadline - time.monotonic()) * 1000))
        if not sock.poll(timeout):
            return out
        out.append(sock.recv_multipart())
