# worker.py
import asyncio
import os

from phrony.worker import Worker

worker = Worker(
    worker_id="refund-worker-1",
    runtime_addr=os.environ.get("PHRONY_RUNTIME_ADDR", "127.0.0.1:7777"),
)


ORDERS = {
    "ORD-1": {"total": 400.00, "currency": "EUR", "status": "delivered", "refund_eligible": True},
    "ORD-2": {"total": 14000.00, "currency": "EUR", "status": "delivered", "refund_eligible": True},
}


@worker.tool("orders.lookup-order", version="1.0.0", max_concurrency=8)
async def lookup_order(args: dict, ctx) -> dict:
    # In production: query your order system.
    order = ORDERS.get(args["order_id"])
    if order is None:
        return {"order_id": args["order_id"], "found": False}
    return {"order_id": args["order_id"], "found": True, **order}


@worker.tool("payments.issue-refund", version="1.0.0", max_concurrency=2)
async def issue_refund(args: dict, ctx) -> dict:
    # In production: call your payment provider.
    # If this handler runs, the call already passed policy —
    # and, when required, a human approved it.
    return {
        "refund_id": "rf_2891",
        "order_id": args["order_id"],
        "amount": args["amount"],
        "currency": args["currency"],
        "status": "issued",
    }


if __name__ == "__main__":
    # dial runtime, register handlers, process invokes
    asyncio.run(worker.connect())
