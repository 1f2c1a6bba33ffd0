//! A small client of the Model Context Protocol over Streamable HTTP, **POST only** (no
//! standalone SSE stream, no resumption): `initialize` (+ `notifications/initialized`),
//! `tools/list` (all pages) and `tools/call`, with the client identity `phrony-runtime`.
//!
//! Written against the 2025-06-18 revision of the transport: every message is one HTTP POST
//! with `Accept: application/json, text/event-stream`; the answer is a JSON body or an SSE
//! stream that carries it (server requests and notifications on that stream are skipped).
//! `Mcp-Session-Id` and `MCP-Protocol-Version` are sent back as the transport requires.
//!
//! Bounds: one HTTP response body (JSON, or the SSE stream up to the answer) is at most
//! [`MAX_RESPONSE_BYTES`] (4 MiB, the largest worker message the runtime accepts);
//! `tools/list` follows at most [`MAX_TOOL_PAGES`] cursors. Server responses are input: a
//! malformed or oversized one is an error naming the server, never a panic.
//!
//! What a failure means for a call that may have taken effect is [`McpError::outcome_unknown`]:
//! the runtime routes those by side-effect class, everything else is the server's answer.
//! Auth header values are marked sensitive and never appear in an error or `Debug` output.
//!
//! Why not `rmcp`: its 3.x client (on reqwest 0.13, like the workspace) speaks the 2026-07-28
//! draft first (`server/discover`, multi-round tool calls, tasks) and, on an expired session,
//! re-initialises and re-sends POSTs itself. The runtime must decide every re-send of a call
//! whose outcome may be known or unknown, so it keeps this subset (a few hundred lines) in its
//! own hands, over the reqwest it already links; no dependency was added.

use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use url::Url;

/// The MCP revision this client speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// The client name sent in `initialize`.
pub const CLIENT_NAME: &str = "phrony-runtime";
/// The client version sent in `initialize` (the reference's).
pub const CLIENT_VERSION: &str = "v1";
/// The largest HTTP response body read from a server (JSON, or an SSE stream up to the answer).
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// The most `tools/list` pages followed.
pub const MAX_TOOL_PAGES: usize = 100;
/// How much of an HTTP error body is quoted in an error.
const MAX_ERROR_QUOTE: usize = 512;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

/// Why an MCP exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The URL is not one the runtime may connect to.
    #[error(
        "MCP server URL `{url}` is not allowed: https, or plain http only to a loopback host \
         (127.0.0.1, localhost or [::1]), without user info"
    )]
    UrlNotAllowed {
        /// The URL as declared.
        url: String,
    },
    /// An auth header name or value cannot be sent.
    #[error("MCP server {server}: header `{header}` cannot be sent: {reason}")]
    InvalidHeader {
        /// The server's URL.
        server: String,
        /// The header name (never its value).
        header: String,
        /// Why.
        reason: String,
    },
    /// The server could not be reached: nothing was sent.
    #[error("MCP server {server} is unreachable: {message}")]
    Unreachable {
        /// The server's URL.
        server: String,
        /// The transport's error.
        message: String,
    },
    /// The request was sent, and the connection failed or timed out before the answer.
    #[error("MCP server {server}: {method} got no answer: {message}")]
    Transport {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
        /// The transport's error.
        message: String,
    },
    /// The server answered with an HTTP error status.
    #[error("MCP server {server}: {method} answered HTTP {status}{}", quote(.body))]
    Http {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
        /// The status code.
        status: u16,
        /// The start of the body (at most 512 bytes).
        body: String,
    },
    /// The server no longer knows the MCP session (HTTP 404 to a request that carried its
    /// `Mcp-Session-Id`): the request was not processed; a new session may send it again.
    #[error("MCP server {server}: the MCP session expired ({method} answered HTTP 404)")]
    SessionExpired {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
    },
    /// The server answered with a JSON-RPC error.
    #[error("MCP server {server}: {method} failed with JSON-RPC error {code}: {message}")]
    Rpc {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// The error's message.
        message: String,
    },
    /// The answer is larger than [`MAX_RESPONSE_BYTES`].
    #[error("MCP server {server}: the answer to {method} is larger than {limit} bytes")]
    TooLarge {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
        /// The bound.
        limit: usize,
    },
    /// The answer is not a JSON-RPC response this client understands.
    #[error("MCP server {server}: malformed answer to {method}: {message}")]
    Malformed {
        /// The server's URL.
        server: String,
        /// The JSON-RPC method.
        method: String,
        /// What is wrong.
        message: String,
    },
}

