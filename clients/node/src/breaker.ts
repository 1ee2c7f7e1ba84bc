// A local breaker on each server connection: after a few calls in a row
// fail to reach the server, the client stops trying for a cool-down (growing
// up to a cap), so a dead server costs no waiting per request; then one call
// probes, and success closes it again. A port of the Rust crate's
// connection.rs.

import { performance } from "node:perf_hooks";

/** Failures in a row that open the local breaker. */
export const THRESHOLD = 3;
export const FIRST_COOLDOWN_MS = 250;
export const MAX_COOLDOWN_MS = 5000;

export class ServerBreaker {
  readonly endpoint: string;
  /** performance.now() until which calls are not tried; 0 when closed. */
  #openUntil = 0;
  #failures = 0;
  #probing = false;
  #cooldownMs = FIRST_COOLDOWN_MS;
  /** Told when the server is considered unreachable, and reachable again. */
  onChange: ((reachable: boolean, why: string) => void) | undefined;

  constructor(endpoint: string) {
    this.endpoint = endpoint;
  }

  /**
   * May a call be tried? While open, no; once the cool-down is over, one
   * caller at a time probes. The attempt says how the call went.
   */
  attempt(): Attempt | null {
    if (this.#openUntil === 0) return new Attempt(this, false);
    if (performance.now() >= this.#openUntil && !this.#probing) {
      this.#probing = true;
      return new Attempt(this, true);
    }
    return null;
  }

  /** Whether the server is currently considered unreachable. */
  get isOpen(): boolean {
    return this.#openUntil !== 0;
  }

  /** @internal */
  success(): void {
    this.#failures = 0;
    this.#probing = false;
    if (this.#openUntil !== 0) {
      this.#openUntil = 0;
      this.#cooldownMs = FIRST_COOLDOWN_MS;
      this.onChange?.(true, "");
    }
  }

  /** @internal */
  failure(why: string): void {
    this.#failures += 1;
    const probing = this.#probing;
    this.#probing = false;
    if (this.#failures < THRESHOLD && !probing) return;
    const wasOpen = this.#openUntil !== 0;
    this.#openUntil = performance.now() + this.#cooldownMs;
    if (!wasOpen) this.onChange?.(false, why);
    this.#cooldownMs = Math.min(this.#cooldownMs * 2, MAX_COOLDOWN_MS);
  }

  /** @internal A probe that learnt nothing (cancelled): the next call may probe. */
  abandon(): void {
    this.#probing = false;
  }
}

/** One call tried through the breaker. */
export class Attempt {
  #settled = false;

  constructor(
    private readonly breaker: ServerBreaker,
    readonly probe: boolean,
  ) {}

  success(): void {
    if (this.#settled) return;
    this.#settled = true;
    this.breaker.success();
  }

  failure(why: string): void {
    if (this.#settled) return;
    this.#settled = true;
    this.breaker.failure(why);
  }

  /** Neither up nor down was learnt (the client closed mid-call). */
  abandon(): void {
    if (this.#settled) return;
    this.#settled = true;
    if (this.probe) this.breaker.abandon();
  }
}
