//! The `phrony.runtime.v1.Runtime` service.
//!
//! [`RuntimeService`] implements the generated trait by delegating each RPC to the module of
//! its area: [`lifecycle`] (agents, versions, deployments), [`bundles`] (bundle publish,
//! deployments and reads), [`sessions`] (start, cancel, complete, list, inspect; the engine runs
//! them), [`approvals`] (read, list, vote) and [`work`] (the tool workers' `Work` stream, backed
//! by a `phrony-dispatch` [`Router`]).

mod approvals;
mod audit;
mod bundles;
mod interactive;
mod lifecycle;
pub(crate) mod sessions;
pub(crate) mod work;

use std::future::Future;
use std::sync::LazyLock;
use std::time::Instant;

use pb::runtime_server::Runtime;
use phrony_dispatch::Router;
use phrony_engine::{DefaultProviderFactory, Engine, ProviderFactory};
use phrony_ledger::Ledger;
use phrony_proto::runtime::v1 as pb;
use tonic::codegen::BoxStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

use phrony_auth::{Attribution, Principal};

use crate::ACTOR_HEADER;
use crate::{auth, convert};

/// The runtime service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RuntimeService {
    ledger: Ledger,
    default_actor: String,
    work: work::WorkHub,
    /// Runs sessions; `None` makes the session and approval RPCs answer `UNAVAILABLE`.
    engine: Option<Engine>,
    /// Ends the open `RunSessionInteractive` streams (shutdown).
    session_streams: phrony_dispatch::CancellationToken,
    /// Changes buffered per `WatchApprovals` stream ([`DEFAULT_WATCH_BUFFER`]).
    watch_buffer: usize,
    /// How long a `WatchApprovals` client may leave its buffer full before it is ended
    /// ([`DEFAULT_WATCH_GRACE`]).
    watch_grace: std::time::Duration,
}

/// Changes buffered per `WatchApprovals` stream, beyond what HTTP/2 flow control holds.
pub const DEFAULT_WATCH_BUFFER: usize = 256;

/// How long a `WatchApprovals` client may leave its buffer full (not reading) before it is ended
/// with `RESOURCE_EXHAUSTED`.
pub const DEFAULT_WATCH_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl RuntimeService {
    /// A service on `ledger` (already migrated). Changes whose request names no actor are
    /// recorded as `default_actor`. Tool workers connecting to `Work` register with `router`;
    /// keep a clone of it to dispatch tool calls to them.
    #[must_use]
    pub fn new(ledger: Ledger, default_actor: impl Into<String>, router: Router) -> Self {
        Self {
            ledger,
            default_actor: default_actor.into(),
            work: work::WorkHub::new(router),
            engine: None,
            session_streams: phrony_dispatch::CancellationToken::new(),
            watch_buffer: DEFAULT_WATCH_BUFFER,
            watch_grace: DEFAULT_WATCH_GRACE,
        }
    }

    /// The service with `changes` (at least 1) buffered per `WatchApprovals` stream instead of
    /// [`DEFAULT_WATCH_BUFFER`], and a client that leaves them unread for `grace` ended instead
    /// of after [`DEFAULT_WATCH_GRACE`].
    #[must_use]
    pub fn with_watch_buffer(mut self, changes: usize, grace: std::time::Duration) -> Self {
        self.watch_buffer = changes.max(1);
        self.watch_grace = grace;
        self
    }

    /// The service with `engine` running its sessions (the session and approval RPCs need
    /// one). Build the engine on the same ledger and router.
    #[must_use]
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The session engine, or `UNAVAILABLE` when the service has none.
    fn engine(&self) -> Result<&Engine, Status> {
        self.engine
            .as_ref()
            .ok_or_else(|| Status::unavailable("this runtime does not run sessions"))
    }

    /// The providers that say where a version sends its secrets (the deploy and rollback
    /// check): the engine's, or, for a service without an engine (it runs no sessions), the
    /// vendors' default endpoints.
    fn secret_providers(&self) -> &dyn ProviderFactory {
        static VENDOR_DEFAULTS: LazyLock<DefaultProviderFactory> =
            LazyLock::new(DefaultProviderFactory::default);
        match &self.engine {
            Some(engine) => engine.providers(),
            None => &*VENDOR_DEFAULTS,
        }
    }

    /// The router tool workers register with.
    #[must_use]
    pub fn router(&self) -> &Router {
        self.work.router()
    }

    /// Ends every open `RunSessionInteractive` stream with `UNAVAILABLE` and refuses new
    /// ones; the sessions carry on (a restarted runtime resumes them and clients attach
    /// again). Call it when shutdown starts, so attached clients do not hold the server for
    /// the whole grace period; it affects every clone of the service.
    pub fn close_session_streams(&self) {
        self.session_streams.cancel();
    }

    /// Ends every open `Work` stream cleanly (`OK`, after the messages already queued for it)
    /// and refuses streams that have not registered yet. Call it on shutdown, after
    /// [`Router::shutdown`] and once dispatched calls had their chance to finish; it affects
    /// every clone of the service.
    pub fn close_work_streams(&self) {
        self.work.stop();
    }

    /// Who a change is recorded as: the actor the request names (its own `actor` field, else
    /// the [`ACTOR_HEADER`] metadata; empty or whitespace-only counts as absent, anything else
    /// must pass [`Actor::parse`](crate::Actor::parse), `INVALID_ARGUMENT` naming the rule
    /// otherwise, and a header must be UTF-8), attributed to `principal` by
    /// [`Principal::attribute`]: in `local` mode the named actor (else the default actor),
    /// unverified; a verified principal is recorded as itself, and naming anyone else needs the
    /// relay permission (`PERMISSION_DENIED` with the impersonation message otherwise).
    pub(crate) fn attribution(
        &self,
        principal: &Principal,
        field: &str,
        metadata: &MetadataMap,
    ) -> Result<Attribution, Status> {
        let claimed = if field.trim().is_empty() {
            match metadata.get(ACTOR_HEADER) {
                None => None,
                Some(header) => {
                    let text = std::str::from_utf8(header.as_bytes()).map_err(|_| {
                        Status::invalid_argument(format!("the {ACTOR_HEADER} header is not UTF-8"))
                    })?;
                    if text.trim().is_empty() {
                        None
                    } else {
                        Some(convert::actor(text)?)
                    }
                }
            }
        } else {
            Some(convert::actor(field)?)
        };
        principal
            .attribute(claimed.as_deref())
            .map_err(|e| Status::permission_denied(e.to_string()))
    }

    /// The recorded actor of `request` (see [`Self::attribution`]), with the principal the
    /// access edge put on it (an unverified one named the default actor without the edge).
    fn actor<T>(&self, request: &Request<T>, field: &str) -> Result<Attribution, Status> {
        let principal = auth::principal(request, &self.default_actor);
        self.attribution(&principal, field, request.metadata())
    }
}

