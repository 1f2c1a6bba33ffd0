//! Bundles (§1.5, §1.6, §6.5, §6.6): the closure walk from `spec.root`, `bundle.lock.json`
//! computation and drift checks, and the secret union.
//!
//! Only local (vendored) members are compiled here. External members (`namespace.name@version`,
//! a published catalog version) are recorded and not walked; their content hash lives in a
//! runtime, so [`Bundle::compute_lock_with`] takes a resolver (`phrony bundles lock` asks the
//! daemon) and [`Bundle::compute_lock`], which has none, refuses them.
//!
//! Lock `ref`s: the root member's ref is `spec.root` as written. A delegation declared by a member
//! that lives in the bundle directory keeps its ref as written (`./specialists/payment.yaml`);
//! deeper members are written as `./<path relative to the bundle directory>` so that refs stay
//! unique.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::canonical;
use crate::diag::{Diagnostic, Diagnostics};
use crate::doc::{UnknownKeys, load_source, parse_typed, probe_kind};
use crate::load::load_agent_with;
use crate::model::bundle::{BundleDoc, LockBody, LockMember, MemberOrigin};
use crate::model::common::blank;
use crate::model::compiled::CompiledAgent;
use crate::refs::{DelegationRef, parse_delegation_ref};
use crate::resolve::{RefError, safe_relative};
use crate::secrets::{BundleSecret, secret_union};
use crate::validate::{agent_identity, envelope, metadata};

/// File name of the lock, beside the bundle YAML.
pub const LOCK_FILE: &str = "bundle.lock.json";

/// A loaded bundle: its identity and its compiled closure.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The bundle YAML.
    pub path: PathBuf,
    /// Bundle namespace.
    pub namespace: String,
    /// Bundle name.
    pub name: String,
    /// Bundle version (semver).
    pub version: String,
    /// `metadata.labels`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `spec.root` as written (trimmed).
    pub root_ref: String,
    /// Members in DFS walk order, root first.
    pub members: Vec<BundleMember>,
    /// Warnings of every member.
    pub warnings: Vec<Diagnostic>,
}

/// One member of a bundle closure.
#[derive(Debug, Clone)]
pub struct BundleMember {
    /// The member's `metadata.name` (external members: the external name).
    pub child_name: String,
    /// Vendored or external.
    pub origin: MemberOrigin,
    /// The ref as recorded in the lock.
    pub reference: String,
    /// Vendored members: the YAML file and the compiled agent.
    pub vendored: Option<(PathBuf, CompiledAgent)>,
    /// External members: `(namespace, name, version)`; the version is pinned.
    pub external: Option<(String, String, String)>,
}

/// A `bundle.lock.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleLock {
    /// `sha256:<hex>` of the body `{"root_child_name":…,"members":[…]}`.
    pub version: String,
    /// The root member's child name.
    pub root_child_name: String,
    /// Members in walk order, root first.
    pub members: Vec<LockMember>,
}

impl BundleLock {
    /// Builds a lock, computing its hash.
    pub fn new(root_child_name: String, members: Vec<LockMember>) -> Self {
        let version = Self::body_hash(&root_child_name, &members);
        Self {
            version,
            root_child_name,
            members,
        }
    }

    /// `sha256:` + hex sha256 of the canonical body.
    pub fn body_hash(root_child_name: &str, members: &[LockMember]) -> String {
        let body = canonical::to_vec(&LockBody {
            root_child_name,
            members,
        })
        .expect("serializing a lock body to memory cannot fail");
        format!("sha256:{}", canonical::sha256_hex(&body))
    }

    /// The file bytes: compact canonical JSON, no trailing newline.
    pub fn to_file_bytes(&self) -> Vec<u8> {
        canonical::to_vec(self).expect("serializing a lock to memory cannot fail")
    }

    /// Reads a lock file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

impl Bundle {
    /// The root member.
    pub fn root(&self) -> Option<&BundleMember> {
        self.members.first()
    }

    /// The union of members' secrets; conflicts are errors.
    pub fn secrets(&self) -> Result<Vec<BundleSecret>, Vec<String>> {
        secret_union(
            self.members
                .iter()
                .filter_map(|m| m.vendored.as_ref().map(|(_, a)| (m.child_name.as_str(), a))),
        )
    }

