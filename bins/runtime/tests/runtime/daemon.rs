//! The real `phrony-runtime` binary, driven over gRPC with the generated tonic client, on SQLite
//! and on a fresh PostgreSQL database.

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::path::Path;
use std::time::Duration;

use crate::support::{BIN, Daemon, Launch, PgDatabase, agent_ref, compile_agent, sqlite_url};
use pb::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1 as pb;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_health::pb::health_check_response::ServingStatus;

fn assert_refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, message: &str) {
    let status = result.expect_err("the call should be refused");
    assert_eq!(status.code(), code, "{}", status.message());
    assert!(
        status.message().contains(message),
        "message {:?} should contain {message:?}",
        status.message()
    );
}

async fn publish(
    client: &mut RuntimeClient<Channel>,
    manifest: Vec<u8>,
    actor: &str,
) -> Result<pb::PublishResponse, Status> {
    let request = pb::PublishRequest {
        manifest,
        actor: actor.into(),
    };
    client
        .publish(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn deploy(
    client: &mut RuntimeClient<Channel>,
    version: &str,
    actor: &str,
) -> Result<pb::DeployResponse, Status> {
    let request = pb::DeployRequest {
        agent_ref: Some(agent_ref(version)),
        actor: actor.into(),
        allow_new_secret_endpoints: false,
    };
    client
        .deploy(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn rollback(
    client: &mut RuntimeClient<Channel>,
    to: &str,
    actor: &str,
) -> Result<pb::RollbackResponse, Status> {
    let request = pb::RollbackRequest {
        agent_ref: Some(agent_ref("")),
        to_version: to.into(),
        actor: actor.into(),
        allow_new_secret_endpoints: false,
    };
    client
        .rollback(request)
        .await
        .map(tonic::Response::into_inner)
}

/// A request carrying the actor in the `phrony-actor` header (for RPCs without an actor field).
fn as_actor<T>(message: T, actor: &'static str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("phrony-actor", MetadataValue::from_static(actor));
    request
}

async fn deprecate(client: &mut RuntimeClient<Channel>, version: &str) -> Result<String, Status> {
    let request = pb::DeprecateAgentVersionRequest {
        agent_ref: Some(agent_ref(version)),
    };
    client
        .deprecate_agent_version(as_actor(request, "erin"))
        .await
        .map(|r| r.into_inner().version_id)
}

async fn retire(client: &mut RuntimeClient<Channel>, version: &str) -> Result<String, Status> {
    let request = pb::RetireAgentVersionRequest {
        agent_ref: Some(agent_ref(version)),
    };
    client
        .retire_agent_version(as_actor(request, "erin"))
        .await
        .map(|r| r.into_inner().version_id)
}

async fn versions(client: &mut RuntimeClient<Channel>) -> Vec<pb::AgentVersionSummary> {
    let request = pb::ListAgentVersionsRequest {
        agent_ref: Some(agent_ref("")),
    };
    client
        .list_agent_versions(request)
        .await
        .unwrap()
        .into_inner()
        .versions
}

async fn active(
    client: &mut RuntimeClient<Channel>,
) -> Result<pb::GetActiveVersionResponse, Status> {
    let request = pb::GetActiveVersionRequest {
        agent_ref: Some(agent_ref("")),
    };
    client
        .get_active_version(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn get_version(
    client: &mut RuntimeClient<Channel>,
    version: &str,
) -> pb::GetAgentVersionResponse {
    let request = pb::GetAgentVersionRequest {
        agent_ref: Some(agent_ref(version)),
    };
    client
        .get_agent_version(request)
        .await
        .unwrap()
        .into_inner()
}

fn is_rfc3339_seconds(s: &str) -> bool {
    s.len() == 20 && s.ends_with('Z') && chrono_like(s)
}

fn chrono_like(s: &str) -> bool {
    let b = s.as_bytes();
    b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':' && b[16] == b':'
}

/// publish → idempotent re-publish → AlreadyExists → deploy → versions → active → rollback
/// (both forms) → deprecate/retire refusals → archive → publish refused.
async fn lifecycle_story(daemon: &Daemon, work: &Path) {
    let mut client = daemon.client().await;

    let version = client
        .get_version(pb::GetVersionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(version.version, env!("CARGO_PKG_VERSION"));
    assert!(!version.schema_version.is_empty());

    // Publish 0.1.0 and check what the server computed and stored.
    let v1 = compile_agent(&work.join("v1"), "0.1.0", "Handle refund requests.");
    let hash_v1 = phrony_manifest::CompiledAgent::from_snapshot_json(&v1)
        .unwrap()
        .content_hash();
    let published = publish(&mut client, v1.clone(), "alice").await.unwrap();
    assert_eq!(
        (
            published.namespace.as_str(),
            published.name.as_str(),
            published.version.as_str()
        ),
        ("support", "refund-agent", "0.1.0")
    );
    assert_eq!(published.content_hash, hash_v1);

    // Identical content again: the existing version, not an error.
    let again = publish(&mut client, v1.clone(), "bob").await.unwrap();
    assert_eq!(
        (published.created, again.created),
        (Some(true), Some(false))
    );
    assert_eq!(
        pb::PublishResponse {
            created: published.created,
            ..again
        },
        published
    );

    // Different content under the same label: immutable.
    let v1_changed = compile_agent(&work.join("v1b"), "0.1.0", "Handle refunds and returns.");
    assert_refused(
        publish(&mut client, v1_changed, "bob").await,
        Code::AlreadyExists,
        "0.1.0",
    );

    let v2 = compile_agent(&work.join("v2"), "0.2.0", "Handle refunds, v2.");
    let v3 = compile_agent(&work.join("v3"), "0.3.0", "Handle refunds, v3.");
    publish(&mut client, v2, "alice").await.unwrap();
    publish(&mut client, v3, "alice").await.unwrap();

    // Publishing does not activate.
    assert_refused(
        active(&mut client).await,
        Code::FailedPrecondition,
        "no active deployment",
    );

    let d1 = deploy(&mut client, "0.1.0", "alice").await.unwrap();
    assert_eq!(
        (d1.version.as_str(), d1.previous_version.as_str()),
        ("0.1.0", "")
    );
    assert_eq!(
        (d1.namespace.as_str(), d1.name.as_str()),
        ("support", "refund-agent")
    );
    assert!(is_rfc3339_seconds(&d1.deployed_at), "{}", d1.deployed_at);
    let d2 = deploy(&mut client, "0.2.0", "bob").await.unwrap();
    assert_eq!(
        (d2.version.as_str(), d2.previous_version.as_str()),
        ("0.2.0", "0.1.0")
    );
    assert_refused(
        deploy(&mut client, "9.9.9", "bob").await,
        Code::NotFound,
        "no published version \"9.9.9\"",
    );

    // Versions: newest publish first, with the recorded publisher.
    let listed = versions(&mut client).await;
    let labels: Vec<&str> = listed.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(labels, ["0.3.0", "0.2.0", "0.1.0"]);
    assert!(
        listed
            .iter()
            .all(|v| v.published_by == "alice" && is_rfc3339_seconds(&v.deployed_at))
    );
    assert_eq!(listed[2].content_hash, hash_v1);

    let now = active(&mut client).await.unwrap();
    assert_eq!((now.version.as_str(), now.actor.as_str()), ("0.2.0", "bob"));

    // Rollback to the previous version, then to a named one.
    let back = rollback(&mut client, "", "carol").await.unwrap();
    assert_eq!(
        (back.version.as_str(), back.previous_version.as_str()),
        ("0.1.0", "0.2.0")
    );
    let to = rollback(&mut client, "0.3.0", "carol").await.unwrap();
    assert_eq!(
        (to.version.as_str(), to.previous_version.as_str()),
        ("0.3.0", "0.1.0")
    );
    assert_refused(
        rollback(&mut client, "7.0.0", "carol").await,
        Code::NotFound,
        "7.0.0",
    );

    let history = client
        .list_deployments(pb::ListDeploymentsRequest {
            agent_ref: Some(agent_ref("")),
        })
        .await
        .unwrap()
        .into_inner()
        .deployments;
    let rows: Vec<(&str, &str, &str)> = history
        .iter()
        .map(|d| (d.version.as_str(), d.action.as_str(), d.actor.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("0.3.0", "rollback", "carol"),
            ("0.1.0", "rollback", "carol"),
            ("0.2.0", "deploy", "bob"),
            ("0.1.0", "deploy", "alice"),
        ]
    );

    // Deprecate / retire: the active version is protected; repeats are NotFound.
    assert_refused(
        deprecate(&mut client, "0.3.0").await,
        Code::FailedPrecondition,
        "active deployment",
    );
    assert_refused(
        retire(&mut client, "0.3.0").await,
        Code::FailedPrecondition,
        "active deployment",
    );
    let deprecated_id = deprecate(&mut client, "0.2.0").await.unwrap();
    assert_eq!(deprecated_id, listed[1].id);
    assert_refused(
        deprecate(&mut client, "0.2.0").await,
        Code::NotFound,
        "no active version \"0.2.0\"",
    );
    assert_refused(
        deploy(&mut client, "0.2.0", "bob").await,
        Code::FailedPrecondition,
        "deprecated",
    );
    let retired_id = retire(&mut client, "0.1.0").await.unwrap();
    assert_eq!(retired_id, listed[2].id);
    assert_refused(
        retire(&mut client, "0.1.0").await,
        Code::NotFound,
        "no version \"0.1.0\"",
    );
    assert_refused(
        deploy(&mut client, "0.1.0", "bob").await,
        Code::FailedPrecondition,
        "is retired and cannot be deployed",
    );
    assert_refused(
        rollback(&mut client, "0.1.0", "bob").await,
        Code::FailedPrecondition,
        "retired",
    );

    let stored = get_version(&mut client, "0.2.0").await;
    assert!(
        is_rfc3339_seconds(&stored.deprecated_at),
        "{:?}",
        stored.deprecated_at
    );
    assert_eq!(stored.retired_at, "");
    let stored = get_version(&mut client, "0.1.0").await;
    assert_eq!(
        stored.manifest, v1,
        "the stored snapshot is the published bytes"
    );
    assert!(is_rfc3339_seconds(&stored.retired_at));
    assert_eq!(stored.published_by, "alice");

    // Archive: still listed, refuses everything that changes it.
    client
        .archive_agent(as_actor(
            pb::ArchiveAgentRequest {
                agent_ref: Some(agent_ref("")),
            },
            "erin",
        ))
        .await
        .unwrap();
    let agents = client
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(agents.agents.len(), 1);
    let listed_agent = &agents.agents[0];
    assert_eq!(
        (
            listed_agent.namespace.as_str(),
            listed_agent.name.as_str(),
            listed_agent.owner.as_str()
        ),
        ("support", "refund-agent", "payments-team")
    );
    assert!(is_rfc3339_seconds(&listed_agent.archived_at));
    let other_ns = client
        .list_agents(pb::ListAgentsRequest {
            namespace: "billing".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(other_ns.agents.is_empty());
    assert_refused(
        client
            .archive_agent(pb::ArchiveAgentRequest {
                agent_ref: Some(agent_ref("")),
            })
            .await,
        Code::FailedPrecondition,
        "is already archived",
    );
    let v4 = compile_agent(&work.join("v4"), "0.4.0", "Handle refunds, v4.");
    assert_refused(
        publish(&mut client, v4, "alice").await,
        Code::FailedPrecondition,
        "is archived and cannot accept new versions",
    );
    assert_refused(
        deploy(&mut client, "0.3.0", "bob").await,
        Code::FailedPrecondition,
        "archived",
    );
    // Archiving deprecated every version.
    assert!(
        versions(&mut client)
            .await
            .iter()
            .all(|v| !v.deprecated_at.is_empty())
    );
}

#[tokio::test]
async fn lifecycle_on_sqlite() {
    let home = tempfile::tempdir().unwrap();
    let daemon = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .start()
        .await;
    lifecycle_story(&daemon, home.path()).await;
}

#[tokio::test]
async fn lifecycle_on_postgres() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let daemon = Launch::new(home.path(), Some(db.url())).start().await;
    lifecycle_story(&daemon, home.path()).await;
}

#[tokio::test]
async fn tampered_snapshots_are_rejected_and_nothing_is_stored() {
    let home = tempfile::tempdir().unwrap();
    let daemon = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .start()
        .await;
    let mut client = daemon.client().await;
    let good = compile_agent(&home.path().join("agent"), "1.0.0", "Handle refunds.");
    let text = String::from_utf8(good.clone()).unwrap();

    let tampered = [
        // A policy loosened by hand into something the engine cannot evaluate.
        (
            text.replacen("\"op\":\"gt\"", "\"op\":\"roughly\"", 1),
            "invalid manifest: ",
        ),
        // An extra field the compiler never writes.
        (
            text.replacen(
                "\"kind\":\"Agent\"",
                "\"kind\":\"Agent\",\"trusted\":true",
                1,
            ),
            "parse manifest: ",
        ),
        // Valid JSON, same content, not the compiler's bytes.
        (text.replacen(",", ", ", 1), "not in canonical form"),
        // Not a compiled snapshot at all.
        (
            text.replacen("phrony.com/policies-compiled", "phrony.com/hand-written", 1),
            "invalid manifest: ",
        ),
        ("{}".to_owned(), "parse manifest: "),
        (String::new(), "manifest is required"),
    ];
    for (manifest, message) in tampered {
        assert_ne!(manifest, text);
        assert_refused(
            publish(&mut client, manifest.into_bytes(), "mallory").await,
            Code::InvalidArgument,
            message,
        );
    }
    let agents = client
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        agents.agents.is_empty(),
        "a refused publish stored something: {agents:?}"
    );

    // The untouched snapshot is accepted.
    publish(&mut client, good, "alice").await.unwrap();
}

#[tokio::test]
async fn bundle_rpcs_answer_and_name_what_is_missing() {
    let home = tempfile::tempdir().unwrap();
    let daemon = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .start()
        .await;
    let mut client = daemon.client().await;
    assert_refused(
        client
            .run_session(pb::RunSessionRequest {
                bundle_ref: Some(pb::BundleRef {
                    namespace: "support".into(),
                    name: "refunds".into(),
                    version: String::new(),
                }),
                ..Default::default()
            })
            .await,
        Code::NotFound,
        "bundle support/refunds not found",
    );
    assert_refused(
        client.run_session(pb::RunSessionRequest::default()).await,
        Code::InvalidArgument,
        "agent_ref or bundle_ref is required",
    );
    let none = client
        .list_bundles(pb::ListBundlesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.bundles.is_empty(), "{none:?}");
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_committed_work_survives_a_restart() {
    for postgres in [false, true] {
        let db = if postgres {
            PgDatabase::create().await
        } else {
            None
        };
        if postgres && db.is_none() {
            continue;
        }
        let home = tempfile::tempdir().unwrap();
        let url = db
            .as_ref()
            .map_or_else(|| sqlite_url(home.path()), |db| db.url().to_owned());
        let launch = Launch::new(home.path(), Some(&url));
        let mut daemon = launch.start().await;
        let mut client = daemon.client().await;
        let snapshot = compile_agent(&home.path().join("agent"), "1.0.0", "Handle refunds.");
        publish(&mut client, snapshot, "alice").await.unwrap();
        deploy(&mut client, "1.0.0", "alice").await.unwrap();
        drop(client);

        let status = daemon.terminate().await;
        assert_eq!(status.code(), Some(0), "stderr:\n{}", daemon.stderr());
        let log = daemon.stderr();
        assert!(
            log.contains("SIGTERM received") && log.contains("stopped"),
            "{log}"
        );
        drop(daemon);

        let daemon = launch.start().await;
        let mut client = daemon.client().await;
        let now = active(&mut client).await.unwrap();
        assert_eq!(
            (now.version.as_str(), now.actor.as_str()),
            ("1.0.0", "alice")
        );
        assert_eq!(versions(&mut client).await.len(), 1);
    }
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_call_finish_and_refuses_new_connections() {
    use sqlx::{Connection as _, Executor as _};

    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let launch = Launch::new(home.path(), Some(&url));
    let mut daemon = launch.start().await;
    let mut client = daemon.client().await;
    let snapshot = compile_agent(&home.path().join("agent"), "1.0.0", "Handle refunds.");

    // Hold SQLite's write lock so the publish below is stuck inside the daemon.
    let mut blocker = sqlx::SqliteConnection::connect(&url).await.unwrap();
    blocker.execute("BEGIN IMMEDIATE").await.unwrap();
    let call = tokio::spawn(async move { publish(&mut client, snapshot, "alice").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !call.is_finished(),
        "the publish should be waiting for the write lock"
    );

    let signalled = std::process::Command::new("kill")
        .args(["-INT", &daemon.pid().to_string()])
        .status();
    assert!(signalled.unwrap().success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Draining: still running, no longer accepting connections.
    assert!(!call.is_finished());
    assert_eq!(
        daemon.health("").await,
        None,
        "a new connection was accepted after the signal"
    );

    // Release the lock: the in-flight publish completes and is acknowledged, then the daemon
    // exits cleanly.
    blocker.execute("ROLLBACK").await.unwrap();
    let published = call
        .await
        .unwrap()
        .expect("the in-flight publish should succeed");
    assert_eq!(published.version, "1.0.0");
    let status = daemon.exited().await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", daemon.stderr());
    assert!(daemon.stderr().contains("SIGINT received"));
    drop(daemon);
    blocker.close().await.unwrap();

    let daemon = launch.start().await;
    let mut client = daemon.client().await;
    let stored = versions(&mut client).await;
    assert_eq!(stored.len(), 1, "the acknowledged publish was lost");
    assert_eq!(stored[0].content_hash, published.content_hash);
}

#[tokio::test]
async fn a_port_in_use_is_a_clear_error() {
    let home = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut launch = Launch::new(home.path(), Some(&sqlite_url(home.path())));
    launch.addr = addr.clone();
    let (status, stderr) = launch.run(&[]);
    assert_eq!(status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("phrony-runtime: error: address {addr} is already in use; set RUNTIME_GRPC_ADDR")
    );
    // It failed before touching the database.
    assert!(!home.path().join("ledger.db").exists());
}

#[tokio::test]
async fn bad_configuration_is_refused_with_one_line() {
    let home = tempfile::tempdir().unwrap();
    let cases = [
        (
            Launch::new(home.path(), Some("mysql://db.example/phrony")),
            "phrony-runtime: error: invalid RUNTIME_DATABASE_URL: unsupported database URL scheme \"mysql\"",
        ),
        (
            Launch::new(home.path(), None).env("RUNTIME_SECRETS_ENCRYPTION_KEY", "dG9vIHNob3J0"),
            "phrony-runtime: error: invalid RUNTIME_SECRETS_ENCRYPTION_KEY: must be 32 bytes",
        ),
        (
            Launch::new(home.path(), None).env("RUNTIME_LOG", "info,[[["),
            "phrony-runtime: error: invalid RUNTIME_LOG log filter",
        ),
        (
            Launch::new(home.path(), None).env("RUNTIME_DISPATCH_QUEUE_WAIT", "ten seconds"),
            "phrony-runtime: error: invalid RUNTIME_DISPATCH_QUEUE_WAIT \"ten seconds\": ",
        ),
        (
            Launch::new(home.path(), None).env("RUNTIME_TOOL_ALLOWLIST", "/nonexistent/allow.yaml"),
            "phrony-runtime: error: invalid RUNTIME_TOOL_ALLOWLIST: read tool allowlist /nonexistent/allow.yaml: ",
        ),
        (
            // `0`: an unreachable database at start-up is not waited for (db_faults.rs tests the wait).
            Launch::new(home.path(), Some("postgres://postgres@127.0.0.1:1/none"))
                .env("RUNTIME_DATABASE_START_TIMEOUT", "0"),
            "phrony-runtime: error: database unreachable: ",
        ),
    ];
    for (launch, want) in cases {
        let (status, stderr) = launch.run(&[]);
        assert_eq!(status.code(), Some(1), "{stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(
            errors[0].starts_with(want),
            "{:?} should start with {want:?}",
            errors[0]
        );
        assert!(
            !errors[0].contains("dG9vIHNob3J0"),
            "the key leaked: {}",
            errors[0]
        );
    }
    // Nothing was created for the refused starts with the default database.
    assert!(
        !home
            .path()
            .join("xdg")
            .join("phrony")
            .join("phrony.db")
            .exists()
    );
}

#[tokio::test]
async fn zero_setup_creates_the_database_and_a_private_key_once() {
    let home = tempfile::tempdir().unwrap();
    let launch = Launch::new(home.path(), None);
    let mut daemon = launch.start().await;
    let data = home.path().join("xdg").join("phrony");
    let key_path = data.join("secrets.key");
    assert!(data.join("phrony.db").exists());
    let log = daemon.logged("database: SQLite file").await;
    assert!(
        log.contains(&format!(
            "database: SQLite file {}",
            data.join("phrony.db").display()
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "generated a new secrets key in {}",
            key_path.display()
        )),
        "{log}"
    );
    let key = std::fs::read_to_string(&key_path).unwrap();
    assert_eq!(key.trim().len(), 64);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    assert_eq!(daemon.terminate().await.code(), Some(0));

    let mut daemon = launch.start().await;
    let log = daemon.logged("secrets key: ").await;
    assert!(
        log.contains(&format!("secrets key: {}", key_path.display())),
        "{log}"
    );
    assert!(!log.contains("generated a new secrets key"), "{log}");
    assert_eq!(std::fs::read_to_string(&key_path).unwrap(), key);
    assert_eq!(daemon.terminate().await.code(), Some(0));

    // An explicit key wins and no file is consulted.
    let explicit = "11".repeat(32);
    std::fs::remove_file(&key_path).unwrap();
    let mut daemon = launch
        .clone()
        .env("RUNTIME_SECRETS_ENCRYPTION_KEY", &explicit)
        .start()
        .await;
    assert!(
        daemon
            .stderr()
            .contains("secrets key: from RUNTIME_SECRETS_ENCRYPTION_KEY")
    );
    assert!(!key_path.exists());
    assert_eq!(daemon.terminate().await.code(), Some(0));
}

/// The database holds arguments, approvals and comments: under the usual umask 022 its
/// directory is created 0700 and the database and its `-wal`/`-shm` files 0600, and files an
/// earlier release left world-readable are tightened at the next start, with a warning.
#[tokio::test]
async fn the_database_files_are_owner_only_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let home = tempfile::tempdir().unwrap();
    let mut launch = Launch::new(home.path(), None);
    launch.umask = Some(0o022);
    let data = home.path().join("xdg").join("phrony");
    let db = data.join("phrony.db");
    let companion = |suffix: &str| data.join(format!("phrony.db{suffix}"));

    let mut daemon = launch.start().await;
    // A write, so that the WAL is in use.
    let mut client = daemon.client().await;
    publish(
        &mut client,
        compile_agent(home.path(), "0.1.0", "Refunds"),
        "alice",
    )
    .await
    .unwrap();
    assert_eq!(mode(&data), 0o700, "data directory");
    assert_eq!(mode(&db), 0o600, "database");
    for suffix in ["-wal", "-shm"] {
        assert!(companion(suffix).exists(), "no {suffix} file");
        assert_eq!(mode(&companion(suffix)), 0o600, "{suffix}");
    }
    assert_eq!(mode(&data.join("secrets.key")), 0o600);
    assert_eq!(daemon.terminate().await.code(), Some(0));

    // As an earlier release left them: world-readable.
    for path in [db.clone(), companion("-wal"), companion("-shm")] {
        if path.exists() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let mut daemon = launch.start().await;
    assert_eq!(mode(&db), 0o600);
    let log = daemon
        .logged("database file was readable by other users; its mode is now 600")
        .await;
    assert!(
        log.contains("database file was readable by other users; its mode is now 600"),
        "{log}"
    );
    assert_eq!(daemon.terminate().await.code(), Some(0));
}

#[tokio::test]
async fn migrate_applies_migrations_and_exits() {
    let home = tempfile::tempdir().unwrap();
    let launch = Launch::new(home.path(), Some(&sqlite_url(home.path())));
    let (status, stderr) = launch.run(&["migrate"]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("database migrated to schema version"),
        "{stderr}"
    );
    assert!(home.path().join("ledger.db").exists());
    // `migrate` does not generate a key.
    assert!(!home.path().join("secrets.key").exists());
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let home = tempfile::tempdir().unwrap();
    let launch =
        Launch::new(home.path(), Some(&sqlite_url(home.path()))).env("RUNTIME_LOG_FORMAT", "json");
    let mut daemon = launch.start().await;
    assert_eq!(daemon.terminate().await.code(), Some(0));
    let log = daemon.stderr();
    assert!(log.lines().count() >= 4, "{log}");
    for line in log.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            value.get("level").is_some() && value.get("message").is_some(),
            "{line}"
        );
    }
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let home = tempfile::tempdir().unwrap();
    let daemon = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .start()
        .await;
    let mut reflection = ServerReflectionClient::new(daemon.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["phrony.runtime.v1.Runtime", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

#[tokio::test]
async fn health_turns_not_serving_when_the_database_goes_away() {
    let Some(db) = PgDatabase::create().await else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let mut daemon = Launch::new(home.path(), Some(db.url())).start().await;
    // Unknown services are not reported as healthy.
    assert_eq!(daemon.health("no.such.Service").await, None);

    db.drop_now().await;
    daemon.wait_for_health(ServingStatus::NotServing).await;
    let log = daemon.logged("health is NOT_SERVING").await;
    assert!(log.contains("health is NOT_SERVING"), "{log}");

    // Calls that need the database fail as unavailable/internal instead of hanging.
    let mut client = daemon.client().await;
    let status = client
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .expect_err("the database is gone");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Internal),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_worker_gets_the_configured_lease_and_sigterm_ends_its_stream_cleanly() {
    let home = tempfile::tempdir().unwrap();
    let mut daemon = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .env("RUNTIME_WORKER_LEASE_TTL", "5s")
        .start()
        .await;
    let (up, rx) = tokio::sync::mpsc::channel(4);
    let register = pb::WorkRegister {
        worker_id: "daemon-worker".into(),
        handlers: vec![pb::WorkHandlerAdvertisement {
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            max_concurrency: 1,
            ..Default::default()
        }],
        ..Default::default()
    };
    let msg = |body| pb::WorkClientMsg { body: Some(body) };
    up.send(msg(pb::work_client_msg::Body::Register(register)))
        .await
        .unwrap();
    let mut down = daemon
        .client()
        .await
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let next = |m: Option<pb::WorkServerMsg>| m.and_then(|m| m.body);
    assert_eq!(
        next(down.message().await.unwrap()),
        Some(pb::work_server_msg::Body::Registered(pb::WorkRegistered {
            worker_id: "daemon-worker".into(),
            lease_ttl_ms: 5_000,
        }))
    );
    up.send(msg(pb::work_client_msg::Body::Heartbeat(
        pb::WorkHeartbeat {},
    )))
    .await
    .unwrap();
    assert_eq!(
        next(down.message().await.unwrap()),
        Some(pb::work_server_msg::Body::HeartbeatAck(
            pb::WorkHeartbeatAck {}
        ))
    );

    let status = daemon.terminate().await;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", daemon.stderr());
    assert!(
        daemon
            .stderr()
            .contains("work stream closed: the runtime is stopping"),
        "{}",
        daemon.stderr()
    );
    // The worker saw a clean end of stream (status OK), not an error.
    let end = down.message().await;
    assert!(matches!(end, Ok(None)), "{end:?}");
}

/// Every allocation of the daemon goes through jemalloc, SQLite's page caches and statements
/// (C `malloc`) included, not only Rust's: glibc kept what SQLite's connection threads had
/// used in their own arenas (10,000 parked sessions: 73 MB taken from the system for 31 MB in
/// use), where jemalloc's background threads return it. jemalloc takes over the C allocator
/// only when built unprefixed, and only then reads the standard `MALLOC_CONF` (a prefixed
/// build reads `_RJEM_MALLOC_CONF` and ignores it): `stats_print` makes it print its
/// statistics at exit.
#[test]
fn the_c_allocator_is_jemalloc() {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .env("MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Begin jemalloc statistics"),
        "MALLOC_CONF was not read by jemalloc; stderr: {stderr}"
    );
}
