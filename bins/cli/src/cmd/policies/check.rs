//! `phrony policies check`: dry-run an agent's policies against one tool call.
//!
//! The manifest is compiled exactly as `agents validate` does, the call is decided by the same
//! engine the runtime embeds, and the explanation names the deciding policy and every policy
//! whose scope covered the tool. When policy denies every call of the tool in the given context
//! whatever its arguments, it says so: the runtime does not offer such a tool to the model.

use std::io::{self, Write as _};
use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use phrony_manifest::{CompiledAgent, ToolArgsValidator, ToolBinding};
use phrony_policy::{
    Action, AgentCtx, Decision, EarlierCall, Effect, Explanation, HistoryFacts, PolicySet,
    PolicyTrace, Request, SessionCtx, ShadowOutcome, ToolCtx,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cmd::{Output, manifest, render};

/// Arguments of `phrony policies check`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Agent manifest (agent.yaml), or a bundle (bundle.yaml: its root member, or `--member`).
    manifest: PathBuf,
    /// With a bundle: the member whose policies decide (its `metadata.name`); default the root.
    #[arg(long, value_name = "NAME")]
    member: Option<String>,
    /// The tool called: its wire name (`issue_refund`) or logical id (`payments.issue-refund`).
    #[arg(long, value_name = "TOOL", required_unless_present = "analyze")]
    tool: Option<String>,
    /// Instead of deciding a call, analyse the agent's policies: conditions that can never match
    /// the tool's input_schema or never hold, policies that never decide, allow lists that allow
    /// everything. Each finding is printed with file:line:column (an agent manifest only).
    #[arg(long, conflicts_with_all = ["tool", "member", "context"])]
    analyze: bool,
    /// The call's arguments, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    args: String,
    /// The call's context, a JSON object:
    /// `{"principal": {…}, "session": {"id": …, "metadata": {…}}, "now": RFC 3339 or Unix seconds,
    /// "agent": {"namespace": …, "name": …, "version": …}}`. The agent defaults to the manifest's.
    #[arg(long, value_name = "JSON")]
    context: Option<String>,
    /// Earlier calls the policies' history conditions see: a JSON file holding a list of
    /// `{"tool": wire name or logical id, "args": {…}, "result"?: {…}, "session"?: id (default
    /// the context's), "at"?: RFC 3339 or Unix seconds, "outcome"?: "succeeded" (default) or
    /// "reserved"}` (at most 10,000). Without it the call is decided as the first one (no
    /// earlier calls).
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Compiles the manifest, decides the call and prints the explanation.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let Some(tool_name) = args.tool.as_deref().filter(|_| !args.analyze) else {
        return analyze(args);
    };
    let call_args = parse_args(&args.args)?;
    let context = match &args.context {
        Some(text) => parse_context(text)?,
        None => Context::default(),
    };
    let agent = manifest::load_checked_agent(&args.manifest, args.member.as_deref())?;
    let binding = find_tool(&agent, tool_name)?;
    let policies = manifest::policy_set(&agent, &args.manifest)?;
    let args_errors = schema_errors(binding, &call_args);
    if !args_errors.is_empty() {
        let mut stderr = io::stderr().lock();
        for error in &args_errors {
            writeln!(
                stderr,
                "warning: --args do not match the input_schema of {}: {error}",
                binding.wire_name()
            )?;
        }
    }

    let wire_name = binding.wire_name();
    let tool = binding.tool_ctx(&wire_name);
    let agent_ctx = match &context.agent {
        Some(a) => AgentCtx {
            namespace: &a.namespace,
            name: &a.name,
            version: &a.version,
        },
        None => agent.agent_ctx(),
    };
    let mut request = Request::new(tool, &call_args).with_agent(agent_ctx);
    if let Some(session) = &context.session {
        request = request.with_session(SessionCtx {
            id: &session.id,
            metadata: session.metadata.as_ref(),
        });
    }
    if let Some(principal) = &context.principal {
        request = request.with_principal(principal);
    }
    if let Some(now) = context.now {
        request = request.at(now);
    }
    let earlier = match &args.history {
        Some(path) => read_history(path)?,
        None => Vec::new(),
    };
    let agent_key = format!("{}/{}", agent_ctx.namespace, agent_ctx.name);
    let session_id = context.session.as_ref().map_or("", |s| s.id.as_str());
    let mut bindings = Vec::with_capacity(earlier.len());
    for (i, call) in earlier.iter().enumerate() {
        let b = find_tool(&agent, &call.tool).with_context(|| format!("--history: call {i}"))?;
        bindings.push((b, b.wire_name()));
    }
    let calls: Vec<EarlierCall<'_>> = earlier
        .iter()
        .zip(&bindings)
        .map(|(call, (b, wire))| EarlierCall {
            tool: b.tool_ctx(wire),
            args: &call.args,
            result: call.result.as_ref(),
            session: call.session.as_deref().unwrap_or(session_id),
            agent: &agent_key,
            at_unix: call.at,
            committed: call.outcome != EarlierOutcome::Reserved,
        })
        .collect();
    let facts = HistoryFacts::from_calls(&policies, &request, &calls);
    if policies.has_history() {
        request = request.with_history(&facts);
    }

    let explanation = policies.explain(&request);
    // Visibility does not read the arguments: the call's own request asks it.
    let hidden_by = policies.hidden_tool(&request).map(|p| p.id().to_string());
    let shadow = policies.shadow(&request, explanation.decision.kind());
    let mut stdout = io::stdout().lock();
    match args.output {
        Output::Text => {
            write_text(&mut stdout, &tool, &explanation, hidden_by.as_deref())?;
            write_shadow(&mut stdout, &policies, shadow.as_ref())?;
        }
        Output::Json => {
            let mut report = Report::new(&explanation, &tool, &agent, &args_errors);
            report.hidden_by = hidden_by.as_deref();
            report.shadow = shadow.as_ref().map(|s| ShadowReport {
                would_have: &s.shadow,
                policy: s.policy.id().to_string(),
            });
            serde_json::to_writer_pretty(&mut stdout, &report)?;
            writeln!(stdout)?;
        }
    }
    Ok(())
}

