//! Typed documents: the authoring kinds read from YAML (`agent`, `tool`, `policy`, `bundle`) and
//! the compiled snapshot (`compiled`).

pub(crate) mod agent;
pub(crate) mod bundle;
pub(crate) mod common;
pub(crate) mod compiled;
pub(crate) mod policy;
pub(crate) mod tool;
