use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::Replica;
use crate::limiter::Shared;
use crate::rules::RuleSet;
use crate::time::{Clock, ManualClock, Timestamp};
use crate::{Engine, EngineConfig, Request};

/// A replicating engine with `yaml` installed, on a manual clock, and its
/// replica.
fn replicated_engine(yaml: &str) -> (Arc<ManualClock>, Engine, Arc<Replica>) {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
    let replica = Arc::new(Replica::new());
    let e = Engine::new(EngineConfig { max_keys: 1000 }, clock.clone()).with_coordination(replica.clone());
    e.control().install(RuleSet::from_yaml(yaml, "t").unwrap(), yaml.into(), "t".into());
    (clock, e, replica)
}

const RULES: &str = "resources: [ { name: r, limits: [ { name: l, key: [user], algorithm: token_bucket, capacity: 10, refill_per_second: 1 } ] } ]";

#[test]
fn replicated_buckets_are_synced_while_used_and_dropped_when_idle() {
    let (clock, e, replica) = replicated_engine(RULES);
    let d: HashMap<String, String> = [("user".to_string(), "u1".to_string())].into();
    let rules = e.rules_full();
    for _ in 0..3 {
        e.acquire(&rules, &Request::new("r", &d)).unwrap();
    }
    let active = Duration::from_secs(10);
    let items = replica.on(&e).sync_items(&rules, clock.now(), active);
    // Pushed: 3 taken; held: the 7 left in the bucket.
    assert_eq!(items.iter().map(|i| (i.resource.as_str(), i.delta, i.hold)).collect::<Vec<_>>(), [("r", 3, 7)]);
    // The merged state leases 2 of 7 available; a sync is not a use.
    let shared = Shared { available: 7.0, lease: 2.0, seq: 1, ..Shared::default() };
    replica.on(&e).adopt(&rules, &items[0], &shared);
    replica.landed(&items[0]);
    let alg = rules.algorithm(items[0].key.limit).unwrap();
    assert_eq!(e.buckets().check(&items[0].key, alg, clock.now(), 0).status.remaining, 2);
    let again = replica.on(&e).sync_items(&rules, clock.now(), active);
    assert_eq!(again.len(), 1, "still active");
    clock.advance(Duration::from_secs(11));
    replica.on(&e).adopt(&rules, &again[0], &Shared { seq: 2, ..shared });
    replica.landed(&again[0]);
    assert!(replica.on(&e).sync_items(&rules, clock.now(), active).is_empty(), "idle for 11 s: no longer synced");
    assert!(!e.buckets().contains_key(&items[0].key), "and its lease is gone: the next use pulls the merged state");
}

#[test]
fn a_bucket_has_one_sync_out_and_its_merged_state_counts_what_was_taken_since_it_went_out() {
    let (clock, e, replica) = replicated_engine(RULES);
    let sync = &replica;
    let d: HashMap<String, String> = [("user".to_string(), "u1".to_string())].into();
    let rules = e.rules_full();
    let take = |n: usize| {
        (0..n).filter(|_| e.acquire(&rules, &Request::new("r", &d)).unwrap().verdict == crate::Verdict::Allowed).count()
    };
    let remaining = |key: &crate::store::BucketKey| {
        e.buckets().check(key, rules.algorithm(key.limit).unwrap(), clock.now(), 0).status.remaining
    };
    assert_eq!(take(2), 2);
    let active = Duration::from_secs(10);
    let first = replica.on(&e).sync_items(&rules, clock.now(), active).remove(0);
    assert_eq!((first.delta, first.hold), (2, 8));
    // While it is out, neither the next round nor an escalation sends another.
    assert_eq!(take(1), 1);
    assert!(replica.on(&e).sync_items(&rules, clock.now(), active).is_empty());
    assert!(replica.on(&e).sync_item(&rules, "r", &first.key).is_none());
    // Its reply: a lease of 5, less the 1 taken since it went out.
    replica.on(&e).adopt(&rules, &first, &Shared { available: 8.0, lease: 5.0, seq: 10, ..Shared::default() });
    sync.landed(&first);
    assert_eq!(remaining(&first.key), 4);
    // Landed: the next goes, with what was taken since the first.
    let second = replica.on(&e).sync_item(&rules, "r", &first.key).expect("the first landed");
    assert_eq!((second.delta, second.hold), (1, 4));
    assert_eq!(take(1), 1);
    replica.on(&e).adopt(&rules, &second, &Shared { available: 7.0, lease: 4.0, seq: 11, ..Shared::default() });
    sync.landed(&second);
    assert_eq!(remaining(&first.key), 3);
    // A reply older than one adopted (a retried script) changes nothing.
    replica.on(&e).adopt(&rules, &first, &Shared { available: 8.0, lease: 5.0, seq: 10, ..Shared::default() });
    assert_eq!(remaining(&first.key), 3);
    assert_eq!(take(5), 3, "the lease admits what it has left, no more");
}

