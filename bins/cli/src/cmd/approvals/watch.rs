//! `phrony approvals watch`: the pending approvals, then each change as it happens, one line
//! each, until interrupted or the runtime ends the watch.

use std::io::{self, Write};

use phrony_client::ApprovalChange;
use serde_json::json;

use crate::cmd::{Global, Output, remote, render};

/// Arguments of `phrony approvals watch`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    scope: super::Scope,
    /// Output format: `json` prints one compact JSON document per line.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints `CHANGE ID KIND STATUS SESSION_ID AGENT TOOL POLICY ROUTE RECEIVED EXPIRES_AT` lines.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let filter = args.scope.filter()?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let mut watch = client
            .watch_approvals(&filter)
            .await
            .map_err(remote::fails("approvals watch"))?;
        if args.output == Output::Text {
            writeln!(io::stdout().lock(), "{}", HEADER.join("  "))?;
        }
        while let Some(change) = watch
            .next()
            .await
            .map_err(remote::fails("approvals watch"))?
        {
            let mut out = io::stdout().lock();
            match args.output {
                Output::Json => writeln!(out, "{}", json_line(&change))?,
                Output::Text => match &change.approval {
                    Some(_) => writeln!(out, "{}", text_line(&change))?,
                    None => eprintln!("(the pending approvals above; now watching for changes)"),
                },
            }
            out.flush()?;
        }
        anyhow::bail!("the runtime ended the watch")
    })
}

const HEADER: [&str; 11] = [
    "CHANGE",
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
];

/// One change as the columns of `approvals list`, after the change's kind; every cell
/// [`render::escape`]d, as the list's table does.
fn text_line(change: &ApprovalChange) -> String {
    let Some(a) = &change.approval else {
        return change.kind.as_str().to_owned();
    };
    let dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    [
        change.kind.as_str().to_owned(),
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
    ]
    .iter()
    .map(|cell| render::escape(cell))
    .collect::<Vec<_>>()
    .join("  ")
}

/// `{"change": "opened", "approval": {…}}` on one line (`approval` absent for `current_end`).
fn json_line(change: &ApprovalChange) -> String {
    let mut doc = json!({ "change": change.kind.as_str() });
    if let Some(a) = &change.approval {
        doc["approval"] = super::approval_json(a);
    }
    doc.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use crate::cmd::approvals::show::tests::sample;
    use phrony_client::ApprovalChangeKind;

    #[test]
    fn a_change_prints_as_its_kind_then_the_list_columns() {
        let change = ApprovalChange {
            kind: ApprovalChangeKind::Decided,
            approval: Some(sample()),
        };
        let line = text_line(&change);
        assert!(
            line.starts_with("decided  ap-1  policy  approved  "),
            "{line}"
        );
        let doc: serde_json::Value = serde_json::from_str(&json_line(&change)).unwrap();
        assert_eq!(doc["change"], "decided");
        assert_eq!(doc["approval"]["id"], "ap-1");
        let end = ApprovalChange {
            kind: ApprovalChangeKind::CurrentEnd,
            approval: None,
        };
        assert_eq!(json_line(&end), r#"{"change":"current_end"}"#);
    }
}
