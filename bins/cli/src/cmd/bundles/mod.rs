//! `phrony bundles …`: bundles of agents, locally (`lock`, `validate`) and on the runtime.
//!
//! A bundle is named like an agent (`namespace/name[@version]`, with the agents' reference
//! messages); a version is its semver label or its `sha256:` lock hash. Every subcommand but
//! `lock` and `validate` talks to the runtime (`--runtime-addr`; `lock` does too, only when the
//! closure has external members, to read their published content hashes), and each change is
//! recorded with the actor (`PHRONY_ACTOR`, else the OS user).

mod active;
pub(crate) mod deploy;
mod history;
mod inspect;
mod lock;
mod ls;
mod publish;
mod rollback;
mod run;
mod secret_requirements;
mod validate;
mod versions;

#[cfg(test)]
mod testing;

use crate::cmd::Global;

/// Subcommands of `phrony bundles`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Walk the bundle's closure and write bundle.lock.json beside the bundle manifest.
    Lock(lock::Args),
    /// Walk the bundle's closure and check it against the committed bundle.lock.json.
    Validate(validate::Args),
    /// Publish a locked bundle as an immutable version (does not activate it).
    Publish(publish::Args),
    /// Activate a published version: namespace/name@version (semver or sha256: lock hash).
    Deploy(deploy::Args),
    /// Re-activate the previously deployed version, or the one given with --to.
    Rollback(rollback::Args),
    /// Show a bundle's active version, when and by whom it was deployed.
    Active(active::Args),
    /// List a bundle's published versions, newest first, the active one marked.
    Versions(versions::Args),
    /// Show a bundle's deploy and rollback history, newest first.
    History(history::Args),
    /// List the bundles in the catalog.
    Ls(ls::Args),
    /// Show one published version (default: the active one): lock hash, publisher, members.
    Inspect(inspect::Args),
    /// List the secrets a bundle version's members declare (what `bundles run` resolves).
    SecretRequirements(secret_requirements::Args),
    /// Start a session of a bundle's active deployment (its root agent).
    Run(run::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Lock(args) => lock::run(&args, global),
            Self::Validate(args) => validate::run(&args),
            Self::Publish(args) => publish::run(&args, global),
            Self::Deploy(args) => deploy::run(&args, global),
            Self::Rollback(args) => rollback::run(&args, global),
            Self::Active(args) => active::run(&args, global),
            Self::Versions(args) => versions::run(&args, global),
            Self::History(args) => history::run(&args, global),
            Self::Ls(args) => ls::run(&args, global),
            Self::Inspect(args) => inspect::run(&args, global),
            Self::SecretRequirements(args) => secret_requirements::run(&args, global),
            Self::Run(args) => run::run(&args, global),
        }
    }
}
