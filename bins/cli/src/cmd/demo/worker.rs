//! The demo's in-process tool worker (the SDK's `Worker`): the tutorial's `worker.py` in Rust,
//! serving `orders.lookup-order@1.0.0` and `payments.issue-refund@1.0.0` over a fixed order
//! book.

use phrony_sdk::{Call, ToolError, Worker, WorkerBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

/// The worker id the demo registers.
pub(crate) const WORKER_ID: &str = "phrony-demo-worker";

/// The order book: id, total in EUR.
const ORDERS: [(&str, u32); 3] = [("ORD-1", 400), ("ORD-2", 14_000), ("ORD-3", 100)];

#[derive(Debug, Deserialize)]
struct Lookup {
    order_id: String,
}

#[derive(Debug, Deserialize)]
struct Refund {
    order_id: String,
    amount: f64,
    currency: String,
}

async fn lookup_order(args: Lookup, _call: Call) -> Result<Value, ToolError> {
    Ok(match ORDERS.iter().find(|(id, _)| *id == args.order_id) {
        Some((id, total)) => json!({
            "order_id": id, "found": true, "total": total, "currency": "EUR",
            "status": "delivered", "refund_eligible": true,
        }),
        None => json!({"order_id": args.order_id, "found": false}),
    })
}

async fn issue_refund(args: Refund, _call: Call) -> Result<Value, ToolError> {
    // A real worker calls the payment provider here. By the time it runs, policy (and, when
    // required, a human) already allowed the call.
    Ok(json!({
        "refund_id": format!("rf_{}", args.order_id),
        "order_id": args.order_id,
        "amount": args.amount,
        "currency": args.currency,
        "status": "issued",
    }))
}

/// The worker, not yet started, for the runtime at `addr` (credentials added by the caller).
pub(crate) fn builder(addr: &str) -> WorkerBuilder {
    Worker::builder()
        .runtime_addr(addr)
        .worker_id(WORKER_ID)
        .tool("orders.lookup-order", "1.0.0", lookup_order)
        .tool("payments.issue-refund", "1.0.0", issue_refund)
}
