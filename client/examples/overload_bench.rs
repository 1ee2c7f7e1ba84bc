//! The overload experiment (adaptive concurrency; scripts/overload-bench
//! runs it): a simulated dependency with a true capacity, offered twice
//! what it can serve by four client processes that ask Floodgate before
//! each call and report its latency after, through this crate.
//!
//!     overload_bench run --floodgate target/release/floodgate --out DIR
//!
//! - The dependency (`overload_bench dependency`): `--capacity` calls served
//!   at once, `--service-ms` each, the rest queued first come first served;
//!   from `--halve-at` to `--back-at` seconds, half the capacity.
//! - A worker (`overload_bench worker`): `--rate` calls a second, open loop
//!   (paced by the millisecond, whatever the answers), `--critical` of them
//!   PRIORITY_CRITICAL and the rest PRIORITY_SHEDDABLE; a call the
//!   dependency has not answered within a second fails. Prints one line a
//!   second: what it admitted, denied and served, and its latencies.
//! - `run`: every scenario in turn, each with a fresh server (its own rules
//!   file) and dependency, both stopped by PID; Admin.GetConcurrency polled
//!   four times a second for the limit; figures to stdout and
//!   `DIR/overload.txt`, the plot to `DIR/overload.svg`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate_client::proto::v1 as pb;
use floodgate_client::{Acquire, Client, GuardError, Priority};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};

const CAPACITY: u32 = 40;
const SERVICE_MS: u64 = 20;
const WORKERS: u32 = 4;
/// Latencies are counted in buckets of this many microseconds.
const BUCKET_US: u64 = 250;
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

// === the dependency ===

async fn dependency(capacity: u32, service: Duration, halve: (u64, u64)) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let servers = Arc::new(Semaphore::new(capacity as usize));
    let start = Instant::now();
    {
        let servers = servers.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((start + Duration::from_secs(halve.0)).into()).await;
            let Ok(held) = servers.acquire_many(capacity / 2).await else { return };
            tokio::time::sleep_until((start + Duration::from_secs(halve.1)).into()).await;
            drop(held);
        });
    }
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let servers = servers.clone();
        tokio::spawn(async move {
            let (mut read, mut write) = stream.into_split();
            let (done, mut finished) = mpsc::unbounded_channel::<u64>();
            tokio::spawn(async move {
                while let Some(id) = finished.recv().await {
                    if write.write_all(&id.to_le_bytes()).await.is_err() {
                        return;
                    }
                }
            });
            let mut id = [0u8; 8];
            while read.read_exact(&mut id).await.is_ok() {
                let (servers, done, id) = (servers.clone(), done.clone(), u64::from_le_bytes(id));
                tokio::spawn(async move {
                    let Ok(_server) = servers.acquire().await else { return };
                    tokio::time::sleep(service).await;
                    let _ = done.send(id);
                });
            }
        });
    }
}

/// A few connections to the dependency, calls multiplexed over them by id.
struct Dependency {
    conns: Vec<Mutex<tokio::net::tcp::OwnedWriteHalf>>,
    waiting: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<()>>>>,
    next: AtomicU64,
}

impl Dependency {
    async fn connect(addr: &str, n: usize) -> anyhow::Result<Dependency> {
        let waiting: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<()>>>> = Arc::default();
        let mut conns = Vec::new();
        for _ in 0..n {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (mut read, write) = stream.into_split();
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let mut id = [0u8; 8];
                while read.read_exact(&mut id).await.is_ok() {
                    let tx = waiting.lock().unwrap().remove(&u64::from_le_bytes(id));
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                    }
                }
            });
            conns.push(Mutex::new(write));
        }
        Ok(Dependency { conns, waiting, next: AtomicU64::new(0) })
    }

    /// One call; an error past [`CALL_TIMEOUT`].
    async fn call(&self) -> Result<(), &'static str> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(id, tx);
        let conn = &self.conns[id as usize % self.conns.len()];
        conn.lock().await.write_all(&id.to_le_bytes()).await.map_err(|_| "write")?;
        let answered = tokio::time::timeout(CALL_TIMEOUT, rx).await;
        self.waiting.lock().unwrap().remove(&id);
        match answered {
            Ok(Ok(())) => Ok(()),
            _ => Err("timed out"),
        }
    }
}

