//! Degradation levels per system through the real binary: instances report
//! their load with ReportLoad (a test driver playing three instances), the
//! system's level follows the thresholds with hysteresis and a dwell, its
//! requests are shed by priority, and other systems are left alone.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate_proto::v1 as pb;
use pb::watch_event::Event as Kind;
use support::*;

const RULES: &str = r#"
resources:
  - name: payments.charge
    limits: [ { name: all, algorithm: token_bucket, capacity: 100000, refill_per_second: 100000 } ]
systems:
  - name: payments
    resources: ["payments.*"]
    min_time_at_level: 1s
    load: { instance_timeout: 3s }
  - name: search
    resources: ["search.*"]
  - name: mean
    resources: [mean]
  - name: busiest
    resources: [busiest]
    load: { aggregate: max, instance_timeout: 2s }
  - name: half
    resources: [half]
    load: { aggregate: share, share: 0.5 }
  - name: third
    resources: [third]
    load: { aggregate: share, share: 0.3 }
  - name: small
    resources: [small]
    load: { max_instances: 50, instance_timeout: 1h }
"#;

fn load(system: &str, instance: &str, cpu: f64) -> pb::ReportLoadRequest {
    pb::ReportLoadRequest { system: system.into(), instance: instance.into(), cpu, memory: 0.2, ..Default::default() }
}

/// Every system's level and signals, from a fresh Watch snapshot.
async fn systems(fg: &Floodgate) -> HashMap<String, pb::SystemLevel> {
    let mut watch = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    match watch.message().await.unwrap().unwrap().event {
        Some(Kind::Snapshot(s)) => s.systems.into_iter().map(|l| (l.system.clone(), l)).collect(),
        other => panic!("a snapshot first, got {other:?}"),
    }
}

async fn level(fg: &Floodgate, system: &str) -> u32 {
    systems(fg).await[system].level
}

async fn verdict(
    c: &mut pb::floodgate_client::FloodgateClient<tonic::transport::Channel>,
    resource: &str,
    p: pb::Priority,
) -> (pb::Verdict, u32) {
    let r =
        c.acquire(pb::AcquireRequest { priority: p as i32, ..acquire(resource, &[], 1) }).await.unwrap().into_inner();
    (r.verdict(), r.degradation_level)
}

