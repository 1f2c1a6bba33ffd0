"""A tool worker built on the published `phrony` SDK, driven by
`crates/phrony-grpc/tests/grpc/sdk_worker.rs` (the runtime side dispatches the calls).

Usage: refund_worker.py WORKER_ID   (the runtime address comes from PHRONY_RUNTIME_ADDR)

Handlers of `payments.issue-refund@1.0.0`, chosen by the call's arguments:
- `amount > 0`: returns a refund echoing the arguments and the invoke's context;
- `amount <= 0`: raises `ToolError("invalid_args", ...)`;
- `explode: true`: raises a plain exception (the SDK reports `internal`);
- `delay: seconds`: sleeps that long before answering (so concurrent calls finish at different
  moments: the SDK's `Worker` writes each result from its own task, and phrony 0.1.0 does not
  serialise those writes, so two results written at the same instant can collide inside
  grpcio and one of them, and every heartbeat after it, is lost; see the test);
- `hang: true`: waits until the call is cancelled (or its deadline passes), lingers half a
  second, then returns (the SDK then reports `cancelled`, late).
Each invocation is logged to stdout as `invoked <call_id>` so the test can count them.
The process exits 0 when the runtime ends the Work stream cleanly.
"""

from __future__ import annotations

import asyncio
import sys

from phrony.worker import ToolError, Worker


def main() -> None:
    worker_id = sys.argv[1]
    worker = Worker(worker_id=worker_id, workload_identity="tests/sdk-worker", image_digest="sha256:sdk")

    @worker.tool("payments.issue-refund", version="1.0.0", max_concurrency=2, descriptor_hash="sha256:refund-v1")
    async def issue_refund(args: dict, ctx) -> dict:
        print(f"invoked {ctx.call_id}", flush=True)
        if args.get("delay"):
            await asyncio.sleep(float(args["delay"]))
        if args.get("explode"):
            raise RuntimeError("payment provider unreachable")
        if args.get("hang"):
            while not ctx.signal.aborted:
                await asyncio.sleep(0.01)
            # The SDK aborts at the invoke's deadline, the moment the runtime gives up too:
            # linger so that the answer is surely late.
            await asyncio.sleep(0.5)
            return {"too": "late"}
        if args["amount"] <= 0:
            raise ToolError("invalid_args", "amount must be greater than zero")
        return {
            "refund_id": f"rf_{args['order_id']}",
            "order_id": args["order_id"],
            "amount": args["amount"],
            "status": "issued",
            "call_id": ctx.call_id,
            "session_id": ctx.session_id,
            "turn": ctx.turn,
            "side_effect_class": ctx.side_effect_class,
        }

    asyncio.run(worker.connect())
    print("stream closed", flush=True)


if __name__ == "__main__":
    main()
