//! traffic.lua, run by a real redis-server: the replicas' units of a minute
//! add up, a day's peak is the busiest minute's sum, and a full part of a
//! day takes no new key.

use floodgate_redis::testing::traffic_lua;
use floodgate_test_support::redis::RedisServer;

const MINUTE: &str = "fg:t:{test}:m:100";
const PART_A: &str = "fg:t:{test}:d:1:0";
const PART_B: &str = "fg:t:{test}:d:1:1";

/// One replica's send: `sends` as (key, units, index in KEYS of its part);
/// at most `most` keys a part. Returns the units not recorded.
fn send(con: &mut redis::Connection, minute: &str, most: u64, sends: &[(&str, u64, u64)]) -> u64 {
    let script = redis::Script::new(traffic_lua());
    let mut invocation = script.key(minute);
    invocation.key(PART_A).key(PART_B);
    invocation.arg(300_000).arg(86_400_000).arg(most);
    for (key, units, part) in sends {
        invocation.arg(*key).arg(*units).arg(*part);
    }
    invocation.invoke(con).expect("traffic.lua runs")
}

fn peak(con: &mut redis::Connection, part: &str, key: &str) -> Option<u64> {
    redis::cmd("HGET").arg(part).arg(key).query(con).expect("HGET")
}

#[test]
fn the_replicas_units_of_a_minute_add_up_to_the_days_peak() {
    let server = RedisServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    // Two replicas send a's units of minute 100, in three sends.
    assert_eq!(send(&mut con, MINUTE, 10, &[("a", 30, 2), ("b", 4, 3)]), 0);
    assert_eq!(send(&mut con, MINUTE, 10, &[("a", 20, 2)]), 0);
    assert_eq!(send(&mut con, MINUTE, 10, &[("a", 5, 2)]), 0);
    assert_eq!(peak(&mut con, PART_A, "a"), Some(55));
    assert_eq!(peak(&mut con, PART_B, "b"), Some(4));
    // A quieter minute later that day leaves the peak; a busier one raises it.
    let later = "fg:t:{test}:m:101";
    send(&mut con, later, 10, &[("a", 40, 2)]);
    assert_eq!(peak(&mut con, PART_A, "a"), Some(55));
    send(&mut con, later, 10, &[("a", 20, 2)]);
    assert_eq!(peak(&mut con, PART_A, "a"), Some(60));
    // Every key expires: the minute's soon, the day's after it.
    let ttl: i64 = redis::cmd("PTTL").arg(later).query(&mut con).unwrap();
    assert!(ttl > 0 && ttl <= 300_000, "{ttl}");
    let ttl: i64 = redis::cmd("PTTL").arg(PART_A).query(&mut con).unwrap();
    assert!(ttl > 300_000 && ttl <= 86_400_000, "{ttl}");
}

#[test]
fn a_full_part_of_a_day_takes_no_new_key_but_keeps_counting_its_own() {
    let server = RedisServer::start();
    let mut con = redis::Client::open(server.url()).unwrap().get_connection().unwrap();
    assert_eq!(send(&mut con, MINUTE, 2, &[("a", 1, 2), ("b", 1, 2)]), 0);
    // The part holds 2 keys: c's 7 units are not recorded, a's still are.
    assert_eq!(send(&mut con, MINUTE, 2, &[("c", 7, 2), ("a", 3, 2)]), 7);
    assert_eq!(peak(&mut con, PART_A, "c"), None);
    assert_eq!(peak(&mut con, PART_A, "a"), Some(4));
    let counted: Option<u64> = redis::cmd("HGET").arg(MINUTE).arg("c").query(&mut con).unwrap();
    assert_eq!(counted, None, "a key refused is not in the minute's sums either");
    // The other part has room.
    assert_eq!(send(&mut con, MINUTE, 2, &[("c", 7, 3)]), 0);
    assert_eq!(peak(&mut con, PART_B, "c"), Some(7));
}
