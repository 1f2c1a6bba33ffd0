//! The Phrony runtime's metric catalog: every counter and histogram the libraries record, as
//! `static`s of lock-free atomics, with closed label sets.
//!
//! The libraries (engine, ledger, dispatch, providers) record at one place per metric: an
//! increment or an observation is one or two relaxed atomic additions, never a lock and never an
//! allocation. Labels are Rust enums ([`Label`]): a label value is one of a fixed list known at
//! compile time, so no request, argument or actor name can ever become a label value and the
//! number of series is fixed. The daemon (`phrony-runtime`) reads [`catalog`] at scrape time and
//! writes the Prometheus exposition; the gauges that are a count of stored state (sessions by
//! status, pending approvals, queue depths, connected workers) are read there from their source,
//! not kept here.
//!
//! This crate has no dependencies, so recording a metric adds nothing to a library's tree.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonically increasing count.
#[derive(Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero.
    #[must_use]
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The current count.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

/// A closed set of label values: one label (`NAME`) whose values are the variants.
pub trait Label: Copy + 'static {
    /// The label's name (`decision`).
    const NAME: &'static str;
    /// Every value, in index order.
    const ALL: &'static [Self];
    /// The value as exported (`allow`).
    fn value(self) -> &'static str;
    /// The value's position in [`Label::ALL`].
    fn index(self) -> usize;
}

/// One counter per value of the label `L` (`N` is the number of values).
#[derive(Debug)]
pub struct CounterVec<L: Label, const N: usize> {
    counts: [AtomicU64; N],
    label: PhantomData<fn() -> L>,
}

impl<L: Label, const N: usize> CounterVec<L, N> {
    /// Every counter at zero.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            counts: [const { AtomicU64::new(0) }; N],
            label: PhantomData,
        }
    }

    /// Adds one to `label`'s counter.
    pub fn inc(&self, label: L) {
        if let Some(count) = self.counts.get(label.index()) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `label`'s count.
    #[must_use]
    pub fn get(&self, label: L) -> u64 {
        self.counts
            .get(label.index())
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Every (value, count), in label order.
    #[must_use]
    pub fn values(&self) -> Vec<(&'static str, u64)> {
        L::ALL
            .iter()
            .map(|&label| (label.value(), self.get(label)))
            .collect()
    }
}

impl<L: Label, const N: usize> Default for CounterVec<L, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Bucket upper bounds (seconds) for operations that take milliseconds to seconds: policy
/// evaluation, ledger commits, dispatch queue waits, model calls.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// Bucket upper bounds (seconds) for waits on people: approval waits.
pub const WAIT_BUCKETS: [f64; 10] = [
    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3_600.0, 14_400.0, 86_400.0, 604_800.0,
];

/// A histogram of durations over fixed buckets: one atomic per bucket, the sum in nanoseconds.
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    /// Observations per bucket (not cumulative); an observation above every bound goes to
    /// `overflow`.
    counts: [AtomicU64; N],
    overflow: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A histogram's state at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, observations above the previous bound and at or below this
    /// one), ascending; not cumulative.
    pub buckets: Vec<(f64, u64)>,
    /// Observations above every bound.
    pub overflow: u64,
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
    /// The sum of the observations, in seconds.
    pub sum_seconds: f64,
}

impl<const N: usize> Histogram<N> {
    /// An empty histogram over `bounds` (ascending upper bounds in seconds).
    #[must_use]
    pub const fn new(bounds: [f64; N]) -> Self {
        Self {
            bounds,
            counts: [const { AtomicU64::new(0) }; N],
            overflow: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        let slot = self
            .bounds
            .iter()
            .position(|&bound| seconds <= bound)
            .and_then(|i| self.counts.get(i))
            .unwrap_or(&self.overflow);
        slot.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The buckets, the count and the sum. The count is the buckets' total, so the `+Inf`
    /// bucket always equals `_count` even while observations land.
    #[must_use]
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(&bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect();
        let overflow = self.overflow.load(Ordering::Relaxed);
        let count = buckets
            .iter()
            .fold(overflow, |total, &(_, n)| total.saturating_add(n));
        #[allow(
            clippy::cast_precision_loss,
            reason = "a sum of nanoseconds exported as float seconds; 2^53 ns is over 100 days"
        )]
        let sum_seconds = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        HistogramSnapshot {
            buckets,
            overflow,
            count,
            sum_seconds,
        }
    }
}

