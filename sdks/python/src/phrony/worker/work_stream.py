"""`WorkStream`: the worker's side of one `Work` stream.

Every message to the runtime goes through one queue and is written by one task, so two writes
never overlap (the published 0.1.0 SDK wrote from each handler's task, and grpcio refuses a
write while another is in progress: `TOO_MANY_OPERATIONS`, after which that SDK hung).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from grpc import aio

from phrony.client.errors import PhronyError
from phrony.gen.phrony.runtime.v1 import runtime_pb2
from phrony.worker.types import DEFAULT_MAX_CONCURRENCY


class WorkStreamClosed(PhronyError):
    """A message was sent after the stream was closed or broke."""


def build_handler_advertisements(handlers: Iterable[Any]) -> list[runtime_pb2.WorkHandlerAdvertisement]:
    """One advertisement per registered tool (`RegisteredTool` or anything with its fields)."""
    return [
        runtime_pb2.WorkHandlerAdvertisement(
            tool=h.tool,
            version=h.version,
            contract_version=h.contract_version or "",
            max_concurrency=h.max_concurrency or DEFAULT_MAX_CONCURRENCY,
            descriptor_hash=h.descriptor_hash or "",
        )
        for h in handlers
    ]


class WorkStream:
    """Serialised writes and a reader with callbacks over one `Work` call."""

    def __init__(self, stream: aio.StreamStreamCall) -> None:
        self._stream = stream
        self._queue: asyncio.Queue[runtime_pb2.WorkClientMsg | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._write_error: BaseException | None = None
        self._executing: set[str] = set()
        # The status that ended the stream (None: ended cleanly); set when `finished()` returns.
        self.end_error: BaseException | None = None

    # --- writing ------------------------------------------------------------------------

    async def _write(self, msg: runtime_pb2.WorkClientMsg) -> None:
        """Queues `msg` for the single writer task (never writes itself)."""
        if self._closed:
            raise WorkStreamClosed(f"the work stream is closed ({self._write_error or 'closed'})")
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())
        self._queue.put_nowait(msg)

    async def _write_loop(self) -> None:
        try:
            while True:
                msg = await self._queue.get()
                if msg is None:
                    await self._stream.done_writing()
                    return
                await self._stream.write(msg)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the stream broke; the reader reports its status
            self._write_error = error
            self._closed = True

    async def send_register(self, register: runtime_pb2.WorkRegister) -> None:
        await self._write(runtime_pb2.WorkClientMsg(register=register))

    async def send_heartbeat(self) -> None:
        await self._write(runtime_pb2.WorkClientMsg(heartbeat=runtime_pb2.WorkHeartbeat()))

    async def send_result(self, result: runtime_pb2.WorkToolResult) -> None:
        self._executing.discard(result.call_id)
        await self._write(runtime_pb2.WorkClientMsg(result=result))

    async def send_nack(self, nack: runtime_pb2.WorkToolNack) -> None:
        self._executing.discard(nack.call_id)
        await self._write(runtime_pb2.WorkClientMsg(nack=nack))

    def in_flight_calls(self) -> list[str]:
        return sorted(self._executing)

    def mark_call_executing(self, call_id: str) -> None:
        self._executing.add(call_id)

    # --- reading ------------------------------------------------------------------------

    def run(
        self,
        *,
        on_registered: Callable[[int], Any] | None = None,
        on_invoke: Callable[[runtime_pb2.WorkInvoke], Any] | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        on_result_ack: Callable[[str], Any] | None = None,
        on_error: Callable[[Exception], Any] | None = None,
        on_end: Callable[[], Any] | None = None,
    ) -> None:
        """Starts reading the runtime's messages into the callbacks (`on_registered` gets the
        lease in ms); `await finished()` waits for the end."""
        if self._reader is not None:
            raise PhronyError("WorkStream.run was already called")

        async def call(cb: Callable[..., Any] | None, *args: Any) -> None:
            if cb is not None:
                result = cb(*args)
                if asyncio.iscoroutine(result):
                    await result

        async def read() -> None:
            try:
                async for msg in self._stream:
                    kind = msg.WhichOneof("body")
                    if kind == "registered":
                        await call(on_registered, msg.registered.lease_ttl_ms)
                    elif kind == "invoke":
                        await call(on_invoke, msg.invoke)
                    elif kind == "cancel":
                        await call(on_cancel, msg.cancel.call_id)
                    elif kind == "result_ack":
                        await call(on_result_ack, msg.result_ack.call_id)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                self.end_error = error
                await call(on_error, error)
            finally:
                self._closed = True
            await call(on_end)

        self._reader = asyncio.ensure_future(read())

    async def finished(self) -> BaseException | None:
        """Waits until the runtime ends the stream, or `close()` gives up waiting for it and
        cancels it; the error status, or `None`."""
        if self._reader is not None:
            try:
                await asyncio.shield(self._reader)
            except asyncio.CancelledError:
                # The reader cancelled by `close()` ends the stream on our side; a cancel of
                # the task waiting here (the shield keeps the reader running) propagates.
                if not self._reader.cancelled():
                    raise
                task = asyncio.current_task()
                if task is not None and getattr(task, "cancelling", lambda: 0)():
                    raise
        return self.end_error

    async def close(self, *, timeout: float = 2.0) -> None:
        """Sends what is queued, half-closes, waits up to `timeout` s for the runtime to end
        the stream, then cancels it."""
        if not self._closed and self._writer is not None and not self._writer.done():
            self._queue.put_nowait(None)
            self._closed = True
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), timeout)
                if self._reader is not None:
                    await asyncio.wait_for(asyncio.shield(self._reader), timeout)
            except asyncio.CancelledError:
                # The writer or reader was cancelled meanwhile (the stream ended on another
                # path, e.g. the connect loop stopping): there is nothing left to wait for. A
                # cancel of the task closing (the shields keep those two running) propagates.
                ended = [t for t in (self._writer, self._reader) if t is not None and t.cancelled()]
                if not ended:
                    raise
                task = asyncio.current_task()
                if task is not None and getattr(task, "cancelling", lambda: 0)():
                    raise
            except (asyncio.TimeoutError, Exception):
                pass
        self._closed = True
        self._stream.cancel()
        for task in (self._writer, self._reader):
            if task is not None and not task.done():
                task.cancel()
