//! The behaviour of `mock-gate`, a faithful local twin of the Regent Control Decision API: its
//! command line ([`Cli`]) and what each command does ([`run`]); the binary only parses the
//! arguments, runs [`run`] on a Tokio runtime and maps the outcome to an exit code.
//!
//! ```text
//! mock-gate [--port P] [--deny-over N] [--escalate-over N] [--deny-tool T] [--deny-all]   flags mode
//! mock-gate --config FILE [--port P]                                                      config mode
//! mock-gate approvals list [--status S] (--admin-key K | --config FILE) [--url URL]
//! mock-gate approvals approve|reject ID --approver NAME [--approver-token T] [--comment C]
//!                                       (--admin-key K | --config FILE) [--url URL]
//! mock-gate idp-token --config FILE --sub S --role R
//! mock-gate audit export (--config FILE | --url URL --admin-key K) [--out FILE]
//! mock-gate console hash-password < password                                              (console.managers[].password_hash)
//! mock-gate vault put --config FILE --name NAME          (the secret on standard input)
//! mock-gate vault keygen                                 (a fresh MOCK_GATE_VAULT_KEY)
//! mock-gate provider [--host H] [--port P] [--auth header|bearer|oauth2] [--header NAME]
//!                    [--client-id ID] [--token-ttl S]    (the key in MOCK_PROVIDER_KEY)
//! ```
//! The vault key is `MOCK_GATE_VAULT_KEY` (or `routing.vault.key_file`).
//! ```text
//! ```
//!
//! With a `routing` section the gate also serves the sidecar (`/{tool}/{path}`) and gateway
//! (`/gw/{tool}/{path}`) routes; it opens the vault at start and refuses to start when a
//! vaulted credential cannot be opened.
//!
//! In flags mode the admin key is generated at start and printed once on standard error,
//! unless `--admin-key` or `MOCK_GATE_ADMIN_KEY` chooses one.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand};
use phrony_gate::{AdminClient, FlagRules, Resolution, Settings, admin, money, service};

#[derive(Debug, Parser)]
#[command(
    name = "mock-gate",
    version,
    about = "A local twin of the Regent Control Decision API that the published SDK and verifiers accept",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Config mode: agents, keys, catalog, Cedar policies, mandates, OIDC (YAML).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (config mode: the file's `port`, else 8009).
    #[arg(long)]
    port: Option<u16>,
    /// Flags mode: amounts above this are denied MANDATE_LIMIT_EXCEEDED.
    #[arg(long, value_name = "AMOUNT", conflicts_with = "config")]
    deny_over: Option<String>,
    /// Flags mode: amounts above this (and within --deny-over) escalate.
    #[arg(long, value_name = "AMOUNT", conflicts_with = "config")]
    escalate_over: Option<String>,
    /// Flags mode: deny this tool TOOL_NOT_ALLOWED (repeatable).
    #[arg(long = "deny-tool", value_name = "TOOL", conflicts_with = "config")]
    deny_tools: Vec<String>,
    /// Flags mode: deny every request POLICY_DENIED.
    #[arg(long, conflicts_with = "config")]
    deny_all: bool,
    /// Flags mode: the key of the admin routes (approvals, audit); without it a random key is
    /// generated and printed once on standard error. Config mode reads `admin.key` instead.
    /// Prefer the environment variable: a flag is visible to other users in the process list.
    #[arg(long, env = "MOCK_GATE_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// The key of the routing credential vault (32 bytes, hex or base64; overrides
    /// `routing.vault.key_file`). Use the environment variable: a flag is visible to other users.
    #[arg(
        long,
        env = "MOCK_GATE_VAULT_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    vault_key: Option<String>,
    /// Keep the token key and the SQLite state here (config mode: overrides `state_dir`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List, approve or reject escalations through a running gate's admin route.
    Approvals {
        #[command(subcommand)]
        action: ApprovalAction,
    },
    /// Print an id_token from the configuration's test IdP.
    IdpToken {
        /// The configuration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The subject (e.g. alice@bank).
        #[arg(long)]
        sub: String,
        /// The role (e.g. support_agent, manager).
        #[arg(long)]
        role: String,
        /// The e-mail claim (defaults to the subject when it looks like one).
        #[arg(long)]
        email: Option<String>,
    },
    /// The audit log.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// The web console (`/console/`).
    Console {
        #[command(subcommand)]
        action: ConsoleAction,
    },
    /// The sealed credential vault of the routing routes.
    Vault {
        #[command(subcommand)]
        action: VaultAction,
    },
    /// The walkthrough's mock provider: a refunds API that only the vaulted key opens.
    Provider(ProviderArgs),
}

