//! Webhooks (issue #19, notifications): the webhooks file (`RUNTIME_WEBHOOKS_FILE`), the
//! bodies (`json`, signed with HMAC-SHA256; `slack`, an incoming-webhook message) and the sender,
//! a background task on the daemon's runtime that drives the ledger's outbox
//! (`phrony_ledger::Ledger::claim_webhook_deliveries`).
//!
//! The ledger writes a pending delivery per configured webhook in the transaction of the event
//! that notifies, so nothing committed is lost across a restart; the sender claims due
//! deliveries (leased: a sender that dies mid-attempt leaves it due again when the lease ends),
//! POSTs them with a per-request timeout and at most [`MAX_IN_FLIGHT`] requests at once,
//! and records the outcome: delivered, retry after an exponential backoff with jitter (capped),
//! or `failed` after `max_attempts`. It wakes after a commit that made deliveries due (the
//! ledger's notify) and every [`POLL_INTERVAL`] (other replicas' commits, backoffs ending). It
//! never runs on a decision's path: a slow or dead receiver delays only its own deliveries.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac as _};
use phrony_ledger::{
    AttemptOutcome, ClaimedDelivery, EventBody, Ledger, NotificationKind, WEBHOOK_RETENTION,
    WebhookRoute,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sha2::Sha256;

/// The most webhooks one file may configure.
pub const MAX_WEBHOOKS: usize = 32;
/// The most requests in flight over every webhook.
pub const MAX_IN_FLIGHT: usize = 16;
/// How often the sender looks for due deliveries without being woken.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often delivered rows older than [`WEBHOOK_RETENTION`] are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);
/// The most amount-like arguments a Slack message lists.
pub const MAX_SLACK_AMOUNTS: usize = 8;
/// The longest text of one field in a Slack message (characters).
const MAX_SLACK_FIELD: usize = 300;
/// Bounds of the per-webhook settings.
const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(60));
const MAX_MAX_ATTEMPTS: u32 = 50;

/// The body format of a webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The JSON event body, signed (`Phrony-Webhook-Signature`).
    #[default]
    Json,
    /// A Slack incoming-webhook message (`text` and `blocks`), unsigned: the URL is the secret.
    Slack,
}

/// One configured webhook.
#[derive(Clone)]
pub struct Webhook {
    /// Its name (deliveries are listed under it).
    pub name: String,
    /// Where bodies are POSTed.
    pub url: url::Url,
    /// What it receives.
    pub events: BTreeSet<NotificationKind>,
    /// The body format.
    pub format: Format,
    /// The HMAC key (from the environment variable `secret_env`); `None` for Slack.
    secret: Option<Vec<u8>>,
    /// The console's base URL for links (`<console_url>/console/#/approvals/<id>`).
    pub console_url: Option<url::Url>,
    /// The per-request timeout.
    pub timeout: Duration,
    /// Attempts before the delivery is `failed`.
    pub max_attempts: u32,
    /// The first backoff; it doubles per attempt up to `backoff_max`, with jitter.
    pub backoff_initial: Duration,
    /// The backoff cap.
    pub backoff_max: Duration,
    /// Plain HTTP to a non-loopback host was allowed explicitly.
    pub allow_insecure_http: bool,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("name", &self.name)
            .field("url", &self.url.origin().ascii_serialization())
            .field("events", &self.events)
            .field("format", &self.format)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// The webhooks file.
#[derive(Debug, Clone)]
pub struct WebhooksConfig {
    /// The webhooks, by configuration order.
    pub webhooks: Vec<Webhook>,
}

/// Why the webhooks file was refused: `file:line:column: problem`, never a secret.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct WebhooksFileError {
    /// The file.
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// The column (1-based).
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    webhooks: Vec<RawWebhook>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    name: Name,
    url: String,
    events: Vec<Kind>,
    #[serde(default)]
    format: Format,
    #[serde(default)]
    secret_env: Option<String>,
    #[serde(default)]
    console_url: Option<String>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    backoff_initial: Option<String>,
    #[serde(default)]
    backoff_max: Option<String>,
    #[serde(default)]
    allow_insecure_http: bool,
}

/// A webhook name: 1–64 of `a-z 0-9 . _ -`, starting with a letter or digit.
struct Name(String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
            });
        if ok {
            Ok(Self(s))
        } else {
            Err(serde::de::Error::custom(format!(
                "name {s:?}: use 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter \
                 or digit"
            )))
        }
    }
}

struct Kind(NotificationKind);

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        NotificationKind::parse(&s).map(Self).ok_or_else(|| {
            let known: Vec<&str> = NotificationKind::ALL.iter().map(|k| k.as_str()).collect();
            serde::de::Error::custom(format!(
                "unknown event {s:?}; expected one of {}",
                known.join(", ")
            ))
        })
    }
}

/// A duration setting (`500ms`, `10s`, `1h`), or what is wrong with it.
fn duration(text: Option<&str>) -> Result<Option<Duration>, String> {
    text.map(|s| {
        humantime::parse_duration(s).map_err(|e| format!("duration {s:?}: {e} (e.g. 500ms, 10s)"))
    })
    .transpose()
}

