//! `phrony run NS/NAME[@VERSION]`: start a session of an agent's active deployment (with
//! `--bundle`, of a bundle's root agent: `phrony bundles run`).
//!
//! The session runs in the background on the runtime; this prints `session <id> started`.
//! Before starting it, the CLI resolves the secrets the deployed version declares (`secrets:
//! <name>: fromEnv: VAR`): each variable is read from the process environment, else from the
//! `--env-file` files (dotenv format; a later file overrides an earlier one; the environment
//! overrides them all). Values are sent to the runtime, never printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use phrony_client::{AgentName, Client, RunSession, RunTarget, SessionMode, StartedSession};
use serde_json::{Value, json};

use crate::cmd::{Global, Output, agent_ref, attach, remote, render};

/// Arguments of `phrony run`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Secrets: each secret the deployed version declares (secrets.<name>.fromEnv: VAR) is read from
the environment variable VAR, else from the --env-file files (dotenv: KEY=VALUE, `export`,
quotes, # comments). The environment wins over the files; a later file wins over an earlier one.")]
pub(crate) struct Args {
    /// The agent: namespace/name, or namespace/name@version (which must be the active deployment);
    /// with --bundle, the bundle (its version may be a sha256: lock hash).
    pub(crate) agent: String,
    /// Run a bundle's root agent instead: the reference names a bundle (as `phrony bundles run`;
    /// the secrets are the union its members declare).
    #[arg(long)]
    pub(crate) bundle: bool,
    #[command(flatten)]
    pub(crate) options: Options,
}

/// What `phrony run` and `phrony bundles run` share: the session's input, labels and mode, the
/// env files secrets are resolved from, and what to do once it started.
#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// The session input: a JSON object or JSON string; any other text is sent as a JSON string.
    #[arg(long, value_name = "JSON|TEXT")]
    pub(crate) input: Option<String>,
    /// A label stored with the session (repeatable), usable as a `sessions ls --metadata` filter.
    #[arg(long = "metadata", value_name = "KEY=VALUE")]
    pub(crate) metadata: Vec<String>,
    /// Keep the session open after each turn (awaiting_input) instead of completing it.
    #[arg(long)]
    pub(crate) conversation: bool,
    /// A dotenv file to resolve secrets from (repeatable; later files win, the environment wins
    /// over all files).
    #[arg(short = 'e', long = "env-file", value_name = "FILE")]
    pub(crate) env_files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) output: Output,
    /// Attach to the session once started (a TUI on a terminal, else the plain renderer); the
    /// session runs as a conversation. Exits 1 when the session fails.
    #[arg(short = 'a', long)]
    pub(crate) attach: bool,
    /// With --attach: the plain line-oriented renderer even on a terminal (also: PHRONY_NO_TUI=1).
    #[arg(long, requires = "attach")]
    pub(crate) no_tui: bool,
}

/// Starts the session and prints `session <id> started`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let target = if args.bundle {
        RunTarget::Bundle
    } else {
        RunTarget::Agent
    };
    start(target, &args.agent, &args.options, global)
}

/// Starts a session of `reference` (an agent or a bundle, `namespace/name[@version]`) after
/// resolving the secrets its version declares, then prints `session <id> started` (a bundle's:
/// `session <id> started (status: <status>)`) or, with `--attach`, attaches to it.
pub(crate) fn start(
    target: RunTarget,
    reference: &str,
    options: &Options,
    global: &Global,
) -> anyhow::Result<()> {
    let plan = Plan::new(target, reference, options)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let started = plan.start(&client).await?;
        if options.attach {
            eprintln!("session {} started", started.session_id);
            return attach::run_attached(&client, &started.session_id, options.no_tui).await;
        }
        match options.output {
            Output::Json => render::json(&json!({
                "session_id": started.session_id,
                "agent_version_id": started.agent_version_id,
                "status": started.status,
            })),
            Output::Text => render::line(started_line(target, &started)),
        }
    })
}

/// `session <id> started`; for a bundle, with the status the runtime reported.
fn started_line(target: RunTarget, started: &StartedSession) -> String {
    match target {
        RunTarget::Agent => format!("session {} started", started.session_id),
        RunTarget::Bundle => format!(
            "session {} started (status: {})",
            started.session_id, started.status
        ),
    }
}

/// A checked run: everything that needs no runtime is parsed and read up front.
struct Plan {
    target: RunTarget,
    name: AgentName,
    version: Option<String>,
    input: Option<Value>,
    metadata: BTreeMap<String, String>,
    mode: SessionMode,
    /// Variables read from the env files, merged (later files override earlier ones).
    env_files: BTreeMap<String, String>,
}

