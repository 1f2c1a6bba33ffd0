//! `phrony policies replay NS/NAME --against agent.yaml [--since T]`: re-decides the stored
//! calls of a deployed agent under a candidate manifest and reports every decision that would
//! flip, with its session and call ids (the review step before a policy change).
//!
//! The calls are read with the read RPCs every operator has (`ListSessions` of the agent, most
//! recently updated first, 100 at a time, then `InspectSession` of one session at a time), so
//! a long history is streamed, never held whole; only the flips are kept. Each call is decided
//! by the candidate's compiled policies on the request the runtime built for it
//! ([`phrony_manifest::CallScope`]: the same tool binding lookup, session id and metadata, the
//! principal's claims and the time the runtime decided it). Exit code 5 when a decision would
//! flip ([`crate::exit::Flipped`]).

mod compare;
mod stored;

use std::io;
use std::path::PathBuf;

use anyhow::bail;
use chrono::{DateTime, Duration, Utc};
use phrony_client::{Client, SessionFilter, TimelineDetail, TimelineEntry};
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, Output, agent_ref, manifest, remote, render};
use crate::exit::Flipped;

use self::compare::{Candidate, Flip, Replay, SessionFacts, Skip};
use self::stored::Decided;

/// Sessions asked per `ListSessions` page.
const PAGE: u32 = 100;

/// Arguments of `phrony policies replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The deployed agent whose stored calls are replayed (namespace/name; every version).
    agent: String,
    /// The candidate Agent manifest (agent.yaml), loaded and validated as `agents validate`
    /// does; it must be the same agent (namespace/name).
    #[arg(long, value_name = "FILE")]
    against: PathBuf,
    /// Only calls decided at or after this time: RFC 3339 (2026-12-01T00:00:00Z) or a duration
    /// back from now (90s, 30m, 24h, 7d).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Replay at most this many calls (of the most recently updated sessions first).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Loads the candidate, replays the agent's stored calls and prints the flips and the counts.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let agent = agent_ref::unversioned(&args.agent, "; replay reads every version's calls")?;
    let since = args
        .since
        .as_deref()
        .map(|text| parse_since(text, Utc::now()))
        .transpose()?;
    let candidate = Candidate::new(manifest::load_agent(&args.against)?)?;
    let meta = &candidate.agent().metadata;
    if meta.namespace != agent.namespace || meta.name != agent.name {
        bail!(
            "{} declares {}/{}, not {agent}: replay a candidate of the same agent",
            args.against.display(),
            meta.namespace,
            meta.name
        );
    }
    let candidate_ref = format!("{}/{}@{}", meta.namespace, meta.name, meta.version);
    let (replay, limited) = remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let filter = SessionFilter {
            agent: Some(agent.clone()),
            version: None,
            status: None,
            metadata: std::collections::BTreeMap::new(),
            include_children: true,
            limit: Some(PAGE),
            page_token: None,
        };
        replay_sessions(&client, filter, &candidate, since, args.limit).await
    })?;
    let flipped = replay.summary.flipped;
    match args.output {
        Output::Json => render::json(&json!({
            "agent": agent.to_string(),
            "candidate": candidate_ref,
            "since": render::json_time(since),
            "limit_reached": limited,
            "flips": replay.flips,
            "summary": replay.summary,
        }))?,
        Output::Text => write_text(&mut io::stdout().lock(), &replay, &candidate_ref, limited)?,
    }
    if flipped > 0 {
        return Err(Flipped::new(format!(
            "{flipped} stored decision{} would flip under {candidate_ref}",
            if flipped == 1 { "" } else { "s" }
        ))
        .into());
    }
    Ok(())
}

