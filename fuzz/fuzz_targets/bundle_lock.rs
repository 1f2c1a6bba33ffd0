//! Fuzz target `bundle_lock`: the body is `phrony_fuzz::bundle_lock` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::bundle_lock(data);
});
