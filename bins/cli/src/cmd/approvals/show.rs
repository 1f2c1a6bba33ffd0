//! `phrony approvals show ID`: one approval with its arguments and votes.

use std::io::{self, Write};

use phrony_client::Approval;

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony approvals show`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The approval id.
    approval_id: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `key: value` lines, the arguments as indented JSON, and one `vote:` line per vote.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let id = super::approval_id(&args.approval_id)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let approval = client
            .get_approval(id)
            .await
            .map_err(remote::fails("approvals show"))?;
        match args.output {
            Output::Json => render::json(&super::approval_json(&approval)),
            Output::Text => Ok(write_approval(&approval, &mut io::stdout().lock())?),
        }
    })
}

/// The text form of `show`.
fn write_approval(a: &Approval, out: &mut impl Write) -> io::Result<()> {
    let mut table = Table::headless(2);
    let mut field = |key: &str, value: String| table.row(vec![format!("{key}:"), value]);
    let or_dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    let review = a.is_outcome_review();
    field("id", a.id.clone());
    field(
        "kind",
        if review {
            "outcome review (the call's outcome is unknown: did it already happen?)".to_owned()
        } else {
            "policy approval".to_owned()
        },
    );
    field("status", a.status.clone());
    field("session_id", a.session_id.clone());
    field("call_id", a.call_id.clone());
    field("agent", or_dash(a.agent_ref.as_deref()));
    field("tool", super::tool(a));
    field("route", or_dash(a.route.as_deref()));
    if review {
        // A review has no policy, quorum or rejection rule: it asks one question.
        field("question", or_dash(a.reason.as_deref()));
        match &a.resolution {
            Some(r) => field("resolution", r.clone()),
            None if a.status == "pending" => field("resolve with", super::resolve_hint(&a.id)),
            None => {}
        }
    } else {
        field("reason", or_dash(a.reason.as_deref()));
        field("policy", or_dash(super::policy(a)));
        field("authority_ref", or_dash(a.authority_ref.as_deref()));
        field(
            "approvals",
            format!("{}/{}", a.approvals_received, a.approvals_required),
        );
        field(
            "comprehension_required",
            a.comprehension_required.to_string(),
        );
        field("on_reject", or_dash(a.on_reject.as_deref()));
        if let Some(on_modify) = &a.on_modify {
            field("on_modify", on_modify.clone());
        }
        if a.allow_self_approval {
            // The policy's separation-of-duties opt-out: the session's starter may vote.
            field("allow_self_approval", "true".to_owned());
        }
    }
    if let Some(t) = a.created_at {
        field("created_at", render::time(t));
    }
    field(
        "expires_at",
        a.expires_at.map_or_else(|| "-".to_owned(), render::time),
    );
    if let Some(t) = a.decided_at {
        field("decided_at", render::time(t));
    }
    if let Some(by) = a.decided_by_display() {
        field("decided_by", by);
    }
    if let Some(comment) = &a.comment {
        field("comment", comment.clone());
    }
    if let Some(hash) = &a.call_hash {
        field("call_hash", hash.clone());
    }
    if let Some(parent) = &a.parent_approval_id {
        field("parent_approval_id", parent.clone());
    }
    table.write(out)?;
    super::write_args(out, "", a)?;
    for vote in &a.votes {
        render::write_line(out, &format!("vote: {}", super::vote_text(vote)))?;
        if let Some(voter) = super::voter_text(vote) {
            render::write_line(out, &format!("  {voter}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use phrony_client::Vote;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn show_prints_key_values_args_and_votes() {
        let approval = sample();
        let mut out = Vec::new();
        write_approval(&approval, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("kind:                    policy approval\n"),
            "{text}"
        );
        assert!(
            text.contains("agent:                   support/refund-agent@0.1.0\n"),
            "{text}"
        );
        assert!(
            text.contains("policy:                  payments/refund-approval-boundary@1.0.0\n"),
            "{text}"
        );
        assert!(text.contains("tool:                    payments.issue-refund@1.0.0\n"));
        assert!(text.contains("approvals:               1/1\n"));
        assert!(
            text.contains("args:\n  {\n    \"amount\": 400,\n    \"order_id\": \"ORD-1\"\n  }\n"),
            "{text}"
        );
        assert!(
            text.ends_with("vote: emad approved: \"verified\"\n  voter: emad (unverified)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_outcome_review_shows_its_question_and_how_to_resolve_it() {
        let question = "outcome of tool payments.issue-refund@1.0.0 is unknown: worker \"w-1\" \
                        was lost because its stream closed. The runtime cannot tell whether \
                        payments.issue-refund@1.0.0 took effect: did it happen?";
        let pending = Approval {
            kind: "outcome_review".into(),
            status: "pending".into(),
            reason: Some(question.into()),
            policy_ref: None,
            policy_name: None,
            approvals_received: 0,
            decided_by: None,
            comment: None,
            votes: Vec::new(),
            ..sample()
        };
        let mut out = Vec::new();
        write_approval(&pending, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "kind:          outcome review (the call's outcome is unknown: did it already \
                 happen?)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!("question:      {question}\n")),
            "{text}"
        );
        assert!(
            text.contains(
                "resolve with:  phrony approvals resolve ap-1 --happened [--result FILE.json] | \
                 --fail | --resend --confirm-not-happened\n"
            ),
            "{text}"
        );
        // Nothing of a policy approval: no policy, quorum or rejection rule to mislead.
        for absent in ["policy:", "approvals:", "on_reject:", "reason:"] {
            assert!(!text.contains(absent), "{absent} in {text}");
        }
        let resolved = Approval {
            status: "denied".into(),
            resolution: Some("fail".into()),
            ..pending
        };
        let mut out = Vec::new();
        write_approval(&resolved, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with("resolution:") && l.ends_with(" fail")),
            "{text}"
        );
        assert!(!text.contains("resolve with:"), "{text}");
    }

    /// A decided policy approval.
    pub(crate) fn sample() -> Approval {
        Approval {
            id: "ap-1".into(),
            kind: "policy".into(),
            resolution: None,
            status: "approved".into(),
            session_id: "run_1".into(),
            call_id: "call-1".into(),
            agent_ref: Some("support/refund-agent@0.1.0".into()),
            agent_version_id: None,
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            args: json!({"amount": 400, "order_id": "ORD-1"}),
            effective_args: None,
            route: None,
            reason: Some("Refund amount above delegated limit.".into()),
            policy_ref: Some("payments/refund-approval-boundary@1.0.0".into()),
            policy_name: Some("refund-approval-boundary".into()),
            policy_runtime: Value::Null,
            authority_ref: None,
            approvals_required: 1,
            approvals_received: 1,
            comprehension_required: false,
            on_reject: Some("return_to_agent".into()),
            on_modify: None,
            call_hash: None,
            parent_approval_id: None,
            created_at: None,
            expires_at: None,
            decided_at: None,
            decided_by: Some("emad".into()),
            // Local mode: nobody verified the voter, and the output says so.
            decided_by_verification: Some("unverified".into()),
            decided_by_via: None,
            allow_self_approval: false,
            comment: Some("verified".into()),
            votes: vec![Vote {
                decided_by: "emad".into(),
                decision: "approved".into(),
                comment: Some("verified".into()),
                comprehension_acknowledged: false,
                created_at: None,
                verification: Some("unverified".into()),
                via: None,
            }],
        }
    }
}
