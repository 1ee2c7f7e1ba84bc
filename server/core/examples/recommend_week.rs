//! The recommendation benchmark: a generated trace of many tenants, limits
//! recommended each day from the week before and enforced the next day.
//!
//! `cargo run --release -p floodgate-core --example recommend_week -- [--storm N] [--write-trace FILE]`
//!
//! `--write-trace` writes the trace as `floodgate recommend --trace` reads it.

use std::io::Write;

use floodgate_core::recommend::synthetic::{self, Shape as TraceShape};
use floodgate_core::recommend::{DAY, Settings, Shape};

fn main() {
    let mut shape = TraceShape::default();
    let mut write = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--storm" => shape.storm = value.parse().expect("--storm: calls a minute"),
            "--seed" => shape.seed = value.parse().expect("--seed: a number"),
            "--write-trace" => write = Some(value),
            _ => panic!("unknown argument {arg}"),
        }
    }
    let trace = synthetic::generate(&shape);
    println!(
        "Trace: {} tenants ({} heavy at 15x, mean {}-{} calls a minute otherwise), {} days, \
         a daily curve of 0.4-1.6 and weekends at 0.6; {} sends {} calls a minute more from day {:.1}",
        shape.tenants,
        shape.heavy,
        shape.low,
        shape.high,
        shape.days,
        trace.misbehaving,
        shape.storm,
        shape.storm_from as f64 / DAY as f64
    );
    let settings = Settings::default();
    println!(
        "Settings: quantile {}, headroom {}, at most {} down a day; each day's limits from the 7 days before",
        settings.quantile, settings.headroom, settings.max_decrease
    );
    for (name, alg) in [("token bucket", Shape::TokenBucket), ("fixed window", Shape::FixedWindow)] {
        let e = synthetic::evaluate(&trace, &settings, alg, 7, shape.days);
        println!(
            "{name}: limits a day {:?}; excess denied {:.2}% ({} of {}); well-behaved denied {:.4}% ({} of {}); \
             largest day-to-day change of any key's limit: -{:.1}% / +{:.1}%",
            e.limits,
            e.excess_denied as f64 * 100.0 / e.excess.max(1) as f64,
            e.excess_denied,
            e.excess,
            e.good_denied as f64 * 100.0 / e.good_calls.max(1) as f64,
            e.good_denied,
            e.good_calls,
            e.largest_fall * 100.0,
            e.largest_rise * 100.0,
        );
    }
    if let Some(path) = write {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).expect("creating the trace file"));
        writeln!(out, "# unix_seconds,key,calls").unwrap();
        for m in trace.start..trace.start + shape.days * DAY {
            for i in 0..shape.tenants {
                let key = synthetic::tenant(i);
                let calls = trace.history.calls(&key, m);
                if calls > 0 {
                    writeln!(out, "{},{key},{calls}", m * 60).unwrap();
                }
            }
        }
        println!("Trace written to {path}");
    }
}
