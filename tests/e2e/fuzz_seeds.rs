//! Replays the fuzzers' committed seeds (fuzz/seeds/, crash reproducers
//! included) through the same entry points the fuzzers drive, on every run of
//! the suite, so a fixed crash stays fixed. A local fuzzing corpus
//! (fuzz/corpus/, not committed) is replayed too when present.

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("rules", floodgate_server::fuzz::rules),
    ("requests", floodgate_server::fuzz::requests),
    ("envoy_config", floodgate_server::fuzz::envoy_config),
];

#[test]
fn every_seed_runs_through_its_target_without_a_panic() {
    let fuzz = crate::support::repo_path("fuzz");
    for &(target, run) in TARGETS {
        let mut replayed = 0;
        for dir in ["seeds", "corpus"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else { continue };
            for entry in entries {
                let path = entry.unwrap().path();
                run(&std::fs::read(&path).unwrap());
                replayed += 1;
            }
        }
        assert!(replayed >= 5, "only {replayed} inputs for the {target} fuzzer");
    }
}
