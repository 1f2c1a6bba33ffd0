//! Fuzz target `work_stream`: the body is `phrony_fuzz::work_stream` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::work_stream(data);
});
