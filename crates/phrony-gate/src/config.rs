//! The gate's configuration: the YAML file of config mode, and the flags of flags mode.
//!
//! Both compile into [`Settings`], the immutable description the engine decides with.
//! Relative paths in the YAML file resolve against the file's directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::Deserialize;

use crate::cedar::{CedarPolicies, CedarSpec, FactSpec, FactType};
use crate::money::parse_amount;

/// Errors reading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        error: std::io::Error,
    },
    /// The file cannot be read, is larger than
    /// [`MAX_YAML_BYTES`](phrony_manifest::MAX_YAML_BYTES) (8 MiB), is not UTF-8, is not YAML,
    /// or uses an alias (refused in every phrony YAML input: see
    /// [`phrony_manifest::check_yaml`]).
    #[error("{path}: {error}")]
    Input {
        /// The file.
        path: PathBuf,
        /// What is wrong (with the line and column for YAML problems).
        error: phrony_manifest::YamlInputError,
    },
    /// The YAML does not match the configuration model.
    #[error("{path}: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value is invalid or a reference dangles.
    #[error("{path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted path of the offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// The gate-derived facts: never taken from the client; set by the gate when it knows them.
pub const DERIVED_FACTS: &[&str] = &[
    "agent_active",
    "user_role",
    "user_sub",
    "user_email",
    "tool",
    "amount",
    "currency",
];

// ---------------------------------------------------------------------------------------------
// The YAML model

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    org: OrgFile,
    #[serde(default)]
    state_dir: Option<PathBuf>,
    #[serde(default)]
    port: Option<u16>,
    admin: AdminFile,
    api_keys: Vec<ApiKeyFile>,
    agents: BTreeMap<String, AgentFile>,
    tools: BTreeMap<String, ToolFile>,
    #[serde(default)]
    mandates: BTreeMap<String, MandateFile>,
    #[serde(default)]
    policy: Option<PolicyFile>,
    #[serde(default)]
    oidc: Option<OidcFile>,
    #[serde(default)]
    approvals: ApprovalsFile,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    risk: Option<RiskFile>,
    /// Authoritative original amounts per reference (a provider fixture), e.g. charge ids.
    #[serde(default)]
    references: BTreeMap<String, String>,
    /// The web console's manager logins ([`crate::console`]).
    #[serde(default)]
    console: Option<crate::console::ConsoleFile>,
    /// The sidecar and gateway routes (see [`crate::routing`]).
    #[serde(default)]
    routing: Option<crate::routing::config::RoutingFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrgFile {
    id: String,
    #[serde(default = "default_environment")]
    environment: String,
}

