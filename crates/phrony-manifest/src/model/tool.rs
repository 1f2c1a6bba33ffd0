//! `kind: Tool`: the portable tool contract read from `tools/*.yaml` (§1.3).

use serde::Deserialize;

use super::common::{MetadataDoc, SchemaDoc, nd};

/// A Tool document.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ToolDoc {
    #[serde(rename = "apiVersion", default, deserialize_with = "nd")]
    pub(crate) api_version: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) metadata: MetadataDoc,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) spec: ToolSpecDoc,
}

/// `spec` of a Tool.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ToolSpecDoc {
    #[serde(default, deserialize_with = "nd")]
    pub(crate) description: String,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) side_effect_class: String,
    #[serde(default)]
    pub(crate) input_schema: Option<SchemaDoc>,
    #[serde(default)]
    pub(crate) output_schema: Option<SchemaDoc>,
    #[serde(default, deserialize_with = "nd")]
    pub(crate) default_policies: Vec<String>,
    /// Default execution deadline of one call, for bindings that set none (see
    /// `ToolBindingDoc::timeout`).
    #[serde(default, deserialize_with = "nd")]
    pub(crate) timeout: String,
}