/// Three simulated instances of `payments`, each reporting `cpu` every 200 ms
/// until dropped.
struct Instances {
    cpu: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Instances {
    async fn start(fg: &Floodgate, cpu: f64) -> Instances {
        let cpu = Arc::new(Mutex::new(cpu));
        let (shared, mut c) = (cpu.clone(), fg.client().await);
        let task = tokio::spawn(async move {
            loop {
                let now = *shared.lock().unwrap();
                for i in 0..3 {
                    c.report_load(load("payments", &format!("pod-{i}"), now)).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Instances { cpu, task }
    }

    fn set(&self, cpu: f64) {
        *self.cpu.lock().unwrap() = cpu;
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `system` is at `want`, or panics naming what it is.
async fn reaches(fg: &Floodgate, system: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = systems(fg).await.remove(system).unwrap();
        if s.level == want {
            return;
        }
        assert!(Instant::now() < deadline, "{system} never reached level {want}: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `system` stays at `want` for `span` (checked every 100 ms).
async fn stays(fg: &Floodgate, system: &str, want: u32, span: Duration) {
    let end = Instant::now() + span;
    while Instant::now() < end {
        assert_eq!(level(fg, system).await, want, "{system} left level {want} early");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_moves_a_system_level_by_level_sheds_by_priority_and_leaves_other_systems_alone() {
    use pb::Priority::{Critical, CriticalPlus, Sheddable, SheddablePlus};
    use pb::Verdict::{Allowed, Shed};
    let fg = floodgate().rules(RULES).start();
    let mut watch = fg.client().await.watch(pb::WatchRequest::default()).await.unwrap().into_inner();
    watch.message().await.unwrap();
    let mut c = fg.client().await;
    let all = |c: &mut pb::floodgate_client::FloodgateClient<_>| {
        let mut c = c.clone();
        async move {
            let mut out = Vec::new();
            for p in [CriticalPlus, Critical, SheddablePlus, Sheddable] {
                out.push(verdict(&mut c, "payments.charge", p).await.0);
            }
            out
        }
    };
    assert_eq!(all(&mut c).await, [Allowed; 4]);

    let pods = Instances::start(&fg, 0.65).await;
    reaches(&fg, "payments", 1).await;
    assert_eq!(all(&mut c).await, [Allowed, Allowed, Allowed, Shed], "level 1 sheds SHEDDABLE");
    assert_eq!(verdict(&mut c, "payments.charge", Sheddable).await.1, 1, "the answer carries the system's level");
    pods.set(0.80);
    reaches(&fg, "payments", 2).await;
    assert_eq!(all(&mut c).await, [Allowed, Allowed, Shed, Shed], "level 2 also SHEDDABLE_PLUS");
    pods.set(0.95);
    reaches(&fg, "payments", 3).await;
    assert_eq!(all(&mut c).await, [Allowed, Shed, Shed, Shed], "CRITICAL_PLUS is never shed by a level");
    let shed = c.acquire(pb::AcquireRequest { priority: Critical as i32, ..acquire("payments.charge", &[], 1) });
    let shed = shed.await.unwrap().into_inner();
    assert_eq!(
        shed.reason,
        "shed: degradation level is 3 in system 'payments', PRIORITY_CRITICAL is shed from level 3"
    );
    // Search is another system: untouched, whatever the priority.
    assert_eq!(verdict(&mut c, "search.web", Sheddable).await, (Allowed, 0));
    assert_eq!(verdict(&mut c, "elsewhere", Sheddable).await, (Allowed, 0), "the global scope");

    // 85% is below 90% but above 0.8 x 90%: level 3 holds past its dwell.
    pods.set(0.85);
    stays(&fg, "payments", 3, Duration::from_millis(2500)).await;
    // 70% leaves 3 (below 72%) but holds 2 (above 0.8 x 75% = 60%).
    pods.set(0.70);
    reaches(&fg, "payments", 2).await;
    stays(&fg, "payments", 2, Duration::from_millis(2500)).await;
    // 40% is below every hysteresis: down one level per second.
    pods.set(0.40);
    reaches(&fg, "payments", 0).await;
    assert_eq!(all(&mut c).await, [Allowed; 4]);

    let mut moves = Vec::new();
    while moves.last() != Some(&(1, 0)) {
        let event = tokio::time::timeout(Duration::from_secs(5), watch.message()).await.unwrap().unwrap().unwrap();
        if let Some(Kind::Degradation(d)) = event.event {
            assert_eq!(d.system, "payments", "only payments moved: {d:?}");
            assert!(!d.manual);
            if (d.from_level, d.to_level) == (0, 1) {
                assert!(d.reason.starts_with("cpu reached 0.60 (level 1)"), "{}", d.reason);
            }
            moves.push((d.from_level, d.to_level));
        }
    }
    assert_eq!(moves, [(0, 1), (1, 2), (2, 3), (3, 2), (2, 1), (1, 0)]);
    let metrics = fg.http_get("/metrics").1;
    assert!(metrics.contains("floodgate_degradation_level{system=\"payments\"} 0"), "{metrics}");
    assert!(metrics.contains("floodgate_system_instances{system=\"payments\"} 3"), "{metrics}");
    drop(pods);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_busy_instance_and_two_idle_ones_follow_the_aggregation_and_a_silent_one_leaves() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    // The idle instances report first: the level rises at once, so a tick
    // that saw "hot" alone would rightly put `half` at level 3 (one of one).
    for system in ["mean", "busiest", "half", "third"] {
        for i in 0..2 {
            c.report_load(load(system, &format!("idle-{i}"), 0.10)).await.unwrap();
        }
        c.report_load(load(system, "hot", 0.99)).await.unwrap();
    }
    // The mean is 40%; one of three is 33%, short of half but past 30%.
    reaches(&fg, "busiest", 3).await;
    reaches(&fg, "third", 3).await;
    let s = systems(&fg).await;
    assert_eq!(
        ["mean", "busiest", "half", "third"].map(|n| (s[n].level, s[n].signals.as_ref().unwrap().instances)),
        [(0, 3), (3, 3), (0, 3), (3, 3)]
    );
    let mean = s["mean"].signals.as_ref().unwrap().cpu.unwrap();
    assert!((mean - 0.3967).abs() < 0.001, "the mean of 0.99, 0.10, 0.10 is {mean}");
    // "hot" goes silent; the idle ones keep reporting: after 2 s it leaves
    // `busiest`, and the level falls (after the 5 s dwell at level 3).
    let idle = tokio::spawn({
        let mut c = c.clone();
        async move {
            loop {
                for i in 0..2 {
                    c.report_load(load("busiest", &format!("idle-{i}"), 0.10)).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let instances = eventually("the silent instance to leave", Duration::from_secs(10), || async {
        let s = systems(&fg).await;
        let n = s["busiest"].signals.as_ref().unwrap().instances;
        (n == 2).then_some(n)
    })
    .await;
    assert_eq!(instances, 2);
    reaches(&fg, "busiest", 0).await;
    idle.abort();
}

#[tokio::test]
async fn a_manual_level_per_system_wins_until_cleared() {
    let fg = floodgate().rules(RULES).start();
    let mut admin = fg.admin().await;
    let mut c = fg.client().await;
    c.report_load(load("payments", "pod", 0.05)).await.unwrap();
    let set = |system: &str, level: u32, automatic: bool| pb::SetDegradationLevelRequest {
        system: system.into(),
        level,
        automatic,
        every_system: false,
    };
    let r = admin.set_degradation_level(set("payments", 3, false)).await.unwrap().into_inner();
    assert_eq!((r.system.as_str(), r.level, r.manual, r.automatic_level), ("payments", 3, true, 0));
    assert_eq!(verdict(&mut c, "payments.charge", pb::Priority::Critical).await, (pb::Verdict::Shed, 3));
    assert_eq!(level(&fg, "search").await, 0, "search stays at 0");
    // The low load does not bring it down while the override holds.
    stays(&fg, "payments", 3, Duration::from_millis(500)).await;
    admin.set_degradation_level(set("payments", 0, true)).await.unwrap();
    assert_eq!(verdict(&mut c, "payments.charge", pb::Priority::Critical).await, (pb::Verdict::Allowed, 0));

    let every = pb::SetDegradationLevelRequest { level: 1, every_system: true, ..Default::default() };
    let r = admin.set_degradation_level(every).await.unwrap().into_inner();
    assert_eq!(r.systems.len(), 8, "the global scope and 7 systems");
    assert!(r.systems.iter().all(|s| s.level == 1 && s.manual));
    let err = admin.set_degradation_level(set("billing", 1, false)).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::InvalidArgument, "system: 'billing' is not a system of the rules in force")
    );
    let both = pb::SetDegradationLevelRequest { system: "payments".into(), every_system: true, ..Default::default() };
    let err = admin.set_degradation_level(both).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{}", err.message());

    // The CLI shows every scope.
    let out = std::process::Command::new(BIN).args(["level", "--server", &fg.url()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("global: degradation level 1 (manual)"), "{text}");
    assert!(text.contains("payments: degradation level 1 (manual; automatic level 0)"), "{text}");
    let out = std::process::Command::new(BIN)
        .args(["level", "--server", &fg.url(), "--system", "search", "auto"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("search: degradation level 0 (automatic"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_load_reports_are_refused_and_a_flood_of_instances_is_bounded() {
    let fg = floodgate().rules(RULES).start();
    let mut c = fg.client().await;
    let bad = [
        (load("payments", "p", 1.5), "cpu: 1.5 is not a utilization between 0 and 1"),
        (load("payments", "p", -0.5), "cpu: -0.5 is not a utilization between 0 and 1"),
        (load("payments", "p", f64::NAN), "cpu: NaN is not a utilization between 0 and 1"),
        (
            pb::ReportLoadRequest { memory: 7.0, ..load("payments", "p", 0.5) },
            "memory: 7 is not a utilization between 0 and 1",
        ),
        (load("billing", "p", 0.5), "system: 'billing' is not a system of the rules in force"),
        (load("", "p", 0.5), "system: must not be empty"),
        (load("payments", "", 0.5), "instance: must not be empty"),
    ];
    for (req, want) in bad {
        let err = c.report_load(req).await.unwrap_err();
        assert_eq!((err.code(), err.message()), (tonic::Code::InvalidArgument, want));
    }
    let long = c.report_load(load("payments", &"i".repeat(300), 0.5)).await.unwrap_err();
    assert_eq!(long.code(), tonic::Code::InvalidArgument, "{}", long.message());
    let err = c.acquire(pb::AcquireRequest { priority: 99, ..acquire("payments.charge", &[], 1) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("priority: 99 is not one of PRIORITY_CRITICAL_PLUS"), "{}", err.message());
    assert_eq!(level(&fg, "payments").await, 0, "nothing was counted");
    assert_eq!(systems(&fg).await["payments"].signals.as_ref().unwrap().instances, 0);

    // 5,000 fake instances at 99% against a table of 50: the first 50 count,
    // the rest are refused by name, decisions go on.
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (mut c, refused) = (c.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..1250 {
                match c.report_load(load("small", &format!("fake-{t}-{i}"), 0.99)).await {
                    Ok(_) => {}
                    Err(e) => {
                        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{}", e.message());
                        assert!(e.message().contains("already has 50 live instances"), "{}", e.message());
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let probe = verdict(&mut c, "payments.charge", pb::Priority::Sheddable).await;
    assert_eq!(probe, (pb::Verdict::Allowed, 0), "decisions go on during the flood");
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 5000 - 50);
    let s = systems(&fg).await;
    assert_eq!(s["small"].signals.as_ref().unwrap().instances, 50);
    assert_eq!(s["payments"].level, 0, "another system is not moved by it");
    let metrics = fg.http_get("/metrics").1;
    assert!(metrics.contains("floodgate_load_reports_total{result=\"refused_full\"} 4950"), "{metrics}");
}

/// Burns 30% of one core (30 ms of spinning every 100 ms) in a process of its
/// own while its client reports load as instance "burner" of `payments`.
/// Run by `the_client_crate_reports_its_process_load_as_a_share_of_its_cores`.
#[test]
#[ignore = "the child process of the_client_crate_reports_its_process_load_as_a_share_of_its_cores"]
fn load_burner_child() {
    let url = std::env::var("FG_BURN_URL").expect("FG_BURN_URL: this runs as a child of another test");
    let secs: u64 = std::env::var("FG_BURN_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _client = rt.block_on(async {
        floodgate_client::Client::builder().endpoint(url).report_load("payments", "burner").build().unwrap()
    });
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        std::thread::sleep(Duration::from_millis(70));
    }
}

#[tokio::test]
async fn the_client_crate_reports_its_process_load_as_a_share_of_its_cores() {
    let fg = floodgate().rules(RULES).start();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "systems::load_burner_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("FG_BURN_URL", fg.url())
        .env("FG_BURN_SECS", "9")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the burner to report", Duration::from_secs(10), || async {
        (systems(&fg).await["payments"].signals.as_ref().unwrap().instances == 1).then_some(())
    })
    .await;
    // Each report covers the second before it: skip the first, average four.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(systems(&fg).await["payments"].signals.as_ref().unwrap().cpu.unwrap());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let cores = std::thread::available_parallelism().unwrap().get() as f64;
    let mean = seen.iter().sum::<f64>() / seen.len() as f64;
    let want = 0.30 / cores;
    eprintln!("load reporter: reported {seen:?}, expected {want:.3}");
    assert!((mean - want).abs() <= 0.10, "30% of one core of {cores} is {want:.3}; reported {seen:?}");
    assert!(seen.iter().all(|&c| c > 0.0 && c < 0.30 / cores + 0.2), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_load_reports_and_operators_levels_and_keep_them_when_redis_comes_back_empty() {
    let (mut redis, _dir, args) = replicated(RULES);
    let (a, b) = (floodgate().args(strs(&args)).start(), floodgate().args(strs(&args)).start());
    wait_live(&a, 2);
    // Every instance reports to replica A only.
    let mut to_a = a.client().await;
    let report = |c: &mut pb::floodgate_client::FloodgateClient<tonic::transport::Channel>| {
        let mut c = c.clone();
        async move {
            for i in 0..3 {
                c.report_load(load("payments", &format!("pod-{i}"), 0.80)).await.unwrap();
            }
        }
    };
    report(&mut to_a).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (level_b, instances_b) = loop {
        report(&mut to_a).await;
        // (A's sync may fall between two of the three reports: B hears all
        // three by the next.)
        let s = systems(&b).await.remove("payments").unwrap();
        if s.level == 2 && s.signals.as_ref().is_some_and(|g| g.instances == 3) {
            break (s.level, s.signals.as_ref().unwrap().instances);
        }
        assert!(Instant::now() < deadline, "replica B never heard A's load reports: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((level_b, instances_b), (2, 3), "B answers like A");
    let mut to_b = b.client().await;
    assert_eq!(verdict(&mut to_b, "payments.charge", pb::Priority::SheddablePlus).await, (pb::Verdict::Shed, 2));

    // An operator's level set on B holds on A, and on a replica started later.
    let set = pb::SetDegradationLevelRequest { system: "search".into(), level: 3, ..Default::default() };
    b.admin().await.set_degradation_level(set).await.unwrap();
    eventually("A to take B's level", Duration::from_secs(5), || async {
        (level(&a, "search").await == 3).then_some(())
    })
    .await;
    let c = floodgate().args(strs(&args)).start();
    eventually("a new replica to take it", Duration::from_secs(5), || async {
        (level(&c, "search").await == 3).then_some(())
    })
    .await;

    // Redis restarts empty: the replicas write their levels back.
    redis.restart_empty();
    wait_live(&a, 3);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for fg in [&a, &b, &c] {
        assert_eq!(level(fg, "search").await, 3, "the override outlived an empty Redis");
    }
    let d = floodgate().args(strs(&args)).start();
    eventually("a replica started after it to take it", Duration::from_secs(5), || async {
        (level(&d, "search").await == 3).then_some(())
    })
    .await;
    // Cleared on one: automatic everywhere.
    let clear = pb::SetDegradationLevelRequest { system: "search".into(), automatic: true, ..Default::default() };
    a.admin().await.set_degradation_level(clear).await.unwrap();
    for fg in [&a, &b, &c, &d] {
        eventually("the override to clear", Duration::from_secs(5), || async {
            (level(fg, "search").await == 0).then_some(())
        })
        .await;
    }
    // Set on A while Redis is away: it holds on A at once, and reaches the
    // others once Redis is back (while one set on B before stays).
    let on_b = pb::SetDegradationLevelRequest { system: "payments".into(), level: 1, ..Default::default() };
    b.admin().await.set_degradation_level(on_b).await.unwrap();
    eventually("A to take B's level", Duration::from_secs(5), || async {
        (level(&a, "payments").await == 1).then_some(())
    })
    .await;
    redis.kill();
    let set = pb::SetDegradationLevelRequest { system: "search".into(), level: 2, ..Default::default() };
    a.admin().await.set_degradation_level(set).await.unwrap();
    assert_eq!(level(&a, "search").await, 2);
    redis.restart();
    for fg in [&b, &c, &d] {
        eventually("the level set during the outage to arrive", Duration::from_secs(10), || async {
            (level(fg, "search").await == 2).then_some(())
        })
        .await;
    }
    // C and D may not have read B's level before Redis went away: B writes
    // it back into the empty Redis, and they take it from there. Like the
    // level set during the outage, it arrives within a few syncs.
    for fg in [&a, &b, &c, &d] {
        eventually("the level set on B before the outage to stay", Duration::from_secs(10), || async {
            (level(fg, "payments").await == 1).then_some(())
        })
        .await;
    }

    // One instance's reports cross on their way: 10% to A, then 99% to B
    // 50 ms later. Both replicas keep the newer one.
    let mut to_b = b.client().await;
    to_a.report_load(load("mean", "x", 0.10)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    to_b.report_load(load("mean", "x", 0.99)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for fg in [&a, &b] {
        let cpu = systems(fg).await["mean"].signals.as_ref().unwrap().cpu;
        assert_eq!(cpu, Some(0.99), "the newer report stands on both replicas");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_a_replica_learns_later_takes_the_level_stored_for_it() {
    let (_redis, dir, args) = replicated(RULES);
    // B starts on rules without `search`, as in a rolling change of the rules.
    let old = RULES.replace("  - name: search\n    resources: [\"search.*\"]\n", "");
    let b_rules = dir.write("b.yaml", &old);
    let mut b_args = args.clone();
    b_args[1] = path_str(&b_rules).to_string();
    let (a, b) = (floodgate().args(strs(&args)).start(), floodgate().args(strs(&b_args)).start());
    wait_live(&a, 2);
    let set = pb::SetDegradationLevelRequest { system: "search".into(), level: 3, ..Default::default() };
    a.admin().await.set_degradation_level(set).await.unwrap();
    assert!(!systems(&b).await.contains_key("search"));
    // B's rules gain the system: it takes the stored level.
    dir.replace("b.yaml", RULES);
    eventually("B to take the stored level once its rules name the system", Duration::from_secs(10), || async {
        systems(&b).await.get("search").is_some_and(|s| s.level == 3 && s.manual).then_some(())
    })
    .await;
}

/// A TCP proxy on a free loopback port to `to`, cut (every connection
/// closed, new ones refused) while `open` is false.
struct Proxy {
    port: u16,
    open: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(to: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let gate = open.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                if !gate.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                let gate = gate.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else { return };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    let cut = async {
                        while gate.load(std::sync::atomic::Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    };
                    tokio::select! { _ = copy => {}, _ = cut => {} }
                });
            }
        });
        Proxy { port, open, task }
    }

    fn set_open(&self, open: bool) {
        self.open.store(open, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_set_on_a_replica_cut_off_from_redis_loses_to_a_newer_one_set_elsewhere() {
    let (redis, _dir, args) = replicated(RULES);
    let port: u16 = redis.url().rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap();
    let proxy = Proxy::start(port).await;
    let mut cut_args = args.clone();
    let at = cut_args.iter().position(|a| a == "--redis").unwrap() + 1;
    cut_args[at] = format!("redis://127.0.0.1:{}", proxy.port);
    let (a, b) = (floodgate().args(strs(&args)).start(), floodgate().args(strs(&cut_args)).start());
    wait_live(&a, 2);
    let set = |system: &str, level: u32| pb::SetDegradationLevelRequest {
        system: system.into(),
        level,
        ..Default::default()
    };
    // B is cut off and sets search to 3; a second later A sets it to 1.
    proxy.set_open(false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.admin().await.set_degradation_level(set("search", 3)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.admin().await.set_degradation_level(set("search", 1)).await.unwrap();
    proxy.set_open(true);
    // The newer level wins on both, once B reaches Redis again.
    eventually("both replicas to hold the newer level", Duration::from_secs(10), || async {
        (level(&a, "search").await == 1 && level(&b, "search").await == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((level(&a, "search").await, level(&b, "search").await), (1, 1), "and stays");
}

/// A process whose guarded calls wait before they run (here, paced by a
/// shaping limit) reports that wait as its queueing delay, and its running
/// guarded calls as its calls in flight: callers that queue are seen even
/// when the dependency answers as fast as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_crate_reports_how_long_guarded_calls_waited_and_how_many_run() {
    let rules = r#"
resources:
  - name: paced
    limits: [ { name: pace, algorithm: leaky_bucket, capacity: 20, leak_per_second: 10, mode: shape, max_wait: 3s } ]
systems:
  - name: queued
    resources: [paced]
"#;
    let fg = floodgate().rules(rules).start();
    let client = floodgate_client::Client::builder()
        .endpoint(fg.url())
        .request_timeout(Duration::from_secs(2))
        .report_load("queued", "pod-0")
        .build()
        .unwrap();
    // 20 calls at once, paced at 10 a second: the last waits about two
    // seconds. Each runs 2.5 s once let through, so that some run when the
    // process reports (once a second).
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .guard(floodgate_client::Acquire::new("paced"))
                    .run(|| async {
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                        Ok::<_, ()>(())
                    })
                    .await
                    .is_ok()
            })
        })
        .collect();
    let seen = eventually("a report with a queueing delay", Duration::from_secs(5), || async {
        let s = systems(&fg).await;
        let signals = s["queued"].signals?;
        let delay = signals.queue_delay?;
        (signals.in_flight > 0).then_some((Duration::new(delay.seconds as u64, delay.nanos as u32), signals.in_flight))
    })
    .await;
    let mut ran = 0;
    for c in calls {
        ran += usize::from(c.await.unwrap());
    }
    assert_eq!(ran, 20, "every call was paced, none denied");
    let (delay, in_flight) = seen;
    // Calls paced at 10 a second waited tens to hundreds of milliseconds
    // each, on average, in a report's second.
    assert!(delay >= Duration::from_millis(20) && delay <= Duration::from_secs(3), "{delay:?}");
    assert!((1..=20).contains(&in_flight), "{in_flight}");
}
