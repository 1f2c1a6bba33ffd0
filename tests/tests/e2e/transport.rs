//! TLS and mutual TLS end to end: the real `phrony-runtime` serving TLS with certificates
//! generated at test time, the real `phrony` CLI connecting with `PHRONY_TLS_CA` (and
//! `PHRONY_TLS_CERT`/`PHRONY_TLS_KEY` for mTLS), and the start-up errors of bad TLS files.
//!
//! What a verified principal may then do is the edge's business (the `access` slice); these
//! tests pin the transport: who can complete a connection at all.

use std::process::Command;

use phrony_client::ClientTls;
use phrony_test_support::pki::TestCa;
use tests::cli::{fails, json, ok, run};
use tests::daemon::{Backend, Daemon, binaries};

struct Tls {
    dir: tempfile::TempDir,
    ca: TestCa,
    cert: String,
    key: String,
    ca_file: String,
}

fn tls() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("phrony e2e CA");
    let (cert, key) = ca.server().write(dir.path(), "server");
    let ca_file = ca.write(dir.path(), "ca");
    Tls {
        cert: cert.display().to_string(),
        key: key.display().to_string(),
        ca_file: ca_file.display().to_string(),
        ca,
        dir,
    }
}

fn probe(t: &Tls) -> ClientTls {
    let client = t.ca.client("readiness-probe");
    ClientTls::new(t.ca.cert_pem()).with_identity(client.cert, client.key)
}

#[test]
fn the_cli_talks_to_a_tls_daemon_with_phrony_tls_ca() {
    let t = tls();
    let daemon = Daemon::start_with_tls(
        Backend::Sqlite,
        &[("RUNTIME_TLS_CERT", &t.cert), ("RUNTIME_TLS_KEY", &t.key)],
        Some(ClientTls::new(t.ca.cert_pem())),
    )
    .unwrap();
    let status = json(&ok(daemon
        .phrony()
        .env("PHRONY_TLS_CA", &t.ca_file)
        .args(["status", "--output", "json"])));
    assert_eq!(status["health"], "serving", "{status}");
    // https:// works too, and so does the flag.
    let https = format!(
        "https://localhost:{}",
        daemon.addr().rsplit(':').next().unwrap()
    );
    ok(daemon.phrony().args([
        "--runtime-addr",
        &https,
        "--tls-ca",
        &t.ca_file,
        "agents",
        "ls",
    ]));
    // Plaintext against the TLS listener does not get an answer; the CLI says what to set.
    let err = fails(daemon.phrony().args(["status"]));
    assert!(err.contains("speaks TLS; pass --tls-ca"), "{err}");
    // https:// without a CA is refused before connecting, naming what to set.
    let err = fails(
        daemon
            .phrony()
            .args(["--runtime-addr", &https, "agents", "ls"]),
    );
    assert!(err.contains("PHRONY_TLS_CA"), "{err}");
    // A CA that did not sign the runtime's certificate: the handshake fails.
    let rogue = TestCa::new("rogue");
    let rogue_file = rogue.write(t.dir.path(), "rogue");
    let err = fails(
        daemon
            .phrony()
            .env("PHRONY_TLS_CA", &rogue_file)
            .args(["agents", "ls"]),
    );
    assert!(err.contains("cannot reach"), "{err}");
    let logs = daemon.logs();
    assert!(logs.contains("TLS on the gRPC listener"), "{logs}");
}

