//! MCP-backed tool bindings (§4.10): the call goes to the binding's MCP server over Streamable
//! HTTP (`phrony-mcp`) instead of a worker, with the same governance — the call reaches this
//! module only after argument validation, policy and approvals, and it is journaled
//! `dispatched` (worker id `mcp:<server>`) before anything is sent.
//!
//! - One client per server per session ([`crate::mcp_clients::McpClients`]), connected on first use with the auth
//!   header built from the session's secrets; a failure drops it, so the next call
//!   initialises a new MCP session.
//! - The result: `isError` → tool error `mcp_tool_error` (the joined text), else
//!   `structuredContent`, else the content array. A refusal the server answered (HTTP 4xx, a
//!   JSON-RPC error, an unreachable server: nothing ran) is a tool error with its code; a tool
//!   the server does not list is `mcp_unknown_tool`.
//! - A server that forgot the MCP session (HTTP 404 to its id: it did not process the call)
//!   gets a new session and the call once more.
//! - No answer after sending (transport error, HTTP 5xx, the execution deadline): the outcome
//!   is unknown and routed like a lost worker (`dispatch:indeterminate`, by side-effect class;
//!   a write is never sent again without a human).
//! - After a restart a call left `dispatched` to an MCP server has no worker to wait for: it is
//!   handled by side-effect class at once.
//!
//! Secrets never reach an event, a log line or an error: header values are marked sensitive
//! and errors name the server's URL and the header, never the value.

use std::sync::Arc;
use std::time::Duration;

use phrony_ledger::{CallStatus, Dispatch, ToolInvocation, ToolOutcome, ToolResult};
use phrony_manifest::{McpRef, McpServer, ToolBinding};
use phrony_mcp::{CallOutcome, Client, Endpoint, McpError};
use secrecy::ExposeSecret as _;

use super::{Failure, safe_class};
use crate::driver::{CallStop, Ctx};
use crate::error::ErrorKind;

/// The prefix of the worker id an MCP call is recorded with (`mcp:<server>`).
pub(crate) const WORKER_PREFIX: &str = "mcp:";

/// The tool-error code of a result the server marked `isError`.
const MCP_TOOL_ERROR: &str = "mcp_tool_error";
/// The tool-error code of a call to a tool the server does not list.
const MCP_UNKNOWN_TOOL: &str = "mcp_unknown_tool";
/// The tool-error code of a binding whose server or secret cannot be used.
const MCP_CONFIG_ERROR: &str = "mcp_config_error";

/// Why an MCP call produced no answer.
enum Attempt {
    /// The server's answer, or a failure [`McpError::outcome_unknown`] classifies.
    Mcp(McpError, Option<Arc<Client>>),
    /// The execution deadline passed after the request may have been sent.
    Timeout(Duration),
    /// The binding cannot be used (its server or secret): nothing was sent.
    Config(String),
}