fn default_environment() -> String {
    "local".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdminFile {
    key: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyFile {
    key: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    label: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    #[serde(default = "default_status")]
    status: String,
    tools: Vec<String>,
    #[serde(default)]
    signing: SigningFile,
    #[serde(default)]
    velocity: Option<VelocityFile>,
}

fn default_status() -> String {
    "active".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningFile {
    /// Refuse unsigned requests from this agent.
    #[serde(default)]
    require: bool,
    /// The agent's Ed25519 public keys (base64url, 32 raw bytes) for RFC 9421 signatures.
    #[serde(default)]
    ed25519_keys: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct VelocityFile {
    max: u32,
    window_seconds: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolFile {
    actions: Vec<String>,
    #[serde(default)]
    mandate: Option<String>,
    /// Where routed calls go (sidecar and gateway routes).
    #[serde(default)]
    upstream: Option<crate::routing::config::UpstreamFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MandateFile {
    #[serde(default = "one")]
    version: u32,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    currency: String,
    #[serde(default = "default_status")]
    status: String,
    #[serde(default)]
    per_tx_limit: Option<String>,
    #[serde(default)]
    daily_limit: Option<String>,
    #[serde(default)]
    monthly_limit: Option<String>,
    #[serde(default)]
    per_entity_limit: Option<String>,
    #[serde(default)]
    entity_key: Option<String>,
    /// Skip the per-entity sub-budget when a request does not name the entity (the default,
    /// `false`, fails such a request closed).
    #[serde(default)]
    entity_optional: bool,
    #[serde(default)]
    relational_cap: bool,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    allowed_resources: Vec<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default = "one")]
    version: u32,
    cedar_file: PathBuf,
    #[serde(default)]
    facts: BTreeMap<String, FactFile>,
    #[serde(default)]
    profile: ProfileFile,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FactFile {
    Short(String),
    Long {
        #[serde(rename = "type")]
        ty: String,
        #[serde(default)]
        optional: bool,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    #[serde(default)]
    counterparty_allowlist: bool,
    #[serde(default)]
    escalation_amount: Option<String>,
    #[serde(default)]
    signed_agents_only: bool,
    #[serde(default)]
    observe_mode: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OidcFile {
    issuer: String,
    audience: String,
    #[serde(default = "default_role_claim")]
    role_claim: String,
    #[serde(default = "default_email_claim")]
    email_claim: String,
    #[serde(default)]
    jwks_file: Option<PathBuf>,
    #[serde(default)]
    test_idp: Option<TestIdpFile>,
}

fn default_role_claim() -> String {
    "role".into()
}

fn default_email_claim() -> String {
    "email".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestIdpFile {
    key_file: PathBuf,
    #[serde(default = "default_idp_ttl")]
    token_ttl_seconds: u32,
}

fn default_idp_ttl() -> u32 {
    3600
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalsFile {
    #[serde(default = "default_escalation_type")]
    r#type: String,
    #[serde(default = "default_approval_ttl")]
    ttl_seconds: u32,
    #[serde(default = "default_approver")]
    default_approver: String,
    #[serde(default)]
    require_approver_token: bool,
}

impl Default for ApprovalsFile {
    fn default() -> Self {
        Self {
            r#type: default_escalation_type(),
            ttl_seconds: default_approval_ttl(),
            default_approver: default_approver(),
            require_approver_token: false,
        }
    }
}

fn default_escalation_type() -> String {
    "manual".into()
}

fn default_approval_ttl() -> u32 {
    86_400
}

fn default_approver() -> String {
    "manager".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    #[serde(default)]
    duplicate_window_seconds: Option<u32>,
    #[serde(default)]
    velocity: Option<VelocityFile>,
    #[serde(default)]
    signature_skew_seconds: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RiskFile {
    #[serde(default = "default_risk_model")]
    model: String,
    deny_above: f64,
    #[serde(default)]
    signals: Vec<RiskSignalFile>,
}

fn default_risk_model() -> String {
    "mock-gate-risk-1".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RiskSignalFile {
    id: String,
    score: f64,
    #[serde(default)]
    amount_over: Option<String>,
    #[serde(default)]
    velocity_ratio_over: Option<f64>,
    #[serde(default)]
    fact_equals: Option<BTreeMap<String, serde_json::Value>>,
}

// ---------------------------------------------------------------------------------------------
// The compiled settings

/// Everything the engine decides with.
#[derive(Debug)]
pub struct Settings {
    /// The organisation id (`org_id` of the policy commitment, owner of mandates).
    pub org_id: String,
    /// Named in receipts (`environment`).
    pub environment: String,
    /// How bearer keys are checked.
    pub auth: Auth,
    /// The admin key guarding `/v1/admin/*`.
    pub admin_key: Option<String>,
    /// Registered agents; `None` accepts any agent id (flags mode).
    pub agents: Option<BTreeMap<String, AgentSettings>>,
    /// The tool catalog; `None` accepts any tool (flags mode).
    pub tools: Option<BTreeMap<String, ToolSettings>>,
    /// Flags mode rules (`--deny-tool`, `--deny-all`, `--deny-over`, `--escalate-over`).
    pub flags: Option<FlagRules>,
    /// The Cedar policy set and its commitment.
    pub policy: Option<PolicySettings>,
    /// Mandates by id.
    pub mandates: BTreeMap<String, Mandate>,
    /// OIDC delegation.
    pub oidc: Option<OidcSettings>,
    /// Escalations.
    pub approvals: ApprovalSettings,
    /// Duplicate and velocity windows, signature skew.
    pub limits: Limits,
    /// The local risk model.
    pub risk: Option<RiskSettings>,
    /// Authoritative reference amounts.
    pub references: BTreeMap<String, Decimal>,
    /// Where state lives (database, signing key); `None` keeps everything in memory.
    pub state_dir: Option<PathBuf>,
    /// The port named in the file, if any.
    pub port: Option<u16>,
    /// The web console: manager logins and session life ([`crate::console`]).
    pub console: crate::console::ConsoleSettings,
    /// The sidecar and gateway routes; `None`: off.
    pub routing: Option<crate::routing::config::RoutingSettings>,
}

/// How bearer keys are checked.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Any non-empty key (flags mode, like the dev mock).
    AnyKey,
    /// Only these keys; a key bound to an agent may only act for it.
    Keys(BTreeMap<String, ApiKey>),
}

/// One API key.
#[derive(Debug, Clone)]
pub struct ApiKey {
    /// The agent the key is bound to (`rgnt_agt_…` keys).
    pub agent: Option<String>,
    /// A label for the audit log.
    pub label: Option<String>,
}

/// An agent's registration.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// Active, suspended or revoked.
    pub status: AgentStatus,
    /// The tools it may use.
    pub tools: BTreeSet<String>,
    /// Refuse its unsigned requests.
    pub require_signed: bool,
    /// RFC 7638 kid → raw Ed25519 public key.
    pub ed25519_keys: BTreeMap<String, Vec<u8>>,
    /// Its velocity limit (falls back to the global one).
    pub velocity: Option<Velocity>,
}

/// An agent's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStatus {
    /// May act.
    Active,
    /// Temporarily not allowed to act.
    Suspended,
    /// Permanently not allowed to act.
    Revoked,
}

/// A catalog tool.
#[derive(Debug, Clone)]
pub struct ToolSettings {
    /// The actions it exposes.
    pub actions: BTreeSet<String>,
    /// The mandate every amount on it is counted against.
    pub mandate: Option<String>,
    /// Where the routing routes forward its calls, with the vaulted credential.
    pub upstream: Option<crate::routing::config::Upstream>,
}

/// The drop-in rules of flags mode.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlagRules {
    /// Amounts above this are denied `MANDATE_LIMIT_EXCEEDED`.
    pub deny_over: Option<Decimal>,
    /// Amounts above this (and not above `deny_over`) escalate.
    pub escalate_over: Option<Decimal>,
    /// These tools are denied `TOOL_NOT_ALLOWED`.
    pub deny_tools: BTreeSet<String>,
    /// Everything is denied `POLICY_DENIED`.
    pub deny_all: bool,
}

impl FlagRules {
    /// The text whose SHA-256 is the `policy_hash` of flags-mode tokens (`policy_source:
    /// legacy`), so `regent-verify --policy` can check it.
    #[must_use]
    pub fn canonical_text(&self) -> String {
        let dec = |d: Option<Decimal>| d.map_or_else(|| "none".to_owned(), |d| d.to_string());
        format!(
            "mock-gate-flags-v1|deny_all={}|deny_tools={}|deny_over={}|escalate_over={}",
            self.deny_all,
            self.deny_tools
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
            dec(self.deny_over),
            dec(self.escalate_over),
        )
    }
}

/// The compiled policy and what its commitment is made of.
#[derive(Debug)]
pub struct PolicySettings {
    /// The compiled set.
    pub cedar: CedarPolicies,
    /// The Cedar text exactly as read (its SHA-256 enters the commitment).
    pub text: String,
    /// `policy_version`.
    pub version: u32,
    /// The org policy profile.
    pub profile: Profile,
}

/// The org policy profile (its canonical JSON enters the policy commitment).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Counterparty allowlist switch (recorded, not enforced locally).
    pub counterparty_allowlist: bool,
    /// Amounts above this escalate to the default approver.
    pub escalation_amount: Option<Decimal>,
    /// Refuse unsigned requests from every agent.
    pub signed_agents_only: bool,
    /// Decide and record, never block.
    pub observe_mode: bool,
}

impl Profile {
    /// The JSON form the commitment hashes (money as a 2-decimal string).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "counterparty_allowlist": self.counterparty_allowlist,
            "escalation_amount": self.escalation_amount.map(|d| format!("{:.2}", d)),
            "signed_agents_only": self.signed_agents_only,
            "observe_mode": self.observe_mode,
        })
    }
}

/// A mandate (terms-v3 data model).
#[derive(Debug, Clone, PartialEq)]
pub struct Mandate {
    /// Its id.
    pub id: String,
    /// Its version.
    pub version: u32,
    /// The owner (defaults to the org).
    pub owner: String,
    /// The one agent it is for, if restricted.
    pub agent: Option<String>,
    /// Its currency (upper case).
    pub currency: String,
    /// `active` or anything else (inactive).
    pub status: String,
    /// Per-transaction cap.
    pub per_tx_limit: Option<Decimal>,
    /// Per UTC calendar day.
    pub daily_limit: Option<Decimal>,
    /// Per UTC calendar month.
    pub monthly_limit: Option<Decimal>,
    /// Per entity per UTC calendar month.
    pub per_entity_limit: Option<Decimal>,
    /// The context fact naming the entity (e.g. `customer_id`).
    pub entity_key: Option<String>,
    /// When `true` the per-entity sub-budget applies only to requests that send the entity
    /// fact and is skipped for requests without it; when `false` (the default) a request
    /// without it is denied `POLICY_DENIED` (fail closed). A fact that is sent but is not a
    /// non-empty string is refused either way.
    pub entity_optional: bool,
    /// Refunds against one reference stay within its original amount, cumulatively.
    pub relational_cap: bool,
    /// Expiry.
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Tools (or `tool/resource-prefix`) it covers; empty covers all.
    pub allowed_resources: Vec<String>,
}

/// OIDC delegation settings.
#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// Expected `iss`.
    pub issuer: String,
    /// Expected `aud`.
    pub audience: String,
    /// The claim holding the role.
    pub role_claim: String,
    /// The claim holding the e-mail.
    pub email_claim: String,
    /// A JWKS file to verify against.
    pub jwks_file: Option<PathBuf>,
    /// The local test IdP's key file (its public half is trusted too).
    pub test_idp_key: Option<PathBuf>,
    /// Lifetime of test IdP tokens.
    pub test_idp_ttl_seconds: u32,
}

/// Escalation settings.
#[derive(Debug, Clone)]
pub struct ApprovalSettings {
    /// `manual`, `ciba` or `webhook` (only named in the escalation object locally).
    pub escalation_type: String,
    /// How long a pending approval lives.
    pub ttl_seconds: u32,
    /// The approver role of amount escalations (`--escalate-over`, `escalation_amount`).
    pub default_approver: String,
    /// Approving needs a verified id_token with the approver role.
    pub require_approver_token: bool,
}

/// Windows and limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// An identical money request without an idempotency key allowed within this window is
    /// refused `DUPLICATE_REQUEST`.
    pub duplicate_window_seconds: u32,
    /// Default per-agent velocity limit.
    pub velocity: Option<Velocity>,
    /// Allowed clock skew of signature timestamps.
    pub signature_skew_seconds: u32,
}

/// A velocity limit: at most `max` decisions per agent in a sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Velocity {
    /// Decisions allowed in the window.
    pub max: u32,
    /// The window.
    pub window_seconds: u32,
}

