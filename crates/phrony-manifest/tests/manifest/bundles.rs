//! Bundles: closure walk, lock hash, drift, secret union.

use std::path::Path;

use phrony_manifest::{
    BundleLock, LOCK_FILE, MemberOrigin, load_bundle, lock_bundle, validate_bundle,
};

use crate::support::{Project, fixture};

/// Copies `tests/fixtures/bundles/<name>` into a temporary project.
fn copy_bundle(name: &str) -> Project {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), target).unwrap();
            }
        }
    }
    let p = Project::new();
    copy_dir(&fixture(&format!("bundles/{name}")), p.dir.path());
    p
}

fn error_lines(err: &phrony_manifest::Diagnostics) -> Vec<String> {
    err.errors().map(|d| d.message.clone()).collect()
}

#[test]
fn the_committed_lock_matches_the_closure() {
    let v = validate_bundle(fixture("bundles/desk/bundle.yaml"), true).unwrap();
    let members: Vec<(&str, MemberOrigin, &str)> = v
        .bundle
        .members
        .iter()
        .map(|m| (m.child_name.as_str(), m.origin, m.reference.as_str()))
        .collect();
    assert_eq!(
        members,
        [
            ("front-desk", MemberOrigin::Vendored, "./front-desk.yaml"),
            (
                "refund-specialist",
                MemberOrigin::Vendored,
                "./specialists/refunds.yaml"
            ),
        ],
        "DFS order, root first; the late-bound edge is outside the closure"
    );
    assert_eq!(
        v.lock.unwrap().version,
        "sha256:baecf0f19efb353816727e85143690856dc5195cd4b5d2f29e0cc0a3e90c3df8"
    );
    let secrets: Vec<(&str, &str, Vec<String>)> = v
        .secrets
        .iter()
        .map(|s| (s.name.as_str(), s.from_env.as_str(), s.declared_by.clone()))
        .collect();
    assert_eq!(
        secrets,
        [(
            "openai",
            "OPENAI_API_KEY",
            vec!["front-desk".to_owned(), "refund-specialist".to_owned()]
        )]
    );
}

#[test]
fn locking_writes_compact_bytes_identical_to_the_committed_lock() {
    let p = copy_bundle("desk");
    std::fs::remove_file(p.path(LOCK_FILE)).unwrap();
    let err = validate_bundle(p.path("bundle.yaml"), true).unwrap_err();
    assert_eq!(
        error_lines(&err),
        ["no committed lock; run phrony bundles lock"]
    );
    assert!(
        validate_bundle(p.path("bundle.yaml"), false)
            .unwrap()
            .lock
            .is_none()
    );

    let locked = lock_bundle(p.path("bundle.yaml")).unwrap();
    let written = std::fs::read(p.path(LOCK_FILE)).unwrap();
    assert_eq!(
        written,
        std::fs::read(fixture("bundles/desk/bundle.lock.json")).unwrap()
    );
    assert!(!written.ends_with(b"\n"));
    assert_eq!(BundleLock::parse(&written).unwrap(), locked.lock);
    assert!(validate_bundle(p.path("bundle.yaml"), true).is_ok());
}

