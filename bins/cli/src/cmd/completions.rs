//! `phrony completions SHELL` and `phrony man`: shell completions and man pages generated from
//! the command tree itself (clap_complete, clap_mangen), so they never fall behind the flags.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::cmd::Cli;

/// Arguments of `phrony completions`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Prints the completion script for the shell on stdout
/// (e.g. `phrony completions bash > /etc/bash_completion.d/phrony`).
pub(crate) fn completions(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "phrony", &mut out);
    std::io::stdout()
        .lock()
        .write_all(&out)
        .context("write the completion script")
}

/// Arguments of `phrony man`.
#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// Write one page per command (`phrony.1`, `phrony-agents.1`, `phrony-agents-deploy.1`, …)
    /// into this directory instead of printing `phrony.1` on stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints `phrony(1)` on stdout, or writes every command's page into `--dir`.
pub(crate) fn man(args: &ManArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    // Built: the global flags (--runtime-addr, --token, …) appear on every command's page.
    command.build();
    match &args.dir {
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut out)
                .context("render phrony.1")?;
            std::io::stdout()
                .lock()
                .write_all(&out)
                .context("write phrony.1")
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            let written = write_pages(&command, "phrony", dir)?;
            println!("wrote {written} man pages to {}", dir.display());
            Ok(())
        }
    }
}

/// Writes the page of `command` (named `name`) and of every subcommand under it; returns how
/// many pages were written.
fn write_pages(command: &clap::Command, name: &str, dir: &Path) -> anyhow::Result<usize> {
    let page = command
        .clone()
        .display_name(name.to_owned())
        .bin_name(name.replace('-', " "));
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .title(name)
        .source(format!("phrony {}", env!("CARGO_PKG_VERSION")))
        .render(&mut out)
        .with_context(|| format!("render {name}.1"))?;
    std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
    let mut written = 1;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        written += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}
