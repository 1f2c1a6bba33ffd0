//! Server-side verification of a bundle publication (`verify_publication`).

use std::collections::HashMap;

use phrony_manifest::{
    BundleLock, CompiledAgent, LockMember, MemberOrigin, PublicationError, ReceivedMember,
    ResolvedExternal, VerifiedBundle, load_agent, load_bundle, lock_bundle, lock_loaded_bundle,
    verify_publication,
};

use crate::support::Project;

/// One member as the client sends it (owned; [`Parts::received`] borrows it).
#[derive(Debug, Clone)]
struct Member {
    child_name: String,
    origin: String,
    authoring_ref: String,
    manifest: Vec<u8>,
    is_root: bool,
    member_version_id: String,
}

/// The three parts of a `PublishBundleRequest`, plus a compiled agent outside the closure.
#[derive(Debug, Clone)]
struct Parts {
    manifest: Vec<u8>,
    members: Vec<Member>,
    lock: Vec<u8>,
    extra: Vec<u8>,
    /// What the runtime resolved external members to, by child name.
    externals: HashMap<String, Result<ResolvedExternal, String>>,
}

const BUNDLE: &str = "\
apiVersion: phrony.com/v1
kind: Bundle
metadata: {name: desk, namespace: demo, version: 1.0.0, labels: {team: payments}}
spec: {root: ./root.yaml}
";

fn agent_yaml(name: &str, secret_env: Option<&str>, agents: &[&str]) -> String {
    let mut s = format!(
        "apiVersion: phrony.com/v1\nkind: Agent\nmetadata: {{name: {name}, namespace: demo, version: 1.0.0}}\n"
    );
    if let Some(env) = secret_env {
        s.push_str(&format!("secrets:\n  openai:\n    fromEnv: {env}\n"));
    }
    s.push_str("spec:\n  purpose: p\n  instructions: {text: hi}\n  model: {provider: openai, name: gpt-4o}\n");
    if !agents.is_empty() {
        s.push_str("  agents:\n");
        for a in agents {
            s.push_str(&format!("    - ref: {a}\n"));
        }
    }
    s
}

/// root (`desk`) → `specialists/payment.yaml` (written without `./`), which delegates to
/// `./deep/ledger.yaml`; the root also delegates to the ledger directly (a diamond, written with
/// a `.` segment). Lock refs: `./root.yaml`, `specialists/payment.yaml` (as written by a member
/// in the bundle directory), `./specialists/deep/ledger.yaml` (bundle-relative, from a deeper
/// member).
fn valid() -> Parts {
    let p = Project::new();
    p.write("bundle.yaml", BUNDLE);
    p.write(
        "root.yaml",
        &agent_yaml(
            "desk",
            Some("OPENAI_API_KEY"),
            &[
                "specialists/payment.yaml",
                "./specialists/./deep/ledger.yaml",
            ],
        ),
    );
    p.write(
        "specialists/payment.yaml",
        &agent_yaml("payment", Some("OPENAI_API_KEY"), &["./deep/ledger.yaml"]),
    );
    p.write(
        "specialists/deep/ledger.yaml",
        &agent_yaml("ledger", None, &[]),
    );
    p.write("extra.yaml", &agent_yaml("extra", None, &[]));
    let locked = lock_bundle(p.path("bundle.yaml")).unwrap();
    let members = sent(&locked.bundle);
    Parts {
        manifest: locked.bundle.header().to_json(),
        members,
        lock: std::fs::read(&locked.lock_path).unwrap(),
        extra: load_agent(p.path("extra.yaml"))
            .unwrap()
            .agent
            .snapshot_json(),
        externals: HashMap::new(),
    }
}

/// `(namespace, name, version, child_name, agent_version_id)` of member `i`'s delegation
/// targets, in binding order.
fn pins(verified: &VerifiedBundle, i: usize) -> Vec<(String, String, String, String, String)> {
    verified.members[i]
        .agent
        .as_ref()
        .unwrap()
        .spec
        .tools
        .iter()
        .filter_map(|t| t.agent.as_ref())
        .map(|a| {
            (
                a.namespace.clone(),
                a.name.clone(),
                a.version.clone(),
                a.child_name.clone(),
                a.agent_version_id.clone(),
            )
        })
        .collect()
}

/// `(name, from_env, declared_by)` of the verified secret union.
fn secret_rows(verified: &VerifiedBundle) -> Vec<(&str, &str, Vec<String>)> {
    verified
        .secrets
        .iter()
        .map(|s| (s.name.as_str(), s.from_env.as_str(), s.declared_by.clone()))
        .collect()
}