fn quote(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl McpError {
    /// Whether a `tools/call` that failed this way may have taken effect: the request was sent
    /// and no answer came (transport error, timeout, an HTTP 5xx, a stream that ended or a
    /// body that is not an answer). Refusals (HTTP 4xx, a JSON-RPC error) and failures before
    /// sending are known outcomes: the call did not run. An answer too large to read did run.
    #[must_use]
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Malformed { .. } => true,
            Self::Http { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// The tool-error code the runtime records for a failure that is not
    /// [`McpError::outcome_unknown`].
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::UrlNotAllowed { .. } | Self::InvalidHeader { .. } => "mcp_config_error",
            Self::Unreachable { .. } => "mcp_unavailable",
            Self::Http { .. } => "mcp_http_error",
            Self::SessionExpired { .. } => "mcp_session_expired",
            Self::Rpc { code, .. } if *code == -32602 || *code == -32601 => "mcp_rejected",
            Self::Rpc { .. } => "mcp_error",
            Self::TooLarge { .. } => "mcp_result_too_large",
            Self::Transport { .. } | Self::Malformed { .. } => "indeterminate",
        }
    }
}

/// Where an MCP server is and the headers every request to it carries.
#[derive(Clone)]
pub struct Endpoint {
    url: Url,
    headers: HeaderMap,
    /// The secret values the headers carry, redacted from anything the server sends back that
    /// ends up in an error (a server may echo a request's headers in its error page).
    secrets: Vec<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url.as_str())
            .field(
                "headers",
                &self
                    .headers
                    .keys()
                    .map(HeaderName::as_str)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Endpoint {
    /// An endpoint at `url`, which must pass [`phrony_manifest::mcp_url_allowed`].
    ///
    /// # Errors
    /// [`McpError::UrlNotAllowed`].
    pub fn new(url: &str) -> Result<Self, McpError> {
        let parsed = Url::parse(url)
            .ok()
            .filter(phrony_manifest::mcp_url_allowed)
            .ok_or_else(|| McpError::UrlNotAllowed {
                url: url.to_owned(),
            })?;
        Ok(Self {
            url: parsed,
            headers: HeaderMap::new(),
            secrets: Vec::new(),
        })
    }

    /// The server's URL.
    #[must_use]
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Adds `name: value` to every request; the value is marked sensitive.
    ///
    /// # Errors
    /// [`McpError::InvalidHeader`] for a name or value HTTP cannot carry (the value is not
    /// quoted).
    pub fn header(self, name: &str, value: &str) -> Result<Self, McpError> {
        self.secret_header(name, value, value)
    }

    fn secret_header(mut self, name: &str, value: &str, secret: &str) -> Result<Self, McpError> {
        let invalid = |reason: &str| McpError::InvalidHeader {
            server: self.url.to_string(),
            header: name.to_owned(),
            reason: reason.to_owned(),
        };
        let header_name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("not a header name"))?;
        let mut header_value = HeaderValue::from_str(value)
            .map_err(|_| invalid("the secret is not a valid header value"))?;
        header_value.set_sensitive(true);
        self.headers.insert(header_name, header_value);
        if !secret.is_empty() {
            self.secrets.push(secret.to_owned());
        }
        Ok(self)
    }

    /// Adds `Authorization: Bearer <token>`.
    ///
    /// # Errors
    /// As [`Endpoint::header`].
    pub fn bearer(self, token: &str) -> Result<Self, McpError> {
        self.secret_header("authorization", &format!("Bearer {token}"), token)
    }
}

impl Endpoint {
    /// `text` with every secret value replaced by `[redacted]`.
    fn redact(&self, text: &str) -> String {
        self.secrets.iter().fold(text.to_owned(), |t, secret| {
            t.replace(secret.as_str(), "[redacted]")
        })
    }
}

/// A tool a server lists.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    /// Its name.
    pub name: String,
    /// Its description, if any.
    pub description: Option<String>,
    /// Its `inputSchema` (`{}` when absent).
    pub input_schema: Value,
}

/// What a `tools/call` returned.
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// The result: `structuredContent` if present, else the `content` array, else `{}`.
    Success(Value),
    /// `isError: true`: the joined text content.
    ToolError(String),
}

/// An initialised MCP session with one server. Safe to share between concurrent calls.
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    endpoint: Endpoint,
    session_id: Option<HeaderValue>,
    protocol_version: String,
    next_id: AtomicU64,
}

