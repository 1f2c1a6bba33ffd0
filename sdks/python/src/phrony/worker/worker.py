"""`Worker`: registers tool handlers on the runtime's `Work` stream and runs the calls it sends.

    worker = Worker(worker_id="refund-worker-1")

    @worker.tool("payments.issue-refund", version="1.0.0", max_concurrency=2)
    async def issue_refund(args: dict, ctx) -> dict: ...

    asyncio.run(worker.connect())

- Writes to the stream are serialised (see `work_stream.py`).
- Each call runs in its own task. A `cancel` from the runtime (or the call's deadline) sets
  `ctx.signal` and cancels the task; the runtime gets error `cancelled`.
- The connection is kept: when the stream breaks or the runtime restarts, `connect()`
  reconnects with exponential backoff (0.2 s doubling to 10 s, with jitter) and registers again
  with the calls still running or whose results were not acknowledged (`in_flight`); results
  finished while disconnected are sent once it is registered again. Refusals that a retry
  cannot fix (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, and FAILED_PRECONDITION: a
  descriptor pin no published version holds) end `connect()` with the typed error.
- SIGTERM / SIGINT (or `await worker.close()`) drains: new calls are refused (nack `unavailable`,
  the call never ran), running calls get up to `drain_timeout` seconds to finish and have their
  results acknowledged, then the stream is closed and `connect()` returns. A second signal
  cancels the running calls at once (they report `cancelled`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from phrony.client.dial import ChannelOption, dial_runtime, resolve_runtime_addr
from phrony.client.errors import PhronyRuntimeError, wrap_rpc_error
from phrony.client.json_bytes import json_bytes, parse_json_bytes
from phrony.credentials import channel_credentials
from phrony.gen.phrony.runtime.v1 import runtime_pb2
from phrony.worker.pins import descriptor_pin_of, tool_pin_of
from phrony.worker.types import (
    DEFAULT_MAX_CONCURRENCY,
    CancelSignal,
    RegisteredTool,
    ToolError,
    ToolHandler,
    ToolHandlerContext,
    handler_key,
    heartbeat_interval_ms,
)
from phrony.worker.work_stream import WorkStream, build_handler_advertisements

log = logging.getLogger("phrony.worker")

F = TypeVar("F", bound=Callable[..., Any])

# Statuses a reconnect cannot fix: configuration or credential problems. FAILED_PRECONDITION is
# a refused registration (a descriptor pin no published version holds) or a protocol misuse:
# reconnecting would be refused (and audited) again.
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
# A result is offered again on at most this many registrations before it is dropped (logged).
MAX_RESULT_DELIVERIES = 5


def descriptor_hash_of(path: str | os.PathLike[str]) -> str:
    """Deprecated alias of :func:`phrony.worker.descriptor_pin_of`: the descriptor pin of a Tool
    document (it used to hash the file's bytes, which the runtime now refuses)."""
    warnings.warn(
        "descriptor_hash_of is deprecated; use descriptor_pin_of (it returns the same pin)",
        DeprecationWarning,
        stacklevel=2,
    )
    return descriptor_pin_of(path)


@dataclass
class _Call:
    invoke: runtime_pb2.WorkInvoke
    signal: CancelSignal
    task: asyncio.Task[None] | None = None
    result: runtime_pb2.WorkToolResult | None = None
    deliveries: int = 0
    cancelled_by_runtime: bool = False
    started: float = field(default_factory=time.monotonic)


class Worker:
    """A tool worker; see the module documentation."""

    def __init__(
        self,
        *,
        worker_id: str,
        runtime_addr: str | None = None,
        workload_identity: str | None = None,
        image_digest: str | None = None,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: list[ChannelOption] | None = None,
        reconnect: bool = True,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        drain_timeout: float = 30.0,
        handle_signals: bool = True,
    ) -> None:
        if not worker_id or not worker_id.strip():
            raise ValueError("worker_id is required")
        self.worker_id = worker_id
        self.runtime_addr = resolve_runtime_addr(runtime_addr)
        self.workload_identity = workload_identity
        self.image_digest = image_digest
        self._credentials = credentials or channel_credentials(
            self.runtime_addr, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self._channel_options = channel_options
        self.reconnect = reconnect
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.drain_timeout = drain_timeout
        self.handle_signals = handle_signals
        self._handlers: dict[str, RegisteredTool] = {}
        self._calls: dict[str, _Call] = {}
        self._stream: WorkStream | None = None
        self._registered = False
        self._draining = False
        self._stopping: asyncio.Event | None = None
        self._drain_task: asyncio.Task[None] | None = None
        # Counts for tests and monitoring.
        self.registrations = 0

    # --- registration -------------------------------------------------------------------

    def tool(
        self,
        name: str,
        *,
        version: str,
        contract_version: str | None = None,
        descriptor_hash: str | None = None,
        max_concurrency: int | None = None,
        descriptor: str | os.PathLike[str] | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of `register_tool`."""

        def decorate(handler: F) -> F:
            self.register_tool(
                tool=name,
                version=version,
                handler=handler,
                contract_version=contract_version,
                descriptor_hash=descriptor_hash,
                max_concurrency=max_concurrency,
                descriptor=descriptor,
            )
            return handler

        return decorate

    def register_tool(
        self,
        *,
        tool: str,
        version: str,
        handler: ToolHandler,
        contract_version: str | None = None,
        descriptor_hash: str | None = None,
        max_concurrency: int | None = None,
        descriptor: str | os.PathLike[str] | None = None,
    ) -> Worker:
        """Serves `tool@version` with `handler(args, ctx)` (sync or async). `descriptor`: the
        tool's Tool document (`tools/*.yaml`), whose descriptor pin (`descriptor_pin_of`, the
        same value as `phrony tools pin FILE`) is sent at registration and recorded with each
        call; it must describe this `tool@version`. Or pass `descriptor_hash` yourself: the
        runtime refuses a worker whose non-empty hash matches no pin published for the tool."""
        if not tool or not version:
            raise ValueError("tool and version are required (the runtime routes by exact tool@version)")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        if descriptor is not None:
            if descriptor_hash is not None:
                raise ValueError("pass descriptor or descriptor_hash, not both")
            pinned_tool, pinned_version, descriptor_hash = tool_pin_of(descriptor)
            if (pinned_tool, pinned_version) != (tool, version):
                raise ValueError(
                    f"{os.fspath(descriptor)} describes {pinned_tool}@{pinned_version}, not {tool}@{version}"
                )
        key = handler_key(tool, version)
        if key in self._handlers:
            raise ValueError(f"{key} is already registered")
        self._handlers[key] = RegisteredTool(
            tool=tool,
            version=version,
            handler=handler,
            contract_version=contract_version,
            descriptor_hash=descriptor_hash,
            max_concurrency=max_concurrency or DEFAULT_MAX_CONCURRENCY,
        )
        return self

    # --- running ------------------------------------------------------------------------

    async def connect(self) -> None:
        """Runs the worker until it is drained (SIGTERM/SIGINT, `close()`), or until a refusal a
        reconnect cannot fix (raised as the typed `PhronyRuntimeError`). With
        `reconnect=False`, returns when the stream ends (raises if it ended with an error)."""
        if not self._handlers:
            raise ValueError("register at least one tool before connect()")
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._draining = False
        installed = self._install_signal_handlers(loop)
        dialed = dial_runtime(
            address=self.runtime_addr, credentials=self._credentials, channel_options=self._channel_options
        )
        attempt = 0
        try:
            while not self._stopping.is_set():
                registrations_before = self.registrations
                error = await self._one_stream(dialed.runtime)
                if self._stopping.is_set():
                    break
                if error is not None and error.status in FATAL_CODES:
                    raise error
                if not self.reconnect:
                    if error is not None:
                        raise error
                    break
                if self.registrations > registrations_before:
                    attempt = 0
                delay = min(self.backoff_max, self.backoff_initial * (2**attempt)) * random.uniform(0.5, 1.0)
                attempt += 1
                log.warning(
                    "worker %s: work stream ended (%s); reconnecting in %.1f s",
                    self.worker_id,
                    error or "closed by the runtime",
                    delay,
                )
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            for call in list(self._calls.values()):
                if call.task is not None and not call.task.done():
                    call.signal.abort()
                    call.task.cancel()
            await dialed.close()

    async def close(self) -> None:
        """Drains and stops (see the module documentation); returns when drained."""
        if self._stopping is None:
            return
        self.drain()
        if self._drain_task is not None:
            await asyncio.shield(self._drain_task)

    def _on_signal(self) -> None:
        """The first SIGTERM/SIGINT drains; a second one cancels the running calls at once
        (they report `cancelled`) so the drain ends without waiting for them."""
        if not self._draining:
            self.drain()
            return
        log.warning("worker %s: second signal, cancelling %d running calls", self.worker_id, len(self._calls))
        for call in self._calls.values():
            if call.task is not None and not call.task.done():
                call.signal.abort()
                call.task.cancel()

    def drain(self) -> None:
        """Starts a graceful drain (what SIGTERM does)."""
        if self._draining or self._stopping is None:
            return
        self._draining = True
        log.info("worker %s: draining (%d calls running)", self.worker_id, len(self._calls))
        self._drain_task = asyncio.ensure_future(self._drain())

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
        return installed

    async def _drain(self) -> None:
        assert self._stopping is not None
        deadline = time.monotonic() + self.drain_timeout
        while self._calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self._calls:
            log.warning("worker %s: %d calls still open after the drain timeout", self.worker_id, len(self._calls))
            for call in self._calls.values():
                if call.task is not None and not call.task.done():
                    call.signal.abort()
                    call.task.cancel()
            # Their `cancelled` results get a moment to reach the runtime.
            grace = time.monotonic() + 1.0
            while self._calls and time.monotonic() < grace:
                await asyncio.sleep(0.02)
        self._stopping.set()
        if self._stream is not None:
            await self._stream.close()

    async def _one_stream(self, stub: Any) -> PhronyRuntimeError | None:
        """One `Work` stream from registration to its end; the error status, if any."""
        stream = WorkStream(stub.Work())
        self._stream = stream
        self._registered = False
        heartbeat: asyncio.Task[None] | None = None
        in_flight = sorted(self._calls)

        async def on_registered(lease_ttl_ms: int) -> None:
            nonlocal heartbeat
            self._registered = True
            self.registrations += 1
            log.info("worker %s registered (lease %d ms, %d calls in flight)", self.worker_id, lease_ttl_ms, len(in_flight))
            heartbeat = asyncio.ensure_future(self._heartbeats(stream, heartbeat_interval_ms(lease_ttl_ms) / 1000))
            for call_id, call in list(self._calls.items()):
                if call.result is not None:
                    await self._deliver(call_id, call)

        def on_result_ack(call_id: str) -> None:
            self._calls.pop(call_id, None)

        def on_cancel(call_id: str) -> None:
            call = self._calls.get(call_id)
            if call is not None and call.task is not None and not call.task.done():
                call.cancelled_by_runtime = True
                call.signal.abort()
                call.task.cancel()

        stream.run(
            on_registered=on_registered,
            on_invoke=lambda invoke: self._on_invoke(stream, invoke),
            on_cancel=on_cancel,
            on_result_ack=on_result_ack,
        )
        try:
            await stream.send_register(
                runtime_pb2.WorkRegister(
                    worker_id=self.worker_id,
                    workload_identity=self.workload_identity or "",
                    image_digest=self.image_digest or "",
                    handlers=build_handler_advertisements(self._handlers.values()),
                    in_flight=[runtime_pb2.WorkInFlightCall(call_id=c) for c in in_flight],
                )
            )
            error = await stream.finished()
        finally:
            self._registered = False
            if heartbeat is not None:
                heartbeat.cancel()
            await stream.close(timeout=0.5)
            if self._stream is stream:
                self._stream = None
        if error is None:
            return None
        wrapped = wrap_rpc_error("work stream", error)
        if wrapped.status == grpc.StatusCode.NOT_FOUND:
            # A result the runtime no longer knows ends the stream: do not offer it again.
            for call_id in [c for c in self._calls if c in wrapped.details and self._calls[c].result is not None]:
                log.warning("worker %s: dropping the result of %s (%s)", self.worker_id, call_id, wrapped.details)
                self._calls.pop(call_id, None)
        return wrapped

    async def _heartbeats(self, stream: WorkStream, interval: float) -> None:
        try:
            while True:
                await asyncio.sleep(interval)
                await stream.send_heartbeat()
        except Exception:
            return

    async def _deliver(self, call_id: str, call: _Call) -> None:
        """Sends a finished call's result on the current stream, if registered."""
        stream = self._stream
        if call.result is None or stream is None or not self._registered:
            return
        if call.deliveries >= MAX_RESULT_DELIVERIES:
            log.error("worker %s: result of %s was never acknowledged; dropped", self.worker_id, call_id)
            self._calls.pop(call_id, None)
            return
        call.deliveries += 1
        try:
            await stream.send_result(call.result)
        except Exception:
            pass  # the stream broke; the result is offered again after reconnecting

    async def _on_invoke(self, stream: WorkStream, invoke: runtime_pb2.WorkInvoke) -> None:
        call_id = invoke.call_id
        if call_id in self._calls:
            # A re-sent invoke of a call we already run or finished: answer with what we have.
            known = self._calls[call_id]
            if known.result is not None:
                await self._deliver(call_id, known)
            return
        registered = self._handlers.get(handler_key(invoke.tool, invoke.version))
        if registered is None:
            await stream.send_nack(
                runtime_pb2.WorkToolNack(
                    call_id=call_id,
                    code="unknown_handler",
                    message=f"worker {self.worker_id} has no handler for {handler_key(invoke.tool, invoke.version)}",
                )
            )
            return
        if self._draining:
            await stream.send_nack(
                runtime_pb2.WorkToolNack(
                    call_id=call_id, code="unavailable", message=f"worker {self.worker_id} is shutting down"
                )
            )
            return
        try:
            args = parse_json_bytes(invoke.args) if invoke.args else {}
        except ValueError as error:
            await stream.send_nack(
                runtime_pb2.WorkToolNack(call_id=call_id, code="invalid_args", message=f"arguments are not JSON: {error}")
            )
            return
        if not isinstance(args, dict):
            await stream.send_nack(
                runtime_pb2.WorkToolNack(
                    call_id=call_id, code="invalid_args", message=f"arguments must be a JSON object, got {type(args).__name__}"
                )
            )
            return
        call = _Call(invoke=invoke, signal=CancelSignal())
        self._calls[call_id] = call
        stream.mark_call_executing(call_id)
        call.task = asyncio.ensure_future(self._run_call(registered, call, args))

    async def _run_call(self, registered: RegisteredTool, call: _Call, args: dict[str, Any]) -> None:
        invoke = call.invoke
        ctx = ToolHandlerContext(
            call_id=invoke.call_id,
            session_id=invoke.session_id,
            agent_version_id=invoke.agent_version_id,
            turn=invoke.turn,
            tool=invoke.tool,
            version=invoke.version,
            side_effect_class=invoke.side_effect_class,
            signal=call.signal,
            invoke=invoke,
        )
        result = runtime_pb2.WorkToolResult(call_id=invoke.call_id)
        try:
            timeout = ctx.remaining()
            value = await asyncio.wait_for(self._invoke_handler(registered.handler, args, ctx), timeout)
            try:
                result.payload = json_bytes(value)
            except (TypeError, ValueError) as error:
                result.error.CopyFrom(runtime_pb2.WorkToolError(code="internal", message=f"result is not JSON: {error}"))
        except asyncio.TimeoutError:
            call.signal.abort()
            result.error.CopyFrom(runtime_pb2.WorkToolError(code="cancelled", message="deadline exceeded"))
        except asyncio.CancelledError:
            why = "cancelled by the runtime" if call.cancelled_by_runtime else "worker shutting down"
            result.error.CopyFrom(runtime_pb2.WorkToolError(code="cancelled", message=f"invoke {why}"))
        except ToolError as error:
            result.error.CopyFrom(runtime_pb2.WorkToolError(code=error.code, message=error.message))
        except Exception as error:
            log.exception("worker %s: handler %s failed", self.worker_id, handler_key(invoke.tool, invoke.version))
            result.error.CopyFrom(runtime_pb2.WorkToolError(code="internal", message=str(error) or type(error).__name__))
        call.result = result
        await self._deliver(invoke.call_id, call)

    @staticmethod
    async def _invoke_handler(handler: ToolHandler, args: dict[str, Any], ctx: ToolHandlerContext) -> Any:
        value = handler(args, ctx)
        if inspect.isawaitable(value):
            value = await value
        return value
