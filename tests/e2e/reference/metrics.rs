//! docs/src/reference/metrics.md: every Prometheus metric the server
//! exports, with its type, help text and labels.
//!
//! Where each part comes from:
//! - names, types, units and help: the server's own registration,
//!   `floodgate_engine::metrics::describe`, run here against a recorder
//!   that keeps what it is told; and the families the server renders
//!   itself at scrape time (envoyproxy/ratelimit's per-descriptor stats and
//!   `floodgate_envoy_config_info`), rendered here for real;
//! - labels: every place in server/ that records a metric
//!   (`counter!(NAME, "label" => value)`, and `gauge!` and `histogram!`),
//!   read from the source. A place that records a metric which is not
//!   described, or whose name or labels cannot be read, fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use super::{cell, check_page, header};
use crate::support;

const PAGE: &str = "docs/src/reference/metrics.md";

#[test]
fn metrics_reference_is_up_to_date() {
    check_page(PAGE, &render(&families()));
}

/// One metric family as Prometheus shows it.
#[derive(Debug, Default, Clone)]
struct Family {
    kind: &'static str,
    unit: Option<&'static str>,
    help: String,
    labels: BTreeSet<String>,
}

/// A recorder that keeps what `describe` tells it (and the labels of any
/// series registered on the way).
#[derive(Default)]
struct Described(Arc<Mutex<BTreeMap<String, Family>>>);

impl Described {
    fn describe(&self, kind: &'static str, name: KeyName, unit: Option<Unit>, help: SharedString) {
        let mut all = self.0.lock().unwrap();
        let family = all.entry(name.as_str().to_string()).or_default();
        family.kind = kind;
        family.unit = unit.map(|u| u.as_str());
        family.help = help.to_string();
    }

    fn register(&self, key: &Key) {
        let mut all = self.0.lock().unwrap();
        let family = all.entry(key.name().to_string()).or_default();
        family.labels.extend(key.labels().map(|l| l.key().to_string()));
    }
}

