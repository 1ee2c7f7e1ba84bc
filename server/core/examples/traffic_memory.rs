//! What a limit's recorded traffic (`history: true`) takes in memory:
//! 100,000 keys written `user=<uuid>` (the most a limit keeps), each
//! counted on 14 days, measured as the growth of resident memory.
//!
//!     cargo run --release -p floodgate-core --example traffic_memory

use compact_str::CompactString;
use floodgate_core::recommend::traffic::{MAX_KEYS, Traffic};

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn main() {
    let keys: Vec<CompactString> = (0..MAX_KEYS as u64)
        .map(|i| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            format!(
                "user={:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
                h >> 32,
                h & 0xffff,
                i & 0xfff,
                (h >> 20) & 0xfff,
                h >> 16
            )
            .into()
        })
        .collect();
    let before = resident_bytes();
    let traffic = Traffic::default();
    let start = 20_000 * 86_400;
    for day in 0..14u64 {
        for k in &keys {
            traffic.count(k, 1 + day, start + day * 86_400);
        }
    }
    let after = resident_bytes();
    assert_eq!(traffic.keys(), MAX_KEYS);
    println!(
        "{} keys of {} bytes, 14 days each: {:.1} MB, {} bytes a key",
        MAX_KEYS,
        keys[0].len(),
        (after - before) as f64 / 1e6,
        (after - before) / MAX_KEYS as u64
    );
}
