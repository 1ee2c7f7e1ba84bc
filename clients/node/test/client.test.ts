// The client against the real binary: decisions and limits, batches, bad
// input, permits that report themselves, the guard opening a breaker, and a
// limit lowered through the rules file.

import assert from "node:assert/strict";
import * as v8 from "node:v8";
import * as vm from "node:vm";
import { after, before, describe, test } from "node:test";

import {
  BreakerState,
  Client,
  DeniedError,
  InvalidArgumentError,
  Outcome,
  Source,
  Verdict,
  type Decision,
} from "../dist/index.js";
import { FloodgateServer, pollUntil } from "./server.js";

const RULES = `
resources:
  - name: t.api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 3, window: 1m }
  - name: t.pool
    concurrency: { max_in_flight: 2 }
  - name: t.gc
    concurrency: { max_in_flight: 1 }
  - name: t.close
    concurrency: { max_in_flight: 1 }
  - name: t.db
    breaker:
      failure_rate_threshold: 0.5
      window: { kind: count, size: 4 }
      minimum_calls: 4
      wait_in_open: 30s
      half_open_calls: 1
  - name: t.classified
    breaker:
      failure_rate_threshold: 0.5
      window: { kind: count, size: 4 }
      minimum_calls: 4
      wait_in_open: 30s
      half_open_calls: 1
`;

let server: FloodgateServer;
let client: Client;

before(async () => {
  server = await FloodgateServer.start(RULES);
  // Generous: the server answers in about a millisecond; the machine may be busy.
  client = new Client(server.url, { requestTimeoutMs: 2000 });
});

after(async () => {
  await client?.close();
  await server?.dispose();
});

const api = (user: string) => ({ resource: "t.api", descriptors: { user } });

describe("decisions", () => {
  test("allowed until the limit, then RATE_LIMITED with the limit's state", async () => {
    const answers: Decision[] = [];
    for (let i = 0; i < 4; i++) answers.push(await client.acquire(api("alice")));
    assert.deepEqual(
      answers.map((d) => d.verdict),
      [Verdict.Allowed, Verdict.Allowed, Verdict.Allowed, Verdict.RateLimited],
    );
    assert.ok(answers.every((d) => d.source === Source.Server));
    assert.deepEqual(
      answers.map((d) => d.limits[0]?.remaining),
      [2, 1, 0, 0],
    );
    const first = answers[0]!;
    assert.equal(first.allowed, true);
    assert.equal(first.permit, null, "no breaker nor concurrency limit: no permit");
    assert.equal(first.limits[0]?.name, "per-user");
    assert.equal(first.limits[0]?.limit, 3);
    assert.equal(first.limits[0]?.windowMs, 60_000);
    assert.ok(first.limits[0]!.resetAfterMs > 0 && first.limits[0]!.resetAfterMs <= 60_000);
    const denied = answers[3]!;
    assert.equal(denied.allowed, false);
    assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 60_000, `retry after ${denied.retryAfterMs}`);
    assert.match(denied.reason, /per-user/);
    assert.equal(denied.limits[0]?.exceeded, true);
    assert.equal(denied.tightest()?.name, "per-user");
    // Another user has a bucket of their own.
    assert.equal((await client.acquire(api("bob"))).verdict, Verdict.Allowed);
  });

  test("a dry run consumes nothing; a cost takes that many", async () => {
    for (let i = 0; i < 5; i++) {
      const d = await client.acquire({ ...api("dry"), dryRun: true });
      assert.equal(d.verdict, Verdict.Allowed);
    }
    const d = await client.acquire({ ...api("dry"), cost: 2 });
    assert.equal(d.limits[0]?.remaining, 1, "3 - 2");
    assert.equal((await client.acquire({ ...api("dry"), cost: 2 })).verdict, Verdict.RateLimited);
  });

  test("a resource no rule matches is allowed with no limits", async () => {
    const d = await client.acquire({ resource: "t.nothing" });
    assert.equal(d.verdict, Verdict.Allowed);
    assert.deepEqual(d.limits, []);
    assert.equal(d.breakerState, null);
    assert.equal(d.source, Source.Server);
  });

  test("a batch is answered in order; one bad item refuses it whole, naming the item", async () => {
    const asks = [api("batch"), { resource: "t.nothing" }, api("batch"), api("batch"), api("batch")];
    const answers = await client.acquireBatch(asks);
    assert.deepEqual(
      answers.map((d) => d.verdict),
      [Verdict.Allowed, Verdict.Allowed, Verdict.Allowed, Verdict.Allowed, Verdict.RateLimited],
    );
    const bad = await client.acquireBatch([api("batch2"), { resource: "" }]).catch((e: unknown) => e);
    assert.ok(bad instanceof InvalidArgumentError, String(bad));
    assert.match(bad.details, /^requests\[1\]\.resource: /);
    assert.equal(bad.field, "requests[1].resource");
    const after = await client.acquire(api("batch2"));
    assert.equal(after.limits[0]?.remaining, 2, "nothing of the refused batch was taken");
  });

  test("bad input is an InvalidArgumentError naming the field and value, never a denial", async () => {
    const empty = await client.acquire({ resource: "" }).catch((e: unknown) => e);
    assert.ok(empty instanceof InvalidArgumentError, String(empty));
    assert.equal(empty.field, "resource");
    assert.equal(empty.details, "resource: must not be empty");
    assert.equal(empty.code, 3);
    const long = await client.acquire({ resource: "x".repeat(300) }).catch((e: unknown) => e);
    assert.ok(long instanceof InvalidArgumentError && long.field === "resource", String(long));
    const cost = await client.acquire({ ...api("carol"), cost: 500 }).catch((e: unknown) => e);
    assert.ok(cost instanceof InvalidArgumentError, String(cost));
    assert.match(cost.details, /cost 500 exceeds capacity 3 of limit 'per-user'/);
    const local = await client.acquire({ ...api("carol"), cost: 1.5 }).catch((e: unknown) => e);
    assert.ok(local instanceof InvalidArgumentError && local.field === "cost", String(local));
    // The guard does not fall back on bad input: it is a bug, not a denial.
    const guarded = await client
      .guard({ resource: "" }, () => "ran", { fallback: () => "fallback" })
      .catch((e: unknown) => e);
    assert.ok(guarded instanceof InvalidArgumentError);
  });
});