/// The local risk model: a sum of matched signal scores, capped at 1.
#[derive(Debug, Clone)]
pub struct RiskSettings {
    /// Named in tokens and receipts (`risk_model`).
    pub model: String,
    /// Scores above this are denied `RISK_THRESHOLD_EXCEEDED`.
    pub deny_above: f64,
    /// The signals.
    pub signals: Vec<RiskSignal>,
}

/// One risk signal.
#[derive(Debug, Clone)]
pub struct RiskSignal {
    /// Its id (named in the reason).
    pub id: String,
    /// What it adds when it matches.
    pub score: f64,
    /// What makes it match.
    pub when: RiskCondition,
}

/// When a risk signal matches.
#[derive(Debug, Clone)]
pub enum RiskCondition {
    /// The amount is above this.
    AmountOver(Decimal),
    /// The agent used more than this fraction of its velocity limit.
    VelocityRatioOver(f64),
    /// A context fact equals this value.
    FactEquals(String, serde_json::Value),
}

impl Settings {
    /// Flags mode: any key, any agent, any tool; the drop-in rules of `regent-control dev`
    /// applied in the right order.
    #[must_use]
    pub fn flags(rules: FlagRules, admin_key: Option<String>) -> Self {
        Self {
            org_id: "org_local".into(),
            environment: "local".into(),
            auth: Auth::AnyKey,
            admin_key,
            agents: None,
            tools: None,
            flags: Some(rules),
            policy: None,
            mandates: BTreeMap::new(),
            oidc: None,
            approvals: ApprovalSettings {
                escalation_type: default_escalation_type(),
                ttl_seconds: default_approval_ttl(),
                default_approver: default_approver(),
                require_approver_token: false,
            },
            limits: Limits {
                duplicate_window_seconds: 0,
                velocity: None,
                signature_skew_seconds: 300,
            },
            risk: None,
            references: BTreeMap::new(),
            state_dir: None,
            port: None,
            console: crate::console::ConsoleSettings::default(),
            routing: None,
        }
    }

