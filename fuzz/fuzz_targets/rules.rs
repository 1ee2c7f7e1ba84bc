#![no_main]
//! A rules file (YAML): validated or refused, never a panic.

libfuzzer_sys::fuzz_target!(|data: &[u8]| floodgate_server::fuzz::rules(data));
