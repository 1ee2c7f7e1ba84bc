// Costs from usage against the real binary: each limit with a `cost`
// formula takes, and settles at, what its formula gives for the usage a
// call reports; a field the rule does not name is refused.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, InvalidArgumentError, Outcome } from "../dist/index.js";
import { FloodgateServer } from "./server.js";

const RULES = `
resources:
  - name: chat
    usage: [input_tokens, output_tokens]
    limits:
      - { name: calls, key: [tenant], algorithm: fixed_window, limit: 100, window: 1h }
      - { name: input, key: [tenant], algorithm: fixed_window, limit: 10000, window: 1h, cost: input_tokens }
      - { name: output, key: [tenant], algorithm: fixed_window, limit: 5000, window: 1h, cost: output_tokens * 2 }
`;

let server: FloodgateServer;
let client: Client;

before(async () => {
  server = await FloodgateServer.start(RULES);
  client = new Client(server.url, { requestTimeoutMs: 2000 });
});

after(async () => {
  await client?.close();
  await server?.dispose();
});

/** What each limit has left, by a dry run (a formula with no usage takes the request's 1). */
async function left(tenant: string): Promise<number[]> {
  const d = await client.acquire({ resource: "chat", descriptors: { tenant }, dryRun: true });
  return d.limits.map((l) => l.remaining);
}

test("each limit takes and settles its own cost from usage", async () => {
  const usage = { input_tokens: 1200, output_tokens: 1000 };
  const d = await client.acquire({ resource: "chat", descriptors: { tenant: "t1" }, settle: true, usage });
  assert.ok(d.allowed);
  assert.deepEqual(
    d.limits.map((l) => l.remaining),
    [99, 8800, 3000],
  );
  assert.ok(d.permit?.reportUsage(Outcome.Success, { input_tokens: 900, output_tokens: 150 }));
  await client.flush();
  assert.deepEqual(await left("t1"), [98, 9099, 4699]);
  const limits = await client.charge({
    resource: "chat",
    descriptors: { tenant: "t1" },
    cost: 0,
    usage: { output_tokens: 2000 },
  });
  assert.deepEqual(
    limits.map((l) => l.remaining),
    [99, 9100, 700],
  );
});

test("usage the rule does not name, or that is not a whole number, is refused", async () => {
  await assert.rejects(
    client.acquire({ resource: "chat", descriptors: { tenant: "t2" }, usage: { outptu_tokens: 5 } }),
    (e: Error) => e instanceof InvalidArgumentError && /'outptu_tokens' is not a usage field of rule 'chat'/.test(e.message),
  );
  await assert.rejects(
    client.acquire({ resource: "chat", descriptors: { tenant: "t2" }, usage: { input_tokens: 1.5 } }),
    InvalidArgumentError,
  );
  const d = await client.acquire({ resource: "chat", descriptors: { tenant: "t2" }, settle: true });
  assert.throws(() => d.permit?.reportUsage(Outcome.Success, { output_tokens: -1 }), RangeError);
  const r = await client.report({ permitId: d.permit!.detach(), outcome: Outcome.Success, usage: { output_tokens: 10 } });
  assert.ok(r.settled);
  assert.deepEqual(await left("t2"), [98, 9999, 4979]);
});

test("a metered call charges the usage it started with once", async () => {
  const m = await client.meter({ resource: "chat", descriptors: { tenant: "t3" }, cost: 20, usage: { input_tokens: 500 } });
  assert.ok(m.admitted);
  for (let i = 0; i < 5; i++) assert.equal(await m.add(10), true);
  m.finish(Outcome.Success);
  await client.flush();
  // calls: the 50 units used (20 reserved, 30 charged beyond); input: 500
  // once; output: nothing, its formula reads no field the call reported.
  // (The dry run takes 1 from each.)
  assert.deepEqual(await left("t3"), [49, 9499, 4999]);
});

test("a charge sent again with its idempotency key takes nothing", async () => {
  const charge = { resource: "chat", descriptors: { tenant: "t4" }, cost: 0, usage: { input_tokens: 300 }, idempotencyKey: "req-1" };
  await client.charge(charge);
  await client.charge(charge);
  await client.charge({ ...charge, idempotencyKey: undefined });
  await client.charge({ ...charge, idempotencyKey: undefined });
  // 300 once under the key, and twice without one (each gets a fresh key).
  assert.deepEqual(await left("t4"), [99, 9099, 4999]);
});

test("a decision says which waterfall source paid", async () => {
  const rules = `
resources:
  - name: api
    limits:
      - { name: free, key: [tenant], algorithm: fixed_window, limit: 1, window: 1h }
    waterfall:
      - { name: month, key: [tenant], algorithm: fixed_window, limit: 1, calendar: month }
`;
  const own = await FloodgateServer.start(rules);
  const c = new Client(own.url, { requestTimeoutMs: 2000 });
  try {
    const paid = [];
    for (let i = 0; i < 3; i++) {
      const d = await c.acquire({ resource: "api", descriptors: { tenant: "t" } });
      paid.push([d.allowed, d.paidBy, d.limits.map((l) => l.name)]);
    }
    // A denial names no payer and lists every source it asked.
    assert.deepEqual(paid, [
      [true, "", ["free"]],
      [true, "month", ["free", "month"]],
      [false, "", ["free", "month"]],
    ]);
  } finally {
    await c.close();
    await own.dispose();
  }
});
