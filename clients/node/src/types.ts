// The public vocabulary: verdicts, breaker states, priorities, outcomes,
// where a decision came from, fail modes and the question itself. Each is a
// frozen object of constants and a string union type of the same name.

/** What a caller may do. */
export const Verdict = {
  Allowed: "ALLOWED",
  RateLimited: "RATE_LIMITED",
  CircuitOpen: "CIRCUIT_OPEN",
  ConcurrencyLimited: "CONCURRENCY_LIMITED",
  Shed: "SHED",
} as const;
export type Verdict = (typeof Verdict)[keyof typeof Verdict];

/** A circuit breaker's state. */
export const BreakerState = {
  Closed: "CLOSED",
  Open: "OPEN",
  HalfOpen: "HALF_OPEN",
  ForcedOpen: "FORCED_OPEN",
  Disabled: "DISABLED",
  MetricsOnly: "METRICS_ONLY",
} as const;
export type BreakerState = (typeof BreakerState)[keyof typeof BreakerState];

/**
 * How much a request matters when its system sheds load: by default level 1
 * sheds SHEDDABLE, 2 also SHEDDABLE_PLUS, 3 everything but CRITICAL_PLUS.
 */
export const Priority = {
  CriticalPlus: "CRITICAL_PLUS",
  Critical: "CRITICAL",
  SheddablePlus: "SHEDDABLE_PLUS",
  Sheddable: "SHEDDABLE",
} as const;
export type Priority = (typeof Priority)[keyof typeof Priority];

/** How an admitted call went. */
export const Outcome = {
  Success: "SUCCESS",
  /** Counts against the breaker. */
  Failure: "FAILURE",
  /** Neither: frees the permit's slot, not counted by the breaker. */
  Ignored: "IGNORED",
} as const;
export type Outcome = (typeof Outcome)[keyof typeof Outcome];

/** Where a decision came from. */
export const Source = {
  /** The Floodgate server. */
  Server: "server",
  /** No server could be reached and the client fails open. */
  FailOpen: "failOpen",
  /** No server could be reached and the client fails closed. */
  FailClosed: "failClosed",
  /**
   * No server could be reached and the client decided by itself, at its
   * share of the limits the server last reported.
   */
  Local: "local",
} as const;
export type Source = (typeof Source)[keyof typeof Source];

/** What the client answers when no server can be reached. */
export type FailMode =
  | { readonly kind: "open" }
  | { readonly kind: "closed" }
  | { readonly kind: "local"; readonly share: number };

export const FailMode = {
  /** Admit the call (the default): the service stays up without Floodgate. */
  open: { kind: "open" } as FailMode,
  /** Deny the call: verdict SHED, `retryAfterMs` from `failClosedRetryAfterMs`. */
  closed: { kind: "closed" } as FailMode,
  /**
   * Decide in this process at `share` (0 < share <= 1) of the limits the
   * server last reported for the same question: a fleet of N clients would
   * use 1/N. A question the server never answered is admitted.
   */
  local(share: number): FailMode {
    return { kind: "local", share };
  },
} as const;

/** One question: may I call `resource`? */
export interface AcquireRequest {
  /** What is protected, e.g. "GET /api/orders/:id". At most 256 bytes. */
  resource: string;
  /** The caller's dimensions ({tenant: "acme", user: "u42"}); at most 32. */
  descriptors?: Readonly<Record<string, string>>;
  /** How much to take from every matched limit (default 1; 0 is read as 1). */
  cost?: number;
  /** Which requests go first when the resource's system sheds load (default CRITICAL). */
  priority?: Priority;
  /** Answer as if deciding, but consume nothing and hand out no permit. */
  dryRun?: boolean;
  /**
   * `cost` is an estimate: the permit's `reportCost` settles what the call
   * really cost. Unsettled, the estimate stands.
   */
  settle?: boolean;
  /**
   * Usage the call expects, by field ({input_tokens: 812}): each matched
   * limit with a `cost` formula takes what its formula gives for it. Each
   * value a whole number from 0 to 4294967295.
   */
  usage?: Readonly<Record<string, number>>;
  /**
   * For `charge`: names the charge, so that it can be sent again safely (a
   * charge whose key was seen before takes nothing). Default: a fresh key
   * for each charge. At most 128 bytes.
   */
  idempotencyKey?: string;
  /** This call's deadline, instead of the client's `requestTimeoutMs`. */
  timeoutMs?: number;
}

/** One matched limit after the decision. Durations are in milliseconds. */
export interface Limit {
  readonly name: string;
  /** What the limit holds when full. */
  readonly limit: number;
  /** What could still be taken now. */
  readonly remaining: number;
  /** Until the limit is back to its initial (full) state. */
  readonly resetAfterMs: number;
  /** Until this request's cost would fit; 0 when admitted. */
  readonly retryAfterMs: number;
  /** The policy window (for `RateLimit-Policy`). */
  readonly windowMs: number;
  /** The request went over this limit: it was denied, unless `admittedOverLimit` is set. */
  readonly exceeded: boolean;
  /**
   * Over the limit and admitted anyway, as one of the share of calls the
   * limit's `over_limit` admits: the caller should slow down.
   */
  readonly admittedOverLimit: boolean;
}
