"""A worker registering with `descriptor="tools/x.yaml"` against the real daemon: its pin is one
the published agent version holds, so it is registered and serves that version's calls; a
worker advertising the old hash of the file's bytes is refused (FAILED_PRECONDITION)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fake_openai import Text, ToolCalls, after_tool, all_of, user_says

from phrony.worker import Worker, tool_pin_of

WORKER_ID = "pinned-worker-1"
PINNED_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from phrony.worker import Worker, tool_pin_of

    worker = Worker(worker_id=sys.argv[1], runtime_addr=sys.argv[2])
    for path in sys.argv[3:]:
        tool, version, _ = tool_pin_of(path)

        def handler(args, ctx, tool=tool):
            print("invoked", tool, ctx.call_id, flush=True)
            return {"order_id": args.get("order_id"), "status": "delivered", "amount": 400, "currency": "EUR"}

        worker.register_tool(tool=tool, version=version, handler=handler, descriptor=path)
    asyncio.run(worker.connect())
    """
)


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_worker_with_descriptor_files_registers_and_serves_the_published_version(seed_world, tmp_path):
    world = seed_world
    tools = [world.project / "tools" / "orders.lookup-order.yaml", world.project / "tools" / "payments.issue-refund.yaml"]
    # Only this worker serves the tools from now on.
    world.worker.stop()
    script = tmp_path / "pinned_worker.py"
    script.write_text(PINNED_WORKER, encoding="utf-8")
    out = tmp_path / "pinned_worker.out"
    with open(out, "w", encoding="utf-8") as sink:
        worker = subprocess.Popen(
            [sys.executable, str(script), WORKER_ID, world.daemon.address, *map(str, tools)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("PHRONY_")},
        )
    try:

        def registered() -> bool:
            assert worker.poll() is None, out.read_text()
            return any(
                "work stream open" in line and WORKER_ID in line for line in world.daemon.log().splitlines()
            )

        wait_for(registered, "the pinned worker to register")

        message = "Where is my order ORD-7?"
        conversation = user_says(message)
        world.fake.reply(
            ToolCalls.of(("lookup_order", {"order_id": "ORD-7"})),
            when=all_of(conversation, lambda r: not r.tool_results()),
        )
        world.fake.reply(Text("ORD-7 was delivered."), when=all_of(conversation, after_tool("lookup_order")))
        session = world.run(message)
        world.wait_for_status(session, "completed")
        assert "invoked orders.lookup-order" in out.read_text()
        assert worker.poll() is None, out.read_text()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_a_worker_advertising_the_file_bytes_hash_is_refused(seed_world):
    file = seed_world.project / "tools" / "orders.lookup-order.yaml"
    tool, version, pin = tool_pin_of(file)
    old_hash = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
    assert old_hash != pin
    # Reconnecting is on: a refused registration must stop the worker, not retry it forever.
    worker = Worker(worker_id="bytes-hash-worker", runtime_addr=seed_world.daemon.address, handle_signals=False)
    worker.register_tool(tool=tool, version=version, handler=lambda a, c: {}, descriptor_hash=old_hash)

    async def connect() -> None:
        await asyncio.wait_for(worker.connect(), 30)

    with pytest.raises(Exception) as refused:  # noqa: PT011 - the typed error is the SDK's choice
        asyncio.run(connect())
    assert pin in str(refused.value), refused.value
