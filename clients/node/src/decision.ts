// The answer to an acquire.

import type { Permit } from "./permit.js";
import { BreakerState, Source, Verdict, type Limit } from "./types.js";
import type { WireAcquireResponse, WireBreakerState, WireDuration, WireLimitStatus, WireVerdict } from "./wire.js";

/** What a Decision is made of (every field but `verdict` may be left out). */
export interface DecisionInit {
  verdict: Verdict;
  permit?: Permit | null;
  limits?: readonly Limit[];
  retryAfterMs?: number;
  waitMs?: number;
  breakerState?: BreakerState | null;
  degradationLevel?: number;
  maxInFlight?: number;
  reason?: string;
  paidBy?: string;
  source?: Source;
}

/**
 * The answer to an acquire. A denial is a Decision, not an error.
 * Durations are in milliseconds (fractional when the server's answer is
 * finer than a millisecond).
 */
export class Decision {
  readonly verdict: Verdict;
  /**
   * Present when the resource has a breaker or a concurrency limit and the
   * call was admitted: report the call's outcome with it.
   */
  readonly permit: Permit | null;
  /** One per matched limit, in rule order. */
  readonly limits: readonly Limit[];
  /** When a denied caller may usefully retry; 0 when allowed. */
  readonly retryAfterMs: number;
  /** Shaping: wait this long before proceeding; 0 otherwise. */
  readonly waitMs: number;
  /** The resource's breaker; null when it has none. */
  readonly breakerState: BreakerState | null;
  /** The degradation level of the resource's system, 0 (normal) to 3. */
  readonly degradationLevel: number;
  /** The resource's concurrency limit, when it has one (0 otherwise). */
  readonly maxInFlight: number;
  /** One human line for denials; empty when allowed. */
  readonly reason: string;
  /**
   * When the rule has a waterfall of budgets: the source that paid for an
   * allowed call. Empty when the rule's own limits paid, or when denied.
   */
  readonly paidBy: string;
  /** Where it came from: the server, or the client on its own (fail modes). */
  readonly source: Source;

  /** A decision with these parts; the rest as an empty allowed answer from the server. */
  constructor(init: DecisionInit) {
    this.verdict = init.verdict;
    this.permit = init.permit ?? null;
    this.limits = init.limits ?? [];
    this.retryAfterMs = init.retryAfterMs ?? 0;
    this.waitMs = init.waitMs ?? 0;
    this.breakerState = init.breakerState ?? null;
    this.degradationLevel = init.degradationLevel ?? 0;
    this.maxInFlight = init.maxInFlight ?? 0;
    this.reason = init.reason ?? "";
    this.paidBy = init.paidBy ?? "";
    this.source = init.source ?? Source.Server;
  }

  get allowed(): boolean {
    return this.verdict === Verdict.Allowed;
  }

  /** The limit that matters most to a caller: the one that denied, else the one with the least left. */
  tightest(): Limit | undefined {
    const exceeded = this.limits.find((l) => l.exceeded);
    if (exceeded) return exceeded;
    let least: Limit | undefined;
    for (const l of this.limits) if (!least || l.remaining < least.remaining) least = l;
    return least;
  }

  /** What the client answers when it cannot reach a server and fails open. */
  static failOpen(): Decision {
    return new Decision({ verdict: Verdict.Allowed, source: Source.FailOpen });
  }

  /** ... and when it fails closed: SHED, retry after `retryAfterMs`. */
  static failClosed(retryAfterMs: number): Decision {
    return new Decision({
      verdict: Verdict.Shed,
      retryAfterMs,
      reason: "the rate limit service is unreachable",
      source: Source.FailClosed,
    });
  }

  /** @internal The server's answer; `permit` makes the permit when it sent one. */
  static fromWire(
    r: WireAcquireResponse,
    permit: (id: string, urgent: boolean, breaker: BreakerState | null) => Permit,
  ): Decision {
    const breaker = breakerState(r.breaker_state);
    // A probe in HALF_OPEN and a concurrency slot are waited on: their reports leave at once.
    const urgent = r.holds_slot || breaker === BreakerState.HalfOpen;
    return new Decision({
      verdict: verdict(r.verdict),
      permit: r.permit_id ? permit(r.permit_id, urgent, breaker) : null,
      limits: (r.limits ?? []).map(limitFromWire),
      retryAfterMs: durationMs(r.retry_after),
      waitMs: durationMs(r.wait),
      breakerState: breaker,
      degradationLevel: r.degradation_level ?? 0,
      maxInFlight: r.max_in_flight ?? 0,
      reason: r.reason ?? "",
      paidBy: r.paid_by ?? "",
      source: Source.Server,
    });
  }
}

/** @internal */
export function limitFromWire(l: WireLimitStatus): Limit {
  return {
    name: l.name,
    limit: Number(l.limit),
    remaining: Number(l.remaining),
    resetAfterMs: durationMs(l.reset_after),
    retryAfterMs: durationMs(l.retry_after),
    windowMs: durationMs(l.window),
    exceeded: l.exceeded,
    admittedOverLimit: Boolean(l.admitted_over_limit),
  };
}

/** @internal A Duration in milliseconds, never negative. */
export function durationMs(d: WireDuration | null | undefined): number {
  if (!d) return 0;
  const seconds = Math.max(0, Number(d.seconds));
  const nanos = Math.max(0, d.nanos);
  return seconds * 1000 + nanos / 1e6;
}

/** @internal Milliseconds as a Duration. */
export function msDuration(ms: number): WireDuration {
  const whole = Math.max(0, ms);
  const seconds = Math.floor(whole / 1000);
  const nanos = Math.min(999_999_999, Math.round((whole - seconds * 1000) * 1e6));
  return { seconds, nanos };
}

function verdict(v: WireVerdict): Verdict {
  switch (v) {
    case "VERDICT_RATE_LIMITED":
      return Verdict.RateLimited;
    case "VERDICT_CIRCUIT_OPEN":
      return Verdict.CircuitOpen;
    case "VERDICT_CONCURRENCY_LIMITED":
      return Verdict.ConcurrencyLimited;
    case "VERDICT_SHED":
      return Verdict.Shed;
    default:
      return Verdict.Allowed;
  }
}

/** @internal */
export function breakerState(s: WireBreakerState): BreakerState | null {
  switch (s) {
    case "BREAKER_STATE_CLOSED":
      return BreakerState.Closed;
    case "BREAKER_STATE_OPEN":
      return BreakerState.Open;
    case "BREAKER_STATE_HALF_OPEN":
      return BreakerState.HalfOpen;
    case "BREAKER_STATE_FORCED_OPEN":
      return BreakerState.ForcedOpen;
    case "BREAKER_STATE_DISABLED":
      return BreakerState.Disabled;
    case "BREAKER_STATE_METRICS_ONLY":
      return BreakerState.MetricsOnly;
    default:
      return null;
  }
}