#[derive(Debug, Subcommand)]
enum VaultAction {
    /// Seal the secret read from standard input (one line) under NAME in the configuration's
    /// vault file (`routing.vault.file`; key from MOCK_GATE_VAULT_KEY or `routing.vault.key_file`).
    Put {
        /// The configuration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// The secret's name, as the tool's `credential.secret` names it.
        #[arg(long)]
        name: String,
        /// The vault key (overrides `routing.vault.key_file`); use the environment variable.
        #[arg(
            long,
            env = "MOCK_GATE_VAULT_KEY",
            hide_env_values = true,
            value_name = "KEY"
        )]
        vault_key: Option<String>,
    },
    /// Print a fresh random vault key (32 bytes, hex).
    Keygen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProviderAuthKind {
    /// A static header (`--header`, default X-Api-Key) carrying the key.
    Header,
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// OAuth2 client credentials at `POST /oauth/token` (`--client-id`; the key is the secret).
    Oauth2,
}

#[derive(Debug, Args)]
struct ProviderArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8010)]
    port: u16,
    /// How callers authenticate.
    #[arg(long, value_enum, default_value_t = ProviderAuthKind::Header)]
    auth: ProviderAuthKind,
    /// The header of `--auth header`.
    #[arg(long, default_value = "X-Api-Key")]
    header: String,
    /// The OAuth2 client id of `--auth oauth2`.
    #[arg(long, default_value = "mock-gate")]
    client_id: String,
    /// OAuth2 token lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    token_ttl: u64,
    /// The key (or OAuth2 client secret). Use the environment variable: a flag is visible to
    /// other users in the process list.
    #[arg(
        long,
        env = "MOCK_PROVIDER_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    key: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ConsoleAction {
    /// Read a manager's password from the first line of standard input and print its Argon2id
    /// hash for `console.managers[].password_hash` (never pass a password as an argument: the
    /// process list shows arguments).
    HashPassword,
}

/// What to do when an admin command has no admin key.
const NO_ADMIN_KEY: &str = "no admin key: pass --admin-key KEY (or set MOCK_GATE_ADMIN_KEY), or \
     --config FILE to read admin.key; a flags-mode gate prints its generated key on standard \
     error at start";

#[derive(Debug, Args)]
struct Remote {
    /// The gate's base URL.
    #[arg(long, env = "MOCK_GATE_URL", default_value = "http://127.0.0.1:8009")]
    url: String,
    /// The admin key (or take it from --config; a flags-mode gate printed its key at start).
    #[arg(long, env = "MOCK_GATE_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// A configuration file to read the admin key from.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl Remote {
    fn client(&self) -> Result<AdminClient> {
        let key = match (&self.admin_key, &self.config) {
            (Some(k), _) => k.clone(),
            (None, Some(file)) => Settings::load(file)?
                .admin_key
                .context("the configuration has no admin key")?,
            (None, None) => bail!(NO_ADMIN_KEY),
        };
        Ok(AdminClient::new(&self.url, &key)?)
    }
}

