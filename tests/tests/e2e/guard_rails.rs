//! Guard rails: the layering rules of ARCHITECTURE.md checked on the source tree and on the resolved
//! dependency graph (`cargo metadata`), so that a change breaking one fails `cargo test`.
//!
//! Each test names the rule it enforces; ARCHITECTURE.md's invariants point here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Packages that exist only for tests (dev-dependencies, test binaries): the layering rules on
/// normal builds do not apply to them.
/// Packages that are never shipped nor depended on by shipped code: the tests, their helpers,
/// and the load benchmark (`phrony-bench` drives the real daemon and measures a raw SQLite
/// baseline, so it needs the test helpers and sqlx).
const DEV_ONLY: &[&str] = &["tests", "phrony-test-support", "phrony-bench"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests package sits one level below the workspace root")
        .to_path_buf()
}

/// `cargo metadata` of the workspace (resolved graph included).
fn metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Workspace package name → the names of its direct normal (non-dev, non-build) dependencies.
fn direct_normal_deps(meta: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut deps = BTreeMap::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        let id = pkg["id"].as_str().unwrap_or_default();
        if !members.contains(id) {
            continue;
        }
        let names = pkg["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        deps.insert(pkg["name"].as_str().unwrap_or_default().to_owned(), names);
    }
    deps
}

/// Every `.rs` file of the workspace's crates, binaries and tests (not `target/`, not the Python
/// tests), with its path relative to the workspace root.
fn rust_sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(std::fs::DirEntry::path);
        for entry in entries {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if name == "target" || name == "python" || name.starts_with('.') {
                    continue;
                }
                walk(&path, root, out);
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&path).expect("source is UTF-8");
                let rel = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, text));
            }
        }
    }
    let root = workspace_root();
    let mut out = Vec::new();
    for top in ["crates", "bins", "tests"] {
        walk(&root.join(top), &root, &mut out);
    }
    assert!(out.len() > 100, "found only {} source files", out.len());
    out
}

/// The workspace package a source path belongs to (its directory under `crates/` or `bins/`).
fn package_dir(rel: &str) -> &str {
    let mut parts = rel.splitn(3, '/');
    let top = parts.next().unwrap_or_default();
    if top == "tests" {
        return "tests";
    }
    let second = parts.next().unwrap_or_default();
    &rel[..top.len() + 1 + second.len()]
}

/// Is `rel` test or bench code (integration tests, benches, a `tests.rs`/`*_tests.rs` module)?
fn is_test_code(rel: &str) -> bool {
    let pkg = package_dir(rel);
    let inner = &rel[pkg.len()..];
    pkg == "tests"
        || pkg == "crates/phrony-test-support"
        || inner.starts_with("/tests/")
        || inner.starts_with("/benches/")
        || inner.ends_with("/tests.rs")
        || inner.ends_with("_tests.rs")
        || inner.ends_with("/testing.rs")
}

/// The part of a source file before its first `#[cfg(test)]` (unit tests are test code).
fn non_test_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

#[test]
fn only_the_ledger_knows_sql() {
    // Dependency graph: no workspace package but the ledger (and test-only ones) uses sqlx directly.
    let deps = direct_normal_deps(&metadata());
    let offenders: Vec<_> = deps
        .iter()
        .filter(|(name, d)| {
            name.as_str() != "phrony-ledger"
                && !DEV_ONLY.contains(&name.as_str())
                && d.contains("sqlx")
        })
        .map(|(name, _)| name.clone())
        .collect();
    assert!(
        offenders.is_empty(),
        "packages depending on sqlx: {offenders:?}"
    );

    // Sources: no SQL statement and no `sqlx` outside the ledger's and the tests' code.
    let sql = regex::Regex::new(
        r#""[^"\n]*\b(SELECT\s+\S+.*\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+TABLE|DROP\s+TABLE)\b"#,
    )
    .expect("regex");
    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        // The benchmark's raw-commit baseline is SQL on its own scratch database, not the ledger's.
        if package_dir(&rel) == "crates/phrony-ledger"
            || rel.starts_with("bins/bench/src/baseline.rs")
            || is_test_code(&rel)
        {
            continue;
        }
        let code = non_test_part(&text);
        for (n, line) in code.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") {
                continue;
            }
            if line.contains("sqlx") || sql.is_match(line) {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "SQL outside phrony-ledger:\n{}",
        found.join("\n")
    );
}

