//! Sessions: `RunSession` / `RunSessionInteractive` start fields, `ListSessions` filters and
//! summaries, and the `InspectSession` tree and timeline.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use phrony_engine::{PlainSecret, SessionHandle};
use phrony_ledger::{AgentRef, SessionMode};
use phrony_manifest::CompiledAgent;
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;
use tonic::Status;

use super::{int32, optional_timestamp, token_usage, unix_ms};

// ---------------------------------------------------------------------------------------------
// Start

/// The agent a start names, and its explicit version (`None`: the active deployment).
///
/// Exactly one of `agent_ref` and `bundle_ref` must be set (an all-empty message counts as
/// unset). Bundles cannot be published on this runtime, so a `bundle_ref` is `Unimplemented`.
pub(crate) fn start_target(
    agent_ref: Option<&pb::AgentRef>,
    bundle_ref: Option<&pb::BundleRef>,
) -> Result<(AgentRef, Option<String>), Status> {
    let agent_ref = agent_ref
        .filter(|r| !(r.namespace.is_empty() && r.name.is_empty() && r.version.is_empty()));
    let bundle_ref = bundle_ref
        .filter(|r| !(r.namespace.is_empty() && r.name.is_empty() && r.version.is_empty()));
    match (agent_ref, bundle_ref) {
        (Some(_), Some(_)) => Err(Status::invalid_argument(
            "exactly one of agent_ref or bundle_ref is required (both were set)",
        )),
        (None, None) => Err(Status::invalid_argument(
            "agent_ref or bundle_ref is required",
        )),
        (None, Some(b)) => Err(Status::unimplemented(format!(
            "bundle_ref {}/{}: bundles cannot be published or run on this runtime yet; \
             run the agent with agent_ref instead",
            b.namespace, b.name
        ))),
        (Some(r), None) => {
            let agent = super::agent_ref(Some(r))?;
            Ok((agent, super::optional(&r.version).map(str::to_owned)))
        }
    }
}

/// The session input: empty means `{}`; otherwise UTF-8 JSON that is an object or a string
/// (the published SDK sends `run(input="text")` as a JSON string).
pub(crate) fn session_input(bytes: &[u8]) -> Result<Value, Status> {
    let Some(value) = json_document("input", bytes)? else {
        return Ok(Value::Object(serde_json::Map::new()));
    };
    match value {
        Value::Object(_) | Value::String(_) => Ok(value),
        other => Err(Status::invalid_argument(format!(
            "input must be a JSON object or a JSON string, got {}",
            json_kind(&other)
        ))),
    }
}

/// A JSON document sent as bytes in the field `field`: `None` when empty (or only whitespace),
/// else valid UTF-8 JSON, or `INVALID_ARGUMENT` saying what is wrong and where.
pub(crate) fn json_document(field: &str, bytes: &[u8]) -> Result<Option<Value>, Status> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Status::invalid_argument(format!(
            "{field} must be UTF-8 JSON (invalid UTF-8 at byte {})",
            e.valid_up_to()
        ))
    })?;
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| Status::invalid_argument(format!("{field} must be valid JSON: {e}")))
}

/// A JSON value's kind, for error messages.
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `SessionMode`: unspecified means task; unknown values are refused.
pub(crate) fn session_mode(mode: i32) -> Result<SessionMode, Status> {
    match pb::SessionMode::try_from(mode) {
        Ok(pb::SessionMode::Unspecified | pb::SessionMode::Task) => Ok(SessionMode::Task),
        Ok(pb::SessionMode::Conversation) => Ok(SessionMode::Conversation),
        Err(_) => Err(Status::invalid_argument(format!(
            "mode {mode} is not a known session mode (use SESSION_MODE_TASK or \
             SESSION_MODE_CONVERSATION)"
        ))),
    }
}

/// The wire value of a session mode.
pub(crate) fn mode_to_pb(mode: SessionMode) -> i32 {
    match mode {
        SessionMode::Task => pb::SessionMode::Task as i32,
        SessionMode::Conversation => pb::SessionMode::Conversation as i32,
    }
}

/// Most metadata pairs, and the longest key and value, a session accepts.
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 4096;

