//! A fake MCP server speaking Streamable HTTP (POST only, revision 2025-06-18) on 127.0.0.1,
//! for the runtime's MCP tests: `initialize` (assigns an `Mcp-Session-Id`, required on every
//! later request), `notifications/initialized`, `tools/list` (paged, two tools a page) and
//! `tools/call`. Switches make `tools/call` answer `isError`, `structuredContent`, plain
//! content, an HTTP 500, a connection dropped mid-answer or no answer at all, and make every
//! request require a header; every request it gets is recorded with its headers.
//!
//! ```no_run
//! # async fn demo() {
//! use phrony_test_support::fake_mcp::{FakeMcp, FakeTool};
//! let server = FakeMcp::start(vec![FakeTool::echo("web_search")]).await;
//! let url = server.url(); // http://127.0.0.1:<port>/mcp
//! # let _ = url;
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

/// What a tool answers to `tools/call`.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// `structuredContent: {"tool": name, "arguments": args}` (and the same as text content).
    Echo,
    /// `structuredContent` with this value.
    Structured(Value),
    /// Text content only.
    Text(String),
    /// `isError: true` with these text blocks.
    IsError(Vec<String>),
}

/// A tool the fake server lists and answers.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeTool {
    /// Its name.
    pub name: String,
    /// Its `inputSchema`.
    pub input_schema: Value,
    /// Its answer.
    pub answer: Answer,
}

impl FakeTool {
    /// A tool that echoes its arguments, with an object schema.
    pub fn echo(name: &str) -> Self {
        Self {
            name: name.into(),
            input_schema: json!({"type": "object"}),
            answer: Answer::Echo,
        }
    }

    /// With `answer`.
    #[must_use]
    pub fn answering(mut self, answer: Answer) -> Self {
        self.answer = answer;
        self
    }

    /// With `schema` as its `inputSchema`.
    #[must_use]
    pub fn schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }
}

/// A failure `tools/call` answers with (other methods answer normally).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 500 with a short text body.
    Status500,
    /// HTTP 500 whose body echoes the request's `authorization` header (a careless server).
    Status500EchoingAuth,
    /// `200 application/json` headers, then the connection is cut before the body ends.
    DropConnection,
    /// No answer, ever (until the client gives up).
    Hang,
}

/// One request the server got.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// Its JSON-RPC method.
    pub method: String,
    /// Its params (`null` when absent).
    pub params: Value,
    /// Every header, lower-case name → value.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct Shared {
    tools: Mutex<Vec<FakeTool>>,
    fault: Mutex<Option<Fault>>,
    required_header: Mutex<Option<(String, String)>>,
    sse: Mutex<bool>,
    requests: Mutex<Vec<Recorded>>,
    sessions: AtomicU64,
    /// Sessions numbered below this are forgotten (HTTP 404).
    first_live_session: AtomicU64,
}

/// The running fake server; stops when dropped.
#[derive(Debug)]
pub struct FakeMcp {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeMcp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeMcp {
    /// Starts a server listing `tools`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(tools: Vec<FakeTool>) -> Self {
        let shared = Arc::new(Shared::default());
        *lock(&shared.tools) = tools;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind the fake MCP server: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fake MCP server address: {e}"));
        let app = Router::new()
            .route("/mcp", axum::routing::post(handle))
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// Makes `tools/call` fail with `fault` (`None`: answer normally).
    pub fn set_fault(&self, fault: Option<Fault>) {
        *lock(&self.shared.fault) = fault;
    }

    /// Every request must carry `name: value` (else HTTP 401).
    pub fn require_header(&self, name: &str, value: &str) {
        *lock(&self.shared.required_header) = Some((name.to_ascii_lowercase(), value.into()));
    }

    /// Answers requests as an SSE stream (a notification first, then the response) instead of
    /// a JSON body.
    pub fn use_sse(&self, on: bool) {
        *lock(&self.shared.sse) = on;
    }

    /// Replaces the tools.
    pub fn set_tools(&self, tools: Vec<FakeTool>) {
        *lock(&self.shared.tools) = tools;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// The requests with JSON-RPC `method`.
    pub fn requests_of(&self, method: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method)
            .collect()
    }

    /// Forgets every session so far (a restarted server): requests carrying their ids get
    /// HTTP 404, as the transport specifies.
    pub fn expire_sessions(&self) {
        let next = self.shared.sessions.load(Ordering::SeqCst) + 1;
        self.shared.first_live_session.store(next, Ordering::SeqCst);
    }