/// `--analyze`: prints the policy analysis' findings (text: one per line, then a count; JSON:
/// `{"findings": […]}`). Findings are warnings: the exit status is 0.
fn analyze(args: &Args) -> anyhow::Result<()> {
    if phrony_manifest::document_kind(&args.manifest).as_deref() == Some("Bundle") {
        bail!("--analyze takes an agent manifest; run it on each member's agent.yaml");
    }
    let compiled = manifest::load_compiled(&args.manifest)?;
    let mut stdout = io::stdout().lock();
    match args.output {
        Output::Text => {
            for f in &compiled.findings {
                writeln!(stdout, "{f}")?;
            }
            writeln!(
                stdout,
                "{} policy analysis warnings",
                compiled.findings.len()
            )?;
        }
        Output::Json => {
            let findings: Vec<Value> = compiled
                .findings
                .iter()
                .map(phrony_manifest::Finding::to_json)
                .collect();
            serde_json::to_writer_pretty(&mut stdout, &serde_json::json!({"findings": findings}))?;
            writeln!(stdout)?;
        }
    }
    Ok(())
}

/// `--args`: a JSON object.
fn parse_args(text: &str) -> anyhow::Result<Value> {
    let value: Value =
        serde_json::from_str(text).map_err(|err| anyhow!("--args is not valid JSON: {err}"))?;
    if !value.is_object() {
        bail!(
            "--args must be a JSON object, got {}",
            render::json_kind(&value)
        );
    }
    Ok(value)
}

/// The most earlier calls `--history` may list.
const MAX_HISTORY_CALLS: usize = 10_000;

/// One earlier call of `--history`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Earlier {
    tool: String,
    #[serde(default = "empty_object")]
    args: Value,
    result: Option<Value>,
    session: Option<String>,
    #[serde(default, deserialize_with = "deserialize_now")]
    at: Option<i64>,
    #[serde(default)]
    outcome: EarlierOutcome,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EarlierOutcome {
    #[default]
    Succeeded,
    Reserved,
}

/// `--history FILE`: the list of earlier calls.
fn read_history(path: &std::path::Path) -> anyhow::Result<Vec<Earlier>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--history: cannot read {}", path.display()))?;
    let calls: Vec<Earlier> = serde_json::from_str(&text).with_context(|| {
        format!(
            "--history {}: expected a JSON list of {{\"tool\", \"args\", \"result\"?, \"session\"?, \
             \"at\"?, \"outcome\"?}}",
            path.display()
        )
    })?;
    if calls.len() > MAX_HISTORY_CALLS {
        bail!(
            "--history {}: {} calls, at most {MAX_HISTORY_CALLS}",
            path.display(),
            calls.len()
        );
    }
    Ok(calls)
}

