// The middleware on Node's own http server, against the real binary:
// statuses, the rate limit fields, and outcomes reported from the status.

import assert from "node:assert/strict";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { Client, Outcome, rateLimit } from "../dist/index.js";
import { FloodgateServer, pollUntil } from "./server.js";

const RULES = `
resources:
  - name: mw.api
    limits:
      - { name: per-tenant, key: [tenant], algorithm: fixed_window, limit: 2, window: 1m }
  - name: mw.flaky
    breaker:
      failure_rate_threshold: 0.5
      window: { kind: count, size: 4 }
      minimum_calls: 4
      wait_in_open: 30s
      half_open_calls: 1
  - name: mw.notfound
    breaker:
      failure_rate_threshold: 0.5
      window: { kind: count, size: 4 }
      minimum_calls: 4
      wait_in_open: 30s
      half_open_calls: 1
  - name: mw.slow
    concurrency: { max_in_flight: 1 }
`;

interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

let floodgate: FloodgateServer;
let client: Client;
let app: http.Server;
let base: string;
/** Requests to /slow wait for this to be called. */
const slowWaiting: Array<() => void> = [];

function get(path: string, headers: Record<string, string> = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = http.get(`${base}${path}`, { headers, agent: false }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
  });
}

before(async () => {
  floodgate = await FloodgateServer.start(RULES);
  client = new Client(floodgate.url, { requestTimeoutMs: 2000 });
  const limit = rateLimit(client, {
    resource: (req) => {
      const path = (req.url ?? "/").split("?")[0];
      if (path === "/healthz") return null; // unasked
      return `mw.${path!.slice(1)}`;
    },
    descriptors: (req) => ({ tenant: req.headers["x-tenant"] as string | undefined }),
  });
  app = http.createServer((req, res) => {
    void limit(req, res, (err) => {
      if (err) {
        res.statusCode = 500;
        res.end(String(err));
        return;
      }
      switch (req.url) {
        case "/flaky":
          res.statusCode = 502;
          res.end("upstream failed");
          return;
        case "/notfound":
          res.statusCode = 404;
          res.end("no such thing");
          return;
        case "/slow":
          slowWaiting.push(() => res.end("slow done"));
          return;
        default:
          res.end("ok");
      }
    });
  });
  await new Promise<void>((r) => app.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(app.address() as AddressInfo).port}`;
});

after(async () => {
  app?.closeAllConnections();
  await new Promise((r) => app?.close(r));
  await client?.close();
  await floodgate?.dispose();
});

describe("rateLimit middleware", () => {
  test("allowed answers carry the rate limit fields; the third is a 429 with Retry-After and JSON", async () => {
    const one = await get("/api", { "x-tenant": "acme" });
    assert.equal(one.status, 200);
    assert.equal(one.body, "ok");
    assert.equal(one.headers["ratelimit-policy"], '"per-tenant";q=2;w=60');
    assert.match(one.headers["ratelimit"] as string, /^"per-tenant";r=1;t=([1-9]|[1-5][0-9]|60)$/);
    assert.equal(one.headers["x-ratelimit-limit"], "2");
    assert.equal(one.headers["x-ratelimit-remaining"], "1");
    const reset = Number(one.headers["x-ratelimit-reset"]);
    assert.ok(reset >= 1 && reset <= 60, `reset ${reset}`);
    assert.equal(one.headers["ratelimit"], `"per-tenant";r=1;t=${reset}`);
    assert.equal(one.headers["retry-after"], undefined);

    const two = await get("/api", { "x-tenant": "acme" });
    assert.equal(two.status, 200);
    assert.equal(two.headers["x-ratelimit-remaining"], "0");

    const three = await get("/api", { "x-tenant": "acme" });
    assert.equal(three.status, 429);
    assert.equal(three.headers["content-type"], "application/json");
    const retry = Number(three.headers["retry-after"]);
    assert.ok(retry >= 1 && retry <= 60, `retry-after ${three.headers["retry-after"]}`);
    assert.match(three.headers["ratelimit"] as string, /^"per-tenant";r=0;t=\d+$/);
    assert.equal(three.headers["ratelimit-policy"], '"per-tenant";q=2;w=60');
    assert.equal(three.headers["x-ratelimit-remaining"], "0");
    const body = JSON.parse(three.body) as { error: string; reason: string; retry_after_seconds: number };
    assert.equal(body.error, "rate_limited");
    assert.match(body.reason, /per-tenant/);
    assert.equal(body.retry_after_seconds, retry);

    // Another tenant has its own bucket; a request without the descriptor matches no limit.
    assert.equal((await get("/api", { "x-tenant": "other" })).status, 200);
    const keyless = await get("/api");
    assert.equal(keyless.status, 200);
    assert.equal(keyless.headers["ratelimit"], undefined);
  });

  test("a request the resource function skips is not asked", async () => {
    const health = await get("/healthz");
    assert.equal(health.status, 200);
    assert.equal(health.headers["ratelimit-policy"], undefined);
  });

  test("5xx answers are reported as failures: the breaker opens and the middleware answers 503", async () => {
    for (let i = 0; i < 4; i++) assert.equal((await get("/flaky")).status, 502);
    const open = await pollUntil("the breaker to open", async () => {
      const a = await get("/flaky");
      return a.status === 503 ? a : undefined;
    });
    const body = JSON.parse(open.body) as { error: string; retry_after_seconds: number };
    assert.equal(body.error, "circuit_open");
    const retry = Number(open.headers["retry-after"]);
    assert.ok(retry > 20 && retry <= 30, `retry-after ${open.headers["retry-after"]}`);
    assert.equal(body.retry_after_seconds, retry);
  });

  test("a 404 is not a failure: the breaker stays closed", async () => {
    for (let i = 0; i < 8; i++) assert.equal((await get("/notfound")).status, 404);
    await client.flush();
    const d = await client.acquire({ resource: "mw.notfound" });
    assert.equal(d.allowed, true);
    d.permit?.report(Outcome.Success);
    assert.equal((await get("/notfound")).status, 404);
  });

  test("a held concurrency slot answers 429; it is freed when the response finishes", async () => {
    const first = get("/slow");
    await pollUntil("the first request to be in the handler", () => slowWaiting.length === 1);
    const second = await get("/slow");
    assert.equal(second.status, 429);
    assert.equal((JSON.parse(second.body) as { error: string }).error, "concurrency_limited");
    assert.ok(Number(second.headers["retry-after"]) >= 1);
    slowWaiting.shift()!();
    assert.equal((await first).status, 200);
    await pollUntil("the slot to be free again", async () => {
      const d = await client.acquire({ resource: "mw.slow" });
      d.permit?.report(Outcome.Ignored);
      return d.allowed;
    });
    const third = get("/slow");
    await pollUntil("the third request to be in the handler", () => slowWaiting.length === 1);
    slowWaiting.shift()!();
    assert.equal((await third).status, 200);
  });

  test("a client that hangs up before the answer frees the slot (the permit is cancelled)", async () => {
    const req = http.get(`${base}/slow`, { agent: false });
    req.on("error", () => {});
    await pollUntil("the request to be in the handler", () => slowWaiting.length === 1);
    req.destroy();
    const back = await pollUntil("the slot of the abandoned request to come back", async () => {
      const d = await client.acquire({ resource: "mw.slow" });
      if (!d.allowed) return undefined;
      d.permit!.report(Outcome.Ignored);
      return d;
    });
    assert.equal(back.allowed, true);
    slowWaiting.shift()?.();
  });
});
