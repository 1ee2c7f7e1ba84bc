// The client: ask before calling; the permit it hands out reports after.

import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import * as grpc from "@grpc/grpc-js";

import { Attempt, ServerBreaker } from "./breaker.js";
import { Decision, breakerState, limitFromWire, msDuration } from "./decision.js";
import { DeniedError, FloodgateError, InvalidArgumentError, UnavailableError } from "./errors.js";
import { LocalLimits, questionKey } from "./local.js";
import { Metered } from "./metered.js";
import { Permit, settleAll, usageOf, type PermitSink, type PermitState } from "./permit.js";
import { floodgateStub } from "./proto.js";
import { Reporter } from "./reporter.js";
import { newStats, type Stats } from "./stats.js";
import { BreakerState, FailMode, Outcome, Priority, type AcquireRequest, type Limit } from "./types.js";
import type {
  FloodgateStub,
  UnaryCallback,
  WireAcquireBatchRequest,
  WireAcquireBatchResponse,
  WireAcquireRequest,
  WireAcquireResponse,
  WireChargeRequest,
  WireChargeResponse,
  WireReportOutcomeRequest,
  WireReportOutcomeResponse,
} from "./wire.js";

/** TLS for `https://` endpoints (PEM text or bytes). */
export interface TlsOptions {
  /** The CA to trust for the server's certificate (default: Node's roots). */
  ca?: string | Buffer;
  /** A client certificate chain to present (mTLS), with `key`. */
  cert?: string | Buffer;
  /** The client certificate's private key. */
  key?: string | Buffer;
  /** The name to check the server's certificate against, when not the endpoint's host. */
  serverName?: string;
}

export interface ClientOptions {
  /**
   * The longest an acquire waits for the servers before the fail mode
   * answers (default 25 ms, as the Rust crate); `timeoutMs` of a request
   * overrides it for that call.
   */
  requestTimeoutMs?: number;
  /** What to answer while no server can be reached (default open). */
  failMode?: FailMode | "open" | "closed";
  /** The `retryAfterMs` of a fail-closed denial (default 1000). */
  failClosedRetryAfterMs?: number;
  /**
   * How a permit cancelled or collected unreported is reported. By default
   * FAILURE on a resource with a breaker, IGNORED otherwise.
   */
  cancelledAs?: Outcome;
  /** Reports per batch, 1 to 1000 (default 100). */
  reportBatch?: number;
  /** How long after its first report a batch leaves at the latest (default 10 ms). */
  reportIntervalMs?: number;
  /** TLS settings; `https://` endpoints use TLS (with Node's roots when not given). */
  tls?: TlsOptions;
  /** A bearer token sent with every call (`authorization: Bearer TOKEN`). */
  token?: string;
  /** Extra grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
  /** Told when an endpoint is considered unreachable, and reachable again. */
  onConnectionChange?: (endpoint: string, reachable: boolean, why: string) => void;
}

/** How a guarded call went: its value, or what it threw. */
export type CallResult<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: unknown };

/** Why a guard served its fallback. */
export type GuardCause =
  | { readonly kind: "denied"; readonly decision: Decision; readonly error: DeniedError }
  | { readonly kind: "failed"; readonly error: unknown };

export interface GuardOptions<T> {
  /**
   * What to answer instead of a denied or failed call, given why. Without
   * it, a denial throws DeniedError and a failure rethrows the call's error.
   */
  fallback?: (cause: GuardCause) => T | Promise<T>;
  /**
   * How the call went, from its result. By default a value is SUCCESS and a
   * thrown error (a rejected promise) FAILURE.
   */
  classify?: (result: CallResult<T>) => Outcome;
}

/** What a report sent with `Client.report` did. */
export interface ReportResult {
  /** False for an expired, unknown or already reported permit. */
  readonly counted: boolean;
  /** The resource's breaker after the report; null when it has none. */
  readonly breakerState: BreakerState | null;
  /** An `actualCost` was applied. */
  readonly settled: boolean;
}

