//! Turns a vendor's stream of wire items into the neutral [`Event`] stream.

use std::collections::VecDeque;

use futures::{Stream, StreamExt as _};

use crate::error::ProviderError;
use crate::{Event, EventStream};

/// Output queue of a [`Translator`].
pub(crate) type Out = VecDeque<Result<Event, ProviderError>>;

/// Vendor-specific state machine fed one wire item at a time.
pub(crate) trait Translator<T>: Send + 'static {
    /// Handles one item, pushing zero or more events.
    fn on_item(&mut self, item: T, out: &mut Out);
    /// The wire stream ended: push the terminal event (`Completed` or an error).
    fn on_end(&mut self, out: &mut Out);
}

struct Driver<S, X> {
    inner: S,
    translator: X,
    queue: Out,
    inner_done: bool,
    finished: bool,
}

/// Runs `translator` over `inner`. The resulting stream ends right after the first
/// `Completed` or error, without reading the rest of the wire stream.
pub(crate) fn translate<S, T, X>(inner: S, translator: X) -> EventStream
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
    };
    futures::stream::unfold(driver, |mut d| async move {
        loop {
            if d.finished {
                return None;
            }
            if let Some(item) = d.queue.pop_front() {
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
            match d.inner.next().await {
                Some(item) => d.translator.on_item(item, &mut d.queue),
                None => {
                    d.inner_done = true;
                    d.translator.on_end(&mut d.queue);
                }
            }
        }
    })
    .boxed()
}
