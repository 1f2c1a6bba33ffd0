//! Tool-worker and session settings: the `Work`-stream router (worker lease, integrity
//! allowlist), the deadlines of each tool call dispatched to a worker, the recovery grace, and
//! the bounds on what clients and models may ask for.
//!
//! Durations (`RUNTIME_DISPATCH_QUEUE_WAIT`, `RUNTIME_TOOL_EXEC_TIMEOUT`,
//! `RUNTIME_WORKER_LEASE_TTL`, `RUNTIME_RECOVERY_GRACE`) are whole seconds (`10`) or a duration
//! (`500ms`, `60s`, `2m`, `1h30m`). Unlike the reference, an invalid value stops the daemon
//! instead of silently becoming the default. The bounds (`RUNTIME_DISPATCH_QUEUE_CAPACITY`,
//! `RUNTIME_MAX_TOOL_ARGS_BYTES`,
//! `RUNTIME_MAX_TOOL_CALLS_PER_TURN`, `RUNTIME_MAX_QUEUED_USER_MESSAGES`) are positive whole
//! numbers; `RUNTIME_MAX_SESSIONS_PER_AGENT` is one too, or the word `unlimited` (never `0`,
//! which would read as either "none" or "no bound").

use std::path::PathBuf;
use std::time::Duration;

use crate::serve_config::ServeConfig;
use phrony_dispatch::{Allowlist, RouterConfig};
use phrony_engine::{
    DEFAULT_MAX_QUEUED_USER_MESSAGES, DEFAULT_MAX_SESSIONS_PER_AGENT, DEFAULT_MAX_TOOL_ARGS_BYTES,
    DEFAULT_MAX_TOOL_CALLS_PER_TURN,
};

use crate::config::Settings;

/// `RUNTIME_DISPATCH_QUEUE_WAIT` when unset.
const DEFAULT_QUEUE_WAIT: Duration = Duration::from_secs(10);
/// `RUNTIME_TOOL_EXEC_TIMEOUT` when unset.
const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// `RUNTIME_RECOVERY_GRACE` when unset: the default worker lease, the time a worker has to
/// show up again anyway.
const DEFAULT_RECOVERY_GRACE: Duration = Duration::from_secs(30);
/// `RUNTIME_SESSION_LEASE_TTL` when unset or blank on PostgreSQL (SQLite: no leases unless
/// set): a replica killed is replaced within 10 s, and a renewal (every third of it) survives
/// a few slow commits.
const DEFAULT_SESSION_LEASE_TTL: Duration = Duration::from_secs(10);
/// The shortest `RUNTIME_SESSION_LEASE_TTL`: renewals every 100 ms at most.
const MIN_SESSION_LEASE_TTL: Duration = Duration::from_millis(300);

/// The validated tool-worker settings.
#[derive(Debug, Clone)]
pub(crate) struct Workers {
    router: RouterConfig,
    /// The allowlist and the file it came from.
    allowlist: Option<(PathBuf, Allowlist)>,
    queue_wait: Duration,
    exec_timeout: Duration,
    max_tool_args_bytes: usize,
    max_tool_calls_per_turn: usize,
    recovery_grace: Duration,
    max_queued_user_messages: usize,
    /// `None`: unlimited.
    max_sessions_per_agent: Option<u64>,
    session_lease: SessionLease,
}

/// `RUNTIME_SESSION_LEASE_TTL` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SessionLease {
    /// Unset or blank: leases on PostgreSQL (a database several replicas may share, so the
    /// safe default), none on SQLite (one process per file).
    Auto,
    /// `off`: none, also on PostgreSQL (one daemon per database, by the operator's word).
    Off,
    /// A TTL: leases on either database.
    Ttl(Duration),
}

