//! The fuzz targets on the stable toolchain: every committed corpus file (`fuzz/corpus/<target>/`)
//! goes through the same body the cargo-fuzz binary runs (`fuzz/src/lib.rs`, compiled here too),
//! which panics on a broken invariant and checks that every error is bounded. A target body that
//! no longer compiles, or an input that panics again, fails `cargo test`.

use std::path::{Path, PathBuf};

#[allow(
    unreachable_pub,
    reason = "the bodies are `pub` for the fuzz binaries, which are other crates"
)]
#[path = "../../fuzz/src/lib.rs"]
mod bodies;

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {} is readable: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus of {target} is empty");
    files
}

/// Replays a target's corpus: no input panics, and the corpus holds inputs the entry point
/// accepts (so the target reaches past the parser) and inputs it refuses.
fn replay(target: &str, body: fn(&[u8]) -> bool) {
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    for file in corpus(target) {
        let data = std::fs::read(&file).expect("a corpus file is readable");
        match std::panic::catch_unwind(|| body(&data)) {
            Ok(true) => accepted.push(file),
            Ok(false) => refused.push(file),
            Err(_) => panic!(
                "{target}: {} panicked (reproduce with `cargo +nightly fuzz run {target} {}`)",
                file.display(),
                file.display()
            ),
        }
    }
    assert!(
        !accepted.is_empty(),
        "{target}: no corpus input is accepted ({} refused): the target only fuzzes refusals",
        refused.len()
    );
    assert!(
        !refused.is_empty(),
        "{target}: every corpus input is accepted: add refused ones"
    );
}

#[test]
fn manifest_yaml_corpus_replays() {
    replay("manifest_yaml", bodies::manifest_yaml);
}

#[test]
fn snapshot_json_corpus_replays() {
    replay("snapshot_json", bodies::snapshot_json);
}

#[test]
fn policy_conditions_corpus_replays() {
    replay("policy_conditions", bodies::policy_conditions);
}

#[test]
fn bundle_lock_corpus_replays() {
    replay("bundle_lock", bodies::bundle_lock);
}

#[test]
fn stub_script_corpus_replays() {
    replay("stub_script", bodies::stub_script);
}

#[test]
fn gate_request_corpus_replays() {
    replay("gate_request", bodies::gate_request);
}

#[test]
fn gate_signature_corpus_replays() {
    replay("gate_signature", bodies::gate_signature);
}

#[test]
fn work_stream_corpus_replays() {
    replay("work_stream", bodies::work_stream);
}

#[test]
fn interactive_stream_corpus_replays() {
    replay("interactive_stream", bodies::interactive_stream);
}

#[test]
fn every_fuzz_target_has_a_replayed_corpus() {
    // A new target in fuzz/Cargo.toml without a corpus and a replay test above fails here.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
    let this = include_str!("fuzz_corpus.rs");
    for line in manifest.lines() {
        if let Some(name) = line
            .strip_prefix("name = \"")
            .and_then(|l| l.strip_suffix('"'))
        {
            if name == "phrony-fuzz" {
                continue;
            }
            assert!(!corpus(name).is_empty());
            assert!(
                this.contains(&format!("replay(\"{name}\", bodies::{name})")),
                "fuzz target {name} is not replayed by tests/tests/fuzz_corpus.rs"
            );
        }
    }
}
