"""kvcr-bench anchors' driver (bench/bench_anchors.py) on this package alone:
--self-test runs the quick cases with KVCR as its own baseline, so the rows'
format and the alternation are checked without any anchor installed. No
figure is judged: performance is measured, never asserted."""
import json
import os
import subprocess
import sys

import kvcr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "bench", "bench_anchors.py")
CASES = {"query_32", "deposit_2mib", "deliver_2mib", "deposit_16kib", "deliver_16kib",
         "pull_2mib_host", "pull_16kib_x256_host", "pull_1block_host"}


def test_self_test_rows_and_alternation():
    env = dict(os.environ, KVCR_SELF_PYTHON=sys.executable,
               KVCR_SELF_PYTHONPATH=os.path.dirname(os.path.dirname(kvcr.__file__)))
    run = subprocess.run([sys.executable, DRIVER, "--self-test", "--runs", "2", "--json"],
                         env=env, capture_output=True, timeout=600)
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    rows = [json.loads(line) for line in run.stdout.decode().splitlines()]
    assert rows[0]["case"] == "load" and len(rows[0]["start"]) == 3
    figures = rows[1:]
    assert {r["case"] for r in figures} == CASES
    for r in figures:
        assert r["bench"] == "anchors" and r["baseline"] == "kvcr-self"
        assert r["unit"] in ("ns", "GB/s")
        assert r["runs"] == 2 and len(r["values"]) == 2 and len(r["baseline_values"]) == 2
        assert r["value"] > 0 and r["baseline_value"] > 0
        want = (r["baseline_value"] / r["value"] if r["unit"] == "ns"
                else r["value"] / r["baseline_value"])
        assert abs(r["ratio"] - want) <= 0.01 * want + 0.001
        assert r["first"] == ["kvcr", "kvcr-self"]  # the order turns each run


def test_bad_options_are_refused():
    for args in (["--runs", "0"], ["--runs"], ["--frobnicate"]):
        run = subprocess.run([sys.executable, DRIVER, *args], capture_output=True, timeout=60)
        assert run.returncode == 2, args
