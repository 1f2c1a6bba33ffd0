//! A scripted model provider for in-process tests (feature `model`): plays its steps in order,
//! one per completion, and records every request and the API key each provider was built with.
//!
//! ```no_run
//! # async fn demo() {
//! use phrony_test_support::fake_model::{Script, Step};
//! let script = Script::new(vec![Step::say("Refund issued.")]);
//! let provider = script.provider(); // a `phrony_providers::ModelProvider`
//! # let _ = provider;
//! # }
//! ```
//!
//! A test's `ProviderFactory` (the engine's trait) hands out [`Script::provider`]s of one shared
//! script, recording the key with [`Script::record_api_key`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use phrony_providers::{
    CompletionRequest, Event as ModelEvent, EventStream, ModelProvider, ProviderError,
    ProviderKind, StopReason, Usage,
};
use serde_json::Value;
use tokio::sync::Notify;

type StepFn = Box<dyn FnOnce(&CompletionRequest) -> Vec<ModelEvent> + Send>;

/// One scripted completion.
pub struct Step {
    gate: Option<Arc<Notify>>,
    make: StepFn,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("gated", &self.gate.is_some())
            .finish_non_exhaustive()
    }
}

impl Step {
    /// A completion computed from the request the model receives.
    pub fn from_fn(f: impl FnOnce(&CompletionRequest) -> Vec<ModelEvent> + Send + 'static) -> Self {
        Self {
            gate: None,
            make: Box::new(f),
        }
    }

    /// The model calls one tool (provider call id `provider_call_0`).
    #[must_use]
    pub fn call(name: &str, args: Value) -> Self {
        Self::calls(&[(name, args)])
    }

    /// The model calls several tools in one completion (ids `provider_call_<i>`).
    #[must_use]
    pub fn calls(calls: &[(&str, Value)]) -> Self {
        let calls: Vec<(String, Value)> = calls
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.clone()))
            .collect();
        Self::from_fn(move |_| {
            let mut events: Vec<ModelEvent> = calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, args))| ModelEvent::ToolCall {
                    id: format!("provider_call_{i}"),
                    name,
                    args,
                })
                .collect();
            events.push(completed(StopReason::ToolUse, 10));
            events
        })
    }

    /// The model answers with text and ends its turn.
    #[must_use]
    pub fn say(text: &str) -> Self {
        Self::say_in_chunks(&[text])
    }

    /// The model streams its answer in these chunks and ends its turn.
    #[must_use]
    pub fn say_in_chunks(chunks: &[&str]) -> Self {
        let chunks: Vec<String> = chunks.iter().map(|c| (*c).to_owned()).collect();
        Self::from_fn(move |_| {
            let mut events: Vec<ModelEvent> =
                chunks.into_iter().map(ModelEvent::TextDelta).collect();
            events.push(completed(StopReason::EndTurn, 10));
            events
        })
    }

    /// Holds the completion until `gate` is notified.
    #[must_use]
    pub fn gated(mut self, gate: Arc<Notify>) -> Self {
        self.gate = Some(gate);
        self
    }
}

/// The end of a completion: 20 input tokens and `output_tokens`.
#[must_use]
pub fn completed(stop_reason: StopReason, output_tokens: u64) -> ModelEvent {
    ModelEvent::Completed {
        stop_reason,
        usage: Usage {
            input_tokens: 20,
            output_tokens,
            estimated: false,
        },
    }
}

/// A scripted model: plays its steps in order and records every request.
#[derive(Default)]
pub struct Script {
    steps: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<CompletionRequest>>,
    api_keys: Mutex<Vec<Option<String>>>,
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Script")
    }
}

impl Script {
    /// A script of `steps`, shared by the providers it hands out.
    #[must_use]
    pub fn new(steps: Vec<Step>) -> Arc<Self> {
        Arc::new(Self {
            steps: Mutex::new(steps.into()),
            ..Self::default()
        })
    }

    /// Appends a step.
    pub fn push(&self, step: Step) {
        lock(&self.steps).push_back(step);
    }

    /// The requests received so far, in order.
    #[must_use]
    pub fn requests(&self) -> Vec<CompletionRequest> {
        lock(&self.requests).clone()
    }

    /// The API keys the providers were built with, in order.
    #[must_use]
    pub fn api_keys(&self) -> Vec<Option<String>> {
        lock(&self.api_keys).clone()
    }

    /// Records the API key a provider of this script is built with.
    pub fn record_api_key(&self, key: Option<String>) {
        lock(&self.api_keys).push(key);
    }

    /// A provider playing this script.
    #[must_use]
    pub fn provider(self: &Arc<Self>) -> Box<dyn ModelProvider> {
        Box::new(Scripted(Arc::clone(self)))
    }
}

#[derive(Debug)]
struct Scripted(Arc<Script>);

#[async_trait::async_trait]
impl ModelProvider for Scripted {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Stub
    }

    async fn stream(&self, request: CompletionRequest) -> Result<EventStream, ProviderError> {
        let step = lock(&self.0.steps).pop_front();
        let n = {
            let mut requests = lock(&self.0.requests);
            requests.push(request.clone());
            requests.len()
        };
        let Some(step) = step else {
            return Err(ProviderError::InvalidRequest(format!(
                "the test script has no step for completion {n}"
            )));
        };
        if let Some(gate) = &step.gate {
            gate.notified().await;
        }
        let events = (step.make)(&request);
        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
    }
}

/// The guarded value; a panic elsewhere while it was held does not hide what was recorded.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