impl Settings {
    /// Parses and checks the tool-worker settings (and reads the allowlist file), naming the
    /// variable of the first invalid one.
    pub(crate) fn workers(&self) -> anyhow::Result<Workers> {
        let queue_wait = duration(
            "RUNTIME_DISPATCH_QUEUE_WAIT",
            self.dispatch_queue_wait.as_deref(),
            DEFAULT_QUEUE_WAIT,
        )?;
        let exec_timeout = duration(
            "RUNTIME_TOOL_EXEC_TIMEOUT",
            self.tool_exec_timeout.as_deref(),
            DEFAULT_EXEC_TIMEOUT,
        )?;
        let max_tool_args_bytes = count(
            "RUNTIME_MAX_TOOL_ARGS_BYTES",
            self.max_tool_args_bytes.as_deref(),
            DEFAULT_MAX_TOOL_ARGS_BYTES,
        )?;
        let max_tool_calls_per_turn = count(
            "RUNTIME_MAX_TOOL_CALLS_PER_TURN",
            self.max_tool_calls_per_turn.as_deref(),
            DEFAULT_MAX_TOOL_CALLS_PER_TURN,
        )?;
        let recovery_grace = duration(
            "RUNTIME_RECOVERY_GRACE",
            self.recovery_grace.as_deref(),
            DEFAULT_RECOVERY_GRACE,
        )?;
        let max_queued_user_messages = count(
            "RUNTIME_MAX_QUEUED_USER_MESSAGES",
            self.max_queued_user_messages.as_deref(),
            DEFAULT_MAX_QUEUED_USER_MESSAGES,
        )?;
        let max_sessions_per_agent = sessions_per_agent(self.max_sessions_per_agent.as_deref())?;
        let session_lease = match self.session_lease_ttl.as_deref().map(str::trim) {
            None | Some("") => SessionLease::Auto,
            Some(off) if off.eq_ignore_ascii_case("off") => SessionLease::Off,
            Some(text) => {
                let ttl = duration(
                    "RUNTIME_SESSION_LEASE_TTL",
                    Some(text),
                    DEFAULT_SESSION_LEASE_TTL,
                )?;
                if ttl < MIN_SESSION_LEASE_TTL {
                    anyhow::bail!(
                        "invalid RUNTIME_SESSION_LEASE_TTL {text:?}: at least \
                         {MIN_SESSION_LEASE_TTL:?}, or `off`"
                    );
                }
                SessionLease::Ttl(ttl)
            }
        };
        let mut router = RouterConfig::default();
        router.lease_ttl = duration(
            "RUNTIME_WORKER_LEASE_TTL",
            self.worker_lease_ttl.as_deref(),
            router.lease_ttl,
        )?;
        router.queue_capacity = count(
            "RUNTIME_DISPATCH_QUEUE_CAPACITY",
            self.dispatch_queue_capacity.as_deref(),
            router.queue_capacity,
        )?;
        router.require_descriptor_pins = self.require_descriptor_pins;
        router.validate().map_err(|e| {
            anyhow::anyhow!(
                "invalid RUNTIME_WORKER_LEASE_TTL {:?}: {e}",
                self.worker_lease_ttl.as_deref().unwrap_or_default()
            )
        })?;
        let allowlist = match self.tool_allowlist.as_ref().filter(|p| !p.is_empty()) {
            None => None,
            Some(path) => {
                let path = PathBuf::from(path);
                // The error's text is complete (it names the file and the cause); it is not
                // chained, or the cause would be printed twice.
                let list = Allowlist::load(&path)
                    .map_err(|e| anyhow::anyhow!("invalid RUNTIME_TOOL_ALLOWLIST: {e}"))?;
                Some((path, list))
            }
        };
        Ok(Workers {
            router,
            allowlist,
            queue_wait,
            exec_timeout,
            max_tool_args_bytes,
            max_tool_calls_per_turn,
            recovery_grace,
            max_queued_user_messages,
            max_sessions_per_agent,
            session_lease,
        })
    }
}

impl Workers {
    /// Puts the router settings, the allowlist and the per-call deadlines into `config`
    /// (`serve` builds the router from them, with the session engine's hooks installed).
    /// The session lease TTL on a ledger of `backend`: `None` runs without leases.
    pub(crate) fn session_lease_ttl(&self, backend: phrony_ledger::Backend) -> Option<Duration> {
        match (self.session_lease, backend) {
            (SessionLease::Ttl(ttl), _) => Some(ttl),
            (SessionLease::Auto, phrony_ledger::Backend::Postgres) => {
                Some(DEFAULT_SESSION_LEASE_TTL)
            }
            (SessionLease::Auto, phrony_ledger::Backend::Sqlite) | (SessionLease::Off, _) => None,
        }
    }

