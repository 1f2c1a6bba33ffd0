//! The role × RPC matrix: a real in-process server in `required` auth mode on SQLite, one API
//! token per role (plus a revoked one, an expired one, a malformed bearer and no credential),
//! and every RPC of the Runtime service called with each. The expectations are one data table
//! written from the documented roles ([`allowed`]), not derived from the server's permission
//! table: a row the server gets wrong fails here.
//!
//! "Admitted" means the edge let the call through: the handler answered with anything but
//! `UNAUTHENTICATED` / `PERMISSION_DENIED` (most calls carry empty requests, so the handler's own
//! `INVALID_ARGUMENT` / `NOT_FOUND` is the expected answer).

use std::time::Duration;

use phrony_auth::{Role, TokenSecret};
use phrony_ledger::{Ledger, NewApiToken};
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_runtime::auth::AuthMode;
use phrony_runtime::{SecretsKey, ServeConfig};
use tokio::sync::oneshot;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// The reads every role but worker and relay has.
const READS: &[&str] = &[
    "GetVersion",
    "GetActiveVersion",
    "ListDeployments",
    "GetAgentVersion",
    "ListAgents",
    "ListAgentVersions",
    "ListSessions",
    "InspectSession",
    "GetSessionPayload",
    "GetApproval",
    "ListApprovals",
    "WatchApprovals",
    "GetActiveBundle",
    "GetBundleSecretRequirements",
    "ListBundles",
    "ListBundleVersions",
    "ListBundleDeployments",
    "GetBundleVersion",
    "VerifyAudit",
    "ExportAudit",
    "ListShadowDecisions",
    "ListWebhookDeliveries",
];
const RUNS: &[&str] = &[
    "RunSession",
    "RunSessionInteractive",
    "CancelSession",
    "CompleteSession",
];
const PUBLISHES: &[&str] = &[
    "Publish",
    "PublishBundle",
    "Deploy",
    "DeployBundle",
    "RollbackBundle",
    "Rollback",
    "DeprecateAgentVersion",
    "RetireAgentVersion",
    "ArchiveAgent",
];

/// Whether `role` may call `rpc` (the documented table).
fn allowed(role: Role, rpc: &str) -> bool {
    let reads = READS.contains(&rpc);
    match role {
        Role::Viewer => reads,
        Role::Runner => reads || RUNS.contains(&rpc),
        Role::Approver => reads || rpc == "DecideApproval",
        Role::Publisher => reads || PUBLISHES.contains(&rpc),
        Role::Worker => rpc == "Work",
        Role::Relay => false,
        Role::Admin => true,
    }
}

/// Sends `authorization: <value>` on every call when set.
#[derive(Clone)]
pub(crate) struct Bearer(pub(crate) Option<String>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.parse().unwrap());
        }
        Ok(request)
    }
}

pub(crate) type Client = RuntimeClient<InterceptedService<Channel, Bearer>>;

