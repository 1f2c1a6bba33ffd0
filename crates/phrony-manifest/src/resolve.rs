//! Bundle-relative file refs (§1.8): path safety, extension defaults, version candidates, and
//! loading prompts and schemas.
//!
//! The bundle root of an agent is the directory holding its YAML file.

use std::path::{Component, Path, PathBuf};

/// What a ref points at; decides the default extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefKind {
    /// `.yaml`, `.yml`, `.md`.
    Instructions,
    /// `.json`.
    Schema,
    /// `.yaml`, `.yml`.
    Policy,
}

impl RefKind {
    fn default_extensions(self) -> &'static [&'static str] {
        match self {
            Self::Instructions => &[".yaml", ".yml", ".md"],
            Self::Schema => &[".json"],
            Self::Policy => &[".yaml", ".yml"],
        }
    }
}

/// Why a ref did not resolve. `Display` is the message (the field path is added by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RefError {
    #[error("ref is required")]
    Empty,
    #[error("ref must be bundle-relative")]
    Absolute,
    #[error("ref path escapes bundle directory")]
    Escapes,
    #[error("ref {reference:?}{} not found in bundle directory {}", version_note(.version), .root.display())]
    NotFound {
        reference: String,
        version: Option<String>,
        root: PathBuf,
    },
}

fn version_note(v: &Option<String>) -> String {
    v.as_ref()
        .map(|v| format!(" (version {v:?})"))
        .unwrap_or_default()
}

/// Checks that `reference` is relative and stays inside the root, returning it normalized
/// (lexically: `.` dropped, `..` applied).
pub(crate) fn safe_relative(reference: &str) -> Result<PathBuf, RefError> {
    if reference.trim().is_empty() {
        return Err(RefError::Empty);
    }
    let path = Path::new(reference);
    if path.is_absolute() || path.has_root() || reference.starts_with('\\') {
        return Err(RefError::Absolute);
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(RefError::Escapes);
                }
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::Prefix(_) => return Err(RefError::Absolute),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(RefError::Escapes);
    }
    Ok(out)
}

/// The candidate files for a ref, in the order they are tried (§1.8).
pub(crate) fn candidates(
    reference: &str,
    version: Option<&str>,
    kind: RefKind,
) -> Result<Vec<PathBuf>, RefError> {
    let rel = safe_relative(reference)?;
    let rel_str = rel.to_string_lossy().into_owned();
    let (stem, exts): (String, Vec<String>) = match rel.extension() {
        Some(ext) => {
            let ext = format!(".{}", ext.to_string_lossy());
            (rel_str[..rel_str.len() - ext.len()].to_owned(), vec![ext])
        }
        None => (
            rel_str,
            kind.default_extensions()
                .iter()
                .map(|e| (*e).to_owned())
                .collect(),
        ),
    };
    let mut out = Vec::new();
    match version {
        Some(v) => {
            // A version is one path segment; it must not smuggle separators or `..` in.
            if v.contains(['/', '\\']) || v == ".." || v == "." {
                return Err(RefError::Escapes);
            }
            for pattern in [
                format!("{stem}-{v}"),
                format!("{stem}/{v}"),
                format!("{stem}/v{v}"),
            ] {
                for ext in &exts {
                    out.push(PathBuf::from(format!("{pattern}{ext}")));
                }
            }
        }
        None => {
            for ext in &exts {
                out.push(PathBuf::from(format!("{stem}{ext}")));
            }
        }
    }
    Ok(out)
}

/// Resolves a ref to an existing file under `root`.
pub(crate) fn resolve_file(
    root: &Path,
    reference: &str,
    version: Option<&str>,
    kind: RefKind,
) -> Result<PathBuf, RefError> {
    for candidate in candidates(reference, version, kind)? {
        let full = root.join(&candidate);
        if full.is_file() {
            return Ok(full);
        }
    }
    Err(RefError::NotFound {
        reference: reference.to_owned(),
        version: version.map(str::to_owned),
        root: absolute(root),
    })
}

/// `root` made absolute for messages (falls back to the path as given).
pub(crate) fn absolute(root: &Path) -> PathBuf {
    std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf())
}