/// The context of a call, as `--context` spells it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Context {
    agent: Option<AgentIdentity>,
    session: Option<Session>,
    principal: Option<Value>,
    #[serde(default, deserialize_with = "deserialize_now")]
    now: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentIdentity {
    namespace: String,
    name: String,
    #[serde(default)]
    version: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Session {
    #[serde(default)]
    id: String,
    metadata: Option<Value>,
}

/// `now`: Unix seconds, or an RFC 3339 timestamp such as `2025-03-15T11:00:00Z`.
fn deserialize_now<'de, D: serde::Deserializer<'de>>(de: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Now {
        Unix(i64),
        Text(String),
    }
    let parsed = match Option::<Now>::deserialize(de)? {
        None => return Ok(None),
        Some(Now::Unix(seconds)) => seconds,
        Some(Now::Text(text)) => chrono::DateTime::parse_from_rfc3339(&text)
            .map_err(|err| {
                serde::de::Error::custom(format!(
                    "now: {text:?} is not an RFC 3339 timestamp ({err}) nor Unix seconds"
                ))
            })?
            .timestamp(),
    };
    Ok(Some(parsed))
}

/// `--context`: a JSON object with the fields of [`Context`].
fn parse_context(text: &str) -> anyhow::Result<Context> {
    let value: Value =
        serde_json::from_str(text).map_err(|err| anyhow!("--context is not valid JSON: {err}"))?;
    if !value.is_object() {
        bail!(
            "--context must be a JSON object, got {}",
            render::json_kind(&value)
        );
    }
    for (key, expected) in [("principal", "object"), ("session", "object")] {
        if let Some(v) = value.get(key)
            && !v.is_object()
        {
            bail!(
                "--context: {key} must be a JSON {expected}, got {}",
                render::json_kind(v)
            );
        }
    }
    if let Some(meta) = value.get("session").and_then(|s| s.get("metadata"))
        && !meta.is_object()
    {
        bail!(
            "--context: session.metadata must be a JSON object, got {}",
            render::json_kind(meta)
        );
    }
    serde_json::from_value(value).context(
        "--context: expected {\"agent\"?: {namespace, name, version}, \"session\"?: {id, \
         metadata}, \"principal\"?: {…}, \"now\"?: RFC 3339 or Unix seconds}",
    )
}

/// How the arguments break the binding's `input_schema`. Reported as warnings: the dry run
/// still shows what the policies decide on these arguments.
fn schema_errors(binding: &ToolBinding, args: &Value) -> Vec<String> {
    match ToolArgsValidator::for_binding(binding) {
        Ok(validator) => match validator.validate(args) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        },
        // The manifest compiler rejects invalid schemas; say so rather than hide it.
        Err(err) => vec![format!("the input_schema cannot be used: {err}")],
    }
}

/// The binding called `name`: by wire name first, then by logical id (`namespace.name`, with an
/// optional `@version` that must be the pinned one).
fn find_tool<'a>(agent: &'a CompiledAgent, name: &str) -> anyhow::Result<&'a ToolBinding> {
    let tools = &agent.spec.tools;
    let (logical, version) = match name.split_once('@') {
        Some((logical, version)) => (logical, Some(version)),
        None => (name, None),
    };
    let found = tools.iter().find(|t| t.wire_name() == name).or_else(|| {
        tools
            .iter()
            .find(|t| t.reference == logical && version.is_none_or(|v| t.dispatch_version() == v))
    });
    if let Some(binding) = found {
        return Ok(binding);
    }
    let known: Vec<String> = tools
        .iter()
        .map(|t| format!("{} ({})", t.wire_name(), t.reference))
        .collect();
    if known.is_empty() {
        bail!(
            "unknown tool {name:?}: agent {} declares no tools",
            agent.qualified_name()
        );
    }
    bail!(
        "unknown tool {name:?}; the tools of {} are: {}",
        agent.qualified_name(),
        known.join(", ")
    )
}

