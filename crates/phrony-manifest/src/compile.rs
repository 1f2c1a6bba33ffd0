//! Compilation of an authoring Agent into the canonical snapshot (§1.9 steps 3–6): refs
//! resolved, Tool documents merged into bindings, Policy documents loaded, scoped and merged by
//! the deny-wins rules, authority boundaries added, annotations and the stub script inlined.
//!
//! One deliberate difference from the reference: a Policy document without `spec.scope` that is
//! attached through a binding (`spec.tools[i].policies`, a Tool document's `default_policies`, or
//! `spec.agents[i].policies`) is scoped to that binding (`tool:<ref>`). The reference applies it
//! to every tool of the agent (§14.1 item 6), which contradicts what authors expect ("policies on
//! a binding apply only to that tool"). Documents attached through `spec.default_policies`, and
//! documents with an explicit scope, compile exactly as in the reference.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::analysis::{Finding, Subject, analyze};
use crate::canonical::Json;
use crate::diag::Diagnostic;
use crate::doc::{Source, UnknownKeys, load_source, parse_typed, probe_kind, read_text_result};
use crate::model::agent::{AgentDoc, SubagentDoc, ToolBindingDoc};
use crate::model::common::{PolicyAttachment, SchemaDoc, blank};
use crate::model::compiled::{
    ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT, AgentSpec, AgentTarget, CompiledAgent,
    CompiledPolicy, Governance, Instructions, Limits, McpAuth, McpRef, McpServer, Metadata, Model,
    Output, Parameters, PolicyTimeout, Reasoning, Schema, SecretRef, ToolBinding,
};
use crate::model::policy::PolicyDoc;
use crate::model::tool::ToolDoc;
use crate::policy_bridge::{cedar_error, def_from_compiled, is_approval, validate_policy_doc};
use crate::refs::{DelegationRef, check_constraint, parse_delegation_ref, parse_tool_ref};
use crate::resolve::{RefKind, prompt_from_text, resolve_file, schema_from_text, yaml_files};
use crate::schema::check_schema;
use crate::stub::{STUB_SCRIPT_FILE, StubScript};
use crate::validate::{
    SIDE_EFFECT_CLASSES, SIDE_EFFECT_MSG, envelope, metadata, parse_timeout, schema_exclusive,
};

/// The input schema of a delegation binding that declares none.
fn default_delegation_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {"task": {"type": "string"}},
        "required": ["task"],
    })
}

/// A loaded Tool document.
#[derive(Debug)]
struct ToolEntry {
    src: Source,
    doc: ToolDoc,
    input_schema: Option<Json>,
}

/// A loaded Policy document.
#[derive(Debug)]
struct PolicyEntry {
    src: Source,
    doc: PolicyDoc,
    valid: bool,
}

/// The files around one agent: its bundle root, `tools/` and `policies/`.
#[derive(Debug)]
struct Project {
    root: PathBuf,
    tools: HashMap<String, ToolEntry>,
    /// Files of `tools/` that could not be read as Tool documents.
    unreadable_tools: Vec<PathBuf>,
    store: PolicyStore,
}

/// The Policy documents read for one agent.
#[derive(Debug, Default)]
struct PolicyStore {
    /// `namespace.name` → key into `entries`.
    ids: HashMap<String, PathBuf>,
    /// Every Policy document read, by canonical path; `None` when it could not be read.
    entries: HashMap<PathBuf, Option<PolicyEntry>>,
    /// Files of `policies/` that could not be read as Policy documents.
    unreadable: Vec<PathBuf>,
}

/// ` (a.yaml, b.yaml could not be read)` when some documents of a directory failed, so that a
/// "not found" is not mistaken for a missing file.
fn unreadable_note(files: &[PathBuf]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        })
        .collect();
    format!(" ({} could not be read)", names.join(", "))
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

impl Project {
    fn load(root: &Path, out: &mut Vec<Diagnostic>) -> Self {
        let mut p = Project {
            root: root.to_path_buf(),
            tools: HashMap::new(),
            unreadable_tools: Vec::new(),
            store: PolicyStore::default(),
        };
        p.load_tools(out);
        p.load_policies(out);
        p
    }

    fn load_tools(&mut self, out: &mut Vec<Diagnostic>) {
        let dir = self.root.join("tools");
        let files = match yaml_files(&dir) {
            Ok(f) => f,
            Err(e) => {
                out.push(Diagnostic::file_error(
                    &dir,
                    "",
                    format!("cannot list directory: {e}"),
                ));
                return;
            }
        };
        for file in files {
            let Some((src, doc)) = read_tool(&file, out) else {
                self.unreadable_tools.push(file);
                continue;
            };
            let input_schema = validate_tool(&self.root, &src, &doc, out);
            let id = format!("{}.{}", doc.metadata.namespace, doc.metadata.name);
            if blank(&doc.metadata.namespace) || blank(&doc.metadata.name) {
                continue;
            }
            if let Some(first) = self.tools.get(&id) {
                let msg = format!(
                    "duplicate tool logical id {id} (also declared in {})",
                    first.src.path.display()
                );
                src.diags(out).error("metadata.name", msg);
                continue;
            }
            self.tools.insert(
                id,
                ToolEntry {
                    src,
                    doc,
                    input_schema,
                },
            );
        }
    }

