// The rate limit fields, exactly as the Rust crate's http/headers.rs writes them.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Decision, Source, Verdict, denialBody, denialStatus, rateLimitHeaders, type Limit } from "../dist/index.js";

function limit(name: string, l: number, windowMs: number, more: Partial<Limit> = {}): Limit {
  return { name, limit: l, remaining: l, resetAfterMs: 0, retryAfterMs: 0, windowMs, exceeded: false, admittedOverLimit: false, ...more };
}

test("a denial: the Rust crate's doc example, field for field", () => {
  const d = new Decision({
    verdict: Verdict.RateLimited,
    retryAfterMs: 1500,
    limits: [limit("per-user", 10, 60_000, { remaining: 0, resetAfterMs: 30_000, exceeded: true, retryAfterMs: 1500 })],
  });
  assert.deepEqual(rateLimitHeaders(d), {
    "ratelimit-policy": '"per-user";q=10;w=60',
    ratelimit: '"per-user";r=0;t=30',
    "x-ratelimit-limit": "10",
    "x-ratelimit-remaining": "0",
    "x-ratelimit-reset": "30",
    "retry-after": "2",
  });
  assert.equal(denialStatus(d.verdict), 429);
  assert.equal(denialBody(d), '{"error":"rate_limited","reason":"","retry_after_seconds":2}');
});

test("allowed: every limit in the policy, the tightest in RateLimit, no Retry-After", () => {
  const d = new Decision({
    verdict: Verdict.Allowed,
    limits: [
      limit("global", 100, 1000, { remaining: 70, resetAfterMs: 300 }),
      limit("per-user", 5, 60_000, { remaining: 2, resetAfterMs: 36_000.000001 }),
      limit("burst", 3, 200, { remaining: 3 }),
    ],
  });
  assert.deepEqual(rateLimitHeaders(d), {
    "ratelimit-policy": '"global";q=100;w=1, "per-user";q=5;w=60, "burst";q=15;w=1',
    ratelimit: '"per-user";r=2;t=37',
    "x-ratelimit-limit": "5",
    "x-ratelimit-remaining": "2",
    "x-ratelimit-reset": "37",
  });
});

test("a window under a second: the quota is said per second (GCRA 500/s, burst 100)", () => {
  const d = new Decision({ verdict: Verdict.Allowed, limits: [limit("gcra", 100, 200)] });
  assert.equal(rateLimitHeaders(d)["ratelimit-policy"], '"gcra";q=500;w=1');
  const odd = new Decision({ verdict: Verdict.Allowed, limits: [limit("odd", 10, 1500)] });
  assert.equal(rateLimitHeaders(odd)["ratelimit-policy"], '"odd";q=13;w=2');
});

test("the exceeded limit wins over the one with the least left", () => {
  const d = new Decision({
    verdict: Verdict.RateLimited,
    retryAfterMs: 20,
    limits: [limit("a", 10, 1000, { remaining: 0 }), limit("b", 10, 1000, { remaining: 4, exceeded: true })],
  });
  assert.equal(d.tightest()?.name, "b");
  // Denied, the reset is no sooner than the retry (at least a second).
  assert.equal(rateLimitHeaders(d)["ratelimit"], '"b";r=4;t=1');
  assert.equal(rateLimitHeaders(d)["retry-after"], "1", "at least a second");
});

test("no limits: only Retry-After when denied; 503 for an open circuit, shedding and failing closed", () => {
  assert.deepEqual(rateLimitHeaders(new Decision({ verdict: Verdict.Allowed })), {});
  const closed = Decision.failClosed(1000);
  assert.equal(closed.source, Source.FailClosed);
  assert.deepEqual(rateLimitHeaders(closed), { "retry-after": "1" });
  assert.equal(denialStatus(Verdict.Shed), 503);
  assert.equal(denialStatus(Verdict.CircuitOpen), 503);
  assert.equal(denialStatus(Verdict.ConcurrencyLimited), 429);
  const open = new Decision({ verdict: Verdict.CircuitOpen, retryAfterMs: 29_000.5, reason: 'breaker "db" is open' });
  assert.equal(denialBody(open), '{"error":"circuit_open","reason":"breaker \\"db\\" is open","retry_after_seconds":30}');
});
