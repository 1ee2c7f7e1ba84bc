// HTTP: the rate limit response fields (the IETF `RateLimit` and
// `RateLimit-Policy` of draft-ietf-httpapi-ratelimit-headers, the older
// `X-RateLimit-Limit/-Remaining/-Reset`, and `Retry-After`) exactly as the
// Rust crate's http layer writes them, and a middleware for Node's `http`,
// Express, Connect, and Fastify (through its raw request and reply).

import type { IncomingMessage, ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";

import type { Client } from "./client.js";
import type { Decision } from "./decision.js";
import { InvalidArgumentError } from "./errors.js";
import { Outcome, Verdict, type AcquireRequest, type Priority } from "./types.js";

/** Whole seconds, rounded up (as the Rust crate's `secs`). */
function secs(ms: number): number {
  return Math.ceil(Math.max(0, ms) / 1000);
}

/** A value Node would refuse in a header (it is left out, as Rust's HeaderValue refuses it). */
function invalidHeaderValue(v: string): boolean {
  return /[^\t\x20-\x7e\x80-\xff]/.test(v);
}

/**
 * The rate limit fields of `d`, by lower-case name: `ratelimit-policy` (every
 * limit: `"per-user";q=10;w=60`), `ratelimit` and `x-ratelimit-limit`,
 * `-remaining`, `-reset` (the tightest limit: `"per-user";r=0;t=30`), and
 * `retry-after` (seconds, at least 1) when denied.
 */
export function rateLimitHeaders(d: Decision): Record<string, string> {
  const h: Record<string, string> = {};
  const put = (name: string, value: string) => {
    if (!invalidHeaderValue(value)) h[name] = value;
  };
  if (d.limits.length > 0) {
    put("ratelimit-policy", d.limits.map((l) => {
      const [quota, window] = policy(l.limit, l.windowMs);
      return `"${l.name}";q=${quota};w=${window}`;
    }).join(", "));
  }
  const l = d.tightest();
  if (l) {
    // A denied call's limit resets no sooner than the call may be tried
    // again: a local decision knows the retry time but not the reset time.
    const reset = d.allowed ? secs(l.resetAfterMs) : Math.max(secs(l.resetAfterMs), Math.max(secs(d.retryAfterMs), 1));
    put("ratelimit", `"${l.name}";r=${l.remaining};t=${reset}`);
    put("x-ratelimit-limit", String(l.limit));
    put("x-ratelimit-remaining", String(l.remaining));
    put("x-ratelimit-reset", String(reset));
  }
  if (!d.allowed) put("retry-after", String(Math.max(secs(d.retryAfterMs), 1)));
  return h;
}

/**
 * A limit's quota and window as `RateLimit-Policy` writes them: the window in
 * whole seconds, the quota scaled to it (GCRA 500/s with a burst of 100
 * reports 100 per 0.2 s, which is 500 per second, not 100).
 */
function policy(limit: number, windowMs: number): [number, number] {
  const whole = Math.max(secs(windowMs), 1);
  if (windowMs <= 0 || windowMs === whole * 1000) return [limit, whole];
  return [Math.floor((limit * whole * 1000) / windowMs), whole];
}

/** 429 for rate and concurrency limits, 503 for an open circuit or shedding. */
export function denialStatus(v: Verdict): number {
  return v === Verdict.RateLimited || v === Verdict.ConcurrencyLimited ? 429 : 503;
}

/** The small JSON body of a denial: `{"error":"rate_limited","reason":"...","retry_after_seconds":2}`. */
export function denialBody(d: Decision): string {
  return JSON.stringify({
    error: d.verdict.toLowerCase(),
    reason: d.reason,
    retry_after_seconds: Math.max(secs(d.retryAfterMs), 1),
  });
}

/** Express's `next`. */
export type NextFunction = (err?: unknown) => void;

export interface RateLimitOptions<Req extends IncomingMessage = IncomingMessage> {
  /**
   * The resource a request is asked under, e.g. `"api"` or
   * `(req) => \`${req.method} /orders/:id\``; null or undefined lets the
   * request through unasked (health checks).
   */
  resource: string | ((req: Req) => string | null | undefined);
  /** The request's descriptors; entries whose value is undefined are left out. */
  descriptors?: (req: Req) => Readonly<Record<string, string | undefined>> | null | undefined;
  /** Each request's cost (default 1). */
  cost?: number | ((req: Req) => number);
  /** Each request's priority (default CRITICAL). */
  priority?: Priority | ((req: Req) => Priority);
  /** How a response's status is reported (default: 5xx is FAILURE, anything else SUCCESS). */
  classify?: (status: number) => Outcome;
  /**
   * Answers a denied request instead of the JSON default; the rate limit
   * fields and Retry-After are already set on `res`.
   */
  onDenied?: (decision: Decision, req: Req, res: ServerResponse) => void;
  /**
   * Told when Floodgate refused the question as bad input (the request is
   * then served unprotected); by default a process warning.
   */
  onError?: (error: Error, req: Req) => void;
}

/** A `(req, res, next)` middleware that also returns a promise (settled once it has answered or called next). */
export type RateLimitMiddleware<Req extends IncomingMessage = IncomingMessage> = (
  req: Req,
  res: ServerResponse,
  next: NextFunction,
) => Promise<void>;

/** The default classifier: 5xx is a failure. */
export function classifyStatus(status: number): Outcome {
  return status >= 500 && status <= 599 ? Outcome.Failure : Outcome.Success;
}

/**
 * Protects every request with Floodgate: denied requests are answered 429
 * (rate or concurrency limited) or 503 (circuit open, shed) with
 * Retry-After, the rate limit fields and a JSON body; allowed ones get the
 * rate limit fields and go on to `next()`, and their permit is reported from
 * the response's status when it finishes (5xx: FAILURE), or as cancelled
 * when the connection closes first.
 *
 * ```ts
 * app.use(rateLimit(client, { resource: "api", descriptors: (req) => ({ tenant: req.headers["x-tenant"] as string }) }));
 * // Fastify: fastify.addHook("onRequest", (req, reply, done) => mw(req.raw, reply.raw, done));
 * ```
 */
export function rateLimit<Req extends IncomingMessage = IncomingMessage>(
  client: Client,
  options: RateLimitOptions<Req>,
): RateLimitMiddleware<Req> {
  const classify = options.classify ?? classifyStatus;
  return async (req, res, next) => {
    let ask: AcquireRequest;
    try {
      const resource = typeof options.resource === "function" ? options.resource(req) : options.resource;
      if (resource === null || resource === undefined) return next();
      const descriptors: Record<string, string> = {};
      for (const [k, v] of Object.entries(options.descriptors?.(req) ?? {})) if (v !== undefined) descriptors[k] = v;
      ask = {
        resource,
        descriptors,
        cost: typeof options.cost === "function" ? options.cost(req) : options.cost,
        priority: typeof options.priority === "function" ? options.priority(req) : options.priority,
      };
    } catch (e) {
      return next(e);
    }
    let decision: Decision;
    try {
      decision = await client.acquire(ask);
    } catch (e) {
      if (e instanceof InvalidArgumentError) {
        // Bad input (say, an over-long header value): serve unprotected, loudly.
        if (options.onError) options.onError(e, req);
        else process.emitWarning(`Floodgate refused the question for '${ask.resource}': ${e.details}; serving anyway`, "FloodgateWarning");
        return next();
      }
      return next(e);
    }
    const headers = rateLimitHeaders(decision);
    if (!decision.allowed) {
      for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
      if (options.onDenied) {
        try {
          options.onDenied(decision, req, res);
        } catch (e) {
          return next(e);
        }
        return;
      }
      res.statusCode = denialStatus(decision.verdict);
      res.setHeader("content-type", "application/json");
      res.end(denialBody(decision));
      return;
    }
    if (!res.headersSent) for (const [k, v] of Object.entries(headers)) res.setHeader(k, v);
    if (decision.waitMs > 0) await new Promise((r) => setTimeout(r, decision.waitMs));
    const permit = decision.permit;
    if (permit) {
      const start = performance.now();
      res.once("finish", () => {
        permit.report(classify(res.statusCode), performance.now() - start);
      });
      // Closed before the response finished (the client hung up): cancelled.
      res.once("close", () => {
        if (!res.writableFinished) permit.cancel();
      });
    }
    next();
  };
}