    /// Reads and validates a YAML configuration file.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, the field and the problem.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = phrony_manifest::read_yaml_file(path).map_err(|error| ConfigError::Input {
            path: path.to_owned(),
            error,
        })?;
        let file: FileConfig = serde_yaml::from_str(&text).map_err(|e| ConfigError::Yaml {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        compile(file, path, base)
    }
}

/// Where a configuration file came from: it names the file in errors and anchors relative
/// paths.
struct Source<'a> {
    path: &'a Path,
    base: &'a Path,
}

impl Source<'_> {
    /// The error of an invalid `field`.
    fn bad(&self, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_owned(),
            field: field.to_owned(),
            message,
        }
    }

    /// `p` relative to the configuration file's directory (absolute paths stay).
    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.base.join(p)
        }
    }

    /// An optional amount of `field`.
    fn money(&self, field: &str, v: &Option<String>) -> Result<Option<Decimal>, ConfigError> {
        v.as_deref()
            .map(|s| parse_amount(&serde_json::Value::String(s.to_owned())))
            .transpose()
            .map_err(|e| self.bad(field, e))
    }

    /// A velocity limit of `field`.
    fn velocity(&self, v: VelocityFile, field: &str) -> Result<Velocity, ConfigError> {
        if v.max == 0 || v.window_seconds == 0 {
            return Err(self.bad(field, "max and window_seconds must be positive".into()));
        }
        Ok(Velocity {
            max: v.max,
            window_seconds: v.window_seconds,
        })
    }
}

