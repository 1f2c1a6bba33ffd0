//! The Phrony Agent Spec model: parse, validate, resolve, compile and hash Agent, Tool, Policy and
//! Bundle documents.
//!
//! The authoring format is YAML (§1 of the runtime reference). [`load_agent`] reads an Agent and
//! everything around it (its `tools/` and `policies/` documents, prompt and schema files, the
//! stub script), reports **every** problem as a [`Diagnostic`] with `file:line:column`, a field
//! path and a message, and compiles it into a [`CompiledAgent`]: the canonical snapshot that is
//! published, hashed and run.
//!
//! ```no_run
//! let compiled = match phrony_manifest::load_agent("refund-agent/agent.yaml") {
//!     Ok(c) => c,
//!     Err(diags) => {
//!         eprintln!("{diags}"); // one `file:line:col: error: path: message` per line
//!         std::process::exit(1);
//!     }
//! };
//! let agent = &compiled.agent;
//! println!("valid: {} {}", agent.qualified_name(), agent.metadata.version);
//! println!("content hash {}", agent.content_hash()); // identical to the Go runtime's
//! let policies = agent.policy_set()?; // the phrony-policy engine for dispatch decisions
//! # Ok::<(), phrony_policy::CompileErrors>(())
//! ```
//!
//! Bundles: [`load_bundle`] walks the closure from `spec.root`, [`lock_bundle`] writes
//! `bundle.lock.json` ([`lock_loaded_bundle`] with a resolver for external members'
//! content hashes, which only a runtime knows), and [`validate_bundle`] checks a committed lock
//! for drift. [`Bundle::header`] and [`Bundle::published_members`] build what `bundles publish`
//! sends; a runtime resolves external members ([`external_member_ref`], [`ResolvedExternal`]) and
//! checks it with [`verify_publication`], which re-derives the lock from the members, pins their
//! delegations to the version ids it is about to store (external ones to the published versions)
//! and reports every problem at once ([`PublicationError`]).
//!
//! Policy analysis: [`Compiled::findings`] lists what in the agent's policies can never take
//! effect — conditions that cannot match the tool's input schema or cannot hold, policies shadowed
//! by an unconditional deny, allow lists that allow everything, approval policies whose quorum is
//! never used — each a [`Finding`] (a warning with its position, [`FindingKind`], and an example
//! call where one helps).
//!
//! Tool descriptor pins: [`descriptor_pin`] hashes a tool's name, version, description and input
//! schema; [`ToolBinding::descriptor_pin`] and [`CompiledAgent::tool_pins`] compute it from a
//! snapshot (nothing is added to the snapshot), [`tool_descriptor_pin`] from a Tool document.
//!
//! A runtime that receives a compiled snapshot (Publish) reads it with
//! [`CompiledAgent::from_snapshot_json`] and checks it with [`CompiledAgent::validate`]: the
//! authoring rules that still apply to compiled output, the reference's compiled-only checks
//! (policy shape, allow-list scopes, pinned delegations) and the invariants of compiler output.
//! Whatever [`load_agent`] compiles passes it.
//!
//! # Where this crate is stricter than the reference runtime
//!
//! - YAML aliases (`*name`, so also merge keys `<<: *base`) are refused in every document, with
//!   the position of the first one, before anything expands them; files are at most 8 MiB
//!   ([`MAX_YAML_BYTES`]). The same reader ([`check_yaml`], [`read_yaml_file`]) guards the
//!   runtime's other YAML inputs.
//! - `metadata.namespace` and `metadata.name` of agents and bundles follow the runtime's rule
//!   ([`check_agent_name`]: no `/`, whitespace or control characters), which the ledger applies
//!   at publish: validate refuses what publish would.
//! - Policy documents reject unknown keys (a typo such as `condition:` would disable a policy),
//!   unknown decision types, `on_reject`, `on_modify` and `timeout.default` values, invalid
//!   conditions and regexes, and decisions that say nothing about what they govern.
//! - Unsupported model providers and invalid JSON Schemas are rejected at validate time.
//! - Tool ref version constraints mean what semver says (see below): a bare `@1.0.0` is an exact
//!   pin, and `<2.0` means "below 2.0".
//! - A Policy document without a scope attached through a binding governs that binding only.
//! - Bundle secret conflicts are found before the lock is written.
//! - A binding or Tool document may set `timeout` (`30s`, `2m`, `1m30s`, `500ms`, bare seconds; at
//!   most 24h), the execution deadline of one call; it compiles to the binding's `timeout_ms`,
//!   omitted when unset so other snapshots hash as before. `output.format: json` answers are
//!   checked at run time with [`OutputValidator`] (the reference never enforces `output`).
//! - An allow-list policy scoped to a tool the agent does not bind is a compile error (the
//!   reference compiles it and then refuses the snapshot at publish), and one attached through
//!   `spec.default_policies` without a scope compiles to `scope: agent` (the reference leaves the
//!   scope empty, which its own publish refuses).
//!
//! # Tool version constraints
//!
//! `ref: payments.issue-refund@<constraint>`: a bare version is an exact pin (`@1.0.0` matches
//! only `1.0.0`; `@1.2` matches `1.2.x`); `^`, `~`, `>=`, `<`, `=`, `*` and comma-separated
//! combinations mean what they mean in Cargo.

