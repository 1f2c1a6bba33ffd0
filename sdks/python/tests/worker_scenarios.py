"""Worker scenarios that take the `Worker` class as a parameter, so that the same scenario can
be run against the published 0.1.0 (`python worker_scenarios.py` from a venv with it) to see
that it fails there."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from fake_runtime import FakeRuntime


async def concurrent_results(worker_cls: Any, calls: int = 16) -> None:
    """`calls` handlers finish at the same instant while heartbeats run every 50 ms: every
    result reaches the runtime exactly once and the heartbeats go on after them."""
    async with FakeRuntime(lease_ttl_ms=150) as runtime:
        worker = worker_cls(worker_id="w-concurrent", runtime_addr=runtime.address)
        started = 0
        release = asyncio.Event()

        @worker.tool("payments.issue-refund", version="1.0.0", max_concurrency=calls)
        async def refund(args: dict, ctx: Any) -> dict:
            nonlocal started
            started += 1
            if started == calls:
                release.set()
            await release.wait()
            return {"order_id": args["order_id"], "call_id": ctx.call_id}

        running = asyncio.ensure_future(worker.connect())
        try:
            await runtime.wait_for(lambda: runtime.registers, "registration")
            for i in range(calls):
                runtime.invoke(f"call-{i}", {"order_id": f"O-{i}"})
            await runtime.wait_for(lambda: len(runtime.results) == calls, f"{calls} results")
            beats = runtime.heartbeats
            await runtime.wait_for(lambda: runtime.heartbeats >= beats + 3, "heartbeats after the results")
            assert all(n == 1 for n in runtime.result_counts.values()), runtime.result_counts
            for i in range(calls):
                result = runtime.results[f"call-{i}"]
                assert not result.HasField("error"), result
                assert b'"order_id":"O-%d"' % i in result.payload.replace(b" ", b""), result.payload
        finally:
            await worker.close()
            await asyncio.wait_for(running, 10)


if __name__ == "__main__":
    from phrony.worker import Worker

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    for n in range(rounds):
        try:
            asyncio.run(asyncio.wait_for(concurrent_results(Worker), 30))
        except BaseException as error:  # noqa: BLE001 - report which round failed and how
            print(f"round {n + 1}: FAILED {type(error).__name__}: {error}")
            sys.exit(1)
    print(f"{rounds} rounds passed")