    fn load_policies(&mut self, out: &mut Vec<Diagnostic>) {
        let dir = self.root.join("policies");
        let files = match yaml_files(&dir) {
            Ok(f) => f,
            Err(e) => {
                out.push(Diagnostic::file_error(
                    &dir,
                    "",
                    format!("cannot list directory: {e}"),
                ));
                return;
            }
        };
        for file in files {
            let key = self.store.load(&file, out);
            let Some(Some(entry)) = self.store.entries.get(&key) else {
                self.store.unreadable.push(file);
                continue;
            };
            let md = &entry.doc.metadata;
            if blank(&md.namespace) || blank(&md.name) {
                continue;
            }
            let id = format!("{}.{}", md.namespace, md.name);
            if let Some(first) = self.store.ids.get(&id) {
                let msg = format!(
                    "duplicate policy logical id {id} (also declared in {})",
                    first.display()
                );
                entry.src.diags(out).error("metadata.name", msg);
                continue;
            }
            self.store.ids.insert(id, key);
        }
    }
}

impl PolicyStore {
    /// Reads, parses and validates a Policy document once; returns its cache key.
    fn load(&mut self, file: &Path, out: &mut Vec<Diagnostic>) -> PathBuf {
        let key = canonical(file);
        if self.entries.contains_key(&key) {
            return key;
        }
        let entry = load_source(file, out).and_then(|src| {
            if probe_kind(&src).as_deref() != Some("Policy") {
                src.diags(out).error("kind", "expected kind Policy");
                return None;
            }
            let doc = parse_typed::<PolicyDoc>(&src, UnknownKeys::Error, out)?;
            let before = out.iter().filter(|d| d.is_error()).count();
            let ok = validate_policy_doc(&doc, &src.text, &mut src.diags(out));
            let valid = ok && out.iter().filter(|d| d.is_error()).count() == before;
            Some(PolicyEntry { src, doc, valid })
        });
        self.entries.insert(key.clone(), entry);
        key
    }
}

/// Validates a Tool document and resolves its input schema (`root` is the bundle root that
/// schema refs are relative to).
pub(crate) fn validate_tool(
    root: &Path,
    src: &Source,
    doc: &ToolDoc,
    out: &mut Vec<Diagnostic>,
) -> Option<Json> {
    let mut d = src.diags(out);
    envelope(&mut d, &doc.api_version, &doc.kind, "Tool");
    metadata(
        &mut d,
        &doc.metadata.name,
        &doc.metadata.namespace,
        &doc.metadata.version,
        false,
    );
    let spec = &doc.spec;
    if !spec.side_effect_class.is_empty()
        && !SIDE_EFFECT_CLASSES.contains(&spec.side_effect_class.as_str())
    {
        d.error("spec.side_effect_class", SIDE_EFFECT_MSG);
    }
    crate::validate::timeout(&mut d, "spec.timeout", &spec.timeout);
    for (j, id) in spec.default_policies.iter().enumerate() {
        if blank(id) {
            d.error(
                &format!("spec.default_policies[{j}]"),
                "policy reference must not be empty",
            );
        }
    }
    let input = spec.input_schema.as_ref().and_then(|s| {
        schema_exclusive(s, "spec.input_schema", &mut d);
        resolve_schema(root, s, "spec.input_schema", &mut d)
    });
    if let Some(s) = &spec.output_schema {
        schema_exclusive(s, "spec.output_schema", &mut d);
        resolve_schema(root, s, "spec.output_schema", &mut d);
    }
    input
}

/// Reads a Tool document; `None` (with diagnostics) when it cannot be used.
pub(crate) fn read_tool(file: &Path, out: &mut Vec<Diagnostic>) -> Option<(Source, ToolDoc)> {
    let src = load_source(file, out)?;
    if probe_kind(&src).as_deref() != Some("Tool") {
        src.diags(out).error("kind", "expected kind Tool");
        return None;
    }
    let doc = parse_typed::<ToolDoc>(&src, UnknownKeys::Warn, out)?;
    Some((src, doc))
}

/// Resolves a schema to its inline JSON, checking that it is a valid JSON Schema.
fn resolve_schema(
    root: &Path,
    s: &SchemaDoc,
    at: &str,
    d: &mut crate::diag::FileDiags<'_>,
) -> Option<Json> {
    if s.has_inline() {
        if !blank(&s.reference) {
            return None; // reported by schema_exclusive
        }
        let value = s.inline.clone()?;
        let inline_at = format!("{at}.inline");
        return match check_schema(&value) {
            Ok(()) => Some(Json::from(value)),
            Err(p) => {
                let path = if p.path.is_empty() {
                    inline_at
                } else {
                    format!("{inline_at}.{}", p.path)
                };
                d.error(&path, p.message);
                None
            }
        };
    }
    if blank(&s.reference) {
        return None;
    }
    let ref_at = format!("{at}.ref");
    let version = s.version.as_ref().map(|v| v.0.as_str());
    let file = match resolve_file(root, &s.reference, version, RefKind::Schema) {
        Ok(f) => f,
        Err(e) => {
            d.error(&ref_at, e.to_string());
            return None;
        }
    };
    let text = match read_text_result(&file) {
        Ok(t) => t,
        Err(msg) => {
            d.error(&ref_at, format!("{}: {msg}", file.display()));
            return None;
        }
    };
    let value = match schema_from_text(&text) {
        Ok(v) => v,
        Err(msg) => {
            d.error(&ref_at, format!("{}: {msg}", file.display()));
            return None;
        }
    };
    match check_schema(&value) {
        Ok(()) => Some(Json::from(value)),
        Err(p) => {
            let inner = if p.path.is_empty() {
                String::new()
            } else {
                format!(" at {}", p.path)
            };
            d.error(&ref_at, format!("{}{inner}: {}", file.display(), p.message));
            None
        }
    }
}

