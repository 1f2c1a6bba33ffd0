//! `anthropic`: the Messages API with tool use, streamed as server-sent events.

use std::collections::HashMap;
use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource as _};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Map, Value, json};

use crate::driver::{Out, Translator, stalled_message, translate};
use crate::error::{ProviderError, RequestContext};
use crate::http::{connection_error, read_failure, truncate};
use crate::openai::parse_args;
use crate::retry::{RetryPolicy, open_with_retry};
use crate::types::char_count;
use crate::{
    ApiKey, CompletionRequest, ContentBlock, Event, EventStream, ModelProvider, ProviderKind,
    ReasoningBlock, Role, StopReason, Usage,
};

/// Default API root of provider `anthropic`.
pub(crate) const ANTHROPIC_API_BASE: &str = "https://api.anthropic.com";

/// The API version this client speaks.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The `anthropic` provider.
pub(crate) struct AnthropicProvider {
    http: reqwest::Client,
    base_url: String,
    headers: HeaderMap,
    retry: RetryPolicy,
    idle: Duration,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("base_url", &self.base_url)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    pub(crate) fn new(
        base_url: String,
        api_key: &ApiKey,
        http: reqwest::Client,
        retry: RetryPolicy,
        idle: Duration,
    ) -> Result<Self, ProviderError> {
        let mut key =
            HeaderValue::from_str(api_key.expose()).map_err(|_| ProviderError::InvalidConfig {
                field: "spec.model.secret",
                message: "the API key contains characters that cannot be sent in an HTTP header"
                    .to_owned(),
            })?;
        key.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", key);
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        Ok(Self {
            http,
            base_url,
            headers,
            retry,
            idle,
        })
    }
}

#[async_trait::async_trait]
impl ModelProvider for AnthropicProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Anthropic
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        request.check()?;
        let context = RequestContext {
            provider: ProviderKind::Anthropic,
            model: request.model.clone(),
            base_url: self.base_url.clone(),
        };
        let body = serde_json::to_vec(&messages_request(&request)).map_err(|e| {
            ProviderError::InvalidRequest(format!("cannot encode the request: {e}"))
        })?;
        let input_estimate = request.estimated_input_tokens();
        let url = format!("{}/v1/messages", self.base_url);
        open_with_retry(&self.retry, &context, || {
            let body = body.clone();
            let context = context.clone();
            let url = url.clone();
            async move {
                let response = self
                    .http
                    .post(&url)
                    .headers(self.headers.clone())
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| connection_error(&context, &url, e, None))?;
                if !response.status().is_success() {
                    return Err(ProviderError::Http {
                        context: Box::new(context),
                        failure: Box::new(read_failure(response).await),
                        attempts: 1,
                    });
                }
                let events = response.bytes_stream().eventsource();
                Ok(translate(
                    events,
                    SseTranslator::new(context, url, input_estimate),
                    self.idle,
                ))
            }
        })
        .await
    }
}

/// The Messages API request body.
///
/// The API refuses `tool_use` and `tool_result` blocks in a request that defines no tools, which
/// is what a request looks like once policy hides every tool mid-session (tool visibility): such
/// a request carries the earlier calls and results as text instead.
pub(crate) fn messages_request(req: &CompletionRequest) -> Value {
    let calls_as_text = req.tools.is_empty();
    let messages: Vec<Value> = req
        .messages
        .iter()
        .filter_map(|m| {
            let content = match m.role {
                Role::User => user_blocks(&m.content, calls_as_text),
                Role::Assistant => assistant_blocks(&m.content, calls_as_text),
            };
            (!content.is_empty()).then(|| {
                json!({
                    "role": match m.role { Role::User => "user", Role::Assistant => "assistant" },
                    "content": content,
                })
            })
        })
        .collect();
    let p = &req.parameters;
    let mut max_tokens = p.max_output_tokens;
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), Value::Bool(true));
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut tool = Map::new();
                tool.insert("name".into(), json!(t.name));
                if !t.description.is_empty() {
                    tool.insert("description".into(), json!(t.description));
                }
                tool.insert("input_schema".into(), t.schema_or_empty());
                Value::Object(tool)
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(t) = p.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(t) = p.top_p {
        body.insert("top_p".into(), json!(t));
    }
    if !p.stop_sequences.is_empty() {
        body.insert("stop_sequences".into(), json!(p.stop_sequences));
    }
    if let Some(effort) = req.reasoning {
        let budget = effort.anthropic_budget();
        // Thinking tokens count against max_tokens, which must exceed the budget: keep the
        // configured allowance for the answer on top of the budget.
        if max_tokens <= budget {
            max_tokens = budget.saturating_add(max_tokens);
        }
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    body.insert("max_tokens".into(), json!(max_tokens));
    Value::Object(body)
}

