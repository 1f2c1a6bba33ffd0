//! The routing part of the configuration: the `routing:` section and each tool's `upstream:`.
//!
//! ```yaml
//! routing:
//!   sidecar: {agents: [agent_refund_bot]}   # ANY /{tool}/{path}: the agents it serves (off without it)
//!   gateway: true                           # ANY /gw/{tool}/{path}: bearer key + signatures
//!   upstream_timeout_ms: 10000
//!   max_request_bytes: 1048576
//!   max_response_bytes: 4194304
//!   vault: {file: .state/vault.json, key_file: null}   # key: MOCK_GATE_VAULT_KEY
//!   ca_file: null              # PEM trust anchors for https:// upstreams, besides the system's
//!   allow_insecure_http: false # http:// upstreams on hosts other than loopback (credentials in clear)
//! tools:
//!   payments:
//!     actions: [refund.create]
//!     upstream:
//!       base_url: http://127.0.0.1:8010
//!       credential: {kind: static_header, header: X-Api-Key, secret: payments_api_key}
//!       operation_map:
//!         - {method: POST, path: /refunds, op: refund.create, amount_field: amount,
//!            reference_field: charge, response_id_field: id}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use axum::http::{HeaderName, Method, Uri};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use serde::Deserialize;

use crate::vault::VaultSettings;

/// The longest upstream timeout accepted (ms).
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// The largest request or response body bound accepted (bytes).
pub const MAX_BODY_BOUND: usize = 64 * 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RoutingFile {
    #[serde(default)]
    sidecar: Option<SidecarFile>,
    #[serde(default)]
    gateway: bool,
    #[serde(default)]
    upstream_timeout_ms: Option<u64>,
    #[serde(default)]
    max_request_bytes: Option<usize>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    #[serde(default)]
    vault: Option<VaultFileConfig>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    allow_insecure_http: bool,
}

impl RoutingFile {
    /// Whether a vault is configured (vaulted credentials need one).
    pub(crate) fn has_vault(&self) -> bool {
        self.vault.is_some()
    }

