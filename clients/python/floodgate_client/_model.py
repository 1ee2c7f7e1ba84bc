"""What the client asks and what it is told."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Mapping, Optional, Tuple, Union

from ._proto import floodgate_pb2 as pb
from .errors import ConfigError, InvalidArgument

if TYPE_CHECKING:  # pragma: no cover
    from ._permit import Permit

MAX_U32 = 4294967295


class Verdict(str, enum.Enum):
    """What a caller may do, as the server (or the client on its behalf) said."""

    ALLOWED = "ALLOWED"
    RATE_LIMITED = "RATE_LIMITED"
    CIRCUIT_OPEN = "CIRCUIT_OPEN"
    CONCURRENCY_LIMITED = "CONCURRENCY_LIMITED"
    SHED = "SHED"


class Source(str, enum.Enum):
    """Where a decision came from."""

    #: The Floodgate server.
    SERVER = "server"
    #: No server answered and the client fails open.
    FAIL_OPEN = "fail-open"
    #: No server answered and the client fails closed.
    FAIL_CLOSED = "fail-closed"
    #: No server answered and the client decided with its own limiter, at its
    #: share of the limits the server last reported.
    LOCAL = "local"


class BreakerState(str, enum.Enum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"
    FORCED_OPEN = "FORCED_OPEN"
    DISABLED = "DISABLED"
    METRICS_ONLY = "METRICS_ONLY"


class Outcome(str, enum.Enum):
    """How an admitted call went."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    #: Neither: frees the permit's slot, not counted by the breaker.
    IGNORED = "IGNORED"

    @classmethod
    def of(cls, value: Union["Outcome", str]) -> "Outcome":
        if isinstance(value, Outcome):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper().replace("OUTCOME_", "")]
            except KeyError:
                pass
        raise InvalidArgument("outcome: %r is not SUCCESS, FAILURE or IGNORED" % (value,), "outcome", value)

    def to_proto(self) -> int:
        return {"SUCCESS": pb.OUTCOME_SUCCESS, "FAILURE": pb.OUTCOME_FAILURE, "IGNORED": pb.OUTCOME_IGNORED}[self.value]


class Priority(str, enum.Enum):
    """How much a request matters when its system sheds load: by default level
    1 sheds SHEDDABLE, 2 also SHEDDABLE_PLUS, 3 everything but CRITICAL_PLUS."""

    CRITICAL_PLUS = "CRITICAL_PLUS"
    CRITICAL = "CRITICAL"
    SHEDDABLE_PLUS = "SHEDDABLE_PLUS"
    SHEDDABLE = "SHEDDABLE"

    @classmethod
    def of(cls, value: Union["Priority", str, None]) -> Optional["Priority"]:
        """A Priority from itself, or from `critical_plus`, `critical`,
        `sheddable_plus`, `sheddable` (any case, with or without `PRIORITY_`)."""
        if value is None or isinstance(value, Priority):
            return value
        if isinstance(value, str):
            name = value.strip().upper()
            name = name[len("PRIORITY_"):] if name.startswith("PRIORITY_") else name
            if name in cls.__members__:
                return cls[name]
        raise InvalidArgument("priority: %r is not a priority" % (value,), "priority", value)

    def to_proto(self) -> int:
        return pb.Priority.Value("PRIORITY_" + self.value)


_VERDICTS = {
    pb.VERDICT_ALLOWED: Verdict.ALLOWED,
    pb.VERDICT_UNSPECIFIED: Verdict.ALLOWED,
    pb.VERDICT_RATE_LIMITED: Verdict.RATE_LIMITED,
    pb.VERDICT_CIRCUIT_OPEN: Verdict.CIRCUIT_OPEN,
    pb.VERDICT_CONCURRENCY_LIMITED: Verdict.CONCURRENCY_LIMITED,
    pb.VERDICT_SHED: Verdict.SHED,
}


def breaker_state(n: int) -> Optional[BreakerState]:
    try:
        name = pb.BreakerState.Name(n)
    except ValueError:
        return None
    name = name[len("BREAKER_STATE_"):]
    return None if name == "UNSPECIFIED" else BreakerState[name]


def seconds(d) -> float:
    """A google.protobuf.Duration as seconds (never negative)."""
    return max(0.0, d.seconds + d.nanos / 1e9)


