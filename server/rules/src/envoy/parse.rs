//! Reading envoyproxy/ratelimit's documents (a YAML file, or a resource
//! served over xDS turned into the same shape) into the tree. Every error
//! names the file, the domain and the descriptor path; a document with an
//! error installs nothing.

use std::collections::HashMap;
use std::sync::Arc;

use serde_yaml_ng::{Mapping, Value};

use super::{EnvoyConfig, EnvoyLimit, EnvoyOptions, Node, Unit, window_rule};
use crate::{RuleError, RuleErrors};

/// One document: a file's YAML, or an xDS resource in the same shape.
#[derive(Clone, Debug)]
pub struct Document {
    /// The file (or resource) name errors name.
    pub name: String,
    pub value: Value,
}

impl Document {
    /// A file's text, bounded before it is parsed.
    pub fn from_yaml(name: &str, text: &str) -> Result<Document, RuleError> {
        let err = |message: String| RuleError { file: name.into(), resource: None, field: String::new(), message };
        crate::bounds::check(text).map_err(|e| err(format!("refused before parsing: {e}")))?;
        let value = serde_yaml_ng::from_str(text).map_err(|e| err(format!("not valid YAML: {e}")))?;
        Ok(Document { name: name.into(), value })
    }
}

/// The keys upstream reads, by where they appear.
const FILE_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "quota_mode",
    "share_threshold",
    "metadata",
];
const LIMIT_KEYS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces", "metadata"];

/// Every document, validated whole.
pub(super) fn read(documents: &[Document], options: &EnvoyOptions) -> Result<EnvoyConfig, RuleErrors> {
    let mut config = EnvoyConfig::default();
    let mut errors = Vec::new();
    let mut owner: HashMap<String, String> = HashMap::new();
    for Document { name: file, value: doc } in documents {
        let mut err = |field: &str, message: String| {
            errors.push(RuleError { file: file.clone(), resource: None, field: field.into(), message })
        };
        let Some(map) = doc.as_mapping() else {
            err("", "expected a mapping with 'domain' and 'descriptors'".into());
            continue;
        };
        let domain = map.get("domain").and_then(Value::as_str).unwrap_or_default().to_string();
        if domain.is_empty() {
            err("domain", "is required and must not be empty".into());
            continue;
        }
        let mut root = match owner.get(&domain) {
            Some(first) if !options.merge_domains => {
                err(&format!("domain '{domain}'"), format!("is also defined in {first}; each domain is defined once"));
                continue;
            }
            // Merged: this file's descriptors join the domain's.
            Some(_) => config.domains.remove(&domain).unwrap_or_default(),
            None => Node::default(),
        };
        owner.entry(domain.clone()).or_insert_with(|| file.clone());
        let mut walker = Walker {
            config: &mut config,
            file,
            domain: &domain,
            errors: Vec::new(),
            depth: 0,
            shared: Vec::new(),
            value_to_metric: 0,
        };
        for (field, message) in unknown_keys(map, "", FILE_KEYS) {
            walker.error(&field, message);
        }
        walker.descriptors(&mut root, map.get("descriptors"), &domain, "descriptors");
        errors.append(&mut walker.errors);
        config.domains.insert(domain, root);
    }
    if errors.is_empty() { Ok(config) } else { Err(RuleErrors(errors)) }
}

/// Every key of `map` not in `known`, as (field, message).
fn unknown_keys(map: &Mapping, path: &str, known: &[&str]) -> Vec<(String, String)> {
    map.keys()
        .filter(|k| !k.as_str().is_some_and(|k| known.contains(&k)))
        .map(|k| {
            let name = k.as_str().map_or_else(|| format!("{k:?}"), |k| format!("'{k}'"));
            (path.to_string(), format!("unknown key {name} (expected one of: {})", known.join(", ")))
        })
        .collect()
}

/// Reads one document's tree.
struct Walker<'a> {
    config: &'a mut EnvoyConfig,
    file: &'a str,
    domain: &'a str,
    errors: Vec<RuleError>,
    /// How deep the descriptor being read is (0 at the top).
    depth: usize,
    /// The `share_threshold` wildcards on the path to it: (depth, value).
    shared: Vec<(usize, String)>,
    /// How many descriptors on the path to it have `value_to_metric`.
    value_to_metric: usize,
}

