//! Validation of an authoring Agent (§1.11, §1.12), with the reference's field paths and messages,
//! plus the checks where the reference silently accepts nonsense.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::diag::{FileDiags, Report};
use crate::model::agent::{AgentDoc, ModelDoc, is_set};
use crate::model::common::{
    API_VERSION, SchemaDoc, blank, derive_wire_name, is_env_name, is_lenient_semver,
    is_secret_name, is_wire_name,
};
use crate::model::compiled::{ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT};
use crate::refs::{DelegationRef, parse_delegation_ref};

/// Model providers a session can start with.
pub const PROVIDERS: [&str; 4] = ["anthropic", "openai", "openai-compatible", "stub"];

/// Valid `side_effect_class` values.
pub(crate) const SIDE_EFFECT_CLASSES: [&str; 4] = [
    "read_only",
    "idempotent_write",
    "non_idempotent_write",
    "irreversible_action",
];

pub(crate) const SIDE_EFFECT_MSG: &str =
    "must be one of read_only, idempotent_write, non_idempotent_write, irreversible_action";

/// The longest execution deadline a binding or Tool document may set: 24 hours.
pub(crate) const MAX_TOOL_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// What a `timeout` must look like.
pub(crate) const TIMEOUT_MSG: &str = "must be a duration such as 30s, 2m, 1m30s or 500ms (units \
     ms, s, m, h; a bare number is seconds), more than 0 and at most 24h";

/// Parses a tool `timeout`: `<number><unit>` parts (`ms`, `s`, `m`, `h`), as in `1m30s`, or a
/// bare number of seconds. Returns milliseconds, in `1..=MAX_TOOL_TIMEOUT_MS`.
pub(crate) fn parse_timeout(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || Err(TIMEOUT_MSG.to_owned());
    if text.is_empty() {
        return bad();
    }
    let total = if text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>().ok().and_then(|s| s.checked_mul(1000))
    } else {
        let mut total: Option<u64> = Some(0);
        let mut rest = text;
        while !rest.is_empty() {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return bad();
            }
            let (number, after) = rest.split_at(digits);
            let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
            let (unit, after) = after.split_at(unit_len);
            let factor = match unit {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                _ => return bad(),
            };
            let part = number
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(factor));
            total = total.zip(part).and_then(|(t, p)| t.checked_add(p));
            rest = after;
        }
        total
    };
    match total {
        Some(ms) if ms > 0 && ms <= MAX_TOOL_TIMEOUT_MS => Ok(ms),
        _ => bad(),
    }
}

/// A `timeout` field, when set, must parse ([`parse_timeout`]).
pub(crate) fn timeout<D: Report>(d: &mut D, at: &str, text: &str) {
    if !blank(text)
        && let Err(message) = parse_timeout(text)
    {
        d.error(at, message);
    }
}

/// Validates the envelope shared by every kind: `apiVersion`, `kind`.
pub(crate) fn envelope<D: Report>(d: &mut D, api_version: &str, kind: &str, want: &str) {
    if api_version != API_VERSION {
        d.error("apiVersion", format!("must be {API_VERSION}"));
    }
    if kind != want {
        d.error("kind", format!("must be {want}"));
    }
}

/// §1.12: constructs refused before validation (collected with everything else here).
fn forbidden(doc: &AgentDoc, d: &mut FileDiags<'_>) {
    if is_set(&doc.spec.hitl) {
        d.key_error("spec.hitl", "is not supported; use kind: Policy documents");
    }
    if is_set(&doc.spec.policies) {
        d.key_error(
            "spec.policies",
            "is not supported on the Agent; use kind: Policy documents referenced from \
             default_policies or binding policies",
        );
    }
    for (i, t) in doc.spec.tools.iter().enumerate() {
        let at = |k: &str| format!("spec.tools[{i}].{k}");
        if is_set(&t.name) {
            d.key_error(&at("name"), "is not supported; use as for the wire name");
        }
        if is_set(&t.parameters) {
            d.key_error(&at("parameters"), "is not supported; use input_schema");
        }
        if is_set(&t.policy) {
            d.key_error(&at("policy"), "is not supported; use policies");
        }
        if is_set(&t.version) {
            d.key_error(
                &at("version"),
                "is not supported; must not be set on bindings; pin semver on ref (for example \
                 tool@1.0.0)",
            );
        }
        if is_set(&t.agent) {
            d.key_error(
                &at("agent"),
                "must not be set on the Agent; declare delegation under spec.agents (compiled \
                 snapshots carry it)",
            );
        }
    }
    for key in [ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT] {
        if doc.metadata.annotations.contains_key(key) {
            d.key_error(
                &format!("metadata.annotations.{key}"),
                "is set by the compiler and must not be written by authors",
            );
        }
    }
}

