//! `openai` and `openai-compatible`: Chat Completions streaming through async-openai.
//!
//! async-openai builds and authenticates the request, sends it through our transport (a tower
//! service that keeps the status, `Retry-After` and body of failed responses for the §8.6
//! messages) and parses the SSE stream. Chunks are decoded into lenient types of our own (its
//! "bring your own types" mode) so that OpenAI-compatible servers with extra or missing fields
//! and unknown `finish_reason`s still work.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::Config;
use async_openai::error::{OpenAIError, StreamError};
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestAssistantMessageContent,
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestSystemMessageContent, ChatCompletionRequestToolMessage,
    ChatCompletionRequestToolMessageContent, ChatCompletionRequestUserMessage,
    ChatCompletionRequestUserMessageContent, ChatCompletionStreamOptions, ChatCompletionTool,
    ChatCompletionTools, CreateChatCompletionRequest, FunctionCall, FunctionObject,
    ReasoningEffort as OaiEffort, ResponseFormat, ResponseFormatJsonSchema, StopConfiguration,
};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::driver::{Out, Translator, stalled_message, translate};
use crate::error::{HttpFailure, ProviderError, RequestContext};
use crate::http::{connection_error, error_chain, read_failure, truncate};
use crate::retry::{RetryPolicy, open_with_retry};
use crate::types::char_count;
use crate::{
    ApiKey, CompletionRequest, ContentBlock, Event, EventStream, ModelProvider, ProviderKind,
    ReasoningEffort, Role, StopReason, Usage,
};

/// Default API root of provider `openai`.
pub(crate) const OPENAI_API_BASE: &str = "https://api.openai.com/v1";

/// Longest tool-call id OpenAI accepts.
const MAX_CALL_ID_LEN: usize = 64;

/// async-openai configuration that never reads the daemon's environment (its default config
/// would pick up `OPENAI_API_KEY` and send it to whatever base URL a session names).
struct ApiConfig {
    api_base: String,
    auth: Option<HeaderValue>,
    api_key: SecretString,
}

impl Config for ApiConfig {
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        headers
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.api_base)
    }

    fn query(&self) -> Vec<(&str, &str)> {
        Vec::new()
    }

    fn api_base(&self) -> &str {
        &self.api_base
    }

    fn api_key(&self) -> &SecretString {
        &self.api_key
    }
}

/// A non-success response carried through async-openai as a boxed error.
#[derive(Debug)]
struct StatusError(HttpFailure);

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} returned HTTP {}", self.0.url, self.0.status)
    }
}

impl std::error::Error for StatusError {}

/// The tower service async-openai sends requests through: plain reqwest, but failed responses
/// become a [`StatusError`] with everything the error message and the retry loop need.
#[derive(Clone)]
struct Transport {
    http: reqwest::Client,
}

type TransportFuture =
    Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send + 'static>>;

impl tower::Service<HttpRequestFactory> for Transport {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = TransportFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let http = self.http.clone();
        Box::pin(async move {
            let request = factory.build().await?;
            let response = http.execute(request).await.map_err(OpenAIError::Reqwest)?;
            if response.status().is_success() {
                Ok(response)
            } else {
                let failure = read_failure(response).await;
                Err(OpenAIError::Boxed(Box::new(StatusError(failure))))
            }
        })
    }
}