    pub(crate) fn apply(self, config: &mut ServeConfig) -> anyhow::Result<()> {
        // Checked here so a bad setting fails before the daemon listens.
        self.router
            .validate()
            .map_err(|e| anyhow::anyhow!("cannot start the tool dispatch router: {e}"))?;
        match &self.allowlist {
            Some((path, list)) => tracing::info!(
                entries = list.len(),
                "tool allowlist: {} ({} entries)",
                path.display(),
                list.len()
            ),
            None => tracing::info!("tool allowlist: none (any registered worker may serve a call)"),
        }
        tracing::info!(
            queue_wait = %humantime::format_duration(self.queue_wait),
            exec_timeout = %humantime::format_duration(self.exec_timeout),
            worker_lease = %humantime::format_duration(self.router.lease_ttl),
            require_descriptor_pins = self.router.require_descriptor_pins,
            max_tool_args_bytes = self.max_tool_args_bytes,
            max_tool_calls_per_turn = self.max_tool_calls_per_turn,
            "tool dispatch settings"
        );
        match self.max_sessions_per_agent {
            Some(max) => tracing::info!(
                recovery_grace = %humantime::format_duration(self.recovery_grace),
                max_queued_user_messages = self.max_queued_user_messages,
                max_sessions_per_agent = max,
                "session settings"
            ),
            None => tracing::warn!(
                recovery_grace = %humantime::format_duration(self.recovery_grace),
                max_queued_user_messages = self.max_queued_user_messages,
                "session settings: RUNTIME_MAX_SESSIONS_PER_AGENT=unlimited, one agent may \
                 start sessions until the runtime runs out of memory or database"
            ),
        }
        config.router_config = self.router.clone();
        config.tool_allowlist = self.allowlist.map(|(_, list)| list);
        config.dispatch_queue_wait = self.queue_wait;
        config.tool_exec_timeout = self.exec_timeout;
        config.max_tool_args_bytes = self.max_tool_args_bytes;
        config.max_tool_calls_per_turn = self.max_tool_calls_per_turn;
        config.recovery_grace = self.recovery_grace;
        config.max_queued_user_messages = self.max_queued_user_messages;
        config.max_sessions_per_agent = self.max_sessions_per_agent;
        Ok(())
    }
}

/// The value of `var`: `default` when unset or blank, else [`parse_duration`]'s result.
pub(crate) fn duration(
    var: &str,
    value: Option<&str>,
    default: Duration,
) -> anyhow::Result<Duration> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(text) => parse_duration(text).map_err(|problem| {
            anyhow::anyhow!(
                "invalid {var} {text:?}: {problem}; expected whole seconds (e.g. 10) or a \
                 duration such as 500ms, 60s or 2m"
            )
        }),
    }
}

/// The value of `var`: `default` when unset or blank, else a positive whole number.
fn count(var: &str, value: Option<&str>, default: usize) -> anyhow::Result<usize> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(anyhow::anyhow!(
                "invalid {var} {text:?}: expected a whole number greater than zero"
            )),
        },
    }
}

/// `RUNTIME_MAX_SESSIONS_PER_AGENT`: the default when unset or blank, a positive whole number,
/// or `unlimited` (`None`). `0` is refused rather than read as "no bound".
fn sessions_per_agent(value: Option<&str>) -> anyhow::Result<Option<u64>> {
    const VAR: &str = "RUNTIME_MAX_SESSIONS_PER_AGENT";
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(Some(DEFAULT_MAX_SESSIONS_PER_AGENT)),
        Some(text) if text.eq_ignore_ascii_case("unlimited") => Ok(None),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(anyhow::anyhow!(
                "invalid {VAR} {text:?}: expected a whole number greater than zero, or \
                 `unlimited` for no bound"
            )),
        },
    }
}