impl Plan {
    fn new(target: RunTarget, reference: &str, options: &Options) -> anyhow::Result<Self> {
        let parsed = agent_ref::parse(reference)?;
        Ok(Self {
            target,
            name: parsed.agent,
            version: parsed.version,
            input: options.input.as_deref().map(parse_input).transpose()?,
            metadata: parse_metadata(&options.metadata)?,
            mode: if options.conversation || options.attach {
                SessionMode::Conversation
            } else {
                SessionMode::Task
            },
            env_files: read_env_files(&options.env_files)?,
        })
    }

    async fn start(self, client: &Client) -> anyhow::Result<StartedSession> {
        let (version, declared) = match self.target {
            RunTarget::Agent => {
                declared_secrets(client, &self.name, self.version.as_deref()).await?
            }
            RunTarget::Bundle => {
                bundle_secrets(client, &self.name, self.version.as_deref()).await?
            }
        };
        let secrets = resolve_secrets(&declared, &self.env_files, |name| std::env::var(name).ok())?;
        let run = RunSession {
            agent: self.name,
            target: self.target,
            // The version whose manifest the secrets were resolved for: a deploy between the
            // look-up and RunSession makes the runtime refuse the run (the explicit version is no
            // longer the active one) instead of sending these secrets to another version's
            // endpoints.
            version: Some(version),
            input: self.input,
            secrets,
            metadata: self.metadata,
            mode: self.mode,
        };
        let check = match run.target {
            RunTarget::Agent => format!("phrony sessions ls {}", run.agent),
            RunTarget::Bundle => "phrony sessions ls".to_owned(),
        };
        client
            .run_session(&run, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails("run", "the session", check))
    }
}

/// `--input`: a JSON object or string as is; other text as a JSON string. Text that looks like
/// a JSON object or array but does not parse is refused (a typo, not a message).
pub(crate) fn parse_input(text: &str) -> anyhow::Result<Value> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        bail!("--input must not be empty (omit --input to start without input)");
    }
    match serde_json::from_str::<Value>(trimmed) {
        Ok(value @ (Value::Object(_) | Value::String(_))) => Ok(value),
        Ok(Value::Array(_)) => {
            bail!("--input must be a JSON object or text, got a JSON array")
        }
        Ok(_) => Ok(Value::String(text.to_owned())),
        Err(e) if trimmed.starts_with(['{', '[', '"']) => {
            bail!("--input looks like JSON but does not parse: {e}")
        }
        Err(_) => Ok(Value::String(text.to_owned())),
    }
}

/// `--metadata key=value`, repeatable; the key must be non-empty and given once.
pub(crate) fn parse_metadata(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut metadata = BTreeMap::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--metadata {pair:?} must be key=value");
        };
        let key = key.trim();
        if key.is_empty() {
            bail!("--metadata {pair:?} has an empty key; expected key=value");
        }
        if metadata.insert(key.to_owned(), value.to_owned()).is_some() {
            bail!("--metadata key {key:?} is given more than once");
        }
    }
    Ok(metadata)
}

/// Reads the dotenv files in order; a later file's value overrides an earlier one's.
fn read_env_files(files: &[PathBuf]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut vars = BTreeMap::new();
    for file in files {
        vars.extend(read_env_file(file)?);
    }
    Ok(vars)
}

fn read_env_file(file: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let shown = file.display();
    let iter = dotenvy::from_path_iter(file).map_err(|e| anyhow!("read env file {shown}: {e}"))?;
    iter.map(|item| item.map_err(|e| anyhow!("env file {shown}: {}", env_file_error(&e))))
        .collect()
}

/// A dotenv parse error without the offending line's text (it may hold a secret value).
fn env_file_error(error: &dotenvy::Error) -> String {
    match error {
        dotenvy::Error::LineParse(_, index) => {
            format!("a line does not parse at character {index} (expected KEY=VALUE)")
        }
        other => other.to_string(),
    }
}

/// One secret the deployed version declares: its name and the variable holding its value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeclaredSecret {
    name: String,
    from_env: String,
}

/// The version that will run (`version`, else the active deployment) and the secrets it
/// declares.
async fn declared_secrets(
    client: &Client,
    agent: &AgentName,
    version: Option<&str>,
) -> anyhow::Result<(String, Vec<DeclaredSecret>)> {
    let version = match version {
        Some(v) => v.to_owned(),
        None => {
            client
                .active_version(agent)
                .await
                .map_err(remote::fails("run"))?
                .version
        }
    };
    let found = client
        .get_agent_version(agent, &version)
        .await
        .map_err(remote::fails("run"))?;
    let declared = secrets_of_manifest(&found.manifest_json)
        .with_context(|| format!("read the secrets of {agent}@{version}"))?;
    Ok((version, declared))
}

