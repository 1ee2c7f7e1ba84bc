//! A concurrency limit's view to `ConcurrencyInfo`.

use std::time::Duration;

use floodgate_proto::v1 as pb;

use super::{duration, instant};
use crate::engine::concurrency::ConcurrencyView;
use crate::rules::Priority;

fn micros(us: f64) -> Option<prost_types::Duration> {
    duration(Duration::from_secs_f64((us.max(0.0) / 1e6).min(1e9)))
}

fn priority(p: Priority) -> pb::Priority {
    match p {
        Priority::CriticalPlus => pb::Priority::CriticalPlus,
        Priority::Critical => pb::Priority::Critical,
        Priority::SheddablePlus => pb::Priority::SheddablePlus,
        Priority::Sheddable => pb::Priority::Sheddable,
    }
}

pub fn info(v: &ConcurrencyView) -> pb::ConcurrencyInfo {
    let inputs = v.inputs.unwrap_or_default();
    let partitions = match v.rule.partitions.is_empty() {
        true => Vec::new(),
        false => Priority::ALL
            .iter()
            .zip(v.partitions)
            .map(|(&p, (guaranteed, in_flight))| pb::ConcurrencyPartition {
                priority: priority(p).into(),
                percent: u32::from(v.rule.partitions.percent(p)),
                guaranteed,
                in_flight,
            })
            .collect(),
    };
    let windows = v
        .history
        .iter()
        .map(|p| pb::ConcurrencyWindow {
            closed_at: Some(instant(p.at)),
            limit: p.limit,
            samples: p.window.samples,
            mean_rtt: p.window.mean_rtt_us().and_then(micros),
            max_in_flight: p.window.max_in_flight,
            drops: p.window.drops,
        })
        .collect();
    let a = v.rule.adaptive;
    pb::ConcurrencyInfo {
        resource: v.resource.clone(),
        limit: v.limit,
        in_flight: v.in_flight,
        algorithm: a.map(|a| a.algorithm_name().to_string()).unwrap_or_default(),
        min: a.map_or(0, |a| a.min),
        max: a.map_or(v.rule.max_in_flight, |a| a.max),
        short_rtt: micros(inputs.short_rtt_us),
        long_rtt: micros(inputs.long_rtt_us),
        no_load_rtt: micros(inputs.no_load_rtt_us),
        gradient: inputs.gradient,
        queue: inputs.queue,
        partitions,
        windows,
        min_rtt: micros(inputs.min_rtt_us),
        probing: inputs.probing,
        next_probe_at: inputs.next_probe_at.map(instant),
    }
}
