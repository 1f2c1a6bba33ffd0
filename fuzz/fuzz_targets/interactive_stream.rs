//! Fuzz target `interactive_stream`: the body is `phrony_fuzz::interactive_stream` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::interactive_stream(data);
});
