//! The engine's modules import each other without a loop: every `crate::<module>` path in
//! `src/<module>.rs` points down an acyclic graph (shared state lives in the leaf `state.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `module -> modules it names as crate::<module>` for every `src/*.rs`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        let mut deps = BTreeSet::new();
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            let dep: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !dep.is_empty() && dep != name {
                deps.insert(dep);
            }
        }
        graph.insert(name, deps);
    }
    // Paths like `crate::Engine` (re-exports of lib.rs) are not module edges.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for deps in graph.values_mut() {
        deps.retain(|d| modules.contains(d) && d != "lib");
    }
    graph
}

#[test]
fn the_engine_modules_form_an_acyclic_graph() {
    let graph = module_graph();
    assert!(graph.contains_key("state"), "{graph:?}");
    // Kahn's algorithm: repeatedly remove modules whose dependencies are all removed.
    let mut left = graph.clone();
    while !left.is_empty() {
        let ready: Vec<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(
            !ready.is_empty(),
            "these engine modules import each other in a loop: {left:#?}"
        );
        for m in ready {
            left.remove(&m);
        }
    }
    for leaf in ["clock", "config", "error", "provider"] {
        assert_eq!(graph[leaf], BTreeSet::new(), "{leaf} must stay a leaf");
    }
    // The fold reports an event it cannot read as a store error, and imports nothing else.
    assert_eq!(
        graph["fold"],
        BTreeSet::from(["error".to_owned()]),
        "fold may import only error"
    );
    for shared in ["state", "subscribe", "timer"] {
        for dep in &graph[shared] {
            assert!(
                !["engine", "driver", "calls", "attach", "inspect"].contains(&dep.as_str()),
                "{shared} must not import {dep}: {graph:#?}"
            );
        }
    }
}
