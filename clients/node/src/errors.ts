// The client's errors: only what a caller can act on. A server that cannot
// be reached is not an error for `acquire`: the fail mode answers.

import type { Decision } from "./decision.js";
import type { Verdict } from "./types.js";

/** Every error this package throws is one of these. */
export class FloodgateError extends Error {
  /** The gRPC status code, when the error is the server's answer. */
  readonly code: number | undefined;

  constructor(message: string, options?: { code?: number; cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "FloodgateError";
    this.code = options?.code;
  }
}

/**
 * The server refused the request as bad input (INVALID_ARGUMENT); nothing
 * was changed or consumed. `details` is the server's message, naming the
 * field and the value (`resource: must not be empty`); `field` is the part
 * before its first colon.
 */
export class InvalidArgumentError extends FloodgateError {
  readonly details: string;
  readonly field: string;

  constructor(details: string) {
    super(`invalid argument: ${details}`, { code: 3 });
    this.name = "InvalidArgumentError";
    this.details = details;
    const colon = details.indexOf(":");
    this.field = colon > 0 ? details.slice(0, colon) : "";
  }
}

/**
 * No server answered a call that has no fail mode (a report sent with
 * `Client.report`): UNAVAILABLE, DEADLINE_EXCEEDED, or no answer in time.
 */
export class UnavailableError extends FloodgateError {
  constructor(message: string, options?: { code?: number; cause?: unknown }) {
    super(message, options);
    this.name = "UnavailableError";
  }
}

/** Floodgate said no (thrown by `Client.guard` without a fallback). */
export class DeniedError extends FloodgateError {
  readonly verdict: Verdict;
  /** When trying again can succeed, in milliseconds. */
  readonly retryAfterMs: number;
  /** One human line naming the limit or breaker. */
  readonly reason: string;
  /** The whole decision (limits, source...). */
  readonly decision: Decision;

  constructor(decision: Decision) {
    super(`denied: ${decision.reason}`);
    this.name = "DeniedError";
    this.verdict = decision.verdict;
    this.retryAfterMs = decision.retryAfterMs;
    this.reason = decision.reason;
    this.decision = decision;
  }
}