/// One policy attachment, with where it was written and the binding it came through.
struct Attachment<'a> {
    att: &'a PolicyAttachment,
    /// `None`: the agent file; `Some(id)`: the Tool document of that id.
    in_tool: Option<&'a str>,
    at: String,
    /// The dispatch ref of the binding it was attached through (`None` for default_policies).
    binding: Option<String>,
}

/// A compiled policy with the document it came from (for messages).
struct Sourced {
    policy: CompiledPolicy,
    /// Store key of the Policy document.
    origin: PathBuf,
    /// `namespace.name` of the document.
    id: String,
}

/// Compiles a validated authoring agent. `file` is the agent YAML (its directory is the bundle
/// root). Problems go to `out`; the result is only meaningful when no error was reported.
pub(crate) fn compile_agent(
    doc: &AgentDoc,
    src: &Source,
    file: &Path,
    out: &mut Vec<Diagnostic>,
) -> (CompiledAgent, Vec<Finding>) {
    let root = file
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let mut project = Project::load(&root, out);
    let instructions = compile_instructions(doc, &root, src, out);
    let tool_defaults = tool_default_attachments(&project);
    let (tools, attachments) = compile_bindings(doc, &project, &tool_defaults, src, out);
    let (policies, findings) = compile_policies(doc, &attachments, &tools, &mut project, src, out);
    let mut annotations = doc.metadata.annotations.clone();
    annotations.insert(ANNOTATION_POLICIES_COMPILED.to_owned(), "true".to_owned());
    if doc
        .spec
        .model
        .as_ref()
        .is_some_and(|m| m.provider == "stub")
        && let Some(text) = stub_script(&root, &tools, src, out)
    {
        annotations.insert(ANNOTATION_STUB_SCRIPT.to_owned(), text);
    }
    let output = doc.output.as_ref().map(|o| Output {
        format: o.format.clone(),
        schema: o.schema.as_ref().and_then(|s| {
            resolve_schema(&root, s, "output.schema", &mut src.diags(out)).map(inline_schema)
        }),
        strict: o.strict.unwrap_or(false),
        on_invalid: o.on_invalid.clone(),
    });
    let agent = assemble(doc, instructions, tools, policies, annotations, output);
    (agent, findings)
}

fn inline_schema(inline: Json) -> Schema {
    Schema {
        inline: Some(inline),
        ..Schema::default()
    }
}

/// The instructions, with a file ref resolved into inline text.
fn compile_instructions(
    doc: &AgentDoc,
    root: &Path,
    src: &Source,
    out: &mut Vec<Diagnostic>,
) -> Instructions {
    let mut instructions = Instructions::default();
    let Some(i) = &doc.spec.instructions else {
        return instructions;
    };
    if !blank(&i.text) {
        instructions.text = i.text.clone();
    } else if !blank(&i.reference) {
        let version = i.version.as_ref().map(|v| v.0.as_str());
        let at = "spec.instructions.ref";
        match resolve_file(root, &i.reference, version, RefKind::Instructions) {
            Ok(path) => match read_text_result(&path) {
                Ok(text) => match prompt_from_text(&path, &text) {
                    Ok(prompt) if prompt.is_empty() => {
                        let msg = format!("{} holds no instructions", path.display());
                        src.diags(out).error(at, msg);
                    }
                    Ok(prompt) => instructions.text = prompt,
                    Err(msg) => src
                        .diags(out)
                        .error(at, format!("{}: {msg}", path.display())),
                },
                Err(msg) => src
                    .diags(out)
                    .error(at, format!("{}: {msg}", path.display())),
            },
            Err(e) => src.diags(out).error(at, e.to_string()),
        }
    }
    instructions
}

/// Each Tool document's `default_policies` as attachments (kept apart so they can be borrowed).
fn tool_default_attachments(project: &Project) -> HashMap<String, Vec<PolicyAttachment>> {
    project
        .tools
        .iter()
        .map(|(id, t)| {
            let list = t
                .doc
                .spec
                .default_policies
                .iter()
                .cloned()
                .map(PolicyAttachment::Id);
            (id.clone(), list.collect())
        })
        .collect()
}

/// The compiled bindings (tools, then delegations) and every policy attachment, in the order
/// policies are loaded: `spec.default_policies` first, then each binding's.
fn compile_bindings<'a>(
    doc: &'a AgentDoc,
    project: &Project,
    tool_defaults: &'a HashMap<String, Vec<PolicyAttachment>>,
    src: &Source,
    out: &mut Vec<Diagnostic>,
) -> (Vec<ToolBinding>, Vec<Attachment<'a>>) {
    let spec = &doc.spec;
    let mut tools = Vec::new();
    let mut attachments: Vec<Attachment<'a>> = spec
        .default_policies
        .iter()
        .enumerate()
        .map(|(j, att)| Attachment {
            att,
            in_tool: None,
            at: format!("spec.default_policies[{j}]"),
            binding: None,
        })
        .collect();
    for (i, b) in spec.tools.iter().enumerate() {
        let Some((binding, tool_id)) = compile_binding(i, b, project, src, &project.root, out)
        else {
            continue;
        };
        let own = b.policies.iter().enumerate().map(|(j, att)| Attachment {
            att,
            in_tool: None,
            at: format!("spec.tools[{i}].policies[{j}]"),
            binding: Some(binding.reference.clone()),
        });
        if b.policies.is_empty() {
            // The Tool document's defaults apply only to bindings without policies of their own.
            if let Some((id, list)) = tool_id.and_then(|id| tool_defaults.get_key_value(&id)) {
                attachments.extend(list.iter().enumerate().map(|(j, att)| Attachment {
                    att,
                    in_tool: Some(id.as_str()),
                    at: format!("spec.default_policies[{j}]"),
                    binding: Some(binding.reference.clone()),
                }));
            }
        } else {
            attachments.extend(own);
        }
        tools.push(binding);
    }
    for (i, a) in spec.agents.iter().enumerate() {
        let Some(binding) = compile_delegation(i, a, src, &project.root, out) else {
            continue;
        };
        attachments.extend(a.policies.iter().enumerate().map(|(j, att)| Attachment {
            att,
            in_tool: None,
            at: format!("spec.agents[{i}].policies[{j}]"),
            binding: Some(binding.reference.clone()),
        }));
        tools.push(binding);
    }
    (tools, attachments)
}

