//! `phrony policies shadow-report NS/NAME`: what a `mode: shadow` policy would have changed.
//!
//! Reads the policy's recorded shadow decisions from the runtime (`ListShadowDecisions`, every
//! version of the policy) and prints one row per call it would have denied or held for approval,
//! then a summary by kind. Only calls it would have changed are recorded, so the report counts
//! those, not every call the policy saw.

use std::io::{self, Write as _};

use anyhow::bail;
use chrono::{DateTime, Duration, Utc};
use phrony_client::{ShadowDecision, ShadowDecisions};
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote};

/// Arguments of `phrony policies shadow-report`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The shadow policy, `namespace/name` (every version is reported).
    #[arg(value_name = "NS/NAME")]
    policy: String,
    /// Only decisions since then: an RFC 3339 time (2026-12-01T00:00:00Z) or a duration back
    /// from now (`90m`, `24h`, `7d`; units s, m, h, d).
    #[arg(long, value_name = "TIME|DURATION")]
    since: Option<String>,
    /// At most this many decisions, oldest first (1 to 999).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..1000))]
    limit: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Fetches and prints the report.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let policy = args.policy.trim();
    match policy.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(['/', '@']) => {}
        _ => bail!("policy {policy:?} must be NS/NAME, e.g. payments/refund-limit (no version)"),
    }
    let since = args
        .since
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_since(s, Utc::now()))
        .transpose()?;
    let since_text = since.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let report = client
            .list_shadow_decisions(policy, since_text.as_deref(), args.limit)
            .await
            .map_err(remote::fails("policies shadow-report"))?;
        let mut stdout = io::stdout().lock();
        match args.output {
            Output::Text => write_text(&mut stdout, policy, &report)?,
            Output::Json => {
                serde_json::to_writer_pretty(&mut stdout, &report_json(policy, &report))?;
                writeln!(stdout)?;
            }
        }
        Ok(())
    })
}

/// `--since`: an RFC 3339 time, or `<n><unit>` back from `now` (s, m, h, d).
fn parse_since(text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.to_utc());
    }
    let bad = || {
        anyhow::anyhow!(
            "--since {text:?} is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a duration \
             such as 90m, 24h or 7d"
        )
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: i64 = number.parse().map_err(|_| bad())?;
    let back = match unit {
        "s" => Duration::try_seconds(n),
        "m" => Duration::try_minutes(n),
        "h" => Duration::try_hours(n),
        "d" => Duration::try_days(n),
        _ => None,
    }
    .ok_or_else(bad)?;
    now.checked_sub_signed(back).ok_or_else(bad)
}

/// `N calls would have changed: A denied, B held for approval` (and a note when truncated).
fn summary(report: &ShadowDecisions) -> String {
    let count = |kind: &str| report.decisions.iter().filter(|d| d.shadow == kind).count();
    let total = report.decisions.len();
    let more = if report.truncated { "at least " } else { "" };
    format!(
        "{more}{total} call{} would have changed: {} denied, {} held for approval{}",
        if total == 1 { "" } else { "s" },
        count("deny"),
        count("require_approval"),
        if report.truncated {
            " (more than --limit; narrow --since or raise --limit)"
        } else {
            ""
        }
    )
}

fn write_text(out: &mut impl io::Write, policy: &str, report: &ShadowDecisions) -> io::Result<()> {
    if report.decisions.is_empty() {
        return writeln!(out, "shadow policy {policy}: no call would have changed");
    }
    let mut table = Table::new(&["TIME", "SESSION", "CALL", "TOOL", "DECISION", "POLICY"]);
    for d in &report.decisions {
        table.row(vec![
            d.recorded_at.clone(),
            d.session_id.clone(),
            d.call_id.clone(),
            d.tool.clone(),
            format!("{} → {}", d.enforced, d.shadow),
            d.policy.clone(),
        ]);
    }
    table.write(out)?;
    writeln!(out, "{}", summary(report))
}