#[test]
fn drift_and_tampering_are_reported() {
    let p = copy_bundle("desk");
    let spec = std::fs::read_to_string(p.path("specialists/refunds.yaml")).unwrap();
    p.write(
        "specialists/refunds.yaml",
        &spec.replace("Issue refunds within policy.", "Issue refunds."),
    );
    let err = validate_bundle(p.path("bundle.yaml"), false).unwrap_err();
    assert_eq!(
        error_lines(&err),
        [
            "bundle.lock.json drift: members[1] content_hash drift: lock is out of date; run phrony bundles lock"
        ]
    );
    assert!(err.as_slice()[0].file.ends_with(LOCK_FILE));

    let p = copy_bundle("desk");
    let lock = std::fs::read_to_string(p.path(LOCK_FILE)).unwrap();
    p.write(
        LOCK_FILE,
        &lock.replace(
            "\"root_child_name\":\"front-desk\"",
            "\"root_child_name\":\"other\"",
        ),
    );
    let err = validate_bundle(p.path("bundle.yaml"), false).unwrap_err();
    let lines = error_lines(&err);
    assert!(
        lines[0].starts_with("lockfile version \"sha256:baecf0f1"),
        "{lines:?}"
    );
    assert!(lines[0].contains("does not match body hash"), "{lines:?}");
    assert_eq!(
        lines[1],
        "bundle.lock.json drift: root_child_name drift; run phrony bundles lock"
    );

    p.write(
        LOCK_FILE,
        "{\"version\":\"\",\"root_child_name\":\"front-desk\",\"members\":[]}",
    );
    let lines = error_lines(&validate_bundle(p.path("bundle.yaml"), false).unwrap_err());
    assert_eq!(lines[0], "lockfile version is required");
    assert!(
        lines[1].starts_with("bundle.lock.json drift: member count drift"),
        "{lines:?}"
    );

    p.write(LOCK_FILE, "{\"version\":1}");
    let lines = error_lines(&validate_bundle(p.path("bundle.yaml"), false).unwrap_err());
    assert!(lines[0].starts_with("invalid lock file: "), "{lines:?}");
}

#[test]
fn secret_conflicts_fail_before_the_lock_is_written() {
    let p = copy_bundle("desk");
    std::fs::remove_file(p.path(LOCK_FILE)).unwrap();
    let spec = std::fs::read_to_string(p.path("specialists/refunds.yaml")).unwrap();
    p.write(
        "specialists/refunds.yaml",
        &spec.replace("fromEnv: OPENAI_API_KEY", "fromEnv: OPENAI_API_KEY_DEV"),
    );
    let expected = [
        "secret \"openai\": member \"front-desk\" uses OPENAI_API_KEY, member \"refund-specialist\" uses OPENAI_API_KEY_DEV",
    ];
    assert_eq!(
        error_lines(&lock_bundle(p.path("bundle.yaml")).unwrap_err()),
        expected
    );
    assert!(
        !p.path(LOCK_FILE).exists(),
        "nothing is written on a conflict"
    );
    assert_eq!(
        error_lines(&validate_bundle(p.path("bundle.yaml"), false).unwrap_err()),
        expected
    );
}

const MEMBER: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: NAME, namespace: demo, version: 1.0.0}
spec:
  purpose: p
  instructions: {text: hi}
  model: {provider: openai, name: gpt-4o}
";

fn member(name: &str, agents: &[&str]) -> String {
    let mut s = MEMBER.replace("NAME", name);
    if !agents.is_empty() {
        s.push_str("  agents:\n");
        for a in agents {
            s.push_str(&format!("    - ref: {a}\n"));
        }
    }
    s
}

fn bundle_project(root: &str) -> Project {
    let p = Project::new();
    p.write(
        "bundle.yaml",
        &format!("apiVersion: phrony.com/v1\nkind: Bundle\nmetadata: {{name: b, namespace: demo, version: 1.0.0}}\nspec: {{root: {root}}}\n"),
    );
    p
}

