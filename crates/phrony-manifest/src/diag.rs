//! Compiler-style diagnostics: every problem of a file, each with its position and field path.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::yaml_pos::PosIndex;

/// How serious a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The manifest is rejected.
    Error,
    /// The manifest is accepted, but something looks wrong.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Error => "error",
            Self::Warning => "warning",
        })
    }
}

/// One problem found in a manifest file.
///
/// `line` and `column` are 1-based and point at the offending YAML node (the key or the value).
/// They are `0` when the problem has no position (for example a file that cannot be read); the
/// [`Display`](fmt::Display) form then leaves them out. Problems of a compiled snapshot
/// ([`CompiledAgent::validate`](crate::CompiledAgent::validate)) have no file either: `file` is
/// empty and `Display` prints `error: <path>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file the problem is in; empty for a compiled snapshot, which has no file.
    pub file: PathBuf,
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// 1-based column, 0 when unknown.
    pub column: usize,
    /// Field path inside the document, such as `spec.tools[1].side_effect_class`; empty for
    /// problems of the whole file.
    pub path: String,
    /// What is wrong, in the reference runtime's words where it has some.
    pub message: String,
}

impl Diagnostic {
    /// An error without a position (for problems of a whole file).
    pub(crate) fn file_error(file: &Path, path: &str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// An error in a compiled snapshot: a field path and a message, no file, no position.
    pub(crate) fn snapshot_error(path: &str, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            file: PathBuf::new(),
            line: 0,
            column: 0,
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// Whether this is an error (and not a warning).
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The one-line summary the reference CLI prints after `Error: `, without file or position:
    /// `<path>: <message>`; forbidden constructs read `parse manifest: <path> is not supported…`
    /// and messages that redirect to another command stand alone.
    pub fn summary(&self) -> String {
        if self.path.is_empty() || self.message.starts_with("bundle manifest:") {
            self.message.clone()
        } else if self.message.starts_with("is not supported") {
            format!("parse manifest: {} {}", self.path, self.message)
        } else {
            format!("{}: {}", self.path, self.message)
        }
    }
}

impl Diagnostic {
    /// A diagnostic about the field `path` (such as `spec.tools[1].mcp.tool`) of the YAML file
    /// `file`, positioned as validation positions its own (a missing field points at its
    /// nearest existing parent), for checks made outside this crate — `phrony agents validate
    /// --mcp` compares bindings with what their MCP servers list. Without a readable file the
    /// position is unknown (0).
    #[must_use]
    pub fn at_field(
        severity: Severity,
        file: &std::path::Path,
        path: &str,
        message: impl Into<String>,
    ) -> Self {
        let (line, column) = crate::yaml_input::read_text_file(file)
            .ok()
            .and_then(|src| crate::yaml_pos::PosIndex::parse(&src).ok())
            .map_or((0, 0), |(index, _)| {
                let mark = index.locate(path);
                (mark.line, mark.column)
            });
        Self {
            severity,
            file: file.to_path_buf(),
            line,
            column,
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.file.as_os_str().is_empty() {
            write!(f, "{}", self.file.display())?;
            if self.line > 0 {
                write!(f, ":{}:{}", self.line, self.column)?;
            }
            f.write_str(": ")?;
        }
        write!(f, "{}: ", self.severity)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// A non-empty list of diagnostics, returned when a manifest is rejected.
///
/// It holds at least one error, and may also hold the warnings found along the way.
/// `Display` prints one diagnostic per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(Vec<Diagnostic>);

impl Diagnostics {
    /// Wraps a list that is known to contain at least one error.
    pub(crate) fn new(list: Vec<Diagnostic>) -> Self {
        debug_assert!(list.iter().any(Diagnostic::is_error));
        Self(list)
    }

    /// One error.
    pub(crate) fn single(diag: Diagnostic) -> Self {
        Self(vec![diag])
    }

    /// All diagnostics, errors and warnings, in the order they were found.
    pub fn as_slice(&self) -> &[Diagnostic] {
        &self.0
    }

    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| d.is_error())
    }

    /// The warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter().filter(|d| !d.is_error())
    }

    /// Consumes the list.
    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.0
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Orders diagnostics like a compiler: files in the order they were first reported, then by
/// position.
pub(crate) fn sort_diagnostics(list: &mut [Diagnostic]) {
    let mut files: Vec<PathBuf> = Vec::new();
    for d in list.iter() {
        if !files.contains(&d.file) {
            files.push(d.file.clone());
        }
    }
    list.sort_by_key(|d| (files.iter().position(|f| *f == d.file), d.line, d.column));
}

/// Where validation rules report errors: the positioned diagnostics of an authoring file
/// ([`FileDiags`]) or the position-less ones of a compiled snapshot ([`SnapshotDiags`]). Rules
/// shared by both are written once against this trait.
pub(crate) trait Report {
    /// An error at the value of `path`.
    fn error(&mut self, path: &str, message: impl Into<String>);

    /// An error at the key of `path` (a key that must not be there, or a bad map key).
    fn key_error(&mut self, path: &str, message: impl Into<String>) {
        self.error(path, message);
    }
}

impl Report for FileDiags<'_> {
    fn error(&mut self, path: &str, message: impl Into<String>) {
        FileDiags::error(self, path, message);
    }

    fn key_error(&mut self, path: &str, message: impl Into<String>) {
        FileDiags::key_error(self, path, message);
    }
}

/// Collects the errors of a compiled snapshot, which has no file and no positions.
#[derive(Debug, Default)]
pub(crate) struct SnapshotDiags {
    list: Vec<Diagnostic>,
}

impl SnapshotDiags {
    /// `Ok` when nothing was reported.
    pub(crate) fn finish(self) -> Result<(), Diagnostics> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(Diagnostics::new(self.list))
        }
    }
}