// === a worker ===

/// One second of a worker: admitted, denied and served (answered in time)
/// by class (0 critical, 1 sheddable), and the served calls' latencies.
#[derive(Default)]
struct Second {
    admitted: [u64; 2],
    denied: [u64; 2],
    served: [u64; 2],
    failed: u64,
    latencies: HashMap<u64, u64>,
}

impl Second {
    fn line(&self, t: u64) -> String {
        let mut lat: Vec<String> = self.latencies.iter().map(|(b, n)| format!("{b}:{n}")).collect();
        lat.sort();
        let [a, d, s] = [self.admitted, self.denied, self.served];
        format!("S {t} {} {} {} {} {} {} {} {}", a[0], a[1], d[0], d[1], s[0], s[1], self.failed, lat.join(","))
    }
}

async fn worker(url: &str, dep: &str, rate: f64, critical: f64, seconds: u64) -> anyhow::Result<()> {
    // Failing closed, with time to answer: what reaches the dependency is
    // what the server admitted, even on two busy cores.
    let builder = Client::builder().endpoint(url).request_timeout(Duration::from_millis(500));
    let client = builder.fail_mode(floodgate_client::FailMode::Closed).build()?;
    let dep = Arc::new(Dependency::connect(dep, 8).await?);
    let seconds_log: Arc<std::sync::Mutex<Vec<Second>>> =
        Arc::new(std::sync::Mutex::new((0..seconds + 2).map(|_| Second::default()).collect()));
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let (mut owed, mut n) = (0.0f64, 0u64);
    let mut calls = tokio::task::JoinSet::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        owed += rate / 1000.0;
        while owed >= 1.0 {
            owed -= 1.0;
            n += 1;
            // Spread the critical calls evenly: the k-th of every 1/critical.
            let is_critical = critical > 0.0 && ((n as f64 * critical).floor() > ((n - 1) as f64 * critical).floor());
            let (class, priority) = if is_critical { (0, Priority::Critical) } else { (1, Priority::Sheddable) };
            let (client, dep, log) = (client.clone(), dep.clone(), seconds_log.clone());
            calls.spawn(async move {
                let asked = Instant::now();
                let second = asked.duration_since(started).as_secs() as usize;
                let result = client.guard(Acquire::new("db").priority(priority)).run(|| dep.call()).await;
                let latency = asked.elapsed();
                let mut log = log.lock().unwrap();
                let s = &mut log[second.min(seconds as usize)];
                match result {
                    Ok(()) => {
                        s.admitted[class] += 1;
                        s.served[class] += 1;
                        *s.latencies.entry(latency.as_micros() as u64 / BUCKET_US).or_default() += 1;
                    }
                    Err(GuardError::Denied(_)) => s.denied[class] += 1,
                    Err(_) => {
                        s.admitted[class] += 1;
                        s.failed += 1;
                    }
                }
            });
        }
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    client.flush().await;
    let log = seconds_log.lock().unwrap();
    for (t, s) in log.iter().enumerate().take(seconds as usize) {
        println!("{}", s.line(t as u64));
    }
    Ok(())
}

// === the experiment ===

struct Scenario {
    name: &'static str,
    concurrency: String,
    seconds: u64,
    critical: f64,
    halve: Option<(u64, u64)>,
}

/// What one scenario saw, per second (merged over the workers) and per
/// poll of the limit.
#[derive(Default)]
struct Seen {
    seconds: Vec<Second>,
    /// (t in s, limit, in flight on the server, short latency in ms).
    polls: Vec<(f64, u32, u32, f64)>,
}

