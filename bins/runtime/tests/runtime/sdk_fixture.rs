//! The Python SDK contract tests (`tests/python/test_runtime_sdk.py`) publish a committed
//! snapshot, because the SDK cannot compile YAML. This test keeps that snapshot equal to what our
//! compiler makes of `tests/python/fixtures/refund-agent/`, so a change to the canonical form
//! shows up here with instructions instead of as a mysterious refusal in Python.
//! `PHRONY_BLESS=1 cargo test -p runtime --test runtime sdk_fixture` rewrites the snapshot.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::path::PathBuf;

#[test]
fn python_sdk_fixture_snapshot_matches_the_compiler() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/fixtures");
    let compiled = phrony_manifest::load_agent(fixtures.join("refund-agent/agent.yaml"))
        .unwrap_or_else(|d| panic!("the SDK fixture agent does not compile:\n{d}"));
    let mut want = compiled.agent.snapshot_json();
    want.push(b'\n');
    let path = fixtures.join("refund-agent.snapshot.json");
    if std::env::var("PHRONY_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the compiler produces from refund-agent/; review the change and run \
         `PHRONY_BLESS=1 cargo test -p runtime --test runtime sdk_fixture` to update it",
        path.display()
    );
}
