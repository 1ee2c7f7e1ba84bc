//! What a caller may ask, checked before anything is decided.

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::rules::{MAX_DESCRIPTORS, MAX_NAME_BYTES};

/// The most items in one batch.
pub const MAX_BATCH: usize = 1000;

/// The caller's dimensions, however the transport carries them.
pub trait Descriptors {
    fn get(&self, key: &str) -> Option<&str>;
    fn count(&self) -> usize;
    fn entries(&self) -> impl Iterator<Item = (&str, &str)>;
}

/// Descriptors with one set by the server, whatever the caller sent for its
/// key: the caller's mTLS identity as its origin (a caller cannot claim
/// another's).
pub struct Overlaid<'a, D: ?Sized> {
    pub inner: &'a D,
    pub set: Option<(&'a str, &'a str)>,
}

impl<D: Descriptors + ?Sized> Descriptors for Overlaid<'_, D> {
    #[inline]
    fn get(&self, key: &str) -> Option<&str> {
        match self.set {
            Some((k, v)) if k == key => Some(v),
            _ => self.inner.get(key),
        }
    }

    fn count(&self) -> usize {
        match self.set {
            Some((k, _)) if self.inner.get(k).is_none() => self.inner.count() + 1,
            _ => self.inner.count(),
        }
    }

    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        let set = self.set;
        let kept = self.inner.entries().filter(move |(k, _)| set.is_none_or(|(s, _)| s != *k));
        kept.chain(set)
    }
}

/// One decision to make.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a, D: ?Sized> {
    pub resource: &'a str,
    pub descriptors: &'a D,
    /// 0 is read as 1.
    pub cost: u32,
    /// Answer without consuming anything.
    pub dry_run: bool,
    /// `cost` is an estimate, settled by the report (see `settle.rs`).
    pub settle: bool,
    /// Which requests a degradation level sheds first.
    pub priority: crate::rules::Priority,
    /// Usage fields reported with the call (`input_tokens: 812`), which the
    /// matched limits' `cost` formulas read; `None` when none were.
    pub usage: Option<&'a Usage>,
}

/// Usage a call reports, by field name.
pub type Usage = HashMap<String, u64>;

impl<'a, D: ?Sized> Request<'a, D> {
    /// A decision of cost 1 at the default priority, consuming what it admits.
    pub fn new(resource: &'a str, descriptors: &'a D) -> Self {
        Request {
            resource,
            descriptors,
            cost: 1,
            dry_run: false,
            settle: false,
            priority: Default::default(),
            usage: None,
        }
    }

