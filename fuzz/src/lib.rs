//! The bodies of the fuzz targets: each takes arbitrary bytes through one public entry point that
//! reads untrusted input and panics only when an invariant breaks (a panic inside the entry point
//! is the bug the fuzzer looks for; an error must be an `Err` of bounded size). Each returns
//! whether the input was accepted, so the replay test can check that a corpus reaches past the
//! parser.
//!
//! Used by the cargo-fuzz binaries in `fuzz_targets/` and, on the stable toolchain, by the corpus
//! replay test `tests/tests/fuzz_corpus.rs` (which includes this file), so the targets cannot rot.

mod interactive_stream;
mod work_stream;

pub use interactive_stream::interactive_stream;
pub use work_stream::work_stream;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

use phrony_gate::signing::{self, SignedRequest};
use phrony_gate::{
    DecisionRequest, FlagRules, Gate, MemoryStore, Settings, SigningKey, SystemClock,
};
use phrony_manifest::{BundleLock, CompiledAgent, StubScript};
use phrony_policy::{PolicyDef, PolicySet, Request, SessionCtx, ToolCtx, Trigger};
use serde_json::Value;

/// The largest error message an input may produce: a fixed allowance plus a multiple of the
/// input (a message may quote the input, but must not grow without bound).
fn error_bound(input: &[u8]) -> usize {
    64 * 1024 + 8 * input.len()
}

/// Checks a refusal's message; returns `false` (the input was refused).
#[track_caller]
fn bounded(what: &str, input: &[u8], message: &str) -> bool {
    assert!(
        message.len() <= error_bound(input),
        "{what}: an error of {} bytes for {} bytes of input",
        message.len(),
        input.len()
    );
    assert!(!message.trim().is_empty(), "{what}: an empty error message");
    false
}

thread_local! {
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// A per-thread scratch directory (created once).
fn scratch() -> PathBuf {
    SCRATCH.with(|dir| {
        let mut dir = dir.borrow_mut();
        if dir.is_none() {
            *dir = Some(tempfile::tempdir().expect("a scratch directory"));
        }
        dir.as_ref()
            .map(|d| d.path().to_path_buf())
            .expect("just created")
    })
}

/// The authoring YAML pipeline: an `agent.yaml` is read, parsed, validated and compiled. A
/// compiled agent's snapshot reads back to the same agent and validates.
pub fn manifest_yaml(data: &[u8]) -> bool {
    let path = scratch().join("agent.yaml");
    std::fs::write(&path, data).expect("writing the scratch manifest");
    match phrony_manifest::load_agent(&path) {
        Ok(compiled) => {
            let json = compiled.agent.snapshot_json();
            let back = CompiledAgent::from_snapshot_json(&json)
                .expect("a compiled agent's snapshot reads back");
            assert_eq!(
                back, compiled.agent,
                "the snapshot round trip changed the agent"
            );
            true
        }
        Err(diagnostics) => bounded("manifest", data, &diagnostics.to_string()),
    }
}

/// The compiled snapshot reader and its validator. A snapshot that reads back serializes
/// canonically to one that reads back equal, with the same content hash.
pub fn snapshot_json(data: &[u8]) -> bool {
    match CompiledAgent::from_snapshot_json(data) {
        Ok(agent) => {
            let valid = match agent.validate() {
                Ok(()) => true,
                Err(diagnostics) => bounded("snapshot validate", data, &diagnostics.to_string()),
            };
            let again = CompiledAgent::from_snapshot_json(&agent.snapshot_json())
                .expect("a snapshot the reader accepted, written again, reads back");
            assert_eq!(again, agent, "the snapshot round trip changed the agent");
            assert_eq!(again.content_hash(), agent.content_hash());
            valid
        }
        Err(e) => bounded("snapshot", data, &e.to_string()),
    }
}

/// The condition compiler and evaluator: `{"policies": [PolicyDef…], "args": {…}, "principal":
/// {…}, "metadata": {…}, "now": unix}`. A set that compiles decides, explains and routes every
/// dispatch failure without panicking, and `explain` agrees with `evaluate`.
pub fn policy_conditions(data: &[u8]) -> bool {
    let Ok(input) = serde_json::from_slice::<Value>(data) else {
        return false;
    };
    let defs: Vec<PolicyDef> = match serde_json::from_value(input["policies"].clone()) {
        Ok(defs) => defs,
        Err(e) => return bounded("policy definitions", data, &e.to_string()),
    };
    let set = match PolicySet::compile(defs) {
        Ok(set) => set,
        Err(errors) => return bounded("policy compile", data, &errors.to_string()),
    };
    let args = input.get("args").cloned().unwrap_or(Value::Null);
    let principal = input.get("principal").cloned().unwrap_or(Value::Null);
    let metadata = input.get("metadata").cloned().unwrap_or(Value::Null);
    let now = input.get("now").and_then(Value::as_i64).unwrap_or(0);
    let tool = input
        .get("tool")
        .and_then(Value::as_str)
        .unwrap_or("payments.issue-refund");
    let session = SessionCtx {
        id: "ses_fuzz",
        metadata: Some(&metadata),
    };
    let request = Request::new(ToolCtx::new(tool), &args)
        .with_principal(&principal)
        .with_session(session)
        .at(now);
    let decision = set.evaluate(&request);
    let explanation = set.explain(&request);
    assert_eq!(explanation.decision.kind(), decision.kind());
    let _ = explanation.to_string();
    let _ = serde_json::to_string(&explanation).expect("an explanation serializes");
    for trigger in Trigger::ALL {
        let _ = set.evaluate_failure(&request, trigger);
    }
    true
}

/// The bundle lock parser: a lock that parses writes back to bytes that parse to it, and its
/// body hashes.
pub fn bundle_lock(data: &[u8]) -> bool {
    match BundleLock::parse(data) {
        Ok(lock) => {
            let again = BundleLock::parse(&lock.to_file_bytes()).expect("a written lock parses");
            assert_eq!(again, lock, "the lock round trip changed it");
            // What a reader checks the lock's `version` against.
            let _ = BundleLock::body_hash(&lock.root_child_name, &lock.members);
            true
        }
        Err(e) => bounded("lock", data, &e.to_string()),
    }
}

/// The stub script parser.
pub fn stub_script(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    match StubScript::parse(text) {
        Ok(script) => {
            let _ = script.tool_names();
            true
        }
        Err(e) => bounded("stub script", data, &e.to_string()),
    }
}

thread_local! {
    static GATE: RefCell<Option<(tokio::runtime::Runtime, Gate, u32)>> = const { RefCell::new(None) };
}

/// Decisions a gate makes before the target opens a fresh one (its memory store keeps every
/// decision).
const DECISIONS_PER_GATE: u32 = 256;

/// The signing key of every fuzzing gate (generated once per process; RSA generation is slow).
fn gate_key() -> SigningKey {
    let path = scratch().join("gate-key.pem");
    SigningKey::load_or_create(&path).expect("a gate signing key")
}

fn open_gate() -> (tokio::runtime::Runtime, Gate, u32) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let rules = FlagRules {
        deny_over: Some(5000.into()),
        escalate_over: Some(250.into()),
        deny_tools: ["payments:wire".to_owned()].into(),
        deny_all: false,
    };
    let settings = Settings::flags(rules, Some("adm_fuzz_key_0123456789".to_owned()));
    let gate = runtime
        .block_on(Gate::open(
            settings,
            gate_key(),
            Arc::new(MemoryStore::new()),
            Arc::new(SystemClock),
        ))
        .expect("a flags-mode gate opens");
    (runtime, gate, 0)
}

