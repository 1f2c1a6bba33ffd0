//! The provider-neutral request and event model.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ProviderError;

/// Default `max_output_tokens` when the manifest leaves it unset (both vendors).
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 4096;

/// One model completion to stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// Vendor model id (`spec.model.name`).
    pub model: String,
    /// System prompt (`instructions.text`); `None` or empty sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Sampling and length parameters.
    #[serde(default)]
    pub parameters: Parameters,
    /// Reasoning effort, when the agent asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<ReasoningEffort>,
    /// The answer's JSON Schema, for providers with structured output (the agent's
    /// `output.schema` with `strict: true`); the others ignore it (the runtime checks every
    /// answer either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<ResponseSchema>,
}

/// A JSON Schema the answer must follow (OpenAI's `response_format: {type: json_schema}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseSchema {
    /// The format's name (`[A-Za-z0-9_-]{1,64}`).
    pub name: String,
    /// The JSON Schema object.
    pub schema: Value,
    /// Strict adherence (only a subset of JSON Schema is accepted by the vendor then).
    pub strict: bool,
}

impl CompletionRequest {
    /// A request for `spec.model` with its name, parameters and reasoning effort, and no messages yet.
    ///
    /// Fails when a field cannot be sent as is: an unknown reasoning effort, both `temperature` and
    /// `top_p`, or a `max_output_tokens` outside `0..=u32::MAX` (0 means the default, 4096).
    pub fn for_model(model: &phrony_manifest::Model) -> Result<Self, ProviderError> {
        let mut parameters = Parameters::default();
        if let Some(p) = &model.parameters {
            if p.temperature.is_some() && p.top_p.is_some() {
                return Err(ProviderError::InvalidConfig {
                    field: "spec.model.parameters",
                    message: "temperature and top_p are mutually exclusive".to_owned(),
                });
            }
            parameters.temperature = p.temperature;
            parameters.top_p = p.top_p;
            parameters.max_output_tokens = match p.max_output_tokens {
                0 => DEFAULT_MAX_OUTPUT_TOKENS,
                n => u32::try_from(n).map_err(|_| ProviderError::InvalidConfig {
                    field: "spec.model.parameters.max_output_tokens",
                    message: format!("{n} is not a positive 32-bit token count"),
                })?,
            };
            parameters.stop_sequences.clone_from(&p.stop_sequences);
        }
        let reasoning = match &model.reasoning {
            Some(r) if !r.effort.is_empty() => {
                Some(ReasoningEffort::parse(&r.effort).ok_or_else(|| {
                    ProviderError::InvalidConfig {
                        field: "spec.model.reasoning.effort",
                        message: format!("{:?} is not one of low, medium, high", r.effort),
                    }
                })?)
            }
            _ => None,
        };
        Ok(Self {
            model: model.name.clone(),
            system: None,
            messages: Vec::new(),
            tools: Vec::new(),
            parameters,
            reasoning,
            response_schema: None,
        })
    }

    /// Heuristic input size of this request in tokens: ⌈characters / 4⌉ over the system prompt and
    /// every message (text, tool-call names and arguments, tool results).
    pub fn estimated_input_tokens(&self) -> u64 {
        let mut chars = self.system.as_deref().map_or(0, char_count);
        for m in &self.messages {
            chars += m.char_count();
        }
        estimate_tokens(chars)
    }

