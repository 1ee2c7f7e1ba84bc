"""FailMode.local: while no server can be reached, the client decides in
this process, at its share of what the server last said (a port of the Rust
crate's local.rs).

- A token bucket per limit: so many per window, starting from what the
  server last said was left times the share (not full), never holding more
  than the share of the limit.
- The resource's concurrency limit: its share of `max_in_flight` calls at
  once (rounded down, at least 1); a local permit frees its slot when it is
  reported or dropped.
- What the server says is learned from every answer that looked at the
  limits; a denial before the limits (an open breaker, a concurrency limit,
  shedding) leaves what was learned alone.
- A question the server never answered has no known limit and is allowed.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Mapping, Optional, Sequence

from ._model import Decision, Limit, Outcome, Source, Verdict
from ._permit import Permit

#: Questions remembered at most; the least recently asked are forgotten.
MAX_KEYS = 10_000


def _part(s: str) -> str:
    return "%d:%s" % (len(s.encode("utf-8")), s)


def key(resource: str, descriptors: Optional[Mapping[str, str]]) -> str:
    """One question's identity: its resource and its descriptors, sorted, each
    part length-prefixed (so no value can pass for another's parts)."""
    parts = [_part(resource)]
    for k, v in sorted((descriptors or {}).items()):
        parts.append(_part(k))
        parts.append(_part(v))
    return "".join(parts)


class _Bucket:
    __slots__ = ("name", "limit", "window", "capacity", "per_second", "tokens", "at")

    def __init__(self, l: Limit, share: float, now: float):
        self.name = l.name
        self.limit = l.limit
        self.window = l.window
        self.capacity = max(l.limit * share, 1.0)
        self.per_second = self.capacity / max(l.window, 1e-3)
        self.tokens = 0.0
        self.at = now

    def told(self, remaining: int, share: float, now: float) -> None:
        """What the server said is left, at this process's share."""
        self.tokens = min(remaining * share, self.capacity)
        self.at = now

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.at)
        self.tokens = min(self.tokens + elapsed * self.per_second, self.capacity)
        self.at = now

    def wait_for(self, cost: float) -> float:
        return max(0.0, (cost - self.tokens) / self.per_second)


class _Entry:
    __slots__ = ("buckets", "used")

    def __init__(self, now: float):
        self.buckets: List[_Bucket] = []
        self.used = now


class _InFlight:
    __slots__ = ("cap", "now")

    def __init__(self):
        #: This process's share of the resource's max_in_flight (0: none known).
        self.cap = 0
        self.now = 0


class _Slots:
    """Calls in flight by resource, against the share of its concurrency limit."""

    def __init__(self):
        self._lock = threading.Lock()
        self.by_resource: Dict[str, _InFlight] = {}

    def learn(self, resource: str, max_in_flight: int, share: float) -> None:
        with self._lock:
            f = self.by_resource.get(resource)
            if max_in_flight == 0:
                if f is not None and f.now == 0:
                    del self.by_resource[resource]
                elif f is not None:
                    f.cap = 0
                return
            if f is None:
                if len(self.by_resource) >= MAX_KEYS:
                    return
                f = self.by_resource[resource] = _InFlight()
            f.cap = max(int(max_in_flight * share), 1)

    def take(self, resource: str):
        """True: a slot taken; False: no limit known; an int: all of this
        process's share (the int) is in use."""
        with self._lock:
            f = self.by_resource.get(resource)
            if f is not None and f.cap > 0:
                if f.now >= f.cap:
                    return f.cap
                f.now += 1
                return True
            return False

    def send_report(self, permit: Permit, outcome, latency, actual_cost, usage=None) -> None:
        """A local permit's call ended: its slot is free."""
        with self._lock:
            f = self.by_resource.get(permit.resource)
            if f is not None and f.now > 0:
                f.now -= 1


class LocalLimits:
    def __init__(self, share: float):
        self.share = min(max(share, 0.0), 1.0)
        self._lock = threading.Lock()
        self._entries: Dict[str, _Entry] = {}
        self._slots = _Slots()

    def learn(self, k: str, resource: str, verdict: Verdict, limits: Sequence[Limit], max_in_flight: int) -> None:
        """What the server said of a question: its verdict, the limits it
        looked at and what they hold, and the resource's concurrency limit."""
        # A denial before the limits says nothing of them (nor, for an open
        # breaker or shedding, of the concurrency limit).
        if verdict in (Verdict.ALLOWED, Verdict.RATE_LIMITED, Verdict.CONCURRENCY_LIMITED):
            self._slots.learn(resource, max_in_flight, self.share)
        if verdict not in (Verdict.ALLOWED, Verdict.RATE_LIMITED):
            return
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(k)
            if entry is None:
                entry = self._entries[k] = _Entry(now)
            entry.used = now
            old = entry.buckets
            buckets = []
            for l in limits:
                b = None
                for i, candidate in enumerate(old):
                    if candidate.name == l.name and candidate.limit == l.limit and candidate.window == l.window:
                        b = old.pop(i)
                        break
                if b is None:
                    b = _Bucket(l, self.share, now)
                b.told(l.remaining, self.share, now)
                buckets.append(b)
            entry.buckets = buckets
            if len(self._entries) > MAX_KEYS:
                self._forget_oldest()

    def decide(self, k: str, resource: str, cost: int, on_drop: Outcome = Outcome.IGNORED) -> Decision:
        """A decision in this process: the resource's share of concurrency,
        and every known limit, all or nothing."""
        slot = self._slots.take(resource)
        if slot is not True and slot is not False:
            return Decision(
                verdict=Verdict.CONCURRENCY_LIMITED,
                source=Source.LOCAL,
                retry_after=0.01,
                reason="concurrency limited at %d in flight (decided locally: the rate limit service is unreachable)"
                % slot,
            )
        permit = Permit(self._slots, "", resource, -1, False, on_drop) if slot else None
        now = time.monotonic()
        cost_f = float(max(cost, 1))
        with self._lock:
            entry = self._entries.get(k)
            if entry is None:
                return Decision(verdict=Verdict.ALLOWED, source=Source.LOCAL, permit=permit)
            entry.used = now
            for b in entry.buckets:
                b.refill(now)
            short = [b for b in entry.buckets if b.tokens < cost_f]
            retry_after = max((b.wait_for(cost_f) for b in short), default=0.0)
            denied = bool(short)
            if not denied:
                for b in entry.buckets:
                    b.tokens -= cost_f
            limits = tuple(
                Limit(
                    name=b.name,
                    limit=int(b.capacity),
                    remaining=int(max(b.tokens, 0.0)),
                    window=b.window,
                    retry_after=b.wait_for(cost_f) if denied and b.tokens < cost_f else 0.0,
                    exceeded=denied and b.tokens < cost_f,
                )
                for b in entry.buckets
            )
        if denied and permit is not None:
            permit._drop()  # the slot taken goes back
            permit = None
        return Decision(
            verdict=Verdict.RATE_LIMITED if denied else Verdict.ALLOWED,
            source=Source.LOCAL,
            permit=permit,
            limits=limits,
            retry_after=retry_after,
            reason="rate limited (decided locally: the rate limit service is unreachable)" if denied else "",
        )

    def _forget_oldest(self) -> None:
        ages = sorted((e.used, k) for k, e in self._entries.items())
        for _, k in ages[: MAX_KEYS // 10]:
            del self._entries[k]