/// Validates an authoring Agent. `file` is the agent's own path (for self-references);
/// `in_bundle` allows `spec.agents`.
pub(crate) fn validate_agent(doc: &AgentDoc, file: &Path, in_bundle: bool, d: &mut FileDiags<'_>) {
    forbidden(doc, d);
    envelope(d, &doc.api_version, &doc.kind, "Agent");
    metadata(
        d,
        &doc.metadata.name,
        &doc.metadata.namespace,
        &doc.metadata.version,
        true,
    );
    agent_identity(d, &doc.metadata.name, &doc.metadata.namespace);

    // secrets
    let secrets: HashSet<&str> = doc
        .secrets
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    for (name, def) in doc.secrets.iter().flatten() {
        secret_def(d, name, def.as_ref().map(|def| def.from_env.as_str()));
    }

    let spec = &doc.spec;
    if blank(&spec.purpose) {
        d.error("spec.purpose", "is required");
    }
    match &spec.instructions {
        Some(i) if !blank(&i.reference) && !blank(&i.text) => {
            d.error(
                "spec.instructions",
                "set exactly one of ref or text, not both",
            );
        }
        Some(i) if !blank(&i.reference) || !blank(&i.text) => {}
        _ => d.error("spec.instructions", "must set exactly one of ref or text"),
    }
    match &spec.model {
        Some(m) => model(&ModelView::of_doc(m), &secrets, doc.secrets.is_some(), d),
        None => {
            d.error("spec.model.provider", "is required");
            d.error("spec.model.name", "is required");
        }
    }

    // Wire names are unique across tools and delegations.
    let mut wire = WireNames::default();

    // MCP servers first: bindings refer to them.
    let servers = mcp_servers(
        spec.mcp_servers.iter().map(|s| McpServerView {
            name: &s.name,
            url: &s.url,
            transport: &s.transport,
            auth: s
                .auth
                .as_ref()
                .map(|a| (a.scheme.as_str(), a.header.as_str(), a.secret.as_str())),
        }),
        &secrets,
        d,
    );

    let mut refs = HashSet::new();
    for (i, t) in spec.tools.iter().enumerate() {
        let base = format!("spec.tools[{i}]");
        if blank(&t.reference) {
            d.error(&format!("{base}.ref"), "is required");
        } else if !refs.insert(t.reference.as_str()) {
            d.error(&format!("{base}.ref"), "must be unique");
        }
        if !blank(&t.wire_name) {
            wire.check(d, t.wire_name.clone(), true, &base);
        } else if !blank(&t.reference) {
            wire.check(
                d,
                derive_wire_name(t.reference.split('@').next().unwrap_or_default()),
                false,
                &base,
            );
        }
        if let Some(s) = &t.input_schema {
            schema_exclusive(s, &format!("{base}.input_schema"), d);
        }
        side_effect_class(d, &base, &t.side_effect_class);
        timeout(d, &format!("{base}.timeout"), &t.timeout);
        if let Some(mcp) = &t.mcp {
            mcp_binding(
                d,
                &base,
                &McpBindingView {
                    reference: &t.reference,
                    server: &mcp.server,
                    has_input_schema: t.input_schema.is_some(),
                    side_effect_class: &t.side_effect_class,
                },
                &servers,
            );
        }
        attachments(&t.policies, &format!("{base}.policies"), d);
    }

    subagents(doc, file, in_bundle, &mut wire, d);

    attachments(&spec.default_policies, "spec.default_policies", d);

    if let Some(l) = &spec.limits {
        on_limit(d, &l.on_limit);
        if l.max_subagent_depth.is_some_and(|v| v < 1) {
            d.error("spec.limits.max_subagent_depth", "must be >= 1");
        }
        negative_limits(
            d,
            [
                ("max_tokens_per_run", l.max_tokens_per_run),
                ("max_loop_iterations", l.max_loop_iterations),
                ("max_wall_clock_seconds", l.max_wall_clock_seconds),
                ("max_hitl_wait_minutes", l.max_hitl_wait_minutes),
            ],
        );
    }

    if let Some(o) = &doc.output {
        if let Some(s) = &o.schema {
            schema_exclusive(s, "output.schema", d);
        }
        output_enums(d, &o.format, &o.on_invalid);
    }
}

