import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CRITICAL_PLUS: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
    PRIORITY_SHEDDABLE_PLUS: _ClassVar[Priority]
    PRIORITY_SHEDDABLE: _ClassVar[Priority]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    VERDICT_ALLOWED: _ClassVar[Verdict]
    VERDICT_RATE_LIMITED: _ClassVar[Verdict]
    VERDICT_CIRCUIT_OPEN: _ClassVar[Verdict]
    VERDICT_CONCURRENCY_LIMITED: _ClassVar[Verdict]
    VERDICT_SHED: _ClassVar[Verdict]

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_STATE_UNSPECIFIED: _ClassVar[BreakerState]
    BREAKER_STATE_CLOSED: _ClassVar[BreakerState]
    BREAKER_STATE_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_HALF_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_FORCED_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_DISABLED: _ClassVar[BreakerState]
    BREAKER_STATE_METRICS_ONLY: _ClassVar[BreakerState]

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_SUCCESS: _ClassVar[Outcome]
    OUTCOME_FAILURE: _ClassVar[Outcome]
    OUTCOME_IGNORED: _ClassVar[Outcome]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CRITICAL_PLUS: Priority
PRIORITY_CRITICAL: Priority
PRIORITY_SHEDDABLE_PLUS: Priority
PRIORITY_SHEDDABLE: Priority
VERDICT_UNSPECIFIED: Verdict
VERDICT_ALLOWED: Verdict
VERDICT_RATE_LIMITED: Verdict
VERDICT_CIRCUIT_OPEN: Verdict
VERDICT_CONCURRENCY_LIMITED: Verdict
VERDICT_SHED: Verdict
BREAKER_STATE_UNSPECIFIED: BreakerState
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState
BREAKER_STATE_FORCED_OPEN: BreakerState
BREAKER_STATE_DISABLED: BreakerState
BREAKER_STATE_METRICS_ONLY: BreakerState
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_SUCCESS: Outcome
OUTCOME_FAILURE: Outcome
OUTCOME_IGNORED: Outcome

class AcquireRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "cost", "dry_run", "settle", "priority", "usage")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    cost: int
    dry_run: bool
    settle: bool
    priority: Priority
    usage: _containers.ScalarMap[str, int]
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., cost: _Optional[int] = ..., dry_run: _Optional[bool] = ..., settle: _Optional[bool] = ..., priority: _Optional[_Union[Priority, str]] = ..., usage: _Optional[_Mapping[str, int]] = ...) -> None: ...

class LimitStatus(_message.Message):
    __slots__ = ("name", "limit", "remaining", "reset_after", "retry_after", "window", "exceeded", "algorithm", "shadow", "admitted_over_limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    RESET_AFTER_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    EXCEEDED_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_OVER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit: int
    remaining: int
    reset_after: _duration_pb2.Duration
    retry_after: _duration_pb2.Duration
    window: _duration_pb2.Duration
    exceeded: bool
    algorithm: str
    shadow: bool
    admitted_over_limit: bool
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[int] = ..., remaining: _Optional[int] = ..., reset_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., exceeded: _Optional[bool] = ..., algorithm: _Optional[str] = ..., shadow: _Optional[bool] = ..., admitted_over_limit: _Optional[bool] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("verdict", "permit_id", "limits", "retry_after", "wait", "breaker_state", "degradation_level", "reason", "holds_slot", "max_in_flight", "paid_by")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOLDS_SLOT_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PAID_BY_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    permit_id: str
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    retry_after: _duration_pb2.Duration
    wait: _duration_pb2.Duration
    breaker_state: BreakerState
    degradation_level: int
    reason: str
    holds_slot: bool
    max_in_flight: int
    paid_by: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., permit_id: _Optional[str] = ..., limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., breaker_state: _Optional[_Union[BreakerState, str]] = ..., degradation_level: _Optional[int] = ..., reason: _Optional[str] = ..., holds_slot: _Optional[bool] = ..., max_in_flight: _Optional[int] = ..., paid_by: _Optional[str] = ...) -> None: ...

class AcquireBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[AcquireRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[AcquireRequest, _Mapping]]] = ...) -> None: ...

class AcquireBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AcquireResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[AcquireResponse, _Mapping]]] = ...) -> None: ...

