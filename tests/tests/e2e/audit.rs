//! `phrony audit verify` and `phrony audit export` end to end: the real CLI against the real
//! daemon (the tampering cases are in `bins/runtime/tests/runtime/audit.rs` and the ledger's
//! conformance suite).

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tests::cli::{fails, ok};
use tests::daemon::{Backend, Daemon};

const MANIFEST: &str = "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: triage
  namespace: audit
  version: 1.0.0
  owner: platform-team
spec:
  purpose: Route tickets.
  instructions:
    text: Read the ticket and pick a queue.
  model:
    provider: openai
    name: gpt-4o
";

/// An exported line's hash, recomputed from the line alone by the documented rule (the
/// `phrony.event.v1` array, with the attribution appended when the event records one).
fn recomputed_hash(e: &Value) -> String {
    let mut input = json!([
        "phrony.event.v1",
        e["stream"],
        e["seq"],
        e["type"],
        e["ts"],
        e["actor"],
        e["call_id"],
        e["turn"],
        e["payload"],
        e["prev_hash"],
    ]);
    if !e["actor_verification"].is_null() {
        let items = input.as_array_mut().unwrap();
        items.push(e["actor_verification"].clone());
        items.push(e["actor_via"].clone());
    }
    hex::encode(Sha256::digest(input.to_string().as_bytes()))
}

fn audit(backend: Backend) {
    let Some(daemon) = Daemon::start(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let manifest = project.path().join("agent.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let phrony = || tests::cli::phrony(&daemon, "ci-auditor");
    ok(phrony().args(["agents", "publish"]).arg(&manifest));
    ok(phrony().args(["agents", "deploy", "audit/triage@1.0.0"]));

    // The agent's two events and the key introduction of the first start.
    assert_eq!(
        ok(phrony().args(["audit", "verify"])),
        "verified 3 events in 2 streams\n"
    );
    assert_eq!(
        ok(phrony().args(["audit", "verify", "--all"])),
        "verified 3 events in 2 streams\n"
    );
    assert_eq!(
        ok(phrony().args(["audit", "verify", "--agent", "audit/triage"])),
        "verified 2 events in 1 streams\n"
    );
    let err = fails(phrony().args(["audit", "verify", "--session", "run_missing"]));
    assert!(err.contains("run_missing"), "{err}");
    let err = fails(phrony().args(["audit", "verify", "--agent", "nonamespace"]));
    assert!(err.contains("NS/NAME"), "{err}");

    let jsonl = ok(phrony().args(["audit", "export"]));
    let events: Vec<Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{jsonl}");
    assert_eq!(events[0]["stream"], "agent:audit/triage");
    assert_eq!(events[0]["type"], "agent.version_published");
    assert_eq!(events[0]["payload"]["owner"], "platform-team");
    assert_eq!(events[1]["prev_hash"], events[0]["hash"]);
    assert_eq!(events[2]["type"], "audit.key_introduced");
    // The CLI's changes are attributed (unverified in local mode), so the export must carry
    // what the hash covers: every line recomputes to its own hash.
    assert_eq!(events[0]["actor_verification"], "unverified", "{jsonl}");
    for e in &events {
        assert_eq!(e["hash"].as_str(), Some(recomputed_hash(e).as_str()), "{e}");
    }

    let later = ok(phrony().args(["audit", "export", "--since", "2999-01-01T00:00:00Z"]));
    assert_eq!(later, "");
    let err = fails(phrony().args(["audit", "export", "--since", "yesterday"]));
    assert!(err.contains("RFC 3339"), "{err}");
}

#[test]
fn audit_verify_and_export_on_sqlite() {
    audit(Backend::Sqlite);
}

#[test]
fn audit_verify_and_export_on_postgres() {
    audit(Backend::Postgres);
}
