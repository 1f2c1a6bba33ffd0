//! Fuzz target `snapshot_json`: the body is `phrony_fuzz::snapshot_json` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::snapshot_json(data);
});