macro_rules! label {
    ($(#[$doc:meta])* $ty:ident, $name:literal, { $($(#[$vdoc:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $ty {
            $($(#[$vdoc])* $variant),+
        }

        impl Label for $ty {
            const NAME: &'static str = $name;
            const ALL: &'static [Self] = &[$(Self::$variant),+];
            fn value(self) -> &'static str {
                match self {
                    $(Self::$variant => $value),+
                }
            }
            fn index(self) -> usize {
                self as usize
            }
        }
    };
}

label!(
    /// What dispatch-time policy decided for a tool call.
    Decision, "decision", {
        /// Allowed: the call goes to its worker.
        Allow => "allow",
        /// Denied: a tool error for the model.
        Deny => "deny",
        /// Paused for a human approval.
        Approval => "approval",
    }
);

label!(
    /// How a tool call that was sent (or meant to be sent) to a worker ended.
    Outcome, "outcome", {
        /// The worker returned a result.
        Succeeded => "succeeded",
        /// The worker (or the runtime) reported a failure: nothing of unknown effect.
        Failed => "failed",
        /// The call may or may not have run (lost worker, deadline, crash).
        Indeterminate => "indeterminate",
        /// The session or an operator cancelled it.
        Cancelled => "cancelled",
    }
);

label!(
    /// A human decision on an approval.
    ApprovalDecision, "decision", {
        /// Approved.
        Approved => "approved",
        /// Rejected.
        Rejected => "rejected",
    }
);

label!(
    /// How one webhook delivery attempt ended.
    WebhookOutcome, "outcome", {
        /// The receiver answered 2xx.
        Delivered => "delivered",
        /// It failed and will be tried again.
        Retried => "retried",
        /// It failed and was the last attempt: the delivery is `failed`.
        Failed => "failed",
    }
);

/// Tool calls by dispatch-time policy decision (`phrony_tool_calls_total{decision}`).
pub static TOOL_CALLS: CounterVec<Decision, 3> = CounterVec::new();
/// Tool calls by outcome (`phrony_tool_call_outcomes_total{outcome}`).
pub static TOOL_CALL_OUTCOMES: CounterVec<Outcome, 4> = CounterVec::new();
/// Time to evaluate a tool call's policies (`phrony_policy_evaluation_seconds`).
pub static POLICY_EVALUATION: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Approvals decided by people (`phrony_approvals_decided_total{decision}`).
pub static APPROVALS_DECIDED: CounterVec<ApprovalDecision, 2> = CounterVec::new();
/// Approvals that expired undecided (`phrony_approvals_expired_total`).
pub static APPROVALS_EXPIRED: Counter = Counter::new();
/// From an approval's opening to its decision (`phrony_approval_wait_seconds`).
pub static APPROVAL_WAIT: Histogram<10> = Histogram::new(WAIT_BUCKETS);
/// How long tool calls waited for a free worker slot (`phrony_dispatch_queue_wait_seconds`).
pub static DISPATCH_QUEUE_WAIT: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Ledger write transactions' commit latency (`phrony_ledger_commit_seconds`).
pub static LEDGER_COMMIT: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// How long each ledger write waited to start (`phrony_ledger_write_wait_seconds`): on SQLite
/// for its turn on the single group-commit writer, on PostgreSQL for a pooled connection and
/// its `BEGIN`.
pub static LEDGER_WRITE_WAIT: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// How long each ledger write held its connection (`phrony_ledger_write_hold_seconds`): on
/// SQLite the single writer, from lending it to the write until the write handed it back (the
/// writer serves no other write meanwhile); on PostgreSQL from `BEGIN` to the end of its
/// commit or rollback (a transaction abandoned on an error is not timed).
pub static LEDGER_WRITE_HOLD: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Each statement a ledger write ran while it held the SQLite writer
/// (`phrony_ledger_write_statement_seconds`): its sum against the holds' sum splits a hold into
/// SQLite's own time and the caller's code between its statements. SQLite only.
pub static LEDGER_WRITE_STATEMENT: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Each hand-off of the SQLite writer's connection inside a write's hold
/// (`phrony_ledger_write_handoff_seconds`): from the writer lending it to the write's task
/// running again, and from the write handing it back to the writer's task running again. Two
/// per write; their sum is the part of the holds spent waiting to be scheduled. SQLite only.
pub static LEDGER_WRITE_HANDOFF: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// SQLite group-commit batches, each from its `BEGIN IMMEDIATE` to its `COMMIT` returned
/// (`phrony_ledger_batch_seconds`): their sum over an interval is the time the single writer
/// was busy.
pub static LEDGER_BATCH: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// SQLite WAL checkpoints run by the ledger's checkpoint task, off the writer
/// (`phrony_ledger_checkpoint_seconds`).
pub static LEDGER_CHECKPOINT: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Model calls, from request to the last streamed event (`phrony_model_call_seconds`).
pub static MODEL_CALL: Histogram<16> = Histogram::new(LATENCY_BUCKETS);
/// Model calls that failed after the provider's retries (`phrony_model_errors_total`).
pub static MODEL_ERRORS: Counter = Counter::new();
/// Webhook delivery attempts by outcome (`phrony_webhook_deliveries_total{outcome}`; recorded by
/// `phrony-runtime`'s sender after the ledger recorded the outcome).
pub static WEBHOOK_DELIVERIES: CounterVec<WebhookOutcome, 3> = CounterVec::new();
/// Writes refused because this replica's session lease was taken over by another replica
/// (`phrony_ledger_fenced_writes_total`; recorded by `phrony-ledger`'s append path).
pub static LEDGER_FENCED_WRITES: Counter = Counter::new();
/// Sessions this replica took over from a replica whose lease expired
/// (`phrony_session_takeovers_total`; recorded by `phrony-engine`).
pub static SESSION_TAKEOVERS: Counter = Counter::new();
/// Sessions this replica handed to another whose workers serve a tool none of its own does
/// (`phrony_session_handoffs_total`; recorded by `phrony-engine`).
pub static SESSION_HANDOFFS: Counter = Counter::new();

/// One recorded metric's current value, as the exporter encodes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter without labels.
    Counter(u64),
    /// One counter per value of `label`.
    Counters {
        /// The label's name.
        label: &'static str,
        /// (value, count) for every label value.
        values: Vec<(&'static str, u64)>,
    },
    /// A histogram of seconds.
    Histogram(HistogramSnapshot),
}

/// A metric of the catalog: its exported name (counters without the `_total` suffix the
/// exposition adds), its help text and its value now.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// The exported name, `phrony_*`, unit in the name.
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
    /// The current value.
    pub value: Value,
}

