//! The short crash soak under `cargo test`: the `soak` binary (tests/src/soak) on SQLite with
//! about twenty daemon kills and a few worker faults, and a few trials on PostgreSQL. It fails
//! when any invariant breaks (a double execution, a lost vote, a gap, a chain or projection
//! that does not verify, a session that did not end `completed`); the by-hand run is
//! `cargo run -p tests --bin soak -- --trials 200`. The database-stall runs hold SQLite's write
//! lock past the busy timeout, and crash and restart a private PostgreSQL cluster, under the
//! running daemon: besides the invariants, health must say NOT_SERVING during each stall and
//! SERVING again by itself after it.

use std::process::Command;

/// Runs the soak binary with `args`; panics with its output when it reports a violation or no
/// daemon kill landed.
fn soak(args: &[&str]) {
    if let Some(report) = run_soak(args) {
        assert!(
            report["daemon_kills"].as_u64().unwrap_or(0) > 0,
            "no kill landed: {report:#}"
        );
    }
}

/// Runs the soak binary with `args` (planning only the database stall `fault`); panics when it
/// reports a violation (a stall health did not report, or did not recover from, included) or
/// no stall landed.
fn soak_stalls(fault: &str, args: &[&str]) {
    let args = [args, &["--only", fault]].concat();
    if let Some(report) = run_soak(&args) {
        assert!(
            report["faults"][fault].as_u64().unwrap_or(0) > 0,
            "no {fault} landed: {report:#}"
        );
        assert_eq!(
            report["db_stalls_not_serving_seen"], report["db_stalls"],
            "{report:#}"
        );
        assert_eq!(
            report["db_stalls_recovered"], report["db_stalls"],
            "{report:#}"
        );
    }
}

/// Runs the soak binary; its report, `None` when it skipped PostgreSQL.
fn run_soak(args: &[&str]) -> Option<serde_json::Value> {
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
        return None;
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.path()).expect("the report"))
            .expect("the report is JSON");
    assert_eq!(report["duplicates"], 0, "{report:#}");
    assert_eq!(report["violations"], serde_json::json!([]), "{report:#}");
    Some(report)
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

#[test]
fn database_stall_soak_sqlite_locked() {
    // 2 trials × 1 stall: the write lock held past the (3 s) busy timeout, about 5 s each.
    soak_stalls(
        "db_locked",
        &[
            "--backend",
            "sqlite",
            "--trials",
            "2",
            "--faults",
            "1",
            "--seed",
            "11",
        ],
    );
}

#[test]
fn database_stall_soak_postgres_restarted() {
    // 1 trial × 2 restarts of the private cluster the trial runs on (about 30 s).
    soak_stalls(
        "db_restart",
        &[
            "--backend",
            "postgres",
            "--trials",
            "1",
            "--faults",
            "2",
            "--seed",
            "5",
        ],
    );
}