fn parse_second(line: &str) -> Option<(u64, Second)> {
    let mut it = line.split(' ');
    (it.next()? == "S").then_some(())?;
    let mut num = || it.next()?.parse::<u64>().ok();
    let t = num()?;
    let s = Second {
        admitted: [num()?, num()?],
        denied: [num()?, num()?],
        served: [num()?, num()?],
        failed: num()?,
        latencies: HashMap::new(),
    };
    let lat = line.split(' ').nth(9).unwrap_or("");
    let mut s = s;
    for part in lat.split(',').filter(|p| !p.is_empty()) {
        let (b, n) = part.split_once(':')?;
        s.latencies.insert(b.parse().ok()?, n.parse().ok()?);
    }
    Some((t, s))
}

fn merge(into: &mut Second, s: &Second) {
    for c in 0..2 {
        into.admitted[c] += s.admitted[c];
        into.denied[c] += s.denied[c];
        into.served[c] += s.served[c];
    }
    into.failed += s.failed;
    for (b, n) in &s.latencies {
        *into.latencies.entry(*b).or_default() += n;
    }
}

/// A quantile of latencies in buckets, in ms.
fn quantile(h: &HashMap<u64, u64>, q: f64) -> f64 {
    let total: u64 = h.values().sum();
    if total == 0 {
        return f64::NAN;
    }
    let mut keys: Vec<&u64> = h.keys().collect();
    keys.sort();
    let want = (q * total as f64).ceil() as u64;
    let mut seen = 0;
    for k in keys {
        seen += h[k];
        if seen >= want {
            return (*k as f64 + 0.5) * BUCKET_US as f64 / 1000.0;
        }
    }
    f64::NAN
}

/// The lines a child writes to `out`, read on a thread of their own.
fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn spawn_lines(mut cmd: Command) -> anyhow::Result<(Child, std::sync::mpsc::Receiver<String>)> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let out = child.stdout.take().expect("piped");
    Ok((child, lines_of(out)))
}

fn first_line(rx: &std::sync::mpsc::Receiver<String>, prefix: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100))
            && let Some(rest) = line.strip_prefix(prefix)
        {
            return Ok(rest.to_string());
        }
    }
    anyhow::bail!("no line starting {prefix:?} within 30 s")
}

struct Stop(Vec<Child>);

impl Drop for Stop {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a server with `concurrency` for `db`, and the dependency.
fn start(floodgate: &str, out: &str, s: &Scenario) -> anyhow::Result<(Stop, String, String)> {
    let rules = format!("{out}/{}.yaml", s.name);
    std::fs::write(&rules, format!("resources:\n  - name: db\n    concurrency: {}\n", s.concurrency))?;
    let mut cmd = Command::new(floodgate);
    cmd.args(["serve", "--config", &rules, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]);
    // The server logs to stderr: read the address from there.
    let mut server = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let rx = lines_of(server.stderr.take().expect("piped"));
    let mut stop = Stop(vec![server]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut grpc = None;
    while grpc.is_none() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100))
            && line.contains("floodgate listening")
        {
            grpc = line.split("grpc=").nth(1).map(|r| r.split(' ').next().unwrap_or("").to_string());
        }
    }
    let grpc = grpc.ok_or_else(|| anyhow::anyhow!("the server did not start"))?;
    // Keep draining its log.
    std::thread::spawn(move || while rx.recv().is_ok() {});
    let exe = std::env::current_exe()?;
    let (halve_at, back_at) = s.halve.unwrap_or((100_000, 100_000));
    let mut dep = Command::new(&exe);
    dep.args(["dependency", "--capacity", &CAPACITY.to_string(), "--service-ms", &SERVICE_MS.to_string()]);
    dep.args(["--halve-at", &halve_at.to_string(), "--back-at", &back_at.to_string()]);
    let (child, rx) = spawn_lines(dep)?;
    stop.0.push(child);
    let dep_addr = first_line(&rx, "listening ")?;
    Ok((stop, format!("http://{grpc}"), dep_addr))
}

