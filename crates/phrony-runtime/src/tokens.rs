//! `phrony-runtime tokens create|list|revoke`: API tokens on the daemon's database.
//!
//! They work whether the daemon runs or not (the daemon looks each presented token up on every
//! RPC, so a new token works at once and a revoked one stops on the next call). The secret is
//! generated here from the operating system's generator, printed once as the last line of
//! `create`'s output, and never stored: the ledger keeps its SHA-256. `list` never prints
//! secrets. Creating a token records `token.created` (by `PHRONY_ACTOR`, else `anonymous`),
//! revoking it `token.revoked`, in the ledger's `tokens` stream.

use std::io::Write;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand};
use phrony_auth::{Role, TOKEN_RANDOM_BYTES, TokenSecret, ToolPattern};
use phrony_ledger::{ApiToken, Ledger, NewApiToken};
use rand::TryRngCore as _;

/// The longest `--expires` accepted (ten years).
const MAX_EXPIRY: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// `phrony-runtime tokens …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum TokensCommand {
    /// Create a token; prints its secret once, as the last line.
    Create(CreateArgs),
    /// List the tokens (never their secrets).
    List,
    /// Revoke a token by name; it stops working on the next RPC.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// `tokens create`.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct CreateArgs {
    /// The token's name: the principal its requests are recorded as (unique).
    #[arg(long)]
    pub name: String,
    /// A role: viewer, runner, approver, publisher, worker, relay or admin (repeatable).
    #[arg(long = "role", required = true, value_name = "ROLE")]
    pub roles: Vec<String>,
    /// An approval route an approver may vote on (repeatable; none: every route).
    #[arg(long = "route", value_name = "ROUTE")]
    pub routes: Vec<String>,
    /// A tool a worker may serve, TOOL[@VERSION] with `*` wildcards (repeatable).
    #[arg(long = "tool", value_name = "PATTERN")]
    pub tools: Vec<String>,
    /// How long the token works, e.g. 30d, 12h, 90m (default: until revoked).
    #[arg(long, value_name = "DURATION")]
    pub expires: Option<String>,
}

/// Runs `command` on `ledger`, writing to `out`; `actor` is recorded as who did it.
///
/// # Errors
/// A bad argument (named), or the ledger's refusal (duplicate name, unknown token, …).
pub async fn run(
    ledger: &Ledger,
    command: &TokensCommand,
    actor: &str,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match command {
        TokensCommand::Create(args) => {
            let random = random_bytes()?;
            let (token, secret) = create(ledger, args, actor, Utc::now(), random).await?;
            writeln!(
                out,
                "created token {:?} (roles: {}; expires: {})",
                token.name,
                roles(&token),
                token.expires_at.map_or_else(|| "never".to_owned(), ts)
            )?;
            writeln!(
                out,
                "the secret is shown once; store it now (send it as `authorization: Bearer \
                 <secret>`, PHRONY_TOKEN for the CLI):"
            )?;
            writeln!(out, "{}", secret.expose())?;
        }
        TokensCommand::List => {
            let tokens = ledger.list_api_tokens().await.context("list tokens")?;
            write_table(out, &tokens)?;
        }
        TokensCommand::Revoke { name } => {
            let token = ledger
                .revoke_api_token(name, actor)
                .await
                .with_context(|| format!("revoke token {name:?}"))?;
            writeln!(out, "revoked token {:?}", token.name)?;
        }
    }
    Ok(())
}

fn random_bytes() -> anyhow::Result<[u8; TOKEN_RANDOM_BYTES]> {
    let mut bytes = [0_u8; TOKEN_RANDOM_BYTES];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot draw random bytes for the token: {e}"))?;
    Ok(bytes)
}

