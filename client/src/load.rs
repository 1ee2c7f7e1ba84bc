//! Reports this process's load to Floodgate (`ReportLoad`) once a second, on
//! a task of its own: its CPU and memory use as a share of what it may use,
//! a container's limits (cgroup v2 or v1) rather than the host's.
//!
//! - CPU: the process's user and system time (`/proc/self/stat`) over the
//!   wall time since the last report, divided by the cores it may use: the
//!   cgroup's CPU quota when one is set, else the CPUs it may run on.
//! - Memory: its resident set (`/proc/self/status`) over the cgroup's memory
//!   limit when one is set, else the host's memory.
//!
//! - Calls in flight and queueing delay: the guarded calls running now, and
//!   the mean time the guarded calls that started since the last report
//!   waited before they ran (the question's round trip and any shaping
//!   wait), so that callers that queue are seen even when the dependency's
//!   own latency is flat.
//!
//! Where `/proc` cannot be read (not Linux), nothing is reported, and the
//! reason is logged once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use pb::floodgate_client::FloodgateClient;
use tonic::transport::Channel;

use crate::stats::Stats;

/// `/proc`'s clock ticks per second (USER_HZ: 100 on every Linux ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// Where the process's figures are read; a test points it at files of its own.
#[derive(Clone, Debug)]
pub(crate) struct Sources {
    pub(crate) proc_self: PathBuf,
    pub(crate) cgroup_root: PathBuf,
    pub(crate) meminfo: PathBuf,
}

impl Default for Sources {
    fn default() -> Self {
        Sources {
            proc_self: PathBuf::from("/proc/self"),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            meminfo: PathBuf::from("/proc/meminfo"),
        }
    }
}

/// What the process may use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Capacity {
    pub(crate) cores: f64,
    pub(crate) memory_bytes: u64,
}

impl Sources {
    /// User plus system CPU time of the whole process, in seconds.
    pub(crate) fn cpu_seconds(&self) -> std::io::Result<f64> {
        let stat = std::fs::read_to_string(self.proc_self.join("stat"))?;
        // The command name may hold spaces and parentheses: fields start after the last ')'.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| bad("stat: no ')'"))?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).ok_or_else(|| bad("stat: short"));
        Ok((ticks(11)? + ticks(12)?) as f64 / TICKS_PER_SECOND)
    }

    /// The resident set, in bytes.
    pub(crate) fn rss_bytes(&self) -> std::io::Result<u64> {
        let status = std::fs::read_to_string(self.proc_self.join("status"))?;
        kib(&status, "VmRSS:").ok_or_else(|| bad("status: no VmRSS"))
    }

    /// The cores and memory the process may use: its cgroup's limits, else
    /// the CPUs it may run on and the host's memory.
    pub(crate) fn capacity(&self) -> Capacity {
        let online = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let groups = std::fs::read_to_string(self.proc_self.join("cgroup")).unwrap_or_default();
        let cores = self.cpu_quota(&groups).map_or(online, |q| q.min(online));
        let host = std::fs::read_to_string(&self.meminfo).ok().and_then(|m| kib(&m, "MemTotal:")).unwrap_or(u64::MAX);
        let memory_bytes = self.memory_limit(&groups).map_or(host, |l| l.min(host));
        Capacity { cores: cores.max(0.01), memory_bytes: memory_bytes.max(1) }
    }

    /// The CPU quota in cores: cgroup v2's `cpu.max`, else v1's CFS quota.
    fn cpu_quota(&self, groups: &str) -> Option<f64> {
        if let Some(dir) = self.group_dir(groups, None, "cpu.max") {
            let text = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
            let mut it = text.split_whitespace();
            let (quota, period) = (it.next()?, it.next().unwrap_or("100000"));
            return ratio(quota.parse().ok()?, period.parse().ok()?);
        }
        let dir = self.group_dir(groups, Some("cpu"), "cpu.cfs_quota_us")?;
        let quota: i64 = read_number(&dir.join("cpu.cfs_quota_us"))?;
        let period: i64 = read_number(&dir.join("cpu.cfs_period_us"))?;
        (quota > 0).then_some(())?;
        ratio(quota as f64, period as f64)
    }

