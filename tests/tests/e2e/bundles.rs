//! Bundles end to end: the real `phrony-runtime` (scripted `stub` model) driven by the real
//! `phrony` CLI through a bundle's lifecycle: `bundles publish → versions → deploy → active →
//! history → inspect → secret-requirements → run → rollback`, and the refusals users see
//! (publish without a lock or with a drifted one, deploy of an unknown version).
//!
//! The bundle is `tests/fixtures/bundles/refund-desk`: a front desk (root) that delegates to a
//! refund specialist in `specialists/`, both declaring the secret `crm`, with its committed
//! `bundle.lock.json` (written by `phrony bundles lock`). `external_member_*` use
//! `tests/fixtures/bundles/external-desk`, whose root delegates to a published agent
//! (`support.translator@1.0.0`): lock through the runtime, publish, deploy, run.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::cli::{fails, json, ok, table};
use tests::daemon::{Backend, Daemon};
use tests::stub::stub_daemon;

use crate::tables::redacted;

const BUNDLE: &str = "support/refund-desk";
const ACTOR: &str = "ci-alice";
/// The variable both members read their `crm` secret from.
const SECRET_VAR: &str = "PHRONY_TEST_DESK_CRM_TOKEN";
/// How long a session may take to end (a failure guard, not a pace).
const WAIT: Duration = Duration::from_secs(60);

/// The CLI pointed at the daemon, acting as [`ACTOR`], without the bundle's secret variable.
fn phrony(daemon: &Daemon) -> Command {
    let mut cmd = tests::cli::phrony(daemon, ACTOR);
    cmd.env_remove(SECRET_VAR);
    cmd
}

/// Copies the directory tree `from` into `to`.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// The fixture bundle, copied into `dir` (so the test can edit and re-lock it); returns the
/// path of its bundle.yaml.
fn copy_fixture(dir: &Path) -> PathBuf {
    let fixture = tests::workspace_root().join("tests/fixtures/bundles/refund-desk");
    copy_dir(&fixture, dir);
    dir.join("bundle.yaml")
}

/// Replaces `from` by `to` in the file at `path` (which must contain it).
fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "no {from:?} in {}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// The lock hash `phrony bundles lock` printed (`locked: ns/name sha256:…`).
fn lock(daemon: &Daemon, bundle_yaml: &Path) -> String {
    let out = ok(phrony(daemon)
        .env(SECRET_VAR, "set")
        .args(["bundles", "lock"])
        .arg(bundle_yaml));
    let hash = out
        .lines()
        .next()
        .and_then(|l| l.strip_prefix(&format!("locked: {BUNDLE} ")))
        .unwrap_or_else(|| panic!("{out}"));
    hash.to_owned()
}

/// The lock hash committed beside the bundle.
fn committed_hash(bundle_yaml: &Path) -> String {
    let lock: Value = serde_json::from_slice(
        &std::fs::read(bundle_yaml.with_file_name("bundle.lock.json")).unwrap(),
    )
    .unwrap();
    lock["version"].as_str().unwrap().to_owned()
}

/// A whole-second UTC RFC 3339 timestamp.
fn assert_timestamp(text: &str) {
    assert!(
        text.ends_with('Z') && chrono::DateTime::parse_from_rfc3339(text).is_ok(),
        "not an RFC 3339 UTC timestamp: {text:?}"
    );
}

/// The value of `key:` in a `key: value` block.
fn field(stdout: &str, key: &str) -> String {
    table(stdout)
        .into_iter()
        .find(|row| row.first().is_some_and(|k| k == &format!("{key}:")))
        .and_then(|row| row.get(1).cloned())
        .unwrap_or_else(|| panic!("no {key}: in\n{stdout}"))
}

/// The session's status, from `sessions inspect --output json`.
fn session_status(daemon: &Daemon, id: &str) -> String {
    let inspected = json(&ok(
        phrony(daemon).args(["sessions", "inspect", id, "--output", "json"])
    ));
    inspected["session"]["status"].as_str().unwrap().to_owned()
}