#[test]
fn only_the_edge_sees_protobuf() {
    // The daemon's assembly names the generated service and the descriptor set for reflection
    // when it composes the server; it converts nothing.
    const EDGE: &[&str] = &[
        "phrony-proto",
        "phrony-grpc",
        "phrony-client",
        "phrony-runtime",
    ];
    let deps = direct_normal_deps(&metadata());
    let offenders: Vec<_> = deps
        .iter()
        .filter(|(name, d)| {
            !EDGE.contains(&name.as_str())
                && !DEV_ONLY.contains(&name.as_str())
                && (d.contains("phrony-proto") || d.contains("prost") || d.contains("tonic-prost"))
        })
        .map(|(name, _)| name.clone())
        .collect();
    assert!(
        offenders.is_empty(),
        "packages depending on protobuf crates: {offenders:?}"
    );

    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        let pkg = package_dir(&rel);
        // The load benchmark measures the bare wire itself (its bidi-stream round trip baseline
        // speaks the generated client); like the other development-only packages, it ships in
        // nothing.
        if EDGE.iter().any(|e| pkg.ends_with(e))
            || pkg.ends_with("bins/bench")
            || is_test_code(&rel)
        {
            continue;
        }
        for (n, line) in non_test_part(&text).lines().enumerate() {
            if line.contains("phrony_proto") || line.contains("prost::") {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "protobuf types outside the gRPC edge:\n{}",
        found.join("\n")
    );
}

#[test]
fn libraries_never_read_the_process_environment() {
    // Binaries and the daemon's assembly crate read the environment; every other library takes
    // its configuration as values. (clippy's `disallowed-methods` enforces the same at lint time.)
    const MAY_READ: &[&str] = &["crates/phrony-runtime"];
    let env_read =
        regex::Regex::new(r"\benv::(var|var_os|vars|vars_os)\b|\bstd::env::").expect("regex");
    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        let pkg = package_dir(&rel);
        // Build scripts read what cargo hands them in the environment (OUT_DIR, …); a
        // library's examples are programs of their own (`cargo run --example`).
        let build_script = rel.ends_with("/build.rs");
        let example = rel.starts_with(&format!("{pkg}/examples/"));
        if pkg.starts_with("bins/")
            || MAY_READ.contains(&pkg)
            || is_test_code(&rel)
            || build_script
            || example
        {
            continue;
        }
        for (n, line) in non_test_part(&text).lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("//") {
                continue;
            }
            if env_read.is_match(line) && !line.contains("env!(") {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "libraries reading the process environment:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_tool_calls_policy_request_is_built_in_one_place() {
    // The runtime decides a call, and `phrony policies replay` re-decides a stored one, on the
    // request `phrony_manifest::CallScope::request` builds; a second construction could drift
    // from it (a field the runtime sets and the replay forgets). `with_session` is the marker:
    // besides `CallScope`, only the limit escalation's pseudo call (no tool binding) and
    // `policies check`'s `--context` (the user spells the session) set a session.
    const MAY_BUILD: &[&str] = &[
        "crates/phrony-manifest/src/policy_bridge.rs",
        "crates/phrony-engine/src/calls.rs",
        "bins/cli/src/cmd/policies/check.rs",
        "crates/phrony-policy/src/request.rs",
    ];
    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        if is_test_code(&rel) || MAY_BUILD.contains(&rel.as_str()) {
            continue;
        }
        for (n, line) in non_test_part(&text).lines().enumerate() {
            if line.contains(".with_session(") {
                found.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "policy requests built outside phrony_manifest::CallScope:\n{}",
        found.join("\n")
    );
    let calls = std::fs::read_to_string(workspace_root().join("crates/phrony-engine/src/calls.rs"))
        .expect("calls.rs");
    assert_eq!(
        calls.matches(".with_session(").count(),
        1,
        "calls.rs builds one request itself (the limit escalation); tool calls use CallScope"
    );
}

#[test]
fn every_source_file_opens_with_a_doc_line() {
    let missing: Vec<_> = rust_sources()
        .into_iter()
        .filter(|(_, text)| {
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or_default();
            // A crate whose docs are its README (`#![doc = include_str!(…)]`) opens with them.
            !first.starts_with("//!") && !first.starts_with("#![doc = include_str!(")
        })
        .map(|(rel, _)| rel)
        .collect();
    assert!(
        missing.is_empty(),
        "source files that do not open with a `//!` line saying what they are:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_allow_carries_a_reason() {
    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        let mut rest = text.as_str();
        let mut offset = 0;
        while let Some(at) = rest.find("allow(") {
            let before = &rest[..at];
            let is_attr = before.ends_with("#[") || before.ends_with("#![");
            let tail = &rest[at..];
            // An attribute runs to its `)]`; any other `allow(` (a call such as `mint_allow(`)
            // is skipped by itself.
            let end = if is_attr {
                tail.find(")]").map_or(tail.len(), |e| e + 2)
            } else {
                "allow(".len()
            };
            if is_attr && !tail[..end].contains("reason") {
                let line = text[..offset + at].lines().count();
                found.push(format!("{rel}:{line}"));
            }
            offset += at + end;
            rest = &rest[at + end..];
        }
    }
    assert!(
        found.is_empty(),
        "`#[allow]` without a `reason`:\n{}",
        found.join("\n")
    );
}

#[test]
fn layering_matches_architecture() {
    // ARCHITECTURE.md lists every direct normal dependency between workspace packages; the list
    // must be exactly what cargo resolves, so the documented layering is the real one.
    let doc =
        std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let begin = doc
        .find("<!-- edges: begin -->")
        .expect("edges: begin marker");
    let end = doc.find("<!-- edges: end -->").expect("edges: end marker");
    let documented: BTreeMap<String, BTreeSet<String>> = doc[begin..end]
        .lines()
        .filter_map(|line| line.split_once(" ->"))
        .map(|(from, to)| {
            let to = to
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned);
            (from.trim().to_owned(), to.collect())
        })
        .collect();
    let deps = direct_normal_deps(&metadata());
    let names: BTreeSet<&String> = deps.keys().collect();
    let actual: BTreeMap<String, BTreeSet<String>> = deps
        .iter()
        .filter(|(name, _)| !DEV_ONLY.contains(&name.as_str()))
        .map(|(name, d)| {
            let internal = d.iter().filter(|x| names.contains(x)).cloned().collect();
            (name.clone(), internal)
        })
        .collect();
    assert_eq!(
        documented, actual,
        "ARCHITECTURE.md's dependency edges differ from cargo metadata (left: documented, right: actual)"
    );
}

/// `module -> the modules it names` for one crate: every `src/**/*.rs` file is a module (its
/// path below `src/`, `a/b.rs` and `a/b/mod.rs` both `a::b`; a `<name>_tests.rs` file is the
/// test module of `<name>`), and every `crate::<module>` path outside a comment — `use`
/// statements, paths in code, `$crate::` in macros — is an edge to the top-level module it
/// names. The crate root (`lib.rs`) declares every module and is not part of the graph:
/// `crate::Item` names an item of the root, not a module.
fn crate_module_graph(crate_dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    fn walk(dir: &Path, src: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("src/ is readable")
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(std::fs::DirEntry::path);
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                let rel = path
                    .strip_prefix(src)
                    .expect("under src/")
                    .with_extension("")
                    .to_string_lossy()
                    .replace('\\', "/");
                let text = std::fs::read_to_string(&path).expect("source is UTF-8");
                out.push((rel, text));
            }
        }
    }
    let src = workspace_root().join(crate_dir).join("src");
    let mut files = Vec::new();
    walk(&src, &src, &mut files);
    let top = |rel: &str| -> String {
        let first = rel.split('/').next().unwrap_or_default();
        first.strip_suffix("_tests").unwrap_or(first).to_owned()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(rel, _)| top(rel))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (rel, text) in &files {
        let from = top(rel);
        if from == "lib" {
            continue;
        }
        for line in text.lines() {
            let code = line.split_once("//").map_or(line, |(code, _)| code);
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if name != from && modules.contains(&name) {
                    graph.entry(from.clone()).or_default().insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, as `a -> b -> a`, or `None` when the graph is acyclic.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<&'a str>,
        path: &mut Vec<&'a str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<&str> = path[at..].to_vec();
            cycle.push(node);
            return Some(cycle.join(" -> "));
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn the_cycle_finder_names_a_loop_and_accepts_a_dag() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            g.entry((*from).to_owned())
                .or_default()
                .insert((*to).to_owned());
            g.entry((*to).to_owned()).or_default();
        }
        g
    };
    let dag = graph(&[("a", "b"), ("b", "c"), ("a", "c")]);
    assert_eq!(find_cycle(&dag), None);
    let looped = graph(&[
        ("approvals", "sessions"),
        ("sessions", "db"),
        ("sessions", "approvals"),
    ]);
    assert_eq!(
        find_cycle(&looped).as_deref(),
        Some("approvals -> sessions -> approvals")
    );
}

#[test]
fn ledger_and_engine_modules_form_an_acyclic_graph() {
    for crate_dir in ["crates/phrony-ledger", "crates/phrony-engine"] {
        let graph = crate_module_graph(crate_dir);
        assert!(graph.len() > 10, "{crate_dir}: found only {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{crate_dir}: modules import each other in a loop: {cycle}\n{graph:#?}");
        }
    }
    // The shapes ARCHITECTURE.md describes: the ledger's row readers and the audit key are
    // leaves of the writers, and nothing below the cross-entity changes imports them.
    let ledger = crate_module_graph("crates/phrony-ledger");
    for writer in [
        "approvals",
        "invocations",
        "sessions",
        "secrets",
        "lifecycle",
    ] {
        assert!(
            !ledger["rows"].contains(writer),
            "rows must not import {writer}"
        );
    }
    for lower in ["approvals", "invocations", "sessions", "secrets", "rows"] {
        assert!(
            !ledger[lower].contains("cascade"),
            "{lower} must not import cascade (the cross-entity changes sit above it)"
        );
    }
    assert!(
        ledger["audit_key"].is_empty(),
        "audit_key must stay a leaf: {:?}",
        ledger["audit_key"]
    );
}