    /// The same request with other descriptors.
    pub fn with<E: ?Sized>(self, descriptors: &'a E) -> Request<'a, E> {
        let Request { resource, cost, dry_run, settle, priority, usage, .. } = self;
        Request { resource, descriptors, cost, dry_run, settle, priority, usage }
    }
}

/// Bad input: the message names the field and the value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{field}: must not be empty")]
    Empty { field: String },
    #[error("{field}: '{preview}' is {len} bytes long; the limit is {MAX_NAME_BYTES}")]
    TooLong { field: String, preview: String, len: usize },
    #[error("{field}: control character U+{code:04X} is not allowed")]
    ControlCharacter { field: String, code: u32 },
    #[error("descriptors: {0} entries; the limit is {MAX_DESCRIPTORS}")]
    TooManyDescriptors(usize),
    #[error("{field}: {count} items; the limit is {MAX_BATCH}")]
    BatchTooLarge { field: &'static str, count: usize },
    #[error("cost {cost} exceeds capacity {capacity} of limit '{limit}'")]
    CostExceedsCapacity { cost: u64, capacity: u64, limit: String },
    #[error("{field}: {value} is larger than the largest cost, {max}", max = u32::MAX)]
    CostTooLarge { field: &'static str, value: u64 },
    #[error("usage: '{}' is not a usage field of rule '{rule}' ({known})", .field.escape_debug())]
    UnknownUsage { field: String, rule: String, known: String },
    #[error("usage: '{}' is not a usage field name (lowercase letters, digits and _, at most 64 bytes)", .field.escape_debug())]
    BadUsageName { field: String },
    #[error("usage: {count} fields; the limit is {max}")]
    TooMuchUsage { count: usize, max: usize },
    #[error("usage.{field}: {value} is larger than the largest, {max}", max = crate::rules::cost::MAX_USAGE_VALUE)]
    UsageTooLarge { field: String, value: u64 },
    #[error(
        "usage: limit '{limit}' would cost {value} for this usage (its cost is '{formula}'); a cost cannot be negative"
    )]
    NegativeCost { limit: String, value: String, formula: String },
    #[error("usage: limit '{limit}' would cost {value} for this usage, more than the largest cost, {max}", max = u32::MAX)]
    UsageCostTooLarge { limit: String, value: String },
    /// Bad input the replica that issued a permit found in a report passed
    /// on to it: its message.
    #[error("{0}")]
    Issuer(String),
    #[error("permit_id: '{0}' is not a permit id")]
    MalformedPermit(String),
    #[error("resource: the permit was not issued for '{resource}'")]
    PermitResourceMismatch { resource: String },
    #[error("previous_lease_id: '{0}' is not a lease id")]
    MalformedLease(String),
    #[error("resource: the lease was not granted for '{resource}'")]
    LeaseResourceMismatch { resource: String },
    #[error("previous_lease_id: the lease was granted to another holder")]
    LeaseHolderMismatch,
    #[error("holder: {0}")]
    BadHolder(String),
    #[error("{field}: {seconds}s {nanos}ns is not a duration (negative, or nanos not below 1e9)")]
    BadDuration { field: &'static str, seconds: i64, nanos: i32 },
    #[error("resource: no rule gives '{0}' a circuit breaker")]
    NoBreaker(String),
    #[error("resource: no rule gives '{0}' a concurrency limit")]
    NoConcurrency(String),
    #[error("limit: resource '{resource}' has no matched limit '{limit}'")]
    NoSuchLimit { resource: String, limit: String },
    #[error(
        "state: BREAKER_STATE_{0} cannot be set; use BREAKER_STATE_CLOSED (reset), BREAKER_STATE_FORCED_OPEN, BREAKER_STATE_DISABLED or BREAKER_STATE_METRICS_ONLY"
    )]
    BadBreakerState(&'static str),
    #[error("level: {0} is not a degradation level (0 to 3)")]
    BadLevel(u32),
    #[error("what_if: {0} is not between 1s and 24h")]
    WhatIfLength(String),
    #[error("no what-if was started (ApplyRules with what_if starts one)")]
    NoWhatIf,
    #[error("limit: '{resource}/{limit}' records no traffic (set history: true on it)")]
    NotRecorded { resource: String, limit: String },
    #[error("page_token: '{}' is not a page of recorded traffic", .0.chars().take(32).collect::<String>().escape_debug())]
    BadPage(String),
    #[error("no earlier rules are kept: the rules in force are the first this server installed")]
    NothingToRevert,
    #[error("to_version: {version} is not kept; the versions kept are {kept}")]
    NotKept { version: u64, kept: String },
    #[error("validate_only: cannot go with what_if (a what-if installs nothing either): send one of them")]
    ValidateWithWhatIf,
    #[error("rule: no rule in force is named '{}'", .0.escape_debug())]
    NoSuchRule(String),
    #[error("{field}: {value} is not one of {expected}")]
    UnknownEnum { field: &'static str, value: i32, expected: &'static str },
    #[error("{field}: {message}")]
    BadOverride { field: &'static str, message: String },
    /// A field out of its range, named with its value in `message`.
    #[error("{field}: {message}")]
    OutOfRange { field: &'static str, message: String },
    #[error("overrides: {count} would be set; the limit is {max} (--max-overrides)")]
    TooManyOverrides { count: usize, max: usize },
    #[error("overrides could not be kept: {0}")]
    OverridesNotKept(String),
    #[error("system: '{}' is not a system of the rules in force", .0.escape_debug())]
    UnknownSystem(String),
    #[error("system: '{}' cannot go with every_system (which sets every system): send one of them", .0.escape_debug())]
    SystemWithEverySystem(String),
    #[error("{field}: {value} is not a utilization between 0 and 1")]
    BadUtilization { field: &'static str, value: String },
    #[error("instance: system '{system}' already has {live} live instances (its load.max_instances is {max}); '{}' is not counted", .instance.escape_debug())]
    TooManyInstances { system: String, live: usize, max: usize, instance: String },
    #[error("limit: '{}' of resource '{}' is not a balance (algorithm: balance), it is a {algorithm}", .limit.escape_debug(), .resource.escape_debug())]
    NotABalance { resource: String, limit: String, algorithm: &'static str },
    #[error("the balance is kept in Redis, which did not answer: nothing changed; try again")]
    BalanceUnavailable,
    #[error(
        "the server keeps as many keys as --max-keys allows, and balances that hold credits are never evicted: the top-up was not made; raise --max-keys"
    )]
    BalancesFull,
    #[error("{field}[{index}]{}{source}", if source.starts_with_field() { "." } else { ": " })]
    InBatch { field: &'static str, index: usize, source: Box<RequestError> },
}

/// What kind of failure an error is, whatever protocol answers it: gRPC
/// (`grpc::status`) and the console (`http::console`) each map these, and
/// only these, to their codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's input is wrong; nothing changed.
    BadInput,
    /// What the caller named does not exist.
    NotFound,
    /// A bound on what the server keeps would be passed.
    TooMany,
    /// A store the change needs did not answer; nothing changed.
    Unavailable,
}

impl<S: BuildHasher> Descriptors for HashMap<String, String, S> {
    fn get(&self, key: &str) -> Option<&str> {
        HashMap::get(self, key).map(String::as_str)
    }

    fn count(&self) -> usize {
        self.len()
    }

    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Ordered pairs, as Envoy sends them; the first of a repeated key wins.
impl<K: AsRef<str>, V: AsRef<str>> Descriptors for [(K, V)] {
    fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| k.as_ref() == key).map(|(_, v)| v.as_ref())
    }

    fn count(&self) -> usize {
        self.len()
    }

    fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }
}