    /// Whether `http://` upstreams on other hosts than loopback are allowed.
    pub(crate) fn allows_insecure_http(&self) -> bool {
        self.allow_insecure_http
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SidecarFile {
    agents: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFileConfig {
    file: PathBuf,
    #[serde(default)]
    key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpstreamFile {
    base_url: String,
    #[serde(default)]
    credential: Option<CredentialFile>,
    operation_map: Vec<OperationFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
enum CredentialFile {
    StaticHeader {
        header: String,
        secret: String,
    },
    Bearer {
        secret: String,
    },
    Oauth2 {
        token_url: String,
        client_id: String,
        secret: String,
        #[serde(default)]
        scope: Option<String>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationFile {
    method: String,
    path: String,
    op: String,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    amount_field: Option<String>,
    #[serde(default)]
    currency_field: Option<String>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    reference_field: Option<String>,
    #[serde(default)]
    reference_amount_field: Option<String>,
    #[serde(default)]
    resource_field: Option<String>,
    #[serde(default)]
    response_id_field: Option<String>,
}

/// The routing routes' settings.
#[derive(Debug, Clone)]
pub struct RoutingSettings {
    /// The agents the sidecar routes serve; `None`: the sidecar routes are off.
    pub sidecar_agents: Option<BTreeSet<String>>,
    /// Whether the gateway routes are on.
    pub gateway: bool,
    /// The bound on one upstream exchange (connect, send, read the whole response).
    pub upstream_timeout: Duration,
    /// The largest request body accepted from the agent.
    pub max_request_bytes: usize,
    /// The largest provider response read.
    pub max_response_bytes: usize,
    /// The sealed credentials.
    pub vault: Option<VaultSettings>,
    /// Trust anchors for `https://` upstreams besides the system's (`routing.ca_file`).
    pub ca_certs: Vec<CertificateDer<'static>>,
    /// `http://` upstreams on non-loopback hosts were allowed (`routing.allow_insecure_http`).
    pub allow_insecure_http: bool,
}

/// Where a tool's calls go and how they are authorised upstream.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// `https://host[:port][/prefix]` (or `http://` on loopback), without a trailing `/`.
    pub base_url: String,
    /// The vaulted credential injected on every forwarded call.
    pub credential: Option<Credential>,
    /// Request → operation.
    pub operations: Vec<Operation>,
}

/// A vaulted credential: only vault entry names, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// `<header>: <secret>`.
    StaticHeader {
        /// The header.
        header: HeaderName,
        /// The vault entry.
        secret: String,
    },
    /// `Authorization: Bearer <secret>`.
    Bearer {
        /// The vault entry.
        secret: String,
    },
    /// OAuth2 client credentials: a token from `token_url`, cached until it expires.
    OAuth2 {
        /// The token endpoint (`http://`).
        token_url: String,
        /// The client id.
        client_id: String,
        /// The vault entry holding the client secret.
        secret: String,
        /// The scope asked for.
        scope: Option<String>,
    },
}

impl Credential {
    /// The vault entry it needs.
    #[must_use]
    pub fn secret_name(&self) -> &str {
        match self {
            Self::StaticHeader { secret, .. }
            | Self::Bearer { secret }
            | Self::OAuth2 { secret, .. } => secret,
        }
    }
}

/// One `operation_map` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The HTTP method.
    pub method: Method,
    /// The path segments; `{name}` matches any one segment.
    pub segments: Vec<String>,
    /// The path as written.
    pub path: String,
    /// `context.op`.
    pub op: String,
    /// The catalog action decided (defaults to `op`).
    pub action: String,
    /// Body field (dotted) holding the amount.
    pub amount_field: Option<String>,
    /// Body field holding the currency.
    pub currency_field: Option<String>,
    /// The currency when the body names none.
    pub currency: Option<String>,
    /// Body field holding the reference (e.g. the charge id).
    pub reference_field: Option<String>,
    /// Body field holding the reference's original amount.
    pub reference_amount_field: Option<String>,
    /// Body field holding the resource.
    pub resource_field: Option<String>,
    /// Provider response field holding its id (the `downstream_ref` of the completion).
    pub response_id_field: Option<String>,
}

impl Operation {
    /// Whether `method` and `path` (without the leading `/`) are this operation.
    #[must_use]
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if *method != self.method {
            return false;
        }
        let given: Vec<&str> = path.trim_matches('/').split('/').collect();
        given.len() == self.segments.len()
            && self.segments.iter().zip(&given).all(|(want, got)| {
                (want.starts_with('{') && want.ends_with('}') && !got.is_empty()) || want == got
            })
    }
}

impl Upstream {
    /// The operation of a request, if mapped.
    #[must_use]
    pub fn operation(&self, method: &Method, path: &str) -> Option<&Operation> {
        self.operations.iter().find(|o| o.matches(method, path))
    }
}

/// A field error: the dotted field under the tool or `routing`, and the message.
pub(crate) type FieldError = (String, String);

fn field_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

/// Whether `host` (a URI authority's host) is a loopback address or `localhost`.
fn loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// An upstream URL without query, checked; returned without a trailing `/`. `https://` always;
/// `http://` only to a loopback host unless `insecure_http` (the credential would cross the
/// network in clear).
fn upstream_url(text: &str, insecure_http: bool) -> Result<String, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("`{text}` is not a URL: {e}"))?;
    let Some(authority) = uri.authority() else {
        return Err(format!(
            "`{text}` must be an https://host[:port][/path] URL"
        ));
    };
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if insecure_http || loopback(authority.host()) => {}
        Some("http") => {
            return Err(format!(
                "`{text}` would send the vaulted credential in clear to a host that is not \
                 loopback: use https://, or set `routing.allow_insecure_http: true`"
            ));
        }
        _ => {
            return Err(format!(
                "`{text}` must be an https://host[:port][/path] URL"
            ));
        }
    }
    if uri.query().is_some() {
        return Err(format!("`{text}` must not have a query"));
    }
    Ok(text.trim_end_matches('/').to_owned())
}

