// Plays the Rust driver's part of the shared client scenario
// (clients/SCENARIO.md) against the compiled scenario-runner.js and the real
// binary: stops, freezes, kills and restarts the server, lowers a limit
// through the rules file, and asserts the table.

import assert from "node:assert/strict";
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import * as readline from "node:readline";
import { describe, test } from "node:test";

import { Client } from "../dist/index.js";
import { FloodgateServer, pollUntil } from "./server.js";

const REPO_RULES = path.resolve(__dirname, "..", "..", "scenario-rules.yaml");
const RUNNER = path.join(__dirname, "scenario-runner.js");

interface Counts {
  allowed: number;
  denied: number;
  errors: number;
  server: number;
  local: number;
}

class Runner {
  readonly #child: ChildProcessWithoutNullStreams;
  readonly #lines: AsyncIterator<string>;
  stderr = "";

  constructor(target: string, mode: string) {
    this.#child = spawn(process.execPath, [RUNNER, "--target", target, "--fail-mode", mode]);
    this.#child.stderr.on("data", (b: Buffer) => (this.stderr += b.toString()));
    this.#lines = readline.createInterface({ input: this.#child.stdout })[Symbol.asyncIterator]();
  }

  async read(): Promise<Record<string, unknown>> {
    let timer: NodeJS.Timeout | undefined;
    const next = await Promise.race([
      this.#lines.next(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer in 60 s; stderr:\n${this.stderr}`)), 60_000);
      }),
    ]).finally(() => clearTimeout(timer));
    if (next.done) throw new Error(`the runner closed its output; stderr:\n${this.stderr}`);
    return JSON.parse(next.value) as Record<string, unknown>;
  }

  async send(command: object): Promise<Record<string, unknown>> {
    this.#child.stdin.write(`${JSON.stringify(command)}\n`);
    return this.read();
  }

  async quit(): Promise<number | null> {
    const exited = new Promise<number | null>((r) => this.#child.once("exit", (code) => r(code)));
    this.#child.stdin.write(`${JSON.stringify({ op: "quit" })}\n`);
    return exited;
  }
}

const api = (tenant: string, count: number) => ({ resource: "scenario.api", descriptors: { tenant }, count });
const pool = (count: number) => ({ resource: "scenario.pool", descriptors: {}, count });
const counts = (allowed: number, denied: number, server: number, local: number): Counts => ({
  allowed,
  denied,
  errors: 0,
  server,
  local,
});

/** Runs the seven steps in `mode`; returns every answer, asserting the table as it goes. */
async function scenario(mode: "local" | "open" | "closed"): Promise<unknown[]> {
  const rules = fs.readFileSync(REPO_RULES, "utf8");
  const server = await FloodgateServer.start(rules);
  const runner = new Runner(server.url, mode);
  const answers: unknown[] = [];
  const step = (n: number, got: unknown, want: unknown) => {
    answers.push(got);
    assert.deepEqual(got, want, `step ${n} (${mode}); runner stderr:\n${runner.stderr}`);
  };
  try {
    assert.deepEqual(await runner.read(), { ready: true });

    // 1. up: 15 of 20 taken.
    step(1, await runner.send({ op: "acquire", ...api("t1", 15) }), counts(15, 0, 15, 0));

    // 2. up: 4 slots of max_in_flight 4, then released.
    step(2, await runner.send({ op: "hold", ...pool(6) }), counts(4, 2, 6, 0));
    step(2, await runner.send({ op: "release" }), { released: 4 });

    // 3. frozen: the deadline holds, each call within 1 s.
    await server.freeze();
    const started = Date.now();
    const frozen = await runner.send({ op: "acquire", ...api("t1", 3) });
    const took = Date.now() - started;
    assert.ok(took < 3 * 1000, `3 calls took ${took} ms with the server frozen`);
    console.log(`# ${mode}: 3 calls to the frozen server took ${took} ms`);
    step(3, frozen, mode === "closed" ? counts(0, 3, 0, 3) : counts(3, 0, 0, 3));

    // 4. killed: 5 were left, 3 taken locally: 2 more.
    await server.kill();
    const killed = await runner.send({ op: "acquire", ...api("t1", 10) });
    step(4, killed, mode === "local" ? counts(2, 8, 0, 10) : mode === "open" ? counts(10, 0, 0, 10) : counts(0, 10, 0, 10));

    // 5. killed: the local share of max_in_flight 4. (Open and closed keep no
    // concurrency limit: everything is allowed, or nothing; see the report.)
    const held = await runner.send({ op: "hold", ...pool(6) });
    step(5, held, mode === "local" ? counts(4, 2, 0, 6) : mode === "open" ? counts(6, 0, 0, 6) : counts(0, 6, 0, 6));
    step(5, await runner.send({ op: "release" }), { released: mode === "local" ? 4 : 0 });

    // 6. restarted (its state is gone), waited for: 20 of 20 again.
    await server.startProcess();
    step(6, await runner.send({ op: "wait_server", timeout_ms: 15_000 }), { server: true });
    step(6, await runner.send({ op: "acquire", ...api("t1", 25) }), counts(20, 5, 25, 0));

    // 7. the limit lowered to 10, the reload seen: 10 of 15 for a new tenant.
    server.writeRules(rules.replace("limit: 20", "limit: 10"));
    const probe = new Client(server.url, { requestTimeoutMs: 1000 });
    try {
      await pollUntil("the lowered limit to be in force", async () => {
        const d = await probe.acquire({ resource: "scenario.api", descriptors: { tenant: "reload-probe" }, dryRun: true });
        return d.limits[0]?.limit === 10;
      });
    } finally {
      await probe.close();
    }
    step(7, await runner.send({ op: "acquire", ...api("t2", 15) }), counts(10, 5, 15, 0));

    assert.equal(await runner.quit(), 0, `the runner's exit code; stderr:\n${runner.stderr}`);
    return answers;
  } finally {
    await server.dispose();
  }
}

describe("the shared scenario (clients/SCENARIO.md)", { timeout: 180_000 }, () => {
  test("the rules the driver uses are the repository's", () => {
    assert.match(fs.readFileSync(REPO_RULES, "utf8"), /limit: 20, window: 1h/);
  });

  for (const mode of ["local", "open", "closed"] as const) {
    test(`fail mode ${mode}: the table holds`, async () => {
      await scenario(mode);
    });
  }
});