    /// The memory limit in bytes: v2's `memory.max`, else v1's limit (a
    /// huge v1 value means none).
    fn memory_limit(&self, groups: &str) -> Option<u64> {
        if let Some(dir) = self.group_dir(groups, None, "memory.max") {
            return read_number(&dir.join("memory.max"));
        }
        let dir = self.group_dir(groups, Some("memory"), "memory.limit_in_bytes")?;
        let limit: u64 = read_number(&dir.join("memory.limit_in_bytes"))?;
        (limit < (1 << 60)).then_some(limit)
    }

    /// The directory of the process's cgroup holding `file`: v2 (`controller`
    /// `None`, the `0::` line) or v1's hierarchy of `controller`. Inside a
    /// container the group's own directory is often the root: that is tried
    /// after the full path.
    fn group_dir(&self, groups: &str, controller: Option<&str>, file: &str) -> Option<PathBuf> {
        let path = groups.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (id, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            match controller {
                None => (id == "0" && names.is_empty()).then_some(path),
                Some(c) => names.split(',').any(|n| n == c).then_some(path),
            }
        })?;
        let base = match controller {
            None => self.cgroup_root.clone(),
            Some(c) => {
                // v1 hierarchies are mounted per controller, sometimes joined (cpu,cpuacct).
                let names = groups.lines().find_map(|l| {
                    let names = l.split(':').nth(1)?;
                    names.split(',').any(|n| n == c).then(|| names.to_string())
                })?;
                [c.to_string(), names].into_iter().map(|n| self.cgroup_root.join(n)).find(|p| p.is_dir())?
            }
        };
        let relative = path.trim_start_matches('/');
        [base.join(relative), base].into_iter().find(|d| d.join(file).is_file())
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

fn ratio(quota: f64, period: f64) -> Option<f64> {
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// A number in a cgroup file; `max` (no limit) and anything else unreadable is `None`.
fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    // Cgroup files are small; a FIFO or a huge file here is not a cgroup file.
    let text = std::fs::read(path).ok().filter(|b| b.len() < 4096)?;
    std::str::from_utf8(&text).ok()?.trim().parse().ok()
}

/// `Key:   1234 kB` in a /proc text file, in bytes.
fn kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let n: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(n.saturating_mul(1024))
}

/// One measurement of the process's use.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    cpu_seconds: f64,
}

/// The share of `capacity` used between two samples, and the memory share now.
pub(crate) fn utilization(before: (Instant, f64), after: (Instant, f64), rss: u64, capacity: Capacity) -> (f64, f64) {
    let wall = after.0.saturating_duration_since(before.0).as_secs_f64();
    let cpu = if wall > 0.0 { (after.1 - before.1).max(0.0) / wall / capacity.cores } else { 0.0 };
    let memory = rss as f64 / capacity.memory_bytes as f64;
    (cpu.clamp(0.0, 1.0), memory.clamp(0.0, 1.0))
}

/// The reporting task's settings.
#[derive(Clone, Debug)]
pub(crate) struct LoadReport {
    pub(crate) system: String,
    pub(crate) instance: String,
    pub(crate) every: Duration,
}

