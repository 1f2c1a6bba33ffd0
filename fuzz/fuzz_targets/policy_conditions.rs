//! Fuzz target `policy_conditions`: the body is `phrony_fuzz::policy_conditions` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::policy_conditions(data);
});
