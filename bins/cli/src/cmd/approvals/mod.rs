//! `phrony approvals …`: list, watch, show and decide the tool calls held for a human.
//!
//! Votes are recorded with the actor (`PHRONY_ACTOR`, else the OS user).

mod decide;
mod list;
mod show;
mod watch;

use std::io::{self, Write};

use phrony_client::{Approval, ApprovalFilter, Vote};
use serde_json::{Value, json};

use crate::cmd::{Global, agent_ref, render};

/// Subcommands of `phrony approvals`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List approvals, newest first (pending ones unless --status says otherwise).
    List(list::Args),
    /// Show one approval: the held call, its arguments, the policy and the votes.
    Show(show::Args),
    /// Vote to approve a pending approval (optionally with edited arguments).
    Approve(decide::ApproveArgs),
    /// Vote to reject a pending approval (one reject denies it). On an outcome review, a
    /// reject means --fail: recorded as outcome unknown, not re-sent.
    Reject(decide::RejectArgs),
    /// Resolve an outcome review (a call whose worker was lost: did it happen?):
    /// --happened [--result FILE], --fail, or --resend --confirm-not-happened.
    Resolve(decide::ResolveArgs),
    /// Print the pending approvals, then each change as it happens (opened, updated,
    /// decided), one line each, until interrupted.
    Watch(watch::Args),
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::List(args) => list::run(&args, global),
            Self::Show(args) => show::run(&args, global),
            Self::Approve(args) => decide::approve(&args, global),
            Self::Reject(args) => decide::reject(&args, global),
            Self::Resolve(args) => decide::resolve(&args, global),
            Self::Watch(args) => watch::run(&args, global),
        }
    }
}

/// The filters `approvals list` and `approvals watch` share.
#[derive(Debug, clap::Args)]
pub(crate) struct Scope {
    /// Only approvals routed to this route (e.g. a role).
    #[arg(long)]
    route: Option<String>,
    /// Only approvals of this session.
    #[arg(long, value_name = "SESSION_ID")]
    session_id: Option<String>,
    /// Only approvals of this agent's sessions: namespace/name.
    #[arg(long, value_name = "NS/NAME")]
    agent: Option<String>,
}

impl Scope {
    /// The filter these flags select (no status, limit or page): an empty flag value is an
    /// error naming the flag, not "every approval".
    fn filter(&self) -> anyhow::Result<ApprovalFilter> {
        let non_empty = |flag: &str, value: &Option<String>| -> anyhow::Result<Option<String>> {
            match value.as_deref().map(str::trim) {
                Some("") => anyhow::bail!("--{flag} must not be empty"),
                other => Ok(other.map(str::to_owned)),
            }
        };
        Ok(ApprovalFilter {
            route: non_empty("route", &self.route)?,
            session_id: non_empty("session-id", &self.session_id)?,
            agent: self
                .agent
                .as_deref()
                .map(|a| agent_ref::unversioned(a, ""))
                .transpose()?,
            ..ApprovalFilter::default()
        })
    }
}

/// An approval id argument: non-empty, without surrounding whitespace.
fn approval_id(input: &str) -> anyhow::Result<&str> {
    let id = input.trim();
    if id.is_empty() {
        anyhow::bail!("approval id must not be empty");
    }
    Ok(id)
}

/// `tool@version`.
fn tool(a: &Approval) -> String {
    if a.version.is_empty() {
        a.tool.clone()
    } else {
        format!("{}@{}", a.tool, a.version)
    }
}

/// The KIND column: `policy` or `review` (an outcome review).
fn kind(a: &Approval) -> &'static str {
    if a.is_outcome_review() {
        "review"
    } else {
        "policy"
    }
}

/// How to resolve an outcome review, for messages.
fn resolve_hint(id: &str) -> String {
    format!(
        "phrony approvals resolve {id} --happened [--result FILE.json] | --fail | --resend \
         --confirm-not-happened"
    )
}

/// The deciding policy: its `namespace/name@version`, else its name.
fn policy(a: &Approval) -> Option<&str> {
    a.policy_ref.as_deref().or(a.policy_name.as_deref())
}

/// `emad approved at 2025-01-31T09:30:00Z: "comment" (comprehension acknowledged)`. The line
/// starts with the bare name as it always did (scripts and the tutorial read it); how the
/// runtime knew the voter is [`voter_text`]'s line.
pub(crate) fn vote_text(v: &Vote) -> String {
    let mut line = format!("{} {}", v.decided_by, v.decision);
    if let Some(t) = v.created_at {
        line.push_str(&format!(" at {}", render::time(t)));
    }
    if let Some(comment) = &v.comment {
        line.push_str(&format!(": {comment:?}"));
    }
    if v.comprehension_acknowledged {
        line.push_str(" (comprehension acknowledged)");
    }
    line
}

