//! The layering the CLI relies on, checked on the resolved dependency graph: this client crate
//! links no ledger, SQL driver or session engine; the `cli` package (the `phrony` binary) built
//! without its `embedded-runtime` feature links no ledger or SQL driver either, and with it (the
//! default, for `phrony demo`) reaches them only through `phrony-runtime`, the daemon's
//! assembly, never directly or through the client, the SDK or the manifest.
//!
//! The graphs come from `cargo metadata` on the whole workspace, so features are resolved as in
//! a workspace build (where a default feature turned on by another member would pull a crate
//! in), once with default features and once with `--no-default-features`; only normal
//! dependencies are followed (not dev- or build-dependencies).

#![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The resolved graph: package id → (package name, ids of its normal dependencies).
struct Graph {
    nodes: BTreeMap<String, (String, Vec<String>)>,
}

impl Graph {
    /// The workspace's graph with default features, read once for every test of this binary.
    fn get() -> &'static Self {
        static GRAPH: OnceLock<Graph> = OnceLock::new();
        GRAPH.get_or_init(|| Self::load(&[]))
    }

    /// The workspace's graph with every member's default features off.
    fn without_default_features() -> &'static Self {
        static GRAPH: OnceLock<Graph> = OnceLock::new();
        GRAPH.get_or_init(|| Self::load(&["--no-default-features"]))
    }

    fn load(flags: &[&str]) -> Self {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let output = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1"])
            .args(flags)
            .arg("--manifest-path")
            .arg(&manifest)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
        let names: BTreeMap<&str, &str> = metadata["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
            .collect();
        let mut nodes = BTreeMap::new();
        for node in metadata["resolve"]["nodes"].as_array().unwrap() {
            let id = node["id"].as_str().unwrap();
            let normal = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|dep| {
                    dep["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|kind| kind["kind"].is_null())
                })
                .map(|dep| dep["pkg"].as_str().unwrap().to_owned())
                .collect();
            nodes.insert(id.to_owned(), (names[id].to_owned(), normal));
        }
        Self { nodes }
    }

    /// The names of every package `root` links, itself excluded, each with one path that pulls
    /// it in (for the failure message).
    fn linked_by(&self, root: &str) -> BTreeMap<String, Vec<String>> {
        self.linked_avoiding(root, &[])
    }

    /// [`linked_by`](Self::linked_by), not walking through the packages named in `avoid`.
    fn linked_avoiding(&self, root: &str, avoid: &[&str]) -> BTreeMap<String, Vec<String>> {
        let start = self
            .nodes
            .iter()
            .find(|(_, (name, _))| name == root)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("package {root} is not in the workspace"));
        let mut seen = BTreeSet::from([start.clone()]);
        let mut paths = BTreeMap::new();
        let mut queue = VecDeque::from([(start, vec![root.to_owned()])]);
        while let Some((id, path)) = queue.pop_front() {
            for dep in &self.nodes[&id].1 {
                if !seen.insert(dep.clone()) {
                    continue;
                }
                let name = self.nodes[dep].0.clone();
                if avoid.contains(&name.as_str()) {
                    continue;
                }
                let mut dep_path = path.clone();
                dep_path.push(name.clone());
                paths.entry(name).or_insert_with(|| dep_path.clone());
                queue.push_back((dep.clone(), dep_path));
            }
        }
        paths
    }
}

fn assert_links_none(graph: &Graph, root: &str, forbidden: &[&str]) {
    let linked = graph.linked_by(root);
    let found: Vec<String> = forbidden
        .iter()
        .filter_map(|name| linked.get(*name))
        .map(|path| path.join(" → "))
        .collect();
    assert!(
        found.is_empty(),
        "{root} must not link {forbidden:?}, but links:\n  {}",
        found.join("\n  ")
    );
    // The walk itself works: the client's own dependencies are found.
    assert!(linked.contains_key("phrony-proto"), "{root}: {linked:?}");
}

/// The server side of the runtime, which a client build never links.
const SERVER: &[&str] = &[
    "phrony-ledger",
    "sqlx",
    "sqlx-core",
    "phrony-grpc",
    "phrony-engine",
];

#[test]
fn the_cli_without_its_embedded_runtime_links_no_ledger_and_no_sql_driver() {
    let graph = Graph::without_default_features();
    let linked = graph.linked_by("cli");
    assert!(linked.contains_key("phrony-client"), "{linked:?}");
    assert!(!linked.contains_key("phrony-runtime"), "{linked:?}");
    assert_links_none(graph, "cli", SERVER);
}

#[test]
fn the_cli_reaches_the_server_side_only_through_the_embedded_runtime() {
    let graph = Graph::get();
    let linked = graph.linked_by("cli");
    // The default build embeds the runtime for `phrony demo`: the check below is not vacuous.
    assert!(linked.contains_key("phrony-ledger"), "{linked:?}");
    let found: Vec<String> = SERVER
        .iter()
        .filter_map(|name| {
            graph
                .linked_avoiding("cli", &["phrony-runtime"])
                .get(*name)
                .cloned()
        })
        .map(|path| path.join(" → "))
        .collect();
    assert!(
        found.is_empty(),
        "cli links the server side other than through phrony-runtime:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_sdk_links_no_ledger_sql_driver_or_engine() {
    assert_links_none(Graph::get(), "phrony-sdk", SERVER);
}

#[test]
fn the_client_links_no_ledger_sql_driver_or_engine() {
    let graph = Graph::get();
    assert_links_none(
        graph,
        "phrony-client",
        &[
            "phrony-ledger",
            "sqlx",
            "sqlx-core",
            "phrony-engine",
            "phrony-grpc",
        ],
    );
}