async fn poll_limit(url: String, until: Instant, started: Instant) -> anyhow::Result<Vec<(f64, u32, u32, f64)>> {
    let mut admin = pb::admin_client::AdminClient::connect(url).await?;
    let mut out = Vec::new();
    while Instant::now() < until {
        let req = pb::GetConcurrencyRequest { resource: "db".into() };
        if let Ok(info) = admin.get_concurrency(req).await {
            let i = info.into_inner();
            let short = i.short_rtt.map_or(0.0, |d| d.seconds as f64 * 1e3 + f64::from(d.nanos) / 1e6);
            out.push((started.elapsed().as_secs_f64(), i.limit, i.in_flight, short));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(out)
}

async fn run_scenario(floodgate: &str, out: &str, s: &Scenario) -> anyhow::Result<Seen> {
    let (_stop, url, dep) = start(floodgate, out, s)?;
    let rate = 2.0 * f64::from(CAPACITY) * 1000.0 / SERVICE_MS as f64 / f64::from(WORKERS);
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let mut w = Command::new(&exe);
        w.args(["worker", "--url", &url, "--dep", &dep, "--rate", &rate.to_string()]);
        w.args(["--critical", &s.critical.to_string(), "--seconds", &s.seconds.to_string()]);
        workers.push(spawn_lines(w)?);
    }
    let polls = poll_limit(url, started + Duration::from_secs(s.seconds), started).await?;
    let mut seen = Seen { seconds: (0..s.seconds).map(|_| Second::default()).collect(), polls };
    let mut children = Vec::new();
    for (child, rx) in workers {
        for line in rx.iter() {
            if let Some((t, sec)) = parse_second(&line)
                && let Some(into) = seen.seconds.get_mut(t as usize)
            {
                merge(into, &sec);
            }
        }
        children.push(child);
    }
    for mut c in children {
        c.wait()?;
    }
    Ok(seen)
}

/// The no-load latency: one call at a time, through a generous limit.
async fn no_load(floodgate: &str, out: &str) -> anyhow::Result<f64> {
    let s = Scenario {
        name: "no-load",
        concurrency: "{ max_in_flight: 1000 }".into(),
        seconds: 0,
        critical: 0.0,
        halve: None,
    };
    let (_stop, url, dep) = start(floodgate, out, &s)?;
    let client = Client::builder().endpoint(&url).build()?;
    let dep = Dependency::connect(&dep, 1).await?;
    let mut h = HashMap::new();
    for _ in 0..200 {
        let asked = Instant::now();
        client.guard(Acquire::new("db")).run(|| dep.call()).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        *h.entry(asked.elapsed().as_micros() as u64 / BUCKET_US).or_insert(0u64) += 1;
    }
    Ok(quantile(&h, 0.5))
}

struct Figures {
    text: String,
    ok: bool,
}

fn within(limit: u32, c: f64) -> bool {
    (f64::from(limit) - c).abs() <= 0.25 * c
}

/// The first time from which every poll up to `until` is within 25% of `c`.
fn settled_at(polls: &[(f64, u32, u32, f64)], from: f64, until: f64, c: f64) -> Option<f64> {
    let span: Vec<_> = polls.iter().filter(|p| p.0 >= from && p.0 < until).collect();
    let last_out = span.iter().rposition(|p| !within(p.1, c));
    match last_out {
        None => span.first().map(|p| p.0 - from),
        Some(i) if i + 1 < span.len() => Some(span[i + 1].0 - from),
        Some(_) => None,
    }
}

fn figures(s: &Scenario, seen: &Seen, no_load_ms: f64) -> Figures {
    let c = f64::from(CAPACITY);
    let capacity_rate = c * 1000.0 / SERVICE_MS as f64;
    let mut all = Second::default();
    for sec in &seen.seconds {
        merge(&mut all, sec);
    }
    let (p50, p99) = (quantile(&all.latencies, 0.5), quantile(&all.latencies, 0.99));
    let steady = 30.min(s.seconds.saturating_sub(5)) as usize;
    let tail: Vec<&Second> = seen.seconds[steady..].iter().collect();
    let goodput = tail.iter().map(|x| (x.served[0] + x.served[1]) as f64).sum::<f64>() / tail.len().max(1) as f64;
    let mut text = format!(
        "{}: p50 {p50:.1} ms, p99 {p99:.1} ms (no-load {no_load_ms:.1} ms, p99 {:.1}x); goodput from {steady} s {goodput:.0}/s = {:.1}% of C ({capacity_rate:.0}/s); failed {}",
        s.name,
        p99 / no_load_ms,
        100.0 * goodput / capacity_rate,
        all.failed
    );
    let limits: Vec<u32> = seen.polls.iter().map(|p| p.1).collect();
    let (lo, hi) = (limits.iter().min().copied().unwrap_or(0), limits.iter().max().copied().unwrap_or(0));
    text += &format!("; limit {lo}..{hi}");
    let mut ok = true;
    match s.name {
        "static" => {
            let first: Vec<&Second> = seen.seconds.iter().take(5).collect();
            let mut early = Second::default();
            first.iter().for_each(|x| merge(&mut early, x));
            let mut late = Second::default();
            tail.iter().for_each(|x| merge(&mut late, x));
            text += &format!(
                "; p99 in the first 5 s {:.1} ms, from {steady} s {:.1} ms",
                quantile(&early.latencies, 0.99),
                quantile(&late.latencies, 0.99)
            );
        }
        "halving" => {
            let (h, b) = s.halve.unwrap_or((0, 0));
            let (h, b) = (h as f64, b as f64);
            let down = settled_at(&seen.polls, h, b, c / 2.0);
            let up = settled_at(&seen.polls, b, s.seconds as f64, c);
            text += &format!(
                "; C halved at {h} s: within 25% of {} after {}; back at {b} s: within 25% of {c} after {}",
                c / 2.0,
                down.map_or("never".into(), |d| format!("{d:.1} s")),
                up.map_or("never".into(), |d| format!("{d:.1} s"))
            );
            ok &= down.is_some_and(|d| d <= 10.0) && up.is_some_and(|d| d <= 10.0);
            // Goodput against the capacity in force, once the limit had 10 s.
            let phase = |from: u64, to: u64| {
                let span =
                    &seen.seconds[(from as usize).min(seen.seconds.len())..(to as usize).min(seen.seconds.len())];
                span.iter().map(|x| (x.served[0] + x.served[1]) as f64).sum::<f64>() / span.len().max(1) as f64
            };
            let (hh, bb) = s.halve.unwrap_or((0, 0));
            let halved = phase(hh + 10, bb);
            let back = phase(bb + 10, s.seconds);
            text += &format!(
                "; goodput while halved {halved:.0}/s = {:.1}% of C/2, after {back:.0}/s = {:.1}% of C",
                200.0 * halved / capacity_rate,
                100.0 * back / capacity_rate
            );
        }
        name if name.starts_with("overloaded-") => {
            // Within 30 s of the start: p90 at most 2.5x no-load, goodput
            // at least 80% of C. The share of polls at the floor (min 5)
            // is the time spent measuring, the one at start included.
            let mut late = Second::default();
            tail.iter().for_each(|x| merge(&mut late, x));
            let p90 = quantile(&late.latencies, 0.9);
            let floor = seen.polls.iter().filter(|p| p.1 <= 5).count() as f64 / seen.polls.len().max(1) as f64;
            text += &format!(
                "; from {steady} s p90 {p90:.1} ms ({:.1}x no-load); at the floor {:.1}% of the run",
                p90 / no_load_ms,
                100.0 * floor
            );
            ok &= p90 <= 2.5 * no_load_ms && goodput >= 0.8 * capacity_rate;
        }
        _ => {
            let settled = settled_at(&seen.polls, 0.0, s.seconds as f64, c);
            text += &format!("; within 25% of C from {}", settled.map_or("never".into(), |d| format!("{d:.1} s")));
            ok &= settled.is_some_and(|d| d <= 30.0) && p99 < 3.0 * no_load_ms && goodput >= 0.9 * capacity_rate;
            if s.critical > 0.0 {
                // Once the limit has settled (the shares are of the limit:
                // while it ramps up from `initial`, 70% of it may be less
                // than the critical calls need), and over the whole run.
                let mut settled = Second::default();
                tail.iter().for_each(|x| merge(&mut settled, x));
                let served = |x: &Second| x.served[0] as f64 / (x.admitted[0] + x.denied[0]).max(1) as f64;
                let shed = |x: &Second| x.denied[1] as f64 / (x.admitted[1] + x.denied[1]).max(1) as f64;
                text += &format!(
                    "; critical served from {steady} s {:.2}% ({} of {}), over the run {:.2}%; sheddable shed from {steady} s {:.1}%",
                    100.0 * served(&settled),
                    settled.served[0],
                    settled.admitted[0] + settled.denied[0],
                    100.0 * served(&all),
                    100.0 * shed(&settled)
                );
                ok &= served(&settled) >= 0.99 && shed(&settled) > 0.3;
            }
        }
    }
    text += if ok {
        " [met]"
    } else if s.name == "static" {
        ""
    } else {
        " [NOT met]"
    };
    Figures { text, ok: ok || s.name == "static" }
}

// === the plot ===

fn polyline(
    points: &[(f64, f64)],
    (x0, y0, w, h): (f64, f64, f64, f64),
    (xmax, ymax): (f64, f64),
    color: &str,
) -> String {
    let pts: Vec<String> = points
        .iter()
        .filter(|p| p.1.is_finite())
        .map(|&(x, y)| format!("{:.1},{:.1}", x0 + w * (x / xmax).min(1.0), y0 + h - h * (y / ymax).clamp(0.0, 1.0)))
        .collect();
    format!("<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{}'/>", pts.join(" "))
}

/// A line to draw: its label, its colour, its points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

fn panel(svg: &mut String, at: (f64, f64, f64, f64), title: &str, (xmax, ymax): (f64, f64), series: &[Series]) {
    let (x0, y0, w, h) = at;
    svg.push_str(&format!("<rect x='{x0}' y='{y0}' width='{w}' height='{h}' fill='none' stroke='#999'/>"));
    svg.push_str(&format!(
        "<text x='{x0}' y='{}' font-size='11'>{title} (0 to {ymax:.0}; {xmax:.0} s)</text>",
        y0 - 4.0
    ));
    for (i, (label, color, pts)) in series.iter().enumerate() {
        svg.push_str(&polyline(pts, at, (xmax, ymax), color));
        let lx = x0 + 6.0 + 90.0 * i as f64;
        svg.push_str(&format!("<text x='{lx}' y='{}' font-size='10' fill='{color}'>{label}</text>", y0 + 12.0));
    }
}

fn plot(runs: &[(&Scenario, &Seen)]) -> String {
    let (w, h, gap) = (300.0, 120.0, 40.0);
    let height = 30.0 + runs.len() as f64 * (h + gap);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{height}' font-family='sans-serif'>",
        3.0 * (w + 30.0) + 30.0
    );
    svg.push_str("<rect width='100%' height='100%' fill='white'/>");
    let c = f64::from(CAPACITY);
    let rate = c * 1000.0 / SERVICE_MS as f64;
    for (row, (s, seen)) in runs.iter().enumerate() {
        let y = 30.0 + row as f64 * (h + gap);
        let xmax = s.seconds as f64;
        let limit: Vec<(f64, f64)> = seen.polls.iter().map(|p| (p.0, f64::from(p.1))).collect();
        let in_flight: Vec<(f64, f64)> = seen.polls.iter().map(|p| (p.0, f64::from(p.2))).collect();
        let cap: Vec<(f64, f64)> = (0..=s.seconds)
            .map(|t| {
                let halved = s.halve.is_some_and(|(a, b)| (a..b).contains(&t));
                (t as f64, if halved { c / 2.0 } else { c })
            })
            .collect();
        let top = match s.name {
            "static" => 550.0,
            name if name.starts_with("overloaded-") => 4.5 * c,
            _ => 2.0 * c,
        };
        panel(
            &mut svg,
            (30.0, y, w, h),
            &format!("{}: limit, in flight, C", s.name),
            (xmax, top),
            &[("limit", "#c00", limit), ("in flight", "#06c", in_flight), ("C", "#999", cap)],
        );
        let at = |t: usize| t as f64 + 0.5;
        let p50: Vec<(f64, f64)> =
            seen.seconds.iter().enumerate().map(|(t, x)| (at(t), quantile(&x.latencies, 0.5))).collect();
        let p99: Vec<(f64, f64)> =
            seen.seconds.iter().enumerate().map(|(t, x)| (at(t), quantile(&x.latencies, 0.99))).collect();
        let lat_top = if s.name == "static" { 400.0 } else { 100.0 };
        panel(
            &mut svg,
            (60.0 + w, y, w, h),
            "latency p50, p99 (ms)",
            (xmax, lat_top),
            &[("p50", "#06c", p50), ("p99", "#c00", p99)],
        );
        let good: Vec<(f64, f64)> =
            seen.seconds.iter().enumerate().map(|(t, x)| (at(t), (x.served[0] + x.served[1]) as f64)).collect();
        let critical: Vec<(f64, f64)> =
            seen.seconds.iter().enumerate().map(|(t, x)| (at(t), x.served[0] as f64)).collect();
        let mut series = vec![("goodput/s", "#080", good), ("capacity", "#999", vec![(0.0, rate), (xmax, rate)])];
        if s.critical > 0.0 {
            series.push(("critical/s", "#c60", critical));
        }
        panel(&mut svg, (90.0 + 2.0 * w, y, w, h), "goodput (calls/s)", (xmax, 1.5 * rate), &series);
    }
    svg.push_str("</svg>\n");
    svg
}

