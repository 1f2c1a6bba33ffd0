//! Session RPCs (§5): start (shared by `RunSession` and `RunSessionInteractive`), cancel,
//! complete, list and inspect. The engine runs the sessions; the ledger answers the reads.

use phrony_auth::Attribution;
use std::collections::{BTreeSet, HashMap};

use phrony_engine::{BundleStart, Engine, PreparedAgent, SessionHandle, StartSession};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use super::RuntimeService;
use crate::convert::sessions as conv;
use crate::convert::{engine_status, ledger_status};

/// What a session start asks for: the fields `RunSessionRequest` and
/// `RunSessionInteractiveStart` share, plus the resolved actor.
pub(crate) struct StartRequest {
    /// The agent to run (exclusive with `bundle_ref`).
    pub agent_ref: Option<pb::AgentRef>,
    /// The bundle to run: its root member (exclusive with `agent_ref`).
    pub bundle_ref: Option<pb::BundleRef>,
    /// UTF-8 JSON: an object or a string; empty means `{}`.
    pub input: Vec<u8>,
    /// Secret values by name; must be exactly the manifest's declared set. Never logged.
    pub resolved_secrets: HashMap<String, Vec<u8>>,
    /// Caller labels stored with the session.
    pub metadata: HashMap<String, String>,
    /// A `pb::SessionMode` value; unspecified means task.
    pub mode: i32,
    /// Who starts the session.
    pub actor: Attribution,
}

impl std::fmt::Debug for StartRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.resolved_secrets.keys().collect();
        names.sort();
        f.debug_struct("StartRequest")
            .field("agent_ref", &self.agent_ref)
            .field("bundle_ref", &self.bundle_ref)
            .field("input_bytes", &self.input.len())
            .field("resolved_secret_names", &names)
            .field("metadata", &self.metadata)
            .field("mode", &self.mode)
            .field("actor", &self.actor)
            .finish()
    }
}

/// A start target resolved to the agent version that runs.
struct ResolvedTarget {
    agent_version_id: uuid::Uuid,
    agent: PreparedAgent,
    /// The secret names the start must resolve: the agent's, or the bundle's union.
    secret_names: BTreeSet<String>,
    /// `agent ns/name@v` or `bundle ns/name@v`, for messages and logs.
    label: String,
    bundle: Option<BundleStart>,
}

impl RuntimeService {
    /// Starts a session (§5.3): resolves the agent to its active deployment, or the bundle to
    /// its active deployment's root member (an explicit version must be the active one), checks
    /// the input, the secrets (exactly the declared set; for a bundle, the union over its
    /// members) and the metadata, and hands it to the engine, whose driver runs the first turn in the
    /// background. Returns the started session.
    ///
    /// Errors: `InvalidArgument` for a malformed request (naming the field and the problem);
    /// `NotFound` for an unknown agent or bundle; `FailedPrecondition`
    /// when the agent cannot be run (archived, nothing deployed, a version that is not the
    /// active one, a retired or deprecated active version, an unusable model configuration);
    /// `Unavailable` when this service runs no engine.
    pub(crate) async fn start_session(&self, req: StartRequest) -> Result<SessionHandle, Status> {
        let engine = self.engine()?;
        let target = conv::start_target(req.agent_ref.as_ref(), req.bundle_ref.as_ref())?;
        let input = conv::session_input(&req.input)?;
        let mode = conv::session_mode(req.mode)?;
        let metadata = conv::metadata(req.metadata)?;
        let resolved = self.resolve_target(engine, &target).await?;
        let secrets = conv::resolved_secrets(
            &resolved.secret_names,
            &resolved.label,
            req.resolved_secrets,
        )?;
        let handle = engine
            .start_session(StartSession {
                session_id: None,
                agent_version_id: resolved.agent_version_id,
                agent: resolved.agent,
                input,
                metadata,
                mode,
                principal: None,
                secrets,
                actor: req.actor.clone(),
                bundle: resolved.bundle,
            })
            .await
            .map_err(engine_status)?;
        tracing::info!(
            session_id = %handle.id, target = %resolved.label, actor = %req.actor, ?mode,
            "session started"
        );
        Ok(handle)
    }