/// Pages through the agent's sessions (most recently updated first, stopping at the first one
/// last updated before `since`) and replays each one's calls; `true` when `limit` stopped it.
async fn replay_sessions(
    client: &Client,
    mut filter: SessionFilter,
    candidate: &Candidate,
    since: Option<DateTime<Utc>>,
    limit: Option<u64>,
) -> anyhow::Result<(Replay, bool)> {
    let mut replay = Replay::default();
    loop {
        let page = client
            .list_sessions(&filter)
            .await
            .map_err(remote::fails("policies replay: list sessions"))?;
        for session in &page.sessions {
            if since.is_some_and(|t| session.updated_at < t) {
                return Ok((replay, false));
            }
            let mut inspection = client
                .inspect_session(&session.id)
                .await
                .map_err(remote::fails("policies replay: inspect session"))?;
            read_shortened(client, &mut inspection.timeline).await?;
            let (calls, principal) = stored::read_calls(&session.id, &inspection.timeline)?;
            let metadata = phrony_manifest::session_metadata(&inspection.session.metadata);
            let facts = SessionFacts {
                session_id: &session.id,
                metadata: &metadata,
                principal: principal.as_ref(),
            };
            replay.summary.sessions += 1;
            for call in &calls {
                if let (Some(t), Some(at)) = (since, call.decided_at)
                    && at < t
                {
                    continue;
                }
                if limit.is_some_and(|n| replay.summary.replayed >= n) {
                    return Ok((replay, true));
                }
                replay.add(candidate, &facts, call);
            }
        }
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => return Ok((replay, false)),
        }
    }
}

/// Reads whole the event payloads a replay needs (a call's arguments, the principal's claims)
/// that the inspection shortened.
async fn read_shortened(client: &Client, timeline: &mut [TimelineEntry]) -> anyhow::Result<()> {
    for entry in timeline {
        let Some(shortened) = entry.truncation("event.payload").cloned() else {
            continue;
        };
        let TimelineDetail::Event(event) = &mut entry.detail else {
            continue;
        };
        if !matches!(
            event.event_type.as_str(),
            "tool.requested" | "session.principal"
        ) {
            continue;
        }
        let bytes = client
            .session_payload(&shortened.reference)
            .await
            .map_err(remote::fails("policies replay: read a payload"))?;
        event.payload = serde_json::from_slice::<Value>(&bytes).map_err(|err| {
            anyhow::anyhow!(
                "the payload of event {} of session {} is not JSON: {err}",
                event.seq,
                event.session_id
            )
        })?;
    }
    Ok(())
}

/// `--since`: RFC 3339, or a whole number of seconds, minutes, hours or days back from `now`.
fn parse_since(text: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let unit = text.chars().last().unwrap_or(' ');
    let digits = text.strip_suffix(unit).unwrap_or_default();
    let amount = digits.parse::<i64>().ok().filter(|n| *n >= 0);
    let back = match (amount, unit) {
        (Some(n), 's') => Duration::try_seconds(n),
        (Some(n), 'm') => Duration::try_minutes(n),
        (Some(n), 'h') => Duration::try_hours(n),
        (Some(n), 'd') => Duration::try_days(n),
        _ => None,
    };
    match back.and_then(|d| now.checked_sub_signed(d)) {
        Some(time) => Ok(time),
        None => bail!(
            "--since {text:?} is neither an RFC 3339 time (2026-12-01T00:00:00Z) nor a \
             duration such as 90s, 30m, 24h or 7d"
        ),
    }
}

/// `decision (approval) [policy]` of one side of a flip.
fn decided_cell(decided: &Decided) -> String {
    let mut cell = decided.decision.as_str().to_owned();
    if let Some(status) = &decided.approval {
        cell.push_str(&format!(" ({status})"));
    }
    cell
}