/// `spec.agents`: delegations (only in a bundle), each with a unique, parseable ref that does
/// not point back at the declaring agent, a unique wire name, and valid schema, result and
/// policies.
fn subagents(
    doc: &AgentDoc,
    file: &Path,
    in_bundle: bool,
    wire: &mut WireNames,
    d: &mut FileDiags<'_>,
) {
    let spec = &doc.spec;
    if !spec.agents.is_empty() && !in_bundle {
        d.key_error(
            "spec.agents",
            "agents with spec.agents must be published via a Bundle",
        );
    }
    let mut agent_refs = HashSet::new();
    let own_id = format!("{}.{}", doc.metadata.namespace, doc.metadata.name);
    for (i, a) in spec.agents.iter().enumerate() {
        let base = format!("spec.agents[{i}]");
        let at = format!("{base}.ref");
        let parsed = match parse_delegation_ref(&a.reference) {
            Ok(r) => Some(r),
            Err(e) => {
                d.error(&at, e.to_string());
                None
            }
        };
        if !blank(&a.reference) && !agent_refs.insert(a.reference.as_str()) {
            d.error(&at, "must be unique");
        }
        match &parsed {
            Some(DelegationRef::Local(rel)) => {
                if let Some(dir) = file.parent()
                    && same_file(&dir.join(rel), file)
                {
                    d.error(&at, "must not reference the declaring agent");
                }
            }
            Some(DelegationRef::External {
                namespace,
                name,
                version,
            }) => {
                if version.is_none() && !a.late_bound {
                    d.error(
                        &at,
                        "external ref must pin @version unless late_bound is true",
                    );
                }
                if format!("{namespace}.{name}") == own_id {
                    d.error(&at, "must not reference the declaring agent");
                }
            }
            None => {}
        }
        if !blank(&a.wire_name) {
            wire.check(d, a.wire_name.clone(), true, &base);
        } else if let Some(r) = &parsed {
            wire.check(d, r.default_wire_name(), false, &base);
        }
        if let Some(s) = &a.input_schema {
            schema_exclusive(s, &format!("{base}.input_schema"), d);
        }
        delegation_result(d, &format!("{base}.result"), &a.result);
        attachments(&a.policies, &format!("{base}.policies"), d);
    }
}