    /// How many sessions were initialised.
    pub fn sessions(&self) -> u64 {
        self.shared.sessions.load(Ordering::SeqCst)
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Body>) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(body.into())
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn rpc_answer(shared: &Shared, id: &Value, body: Value, session: Option<String>) -> Response {
    let message = json!({"jsonrpc": "2.0", "id": id})
        .as_object()
        .map_or(body.clone(), |m| {
            let mut m = m.clone();
            if let Value::Object(b) = body {
                m.extend(b);
            }
            Value::Object(m)
        });
    let mut response = if *lock(&shared.sse) {
        let text = format!(
            "event: message\ndata: {}\n\nevent: message\ndata: {}\n\n",
            json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "working"}}),
            message
        );
        reply(StatusCode::OK, "text/event-stream", text)
    } else {
        reply(StatusCode::OK, "application/json", message.to_string())
    };
    if let Some(s) = session
        && let Ok(v) = s.parse()
    {
        response.headers_mut().insert("mcp-session-id", v);
    }
    response
}

async fn handle(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return reply(StatusCode::BAD_REQUEST, "text/plain", "not JSON");
    };
    let method = message
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    lock(&shared.requests).push(Recorded {
        method: method.clone(),
        params: message.get("params").cloned().unwrap_or(Value::Null),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    });
    let required = lock(&shared.required_header).clone();
    if let Some((name, value)) = required
        && headers.get(&name).and_then(|v| v.to_str().ok()) != Some(value.as_str())
    {
        return reply(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "missing credentials",
        );
    }
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    if method == "initialize" {
        let n = shared.sessions.fetch_add(1, Ordering::SeqCst) + 1;
        let result = json!({"result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake-mcp", "version": "1.0.0"},
        }});
        return rpc_answer(&shared, &id, result, Some(format!("session-{n}")));
    }
    let Some(session) = headers.get("mcp-session-id") else {
        return reply(StatusCode::BAD_REQUEST, "text/plain", "no Mcp-Session-Id");
    };
    let known = session
        .to_str()
        .ok()
        .and_then(|s| s.strip_prefix("session-"))
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| {
            n >= shared.first_live_session.load(Ordering::SeqCst).max(1)
                && n <= shared.sessions.load(Ordering::SeqCst)
        });
    if !known {
        return reply(StatusCode::NOT_FOUND, "text/plain", "unknown MCP session");
    }
    match method.as_str() {
        "notifications/initialized" => reply(StatusCode::ACCEPTED, "text/plain", ""),
        "tools/list" => {
            let tools = lock(&shared.tools).clone();
            let page: usize = message
                .pointer("/params/cursor")
                .and_then(Value::as_str)
                .and_then(|c| c.strip_prefix("page-"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let listed: Vec<Value> = tools
                .iter()
                .skip(page * 2)
                .take(2)
                .map(|t| json!({"name": t.name, "description": format!("the {} tool", t.name), "inputSchema": t.input_schema}))
                .collect();
            let mut result = json!({"tools": listed});
            if tools.len() > (page + 1) * 2 {
                result["nextCursor"] = json!(format!("page-{}", page + 1));
            }
            rpc_answer(&shared, &id, json!({"result": result}), None)
        }
        "tools/call" => call(&shared, &id, &message, &headers).await,
        _ => rpc_answer(
            &shared,
            &id,
            json!({"error": {"code": -32601, "message": format!("method not found: {method}")}}),
            None,
        ),
    }
}

async fn call(shared: &Shared, id: &Value, message: &Value, headers: &HeaderMap) -> Response {
    let fault = *lock(&shared.fault);
    match fault {
        Some(Fault::Status500EchoingAuth) => {
            let auth = headers
                .get("authorization")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("crashed handling a request with authorization: {auth}"),
            );
        }
        Some(Fault::Status500) => {
            return reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "upstream exploded",
            );
        }
        Some(Fault::DropConnection) => {
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"{\"jsonrpc\":\"2.0\",")),
                Err(std::io::Error::other(
                    "connection dropped by the fake server",
                )),
            ];
            return reply(
                StatusCode::OK,
                "application/json",
                Body::from_stream(futures::stream::iter(chunks)),
            );
        }
        Some(Fault::Hang) => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        None => {}
    }
    let name = message
        .pointer("/params/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let args = message
        .pointer("/params/arguments")
        .cloned()
        .unwrap_or(Value::Null);
    let tool = lock(&shared.tools).iter().find(|t| t.name == name).cloned();
    let Some(tool) = tool else {
        return rpc_answer(
            shared,
            id,
            json!({"error": {"code": -32602, "message": format!("Unknown tool: {name}")}}),
            None,
        );
    };
    let result = match tool.answer {
        Answer::Echo => {
            let echo = json!({"tool": name, "arguments": args});
            json!({"content": [{"type": "text", "text": echo.to_string()}], "structuredContent": echo})
        }
        Answer::Structured(v) => {
            json!({"content": [{"type": "text", "text": v.to_string()}], "structuredContent": v})
        }
        Answer::Text(t) => json!({"content": [{"type": "text", "text": t}]}),
        Answer::IsError(texts) => json!({
            "content": texts.iter().map(|t| json!({"type": "text", "text": t})).collect::<Vec<_>>(),
            "isError": true,
        }),
    };
    rpc_answer(shared, id, json!({"result": result}), None)
}
