//! What `phrony bundles publish` sends (the client side) and what the runtime accepts (the
//! server side, [`verify_publication`]).
//!
//! The wire carries three parts: the Bundle document as canonical JSON ([`BundleHeader`]), one
//! [`PublishedMember`] per closure member (vendored members carry their compiled snapshot
//! exactly as the compiler wrote it, delegation bindings still unpinned), and the committed
//! `bundle.lock.json`. External members (`namespace.name@version`) carry no snapshot: the
//! server resolves each to the published catalog version it names before verifying. The server
//! trusts none of it: it re-derives the lock from the members (external content hashes from
//! its own catalog), refuses any drift, and pins each vendored member's delegations, local ones
//! to the version ids it is about to store and external ones to the published versions, so a
//! bundle run is reproducible even when an agent of the same name is re-published later.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::bundle::{Bundle, BundleLock, normalize};
use crate::canonical;
use crate::diag::{Report, SnapshotDiags};
use crate::model::bundle::{LockMember, MemberOrigin};
use crate::model::common::blank;
use crate::model::compiled::CompiledAgent;
use crate::refs::{DelegationRef, parse_delegation_ref};
use crate::resolve::{RefError, safe_relative};
use crate::secrets::{BundleSecret, secret_union};
use crate::validate::{agent_identity, envelope, metadata};

/// The Bundle document as published (`PublishBundleRequest.bundle_manifest`): canonical JSON,
/// unknown keys refused on the way in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeader {
    /// `phrony.com/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// `Bundle`.
    pub kind: String,
    /// Identity and release label.
    pub metadata: BundleHeaderMetadata,
    /// The root agent.
    pub spec: BundleHeaderSpec,
}

/// `metadata` of a published Bundle document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeaderMetadata {
    /// Bundle name.
    pub name: String,
    /// Bundle namespace.
    pub namespace: String,
    /// Release label (semver).
    pub version: String,
    /// Labels (omitted when empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `spec` of a published Bundle document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleHeaderSpec {
    /// Bundle-relative path of the root agent, as written.
    pub root: String,
}

impl BundleHeader {
    /// The canonical JSON bytes sent as `bundle_manifest`.
    pub fn to_json(&self) -> Vec<u8> {
        canonical::to_vec(self).expect("serializing a bundle header to memory cannot fail")
    }
}

/// One member as sent by `PublishBundle` (`BundleMemberPackage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedMember {
    /// The member agent's `metadata.name`.
    pub child_name: String,
    /// Vendored or external.
    pub origin: MemberOrigin,
    /// The ref recorded in the lock (`namespace.name@version` for an external member).
    pub authoring_ref: String,
    /// The compiled snapshot (canonical JSON, delegations unpinned); empty for an external
    /// member (the runtime has its published version).
    pub snapshot_json: Vec<u8>,
    /// True for the root member (the first).
    pub is_root: bool,
}

impl Bundle {
    /// The Bundle document to publish.
    pub fn header(&self) -> BundleHeader {
        BundleHeader {
            api_version: crate::model::common::API_VERSION.to_owned(),
            kind: "Bundle".to_owned(),
            metadata: BundleHeaderMetadata {
                name: self.name.clone(),
                namespace: self.namespace.clone(),
                version: self.version.clone(),
                labels: self.labels.clone(),
            },
            spec: BundleHeaderSpec {
                root: self.root_ref.clone(),
            },
        }
    }