@dataclass(frozen=True)
class Limit:
    """One matched limit after the decision. Durations are in seconds."""

    name: str
    #: What the limit holds when full.
    limit: int
    remaining: int
    #: Until the limit is back to its initial state.
    reset_after: float = 0.0
    #: Until this cost would fit; zero when admitted.
    retry_after: float = 0.0
    #: The policy window.
    window: float = 0.0
    #: The request went over this limit: it was denied, unless
    #: ``admitted_over_limit`` is set.
    exceeded: bool = False
    #: Evaluated, never enforced.
    shadow: bool = False
    #: Over the limit and admitted anyway, as one of the share of calls the
    #: limit's ``over_limit`` admits: the caller should slow down.
    admitted_over_limit: bool = False

    @classmethod
    def from_proto(cls, l) -> "Limit":
        return cls(
            name=l.name,
            limit=l.limit,
            remaining=l.remaining,
            reset_after=seconds(l.reset_after),
            retry_after=seconds(l.retry_after),
            window=seconds(l.window),
            exceeded=l.exceeded,
            shadow=l.shadow,
            admitted_over_limit=l.admitted_over_limit,
        )


@dataclass
class Decision:
    """The answer to an acquire. Durations are in seconds.

    A denial is a Decision, not an exception. `permit` is set when the
    resource has a breaker or a concurrency limit and the call was allowed:
    report it with the call's outcome (it reports itself if forgotten).
    """

    verdict: Verdict
    source: Source = Source.SERVER
    permit: Optional["Permit"] = None
    limits: Tuple[Limit, ...] = ()
    #: When a denied caller may usefully retry.
    retry_after: float = 0.0
    #: Shaping: wait this long before proceeding.
    wait: float = 0.0
    breaker_state: Optional[BreakerState] = None
    degradation_level: int = 0
    #: The resource's concurrency limit, when it has one (0 otherwise).
    max_in_flight: int = 0
    #: One human line for denials.
    reason: str = ""
    #: When the rule has a waterfall of budgets: the source that paid for an
    #: allowed call. Empty when the rule's own limits paid, or when denied.
    paid_by: str = ""

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOWED

    @property
    def denied(self) -> bool:
        return not self.allowed

    def tightest(self) -> Optional[Limit]:
        """The limit that matters most: the one that denied, else the one with the least left."""
        for l in self.limits:
            if l.exceeded:
                return l
        return min(self.limits, key=lambda l: l.remaining, default=None)

    @classmethod
    def fail_open(cls) -> "Decision":
        """What the client answers when no server answers and it fails open."""
        return cls(verdict=Verdict.ALLOWED, source=Source.FAIL_OPEN)

    @classmethod
    def fail_closed(cls, retry_after: float) -> "Decision":
        """... and when it fails closed: SHED, retry after `retry_after`."""
        return cls(
            verdict=Verdict.SHED,
            source=Source.FAIL_CLOSED,
            retry_after=retry_after,
            reason="the rate limit service is unreachable",
        )