impl Recorder for Described {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("counter", name, unit, help);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("gauge", name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        self.describe("histogram", name, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.register(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.register(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.register(key);
        Histogram::noop()
    }
}

/// Every family the server exports, by name.
fn families() -> BTreeMap<String, Family> {
    let described = Described::default();
    metrics::with_local_recorder(&described, floodgate_engine::metrics::describe);
    let mut all = described.0.lock().unwrap().clone();
    for (name, family) in &all {
        assert!(!family.kind.is_empty(), "{name} has a series but was never described");
    }

    // The families the server writes into the scrape itself, rendered with
    // one series each and read back from Prometheus's text format.
    let mut text = String::new();
    let stats = floodgate_engine::metrics::upstream::Registry::new(10);
    stats.configured("domain.key1.key2").record(10, 0, 1, false, 0.8);
    stats.render(&mut text);
    floodgate_engine::metrics::render_envoy_config_info("source", "version", &mut text);
    for (name, family) in read_text_format(&text) {
        assert!(all.insert(name.clone(), family).is_none(), "{name} is both described and rendered by hand");
    }

    // The labels: what each place that records a metric gives it.
    let sites = recording_sites();
    let mut unknown = Vec::new();
    for site in sites {
        for name in &site.names {
            match all.get_mut(name) {
                Some(family) => family.labels.extend(site.labels.iter().cloned()),
                None => unknown.push(format!("{name} at {}", site.place)),
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics recorded but not described in server/engine/src/metrics.rs `describe` \
         (so missing from {PAGE}): {unknown:?}"
    );
    all
}

/// The families of a text in Prometheus's exposition format: `# HELP` and
/// `# TYPE` lines, and the label names of their series.
fn read_text_format(text: &str) -> BTreeMap<String, Family> {
    let mut all: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            all.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            all.entry(name.to_string()).or_default().kind = match kind {
                "counter" => "counter",
                "gauge" => "gauge",
                "histogram" => "histogram",
                other => panic!("{name}: unexpected type {other}"),
            };
        } else if let Some((name, labels)) = line.split_once('{') {
            let family = all.get_mut(name).unwrap_or_else(|| panic!("series of {name} before its # TYPE line"));
            let labels = labels.rsplit_once('}').map_or("", |(l, _)| l);
            // Label values in these renders are plain words (no `,` or `"`).
            family.labels.extend(labels.split(',').filter_map(|l| l.split_once('=')).map(|(k, _)| k.to_string()));
        }
    }
    all
}

/// A place in the server's source that records a metric.
struct Site {
    place: String,
    names: Vec<String>,
    labels: Vec<String>,
}

/// Every `counter!(`, `gauge!(` and `histogram!(` in server/*/src, outside
/// `#[cfg(test)]` modules, with the metric names its first argument can be
/// and the label names it gives.
fn recording_sites() -> Vec<Site> {
    let consts = metric_constants();
    let mut sites = Vec::new();
    let mut problems = Vec::new();
    for file in rust_files(&support::repo_path("server")) {
        let source = std::fs::read_to_string(&file).unwrap();
        // Unit tests sit at the end of a file, after `#[cfg(test)]`.
        let source = match source.find("#[cfg(test)]\nmod tests") {
            Some(at) => &source[..at],
            None => &source[..],
        };
        let relative = file.strip_prefix(support::repo_path("")).unwrap_or(&file).display().to_string();
        for macro_name in ["counter!(", "gauge!(", "histogram!("] {
            for (at, _) in source.match_indices(macro_name) {
                if source[..at].ends_with("describe_") {
                    continue;
                }
                let line = source[..at].lines().count().max(1);
                let place = format!("{relative}:{line}");
                let args = arguments(&source[at + macro_name.len()..]);
                let Some((name, labels)) = args.split_first() else {
                    problems.push(format!("{place}: no arguments"));
                    continue;
                };
                let names: Vec<String> = identifiers(name).filter_map(|id| consts.get(id).cloned()).collect();
                if names.is_empty() {
                    problems.push(format!("{place}: the metric name `{name}` is not a constant of the metrics module"));
                    continue;
                }
                let mut keys = Vec::new();
                for label in labels {
                    match label.split_once("=>").map(|(k, _)| k.trim()) {
                        Some(k) if k.len() > 2 && k.starts_with('"') && k.ends_with('"') => {
                            keys.push(k[1..k.len() - 1].to_string())
                        }
                        _ => {
                            problems.push(format!("{place}: cannot read the label `{label}` (write \"name\" => value)"))
                        }
                    }
                }
                sites.push(Site { place, names, labels: keys });
            }
        }
    }
    assert!(problems.is_empty(), "places that record a metric this page cannot read: {problems:#?}");
    assert!(sites.len() > 30, "found only {} places that record a metric: is the scan broken?", sites.len());
    sites
}

/// The metric name constants (`const NAME: &str = "floodgate_...";`) of the
/// engine's metrics module, by constant name.
fn metric_constants() -> BTreeMap<String, String> {
    let mut consts = BTreeMap::new();
    for path in ["server/engine/src/metrics.rs", "server/engine/src/metrics/upstream.rs"] {
        let source = std::fs::read_to_string(support::repo_path(path)).unwrap();
        for line in source.lines() {
            let Some(rest) = line.split_once("const ").map(|(_, r)| r) else { continue };
            let Some((ident, value)) = rest.split_once(": &str = \"") else { continue };
            let Some(value) = value.strip_suffix("\";") else { continue };
            consts.insert(ident.trim().to_string(), value.to_string());
        }
    }
    assert!(consts.len() > 40, "read only {} metric names from the engine's metrics module", consts.len());
    consts
}

/// The top-level arguments of a macro call, from just after its `(` to the
/// matching `)`, split at commas outside brackets and strings.
fn arguments(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut depth = 0;
    let mut in_string = false;
    let mut current = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_string => {
                current.push(c);
                current.extend(chars.next());
                continue;
            }
            '"' => in_string = !in_string,
            '(' | '[' | '{' if !in_string => depth += 1,
            ')' | ']' | '}' if !in_string && depth == 0 => break,
            ')' | ']' | '}' if !in_string => depth -= 1,
            ',' if !in_string && depth == 0 => {
                args.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    let last = current.trim();
    if !last.is_empty() {
        args.push(last.to_string());
    }
    args
}

/// The Rust identifiers in an expression (`crate::metrics::KEYS` gives
/// `crate`, `metrics` and `KEYS`).
fn identifiers(expression: &str) -> impl Iterator<Item = &str> {
    expression.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|s| !s.is_empty())
}

fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "tests" || n == "benches") {
                continue;
            }
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn render(families: &BTreeMap<String, Family>) -> String {
    let mut out = header(
        "the metric registrations in server/engine/src/metrics.rs and the places in server/ that \
         record metrics (tests/e2e/reference/metrics.rs)",
    );
    out.push_str("# Metrics\n\n");
    out.push_str(
        "The server exports these metrics in Prometheus's text format on its HTTP port, at \
         `/metrics` (`floodgate serve --http-listen`, 127.0.0.1:8080 by default). \
         [Observe Floodgate](../how-to/observability.md) explains how to use them.\n\n",
    );
    out.push_str(
        "A histogram is exported as the series `NAME_bucket` (with the label `le`), `NAME_sum` \
         and `NAME_count`. A series appears once it has a value: a metric of a feature you do \
         not use may be absent.\n\n",
    );
    let groups = [
        ("Floodgate's metrics", "floodgate_", ""),
        (
            "envoyproxy/ratelimit's metrics",
            "ratelimit_service_",
            "Floodgate also exports the metrics of envoyproxy/ratelimit, under the names that \
             its statsd_exporter mapping gives them, so that dashboards and alerts built for it \
             keep working. See [Move from envoyproxy/ratelimit](../how-to/from-envoy-ratelimit.md).\n\n",
        ),
    ];
    for (title, prefix, intro) in groups {
        out.push_str(&format!("## {title}\n\n{intro}"));
        out.push_str("| metric | type | labels | description |\n|---|---|---|---|\n");
        for (name, family) in families.iter().filter(|(n, _)| n.starts_with(prefix)) {
            let kind = match family.unit {
                Some(unit) => format!("{} ({unit})", family.kind),
                None => family.kind.to_string(),
            };
            let labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
            let labels = if labels.is_empty() { "none".to_string() } else { labels.join(", ") };
            out.push_str(&format!("| `{name}` | {kind} | {labels} | {} |\n", cell(&family.help)));
        }
        out.push('\n');
    }
    let other: Vec<_> =
        families.keys().filter(|n| !groups.iter().any(|(_, prefix, _)| n.starts_with(prefix))).collect();
    assert!(other.is_empty(), "metrics with neither prefix (add a group to the page): {other:?}");
    out
}

#[test]
fn the_source_scan_reads_arguments() {
    assert_eq!(
        arguments("A, \"k\" => f(x, y), \"l\" => \"a,b\").increment(1)"),
        ["A", "\"k\" => f(x, y)", "\"l\" => \"a,b\""]
    );
    assert_eq!(identifiers("if ok { up::A } else { B }").collect::<Vec<_>>(), ["if", "ok", "up", "A", "else", "B"]);
}
