"""The local limiter and the connection breaker on their own (the Rust
crate's unit tests of local.rs and connection.rs, ported)."""

from __future__ import annotations

from floodgate_client import Limit, Source, Verdict
from floodgate_client._breaker import ServerBreaker
from floodgate_client._local import LocalLimits, key

MINUTE = 60.0


def learn(local, resource, descriptors, verdict, limits, max_in_flight=0):
    local.learn(key(resource, descriptors), resource, verdict, limits, max_in_flight)


def decide(local, resource, descriptors):
    return local.decide(key(resource, descriptors), resource, 1)


def test_a_share_of_the_last_known_limit_is_enforced_from_what_was_left():
    local = LocalLimits(0.5)
    t = {"tenant": "acme"}
    assert decide(local, "work", t).verdict is Verdict.ALLOWED, "nothing known: allowed"
    learn(local, "work", t, Verdict.ALLOWED, [Limit("per-tenant", 20, 20, window=MINUTE)])
    assert sum(decide(local, "work", t).allowed for _ in range(30)) == 10, "half of 20 per minute"
    denied = decide(local, "work", t)
    assert denied.verdict is Verdict.RATE_LIMITED and denied.source is Source.LOCAL
    assert 0 < denied.retry_after <= 6
    # The server said 4 are left: 2 at this share, not a full bucket.
    learn(local, "work", t, Verdict.ALLOWED, [Limit("per-tenant", 20, 4, window=MINUTE)])
    assert sum(decide(local, "work", t).allowed for _ in range(30)) == 2


def test_a_denial_before_the_limits_does_not_erase_them():
    local = LocalLimits(1.0)
    u = {"user": "u"}
    learn(local, "work", u, Verdict.ALLOWED, [Limit("per-user", 10, 9, window=10.0)], 5)
    learn(local, "work", u, Verdict.CONCURRENCY_LIMITED, [], 5)
    for verdict in (Verdict.CIRCUIT_OPEN, Verdict.SHED):
        learn(local, "work", u, verdict, [], 0)
    held = [decide(local, "work", u) for _ in range(15)]
    assert sum(d.allowed for d in held) == 5, "the concurrency limit still applies"
    for d in held:
        if d.permit:
            d.permit.report()
    assert sum(decide(local, "work", u).allowed for _ in range(15)) == 9 - 5, "5 were taken, 4 remain"


def test_the_concurrency_limit_applies_at_the_share_and_a_dropped_permit_frees_its_slot():
    local = LocalLimits(0.5)
    learn(local, "db", {}, Verdict.ALLOWED, [], 5)
    held = [decide(local, "db", {}) for _ in range(20)]
    assert sum(d.allowed for d in held) == 2, "half of 5, rounded down"
    assert next(d for d in held if not d.allowed).verdict is Verdict.CONCURRENCY_LIMITED
    del held
    assert decide(local, "db", {}).allowed, "the slots came back"


def test_the_key_is_the_resource_and_its_sorted_descriptors_unambiguously():
    assert key("r", {"b": "2", "a": "1"}) == key("r", {"a": "1", "b": "2"})
    assert key("r", {"a": "1", "b": "2"}) != key("r", {"a": "1"})
    assert key("r", {"user": "x", "org": "1\x1fuser=x"}) != key("r", {"org": "1", "user": "x\x1fuser=x"})
    assert key("orders", {"user": "ann"}) == "6:orders4:user3:ann"
    assert key("r", {"a": "1:b"}) != key("r", {"a": "1", "b": ""})


def test_the_connection_breaker_opens_after_failures_in_a_row_and_lets_one_probe_through():
    b = ServerBreaker("test")
    b.attempt().failure("x")
    b.attempt().failure("x")
    assert not b.is_open
    b.attempt().failure("x")
    assert b.is_open and b.attempt() is None, "cooling down"
    b._open_until = 0.0  # the cool-down is over
    probe = b.attempt()
    assert probe is not None and b.attempt() is None, "only one probe"
    probe.abandon()
    probe = b.attempt()
    assert probe is not None, "an abandoned probe lets the next call probe"
    probe.success()
    assert not b.is_open and b.attempt() is not None