/// Extracts a prompt from a file's text by its extension: `.md` → the whole file; `.yaml/.yml`
/// → key `text`, else key `content`, else the document as a string, else the raw file; other
/// extensions → the raw file. Always trimmed.
///
/// # Errors
/// A YAML prompt that uses an alias (refused like in every YAML input, see `yaml_input`): the
/// message says where.
pub(crate) fn prompt_from_text(path: &Path, raw: &str) -> Result<String, String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if matches!(ext.as_deref(), Some("yaml" | "yml")) {
        match crate::yaml_input::check_yaml(raw) {
            // Not YAML: the raw file is the prompt.
            Err(crate::YamlInputError::Syntax { .. }) => {}
            Err(e) => return Err(e.to_string()),
            Ok(()) => {
                if let Ok(value) = serde_yaml::from_str::<serde_yaml::Value>(raw) {
                    for key in ["text", "content"] {
                        if let Some(serde_yaml::Value::String(s)) = value.get(key) {
                            return Ok(s.trim().to_owned());
                        }
                    }
                    if let serde_yaml::Value::String(s) = value {
                        return Ok(s.trim().to_owned());
                    }
                }
            }
        }
    }
    Ok(raw.trim().to_owned())
}

/// Parses a schema file: valid JSON holding a non-empty object.
pub(crate) fn schema_from_text(raw: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| format!("invalid JSON: {e}"))?;
    match &value {
        serde_json::Value::Object(m) if !m.is_empty() => Ok(value),
        _ => Err("schema must be a non-empty JSON object".to_owned()),
    }
}

/// The `*.yaml` / `*.yml` files directly inside `dir`, sorted by name. A missing directory is
/// empty.
pub(crate) fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if is_yaml && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: Vec<PathBuf>) -> Vec<String> {
        v.into_iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn unsafe_refs_are_refused() {
        assert_eq!(safe_relative("/etc/passwd"), Err(RefError::Absolute));
        assert_eq!(safe_relative("../x.json"), Err(RefError::Escapes));
        assert_eq!(safe_relative("a/../../x.json"), Err(RefError::Escapes));
        assert_eq!(safe_relative("a/.."), Err(RefError::Escapes));
        assert_eq!(safe_relative(""), Err(RefError::Empty));
        assert_eq!(
            safe_relative("./a/./b/../c.md").unwrap(),
            PathBuf::from("a/c.md")
        );
    }

    #[test]
    fn candidates_follow_extension_and_version_rules() {
        assert_eq!(
            names(candidates("prompts/system", None, RefKind::Instructions).unwrap()),
            [
                "prompts/system.yaml",
                "prompts/system.yml",
                "prompts/system.md"
            ]
        );
        assert_eq!(
            names(candidates("s/in.json", None, RefKind::Schema).unwrap()),
            ["s/in.json"]
        );
        assert_eq!(
            names(candidates("s/in", Some("2"), RefKind::Schema).unwrap()),
            ["s/in-2.json", "s/in/2.json", "s/in/v2.json"]
        );
        assert_eq!(
            names(candidates("p/x.md", Some("1.1"), RefKind::Instructions).unwrap()),
            ["p/x-1.1.md", "p/x/1.1.md", "p/x/v1.1.md"]
        );
        assert_eq!(
            candidates("s/in", Some("../x"), RefKind::Schema),
            Err(RefError::Escapes)
        );
    }

    #[test]
    fn prompts_are_extracted_by_extension() {
        let prompt = |file: &str, text: &str| prompt_from_text(Path::new(file), text).unwrap();
        assert_eq!(prompt("a.md", "  hi\n\n"), "hi");
        assert_eq!(prompt("a.yaml", "text: |\n  hello\n"), "hello");
        assert_eq!(prompt("a.yml", "content: c\n"), "c");
        assert_eq!(prompt("a.yaml", "just a string\n"), "just a string");
        assert_eq!(prompt("a.yaml", "other: 1\n"), "other: 1");
        assert_eq!(prompt("a.yaml", "text: [\n"), "text: [");
        assert_eq!(prompt("a.txt", " raw \n"), "raw");
        // A Markdown prompt may contain anything; a YAML one may not use aliases.
        assert_eq!(prompt("a.md", "*b"), "*b");
        let err = prompt_from_text(Path::new("a.yaml"), "b: &b hi\ntext: *b\n").unwrap_err();
        assert!(
            err.starts_with("line 2 column 7: YAML aliases are not supported"),
            "{err}"
        );
    }

    #[test]
    fn schemas_must_be_non_empty_objects() {
        assert!(schema_from_text(r#"{"type":"object"}"#).is_ok());
        assert_eq!(
            schema_from_text("{}").unwrap_err(),
            "schema must be a non-empty JSON object"
        );
        assert_eq!(
            schema_from_text("[1]").unwrap_err(),
            "schema must be a non-empty JSON object"
        );
        assert!(
            schema_from_text("{")
                .unwrap_err()
                .starts_with("invalid JSON: ")
        );
    }
}