/// Loads the attached Policy documents (each once, scoped), adds the authority boundaries, and
/// merges by scope. The result is checked by the policy engine.
fn compile_policies(
    doc: &AgentDoc,
    attachments: &[Attachment<'_>],
    tools: &[ToolBinding],
    project: &mut Project,
    src: &Source,
    out: &mut Vec<Diagnostic>,
) -> (Vec<CompiledPolicy>, Vec<Finding>) {
    let mut sourced: Vec<Sourced> = Vec::new();
    for a in attachments {
        let diag_src = match a.in_tool {
            None => src,
            Some(id) => match project.tools.get(id) {
                Some(t) => &t.src,
                None => continue,
            },
        };
        let Some(key) = attachment_key(a, &project.root, &mut project.store, diag_src, out) else {
            continue;
        };
        let Some(Some(entry)) = project.store.entries.get(&key) else {
            continue;
        };
        if !entry.valid {
            continue;
        }
        let md = &entry.doc.metadata;
        let id = format!("{}.{}", md.namespace, md.name);
        let has_allow = entry.doc.spec.allow.as_ref().is_some_and(|l| !l.is_empty());
        let scope = match (&a.binding, entry.doc.spec.scope.is_empty()) {
            (Some(binding), true) => format!("tool:{binding}"),
            // No scope means every tool of the agent. A compiled allow list names its scope:
            // runtimes refuse one without (§1.11), so the compiler writes `agent` out.
            (None, true) if has_allow => "agent".to_owned(),
            _ => entry.doc.spec.scope.clone(),
        };
        if let Some(prev) = sourced.iter().find(|s| s.policy.name == md.name) {
            let agent_wide = prev.policy.scope.is_empty() || prev.policy.scope == "agent";
            if prev.id != id {
                diag_src.diags(out).error(
                    &a.at,
                    format!(
                        "policy name {:?} is used by both {} and {id}; compiled policy names must \
                         be unique within an agent",
                        md.name, prev.id
                    ),
                );
            } else if prev.policy.scope != scope && !agent_wide {
                diag_src.diags(out).error(
                    &a.at,
                    format!(
                        "policy {id} has no spec.scope and is attached to several bindings ({} and \
                         {scope}); a compiled policy has one scope: set spec.scope, or attach it \
                         through spec.default_policies",
                        prev.policy.scope
                    ),
                );
            }
            continue;
        }
        sourced.push(Sourced {
            policy: compiled_from_doc(&entry.doc, scope),
            origin: key,
            id,
        });
    }

    // A delegation may be scoped by its child's name or by the name the model calls it
    // (`scope: tool:refund-specialist`, `tool:ask_refunds`): the compiled scope names the
    // binding's ref, which is what the runtime matches (a local delegation's ref is a path).
    for s in &mut sourced {
        let Some(target) = s.policy.scope.strip_prefix("tool:") else {
            continue;
        };
        if tools.iter().any(|t| t.reference == target) {
            continue;
        }
        let mut delegations = tools.iter().filter(|t| {
            t.agent
                .as_ref()
                .is_some_and(|a| a.child_name == target || t.wire_name() == target)
        });
        if let (Some(t), None) = (delegations.next(), delegations.next()) {
            s.policy.scope = format!("tool:{}", t.reference);
        }
    }

    // Scopes that name no bound tool never apply. An allow list scoped that way is an error:
    // runtimes refuse it at publish (§1.11, "references undeclared tool ref").
    let bound: Vec<&str> = tools.iter().map(|t| t.reference.as_str()).collect();
    for s in &sourced {
        if let Some(target) = s.policy.scope.strip_prefix("tool:")
            && !bound.contains(&target)
            && let Some(Some(entry)) = project.store.entries.get(&s.origin)
        {
            let mut d = entry.src.diags(out);
            if s.policy.allow.is_empty() {
                d.warning(
                    "spec.scope",
                    format!(
                        "tool {target:?} is not bound by agent {}/{}; the policy never applies",
                        doc.metadata.namespace, doc.metadata.name
                    ),
                );
            } else {
                d.error(
                    "spec.scope",
                    format!(
                        "references undeclared tool ref {target}: agent {}/{} does not bind it, \
                         so the allow list could never apply",
                        doc.metadata.namespace, doc.metadata.name
                    ),
                );
            }
        }
    }

    check_cedar_texts(&sourced, &project.store, tools, out);

    let subjects: Vec<Subject<'_>> = sourced
        .iter()
        .filter_map(|s| {
            let entry = project.store.entries.get(&s.origin)?.as_ref()?;
            Some(Subject {
                policy: &s.policy,
                src: &entry.src,
            })
        })
        .collect();
    let findings = analyze(&subjects, tools);

    // Authority boundaries, then the deny-wins merge.
    let mut policies: Vec<CompiledPolicy> = sourced.into_iter().map(|s| s.policy).collect();
    if let Some(g) = &doc.metadata.governance {
        for (j, boundary) in g.authority_boundaries.iter().enumerate() {
            if blank(boundary) {
                let at = format!("metadata.governance.authority_boundaries[{j}]");
                src.diags(out).error(&at, "must not be empty");
                continue;
            }
            policies.push(CompiledPolicy {
                name: format!("authority-boundary-{}", sanitize_name(boundary)),
                scope: "agent".to_owned(),
                action: "require_approval".to_owned(),
                authority_ref: boundary.clone(),
                approvals_required: 1,
                ..CompiledPolicy::default()
            });
        }
    }
    let (policies, merge_warnings) = merge_policies(policies);
    for w in merge_warnings {
        src.diags(out).warning("spec", w);
    }
    if let Err(errors) =
        phrony_policy::PolicySet::compile(policies.iter().map(|p| def_from_compiled(p, tools)))
    {
        // A Cedar text's (and its history facts') problems were placed in its Policy
        // document above.
        for e in errors.into_iter().filter(|e| !is_cedar_path(&e.path)) {
            let msg = format!("compiled policy {:?}: {}: {}", e.policy, e.path, e.kind);
            src.diags(out).error("spec", msg);
        }
    }
    (policies, findings)
}

/// Whether a compile error of a policy belongs to its Cedar text or its named history facts.
fn is_cedar_path(path: &str) -> bool {
    path == "cedar" || path.starts_with("cedar_history")
}

/// Cedar texts are validated against the input schemas of the tools in their scope; each
/// problem is placed in its Policy document, at its line and column inside `spec.cedar`.
fn check_cedar_texts(
    sourced: &[Sourced],
    store: &PolicyStore,
    tools: &[ToolBinding],
    out: &mut Vec<Diagnostic>,
) {
    for s in sourced {
        let (Some(cedar), Some(Some(entry))) = (&s.policy.cedar, store.entries.get(&s.origin))
        else {
            continue;
        };
        if let Err(errors) =
            phrony_policy::PolicySet::compile([def_from_compiled(&s.policy, tools)])
        {
            let mut d = entry.src.diags(out);
            for e in errors.into_iter().filter(|e| is_cedar_path(&e.path)) {
                match e.kind {
                    phrony_policy::CompileErrorKind::Cedar {
                        message,
                        offset: Some(offset),
                    } => cedar_error(&entry.src.text, cedar, offset, &message, &mut d),
                    kind => d.error(&crate::policy_bridge::doc_path(&e.path), kind.to_string()),
                }
            }
        }
    }
}

/// The store key of the Policy document an attachment names, loading it if needed.
fn attachment_key(
    a: &Attachment<'_>,
    root: &Path,
    store: &mut PolicyStore,
    diag_src: &Source,
    out: &mut Vec<Diagnostic>,
) -> Option<PathBuf> {
    match a.att {
        PolicyAttachment::Id(id) | PolicyAttachment::File(id) if blank(id) => None,
        PolicyAttachment::Id(id) => {
            let found = store.ids.get(id.trim()).cloned();
            if found.is_none() {
                let msg = format!(
                    "policy {:?} not found in bundle policies/{}",
                    id.trim(),
                    unreadable_note(&store.unreadable)
                );
                diag_src.diags(out).error(&a.at, msg);
            }
            found
        }
        PolicyAttachment::File(r) => match resolve_file(root, r, None, RefKind::Policy) {
            Ok(path) => Some(store.load(&path, out)),
            Err(e) => {
                diag_src
                    .diags(out)
                    .error(&format!("{}.ref", a.at), e.to_string());
                None
            }
        },
    }
}

/// Reads and checks `stub-script.json`, returning its raw text for the annotation.
fn stub_script(
    root: &Path,
    tools: &[ToolBinding],
    src: &Source,
    out: &mut Vec<Diagnostic>,
) -> Option<String> {
    let at = "spec.model.provider";
    let path = root.join(STUB_SCRIPT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            src.diags(out)
                .error(at, format!("read {STUB_SCRIPT_FILE}: {e}"));
            return None;
        }
    };
    let script = match StubScript::parse(&text) {
        Ok(s) => s,
        Err(e) => {
            src.diags(out).error(at, format!("{}: {e}", path.display()));
            return None;
        }
    };
    let wire: Vec<String> = tools.iter().map(ToolBinding::wire_name).collect();
    for name in script.tool_names() {
        if !wire.iter().any(|w| w == name) {
            let msg =
                format!("{STUB_SCRIPT_FILE} calls tool {name:?}, which the agent does not bind");
            src.diags(out).warning(at, msg);
        }
    }
    Some(text)
}

