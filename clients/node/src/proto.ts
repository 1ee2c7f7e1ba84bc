// Loads the shipped floodgate.proto at run time (nothing generated).

import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import type { FloodgateStubConstructor } from "./wire.js";

/** The package's proto/ directory (shipped beside dist/). */
export const PROTO_DIR = path.resolve(__dirname, "..", "proto");

/** The options the hand-written types in wire.ts describe. */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  enums: String,
  longs: Number,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

let cached: FloodgateStubConstructor | undefined;

/** The `floodgate.v1.Floodgate` client constructor. */
export function floodgateStub(): FloodgateStubConstructor {
  if (cached) return cached;
  const definition = protoLoader.loadSync("floodgate/v1/floodgate.proto", LOADER_OPTIONS);
  const loaded = grpc.loadPackageDefinition(definition);
  const pkg = (loaded.floodgate as grpc.GrpcObject).v1 as grpc.GrpcObject;
  cached = pkg.Floodgate as unknown as FloodgateStubConstructor;
  return cached;
}
