//! The API token store: `api_tokens` rows and the `tokens` audit stream.
//!
//! A token's row holds what the daemon needs to authenticate a request (the secret's hash, the
//! roles, routes and tool patterns, the expiry and the revocation); the secret itself is never
//! stored and the caller (`phrony-runtime tokens create`) generates it. Creating and revoking a
//! token each append one event to the [`TOKENS_STREAM`] stream in the same transaction as the row
//! change; the payloads carry neither the secret nor its hash. The table is not a projection
//! (the hash is in no event), so [`crate::Ledger::rebuild_projections`] leaves it alone.

use chrono::{DateTime, Utc};
use phrony_auth::{Actor, Role, ToolPattern};

use crate::db::{Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{EventBody, TokenCreated, TokenRevoked};
use crate::events::{append, lock_stream};

/// The audit stream of token creations and revocations.
pub const TOKENS_STREAM: &str = "tokens";

/// A token to create. The caller generated the secret and passes only its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiToken {
    /// The token's name: the principal its requests are recorded as. Must pass
    /// [`Actor::parse`]; unique, case-insensitively.
    pub name: String,
    /// `phrony_auth::hash_secret` of the secret (64 lowercase hex digits).
    pub secret_hash: String,
    /// What the token may do (at least one role).
    pub roles: Vec<Role>,
    /// The approval routes an approver token may vote on; empty means every route.
    pub routes: Vec<String>,
    /// The tools a worker token may serve.
    pub tools: Vec<ToolPattern>,
    /// When the token stops working; `None` means never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Who created it (recorded as the event's actor).
    pub created_by: String,
}

/// A stored token, without its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// The token's name (the principal).
    pub name: String,
    /// Its roles.
    pub roles: Vec<Role>,
    /// Its approval routes (empty: every route).
    pub routes: Vec<String>,
    /// Its tool patterns.
    pub tools: Vec<ToolPattern>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Who created it.
    pub created_by: String,
    /// When it stops working, if ever.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Who revoked it.
    pub revoked_by: Option<String>,
}

impl NewApiToken {
    /// Checks the name, the hash, the roles and the routes.
    pub(crate) fn validate(&self) -> Result<()> {
        Actor::parse(&self.name)
            .map_err(|e| LedgerError::invalid(format!("token name {:?}: {e}", self.name)))?;
        let hex = self.secret_hash.len() == 64
            && self
                .secret_hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(LedgerError::invalid(
                "secret_hash must be 64 lowercase hex digits (the SHA-256 of the secret)",
            ));
        }
        if self.roles.is_empty() {
            return Err(LedgerError::invalid("a token needs at least one role"));
        }
        for route in &self.routes {
            if route.trim().is_empty() || route.trim() != route || route.len() > 256 {
                return Err(LedgerError::invalid(format!(
                    "route {route:?} must be 1-256 characters without edge whitespace"
                )));
            }
        }
        if self.created_by.trim().is_empty() {
            return Err(LedgerError::invalid("created_by is required"));
        }
        Ok(())
    }
}

const COLUMNS: &str =
    "name, roles, routes, tools, created_at, created_by, expires_at, revoked_at, revoked_by";

fn strings(row: &Row, column: &str) -> Result<Vec<String>> {
    serde_json::from_str(&row.text(column)?)
        .map_err(|e| LedgerError::corrupt(format!("api_tokens.{column}: {e}")))
}

fn token_from_row(row: &Row) -> Result<ApiToken> {
    let name = row.text("name")?;
    let roles = strings(row, "roles")?
        .iter()
        .map(|r| r.parse::<Role>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| LedgerError::corrupt(format!("api_tokens.roles of {name:?}: {e}")))?;
    let tools = strings(row, "tools")?
        .iter()
        .map(|t| ToolPattern::parse(t))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| LedgerError::corrupt(format!("api_tokens.tools of {name:?}: {e}")))?;
    Ok(ApiToken {
        roles,
        routes: strings(row, "routes")?,
        tools,
        created_at: row.ts("created_at")?,
        created_by: row.text("created_by")?,
        expires_at: row.opt_ts("expires_at")?,
        revoked_at: row.opt_ts("revoked_at")?,
        revoked_by: row.opt_text("revoked_by")?,
        name,
    })
}

fn json_strings(values: impl IntoIterator<Item = String>) -> String {
    serde_json::Value::Array(values.into_iter().map(serde_json::Value::String).collect())
        .to_string()
}

