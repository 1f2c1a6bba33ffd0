//! Shared helpers: fixture paths, expectation parsing, temporary projects.

use std::path::{Path, PathBuf};

use phrony_manifest::{Compiled, Diagnostic, Diagnostics, load_agent};

/// `tests/fixtures/<rel>`.
pub(crate) fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// `L:C path: message`, with `dir` written as `<dir>`.
pub(crate) fn render(d: &Diagnostic, dir: &Path) -> String {
    let path = if d.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", d.path)
    };
    let msg = d.message.replace(&dir.display().to_string(), "<dir>");
    format!("{}:{} {path}{msg}", d.line, d.column)
}

/// The `# expect:` and `# warn:` lines of a fixture, sorted.
pub(crate) fn expectations(path: &Path) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut marked = false;
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("# expect: ") {
            errors.push(e.to_owned());
        } else if let Some(w) = line.strip_prefix("# warn: ") {
            warnings.push(w.to_owned());
        } else if line.starts_with("# valid:") {
            marked = true;
        }
    }
    assert!(
        marked || !errors.is_empty() || !warnings.is_empty(),
        "{} has no expectations",
        path.display()
    );
    errors.sort();
    warnings.sort();
    (errors, warnings)
}

/// Every diagnostic of a load, errors and warnings apart.
pub(crate) fn all_diags(result: &Result<Compiled, Diagnostics>) -> Vec<Diagnostic> {
    match result {
        Ok(c) => c.warnings.clone(),
        Err(d) => d.as_slice().to_vec(),
    }
}

/// Compares the diagnostics located in `file` with its expectations; diagnostics in other
/// files are failures.
pub(crate) fn assert_matches_expectations(file: &Path, dir: &Path, diags: &[Diagnostic]) {
    let (want_errors, want_warnings) = expectations(file);
    let stray: Vec<String> = diags
        .iter()
        .filter(|d| d.file != file)
        .map(ToString::to_string)
        .collect();
    assert!(
        stray.is_empty(),
        "{}: diagnostics in other files:\n{}",
        file.display(),
        stray.join("\n")
    );
    let mut errors: Vec<String> = diags
        .iter()
        .filter(|d| d.is_error())
        .map(|d| render(d, dir))
        .collect();
    let mut warnings: Vec<String> = diags
        .iter()
        .filter(|d| !d.is_error())
        .map(|d| render(d, dir))
        .collect();
    errors.sort();
    warnings.sort();
    assert_eq!(errors, want_errors, "errors of {}", file.display());
    assert_eq!(warnings, want_warnings, "warnings of {}", file.display());
}

/// The YAML fixtures of a directory (not recursive), sorted.
pub(crate) fn yaml_fixtures(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

/// A minimal valid agent, for projects built around one Tool or Policy document.
pub(crate) const MINIMAL_AGENT: &str = "\
apiVersion: phrony.com/v1
kind: Agent
metadata: {name: a, namespace: demo, version: 1.0.0}
spec:
  purpose: Host a document under test.
  instructions: {text: hi}
  model: {provider: openai, name: gpt-4o}
";

/// A temporary project directory.
pub(crate) struct Project {
    pub(crate) dir: tempfile::TempDir,
}

impl Project {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file, creating directories.
    pub(crate) fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Copies a fixture into the project.
    pub(crate) fn copy(&self, from: &Path, rel: &str) -> PathBuf {
        let text = std::fs::read_to_string(from).unwrap();
        self.write(rel, &text)
    }

    /// Loads an agent; whatever compiles must also pass the runtime's snapshot validation.
    pub(crate) fn load(&self, rel: &str) -> Result<Compiled, Diagnostics> {
        validated(load_agent(self.path(rel)))
    }
}

/// Checks that a successful compilation yields a snapshot the runtime accepts: Publish runs
/// [`CompiledAgent::validate`](phrony_manifest::CompiledAgent::validate) on what the CLI sends.
pub(crate) fn validated(result: Result<Compiled, Diagnostics>) -> Result<Compiled, Diagnostics> {
    if let Ok(compiled) = &result
        && let Err(problems) = compiled.agent.validate()
    {
        panic!(
            "{} compiles, but its snapshot does not validate:\n{problems}",
            compiled.agent.qualified_name()
        );
    }
    result
}