fn scenarios() -> Vec<Scenario> {
    let adaptive = |algorithm: &str, extra: &str| {
        format!("{{ adaptive: {{ algorithm: {algorithm}, min: 5, max: 1000, initial: 20{extra} }}, permit_ttl: 30s")
    };
    vec![
        Scenario {
            name: "static",
            concurrency: "{ max_in_flight: 500, permit_ttl: 30s }".into(),
            seconds: 30,
            critical: 0.0,
            halve: None,
        },
        Scenario {
            name: "gradient2",
            concurrency: adaptive("gradient2", "") + " }",
            seconds: 45,
            critical: 0.0,
            halve: None,
        },
        Scenario { name: "vegas", concurrency: adaptive("vegas", "") + " }", seconds: 45, critical: 0.0, halve: None },
        // AIMD backs off past its timeout: 1.05x the no-load latency (set at run time), so that its sawtooth (0.9x on each backoff) peaks within a quarter of C.
        Scenario { name: "aimd", concurrency: String::new(), seconds: 45, critical: 0.0, halve: None },
        Scenario {
            name: "priority",
            concurrency: adaptive("gradient2", "") + ", partitions: { critical: 70%, sheddable: 30% } }",
            seconds: 45,
            critical: 0.2,
            halve: None,
        },
        // Started overloaded: the limit starts at four times C, with the
        // callers there from the first second, so that every window queues
        // until the limit has measured the no-load latency. Each algorithm
        // with its defaults (AIMD's timeout too: it backs off past twice
        // the measured latency).
        overloaded("overloaded-gradient2", "gradient2"),
        overloaded("overloaded-vegas", "vegas"),
        overloaded("overloaded-aimd", "aimd"),
        Scenario {
            name: "halving",
            // Half a second a window, and less headroom (queue_size 2): at
            // C / 2 = 20 the default headroom of 4 is a fifth of C.
            concurrency: adaptive("gradient2", ", window: 500ms, queue_size: 2") + " }",
            seconds: 80,
            critical: 0.0,
            halve: Some((40, 60)),
        },
    ]
}

