//! HTTP plumbing shared by the vendor providers.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::error::{HttpFailure, ProviderError, RequestContext};

/// Longest error detail kept from a response body.
const MAX_DETAIL_CHARS: usize = 300;

/// The HTTP client for these timeouts. Clients are cached per setting so that every session
/// shares one connection pool (and one TLS set-up) instead of building its own.
pub(crate) fn client(
    connect_timeout: Duration,
    idle_timeout: Duration,
) -> Result<reqwest::Client, ProviderError> {
    type Cache = Mutex<Vec<((Duration, Duration), reqwest::Client)>>;
    static CLIENTS: OnceLock<Cache> = OnceLock::new();
    let key = (connect_timeout, idle_timeout);
    let mut cache = CLIENTS
        .get_or_init(Cache::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some((_, client)) = cache.iter().find(|(k, _)| *k == key) {
        return Ok(client.clone());
    }
    let client = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        // The stream's idle timeout is enforced per event by the driver (`driver::translate`),
        // which names it; the client's read timeout, a second longer, backs it up and bounds
        // the wait for the response headers.
        .read_timeout(idle_timeout.saturating_add(Duration::from_secs(1)))
        .user_agent(concat!("phrony-runtime/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ProviderError::InvalidConfig {
            field: "spec.model",
            message: format!("cannot build the HTTP client: {}", error_chain(&e)),
        })?;
    cache.push((key, client.clone()));
    Ok(client)
}

/// Checks an API root and returns it without a trailing slash.
pub(crate) fn api_root(field: &'static str, raw: &str) -> Result<String, ProviderError> {
    let url = reqwest::Url::parse(raw.trim()).map_err(|e| ProviderError::InvalidConfig {
        field,
        message: format!("{raw:?} is not a URL: {e}"),
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ProviderError::InvalidConfig {
            field,
            message: format!("{raw:?} must be an absolute http or https URL"),
        });
    }
    Ok(phrony_manifest::normalize_api_root(raw))
}

/// Reads a non-success response into an [`HttpFailure`].
pub(crate) async fn read_failure(response: reqwest::Response) -> HttpFailure {
    let url = response.url().to_string();
    let status = response.status();
    let retry_after = retry_after(response.headers(), SystemTime::now());
    let detail = match response.bytes().await {
        Ok(body) => error_detail(&body),
        Err(e) => format!("(the error body could not be read: {})", error_chain(&e)),
    };
    HttpFailure {
        url,
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or_default().to_owned(),
        detail,
        retry_after,
    }
}

/// `retry-after-ms` (OpenAI, Anthropic) or `Retry-After` in seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = text(RETRY_AFTER.as_str())?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The vendor's error message from a body: `error.message` (with `error.type` when present),
/// `message`, or `detail`; else the start of the body text.
pub(crate) fn error_detail(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let err = v.get("error").unwrap_or(&v);
        if let Some(s) = err.as_str() {
            return truncate(s);
        }
        let message = ["message", "detail"]
            .iter()
            .find_map(|k| err.get(*k).and_then(|m| m.as_str()));
        if let Some(message) = message {
            return match err.get("type").and_then(|t| t.as_str()) {
                Some(kind) if !kind.is_empty() => truncate(&format!("{kind}: {message}")),
                _ => truncate(message),
            };
        }
    }
    let text = String::from_utf8_lossy(body);
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    truncate(&collapsed)
}

/// Keeps the first [`MAX_DETAIL_CHARS`] characters.
pub(crate) fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// An error and its sources, joined with `: ` (reqwest hides the root cause in the chain).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// A transport error before or during a response; `during` prefixes a phrase such as
/// "the response stream broke".
pub(crate) fn connection_error(
    context: &RequestContext,
    url: &str,
    e: reqwest::Error,
    during: Option<&str>,
) -> ProviderError {
    let retryable = e.is_connect() || e.is_timeout() || e.is_request() || e.is_body();
    // The URL is already part of the message.
    let cause = error_chain(&e.without_url());
    ProviderError::Connection {
        context: Box::new(context.clone()),
        url: url.to_owned(),
        message: match during {
            Some(phrase) => format!("{phrase}: {cause}"),
            None => cause,
        },
        retryable,
        attempts: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_reads_milliseconds_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h, now), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert("retry-after", HeaderValue::from_str(&date).unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, now), None);
    }

    #[test]
    fn error_detail_prefers_the_vendor_message() {
        assert_eq!(
            error_detail(br#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error"}}"#),
            "invalid_request_error: Incorrect API key provided"
        );
        assert_eq!(
            error_detail(
                br#"{"type":"error","error":{"type":"not_found_error","message":"model: x"}}"#
            ),
            "not_found_error: model: x"
        );
        assert_eq!(error_detail(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(
            error_detail(b"<html>\n  <h1>Bad   Gateway</h1></html>"),
            "<html> <h1>Bad Gateway</h1></html>"
        );
        let long = "x".repeat(400);
        assert_eq!(
            error_detail(long.as_bytes()).chars().count(),
            MAX_DETAIL_CHARS + 1
        );
    }

    #[test]
    fn api_root_checks_scheme_and_trims_the_slash() {
        assert_eq!(
            api_root("f", "http://127.0.0.1:8080/v1/").unwrap(),
            "http://127.0.0.1:8080/v1"
        );
        assert!(api_root("f", "ftp://x/v1").is_err());
        assert!(api_root("f", "not a url").is_err());
    }
}