/// Session metadata: at most [`phrony_ledger::MAX_METADATA_PAIRS`] pairs, keys non-empty, at
/// most 128 bytes, without control characters; values at most 4096 bytes.
pub(crate) fn metadata(map: HashMap<String, String>) -> Result<BTreeMap<String, String>, Status> {
    if map.len() > phrony_ledger::MAX_METADATA_PAIRS {
        return Err(Status::invalid_argument(format!(
            "metadata has {} pairs; at most {} are allowed",
            map.len(),
            phrony_ledger::MAX_METADATA_PAIRS
        )));
    }
    let map: BTreeMap<String, String> = map.into_iter().collect();
    for (key, value) in &map {
        metadata_key(key)?;
        if value.len() > MAX_METADATA_VALUE {
            return Err(Status::invalid_argument(format!(
                "metadata value of {key:?} is {} bytes; at most {MAX_METADATA_VALUE} are allowed",
                value.len()
            )));
        }
    }
    Ok(map)
}

fn metadata_key(key: &str) -> Result<(), Status> {
    if key.trim().is_empty() {
        return Err(Status::invalid_argument("metadata keys must not be empty"));
    }
    if key.len() > MAX_METADATA_KEY || key.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "metadata key {key:?} must be at most {MAX_METADATA_KEY} bytes without control \
             characters"
        )));
    }
    Ok(())
}

/// The resolved secrets, which must be exactly the names the manifest declares. Every missing
/// and every unknown name is listed; values never appear in errors.
pub(crate) fn resolved_secrets(
    agent: &CompiledAgent,
    resolved: HashMap<String, Vec<u8>>,
) -> Result<Vec<PlainSecret>, Status> {
    let declared: BTreeSet<String> = agent
        .secret_requirements()
        .into_iter()
        .map(|r| r.name)
        .collect();
    let given: BTreeSet<&String> = resolved.keys().collect();
    let missing: Vec<&String> = declared.iter().filter(|n| !given.contains(n)).collect();
    let unknown: Vec<&String> = given
        .iter()
        .copied()
        .filter(|n| !declared.contains(*n))
        .collect();
    if !missing.is_empty() || !unknown.is_empty() {
        let list = |names: &[&String]| {
            names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!("missing resolved secrets: {}", list(&missing)));
        }
        if !unknown.is_empty() {
            if declared.is_empty() {
                problems.push(format!(
                    "unknown resolved secrets: {} (the manifest declares no secrets)",
                    list(&unknown)
                ));
            } else {
                problems.push(format!("unknown resolved secrets: {}", list(&unknown)));
            }
        }
        let declared_list = declared
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Status::invalid_argument(format!(
            "{}; agent {}/{}@{} declares [{declared_list}]",
            problems.join("; "),
            agent.metadata.namespace,
            agent.metadata.name,
            agent.metadata.version,
        )));
    }
    Ok(resolved
        .into_iter()
        .map(|(name, value)| PlainSecret::new(name, value))
        .collect())
}

/// A required session id.
pub(crate) fn session_id(id: &str) -> Result<&str, Status> {
    let id = id.trim();
    if id.is_empty() {
        return Err(Status::invalid_argument("session_id is required"));
    }
    Ok(id)
}

