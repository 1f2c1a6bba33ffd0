//! Talking to the runtime: connecting (with the version-skew check), naming the actor of
//! changes, and rendering failed calls as `<action>: <server message> (<CodeName>)`.

use std::future::Future;
use std::io::{self, Write as _};

use anyhow::{Context as _, anyhow};
use phrony_client::{Client, ClientError, Code, RuntimeVersion};

use crate::cmd::Global;
use crate::exit::{AccessRefused, Hinted, Unsure};

/// The CLI's release version, compared with the runtime's.
pub(crate) const CLI_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What to do when nothing answers at the runtime address.
const START_HINT: &str =
    "start it with: phrony-runtime  (or set --runtime-addr / PHRONY_RUNTIME_ADDR)";

/// Runs a command's async body on a single-threaded runtime.
pub(crate) fn block_on<T>(body: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(body)
}

/// Connects to the runtime named by `--runtime-addr` / `PHRONY_RUNTIME_ADDR`, asks its version
/// and warns on stderr when it differs from the CLI's.
///
/// When the connection fails and the runtime turns out to speak the other transport (TLS
/// while the CLI has no CA, or plaintext while it has one), the error says what to set instead
/// of a generic connection failure ([`transport_mismatch`]).
pub(crate) async fn connect(global: &Global) -> anyhow::Result<(Client, RuntimeVersion)> {
    let client = match open(global).await {
        Ok(client) => client,
        Err(e) => return Err(diagnosed(global, e, |e| failure("connect", e)).await),
    };
    let version = match client.get_version().await {
        Ok(version) => version,
        Err(e) => {
            let addr = client.addr().to_owned();
            return Err(diagnosed(global, e, |e| version_failure(&addr, e)).await);
        }
    };
    warn_if_skewed(&version.version, client.addr())?;
    Ok((client, version))
}

/// A failed connection (`error`) as [`transport_mismatch`] explains it, else as `otherwise`
/// renders it.
pub(crate) async fn diagnosed(
    global: &Global,
    error: ClientError,
    otherwise: impl FnOnce(ClientError) -> anyhow::Error,
) -> anyhow::Error {
    let tls = global
        .tls_ca
        .as_ref()
        .is_some_and(|p| !p.as_os_str().is_empty());
    let addr = match &error {
        ClientError::Unreachable { addr, reason } if reason != "connection refused" => addr,
        ClientError::ConnectionLost { addr, .. } => addr,
        _ => return otherwise(error),
    };
    match transport_mismatch(addr, tls).await {
        Some(explained) => explained,
        None => otherwise(error),
    }
}

/// What the server at `addr` speaks, as far as one probe can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// It answered the HTTP/2 preface with a TLS record (an alert or a handshake).
    Tls,
    /// It answered the HTTP/2 preface with an HTTP/2 SETTINGS frame.
    PlainHttp2,
}

