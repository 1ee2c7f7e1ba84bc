"""Acquire, run the call, time it, classify its result, report it; raise
Denied (or serve a fallback) when not admitted."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any, Callable, Mapping, Optional, Union

from ._model import Acquire, Decision, Outcome
from ._permit import Permit
from .errors import Denied

#: classify(result, error) -> Outcome: `error` is the exception the call
#: raised (None when it returned `result`).
Classifier = Callable[[Any, Optional[BaseException]], Union[Outcome, str]]


def by_result(result: Any, error: Optional[BaseException]) -> Outcome:
    """The default: an exception is a FAILURE, a return a SUCCESS."""
    return Outcome.FAILURE if error is not None else Outcome.SUCCESS


class _NoFallback:
    def __repr__(self) -> str:
        return "NO_FALLBACK"


NO_FALLBACK: Any = _NoFallback()


class _GuardBase:
    def __init__(self, client, req: Acquire, classify: Optional[Classifier], cancelled_as, timeout):
        self._client = client
        self.request = req
        self._classify = classify or by_result
        self._cancelled_as = Outcome.of(cancelled_as) if cancelled_as is not None else None
        self._timeout = timeout
        self._outcome: Optional[Outcome] = None
        self._result: Any = None
        self._start = 0.0
        #: The decision, once asked.
        self.decision: Optional[Decision] = None
        #: The permit, when the server handed one out.
        self.permit: Optional[Permit] = None

    def set_outcome(self, outcome: Union[Outcome, str]) -> None:
        """Report this outcome, whatever the block does."""
        self._outcome = Outcome.of(outcome)

    def set_result(self, result: Any) -> Any:
        """Hands the block's result to the classifier (returns it)."""
        self._result = result
        return result

    def _admitted(self, d: Decision) -> None:
        self.decision = d
        if not d.allowed:
            raise Denied(d)
        p = d.permit
        if p is not None and self._cancelled_as is not None:
            p.on_drop(self._cancelled_as)
        self.permit = p

    def _finish(self, exc_type, exc) -> None:
        permit = self.permit
        if permit is None or permit.reported:
            return
        latency = time.monotonic() - self._start
        if self._outcome is not None:
            permit.report(self._outcome, latency=latency)
        elif exc_type is not None and not issubclass(exc_type, Exception):
            permit._drop()  # cancelled (CancelledError, KeyboardInterrupt...)
        else:
            try:
                outcome = Outcome.of(self._classify(self._result, exc))
            except BaseException:
                permit.report(Outcome.FAILURE, latency=latency)
                raise
            permit.report(outcome, latency=latency)


class Guard(_GuardBase):
    """`with client.guard("db") as g:` runs the block only if admitted (else
    raises Denied), then reports SUCCESS, or FAILURE when it raised (a
    classifier may say otherwise; `g.set_result(v)` hands it a value,
    `g.set_outcome(o)` overrides it)."""

    def __enter__(self) -> "Guard":
        d = self._client._acquire(self.request, self._timeout)
        self._admitted(d)
        if d.wait > 0:
            time.sleep(d.wait)
        self._start = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._finish(exc_type, exc)
        return False


class AsyncGuard(_GuardBase):
    """`async with client.guard("db") as g:`: as Guard, for AsyncClient."""

    async def __aenter__(self) -> "AsyncGuard":
        d = await self._client._acquire(self.request, self._timeout)
        self._admitted(d)
        if d.wait > 0:
            await asyncio.sleep(d.wait)
        self._start = time.monotonic()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self._finish(exc_type, exc)
        return False


def make_request(resource, descriptors, cost, priority, dry_run=False, settle=False, usage=None) -> Acquire:
    return Acquire(resource, dict(descriptors or {}), cost, priority, dry_run, settle, usage)


def guarded(
    client,
    resource: str,
    *,
    descriptors: Union[Mapping[str, str], Callable[..., Mapping[str, str]], None] = None,
    cost: int = 1,
    priority=None,
    classify: Optional[Classifier] = None,
    fallback: Any = NO_FALLBACK,
    fallback_on_failure: bool = True,
    cancelled_as=None,
    timeout=None,
):
    """A decorator: each call of the function is guarded by `client` (a
    Client for plain functions, an AsyncClient for coroutine functions).

    `descriptors` is a mapping, or a function of the call's arguments that
    returns one. Not admitted, the call raises Denied, or returns
    `fallback(cause)` when a fallback is given; `cause` is the Denied, or,
    with `fallback_on_failure` (the default), the exception the function
    raised."""
    is_async = getattr(client, "_is_async", False)

    def describe(args, kwargs):
        d = descriptors(*args, **kwargs) if callable(descriptors) else descriptors
        return make_request(resource, d, cost, priority)

    def decorate(fn):
        if inspect.iscoroutinefunction(fn) != is_async:
            kind = "coroutine functions need an AsyncClient" if not is_async else "an AsyncClient guards coroutine functions"
            raise TypeError("cannot guard %r: %s" % (fn, kind))

        if is_async:

            @functools.wraps(fn)
            async def run_async(*args, **kwargs):
                g = AsyncGuard(client, describe(args, kwargs), classify, cancelled_as, timeout)
                try:
                    await g.__aenter__()
                except Denied as denied:
                    if fallback is NO_FALLBACK:
                        raise
                    return fallback(denied)
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as e:
                    g._finish(type(e), e)
                    if fallback is not NO_FALLBACK and fallback_on_failure and isinstance(e, Exception):
                        return fallback(e)
                    raise
                g._result = result
                g._finish(None, None)
                return result

            return run_async

        @functools.wraps(fn)
        def run(*args, **kwargs):
            g = Guard(client, describe(args, kwargs), classify, cancelled_as, timeout)
            try:
                g.__enter__()
            except Denied as denied:
                if fallback is NO_FALLBACK:
                    raise
                return fallback(denied)
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                g._finish(type(e), e)
                if fallback is not NO_FALLBACK and fallback_on_failure and isinstance(e, Exception):
                    return fallback(e)
                raise
            g._result = result
            g._finish(None, None)
            return result

        return run

    return decorate