fn overloaded(name: &'static str, algorithm: &str) -> Scenario {
    let initial = 4 * CAPACITY;
    Scenario {
        name,
        concurrency: format!(
            "{{ adaptive: {{ algorithm: {algorithm}, min: 5, max: 1000, initial: {initial} }}, permit_ttl: 30s }}"
        ),
        seconds: 45,
        critical: 0.0,
        halve: None,
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

async fn run(args: &[String]) -> anyhow::Result<()> {
    let floodgate = arg(args, "--floodgate").unwrap_or_else(|| "target/release/floodgate".into());
    let out = arg(args, "--out").unwrap_or_else(|| "target/overload".into());
    let only = arg(args, "--scenario");
    std::fs::create_dir_all(&out)?;
    let no_load_ms = no_load(&floodgate, &out).await?;
    println!("no-load latency (Acquire, the call, one at a time): p50 {no_load_ms:.2} ms");
    let mut list = scenarios();
    for s in &mut list {
        if s.name == "aimd" {
            let timeout = (no_load_ms * 1.05 * 1000.0).round() as u64;
            s.concurrency = format!(
                "{{ adaptive: {{ algorithm: aimd, min: 5, max: 1000, initial: 20, timeout: {timeout}us }}, permit_ttl: 30s }}"
            );
        }
    }
    // `--scenario overloaded` runs overloaded-gradient2, -vegas and -aimd.
    list.retain(|s| only.as_deref().is_none_or(|o| o == s.name || s.name.starts_with(&format!("{o}-"))));
    let mut seen = Vec::new();
    let mut report = format!(
        "overload: C = {CAPACITY} at once, {SERVICE_MS} ms a call ({} calls/s), offered 2x by {WORKERS} processes; no-load p50 {no_load_ms:.2} ms\n",
        CAPACITY as u64 * 1000 / SERVICE_MS
    );
    let mut all_ok = true;
    for s in &list {
        println!("{}: {}", s.name, s.concurrency);
        let got = run_scenario(&floodgate, &out, s).await?;
        let f = figures(s, &got, no_load_ms);
        println!("{}", f.text);
        report += &format!("{}\n", f.text);
        all_ok &= f.ok;
        seen.push(got);
    }
    let runs: Vec<(&Scenario, &Seen)> = list.iter().zip(seen.iter()).collect();
    std::fs::write(format!("{out}/overload.svg"), plot(&runs))?;
    std::fs::write(format!("{out}/overload.txt"), &report)?;
    println!("plot: {out}/overload.svg, figures: {out}/overload.txt");
    println!("{}", if all_ok { "every target met" } else { "SOME TARGETS NOT MET" });
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let num = |name: &str, default: f64| arg(&args, name).and_then(|v| v.parse::<f64>().ok()).unwrap_or(default);
    match args.get(1).map(String::as_str) {
        Some("dependency") => {
            let capacity = num("--capacity", f64::from(CAPACITY)) as u32;
            let service = Duration::from_millis(num("--service-ms", SERVICE_MS as f64) as u64);
            let halve = (num("--halve-at", 1e9) as u64, num("--back-at", 1e9) as u64);
            dependency(capacity, service, halve).await
        }
        Some("worker") => {
            let (url, dep) = (arg(&args, "--url").unwrap_or_default(), arg(&args, "--dep").unwrap_or_default());
            worker(&url, &dep, num("--rate", 1000.0), num("--critical", 0.0), num("--seconds", 30.0) as u64).await
        }
        _ => run(&args).await,
    }
}
