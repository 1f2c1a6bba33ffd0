//! The short crash soak under `cargo test`: the `soak` binary (tests/src/soak) on SQLite with
//! about twenty daemon kills and a few worker faults, and a few trials on PostgreSQL. It fails
//! when any invariant breaks (a double execution, a lost vote, a gap, a chain or projection
//! that does not verify, a session that did not end `completed`); the by-hand run is
//! `cargo run -p tests --bin soak -- --trials 200`.

use std::process::Command;

/// Runs the soak binary with `args`; panics with its output when it reports a violation.
fn soak(args: &[&str]) {
    let report = tempfile::NamedTempFile::new().expect("a temporary report file");
    let out = Command::new(env!("CARGO_BIN_EXE_soak"))
        .args(args)
        .arg("--report")
        .arg(report.path())
        .output()
        .expect("the soak binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "soak {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    if stdout.contains("PostgreSQL is not available; skipped") {
        return;
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.path()).expect("the report"))
            .expect("the report is JSON");
    assert_eq!(report["duplicates"], 0, "{report:#}");
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    assert!(
        report["daemon_kills"].as_u64().unwrap_or(0) > 0,
        "no kill landed: {report:#}"
    );
}

#[test]
fn crash_soak_sqlite() {
    // 15 trials × 2 faults, about 70% of them daemon kills at commit points.
    soak(&["--backend", "sqlite", "--trials", "15", "--seed", "2026"]);
}

#[test]
fn crash_soak_postgres() {
    soak(&["--backend", "postgres", "--trials", "3", "--seed", "7"]);
}