impl Client {
    /// Connects: `initialize`, then `notifications/initialized`.
    ///
    /// # Errors
    /// Any [`McpError`]; nothing but the handshake was sent.
    pub async fn connect(endpoint: Endpoint) -> Result<Self, McpError> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| McpError::Unreachable {
                server: endpoint.url().to_owned(),
                message: e.to_string(),
            })?;
        let mut client = Self {
            http,
            endpoint,
            session_id: None,
            protocol_version: PROTOCOL_VERSION.to_owned(),
            next_id: AtomicU64::new(1),
        };
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": CLIENT_VERSION},
        });
        let (result, session_id) =
            client
                .request("initialize", params)
                .await
                .map_err(|e| match e {
                    // Nothing but the handshake was sent: for the call this is "unreachable".
                    McpError::Transport {
                        server, message, ..
                    } => McpError::Unreachable { server, message },
                    e => e,
                })?;
        if let Some(v) = result.get("protocolVersion").and_then(Value::as_str) {
            client.protocol_version = v.to_owned();
        }
        client.session_id = session_id;
        client.notify("notifications/initialized").await?;
        Ok(client)
    }

    /// The server's URL.
    #[must_use]
    pub fn url(&self) -> &str {
        self.endpoint.url()
    }

    /// Every tool the server lists (following at most [`MAX_TOOL_PAGES`] cursors).
    ///
    /// # Errors
    /// Any [`McpError`].
    pub async fn list_tools(&self) -> Result<Vec<RemoteTool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = cursor
                .as_ref()
                .map_or_else(|| json!({}), |c| json!({"cursor": c}));
            let (result, _) = self.request("tools/list", params).await?;
            let malformed = |message: &str| McpError::Malformed {
                server: self.url().to_owned(),
                method: "tools/list".into(),
                message: message.to_owned(),
            };
            let list = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| malformed("no `tools` array"))?;
            for t in list {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool without a `name`"))?;
                tools.push(RemoteTool {
                    name: name.to_owned(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    input_schema: t.get("inputSchema").cloned().unwrap_or_else(|| json!({})),
                });
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .map(str::to_owned);
            if cursor.is_none() {
                return Ok(tools);
            }
        }
        Err(McpError::Malformed {
            server: self.url().to_owned(),
            method: "tools/list".into(),
            message: format!("more than {MAX_TOOL_PAGES} pages"),
        })
    }

    /// Calls the tool `name` with `args` (a JSON object; anything else is sent as `{}`).
    ///
    /// # Errors
    /// Any [`McpError`]; see [`McpError::outcome_unknown`].
    pub async fn call_tool(&self, name: &str, args: &Value) -> Result<CallOutcome, McpError> {
        let arguments = match args {
            Value::Object(m) => Value::Object(m.clone()),
            _ => Value::Object(Map::new()),
        };
        let (result, _) = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        Ok(call_outcome(&result))
    }

    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(self.endpoint.url.clone())
            .headers(self.endpoint.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .json(body);
        if let Some(id) = &self.session_id {
            req = req
                .header(SESSION_HEADER, id.clone())
                .header(VERSION_HEADER, self.protocol_version.as_str());
        }
        req
    }

    async fn notify(&self, method: &str) -> Result<(), McpError> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        let response = self
            .post(&body)
            .send()
            .await
            .map_err(|e| McpError::Unreachable {
                server: self.url().to_owned(),
                message: error_chain(&e),
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(McpError::Http {
                server: self.url().to_owned(),
                method: method.to_owned(),
                status: status.as_u16(),
                body: self.endpoint.redact(&error_quote(response).await),
            });
        }
        Ok(())
    }

    /// Sends one request; its `result` and the session id the server assigned, if any.
    async fn request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Option<HeaderValue>), McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let server = self.url().to_owned();
        let response = self.post(&body).send().await.map_err(|e| {
            if e.is_connect() {
                McpError::Unreachable {
                    server: server.clone(),
                    message: error_chain(&e),
                }
            } else {
                McpError::Transport {
                    server: server.clone(),
                    method: method.to_owned(),
                    message: error_chain(&e),
                }
            }
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND && self.session_id.is_some() {
            return Err(McpError::SessionExpired {
                server,
                method: method.to_owned(),
            });
        }
        if !status.is_success() {
            return Err(McpError::Http {
                server,
                method: method.to_owned(),
                status: status.as_u16(),
                body: self.endpoint.redact(&error_quote(response).await),
            });
        }
        let session_id = response.headers().get(SESSION_HEADER).cloned();
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        let reader = Reader {
            server: &server,
            method,
            id,
            endpoint: &self.endpoint,
        };
        let message = if is_sse {
            reader.read_sse(response).await?
        } else {
            let bytes = reader.read_bounded(response).await?;
            reader.parse(&bytes)?
        };
        reader.result(message).map(|r| (r, session_id))
    }
}

/// Reads the answer to one request.
struct Reader<'a> {
    server: &'a str,
    method: &'a str,
    id: u64,
    endpoint: &'a Endpoint,
}

