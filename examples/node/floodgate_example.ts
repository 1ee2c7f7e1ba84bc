// Ask Floodgate before a call, report after, watch breakers: TypeScript on
// Node with @grpc/grpc-js, the stubs loaded at run time from the repository's
// proto/ by @grpc/proto-loader (nothing generated, nothing vendored).
//
//   npm install @grpc/grpc-js @grpc/proto-loader typescript @types/node
//   npx tsc --strict --module commonjs --target es2022 --types node --outDir out examples/node/floodgate_example.ts
//   node out/floodgate_example.js --server 127.0.0.1:50051 --proto proto
//
// It runs a short scenario and prints one JSON object of what it saw (the test
// suite asserts on it). The `Floodgate` class is the part to copy.

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import * as path from "node:path";

// The messages as proto-loader hands them over with the options below:
// field names as in the .proto, enums as their names, 64-bit numbers as strings.
interface Duration {
  seconds: string;
  nanos: number;
}
interface AcquireResponse {
  verdict: string;
  permit_id: string;
  retry_after: Duration | null;
  wait: Duration | null;
  reason: string;
}
interface WatchEvent {
  sequence: string;
  event: "snapshot" | "breaker" | "degradation" | "rules";
  breaker?: { resource: string; from_state: string; to_state: string; reason: string };
}
type Callback<T> = (err: grpc.ServiceError | null, value?: T) => void;
interface FloodgateStub extends grpc.Client {
  Acquire(req: object, options: grpc.CallOptions, cb: Callback<AcquireResponse>): void;
  ReportOutcome(req: object, options: grpc.CallOptions, cb: Callback<{ counted: boolean }>): void;
  Watch(req: object): grpc.ClientReadableStream<WatchEvent>;
}

const seconds = (d: Duration | null): number => (d ? Number(d.seconds) + d.nanos / 1e9 : 0);

export class Denied extends Error {
  constructor(readonly verdict: string, readonly retryAfter: number, reason: string) {
    super(reason);
  }
}

export class Floodgate {
  private readonly stub: FloodgateStub;
  lastPermit = "";

  constructor(
    target: string,
    protoDir: string,
    private readonly failOpen = true,
    private readonly deadlineMs = 250,
  ) {
    const definition = protoLoader.loadSync(path.join(protoDir, "floodgate/v1/floodgate.proto"), {
      includeDirs: [protoDir],
      keepCase: true,
      enums: String,
      longs: String,
      defaults: true,
      oneofs: true,
    });
    const loaded = grpc.loadPackageDefinition(definition) as any;
    const Stub = loaded.floodgate.v1.Floodgate as new (t: string, c: grpc.ChannelCredentials) => FloodgateStub;
    this.stub = new Stub(target, grpc.credentials.createInsecure());
  }

  private deadline(): grpc.CallOptions {
    return { deadline: new Date(Date.now() + this.deadlineMs) };
  }

  /** The decision, or null when the server did not answer in time. */
  acquire(resource: string, descriptors: Record<string, string> = {}, cost = 1): Promise<AcquireResponse | null> {
    return new Promise((resolve, reject) => {
      this.stub.Acquire({ resource, descriptors, cost }, this.deadline(), (err, res) => {
        if (!err) return resolve(res ?? null);
        // Our bug (the message names the field): retrying cannot help.
        if (err.code === grpc.status.INVALID_ARGUMENT) return reject(err);
        resolve(null); // UNAVAILABLE, DEADLINE_EXCEEDED...: the fail mode decides
      });
    });
  }

  /** Best effort: an unreported permit expires on the server by itself. */
  report(resource: string, permitId: string, outcome: "OUTCOME_SUCCESS" | "OUTCOME_FAILURE"): Promise<void> {
    if (!permitId) return Promise.resolve();
    return new Promise((resolve) =>
      this.stub.ReportOutcome({ resource, permit_id: permitId, outcome }, this.deadline(), () => resolve()),
    );
  }

