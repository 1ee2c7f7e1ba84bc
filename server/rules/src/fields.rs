//! Reading one YAML mapping field by field, collecting every error with where it
//! was found, so that a bad file is reported whole rather than one error at a time.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::Duration;

use serde_yaml_ng::{Mapping, Value};

use super::duration;

/// One problem in a rules file, naming the file, the resource and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub file: String,
    pub resource: Option<String>,
    pub field: String,
    pub message: String,
}

/// Every problem found in a rules file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct RuleErrors(pub Vec<RuleError>);

impl RuleErrors {
    /// One error about the whole file.
    pub fn one(file: &str, message: impl Into<String>) -> Self {
        RuleErrors(vec![RuleError { file: file.into(), resource: None, field: String::new(), message: message.into() }])
    }
}

/// Errors collected while reading one file.
pub(super) struct Collector {
    file: String,
    errors: RefCell<Vec<RuleError>>,
}

/// One mapping being read, and where it sits in the file.
pub(super) struct Fields<'a> {
    map: &'a Mapping,
    resource: Option<&'a str>,
    path: String,
    out: &'a Collector,
}

impl fmt::Display for RuleError {
    /// One line whatever the input held: control characters escaped, a long
    /// file or resource name cut (an error must not forge log lines, nor echo
    /// a 100 KB name).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", Shown(&self.file, 512))?;
        if let Some(r) = &self.resource {
            write!(f, "resource '{}': ", Shown(r, 256))?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", Shown(&self.field, 512))?;
        }
        write!(f, "{}", Shown(&self.message, 4096))
    }
}

/// Text as an error line shows it: control characters escaped, at most
/// `.1` characters and then how many more bytes there were.
struct Shown<'a>(&'a str, usize);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Shown(text, most) = *self;
        for (i, (at, c)) in text.char_indices().enumerate() {
            if i == most {
                return write!(f, "... ({} more bytes)", text.len() - at);
            }
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} error{} in rules:", if n == 1 { "" } else { "s" })?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

// === impl Collector ===

impl Collector {
    pub(super) fn new(file: &str) -> Self {
        Collector { file: file.to_string(), errors: RefCell::new(Vec::new()) }
    }

    pub(super) fn push(&self, resource: Option<&str>, field: &str, message: impl Into<String>) {
        self.errors.borrow_mut().push(RuleError {
            file: self.file.clone(),
            resource: resource.map(str::to_string),
            field: field.to_string(),
            message: message.into(),
        });
    }

    pub(super) fn is_empty(&self) -> bool {
        self.errors.borrow().is_empty()
    }

    pub(super) fn count(&self) -> usize {
        self.errors.borrow().len()
    }

    pub(super) fn into_errors(self) -> RuleErrors {
        RuleErrors(self.errors.into_inner())
    }

    /// The fields of `value`, which must be a mapping.
    pub(super) fn fields<'a>(&'a self, value: &'a Value, resource: Option<&'a str>, path: &str) -> Option<Fields<'a>> {
        match value {
            Value::Mapping(map) => Some(Fields { map, resource, path: path.to_string(), out: self }),
            other => {
                self.push(resource, path, format!("must be a mapping, got {}", kind(other)));
                None
            }
        }
    }
}

// === impl Fields ===