/// `secrets.<name>`: the name pattern and a `fromEnv` that names an environment variable.
pub(crate) fn secret_def<D: Report>(d: &mut D, name: &str, from_env: Option<&str>) {
    let at = format!("secrets.{name}");
    if !is_secret_name(name) {
        d.key_error(&at, "name must match [a-z][a-z0-9_-]*");
    }
    match from_env {
        Some(env) if !blank(env) => {
            if !is_env_name(env.trim()) {
                d.error(
                    &format!("{at}.fromEnv"),
                    "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                );
            }
        }
        _ => d.error(&at, "must set fromEnv"),
    }
}

/// Wire names seen so far: each must match `[a-zA-Z0-9_-]{1,64}` and be unique across the
/// agent's tools and delegations.
#[derive(Debug, Default)]
pub(crate) struct WireNames {
    seen: HashMap<String, String>,
}

impl WireNames {
    /// Checks the wire name of the binding at `base`; `explicit` when it was written as `as`
    /// (reported there), else it was derived from `ref`.
    pub(crate) fn check<D: Report>(&mut self, d: &mut D, name: String, explicit: bool, base: &str) {
        let at = if explicit {
            format!("{base}.as")
        } else {
            format!("{base}.ref")
        };
        if !is_wire_name(&name) {
            d.error(&at, "must match [a-zA-Z0-9_-]{1,64}");
        } else if self.seen.insert(name, at.clone()).is_some() {
            d.error(&at, "resolves to a duplicate tool name");
        }
    }
}

/// The rule an MCP server's URL breaks, as a diagnostic.
const MCP_URL_MSG: &str = "must be a valid https URL (plain http only to a loopback host: \
                           127.0.0.1, localhost or [::1])";

/// Whether `url` may be an MCP server's address (`spec.mcp_servers[].url`): `https` with a
/// host, or plain `http` to a loopback host (`127.0.0.0/8`, `localhost`, `[::1]`), for a
/// server on the same machine. The runtime checks it again before it connects
/// (`phrony-mcp`), so a snapshot published by an older validator cannot send a secret in
/// clear text off the machine. No user info (`user:pass@`) is allowed: credentials come from
/// `auth` and the session's secrets, never from the address.
#[must_use]
pub fn mcp_url_allowed(url: &url::Url) -> bool {
    if !url.username().is_empty() || url.password().is_some() {
        return false;
    }
    match (url.scheme(), url.host()) {
        ("https", Some(url::Host::Domain(d))) => !d.is_empty(),
        ("https", Some(_)) => true,
        ("http", Some(url::Host::Domain(d))) => d.eq_ignore_ascii_case("localhost"),
        ("http", Some(url::Host::Ipv4(ip))) => ip.is_loopback(),
        ("http", Some(url::Host::Ipv6(ip))) => ip.is_loopback(),
        _ => false,
    }
}

/// `spec.mcp_servers[i]` as both forms have it.
pub(crate) struct McpServerView<'a> {
    pub(crate) name: &'a str,
    pub(crate) url: &'a str,
    pub(crate) transport: &'a str,
    /// `(scheme, header, secret)`.
    pub(crate) auth: Option<(&'a str, &'a str, &'a str)>,
}

/// Validates `spec.mcp_servers` and returns the declared server names.
pub(crate) fn mcp_servers<'a, D: Report>(
    list: impl Iterator<Item = McpServerView<'a>>,
    secrets: &HashSet<&str>,
    d: &mut D,
) -> HashSet<&'a str> {
    let mut servers = HashSet::new();
    for (i, s) in list.enumerate() {
        let at = format!("spec.mcp_servers[{i}]");
        if blank(s.name) {
            d.error(&format!("{at}.name"), "is required");
        } else if !servers.insert(s.name) {
            d.error(&format!("{at}.name"), "must be unique");
        }
        if blank(s.url) {
            d.error(&format!("{at}.url"), "is required");
        } else if !url::Url::parse(s.url).is_ok_and(|u| mcp_url_allowed(&u)) {
            d.error(&format!("{at}.url"), MCP_URL_MSG);
        }
        if !s.transport.is_empty() && s.transport != "streamable_http" {
            d.error(&format!("{at}.transport"), "must be streamable_http");
        }
        if let Some((scheme, header, secret)) = s.auth {
            let at = format!("{at}.auth");
            if blank(scheme) {
                d.error(&format!("{at}.scheme"), "is required");
            } else if scheme != "bearer" && scheme != "header" {
                d.error(&format!("{at}.scheme"), "must be one of bearer, header");
            }
            if blank(secret) {
                d.error(&format!("{at}.secret"), "is required");
            } else if !secrets.contains(secret) {
                d.error(&format!("{at}.secret"), "must name a key in secrets");
            }
            if scheme == "header" && blank(header) {
                d.error(&format!("{at}.header"), "is required when scheme is header");
            }
        }
    }
    servers
}

/// `spec.tools[i].side_effect_class`: empty or one of the four classes.
pub(crate) fn side_effect_class<D: Report>(d: &mut D, base: &str, class: &str) {
    if !class.is_empty() && !SIDE_EFFECT_CLASSES.contains(&class) {
        d.error(&format!("{base}.side_effect_class"), SIDE_EFFECT_MSG);
    }
}

/// The parts of an MCP-backed binding its rules look at.
pub(crate) struct McpBindingView<'a> {
    pub(crate) reference: &'a str,
    pub(crate) server: &'a str,
    pub(crate) has_input_schema: bool,
    pub(crate) side_effect_class: &'a str,
}

/// An MCP-backed binding: a declared server, an explicit schema and class, a plain logical id.
pub(crate) fn mcp_binding<D: Report>(
    d: &mut D,
    base: &str,
    b: &McpBindingView<'_>,
    servers: &HashSet<&str>,
) {
    if blank(b.server) {
        d.error(&format!("{base}.mcp.server"), "is required");
    } else if !servers.contains(b.server) {
        d.error(
            &format!("{base}.mcp.server"),
            format!("references undeclared spec.mcp_servers entry {}", b.server),
        );
    }
    if !b.has_input_schema {
        d.error(
            &format!("{base}.input_schema"),
            "is required for MCP-backed tools",
        );
    }
    if b.side_effect_class.is_empty() {
        d.error(
            &format!("{base}.side_effect_class"),
            "is required for MCP-backed tools",
        );
    }
    if !blank(b.reference) {
        if b.reference.contains('@') {
            d.error(
                &format!("{base}.ref"),
                "must not pin a version constraint for MCP-backed tools",
            );
        } else if !is_logical_id(b.reference) {
            d.error(
                &format!("{base}.ref"),
                "must be a logical id of the form namespace.name",
            );
        }
    }
}

