//! Integration tests of `phrony-manifest`, driven by the data files under `tests/fixtures`.
//!
//! Rule fixtures carry their expectations as trailing comments: `# expect: L:C path: message` for
//! each error, `# warn: L:C path: message` for each warning, or `# valid: …` for none. The
//! absolute fixture directory is written `<dir>` in messages.

// Helpers outside `#[test]` functions unwrap too: in tests a panic is a failed assertion.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a panic is a failed assertion"
)]

mod analysis;
mod args;
mod bundles;
mod cedar;
mod compile;
mod pins;
mod publication;
mod rules;
mod snapshot;
mod stub;
mod support;
