// Runs the real Floodgate binary for the tests: $FLOODGATE_BIN (default the
// repository's target/debug/floodgate) `serve` on free loopback ports with a rules file,
// waited for on /readyz, stopped by its PID. Freezing (SIGSTOP), killing
// (SIGKILL) and restarting on the same ports are what the fail-mode tests
// and the scenario need.

import { spawn, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as http from "node:http";
import * as https from "node:https";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

export const BIN = process.env.FLOODGATE_BIN || path.resolve(__dirname, "../../../target/debug/floodgate");

export interface ServerTls {
  cert: string;
  key: string;
  /** Require client certificates signed by this CA (mTLS). */
  clientCa?: string;
  /** For the readiness probe: the CA of `cert`, and a client identity under mTLS. */
  ca: string;
  clientCert?: string;
  clientKey?: string;
}

export interface StartOptions {
  tls?: ServerTls;
  /** How long the server waits for the rules file to stay unchanged before reloading it. */
  reloadDebounce?: string;
  extraArgs?: string[];
}

/** Resolves after `ms`: for pacing a poll, never to wait for a state. */
export function tick(ms = 20): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `check` until it returns a value other than undefined/false, or fails after `timeoutMs`. */
export async function pollUntil<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${String(last)}` : ""}`);
    }
    await tick(25);
  }
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export class FloodgateServer {
  readonly dir: string;
  readonly rulesPath: string;
  readonly grpcPort: number;
  readonly httpPort: number;
  readonly options: StartOptions;
  #child: ChildProcess | null = null;
  #stderr = "";
  #exited: Promise<void> = Promise.resolve();

  private constructor(dir: string, rulesPath: string, grpcPort: number, httpPort: number, options: StartOptions) {
    this.dir = dir;
    this.rulesPath = rulesPath;
    this.grpcPort = grpcPort;
    this.httpPort = httpPort;
    this.options = options;
  }

  /** Writes `rules` to a fresh rules file and starts a server on free ports. */
  static async start(rules: string, options: StartOptions = {}): Promise<FloodgateServer> {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "floodgate-node-"));
    const rulesPath = path.join(dir, "rules.yaml");
    fs.writeFileSync(rulesPath, rules);
    const s = new FloodgateServer(dir, rulesPath, await freePort(), await freePort(), options);
    await s.startProcess();
    return s;
  }

  get pid(): number {
    const pid = this.#child?.pid;
    if (pid === undefined) throw new Error("the server is not running");
    return pid;
  }

  get running(): boolean {
    return this.#child !== null;
  }

  /** The gRPC endpoint as a client URL. */
  get url(): string {
    return `${this.options.tls ? "https" : "http"}://127.0.0.1:${this.grpcPort}`;
  }

  get httpUrl(): string {
    return `${this.options.tls ? "https" : "http"}://127.0.0.1:${this.httpPort}`;
  }

  get stderr(): string {
    return this.#stderr;
  }

  async startProcess(): Promise<void> {
    if (this.#child) throw new Error("already running");
    const args = [
      "serve",
      "--listen",
      `127.0.0.1:${this.grpcPort}`,
      "--http-listen",
      `127.0.0.1:${this.httpPort}`,
      "--config",
      this.rulesPath,
      "--reload-debounce",
      this.options.reloadDebounce ?? "200ms",
      "--threads",
      "2",
      ...(this.options.tls
        ? [
            "--tls-cert",
            this.options.tls.cert,
            "--tls-key",
            this.options.tls.key,
            ...(this.options.tls.clientCa ? ["--tls-client-ca", this.options.tls.clientCa] : []),
          ]
        : []),
      ...(this.options.extraArgs ?? []),
    ];
    const child = spawn(BIN, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.#child = child;
    this.#stderr = "";
    child.stdout?.resume();
    child.stderr?.on("data", (b: Buffer) => {
      this.#stderr = (this.#stderr + b.toString()).slice(-20_000);
    });
    let exited = false;
    this.#exited = new Promise((resolve) =>
      child.once("exit", () => {
        exited = true;
        if (this.#child === child) this.#child = null;
        resolve();
      }),
    );
    child.once("error", (e) => {
      this.#stderr += `\nspawn ${BIN}: ${e.message}`;
    });
    await pollUntil(
      `${BIN} to be ready on ${this.httpUrl}/readyz`,
      async () => {
        if (exited) throw new Error(`the server exited:\n${this.#stderr}`);
        return (await this.#readyz()) === 200;
      },
      20_000,
    );
  }

  #readyz(): Promise<number> {
    const tls = this.options.tls;
    return new Promise((resolve) => {
      const done = (res: http.IncomingMessage) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      };
      const req = tls
        ? https.get(`${this.httpUrl}/readyz`, { ca: fs.readFileSync(tls.ca), ...(tls.clientCert ? { cert: fs.readFileSync(tls.clientCert), key: fs.readFileSync(tls.clientKey!) } : {}), timeout: 1000 }, done)
        : http.get(`${this.httpUrl}/readyz`, { timeout: 1000 }, done);
      req.on("error", () => resolve(0));
      req.on("timeout", () => req.destroy());
    });
  }

  /**
   * SIGSTOP: the process stays, its sockets stay open, nothing answers.
   * Resolves once every thread is stopped: the kernel stops each one
   * asynchronously, and a worker thread may still answer a call meanwhile.
   */
  async freeze(): Promise<void> {
    const pid = this.pid;
    process.kill(pid, "SIGSTOP");
    const stopped = () => {
      try {
        return fs
          .readdirSync(`/proc/${pid}/task`)
          .every((t) => ["T", "t"].includes(fs.readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8").split(") ")[1]?.[0] ?? ""));
      } catch {
        return false;
      }
    };
    const deadline = performance.now() + 5000;
    while (!stopped()) {
      if (performance.now() > deadline) throw new Error(`pid ${pid} did not stop within 5 s`);
      await new Promise((r) => setTimeout(r, 2));
    }
  }

  /** SIGCONT. */
  thaw(): void {
    process.kill(this.pid, "SIGCONT");
  }

  /** SIGKILL, waited for. */
  async kill(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    process.kill(child.pid!, "SIGKILL");
    await this.#exited;
  }

  /** SIGTERM (SIGKILL after 5 s), waited for. */
  async stop(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    try {
      process.kill(child.pid!, "SIGCONT");
      process.kill(child.pid!, "SIGTERM");
    } catch {
      // gone already
    }
    const timer = setTimeout(() => {
      try {
        process.kill(child.pid!, "SIGKILL");
      } catch {
        // gone
      }
    }, 5000);
    await this.#exited;
    clearTimeout(timer);
  }

  /** Starts the server again on the same ports, with the same rules file. */
  async restart(): Promise<void> {
    await this.stop();
    await this.startProcess();
  }

  /** Replaces the rules file (atomically: written beside it, then renamed). */
  writeRules(rules: string): void {
    const tmp = `${this.rulesPath}.tmp`;
    fs.writeFileSync(tmp, rules);
    fs.renameSync(tmp, this.rulesPath);
  }

  /** Stops the server and removes its directory. */
  async dispose(): Promise<void> {
    await this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