/// Whether `host` is a loopback address or `localhost`.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

impl WebhooksConfig {
    /// Reads the webhooks file with the manifest crate's bounded YAML reader.
    ///
    /// # Errors
    /// [`WebhooksFileError`]: `file:line:column: problem` (line 1, column 1 when the file cannot
    /// be read or the problem has no position).
    pub fn load(path: &Path) -> Result<Self, WebhooksFileError> {
        let file = path.display().to_string();
        let text = phrony_manifest::read_yaml_file(path).map_err(|e| {
            let (line, column) = match &e {
                phrony_manifest::YamlInputError::Syntax { line, column, .. } => (*line, *column),
                _ => (1, 1),
            };
            WebhooksFileError {
                file: file.clone(),
                line,
                column,
                message: e.to_string(),
            }
        })?;
        Self::parse(&file, &text, &|var| std::env::var(var).ok())
    }

    /// Parses the file's text (already bounded and alias-checked); `env` reads the secrets'
    /// environment variables.
    ///
    /// # Errors
    /// As [`WebhooksConfig::load`].
    pub fn parse(
        file: &str,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, WebhooksFileError> {
        let at = |line: usize, column: usize, message: String| WebhooksFileError {
            file: file.to_owned(),
            line,
            column,
            message,
        };
        let raw: RawFile = serde_yaml::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            let message = e.to_string();
            let message = message
                .rsplit_once(" at line ")
                .map_or(message.as_str(), |(m, _)| m)
                .to_owned();
            at(line, column, message)
        })?;
        if raw.webhooks.len() > MAX_WEBHOOKS {
            return Err(at(
                1,
                1,
                format!(
                    "at most {MAX_WEBHOOKS} webhooks (found {})",
                    raw.webhooks.len()
                ),
            ));
        }
        let positions = phrony_manifest::YamlPositions::index(text);
        let mut webhooks = Vec::new();
        let mut names = BTreeSet::new();
        for (index, raw) in raw.webhooks.into_iter().enumerate() {
            let name = raw.name.0;
            let entry = format!("webhooks[{index}]");
            // A problem of the entry is reported where it starts; one of a setting, at the
            // setting's value.
            let fail = |m: String| {
                let (line, column) = positions.key(&entry);
                at(line, column, format!("webhook {name:?}: {m}"))
            };
            let fail_at = |field: &str, m: String| {
                let (line, column) = positions.value(&format!("{entry}.{field}"));
                at(line, column, format!("webhook {name:?}: {field}: {m}"))
            };
            if !names.insert(name.clone()) {
                return Err(fail("a second webhook with this name".to_owned()));
            }
            let url = url::Url::parse(&raw.url).map_err(|e| fail_at("url", e.to_string()))?;
            match url.scheme() {
                "https" => {}
                "http" if is_loopback(&url) || raw.allow_insecure_http => {}
                "http" => {
                    return Err(fail_at(
                        "url",
                        "plain http is refused to a non-loopback host; use https, or set \
                         allow_insecure_http: true"
                            .to_owned(),
                    ));
                }
                other => {
                    return Err(fail_at("url", format!("scheme {other:?} is not http(s)")));
                }
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(fail_at(
                    "url",
                    "credentials in the URL are refused (they would be logged)".to_owned(),
                ));
            }
            if raw.events.is_empty() {
                return Err(fail_at("events", "list at least one event".to_owned()));
            }
            let secret = match (raw.format, raw.secret_env.as_deref()) {
                (Format::Json, None) => {
                    return Err(fail(
                        "secret_env: required for format json (the environment variable \
                         holding the HMAC key)"
                            .to_owned(),
                    ));
                }
                (Format::Json, Some(var)) => match env(var) {
                    Some(v) if v.len() >= 16 => Some(v.into_bytes()),
                    Some(_) => {
                        return Err(fail_at(
                            "secret_env",
                            format!("{var} holds fewer than 16 bytes"),
                        ));
                    }
                    None => return Err(fail_at("secret_env", format!("{var} is not set"))),
                },
                (Format::Slack, Some(_)) => {
                    return Err(fail_at(
                        "secret_env",
                        "slack messages are not signed (the URL is the secret); remove \
                         secret_env"
                            .to_owned(),
                    ));
                }
                (Format::Slack, None) => None,
            };
            let console_url = raw
                .console_url
                .as_deref()
                .map(|u| {
                    url::Url::parse(u)
                        .ok()
                        .filter(|u| matches!(u.scheme(), "http" | "https"))
                        .ok_or_else(|| {
                            fail_at("console_url", format!("{u:?} is not an http(s) URL"))
                        })
                })
                .transpose()?;
            let timeout = duration(raw.timeout.as_deref())
                .map_err(|m| fail_at("timeout", m))?
                .unwrap_or(Duration::from_secs(10));
            if timeout < TIMEOUT_RANGE.0 || timeout > TIMEOUT_RANGE.1 {
                return Err(fail_at("timeout", "between 100ms and 60s".to_owned()));
            }
            let max_attempts = raw.max_attempts.unwrap_or(8);
            if max_attempts == 0 || max_attempts > MAX_MAX_ATTEMPTS {
                return Err(fail_at(
                    "max_attempts",
                    format!("between 1 and {MAX_MAX_ATTEMPTS}"),
                ));
            }
            let backoff_initial = duration(raw.backoff_initial.as_deref())
                .map_err(|m| fail_at("backoff_initial", m))?
                .unwrap_or(Duration::from_secs(5));
            let backoff_max = duration(raw.backoff_max.as_deref())
                .map_err(|m| fail_at("backoff_max", m))?
                .unwrap_or(Duration::from_secs(600));
            if backoff_initial.is_zero() || backoff_max < backoff_initial {
                return Err(fail_at(
                    "backoff_initial",
                    "must be positive and at most backoff_max".to_owned(),
                ));
            }
            if backoff_max > Duration::from_secs(24 * 3600) {
                return Err(fail_at("backoff_max", "at most 24h".to_owned()));
            }
            webhooks.push(Webhook {
                name,
                url,
                events: raw.events.into_iter().map(|k| k.0).collect(),
                format: raw.format,
                secret,
                console_url,
                timeout,
                max_attempts,
                backoff_initial,
                backoff_max,
                allow_insecure_http: raw.allow_insecure_http,
            });
        }
        Ok(Self { webhooks })
    }

    /// The routes the ledger writes deliveries for.
    #[must_use]
    pub fn routes(&self) -> Vec<WebhookRoute> {
        self.webhooks
            .iter()
            .map(|w| WebhookRoute {
                name: w.name.clone(),
                kinds: w.events.iter().copied().collect(),
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies

/// What a body is built from: the delivery, the event and (for approvals) the approval.
#[derive(Debug, Clone)]
pub struct Notification {
    /// The delivery id (the idempotency id).
    pub id: uuid::Uuid,
    /// The kind.
    pub kind: NotificationKind,
    /// When the event was committed.
    pub occurred_at: DateTime<Utc>,
    /// The session.
    pub session_id: String,
    /// The call, for approvals.
    pub call_id: Option<String>,
    /// The approval (for `approval.escalated`, the one that timed out).
    pub approval_id: Option<uuid::Uuid>,
    /// The new approval of an escalation.
    pub escalated_to: Option<uuid::Uuid>,
    /// `namespace/name@version`.
    pub agent: String,
    /// The tool, for approvals.
    pub tool: Option<String>,
    /// The approval's exact arguments.
    pub arguments: Option<Value>,
    /// The policy that asked (`ns/name@version`).
    pub policy: Option<String>,
    /// Why (the approval's reason, or the session's failure message).
    pub reason: Option<String>,
    /// The approval's route.
    pub route: Option<String>,
    /// Approvals required and received, with the votes.
    pub quorum: Option<Value>,
    /// Who decided (decided, expired, escalated).
    pub decided_by: Option<String>,
    /// The decision (`approved`, `denied`).
    pub decision: Option<String>,
    /// The decider's comment.
    pub comment: Option<String>,
}

impl Notification {
    /// Reads what the body needs from the ledger: the event at `claim.stream`/`claim.seq`
    /// and, for approvals, the approval.
    ///
    /// # Errors
    /// When the event or the approval cannot be read.
    pub async fn read(ledger: &Ledger, claim: &ClaimedDelivery) -> anyhow::Result<Self> {
        let event = ledger
            .list_events(&claim.stream, claim.seq.saturating_sub(1), 1)
            .await?
            .into_iter()
            .next()
            .filter(|e| e.seq == claim.seq)
            .ok_or_else(|| anyhow::anyhow!("event {} #{} not found", claim.stream, claim.seq))?;
        let body = event.body()?;
        let mut n = Self {
            id: claim.id,
            kind: claim.kind,
            occurred_at: event.ts,
            session_id: claim.stream.clone(),
            call_id: None,
            approval_id: None,
            escalated_to: None,
            agent: String::new(),
            tool: None,
            arguments: None,
            policy: None,
            reason: None,
            route: None,
            quorum: None,
            decided_by: None,
            decision: None,
            comment: None,
        };
        let approval_id = match &body {
            EventBody::ApprovalRequired(r) => Some(r.approval_id),
            EventBody::ApprovalDecided(d) => {
                n.decided_by = Some(d.decided_by.clone());
                n.decision = Some(d.status.as_str().to_owned());
                n.comment = Some(d.comment.clone()).filter(|c| !c.is_empty());
                Some(d.approval_id)
            }
            EventBody::ApprovalEscalated(e) => {
                n.decided_by = Some(e.decided_by.clone());
                n.comment = Some(e.comment.clone()).filter(|c| !c.is_empty());
                n.escalated_to = Some(e.escalated_to);
                Some(e.approval_id)
            }
            EventBody::SessionFailed(f) => {
                n.reason = f.message.clone().or_else(|| f.reason.clone());
                None
            }
            other => anyhow::bail!("event type {} does not notify", other.event_type()),
        };
        if let Some(id) = approval_id {
            let a = ledger.get_approval(id).await?;
            n.session_id = a.session_id.clone();
            n.call_id = Some(a.call_id.clone());
            n.approval_id = Some(a.id);
            n.agent = a.agent.to_string();
            n.tool = Some(format!("{}@{}", a.tool, a.tool_version));
            n.arguments = Some(a.args.clone());
            n.policy = a.policy_ref.clone();
            n.reason = Some(a.reason.clone());
            n.route = Some(a.route.clone());
            n.quorum = Some(json!({
                "required": a.approvals_required,
                "received": a.approvals_received,
                "votes": a.votes.iter().map(|v| json!({
                    "decided_by": v.decided_by,
                    "decision": v.decision.as_str(),
                    "comment": v.comment,
                })).collect::<Vec<_>>(),
            }));
        } else {
            n.agent = ledger.get_session(&n.session_id).await?.agent.to_string();
        }
        Ok(n)
    }

    /// The console link: the approval's page, or the session's.
    #[must_use]
    pub fn console_link(&self, console_url: Option<&url::Url>) -> Option<String> {
        let base = console_url?.as_str().trim_end_matches('/').to_owned();
        let target = self.escalated_to.or(self.approval_id).map_or_else(
            || format!("sessions/{}", encode(&self.session_id)),
            |id| format!("approvals/{id}"),
        );
        Some(format!("{base}/console/#/{target}"))
    }

    /// The `json` body.
    #[must_use]
    pub fn json_body(&self, console_url: Option<&url::Url>) -> Value {
        let mut body = Map::new();
        body.insert("id".into(), json!(self.id));
        body.insert("type".into(), json!(self.kind.as_str()));
        body.insert(
            "occurred_at".into(),
            json!(
                self.occurred_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            ),
        );
        body.insert("session_id".into(), json!(self.session_id));
        body.insert("agent".into(), json!(self.agent));
        let optional = [
            ("call_id", self.call_id.as_ref().map(|v| json!(v))),
            ("approval_id", self.approval_id.map(|v| json!(v))),
            ("escalated_to", self.escalated_to.map(|v| json!(v))),
            ("tool", self.tool.as_ref().map(|v| json!(v))),
            ("arguments", self.arguments.clone()),
            ("policy", self.policy.as_ref().map(|v| json!(v))),
            ("reason", self.reason.as_ref().map(|v| json!(v))),
            ("route", self.route.as_ref().map(|v| json!(v))),
            ("quorum", self.quorum.clone()),
            ("decision", self.decision.as_ref().map(|v| json!(v))),
            ("decided_by", self.decided_by.as_ref().map(|v| json!(v))),
            ("comment", self.comment.as_ref().map(|v| json!(v))),
            (
                "console_url",
                self.console_link(console_url).map(|v| json!(v)),
            ),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                body.insert(key.into(), value);
            }
        }
        Value::Object(body)
    }

    /// The `slack` body: `text` (the notification's fallback) and `blocks`.
    #[must_use]
    pub fn slack_body(&self, console_url: Option<&url::Url>) -> Value {
        let headline = match self.kind {
            NotificationKind::ApprovalRequired => "Approval required",
            NotificationKind::ApprovalDecided => match self.decision.as_deref() {
                Some("approved") => "Approval granted",
                _ => "Approval rejected",
            },
            NotificationKind::ApprovalExpired => "Approval expired",
            NotificationKind::ApprovalEscalated => "Approval escalated",
            NotificationKind::SessionFailed => "Session failed",
        };
        let subject = self.tool.as_deref().unwrap_or(&self.agent);
        let text = format!("{headline}: {}", bounded(subject));
        let mut fields = vec![field("Agent", &self.agent)];
        if let Some(tool) = &self.tool {
            fields.push(field("Tool", tool));
        }
        for (key, value) in amounts(self.arguments.as_ref()) {
            fields.push(field(&key, &value));
        }
        if let Some(policy) = &self.policy {
            fields.push(field("Policy", policy));
        }
        if let Some(by) = &self.decided_by {
            fields.push(field("Decided by", by));
        }
        let mut blocks = vec![
            json!({"type": "header", "text": {"type": "plain_text", "text": headline}}),
            json!({"type": "section", "fields": fields}),
        ];
        if let Some(reason) = &self.reason {
            blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                "text": format!("*Reason:* {}", escape(&bounded(reason)))}}));
        }
        if let Some(comment) = &self.comment {
            blocks.push(json!({"type": "section", "text": {"type": "mrkdwn",
                "text": format!("*Comment:* {}", escape(&bounded(comment)))}}));
        }
        if let Some(link) = self.console_link(console_url) {
            blocks.push(json!({"type": "actions", "elements": [{"type": "button",
                "text": {"type": "plain_text", "text": "Open in the console"}, "url": link}]}));
        }
        blocks.push(json!({"type": "context", "elements": [{"type": "mrkdwn",
            "text": escape(&format!("session {} · {}", self.session_id, self.id))}]}));
        json!({"text": escape(&text), "blocks": blocks})
    }
}

fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn bounded(text: &str) -> String {
    if text.chars().count() <= MAX_SLACK_FIELD {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(MAX_SLACK_FIELD - 1).collect();
    cut.push('…');
    cut
}

/// Slack's mrkdwn control characters escaped.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn field(label: &str, value: &str) -> Value {
    json!({"type": "mrkdwn", "text": format!("*{}:*\n{}", escape(label), escape(&bounded(value)))})
}

/// The amount-like top-level arguments (keys containing amount, total, price or value, and
/// a currency beside them), at most [`MAX_SLACK_AMOUNTS`], in key order.
fn amounts(args: Option<&Value>) -> Vec<(String, String)> {
    let Some(Value::Object(map)) = args else {
        return Vec::new();
    };
    let currency = ["currency", "currency_code"]
        .iter()
        .find_map(|k| map.get(*k).and_then(Value::as_str))
        .map(str::to_owned);
    map.iter()
        .filter(|(k, v)| {
            let k = k.to_ascii_lowercase();
            ["amount", "total", "price", "value"]
                .iter()
                .any(|word| k.contains(word))
                && (v.is_number() || v.is_string())
        })
        .take(MAX_SLACK_AMOUNTS)
        .map(|(k, v)| {
            let shown = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let shown = match &currency {
                Some(c) => format!("{shown} {c}"),
                None => shown,
            };
            (k.clone(), shown)
        })
        .collect()
}

