"""Both Prometheus texts as Prometheus tools see them.

The library's text (KVCR.prometheus_text()) and the service's, scraped from a
real `kvcr service --metrics-listen 127.0.0.1:0` with urllib as a Prometheus
server would, pass `promtool check metrics` without a remark (those tests
skip, saying why, only when promtool is absent; scripts/setup.sh installs it).
The HTTP listener answers 200 with the exposition content type, 404 for
another path, 405 (with Allow) for another method, 400 for a malformed
request, and goes on serving after each; every answer is counted in
kvcr_service_http_requests_total{code}.

The `kvcr` binary is found as in test_guard_service.py. Every wait is
bounded."""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from test_guard_service import NO_TOOL, TOOL

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus, which "
                             "scripts/setup.sh installs)")
START_SECONDS = 10.0
HTTP_SECONDS = 10.0
CONTENT_TYPE = "text/plain; version=0.0.4"


def promtool_report(text: str) -> str:
    """What `promtool check metrics` says about text ("" when nothing),
    with its exit status when that is not 0."""
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)
    report = out.stdout + out.stderr
    return report if out.returncode == 0 else f"exit {out.returncode}: {report}"


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line[len(name) + 1:])
    raise AssertionError(f"{name} is not in:\n{text}")


class MetricsService:
    """`kvcr service` with --metrics-listen 127.0.0.1:0; url is its /metrics."""

    def __init__(self, tool: str):
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp"
        self.dir = Path(os.path.realpath(tempfile.mkdtemp(prefix="kvcr-pytest-prom-", dir=base)))
        self.log_path = self.dir / "service.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [tool, "service", "--socket-path", str(self.dir / "claim.sock"), "--pool-dir",
             str(self.dir), "--guard-count", "2", "--pool-sizes-gb", "0.03125",
             "--compatibility-digest", "py-prom", "--journal-mb", "4", "--log-level", "info",
             "--metrics-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while (m := re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)",
                              self.log())) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.proc.kill()
                self.proc.wait(timeout=START_SECONDS)
                self._log.close()
                shutil.rmtree(self.dir, ignore_errors=True)
                raise AssertionError(f"{tool}: no metrics listener (exit {self.proc.returncode})"
                                     f":\n{log}")
            time.sleep(0.02)
        self.url = m.group(1)
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def get(self, url=None, **kw):
        """(status, headers, body) of a request; error statuses included."""
        req = urllib.request.Request(url or self.url, **kw)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_SECONDS) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def raw(self, request: bytes) -> bytes:
        """The whole answer to request bytes sent as they are."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=HTTP_SECONDS) as s:
            s.sendall(request)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=START_SECONDS)
        log = self.log()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        assert rc == 0, f"kvcr service exited with {rc}:\n{log}"


@pytest.fixture
def service():
    if TOOL is None:
        pytest.skip(NO_TOOL or "")
    s = MetricsService(TOOL)
    yield s
    s.stop()


def test_a_scrape_gets_the_metrics(service):
    status, headers, body = service.get()
    assert status == 200
    assert headers["Content-Type"] == CONTENT_TYPE
    assert headers["Connection"] == "close"
    assert metric(body, "kvcr_service_up") == 1
    assert metric(body, 'kvcr_guard_phase{guard="1",phase="idle"}') == 1
    assert "# TYPE kvcr_guard_claims_total counter\n" in body
    # The same families as `kvcr stats` on the claim socket.
    stats = subprocess.run([TOOL, "stats", "--socket", str(service.dir / "claim.sock")],
                           capture_output=True, text=True, timeout=10, check=True).stdout
    families = lambda t: [l for l in t.splitlines() if l.startswith("# ")]  # noqa: E731
    assert families(stats) == families(body)


def test_other_paths_methods_and_malformed_requests(service):
    status, _, _ = service.get(service.url.replace("/metrics", "/"))
    assert status == 404
    status, headers, _ = service.get(method="POST", data=b"x=1")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert service.raw(b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert service.raw(b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")  # no Host
    status, _, body = service.get()  # the service goes on
    assert status == 200
    for code, n in (("200", 0), ("404", 1), ("405", 1), ("400", 2)):
        assert metric(body, f'kvcr_service_http_requests_total{{code="{code}"}}') == n
    assert service.log().count("malformed request") == 1  # at most one line a minute


@needs_promtool
def test_the_scraped_text_passes_promtool(service):
    service.raw(b"NONSENSE\r\n\r\n")  # a non-zero count among the others
    status, _, body = service.get()
    assert status == 200
    assert promtool_report(body) == ""


@needs_promtool
def test_prometheus_text_passes_promtool(rig_factory):
    r = rig_factory(telemetry=True)
    r.put(0, 1)
    r.wait(r.kv.deposit({b"a": r.ref(0)}))
    r.wait(r.kv.deliver({b"a": r.ref(1), b"missing": r.ref(2)}))
    text = r.kv.prometheus_text()
    assert 'kvcr_transfer_blocks_total{operation="local_fill"} 1\n' in text
    assert "# TYPE kvcr_duration_seconds histogram\n" in text
    assert promtool_report(text) == ""
