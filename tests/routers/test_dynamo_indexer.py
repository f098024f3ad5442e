"""Dynamo's own KV indexer (the standalone indexer of ai-dynamo-runtime
1.6.1, `python -m dynamo.indexer`: its ZMQ listener, its radix tree, its
HTTP /query) subscribed to a KVCR instance's KV events as to one more vLLM
worker, asked for the overlap of a request's token sequence: it names the
KVCR worker with the right number of blocks for blocks in KVCR DRAM
(Dynamo's host tier, medium CPU) and in G3 (its disk tier, medium
STORAGE, announced by a live spill), forgets blocks evicted for good,
scores a warm restart's G3 blocks again (a new stream, numbered past the
old one), scores the Guard's stream after the engine is SIGKILLed, and
matches nothing through a block whose parent it does not hold."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from conftest import TOKENS, WAIT_SECONDS, Publisher, chain

WORKER = 7
MODEL = "kvcr-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc):
    """SIGTERM, then SIGKILL if it has not exited within WAIT_SECONDS; reaped."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Indexer:
    """Dynamo's standalone indexer in a process of its own (reaped at close)."""

    def __init__(self, log_path):
        self.port = free_port()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            assert self.proc.poll() is None, "the indexer exited"
            try:
                self.get("/workers")
                return
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the indexer never answered"
                time.sleep(0.05)

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read() or b"null")

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read() or b"null")

    def register(self, pub):
        assert self.post("/register", {"instance_id": WORKER, "endpoint": pub.endpoint,
                                       "replay_endpoint": pub.replay, "model_name": MODEL,
                                       "block_size": TOKENS}) == {"status": "ok"}

    def overlap(self, tokens):
        """What the indexer says of WORKER for the sequence: (tokens matched
        from the start in its host tier (KVCR DRAM), tokens matched from the
        start in its host and disk tiers together (KVCR DRAM and G3)), or
        None when it does not name the worker."""
        try:
            got = self.post("/query", {"token_ids": tokens, "model_name": MODEL})
        except urllib.error.HTTPError as e:
            if e.code == 404:  # no worker of the model left: nothing is named
                return None
            raise
        inst = got.get("instances", {}).get(str(WORKER))
        return None if inst is None else (inst["cpu"], inst["disk"])

    def wait_overlap(self, pub, tokens, want):
        """Polls KVCR (which publishes from its poll; pub None: closed) and
        asks again until the indexer's answer is `want` (bounded)."""
        deadline = time.monotonic() + WAIT_SECONDS
        got = None
        while time.monotonic() < deadline:
            if pub is not None:
                pub.kv.poll_completed()
            got = self.overlap(tokens)
            if got == want:
                return
            time.sleep(0.05)
        raise AssertionError(f"the indexer says {got} of worker {WORKER}, not {want}")

    def close(self):
        stop_process(self.proc)
        self.log.close()


@pytest.fixture
def indexer(tmp_path):
    ix = Indexer(tmp_path / "dynamo-indexer.log")
    yield ix
    ix.close()


def tokens_of(first, n_blocks):
    return list(range(first, first + n_blocks * TOKENS))


def test_dram_blocks_are_scored_and_forgotten_when_evicted(ipc_dir, indexer):
    pub = Publisher(ipc_dir, slots=4)
    try:
        indexer.register(pub)
        toks = tokens_of(1000, 3)
        blocks = chain(toks)
        pub.deposit({k: pub.ref(i) for i, (k, _, _) in enumerate(blocks)},
                    router={k: rb for k, _, rb in blocks})
        indexer.wait_overlap(pub, toks, (3 * TOKENS, 3 * TOKENS))
        # a request sharing the first two blocks only
        assert indexer.overlap(toks[:2 * TOKENS] + tokens_of(9000, 1)) == (2 * TOKENS,
                                                                            2 * TOKENS)
        # four other blocks evict all three for good (no G3): the worker is
        # no longer named for the sequence
        other = chain(tokens_of(5000, 4), prefix=b"other")
        pub.deposit({k: pub.ref(4 + i) for i, (k, _, _) in enumerate(other)},
                    router={k: rb for k, _, rb in other})
        indexer.wait_overlap(pub, toks, None)
        indexer.wait_overlap(pub, tokens_of(5000, 4), (4 * TOKENS, 4 * TOKENS))
    finally:
        pub.close()


