use super::*;

fn tally(admitted: u64, denied: u64) -> Arc<Tally> {
    let t = Arc::new(Tally::default());
    add(&t, admitted, denied);
    t
}

fn add(t: &Tally, admitted: u64, denied: u64) {
    for _ in 0..admitted {
        t.count(true);
    }
    for _ in 0..denied {
        t.count(false);
    }
}

fn tick(s: &mut Series, now: u64, tallies: &[(&str, &Arc<Tally>)]) -> Value {
    tick_with(s, now, tallies, Reading::default())
}

fn tick_with(s: &mut Series, now: u64, tallies: &[(&str, &Arc<Tally>)], reading: Reading) -> Value {
    let out = s.sample(
        now,
        |each| {
            for (n, t) in tallies {
                each(n, t);
            }
        },
        reading,
    );
    if out.is_empty() { Value::Null } else { serde_json::from_str(&out).expect("the tick is JSON") }
}

/// The last `n` values of a resource's series, oldest first.
fn last(s: &Series, name: &str, series: &str, n: usize) -> Vec<u64> {
    let j = s.json(&[name.to_string()], &[], 0);
    let r = j["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} has no series: {j}"));
    let all: Vec<u64> = r[series].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(all.len(), SECONDS);
    all[SECONDS - n..].to_vec()
}

#[test]
fn each_second_holds_what_was_decided_in_it() {
    let mut s = Series::default();
    let orders = tally(5, 1);
    let t = tick(&mut s, 1000, &[("orders", &orders)]);
    assert_eq!(t["resources"], json!([["orders", 5, 1]]));
    add(&orders, 3, 2);
    let t = tick(&mut s, 1001, &[("orders", &orders)]);
    assert_eq!(t["resources"], json!([["orders", 3, 2]]));
    // A quiet second: nothing in the tick, a zero in the series.
    let t = tick(&mut s, 1002, &[("orders", &orders)]);
    assert_eq!(t["resources"], json!([]));
    assert_eq!(last(&s, "orders", "admitted", 3), [5, 3, 0]);
    assert_eq!(last(&s, "orders", "denied", 3), [1, 2, 0]);
    // Seconds the sampler missed are zeros; what was counted lands in the
    // second it is read.
    add(&orders, 7, 0);
    tick(&mut s, 1005, &[("orders", &orders)]);
    assert_eq!(last(&s, "orders", "admitted", 6), [5, 3, 0, 0, 0, 7]);
    assert_eq!(s.json(&[], &[], 5)["t"], 1005);
    assert_eq!(s.json(&[], &[], 5)["started"], 1000);
}

#[test]
fn the_window_is_fifteen_minutes_and_old_seconds_leave_it() {
    let mut s = Series::default();
    let a = tally(9, 0);
    tick(&mut s, 10, &[("a", &a)]);
    add(&a, 1, 0);
    tick(&mut s, 10 + SECONDS as u64 - 1, &[("a", &a)]);
    let all = last(&s, "a", "admitted", SECONDS);
    assert_eq!((all[0], all[SECONDS - 1]), (9, 1), "both ends in the window");
    assert_eq!(all.iter().sum::<u64>(), 10);
    add(&a, 1, 0);
    tick(&mut s, 10 + SECONDS as u64, &[("a", &a)]);
    assert_eq!(last(&s, "a", "admitted", SECONDS).iter().sum::<u64>(), 2, "the first second has left");
    // A clock that goes back, or a second sampled twice, changes nothing.
    add(&a, 100, 0);
    assert!(tick(&mut s, 10, &[("a", &a)]).is_null());
    assert!(tick(&mut s, 10 + SECONDS as u64, &[("a", &a)]).is_null());
    assert_eq!(last(&s, "a", "admitted", 1), [1]);
}

#[test]
fn resources_past_the_bound_are_other_and_an_idle_ring_is_given_back() {
    let mut s = Series::default();
    let tallies: Vec<(String, Arc<Tally>)> = (0..RESOURCES + 44).map(|i| (format!("r{i:04}"), tally(1, 1))).collect();
    let list: Vec<(&str, &Arc<Tally>)> = tallies.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let t = tick(&mut s, 50, &list);
    assert_eq!(t["resources"].as_array().unwrap().len(), RESOURCES);
    assert_eq!(t["other"], json!([44, 44]));
    let j = s.json(&[], &[], 1000);
    assert_eq!(j["tracked"], RESOURCES);
    assert_eq!(j["resources"].as_array().unwrap().len(), RESOURCES);
    assert_eq!(j["other"]["admitted"].as_array().unwrap().last().unwrap(), 44);
    // The tracked ones are whichever came first; which is not promised, but
    // it stays stable: the same resources keep their rings.
    let tracked: Vec<String> =
        t["resources"].as_array().unwrap().iter().map(|r| r[0].as_str().unwrap().to_string()).collect();
    let untracked = tallies.iter().find(|(n, _)| !tracked.contains(n)).unwrap();
    add(&untracked.1, 2, 0);
    let t = tick(&mut s, 51, &list);
    assert_eq!(t["other"], json!([2, 0]));
    // One tracked resource decides through the whole window, the rest go
    // quiet: their rings are given back, and the untracked one gets one.
    let busy = &tallies.iter().find(|(n, _)| *n == tracked[0]).unwrap().1;
    for now in 52..50 + SECONDS as u64 {
        add(busy, 1, 0);
        tick(&mut s, now, &list);
    }
    add(&untracked.1, 3, 0);
    let t = tick(&mut s, 50 + SECONDS as u64, &list);
    assert_eq!(t["other"], json!([0, 0]));
    assert_eq!(s.json(&[], &[], 1000)["tracked"], 2, "the busy one and the newcomer");
    assert_eq!(last(&s, &untracked.0, "admitted", 1), [3]);
}