/// Every recorded metric, read now.
#[must_use]
pub fn catalog() -> Vec<Metric> {
    vec![
        Metric {
            name: "phrony_tool_calls",
            help: "Tool calls by dispatch-time policy decision.",
            value: Value::Counters {
                label: Decision::NAME,
                values: TOOL_CALLS.values(),
            },
        },
        Metric {
            name: "phrony_tool_call_outcomes",
            help: "Tool calls that reached an outcome, by outcome.",
            value: Value::Counters {
                label: Outcome::NAME,
                values: TOOL_CALL_OUTCOMES.values(),
            },
        },
        Metric {
            name: "phrony_policy_evaluation_seconds",
            help: "Time to evaluate one tool call's policies at dispatch time.",
            value: Value::Histogram(POLICY_EVALUATION.snapshot()),
        },
        Metric {
            name: "phrony_approvals_decided",
            help: "Approvals decided by people, by decision.",
            value: Value::Counters {
                label: ApprovalDecision::NAME,
                values: APPROVALS_DECIDED.values(),
            },
        },
        Metric {
            name: "phrony_approvals_expired",
            help: "Approvals that expired before anyone decided them.",
            value: Value::Counter(APPROVALS_EXPIRED.get()),
        },
        Metric {
            name: "phrony_approval_wait_seconds",
            help: "Time from an approval's opening to its decision or expiry.",
            value: Value::Histogram(APPROVAL_WAIT.snapshot()),
        },
        Metric {
            name: "phrony_dispatch_queue_wait_seconds",
            help: "Time tool calls waited for a free worker slot before dispatch.",
            value: Value::Histogram(DISPATCH_QUEUE_WAIT.snapshot()),
        },
        Metric {
            name: "phrony_ledger_commit_seconds",
            help: "Latency of the ledger's write-transaction commits.",
            value: Value::Histogram(LEDGER_COMMIT.snapshot()),
        },
        Metric {
            name: "phrony_ledger_write_wait_seconds",
            help: "Time each ledger write waited to start (SQLite: its turn on the single writer).",
            value: Value::Histogram(LEDGER_WRITE_WAIT.snapshot()),
        },
        Metric {
            name: "phrony_ledger_write_hold_seconds",
            help: "Time each ledger write held its connection (SQLite: the single writer).",
            value: Value::Histogram(LEDGER_WRITE_HOLD.snapshot()),
        },
        Metric {
            name: "phrony_ledger_write_statement_seconds",
            help: "Each statement a ledger write ran while it held the SQLite writer.",
            value: Value::Histogram(LEDGER_WRITE_STATEMENT.snapshot()),
        },
        Metric {
            name: "phrony_ledger_write_handoff_seconds",
            help: "Each hand-off of the SQLite writer between its task and a write's, until it runs.",
            value: Value::Histogram(LEDGER_WRITE_HANDOFF.snapshot()),
        },
        Metric {
            name: "phrony_ledger_batch_seconds",
            help: "SQLite group-commit batches, BEGIN to COMMIT: the sum is the writer's busy time.",
            value: Value::Histogram(LEDGER_BATCH.snapshot()),
        },
        Metric {
            name: "phrony_ledger_checkpoint_seconds",
            help: "SQLite WAL checkpoints, run by a task of their own off the single writer.",
            value: Value::Histogram(LEDGER_CHECKPOINT.snapshot()),
        },
        Metric {
            name: "phrony_model_call_seconds",
            help: "Model calls, from the request to the end of the streamed completion.",
            value: Value::Histogram(MODEL_CALL.snapshot()),
        },
        Metric {
            name: "phrony_model_errors",
            help: "Model calls that failed (after the provider's retries).",
            value: Value::Counter(MODEL_ERRORS.get()),
        },
        Metric {
            name: "phrony_webhook_deliveries",
            help: "Webhook delivery attempts, by outcome.",
            value: Value::Counters {
                label: WebhookOutcome::NAME,
                values: WEBHOOK_DELIVERIES.values(),
            },
        },
        Metric {
            name: "phrony_ledger_fenced_writes",
            help: "Writes refused because another replica took the session's lease over.",
            value: Value::Counter(LEDGER_FENCED_WRITES.get()),
        },
        Metric {
            name: "phrony_session_takeovers",
            help: "Sessions taken over from a replica whose lease expired.",
            value: Value::Counter(SESSION_TAKEOVERS.get()),
        },
        Metric {
            name: "phrony_session_handoffs",
            help: "Sessions handed to another replica whose workers serve the tool a call needs.",
            value: Value::Counter(SESSION_HANDOFFS.get()),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_per_bucket_and_its_count_is_every_observation() {
        let h = Histogram::new([0.001, 0.01, 0.1]);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(2));
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.001, 1), (0.01, 2), (0.1, 0)]);
        assert_eq!(s.overflow, 1);
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 2.0105).abs() < 1e-9, "{}", s.sum_seconds);
    }

    #[test]
    fn labeled_counters_count_each_value_apart() {
        let c: CounterVec<Decision, 3> = CounterVec::new();
        c.inc(Decision::Deny);
        c.inc(Decision::Deny);
        c.inc(Decision::Approval);
        assert_eq!(c.values(), vec![("allow", 0), ("deny", 2), ("approval", 1)]);
    }

    #[test]
    fn every_label_enum_has_as_many_counters_as_values_and_names_are_prefixed() {
        assert_eq!(Decision::ALL.len(), 3);
        assert_eq!(Outcome::ALL.len(), 4);
        assert_eq!(ApprovalDecision::ALL.len(), 2);
        for (i, d) in Decision::ALL.iter().enumerate() {
            assert_eq!(d.index(), i);
        }
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
        assert_eq!(TOOL_CALLS.counts.len(), Decision::ALL.len());
        assert_eq!(TOOL_CALL_OUTCOMES.counts.len(), Outcome::ALL.len());
        assert_eq!(APPROVALS_DECIDED.counts.len(), ApprovalDecision::ALL.len());
        assert_eq!(WEBHOOK_DELIVERIES.counts.len(), WebhookOutcome::ALL.len());
        for m in catalog() {
            assert!(m.name.starts_with("phrony_"), "{}", m.name);
            assert!(
                !m.name.ends_with("_total"),
                "the exposition adds _total: {}",
                m.name
            );
        }
    }
}
