//! The approvals console (`/console/` on `RUNTIME_HTTP_ADDR`) on the real binary, through its
//! HTTP API as the page calls it: in `required` mode sign-in takes a token verified like a gRPC
//! call's, a viewer sees the €400 refund but cannot decide (403), a change needs the CSRF header
//! and a same-origin request, edited arguments are checked by the engine (400 naming the field),
//! the recorded voter is the token's verified name (never a name the page sends), and the live
//! updates stream the approval's opening and decision; every response carries the strict CSP. In
//! `local` mode the console is the local operator (unverified), answers only loopback `Host`s,
//! and an approval given there lets the session complete with the Rust refund worker. A live
//! updates stream ends when the token that opened it is revoked; failed sign-ins are throttled
//! per credential and per client address (429 with `Retry-After`), and a success starts over.

use std::time::Duration;

use crate::metrics::{publish_refund_agent, wait_for_ready, wait_for_status};
use crate::support::{Launch, agent_ref, authed, free_port, sqlite_url};
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::worker::RefundWorker;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// One HTTP answer.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `message` of a JSON error body.
    fn message(&self) -> String {
        self.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// One HTTP/1.1 request (`Connection: close`); `headers` may override `Host`.
async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or_default();
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A signed-in console session: its cookie and CSRF token.
struct Signed {
    addr: String,
    cookie: String,
    csrf: String,
    who: Value,
}

impl Signed {
    /// Signs in (`token` in `required` mode, none in `local`); the sign-in must succeed.
    async fn login(addr: &str, token: Option<&str>) -> Self {
        let body = token.map_or_else(|| json!({}), |t| json!({"token": t}));
        let reply = post_json(addr, "/console/api/login", &[], &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let set_cookie = reply.header("set-cookie").unwrap().to_owned();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
            assert!(set_cookie.contains(attribute), "{set_cookie}");
        }
        let cookie = set_cookie.split(';').next().unwrap().to_owned();
        assert!(cookie.starts_with("phrony_console="), "{cookie}");
        let who = reply.json();
        if let Some(token) = token {
            assert!(!reply.body.contains(token), "the token is never echoed");
        }
        Self {
            addr: addr.to_owned(),
            cookie,
            csrf: who["csrf"].as_str().unwrap().to_owned(),
            who,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        http(&self.addr, "GET", path, &[("Cookie", &self.cookie)], None).await
    }

    /// A change as the page sends it: cookie, CSRF header, same origin, JSON.
    async fn post(&self, path: &str, body: &Value) -> Reply {
        let origin = format!("http://{}", self.addr);
        let headers = [
            ("Cookie", self.cookie.as_str()),
            ("X-Phrony-Csrf", self.csrf.as_str()),
            ("Origin", origin.as_str()),
        ];
        post_json(&self.addr, path, &headers, body).await
    }

    /// The pending approvals (one expected) of `session`.
    async fn pending_of(&self, session: &str) -> Value {
        let reply = self
            .get(&format!("/console/api/approvals?session={session}"))
            .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let listed = reply.json();
        let approvals = listed["approvals"].as_array().unwrap();
        assert_eq!(approvals.len(), 1, "{listed}");
        approvals[0].clone()
    }
}

async fn post_json(addr: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    http(addr, "POST", path, &all, Some(&body.to_string())).await
}

/// The live updates (`/console/api/events`) of one session, read as they arrive.
struct Events {
    stream: TcpStream,
    seen: String,
}

impl Events {
    async fn open(signed: &Signed) -> Self {
        let mut stream = TcpStream::connect(&signed.addr).await.unwrap();
        let request = format!(
            "GET /console/api/events HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\nAccept: \
             text/event-stream\r\nConnection: close\r\n\r\n",
            signed.addr, signed.cookie
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        Self {
            stream,
            seen: String::new(),
        }
    }

    /// Reads until `needle` has arrived (10 s at most); returns everything read so far.
    async fn until(&mut self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut buf = [0_u8; 4096];
        while !self.seen.contains(needle) {
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} in the events:\n{}", self.seen))
                .unwrap();
            assert!(n > 0, "the event stream ended:\n{}", self.seen);
            self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        self.seen.clone()
    }

    /// Reads until the server closes the stream, which must happen within `within`.
    async fn ended(&mut self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        let mut buf = [0_u8; 4096];
        loop {
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "the event stream is still open after {within:?}:\n{}",
                        self.seen
                    )
                })
                .unwrap_or(0);
            if n == 0 {
                return;
            }
            self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
}

/// Starts a session of `support/refund-big` (a €400 refund: waits for an approval).
async fn run_big_refund(
    client: &mut pb::runtime_client::RuntimeClient<tonic::transport::Channel>,
    bearer: Option<&str>,
) -> String {
    client
        .run_session(authed(
            pb::RunSessionRequest {
                agent_ref: Some(pb::AgentRef {
                    name: "refund-big".into(),
                    ..agent_ref("")
                }),
                input: br#"{"message": "Refund 400 EUR for ORD-1."}"#.to_vec(),
                ..Default::default()
            },
            bearer,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id
}

fn assert_security_headers(reply: &Reply) {
    assert_eq!(
        reply.header("content-security-policy"),
        Some(phrony_runtime::console::CSP)
    );
    assert!(phrony_runtime::console::CSP.contains("default-src 'self'"));
    assert!(!phrony_runtime::console::CSP.contains("unsafe-inline"));
    assert_eq!(reply.header("x-frame-options"), Some("DENY"));
    assert_eq!(reply.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(reply.header("cache-control"), Some("no-store"));
}

#[tokio::test]
async fn in_required_mode_the_console_needs_a_token_csrf_and_the_approve_permission() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let launch = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_AUTH", "required")
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_HTTP_ADDR", &addr);
    let admin = launch.token("ops-admin", "admin");
    let approver = launch.token("emad", "approver");
    let viewer = launch.token("vera", "viewer");
    let worker = launch.token("a-worker", "worker");
    let mut daemon = launch.start().await;
    wait_for_ready(&addr, 200).await;

    // The page itself is public (it holds nothing) and strict; the data is not.
    let page = http(&addr, "GET", "/console/", &[], None).await;
    assert_eq!(page.status, 200);
    assert_security_headers(&page);
    assert!(page.body.contains("/console/assets/console.js"));
    assert!(!page.body.contains("<script>"), "no inline script");
    let script = http(&addr, "GET", "/console/assets/console.js", &[], None).await;
    assert_eq!(script.status, 200);
    assert_security_headers(&script);
    let anonymous = http(&addr, "GET", "/console/api/approvals", &[], None).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert_security_headers(&anonymous);
    assert!(
        anonymous.message().contains("not signed in"),
        "{}",
        anonymous.body
    );
    let forged = http(
        &addr,
        "GET",
        "/console/api/approvals",
        &[("Cookie", "phrony_console=forged")],
        None,
    )
    .await;
    assert_eq!(forged.status, 401);

    // Sign-in: a token is required, verified as gRPC verifies it, and must grant read.
    let no_token = post_json(&addr, "/console/api/login", &[], &json!({})).await;
    assert_eq!(no_token.status, 400);
    assert!(
        no_token.message().contains("`token` is required"),
        "{}",
        no_token.body
    );
    let bad = "phr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let refused = post_json(&addr, "/console/api/login", &[], &json!({"token": bad})).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    assert!(!refused.body.contains(bad), "the token is never echoed");
    let form = http(
        &addr,
        "POST",
        "/console/api/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some(&format!("token={viewer}")),
    )
    .await;
    assert_eq!(
        form.status, 415,
        "a cross-site form cannot sign in: {}",
        form.body
    );
    let workers = post_json(&addr, "/console/api/login", &[], &json!({"token": worker})).await;
    assert_eq!(workers.status, 403, "{}", workers.body);
    assert!(
        workers.message().contains("read permission"),
        "{}",
        workers.body
    );

    // The €400 refund waits for an approval.
    let mut client = daemon.client().await;
    publish_refund_agent(&mut client, home.path(), "refund-big", 400, Some(&admin)).await;
    let vera = Signed::login(&addr, Some(&viewer)).await;
    assert_eq!(vera.who["user"], "vera");
    assert_eq!(vera.who["verification"], "token");
    assert_eq!(vera.who["can_decide"], false);
    let mut events = Events::open(&vera).await;
    events.until("event: current_end").await;
    let session = run_big_refund(&mut client, Some(&admin)).await;
    wait_for_status(&mut client, &session, "awaiting_approval", Some(&admin)).await;
    let opened = events.until("event: opened").await;
    assert!(opened.contains(&session), "{opened}");

    // A viewer sees the approval, its exact arguments, policy, reason and quorum...
    let pending = vera.pending_of(&session).await;
    let id = pending["id"].as_str().unwrap().to_owned();
    assert_eq!(pending["args"]["amount"], 400);
    assert_eq!(pending["args"]["currency"], "EUR");
    assert_eq!(pending["tool"], "payments.issue-refund");
    assert!(
        !pending["policy_ref"].as_str().unwrap().is_empty(),
        "{pending}"
    );
    assert!(!pending["reason"].as_str().unwrap().is_empty(), "{pending}");
    assert_eq!(pending["approvals_required"], 1);
    let filtered = vera
        .get("/console/api/approvals?agent=support/refund-big&tool=payments.issue-refund")
        .await
        .json();
    assert_eq!(
        filtered["approvals"].as_array().unwrap().len(),
        1,
        "{filtered}"
    );
    let other_tool = vera
        .get("/console/api/approvals?tool=orders.lookup-order")
        .await
        .json();
    assert_eq!(other_tool["approvals"], json!([]), "{other_tool}");
    let bad_filter = vera.get("/console/api/approvals?agent=refund-big").await;
    assert_eq!(bad_filter.status, 400);
    assert!(
        bad_filter.message().contains("namespace/name"),
        "{}",
        bad_filter.body
    );
    // ... but cannot decide it.
    let decide = format!("/console/api/approvals/{id}/decide");
    let denied = vera
        .post(
            &decide,
            &json!({"decision": "approve", "comment": "looks fine"}),
        )
        .await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(
        denied.message().contains("approve permission"),
        "{}",
        denied.body
    );

    // An approver: the CSRF header and the same origin are required.
    let emad = Signed::login(&addr, Some(&approver)).await;
    assert_eq!(emad.who["can_decide"], true);
    let body = json!({"decision": "approve", "comment": "Damage claim verified."}).to_string();
    let no_csrf = http(
        &addr,
        "POST",
        &decide,
        &[
            ("Cookie", &emad.cookie),
            ("Content-Type", "application/json"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.body);
    assert!(
        no_csrf.message().contains("x-phrony-csrf"),
        "{}",
        no_csrf.body
    );
    let cross_site = http(
        &addr,
        "POST",
        &decide,
        &[
            ("Cookie", &emad.cookie),
            ("Content-Type", "application/json"),
            ("X-Phrony-Csrf", &emad.csrf),
            ("Origin", "https://evil.example"),
        ],
        Some(&body),
    )
    .await;
    assert_eq!(cross_site.status, 403, "{}", cross_site.body);
    // The page cannot name who decides.
    let named = emad
        .post(&decide, &json!({"decision": "approve", "actor": "mallory"}))
        .await;
    assert_eq!(named.status, 400, "{}", named.body);
    assert!(named.message().contains("actor"), "{}", named.body);
    // Edited arguments are checked against the tool's input schema, naming the field.
    let edited = emad
        .post(
            &decide,
            &json!({"decision": "approve", "args": {"order_id": "ORD-1", "amount": "lots",
                     "currency": "EUR", "reason": "damaged"}}),
        )
        .await;
    assert_eq!(edited.status, 400, "{}", edited.body);
    assert!(edited.message().contains("input schema"), "{}", edited.body);
    assert!(edited.message().contains("amount"), "{}", edited.body);
    let huge = emad
        .post(
            &decide,
            &json!({"decision": "approve", "comment": "x".repeat(5000)}),
        )
        .await;
    assert_eq!(huge.status, 400);
    assert!(huge.message().contains("`comment`"), "{}", huge.body);
    let nonsense = emad.post(&decide, &json!({"decision": "maybe"})).await;
    assert_eq!(nonsense.status, 400);
    assert!(
        nonsense.message().contains("\"approve\" or \"reject\""),
        "{}",
        nonsense.body
    );
    assert_eq!(
        emad.get(&format!("/console/api/approvals/{id}"))
            .await
            .json()["status"],
        "pending",
        "nothing refused was recorded"
    );

    // The approval, recorded as the token's verified name.
    let approved = emad
        .post(
            &decide,
            &json!({"decision": "approve", "comment": "Damage claim verified."}),
        )
        .await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert_eq!(approved.json()["status"], "approved");
    let decided = events.until("event: decided").await;
    assert!(decided.contains(&id), "{decided}");
    let one = emad.get(&format!("/console/api/approvals/{id}")).await;
    assert_security_headers(&one);
    let one = one.json();
    assert_eq!(one["status"], "approved");
    assert_eq!(one["decided_by"], "emad");
    assert_eq!(one["decided_by_verification"], "token");
    assert_eq!(one["votes"][0]["decided_by"], "emad");
    assert_eq!(one["votes"][0]["verification"], "token");
    assert_eq!(one["votes"][0]["comment"], "Damage claim verified.");
    let again = emad.post(&decide, &json!({"decision": "reject"})).await;
    assert_eq!(
        again.status, 409,
        "a decided approval takes no vote: {}",
        again.body
    );

    // The inspect timeline shows the vote by the verified approver.
    let inspected = vera.get(&format!("/console/api/sessions/{session}")).await;
    assert_eq!(inspected.status, 200, "{}", inspected.body);
    let inspected = inspected.json();
    assert_eq!(inspected["session"]["id"], session.as_str());
    let timeline = inspected["timeline"].as_array().unwrap();
    let vote = timeline
        .iter()
        .find(|e| e["kind"] == "approval.vote")
        .unwrap_or_else(|| panic!("no vote in {inspected}"));
    assert_eq!(vote["actor"], "emad");
    assert!(
        timeline.iter().any(|e| e["kind"] == "approval_decided"),
        "{inspected}"
    );

    // Signing out ends the session on the server.
    let out = emad.post("/console/api/logout", &json!({})).await;
    assert_eq!(out.status, 204, "{}", out.body);
    assert_eq!(emad.get("/console/api/session").await.status, 401);
    for token in [&admin, &approver, &viewer] {
        assert!(
            !daemon.stderr().contains(token.as_str()),
            "a token was logged"
        );
    }
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
}

#[tokio::test]
async fn in_local_mode_the_console_is_the_local_operator_on_loopback_only() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_AUTH", "local")
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_HTTP_ADDR", &addr)
        .start()
        .await;
    wait_for_ready(&addr, 200).await;

    // A page whose name was rebound to 127.0.0.1 is refused.
    let rebound = http(
        &addr,
        "GET",
        "/console/",
        &[("Host", "attacker.example")],
        None,
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert!(rebound.message().contains("loopback"), "{}", rebound.body);
    assert_eq!(
        http(&addr, "GET", "/console/", &[("Host", "localhost")], None)
            .await
            .status,
        200
    );
    let session = http(&addr, "GET", "/console/api/session", &[], None).await;
    assert_eq!(session.status, 401);
    assert!(
        session.message().contains("auth mode: local"),
        "{}",
        session.body
    );
    let with_token = post_json(&addr, "/console/api/login", &[], &json!({"token": "phr_x"})).await;
    assert_eq!(with_token.status, 400, "{}", with_token.body);
    let operator = Signed::login(&addr, None).await;
    assert_eq!(operator.who["verification"], "unverified");
    assert_eq!(operator.who["mode"], "local");
    assert_eq!(operator.who["can_decide"], true);
    let local_actor = operator.who["user"].as_str().unwrap().to_owned();

    // Approved in the console, the €400 refund runs and the session completes.
    let mut client = daemon.client().await;
    publish_refund_agent(&mut client, home.path(), "refund-big", 400, None).await;
    let worker = RefundWorker::start(&daemon.addr, "console-worker");
    let session = run_big_refund(&mut client, None).await;
    wait_for_status(&mut client, &session, "awaiting_approval", None).await;
    let pending = operator.pending_of(&session).await;
    let id = pending["id"].as_str().unwrap();
    let approved = operator
        .post(
            &format!("/console/api/approvals/{id}/decide"),
            &json!({"decision": "approve", "comment": "ok from the console"}),
        )
        .await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    wait_for_status(&mut client, &session, "completed", None).await;
    let one = operator
        .get(&format!("/console/api/approvals/{id}"))
        .await
        .json();
    assert_eq!(one["votes"][0]["decided_by"], local_actor.as_str());
    assert_eq!(one["votes"][0]["verification"], "unverified");
    let inspected = operator
        .get(&format!("/console/api/sessions/{session}"))
        .await
        .json();
    assert_eq!(inspected["session"]["status"], "completed");
    assert_eq!(worker.invocations().len(), 1, "the refund ran once");

    tokio::task::spawn_blocking(move || drop(worker))
        .await
        .unwrap();
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
}

#[tokio::test]
async fn a_revoked_token_ends_its_live_updates_and_failed_sign_ins_are_throttled() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let launch = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_AUTH", "required")
        .env("RUNTIME_HTTP_ADDR", &addr);
    let viewer = launch.token("vera", "viewer");
    let other = launch.token("olga", "viewer");
    let daemon = launch.start().await;
    wait_for_ready(&addr, 200).await;

    // The live updates of vera's session end once her token is revoked, within the re-check
    // interval, and the session's calls are refused.
    let vera = Signed::login(&addr, Some(&viewer)).await;
    let mut events = Events::open(&vera).await;
    events.until("event: current_end").await;
    let revoked = launch
        .command()
        .args(["tokens", "revoke", "vera"])
        .output()
        .unwrap();
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    events
        .ended(phrony_runtime::console::EVENTS_RECHECK + Duration::from_secs(5))
        .await;
    assert_eq!(vera.get("/console/api/session").await.status, 401);
    let reopened = vera.get("/console/api/events").await;
    assert_eq!(reopened.status, 401, "{}", reopened.body);

    // One credential failing again and again: the 5th failure locks it; the 6th try is 429
    // with `Retry-After`, before the credential is even checked.
    let wrong = "phr_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
    for _ in 0..5 {
        let refused = post_json(&addr, "/console/api/login", &[], &json!({"token": wrong})).await;
        assert_eq!(refused.status, 401, "{}", refused.body);
    }
    let throttled = post_json(&addr, "/console/api/login", &[], &json!({"token": wrong})).await;
    assert_eq!(throttled.status, 429, "{}", throttled.body);
    let wait: u64 = throttled.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "Retry-After: {wait}");
    assert!(
        throttled.message().contains("too many failed sign-ins"),
        "{}",
        throttled.body
    );
    assert!(!throttled.body.contains(wrong), "the token is never echoed");

    // Another credential from the same address still signs in (5 failures of 10), and that
    // success starts the address's count over...
    Signed::login(&addr, Some(&other)).await;
    // ...so it takes 10 more failures, with as many different tokens, to lock the address:
    // then even a good token is refused for a while.
    for i in 0..10 {
        let guess = format!("phr_{i:0>43}");
        let refused = post_json(&addr, "/console/api/login", &[], &json!({"token": guess})).await;
        assert_eq!(refused.status, 401, "attempt {i}: {}", refused.body);
    }
    let locked = post_json(&addr, "/console/api/login", &[], &json!({"token": other})).await;
    assert_eq!(locked.status, 429, "{}", locked.body);
    assert!(locked.header("retry-after").is_some());

    // The lockouts are logged, naming the key and never the token.
    daemon
        .logged("console sign-ins throttled after repeated failures")
        .await;
    let log = daemon.logged("client 127.0.0.1").await;
    assert!(!log.contains(wrong) && !log.contains(&other), "{log}");
}
