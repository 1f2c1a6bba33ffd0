//! `phrony bundles inspect NS/NAME[@VERSION]`: one published bundle version (default: the
//! active one), its lock hash, publisher and members (`GetBundleVersion`).

use std::io::{self, Write};

use anyhow::Context as _;
use phrony_client::BundleVersion;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, remote, render};

/// Arguments of `phrony bundles inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The bundle: namespace/name (the active version) or namespace/name@version (semver or
    /// sha256: lock hash).
    bundle: String,
    /// Output format (JSON includes the stored lock and Bundle document).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints the `key: value` header block, then the members table.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let parsed = agent_ref::parse(&args.bundle)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let found = client
            .get_bundle_version(&parsed.agent, parsed.version.as_deref())
            .await
            .map_err(remote::fails("inspect"))?;
        match args.output {
            Output::Json => render::json(&inspection_json(&found)?),
            Output::Text => Ok(write_inspection(&found, &mut io::stdout().lock())?),
        }
    })
}

/// `active` or `published`.
fn status(found: &BundleVersion) -> &'static str {
    if found.active { "active" } else { "published" }
}

/// The header block (`bundle:`, `status:`, `lock_hash:`, `version_id:`, `published_at:`,
/// `published_by:` when recorded, `root:`), a blank line, and the members table
/// `CHILD_NAME ORIGIN REF VERSION CONTENT_HASH ROOT`.
fn write_inspection(found: &BundleVersion, out: &mut impl Write) -> io::Result<()> {
    let mut header = Table::headless(2);
    let mut field = |key: &str, value: String| {
        header.row(vec![format!("{key}:"), value]);
    };
    field("bundle", format!("{}@{}", found.bundle, found.version));
    field("status", status(found).to_owned());
    field("lock_hash", found.lock_hash.clone());
    field("version_id", found.bundle_version_id.clone());
    field("published_at", render::time(found.published_at));
    if let Some(by) = &found.published_by {
        field("published_by", by.clone());
    }
    if let Some(root) = found.members.iter().find(|m| m.is_root) {
        field("root", root.child_name.clone());
    }
    field("members", found.members.len().to_string());
    header.write(out)?;
    writeln!(out)?;
    let mut members = Table::new(&[
        "CHILD_NAME",
        "ORIGIN",
        "REF",
        "VERSION",
        "CONTENT_HASH",
        "ROOT",
    ]);
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    for m in &found.members {
        members.row(vec![
            m.child_name.clone(),
            m.origin.clone(),
            dash(&m.reference),
            dash(&m.version),
            dash(&m.content_hash),
            if m.is_root { "yes" } else { "no" }.to_owned(),
        ]);
    }
    members.write(out)
}

/// Every field, with the stored lock and Bundle document as JSON values.
fn inspection_json(found: &BundleVersion) -> anyhow::Result<Value> {
    let lock: Value = serde_json::from_str(&found.lock_json)
        .context("the runtime returned a stored lock that is not JSON")?;
    let manifest: Value = serde_json::from_str(&found.manifest_json)
        .context("the runtime returned a stored Bundle document that is not JSON")?;
    Ok(json!({
        "namespace": found.bundle.namespace,
        "name": found.bundle.name,
        "version": found.version,
        "status": status(found),
        "active": found.active,
        "lock_hash": found.lock_hash,
        "bundle_version_id": found.bundle_version_id,
        "published_at": render::time(found.published_at),
        "published_by": found.published_by,
        "members": found.members.iter().map(|m| json!({
            "child_name": m.child_name,
            "origin": m.origin,
            "ref": m.reference,
            "member_version_id": m.member_version_id,
            "is_root": m.is_root,
            "namespace": m.agent.namespace,
            "name": m.agent.name,
            "version": m.version,
            "content_hash": m.content_hash,
        })).collect::<Vec<_>>(),
        "lock": lock,
        "manifest": manifest,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_proto::runtime::v1 as pb;

    use super::*;

    fn member(child: &str, reference: &str, hash: &str, root: bool) -> pb::BundleMemberInfo {
        pb::BundleMemberInfo {
            child_name: child.into(),
            origin: "vendored".into(),
            r#ref: reference.into(),
            member_version_id: format!("av-{child}"),
            is_root: root,
            namespace: "support".into(),
            name: child.into(),
            version: "1.0.0".into(),
            content_hash: hash.into(),
        }
    }

    fn sample() -> BundleVersion {
        BundleVersion::try_from(pb::GetBundleVersionResponse {
            bundle_version_id: "bv-1".into(),
            namespace: "support".into(),
            name: "refund-desk".into(),
            version: "1.0.0".into(),
            lock_hash: "sha256:0a1b".into(),
            lock: br#"{"version":"sha256:0a1b","root_child_name":"front-desk","members":[]}"#
                .to_vec(),
            bundle_manifest: br#"{"apiVersion":"phrony.com/v1","kind":"Bundle"}"#.to_vec(),
            members: vec![
                member("front-desk", "./front-desk.yaml", "91ab", true),
                member(
                    "refund-specialist",
                    "./specialists/refunds.yaml",
                    "cf5b",
                    false,
                ),
            ],
            published_at: "2025-01-31T09:30:00Z".into(),
            published_by: "ci-alice".into(),
            active: true,
        })
        .unwrap()
    }

    #[test]
    fn the_inspection_is_a_header_block_and_a_members_table() {
        let mut out = Vec::new();
        write_inspection(&sample(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("bundles_inspect", text);
        });
    }

    #[test]
    fn json_carries_the_members_the_lock_and_the_document() {
        let shown = inspection_json(&sample()).unwrap();
        assert_eq!(shown["status"], "active");
        assert_eq!(shown["members"][1]["ref"], "./specialists/refunds.yaml");
        assert_eq!(shown["members"][0]["is_root"], true);
        assert_eq!(shown["lock"]["root_child_name"], "front-desk");
        assert_eq!(shown["manifest"]["kind"], "Bundle");
    }
}
