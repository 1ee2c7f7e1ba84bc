use super::synthetic::{self, Shape as TraceShape};
use super::*;

const T0: u64 = 29_459_520; // a midnight, in minutes since the epoch

fn history(series: &[(&str, &[(u64, u32)])]) -> History {
    let mut h = History::new(usize::MAX);
    for (key, minutes) in series {
        for &(m, calls) in *minutes {
            h.record(key, T0 + m, calls).unwrap();
        }
    }
    h
}

#[test]
fn a_typical_peak_is_the_median_of_the_daily_peaks() {
    // Peaks of 10, 12 and 11 on three days, then 500 on two: the median of
    // the five days is 12, a peak of a normal day.
    let days: Vec<(u64, u32)> =
        [10, 12, 11, 500, 500].iter().enumerate().map(|(d, &p)| (d as u64 * DAY + 600, p)).collect();
    let h = history(&[("tenant=a", &days)]);
    let peaks = typical_peaks(&h, T0, T0 + 5 * DAY);
    assert_eq!(peaks["tenant=a"], 12);
    // On a day another key made calls, a key without any counts 0: active
    // on one day of three, its typical peak is 0.
    let h = history(&[("tenant=a", &[(30, 5), (DAY + 30, 5), (2 * DAY + 30, 5)]), ("tenant=b", &[(30, 50)])]);
    assert_eq!(typical_peaks(&h, T0, T0 + 3 * DAY)["tenant=b"], 0);
    // A day without any calls is a gap in the recording, not a quiet day:
    // a stray line a year later adds one day, and the others' peaks stand.
    let a: Vec<(u64, u32)> = (0..5).map(|d| (d * DAY + 600, 10)).collect();
    let h = history(&[("tenant=a", &a), ("tenant=stray", &[(365 * DAY, 1)])]);
    let peaks = typical_peaks(&h, T0, T0 + 366 * DAY);
    assert_eq!((peaks["tenant=a"], peaks["tenant=stray"]), (10, 0));
}

#[test]
fn the_limit_is_a_quantile_times_the_headroom_and_heavier_keys_get_overrides() {
    let mut series: Vec<(String, Vec<(u64, u32)>)> =
        (1..=100).map(|i| (format!("k{i:03}"), vec![(100, i as u32)])).collect();
    series.push(("heavy".to_string(), vec![(100, 1000)]));
    let refs: Vec<(&str, &[(u64, u32)])> = series.iter().map(|(k, s)| (k.as_str(), s.as_slice())).collect();
    let h = history(&refs);
    let settings = Settings { quantile: 0.9, headroom: 1.5, max_decrease: 0.2 };
    let p = propose(&h, T0, T0 + DAY, &settings, None);
    // 101 peaks; the 0.9 quantile is the 91st smallest: 91, times 1.5.
    assert_eq!((p.per_minute, p.observed, p.keys), (137, 137, 101));
    assert_eq!(p.overrides.get("heavy"), Some(&1500));
    assert_eq!(p.overrides.len(), 10, "k092..k100 and heavy are above 137 with headroom: {:?}", p.overrides);
    assert_eq!(p.limit_for("k001"), 137);
}

#[test]
fn guard_rails_slow_a_fall_and_never_hold_back_a_rise() {
    let settings = Settings { quantile: 1.0, headroom: 1.0, max_decrease: 0.2 };
    let before = Proposal { per_minute: 100, observed: 100, overrides: [("big".to_string(), 1000)].into(), keys: 2 };
    // Traffic fell to 10: the limit falls by 20% a day, not at once.
    let h = history(&[("a", &[(5, 10)]), ("big", &[(5, 10)])]);
    let p = propose(&h, T0, T0 + DAY, &settings, Some(&before));
    assert_eq!(p.per_minute, 80);
    assert_eq!(p.observed, 10);
    assert_eq!(p.overrides.get("big"), Some(&800));
    // A key gone quiet keeps a falling override too.
    let h = history(&[("a", &[(5, 10)])]);
    assert_eq!(propose(&h, T0, T0 + DAY, &settings, Some(&before)).overrides.get("big"), Some(&800));
    // Traffic rose to 300: the limit rises to it at once.
    let h = history(&[("a", &[(5, 300)])]);
    assert_eq!(propose(&h, T0, T0 + DAY, &settings, Some(&before)).per_minute, 300);
}

#[test]
fn replay_sends_the_calls_through_the_real_limiter() {
    let h = history(&[("a", &[(0, 15), (1, 8), (2, 30)]), ("b", &[(0, 3)])]);
    let p = Proposal { per_minute: 10, observed: 10, overrides: BTreeMap::new(), keys: 2 };
    // A fixed window of 10 a minute: 5 denied, then none, then 20.
    let r = replay(&h, T0, T0 + 3, &p, Shape::FixedWindow);
    assert_eq!(r[0], KeyReplay { key: "a".into(), limit: 10, calls: 53, denied: 25 });
    assert_eq!(r[1], KeyReplay { key: "b".into(), limit: 10, calls: 3, denied: 0 });
    // A token bucket refills within the minute: fewer are denied than the
    // window denies, and some still are.
    let r = replay(&h, T0, T0 + 3, &p, Shape::TokenBucket);
    assert!(r[0].denied > 0 && r[0].denied < 25, "{:?}", r[0]);
    // Only the period asked for is replayed.
    let r = replay(&h, T0 + 1, T0 + 2, &p, Shape::FixedWindow);
    assert_eq!((r[0].calls, r[0].denied), (8, 0));
}

