//! `phrony bundles lock BUNDLE`: walk the closure and write `bundle.lock.json`.
//!
//! Vendored members are hashed locally. An external member (`namespace.name@version`, a
//! published catalog version) is locked with the content hash of that version as the runtime
//! (`--runtime-addr`) has it: the command connects only when the closure has one.

use std::collections::HashMap;
use std::io::{self, Write as _};
use std::path::PathBuf;

use anyhow::Context as _;
use phrony_client::{AgentName, ClientError, Code, VersionStatus};
use serde_json::json;

use crate::cmd::{Global, Output, manifest, remote, render};

/// Arguments of `phrony bundles lock`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Bundle manifest (bundle.yaml).
    bundle: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// An external member's `(namespace, name, version)`.
type ExternalKey = (String, String, String);

/// Writes the lock beside the bundle and prints its hash and members.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let bundle = phrony_manifest::load_bundle(&args.bundle)
        .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    let externals: Vec<ExternalKey> = bundle
        .members
        .iter()
        .filter_map(|m| m.external.clone())
        .filter(|(_, _, version)| !version.is_empty())
        .collect();
    let hashes = if externals.is_empty() {
        HashMap::new()
    } else {
        remote::block_on(resolve(&externals, global))?
    };
    let locked = phrony_manifest::lock_loaded_bundle(bundle, &mut |namespace, name, version| {
        let key = (namespace.to_owned(), name.to_owned(), version.to_owned());
        hashes
            .get(&key)
            .cloned()
            .unwrap_or_else(|| Err("the runtime was not asked for it".to_owned()))
    })
    .map_err(|diags| manifest::rejected(&diags, "bundle"))?;
    manifest::print_diagnostics(&locked.bundle.warnings)?;
    let bundle = &locked.bundle;
    if args.output == Output::Json {
        return render::json(&json!({
            "namespace": bundle.namespace,
            "name": bundle.name,
            "lock_hash": locked.lock.version,
            "members": bundle.members.len(),
            "root": locked.lock.root_child_name,
        }));
    }
    let mut stdout = io::stdout().lock();
    writeln!(
        stdout,
        "locked: {}/{} {}",
        bundle.namespace, bundle.name, locked.lock.version
    )?;
    writeln!(
        stdout,
        "members: {} (root: {})",
        bundle.members.len(),
        locked.lock.root_child_name
    )?;
    Ok(())
}

/// Asks the runtime for each external member's published version: its content hash, or why it
/// cannot be locked (not published there, retired). A runtime that cannot be reached, or any
/// other failure, fails the command.
async fn resolve(
    externals: &[ExternalKey],
    global: &Global,
) -> anyhow::Result<HashMap<ExternalKey, Result<String, String>>> {
    let names: Vec<String> = externals
        .iter()
        .map(|(namespace, name, version)| format!("{namespace}.{name}@{version}"))
        .collect();
    let why = || {
        format!(
            "bundle has external members ({}): locking them needs the content hash of each \
             published version from the runtime at {}",
            names.join(", "),
            global.runtime_addr
        )
    };
    let (client, _) = remote::connect(global).await.with_context(why)?;
    let mut out = HashMap::new();
    for key in externals {
        let (namespace, name, version) = key;
        let agent = AgentName::new(namespace, name);
        let found = match client.get_agent_version(&agent, version).await {
            Ok(v) if v.status() == VersionStatus::Retired => Err(format!(
                "version {version:?} of agent {namespace}/{name} is retired on the runtime at {}",
                client.addr()
            )),
            Ok(v) => Ok(v.content_hash),
            Err(ClientError::Rpc {
                code: Code::NotFound | Code::InvalidArgument,
                message,
            }) => Err(format!("{message} (runtime at {})", client.addr())),
            Err(e) => return Err(remote::failure("resolve external members", e)).with_context(why),
        };
        out.insert(key.clone(), found);
    }
    Ok(out)
}
