"""A local breaker on each server connection: after a few calls in a row
fail to reach the server, the client stops trying for a cool-down (growing up
to a cap), so a dead server costs no waiting per request; then one call
probes, and success closes it again (as the Rust crate's connection.rs)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

log = logging.getLogger("floodgate_client")

#: Failures in a row that open the local breaker.
THRESHOLD = 3
FIRST_COOLDOWN = 0.25
MAX_COOLDOWN = 5.0


class ServerBreaker:
    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._open_until: Optional[float] = None
        self._failures = 0
        self._probing = False
        self._cooldown = FIRST_COOLDOWN

    def attempt(self) -> Optional["Attempt"]:
        """An attempt, or None while open (once the cool-down is over, one
        caller at a time probes)."""
        with self._lock:
            if self._open_until is None:
                return Attempt(self, False)
            if time.monotonic() >= self._open_until and not self._probing:
                self._probing = True
                return Attempt(self, True)
            return None

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def _success(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            if self._open_until is not None:
                self._open_until = None
                self._cooldown = FIRST_COOLDOWN
                log.info("Floodgate at %s is reachable again", self.endpoint)

    def _failure(self, why: str) -> None:
        with self._lock:
            self._failures += 1
            probing, self._probing = self._probing, False
            if self._failures < THRESHOLD and not probing:
                return
            was_open = self._open_until is not None
            self._open_until = time.monotonic() + self._cooldown
            self._cooldown = min(self._cooldown * 2, MAX_COOLDOWN)
        if not was_open:
            log.warning("Floodgate at %s is unreachable (%s): running without it", self.endpoint, why)

    def _abandon(self) -> None:
        with self._lock:
            self._probing = False


class Attempt:
    """One call tried through the breaker; say how it went."""

    __slots__ = ("_breaker", "_probe", "_settled")

    def __init__(self, breaker: ServerBreaker, probe: bool):
        self._breaker = breaker
        self._probe = probe
        self._settled = False

    def success(self) -> None:
        self._settled = True
        self._breaker._success()

    def failure(self, why: str) -> None:
        self._settled = True
        self._breaker._failure(why)

    def abandon(self) -> None:
        """Cancelled mid-call: neither up nor down was learnt; a probe lets
        the next call probe."""
        if self._probe and not self._settled:
            self._settled = True
            self._breaker._abandon()
