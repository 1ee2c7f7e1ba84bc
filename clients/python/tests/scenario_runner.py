#!/usr/bin/env python3
"""The Python client's runner of the shared scenario (clients/SCENARIO.md).

    python scenario_runner.py --target http://127.0.0.1:PORT --fail-mode open|closed|local

Reads one JSON command a line on stdin, answers one JSON object a line on
stdout; anything else goes to stderr. In every mode the deadline per call is
250 ms; in `local` mode the share of the last known limits is 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

try:
    import floodgate_client  # noqa: F401
except ImportError:  # run from the source tree without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from floodgate_client import Client, FailMode, Outcome, Source

DEADLINE = 0.25
PROBE = "scenario.probe"


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


class Runner:
    def __init__(self, target: str, mode: str):
        fail_mode = FailMode.local(1.0) if mode == "local" else FailMode.of(mode)
        self.client = Client(target, fail_mode=fail_mode, timeout=DEADLINE)
        self.held = []

    def acquire(self, cmd, hold: bool) -> dict:
        counts = {"allowed": 0, "denied": 0, "errors": 0, "server": 0, "local": 0}
        resource = cmd["resource"]
        descriptors = cmd.get("descriptors") or {}
        for _ in range(int(cmd.get("count", 1))):
            try:
                d = self.client.acquire(resource, descriptors, cost=1)
            except Exception as e:  # a client in any fail mode answers: this should stay 0
                counts["errors"] += 1
                log("acquire %s raised %r" % (resource, e))
                continue
            counts["server" if d.source is Source.SERVER else "local"] += 1
            counts["allowed" if d.allowed else "denied"] += 1
            if d.permit is not None:
                if hold:
                    self.held.append(d.permit)
                else:
                    d.permit.report(Outcome.SUCCESS)
        return counts

    def release(self) -> dict:
        held, self.held = self.held, []
        for p in held:
            p.report(Outcome.SUCCESS)
        # The reports leave at once (they hold slots); wait until they are in,
        # briefly when no server answers.
        self.client.flush(timeout=2.0)
        return {"released": len(held)}

    def wait_server(self, cmd) -> dict:
        deadline = time.monotonic() + int(cmd.get("timeout_ms", 5000)) / 1000.0
        while True:
            try:
                if self.client.acquire(PROBE).source is Source.SERVER:
                    return {"server": True}
            except Exception as e:
                log("wait_server: %r" % (e,))
            if time.monotonic() >= deadline:
                return {"server": False}
            time.sleep(0.02)

    def handle(self, cmd) -> dict:
        op = cmd.get("op")
        if op == "acquire":
            return self.acquire(cmd, hold=False)
        if op == "hold":
            return self.acquire(cmd, hold=True)
        if op == "release":
            return self.release()
        if op == "wait_server":
            return self.wait_server(cmd)
        raise ValueError("unknown op %r" % (op,))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--fail-mode", required=True, choices=["open", "closed", "local"])
    args = parser.parse_args(argv)
    runner = Runner(args.target, args.fail_mode)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
        except ValueError as e:
            log("not JSON: %r (%s)" % (line, e))
            print(json.dumps({"error": "not JSON"}), flush=True)
            continue
        if cmd.get("op") == "quit":
            break
        try:
            answer = runner.handle(cmd)
        except Exception as e:
            log(traceback.format_exc())
            answer = {"error": str(e)}
        print(json.dumps(answer), flush=True)
    runner.client.close(timeout=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