    /// The lock of this closure, without a runtime. Fails when a member is external (its
    /// content hash is known only to a runtime): use [`Bundle::compute_lock_with`], as
    /// `phrony bundles lock` does with a reachable runtime.
    pub fn compute_lock(&self) -> Result<BundleLock, String> {
        self.compute_lock_with(&mut |_, _, _| {
            Err(
                "resolving its content_hash needs a runtime; run phrony bundles lock with a \
                 reachable runtime (--runtime-addr)"
                    .to_owned(),
            )
        })
        .map_err(|problems| problems.join("; "))
    }

    /// The lock of this closure; `resolve(namespace, name, version)` gives the content hash
    /// of an external member's published version (or why it cannot). It is called once per
    /// external member, in walk order. Every member that cannot be locked is reported.
    pub fn compute_lock_with(
        &self,
        resolve: &mut dyn FnMut(&str, &str, &str) -> Result<String, String>,
    ) -> Result<BundleLock, Vec<String>> {
        let mut members = Vec::with_capacity(self.members.len());
        let mut problems = Vec::new();
        for m in &self.members {
            match (&m.vendored, &m.external) {
                (Some((_, agent)), _) => members.push(LockMember {
                    child_name: m.child_name.clone(),
                    origin: MemberOrigin::Vendored,
                    content_hash: agent.content_hash(),
                    reference: m.reference.clone(),
                    namespace: String::new(),
                    name: String::new(),
                    version: String::new(),
                }),
                (None, Some((namespace, name, version))) => {
                    let refused = |why: &str| {
                        format!(
                            "bundle has external member {:?} ({}): {why}",
                            m.child_name, m.reference
                        )
                    };
                    if version.is_empty() {
                        problems.push(refused(
                            "an external member must pin a version (namespace.name@version)",
                        ));
                        continue;
                    }
                    match resolve(namespace, name, version) {
                        Ok(hash) if !hash.trim().is_empty() => members.push(LockMember {
                            child_name: m.child_name.clone(),
                            origin: MemberOrigin::External,
                            content_hash: hash,
                            reference: m.reference.clone(),
                            namespace: namespace.clone(),
                            name: name.clone(),
                            version: version.clone(),
                        }),
                        Ok(_) => problems.push(refused("the runtime gave an empty content_hash")),
                        Err(why) => problems.push(refused(&why)),
                    }
                }
                (None, None) => problems.push(format!(
                    "member {:?}: neither vendored nor external",
                    m.child_name
                )),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let root = self
            .members
            .first()
            .map(|m| m.child_name.clone())
            .unwrap_or_default();
        Ok(BundleLock::new(root, members))
    }

    /// True when the closure has an external member (locking it needs a runtime).
    pub fn has_external_members(&self) -> bool {
        self.members.iter().any(|m| m.external.is_some())
    }

    fn lock_path(&self) -> PathBuf {
        self.path.parent().unwrap_or(Path::new(".")).join(LOCK_FILE)
    }
}

/// Loads a bundle: validates the Bundle document and walks, validates and compiles its closure.
pub fn load_bundle(path: impl AsRef<Path>) -> Result<Bundle, Diagnostics> {
    let path = path.as_ref();
    let mut out = Vec::new();
    let bundle = walk(path, &mut out);
    crate::diag::sort_diagnostics(&mut out);
    match bundle {
        Some(mut b) if !out.iter().any(Diagnostic::is_error) => {
            b.warnings = out;
            Ok(b)
        }
        _ => {
            if !out.iter().any(Diagnostic::is_error) {
                out.push(Diagnostic::file_error(
                    path,
                    "",
                    "the bundle could not be loaded",
                ));
            }
            Err(Diagnostics::new(out))
        }
    }
}

struct Walk<'a> {
    dir: PathBuf,
    out: &'a mut Vec<Diagnostic>,
    members: Vec<BundleMember>,
    /// Normalized bundle-relative path → child name of vendored members seen.
    by_path: HashMap<PathBuf, String>,
    /// Child name → ref that produced it.
    by_child: HashMap<String, String>,
    /// The DFS stack of child names (cycle detection).
    stack: Vec<(PathBuf, String)>,
    failed: bool,
}

fn walk(path: &Path, out: &mut Vec<Diagnostic>) -> Option<Bundle> {
    let src = load_source(path, out)?;
    match probe_kind(&src).as_deref() {
        Some("Bundle") => {}
        Some("Agent") => {
            src.diags(out)
                .error("kind", "agent manifest: use phrony agents validate instead");
            return None;
        }
        _ => {}
    }
    let doc: BundleDoc = parse_typed(&src, UnknownKeys::Warn, out)?;
    let mut d = src.diags(out);
    envelope(&mut d, &doc.api_version, &doc.kind, "Bundle");
    metadata(
        &mut d,
        &doc.metadata.name,
        &doc.metadata.namespace,
        &doc.metadata.version,
        true,
    );
    agent_identity(&mut d, &doc.metadata.name, &doc.metadata.namespace);
    let root_rel = if blank(&doc.spec.root) {
        d.error("spec.root", "is required");
        None
    } else {
        match safe_relative(doc.spec.root.trim()) {
            Ok(p) => Some(p),
            Err(RefError::Absolute) => {
                d.error("spec.root", "must be bundle-relative");
                None
            }
            Err(_) => {
                d.error("spec.root", "must resolve inside bundle root");
                None
            }
        }
    };
    let errors_in_doc = d.has_errors();
    let root_rel = root_rel?;
    if errors_in_doc {
        return None;
    }
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let mut w = Walk {
        dir,
        out,
        members: Vec::new(),
        by_path: HashMap::new(),
        by_child: HashMap::new(),
        stack: Vec::new(),
        failed: false,
    };
    w.visit(
        &root_rel,
        doc.spec.root.trim().to_owned(),
        &src,
        "spec.root",
    );
    if w.failed {
        return None;
    }
    Some(Bundle {
        path: path.to_path_buf(),
        namespace: doc.metadata.namespace,
        name: doc.metadata.name,
        version: doc.metadata.version,
        labels: doc.metadata.labels,
        root_ref: doc.spec.root.trim().to_owned(),
        members: w.members,
        warnings: Vec::new(),
    })
}

impl Walk<'_> {
    /// Visits the vendored member at bundle-relative `rel`, recorded with `reference`. `from` and
    /// `at` locate the edge for messages.
    fn visit(&mut self, rel: &Path, reference: String, from: &crate::doc::Source, at: &str) {
        if let Some(pos) = self.stack.iter().position(|(p, _)| p == rel) {
            let mut cycle: Vec<&str> = self.stack[pos..].iter().map(|(_, c)| c.as_str()).collect();
            cycle.push(&self.stack[pos].1);
            from.diags(self.out).error(
                at,
                format!("bundle closure cycle detected: {}", cycle.join(" -> ")),
            );
            self.failed = true;
            return;
        }
        if self.by_path.contains_key(rel) {
            return; // a diamond: already a member
        }
        let file = self.dir.join(rel);
        if !file.is_file() {
            from.diags(self.out).error(
                at,
                format!(
                    "ref {reference:?} not found in bundle directory {}",
                    crate::resolve::absolute(&self.dir).display()
                ),
            );
            self.failed = true;
            return;
        }
        let compiled = match load_agent_with(&file, true) {
            Ok(c) => c,
            Err(diags) => {
                self.out.extend(diags);
                self.failed = true;
                return;
            }
        };
        self.out.extend(compiled.warnings);
        let agent = compiled.agent;
        let child = agent.metadata.name.clone();
        if let Some(first) = self.by_child.get(&child) {
            from.diags(self.out).error(
                at,
                format!(
                    "duplicate bundle child_name {child:?} from refs {first:?} and {reference:?}"
                ),
            );
            self.failed = true;
            return;
        }
        self.by_child.insert(child.clone(), reference.clone());
        self.by_path.insert(rel.to_path_buf(), child.clone());
        let member_dir = rel.parent().map(Path::to_path_buf).unwrap_or_default();
        self.members.push(BundleMember {
            child_name: child.clone(),
            origin: MemberOrigin::Vendored,
            reference,
            vendored: Some((file.clone(), agent.clone())),
            external: None,
        });
        self.stack.push((rel.to_path_buf(), child));

        // Edges: the compiled delegation bindings, in declaration order.
        let mut errors = Vec::new();
        let Some(member_src) = load_source(&file, &mut errors) else {
            self.stack.pop();
            return;
        };
        for (i, t) in agent.spec.tools.iter().enumerate() {
            let Some(target) = &t.agent else { continue };
            if target.late_bound {
                continue;
            }
            let at = agent_edge_path(&agent, i);
            match parse_delegation_ref(&t.reference) {
                Ok(DelegationRef::Local(p)) => {
                    let child_rel = normalize(&member_dir.join(&p));
                    let reference = if member_dir.as_os_str().is_empty() {
                        t.reference.clone()
                    } else {
                        format!("./{}", child_rel.to_string_lossy())
                    };
                    self.visit(&child_rel, reference, &member_src, &at);
                }
                Ok(DelegationRef::External {
                    namespace,
                    name,
                    version,
                }) => {
                    // The compiler keeps `namespace.name` as the binding's ref and the pinned
                    // version in its target.
                    let version = version
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| target.version.clone());
                    if self.by_child.contains_key(&name) {
                        continue;
                    }
                    self.by_child.insert(name.clone(), t.reference.clone());
                    self.members.push(BundleMember {
                        child_name: name.clone(),
                        origin: MemberOrigin::External,
                        reference: format!("{namespace}.{name}@{version}"),
                        vendored: None,
                        external: Some((namespace, name, version)),
                    });
                }
                // Invalid refs were reported when the member was validated.
                Err(_) => {}
            }
        }
        self.stack.pop();
    }
}