    /// The members to publish, root first: vendored members with their compiled snapshot,
    /// external members with their `namespace.name@version` ref and no snapshot.
    pub fn published_members(&self) -> Result<Vec<PublishedMember>, String> {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| match (&m.vendored, &m.external) {
                (Some((_, agent)), _) => Ok(PublishedMember {
                    child_name: m.child_name.clone(),
                    origin: MemberOrigin::Vendored,
                    authoring_ref: m.reference.clone(),
                    snapshot_json: agent.snapshot_json(),
                    is_root: i == 0,
                }),
                (None, Some(_)) => Ok(PublishedMember {
                    child_name: m.child_name.clone(),
                    origin: MemberOrigin::External,
                    authoring_ref: m.reference.clone(),
                    snapshot_json: Vec::new(),
                    is_root: i == 0,
                }),
                (None, None) => Err(format!(
                    "member {:?} is neither vendored nor external",
                    m.child_name
                )),
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Server side
// ---------------------------------------------------------------------------------------------

/// Most members one bundle publication may carry.
pub const MAX_BUNDLE_MEMBERS: usize = 64;
/// Largest `bundle_manifest` accepted, in bytes.
pub const MAX_BUNDLE_MANIFEST_BYTES: usize = 64 * 1024;
/// Largest `committed_lock` accepted, in bytes.
pub const MAX_BUNDLE_LOCK_BYTES: usize = 256 * 1024;
/// Largest `resolved_manifest` (compiled snapshot) of one member accepted, in bytes.
pub const MAX_MEMBER_SNAPSHOT_BYTES: usize = 16 * 1024 * 1024;
/// Most problems one [`PublicationError`] lists (the rest are counted in a last line).
const MAX_PROBLEMS: usize = 100;
/// User-supplied strings are quoted in messages up to this many characters.
const MAX_QUOTED_CHARS: usize = 96;

/// One member as received (`BundleMemberPackage`, borrowed from the protobuf message; `origin`
/// is the raw string).
#[derive(Debug, Clone, Copy)]
pub struct ReceivedMember<'a> {
    /// The member's name inside the bundle (its agent's `metadata.name`).
    pub child_name: &'a str,
    /// `vendored` or `external` (anything else is refused).
    pub origin: &'a str,
    /// The ref recorded in the lock: a bundle-relative path for vendored members,
    /// `namespace.name@version` for external ones.
    pub authoring_ref: &'a str,
    /// The compiled snapshot of a vendored member, canonical, delegations unpinned.
    pub resolved_manifest: &'a [u8],
    /// True for exactly one member, the root, which must come first.
    pub is_root: bool,
    /// For external members, the expected published version id. Vendored members get theirs
    /// from the runtime, so it is not read for them.
    pub member_version_id: &'a str,
}

/// A bundle publication that passed every check: what the runtime stores.
#[derive(Debug, Clone)]
pub struct VerifiedBundle {
    /// The Bundle document.
    pub header: BundleHeader,
    /// The Bundle document's canonical JSON (identical to what was received).
    pub manifest_json: String,
    /// The lock, recomputed from the members (equal to the committed one).
    pub lock: BundleLock,
    /// The canonical lock file text.
    pub lock_json: String,
    /// The members in lock order, root first.
    pub members: Vec<VerifiedMember>,
    /// The union of the members' secrets.
    pub secrets: Vec<BundleSecret>,
}

/// What the runtime found for an external member (`namespace.name@version`): the published
/// catalog version it names, which must exist, be published (not retired) and belong to an
/// agent that is not archived. Passed to [`verify_publication`] by child name.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedExternal {
    /// The published agent version's id.
    pub version_id: String,
    /// Its content hash.
    pub content_hash: String,
    /// Its stored snapshot, when the runtime read it: its secrets join the bundle's secret
    /// union (a bundle run resolves them for the child), so a conflict is refused here.
    pub agent: Option<CompiledAgent>,
}

/// One verified member. A vendored member has its delegations pinned; an external member is
/// the published version it names (no snapshot of its own: `agent` is `None`,
/// `snapshot_json` empty).
#[derive(Debug, Clone)]
pub struct VerifiedMember {
    /// The member's name inside the bundle.
    pub child_name: String,
    /// Vendored or external.
    pub origin: MemberOrigin,
    /// The member agent's namespace (`metadata.namespace`, or the external ref's).
    pub namespace: String,
    /// The member agent's name.
    pub name: String,
    /// The member agent's version label.
    pub version: String,
    /// The authoring ref as received (the lock's `ref`).
    pub reference: String,
    /// True for the root (the first member).
    pub is_root: bool,
    /// Content hash of the snapshot as received (delegations unpinned), as in the lock; for
    /// an external member, the published version's content hash.
    pub lock_content_hash: String,
    /// The version id the runtime stores this member under (from `version_id_for`); for an
    /// external member, the published version's id.
    pub version_id: String,
    /// The compiled agent with its delegations pinned (`None` for an external member).
    pub agent: Option<CompiledAgent>,
    /// The canonical snapshot of the pinned agent: what gets stored (empty for an external
    /// member).
    pub snapshot_json: String,
    /// [`CompiledAgent::content_hash`] of the pinned agent; for an external member, the
    /// published version's content hash.
    pub content_hash: String,
}

/// Every problem found in a bundle publication, reported at once (like a compiler). All of them
/// are `InvalidArgument` at the gRPC edge.
///
/// `Display`: the problem itself when there is one; `(N problems):` followed by one
/// `\n  <problem>` line each when there are several.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_problems(.problems))]
pub struct PublicationError {
    /// The problems, in the order they were found.
    pub problems: Vec<String>,
}

fn render_problems(problems: &[String]) -> String {
    match problems {
        [] => "bundle publication refused".to_owned(),
        [one] => one.clone(),
        many => {
            let mut out = format!("({} problems):", many.len());
            for p in many {
                out.push_str("\n  ");
                out.push_str(p);
            }
            out
        }
    }
}

/// The problems collected so far: de-duplicated and bounded.
#[derive(Debug, Default)]
struct Problems {
    list: Vec<String>,
    dropped: usize,
}

impl Problems {
    fn push(&mut self, problem: impl Into<String>) {
        let problem = problem.into();
        if self.list.contains(&problem) {
            return;
        }
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(problem);
        } else {
            self.dropped += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn into_error(self) -> PublicationError {
        let mut problems = self.list;
        if self.dropped > 0 {
            problems.push(format!("and {} more problems", self.dropped));
        }
        PublicationError { problems }
    }
}

/// `s` quoted for a message, cut to [`MAX_QUOTED_CHARS`] characters.
fn q(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}…", &s[..cut]),
    }
}

