#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[cfg(feature = "cedar")]
pub mod cedar;
#[cfg(feature = "cedar")]
mod cedar_doc;
mod condition;
mod decision;
mod def;
mod error;
mod explain;
mod gate;
mod history;
mod ops;
mod path;
mod policy;
mod request;
mod set;
mod slots;
mod text;
mod value;

#[cfg(feature = "cedar")]
pub use cedar_doc::MAX_CEDAR_BYTES;
pub use decision::{Decision, DecisionKind};
pub use def::{PolicyDef, PolicyId, TimeoutDef};
pub use error::{CompileError, CompileErrorKind, CompileErrors};
pub use explain::{Effect, Explanation, PolicyTrace};
pub use history::{
    Aggregate, EarlierCall, HistoryFact, HistoryFacts, HistoryQuery, HistoryScope,
    MAX_HISTORY_QUERIES, MAX_HISTORY_WINDOW_SECS, parse_window,
};
pub use policy::{Action, Mode, OnModify, OnReject, Policy, Timeout, TimeoutDefault};
pub use request::{AgentCtx, Request, SessionCtx, ToolCtx, Trigger, UnknownTrigger};
pub use set::{PolicySet, ShadowOutcome};

#[cfg(test)]
mod tests;
