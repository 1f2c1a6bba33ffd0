//! TLS on the gRPC listener (`RUNTIME_TLS_CERT`, `RUNTIME_TLS_KEY`), optional mutual TLS
//! (`RUNTIME_TLS_CLIENT_CA`), and the mapping of client-certificate subjects to roles
//! (`RUNTIME_TLS_CLIENT_ROLES`) behind [`MtlsAuthenticator`].
//!
//! - The certificate chain and key are PEM files, checked at start-up: a missing, unreadable or
//!   malformed file stops the daemon with one line naming the file.
//! - With `RUNTIME_TLS_CLIENT_CA` set, every connection must present a client certificate
//!   signed by one of the CA file's certificates (the handshake fails otherwise).
//! - The mTLS principal is the certificate subject's **common name (CN)**
//!   (`phrony_grpc::peer_subject`); the roles file maps each CN to roles, routes and tools:
//!
//! ```yaml
//! clients:
//!   refund-worker:
//!     roles: [worker]
//!     tools: ["payments.issue-refund@1.*"]
//!   approvals-ui:
//!     roles: [approver, relay]
//!     routes: [finance]
//! ```
//!
//! A subject not in the file is `UNAUTHENTICATED` naming the subject. The file is read with the
//! bounded, alias-free YAML reader of `phrony-manifest`; unknown fields and unknown role names
//! are start-up errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use phrony_auth::{
    AuthError, AuthFuture, Authenticator, Credentials, Principal, Role, ToolPattern, Verification,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::Settings;

/// The validated TLS settings of the listener.
#[derive(Debug, Clone)]
pub(crate) struct Tls {
    /// The rustls configuration tonic serves with.
    pub(crate) server: ServerTlsConfig,
    /// Whether client certificates are required (mutual TLS).
    pub(crate) mutual: bool,
    /// The subject → principal mapping, when `RUNTIME_TLS_CLIENT_ROLES` is set.
    pub(crate) clients: Option<Arc<MtlsAuthenticator>>,
}

impl Settings {
    /// Reads and checks the TLS files. `None` when `RUNTIME_TLS_CERT` and `RUNTIME_TLS_KEY`
    /// are both unset.
    ///
    /// # Errors
    /// One line naming the variable and the file: one of cert/key without the other, a client
    /// CA or roles file without TLS, a missing, unreadable or malformed PEM or YAML file.
    pub(crate) fn tls(&self) -> anyhow::Result<Option<Tls>> {
        let set = |v: &Option<std::ffi::OsString>| v.clone().filter(|p| !p.is_empty());
        let (cert, key) = match (set(&self.tls_cert), set(&self.tls_key)) {
            (None, None) => {
                if set(&self.tls_client_ca).is_some() {
                    anyhow::bail!(
                        "RUNTIME_TLS_CLIENT_CA needs RUNTIME_TLS_CERT and RUNTIME_TLS_KEY"
                    );
                }
                if set(&self.tls_client_roles).is_some() {
                    anyhow::bail!(
                        "RUNTIME_TLS_CLIENT_ROLES needs RUNTIME_TLS_CERT, RUNTIME_TLS_KEY and \
                         RUNTIME_TLS_CLIENT_CA"
                    );
                }
                return Ok(None);
            }
            (Some(_), None) => anyhow::bail!("RUNTIME_TLS_CERT is set but RUNTIME_TLS_KEY is not"),
            (None, Some(_)) => anyhow::bail!("RUNTIME_TLS_KEY is set but RUNTIME_TLS_CERT is not"),
            (Some(c), Some(k)) => (PathBuf::from(c), PathBuf::from(k)),
        };
        let client_ca = set(&self.tls_client_ca).map(PathBuf::from);
        let roles = set(&self.tls_client_roles).map(PathBuf::from);
        server_tls(&cert, &key, client_ca.as_deref(), roles.as_deref()).map(Some)
    }
}