/// Where `received` first departs from `canonical`, with a short excerpt of both.
fn first_difference(received: &[u8], canonical: &[u8]) -> String {
    let at = received
        .iter()
        .zip(canonical)
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| received.len().min(canonical.len()));
    let excerpt = |bytes: &[u8]| {
        let start = at.min(bytes.len());
        let end = at.saturating_add(24).min(bytes.len());
        format!("{:?}", String::from_utf8_lossy(&bytes[start..end]))
    };
    format!(
        "first difference at byte {at}: received {}, canonical {}",
        excerpt(received),
        excerpt(canonical)
    )
}

/// One received member, as far as it could be read.
#[derive(Debug)]
struct Candidate {
    child_name: String,
    reference: String,
    /// The authoring ref as a normalised bundle-relative path, when it is one.
    path: Option<PathBuf>,
    is_root: bool,
    /// The first member with this child name (later ones are duplicates).
    unique: bool,
    /// A vendored member whose snapshot parsed; pinned in place later.
    agent: Option<CompiledAgent>,
    /// Content hash of the snapshot as received.
    unpinned_hash: String,
    /// The version id the runtime assigns (vendored members with a unique child name), or
    /// the published version an external member resolved to.
    version_id: Option<String>,
    /// An external member's `(namespace, name, version)`, when its ref parsed.
    external: Option<(String, String, String)>,
    /// An external member's published version, when the runtime resolved it.
    resolved: Option<ResolvedExternal>,
}

