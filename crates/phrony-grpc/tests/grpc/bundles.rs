//! Bundles over real TCP (§6.5): publish (server-side lock recomputation, pinning, idempotent
//! re-publish, immutability), deploy by semver and by lock hash, rollback, the read-only views,
//! and a session of the bundle's root member with the union of the members' secrets — on SQLite
//! and on PostgreSQL. The bundle is the manifest crate's `desk` fixture: a front desk that
//! delegates refunds to a specialist in `specialists/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use phrony_ledger::Ledger;
use phrony_manifest::{CompiledAgent, validate_bundle};
use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_runtime::SecretsKey;
use tonic::Code;
use tonic::transport::Channel;

use crate::sessions::{Db, Server, assert_code, wait_status};

const NAMESPACE: &str = "support";
const NAME: &str = "refund-desk";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../phrony-manifest/tests/fixtures/bundles/desk")
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A writable copy of the fixture.
fn desk() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture(), dir.path());
    let path = dir.path().join("bundle.yaml");
    (dir, path)
}

/// What `phrony bundles publish` sends for the bundle at `path` (its committed lock must match).
pub(crate) fn publish_request(path: &Path) -> pb::PublishBundleRequest {
    let validated = validate_bundle(path, true).unwrap();
    let bundle = validated.bundle;
    let lock = std::fs::read(path.with_file_name(phrony_manifest::LOCK_FILE)).unwrap();
    pb::PublishBundleRequest {
        bundle_manifest: bundle.header().to_json(),
        members: bundle
            .published_members()
            .unwrap()
            .into_iter()
            .map(|m| pb::BundleMemberPackage {
                child_name: m.child_name,
                origin: m.origin.as_str().to_owned(),
                authoring_ref: m.authoring_ref,
                resolved_manifest: m.snapshot_json,
                is_root: m.is_root,
                member_version_id: String::new(),
            })
            .collect(),
        actor: "release-bot".into(),
        committed_lock: lock,
    }
}

/// Rewrites a member file, and the bundle's version, and re-locks.
fn edit(path: &Path, member: &str, from: &str, to: &str, version: &str) {
    let file = path.with_file_name(member);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(from), "{member} has no {from:?}");
    std::fs::write(&file, text.replace(from, to)).unwrap();
    let bundle = std::fs::read_to_string(path).unwrap();
    std::fs::write(
        path,
        bundle.replace("version: 1.0.0", &format!("version: {version}")),
    )
    .unwrap();
    phrony_manifest::lock_bundle(path).unwrap();
}

fn bundle_ref(version: &str) -> Option<pb::BundleRef> {
    Some(pb::BundleRef {
        namespace: NAMESPACE.into(),
        name: NAME.into(),
        version: version.into(),
    })
}

fn run_request(version: &str, secrets: &[(&str, &str)]) -> pb::RunSessionRequest {
    pb::RunSessionRequest {
        bundle_ref: bundle_ref(version),
        input: br#"{"message": "answer: hello from the desk"}"#.to_vec(),
        resolved_secrets: secrets
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect(),
        ..Default::default()
    }
}

async fn deployments(client: &mut RuntimeClient<Channel>) -> Vec<(String, String, String)> {
    client
        .list_bundle_deployments(pb::ListBundleDeploymentsRequest {
            bundle_ref: bundle_ref(""),
        })
        .await
        .unwrap()
        .into_inner()
        .deployments
        .into_iter()
        .map(|d| (d.version, d.action, d.lock_hash))
        .collect()
}