impl RequestError {
    /// Matched without a wildcard: a new error says what kind it is.
    pub fn kind(&self) -> ErrorKind {
        use RequestError::*;
        match self {
            NoBreaker(_)
            | NoConcurrency(_)
            | NoSuchLimit { .. }
            | NoWhatIf
            | NoSuchRule(_)
            | NothingToRevert
            | NotKept { .. }
            | NotRecorded { .. } => ErrorKind::NotFound,
            TooManyOverrides { .. } | TooManyInstances { .. } | BalancesFull => ErrorKind::TooMany,
            OverridesNotKept(_) | BalanceUnavailable => ErrorKind::Unavailable,
            InBatch { source, .. } => source.kind(),
            Empty { .. }
            | BadPage(_)
            | TooLong { .. }
            | ControlCharacter { .. }
            | TooManyDescriptors(_)
            | BatchTooLarge { .. }
            | CostExceedsCapacity { .. }
            | CostTooLarge { .. }
            | UnknownUsage { .. }
            | BadUsageName { .. }
            | TooMuchUsage { .. }
            | UsageTooLarge { .. }
            | NegativeCost { .. }
            | UsageCostTooLarge { .. }
            | Issuer(_)
            | MalformedPermit(_)
            | PermitResourceMismatch { .. }
            | MalformedLease(_)
            | LeaseResourceMismatch { .. }
            | LeaseHolderMismatch
            | BadHolder(_)
            | BadDuration { .. }
            | BadBreakerState(_)
            | BadLevel(_)
            | WhatIfLength(_)
            | ValidateWithWhatIf
            | UnknownEnum { .. }
            | UnknownSystem(_)
            | SystemWithEverySystem(_)
            | BadUtilization { .. }
            | BadOverride { .. }
            | NotABalance { .. }
            | OutOfRange { .. } => ErrorKind::BadInput,
        }
    }

    /// Whether the message opens with the field it is about (`resource: ...`),
    /// so that a batch can prefix it with the item (`requests[2].resource: ...`).
    fn starts_with_field(&self) -> bool {
        !matches!(self, RequestError::CostExceedsCapacity { .. })
    }

    /// This error, found in item `index` of the list `field`.
    pub fn in_batch(self, field: &'static str, index: usize) -> RequestError {
        RequestError::InBatch { field, index, source: Box::new(self) }
    }
}

