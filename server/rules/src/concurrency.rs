//! The validated configuration of an adaptive concurrency limit
//! (`concurrency: { adaptive: { ... } }`) and of partitions by priority.
//! The algorithms themselves are in the top-level adaptive module.

use std::time::Duration;

use serde_yaml_ng::Value;

use super::fields::{Fields, show};
use super::systems::Priority;
pub use floodgate_core::adaptive::{
    AdaptiveConfig, AimdConfig, AlgorithmConfig, Gradient2Config, ProbeConfig, VegasConfig,
};

/// Guaranteed shares of a concurrency limit by priority, in percent
/// (`partitions: { critical: 70%, sheddable: 30% }`). A class within its
/// share is admitted even when the limit is reached; one above it only
/// while the limit has room (it borrows what the others leave idle).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Partitions {
    /// By [`Priority::index`]; 0 for a class the rule does not name.
    percent: [u8; 4],
}

impl Partitions {
    pub fn is_empty(&self) -> bool {
        self.percent.iter().all(|&p| p == 0)
    }

    pub fn percent(&self, class: Priority) -> u8 {
        self.percent[class.index()]
    }

    /// What `class` is guaranteed of `limit`: its share rounded up, at least
    /// one when it has a share; nothing for a class without one.
    pub fn guaranteed(&self, limit: u32, class: Priority) -> u32 {
        match self.percent(class) {
            0 => 0,
            p => (u64::from(limit) * u64::from(p)).div_ceil(100).max(1) as u32,
        }
    }

    pub(super) fn parse(f: &Fields<'_>) -> Option<Partitions> {
        let keys: Vec<&str> = Priority::ALL.iter().map(|p| p.key()).collect();
        f.deny_unknown(&keys);
        let mut out = Partitions::default();
        let mut ok = true;
        for class in Priority::ALL {
            let Some(v) = f.get(class.key()) else { continue };
            match percent(v) {
                Some(p) if p <= 100.0 && p.fract() == 0.0 => out.percent[class.index()] = p as u8,
                _ => {
                    f.error(class.key(), format!("must be a whole percentage from 0% to 100%, got {}", show(v)));
                    ok = false;
                }
            }
        }
        let total: u32 = out.percent.iter().map(|&p| u32::from(p)).sum();
        if ok && total > 100 {
            f.error("", format!("the shares add up to {total}%, more than 100%"));
            ok = false;
        }
        if ok && out.is_empty() {
            f.error("", "must give at least one priority a share above 0%");
            ok = false;
        }
        ok.then_some(out)
    }
}

/// `70%` or `70`.
pub(crate) fn percent(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => {
            s.trim().strip_suffix('%')?.trim().parse::<f64>().ok().filter(|p| p.is_finite() && *p >= 0.0)
        }
        Value::Number(n) => n.as_f64().filter(|p| p.is_finite() && *p >= 0.0),
        _ => None,
    }
}

/// The most an adaptive limit may be.
const MAX_LIMIT: u64 = 10_000_000;

