#!/usr/bin/env node
// Copies the repository's .proto files (../../proto) into this package's
// proto/, which is shipped with it and loaded at run time by
// @grpc/proto-loader. test/proto.test.ts fails while the two differ.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const from = path.resolve(__dirname, "..", "..", "..", "proto");
const to = path.resolve(__dirname, "..", "proto");

function protos(dir, rel = "") {
  const out = [];
  for (const entry of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const name = path.join(rel, entry.name);
    if (entry.isDirectory()) out.push(...protos(dir, name));
    else if (entry.name.endsWith(".proto")) out.push(name);
  }
  return out.sort();
}

if (!fs.existsSync(from)) {
  console.error(`sync-proto: ${from} not found (run it inside the Floodgate repository)`);
  process.exit(1);
}
fs.rmSync(to, { recursive: true, force: true });
for (const file of protos(from)) {
  fs.mkdirSync(path.dirname(path.join(to, file)), { recursive: true });
  fs.copyFileSync(path.join(from, file), path.join(to, file));
  console.log(`sync-proto: ${file}`);
}