/// Refuses a batch longer than [`MAX_BATCH`].
/// Descriptor pairs as `k=v,k=v`, in the order given, for logs and the CLI.
/// A `,`, `=` or `\` inside a key or value is written after a `\`, so that
/// a value such as `a,tenant=b` cannot read as two pairs (an audit line
/// must name the key a change was made to, whatever the caller sent).
pub fn pairs_text<'a, K, V>(pairs: impl IntoIterator<Item = (&'a K, &'a V)>) -> String
where
    K: AsRef<str> + ?Sized + 'a,
    V: AsRef<str> + ?Sized + 'a,
{
    let mut out = String::new();
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        escape_pair_part(&mut out, k.as_ref());
        out.push('=');
        escape_pair_part(&mut out, v.as_ref());
    }
    out
}

fn escape_pair_part(out: &mut String, part: &str) {
    for c in part.chars() {
        if matches!(c, ',' | '=' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// [`pairs_text`] of pairs sorted by key, then value.
pub fn sorted_pairs_text<'a, K, V>(pairs: impl IntoIterator<Item = (&'a K, &'a V)>) -> String
where
    K: AsRef<str> + ?Sized + 'a,
    V: AsRef<str> + ?Sized + 'a,
{
    let mut pairs: Vec<(&str, &str)> = pairs.into_iter().map(|(k, v)| (k.as_ref(), v.as_ref())).collect();
    pairs.sort_unstable();
    pairs_text(pairs.iter().map(|(k, v)| (*k, *v)))
}

pub fn check_batch(field: &'static str, count: usize) -> Result<(), RequestError> {
    if count > MAX_BATCH {
        return Err(RequestError::BatchTooLarge { field, count });
    }
    Ok(())
}

/// Checks the input limits of SPEC section 2.
pub fn validate<D: Descriptors + ?Sized>(resource: &str, descriptors: &D) -> Result<(), RequestError> {
    check_name("resource", resource, false)?;
    let count = descriptors.count();
    if count > MAX_DESCRIPTORS {
        return Err(RequestError::TooManyDescriptors(count));
    }
    for (k, v) in descriptors.entries() {
        check_name("descriptors key", k, false)?;
        if v.len() > MAX_NAME_BYTES {
            check_value(&format!("descriptors[{:?}]", preview(k)), v)?;
        }
    }
    Ok(())
}

/// An Envoy RLS descriptor list: the domain present, at most 32 entries,
/// and keys that are names (they come from Envoy's configuration); a value
/// may be anything of any length (a path, a header: a long one is counted
/// by its digest), as upstream takes it. A request is never refused for a
/// value: Envoy would let its failure mode decide the whole call, every
/// other descriptor included.
pub(crate) fn validate_rls(domain: &str, entries: &[(&str, &str)]) -> Result<(), RequestError> {
    if domain.is_empty() {
        return Err(RequestError::Empty { field: "domain".into() });
    }
    if entries.len() > MAX_DESCRIPTORS {
        return Err(RequestError::TooManyDescriptors(entries.len()));
    }
    for (k, _) in entries {
        check_name("descriptors key", k, false)?;
    }
    Ok(())
}

/// A permit id: 32 hex digits (128 bits).
pub fn check_permit_id(id: &str) -> Result<u128, RequestError> {
    let malformed = || RequestError::MalformedPermit(preview(id));
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    u128::from_str_radix(id, 16).map_err(|_| malformed())
}

/// A name (resource, domain, key) must be present, at most 256 bytes, and
/// free of control characters (it reaches logs, metric labels and terminals).
pub fn check_name(field: &str, value: &str, may_be_empty: bool) -> Result<(), RequestError> {
    if value.is_empty() && !may_be_empty {
        return Err(RequestError::Empty { field: field.to_string() });
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(RequestError::TooLong { field: field.to_string(), preview: preview(value), len: value.len() });
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(RequestError::ControlCharacter { field: field.to_string(), code: c as u32 });
    }
    Ok(())
}

/// A descriptor value: at most 256 bytes; any characters (a header value, a
/// user agent), since it is never a label and is escaped wherever shown.
fn check_value(field: &str, value: &str) -> Result<(), RequestError> {
    if value.len() > MAX_NAME_BYTES {
        return Err(RequestError::TooLong { field: field.to_string(), preview: preview(value), len: value.len() });
    }
    Ok(())
}

/// The start of a long value, enough to recognise it in an error, with
/// control characters escaped: an error message must not carry a terminal
/// escape sequence to whoever reads the logs.
pub(super) fn preview(value: &str) -> String {
    const SHOWN: usize = 40;
    let escape = |s: &str| s.chars().flat_map(char::escape_default).collect::<String>();
    let escaped = |s: &str| if s.chars().any(char::is_control) { escape(s) } else { s.to_string() };
    match value.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", escaped(&value[..cut])),
        None => escaped(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn names_the_field_and_value() {
        let none = map(&[]);
        assert_eq!(validate("", &none).unwrap_err().to_string(), "resource: must not be empty");
        let long = "r".repeat(300);
        assert_eq!(
            validate(&long, &none).unwrap_err().to_string(),
            format!("resource: '{}…' is 300 bytes long; the limit is 256", "r".repeat(40))
        );
        let d = map(&[("user", &"v".repeat(257))]);
        assert_eq!(
            validate("x", &d).unwrap_err().to_string(),
            format!("descriptors[\"user\"]: '{}…' is 257 bytes long; the limit is 256", "v".repeat(40))
        );
        let d = map(&[("", "v")]);
        assert_eq!(validate("x", &d).unwrap_err().to_string(), "descriptors key: must not be empty");
        let many: HashMap<String, String> = (0..33).map(|i| (format!("k{i}"), "v".to_string())).collect();
        assert_eq!(validate("x", &many).unwrap_err().to_string(), "descriptors: 33 entries; the limit is 32");
        assert_eq!(check_batch("requests", 1001).unwrap_err().to_string(), "requests: 1001 items; the limit is 1000");
        let e = RequestError::Empty { field: "resource".into() }.in_batch("requests", 3);
        assert_eq!(e.to_string(), "requests[3].resource: must not be empty");
    }

    #[test]
    fn control_characters_are_refused_in_names_and_escaped_in_messages() {
        let none = map(&[]);
        let e = validate("orders\u{1b}[31m", &none).unwrap_err();
        assert_eq!(e.to_string(), "resource: control character U+001B is not allowed");
        let d = map(&[("us\ner", "v")]);
        assert_eq!(
            validate("x", &d).unwrap_err().to_string(),
            "descriptors key: control character U+000A is not allowed"
        );
        assert!(validate("x", &map(&[("agent", "curl\t8")])).is_ok(), "values may hold any character");
        let e = check_permit_id("\u{1b}[2Jabc").unwrap_err().to_string();
        assert!(!e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn exact_limits_are_accepted() {
        let d: HashMap<String, String> = (0..32).map(|i| (format!("k{i}"), "v".repeat(256))).collect();
        assert!(validate(&"r".repeat(256), &d).is_ok());
        assert!(validate("x", &map(&[("user", "")])).is_ok(), "an empty value is a value");
        assert!(check_batch("requests", 1000).is_ok());
    }

    #[test]
    fn pairs_are_written_so_that_a_value_cannot_read_as_two_pairs() {
        let plain = [("tenant", "acme"), ("plan", "gold")];
        assert_eq!(pairs_text(plain.iter().map(|(k, v)| (*k, *v))), "tenant=acme,plan=gold");
        assert_eq!(sorted_pairs_text(plain.iter().map(|(k, v)| (*k, *v))), "plan=gold,tenant=acme");
        // Two requests that differ are written differently.
        let forged = [("tenant", "a,plan=gold")];
        let two = [("tenant", "a"), ("plan", "gold")];
        let (forged, two) =
            (pairs_text(forged.iter().map(|(k, v)| (*k, *v))), pairs_text(two.iter().map(|(k, v)| (*k, *v))));
        assert_eq!(forged, r"tenant=a\,plan\=gold");
        assert_ne!(forged, two);
        assert_eq!(pairs_text([("k\\", "=v")].iter().map(|(k, v)| (*k, *v))), r"k\\=\=v");
        assert_eq!(pairs_text(std::iter::empty::<(&str, &str)>()), "");
    }
}

#[cfg(test)]
mod overlaid_tests {
    use super::*;

    #[test]
    fn a_descriptor_the_server_sets_replaces_the_callers() {
        let sent = [("origin", "i-am-admin"), ("user", "u1")];
        let o = Overlaid { inner: &sent[..], set: Some(("origin", "app-a")) };
        assert_eq!((o.get("origin"), o.get("user"), o.count()), (Some("app-a"), Some("u1"), 2));
        assert_eq!(o.entries().collect::<Vec<_>>(), [("user", "u1"), ("origin", "app-a")]);
        let without = [("user", "u1")];
        let o = Overlaid { inner: &without[..], set: Some(("origin", "app-a")) };
        assert_eq!((o.get("origin"), o.count()), (Some("app-a"), 2));
        let o = Overlaid { inner: &sent[..], set: None };
        assert_eq!((o.get("origin"), o.count()), (Some("i-am-admin"), 2));
    }
}

/// What a call takes from each matched limit: the request's cost, except
/// from the limits whose `cost` formula reads the usage it reported.
/// Small (24 bytes) and free of allocation when no limit has a formula:
/// it travels with every decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Costs {
    base: u64,
    /// (the limit's slot in its rule, its cost), for the limits with a formula.
    each: Option<Box<[(usize, u64)]>>,
}

impl Costs {
    /// The same cost from every limit.
    pub fn same(base: u64) -> Costs {
        Costs { base, each: None }
    }

    /// `base`, except for the limits (by slot) in `each`.
    pub fn with(base: u64, each: Vec<(usize, u64)>) -> Costs {
        Costs { base, each: (!each.is_empty()).then(|| each.into_boxed_slice()) }
    }

    /// The request's own cost (what a limit without a formula takes).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The cost for the limit at `slot` of its rule.
    #[inline]
    pub fn of(&self, slot: usize) -> u64 {
        match &self.each {
            None => self.base,
            Some(each) => each.iter().find(|(s, _)| *s == slot).map_or(self.base, |(_, cost)| *cost),
        }
    }
}

/// Checks a number of units a caller sent as `field`: at most the largest
/// cost, 4294967295.
pub fn check_cost(field: &'static str, value: u64) -> Result<(), RequestError> {
    if value > u64::from(u32::MAX) {
        return Err(RequestError::CostTooLarge { field, value });
    }
    Ok(())
}

/// Checks the form of reported usage, whatever the rules: at most 32
/// fields, names as a rule's usage fields are written (lowercase letters,
/// digits and _, at most 64 bytes), values at most the largest.
pub fn check_usage_form(usage: &Usage) -> Result<(), RequestError> {
    let max = crate::rules::cost::MAX_USAGE_FIELDS;
    if usage.len() > max {
        return Err(RequestError::TooMuchUsage { count: usage.len(), max });
    }
    for (field, value) in usage {
        if !crate::rules::cost::usage_name_form(field) {
            let field = field.chars().take(64).collect();
            return Err(RequestError::BadUsageName { field });
        }
        if *value > crate::rules::cost::MAX_USAGE_VALUE {
            return Err(RequestError::UsageTooLarge { field: field.clone(), value: *value });
        }
    }
    Ok(())
}

/// Checks reported usage against `rule`'s usage fields: every name must be
/// one of them, every value at most the largest.
pub fn check_usage(rule: &crate::rules::Rule, usage: &Usage) -> Result<(), RequestError> {
    check_usage_form(usage)?;
    for field in usage.keys() {
        if !rule.usage.iter().any(|u| u == field) {
            let known = if rule.usage.is_empty() {
                "it reads no usage".to_string()
            } else {
                format!("its usage fields: {}", rule.usage.join(", "))
            };
            let field = field.chars().take(64).collect();
            return Err(RequestError::UnknownUsage { field, rule: rule.name.clone(), known });
        }
    }
    Ok(())
}

/// What `limit` costs for `usage` by its formula; `None` when it has none.
pub fn formula_cost(limit: &crate::rules::Limit, usage: &Usage) -> Option<Result<u64, RequestError>> {
    use crate::rules::CostError;
    let formula = limit.cost.as_ref()?;
    Some(formula.cost(|k| usage.get(k).copied().unwrap_or(0)).map_err(|e| match e {
        CostError::Negative(v) => RequestError::NegativeCost {
            limit: limit.name.clone(),
            value: format!("{}", (v * 1000.0).round() / 1000.0),
            formula: formula.text().to_string(),
        },
        CostError::TooLarge(v) => RequestError::UsageCostTooLarge { limit: limit.name.clone(), value: v.to_string() },
    }))
}