    /// Checks the shapes both vendors rely on: tool uses only in assistant messages, tool results
    /// only in user messages.
    pub(crate) fn check(&self) -> Result<(), ProviderError> {
        if self.model.trim().is_empty() {
            return Err(ProviderError::InvalidRequest(
                "model name is empty (spec.model.name)".to_owned(),
            ));
        }
        for (i, m) in self.messages.iter().enumerate() {
            for block in &m.content {
                match (m.role, block) {
                    (Role::User, ContentBlock::ToolUse { .. }) => {
                        return Err(ProviderError::InvalidRequest(format!(
                            "message {i}: a tool_use block must be in an assistant message"
                        )));
                    }
                    (Role::Assistant, ContentBlock::ToolResult { .. }) => {
                        return Err(ProviderError::InvalidRequest(format!(
                            "message {i}: a tool_result block must be in a user message"
                        )));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// Sampling and length parameters (`spec.model.parameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parameters {
    /// Sampling temperature (exclusive with `top_p`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling (exclusive with `temperature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Cap on the answer's tokens; OpenAI gets it as `max_completion_tokens`, Anthropic as
    /// `max_tokens` (raised above the thinking budget when reasoning is on).
    pub max_output_tokens: u32,
    /// Sequences that stop generation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
}

impl Default for Parameters {
    fn default() -> Self {
        Self {
            temperature: None,
            top_p: None,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            stop_sequences: Vec::new(),
        }
    }
}

/// `spec.model.reasoning.effort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    /// OpenAI `low`; Anthropic thinking budget 1024 tokens.
    Low,
    /// OpenAI `medium`; Anthropic thinking budget 8192 tokens.
    Medium,
    /// OpenAI `high`; Anthropic thinking budget 16384 tokens.
    High,
}

impl ReasoningEffort {
    /// Parses `low`, `medium` or `high` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "low" => Some(Self::Low),
            "medium" => Some(Self::Medium),
            "high" => Some(Self::High),
            _ => None,
        }
    }

    /// Anthropic extended-thinking budget in tokens.
    pub fn anthropic_budget(self) -> u32 {
        match self {
            Self::Low => 1024,
            Self::Medium => 8192,
            Self::High => 16384,
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user, including tool results sent back to the model.
    User,
    /// The model.
    Assistant,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Content blocks in order.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A user message with one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            content: vec![ContentBlock::Text { text: text.into() }],
        }
    }

    /// An assistant message with one text block.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: vec![ContentBlock::Text { text: text.into() }],
        }
    }

    fn char_count(&self) -> usize {
        self.content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => char_count(text),
                ContentBlock::ToolUse { name, args, .. } => {
                    char_count(name) + char_count(&args.to_string())
                }
                ContentBlock::ToolResult { content, .. } => char_count(content),
                ContentBlock::Reasoning(_) => 0,
            })
            .sum()
    }
}

/// A block of message content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call made by the model (assistant messages only).
    ToolUse {
        /// Provider-assigned call id, echoed by the matching [`ContentBlock::ToolResult`].
        id: String,
        /// Wire name of the tool.
        name: String,
        /// Arguments as JSON.
        args: Value,
    },
    /// The outcome of a tool call (user messages only).
    ToolResult {
        /// Id of the [`ContentBlock::ToolUse`] this answers.
        tool_use_id: String,
        /// Result text (usually JSON) or error message.
        content: String,
        /// Whether the call failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// Model reasoning that must be replayed verbatim (Anthropic extended thinking: a tool-using
    /// assistant turn must be sent back with its thinking blocks). Other vendors drop it.
    Reasoning(ReasoningBlock),
}

/// An opaque reasoning block from extended thinking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReasoningBlock {
    /// Visible thinking with its integrity signature.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// Vendor signature that authenticates the block when it is sent back.
        signature: String,
    },
    /// Thinking the vendor encrypted.
    Redacted {
        /// Opaque payload.
        data: String,
    },
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Wire name.
    pub name: String,
    /// Description shown to the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments (an object schema; `null` sends an empty object schema).
    #[serde(default)]
    pub input_schema: Value,
}

impl ToolSpec {
    /// The schema as sent: the given object, or `{"type":"object","properties":{}}` when absent.
    pub(crate) fn schema_or_empty(&self) -> Value {
        match &self.input_schema {
            Value::Object(m) if !m.is_empty() => self.input_schema.clone(),
            _ => serde_json::json!({"type": "object", "properties": {}}),
        }
    }
}

/// Why a completion stopped, normalised across vendors.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The model finished its answer (`end_turn`, `stop`).
    EndTurn,
    /// The model wants tool results (`tool_use`, `tool_calls`).
    ToolUse,
    /// The output cap was hit (`max_tokens`, `length`).
    MaxTokens,
    /// Any other vendor reason, passed through; the runtime treats it as the end of the turn.
    Other(String),
}