/// Compiles a parsed configuration file into [`Settings`], checking each section in turn
/// (tools, agents, API keys, mandates, policy, OIDC, approvals, risk, references).
fn compile(file: FileConfig, path: &Path, base: &Path) -> Result<Settings, ConfigError> {
    let src = Source { path, base };
    if file.org.id.trim().is_empty() {
        return Err(src.bad("org.id", "must not be empty".into()));
    }
    crate::admin::check_admin_key(&file.admin.key).map_err(|e| src.bad("admin.key", e))?;
    let tools = compile_tools(&src, &file)?;
    let agents = compile_agents(&src, &file, &tools)?;
    let routing = file
        .routing
        .as_ref()
        .map(|r| crate::routing::config::compile_routing(r, |p| src.resolve(p), &agents))
        .transpose()
        .map_err(|(field, message)| src.bad(&format!("routing.{field}"), message))?;
    let keys = compile_api_keys(&src, &file, &agents)?;
    let mandates = compile_mandates(&src, &file, &agents)?;
    let policy = compile_policy(&src, &file, &tools)?;
    let oidc = compile_oidc(&src, &file)?;
    let approvals = compile_approvals(&src, &file, oidc.as_ref())?;
    let risk = compile_risk(&src, &file)?;
    let references = compile_references(&src, &file)?;
    Ok(Settings {
        org_id: file.org.id.clone(),
        environment: file.org.environment.clone(),
        auth: Auth::Keys(keys),
        admin_key: Some(file.admin.key.clone()),
        agents: Some(agents),
        tools: Some(tools),
        flags: None,
        policy,
        mandates,
        oidc,
        approvals,
        limits: Limits {
            duplicate_window_seconds: file.limits.duplicate_window_seconds.unwrap_or(60),
            velocity: file
                .limits
                .velocity
                .map(|v| src.velocity(v, "limits.velocity"))
                .transpose()?,
            signature_skew_seconds: file.limits.signature_skew_seconds.unwrap_or(300),
        },
        risk,
        references,
        state_dir: file.state_dir.as_deref().map(|p| src.resolve(p)),
        port: file.port,
        console: crate::console::compile(file.console.as_ref())
            .map_err(|(field, message)| src.bad(&field, message))?,
        routing,
    })
}