impl Report for SnapshotDiags {
    fn error(&mut self, path: &str, message: impl Into<String>) {
        self.list.push(Diagnostic::snapshot_error(path, message));
    }
}

/// Collects the diagnostics of one file, placing each at its YAML node.
#[derive(Debug)]
pub(crate) struct FileDiags<'a> {
    file: &'a Path,
    pos: &'a PosIndex,
    out: &'a mut Vec<Diagnostic>,
}

impl<'a> FileDiags<'a> {
    pub(crate) fn new(file: &'a Path, pos: &'a PosIndex, out: &'a mut Vec<Diagnostic>) -> Self {
        Self { file, pos, out }
    }

    fn push(&mut self, severity: Severity, path: &str, message: String, key: bool) {
        let mark = if key {
            self.pos.locate_key(path)
        } else {
            self.pos.locate(path)
        };
        self.out.push(Diagnostic {
            severity,
            file: self.file.to_path_buf(),
            line: mark.line,
            column: mark.column,
            path: path.to_owned(),
            message,
        });
    }

    /// An error at the value of `path` (or its nearest existing ancestor).
    pub(crate) fn error(&mut self, path: &str, message: impl Into<String>) {
        self.push(Severity::Error, path, message.into(), false);
    }

    /// An error at the key of `path` (used for keys that must not be there).
    pub(crate) fn key_error(&mut self, path: &str, message: impl Into<String>) {
        self.push(Severity::Error, path, message.into(), true);
    }

    /// A warning at the value of `path`.
    pub(crate) fn warning(&mut self, path: &str, message: impl Into<String>) {
        self.push(Severity::Warning, path, message.into(), false);
    }

    /// A warning at the key of `path`.
    pub(crate) fn key_warning(&mut self, path: &str, message: impl Into<String>) {
        self.push(Severity::Warning, path, message.into(), true);
    }

    /// Where the node at `path` is (see `PosIndex::locate`).
    pub(crate) fn mark(&self, path: &str) -> crate::yaml_pos::Mark {
        self.pos.locate(path)
    }

    /// An error at an explicit 1-based position.
    pub(crate) fn error_at(&mut self, line: usize, column: usize, path: &str, message: String) {
        self.out.push(Diagnostic {
            severity: Severity::Error,
            file: self.file.to_path_buf(),
            line,
            column,
            path: path.to_owned(),
            message,
        });
    }

    /// Whether any error has been collected so far (in this file or before).
    pub(crate) fn has_errors(&self) -> bool {
        self.out.iter().any(Diagnostic::is_error)
    }
}
