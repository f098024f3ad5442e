"""Guard mode through the Python package, against a real `kvcr service`.

Each test starts its own service (two pool groups of 32 MiB, digest
"py-test", a 4 MiB journal each) in a fresh directory under /dev/shm (else
/tmp), and stops it with SIGTERM in the fixture's finalizer: the service
must exit 0 and remove its pool files and socket. A service per test keeps
the cases apart: a group's first claim fixes its control endpoint (with or
without the peer tier), so it is not shared.

Pinned: refusals come back as kvcr.control_channels' exceptions
(KVCRServiceError for a wrong digest, an index out of range, a group held by
another worker or an endpoint that cannot be moved; KVCRSocketError when
nothing listens or the service hangs up; ValueError for guard_config +
local_dram, before anything is contacted);
blocks deposited by one KVCR are recovered by the next KVCR claiming the
group, bytes compared; the vLLM adapter (unchanged) claims group
data_parallel_rank_local, stores, shuts down cleanly, and a restarted tier
on the same control port loads the blocks back.

The `kvcr` binary is the project's build: $KVCR_TOOL, else build/tools/kvcr
of this tree (scripts/setup.sh builds it), else `kvcr` on PATH (setup.sh
installs it) — the first that has the `service` command. Every wait is
bounded."""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import vllm_standins as v

import kvcr
from conftest import address_of, finished_jobs as finished, poll_until
from kvcr import CacheTier, OpEntryStatus, QueryStatus
from kvcr.integrations.vllm import KVCRSecondaryTierManager

BLOCK = 64 * 1024
DIGEST = "py-test"
GUARDS = 2
POOL_GB = "0.03125"  # 32 MiB: 512 blocks of 64 KiB
START_SECONDS = 10.0
STOP_SECONDS = 10.0
HIT = (QueryStatus.HIT, CacheTier.LOCAL_G2)
MISS = (QueryStatus.MISS, None)

REPO = Path(__file__).resolve().parents[2]