fn user_blocks(content: &[ContentBlock], calls_as_text: bool) -> Vec<Value> {
    // Tool results must come first in a user message, before any text.
    let mut blocks: Vec<Value> = content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } if calls_as_text => {
                let error = if *is_error { " (error)" } else { "" };
                Some(json!({
                    "type": "text",
                    "text": format!("[result of tool call {tool_use_id}{error}]: {content}"),
                }))
            }
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                let mut r =
                    json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": content});
                if *is_error {
                    r["is_error"] = Value::Bool(true);
                }
                Some(r)
            }
            _ => None,
        })
        .collect();
    blocks.extend(text_blocks(content));
    blocks
}

fn assistant_blocks(content: &[ContentBlock], calls_as_text: bool) -> Vec<Value> {
    // Thinking first, then text, then tool uses: the order Anthropic produced them in.
    let mut blocks: Vec<Value> = content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Reasoning(ReasoningBlock::Thinking {
                thinking,
                signature,
            }) => Some(json!({"type": "thinking", "thinking": thinking, "signature": signature})),
            ContentBlock::Reasoning(ReasoningBlock::Redacted { data }) => {
                Some(json!({"type": "redacted_thinking", "data": data}))
            }
            _ => None,
        })
        .collect();
    blocks.extend(text_blocks(content));
    blocks.extend(content.iter().filter_map(|b| match b {
        ContentBlock::ToolUse { id, name, args } => {
            // `input` must be an object; arguments that were not JSON were never dispatched.
            let input = if args.is_object() {
                args.clone()
            } else {
                json!({})
            };
            Some(if calls_as_text {
                json!({"type": "text", "text": format!("[tool call {id}: {name} {input}]")})
            } else {
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            })
        }
        _ => None,
    }));
    blocks
}

fn text_blocks(content: &[ContentBlock]) -> impl Iterator<Item = Value> + '_ {
    content.iter().filter_map(|b| match b {
        // The API rejects empty text blocks.
        ContentBlock::Text { text } if !text.is_empty() => {
            Some(json!({"type": "text", "text": text}))
        }
        _ => None,
    })
}

enum Block {
    Text,
    ToolUse {
        id: String,
        name: String,
        json: String,
        initial: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted {
        data: String,
    },
    Other,
}

struct SseTranslator {
    context: RequestContext,
    url: String,
    input_estimate: u64,
    saw_event: bool,
    blocks: HashMap<u64, Block>,
    stop_reason: Option<String>,
    usage: Usage,
    output_chars: usize,
}

impl SseTranslator {
    fn new(context: RequestContext, url: String, input_estimate: u64) -> Self {
        Self {
            context,
            url,
            input_estimate,
            saw_event: false,
            blocks: HashMap::new(),
            stop_reason: None,
            usage: Usage::default(),
            output_chars: 0,
        }
    }

    fn invalid(&self, detail: impl Into<String>) -> ProviderError {
        ProviderError::InvalidResponse {
            context: Box::new(self.context.clone()),
            detail: detail.into(),
        }
    }

    fn read_usage(&mut self, usage: &Value) {
        let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
        let input =
            n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens");
        if input > 0 {
            self.usage.input_tokens = input;
        }
        // output_tokens is cumulative in message_delta.
        if usage.get("output_tokens").is_some() {
            self.usage.output_tokens = n("output_tokens");
        }
    }

