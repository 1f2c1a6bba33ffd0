//! The one place where protobuf meets domain types: request fields → domain values, domain
//! values → response messages, and domain errors → `tonic::Status`.
//!
//! Wire conventions (see `runtime.proto`): timestamps are RFC 3339 UTC strings with second
//! precision and the empty string for "not set"; JSON documents travel as UTF-8 bytes.

use chrono::{DateTime, SecondsFormat, Utc};
use phrony_engine::{Activated, ActivationError};
use phrony_ledger::{
    Agent, AgentRef, AgentVersion, ArchivedAgent, Deployment, LedgerError, Published,
    SecretEndpointChange,
};
use phrony_proto::runtime::v1 as pb;
use tonic::Status;

use crate::publish::SnapshotRejection;

pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod bundles;
pub(crate) mod interactive;
pub(crate) mod sessions;

// ---------------------------------------------------------------------------------------------
// Requests

/// An actor name from a request field or header: [`crate::Actor::parse`], `INVALID_ARGUMENT`
/// naming the broken rule.
pub(crate) fn actor(name: &str) -> Result<String, Status> {
    crate::Actor::parse(name)
        .map(crate::Actor::into_string)
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// `agent_ref` with namespace and name; its version is ignored.
pub(crate) fn agent_ref(r: Option<&pb::AgentRef>) -> Result<AgentRef, Status> {
    match r {
        Some(r) if !r.namespace.is_empty() && !r.name.is_empty() => {
            Ok(AgentRef::new(r.namespace.clone(), r.name.clone()))
        }
        _ => Err(Status::invalid_argument(
            "agent_ref requires namespace and name",
        )),
    }
}

/// `agent_ref` with namespace, name and version.
pub(crate) fn versioned_agent_ref(r: Option<&pb::AgentRef>) -> Result<(AgentRef, String), Status> {
    match r {
        Some(r) if !r.namespace.is_empty() && !r.name.is_empty() && !r.version.is_empty() => Ok((
            AgentRef::new(r.namespace.clone(), r.name.clone()),
            r.version.clone(),
        )),
        _ => Err(Status::invalid_argument(
            "agent_ref requires namespace, name, and version",
        )),
    }
}

/// An optional string field: empty means absent.
pub(crate) fn optional(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

// ---------------------------------------------------------------------------------------------
// Responses

/// RFC 3339, UTC, whole seconds: `2025-01-31T09:30:00Z`.
pub(crate) fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// [`timestamp`], or the empty string for "not set".
pub(crate) fn optional_timestamp(t: Option<DateTime<Utc>>) -> String {
    t.map(timestamp).unwrap_or_default()
}

/// Milliseconds since the Unix epoch (the `*_unix_ms` fields).
pub(crate) fn unix_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// A count or size in an `int32` field, saturating at `i32::MAX`.
pub(crate) fn int32(n: impl Into<u64>) -> i32 {
    i32::try_from(n.into()).unwrap_or(i32::MAX)
}

/// A JSON document as UTF-8 bytes (the `bytes` JSON fields).
pub(crate) fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Token usage on the wire (`total_tokens` = input + output).
pub(crate) fn token_usage(u: &phrony_ledger::Usage) -> pb::TokenUsage {
    pb::TokenUsage {
        input_tokens: int32(u.input_tokens),
        output_tokens: int32(u.output_tokens),
        total_tokens: int32(u.input_tokens.saturating_add(u.output_tokens)),
        estimated: u.estimated,
    }
}

pub(crate) fn version_response(
    version: &str,
    schema_version: Option<String>,
) -> pb::GetVersionResponse {
    pb::GetVersionResponse {
        version: version.to_owned(),
        schema_version: schema_version.unwrap_or_default(),
    }
}

pub(crate) fn publish_response(p: Published) -> pb::PublishResponse {
    pb::PublishResponse {
        agent_id: p.agent_id.to_string(),
        version_id: p.version_id.to_string(),
        content_hash: p.content_hash,
        namespace: p.agent.namespace,
        name: p.agent.name,
        version: p.version,
        created: Some(p.created),
    }
}

pub(crate) fn deploy_response(agent: AgentRef, a: Activated) -> pb::DeployResponse {
    let d = a.deployment;
    pb::DeployResponse {
        namespace: agent.namespace,
        name: agent.name,
        version: d.version,
        previous_version: d.previous_version.unwrap_or_default(),
        deployed_at: timestamp(d.created_at),
        secret_endpoint_changes: secret_endpoint_changes(a.changes),
    }
}

pub(crate) fn rollback_response(a: Activated) -> pb::RollbackResponse {
    let d = a.deployment;
    pb::RollbackResponse {
        version: d.version,
        previous_version: d.previous_version.unwrap_or_default(),
        secret_endpoint_changes: secret_endpoint_changes(a.changes),
    }
}

/// The changes as answered (`member` empty for an agent's own).
pub(crate) fn secret_endpoint_changes(
    changes: Vec<SecretEndpointChange>,
) -> Vec<pb::SecretEndpointChange> {
    changes
        .into_iter()
        .map(|c| pb::SecretEndpointChange {
            secret: c.secret,
            from_env: c.from_env,
            endpoint: c.endpoint,
            previous_endpoints: c.previous,
            member: c.member.unwrap_or_default(),
        })
        .collect()
}

/// A refused or failed deploy/rollback (of an agent or a bundle): the ledger's status,
/// `FAILED_PRECONDITION` for a secret sent to a new endpoint, `DATA_LOSS` for an unreadable stored snapshot.
pub(crate) fn activation_status(error: ActivationError) -> Status {
    match error {
        ActivationError::Ledger(e) => ledger_status(e),
        refused @ (ActivationError::NewSecretEndpoints { .. }
        | ActivationError::BundleNewSecretEndpoints { .. }) => {
            Status::failed_precondition(refused.to_string())
        }
        bad @ ActivationError::BadSnapshot { .. } => {
            tracing::error!(error = %bad, "stored snapshot is unreadable");
            Status::data_loss(bad.to_string())
        }
    }
}

pub(crate) fn active_version_response(d: Deployment) -> pb::GetActiveVersionResponse {
    pb::GetActiveVersionResponse {
        version: d.version,
        deployed_at: timestamp(d.created_at),
        actor: d.actor,
    }
}

pub(crate) fn list_deployments_response(
    deployments: Vec<Deployment>,
) -> pb::ListDeploymentsResponse {
    pb::ListDeploymentsResponse {
        deployments: deployments
            .into_iter()
            .map(|d| pb::DeploymentEntry {
                version: d.version,
                action: d.action.as_str().to_owned(),
                actor: d.actor,
                created_at: timestamp(d.created_at),
                lock_hash: String::new(),
            })
            .collect(),
    }
}

pub(crate) fn agent_version_response(v: AgentVersion) -> pb::GetAgentVersionResponse {
    pb::GetAgentVersionResponse {
        manifest: v.snapshot_json.into_bytes(),
        content_hash: v.content_hash,
        version: v.version,
        published_at: timestamp(v.published_at),
        deprecated_at: optional_timestamp(v.deprecated_at),
        retired_at: optional_timestamp(v.retired_at),
        published_by: v.published_by,
    }
}

pub(crate) fn list_agents_response(agents: Vec<Agent>) -> pb::ListAgentsResponse {
    pb::ListAgentsResponse {
        agents: agents
            .into_iter()
            .map(|a| pb::AgentSummary {
                id: a.id.to_string(),
                namespace: a.agent.namespace,
                name: a.agent.name,
                owner: a.owner,
                archived_at: optional_timestamp(a.archived_at),
            })
            .collect(),
    }
}

pub(crate) fn list_agent_versions_response(
    versions: Vec<AgentVersion>,
) -> pb::ListAgentVersionsResponse {
    pb::ListAgentVersionsResponse {
        versions: versions
            .into_iter()
            .map(|v| pb::AgentVersionSummary {
                id: v.id.to_string(),
                version: v.version,
                content_hash: v.content_hash,
                deployed_at: timestamp(v.published_at),
                deprecated_at: optional_timestamp(v.deprecated_at),
                retired_at: optional_timestamp(v.retired_at),
                published_by: v.published_by,
            })
            .collect(),
    }
}

pub(crate) fn deprecate_response(v: AgentVersion) -> pb::DeprecateAgentVersionResponse {
    pb::DeprecateAgentVersionResponse {
        version_id: v.id.to_string(),
    }
}

pub(crate) fn retire_response(v: AgentVersion) -> pb::RetireAgentVersionResponse {
    pb::RetireAgentVersionResponse {
        version_id: v.id.to_string(),
    }
}

pub(crate) fn archive_response(_archived: ArchivedAgent) -> pb::ArchiveAgentResponse {
    pb::ArchiveAgentResponse {}
}

// ---------------------------------------------------------------------------------------------
// Errors

/// The single mapping of ledger errors to gRPC statuses.
///
/// Caller mistakes and state refusals keep the ledger's message (the reference's wording).
/// Storage failures are logged here in full and reach the client without driver details.
pub(crate) fn ledger_status(error: LedgerError) -> Status {
    match error {
        LedgerError::NotFound { message } => Status::not_found(message),
        LedgerError::FailedPrecondition { message } => Status::failed_precondition(message),
        LedgerError::AlreadyExists { message } => Status::already_exists(message),
        LedgerError::PermissionDenied { message } => Status::permission_denied(message),
        LedgerError::InvalidArgument { message } => Status::invalid_argument(message),
        LedgerError::ResourceExhausted { message } => Status::resource_exhausted(message),
        LedgerError::Conflict { message } => {
            tracing::warn!(%message, "ledger write kept losing races");
            Status::aborted(format!("concurrent update, retry the request ({message})"))
        }
        LedgerError::Fenced { ref session_id, .. } => {
            tracing::warn!(error = %error, "write refused by a session lease's fence");
            Status::unavailable(format!(
                "session {session_id} is driven by another replica now; retry the request"
            ))
        }
        LedgerError::Unavailable { .. } => {
            tracing::error!(error = %error, "database unavailable");
            Status::unavailable("the runtime's database is unavailable; retry later")
        }
        LedgerError::Corrupt { ref message } => {
            tracing::error!(error = %error, "ledger data is corrupt");
            Status::data_loss(format!("ledger data is corrupt: {message}"))
        }
        LedgerError::BadEvent { .. } => {
            tracing::error!(error = %error, "ledger data is corrupt");
            Status::data_loss(error.to_string())
        }
        LedgerError::Database { ref context, .. } => {
            let status =
                Status::internal(format!("database error ({context}); see the runtime log"));
            tracing::error!(error = %error, "database error");
            status
        }
        other => {
            tracing::error!(error = %other, "unexpected ledger error");
            Status::internal("internal error; see the runtime log")
        }
    }
}

/// The single mapping of session-engine errors to gRPC statuses (the engine wraps the
/// ledger's errors in the same classes).
///
/// Caller mistakes and state refusals keep the engine's message; internal and storage failures
/// are logged here in full and reach the client without their details.
pub(crate) fn engine_status(error: phrony_engine::EngineError) -> Status {
    use phrony_engine::ErrorKind;
    match error.kind {
        ErrorKind::NotFound => Status::not_found(error.message),
        ErrorKind::FailedPrecondition => Status::failed_precondition(error.message),
        ErrorKind::AlreadyExists => Status::already_exists(error.message),
        ErrorKind::PermissionDenied => Status::permission_denied(error.message),
        ErrorKind::InvalidArgument => Status::invalid_argument(error.message),
        ErrorKind::ResourceExhausted => {
            tracing::info!(message = %error.message, "refused at a configured bound");
            Status::resource_exhausted(error.message)
        }
        ErrorKind::Conflict => {
            tracing::warn!(message = %error.message, "session write kept losing races");
            Status::aborted(format!(
                "concurrent update, retry the request ({})",
                error.message
            ))
        }
        ErrorKind::Fenced => {
            // The engine's message names the session and says to retry (issue #20).
            tracing::warn!(error = %error, source = ?error.source, "write refused by a session lease's fence");
            Status::unavailable(error.message)
        }
        ErrorKind::Unavailable => {
            tracing::error!(error = %error, source = ?error.source, "database unavailable");
            Status::unavailable("the runtime's database is unavailable; retry later")
        }
        ErrorKind::Internal => {
            tracing::error!(error = %error, source = ?error.source, "session engine error");
            Status::internal("internal error; see the runtime log")
        }
    }
}

/// A refused Publish snapshot: always `InvalidArgument`.
pub(crate) fn snapshot_status(rejection: &SnapshotRejection) -> Status {
    Status::invalid_argument(rejection.to_string())
}

// ---------------------------------------------------------------------------------------------
// Work stream (`Runtime.Work`): protobuf ↔ `phrony-dispatch` domain messages

/// A decoded `WorkClientMsg`: the register that opens a stream, or a later worker message.
#[derive(Debug)]
pub(crate) enum WorkerMessage {
    /// `register`.
    Register(phrony_dispatch::WorkerHello),
    /// `heartbeat`, `result` or `nack`.
    Other(phrony_dispatch::FromWorker),
}

/// Decodes one client message of a Work stream. A message without a known body (unset, or a
/// field this runtime does not know) is [`phrony_dispatch::DispatchError::UnknownMessage`].
pub(crate) fn work_client_msg(
    msg: pb::WorkClientMsg,
) -> Result<WorkerMessage, phrony_dispatch::DispatchError> {
    use pb::work_client_msg::Body;
    use phrony_dispatch::{FromWorker, HandlerAd, ToolError, WorkerHello};

    Ok(
        match msg
            .body
            .ok_or(phrony_dispatch::DispatchError::UnknownMessage)?
        {
            Body::Register(r) => WorkerMessage::Register(WorkerHello {
                worker_id: r.worker_id,
                workload_identity: r.workload_identity,
                image_digest: r.image_digest,
                handlers: r
                    .handlers
                    .into_iter()
                    .map(|h| HandlerAd {
                        tool: h.tool,
                        version: h.version,
                        contract_version: h.contract_version,
                        max_concurrency: h.max_concurrency,
                        descriptor_hash: h.descriptor_hash,
                    })
                    .collect(),
                in_flight: r.in_flight.into_iter().map(|c| c.call_id).collect(),
            }),
            Body::Heartbeat(pb::WorkHeartbeat {}) => WorkerMessage::Other(FromWorker::Heartbeat),
            Body::Result(r) => WorkerMessage::Other(FromWorker::Result {
                call_id: r.call_id,
                payload: r.payload,
                error: r.error.map(|e| ToolError::new(e.code, e.message)),
            }),
            Body::Nack(n) => WorkerMessage::Other(FromWorker::Nack {
                call_id: n.call_id,
                code: n.code,
                message: n.message,
            }),
        },
    )
}

/// Encodes one runtime message of a Work stream. Arguments travel as UTF-8 JSON (`{}` when
/// there are none) and an empty version as `default`.
pub(crate) fn work_server_msg(msg: phrony_dispatch::ToWorker) -> pb::WorkServerMsg {
    use pb::work_server_msg::Body;
    use phrony_dispatch::ToWorker;

    let body = match msg {
        ToWorker::Registered {
            worker_id,
            lease_ttl_ms,
        } => Body::Registered(pb::WorkRegistered {
            worker_id,
            lease_ttl_ms,
        }),
        ToWorker::Invoke(i) => Body::Invoke(pb::WorkInvoke {
            args: if i.args.is_null() {
                b"{}".to_vec()
            } else {
                i.args.to_string().into_bytes()
            },
            call_id: i.call_id,
            session_id: i.session_id,
            agent_version_id: i.agent_version_id,
            turn: i.turn,
            tool: i.tool,
            version: if i.version.is_empty() {
                phrony_dispatch::DEFAULT_VERSION.to_owned()
            } else {
                i.version
            },
            side_effect_class: i.side_effect_class,
            deadline_unix_ms: i.deadline_unix_ms,
            trace_context: i.trace_context.into_iter().collect(),
        }),
        ToWorker::Cancel { call_id } => Body::Cancel(pb::WorkToolCancel { call_id }),
        ToWorker::ResultAck { call_id } => Body::ResultAck(pb::WorkResultAck { call_id }),
        ToWorker::HeartbeatAck => Body::HeartbeatAck(pb::WorkHeartbeatAck {}),
    };
    pb::WorkServerMsg { body: Some(body) }
}

/// The single mapping of Work-stream protocol errors to gRPC statuses: the router's status
/// class, with its message (the reference's wording).
pub(crate) fn dispatch_status(error: &phrony_dispatch::DispatchError) -> Status {
    use phrony_dispatch::StatusClass;

    let code = match error.status() {
        StatusClass::InvalidArgument => tonic::Code::InvalidArgument,
        StatusClass::FailedPrecondition => tonic::Code::FailedPrecondition,
        StatusClass::NotFound => tonic::Code::NotFound,
        StatusClass::Aborted => tonic::Code::Aborted,
        StatusClass::ResourceExhausted => tonic::Code::ResourceExhausted,
        StatusClass::PermissionDenied => tonic::Code::PermissionDenied,
        StatusClass::Unavailable => tonic::Code::Unavailable,
    };
    Status::new(code, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use tonic::Code;

    #[test]
    fn timestamps_are_utc_seconds() {
        let t = Utc.with_ymd_and_hms(2025, 1, 31, 9, 30, 0).unwrap()
            + chrono::Duration::microseconds(123_456);
        assert_eq!(timestamp(t), "2025-01-31T09:30:00Z");
        assert_eq!(optional_timestamp(None), "");
    }

    #[test]
    fn agent_refs_need_their_parts() {
        let full = pb::AgentRef {
            namespace: "ns".into(),
            name: "a".into(),
            version: "1.0.0".into(),
        };
        assert_eq!(agent_ref(Some(&full)).unwrap(), AgentRef::new("ns", "a"));
        assert_eq!(
            versioned_agent_ref(Some(&full)).unwrap(),
            (AgentRef::new("ns", "a"), "1.0.0".to_owned())
        );
        let no_version = pb::AgentRef {
            version: String::new(),
            ..full.clone()
        };
        let err = versioned_agent_ref(Some(&no_version)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert_eq!(
            err.message(),
            "agent_ref requires namespace, name, and version"
        );
        for missing in [
            None,
            Some(&pb::AgentRef {
                name: String::new(),
                ..full.clone()
            }),
        ] {
            let err = agent_ref(missing).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert_eq!(err.message(), "agent_ref requires namespace and name");
        }
    }

    #[test]
    fn ledger_errors_map_to_codes() {
        let cases = [
            (
                LedgerError::NotFound {
                    message: "agent a/b not found".into(),
                },
                Code::NotFound,
            ),
            (
                LedgerError::FailedPrecondition {
                    message: "m".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                LedgerError::AlreadyExists {
                    message: "m".into(),
                },
                Code::AlreadyExists,
            ),
            (
                LedgerError::InvalidArgument {
                    message: "m".into(),
                },
                Code::InvalidArgument,
            ),
            (
                LedgerError::ResourceExhausted {
                    message: "m".into(),
                },
                Code::ResourceExhausted,
            ),
            (
                LedgerError::Conflict {
                    message: "m".into(),
                },
                Code::Aborted,
            ),
            (
                LedgerError::Corrupt {
                    message: "stream x seq 3".into(),
                },
                Code::DataLoss,
            ),
            (
                LedgerError::Config {
                    message: "m".into(),
                },
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let shown = error.to_string();
            let status = ledger_status(error);
            assert_eq!(status.code(), code, "{shown}");
        }
        let status = ledger_status(LedgerError::NotFound {
            message: "agent a/b not found".into(),
        });
        assert_eq!(status.message(), "agent a/b not found");
    }

    #[test]
    fn storage_failures_hide_driver_details() {
        let status = ledger_status(LedgerError::Database {
            context: "insert version".into(),
            error: phrony_ledger_sqlx_error(),
        });
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            "database error (insert version); see the runtime log"
        );
        let status = ledger_status(LedgerError::Unavailable {
            context: "cannot connect to PostgreSQL at postgres://u:***@h/db".into(),
            error: phrony_ledger_sqlx_error(),
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            !status.message().contains("postgres://"),
            "{}",
            status.message()
        );
    }

    /// A write refused because this replica lost the session's lease reaches clients as
    /// `UNAVAILABLE` (retryable) naming the session, never `INTERNAL` (issue #20).
    #[test]
    fn a_fenced_write_is_unavailable_and_says_to_retry() {
        let fenced = || LedgerError::Fenced {
            session_id: "run_x".into(),
            epoch: 3,
        };
        let expected = "session run_x is driven by another replica now; retry the request";
        // Through the engine (a cancel, a driver write): the ledger's error in a store error.
        let error = phrony_engine::EngineError::from(phrony_engine::StoreError::from(fenced()));
        let status = engine_status(error);
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), expected);
        // Straight from the ledger.
        let status = ledger_status(fenced());
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), expected);
    }

    #[test]
    fn a_reached_bound_is_resource_exhausted_with_its_message() {
        let message = "session run_x has 32 user messages waiting for their turn; at most 32 \
                       may wait (RUNTIME_MAX_QUEUED_USER_MESSAGES)";
        let status = engine_status(phrony_engine::EngineError::exhausted(message));
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), message);
        let status = ledger_status(LedgerError::ResourceExhausted {
            message: message.into(),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), message);
    }

    /// A driver error value, built without naming the driver crate.
    fn phrony_ledger_sqlx_error<E: From<std::io::Error>>() -> E {
        E::from(std::io::Error::other("secret driver detail"))
    }
}