    /// The runnable agent version a start target names: the agent's active deployment, or the
    /// root member of the bundle's active deployment (an explicit version must be that one),
    /// prepared by the engine (once per version: a start of a version it ran before parses
    /// and compiles nothing).
    async fn resolve_target(
        &self,
        engine: &Engine,
        target: &conv::StartTarget,
    ) -> Result<ResolvedTarget, Status> {
        match target {
            conv::StartTarget::Agent(agent, version) => {
                let stored = self
                    .ledger
                    .runnable_version(agent, version.as_deref())
                    .await
                    .map_err(ledger_status)?;
                let label = format!("agent {agent}@{}", stored.version);
                let prepared = engine
                    .prepare_version(stored.id, &stored.content_hash, &stored.snapshot_json)
                    .map_err(engine_status)?;
                let secret_names = prepared
                    .agent()
                    .secret_requirements()
                    .into_iter()
                    .map(|r| r.name)
                    .collect();
                Ok(ResolvedTarget {
                    agent_version_id: stored.id,
                    agent: prepared,
                    secret_names,
                    label,
                    bundle: None,
                })
            }
            conv::StartTarget::Bundle(bundle, version) => {
                let runnable = self
                    .ledger
                    .runnable_bundle(bundle, version.as_deref())
                    .await
                    .map_err(ledger_status)?;
                let label = format!("bundle {bundle}@{}", runnable.version.version);
                let mut members = Vec::with_capacity(runnable.members.len());
                for m in &runnable.members {
                    members.push((
                        m.child_name.clone(),
                        super::bundles::load_member(bundle, m)?,
                    ));
                }
                let union = phrony_manifest::bundle_secret_union(
                    members.iter().map(|(c, a)| (c.as_str(), a)),
                )
                .map_err(|conflicts| {
                    Status::data_loss(format!(
                        "the stored members of {label} declare conflicting secrets: {}",
                        conflicts.join("; ")
                    ))
                })?;
                let secret_names: BTreeSet<String> = union.into_iter().map(|s| s.name).collect();
                let root = &runnable.root;
                let prepared = engine
                    .prepare_version(root.id, &root.content_hash, &root.snapshot_json)
                    .map_err(engine_status)?;
                Ok(ResolvedTarget {
                    agent_version_id: runnable.root.id,
                    agent: prepared,
                    secret_names: secret_names.clone(),
                    label,
                    bundle: Some(BundleStart {
                        bundle_version_id: runnable.version.id,
                        secret_names,
                    }),
                })
            }
        }
    }

    pub(super) async fn run_session_impl(
        &self,
        request: pb::RunSessionRequest,
        actor: Attribution,
    ) -> Result<pb::RunSessionResponse, Status> {
        let handle = self
            .start_session(StartRequest {
                agent_ref: request.agent_ref,
                bundle_ref: request.bundle_ref,
                input: request.input,
                resolved_secrets: request.resolved_secrets,
                metadata: request.metadata,
                mode: request.mode,
                actor,
            })
            .await?;
        Ok(conv::run_session_response(&handle))
    }

    pub(super) async fn cancel_session_impl(
        &self,
        request: pb::CancelSessionRequest,
        actor: Attribution,
    ) -> Result<pb::CancelSessionResponse, Status> {
        let id = conv::session_id(&request.session_id)?;
        let ended = self.engine()?.cancel_session(id, &actor).await;
        let session = self.ended(id, ended, "cancelled").await?;
        tracing::info!(session_id = %session.id, %actor, "session cancelled");
        Ok(pb::CancelSessionResponse {})
    }

    /// The outcome of a cancel or complete. The engine answers `NotFound` both for an unknown
    /// session and for one that already ended; the client learns which: `NotFound`
    /// (`session X not found`) or `FailedPrecondition`
    /// (`session X is already completed and cannot be cancelled`).
    async fn ended(
        &self,
        id: &str,
        result: Result<phrony_engine::Session, phrony_engine::EngineError>,
        verb: &str,
    ) -> Result<phrony_engine::Session, Status> {
        match result {
            Ok(session) => Ok(session),
            Err(e) if e.kind == phrony_engine::ErrorKind::NotFound => {
                match self.ledger.get_session(id).await {
                    Ok(s) if s.status.is_terminal() => Err(Status::failed_precondition(format!(
                        "session {id} is already {} and cannot be {verb}",
                        s.status
                    ))),
                    Ok(_) => Err(engine_status(e)),
                    Err(phrony_ledger::LedgerError::NotFound { .. }) => {
                        Err(Status::not_found(format!("session {id} not found")))
                    }
                    Err(other) => Err(ledger_status(other)),
                }
            }
            Err(e) => Err(engine_status(e)),
        }
    }