/// `voter: emad (unverified)` or `voter: alice via approvals-ui`, printed under a vote whose
/// attribution says more than the bare name; `None` for a verified voter and for votes recorded
/// before attribution existed.
pub(crate) fn voter_text(v: &Vote) -> Option<String> {
    let display = v.voter_display();
    (display != v.decided_by).then(|| format!("voter: {display}"))
}

/// The proposed arguments as an `args:` block and, when an approver edited them, the arguments
/// that run as an `effective_args:` block (see [`write_json_block`]), each line after `indent`.
/// `approvals show` and the approval entries of `sessions inspect` print them so.
pub(crate) fn write_args(out: &mut impl Write, indent: &str, a: &Approval) -> io::Result<()> {
    write_json_block(out, indent, "args", &a.args)?;
    if let Some(edited) = &a.effective_args {
        write_json_block(out, indent, "effective_args", edited)?;
    }
    Ok(())
}

/// `key:` followed by the pretty JSON indented two more spaces, each line after `indent`.
pub(crate) fn write_json_block(
    out: &mut impl Write,
    indent: &str,
    key: &str,
    value: &Value,
) -> io::Result<()> {
    writeln!(out, "{indent}{key}:")?;
    let pretty = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    for line in pretty.lines() {
        writeln!(out, "{indent}  {line}")?;
    }
    Ok(())
}

/// An approval as a JSON document (`--output json` of `show`, `list` and `sessions inspect`).
pub(crate) fn approval_json(a: &Approval) -> Value {
    json!({
        "id": a.id,
        "kind": a.kind,
        "resolution": a.resolution,
        "status": a.status,
        "session_id": a.session_id,
        "call_id": a.call_id,
        "agent": a.agent_ref,
        "agent_version_id": a.agent_version_id,
        "tool": a.tool,
        "version": a.version,
        "args": a.args,
        "effective_args": a.effective_args,
        "route": a.route,
        "reason": a.reason,
        "policy": a.policy_ref,
        "policy_name": a.policy_name,
        "policy_runtime": a.policy_runtime,
        "authority_ref": a.authority_ref,
        "approvals_required": a.approvals_required,
        "approvals_received": a.approvals_received,
        "comprehension_required": a.comprehension_required,
        "on_reject": a.on_reject,
        "on_modify": a.on_modify,
        "call_hash": a.call_hash,
        "parent_approval_id": a.parent_approval_id,
        "created_at": render::json_time(a.created_at),
        "expires_at": render::json_time(a.expires_at),
        "decided_at": render::json_time(a.decided_at),
        "decided_by": a.decided_by,
        "decided_by_verification": a.decided_by_verification,
        "decided_by_via": a.decided_by_via,
        "decided_by_display": a.decided_by_display(),
        "allow_self_approval": a.allow_self_approval,
        "comment": a.comment,
        "votes": a.votes.iter().map(vote_json).collect::<Vec<_>>(),
    })
}

/// A vote in [`approval_json`]: the voter's bare name, how the runtime knew it (`verification`,
/// `via`) and how a person reads it (`display`).
fn vote_json(v: &Vote) -> Value {
    json!({
        "decided_by": v.decided_by,
        "verification": v.verification,
        "via": v.via,
        "display": v.voter_display(),
        "decision": v.decision,
        "comment": v.comment,
        "comprehension_acknowledged": v.comprehension_acknowledged,
        "created_at": render::json_time(v.created_at),
    })
}

#[cfg(test)]
mod tests {
    use super::Scope;

    fn scope(route: Option<&str>, session_id: Option<&str>, agent: Option<&str>) -> Scope {
        Scope {
            route: route.map(str::to_owned),
            session_id: session_id.map(str::to_owned),
            agent: agent.map(str::to_owned),
        }
    }

    #[test]
    fn list_and_watch_filters_trim_values_and_refuse_empty_ones_by_name() {
        let filter = scope(Some(" finance "), Some("s-1"), Some("support/refunds"))
            .filter()
            .unwrap();
        assert_eq!(filter.route.as_deref(), Some("finance"));
        assert_eq!(filter.session_id.as_deref(), Some("s-1"));
        let agent = filter.agent.unwrap();
        assert_eq!(
            (agent.namespace.as_str(), agent.name.as_str()),
            ("support", "refunds")
        );
        assert!(filter.status.is_none() && filter.limit.is_none());

        let none = scope(None, None, None).filter().unwrap();
        assert!(none.route.is_none() && none.session_id.is_none() && none.agent.is_none());

        let error = scope(Some("  "), None, None).filter().unwrap_err();
        assert_eq!(error.to_string(), "--route must not be empty");
        let error = scope(None, Some(""), None).filter().unwrap_err();
        assert_eq!(error.to_string(), "--session-id must not be empty");
        assert!(scope(None, None, Some("no-slash")).filter().is_err());
    }
}
