// The package ships a copy of the repository's proto/ (npm run sync-proto):
// it must be the same, and load.

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { test } from "node:test";

import { PROTO_DIR } from "../dist/index.js";

const REPO_PROTO = path.resolve(__dirname, "..", "..", "..", "proto");

function protos(dir: string, rel = ""): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const name = path.join(rel, e.name);
    if (e.isDirectory()) out.push(...protos(dir, name));
    else if (e.name.endsWith(".proto")) out.push(name);
  }
  return out.sort();
}

test("the shipped .proto files equal the repository's proto/ (run npm run sync-proto)", () => {
  assert.equal(PROTO_DIR, path.resolve(__dirname, "..", "proto"));
  const repo = protos(REPO_PROTO);
  assert.ok(repo.includes(path.join("floodgate", "v1", "floodgate.proto")), `no floodgate.proto in ${REPO_PROTO}`);
  assert.deepEqual(protos(PROTO_DIR), repo, "the same files");
  for (const f of repo) {
    assert.ok(
      fs.readFileSync(path.join(PROTO_DIR, f)).equals(fs.readFileSync(path.join(REPO_PROTO, f))),
      `${f} differs from the repository's: run npm run sync-proto`,
    );
  }
});

test("package.json ships proto/ and dist/", () => {
  const pkg = JSON.parse(fs.readFileSync(path.resolve(__dirname, "..", "package.json"), "utf8")) as {
    files: string[];
    version: string;
    license: string;
    main: string;
    types: string;
  };
  assert.deepEqual([pkg.version, pkg.license, pkg.main, pkg.types], ["0.5.0", "Apache-2.0", "dist/index.js", "dist/index.d.ts"]);
  assert.ok(pkg.files.includes("proto/") && pkg.files.includes("dist/"));
});
