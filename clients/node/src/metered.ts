// A metered call: reserve an estimate, charge what goes beyond it while the
// call streams, settle at the end.
//
// An LLM answer's tokens are known chunk by chunk. `client.meter(...)`
// reserves an estimate first (an Acquire with `settle`), so that concurrent
// calls cannot all pass one check of the same budget. `add(units)` counts
// each chunk: within the reservation nothing is asked; beyond it, the excess
// is charged at once, and `add` answers false when a budget is used up, so a
// call overshoots its budget by at most one chunk. `finish()` settles the
// reservation at what was used of it; the rest comes back to the limits.

import type { Decision } from "./decision.js";
import { UnavailableError } from "./errors.js";
import type { Permit } from "./permit.js";
import { Outcome, type Limit } from "./types.js";

/** Charges `units` and answers the limits after it, or throws. */
export type ChargeFn = (units: number) => Promise<{ limits: Limit[]; exhausted: boolean }>;

export class Metered {
  /** The decision at the start: `admitted` is false when it was denied. */
  readonly decision: Decision;
  /** Units the start reserved (0 when no server was reached). */
  readonly reserved: number;
  /** The limits as the charge that said stop left them. */
  limits: readonly Limit[] = [];
  #used = 0;
  #charged = 0;
  #permit: Permit | undefined;
  #done = false;
  readonly #charge: ChargeFn;
  readonly #failClosed: boolean;
  readonly #usage: Readonly<Record<string, number>> | undefined;

  /** `usage`: what the start reported; the limits it priced settle at it. */
  constructor(
    decision: Decision,
    estimate: number,
    charge: ChargeFn,
    failClosed: boolean,
    usage?: Readonly<Record<string, number>>,
  ) {
    this.decision = decision;
    this.#usage = usage && Object.keys(usage).length > 0 ? usage : undefined;
    this.#permit = (decision.allowed ? decision.permit : undefined) ?? undefined;
    this.reserved = this.#permit ? estimate : 0;
    this.#charge = charge;
    this.#failClosed = failClosed;
  }

  /** Whether the call may start (else see `decision.retryAfterMs`). */
  get admitted(): boolean {
    return this.decision.allowed;
  }

  /** Units counted so far. */
  get used(): number {
    return this.#used;
  }

  /**
   * Counts `units` more of the call's use: false when a budget ran out and
   * the call should end. When no server answers a charge, the call goes on
   * (unless the client fails closed), and those units are not charged again
   * later: a charge whose answer was lost may have been applied, and
   * charging it again would count it twice.
   */
  async add(units: number): Promise<boolean> {
    if (!Number.isSafeInteger(units) || units < 0 || units > 0xffffffff) {
      throw new RangeError(`units must be a whole number from 0 to 4294967295, not ${units}`);
    }
    if (!this.admitted) throw new Error("the metered call was denied at the start: nothing to count");
    if (this.#done) throw new Error("the metered call is finished: nothing more is counted");
    this.#used += units;
    const due = Math.max(0, this.#used - this.reserved) - this.#charged;
    if (due <= 0) return true;
    this.#charged += due;
    try {
      const charged = await this.#charge(due);
      if (charged.exhausted) {
        this.limits = charged.limits;
        return false;
      }
      return true;
    } catch (e) {
      if (e instanceof UnavailableError) return !this.#failClosed;
      throw e;
    }
  }

  /**
   * Ends the call: settles the reservation at the units used within it
   * (limits priced by the usage the start reported settle at that usage).
   */
  finish(outcome: Outcome = Outcome.Success): void {
    this.#done = true;
    const permit = this.#permit;
    this.#permit = undefined;
    const used = Math.min(this.#used, this.reserved);
    if (this.#usage) permit?.reportUsage(outcome, this.#usage, undefined, used);
    else permit?.reportCost(outcome, used);
  }
}