/// The tool catalog: each tool's actions and mandate.
fn compile_tools(
    src: &Source<'_>,
    file: &FileConfig,
) -> Result<BTreeMap<String, ToolSettings>, ConfigError> {
    let mut tools = BTreeMap::new();
    for (name, tool) in &file.tools {
        let field = format!("tools.{name}");
        if name.is_empty() || name.contains(':') {
            return Err(src.bad(
                &field,
                "a tool name must be non-empty and contain no `:`".into(),
            ));
        }
        if tool.actions.is_empty() {
            return Err(src.bad(&format!("{field}.actions"), "lists no action".into()));
        }
        if let Some(m) = &tool.mandate
            && !file.mandates.contains_key(m)
        {
            return Err(src.bad(
                &format!("{field}.mandate"),
                format!("unknown mandate `{m}`"),
            ));
        }
        let actions: BTreeSet<String> = tool.actions.iter().cloned().collect();
        let routing = file.routing.as_ref();
        let has_vault = routing.is_some_and(crate::routing::config::RoutingFile::has_vault);
        let insecure_http =
            routing.is_some_and(crate::routing::config::RoutingFile::allows_insecure_http);
        let upstream = tool
            .upstream
            .as_ref()
            .map(|u| {
                crate::routing::config::compile_upstream(u, &actions, has_vault, insecure_http)
            })
            .transpose()
            .map_err(|(f, message)| src.bad(&format!("{field}.upstream.{f}"), message))?;
        tools.insert(
            name.clone(),
            ToolSettings {
                actions,
                mandate: tool.mandate.clone(),
                upstream,
            },
        );
    }
    Ok(tools)
}

/// The agents: status, tools, signing keys and velocity.
fn compile_agents(
    src: &Source<'_>,
    file: &FileConfig,
    tools: &BTreeMap<String, ToolSettings>,
) -> Result<BTreeMap<String, AgentSettings>, ConfigError> {
    let mut agents = BTreeMap::new();
    for (id, agent) in &file.agents {
        let field = format!("agents.{id}");
        let status = match agent.status.as_str() {
            "active" => AgentStatus::Active,
            "suspended" => AgentStatus::Suspended,
            "revoked" => AgentStatus::Revoked,
            other => {
                return Err(src.bad(
                    &format!("{field}.status"),
                    format!("`{other}` is not one of active, suspended, revoked"),
                ));
            }
        };
        for tool in &agent.tools {
            if !tools.contains_key(tool) {
                return Err(src.bad(&format!("{field}.tools"), format!("unknown tool `{tool}`")));
            }
        }
        let mut keys = BTreeMap::new();
        for (i, key) in agent.signing.ed25519_keys.iter().enumerate() {
            let raw = crate::signing::decode_ed25519_public(key)
                .map_err(|e| src.bad(&format!("{field}.signing.ed25519_keys[{i}]"), e))?;
            keys.insert(crate::signing::ed25519_kid(key.trim()), raw);
        }
        agents.insert(
            id.clone(),
            AgentSettings {
                status,
                tools: agent.tools.iter().cloned().collect(),
                require_signed: agent.signing.require,
                ed25519_keys: keys,
                velocity: agent
                    .velocity
                    .map(|v| src.velocity(v, &format!("{field}.velocity")))
                    .transpose()?,
            },
        );
    }
    Ok(agents)
}

/// The API keys, each bound to a known agent (or none) and distinct from the admin key.
fn compile_api_keys(
    src: &Source<'_>,
    file: &FileConfig,
    agents: &BTreeMap<String, AgentSettings>,
) -> Result<BTreeMap<String, ApiKey>, ConfigError> {
    let mut keys = BTreeMap::new();
    for (i, key) in file.api_keys.iter().enumerate() {
        let field = format!("api_keys[{i}]");
        if key.key.trim().len() < 8 {
            return Err(src.bad(&field, "a key must be at least 8 characters".into()));
        }
        if let Some(agent) = &key.agent
            && !agents.contains_key(agent)
        {
            return Err(src.bad(
                &format!("{field}.agent"),
                format!("unknown agent `{agent}`"),
            ));
        }
        if key.key == file.admin.key {
            return Err(src.bad(&field, "an API key must differ from the admin key".into()));
        }
        let previous = keys.insert(
            key.key.clone(),
            ApiKey {
                agent: key.agent.clone(),
                label: key.label.clone(),
            },
        );
        if previous.is_some() {
            return Err(src.bad(&field, "duplicate key".into()));
        }
    }
    Ok(keys)
}

