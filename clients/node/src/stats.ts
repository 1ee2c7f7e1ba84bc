// What the client did, for logs, metrics or tests.

/** Counters since the client was made. */
export interface Stats {
  /** Calls sent to a server (Acquire, AcquireBatch, ReportOutcome by `report`). */
  rpcs: number;
  /** Server answers that were errors rather than decisions (the fail mode answered). */
  serverErrors: number;
  /** Decisions made without the server: by the fail mode (open, closed or local), all of them. */
  withoutServer: number;
  /** Of those, the ones the local fail mode decided from the limits it learned. */
  decidedLocally: number;
  /** Reports the server counted. */
  reportsCounted: number;
  /** Reports the server did not count (expired, unknown or already reported permits). */
  reportsUncounted: number;
  /** Reports that could not be delivered. */
  reportsDropped: number;
}

export function newStats(): Stats {
  return {
    rpcs: 0,
    serverErrors: 0,
    withoutServer: 0,
    decidedLocally: 0,
    reportsCounted: 0,
    reportsUncounted: 0,
    reportsDropped: 0,
  };
}