/// The fields a `#[error("…")]` message interpolates: `{name}`, `{0:?}` in the format string
/// (`{{` is a literal brace) and `.name` / `.0` in the arguments after it.
fn interpolated_fields(format: &str, args: &[proc_macro2::TokenTree]) -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    let mut rest = format;
    while let Some(at) = rest.find('{') {
        let tail = &rest[at + 1..];
        if let Some(escaped) = tail.strip_prefix('{') {
            rest = escaped;
            continue;
        }
        let end = tail.find(['}', ':']).unwrap_or(tail.len());
        let name = tail[..end].trim();
        if !name.is_empty() {
            fields.insert(name.to_owned());
        }
        rest = &tail[end..];
    }
    for pair in args.windows(2) {
        if let [proc_macro2::TokenTree::Punct(dot), field] = pair
            && dot.as_char() == '.'
        {
            fields.insert(field.to_string());
        }
    }
    fields
}

/// The error's source field as `thiserror` sees it: the field marked `#[source]` or `#[from]`,
/// else a field named `source` (by its name, or `0` for a tuple field).
fn source_field(fields: &syn::Fields) -> Option<String> {
    let marked = |field: &syn::Field| {
        field
            .attrs
            .iter()
            .any(|a| a.path().is_ident("source") || a.path().is_ident("from"))
    };
    let name = |(i, field): (usize, &syn::Field)| {
        field
            .ident
            .as_ref()
            .map_or_else(|| i.to_string(), ToString::to_string)
    };
    fields
        .iter()
        .enumerate()
        .find(|(_, f)| marked(f))
        .or_else(|| {
            fields
                .iter()
                .enumerate()
                .find(|(_, f)| f.ident.as_ref().is_some_and(|i| i == "source"))
        })
        .map(name)
}