    fn on_data(&mut self, kind: &str, data: &Value, out: &mut Out) {
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        let str_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match kind {
            "message_start" => {
                if let Some(u) = data.pointer("/message/usage") {
                    self.read_usage(u);
                }
            }
            "content_block_start" => {
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let b = match block.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        let text = str_at(block, "text");
                        if !text.is_empty() {
                            self.output_chars += char_count(&text);
                            out.push_back(Ok(Event::TextDelta(text)));
                        }
                        Block::Text
                    }
                    "tool_use" => Block::ToolUse {
                        id: str_at(block, "id"),
                        name: str_at(block, "name"),
                        json: String::new(),
                        initial: block.get("input").cloned().unwrap_or(Value::Null),
                    },
                    "thinking" => Block::Thinking {
                        thinking: str_at(block, "thinking"),
                        signature: str_at(block, "signature"),
                    },
                    "redacted_thinking" => Block::Redacted {
                        data: str_at(block, "data"),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, b);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
                match (kind, self.blocks.get_mut(&index)) {
                    ("text_delta", _) => {
                        let text = str_at(delta, "text");
                        if !text.is_empty() {
                            self.output_chars += char_count(&text);
                            out.push_back(Ok(Event::TextDelta(text)));
                        }
                    }
                    ("input_json_delta", Some(Block::ToolUse { json, .. })) => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    ("thinking_delta", Some(Block::Thinking { thinking, .. })) => {
                        thinking
                            .push_str(delta.get("thinking").and_then(Value::as_str).unwrap_or(""));
                    }
                    ("signature_delta", Some(Block::Thinking { signature, .. })) => {
                        signature
                            .push_str(delta.get("signature").and_then(Value::as_str).unwrap_or(""));
                    }
                    ("input_json_delta" | "thinking_delta" | "signature_delta", None) => {
                        out.push_back(Err(self.invalid(format!(
                            "content_block_delta for block {index}, which was never started"
                        ))));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => match self.blocks.remove(&index) {
                Some(Block::ToolUse {
                    id,
                    name,
                    json,
                    initial,
                }) => {
                    let args = if json.trim().is_empty() {
                        match initial {
                            Value::Object(_) => initial,
                            _ => Value::Object(Map::new()),
                        }
                    } else {
                        parse_args(&json)
                    };
                    self.output_chars += char_count(&name) + char_count(&json);
                    out.push_back(Ok(Event::ToolCall { id, name, args }));
                }
                Some(Block::Thinking {
                    thinking,
                    signature,
                }) => out.push_back(Ok(Event::Reasoning(ReasoningBlock::Thinking {
                    thinking,
                    signature,
                }))),
                Some(Block::Redacted { data }) => {
                    out.push_back(Ok(Event::Reasoning(ReasoningBlock::Redacted { data })));
                }
                Some(Block::Text | Block::Other) | None => {}
            },
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(u) = data.get("usage") {
                    self.read_usage(u);
                }
            }
            "message_stop" => {
                let stop_reason = StopReason::normalize(self.stop_reason.as_deref().unwrap_or(""));
                out.push_back(Ok(Event::Completed {
                    stop_reason,
                    usage: self
                        .usage
                        .or_estimate(self.input_estimate, self.output_chars),
                }));
            }
            "error" => {
                let err = data.get("error").unwrap_or(&Value::Null);
                out.push_back(Err(ProviderError::Api {
                    context: Box::new(self.context.clone()),
                    kind: Some(str_at(err, "type"))
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| "error".to_owned()),
                    message: Some(str_at(err, "message"))
                        .filter(|s| !s.is_empty())
                        .unwrap_or_else(|| truncate(&data.to_string())),
                    attempts: 1,
                }));
            }
            // `ping` and event types added after this client was written are ignored, as the
            // API versioning policy asks.
            _ => {}
        }
    }
}

impl Translator<Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
    for SseTranslator
{
    fn on_item(
        &mut self,
        item: Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>,
        out: &mut Out,
    ) {
        let event = match item {
            Ok(e) => e,
            Err(EventStreamError::Transport(e)) => {
                out.push_back(Err(connection_error(
                    &self.context,
                    &self.url,
                    e,
                    Some("the response stream broke"),
                )));
                return;
            }
            Err(e) => {
                out.push_back(Err(self.invalid(format!("malformed event stream: {e}"))));
                return;
            }
        };
        if event.data.trim().is_empty() {
            return;
        }
        let data: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(e) => {
                out.push_back(Err(self.invalid(format!(
                    "event {:?} carries data that is not JSON ({e}): {}",
                    event.event,
                    truncate(&event.data)
                ))));
                return;
            }
        };
        self.saw_event = true;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .map_or_else(|| event.event.clone(), str::to_owned);
        self.on_data(&kind, &data, out);
    }