describe("permits", () => {
  test("a reported permit frees its concurrency slot", async () => {
    const a = await client.acquire({ resource: "t.pool" });
    const b = await client.acquire({ resource: "t.pool" });
    assert.ok(a.permit && b.permit, "permits for a resource with a concurrency limit");
    assert.equal(a.maxInFlight, 2);
    assert.match(a.permit.id, /^[0-9a-f]{32}$/);
    const c = await client.acquire({ resource: "t.pool" });
    assert.equal(c.verdict, Verdict.ConcurrencyLimited);
    assert.equal(c.permit, null);
    assert.ok(c.retryAfterMs > 0);
    assert.equal(a.permit.report(Outcome.Success), true);
    assert.equal(a.permit.reported, true);
    assert.equal(a.permit.report(Outcome.Failure), false, "only the first report counts");
    const d = await pollUntil("the slot to come back", async () => {
      const d = await client.acquire({ resource: "t.pool" });
      return d.allowed ? d : undefined;
    });
    d.permit!.report(Outcome.Ignored);
    b.permit.report(Outcome.Success, 12);
    await client.flush();
    const stats = client.stats();
    assert.ok(stats.reportsCounted >= 3, JSON.stringify(stats));
    assert.equal(stats.reportsDropped, 0);
  });

  test("a permit collected unreported reports itself (FinalizationRegistry)", async () => {
    v8.setFlagsFromString("--expose-gc");
    const gc = vm.runInNewContext("gc") as () => void;
    const take = async () => {
      const d = await client.acquire({ resource: "t.gc" });
      assert.ok(d.permit, "a permit");
      assert.equal(d.permit.dropOutcome, Outcome.Ignored, "no breaker: cancelled calls are IGNORED");
      // dropped here, unreported
    };
    await take();
    assert.equal((await client.acquire({ resource: "t.gc" })).verdict, Verdict.ConcurrencyLimited);
    await pollUntil("the collected permit to give its slot back", async () => {
      gc();
      const d = await client.acquire({ resource: "t.gc" });
      if (!d.allowed) return undefined;
      d.permit!.report(Outcome.Success);
      return true;
    });
  });

  test("closing a client reports its unreported permits IGNORED", async () => {
    const other = new Client(server.url, { requestTimeoutMs: 2000 });
    const held = await other.acquire({ resource: "t.close" });
    assert.ok(held.permit);
    assert.equal((await client.acquire({ resource: "t.close" })).verdict, Verdict.ConcurrencyLimited);
    await other.close();
    assert.equal(held.permit.reported, true);
    assert.equal(other.stats().reportsCounted, 1);
    const d = await client.acquire({ resource: "t.close" });
    assert.equal(d.verdict, Verdict.Allowed, "the slot was given back at close");
    d.permit!.report(Outcome.Success);
    await assert.rejects(other.acquire({ resource: "t.close" }), /closed/);
  });

  test("a detached permit is reported with Client.report", async () => {
    const d = await client.acquire({ resource: "t.pool" });
    const id = d.permit!.detach();
    assert.equal(d.permit!.reported, true);
    const first = await client.report({ permitId: id, resource: "t.pool", outcome: Outcome.Success, latencyMs: 5 });
    assert.deepEqual(first, { counted: true, breakerState: null, settled: false });
    const again = await client.report({ permitId: id, outcome: Outcome.Success });
    assert.equal(again.counted, false, "already reported");
    const bad = await client.report({ permitId: "not-a-permit", outcome: Outcome.Success }).catch((e: unknown) => e);
    assert.ok(bad instanceof InvalidArgumentError, String(bad));
    assert.match(bad.details, /permit_id/);
  });
});

