//! Unit tests of the service on an in-memory ledger, calling the trait methods directly. The
//! daemon's integration tests drive the same RPCs over the network.

use std::path::Path;

use pb::runtime_server::Runtime as _;
use phrony_ledger::Ledger;
use phrony_proto::runtime::v1 as pb;
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Status};

use super::{ACTOR_HEADER, RuntimeService};

/// Writes a small agent with one tool and one policy under `dir` and compiles it.
fn compile(dir: &Path, version: &str, purpose: &str) -> Vec<u8> {
    std::fs::create_dir_all(dir.join("tools")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "apiVersion: phrony.com/v1\nkind: Agent\nmetadata:\n  name: refund-agent\n  \
             namespace: support\n  version: {version}\n  owner: payments-team\nspec:\n  \
             purpose: {purpose}\n  instructions:\n    text: Look up the order first.\n  model:\n    \
             provider: openai\n    name: gpt-4o\n  tools:\n    - ref: payments.issue-refund\n      \
             policies:\n        - ref: policies/limit.yaml\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("tools/payments.issue-refund.yaml"),
        "apiVersion: phrony.com/v1\nkind: Tool\nmetadata:\n  name: issue-refund\n  namespace: \
         payments\n  version: 1.0.0\nspec:\n  description: Issue a refund.\n  \
         side_effect_class: irreversible_action\n  input_schema:\n    inline:\n      type: object\n      \
         properties:\n        amount:\n          type: number\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policies/limit.yaml"),
        "apiVersion: phrony.com/v1\nkind: Policy\nmetadata:\n  name: refund-limit\n  namespace: \
         payments\n  version: 1.0.0\nspec:\n  conditions:\n    field: amount\n    op: gt\n    \
         value: 500\n  decision:\n    type: deny\n    reason: Too large.\n",
    )
    .unwrap();
    let compiled = phrony_manifest::load_agent(dir.join("agent.yaml"))
        .unwrap_or_else(|d| panic!("test agent does not compile:\n{d}"));
    compiled.agent.snapshot_json()
}

fn router() -> phrony_dispatch::Router {
    phrony_dispatch::Router::new(phrony_dispatch::RouterConfig::default()).unwrap()
}