/// `Some(field)` when the type's `#[error("…")]` message prints the field that is also its
/// `source()`.
fn message_repeats_source(attrs: &[syn::Attribute], fields: &syn::Fields) -> Option<String> {
    let attr = attrs.iter().find(|a| a.path().is_ident("error"))?;
    let syn::Meta::List(list) = &attr.meta else {
        return None;
    };
    let tokens: Vec<proc_macro2::TokenTree> = list.tokens.clone().into_iter().collect();
    // `#[error(transparent)]` forwards both `Display` and `source()`: nothing is repeated.
    let format = syn::parse2::<syn::LitStr>(tokens.first()?.clone().into()).ok()?;
    let source = source_field(fields)?;
    interpolated_fields(&format.value(), &tokens[1..])
        .contains(&source)
        .then_some(source)
}

/// Every error type of `file` whose message prints its own source, as `Type::Variant.field`.
fn errors_repeating_their_source(file: &syn::File) -> Vec<String> {
    struct Finder(Vec<String>);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_item_enum(&mut self, item: &'ast syn::ItemEnum) {
            for variant in &item.variants {
                if let Some(field) = message_repeats_source(&variant.attrs, &variant.fields) {
                    self.0
                        .push(format!("{}::{}.{field}", item.ident, variant.ident));
                }
            }
            syn::visit::visit_item_enum(self, item);
        }
        fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
            if let Some(field) = message_repeats_source(&item.attrs, &item.fields) {
                self.0.push(format!("{}.{field}", item.ident));
            }
            syn::visit::visit_item_struct(self, item);
        }
    }
    let mut finder = Finder(Vec::new());
    syn::visit::Visit::visit_file(&mut finder, file);
    finder.0
}