/// How long the probe of a failed connection may take, in all.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Probes `addr` after a failed connection: sends the HTTP/2 client preface and an empty
/// SETTINGS frame in plaintext and reads the first bytes of the answer. A TLS listener answers
/// with a TLS record (`0x15 0x03 …` alert, or a handshake), a plaintext HTTP/2 server with a
/// SETTINGS frame (type `0x04` in the fourth byte). `None`: no connection, no answer in time,
/// or anything else.
async fn probe(addr: &str) -> Option<Transport> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend_from_slice(&[0, 0, 0, 0x04, 0, 0, 0, 0, 0]);
        stream.write_all(&hello).await.ok()?;
        let mut answer = [0u8; 9];
        let mut read = 0;
        while read < 4 {
            match stream.read(&mut answer[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        let answer = &answer[..read];
        match answer {
            [0x15 | 0x16, 0x03, ..] => Some(Transport::Tls),
            [_, _, _, 0x04, ..] => Some(Transport::PlainHttp2),
            _ => None,
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

/// The error for a CLI and a runtime that disagree about TLS (`tls`: the CLI connected with
/// TLS), naming what to set; `None` when the probe finds no disagreement.
async fn transport_mismatch(addr: &str, tls: bool) -> Option<anyhow::Error> {
    match (probe(addr).await?, tls) {
        (Transport::Tls, false) => Some(anyhow!(
            "the runtime at {addr} speaks TLS; pass --tls-ca (or set PHRONY_TLS_CA) to the CA \
             that signed its certificate"
        )),
        (Transport::PlainHttp2, true) => Some(anyhow!(
            "the runtime at {addr} does not speak TLS (it answered in plaintext); unset \
             PHRONY_TLS_CA / --tls-ca, or serve TLS (RUNTIME_TLS_CERT, RUNTIME_TLS_KEY)"
        )),
        _ => None,
    }
}

/// Opens the connection `--runtime-addr` names: over TLS when `--tls-ca` / `PHRONY_TLS_CA` is
/// set (with a client certificate when `--tls-cert`/`--tls-key` are), else plaintext; sending
/// `--token` / `PHRONY_TOKEN` on every call when set.
pub(crate) async fn open(global: &Global) -> Result<Client, ClientError> {
    let token = global.token.as_deref().filter(|t| !t.trim().is_empty());
    let empty = |p: &Option<std::path::PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
    let (ca, cert, key) = (
        empty(&global.tls_ca),
        empty(&global.tls_cert),
        empty(&global.tls_key),
    );
    match ca {
        Some(ca) => {
            let tls = phrony_client::ClientTls::from_files(&ca, cert.as_deref(), key.as_deref())?;
            Client::connect_with(&global.runtime_addr, Some(&tls), token).await
        }
        None if cert.is_some() || key.is_some() => Err(ClientError::Tls {
            reason: "a client certificate (PHRONY_TLS_CERT / PHRONY_TLS_KEY) needs the runtime's \
                     CA (PHRONY_TLS_CA / --tls-ca)"
                .to_owned(),
        }),
        None => Client::connect_with_token(&global.runtime_addr, token).await,
    }
}

/// The error of a failed `GetVersion`, the first call of every command.
pub(crate) fn version_failure(addr: &str, error: ClientError) -> anyhow::Error {
    match error {
        // Every phrony runtime has GetVersion: something else listens there.
        ClientError::Rpc {
            code: Code::Unimplemented,
            message,
        } => Hinted::new(
            format!("the server at {addr} does not answer as a phrony runtime ({message})"),
            "check --runtime-addr / PHRONY_RUNTIME_ADDR",
        )
        .into(),
        other => failure("version", other),
    }
}

/// Warns on stderr (four lines) when the runtime's release differs from the CLI's.
pub(crate) fn warn_if_skewed(runtime_version: &str, addr: &str) -> io::Result<()> {
    if same_release(CLI_VERSION, runtime_version) {
        return Ok(());
    }
    warn_skew(runtime_version, addr)
}

/// The error a command reports when a call fails: the actionable hint for an unreachable
/// runtime, else `<action>: <server message> (<CodeName>)`.
pub(crate) fn failure(action: &str, error: ClientError) -> anyhow::Error {
    match error {
        ClientError::Unreachable { .. } => Hinted::new(error.to_string(), START_HINT).into(),
        ClientError::Rpc {
            code: Code::Unimplemented,
            message,
        } => anyhow!("{action}: {message} (not implemented on this runtime yet)"),
        ClientError::InvalidAddress { .. }
        | ClientError::InvalidToken { .. }
        | ClientError::Tls { .. } => anyhow!(error),
        ClientError::Rpc {
            code: Code::Unauthenticated,
            message,
        } => {
            let hint = unauthenticated_hint(&message);
            AccessRefused::new(format!("{action}: not authenticated: {message} ({hint})")).into()
        }
        ClientError::Rpc {
            code: Code::PermissionDenied,
            message,
        } => AccessRefused::new(format!("{action}: permission denied: {message}")).into(),
        other => anyhow!(other).context(action.to_owned()),
    }
}

/// What to change after an `UNAUTHENTICATED` refusal: the client-certificate options when the
/// runtime refused the mutual-TLS certificate (its refusals name the "client certificate"),
/// else the token options.
fn unauthenticated_hint(message: &str) -> &'static str {
    if message.contains("client certificate") {
        "present a client certificate the runtime maps: --tls-cert and --tls-key (or \
         PHRONY_TLS_CERT and PHRONY_TLS_KEY) with --tls-ca"
    } else {
        "set PHRONY_TOKEN or --token"
    }
}

/// `failure(action, _)` as a closure for `map_err`.
pub(crate) fn fails(action: &'static str) -> impl FnOnce(ClientError) -> anyhow::Error {
    move |error| failure(action, error)
}

/// The error of a failed change (a vote, cancel, deploy…): like [`failure`], except when the
/// connection was lost after the request left ([`ClientError::outcome_unknown`]): then it says
/// that `what` may have been recorded and names `check`, the command that shows whether it was,
/// and exits with code 3.
pub(crate) fn change_failure(
    action: &str,
    what: &str,
    check: &str,
    error: ClientError,
) -> anyhow::Error {
    if !error.outcome_unknown() {
        return failure(action, error);
    }
    Unsure::new(
        format!("{action}: {error}; {what} may have been recorded"),
        format!("check with: {check}  (before repeating the command)"),
    )
    .into()
}

/// `change_failure(action, what, check, _)` as a closure for `map_err`.
pub(crate) fn change_fails(
    action: &'static str,
    what: &'static str,
    check: String,
) -> impl FnOnce(ClientError) -> anyhow::Error {
    move |error| change_failure(action, what, &check, error)
}

/// Who the runtime records as the author of a change: `PHRONY_ACTOR`, else (with a token or a
/// client certificate: a verified credential) no
/// name at all, so the runtime records the credential's principal, else the OS user (`USER`,
/// `LOGNAME`, `USERNAME`), else `unknown`. A variable that is unset or only whitespace is
/// skipped; the first other one must be a valid actor name ([`phrony_client::Actor::parse`],
/// the rule the runtime applies), so a bad name fails before anything is sent.
pub(crate) fn actor(has_token: bool) -> anyhow::Result<String> {
    actor_from(|name| std::env::var(name).ok(), has_token)
}

fn actor_from(var: impl Fn(&str) -> Option<String>, has_token: bool) -> anyhow::Result<String> {
    let names: &[&str] = if has_token {
        // A verified principal is recorded as itself; naming the OS user would be refused as
        // impersonation. PHRONY_ACTOR still names someone explicitly (a relay token).
        &["PHRONY_ACTOR"]
    } else {
        &["PHRONY_ACTOR", "USER", "LOGNAME", "USERNAME"]
    };
    let found = names.iter().copied().into_iter().find_map(|name| {
        var(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    });
    let Some((name, value)) = found else {
        return Ok(if has_token {
            String::new()
        } else {
            "unknown".to_owned()
        });
    };
    phrony_client::Actor::parse(&value)
        .map(phrony_client::Actor::into_string)
        .map_err(|e| {
            Hinted::new(
                format!("{name}: {e}"),
                "set PHRONY_ACTOR to the name the runtime should record for you",
            )
            .into()
        })
}

/// Whether two release versions are the same release: equal semver precedence (a leading `v`
/// and build metadata ignored), else equal text.
fn same_release(cli: &str, runtime: &str) -> bool {
    let parse = |v: &str| semver::Version::parse(v.trim().trim_start_matches('v'));
    match (parse(cli), parse(runtime)) {
        (Ok(a), Ok(b)) => a.cmp_precedence(&b).is_eq(),
        _ => cli.trim() == runtime.trim(),
    }
}

fn warn_skew(runtime_version: &str, addr: &str) -> io::Result<()> {
    let shown = if runtime_version.is_empty() {
        "an unknown version"
    } else {
        runtime_version
    };
    writeln!(
        io::stderr().lock(),
        "warning: phrony CLI {CLI_VERSION} and the runtime at {addr} ({shown}) are different releases\n  \
         they may disagree on the API and the manifest format, so commands can fail or behave differently\n  \
         use the phrony CLI of the runtime's release,\n  \
         or upgrade the runtime to {CLI_VERSION} (restart phrony-runtime from this release)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_compare_by_semver_precedence() {
        assert!(same_release("0.1.0", "0.1.0"));
        assert!(same_release("0.1.0", "v0.1.0"));
        assert!(same_release("0.1.0", "0.1.0+build.7"));
        assert!(!same_release("0.1.0", "0.2.0"));
        assert!(!same_release("0.1.0", "0.1.0-rc.1"));
        assert!(!same_release("0.1.0", ""));
        assert!(same_release("dev", "dev"));
    }

    #[test]
    fn actor_prefers_phrony_actor_then_the_os_user() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let actor = |pairs| actor_from(env(pairs), false).map_err(|e| e.to_string());
        assert_eq!(
            actor(&[("PHRONY_ACTOR", "ci-bot"), ("USER", "alice")]),
            Ok("ci-bot".to_owned())
        );
        assert_eq!(
            actor(&[("PHRONY_ACTOR", "  "), ("USER", "alice")]),
            Ok("alice".to_owned())
        );
        assert_eq!(actor(&[("LOGNAME", "bob")]), Ok("bob".to_owned()));
        assert_eq!(actor(&[]), Ok("unknown".to_owned()));
        // With a token the OS user is not named (the runtime records the token's principal);
        // PHRONY_ACTOR still is (a relay token acting for someone).
        let with_token = |pairs| actor_from(env(pairs), true).map_err(|e| e.to_string());
        assert_eq!(with_token(&[("USER", "root")]), Ok(String::new()));
        assert_eq!(
            with_token(&[("PHRONY_ACTOR", "alice"), ("USER", "root")]),
            Ok("alice".to_owned())
        );
    }

    #[test]
    fn a_bad_actor_name_fails_early_naming_the_variable_and_the_rule() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let error = |pairs| actor_from(env(pairs), false).unwrap_err().to_string();
        assert_eq!(
            error(&[("PHRONY_ACTOR", "system:timeout"), ("USER", "alice")]),
            "PHRONY_ACTOR: actor \"system:timeout\" is reserved for the runtime (reserved: \
             system, agent, policy, worker, and names starting with \"system:\")"
        );
        assert!(
            error(&[("PHRONY_ACTOR", "bob\n[event/approval.decided] by ciso")])
                .contains("unprintable character U+000A"),
        );
        assert!(error(&[("USER", "\u{1b}[31mroot")]).starts_with("USER: "));
    }

    /// A one-shot server on a free port answering the first bytes it reads with `answer`.
    async fn answering(answer: &'static [u8]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(answer).await;
        });
        addr
    }

    #[tokio::test]
    async fn the_probe_tells_tls_from_plaintext_http2() {
        // rustls' answer to the HTTP/2 preface: a fatal decode_error alert.
        let tls = answering(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
        assert_eq!(probe(&tls).await, Some(Transport::Tls));
        // An HTTP/2 server's first frame: SETTINGS (length 6, type 4).
        let h2 = answering(&[0, 0, 6, 0x04, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]).await;
        assert_eq!(probe(&h2).await, Some(Transport::PlainHttp2));
        let http1 = answering(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        assert_eq!(probe(&http1).await, None);
        let silent = answering(b"").await;
        assert_eq!(probe(&silent).await, None);

        let tls = answering(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
        let message = transport_mismatch(&tls, false).await.unwrap().to_string();
        assert!(
            message.contains("speaks TLS; pass --tls-ca (or set PHRONY_TLS_CA)"),
            "{message}"
        );
        let tls = answering(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]).await;
        assert!(
            transport_mismatch(&tls, true).await.is_none(),
            "no disagreement"
        );
    }

    #[test]
    fn an_unauthenticated_refusal_names_the_options_of_its_credential() {
        let refused = |message: &str| {
            failure(
                "list agents",
                ClientError::Rpc {
                    code: Code::Unauthenticated,
                    message: message.to_owned(),
                },
            )
            .to_string()
        };
        assert_eq!(
            refused("unknown token"),
            "list agents: not authenticated: unknown token (set PHRONY_TOKEN or --token)"
        );
        let shown = refused(
            "credential rejected: client certificate subject \"mallory\" is not in \
             RUNTIME_TLS_CLIENT_ROLES",
        );
        assert!(
            shown.ends_with(
                "(present a client certificate the runtime maps: --tls-cert and --tls-key (or \
                 PHRONY_TLS_CERT and PHRONY_TLS_KEY) with --tls-ca)"
            ),
            "{shown}"
        );
        assert!(!shown.contains("PHRONY_TOKEN"), "{shown}");
    }

    #[test]
    fn unreachable_runtime_reads_as_advice() {
        let error = failure(
            "publish",
            ClientError::Unreachable {
                addr: "127.0.0.1:7777".into(),
                reason: "connection refused".into(),
            },
        );
        assert_eq!(
            format!("{error:#}"),
            "cannot reach the phrony runtime at 127.0.0.1:7777 (connection refused)"
        );
        let hinted = error.downcast_ref::<Hinted>();
        assert!(hinted.is_some());
    }

    #[test]
    fn rpc_errors_name_the_action_and_the_code() {
        let error = failure(
            "publish",
            ClientError::Rpc {
                code: Code::AlreadyExists,
                message: "agent demo/x version \"1.0.0\" already exists".into(),
            },
        );
        assert_eq!(
            format!("{error:#}"),
            "publish: agent demo/x version \"1.0.0\" already exists (AlreadyExists)"
        );
        let error = failure(
            "run",
            ClientError::Rpc {
                code: Code::Unimplemented,
                message: "RunSession is not implemented by this runtime yet".into(),
            },
        );
        assert_eq!(
            format!("{error:#}"),
            "run: RunSession is not implemented by this runtime yet (not implemented on this runtime yet)"
        );
    }
}