/// Builds the snapshot from the document and the compiled parts.
fn assemble(
    doc: &AgentDoc,
    instructions: Instructions,
    tools: Vec<ToolBinding>,
    policies: Vec<CompiledPolicy>,
    annotations: BTreeMap<String, String>,
    output: Option<Output>,
) -> CompiledAgent {
    let md = &doc.metadata;
    let spec = &doc.spec;
    let model = spec.model.clone().unwrap_or_default();
    let json_map = |m: &BTreeMap<String, serde_json::Value>| -> BTreeMap<String, Json> {
        m.iter()
            .map(|(k, v)| (k.clone(), Json::from(v.clone())))
            .collect()
    };
    CompiledAgent {
        api_version: doc.api_version.clone(),
        kind: doc.kind.clone(),
        metadata: Metadata {
            name: md.name.clone(),
            namespace: md.namespace.clone(),
            version: md.version.clone(),
            owner: md.owner.clone(),
            governance: md.governance.as_ref().map(|g| Governance {
                risk_tier: g.risk_tier.clone(),
                classifications: g.classifications.clone(),
                authority_boundaries: g.authority_boundaries.clone(),
                frameworks: json_map(&g.frameworks),
            }),
            labels: md.labels.clone(),
            annotations,
        },
        secrets: doc
            .secrets
            .iter()
            .flatten()
            .map(|(k, v)| {
                let from_env = v
                    .as_ref()
                    .map(|s| s.from_env.trim().to_owned())
                    .unwrap_or_default();
                (k.clone(), SecretRef { from_env })
            })
            .collect(),
        spec: AgentSpec {
            purpose: spec.purpose.clone(),
            instructions,
            model: Model {
                provider: model.provider.clone(),
                name: model.name.clone(),
                base_url: model.base_url.clone(),
                secret: model.secret.clone(),
                parameters: model.parameters.as_ref().map(|p| Parameters {
                    temperature: p.temperature,
                    top_p: p.top_p,
                    max_output_tokens: p.max_output_tokens.unwrap_or(0),
                    stop_sequences: p.stop_sequences.clone(),
                }),
                reasoning: model.reasoning.as_ref().map(|r| Reasoning {
                    effort: r.effort.clone(),
                }),
                provider_options: json_map(&model.provider_options),
            },
            tools,
            mcp_servers: spec
                .mcp_servers
                .iter()
                .map(|s| McpServer {
                    name: s.name.clone(),
                    url: s.url.clone(),
                    transport: s.transport.clone(),
                    auth: s.auth.as_ref().map(|a| McpAuth {
                        scheme: a.scheme.clone(),
                        header: a.header.clone(),
                        secret: a.secret.clone(),
                    }),
                })
                .collect(),
            policies,
            limits: spec.limits.as_ref().map(|l| Limits {
                max_tokens_per_run: l.max_tokens_per_run.unwrap_or(0),
                max_loop_iterations: l.max_loop_iterations.unwrap_or(0),
                max_wall_clock_seconds: l.max_wall_clock_seconds.unwrap_or(0),
                max_hitl_wait_minutes: l.max_hitl_wait_minutes.unwrap_or(0),
                max_subagent_depth: l.max_subagent_depth.unwrap_or(0),
                on_limit: l.on_limit.clone(),
            }),
        },
        output,
    }
}

