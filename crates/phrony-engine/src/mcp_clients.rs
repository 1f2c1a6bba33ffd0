//! The MCP clients of one session (one per server), which the session's driver context owns
//! and `calls/mcp.rs` fills on first use. A leaf: it imports no engine module.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use phrony_mcp::Client;

pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Arc<Client>>>>;

/// The MCP clients of one session: one per server, connected on first use, dropped after a
/// failure.
#[derive(Default)]
pub(crate) struct McpClients {
    slots: Mutex<HashMap<String, Slot>>,
}

impl McpClients {
    pub(crate) fn slot(&self, server: &str) -> Slot {
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(slots.entry(server.to_owned()).or_default())
    }

    /// Drops `client` (if it is still the server's), so the next call initialises again.
    pub(crate) async fn reset(&self, server: &str, client: Option<&Arc<Client>>) {
        let slot = self.slot(server);
        let mut current = slot.lock().await;
        let same = match (current.as_ref(), client) {
            (Some(c), Some(failed)) => Arc::ptr_eq(c, failed),
            (_, None) => true,
            (None, Some(_)) => false,
        };
        if same {
            *current = None;
        }
    }
}