/// `v1=<hex HMAC-SHA256 of "<timestamp>.<body>">`.
///
/// # Panics
/// Never: HMAC accepts keys of any length.
#[must_use]
pub fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    #[allow(
        clippy::expect_used,
        reason = "Hmac::new_from_slice accepts every key length"
    )]
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

// ---------------------------------------------------------------------------------------------
// The sender

/// The running sender; dropping it ends it (an attempt cut off stays claimed and is sent again
/// when its lease ends).
#[derive(Debug)]
pub struct WebhookSender {
    task: tokio::task::JoinHandle<()>,
}

impl WebhookSender {
    /// Starts the sender for `config` on `ledger` (which must have been given the same routes
    /// with `Ledger::with_webhooks`).
    ///
    /// # Errors
    /// When an HTTP client cannot be built (the TLS backend failed to initialise).
    pub fn start(ledger: Ledger, config: Arc<WebhooksConfig>) -> anyhow::Result<Self> {
        let mut clients = Vec::new();
        for w in &config.webhooks {
            if w.allow_insecure_http && w.url.scheme() == "http" && !is_loopback(&w.url) {
                tracing::warn!(
                    webhook = %w.name,
                    "webhook sends plain HTTP to a non-loopback host (allow_insecure_http: true)"
                );
            }
            let client = reqwest::Client::builder()
                .timeout(w.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("phrony-runtime/", env!("CARGO_PKG_VERSION")))
                .build()?;
            clients.push(client);
        }
        tracing::info!(
            webhooks = config.webhooks.len(),
            "webhooks on: {}",
            config
                .webhooks
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let task = tokio::spawn(run(ledger, config, Arc::new(clients)));
        Ok(Self { task })
    }
}

impl Drop for WebhookSender {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How often the start-up pass over the deliveries of webhooks no longer configured is tried
/// (the database may be down at start).
const UNCONFIGURED_ATTEMPTS: u32 = 60;

/// At start-up: the pending deliveries of webhooks the file no longer names (the ledger's
/// routes) are failed, audited as `webhook.unconfigured`; tried again every [`POLL_INTERVAL`]
/// while the database is unreachable, at most [`UNCONFIGURED_ATTEMPTS`] times.
pub async fn fail_unconfigured(ledger: Ledger) {
    for _ in 0..UNCONFIGURED_ATTEMPTS {
        match ledger.fail_unconfigured_webhook_deliveries().await {
            Ok(failed) => {
                for gone in failed {
                    tracing::warn!(
                        webhook = %gone.webhook,
                        deliveries = gone.deliveries,
                        "pending webhook deliveries failed: the webhook is no longer configured"
                    );
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check for deliveries of unconfigured webhooks");
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
}

async fn run(ledger: Ledger, config: Arc<WebhooksConfig>, clients: Arc<Vec<reqwest::Client>>) {
    fail_unconfigured(ledger.clone()).await;
    let wake = ledger.webhook_wake();
    // An attempt that ends frees a permit: more due deliveries may be claimed at once instead of
    // at the next poll (without it the sender sent at most MAX_IN_FLIGHT per POLL_INTERVAL).
    let finished = Arc::new(tokio::sync::Notify::new());
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut last_prune: Option<tokio::time::Instant> = None;
    loop {
        if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_INTERVAL) {
            last_prune = Some(tokio::time::Instant::now());
            let before = Utc::now()
                - chrono::Duration::from_std(WEBHOOK_RETENTION).unwrap_or(chrono::Duration::zero());
            match ledger.prune_webhook_deliveries(before).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deliveries = n, "pruned delivered webhook deliveries"),
                Err(e) => tracing::warn!(error = %e, "could not prune webhook deliveries"),
            }
        }
        for (index, webhook) in config.webhooks.iter().enumerate() {
            let free = permits.available_permits();
            if free == 0 {
                break;
            }
            // Leased for the request's timeout plus a margin: a dead sender's attempt is due
            // again soon after.
            let lease = webhook.timeout + Duration::from_secs(5);
            let claimed = match ledger
                .claim_webhook_deliveries(
                    &webhook.name,
                    lease,
                    u32::try_from(free).unwrap_or(u32::MAX),
                )
                .await
            {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(webhook = %webhook.name, error = %e, "cannot claim webhook deliveries");
                    continue;
                }
            };
            for claim in claimed {
                let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
                    return;
                };
                let ledger = ledger.clone();
                let config = Arc::clone(&config);
                let clients = Arc::clone(&clients);
                let finished = Arc::clone(&finished);
                tokio::spawn(async move {
                    if let (Some(webhook), Some(client)) =
                        (config.webhooks.get(index), clients.get(index))
                    {
                        attempt(&ledger, webhook, client, claim).await;
                    }
                    drop(permit);
                    finished.notify_one();
                });
            }
        }
        let sleep = tokio::time::sleep(POLL_INTERVAL);
        match &wake {
            Some(wake) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = finished.notified() => {}
                    () = sleep => {}
                }
            }
            None => {
                tokio::select! {
                    () = finished.notified() => {}
                    () = sleep => {}
                }
            }
        }
    }
}