/// What happens to a binding without a side-effect class, appended to the warnings that say so.
/// The snapshot keeps the class empty (as the reference does, so the content hash is unchanged);
/// the engine treats an empty class as the most dangerous one.
const UNCLASSIFIED_CONSEQUENCE: &str = ", so it is treated as irreversible_action: after a \
     crash its call waits for an operator's review and is never re-sent automatically";

/// Compiles `spec.tools[i]`: MCP bindings as written, catalog bindings merged with their Tool
/// document. Returns the binding and the Tool document id it merged with.
fn compile_binding(
    i: usize,
    b: &ToolBindingDoc,
    project: &Project,
    src: &Source,
    root: &Path,
    out: &mut Vec<Diagnostic>,
) -> Option<(ToolBinding, Option<String>)> {
    if blank(&b.reference) {
        return None;
    }
    let base = format!("spec.tools[{i}]");
    let own_schema = b.input_schema.as_ref().and_then(|s| {
        resolve_schema(
            root,
            s,
            &format!("{base}.input_schema"),
            &mut src.diags(out),
        )
    });
    let inline = |j: Option<Json>| {
        j.map(|inline| Schema {
            inline: Some(inline),
            ..Schema::default()
        })
    };
    let mut binding = ToolBinding {
        reference: b.reference.trim().to_owned(),
        wire_name: b.wire_name.clone(),
        description: b.description.clone(),
        side_effect_class: b.side_effect_class.clone(),
        timeout_ms: parse_timeout(&b.timeout).unwrap_or(0),
        ..ToolBinding::default()
    };
    if let Some(mcp) = &b.mcp {
        binding.input_schema = inline(own_schema);
        binding.mcp = Some(McpRef {
            server: mcp.server.clone(),
            tool: mcp.tool.clone(),
        });
        return Some((binding, None));
    }
    let tref = parse_tool_ref(&b.reference);
    match project.tools.get(tref.id) {
        Some(tool) => {
            if let Some(c) = tref.constraint
                && let Err(msg) = check_constraint(tref.id, &tool.doc.metadata.version, c)
            {
                src.diags(out).error(&format!("{base}.ref"), msg);
            }
            binding.reference = tref.id.to_owned();
            binding.version = tool.doc.metadata.version.clone();
            if binding.description.is_empty() {
                binding.description = tool.doc.spec.description.clone();
            }
            if binding.side_effect_class.is_empty() {
                binding.side_effect_class = tool.doc.spec.side_effect_class.clone();
            }
            if binding.timeout_ms == 0 {
                binding.timeout_ms = parse_timeout(&tool.doc.spec.timeout).unwrap_or(0);
            }
            if binding.side_effect_class.is_empty() {
                src.diags(out).warning(
                    &format!("{base}.ref"),
                    format!(
                        "binding {:?} has no side_effect_class (neither the binding nor its Tool \
                         document {} sets one){UNCLASSIFIED_CONSEQUENCE}; set spec.side_effect_class \
                         in the Tool document",
                        binding.wire_name(),
                        tool.src.path.display(),
                    ),
                );
            }
            binding.input_schema = inline(own_schema.or_else(|| tool.input_schema.clone()));
            Some((binding, Some(tref.id.to_owned())))
        }
        None => {
            if tref.constraint.is_some() {
                src.diags(out).error(
                    &format!("{base}.ref"),
                    format!(
                        "tool {:?} not found in bundle tools/{}",
                        tref.id,
                        unreadable_note(&project.unreadable_tools)
                    ),
                );
                return None;
            }
            let expected = crate::resolve::absolute(root)
                .join("tools")
                .join(format!("{}.yaml", tref.id));
            src.diags(out).warning(
                &format!("{base}.ref"),
                format!(
                    "no Tool document for {:?} (looked for {} and in every tools/*.yaml){}: binding {:?} is dispatched as \
                     version \"default\"{}",
                    tref.id,
                    expected.display(),
                    unreadable_note(&project.unreadable_tools),
                    binding.wire_name(),
                    if binding.side_effect_class.is_empty() {
                        format!(
                            " and has no side_effect_class{UNCLASSIFIED_CONSEQUENCE}; add the Tool \
                             document or set side_effect_class on the binding"
                        )
                    } else {
                        String::new()
                    }
                ),
            );
            binding.input_schema = inline(own_schema);
            Some((binding, None))
        }
    }
}

