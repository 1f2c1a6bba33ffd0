//! The engine's integration tests, one binary: every flow runs on the real ledger. "In memory"
//! below means the ledger on SQLite `:memory:` with its clock following the test's
//! [`phrony_engine::ManualClock`]; `ledger` also runs flows on a SQLite file and on PostgreSQL.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod common;

mod approval_watch;
mod approvals;
mod attach;
mod bounds;
mod dispatch;
mod event_fixture;
mod input_bounds;
mod ledger;
mod mcp;
mod modules;
mod outage;
mod output;
mod park;
mod provider_faults;
mod refund;
mod replicas;
mod sessions;
mod shadow;
mod visibility;
mod vote;