/** A report of a permit id obtained some other way (a detached permit). */
export interface ReportRequest {
  permitId: string;
  /** The permit's resource (may be left out). */
  resource?: string;
  outcome: Outcome;
  latencyMs?: number;
  actualCost?: number;
  /** The usage the call really had, by field (limits with a `cost` formula settle at it). */
  usage?: Readonly<Record<string, number>>;
}

type Asked<T> =
  | { readonly kind: "answer"; readonly endpoint: number; readonly value: T }
  | { readonly kind: "badInput"; readonly message: string }
  | { readonly kind: "unreachable"; readonly why: string };

type Call<Req, Res> = (
  stub: FloodgateStub,
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: UnaryCallback<Res>,
) => grpc.ClientUnaryCall;

interface Endpoint {
  readonly url: string;
  readonly stub: FloodgateStub;
  readonly breaker: ServerBreaker;
  readonly reporter: Reporter;
}

/** An answer that comes after the caller stopped waiting may still arrive this long after. */
const ORPHAN_GRACE_MS = 10_000;
/** gRPC status codes that mean the server could not be reached (rather than that it answered). */
const UNREACHABLE = new Set<number>([
  grpc.status.UNAVAILABLE,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.UNKNOWN,
  grpc.status.CANCELLED,
]);

/** The resource of the dry-run Acquire each endpoint gets when the client is made. */
const WARM_UP_RESOURCE = "floodgate.client.warm-up";
/** How long that dry run may take before it is dropped. */
const WARM_UP_TIMEOUT_MS = 2000;

const acquireCall: Call<WireAcquireRequest, WireAcquireResponse> = (s, r, m, o, cb) => s.Acquire(r, m, o, cb);
const batchCall: Call<WireAcquireBatchRequest, WireAcquireBatchResponse> = (s, r, m, o, cb) =>
  s.AcquireBatch(r, m, o, cb);
const reportCall: Call<WireReportOutcomeRequest, WireReportOutcomeResponse> = (s, r, m, o, cb) =>
  s.ReportOutcome(r, m, o, cb);
const chargeCall: Call<WireChargeRequest, WireChargeResponse> = (s, r, m, o, cb) => s.Charge(r, m, o, cb);

/**
 * A Floodgate client, shared by every caller of a process.
 *
 * ```ts
 * const floodgate = new Client("http://127.0.0.1:50051", { failMode: FailMode.local(0.5) });
 * const d = await floodgate.acquire({ resource: "payments", descriptors: { tenant: "acme" } });
 * if (d.allowed) { ...; d.permit?.report(Outcome.Success); }
 * ```
 */
export class Client {
  readonly #endpoints: Endpoint[];
  readonly #requestTimeoutMs: number;
  readonly #failMode: FailMode;
  readonly #failClosedRetryAfterMs: number;
  readonly #cancelledAs: Outcome | undefined;
  readonly #local: LocalLimits | null;
  readonly #metadata: grpc.Metadata;
  readonly #stats: Stats = newStats();
  /** Permits handed out and not yet reported. */
  readonly #open = new Set<PermitState>();
  /** Calls whose answer is still awaited (by a caller or in the background). */
  readonly #pending = new Set<grpc.ClientUnaryCall>();
  #closing: Promise<void> | null = null;

