//! `stub`: the scripted, dev-only model of `stub-script.json` (§1.7).

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt as _;
use phrony_manifest::{StubEvent, StubScript};

use crate::types::char_count;
use crate::{
    CompletionRequest, Event, EventStream, ModelProvider, ProviderError, ProviderKind, StopReason,
    Usage, estimate_tokens,
};

/// Plays one script entry per completion. The position is per instance: build a new provider
/// (with [`crate::BuildOptions::stub_position`]) to resume elsewhere.
pub(crate) struct StubProvider {
    script: StubScript,
    next: AtomicUsize,
}

impl std::fmt::Debug for StubProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StubProvider")
            .field("turns", &self.script.turns.len())
            .field("next", &self.next.load(Ordering::Relaxed))
            .finish()
    }
}

impl StubProvider {
    pub(crate) fn new(script: StubScript, position: usize) -> Self {
        Self {
            script,
            next: AtomicUsize::new(position),
        }
    }
}

#[async_trait::async_trait]
impl ModelProvider for StubProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        request.check()?;
        let call = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(turn) = self.script.turns.get(call) else {
            return Err(ProviderError::StubExhausted {
                call: call + 1,
                turns: self.script.turns.len(),
            });
        };
        let mut events: Vec<Result<Event, ProviderError>> = Vec::with_capacity(turn.len() + 1);
        let mut output_chars = 0;
        let mut calls = 0;
        let mut ended = false;
        for ev in turn {
            match ev {
                StubEvent::TextDelta { text } => {
                    output_chars += char_count(text);
                    events.push(Ok(Event::TextDelta(text.clone())));
                }
                StubEvent::ToolCall { name, args } => {
                    calls += 1;
                    output_chars += char_count(name) + char_count(&args.to_string());
                    events.push(Ok(Event::ToolCall {
                        id: format!("stub_call_{}_{calls}", call + 1),
                        name: name.clone(),
                        args: args.clone(),
                    }));
                }
                StubEvent::Completed { stop_reason } => {
                    events.push(Ok(Event::Completed {
                        stop_reason: StopReason::normalize(stop_reason),
                        usage: Usage {
                            input_tokens: request.estimated_input_tokens(),
                            output_tokens: estimate_tokens(output_chars),
                            estimated: true,
                        },
                    }));
                    ended = true;
                }
                StubEvent::Failed { error } => {
                    events.push(Err(ProviderError::StubFailed {
                        message: error.clone(),
                    }));
                    ended = true;
                }
            }
            if ended {
                break;
            }
        }
        if !ended {
            // A turn without `completed` ends like a vendor stream would: tool_use when it
            // called tools, else end_turn.
            events.push(Ok(Event::Completed {
                stop_reason: if calls > 0 {
                    StopReason::ToolUse
                } else {
                    StopReason::EndTurn
                },
                usage: Usage {
                    input_tokens: request.estimated_input_tokens(),
                    output_tokens: estimate_tokens(output_chars),
                    estimated: true,
                },
            }));
        }
        Ok(futures::stream::iter(events).boxed())
    }
}
