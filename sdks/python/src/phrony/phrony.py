"""`Phrony`: the 0.1.0 high-level entry point (`Phrony(...).agent("ns/name").run(...)`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import grpc

from phrony.agent_ref import parse_agent_ref
from phrony.bundle_ref import parse_bundle_ref
from phrony.client.errors import PhronyError
from phrony.client.runtime_client import RuntimeClient
from phrony.gen.phrony.runtime.v1 import runtime_pb2
from phrony.session.interactive_session import InteractiveSession
from phrony.types import AgentRef, BundleRef


class AgentSessionError(PhronyError):
    """A session ended `failed` or `cancelled` instead of `completed`."""

    def __init__(self, message: str, session_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.session_id = session_id


@dataclass
class AgentRunResult:
    session_id: str
    agent_version_id: str | None = None
    output: Any = None
    stop_reason: str | None = None
    stats: Any = None
    status: str | None = None


class Phrony:
    """Runs agents and bundles on one runtime; the client connects on first use."""

    def __init__(self, *, runtime_addr: str | None = None, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._runtime_addr = runtime_addr
        self._credentials = credentials
        self._client: RuntimeClient | None = None

    @classmethod
    async def connect(
        cls, *, runtime_addr: str | None = None, credentials: grpc.ChannelCredentials | None = None
    ) -> Phrony:
        phrony = cls(runtime_addr=runtime_addr, credentials=credentials)
        await phrony.ensure_client()
        return phrony

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def agent(self, ref: str) -> PhronyAgent:
        return PhronyAgent(self, parse_agent_ref(ref))

    def bundle(self, ref: str) -> PhronyBundle:
        return PhronyBundle(self, parse_bundle_ref(ref))

    async def runtime_client(self) -> RuntimeClient:
        return await self.ensure_client()

    async def ensure_client(self) -> RuntimeClient:
        if self._client is None:
            self._client = await RuntimeClient.connect(address=self._runtime_addr, credentials=self._credentials)
        return self._client


async def _follow_to_end(session: InteractiveSession) -> AgentRunResult:
    """Reads a started task session's events until it completes; raises `AgentSessionError`
    when it fails or is cancelled."""
    session_id = ""
    agent_version_id: str | None = None
    try:
        async for typed in session.events():
            event = cast(dict[str, Any], typed)
            kind = event["type"]
            if kind == "session_started":
                session_id = event["session_id"]
                agent_version_id = event["agent_version_id"]
            elif kind == "completed":
                return AgentRunResult(
                    session_id=session_id,
                    agent_version_id=agent_version_id,
                    output=event["output"],
                    stop_reason=event["stop_reason"],
                    stats=event["stats"],
                    status="completed",
                )
            elif kind == "failed":
                raise AgentSessionError(f"session {session_id} failed: {event['message']}", session_id or None)
            elif kind == "cancelled":
                raise AgentSessionError(f"session {session_id} was cancelled", session_id or None)
        raise AgentSessionError(f"the stream of session {session_id} ended before it completed", session_id or None)
    finally:
        await session.close()


class PhronyAgent:
    """One agent (`namespace/name`) of a `Phrony`."""

    def __init__(self, phrony: Phrony, ref: AgentRef) -> None:
        self._phrony = phrony
        self.ref = ref

    def _ref(self, version: str | None) -> AgentRef:
        return {"namespace": self.ref["namespace"], "name": self.ref["name"], "version": version or self.ref["version"]}

    async def run(
        self,
        *,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        version: str | None = None,
        wait: bool = True,
    ) -> AgentRunResult:
        """`wait=False`: starts a task session and returns its id at once. `wait=True`: runs it
        to completion on an interactive stream (a pending approval keeps it waiting)."""
        client = await self._phrony.ensure_client()
        if not wait:
            started = await client.run_session(
                agent_ref=self._ref(version),
                input=input,
                resolved_secrets=resolved_secrets,
                mode=runtime_pb2.SESSION_MODE_TASK,
            )
            return AgentRunResult(
                session_id=started.session_id, agent_version_id=started.agent_version_id, status=started.status
            )
        session = client.run_session_interactive()
        await session.start(
            input=input,
            resolved_secrets=resolved_secrets,
            agent_ref=self._ref(version),
            mode=runtime_pb2.SESSION_MODE_TASK,
        )
        return await _follow_to_end(session)

    async def run_interactive(
        self,
        *,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> InteractiveSession:
        client = await self._phrony.ensure_client()
        session = client.run_session_interactive()
        await session.start(input=input, resolved_secrets=resolved_secrets, agent_ref=self._ref(version))
        return session


class PhronyBundle:
    """One bundle (`namespace/name`) of a `Phrony`."""

    def __init__(self, phrony: Phrony, ref: BundleRef) -> None:
        self._phrony = phrony
        self.ref = ref

    def _ref(self, version: str | None) -> BundleRef:
        return {"namespace": self.ref["namespace"], "name": self.ref["name"], "version": version or self.ref["version"]}

    async def run(
        self,
        *,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        version: str | None = None,
        wait: bool = True,
    ) -> AgentRunResult:
        client = await self._phrony.ensure_client()
        if not wait:
            started = await client.run_session(
                bundle_ref=self._ref(version),
                input=input,
                resolved_secrets=resolved_secrets,
                mode=runtime_pb2.SESSION_MODE_TASK,
            )
            return AgentRunResult(
                session_id=started.session_id, agent_version_id=started.agent_version_id, status=started.status
            )
        session = client.run_session_interactive()
        await session.start(
            input=input,
            resolved_secrets=resolved_secrets,
            bundle_ref=self._ref(version),
            mode=runtime_pb2.SESSION_MODE_TASK,
        )
        return await _follow_to_end(session)

    async def run_interactive(
        self,
        *,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        version: str | None = None,
    ) -> InteractiveSession:
        client = await self._phrony.ensure_client()
        session = client.run_session_interactive()
        await session.start(input=input, resolved_secrets=resolved_secrets, bundle_ref=self._ref(version))
        return session
