//! `phrony init [DIR]`: scaffold the refund-agent project of the tutorial.
//!
//! The files are the ones of `policies-examples/refund-agent/`, embedded at build time, so the
//! scaffold, the example and its test cases can never drift apart. Nothing is overwritten: every
//! target is checked before the first file is written, files are created exclusively, and a failed
//! write removes what this run created.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

/// One scaffolded file: its path relative to the project directory and its content.
struct Template {
    path: &'static str,
    content: &'static str,
}

/// The project `phrony init` writes, in the order it writes (and prints) them.
const TEMPLATES: &[Template] = &[
    Template {
        path: "agent.yaml",
        content: include_str!("../../../../policies-examples/refund-agent/agent.yaml"),
    },
    Template {
        path: "tools/orders.lookup-order.yaml",
        content: include_str!(
            "../../../../policies-examples/refund-agent/tools/orders.lookup-order.yaml"
        ),
    },
    Template {
        path: "tools/payments.issue-refund.yaml",
        content: include_str!(
            "../../../../policies-examples/refund-agent/tools/payments.issue-refund.yaml"
        ),
    },
    Template {
        path: "policies/refund-approval-boundary.yaml",
        content: include_str!(
            "../../../../policies-examples/refund-agent/policies/refund-approval-boundary.yaml"
        ),
    },
    Template {
        path: "policies/refund-hard-limit.yaml",
        content: include_str!(
            "../../../../policies-examples/refund-agent/policies/refund-hard-limit.yaml"
        ),
    },
    Template {
        path: "worker.py",
        content: include_str!("../../../../policies-examples/refund-agent/worker.py"),
    },
];

/// Arguments of `phrony init`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Project directory (created if missing).
    #[arg(default_value = ".")]
    dir: PathBuf,
}

/// Writes the scaffold into `args.dir`, refusing if any of its files already exists.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let targets: Vec<(PathBuf, &Template)> = TEMPLATES
        .iter()
        .map(|t| (args.dir.join(t.path), t))
        .collect();

    let existing: Vec<String> = targets
        .iter()
        .filter(|(path, _)| path.symlink_metadata().is_ok())
        .map(|(path, _)| path.display().to_string())
        .collect();
    if !existing.is_empty() {
        bail!(
            "refusing to overwrite existing files (nothing was written): {}",
            existing.join(", ")
        );
    }

    let mut created_files: Vec<PathBuf> = Vec::new();
    let mut created_dirs: Vec<PathBuf> = Vec::new();
    let written = targets.iter().try_for_each(|(path, template)| {
        create_parents(path, &mut created_dirs)?;
        write_new(path, template.content)?;
        created_files.push(path.clone());
        Ok::<_, anyhow::Error>(())
    });
    if let Err(err) = written {
        // Best effort: leave the directory as it was. The original error is what matters.
        for file in created_files.iter().rev() {
            let _ = fs::remove_file(file);
        }
        for dir in created_dirs.iter().rev() {
            let _ = fs::remove_dir(dir);
        }
        return Err(err);
    }

    let mut stdout = io::stdout().lock();
    for path in &created_files {
        writeln!(stdout, "created {}", path.display())?;
    }
    Ok(())
}

/// Creates the missing ancestors of `path`, remembering each directory it created.
fn create_parents(path: &Path, created: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let missing: Vec<&Path> = parent
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .collect();
    for dir in missing.into_iter().rev() {
        fs::create_dir(dir).with_context(|| format!("create directory {}", dir.display()))?;
        created.push(dir.to_path_buf());
    }
    Ok(())
}

/// Writes `content` to a file that must not exist yet.
fn write_new(path: &Path, content: &str) -> anyhow::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    file.write_all(content.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("write {}", path.display()))
}