/// `result` of a delegation: empty, `summary` or `full`.
pub(crate) fn delegation_result<D: Report>(d: &mut D, at: &str, result: &str) {
    if !result.is_empty() && result != "summary" && result != "full" {
        d.error(at, "must be one of summary, full");
    }
}

/// `spec.limits.on_limit`: empty, `halt` or `escalate`.
pub(crate) fn on_limit<D: Report>(d: &mut D, value: &str) {
    if !value.is_empty() && value != "halt" && value != "escalate" {
        d.error("spec.limits.on_limit", "must be one of halt, escalate");
    }
}

/// Budgets are unset (0 or absent) or positive.
pub(crate) fn negative_limits<D: Report>(
    d: &mut D,
    limits: impl IntoIterator<Item = (&'static str, Option<i64>)>,
) {
    for (key, v) in limits {
        if v.is_some_and(|v| v < 0) {
            d.error(
                &format!("spec.limits.{key}"),
                "must not be negative (0 or absent means no limit)",
            );
        }
    }
}

/// `output.format` and `output.on_invalid`.
pub(crate) fn output_enums<D: Report>(d: &mut D, format: &str, on_invalid: &str) {
    if !format.is_empty() && format != "text" && format != "json" {
        d.error("output.format", "must be one of text, json");
    }
    if !on_invalid.is_empty() && !["retry", "repair", "escalate", "fail"].contains(&on_invalid) {
        d.error(
            "output.on_invalid",
            "must be one of retry, repair, escalate, fail",
        );
    }
}

/// `metadata.name/namespace/version`. Agents and bundles need a version; Tool and Policy docs
/// only need one when it is set.
pub(crate) fn metadata<D: Report>(
    d: &mut D,
    name: &str,
    namespace: &str,
    version: &str,
    version_required: bool,
) {
    if blank(name) {
        d.error("metadata.name", "is required");
    }
    if blank(namespace) {
        d.error("metadata.namespace", "is required");
    }
    if blank(version) {
        if version_required {
            d.error("metadata.version", "is required");
        }
    } else if !is_lenient_semver(version) {
        d.error("metadata.version", "must be valid semver");
    }
}

/// `metadata.namespace` and `metadata.name` of an agent (or bundle): the runtime's rule
/// ([`check_agent_name`](crate::check_agent_name)), so that validate refuses what publish
/// would. Blank parts are reported by [`metadata`].
pub(crate) fn agent_identity<D: Report>(d: &mut D, name: &str, namespace: &str) {
    for (path, part) in [("metadata.namespace", namespace), ("metadata.name", name)] {
        if !blank(part)
            && let Err(e) = crate::names::check_agent_name(part)
        {
            d.error(path, e.to_string());
        }
    }
}

/// `spec.model` as both forms have it.
pub(crate) struct ModelView<'a> {
    pub(crate) provider: &'a str,
    pub(crate) name: &'a str,
    pub(crate) base_url: &'a str,
    pub(crate) secret: &'a str,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    /// `None` when unset (a compiled snapshot's 0).
    pub(crate) max_output_tokens: Option<i64>,
    pub(crate) effort: &'a str,
}

impl<'a> ModelView<'a> {
    fn of_doc(m: &'a ModelDoc) -> Self {
        let p = m.parameters.as_ref();
        Self {
            provider: &m.provider,
            name: &m.name,
            base_url: &m.base_url,
            secret: &m.secret,
            temperature: p.and_then(|p| p.temperature),
            top_p: p.and_then(|p| p.top_p),
            max_output_tokens: p.and_then(|p| p.max_output_tokens),
            effort: m.reasoning.as_ref().map_or("", |r| r.effort.as_str()),
        }
    }
}