    pub(super) async fn complete_session_impl(
        &self,
        request: pb::CompleteSessionRequest,
        actor: Attribution,
    ) -> Result<pb::CompleteSessionResponse, Status> {
        let id = conv::session_id(&request.session_id)?;
        let ended = self.engine()?.complete_session(id, &actor).await;
        let session = self.ended(id, ended, "completed").await?;
        tracing::info!(session_id = %session.id, %actor, "session completed on request");
        Ok(pb::CompleteSessionResponse {})
    }
}

impl RuntimeService {
    pub(super) async fn list_sessions_impl(
        &self,
        request: pb::ListSessionsRequest,
    ) -> Result<pb::ListSessionsResponse, Status> {
        let (filter, page) = conv::session_filter(&request)?;
        let found = self
            .ledger
            .list_sessions(&filter, &page)
            .await
            .map_err(ledger_status)?;
        super::warn_if_capped("ListSessions", request.page_size, found.next_token.as_ref());
        // The bundle each bundle session was started from (one read per distinct version).
        let mut bundles = HashMap::new();
        for id in found.items.iter().filter_map(|s| s.bundle_version_id) {
            if let std::collections::hash_map::Entry::Vacant(slot) = bundles.entry(id) {
                let version = self
                    .ledger
                    .get_bundle_version_by_id(id)
                    .await
                    .map_err(ledger_status)?;
                slot.insert(version);
            }
        }
        Ok(conv::list_sessions_response(found, &bundles))
    }

    /// One page of a session's inspection (see `runtime.proto`: every response stays under
    /// [`conv::INSPECT_RESPONSE_BUDGET`]; long payloads are shortened and noted).
    pub(super) async fn inspect_session_impl(
        &self,
        request: pb::InspectSessionRequest,
    ) -> Result<pb::InspectSessionResponse, Status> {
        let id = conv::session_id(&request.session_id)?;
        let page = conv::inspect_page(&request)?;
        let inspection = self.inspection(id).await?;
        let models = self.models(&inspection).await;
        Ok(conv::inspect_response(inspection, &models, page))
    }

    /// One payload of an inspected session whole, as chunks of its JSON text.
    pub(super) async fn session_payload_impl(
        &self,
        request: pb::GetSessionPayloadRequest,
    ) -> Result<Vec<pb::SessionPayloadChunk>, Status> {
        let selector = conv::payload_selector(&request)?;
        let inspection = self.inspection(&selector.session_id).await?;
        let value = phrony_engine::payload(&inspection, &selector).map_err(engine_status)?;
        Ok(conv::payload_chunks(&value))
    }

    async fn inspection(&self, id: &str) -> Result<phrony_engine::Inspection, Status> {
        let timeline = self
            .ledger
            .session_timeline(id)
            .await
            .map_err(ledger_status)?;
        phrony_engine::inspect(timeline).map_err(engine_status)
    }

    /// The model of each agent version the inspected tree runs.
    async fn models(&self, inspection: &phrony_engine::Inspection) -> conv::Models {
        let mut models = conv::Models::new();
        for session in phrony_engine::sessions_by_id(inspection).values() {
            let version_id = session.agent_version_id;
            if models.contains_key(&version_id) {
                continue;
            }
            // The model is context, not the point of an inspection: a version that no longer
            // loads shows an empty model rather than failing the whole read.
            let model = match self.ledger.get_agent_version_by_id(version_id).await {
                Ok(v) => match phrony_manifest::CompiledAgent::from_snapshot_json(
                    v.snapshot_json.as_bytes(),
                ) {
                    Ok(agent) => (agent.spec.model.provider, agent.spec.model.name),
                    Err(e) => {
                        tracing::warn!(%version_id, error = %e, "stored agent snapshot does not load");
                        (String::new(), String::new())
                    }
                },
                Err(e) => {
                    tracing::warn!(%version_id, error = %e, "agent version of an inspected session");
                    (String::new(), String::new())
                }
            };
            models.insert(version_id, model);
        }
        models
    }
}
