use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::*;
use crate::limiter::rate::Rate;
use crate::limiter::{fixed_window, token_bucket};

const SEC: u64 = 1_000_000_000;

fn t(secs: u64) -> Timestamp {
    Timestamp::from_secs(1_700_006_400 + secs)
}

fn tb(capacity: u64) -> Algorithm {
    Algorithm::TokenBucket(token_bucket::Config::new(capacity, Rate::whole_per_second(1)))
}

fn key(name: &str) -> BucketKey {
    BucketKey::new(LimitId(1), [name])
}

#[test]
fn keys_are_independent() {
    let store = Buckets::new(usize::MAX);
    let alg = tb(1);
    assert!(store.acquire(key("a"), &alg, t(0), 1).admitted);
    assert!(!store.acquire(key("a"), &alg, t(0), 1).admitted);
    assert!(store.acquire(key("b"), &alg, t(0), 1).admitted);
    assert_eq!(store.len(), 2);
}

#[test]
fn check_creates_nothing_and_consumes_nothing() {
    let store = Buckets::new(usize::MAX);
    let alg = tb(1);
    assert!(store.check(&key("a"), &alg, t(0), 1).admitted);
    assert!(store.is_empty());
    assert!(store.acquire(key("a"), &alg, t(0), 1).admitted);
    assert!(!store.check(&key("a"), &alg, t(0), 1).admitted);
}

#[test]
fn sweep_drops_idle_buckets_and_removed_limits() {
    let store = Buckets::new(usize::MAX);
    let alg = tb(2);
    store.acquire(key("a"), &alg, t(0), 1);
    store.acquire(key("b"), &alg, t(0), 2);
    store.acquire(BucketKey::new(LimitId(9), ["gone"]), &alg, t(0), 1);
    let lookup = |id: LimitId| (id == LimitId(1)).then_some(&alg);
    // At 1 s, 'a' (1 token short) is full again; 'b' still needs a second.
    assert_eq!(store.sweep(t(1), lookup), 2);
    assert!(!store.contains(&key("a")));
    assert!(store.contains(&key("b")));
    assert_eq!(store.sweep(t(2), lookup), 1);
    assert!(store.is_empty());
    assert_eq!(store.evicted(), 3);
}

/// A store of `n` buckets of `alg`, each one token short at t(0).
fn filled(n: u64, alg: &Algorithm) -> Buckets {
    let store = Buckets::new(usize::MAX);
    for i in 0..n {
        store.acquire(key(&i.to_string()), alg, t(0), 1);
    }
    store
}

#[test]
fn a_sweep_that_empties_a_large_table_shrinks_it() {
    let alg = tb(2);
    let store = filled(200_000, &alg);
    // A few keys stay busy: the table keeps room for them, not the burst.
    for i in 0..10u64 {
        store.acquire(key(&format!("busy-{i}")), &alg, t(0), 2);
    }
    let grown = store.capacity();
    assert!(grown >= 200_000, "{grown}");
    let lookup = |id: LimitId| (id == LimitId(1)).then_some(&alg);
    assert_eq!(store.sweep(t(1), lookup), 200_000);
    let shrunk = store.capacity();
    assert!(shrunk < SHRINK_ABOVE * 2, "{grown} -> {shrunk}");
    assert_eq!(store.len(), 10);
    assert!(store.contains(&key("busy-3")));
}

#[test]
fn a_small_table_is_left_as_it_is() {
    let alg = tb(2);
    let store = filled(1000, &alg);
    let before = store.capacity();
    let lookup = |id: LimitId| (id == LimitId(1)).then_some(&alg);
    assert_eq!(store.sweep(t(1), lookup), 1000);
    // Shrunk to fit, it would have room for next to nothing.
    let after = store.capacity();
    assert!(
        after * 10 >= before * 9,
        "a table under SHRINK_ABOVE is not rehashed after each sweep: {before} -> {after}"
    );
}

#[test]
fn max_keys_evicts_the_least_recently_used_first() {
    let store = Buckets::new(3);
    let alg = tb(10);
    store.acquire(key("a"), &alg, t(1), 1);
    store.acquire(key("b"), &alg, t(2), 1);
    store.acquire(key("c"), &alg, t(3), 1);
    store.acquire(key("a"), &alg, t(4), 1); // 'a' is now the most recent
    store.acquire(key("d"), &alg, t(5), 1);
    assert_eq!(store.len(), 3);
    assert!(!store.contains(&key("b")), "b was least recently used");
    assert!(store.contains(&key("a")) && store.contains(&key("c")) && store.contains(&key("d")));
    store.acquire(key("e"), &alg, t(6), 1);
    assert!(!store.contains(&key("c")));
    assert_eq!(store.evicted(), 2);
}