/// The flips table, then the counts.
fn write_text(
    out: &mut impl io::Write,
    replay: &Replay,
    candidate: &str,
    limited: bool,
) -> io::Result<()> {
    let s = &replay.summary;
    if !replay.flips.is_empty() {
        let mut table = Table::new(&[
            "TIME",
            "SESSION",
            "CALL",
            "TOOL",
            "STORED",
            "CANDIDATE",
            "POLICY_BEFORE",
            "POLICY_AFTER",
        ]);
        for flip in &replay.flips {
            table.row(flip_row(flip));
        }
        table.write(out)?;
        writeln!(out)?;
    }
    writeln!(
        out,
        "replayed {} call{} of {} session{} under {candidate}: {} would flip, {} unchanged",
        s.replayed,
        plural(s.replayed),
        s.sessions,
        plural(s.sessions),
        s.flipped,
        s.unchanged
    )?;
    for (kind, n) in &s.flips {
        writeln!(out, "  {kind}: {n}")?;
    }
    if s.other_policy > 0 {
        writeln!(
            out,
            "  same decision, another deciding policy: {}",
            s.other_policy
        )?;
    }
    let skipped: u64 = s.skipped.values().sum();
    if skipped > 0 {
        writeln!(out, "skipped {skipped} call{}:", plural(skipped))?;
        for skip in [
            Skip::NotDecided,
            Skip::RuntimeEscalation,
            Skip::NotInCandidate,
        ] {
            if let Some(n) = s.skipped.get(skip.as_str()) {
                writeln!(out, "  {}: {n}", skip.explain())?;
            }
        }
    }
    if limited {
        writeln!(
            out,
            "stopped after {} calls (--limit); older calls were not replayed",
            s.replayed
        )?;
    }
    Ok(())
}

fn flip_row(flip: &Flip) -> Vec<String> {
    let policy = |d: &Decided| d.policy.clone().unwrap_or_else(|| "-".to_owned());
    vec![
        flip.time.map_or_else(|| "-".to_owned(), render::time),
        flip.session_id.clone(),
        flip.call_id.clone(),
        flip.tool.clone(),
        decided_cell(&flip.stored),
        decided_cell(&flip.candidate),
        policy(&flip.stored),
        policy(&flip.candidate),
    ]
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use crate::cmd::policies::replay::stored::Kind;

    #[test]
    fn since_is_a_time_or_a_duration_back_from_now() {
        let now = DateTime::parse_from_rfc3339("2026-12-05T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| parse_since(s, now).unwrap().to_rfc3339();
        assert_eq!(at("2026-12-01T00:00:00Z"), "2026-12-01T00:00:00+00:00");
        assert_eq!(at("2026-12-01T01:00:00+01:00"), "2026-12-01T00:00:00+00:00");
        assert_eq!(at("90s"), "2026-12-05T11:58:30+00:00");
        assert_eq!(at("30m"), "2026-12-05T11:30:00+00:00");
        assert_eq!(at(" 24h "), "2026-12-04T12:00:00+00:00");
        assert_eq!(at("7d"), "2026-11-28T12:00:00+00:00");
        for bad in [
            "",
            "h",
            "24",
            "-1h",
            "1w",
            "1.5h",
            "yesterday",
            "99999999999999d",
        ] {
            let err = parse_since(bad, now).unwrap_err().to_string();
            assert!(err.starts_with("--since "), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_text_report_is_a_table_of_flips_then_the_counts() {
        let mut replay = Replay::default();
        replay.flips.push(Flip {
            time: DateTime::from_timestamp(1_764_000_000, 0),
            session_id: "run_a".into(),
            call_id: "call_1".into(),
            tool: "payments.issue-refund@1.0.0".into(),
            stored: Decided {
                decision: Kind::RequireApproval,
                policy: Some("payments/refund-approval-boundary@1.0.0".into()),
                approval: Some("approved".into()),
            },
            candidate: Decided {
                decision: Kind::Allow,
                policy: None,
                approval: None,
            },
        });
        let s = &mut replay.summary;
        s.sessions = 2;
        s.replayed = 3;
        s.unchanged = 2;
        s.flipped = 1;
        s.flips.insert("require_approval -> allow".into(), 1);
        s.skipped.insert(Skip::NotDecided.as_str(), 1);
        let mut out = Vec::new();
        write_text(&mut out, &replay, "support/refund-agent@0.2.0", true).unwrap();
        insta::assert_snapshot!(String::from_utf8(out).unwrap());
    }
}
