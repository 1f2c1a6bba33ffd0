//! Turns a vendor's stream of wire items into the neutral [`Event`] stream.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{Stream, StreamExt as _};

use crate::error::ProviderError;
use crate::{Event, EventStream, MAX_COMPLETION_BYTES, ReasoningBlock};

/// Output queue of a [`Translator`].
pub(crate) type Out = VecDeque<Result<Event, ProviderError>>;

/// Vendor-specific state machine fed one wire item at a time.
pub(crate) trait Translator<T>: Send + 'static {
    /// Handles one item, pushing zero or more events.
    fn on_item(&mut self, item: T, out: &mut Out);
    /// The wire stream ended: push the terminal event (`Completed` or an error).
    fn on_end(&mut self, out: &mut Out);
    /// The error for a stream that sent nothing for `idle`.
    fn stalled(&self, idle: Duration) -> ProviderError;
    /// Bytes of answer the translator holds but has not pushed yet (tool arguments and
    /// reasoning still being assembled), counted against [`MAX_COMPLETION_BYTES`].
    fn pending_bytes(&self) -> usize;
}

struct Driver<S, X> {
    inner: S,
    translator: X,
    queue: Out,
    inner_done: bool,
    finished: bool,
    /// Bytes of answer (text, reasoning, tool names and arguments) handed out so far.
    answer_bytes: usize,
    /// The longest wait for the next wire item.
    idle: Duration,
}

/// The message of a stalled stream (see [`Translator::stalled`]).
pub(crate) fn stalled_message(idle: Duration) -> String {
    format!(
        "the response stream stalled: nothing arrived for {} ms (idle timeout)",
        idle.as_millis()
    )
}

impl<S, X> Driver<S, X> {
    /// Replaces what is queued by [`ProviderError::AnswerTooLarge`] once the answer handed out,
    /// queued and still buffered by the translator passes [`MAX_COMPLETION_BYTES`].
    fn check_bound<T>(&mut self)
    where
        X: Translator<T>,
    {
        let queued: usize = self
            .queue
            .iter()
            .filter_map(|item| item.as_ref().ok())
            .map(answer_bytes)
            .sum();
        let total = self
            .answer_bytes
            .saturating_add(queued)
            .saturating_add(self.translator.pending_bytes());
        if total > MAX_COMPLETION_BYTES {
            self.queue.clear();
            self.queue.push_back(Err(ProviderError::AnswerTooLarge {
                limit: MAX_COMPLETION_BYTES,
            }));
        }
    }
}

/// The bytes an event adds to the answer, for [`MAX_COMPLETION_BYTES`].
fn answer_bytes(event: &Event) -> usize {
    match event {
        Event::TextDelta(text) => text.len(),
        Event::Reasoning(ReasoningBlock::Thinking {
            thinking,
            signature,
        }) => thinking.len() + signature.len(),
        Event::Reasoning(ReasoningBlock::Redacted { data }) => data.len(),
        Event::ToolCall { id, name, args } => id.len() + name.len() + args.to_string().len(),
        Event::Completed { .. } => 0,
    }
}

/// Runs `translator` over `inner`. The resulting stream ends right after the first
/// `Completed` or error, without reading the rest of the wire stream. An answer that grows past
/// [`MAX_COMPLETION_BYTES`] ends it with [`ProviderError::AnswerTooLarge`] instead of the event
/// that crossed the bound, and one that sends nothing for `idle` with [`Translator::stalled`].
pub(crate) fn translate<S, T, X>(inner: S, translator: X, idle: Duration) -> EventStream
where
    S: Stream<Item = T> + Send + 'static,
    T: Send + 'static,
    X: Translator<T>,
{
    let driver = Driver {
        inner: Box::pin(inner),
        translator,
        queue: VecDeque::new(),
        inner_done: false,
        finished: false,
        answer_bytes: 0,
        idle,
    };
    futures::stream::unfold(driver, |mut d| async move {
        loop {
            if d.finished {
                return None;
            }
            if let Some(item) = d.queue.pop_front() {
                if let Ok(event) = &item {
                    d.answer_bytes = d.answer_bytes.saturating_add(answer_bytes(event));
                }
                if matches!(item, Err(_) | Ok(Event::Completed { .. })) {
                    d.finished = true;
                    d.queue.clear();
                }
                return Some((item, d));
            }
            if d.inner_done {
                d.queue.push_back(Err(ProviderError::Truncated));
                continue;
            }
            let Ok(next) = tokio::time::timeout(d.idle, d.inner.next()).await else {
                let stalled = d.translator.stalled(d.idle);
                d.queue.push_back(Err(stalled));
                continue;
            };
            match next {
                Some(item) => {
                    d.translator.on_item(item, &mut d.queue);
                    d.check_bound();
                }
                None => {
                    d.inner_done = true;
                    d.translator.on_end(&mut d.queue);
                }
            }
        }
    })
    .boxed()
}