/// Runs one unary RPC handler and logs its outcome.
async fn unary<T>(
    rpc: &'static str,
    handler: impl Future<Output = Result<T, Status>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = handler.await;
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match &result {
        Ok(_) => tracing::debug!(rpc, elapsed_ms, "rpc ok"),
        Err(status) => match status.code() {
            Code::Internal | Code::Unavailable | Code::DataLoss | Code::Unknown => {
                tracing::error!(rpc, elapsed_ms, code = ?status.code(), message = status.message(), "rpc failed");
            }
            Code::Unimplemented => {
                tracing::debug!(rpc, "rpc not implemented");
            }
            code => {
                tracing::info!(
                    rpc,
                    elapsed_ms,
                    ?code,
                    message = status.message(),
                    "rpc refused"
                );
            }
        },
    }
    result.map(Response::new)
}

/// Logs a list request that named no page size (an old client that does not page) and got
/// more matches than [`phrony_ledger::UNSIZED_PAGE_LIMIT`]: its response carries a
/// `next_page_token`, which such a client will not read.
fn warn_if_capped(rpc: &'static str, page_size: i32, next_token: Option<&String>) {
    if page_size == 0 && next_token.is_some() {
        tracing::warn!(
            rpc,
            limit = phrony_ledger::UNSIZED_PAGE_LIMIT,
            "a list request without page_size matched more than the limit; it got the first \
             page and a next_page_token (clients should page with page_size/page_token)"
        );
    }
}

#[tonic::async_trait]
impl Runtime for RuntimeService {
    type RunSessionInteractiveStream = BoxStream<pb::RunSessionInteractiveServerMsg>;
    type WorkStream = BoxStream<pb::WorkServerMsg>;
    type GetSessionPayloadStream = BoxStream<pb::SessionPayloadChunk>;
    type ExportAuditStream = BoxStream<pb::AuditEvent>;
    type WatchApprovalsStream = BoxStream<pb::ApprovalChange>;

    // --- Audit ------------------------------------------------------------------------------

    async fn verify_audit(
        &self,
        request: Request<pb::VerifyAuditRequest>,
    ) -> Result<Response<pb::VerifyAuditResponse>, Status> {
        unary("VerifyAudit", self.verify_audit_impl(request.into_inner())).await
    }

    async fn export_audit(
        &self,
        request: Request<pb::ExportAuditRequest>,
    ) -> Result<Response<Self::ExportAuditStream>, Status> {
        unary("ExportAudit", self.export_audit_impl(request.into_inner())).await
    }