/// The `openai` / `openai-compatible` provider.
pub(crate) struct OpenAiProvider {
    kind: ProviderKind,
    client: Client<ApiConfig>,
    base_url: String,
    retry: RetryPolicy,
    idle: Duration,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    pub(crate) fn new(
        kind: ProviderKind,
        base_url: String,
        api_key: Option<ApiKey>,
        http: reqwest::Client,
        retry: RetryPolicy,
        idle: Duration,
    ) -> Result<Self, ProviderError> {
        let auth = match &api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                    .map_err(|_| ProviderError::InvalidConfig {
                        field: "spec.model.secret",
                        message:
                            "the API key contains characters that cannot be sent in an HTTP header"
                                .to_owned(),
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let config = ApiConfig {
            api_base: base_url.clone(),
            auth,
            api_key: SecretString::from(api_key.map(|k| k.expose().to_owned()).unwrap_or_default()),
        };
        // The same client builds and sends requests; Transport only adds error capture.
        let client = Client::build(http.clone(), config).with_http_service(Transport { http });
        Ok(Self {
            kind,
            client,
            base_url,
            retry,
            idle,
        })
    }

    fn context(&self, model: &str) -> RequestContext {
        RequestContext {
            provider: self.kind,
            model: model.to_owned(),
            base_url: self.base_url.clone(),
        }
    }
}

/// The Chat Completions endpoint under an API root (`{base}/chat/completions`): where a request
/// goes and what its errors, also those of a stream that breaks or stalls, name.
fn endpoint(base_url: &str) -> String {
    format!("{base_url}/chat/completions")
}

#[async_trait::async_trait]
impl ModelProvider for OpenAiProvider {
    fn kind(&self) -> ProviderKind {
        self.kind
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        request.check()?;
        let context = self.context(&request.model);
        let body = chat_request(&request);
        let input_estimate = request.estimated_input_tokens();
        let endpoint = endpoint(&self.base_url);
        open_with_retry(&self.retry, &context, || {
            let body = body.clone();
            let context = context.clone();
            let endpoint = endpoint.clone();
            async move {
                let chunks = self
                    .client
                    .chat()
                    .create_stream_byot::<_, Chunk>(body)
                    .await
                    .map_err(|e| map_error(&context, &endpoint, e))?;
                Ok(translate(
                    chunks,
                    ChunkTranslator::new(context, input_estimate),
                    self.idle,
                ))
            }
        })
        .await
    }
}

/// `call_<first 32 hex of sha256(id)>` for ids longer than OpenAI's 64-character limit.
pub(crate) fn openai_call_id(id: &str) -> String {
    if id.len() <= MAX_CALL_ID_LEN {
        return id.to_owned();
    }
    let digest = hex::encode(Sha256::digest(id.as_bytes()));
    format!("call_{}", &digest[..32])
}

/// The Chat Completions request body.
fn chat_request(req: &CompletionRequest) -> CreateChatCompletionRequest {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(ChatCompletionRequestMessage::System(
            ChatCompletionRequestSystemMessage {
                content: ChatCompletionRequestSystemMessageContent::Text(system.to_owned()),
                name: None,
            },
        ));
    }
    for m in &req.messages {
        let texts: Vec<&str> = m
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } if !text.is_empty() => Some(text.as_str()),
                _ => None,
            })
            .collect();
        match m.role {
            Role::User => {
                // Tool results must directly follow the assistant message that called the tools.
                for b in &m.content {
                    if let ContentBlock::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } = b
                    {
                        messages.push(ChatCompletionRequestMessage::Tool(
                            ChatCompletionRequestToolMessage {
                                content: ChatCompletionRequestToolMessageContent::Text(
                                    content.clone(),
                                ),
                                tool_call_id: openai_call_id(tool_use_id),
                            },
                        ));
                    }
                }
                if !texts.is_empty() {
                    messages.push(ChatCompletionRequestMessage::User(
                        ChatCompletionRequestUserMessage {
                            content: ChatCompletionRequestUserMessageContent::Text(
                                texts.join("\n"),
                            ),
                            name: None,
                        },
                    ));
                }
            }
            Role::Assistant => {
                let calls: Vec<ChatCompletionMessageToolCalls> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::ToolUse { id, name, args } => {
                            Some(ChatCompletionMessageToolCalls::Function(
                                ChatCompletionMessageToolCall {
                                    id: openai_call_id(id),
                                    function: FunctionCall {
                                        name: name.clone(),
                                        arguments: match args {
                                            Value::String(raw) => raw.clone(),
                                            other => other.to_string(),
                                        },
                                    },
                                },
                            ))
                        }
                        _ => None,
                    })
                    .collect();
                if texts.is_empty() && calls.is_empty() {
                    continue;
                }
                messages.push(ChatCompletionRequestMessage::Assistant(
                    ChatCompletionRequestAssistantMessage {
                        content: (!texts.is_empty()).then(|| {
                            ChatCompletionRequestAssistantMessageContent::Text(texts.join("\n"))
                        }),
                        tool_calls: (!calls.is_empty()).then_some(calls),
                        ..Default::default()
                    },
                ));
            }
        }
    }
    let tools: Vec<ChatCompletionTools> = req
        .tools
        .iter()
        .map(|t| {
            ChatCompletionTools::Function(ChatCompletionTool {
                function: FunctionObject {
                    name: t.name.clone(),
                    description: (!t.description.is_empty()).then(|| t.description.clone()),
                    parameters: Some(t.schema_or_empty()),
                    strict: None,
                },
            })
        })
        .collect();
    let p = &req.parameters;
    CreateChatCompletionRequest {
        model: req.model.clone(),
        messages,
        max_completion_tokens: Some(p.max_output_tokens),
        temperature: p.temperature.map(|t| t as f32),
        top_p: p.top_p.map(|t| t as f32),
        stop: (!p.stop_sequences.is_empty())
            .then(|| StopConfiguration::StringArray(p.stop_sequences.clone())),
        tools: (!tools.is_empty()).then_some(tools),
        response_format: req
            .response_schema
            .as_ref()
            .map(|r| ResponseFormat::JsonSchema {
                json_schema: ResponseFormatJsonSchema {
                    description: None,
                    name: r.name.clone(),
                    schema: r.schema.clone(),
                    strict: Some(r.strict),
                },
            }),
        reasoning_effort: req.reasoning.map(|e| match e {
            ReasoningEffort::Low => OaiEffort::Low,
            ReasoningEffort::Medium => OaiEffort::Medium,
            ReasoningEffort::High => OaiEffort::High,
        }),
        stream: Some(true),
        stream_options: Some(ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        }),
        ..Default::default()
    }
}

