#!/usr/bin/env python3
"""kvcr-bench anchors: KVCR beside what a user would otherwise install --
the reference implementation (`kvcr` 0.1.1, Python on NIXL), NIXL itself and
Mooncake's transfer engine -- on the same workload, in the same run,
alternating.

    kvcr-bench anchors [--json] [--quick] [--runs N] [--self-test]

The anchors live in a virtual environment of their own, made (or found up to
date) by scripts/anchors-env.sh; this tree's package runs on another
interpreter (KVCR_SELF_PYTHON, default /usr/bin/python3, with
KVCR_SELF_PYTHONPATH put first on its path when set), because the reference
has the same import name. Every case runs its sides in fresh processes
(bench/bench_anchors/*_side.py), one after the other, in an order rotated
each run, for N runs (default 3); a row is the median of the runs for each
side and the ratio of KVCR's median to the baseline's (higher is better;
for times, the baseline's over ours).

Cases and baselines (sizes for --quick in brackets):
  query_32                32 keys per KVCR.query at 1 M [20 k] resident
                          blocks, ns per call                  kvcr-ref
  deposit_2mib, deliver_2mib    64 [8] blocks a round, GB/s    kvcr-ref
  deposit_16kib, deliver_16kib  4096 [256] blocks a round      kvcr-ref
  pull_2mib_{host,xhost}        16 [4] x 2 MiB from a peer     kvcr-ref, nixl (+ mooncake-te on xhost)
  pull_16kib_x256_{host,xhost}  256 x 16 KiB from a peer       kvcr-ref, nixl (+ mooncake-te on xhost)
  pull_1block_{host,xhost}      one 16 KiB block, ns           kvcr-ref, nixl (+ mooncake-te on xhost)
  failover_first_block    an engine in guard mode SIGKILLed: ns until a peer
                          is served a block again (the Guard)  kvcr-ref
"host": two processes on this host (127.0.0.1); "xhost": two network-
namespace hosts made here (own network, IPC and UTS namespaces; a veth pair,
198.19.77.1 and .2), so nothing can pass through shared memory. A case an
anchor cannot run prints a row with "status" and "why" instead of figures.

--json prints one object per line: bench, case, value, unit, baseline,
baseline_value, ratio, runs, goal (and whether it was met), each side's
per-run values, and which side ran first in each run. Load
averages at the start and end are printed as a row of their own ("load"):
the machine is shared, and these figures are only as quiet as it was.

--self-test runs the quick cases on this tree's package only, with itself
as the baseline ("kvcr-self"), so that the driver, the rows and the
alternation can be checked without any anchor installed.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = os.path.join(HERE, "bench_anchors")
ROOT = os.path.dirname(HERE)
KIB, MIB = 1 << 10, 1 << 20
START_S = 180.0  # a side's set-up (the reference's NIXL agent takes seconds under load)
CASE_S = 600.0   # one side of one case
FILL_S = 1800.0  # the reference fills 1 M blocks at a few thousand a second under load

GOALS = {  # (baseline, case prefix) -> goal as the ratio ours / baseline must reach
    ("kvcr-ref", "query_32"): 20.0,
    ("kvcr-ref", "deposit_2mib"): 1.0, ("kvcr-ref", "deliver_2mib"): 1.0,
    ("kvcr-ref", "deposit_16kib"): 2.0, ("kvcr-ref", "deliver_16kib"): 2.0,
    ("kvcr-ref", "pull_2mib"): 1.0, ("kvcr-ref", "pull_16kib_x256"): 2.0,
    ("kvcr-ref", "pull_1block"): 2.0, ("kvcr-ref", "failover_first_block"): 2.0,
    ("nixl", "pull_2mib"): 0.9, ("nixl", "pull_16kib_x256"): 0.9,
    ("mooncake-te", "pull_2mib"): 1.0, ("mooncake-te", "pull_16kib_x256"): 1.0,
}


class SideError(RuntimeError):
    """A side did not give its figure; the message says what it printed."""


def log(msg: str) -> None:
    print(f"bench anchors: {msg}", file=sys.stderr, flush=True)


# ---- interpreters ------------------------------------------------------------------

class Interpreters:
    def __init__(self, self_test: bool) -> None:
        self.self_py = os.environ.get("KVCR_SELF_PYTHON", "/usr/bin/python3")
        self.self_env = dict(os.environ)
        extra = os.environ.get("KVCR_SELF_PYTHONPATH")
        if extra:
            self.self_env["PYTHONPATH"] = extra
        self.self_env["PYTHONDONTWRITEBYTECODE"] = "1"
        probe = subprocess.run([self.self_py, "-c", "import kvcr, kvcr.config; "
                                "assert 'copy_threads' in kvcr.config.KVCRConfig."
                                "__dataclass_fields__"],
                               env=self.self_env, cwd="/", capture_output=True, timeout=60)
        if probe.returncode != 0:
            sys.exit("bench anchors: this tree's kvcr does not import with "
                     f"{self.self_py} (run scripts/install-python.sh, or set "
                     "KVCR_SELF_PYTHON / KVCR_SELF_PYTHONPATH):\n"
                     + probe.stderr.decode(errors="replace")[-2000:])
        self.anchor_py = None
        self.anchor_env = None
        self.anchor_why = "--self-test: no anchors"
        if self_test:
            return
        made = subprocess.run([os.path.join(ROOT, "scripts", "anchors-env.sh")],
                              capture_output=True, timeout=1800)
        if made.returncode != 0:
            self.anchor_why = ("scripts/anchors-env.sh failed: "
                               + made.stderr.decode(errors="replace")[-1500:])
            return
        self.anchor_py = made.stdout.decode().strip().splitlines()[-1]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        # NIXL logs at INFO on stdout, where the sides print their figures.
        env.setdefault("NIXL_LOG_LEVEL", "WARN")
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.anchor_env = env

    def side(self, who: str) -> tuple[list, dict]:
        """argv prefix and environment for a side: "kvcr" or an anchor."""
        if who in ("kvcr", "kvcr-self"):
            return [self.self_py], self.self_env
        # faulthandler: a crash in NIXL or Mooncake's native code leaves a trace.
        return [self.anchor_py, "-X", "faulthandler"], self.anchor_env


# ---- network-namespace hosts --------------------------------------------------------

class Hosts:
    """Two hosts made of named network namespaces joined by one veth pair;
    each side also gets IPC and UTS namespaces of its own (unshare), so UCX
    sees another machine and shared memory cannot carry the data."""

    NAMES = ("kvcr-anchors-h0", "kvcr-anchors-h1")
    ADDRS = ("198.19.77.1", "198.19.77.2")

    def __init__(self) -> None:
        self.why = ""

    def _ip(self, *args: str) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, timeout=30)
        if r.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {r.stderr.decode(errors='replace').strip()}")

    def make(self) -> bool:
        if os.geteuid() != 0:
            self.why = f"network namespaces need root (euid {os.geteuid()})"
            return False
        if shutil.which("ip") is None or shutil.which("unshare") is None:
            self.why = "needs `ip` (iproute2) and `unshare` (util-linux)"
            return False
        self.down()  # a run killed before its cleanup left them behind
        try:
            for n in self.NAMES:
                self._ip("netns", "add", n)
            # Made inside the first host with its peer in the second: no
            # interface of this process's namespace is created or touched.
            self._ip("-n", self.NAMES[0], "link", "add", "eth0", "type", "veth",
                     "peer", "name", "eth0", "netns", self.NAMES[1])
            for n, a in zip(self.NAMES, self.ADDRS):
                self._ip("-n", n, "link", "set", "lo", "up")
                self._ip("-n", n, "addr", "add", f"{a}/24", "dev", "eth0")
                self._ip("-n", n, "link", "set", "eth0", "up")
        except (OSError, subprocess.TimeoutExpired) as e:
            self.why = str(e)
            self.down()
            return False
        return True

    def argv(self, host: int, argv: list) -> list:
        name = self.NAMES[host]
        return ["ip", "netns", "exec", name, "unshare", "--uts", "--ipc", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', name, *argv]

    def down(self) -> None:
        for n in self.NAMES:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)


# ---- running sides -----------------------------------------------------------------

class Proc:
    """A side's process: stdout read line by line with deadlines, stderr
    kept in a file for the error message, always reaped."""

    def __init__(self, argv: list, env: dict) -> None:
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, env=env, cwd="/")
        self.buf = b""

    def stderr_tail(self, n: int = 1500) -> str:
        self.err.seek(0)
        text = self.err.read().decode(errors="replace")
        lines = [l for l in text.splitlines()
                 if "loadRemoteMD: remote agent name same as local" not in l]
        return "\n".join(lines)[-n:]

    def json_line(self, want: str, timeout: float) -> dict:
        """The next stdout line that is a JSON object holding `want` (NIXL and
        Mooncake may print log lines there too)."""
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if line.startswith(b"{"):
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(obj, dict) and want in obj:
                        return obj
            left = deadline - time.monotonic()
            if left <= 0:
                raise SideError(f"no {want!r} within {timeout:.0f} s; stderr:\n"
                                + self.stderr_tail())
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.p.wait(timeout=30)
                    raise SideError(f"exited with status {self.p.returncode} before its "
                                    f"{want!r}; stderr:\n" + self.stderr_tail())
                self.buf += chunk

    def send(self, line: str) -> None:
        try:
            self.p.stdin.write(line.encode() + b"\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def finish(self, timeout: float = 60.0) -> int:
        """Closes stdin (the sides stop on it), waits, kills past the timeout."""
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait(timeout=30)
        self.p.stdout.close()
        return rc


def script(who: str) -> str:
    name = {"nixl": "nixl_side.py", "mooncake-te": "mooncake_side.py"}.get(who, "kvcr_side.py")
    return os.path.join(SIDES, name)


def run_pull(interp: Interpreters, hosts: Hosts | None, who: str, case: str, block: int,
             count: int, rounds: int) -> dict:
    """One side of a pull case: its source, then its target, on this host or
    on netns hosts 0 (source) and 1 (target)."""
    py, env = interp.side(who)
    env = dict(env)
    addr = [Hosts.ADDRS[0], Hosts.ADDRS[1]] if hosts else ["127.0.0.1", "127.0.0.1"]
    if hosts and who == "nixl":
        # NIXL over TCP across hosts (the lane); UCX picks its own otherwise.
        env["UCX_TLS"] = "tcp"
    wrap = (lambda h, a: hosts.argv(h, a)) if hosts else (lambda h, a: a)
    src_opts = {"block": block, "count": count, "host": addr[0]}
    src = Proc(wrap(0, py + [script(who), "source", json.dumps(src_opts)]), env)
    pull = None
    try:
        hello = src.json_line({"nixl": "metadata", "mooncake-te": "peer"}.get(who, "endpoint"),
                              START_S)
        opts = {"case": case, "block": block, "count": count, "rounds": rounds,
                "host": addr[1]}
        if "endpoint" in hello:
            opts["endpoint"] = hello["endpoint"]
        pull = Proc(wrap(1, py + [script(who), "pull", json.dumps(opts)]), env)
        if "endpoint" not in hello:
            pull.send(json.dumps(hello))
        try:
            return pull.json_line("case", CASE_S)
        except SideError as e:
            raise SideError(f"{e}\nsource's stderr:\n{src.stderr_tail(800)}") from None
    finally:
        if pull is not None:
            pull.finish()
        src.send("stop")
        src.finish()


def run_failover(interp: Interpreters, who: str, case: str) -> list:
    """One side of the Guard's failover: that side's own service (ours: `kvcr
    service`, the reference's: python -m kvcr.kvcr_service, same options), an
    engine in guard mode holding 64 blocks of 16 KiB, a peer pulling one
    block at a time from it; the engine is SIGKILLed and reaped, and the
    peer times from then until a block is served again (by the Guard, on
    the engine's endpoint)."""
    py, env = interp.side(who)
    work = tempfile.mkdtemp(prefix="kvcr-anchors-fo.",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    sock = os.path.join(work, "s.sock")
    opts = ["--socket-path", sock, "--pool-dir", work, "--guard-count", "1",
            "--pool-sizes-gb", "0.002", "--compatibility-digest", "kvcr-bench-anchors"]
    if who == "kvcr":
        svc_argv = [os.environ["KVCR_TOOL"], "service", *opts, "--log-level", "warn"]
    else:
        svc_argv = py + ["-m", "kvcr.kvcr_service", *opts, "--log-level", "WARNING"]
    svc = Proc(svc_argv, env)
    engine = peer = None
    try:
        deadline = time.monotonic() + START_S
        while not os.path.exists(sock):
            if svc.p.poll() is not None or time.monotonic() > deadline:
                raise SideError("the service did not make its socket; stderr:\n"
                                + svc.stderr_tail())
            time.sleep(0.01)
        engine = Proc(py + [script(who), "engine", json.dumps(
            {"block": 16 * KIB, "count": 64, "socket": sock, "digest": "kvcr-bench-anchors"})],
            env)
        hello = engine.json_line("endpoint", START_S)
        peer = Proc(py + [script(who), "failover", json.dumps(
            {"case": case, "block": 16 * KIB, "count": 64, "endpoint": hello["endpoint"]})], env)
        peer.json_line("live", START_S)
        engine.p.kill()
        engine.p.wait(timeout=30)
        peer.send("dead")
        try:
            return [peer.json_line("case", CASE_S)]
        except SideError as e:
            raise SideError(f"{e}\nservice's stderr:\n{svc.stderr_tail(800)}") from None
    finally:
        for p in (peer, engine):
            if p is not None:
                p.finish()
        svc.p.terminate()
        svc.finish()
        shutil.rmtree(work, ignore_errors=True)


def run_bw(interp: Interpreters, who: str, case: str, block: int, count: int,
           rounds: int) -> list:
    py, env = interp.side(who)
    p = Proc(py + [script(who), "bw", json.dumps({"case": case, "block": block,
                                                  "count": count, "rounds": rounds})], env)
    try:
        return [p.json_line("case", CASE_S), p.json_line("case", CASE_S)]
    finally:
        p.finish()


# ---- the bench -----------------------------------------------------------------------

class Figures:
    """Per-run values of each (case, side), the errors of sides that failed."""

    def __init__(self) -> None:
        self.values: dict = {}
        self.units: dict = {}
        self.errors: dict = {}
        self.first: dict = {}  # case -> the side that ran first, each run

    def started(self, cases: list, order: list) -> None:
        for c in cases:
            self.first.setdefault(c, []).append(order[0])

    def add(self, who: str, row: dict) -> None:
        self.values.setdefault((row["case"], who), []).append(row["value"])
        self.units[row["case"]] = row["unit"]

    def fail(self, who: str, case: str, err: str) -> None:
        self.errors.setdefault((case, who), []).append(err)


def rotated(sides: list, r: int) -> list:
    k = r % len(sides)
    return sides[k:] + sides[:k]


def attempt(fig: Figures, who: str, cases: list, fn) -> None:
    """Runs one side; our own side failing fails the bench, an anchor's
    failure is recorded for its row."""
    try:
        for row in fn():
            fig.add(who, row)
    except SideError as e:
        if who == "kvcr":
            sys.exit(f"bench anchors: KVCR's side of {cases[0]} failed: {e}")
        log(f"{who} failed on {cases[0]}: {str(e).splitlines()[0]}")
        for c in cases:
            fig.fail(who, c, str(e))


def query_case(interp, fig, sides, runs, quick) -> None:
    """Both sides fill once (at the same time: nothing is timed then), then
    take turns, one timed repetition each per run."""
    blocks, calls = (20_000, 2_000) if quick else (1_000_000, 20_000)
    case = "query_32"
    procs = {}
    try:
        for who in sides:
            py, env = interp.side(who)
            procs[who] = Proc(py + [script(who), "query",
                                    json.dumps({"case": case, "blocks": blocks,
                                                "calls": calls})], env)
        for who in list(procs):
            try:
                procs[who].json_line("ready", FILL_S)
            except SideError as e:
                if who == "kvcr":
                    sys.exit(f"bench anchors: KVCR's side of {case} failed: {e}")
                fig.fail(who, case, str(e))
                procs.pop(who).finish()
        for r in range(runs):
            order = rotated([w for w in sides if w in procs], r)
            fig.started([case], order)
            for who in order:
                procs[who].send("run")
                attempt(fig, who, [case], lambda: [procs[who].json_line("case", CASE_S)])
    finally:
        for p in procs.values():
            p.finish()


def measure(interp: Interpreters, hosts: Hosts | None, runs: int, quick: bool,
            self_test: bool) -> Figures:
    fig = Figures()
    ours = ["kvcr"] + (["kvcr-self"] if self_test else [])
    ref = ["kvcr-ref"] if interp.anchor_py else []
    pull_anchors = ref + (["nixl"] if interp.anchor_py else [])
    x_anchors = pull_anchors + (["mooncake-te"] if interp.anchor_py else [])
    bw = [(2 * MIB, 8 if quick else 64, "2mib"), (16 * KIB, 256 if quick else 4096, "16kib")]
    pulls = [(2 * MIB, 4 if quick else 16, "pull_2mib"),
             (16 * KIB, 256, "pull_16kib_x256"), (16 * KIB, 1, "pull_1block")]
    rounds = 3 if quick else 8
    failover = "KVCR_TOOL" in os.environ and not self_test
    log(f"query at {'20 k' if quick else '1 M'} resident blocks (filling first)")
    query_case(interp, fig, ours + ref, runs, quick)
    lanes = [("host", None, pull_anchors)]
    if hosts is not None:
        lanes.append(("xhost", hosts, x_anchors))
    for r in range(runs):
        log(f"run {r + 1} of {runs}")
        for block, count, name in bw:
            cases = [f"deposit_{name}", f"deliver_{name}"]
            order = rotated(ours + ref, r)
            fig.started(cases, order)
            for who in order:
                attempt(fig, who, cases,
                        lambda: [dict(row, case=row["case"].rsplit("_", 1)[1] + "_" + name)
                                 for row in run_bw(interp, who, f"bw_{name}", block, count,
                                                   rounds)])
        for lane, h, anchors in lanes:
            for block, count, name in pulls:
                case = f"{name}_{lane}"
                n_rounds = rounds * 5 if count == 1 else rounds
                order = rotated(ours + anchors, r)
                fig.started([case], order)
                for who in order:
                    attempt(fig, who, [case],
                            lambda: [run_pull(interp, h, who, case, block, count, n_rounds)])
        if failover:
            order = rotated(ours + ref, r)
            fig.started(["failover_first_block"], order)
            for who in order:
                attempt(fig, who, ["failover_first_block"],
                        lambda: run_failover(interp, who, "failover_first_block"))
    return fig


def goal_of(baseline: str, case: str):
    for (b, prefix), g in GOALS.items():
        if b == baseline and case.startswith(prefix):
            return g
    return None


def rows(fig: Figures, baselines_of) -> list:
    """A row per case and baseline: the medians and ratio, or, when a side
    has no figure at all, why. Runs a side failed are counted in the row."""
    out = []
    cases = []
    for case, _ in fig.values:
        if case not in cases:
            cases.append(case)
    for case, _ in fig.errors:
        if case not in cases:
            cases.append(case)
    for case in cases:
        ours = fig.values.get((case, "kvcr"), [])
        unit = fig.units.get(case, "")
        for base in baselines_of(case):
            got = fig.values.get((case, base), [])
            row = {"bench": "anchors", "case": case}
            errors = fig.errors.get((case, base), [])
            if not ours or not got:
                row.update(baseline=base, status="failed" if errors else "not run",
                           why=(errors or ["no figure"])[0][-1200:])
                out.append(row)
                continue
            v, b = statistics.median(ours), statistics.median(got)
            lower_better = unit == "ns"
            ratio = (b / v) if lower_better else (v / b)
            row.update(value=round(v, 4), unit=unit, baseline=base,
                       baseline_value=round(b, 4), ratio=round(ratio, 3), runs=len(ours),
                       values=[round(x, 4) for x in ours],
                       baseline_values=[round(x, 4) for x in got],
                       first=fig.first.get(case, []))
            if errors:
                row.update(failed_runs=len(errors), why_failed=errors[0][-1200:])
            g = goal_of(base, case)
            if g is not None:
                row["goal"] = g
                row["met"] = ratio >= g
            out.append(row)
    return out


def loadavg() -> list:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def print_rows(all_rows: list, as_json: bool) -> None:
    if not as_json:
        print(f"{'case':<22} {'median':>12} {'unit':<5} {'baseline':<12} {'its median':>12} "
              f"{'ratio':>8}  goal")
    for row in all_rows:
        if as_json:
            print(json.dumps(row, separators=(",", ":")), flush=True)
            continue
        if "value" not in row:
            if row["case"] == "load":
                print(f"load averages: start {row['start']}, end {row['end']}")
            else:
                print(f"{row['case']:<22} {row['baseline']:<12} {row['status'].upper()}: "
                      f"{row['why'].splitlines()[0] if row['why'] else ''}")
            continue
        goal = row.get("goal")
        note = "" if goal is None else f"goal >= {goal}x: {'met' if row['met'] else 'MISSED'}"
        print(f"{row['case']:<22} {row['value']:>12.4g} {row['unit']:<5} "
              f"{row['baseline']:<12} {row['baseline_value']:>12.4g} {row['ratio']:>8.3f}  {note}")


def main(argv: list) -> int:
    as_json = quick = self_test = False
    runs = 3
    it = iter(argv)
    for a in it:
        if a == "--json":
            as_json = True
        elif a == "--quick":
            quick = True
        elif a == "--self-test":
            self_test = quick = True
        elif a == "--runs":
            try:
                runs = int(next(it))
            except (StopIteration, ValueError):
                runs = 0
            if not 1 <= runs <= 50:
                print("kvcr-bench anchors: --runs takes 1..50", file=sys.stderr)
                return 2
        else:
            print(f"kvcr: unknown option '{a}'\nusage: kvcr-bench anchors [--json] [--quick] "
                  "[--runs N] [--self-test]", file=sys.stderr)
            return 2
    start = loadavg()
    # A signal unwinds like an error, so that every side is reaped and the
    # namespaces are removed.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(f"bench anchors: signal {signum}"))
    interp = Interpreters(self_test)
    if interp.anchor_py is None and not self_test:
        log(f"no anchors: {interp.anchor_why}")
    hosts = Hosts()
    have_hosts = not self_test and hosts.make()
    if not have_hosts and not self_test:
        log(f"no netns hosts: {hosts.why}; no xhost cases")
    try:
        fig = measure(interp, hosts if have_hosts else None, runs, quick, self_test)
    finally:
        if have_hosts:
            hosts.down()

    def baselines_of(case: str) -> list:
        if self_test:
            return ["kvcr-self"]
        if case.startswith(("query", "deposit", "deliver", "failover")):
            return ["kvcr-ref"]
        return ["kvcr-ref", "nixl"] + (["mooncake-te"] if case.endswith("xhost") else [])

    out = [{"bench": "anchors", "case": "load", "start": start, "end": loadavg(),
            "runs": runs, "quick": quick}]
    out += rows(fig, baselines_of)
    if not self_test:
        if interp.anchor_py is None:
            out += [{"bench": "anchors", "case": "*", "baseline": b, "status": "not run",
                     "why": interp.anchor_why} for b in ("kvcr-ref", "nixl", "mooncake-te")]
        if not have_hosts:
            out.append({"bench": "anchors", "case": "*_xhost", "baseline": "*",
                        "status": "not run", "why": hosts.why})
        if "KVCR_TOOL" not in os.environ:
            out.append({"bench": "anchors", "case": "failover_first_block",
                        "baseline": "kvcr-ref", "status": "not run",
                        "why": "KVCR_TOOL (the kvcr program, for `kvcr service`) is not set: "
                               "run the driver as `kvcr-bench anchors`"})
    print_rows(out, as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