/// Builds the listener's TLS settings from the files (what [`Settings::tls`] does once the
/// variables are read).
///
/// # Errors
/// One line naming the variable and the file that is wrong.
pub(crate) fn server_tls(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    client_roles: Option<&Path>,
) -> anyhow::Result<Tls> {
    let cert_pem = read_certificates("RUNTIME_TLS_CERT", cert)?;
    let key_pem = read("RUNTIME_TLS_KEY", key)?;
    PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        anyhow::anyhow!(
            "RUNTIME_TLS_KEY {}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let mut server = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
    let mut mutual = false;
    if let Some(ca) = client_ca {
        let ca_pem = read_certificates("RUNTIME_TLS_CLIENT_CA", ca)?;
        server = server.client_ca_root(Certificate::from_pem(ca_pem));
        mutual = true;
    }
    let clients = match client_roles {
        None => None,
        Some(path) => {
            if !mutual {
                anyhow::bail!(
                    "RUNTIME_TLS_CLIENT_ROLES {} needs RUNTIME_TLS_CLIENT_CA (client certificates)",
                    path.display()
                );
            }
            Some(Arc::new(MtlsAuthenticator::load(path)?))
        }
    };
    // Build the rustls acceptor once now, so a key that does not match the certificate is a
    // start-up error naming the files rather than a failure at the first connection.
    tonic::transport::Server::builder()
        .tls_config(server.clone())
        .map_err(|e| {
            anyhow::anyhow!(
                "RUNTIME_TLS_CERT {} / RUNTIME_TLS_KEY {}: cannot be used together: {e}",
                cert.display(),
                key.display()
            )
        })?;
    Ok(Tls {
        server,
        mutual,
        clients,
    })
}

/// Reads a file, naming the variable and the file on failure.
fn read(var: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    const MAX_PEM_BYTES: u64 = 1 << 20;
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("{var} {}: cannot read: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow::anyhow!("{var} {}: cannot read: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        anyhow::bail!("{var} {}: larger than 1 MiB", path.display());
    }
    Ok(bytes)
}

/// Reads a PEM file that must hold at least one certificate, each parseable.
fn read_certificates(var: &str, path: &Path) -> anyhow::Result<Vec<u8>> {
    let pem = read(var, path)?;
    let mut count = 0usize;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| anyhow::anyhow!("{var} {}: bad PEM certificate: {e}", path.display()))?;
        count += 1;
    }
    if count == 0 {
        anyhow::bail!(
            "{var} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
            path.display()
        );
    }
    Ok(pem)
}

/// One entry of the client roles file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    routes: Vec<String>,
    #[serde(default)]
    tools: Vec<String>,
}

/// The client roles file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsFile {
    clients: BTreeMap<String, ClientEntry>,
}

/// Authenticates mutual-TLS clients: the verified certificate's subject (its CN) mapped to a
/// principal by the `RUNTIME_TLS_CLIENT_ROLES` file.
#[derive(Debug, Clone)]
pub struct MtlsAuthenticator {
    clients: BTreeMap<String, Principal>,
}

impl MtlsAuthenticator {
    /// Reads the roles file.
    ///
    /// # Errors
    /// One line naming the file: unreadable, too large, not YAML, an alias, an unknown field,
    /// an unknown role or an unusable tool pattern.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = phrony_manifest::read_yaml_file(path)
            .map_err(|e| anyhow::anyhow!("RUNTIME_TLS_CLIENT_ROLES {}: {e}", path.display()))?;
        Self::parse(&text)
            .with_context(|| format!("RUNTIME_TLS_CLIENT_ROLES {}", path.display()))
            .map_err(|e| anyhow::anyhow!("{e:#}"))
    }

    /// Parses the roles file's text (already bounded and alias-checked).
    ///
    /// # Errors
    /// An unknown field, an unknown role or an unusable tool pattern, naming the subject.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let file: ClientsFile = serde_yaml::from_str(text).context("invalid roles file")?;
        let mut clients = BTreeMap::new();
        for (subject, entry) in file.clients {
            if subject.trim().is_empty() {
                anyhow::bail!("an empty subject");
            }
            let roles = entry
                .roles
                .iter()
                .map(|r| r.parse::<Role>())
                .collect::<Result<BTreeSet<_>, _>>()
                .with_context(|| format!("subject {subject:?}"))?;
            let tools = entry
                .tools
                .iter()
                .map(|t| ToolPattern::parse(t))
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("subject {subject:?}"))?;
            clients.insert(
                subject.clone(),
                Principal {
                    name: subject,
                    verification: Verification::Mtls,
                    roles,
                    routes: entry.routes,
                    tools,
                },
            );
        }
        Ok(Self { clients })
    }

    /// How many subjects the file maps.
    #[must_use]
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether the file maps no subject.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// The principal of a verified certificate subject.
    ///
    /// # Errors
    /// [`AuthError::Missing`] without a subject; [`AuthError::Rejected`] naming a subject the
    /// file does not list.
    pub fn principal(&self, subject: Option<&str>) -> Result<Principal, AuthError> {
        let subject = subject.ok_or(AuthError::Missing)?;
        self.clients
            .get(subject)
            .cloned()
            .ok_or_else(|| AuthError::Rejected {
                reason: format!(
                    "client certificate subject {subject:?} is not in RUNTIME_TLS_CLIENT_ROLES"
                ),
            })
    }
}

