"""A permit: what an admitted call on a resource with a breaker or a
concurrency limit holds until it says how the call went.

It reports itself: garbage-collected (or still held when its client
closes) without a word, it reports its drop outcome, so a concurrency slot is
freed at once rather than at the permit's expiry on the server. The drop
outcome is the client's `cancelled_as`, by default FAILURE on a resource with
a breaker (a call cut short counts against it, as in the Rust crate) and
IGNORED otherwise.
"""

from __future__ import annotations

import datetime
import time
from typing import Mapping, Optional, Union

from ._model import Outcome

Seconds = Union[float, int, datetime.timedelta]


def as_seconds(value: Optional[Seconds], name: str) -> Optional[float]:
    from .errors import InvalidArgument

    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise InvalidArgument("%s: %r is not a duration (seconds, not negative)" % (name, value), name, value)
    return float(value)


class Permit:
    """Report it with `permit.report(Outcome.SUCCESS)` (or FAILURE, IGNORED),
    or use it as a context manager: a clean exit reports SUCCESS, an
    exception FAILURE, a cancellation (a BaseException that is not an
    Exception, such as asyncio.CancelledError) its drop outcome.

    Reporting never blocks: reports are batched in the background (those of
    permits that hold a concurrency slot or a half-open probe leave at once).
    """

    def __init__(self, sink, permit_id: str, resource: str, endpoint: int, urgent: bool, on_drop: Outcome):
        self.id = permit_id
        self.resource = resource
        #: time.monotonic() when it was handed out.
        self.issued = time.monotonic()
        self.endpoint = endpoint
        #: Holds a concurrency slot or a half-open probe: its report leaves at once.
        self.urgent = urgent
        self._on_drop = on_drop
        self._sink = sink

    @property
    def reported(self) -> bool:
        """Reported (or detached) already."""
        return "_sink" not in self.__dict__ or self.__dict__["_sink"] is None

    @property
    def local(self) -> bool:
        """Handed out by the client itself (FailMode.local) rather than the server."""
        return not self.id

    def report(
        self,
        outcome: Union[Outcome, str] = Outcome.SUCCESS,
        latency: Optional[Seconds] = None,
        actual_cost: Optional[int] = None,
        usage: Optional[Mapping[str, int]] = None,
    ) -> bool:
        """How the call went; `latency` (seconds or a timedelta) defaults to
        the permit's age. `actual_cost`, for a permit of an acquire with
        `settle=True`, is what the call really cost; `usage` ({"output_tokens":
        310}) is the usage it really had, which limits with a `cost` formula
        settle at. Returns False when the permit was already reported (a
        permit reports once)."""
        outcome = Outcome.of(outcome)
        latency_s = as_seconds(latency, "latency")
        if actual_cost is not None:
            from .errors import InvalidArgument

            if isinstance(actual_cost, bool) or not isinstance(actual_cost, int) or not 0 <= actual_cost <= 4294967295:
                raise InvalidArgument("actual_cost: %r is not from 0 to 4294967295" % (actual_cost,), "actual_cost", actual_cost)
        sent_usage = None
        if usage:
            from ._model import usage_of

            sent_usage = usage_of(usage)
        return self._send(outcome, latency_s, actual_cost, sent_usage)

    def on_drop(self, outcome: Union[Outcome, str]) -> "Permit":
        """What is reported if the permit is never reported."""
        self._on_drop = Outcome.of(outcome)
        return self

    def detach(self) -> str:
        """Gives up reporting through this client: the id, for a report sent
        some other way (`client.report(permit_id, ...)`, another process).
        Unreported, the server frees it at expiry."""
        self.__dict__.pop("_sink", None)
        return self.id

    def _send(
        self, outcome: Outcome, latency: Optional[float], actual_cost: Optional[int], usage: Optional[Mapping[str, int]] = None
    ) -> bool:
        # dict.pop is atomic under the GIL: a permit reports once, whoever races.
        sink = self.__dict__.pop("_sink", None)
        if sink is None:
            return False
        if latency is None:
            latency = time.monotonic() - self.issued
        try:
            sink.send_report(self, outcome, latency, actual_cost, usage)
        except Exception:  # never fail the caller's path for a report
            return False
        return True

    def _drop(self) -> None:
        self._send(self._on_drop, None, None)

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._send(Outcome.SUCCESS, None, None)
        elif issubclass(exc_type, Exception):
            self._send(Outcome.FAILURE, None, None)
        else:
            self._drop()

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:
            pass

    def __repr__(self) -> str:
        return "Permit(id=%r, resource=%r, urgent=%r, reported=%r)" % (self.id, self.resource, self.urgent, self.reported)