/// One attempt: build, send, record.
async fn attempt(
    ledger: &Ledger,
    webhook: &Webhook,
    client: &reqwest::Client,
    claim: ClaimedDelivery,
) {
    let result = send(ledger, webhook, client, &claim).await;
    let (outcome, metric) = match result {
        Ok(()) => (
            AttemptOutcome::Delivered,
            phrony_metrics::WebhookOutcome::Delivered,
        ),
        Err(Failure::Permanent { error }) => (
            AttemptOutcome::GiveUp { error },
            phrony_metrics::WebhookOutcome::Failed,
        ),
        Err(Failure::Transient { error, .. }) if claim.attempt >= webhook.max_attempts => (
            AttemptOutcome::GiveUp { error },
            phrony_metrics::WebhookOutcome::Failed,
        ),
        Err(Failure::Transient { error, retry_after }) => (
            AttemptOutcome::Retry {
                error,
                after: retry_delay(webhook, claim.attempt, retry_after),
            },
            phrony_metrics::WebhookOutcome::Retried,
        ),
    };
    match &outcome {
        AttemptOutcome::Delivered => {
            tracing::debug!(webhook = %webhook.name, delivery = %claim.id, "webhook delivered");
        }
        AttemptOutcome::Retry { error, after } => tracing::info!(
            webhook = %webhook.name, delivery = %claim.id, attempt = claim.attempt,
            retry_in_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            "webhook delivery failed: {error}"
        ),
        AttemptOutcome::GiveUp { error } => tracing::warn!(
            webhook = %webhook.name, delivery = %claim.id, attempts = claim.attempt,
            "webhook delivery failed for good: {error}"
        ),
    }
    match ledger.finish_webhook_delivery(&claim, outcome).await {
        Ok(true) => phrony_metrics::WEBHOOK_DELIVERIES.inc(metric),
        Ok(false) => tracing::info!(
            webhook = %webhook.name, delivery = %claim.id,
            "webhook attempt outlived its lease; its outcome was not recorded"
        ),
        Err(e) => tracing::warn!(
            webhook = %webhook.name, delivery = %claim.id, error = %e,
            "cannot record a webhook attempt; it is sent again when its lease ends"
        ),
    }
}