#[test]
fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let t = tls();
    let roles = t.dir.path().join("clients.yaml");
    std::fs::write(
        &roles,
        "clients:\n  ops-cli:\n    roles: [admin]\n  readiness-probe:\n    roles: [viewer]\n",
    )
    .unwrap();
    let roles = roles.display().to_string();
    let daemon = Daemon::start_with_tls(
        Backend::Sqlite,
        &[
            ("RUNTIME_TLS_CERT", &t.cert),
            ("RUNTIME_TLS_KEY", &t.key),
            ("RUNTIME_TLS_CLIENT_CA", &t.ca_file),
            ("RUNTIME_TLS_CLIENT_ROLES", &roles),
        ],
        Some(probe(&t)),
    )
    .unwrap();
    let (cert, key) = t.ca.client("ops-cli").write(t.dir.path(), "ops-cli");
    let with_cert = |cmd: &mut Command| {
        cmd.env("PHRONY_TLS_CA", &t.ca_file)
            .env("PHRONY_TLS_CERT", &cert)
            .env("PHRONY_TLS_KEY", &key);
    };
    let mut cmd = daemon.phrony();
    with_cert(&mut cmd);
    ok(cmd.args(["agents", "ls"]));

    // No client certificate: refused.
    let err = fails(
        daemon
            .phrony()
            .env("PHRONY_TLS_CA", &t.ca_file)
            .args(["agents", "ls"]),
    );
    assert!(!err.is_empty());
    // A client certificate from another CA: refused.
    let rogue = TestCa::new("rogue");
    let (rc, rk) = rogue.client("ops-cli").write(t.dir.path(), "rogue-client");
    let err = fails(
        daemon
            .phrony()
            .env("PHRONY_TLS_CA", &t.ca_file)
            .env("PHRONY_TLS_CERT", &rc)
            .env("PHRONY_TLS_KEY", &rk)
            .args(["agents", "ls"]),
    );
    assert!(!err.is_empty());
    // A certificate without its key is a CLI error naming what is missing.
    let err = fails(
        daemon
            .phrony()
            .env("PHRONY_TLS_CA", &t.ca_file)
            .env("PHRONY_TLS_CERT", &cert)
            .args(["agents", "ls"]),
    );
    assert!(err.contains("without its key"), "{err}");
}

/// The daemon's start-up with these environment variables: it must exit with an error.
fn start_fails(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&binaries().runtime)
        .env(
            "RUNTIME_DATABASE_URL",
            format!("sqlite://{}", dir.path().join("phrony.db").display()),
        )
        .env("RUNTIME_GRPC_ADDR", "127.0.0.1:0")
        .env("XDG_DATA_HOME", dir.path())
        .env("HOME", dir.path())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {env:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn bad_tls_and_oidc_settings_stop_the_daemon_with_one_line_naming_the_file() {
    let t = tls();
    let junk = t.dir.path().join("junk.pem");
    std::fs::write(&junk, "not a pem").unwrap();
    let junk = junk.display().to_string();
    let missing = t.dir.path().join("missing.pem").display().to_string();
    for (env, var, file) in [
        (
            vec![
                ("RUNTIME_TLS_CERT", missing.as_str()),
                ("RUNTIME_TLS_KEY", t.key.as_str()),
            ],
            "RUNTIME_TLS_CERT",
            "missing.pem",
        ),
        (
            vec![
                ("RUNTIME_TLS_CERT", junk.as_str()),
                ("RUNTIME_TLS_KEY", t.key.as_str()),
            ],
            "RUNTIME_TLS_CERT",
            "junk.pem",
        ),
        (
            vec![
                ("RUNTIME_TLS_CERT", t.cert.as_str()),
                ("RUNTIME_TLS_KEY", junk.as_str()),
            ],
            "RUNTIME_TLS_KEY",
            "junk.pem",
        ),
        (
            vec![
                ("RUNTIME_TLS_CERT", t.cert.as_str()),
                ("RUNTIME_TLS_KEY", t.key.as_str()),
                ("RUNTIME_TLS_CLIENT_CA", junk.as_str()),
            ],
            "RUNTIME_TLS_CLIENT_CA",
            "junk.pem",
        ),
        (
            vec![("RUNTIME_TLS_CERT", t.cert.as_str())],
            "RUNTIME_TLS_KEY",
            "",
        ),
        (
            vec![
                ("RUNTIME_OIDC_ISSUER", "https://idp.test"),
                ("RUNTIME_OIDC_AUDIENCE", "phrony"),
                ("RUNTIME_OIDC_JWKS", missing.as_str()),
            ],
            "RUNTIME_OIDC_JWKS",
            "missing.pem",
        ),
        (
            vec![("RUNTIME_OIDC_ISSUER", "https://idp.test")],
            "RUNTIME_OIDC_AUDIENCE",
            "",
        ),
    ] {
        let stderr = start_fails(&env);
        let error: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("phrony-runtime: error:"))
            .collect();
        assert_eq!(error.len(), 1, "one error line for {env:?}:\n{stderr}");
        assert!(
            error[0].contains(var) && error[0].contains(file),
            "{env:?}:\n{stderr}"
        );
    }
}

