#![no_main]
//! A request body (the first byte picks the RPC): decoded, checked, decided.

libfuzzer_sys::fuzz_target!(|data: &[u8]| floodgate_server::fuzz::requests(data));