fn wait_until_completed(daemon: &Daemon, id: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = session_status(daemon, id);
        if status == "completed" {
            return;
        }
        assert!(
            !["failed", "cancelled"].contains(&status.as_str()),
            "session {id} ended {status}\n{}",
            daemon.logs()
        );
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {id} to complete\n{}",
            daemon.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn bundle_lifecycle(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let bundle_yaml = copy_fixture(project.path());
    let bundle_arg = bundle_yaml.to_str().unwrap();
    let v1_hash = committed_hash(&bundle_yaml);

    // Refusals before anything is published: no lock, then a drifted lock. Nothing is sent.
    let lock_file = bundle_yaml.with_file_name("bundle.lock.json");
    let committed = std::fs::read(&lock_file).unwrap();
    std::fs::remove_file(&lock_file).unwrap();
    let refused = fails(phrony(&daemon).args(["bundles", "publish", bundle_arg]));
    assert!(
        refused.ends_with("Error: no committed lock; run phrony bundles lock\n"),
        "{refused}"
    );
    std::fs::write(&lock_file, &committed).unwrap();
    let specialist = project.path().join("specialists/refunds.yaml");
    edit(&specialist, "Decide whether", "Decide quickly whether");
    let refused = fails(phrony(&daemon).args(["bundles", "publish", bundle_arg]));
    assert!(refused.contains("bundle.lock.json drift: "), "{refused}");
    assert!(refused.contains("run phrony bundles lock"), "{refused}");
    edit(&specialist, "Decide quickly whether", "Decide whether");
    let listed = ok(phrony(&daemon).args(["bundles", "ls"]));
    assert_eq!(
        listed, "ID  NAMESPACE  NAME  OWNER\n",
        "nothing was published"
    );

    // publish 1.0.0 (the committed lock as is), then 1.1.0 after an edit and a re-lock.
    assert_eq!(
        ok(phrony(&daemon).args(["bundles", "publish", bundle_arg])),
        format!("{BUNDLE} 1.0.0 ({v1_hash})\n")
    );
    // Publishing the same closure again is idempotent (the reference refuses it): same answer.
    assert_eq!(
        ok(phrony(&daemon).args(["bundles", "publish", bundle_arg])),
        format!("{BUNDLE} 1.0.0 ({v1_hash})\n")
    );
    edit(&bundle_yaml, "version: 1.0.0", "version: 1.1.0");
    edit(
        &specialist,
        "answer in one sentence.",
        "answer in one short sentence.",
    );
    let v2_hash = lock(&daemon, &bundle_yaml);
    assert_ne!(v2_hash, v1_hash);
    let published =
        json(&ok(phrony(&daemon).args([
            "bundles", "publish", bundle_arg, "--output", "json",
        ])));
    assert_eq!(published["version"], "1.1.0");
    assert_eq!(published["lock_hash"], v2_hash.as_str());
    assert_eq!(published["namespace"], "support");

    // versions: newest first, nothing active yet.
    let versions = json(&ok(
        phrony(&daemon).args(["bundles", "versions", BUNDLE, "--output", "json"])
    ));
    assert_eq!(versions[0]["version"], "1.1.0");
    assert_eq!(versions[1]["version"], "1.0.0");
    assert_eq!(versions[1]["lock_hash"], v1_hash.as_str());
    assert_eq!(versions[0]["published_by"], ACTOR);
    assert_eq!(versions[0]["status"], "published");
    assert_eq!(versions[1]["status"], "published");

    // deploy 1.0.0 by semver, then 1.1.0 by lock hash through `agents deploy`.
    let deployed = ok(phrony(&daemon).args(["bundles", "deploy", &format!("{BUNDLE}@1.0.0")]));
    let at = deployed
        .strip_prefix(&format!("deployed {BUNDLE}@1.0.0 ({v1_hash}) at "))
        .unwrap_or_else(|| panic!("{deployed}"));
    assert_timestamp(at.trim_end());
    let deployed = ok(phrony(&daemon).env("PHRONY_ACTOR", "ci-bob").args([
        "agents",
        "deploy",
        &format!("{BUNDLE}@{v2_hash}"),
    ]));
    assert!(
        deployed.starts_with(&format!(
            "deployed {BUNDLE}@1.1.0 ({v2_hash}) (previous: 1.0.0) at "
        )),
        "{deployed}"
    );

    // versions table: the active one is marked.
    let versions = ok(phrony(&daemon).args(["bundles", "versions", BUNDLE]));
    insta::assert_snapshot!("bundles_versions", redacted(&versions));
    let rows = table(&versions);
    assert_eq!(
        rows[0],
        [
            "VERSION",
            "ID",
            "LOCK_HASH",
            "PUBLISHED_AT",
            "PUBLISHED_BY",
            "STATUS"
        ]
    );
    assert_eq!(
        (rows[1][0].as_str(), rows[1][5].as_str()),
        ("1.1.0", "active")
    );

    // active.
    let active = ok(phrony(&daemon).args(["bundles", "active", BUNDLE]));
    let rest = active
        .strip_prefix(&format!("{BUNDLE}@1.1.0 ({v2_hash}) deployed "))
        .unwrap_or_else(|| panic!("{active}"));
    let (at, by) = rest.trim_end().split_once(" by ").unwrap();
    assert_timestamp(at);
    assert_eq!(by, "ci-bob");

    // history: newest first, each row with its lock hash.
    let history = ok(phrony(&daemon).args(["bundles", "history", BUNDLE]));
    insta::assert_snapshot!("bundles_history", redacted(&history));
    let rows = table(&history);
    assert_eq!(rows[1][1], v2_hash);
    assert_eq!(rows[2][1], v1_hash);

    // inspect: the active version by default, one by its semver, one by its lock hash.
    let inspected = ok(phrony(&daemon).args(["bundles", "inspect", BUNDLE]));
    assert_eq!(field(&inspected, "bundle"), format!("{BUNDLE}@1.1.0"));
    assert_eq!(field(&inspected, "status"), "active");
    assert_eq!(field(&inspected, "lock_hash"), v2_hash);
    assert_eq!(field(&inspected, "published_by"), ACTOR);
    assert_eq!(field(&inspected, "root"), "front-desk");
    let members_table = inspected.split("\n\n").nth(1).unwrap();
    insta::assert_snapshot!("bundles_inspect_members", redacted(members_table));
    let old = json(&ok(phrony(&daemon).args([
        "bundles",
        "inspect",
        &format!("{BUNDLE}@1.0.0"),
        "--output",
        "json",
    ])));
    assert_eq!(old["status"], "published");
    assert_eq!(old["lock_hash"], v1_hash.as_str());
    assert_eq!(
        old["lock"],
        serde_json::from_slice::<Value>(&committed).unwrap()
    );
    assert_eq!(old["manifest"]["spec"]["root"], "./front-desk.yaml");
    let by_hash = json(&ok(phrony(&daemon).args([
        "bundles",
        "inspect",
        &format!("{BUNDLE}@{v1_hash}"),
        "--output",
        "json",
    ])));
    assert_eq!(by_hash["version"], "1.0.0");

    // secret-requirements: the union, declared by both members.
    let secrets = ok(phrony(&daemon).args(["bundles", "secret-requirements", BUNDLE]));
    insta::assert_snapshot!("bundles_secret_requirements", redacted(&secrets));
    assert_eq!(
        table(&secrets)[1],
        ["crm", SECRET_VAR, "front-desk,refund-specialist"]
    );

    // run: the secret is required (the agent run's message), then resolved from an env file;
    // the root delegates to the specialist and the session completes.
    let missing = fails(phrony(&daemon).args(["bundles", "run", BUNDLE]));
    assert_eq!(
        missing,
        format!(
            "Error: secret \"crm\": environment variable {SECRET_VAR} is not set; set {SECRET_VAR} \
             (or pass an --env-file defining it) and retry run\n"
        )
    );
    let env_file = project.path().join("desk.env");
    std::fs::write(&env_file, format!("{SECRET_VAR}=desk-crm-secret\n")).unwrap();
    let started = ok(phrony(&daemon).args([
        "bundles",
        "run",
        BUNDLE,
        "--input",
        "Can ORD-7 be refunded?",
        "--metadata",
        "ticket=T-7",
        "--env-file",
        env_file.to_str().unwrap(),
    ]));
    let id = started
        .strip_prefix("session ")
        .and_then(|s| s.strip_suffix(" started (status: running)\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"));
    assert!(id.starts_with("run_"), "{id}");
    wait_until_completed(&daemon, id);
    let inspected = json(&ok(
        phrony(&daemon).args(["sessions", "inspect", id, "--output", "json"])
    ));
    let shown = inspected.to_string();
    assert!(!shown.contains("desk-crm-secret"), "{shown}");
    assert!(
        shown.contains("The refund specialist says ORD-7 can be refunded."),
        "{shown}"
    );
    // An explicit version must be the active one.
    let inactive = fails(phrony(&daemon).env(SECRET_VAR, "set").args([
        "bundles",
        "run",
        &format!("{BUNDLE}@1.0.0"),
    ]));
    assert!(inactive.starts_with("Error: run: "), "{inactive}");

    // `phrony run --bundle` starts the same kind of session as `bundles run`.
    let via_run = ok(phrony(&daemon).env(SECRET_VAR, "set").args([
        "run",
        "--bundle",
        BUNDLE,
        "--input",
        "Can ORD-7 be refunded?",
    ]));
    let second = via_run
        .strip_prefix("session ")
        .and_then(|s| s.strip_suffix(" started (status: running)\n"))
        .unwrap_or_else(|| panic!("unexpected run --bundle output: {via_run:?}"));
    wait_until_completed(&daemon, second);

    // rollback to the previous deployment, then forward again with --to (a lock hash).
    assert_eq!(
        ok(phrony(&daemon).args(["bundles", "rollback", BUNDLE])),
        format!("rolled back {BUNDLE} to 1.0.0 (was: 1.1.0)\n")
    );
    assert_eq!(
        ok(phrony(&daemon).args(["bundles", "rollback", BUNDLE, "--to", &v2_hash])),
        format!("rolled back {BUNDLE} to 1.1.0 (was: 1.0.0)\n")
    );
    let history = json(&ok(
        phrony(&daemon).args(["bundles", "history", BUNDLE, "--output", "json"])
    ));
    let actions: Vec<(&str, &str)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["version"].as_str().unwrap(),
                d["action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("1.1.0", "rollback"),
            ("1.0.0", "rollback"),
            ("1.1.0", "deploy"),
            ("1.0.0", "deploy")
        ]
    );

    // deploy of an unknown version.
    let unknown = fails(phrony(&daemon).args(["bundles", "deploy", &format!("{BUNDLE}@9.9.9")]));
    assert!(unknown.starts_with("Error: deploy: "), "{unknown}");
    assert!(unknown.contains("9.9.9"), "{unknown}");
    assert!(unknown.trim_end().ends_with("(NotFound)"), "{unknown}");

    // ls: the bundle, and nothing in another namespace.
    let listed = json(&ok(
        phrony(&daemon).args(["bundles", "ls", "--output", "json"])
    ));
    assert_eq!(listed[0]["namespace"], "support");
    assert_eq!(listed[0]["name"], "refund-desk");
    assert_eq!(
        ok(phrony(&daemon).args(["bundles", "ls", "-n", "elsewhere"])),
        "ID  NAMESPACE  NAME  OWNER\n"
    );
}