def test_g3_blocks_are_scored_after_a_live_spill_and_after_a_warm_restart(
        ipc_dir, g3_dir, indexer):
    path = os.path.join(g3_dir, "g3.bin")
    toks = tokens_of(2000, 4)
    blocks = chain(toks)
    pub = Publisher(ipc_dir, slots=2, g3_path=path)
    try:
        indexer.register(pub)
        for i, (k, _, rb) in enumerate(blocks):  # 2 DRAM slots: the first two spill to G3
            pub.deposit({k: pub.ref(i)}, router={k: rb})
        # The leading two blocks are in G3 (Dynamo's disk tier, announced
        # by the live spill with their tokens), the last two in KVCR DRAM
        # (host): from the sequence's start the host tier matches nothing,
        # host and disk together the two G3 blocks (Dynamo's radix tree
        # keeps one tree per tier; the host blocks' parent is in the other).
        indexer.wait_overlap(pub, toks, (0, 2 * TOKENS))
    finally:
        pub.close()  # AllBlocksCleared: nobody serves the blocks now
    indexer.wait_overlap(None, toks, None)
    # A warm restart on the same G3 file and endpoints: its stream starts
    # again at 0 with AllBlocksCleared and announces the blocks found in G3
    # (all four: the close spilled nothing more, the two DRAM blocks are
    # gone) with the metadata their G3 records kept.
    pub = Publisher(ipc_dir, slots=2, g3_path=path)
    try:
        indexer.wait_overlap(pub, toks, (0, 2 * TOKENS))
    finally:
        pub.close()


def test_a_block_whose_parent_is_unknown_scores_only_once_its_parent_is_stored(
        ipc_dir, indexer):
    """A block announced with a parent KVCR never held (the engine's
    earlier blocks live elsewhere) is kept by Dynamo's tree (its dump lists
    it) but matches nothing: a request's overlap counts from its first
    block. Once the parent is stored, the chain scores whole."""
    pub = Publisher(ipc_dir, slots=8)
    try:
        indexer.register(pub)
        toks = tokens_of(7000, 2)
        (k0, h0, rb0), (k1, h1, rb1) = chain(toks)
        pub.deposit({k1: pub.ref(1)}, router={k1: rb1})
        deadline = time.monotonic() + WAIT_SECONDS
        held = False
        while not held and time.monotonic() < deadline:  # until the indexer holds it
            pub.kv.poll_completed()
            dump = indexer.get("/dump").get(f"{MODEL}:default", {}).get("events", [])
            held = any(b["block_hash"] == h1 for ev in dump
                       for b in ev["event"]["data"].get("stored", {}).get("blocks", []))
            time.sleep(0.02)
        assert held
        assert indexer.overlap(toks) is None
        assert indexer.overlap(toks[TOKENS:]) is None
        pub.deposit({k0: pub.ref(0)}, router={k0: rb0})
        indexer.wait_overlap(pub, toks, (2 * TOKENS, 2 * TOKENS))
    finally:
        pub.close()


class Service:
    """`kvcr service` (one pool group of 32 MiB), stopped with SIGTERM and
    reaped at close."""

    def __init__(self, where):
        self.sock = os.path.join(where, "claim.sock")
        self.log = open(os.path.join(where, "service.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "kvcr"), "service",
             "--socket-path", self.sock, "--pool-dir", where, "--guard-count", "1",
             "--pool-sizes-gb", "0.03125", "--compatibility-digest", "routers-test",
             "--journal-mb", "4"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT_SECONDS
        while not os.path.exists(self.sock):
            assert self.proc.poll() is None, "kvcr service exited"
            assert time.monotonic() < deadline, "kvcr service did not come up"
            time.sleep(0.02)

    def close(self):
        stop_process(self.proc)
        self.log.close()


def start_engine(svc, pub, first, n):
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.join(here, "guard_engine.py"), svc.sock,
                             pub.endpoint, pub.replay, str(first), str(n)],
                            stdout=subprocess.PIPE, text=True, cwd=here)
    line = proc.stdout.readline()  # bounded by the engine's own deadline
    if line.strip() != "ready":
        proc.kill()
        proc.wait()
        raise AssertionError(f"the engine did not start: {line!r}")
    return proc


class Endpoints:
    """Where the engine, then the Guard for it, publish (ipc, bound)."""

    def __init__(self, where):
        self.endpoint = f"ipc://{where}/pub"
        self.replay = f"ipc://{where}/replay"
        self.kv = None


def test_the_guards_stream_after_a_sigkill_is_scored(ipc_dir, indexer):
    """An engine in guard mode is SIGKILLed: the Guard's backup instance
    publishes on the engine's endpoints (AllBlocksCleared, then the blocks
    it serves, with the router metadata the journal kept). Dynamo's
    indexer, its worker unregistered (everything it knew of it dropped)
    and registered again after the kill, hears only the Guard's stream
    (the subscription's empty batch, then the replay of what it missed)
    and scores the KVCR worker from it as it did from the engine's."""
    svc = Service(ipc_dir)
    ep = Endpoints(ipc_dir)
    engine = None
    try:
        indexer.register(ep)
        toks = tokens_of(4000, 3)
        engine = start_engine(svc, ep, 4000, 3)
        indexer.wait_overlap(None, toks, (3 * TOKENS, 3 * TOKENS))
        engine.send_signal(signal.SIGKILL)
        engine.wait()
        engine = None
        assert indexer.post("/unregister", {"instance_id": WORKER, "model_name": MODEL}) \
            == {"status": "ok"}
        indexer.wait_overlap(None, toks, None)
        indexer.register(ep)
        indexer.wait_overlap(None, toks, (3 * TOKENS, 3 * TOKENS))
    finally:
        if engine is not None:
            engine.kill()
            engine.wait()
        svc.close()