/// Calls `rpc` with a minimal request; returns the answer's code (`Ok` when it succeeded).
async fn call(client: &mut Client, rpc: &str) -> Code {
    fn code<T>(r: Result<T, tonic::Status>) -> Code {
        r.map_or_else(|s| s.code(), |_| Code::Ok)
    }
    let agent = || {
        Some(pb::AgentRef {
            namespace: "demo".into(),
            name: "missing".into(),
            version: "1.0.0".into(),
        })
    };
    match rpc {
        "GetVersion" => code(client.get_version(pb::GetVersionRequest {}).await),
        "GetActiveVersion" => code(
            client
                .get_active_version(pb::GetActiveVersionRequest { agent_ref: agent() })
                .await,
        ),
        "ListDeployments" => code(
            client
                .list_deployments(pb::ListDeploymentsRequest { agent_ref: agent() })
                .await,
        ),
        "GetAgentVersion" => code(
            client
                .get_agent_version(pb::GetAgentVersionRequest { agent_ref: agent() })
                .await,
        ),
        "ListAgents" => code(client.list_agents(pb::ListAgentsRequest::default()).await),
        "ListAgentVersions" => code(
            client
                .list_agent_versions(pb::ListAgentVersionsRequest { agent_ref: agent() })
                .await,
        ),
        "ListSessions" => code(
            client
                .list_sessions(pb::ListSessionsRequest::default())
                .await,
        ),
        "InspectSession" => code(
            client
                .inspect_session(pb::InspectSessionRequest::default())
                .await,
        ),
        "GetSessionPayload" => code(
            client
                .get_session_payload(pb::GetSessionPayloadRequest::default())
                .await,
        ),
        "GetApproval" => code(client.get_approval(pb::GetApprovalRequest::default()).await),
        "ListApprovals" => code(
            client
                .list_approvals(pb::ListApprovalsRequest::default())
                .await,
        ),
        // The stream opens (or is refused) before any change is read.
        "WatchApprovals" => code(
            client
                .watch_approvals(pb::WatchApprovalsRequest::default())
                .await,
        ),
        "GetActiveBundle" => code(
            client
                .get_active_bundle(pb::GetActiveBundleRequest::default())
                .await,
        ),
        "GetBundleSecretRequirements" => code(
            client
                .get_bundle_secret_requirements(pb::GetBundleSecretRequirementsRequest::default())
                .await,
        ),
        "ListBundles" => code(client.list_bundles(pb::ListBundlesRequest::default()).await),
        "ListBundleVersions" => code(
            client
                .list_bundle_versions(pb::ListBundleVersionsRequest::default())
                .await,
        ),
        "ListBundleDeployments" => code(
            client
                .list_bundle_deployments(pb::ListBundleDeploymentsRequest::default())
                .await,
        ),
        "GetBundleVersion" => code(
            client
                .get_bundle_version(pb::GetBundleVersionRequest::default())
                .await,
        ),
        "RollbackBundle" => code(
            client
                .rollback_bundle(pb::RollbackBundleRequest::default())
                .await,
        ),
        "RunSession" => code(client.run_session(pb::RunSessionRequest::default()).await),
        "RunSessionInteractive" => code(
            client
                .run_session_interactive(futures::stream::iter(vec![
                    pb::RunSessionInteractiveClientMsg::default(),
                ]))
                .await,
        ),
        "CancelSession" => code(
            client
                .cancel_session(pb::CancelSessionRequest::default())
                .await,
        ),
        "CompleteSession" => code(
            client
                .complete_session(pb::CompleteSessionRequest::default())
                .await,
        ),
        "DecideApproval" => code(
            client
                .decide_approval(pb::DecideApprovalRequest::default())
                .await,
        ),
        "Publish" => code(client.publish(pb::PublishRequest::default()).await),
        "PublishBundle" => code(
            client
                .publish_bundle(pb::PublishBundleRequest::default())
                .await,
        ),
        "Deploy" => code(client.deploy(pb::DeployRequest::default()).await),
        "DeployBundle" => code(
            client
                .deploy_bundle(pb::DeployBundleRequest::default())
                .await,
        ),
        "Rollback" => code(client.rollback(pb::RollbackRequest::default()).await),
        "DeprecateAgentVersion" => code(
            client
                .deprecate_agent_version(pb::DeprecateAgentVersionRequest { agent_ref: agent() })
                .await,
        ),
        "RetireAgentVersion" => code(
            client
                .retire_agent_version(pb::RetireAgentVersionRequest { agent_ref: agent() })
                .await,
        ),
        "ArchiveAgent" => code(
            client
                .archive_agent(pb::ArchiveAgentRequest { agent_ref: agent() })
                .await,
        ),
        "VerifyAudit" => code(client.verify_audit(pb::VerifyAuditRequest::default()).await),
        // The stream opens (or is refused) before any event is read.
        "ExportAudit" => code(client.export_audit(pb::ExportAuditRequest::default()).await),
        "ListShadowDecisions" => code(
            client
                .list_shadow_decisions(pb::ListShadowDecisionsRequest {
                    policy: "payments/no-gold".to_owned(),
                    ..pb::ListShadowDecisionsRequest::default()
                })
                .await,
        ),
        "ListWebhookDeliveries" => code(
            client
                .list_webhook_deliveries(pb::ListWebhookDeliveriesRequest::default())
                .await,
        ),
        // An unknown delivery: NOT_FOUND for whoever may ask.
        "RetryWebhookDelivery" => code(
            client
                .retry_webhook_delivery(pb::RetryWebhookDeliveryRequest {
                    delivery_id: "00000000-0000-4000-8000-000000000000".to_owned(),
                    actor: String::new(),
                })
                .await,
        ),
        "Work" => code(
            client
                .work(futures::stream::iter(vec![pb::WorkClientMsg::default()]))
                .await,
        ),
        other => panic!("the matrix has no call for RPC {other}: add one"),
    }
}

