"""What the sync and asyncio clients share: settings, endpoints, TLS, the
fail modes, decisions and the permits still out."""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import duration_pb2

from ._local import LocalLimits, key as local_key
from ._model import Acquire, Decision, FailMode, Outcome, Source, decision_from_proto, usage_of
from ._permit import Permit, Seconds, as_seconds
from ._proto import floodgate_pb2 as pb
from .errors import ConfigError

log = logging.getLogger("floodgate_client")

#: The longest an acquire waits for the servers before the fail mode answers
#: (the Rust crate's default request_timeout).
DEFAULT_TIMEOUT = 0.025
#: A call the caller stopped waiting for may still be answered this long
#: after; its permit is then given back (reported IGNORED).
ORPHAN_GRACE = 2.0
#: A batch of reports is tried twice, each within this.
REPORT_TIMEOUT = 2.0
#: Reports waiting before new ones are dropped (and counted).
REPORT_QUEUE = 10_000

UNREACHABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
)

PemSource = Union[bytes, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Tls:
    """TLS for the connection: the CA to trust (else the system's roots), and a
    client certificate and key for a server that requires mTLS. Each is PEM
    (bytes, or a str starting with -----BEGIN) or a path to a PEM file.
    `server_name` checks the server's certificate against another name than
    the endpoint's host."""

    ca: Optional[PemSource] = None
    cert: Optional[PemSource] = None
    key: Optional[PemSource] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("Tls needs both cert and key for a client certificate, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "ca"),
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "cert"),
        )


def _pem(source: Optional[PemSource], what: str) -> Optional[bytes]:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode("ascii")
    try:
        with open(source, "rb") as f:
            return f.read()
    except (OSError, TypeError) as e:
        raise ConfigError("Tls %s: cannot read %r: %s" % (what, source, e)) from None


@dataclass(frozen=True)
class Endpoint:
    """Where one server is: `target` for grpc, and whether it speaks TLS."""

    url: str
    target: str
    secure: bool

    @classmethod
    def parse(cls, url: str, tls: Optional[Tls]) -> "Endpoint":
        if not isinstance(url, str) or not url.strip():
            raise ConfigError("bad endpoint %r: give host:port, http://host:port or https://host:port" % (url,))
        u = url.strip()
        if u.startswith("http://"):
            target, secure = u[len("http://"):], False
        elif u.startswith("https://"):
            target, secure = u[len("https://"):], True
        elif "://" in u:
            raise ConfigError("bad endpoint %r: the scheme must be http or https" % (url,))
        else:
            target, secure = u, tls is not None
        target = target.rstrip("/")
        if not target or "/" in target and not target.startswith("unix:"):
            raise ConfigError("bad endpoint %r: give host:port" % (url,))
        return cls(url, target, secure)


