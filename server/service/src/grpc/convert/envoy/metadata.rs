//! The RLS answer's dynamic metadata (`--envoy-response-dynamic-metadata`),
//! as upstream writes it: the domain, each descriptor (its entries as
//! `key=value`, the limit Envoy sent, its `hitsAddend`), the request's
//! `hitsAddend`, and the `metadata` of the descriptors that passed, merged
//! (the first of a key wins; mappings merge key by key).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as common;
use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

type Json = serde_json::Map<String, serde_json::Value>;

pub fn answer(asked: &rls::RateLimitRequest, passed: &[Arc<Json>]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    fields.insert("domain".to_string(), string(&asked.domain));
    let descriptors = asked.descriptors.iter().map(|d| Value { kind: Some(Kind::StructValue(descriptor(d))) });
    fields.insert("descriptors".into(), list(descriptors.collect()));
    if asked.hits_addend != 0 {
        fields.insert("hitsAddend".into(), number(f64::from(asked.hits_addend)));
    }
    let mut merged = Json::new();
    for m in passed {
        merge(&mut merged, m);
    }
    if !merged.is_empty() {
        fields.insert("metadata".into(), Value { kind: Some(Kind::StructValue(object(&merged))) });
    }
    Struct { fields }
}

fn descriptor(d: &common::RateLimitDescriptor) -> Struct {
    let mut fields = std::collections::HashMap::new();
    let entries = d.entries.iter().map(|e| string(&format!("{}={}", e.key, e.value)));
    fields.insert("entries".to_string(), list(entries.collect()));
    if let Some(limit) = &d.limit {
        let unit = rls::rate_limit_response::rate_limit::Unit::try_from(limit.unit)
            .map_or_else(|_| limit.unit.to_string(), |u| u.as_str_name().to_string());
        fields.insert("limit".into(), string(&format!("requests_per_unit:{} unit:{unit}", limit.requests_per_unit)));
    }
    if let Some(h) = &d.hits_addend {
        fields.insert("hitsAddend".into(), number(h.value as f64));
    }
    Struct { fields }
}

/// Adds `from`'s keys that `into` lacks; where both hold a mapping, merges them.
fn merge(into: &mut Json, from: &Json) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(serde_json::Value::Object(a)), serde_json::Value::Object(b)) => merge(a, b),
            (Some(_), _) => {}
            (None, v) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

fn object(m: &Json) -> Struct {
    Struct { fields: m.iter().map(|(k, v)| (k.clone(), value(v))).collect() }
}

fn value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(value).collect() }),
        serde_json::Value::Object(o) => Kind::StructValue(object(o)),
    };
    Value { kind: Some(kind) }
}

fn string(s: &str) -> Value {
    Value { kind: Some(Kind::StringValue(s.to_string())) }
}

fn number(n: f64) -> Value {
    Value { kind: Some(Kind::NumberValue(n)) }
}

fn list(values: Vec<Value>) -> Value {
    Value { kind: Some(Kind::ListValue(ListValue { values })) }
}