#[test]
fn a_flood_of_keys_stays_bounded() {
    let store = Buckets::new(1000);
    let alg = tb(10);
    for i in 0..20_000u64 {
        store.acquire(key(&i.to_string()), &alg, Timestamp::from_nanos(t(0).as_nanos() + i), 1);
        assert!(store.len() <= 1000);
    }
    // The most recent keys survive.
    assert!(store.contains(&key("19999")));
    assert!(!store.contains(&key("0")));
}

#[test]
fn max_bytes_evicts_the_least_recently_used_first_and_counts_every_removal() {
    let mut store = Buckets::new(usize::MAX);
    store.set_max_bytes(1000);
    let alg = tb(10);
    // Ten keys of 100 bytes fit; the eleventh passes the bound.
    let long = |c: char| key(&c.to_string().repeat(100));
    for (i, c) in ('a'..='j').enumerate() {
        store.acquire(long(c), &alg, t(i as u64), 1);
    }
    assert_eq!((store.len(), store.bytes()), (10, 1000));
    store.acquire(long('a'), &alg, t(20), 1); // 'a' is now the most recent
    store.acquire(long('k'), &alg, t(21), 1);
    assert!(store.bytes() <= 1000, "{} bytes", store.bytes());
    assert!(!store.contains(&long('b')), "b was least recently used");
    assert!(store.contains(&long('a')) && store.contains(&long('k')));
    // Short keys are many to the same bytes: the bound is on bytes, not keys.
    for i in 0..200u64 {
        store.acquire(key(&format!("{i:04}")), &alg, t(100 + i), 1);
    }
    assert!(store.bytes() <= 1000 && store.len() > 100, "{} keys, {} bytes", store.len(), store.bytes());
    // What a sweep or a removal forgets leaves the count.
    let held = store.bytes();
    store.remove(&key("0199"));
    assert_eq!(store.bytes(), held - 4);
    store.sweep(t(10_000), |_| Some(&alg));
    assert_eq!((store.len(), store.bytes()), (0, 0), "every bucket refilled and went");
}

#[test]
fn a_flood_of_long_keys_stays_within_the_bytes() {
    let mut store = Buckets::new(usize::MAX);
    store.set_max_bytes(100_000);
    let alg = tb(10);
    for i in 0..20_000u64 {
        let name = format!("{i:0>256}");
        store.acquire(key(&name), &alg, Timestamp::from_nanos(t(0).as_nanos() + i), 1);
        assert!(store.bytes() <= 100_000, "{} bytes after {i}", store.bytes());
    }
    assert!(store.len() >= 300, "{}", store.len());
}

#[test]
fn concurrent_callers_never_overdraw_one_bucket() {
    let store = Arc::new(Buckets::new(usize::MAX));
    let alg = Arc::new(Algorithm::FixedWindow(fixed_window::Config::new(1000, 3600 * SEC)));
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (store, alg) = (store.clone(), alg.clone());
                s.spawn(move || (0..600).filter(|_| store.acquire(key("hot"), &alg, t(0), 1).admitted).count())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 1000);
}

#[test]
fn credits_topped_up_are_never_evicted_nor_swept_but_debts_may_be() {
    let store = Buckets::new(3);
    let credits = Algorithm::Balance(crate::limiter::balance::Config::new(1_000));
    // Topped up: a give-back to an empty balance.
    store.force(key("paid"), &credits, t(1), 0);
    store.refund(&key("paid"), &credits, t(1), 500);
    store.force(key("owes"), &credits, t(2), 7);
    let alg = tb(10);
    for (i, k) in ["a", "b", "c", "d"].iter().enumerate() {
        store.acquire(key(k), &alg, t(3 + i as u64), 1);
    }
    assert!(store.contains(&key("paid")), "topped-up credits were evicted");
    assert!(!store.contains(&key("owes")), "the debt is the least recently used key");
    assert_eq!(store.check(&key("paid"), &credits, t(100), 0).status.remaining, 500);
    // Long idle, the credits stay: a balance never comes back on its own.
    let swept = store.sweep(Timestamp::from_secs(4_000_000_000), |_| Some(&credits));
    assert!(store.contains(&key("paid")), "swept {swept}");
}

