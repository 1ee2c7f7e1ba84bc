"""The sync Client against the real server."""

from __future__ import annotations

import gc
import time

import pytest

from conftest import RULES, poll
from floodgate_client import (
    Acquire,
    BreakerState,
    Client,
    ConfigError,
    Denied,
    FailMode,
    FloodgateError,
    InvalidArgument,
    Outcome,
    Source,
    Unavailable,
    Verdict,
)

TIMEOUT = 2.0  # generous: a debug server on a shared machine


@pytest.fixture
def client(shared_server):
    c = Client(shared_server.url, timeout=TIMEOUT)
    yield c
    c.close()


def test_allowed_until_the_limit_then_rate_limited_with_retry_after(client, tenant):
    decisions = [client.acquire("t.api", {"tenant": tenant}) for _ in range(6)]
    assert [d.verdict for d in decisions] == [Verdict.ALLOWED] * 5 + [Verdict.RATE_LIMITED]
    assert all(d.source is Source.SERVER for d in decisions)
    first, last = decisions[0], decisions[-1]
    assert first.allowed and first.permit is None, "a limit alone needs no report"
    (limit,) = first.limits
    assert (limit.name, limit.limit, limit.remaining, limit.exceeded) == ("per-tenant", 5, 4, False)
    assert limit.window == pytest.approx(3600)
    assert not last.allowed and last.denied
    assert 0 < last.retry_after <= 3600
    assert "per-tenant" in last.reason
    assert last.tightest().exceeded and last.tightest().remaining == 0


def test_cost_and_dry_run(client, tenant):
    d = client.acquire("t.api", {"tenant": tenant}, cost=3)
    assert d.limits[0].remaining == 2
    for _ in range(3):
        dry = client.acquire("t.api", {"tenant": tenant}, cost=2, dry_run=True)
        assert dry.allowed and dry.permit is None, "a dry run consumes nothing"
    assert client.acquire("t.api", {"tenant": tenant}, cost=3).verdict is Verdict.RATE_LIMITED
    assert client.acquire("t.api", {"tenant": tenant}, cost=2).limits[0].remaining == 0


def test_no_rule_is_allowed_without_limits(client):
    d = client.acquire("t.nothing-matches")
    assert d.allowed and d.limits == () and d.source is Source.SERVER


def test_acquire_batch_answers_in_order(client, tenant):
    ds = client.acquire_batch(
        [Acquire("t.api", {"tenant": tenant}, cost=4), "t.nothing", {"resource": "t.api", "descriptors": {"tenant": tenant}, "cost": 2}]
    )
    assert [d.verdict for d in ds] == [Verdict.ALLOWED, Verdict.ALLOWED, Verdict.RATE_LIMITED]
    assert ds[0].limits[0].remaining == 1 and ds[1].limits == ()


def test_bad_input_is_invalid_argument_naming_field_and_value(client, tenant):
    with pytest.raises(InvalidArgument) as e:
        client.acquire("")
    assert e.value.field == "resource" and e.value.value == ""
    assert "must not be empty" in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        client.acquire("t.api", {"tenant": tenant}, cost=50)
    assert e.value.field == "cost" and e.value.value == 50
    with pytest.raises(InvalidArgument) as e:
        client.acquire("r" * 300)
    assert e.value.field == "resource" and e.value.value.startswith("rrr")
    with pytest.raises(InvalidArgument) as e:
        client.acquire_batch(["t.nothing", ""])
    assert e.value.field == "requests[1].resource"
    with pytest.raises(InvalidArgument) as e:
        client.acquire("t.api", cost=-1)  # refused before sending
    assert e.value.field == "cost"
    with pytest.raises(InvalidArgument):
        client.acquire("t.api", priority="urgent")
    # Nothing was consumed by the refused calls.
    assert client.acquire("t.api", {"tenant": tenant}).limits[0].remaining == 4


def test_a_permit_reports_itself_when_collected(client):
    held = [client.acquire("t.pool") for _ in range(3)]
    assert [d.verdict for d in held] == [Verdict.ALLOWED, Verdict.ALLOWED, Verdict.CONCURRENCY_LIMITED]
    assert held[0].permit is not None and held[0].permit.urgent
    assert held[2].max_in_flight == 2
    del held[0]
    gc.collect()
    # The collected permit was reported IGNORED: its slot is free.
    d = poll(lambda: (lambda d: d if d.allowed else None)(client.acquire("t.pool")), what="a freed slot")
    d.permit.report(Outcome.SUCCESS)
    for h in held:
        if h.permit:
            h.permit.report("success")
    client.flush()