/// The backoff before attempt `attempt + 1`: `initial · 2^(attempt-1)`, capped, with jitter
/// (a uniform draw in its upper half).
#[must_use]
pub fn backoff(webhook: &Webhook, attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let full = webhook
        .backoff_initial
        .saturating_mul(1u32 << exp)
        .min(webhook.backoff_max);
    let half = full / 2;
    let jitter = rand::random_range(0..=u64::try_from(half.as_millis()).unwrap_or(u64::MAX));
    half + Duration::from_millis(jitter)
}

/// The delay before the next attempt: the backoff, or as long as the receiver asked with
/// `Retry-After` when that is longer, never beyond `backoff_max`.
#[must_use]
pub fn retry_delay(webhook: &Webhook, attempt: u32, retry_after: Option<Duration>) -> Duration {
    let backoff = backoff(webhook, attempt);
    match retry_after {
        Some(asked) => backoff.max(asked.min(webhook.backoff_max)),
        None => backoff,
    }
}

/// Why an attempt failed, and whether another attempt may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// Timeouts, connection errors, 5xx, 408, 425, 429: tried again after the backoff (at least
    /// the receiver's `Retry-After` on 429 and 503).
    Transient {
        error: String,
        retry_after: Option<Duration>,
    },
    /// Any other answer: the receiver refused this delivery; it is `failed` at once.
    Permanent { error: String },
}