describe("guard", () => {
  test("failures reported through the guard open the breaker; then it throws DeniedError", async () => {
    let runs = 0;
    const failing = () =>
      client.guard({ resource: "t.db" }, async () => {
        runs += 1;
        throw new Error("db down");
      });
    for (let i = 0; i < 4; i++) await assert.rejects(failing(), /db down/, "the call's own error");
    const denied = await pollUntil("the breaker to open", async () => {
      const e = await failing().catch((e: unknown) => e);
      return e instanceof DeniedError ? e : undefined;
    });
    const ranBefore = runs;
    assert.equal(denied.verdict, Verdict.CircuitOpen);
    assert.ok(denied.retryAfterMs > 20_000 && denied.retryAfterMs <= 30_000, `${denied.retryAfterMs}`);
    assert.match(denied.reason, /t\.db/);
    assert.equal(denied.decision.breakerState, BreakerState.Open);
    assert.match(denied.message, /^denied: /);
    await assert.rejects(failing(), DeniedError);
    assert.equal(runs, ranBefore, "a denied call never runs");
    // With a fallback, the cause says why.
    const served = await client.guard({ resource: "t.db" }, () => "fresh", {
      fallback: (cause) => (cause.kind === "denied" ? `busy, retry in ${Math.ceil(cause.error.retryAfterMs / 1000)} s` : "failed"),
    });
    assert.match(served, /^busy, retry in \d+ s$/);
  });

  test("a classifier decides what counts as a failure; a fallback serves failed calls", async () => {
    class NotFound extends Error {}
    for (let i = 0; i < 8; i++) {
      const v = await client.guard(
        { resource: "t.classified" },
        async (): Promise<string> => {
          throw new NotFound("404");
        },
        {
          classify: (r) => (r.ok || r.error instanceof NotFound ? Outcome.Success : Outcome.Failure),
          fallback: (cause) => (cause.kind === "failed" && cause.error instanceof NotFound ? "not found" : "other"),
        },
      );
      assert.equal(v, "not found");
    }
    await client.flush();
    const d = await client.acquire({ resource: "t.classified" });
    assert.equal(d.verdict, Verdict.Allowed, "8 calls classified SUCCESS: the breaker stays closed");
    assert.equal(d.breakerState, BreakerState.Closed);
    d.permit!.report(Outcome.Success);
    assert.equal(await client.guard({ resource: "t.classified" }, () => 42), 42);
  });
});

describe("rules reload", () => {
  test("a limit lowered in the rules file is in force once the server reloads it", async () => {
    assert.equal((await client.acquire({ ...api("reload"), dryRun: true })).limits[0]?.limit, 3);
    server.writeRules(RULES.replace("limit: 3,", "limit: 1,"));
    await pollUntil("the server to reload the rules", async () => {
      const d = await client.acquire({ ...api("reload-probe"), dryRun: true });
      return d.limits[0]?.limit === 1;
    });
    const answers = [await client.acquire(api("reload")), await client.acquire(api("reload"))];
    assert.deepEqual(
      answers.map((d) => d.verdict),
      [Verdict.Allowed, Verdict.RateLimited],
    );
  });
});

describe("ready", () => {
  test("ready() resolves when the server answered its dry run, which decides nothing", async () => {
    const metrics = async () => (await fetch(`${server.httpUrl}/metrics`)).text();
    const decisions = (page: string) =>
      page
        .split("\n")
        .filter((l) => l.startsWith("floodgate_decisions_total{") && l.includes('resource="_unmatched"'))
        .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
    const before = decisions(await metrics());
    const c = new Client(server.url);
    try {
      assert.equal(await c.ready(), true);
      // The dry run was an Acquire on the wire, not a decision.
      assert.equal(decisions(await metrics()), before);
      const d = await c.acquire({ resource: "t.api", descriptors: { user: "ready" }, timeoutMs: 2000 });
      assert.equal(d.source, Source.Server);
    } finally {
      await c.close();
    }
  });

  test("ready() waits for a server that starts listening after the client was made", async () => {
    const late = await FloodgateServer.start(RULES);
    await late.stop();
    const c = new Client(late.url);
    try {
      const ready = c.ready({ timeoutMs: 20_000 });
      await new Promise((r) => setTimeout(r, 500));
      await late.startProcess();
      assert.equal(await ready, true);
      // And again, at once, now that it answers.
      assert.equal(await c.ready(), true);
    } finally {
      await c.close({ timeoutMs: 500 });
      await late.dispose();
    }
  });

  test("ready() resolves false when no server answers within its timeout", async () => {
    const c = new Client("http://127.0.0.1:1");
    try {
      assert.equal(await c.ready({ timeoutMs: 300 }), false);
    } finally {
      await c.close({ timeoutMs: 100 });
    }
  });
});
