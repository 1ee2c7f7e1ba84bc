// The protocol's messages as @grpc/proto-loader hands them over with the
// options in proto.ts (field names as in the .proto, enums as their names,
// 64-bit integers as JavaScript numbers, defaults filled in, oneofs named).
// Hand-written from proto/floodgate/v1/floodgate.proto: only the messages
// and enums this package sends or reads.

import type * as grpc from "@grpc/grpc-js";

/** google.protobuf.Duration. `seconds` is an int64, read as a number. */
export interface WireDuration {
  seconds: number;
  nanos: number;
}

export type WirePriority =
  | "PRIORITY_UNSPECIFIED"
  | "PRIORITY_CRITICAL_PLUS"
  | "PRIORITY_CRITICAL"
  | "PRIORITY_SHEDDABLE_PLUS"
  | "PRIORITY_SHEDDABLE";

export type WireVerdict =
  | "VERDICT_UNSPECIFIED"
  | "VERDICT_ALLOWED"
  | "VERDICT_RATE_LIMITED"
  | "VERDICT_CIRCUIT_OPEN"
  | "VERDICT_CONCURRENCY_LIMITED"
  | "VERDICT_SHED";

export type WireBreakerState =
  | "BREAKER_STATE_UNSPECIFIED"
  | "BREAKER_STATE_CLOSED"
  | "BREAKER_STATE_OPEN"
  | "BREAKER_STATE_HALF_OPEN"
  | "BREAKER_STATE_FORCED_OPEN"
  | "BREAKER_STATE_DISABLED"
  | "BREAKER_STATE_METRICS_ONLY";

export type WireOutcome = "OUTCOME_UNSPECIFIED" | "OUTCOME_SUCCESS" | "OUTCOME_FAILURE" | "OUTCOME_IGNORED";

/** floodgate.v1.AcquireRequest */
export interface WireAcquireRequest {
  resource: string;
  descriptors: Record<string, string>;
  cost: number;
  dry_run: boolean;
  settle: boolean;
  priority: WirePriority;
  usage?: Record<string, number>;
}

/** floodgate.v1.LimitStatus */
export interface WireLimitStatus {
  name: string;
  limit: number;
  remaining: number;
  reset_after: WireDuration | null;
  retry_after: WireDuration | null;
  window: WireDuration | null;
  exceeded: boolean;
  algorithm: string;
  shadow: boolean;
  admitted_over_limit: boolean;
}

/** floodgate.v1.AcquireResponse */
export interface WireAcquireResponse {
  verdict: WireVerdict;
  permit_id: string;
  limits: WireLimitStatus[];
  retry_after: WireDuration | null;
  wait: WireDuration | null;
  breaker_state: WireBreakerState;
  degradation_level: number;
  reason: string;
  holds_slot: boolean;
  max_in_flight: number;
  paid_by?: string;
}

/** floodgate.v1.AcquireBatchRequest */
export interface WireAcquireBatchRequest {
  requests: WireAcquireRequest[];
}

/** floodgate.v1.AcquireBatchResponse */
export interface WireAcquireBatchResponse {
  responses: WireAcquireResponse[];
}

/** floodgate.v1.ReportOutcomeRequest */
export interface WireReportOutcomeRequest {
  resource: string;
  permit_id: string;
  outcome: WireOutcome;
  latency?: WireDuration | null;
  /** proto3 `optional`: absent when not settling. */
  actual_cost?: number;
  usage?: Record<string, number>;
}

/** floodgate.v1.ReportOutcomeResponse */
export interface WireReportOutcomeResponse {
  counted: boolean;
  breaker_state: WireBreakerState;
  settled: boolean;
}

/** floodgate.v1.ReportOutcomeBatchRequest */
export interface WireReportOutcomeBatchRequest {
  reports: WireReportOutcomeRequest[];
}

/** floodgate.v1.ReportOutcomeBatchResponse */
export interface WireReportOutcomeBatchResponse {
  responses: WireReportOutcomeResponse[];
}

/** floodgate.v1.ChargeRequest */
export interface WireChargeRequest {
  resource: string;
  descriptors: Record<string, string>;
  cost: number;
  usage?: Record<string, number>;
  idempotency_key?: string;
}

/** floodgate.v1.ChargeResponse */
export interface WireChargeResponse {
  limits: WireLimitStatus[];
}

export type UnaryCallback<T> = (err: grpc.ServiceError | null, value?: T) => void;

/** A unary method of the generated client, as grpc-js builds it. */
export type UnaryMethod<Req, Res> = (
  request: Req,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: UnaryCallback<Res>,
) => grpc.ClientUnaryCall;

/** The `floodgate.v1.Floodgate` service client (the methods this package calls). */
export interface FloodgateStub extends grpc.Client {
  Acquire: UnaryMethod<WireAcquireRequest, WireAcquireResponse>;
  AcquireBatch: UnaryMethod<WireAcquireBatchRequest, WireAcquireBatchResponse>;
  ReportOutcome: UnaryMethod<WireReportOutcomeRequest, WireReportOutcomeResponse>;
  ReportOutcomeBatch: UnaryMethod<WireReportOutcomeBatchRequest, WireReportOutcomeBatchResponse>;
  Charge: UnaryMethod<WireChargeRequest, WireChargeResponse>;
}

export type FloodgateStubConstructor = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: grpc.ChannelOptions,
) => FloodgateStub;