#[derive(Debug, Subcommand)]
enum ApprovalAction {
    /// List approvals.
    List {
        /// Only this status: pending, approved, rejected, consumed, expired.
        #[arg(long)]
        status: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Approve an escalation.
    Approve(Resolve),
    /// Reject an escalation.
    Reject(Resolve),
}

#[derive(Debug, Args)]
struct Resolve {
    /// The escalation ref (esc_…).
    id: String,
    /// Who decides, recorded in the audit log (with --approver-token: its subject or e-mail).
    #[arg(long, env = "MOCK_GATE_APPROVER")]
    approver: String,
    /// A comment for the audit log.
    #[arg(long)]
    comment: Option<String>,
    /// The approver's id_token (e.g. from `mock-gate idp-token --role manager`).
    #[arg(long, env = "MOCK_GATE_APPROVER_TOKEN")]
    approver_token: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

#[derive(Debug, Subcommand)]
enum AuditAction {
    /// Write the hash-chained audit log as JSON Lines.
    Export {
        /// Read the state of this configuration directly (the gate may be stopped).
        #[arg(long, value_name = "FILE", conflicts_with = "url")]
        config: Option<PathBuf>,
        /// The state directory (overrides the configuration's).
        #[arg(long, value_name = "DIR", conflicts_with = "url")]
        state_dir: Option<PathBuf>,
        /// Ask a running gate instead.
        #[arg(long)]
        url: Option<String>,
        /// The admin key (with --url).
        #[arg(long, env = "MOCK_GATE_ADMIN_KEY", hide_env_values = true)]
        admin_key: Option<String>,
        /// Write here instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

/// Runs the chosen command: serves the gate (no subcommand), or an admin, IdP or audit
/// command.
///
/// # Errors
/// Whatever made the command fail (bad flags or configuration, an unreachable gate, an audit
/// log that does not verify, …), with its context.
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => serve(cli.serve).await,
        Some(Command::Approvals { action }) => approvals(action).await,
        Some(Command::IdpToken {
            config,
            sub,
            role,
            email,
        }) => idp_token(&config, &sub, &role, email),
        Some(Command::Audit {
            action:
                AuditAction::Export {
                    config,
                    state_dir,
                    url,
                    admin_key,
                    out,
                },
        }) => audit_export(url, admin_key, config, state_dir, out).await,
        Some(Command::Console {
            action: ConsoleAction::HashPassword,
        }) => hash_password(std::io::stdin().lock()),
        Some(Command::Vault { action }) => vault(action),
        Some(Command::Provider(args)) => provider(args).await,
    }
}

/// `vault put` / `vault keygen`.
fn vault(action: VaultAction) -> Result<()> {
    match action {
        VaultAction::Keygen => {
            let mut key = [0_u8; 32];
            getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
            println!("{}", hex_encode(&key));
            Ok(())
        }
        VaultAction::Put {
            config,
            name,
            vault_key,
        } => {
            let settings = with_vault_key(Settings::load(&config)?, vault_key);
            let vault = settings
                .routing
                .as_ref()
                .and_then(|r| r.vault.as_ref())
                .context("the configuration has no routing.vault section")?;
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the secret from standard input")?;
            let secret =
                secrecy::SecretString::from(line.trim_end_matches(['\r', '\n']).to_owned());
            phrony_gate::vault::put(vault, &settings.org_id, &name, &secret)?;
            eprintln!("sealed `{name}` into {}", vault.file.display());
            Ok(())
        }
    }
}

/// The settings with the vault key given (`--vault-key` / `MOCK_GATE_VAULT_KEY`), which takes
/// precedence over `routing.vault.key_file`.
fn with_vault_key(mut settings: Settings, key: Option<String>) -> Settings {
    if let Some(vault) = settings.routing.as_mut().and_then(|r| r.vault.as_mut())
        && let Some(key) = key.filter(|k| !k.is_empty())
    {
        vault.key = Some(secrecy::SecretString::from(key));
    }
    settings
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `provider`: serves the mock refunds API until Ctrl-C; the first stdout line is its URL.
async fn provider(args: ProviderArgs) -> Result<()> {
    use phrony_gate::provider::{Provider, ProviderAuth};
    let key = args
        .key
        .clone()
        .filter(|k| !k.is_empty())
        .context("set MOCK_PROVIDER_KEY to the provider's key")?;
    let key = secrecy::SecretString::from(key);
    let auth = match args.auth {
        ProviderAuthKind::Header => ProviderAuth::Header {
            name: axum::http::HeaderName::from_bytes(args.header.as_bytes())
                .with_context(|| format!("--header `{}` is not a header name", args.header))?,
            key,
        },
        ProviderAuthKind::Bearer => ProviderAuth::Bearer(key),
        ProviderAuthKind::Oauth2 => ProviderAuth::OAuth2 {
            client_id: args.client_id.clone(),
            secret: key,
            token_ttl: args.token_ttl,
        },
    };
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("invalid listen address {}:{}", args.host, args.port))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    println!(
        "mock-provider listening on http://{} ({:?})",
        listener.local_addr()?,
        args.auth
    );
    std::io::stdout().flush()?;
    let app = phrony_gate::provider::router(Arc::new(Provider::new(auth)));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// `console hash-password`: the Argon2id PHC hash of the first line of `input` (without its
/// line ending).
fn hash_password(mut input: impl std::io::BufRead) -> Result<()> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.strip_suffix('\n').unwrap_or(&line);
    let password = password.strip_suffix('\r').unwrap_or(password);
    println!("{}", phrony_gate::console::hash_password(password)?);
    Ok(())
}

/// `idp-token`: an id_token for `sub` with `role` from the configuration's test IdP.
fn idp_token(config: &Path, sub: &str, role: &str, email: Option<String>) -> Result<()> {
    let settings = Settings::load(config)?;
    let oidc = settings
        .oidc
        .as_ref()
        .context("the configuration has no oidc section")?;
    let verifier = phrony_gate::oidc::Verifier::new(oidc)?;
    let email = email.or_else(|| sub.contains('@').then(|| sub.to_owned()));
    let token = verifier
        .mint_test_token(sub, role, email.as_deref(), chrono_now())
        .map_err(anyhow::Error::msg)?;
    println!("{token}");
    Ok(())
}

/// `audit export`: the audit log as JSON Lines, from a running gate (`url`) or read from the
/// configuration's state directory, written to `out` or standard output.
async fn audit_export(
    url: Option<String>,
    admin_key: Option<String>,
    config: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    out: Option<PathBuf>,
) -> Result<()> {
    let text = match (url, config) {
        (Some(url), _) => {
            AdminClient::new(&url, &admin_key.context(NO_ADMIN_KEY)?)?
                .audit_jsonl()
                .await?
        }
        (None, Some(config)) => {
            let settings = Settings::load(&config)?;
            let dir = state_dir
                .or_else(|| settings.state_dir.clone())
                .context("the configuration has no state_dir; pass --state-dir")?;
            service::export_audit(&dir, &settings.org_id).await?
        }
        (None, None) => bail!("pass --config FILE or --url URL"),
    };
    match out {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    Ok(())
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Serves the gate until Ctrl-C, printing its base URL as the first line on standard output.
async fn serve(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "mock_gate=info,phrony_gate=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let (settings, mode) = match &args.config {
        Some(file) => (
            with_vault_key(Settings::load(file)?, args.vault_key.clone()),
            format!("config {}", file.display()),
        ),
        None => flags_settings(&args)?,
    };
    let port = args.port.or(settings.port).unwrap_or(8009);
    let gate = service::open(settings, args.state_dir.clone()).await?;
    phrony_gate::routing::preflight(&gate).context("the routing vault")?;
    let addr: SocketAddr = format!("{}:{port}", args.host)
        .parse()
        .with_context(|| format!("invalid listen address {}:{port}", args.host))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    // The first line on stdout is the base URL: scripts and tests read it.
    println!("mock-gate listening on http://{local} ({mode})");
    std::io::stdout().flush()?;
    let app = phrony_gate::router(Arc::new(gate));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The settings of a flags-mode gate and the summary of its rules (printed after the URL).
fn flags_settings(args: &ServeArgs) -> Result<(Settings, String)> {
    let amount = |flag: &str, v: &Option<String>| -> Result<_> {
        v.as_deref()
            .map(|s| {
                money::parse_amount(&serde_json::Value::String(s.to_owned()))
                    .map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
            })
            .transpose()
    };
    let rules = FlagRules {
        deny_over: amount("deny-over", &args.deny_over)?,
        escalate_over: amount("escalate-over", &args.escalate_over)?,
        deny_tools: args.deny_tools.iter().cloned().collect(),
        deny_all: args.deny_all,
    };
    let summary = format!(
        "flags deny_over={} escalate_over={} deny_tools={:?} deny_all={}",
        args.deny_over.as_deref().unwrap_or("none"),
        args.escalate_over.as_deref().unwrap_or("none"),
        rules.deny_tools,
        rules.deny_all
    );
    Ok((
        Settings::flags(rules, Some(flags_admin_key(args.admin_key.clone())?)),
        summary,
    ))
}

/// The admin key of a flags-mode gate: the one chosen (checked), else a random one printed
/// once on standard error, before the URL line on standard output.
fn flags_admin_key(chosen: Option<String>) -> Result<String> {
    if let Some(key) = chosen {
        admin::check_admin_key(&key).map_err(|e| anyhow::anyhow!("--admin-key: {e}"))?;
        return Ok(key);
    }
    let key = admin::generate_admin_key()?;
    eprintln!(
        "mock-gate: admin key for this run (generated; choose one with --admin-key or \
         MOCK_GATE_ADMIN_KEY): {key}"
    );
    Ok(key)
}

/// `approvals list|approve|reject`, through a running gate's admin route.
async fn approvals(action: ApprovalAction) -> Result<()> {
    match action {
        ApprovalAction::List {
            status,
            json,
            remote,
        } => {
            let list = remote.client()?.approvals(status.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            if list.is_empty() {
                println!("no approvals");
            }
            for a in &list {
                println!("{}", approval_line(a));
            }
            Ok(())
        }
        ApprovalAction::Approve(r) => resolve(r, Resolution::Approve).await,
        ApprovalAction::Reject(r) => resolve(r, Resolution::Reject).await,
    }
}

/// One approval of `approvals list`, as a table line (`-` for a missing field).
fn approval_line(a: &serde_json::Value) -> String {
    let s = |k: &str| a.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_owned();
    let who = a
        .get("on_behalf_of")
        .and_then(|u| u.get("sub"))
        .and_then(|v| v.as_str())
        .unwrap_or("-");
    format!(
        "{}  {:<8}  {}/{}  {} {}  needs {}  for {}  {}",
        s("ref"),
        s("status"),
        s("tool"),
        s("action"),
        s("amount"),
        s("currency"),
        s("approver_role"),
        who,
        s("reason")
    )
}

async fn resolve(r: Resolve, resolution: Resolution) -> Result<()> {
    let view = r
        .remote
        .client()?
        .resolve(
            &r.id,
            resolution,
            &r.approver,
            r.comment.as_deref(),
            r.approver_token.as_deref(),
        )
        .await?;
    println!(
        "{} {}",
        view.get("ref").and_then(|v| v.as_str()).unwrap_or(&r.id),
        view.get("status").and_then(|v| v.as_str()).unwrap_or("?")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};
    use serde_json::json;

    use super::{Cli, Command, approval_line, flags_admin_key, flags_settings};

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_mode_options_conflict_with_a_configuration() {
        let err = Cli::try_parse_from(["mock-gate", "--config", "gate.yaml", "--deny-all"])
            .expect_err("--deny-all is a flags-mode option");
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn serve_options_do_not_mix_with_a_subcommand() {
        assert!(Cli::try_parse_from(["mock-gate", "--deny-all", "idp-token"]).is_err());
        let cli = Cli::try_parse_from([
            "mock-gate",
            "idp-token",
            "--config",
            "gate.yaml",
            "--sub",
            "alice@bank",
            "--role",
            "manager",
        ])
        .expect("a complete idp-token command");
        assert!(matches!(cli.command, Some(Command::IdpToken { .. })));
    }

    #[test]
    fn flags_mode_summarises_its_rules_and_rejects_bad_amounts() {
        let cli = Cli::try_parse_from([
            "mock-gate",
            "--deny-over",
            "500",
            "--deny-tool",
            "wire",
            "--admin-key",
            "adm_0123456789abcdef0123456789abcdef",
        ])
        .expect("flags-mode command line");
        let (_, summary) = flags_settings(&cli.serve).expect("valid flags");
        assert_eq!(
            summary,
            "flags deny_over=500 escalate_over=none deny_tools={\"wire\"} deny_all=false"
        );
        let cli = Cli::try_parse_from(["mock-gate", "--escalate-over", "lots"])
            .expect("flags-mode command line");
        let err = flags_settings(&cli.serve).expect_err("not an amount");
        assert!(err.to_string().starts_with("--escalate-over: "), "{err:#}");
    }

    #[test]
    fn a_chosen_admin_key_is_checked() {
        let err = flags_admin_key(Some("short".to_owned())).expect_err("too weak a key");
        assert!(err.to_string().starts_with("--admin-key: "), "{err:#}");
        let generated = flags_admin_key(None).expect("a generated key");
        assert_eq!(
            flags_admin_key(Some(generated.clone())).ok(),
            Some(generated)
        );
    }

    #[test]
    fn an_approval_line_shows_each_field_or_a_dash() {
        let full = json!({
            "ref": "esc_1", "status": "pending", "tool": "payments", "action": "refund",
            "amount": "750.00", "currency": "EUR", "approver_role": "manager",
            "on_behalf_of": {"sub": "alice@bank"}, "reason": "over 500",
        });
        assert_eq!(
            approval_line(&full),
            "esc_1  pending   payments/refund  750.00 EUR  needs manager  for alice@bank  over 500"
        );
        assert_eq!(
            approval_line(&json!({"ref": "esc_2"})),
            "esc_2  -         -/-  - -  needs -  for -  -"
        );
    }
}