/// Compiles `spec.agents[i]` into an agent-backed binding (§1.18).
fn compile_delegation(
    i: usize,
    a: &SubagentDoc,
    src: &Source,
    root: &Path,
    out: &mut Vec<Diagnostic>,
) -> Option<ToolBinding> {
    let parsed = parse_delegation_ref(&a.reference).ok()?;
    let base = format!("spec.agents[{i}]");
    let schema = match &a.input_schema {
        Some(s) => resolve_schema(
            root,
            s,
            &format!("{base}.input_schema"),
            &mut src.diags(out),
        )?,
        None => Json::from(default_delegation_schema()),
    };
    let wire_name = if blank(&a.wire_name) {
        parsed.default_wire_name()
    } else {
        a.wire_name.clone()
    };
    let (reference, target) = match &parsed {
        DelegationRef::Local(rel) => {
            if !root.join(rel).is_file() {
                src.diags(out).error(
                    &format!("{base}.ref"),
                    format!(
                        "ref {:?} not found in bundle directory {}",
                        a.reference,
                        crate::resolve::absolute(root).display()
                    ),
                );
            }
            let child = rel
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (
                a.reference.trim().to_owned(),
                AgentTarget {
                    child_name: child,
                    late_bound: a.late_bound,
                    result: a.result.clone(),
                    ..AgentTarget::default()
                },
            )
        }
        DelegationRef::External {
            namespace,
            name,
            version,
        } => (
            format!("{namespace}.{name}"),
            AgentTarget {
                namespace: namespace.clone(),
                name: name.clone(),
                version: version.clone().unwrap_or_default(),
                child_name: name.clone(),
                late_bound: a.late_bound,
                result: a.result.clone(),
                ..AgentTarget::default()
            },
        ),
    };
    Some(ToolBinding {
        reference,
        wire_name,
        description: a.description.clone(),
        input_schema: Some(Schema {
            inline: Some(schema),
            ..Schema::default()
        }),
        side_effect_class: "non_idempotent_write".to_owned(),
        agent: Some(target),
        ..ToolBinding::default()
    })
}

/// A Policy document as a compiled policy with the given effective scope.
fn compiled_from_doc(doc: &PolicyDoc, scope: String) -> CompiledPolicy {
    let mut d = doc.spec.decision.clone().unwrap_or_default();
    if doc.spec.cedar.is_some() && d.kind.is_empty() {
        // A Cedar policy's decision block holds the approval Cedar's escalate asks for.
        d.kind = "require_approval".to_owned();
    }
    let n = d.approvals_required.unwrap_or(0);
    CompiledPolicy {
        name: doc.metadata.name.clone(),
        scope,
        action: d.kind.clone(),
        allow: doc.spec.allow.clone().unwrap_or_default(),
        conditions: doc
            .spec
            .conditions
            .clone()
            .filter(|c| !c.is_null() && c.as_object().is_none_or(|m| !m.is_empty()))
            .map(Json::from),
        authority_ref: d.authority_ref.clone(),
        approvals_required: if is_approval(&d.kind) { n.max(1) } else { n },
        reason: d.reason.clone(),
        on_reject: d.on_reject.clone(),
        on_modify: d.on_modify.clone(),
        comprehension_required: d.comprehension_required,
        allow_self_approval: d.allow_self_approval,
        timeout: d.timeout.as_ref().map(|t| PolicyTimeout {
            after_minutes: t.after_minutes.unwrap_or(0),
            default_decision: t.default.clone(),
        }),
        runtime: d
            .runtime
            .iter()
            .map(|(k, v)| (k.clone(), Json::from(v.clone())))
            .collect(),
        allow_field: doc.spec.allow_field.trim().to_owned(),
        // `enforce` is the default and stored as nothing, so the hash of an enforced policy is
        // the same whether or not its document says `mode: enforce`.
        mode: if doc.spec.mode == "shadow" {
            "shadow".to_owned()
        } else {
            String::new()
        },
        namespace: doc.metadata.namespace.clone(),
        version: doc.metadata.version.clone(),
        cedar: doc.spec.cedar.clone(),
        cedar_history: doc
            .spec
            .history
            .iter()
            .map(|(k, v)| (k.clone(), Json::from(v.clone())))
            .collect(),
        merged_from: Vec::new(),
    }
}