#[test]
fn a_memory_only_engine_notes_nothing_for_the_fleet() {
    let clock = Arc::new(ManualClock::new(Timestamp::from_secs(1_700_006_400)));
    let e = Engine::new(EngineConfig { max_keys: 1000 }, clock);
    e.control().install(RuleSet::from_yaml(RULES, "t").unwrap(), RULES.into(), "t".into());
    let d: HashMap<String, String> = [("user".to_string(), "u1".to_string())].into();
    let rules = e.rules_full();
    let p = e.prepare(&rules, &Request::new("r", &d)).unwrap();
    assert!(p.request_resource.is_empty(), "alone, a decision keeps no name for the fleet");
    assert!(!p.matched.iter().any(|(l, ..)| e.coordination.decides(l)), "alone, every limit is decided here");
}

const STRICT: &str = r#"
resources:
  - name: local
    limits: [ { name: l, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: local } ]
  - name: deny
    limits: [ { name: l, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: deny } ]
  - name: allow
    limits: [ { name: l, algorithm: fixed_window, limit: 50, window: 1h, sync: strict, on_redis_error: allow } ]
"#;

fn admitted(e: &Engine, resource: &str, n: usize) -> usize {
    let none: HashMap<String, String> = HashMap::new();
    let rules = e.rules_full();
    (0..n)
        .filter(|_| {
            let a = e.acquire(&rules, &Request::new(resource, &none)).unwrap();
            a.verdict == crate::Verdict::Allowed
        })
        .count()
}

#[test]
fn while_redis_is_down_every_strict_decision_follows_its_policy() {
    let (clock, e, replica) = replicated_engine(STRICT);
    let sync = &replica;
    sync.set_live(2);
    assert!(!sync.up(), "Redis has not answered yet");
    // Redis last said 18 were left on "local": this replica's share is 9.
    let rules = e.rules_full();
    let key = crate::store::BucketKey::global(rules.find("local").unwrap().1.ids[0]);
    sync.saw_strict(&key, "local", 18, clock.now(), 1);
    assert_eq!(admitted(&e, "local", 20), 9);
    assert_eq!(admitted(&e, "deny", 20), 0, "every request of the outage, not only the first");
    assert_eq!(admitted(&e, "allow", 20), 20);
    // Redis is back and says 13 are left (our 9 paid, the other replica's
    // perhaps not yet): an outage right after takes off the 9 the other may
    // have admitted too, unpaid: a share of 13 - 9.
    assert!(sync.set_up(true), "it came back");
    replica.on(&e).end_outage();
    assert!(!sync.set_up(true), "already up");
    clock.advance(Duration::from_millis(100));
    sync.saw_strict(&key, "local", 13, clock.now(), 2);
    sync.set_up(false);
    assert_eq!(admitted(&e, "local", 20), 2, "half of 13 - 9");
    // Once every replica has paid (3 s), an outage starts again from what
    // Redis then says.
    assert!(sync.set_up(true));
    replica.on(&e).end_outage();
    clock.advance(Duration::from_secs(4));
    sync.saw_strict(&key, "local", 4, clock.now(), 3);
    // An answer Redis gave earlier (a call in flight beside the one above)
    // arrives last: it does not replace the newer figure.
    sync.saw_strict(&key, "local", 17, clock.now(), 2);
    assert_eq!(sync.last_from_store(&key), Some(4), "the newest of Redis's figures");
    sync.set_up(false);
    assert_eq!(admitted(&e, "local", 20), 2, "half of 4");
}

