//! `over_limit: { admit: P% }` through the engine: the share of denied calls
//! admitted anyway, spread over the calls, what they take, and how a later
//! limit's denial gives it back.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

const RULES: &str = r#"
resources:
  - name: soft
    limits:
      - { name: per-user, key: [user], algorithm: fixed_window, limit: 10, window: 1h, over_limit: { admit: 10% } }
  - name: two
    limits:
      - { name: soft, algorithm: token_bucket, capacity: 5, refill_per_second: 1, over_limit: { admit: 50% } }
      - { name: hard, algorithm: fixed_window, limit: 7, window: 1h }
  - name: bounded
    limits:
      - { name: soft, algorithm: token_bucket, capacity: 5, refill_per_second: 1, over_limit: { admit: 50% } }
  - name: flat
    limits:
      - { name: l, key: [user], algorithm: token_bucket, capacity: 10, refill_per_second: 10, over_limit: { admit: 99% } }
  - name: ramped
    limits:
      - { name: l, key: [user], algorithm: token_bucket, capacity: 10, refill_per_second: 10, over_limit: { admit: 99%, ramp: true } }
"#;

fn user(u: &str) -> HashMap<String, String> {
    HashMap::from([("user".to_string(), u.to_string())])
}

#[test]
fn a_tenth_of_the_calls_over_the_limit_are_admitted_spread_over_them() {
    let (e, clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let u1 = user("u1");
    for _ in 0..10 {
        let a = e.acquire(&rules, &Request::new("soft", &u1)).unwrap();
        assert_eq!(a.verdict, Verdict::Allowed);
        assert!(!a.limits[0].exceeded && !a.limits[0].status.over_limit);
    }
    // 4000 calls over the limit, a millisecond apart.
    let mut admitted = Vec::new();
    for i in 0..4000 {
        clock.advance(Duration::from_millis(1));
        let a = e.acquire(&rules, &Request::new("soft", &u1)).unwrap();
        let l = &a.limits[0];
        assert!(l.exceeded, "call {i} is over the limit: {a:?}");
        match a.verdict {
            Verdict::Allowed => {
                assert!(l.status.over_limit && !l.denied() && l.status.remaining == 0, "{a:?}");
                assert_eq!(a.reason(), "");
                admitted.push(i);
            }
            _ => {
                assert!(!l.status.over_limit && l.denied() && !a.retry_after.is_zero(), "{a:?}");
            }
        }
    }
    // 400 expected; five standard deviations (19) either side.
    assert!((305..=495).contains(&admitted.len()), "{} of 4000 admitted over the limit", admitted.len());
    // Spread over the calls, not the first ones: each quarter has its share.
    for q in 0..4 {
        let n = admitted.iter().filter(|&&i| i / 1000 == q).count();
        assert!((50..=150).contains(&n), "quarter {q}: {n} admitted");
    }
    // What they took is taken beyond the limit: the window's count says so,
    // and another user's bucket is untouched.
    let peeked = e.peek(&rules, "soft", &u1, None).unwrap();
    assert_eq!(peeked.limits[0].status.remaining, 0);
    let u2 = user("u2");
    assert_eq!(e.peek(&rules, "soft", &u2, None).unwrap().limits[0].status.remaining, 10);
}

#[test]
fn a_call_admitted_over_one_limit_and_denied_by_the_next_takes_nothing() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let none = HashMap::<String, String>::new();
    let mut admitted = 0;
    // The clock stands still: the bucket refills nothing meanwhile.
    for _ in 0..400 {
        let a = e.acquire(&rules, &Request::new("two", &none)).unwrap();
        if a.verdict == Verdict::Allowed {
            admitted += 1;
        } else {
            // Denied by `soft` (not drawn), or by `hard` after a draw: then
            // `soft` gave back what it took, and its report is of a denial
            // all the same (it is over its limit either way).
            assert!(a.limits[0].denied(), "{a:?}");
            assert!(!a.limits[0].status.over_limit && !a.limits[0].status.retry_after.is_zero(), "{a:?}");
            assert!(a.reason().contains("'soft'"), "{}", a.reason());
        }
    }
    // `hard` admits 7 in the hour, whatever `soft` does.
    assert_eq!(admitted, 7);
    // `soft` holds 5 and refills one a second: the 7 admitted calls left it
    // 2 in debt, 7 s from full. Each call `hard` denied took nothing.
    let peeked = e.peek(&rules, "two", &none, None).unwrap();
    assert_eq!(peeked.limits[0].status.reset_after, Duration::from_secs(7), "{peeked:?}");
}

#[test]
fn a_cost_the_limit_could_never_hold_is_refused_not_admitted_over_it() {
    let (e, _) = super::tests::engine(RULES);
    let rules = e.rules();
    let u1 = user("u1");
    for _ in 0..200 {
        let a = e.acquire(&rules, &Request { cost: 11, ..Request::new("soft", &u1) });
        assert!(matches!(a, Err(RequestError::CostExceedsCapacity { .. })), "{a:?}");
    }
}

#[test]
fn calls_admitted_over_a_limit_put_a_caller_at_most_a_window_in_debt() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    let none = HashMap::<String, String>::new();
    // `bounded` holds 5 and refills one a second: a window of 5 s. The clock
    // stands still while a caller hammers it.
    let mut over = 0;
    for _ in 0..10_000 {
        let a = e.acquire(&rules, &Request::new("bounded", &none)).unwrap();
        if a.limits[0].status.over_limit {
            over += 1;
            // The answer is the bucket after this call's take.
            let peeked = e.peek(&rules, "bounded", &none, None).unwrap();
            assert_eq!(a.limits[0].status.reset_after, peeked.limits[0].status.reset_after, "{a:?}");
        }
    }
    // At most a window's worth (5), and one call more, admitted over it.
    assert!((1..=6).contains(&over), "{over} admitted over the limit");
    let peeked = e.peek(&rules, "bounded", &none, None).unwrap();
    assert!(peeked.limits[0].status.reset_after <= Duration::from_secs(11), "{peeked:?}");
}

#[test]
fn with_ramp_the_share_falls_as_the_caller_goes_further_over() {
    let (e, _clock) = super::tests::engine(RULES);
    let rules = e.rules();
    // For each of 200 users: its 10 tokens, then 5 calls over, the clock
    // standing still. Without ramp nearly every one of the 5 is admitted
    // (99%); with it the share falls from 89% (a tenth of a window owed)
    // by a tenth for each call admitted.
    let over = |resource: &str| {
        let mut n = 0;
        for u in 0..200 {
            let d = user(&format!("u{u}"));
            for _ in 0..10 {
                assert_eq!(e.acquire(&rules, &Request::new(resource, &d)).unwrap().verdict, Verdict::Allowed);
            }
            for _ in 0..5 {
                if e.acquire(&rules, &Request::new(resource, &d)).unwrap().limits[0].status.over_limit {
                    n += 1;
                }
            }
        }
        n
    };
    let (flat, ramped) = (over("flat"), over("ramped"));
    assert!(flat >= 950, "without ramp: {flat} of 1000 admitted over");
    assert!(ramped < 850 && ramped > 400, "with ramp: {ramped} of 1000 admitted over (flat: {flat})");
}
