// The Node runner of the shared client scenario (clients/SCENARIO.md):
//
//   node scenario-runner.js --target http://127.0.0.1:PORT --fail-mode open|closed|local
//
// One JSON command a line on stdin, one JSON answer a line on stdout;
// `{"ready": true}` once the client is built. Diagnostics go to stderr.

import * as readline from "node:readline";

import { Client, FailMode, Outcome, Source, type Permit } from "../dist/index.js";

interface Command {
  op: string;
  resource?: string;
  descriptors?: Record<string, string>;
  count?: number;
  timeout_ms?: number;
}

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

function fail(message: string): never {
  process.stderr.write(`scenario-runner: ${message}\n`);
  process.exit(2);
}

const target = arg("--target") ?? fail("--target URL is required");
const mode = arg("--fail-mode") ?? fail("--fail-mode open|closed|local is required");
const failMode =
  mode === "open" ? FailMode.open : mode === "closed" ? FailMode.closed : mode === "local" ? FailMode.local(1.0) : fail(`unknown fail mode ${mode}`);

// A quarter of a second per call, so that a frozen server is decided by the
// fail mode within about that (the same deadline in every mode).
const client = new Client(target, {
  failMode,
  requestTimeoutMs: 250,
  onConnectionChange: (endpoint, reachable, why) =>
    process.stderr.write(`scenario-runner: ${endpoint} ${reachable ? "reachable again" : `unreachable (${why})`}\n`),
});
const held: Permit[] = [];

function say(answer: object): void {
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}

async function acquire(c: Command, hold: boolean): Promise<object> {
  const count = { allowed: 0, denied: 0, errors: 0, server: 0, local: 0 };
  for (let i = 0; i < (c.count ?? 1); i++) {
    try {
      const d = await client.acquire({ resource: c.resource ?? "", descriptors: c.descriptors ?? {}, cost: 1 });
      if (d.source === Source.Server) count.server += 1;
      else count.local += 1;
      if (!d.allowed) {
        count.denied += 1;
        continue;
      }
      count.allowed += 1;
      if (d.permit) {
        if (hold) held.push(d.permit);
        else d.permit.report(Outcome.Success);
      }
    } catch (e) {
      count.errors += 1;
      process.stderr.write(`scenario-runner: acquire ${c.resource}: ${String(e)}\n`);
    }
  }
  return count;
}

async function handle(c: Command): Promise<object | null> {
  switch (c.op) {
    case "acquire":
      return acquire(c, false);
    case "hold":
      return acquire(c, true);
    case "release": {
      const permits = held.splice(0);
      for (const p of permits) p.report(Outcome.Success);
      // The reports leave at once (they free slots); wait for them, bounded.
      await Promise.race([client.flush(), new Promise((r) => setTimeout(r, 1000))]);
      return { released: permits.length };
    }
    case "wait_server": {
      const deadline = Date.now() + (c.timeout_ms ?? 10_000);
      for (;;) {
        const d = await client.acquire({ resource: "scenario.probe" });
        d.permit?.report(Outcome.Success);
        if (d.source === Source.Server) return { server: true };
        if (Date.now() >= deadline) return { server: false };
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    case "quit":
      await client.close({ timeoutMs: 2000 });
      return null;
    default:
      return { error: `unknown op ${JSON.stringify(c.op)}` };
  }
}

async function main(): Promise<void> {
  say({ ready: true });
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let c: Command;
    try {
      c = JSON.parse(line) as Command;
    } catch (e) {
      say({ error: `not JSON: ${String(e)}` });
      continue;
    }
    const answer = await handle(c);
    if (answer === null) {
      process.exit(0);
    }
    say(answer);
  }
  // stdin closed without quit: close anyway.
  await client.close({ timeoutMs: 2000 });
  process.exit(0);
}

main().catch((e) => fail(String(e?.stack ?? e)));