/// Reports once every `every` until `closed` fires (the client was dropped).
pub(crate) async fn run(
    report: LoadReport,
    grpcs: Vec<FloodgateClient<Channel>>,
    stats: Arc<Stats>,
    mut closed: tokio::sync::watch::Receiver<()>,
) {
    let sources = Sources::default();
    let first = match sources.cpu_seconds() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this process's CPU time: no load is reported");
            return;
        }
    };
    let mut last = Sample { at: Instant::now(), cpu_seconds: first };
    let mut next = 0usize;
    let mut tick = tokio::time::interval(report.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = closed.changed() => return,
        }
        // Read on a blocking thread: /proc and /sys are files, however fast.
        let s = sources.clone();
        let read = tokio::task::spawn_blocking(move || {
            Ok::<_, std::io::Error>((s.cpu_seconds()?, s.rss_bytes()?, s.capacity()))
        });
        let Ok(Ok((cpu_seconds, rss, capacity))) = read.await else { continue };
        let now = Sample { at: Instant::now(), cpu_seconds };
        let (cpu, memory) = utilization((last.at, last.cpu_seconds), (now.at, now.cpu_seconds), rss, capacity);
        last = now;
        let req = pb::ReportLoadRequest {
            system: report.system.clone(),
            instance: report.instance.clone(),
            cpu,
            memory,
            in_flight: Some(u32::try_from(stats.in_flight()).unwrap_or(u32::MAX)),
            queue_delay: stats.take_queue_delay().and_then(|d| prost_types::Duration::try_from(d).ok()),
        };
        // One server at a time; the next after a failure.
        let mut grpc = grpcs[next % grpcs.len()].clone();
        let call = tokio::time::timeout(report.every, grpc.report_load(req));
        match call.await {
            Ok(Ok(_)) => stats.load_reported(),
            Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                tracing::warn!(error = %status.message(), "load report refused; check the system name");
                stats.load_failed();
            }
            _ => {
                next += 1;
                stats.load_failed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, path: &str, text: &str) {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn sources(dir: &Path) -> Sources {
        Sources { proc_self: dir.join("proc"), cgroup_root: dir.join("cg"), meminfo: dir.join("meminfo") }
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fg-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn cpu_time_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let d = tempdir("stat");
        write(&d, "proc/stat", "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 1000");
        assert_eq!(sources(&d).cpu_seconds().unwrap(), 3.25);
        write(&d, "proc/status", "Name: x\nVmRSS:\t  2048 kB\n");
        assert_eq!(sources(&d).rss_bytes().unwrap(), 2 * 1024 * 1024);
    }

    #[test]
    fn a_cgroup_v2_quota_and_limit_are_the_capacity() {
        let d = tempdir("v2");
        write(&d, "proc/cgroup", "0::/kubepods/pod1/app\n");
        write(&d, "cg/kubepods/pod1/app/cpu.max", "150000 100000\n");
        write(&d, "cg/kubepods/pod1/app/memory.max", "536870912\n");
        write(&d, "meminfo", "MemTotal:       16384000 kB\n");
        let c = sources(&d).capacity();
        let online = std::thread::available_parallelism().unwrap().get() as f64;
        assert_eq!(c.cores, 1.5f64.min(online));
        assert_eq!(c.memory_bytes, 536_870_912);
    }

    #[test]
    fn no_limit_means_the_host() {
        let d = tempdir("nolimit");
        // Inside a container the group's path is often "/": the root itself.
        write(&d, "proc/cgroup", "0::/\n");
        write(&d, "cg/cpu.max", "max 100000\n");
        write(&d, "cg/memory.max", "max\n");
        write(&d, "meminfo", "MemTotal:       1000 kB\n");
        let c = sources(&d).capacity();
        assert_eq!(c.cores, std::thread::available_parallelism().unwrap().get() as f64);
        assert_eq!(c.memory_bytes, 1_024_000);
    }

    #[test]
    fn cgroup_v1_hierarchies_are_found_per_controller() {
        let d = tempdir("v1");
        write(&d, "proc/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n");
        write(&d, "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "50000\n");
        write(&d, "cg/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
        write(&d, "cg/memory/docker/abc/memory.limit_in_bytes", "268435456\n");
        let c = sources(&d).capacity();
        assert_eq!(c.cores, 0.5);
        assert_eq!(c.memory_bytes, 268_435_456);
        // No quota (-1) and v1's "no limit" (a huge number).
        write(&d, "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");
        write(&d, "cg/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
        write(&d, "meminfo", "MemTotal:       1000 kB\n");
        let c = sources(&d).capacity();
        assert_eq!(c.cores, std::thread::available_parallelism().unwrap().get() as f64);
        assert_eq!(c.memory_bytes, 1_024_000);
    }

    #[test]
    fn utilization_is_a_share_of_the_capacity() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let cap = Capacity { cores: 4.0, memory_bytes: 1000 };
        // 2 CPU-seconds in 2 s on 4 cores: a quarter.
        assert_eq!(utilization((t0, 10.0), (t1, 12.0), 250, cap), (0.25, 0.25));
        assert_eq!(utilization((t0, 10.0), (t1, 100.0), 5000, cap), (1.0, 1.0), "clamped");
        assert_eq!(utilization((t0, 10.0), (t0, 11.0), 0, cap).0, 0.0, "no time passed");
    }

    #[test]
    fn this_process_can_be_measured() {
        let s = Sources::default();
        if !Path::new("/proc/self/stat").exists() {
            return; // not Linux: nothing to measure (the reporter says so and stops)
        }
        let before = s.cpu_seconds().unwrap();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(s.cpu_seconds().unwrap() > before, "300 ms of spinning shows in the process's CPU time");
        assert!(s.rss_bytes().unwrap() > 0);
        assert!(s.capacity().cores > 0.0);
    }
}
