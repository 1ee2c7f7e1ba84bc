//! What a load run measured: counts, latency percentiles and histogram, status
//! codes, verdicts; as text and as ghz-style JSON.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use serde_json::{Value, json};

/// The percentiles reported, as ghz does, plus 99.9.
pub const PERCENTILES: &[f64] = &[10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];
const HISTOGRAM_BUCKETS: usize = 10;

/// What the workers collected.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    /// Latency of every completed call, in nanoseconds.
    pub latencies: Vec<u64>,
    /// Every call by gRPC status code name ("OK", "Unavailable"...).
    pub codes: BTreeMap<String, u64>,
    /// Failed calls by error message.
    pub errors: BTreeMap<String, u64>,
    /// Decisions by verdict name (a batch call makes many).
    pub verdicts: BTreeMap<String, u64>,
}

/// A finished run.
#[derive(Clone, Debug)]
pub struct Report {
    pub count: u64,
    pub total: Duration,
    pub average: Duration,
    pub fastest: Duration,
    pub slowest: Duration,
    pub rps: f64,
    pub decisions_per_second: f64,
    /// (percentage, latency).
    pub percentiles: Vec<(f64, Duration)>,
    /// (upper mark, count).
    pub histogram: Vec<(Duration, u64)>,
    pub codes: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
    pub verdicts: BTreeMap<String, u64>,
    /// Extra lines about the server (memory per key), when measured.
    pub server: Option<Value>,
}

impl Samples {
    pub fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        for (k, v) in other.codes {
            *self.codes.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        for (k, v) in other.verdicts {
            *self.verdicts.entry(k).or_default() += v;
        }
    }
}

/// The nearest-rank percentile of a sorted sample: the smallest value with at
/// least `p` percent of the sample at or below it.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    // The epsilon keeps float error from pushing an exact rank up by one
    // (0.999 * 1000 is 999.0000000000001).
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// ghz's histogram: ten buckets of equal width from fastest to slowest, each
/// counting the latencies above the previous mark and up to its own.
pub fn histogram(sorted: &[u64]) -> Vec<(u64, u64)> {
    let (Some(&fastest), Some(&slowest)) = (sorted.first(), sorted.last()) else {
        return Vec::new();
    };
    let width = (slowest - fastest) as f64 / HISTOGRAM_BUCKETS as f64;
    let mut marks: Vec<u64> = (0..HISTOGRAM_BUCKETS).map(|i| fastest + (width * i as f64) as u64).collect();
    marks.push(slowest);
    let mut counts = vec![0u64; marks.len()];
    let mut bucket = 0;
    for &latency in sorted {
        while latency > marks[bucket] {
            bucket += 1;
        }
        counts[bucket] += 1;
    }
    marks.into_iter().zip(counts).collect()
}

impl Report {
    pub fn new(mut samples: Samples, total: Duration) -> Report {
        let lat = &mut samples.latencies;
        lat.sort_unstable();
        let count = samples.codes.values().sum::<u64>();
        let secs = total.as_secs_f64().max(f64::MIN_POSITIVE);
        let ns = |n: u64| Duration::from_nanos(n);
        let average =
            if lat.is_empty() { 0 } else { (lat.iter().map(|&l| l as u128).sum::<u128>() / lat.len() as u128) as u64 };
        Report {
            count,
            total,
            average: ns(average),
            fastest: ns(lat.first().copied().unwrap_or(0)),
            slowest: ns(lat.last().copied().unwrap_or(0)),
            rps: count as f64 / secs,
            decisions_per_second: samples.verdicts.values().sum::<u64>() as f64 / secs,
            percentiles: PERCENTILES.iter().map(|&p| (p, ns(percentile(lat, p)))).collect(),
            histogram: histogram(lat).into_iter().map(|(m, c)| (ns(m), c)).collect(),
            codes: samples.codes,
            errors: samples.errors,
            verdicts: samples.verdicts,
            server: None,
        }
    }

    /// The latency at percentage `p`, if it was reported.
    pub fn latency_at(&self, p: f64) -> Option<Duration> {
        self.percentiles.iter().find(|(q, _)| *q == p).map(|&(_, d)| d)
    }