/// The bundle version that will run (`version`, else the active deployment) and the union of the
/// secrets its members declare (`GetBundleSecretRequirements`), sorted by name.
async fn bundle_secrets(
    client: &Client,
    bundle: &AgentName,
    version: Option<&str>,
) -> anyhow::Result<(String, Vec<DeclaredSecret>)> {
    let version = match version {
        Some(v) => v.to_owned(),
        None => {
            client
                .active_bundle(bundle)
                .await
                .map_err(remote::fails("run"))?
                .version
        }
    };
    let required = client
        .bundle_secret_requirements(bundle, Some(&version))
        .await
        .map_err(remote::fails("run"))?;
    let declared = required
        .into_iter()
        .map(|s| DeclaredSecret {
            name: s.name,
            from_env: s.from_env,
        })
        .collect();
    Ok((version, declared))
}

/// `secrets: {<name>: {fromEnv: VAR}}` of a stored manifest snapshot, sorted by name.
fn secrets_of_manifest(manifest_json: &str) -> anyhow::Result<Vec<DeclaredSecret>> {
    let manifest: Value = serde_json::from_str(manifest_json)
        .context("the runtime returned a stored manifest that is not JSON")?;
    let Some(secrets) = manifest.get("secrets") else {
        return Ok(Vec::new());
    };
    let Some(secrets) = secrets.as_object() else {
        bail!("the stored manifest's `secrets` is not an object");
    };
    let mut declared: Vec<DeclaredSecret> = secrets
        .iter()
        .map(|(name, def)| {
            let from_env = def
                .get("fromEnv")
                .and_then(Value::as_str)
                .ok_or_else(|| anyhow!("secret {name:?} of the stored manifest has no fromEnv"))?;
            Ok(DeclaredSecret {
                name: name.clone(),
                from_env: from_env.to_owned(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    declared.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(declared)
}

/// Each declared secret's value: the environment first, then the env files. An unset or empty
/// variable is an error naming the secret and the variable (every missing one is listed).
fn resolve_secrets(
    declared: &[DeclaredSecret],
    env_files: &BTreeMap<String, String>,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut resolved = BTreeMap::new();
    let mut missing = Vec::new();
    for secret in declared {
        let value = env(&secret.from_env).filter(|v| !v.is_empty()).or_else(|| {
            env_files
                .get(&secret.from_env)
                .filter(|v| !v.is_empty())
                .cloned()
        });
        match value {
            Some(value) => {
                resolved.insert(secret.name.clone(), value);
            }
            None => missing.push(secret),
        }
    }
    match missing.as_slice() {
        [] => Ok(resolved),
        [one] => bail!(
            "secret {:?}: environment variable {} is not set; set {} (or pass an --env-file defining it) and retry run",
            one.name,
            one.from_env,
            one.from_env
        ),
        many => bail!(
            "secrets not set: {}; set them (or pass an --env-file defining them) and retry run",
            many.iter()
                .map(|s| format!("{:?} (environment variable {})", s.name, s.from_env))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn error<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    #[test]
    fn input_is_json_object_or_string_else_text() {
        assert_eq!(
            parse_input(r#"{"message":"hi"}"#).unwrap(),
            json!({"message": "hi"})
        );
        assert_eq!(parse_input(r#""hi""#).unwrap(), json!("hi"));
        assert_eq!(
            parse_input("Refund ORD-1, please").unwrap(),
            json!("Refund ORD-1, please")
        );
        // Other JSON scalars are text the user typed.
        assert_eq!(parse_input("42").unwrap(), json!("42"));
        assert_eq!(parse_input("true").unwrap(), json!("true"));
    }

    #[test]
    fn a_bundle_run_reports_the_status_an_agent_run_does_not() {
        let started = StartedSession {
            session_id: "run_1".into(),
            agent_version_id: "av-1".into(),
            status: "running".into(),
        };
        assert_eq!(
            started_line(RunTarget::Agent, &started),
            "session run_1 started"
        );
        assert_eq!(
            started_line(RunTarget::Bundle, &started),
            "session run_1 started (status: running)"
        );
    }

    #[test]
    fn a_bundle_plan_parses_like_an_agent_plan() {
        use clap::Parser as _;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: Options,
        }
        let cli = Cli::parse_from(["x", "--input", "hi", "--metadata", "ticket=T-1", "-a"]);
        let plan = Plan::new(RunTarget::Bundle, "support/desk@sha256:0a1b", &cli.options).unwrap();
        assert_eq!(plan.target, RunTarget::Bundle);
        assert_eq!(plan.name, AgentName::new("support", "desk"));
        assert_eq!(plan.version.as_deref(), Some("sha256:0a1b"));
        assert_eq!(plan.mode, SessionMode::Conversation, "--attach converses");
        assert_eq!(plan.metadata["ticket"], "T-1");
        assert_eq!(
            error(Plan::new(RunTarget::Bundle, "desk", &cli.options).map(|_| ())),
            r#"agent must be namespace/name, got "desk""#
        );
    }

    #[test]
    fn malformed_json_input_is_refused() {
        assert!(error(parse_input(r#"{"message": "#)).starts_with("--input looks like JSON"));
        assert_eq!(
            error(parse_input("[1, 2]")),
            "--input must be a JSON object or text, got a JSON array"
        );
        assert!(error(parse_input("  ")).starts_with("--input must not be empty"));
    }

    #[test]
    fn metadata_is_key_value() {
        let pairs = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let parsed = parse_metadata(&pairs(&["ticket=T-1", "note=a=b", "empty="])).unwrap();
        assert_eq!(parsed["ticket"], "T-1");
        assert_eq!(parsed["note"], "a=b");
        assert_eq!(parsed["empty"], "");
        assert_eq!(
            error(parse_metadata(&pairs(&["ticket"]))),
            r#"--metadata "ticket" must be key=value"#
        );
        assert!(error(parse_metadata(&pairs(&["=x"]))).contains("empty key"));
        assert!(error(parse_metadata(&pairs(&["a=1", "a=2"]))).contains("more than once"));
    }

    #[test]
    fn secrets_come_from_the_environment_then_the_env_files() {
        let declared = secrets_of_manifest(
            r#"{"secrets":{"openai":{"fromEnv":"OPENAI_API_KEY"},"crm":{"fromEnv":"CRM_TOKEN"}}}"#,
        )
        .unwrap();
        assert_eq!(declared[0].name, "crm");
        let files: BTreeMap<String, String> = [
            ("OPENAI_API_KEY".to_owned(), "from-file".to_owned()),
            ("CRM_TOKEN".to_owned(), "crm-file".to_owned()),
        ]
        .into_iter()
        .collect();
        let env = |name: &str| (name == "OPENAI_API_KEY").then(|| "from-env".to_owned());
        let resolved = resolve_secrets(&declared, &files, env).unwrap();
        assert_eq!(resolved["openai"], "from-env");
        assert_eq!(resolved["crm"], "crm-file");
        // An empty environment value does not hide the file's.
        let empty = |_: &str| Some(String::new());
        assert_eq!(
            resolve_secrets(&declared, &files, empty).unwrap()["openai"],
            "from-file"
        );
    }

    #[test]
    fn a_missing_secret_names_the_secret_and_the_variable_not_values() {
        let declared =
            secrets_of_manifest(r#"{"secrets":{"openai":{"fromEnv":"OPENAI_API_KEY"}}}"#).unwrap();
        let none = |_: &str| None;
        assert_eq!(
            error(resolve_secrets(&declared, &BTreeMap::new(), none)),
            "secret \"openai\": environment variable OPENAI_API_KEY is not set; set OPENAI_API_KEY \
             (or pass an --env-file defining it) and retry run"
        );
        assert!(
            secrets_of_manifest(r#"{"kind":"Agent"}"#)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn env_files_layer_and_report_unreadable_files() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.env");
        let local = dir.path().join("local.env");
        std::fs::write(&base, "# base\nexport A=base\nB=\"quoted value\"\n").unwrap();
        std::fs::write(&local, "A=local\n").unwrap();
        let vars = read_env_files(&[base.clone(), local]).unwrap();
        assert_eq!(vars["A"], "local");
        assert_eq!(vars["B"], "quoted value");
        let missing = dir.path().join("nope.env");
        assert!(
            error(read_env_files(&[missing])).starts_with("read env file "),
            "missing file"
        );
        let bad = dir.path().join("bad.env");
        std::fs::write(&bad, "SECRET_VALUE sk-123\n").unwrap();
        let shown = error(read_env_files(&[bad]));
        assert!(shown.contains("bad.env"), "{shown}");
        assert!(!shown.contains("sk-123"), "{shown}");
    }
}