async fn scenario(db: Db) {
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let mut client = server.client().await;
    let (_dir, path) = desk();

    // Nothing yet.
    assert_code(
        client
            .get_active_bundle(pb::GetActiveBundleRequest {
                bundle_ref: bundle_ref(""),
            })
            .await,
        Code::NotFound,
        "bundle support/refund-desk not found",
    );

    // Publish: the server recomputes the lock and pins the delegation.
    let request = publish_request(&path);
    let published = client
        .publish_bundle(request.clone())
        .await
        .unwrap()
        .into_inner();
    let committed = phrony_manifest::BundleLock::parse(&request.committed_lock).unwrap();
    assert_eq!(published.lock_hash, committed.version);
    assert_eq!(
        (
            published.namespace.as_str(),
            published.name.as_str(),
            published.version.as_str()
        ),
        (NAMESPACE, NAME, "1.0.0")
    );
    assert_eq!(
        phrony_manifest::BundleLock::parse(&published.lock).unwrap(),
        committed
    );
    // An identical re-publish changes nothing and answers the same version.
    let again = client
        .publish_bundle(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.bundle_version_id, published.bundle_version_id);

    let v1 = client
        .get_bundle_version(pb::GetBundleVersionRequest {
            bundle_ref: bundle_ref("1.0.0"),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!v1.active);
    assert_eq!(v1.published_by, "release-bot");
    assert_eq!(v1.lock_hash, published.lock_hash);
    let by_hash = client
        .get_bundle_version(pb::GetBundleVersionRequest {
            bundle_ref: bundle_ref(&published.lock_hash),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_hash.bundle_version_id, v1.bundle_version_id);
    let members: Vec<(&str, bool, &str)> = v1
        .members
        .iter()
        .map(|m| (m.child_name.as_str(), m.is_root, m.r#ref.as_str()))
        .collect();
    assert_eq!(
        members,
        [
            ("front-desk", true, "./front-desk.yaml"),
            ("refund-specialist", false, "./specialists/refunds.yaml")
        ]
    );
    // The stored root delegates to the stored specialist, by version id.
    let ledger = Ledger::connect(&db.url).await.unwrap();
    let root = ledger
        .get_agent_version_by_id(v1.members[0].member_version_id.parse().unwrap())
        .await
        .unwrap();
    let root = CompiledAgent::from_snapshot_json(root.snapshot_json.as_bytes()).unwrap();
    let target = root
        .spec
        .tools
        .iter()
        .find_map(|t| t.agent.as_ref().filter(|a| !a.late_bound))
        .unwrap();
    assert_eq!(target.agent_version_id, v1.members[1].member_version_id);
    assert_eq!(
        (
            target.namespace.as_str(),
            target.name.as_str(),
            target.child_name.as_str()
        ),
        (NAMESPACE, "refund-specialist", "refund-specialist")
    );

    // Not deployed: it cannot run.
    assert_code(
        client
            .run_session(run_request("", &[("openai", "sk-x")]))
            .await,
        Code::FailedPrecondition,
        "no active deployment for bundle support/refund-desk",
    );
    let deployed = client
        .deploy_bundle(pb::DeployBundleRequest {
            bundle_ref: bundle_ref("1.0.0"),
            actor: "ops".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deployed.version, "1.0.0");
    assert_eq!(deployed.previous_version, "");
    assert_eq!(deployed.lock_hash, published.lock_hash);

    // The secrets a run needs: the union over both members.
    let secrets = client
        .get_bundle_secret_requirements(pb::GetBundleSecretRequirementsRequest {
            bundle_ref: bundle_ref(""),
        })
        .await
        .unwrap()
        .into_inner()
        .secrets;
    let openai = &secrets["openai"];
    assert_eq!(openai.from_env, "OPENAI_API_KEY");
    assert_eq!(openai.declared_by, ["front-desk", "refund-specialist"]);

    // A run of the root member.
    assert_code(
        client.run_session(run_request("", &[])).await,
        Code::InvalidArgument,
        "missing resolved secrets: \"openai\"",
    );
    let started = client
        .run_session(run_request("1.0.0", &[("openai", "sk-x")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.agent_version_id, v1.members[0].member_version_id);
    let done = wait_status(&mut client, &started.session_id, "completed").await;
    assert_eq!(done.agent.as_ref().unwrap().name, "front-desk");
    assert_eq!(done.bundle_version_id, v1.bundle_version_id);
    let listed = |kind: &str| pb::ListSessionsRequest {
        kind: kind.into(),
        ..Default::default()
    };
    let bundles = client
        .list_sessions(listed("bundle"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bundles.sessions.len(), 1);
    let summary = &bundles.sessions[0];
    assert_eq!(summary.kind, "bundle");
    assert_eq!(summary.bundle_version_id, v1.bundle_version_id);
    assert_eq!(summary.bundle_ref, bundle_ref("1.0.0"));
    let agents = client
        .list_sessions(listed("agent"))
        .await
        .unwrap()
        .into_inner();
    assert!(agents.sessions.is_empty());

    // A second version: same semver with another closure is refused; a new semver is not.
    edit(
        &path,
        "specialists/refunds.yaml",
        "summarize the result",
        "summarize it",
        "1.0.0",
    );
    assert_code(
        client.publish_bundle(publish_request(&path)).await,
        Code::AlreadyExists,
        "bundle support/refund-desk version \"1.0.0\" is already published",
    );
    edit(
        &path,
        "specialists/refunds.yaml",
        "summarize it",
        "summarize it briefly",
        "1.1.0",
    );
    let v2 = client
        .publish_bundle(publish_request(&path))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(v2.lock_hash, published.lock_hash);
    let versions: Vec<String> = client
        .list_bundle_versions(pb::ListBundleVersionsRequest {
            bundle_ref: bundle_ref(""),
        })
        .await
        .unwrap()
        .into_inner()
        .versions
        .into_iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(versions, ["1.1.0", "1.0.0"]);

    // Deploy by lock hash; the earlier version no longer runs.
    let second = client
        .deploy_bundle(pb::DeployBundleRequest {
            bundle_ref: bundle_ref(&v2.lock_hash),
            actor: "ops".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (second.version.as_str(), second.previous_version.as_str()),
        ("1.1.0", "1.0.0")
    );
    assert_eq!(second.previous_lock_hash, published.lock_hash);
    assert_code(
        client
            .run_session(run_request("1.0.0", &[("openai", "sk-x")]))
            .await,
        Code::FailedPrecondition,
        "version \"1.0.0\" is not the active bundle deployment (active: \"1.1.0\")",
    );

    // Rollback to the previous deployment.
    let back = client
        .rollback_bundle(pb::RollbackBundleRequest {
            bundle_ref: bundle_ref(""),
            to_version: String::new(),
            actor: "ops".into(),
            allow_new_secret_endpoints: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (back.version.as_str(), back.previous_version.as_str()),
        ("1.0.0", "1.1.0")
    );
    let active = client
        .get_active_bundle(pb::GetActiveBundleRequest {
            bundle_ref: bundle_ref(""),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (active.version.as_str(), active.actor.as_str()),
        ("1.0.0", "ops")
    );
    assert_eq!(
        deployments(&mut client).await,
        [
            (
                "1.0.0".to_owned(),
                "rollback".to_owned(),
                published.lock_hash.clone()
            ),
            (
                "1.1.0".to_owned(),
                "deploy".to_owned(),
                v2.lock_hash.clone()
            ),
            (
                "1.0.0".to_owned(),
                "deploy".to_owned(),
                published.lock_hash.clone()
            ),
        ]
    );
    let listed: Vec<String> = client
        .list_bundles(pb::ListBundlesRequest {
            namespace: NAMESPACE.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .bundles
        .into_iter()
        .map(|b| format!("{}/{}", b.namespace, b.name))
        .collect();
    assert_eq!(listed, ["support/refund-desk"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_is_published_deployed_run_and_rolled_back_on_sqlite() {
    scenario(Db::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_is_published_deployed_run_and_rolled_back_on_postgres() {
    if let Some(db) = Db::postgres().await {
        scenario(db).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_publication_is_refused_and_nothing_is_stored() {
    let db = Db::sqlite();
    let server = Server::start(&db, &SecretsKey::generate().unwrap(), Arc::default()).await;
    let mut client = server.client().await;
    let (_dir, path) = desk();
    let honest = publish_request(&path);

    // A member snapshot changed after locking: the recomputed lock differs.
    let mut drifted = honest.clone();
    let member = &mut drifted.members[1].resolved_manifest;
    let text = String::from_utf8(member.clone()).unwrap();
    *member = text
        .replace("Issue the refund", "Issue any refund")
        .into_bytes();
    assert_code(
        client.publish_bundle(drifted).await,
        Code::InvalidArgument,
        "committed_lock drift",
    );
    // No root.
    let mut rootless = honest.clone();
    rootless.members[0].is_root = false;
    assert_code(
        client.publish_bundle(rootless).await,
        Code::InvalidArgument,
        "exactly one is_root member (got 0)",
    );
    // No lock.
    let mut unlocked = honest.clone();
    unlocked.committed_lock.clear();
    assert_code(
        client.publish_bundle(unlocked).await,
        Code::InvalidArgument,
        "committed_lock is required",
    );
    // Missing bundle_ref fields are named.
    assert_code(
        client
            .deploy_bundle(pb::DeployBundleRequest {
                bundle_ref: bundle_ref(""),
                actor: String::new(),
                allow_new_secret_endpoints: false,
            })
            .await,
        Code::InvalidArgument,
        "bundle_ref requires namespace, name, and version",
    );
    assert_code(
        client
            .list_bundle_versions(pb::ListBundleVersionsRequest { bundle_ref: None })
            .await,
        Code::InvalidArgument,
        "bundle_ref requires namespace and name",
    );
    let none = client
        .list_bundles(pb::ListBundlesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.bundles.is_empty(), "{none:?}");
    server.stop().await;
}