    fn stalled(&self, idle: Duration) -> ProviderError {
        ProviderError::Connection {
            context: Box::new(self.context.clone()),
            url: self.url.clone(),
            message: stalled_message(idle),
            retryable: true,
            attempts: 1,
        }
    }

    fn pending_bytes(&self) -> usize {
        self.blocks
            .values()
            .map(|b| match b {
                Block::ToolUse { id, name, json, .. } => id.len() + name.len() + json.len(),
                Block::Thinking {
                    thinking,
                    signature,
                } => thinking.len() + signature.len(),
                Block::Redacted { data } => data.len(),
                Block::Text | Block::Other => 0,
            })
            .sum()
    }

    fn on_end(&mut self, out: &mut Out) {
        let detail = if self.saw_event {
            "the stream ended before message_stop (the connection closed early)"
        } else {
            "the response carried no Messages API events (is it an event stream?)"
        };
        out.push_back(Err(self.invalid(detail)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, Parameters, ReasoningEffort};

    fn request(reasoning: Option<ReasoningEffort>, max: u32) -> CompletionRequest {
        CompletionRequest {
            model: "claude-sonnet-4-5".into(),
            system: None,
            messages: vec![Message::user_text("hi")],
            tools: vec![],
            parameters: Parameters {
                max_output_tokens: max,
                ..Parameters::default()
            },
            reasoning,
            response_schema: None,
        }
    }

    #[test]
    fn thinking_budget_stays_below_max_tokens() {
        let low = messages_request(&request(Some(ReasoningEffort::Low), 4096));
        assert_eq!(
            low["thinking"],
            json!({"type": "enabled", "budget_tokens": 1024})
        );
        assert_eq!(low["max_tokens"], 4096);
        let medium = messages_request(&request(Some(ReasoningEffort::Medium), 4096));
        assert_eq!(medium["thinking"]["budget_tokens"], 8192);
        assert_eq!(medium["max_tokens"], 8192 + 4096);
        let high = messages_request(&request(Some(ReasoningEffort::High), 20000));
        assert_eq!(high["thinking"]["budget_tokens"], 16384);
        assert_eq!(high["max_tokens"], 20000);
        let none = messages_request(&request(None, 4096));
        assert!(none.get("thinking").is_none());
        assert_eq!(none["max_tokens"], 4096);
    }

    /// Every tool hidden by policy (tool visibility): no `tools` key, and the earlier calls and
    /// results travel as text (the API refuses tool blocks without tool definitions); with
    /// tools, one entry each and the blocks as they were.
    #[test]
    fn an_empty_tool_list_sends_no_tools_and_earlier_calls_as_text() {
        let mut req = request(None, 4096);
        req.messages.push(Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Text {
                    text: "Looking.".into(),
                },
                ContentBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "lookup_order".into(),
                    args: json!({"order_id": "7"}),
                },
            ],
        });
        req.messages.push(Message {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "toolu_1".into(),
                content: "no such order".into(),
                is_error: true,
            }],
        });
        let body = messages_request(&req);
        assert!(body.get("tools").is_none(), "{body}");
        assert_eq!(
            body["messages"][1]["content"],
            json!([
                {"type": "text", "text": "Looking."},
                {"type": "text", "text": "[tool call toolu_1: lookup_order {\"order_id\":\"7\"}]"}
            ])
        );
        assert_eq!(
            body["messages"][2]["content"],
            json!([{"type": "text", "text": "[result of tool call toolu_1 (error)]: no such order"}])
        );
        req.tools.push(crate::ToolSpec {
            name: "lookup_order".into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
        });
        let body = messages_request(&req);
        assert_eq!(body["tools"][0]["name"], "lookup_order");
        assert!(body["tools"][0].get("description").is_none());
        assert_eq!(body["messages"][1]["content"][1]["type"], "tool_use");
        assert_eq!(
            body["messages"][2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such order", "is_error": true})
        );
    }
}