#[test]
fn a_trace_is_read_with_keys_holding_commas_and_bad_lines_named() {
    let mut h = History::new(100);
    let text = "# seconds,key,calls\n1767571200,tenant=a,5\n1767571230,tenant=a,2\n\n1767571260,user=u1,plan=gold,7\n";
    h.read(text.as_bytes()).unwrap();
    assert_eq!(h.keys(), 2);
    assert_eq!(h.minutes("tenant=a", 0, u64::MAX), &[(29_459_520, 7)]);
    assert_eq!(h.minutes("user=u1,plan=gold", 0, u64::MAX), &[(29_459_521, 7)]);
    // A time past what a timestamp holds is refused, not wrapped round.
    let err = History::new(100).read("18446744073709551615,a,1\n".as_bytes()).unwrap_err();
    assert!(err.to_string().starts_with("line 1: minute 307445734561825860 is past"), "{err}");
    let err = History::new(100).read("1767571200,tenant=a,5\n1767571200,tenant=a,x\n".as_bytes()).unwrap_err();
    assert_eq!(err.to_string(), "line 2: calls 'x' is not a whole number");
    let err = History::new(100).read("1767571200,5\n".as_bytes()).unwrap_err();
    assert!(err.to_string().starts_with("line 1: '1767571200,5' has no key"), "{err}");
    // A bound on what is held: the third minute is refused.
    let err = History::new(2).read("0,a,1\n60,a,1\n120,a,1\n".as_bytes()).unwrap_err();
    // (A new key takes room too: one pair, and one for each 16 bytes.)
    assert!(err.to_string().starts_with("line 2: the history holds at most 2 pairs"), "{err}");
    let err = History::new(100).read("0,a,1000001\n".as_bytes()).unwrap_err();
    assert_eq!(err.to_string(), "line 1: 1000001 calls in one minute of one key is more than 1000000");
    let err = History::new(100).read("0,a,600000\n30,a,600000\n".as_bytes()).unwrap_err();
    assert!(err.to_string().starts_with("line 2: 1200000 calls in one minute"), "{err}");
    let long = format!("0,{},1\n", "k".repeat(MAX_KEY + 1));
    let err = History::new(1000).read(long.as_bytes()).unwrap_err();
    assert_eq!(err.to_string(), format!("line 1: a key of {} bytes is longer than {MAX_KEY}", MAX_KEY + 1));
    // A line of exactly MAX_LINE bytes is read, with either line end.
    let key = "k".repeat(MAX_KEY);
    let exact = format!("0,{key},{}", "0".repeat(MAX_LINE - 4 - key.len()) + "1");
    assert_eq!(exact.len(), MAX_LINE);
    History::new(1000).read(format!("{exact}\r\n").as_bytes()).unwrap();
    // A file without line ends (a device of zeros) is refused, not read
    // whole.
    let zeros = std::io::BufReader::new(std::io::repeat(0));
    let err = History::new(100).read(zeros).unwrap_err();
    assert_eq!(err.to_string(), format!("line 1: the line is longer than {MAX_LINE} bytes"));
}

#[test]
fn settings_out_of_range_are_refused_by_name() {
    assert!(Settings::default().validate().is_ok());
    let bad = Settings { quantile: 1.5, ..Settings::default() };
    assert_eq!(bad.validate().unwrap_err(), "quantile 1.5 is not between 0 and 1");
    let bad = Settings { headroom: 0.5, ..Settings::default() };
    assert!(bad.validate().unwrap_err().starts_with("headroom 0.5"));
    let bad = Settings { max_decrease: 1.0, ..Settings::default() };
    assert!(bad.validate().unwrap_err().starts_with("max decrease 1"));
}

/// The benchmark's measure on a smaller trace (the full one runs in the
/// example `recommend_week`): recommendations made each day from the week
/// before deny nearly all of a misbehaving tenant's excess, next to none of
/// the others' calls, and move by no more than the guard rail allows.
#[test]
fn recommendations_stop_a_misbehaving_tenant_and_spare_the_others() {
    let shape = TraceShape { tenants: 60, heavy: 1, days: 10, storm_from: 8 * DAY + DAY / 2, ..TraceShape::default() };
    let trace = synthetic::generate(&shape);
    let settings = Settings::default();
    let e = synthetic::evaluate(&trace, &settings, Shape::TokenBucket, 7, shape.days);
    assert_eq!(e.limits.len(), 3);
    assert!(e.excess > 0);
    let caught = e.excess_denied as f64 / e.excess as f64;
    let spared = e.good_denied as f64 / e.good_calls as f64;
    assert!(caught >= 0.95, "{:.3} of the excess denied: {e:?}", caught);
    assert!(spared < 0.001, "{:.5} of the good calls denied: {e:?}", spared);
    assert!(e.largest_fall <= settings.max_decrease + 0.01, "{e:?}");
}
