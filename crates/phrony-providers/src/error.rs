//! [`ProviderError`]: what went wrong, with the context a human needs (§8.6).

use std::time::Duration;

use crate::ProviderKind;

/// Where a failing request was going: shown in every API error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestContext {
    /// The provider that made the request.
    pub provider: ProviderKind,
    /// Vendor model id.
    pub model: String,
    /// API root the request was sent to.
    pub base_url: String,
}

/// A non-success HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpFailure {
    /// Full request URL.
    pub url: String,
    /// HTTP status code.
    pub status: u16,
    /// Canonical reason phrase (`Unauthorized`), empty when unknown.
    pub reason: String,
    /// The vendor's error message from the body, or the start of a non-JSON body.
    pub detail: String,
    /// Delay asked for by `retry-after-ms` / `Retry-After`, if any.
    pub retry_after: Option<Duration>,
}

/// Why a provider could not be built or a completion failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// `spec.model.provider` names no provider this runtime has.
    #[error(
        "unsupported model provider {provider:?}: expected one of anthropic, openai, openai-compatible, stub"
    )]
    UnsupportedProvider {
        /// The configured provider id.
        provider: String,
    },
    /// The stub provider was asked for but the daemon does not allow it.
    #[error("stub provider is not enabled (set RUNTIME_ENABLE_STUB_PROVIDER=true)")]
    StubDisabled,
    /// A vendor that needs a key got none.
    #[error(
        "model provider {provider} needs an API key: declare it under secrets and name it in spec.model.secret (default \"{provider}\")"
    )]
    MissingApiKey {
        /// The provider.
        provider: ProviderKind,
    },
    /// The model configuration cannot be used.
    #[error("invalid model configuration: {field}: {message}")]
    InvalidConfig {
        /// Manifest field path.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The completion request is malformed (a runtime bug rather than a user error).
    #[error("invalid completion request: {0}")]
    InvalidRequest(String),
    /// The API answered with a non-success status.
    #[error("{}", http_message(context, failure, *attempts))]
    Http {
        /// Where the request went.
        context: Box<RequestContext>,
        /// The response.
        failure: Box<HttpFailure>,
        /// Requests made, retries included.
        attempts: u32,
    },
    /// The API could not be reached, or the connection broke.
    #[error(
        "model API request failed (model={}) (base_url={}): {url}: {message}. Check that the base URL is reachable from the runtime{}",
        context.model, context.base_url, attempts_note(*attempts)
    )]
    Connection {
        /// Where the request went.
        context: Box<RequestContext>,
        /// Full request URL.
        url: String,
        /// Transport error text.
        message: String,
        /// Whether another attempt may succeed (connect failures and timeouts).
        retryable: bool,
        /// Requests made, retries included.
        attempts: u32,
    },
    /// The API answered with something that is not its wire format (non-JSON, early EOF, …).
    #[error(
        "model API returned an invalid response from base_url {} (model={}): {detail}; the endpoint may be wrong{}",
        context.base_url, context.model, invalid_response_hint(context.provider)
    )]
    InvalidResponse {
        /// Where the request went.
        context: Box<RequestContext>,
        /// What was wrong with the response.
        detail: String,
    },
    /// The API reported an error inside a successful stream (Anthropic `error` event, OpenAI
    /// `error` chunk).
    #[error(
        "model API request failed (model={}) (base_url={}): the response stream reported {kind}: {message}{}",
        context.model, context.base_url, attempts_note(*attempts)
    )]
    Api {
        /// Where the request went.
        context: Box<RequestContext>,
        /// Vendor error type (`overloaded_error`, …).
        kind: String,
        /// Vendor message.
        message: String,
        /// Requests made, retries included.
        attempts: u32,
    },
    /// A stream ended without a [`crate::Event::Completed`].
    #[error("model stream ended without a completed event")]
    Truncated,
    /// The model's answer grew past [`crate::MAX_COMPLETION_BYTES`]; it was discarded.
    #[error(
        "model answer is larger than {limit} bytes (text, reasoning and tool arguments together); \
         the completion was discarded. Lower spec.model.parameters.max_tokens or check the endpoint"
    )]
    AnswerTooLarge {
        /// The bound, in bytes.
        limit: usize,
    },
    /// The stub script has no entry for this completion.
    #[error("unexpected completion call {call} (script has {turns} turns)")]
    StubExhausted {
        /// 1-based completion number.
        call: usize,
        /// Number of scripted completions.
        turns: usize,
    },
    /// The stub script scripted a failure.
    #[error("{message}")]
    StubFailed {
        /// The scripted error text.
        message: String,
    },
    /// The stub script is missing or invalid.
    #[error(transparent)]
    StubScript(#[from] phrony_manifest::StubScriptError),
}

