//! Sentinel's rule JSON, read field by field as Sentinel reads it (fastjson:
//! unknown keys ignored, a missing key keeps its default), checked as
//! Sentinel's `isValidRule` checks it. The dashboard's wrapped entities
//! (`{"id": 1, "app": ..., "rule": {...}}`) are unwrapped.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::Kind;
use crate::fields::RuleError;

/// Where a rule came from, for errors and the ignored list.
#[derive(Clone, Debug, PartialEq)]
pub struct At {
    pub file: String,
    pub index: usize,
}

impl At {
    pub fn label(&self, resource: &str) -> String {
        format!("{}[{}] '{}'", self.file, self.index, resource.escape_debug())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub at: At,
    pub resource: String,
    pub limit_app: String,
    pub grade: i64,
    pub count: f64,
    pub strategy: i64,
    pub ref_resource: String,
    pub behavior: i64,
    pub warm_up_secs: i64,
    pub max_queueing_ms: i64,
    pub cluster: bool,
    /// `clusterConfig.thresholdType`: 0 per-instance average, 1 global.
    pub threshold_type: i64,
    pub regex: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Degrade {
    pub at: At,
    pub resource: String,
    pub grade: i64,
    pub count: f64,
    pub time_window: i64,
    pub min_requests: i64,
    pub slow_ratio: f64,
    pub stat_interval_ms: i64,
    pub regex: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct System {
    pub at: At,
    pub load: f64,
    pub cpu: f64,
    pub qps: f64,
    pub avg_rt: i64,
    pub max_thread: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub at: At,
    pub resource: String,
    pub grade: i64,
    pub param_idx: i64,
    pub count: f64,
    pub behavior: i64,
    pub max_queueing_ms: i64,
    pub burst: i64,
    pub duration_secs: i64,
    /// Per-value thresholds: (value as text, count).
    pub items: Vec<(String, i64)>,
    pub regex: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Authority {
    pub at: At,
    pub resource: String,
    pub limit_app: String,
    pub strategy: i64,
    pub regex: bool,
}

/// Every rule read, by kind, and the files not read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Read {
    pub flow: Vec<Flow>,
    pub degrade: Vec<Degrade>,
    pub system: Vec<System>,
    pub param: Vec<Param>,
    pub authority: Vec<Authority>,
    /// Files of gateway rules, not read.
    pub gateway: Vec<String>,
}

/// One JSON object being read, with where it is.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    file: &'a str,
    index: usize,
    resource: Option<String>,
    errors: &'a mut Vec<RuleError>,
}

impl Read {
    /// Rules read, each listed hot-parameter value counted as one (each is a limit).
    pub fn len(&self) -> usize {
        let items: usize = self.param.iter().map(|p| p.items.len()).sum();
        self.flow.len() + self.degrade.len() + self.system.len() + self.param.len() + self.authority.len() + items
    }

    /// Reads one file's list of rules of `kind`.
    pub fn file(&mut self, file: &str, kind: Kind, text: &str, errors: &mut Vec<RuleError>) {
        if kind == Kind::Gateway {
            self.gateway.push(file.to_string());
            return;
        }
        let whole = |message: String| RuleError { file: file.into(), resource: None, field: String::new(), message };
        // A byte order mark is skipped (as fastjson does): editors on
        // Windows write one.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // An empty file is an empty list (as ZooKeeper keeps one).
        if text.trim().is_empty() {
            return;
        }
        let items = match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(items)) => items,
            Ok(Value::Null) => return,
            Ok(other) => {
                errors.push(whole(format!("must be a JSON list of {} rules, got {}", kind.name(), json_kind(&other))));
                return;
            }
            Err(e) => {
                errors.push(whole(format!("is not JSON: {e}")));
                return;
            }
        };
        // Bounded before reading any: a file of a million `{}` is one error,
        // not a million.
        if self.len() + items.len() > super::MAX_RULES {
            errors.push(whole(format!("more than {} rules in all; that is the limit", super::MAX_RULES)));
            return;
        }
        for (index, item) in items.iter().enumerate() {
            if errors.len() >= super::MAX_ERRORS {
                return;
            }
            let Some(map) = item.as_object() else {
                errors.push(RuleError {
                    file: file.into(),
                    resource: None,
                    field: format!("[{index}]"),
                    message: format!("must be a JSON object, got {}", json_kind(item)),
                });
                continue;
            };
            // The dashboard's entities wrap the rule: {"id":..., "app":..., "rule": {...}}.
            let map = match map.get("rule") {
                Some(Value::Object(inner)) => inner,
                _ => map,
            };
            let mut o = Obj { map, file, index, resource: None, errors };
            let at = At { file: file.into(), index };
            match kind {
                Kind::Flow => self.flow.extend(o.flow(at)),
                Kind::Degrade => self.degrade.extend(o.degrade(at)),
                Kind::System => self.system.extend(o.system(at)),
                Kind::Param => self.param.extend(o.param(at)),
                Kind::Authority => self.authority.extend(o.authority(at)),
                Kind::Gateway => {}
            }
        }
    }
}

