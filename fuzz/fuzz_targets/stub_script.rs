//! Fuzz target `stub_script`: the body is `phrony_fuzz::stub_script` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::stub_script(data);
});