class ReportOutcomeRequest(_message.Message):
    __slots__ = ("resource", "permit_id", "outcome", "latency", "actual_cost", "usage")
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    PERMIT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_COST_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    permit_id: str
    outcome: Outcome
    latency: _duration_pb2.Duration
    actual_cost: int
    usage: _containers.ScalarMap[str, int]
    def __init__(self, resource: _Optional[str] = ..., permit_id: _Optional[str] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., actual_cost: _Optional[int] = ..., usage: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ReportOutcomeResponse(_message.Message):
    __slots__ = ("counted", "breaker_state", "settled")
    COUNTED_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    counted: bool
    breaker_state: BreakerState
    settled: bool
    def __init__(self, counted: _Optional[bool] = ..., breaker_state: _Optional[_Union[BreakerState, str]] = ..., settled: _Optional[bool] = ...) -> None: ...

class ChargeRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "cost", "usage", "idempotency_key")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    cost: int
    usage: _containers.ScalarMap[str, int]
    idempotency_key: str
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., cost: _Optional[int] = ..., usage: _Optional[_Mapping[str, int]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ChargeResponse(_message.Message):
    __slots__ = ("limits", "duplicate", "paid_by")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PAID_BY_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    duplicate: bool
    paid_by: str
    def __init__(self, limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., duplicate: _Optional[bool] = ..., paid_by: _Optional[str] = ...) -> None: ...

class ReportOutcomeBatchRequest(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[ReportOutcomeRequest]
    def __init__(self, reports: _Optional[_Iterable[_Union[ReportOutcomeRequest, _Mapping]]] = ...) -> None: ...

class ReportOutcomeBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[ReportOutcomeResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[ReportOutcomeResponse, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("resources",)
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resources: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("sequence", "at", "snapshot", "breaker", "degradation", "rules", "overrides")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    at: _timestamp_pb2.Timestamp
    snapshot: Snapshot
    breaker: BreakerTransition
    degradation: DegradationChange
    rules: RulesReloaded
    overrides: OverridesChanged
    def __init__(self, sequence: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., snapshot: _Optional[_Union[Snapshot, _Mapping]] = ..., breaker: _Optional[_Union[BreakerTransition, _Mapping]] = ..., degradation: _Optional[_Union[DegradationChange, _Mapping]] = ..., rules: _Optional[_Union[RulesReloaded, _Mapping]] = ..., overrides: _Optional[_Union[OverridesChanged, _Mapping]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("breakers", "degradation_level", "degradation_override", "rules_version", "resync", "rule_patterns", "systems")
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    RULE_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    SYSTEMS_FIELD_NUMBER: _ClassVar[int]
    breakers: _containers.RepeatedCompositeFieldContainer[BreakerSummary]
    degradation_level: int
    degradation_override: bool
    rules_version: int
    resync: bool
    rule_patterns: _containers.RepeatedScalarFieldContainer[str]
    systems: _containers.RepeatedCompositeFieldContainer[SystemLevel]
    def __init__(self, breakers: _Optional[_Iterable[_Union[BreakerSummary, _Mapping]]] = ..., degradation_level: _Optional[int] = ..., degradation_override: _Optional[bool] = ..., rules_version: _Optional[int] = ..., resync: _Optional[bool] = ..., rule_patterns: _Optional[_Iterable[str]] = ..., systems: _Optional[_Iterable[_Union[SystemLevel, _Mapping]]] = ...) -> None: ...

class SystemLevel(_message.Message):
    __slots__ = ("system", "level", "manual", "automatic_level", "reason", "signals")
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    AUTOMATIC_LEVEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    system: str
    level: int
    manual: bool
    automatic_level: int
    reason: str
    signals: SystemSignals
    def __init__(self, system: _Optional[str] = ..., level: _Optional[int] = ..., manual: _Optional[bool] = ..., automatic_level: _Optional[int] = ..., reason: _Optional[str] = ..., signals: _Optional[_Union[SystemSignals, _Mapping]] = ...) -> None: ...

class SystemSignals(_message.Message):
    __slots__ = ("calls", "error_rate", "slow_call_rate", "latency", "cpu", "memory", "queue_delay", "instances", "in_flight")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    SLOW_CALL_RATE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    calls: int
    error_rate: float
    slow_call_rate: float
    latency: _duration_pb2.Duration
    cpu: float
    memory: float
    queue_delay: _duration_pb2.Duration
    instances: int
    in_flight: int
    def __init__(self, calls: _Optional[int] = ..., error_rate: _Optional[float] = ..., slow_call_rate: _Optional[float] = ..., latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., cpu: _Optional[float] = ..., memory: _Optional[float] = ..., queue_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., instances: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class BreakerSummary(_message.Message):
    __slots__ = ("resource", "state", "next_probe_at")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROBE_AT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    state: BreakerState
    next_probe_at: _timestamp_pb2.Timestamp
    def __init__(self, resource: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ..., next_probe_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BreakerTransition(_message.Message):
    __slots__ = ("resource", "from_state", "to_state", "reason", "next_probe_at")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROBE_AT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    from_state: BreakerState
    to_state: BreakerState
    reason: str
    next_probe_at: _timestamp_pb2.Timestamp
    def __init__(self, resource: _Optional[str] = ..., from_state: _Optional[_Union[BreakerState, str]] = ..., to_state: _Optional[_Union[BreakerState, str]] = ..., reason: _Optional[str] = ..., next_probe_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DegradationChange(_message.Message):
    __slots__ = ("from_level", "to_level", "manual", "system", "reason")
    FROM_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TO_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    from_level: int
    to_level: int
    manual: bool
    system: str
    reason: str
    def __init__(self, from_level: _Optional[int] = ..., to_level: _Optional[int] = ..., manual: _Optional[bool] = ..., system: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RulesReloaded(_message.Message):
    __slots__ = ("version", "source", "rule_patterns")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RULE_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    version: int
    source: str
    rule_patterns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., source: _Optional[str] = ..., rule_patterns: _Optional[_Iterable[str]] = ...) -> None: ...

class OverridesChanged(_message.Message):
    __slots__ = ("set", "deleted", "expired", "rules_version")
    SET_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    set: _containers.RepeatedScalarFieldContainer[str]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    expired: _containers.RepeatedScalarFieldContainer[str]
    rules_version: int
    def __init__(self, set: _Optional[_Iterable[str]] = ..., deleted: _Optional[_Iterable[str]] = ..., expired: _Optional[_Iterable[str]] = ..., rules_version: _Optional[int] = ...) -> None: ...

class GetRulesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRulesResponse(_message.Message):
    __slots__ = ("yaml", "version", "source", "loaded_at", "resources", "envoy", "sentinel", "earlier")
    YAML_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ENVOY_FIELD_NUMBER: _ClassVar[int]
    SENTINEL_FIELD_NUMBER: _ClassVar[int]
    EARLIER_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    version: int
    source: str
    loaded_at: _timestamp_pb2.Timestamp
    resources: _containers.RepeatedScalarFieldContainer[str]
    envoy: EnvoyConfigInForce
    sentinel: SentinelRulesInForce
    earlier: _containers.RepeatedCompositeFieldContainer[EarlierRules]
    def __init__(self, yaml: _Optional[str] = ..., version: _Optional[int] = ..., source: _Optional[str] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources: _Optional[_Iterable[str]] = ..., envoy: _Optional[_Union[EnvoyConfigInForce, _Mapping]] = ..., sentinel: _Optional[_Union[SentinelRulesInForce, _Mapping]] = ..., earlier: _Optional[_Iterable[_Union[EarlierRules, _Mapping]]] = ...) -> None: ...

class EarlierRules(_message.Message):
    __slots__ = ("version", "source", "loaded_at", "replaced_at", "resources", "resource_count")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLACED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    version: int
    source: str
    loaded_at: _timestamp_pb2.Timestamp
    replaced_at: _timestamp_pb2.Timestamp
    resources: _containers.RepeatedScalarFieldContainer[str]
    resource_count: int
    def __init__(self, version: _Optional[int] = ..., source: _Optional[str] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replaced_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources: _Optional[_Iterable[str]] = ..., resource_count: _Optional[int] = ...) -> None: ...

class GetTrafficRequest(_message.Message):
    __slots__ = ("resource", "limit", "page_token")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    resource: str
    limit: str
    page_token: str
    def __init__(self, resource: _Optional[str] = ..., limit: _Optional[str] = ..., page_token: _Optional[str] = ...) -> None: ...

class ProposeLimitRequest(_message.Message):
    __slots__ = ("resource", "limit", "quantile", "headroom", "max_decrease")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    MAX_DECREASE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    limit: str
    quantile: float
    headroom: float
    max_decrease: float
    def __init__(self, resource: _Optional[str] = ..., limit: _Optional[str] = ..., quantile: _Optional[float] = ..., headroom: _Optional[float] = ..., max_decrease: _Optional[float] = ...) -> None: ...

class ProposeLimitResponse(_message.Message):
    __slots__ = ("current_per_minute", "per_minute", "observed_per_minute", "overrides", "kept", "keys", "recorded_from", "recorded_to", "replayed_calls", "replayed_denied", "most_denied", "rules_yaml", "shared", "algorithm")
    CURRENT_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FROM_FIELD_NUMBER: _ClassVar[int]
    RECORDED_TO_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_CALLS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_DENIED_FIELD_NUMBER: _ClassVar[int]
    MOST_DENIED_FIELD_NUMBER: _ClassVar[int]
    RULES_YAML_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    current_per_minute: int
    per_minute: int
    observed_per_minute: int
    overrides: _containers.RepeatedCompositeFieldContainer[KeyLimit]
    kept: _containers.RepeatedScalarFieldContainer[str]
    keys: int
    recorded_from: int
    recorded_to: int
    replayed_calls: int
    replayed_denied: int
    most_denied: _containers.RepeatedCompositeFieldContainer[KeyReplay]
    rules_yaml: str
    shared: bool
    algorithm: str
    def __init__(self, current_per_minute: _Optional[int] = ..., per_minute: _Optional[int] = ..., observed_per_minute: _Optional[int] = ..., overrides: _Optional[_Iterable[_Union[KeyLimit, _Mapping]]] = ..., kept: _Optional[_Iterable[str]] = ..., keys: _Optional[int] = ..., recorded_from: _Optional[int] = ..., recorded_to: _Optional[int] = ..., replayed_calls: _Optional[int] = ..., replayed_denied: _Optional[int] = ..., most_denied: _Optional[_Iterable[_Union[KeyReplay, _Mapping]]] = ..., rules_yaml: _Optional[str] = ..., shared: _Optional[bool] = ..., algorithm: _Optional[str] = ...) -> None: ...

class KeyLimit(_message.Message):
    __slots__ = ("key", "per_minute")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    key: str
    per_minute: int
    def __init__(self, key: _Optional[str] = ..., per_minute: _Optional[int] = ...) -> None: ...

class KeyReplay(_message.Message):
    __slots__ = ("key", "per_minute", "calls", "denied")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    DENIED_FIELD_NUMBER: _ClassVar[int]
    key: str
    per_minute: int
    calls: int
    denied: int
    def __init__(self, key: _Optional[str] = ..., per_minute: _Optional[int] = ..., calls: _Optional[int] = ..., denied: _Optional[int] = ...) -> None: ...

class GetTrafficResponse(_message.Message):
    __slots__ = ("keys_recorded", "calls_not_recorded", "keys", "next_page_token", "shared")
    KEYS_RECORDED_FIELD_NUMBER: _ClassVar[int]
    CALLS_NOT_RECORDED_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    keys_recorded: int
    calls_not_recorded: int
    keys: _containers.RepeatedCompositeFieldContainer[KeyTraffic]
    next_page_token: str
    shared: bool
    def __init__(self, keys_recorded: _Optional[int] = ..., calls_not_recorded: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[KeyTraffic, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., shared: _Optional[bool] = ...) -> None: ...

class KeyTraffic(_message.Message):
    __slots__ = ("key", "days")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DAYS_FIELD_NUMBER: _ClassVar[int]
    key: str
    days: _containers.RepeatedCompositeFieldContainer[DayPeak]
    def __init__(self, key: _Optional[str] = ..., days: _Optional[_Iterable[_Union[DayPeak, _Mapping]]] = ...) -> None: ...

class DayPeak(_message.Message):
    __slots__ = ("day", "calls")
    DAY_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    day: int
    calls: int
    def __init__(self, day: _Optional[int] = ..., calls: _Optional[int] = ...) -> None: ...

class RevertRulesRequest(_message.Message):
    __slots__ = ("to_version",)
    TO_VERSION_FIELD_NUMBER: _ClassVar[int]
    to_version: int
    def __init__(self, to_version: _Optional[int] = ...) -> None: ...

class RevertRulesResponse(_message.Message):
    __slots__ = ("version", "reverted_to", "resources")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REVERTED_TO_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    version: int
    reverted_to: int
    resources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., reverted_to: _Optional[int] = ..., resources: _Optional[_Iterable[str]] = ...) -> None: ...

class SentinelRulesInForce(_message.Message):
    __slots__ = ("source", "resources", "ignored", "left_out", "loaded_at", "json")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    source: str
    resources: _containers.RepeatedScalarFieldContainer[str]
    ignored: _containers.RepeatedScalarFieldContainer[str]
    left_out: _containers.RepeatedScalarFieldContainer[str]
    loaded_at: _timestamp_pb2.Timestamp
    json: str
    def __init__(self, source: _Optional[str] = ..., resources: _Optional[_Iterable[str]] = ..., ignored: _Optional[_Iterable[str]] = ..., left_out: _Optional[_Iterable[str]] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., json: _Optional[str] = ...) -> None: ...

class EnvoyConfigInForce(_message.Message):
    __slots__ = ("source", "version", "domains", "loaded_at", "yaml")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOMAINS_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    YAML_FIELD_NUMBER: _ClassVar[int]
    source: str
    version: str
    domains: _containers.RepeatedScalarFieldContainer[str]
    loaded_at: _timestamp_pb2.Timestamp
    yaml: str
    def __init__(self, source: _Optional[str] = ..., version: _Optional[str] = ..., domains: _Optional[_Iterable[str]] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., yaml: _Optional[str] = ...) -> None: ...

class ApplyRulesRequest(_message.Message):
    __slots__ = ("yaml", "validate_only", "what_if")
    YAML_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    WHAT_IF_FIELD_NUMBER: _ClassVar[int]
    yaml: str
    validate_only: bool
    what_if: _duration_pb2.Duration
    def __init__(self, yaml: _Optional[str] = ..., validate_only: _Optional[bool] = ..., what_if: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ApplyRulesResponse(_message.Message):
    __slots__ = ("version", "resources", "applied", "what_if_until")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    WHAT_IF_UNTIL_FIELD_NUMBER: _ClassVar[int]
    version: int
    resources: _containers.RepeatedScalarFieldContainer[str]
    applied: bool
    what_if_until: _timestamp_pb2.Timestamp
    def __init__(self, version: _Optional[int] = ..., resources: _Optional[_Iterable[str]] = ..., applied: _Optional[bool] = ..., what_if_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListBreakersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBreakersResponse(_message.Message):
    __slots__ = ("breakers",)
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    breakers: _containers.RepeatedCompositeFieldContainer[BreakerInfo]
    def __init__(self, breakers: _Optional[_Iterable[_Union[BreakerInfo, _Mapping]]] = ...) -> None: ...

class GetBreakerRequest(_message.Message):
    __slots__ = ("resource",)
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    def __init__(self, resource: _Optional[str] = ...) -> None: ...

class BreakerInfo(_message.Message):
    __slots__ = ("resource", "state", "calls", "failures", "slow_calls", "failure_rate", "slow_call_rate", "not_permitted", "opened_at", "next_probe_at", "probes_in_flight", "probes_remaining", "generation", "consecutive_openings", "slow_successes")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SLOW_CALLS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATE_FIELD_NUMBER: _ClassVar[int]
    SLOW_CALL_RATE_FIELD_NUMBER: _ClassVar[int]
    NOT_PERMITTED_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROBE_AT_FIELD_NUMBER: _ClassVar[int]
    PROBES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PROBES_REMAINING_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_OPENINGS_FIELD_NUMBER: _ClassVar[int]
    SLOW_SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    state: BreakerState
    calls: int
    failures: int
    slow_calls: int
    failure_rate: float
    slow_call_rate: float
    not_permitted: int
    opened_at: _timestamp_pb2.Timestamp
    next_probe_at: _timestamp_pb2.Timestamp
    probes_in_flight: int
    probes_remaining: int
    generation: int
    consecutive_openings: int
    slow_successes: int
    def __init__(self, resource: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ..., calls: _Optional[int] = ..., failures: _Optional[int] = ..., slow_calls: _Optional[int] = ..., failure_rate: _Optional[float] = ..., slow_call_rate: _Optional[float] = ..., not_permitted: _Optional[int] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_probe_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., probes_in_flight: _Optional[int] = ..., probes_remaining: _Optional[int] = ..., generation: _Optional[int] = ..., consecutive_openings: _Optional[int] = ..., slow_successes: _Optional[int] = ...) -> None: ...

class GetConcurrencyRequest(_message.Message):
    __slots__ = ("resource",)
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    def __init__(self, resource: _Optional[str] = ...) -> None: ...

class ConcurrencyInfo(_message.Message):
    __slots__ = ("resource", "limit", "in_flight", "algorithm", "min", "max", "short_rtt", "long_rtt", "no_load_rtt", "gradient", "queue", "partitions", "windows", "min_rtt", "probing", "next_probe_at")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SHORT_RTT_FIELD_NUMBER: _ClassVar[int]
    LONG_RTT_FIELD_NUMBER: _ClassVar[int]
    NO_LOAD_RTT_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    MIN_RTT_FIELD_NUMBER: _ClassVar[int]
    PROBING_FIELD_NUMBER: _ClassVar[int]
    NEXT_PROBE_AT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    limit: int
    in_flight: int
    algorithm: str
    min: int
    max: int
    short_rtt: _duration_pb2.Duration
    long_rtt: _duration_pb2.Duration
    no_load_rtt: _duration_pb2.Duration
    gradient: float
    queue: float
    partitions: _containers.RepeatedCompositeFieldContainer[ConcurrencyPartition]
    windows: _containers.RepeatedCompositeFieldContainer[ConcurrencyWindow]
    min_rtt: _duration_pb2.Duration
    probing: bool
    next_probe_at: _timestamp_pb2.Timestamp
    def __init__(self, resource: _Optional[str] = ..., limit: _Optional[int] = ..., in_flight: _Optional[int] = ..., algorithm: _Optional[str] = ..., min: _Optional[int] = ..., max: _Optional[int] = ..., short_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., long_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., no_load_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., gradient: _Optional[float] = ..., queue: _Optional[float] = ..., partitions: _Optional[_Iterable[_Union[ConcurrencyPartition, _Mapping]]] = ..., windows: _Optional[_Iterable[_Union[ConcurrencyWindow, _Mapping]]] = ..., min_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., probing: _Optional[bool] = ..., next_probe_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ConcurrencyPartition(_message.Message):
    __slots__ = ("priority", "percent", "guaranteed", "in_flight")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    GUARANTEED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    priority: Priority
    percent: int
    guaranteed: int
    in_flight: int
    def __init__(self, priority: _Optional[_Union[Priority, str]] = ..., percent: _Optional[int] = ..., guaranteed: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class ConcurrencyWindow(_message.Message):
    __slots__ = ("closed_at", "limit", "samples", "mean_rtt", "max_in_flight", "drops")
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MEAN_RTT_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    closed_at: _timestamp_pb2.Timestamp
    limit: int
    samples: int
    mean_rtt: _duration_pb2.Duration
    max_in_flight: int
    drops: int
    def __init__(self, closed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ..., samples: _Optional[int] = ..., mean_rtt: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_in_flight: _Optional[int] = ..., drops: _Optional[int] = ...) -> None: ...

class SetBreakerStateRequest(_message.Message):
    __slots__ = ("resource", "state")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    state: BreakerState
    def __init__(self, resource: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ...) -> None: ...

class SetDegradationLevelRequest(_message.Message):
    __slots__ = ("level", "automatic", "system", "every_system")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    AUTOMATIC_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    EVERY_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    level: int
    automatic: bool
    system: str
    every_system: bool
    def __init__(self, level: _Optional[int] = ..., automatic: _Optional[bool] = ..., system: _Optional[str] = ..., every_system: _Optional[bool] = ...) -> None: ...

class SetDegradationLevelResponse(_message.Message):
    __slots__ = ("level", "manual", "automatic_level", "system", "systems")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    AUTOMATIC_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    SYSTEMS_FIELD_NUMBER: _ClassVar[int]
    level: int
    manual: bool
    automatic_level: int
    system: str
    systems: _containers.RepeatedCompositeFieldContainer[SystemLevel]
    def __init__(self, level: _Optional[int] = ..., manual: _Optional[bool] = ..., automatic_level: _Optional[int] = ..., system: _Optional[str] = ..., systems: _Optional[_Iterable[_Union[SystemLevel, _Mapping]]] = ...) -> None: ...

class ReportLoadRequest(_message.Message):
    __slots__ = ("system", "instance", "cpu", "memory", "in_flight", "queue_delay")
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DELAY_FIELD_NUMBER: _ClassVar[int]
    system: str
    instance: str
    cpu: float
    memory: float
    in_flight: int
    queue_delay: _duration_pb2.Duration
    def __init__(self, system: _Optional[str] = ..., instance: _Optional[str] = ..., cpu: _Optional[float] = ..., memory: _Optional[float] = ..., in_flight: _Optional[int] = ..., queue_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReportLoadResponse(_message.Message):
    __slots__ = ("degradation_level", "instances")
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    degradation_level: int
    instances: int
    def __init__(self, degradation_level: _Optional[int] = ..., instances: _Optional[int] = ...) -> None: ...

class PeekRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "limit")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    limit: str
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., limit: _Optional[str] = ...) -> None: ...

class PeekResponse(_message.Message):
    __slots__ = ("rule", "limits", "breaker_state", "degradation_level")
    RULE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    rule: str
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    breaker_state: BreakerState
    degradation_level: int
    def __init__(self, rule: _Optional[str] = ..., limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., breaker_state: _Optional[_Union[BreakerState, str]] = ..., degradation_level: _Optional[int] = ...) -> None: ...

class GetWhatIfRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWhatIfResponse(_message.Message):
    __slots__ = ("running", "started_at", "until", "calls", "unmatched", "limits")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    UNMATCHED_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    running: bool
    started_at: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    calls: int
    unmatched: int
    limits: _containers.RepeatedCompositeFieldContainer[WhatIfLimit]
    def __init__(self, running: _Optional[bool] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., calls: _Optional[int] = ..., unmatched: _Optional[int] = ..., limits: _Optional[_Iterable[_Union[WhatIfLimit, _Mapping]]] = ...) -> None: ...

class WhatIfLimit(_message.Message):
    __slots__ = ("rule", "limit", "evaluated", "would_deny", "newly_denied", "top")
    RULE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_FIELD_NUMBER: _ClassVar[int]
    WOULD_DENY_FIELD_NUMBER: _ClassVar[int]
    NEWLY_DENIED_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    rule: str
    limit: str
    evaluated: int
    would_deny: int
    newly_denied: int
    top: _containers.RepeatedCompositeFieldContainer[WhatIfHitter]
    def __init__(self, rule: _Optional[str] = ..., limit: _Optional[str] = ..., evaluated: _Optional[int] = ..., would_deny: _Optional[int] = ..., newly_denied: _Optional[int] = ..., top: _Optional[_Iterable[_Union[WhatIfHitter, _Mapping]]] = ...) -> None: ...

class Override(_message.Message):
    __slots__ = ("id", "rule", "when", "block", "factor", "limits", "tier", "ttl", "expires_at", "reason", "created_by", "created_at", "active", "problem")
    class WhenEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    id: str
    rule: str
    when: _containers.ScalarMap[str, str]
    block: Block
    factor: float
    limits: LimitValues
    tier: str
    ttl: _duration_pb2.Duration
    expires_at: _timestamp_pb2.Timestamp
    reason: str
    created_by: str
    created_at: _timestamp_pb2.Timestamp
    active: bool
    problem: str
    def __init__(self, id: _Optional[str] = ..., rule: _Optional[str] = ..., when: _Optional[_Mapping[str, str]] = ..., block: _Optional[_Union[Block, _Mapping]] = ..., factor: _Optional[float] = ..., limits: _Optional[_Union[LimitValues, _Mapping]] = ..., tier: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., created_by: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active: _Optional[bool] = ..., problem: _Optional[str] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("retry_after",)
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    retry_after: _duration_pb2.Duration
    def __init__(self, retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LimitValues(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, int]
    def __init__(self, values: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SetOverridesRequest(_message.Message):
    __slots__ = ("overrides",)
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[Override]
    def __init__(self, overrides: _Optional[_Iterable[_Union[Override, _Mapping]]] = ...) -> None: ...

class SetOverridesResponse(_message.Message):
    __slots__ = ("overrides", "rules_version", "persisted")
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[Override]
    rules_version: int
    persisted: bool
    def __init__(self, overrides: _Optional[_Iterable[_Union[Override, _Mapping]]] = ..., rules_version: _Optional[int] = ..., persisted: _Optional[bool] = ...) -> None: ...

class ListOverridesRequest(_message.Message):
    __slots__ = ("rule", "after", "limit")
    RULE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    rule: str
    after: str
    limit: int
    def __init__(self, rule: _Optional[str] = ..., after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListOverridesResponse(_message.Message):
    __slots__ = ("overrides", "next_after", "total")
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[Override]
    next_after: str
    total: int
    def __init__(self, overrides: _Optional[_Iterable[_Union[Override, _Mapping]]] = ..., next_after: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class DeleteOverridesRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteOverridesResponse(_message.Message):
    __slots__ = ("deleted", "rules_version")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    RULES_VERSION_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    rules_version: int
    def __init__(self, deleted: _Optional[_Iterable[str]] = ..., rules_version: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "want", "previous_lease_id", "used", "holder", "release")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    want: int
    previous_lease_id: str
    used: int
    holder: str
    release: bool
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., want: _Optional[int] = ..., previous_lease_id: _Optional[str] = ..., used: _Optional[int] = ..., holder: _Optional[str] = ..., release: _Optional[bool] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("leasable", "reason", "lease_id", "granted", "ttl", "retry_after", "returned", "share", "holders", "limits", "empty_reason")
    LEASABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    EMPTY_REASON_FIELD_NUMBER: _ClassVar[int]
    leasable: bool
    reason: str
    lease_id: str
    granted: int
    ttl: _duration_pb2.Duration
    retry_after: _duration_pb2.Duration
    returned: bool
    share: int
    holders: int
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    empty_reason: str
    def __init__(self, leasable: _Optional[bool] = ..., reason: _Optional[str] = ..., lease_id: _Optional[str] = ..., granted: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., returned: _Optional[bool] = ..., share: _Optional[int] = ..., holders: _Optional[int] = ..., limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., empty_reason: _Optional[str] = ...) -> None: ...

class GetTopKeysRequest(_message.Message):
    __slots__ = ("rule", "count")
    RULE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    rule: str
    count: int
    def __init__(self, rule: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class GetTopKeysResponse(_message.Message):
    __slots__ = ("limits", "window", "admitted_sample")
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[LimitTopKeys]
    window: _duration_pb2.Duration
    admitted_sample: int
    def __init__(self, limits: _Optional[_Iterable[_Union[LimitTopKeys, _Mapping]]] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., admitted_sample: _Optional[int] = ...) -> None: ...

class LimitTopKeys(_message.Message):
    __slots__ = ("rule", "limit", "denied", "admitted")
    RULE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DENIED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    rule: str
    limit: str
    denied: _containers.RepeatedCompositeFieldContainer[TopKey]
    admitted: _containers.RepeatedCompositeFieldContainer[TopKey]
    def __init__(self, rule: _Optional[str] = ..., limit: _Optional[str] = ..., denied: _Optional[_Iterable[_Union[TopKey, _Mapping]]] = ..., admitted: _Optional[_Iterable[_Union[TopKey, _Mapping]]] = ...) -> None: ...

class TopKey(_message.Message):
    __slots__ = ("key", "count", "error")
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    key: str
    count: int
    error: int
    def __init__(self, key: _Optional[str] = ..., count: _Optional[int] = ..., error: _Optional[int] = ...) -> None: ...

class WhatIfHitter(_message.Message):
    __slots__ = ("key", "count", "error")
    KEY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    key: str
    count: int
    error: int
    def __init__(self, key: _Optional[str] = ..., count: _Optional[int] = ..., error: _Optional[int] = ...) -> None: ...

class GetDecisionsRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "denied_only", "count")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    DENIED_ONLY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    denied_only: bool
    count: int
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., denied_only: _Optional[bool] = ..., count: _Optional[int] = ...) -> None: ...

class GetDecisionsResponse(_message.Message):
    __slots__ = ("decisions", "share", "capacity", "kept", "more")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[LoggedDecision]
    share: float
    capacity: int
    kept: int
    more: bool
    def __init__(self, decisions: _Optional[_Iterable[_Union[LoggedDecision, _Mapping]]] = ..., share: _Optional[float] = ..., capacity: _Optional[int] = ..., kept: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class LoggedDecision(_message.Message):
    __slots__ = ("at", "resource", "descriptors", "cost", "dry_run", "settle", "verdict", "rule", "limits", "decided_by", "reason", "breaker_state", "degradation_level", "usage", "limit_costs", "paid_by")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class UsageEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    SETTLE_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BREAKER_STATE_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_COSTS_FIELD_NUMBER: _ClassVar[int]
    PAID_BY_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    cost: int
    dry_run: bool
    settle: bool
    verdict: Verdict
    rule: str
    limits: _containers.RepeatedCompositeFieldContainer[LimitStatus]
    decided_by: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    breaker_state: BreakerState
    degradation_level: int
    usage: _containers.ScalarMap[str, int]
    limit_costs: _containers.RepeatedScalarFieldContainer[int]
    paid_by: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., cost: _Optional[int] = ..., dry_run: _Optional[bool] = ..., settle: _Optional[bool] = ..., verdict: _Optional[_Union[Verdict, str]] = ..., rule: _Optional[str] = ..., limits: _Optional[_Iterable[_Union[LimitStatus, _Mapping]]] = ..., decided_by: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., breaker_state: _Optional[_Union[BreakerState, str]] = ..., degradation_level: _Optional[int] = ..., usage: _Optional[_Mapping[str, int]] = ..., limit_costs: _Optional[_Iterable[int]] = ..., paid_by: _Optional[str] = ...) -> None: ...

class SetDecisionLogRequest(_message.Message):
    __slots__ = ("share",)
    SHARE_FIELD_NUMBER: _ClassVar[int]
    share: float
    def __init__(self, share: _Optional[float] = ...) -> None: ...

class SetDecisionLogResponse(_message.Message):
    __slots__ = ("share_before", "share")
    SHARE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    share_before: float
    share: float
    def __init__(self, share_before: _Optional[float] = ..., share: _Optional[float] = ...) -> None: ...

class AdjustBalanceRequest(_message.Message):
    __slots__ = ("resource", "descriptors", "limit", "amount", "reason")
    class DescriptorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTORS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    resource: str
    descriptors: _containers.ScalarMap[str, str]
    limit: str
    amount: int
    reason: str
    def __init__(self, resource: _Optional[str] = ..., descriptors: _Optional[_Mapping[str, str]] = ..., limit: _Optional[str] = ..., amount: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AdjustBalanceResponse(_message.Message):
    __slots__ = ("balance", "max_balance")
    BALANCE_FIELD_NUMBER: _ClassVar[int]
    MAX_BALANCE_FIELD_NUMBER: _ClassVar[int]
    balance: int
    max_balance: int
    def __init__(self, balance: _Optional[int] = ..., max_balance: _Optional[int] = ...) -> None: ...
