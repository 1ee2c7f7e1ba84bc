"""Fixtures: the real floodgate binary ($FLOODGATE_BIN) on free loopback ports."""

from __future__ import annotations

import os
import http.client
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from typing import Callable, List, Optional

import pytest

# The server binary: $FLOODGATE_BIN, else the repository's debug build.
BIN = os.environ.get(
    "FLOODGATE_BIN",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "target", "debug", "floodgate"),
)

RULES = """
resources:
  - name: t.api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 5, window: 1h }
  - name: t.pool
    concurrency: { max_in_flight: 2 }
  - name: t.db
    breaker:
      failure_rate_threshold: 0.5
      minimum_calls: 4
      window: { kind: count, size: 10 }
      wait_in_open: 60s
  - name: t.tolerant
    breaker:
      failure_rate_threshold: 0.5
      minimum_calls: 4
      window: { kind: count, size: 10 }
      wait_in_open: 60s
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poll(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Calls `check` until it returns something truthy; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError("%s not reached within %.1fs (last: %r)" % (what, timeout, last))
        time.sleep(interval)


class Server:
    """One floodgate process; stop, kill, freeze, thaw and restart it on the same ports."""

    def __init__(self, rules: str, workdir: str, extra: Optional[List[str]] = None, scheme: str = "http",
                 client_cert=None):
        self.workdir = workdir
        self.rules_path = os.path.join(workdir, "rules.yaml")
        self.write_rules(rules)
        self.port = free_port()
        self.http_port = free_port()
        self.extra = list(extra or [])
        self.scheme = scheme
        #: (cert, key) files for /readyz when the server requires mTLS.
        self.client_cert = client_cert
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = os.path.join(workdir, "server.log")
        self.start()

    @property
    def url(self) -> str:
        return "%s://127.0.0.1:%d" % (self.scheme, self.port)

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.port

    def write_rules(self, text: str) -> None:
        tmp = self.rules_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.rules_path)

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", self.address, "--http-listen", "127.0.0.1:%d" % self.http_port,
             "--config", self.rules_path, "--reload-debounce", "100ms", "--shutdown-grace", "1s"] + self.extra,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        try:
            poll(self._ready, timeout=30, interval=0.05, what="floodgate /readyz")
        except BaseException:
            self.kill()  # never leave a server behind that no fixture will stop
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError("floodgate exited with %s:\n%s" % (self.proc.returncode, self.log()))
        # With TLS the HTTP port speaks TLS too (the test CA is not checked here).
        context = ssl._create_unverified_context() if self.scheme == "https" else None
        if context is not None and self.client_cert:
            context.load_cert_chain(*self.client_cert)
        try:
            with urllib.request.urlopen(
                "%s://127.0.0.1:%d/readyz" % (self.scheme, self.http_port), timeout=1, context=context
            ) as r:
                return r.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def freeze(self) -> None:
        """SIGSTOP, and wait until every thread is stopped (a signal is
        delivered asynchronously: a thread may still answer meanwhile)."""
        self.signal(signal.SIGSTOP)
        poll(self._stopped, timeout=5, interval=0.005, what="every thread stopped")

    def _stopped(self) -> bool:
        task = "/proc/%d/task" % self.proc.pid
        try:
            states = []
            for tid in os.listdir(task):
                with open("%s/%s/stat" % (task, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return False
        return bool(states) and all(s in ("T", "t") for s in states)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL (works on a frozen process too), and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.signal(signal.SIGCONT)
                self.signal(signal.SIGTERM)
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def make_server(tmp_path):
    servers: List[Server] = []

    def make(rules: str = RULES, extra: Optional[List[str]] = None, scheme: str = "http", client_cert=None) -> Server:
        d = tempfile.mkdtemp(dir=str(tmp_path))
        s = Server(rules, d, extra, scheme, client_cert)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the tests of a module that never stop it (each uses keys of its own)."""
    s = Server(RULES, str(tmp_path_factory.mktemp("shared")))
    yield s
    s.stop()


@pytest.fixture
def server(make_server):
    """A server of this test's own: it may be killed, frozen or restarted."""
    return make_server()


_unique = [0]


@pytest.fixture
def tenant(request) -> str:
    """A tenant no other test uses."""
    _unique[0] += 1
    return "%s-%d" % (request.node.name[:40], _unique[0])
