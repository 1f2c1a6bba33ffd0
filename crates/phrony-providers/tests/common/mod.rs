//! A local fake vendor API: answers each request with the next scripted reply and records what
//! it received. Listens on 127.0.0.1 only.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of this module"
)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::Value;

/// One scripted HTTP reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Vec<u8>>,
}

impl Reply {
    /// `200 text/event-stream` with `body` in one piece.
    pub(crate) fn sse(body: &str) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: vec![body.as_bytes().to_vec()],
        }
    }

    /// `200 text/event-stream` with `body` cut every `size` bytes, each piece written separately,
    /// so that events and JSON values straddle network reads.
    pub(crate) fn sse_in_pieces(body: &str, size: usize) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: body.as_bytes().chunks(size).map(<[u8]>::to_vec).collect(),
        }
    }

    /// A JSON reply with `status`.
    pub(crate) fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![body.as_bytes().to_vec()],
        }
    }

    /// A reply with `status`, `content_type` and `body`.
    pub(crate) fn raw(status: u16, content_type: &str, body: &str) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            chunks: vec![body.as_bytes().to_vec()],
        }
    }

    /// Adds a header.
    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// What the fake server received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) body: Value,
}

#[derive(Default)]
struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
}

/// A running fake server.
pub(crate) struct FakeServer {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    /// Starts a server that plays `replies` in order.
    pub(crate) async fn start(replies: Vec<Reply>) -> Self {
        let shared = Arc::new(Shared {
            replies: Mutex::new(replies.into()),
            received: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, shared, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub(crate) fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub(crate) fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
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
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        headers,
        body,
    });
    let reply = shared.replies.lock().unwrap().pop_front();
    let Some(reply) = reply else {
        return Response::builder()
            .status(StatusCode::IM_A_TEAPOT)
            .body(Body::from(
                "the fake server has no reply left for this request",
            ))
            .unwrap();
    };
    let mut builder = Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        builder = builder.header(k, v);
    }
    let pieces = reply.chunks;
    let body = if pieces.len() == 1 {
        Body::from(pieces.into_iter().next().unwrap_or_default())
    } else {
        let stream = futures::stream::unfold(pieces.into_iter(), |mut it| async move {
            let piece = it.next()?;
            tokio::time::sleep(Duration::from_millis(2)).await;
            Some((Ok::<_, Infallible>(Bytes::from(piece)), it))
        });
        Body::from_stream(stream)
    };
    builder.body(body).unwrap()
}

/// Formats SSE `data:` lines (OpenAI style) followed by `[DONE]`.
pub(crate) fn openai_sse(chunks: &[Value]) -> String {
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
pub(crate) fn anthropic_sse(events: &[Value]) -> String {
    let mut out = String::new();
    for e in events {
        let kind = e["type"].as_str().unwrap_or("message");
        out.push_str(&format!("event: {kind}\ndata: {e}\n\n"));
    }
    out
}