/// Whole seconds (`10`) or a duration (`500ms`, `60s`, `1h30m`); it must be positive.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let value = if text.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = text
            .parse()
            .map_err(|_| "the number is too large".to_owned())?;
        Duration::from_secs(seconds)
    } else {
        humantime::parse_duration(text).map_err(|e| e.to_string())?
    };
    if value.is_zero() {
        return Err("it must be greater than zero".to_owned());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::config::Cli;

    fn workers(args: &[&str]) -> anyhow::Result<Workers> {
        let mut argv = vec!["phrony-runtime"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().settings.workers()
    }

    fn error(args: &[&str]) -> String {
        format!("{:#}", workers(args).unwrap_err())
    }

    #[test]
    fn durations_are_seconds_or_humane_units() {
        let cases = [
            ("10", Duration::from_secs(10)),
            ("1", Duration::from_secs(1)),
            ("500ms", Duration::from_millis(500)),
            ("60s", Duration::from_secs(60)),
            ("2m", Duration::from_secs(120)),
            ("1h30m", Duration::from_secs(5400)),
            ("1m 30s", Duration::from_secs(90)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "0",
            "0s",
            "-5",
            "5x",
            "ten",
            "1.5.2s",
            "s",
            "99999999999999999999999",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn defaults_apply_when_unset_or_blank() {
        let w = workers(&[]).unwrap();
        assert_eq!(w.queue_wait, Duration::from_secs(10));
        assert_eq!(w.exec_timeout, Duration::from_secs(60));
        assert_eq!(w.router, RouterConfig::default());
        assert_eq!(w.router.queue_capacity, 4096);
        assert!(w.allowlist.is_none());
        assert_eq!(w.max_tool_args_bytes, 1024 * 1024);
        assert_eq!(w.max_tool_calls_per_turn, 64);
        assert_eq!(w.recovery_grace, Duration::from_secs(30));
        assert_eq!(w.max_queued_user_messages, 32);
        assert_eq!(w.max_sessions_per_agent, Some(10_000));

        let w = workers(&[
            "--dispatch-queue-wait",
            " ",
            "--tool-exec-timeout",
            "",
            "--tool-allowlist",
            "",
        ])
        .unwrap();
        assert_eq!(w.queue_wait, Duration::from_secs(10));
        assert_eq!(w.exec_timeout, Duration::from_secs(60));
        assert!(w.allowlist.is_none());
    }

    #[test]
    fn session_leases_default_on_for_postgres_only_and_are_at_least_300ms() {
        use phrony_ledger::Backend::{Postgres, Sqlite};
        let w = workers(&[]).unwrap();
        assert_eq!(
            w.session_lease_ttl(Sqlite),
            None,
            "one process per SQLite file"
        );
        assert_eq!(w.session_lease_ttl(Postgres), Some(Duration::from_secs(10)));
        let w = workers(&["--session-lease-ttl", "OFF"]).unwrap();
        assert_eq!(w.session_lease_ttl(Postgres), None);
        let w = workers(&["--session-lease-ttl", "1500ms"]).unwrap();
        assert_eq!(
            w.session_lease_ttl(Sqlite),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            w.session_lease_ttl(Postgres),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            error(&["--session-lease-ttl", "100ms"]),
            "invalid RUNTIME_SESSION_LEASE_TTL \"100ms\": at least 300ms, or `off`"
        );
        assert!(
            error(&["--session-lease-ttl", "0"]).starts_with("invalid RUNTIME_SESSION_LEASE_TTL")
        );
    }

    #[test]
    fn tool_call_bounds_are_positive_whole_numbers() {
        let w = workers(&[
            "--max-tool-args-bytes",
            "4096",
            "--max-tool-calls-per-turn",
            " 8 ",
        ])
        .unwrap();
        assert_eq!(w.max_tool_args_bytes, 4096);
        assert_eq!(w.max_tool_calls_per_turn, 8);
        assert_eq!(
            error(&["--max-tool-args-bytes", "1MiB"]),
            "invalid RUNTIME_MAX_TOOL_ARGS_BYTES \"1MiB\": expected a whole number greater than zero"
        );
        assert_eq!(
            error(&["--max-tool-calls-per-turn", "0"]),
            "invalid RUNTIME_MAX_TOOL_CALLS_PER_TURN \"0\": expected a whole number greater than \
             zero"
        );
    }

    #[test]
    fn session_bounds_are_positive_whole_numbers_or_unlimited() {
        let w = workers(&[
            "--max-queued-user-messages",
            "4",
            "--max-sessions-per-agent",
            " 250 ",
            "--recovery-grace",
            "2m",
        ])
        .unwrap();
        assert_eq!(w.max_queued_user_messages, 4);
        assert_eq!(w.max_sessions_per_agent, Some(250));
        assert_eq!(w.recovery_grace, Duration::from_secs(120));
        for word in ["unlimited", "Unlimited"] {
            let w = workers(&["--max-sessions-per-agent", word]).unwrap();
            assert_eq!(w.max_sessions_per_agent, None, "{word}");
        }
        assert_eq!(
            error(&["--max-sessions-per-agent", "0"]),
            "invalid RUNTIME_MAX_SESSIONS_PER_AGENT \"0\": expected a whole number greater \
             than zero, or `unlimited` for no bound"
        );
        assert!(
            error(&["--max-sessions-per-agent=-1"])
                .starts_with("invalid RUNTIME_MAX_SESSIONS_PER_AGENT \"-1\": "),
        );
        assert_eq!(
            error(&["--max-queued-user-messages", "0"]),
            "invalid RUNTIME_MAX_QUEUED_USER_MESSAGES \"0\": expected a whole number greater \
             than zero"
        );
        assert_eq!(
            error(&["--recovery-grace", "0s"]),
            "invalid RUNTIME_RECOVERY_GRACE \"0s\": it must be greater than zero; expected \
             whole seconds (e.g. 10) or a duration such as 500ms, 60s or 2m"
        );
    }

    #[test]
    fn configured_values_are_used() {
        let w = workers(&[
            "--dispatch-queue-wait",
            "5",
            "--tool-exec-timeout",
            "2m",
            "--worker-lease-ttl",
            "10s",
            "--dispatch-queue-capacity",
            "20000",
        ])
        .unwrap();
        assert_eq!(w.router.queue_capacity, 20_000);
        assert_eq!(w.queue_wait, Duration::from_secs(5));
        assert_eq!(w.exec_timeout, Duration::from_secs(120));
        assert_eq!(w.router.lease_ttl, Duration::from_secs(10));
    }

    #[test]
    fn descriptor_pins_are_optional_unless_required() {
        assert!(!workers(&[]).unwrap().router.require_descriptor_pins);
        let w = workers(&["--require-descriptor-pins", "true"]).unwrap();
        assert!(w.router.require_descriptor_pins);
    }

    #[test]
    fn invalid_values_name_the_variable_and_the_expected_form() {
        let shown = error(&["--dispatch-queue-wait", "soon"]);
        assert!(
            shown.starts_with("invalid RUNTIME_DISPATCH_QUEUE_WAIT \"soon\": "),
            "{shown}"
        );
        assert!(shown.contains("500ms, 60s or 2m"), "{shown}");
        let shown = error(&["--tool-exec-timeout", "0"]);
        assert_eq!(
            shown,
            "invalid RUNTIME_TOOL_EXEC_TIMEOUT \"0\": it must be greater than zero; expected \
             whole seconds (e.g. 10) or a duration such as 500ms, 60s or 2m"
        );
        let shown = error(&["--dispatch-queue-capacity", "0"]);
        assert_eq!(
            shown,
            "invalid RUNTIME_DISPATCH_QUEUE_CAPACITY \"0\": expected a whole number greater than zero"
        );
        let shown = error(&["--worker-lease-ttl", "1s"]);
        assert!(
            shown.starts_with(
                "invalid RUNTIME_WORKER_LEASE_TTL \"1s\": lease_ttl must be at least 2s"
            ),
            "{shown}"
        );
    }

    #[test]
    fn the_allowlist_is_loaded_or_refused_with_its_problem() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("allowlist.yaml");
        std::fs::write(
            &good,
            "entries:\n  - agent: support/refund-agent\n    tool: payments.issue-refund\n    \
             version: 1.0.0\n    workload_identities: [payments/worker]\n    \
             image_digests: [sha256:abc]\n",
        )
        .unwrap();
        let w = workers(&["--tool-allowlist", good.to_str().unwrap()]).unwrap();
        let (path, list) = w.allowlist.unwrap();
        assert_eq!(path, good);
        assert_eq!(list.len(), 1);

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "entries:\n  - tool: payments.issue-refund\n").unwrap();
        let shown = error(&["--tool-allowlist", bad.to_str().unwrap()]);
        assert_eq!(
            shown,
            "invalid RUNTIME_TOOL_ALLOWLIST: tool allowlist entries[0]: agent is required"
        );

        let missing = dir.path().join("missing.yaml");
        let shown = error(&["--tool-allowlist", missing.to_str().unwrap()]);
        assert!(
            shown.starts_with(&format!(
                "invalid RUNTIME_TOOL_ALLOWLIST: read tool allowlist {}: ",
                missing.display()
            )),
            "{shown}"
        );
    }
}