struct Fixture {
    service: RuntimeService,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Self {
        let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
        ledger.migrate().await.unwrap();
        Self {
            service: RuntimeService::new(ledger, "fallback-actor", router()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn snapshot(&self, version: &str, purpose: &str) -> Vec<u8> {
        compile(
            &self.dir.path().join(format!("{version}-{}", purpose.len())),
            version,
            purpose,
        )
    }

    async fn publish(&self, manifest: Vec<u8>, actor: &str) -> Result<pb::PublishResponse, Status> {
        let request = Request::new(pb::PublishRequest {
            manifest,
            actor: actor.into(),
        });
        self.service
            .publish(request)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn get_version(&self, version: &str) -> pb::GetAgentVersionResponse {
        let request = Request::new(pb::GetAgentVersionRequest {
            agent_ref: Some(agent(version)),
        });
        self.service
            .get_agent_version(request)
            .await
            .unwrap()
            .into_inner()
    }
}

fn agent(version: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "support".into(),
        name: "refund-agent".into(),
        version: version.into(),
    }
}

fn assert_status(result: Result<impl std::fmt::Debug, Status>, code: Code, message: &str) {
    let status = result.expect_err("the call should fail");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(message),
        "message {:?} should contain {message:?}",
        status.message()
    );
}

#[tokio::test]
async fn publish_stores_the_canonical_snapshot_with_a_server_computed_hash() {
    let f = Fixture::new().await;
    let manifest = f.snapshot("0.1.0", "Refunds");
    let expected_hash = phrony_manifest::CompiledAgent::from_snapshot_json(&manifest)
        .unwrap()
        .content_hash();
    let published = f.publish(manifest.clone(), "alice").await.unwrap();
    assert_eq!(
        (
            published.namespace.as_str(),
            published.name.as_str(),
            published.version.as_str()
        ),
        ("support", "refund-agent", "0.1.0")
    );
    assert_eq!(published.content_hash, expected_hash);
    assert_eq!(published.content_hash.len(), 64);
    assert!(!published.agent_id.is_empty() && !published.version_id.is_empty());

    let stored = f.get_version("0.1.0").await;
    assert_eq!(stored.manifest, manifest);
    assert_eq!(stored.content_hash, expected_hash);
    assert_eq!(stored.published_by, "alice");
    assert!(stored.published_at.ends_with('Z') && stored.published_at.len() == 20);
    assert_eq!(
        (stored.deprecated_at.as_str(), stored.retired_at.as_str()),
        ("", "")
    );
}

#[tokio::test]
async fn publish_is_idempotent_for_identical_content_only() {
    let f = Fixture::new().await;
    let first = f
        .publish(f.snapshot("0.1.0", "Refunds"), "alice")
        .await
        .unwrap();
    let again = f
        .publish(f.snapshot("0.1.0", "Refunds"), "bob")
        .await
        .unwrap();
    assert_eq!(first.created, Some(true));
    assert_eq!(
        again.created,
        Some(false),
        "an identical re-publish creates nothing"
    );
    assert_eq!(
        pb::PublishResponse {
            created: first.created,
            ..again
        },
        first,
        "the existing version is returned"
    );
    // The original publisher stays on record.
    assert_eq!(f.get_version("0.1.0").await.published_by, "alice");

    let different = f
        .publish(f.snapshot("0.1.0", "Refunds and returns"), "bob")
        .await;
    assert_status(different, Code::AlreadyExists, "0.1.0");
}

#[tokio::test]
async fn the_actor_comes_from_the_request_then_the_header_then_the_default() {
    let f = Fixture::new().await;
    let mut request = Request::new(pb::PublishRequest {
        manifest: f.snapshot("0.1.0", "Refunds"),
        actor: "  ".into(),
    });
    request
        .metadata_mut()
        .insert(ACTOR_HEADER, MetadataValue::from_static("carol"));
    f.service.publish(request).await.unwrap();
    assert_eq!(f.get_version("0.1.0").await.published_by, "carol");

    f.publish(f.snapshot("0.2.0", "Refunds"), "").await.unwrap();
    assert_eq!(f.get_version("0.2.0").await.published_by, "fallback-actor");

    let mut request = Request::new(pb::DeployRequest {
        agent_ref: Some(agent("0.2.0")),
        actor: String::new(),
        allow_new_secret_endpoints: false,
    });
    request
        .metadata_mut()
        .insert(ACTOR_HEADER, MetadataValue::from_static("dave"));
    f.service.deploy(request).await.unwrap();
    let active = f
        .service
        .get_active_version(Request::new(pb::GetActiveVersionRequest {
            agent_ref: Some(agent("")),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (active.version.as_str(), active.actor.as_str()),
        ("0.2.0", "dave")
    );
}

#[tokio::test]
async fn publish_refuses_snapshots_the_compiler_could_not_have_produced() {
    let f = Fixture::new().await;
    let manifest = f.snapshot("0.1.0", "Refunds");
    let text = String::from_utf8(manifest.clone()).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&manifest).unwrap();

    // Missing, not JSON, not a compiled agent.
    assert_status(
        f.publish(Vec::new(), "a").await,
        Code::InvalidArgument,
        "manifest is required",
    );
    assert_status(
        f.publish(b"{not json".to_vec(), "a").await,
        Code::InvalidArgument,
        "parse manifest: ",
    );
    assert_status(
        f.publish(b"[]".to_vec(), "a").await,
        Code::InvalidArgument,
        "parse manifest: ",
    );

    // Same content, but pretty-printed: not canonical.
    let pretty = serde_json::to_vec_pretty(&value).unwrap();
    assert_status(
        f.publish(pretty, "a").await,
        Code::InvalidArgument,
        "not in canonical form",
    );

    // A trailing newline is not canonical either.
    assert_status(
        f.publish(format!("{text}\n").into_bytes(), "a").await,
        Code::InvalidArgument,
        "first difference at byte",
    );

    // An unknown field smuggled in.
    let smuggled = text.replacen(
        "\"kind\":\"Agent\"",
        "\"kind\":\"Agent\",\"backdoor\":true",
        1,
    );
    assert_status(
        f.publish(smuggled.into_bytes(), "a").await,
        Code::InvalidArgument,
        "backdoor",
    );

    // The compiler's marker removed: an authoring document, not a compiled snapshot.
    let uncompiled = text.replacen(
        "\"phrony.com/policies-compiled\":\"true\"",
        "\"x\":\"y\"",
        1,
    );
    assert_ne!(uncompiled, text);
    assert_status(
        f.publish(uncompiled.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest: ",
    );

    // A policy edited into something the engine cannot evaluate.
    let broken_policy = text.replacen("\"op\":\"gt\"", "\"op\":\"resembles\"", 1);
    assert_ne!(broken_policy, text);
    assert_status(
        f.publish(broken_policy.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest: ",
    );

    // A model provider the runtime cannot call (the reference accepted these, §14.1 item 17).
    let bad_provider = text.replacen("\"provider\":\"openai\"", "\"provider\":\"skynet\"", 1);
    assert_ne!(bad_provider, text);
    assert_status(
        f.publish(bad_provider.into_bytes(), "a").await,
        Code::InvalidArgument,
        "unsupported provider \"skynet\"",
    );

    // An authoring-only reference instead of the compiled inline prompt.
    let uncompiled_prompt = text.replacen(
        "\"instructions\":{\"text\":\"Look up the order first.\"}",
        "\"instructions\":{\"ref\":\"prompts/system.md\",\"text\":\"Look up the order first.\"}",
        1,
    );
    assert_ne!(uncompiled_prompt, text);
    assert_status(
        f.publish(uncompiled_prompt.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest: spec.instructions: ref and version are resolved by compilation",
    );

    // Several problems: counted, one indented line each.
    let two_problems = text
        .replacen("\"version\":\"0.1.0\"", "\"version\":\"latest\"", 1)
        .replacen("\"name\":\"gpt-4o\"", "\"name\":\" \"", 1);
    assert_status(
        f.publish(two_problems.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest (2 errors):\n  metadata.version: must be valid semver\n  \
         spec.model.name: is required",
    );

    // An allow list for a tool the agent does not bind (a compiled-only check).
    let stray_allow = text.replacen(
        "\"policies\":[",
        "\"policies\":[{\"name\":\"usd\",\"scope\":\"tool:payments.charge\",\
         \"action\":\"allow\",\"allow\":[\"USD\"]},",
        1,
    );
    assert_ne!(stray_allow, text);
    assert_status(
        f.publish(stray_allow.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest: spec.policies[0].scope: references undeclared tool ref payments.charge",
    );

    // A version label that is not semver.
    let bad_version = text.replacen("\"version\":\"0.1.0\"", "\"version\":\"latest\"", 1);
    assert_status(
        f.publish(bad_version.into_bytes(), "a").await,
        Code::InvalidArgument,
        "invalid manifest: ",
    );

    // Nothing was stored by any of the refusals.
    let agents = f
        .service
        .list_agents(Request::new(pb::ListAgentsRequest::default()))
        .await
        .unwrap();
    assert!(agents.into_inner().agents.is_empty());
}

#[tokio::test]
async fn lifecycle_rpcs_report_the_reference_error_codes() {
    let f = Fixture::new().await;
    let missing = f
        .service
        .deploy(Request::new(pb::DeployRequest {
            agent_ref: Some(agent("")),
            actor: "a".into(),
            allow_new_secret_endpoints: false,
        }))
        .await;
    assert_status(
        missing,
        Code::InvalidArgument,
        "agent_ref requires namespace, name, and version",
    );
    let unknown = f
        .service
        .deploy(Request::new(pb::DeployRequest {
            agent_ref: Some(agent("1.0.0")),
            actor: "a".into(),
            allow_new_secret_endpoints: false,
        }))
        .await;
    assert_status(
        unknown,
        Code::NotFound,
        "agent support/refund-agent not found",
    );

    f.publish(f.snapshot("0.1.0", "Refunds"), "a")
        .await
        .unwrap();
    let no_active = f
        .service
        .get_active_version(Request::new(pb::GetActiveVersionRequest {
            agent_ref: Some(agent("")),
        }))
        .await;
    assert_status(
        no_active,
        Code::FailedPrecondition,
        "no active deployment for agent support/refund-agent",
    );
    let no_label = f
        .service
        .get_agent_version(Request::new(pb::GetAgentVersionRequest {
            agent_ref: Some(agent("9.9.9")),
        }))
        .await;
    assert_status(
        no_label,
        Code::NotFound,
        "no published version \"9.9.9\" for agent support/refund-agent",
    );
    let no_ref = f
        .service
        .list_agent_versions(Request::new(pb::ListAgentVersionsRequest {
            agent_ref: None,
        }))
        .await;
    assert_status(
        no_ref,
        Code::InvalidArgument,
        "agent_ref requires namespace and name",
    );
}

#[tokio::test]
async fn bundle_reads_answer_without_an_engine_and_name_what_is_missing() {
    let f = Fixture::new().await;
    let bundles = f
        .service
        .list_bundles(Request::new(pb::ListBundlesRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(bundles.bundles.is_empty());
    let desk = || {
        Some(pb::BundleRef {
            namespace: "support".into(),
            name: "desk".into(),
            version: String::new(),
        })
    };
    let active = f
        .service
        .get_active_bundle(Request::new(pb::GetActiveBundleRequest {
            bundle_ref: desk(),
        }))
        .await;
    assert_status(active, Code::NotFound, "bundle support/desk not found");
    let deploy = f
        .service
        .deploy_bundle(Request::new(pb::DeployBundleRequest {
            bundle_ref: desk(),
            actor: String::new(),
            allow_new_secret_endpoints: false,
        }))
        .await;
    assert_status(
        deploy,
        Code::InvalidArgument,
        "bundle_ref requires namespace, name, and version",
    );
    let run = f
        .service
        .run_session(Request::new(pb::RunSessionRequest {
            bundle_ref: desk(),
            ..Default::default()
        }))
        .await;
    assert_status(run, Code::Unavailable, "this runtime does not run sessions");
}

#[tokio::test]
async fn sessions_need_an_engine() {
    let f = Fixture::new().await;
    let run = f
        .service
        .run_session(Request::new(pb::RunSessionRequest {
            agent_ref: Some(agent("")),
            ..Default::default()
        }))
        .await;
    assert_status(run, Code::Unavailable, "this runtime does not run sessions");
    // Reads of the ledger work without one.
    let approvals = f
        .service
        .list_approvals(Request::new(pb::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(approvals.approvals.is_empty());
}

#[tokio::test]
async fn get_version_reports_release_and_schema() {
    let f = Fixture::new().await;
    let v = f
        .service
        .get_version(Request::new(pb::GetVersionRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.version, env!("CARGO_PKG_VERSION"));
    assert!(!v.schema_version.is_empty());
}

#[tokio::test]
async fn bad_actor_names_are_refused_naming_the_rule() {
    let f = Fixture::new().await;
    let long = "x".repeat(phrony_auth::actor::MAX_ACTOR_CHARS + 1);
    let cases: [(&str, &str); 9] = [
        ("system", "reserved for the runtime"),
        ("System:timeout", "reserved for the runtime"),
        ("policy", "reserved for the runtime"),
        (
            "bob\n2025-01-31T09:30:00Z [event/approval.decided] approved by ciso",
            "unprintable character U+000A",
        ),
        ("\u{1b}[31mbob", "unprintable character U+001B"),
        ("bob\u{202e}", "unprintable character U+202E"),
        (" bob", "must not start or end with whitespace"),
        (&long, "at most 128 are allowed"),
        ("bob\u{2028}", "unprintable character U+2028"),
    ];
    for (actor, rule) in cases {
        assert_status(
            f.publish(f.snapshot("0.1.0", "Refunds"), actor).await,
            Code::InvalidArgument,
            rule,
        );
    }
    // The header of the RPCs without an actor field goes through the same rule; a header may
    // carry UTF-8, which must decode.
    let header = |value: &[u8]| {
        let mut request = Request::new(pb::ArchiveAgentRequest {
            agent_ref: Some(agent("")),
        });
        request.metadata_mut().insert(
            ACTOR_HEADER,
            tonic::metadata::AsciiMetadataValue::try_from(value).unwrap(),
        );
        request
    };
    assert_status(
        f.service.archive_agent(header(b"SYSTEM")).await,
        Code::InvalidArgument,
        "actor \"SYSTEM\" is reserved for the runtime",
    );
    assert_status(
        f.service.archive_agent(header(b"\xff\xfe")).await,
        Code::InvalidArgument,
        "the phrony-actor header is not UTF-8",
    );
    // Nothing was stored, and a good UTF-8 name in the header is recorded as spelled.
    f.publish(f.snapshot("0.1.0", "Refunds"), "Émad")
        .await
        .unwrap();
    assert_eq!(f.get_version("0.1.0").await.published_by, "Émad");
    f.service
        .archive_agent(header("Émad Ç".as_bytes()))
        .await
        .unwrap();
}

/// More sessions and pending approvals than the old default page of 50, written through the
/// ledger; a list request that names no page size (the published 0.1.0 SDK sends none) gets
/// every one of them, and a paging request still pages.
#[tokio::test]
async fn lists_without_a_page_size_return_every_match() {
    use phrony_ledger::{
        AgentRef, AgentVersionRef, NewApproval, NewSession, NewToolCall, OnModify, OnReject,
        SessionMode, SessionStatus, StatusChange,
    };
    let f = Fixture::new().await;
    f.publish(f.snapshot("0.1.0", "Refunds"), "alice")
        .await
        .unwrap();
    let ledger = &f.service.ledger;
    let agent_ref = AgentRef::new("support", "refund-agent");
    ledger
        .deploy(
            &agent_ref,
            "0.1.0",
            &phrony_ledger::Attribution::unverified("alice"),
        )
        .await
        .unwrap();
    let version = ledger.get_agent_version(&agent_ref, "0.1.0").await.unwrap();
    const N: usize = 60;
    for _ in 0..N {
        let session = ledger
            .create_session(NewSession {
                id: phrony_ledger::new_session_id(),
                agent_version_id: version.id,
                agent: AgentVersionRef::new("support", "refund-agent", "0.1.0"),
                input: serde_json::json!({"message": "refund ORD-1"}),
                metadata: Default::default(),
                mode: SessionMode::Task,
                parent_session_id: None,
                limits: None,
                bundle_version_id: None,
                secrets: Vec::new(),
                actor: phrony_ledger::Attribution::unverified("alice".to_owned()),
            })
            .await
            .unwrap();
        ledger
            .set_session_status(&session.id, StatusChange::to(SessionStatus::AwaitingTool))
            .await
            .unwrap();
        let call = ledger
            .record_tool_call(NewToolCall {
                session_id: session.id.clone(),
                turn: 1,
                iteration: 0,
                index: 0,
                tool: "payments.issue-refund".to_owned(),
                version: "1.0.0".to_owned(),
                wire_name: None,
                args: serde_json::json!({"amount": 400}),
                side_effect_class: None,
                delegation: None,
            })
            .await
            .unwrap();
        ledger
            .open_approval(NewApproval {
                allow_self_approval: false,
                id: uuid::Uuid::new_v4(),
                session_id: session.id.clone(),
                call_id: call.call_id.clone(),
                policy_ref: None,
                reason: "needs a human".to_owned(),
                route: "approvers".to_owned(),
                authority_ref: String::new(),
                approvals_required: 1,
                comprehension_required: false,
                on_reject: OnReject::ReturnToAgent,
                on_modify: OnModify::Unchecked,
                timeout: None,
                policy_runtime: serde_json::Map::new(),
                actor: phrony_ledger::Attribution::unverified("policy".to_owned()),
                kind: phrony_ledger::ApprovalKind::Policy,
            })
            .await
            .unwrap();
    }
    let approvals = f
        .service
        .list_approvals(Request::new(pb::ListApprovalsRequest {
            status: "pending".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(approvals.approvals.len(), N);
    assert!(approvals.next_page_token.is_empty());
    let sessions = f
        .service
        .list_sessions(Request::new(pb::ListSessionsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(sessions.sessions.len(), N);
    assert!(sessions.next_page_token.is_empty());

    // Clients that page keep paging.
    let page = f
        .service
        .list_approvals(Request::new(pb::ListApprovalsRequest {
            status: "pending".into(),
            page_size: 25,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.approvals.len(), 25);
    assert!(!page.next_page_token.is_empty());
    let page = f
        .service
        .list_sessions(Request::new(pb::ListSessionsRequest {
            page_size: 25,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.sessions.len(), 25);
    assert!(!page.next_page_token.is_empty());
}