/// The members `phrony bundles publish` sends for `bundle`.
fn sent(bundle: &phrony_manifest::Bundle) -> Vec<Member> {
    bundle
        .published_members()
        .unwrap()
        .into_iter()
        .map(|m| Member {
            child_name: m.child_name,
            origin: m.origin.as_str().to_owned(),
            authoring_ref: m.authoring_ref,
            manifest: m.snapshot_json,
            is_root: m.is_root,
            member_version_id: String::new(),
        })
        .collect()
}

impl Parts {
    fn received(&self) -> Vec<ReceivedMember<'_>> {
        self.members
            .iter()
            .map(|m| ReceivedMember {
                child_name: &m.child_name,
                origin: &m.origin,
                authoring_ref: &m.authoring_ref,
                resolved_manifest: &m.manifest,
                is_root: m.is_root,
                member_version_id: &m.member_version_id,
            })
            .collect()
    }

    fn verify(&self) -> Result<VerifiedBundle, PublicationError> {
        verify_publication(
            &self.manifest,
            &self.received(),
            &self.lock,
            &self.externals,
            &mut |child: &str| format!("ver-{child}"),
        )
    }

    /// Verifies (it must pass); also returns the child names `version_id_for` was asked for.
    fn verify_recording_ids(&self) -> (VerifiedBundle, Vec<String>) {
        let mut calls = Vec::new();
        let verified = verify_publication(
            &self.manifest,
            &self.received(),
            &self.lock,
            &self.externals,
            &mut |child: &str| {
                calls.push(child.to_owned());
                format!("ver-{child}")
            },
        )
        .unwrap();
        (verified, calls)
    }

    fn problems(&self) -> Vec<String> {
        match self.verify() {
            Ok(_) => Vec::new(),
            Err(e) => e.problems,
        }
    }

    /// A lock that matches the members as they are now (so a test sees only its own rule).
    fn relock(&mut self) {
        let members = self
            .members
            .iter()
            .map(|m| LockMember {
                child_name: m.child_name.clone(),
                origin: MemberOrigin::Vendored,
                content_hash: CompiledAgent::from_snapshot_json(&m.manifest)
                    .unwrap()
                    .content_hash(),
                reference: m.authoring_ref.clone(),
                namespace: String::new(),
                name: String::new(),
                version: String::new(),
            })
            .collect();
        let root = self.members[0].child_name.clone();
        self.lock = BundleLock::new(root, members).to_file_bytes();
    }

    /// Edits member `i`'s snapshot, keeping it canonical.
    fn edit(&mut self, i: usize, f: impl FnOnce(&mut CompiledAgent)) {
        let mut agent = CompiledAgent::from_snapshot_json(&self.members[i].manifest).unwrap();
        f(&mut agent);
        self.members[i].manifest = agent.snapshot_json();
    }

    /// Edits the Bundle document, keeping it canonical.
    fn edit_header(&mut self, f: impl FnOnce(&mut phrony_manifest::BundleHeader)) {
        let mut header = serde_json::from_slice(&self.manifest).unwrap();
        f(&mut header);
        self.manifest = header.to_json();
    }
}

/// The problems of the valid parts after `mutate`.
fn rejected(mutate: impl FnOnce(&mut Parts)) -> Vec<String> {
    let mut parts = valid();
    mutate(&mut parts);
    parts.problems()
}

/// Asserts that exactly `want` is reported.
fn assert_only(got: Vec<String>, want: &str) {
    assert_eq!(got, [want.to_owned()]);
}

