//! `RateLimitConfig` resources (upstream's xDS type) into the documents the
//! envoyproxy/ratelimit reader takes, field for field as upstream turns them
//! into its YAML: proto3's defaults are absent fields, and a unit is written
//! by name (this message numbers WEEK 7, MONTH 5, YEAR 6).

use envoy_types::pb::google::protobuf::{Struct, Value as PbValue, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_yaml_ng::{Mapping, Value};

use crate::rules::envoy::Document;

/// One resource as a document named `name` (the resource's name, else its
/// own `name` field, else its domain).
pub(crate) fn document(name: &str, config: &RateLimitConfig) -> Document {
    let mut root = Mapping::new();
    root.insert("domain".into(), config.domain.clone().into());
    if !config.descriptors.is_empty() {
        root.insert("descriptors".into(), descriptors(&config.descriptors));
    }
    let name = [name, &config.name, &config.domain].into_iter().find(|n| !n.is_empty()).unwrap_or("(unnamed)");
    Document { name: name.to_string(), value: Value::Mapping(root) }
}

fn descriptors(list: &[RateLimitDescriptor]) -> Value {
    Value::Sequence(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Value {
    let mut m = Mapping::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(policy) = &d.rate_limit {
        m.insert("rate_limit".into(), rate_limit(policy));
    }
    if !d.descriptors.is_empty() {
        m.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    for (name, set) in
        [("shadow_mode", d.shadow_mode), ("detailed_metric", d.detailed_metric), ("quota_mode", d.quota_mode)]
    {
        if set {
            m.insert(name.into(), true.into());
        }
    }
    if let Some(metadata) = &d.metadata {
        m.insert("metadata".into(), structure(metadata));
    }
    Value::Mapping(m)
}

fn rate_limit(p: &RateLimitPolicy) -> Value {
    let mut m = Mapping::new();
    // UNKNOWN (0) is absent, as an unlimited limit has it; any other number
    // is written as upstream writes it, so that a bad one names itself.
    match RateLimitUnit::try_from(p.unit) {
        Ok(RateLimitUnit::Unknown) => {}
        Ok(unit) => {
            m.insert("unit".into(), unit.as_str_name().to_ascii_lowercase().into());
        }
        Err(_) => {
            m.insert("unit".into(), format!("unit number {}", p.unit).into());
        }
    }
    if p.requests_per_unit != 0 || !p.unlimited {
        m.insert("requests_per_unit".into(), u64::from(p.requests_per_unit).into());
    }
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        let replaces =
            p.replaces.iter().map(|r| Value::Mapping(Mapping::from_iter([("name".into(), r.name.clone().into())])));
        m.insert("replaces".into(), Value::Sequence(replaces.collect()));
    }
    Value::Mapping(m)
}

/// A `google.protobuf.Struct` as YAML.
fn structure(s: &Struct) -> Value {
    let mut fields: Vec<_> = s.fields.iter().collect();
    // A map has no order on the wire: sorted, so that the same config reads the same.
    fields.sort_by(|a, b| a.0.cmp(b.0));
    Value::Mapping(fields.into_iter().map(|(k, v)| (Value::from(k.clone()), value(v))).collect())
}

fn value(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => Value::from(*n),
        Some(Kind::StringValue(s)) => Value::from(s.clone()),
        Some(Kind::BoolValue(b)) => Value::from(*b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Value::Sequence(l.values.iter().map(value).collect()),
    }
}