#[test]
fn bundle_lifecycle_on_sqlite() {
    bundle_lifecycle(Backend::Sqlite);
}

#[test]
fn bundle_lifecycle_on_postgres() {
    bundle_lifecycle(Backend::Postgres);
}

#[test]
fn the_committed_fixture_lock_matches_its_closure() {
    // The fixture's bundle.lock.json is what `phrony bundles lock` writes: validate accepts it.
    let project = tempfile::tempdir().unwrap();
    let bundle_yaml = copy_fixture(project.path());
    let out = ok(tests::daemon::phrony()
        .env(SECRET_VAR, "set")
        .args(["bundles", "validate", "--require-lock"])
        .arg(&bundle_yaml));
    assert_eq!(
        out,
        format!(
            "valid: {BUNDLE} {}\nmembers: 2 (root: front-desk)\n",
            committed_hash(&bundle_yaml)
        )
    );
}

#[test]
fn bundle_references_are_checked_before_any_connection() {
    let addr = format!("127.0.0.1:{}", tests::daemon::free_port());
    for (args, message) in [
        (
            vec!["bundles", "deploy", BUNDLE],
            format!("agent reference must include @version, got \"{BUNDLE}\""),
        ),
        (
            vec!["bundles", "active", "refund-desk"],
            r#"agent must be namespace/name, got "refund-desk""#.to_owned(),
        ),
        (
            vec!["bundles", "inspect", "support/refund-desk@"],
            r#"agent version must not be empty after @ in "support/refund-desk@""#.to_owned(),
        ),
        (
            vec!["bundles", "rollback", "support/refund-desk@1.0.0"],
            r#"agent reference must not include @version here, got "support/refund-desk@1.0.0"; use --to VERSION to pick the version"#.to_owned(),
        ),
    ] {
        let stderr = fails(
            tests::daemon::phrony()
                .env("PHRONY_RUNTIME_ADDR", &addr)
                .args(&args),
        );
        assert_eq!(stderr, format!("Error: {message}\n"), "{args:?}");
    }
}