fn map_error(context: &RequestContext, endpoint: &str, e: OpenAIError) -> ProviderError {
    match e {
        OpenAIError::Boxed(boxed) => match boxed.downcast::<StatusError>() {
            Ok(status) => ProviderError::Http {
                context: Box::new(context.clone()),
                failure: Box::new(status.0),
                attempts: 1,
            },
            Err(other) => ProviderError::Connection {
                context: Box::new(context.clone()),
                url: endpoint.to_owned(),
                message: error_chain(other.as_ref()),
                retryable: false,
                attempts: 1,
            },
        },
        OpenAIError::Reqwest(e) => connection_error(context, endpoint, e, None),
        OpenAIError::JSONDeserialize(e, content) => ProviderError::InvalidResponse {
            context: Box::new(context.clone()),
            detail: format!(
                "a stream chunk is not a chat completion chunk ({e}): {}",
                truncate(&content)
            ),
        },
        OpenAIError::StreamError(se) => match *se {
            StreamError::EventStream(message) => ProviderError::Connection {
                context: Box::new(context.clone()),
                url: endpoint.to_owned(),
                message: format!("the response stream broke: {message}"),
                retryable: true,
                attempts: 1,
            },
            other => ProviderError::InvalidResponse {
                context: Box::new(context.clone()),
                detail: truncate(&other.to_string()),
            },
        },
        OpenAIError::ApiError(api) => ProviderError::Http {
            context: Box::new(context.clone()),
            failure: Box::new(HttpFailure {
                url: endpoint.to_owned(),
                status: api.status_code.as_u16(),
                reason: api
                    .status_code
                    .canonical_reason()
                    .unwrap_or_default()
                    .to_owned(),
                detail: truncate(&api.api_error.to_string()),
                retry_after: None,
            }),
            attempts: 1,
        },
        other => ProviderError::InvalidRequest(other.to_string()),
    }
}

