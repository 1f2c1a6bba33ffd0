//! [`EngineConfig`]: the engine's tunables.

use std::time::Duration;

/// Settings of an [`crate::Engine`]. `Default` gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// How long a tool call may wait for a free worker slot (`RUNTIME_DISPATCH_QUEUE_WAIT`,
    /// default 10 s). It bounds only the wait, never the execution.
    pub queue_wait: Duration,
    /// How long a worker may run a call once invoked, when the tool binding sets no timeout
    /// (default 300 s). When it passes the worker gets a cancel and the outcome is handled as
    /// indeterminate by side-effect class.
    pub exec_timeout: Duration,
    /// Updates buffered per subscriber (default 256). A subscriber that falls behind is fed
    /// from the store again: it never loses events.
    pub subscription_buffer: usize,
    /// How often subscriptions, approval waits and the approval timer re-read the store when
    /// nothing told them to (a safety net for changes made by another process; default 2 s).
    pub poll_interval: Duration,
    /// After a restart, how long a call that was sent to a worker waits for the worker to
    /// reconnect and report before it is handled as indeterminate (default 30 s, the lease).
    pub recovery_grace: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            queue_wait: Duration::from_secs(10),
            exec_timeout: Duration::from_secs(300),
            subscription_buffer: 256,
            poll_interval: Duration::from_secs(2),
            recovery_grace: Duration::from_secs(30),
        }
    }
}