#[test]
fn a_valid_bundle_verifies_with_every_delegation_pinned() {
    let parts = valid();
    let (verified, calls) = parts.verify_recording_ids();
    assert_eq!(calls, ["desk", "payment", "ledger"], "once per member");
    assert_eq!(verified.manifest_json.as_bytes(), parts.manifest.as_slice());
    assert_eq!(verified.lock_json.as_bytes(), parts.lock.as_slice());
    assert_eq!(verified.lock, BundleLock::parse(&parts.lock).unwrap());
    assert_eq!(verified.header.metadata.name, "desk");

    let summary: Vec<(&str, &str, bool, &str)> = verified
        .members
        .iter()
        .map(|m| {
            (
                m.child_name.as_str(),
                m.reference.as_str(),
                m.is_root,
                m.version_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("desk", "./root.yaml", true, "ver-desk"),
            ("payment", "specialists/payment.yaml", false, "ver-payment"),
            (
                "ledger",
                "./specialists/deep/ledger.yaml",
                false,
                "ver-ledger"
            ),
        ]
    );

    let pins = |i: usize| pins(&verified, i);
    let pin = |child: &str| {
        (
            "demo".to_owned(),
            child.to_owned(),
            String::new(),
            child.to_owned(),
            format!("ver-{child}"),
        )
    };
    assert_eq!(pins(0), [pin("payment"), pin("ledger")]);
    assert_eq!(pins(1), [pin("ledger")]);
    assert!(pins(2).is_empty());

    for (m, sent) in verified.members.iter().zip(&parts.members) {
        let agent = m.agent.as_ref().unwrap();
        agent.validate().unwrap();
        assert_eq!(m.origin, MemberOrigin::Vendored);
        assert_eq!(m.snapshot_json.as_bytes(), agent.snapshot_json().as_slice());
        assert_eq!(m.content_hash, agent.content_hash());
        let unpinned = CompiledAgent::from_snapshot_json(&sent.manifest).unwrap();
        assert_eq!(m.lock_content_hash, unpinned.content_hash());
        if m.child_name == "ledger" {
            assert_eq!(m.content_hash, m.lock_content_hash, "nothing to pin");
        } else {
            assert_ne!(
                m.content_hash, m.lock_content_hash,
                "pinning changes the hash"
            );
        }
    }

    let secrets = secret_rows(&verified);
    assert_eq!(
        secrets,
        [(
            "openai",
            "OPENAI_API_KEY",
            vec!["desk".to_owned(), "payment".to_owned()]
        )]
    );
}

#[test]
fn missing_parts_are_all_reported() {
    let err = verify_publication(b"", &[], b"", &HashMap::new(), &mut |c: &str| c.to_owned())
        .unwrap_err();
    assert_eq!(
        err.problems,
        [
            "bundle_manifest is required",
            "members is required",
            "committed_lock is required; run phrony bundles lock"
        ]
    );
    assert_eq!(
        err.to_string(),
        "(3 problems):\n  bundle_manifest is required\n  members is required\n  committed_lock \
         is required; run phrony bundles lock"
    );
}

#[test]
fn at_most_64_members() {
    let got = rejected(|p| {
        let m = p.members[2].clone();
        p.members.extend(std::iter::repeat_n(m, 63));
    });
    assert_only(got, "members: at most 64 members, got 66");
}

#[test]
fn the_bundle_manifest_must_parse_and_be_canonical() {
    let got = rejected(|p| p.manifest = b"{\"kind\":".to_vec());
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("bundle_manifest: EOF while parsing"),
        "{got:?}"
    );

    let got = rejected(|p| {
        let text = String::from_utf8(p.manifest.clone()).unwrap();
        p.manifest = text.replacen('{', "{\"extra\":1,", 1).into_bytes();
    });
    assert!(
        got[0].starts_with("bundle_manifest: unknown field `extra`"),
        "{got:?}"
    );

    let got = rejected(|p| {
        let text = String::from_utf8(p.manifest.clone()).unwrap();
        p.manifest = text.replacen("\"kind\":", "\"kind\": ", 1).into_bytes();
    });
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("bundle_manifest is not in canonical form (first difference at byte 37: received \" \\\"Bundle\\\""),
        "{got:?}"
    );
}

#[test]
fn the_bundle_document_is_validated() {
    let got = rejected(|p| {
        p.edit_header(|h| {
            h.api_version = "phrony.com/v2".into();
            h.kind = "Agent".into();
            h.metadata.version = "one".into();
            h.metadata.namespace = "de mo".into();
            h.metadata.name = String::new();
        });
    });
    assert_eq!(
        got,
        [
            "apiVersion: must be phrony.com/v1",
            "kind: must be Bundle",
            "metadata.name: is required",
            "metadata.version: must be valid semver",
            "metadata.namespace: must not contain whitespace (U+0020 at byte 2)",
        ]
    );
    for (root, want) in [
        ("", "spec.root: is required"),
        ("/abs/root.yaml", "spec.root: must be bundle-relative"),
        ("../root.yaml", "spec.root: must resolve inside bundle root"),
    ] {
        let got = rejected(|p| p.edit_header(|h| h.spec.root = root.into()));
        assert!(got.contains(&want.to_owned()), "{root}: {got:?}");
    }
}

