//! Router settings.

use std::time::Duration;

use crate::error::ConfigError;

/// [`RouterConfig::queue_capacity`] by default.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// Settings of a [`crate::Router`]. `Default` gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// The worker lease sent in `WorkRegistered`; a heartbeat renews it and a worker whose
    /// lease passes is dropped (its in-flight calls become indeterminate). Default 30s.
    pub lease_ttl: Duration,
    /// Calls that may wait per `tool@version` for a free handler slot. Default 4096 (the
    /// reference runtime's 256 failed approved calls when a burst of approvals resumed more
    /// sessions at once than that; each waiting call costs about a hundred bytes here, and the
    /// wait itself stays bounded by the call's `queue_wait`).
    pub queue_capacity: usize,
    /// How many times a nacked call is retried on another eligible worker. Default 1.
    pub nack_retries: u32,
    /// How long a cancelled or timed-out call keeps its handler slot while the worker winds
    /// it down (the worker still runs it until it answers). Default 30s.
    pub abandon_grace: Duration,
    /// Messages buffered per worker stream; a worker that lets this fill up is dropped as
    /// unresponsive. Default 1024.
    pub outbox_capacity: usize,
    /// Refuse handler advertisements without a `descriptor_hash` (`RUNTIME_REQUIRE_DESCRIPTOR_PINS`).
    /// Default false: an empty hash (the published Python SDK's default) registers unpinned.
    pub require_descriptor_pins: bool,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(30),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            nack_retries: 1,
            abandon_grace: Duration::from_secs(30),
            outbox_capacity: 1024,
            require_descriptor_pins: false,
        }
    }
}

impl RouterConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_ttl < Duration::from_secs(2) {
            return Err(ConfigError::LeaseTooShort(self.lease_ttl));
        }
        if self.queue_capacity == 0 {
            return Err(ConfigError::ZeroQueueCapacity);
        }
        if self.outbox_capacity < 16 {
            return Err(ConfigError::OutboxTooSmall(self.outbox_capacity));
        }
        Ok(())
    }

    pub(crate) fn lease_ttl_ms(&self) -> i64 {
        i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}
