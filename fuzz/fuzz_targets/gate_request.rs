//! Fuzz target `gate_request`: the body is `phrony_fuzz::gate_request` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::gate_request(data);
});
