//! `phrony bundles publish BUNDLE`: check the closure against the committed lock, publish an
//! immutable bundle version.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use phrony_client::{BundleMemberPackage, PublishBundle, PublishedBundle};
use serde_json::json;

use crate::cmd::{Global, Output, manifest, remote, render};

/// Arguments of `phrony bundles publish`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Bundle manifest (bundle.yaml), with its committed bundle.lock.json beside it.
    bundle: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Validates the bundle against its committed lock (failing before any network call when the
/// lock is missing or drifted), publishes it and prints `ns/name <version> (<lock hash>)`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let (bundle_name, request) = package(&args.bundle)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let published = client
            .publish_bundle(&request, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                "publish",
                "the bundle version",
                format!("phrony bundles versions {bundle_name}"),
            ))?;
        match args.output {
            Output::Json => render::json(&published_json(&published)),
            Output::Text => render::line(published_line(&published)),
        }
    })
}

/// The bundle's `namespace/name` and what `PublishBundle` sends: the Bundle document, the
/// members (root first) and the committed lock as read from disk. A missing or drifted lock is
/// refused with the diagnostics `bundles validate --require-lock` prints.
fn package(path: &Path) -> anyhow::Result<(String, PublishBundle)> {
    let validated = phrony_manifest::validate_bundle(path, true)
        .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    let bundle = &validated.bundle;
    manifest::print_diagnostics(&bundle.warnings)?;
    let members = bundle
        .published_members()
        .map_err(|reason| anyhow!(reason))?
        .into_iter()
        .map(|m| BundleMemberPackage {
            child_name: m.child_name,
            origin: m.origin.as_str().to_owned(),
            authoring_ref: m.authoring_ref,
            resolved_manifest: m.snapshot_json,
            is_root: m.is_root,
        })
        .collect();
    let lock_path = bundle
        .path
        .parent()
        .unwrap_or(Path::new("."))
        .join(phrony_manifest::LOCK_FILE);
    let committed_lock =
        std::fs::read(&lock_path).with_context(|| format!("read {}", lock_path.display()))?;
    Ok((
        format!("{}/{}", bundle.namespace, bundle.name),
        PublishBundle {
            bundle_manifest: bundle.header().to_json(),
            members,
            committed_lock,
        },
    ))
}

/// `ns/name 1.0.0 (sha256:…)`.
fn published_line(published: &PublishedBundle) -> String {
    format!(
        "{} {} ({})",
        published.bundle, published.version, published.lock_hash
    )
}

fn published_json(published: &PublishedBundle) -> serde_json::Value {
    json!({
        "namespace": published.bundle.namespace,
        "name": published.bundle.name,
        "version": published.version,
        "lock_hash": published.lock_hash,
        "bundle_id": published.bundle_id,
        "bundle_version_id": published.bundle_version_id,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    #[test]
    fn the_published_line_names_the_bundle_version_and_lock_hash() {
        let published = PublishedBundle::try_from(pb::PublishBundleResponse {
            bundle_id: "b-1".into(),
            bundle_version_id: "bv-1".into(),
            lock_hash: "sha256:0a1b".into(),
            namespace: "support".into(),
            name: "refund-desk".into(),
            lock: br#"{"version":"sha256:0a1b"}"#.to_vec(),
            version: "1.0.0".into(),
        })
        .unwrap();
        assert_eq!(
            published_line(&published),
            "support/refund-desk 1.0.0 (sha256:0a1b)"
        );
        assert_eq!(published_json(&published)["bundle_version_id"], "bv-1");
    }

    #[test]
    fn a_bundle_without_a_committed_lock_is_refused_before_any_call() {
        let dir = tempfile::tempdir().unwrap();
        crate::cmd::bundles::testing::copy_fixture(dir.path());
        let error = package(&dir.path().join("bundle.yaml")).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            "no committed lock; run phrony bundles lock"
        );
    }

    #[test]
    fn the_request_carries_the_header_the_members_and_the_lock_bytes() {
        let dir = tempfile::tempdir().unwrap();
        crate::cmd::bundles::testing::copy_fixture(dir.path());
        phrony_manifest::lock_bundle(dir.path().join("bundle.yaml")).unwrap();
        let lock = std::fs::read(dir.path().join("bundle.lock.json")).unwrap();
        let (name, request) = package(&dir.path().join("bundle.yaml")).unwrap();
        assert_eq!(name, "support/refund-desk");
        assert_eq!(request.committed_lock, lock);
        let header: serde_json::Value = serde_json::from_slice(&request.bundle_manifest).unwrap();
        assert_eq!(header["kind"], "Bundle");
        assert_eq!(header["spec"]["root"], "./front-desk.yaml");
        let members: Vec<(&str, &str, bool)> = request
            .members
            .iter()
            .map(|m| (m.child_name.as_str(), m.authoring_ref.as_str(), m.is_root))
            .collect();
        assert_eq!(
            members,
            [
                ("front-desk", "./front-desk.yaml", true),
                ("refund-specialist", "./specialists/refunds.yaml", false)
            ]
        );
        assert!(request.members.iter().all(|m| m.origin == "vendored"));
        let root: serde_json::Value =
            serde_json::from_slice(&request.members[0].resolved_manifest).unwrap();
        assert_eq!(root["metadata"]["name"], "front-desk");

        // A member edited after locking: the drift is refused, naming the fix.
        let specialist = dir.path().join("specialists/refunds.yaml");
        let text = std::fs::read_to_string(&specialist).unwrap();
        let edited = text.replace("Decide whether", "Decide quickly whether");
        assert_ne!(edited, text);
        std::fs::write(&specialist, edited).unwrap();
        let error = format!(
            "{:#}",
            package(&dir.path().join("bundle.yaml")).unwrap_err()
        );
        assert!(error.contains("drift"), "{error}");
        assert!(error.contains("run phrony bundles lock"), "{error}");
    }
}