async fn find_by_name(conn: &mut Conn<'_>, name: &str) -> Result<Option<ApiToken>> {
    let sql = format!("SELECT {COLUMNS} FROM api_tokens WHERE lower(name) = lower($1)");
    conn.fetch_optional("read API token", &sql, args![name])
        .await?
        .map(|row| token_from_row(&row))
        .transpose()
}

pub(crate) async fn find_by_hash(conn: &mut Conn<'_>, hash: &str) -> Result<Option<ApiToken>> {
    let sql = format!("SELECT {COLUMNS} FROM api_tokens WHERE secret_hash = $1");
    conn.fetch_optional("find API token", &sql, args![hash])
        .await?
        .map(|row| token_from_row(&row))
        .transpose()
}

pub(crate) async fn list(conn: &mut Conn<'_>) -> Result<Vec<ApiToken>> {
    let sql = format!("SELECT {COLUMNS} FROM api_tokens ORDER BY created_at, name");
    conn.fetch_all("list API tokens", &sql, vec![])
        .await?
        .iter()
        .map(token_from_row)
        .collect()
}

pub(crate) async fn create(tx: &mut Tx, new: &NewApiToken) -> Result<ApiToken> {
    let mut head = lock_stream(tx, TOKENS_STREAM).await?;
    if let Some(existing) = find_by_name(&mut tx.conn(), &new.name).await? {
        return Err(LedgerError::AlreadyExists {
            message: format!(
                "an API token named {:?} already exists (names are unique, ignoring case; \
                 revoked tokens keep their name)",
                existing.name
            ),
        });
    }
    let taken = tx
        .conn()
        .fetch_optional(
            "check API token hash",
            "SELECT name FROM api_tokens WHERE secret_hash = $1",
            args![&new.secret_hash],
        )
        .await?;
    if taken.is_some() {
        return Err(LedgerError::AlreadyExists {
            message: "another API token has the same secret; generate a new secret".to_owned(),
        });
    }
    let roles: Vec<String> = new.roles.iter().map(|r| r.as_str().to_owned()).collect();
    let tools: Vec<String> = new.tools.iter().map(ToString::to_string).collect();
    let payload = TokenCreated {
        name: new.name.clone(),
        roles: roles.clone(),
        routes: new.routes.clone(),
        tools: tools.clone(),
        expires_at: new.expires_at,
    };
    let event = append(
        tx,
        &mut head,
        EventBody::TokenCreated(payload).into_new_event(new.created_by.as_str())?,
    )
    .await?;
    tx.conn()
        .execute(
            "create API token",
            "INSERT INTO api_tokens (name, secret_hash, roles, routes, tools, created_at, \
             created_by, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            args![
                &new.name,
                &new.secret_hash,
                json_strings(roles),
                json_strings(new.routes.clone()),
                json_strings(tools),
                event.ts,
                &new.created_by,
                new.expires_at
            ],
        )
        .await?;
    Ok(ApiToken {
        name: new.name.clone(),
        roles: new.roles.clone(),
        routes: new.routes.clone(),
        tools: new.tools.clone(),
        created_at: event.ts,
        created_by: new.created_by.clone(),
        expires_at: new.expires_at,
        revoked_at: None,
        revoked_by: None,
    })
}

pub(crate) async fn revoke(tx: &mut Tx, name: &str, actor: &str) -> Result<ApiToken> {
    let mut head = lock_stream(tx, TOKENS_STREAM).await?;
    let Some(token) = find_by_name(&mut tx.conn(), name).await? else {
        return Err(LedgerError::not_found(format!(
            "no API token named {name:?} (see `phrony-runtime tokens list`)"
        )));
    };
    if let Some(at) = token.revoked_at {
        return Err(LedgerError::precondition(format!(
            "API token {:?} was already revoked at {} by {}",
            token.name,
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            token.revoked_by.as_deref().unwrap_or("?")
        )));
    }
    let event = append(
        tx,
        &mut head,
        EventBody::TokenRevoked(TokenRevoked {
            name: token.name.clone(),
        })
        .into_new_event(actor)?,
    )
    .await?;
    let rows = tx
        .conn()
        .execute(
            "revoke API token",
            "UPDATE api_tokens SET revoked_at = $2, revoked_by = $3 \
             WHERE name = $1 AND revoked_at IS NULL",
            args![&token.name, event.ts, actor],
        )
        .await?;
    if rows != 1 {
        return Err(LedgerError::Conflict {
            message: format!("API token {:?} changed concurrently", token.name),
        });
    }
    Ok(ApiToken {
        revoked_at: Some(event.ts),
        revoked_by: Some(actor.to_owned()),
        ..token
    })
}
