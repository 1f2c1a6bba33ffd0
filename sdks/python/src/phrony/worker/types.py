"""Types of the tool worker: handlers, their context, errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from phrony.gen.phrony.runtime.v1 import runtime_pb2

DEFAULT_MAX_CONCURRENCY = 4

TArgs = TypeVar("TArgs")
TResult = TypeVar("TResult")


class ToolError(Exception):
    """Raise from a handler to return an error with your own `code` (e.g. `invalid_args`) to
    the model; any other exception becomes code `internal`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class CancelSignal:
    """Set when the runtime cancels the call (session ended, deadline passed) or the worker
    shuts down. Handlers that do long work can check `aborted` or `await wait()`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    @property
    def aborted(self) -> bool:
        return self._event.is_set()

    def abort(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


@dataclass
class ToolHandlerContext:
    call_id: str
    session_id: str
    agent_version_id: str
    turn: int
    tool: str
    version: str
    side_effect_class: str
    signal: CancelSignal
    invoke: runtime_pb2.WorkInvoke

    @property
    def deadline(self) -> float | None:
        """The runtime's deadline for this call as a `time.time()` value, if it has one."""
        return self.invoke.deadline_unix_ms / 1000 if self.invoke.deadline_unix_ms > 0 else None

    @property
    def trace_context(self) -> dict[str, str]:
        """The W3C trace context of the runtime's dispatch span (`traceparent`, `tracestate`):
        extract it with an OpenTelemetry propagator to parent the handler's spans. Empty when the
        runtime exports no traces."""
        return dict(self.invoke.trace_context)

    def remaining(self) -> float | None:
        """Seconds until the deadline (negative when passed); `None` without one."""
        deadline = self.deadline
        return None if deadline is None else deadline - time.time()


ToolHandler = Callable[[Any, ToolHandlerContext], Any | Awaitable[Any]]


@dataclass
class RegisteredTool:
    tool: str
    version: str
    handler: ToolHandler
    contract_version: str | None = None
    descriptor_hash: str | None = None
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY


@dataclass
class WorkerOptions:
    worker_id: str
    runtime_addr: str | None = None
    workload_identity: str | None = None
    image_digest: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def handler_key(tool: str, version: str) -> str:
    """The runtime routes by exact `tool@version`."""
    return f"{tool}@{version}"


def heartbeat_interval_ms(lease_ttl_ms: int) -> int:
    """How often to heartbeat for a lease: a third of it (two heartbeats may be lost before it
    expires), at least 100 ms; 10 s when the runtime sent no lease."""
    if lease_ttl_ms <= 0:
        return 10_000
    return max(100, lease_ttl_ms // 3)
