//! The model providers' integration tests in one binary.
//!
//! - [`anthropic`] and [`openai`]: each vendor's wire format against a local fake API
//!   (`phrony_test_support::fake_api`).
//! - [`stub`]: the scripted stub provider.

mod anthropic;
mod openai;
mod stub;
