//! JSON Schema checks: schemas in manifests must be valid, and tool arguments can be validated
//! against a binding's `input_schema` before dispatch.

use std::fmt;

use serde_json::Value;

use crate::model::compiled::{CompiledAgent, ToolBinding};
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

/// At most this many problems are reported per answer (the rest are counted).
const MAX_OUTPUT_ERRORS: usize = 20;
/// A problem's text is cut to this many characters (schema messages quote the value).
const MAX_OUTPUT_ERROR_CHARS: usize = 500;

/// Checks a final answer against an agent's `output` section when its `format` is `json`: the
/// answer must be one JSON document (surrounding whitespace and one Markdown code fence, as in
/// ```` ```json … ``` ````, are ignored) and, when the section has a `schema`, valid against it.
/// Build once per agent version ([`OutputValidator::for_agent`]), check every answer.
pub struct OutputValidator {
    validator: Option<jsonschema::Validator>,
    schema: Option<Value>,
}

impl fmt::Debug for OutputValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutputValidator")
            .field("schema", &self.schema.is_some())
            .finish_non_exhaustive()
    }
}

/// Why an [`OutputValidator`] could not be built: the agent's `output.schema` is not a usable
/// JSON Schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("output.schema: {message}")]
pub struct OutputSchemaError {
    /// What is wrong with the schema.
    pub message: String,
}

impl OutputValidator {
    /// The check of `agent`'s output, or `None` when its output is free text (`format` unset
    /// or `text`).
    ///
    /// # Errors
    /// [`OutputSchemaError`] when `output.schema` is not a valid JSON Schema.
    pub fn for_agent(agent: &CompiledAgent) -> Result<Option<Self>, OutputSchemaError> {
        let Some(output) = agent.output.as_ref().filter(|o| o.format == "json") else {
            return Ok(None);
        };
        let schema = output
            .schema
            .as_ref()
            .and_then(|s| s.inline.as_ref())
            .map(|j| j.0.clone());
        let validator = match &schema {
            Some(s) => Some(build_validator(s).map_err(|p| OutputSchemaError {
                message: if p.path.is_empty() {
                    p.message
                } else {
                    format!("{}: {}", p.path, p.message)
                },
            })?),
            None => None,
        };
        Ok(Some(Self { validator, schema }))
    }

    /// `answer` as JSON, read as [`check`](Self::check) reads it (whitespace and one code fence
    /// ignored), without the schema: what a human accepted.
    #[must_use]
    pub fn parse(answer: &str) -> Option<Value> {
        serde_json::from_str(strip_fence(answer)).ok()
    }

    /// The output schema, when there is one.
    #[must_use]
    pub fn schema(&self) -> Option<&Value> {
        self.schema.as_ref()
    }

    /// Parses and validates `answer`: the JSON value, or what is wrong with it (`not JSON: …`,
    /// or one `/path: message` line per schema violation, at most 20, each at most 500
    /// characters).
    ///
    /// # Errors
    /// The problems, never empty.
    pub fn check(&self, answer: &str) -> Result<Value, Vec<String>> {
        let text = strip_fence(answer);
        let value: Value = serde_json::from_str(text).map_err(|e| {
            vec![cut(format!(
                "not JSON: {e}; the answer must be one JSON document and nothing else"
            ))]
        })?;
        let Some(validator) = &self.validator else {
            return Ok(value);
        };
        let mut errors = Vec::new();
        let mut total = 0usize;
        for e in validator.iter_errors(&value) {
            total += 1;
            if errors.len() < MAX_OUTPUT_ERRORS {
                let path = e.instance_path().as_str().to_owned();
                let at = if path.is_empty() {
                    "/".to_owned()
                } else {
                    path
                };
                errors.push(cut(format!("{at}: {e}")));
            }
        }
        if total > errors.len() {
            errors.push(format!("… and {} more", total - errors.len()));
        }
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(errors)
        }
    }
}

/// The answer without surrounding whitespace and, when it is one fenced block, the fence.
fn strip_fence(answer: &str) -> &str {
    let t = answer.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return t;
    };
    // The info string (`json`) runs to the first newline.
    match body.split_once('\n') {
        Some((info, inner)) if !info.contains('`') => inner.trim(),
        _ => t,
    }
}

fn cut(mut s: String) -> String {
    if let Some((i, _)) = s.char_indices().nth(MAX_OUTPUT_ERROR_CHARS) {
        s.truncate(i);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod output_tests {
    use super::*;
    use crate::model::compiled::{Output, Schema};

    fn agent(format: &str, schema: Option<Value>) -> CompiledAgent {
        let mut a: CompiledAgent = serde_json::from_value(serde_json::json!({
            "apiVersion": "phrony.com/v1", "kind": "Agent",
            "metadata": {"name": "a", "namespace": "n", "version": "1.0.0"},
            "spec": {"purpose": "p", "instructions": {"text": "t"},
                     "model": {"provider": "stub", "name": "s"}}
        }))
        .unwrap();
        a.output = Some(Output {
            format: format.to_owned(),
            schema: schema.map(|s| Schema {
                inline: Some(crate::canonical::Json(s)),
                ..Schema::default()
            }),
            ..Output::default()
        });
        a
    }

    #[test]
    fn text_output_has_no_check_and_json_output_parses_and_validates() {
        assert!(
            OutputValidator::for_agent(&agent("text", None))
                .unwrap()
                .is_none()
        );
        assert!(
            OutputValidator::for_agent(&agent("", None))
                .unwrap()
                .is_none()
        );
        let any = OutputValidator::for_agent(&agent("json", None))
            .unwrap()
            .unwrap();
        assert_eq!(any.check(" [1, 2] ").unwrap(), serde_json::json!([1, 2]));
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"refund_id": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["refund_id", "amount"]
        });
        let v = OutputValidator::for_agent(&agent("json", Some(schema)))
            .unwrap()
            .unwrap();
        assert_eq!(
            v.check("```json\n{\"refund_id\": \"rf_1\", \"amount\": 5}\n```")
                .unwrap(),
            serde_json::json!({"refund_id": "rf_1", "amount": 5})
        );
        let errors = v.check("{\"refund_id\": 7}").unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("/refund_id: 7 is not of type")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("/: \"amount\" is a required property")),
            "{errors:?}"
        );
        let not_json = v.check("The refund was issued.").unwrap_err();
        assert!(not_json[0].starts_with("not JSON: "), "{not_json:?}");
        let long = format!("\"{}\"", "x".repeat(5000));
        let cut = v.check(&long).unwrap_err();
        assert!(
            cut[0].chars().count() <= MAX_OUTPUT_ERROR_CHARS + 1,
            "{cut:?}"
        );
    }
}