/// How an answer's status is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// 2xx.
    Delivered,
    /// 5xx, 408 (request timeout), 425 (too early), 429 (too many requests).
    Retry,
    /// Every other status (400, 401, 403, 404, 410, 413, 422, a 3xx redirect, …).
    Permanent,
}

/// The sender's rule for an HTTP status.
#[must_use]
pub fn classify(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Delivered,
        408 | 425 | 429 | 500..=599 => StatusClass::Retry,
        _ => StatusClass::Permanent,
    }
}

/// The longest `Retry-After` taken into account before the cap (a day).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A `Retry-After` value: delay-seconds or an HTTP date (RFC 9110), relative to `now`.
#[must_use]
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let at = DateTime::parse_from_rfc2822(value)
        .ok()?
        .with_timezone(&Utc);
    Some(
        (at - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// The most body bytes read from a refusing receiver.
const MAX_ERROR_BODY_BYTES: usize = 4096;
/// The longest body excerpt kept in a delivery's error, in characters.
pub const MAX_BODY_EXCERPT: usize = 200;

/// What is kept of a receiver's error body: at most [`MAX_BODY_EXCERPT`] characters, control
/// characters (newlines, escape sequences) as spaces, runs of whitespace as one.
#[must_use]
pub fn body_excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out = String::new();
    for word in cleaned.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    if out.chars().count() > MAX_BODY_EXCERPT {
        let mut cut: String = out.chars().take(MAX_BODY_EXCERPT - 1).collect();
        cut.push('…');
        return cut;
    }
    out
}

/// Reads at most [`MAX_ERROR_BODY_BYTES`] of a response body (a receiver cannot make the
/// sender read more).
async fn bounded_body(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_ERROR_BODY_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

async fn send(
    ledger: &Ledger,
    webhook: &Webhook,
    client: &reqwest::Client,
    claim: &ClaimedDelivery,
) -> Result<(), Failure> {
    let transient = |error: String| Failure::Transient {
        error,
        retry_after: None,
    };
    let notification = Notification::read(ledger, claim)
        .await
        .map_err(|e| transient(format!("cannot build the body: {e:#}")))?;
    let body = match webhook.format {
        Format::Json => notification.json_body(webhook.console_url.as_ref()),
        Format::Slack => notification.slack_body(webhook.console_url.as_ref()),
    };
    let body =
        serde_json::to_vec(&body).map_err(|e| transient(format!("cannot encode the body: {e}")))?;
    let timestamp = Utc::now().timestamp();
    let mut request = client
        .post(webhook.url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("Phrony-Webhook-Id", claim.id.to_string())
        .header("Phrony-Webhook-Timestamp", timestamp.to_string());
    if let Some(secret) = &webhook.secret {
        request = request.header(
            "Phrony-Webhook-Signature",
            signature(secret, timestamp, &body),
        );
    }
    let response = request
        .body(body)
        .send()
        .await
        .map_err(|e| transient(format!("request failed: {}", error_chain(&e))))?;
    let status = response.status();
    let class = classify(status.as_u16());
    if class == StatusClass::Delivered {
        return Ok(());
    }
    let retry_after = matches!(status.as_u16(), 429 | 503)
        .then(|| response.headers().get(reqwest::header::RETRY_AFTER))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, Utc::now()));
    let excerpt = body_excerpt(&bounded_body(response).await);
    let status_text = match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    };
    let status_text = if class == StatusClass::Permanent {
        format!("{status_text} (permanent, not retried)")
    } else {
        status_text
    };
    let error = if excerpt.is_empty() {
        status_text
    } else {
        format!("{status_text}: {excerpt}")
    };
    Err(match class {
        StatusClass::Permanent => Failure::Permanent { error },
        StatusClass::Retry | StatusClass::Delivered => Failure::Transient { error, retry_after },
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn env(var: &str) -> Option<String> {
        (var == "HOOK_SECRET").then(|| "0123456789abcdef0123".to_owned())
    }

    fn parse(text: &str) -> Result<WebhooksConfig, WebhooksFileError> {
        WebhooksConfig::parse("hooks.yaml", text, &env)
    }

    #[test]
    fn a_good_file_parses_with_defaults() {
        let config = parse(
            "webhooks:\n  - name: ops\n    url: https://hooks.example.com/phrony\n    events: [approval.required, session.failed]\n    secret_env: HOOK_SECRET\n  - name: slack\n    url: http://127.0.0.1:9/x\n    format: slack\n    events: [approval.required]\n    console_url: https://phrony.example.com\n    timeout: 2s\n    max_attempts: 3\n",
        )
        .unwrap();
        let ops = &config.webhooks[0];
        assert_eq!(ops.timeout, Duration::from_secs(10));
        assert_eq!(ops.max_attempts, 8);
        assert_eq!(ops.format, Format::Json);
        assert!(ops.secret.is_some());
        assert!(!format!("{ops:?}").contains("0123456789"), "{ops:?}");
        let slack = &config.webhooks[1];
        assert_eq!(slack.format, Format::Slack);
        assert_eq!(slack.max_attempts, 3);
        assert_eq!(
            config.routes()[1].kinds,
            vec![NotificationKind::ApprovalRequired]
        );
    }

    #[test]
    fn bad_files_are_refused_with_file_line_and_column() {
        let cases = [
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n    colour: blue\n",
                "hooks.yaml:6:5: webhooks[0]: unknown field `colour`",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.voted]\n    secret_env: HOOK_SECRET\n",
                "hooks.yaml:4:13: webhooks[0].events: unknown event \"approval.voted\"",
            ),
            (
                "webhooks:\n  - name: ops\n    url: http://hooks.example.com/x\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n",
                "hooks.yaml:3:10: webhook \"ops\": url: plain http is refused",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n",
                "hooks.yaml:2:5: webhook \"ops\": secret_env: required for format json",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: NOT_SET\n",
                "hooks.yaml:5:17: webhook \"ops\": secret_env: NOT_SET is not set",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n    timeout: soon\n",
                "hooks.yaml:6:14: webhook \"ops\": timeout: duration \"soon\"",
            ),
            // A bad duration is reported at its value, in whichever entry it is.
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n  - url: https://i.example\n    name: pager\n    backoff_max:   1 fortnight\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n",
                "hooks.yaml:8:20: webhook \"pager\": backoff_max: duration \"1 fortnight\"",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n    timeout: 90s\n",
                "hooks.yaml:6:14: webhook \"ops\": timeout: between 100ms and 60s",
            ),
            (
                "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n",
                "hooks.yaml:6:5: webhook \"ops\": a second webhook with this name",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(
                err.starts_with(want),
                "{err}\n  does not start with\n{want}"
            );
        }
        // Insecure HTTP to another host only when asked for explicitly.
        parse(
            "webhooks:\n  - name: ops\n    url: http://hooks.internal/x\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n    allow_insecure_http: true\n",
        )
        .unwrap();
    }

    #[test]
    fn the_signature_is_the_hmac_of_timestamp_dot_body() {
        // Computed independently (Python: hmac.new(b"secret", b"1700000000.{}", sha256)).
        assert_eq!(
            signature(b"secret", 1_700_000_000, b"{}"),
            "v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
        assert_ne!(
            signature(b"secret", 1_700_000_000, b"{}"),
            signature(b"secret", 1_700_000_001, b"{}")
        );
    }

    #[test]
    fn only_timeouts_rate_limits_and_server_errors_are_retried() {
        for status in [200, 201, 204, 299] {
            assert_eq!(classify(status), StatusClass::Delivered, "{status}");
        }
        for status in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify(status), StatusClass::Retry, "{status}");
        }
        for status in [
            301, 302, 400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 451,
        ] {
            assert_eq!(classify(status), StatusClass::Permanent, "{status}");
        }
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_the_cap_wins() {
        let now = DateTime::parse_from_rfc3339("2015-10-21T07:28:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past is now"
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("99999999999", now), Some(MAX_RETRY_AFTER));

        let config = parse(
            "webhooks:\n  - name: ops\n    url: https://h.example\n    events: [approval.required]\n    secret_env: HOOK_SECRET\n    backoff_initial: 1s\n    backoff_max: 30s\n",
        )
        .unwrap();
        let ops = &config.webhooks[0];
        // Attempt 1's backoff is 0.5–1 s: a longer Retry-After wins, up to the cap.
        let asked = retry_delay(ops, 1, Some(Duration::from_secs(20)));
        assert_eq!(asked, Duration::from_secs(20));
        let capped = retry_delay(ops, 1, Some(Duration::from_secs(3600)));
        assert_eq!(capped, Duration::from_secs(30));
        let shorter = retry_delay(ops, 1, Some(Duration::ZERO));
        assert!(
            shorter >= Duration::from_millis(500) && shorter <= Duration::from_secs(1),
            "{shorter:?}"
        );
    }

    #[test]
    fn error_bodies_are_cut_and_cleaned() {
        assert_eq!(
            body_excerpt(b"  no such\nhook \x1b[31mred\x1b[0m\r\n\t "),
            "no such hook [31mred [0m"
        );
        let long = "x".repeat(10_000);
        let cut = body_excerpt(long.as_bytes());
        assert_eq!(cut.chars().count(), MAX_BODY_EXCERPT);
        assert!(cut.ends_with('…'));
        assert_eq!(body_excerpt(&[0xff, b'o', b'k']), "\u{fffd}ok");
        assert_eq!(body_excerpt(b""), "");
    }
}