fn decision_json(d: &ShadowDecision) -> Value {
    json!({
        "recorded_at": d.recorded_at,
        "session_id": d.session_id,
        "call_id": d.call_id,
        "agent": d.agent,
        "tool": d.tool,
        "args_digest": d.args_digest,
        "enforced": d.enforced,
        "enforced_policy": d.enforced_policy,
        "would_have": d.shadow,
        "policy": d.policy,
        "reason": d.reason,
    })
}

/// `{"policy", "decisions": [...], "changed": N, "denied": A, "require_approval": B,
/// "truncated"}`.
fn report_json(policy: &str, report: &ShadowDecisions) -> Value {
    let count = |kind: &str| report.decisions.iter().filter(|d| d.shadow == kind).count();
    json!({
        "policy": policy,
        "decisions": report.decisions.iter().map(decision_json).collect::<Vec<_>>(),
        "changed": report.decisions.len(),
        "deny": count("deny"),
        "require_approval": count("require_approval"),
        "truncated": report.truncated,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;

    fn decision(call: &str, shadow: &str) -> ShadowDecision {
        ShadowDecision {
            recorded_at: "2026-12-04T10:00:00.000000Z".to_owned(),
            session_id: "s-1".to_owned(),
            call_id: call.to_owned(),
            agent: "payments/refunds@1.0.0".to_owned(),
            tool: "payments.issue-refund".to_owned(),
            args_digest: "ab".repeat(32),
            enforced: "allow".to_owned(),
            enforced_policy: None,
            shadow: shadow.to_owned(),
            policy: "payments/no-gold@2.0.0".to_owned(),
            reason: None,
        }
    }

    #[test]
    fn since_is_a_time_or_a_duration_back_from_now() {
        let now = DateTime::parse_from_rfc3339("2026-12-05T00:00:00Z")
            .unwrap()
            .to_utc();
        let at = |s: &str| parse_since(s, now).unwrap().to_rfc3339();
        assert_eq!(at("2026-12-01T00:00:00Z"), "2026-12-01T00:00:00+00:00");
        assert_eq!(at("24h"), "2026-12-04T00:00:00+00:00");
        assert_eq!(at("7d"), "2026-11-28T00:00:00+00:00");
        assert_eq!(at("90m"), "2026-12-04T22:30:00+00:00");
        assert_eq!(at("30s"), "2026-12-04T23:59:30+00:00");
        for bad in ["yesterday", "24", "h", "5w", "-1d", "99999999999999999999d"] {
            let e = parse_since(bad, now).unwrap_err().to_string();
            assert!(e.contains("neither an RFC 3339 time"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_report_is_a_table_and_a_summary_by_kind() {
        let report = ShadowDecisions {
            decisions: vec![decision("c-1", "deny"), decision("c-2", "require_approval")],
            truncated: false,
        };
        let mut out = Vec::new();
        write_text(&mut out, "payments/no-gold", &report).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "TIME                         SESSION  CALL  TOOL                   DECISION                  POLICY\n\
             2026-12-04T10:00:00.000000Z  s-1      c-1   payments.issue-refund  allow → deny              payments/no-gold@2.0.0\n\
             2026-12-04T10:00:00.000000Z  s-1      c-2   payments.issue-refund  allow → require_approval  payments/no-gold@2.0.0\n\
             2 calls would have changed: 1 denied, 1 held for approval\n"
        );
        let truncated = ShadowDecisions {
            decisions: vec![decision("c-1", "deny")],
            truncated: true,
        };
        assert_eq!(
            summary(&truncated),
            "at least 1 call would have changed: 1 denied, 0 held for approval (more than \
             --limit; narrow --since or raise --limit)"
        );
        let json = report_json("payments/no-gold", &report);
        assert_eq!(json["changed"], 2);
        assert_eq!(json["deny"], 1);
        assert_eq!(json["decisions"][1]["would_have"], "require_approval");
        let mut empty = Vec::new();
        write_text(
            &mut empty,
            "payments/no-gold",
            &ShadowDecisions {
                decisions: Vec::new(),
                truncated: false,
            },
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(empty).unwrap(),
            "shadow policy payments/no-gold: no call would have changed\n"
        );
    }
}
