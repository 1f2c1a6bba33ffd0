//! `phrony agents …`: agent manifests and the agent lifecycle on the runtime.
//!
//! `validate` and `diff`'s compilation are local; every other subcommand talks to the runtime
//! (`--runtime-addr`), and each change is recorded with the actor (`PHRONY_ACTOR`, else the OS
//! user).

mod active;
mod archive;
pub(crate) mod deploy;
mod deprecate;
mod diff;
mod history;
mod inspect;
mod ls;
mod mcp_check;
mod publish;
mod retire;
mod rollback;
mod validate;
mod versions;

use crate::cmd::Global;

/// Subcommands of `phrony agents`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Parse, validate and compile an agent manifest locally; warn about unset secret variables.
    /// With --mcp, also check the MCP-backed bindings against their servers' tools/list.
    Validate(validate::Args),
    /// Compile an agent manifest and publish it as an immutable version (does not activate it).
    Publish(publish::Args),
    /// Activate a published version: namespace/name@version.
    Deploy(deploy::Args),
    /// Re-activate the previously deployed version, or the one given with --to.
    Rollback(rollback::Args),
    /// List an agent's published versions with their status, newest first.
    Versions(versions::Args),
    /// Show an agent's active version, when and by whom it was deployed.
    Active(active::Args),
    /// Show an agent's deploy and rollback history, newest first.
    History(history::Args),
    /// Show one published version: content hash, publish time and actor, status.
    Inspect(inspect::Args),
    /// Compare a local manifest with a published version (unified diff of the compiled snapshots).
    Diff(diff::Args),
    /// Deprecate a version: it can no longer run (it can still be deployed).
    Deprecate(deprecate::Args),
    /// Retire a version: it can no longer be deployed, rolled back to, or run.
    Retire(retire::Args),
    /// Archive an agent: no new versions, deployments or runs; all versions are deprecated.
    Archive(archive::Args),
    /// List the agents in the catalog (archived ones included).
    Ls(ls::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Validate(args) => validate::run(&args),
            Self::Publish(args) => publish::run(&args, global),
            Self::Deploy(args) => deploy::run(&args, global),
            Self::Rollback(args) => rollback::run(&args, global),
            Self::Versions(args) => versions::run(&args, global),
            Self::Active(args) => active::run(&args, global),
            Self::History(args) => history::run(&args, global),
            Self::Inspect(args) => inspect::run(&args, global),
            Self::Diff(args) => diff::run(&args, global),
            Self::Deprecate(args) => deprecate::run(&args, global),
            Self::Retire(args) => retire::run(&args, global),
            Self::Archive(args) => archive::run(&args, global),
            Self::Ls(args) => ls::run(&args, global),
        }
    }
}