/// A server in `required` mode and a way to stop it.
struct Server {
    addr: String,
    ledger: Ledger,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("phrony.db").display());
        let ledger = Ledger::connect(&url).await.unwrap();
        ledger.migrate().await.unwrap();
        let listener = phrony_runtime::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().to_string();
        let mut config = ServeConfig::new(SecretsKey::generate().unwrap());
        config.auth = AuthMode::Required;
        config.shutdown_grace = Duration::from_secs(2);
        let (stop, stopped) = oneshot::channel();
        let serving = ledger.clone();
        let task = tokio::spawn(async move {
            phrony_runtime::serve(listener, serving, config, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            ledger,
            stop: Some(stop),
            task,
            _dir: dir,
        }
    }

    /// A token named `name` with `roles`, expiring at `expires_at`; returns its secret.
    async fn token(
        &self,
        name: &str,
        roles: &[Role],
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> String {
        let secret = TokenSecret::from_random(rand_bytes(name));
        self.ledger
            .create_api_token(NewApiToken {
                name: name.into(),
                secret_hash: secret.hash(),
                roles: roles.to_vec(),
                routes: vec![],
                tools: vec![],
                expires_at,
                created_by: "test".into(),
            })
            .await
            .unwrap();
        secret.expose().to_owned()
    }

    async fn client(&self, bearer: Option<String>) -> Client {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        RuntimeClient::with_interceptor(channel, Bearer(bearer))
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Distinct, deterministic token bytes per name (the tests need no secrecy).
fn rand_bytes(name: &str) -> [u8; 32] {
    let hash = phrony_auth::hash_secret(name);
    let mut out = [0_u8; 32];
    for (o, c) in out.iter_mut().zip(hash.as_bytes().chunks(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap();
    }
    out
}

/// What a caller presents, and what it gets for each RPC.
enum Expect {
    /// A token of this role: admitted where [`allowed`], else `PERMISSION_DENIED`.
    Role(Role),
    /// `UNAUTHENTICATED` everywhere.
    Unauthenticated,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_every_role_as_the_table_says() {
    let server = Server::start().await;
    let mut callers: Vec<(String, Option<String>, Expect)> = Vec::new();
    for role in Role::ALL {
        let bearer = server.token(&format!("{role}-bot"), &[role], None).await;
        callers.push((
            role.to_string(),
            Some(format!("Bearer {bearer}")),
            Expect::Role(role),
        ));
    }
    let revoked = server.token("revoked-bot", &[Role::Admin], None).await;
    server
        .ledger
        .revoke_api_token("revoked-bot", "ciso")
        .await
        .unwrap();
    let expired = server
        .token(
            "expired-bot",
            &[Role::Admin],
            Some(chrono::Utc::now() - chrono::Duration::minutes(1)),
        )
        .await;
    let unknown = TokenSecret::from_random([42; 32]).expose().to_owned();
    for (who, bearer) in [
        ("no credential", None),
        ("revoked", Some(format!("Bearer {revoked}"))),
        ("expired", Some(format!("Bearer {expired}"))),
        ("unknown token", Some(format!("Bearer {unknown}"))),
        ("malformed token", Some("Bearer phr_not-a-token".to_owned())),
        ("basic auth", Some("Basic YWRtaW46YWRtaW4=".to_owned())),
    ] {
        callers.push((who.to_owned(), bearer, Expect::Unauthenticated));
    }

    let rpcs: Vec<&str> = phrony_grpc::auth::PERMISSIONS
        .iter()
        .map(|(rpc, _)| *rpc)
        .collect();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (who, bearer, expect) in &callers {
        let mut client = server.client(bearer.clone()).await;
        for rpc in &rpcs {
            let got = tokio::time::timeout(Duration::from_secs(10), call(&mut client, rpc))
                .await
                .unwrap_or_else(|_| panic!("{who} {rpc}: no answer"));
            let ok = match expect {
                Expect::Role(role) if allowed(*role, rpc) => {
                    !matches!(got, Code::Unauthenticated | Code::PermissionDenied)
                }
                Expect::Role(_) => got == Code::PermissionDenied,
                Expect::Unauthenticated => got == Code::Unauthenticated,
            };
            if !ok {
                wrong.push(format!("{who} × {rpc}: {got:?}"));
            }
            checked += 1;
        }
    }
    assert!(
        wrong.is_empty(),
        "unexpected answers:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        checked,
        callers.len() * 38,
        "every RPC of the service was called"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_reason_and_a_revocation_applies_to_the_next_call() {
    let server = Server::start().await;
    let viewer = server.token("ops-viewer", &[Role::Viewer], None).await;
    let mut client = server.client(Some(format!("Bearer {viewer}"))).await;
    client.get_version(pb::GetVersionRequest {}).await.unwrap();
    let denied = client
        .publish(pb::PublishRequest::default())
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(
        denied
            .message()
            .contains("\"ops-viewer\" lacks the publish permission"),
        "{denied:?}"
    );

    // Revoked while the client stays connected: the very next call is refused.
    server
        .ledger
        .revoke_api_token("ops-viewer", "ciso")
        .await
        .unwrap();
    let refused = client
        .get_version(pb::GetVersionRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert!(refused.message().contains("was revoked"), "{refused:?}");

    let mut none = server.client(None).await;
    let missing = none
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap_err();
    assert!(missing.message().contains("no credential"), "{missing:?}");

    // A verified principal cannot name another actor (field or header) without relay.
    let publisher = server.token("ci-publisher", &[Role::Publisher], None).await;
    let mut client = server.client(Some(format!("Bearer {publisher}"))).await;
    let mut request = Request::new(pb::ArchiveAgentRequest {
        agent_ref: Some(pb::AgentRef {
            namespace: "demo".into(),
            name: "missing".into(),
            version: String::new(),
        }),
    });
    request
        .metadata_mut()
        .insert("phrony-actor", "ciso".parse().unwrap());
    let impersonation = client.archive_agent(request).await.unwrap_err();
    assert_eq!(impersonation.code(), Code::PermissionDenied);
    assert!(
        impersonation.message().contains("may not act as \"ciso\""),
        "{impersonation:?}"
    );
    // Naming itself is fine (the agent does not exist: the handler answers).
    let mut request = Request::new(pb::ArchiveAgentRequest {
        agent_ref: Some(pb::AgentRef {
            namespace: "demo".into(),
            name: "missing".into(),
            version: String::new(),
        }),
    });
    request
        .metadata_mut()
        .insert("phrony-actor", "CI-Publisher".parse().unwrap());
    assert_eq!(
        client.archive_agent(request).await.unwrap_err().code(),
        Code::NotFound
    );
    server.stop().await;
}