  /**
   * A client of one server, or of several tried in order (failover):
   * `http://host:port`, `https://host:port` (TLS), or `host:port`
   * (plaintext unless `tls` is given). No connection is needed to make it.
   */
  constructor(endpoints: string | readonly string[], options: ClientOptions = {}) {
    const urls = typeof endpoints === "string" ? [endpoints] : [...endpoints];
    if (urls.length === 0) throw new FloodgateError("bad endpoint '': no endpoint given");
    this.#failMode = failMode(options.failMode);
    if (this.#failMode.kind === "local") {
      const share = this.#failMode.share;
      if (!(share > 0 && share <= 1)) throw new FloodgateError(`FailMode local share ${share} is not in (0, 1]`);
    }
    this.#requestTimeoutMs = positive(options.requestTimeoutMs, 25, "requestTimeoutMs");
    this.#failClosedRetryAfterMs = positive(options.failClosedRetryAfterMs, 1000, "failClosedRetryAfterMs");
    this.#cancelledAs = options.cancelledAs;
    this.#metadata = new grpc.Metadata();
    if (options.token !== undefined) {
      if (!/^[\x21-\x7e]+$/.test(options.token)) throw new FloodgateError("token: must be printable ASCII without spaces");
      this.#metadata.set("authorization", `Bearer ${options.token}`);
    }
    this.#local =
      this.#failMode.kind === "local"
        ? new LocalLimits(this.#failMode.share, (sink, resource) =>
            this.#newPermit({ id: "", resource, endpoint: -1, urgent: false, onDrop: Outcome.Ignored }, sink),
          )
        : null;
    const settings = {
      batch: Math.min(Math.max(Math.trunc(options.reportBatch ?? 100), 1), 1000),
      intervalMs: positive(options.reportIntervalMs, 10, "reportIntervalMs"),
      timeoutMs: 2000,
    };
    const Stub = floodgateStub();
    this.#endpoints = urls.map((url) => {
      const { target, secure } = parseEndpoint(url, options.tls !== undefined);
      const channelOptions: grpc.ChannelOptions = {
        // Reconnect soon after a server comes back (grpc-js backs off up to 120 s by default).
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
        ...(options.tls?.serverName
          ? { "grpc.ssl_target_name_override": options.tls.serverName, "grpc.default_authority": options.tls.serverName }
          : {}),
        ...options.channelOptions,
      };
      const stub = new Stub(target, credentials(secure, options.tls, url), channelOptions);
      const breaker = new ServerBreaker(url);
      const onChange = options.onConnectionChange;
      if (onChange) breaker.onChange = (reachable, why) => onChange(url, reachable, why);
      const reporter = new Reporter(
        (reports, timeoutMs) =>
          new Promise((resolve, reject) => {
            const call = stub.ReportOutcomeBatch(
              { reports },
              this.#metadata,
              { deadline: Date.now() + timeoutMs },
              (err, value) => {
                this.#pending.delete(call);
                if (err || !value) reject(err ?? new FloodgateError("no answer"));
                else resolve(value);
              },
            );
            this.#pending.add(call);
          }),
        settings,
        this.#stats,
      );
      // Connect now; a dry run follows (see #warmUp), so that the first
      // real call pays neither for the connection nor for grpc-js's and the
      // codec's first-call work (about 25 ms) within its deadline.
      stub.getChannel().getConnectivityState(true);
      return { url, stub, breaker, reporter };
    });
    void this.#warmUp(WARM_UP_TIMEOUT_MS);
  }

  /**
   * May I? A denial is a Decision, not an error. An unreachable server gives
   * the fail mode's decision within the deadline. The only error is bad input
   * the server refused (InvalidArgumentError), or a closed client.
   */
  async acquire(request: AcquireRequest): Promise<Decision> {
    this.#checkOpen();
    const wire = toWire(request);
    const asked = await this.#ask(acquireCall, wire, this.#timeout(request), (endpoint, r) =>
      this.#giveBack(endpoint, r, request.resource, wire.settle),
    );
    switch (asked.kind) {
      case "answer":
        return this.#decision(asked.value, request, asked.endpoint);
      case "badInput":
        throw new InvalidArgumentError(asked.message);
      case "unreachable":
        return this.#withoutServer(request);
    }
  }

  /**
   * Many questions in one round trip (AcquireBatch, up to 1000 a call),
   * answered in order. A batch the server refuses (one bad item) throws
   * InvalidArgumentError naming the item; nothing in it was taken.
   */
  async acquireBatch(requests: readonly AcquireRequest[], options: { timeoutMs?: number } = {}): Promise<Decision[]> {
    this.#checkOpen();
    const wires = requests.map(toWire);
    const out: Decision[] = [];
    for (let start = 0; start < requests.length; start += 1000) {
      const chunk = requests.slice(start, start + 1000);
      const batch = { requests: wires.slice(start, start + 1000) };
      const timeoutMs = this.#timeout({ resource: "", timeoutMs: options.timeoutMs });
      const asked = await this.#ask(batchCall, batch, timeoutMs, (endpoint, r) =>
        (r.responses ?? []).forEach((x, i) => this.#giveBack(endpoint, x, chunk[i]?.resource ?? "", batch.requests[i]?.settle ?? false)),
      );
      if (asked.kind === "badInput") throw new InvalidArgumentError(asked.message);
      if (asked.kind === "unreachable") {
        for (const r of chunk) out.push(this.#withoutServer(r));
        continue;
      }
      const responses = asked.value.responses ?? [];
      if (responses.length !== chunk.length) {
        throw new FloodgateError(
          `the server's answer breaks the protocol: ${chunk.length} questions in a batch got ${responses.length} answers`,
        );
      }
      responses.forEach((r, i) => out.push(this.#decision(r, chunk[i]!, asked.endpoint)));
    }
    return out;
  }

  /**
   * Takes `cost` from every limit the request matches, with no question
   * first: beyond a limit if need be (a debt later callers wait out). The
   * limits after it (`exceeded` when used up). Throws InvalidArgumentError
   * for bad input, UnavailableError when no server answers.
   */
  async charge(request: AcquireRequest): Promise<Limit[]> {
    return (await this.#chargeWire(request)).limits;
  }

  async #chargeWire(request: AcquireRequest): Promise<{ limits: Limit[]; exhausted: boolean }> {
    this.#checkOpen();
    const w = toWire(request);
    // Every charge carries a key: when a server does not answer in time and
    // the next one is asked, a charge the first took is not taken twice.
    const wire: WireChargeRequest = {
      resource: w.resource,
      descriptors: w.descriptors,
      cost: w.cost,
      idempotency_key: request.idempotencyKey ?? randomUUID(),
    };
    if (w.usage !== undefined) wire.usage = w.usage;
    const asked = await this.#ask(chargeCall, wire, this.#timeout(request));
    switch (asked.kind) {
      case "answer": {
        const limits = asked.value.limits ?? [];
        // A shadow limit used up stops nothing.
        const exhausted = limits.some((l) => l.exceeded && !l.shadow);
        return { limits: limits.map(limitFromWire), exhausted };
      }
      case "badInput":
        throw new InvalidArgumentError(asked.message);
      case "unreachable":
        throw new UnavailableError(`Floodgate is unreachable: ${asked.why}`);
    }
  }

  /**
   * Starts a metered call (a streamed answer): reserves `request.cost` as an
   * estimate (an Acquire with `settle`). Count each chunk with `add`, which
   * charges what goes beyond the estimate and answers false when a budget
   * ran out; `finish` settles. Check `admitted` first.
   */
  async meter(request: AcquireRequest): Promise<Metered> {
    const decision = await this.acquire({ ...request, settle: true, dryRun: false });
    // Units beyond the reservation, not usage: the limits priced by the
    // start's usage take nothing more (each of its fields is sent as 0).
    const zeroed = request.usage ? Object.fromEntries(Object.keys(request.usage).map((k) => [k, 0])) : undefined;
    const charge = (units: number) =>
      this.#chargeWire({ ...request, cost: units, settle: false, dryRun: false, usage: zeroed, idempotencyKey: undefined });
    return new Metered(decision, request.cost ?? 1, charge, this.#failMode.kind === "closed", request.usage);
  }

  /**
   * Reports the outcome of a permit id obtained some other way (a detached
   * permit, another process), waiting for the answer. Permits report
   * themselves: use `permit.report` for those. Throws InvalidArgumentError
   * for a malformed id or outcome, UnavailableError when no server answers.
   */
  async report(request: ReportRequest, options: { timeoutMs?: number } = {}): Promise<ReportResult> {
    this.#checkOpen();
    const wire: WireReportOutcomeRequest = {
      resource: request.resource ?? "",
      permit_id: request.permitId,
      outcome: wireOutcome(request.outcome),
      latency: request.latencyMs === undefined ? null : msDuration(request.latencyMs),
    };
    if (request.actualCost !== undefined) wire.actual_cost = request.actualCost;
    if (request.usage !== undefined) wire.usage = usageField(request.usage);
    const asked = await this.#ask(reportCall, wire, this.#timeout({ resource: "", timeoutMs: options.timeoutMs }));
    switch (asked.kind) {
      case "answer":
        return {
          counted: asked.value.counted,
          breakerState: breakerState(asked.value.breaker_state),
          settled: asked.value.settled,
        };
      case "badInput":
        throw new InvalidArgumentError(asked.message);
      case "unreachable":
        throw new UnavailableError(`Floodgate is unreachable: ${asked.why}`);
    }
  }

  /**
   * Guards one call: acquires, runs `fn` only if allowed (after any shaping
   * wait), times it, classifies its result and reports it. Denied: the
   * fallback's value, else DeniedError. Failed: the fallback's value, else
   * the call's error. Bad input (InvalidArgumentError) is thrown either way.
   */
  async guard<T>(request: AcquireRequest, fn: () => T | Promise<T>, options: GuardOptions<T> = {}): Promise<T> {
    const decision = await this.acquire(request);
    if (!decision.allowed) {
      const error = new DeniedError(decision);
      if (options.fallback) return options.fallback({ kind: "denied", decision, error });
      throw error;
    }
    if (decision.waitMs > 0) await sleep(decision.waitMs);
    const permit = decision.permit;
    const start = performance.now();
    let result: CallResult<T>;
    try {
      result = { ok: true, value: await fn() };
    } catch (error) {
      result = { ok: false, error };
    }
    if (permit) {
      let outcome: Outcome = result.ok ? Outcome.Success : Outcome.Failure;
      if (options.classify) {
        try {
          outcome = options.classify(result);
        } catch {
          outcome = Outcome.Failure;
        }
      }
      permit.report(outcome, performance.now() - start);
    }
    if (result.ok) return result.value;
    if (options.fallback) return options.fallback({ kind: "failed", error: result.error });
    throw result.error;
  }

  /** Waits until every report made so far was delivered (or given up on). */
  async flush(): Promise<void> {
    await Promise.all(this.#endpoints.map((e) => e.reporter.flush()));
  }

  /** Whether every server is currently considered unreachable. */
  isDegraded(): boolean {
    return this.#endpoints.every((e) => e.breaker.isOpen);
  }

  /** A copy of the counters. */
  stats(): Stats {
    return { ...this.#stats };
  }

  /**
   * Resolves to true once a server answers a dry-run Acquire (the first of
   * the endpoints to answer), or to false when none did within `timeoutMs`
   * (default 2000): a server not listening yet is asked again every 100 ms
   * until then. Await it at start: a call made before it may be answered by
   * the fail mode, because the first call of a process takes about 25 ms of
   * setup, as long as the default deadline.
   */
  async ready(options: { timeoutMs?: number } = {}): Promise<boolean> {
    const deadline = performance.now() + (options.timeoutMs ?? 2000);
    // A server not listening yet refuses at once: ask again every 100 ms
    // until one answers or the time is up.
    for (;;) {
      const left = deadline - performance.now();
      if (this.#closing || left <= 0) return false;
      if (await this.#warmUp(left)) return true;
      const pause = Math.min(100, deadline - performance.now());
      if (pause > 0) await new Promise((r) => setTimeout(r, pause).unref());
    }
  }

  /**
   * One dry-run Acquire of a resource no rule needs to name, on every
   * endpoint: true as soon as one answered, false once all failed or
   * `timeoutMs` passed. A dry run changes nothing and is not counted as a
   * decision; close() cancels it.
   */
  #warmUp(timeoutMs: number): Promise<boolean> {
    const request: WireAcquireRequest = {
      resource: WARM_UP_RESOURCE,
      descriptors: {},
      cost: 1,
      dry_run: true,
      settle: false,
      priority: PRIORITIES[Priority.Critical],
    };
    const tries = this.#endpoints.map(
      (ep) =>
        new Promise<boolean>((resolve) => {
          const call = ep.stub.Acquire(request, this.#metadata, { deadline: Date.now() + timeoutMs }, (err) => {
            this.#pending.delete(call);
            resolve(!err);
          });
          this.#pending.add(call);
        }),
    );
    return Promise.any(tries.map((t) => t.then((ok) => (ok ? true : Promise.reject())))).catch(() => false);
  }

  /** Whether close() was called. */
  get closed(): boolean {
    return this.#closing !== null;
  }

  /**
   * Reports every permit still unreported as IGNORED, delivers what is
   * queued (waiting `timeoutMs` at most, default 5000), then closes the
   * connections. Idempotent.
   */
  close(options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closing = (async () => {
      settleAll(this.#open, Outcome.Ignored);
      const delivered = Promise.all(this.#endpoints.map((e) => e.reporter.close()));
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<void>((r) => (timer = setTimeout(r, options.timeoutMs ?? 5000)));
      await Promise.race([delivered, timeout]);
      clearTimeout(timer);
      for (const call of this.#pending) call.cancel();
      this.#pending.clear();
      for (const e of this.#endpoints) e.stub.close();
    })();
    return this.#closing;
  }

  #checkOpen(): void {
    if (this.#closing) throw new FloodgateError("the client is closed");
  }

  #timeout(request: AcquireRequest): number {
    const t = request.timeoutMs;
    if (t === undefined) return this.#requestTimeoutMs;
    if (!(t >= 0) || !Number.isFinite(t)) throw new RangeError(`timeoutMs must be a number >= 0, not ${t}`);
    return t;
  }

  /**
   * Tries each server in turn within `timeoutMs`. An answer that comes after
   * the caller stopped waiting goes to `orphan` (to give back its permit).
   */
  async #ask<Req, Res>(
    call: Call<Req, Res>,
    request: Req,
    timeoutMs: number,
    orphan?: (endpoint: number, value: Res) => void,
  ): Promise<Asked<Res>> {
    const deadline = performance.now() + timeoutMs;
    let why = "every endpoint is cooling down after failures";
    for (let i = 0; i < this.#endpoints.length; i++) {
      const ep = this.#endpoints[i]!;
      const attempt = ep.breaker.attempt();
      if (!attempt) continue;
      const left = Math.max(0, deadline - performance.now());
      this.#stats.rpcs += 1;
      const answer = await this.#once(ep, i, call, request, left, attempt, orphan);
      if (answer.kind === "answer") {
        attempt.success();
        return answer;
      }
      if (answer.kind === "badInput") {
        attempt.success();
        return answer;
      }
      why = answer.why;
    }
    return { kind: "unreachable", why };
  }

  /** One call to one endpoint; settles `attempt` for every outcome but an answer. */
  #once<Req, Res>(
    ep: Endpoint,
    i: number,
    call: Call<Req, Res>,
    request: Req,
    leftMs: number,
    attempt: Attempt,
    orphan: ((endpoint: number, value: Res) => void) | undefined,
  ): Promise<Asked<Res>> {
    return new Promise((resolve) => {
      let done = false;
      const timer = setTimeout(() => {
        done = true;
        attempt.failure("no answer within the request timeout");
        resolve({ kind: "unreachable", why: "no answer within the request timeout" });
      }, leftMs);
      const grace = orphan ? ORPHAN_GRACE_MS : 0;
      const handle = call(ep.stub, request, this.#metadata, { deadline: Date.now() + leftMs + grace }, (err, value) => {
        this.#pending.delete(handle);
        if (done) {
          if (!err && value && orphan) orphan(i, value);
          return;
        }
        done = true;
        clearTimeout(timer);
        if (!err && value) return resolve({ kind: "answer", endpoint: i, value });
        if (!err) {
          attempt.failure("an empty answer");
          return resolve({ kind: "unreachable", why: "an empty answer" });
        }
        if (err.code === grpc.status.INVALID_ARGUMENT) return resolve({ kind: "badInput", message: err.details });
        if (UNREACHABLE.has(err.code)) {
          if (this.#closing) attempt.abandon();
          else attempt.failure(err.details || err.message);
          return resolve({ kind: "unreachable", why: `${grpc.status[err.code]}: ${err.details}` });
        }
        // It answered, but not a decision: as good as no answer.
        attempt.success();
        this.#stats.serverErrors += 1;
        process.emitWarning(
          `Floodgate answered ${grpc.status[err.code]} (${err.details}); trying without it`,
          "FloodgateWarning",
        );
        resolve({ kind: "unreachable", why: `${grpc.status[err.code]}: ${err.details}` });
      });
      this.#pending.add(handle);
    });
  }

  #decision(r: WireAcquireResponse, request: AcquireRequest, endpoint: number): Decision {
    const sink = this.#serverSink;
    const d = Decision.fromWire(r, (id, urgent, breaker) =>
      this.#newPermit(
        {
          id,
          resource: request.resource,
          endpoint,
          urgent,
          onDrop: this.#cancelledAs ?? (breaker ? Outcome.Failure : Outcome.Ignored),
        },
        sink,
      ),
    );
    this.#local?.learn(questionKey(request.resource, request.descriptors), request.resource, d.verdict, d.limits, d.maxInFlight);
    return d;
  }

  /** The fail mode's answer. */
  #withoutServer(request: AcquireRequest): Decision {
    this.#stats.withoutServer += 1;
    switch (this.#failMode.kind) {
      case "open":
        return Decision.failOpen();
      case "closed":
        return Decision.failClosed(this.#failClosedRetryAfterMs);
      case "local": {
        this.#stats.decidedLocally += 1;
        const key = questionKey(request.resource, request.descriptors);
        return this.#local!.decide(key, request.resource, request.cost ?? 1);
      }
    }
  }

  /** An answer nobody read: its permit reported IGNORED (with `settle`, at a cost of 0). */
  #giveBack(endpoint: number, r: WireAcquireResponse, resource: string, settle: boolean): void {
    if (!r.permit_id) return;
    const permit = this.#newPermit(
      { id: r.permit_id, resource, endpoint, urgent: r.holds_slot, onDrop: Outcome.Ignored },
      this.#serverSink,
    );
    if (settle) permit.reportCost(Outcome.Ignored, 0);
    else permit.report(Outcome.Ignored);
  }

  #newPermit(
    init: { id: string; resource: string; endpoint: number; urgent: boolean; onDrop: Outcome },
    sink: PermitSink,
  ): Permit {
    return new Permit({ ...init, issued: performance.now(), sink, open: this.#open });
  }

  /** A permit's report, queued for the server that issued it. */
  readonly #serverSink: PermitSink = {
    sendReport: (permit, outcome, latencyMs, actualCost, usage) => {
      const ep = this.#endpoints[permit.endpoint];
      if (!ep) return;
      const report: WireReportOutcomeRequest = {
        resource: permit.resource,
        permit_id: permit.id,
        outcome: wireOutcome(outcome),
        latency: msDuration(latencyMs),
      };
      if (actualCost !== undefined) report.actual_cost = actualCost;
      if (usage !== undefined && Object.keys(usage).length > 0) report.usage = usage;
      ep.reporter.send(report, permit.urgent);
    },
  };
}

function failMode(m: ClientOptions["failMode"]): FailMode {
  if (m === undefined || m === "open") return FailMode.open;
  if (m === "closed") return FailMode.closed;
  if (typeof m === "object" && (m.kind === "open" || m.kind === "closed" || m.kind === "local")) return m;
  throw new FloodgateError(`failMode: not a fail mode: ${JSON.stringify(m)}`);
}

function positive(v: number | undefined, dflt: number, name: string): number {
  if (v === undefined) return dflt;
  if (!(v >= 0) || !Number.isFinite(v)) throw new FloodgateError(`${name}: must be a number >= 0, not ${v}`);
  return v;
}

function parseEndpoint(url: string, tlsGiven: boolean): { target: string; secure: boolean } {
  const bad = (reason: string) => new FloodgateError(`bad endpoint '${url}': ${reason}`);
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(url);
  if (!scheme) {
    if (!/^[^\s/]+:\d+$/.test(url)) throw bad("expected http://host:port, https://host:port or host:port");
    return { target: url, secure: tlsGiven };
  }
  let u: URL;
  try {
    u = new URL(url);
  } catch (e) {
    throw bad((e as Error).message);
  }
  const secure = u.protocol === "https:";
  if (!secure && u.protocol !== "http:") throw bad(`unsupported scheme '${u.protocol.slice(0, -1)}'`);
  if (!u.hostname) throw bad("no host");
  if (u.pathname !== "/" && u.pathname !== "") throw bad("a path is not allowed");
  const port = u.port || (secure ? "443" : "80");
  return { target: `${u.hostname}:${port}`, secure };
}

function credentials(secure: boolean, tls: TlsOptions | undefined, url: string): grpc.ChannelCredentials {
  if (!secure) return grpc.credentials.createInsecure();
  const buf = (v: string | Buffer | undefined) => (v === undefined ? null : Buffer.isBuffer(v) ? v : Buffer.from(v));
  if ((tls?.cert === undefined) !== (tls?.key === undefined)) {
    throw new FloodgateError(`bad endpoint '${url}': tls.cert and tls.key go together`);
  }
  try {
    return grpc.credentials.createSsl(buf(tls?.ca), buf(tls?.key), buf(tls?.cert));
  } catch (e) {
    throw new FloodgateError(`bad endpoint '${url}': ${(e as Error).message}`, { cause: e });
  }
}

const PRIORITIES: Record<Priority, WireAcquireRequest["priority"]> = {
  CRITICAL_PLUS: "PRIORITY_CRITICAL_PLUS",
  CRITICAL: "PRIORITY_CRITICAL",
  SHEDDABLE_PLUS: "PRIORITY_SHEDDABLE_PLUS",
  SHEDDABLE: "PRIORITY_SHEDDABLE",
};

function toWire(r: AcquireRequest): WireAcquireRequest {
  if (r === null || typeof r !== "object") throw new InvalidArgumentError(`request: not an object`);
  if (typeof r.resource !== "string") throw new InvalidArgumentError(`resource: must be a string`);
  const cost = r.cost ?? 1;
  if (!Number.isInteger(cost) || cost < 0 || cost > 0xffffffff) {
    throw new InvalidArgumentError(`cost: ${cost} is not a whole number from 0 to 4294967295`);
  }
  const priority = PRIORITIES[r.priority ?? Priority.Critical];
  if (!priority) throw new InvalidArgumentError(`priority: unknown priority ${String(r.priority)}`);
  const descriptors: Record<string, string> = {};
  for (const [k, v] of Object.entries(r.descriptors ?? {})) {
    if (typeof v !== "string") throw new InvalidArgumentError(`descriptors.${k}: must be a string`);
    descriptors[k] = v;
  }
  const wire: WireAcquireRequest = { resource: r.resource, descriptors, cost, dry_run: !!r.dryRun, settle: !!r.settle, priority };
  if (r.usage !== undefined) wire.usage = usageField(r.usage);
  return wire;
}

/** Usage as sent; bad values are InvalidArgumentError, as the server's would be. */
function usageField(usage: Readonly<Record<string, number>>): Record<string, number> {
  try {
    return usageOf(usage);
  } catch (e) {
    throw new InvalidArgumentError((e as Error).message);
  }
}

function wireOutcome(o: Outcome): WireReportOutcomeRequest["outcome"] {
  switch (o) {
    case Outcome.Success:
      return "OUTCOME_SUCCESS";
    case Outcome.Failure:
      return "OUTCOME_FAILURE";
    case Outcome.Ignored:
      return "OUTCOME_IGNORED";
    default:
      throw new InvalidArgumentError(`outcome: not an outcome: ${String(o)}`);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