/// `authority-boundary-<sanitized>`: lower case, runs of other characters become `-`.
fn sanitize_name(s: &str) -> String {
    let mut out = String::new();
    for c in s.trim().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

fn timeout_rank(default: &str) -> u8 {
    match default {
        "" | "deny" => 3,
        "escalate" => 2,
        _ => 1,
    }
}

/// The deny-wins merge by scope (§1.9 step 4), then sorting by (scope, name). Returns the merged
/// list and warnings (allow lists with nothing in common).
pub(crate) fn merge_policies(policies: Vec<CompiledPolicy>) -> (Vec<CompiledPolicy>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut kept = Vec::new();
    // Groups keep first-seen order.
    let mut allow_groups: Vec<((String, String), Vec<CompiledPolicy>)> = Vec::new();
    let mut approval_groups: Vec<(String, Vec<CompiledPolicy>)> = Vec::new();
    for p in policies {
        // A shadow policy is never merged: it must stay apart to be reported by its own name
        // and must not change an enforced policy it would be merged with.
        if !p.mode.is_empty() || p.cedar.is_some() {
            // Nor is a Cedar policy: its effect is Cedar's, not its decision block's.
            kept.push(p);
        } else if p.action == "allow" && !p.allow.is_empty() && p.conditions.is_none() {
            let key = (p.scope.clone(), p.allow_field.clone());
            match allow_groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, g)) => g.push(p),
                None => allow_groups.push((key, vec![p])),
            }
        } else if p.action == "require_approval" && p.conditions.is_none() {
            match approval_groups.iter_mut().find(|(k, _)| *k == p.scope) {
                Some((_, g)) => g.push(p),
                None => approval_groups.push((p.scope.clone(), vec![p])),
            }
        } else {
            kept.push(p);
        }
    }
    for ((scope, field), mut group) in allow_groups {
        if group.len() == 1 {
            kept.extend(group.pop());
            continue;
        }
        let mut allow = group[0].allow.clone();
        for other in &group[1..] {
            allow.retain(|v| other.allow.iter().any(|o| o.eq_ignore_ascii_case(v)));
        }
        let sources: Vec<String> = group.iter().map(CompiledPolicy::qualified_name).collect();
        if allow.is_empty() {
            warnings.push(format!(
                "the allow lists of {} (scope {scope:?}) have no value in common: every call in \
                 that scope is denied",
                sources.join(", ")
            ));
            // Keep them apart so the engine denies with each policy's own message.
            kept.extend(group);
            continue;
        }
        kept.push(CompiledPolicy {
            name: format!("merged-allow-{scope}"),
            scope,
            action: "allow".to_owned(),
            allow,
            allow_field: field,
            merged_from: sources,
            ..CompiledPolicy::default()
        });
    }
    for (scope, mut group) in approval_groups {
        if group.len() == 1 {
            kept.extend(group.pop());
            continue;
        }
        let first_set = |f: fn(&CompiledPolicy) -> &String| {
            group
                .iter()
                .map(f)
                .find(|s| !s.is_empty())
                .cloned()
                .unwrap_or_default()
        };
        let timeouts: Vec<&PolicyTimeout> =
            group.iter().filter_map(|p| p.timeout.as_ref()).collect();
        let timeout = (!timeouts.is_empty()).then(|| PolicyTimeout {
            after_minutes: timeouts
                .iter()
                .map(|t| t.after_minutes)
                .filter(|m| *m > 0)
                .min()
                .unwrap_or(0),
            default_decision: timeouts
                .iter()
                .map(|t| t.default_decision.clone())
                .max_by_key(|d| timeout_rank(d))
                .unwrap_or_default(),
        });
        let merged = CompiledPolicy {
            name: format!("merged-approval-{scope}"),
            scope: scope.clone(),
            action: "require_approval".to_owned(),
            authority_ref: first_set(|p| &p.authority_ref),
            approvals_required: group
                .iter()
                .map(|p| p.approvals_required)
                .max()
                .unwrap_or(1)
                .max(1),
            reason: first_set(|p| &p.reason),
            on_reject: if group.iter().any(|p| p.on_reject == "fail") {
                "fail".to_owned()
            } else {
                first_set(|p| &p.on_reject)
            },
            on_modify: if group.iter().any(|p| p.on_modify == "revalidate") {
                "revalidate".to_owned()
            } else {
                first_set(|p| &p.on_modify)
            },
            comprehension_required: group.iter().any(|p| p.comprehension_required),
            // A merged approval opts out of separation of duties only when every merged
            // policy does (the safe choice).
            allow_self_approval: group.iter().all(|p| p.allow_self_approval),
            timeout,
            runtime: group
                .iter()
                .map(|p| &p.runtime)
                .find(|r| !r.is_empty())
                .cloned()
                .unwrap_or_else(BTreeMap::new),
            merged_from: group.iter().map(CompiledPolicy::qualified_name).collect(),
            ..CompiledPolicy::default()
        };
        kept.push(merged);
    }
    kept.sort_by(|a, b| (&a.scope, &a.name).cmp(&(&b.scope, &b.name)));
    (kept, warnings)
}