/// The mandates: currency, owner, limits, entity budgets and expiry.
fn compile_mandates(
    src: &Source<'_>,
    file: &FileConfig,
    agents: &BTreeMap<String, AgentSettings>,
) -> Result<BTreeMap<String, Mandate>, ConfigError> {
    let mut mandates = BTreeMap::new();
    for (id, m) in &file.mandates {
        let field = format!("mandates.{id}");
        let currency = m.currency.trim().to_ascii_uppercase();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(src.bad(
                &format!("{field}.currency"),
                "must be an ISO 4217 code".into(),
            ));
        }
        if let Some(agent) = &m.agent
            && !agents.contains_key(agent)
        {
            return Err(src.bad(
                &format!("{field}.agent"),
                format!("unknown agent `{agent}`"),
            ));
        }
        if m.per_entity_limit.is_some() != m.entity_key.is_some() {
            return Err(src.bad(&field, "per_entity_limit and entity_key go together".into()));
        }
        if m.entity_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(src.bad(&format!("{field}.entity_key"), "must not be empty".into()));
        }
        if m.entity_optional && m.entity_key.is_none() {
            return Err(src.bad(
                &format!("{field}.entity_optional"),
                "needs a per-entity sub-budget (per_entity_limit and entity_key)".into(),
            ));
        }
        let expires_at = m
            .expires_at
            .as_deref()
            .map(chrono::DateTime::parse_from_rfc3339)
            .transpose()
            .map_err(|e| src.bad(&format!("{field}.expires_at"), format!("not RFC 3339: {e}")))?
            .map(|t| t.with_timezone(&chrono::Utc));
        mandates.insert(
            id.clone(),
            Mandate {
                id: id.clone(),
                version: m.version,
                owner: m.owner.clone().unwrap_or_else(|| file.org.id.clone()),
                agent: m.agent.clone(),
                currency,
                status: m.status.clone(),
                per_tx_limit: src.money(&format!("{field}.per_tx_limit"), &m.per_tx_limit)?,
                daily_limit: src.money(&format!("{field}.daily_limit"), &m.daily_limit)?,
                monthly_limit: src.money(&format!("{field}.monthly_limit"), &m.monthly_limit)?,
                per_entity_limit: src
                    .money(&format!("{field}.per_entity_limit"), &m.per_entity_limit)?,
                entity_key: m.entity_key.clone(),
                entity_optional: m.entity_optional,
                relational_cap: m.relational_cap,
                expires_at,
                allowed_resources: m.allowed_resources.clone(),
            },
        );
    }
    Ok(mandates)
}

/// The Cedar policy, compiled for the catalog's actions and the declared facts.
fn compile_policy(
    src: &Source<'_>,
    file: &FileConfig,
    tools: &BTreeMap<String, ToolSettings>,
) -> Result<Option<PolicySettings>, ConfigError> {
    let policy = match &file.policy {
        None => None,
        Some(p) => {
            let cedar_path = src.resolve(&p.cedar_file);
            let text = std::fs::read_to_string(&cedar_path).map_err(|error| ConfigError::Read {
                path: cedar_path.clone(),
                error,
            })?;
            let mut facts = BTreeMap::new();
            for (name, fact) in &p.facts {
                let (ty, optional) = match fact {
                    FactFile::Short(t) => (t.as_str(), false),
                    FactFile::Long { ty, optional } => (ty.as_str(), *optional),
                };
                let ty = FactType::parse(ty).ok_or_else(|| {
                    src.bad(
                        &format!("policy.facts.{name}"),
                        format!("unknown type `{ty}` (string, bool, long, decimal, string_set)"),
                    )
                })?;
                facts.insert(name.clone(), FactSpec { ty, optional });
            }
            let actions: BTreeSet<&String> =
                tools.values().flat_map(|t| t.actions.iter()).collect();
            let spec = CedarSpec {
                principal_type: "Agent".into(),
                resource_type: "Tool".into(),
                actions: actions
                    .into_iter()
                    .map(|a| (a.clone(), facts.clone()))
                    .collect(),
            };
            let cedar = CedarPolicies::compile(&text, &spec).map_err(|e| {
                src.bad(
                    "policy.cedar_file",
                    format!("{}: {e}", cedar_path.display()),
                )
            })?;
            Some(PolicySettings {
                cedar,
                text,
                version: p.version,
                profile: Profile {
                    counterparty_allowlist: p.profile.counterparty_allowlist,
                    escalation_amount: src.money(
                        "policy.profile.escalation_amount",
                        &p.profile.escalation_amount,
                    )?,
                    signed_agents_only: p.profile.signed_agents_only,
                    observe_mode: p.profile.observe_mode,
                },
            })
        }
    };
    Ok(policy)
}

