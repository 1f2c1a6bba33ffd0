//! A local fake model vendor API: answers each request with the next scripted reply and records
//! what it received. Listens on 127.0.0.1 only.
//!
//! ```no_run
//! # async fn demo() {
//! use phrony_test_support::fake_api::{FakeServer, Reply, openai_sse};
//! let server = FakeServer::start(vec![Reply::sse(&openai_sse(&[]))]).await;
//! let base_url = server.origin(); // http://127.0.0.1:<port>
//! # let _ = base_url;
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt as _;
use serde_json::Value;

/// One scripted HTTP reply.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Vec<u8>>,
    stall: bool,
}

impl Reply {
    /// `200 text/event-stream` with `body` in one piece.
    pub fn sse(body: &str) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: vec![body.as_bytes().to_vec()],
            stall: false,
        }
    }

    /// `200 text/event-stream` with `body` cut every `size` bytes, each piece written separately,
    /// so that events and JSON values straddle network reads.
    pub fn sse_in_pieces(body: &str, size: usize) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: body.as_bytes().chunks(size).map(<[u8]>::to_vec).collect(),
            stall: false,
        }
    }

    /// A JSON reply with `status`.
    pub fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![body.as_bytes().to_vec()],
            stall: false,
        }
    }

    /// A reply with `status`, `content_type` and `body`.
    pub fn raw(status: u16, content_type: &str, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            chunks: vec![body.as_bytes().to_vec()],
            stall: false,
        }
    }

    /// After its body, the reply neither sends anything more nor ends: a stalled stream (the
    /// connection stays open until the client gives up or the server is dropped).
    #[must_use]
    pub fn stalled(mut self) -> Self {
        self.stall = true;
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What the fake server received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

#[derive(Debug, Default)]
struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
}

/// A running fake server; dropping it stops it.
#[derive(Debug)]
pub struct FakeServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    /// Starts a server that plays `replies` in order; a request beyond the last reply is
    /// answered `418` with a message saying so.
    ///
    /// # Panics
    /// When no local port can be bound.
    pub async fn start(replies: Vec<Reply>) -> Self {
        let shared = Arc::new(Shared {
            replies: Mutex::new(replies.into()),
            received: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("cannot bind the fake server: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the fake server's address: {e}"));
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("the fake server stopped: {e}");
            }
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    #[must_use]
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let headers = headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or("<binary>").to_owned(),
            )
        })
        .collect();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    lock(&shared.received).push(Received {
        path: uri.path().to_owned(),
        headers,
        body,
    });
    let reply = lock(&shared.replies).pop_front();
    let Some(reply) = reply else {
        return Response::builder()
            .status(StatusCode::IM_A_TEAPOT)
            .body(Body::from(
                "the fake server has no reply left for this request",
            ))
            .unwrap_or_else(|e| panic!("the fake server's answer: {e}"));
    };
    let mut builder = Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        builder = builder.header(k, v);
    }
    let pieces = reply.chunks;
    let body = if reply.stall {
        let stream = futures::stream::iter(
            pieces
                .into_iter()
                .map(|piece| Ok::<_, Infallible>(Bytes::from(piece))),
        )
        .chain(futures::stream::pending());
        Body::from_stream(stream)
    } else if pieces.len() == 1 {
        Body::from(pieces.into_iter().next().unwrap_or_default())
    } else {
        let stream = futures::stream::unfold(pieces.into_iter(), |mut it| async move {
            let piece = it.next()?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            Some((Ok::<_, Infallible>(Bytes::from(piece)), it))
        });
        Body::from_stream(stream)
    };
    builder
        .body(body)
        .unwrap_or_else(|e| panic!("a scripted reply is not a valid response: {e}"))
}

/// The guarded value; a panic elsewhere while it was held does not hide what was recorded.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Formats SSE `data:` lines (OpenAI style) followed by `[DONE]`.
pub fn openai_sse(chunks: &[Value]) -> String {
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

/// Formats SSE events with `event:` names taken from each value's `type` (Anthropic style).
pub fn anthropic_sse(events: &[Value]) -> String {
    let mut out = String::new();
    for e in events {
        let kind = e["type"].as_str().unwrap_or("message");
        out.push_str(&format!("event: {kind}\ndata: {e}\n\n"));
    }
    out
}
