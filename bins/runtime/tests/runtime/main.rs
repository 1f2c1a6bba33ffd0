//! The daemon binary's integration tests in one binary.
//!
//! - [`audit`]: the audit against an attacker who can write the SQLite file.
//! - [`console`]: the approvals console (`/console/` on `RUNTIME_HTTP_ADDR`) through its HTTP API.
//! - [`daemon`]: the real `phrony-runtime` process (start, stop, storage, signals, workers).
//! - [`db_faults`]: the database stalled under a running daemon (PostgreSQL restarted, a full disk).
//! - [`metrics`]: the HTTP probes and Prometheus metrics (`RUNTIME_HTTP_ADDR`).
//! - [`outage`]: the daemon while another process holds the SQLite write lock.
//! - [`sdk_fixture`]: the Python SDK's committed agent snapshot matches the compiler.
//! - [`traces`]: OpenTelemetry trace export to a fake OTLP collector, and to none.
//! - [`webhooks`]: webhooks to an in-process receiver (signatures, retries, restart, Slack).
//! - [`support`]: the daemon on a free port, fresh databases, a compiled test agent.

#![allow(
    clippy::too_many_lines,
    reason = "a test scenario reads top to bottom as one story; splitting it would hide its steps"
)]
#![allow(
    clippy::disallowed_methods,
    reason = "tests: PHRONY_BLESS re-records a fixture"
)]
#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod audit;
mod console;
mod daemon;
mod db_faults;
mod metrics;
mod outage;
mod sdk_fixture;
mod support;
mod traces;
mod webhooks;