impl Reader<'_> {
    fn malformed(&self, message: impl Into<String>) -> McpError {
        McpError::Malformed {
            server: self.server.to_owned(),
            method: self.method.to_owned(),
            message: message.into(),
        }
    }

    fn transport(&self, e: &reqwest::Error) -> McpError {
        McpError::Transport {
            server: self.server.to_owned(),
            method: self.method.to_owned(),
            message: error_chain(e),
        }
    }

    fn too_large(&self) -> McpError {
        McpError::TooLarge {
            server: self.server.to_owned(),
            method: self.method.to_owned(),
            limit: MAX_RESPONSE_BYTES,
        }
    }

    async fn read_bounded(&self, mut response: reqwest::Response) -> Result<Vec<u8>, McpError> {
        if response
            .content_length()
            .is_some_and(|n| n > MAX_RESPONSE_BYTES as u64)
        {
            return Err(self.too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.transport(&e))? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(self.too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// One JSON-RPC message (a batch is searched for our id).
    fn parse(&self, bytes: &[u8]) -> Result<Value, McpError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| self.malformed(format!("not JSON ({e})")))?;
        match value {
            Value::Array(items) => items
                .into_iter()
                .find(|m| self.is_ours(m))
                .ok_or_else(|| self.malformed("no response with the request's id")),
            m if self.is_ours(&m) => Ok(m),
            _ => Err(self.malformed("not a response with the request's id")),
        }
    }

    fn is_ours(&self, m: &Value) -> bool {
        m.get("id").and_then(Value::as_u64) == Some(self.id)
            && (m.get("result").is_some() || m.get("error").is_some())
    }

    /// Reads SSE events until one carries the response to our id.
    async fn read_sse(&self, mut response: reqwest::Response) -> Result<Value, McpError> {
        let mut buffer: Vec<u8> = Vec::new();
        let mut read = 0usize;
        loop {
            while let Some(end) = event_end(&buffer) {
                let event: Vec<u8> = buffer.drain(..end.0).collect();
                buffer.drain(..end.1 - end.0);
                let data = sse_data(&event);
                if data.is_empty() {
                    continue;
                }
                if let Ok(m) = serde_json::from_str::<Value>(&data)
                    && self.is_ours(&m)
                {
                    return Ok(m);
                }
                // A server request or notification, or another response: not ours.
            }
            let Some(chunk) = response.chunk().await.map_err(|e| self.transport(&e))? else {
                return Err(self.malformed("the event stream ended without the response"));
            };
            read += chunk.len();
            if read > MAX_RESPONSE_BYTES {
                return Err(self.too_large());
            }
            buffer.extend_from_slice(&chunk);
        }
    }

    fn result(&self, mut message: Value) -> Result<Value, McpError> {
        if let Some(error) = message.get("error") {
            return Err(McpError::Rpc {
                server: self.server.to_owned(),
                method: self.method.to_owned(),
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: self.endpoint.redact(
                    error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("(no message)"),
                ),
            });
        }
        match message.get_mut("result").map(Value::take) {
            Some(r @ Value::Object(_)) => Ok(r),
            _ => Err(self.malformed("`result` is not an object")),
        }
    }
}

/// The end of the first complete SSE event in `buf`: (end of its text, start of the next).
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if buf.get(i + 1) == Some(&b'\n') {
                return Some((i, i + 2));
            }
            if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, i + 3));
            }
        }
        i += 1;
    }
    None
}

/// The `data:` lines of one event, joined with newlines.
fn sse_data(event: &[u8]) -> String {
    let text = String::from_utf8_lossy(event);
    text.lines()
        .filter_map(|l| l.strip_suffix('\r').unwrap_or(l).strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Maps a `tools/call` result (§4.10 of the reference): `isError` → the joined text content;
/// else `structuredContent`, else the content array, else `{}`.
#[must_use]
pub fn call_outcome(result: &Value) -> CallOutcome {
    let content = result.get("content");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let text = content
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|b| b.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        return CallOutcome::ToolError(text);
    }
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        return CallOutcome::Success(structured.clone());
    }
    match content {
        Some(c @ Value::Array(items)) if !items.is_empty() => CallOutcome::Success(c.clone()),
        _ => CallOutcome::Success(json!({})),
    }
}

/// A reqwest error with its causes (its `Display` omits them). The URL it names carries no
/// credentials: [`Endpoint::new`] refuses user info, and secrets travel in headers.
fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The start of an error response's body, for the message.
async fn error_quote(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_QUOTE {
            break;
        }
    }
    body.truncate(MAX_ERROR_QUOTE);
    String::from_utf8_lossy(&body)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests;
