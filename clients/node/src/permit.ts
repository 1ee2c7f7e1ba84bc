// A permit: what an admitted call on a resource with a breaker or a
// concurrency limit holds until it says how the call went. It reports
// itself: collected unreported (the caller forgot it, or its call was
// abandoned), it reports its cancellation outcome through a
// FinalizationRegistry, as the Rust crate's permit does when dropped; and
// every permit still unreported when its client closes is reported IGNORED.

import { performance } from "node:perf_hooks";

import { Outcome } from "./types.js";

/** Where a permit's report goes: the client that issued it, or the local limiter. */
export interface PermitSink {
  sendReport(
    permit: PermitState,
    outcome: Outcome,
    latencyMs: number,
    actualCost: number | undefined,
    usage?: Record<string, number>,
  ): void;
}

/** What a permit is, apart from the object the caller holds. */
export interface PermitState {
  readonly id: string;
  readonly resource: string;
  /** performance.now() when it was issued. */
  readonly issued: number;
  /** The endpoint that issued it (-1: the local limiter). */
  readonly endpoint: number;
  /** Holds a concurrency slot or a half-open probe: its report leaves at once. */
  readonly urgent: boolean;
  onDrop: Outcome;
  /** null once reported or detached. */
  sink: PermitSink | null;
  /** The set of open permits of the client, to report them on close. */
  open: Set<PermitState> | null;
}

const collected = new FinalizationRegistry<PermitState>((state) => {
  settle(state, state.onDrop, performance.now() - state.issued, undefined);
});

function settle(
  state: PermitState,
  outcome: Outcome,
  latencyMs: number,
  actualCost: number | undefined,
  usage?: Record<string, number>,
): boolean {
  const sink = state.sink;
  if (!sink) return false;
  state.sink = null;
  state.open?.delete(state);
  state.open = null;
  sink.sendReport(state, outcome, Math.max(0, latencyMs), actualCost, usage);
  return true;
}

/** Reports every permit of `open` still unreported as `outcome` (a client closing). */
export function settleAll(open: Set<PermitState>, outcome: Outcome): number {
  let n = 0;
  for (const state of [...open]) {
    if (settle(state, outcome, performance.now() - state.issued, undefined)) n += 1;
  }
  return n;
}

/**
 * Present on an admitted decision when the resource has a breaker or a
 * concurrency limit: report the call's outcome with it. Reports are sent in
 * the background and never block or fail the caller.
 */
export class Permit {
  readonly #state: PermitState;

  /** @internal Made by the client. */
  constructor(state: PermitState) {
    this.#state = state;
    state.open?.add(state);
    collected.register(this, state, this);
  }

  /** The id, as the server issued it ("" for a permit of a local decision). */
  get id(): string {
    return this.#state.id;
  }

  get resource(): string {
    return this.#state.resource;
  }

  /** Whether it was reported (or detached) already. */
  get reported(): boolean {
    return this.#state.sink === null;
  }

  /** Milliseconds since it was issued. */
  get ageMs(): number {
    return performance.now() - this.#state.issued;
  }

  /**
   * How the call went, and how long it took (by default the permit's age).
   * Only the first report of a permit counts; later ones return false.
   */
  report(outcome: Outcome, latencyMs?: number): boolean {
    return this.#send(outcome, latencyMs, undefined);
  }

  /**
   * How the call went and what it really cost, for a permit of an acquire
   * with `settle`: the server gives back what the estimate took beyond it,
   * or takes the rest (beyond the limit if need be).
   */
  reportCost(outcome: Outcome, actualCost: number, latencyMs?: number): boolean {
    if (!Number.isSafeInteger(actualCost) || actualCost < 0) {
      throw new RangeError(`actualCost must be a whole number >= 0, not ${actualCost}`);
    }
    return this.#send(outcome, latencyMs, actualCost);
  }

  /**
   * How the call went and the usage it really had, by field
   * ({output_tokens: 310}), for a permit of an acquire with `settle`: each
   * limit with a `cost` formula settles at what its formula gives for it;
   * the others at `actualCost` when given (else their estimate stands).
   */
  reportUsage(
    outcome: Outcome,
    usage: Readonly<Record<string, number>>,
    latencyMs?: number,
    actualCost?: number,
  ): boolean {
    if (actualCost !== undefined && (!Number.isSafeInteger(actualCost) || actualCost < 0)) {
      throw new RangeError(`actualCost must be a whole number >= 0, not ${actualCost}`);
    }
    return this.#send(outcome, latencyMs, actualCost, usageOf(usage));
  }

  /**
   * Reports the call as cancelled: the permit's cancellation outcome
   * (FAILURE on a resource with a breaker, IGNORED otherwise, unless the
   * client or `onDrop` said), what it reports if collected unreported.
   */
  cancel(): boolean {
    return this.#send(this.#state.onDrop, undefined, undefined);
  }

  /** What is reported if the permit is cancelled or collected unreported. */
  onDrop(outcome: Outcome): this {
    this.#state.onDrop = outcome;
    return this;
  }

  /** The outcome `cancel()` (or collection) reports. */
  get dropOutcome(): Outcome {
    return this.#state.onDrop;
  }

  /**
   * Gives up reporting through this client: the id, for a report sent some
   * other way. Unreported, the server frees it at expiry.
   */
  detach(): string {
    const state = this.#state;
    state.sink = null;
    state.open?.delete(state);
    state.open = null;
    collected.unregister(this);
    return state.id;
  }

  #send(
    outcome: Outcome,
    latencyMs: number | undefined,
    actualCost: number | undefined,
    usage?: Record<string, number>,
  ): boolean {
    if (outcome !== Outcome.Success && outcome !== Outcome.Failure && outcome !== Outcome.Ignored) {
      throw new RangeError(`not an outcome: ${String(outcome)}`);
    }
    const latency = latencyMs ?? performance.now() - this.#state.issued;
    const sent = settle(this.#state, outcome, latency, actualCost, usage);
    if (sent) collected.unregister(this);
    return sent;
  }

  /** @internal */
  toJSON(): { id: string; resource: string; reported: boolean } {
    return { id: this.id, resource: this.resource, reported: this.reported };
  }
}

/** Usage as sent: whole numbers from 0 to 4294967295 (RangeError otherwise). */
export function usageOf(usage: Readonly<Record<string, number>> | undefined): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(usage ?? {})) {
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) {
      throw new RangeError(`usage.${k}: ${v} is not a whole number from 0 to 4294967295`);
    }
    out[k] = v;
  }
  return out;
}