mod analysis;
mod bundle;
mod canonical;
mod compile;
mod destinations;
mod diag;
mod doc;
mod load;
mod model;
mod names;
mod pin;
mod policy_bridge;
mod publication;
mod refs;
mod resolve;
mod schema;
mod secrets;
mod snapshot;
mod stub;
mod validate;
mod yaml_input;
mod yaml_pos;

pub use analysis::{Finding, FindingKind};
pub use bundle::{
    Bundle, BundleLock, BundleMember, LOCK_FILE, Locked, ValidatedBundle, load_bundle, lock_bundle,
    lock_loaded_bundle, validate_bundle,
};
pub use canonical::Json;
pub use destinations::{DeclaredDestination, DeclaredEndpoint, SecretUser, normalize_api_root};
pub use diag::{Diagnostic, Diagnostics, Severity};
pub use load::{Compiled, document_kind, load_agent};
pub use model::bundle::{LockMember, MemberOrigin};
pub use model::common::is_lenient_semver;
pub use model::compiled::{
    ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT, AgentSpec, AgentTarget, CompiledAgent,
    CompiledPolicy, Governance, Instructions, Limits, McpAuth, McpRef, McpServer, Metadata, Model,
    Output, Parameters, PolicyTimeout, Reasoning, Schema, SecretRef, SnapshotError, ToolBinding,
};
pub use names::{AgentNameError, ForbiddenChar, check_agent_name};
pub use pin::{PIN_PREFIX, ToolPin, descriptor_pin, tool_descriptor_pin};
pub use policy_bridge::{CallScope, session_metadata};
pub use publication::{
    BundleHeader, BundleHeaderMetadata, BundleHeaderSpec, MAX_BUNDLE_LOCK_BYTES,
    MAX_BUNDLE_MANIFEST_BYTES, MAX_BUNDLE_MEMBERS, MAX_MEMBER_SNAPSHOT_BYTES, PublicationError,
    PublishedMember, ReceivedMember, ResolvedExternal, VerifiedBundle, VerifiedMember,
    external_member_ref, verify_publication,
};
pub use refs::{AgentRef, AgentRefError, parse_agent_ref};
pub use schema::{ArgError, OutputSchemaError, OutputValidator, SchemaError, ToolArgsValidator};
pub use secrets::{BundleSecret, SecretRequirement, secret_union as bundle_secret_union};
pub use stub::{STUB_SCRIPT_FILE, StubEvent, StubScript, StubScriptError};
pub use validate::{PROVIDERS, mcp_url_allowed};
pub use yaml_input::{MAX_YAML_BYTES, YamlInputError, check_yaml, read_text_file, read_yaml_file};
pub use yaml_pos::YamlPositions;