@dataclass(frozen=True)
class Acquire:
    """One question: may I call `resource`? (for `acquire_batch`)."""

    resource: str
    descriptors: Mapping[str, str] = field(default_factory=dict)
    cost: int = 1
    priority: Optional[Union[Priority, str]] = None
    dry_run: bool = False
    #: `cost` is an estimate, settled by `permit.report(..., actual_cost=N)`.
    settle: bool = False
    #: Usage the call expects, by field ({"input_tokens": 812}): each limit
    #: with a `cost` formula takes what its formula gives for it.
    usage: Optional[Mapping[str, int]] = None

    def to_proto(self):
        if not isinstance(self.resource, str):
            raise InvalidArgument("resource: must be a string", "resource", self.resource)
        cost = self.cost
        if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_U32:
            raise InvalidArgument("cost: %r is not a whole number from 0 to %d" % (cost, MAX_U32), "cost", cost)
        descriptors: Dict[str, str] = {}
        for k, v in dict(self.descriptors or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise InvalidArgument("descriptors: %r=%r is not a string pair" % (k, v), "descriptors", {k: v})
            descriptors[k] = v
        priority = Priority.of(self.priority)
        return pb.AcquireRequest(
            resource=self.resource,
            descriptors=descriptors,
            cost=cost,
            dry_run=bool(self.dry_run),
            settle=bool(self.settle),
            priority=priority.to_proto() if priority else pb.PRIORITY_UNSPECIFIED,
            usage=usage_of(self.usage),
        )

    def units(self) -> int:
        """The units it takes (0 is read as 1)."""
        return max(1, int(self.cost))

    def fields(self) -> Dict[str, object]:
        """What was sent, by the names the server's messages use."""
        return {"resource": self.resource, "cost": self.cost, "priority": self.priority, "descriptors": self.descriptors}


def usage_of(usage: Optional[Mapping[str, int]]) -> Dict[str, int]:
    """Usage as sent: a mapping of field name to a whole number from 0 to
    4294967295 (InvalidArgument otherwise)."""
    out: Dict[str, int] = {}
    for k, v in dict(usage or {}).items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_U32:
            raise InvalidArgument("usage: %r=%r is not a field name and a whole number from 0 to %d" % (k, v, MAX_U32), "usage", {k: v})
        out[k] = v
    return out


def decision_from_proto(r, make_permit) -> Decision:
    """The server's answer; `make_permit(id, urgent, breaker)` makes the
    permit when it sent one."""
    verdict = _VERDICTS.get(r.verdict, Verdict.ALLOWED)
    breaker = breaker_state(r.breaker_state)
    urgent = r.holds_slot or breaker is BreakerState.HALF_OPEN
    return Decision(
        verdict=verdict,
        source=Source.SERVER,
        permit=make_permit(r.permit_id, urgent, breaker) if r.permit_id else None,
        limits=tuple(Limit.from_proto(l) for l in r.limits),
        retry_after=seconds(r.retry_after),
        wait=seconds(r.wait),
        breaker_state=breaker,
        degradation_level=r.degradation_level,
        max_in_flight=r.max_in_flight,
        reason=r.reason,
        paid_by=r.paid_by,
    )


@dataclass(frozen=True)
class ReportResult:
    """What a direct `report` did."""

    #: False for an expired, unknown or already reported permit.
    counted: bool
    breaker_state: Optional[BreakerState]
    #: An `actual_cost` was applied.
    settled: bool


class FailMode:
    """What the client answers when no server can be reached.

    `FailMode.OPEN` admits the call (the default), `FailMode.CLOSED` denies it
    (verdict SHED), `FailMode.local(share)` decides in this process at `share`
    (0 < share <= 1) of the limits the server last reported for the same
    question: a fleet of N clients would use 1/N. A question the server never
    answered is admitted. Strings work too: "open", "closed", "local"
    (share 1.0) or "local:0.25".
    """

    OPEN: "FailMode"
    CLOSED: "FailMode"

    __slots__ = ("kind", "share")

    def __init__(self, kind: str, share: float = 1.0):
        if kind not in ("open", "closed", "local"):
            raise ConfigError("fail mode %r is not open, closed or local" % (kind,))
        if kind == "local":
            try:
                share = float(share)
            except (TypeError, ValueError):
                raise ConfigError("FailMode.local share %r is not a number" % (share,)) from None
            if not 0.0 < share <= 1.0:
                raise ConfigError("FailMode.local share %r is not in (0, 1]" % (share,))
        self.kind = kind
        self.share = share

    @classmethod
    def local(cls, share: float = 1.0) -> "FailMode":
        return cls("local", share)

    @classmethod
    def of(cls, value: Union["FailMode", str]) -> "FailMode":
        if isinstance(value, FailMode):
            return value
        if isinstance(value, str):
            kind, _, share = value.strip().lower().partition(":")
            return cls(kind, share if share else 1.0)
        raise ConfigError("fail mode %r is not a FailMode or a string" % (value,))

    def __eq__(self, other) -> bool:
        return isinstance(other, FailMode) and (self.kind, self.share) == (other.kind, other.share)

    def __hash__(self) -> int:
        return hash((self.kind, self.share))

    def __repr__(self) -> str:
        return "FailMode.local(%g)" % self.share if self.kind == "local" else "FailMode.%s" % self.kind.upper()


FailMode.OPEN = FailMode("open")
FailMode.CLOSED = FailMode("closed")