    /// The summary people read, in ghz's layout.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        let _ = writeln!(out, "\nSummary:");
        let _ = writeln!(out, "  Count:\t{}", self.count);
        let _ = writeln!(out, "  Total:\t{}", ms(self.total));
        let _ = writeln!(out, "  Slowest:\t{}", ms(self.slowest));
        let _ = writeln!(out, "  Fastest:\t{}", ms(self.fastest));
        let _ = writeln!(out, "  Average:\t{}", ms(self.average));
        let _ = writeln!(out, "  Requests/sec:\t{:.2}", self.rps);
        let _ = writeln!(out, "  Decisions/sec:\t{:.2}", self.decisions_per_second);
        let _ = writeln!(out, "\nResponse time histogram:");
        let widest = self.histogram.iter().map(|&(_, c)| c).max().unwrap_or(0).max(1);
        for &(mark, count) in &self.histogram {
            let bar = "∎".repeat((count * 40 / widest) as usize);
            let _ = writeln!(out, "  {:>9.3} [{count}]\t|{bar}", mark.as_secs_f64() * 1000.0);
        }
        let _ = writeln!(out, "\nLatency distribution:");
        for &(p, d) in &self.percentiles {
            let _ = writeln!(out, "  {p} % in {}", ms(d));
        }
        let _ = writeln!(out, "  max in {}", ms(self.slowest));
        let _ = writeln!(out, "\nStatus code distribution:");
        for (code, n) in &self.codes {
            let _ = writeln!(out, "  [{code}]\t{n} responses");
        }
        if !self.errors.is_empty() {
            let _ = writeln!(out, "\nError distribution:");
            for (e, n) in &self.errors {
                let _ = writeln!(out, "  [{n}]\t{e}");
            }
        }
        let _ = writeln!(out, "\nVerdicts:");
        for (v, n) in &self.verdicts {
            let _ = writeln!(out, "  [{v}]\t{n}");
        }
        if let Some(server) = &self.server {
            let _ = writeln!(out, "\nServer:\n  {}", server);
        }
        out
    }

    /// ghz's JSON report fields (durations in nanoseconds, histogram marks in
    /// seconds), plus `decisionsPerSecond`, `verdicts` and `server`.
    pub fn to_json(&self, date: &str, options: Value) -> Value {
        let ns = |d: Duration| d.as_nanos() as u64;
        json!({
            "date": date,
            "options": options,
            "count": self.count,
            "total": ns(self.total),
            "average": ns(self.average),
            "fastest": ns(self.fastest),
            "slowest": ns(self.slowest),
            "rps": self.rps,
            "decisionsPerSecond": self.decisions_per_second,
            "errorDistribution": self.errors,
            "statusCodeDistribution": self.codes,
            "latencyDistribution": self.percentiles.iter()
                .map(|&(p, d)| json!({ "percentage": p, "latency": ns(d) }))
                .collect::<Vec<_>>(),
            "histogram": self.histogram.iter()
                .map(|&(m, c)| json!({ "mark": m.as_secs_f64(), "count": c, "frequency": c as f64 / self.count.max(1) as f64 }))
                .collect::<Vec<_>>(),
            "verdicts": self.verdicts,
            "server": self.server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_a_known_sample() {
        let sample: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&sample, 50.0), 500);
        assert_eq!(percentile(&sample, 90.0), 900);
        assert_eq!(percentile(&sample, 99.0), 990);
        assert_eq!(percentile(&sample, 99.9), 999);
        assert_eq!(percentile(&sample, 100.0), 1000);
        assert_eq!(percentile(&sample, 0.0), 1);
        let small = [10, 20, 30, 40];
        assert_eq!(percentile(&small, 50.0), 20);
        assert_eq!(percentile(&small, 51.0), 30);
        assert_eq!(percentile(&small, 99.9), 40);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn the_histogram_spans_fastest_to_slowest_and_counts_everything() {
        let sample: Vec<u64> = (0..=100).collect();
        let h = histogram(&sample);
        assert_eq!(h.len(), 11);
        assert_eq!(h.first(), Some(&(0, 1)));
        assert_eq!(h[1], (10, 10));
        assert_eq!(h.last(), Some(&(100, 10)));
        assert_eq!(h.iter().map(|&(_, c)| c).sum::<u64>(), 101);
        assert_eq!(
            histogram(&[7, 7, 7]),
            vec![(7, 3), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0), (7, 0)]
        );
    }

    #[test]
    fn a_report_from_known_samples() {
        let mut s = Samples { latencies: (1..=100).map(|i| i * 1_000_000).collect(), ..Samples::default() };
        s.codes.insert("OK".into(), 98);
        s.codes.insert("Unavailable".into(), 2);
        s.errors.insert("Unavailable: gone".into(), 2);
        s.verdicts.insert("ALLOWED".into(), 90);
        s.verdicts.insert("RATE_LIMITED".into(), 8);
        let r = Report::new(s, Duration::from_secs(2));
        assert_eq!(r.count, 100);
        assert_eq!(r.rps, 50.0);
        assert_eq!(r.decisions_per_second, 49.0);
        assert_eq!(r.fastest, Duration::from_millis(1));
        assert_eq!(r.slowest, Duration::from_millis(100));
        assert_eq!(r.average, Duration::from_micros(50_500));
        assert_eq!(r.latency_at(50.0), Some(Duration::from_millis(50)));
        assert_eq!(r.latency_at(99.9), Some(Duration::from_millis(100)));
        let json = r.to_json("2026-11-29T00:00:00Z", json!({"rpc": "acquire"}));
        assert_eq!(json["count"], 100);
        assert_eq!(json["total"], 2_000_000_000u64);
        assert_eq!(json["latencyDistribution"][2], json!({"percentage": 50.0, "latency": 50_000_000u64}));
        assert_eq!(json["statusCodeDistribution"]["OK"], 98);
        assert_eq!(json["statusCodeDistribution"]["Unavailable"], 2);
        assert_eq!(json["errorDistribution"]["Unavailable: gone"], 2);
        assert_eq!(json["verdicts"]["RATE_LIMITED"], 8);
        let text = r.to_text();
        assert!(text.contains("Requests/sec:\t50.00"), "{text}");
        assert!(text.contains("99.9 % in 100.00 ms"), "{text}");
    }
}