def channel_options(tls: Optional[Tls], extra: Optional[Sequence[Tuple[str, Any]]]) -> List[Tuple[str, Any]]:
    options: List[Tuple[str, Any]] = [
        # Reconnect soon after the server comes back (gRPC's default backoff
        # grows to two minutes).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # This client's connections are its own (not shared with other
        # channels to the same address, whose backoff would be ours).
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    options.extend(extra or ())
    return options


def endpoints_of(target: Union[str, Sequence[str]], tls: Optional[Tls]) -> List[Endpoint]:
    urls = [target] if isinstance(target, str) else list(target or ())
    if not urls:
        raise ConfigError("no endpoint given")
    return [Endpoint.parse(u, tls) for u in urls]


def duration(secs: float) -> duration_pb2.Duration:
    whole = int(secs)
    return duration_pb2.Duration(seconds=whole, nanos=int(round((secs - whole) * 1e9)) % 1_000_000_000)


def report_request(
    permit: Permit, outcome: Outcome, latency: float, actual_cost: Optional[int], usage: Optional[Mapping[str, int]] = None
):
    r = pb.ReportOutcomeRequest(
        resource=permit.resource,
        permit_id=permit.id,
        outcome=outcome.to_proto(),
        latency=duration(latency),
        usage=dict(usage or {}),
    )
    if actual_cost is not None:
        r.actual_cost = actual_cost
    return r


def charge_request(
    resource: str,
    descriptors: Optional[Mapping[str, str]],
    cost: int,
    usage: Optional[Mapping[str, int]],
    idempotency_key: Optional[str],
):
    """A ChargeRequest. Every charge carries a key (a fresh one unless the
    caller gave one): when a server does not answer in time and the next one
    is asked, a charge the first took is not taken twice."""
    return pb.ChargeRequest(
        resource=resource,
        descriptors=dict(descriptors or {}),
        cost=cost,
        usage=usage_of(usage),
        idempotency_key=idempotency_key if idempotency_key is not None else uuid.uuid4().hex,
    )


def acquire_of(item: Union[Acquire, str, Mapping[str, Any]]) -> Acquire:
    """An item of acquire_batch: an Acquire, a resource, or Acquire's fields as a dict."""
    if isinstance(item, Acquire):
        return item
    if isinstance(item, str):
        return Acquire(item)
    if isinstance(item, Mapping):
        return Acquire(**item)
    raise TypeError("acquire_batch takes Acquire objects, resource names or dicts, not %r" % (item,))


class Core:
    """Settings and state that do not depend on how calls are made."""

    def __init__(
        self,
        target: Union[str, Sequence[str]],
        fail_mode: Union[FailMode, str],
        timeout: Seconds,
        tls: Optional[Tls],
        token: Optional[str],
        metadata: Optional[Iterable[Tuple[str, str]]],
        fail_closed_retry_after: Seconds,
        cancelled_as: Optional[Union[Outcome, str]],
        report_batch: int,
        report_interval: Seconds,
    ):
        self.fail_mode = FailMode.of(fail_mode)
        self.timeout = as_seconds(timeout, "timeout")
        if not self.timeout:
            raise ConfigError("timeout must be above 0")
        self.tls = tls
        self.endpoints = endpoints_of(target, tls)
        md: List[Tuple[str, str]] = list(metadata or ())
        if token is not None:
            if not isinstance(token, str) or not token.strip() or any(c in token for c in "\r\n"):
                raise ConfigError("token must be a non-empty string on one line")
            md.append(("authorization", "Bearer " + token.strip()))
        self.metadata: Tuple[Tuple[str, str], ...] = tuple(md)
        self.fail_closed_retry_after = as_seconds(fail_closed_retry_after, "fail_closed_retry_after")
        self.cancelled_as = Outcome.of(cancelled_as) if cancelled_as is not None else None
        self.report_batch = min(max(int(report_batch), 1), 1000)
        self.report_interval = as_seconds(report_interval, "report_interval")
        self.local = LocalLimits(self.fail_mode.share) if self.fail_mode.kind == "local" else None
        self.live: "weakref.WeakSet[Permit]" = weakref.WeakSet()
        self._live_lock = threading.Lock()
        self.counts: Counter = Counter()
        self.closed = False

    def credentials(self, ep: Endpoint) -> Optional[grpc.ChannelCredentials]:
        if not ep.secure:
            return None
        return (self.tls or Tls()).credentials()

    def cancelled_outcome(self, breaker) -> Outcome:
        """What a permit never reported reports: FAILURE where a breaker
        counts it, IGNORED where only limits do, unless `cancelled_as` says."""
        if self.cancelled_as is not None:
            return self.cancelled_as
        return Outcome.FAILURE if breaker is not None else Outcome.IGNORED

    def track(self, permit: Optional[Permit]) -> Optional[Permit]:
        if permit is not None:
            with self._live_lock:
                self.live.add(permit)
        return permit

    def drop_live(self) -> int:
        """Reports every permit still out with its drop outcome (closing)."""
        with self._live_lock:
            permits = list(self.live)
        n = 0
        for p in permits:
            if not p.reported:
                p._drop()
                n += 1
        return n

    def decision(self, r, req: Acquire, endpoint: int, sink) -> Decision:
        def make_permit(permit_id: str, urgent: bool, breaker) -> Permit:
            return Permit(sink, permit_id, req.resource, endpoint, urgent, self.cancelled_outcome(breaker))

        d = decision_from_proto(r, make_permit)
        self.track(d.permit)
        if self.local is not None:
            self.local.learn(local_key(req.resource, req.descriptors), req.resource, d.verdict, d.limits, d.max_in_flight)
        return d

    def without_server(self, req: Acquire) -> Decision:
        """The fail mode's answer."""
        self.counts["without_server"] += 1
        kind = self.fail_mode.kind
        if kind == "closed":
            return Decision.fail_closed(self.fail_closed_retry_after)
        if kind == "local" and self.local is not None:
            self.counts["decided_locally"] += 1
            d = self.local.decide(local_key(req.resource, req.descriptors), req.resource, req.units())
            self.track(d.permit)
            return d
        return Decision.fail_open()

    def stats(self) -> Dict[str, int]:
        return dict(self.counts)


def give_back(r, resource: str, settle: bool, endpoint: int, sink) -> None:
    """An answer nobody read: its permit reported IGNORED; with `settle`, at a
    cost of 0 (the call never ran: its estimate goes back)."""
    if not r.permit_id:
        return
    permit = Permit(sink, r.permit_id, resource, endpoint, r.holds_slot, Outcome.IGNORED)
    permit._send(Outcome.IGNORED, None, 0 if settle else None)


__all__ = ["Core", "Endpoint", "Tls", "Source"]
