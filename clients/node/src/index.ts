// @floodgate/client: ask Floodgate before calling something, report after,
// and fall back gracefully when denied or when the server is gone.

export { Client } from "./client.js";
export type {
  CallResult,
  ClientOptions,
  GuardCause,
  GuardOptions,
  ReportRequest,
  ReportResult,
  TlsOptions,
} from "./client.js";
export { Decision } from "./decision.js";
export type { DecisionInit } from "./decision.js";
export { DeniedError, FloodgateError, InvalidArgumentError, UnavailableError } from "./errors.js";
export {
  classifyStatus,
  denialBody,
  denialStatus,
  rateLimit,
  rateLimitHeaders,
} from "./http.js";
export type { NextFunction, RateLimitMiddleware, RateLimitOptions } from "./http.js";
export { LocalLimits, questionKey } from "./local.js";
export { Metered } from "./metered.js";
export type { LocalPermitFactory } from "./local.js";
export { Permit } from "./permit.js";
export type { PermitSink, PermitState } from "./permit.js";
export { PROTO_DIR } from "./proto.js";
export type { Stats } from "./stats.js";
export { BreakerState, FailMode, Outcome, Priority, Source, Verdict } from "./types.js";
export type { AcquireRequest, Limit } from "./types.js";
export type * as wire from "./wire.js";