/// The authoring path of the `i`-th compiled binding's delegation (`spec.agents[j].ref`).
fn agent_edge_path(agent: &CompiledAgent, i: usize) -> String {
    let j = agent.spec.tools[..i]
        .iter()
        .filter(|t| t.agent.is_some())
        .count();
    format!("spec.agents[{j}].ref")
}

pub(crate) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn lock_diag(path: &Path, message: impl Into<String>) -> Diagnostic {
    Diagnostic::file_error(path, "", message)
}

fn secrets_or_diags(bundle: &Bundle) -> Result<Vec<BundleSecret>, Diagnostics> {
    bundle.secrets().map_err(|conflicts| {
        Diagnostics::new(
            conflicts
                .into_iter()
                .map(|c| lock_diag(&bundle.path, c))
                .collect(),
        )
    })
}

/// The result of [`lock_bundle`].
#[derive(Debug, Clone)]
pub struct Locked {
    /// The bundle.
    pub bundle: Bundle,
    /// The lock written.
    pub lock: BundleLock,
    /// Where it was written.
    pub lock_path: PathBuf,
}

/// Walks the closure, checks the secret union, and writes `bundle.lock.json` beside the bundle
/// (atomically; nothing is written when anything fails, including a secret conflict). A closure
/// with an external member is refused: see [`lock_loaded_bundle`].
pub fn lock_bundle(path: impl AsRef<Path>) -> Result<Locked, Diagnostics> {
    let bundle = load_bundle(path)?;
    lock_loaded_bundle(bundle, &mut |_, _, _| {
        Err(
            "resolving its content_hash needs a runtime; run phrony bundles lock with a \
             reachable runtime (--runtime-addr)"
                .to_owned(),
        )
    })
}

