//! Reading one YAML document: syntax, positions, kind, typed parse and unknown keys.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::diag::{Diagnostic, FileDiags};
use crate::model::common::nd;
use crate::yaml_pos::{PosIndex, child_index, child_key};

/// The text of a YAML file and the positions of its nodes.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) pos: PosIndex,
}

impl Source {
    /// Diagnostics placed in this file.
    pub(crate) fn diags<'a>(&'a self, out: &'a mut Vec<Diagnostic>) -> FileDiags<'a> {
        FileDiags::new(&self.path, &self.pos, out)
    }
}

/// How unknown keys are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownKeys {
    /// Lenient kinds (Agent, Tool, Bundle): a warning, except inside `secrets.<name>`.
    Warn,
    /// Strict kinds (Policy): an error.
    Error,
}

/// Reads a text file, turning IO problems into a diagnostic.
pub(crate) fn read_text(path: &Path, out: &mut Vec<Diagnostic>) -> Option<String> {
    match read_text_result(path) {
        Ok(text) => Some(text),
        Err(msg) => {
            out.push(Diagnostic::file_error(path, "", msg));
            None
        }
    }
}

/// Reads a text file (at most [`MAX_YAML_BYTES`](crate::MAX_YAML_BYTES), 8 MiB, of UTF-8); the
/// error is a message.
pub(crate) fn read_text_result(path: &Path) -> Result<String, String> {
    crate::yaml_input::read_text_file(path).map_err(|e| e.to_string())
}

/// Reads and indexes a YAML file. Syntax errors, duplicate keys and extra documents become
/// diagnostics; `None` means the file cannot be used further.
pub(crate) fn load_source(path: &Path, out: &mut Vec<Diagnostic>) -> Option<Source> {
    let text = read_text(path, out)?;
    source_from_text(path, text, out)
}

/// Like [`load_source`] for text already in memory.
pub(crate) fn source_from_text(
    path: &Path,
    text: String,
    out: &mut Vec<Diagnostic>,
) -> Option<Source> {
    match PosIndex::parse(&text) {
        Err(e) => {
            out.push(Diagnostic {
                severity: crate::diag::Severity::Error,
                file: path.to_path_buf(),
                line: e.mark.line,
                column: e.mark.column,
                path: String::new(),
                message: format!("invalid YAML: {}", e.message),
            });
            None
        }
        Ok((pos, issues)) => {
            let src = Source {
                path: path.to_path_buf(),
                text,
                pos,
            };
            if issues.is_empty() {
                Some(src)
            } else {
                let mut d = FileDiags::new(&src.path, &src.pos, out);
                for i in issues {
                    d.error_at(i.mark.line, i.mark.column, &i.path, i.message);
                }
                None
            }
        }
    }
}

#[derive(Deserialize)]
struct KindProbe {
    #[serde(default, deserialize_with = "nd")]
    kind: String,
}

/// The document's `kind`, or `None` when the document is empty or not a mapping.
pub(crate) fn probe_kind(src: &Source) -> Option<String> {
    serde_yaml::from_str::<KindProbe>(&src.text)
        .ok()
        .map(|p| p.kind)
}

/// Whether the document holds nothing (only comments or whitespace).
pub(crate) fn is_empty_document(src: &Source) -> bool {
    matches!(
        serde_yaml::from_str::<serde_yaml::Value>(&src.text),
        Ok(serde_yaml::Value::Null)
    )
}

/// Typed parse. Type errors become one diagnostic at the offending node; unknown keys become
/// warnings or errors per `unknown` (always errors inside `secrets.<name>`).
pub(crate) fn parse_typed<T: DeserializeOwned>(
    src: &Source,
    unknown: UnknownKeys,
    out: &mut Vec<Diagnostic>,
) -> Option<T> {
    if is_empty_document(src) {
        src.diags(out).error("", "the document is empty");
        return None;
    }
    let mut ignored: Vec<String> = Vec::new();
    let de = serde_yaml::Deserializer::from_str(&src.text);
    let parsed: Result<T, _> =
        serde_ignored::deserialize(de, |path| ignored.push(ignored_path(&path)));
    let mut d = src.diags(out);
    for path in ignored {
        let key = path.rsplit(['.', ']']).next().unwrap_or(&path).to_owned();
        if path
            .strip_prefix("secrets.")
            .is_some_and(|p| p.contains('.'))
        {
            if key == "value" || key == "plaintext" {
                d.key_error(
                    &path,
                    format!("{key:?} is not allowed in secret definitions"),
                );
            } else {
                d.key_error(&path, format!("unknown field {key:?}"));
            }
            continue;
        }
        match unknown {
            UnknownKeys::Error => d.key_error(&path, format!("unknown field {key:?}")),
            UnknownKeys::Warn => {
                d.key_warning(&path, format!("unknown field {key:?} is ignored"));
            }
        }
    }
    match parsed {
        Ok(doc) => Some(doc),
        Err(e) => {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            let mut msg = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            if let Some(stripped) = msg.strip_suffix(&suffix) {
                msg = stripped.to_owned();
            }
            let (path, message) = match msg.split_once(": ") {
                Some((p, m)) if !p.contains(' ') => (p.to_owned(), m.to_owned()),
                _ => (String::new(), msg),
            };
            if line > 0 {
                d.error_at(line, column, &path, message);
            } else {
                d.error(&path, message);
            }
            None
        }
    }
}

/// Formats a serde_ignored path like our field paths: `spec.tools[0].foo`.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => child_index(&ignored_path(parent), *index),
        Path::Map { parent, key } => child_key(&ignored_path(parent), key),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}
