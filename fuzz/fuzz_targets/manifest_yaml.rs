//! Fuzz target `manifest_yaml`: the body is `phrony_fuzz::manifest_yaml` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    phrony_fuzz::manifest_yaml(data);
});