def _has_service_command(path: str) -> bool:
    try:
        out = subprocess.run([path, "service", "--help"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "--compatibility-digest" in out.stdout


def _find_tool():
    """(path, None) of the first `kvcr` with the service command, else
    (None, why)."""
    candidates = []
    if os.environ.get("KVCR_TOOL"):
        candidates.append(os.environ["KVCR_TOOL"])
    candidates.append(str(REPO / "build" / "tools" / "kvcr"))
    on_path = shutil.which("kvcr")
    if on_path:
        candidates.append(on_path)
    for c in candidates:
        if os.access(c, os.X_OK) and _has_service_command(c):
            return c, None
    return None, ("no `kvcr` binary with the service command (tried $KVCR_TOOL, "
                  f"{REPO}/build/tools/kvcr and PATH: {candidates}); run scripts/setup.sh")


TOOL, NO_TOOL = _find_tool()
pytestmark = pytest.mark.skipif(TOOL is None, reason=NO_TOOL or "")


class Service:
    """A running `kvcr service`, and its metrics through `kvcr stats`."""

    def __init__(self, tool: str):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp"
        self.dir = Path(os.path.realpath(tempfile.mkdtemp(prefix="kvcr-pytest-svc-", dir=base)))
        self.sock = str(self.dir / "claim.sock")
        self.tool = tool
        self.log_path = self.dir / "service.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [tool, "service", "--socket-path", self.sock, "--pool-dir", str(self.dir),
             "--guard-count", str(GUARDS), "--pool-sizes-gb", POOL_GB,
             "--compatibility-digest", DIGEST, "--journal-mb", "4", "--log-level", "info"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"kvcr service exited with {self.proc.returncode}:\n"
                                     f"{self.log()}")
            if self.stats(check=False) is not None:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"kvcr service did not come up in {START_SECONDS}s:\n"
                                     f"{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stats(self, check=True):
        """{metric (with labels): value} of `kvcr stats --socket`; None
        when it fails and check is False."""
        out = subprocess.run([self.tool, "stats", "--socket", self.sock], capture_output=True,
                             text=True, timeout=10)
        if out.returncode != 0:
            if check:
                raise AssertionError(f"kvcr stats failed: {out.stderr}")
            return None
        metrics = {}
        for line in out.stdout.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                metrics[name] = float(value)
        return metrics

    def guard(self, g: int, metric: str) -> float:
        return self.stats()[f'kvcr_guard_{metric}{{guard="{g}"}}']

    def phase(self, g: int) -> str:
        stats = self.stats()
        phases = [p for p in ("idle", "primary", "serving", "failed")
                  if stats.get(f'kvcr_guard_phase{{guard="{g}",phase="{p}"}}') == 1]
        assert len(phases) == 1, stats
        return phases[0]

    def pool_files(self) -> list:
        return sorted(p.name for p in self.dir.iterdir() if p.name.startswith("kvcr-pool-"))

    def stop(self) -> None:
        """SIGTERM, reaped within STOP_SECONDS (else SIGKILL): a clean stop
        exits 0 and leaves neither pool files nor the socket."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=STOP_SECONDS)
                    raise AssertionError(f"kvcr service ignored SIGTERM:\n{self.log()}")
            assert self.proc.returncode == 0, f"exit {self.proc.returncode}:\n{self.log()}"
            assert self.pool_files() == [], self.log()
            assert not os.path.exists(self.sock)
        finally:
            self._log.close()
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def service():
    svc = Service(TOOL)
    yield svc
    svc.stop()


# ---- a KVCR in guard mode -----------------------------------------------------------

def pattern(i: int) -> bytes:
    unit = bytes([i + 1]) + f"block {i} ".encode() + bytes(range(256))
    return (unit * (BLOCK // len(unit) + 1))[:BLOCK]


class GuardRig:
    """A KVCR over framework memory whose KVCR DRAM is a claimed pool group.
    Not started by the constructor: start() raises what KVCR(...) raises."""

    def __init__(self, sock, guard_index=0, digest=DIGEST, fw_blocks=8, agent="guard-rig",
                 local_dram=None, control=None):
        self.fw = bytearray(BLOCK * fw_blocks)
        self.agent = agent
        self.events = []
        self.guard = kvcr.KVCRGuardConfig(kvcr_service_socket_path=sock,
                                          guard_index=guard_index, compatibility_digest=digest)
        self.local_dram = local_dram
        self.control = control
        self.kv = None

    def start(self):
        self.kv = kvcr.KVCR(
            kvcr.KVCRConfig(nixl_agent_name=self.agent, pool_layouts=[("", BLOCK)]),
            kvcr.KVCRBindings(None, None, None, framework_control=self.control,
                              inventory_sink=self.events.append),
            kvcr.KVCRBackendConfigs(
                framework_regions=[kvcr.RegionDescriptor(addr=address_of(self.fw), size=BLOCK,
                                                         count=len(self.fw) // BLOCK)],
                local_dram=self.local_dram),
            self.guard)
        return self

    def ref(self, i):
        return [kvcr.MemoryRef(end_point_name=self.agent, element_index=i)]

    def row(self, i) -> bytes:
        return bytes(self.fw[i * BLOCK:(i + 1) * BLOCK])

    def set_row(self, i, data: bytes) -> None:
        self.fw[i * BLOCK:(i + 1) * BLOCK] = data

    def close(self):
        if self.kv is not None:
            self.kv.close()


@pytest.fixture
def rigs():
    made = []

    def make(*args, **kw):
        r = GuardRig(*args, **kw)
        made.append(r)
        return r

    yield make
    for r in made:  # the groups go back before the service stops
        r.close()


def keys(n):
    return [f"guard-key-{i}".encode() for i in range(n)]


# ---- refusals ------------------------------------------------------------------------

def test_a_wrong_digest_is_refused_by_the_service(service, rigs):
    with pytest.raises(kvcr.KVCRServiceError) as info:
        rigs(service.sock, digest="py-test-v2").start()
    assert "digest" in str(info.value)
    assert type(info.value) is kvcr.KVCRServiceError and isinstance(info.value, RuntimeError)
    with pytest.raises(kvcr.KVCRServiceError, match="digest"):
        rigs(service.sock, digest=DIGEST.upper()).start()  # byte for byte
    assert service.phase(0) == "idle" and service.guard(0, "claims_total") == 0


def test_a_guard_index_out_of_range_is_refused(service, rigs):
    with pytest.raises(kvcr.KVCRServiceError, match=r"guard_index 2 is out of range \[0, 2\)"):
        rigs(service.sock, guard_index=GUARDS).start()
    with pytest.raises(kvcr.KVCRServiceError, match="out of range"):
        rigs(service.sock, guard_index=2**32 - 1).start()


def test_a_missing_socket_raises_a_socket_error(service, rigs):
    missing = str(service.dir / "nobody.sock")
    with pytest.raises(kvcr.KVCRSocketError, match="not reachable") as info:
        rigs(missing).start()
    assert missing in str(info.value)
    assert isinstance(info.value, kvcr.KVCRServiceError)
    # A socket file nobody listens on any more: refused connection, same error.
    dead = str(service.dir / "dead.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(dead)
    with pytest.raises(kvcr.KVCRSocketError, match="not reachable"):
        rigs(dead).start()


def test_a_service_that_hangs_up_raises_a_socket_error(tmp_path, rigs):
    """A listener that takes the whole claim and closes without answering:
    the service is not reachable (libkvcr's KVCR_EUNAVAIL), not a protocol
    error."""
    path = str(tmp_path / "hangup.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(START_SECONDS)

        def take_the_claim_and_hang_up():
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(START_SECONDS)
                head = conn.recv(4, socket.MSG_WAITALL)  # the frame's length, then the frame
                left = int.from_bytes(head, "big")
                while left > 0:  # all of it: unread bytes would reset the connection
                    chunk = conn.recv(left)
                    assert chunk, "the claim ended early"
                    left -= len(chunk)

        t = threading.Thread(target=take_the_claim_and_hang_up)
        t.start()
        try:
            with pytest.raises(kvcr.KVCRSocketError, match="closed the claim socket") as info:
                rigs(path).start()
        finally:
            t.join(START_SECONDS)
        assert isinstance(info.value, kvcr.KVCRServiceError)


def test_guard_config_with_local_dram_is_refused_before_anything_is_contacted(tmp_path, rigs):
    """libkvcr refuses it before the claim; a listening socket in place of
    the service proves that nobody connected."""
    path = str(tmp_path / "claim.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(4)
        listener.setblocking(False)
        pool = bytearray(BLOCK * 4)
        local = kvcr.LocalDramOptions(pools=[("", address_of(pool), len(pool))])
        with pytest.raises(ValueError) as info:
            rigs(path, local_dram=local).start()
        assert str(info.value) == \
            "guard mode conflicts with local_dram: the KVCR service provides the pools"
        # A bad guard field is refused before the socket is touched as well.
        with pytest.raises(ValueError, match="guard_index"):
            rigs(path, guard_index=-1).start()
        with pytest.raises(BlockingIOError):
            listener.accept()


# ---- claim, deposit, close, recover -----------------------------------------------------

def test_blocks_deposited_in_a_claimed_group_are_recovered_by_the_next_claim(service, rigs):
    n = 4
    ks = keys(n)
    first = rigs(service.sock, agent="engine-a").start()
    assert service.phase(0) == "primary" and service.phase(1) == "idle"
    for i in range(n):
        first.set_row(i, pattern(i))
    op = first.kv.deposit({k: first.ref(i) for i, k in enumerate(ks)})
    entries = poll_until(first.kv, op)
    assert {k: e.status for k, e in entries.items()} == {k: OpEntryStatus.SUCCESS for k in ks}
    assert first.kv.query(ks) == [HIT] * n
    added = [k for e in first.events if not e.removed and e.tier is CacheTier.LOCAL_G2
             for k in e.keys]
    assert sorted(added) == sorted(ks)
    first.close()
    assert service.phase(0) == "idle"
    assert service.guard(0, "mirrored_blocks") == n  # the Guard keeps them
    assert service.guard(0, "claims_total") == 1

    second = rigs(service.sock, agent="engine-b").start()
    assert service.phase(0) == "primary" and service.guard(0, "claims_total") == 2
    assert second.kv.query(ks + [b"never-deposited"]) == [HIT] * n + [MISS]
    op = second.kv.deliver({k: second.ref(n + i) for i, k in enumerate(ks)})
    entries = poll_until(second.kv, op)
    assert all(e.status is OpEntryStatus.SUCCESS for e in entries.values()), entries
    for i in range(n):
        assert second.row(n + i) == pattern(i), f"block {i}"
    # The recovered blocks are announced to the inventory sink again.
    second.kv.poll_completed()
    announced = [k for e in second.events if not e.removed for k in e.keys]
    assert sorted(announced) == sorted(ks)
    # fetch claims a recovered slot whose bytes are the deposited ones.
    op = second.kv.fetch([ks[0]])
    entry = poll_until(second.kv, op)[ks[0]]
    assert entry.success
    (addr, size), = entry.addresses
    assert size == BLOCK and ctypes.string_at(addr, size) == pattern(0)
    assert second.kv.release([entry.release_handle]) == [(entry.release_handle, True)]
    second.close()
    assert service.phase(0) == "idle" and service.guard(0, "mirrored_blocks") == n


def test_a_second_claim_of_a_held_group_is_refused(service, rigs):
    holder = rigs(service.sock, agent="holder").start()
    with pytest.raises(kvcr.KVCRServiceError, match="held by another worker") as info:
        rigs(service.sock, agent="intruder").start()
    assert "holder" in str(info.value)  # the owner's agent name
    other = rigs(service.sock, guard_index=1, agent="other").start()  # the other group is free
    assert service.phase(0) == "primary" and service.phase(1) == "primary"
    assert service.guard(0, "refusals_total") >= 1
    other.close()
    holder.close()
    again = rigs(service.sock, agent="after").start()  # released: claimable again
    assert service.phase(0) == "primary"
    again.close()


def test_the_first_claim_fixes_the_groups_endpoint(service, rigs):
    """A group first claimed without the peer tier cannot later be claimed
    with a control endpoint (the service keeps the endpoint the Guard
    serves on)."""
    rigs(service.sock, agent="plain").start().close()
    control = kvcr.ZmqPeerControlChannel("127.0.0.1", 0)
    with pytest.raises(kvcr.KVCRServiceError, match="cannot be moved"):
        rigs(service.sock, agent="with-peer", control=control).start()
    assert service.phase(0) == "idle"


# ---- the vLLM adapter ------------------------------------------------------------------

def spec(rank=None):
    return SimpleNamespace(
        config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_rank_local=rank)),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=True,
                                         self_describing_kv_events=True))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tier_of(service, view, ports, rank=None, **kw):
    return KVCRSecondaryTierManager(
        spec(rank), view, "kvcr", router_capabilities=["router_hint"], control_host="127.0.0.1",
        control_ports=ports, control_advertise_host="127.0.0.1",
        kvcr_service_socket_path=service.sock, compatibility_digest=DIGEST, **kw)


def vkey(i):
    return v.make_offload_key(bytes([i]) * 8, 0)


def test_the_vllm_tier_claims_its_ranks_group_and_recovers_after_a_restart(service, caplog):
    view = memoryview(bytearray(6 * BLOCK)).cast("B", (6, BLOCK))
    ports = [free_port(), free_port()]
    data = [pattern(10), pattern(11)]
    view.obj[0:BLOCK] = data[0]
    view.obj[BLOCK:2 * BLOCK] = data[1]
    # secondary_g2_slots is ignored (with a warning): the service's pool is KVCR DRAM.
    tier = tier_of(service, view, ports[:1], secondary_g2_slots=2)
    assert "secondary_g2_slots is ignored" in caplog.text
    assert tier._local_dram_mmap is None
    assert service.phase(0) == "primary" and service.phase(1) == "idle"
    assert tier._kvcr.control_endpoint == f"tcp://127.0.0.1:{ports[0]}"
    tier.submit_store(v.TransferJob(1, [vkey(1), vkey(2)], [0, 1], False,
                                    v.ReqContext(req_id="store")))
    assert finished(tier, 1) == [v.JobResult(1, True)]
    events = tier.take_events()
    assert [k for e in events for k in e.keys] == [vkey(1), vkey(2)]
    assert all(e.medium is v.Medium.CPU and not e.removed for e in events)
    ctx = v.ReqContext(req_id="r")
    assert tier.lookup(vkey(1), ctx) is v.LookupResult.HIT
    tier.shutdown()
    assert service.phase(0) == "idle"
    assert service.guard(0, "claims_total") == 1 and service.guard(0, "mirrored_blocks") == 2

    # The restarted worker, on the same control port (the service kept the
    # endpoint), gets the blocks back: lookups HIT, loads deliver the bytes.
    view.obj[:] = bytes(len(view.obj))
    tier = tier_of(service, view, ports[:1])
    assert service.phase(0) == "primary"
    assert tier.lookup(vkey(1), ctx) is v.LookupResult.HIT
    assert tier.lookup(vkey(2), ctx) is v.LookupResult.HIT
    assert tier.lookup(vkey(3), ctx) is v.LookupResult.MISS
    tier.submit_load(v.TransferJob(2, [vkey(1), vkey(2)], [4, 5], True, ctx))
    assert finished(tier, 1) == [v.JobResult(2, True)]
    assert bytes(view.obj[4 * BLOCK:5 * BLOCK]) == data[0]
    assert bytes(view.obj[5 * BLOCK:6 * BLOCK]) == data[1]
    recovered = [k for e in tier.take_events() if not e.removed for k in e.keys]
    assert sorted(recovered) == sorted([vkey(1), vkey(2)])

    # Rank 1 of the same node claims group 1, on its own port.
    other = tier_of(service, memoryview(bytearray(2 * BLOCK)).cast("B", (2, BLOCK)), ports,
                    rank=1)
    assert service.phase(1) == "primary"
    assert other._kvcr.control_endpoint == f"tcp://127.0.0.1:{ports[1]}"
    other.shutdown()
    tier.shutdown()
    assert service.phase(0) == "idle" and service.phase(1) == "idle"


def test_the_vllm_tier_reports_a_refused_claim(service):
    view = memoryview(bytearray(2 * BLOCK)).cast("B", (2, BLOCK))
    with pytest.raises(kvcr.KVCRServiceError, match="digest"):
        KVCRSecondaryTierManager(
            spec(), view, "kvcr", router_capabilities=["router_hint"],
            control_host="127.0.0.1", control_ports=[free_port()],
            control_advertise_host="127.0.0.1", kvcr_service_socket_path=service.sock,
            compatibility_digest="another-model")
    with pytest.raises(kvcr.KVCRSocketError):
        KVCRSecondaryTierManager(
            spec(), view, "kvcr", router_capabilities=["router_hint"],
            control_host="127.0.0.1", control_ports=[free_port()],
            control_advertise_host="127.0.0.1",
            kvcr_service_socket_path=str(service.dir / "nobody.sock"),
            compatibility_digest=DIGEST)
    assert service.phase(0) == "idle" and service.guard(0, "claims_total") == 0
