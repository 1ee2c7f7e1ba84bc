"""A metered call: reserve an estimate, charge what goes beyond it while
the call streams, settle at the end.

An LLM answer's tokens are known chunk by chunk. `client.meter(...)` reserves
an estimate first (an acquire with settle=True), so that concurrent calls
cannot all pass one check of the same budget. `add(units)` counts each
chunk: within the reservation nothing is asked; beyond it, the excess is
charged at once, and `add` returns False when a budget is used up, so a call
overshoots its budget by at most one chunk. `finish()` (or leaving the `with`
block) settles the reservation at what was used of it; the rest comes back.
"""

from typing import Mapping, Optional, Tuple, Union

from ._model import Decision, Limit, Outcome
from .errors import Unavailable


class _Meter:
    """The arithmetic both kinds of metered call share."""

    def __init__(self, resource: str, descriptors: Optional[Mapping[str, str]], estimate: int, decision: Decision):
        #: The decision at the start: `admitted` is False when it was denied.
        self.decision = decision
        self.resource = resource
        self.descriptors = dict(descriptors or {})
        self._permit = decision.permit if decision.allowed else None
        #: Units the start reserved (0 when no server was reached).
        self.reserved = estimate if self._permit is not None else 0
        #: Units counted so far.
        self.used = 0
        self._charged = 0
        #: The limits as the charge that said stop left them.
        self.limits: Tuple[Limit, ...] = ()
        self._done = False

    @property
    def admitted(self) -> bool:
        return self.decision.allowed

    def _count(self, units: int) -> int:
        """Counts `units`; what must be charged now (0: nothing)."""
        if isinstance(units, bool) or not isinstance(units, int) or not 0 <= units <= 4294967295:
            raise ValueError("units: %r is not a whole number from 0 to 4294967295" % (units,))
        if not self.admitted:
            raise RuntimeError("the metered call was denied at the start: nothing to count")
        if self._done:
            raise RuntimeError("the metered call is finished: nothing more is counted")
        self.used += units
        due = max(0, self.used - self.reserved) - self._charged
        if due <= 0:
            return 0
        # Counted as charged whatever the answer: a charge whose answer was
        # lost may have been applied, and charging it again would count it twice.
        self._charged += due
        return due

    def _after(self, limits: Tuple[Limit, ...]) -> bool:
        if any(l.exceeded and not l.shadow for l in limits):
            self.limits = limits
            return False
        return True

    def _settle(self, outcome: Outcome) -> None:
        self._done = True
        permit, self._permit = self._permit, None
        if permit is not None:
            permit.report(outcome, actual_cost=min(self.used, self.reserved))

    def _outcome(self, exc_type) -> Outcome:
        if exc_type is None:
            return Outcome.SUCCESS
        if issubclass(exc_type, Exception):
            return Outcome.FAILURE
        # Cancelled (KeyboardInterrupt, asyncio.CancelledError): the permit's own choice.
        return self._permit._on_drop if self._permit is not None else Outcome.IGNORED

    def __del__(self) -> None:
        try:
            if self._permit is not None:
                self._settle(self._permit._on_drop)
        except Exception:
            pass

    def __repr__(self) -> str:
        return "%s(resource=%r, admitted=%r, reserved=%r, used=%r)" % (
            type(self).__name__, self.resource, self.admitted, self.reserved, self.used)


class Metered(_Meter):
    """A metered call of a `Client` (see the module's description)."""

    def __init__(self, client, resource, descriptors, estimate, decision):
        super().__init__(resource, descriptors, estimate, decision)
        self._client = client

    def add(self, units: int) -> bool:
        """Counts `units` more of the call's use: False when a budget ran out
        and the call should end. When no server answers a charge, the call
        goes on, unless the client fails closed."""
        due = self._count(units)
        if due == 0:
            return True
        try:
            limits = self._client.charge(self.resource, self.descriptors, due)
        except Unavailable:
            return self._client.fail_mode.kind != "closed"
        return self._after(limits)

    def finish(self, outcome: Union[Outcome, str] = Outcome.SUCCESS) -> None:
        """Ends the call: settles the reservation at the units used within it."""
        self._settle(Outcome.of(outcome))

    def __enter__(self) -> "Metered":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._settle(self._outcome(exc_type))


class AsyncMetered(_Meter):
    """A metered call of an `AsyncClient` (see the module's description)."""

    def __init__(self, client, resource, descriptors, estimate, decision):
        super().__init__(resource, descriptors, estimate, decision)
        self._client = client

    async def add(self, units: int) -> bool:
        """As `Metered.add`."""
        due = self._count(units)
        if due == 0:
            return True
        try:
            limits = await self._client.charge(self.resource, self.descriptors, due)
        except Unavailable:
            return self._client.fail_mode.kind != "closed"
        return self._after(limits)

    def finish(self, outcome: Union[Outcome, str] = Outcome.SUCCESS) -> None:
        """Ends the call: settles the reservation at the units used within it."""
        self._settle(Outcome.of(outcome))

    async def __aenter__(self) -> "AsyncMetered":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self._settle(self._outcome(exc_type))