#[test]
fn a_reload_neither_loses_nor_counts_twice() {
    let mut s = Series::default();
    let old = tally(4, 0);
    tick(&mut s, 100, &[("orders", &old)]);
    // Counted by the old rules after the last sample, then the rules are
    // replaced: the old tally's last decisions are read once.
    add(&old, 2, 1);
    let new = tally(5, 0);
    let t = tick(&mut s, 101, &[("orders", &new)]);
    assert_eq!(t["resources"], json!([["orders", 7, 1]]));
    add(&old, 50, 0);
    add(&new, 1, 0);
    let t = tick(&mut s, 102, &[("orders", &new)]);
    assert_eq!(t["resources"], json!([["orders", 1, 0]]), "the old tally is forgotten once read");
    // Several tallies under one name (the Envoy configuration's limits) add up.
    let (a, b) = (tally(1, 0), tally(0, 2));
    let t = tick(&mut s, 103, &[("_envoy", &a), ("_envoy", &b), ("orders", &new)]);
    assert_eq!(t["resources"], json!([["_envoy", 1, 2]]));
}

fn breaker(state: &'static str, calls: u64, failure_rate: f64) -> BreakerNow {
    BreakerNow { resource: "payments".into(), state, calls, failure_rate, slow_call_rate: 0.0, not_permitted: 0 }
}

#[test]
fn a_breakers_rates_state_and_transitions_are_kept_and_ticks_say_what_changed() {
    let mut s = Series::default();
    let reading = |b: BreakerNow| Reading { breakers: vec![b], levels: vec![(String::new(), 0)] };
    let t = tick_with(&mut s, 200, &[], reading(breaker("CLOSED", 4, 0.25)));
    assert_eq!(t["breakers"][0]["resource"], "payments");
    let t = tick_with(&mut s, 201, &[], reading(breaker("CLOSED", 4, 0.25)));
    assert_eq!(t["breakers"], json!([]), "unchanged: not repeated");
    s.transition("payments", 203, "CLOSED", "OPEN");
    let t = tick_with(&mut s, 203, &[], reading(breaker("OPEN", 8, 0.75)));
    assert_eq!(t["breakers"][0]["state"], "OPEN");
    let j = s.json(&[], &[], 5);
    let b = &j["breakers"][0];
    let rates: Vec<f64> = b["failure_rate"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(rates[SECONDS - 4..], [0.25, 0.25, 0.25, 0.75], "the missed second repeats the last value");
    let states = b["state"].as_array().unwrap();
    assert_eq!(states[SECONDS - 5], Value::Null, "before it was seen");
    assert_eq!((&states[SECONDS - 2], &states[SECONDS - 1]), (&json!("CLOSED"), &json!("OPEN")));
    assert_eq!(b["transitions"], json!([{ "t": 203, "from": "CLOSED", "to": "OPEN" }]));
    // Levels: a missed second repeats the level.
    let levels = Reading { breakers: vec![], levels: vec![(String::new(), 2)] };
    tick_with(&mut s, 206, &[], levels);
    let level: Vec<u64> =
        s.json(&[], &[], 0)["levels"][0]["level"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(level[SECONDS - 4..], [0, 0, 0, 2]);
}

#[test]
fn breakers_and_systems_are_bounded() {
    let mut s = Series::default();
    let breakers: Vec<BreakerNow> =
        (0..BREAKERS + 10).map(|i| BreakerNow { resource: format!("b{i}"), ..breaker("CLOSED", 1, 0.0) }).collect();
    let levels: Vec<(String, u32)> = (0..SYSTEMS + 10).map(|i| (format!("s{i}"), 1)).collect();
    let t = tick_with(&mut s, 300, &[], Reading { breakers, levels });
    assert_eq!(t["breakers"].as_array().unwrap().len(), BREAKERS);
    let j = s.json(&[], &[], usize::MAX);
    assert_eq!(j["breakers"].as_array().unwrap().len(), BREAKERS);
    assert_eq!(j["levels"].as_array().unwrap().len(), SYSTEMS);
    // The page's own choice: only what it names, and nothing it does not know.
    let j = s.json(&["nope".into()], &["b3".into(), "b9999".into()], 5);
    assert_eq!(j["resources"], json!([]));
    assert_eq!(j["breakers"].as_array().unwrap().len(), 1);
    assert_eq!(j["breakers"][0]["resource"], "b3");
}
