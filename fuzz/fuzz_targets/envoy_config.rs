#![no_main]
//! An envoyproxy/ratelimit configuration file: loaded and matched, or refused, never a panic.

libfuzzer_sys::fuzz_target!(|data: &[u8]| floodgate_server::fuzz::envoy_config(data));
