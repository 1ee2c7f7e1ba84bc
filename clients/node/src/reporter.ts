// Outcome reports, batched in the background: reporting never blocks or
// fails the caller. A batch leaves when it is full, or at most `intervalMs`
// after its first report; a report that frees a concurrency slot or decides
// a half-open probe leaves at once, with whatever is queued. Batches are
// sent one after the other, each tried twice; a batch the server cannot
// take is dropped (its permits expire on the server). A port of the Rust
// crate's reporter.rs.

import type { Stats } from "./stats.js";
import type { WireReportOutcomeBatchResponse, WireReportOutcomeRequest } from "./wire.js";

/** Reports waiting before new ones are dropped. */
const QUEUE = 10_000;

export interface ReporterSettings {
  batch: number;
  intervalMs: number;
  timeoutMs: number;
}

/** Sends one batch with a deadline; rejects with a grpc ServiceError. */
export type SendBatch = (reports: WireReportOutcomeRequest[], timeoutMs: number) => Promise<WireReportOutcomeBatchResponse>;

export class Reporter {
  readonly #send: SendBatch;
  readonly #settings: ReporterSettings;
  readonly #stats: Stats;
  #batch: WireReportOutcomeRequest[] = [];
  #timer: NodeJS.Timeout | undefined;
  /** Reports handed to the sending chain and not yet done. */
  #inFlight = 0;
  #chain: Promise<void> = Promise.resolve();
  #closed = false;

  constructor(send: SendBatch, settings: ReporterSettings, stats: Stats) {
    this.#send = send;
    this.#settings = settings;
    this.#stats = stats;
  }

  /** Queues a report; false (and counted as dropped) when the queue is full or closed. */
  send(report: WireReportOutcomeRequest, urgent: boolean): boolean {
    if (this.#closed || this.#batch.length + this.#inFlight >= QUEUE) {
      this.#stats.reportsDropped += 1;
      return false;
    }
    this.#batch.push(report);
    if (urgent || this.#batch.length >= this.#settings.batch) {
      this.#leave();
    } else if (!this.#timer) {
      this.#timer = setTimeout(() => {
        this.#timer = undefined;
        this.#leave();
      }, this.#settings.intervalMs);
    }
    return true;
  }

  /** Waits until every report queued so far was sent (or given up on). */
  flush(): Promise<void> {
    this.#leave();
    return this.#chain;
  }

  /** Sends what is queued, then takes no more. */
  close(): Promise<void> {
    const done = this.flush();
    this.#closed = true;
    return done;
  }

  #leave(): void {
    if (this.#timer) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    if (this.#batch.length === 0) return;
    const reports = this.#batch;
    this.#batch = [];
    this.#inFlight += reports.length;
    this.#chain = this.#chain.then(async () => {
      try {
        await this.#deliver(reports);
      } finally {
        this.#inFlight -= reports.length;
      }
    });
  }

  async #deliver(reports: WireReportOutcomeRequest[]): Promise<void> {
    const n = reports.length;
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const r = await this.#send(reports, this.#settings.timeoutMs);
        const counted = (r.responses ?? []).filter((x) => x.counted).length;
        this.#stats.reportsCounted += counted;
        this.#stats.reportsUncounted += n - counted;
        return;
      } catch (e) {
        if ((e as { code?: number }).code === 3) {
          process.emitWarning(`Floodgate refused a batch of reports: ${(e as Error).message}`, "FloodgateWarning");
          break;
        }
        if (attempt === 0) await new Promise((r) => setTimeout(r, 50));
      }
    }
    this.#stats.reportsDropped += n;
  }
}
