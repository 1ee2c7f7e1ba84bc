"""Plays the Rust driver's part of clients/SCENARIO.md against
scenario_runner.py and the real server: stop, freeze, kill, restart,
rewrite the rules, and assert the table."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from conftest import poll
from floodgate_client import Client

HERE = os.path.dirname(os.path.abspath(__file__))
RULES_FILE = os.path.join(HERE, "..", "..", "scenario-rules.yaml")
RUNNER = os.path.join(HERE, "scenario_runner.py")
T1 = {"tenant": "t1"}


class Runner:
    def __init__(self, url: str, mode: str):
        self.proc = subprocess.Popen(
            [sys.executable, RUNNER, "--target", url, "--fail-mode", mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: "queue.Queue[str]" = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        assert self.answer(30) == {"ready": True}

    @staticmethod
    def _read(stream, put):
        for line in stream:
            put(line)

    def answer(self, timeout=30.0) -> dict:
        try:
            return json.loads(self.lines.get(timeout=timeout))
        except queue.Empty:
            raise AssertionError("the runner did not answer; stderr:\n" + "".join(self.stderr)) from None

    def send(self, cmd: dict, timeout=30.0) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def quit(self) -> int:
        self.proc.stdin.write('{"op": "quit"}\n')
        self.proc.stdin.flush()
        return self.proc.wait(10)


def counts(allowed, denied, server, local):
    return {"allowed": allowed, "denied": denied, "errors": 0, "server": server, "local": local}


# What steps 3, 4 and 5 (server gone) answer in each mode. SCENARIO.md's
# table is the `local` one; in open and closed modes step 5 cannot be "4
# allowed, 2 denied": failing open admits all 6 (no permit, no local
# concurrency limit) and failing closed denies all 6.
WITHOUT_SERVER = {
    "local": (counts(3, 0, 0, 3), counts(2, 8, 0, 10), counts(4, 2, 0, 6)),
    "open": (counts(3, 0, 0, 3), counts(10, 0, 0, 10), counts(6, 0, 0, 6)),
    "closed": (counts(0, 3, 0, 3), counts(0, 10, 0, 10), counts(0, 6, 0, 6)),
}


@pytest.mark.parametrize("mode", ["local", "open", "closed"])
def test_the_shared_scenario(make_server, mode):
    with open(RULES_FILE) as f:
        rules = f.read()
    server = make_server(rules)
    runner = Runner(server.url, mode)
    step3, step4, step5 = WITHOUT_SERVER[mode]
    try:
        # 1: up.
        assert runner.send({"op": "acquire", "resource": "scenario.api", "descriptors": T1, "count": 15}) == counts(15, 0, 15, 0)
        # 2: up; 4 of max_in_flight 4, then released.
        assert runner.send({"op": "hold", "resource": "scenario.pool", "count": 6}) == counts(4, 2, 6, 0)
        assert runner.send({"op": "release"}) == {"released": 4}
        # 3: frozen: decided by the client, each within 1 s.
        server.freeze()
        start = time.monotonic()
        assert runner.send({"op": "acquire", "resource": "scenario.api", "descriptors": T1, "count": 3}) == step3
        assert time.monotonic() - start < 3.0, "3 calls, each within 1 s"
        # 4: killed.
        server.kill()
        assert runner.send({"op": "acquire", "resource": "scenario.api", "descriptors": T1, "count": 10}) == step4
        # 5: killed; hold the pool then release.
        assert runner.send({"op": "hold", "resource": "scenario.pool", "count": 6}) == step5
        assert runner.send({"op": "release"}) == {"released": step5["allowed"] if mode == "local" else 0}
        # 6: restarted (memory only: the counts start over), waited for.
        server.start()
        assert runner.send({"op": "wait_server", "timeout_ms": 15000}) == {"server": True}
        assert runner.send({"op": "acquire", "resource": "scenario.api", "descriptors": T1, "count": 25}) == counts(20, 5, 25, 0)
        # 7: the limit lowered to 10; the reload seen on a key nobody uses.
        server.write_rules(rules.replace("limit: 20,", "limit: 10,"))
        probe = Client(server.url, timeout=2.0)
        poll(lambda: probe.acquire("scenario.api", {"tenant": "reload-probe"}, dry_run=True).limits[0].limit == 10,
             what="the reload")
        probe.close()
        assert runner.send({"op": "acquire", "resource": "scenario.api", "descriptors": {"tenant": "t2"}, "count": 15}) == counts(10, 5, 15, 0)
        assert runner.quit() == 0
    finally:
        if runner.proc.poll() is None:
            runner.proc.kill()
        server.thaw() if server.proc.poll() is None else None
