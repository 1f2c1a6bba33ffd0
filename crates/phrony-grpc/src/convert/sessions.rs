//! Sessions: `RunSession` / `RunSessionInteractive` start fields, `ListSessions` filters and
//! summaries, and the `InspectSession` tree and timeline.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use phrony_engine::{PlainSecret, SessionHandle};
use phrony_ledger::{AgentRef, BundleRef, SessionMode};
use phrony_proto::runtime::v1 as pb;
use serde_json::Value;
use tonic::Status;

use super::{int32, optional_timestamp, token_usage, unix_ms};

// ---------------------------------------------------------------------------------------------
// Start

/// What a start names: an agent or a bundle, and its explicit version (`None`: the active
/// deployment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartTarget {
    /// `agent_ref`.
    Agent(AgentRef, Option<String>),
    /// `bundle_ref`: the bundle's root member runs.
    Bundle(BundleRef, Option<String>),
}

/// The target of a start. Exactly one of `agent_ref` and `bundle_ref` must be set (an
/// all-empty message counts as unset).
pub(crate) fn start_target(
    agent_ref: Option<&pb::AgentRef>,
    bundle_ref: Option<&pb::BundleRef>,
) -> Result<StartTarget, Status> {
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
        (None, Some(b)) => {
            let (bundle, version) = super::bundles::bundle_ref(Some(b))?;
            Ok(StartTarget::Bundle(bundle, version))
        }
        (Some(r), None) => {
            let agent = super::agent_ref(Some(r))?;
            Ok(StartTarget::Agent(
                agent,
                super::optional(&r.version).map(str::to_owned),
            ))
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

/// The resolved secrets, which must be exactly the `declared` names (an agent's secrets, or
/// the union over a bundle's members); `target` names what declares them in errors
/// (`agent ns/name@v`). Every missing and every unknown name is listed; values never appear
/// in errors.
pub(crate) fn resolved_secrets(
    declared: &BTreeSet<String>,
    target: &str,
    resolved: HashMap<String, Vec<u8>>,
) -> Result<Vec<PlainSecret>, Status> {
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
            "{}; {target} declares [{declared_list}]",
            problems.join("; "),
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

/// The ledger filter and page of a `ListSessions` request. `kind` empty lists both kinds;
/// a `bundle_ref` implies bundle sessions.
pub(crate) fn session_filter(
    r: &pb::ListSessionsRequest,
) -> Result<(phrony_ledger::SessionFilter, phrony_ledger::PageRequest), Status> {
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
    let kind = match r.kind.as_str() {
        "" => None,
        "agent" => Some(phrony_ledger::SessionKind::Agent),
        "bundle" => Some(phrony_ledger::SessionKind::Bundle),
        other => {
            return Err(Status::invalid_argument(format!(
                "kind {other:?} is not a session kind; expected \"agent\" or \"bundle\""
            )));
        }
    };
    if kind == Some(phrony_ledger::SessionKind::Agent) && bundle_ref.is_some() {
        return Err(Status::invalid_argument(
            "kind \"agent\" and bundle_ref are mutually exclusive",
        ));
    }
    if kind == Some(phrony_ledger::SessionKind::Bundle) && agent_ref.is_some() {
        return Err(Status::invalid_argument(
            "kind \"bundle\" and agent_ref are mutually exclusive",
        ));
    }
    let (bundle, bundle_version) = match bundle_ref {
        Some(b) => {
            let (bundle, version) = super::bundles::bundle_ref(Some(b))?;
            (Some(bundle), version)
        }
        None => (None, None),
    };
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
    let (agent, agent_version) = match agent_ref {
        Some(a) => (
            Some(super::agent_ref(Some(a))?),
            super::optional(&a.version).map(str::to_owned),
        ),
        None => (None, None),
    };
    Ok((
        phrony_ledger::SessionFilter {
            agent,
            agent_version,
            kind,
            bundle,
            bundle_version,
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
    ))
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

/// A session's summary; `bundles` holds the bundle versions bundle sessions record.
fn session_summary(
    s: phrony_ledger::Session,
    bundles: &HashMap<uuid::Uuid, phrony_ledger::BundleVersion>,
) -> pb::SessionSummary {
    let bundle = s.bundle_version_id.and_then(|id| bundles.get(&id));
    pb::SessionSummary {
        agent_ref: Some(session_agent_ref(&s)),
        id: s.id,
        agent_version_id: s.agent_version_id.to_string(),
        status: s.status.to_string(),
        created_at: super::timestamp(s.created_at),
        updated_at: super::timestamp(s.updated_at),
        kind: if s.bundle_version_id.is_some() {
            "bundle"
        } else {
            "agent"
        }
        .to_owned(),
        bundle_version_id: s
            .bundle_version_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        bundle_ref: bundle.map(|b| pb::BundleRef {
            namespace: b.bundle.namespace.clone(),
            name: b.bundle.name.clone(),
            version: b.version.clone(),
        }),
        started_by_verification: s
            .created_by_verification
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default(),
        started_by_via: s.created_by_via.unwrap_or_default(),
        started_by: s.created_by,
        metadata: s.metadata.into_iter().collect(),
        mode: mode_to_pb(s.mode),
    }
}

pub(crate) fn list_sessions_response(
    page: phrony_ledger::Page<phrony_ledger::Session>,
    bundles: &HashMap<uuid::Uuid, phrony_ledger::BundleVersion>,
) -> pb::ListSessionsResponse {
    pb::ListSessionsResponse {
        sessions: page
            .items
            .into_iter()
            .map(|s| session_summary(s, bundles))
            .collect(),
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

/// The most bytes one `InspectSession` response encodes to: under gRPC's default 4 MiB receive
/// limit (the published SDK's) with room for framing and headers.
pub(crate) const INSPECT_RESPONSE_BUDGET: usize = 3 * 1024 * 1024;

/// The longest piece of a payload one `GetSessionPayload` message carries.
pub(crate) const PAYLOAD_CHUNK_BYTES: usize = 1024 * 1024;

/// Converts the payload fields of one record, shortening those longer than
/// [`phrony_engine::INLINE_PAYLOAD_BYTES`] and noting each as a `TruncatedPayload` whose
/// `PayloadRef` is `base` with the field's name.
pub(crate) struct Shortener {
    base: pb::PayloadRef,
    /// Prefix of the noted field names (`"event."`, `"approval."`…; empty for a session).
    prefix: &'static str,
    truncated: Vec<pb::TruncatedPayload>,
}

impl Shortener {
    fn new(base: pb::PayloadRef, prefix: &'static str) -> Self {
        Self {
            base,
            prefix,
            truncated: Vec::new(),
        }
    }

    fn note(&mut self, shown: &str, field: &str, full: &Value) {
        self.truncated.push(pb::TruncatedPayload {
            field: format!("{}{shown}", self.prefix),
            size_bytes: i64::try_from(phrony_engine::json_text_len(full)).unwrap_or(i64::MAX),
            r#ref: Some(pb::PayloadRef {
                field: field.to_owned(),
                ..self.base.clone()
            }),
        });
    }

    /// A JSON field (`shown` in the response, `field` in its `PayloadRef`).
    pub(crate) fn value(&mut self, shown: &str, field: &str, v: &Value) -> prost_types::Value {
        match phrony_engine::shorten_json(v, phrony_engine::INLINE_PAYLOAD_BYTES) {
            None => json_value(v),
            Some(short) => {
                self.note(shown, field, v);
                json_value(&short)
            }
        }
    }

    /// A text field, shortened like a JSON string.
    pub(crate) fn text(&mut self, shown: &str, field: &str, t: &str) -> String {
        // A string's JSON text is at least as long as the string, and at most six times.
        if t.len().saturating_mul(6) <= phrony_engine::INLINE_PAYLOAD_BYTES {
            return t.to_owned();
        }
        let full = Value::String(t.to_owned());
        match phrony_engine::shorten_json(&full, phrony_engine::INLINE_PAYLOAD_BYTES) {
            Some(Value::String(short)) => {
                self.note(shown, field, &full);
                short
            }
            _ => t.to_owned(),
        }
    }

    /// A JSON value sent as its text: whole when it fits the inline budget, else empty and
    /// noted as shortened (a shortened JSON text would not parse).
    pub(crate) fn json_text(&mut self, shown: &str, field: &str, v: &Value) -> String {
        let text = v.to_string();
        if text.len() <= phrony_engine::INLINE_PAYLOAD_BYTES {
            return text;
        }
        self.note(shown, field, v);
        String::new()
    }

    fn done(self) -> Vec<pb::TruncatedPayload> {
        self.truncated
    }
}

fn output_inspect(
    o: &phrony_engine::SessionOutput,
    bound: &mut Shortener,
) -> pb::SessionOutputInspect {
    pb::SessionOutputInspect {
        message: bound.text("output.message", "output", &o.message),
        json: o
            .json
            .as_ref()
            .map(|j| bound.json_text("output.json", "output_json", j))
            .unwrap_or_default(),
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
    let mut bound = Shortener::new(
        pb::PayloadRef {
            session_id: s.id.clone(),
            ..pb::PayloadRef::default()
        },
        "",
    );
    let input = bound.value("input", "input", &s.input);
    let output = output_inspect(&n.output, &mut bound);
    let error = s
        .error
        .as_deref()
        .map(|e| bound.text("error", "error", e))
        .unwrap_or_default();
    let descriptive_metadata = n
        .evidence
        .as_ref()
        .map(|v| bound.value("descriptive_metadata", "descriptive_metadata", v));
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
        bundle_version_id: s
            .bundle_version_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        created_at: super::timestamp(s.created_at),
        updated_at: super::timestamp(s.updated_at),
        input: Some(input),
        output: Some(output),
        error,
        descriptive_metadata,
        session_started_at_unix_ms: unix_ms(s.created_at),
        session_ended_at_unix_ms: s.ended_at.map_or(0, unix_ms),
        children: n
            .children
            .into_iter()
            .map(|c| session_inspect(c, models))
            .collect(),
        metadata: s.metadata.into_iter().collect(),
        mode: mode_to_pb(s.mode),
        truncated: bound.done(),
        started_by_verification: s
            .created_by_verification
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default(),
        started_by_via: s.created_by_via.unwrap_or_default(),
        started_by: s.created_by,
    }
}

fn event_entry(e: &phrony_ledger::Event, bound: &mut Shortener) -> pb::SessionEventEntry {
    let seq = i64::try_from(e.seq).unwrap_or(i64::MAX);
    pb::SessionEventEntry {
        id: seq,
        r#type: e.event_type.clone(),
        payload: Some(bound.value("payload", "payload", &e.payload)),
        created_at: super::timestamp(e.ts),
        seq: int32(e.seq),
        ts_unix_ms: unix_ms(e.ts),
        session_id: e.stream.clone(),
        turn: e.turn.map_or(0, int32),
        call_id: e.call_id.clone().unwrap_or_default(),
        child_session_id: String::new(),
        actor: e.actor.clone(),
        actor_verification: e
            .actor_verification
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default(),
        actor_via: e.actor_via.clone().unwrap_or_default(),
    }
}

fn invocation_entry(
    c: &phrony_ledger::ToolInvocation,
    bound: &mut Shortener,
) -> pb::ToolInvocationEntry {
    let t = phrony_engine::call_timings(c);
    pb::ToolInvocationEntry {
        call_id: c.call_id.clone(),
        agent_version_id: c.agent_version_id.to_string(),
        turn: int32(c.turn),
        tool: c.tool.clone(),
        version: c.version.clone(),
        args: Some(bound.value("args", "args", &c.args)),
        result: c
            .result
            .as_ref()
            .map(|r| bound.value("result", "result", r)),
        status: c.status.to_string(),
        worker_identity: c.worker_identity.clone().unwrap_or_default(),
        image_digest: c.image_digest.clone().unwrap_or_default(),
        descriptor_hash: c.descriptor_hash.clone().unwrap_or_default(),
        manifest_content_hash: c.manifest_content_hash.clone().unwrap_or_default(),
        attempt: int32(c.attempt),
        error_code: c.error_code.clone().unwrap_or_default(),
        error_message: c
            .error_message
            .as_deref()
            .map(|m| bound.text("error_message", "error_message", m))
            .unwrap_or_default(),
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

/// The timeline entries an `InspectSession` request asks for: at most `size` (0: as many as fit
/// in [`INSPECT_RESPONSE_BUDGET`]) from position `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InspectPage {
    pub size: usize,
    pub offset: usize,
}

/// `page_size` (0 = as many as fit; negative refused) and `page_token` (empty = the start; else
/// a `next_page_token` InspectSession returned: the position of the next entry).
pub(crate) fn inspect_page(r: &pb::InspectSessionRequest) -> Result<InspectPage, Status> {
    let size = usize::try_from(r.page_size).map_err(|_| {
        Status::invalid_argument(format!(
            "page_size must not be negative (got {})",
            r.page_size
        ))
    })?;
    let offset = match r.page_token.trim() {
        "" => 0,
        t => t.parse::<usize>().map_err(|_| {
            Status::invalid_argument(format!(
                "page_token {t:?} is not a next_page_token InspectSession returned"
            ))
        })?,
    };
    Ok(InspectPage { size, offset })
}

/// One timeline entry, its payload fields shortened.
fn timeline_entry(e: &phrony_engine::TimelineEntry) -> pb::InspectTimelineEntry {
    let base = pb::PayloadRef {
        session_id: e.session_id.clone(),
        ..pb::PayloadRef::default()
    };
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
        truncated: Vec::new(),
    };
    let truncated = match &e.item {
        phrony_engine::TimelineItem::Event(ev) => {
            let mut bound = Shortener::new(
                pb::PayloadRef {
                    seq: i64::try_from(ev.seq).unwrap_or(i64::MAX),
                    ..base
                },
                "event.",
            );
            entry.event = Some(event_entry(ev, &mut bound));
            bound.done()
        }
        phrony_engine::TimelineItem::Invocation(c) => {
            let mut bound = Shortener::new(
                pb::PayloadRef {
                    call_id: c.call_id.clone(),
                    ..base
                },
                "invocation.",
            );
            entry.invocation = Some(invocation_entry(c, &mut bound));
            bound.done()
        }
        phrony_engine::TimelineItem::Approval(a) => {
            let mut bound = Shortener::new(
                pb::PayloadRef {
                    approval_id: a.id.to_string(),
                    ..base
                },
                "approval.",
            );
            entry.approval = Some(super::approvals::inspect_approval(a, &mut bound));
            bound.done()
        }
    };
    entry.truncated = truncated;
    entry
}

/// The bytes a message adds to its parent as a length-delimited field.
fn field_len(message_len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(message_len as u64) + message_len
}

/// One page of the inspection: the tree (on every page) and the timeline entries of `page`,
/// stopping before the entry that would take the response over [`INSPECT_RESPONSE_BUDGET`]
/// (a page always holds at least one entry, whose payloads are shortened, so paging always
/// advances).
pub(crate) fn inspect_response(
    inspection: phrony_engine::Inspection,
    models: &Models,
    page: InspectPage,
) -> pb::InspectSessionResponse {
    use prost::Message as _;
    let session = session_inspect(inspection.session, models);
    let mut used = field_len(session.encoded_len());
    let mut timeline = Vec::new();
    let mut next = page.offset;
    for e in inspection.timeline.iter().skip(page.offset) {
        if page.size > 0 && timeline.len() >= page.size {
            break;
        }
        let entry = timeline_entry(e);
        // Room for the next_page_token, too.
        let len = field_len(entry.encoded_len()) + 24;
        if !timeline.is_empty() && used + len > INSPECT_RESPONSE_BUDGET {
            break;
        }
        used += len;
        timeline.push(entry);
        next += 1;
    }
    let next_page_token = if next < inspection.timeline.len() {
        next.to_string()
    } else {
        String::new()
    };
    pb::InspectSessionResponse {
        session: Some(session),
        timeline,
        next_page_token,
    }
}

/// The payload a `GetSessionPayload` request names.
pub(crate) fn payload_selector(
    r: &pb::GetSessionPayloadRequest,
) -> Result<phrony_engine::PayloadSelector, Status> {
    use phrony_engine::PayloadRecord;
    let Some(reference) = r.r#ref.as_ref() else {
        return Err(Status::invalid_argument(
            "ref is required (copy it from a TruncatedPayload of InspectSession)",
        ));
    };
    let session_id = session_id(&reference.session_id)?.to_owned();
    let call_id = reference.call_id.trim();
    let approval_id = reference.approval_id.trim();
    let record = match (reference.seq, call_id.is_empty(), approval_id.is_empty()) {
        (0, true, true) => PayloadRecord::Session,
        (seq, true, true) if seq > 0 => PayloadRecord::Event(seq.unsigned_abs()),
        (0, false, true) => PayloadRecord::Call(call_id.to_owned()),
        (0, true, false) => PayloadRecord::Approval(approval_id.to_owned()),
        (seq, _, _) if seq < 0 => {
            return Err(Status::invalid_argument(format!(
                "ref.seq must not be negative (got {seq})"
            )));
        }
        _ => {
            return Err(Status::invalid_argument(
                "ref names at most one of seq, call_id and approval_id",
            ));
        }
    };
    let field = reference.field.trim();
    if field.is_empty() {
        return Err(Status::invalid_argument("ref.field is required"));
    }
    Ok(phrony_engine::PayloadSelector {
        session_id,
        record,
        field: field.to_owned(),
    })
}

/// A payload's compact JSON text as `GetSessionPayload` messages of at most
/// [`PAYLOAD_CHUNK_BYTES`] (one empty message for an empty text).
pub(crate) fn payload_chunks(value: &Value) -> Vec<pb::SessionPayloadChunk> {
    let text = value.to_string().into_bytes();
    let total = i64::try_from(text.len()).unwrap_or(i64::MAX);
    if text.is_empty() {
        return vec![pb::SessionPayloadChunk {
            data: Vec::new(),
            offset: 0,
            total_bytes: 0,
        }];
    }
    text.chunks(PAYLOAD_CHUNK_BYTES)
        .enumerate()
        .map(|(i, data)| pb::SessionPayloadChunk {
            data: data.to_vec(),
            offset: i64::try_from(i.saturating_mul(PAYLOAD_CHUNK_BYTES)).unwrap_or(i64::MAX),
            total_bytes: total,
        })
        .collect()
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
        assert_eq!(
            start_target(Some(&agent), None).unwrap(),
            StartTarget::Agent(
                AgentRef::new("support", "refund-agent"),
                Some("0.1.0".to_owned())
            )
        );
        let empty = pb::BundleRef::default();
        assert!(start_target(Some(&agent), Some(&empty)).is_ok());
        assert_eq!(
            start_target(Some(&agent), Some(&bundle))
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert_eq!(
            start_target(None, Some(&bundle)).unwrap(),
            StartTarget::Bundle(BundleRef::new("support", "desk"), None)
        );
        let nameless = pb::BundleRef {
            namespace: "support".into(),
            ..Default::default()
        };
        assert_eq!(
            start_target(None, Some(&nameless)).unwrap_err().message(),
            "bundle_ref requires namespace and name"
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
    fn inspect_pages_are_sizes_and_offsets() {
        let page = |page_size: i32, page_token: &str| {
            inspect_page(&pb::InspectSessionRequest {
                session_id: "run_1".into(),
                page_size,
                page_token: page_token.into(),
            })
        };
        assert_eq!(page(0, "").unwrap(), InspectPage { size: 0, offset: 0 });
        assert_eq!(
            page(5, "12").unwrap(),
            InspectPage {
                size: 5,
                offset: 12
            }
        );
        assert_eq!(page(-1, "").unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(
            page(0, "x").unwrap_err().message(),
            "page_token \"x\" is not a next_page_token InspectSession returned"
        );
    }

    #[test]
    fn payload_refs_name_one_record() {
        use phrony_engine::PayloadRecord;
        let select =
            |r: pb::PayloadRef| payload_selector(&pb::GetSessionPayloadRequest { r#ref: Some(r) });
        let base = pb::PayloadRef {
            session_id: "run_1".into(),
            field: "input".into(),
            ..Default::default()
        };
        assert_eq!(select(base.clone()).unwrap().record, PayloadRecord::Session);
        let event = select(pb::PayloadRef {
            seq: 4,
            ..base.clone()
        })
        .unwrap();
        assert_eq!(event.record, PayloadRecord::Event(4));
        let call = select(pb::PayloadRef {
            call_id: "c1".into(),
            ..base.clone()
        })
        .unwrap();
        assert_eq!(call.record, PayloadRecord::Call("c1".into()));
        for (bad, message) in [
            (
                pb::PayloadRef {
                    seq: 1,
                    call_id: "c1".into(),
                    ..base.clone()
                },
                "ref names at most one of seq, call_id and approval_id",
            ),
            (
                pb::PayloadRef {
                    seq: -2,
                    ..base.clone()
                },
                "ref.seq must not be negative (got -2)",
            ),
            (
                pb::PayloadRef {
                    field: " ".into(),
                    ..base.clone()
                },
                "ref.field is required",
            ),
            (
                pb::PayloadRef {
                    session_id: String::new(),
                    ..base
                },
                "session_id is required",
            ),
        ] {
            let err = select(bad).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert_eq!(err.message(), message);
        }
        assert_eq!(
            payload_selector(&pb::GetSessionPayloadRequest { r#ref: None })
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn payloads_travel_in_chunks_that_add_up() {
        let value = serde_json::json!({"memo": "é".repeat(PAYLOAD_CHUNK_BYTES)});
        let text = value.to_string().into_bytes();
        let chunks = payload_chunks(&value);
        assert_eq!(chunks.len(), 3, "{} bytes", text.len());
        let mut joined = Vec::new();
        for c in &chunks {
            assert!(c.data.len() <= PAYLOAD_CHUNK_BYTES);
            assert_eq!(usize::try_from(c.offset).unwrap(), joined.len());
            assert_eq!(usize::try_from(c.total_bytes).unwrap(), text.len());
            joined.extend_from_slice(&c.data);
        }
        assert_eq!(joined, text);
        assert_eq!(payload_chunks(&Value::Null).len(), 1);
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