/// `tests/fixtures/bundles/external-desk`: a concierge delegating to the published agent
/// `support.translator@1.0.0`. `bundles lock` refuses clearly while the runtime does not have
/// that version, then locks with its content hash; publish, deploy and run follow, and the
/// delegation runs a child of exactly the published version.
fn external_member(backend: Backend) {
    let Some(daemon) = stub_daemon(backend) else {
        return;
    };
    let project = tempfile::tempdir().unwrap();
    let fixture = tests::workspace_root().join("tests/fixtures/bundles/external-desk");
    for rel in [
        "bundle.yaml",
        "concierge.yaml",
        "stub-script.json",
        "translator/agent.yaml",
        "translator/stub-script.json",
    ] {
        let target = project.path().join(rel);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(fixture.join(rel), &target).unwrap();
    }
    let bundle_yaml = project.path().join("bundle.yaml");
    let lock_file = project.path().join("bundle.lock.json");

    // Not published yet: the lock names the member and the runtime's answer, writes nothing.
    let refused = fails(phrony(&daemon).args(["bundles", "lock"]).arg(&bundle_yaml));
    assert!(
        refused.contains(
            "bundle has external member \"translator\" (support.translator@1.0.0): agent \
             support/translator not found (runtime at "
        ),
        "{refused}"
    );
    assert!(!lock_file.exists());

    ok(phrony(&daemon)
        .args(["agents", "publish"])
        .arg(project.path().join("translator/agent.yaml")));
    ok(phrony(&daemon).args(["agents", "deploy", "support/translator@1.0.0"]));
    let published = json(&ok(phrony(&daemon).args([
        "agents",
        "versions",
        "support/translator",
        "--output",
        "json",
    ])));
    let published = &published[0];

    let out = ok(phrony(&daemon).args(["bundles", "lock"]).arg(&bundle_yaml));
    assert!(
        out.starts_with("locked: support/external-desk sha256:")
            && out.ends_with("members: 2 (root: concierge)\n"),
        "{out}"
    );
    let lock: Value = serde_json::from_slice(&std::fs::read(&lock_file).unwrap()).unwrap();
    assert_eq!(lock["members"][1]["origin"], "external");
    assert_eq!(
        lock["members"][1]["content_hash"],
        published["content_hash"]
    );
    ok(phrony(&daemon)
        .args(["bundles", "validate", "--require-lock"])
        .arg(&bundle_yaml));

    ok(phrony(&daemon)
        .args(["bundles", "publish"])
        .arg(&bundle_yaml));
    ok(phrony(&daemon).args(["bundles", "deploy", "support/external-desk@1.0.0"]));
    let inspected = json(&ok(phrony(&daemon).args([
        "bundles",
        "inspect",
        "support/external-desk",
        "--output",
        "json",
    ])));
    let external = inspected["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["child_name"] == "translator")
        .unwrap_or_else(|| panic!("{inspected}"))
        .clone();
    assert_eq!(external["origin"], "external");
    assert_eq!(external["member_version_id"], published["id"]);

    let started = ok(phrony(&daemon).args([
        "bundles",
        "run",
        "support/external-desk",
        "--input",
        "good morning",
    ]));
    let root = started
        .strip_prefix("session ")
        .and_then(|s| s.strip_suffix(" started (status: running)\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();
    wait_until_completed(&daemon, &root);
    let done = json(&ok(
        phrony(&daemon).args(["sessions", "inspect", &root, "--output", "json"])
    ));
    let children = done["session"]["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{done}");
    assert_eq!(children[0]["agent_version_id"], published["id"], "{done}");
    assert_eq!(children[0]["status"], "completed", "{done}");
    assert_eq!(done["session"]["output"]["message"], "In French: bonjour.");
}

#[test]
fn external_member_on_sqlite() {
    external_member(Backend::Sqlite);
}

#[test]
fn external_member_on_postgres() {
    external_member(Backend::Postgres);
}