#[test]
fn exactly_one_root_and_it_comes_first() {
    assert_only(
        rejected(|p| p.members[0].is_root = false),
        "members must include exactly one is_root member (got 0)",
    );
    assert_only(
        rejected(|p| p.members[2].is_root = true),
        "members must include exactly one is_root member (got 2)",
    );
    let got = rejected(|p| {
        p.members[0].is_root = false;
        p.members[1].is_root = true;
    });
    assert_only(
        got,
        "members[1] is the root member; the root must be members[0]",
    );
    let got = rejected(|p| p.edit_header(|h| h.spec.root = "root.yaml".into()));
    assert_only(
        got,
        "root member \"desk\" authoring_ref \"./root.yaml\" does not match spec.root \"root.yaml\"",
    );
}

#[test]
fn child_names_are_unique() {
    let got = rejected(|p| {
        let mut dup = p.members[2].clone();
        dup.authoring_ref = "./specialists/deep/ledger2.yaml".into();
        p.members.push(dup);
        p.relock();
    });
    assert_only(got, "duplicate members[3].child_name \"ledger\"");
}

#[test]
fn origins_are_vendored_or_external_and_a_path_is_not_an_external_ref() {
    let got = rejected(|p| p.members[2].origin = "copied".into());
    assert!(
        got.contains(&"members[2].origin must be vendored or external".to_owned()),
        "{got:?}"
    );
    let got = rejected(|p| {
        p.members[2].origin = "external".into();
        p.members[2].manifest.clear();
    });
    assert!(
        got.contains(
            &"external member \"ledger\" (members[2]): authoring_ref \
              \"./specialists/deep/ledger.yaml\" must be namespace.name@version"
                .to_owned()
        ),
        "{got:?}"
    );
}

#[test]
fn vendored_snapshots_are_required_canonical_and_named_by_child_name() {
    let got = rejected(|p| p.members[1].manifest.clear());
    assert!(
        got.contains(
            &"vendored member resolved_manifest is required (members[1] \"payment\")".to_owned()
        ),
        "{got:?}"
    );

    let got = rejected(|p| p.members[1].manifest = b"not json".to_vec());
    assert!(
        got.iter().any(|g| g
            .starts_with("vendored member \"payment\": invalid compiled snapshot: expected ident")),
        "{got:?}"
    );

    let got = rejected(|p| {
        let text = String::from_utf8(p.members[1].manifest.clone()).unwrap();
        p.members[1].manifest = format!("{text}\n").into_bytes();
    });
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with(
            "vendored member \"payment\": snapshot is not in canonical form, so it was not \
             produced by the phrony compiler (first difference at byte"
        ) && got[0].contains("received \"\\n\", canonical \"\""),
        "{got:?}"
    );

    let got = rejected(|p| {
        p.edit(2, |a| a.metadata.name = "books".into());
        p.relock();
    });
    assert_only(
        got,
        "vendored member \"ledger\" metadata.name \"books\" does not match child_name",
    );
}

#[test]
fn the_committed_lock_must_parse_and_hash_to_its_version() {
    let got = rejected(|p| p.lock = b"\x00\xff garbage".to_vec());
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with("committed_lock: expected value"),
        "{got:?}"
    );

    let got = rejected(|p| {
        let mut lock = BundleLock::parse(&p.lock).unwrap();
        lock.version = format!("sha256:{}", "0".repeat(64));
        p.lock = lock.to_file_bytes();
    });
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with(&format!(
            "committed_lock: lockfile version \"sha256:{}\" does not match body hash \"sha256:",
            "0".repeat(64)
        )),
        "{got:?}"
    );

    let got = rejected(|p| {
        let mut lock = BundleLock::parse(&p.lock).unwrap();
        lock.version.clear();
        p.lock = lock.to_file_bytes();
    });
    assert_only(got, "committed_lock: lockfile version is required");
}

#[test]
fn drift_between_the_lock_and_the_members_is_refused() {
    let got = rejected(|p| p.edit(1, |a| a.spec.purpose = "Pay invoices.".into()));
    assert_only(
        got,
        "committed_lock drift: members[1] content_hash drift: lock is out of date; run phrony \
         bundles lock",
    );

    let got = rejected(|p| {
        let mut lock = BundleLock::parse(&p.lock).unwrap();
        lock.root_child_name = "other".into();
        lock.members[2].reference = "./ledger.yaml".into();
        lock.members.swap(0, 1);
        p.lock = BundleLock::new(lock.root_child_name, lock.members).to_file_bytes();
    });
    assert_eq!(
        got,
        [
            "committed_lock drift: root_child_name drift; run phrony bundles lock",
            "committed_lock drift: members[0] child_name drift; run phrony bundles lock",
            "committed_lock drift: members[1] child_name drift; run phrony bundles lock",
            "committed_lock drift: members[2] ref drift; run phrony bundles lock",
        ]
    );

    let got = rejected(|p| {
        let mut lock = BundleLock::parse(&p.lock).unwrap();
        lock.members.pop();
        p.lock = BundleLock::new(lock.root_child_name, lock.members).to_file_bytes();
    });
    assert_only(
        got,
        "committed_lock drift: member count drift (lock has 2, members has 3); run phrony \
         bundles lock",
    );
}