/// Locks a loaded bundle: checks the secret union, computes the lock with
/// [`Bundle::compute_lock_with`] (`resolve` gives external members' content hashes) and
/// writes `bundle.lock.json` beside the bundle (atomically; nothing is written when anything
/// fails).
pub fn lock_loaded_bundle(
    bundle: Bundle,
    resolve: &mut dyn FnMut(&str, &str, &str) -> Result<String, String>,
) -> Result<Locked, Diagnostics> {
    secrets_or_diags(&bundle)?;
    let lock = bundle.compute_lock_with(resolve).map_err(|problems| {
        Diagnostics::new(
            problems
                .into_iter()
                .map(|m| lock_diag(&bundle.path, m))
                .collect(),
        )
    })?;
    let lock_path = bundle.lock_path();
    write_atomically(&lock_path, &lock.to_file_bytes()).map_err(|e| {
        Diagnostics::single(lock_diag(&lock_path, format!("cannot write the lock: {e}")))
    })?;
    Ok(Locked {
        bundle,
        lock,
        lock_path,
    })
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The result of [`validate_bundle`].
#[derive(Debug, Clone)]
pub struct ValidatedBundle {
    /// The bundle.
    pub bundle: Bundle,
    /// The secret union.
    pub secrets: Vec<BundleSecret>,
    /// The committed lock, when there is one (it matched the closure).
    pub lock: Option<BundleLock>,
}

/// Walks and compiles the closure, checks the secret union, and compares the committed
/// `bundle.lock.json` (if any) with the closure. With `require_lock`, a missing lock is an error.
pub fn validate_bundle(
    path: impl AsRef<Path>,
    require_lock: bool,
) -> Result<ValidatedBundle, Diagnostics> {
    let bundle = load_bundle(path)?;
    let secrets = secrets_or_diags(&bundle)?;
    let lock_path = bundle.lock_path();
    let bytes = match std::fs::read(&lock_path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(Diagnostics::single(lock_diag(
                &lock_path,
                format!("cannot read: {e}"),
            )));
        }
    };
    let Some(bytes) = bytes else {
        if require_lock {
            return Err(Diagnostics::single(lock_diag(
                &lock_path,
                "no committed lock; run phrony bundles lock",
            )));
        }
        return Ok(ValidatedBundle {
            bundle,
            secrets,
            lock: None,
        });
    };
    let committed = BundleLock::parse(&bytes).map_err(|e| {
        Diagnostics::single(lock_diag(&lock_path, format!("invalid lock file: {e}")))
    })?;
    let problems = check_lock(&bundle, &committed);
    if !problems.is_empty() {
        return Err(Diagnostics::new(
            problems
                .into_iter()
                .map(|p| lock_diag(&lock_path, p))
                .collect(),
        ));
    }
    Ok(ValidatedBundle {
        bundle,
        secrets,
        lock: Some(committed),
    })
}

