//! Fuzz target `gate_signature`: the body is `phrony_fuzz::gate_signature` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::gate_signature(data);
});
