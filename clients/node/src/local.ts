// FailMode local: while no server can be reached, the client decides in
// this process, at its share of what the server last said: a token bucket
// per limit (so many per window, starting from what the server last said
// was left, times the share: not full), and the resource's concurrency
// limit (its share of `max_in_flight` calls at once). What the server says
// is learned from every answer that looked at the limits; a denial before
// the limits (an open breaker, a concurrency limit, shedding) leaves what
// was learned alone. A question the server never answered has no known
// limit and is allowed. A port of the Rust crate's local.rs.

import { performance } from "node:perf_hooks";

import { Decision } from "./decision.js";
import type { Permit, PermitSink, PermitState } from "./permit.js";
import { Source, Verdict, type Limit, type Outcome } from "./types.js";

/** Questions remembered at most; the least recently asked are forgotten. */
export const MAX_KEYS = 10_000;

interface Bucket {
  name: string;
  /** The server's limit and window: the bucket is remade when they change. */
  limit: number;
  windowMs: number;
  capacity: number;
  perSecond: number;
  tokens: number;
  /** performance.now() of the last refill. */
  at: number;
}

interface Entry {
  buckets: Bucket[];
  used: number;
}

interface InFlight {
  /** This process's share of the resource's max_in_flight (0: none known). */
  cap: number;
  now: number;
}

/**
 * One question's identity: its resource and its descriptors, sorted, each
 * part length-prefixed with its length in UTF-8 bytes (so no value can pass
 * for another's parts): `6:orders4:user3:ann`.
 */