/// What the CLI says for `agents ls` with `PHRONY_TOKEN=token` over TLS: `Ok(stdout)`, or
/// `Err((exit code, stderr))`.
fn agents_ls_with(daemon: &Daemon, t: &Tls, token: &str) -> Result<String, (Option<i32>, String)> {
    let out = daemon
        .phrony()
        .env("PHRONY_TLS_CA", &t.ca_file)
        .env("PHRONY_TOKEN", token)
        .args(["agents", "ls"])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err((
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

/// A refusal at the access edge as the CLI reports it: exit 4 (`UNAUTHENTICATED` and
/// `PERMISSION_DENIED`), one line, `not authenticated` naming why.
fn unauthenticated(code: Option<i32>, stderr: &str, why: &str) {
    assert_eq!(code, Some(4), "{why}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{why}: one line: {stderr}");
    assert!(
        stderr.contains("not authenticated") && stderr.contains(why),
        "{why}: {stderr}"
    );
}

/// OIDC at the edge, over TLS, in `required` mode: a JWT from the configured issuer is accepted
/// with the roles of its claim; expired, wrong-audience, wrong-issuer, badly signed and
/// unknown-key tokens are `UNAUTHENTICATED`.
#[test]
fn oidc_tokens_are_verified_at_the_edge() {
    use phrony_test_support::pki::TestIssuer;
    use serde_json::json;
    let t = tls();
    let issuer = TestIssuer::new("k1");
    let jwks = t.dir.path().join("jwks.json");
    std::fs::write(&jwks, TestIssuer::jwks(&[&issuer])).unwrap();
    let jwks = jwks.display().to_string();
    let daemon = Daemon::start_with_tls(
        Backend::Sqlite,
        &[
            ("RUNTIME_TLS_CERT", &t.cert),
            ("RUNTIME_TLS_KEY", &t.key),
            ("RUNTIME_AUTH", "required"),
            ("RUNTIME_OIDC_ISSUER", "https://idp.test"),
            ("RUNTIME_OIDC_AUDIENCE", "phrony"),
            ("RUNTIME_OIDC_JWKS", &jwks),
        ],
        Some(ClientTls::new(t.ca.cert_pem())),
    )
    .unwrap();
    let now = chrono::Utc::now().timestamp();
    let claims = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = json!({"iss": "https://idp.test", "aud": "phrony", "sub": "dana",
            "exp": now + 300, "roles": ["viewer"]});
        f(&mut c);
        c
    };
    agents_ls_with(&daemon, &t, &issuer.token(&claims(&|_| {}))).unwrap();
    let impostor = TestIssuer::new("k1");
    for (token, reason) in [
        (
            issuer.token(&claims(&|c| c["exp"] = json!(now - 3600))),
            "expired",
        ),
        (
            issuer.token(&claims(&|c| c["aud"] = json!("other"))),
            "wrong audience",
        ),
        (
            issuer.token(&claims(&|c| c["iss"] = json!("https://evil.test"))),
            "wrong issuer",
        ),
        (impostor.token(&claims(&|_| {})), "bad signature"),
        (
            TestIssuer::new("k2").token(&claims(&|_| {})),
            "unknown key id",
        ),
    ] {
        let (code, err) = agents_ls_with(&daemon, &t, &token).unwrap_err();
        unauthenticated(code, &err, reason);
    }
}

/// Mutual TLS at the edge in `required` mode: the mapped CN works with its roles, a CN the
/// roles file does not list is `UNAUTHENTICATED` naming it.
#[test]
fn unknown_certificate_subjects_are_unauthenticated_at_the_edge() {
    let t = tls();
    let roles = t.dir.path().join("clients.yaml");
    std::fs::write(
        &roles,
        "clients:\n  ops-cli:\n    roles: [viewer]\n  readiness-probe:\n    roles: [viewer]\n",
    )
    .unwrap();
    let roles = roles.display().to_string();
    let daemon = Daemon::start_with_tls(
        Backend::Sqlite,
        &[
            ("RUNTIME_TLS_CERT", &t.cert),
            ("RUNTIME_TLS_KEY", &t.key),
            ("RUNTIME_TLS_CLIENT_CA", &t.ca_file),
            ("RUNTIME_TLS_CLIENT_ROLES", &roles),
            ("RUNTIME_AUTH", "required"),
        ],
        Some(probe(&t)),
    )
    .unwrap();
    let with = |cn: &str| {
        let (cert, key) = t.ca.client(cn).write(t.dir.path(), cn);
        let mut cmd = daemon.phrony();
        cmd.env("PHRONY_TLS_CA", &t.ca_file)
            .env("PHRONY_TLS_CERT", cert)
            .env("PHRONY_TLS_KEY", key);
        cmd
    };
    ok(with("ops-cli").args(["agents", "ls"]));
    let out = run(with("mallory").args(["agents", "ls"]));
    unauthenticated(out.code, &out.stderr, "\"mallory\"");
    assert!(
        out.stderr.contains("not in RUNTIME_TLS_CLIENT_ROLES")
            && out.stderr.contains("--tls-cert and --tls-key")
            && !out.stderr.contains("PHRONY_TOKEN"),
        "the refusal of a certificate names the client-certificate options: {}",
        out.stderr
    );
    // The mapped subject has its roles and no more: a viewer cannot deploy.
    let out = run(with("ops-cli").args(["agents", "deploy", "support/refund-agent@0.1.0"]));
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("\"ops-cli\" lacks the publish permission"),
        "{}",
        out.stderr
    );
}

/// A CLI and a daemon that disagree about TLS: the CLI says what to change instead of a
/// generic connection failure, both ways, in one line and quickly.
#[test]
fn mismatched_transports_say_what_to_set() {
    let t = tls();
    let secure = Daemon::start_with_tls(
        Backend::Sqlite,
        &[("RUNTIME_TLS_CERT", &t.cert), ("RUNTIME_TLS_KEY", &t.key)],
        Some(ClientTls::new(t.ca.cert_pem())),
    )
    .unwrap();
    let plain = Daemon::start(Backend::Sqlite).unwrap();
    for (cmd, expected) in [
        (
            secure.phrony(),
            format!(
                "Error: the runtime at {} speaks TLS; pass --tls-ca (or set PHRONY_TLS_CA) to \
                 the CA that signed its certificate\n",
                secure.addr()
            ),
        ),
        (
            {
                let mut cmd = plain.phrony();
                cmd.env("PHRONY_TLS_CA", &t.ca_file);
                cmd
            },
            format!(
                "Error: the runtime at {} does not speak TLS (it answered in plaintext); unset \
                 PHRONY_TLS_CA / --tls-ca, or serve TLS (RUNTIME_TLS_CERT, RUNTIME_TLS_KEY)\n",
                plain.addr()
            ),
        ),
    ] {
        let mut cmd = cmd;
        let started = std::time::Instant::now();
        let out = run(cmd.args(["agents", "ls"]));
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        assert_eq!(out.stderr, expected);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}

/// One name across credential kinds is one principal for the vote rules: a session started with
/// the API token `alice` cannot be approved by the certificate subject `alice` (separation of
/// duties compares names, not credentials), while the audit keeps which kind each event came
/// from (`actor_verification`). See README "Running it for real" and ARCHITECTURE.md.
#[test]
fn one_name_across_credential_kinds_is_one_principal_for_the_vote_rules() {
    use std::time::{Duration, Instant};
    use tests::stub::{REFUND_AGENT, write_refund_agent};
    let t = tls();
    let roles = t.dir.path().join("clients.yaml");
    std::fs::write(
        &roles,
        "clients:\n  alice:\n    roles: [approver]\n  readiness-probe:\n    roles: [viewer]\n",
    )
    .unwrap();
    let roles = roles.display().to_string();
    let daemon = Daemon::start_with_tls(
        Backend::Sqlite,
        &[
            ("RUNTIME_TLS_CERT", &t.cert),
            ("RUNTIME_TLS_KEY", &t.key),
            ("RUNTIME_TLS_CLIENT_CA", &t.ca_file),
            ("RUNTIME_TLS_CLIENT_ROLES", &roles),
            ("RUNTIME_AUTH", "required"),
            ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
        ],
        Some(probe(&t)),
    )
    .unwrap();
    let token = |name: &str, role: &str| {
        let out = ok(daemon
            .runtime()
            .args(["tokens", "create", "--name", name, "--role", role]));
        out.lines().last().unwrap().to_owned()
    };
    let (probe_cert, probe_key) = t.ca.client("readiness-probe").write(t.dir.path(), "probe");
    let (alice_cert, alice_key) = t.ca.client("alice").write(t.dir.path(), "alice");
    // Every connection presents a certificate (mutual TLS); a token, when sent, names the caller.
    let cli = |cert: &std::path::Path, key: &std::path::Path, token: Option<&str>| {
        let mut cmd = daemon.phrony();
        cmd.env("PHRONY_TLS_CA", &t.ca_file)
            .env("PHRONY_TLS_CERT", cert)
            .env("PHRONY_TLS_KEY", key);
        if let Some(token) = token {
            cmd.env("PHRONY_TOKEN", token);
        }
        cmd
    };
    let publisher = token("ci-publisher", "publisher");
    let alice_token = token("alice", "runner");
    let bob = token("bob", "approver");
    let project = tempfile::tempdir().unwrap();
    write_refund_agent(
        project.path(),
        &serde_json::json!([[
            {"type": "tool_call", "name": "issue_refund",
             "args": {"order_id": "ORD-1", "amount": 400, "currency": "EUR",
                      "reason": "The item arrived damaged."}},
            {"type": "completed", "stop_reason": "tool_use"}
        ]]),
    );
    ok(cli(&probe_cert, &probe_key, Some(&publisher))
        .args(["agents", "publish"])
        .arg(project.path().join("agent.yaml")));
    ok(cli(&probe_cert, &probe_key, Some(&publisher)).args([
        "agents",
        "deploy",
        &format!("{REFUND_AGENT}@0.1.0"),
    ]));
    let started = ok(cli(&probe_cert, &probe_key, Some(&alice_token)).args([
        "run",
        REFUND_AGENT,
        "--input",
        "Refund €400 for ORD-1.",
    ]));
    let session = started
        .strip_prefix("session ")
        .and_then(|r| r.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let approval = loop {
        let listed = json(&ok(cli(&probe_cert, &probe_key, None).args([
            "approvals",
            "list",
            "--session-id",
            &session,
            "--output",
            "json",
        ])));
        if let Some(a) = listed["approvals"].as_array().and_then(|a| a.first()) {
            break a["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no approval\n{}", daemon.logs());
        std::thread::sleep(Duration::from_millis(100));
    };

    // The certificate `alice` (an approver) is the token `alice` (who started the session).
    let out = run(cli(&alice_cert, &alice_key, None).args(["approvals", "approve", &approval]));
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(
        out.stderr.contains("separation of duties") && out.stderr.contains("alice started"),
        "{}",
        out.stderr
    );
    ok(cli(&probe_cert, &probe_key, Some(&bob)).args(["approvals", "approve", &approval]));

    // The audit tells the kinds apart: the start came from the token, the vote from bob's token.
    let inspected = json(&ok(cli(&probe_cert, &probe_key, None)
        .args(["sessions", "inspect", &session, "--output", "json"])));
    let event = |kind: &str| {
        inspected["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}: {inspected}"))["event"]
            .clone()
    };
    assert_eq!(event("session.started")["actor"], "alice");
    assert_eq!(event("session.started")["actor_verification"], "token");
    assert_eq!(event("approval.vote")["actor"], "bob");
    assert_eq!(inspected["session"]["started_by"]["verification"], "token");
}