  /** Ask, run `fn` if allowed, report how it went. */
  async call<T>(resource: string, fn: () => Promise<T>, descriptors: Record<string, string> = {}): Promise<T> {
    const d = await this.acquire(resource, descriptors);
    if (d === null) {
      if (this.failOpen) return fn();
      throw new Denied("UNAVAILABLE", 1, "floodgate did not answer; failing closed");
    }
    if (d.verdict !== "VERDICT_ALLOWED") {
      throw new Denied(d.verdict.replace(/^VERDICT_/, ""), seconds(d.retry_after), d.reason);
    }
    this.lastPermit = d.permit_id;
    const wait = seconds(d.wait);
    if (wait > 0) await new Promise((r) => setTimeout(r, wait * 1000)); // shaping
    try {
      const result = await fn();
      await this.report(resource, d.permit_id, "OUTCOME_SUCCESS");
      return result;
    } catch (e) {
      await this.report(resource, d.permit_id, "OUTCOME_FAILURE");
      throw e;
    }
  }

  watch(resources: string[]): grpc.ClientReadableStream<WatchEvent> {
    return this.stub.Watch({ resources });
  }

  close(): void {
    this.stub.close();
  }
}

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

async function main(): Promise<void> {
  const server = arg("--server", "127.0.0.1:50051");
  const protoDir = arg("--proto", "proto");
  const fg = new Floodgate(server, protoDir);
  const seen: Record<string, unknown> = {};

  // A keyed limit: three calls per user, then RATE_LIMITED with a retry time.
  const items: string[] = [];
  for (let i = 0; i < 4; i++) {
    try {
      await fg.call("ts.items", async () => "rows", { user: "u1" });
      items.push("ALLOWED");
    } catch (e) {
      if (!(e instanceof Denied)) throw e;
      items.push(e.verdict);
      seen.retry_after_s = e.retryAfter;
    }
  }
  seen.items = items;

  // A breaker, watched: failures open it, the stream says so.
  const stream = fg.watch(["ts.db"]);
  const events: WatchEvent[] = [];
  let wake: (() => void) | null = null;
  stream.on("data", (e: WatchEvent) => {
    events.push(e);
    wake?.();
  });
  stream.on("error", () => {}); // cancelled at the end
  const next = async (kind: WatchEvent["event"]): Promise<WatchEvent> => {
    const give_up = Date.now() + 5000;
    for (;;) {
      const i = events.findIndex((e) => e.event === kind);
      if (i >= 0) return events.splice(i, 1)[0];
      if (Date.now() > give_up) throw new Error(`no ${kind} event`);
      await new Promise<void>((r) => {
        wake = r;
        setTimeout(r, 100);
      });
    }
  };
  seen.first_event = (await next("snapshot")).event;
  const db: string[] = [];
  const permits = new Set<string>();
  for (let i = 0; i < 6; i++) {
    try {
      await fg.call("ts.db", async () => {
        throw new Error("db down");
      });
    } catch (e) {
      if (e instanceof Denied) db.push(e.verdict);
      else {
        db.push("FAILED");
        permits.add(fg.lastPermit);
      }
    }
  }
  seen.db = db;
  seen.permits = [...permits].filter((p) => p).length;
  const t = (await next("breaker")).breaker!;
  seen.transition = [t.resource, t.from_state, t.to_state];
  stream.cancel();

  // Bad input is an error naming the field, never a denial.
  try {
    await fg.acquire("");
  } catch (e) {
    const err = e as grpc.ServiceError;
    seen.bad_input = [grpc.status[err.code], err.details];
  }

  // No server: fail open runs the call, fail closed does not.
  const dead = arg("--dead", "127.0.0.1:9");
  const goneOpen = new Floodgate(dead, protoDir, true, 200);
  const goneClosed = new Floodgate(dead, protoDir, false, 200);
  seen.fail_open = await goneOpen.call("ts.items", async () => "ran", { user: "u1" });
  try {
    seen.fail_closed = await goneClosed.call("ts.items", async () => "ran", { user: "u1" });
  } catch (e) {
    seen.fail_closed = (e as Denied).verdict;
  }
  for (const c of [fg, goneOpen, goneClosed]) c.close();
  console.log(JSON.stringify(seen));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