/// `spec.model`: provider, name, secret, base_url, sampling parameters and reasoning effort.
pub(crate) fn model<D: Report>(
    m: &ModelView<'_>,
    secrets: &HashSet<&str>,
    has_secrets: bool,
    d: &mut D,
) {
    if blank(m.provider) {
        d.error("spec.model.provider", "is required");
    } else if !PROVIDERS.contains(&m.provider) {
        d.error(
            "spec.model.provider",
            format!(
                "unsupported provider {:?}; must be one of anthropic, openai, openai-compatible, stub",
                m.provider
            ),
        );
    }
    if blank(m.name) {
        d.error("spec.model.name", "is required");
    }
    let compatible = m.provider == "openai-compatible";
    if !m.secret.is_empty() {
        if !is_secret_name(m.secret) {
            d.error("spec.model.secret", "must match [a-z][a-z0-9_-]*");
        } else if !secrets.contains(m.secret) {
            d.error("spec.model.secret", "must name a key in secrets");
        }
    } else if has_secrets && !secrets.is_empty() && !compatible && !secrets.contains(m.provider) {
        d.error(
            "spec.model.secret",
            "is required when secrets is set; omit to use the secret named after \
             spec.model.provider, or set secret to a secrets key",
        );
    }
    if compatible {
        if blank(m.base_url) {
            d.error(
                "spec.model.base_url",
                "is required when provider is openai-compatible",
            );
        } else if !matches!(url::Url::parse(m.base_url), Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.host_str().is_some_and(|h| !h.is_empty()))
        {
            d.error(
                "spec.model.base_url",
                "must be an absolute http or https URL",
            );
        }
    } else if !m.base_url.is_empty() {
        d.error(
            "spec.model.base_url",
            "must be empty unless provider is openai-compatible",
        );
    }
    if m.temperature.is_some() && m.top_p.is_some() {
        d.error(
            "spec.model.parameters",
            "set temperature or top_p, not both",
        );
    }
    for (key, v) in [("temperature", m.temperature), ("top_p", m.top_p)] {
        if v.is_some_and(|v| !v.is_finite()) {
            d.error(
                &format!("spec.model.parameters.{key}"),
                "must be a finite number",
            );
        }
    }
    if m.max_output_tokens.is_some_and(|v| v < 0) {
        d.error(
            "spec.model.parameters.max_output_tokens",
            "must not be negative",
        );
    }
    if !m.effort.is_empty() && !["low", "medium", "high"].contains(&m.effort) {
        d.error(
            "spec.model.reasoning.effort",
            "must be one of low, medium, high",
        );
    }
}

/// `{ref}` xor `{inline}`.
pub(crate) fn schema_exclusive(s: &SchemaDoc, at: &str, d: &mut FileDiags<'_>) {
    match (!blank(&s.reference), s.has_inline()) {
        (true, true) => d.error(at, "set exactly one of ref or inline, not both"),
        (false, false) => d.error(at, "must set exactly one of ref or inline"),
        _ => {
            if let Some(v) = &s.inline
                && s.has_inline()
                && !v.is_object()
            {
                d.error(&format!("{at}.inline"), "must be a JSON Schema object");
            }
        }
    }
}

fn attachments(list: &[crate::model::common::PolicyAttachment], at: &str, d: &mut FileDiags<'_>) {
    use crate::model::common::PolicyAttachment;
    for (j, a) in list.iter().enumerate() {
        match a {
            PolicyAttachment::Id(id) if blank(id) => {
                d.error(&format!("{at}[{j}]"), "policy reference must not be empty");
            }
            PolicyAttachment::File(r) if blank(r) => {
                d.error(&format!("{at}[{j}].ref"), "is required");
            }
            _ => {}
        }
    }
}

/// `namespace.name` with both parts non-empty and no `@`.
pub(crate) fn is_logical_id(s: &str) -> bool {
    !s.contains('@')
        && !s.chars().any(char::is_whitespace)
        && matches!(s.split_once('.'), Some((ns, name)) if !ns.is_empty() && !name.is_empty())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_TOOL_TIMEOUT_MS, parse_timeout};

    #[test]
    fn timeouts_parse_units_and_bare_seconds_and_refuse_the_rest() {
        assert_eq!(parse_timeout("30s"), Ok(30_000));
        assert_eq!(parse_timeout("2m"), Ok(120_000));
        assert_eq!(parse_timeout("1m30s"), Ok(90_000));
        assert_eq!(parse_timeout("500ms"), Ok(500));
        assert_eq!(parse_timeout("1h"), Ok(3_600_000));
        assert_eq!(parse_timeout("45"), Ok(45_000));
        assert_eq!(parse_timeout(" 24h "), Ok(MAX_TOOL_TIMEOUT_MS));
        for bad in [
            "",
            "0",
            "0s",
            "25h",
            "30x",
            "s",
            "1.5s",
            "-3s",
            "30 s",
            "1m30",
            "99999999999999999999s",
        ] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