const GUARDED: &str = r#"
resources:
  - name: db
    concurrency: { max_in_flight: 1, sync: local }
    limits:
      - { name: here, algorithm: token_bucket, capacity: 10, refill_per_second: 1 }
      - { name: there, algorithm: fixed_window, limit: 50, window: 1h, sync: strict }
"#;

#[test]
fn a_decision_abandoned_while_redis_is_asked_gives_back_its_slot_and_its_units() {
    use crate::{Step, Verdict};
    let (clock, e, replica) = replicated_engine(GUARDED);
    replica.set_up(true);
    let rules = e.rules_full();
    let none: HashMap<String, String> = HashMap::new();
    let req = Request { cost: 3, ..Request::new("db", &none) };
    let begin = || match e.begin(e.prepare(&rules, &req).unwrap(), clock.now()) {
        Step::Remote(pending) => pending,
        Step::Done(a) => panic!("decided without Redis: {a:?}"),
    };
    let here = |e: &Engine| {
        let (_, handles) = rules.find("db").unwrap();
        let key = crate::store::BucketKey::global(handles.ids[0]);
        e.buckets().check(&key, rules.algorithm(key.limit).unwrap(), clock.now(), 0).status.remaining
    };
    let pending = begin();
    assert_eq!(here(&e), 7, "the local limit took its part before Redis is asked");
    // While it waits, the slot is taken.
    match e.begin(e.prepare(&rules, &req).unwrap(), clock.now()) {
        Step::Done(a) => assert_eq!(a.verdict, Verdict::ConcurrencyLimited),
        Step::Remote(_) => panic!("one slot"),
    }
    // The caller went away: both come back at once.
    e.abandon(*pending);
    assert_eq!(here(&e), 10);
    let again = begin();
    assert_eq!(here(&e), 7, "the slot was free again");
    // Dropped without a word (a panic, a forgotten decision): the slot still comes back.
    drop(again);
    drop(begin());
}

#[test]
fn a_replicated_concurrency_limit_admits_within_its_fresh_lease_only() {
    use crate::Verdict;
    const LEASED: &str = "resources:\n  - name: db\n    concurrency: { max_in_flight: 10 }\n";
    let (clock, e, replica) = replicated_engine(LEASED);
    replica.set_up(true);
    let rules = e.rules_full();
    let none: HashMap<String, String> = HashMap::new();
    let req = Request::new("db", &none);
    let verdict = || e.decide(e.prepare(&rules, &req).unwrap(), clock.now()).verdict;
    assert_eq!(verdict(), Verdict::ConcurrencyLimited, "no lease yet: nothing, not the outage share");
    let prepared = e.prepare(&rules, &req).unwrap();
    e.views().guarded(&prepared).unwrap().set_lease(2, clock.now().saturating_add(Duration::from_secs(1)), 2);
    assert_eq!((verdict(), verdict(), verdict()), (Verdict::Allowed, Verdict::Allowed, Verdict::ConcurrencyLimited));
    clock.advance(Duration::from_secs(1));
    e.views().guarded(&prepared).unwrap().set_lease(5, clock.now(), 5);
    assert_eq!(verdict(), Verdict::ConcurrencyLimited, "a stale lease takes no call");
    // Redis away: this replica's share of the limit (10 / 1 live), counting
    // the two it holds.
    replica.set_up(false);
    let admitted = (0..20).filter(|_| verdict() == Verdict::Allowed).count();
    assert_eq!(admitted, 8);
}

#[test]
fn a_probe_grant_goes_back_when_dropped_unless_a_permit_took_it() {
    use crate::breaker::Outcome;
    let sync = Replica::new();
    drop(sync.probe_granted("pay", 7));
    let back = sync.take_outbox();
    assert_eq!(back.len(), 1);
    assert_eq!((back[0].resource.as_str(), back[0].generation, back[0].outcome), ("pay", 7, Outcome::Ignored));
    assert_eq!(sync.probe_granted("pay", 8).keep(), 8);
    assert!(sync.take_outbox().is_empty(), "kept by a permit: its report says how it went");
}