export function questionKey(resource: string, descriptors: Readonly<Record<string, string>> | undefined): string {
  const pairs = Object.entries(descriptors ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  let key = part(resource);
  for (const [k, v] of pairs) key += part(k) + part(v);
  return key;
}

function part(s: string): string {
  return `${Buffer.byteLength(s, "utf8")}:${s}`;
}

function newBucket(l: Limit, share: number, now: number): Bucket {
  const capacity = Math.max(l.limit * share, 1);
  const seconds = Math.max(l.windowMs / 1000, 1e-3);
  return { name: l.name, limit: l.limit, windowMs: l.windowMs, capacity, perSecond: capacity / seconds, tokens: 0, at: now };
}

function refill(b: Bucket, now: number): void {
  const elapsed = Math.max(0, now - b.at) / 1000;
  b.tokens = Math.min(b.tokens + elapsed * b.perSecond, b.capacity);
  b.at = now;
}

/** Milliseconds until `cost` fits. */
function waitFor(b: Bucket, cost: number): number {
  return Math.max((cost - b.tokens) / b.perSecond, 0) * 1000;
}

/** Calls in flight by resource, against the share of its concurrency limit. */
class Slots implements PermitSink {
  readonly byResource = new Map<string, InFlight>();

  learn(resource: string, maxInFlight: number, share: number): void {
    const map = this.byResource;
    if (maxInFlight === 0) {
      const f = map.get(resource);
      if (f && f.now === 0) map.delete(resource);
      else if (f) f.cap = 0;
      return;
    }
    if (!map.has(resource) && map.size >= MAX_KEYS) return;
    const cap = Math.max(Math.floor(maxInFlight * share), 1);
    const f = map.get(resource);
    if (f) f.cap = cap;
    else map.set(resource, { cap, now: 0 });
  }

  /** A slot of `resource` (true), no limit known (false), or all of this process's share in use (the cap). */
  take(resource: string): boolean | { cap: number } {
    const f = this.byResource.get(resource);
    if (f && f.cap > 0 && f.now >= f.cap) return { cap: f.cap };
    if (f && f.cap > 0) {
      f.now += 1;
      return true;
    }
    return false;
  }

  /** A local permit's call ended: its slot is free. */
  sendReport(
    permit: PermitState,
    _outcome: Outcome,
    _latencyMs: number,
    _actualCost: number | undefined,
    _usage?: Record<string, number>,
  ): void {
    this.free(permit.resource);
  }

  free(resource: string): void {
    const f = this.byResource.get(resource);
    if (f) f.now = Math.max(0, f.now - 1);
  }
}

/** Makes a permit that reports to `sink` (the client registers it). */
export type LocalPermitFactory = (sink: PermitSink, resource: string) => Permit;

export class LocalLimits {
  readonly share: number;
  readonly #entries = new Map<string, Entry>();
  readonly #slots = new Slots();
  readonly #permit: LocalPermitFactory;

  constructor(share: number, permit: LocalPermitFactory) {
    this.share = Math.min(Math.max(share, 0), 1);
    this.#permit = permit;
  }

  /** What the server said of a question: its verdict, the limits it looked at and the concurrency limit. */
  learn(key: string, resource: string, verdict: Verdict, limits: readonly Limit[], maxInFlight: number): void {
    // A denial before the limits says nothing of them (nor, for an open
    // breaker or shedding, of the concurrency limit).
    if (verdict === Verdict.Allowed || verdict === Verdict.RateLimited || verdict === Verdict.ConcurrencyLimited) {
      this.#slots.learn(resource, maxInFlight, this.share);
    }
    if (verdict !== Verdict.Allowed && verdict !== Verdict.RateLimited) return;
    const now = performance.now();
    let entry = this.#entries.get(key);
    if (!entry) {
      entry = { buckets: [], used: now };
      this.#entries.set(key, entry);
    }
    entry.used = now;
    const buckets: Bucket[] = [];
    for (const l of limits) {
      const i = entry.buckets.findIndex((b) => b.name === l.name && b.limit === l.limit && b.windowMs === l.windowMs);
      const b = i >= 0 ? entry.buckets.splice(i, 1)[0]! : newBucket(l, this.share, now);
      // What the server said is left, at this process's share.
      b.tokens = Math.min(l.remaining * this.share, b.capacity);
      b.at = now;
      buckets.push(b);
    }
    entry.buckets = buckets;
    if (this.#entries.size > MAX_KEYS) this.#forgetOldest();
  }

  /** A decision in this process: the resource's share of concurrency, and every known limit, all or nothing. */
  decide(key: string, resource: string, cost: number): Decision {
    const slot = this.#slots.take(resource);
    if (typeof slot === "object") {
      return new Decision({
        verdict: Verdict.ConcurrencyLimited,
        retryAfterMs: 10,
        reason: `concurrency limited at ${slot.cap} in flight (decided locally: the rate limit service is unreachable)`,
        source: Source.Local,
      });
    }
    const permit = () => (slot ? this.#permit(this.#slots, resource) : null);
    const now = performance.now();
    const units = Math.max(cost, 1);
    const entry = this.#entries.get(key);
    if (!entry) return new Decision({ verdict: Verdict.Allowed, permit: permit(), source: Source.Local });
    entry.used = now;
    for (const b of entry.buckets) refill(b, now);
    const short = entry.buckets.filter((b) => b.tokens < units);
    const retryAfterMs = short.reduce((m, b) => Math.max(m, waitFor(b, units)), 0);
    const denied = short.length > 0;
    if (!denied) for (const b of entry.buckets) b.tokens -= units;
    const limits: Limit[] = entry.buckets.map((b) => {
      const exceeded = denied && b.tokens < units;
      return {
        name: b.name,
        limit: Math.trunc(b.capacity),
        remaining: Math.trunc(Math.max(b.tokens, 0)),
        resetAfterMs: 0,
        retryAfterMs: exceeded ? waitFor(b, units) : 0,
        windowMs: b.windowMs,
        exceeded,
        admittedOverLimit: false,
      };
    });
    if (denied && slot) {
      // The slot taken goes back: no permit holds it.
      this.#slots.free(resource);
    }
    return new Decision({
      verdict: denied ? Verdict.RateLimited : Verdict.Allowed,
      permit: denied ? null : permit(),
      limits,
      retryAfterMs,
      reason: denied ? "rate limited (decided locally: the rate limit service is unreachable)" : "",
      source: Source.Local,
    });
  }

  #forgetOldest(): void {
    const ages = [...this.#entries].map(([k, e]) => [e.used, k] as const).sort((a, b) => a[0] - b[0]);
    for (const [, k] of ages.slice(0, MAX_KEYS / 10)) this.#entries.delete(k);
  }
}
