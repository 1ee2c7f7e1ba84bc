"""Costs from usage against the real server: each limit with a `cost`
formula takes, and settles at, what its formula gives for the usage a call
reports (sync and asyncio)."""

from __future__ import annotations

import asyncio

import pytest

from floodgate_client import AsyncClient, Client, InvalidArgument

RULES = """
resources:
  - name: chat
    usage: [input_tokens, output_tokens]
    limits:
      - { name: calls, key: [tenant], algorithm: fixed_window, limit: 100, window: 1h }
      - { name: input, key: [tenant], algorithm: fixed_window, limit: 10000, window: 1h, cost: input_tokens }
      - { name: output, key: [tenant], algorithm: fixed_window, limit: 5000, window: 1h, cost: output_tokens * 2 }
"""


@pytest.fixture
def chat(make_server):
    return make_server(RULES)


def left(client: Client, tenant: str):
    """What each limit has left, by a dry run that asks for nothing more
    than 1 (a formula with no usage takes the request's cost)."""
    return [l.remaining for l in client.acquire("chat", {"tenant": tenant}, dry_run=True).limits]


def test_each_limit_takes_and_settles_its_own_cost(chat):
    with Client(chat.url) as client:
        d = client.acquire("chat", {"tenant": "t1"}, settle=True, usage={"input_tokens": 1200, "output_tokens": 1000})
        assert d.allowed
        assert [l.remaining for l in d.limits] == [99, 8800, 3000]
        # Used 900 input and 150 output tokens: each budget settles at its own figure.
        assert d.permit.report(usage={"input_tokens": 900, "output_tokens": 150})
        client.flush()
        assert left(client, "t1") == [98, 9099, 4699]
        # A charge of output tokens only.
        limits = client.charge("chat", {"tenant": "t1"}, 0, usage={"output_tokens": 2000})
        assert [l.remaining for l in limits] == [99, 9100, 700]
        # A field the rule does not name is refused, naming it; so is a value
        # that is not a whole number.
        with pytest.raises(InvalidArgument) as e:
            client.acquire("chat", {"tenant": "t1"}, usage={"outptu_tokens": 5})
        assert "'outptu_tokens' is not a usage field of rule 'chat'" in str(e.value)
        with pytest.raises(InvalidArgument):
            client.acquire("chat", {"tenant": "t1"}, usage={"input_tokens": -1})
        with pytest.raises(InvalidArgument):
            d.permit.report(usage={"output_tokens": 1.5})
        assert left(client, "t1") == [98, 9099, 699]


def test_an_async_client_reports_usage_too(chat):
    async def main():
        async with AsyncClient(chat.url) as client:
            d = await client.acquire("chat", {"tenant": "t2"}, settle=True, usage={"output_tokens": 500})
            assert [l.remaining for l in d.limits] == [99, 9999, 4000]
            r = await client.report(d.permit, usage={"output_tokens": 100})
            assert r.settled
            # The input budget settled at 0 (the report's usage has no input
            # tokens), giving back the 1 a reservation takes at least.
            limits = await client.charge("chat", {"tenant": "t2"}, 0, usage={"input_tokens": 4000})
            assert [l.remaining for l in limits] == [99, 6000, 4800]

    asyncio.run(main())


def test_a_charge_sent_again_with_its_idempotency_key_takes_nothing(chat):
    with Client(chat.url) as client:
        for _ in range(2):
            client.charge("chat", {"tenant": "t5"}, 0, usage={"input_tokens": 300}, idempotency_key="req-1")
        for _ in range(2):
            client.charge("chat", {"tenant": "t5"}, 0, usage={"input_tokens": 300})
        # 300 once under the key, and twice without one (each gets a fresh key).
        assert left(client, "t5") == [99, 9099, 4999]


WATERFALL = """
resources:
  - name: api
    limits:
      - { name: free, key: [tenant], algorithm: fixed_window, limit: 1, window: 1h }
    waterfall:
      - { name: month, key: [tenant], algorithm: fixed_window, limit: 1, calendar: month }
"""


def test_a_decision_says_which_waterfall_source_paid(make_server):
    server = make_server(WATERFALL)
    with Client(server.url) as client:
        paid = []
        for _ in range(3):
            d = client.acquire("api", {"tenant": "t"})
            paid.append((d.allowed, d.paid_by, [l.name for l in d.limits]))
        assert paid == [
            (True, "", ["free"]),
            (True, "month", ["free", "month"]),
            # A denial names no payer and lists every source it asked.
            (False, "", ["free", "month"]),
        ]