impl Ctx {
    /// Sends a queued MCP-backed call and records its outcome.
    pub(super) async fn dispatch_mcp(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        mcp: &McpRef,
        timeout: Duration,
        after_hitl: bool,
    ) -> Result<(), CallStop> {
        let worker_id = format!("{WORKER_PREFIX}{}", mcp.server);
        let remote = if mcp.tool.is_empty() { wire } else { &mcp.tool };
        let deadline_at = chrono::Duration::from_std(timeout)
            .ok()
            .map(|d| self.now() + d);
        // Journaled before anything is sent: a crash from here on leaves it `dispatched`.
        self.store()
            .dispatch_tool_call(
                &call.call_id,
                Dispatch {
                    worker_id: worker_id.clone(),
                    worker_identity: None,
                    image_digest: None,
                    descriptor_hash: None,
                    deadline_at,
                },
            )
            .await?;
        let server = self
            .agent
            .spec
            .mcp_servers
            .iter()
            .find(|s| s.name == mcp.server);
        let attempt = async {
            let Some(server) = server else {
                return Err(Attempt::Config(format!(
                    "MCP server {:?} is not declared in spec.mcp_servers",
                    mcp.server
                )));
            };
            let client = self.mcp_client(server).await?;
            match client.call_tool(remote, &call.args).await {
                Ok(out) => Ok(out),
                // The server forgot the session (it restarted): the call was not processed, so
                // it is sent once more on a new session.
                Err(McpError::SessionExpired { .. }) => {
                    self.mcp.reset(&server.name, Some(&client)).await;
                    let client = self.mcp_client(server).await?;
                    match client.call_tool(remote, &call.args).await {
                        Ok(out) => Ok(out),
                        Err(e) => Err(Attempt::Mcp(e, Some(client))),
                    }
                }
                Err(e) => Err(Attempt::Mcp(e, Some(client))),
            }
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(timeout, attempt) => r.unwrap_or(Err(Attempt::Timeout(timeout))),
            () = self.live.cancel.cancelled() => {
                self.mcp.reset(&mcp.server, None).await;
                return Err(CallStop::Stopped);
            }
        };
        let failure = match outcome {
            Ok(CallOutcome::Success(value)) => {
                return self
                    .record_mcp(call, &worker_id, ToolOutcome::Success(value))
                    .await;
            }
            Ok(CallOutcome::ToolError(text)) => {
                let message = if text.trim().is_empty() {
                    format!("MCP tool {remote:?} reported an error without text")
                } else {
                    text
                };
                return self
                    .record_mcp(call, &worker_id, tool_error(MCP_TOOL_ERROR, message))
                    .await;
            }
            Err(failure) => failure,
        };
        match failure {
            Attempt::Config(message) => {
                self.record_mcp(call, &worker_id, tool_error(MCP_CONFIG_ERROR, message))
                    .await
            }
            Attempt::Mcp(e, client) if !e.outcome_unknown() => {
                let (code, message) = match (&e, client.as_deref()) {
                    (McpError::Rpc { .. }, Some(c)) => {
                        match self.unknown_tool(c, remote, &mcp.server, timeout).await {
                            Some(message) => (MCP_UNKNOWN_TOOL, message),
                            None => (e.code(), e.to_string()),
                        }
                    }
                    _ => (e.code(), e.to_string()),
                };
                if !matches!(e, McpError::Rpc { .. }) {
                    self.mcp.reset(&mcp.server, client.as_ref()).await;
                }
                self.record_mcp(call, &worker_id, tool_error(code, message))
                    .await
            }
            Attempt::Mcp(e, client) => {
                self.mcp.reset(&mcp.server, client.as_ref()).await;
                let message = format!(
                    "outcome of tool {}@{} is unknown: {e}",
                    call.tool, call.version
                );
                tracing::warn!(call_id = %call.call_id, server = %mcp.server, error = %e, "MCP call outcome unknown");
                self.dispatch_failed(
                    call,
                    binding,
                    wire,
                    Failure::McpUnknown(message),
                    after_hitl,
                )
                .await
            }
            Attempt::Timeout(after) => {
                self.mcp.reset(&mcp.server, None).await;
                let message = format!(
                    "tool {}@{} did not finish within {after:?} on MCP server {:?}",
                    call.tool, call.version, mcp.server
                );
                tracing::warn!(call_id = %call.call_id, server = %mcp.server, "MCP call timed out");
                self.dispatch_failed(
                    call,
                    binding,
                    wire,
                    Failure::McpUnknown(message),
                    after_hitl,
                )
                .await
            }
        }
    }

    /// The server's client, connecting (and initialising) it on first use.
    async fn mcp_client(&self, server: &McpServer) -> Result<Arc<Client>, Attempt> {
        let slot = self.mcp.slot(&server.name);
        let mut current = slot.lock().await;
        if let Some(client) = current.as_ref() {
            return Ok(Arc::clone(client));
        }
        let endpoint = self.mcp_endpoint(server).await?;
        let client = Arc::new(
            Client::connect(endpoint)
                .await
                .map_err(|e| Attempt::Mcp(e, None))?,
        );
        *current = Some(Arc::clone(&client));
        Ok(client)
    }

