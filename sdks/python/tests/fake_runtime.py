"""A scripted `Work` endpoint for worker tests: a real gRPC server on 127.0.0.1 serving only
`Runtime.Work`, where the test decides what the runtime sends (invokes, cancels, the end of a
stream, a refusal) and every message the worker sends is recorded.

It lives in the test's event loop (`async with FakeRuntime() as runtime`). Works with any
`phrony` that has the generated stubs at `phrony.gen` (this SDK and the published 0.1.0).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import grpc
from grpc import aio

from phrony.gen.phrony.runtime.v1 import runtime_pb2, runtime_pb2_grpc


class FakeRuntime(runtime_pb2_grpc.RuntimeServicer):
    def __init__(self, lease_ttl_ms: int = 30_000, port: int = 0) -> None:
        self.lease_ttl_ms = lease_ttl_ms
        self.port = port
        self.server: aio.Server | None = None
        self.registers: list[runtime_pb2.WorkRegister] = []
        self.results: dict[str, runtime_pb2.WorkToolResult] = {}
        self.result_counts: Counter[str] = Counter()
        self.nacks: dict[str, runtime_pb2.WorkToolNack] = {}
        self.heartbeats = 0
        self.streams_closed_by_worker = 0
        self.refuse: tuple[grpc.StatusCode, str] | None = None
        # Seconds the runtime takes to end a stream after the worker half-closed it (a loaded
        # runtime recording the worker's departure).
        self.end_delay = 0.0
        self._out: asyncio.Queue[runtime_pb2.WorkServerMsg | None] | None = None
        self._changed = asyncio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self.server = aio.server()
        runtime_pb2_grpc.add_RuntimeServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()

    async def stop(self, grace: float | None = None) -> None:
        if self.server is not None:
            await self.server.stop(grace)
            self.server = None

    # --- the Work stream ----------------------------------------------------------------

    async def Work(self, request_iterator: Any, context: aio.ServicerContext) -> Any:
        if self.refuse is not None:
            await context.abort(*self.refuse)
        out: asyncio.Queue[runtime_pb2.WorkServerMsg | None] = asyncio.Queue()
        self._out = out
        reader = asyncio.ensure_future(self._read(request_iterator, out))
        try:
            while True:
                msg = await out.get()
                if msg is None:
                    return
                yield msg
        finally:
            reader.cancel()
            if self._out is out:
                self._out = None

    async def _read(self, requests: Any, out: asyncio.Queue[runtime_pb2.WorkServerMsg | None]) -> None:
        async for msg in requests:
            kind = msg.WhichOneof("body")
            if kind == "register":
                self.registers.append(msg.register)
                out.put_nowait(
                    runtime_pb2.WorkServerMsg(
                        registered=runtime_pb2.WorkRegistered(
                            worker_id=msg.register.worker_id, lease_ttl_ms=self.lease_ttl_ms
                        )
                    )
                )
            elif kind == "heartbeat":
                self.heartbeats += 1
                out.put_nowait(runtime_pb2.WorkServerMsg(heartbeat_ack=runtime_pb2.WorkHeartbeatAck()))
            elif kind == "result":
                self.results.setdefault(msg.result.call_id, msg.result)
                self.result_counts[msg.result.call_id] += 1
                out.put_nowait(runtime_pb2.WorkServerMsg(result_ack=runtime_pb2.WorkResultAck(call_id=msg.result.call_id)))
            elif kind == "nack":
                self.nacks[msg.nack.call_id] = msg.nack
            self._changed.set()
        self.streams_closed_by_worker += 1
        self._changed.set()
        if self.end_delay:
            await asyncio.sleep(self.end_delay)
        out.put_nowait(None)

    # --- what the test makes the runtime do ---------------------------------------------

    def summary(self) -> str:
        return (
            f"registers={len(self.registers)} results={sorted(self.results)} nacks={sorted(self.nacks)} "
            f"heartbeats={self.heartbeats} connected={self.connected()} closed_by_worker={self.streams_closed_by_worker}"
        )

    def connected(self) -> bool:
        return self._out is not None

    def invoke(
        self,
        call_id: str,
        args: dict[str, Any],
        tool: str = "payments.issue-refund",
        version: str = "1.0.0",
        deadline_in: float | None = None,
        trace_context: dict[str, str] | None = None,
    ) -> None:
        assert self._out is not None, "no worker is connected"
        deadline = int((time.time() + deadline_in) * 1000) if deadline_in is not None else 0
        import json

        self._out.put_nowait(
            runtime_pb2.WorkServerMsg(
                invoke=runtime_pb2.WorkInvoke(
                    call_id=call_id,
                    session_id="run_test",
                    agent_version_id="av_test",
                    turn=1,
                    tool=tool,
                    version=version,
                    args=json.dumps(args).encode(),
                    side_effect_class="irreversible_action",
                    deadline_unix_ms=deadline,
                    trace_context=trace_context or {},
                )
            )
        )

    def cancel(self, call_id: str) -> None:
        assert self._out is not None
        self._out.put_nowait(runtime_pb2.WorkServerMsg(cancel=runtime_pb2.WorkToolCancel(call_id=call_id)))

    def end_stream(self) -> None:
        """Ends the current stream with OK (what the daemon does when it stops)."""
        if self._out is not None:
            self._out.put_nowait(None)

    async def wait_for(self, predicate: Any, what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {what} ({self.summary()})")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))
            except asyncio.TimeoutError:
                pass
