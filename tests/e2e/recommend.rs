//! `floodgate recommend` through the real binary: a trace file in, a limit,
//! overrides and the replay of the trace out.

use crate::support;

use std::fmt::Write as _;
use std::process::Command;

use support::*;

/// Two days of 20 tenants: tenant i sends i+1 calls every minute, except a
/// peak of 4 (i+1) at noon; `heavy` sends 400 a minute; `storm` sends 10 a
/// minute, then 1,000 a minute in the last hour.
fn trace() -> String {
    let start = 1_767_571_200u64; // 2026-01-05T00:00Z
    let mut out = String::from("# unix_seconds,key,calls\n");
    for m in 0..2 * 1440u64 {
        let at = start + m * 60;
        for i in 0..20u64 {
            let calls = if m % 1440 == 720 { 4 * (i + 1) } else { i + 1 };
            writeln!(out, "{at},tenant=t{i:02},{calls}").unwrap();
        }
        writeln!(out, "{at},tenant=heavy,400").unwrap();
        let storm = if m >= 2 * 1440 - 60 { 1000 } else { 10 };
        writeln!(out, "{at},tenant=storm,{storm}").unwrap();
    }
    out
}

#[test]
fn recommend_proposes_a_limit_and_replays_the_trace() {
    let dir = TempDir::new();
    let file = dir.write("calls.csv", &trace());
    let out = Command::new(BIN)
        .args([
            "recommend",
            "--json",
            "--quantile",
            "0.9",
            "--headroom",
            "1.5",
            "--algorithm",
            "fixed-window",
            "--trace",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 22 keys' typical peaks: 4, 8, ..., 80 for the tenants, 400 for heavy,
    // and 10 for the storm (its peaks are 10 and 1,000; the median of two
    // days is the lower one).
    assert_eq!(v["keys"], 22);
    // The 0.9 quantile of 22 peaks is the one at index round(21 x 0.9) =
    // 19 of the sorted list: 76; times 1.5, 114.
    assert_eq!(v["per_minute"], 114, "{v}");
    // Heavier keys: heavy (400 x 1.5) and t19 (80 x 1.5).
    assert_eq!(v["overrides"], serde_json::json!({"tenant=heavy": 600, "tenant=t19": 120}), "{v}");
    // The replay: only the storm's last hour is denied, 886 a minute.
    let replay = &v["replay"];
    assert_eq!(replay["denied"], 60 * 886, "{v}");
    assert_eq!(replay["keys"][0]["key"], "tenant=storm");
    assert_eq!(replay["keys"][0]["denied"], 60 * 886);

    // The text form says the same.
    let out = Command::new(BIN).args(["recommend", "--quantile", "0.9", "--trace"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Proposed limit: 114 calls a minute"), "{text}");
    assert!(text.contains("600  tenant=heavy"), "{text}");
    // The rules it prints are a resource's limits and overrides that
    // check-config accepts.
    let (_, snippet) = text.split_once("As rules (the limit's name and key are yours to set):\n").expect(&text);
    let snippet = snippet.split("\n\n").next().unwrap();
    assert!(snippet.contains("{ when: { 'tenant': 'heavy' }, limits: { recommended: 600 } }"), "{snippet}");
    let rules = dir.write("recommended.yaml", &format!("resources:\n  - name: api\n{snippet}\n"));
    let out = Command::new(BIN).arg("check-config").arg(&rules).output().unwrap();
    assert!(out.status.success(), "{snippet}\n{}", String::from_utf8_lossy(&out.stderr));

    // Values YAML would read as numbers, booleans or nothing stay text.
    let odd = trace().replace("tenant=heavy", "tenant=0x10").replace("tenant=t19", "tenant=null");
    let odd_file = dir.write("odd.csv", &odd);
    let out = Command::new(BIN).args(["recommend", "--quantile", "0.9", "--trace"]).arg(&odd_file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("{ when: { 'tenant': '0x10' }, limits: { recommended: 600 } }"), "{text}");
    assert!(text.contains("{ when: { 'tenant': 'null' }, limits: { recommended: 120 } }"), "{text}");
    let (_, snippet) = text.split_once("set):\n").expect(&text);
    let rules =
        dir.write("odd.yaml", &format!("resources:\n  - name: api\n{}\n", snippet.split("\n\n").next().unwrap()));
    let out = Command::new(BIN).arg("check-config").arg(&rules).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Keys that are not name=value pairs get no rules, and the reason.
    let bare = dir.write("bare.csv", "1767571200,alice,5\n1767571200,bob,50\n");
    let out = Command::new(BIN).args(["recommend", "--quantile", "0", "--trace"]).arg(&bare).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(No rules printed: key 'alice' is not written name=value[,name=value...].)"), "{text}");

    // Guard rails: from a limit of 1,000 in force, it goes down by 20%.
    let out = Command::new(BIN)
        .args(["recommend", "--json", "--quantile", "0.9", "--current", "1000", "--trace"])
        .arg(&file)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["per_minute"].as_u64(), v["observed"].as_u64()), (Some(800), Some(114)), "{v}");
}

#[test]
fn recommend_refuses_bad_input_by_name() {
    let dir = TempDir::new();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("recommend").args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let bad = dir.write("bad.csv", "1767571200,tenant=a,5\n1767571260,tenant=a,many\n");
    let (code, err) = run(&["--trace", bad.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("line 2: calls 'many' is not a whole number"), "{err}");
    // A device without line ends is refused at its first line, not read whole.
    let (code, err) = run(&["--trace", "/dev/zero"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("line 1: the line is longer than 4096 bytes"), "{err}");
    let (code, err) = run(&["--trace", bad.to_str().unwrap(), "--headroom", "0.5"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("headroom 0.5 is not between 1 and 1000"), "{err}");
    let empty = dir.write("empty.csv", "# nothing\n");
    let (code, err) = run(&["--trace", empty.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(err.contains("holds no calls"), "{err}");
    // A trace larger than --max-entries is refused.
    let two = dir.write("two.csv", "0,a,1\n60,a,1\n");
    let (code, err) = run(&["--trace", two.to_str().unwrap(), "--max-entries", "2"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("line 2: the history holds at most 2 pairs of a key and a minute"), "{err}");
}