impl<'a> Fields<'a> {
    /// The same mapping, as the definition of resource `label`: errors name the
    /// resource rather than its position.
    pub(super) fn with_resource<'b>(self, label: &'b str) -> Fields<'b>
    where
        'a: 'b,
    {
        Fields { map: self.map, resource: Some(label), path: String::new(), out: self.out }
    }

    /// The fields of `value`, found under `label` in this mapping.
    pub(super) fn nested_value(&self, value: &'a Value, label: &str) -> Option<Fields<'a>> {
        self.out.fields(value, self.resource, &self.path(label))
    }

    pub(super) fn path(&self, key: &str) -> String {
        match (self.path.is_empty(), key.is_empty()) {
            (true, _) => key.to_string(),
            (false, true) => self.path.clone(),
            (false, false) => format!("{}.{key}", self.path),
        }
    }

    /// How many errors the file has so far.
    pub(super) fn errors(&self) -> usize {
        self.out.count()
    }

    pub(super) fn error(&self, key: &str, message: impl Into<String>) {
        self.out.push(self.resource, &self.path(key), message);
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The key is written with no value (`key:` alone, or `key: null`),
    /// which [`Fields::get`] reads as absent.
    pub(super) fn is_null(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(Value::is_null)
    }

    /// Reports every key that is not in `known`.
    pub(super) fn deny_unknown(&self, known: &[&str]) {
        for key in self.map.keys() {
            match key.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(k) => self.error(k, format!("unknown field (expected one of: {})", known.join(", "))),
                None => self.error("", format!("field names must be strings, got {}", kind(key))),
            }
        }
    }

    pub(super) fn required<T>(&self, key: &str, read: impl FnOnce(&Self, &str) -> Option<T>) -> Option<T> {
        if !self.has(key) {
            self.error(key, "is required");
            return None;
        }
        read(self, key)
    }

    pub(super) fn string(&self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                self.error(key, format!("must be a string, got {}", kind(other)));
                None
            }
        }
    }

    /// A whole number in `min..=max`.
    /// A value out of range and a value that is not a whole number at all
    /// (-1, 1.5, "ten") get the same message, which names the range.
    pub(super) fn u64_in(&self, key: &str, min: u64, max: u64) -> Option<u64> {
        let v = self.get(key)?;
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ => {
                self.error(key, format!("must be a whole number between {min} and {max}, got {}", show(v)));
                None
            }
        }
    }

    /// A true/false switch; absent is false.
    pub(super) fn flag(&self, key: &str) -> bool {
        match self.get(key) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                self.error(key, format!("must be true or false, got {}", show(v)));
                false
            }
        }
    }

    pub(super) fn f64(&self, key: &str) -> Option<f64> {
        let v = self.get(key)?;
        match v.as_f64() {
            Some(n) if n.is_finite() => Some(n),
            _ => {
                self.error(key, format!("must be a number, got {}", show(v)));
                None
            }
        }
    }

    /// A duration written with units; at least `min`.
    pub(super) fn duration(&self, key: &str, min: Duration) -> Option<Duration> {
        let v = self.get(key)?;
        let text = match v {
            Value::String(text) => text.clone(),
            // A bare number is a duration without a unit: say so.
            Value::Number(n) => n.to_string(),
            other => {
                self.error(key, format!("must be a duration such as 250ms, 1s or 5m, got {}", show(other)));
                return None;
            }
        };
        match duration::parse(&text) {
            Ok(d) if d < min => {
                let min = duration::format(min);
                self.error(key, format!("must be at least {min}, got {text}"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.error(key, e);
                None
            }
        }
    }

    /// One of `choices`.
    pub(super) fn choice<T: Copy>(&self, key: &str, choices: &[(&str, T)]) -> Option<T> {
        let s = self.string(key)?;
        match choices.iter().find(|(name, _)| *name == s) {
            Some(&(_, v)) => Some(v),
            None => {
                let names: Vec<_> = choices.iter().map(|(n, _)| *n).collect();
                self.error(key, format!("must be one of {}, got '{s}'", names.join(", ")));
                None
            }
        }
    }

    pub(super) fn strings(&self, key: &str) -> Option<Vec<String>> {
        let v = self.get(key)?;
        let Value::Sequence(items) = v else {
            self.error(key, format!("must be a list of strings, got {}", kind(v)));
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => out.push(s.clone()),
                other => self.error(&format!("{key}[{i}]"), format!("must be a string, got {}", kind(other))),
            }
        }
        (out.len() == items.len()).then_some(out)
    }

    /// A nested mapping.
    pub(super) fn nested(&self, key: &str) -> Option<Fields<'a>> {
        let v = self.get(key)?;
        self.out.fields(v, self.resource, &self.path(key))
    }
}

pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

pub(super) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{s}'"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}
