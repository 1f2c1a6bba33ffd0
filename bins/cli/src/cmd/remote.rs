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
pub(crate) async fn connect(global: &Global) -> anyhow::Result<(Client, RuntimeVersion)> {
    let client = open(global).await.map_err(|e| failure("connect", e))?;
    let version = client
        .get_version()
        .await
        .map_err(|e| version_failure(client.addr(), e))?;
    warn_if_skewed(&version.version, client.addr())?;
    Ok((client, version))
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
        } => AccessRefused::new(format!(
            "{action}: not authenticated: {message} (set PHRONY_TOKEN or --token)"
        ))
        .into(),
        ClientError::Rpc {
            code: Code::PermissionDenied,
            message,
        } => AccessRefused::new(format!("{action}: permission denied: {message}")).into(),
        other => anyhow!(other).context(action.to_owned()),
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

/// Who the runtime records as the author of a change: `PHRONY_ACTOR`, else (with a token) no
/// name at all, so the runtime records the token's principal, else the OS user (`USER`,
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