/// The OIDC delegation: a JWKS file or a test IdP.
fn compile_oidc(src: &Source<'_>, file: &FileConfig) -> Result<Option<OidcSettings>, ConfigError> {
    let oidc = file.oidc.as_ref().map(|o| OidcSettings {
        issuer: o.issuer.clone(),
        audience: o.audience.clone(),
        role_claim: o.role_claim.clone(),
        email_claim: o.email_claim.clone(),
        jwks_file: o.jwks_file.as_deref().map(|p| src.resolve(p)),
        test_idp_key: o.test_idp.as_ref().map(|t| src.resolve(&t.key_file)),
        test_idp_ttl_seconds: o.test_idp.as_ref().map_or(3600, |t| t.token_ttl_seconds),
    });
    if let Some(o) = &oidc
        && o.jwks_file.is_none()
        && o.test_idp_key.is_none()
    {
        return Err(src.bad("oidc", "needs jwks_file or test_idp".into()));
    }
    Ok(oidc)
}

/// The approvals: escalation type, life and approver tokens (which need OIDC).
fn compile_approvals(
    src: &Source<'_>,
    file: &FileConfig,
    oidc: Option<&OidcSettings>,
) -> Result<ApprovalSettings, ConfigError> {
    let approvals = ApprovalSettings {
        escalation_type: match file.approvals.r#type.as_str() {
            t @ ("manual" | "ciba" | "webhook") => t.to_owned(),
            other => {
                return Err(src.bad(
                    "approvals.type",
                    format!("`{other}` is not one of manual, ciba, webhook"),
                ));
            }
        },
        ttl_seconds: file.approvals.ttl_seconds.max(1),
        default_approver: file.approvals.default_approver.clone(),
        require_approver_token: file.approvals.require_approver_token,
    };
    if approvals.require_approver_token && oidc.is_none() {
        return Err(src.bad(
            "approvals.require_approver_token",
            "needs an oidc section to verify approver tokens".into(),
        ));
    }
    Ok(approvals)
}

/// The risk model: a deny threshold and signals with exactly one condition each.
fn compile_risk(src: &Source<'_>, file: &FileConfig) -> Result<Option<RiskSettings>, ConfigError> {
    let risk = match &file.risk {
        None => None,
        Some(r) => {
            if !(0.0..=1.0).contains(&r.deny_above) {
                return Err(src.bad("risk.deny_above", "must be within 0..=1".into()));
            }
            let mut signals = Vec::new();
            for (i, s) in r.signals.iter().enumerate() {
                let field = format!("risk.signals[{i}]");
                let conditions = [
                    s.amount_over.is_some(),
                    s.velocity_ratio_over.is_some(),
                    s.fact_equals.is_some(),
                ];
                if conditions.iter().filter(|c| **c).count() != 1 {
                    return Err(src.bad(
                        &field,
                        "needs exactly one of amount_over, velocity_ratio_over, fact_equals".into(),
                    ));
                }
                let when = if let Some(a) = &s.amount_over {
                    RiskCondition::AmountOver(
                        src.money(&format!("{field}.amount_over"), &Some(a.clone()))?
                            .unwrap_or_default(),
                    )
                } else if let Some(r) = s.velocity_ratio_over {
                    RiskCondition::VelocityRatioOver(r)
                } else {
                    let map = s.fact_equals.clone().unwrap_or_default();
                    let mut it = map.into_iter();
                    match (it.next(), it.next()) {
                        (Some((k, v)), None) => RiskCondition::FactEquals(k, v),
                        _ => {
                            return Err(src.bad(
                                &format!("{field}.fact_equals"),
                                "needs exactly one fact".into(),
                            ));
                        }
                    }
                };
                signals.push(RiskSignal {
                    id: s.id.clone(),
                    score: s.score,
                    when,
                });
            }
            Some(RiskSettings {
                model: r.model.clone(),
                deny_above: r.deny_above,
                signals,
            })
        }
    };
    Ok(risk)
}

/// The reference amounts.
fn compile_references(
    src: &Source<'_>,
    file: &FileConfig,
) -> Result<BTreeMap<String, Decimal>, ConfigError> {
    let mut references = BTreeMap::new();
    for (reference, amount) in &file.references {
        references.insert(
            reference.clone(),
            src.money(&format!("references.{reference}"), &Some(amount.clone()))?
                .unwrap_or_default(),
        );
    }
    Ok(references)
}

impl FromStr for AgentStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(Self::Active),
            "suspended" => Ok(Self::Suspended),
            "revoked" => Ok(Self::Revoked),
            other => Err(format!("unknown agent status `{other}`")),
        }
    }
}