/// A whole number (`100` or `100.0`), or one given as text (as fastjson
/// reads it).
fn whole(v: &Value) -> Option<i64> {
    let float = |f: f64| (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64);
    match v {
        Value::Number(n) => n.as_i64().or_else(|| float(n.as_f64()?)),
        Value::String(s) => s.trim().parse().ok().or_else(|| float(s.trim().parse().ok()?)),
        _ => None,
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

impl<'a> Obj<'a> {
    fn error(&mut self, field: &str, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.into(),
            resource: self.resource.clone(),
            field: format!("[{}].{field}", self.index),
            message: message.into(),
        });
    }

    fn count_errors(&self) -> usize {
        self.errors.len()
    }

    /// `resource`: required, not blank (as Sentinel), and a name Floodgate
    /// takes (at most 256 bytes, no control characters).
    fn resource(&mut self) -> Option<String> {
        let r = self.string("resource", "");
        if r.trim().is_empty() {
            self.error("resource", "is required and must not be blank");
            return None;
        }
        self.resource = Some(r.clone());
        if r.len() > crate::MAX_NAME_BYTES {
            self.error("resource", format!("is {} bytes long; the limit is {}", r.len(), crate::MAX_NAME_BYTES));
        } else if let Some(c) = r.chars().find(|c| c.is_control()) {
            self.error("resource", format!("control character U+{:04X} is not allowed", c as u32));
        }
        Some(r)
    }

    fn string(&mut self, key: &str, default: &str) -> String {
        match self.map.get(key) {
            None | Some(Value::Null) => default.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                self.error(key, format!("must be a string, got {}", json_kind(other)));
                default.to_string()
            }
        }
    }

    /// The field as fastjson reads it into a rule: a number or boolean
    /// given as text (`"count": "10"`) is the text's value, a blank text is
    /// absent; anything else is as written.
    fn value(&self, key: &str) -> Option<Cow<'a, Value>> {
        let v = self.map.get(key)?;
        let Value::String(s) = v else { return Some(Cow::Borrowed(v)) };
        let read = match s.trim() {
            "" => Some(Value::Null),
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            t => t.parse::<serde_json::Number>().ok().map(Value::Number),
        };
        Some(read.map_or(Cow::Borrowed(v), Cow::Owned))
    }

    fn boolean(&mut self, key: &str, default: bool) -> bool {
        match self.value(key).as_deref() {
            None | Some(Value::Null) => default,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.error(key, format!("must be true or false, got {}", json_kind(other)));
                default
            }
        }
    }

    /// A whole number (a double with no fraction too: `1.0`) that fits the
    /// Java `int` Sentinel reads it into (fastjson refuses the file
    /// otherwise); `durationInSec` is a `long`.
    fn int(&mut self, key: &str, default: i64) -> i64 {
        let n = self.any_int(key, default);
        if key != "durationInSec" && i32::try_from(n).is_err() {
            self.error(key, format!("must fit Sentinel's int ({} to {}), got {n}", i32::MIN, i32::MAX));
            return default;
        }
        n
    }

    fn any_int(&mut self, key: &str, default: i64) -> i64 {
        match self.value(key).as_deref() {
            None | Some(Value::Null) => default,
            Some(v @ Value::Number(n)) => whole(v).unwrap_or_else(|| {
                self.error(key, format!("must be a whole number, got {n}"));
                default
            }),
            Some(other) => {
                self.error(key, format!("must be a number, got {}", json_kind(other)));
                default
            }
        }
    }

    fn double(&mut self, key: &str, default: f64) -> f64 {
        match self.value(key).as_deref() {
            None | Some(Value::Null) => default,
            Some(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite()).unwrap_or_else(|| {
                self.error(key, format!("must be a finite number, got {n}"));
                default
            }),
            Some(other) => {
                self.error(key, format!("must be a number, got {}", json_kind(other)));
                default
            }
        }
    }

    /// A nested object (`clusterConfig`), if there is one.
    fn object(&mut self, key: &str) -> Option<&'a Map<String, Value>> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(other) => {
                self.error(key, format!("must be an object, got {}", json_kind(other)));
                None
            }
        }
    }

    fn at_least(&mut self, key: &str, value: f64, min: f64, what: &str) {
        if value < min {
            self.error(key, format!("must be {what}, got {value}"));
        }
    }

    fn flow(&mut self, at: At) -> Option<Flow> {
        let before = self.count_errors();
        let resource = self.resource();
        let limit_app = self.string("limitApp", "default");
        let limit_app = if limit_app.trim().is_empty() { "default".to_string() } else { limit_app };
        let grade = self.int("grade", 1);
        let count = self.double("count", 0.0);
        let strategy = self.int("strategy", 0);
        let ref_resource = self.string("refResource", "");
        let behavior = self.int("controlBehavior", 0);
        let warm_up_secs = self.int("warmUpPeriodSec", 10);
        let max_queueing_ms = self.int("maxQueueingTimeMs", 500);
        let cluster = self.boolean("clusterMode", false);
        let regex = self.boolean("regex", false);
        let threshold_type = match self.object("clusterConfig") {
            Some(c) => match c.get("thresholdType") {
                None | Some(Value::Null) => 0,
                Some(v) => whole(v).unwrap_or_else(|| {
                    let message = format!("must be 0 (average local) or 1 (global), got {v}");
                    self.error("clusterConfig.thresholdType", message);
                    0
                }),
            },
            None => 0,
        };
        self.at_least("count", count, 0.0, "at least 0");
        self.at_least("strategy", strategy as f64, 0.0, "0 (direct), 1 (relate) or 2 (chain)");
        self.at_least("controlBehavior", behavior as f64, 0.0, "0 to 3");
        match grade {
            0 => {}
            1 => {
                if (strategy == 1 || strategy == 2) && ref_resource.trim().is_empty() {
                    self.error("refResource", "is required with strategy 1 (relate) and 2 (chain)");
                }
                if (behavior == 1 || behavior == 3) && warm_up_secs <= 0 {
                    self.error("warmUpPeriodSec", format!("must be above 0 with a warm up, got {warm_up_secs}"));
                }
                if (behavior == 2 || behavior == 3) && max_queueing_ms <= 0 {
                    self.error(
                        "maxQueueingTimeMs",
                        format!("must be above 0 with a rate limiter (Sentinel refuses 0), got {max_queueing_ms}"),
                    );
                }
                if cluster && !(0..=1).contains(&threshold_type) {
                    self.error("clusterConfig.thresholdType", format!("must be 0 or 1, got {threshold_type}"));
                }
            }
            g => self.error("grade", format!("{g} is not a grade: 0 (thread count) or 1 (QPS)")),
        }
        (self.count_errors() == before).then_some(())?;
        Some(Flow {
            at,
            resource: resource?,
            limit_app,
            grade,
            count,
            strategy,
            ref_resource,
            behavior,
            warm_up_secs,
            max_queueing_ms,
            cluster,
            threshold_type,
            regex,
        })
    }

    fn degrade(&mut self, at: At) -> Option<Degrade> {
        let before = self.count_errors();
        let resource = self.resource();
        let grade = self.int("grade", 0);
        let count = self.double("count", 0.0);
        let time_window = self.int("timeWindow", 0);
        let min_requests = self.int("minRequestAmount", 5);
        let slow_ratio = self.double("slowRatioThreshold", 1.0);
        let stat_interval_ms = self.int("statIntervalMs", 1000);
        let regex = self.boolean("regex", false);
        self.at_least("count", count, 0.0, "at least 0");
        if time_window <= 0 {
            self.error("timeWindow", format!("must be above 0 (seconds OPEN), got {time_window}"));
        }
        if min_requests <= 0 {
            self.error("minRequestAmount", format!("must be above 0, got {min_requests}"));
        }
        if stat_interval_ms <= 0 || stat_interval_ms > 3_600_000 {
            self.error("statIntervalMs", format!("must be from 1 to 3600000, got {stat_interval_ms}"));
        }
        match grade {
            0 if !(0.0..=1.0).contains(&slow_ratio) => {
                self.error("slowRatioThreshold", format!("must be from 0 to 1, got {slow_ratio}"));
            }
            0 if count > 3_600_000.0 => {
                self.error("count", format!("a slow call past {count} ms: at most an hour (3600000)"));
            }
            0 | 2 => {}
            1 if count > 1.0 => self.error("count", format!("an exception ratio must be from 0 to 1, got {count}")),
            1 => {}
            g => self.error(
                "grade",
                format!("{g} is not a grade: 0 (slow request ratio), 1 (exception ratio) or 2 (exception count)"),
            ),
        }
        (self.count_errors() == before).then_some(())?;
        Some(Degrade {
            at,
            resource: resource?,
            grade,
            count,
            time_window,
            min_requests,
            slow_ratio,
            stat_interval_ms,
            regex,
        })
    }

    fn system(&mut self, at: At) -> Option<System> {
        let before = self.count_errors();
        let rule = System {
            at,
            load: self.double("highestSystemLoad", -1.0),
            cpu: self.double("highestCpuUsage", -1.0),
            qps: self.double("qps", -1.0),
            avg_rt: self.int("avgRt", -1),
            max_thread: self.int("maxThread", -1),
        };
        (self.count_errors() == before).then_some(rule)
    }

    fn param(&mut self, at: At) -> Option<Param> {
        let before = self.count_errors();
        let resource = self.resource();
        let grade = self.int("grade", 1);
        let param_idx = match self.map.get("paramIdx") {
            None | Some(Value::Null) => {
                self.error("paramIdx", "is required: the index of the parameter");
                0
            }
            Some(_) => self.int("paramIdx", 0),
        };
        let count = self.double("count", 0.0);
        let behavior = self.int("controlBehavior", 0);
        let max_queueing_ms = self.int("maxQueueingTimeMs", 0);
        let burst = self.int("burstCount", 0);
        let duration_secs = self.int("durationInSec", 1);
        let regex = self.boolean("regex", false);
        self.at_least("count", count, 0.0, "at least 0");
        self.at_least("grade", grade as f64, 0.0, "0 (thread count) or 1 (QPS)");
        self.at_least("burstCount", burst as f64, 0.0, "at least 0");
        self.at_least("controlBehavior", behavior as f64, 0.0, "0 or 2");
        self.at_least("maxQueueingTimeMs", max_queueing_ms as f64, 0.0, "at least 0");
        if duration_secs <= 0 {
            self.error("durationInSec", format!("must be above 0, got {duration_secs}"));
        }
        let items = self.items();
        (self.count_errors() == before).then_some(())?;
        Some(Param {
            at,
            resource: resource?,
            grade,
            param_idx,
            count,
            behavior,
            max_queueing_ms,
            burst,
            duration_secs,
            items,
            regex,
        })
    }

    /// `paramFlowItemList`: `{object, count, classType}`; an item without an
    /// object or with a missing or negative count is refused (Sentinel drops
    /// it with a warning).
    fn items(&mut self) -> Vec<(String, i64)> {
        let list = match self.map.get("paramFlowItemList") {
            None | Some(Value::Null) => return Vec::new(),
            Some(Value::Array(list)) => list,
            Some(other) => {
                self.error("paramFlowItemList", format!("must be a list, got {}", json_kind(other)));
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let field = format!("paramFlowItemList[{i}]");
            let object = item.get("object").and_then(|o| match o {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                Value::Bool(b) => Some(b.to_string()),
                _ => None,
            });
            let count = item.get("count").and_then(whole);
            match (object, count) {
                (Some(object), Some(count)) if count >= 0 && object.len() <= crate::MAX_NAME_BYTES => {
                    out.push((object, count))
                }
                (None, _) => self.error(&field, "needs an object: the parameter's value"),
                _ => self.error(&field, "needs a count of at least 0 (and a value of at most 256 bytes)"),
            }
        }
        out
    }

    fn authority(&mut self, at: At) -> Option<Authority> {
        let before = self.count_errors();
        let resource = self.resource();
        let limit_app = self.string("limitApp", "");
        let strategy = self.int("strategy", 0);
        let regex = self.boolean("regex", false);
        if limit_app.trim().is_empty() {
            self.error("limitApp", "is required: the comma-separated origins of the list");
        }
        self.at_least("strategy", strategy as f64, 0.0, "0 (white list) or 1 (black list)");
        (self.count_errors() == before).then_some(())?;
        Some(Authority { at, resource: resource?, limit_app, strategy, regex })
    }
}