pub(crate) fn run_session_response(handle: &SessionHandle) -> pb::RunSessionResponse {
    pb::RunSessionResponse {
        session_id: handle.id.clone(),
        agent_version_id: handle.agent_version_id.to_string(),
        status: handle.status.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// ListSessions

/// The ledger filter and page of a `ListSessions` request, or `None` when the request asks for
/// bundle sessions: this runtime cannot run bundles, so there are none (an empty list, not an
/// error, so scripts listing "bundle sessions" keep working).
pub(crate) fn session_filter(
    r: &pb::ListSessionsRequest,
) -> Result<Option<(phrony_ledger::SessionFilter, phrony_ledger::PageRequest)>, Status> {
    let agent_ref = r
        .agent_ref
        .as_ref()
        .filter(|a| !(a.namespace.is_empty() && a.name.is_empty() && a.version.is_empty()));
    let bundle_ref = r
        .bundle_ref
        .as_ref()
        .filter(|b| !(b.namespace.is_empty() && b.name.is_empty() && b.version.is_empty()));
    if agent_ref.is_some() && bundle_ref.is_some() {
        return Err(Status::invalid_argument(
            "agent_ref and bundle_ref are mutually exclusive",
        ));
    }
    let bundle = match r.kind.as_str() {
        "" | "agent" => false,
        "bundle" => true,
        other => {
            return Err(Status::invalid_argument(format!(
                "kind {other:?} is not a session kind; expected \"agent\" or \"bundle\""
            )));
        }
    };
    if let Some(b) = bundle_ref
        && (b.namespace.is_empty() || b.name.is_empty())
    {
        return Err(Status::invalid_argument(
            "bundle_ref requires namespace and name",
        ));
    }
    let status = match r.status.trim() {
        "" => None,
        s => Some(
            s.parse::<phrony_ledger::SessionStatus>()
                .map_err(super::ledger_status)?,
        ),
    };
    for key in r.metadata.keys() {
        metadata_key(key)?;
    }
    let page = page_request(r.page_size, &r.page_token)?;
    if bundle || bundle_ref.is_some() {
        return Ok(None);
    }
    let (agent, agent_version) = match agent_ref {
        Some(a) => (
            Some(super::agent_ref(Some(a))?),
            super::optional(&a.version).map(str::to_owned),
        ),
        None => (None, None),
    };
    Ok(Some((
        phrony_ledger::SessionFilter {
            agent,
            agent_version,
            status,
            metadata: r
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            parent_session_id: None,
            include_children: r.include_children,
            created_after: None,
            created_before: None,
        },
        page,
    )))
}

/// `page_size` (0 = every match up to [`phrony_ledger::UNSIZED_PAGE_LIMIT`], as the unpaged
/// reference answered; above [`phrony_ledger::MAX_PAGE_SIZE`] clamped; negative refused) and
/// `page_token` (empty = the first page).
pub(crate) fn page_request(size: i32, token: &str) -> Result<phrony_ledger::PageRequest, Status> {
    let size = u32::try_from(size).map_err(|_| {
        Status::invalid_argument(format!("page_size must not be negative (got {size})"))
    })?;
    Ok(match token.trim() {
        "" => phrony_ledger::PageRequest::first(size),
        t => phrony_ledger::PageRequest::after(size, t),
    })
}

fn session_agent_ref(s: &phrony_ledger::Session) -> pb::AgentRef {
    pb::AgentRef {
        namespace: s.agent.namespace.clone(),
        name: s.agent.name.clone(),
        version: s.agent.version.clone(),
    }
}

fn session_summary(s: phrony_ledger::Session) -> pb::SessionSummary {
    pb::SessionSummary {
        agent_ref: Some(session_agent_ref(&s)),
        id: s.id,
        agent_version_id: s.agent_version_id.to_string(),
        status: s.status.to_string(),
        created_at: super::timestamp(s.created_at),
        updated_at: super::timestamp(s.updated_at),
        kind: "agent".to_owned(),
        bundle_version_id: String::new(),
        bundle_ref: None,
        metadata: s.metadata.into_iter().collect(),
        mode: mode_to_pb(s.mode),
    }
}

pub(crate) fn list_sessions_response(
    page: phrony_ledger::Page<phrony_ledger::Session>,
) -> pb::ListSessionsResponse {
    pb::ListSessionsResponse {
        sessions: page.items.into_iter().map(session_summary).collect(),
        next_page_token: page.next_token.unwrap_or_default(),
    }
}

// ---------------------------------------------------------------------------------------------
// InspectSession

/// A JSON value as a `google.protobuf.Value`. Numbers become doubles (the protobuf type has no
/// integers).
pub(crate) fn json_value(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(prost_types::NullValue::NullValue as i32),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

fn output_inspect(o: &phrony_engine::SessionOutput) -> pb::SessionOutputInspect {
    pb::SessionOutputInspect {
        message: o.message.clone(),
        stop_reason: o.stop_reason.clone().unwrap_or_default(),
        turn_usage: o.turn_usage.as_ref().map(token_usage),
        session_usage: Some(token_usage(&o.session_usage)),
        turns: o
            .turns
            .iter()
            .map(|t| pb::SessionTurnInspect {
                stop_reason: t.stop_reason.clone(),
                turn_usage: t.usage.as_ref().map(token_usage),
                turn_duration_ms: t
                    .duration_ms
                    .map_or(0, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
            })
            .collect(),
    }
}

/// The model of an agent version: `(provider, name)`, by agent version id.
pub(crate) type Models = HashMap<uuid::Uuid, (String, String)>;

fn session_inspect(n: phrony_engine::InspectedSession, models: &Models) -> pb::SessionInspect {
    let s = n.session;
    let (provider, model) = models.get(&s.agent_version_id).cloned().unwrap_or_default();
    let limits = s.limits.clone().unwrap_or_default();
    let limit = |v: Option<u64>| v.map_or(0, int32);
    pb::SessionInspect {
        agent: Some(pb::SessionAgentContext {
            namespace: s.agent.namespace.clone(),
            name: s.agent.name.clone(),
            version: s.agent.version.clone(),
            model_provider: provider,
            model_name: model,
            max_tokens_per_run: limit(limits.max_tokens_per_run),
            max_wall_clock_seconds: limit(limits.max_wall_clock_seconds),
        }),
        id: s.id,
        agent_version_id: s.agent_version_id.to_string(),
        status: s.status.to_string(),
        parent_session_id: s.parent_session_id.unwrap_or_default(),
        depth: int32(s.depth),
        bundle_version_id: String::new(),
        created_at: super::timestamp(s.created_at),
        updated_at: super::timestamp(s.updated_at),
        input: Some(json_value(&s.input)),
        output: Some(output_inspect(&n.output)),
        error: s.error.unwrap_or_default(),
        descriptive_metadata: n.evidence.as_ref().map(json_value),
        session_started_at_unix_ms: unix_ms(s.created_at),
        session_ended_at_unix_ms: s.ended_at.map_or(0, unix_ms),
        children: n
            .children
            .into_iter()
            .map(|c| session_inspect(c, models))
            .collect(),
        metadata: s.metadata.into_iter().collect(),
        mode: mode_to_pb(s.mode),
    }
}

fn event_entry(e: &phrony_ledger::Event) -> pb::SessionEventEntry {
    let seq = i64::try_from(e.seq).unwrap_or(i64::MAX);
    pb::SessionEventEntry {
        id: seq,
        r#type: e.event_type.clone(),
        payload: Some(json_value(&e.payload)),
        created_at: super::timestamp(e.ts),
        seq: int32(e.seq),
        ts_unix_ms: unix_ms(e.ts),
        session_id: e.stream.clone(),
        turn: e.turn.map_or(0, int32),
        call_id: e.call_id.clone().unwrap_or_default(),
        child_session_id: String::new(),
        actor: e.actor.clone(),
    }
}

fn invocation_entry(c: &phrony_ledger::ToolInvocation) -> pb::ToolInvocationEntry {
    let t = phrony_engine::call_timings(c);
    pb::ToolInvocationEntry {
        call_id: c.call_id.clone(),
        agent_version_id: c.agent_version_id.to_string(),
        turn: int32(c.turn),
        tool: c.tool.clone(),
        version: c.version.clone(),
        args: Some(json_value(&c.args)),
        result: c.result.as_ref().map(json_value),
        status: c.status.to_string(),
        worker_identity: c.worker_identity.clone().unwrap_or_default(),
        image_digest: c.image_digest.clone().unwrap_or_default(),
        descriptor_hash: c.descriptor_hash.clone().unwrap_or_default(),
        manifest_content_hash: c.manifest_content_hash.clone().unwrap_or_default(),
        attempt: int32(c.attempt),
        error_code: c.error_code.clone().unwrap_or_default(),
        error_message: c.error_message.clone().unwrap_or_default(),
        usage: c.usage.as_ref().map(token_usage),
        created_at: super::timestamp(c.created_at),
        updated_at: super::timestamp(c.updated_at),
        dispatched_at: optional_timestamp(c.dispatched_at),
        completed_at: optional_timestamp(c.completed_at),
        queue_delay_ms: t.queue_delay_ms.unwrap_or(0),
        execution_duration_ms: t.execution_ms.unwrap_or(0),
        total_duration_ms: t.total_ms.unwrap_or(0),
    }
}

pub(crate) fn inspect_response(
    inspection: phrony_engine::Inspection,
    models: &Models,
) -> pb::InspectSessionResponse {
    let timeline = inspection
        .timeline
        .iter()
        .map(|e| {
            let mut entry = pb::InspectTimelineEntry {
                timestamp: super::timestamp(e.at),
                gap_ms: e.gap_ms,
                source: e.item.source().to_owned(),
                kind: e.kind.clone(),
                summary: e.summary.clone(),
                event: None,
                invocation: None,
                approval: None,
                session_id: e.session_id.clone(),
                depth: int32(e.depth),
                seq: int32(e.seq),
                ts_unix_ms: unix_ms(e.at),
            };
            match &e.item {
                phrony_engine::TimelineItem::Event(ev) => entry.event = Some(event_entry(ev)),
                phrony_engine::TimelineItem::Invocation(c) => {
                    entry.invocation = Some(invocation_entry(c));
                }
                phrony_engine::TimelineItem::Approval(a) => {
                    entry.approval = Some(super::approvals::inspect_approval(a));
                }
            }
            entry
        })
        .collect();
    pb::InspectSessionResponse {
        session: Some(session_inspect(inspection.session, models)),
        timeline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn inputs_are_objects_or_strings() {
        assert_eq!(session_input(b"").unwrap(), serde_json::json!({}));
        assert_eq!(session_input(b"  \n").unwrap(), serde_json::json!({}));
        assert_eq!(
            session_input(br#"{"message":"hi"}"#).unwrap(),
            serde_json::json!({"message": "hi"})
        );
        assert_eq!(session_input(br#""hi""#).unwrap(), serde_json::json!("hi"));
        for (bytes, message) in [
            (
                &b"42"[..],
                "input must be a JSON object or a JSON string, got a number",
            ),
            (
                b"null",
                "input must be a JSON object or a JSON string, got null",
            ),
            (b"{", "input must be valid JSON: "),
            (
                b"\xff\xfe",
                "input must be UTF-8 JSON (invalid UTF-8 at byte 0)",
            ),
        ] {
            let err = session_input(bytes).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert!(err.message().starts_with(message), "{}", err.message());
        }
    }

    #[test]
    fn exactly_one_target() {
        let agent = pb::AgentRef {
            namespace: "support".into(),
            name: "refund-agent".into(),
            version: "0.1.0".into(),
        };
        let bundle = pb::BundleRef {
            namespace: "support".into(),
            name: "desk".into(),
            version: String::new(),
        };
        let (a, v) = start_target(Some(&agent), None).unwrap();
        assert_eq!(a, AgentRef::new("support", "refund-agent"));
        assert_eq!(v.as_deref(), Some("0.1.0"));
        let empty = pb::BundleRef::default();
        assert!(start_target(Some(&agent), Some(&empty)).is_ok());
        assert_eq!(
            start_target(Some(&agent), Some(&bundle))
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert_eq!(
            start_target(None, Some(&bundle)).unwrap_err().code(),
            Code::Unimplemented
        );
        assert_eq!(
            start_target(None, None).unwrap_err().message(),
            "agent_ref or bundle_ref is required"
        );
    }

    #[test]
    fn modes_default_to_task() {
        assert_eq!(session_mode(0).unwrap(), SessionMode::Task);
        assert_eq!(
            session_mode(pb::SessionMode::Conversation as i32).unwrap(),
            SessionMode::Conversation
        );
        assert_eq!(session_mode(42).unwrap_err().code(), Code::InvalidArgument);
    }

    #[test]
    fn metadata_keys_are_checked() {
        let ok: HashMap<String, String> = [("ticket".to_owned(), "T-1".to_owned())].into();
        assert_eq!(metadata(ok).unwrap()["ticket"], "T-1");
        let empty: HashMap<String, String> = [(" ".to_owned(), "x".to_owned())].into();
        assert_eq!(
            metadata(empty).unwrap_err().message(),
            "metadata keys must not be empty"
        );
        let long: HashMap<String, String> = [("k".repeat(129), "x".to_owned())].into();
        assert!(
            metadata(long)
                .unwrap_err()
                .message()
                .contains("at most 128 bytes")
        );
        let many: HashMap<String, String> = (0..=phrony_ledger::MAX_METADATA_PAIRS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(metadata(many).unwrap_err().message().contains("pairs"));
    }

    #[test]
    fn negative_page_sizes_are_refused() {
        assert_eq!(
            page_request(-1, "").unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            page_request(0, "").unwrap(),
            phrony_ledger::PageRequest::first(0)
        );
        assert_eq!(
            page_request(5, "tok").unwrap(),
            phrony_ledger::PageRequest::after(5, "tok")
        );
    }

    #[test]
    fn json_values_keep_their_shape() {
        use prost_types::value::Kind;
        let v = json_value(&serde_json::json!({"a": [1, "x", null, true]}));
        let Some(Kind::StructValue(s)) = v.kind else {
            panic!("not a struct: {v:?}")
        };
        let Some(Kind::ListValue(l)) = &s.fields["a"].kind else {
            panic!("not a list")
        };
        assert_eq!(l.values.len(), 4);
        assert_eq!(l.values[0].kind, Some(Kind::NumberValue(1.0)));
    }
}