    /// The server's URL and auth header, from the session's secrets.
    async fn mcp_endpoint(&self, server: &McpServer) -> Result<Endpoint, Attempt> {
        let endpoint = Endpoint::new(&server.url).map_err(|e| Attempt::Config(e.to_string()))?;
        let Some(auth) = &server.auth else {
            return Ok(endpoint);
        };
        let secrets = self
            .store()
            .load_secrets(&self.session.id)
            .await
            .map_err(|e| Attempt::Config(format!("the session's secrets cannot be read: {e}")))?;
        let Some(secret) = secrets.iter().find(|s| s.name == auth.secret) else {
            return Err(Attempt::Config(format!(
                "secret {:?} for MCP server {:?} was not provided to the session",
                auth.secret, server.name
            )));
        };
        let Ok(value) = std::str::from_utf8(secret.value.expose_secret()) else {
            return Err(Attempt::Config(format!(
                "secret {:?} for MCP server {:?} is not UTF-8 text",
                auth.secret, server.name
            )));
        };
        let endpoint = match auth.scheme.as_str() {
            "bearer" => endpoint.bearer(value),
            "header" => endpoint.header(&auth.header, value),
            other => {
                return Err(Attempt::Config(format!(
                    "MCP server {:?}: unknown auth scheme {other:?}",
                    server.name
                )));
            }
        };
        endpoint.map_err(|e| Attempt::Config(e.to_string()))
    }

    /// When the server refused a call and does not list `remote`: the message saying so.
    /// The listing is bounded by the same deadline as a call; without an answer in time the
    /// server's own error stands.
    async fn unknown_tool(
        &self,
        client: &Client,
        remote: &str,
        server: &str,
        timeout: Duration,
    ) -> Option<String> {
        let tools = tokio::time::timeout(timeout, client.list_tools())
            .await
            .ok()?
            .ok()?;
        if tools.iter().any(|t| t.name == remote) {
            return None;
        }
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).take(20).collect();
        names.sort_unstable();
        Some(format!(
            "MCP server {server:?} has no tool {remote:?} (it lists: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ))
    }

    /// Records the call's outcome, holding it while the database cannot write.
    async fn record_mcp(
        &self,
        call: &ToolInvocation,
        worker_id: &str,
        outcome: ToolOutcome,
    ) -> Result<(), CallStop> {
        let result = ToolResult {
            worker_id: Some(worker_id.to_owned()),
            outcome,
            usage: None,
        };
        loop {
            match self
                .store()
                .record_tool_result(&call.call_id, result.clone())
                .await
            {
                Ok(_) => break,
                Err(e) if e.kind == ErrorKind::Unavailable => {
                    tracing::warn!(call_id = %call.call_id, error = %e, "MCP result held: database unavailable");
                    if !self.store().until_writable(&self.live.cancel).await {
                        return Err(CallStop::Stopped);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.notify();
        Ok(())
    }

    /// A call that was with an MCP server when the runtime stopped: no worker will report it,
    /// so it is handled by side-effect class at once — reads and idempotent writes are sent
    /// again (same call id), other calls go to an outcome review.
    pub(super) async fn recover_mcp_dispatched(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
    ) -> Result<(), CallStop> {
        if safe_class(binding) {
            let queued = self.store().queue_tool_call(&call.call_id).await?;
            return self.dispatch(&queued, binding, wire, false).await;
        }
        let reason = format!(
            "the runtime restarted while the call was with MCP server {:?}",
            call.worker_id
                .as_deref()
                .and_then(|w| w.strip_prefix(WORKER_PREFIX))
                .unwrap_or("unknown")
        );
        let current = self
            .store()
            .mark_tool_call_indeterminate(&call.call_id, &reason)
            .await?;
        if current.status != CallStatus::Indeterminate {
            return Box::pin(self.drive_call(current, crate::driver::Recorded::Earlier)).await;
        }
        self.unknown_outcome(&current, binding, wire, &reason, None)
            .await
    }
}

fn tool_error(code: &str, message: String) -> ToolOutcome {
    ToolOutcome::Error {
        code: code.to_owned(),
        message,
    }
}