impl ProviderError {
    /// Whether retrying the same request may succeed: HTTP 408, 409, 429 and 5xx, connection
    /// failures and timeouts, and vendor `overloaded` / `rate limit` / `api_error` stream errors.
    pub fn retryable(&self) -> bool {
        match self {
            Self::Http { failure, .. } => matches!(failure.status, 408 | 409 | 429 | 500..=599),
            Self::Connection { retryable, .. } => *retryable,
            Self::Api { kind, .. } => matches!(
                kind.as_str(),
                "overloaded_error" | "rate_limit_error" | "api_error" | "timeout_error"
            ),
            _ => false,
        }
    }

    /// The delay the server asked for before the next attempt, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Http { failure, .. } => failure.retry_after,
            _ => None,
        }
    }

    /// The HTTP status, for API errors.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::Http { failure, .. } => Some(failure.status),
            _ => None,
        }
    }

    pub(crate) fn set_attempts(&mut self, n: u32) {
        match self {
            Self::Http { attempts, .. }
            | Self::Connection { attempts, .. }
            | Self::Api { attempts, .. } => *attempts = n,
            _ => {}
        }
    }
}

fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (gave up after {attempts} attempts)")
    } else {
        String::new()
    }
}

fn invalid_response_hint(provider: ProviderKind) -> &'static str {
    match provider {
        ProviderKind::Anthropic => {
            " (the base URL must be the Messages API root without /v1, e.g. https://api.anthropic.com)"
        }
        ProviderKind::OpenAiCompatible => {
            " (spec.model.base_url must be the Chat Completions API root, usually ending in /v1)"
        }
        ProviderKind::OpenAi | ProviderKind::Stub => {
            " (the base URL must be the Chat Completions API root, usually ending in /v1)"
        }
    }
}

fn http_message(context: &RequestContext, failure: &HttpFailure, attempts: u32) -> String {
    let mut msg = format!(
        "model API request failed (model={}) (base_url={}): {} returned HTTP {}",
        context.model, context.base_url, failure.url, failure.status
    );
    if !failure.reason.is_empty() {
        msg.push(' ');
        msg.push_str(&failure.reason);
    }
    if !failure.detail.is_empty() {
        msg.push_str(": ");
        msg.push_str(&failure.detail);
    }
    if let Some(hint) = hint(context.provider, failure.status, attempts) {
        msg.push_str(". ");
        msg.push_str(&hint);
    }
    msg
}

fn hint(provider: ProviderKind, status: u16, attempts: u32) -> Option<String> {
    let secret_default = match provider {
        ProviderKind::Anthropic => "anthropic",
        _ => "openai",
    };
    Some(match status {
        401 | 403 => match provider {
            ProviderKind::OpenAiCompatible => {
                "Check spec.model.secret: the endpoint rejected the API key (or needs one)"
                    .to_owned()
            }
            _ => format!(
                "Check the API key: the secret named by spec.model.secret (default \"{secret_default}\") must hold a valid key with access to this model"
            ),
        },
        404 => match provider {
            ProviderKind::OpenAiCompatible => {
                "Check spec.model.name, and that spec.model.base_url is the API root ending in /v1"
                    .to_owned()
            }
            ProviderKind::Anthropic => {
                "Check spec.model.name (and ANTHROPIC_BASE_URL if set: the API root without /v1)"
                    .to_owned()
            }
            _ => "Check spec.model.name (and OPENAI_BASE_URL if set: the API root ending in /v1)"
                .to_owned(),
        },
        429 => format!(
            "The provider is rate limiting requests{}; retry later or raise the account's rate limit",
            attempts_note(attempts)
        ),
        500..=599 => format!(
            "The provider had a server error{}; retry later",
            attempts_note(attempts)
        ),
        _ => return None,
    })
}