/// The certificates of a PEM file (at least one).
fn ca_certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// Compiles a tool's `upstream:`; `actions` are the tool's catalog actions.
pub(crate) fn compile_upstream(
    file: &UpstreamFile,
    actions: &BTreeSet<String>,
    has_vault: bool,
    insecure_http: bool,
) -> Result<Upstream, FieldError> {
    let base_url =
        upstream_url(&file.base_url, insecure_http).map_err(|m| ("base_url".to_owned(), m))?;
    let credential = match &file.credential {
        None => None,
        Some(c) => {
            let secret_ok = |s: &str| {
                if s.is_empty() || s.len() > 128 {
                    Err((
                        "credential.secret".to_owned(),
                        "names a vault entry (1 to 128 characters), never the value".to_owned(),
                    ))
                } else {
                    Ok(s.to_owned())
                }
            };
            let credential = match c {
                CredentialFile::StaticHeader { header, secret } => {
                    let header = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                        (
                            "credential.header".to_owned(),
                            format!("`{header}` is not a header name"),
                        )
                    })?;
                    Credential::StaticHeader {
                        header,
                        secret: secret_ok(secret)?,
                    }
                }
                CredentialFile::Bearer { secret } => Credential::Bearer {
                    secret: secret_ok(secret)?,
                },
                CredentialFile::Oauth2 {
                    token_url,
                    client_id,
                    secret,
                    scope,
                } => {
                    let token_url = upstream_url(token_url, insecure_http)
                        .map_err(|m| ("credential.token_url".to_owned(), m))?;
                    if client_id.is_empty()
                        || client_id.len() > 256
                        || client_id.contains(':')
                        || !client_id.bytes().all(|b| b.is_ascii_graphic())
                    {
                        return Err((
                            "credential.client_id".to_owned(),
                            "1 to 256 visible ASCII characters, no `:`".to_owned(),
                        ));
                    }
                    if let Some(s) = scope
                        && !s
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b" :._-/".contains(&b))
                    {
                        return Err((
                            "credential.scope".to_owned(),
                            "letters, digits, spaces and `:._-/` only".to_owned(),
                        ));
                    }
                    Credential::OAuth2 {
                        token_url,
                        client_id: client_id.clone(),
                        secret: secret_ok(secret)?,
                        scope: scope.clone(),
                    }
                }
            };
            if !has_vault {
                return Err((
                    "credential".to_owned(),
                    "a vaulted credential needs `routing.vault` (the sealed file and its key)"
                        .to_owned(),
                ));
            }
            Some(credential)
        }
    };
    if file.operation_map.is_empty() {
        return Err((
            "operation_map".to_owned(),
            "maps no operation: every call would be refused".to_owned(),
        ));
    }
    let mut operations = Vec::new();
    for (i, o) in file.operation_map.iter().enumerate() {
        let at = |f: &str| format!("operation_map[{i}].{f}");
        let method = Method::from_bytes(o.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| (at("method"), format!("`{}` is not a method", o.method)))?;
        if !o.path.starts_with('/') || o.path.contains('?') {
            return Err((at("path"), "starts with `/` and has no query".to_owned()));
        }
        let action = o.action.clone().unwrap_or_else(|| o.op.clone());
        if !actions.contains(&action) {
            return Err((
                at("action"),
                format!("`{action}` is not one of the tool's actions"),
            ));
        }
        for (name, value) in [
            ("amount_field", &o.amount_field),
            ("currency_field", &o.currency_field),
            ("reference_field", &o.reference_field),
            ("reference_amount_field", &o.reference_amount_field),
            ("resource_field", &o.resource_field),
            ("response_id_field", &o.response_id_field),
        ] {
            if let Some(v) = value
                && !field_name(v)
            {
                return Err((at(name), format!("`{v}` is not a dotted field name")));
            }
        }
        if let Some(c) = &o.currency
            && (c.len() != 3 || !c.bytes().all(|b| b.is_ascii_alphabetic()))
        {
            return Err((at("currency"), format!("`{c}` is not an ISO 4217 code")));
        }
        operations.push(Operation {
            method,
            segments: o
                .path
                .trim_matches('/')
                .split('/')
                .map(str::to_owned)
                .collect(),
            path: o.path.clone(),
            op: o.op.clone(),
            action,
            amount_field: o.amount_field.clone(),
            currency_field: o.currency_field.clone(),
            currency: o.currency.as_ref().map(|c| c.to_ascii_uppercase()),
            reference_field: o.reference_field.clone(),
            reference_amount_field: o.reference_amount_field.clone(),
            resource_field: o.resource_field.clone(),
            response_id_field: o.response_id_field.clone(),
        });
    }
    Ok(Upstream {
        base_url,
        credential,
        operations,
    })
}