def test_a_permit_as_context_manager_and_reported_once(client):
    with client.acquire("t.pool").permit as p:
        assert not p.reported
    assert p.reported and p.report() is False
    d = client.acquire("t.pool")
    assert d.allowed
    result = client.report(d.permit, Outcome.SUCCESS)
    assert result.counted and result.breaker_state is None
    assert d.permit.reported, "taken over by client.report"
    assert client.report(d.permit.id, "SUCCESS").counted is False, "already reported"
    with pytest.raises(InvalidArgument) as e:
        client.report("not-a-permit", "SUCCESS")
    assert e.value.field == "permit_id"


def test_closing_the_client_reports_the_permits_still_out(shared_server):
    other = Client(shared_server.url, timeout=TIMEOUT)
    holder = Client(shared_server.url, timeout=TIMEOUT)
    kept = [holder.acquire("t.pool") for _ in range(2)]
    assert all(d.allowed for d in kept)
    assert other.acquire("t.pool").verdict is Verdict.CONCURRENCY_LIMITED
    holder.close()
    assert all(d.permit.reported for d in kept)
    d = poll(lambda: (lambda d: d if d.allowed else None)(other.acquire("t.pool")), what="slots freed by close")
    d.permit.report()
    with pytest.raises(FloodgateError):
        holder.acquire("t.pool")
    other.close()


def test_guard_reports_failures_and_the_breaker_opens(client):
    calls = []

    @client.guarded("t.db")
    def query(n):
        calls.append(n)
        raise IOError("db down")

    for n in range(4):
        with pytest.raises(IOError):
            query(n)
    client.flush()

    def opened():
        try:
            query(99)
        except Denied as e:
            return e
        except IOError:
            client.flush()
            return None

    denied = poll(opened, what="the breaker open")
    assert denied.verdict is Verdict.CIRCUIT_OPEN
    assert 0 < denied.retry_after <= 60
    assert denied.reason and denied.decision.breaker_state is BreakerState.OPEN
    assert 99 not in calls[4:] or calls.count(99) < len(calls), "a denied call does not run"

    @client.guarded("t.db", fallback=lambda cause: ("cached", type(cause).__name__))
    def query_or_cache():
        raise AssertionError("never runs while the breaker is open")

    assert query_or_cache() == ("cached", "Denied")
    with pytest.raises(Denied):
        with client.guard("t.db"):
            raise AssertionError("never runs")


def test_a_classifier_decides_what_counts_as_a_failure(client):
    class NotFound(Exception):
        pass

    def classify(result, error):
        return Outcome.SUCCESS if error is None or isinstance(error, NotFound) else Outcome.FAILURE

    @client.guarded("t.tolerant", classify=classify)
    def lookup():
        raise NotFound()

    for _ in range(8):
        with pytest.raises(NotFound):
            lookup()
    client.flush()
    assert client.acquire("t.tolerant").breaker_state is BreakerState.CLOSED
    # The context manager: the block's result through set_result, or an explicit outcome.
    with client.guard("t.tolerant", classify=lambda r, e: Outcome.FAILURE if r == 500 else Outcome.SUCCESS) as g:
        g.set_result(200)
    assert g.permit.reported and g.decision.allowed


def test_guarded_passes_descriptors_from_the_arguments_and_returns_the_value(client, tenant):
    @client.guarded("t.api", descriptors=lambda t: {"tenant": t}, fallback=lambda cause: "later")
    def work(t):
        return "done"

    assert [work(tenant) for _ in range(6)] == ["done"] * 5 + ["later"]
    with pytest.raises(TypeError):

        @client.guarded("t.api")
        async def not_for_the_sync_client():
            pass


def test_a_lowered_limit_applies_once_reloaded(server, tenant):
    c = Client(server.url, timeout=TIMEOUT)
    assert c.acquire("t.api", {"tenant": tenant}, dry_run=True).limits[0].limit == 5
    server.write_rules(RULES.replace("limit: 5,", "limit: 2,"))
    poll(lambda: c.acquire("t.api", {"tenant": "probe"}, dry_run=True).limits[0].limit == 2, what="the reload")
    verdicts = [c.acquire("t.api", {"tenant": tenant + "-new"}).verdict for _ in range(3)]
    assert verdicts == [Verdict.ALLOWED, Verdict.ALLOWED, Verdict.RATE_LIMITED]
    c.close()


def test_config_errors():
    with pytest.raises(ConfigError):
        Client("127.0.0.1:1", fail_mode="sideways")
    with pytest.raises(ConfigError):
        Client("127.0.0.1:1", fail_mode=FailMode.local(1.5))
    with pytest.raises(ConfigError):
        Client("ftp://127.0.0.1:1")
    with pytest.raises(ConfigError):
        Client([])
    assert FailMode.of("local:0.25") == FailMode.local(0.25)
    assert Client("127.0.0.1:1").fail_mode == FailMode.OPEN
