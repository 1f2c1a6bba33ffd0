//! A point-in-time view of the router, for `phrony status`, metrics and debugging.

use std::time::Duration;

/// The router's state at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterSnapshot {
    /// Whether the registry is shutting down.
    pub shutting_down: bool,
    /// Registered workers, sorted by id.
    pub workers: Vec<WorkerSnapshot>,
    /// Non-empty queues, sorted by key.
    pub queues: Vec<QueueSnapshot>,
    /// Results handed to callers whose ack is still pending.
    pub awaiting_ack: usize,
}

/// One registered worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSnapshot {
    /// The worker id.
    pub worker_id: String,
    /// Its workload identity.
    pub workload_identity: String,
    /// Its image digest.
    pub image_digest: String,
    /// Time left on its lease.
    pub lease_remaining: Duration,
    /// Its handlers in advertisement order.
    pub handlers: Vec<HandlerSnapshot>,
    /// Calls it is running (reserved or dispatched), sorted.
    pub in_flight: Vec<String>,
    /// Abandoned calls still holding a slot until the worker answers.
    pub abandoned: usize,
}

/// One advertised handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerSnapshot {
    /// Dispatch ref.
    pub tool: String,
    /// Version.
    pub version: String,
    /// Contract version.
    pub contract_version: String,
    /// Descriptor hash.
    pub descriptor_hash: String,
    /// Effective concurrency limit.
    pub max_concurrency: u32,
    /// Slots in use (including abandoned calls not yet answered).
    pub busy: u32,
}

/// One per-key queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSnapshot {
    /// `tool@version`.
    pub key: String,
    /// Calls waiting.
    pub depth: usize,
}