/// One `chat.completion.chunk`, decoded leniently.
#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    id: String,
    #[serde(default)]
    choices: Vec<ChoiceChunk>,
    #[serde(default)]
    usage: Option<UsageChunk>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ChoiceChunk {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<DeltaChunk>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct DeltaChunk {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallChunk>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallChunk {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionChunk>,
}

#[derive(Debug, Deserialize)]
struct FunctionChunk {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UsageChunk {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

struct ChunkTranslator {
    context: RequestContext,
    input_estimate: u64,
    response_id: String,
    saw_chunk: bool,
    finish: Option<String>,
    calls: BTreeMap<u32, PartialCall>,
    last_index: Option<u32>,
    usage: Usage,
    output_chars: usize,
}

impl ChunkTranslator {
    fn new(context: RequestContext, input_estimate: u64) -> Self {
        Self {
            context,
            input_estimate,
            response_id: String::new(),
            saw_chunk: false,
            finish: None,
            calls: BTreeMap::new(),
            last_index: None,
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

    fn on_tool_chunk(&mut self, c: ToolCallChunk) {
        // Servers that omit `index` send one call per chunk run; a new id starts a new call.
        let index = c.index.unwrap_or_else(|| match (self.last_index, &c.id) {
            (Some(last), Some(id))
                if !id.is_empty() && self.calls.get(&last).is_some_and(|p| p.id != *id) =>
            {
                last + 1
            }
            (Some(last), _) => last,
            (None, _) => 0,
        });
        self.last_index = Some(index);
        let call = self.calls.entry(index).or_default();
        if let Some(id) = c.id.filter(|id| !id.is_empty())
            && call.id.is_empty()
        {
            call.id = id;
        }
        if let Some(f) = c.function {
            if let Some(name) = f.name.filter(|n| !n.is_empty()) {
                // Some servers repeat the whole name in every chunk; OpenAI sends it once.
                if call.name.is_empty() {
                    call.name = name;
                } else if call.name != name {
                    call.name.push_str(&name);
                }
            }
            if let Some(args) = f.arguments {
                call.arguments.push_str(&args);
            }
        }
    }
}

impl Translator<Result<Chunk, OpenAIError>> for ChunkTranslator {
    fn on_item(&mut self, item: Result<Chunk, OpenAIError>, out: &mut Out) {
        let chunk = match item {
            Ok(c) => c,
            Err(e) => {
                let endpoint = endpoint(&self.context.base_url);
                out.push_back(Err(map_error(&self.context, &endpoint, e)));
                return;
            }
        };
        if let Some(err) = chunk.error {
            let field = |k: &str| err.get(k).and_then(Value::as_str).map(str::to_owned);
            out.push_back(Err(ProviderError::Api {
                context: Box::new(self.context.clone()),
                kind: field("type")
                    .or_else(|| field("code"))
                    .unwrap_or_else(|| "error".to_owned()),
                message: field("message").unwrap_or_else(|| truncate(&err.to_string())),
                attempts: 1,
            }));
            return;
        }
        self.saw_chunk = true;
        if self.response_id.is_empty() {
            self.response_id = chunk.id;
        }
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            let delta = choice.delta.unwrap_or_default();
            for text in [delta.content, delta.refusal].into_iter().flatten() {
                if !text.is_empty() {
                    self.output_chars += char_count(&text);
                    out.push_back(Ok(Event::TextDelta(text)));
                }
            }
            for c in delta.tool_calls.into_iter().flatten() {
                self.on_tool_chunk(c);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish = Some(reason);
            }
        }
        if let Some(u) = chunk.usage {
            self.usage = Usage {
                input_tokens: u.prompt_tokens,
                output_tokens: u.completion_tokens,
                estimated: false,
            };
        }
    }

    fn stalled(&self, idle: Duration) -> ProviderError {
        ProviderError::Connection {
            context: Box::new(self.context.clone()),
            url: endpoint(&self.context.base_url),
            message: stalled_message(idle),
            retryable: true,
            attempts: 1,
        }
    }

    fn pending_bytes(&self) -> usize {
        self.calls
            .values()
            .map(|c| c.id.len() + c.name.len() + c.arguments.len())
            .sum()
    }

    fn on_end(&mut self, out: &mut Out) {
        if !self.saw_chunk {
            out.push_back(Err(self.invalid(
                "the response carried no chat completion chunks (is it an event stream?)",
            )));
            return;
        }
        let Some(finish) = self.finish.take() else {
            out.push_back(Err(self.invalid(
                "the stream ended before a finish_reason (the connection closed early)",
            )));
            return;
        };
        let mut stop_reason = StopReason::normalize(&finish);
        let calls = std::mem::take(&mut self.calls);
        // Some compatible servers (Ollama among them) finish tool-calling chunks with "stop".
        if !calls.is_empty() && stop_reason == StopReason::EndTurn {
            stop_reason = StopReason::ToolUse;
        }
        for (index, call) in calls {
            self.output_chars += char_count(&call.name) + char_count(&call.arguments);
            let id = if call.id.is_empty() {
                let digest = hex::encode(Sha256::digest(
                    format!("{}:{index}:{}", self.response_id, call.name).as_bytes(),
                ));
                format!("call_{}", &digest[..24])
            } else {
                call.id
            };
            out.push_back(Ok(Event::ToolCall {
                id,
                name: call.name,
                args: parse_args(&call.arguments),
            }));
        }
        out.push_back(Ok(Event::Completed {
            stop_reason,
            usage: self
                .usage
                .or_estimate(self.input_estimate, self.output_chars),
        }));
    }
}

/// Tool-call arguments: `{}` when empty, the parsed JSON, or the raw text as a JSON string.
pub(crate) fn parse_args(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolSpec};
    use serde_json::json;

    #[test]
    fn long_call_ids_are_shortened_deterministically() {
        let short = "call_abc";
        assert_eq!(openai_call_id(short), short);
        let exactly = "x".repeat(64);
        assert_eq!(openai_call_id(&exactly), exactly);
        let long = "toolu_".to_owned() + &"y".repeat(80);
        let a = openai_call_id(&long);
        assert_eq!(a, openai_call_id(&long));
        assert_eq!(a.len(), 5 + 32);
        let digest = hex::encode(Sha256::digest(long.as_bytes()));
        assert_eq!(a, format!("call_{}", &digest[..32]));
    }

    #[test]
    fn request_maps_history_tools_and_parameters() {
        let long_id = "z".repeat(70);
        let mut req = CompletionRequest {
            model: "gpt-4o".into(),
            system: Some("be brief".into()),
            messages: vec![
                Message::user_text("refund order 7"),
                Message {
                    role: Role::Assistant,
                    content: vec![
                        ContentBlock::Text {
                            text: "Looking.".into(),
                        },
                        ContentBlock::ToolUse {
                            id: long_id.clone(),
                            name: "lookup_order".into(),
                            args: json!({"order_id": "7"}),
                        },
                    ],
                },
                Message {
                    role: Role::User,
                    content: vec![ContentBlock::ToolResult {
                        tool_use_id: long_id.clone(),
                        content: "{\"total\":100}".into(),
                        is_error: false,
                    }],
                },
            ],
            tools: vec![ToolSpec {
                name: "lookup_order".into(),
                description: "Find an order".into(),
                input_schema: Value::Null,
            }],
            parameters: crate::Parameters::default(),
            reasoning: Some(ReasoningEffort::High),
            response_schema: None,
        };
        req.parameters.stop_sequences = vec!["END".into()];
        let body = serde_json::to_value(chat_request(&req)).unwrap();
        let short = openai_call_id(&long_id);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "refund order 7"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"type": "function", "id": short, "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"7\"}"}}
                ]},
                {"role": "tool", "content": "{\"total\":100}", "tool_call_id": short}
            ])
        );
        assert_eq!(body["max_completion_tokens"], 4096);
        assert_eq!(body["reasoning_effort"], "high");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({"include_usage": true}));
        assert_eq!(body["stop"], json!(["END"]));
        assert_eq!(
            body["tools"][0]["function"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        assert!(body.get("temperature").is_none());
        // Every tool hidden by policy (tool visibility): the request carries no `tools`, and
        // the history, earlier calls included, is unchanged.
        let messages = body["messages"].clone();
        req.tools.clear();
        let body = serde_json::to_value(chat_request(&req)).unwrap();
        assert!(body.get("tools").is_none(), "{body}");
        assert_eq!(body["messages"], messages);
    }

    #[test]
    fn args_parse_leniently() {
        assert_eq!(parse_args(""), json!({}));
        assert_eq!(parse_args("{\"a\":1}"), json!({"a": 1}));
        assert_eq!(parse_args("{\"a\":"), json!("{\"a\":"));
    }
}
