//! The engine's trace spans (issue #19): one place that names them and their attributes.
//!
//! The spans are `tracing` spans with the target [`TARGET`]; the daemon exports them through
//! OpenTelemetry when configured (`phrony-runtime`'s `telemetry.rs`) and keeps them out of its
//! logs. Attributes carry ids, refs, decisions, counts and durations only: never arguments,
//! prompts, model text or secrets (the same rule as the metrics' labels).
//!
//! A leaf module: it imports no other engine module.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt as _;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The target of every span of the engine (the daemon's exporter selects it).
pub const TARGET: &str = "phrony::trace";

/// `phrony.session`: one driver run of a session, from its start (or resumption) to its end,
/// its parking or the engine's stop.
pub(crate) fn session(
    session_id: &str,
    agent: &str,
    agent_version: &str,
    agent_version_id: &uuid::Uuid,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "phrony.session",
        phrony.session.id = %session_id,
        phrony.agent = %agent,
        phrony.agent.version = %agent_version,
        phrony.agent.version_id = %agent_version_id,
        phrony.session.outcome = Empty,
    )
}

/// Records how a session's driver run ended (`completed`, `failed`, `cancelled`, `parked`,
/// `suspended`…) on the current `phrony.session` span.
pub(crate) fn session_outcome(span: &Span, outcome: &'static str) {
    span.record("phrony.session.outcome", outcome);
}

/// `phrony.turn`: one user turn (its model calls and tool calls).
pub(crate) fn turn(turn: u32) -> Span {
    tracing::info_span!(target: TARGET, "phrony.turn", phrony.turn = turn)
}

/// The model call of GenAI semantic conventions: `chat {model}`, a client span.
pub(crate) fn model_call(provider: &str, model: &str, iteration: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        "gen_ai.chat",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = %provider,
        gen_ai.system = %provider,
        gen_ai.request.model = %model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        phrony.iteration = iteration,
        error.type = Empty,
    )
}

/// Records a finished model call's token counts and stop reason.
pub(crate) fn model_usage(span: &Span, input_tokens: u64, output_tokens: u64, stop_reason: &str) {
    span.record("gen_ai.usage.input_tokens", input_tokens);
    span.record("gen_ai.usage.output_tokens", output_tokens);
    span.record("gen_ai.response.finish_reasons", stop_reason);
}

/// Marks `span` failed with an error class (never the error's text: it may quote the model's
/// or a worker's output).
pub(crate) fn failed(span: &Span, error_type: &'static str) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", error_type);
}

/// `phrony.policy.decision`: the dispatch-time policy evaluation of one call.
pub(crate) fn decision(call_id: &str, tool: &str, version: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "phrony.policy.decision",
        phrony.call.id = %call_id,
        phrony.tool = %format_args!("{tool}@{version}"),
        phrony.decision = Empty,
        phrony.policy = Empty,
    )
}

/// Records the decision (`allow`, `deny`, `require_approval`) and the deciding policy's
/// `namespace/name@version` (none for an allow).
pub(crate) fn decided(span: &Span, decision: &'static str, policy: Option<&str>) {
    span.record("phrony.decision", decision);
    if let Some(policy) = policy {
        span.record("phrony.policy", policy);
    }
}

/// `phrony.approval.wait`: the wait for a human decision on one approval.
pub(crate) fn approval_wait(call_id: &str, approval_id: &uuid::Uuid) -> Span {
    tracing::info_span!(
        target: TARGET,
        "phrony.approval.wait",
        phrony.call.id = %call_id,
        phrony.approval.id = %approval_id,
        phrony.approval.outcome = Empty,
    )
}

/// Records how an approval wait ended (`approved`, `denied`, `expired`, `parked`, …).
pub(crate) fn approval_outcome(span: &Span, outcome: &str) {
    span.record("phrony.approval.outcome", outcome);
}

/// `phrony.dispatch`: one call sent to a tool worker, from the queue to the worker's answer.
pub(crate) fn dispatch(call_id: &str, tool: &str, version: &str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "phrony.dispatch",
        otel.kind = "producer",
        otel.status_code = Empty,
        phrony.call.id = %call_id,
        phrony.tool = %format_args!("{tool}@{}", if version.is_empty() { phrony_dispatch::DEFAULT_VERSION } else { version }),
        phrony.worker.id = Empty,
        phrony.dispatch.attempts = Empty,
        phrony.dispatch.queue_wait_ms = Empty,
        phrony.dispatch.execution_ms = Empty,
        phrony.dispatch.outcome = Empty,
        error.type = Empty,
    )
}

/// Records a dispatch the worker answered: who, how long it queued and ran, and whether the
/// handler succeeded (`success`) or failed (`tool_error`).
pub(crate) fn dispatched(span: &Span, done: &phrony_dispatch::Completion) {
    span.record("phrony.worker.id", done.worker.worker_id.as_str());
    span.record("phrony.dispatch.attempts", done.attempts);
    span.record("phrony.dispatch.queue_wait_ms", millis(done.queued_for));
    span.record("phrony.dispatch.execution_ms", millis(done.executed_for));
    let outcome = match &done.outcome {
        phrony_dispatch::ToolOutcome::Success(_) => "success",
        phrony_dispatch::ToolOutcome::Error(_) => "tool_error",
    };
    span.record("phrony.dispatch.outcome", outcome);
}

/// Records a dispatch that produced no worker outcome (its failure code).
pub(crate) fn dispatch_failed(span: &Span, failure: &phrony_dispatch::DispatchFailure) {
    span.record("phrony.dispatch.outcome", failure.code());
    failed(span, failure.code());
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The W3C trace context (`traceparent`, `tracestate`) of `span`, for a worker; empty when no
/// trace is exported (no OpenTelemetry layer, or no propagator installed).
pub(crate) fn context_of(span: &Span) -> BTreeMap<String, String> {
    let mut carrier = BTreeMap::new();
    if span.is_disabled() {
        return carrier;
    }
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut MapInjector(&mut carrier));
    });
    carrier
}

/// Makes the span a child of the trace context `carrier` holds (a parked session's, see
/// `Inner::park_trace`), unless the carrier holds no valid context.
pub(crate) fn continue_from(span: &Span, carrier: &BTreeMap<String, String>) {
    if span.is_disabled() {
        return;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MapExtractor(carrier))
    });
    if parent.span().span_context().is_valid() {
        // Only fails once the span was entered, which it was not yet.
        let _ = span.set_parent(parent);
    }
}

struct MapExtractor<'a>(&'a BTreeMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct MapInjector<'a>(&'a mut BTreeMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}