#[test]
fn closure_walk_rules() {
    // Diamond: a -> b, a -> c, b -> d, c -> d; d is a member once. Nested refs are relative to
    // the declaring member's directory.
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["./team/b.yaml", "./team/c.yaml"]));
    p.write("team/b.yaml", &member("b", &["./d.yaml"]));
    p.write("team/c.yaml", &member("c", &["./d.yaml"]));
    p.write("team/d.yaml", &member("d", &[]));
    let locked = lock_bundle(p.path("bundle.yaml")).unwrap();
    let members: Vec<(&str, &str)> = locked
        .lock
        .members
        .iter()
        .map(|m| (m.child_name.as_str(), m.reference.as_str()))
        .collect();
    assert_eq!(
        members,
        [
            ("a", "./a.yaml"),
            ("b", "./team/b.yaml"),
            ("d", "./team/d.yaml"),
            ("c", "./team/c.yaml")
        ]
    );

    // Cycle.
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["./b.yaml"]));
    p.write("b.yaml", &member("b", &["./a.yaml"]));
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    assert_eq!(
        error_lines(&err),
        ["bundle closure cycle detected: a -> b -> a"]
    );
    let d = &err.as_slice()[0];
    assert!(d.file.ends_with("b.yaml"));
    assert_eq!((d.line, d.path.as_str()), (9, "spec.agents[0].ref"));

    // Two refs, one child name.
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["./b.yaml", "./c.yaml"]));
    p.write("b.yaml", &member("same", &[]));
    p.write("c.yaml", &member("same", &[]));
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    assert_eq!(
        error_lines(&err),
        ["duplicate bundle child_name \"same\" from refs \"./b.yaml\" and \"./c.yaml\""]
    );

    // External members need a runtime to lock.
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["demo.published@1.2.0"]));
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    assert_eq!(
        error_lines(&err),
        [
            "bundle has external member \"published\" (demo.published@1.2.0): resolving its \
             content_hash needs a runtime; run phrony bundles lock with a reachable runtime \
             (--runtime-addr)"
        ]
    );
    assert!(!p.path(LOCK_FILE).exists());

    // With a resolver, every external member it cannot resolve is reported, and nothing is
    // written.
    let p = bundle_project("./a.yaml");
    p.write(
        "a.yaml",
        &member("a", &["demo.published@1.2.0", "ops.other@2.0.0"]),
    );
    let bundle = load_bundle(p.path("bundle.yaml")).unwrap();
    let err = phrony_manifest::lock_loaded_bundle(bundle, &mut |ns, name, version| {
        Err(format!(
            "no published version {version:?} for agent {ns}/{name}"
        ))
    })
    .unwrap_err();
    assert_eq!(
        error_lines(&err),
        [
            "bundle has external member \"published\" (demo.published@1.2.0): no published \
             version \"1.2.0\" for agent demo/published",
            "bundle has external member \"other\" (ops.other@2.0.0): no published version \
             \"2.0.0\" for agent ops/other",
        ]
    );
    assert!(!p.path(LOCK_FILE).exists());

    // A member that fails to compile fails the walk with its own diagnostics.
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["./missing.yaml"]));
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    assert!(
        error_lines(&err)[0].starts_with("ref \"./missing.yaml\" not found in bundle directory"),
        "{err}"
    );
}

#[test]
fn bundle_documents_are_validated() {
    let p = Project::new();
    p.write("bundle.yaml", "apiVersion: phrony.com/v1\nkind: Bundle\nmetadata: {name: b, namespace: demo, version: x}\nspec: {root: /abs/root.yaml}\n");
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    let got: Vec<String> = err
        .errors()
        .map(|d| format!("{}:{} {}: {}", d.line, d.column, d.path, d.message))
        .collect();
    assert_eq!(
        got,
        [
            "3:47 metadata.version: must be valid semver",
            "4:14 spec.root: must be bundle-relative"
        ]
    );
    p.write("bundle.yaml", "apiVersion: phrony.com/v1\nkind: Bundle\nmetadata: {name: b, namespace: demo, version: 1.0.0}\nspec: {root: ../outside.yaml}\n");
    let err = lock_bundle(p.path("bundle.yaml")).unwrap_err();
    assert_eq!(error_lines(&err), ["must resolve inside bundle root"]);
    p.write("bundle.yaml", "apiVersion: phrony.com/v1\nkind: Bundle\nmetadata: {name: b, namespace: demo, version: 1.0.0}\nspec: {}\n");
    assert_eq!(
        error_lines(&lock_bundle(p.path("bundle.yaml")).unwrap_err()),
        ["is required"]
    );
}

#[test]
fn every_failing_member_is_reported() {
    let p = bundle_project("./a.yaml");
    p.write("a.yaml", &member("a", &["./b.yaml", "./c.yaml"]));
    p.write(
        "b.yaml",
        &member("b", &[]).replace("purpose: p", "purpose: \"\""),
    );
    p.write(
        "c.yaml",
        &member("c", &[]).replace("provider: openai", "provider: gemini"),
    );
    let err = load_bundle(p.path("bundle.yaml")).unwrap_err();
    let got: Vec<String> = err
        .errors()
        .map(|d| {
            format!(
                "{} {}",
                d.file.file_name().unwrap().to_string_lossy(),
                d.path
            )
        })
        .collect();
    assert_eq!(got, ["b.yaml spec.purpose", "c.yaml spec.model.provider"]);
}
