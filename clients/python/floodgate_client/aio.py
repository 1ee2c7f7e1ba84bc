"""The asyncio client (grpc.aio). Build it anywhere; it connects inside the
event loop that first uses it, and must be used from that loop only."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from . import _core
from ._breaker import ServerBreaker
from ._core import Core, Tls, give_back, report_request
from ._guard import NO_FALLBACK, AsyncGuard, Classifier, guarded, make_request
from ._metered import AsyncMetered
from ._model import Acquire, Decision, FailMode, Limit, Outcome, Priority, ReportResult, breaker_state, usage_of
from ._permit import Permit, Seconds, as_seconds
from ._proto import floodgate_pb2 as pb
from ._proto import floodgate_pb2_grpc as pb_grpc
from .errors import FloodgateError, InvalidArgument, ProtocolError, ServerError, Unavailable

log = logging.getLogger("floodgate_client")

_FLUSH = object()
_STOP = object()


class _AsyncReporter:
    """As the sync client's reporter, on a task of the client's loop. Reports
    made from another thread (a permit collected there) are handed to the
    loop; once it is closed they are dropped (the server expires them)."""

    def __init__(self, core: Core):
        self._core = core
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stub = None
        self._q: Optional[asyncio.Queue] = None
        self._task: Optional[asyncio.Task] = None
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop, stub) -> None:
        self._loop, self._stub = loop, stub

    def send_report(
        self, permit: Permit, outcome: Outcome, latency: float, actual_cost: Optional[int], usage=None
    ) -> None:
        self._enqueue((report_request(permit, outcome, latency, actual_cost, usage), permit.urgent))

    def _enqueue(self, item) -> None:
        loop = self._loop
        if loop is None or self._closed:
            self._core.counts["reports_dropped"] += 1
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._put(item)
        else:
            try:
                loop.call_soon_threadsafe(self._put, item)
            except RuntimeError:  # the loop is closed
                self._core.counts["reports_dropped"] += 1

    def _put(self, item) -> None:
        if self._closed and item[0] is not _STOP:
            self._core.counts["reports_dropped"] += 1
            return
        if self._task is None:
            self._q = asyncio.Queue(maxsize=_core.REPORT_QUEUE)
            self._task = asyncio.ensure_future(self._run())
        try:
            self._q.put_nowait(item)
        except asyncio.QueueFull:
            self._core.counts["reports_dropped"] += 1
            if item[0] is _FLUSH:
                item[1].set_result(False)

    async def flush(self, timeout: Optional[float]) -> bool:
        if self._task is None or self._loop is None:
            return True
        done = self._loop.create_future()
        self._put((_FLUSH, done))
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            return False

    async def close(self, timeout: float) -> None:
        task = self._task
        if task is not None and not self._closed:
            self._put((_STOP, None))
        self._closed = True
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except asyncio.TimeoutError:
                task.cancel()
            except Exception:  # pragma: no cover
                pass

    async def _run(self) -> None:
        assert self._q is not None
        batch: List[Any] = []
        due: Optional[float] = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                if due is None:
                    item = await self._q.get()
                else:
                    item = await asyncio.wait_for(self._q.get(), max(0.0, due - loop.time()))
            except asyncio.TimeoutError:
                await self._deliver(batch)
                due = None
                continue
            first, second = item
            if first is _STOP:
                await self._deliver(batch)
                return
            if first is _FLUSH:
                await self._deliver(batch)
                due = None
                if not second.done():
                    second.set_result(True)
                continue
            if not batch:
                due = loop.time() + self._core.report_interval
            batch.append(first)
            if second or len(batch) >= self._core.report_batch:
                await self._deliver(batch)
                due = None

    async def _deliver(self, batch: List[Any]) -> None:
        if not batch:
            return
        reports = list(batch)
        batch.clear()
        counts = self._core.counts
        for attempt in range(2):
            try:
                r = await self._stub.ReportOutcomeBatch(
                    pb.ReportOutcomeBatchRequest(reports=reports),
                    timeout=_core.REPORT_TIMEOUT,
                    metadata=self._core.metadata,
                )
                counted = sum(1 for x in r.responses if x.counted)
                counts["reports_counted"] += counted
                counts["reports_not_counted"] += len(reports) - counted
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    log.warning("Floodgate refused a batch of reports: %s", e.details())
                    break
                if attempt == 0:
                    await asyncio.sleep(0.05)
            except (ValueError, RuntimeError):  # the channel was closed
                break
        counts["reports_dropped"] += len(reports)


class _AsyncEndpoint:
    def __init__(self, core: Core, ep: _core.Endpoint, options):
        self.url = ep.url
        self._ep = ep
        self._core = core
        self._options = options
        self.channel: Optional[grpc.aio.Channel] = None
        self.stub = None
        self.breaker = ServerBreaker(ep.url)
        self.reporter = _AsyncReporter(core)

    def connect(self, loop) -> None:
        creds = self._core.credentials(self._ep)
        if creds is None:
            self.channel = grpc.aio.insecure_channel(self._ep.target, options=self._options)
        else:
            self.channel = grpc.aio.secure_channel(self._ep.target, creds, options=self._options)
        self.stub = pb_grpc.FloodgateStub(self.channel)
        self.reporter.bind(loop, self.stub)
        try:
            self.channel.get_state(try_to_connect=True)
        except Exception:  # pragma: no cover
            pass


class AsyncClient:
    """The asyncio client: the same settings and answers as Client, with
    coroutines (`await client.acquire(...)`, `async with client.guard(...)`,
    `await client.close()`)."""

    _is_async = True

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
        if tls is not None:
            tls.credentials()  # a bad TLS file is an error now, not at the first call
        options = _core.channel_options(tls, channel_options)
        self._endpoints = [_AsyncEndpoint(self._core, ep, options) for ep in self._core.endpoints]
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _ensure(self) -> None:
        if self._core.closed:
            raise FloodgateError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            for ep in self._endpoints:
                ep.connect(loop)
        elif self._loop is not loop:
            raise FloodgateError("an AsyncClient is used from the event loop it first ran in")

    # --- asking ---

    async def acquire(
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
        """May I? As Client.acquire."""
        return await self._acquire(make_request(resource, descriptors, cost, priority, dry_run, settle, usage), timeout)

    async def _acquire(self, req: Acquire, timeout: Optional[Seconds]) -> Decision:
        self._ensure()
        proto = req.to_proto()

        def orphan(i: int, r) -> None:
            give_back(r, req.resource, req.settle, i, self._endpoints[i].reporter)

        asked = await self._ask("Acquire", proto, self._timeout(timeout), req.fields(), orphan)
        if asked is None:
            return self._core.without_server(req)
        i, r = asked
        return self._core.decision(r, req, i, self._endpoints[i].reporter)

    async def acquire_batch(
        self, requests: Iterable[Union[Acquire, str, Mapping[str, Any]]], timeout: Optional[Seconds] = None
    ) -> List[Decision]:
        """As Client.acquire_batch."""
        self._ensure()
        reqs = [_core.acquire_of(r) for r in requests]
        protos = [r.to_proto() for r in reqs]
        out: List[Decision] = []
        for start in range(0, len(reqs), 1000):
            chunk, chunk_protos = reqs[start:start + 1000], protos[start:start + 1000]

            def orphan(i: int, r, chunk=chunk) -> None:
                for response, req in zip(r.responses, chunk):
                    give_back(response, req.resource, req.settle, i, self._endpoints[i].reporter)

            asked = await self._ask(
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

    async def _ask(self, method: str, request, timeout: float, sent: Mapping[str, Any], orphan: Optional[Callable]):
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
            call = getattr(ep.stub, method)(request, timeout=left + _core.ORPHAN_GRACE, metadata=core.metadata)
            fut = asyncio.ensure_future(call)
            try:
                response = await asyncio.wait_for(asyncio.shield(fut), left)
            except asyncio.TimeoutError:
                attempt.failure("no answer within the request timeout")
                _leave(fut, call, i, orphan)
                continue
            except asyncio.CancelledError:
                attempt.abandon()
                _leave(fut, call, i, orphan)
                raise
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    attempt.success()
                    raise InvalidArgument.from_message(e.details() or "", sent) from None
                if code in _core.UNREACHABLE:
                    attempt.failure(e.details() or code.name)
                else:
                    attempt.success()
                    core.counts["server_errors"] += 1
                    log.warning("Floodgate answered %s (%s); trying without it", code.name, e.details())
                continue
            attempt.success()
            return i, response
        return None

    # --- charging ---

    async def charge(
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
        self._ensure()
        request = _core.charge_request(resource, descriptors, cost, usage, idempotency_key)
        sent = {"resource": resource, "cost": cost, "usage": usage}
        asked = await self._ask("Charge", request, self._timeout(timeout), sent, None)
        if asked is None:
            raise Unavailable("no Floodgate server answered the charge")
        return tuple(Limit.from_proto(l) for l in asked[1].limits)

    async def meter(
        self,
        resource: str,
        descriptors: Optional[Mapping[str, str]] = None,
        estimate: int = 1,
        timeout: Optional[Seconds] = None,
    ) -> AsyncMetered:
        """Starts a metered call: reserves `estimate` (an acquire with
        settle=True). Count each chunk's units with `add`, which charges
        what goes beyond the estimate and returns False when a budget ran
        out; leave the `with` block (or call `finish`) to settle. Check
        `admitted` first: a denied start has `decision` with its retry_after."""
        decision = await self.acquire(resource, descriptors, estimate, timeout=timeout, settle=True)
        return AsyncMetered(self, resource, descriptors, estimate, decision)

    # --- reporting ---

    async def report(
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
        """As Client.report."""
        self._ensure()
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
        last = None
        for i in endpoints:
            try:
                r = await self._endpoints[i].stub.ReportOutcome(request, timeout=t, metadata=self._core.metadata)
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

    async def flush(self, timeout: Optional[float] = 5.0) -> bool:
        """As Client.flush."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        for ep in self._endpoints:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = await ep.reporter.flush(left) and ok
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
    ) -> AsyncGuard:
        """`async with client.guard(...)`: as Client.guard."""
        return AsyncGuard(self, make_request(resource, descriptors, cost, priority), classify, cancelled_as, timeout)

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
        """A decorator guarding every call of a coroutine function."""
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
        return all(ep.breaker.is_open for ep in self._endpoints)

    def stats(self) -> dict:
        return self._core.stats()

    async def close(self, timeout: float = 2.0) -> None:
        """As Client.close. Idempotent."""
        if self._core.closed:
            return
        self._core.drop_live()
        self._core.closed = True
        deadline = time.monotonic() + timeout
        for ep in self._endpoints:
            await ep.reporter.close(max(0.0, deadline - time.monotonic()))
            if ep.channel is not None:
                await ep.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "AsyncClient(%r, fail_mode=%r)" % ([ep.url for ep in self._endpoints], self._core.fail_mode)


def _leave(fut: "asyncio.Future", call, i: int, orphan: Optional[Callable]) -> None:
    """The caller stopped waiting: a late answer goes to `orphan`."""
    if orphan is None:
        call.cancel()
        return

    def done(f: "asyncio.Future") -> None:
        if f.cancelled() or f.exception() is not None:
            return
        try:
            orphan(i, f.result())
        except Exception:  # pragma: no cover
            log.debug("a late answer could not be given back", exc_info=True)

    fut.add_done_callback(done)
