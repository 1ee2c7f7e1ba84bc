"""Ask Floodgate before a call, report after, watch breakers: Python, grpcio.

Stubs are generated from the repository's proto/ (nothing is vendored):

    python -m grpc_tools.protoc -I proto --python_out=gen --pyi_out=gen \
        --grpc_python_out=gen proto/floodgate/v1/floodgate.proto
    PYTHONPATH=gen python examples/python/floodgate_example.py --server 127.0.0.1:50051

It runs a short scenario against the server and prints one JSON object of
what it saw (the test suite asserts on it). The `Floodgate` class is the part
to copy: ask with a deadline, fail open or closed when the server is gone,
report the outcome of every call that got a permit.
"""

import argparse
import json
import queue
import threading
import time

import grpc

# Our stubs and Envoy's (grpc's xds-protos) live side by side in one process:
# no file of ours shares a name with one of Envoy's.
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from floodgate.v1 import floodgate_pb2 as pb
from floodgate.v1 import floodgate_pb2_grpc as pb_grpc

# Retry an Acquire the server never saw (UNAVAILABLE) once, within the deadline.
SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "floodgate.v1.Floodgate", "method": "Acquire"}],
        "retryPolicy": {
            "maxAttempts": 2,
            "initialBackoff": "0.01s",
            "maxBackoff": "0.05s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
})


class Denied(Exception):
    """The call was not made: a verdict other than ALLOWED, or no server and fail closed."""

    def __init__(self, verdict, retry_after, reason):
        super().__init__(reason)
        self.verdict = verdict
        self.retry_after = retry_after


def seconds(d):
    return d.seconds + d.nanos / 1e9


class Floodgate:
    def __init__(self, target, fail_open=True, deadline=0.25):
        self.channel = grpc.insecure_channel(target, options=[("grpc.service_config", SERVICE_CONFIG)])
        self.stub = pb_grpc.FloodgateStub(self.channel)
        self.fail_open = fail_open
        self.deadline = deadline
        self.last_permit = ""

    def acquire(self, resource, cost=1, **descriptors):
        """The decision, or None when the server did not answer in time."""
        request = pb.AcquireRequest(resource=resource, descriptors=descriptors, cost=cost)
        try:
            return self.stub.Acquire(request, timeout=self.deadline)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise  # our bug (the message names the field): retrying cannot help
            return None  # UNAVAILABLE, DEADLINE_EXCEEDED...: the fail mode decides

    def report(self, resource, permit_id, outcome):
        """Best effort: an unreported permit expires on the server by itself."""
        if not permit_id:
            return
        request = pb.ReportOutcomeRequest(resource=resource, permit_id=permit_id, outcome=outcome)
        try:
            self.stub.ReportOutcome(request, timeout=self.deadline)
        except grpc.RpcError:
            pass

    def call(self, resource, fn, cost=1, **descriptors):
        """Ask, run `fn` if allowed, report how it went."""
        d = self.acquire(resource, cost, **descriptors)
        if d is None:
            if self.fail_open:
                return fn()
            raise Denied("UNAVAILABLE", 1.0, "floodgate did not answer; failing closed")
        if d.verdict != pb.VERDICT_ALLOWED:
            name = pb.Verdict.Name(d.verdict).removeprefix("VERDICT_")
            raise Denied(name, seconds(d.retry_after), d.reason)
        self.last_permit = d.permit_id
        if seconds(d.wait) > 0:
            time.sleep(seconds(d.wait))  # shaping: proceed after the wait
        try:
            result = fn()
        except Exception:
            self.report(resource, d.permit_id, pb.OUTCOME_FAILURE)
            raise
        self.report(resource, d.permit_id, pb.OUTCOME_SUCCESS)
        return result

    def watch(self, events, resources=()):
        """Feeds WatchEvents into `events` until the channel closes."""
        try:
            for event in self.stub.Watch(pb.WatchRequest(resources=list(resources))):
                events.put(event)
        except grpc.RpcError:
            pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--dead", default="127.0.0.1:9", help="an address where nothing listens")
    args = parser.parse_args()
    fg = Floodgate(args.server)
    seen = {}

    # A keyed limit: three calls per user, then RATE_LIMITED with a retry time.
    verdicts = []
    for _ in range(4):
        try:
            fg.call("py.items", lambda: "rows", user="u1")
            verdicts.append("ALLOWED")
        except Denied as e:
            verdicts.append(e.verdict)
            seen["retry_after_s"] = e.retry_after
    seen["items"] = verdicts

    # A breaker, watched: failures open it, the stream says so.
    events = queue.Queue()
    threading.Thread(target=fg.watch, args=(events, ["py.db"]), daemon=True).start()
    first = events.get(timeout=5)
    seen["first_event"] = first.WhichOneof("event")
    permits, db = [], []

    def failing():
        raise IOError("db down")

    for _ in range(6):
        try:
            fg.call("py.db", failing)
        except Denied as e:
            db.append(e.verdict)
        except IOError:
            db.append("FAILED")
            permits.append(fg.last_permit)
    seen["db"] = db
    seen["permits"] = len(set(p for p in permits if p))
    deadline = time.time() + 5
    while time.time() < deadline:
        e = events.get(timeout=max(0.01, deadline - time.time()))
        if e.WhichOneof("event") == "breaker":
            seen["transition"] = [
                e.breaker.resource,
                pb.BreakerState.Name(e.breaker.from_state),
                pb.BreakerState.Name(e.breaker.to_state),
            ]
            break

    # Envoy's API through grpc's xds-protos stubs, in the same process.
    rls = rls_pb2_grpc.RateLimitServiceStub(fg.channel)
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value="u9")])
    codes = []
    for _ in range(4):
        r = rls.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="py.items", descriptors=[descriptor]), timeout=1)
        codes.append(rls_pb2.RateLimitResponse.Code.Name(r.overall_code))
    seen["rls"] = codes

    # Bad input is an error naming the field, never a denial.
    try:
        fg.acquire("")
    except grpc.RpcError as e:
        seen["bad_input"] = [e.code().name, e.details()]

    # No server: fail open runs the call, fail closed does not.
    gone_open = Floodgate(args.dead, fail_open=True, deadline=0.2)
    gone_closed = Floodgate(args.dead, fail_open=False, deadline=0.2)
    seen["fail_open"] = gone_open.call("py.items", lambda: "ran", user="u1")
    try:
        gone_closed.call("py.items", lambda: "ran", user="u1")
        seen["fail_closed"] = "ran"
    except Denied as e:
        seen["fail_closed"] = e.verdict

    print(json.dumps(seen))


if __name__ == "__main__":
    main()
