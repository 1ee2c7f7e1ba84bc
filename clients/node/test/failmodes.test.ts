// Without a server: fail open, closed and local with the server killed
// (SIGKILL) and frozen (SIGSTOP: the deadline holds), and reconnection
// after a restart.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, FailMode, Outcome, Source, Verdict, type Decision } from "../dist/index.js";
import { FloodgateServer, pollUntil } from "./server.js";

const RULES = `
resources:
  - name: f.api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1h }
  - name: f.pool
    concurrency: { max_in_flight: 2 }
`;

/** Slack for a busy machine, on top of a deadline. */
const SLACK_MS = 400;

let server: FloodgateServer;
const clients: Client[] = [];

function newClient(failMode: FailMode, requestTimeoutMs = 300): Client {
  const c = new Client(server.url, { failMode, requestTimeoutMs });
  clients.push(c);
  return c;
}

async function timed(f: () => Promise<Decision>): Promise<[Decision, number]> {
  const start = performance.now();
  const d = await f();
  return [d, performance.now() - start];
}

/** Polls until `c` gets an answer from the server again. */
function reconnected(c: Client, what: string): Promise<Decision> {
  return pollUntil(
    `${what} to reach the server again`,
    async () => {
      const d = await c.acquire({ resource: "f.probe" });
      return d.source === Source.Server ? d : undefined;
    },
    15_000,
  );
}

before(async () => {
  server = await FloodgateServer.start(RULES);
});

after(async () => {
  await Promise.all(clients.map((c) => c.close({ timeoutMs: 500 })));
  await server?.dispose();
});

describe("fail modes", () => {
  test("killed: open allows, closed sheds, within the deadline; both reconnect after a restart", async () => {
    const open = newClient(FailMode.open);
    const closed = newClient(FailMode.closed);
    for (const c of [open, closed]) assert.equal((await c.acquire({ resource: "f.api", descriptors: { user: "k" } })).source, Source.Server);
    await server.kill();
    const [o, oms] = await timed(() => open.acquire({ resource: "f.api", descriptors: { user: "k" } }));
    assert.equal(o.verdict, Verdict.Allowed);
    assert.equal(o.source, Source.FailOpen);
    assert.equal(o.permit, null);
    assert.ok(oms < 300 + SLACK_MS, `${oms} ms`);
    const [c, cms] = await timed(() => closed.acquire({ resource: "f.api", descriptors: { user: "k" } }));
    assert.equal(c.verdict, Verdict.Shed);
    assert.equal(c.source, Source.FailClosed);
    assert.equal(c.retryAfterMs, 1000);
    assert.equal(c.reason, "the rate limit service is unreachable");
    assert.ok(cms < 300 + SLACK_MS, `${cms} ms`);
    // After three failures in a row the connection's breaker opens: no waiting at all.
    for (let i = 0; i < 3; i++) await open.acquire({ resource: "f.api" });
    assert.equal(open.isDegraded(), true);
    const [, fast] = await timed(() => open.acquire({ resource: "f.api" }));
    assert.ok(fast < 100, `${fast} ms while the breaker cools down`);
    assert.ok(open.stats().withoutServer >= 5);

    await server.startProcess();
    await reconnected(open, "the fail-open client");
    await reconnected(closed, "the fail-closed client");
    assert.equal(open.isDegraded(), false);
    const d = await closed.acquire({ resource: "f.api", descriptors: { user: "k" } });
    assert.equal(d.verdict, Verdict.Allowed);
    assert.equal(d.limits[0]?.remaining, 9, "a restarted server starts from scratch");
  });

  test("frozen (SIGSTOP): the deadline holds, for the client's and a call's own", async () => {
    const open = newClient(FailMode.open, 250);
    const closed = newClient(FailMode.closed, 250);
    await reconnected(open, "the fail-open client");
    await reconnected(closed, "the fail-closed client");
    await server.freeze();
    try {
      const [o, oms] = await timed(() => open.acquire({ resource: "f.api", descriptors: { user: "z" } }));
      assert.equal(o.source, Source.FailOpen);
      assert.ok(oms >= 200 && oms < 250 + SLACK_MS, `${oms} ms for a 250 ms deadline`);
      const [c, cms] = await timed(() => closed.acquire({ resource: "f.api", descriptors: { user: "z" }, timeoutMs: 100 }));
      assert.equal(c.source, Source.FailClosed);
      assert.ok(cms >= 80 && cms < 100 + SLACK_MS, `${cms} ms for a 100 ms deadline`);
    } finally {
      server.thaw();
    }
    await reconnected(open, "the fail-open client");
    await reconnected(closed, "the fail-closed client");
  });

  test("local: a share of what the server last said, its concurrency share, then the server again", async () => {
    const local = newClient(FailMode.local(1.0));
    await reconnected(local, "the local client");
    const u = { resource: "f.api", descriptors: { user: "loc" } };
    for (let i = 0; i < 7; i++) assert.equal((await local.acquire(u)).source, Source.Server);
    const slot = await local.acquire({ resource: "f.pool" });
    assert.equal(slot.maxInFlight, 2);
    slot.permit!.report(Outcome.Success);
    await local.flush();

    await server.kill();
    const answers: Decision[] = [];
    for (let i = 0; i < 5; i++) answers.push(await local.acquire(u));
    assert.deepEqual(
      answers.map((d) => [d.verdict, d.source]),
      [
        [Verdict.Allowed, Source.Local],
        [Verdict.Allowed, Source.Local],
        [Verdict.Allowed, Source.Local],
        [Verdict.RateLimited, Source.Local],
        [Verdict.RateLimited, Source.Local],
      ],
      "10 - 7 = 3 were left",
    );
    const denied = answers[3]!;
    assert.ok(denied.retryAfterMs > 0, `${denied.retryAfterMs}`);
    assert.equal(denied.limits[0]?.exceeded, true);
    assert.match(denied.reason, /decided locally/);
    const stranger = await local.acquire({ resource: "f.api", descriptors: { user: "never-asked" } });
    assert.deepEqual([stranger.verdict, stranger.source], [Verdict.Allowed, Source.Local], "a question never answered is allowed");

    const pool = [];
    for (let i = 0; i < 3; i++) pool.push(await local.acquire({ resource: "f.pool" }));
    assert.deepEqual(
      pool.map((d) => d.verdict),
      [Verdict.Allowed, Verdict.Allowed, Verdict.ConcurrencyLimited],
    );
    assert.ok(pool[0]!.permit && pool[1]!.permit, "local permits hold local slots");
    pool[0]!.permit!.report(Outcome.Success);
    assert.equal((await local.acquire({ resource: "f.pool" })).verdict, Verdict.Allowed, "a reported local permit frees its slot");
    assert.ok(local.stats().decidedLocally >= 9);

    await server.startProcess();
    await reconnected(local, "the local client");
    const back = await local.acquire(u);
    assert.deepEqual([back.verdict, back.source, back.limits[0]?.remaining], [Verdict.Allowed, Source.Server, 9]);
  });
});