impl StopReason {
    /// Normalises a vendor spelling.
    pub fn normalize(s: &str) -> Self {
        match s {
            "" | "end_turn" | "stop" => Self::EndTurn,
            "tool_use" | "tool_calls" => Self::ToolUse,
            "max_tokens" | "length" => Self::MaxTokens,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The normalised spelling (`end_turn`, `tool_use`, `max_tokens`, or the vendor's).
    pub fn as_str(&self) -> &str {
        match self {
            Self::EndTurn => "end_turn",
            Self::ToolUse => "tool_use",
            Self::MaxTokens => "max_tokens",
            Self::Other(s) => s,
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for StopReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::normalize(&s))
    }
}

/// Token usage of one completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (for Anthropic including cache reads and writes).
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// `true` when the vendor reported nothing and the counts are ⌈characters / 4⌉ estimates.
    #[serde(default)]
    pub estimated: bool,
}

impl Usage {
    /// `input_tokens + output_tokens`.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The reported usage when non-zero, else an estimate from the request's estimated input
    /// tokens and the number of output characters.
    pub(crate) fn or_estimate(self, input_estimate: u64, output_chars: usize) -> Self {
        if self.input_tokens > 0 || self.output_tokens > 0 {
            self
        } else {
            Self {
                input_tokens: input_estimate,
                output_tokens: estimate_tokens(output_chars),
                estimated: true,
            }
        }
    }
}

/// ⌈chars / 4⌉: the heuristic token count used when a vendor reports no usage.
pub fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

pub(crate) fn char_count(s: &str) -> usize {
    s.chars().count()
}

/// One streamed model event.
///
/// A stream yields any number of [`Event::TextDelta`], [`Event::Reasoning`] and
/// [`Event::ToolCall`], then exactly one [`Event::Completed`] and ends. A failure is an `Err` item,
/// after which the stream ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A piece of assistant text.
    TextDelta(String),
    /// A complete reasoning block (Anthropic extended thinking), to be kept in the assistant
    /// message so that it can be replayed.
    Reasoning(ReasoningBlock),
    /// A complete tool call.
    ToolCall {
        /// Provider call id (the stub numbers its calls `stub_call_<completion>_<n>`).
        id: String,
        /// Wire name of the tool.
        name: String,
        /// Parsed arguments. If the model produced text that is not JSON, this is that text as
        /// a JSON string, which fails the tool's object schema downstream (an `invalid_args`
        /// outcome the model can correct).
        args: Value,
    },
    /// The completion ended.
    Completed {
        /// Normalised stop reason.
        stop_reason: StopReason,
        /// Usage reported by the vendor, or estimated.
        usage: Usage,
    },
}

/// A whole completion gathered from a stream by [`Completion::collect`].
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// All text deltas joined.
    pub text: String,
    /// Reasoning blocks in order.
    pub reasoning: Vec<ReasoningBlock>,
    /// Tool calls in order: `(id, name, args)`.
    pub tool_calls: Vec<(String, String, Value)>,
    /// Normalised stop reason.
    pub stop_reason: StopReason,
    /// Token usage.
    pub usage: Usage,
}

impl Completion {
    /// Drains `stream` into one completion; the first error is returned as is.
    pub async fn collect(mut stream: crate::EventStream) -> Result<Self, ProviderError> {
        use futures::StreamExt as _;
        let mut text = String::new();
        let mut reasoning = Vec::new();
        let mut tool_calls = Vec::new();
        while let Some(item) = stream.next().await {
            match item? {
                Event::TextDelta(t) => text.push_str(&t),
                Event::Reasoning(r) => reasoning.push(r),
                Event::ToolCall { id, name, args } => tool_calls.push((id, name, args)),
                Event::Completed { stop_reason, usage } => {
                    return Ok(Self {
                        text,
                        reasoning,
                        tool_calls,
                        stop_reason,
                        usage,
                    });
                }
            }
        }
        Err(ProviderError::Truncated)
    }
}
