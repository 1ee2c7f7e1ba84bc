"""What the client answers by itself when the server is killed, frozen or back."""

from __future__ import annotations

import time

import pytest

from conftest import poll
from floodgate_client import Client, FailMode, Source, Verdict

UP = 2.0  # the deadline while the server is up (a debug build on a shared machine)


def from_server(c, resource="t.nothing", descriptors=None):
    d = c.acquire(resource, descriptors)
    return d if d.source is Source.SERVER else None


def test_fail_open_when_the_server_is_killed(server):
    c = Client(server.url, timeout=UP, fail_mode="open")
    assert from_server(c)
    server.kill()
    ds = [c.acquire("t.api", {"tenant": "a"}) for _ in range(10)]
    assert all(d.allowed and d.source is Source.FAIL_OPEN and d.permit is None for d in ds)
    assert c.is_degraded, "the local breaker on the connection opened"
    c.close()


def test_fail_closed_when_the_server_is_killed(server):
    c = Client(server.url, timeout=UP, fail_mode=FailMode.CLOSED, fail_closed_retry_after=3)
    assert from_server(c)
    server.kill()
    d = c.acquire("t.api", {"tenant": "a"})
    assert d.verdict is Verdict.SHED and d.source is Source.FAIL_CLOSED
    assert d.retry_after == 3 and "unreachable" in d.reason
    c.close()


def test_fail_local_keeps_to_what_the_server_last_said(server):
    c = Client(server.url, timeout=UP, fail_mode=FailMode.local(1.0))
    first = [c.acquire("t.api", {"tenant": "a"}) for _ in range(2)]
    assert first[-1].limits[0].remaining == 3 and first[-1].source is Source.SERVER
    pool = c.acquire("t.pool")
    pool.permit.report()
    c.flush()
    server.kill()
    ds = [c.acquire("t.api", {"tenant": "a"}) for _ in range(5)]
    assert [d.verdict for d in ds] == [Verdict.ALLOWED] * 3 + [Verdict.RATE_LIMITED] * 2
    assert all(d.source is Source.LOCAL for d in ds)
    assert ds[-1].retry_after > 0 and ds[-1].limits[0].exceeded
    # A question never answered is allowed.
    assert c.acquire("t.api", {"tenant": "never-seen"}).allowed
    # The concurrency limit at its share: 2 of max_in_flight 2; a report frees a slot.
    held = [c.acquire("t.pool") for _ in range(3)]
    assert [d.verdict for d in held] == [Verdict.ALLOWED, Verdict.ALLOWED, Verdict.CONCURRENCY_LIMITED]
    assert held[0].permit.local
    held[0].permit.report()
    assert c.acquire("t.pool").allowed
    c.close()


def test_fail_local_at_a_share(server):
    c = Client(server.url, timeout=UP, fail_mode="local:0.5")
    assert c.acquire("t.api", {"tenant": "b"}).limits[0].remaining == 4
    server.kill()
    allowed = sum(c.acquire("t.api", {"tenant": "b"}).allowed for _ in range(10))
    assert allowed == 2, "half of the 4 left"
    c.close()


@pytest.mark.parametrize("mode,verdict,source", [
    ("open", Verdict.ALLOWED, Source.FAIL_OPEN),
    ("closed", Verdict.SHED, Source.FAIL_CLOSED),
    ("local", Verdict.ALLOWED, Source.LOCAL),
])
def test_a_frozen_server_is_decided_within_the_deadline(server, mode, verdict, source):
    c = Client(server.url, timeout=0.25, fail_mode=mode)
    assert poll(lambda: from_server(c, "t.api", {"tenant": "f"}), what="an answer from the server")
    server.freeze()
    try:
        for _ in range(4):  # the 4 the server said were left, in local mode
            start = time.monotonic()
            d = c.acquire("t.api", {"tenant": "f"})
            took = time.monotonic() - start
            assert took < 1.0, "the deadline held (%.3fs)" % took
            assert d.verdict is verdict and d.source is source
    finally:
        server.thaw()
    assert poll(lambda: from_server(c, "t.api", {"tenant": "f"}), what="the server again after SIGCONT")
    c.close()


def test_reconnects_after_a_restart(server):
    c = Client(server.url, timeout=UP, fail_mode="closed")
    assert from_server(c)
    server.kill()
    assert c.acquire("t.nothing").source is Source.FAIL_CLOSED
    for _ in range(5):  # enough to open the connection's breaker
        c.acquire("t.nothing")
    assert c.is_degraded
    server.start()
    d = poll(lambda: from_server(c), timeout=15, what="an answer after the restart")
    assert d.allowed and not c.is_degraded
    c.close()


def test_permits_of_a_killed_server_do_not_block_or_raise(server):
    c = Client(server.url, timeout=UP)
    d = c.acquire("t.pool")
    assert d.permit is not None
    server.kill()
    start = time.monotonic()
    assert d.permit.report("FAILURE") is True
    assert time.monotonic() - start < 0.1, "reporting never blocks"
    c.close(timeout=5)
    assert c.stats().get("reports_dropped", 0) >= 1


def test_closing_a_client_of_an_unreachable_server_prints_nothing_from_grpc_threads():
    """grpc's connectivity thread, started to connect early, must have
    stopped before the channel closes, or it prints a traceback of its own."""
    import threading

    seen = []
    previous = threading.excepthook
    threading.excepthook = seen.append
    try:
        for _ in range(20):
            Client("127.0.0.1:1").close()
        time.sleep(0.5)
    finally:
        threading.excepthook = previous
    assert [str(a.exc_value) for a in seen] == []