#[test]
fn the_repeated_source_finder_names_each_way_a_message_can_print_its_source() {
    let file: syn::File = syn::parse_quote! {
        enum E {
            #[error("cannot read {path}: {source}")]
            Named { path: String, source: std::io::Error },
            #[error("cannot read {path}: {error}")]
            Marked { path: String, #[source] error: std::io::Error },
            #[error("cannot parse: {0:?}")]
            From(#[from] serde_json::Error),
            #[error("cannot parse: {}", .0)]
            FromArg(#[from] serde_yaml::Error),
            #[error("cannot read {path}: {error}")]
            CauseInTheMessageOnly { path: String, error: std::io::Error },
            #[error("cannot read {path}")]
            CauseAsSourceOnly { path: String, #[source] error: std::io::Error },
            #[error("literal {{source}} braces")]
            Escaped { source: std::io::Error },
            #[error(transparent)]
            Transparent(#[from] std::io::Error),
        }
        mod inner {
            #[error("bad key: {source}")]
            struct KeyError { source: std::io::Error }
        }
    };
    assert_eq!(
        errors_repeating_their_source(&file),
        [
            "E::Named.source",
            "E::Marked.error",
            "E::From.0",
            "E::FromArg.0",
            "KeyError.source"
        ]
    );
}

/// A `{:#}` or chained report (the CLI's, the daemon's, mock-gate's) prints each error's message
/// and then its `source()`'s: an error whose message already prints its source names the cause
/// twice (or more, down a chain). The cause stays in the message (gRPC statuses and logs print
/// `Display` alone) and is not also returned as the source.
#[test]
fn no_error_message_prints_its_own_source() {
    let mut found = Vec::new();
    for (rel, text) in rust_sources() {
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for name in errors_repeating_their_source(&file) {
            found.push(format!("{rel}: {name}"));
        }
    }
    assert!(
        found.is_empty(),
        "error types whose message prints the field that is also their source(): keep a leaf \
         cause in the message and not as the source (rename the field from `source`, drop \
         `#[source]`/`#[from]`), or a cause with a chain of its own as the source and not in \
         the message:\n{}",
        found.join("\n")
    );
}