/// A sweep may forget a key that another thread has just created, and an
/// eviction may scan while a sweep empties the store. Neither may take a busy
/// key for the least recently used one: forgotten, a busy and exhausted key
/// admits its whole limit again. (Two defects did so: the count of keys went
/// below zero for a moment and wrapped round, and an eviction scanning during
/// a sweep saw only the busy keys left.)
#[test]
fn a_sweep_racing_new_keys_never_evicts_a_busy_key() {
    let store = Buckets::new(1000);
    // Each new key is idle at once (it takes nothing), so a sweep may drop it
    // the moment it exists. The busy keys are exhausted and refill slowly.
    let churn = tb(10);
    let strict = tb(5);
    let busy = |i: u64| BucketKey::new(LimitId(2), [format!("busy-{i}").as_str()]);
    // Each call reads a clock one nanosecond later than the last.
    let clock = AtomicU64::new(t(0).as_nanos());
    let tick = || Timestamp::from_nanos(clock.fetch_add(1, Ordering::Relaxed));
    for i in 0..5 {
        assert!(store.acquire(busy(i), &strict, tick(), 5).admitted);
    }
    let stop = AtomicBool::new(false);
    let readmitted: usize = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                store.sweep(tick(), |id| Some(if id == LimitId(1) { &churn } else { &strict }));
            }
        });
        // Each thread creates a key and then uses a busy one, so every busy
        // key is always among the ten or so most recently used of a thousand.
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (store, churn, strict, stop, tick) = (&store, &churn, &strict, &stop, &tick);
                s.spawn(move || {
                    let (mut i, mut readmitted) = (0u64, 0);
                    while !stop.load(Ordering::Relaxed) {
                        store.acquire(key(&format!("churn-{w}-{i}")), churn, tick(), 0);
                        readmitted += usize::from(store.acquire(busy(i % 5), strict, tick(), 1).admitted);
                        i += 1;
                    }
                    readmitted
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(readmitted, 0, "busy, exhausted keys were forgotten and admitted again");
    assert!(store.evicted() > 1000, "the race needs evictions: {}", store.evicted());
}

/// Buckets added, removed one by one, swept in part and in whole, in a
/// pseudo-random order: the store holds exactly the keys a plain set says,
/// each with its own state, whatever moved inside a shard meanwhile.
#[test]
fn the_store_holds_what_a_plain_set_says_through_removals_and_sweeps() {
    let alg = tb(3);
    let store = Buckets::new(usize::MAX);
    let mut model = std::collections::HashSet::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    for round in 0..20_000u64 {
        let k = next(3_000);
        // Long and short scopes, so that reclaimed scope bytes are many.
        let name = if k % 3 == 0 { format!("{k:0>200}") } else { k.to_string() };
        match next(10) {
            0..=5 => {
                store.acquire(key(&name), &alg, t(0), 1);
                model.insert(name);
            }
            6..=8 => {
                store.remove(&key(&name));
                model.remove(&name);
            }
            _ if round % 1000 == 999 => {
                // Every bucket refilled: a sweep forgets them all.
                store.sweep(t(100), |_| Some(&alg));
                model.clear();
            }
            _ => {
                // A bucket taken twice more than the others stays busy
                // through a sweep at t(1); the others (one token taken) go.
                store.acquire(key(&name), &alg, t(0), 2);
                model.insert(name.clone());
                store.sweep(t(1), |_| Some(&alg));
                model.retain(|n| store.contains(&key(n)));
                assert!(store.contains(&key(&name)), "a busy bucket was swept");
            }
        }
        assert_eq!(store.len(), model.len(), "round {round}");
    }
    for k in 0..3_000u64 {
        let name = if k % 3 == 0 { format!("{k:0>200}") } else { k.to_string() };
        assert_eq!(store.contains(&key(&name)), model.contains(&name), "{name}");
    }
    let bytes: usize = model.iter().map(|n| key(n).scope.len()).sum();
    assert_eq!(store.bytes(), bytes);
}

/// A panic while the sweep held its lock must not stop evictions for good:
/// the bound on keys would be lost.
#[test]
fn evictions_go_on_after_a_panic_in_a_sweep() {
    let store = Buckets::new(10);
    let alg = tb(10);
    store.acquire(key("a"), &alg, t(0), 1);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        store.sweep(t(0), |_| -> Option<&Algorithm> { panic!("a lookup that fails") });
    }));
    assert!(panicked.is_err());
    for i in 0..100u64 {
        store.acquire(key(&i.to_string()), &alg, t(1).add_nanos(i), 1);
    }
    assert!(store.len() <= 10, "{} keys held with --max-keys 10", store.len());
}

/// `put` replaces a held bucket's state, and creates a key as `acquire`
/// does: counted, and evicting beyond the bound.
#[test]
fn put_replaces_or_creates_and_counts() {
    let store = Buckets::new(2);
    let alg = tb(10);
    store.acquire(key("a"), &alg, t(0), 10);
    assert!(!store.check(&key("a"), &alg, t(0), 1).admitted);
    store.put(key("a"), alg.new_bucket(t(0)), t(1));
    assert!(store.check(&key("a"), &alg, t(1), 10).admitted, "the full bucket put replaced the empty one");
    assert_eq!(store.len(), 1);
    store.put(key("b"), alg.new_bucket(t(2)), t(2));
    store.put(key("c"), alg.new_bucket(t(3)), t(3));
    assert_eq!(store.len(), 2);
    assert!(!store.contains(&key("a")), "the least recently used went");
}
