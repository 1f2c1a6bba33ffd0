//! `phrony approvals list`: approvals matching every filter, newest first.

use std::io::{self, Write};

use phrony_client::{Approval, ApprovalFilter};
use serde_json::json;

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony approvals list`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only approvals in this status: pending, approved, denied, escalated, or `all`.
    #[arg(long, default_value = "pending")]
    status: String,
    #[command(flatten)]
    scope: super::Scope,
    /// At most this many approvals, at most 1000 (default: every match, up to 10,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    limit: Option<u32>,
    /// Continue a listing: the token printed after the previous page.
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `ID STATUS SESSION_ID AGENT TOOL POLICY ROUTE RECEIVED EXPIRES_AT`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let status = match args.status.trim() {
        "" => anyhow::bail!("--status must not be empty (use --status all for every status)"),
        "all" => None,
        s => Some(s.to_owned()),
    };
    let filter = ApprovalFilter {
        status,
        limit: args.limit,
        page_token: args.page_token.clone().filter(|t| !t.is_empty()),
        ..args.scope.filter()?
    };
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let page = client
            .list_approvals(&filter)
            .await
            .map_err(remote::fails("approvals list"))?;
        match args.output {
            Output::Json => render::json(&json!({
                "approvals": page.approvals.iter().map(super::approval_json).collect::<Vec<_>>(),
                "next_page_token": page.next_page_token,
            })),
            Output::Text => {
                write_table(&page.approvals, &mut std::io::stdout().lock())?;
                Ok(render::next_page_hint(
                    "approvals",
                    page.next_page_token.as_deref(),
                )?)
            }
        }
    })
}

/// The text form: one row per approval. KIND tells a policy approval ("may this call run?")
/// from an outcome review ("did this call already happen?").
fn write_table(approvals: &[Approval], out: &mut impl Write) -> io::Result<()> {
    let mut table = Table::new(&[
        "ID",
        "KIND",
        "STATUS",
        "SESSION_ID",
        "AGENT",
        "TOOL",
        "POLICY",
        "ROUTE",
        "RECEIVED",
        "EXPIRES_AT",
    ]);
    let dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    for a in approvals {
        table.row(vec![
            a.id.clone(),
            super::kind(a).to_owned(),
            a.status.clone(),
            a.session_id.clone(),
            dash(a.agent_ref.as_deref()),
            super::tool(a),
            dash(super::policy(a)),
            dash(a.route.as_deref()),
            format!("{}/{}", a.approvals_received, a.approvals_required),
            a.expires_at.map_or_else(|| "-".to_owned(), render::time),
        ]);
    }
    table.write(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use crate::cmd::approvals::show::tests::sample;

    #[test]
    fn the_kind_column_tells_reviews_from_policy_approvals() {
        let policy = sample();
        let review = Approval {
            id: "ap-2".into(),
            kind: "outcome_review".into(),
            policy_ref: None,
            policy_name: None,
            ..sample()
        };
        let mut out = Vec::new();
        write_table(&[policy, review], &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("approvals_list_table", text);
        });
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID    KIND    STATUS"), "{text}");
        assert!(lines[1].starts_with("ap-1  policy  approved"), "{text}");
        assert!(lines[2].starts_with("ap-2  review  approved"), "{text}");
    }
}