#[test]
fn local_delegations_must_name_members() {
    let got = rejected(|p| {
        p.edit(1, |a| {
            a.spec.tools[0].reference = "./deep/nowhere.yaml".into()
        });
        p.relock();
    });
    // The ledger is still reached through the root's direct edge; the unpinned binding is not
    // reported a second time by validation.
    assert_only(
        got,
        "vendored member \"payment\": delegation ref \"./deep/nowhere.yaml\" is not a member \
         of the bundle",
    );

    // Member directories matter: from the root, `./deep/ledger.yaml` is not the ledger.
    let got = rejected(|p| {
        p.edit(0, |a| {
            a.spec.tools[1].reference = "./deep/ledger.yaml".into()
        });
        p.relock();
    });
    assert!(
        got.contains(
            &"vendored member \"desk\": delegation ref \"./deep/ledger.yaml\" is not a member of \
              the bundle"
                .to_owned()
        ),
        "{got:?}"
    );
}

#[test]
fn external_delegations_must_name_members() {
    let got = rejected(|p| {
        p.edit(2, |a| {
            let mut t = p_binding();
            t.reference = "demo.published".into();
            if let Some(target) = &mut t.agent {
                target.namespace = "demo".into();
                target.name = "published".into();
                target.version = "1.2.0".into();
                target.child_name = "published".into();
            }
            a.spec.tools.push(t);
        });
        p.relock();
    });
    assert_only(
        got,
        "vendored member \"ledger\": delegation ref \"demo.published@1.2.0\" is not a member of \
         the bundle",
    );
}

/// A delegation binding as the compiler writes one for a local ref.
fn p_binding() -> phrony_manifest::ToolBinding {
    let parts = valid();
    let agent = CompiledAgent::from_snapshot_json(&parts.members[1].manifest).unwrap();
    agent.spec.tools[0].clone()
}

#[test]
fn every_member_is_reachable_in_walk_order_without_cycles() {
    let got = rejected(|p| {
        p.members.push(Member {
            child_name: "extra".into(),
            origin: "vendored".into(),
            authoring_ref: "./extra.yaml".into(),
            manifest: p.extra.clone(),
            is_root: false,
            member_version_id: String::new(),
        });
        p.relock();
    });
    assert_only(got, "member \"extra\" is not reachable from the root");

    let got = rejected(|p| {
        p.members.swap(1, 2);
        p.relock();
    });
    assert_only(
        got,
        "members are not in closure walk order (root first, then depth first in delegation \
         order): expected \"desk\", \"payment\", \"ledger\"",
    );

    let got = rejected(|p| {
        p.edit(2, |a| {
            let mut t = p_binding();
            t.reference = "../../root.yaml".into();
            a.spec.tools.push(t);
        });
        p.relock();
    });
    assert!(
        got.iter().any(|g| g.starts_with(
            "vendored member \"ledger\": spec.tools[0].ref: must resolve inside bundle root"
        )),
        "{got:?}"
    );

    let got = rejected(|p| {
        p.edit(0, |a| {
            let mut t = p_binding();
            t.reference = "./root.yaml".into();
            t.wire_name = "again".into();
            a.spec.tools.push(t);
        });
        p.relock();
    });
    assert_only(got, "bundle closure cycle detected: desk -> desk");
}

#[test]
fn pinned_members_are_validated_and_secrets_must_agree() {
    let got = rejected(|p| {
        p.edit(2, |a| a.spec.purpose = String::new());
        p.relock();
    });
    assert_only(got, "member \"ledger\": spec.purpose: is required");

    let got = rejected(|p| {
        p.edit(1, |a| {
            if let Some(s) = a.secrets.get_mut("openai") {
                s.from_env = "OPENAI_API_KEY_DEV".into();
            }
        });
        p.relock();
    });
    assert_only(
        got,
        "secret \"openai\": member \"desk\" uses OPENAI_API_KEY, member \"payment\" uses \
         OPENAI_API_KEY_DEV",
    );
}