/// Reads a `concurrency.adaptive` block.
pub(super) fn parse_adaptive(f: &Fields<'_>) -> Option<AdaptiveConfig> {
    let algorithm = f
        .required("algorithm", |f, k| f.choice(k, &[("gradient2", "gradient2"), ("vegas", "vegas"), ("aimd", "aimd")]));
    let common = ["algorithm", "min", "max", "initial", "window", "min_samples", "probe"];
    let own: &[&str] = match algorithm {
        Some("gradient2") => &["smoothing", "queue_size", "long_window", "tolerance"],
        Some("vegas") => &["smoothing", "probe_multiplier"],
        Some("aimd") => &["backoff_ratio", "timeout"],
        _ => &[],
    };
    if algorithm.is_some() {
        let known: Vec<&str> = common.iter().chain(own).copied().collect();
        f.deny_unknown(&known);
    }
    let number = |key: &str, min: u64, max: u64, default: u64| match f.has(key) {
        true => f.u64_in(key, min, max),
        false => Some(default),
    };
    let fraction = |key: &str, low_open: f64, high: f64, default: f64| match f.f64(key) {
        Some(x) if x > low_open && x <= high => Some(x),
        Some(x) => {
            f.error(key, format!("must be above {low_open} and at most {high}, got {x}"));
            None
        }
        None => (!f.has(key)).then_some(default),
    };
    let min = number("min", 1, MAX_LIMIT, 1);
    let max = number("max", 1, MAX_LIMIT, 1000);
    let initial = number("initial", 1, MAX_LIMIT, 20);
    let window = match f.has("window") {
        true => f.duration("window", Duration::from_millis(100)),
        false => Some(Duration::from_secs(1)),
    };
    let window = window.filter(|w| {
        let ok = *w <= Duration::from_secs(3600);
        if !ok {
            f.error("window", "must be at most 1h");
        }
        ok
    });
    let min_samples = number("min_samples", 1, 1_000_000, 10);
    let probe = parse_probe(f, window.unwrap_or(Duration::from_secs(1)));
    // Every field is read (and its error reported) before any is needed.
    let algorithm = match algorithm? {
        "gradient2" => {
            let smoothing = fraction("smoothing", 0.0, 1.0, 0.2);
            let queue_size = number("queue_size", 0, MAX_LIMIT, 4);
            let long_window = number("long_window", 1, 1_000_000, 600);
            let tolerance = fraction("tolerance", 0.0, 100.0, 1.0).filter(|t| {
                let ok = *t >= 1.0;
                if !ok {
                    f.error("tolerance", format!("must be at least 1, got {t}"));
                }
                ok
            });
            AlgorithmConfig::Gradient2(Gradient2Config {
                smoothing: smoothing?,
                queue_size: queue_size? as u32,
                long_window: long_window? as u32,
                tolerance: tolerance?,
            })
        }
        "vegas" => {
            let smoothing = fraction("smoothing", 0.0, 1.0, 1.0);
            let probe_multiplier = number("probe_multiplier", 1, 1_000_000, 30);
            AlgorithmConfig::Vegas(VegasConfig { smoothing: smoothing?, probe_multiplier: probe_multiplier? as u32 })
        }
        _ => {
            let backoff_ratio = fraction("backoff_ratio", 0.0, 1.0, 0.9).filter(|r| {
                let ok = (0.5..1.0).contains(r);
                if !ok {
                    f.error("backoff_ratio", format!("must be at least 0.5 and below 1, got {r}"));
                }
                ok
            });
            let timeout = match f.has("timeout") {
                true => f.duration("timeout", Duration::from_millis(1)),
                false => Some(Duration::from_secs(5)),
            };
            AlgorithmConfig::Aimd(AimdConfig { backoff_ratio: backoff_ratio?, timeout: timeout? })
        }
    };
    let (min, max, initial) = (min? as u32, max? as u32, initial? as u32);
    if min > max {
        f.error("min", format!("must be at most max ({max}), got {min}"));
        return None;
    }
    if !(min..=max).contains(&initial) {
        f.error("initial", format!("must be between min ({min}) and max ({max}), got {initial}"));
        return None;
    }
    let probe = probe?;
    if let Some(p) = probe
        && p.floor > max
    {
        // Held above the limit's ceiling, the floor would hold nothing back.
        f.error("probe.floor", format!("must be at most max ({max}), got {}", p.floor));
        return None;
    }
    Some(AdaptiveConfig { algorithm, min, max, initial, window: window?, min_samples: min_samples? as u32, probe })
}

/// `probe`: `off`, or when to measure the no-load latency and how (every
/// field optional). `Some(None)`: off; `None`: an error was reported.
fn parse_probe(f: &Fields<'_>, window: Duration) -> Option<Option<ProbeConfig>> {
    let defaults = ProbeConfig::default();
    match f.get("probe") {
        None => return Some(Some(defaults)),
        Some(v) if super::systems::is_off(v) => return Some(None),
        Some(Value::Mapping(_)) => {}
        Some(v) => {
            f.error("probe", format!("must be off or a mapping (interval, floor, samples), got {}", show(v)));
            return None;
        }
    }
    let p = f.nested("probe")?;
    p.deny_unknown(&["interval", "floor", "samples"]);
    // At most 4 windows of each interval are spent at the floor (one to
    // drain, three to measure): an interval of 20 windows keeps that to a
    // fifth of the time at most.
    let shortest = window * 20;
    let interval = match p.has("interval") {
        true => p.duration("interval", Duration::from_secs(1)).filter(|i| {
            let ok = *i >= shortest;
            if !ok {
                p.error("interval", format!("must be at least 20 windows ({shortest:?}), got {i:?}"));
            }
            ok
        }),
        false => Some(defaults.interval.max(shortest)),
    };
    let floor = match p.has("floor") {
        true => p.u64_in("floor", 1, MAX_LIMIT),
        false => Some(u64::from(defaults.floor)),
    };
    let samples = match p.has("samples") {
        true => p.u64_in("samples", 1, 1_000_000),
        false => Some(u64::from(defaults.samples)),
    };
    Some(Some(ProbeConfig { interval: interval?, floor: floor? as u32, samples: samples? as u32 }))
}