/// The human-readable report.
fn write_text(
    out: &mut impl io::Write,
    tool: &ToolCtx<'_>,
    explanation: &Explanation<'_>,
    hidden_by: Option<&str>,
) -> io::Result<()> {
    let decision = &explanation.decision;
    write!(out, "tool: {} ({}@{}", tool.name, tool.r#ref, tool.version)?;
    if !tool.side_effect_class.is_empty() {
        write!(out, ", {}", tool.side_effect_class)?;
    }
    writeln!(out, ")")?;
    writeln!(out, "decision: {}", decision.kind())?;
    if let Some(policy) = decision.policy() {
        writeln!(out, "policy: {}", policy.id())?;
    }
    if let Some(reason) = decision.reason() {
        writeln!(out, "reason: {reason}")?;
    }
    if let Decision::RequireApproval { policy } = decision {
        writeln!(out, "approvals_required: {}", policy.approvals_required())?;
        writeln!(out, "on_reject: {}", policy.on_reject().as_str())?;
        if policy.on_modify() == phrony_policy::OnModify::Revalidate {
            writeln!(out, "on_modify: revalidate")?;
        }
        if policy.comprehension_required() {
            writeln!(out, "comprehension_required: true")?;
        }
        if let Some(timeout) = policy.timeout() {
            writeln!(
                out,
                "timeout: {} after {} minutes",
                timeout.default.as_str(),
                timeout.after_minutes
            )?;
        }
        if let Some(route) = policy.route() {
            writeln!(out, "route: {route}")?;
        }
        if let Some(authority) = policy.authority_ref() {
            writeln!(out, "authority_ref: {authority}")?;
        }
    }

    if let Some(policy) = hidden_by {
        writeln!(
            out,
            "hidden: {policy} denies every call of this tool in this context, whatever the \
             arguments; the model is not offered it"
        )?;
    }

    let applied: Vec<&PolicyTrace<'_>> =
        explanation.policies.iter().filter(|t| t.applies).collect();
    if applied.is_empty() {
        return writeln!(out, "applied: none (no policy covers this tool)");
    }
    writeln!(out, "applied:")?;
    let rows: Vec<[String; 3]> = applied
        .iter()
        .map(|t| {
            let verdict = match (t.matched, t.effect) {
                (false, _) | (true, Effect::None) => "no match",
                (true, Effect::Allow) => "passed",
                (true, Effect::Deny) if t.policy.action() == Action::Allow => "violated",
                (true, Effect::Deny | Effect::RequireApproval) => "matched",
            };
            // A Cedar policy's effect is Cedar's: show what Cedar said (which `@id`s decided).
            let (action, verdict) = match &t.cedar {
                Some(cedar) => (
                    "cedar".to_owned(),
                    format!("{} ({cedar})", t.effect.as_str()),
                ),
                None => (t.policy.action().as_str().to_owned(), verdict.to_owned()),
            };
            let outcome = if t.deciding {
                format!("{verdict} (deciding)")
            } else {
                verdict
            };
            [t.policy.id().to_string(), action, outcome]
        })
        .collect();
    let width = |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0);
    let (w0, w1) = (width(0), width(1));
    for [id, action, outcome] in &rows {
        writeln!(out, "  {id:<w0$}  {action:<w1$}  {outcome}")?;
    }
    Ok(())
}

/// The shadow policies' part of the text report: what they would have changed, and which
/// shadow policies there are (evaluated, never enforced).
fn write_shadow(
    out: &mut impl io::Write,
    policies: &PolicySet,
    shadow: Option<&ShadowOutcome<'_>>,
) -> io::Result<()> {
    let names: Vec<String> = policies
        .shadow_policies()
        .map(|p| p.id().to_string())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "shadow policies (never enforced): {}",
        names.join(", ")
    )?;
    match shadow {
        Some(s) => {
            write!(
                out,
                "shadow: would have {} by {}",
                s.shadow.kind(),
                s.policy.id()
            )?;
            match s.shadow.reason() {
                Some(reason) => writeln!(out, " ({reason})"),
                None => writeln!(out),
            }
        }
        None => writeln!(out, "shadow: would have changed nothing"),
    }
}

/// The `--output json` report: the decision's fields (`decision`, `policy`, `reason`, and for
/// approvals `approvals_required`, `on_reject`, …), then the tool, the agent and `applied`: every
/// policy whose scope covers the tool, with its verdict.
#[derive(Serialize)]
struct Report<'a> {
    #[serde(flatten)]
    decision: &'a Decision<'a>,
    tool: ToolReport<'a>,
    agent: String,
    applied: Vec<&'a PolicyTrace<'a>>,
    /// Violations of the binding's input_schema (absent when the arguments match).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    args_errors: &'a [String],
    /// The policy that hides the tool from the model in this context (absent when offered).
    #[serde(skip_serializing_if = "Option::is_none")]
    hidden_by: Option<&'a str>,
    /// What the shadow policies would have decided instead (absent when nothing would change).
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<ShadowReport<'a>>,
}

/// `shadow` of the JSON report: the decision the shadow policy would have taken.
#[derive(Serialize)]
struct ShadowReport<'a> {
    would_have: &'a Decision<'a>,
    policy: String,
}

#[derive(Serialize)]
struct ToolReport<'a> {
    name: &'a str,
    r#ref: &'a str,
    version: &'a str,
    side_effect_class: &'a str,
}

impl<'a> Report<'a> {
    fn new(
        explanation: &'a Explanation<'a>,
        tool: &'a ToolCtx<'a>,
        agent: &CompiledAgent,
        args_errors: &'a [String],
    ) -> Self {
        let meta = &agent.metadata;
        Self {
            decision: &explanation.decision,
            tool: ToolReport {
                name: tool.name,
                r#ref: tool.r#ref,
                version: tool.version,
                side_effect_class: tool.side_effect_class,
            },
            agent: format!("{}/{}@{}", meta.namespace, meta.name, meta.version),
            applied: explanation.policies.iter().filter(|t| t.applies).collect(),
            args_errors,
            hidden_by: None,
            shadow: None,
        }
    }
}
