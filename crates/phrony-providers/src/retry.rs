//! Retries with exponential backoff and jitter, before the first event of a completion.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;

use crate::EventStream;
use crate::error::{ProviderError, RequestContext};

/// How failed requests are retried. Only failures before the first streamed event are retried,
/// so a caller never sees an event twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (default 3).
    pub max_retries: u32,
    /// Delay before the first retry; doubled for each further retry (default 500 ms).
    pub initial_backoff: Duration,
    /// Cap on the computed delay (default 8 s).
    pub max_backoff: Duration,
    /// Longest `Retry-After` the provider waits for; a longer one fails at once (default 60 s).
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// Delay before retry number `retry` (0-based), or `None` when the server asks for a longer
    /// wait than [`RetryPolicy::max_retry_after`].
    pub(crate) fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if let Some(wait) = retry_after {
            return (wait <= self.max_retry_after).then_some(wait);
        }
        let factor = 2u32.saturating_pow(retry.min(20));
        let base = self
            .initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff);
        // Up to 25 % less than the base, as the official SDKs do, so that clients that failed
        // together do not retry together.
        let jitter = 1.0 - 0.25 * rand::random::<f64>();
        Some(base.mul_f64(jitter))
    }
}

/// Opens a completion stream with `attempt`, retrying retryable failures that happen before the
/// first event. The returned stream starts with that first event.
pub(crate) async fn open_with_retry<F, Fut>(
    policy: &RetryPolicy,
    context: &RequestContext,
    mut attempt: F,
) -> Result<EventStream, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<EventStream, ProviderError>>,
{
    let mut retries = 0u32;
    loop {
        let mut err = match attempt().await {
            Ok(mut stream) => match stream.next().await {
                Some(Ok(first)) => {
                    return Ok(futures::stream::iter([Ok(first)]).chain(stream).boxed());
                }
                Some(Err(e)) => e,
                None => ProviderError::Truncated,
            },
            Err(e) => e,
        };
        err.set_attempts(retries + 1);
        if !err.retryable() || retries >= policy.max_retries {
            return Err(err);
        }
        let Some(delay) = policy.delay(retries, err.retry_after()) else {
            return Err(err);
        };
        retries += 1;
        tracing::warn!(
            provider = %context.provider,
            model = %context.model,
            retry = retries,
            delay_ms = delay.as_millis() as u64,
            error = %err,
            "model API request failed; retrying"
        );
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_jittered_down_by_at_most_a_quarter() {
        let p = RetryPolicy::default();
        for _ in 0..50 {
            let d0 = p.delay(0, None).unwrap_or_default();
            assert!(
                d0 <= Duration::from_millis(500) && d0 >= Duration::from_millis(375),
                "{d0:?}"
            );
            let d2 = p.delay(2, None).unwrap_or_default();
            assert!(
                d2 <= Duration::from_secs(2) && d2 >= Duration::from_millis(1500),
                "{d2:?}"
            );
            let d9 = p.delay(9, None).unwrap_or_default();
            assert!(
                d9 <= Duration::from_secs(8) && d9 >= Duration::from_secs(6),
                "{d9:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(7))),
            Some(Duration::from_secs(7))
        );
        assert_eq!(p.delay(0, Some(Duration::from_secs(61))), None);
    }
}