impl Authenticator for MtlsAuthenticator {
    fn authenticate<'a>(&'a self, credentials: Credentials<'a>) -> AuthFuture<'a> {
        let result = self.principal(credentials.peer_subject);
        Box::pin(async move { result })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use phrony_auth::Permission;

    const ROLES: &str = r#"
clients:
  refund-worker:
    roles: [worker]
    tools: ["payments.issue-refund@1.*"]
  approvals-ui:
    roles: [approver, relay]
    routes: [finance]
"#;

    #[tokio::test]
    async fn subjects_map_to_principals_and_unknown_ones_are_named() {
        let auth = MtlsAuthenticator::parse(ROLES).unwrap();
        assert_eq!(auth.len(), 2);
        let creds = |s| Credentials {
            bearer: None,
            peer_subject: Some(s),
        };
        let w = auth.authenticate(creds("refund-worker")).await.unwrap();
        assert_eq!(w.verification, Verification::Mtls);
        assert!(w.may_serve("payments.issue-refund", "1.4.0"));
        assert!(!w.may_serve("payments.issue-refund", "2.0.0"));
        assert!(!w.permits(Permission::Approve));
        let ui = auth.authenticate(creds("approvals-ui")).await.unwrap();
        assert!(ui.may_approve_route(Some("finance")));
        assert!(!ui.may_approve_route(Some("legal")));
        let err = auth.authenticate(creds("mallory")).await.unwrap_err();
        assert!(err.to_string().contains("\"mallory\""), "{err}");
        assert_eq!(
            auth.authenticate(Credentials::default()).await.unwrap_err(),
            AuthError::Missing
        );
    }

    #[test]
    fn a_bad_roles_file_is_refused_naming_what_is_wrong() {
        let err = MtlsAuthenticator::parse("clients:\n  a:\n    roles: [root]\n").unwrap_err();
        let shown = format!("{err:#}");
        assert!(shown.contains("\"a\"") && shown.contains("root"), "{shown}");
        let err = MtlsAuthenticator::parse("clients:\n  a:\n    role: [admin]\n").unwrap_err();
        assert!(format!("{err:#}").contains("role"), "{err:#}");
        let err = MtlsAuthenticator::parse("clients:\n  a:\n    tools: [\"a b\"]\n").unwrap_err();
        assert!(format!("{err:#}").contains("whitespace"), "{err:#}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roles.yaml");
        std::fs::write(&path, "base: &b [admin]\nclients:\n  a:\n    roles: *b\n").unwrap();
        let err = MtlsAuthenticator::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("RUNTIME_TLS_CLIENT_ROLES") && err.contains("roles.yaml"),
            "{err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
    }

    #[test]
    fn bad_tls_files_are_one_line_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
        std::fs::write(&junk, "hello").unwrap();
        assert!(server_tls(&cert, &key, None, None).is_ok());
        let missing = dir.path().join("missing.pem");
        for (c, k, ca, var, file) in [
            (&missing, &key, None, "RUNTIME_TLS_CERT", "missing.pem"),
            (&junk, &key, None, "RUNTIME_TLS_CERT", "junk.pem"),
            (&cert, &junk, None, "RUNTIME_TLS_KEY", "junk.pem"),
            (&cert, &cert, None, "RUNTIME_TLS_KEY", "cert.pem"),
            (
                &cert,
                &key,
                Some(junk.as_path()),
                "RUNTIME_TLS_CLIENT_CA",
                "junk.pem",
            ),
        ] {
            let err = server_tls(c, k, ca, None).unwrap_err().to_string();
            assert!(err.starts_with(var) && err.contains(file), "{err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        // A key that is not the certificate's.
        let other = rcgen::KeyPair::generate().unwrap();
        let other_key = dir.path().join("other.pem");
        std::fs::write(&other_key, other.serialize_pem()).unwrap();
        let err = server_tls(&cert, &other_key, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cert.pem") && err.contains("other.pem"),
            "{err}"
        );
    }
}
