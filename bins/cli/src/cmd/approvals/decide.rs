//! `phrony approvals approve ID` and `phrony approvals reject ID`: vote on a pending approval;
//! `phrony approvals resolve ID`: resolve an outcome review (did the call already happen?).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use phrony_client::{DecideApproval, Decision};
use serde_json::{Value, json};

use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony approvals approve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ApproveArgs {
    /// The approval id.
    approval_id: String,
    /// A comment recorded with the vote.
    #[arg(long)]
    comment: Option<String>,
    /// Approve with these arguments instead of the proposed ones (a JSON object in a file).
    #[arg(long, value_name = "FILE.json")]
    args: Option<PathBuf>,
    /// Acknowledge that you understood the call (required when the policy asks for it).
    #[arg(long)]
    comprehension: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Arguments of `phrony approvals reject`.
#[derive(Debug, clap::Args)]
pub(crate) struct RejectArgs {
    /// The approval id.
    approval_id: String,
    /// A comment recorded with the vote.
    #[arg(long)]
    comment: Option<String>,
    /// Acknowledge that you understood the call (required when the policy asks for it).
    #[arg(long)]
    comprehension: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Arguments of `phrony approvals resolve`: exactly one resolution.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("resolution").required(true).args(["happened", "fail", "resend"])))]
pub(crate) struct ResolveArgs {
    /// The approval id (an outcome review).
    approval_id: String,
    /// It happened: record the call as succeeded (attributed to you), not sent again.
    #[arg(long)]
    happened: bool,
    /// With --happened: the call's result as you know it (a JSON document in a file).
    #[arg(long, value_name = "FILE.json", requires = "happened")]
    result: Option<PathBuf>,
    /// Do not send it again: record the call as failed, outcome unknown (it may have happened).
    #[arg(long)]
    fail: bool,
    /// It did not happen: send the call to a worker again. Requires --confirm-not-happened.
    #[arg(long, requires = "confirm_not_happened")]
    resend: bool,
    /// With --resend: you checked that the call did not take effect (a resend repeats it).
    #[arg(long, requires = "resend")]
    confirm_not_happened: bool,
    /// A comment recorded with the resolution.
    #[arg(long)]
    comment: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Votes to approve. An outcome review is not approved: it is refused here with the resolve
/// command to use (the runtime refuses it too).
pub(crate) fn approve(args: &ApproveArgs, global: &Global) -> anyhow::Result<()> {
    let id = super::approval_id(&args.approval_id)?;
    let vote = DecideApproval {
        approval_id: id.to_owned(),
        decision: Decision::Approve,
        comment: args.comment.clone().filter(|c| !c.is_empty()),
        args: args.args.as_deref().map(read_args).transpose()?,
        comprehension_acknowledged: args.comprehension,
        resolution: None,
        result: None,
    };
    // The runtime refuses a plain approve on an outcome review (nothing is recorded); the CLI
    // adds the command that resolves it. One request: the refusal is the server's, not a
    // separate look-up that could disagree with it.
    decide(&vote, args.output, global, "approve").map_err(|e| {
        if format!("{e:#}").contains("is an outcome review") {
            e.context(format!(
                "approval {id} is an outcome review, not a policy approval; resolve it with: {}",
                super::resolve_hint(id)
            ))
        } else {
            e
        }
    })
}

/// Resolves an outcome review.
pub(crate) fn resolve(args: &ResolveArgs, global: &Global) -> anyhow::Result<()> {
    let (resolution, decision) = if args.happened {
        ("happened", Decision::Approve)
    } else if args.resend {
        ("resend", Decision::Approve)
    } else {
        ("fail", Decision::Reject)
    };
    let vote = DecideApproval {
        approval_id: super::approval_id(&args.approval_id)?.to_owned(),
        decision,
        comment: args.comment.clone().filter(|c| !c.is_empty()),
        args: None,
        comprehension_acknowledged: false,
        resolution: Some(resolution.to_owned()),
        result: args.result.as_deref().map(read_result).transpose()?,
    };
    decide(&vote, args.output, global, "resolve")
}

/// Votes to reject.
pub(crate) fn reject(args: &RejectArgs, global: &Global) -> anyhow::Result<()> {
    let vote = DecideApproval {
        approval_id: super::approval_id(&args.approval_id)?.to_owned(),
        decision: Decision::Reject,
        comment: args.comment.clone().filter(|c| !c.is_empty()),
        args: None,
        comprehension_acknowledged: args.comprehension,
        resolution: None,
        result: None,
    };
    decide(&vote, args.output, global, "reject")
}

/// Prints `status: …`, `approvals_received: N`, `session_status: …`.
fn decide(
    vote: &DecideApproval,
    output: Output,
    global: &Global,
    action: &'static str,
) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let outcome = client
            .decide_approval(vote, &remote::actor(client.sends_credential())?)
            .await
            .map_err(remote::change_fails(
                action,
                "the vote",
                format!("phrony approvals show {}", vote.approval_id),
            ))?;
        match output {
            Output::Json => render::json(&json!({
                "approval_id": vote.approval_id,
                "status": outcome.status,
                "approvals_received": outcome.approvals_received,
                "session_status": outcome.session_status,
            })),
            Output::Text => {
                render::line(format_args!("status: {}", outcome.status))?;
                render::line(format_args!(
                    "approvals_received: {}",
                    outcome.approvals_received
                ))?;
                render::line(format_args!("session_status: {}", outcome.session_status))
            }
        }
    })
}

/// `--result FILE.json`: any JSON document.
fn read_result(path: &Path) -> anyhow::Result<Value> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read --result file {shown}"))?;
    serde_json::from_str(&text).with_context(|| format!("--result file {shown} is not valid JSON"))
}

/// `--args FILE.json`: a JSON object.
fn read_args(path: &Path) -> anyhow::Result<Value> {
    let shown = path.display();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("read --args file {shown}"))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("--args file {shown} is not valid JSON"))?;
    if !value.is_object() {
        bail!(
            "--args file {shown} must hold a JSON object (the tool's arguments), got {}",
            render::json_kind(&value)
        );
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    #[test]
    fn args_files_must_hold_a_json_object() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ok = write("ok.json", r#"{"order_id": "ORD-1", "amount": 200}"#);
        assert_eq!(read_args(&ok).unwrap()["amount"], 200);
        let shown = |p: &Path| format!("{:#}", read_args(p).unwrap_err());
        let broken = write("broken.json", "{\"amount\": ");
        assert!(
            shown(&broken).contains("broken.json is not valid JSON"),
            "{}",
            shown(&broken)
        );
        let list = write("list.json", "[1]");
        assert!(
            shown(&list).ends_with("must hold a JSON object (the tool's arguments), got an array")
        );
        assert!(shown(&dir.path().join("missing.json")).starts_with("read --args file "));
    }
}
