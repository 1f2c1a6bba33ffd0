"""`InteractiveSession`: one `RunSessionInteractive` stream.

Messages to the runtime are written by one task in order (never two writes at once); messages
from the runtime are converted to event dicts and read with `events()`. The stream's end is the
event `{"type": "stream_end"}`; an error status ends `events()` with the typed exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from grpc import aio

from phrony.client.errors import PhronyError, wrap_rpc_error
from phrony.client.json_bytes import json_bytes, parse_json_bytes, resolved_secrets_map
from phrony.gen.phrony.runtime.v1 import runtime_pb2
from phrony.session.types import InteractiveEvent
from phrony.types import (
    AgentRefLike,
    BundleRefLike,
    coerce_agent_ref,
    coerce_bundle_ref,
    conversation_message_to_dict,
    stats_to_dict,
)

# Events buffered for a reader that falls behind; the stream pauses (gRPC flow control) beyond it.
EVENT_BUFFER = 1024
# Event types 0.1.0 did not have; `events()` yields them only when asked (`extended=True`).
EXTENDED_EVENT_TYPES = frozenset({"approval_decided", "status"})


def _json_or_text(data: bytes) -> Any:
    if not data:
        return None
    try:
        return parse_json_bytes(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def event_of(msg: runtime_pb2.RunSessionInteractiveServerMsg) -> dict[str, Any] | None:
    """The event dict of one server message (`None` for a message without a body)."""
    kind = msg.WhichOneof("body")
    if kind == "session_started":
        m = msg.session_started
        return {
            "type": "session_started",
            "session_id": m.session_id,
            "agent_version_id": m.agent_version_id,
            "model_provider": m.model_provider,
            "model_name": m.model_name,
            "history": [conversation_message_to_dict(h) for h in m.history],
            "max_tokens_per_run": m.max_tokens_per_run,
            "max_wall_clock_seconds": m.max_wall_clock_seconds,
            "session_started_at_unix_ms": m.session_started_at_unix_ms,
            "session_ended_at_unix_ms": m.session_ended_at_unix_ms,
        }
    if kind == "text_delta":
        return {"type": "text_delta", "delta": msg.text_delta.delta}
    if kind == "awaiting_input":
        a = msg.awaiting_input
        return {
            "type": "awaiting_input",
            "stop_reason": a.stop_reason,
            "stats": stats_to_dict(a.stats),
            "input_blocked_reason": a.input_blocked_reason,
        }
    if kind == "completed":
        c = msg.completed
        return {
            "type": "completed",
            "stop_reason": c.stop_reason,
            "output": _json_or_text(c.output),
            "stats": stats_to_dict(c.stats),
            "session_ended_at_unix_ms": c.session_ended_at_unix_ms,
        }
    if kind == "failed":
        return {"type": "failed", "message": msg.failed.message}
    if kind == "cancelled":
        return {"type": "cancelled", "session_ended_at_unix_ms": msg.cancelled.session_ended_at_unix_ms}
    if kind == "tool_call":
        t = msg.tool_call
        return {"type": "tool_call", "call_id": t.call_id, "tool": t.tool, "version": t.version, "args": _json_or_text(t.args)}
    if kind == "tool_result":
        r = msg.tool_result
        return {
            "type": "tool_result",
            "call_id": r.call_id,
            "payload": _json_or_text(r.payload),
            "error_message": r.error_message,
        }
    if kind == "approval_required":
        ar = msg.approval_required
        return {
            "type": "approval_required",
            "approval_id": ar.approval_id,
            "call_id": ar.call_id,
            "tool": ar.tool,
            "version": ar.version,
            "route": ar.route,
            "reason": ar.reason,
            "authority_ref": ar.authority_ref,
            "policy_name": ar.policy_name,
            "policy_ref": ar.policy_ref,
            "args": _json_or_text(ar.args),
            "policy_runtime": _json_or_text(ar.policy_runtime),
            "approvals_required": ar.approvals_required,
            "approvals_received": ar.approvals_received,
            "comprehension_required": ar.comprehension_required,
            "expires_at": ar.expires_at,
            "kind": ar.kind,
        }
    if kind == "approval_decided":
        d = msg.approval_decided
        return {
            "type": "approval_decided",
            "approval_id": d.approval_id,
            "call_id": d.call_id,
            "status": d.status,
            "decided_by": d.decided_by,
            "comment": d.comment,
            "approvals_received": d.approvals_received,
            "approvals_required": d.approvals_required,
        }
    if kind == "status":
        return {"type": "status", "status": msg.status.status, "reason": msg.status.reason}
    return None


class InteractiveSession:
    """An interactive session on its own stream."""

    def __init__(self, stream: aio.StreamStreamCall) -> None:
        self._stream = stream
        self._writes: asyncio.Queue[runtime_pb2.RunSessionInteractiveClientMsg | None] = asyncio.Queue()
        self._events: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue(EVENT_BUFFER)
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._write_error: BaseException | None = None
        self.session_id: str | None = None

    def _ensure_tasks(self) -> None:
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_loop())
            self._reader = asyncio.ensure_future(self._read_loop())

    async def _write_loop(self) -> None:
        while True:
            msg = await self._writes.get()
            try:
                if msg is None:
                    await self._stream.done_writing()
                    return
                await self._stream.write(msg)
            except Exception as error:  # the reader reports the stream's status
                self._write_error = error
                return

    async def _read_loop(self) -> None:
        try:
            async for msg in self._stream:
                event = event_of(msg)
                if event is None:
                    continue
                if event["type"] == "session_started":
                    self.session_id = event["session_id"]
                await self._events.put(event)
            await self._events.put({"type": "stream_end"})
        except aio.AioRpcError as error:
            wrapped = wrap_rpc_error("run session interactive", error)
            wrapped.__cause__ = error
            await self._events.put(wrapped)
        except asyncio.CancelledError:
            raise

    async def _send(self, msg: runtime_pb2.RunSessionInteractiveClientMsg) -> None:
        if self._write_error is not None:
            raise PhronyError(f"the interactive stream is closed: {self._write_error}")
        self._ensure_tasks()
        await self._writes.put(msg)

    async def start(
        self,
        *,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        agent_ref: AgentRefLike | None = None,
        bundle_ref: BundleRefLike | None = None,
        mode: runtime_pb2.SessionMode | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Starts a new session of `agent_ref` (or `bundle_ref`) on this stream."""
        if (agent_ref is None) == (bundle_ref is None):
            raise ValueError("start needs exactly one of agent_ref and bundle_ref")
        start = runtime_pb2.RunSessionInteractiveStart(
            input=json_bytes(input) if input is not None else b"",
            resolved_secrets=resolved_secrets_map(resolved_secrets or {}),
            mode=mode or runtime_pb2.SESSION_MODE_UNSPECIFIED,
            metadata=dict(metadata or {}),
        )
        if agent_ref is not None:
            start.agent_ref.CopyFrom(coerce_agent_ref(agent_ref))
        else:
            assert bundle_ref is not None
            start.bundle_ref.CopyFrom(coerce_bundle_ref(bundle_ref))
        await self._send(runtime_pb2.RunSessionInteractiveClientMsg(start=start))

    async def attach(self, *, session_id: str) -> None:
        """Follows an existing session (the runtime first replays what happened so far)."""
        if not session_id:
            raise ValueError("session_id is required")
        await self._send(
            runtime_pb2.RunSessionInteractiveClientMsg(start=runtime_pb2.RunSessionInteractiveStart(session_id=session_id))
        )

    async def send_user_message(self, text: str) -> None:
        await self._send(
            runtime_pb2.RunSessionInteractiveClientMsg(user_message=runtime_pb2.RunSessionInteractiveUserMessage(text=text))
        )

    async def decide_tool_approval(
        self,
        *,
        approval_id: str,
        approved: bool,
        comment: str | None = None,
        args: Any = None,
        comprehension_acknowledged: bool = False,
    ) -> None:
        """Votes on an approval of this session (the stream's actor is recorded)."""
        await self._send(
            runtime_pb2.RunSessionInteractiveClientMsg(
                tool_approval=runtime_pb2.RunSessionInteractiveToolApproval(
                    approval_id=approval_id,
                    approved=approved,
                    comment=comment or "",
                    args=json_bytes(args) if args is not None else b"",
                    comprehension_acknowledged=comprehension_acknowledged,
                )
            )
        )

    def events(self, *, extended: bool = False) -> AsyncIterator[InteractiveEvent]:
        """Events until (and including) `stream_end`; an error status is raised.

        `extended=True` also yields the 0.2.0 event types `approval_decided` and `status`
        (left out by default: code written for 0.1.0 sees the events it knows)."""
        return self._event_iterator(extended)

    async def _event_iterator(self, extended: bool) -> AsyncIterator[InteractiveEvent]:
        self._ensure_tasks()
        while True:
            item = await self._events.get()
            if isinstance(item, BaseException):
                raise item
            if not extended and item["type"] in EXTENDED_EVENT_TYPES:
                continue
            yield item  # type: ignore[misc]
            if item["type"] == "stream_end":
                return

    async def close(self) -> None:
        """Half-closes the stream, then cancels it."""
        if self._writer is not None and not self._writer.done():
            await self._writes.put(None)
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), timeout=1.0)
            except (asyncio.TimeoutError, Exception):
                pass
        self._stream.cancel()
        for task in (self._writer, self._reader):
            if task is not None and not task.done():
                task.cancel()