#[test]
fn several_problems_are_reported_together() {
    let parts = {
        let mut p = valid();
        p.edit_header(|h| h.metadata.version = "x".into());
        p.members[2].origin = "copied".into();
        p.members[1].child_name = "desk".into();
        p
    };
    let err = parts.verify().unwrap_err();
    assert_eq!(
        err.problems,
        [
            "metadata.version: must be valid semver",
            "vendored member \"desk\" metadata.name \"payment\" does not match child_name",
            "members[2].origin must be vendored or external",
            "duplicate members[1].child_name \"desk\"",
        ]
    );
    let text = err.to_string();
    assert!(
        text.starts_with("(4 problems):\n  metadata.version"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 5);
}

#[test]
fn garbage_never_panics() {
    let parts = valid();
    let garbage: [&[u8]; 8] = [
        b"\x00",
        b"\xff\xfe\xfd",
        b"null",
        b"[]",
        b"{}",
        b"\"x\"",
        b"{\"version\":1}",
        &[b'['; 4096],
    ];
    let noop = &mut |c: &str| c.to_owned();
    let none = &HashMap::new();
    for g in garbage {
        let member = ReceivedMember {
            child_name: "\u{0}x",
            origin: "vendored",
            authoring_ref: "\\..\\x",
            resolved_manifest: g,
            is_root: true,
            member_version_id: "",
        };
        let err = verify_publication(g, &[member], g, none, noop).unwrap_err();
        assert!(!err.problems.is_empty());
    }
    // Every prefix of the valid parts is refused or accepted, never a panic.
    let received = parts.received();
    for cut in (0..parts.manifest.len()).step_by(7) {
        let _ = verify_publication(&parts.manifest[..cut], &received, &parts.lock, none, noop);
    }
    for cut in (0..parts.lock.len()).step_by(11) {
        let _ = verify_publication(&parts.manifest, &received, &parts.lock[..cut], none, noop);
    }
    for cut in (0..parts.members[1].manifest.len()).step_by(13) {
        let mut members = received.clone();
        members[1].resolved_manifest = &parts.members[1].manifest[..cut];
        assert!(verify_publication(&parts.manifest, &members, &parts.lock, none, noop).is_err());
    }
    // Long strings are cut in messages.
    let long = "n".repeat(10_000);
    let mut members = received.clone();
    members[2].child_name = &long;
    let err = verify_publication(&parts.manifest, &members, &parts.lock, none, noop).unwrap_err();
    assert!(err.problems.iter().all(|p| p.len() < 1_000), "{err}");
}

#[test]
fn authoring_refs_are_bundle_relative_and_local_targets_carry_no_version() {
    let got = rejected(|p| {
        p.members[2].authoring_ref = "/abs/ledger.yaml".into();
        p.relock();
    });
    assert_eq!(
        got[0], "vendored member \"ledger\" authoring_ref must be bundle-relative",
        "{got:?}"
    );
    // No member is at the path the delegations name any more.
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[1].ends_with("is not a member of the bundle"), "{got:?}");

    let got = rejected(|p| {
        p.members[2].authoring_ref = "./specialists/../specialists/deep/ledger.yaml".into();
        p.relock();
    });
    assert!(got.is_empty(), "refs are compared normalised: {got:?}");

    let got = rejected(|p| {
        p.edit(1, |a| {
            if let Some(t) = &mut a.spec.tools[0].agent {
                t.version = "1.0.0".into();
            }
        });
        p.relock();
    });
    assert_only(
        got,
        "vendored member \"payment\": spec.tools[0].agent.version must be empty for a local \
         delegation (bundle publish pins it by agent_version_id)",
    );
}

