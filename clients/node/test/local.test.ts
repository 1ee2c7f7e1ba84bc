// The local fail mode, as the Rust crate's local.rs tests it.

import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import { test } from "node:test";

import { LocalLimits, Outcome, Permit, Source, Verdict, questionKey, type Decision, type Limit } from "../dist/index.js";

function local(share: number): LocalLimits {
  return new LocalLimits(share, (sink, resource) =>
    new Permit({ id: "", resource, issued: performance.now(), endpoint: -1, urgent: false, onDrop: Outcome.Ignored, sink, open: null }),
  );
}

const MINUTE = 60_000;
function limit(name: string, l: number, windowMs: number, remaining: number): Limit {
  return { name, limit: l, remaining, resetAfterMs: 0, retryAfterMs: 0, windowMs, exceeded: false, admittedOverLimit: false };
}

test("a share of the last known limit is enforced locally, from what was left", () => {
  const l = local(0.5);
  const key = questionKey("work", { tenant: "acme" });
  assert.equal(l.decide(key, "work", 1).verdict, Verdict.Allowed, "nothing known: allowed");
  l.learn(key, "work", Verdict.Allowed, [limit("per-tenant", 20, MINUTE, 20)], 0);
  const admitted = Array.from({ length: 30 }, () => l.decide(key, "work", 1)).filter((d) => d.allowed).length;
  assert.equal(admitted, 10, "half of 20 per minute");
  const denied = l.decide(key, "work", 1);
  assert.equal(denied.verdict, Verdict.RateLimited);
  assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 6000, `${denied.retryAfterMs}`);
  assert.equal(denied.source, Source.Local);
  assert.equal(denied.limits[0]?.exceeded, true);
  // The server said 4 are left: 2 at this share, not a full bucket.
  l.learn(key, "work", Verdict.Allowed, [limit("per-tenant", 20, MINUTE, 4)], 0);
  const again = Array.from({ length: 30 }, () => l.decide(key, "work", 1)).filter((d) => d.allowed).length;
  assert.equal(again, 2);
});

test("a denial before the limits does not erase them", () => {
  const l = local(1.0);
  const key = questionKey("work", { user: "u" });
  l.learn(key, "work", Verdict.Allowed, [limit("per-user", 10, 10_000, 9)], 5);
  // As the server answers them: a concurrency denial names no limit, nor do an open breaker or shedding.
  l.learn(key, "work", Verdict.ConcurrencyLimited, [], 5);
  l.learn(key, "work", Verdict.CircuitOpen, [], 0);
  l.learn(key, "work", Verdict.Shed, [], 0);
  const held: Decision[] = Array.from({ length: 15 }, () => l.decide(key, "work", 1));
  assert.equal(held.filter((d) => d.allowed).length, 5, "the concurrency limit still applies");
  for (const d of held) d.permit?.report(Outcome.Success);
  const admitted = Array.from({ length: 15 }, () => l.decide(key, "work", 1)).filter((d) => d.allowed).length;
  assert.equal(admitted, 9 - 5, "and the 9 left: 5 were taken, 4 remain");
});

test("the concurrency limit applies at the share, and a reported permit frees its slot", () => {
  const l = local(0.5);
  const key = questionKey("db", {});
  l.learn(key, "db", Verdict.Allowed, [], 5);
  const held = Array.from({ length: 20 }, () => l.decide(key, "db", 1));
  assert.equal(held.filter((d) => d.allowed).length, 2, "half of 5, rounded down");
  const denied = held.find((d) => !d.allowed)!;
  assert.equal(denied.verdict, Verdict.ConcurrencyLimited);
  assert.equal(denied.retryAfterMs, 10);
  assert.match(denied.reason, /concurrency limited at 2 in flight \(decided locally/);
  assert.equal(l.decide(key, "db", 1).allowed, false);
  held[0]!.permit!.report(Outcome.Success);
  assert.equal(l.decide(key, "db", 1).allowed, true, "the slot came back");
  held[1]!.permit!.cancel();
  assert.equal(l.decide(key, "db", 1).allowed, true, "a cancelled permit frees it too");
});

test("a bucket never holds more than the share of the limit, and refills at its rate", () => {
  const l = local(1.0);
  const key = questionKey("fast", {});
  // 10 per 100 ms; the server said 50 are left (it cannot: capped at 10).
  const learned = performance.now();
  l.learn(key, "fast", Verdict.Allowed, [limit("burst", 10, 100, 50)], 0);
  const first = Array.from({ length: 20 }, () => l.decide(key, "fast", 1)).filter((d) => d.allowed).length;
  assert.ok(first >= 10 && first <= 11, `${first}: 10, and at most one refilled meanwhile`);
  const start = performance.now();
  while (performance.now() - start < 30) {
    // 30 ms on the bucket's own clock: about 3 tokens at 10 per 100 ms
  }
  const later = Array.from({ length: 20 }, () => l.decide(key, "fast", 1)).filter((d) => d.allowed).length;
  const most = Math.ceil((performance.now() - learned) / 10);
  assert.ok(later >= 2 && first + later <= 10 + most, `refilled ${later} (at most ${most} in all)`);
});

test("the key is the resource and its sorted descriptors, unambiguously", () => {
  assert.equal(questionKey("r", { b: "2", a: "1" }), questionKey("r", { a: "1", b: "2" }));
  assert.notEqual(questionKey("r", { a: "1", b: "2" }), questionKey("r", { a: "1" }));
  assert.notEqual(questionKey("r", { user: "x", org: "1\u001fuser=x" }), questionKey("r", { org: "1", user: "x\u001fuser=x" }));
  assert.equal(questionKey("orders", { user: "ann" }), "6:orders4:user3:ann");
  assert.ok(questionKey("x".repeat(1234), {}).startsWith("1234:x"));
  assert.notEqual(questionKey("r", { a: "1:b" }), questionKey("r", { a: "1", b: "" }));
  assert.equal(questionKey("é", {}), "2:é", "lengths in UTF-8 bytes, as in Rust");
});