/// The Decision API request body: parsed, then decided by a flags-mode gate (amount rules,
/// escalation, idempotency). A 5xx answer is a bug; a refusal is a 4xx with a message.
pub fn gate_request(data: &[u8]) -> bool {
    let request = match DecisionRequest::from_json(data) {
        Ok(request) => request,
        Err(e) => {
            assert!(
                e.status < 500,
                "a body was answered {}: {}",
                e.status,
                e.detail
            );
            return bounded("decision body", data, &e.detail);
        }
    };
    GATE.with(|cell| -> bool {
        let mut cell = cell.borrow_mut();
        if cell
            .as_ref()
            .is_none_or(|(_, _, n)| *n >= DECISIONS_PER_GATE)
        {
            *cell = Some(open_gate());
        }
        let (runtime, gate, decisions) = cell.as_mut().expect("just opened");
        *decisions += 1;
        let caller = gate
            .authenticate_key(Some("rgnt_ctrl_fuzz"))
            .expect("flags mode accepts any key");
        match runtime.block_on(gate.decide(&caller, request, None)) {
            Ok(answer) => {
                assert!(answer.is_object(), "a decision is a JSON object");
                true
            }
            Err(e) => {
                assert!(
                    e.status < 500,
                    "a body was answered {}: {}",
                    e.status,
                    e.detail
                );
                bounded("decision", data, &e.detail)
            }
        }
    })
}

/// The signature headers: the input is `signature-input`, `signature`, `content-digest`,
/// `x-agent-signature` and `x-agent-signature-timestamp` header values, one a line, then the
/// body. RFC 9421 and HMAC verification refuse anything they cannot check with a message
/// (accepted: the `Signature-Input` names a key).
pub fn gate_signature(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(6, '\n');
    let mut next = || lines.next().unwrap_or_default().to_owned();
    let (input, signature, digest, hmac, timestamp, body) =
        (next(), next(), next(), next(), next(), next());
    let header = |name: &str| -> Vec<String> {
        let value = match name {
            "signature-input" => &input,
            "signature" => &signature,
            "content-digest" => &digest,
            "content-type" => "application/json",
            _ => return Vec::new(),
        };
        if value.is_empty() {
            Vec::new()
        } else {
            vec![value.to_owned()]
        }
    };
    let keyid = match signing::rfc9421_keyid(&input) {
        Ok(_) => true,
        Err(e) => bounded("keyid", data, &e),
    };
    let request = SignedRequest {
        method: "POST",
        authority: "127.0.0.1:8009",
        path: "/v1/control/decisions",
        header: &header,
        body: body.as_bytes(),
    };
    // The RFC 8032 test key 1 (public half): no fuzzed signature is expected to verify.
    let public = [
        0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07,
        0x3a, 0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07,
        0x51, 0x1a,
    ];
    let now = 1_767_225_600;
    if let Err(e) = signing::verify_rfc9421(&request, &public, now, 300) {
        bounded("rfc9421", data, &e);
    }
    let timestamp = (!timestamp.is_empty()).then_some(timestamp.as_str());
    if let Err(e) = signing::verify_hmac(
        "rgnt_ctrl_fuzz",
        "agent_fuzz",
        body.as_bytes(),
        &hmac,
        timestamp,
        now,
        300,
    ) {
        bounded("hmac", data, &e);
    }
    keyid
}