#[test]
fn two_members_cannot_share_a_file() {
    let got = rejected(|p| {
        p.members[2].authoring_ref = "specialists/payment.yaml".into();
        p.relock();
    });
    assert!(
        got.contains(
            &"members[2].authoring_ref \"specialists/payment.yaml\" names the same file as \
              members[1]"
                .to_owned()
        ),
        "{got:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// External members (`namespace.name@version`, a published catalog version).

const REFUNDER: &str = "ops.refunder@1.2.0";
const REFUNDER_HASH: &str = "f00dfeed";

fn refunder_found() -> Result<ResolvedExternal, String> {
    Ok(ResolvedExternal {
        version_id: "pub-refunder".to_owned(),
        content_hash: REFUNDER_HASH.to_owned(),
        agent: None,
    })
}

/// root (`desk`) → `./payment.yaml` → `ops.refunder@1.2.0`, and the root delegates to the
/// external agent too. Locked with a resolver that knows its content hash.
fn with_external() -> Parts {
    with_external_and_secret(None)
}

/// [`with_external`], the root declaring the secret `openai` from `secret_env`.
fn with_external_and_secret(secret_env: Option<&str>) -> Parts {
    let p = Project::new();
    p.write("bundle.yaml", BUNDLE);
    p.write(
        "root.yaml",
        &agent_yaml("desk", secret_env, &["./payment.yaml", REFUNDER]),
    );
    p.write("payment.yaml", &agent_yaml("payment", None, &[REFUNDER]));
    let bundle = load_bundle(p.path("bundle.yaml")).unwrap();
    assert!(bundle.has_external_members());
    let refused = bundle.compute_lock().unwrap_err();
    assert!(
        refused.contains("bundle has external member \"refunder\" (ops.refunder@1.2.0)")
            && refused.contains("run phrony bundles lock with a reachable runtime"),
        "{refused}"
    );
    let mut asked = Vec::new();
    let locked = lock_loaded_bundle(bundle, &mut |ns, name, version| {
        asked.push(format!("{ns}.{name}@{version}"));
        Ok(REFUNDER_HASH.to_owned())
    })
    .unwrap();
    assert_eq!(asked, [REFUNDER], "once per external member");
    let external = &locked.lock.members[2];
    assert_eq!(
        (
            external.child_name.as_str(),
            external.origin,
            external.content_hash.as_str(),
            external.reference.as_str(),
            external.namespace.as_str(),
            external.name.as_str(),
            external.version.as_str(),
        ),
        (
            "refunder",
            MemberOrigin::External,
            REFUNDER_HASH,
            REFUNDER,
            "ops",
            "refunder",
            "1.2.0"
        )
    );
    let members = sent(&locked.bundle);
    Parts {
        manifest: locked.bundle.header().to_json(),
        members,
        lock: std::fs::read(&locked.lock_path).unwrap(),
        extra: Vec::new(),
        externals: HashMap::from([("refunder".to_owned(), refunder_found())]),
    }
}

#[test]
fn an_external_member_is_published_and_delegations_to_it_are_pinned() {
    let parts = with_external();
    let sent = &parts.members[2];
    assert_eq!(
        (
            sent.origin.as_str(),
            sent.authoring_ref.as_str(),
            sent.is_root
        ),
        ("external", REFUNDER, false)
    );
    assert!(
        sent.manifest.is_empty(),
        "an external member has no snapshot"
    );

    let (verified, calls) = parts.verify_recording_ids();
    assert_eq!(
        calls,
        ["desk", "payment"],
        "only vendored members get new ids"
    );
    assert_eq!(verified.lock, BundleLock::parse(&parts.lock).unwrap());

    let external = &verified.members[2];
    assert_eq!(external.origin, MemberOrigin::External);
    assert_eq!(
        (
            external.child_name.as_str(),
            external.namespace.as_str(),
            external.name.as_str(),
            external.version.as_str(),
            external.version_id.as_str(),
            external.content_hash.as_str(),
            external.lock_content_hash.as_str(),
            external.reference.as_str(),
        ),
        (
            "refunder",
            "ops",
            "refunder",
            "1.2.0",
            "pub-refunder",
            REFUNDER_HASH,
            REFUNDER_HASH,
            REFUNDER
        )
    );
    assert!(external.agent.is_none() && external.snapshot_json.is_empty());

    let pins = |i: usize| pins(&verified, i);
    let to_refunder = (
        "ops".to_owned(),
        "refunder".to_owned(),
        "1.2.0".to_owned(),
        "refunder".to_owned(),
        "pub-refunder".to_owned(),
    );
    let to_payment = (
        "demo".to_owned(),
        "payment".to_owned(),
        String::new(),
        "payment".to_owned(),
        "ver-payment".to_owned(),
    );
    assert_eq!(pins(0), [to_payment, to_refunder.clone()]);
    assert_eq!(pins(1), [to_refunder]);
    for m in &verified.members[..2] {
        m.agent.as_ref().unwrap().validate().unwrap();
    }
}

#[test]
fn an_external_content_hash_that_differs_from_the_lock_is_drift() {
    let mut parts = with_external();
    parts.externals.insert(
        "refunder".to_owned(),
        Ok(ResolvedExternal {
            version_id: "pub-refunder".to_owned(),
            content_hash: "beef".to_owned(),
            agent: None,
        }),
    );
    assert_only(
        parts.problems(),
        "committed_lock drift: members[2] content_hash drift: the lock records \"f00dfeed\" for \
         external member \"ops.refunder@1.2.0\", but this runtime's published version has \
         \"beef\" (published versions are immutable, so the lock was made against another \
         runtime); run phrony bundles lock",
    );
}

#[test]
fn an_external_member_the_runtime_did_not_resolve_is_refused_by_name() {
    let mut parts = with_external();
    parts.externals.insert(
        "refunder".to_owned(),
        Err("agent ops/refunder version \"1.2.0\" is retired".to_owned()),
    );
    assert_only(
        parts.problems(),
        "external member \"refunder\" (members[2]): \"ops.refunder@1.2.0\" cannot be used: agent \
         ops/refunder version \"1.2.0\" is retired",
    );
    parts.externals.clear();
    assert_only(
        parts.problems(),
        "external member \"refunder\" (members[2]): \"ops.refunder@1.2.0\" was not resolved by \
         the runtime",
    );
}

#[test]
fn an_external_member_is_never_the_root_and_names_a_pinned_version() {
    let mut parts = with_external();
    parts.members[2].member_version_id = "someone-else".into();
    assert_only(
        parts.problems(),
        "external member \"refunder\" (members[2]): member_version_id \"someone-else\" is not \
         the published version \"pub-refunder\" of \"ops.refunder@1.2.0\"",
    );

    let mut parts = with_external();
    parts.members[2].authoring_ref = "ops.refunder".into();
    let got = parts.problems();
    assert!(
        got.contains(
            &"external member \"refunder\" (members[2]): authoring_ref \"ops.refunder\" must be \
              namespace.name@version"
                .to_owned()
        ),
        "{got:?}"
    );

    let mut parts = with_external();
    parts.members[2].child_name = "other".into();
    parts.externals.insert("other".to_owned(), refunder_found());
    let got = parts.problems();
    assert!(
        got.contains(
            &"external member \"other\" (members[2]): child_name must be the external name \
              \"refunder\""
                .to_owned()
        ),
        "{got:?}"
    );

    let mut parts = with_external();
    parts.members.swap(0, 2);
    parts.members[0].is_root = true;
    parts.members[2].is_root = false;
    let got = parts.problems();
    assert!(
        got.contains(
            &"external member \"refunder\" (members[0]) cannot be the root: the root must be a \
              vendored member"
                .to_owned()
        ),
        "{got:?}"
    );
}

#[test]
fn external_garbage_never_panics() {
    let parts = with_external();
    let received = parts.received();
    let externals = HashMap::from([
        ("refunder".to_owned(), refunder_found()),
        ("\u{0}".to_owned(), Err("x".repeat(5_000))),
    ]);
    let noop = &mut |c: &str| c.to_owned();
    for r in [
        "",
        "@",
        ".@1",
        "a.b@",
        "a.b@x",
        "\u{0}.\u{0}@1.0.0",
        "./x.yaml",
        "a.b@1.0.0",
    ] {
        for child in ["refunder", "\u{0}", ""] {
            let mut members = received.clone();
            members[2].authoring_ref = r;
            members[2].child_name = child;
            members[2].resolved_manifest = b"{}";
            let err = verify_publication(&parts.manifest, &members, &parts.lock, &externals, noop)
                .unwrap_err();
            assert!(!err.problems.is_empty());
        }
    }
    for cut in (0..parts.lock.len()).step_by(11) {
        let _ = verify_publication(
            &parts.manifest,
            &received,
            &parts.lock[..cut],
            &externals,
            noop,
        );
    }
}

#[test]
fn an_external_members_secrets_join_the_union_and_a_conflict_is_refused() {
    let published = |env: &str| {
        let p = Project::new();
        p.write("refunder.yaml", &agent_yaml("refunder", Some(env), &[]));
        load_agent(p.path("refunder.yaml")).unwrap().agent
    };
    let mut parts = with_external_and_secret(Some("OPENAI_API_KEY"));
    parts.externals.insert(
        "refunder".to_owned(),
        Ok(ResolvedExternal {
            agent: Some(published("OPENAI_API_KEY")),
            ..refunder_found().unwrap()
        }),
    );
    let verified = parts.verify().unwrap();
    let secrets = secret_rows(&verified);
    assert_eq!(
        secrets,
        [(
            "openai",
            "OPENAI_API_KEY",
            vec!["desk".to_owned(), "refunder".to_owned()]
        )]
    );

    parts.externals.insert(
        "refunder".to_owned(),
        Ok(ResolvedExternal {
            agent: Some(published("REFUNDER_OPENAI_KEY")),
            ..refunder_found().unwrap()
        }),
    );
    let got = parts.problems();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("openai")
            && got[0].contains("refunder")
            && got[0].contains("REFUNDER_OPENAI_KEY"),
        "{got:?}"
    );
}
