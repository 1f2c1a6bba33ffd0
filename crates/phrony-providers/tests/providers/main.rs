//! The model providers' integration tests in one binary.
//!
//! - [`anthropic`] and [`openai`]: each vendor's wire format against a local fake API
//!   (`phrony_test_support::fake_api`).
//! - [`stub`]: the scripted stub provider.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

mod anthropic;
mod openai;
mod stub;
