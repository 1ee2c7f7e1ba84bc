"""AsyncClient (grpc.aio) against the real server."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from floodgate_client import AsyncClient, BreakerState, Denied, FailMode, InvalidArgument, Outcome, Source, Verdict

UP = 2.0


def run(coro, timeout=60):
    """Runs a test's coroutine; a hang is a failure, not a stuck suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def apoll(check, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("%s not reached within %.1fs" % (what, timeout))
        await asyncio.sleep(0.02)


def test_allowed_then_rate_limited(shared_server, tenant):
    async def main():
        async with AsyncClient(shared_server.url, timeout=UP) as c:
            ds = [await c.acquire("t.api", {"tenant": tenant}) for _ in range(6)]
            batch = await c.acquire_batch(["t.nothing", {"resource": "t.api", "descriptors": {"tenant": tenant}}])
            return ds, batch

    ds, batch = run(main())
    assert [d.verdict for d in ds] == [Verdict.ALLOWED] * 5 + [Verdict.RATE_LIMITED]
    assert ds[-1].retry_after > 0 and ds[-1].source is Source.SERVER
    assert [d.verdict for d in batch] == [Verdict.ALLOWED, Verdict.RATE_LIMITED]


def test_bad_input(shared_server):
    async def main():
        async with AsyncClient(shared_server.url, timeout=UP) as c:
            with pytest.raises(InvalidArgument) as e:
                await c.acquire("")
            return e.value

    e = run(main())
    assert e.field == "resource" and e.value == ""


def test_guard_opens_the_breaker_and_falls_back(shared_server):
    async def main():
        async with AsyncClient(shared_server.url, timeout=UP) as c:
            @c.guarded("t.db")
            async def query():
                await asyncio.sleep(0)
                raise IOError("down")

            for _ in range(4):
                with pytest.raises(IOError):
                    await query()
            await c.flush()

            async def opened():
                try:
                    await query()
                except Denied as e:
                    return e
                except IOError:
                    await c.flush()

            denied = await apoll(opened, what="the breaker open")

            @c.guarded("t.db", fallback=lambda cause: "cached")
            async def cached():
                raise AssertionError("never runs")

            with pytest.raises(TypeError):
                c.guarded("t.db")(lambda: None)
            return denied, await cached()

    denied, value = run(main())
    assert denied.verdict is Verdict.CIRCUIT_OPEN and denied.retry_after > 0
    assert denied.decision.breaker_state is BreakerState.OPEN
    assert value == "cached"


def test_permits_report_themselves_when_collected_and_on_close(shared_server):
    async def main():
        holder = AsyncClient(shared_server.url, timeout=UP)
        other = AsyncClient(shared_server.url, timeout=UP)
        held = [await holder.acquire("t.pool") for _ in range(2)]
        assert all(d.allowed for d in held)
        assert (await other.acquire("t.pool")).verdict is Verdict.CONCURRENCY_LIMITED
        del held[0]
        gc.collect()

        async def free():
            d = await other.acquire("t.pool")
            return d if d.allowed else None

        d = await apoll(free, what="the collected permit's slot")
        d.permit.report(Outcome.SUCCESS)
        await other.flush()

        async def guarded_once():
            try:
                async with other.guard("t.pool") as g:
                    return g.decision.allowed
            except Denied:  # the report above may not be applied yet
                return None

        assert await apoll(guarded_once, what="a guarded call")
        await other.flush()
        extra = await other.acquire("t.pool")
        assert extra.allowed
        assert (await other.acquire("t.pool")).verdict is Verdict.CONCURRENCY_LIMITED, "held[1] and extra hold both"
        extra.permit.report()
        await other.flush()
        await holder.close()  # reports held[1]
        d = await apoll(free, what="the slot freed by close")
        d.permit.report()
        await other.close()

    run(main())


def test_a_cancelled_guarded_call_reports_its_cancellation(server):
    async def main():
        async with AsyncClient(server.url, timeout=UP, cancelled_as="IGNORED") as c:
            started = []

            @c.guarded("t.pool")
            async def slow():
                started.append(1)
                await asyncio.sleep(60)

            tasks = [asyncio.ensure_future(slow()) for _ in range(2)]

            async def both_running():
                return len(started) == 2

            await apoll(both_running, what="both calls running")
            assert (await c.acquire("t.pool")).verdict is Verdict.CONCURRENCY_LIMITED
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

            async def free():
                d = await c.acquire("t.pool")
                return d if d.allowed else None

            d = await apoll(free, what="slots freed by cancellation")
            d.permit.report()

    run(main())


def test_fail_local_and_the_deadline_with_a_frozen_then_killed_server(server):
    async def main():
        async with AsyncClient(server.url, timeout=0.25, fail_mode=FailMode.local(1.0)) as c:
            async def up():
                d = await c.acquire("t.api", {"tenant": "x"})
                return d if d.source is Source.SERVER else None

            assert (await apoll(up, what="the server")).limits[0].remaining == 4
            server.freeze()
            try:
                start = time.monotonic()
                d = await c.acquire("t.api", {"tenant": "x"})
                assert time.monotonic() - start < 1.0
                assert d.allowed and d.source is Source.LOCAL
            finally:
                server.kill()
            ds = [await c.acquire("t.api", {"tenant": "x"}) for _ in range(5)]
            assert [x.verdict for x in ds] == [Verdict.ALLOWED] * 3 + [Verdict.RATE_LIMITED] * 2
            assert all(x.source is Source.LOCAL for x in ds)
            server.start()
            await apoll(lambda: up(), timeout=15, what="an answer after the restart")

    run(main())


def test_fail_open_and_closed(server):
    async def main():
        opened = AsyncClient(server.url, timeout=UP, fail_mode="open")
        closed = AsyncClient(server.url, timeout=UP, fail_mode="closed")
        assert (await opened.acquire("t.nothing")).source is Source.SERVER
        assert (await closed.acquire("t.nothing")).source is Source.SERVER
        server.kill()
        a, b = await opened.acquire("t.api"), await closed.acquire("t.api")
        await opened.close()
        await closed.close()
        return a, b

    a, b = run(main())
    assert a.allowed and a.source is Source.FAIL_OPEN
    assert b.verdict is Verdict.SHED and b.source is Source.FAIL_CLOSED
