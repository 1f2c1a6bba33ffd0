//! The web console ([`crate::console`]): assets and headers, login, sessions, CSRF, bounds,
//! and manager approvals recorded as such.

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use super::*;
use crate::console::{
    COOKIE, CSP, CSRF_HEADER, MAX_ACTION_BODY, MAX_COMMENT, MAX_LOGIN_BODY, MAX_LOGIN_FAILURES,
    MAX_USERNAME, hash_password,
};

const PASSWORD: &str = "correct horse battery staple";

/// One hash for every test (Argon2id costs real time even optimised).
fn password_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| hash_password(PASSWORD).unwrap())
}

/// The walkthrough with manager logins bob@bank (manager), alice@bank (manager: she is also the
/// requesting rep) and audra@bank (auditor).
fn with_console(text: String) -> String {
    let hash = password_hash();
    let mut text = text;
    text.push_str("\nconsole:\n  managers:\n");
    for (user, role) in [
        ("bob@bank", "manager"),
        ("alice@bank", "manager"),
        ("audra@bank", "auditor"),
    ] {
        text.push_str(&format!(
            "    - {{username: \"{user}\", password_hash: \"{hash}\", role: {role}}}\n"
        ));
    }
    text
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

async fn send(
    app: &axum::Router,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:8009");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body.to_vec())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

const JSON: (&str, &str) = ("content-type", "application/json");

async fn login(app: &axum::Router, user: &str, password: &str) -> Reply {
    let body = json!({"username": user, "password": password}).to_string();
    send(app, "POST", "/console/api/login", &[JSON], body.as_bytes()).await
}

/// The session cookie and CSRF token of a successful login.
async fn signed_in(app: &axum::Router, user: &str) -> (String, String) {
    let reply = login(app, user, PASSWORD).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let cookie = reply.headers["set-cookie"].to_str().unwrap();
    let token = cookie.split(';').next().unwrap().to_owned();
    (token, reply.json()["csrf"].as_str().unwrap().to_owned())
}

/// A gate on the walkthrough with console logins, its router, and the harness that builds
/// requests (decisions go through the router, so that the router's gate sees them).
async fn app() -> (Harness, axum::Router) {
    let h = harness_with(with_console).await;
    let gate = Arc::new(
        Gate::open(
            Settings::load(&h.dir.path().join("gate.yaml")).unwrap(),
            SigningKey::load_or_create(&h.key_pem).unwrap(),
            Arc::new(MemoryStore::new()),
            h.clock.clone(),
        )
        .await
        .unwrap(),
    );
    let app = crate::router(gate);
    (h, app)
}

const ORG: (&str, &str) = ("authorization", "Bearer rgnt_ctrl_walkthrough_local");
const ADMIN: (&str, &str) = ("authorization", "Bearer rgnt_admin_walkthrough_local");

async fn decide(app: &axum::Router, body: &Value) -> Value {
    let reply = send(
        app,
        "POST",
        "/v1/control/decisions",
        &[ORG, JSON],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

async fn complete(app: &axum::Router, decision: &Value, status: &str) {
    let path = format!(
        "/v1/control/decisions/{}/complete",
        decision["decision_id"].as_str().unwrap()
    );
    let body = json!({"status": status, "downstream_ref": "re_1", "error": null}).to_string();
    let reply = send(app, "POST", &path, &[ORG, JSON], body.as_bytes()).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

/// The audit log through the admin API.
async fn audit_events(app: &axum::Router) -> Vec<Value> {
    let reply = send(app, "GET", "/v1/admin/audit", &[ADMIN], b"").await;
    String::from_utf8(reply.body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn the_page_is_embedded_and_served_with_a_strict_csp() {
    let (_h, app) = app().await;
    let page = send(&app, "GET", "/console/", &[], b"").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(page.headers["content-security-policy"], CSP);
    assert!(CSP.starts_with("default-src 'self'"));
    assert!(!CSP.contains("unsafe"), "{CSP}");
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    assert_eq!(page.headers["cache-control"], "no-store");
    assert!(
        page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = String::from_utf8(page.body).unwrap();
    assert!(html.contains("<script src=\"/console/assets/console.js\" defer></script>"));
    for (path, kind) in [
        ("/console/assets/console.js", "text/javascript"),
        ("/console/assets/console.css", "text/css"),
    ] {
        let asset = send(&app, "GET", path, &[], b"").await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert!(
            asset.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
        assert_eq!(asset.headers["content-security-policy"], CSP);
        let text = String::from_utf8(asset.body).unwrap();
        // Nothing is fetched from elsewhere, and data is never parsed as HTML.
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "{path}"
        );
        assert!(
            !text.contains("innerHTML") && !text.contains("insertAdjacentHTML"),
            "{path}"
        );
    }
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "no inline script or style"
    );
    let redirect = send(&app, "GET", "/console", &[], b"").await;
    assert_eq!(redirect.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(redirect.headers["location"], "/console/");
}

#[tokio::test]
async fn every_data_route_needs_a_session() {
    let (_h, app) = app().await;
    let bogus = format!("{COOKIE}=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    for path in ["session", "decisions", "approvals", "mandates", "audit"] {
        let path = format!("/console/api/{path}");
        assert_eq!(
            send(&app, "GET", &path, &[], b"").await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        let with_bogus = send(&app, "GET", &path, &[("cookie", &bogus)], b"").await;
        assert_eq!(with_bogus.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    // The admin key is not a console credential on the data routes.
    let admin = send(&app, "GET", "/console/api/decisions", &[ADMIN], b"").await;
    assert_eq!(admin.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn wrong_logins_are_401_alike_and_repeated_failures_429() {
    let (_h, app) = app().await;
    let wrong = login(&app, "bob@bank", "not the password").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let unknown = login(&app, "mallory@bank", "not the password").await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.json()["detail"],
        unknown.json()["detail"],
        "no user enumeration"
    );
    assert!(wrong.headers.get("set-cookie").is_none());
    let admin = send(
        &app,
        "POST",
        "/console/api/login",
        &[JSON],
        br#"{"admin_key":"rgnt_admin_wrong"}"#,
    )
    .await;
    assert_eq!(admin.status, StatusCode::UNAUTHORIZED);
    let both = send(
        &app,
        "POST",
        "/console/api/login",
        &[JSON],
        br#"{"admin_key":"k","username":"bob@bank","password":"x"}"#,
    )
    .await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    for _ in 1..MAX_LOGIN_FAILURES {
        assert_eq!(
            login(&app, "bob@bank", "guess").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // Even the right password waits out the window now; other users are not affected.
    assert_eq!(
        login(&app, "bob@bank", PASSWORD).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        login(&app, "audra@bank", PASSWORD).await.status,
        StatusCode::OK
    );

    // The hash-chained audit holds who signed in and a known user's refusals, never a guessed
    // username's (which would let anyone grow the log) and never a password.
    let logins: Vec<Value> = audit_events(&app)
        .await
        .into_iter()
        .filter(|e| e["type"] == "gate.console_login")
        .collect();
    let seen: Vec<(String, String, String)> = logins
        .iter()
        .map(|e| {
            let p = &e["payload"];
            (
                p["user"].as_str().unwrap().to_owned(),
                p["via"].as_str().unwrap().to_owned(),
                p["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let refused = |user: &str, via: &str| (user.to_owned(), via.to_owned(), "refused".to_owned());
    let mut want = vec![
        refused("bob@bank", "manager"),
        refused("admin", "admin_key"),
    ];
    for _ in 1..MAX_LOGIN_FAILURES {
        want.push(refused("bob@bank", "manager"));
    }
    want.push((
        "audra@bank".to_owned(),
        "manager".to_owned(),
        "signed_in".to_owned(),
    ));
    assert_eq!(seen, want);
    assert_eq!(logins.last().unwrap()["actor"], "audra@bank");
    assert!(logins.last().unwrap()["payload"]["role"].is_string());
    let text = serde_json::to_string(&logins).unwrap();
    assert!(!text.contains("mallory") && !text.contains(PASSWORD) && !text.contains("guess"));
}

#[tokio::test]
async fn a_login_sets_a_strict_cookie_and_changes_need_the_csrf_token() {
    let (_h, app) = app().await;
    let reply = login(&app, "bob@bank", PASSWORD).await;
    assert_eq!(reply.status, StatusCode::OK);
    let cookie = reply.headers["set-cookie"].to_str().unwrap();
    for attribute in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert_eq!(reply.json()["user"], "bob@bank");
    assert_eq!(reply.json()["role"], "manager");
    assert_eq!(reply.json()["via"], "console_login");
    let (session, csrf) = signed_in(&app, "bob@bank").await;
    let who = send(
        &app,
        "GET",
        "/console/api/session",
        &[("cookie", &session)],
        b"",
    )
    .await;
    assert_eq!(who.json()["csrf"], csrf.as_str());

    let path = "/console/api/approvals/esc_unknown/approve";
    let none = send(&app, "POST", path, &[("cookie", &session), JSON], b"{}").await;
    assert_eq!(none.status, StatusCode::FORBIDDEN);
    assert!(
        none.json()["detail"]
            .as_str()
            .unwrap()
            .contains(CSRF_HEADER)
    );
    let wrong = send(
        &app,
        "POST",
        path,
        &[("cookie", &session), (CSRF_HEADER, "nope"), JSON],
        b"{}",
    )
    .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    let cross = send(
        &app,
        "POST",
        path,
        &[
            ("cookie", &session),
            (CSRF_HEADER, &csrf),
            ("origin", "https://evil.example"),
            JSON,
        ],
        b"{}",
    )
    .await;
    assert_eq!(cross.status, StatusCode::FORBIDDEN);
    let same = send(
        &app,
        "POST",
        path,
        &[
            ("cookie", &session),
            (CSRF_HEADER, &csrf),
            ("origin", "http://127.0.0.1:8009"),
            JSON,
        ],
        b"{}",
    )
    .await;
    assert_eq!(
        same.status,
        StatusCode::NOT_FOUND,
        "past the checks: the ref is unknown"
    );
    // Another session's token does not fit this one.
    let (_, other_csrf) = signed_in(&app, "audra@bank").await;
    let mixed = send(
        &app,
        "POST",
        path,
        &[("cookie", &session), (CSRF_HEADER, &other_csrf), JSON],
        b"{}",
    )
    .await;
    assert_eq!(mixed.status, StatusCode::FORBIDDEN);

    let out = send(
        &app,
        "POST",
        "/console/api/logout",
        &[("cookie", &session), (CSRF_HEADER, &csrf)],
        b"",
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert!(
        out.headers["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    let after = send(
        &app,
        "GET",
        "/console/api/session",
        &[("cookie", &session)],
        b"",
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn bodies_and_fields_are_bounded() {
    let (_h, app) = app().await;
    let big = vec![b' '; MAX_LOGIN_BODY + 1];
    let reply = send(&app, "POST", "/console/api/login", &[JSON], &big).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains(&MAX_LOGIN_BODY.to_string())
    );
    let form = send(
        &app,
        "POST",
        "/console/api/login",
        &[("content-type", "application/x-www-form-urlencoded")],
        b"username=bob%40bank&password=x",
    )
    .await;
    assert_eq!(form.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let long = login(&app, &"u".repeat(MAX_USERNAME + 1), PASSWORD).await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST);
    assert!(
        long.json()["detail"]
            .as_str()
            .unwrap()
            .contains("`username`")
    );
    let unknown_field = send(
        &app,
        "POST",
        "/console/api/login",
        &[JSON],
        br#"{"username":"bob@bank","password":"x","role":"admin"}"#,
    )
    .await;
    assert_eq!(unknown_field.status, StatusCode::UNPROCESSABLE_ENTITY);

    let (session, csrf) = signed_in(&app, "bob@bank").await;
    let path = "/console/api/approvals/esc_unknown/approve";
    let auth = [
        ("cookie", session.as_str()),
        (CSRF_HEADER, csrf.as_str()),
        JSON,
    ];
    let comment = json!({"comment": "c".repeat(MAX_COMMENT + 1)}).to_string();
    let reply = send(&app, "POST", path, &auth, comment.as_bytes()).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("`comment`")
    );
    let huge = vec![b' '; MAX_ACTION_BODY + 1];
    assert_eq!(
        send(&app, "POST", path, &auth, &huge).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
}

#[tokio::test]
async fn a_manager_login_approves_as_itself_within_its_role() {
    let (h, app) = app().await;
    let escalate =
        |charge: &'static str| h.refund(json!(40), "review", charge, "500", Some(charge));
    let first = decide(&app, &escalate("ch_1")).await;
    let second = decide(&app, &escalate("ch_2")).await;
    assert_eq!(first["decision"], "escalate");
    let (r1, r2) = (
        first["escalation"]["ref"].as_str().unwrap(),
        second["escalation"]["ref"].as_str().unwrap(),
    );

    // The auditor role is not the escalation's approver role; alice asked for the refund.
    for (user, needle) in [
        ("audra@bank", "role `auditor`"),
        ("alice@bank", "cannot approve"),
    ] {
        let (session, csrf) = signed_in(&app, user).await;
        let reply = send(
            &app,
            "POST",
            &format!("/console/api/approvals/{r1}/approve"),
            &[("cookie", &session), (CSRF_HEADER, &csrf), JSON],
            b"{}",
        )
        .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{user}");
        assert!(
            reply.json()["detail"].as_str().unwrap().contains(needle),
            "{user}: {}",
            reply.json()
        );
    }

    let (session, csrf) = signed_in(&app, "bob@bank").await;
    let auth = [
        ("cookie", session.as_str()),
        (CSRF_HEADER, csrf.as_str()),
        JSON,
    ];
    // A manager does not name someone else as approver.
    let other = send(
        &app,
        "POST",
        &format!("/console/api/approvals/{r1}/approve"),
        &auth,
        br#"{"approver":"carol@bank"}"#,
    )
    .await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);
    let ok = send(
        &app,
        "POST",
        &format!("/console/api/approvals/{r1}/approve"),
        &auth,
        br#"{"comment":"  reviewed  "}"#,
    )
    .await;
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&ok.body)
    );
    let view = ok.json();
    assert_eq!(view["status"], "approved");
    assert_eq!(view["comment"], "reviewed");
    assert_eq!(view["decided_by"]["sub"], "bob@bank");
    assert_eq!(view["decided_by"]["role"], "manager");
    assert_eq!(view["decided_by"]["via"], "console_login");
    let rejected = send(
        &app,
        "POST",
        &format!("/console/api/approvals/{r2}/reject"),
        &auth,
        b"",
    )
    .await;
    assert_eq!(rejected.json()["status"], "rejected");
    let again = send(
        &app,
        "POST",
        &format!("/console/api/approvals/{r2}/approve"),
        &auth,
        b"{}",
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);

    // The audit log records the manager as the actor.
    let events = audit_events(&app).await;
    let decided: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "gate.approval_decided")
        .collect();
    assert_eq!(decided.len(), 2);
    assert!(decided.iter().all(|e| e["actor"] == "bob@bank" && e["payload"]["approver"]["via"] == "console_login"));

    // The data routes show it, and the export is an attachment.
    let list = send(
        &app,
        "GET",
        "/console/api/approvals",
        &[("cookie", &session)],
        b"",
    )
    .await
    .json();
    assert_eq!(list["approvals"].as_array().unwrap().len(), 2);
    let audit = send(
        &app,
        "GET",
        "/console/api/audit",
        &[("cookie", &session)],
        b"",
    )
    .await;
    assert_eq!(audit.status, StatusCode::OK);
    assert!(
        audit.headers["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert_eq!(
        String::from_utf8(audit.body).unwrap().lines().count(),
        events.len()
    );
}

#[tokio::test]
async fn an_admin_key_session_names_the_approver_and_obeys_the_token_rule() {
    let (h, app) = app().await;
    let escalated = decide(
        &app,
        &h.refund(json!(40), "review", "ch_1", "500", Some("k1")),
    )
    .await;
    let r = escalated["escalation"]["ref"].as_str().unwrap();
    let reply = send(
        &app,
        "POST",
        "/console/api/login",
        &[JSON],
        br#"{"admin_key":"rgnt_admin_walkthrough_local"}"#,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["via"], "admin_key");
    let session = reply.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let csrf = reply.json()["csrf"].as_str().unwrap().to_owned();
    let auth = [
        ("cookie", session.as_str()),
        (CSRF_HEADER, csrf.as_str()),
        JSON,
    ];
    let path = format!("/console/api/approvals/{r}/approve");
    let nameless = send(&app, "POST", &path, &auth, b"{}").await;
    assert_eq!(nameless.status, StatusCode::BAD_REQUEST);
    assert!(
        nameless.json()["detail"]
            .as_str()
            .unwrap()
            .contains("`approver`")
    );
    // The walkthrough requires an approver id_token for admin-key decisions.
    let named = send(&app, "POST", &path, &auth, br#"{"approver":"carol@bank"}"#).await;
    assert_eq!(named.status, StatusCode::FORBIDDEN);
    assert!(
        named.json()["detail"]
            .as_str()
            .unwrap()
            .contains("id_token")
    );
}

#[tokio::test]
async fn mandates_show_used_and_held_amounts() {
    let (h, app) = app().await;
    let allowed = decide(
        &app,
        &h.refund(json!(50), "active", "ch_1", "500", Some("k1")),
    )
    .await;
    complete(&app, &allowed, "success").await;
    decide(
        &app,
        &h.refund(json!(30), "active", "ch_2", "500", Some("k2")),
    )
    .await;
    let released = decide(
        &app,
        &h.refund(json!(20), "active", "ch_3", "500", Some("k3")),
    )
    .await;
    complete(&app, &released, "failed").await;
    let admin = send(&app, "GET", "/v1/admin/mandates", &[ADMIN], b"").await;
    assert_eq!(admin.status, StatusCode::OK);
    let m = &admin.json()["mandates"][0];
    assert_eq!(m["mandate_id"], "mnd_support_refunds");
    assert_eq!(m["used_today"], "50.00");
    assert_eq!(m["held_today"], "30.00");
    assert_eq!(m["used_this_month"], "50.00");
    assert_eq!(m["held_this_month"], "30.00");
    assert_eq!(m["per_tx_limit"], "200.00");
    assert_eq!(
        send(&app, "GET", "/v1/admin/mandates", &[], b"")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let (session, _) = signed_in(&app, "bob@bank").await;
    let console = send(
        &app,
        "GET",
        "/console/api/mandates",
        &[("cookie", &session)],
        b"",
    )
    .await
    .json();
    assert_eq!(console["mandates"][0], *m);
}

#[test]
fn the_console_section_is_checked() {
    let hash = password_hash();
    let cases = [
        (format!("  managers: [{{username: bob, password_hash: \"{hash}\"}}, {{username: bob, password_hash: \"{hash}\"}}]\n"), "console.managers[1].username"),
        ("  managers: [{username: bob, password_hash: \"plain-text\"}]\n".to_owned(), "console.managers[0].password_hash"),
        ("  managers: [{username: bob, password_hash: \"$pbkdf2-sha256$i=1000$c2FsdA$aGFzaA\"}]\n".to_owned(), "console.managers[0].password_hash"),
        (format!("  managers: [{{username: \"bob\\u0007\", password_hash: \"{hash}\"}}]\n"), "console.managers[0].username"),
        (format!("  managers: [{{username: bob, password_hash: \"{hash}\", role: \"\"}}]\n"), "console.managers[0].role"),
        ("  session_ttl_seconds: 5\n".to_owned(), "console.session_ttl_seconds"),
    ];
    for (section, field) in cases {
        let dir = config_dir(|s| format!("{s}\nconsole:\n{section}"));
        let err = Settings::load(&dir.path().join("gate.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
    let dir = config_dir(|s| {
        format!("{s}\nconsole:\n  managers: [{{username: bob, password_hash: \"{hash}\"}}]\n")
    });
    let settings = Settings::load(&dir.path().join("gate.yaml")).unwrap();
    assert_eq!(
        settings.console.managers["bob"].role, "manager",
        "the default role"
    );
    assert!(
        !format!("{settings:?}").contains(hash),
        "the hash is not in debug output"
    );
}

#[test]
fn hash_password_bounds_the_password_and_makes_argon2id() {
    assert!(hash_password("short").is_err());
    assert!(hash_password(&"p".repeat(crate::console::MAX_PASSWORD + 1)).is_err());
    let a = hash_password(PASSWORD).unwrap();
    let b = hash_password(PASSWORD).unwrap();
    assert!(a.starts_with("$argon2id$v=19$"), "{a}");
    assert_ne!(a, b, "salted");
}
