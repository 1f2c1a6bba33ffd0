//! Where a closed-loop phase's ledger writes spent their time, from the daemon's own metrics
//! (`/metrics`, read before and after the phase): how many writes a session costs, how long
//! each waited for its turn and held its connection, and on SQLite how busy the single
//! group-commit writer was. A writer busy close to all of the phase is the bound.

use std::collections::HashMap;

use crate::WriterFigures;

/// The daemon's metrics at one instant: series (name with labels) → value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Scrape(HashMap<String, f64>);

impl Scrape {
    /// Parses a Prometheus text exposition; lines that are not `series value` are skipped.
    pub(crate) fn parse(body: &str) -> Self {
        Self(
            body.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    let (series, value) = line.trim().rsplit_once(' ')?;
                    Some((series.trim().to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// Reads `http://{addr}/metrics`.
    pub(crate) async fn read(addr: &str) -> Result<Self, String> {
        let url = format!("http://{addr}/metrics");
        let response = reqwest::get(&url)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {url}: {}", response.status()));
        }
        let body = response
            .text()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        Ok(Self::parse(&body))
    }

    /// The value of `series` (0 when the daemon does not export it).
    fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }
}

/// The figures of a phase of `elapsed` seconds that completed `sessions`, from the scrapes
/// before and after it; `None` when nothing was written (or no session completed).
pub(crate) fn figures(
    before: &Scrape,
    after: &Scrape,
    elapsed: f64,
    sessions: u64,
) -> Option<WriterFigures> {
    let delta = |series: &str| after.get(series) - before.get(series);
    let writes = delta("phrony_ledger_write_hold_seconds_count");
    let waits = delta("phrony_ledger_write_wait_seconds_count");
    let commits = delta("phrony_ledger_commit_seconds_count");
    let batches = delta("phrony_ledger_batch_seconds_count");
    if writes <= 0.0 || sessions == 0 || elapsed <= 0.0 {
        return None;
    }
    let per = |sum: &str, n: f64| (n > 0.0).then(|| delta(sum) / n);
    let held = delta("phrony_ledger_write_hold_seconds_sum");
    let statements = delta("phrony_ledger_write_statement_seconds_count");
    let handoffs = delta("phrony_ledger_write_handoff_seconds_count");
    Some(WriterFigures {
        writes_per_session: writes / sessions as f64,
        wait_us: per("phrony_ledger_write_wait_seconds_sum", waits).unwrap_or(0.0) * 1e6,
        hold_us: held / writes * 1e6,
        commit_us: per("phrony_ledger_commit_seconds_sum", commits).unwrap_or(0.0) * 1e6,
        hold_share: held / elapsed,
        writes_per_batch: (batches > 0.0).then(|| writes / batches),
        busy: (batches > 0.0).then(|| delta("phrony_ledger_batch_seconds_sum") / elapsed),
        commit_share: (batches > 0.0).then(|| delta("phrony_ledger_commit_seconds_sum") / elapsed),
        statements_per_write: (statements > 0.0).then(|| statements / writes),
        statement_us: (statements > 0.0)
            .then(|| delta("phrony_ledger_write_statement_seconds_sum") / writes * 1e6),
        handoff_us: (handoffs > 0.0)
            .then(|| delta("phrony_ledger_write_handoff_seconds_sum") / writes * 1e6),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# HELP phrony_ledger_write_hold_seconds Time each ledger write held its connection.
# TYPE phrony_ledger_write_hold_seconds histogram
phrony_ledger_write_hold_seconds_bucket{le=\"0.00005\"} 1
phrony_ledger_write_hold_seconds_sum 0.5
phrony_ledger_write_hold_seconds_count 100
phrony_ledger_write_wait_seconds_sum 1
phrony_ledger_write_wait_seconds_count 100
phrony_ledger_commit_seconds_sum 0.1
phrony_ledger_commit_seconds_count 10
phrony_ledger_batch_seconds_sum 1
phrony_ledger_batch_seconds_count 10
phrony_ledger_write_statement_seconds_sum 0.25
phrony_ledger_write_statement_seconds_count 1000
phrony_ledger_write_handoff_seconds_sum 0.01
phrony_ledger_write_handoff_seconds_count 200
phrony_tool_calls_total{decision=\"allow\"} 3
";

    const AFTER: &str = "\
phrony_ledger_write_hold_seconds_sum 1.5
phrony_ledger_write_hold_seconds_count 1100
phrony_ledger_write_wait_seconds_sum 3
phrony_ledger_write_wait_seconds_count 1100
phrony_ledger_commit_seconds_sum 0.3
phrony_ledger_commit_seconds_count 110
phrony_ledger_batch_seconds_sum 2.8
phrony_ledger_batch_seconds_count 110
phrony_ledger_write_statement_seconds_sum 0.85
phrony_ledger_write_statement_seconds_count 13000
phrony_ledger_write_handoff_seconds_sum 0.11
phrony_ledger_write_handoff_seconds_count 2200
";

    #[test]
    fn an_exposition_is_read_by_series_with_labels() {
        let scrape = Scrape::parse(BEFORE);
        assert_eq!(
            scrape.get("phrony_tool_calls_total{decision=\"allow\"}"),
            3.0
        );
        assert_eq!(
            scrape.get("phrony_ledger_write_hold_seconds_bucket{le=\"0.00005\"}"),
            1.0
        );
        assert_eq!(scrape.get("phrony_ledger_write_hold_seconds_count"), 100.0);
        assert_eq!(scrape.get("phrony_not_exported"), 0.0);
    }

    #[test]
    fn a_phase_is_the_difference_of_its_scrapes() {
        // 1,000 writes of 100 sessions over 2 s, in 100 batches.
        let f = figures(&Scrape::parse(BEFORE), &Scrape::parse(AFTER), 2.0, 100).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(f.writes_per_session, 10.0), "{f:?}");
        assert!(close(f.wait_us, 2_000.0), "{f:?}");
        assert!(close(f.hold_us, 1_000.0), "{f:?}");
        assert!(close(f.commit_us, 2_000.0), "{f:?}");
        assert!(close(f.hold_share, 0.5), "{f:?}");
        assert!(close(f.writes_per_batch.unwrap(), 10.0), "{f:?}");
        assert!(close(f.busy.unwrap(), 0.9), "{f:?}");
        assert!(close(f.commit_share.unwrap(), 0.1), "{f:?}");
        // 12,000 statements taking 0.6 s in the 1,000 writes.
        assert!(close(f.statements_per_write.unwrap(), 12.0), "{f:?}");
        assert!(close(f.statement_us.unwrap(), 600.0), "{f:?}");
        // Two hand-offs per write, 0.1 s in all.
        assert!(close(f.handoff_us.unwrap(), 100.0), "{f:?}");
    }

    #[test]
    fn without_batches_the_writer_figures_are_absent_and_without_writes_all() {
        let pg_after = AFTER.replace("phrony_ledger_batch_seconds_count 110", "");
        let pg_before = BEFORE.replace("phrony_ledger_batch_seconds_count 10", "");
        let f = figures(
            &Scrape::parse(&pg_before),
            &Scrape::parse(&pg_after),
            2.0,
            100,
        )
        .unwrap();
        assert_eq!(
            (f.busy, f.writes_per_batch, f.commit_share),
            (None, None, None)
        );
        let same = Scrape::parse(BEFORE);
        assert_eq!(figures(&same, &same, 2.0, 100), None);
        assert_eq!(figures(&same, &Scrape::parse(AFTER), 2.0, 0), None);
    }
}
