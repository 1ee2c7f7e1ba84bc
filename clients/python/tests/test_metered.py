"""Charge and metered (streamed) calls against the real server, sync and asyncio."""

from __future__ import annotations

import asyncio

import pytest

from floodgate_client import AsyncClient, Client, InvalidArgument

RULES = """
resources:
  - name: llm
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001 }
"""


@pytest.fixture
def llm(make_server):
    return make_server(RULES)


def left(client: Client, user: str) -> int:
    """What a dry run of cost 1 says is left (after that 1)."""
    return client.acquire("llm", {"user": user}, dry_run=True).limits[0].remaining


def test_a_stream_stops_within_one_chunk_of_its_budget_and_settles(llm):
    with Client(llm.url) as client:
        # 300 reserved, 120 used: 180 come back when the block ends.
        with client.meter("llm", {"user": "u1"}, estimate=300) as call:
            assert call.admitted and left(client, "u1") == 699
            for _ in range(4):
                assert call.add(30)
        client.flush()
        assert left(client, "u1") == 879
        # 880 left: chunks of 70 past the 300 reserved are charged, and the
        # one that finds the budget used up says stop.
        with client.meter("llm", {"user": "u1"}, estimate=300) as call:
            while call.add(70):
                assert call.used < 2000, "never stopped"
            stopped_at = call.used
            assert call.limits[0].exceeded
        assert 880 <= stopped_at < 880 + 70, stopped_at
        with pytest.raises(RuntimeError):
            call.add(1)
        with pytest.raises(ValueError):
            call.add(2 ** 32)
        assert call.used == stopped_at
        client.flush()
        assert client.acquire("llm", {"user": "u1"}, dry_run=True).denied


def test_concurrent_reservations_cannot_both_pass_and_a_failed_call_settles(llm):
    with Client(llm.url) as client:
        first = client.meter("llm", {"user": "u2"}, estimate=600)
        second = client.meter("llm", {"user": "u2"}, estimate=600)
        assert first.admitted and not second.admitted
        assert second.decision.retry_after > 0
        with pytest.raises(RuntimeError):
            second.add(1)
        with pytest.raises(ZeroDivisionError):
            with first:
                first.add(100)
                1 / 0
        client.flush()
        assert left(client, "u2") == 899


def test_charge_takes_beyond_the_limit_and_refuses_bad_input(llm):
    with Client(llm.url) as client:
        limits = client.charge("llm", {"user": "u3"}, 1200)
        assert limits[0].exceeded and limits[0].remaining == 0
        with pytest.raises(InvalidArgument) as e:
            client.charge("", {"user": "u3"}, 1)
        assert e.value.field == "resource"


def test_an_async_stream_is_metered_the_same_way(llm):
    async def main():
        async with AsyncClient(llm.url) as client:
            async with await client.meter("llm", {"user": "u4"}, estimate=300) as call:
                while await call.add(70):
                    assert call.used < 2000
                stopped_at = call.used
            assert 1000 <= stopped_at < 1000 + 70, stopped_at
            # A task cancelled mid stream settles what it counted.
            async def cancelled():
                async with await client.meter("llm", {"user": "u5"}, estimate=300) as call:
                    await call.add(100)
                    await asyncio.sleep(30)

            task = asyncio.ensure_future(cancelled())
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.flush()
            d = await client.acquire("llm", {"user": "u5"}, dry_run=True)
            assert d.limits[0].remaining == 899

    asyncio.run(asyncio.wait_for(main(), 60))
