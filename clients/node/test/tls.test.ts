// TLS and mTLS against the real binary (certificates made with the openssl
// CLI; skipped without it), and the bearer token's metadata.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { after, before, describe, test } from "node:test";

import { Client, FailMode, FloodgateError, Source, Verdict } from "../dist/index.js";
import { FloodgateServer } from "./server.js";

const RULES = `
resources:
  - name: tls.api
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 5, window: 1m }
`;

function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

interface Pki {
  dir: string;
  ca: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
  otherCa: string;
}

function openssl(dir: string, ...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** A CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and an unrelated CA. */
function makePki(): Pki {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "floodgate-node-tls-"));
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  const ca = (name: string) =>
    openssl(dir, "req", "-x509", ...ec, "-keyout", `${name}.key`, "-out", `${name}.pem`, "-days", "2", "-subj", `/CN=${name}`,
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  ca("ca");
  ca("other-ca");
  const leaf = (name: string, ext: string) => {
    openssl(dir, "req", ...ec, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
    openssl(dir, "x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
      "-out", `${name}.pem`, "-days", "2", "-extfile", `${name}.ext`);
  };
  leaf("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n");
  leaf("node-client", "subjectAltName=DNS:node-client\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n");
  const p = (f: string) => path.join(dir, f);
  return {
    dir,
    ca: p("ca.pem"),
    caKey: p("ca.key"),
    serverCert: p("server.pem"),
    serverKey: p("server.key"),
    clientCert: p("node-client.pem"),
    clientKey: p("node-client.key"),
    otherCa: p("other-ca.pem"),
  };
}

describe("TLS", { skip: hasOpenssl() ? false : "no openssl CLI" }, () => {
  let pki: Pki;
  let server: FloodgateServer;
  const clients: Client[] = [];
  const newClient = (...args: ConstructorParameters<typeof Client>) => {
    const c = new Client(...args);
    clients.push(c);
    return c;
  };

  before(async () => {
    pki = makePki();
    server = await FloodgateServer.start(RULES, {
      tls: {
        cert: pki.serverCert,
        key: pki.serverKey,
        clientCa: pki.ca,
        ca: pki.ca,
        clientCert: pki.clientCert,
        clientKey: pki.clientKey,
      },
    });
  });

  after(async () => {
    await Promise.all(clients.map((c) => c.close({ timeoutMs: 500 })));
    await server?.dispose();
    if (pki) fs.rmSync(pki.dir, { recursive: true, force: true });
  });

  test("mTLS: the CA and a client certificate reach the server", async () => {
    assert.match(server.url, /^https:\/\//);
    const c = newClient(server.url, {
      requestTimeoutMs: 3000,
      failMode: FailMode.closed,
      tls: { ca: fs.readFileSync(pki.ca), cert: fs.readFileSync(pki.clientCert), key: fs.readFileSync(pki.clientKey) },
    });
    const d = await c.acquire({ resource: "tls.api", descriptors: { user: "u" } });
    assert.deepEqual([d.verdict, d.source, d.limits[0]?.remaining], [Verdict.Allowed, Source.Server, 4]);
  });

  test("the certificate is checked against tls.serverName when given", async () => {
    const c = newClient(`https://127.0.0.1:${server.grpcPort}`, {
      requestTimeoutMs: 3000,
      failMode: FailMode.closed,
      tls: {
        ca: fs.readFileSync(pki.ca, "utf8"),
        cert: fs.readFileSync(pki.clientCert, "utf8"),
        key: fs.readFileSync(pki.clientKey, "utf8"),
        serverName: "localhost",
      },
    });
    assert.equal((await c.acquire({ resource: "tls.api" })).source, Source.Server);
  });

  test("without a client certificate, or trusting another CA, nothing answers: the fail mode does", async () => {
    const noCert = newClient(server.url, { requestTimeoutMs: 1000, failMode: FailMode.closed, tls: { ca: fs.readFileSync(pki.ca) } });
    const d = await noCert.acquire({ resource: "tls.api" });
    assert.deepEqual([d.verdict, d.source], [Verdict.Shed, Source.FailClosed]);
    const wrongCa = newClient(server.url, {
      requestTimeoutMs: 1000,
      failMode: FailMode.closed,
      tls: { ca: fs.readFileSync(pki.otherCa), cert: fs.readFileSync(pki.clientCert), key: fs.readFileSync(pki.clientKey) },
    });
    assert.equal((await wrongCa.acquire({ resource: "tls.api" })).source, Source.FailClosed);
    const plaintext = newClient(`http://127.0.0.1:${server.grpcPort}`, { requestTimeoutMs: 1000, failMode: FailMode.closed });
    assert.equal((await plaintext.acquire({ resource: "tls.api" })).source, Source.FailClosed);
  });

  test("a certificate without its key is a configuration error", () => {
    assert.throws(
      () => new Client(server.url, { tls: { cert: fs.readFileSync(pki.clientCert) } }),
      (e: unknown) => e instanceof FloodgateError && /tls.cert and tls.key go together/.test(e.message),
    );
  });
});

describe("bearer token", () => {
  let h2: http2.Http2Server;
  const seen: Array<string | undefined> = [];

  before(async () => {
    // Not a Floodgate: an HTTP/2 listener that notes the metadata of each
    // call and answers UNAVAILABLE, so that the client fails open.
    h2 = http2.createServer();
    h2.on("stream", (stream, headers) => {
      seen.push(headers["authorization"] as string | undefined);
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "14", "grpc-message": "noted" }, { endStream: true });
    });
    await new Promise<void>((r) => h2.listen(0, "127.0.0.1", r));
  });

  after(async () => {
    await new Promise((r) => h2.close(r));
  });

  test("every call carries authorization: Bearer TOKEN", async () => {
    const port = (h2.address() as AddressInfo).port;
    const c = new Client(`http://127.0.0.1:${port}`, { token: "s3cret-token-0123456789", requestTimeoutMs: 2000 });
    try {
      const d = await c.acquire({ resource: "anything" });
      assert.equal(d.source, Source.FailOpen, "UNAVAILABLE: the fail mode answers");
      // The dry run the client makes when it is made, then the acquire.
      assert.deepEqual(seen, ["Bearer s3cret-token-0123456789", "Bearer s3cret-token-0123456789"]);
    } finally {
      await c.close();
    }
    assert.throws(() => new Client("http://127.0.0.1:1", { token: "two words" }), FloodgateError);
  });

  test("the real server takes calls that carry a token", async () => {
    const server = await FloodgateServer.start(RULES);
    const c = new Client(server.url, { token: "s3cret-token-0123456789", requestTimeoutMs: 2000 });
    try {
      assert.equal((await c.acquire({ resource: "tls.api" })).source, Source.Server);
    } finally {
      await c.close();
      await server.dispose();
    }
  });
});
