//! An adaptive concurrency limit's configuration: plain data, validated by
//! the rules crate before it reaches an algorithm.

use std::time::Duration;

/// `concurrency.adaptive`: a limit on calls in flight recomputed from the
/// latencies the callers report, every `window`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveConfig {
    pub algorithm: AlgorithmConfig,
    /// The limit never goes below this or above `max`.
    pub min: u32,
    pub max: u32,
    /// The limit before the first window closes.
    pub initial: u32,
    /// How long samples gather before the limit is recomputed.
    pub window: Duration,
    /// A window with fewer samples than this changes nothing.
    pub min_samples: u32,
    /// How the no-load latency is measured (`None`: it is not, and each
    /// algorithm estimates it from the windows as it comes).
    pub probe: Option<ProbeConfig>,
}

/// `probe`: the no-load latency, measured by holding the limit at `floor`
/// for a short time, as Envoy's adaptive concurrency filter measures its
/// minimum round trip. Every `interval` (5 minutes by default, and at
/// start), the limit drops to
/// `floor` for one window, so that the calls already queued drain; then it
/// stays there until `samples` calls came back (three windows at most), and
/// their mean latency is the no-load latency until the next measurement.
/// The times are the same for every replica (slots of `interval` on the
/// clock, each moved by up to 15% of it by a hash of the slot), so that the
/// whole fleet holds back at once and no replica's callers fill the queue
/// that another is measuring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeConfig {
    pub interval: Duration,
    pub floor: u32,
    pub samples: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig { interval: Duration::from_secs(300), floor: 3, samples: 50 }
    }
}

/// Which algorithm recomputes the limit, with its parameters (the defaults
/// are those of Netflix's concurrency-limits).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AlgorithmConfig {
    Gradient2(Gradient2Config),
    Vegas(VegasConfig),
    Aimd(AimdConfig),
}

/// Gradient2: the limit follows the ratio of the long-term to the current
/// latency, plus a little headroom for a queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gradient2Config {
    /// How much of the new estimate each window takes, in (0, 1].
    pub smoothing: f64,
    /// How far the limit may grow per window while latency holds.
    pub queue_size: u32,
    /// The long-term latency is an exponential average over this many windows.
    pub long_window: u32,
    /// How much slower than the long-term latency the current may be before
    /// the limit shrinks (1 = not at all).
    pub tolerance: f64,
}

/// Vegas: estimates the queue from the no-load latency, grows while it is
/// short and shrinks while it is long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VegasConfig {
    pub smoothing: f64,
    /// The no-load latency is measured afresh every about this many times
    /// the limit windows (jittered).
    pub probe_multiplier: u32,
}

/// AIMD: one more per window while calls succeed near the limit; times
/// `backoff_ratio` on a drop (a failure, an expired permit, or a window
/// whose mean latency passed `timeout`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AimdConfig {
    pub backoff_ratio: f64,
    pub timeout: Duration,
}

impl AdaptiveConfig {
    /// The algorithm's name as written in rules files.
    pub fn algorithm_name(&self) -> &'static str {
        match self.algorithm {
            AlgorithmConfig::Gradient2(_) => "gradient2",
            AlgorithmConfig::Vegas(_) => "vegas",
            AlgorithmConfig::Aimd(_) => "aimd",
        }
    }
}
