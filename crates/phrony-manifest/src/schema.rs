//! JSON Schema checks: schemas in manifests must be valid, and tool arguments can be validated
//! against a binding's `input_schema` before dispatch.

use std::fmt;

use serde_json::Value;

use crate::model::compiled::ToolBinding;
use crate::yaml_pos::{child_index, child_key};

/// The input schema the runtime sends when a binding has none.
pub(crate) fn default_input_schema() -> Value {
    serde_json::json!({"type": "object"})
}

/// A schema problem: where inside the schema (our path syntax, relative to the schema root) and
/// what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaProblem {
    pub(crate) path: String,
    pub(crate) message: String,
}

/// Checks that `schema` is a valid JSON Schema (meta-schema validation, and everything the
/// validator needs to build: regexes, local `$ref`s). Remote `$ref`s are refused: schemas must be
/// self-contained.
pub(crate) fn check_schema(schema: &Value) -> Result<(), SchemaProblem> {
    build_validator(schema).map(|_| ())
}

fn build_validator(schema: &Value) -> Result<jsonschema::Validator, SchemaProblem> {
    if !schema.is_object() {
        return Err(SchemaProblem {
            path: String::new(),
            message: "a JSON Schema must be an object".to_owned(),
        });
    }
    jsonschema::validator_for(schema).map_err(|e| SchemaProblem {
        path: pointer_to_path(schema, e.instance_path().as_str()),
        message: format!("invalid JSON Schema: {e}"),
    })
}

/// Turns a JSON pointer into `a.b[0].c`, using the value to tell array indexes from keys.
fn pointer_to_path(root: &Value, pointer: &str) -> String {
    let mut path = String::new();
    let mut node = Some(root);
    for raw in pointer.split('/').skip(1) {
        let seg = raw.replace("~1", "/").replace("~0", "~");
        match node {
            Some(Value::Array(items)) => match seg.parse::<usize>() {
                Ok(i) => {
                    path = child_index(&path, i);
                    node = items.get(i);
                }
                Err(_) => {
                    path = child_key(&path, &seg);
                    node = None;
                }
            },
            Some(Value::Object(map)) => {
                path = child_key(&path, &seg);
                node = map.get(&seg);
            }
            _ => {
                path = child_key(&path, &seg);
                node = None;
            }
        }
    }
    path
}

/// One way the arguments do not match the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// JSON pointer to the offending value inside the arguments (`""` is the whole object).
    pub path: String,
    /// What is wrong, e.g. `"x" is not of type "number"`.
    pub message: String,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Why a [`ToolArgsValidator`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool {tool:?}: {message}")]
pub struct SchemaError {
    /// The binding's wire name.
    pub tool: String,
    /// What is wrong with its schema.
    pub message: String,
}

/// Validates tool-call arguments against one binding's `input_schema`. Compile once per binding,
/// validate every call.
pub struct ToolArgsValidator {
    validator: jsonschema::Validator,
}

impl fmt::Debug for ToolArgsValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolArgsValidator").finish_non_exhaustive()
    }
}

impl ToolArgsValidator {
    /// Builds the validator of a compiled binding. A binding without a schema gets the runtime's
    /// default `{"type":"object"}`.
    pub fn for_binding(binding: &ToolBinding) -> Result<Self, SchemaError> {
        let schema = binding
            .input_schema
            .as_ref()
            .and_then(|s| s.inline.as_ref())
            .map_or_else(default_input_schema, |j| j.0.clone());
        Self::new(&schema).map_err(|message| SchemaError {
            tool: binding.wire_name(),
            message,
        })
    }

    /// Builds a validator from a schema value.
    pub fn new(schema: &Value) -> Result<Self, String> {
        let validator = build_validator(schema).map_err(|p| {
            if p.path.is_empty() {
                p.message
            } else {
                format!("{}: {}", p.path, p.message)
            }
        })?;
        Ok(Self { validator })
    }

    /// Checks arguments, reporting every violation.
    pub fn validate(&self, args: &Value) -> Result<(), Vec<ArgError>> {
        let errors: Vec<ArgError> = self
            .validator
            .iter_errors(args)
            .map(|e| ArgError {
                path: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}
