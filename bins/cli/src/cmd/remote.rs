//! Talking to the runtime: connecting (with the version-skew check), naming the actor of
//! changes, and rendering failed calls as `<action>: <server message> (<CodeName>)`.

use std::future::Future;
use std::io::{self, Write as _};

use anyhow::{Context as _, anyhow};
use phrony_grpc::client::{Client, ClientError, Code, RuntimeVersion};

use crate::cmd::Global;
use crate::exit::Hinted;

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
    let client = Client::connect(&global.runtime_addr)
        .await
        .map_err(|e| failure("connect", e))?;
    let version = client
        .get_version()
        .await
        .map_err(|e| version_failure(client.addr(), e))?;
    warn_if_skewed(&version.version, client.addr())?;
    Ok((client, version))
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
        ClientError::InvalidAddress { .. } => anyhow!(error),
        other => anyhow!(other).context(action.to_owned()),
    }
}

/// `failure(action, _)` as a closure for `map_err`.
pub(crate) fn fails(action: &'static str) -> impl FnOnce(ClientError) -> anyhow::Error {
    move |error| failure(action, error)
}

/// Who the runtime records as the author of a change: `PHRONY_ACTOR`, else the OS user
/// (`USER`, `LOGNAME`, `USERNAME`), else `unknown`.
pub(crate) fn actor() -> String {
    actor_from(|name| std::env::var(name).ok())
}

fn actor_from(var: impl Fn(&str) -> Option<String>) -> String {
    ["PHRONY_ACTOR", "USER", "LOGNAME", "USERNAME"]
        .into_iter()
        .filter_map(var)
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
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
        assert_eq!(
            actor_from(env(&[("PHRONY_ACTOR", "ci-bot"), ("USER", "alice")])),
            "ci-bot"
        );
        assert_eq!(
            actor_from(env(&[("PHRONY_ACTOR", "  "), ("USER", "alice")])),
            "alice"
        );
        assert_eq!(actor_from(env(&[("LOGNAME", "bob")])), "bob");
        assert_eq!(actor_from(env(&[])), "unknown");
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