/// Every way `committed` disagrees with the closure (messages of §1.6).
pub(crate) fn check_lock(bundle: &Bundle, committed: &BundleLock) -> Vec<String> {
    let mut problems = Vec::new();
    if committed.version.is_empty() {
        problems.push("lockfile version is required".to_owned());
    } else {
        let body = BundleLock::body_hash(&committed.root_child_name, &committed.members);
        if body != committed.version {
            problems.push(format!(
                "lockfile version {:?} does not match body hash {body:?}",
                committed.version
            ));
        }
    }
    let drift = |d: String| format!("bundle.lock.json drift: {d}; run phrony bundles lock");
    let root = bundle
        .members
        .first()
        .map(|m| m.child_name.as_str())
        .unwrap_or_default();
    if committed.root_child_name != root {
        problems.push(drift("root_child_name drift".to_owned()));
    }
    if committed.members.len() != bundle.members.len() {
        problems.push(drift(format!(
            "member count drift (lock has {}, closure has {})",
            committed.members.len(),
            bundle.members.len()
        )));
        return problems;
    }
    for (i, (lock, m)) in committed.members.iter().zip(&bundle.members).enumerate() {
        if lock.child_name != m.child_name {
            problems.push(drift(format!("members[{i}] child_name drift")));
            continue;
        }
        if lock.origin != m.origin {
            problems.push(drift(format!("members[{i}] origin drift")));
            continue;
        }
        match (&m.vendored, &m.external) {
            (Some((_, agent)), _) => {
                if lock.reference != m.reference {
                    problems.push(drift(format!("members[{i}] ref drift")));
                }
                if lock.content_hash != agent.content_hash() {
                    problems.push(drift(format!(
                        "members[{i}] content_hash drift: lock is out of date"
                    )));
                }
            }
            (None, Some((namespace, name, version))) => {
                for (field, want, got) in [
                    ("namespace", namespace, &lock.namespace),
                    ("name", name, &lock.name),
                    ("version", version, &lock.version),
                ] {
                    if want != got {
                        problems.push(drift(format!("members[{i}] {field} drift")));
                    }
                }
                if lock.content_hash.is_empty() {
                    problems.push(format!(
                        "members[{i}]: missing content_hash in committed lock; re-run phrony \
                         bundles lock with --runtime-addr to resolve external members"
                    ));
                }
            }
            (None, None) => problems.push(format!("members[{i}]: unsupported origin")),
        }
    }
    problems
}