impl Walker<'_> {
    /// An error naming the file, the domain and the descriptor path.
    fn error(&mut self, path: &str, message: impl Into<String>) {
        let field = if path.is_empty() {
            format!("domain '{}'", self.domain)
        } else {
            format!("domain '{}': {path}", self.domain)
        };
        self.errors.push(RuleError { file: self.file.to_string(), resource: None, field, message: message.into() });
    }

    /// A `descriptors` list, added to the children of `node`, the node at
    /// `stat` (`path` names it in errors).
    fn descriptors(&mut self, node: &mut Node, list: Option<&Value>, stat: &str, path: &str) {
        let items = match list {
            None | Some(Value::Null) => return,
            Some(Value::Sequence(items)) => items,
            Some(_) => {
                self.error(path, "must be a list of descriptors");
                return;
            }
        };
        for (i, item) in items.iter().enumerate() {
            let here = format!("{path}[{i}]");
            let Some(map) = item.as_mapping() else {
                self.error(&here, "must be a mapping");
                continue;
            };
            for (field, message) in unknown_keys(map, &here, DESCRIPTOR_KEYS) {
                self.error(&field, message);
            }
            let key = map.get("key").and_then(Value::as_str).unwrap_or_default();
            if key.is_empty() {
                self.error(&format!("{here}.key"), "is required and must not be empty");
                continue;
            }
            let value = map.get("value").and_then(Value::as_str).unwrap_or_default();
            let composite = if value.is_empty() { key.to_string() } else { format!("{key}_{value}") };
            let here = format!("{path}.{composite}");
            if node.children.contains_key(&composite) {
                self.error(&here, format!("duplicate descriptor '{composite}' at this level"));
                continue;
            }
            let child = self.descriptor(map, value, &format!("{stat}.{composite}"), &here);
            if composite.contains('*') {
                node.wildcards.push((composite.clone(), composite.clone()));
            }
            node.children.insert(composite, child);
        }
    }

    /// One descriptor, its limit and its children.
    fn descriptor(&mut self, map: &Mapping, value: &str, stat: &str, here: &str) -> Node {
        let share = self.share_threshold(map, value, here);
        let mut child = Node {
            value_to_metric: self.flag(map, "value_to_metric", here),
            shared: share.then(|| value.to_string()),
            ..Node::default()
        };
        if share {
            self.shared.push((self.depth, value.to_string()));
        }
        self.value_to_metric += usize::from(child.value_to_metric);
        self.depth += 1;
        self.descriptors(&mut child, map.get("descriptors"), stat, &format!("{here}.descriptors"));
        self.depth -= 1;
        let marks = Marks {
            shadow: self.flag(map, "shadow_mode", here),
            quota: self.flag(map, "quota_mode", here),
            detailed_metric: self.flag(map, "detailed_metric", here),
            metadata: self.metadata(map.get("metadata"), &format!("{here}.metadata")),
        };
        if let Some(rl) = map.get("rate_limit") {
            child.limit = self.rate_limit(rl, stat, &format!("{here}.rate_limit"), marks);
        }
        self.value_to_metric -= usize::from(child.value_to_metric);
        if share {
            self.shared.pop();
        }
        child
    }

    /// A true-or-false field of a descriptor (absent: false).
    fn flag(&mut self, map: &Mapping, name: &str, here: &str) -> bool {
        match map.get(name) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                self.error(&format!("{here}.{name}"), "must be true or false");
                false
            }
        }
    }

    /// A descriptor's `share_threshold`: whether every value its wildcard
    /// matches shares one counter.
    fn share_threshold(&mut self, map: &Mapping, value: &str, here: &str) -> bool {
        let share = self.flag(map, "share_threshold", here);
        if share && !value.contains('*') {
            self.error(
                &format!("{here}.share_threshold"),
                format!("applies only to a wildcard value (containing '*'), not '{value}'"),
            );
            return false;
        }
        share
    }

    /// A descriptor's `metadata`: any mapping, kept as JSON for the answer's
    /// dynamic metadata.
    fn metadata(&mut self, v: Option<&Value>, path: &str) -> Option<Arc<serde_json::Map<String, serde_json::Value>>> {
        match v {
            None | Some(Value::Null) => None,
            Some(Value::Mapping(m)) => match json(&Value::Mapping(m.clone())) {
                Ok(serde_json::Value::Object(o)) if o.is_empty() => None,
                Ok(serde_json::Value::Object(o)) => Some(Arc::new(o)),
                Ok(_) => None,
                Err(e) => {
                    self.error(path, e);
                    None
                }
            },
            Some(_) => {
                self.error(path, "must be a mapping");
                None
            }
        }
    }

    fn rate_limit(&mut self, v: &Value, stat: &str, path: &str, marks: Marks) -> Option<usize> {
        let Some(map) = v.as_mapping() else {
            self.error(path, "must be a mapping");
            return None;
        };
        for (field, message) in unknown_keys(map, path, LIMIT_KEYS) {
            self.error(&field, message);
        }
        let unlimited = map.get("unlimited").and_then(Value::as_bool).unwrap_or(false);
        let (unit, requests_per_unit) = self.size(map, path, unlimited)?;
        let name = map.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let mut replaces = Vec::new();
        for r in map.get("replaces").and_then(Value::as_sequence).into_iter().flatten() {
            match r.get("name").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != name => replaces.push(n.to_string()),
                Some(n) if n == name => self.error(&format!("{path}.replaces"), "must not name this limit itself"),
                _ => self.error(&format!("{path}.replaces"), "every entry needs a name"),
            }
        }
        // Named by its stat, unique in the domain: the Redis key and the
        // metrics name it.
        self.config.rules.push(window_rule(stat.to_string(), requests_per_unit, unit, marks.shadow));
        self.config.limits.push(EnvoyLimit {
            path: stat.to_string(),
            name,
            unit,
            requests_per_unit,
            unlimited,
            replaces,
            shared: self.shared.clone(),
            quota: marks.quota,
            detailed_metric: marks.detailed_metric,
            dynamic_stat: marks.detailed_metric || self.value_to_metric > 0,
            metadata: marks.metadata,
            rule: self.config.rules.len() - 1,
        });
        Some(self.config.limits.len() - 1)
    }

    /// A limit's `unit` and `requests_per_unit` (an unlimited one has neither).
    fn size(&mut self, map: &Mapping, path: &str, unlimited: bool) -> Option<(Unit, u32)> {
        let unit = map.get("unit").and_then(Value::as_str);
        let unit = match (unlimited, unit) {
            (true, Some(_)) => {
                self.error(&format!("{path}.unit"), "must not be given with unlimited");
                return None;
            }
            (true, None) => Unit::Second,
            (false, Some(u)) => match Unit::parse(u) {
                Some(u) => u,
                None => {
                    self.error(
                        &format!("{path}.unit"),
                        format!("'{u}' is not second, minute, hour, day, week, month or year"),
                    );
                    return None;
                }
            },
            (false, None) => {
                self.error(&format!("{path}.unit"), "is required");
                return None;
            }
        };
        let rpu = map.get("requests_per_unit").map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()));
        let requests_per_unit = match (unlimited, rpu) {
            (_, Some(Some(n))) => n,
            (true, None) => 0,
            (false, None) => {
                self.error(&format!("{path}.requests_per_unit"), "is required");
                return None;
            }
            (_, Some(None)) => {
                self.error(&format!("{path}.requests_per_unit"), "must be a whole number up to 4294967295");
                return None;
            }
        };
        Some((unit, requests_per_unit))
    }
}

/// What a descriptor says of the limit it holds.
struct Marks {
    shadow: bool,
    quota: bool,
    detailed_metric: bool,
    metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

/// YAML as JSON (what `google.protobuf.Struct` holds): keys that are not
/// strings are written as upstream writes them (`1`, `true`); numbers that
/// JSON cannot hold are refused.
fn json(v: &Value) -> Result<serde_json::Value, String> {
    Ok(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Number(n) => match n.as_f64().and_then(serde_json::Number::from_f64) {
            Some(_) if n.is_i64() || n.is_u64() => serde_json::to_value(n).map_err(|e| e.to_string())?,
            Some(f) => serde_json::Value::Number(f),
            None => return Err(format!("the number {n} cannot be carried in metadata")),
        },
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Sequence(items) => serde_json::Value::Array(items.iter().map(json).collect::<Result<_, _>>()?),
        Value::Mapping(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                let key = match k {
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    Value::Null => "null".into(),
                    _ => return Err(format!("a key must be a string, not {k:?}")),
                };
                out.insert(key, json(v)?);
            }
            serde_json::Value::Object(out)
        }
        Value::Tagged(t) => json(&t.value)?,
    })
}
