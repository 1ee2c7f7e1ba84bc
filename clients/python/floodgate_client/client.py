"""The synchronous client (grpcio's blocking stubs; safe to share between threads)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from . import _core
from ._breaker import ServerBreaker
from ._core import Core, Tls, give_back, report_request
from ._guard import NO_FALLBACK, Classifier, Guard, guarded, make_request
from ._metered import Metered
from ._model import Acquire, Decision, FailMode, Limit, Outcome, Priority, ReportResult, breaker_state, usage_of
from ._permit import Permit, Seconds, as_seconds
from ._proto import floodgate_pb2 as pb
from ._proto import floodgate_pb2_grpc as pb_grpc
from .errors import FloodgateError, InvalidArgument, ProtocolError, ServerError, Unavailable

log = logging.getLogger("floodgate_client")

_FLUSH = object()
_STOP = object()


class _ThreadReporter:
    """Outcome reports, batched on a thread of their own: reporting never
    blocks or fails the caller. A batch leaves when full, or at most
    `interval` after its first report; a report that frees a concurrency slot
    or decides a half-open probe leaves at once, with whatever is queued."""

    def __init__(self, stub, metadata, batch: int, interval: float, counts):
        self._stub = stub
        self._metadata = metadata
        self._batch = batch
        self._interval = interval
        self._counts = counts
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=_core.REPORT_QUEUE)
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._closed = False

    def send_report(
        self, permit: Permit, outcome: Outcome, latency: float, actual_cost: Optional[int], usage=None
    ) -> None:
        self._put((report_request(permit, outcome, latency, actual_cost, usage), permit.urgent))

    def _put(self, item) -> bool:
        with self._lock:
            if self._closed:
                self._counts["reports_dropped"] += 1
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="floodgate-reporter", daemon=True)
                self._thread.start()
        try:
            self._q.put_nowait(item)
            return True
        except queue.Full:
            self._counts["reports_dropped"] += 1
            return False

    def flush(self, timeout: Optional[float]) -> bool:
        with self._lock:
            if self._thread is None:
                return True
        done = threading.Event()
        if not self._put((_FLUSH, done)):
            return False
        return done.wait(timeout)

    def close(self, timeout: float) -> None:
        with self._lock:
            thread, self._closed = self._thread, True
        if thread is not None:
            self._q.put((_STOP, None))
            thread.join(timeout)

    def _run(self) -> None:
        batch: List[Any] = []
        due: Optional[float] = None
        while True:
            try:
                if due is None:
                    item = self._q.get()
                else:
                    item = self._q.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                self._deliver(batch)
                due = None
                continue
            first, second = item
            if first is _STOP:
                self._deliver(batch)
                return
            if first is _FLUSH:
                self._deliver(batch)
                due = None
                second.set()
                continue
            if not batch:
                due = time.monotonic() + self._interval
            batch.append(first)
            if second or len(batch) >= self._batch:
                self._deliver(batch)
                due = None

    def _deliver(self, batch: List[Any]) -> None:
        """Sends a batch, trying twice; a batch the server cannot take is
        dropped (its permits expire on the server, so nothing leaks)."""
        if not batch:
            return
        reports = list(batch)
        batch.clear()
        for attempt in range(2):
            try:
                r = self._stub.ReportOutcomeBatch(
                    pb.ReportOutcomeBatchRequest(reports=reports),
                    timeout=_core.REPORT_TIMEOUT,
                    metadata=self._metadata,
                )
                counted = sum(1 for x in r.responses if x.counted)
                self._counts["reports_counted"] += counted
                self._counts["reports_not_counted"] += len(reports) - counted
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    log.warning("Floodgate refused a batch of reports: %s", e.details())
                    break
                if attempt == 0:
                    time.sleep(0.05)
            except ValueError:  # the channel was closed
                break
        self._counts["reports_dropped"] += len(reports)


def _wait_for_polling_to_stop(channel, limit: float = 0.5) -> None:
    """Waits (at most `limit` seconds) for grpc's connectivity thread, which
    `channel_ready_future` started, to notice it was cancelled. That thread
    wakes every 0.2 s; closing the channel before it stopped makes it print
    "Cannot monitor channel state: Channel closed!" from a thread of its
    own. The state it keeps is not public API: without it, nothing waits."""
    state = getattr(channel, "_connectivity_state", None)
    if state is None or not hasattr(state, "polling"):
        return
    end = time.monotonic() + limit
    while getattr(state, "polling", False) and time.monotonic() < end:
        time.sleep(0.01)


class _Endpoint:
    def __init__(self, core: Core, ep: _core.Endpoint, channel_options):
        creds = core.credentials(ep)
        if creds is None:
            self.channel = grpc.insecure_channel(ep.target, options=channel_options)
        else:
            self.channel = grpc.secure_channel(ep.target, creds, options=channel_options)
        self.url = ep.url
        self.stub = pb_grpc.FloodgateStub(self.channel)
        self.breaker = ServerBreaker(ep.url)
        self.reporter = _ThreadReporter(self.stub, core.metadata, core.report_batch, core.report_interval, core.counts)
        # Start connecting now, so the first acquire need not wait for it.
        self.ready = grpc.channel_ready_future(self.channel)


class Client:
    """A Floodgate client: ask before calling, report after.

    >>> client = Client("http://127.0.0.1:50051", fail_mode="local:0.5")
    >>> d = client.acquire("payments", {"tenant": "acme"})
    >>> if d.allowed: ...

    `target` is one endpoint (`host:port`, `http://host:port`,
    `https://host:port`) or a list tried in order (failover; reports go to the
    server that issued the permit). `timeout` is the longest an acquire waits
    for the servers before the fail mode answers (default 25 ms, as the Rust
    crate). `tls` (a Tls) sets the CA and a client certificate; `token` sends
    `authorization: Bearer TOKEN` with every call. `cancelled_as` is what a
    permit never reported reports (default: FAILURE on a resource with a
    breaker, IGNORED otherwise).
    """

    _is_async = False

    def __init__(
        self,
        target: Union[str, Sequence[str]],
        *,
        fail_mode: Union[FailMode, str] = FailMode.OPEN,
        timeout: Seconds = _core.DEFAULT_TIMEOUT,
        tls: Optional[Tls] = None,
        token: Optional[str] = None,
        metadata: Optional[Iterable[Tuple[str, str]]] = None,
        fail_closed_retry_after: Seconds = 1.0,
        cancelled_as: Optional[Union[Outcome, str]] = None,
        report_batch: int = 100,
        report_interval: Seconds = 0.01,
        channel_options: Optional[Sequence[Tuple[str, Any]]] = None,
    ):
        self._core = Core(
            target, fail_mode, timeout, tls, token, metadata,
            fail_closed_retry_after, cancelled_as, report_batch, report_interval,
        )
        options = _core.channel_options(tls, channel_options)
        self._endpoints = [_Endpoint(self._core, ep, options) for ep in self._core.endpoints]
        self._close_lock = threading.Lock()

    # --- asking ---

    def acquire(
        self,
        resource: str,
        descriptors: Optional[Mapping[str, str]] = None,
        cost: int = 1,
        priority: Optional[Union[Priority, str]] = None,
        dry_run: bool = False,
        timeout: Optional[Seconds] = None,
        *,
        settle: bool = False,
        usage: Optional[Mapping[str, int]] = None,
    ) -> Decision:
        """May I? A denial is a Decision, not an error. An unreachable server
        gives the fail mode's decision within the timeout. The only error is
        bad input (InvalidArgument)."""
        return self._acquire(make_request(resource, descriptors, cost, priority, dry_run, settle, usage), timeout)

    def _acquire(self, req: Acquire, timeout: Optional[Seconds]) -> Decision:
        self._check_open()
        proto = req.to_proto()

        def orphan(i: int, r) -> None:
            give_back(r, req.resource, req.settle, i, self._endpoints[i].reporter)

        asked = self._ask("Acquire", proto, self._timeout(timeout), req.fields(), orphan)
        if asked is None:
            return self._core.without_server(req)
        i, r = asked
        return self._core.decision(r, req, i, self._endpoints[i].reporter)

    def acquire_batch(
        self, requests: Iterable[Union[Acquire, str, Mapping[str, Any]]], timeout: Optional[Seconds] = None
    ) -> List[Decision]:
        """Many questions in one round trip (AcquireBatch, 1000 at a time),
        answered in order. A batch the server refuses (one bad item) raises
        InvalidArgument naming the item (`requests[3].resource`)."""
        self._check_open()
        reqs = [_core.acquire_of(r) for r in requests]
        protos = [r.to_proto() for r in reqs]
        out: List[Decision] = []
        for start in range(0, len(reqs), 1000):
            chunk, chunk_protos = reqs[start:start + 1000], protos[start:start + 1000]

            def orphan(i: int, r, chunk=chunk) -> None:
                for response, req in zip(r.responses, chunk):
                    give_back(response, req.resource, req.settle, i, self._endpoints[i].reporter)

            asked = self._ask(
                "AcquireBatch", pb.AcquireBatchRequest(requests=chunk_protos), self._timeout(timeout), {}, orphan
            )
            if asked is None:
                out.extend(self._core.without_server(r) for r in chunk)
                continue
            i, r = asked
            if len(r.responses) != len(chunk):
                raise ProtocolError("%d questions in a batch got %d answers" % (len(chunk), len(r.responses)))
            out.extend(self._core.decision(x, req, i, self._endpoints[i].reporter) for x, req in zip(r.responses, chunk))
        return out

    def _timeout(self, timeout: Optional[Seconds]) -> float:
        t = as_seconds(timeout, "timeout")
        return self._core.timeout if t is None else t

    def _ask(self, method: str, request, timeout: float, sent: Mapping[str, Any], orphan: Optional[Callable]):
        """Tries each server in turn within `timeout`: (endpoint, answer), or
        None when none answered. An answer that comes after the caller stopped
        waiting goes to `orphan`."""
        core = self._core
        deadline = time.monotonic() + timeout
        for i, ep in enumerate(self._endpoints):
            attempt = ep.breaker.attempt()
            if attempt is None:
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                attempt.failure("no time left within the request timeout")
                continue
            core.counts["rpcs"] += 1
            call = getattr(ep.stub, method).future(
                request, timeout=left + _core.ORPHAN_GRACE, metadata=core.metadata
            )
            try:
                response = call.result(timeout=left)
            except grpc.FutureTimeoutError:
                attempt.failure("no answer within the request timeout")
                if orphan is not None:
                    call.add_done_callback(lambda c, i=i: _late(c, i, orphan))
                else:
                    call.cancel()
                continue
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    attempt.success()
                    raise InvalidArgument.from_message(e.details() or "", sent) from None
                if code in _core.UNREACHABLE:
                    attempt.failure(e.details() or code.name)
                else:
                    # It answered, but not a decision: as good as no answer.
                    attempt.success()
                    core.counts["server_errors"] += 1
                    log.warning("Floodgate answered %s (%s); trying without it", code.name, e.details())
                continue
            except BaseException:
                attempt.abandon()
                call.cancel()
                raise
            attempt.success()
            return i, response
        return None

    # --- charging ---

    def charge(
        self,
        resource: str,
        descriptors: Optional[Mapping[str, str]] = None,
        cost: int = 1,
        timeout: Optional[Seconds] = None,
        *,
        usage: Optional[Mapping[str, int]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Tuple[Limit, ...]:
        """Takes `cost` from every limit the request matches, with no
        question first: beyond a limit if need be (a debt later callers wait
        out). Returns the limits after it (`exceeded` when used up). Raises
        InvalidArgument for bad input, Unavailable when no server answered."""
        self._check_open()
        request = _core.charge_request(resource, descriptors, cost, usage, idempotency_key)
        sent = {"resource": resource, "cost": cost, "usage": usage}
        asked = self._ask("Charge", request, self._timeout(timeout), sent, None)
        if asked is None:
            raise Unavailable("no Floodgate server answered the charge")
        return tuple(Limit.from_proto(l) for l in asked[1].limits)

    def meter(
        self,
        resource: str,
        descriptors: Optional[Mapping[str, str]] = None,
        estimate: int = 1,
        timeout: Optional[Seconds] = None,
    ) -> Metered:
        """Starts a metered call: reserves `estimate` (an acquire with
        settle=True). Count each chunk's units with `add`, which charges
        what goes beyond the estimate and returns False when a budget ran
        out; leave the `with` block (or call `finish`) to settle. Check
        `admitted` first: a denied start has `decision` with its retry_after."""
        decision = self.acquire(resource, descriptors, estimate, timeout=timeout, settle=True)
        return Metered(self, resource, descriptors, estimate, decision)

    # --- reporting ---

    def report(
        self,
        permit: Union[Permit, str],
        outcome: Union[Outcome, str] = Outcome.SUCCESS,
        *,
        resource: str = "",
        latency: Optional[Seconds] = None,
        actual_cost: Optional[int] = None,
        usage: Optional[Mapping[str, int]] = None,
        timeout: Seconds = _core.REPORT_TIMEOUT,
    ) -> ReportResult:
        """Reports one call now and waits for the answer (a Permit's own
        `report` is batched in the background instead). `permit` is a Permit
        (taken over: it will not report again) or a permit id from elsewhere.
        Raises InvalidArgument for bad input, Unavailable when no server
        answered."""
        self._check_open()
        outcome = Outcome.of(outcome)
        lat = as_seconds(latency, "latency")
        endpoints = list(range(len(self._endpoints)))
        if isinstance(permit, Permit):
            if permit.local:
                raise InvalidArgument("permit_id: a permit decided locally has no id to report", "permit_id", "")
            if lat is None:
                lat = time.monotonic() - permit.issued
            resource = resource or permit.resource
            if 0 <= permit.endpoint < len(self._endpoints):
                endpoints = [permit.endpoint]
            permit_id = permit.detach()
        else:
            permit_id = permit
        request = pb.ReportOutcomeRequest(
            resource=resource, permit_id=permit_id, outcome=outcome.to_proto(), usage=usage_of(usage)
        )
        if lat is not None:
            request.latency.CopyFrom(_core.duration(lat))
        if actual_cost is not None:
            request.actual_cost = actual_cost
        sent = {"resource": resource, "permit_id": permit_id, "outcome": outcome, "actual_cost": actual_cost}
        t = as_seconds(timeout, "timeout")
        last: Optional[grpc.RpcError] = None
        for i in endpoints:
            try:
                r = self._endpoints[i].stub.ReportOutcome(request, timeout=t, metadata=self._core.metadata)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument.from_message(e.details() or "", sent) from None
                if e.code() not in _core.UNREACHABLE:
                    raise ServerError("Floodgate: %s: %s" % (e.code().name, e.details()), e.code()) from None
                last = e
                continue
            return ReportResult(r.counted, breaker_state(r.breaker_state), r.settled)
        code = last.code() if last is not None else None
        raise Unavailable("no Floodgate server answered the report: %s" % (last.details() if last else "none"), code)

    def flush(self, timeout: Optional[float] = 5.0) -> bool:
        """Waits until every report made so far was delivered (or given up
        on); False if `timeout` (seconds) passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        for ep in self._endpoints:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = ep.reporter.flush(left) and ok
        return ok

    # --- guarding ---

    def guard(
        self,
        resource: str,
        descriptors: Optional[Mapping[str, str]] = None,
        cost: int = 1,
        priority: Optional[Union[Priority, str]] = None,
        *,
        classify: Optional[Classifier] = None,
        cancelled_as: Optional[Union[Outcome, str]] = None,
        timeout: Optional[Seconds] = None,
    ) -> Guard:
        """A context manager guarding one call: acquires on entry (raising
        Denied when not admitted: the block does not run), waits out any
        shaping, and on exit reports the block's outcome with its latency:
        SUCCESS, or FAILURE when it raised, unless `classify(result, error)`
        says otherwise."""
        return Guard(self, make_request(resource, descriptors, cost, priority), classify, cancelled_as, timeout)

    def guarded(
        self,
        resource: str,
        *,
        descriptors: Union[Mapping[str, str], Callable[..., Mapping[str, str]], None] = None,
        cost: int = 1,
        priority: Optional[Union[Priority, str]] = None,
        classify: Optional[Classifier] = None,
        fallback: Any = NO_FALLBACK,
        fallback_on_failure: bool = True,
        cancelled_as: Optional[Union[Outcome, str]] = None,
        timeout: Optional[Seconds] = None,
    ):
        """A decorator guarding every call of a function (see `guarded`)."""
        return guarded(
            self, resource, descriptors=descriptors, cost=cost, priority=priority, classify=classify,
            fallback=fallback, fallback_on_failure=fallback_on_failure, cancelled_as=cancelled_as, timeout=timeout,
        )

    # --- state ---

    @property
    def fail_mode(self) -> FailMode:
        return self._core.fail_mode

    @property
    def is_degraded(self) -> bool:
        """Whether every server is currently considered unreachable."""
        return all(ep.breaker.is_open for ep in self._endpoints)

    def stats(self) -> dict:
        """Counters: rpcs, without_server, decided_locally, server_errors,
        reports_counted, reports_not_counted, reports_dropped."""
        return self._core.stats()

    def _check_open(self) -> None:
        if self._core.closed:
            raise FloodgateError("the client is closed")

    def close(self, timeout: float = 2.0) -> None:
        """Reports every permit still out (its drop outcome), delivers the
        reports queued (waiting at most `timeout` seconds), closes the
        connections. Idempotent."""
        with self._close_lock:
            if self._core.closed:
                return
            self._core.drop_live()
            self._core.closed = True
        deadline = time.monotonic() + timeout
        for ep in self._endpoints:
            ep.reporter.close(max(0.0, deadline - time.monotonic()))
            ep.ready.cancel()
            _wait_for_polling_to_stop(ep.channel)
            ep.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r, fail_mode=%r)" % ([ep.url for ep in self._endpoints], self._core.fail_mode)


def _late(call, i: int, orphan: Callable) -> None:
    try:
        if call.cancelled() or call.exception() is not None:
            return
        orphan(i, call.result())
    except Exception:  # pragma: no cover - a late answer must never raise into grpc's thread
        log.debug("a late answer could not be given back", exc_info=True)