    async fn list_shadow_decisions(
        &self,
        request: Request<pb::ListShadowDecisionsRequest>,
    ) -> Result<Response<pb::ListShadowDecisionsResponse>, Status> {
        unary(
            "ListShadowDecisions",
            self.list_shadow_decisions_impl(request.into_inner()),
        )
        .await
    }

    async fn list_webhook_deliveries(
        &self,
        request: Request<pb::ListWebhookDeliveriesRequest>,
    ) -> Result<Response<pb::ListWebhookDeliveriesResponse>, Status> {
        unary(
            "ListWebhookDeliveries",
            self.list_webhook_deliveries_impl(request.into_inner()),
        )
        .await
    }

    async fn retry_webhook_delivery(
        &self,
        request: Request<pb::RetryWebhookDeliveryRequest>,
    ) -> Result<Response<pb::RetryWebhookDeliveryResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("RetryWebhookDelivery", async {
            self.retry_webhook_delivery_impl(request.into_inner(), actor?)
                .await
        })
        .await
    }

    async fn get_version(
        &self,
        _request: Request<pb::GetVersionRequest>,
    ) -> Result<Response<pb::GetVersionResponse>, Status> {
        unary("GetVersion", self.get_version_impl()).await
    }

    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("Publish", async {
            self.publish_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn deploy(
        &self,
        request: Request<pb::DeployRequest>,
    ) -> Result<Response<pb::DeployResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("Deploy", async {
            self.deploy_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn rollback(
        &self,
        request: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::RollbackResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("Rollback", async {
            self.rollback_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn get_active_version(
        &self,
        request: Request<pb::GetActiveVersionRequest>,
    ) -> Result<Response<pb::GetActiveVersionResponse>, Status> {
        unary(
            "GetActiveVersion",
            self.get_active_version_impl(request.into_inner()),
        )
        .await
    }

    async fn list_deployments(
        &self,
        request: Request<pb::ListDeploymentsRequest>,
    ) -> Result<Response<pb::ListDeploymentsResponse>, Status> {
        unary(
            "ListDeployments",
            self.list_deployments_impl(request.into_inner()),
        )
        .await
    }

    async fn get_agent_version(
        &self,
        request: Request<pb::GetAgentVersionRequest>,
    ) -> Result<Response<pb::GetAgentVersionResponse>, Status> {
        unary(
            "GetAgentVersion",
            self.get_agent_version_impl(request.into_inner()),
        )
        .await
    }

    async fn list_agents(
        &self,
        request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        unary("ListAgents", self.list_agents_impl(request.into_inner())).await
    }

    async fn list_agent_versions(
        &self,
        request: Request<pb::ListAgentVersionsRequest>,
    ) -> Result<Response<pb::ListAgentVersionsResponse>, Status> {
        unary(
            "ListAgentVersions",
            self.list_agent_versions_impl(request.into_inner()),
        )
        .await
    }

    async fn deprecate_agent_version(
        &self,
        request: Request<pb::DeprecateAgentVersionRequest>,
    ) -> Result<Response<pb::DeprecateAgentVersionResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("DeprecateAgentVersion", async {
            self.deprecate_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn retire_agent_version(
        &self,
        request: Request<pb::RetireAgentVersionRequest>,
    ) -> Result<Response<pb::RetireAgentVersionResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("RetireAgentVersion", async {
            self.retire_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn archive_agent(
        &self,
        request: Request<pb::ArchiveAgentRequest>,
    ) -> Result<Response<pb::ArchiveAgentResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("ArchiveAgent", async {
            self.archive_impl(request.into_inner(), actor?).await
        })
        .await
    }

    // --- Sessions ---------------------------------------------------------------------------

    async fn run_session(
        &self,
        request: Request<pb::RunSessionRequest>,
    ) -> Result<Response<pb::RunSessionResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("RunSession", async {
            self.run_session_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn run_session_interactive(
        &self,
        request: Request<Streaming<pb::RunSessionInteractiveClientMsg>>,
    ) -> Result<Response<Self::RunSessionInteractiveStream>, Status> {
        let actor = self.actor(&request, "");
        let principal = auth::principal(&request, &self.default_actor);
        unary("RunSessionInteractive", async {
            self.run_session_interactive_impl(request.into_inner(), actor?, principal)
                .await
        })
        .await
    }

    async fn cancel_session(
        &self,
        request: Request<pb::CancelSessionRequest>,
    ) -> Result<Response<pb::CancelSessionResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("CancelSession", async {
            self.cancel_session_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn complete_session(
        &self,
        request: Request<pb::CompleteSessionRequest>,
    ) -> Result<Response<pb::CompleteSessionResponse>, Status> {
        let actor = self.actor(&request, "");
        unary("CompleteSession", async {
            self.complete_session_impl(request.into_inner(), actor?)
                .await
        })
        .await
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        unary(
            "ListSessions",
            self.list_sessions_impl(request.into_inner()),
        )
        .await
    }

    async fn inspect_session(
        &self,
        request: Request<pb::InspectSessionRequest>,
    ) -> Result<Response<pb::InspectSessionResponse>, Status> {
        unary(
            "InspectSession",
            self.inspect_session_impl(request.into_inner()),
        )
        .await
    }

    async fn get_session_payload(
        &self,
        request: Request<pb::GetSessionPayloadRequest>,
    ) -> Result<Response<Self::GetSessionPayloadStream>, Status> {
        let chunks = unary(
            "GetSessionPayload",
            self.session_payload_impl(request.into_inner()),
        )
        .await?
        .into_inner();
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    // --- Approvals --------------------------------------------------------------------------

    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        unary("GetApproval", self.get_approval_impl(request.into_inner())).await
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        unary(
            "ListApprovals",
            self.list_approvals_impl(request.into_inner()),
        )
        .await
    }

    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        unary("WatchApprovals", async {
            self.watch_approvals_impl(&request.into_inner())
        })
        .await
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        let routes = auth::principal(&request, &self.default_actor).route_restriction();
        unary("DecideApproval", async {
            self.decide_approval_impl(request.into_inner(), actor?, routes)
                .await
        })
        .await
    }

    // --- Bundles ----------------------------------------------------------------------------

    async fn publish_bundle(
        &self,
        request: Request<pb::PublishBundleRequest>,
    ) -> Result<Response<pb::PublishBundleResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("PublishBundle", async {
            self.publish_bundle_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn deploy_bundle(
        &self,
        request: Request<pb::DeployBundleRequest>,
    ) -> Result<Response<pb::DeployBundleResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("DeployBundle", async {
            self.deploy_bundle_impl(request.into_inner(), actor?).await
        })
        .await
    }

    async fn rollback_bundle(
        &self,
        request: Request<pb::RollbackBundleRequest>,
    ) -> Result<Response<pb::RollbackBundleResponse>, Status> {
        let actor = self.actor(&request, &request.get_ref().actor);
        unary("RollbackBundle", async {
            self.rollback_bundle_impl(request.into_inner(), actor?)
                .await
        })
        .await
    }

    async fn get_active_bundle(
        &self,
        request: Request<pb::GetActiveBundleRequest>,
    ) -> Result<Response<pb::GetActiveBundleResponse>, Status> {
        unary(
            "GetActiveBundle",
            self.get_active_bundle_impl(request.into_inner()),
        )
        .await
    }

    async fn get_bundle_secret_requirements(
        &self,
        request: Request<pb::GetBundleSecretRequirementsRequest>,
    ) -> Result<Response<pb::GetBundleSecretRequirementsResponse>, Status> {
        unary(
            "GetBundleSecretRequirements",
            self.get_bundle_secret_requirements_impl(request.into_inner()),
        )
        .await
    }

    async fn list_bundles(
        &self,
        request: Request<pb::ListBundlesRequest>,
    ) -> Result<Response<pb::ListBundlesResponse>, Status> {
        unary("ListBundles", self.list_bundles_impl(request.into_inner())).await
    }

    async fn list_bundle_versions(
        &self,
        request: Request<pb::ListBundleVersionsRequest>,
    ) -> Result<Response<pb::ListBundleVersionsResponse>, Status> {
        unary(
            "ListBundleVersions",
            self.list_bundle_versions_impl(request.into_inner()),
        )
        .await
    }

    async fn list_bundle_deployments(
        &self,
        request: Request<pb::ListBundleDeploymentsRequest>,
    ) -> Result<Response<pb::ListBundleDeploymentsResponse>, Status> {
        unary(
            "ListBundleDeployments",
            self.list_bundle_deployments_impl(request.into_inner()),
        )
        .await
    }

    async fn get_bundle_version(
        &self,
        request: Request<pb::GetBundleVersionRequest>,
    ) -> Result<Response<pb::GetBundleVersionResponse>, Status> {
        unary(
            "GetBundleVersion",
            self.get_bundle_version_impl(request.into_inner()),
        )
        .await
    }

    // --- Workers ----------------------------------------------------------------------------

    async fn work(
        &self,
        request: Request<Streaming<pb::WorkClientMsg>>,
    ) -> Result<Response<Self::WorkStream>, Status> {
        let principal = crate::auth::principal(&request, &self.default_actor);
        let response = self.work.open(request.into_inner(), &principal).await?;
        Ok(Response::new(Box::pin(response)))
    }
}

#[cfg(test)]
mod tests;
