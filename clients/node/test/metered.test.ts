// Charge and metered (streamed) calls against the real binary: a stream
// stops within one chunk of its budget, reservations cannot all pass one
// check, and the settlement gives back what was not used.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, InvalidArgumentError, Outcome } from "../dist/index.js";
import { FloodgateServer } from "./server.js";

const RULES = `
resources:
  - name: llm
    limits:
      - { name: tokens, key: [user], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001 }
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

/** What a dry run of cost 1 says is left (after that 1). */
async function left(user: string): Promise<number> {
  const d = await client.acquire({ resource: "llm", descriptors: { user }, dryRun: true });
  return d.limits[0]!.remaining;
}

test("a stream stops within one chunk of its budget and settles what it used", async () => {
  const short = await client.meter({ resource: "llm", descriptors: { user: "u1" }, cost: 300 });
  assert.ok(short.admitted);
  assert.equal(await left("u1"), 699);
  for (let i = 0; i < 4; i++) assert.equal(await short.add(30), true);
  short.finish(Outcome.Success);
  await client.flush();
  assert.equal(await left("u1"), 879, "1000 - 120, less the dry run's 1");

  const long = await client.meter({ resource: "llm", descriptors: { user: "u1" }, cost: 300 });
  while (await long.add(70)) assert.ok(long.used < 2000, "never stopped");
  assert.ok(long.used >= 880 && long.used < 880 + 70, `stopped after ${long.used} of 880`);
  assert.equal(long.limits[0]?.exceeded, true);
  long.finish(Outcome.Success);
  await assert.rejects(long.add(1), /finished/);
  await assert.rejects(short.add(2 ** 32), RangeError);
});

test("concurrent reservations cannot both pass, and charges refuse bad input", async () => {
  const [first, second] = await Promise.all([
    client.meter({ resource: "llm", descriptors: { user: "u2" }, cost: 600 }),
    client.meter({ resource: "llm", descriptors: { user: "u2" }, cost: 600 }),
  ]);
  assert.equal([first.admitted, second.admitted].filter(Boolean).length, 1, "one of the two fits");
  const admitted = first.admitted ? first : second;
  await admitted.add(100);
  admitted.finish(Outcome.Failure);
  await client.flush();
  assert.equal(await left("u2"), 899);

  const limits = await client.charge({ resource: "llm", descriptors: { user: "u3" }, cost: 1200 });
  assert.equal(limits[0]?.exceeded, true);
  await assert.rejects(client.charge({ resource: "", descriptors: { user: "u3" }, cost: 1 }), InvalidArgumentError);
});
