"""The client's errors: only what a caller can act on.

A server that cannot be reached is not an error for `acquire`: the client
answers by its fail mode. `Denied` is raised only by guarded calls (a plain
`acquire` returns the denial as a `Decision`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:  # pragma: no cover
    import grpc

    from ._model import Decision, Verdict


class FloodgateError(Exception):
    """Base of every error this library raises."""


class ConfigError(FloodgateError, ValueError):
    """A setting the client cannot use (a bad fail mode, endpoint or TLS file)."""


class InvalidArgument(FloodgateError, ValueError):
    """The server (or the client, before sending) refused the request as bad
    input. Nothing was changed or consumed. `field` names what was wrong
    (`resource`, `descriptors key`, `cost`, `requests[3].resource`), `value`
    the offending value when it is known, `message` the server's line."""

    def __init__(self, message: str, field: Optional[str] = None, value: Any = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value

    def __str__(self) -> str:
        return "invalid argument: " + self.message

    @classmethod
    def from_message(cls, message: str, sent: Optional[Mapping[str, Any]] = None) -> "InvalidArgument":
        """Parses the server's `field: what is wrong` (or `cost 5 exceeds ...`)
        line; `sent` maps field names to what was sent, to fill in `value`."""
        field, value = _parse(message)
        if value is None and field is not None and sent is not None:
            base = re.sub(r"^requests\[\d+\]\.", "", field)
            value = sent.get(base)
        return cls(message, field, value)


_FIELD = re.compile(r"^(?P<field>[A-Za-z_][\w\[\].]*(?: key| value)?): (?P<rest>.*)$", re.S)
_WORD_VALUE = re.compile(r"^(?P<field>(?:requests\[\d+\]\.)?[a-z_]+) (?P<value>\d+) ")
_QUOTED = re.compile(r"'(?P<value>[^']*)'")


def _parse(message: str):
    m = _FIELD.match(message)
    if m:
        q = _QUOTED.search(m.group("rest"))
        return m.group("field"), (q.group("value") if q else None)
    m = _WORD_VALUE.match(message)
    if m:
        return m.group("field"), int(m.group("value"))
    return None, None


class Unavailable(FloodgateError):
    """No server answered in time (raised by `report` and `flush`, never by
    `acquire`, which answers by its fail mode instead)."""

    def __init__(self, message: str, code: "Optional[grpc.StatusCode]" = None):
        super().__init__(message)
        self.code = code


class ServerError(FloodgateError):
    """The server answered with an error other than bad input."""

    def __init__(self, message: str, code: "Optional[grpc.StatusCode]" = None):
        super().__init__(message)
        self.code = code


class ProtocolError(FloodgateError):
    """The server's answer breaks the protocol (a batch answered with fewer or
    more answers than questions)."""


class Denied(FloodgateError):
    """A guarded call was not admitted, so it did not run.

    `verdict` says why (`Verdict.RATE_LIMITED`...), `retry_after` (seconds)
    when trying again can succeed, `reason` one human line; `decision` is the
    whole answer (its `source` tells whether the server or the fail mode
    gave it)."""

    def __init__(self, decision: "Decision"):
        self.decision = decision
        self.verdict: "Verdict" = decision.verdict
        self.retry_after: float = decision.retry_after
        self.reason: str = decision.reason or decision.verdict.value.lower()
        super().__init__("denied (%s): %s" % (self.verdict.value, self.reason))