/// Compiles `routing:`; `resolve` anchors relative paths, `agents` are the configured agents.
pub(crate) fn compile_routing(
    file: &RoutingFile,
    resolve: impl Fn(&std::path::Path) -> PathBuf,
    agents: &BTreeMap<String, crate::config::AgentSettings>,
) -> Result<RoutingSettings, FieldError> {
    let sidecar_agents = match &file.sidecar {
        None => None,
        Some(s) => {
            if s.agents.is_empty() {
                return Err((
                    "sidecar.agents".to_owned(),
                    "lists no agent (omit `sidecar` to turn the sidecar routes off)".to_owned(),
                ));
            }
            for a in &s.agents {
                if !agents.contains_key(a) {
                    return Err(("sidecar.agents".to_owned(), format!("unknown agent `{a}`")));
                }
            }
            Some(s.agents.iter().cloned().collect())
        }
    };
    let timeout = file.upstream_timeout_ms.unwrap_or(10_000);
    if timeout == 0 || timeout > MAX_TIMEOUT_MS {
        return Err((
            "upstream_timeout_ms".to_owned(),
            format!("must be 1 to {MAX_TIMEOUT_MS}, got {timeout}"),
        ));
    }
    let bound = |name: &str, v: Option<usize>, default: usize| {
        let v = v.unwrap_or(default);
        if v == 0 || v > MAX_BODY_BOUND {
            Err((
                name.to_owned(),
                format!("must be 1 to {MAX_BODY_BOUND} bytes, got {v}"),
            ))
        } else {
            Ok(v)
        }
    };
    Ok(RoutingSettings {
        sidecar_agents,
        gateway: file.gateway,
        upstream_timeout: Duration::from_millis(timeout),
        max_request_bytes: bound("max_request_bytes", file.max_request_bytes, 1024 * 1024)?,
        max_response_bytes: bound(
            "max_response_bytes",
            file.max_response_bytes,
            4 * 1024 * 1024,
        )?,
        vault: file.vault.as_ref().map(|v| VaultSettings {
            file: resolve(&v.file),
            key_file: v.key_file.as_deref().map(&resolve),
            key: None,
        }),
        ca_certs: match &file.ca_file {
            Some(path) => ca_certs(&resolve(path)).map_err(|m| ("ca_file".to_owned(), m))?,
            None => Vec::new(),
        },
        allow_insecure_http: file.allow_insecure_http,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(path: &str) -> Operation {
        Operation {
            method: Method::POST,
            segments: path
                .trim_matches('/')
                .split('/')
                .map(str::to_owned)
                .collect(),
            path: path.to_owned(),
            op: "refund.create".into(),
            action: "refund.create".into(),
            amount_field: None,
            currency_field: None,
            currency: None,
            reference_field: None,
            reference_amount_field: None,
            resource_field: None,
            response_id_field: None,
        }
    }

    #[test]
    fn operations_match_method_exact_segments_and_placeholders() {
        let o = op("/refunds");
        assert!(o.matches(&Method::POST, "refunds"));
        assert!(o.matches(&Method::POST, "refunds/"));
        assert!(!o.matches(&Method::GET, "refunds"));
        assert!(!o.matches(&Method::POST, "refunds/re_1"));
        let o = op("/charges/{id}/refund");
        assert!(o.matches(&Method::POST, "charges/ch_1/refund"));
        assert!(!o.matches(&Method::POST, "charges//refund"));
        assert!(!o.matches(&Method::POST, "charges/ch_1"));
    }

    #[test]
    fn upstreams_are_https_or_loopback_http_and_credentials_need_a_vault() {
        assert_eq!(
            upstream_url("https://api.example/v1/", false).unwrap(),
            "https://api.example/v1"
        );
        for local in [
            "http://127.0.0.1:1/v1/",
            "http://localhost:8010",
            "http://[::1]:8010",
        ] {
            assert!(upstream_url(local, false).is_ok(), "{local}");
        }
        // The credential would cross the network in clear: only when chosen explicitly.
        let err = upstream_url("http://payments.internal:8010", false).unwrap_err();
        assert!(err.contains("allow_insecure_http"), "{err}");
        assert!(upstream_url("http://payments.internal:8010", true).is_ok());
        for bad in ["http://127.0.0.1:1/x?y=1", "ftp://127.0.0.1/x", "/refunds"] {
            assert!(upstream_url(bad, true).is_err(), "{bad}");
        }
        assert_eq!(
            upstream_url("http://127.0.0.1:1/v1/", false).unwrap(),
            "http://127.0.0.1:1/v1"
        );
        let file: UpstreamFile = serde_yaml::from_str(
            "base_url: http://127.0.0.1:1\ncredential: {kind: bearer, secret: k}\n\
             operation_map: [{method: POST, path: /refunds, op: refund.create}]",
        )
        .unwrap();
        let actions: BTreeSet<String> = ["refund.create".to_owned()].into();
        let err = compile_upstream(&file, &actions, false, false).unwrap_err();
        assert_eq!(err.0, "credential");
        assert!(compile_upstream(&file, &actions, true, false).is_ok());
        let other: BTreeSet<String> = ["refund.read".to_owned()].into();
        let err = compile_upstream(&file, &other, true, false).unwrap_err();
        assert_eq!(err.0, "operation_map[0].action");
    }
}