/// Checks `args` and stores the token made of `random`; returns it with its secret.
///
/// # Errors
/// A bad role, tool pattern or duration (named), or the ledger's refusal.
pub async fn create(
    ledger: &Ledger,
    args: &CreateArgs,
    actor: &str,
    now: DateTime<Utc>,
    random: [u8; TOKEN_RANDOM_BYTES],
) -> anyhow::Result<(ApiToken, TokenSecret)> {
    let mut roles = Vec::new();
    for r in &args.roles {
        let role: Role = r.parse().with_context(|| "--role")?;
        if !roles.contains(&role) {
            roles.push(role);
        }
    }
    let tools = args
        .tools
        .iter()
        .map(|t| ToolPattern::parse(t))
        .collect::<Result<Vec<_>, _>>()
        .context("--tool")?;
    let expires_at = match &args.expires {
        None => None,
        Some(text) => {
            let d = humantime::parse_duration(text.trim()).with_context(|| {
                format!("--expires {text:?}: expected a duration such as 30d, 12h or 90m")
            })?;
            if d.is_zero() || d > MAX_EXPIRY {
                anyhow::bail!("--expires {text:?}: must be more than 0s and at most 10 years");
            }
            let d = chrono::Duration::from_std(d).context("--expires")?;
            Some(now + d)
        }
    };
    let secret = TokenSecret::from_random(random);
    let token = ledger
        .create_api_token(NewApiToken {
            name: args.name.clone(),
            secret_hash: secret.hash(),
            roles,
            routes: args.routes.clone(),
            tools,
            expires_at,
            created_by: actor.to_owned(),
        })
        .await
        .with_context(|| format!("create token {:?}", args.name))?;
    Ok((token, secret))
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn roles(token: &ApiToken) -> String {
    token
        .roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn list_or(values: &[String], empty: &str) -> String {
    if values.is_empty() {
        empty.to_owned()
    } else {
        values.join(",")
    }
}

/// The `tokens list` table: name, roles, routes, tools, created, expires, revoked.
fn write_table(out: &mut impl Write, tokens: &[ApiToken]) -> std::io::Result<()> {
    let header = [
        "NAME", "ROLES", "ROUTES", "TOOLS", "CREATED", "EXPIRES", "REVOKED",
    ]
    .map(str::to_owned);
    let mut rows = vec![header];
    for t in tokens {
        let tools: Vec<String> = t.tools.iter().map(ToString::to_string).collect();
        rows.push([
            t.name.clone(),
            roles(t),
            list_or(&t.routes, "any"),
            list_or(&tools, "-"),
            format!("{} by {}", ts(t.created_at), t.created_by),
            t.expires_at.map_or_else(|| "never".to_owned(), ts),
            match (&t.revoked_at, &t.revoked_by) {
                (Some(at), by) => format!("{} by {}", ts(*at), by.as_deref().unwrap_or("?")),
                (None, _) => "-".to_owned(),
            },
        ]);
    }
    if tokens.is_empty() {
        return writeln!(
            out,
            "no tokens (create one with `phrony-runtime tokens create`)"
        );
    }
    let mut widths = [0_usize; 7];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    async fn ledger() -> Ledger {
        let ledger = Ledger::connect("sqlite::memory:").await.unwrap();
        ledger.migrate().await.unwrap();
        ledger
    }

    fn args(name: &str, roles: &[&str]) -> CreateArgs {
        CreateArgs {
            name: name.into(),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            routes: vec![],
            tools: vec![],
            expires: None,
        }
    }

    #[tokio::test]
    async fn create_prints_the_secret_last_and_list_never_prints_it() {
        let ledger = ledger().await;
        let mut out = Vec::new();
        let mut create = args("ci-publisher", &["publisher", "viewer"]);
        create.expires = Some("30d".into());
        run(&ledger, &TokensCommand::Create(create), "ops", &mut out)
            .await
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        let last = text.lines().last().unwrap();
        let secret = TokenSecret::parse(last).unwrap();
        let stored = ledger
            .find_api_token_by_hash(&secret.hash())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.name, "ci-publisher");
        assert_eq!(stored.created_by, "ops");
        let days = (stored.expires_at.unwrap() - stored.created_at).num_days();
        assert!((29..=30).contains(&days), "{days}");

        let mut out = Vec::new();
        run(&ledger, &TokensCommand::List, "ops", &mut out)
            .await
            .unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(table.starts_with("NAME"), "{table}");
        assert!(table.contains("ci-publisher"), "{table}");
        assert!(table.contains("publisher,viewer"), "{table}");
        assert!(!table.contains(secret.expose()), "{table}");
        assert!(!table.contains(&secret.hash()), "{table}");

        let mut out = Vec::new();
        run(
            &ledger,
            &TokensCommand::Revoke {
                name: "ci-publisher".into(),
            },
            "ciso",
            &mut out,
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        run(&ledger, &TokensCommand::List, "ops", &mut out)
            .await
            .unwrap();
        assert!(String::from_utf8(out).unwrap().contains("by ciso"));
    }

    #[tokio::test]
    async fn bad_arguments_are_named() {
        let ledger = ledger().await;
        let now = Utc::now();
        let err = |a: CreateArgs| {
            let ledger = ledger.clone();
            async move {
                format!(
                    "{:#}",
                    create(&ledger, &a, "ops", now, [9; 32]).await.unwrap_err()
                )
            }
        };
        assert!(
            err(args("x", &["root"]))
                .await
                .contains("unknown role \"root\"")
        );
        let mut a = args("x", &["worker"]);
        a.tools = vec!["a@b@c".into()];
        assert!(err(a).await.contains("--tool"));
        let mut a = args("x", &["viewer"]);
        a.expires = Some("soon".into());
        assert!(err(a).await.contains("--expires \"soon\""));
        let mut a = args("x", &["viewer"]);
        a.expires = Some("0s".into());
        assert!(err(a).await.contains("more than 0s"));
        assert!(
            err(args("system", &["viewer"]))
                .await
                .contains("token name")
        );
        let mut out = Vec::new();
        let unknown = run(
            &ledger,
            &TokensCommand::Revoke {
                name: "ghost".into(),
            },
            "ops",
            &mut out,
        )
        .await
        .unwrap_err();
        assert!(format!("{unknown:#}").contains("no API token named \"ghost\""));
    }
}