/// Verifies a `PublishBundle` request and pins every vendored member's local delegations.
///
/// The checks, all reported at once: the three parts are present and bounded (at most
/// [`MAX_BUNDLE_MEMBERS`] members); the Bundle document parses (unknown keys refused), is in
/// canonical form and is valid (envelope, metadata, `spec.root`); exactly one root, first, whose
/// `authoring_ref` is `spec.root`; unique child names; each vendored snapshot parses, is
/// canonical and names its child; each external member (never the root) has no snapshot, an
/// `authoring_ref` `namespace.name@version` whose name is its child name, and was resolved by the
/// runtime (`externals`); the committed lock parses, its `version` is its body hash, and it
/// equals the lock recomputed from the members (external content hashes from `externals`);
/// every delegation names a member, and every member is reachable from the root in closure walk
/// order without a cycle; each pinned member passes [`CompiledAgent::validate`]; the secret union
/// of the members (external ones through their published snapshot, when given) has no conflict.
///
/// `version_id_for(child_name)` gives the version id the runtime will store a vendored member
/// under; it is called once per vendored member whose snapshot parsed, in member order, and the
/// ids are written into the delegation bindings that target that member
/// (`agent.agent_version_id`, with `namespace`, `name` and `child_name`). `externals` maps an
/// external member's child name to the published version the runtime found for its ref, or why
/// there is none; bindings whose ref is that external ref are pinned to it.
pub fn verify_publication(
    manifest_json: &[u8],
    members: &[ReceivedMember<'_>],
    committed_lock: &[u8],
    externals: &HashMap<String, Result<ResolvedExternal, String>>,
    version_id_for: &mut dyn FnMut(&str) -> String,
) -> Result<VerifiedBundle, PublicationError> {
    let mut p = Problems::default();
    if manifest_json.is_empty() {
        p.push("bundle_manifest is required");
    }
    if members.is_empty() {
        p.push("members is required");
    }
    if committed_lock.is_empty() {
        p.push("committed_lock is required; run phrony bundles lock");
    }
    let header = (!manifest_json.is_empty())
        .then(|| check_header(manifest_json, &mut p))
        .flatten();
    let committed = (!committed_lock.is_empty())
        .then(|| check_committed_lock(committed_lock, &mut p))
        .flatten();
    if members.len() > MAX_BUNDLE_MEMBERS {
        p.push(format!(
            "members: at most {MAX_BUNDLE_MEMBERS} members, got {}",
            members.len()
        ));
        return Err(p.into_error());
    }

    let mut candidates = check_members(members, header.as_ref(), externals, &mut p);
    let recomputed = recompute_lock(&candidates);
    if let (Some(committed), Some(recomputed)) = (&committed, &recomputed) {
        for detail in lock_drift(committed, recomputed) {
            p.push(format!(
                "committed_lock drift: {detail}; run phrony bundles lock"
            ));
        }
    }
    for c in &mut candidates {
        if c.agent.is_some() && c.unique {
            c.version_id = Some(version_id_for(&c.child_name));
        }
    }
    let graph = pin_members(&mut candidates, &mut p);
    // The closure is known only when every member was read: a member that was not has no
    // edges, and everything below it would look unreachable.
    let complete = candidates.iter().all(|c| {
        c.version_id.is_some() && (c.resolved.is_some() || (c.agent.is_some() && c.path.is_some()))
    });
    if complete && candidates.first().is_some_and(|c| c.is_root) {
        check_closure(&candidates, &graph, &mut p);
    }
    for (c, pinned) in candidates.iter().zip(&graph) {
        validate_member(c, &pinned.unpinned, &mut p);
    }
    let secrets = match secret_union(candidates.iter().filter_map(|c| {
        c.agent
            .as_ref()
            .or_else(|| c.resolved.as_ref().and_then(|r| r.agent.as_ref()))
            .map(|a| (c.child_name.as_str(), a))
    })) {
        Ok(s) => s,
        Err(conflicts) => {
            for c in conflicts {
                p.push(c);
            }
            Vec::new()
        }
    };
    if !p.is_empty() {
        return Err(p.into_error());
    }
    match (header, recomputed) {
        (Some(header), Some(lock)) => assemble(header, lock, candidates, secrets),
        // Unreachable: a missing part was reported above.
        _ => Err(PublicationError {
            problems: vec!["bundle publication is incomplete".to_owned()],
        }),
    }
}

/// [`CompiledAgent::validate`] on a pinned member. A binding left unpinned because of a problem
/// already reported would only add `delegation target must be pinned` and the like: the
/// problems of its target are left out.
fn validate_member(c: &Candidate, unpinned: &[usize], p: &mut Problems) {
    let Some(agent) = &c.agent else { return };
    let Err(diags) = agent.validate() else { return };
    let explained = |path: &str| {
        unpinned.iter().any(|k| {
            path.strip_prefix(&format!("spec.tools[{k}].agent"))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    };
    for d in diags.errors() {
        if !explained(&d.path) {
            p.push(format!("member {}: {}", q(&c.child_name), d.summary()));
        }
    }
}

/// Parses and validates the Bundle document.
fn check_header(bytes: &[u8], p: &mut Problems) -> Option<BundleHeader> {
    if bytes.len() > MAX_BUNDLE_MANIFEST_BYTES {
        p.push(format!(
            "bundle_manifest: at most {MAX_BUNDLE_MANIFEST_BYTES} bytes, got {}",
            bytes.len()
        ));
        return None;
    }
    let header: BundleHeader = match serde_json::from_slice(bytes) {
        Ok(h) => h,
        Err(e) => {
            p.push(format!("bundle_manifest: {e}"));
            return None;
        }
    };
    let canonical = header.to_json();
    if canonical != bytes {
        p.push(format!(
            "bundle_manifest is not in canonical form ({}); send the Bundle document as phrony \
             writes it",
            first_difference(bytes, &canonical)
        ));
    }
    let mut d = SnapshotDiags::default();
    envelope(&mut d, &header.api_version, &header.kind, "Bundle");
    let m = &header.metadata;
    metadata(&mut d, &m.name, &m.namespace, &m.version, true);
    agent_identity(&mut d, &m.name, &m.namespace);
    let root = &header.spec.root;
    if blank(root) {
        d.error("spec.root", "is required");
    } else {
        match safe_relative(root.trim()) {
            Ok(_) => {}
            Err(RefError::Absolute) => d.error("spec.root", "must be bundle-relative"),
            Err(_) => d.error("spec.root", "must resolve inside bundle root"),
        }
    }
    if let Err(diags) = d.finish() {
        for diag in diags.errors() {
            p.push(diag.summary());
        }
    }
    Some(header)
}

/// Parses the committed lock and checks its self-hash.
fn check_committed_lock(bytes: &[u8], p: &mut Problems) -> Option<BundleLock> {
    if bytes.len() > MAX_BUNDLE_LOCK_BYTES {
        p.push(format!(
            "committed_lock: at most {MAX_BUNDLE_LOCK_BYTES} bytes, got {}",
            bytes.len()
        ));
        return None;
    }
    let lock = match BundleLock::parse(bytes) {
        Ok(l) => l,
        Err(e) => {
            p.push(format!("committed_lock: {e}"));
            return None;
        }
    };
    if lock.version.is_empty() {
        p.push("committed_lock: lockfile version is required");
    } else {
        let body = BundleLock::body_hash(&lock.root_child_name, &lock.members);
        if body != lock.version {
            p.push(format!(
                "committed_lock: lockfile version {} does not match body hash {body:?}",
                q(&lock.version)
            ));
        }
    }
    Some(lock)
}

/// Reads every member and checks what concerns the member list as a whole.
fn check_members(
    members: &[ReceivedMember<'_>],
    header: Option<&BundleHeader>,
    externals: &HashMap<String, Result<ResolvedExternal, String>>,
    p: &mut Problems,
) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = members
        .iter()
        .enumerate()
        .map(|(i, m)| receive_member(i, m, externals, p))
        .collect();

    let roots: Vec<usize> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.is_root.then_some(i))
        .collect();
    match roots.as_slice() {
        [0] => {
            if let (Some(h), Some(root)) = (header, candidates.first())
                && root.reference != h.spec.root
            {
                p.push(format!(
                    "root member {} authoring_ref {} does not match spec.root {}",
                    q(&root.child_name),
                    q(&root.reference),
                    q(&h.spec.root)
                ));
            }
        }
        [i] => p.push(format!(
            "members[{i}] is the root member; the root must be members[0]"
        )),
        _ if members.is_empty() => {}
        many => p.push(format!(
            "members must include exactly one is_root member (got {})",
            many.len()
        )),
    }

    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut paths: HashMap<&Path, usize> = HashMap::new();
    let mut duplicates = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        if !c.child_name.is_empty() && *names.entry(&c.child_name).or_insert(i) != i {
            p.push(format!(
                "duplicate members[{i}].child_name {}",
                q(&c.child_name)
            ));
            duplicates.push(i);
        }
        if let Some(path) = &c.path
            && let first = *paths.entry(path).or_insert(i)
            && first != i
        {
            p.push(format!(
                "members[{i}].authoring_ref {} names the same file as members[{first}]",
                q(&c.reference)
            ));
        }
    }
    for i in duplicates {
        if let Some(c) = candidates.get_mut(i) {
            c.unique = false;
        }
    }
    candidates
}

/// Reads one member: origin, authoring ref, snapshot.
fn receive_member(
    i: usize,
    m: &ReceivedMember<'_>,
    externals: &HashMap<String, Result<ResolvedExternal, String>>,
    p: &mut Problems,
) -> Candidate {
    let mut c = Candidate {
        child_name: m.child_name.to_owned(),
        reference: m.authoring_ref.to_owned(),
        path: None,
        is_root: m.is_root,
        unique: true,
        agent: None,
        unpinned_hash: String::new(),
        version_id: None,
        external: None,
        resolved: None,
    };
    if blank(m.child_name) {
        p.push(format!("members[{i}].child_name is required"));
    }
    match m.origin {
        "vendored" => {}
        "external" => {
            receive_external(i, m, externals, &mut c, p);
            return c;
        }
        _ => {
            p.push(format!("members[{i}].origin must be vendored or external"));
            // Still a path, so that delegations to it are not reported as well.
            c.path = safe_relative(m.authoring_ref.trim()).ok();
            return c;
        }
    }
    let name = q(m.child_name);
    match safe_relative(m.authoring_ref.trim()) {
        Ok(path) => c.path = Some(path),
        Err(RefError::Empty) => p.push(format!("vendored member {name} authoring_ref is required")),
        Err(RefError::Absolute) => p.push(format!(
            "vendored member {name} authoring_ref must be bundle-relative"
        )),
        Err(_) => p.push(format!(
            "vendored member {name} authoring_ref must resolve inside bundle root"
        )),
    }
    let bytes = m.resolved_manifest;
    if bytes.is_empty() {
        p.push(format!(
            "vendored member resolved_manifest is required (members[{i}] {name})"
        ));
        return c;
    }
    if bytes.len() > MAX_MEMBER_SNAPSHOT_BYTES {
        p.push(format!(
            "vendored member {name}: resolved_manifest: at most {MAX_MEMBER_SNAPSHOT_BYTES} \
             bytes, got {}",
            bytes.len()
        ));
        return c;
    }
    let agent = match CompiledAgent::from_snapshot_json(bytes) {
        Ok(a) => a,
        Err(e) => {
            p.push(format!("vendored member {name}: {e}"));
            return c;
        }
    };
    let canonical = agent.snapshot_json();
    if canonical != bytes {
        p.push(format!(
            "vendored member {name}: snapshot is not in canonical form, so it was not produced \
             by the phrony compiler ({}); publish the compiler's output unchanged",
            first_difference(bytes, &canonical)
        ));
    }
    if agent.metadata.name != m.child_name {
        p.push(format!(
            "vendored member {name} metadata.name {} does not match child_name",
            q(&agent.metadata.name)
        ));
    }
    c.unpinned_hash = agent.content_hash();
    c.agent = Some(agent);
    c
}

/// `(namespace, name, version)` of an external member's `authoring_ref`
/// (`namespace.name@version`, version pinned); `None` for anything else. A runtime uses it to
/// find the published versions to pass to [`verify_publication`].
pub fn external_member_ref(authoring_ref: &str) -> Option<(String, String, String)> {
    match parse_delegation_ref(authoring_ref.trim()) {
        Ok(DelegationRef::External {
            namespace,
            name,
            version: Some(version),
        }) if !version.is_empty() => Some((namespace, name, version)),
        _ => None,
    }
}

/// Reads an external member: its ref, and what the runtime resolved it to.
fn receive_external(
    i: usize,
    m: &ReceivedMember<'_>,
    externals: &HashMap<String, Result<ResolvedExternal, String>>,
    c: &mut Candidate,
    p: &mut Problems,
) {
    let name = q(m.child_name);
    let at = format!("external member {name} (members[{i}])");
    if m.is_root {
        p.push(format!(
            "{at} cannot be the root: the root must be a vendored member"
        ));
    }
    if !m.resolved_manifest.is_empty() {
        p.push(format!(
            "{at}: resolved_manifest must be empty (the runtime uses the published version)"
        ));
    }
    match external_member_ref(m.authoring_ref) {
        Some((namespace, ext, version)) => {
            if ext != m.child_name {
                p.push(format!(
                    "{at}: child_name must be the external name {}",
                    q(&ext)
                ));
            }
            c.external = Some((namespace, ext, version));
        }
        None => {
            p.push(format!(
                "{at}: authoring_ref {} must be namespace.name@version",
                q(m.authoring_ref)
            ));
            return;
        }
    }
    match externals.get(m.child_name) {
        Some(Ok(found)) => {
            if !m.member_version_id.is_empty() && m.member_version_id != found.version_id {
                p.push(format!(
                    "{at}: member_version_id {} is not the published version {} of {}",
                    q(m.member_version_id),
                    q(&found.version_id),
                    q(m.authoring_ref)
                ));
            }
            c.version_id = Some(found.version_id.clone());
            c.resolved = Some(found.clone());
        }
        Some(Err(why)) => p.push(format!(
            "{at}: {} cannot be used: {why}",
            q(m.authoring_ref)
        )),
        None => p.push(format!(
            "{at}: {} was not resolved by the runtime",
            q(m.authoring_ref)
        )),
    }
}

/// The lock of the received members, when every member was read (vendored members parsed,
/// external members resolved).
fn recompute_lock(candidates: &[Candidate]) -> Option<BundleLock> {
    let root = candidates.first()?.child_name.clone();
    let members = candidates
        .iter()
        .map(|c| match (&c.agent, &c.external, &c.resolved) {
            (Some(_), _, _) => Some(LockMember {
                child_name: c.child_name.clone(),
                origin: MemberOrigin::Vendored,
                content_hash: c.unpinned_hash.clone(),
                reference: c.reference.clone(),
                namespace: String::new(),
                name: String::new(),
                version: String::new(),
            }),
            (None, Some((namespace, name, version)), Some(found)) => Some(LockMember {
                child_name: c.child_name.clone(),
                origin: MemberOrigin::External,
                content_hash: found.content_hash.clone(),
                reference: c.reference.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                version: version.clone(),
            }),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some(BundleLock::new(root, members))
}

/// Every way the committed lock differs from the recomputed one.
fn lock_drift(committed: &BundleLock, recomputed: &BundleLock) -> Vec<String> {
    let mut out = Vec::new();
    if committed.root_child_name != recomputed.root_child_name {
        out.push("root_child_name drift".to_owned());
    }
    if committed.members.len() != recomputed.members.len() {
        out.push(format!(
            "member count drift (lock has {}, members has {})",
            committed.members.len(),
            recomputed.members.len()
        ));
        return out;
    }
    for (i, (lock, want)) in committed
        .members
        .iter()
        .zip(&recomputed.members)
        .enumerate()
    {
        if lock.child_name != want.child_name {
            out.push(format!("members[{i}] child_name drift"));
            continue;
        }
        if lock.origin != want.origin {
            out.push(format!("members[{i}] origin drift"));
            continue;
        }
        for (field, got, want) in [
            ("ref", &lock.reference, &want.reference),
            ("namespace", &lock.namespace, &want.namespace),
            ("name", &lock.name, &want.name),
            ("version", &lock.version, &want.version),
        ] {
            if got != want {
                out.push(format!("members[{i}] {field} drift"));
            }
        }
        if lock.content_hash != want.content_hash {
            if want.origin == MemberOrigin::External {
                out.push(format!(
                    "members[{i}] content_hash drift: the lock records {} for external member \
                     {}, but this runtime's published version has {} (published versions are \
                     immutable, so the lock was made against another runtime)",
                    q(&lock.content_hash),
                    q(&want.reference),
                    q(&want.content_hash)
                ));
            } else {
                out.push(format!(
                    "members[{i}] content_hash drift: lock is out of date"
                ));
            }
        }
    }
    out
}

/// What a delegation binding is pinned to.
#[derive(Debug, Clone)]
struct PinTarget {
    namespace: String,
    name: String,
    child_name: String,
    version_id: String,
}

/// The delegation graph after pinning.
#[derive(Debug, Default, Clone)]
struct Pinned {
    /// The members each member delegates to (member indices, in binding order).
    edges: Vec<usize>,
    /// Its delegation bindings left unpinned because of a problem already reported.
    unpinned: Vec<usize>,
}

/// Pins every vendored member's local delegations to the members they name.
fn pin_members(candidates: &mut [Candidate], p: &mut Problems) -> Vec<Pinned> {
    let mut by_path: HashMap<PathBuf, usize> = HashMap::new();
    let mut by_external: HashMap<(String, String, String), usize> = HashMap::new();
    let mut targets: Vec<Option<PinTarget>> = Vec::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        if let Some(path) = &c.path {
            by_path.entry(path.clone()).or_insert(i);
        }
        if let Some(key) = &c.external {
            by_external.entry(key.clone()).or_insert(i);
        }
        targets.push(match (&c.agent, &c.external, &c.version_id) {
            (Some(a), _, Some(id)) => Some(PinTarget {
                namespace: a.metadata.namespace.clone(),
                name: a.metadata.name.clone(),
                child_name: c.child_name.clone(),
                version_id: id.clone(),
            }),
            (None, Some((namespace, name, _)), Some(id)) => Some(PinTarget {
                namespace: namespace.clone(),
                name: name.clone(),
                child_name: c.child_name.clone(),
                version_id: id.clone(),
            }),
            _ => None,
        });
    }
    let mut graph = vec![Pinned::default(); candidates.len()];
    for (i, c) in candidates.iter_mut().enumerate() {
        let (Some(agent), Some(path), Some(out)) = (&mut c.agent, &c.path, graph.get_mut(i)) else {
            continue;
        };
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = q(&c.child_name);
        for (k, t) in agent.spec.tools.iter_mut().enumerate() {
            let Some(target) = &mut t.agent else { continue };
            if target.late_bound {
                continue;
            }
            let local = match parse_delegation_ref(&t.reference) {
                Ok(DelegationRef::Local(rel)) => rel,
                Ok(DelegationRef::External {
                    namespace,
                    name: ext,
                    version,
                }) => {
                    // The compiler keeps the pinned version in the target.
                    let version = version
                        .filter(|v| !v.is_empty())
                        .unwrap_or_else(|| target.version.clone());
                    let key = (namespace, ext, version.clone());
                    let Some(&j) = by_external.get(&key) else {
                        p.push(format!(
                            "vendored member {name}: delegation ref {} is not a member of the \
                             bundle",
                            q(&format!("{}.{}@{}", key.0, key.1, key.2))
                        ));
                        out.unpinned.push(k);
                        continue;
                    };
                    // An external member that was not resolved was reported when received.
                    if let Some(pin) = targets.get(j).and_then(Option::as_ref) {
                        target.namespace.clone_from(&pin.namespace);
                        target.name.clone_from(&pin.name);
                        target.version = version;
                        target.child_name.clone_from(&pin.child_name);
                        target.agent_version_id.clone_from(&pin.version_id);
                        out.edges.push(j);
                    } else {
                        out.unpinned.push(k);
                    }
                    continue;
                }
                Err(e) => {
                    p.push(format!("vendored member {name}: spec.tools[{k}].ref: {e}"));
                    out.unpinned.push(k);
                    continue;
                }
            };
            if !target.version.is_empty() {
                p.push(format!(
                    "vendored member {name}: spec.tools[{k}].agent.version must be empty for a \
                     local delegation (bundle publish pins it by agent_version_id)"
                ));
            }
            let wanted = normalize(&dir.join(local));
            let Some(&j) = by_path.get(&wanted) else {
                p.push(format!(
                    "vendored member {name}: delegation ref {} is not a member of the bundle",
                    q(&t.reference)
                ));
                out.unpinned.push(k);
                continue;
            };
            // A target that could not be read was reported when it was received.
            if let Some(pin) = targets.get(j).and_then(Option::as_ref) {
                target.namespace.clone_from(&pin.namespace);
                target.name.clone_from(&pin.name);
                target.child_name.clone_from(&pin.child_name);
                target.agent_version_id.clone_from(&pin.version_id);
                out.edges.push(j);
            } else {
                out.unpinned.push(k);
            }
        }
    }
    graph
}

/// The closure as the client walks it: depth first from the root, edges in binding order,
/// diamonds once. Every member must be reached, without a cycle, in the order received.
fn check_closure(candidates: &[Candidate], graph: &[Pinned], p: &mut Problems) {
    let mut walk = Walk {
        graph,
        candidates,
        state: vec![Visit::New; candidates.len()],
        stack: Vec::new(),
        order: Vec::new(),
        cycle: None,
    };
    walk.visit(0);
    if let Some(cycle) = walk.cycle {
        p.push(format!("bundle closure cycle detected: {cycle}"));
        return;
    }
    let mut unreachable = false;
    for (i, c) in candidates.iter().enumerate() {
        if walk.state.get(i) == Some(&Visit::New) {
            unreachable = true;
            p.push(format!(
                "member {} is not reachable from the root",
                q(&c.child_name)
            ));
        }
    }
    if !unreachable && !walk.order.iter().copied().eq(0..candidates.len()) {
        let expected: Vec<String> = walk
            .order
            .iter()
            .filter_map(|&i| candidates.get(i).map(|c| q(&c.child_name)))
            .collect();
        p.push(format!(
            "members are not in closure walk order (root first, then depth first in delegation \
             order): expected {}",
            expected.join(", ")
        ));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Visit {
    New,
    OnStack,
    Done,
}

struct Walk<'a> {
    graph: &'a [Pinned],
    candidates: &'a [Candidate],
    state: Vec<Visit>,
    stack: Vec<usize>,
    order: Vec<usize>,
    cycle: Option<String>,
}

impl Walk<'_> {
    /// Depth is bounded by [`MAX_BUNDLE_MEMBERS`]: a member is entered once.
    fn visit(&mut self, i: usize) {
        match self.state.get(i) {
            Some(Visit::New) => {}
            Some(Visit::OnStack) => {
                if self.cycle.is_none()
                    && let Some(pos) = self.stack.iter().position(|&s| s == i)
                {
                    let mut names: Vec<String> = self.stack[pos..]
                        .iter()
                        .chain(std::iter::once(&i))
                        .filter_map(|&s| self.candidates.get(s).map(|c| c.child_name.clone()))
                        .collect();
                    names.iter_mut().for_each(|n| {
                        if n.chars().count() > MAX_QUOTED_CHARS {
                            *n = n.chars().take(MAX_QUOTED_CHARS).chain(Some('…')).collect();
                        }
                    });
                    self.cycle = Some(names.join(" -> "));
                }
                return;
            }
            _ => return,
        }
        self.state[i] = Visit::OnStack;
        self.stack.push(i);
        self.order.push(i);
        let graph = self.graph;
        for &j in graph.get(i).map(|g| g.edges.as_slice()).unwrap_or_default() {
            self.visit(j);
        }
        self.stack.pop();
        self.state[i] = Visit::Done;
    }
}

/// Builds the result once nothing is wrong.
fn assemble(
    header: BundleHeader,
    lock: BundleLock,
    candidates: Vec<Candidate>,
    secrets: Vec<BundleSecret>,
) -> Result<VerifiedBundle, PublicationError> {
    let incomplete = || PublicationError {
        problems: vec!["bundle publication is incomplete".to_owned()],
    };
    let utf8 = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| incomplete());
    let manifest_json = utf8(header.to_json())?;
    let lock_json = utf8(lock.to_file_bytes())?;
    let mut members = Vec::with_capacity(candidates.len());
    for c in candidates {
        match (c.agent, c.external, c.resolved, c.version_id) {
            (Some(agent), _, _, Some(version_id)) => {
                let snapshot_json = utf8(agent.snapshot_json())?;
                let content_hash = agent.content_hash();
                members.push(VerifiedMember {
                    child_name: c.child_name,
                    origin: MemberOrigin::Vendored,
                    namespace: agent.metadata.namespace.clone(),
                    name: agent.metadata.name.clone(),
                    version: agent.metadata.version.clone(),
                    reference: c.reference,
                    is_root: c.is_root,
                    lock_content_hash: c.unpinned_hash,
                    version_id,
                    agent: Some(agent),
                    snapshot_json,
                    content_hash,
                });
            }
            (None, Some((namespace, name, version)), Some(found), Some(version_id)) => {
                members.push(VerifiedMember {
                    child_name: c.child_name,
                    origin: MemberOrigin::External,
                    namespace,
                    name,
                    version,
                    reference: c.reference,
                    is_root: c.is_root,
                    lock_content_hash: found.content_hash.clone(),
                    version_id,
                    agent: None,
                    snapshot_json: String::new(),
                    content_hash: found.content_hash,
                });
            }
            _ => return Err(incomplete()),
        }
    }
    Ok(VerifiedBundle {
        header,
        manifest_json,
        lock,
        lock_json,
        members,
        secrets,
    })
}
