"""`Client`: the async API a backend uses — run sessions, wait for them, list and decide
approvals, list/inspect/cancel sessions.

    client = Client(runtime_addr="127.0.0.1:7777")
    session = await client.run("support/refund-agent", input="Refund ORD-1", metadata={"ticket_id": "T-1"})
    result = await session.wait()          # survives a pause for approval
    print(result.output)

A `Client` can be created at import time (outside any event loop): it connects on first use, and
again for each event loop it is used from (gRPC channels belong to one loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import grpc

from phrony.agent_ref import parse_agent_ref
from phrony.client.dial import ChannelOption, resolve_runtime_addr
from phrony.client.errors import PhronyError, ResourceExhaustedError, UnavailableError
from phrony.client.json_bytes import parse_json_bytes
from phrony.client.runtime_client import RuntimeClient
from phrony.credentials import channel_credentials
from phrony.gen.phrony.runtime.v1 import runtime_pb2
from phrony.phrony import AgentSessionError
from phrony.secrets import declared_secrets, resolve
from phrony.types import AgentRefLike, agent_ref_to_dict

logger = logging.getLogger("phrony.client")

ACTOR_HEADER = "phrony-actor"
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
# The runtime's page bound for ListApprovals / ListSessions.
PAGE_SIZE = 1000


class SessionFailedError(AgentSessionError):
    """`Session.wait()`: the session ended `failed`; `error` is the runtime's reason."""

    def __init__(self, session_id: str, error: str) -> None:
        super().__init__(f"session {session_id} failed: {error}", session_id)
        self.error = error


class SessionCancelledError(AgentSessionError):
    """`Session.wait()`: the session was cancelled."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id} was cancelled", session_id)


class WaitTimeoutError(PhronyError, TimeoutError):
    """`Session.wait(timeout=…)` gave up; the session goes on."""


def _json_or_text(data: bytes) -> Any:
    if not data:
        return None
    try:
        return parse_json_bytes(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ApprovalVote:
    decided_by: str
    decision: str
    comment: str
    created_at: str
    verification: str = ""
    via: str = ""


@dataclass(frozen=True)
class Approval:
    """A request for a human decision on one held tool call."""

    id: str
    session_id: str
    call_id: str
    status: str
    agent_ref: str
    tool: str
    version: str
    args: dict[str, Any]
    policy_ref: str
    reason: str
    route: str
    kind: str
    approvals_required: int
    approvals_received: int
    comprehension_required: bool
    on_reject: str
    created_at: str
    expires_at: str
    decided_at: str
    decided_by: str
    comment: str
    call_hash: str
    votes: tuple[ApprovalVote, ...] = ()

    @classmethod
    def from_proto(cls, a: runtime_pb2.Approval) -> Approval:
        args = _json_or_text(a.args)
        return cls(
            id=a.id,
            session_id=a.session_id,
            call_id=a.call_id,
            status=a.status,
            agent_ref=a.agent_ref,
            tool=a.tool,
            version=a.version,
            args=args if isinstance(args, dict) else ({} if args is None else {"value": args}),
            policy_ref=a.policy_ref,
            reason=a.reason,
            route=a.route,
            kind=a.kind or "policy",
            approvals_required=a.approvals_required,
            approvals_received=a.approvals_received,
            comprehension_required=a.comprehension_required,
            on_reject=a.on_reject,
            created_at=a.created_at,
            expires_at=a.expires_at,
            decided_at=a.decided_at,
            decided_by=a.decided_by,
            comment=a.comment,
            call_hash=a.call_hash,
            votes=tuple(
                ApprovalVote(v.decided_by, v.decision, v.comment, v.created_at, v.verification, v.via) for v in a.votes
            ),
        )


@dataclass(frozen=True)
class ApprovalChange:
    """One change of `client.approvals.watch(include_decided=True)`.

    `kind`: `"opened"` (pending: in the set when the watch started, or opened since),
    `"updated"` (still pending, e.g. one vote of a quorum) or `"decided"` (left the pending set:
    `approval.status` is approved, denied, escalated or cancelled)."""

    kind: str
    approval: Approval


_CHANGE_KINDS = {
    runtime_pb2.APPROVAL_CHANGE_KIND_OPENED: "opened",
    runtime_pb2.APPROVAL_CHANGE_KIND_UPDATED: "updated",
    runtime_pb2.APPROVAL_CHANGE_KIND_DECIDED: "decided",
}

# Reconnect backoff of `Approvals.watch`: first wait, and the cap.
WATCH_FIRST_BACKOFF = 0.2
WATCH_MAX_BACKOFF = 5.0


@dataclass(frozen=True)
class Decision:
    """What a vote did: the approval's status after it, and the session's."""

    status: str
    approvals_received: int
    session_status: str


@dataclass(frozen=True)
class SessionSummary:
    id: str
    status: str
    agent_ref: str
    agent_version_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, str]
    started_by: str

    @classmethod
    def from_proto(cls, s: runtime_pb2.SessionSummary) -> SessionSummary:
        ref = f"{s.agent_ref.namespace}/{s.agent_ref.name}" if s.HasField("agent_ref") else ""
        if ref and s.agent_ref.version:
            ref += f"@{s.agent_ref.version}"
        return cls(
            id=s.id,
            status=s.status,
            agent_ref=ref,
            agent_version_id=s.agent_version_id,
            created_at=s.created_at,
            updated_at=s.updated_at,
            metadata=dict(s.metadata),
            started_by=s.started_by,
        )


@dataclass(frozen=True)
class SessionDetails:
    """`sessions.inspect`: the session record; `raw` is the full `InspectSessionResponse`."""

    id: str
    status: str
    agent_version_id: str
    output: str | None
    error: str
    metadata: dict[str, str]
    created_at: str
    updated_at: str
    started_by: str
    raw: runtime_pb2.InspectSessionResponse = field(repr=False, compare=False)
    # With the agent's `output.format: json`: the accepted output, parsed (None for text output).
    output_json: Any = None


@dataclass(frozen=True)
class SessionResult:
    """A finished session: `output` is the agent's final answer (text); with the agent's
    `output.format: json`, `output_json` is the output the runtime accepted (the answer parsed
    as JSON and checked against `output.schema`, or what a human accepted), else None."""

    session_id: str
    status: str
    output: str | None
    stop_reason: str
    metadata: dict[str, str]
    output_json: Any = None


class Session:
    """A session started by `Client.run`."""

    def __init__(self, client: Client, session_id: str, agent_version_id: str, status: str, agent_ref: str) -> None:
        self._client = client
        self.id = session_id
        self.agent_version_id = agent_version_id
        self.status = status
        self.agent_ref = agent_ref

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, agent_ref={self.agent_ref!r}, status={self.status!r})"

    async def wait(self, *, timeout: float | None = None, poll_interval: float = 1.0) -> SessionResult:
        """Waits until the session ends. A session awaiting approval just keeps waiting.
        Returns the result when it completed; raises `SessionFailedError` /
        `SessionCancelledError` otherwise, `WaitTimeoutError` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            details = await self._client.sessions.inspect(self.id)
            self.status = details.status
            if details.status == "completed":
                return SessionResult(
                    session_id=self.id,
                    status=details.status,
                    output=details.output,
                    stop_reason=details.raw.session.output.stop_reason,
                    metadata=details.metadata,
                    output_json=details.output_json,
                )
            if details.status == "failed":
                raise SessionFailedError(self.id, details.error)
            if details.status == "cancelled":
                raise SessionCancelledError(self.id)
            if deadline is not None and time.monotonic() + delay > deadline:
                raise WaitTimeoutError(f"session {self.id} is still {details.status} after {timeout} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, max(poll_interval, 0.05))

    async def cancel(self) -> None:
        await self._client.sessions.cancel(self.id)

    async def inspect(self) -> SessionDetails:
        return await self._client.sessions.inspect(self.id)


class Approvals:
    """`client.approvals`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(
        self,
        *,
        status: str | None = None,
        session_id: str | None = None,
        route: str | None = None,
        agent: str | None = None,
    ) -> list[Approval]:
        """Every matching approval (all pages). `agent`: `namespace/name`."""
        rc = await self._client._runtime()
        namespace = name = ""
        if agent:
            ref = parse_agent_ref(agent)
            namespace, name = ref["namespace"], ref["name"]
        found: list[Approval] = []
        token = ""
        while True:
            page = await rc.list_approvals(
                status=status,
                session_id=session_id,
                route=route,
                agent_namespace=namespace,
                agent_name=name,
                page_size=PAGE_SIZE,
                page_token=token,
            )
            found.extend(Approval.from_proto(a) for a in page.approvals)
            token = page.next_page_token
            if not token:
                return found

    @overload
    def watch(
        self,
        *,
        status: str = ...,
        session_id: str | None = ...,
        route: str | None = ...,
        agent: str | None = ...,
        include_decided: Literal[False] = ...,
        reconnect: bool = ...,
    ) -> AsyncIterator[Approval]: ...

    @overload
    def watch(
        self,
        *,
        status: str = ...,
        session_id: str | None = ...,
        route: str | None = ...,
        agent: str | None = ...,
        include_decided: Literal[True],
        reconnect: bool = ...,
    ) -> AsyncIterator[ApprovalChange]: ...

    async def watch(
        self,
        *,
        status: str = "pending",
        session_id: str | None = None,
        route: str | None = None,
        agent: str | None = None,
        include_decided: bool = False,
        reconnect: bool = True,
    ) -> AsyncIterator[Any]:
        """The pending approvals matching the filters, then each one opened later, as they
        happen, without polling (`WatchApprovals`). `agent`: `namespace/name`; `status` must be
        `"pending"` (a watch follows the pending set).

        Yields `Approval` items, each once. With `include_decided=True` yields `ApprovalChange`
        objects instead: `"opened"` as above, `"updated"` and `"decided"` changes of the
        approvals already yielded.

        When the runtime becomes unavailable (a restart) or ends a watcher that fell behind,
        the watch connects again with backoff (0.2 s doubling to 5 s; `reconnect=False` raises
        instead) and resumes without duplicates: the runtime sends the current set again, the
        ids already yielded are skipped, and (with `include_decided`) an approval yielded
        before that is no longer pending is fetched and yielded as `"decided"`."""
        namespace = name = ""
        if agent:
            ref = parse_agent_ref(agent)
            namespace, name = ref["namespace"], ref["name"]
        yielded: set[str] = set()
        backoff = WATCH_FIRST_BACKOFF
        while True:
            current: set[str] | None = set()
            try:
                rc = await self._client._runtime()
                changes = rc.watch_approvals(
                    status=status, session_id=session_id, route=route, agent_namespace=namespace, agent_name=name
                )
                # aclosing: the call ends as soon as the caller stops iterating.
                async with contextlib.aclosing(changes):
                    async for change in changes:
                        if change.kind == runtime_pb2.APPROVAL_CHANGE_KIND_CURRENT_END:
                            assert current is not None
                            gone = yielded - current
                            yielded &= current
                            current = None
                            backoff = WATCH_FIRST_BACKOFF
                            if include_decided:
                                for approval_id in sorted(gone):
                                    yield ApprovalChange("decided", await self.get(approval_id))
                            continue
                        kind = _CHANGE_KINDS.get(change.kind)
                        if kind is None or not change.HasField("approval"):
                            continue
                        approval = Approval.from_proto(change.approval)
                        if kind == "opened":
                            if current is not None:
                                current.add(approval.id)
                            if approval.id in yielded:
                                continue
                            yielded.add(approval.id)
                            yield ApprovalChange(kind, approval) if include_decided else approval
                        elif approval.id in yielded:
                            if kind == "decided":
                                yielded.discard(approval.id)
                            if include_decided:
                                yield ApprovalChange(kind, approval)
                raise UnavailableError(
                    "watch approvals",
                    code=grpc.StatusCode.UNAVAILABLE.value[0],
                    grpc_code="UNAVAILABLE",
                    details="the runtime ended the watch",
                    rpc_message="watch approvals: the runtime ended the watch (UNAVAILABLE)",
                )
            except (UnavailableError, ResourceExhaustedError) as error:
                # ResourceExhausted: this watcher fell behind (or too many watch); both retry.
                if not reconnect:
                    raise
                logger.info("approval watch interrupted (%s); reconnecting in %.1fs", error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, WATCH_MAX_BACKOFF)

    async def get(self, approval_id: str) -> Approval:
        rc = await self._client._runtime()
        return Approval.from_proto(await rc.get_approval(approval_id=approval_id))

    async def approve(
        self,
        approval_id: str,
        *,
        actor: str | None = None,
        comment: str = "",
        args: Mapping[str, Any] | None = None,
        comprehension_acknowledged: bool = False,
    ) -> Decision:
        """An approve vote recorded as `actor` (else the client's actor). `args` replaces the
        proposed arguments, if the policy allows edits."""
        return await self._decide(
            approval_id,
            runtime_pb2.APPROVAL_DECISION_APPROVE,
            actor=actor,
            comment=comment,
            args=dict(args) if args is not None else None,
            comprehension_acknowledged=comprehension_acknowledged,
        )

    async def reject(self, approval_id: str, *, actor: str | None = None, comment: str = "") -> Decision:
        """A reject vote (one is a veto) recorded as `actor`."""
        return await self._decide(approval_id, runtime_pb2.APPROVAL_DECISION_REJECT, actor=actor, comment=comment)

    async def resolve(
        self,
        approval_id: str,
        resolution: str,
        *,
        actor: str | None = None,
        comment: str = "",
        result: Any = None,
    ) -> Decision:
        """Resolves an outcome review (`kind == "outcome_review"`): `"happened"` (with the
        call's `result` as you know it), `"resend"` or `"fail"`."""
        if resolution not in ("happened", "resend", "fail"):
            raise ValueError(f"resolution must be 'happened', 'resend' or 'fail', not {resolution!r}")
        return await self._decide(
            approval_id,
            runtime_pb2.APPROVAL_DECISION_UNSPECIFIED,
            actor=actor,
            comment=comment,
            resolution=resolution,
            result=result,
        )

    async def _decide(self, approval_id: str, decision: Any, *, actor: str | None, comment: str, **extra: Any) -> Decision:
        if not approval_id:
            raise ValueError("approval_id is required")
        rc = await self._client._runtime()
        reply = await rc.decide_approval(
            approval_id=approval_id,
            decision=decision,
            comment=comment,
            actor=actor or self._client.actor or "",
            **extra,
        )
        return Decision(reply.status, reply.approvals_received, reply.session_status)


class Sessions:
    """`client.sessions`."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(
        self,
        *,
        agent: AgentRefLike | None = None,
        status: str | None = None,
        metadata: Mapping[str, str] | None = None,
        include_children: bool = False,
    ) -> list[SessionSummary]:
        """Every matching session (all pages), newest first as the runtime orders them."""
        rc = await self._client._runtime()
        found: list[SessionSummary] = []
        token = ""
        while True:
            request = runtime_pb2.ListSessionsRequest(
                status=status or "",
                include_children=include_children,
                metadata=dict(metadata or {}),
                page_size=PAGE_SIZE,
                page_token=token,
            )
            if agent is not None:
                d = agent_ref_to_dict(agent)
                request.agent_ref.CopyFrom(runtime_pb2.AgentRef(**d))
            page = await rc.list_sessions(request)
            found.extend(SessionSummary.from_proto(s) for s in page.sessions)
            token = page.next_page_token
            if not token:
                return found

    async def inspect(self, session_id: str) -> SessionDetails:
        """The session's record (the first timeline entry only; `raw` has the response)."""
        rc = await self._client._runtime()
        reply = await rc.inspect_session(runtime_pb2.InspectSessionRequest(session_id=session_id, page_size=1))
        s = reply.session
        output: str | None = s.output.message if s.HasField("output") else None
        output_json: Any = None
        if s.HasField("output") and s.output.json:
            output_json = parse_json_bytes(s.output.json.encode("utf-8"))
        for truncated in s.truncated:
            if truncated.field == "output.message":
                full = _json_or_text(await rc.get_session_payload(truncated.ref))
                output = full if isinstance(full, str) else output
            elif truncated.field == "output.json":
                output_json = parse_json_bytes(await rc.get_session_payload(truncated.ref))
        return SessionDetails(
            id=s.id,
            status=s.status,
            agent_version_id=s.agent_version_id,
            output=output,
            error=s.error,
            metadata=dict(s.metadata),
            created_at=s.created_at,
            updated_at=s.updated_at,
            started_by=s.started_by,
            raw=reply,
            output_json=output_json,
        )

    async def cancel(self, session_id: str) -> None:
        rc = await self._client._runtime()
        await rc.cancel_session(session_id=session_id)


class Client:
    """The runtime, for backend code. See the module documentation."""

    def __init__(
        self,
        runtime_addr: str | None = None,
        *,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        actor: str | None = None,
        channel_options: Sequence[ChannelOption] | None = None,
    ) -> None:
        """`runtime_addr`: `host:port` or `https://host:port` (default: `PHRONY_RUNTIME_ADDR`,
        else `127.0.0.1:7777`). Credentials: `credentials` as they are, else built from
        `token` / `tls_*` or `PHRONY_TOKEN` / `PHRONY_TLS_CA` / `PHRONY_TLS_CERT` /
        `PHRONY_TLS_KEY` (see `phrony.credentials`). `actor` (default `PHRONY_ACTOR`): the
        name recorded for this client's requests (`phrony-actor`)."""
        self.runtime_addr = resolve_runtime_addr(runtime_addr)
        self._credentials = credentials or channel_credentials(
            self.runtime_addr, token=token, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key
        )
        self.actor = actor or os.environ.get("PHRONY_ACTOR", "").strip() or None
        if self.actor is not None and not all(33 <= ord(c) < 127 or c == " " for c in self.actor):
            raise PhronyError(f"actor {self.actor!r} must be visible ASCII (it travels in a gRPC header)")
        self._channel_options = list(channel_options or [])
        self._clients: dict[asyncio.AbstractEventLoop, RuntimeClient] = {}
        self.approvals = Approvals(self)
        self.sessions = Sessions(self)

    async def _runtime(self) -> RuntimeClient:
        loop = asyncio.get_running_loop()
        for other in [l for l in self._clients if l.is_closed()]:
            del self._clients[other]
        client = self._clients.get(loop)
        if client is None:
            client = await RuntimeClient.connect(
                address=self.runtime_addr,
                credentials=self._credentials,
                channel_options=self._channel_options,
                metadata=[(ACTOR_HEADER, self.actor)] if self.actor else None,
            )
            self._clients[loop] = client
        return client

    async def runtime_client(self) -> RuntimeClient:
        """The low-level client (one method per RPC) for this event loop."""
        return await self._runtime()

    async def close(self) -> None:
        """Closes this event loop's channel."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        agent: str,
        *,
        input: Any = None,
        metadata: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        conversation: bool = False,
    ) -> Session:
        """Starts a session of the active deployment of `agent` (`namespace/name`, or
        `namespace/name@version` to insist on that version being the active one).

        `input`: any JSON value (a string is the user's message). The secrets the version
        declares are read from the environment (`secrets.<name>.fromEnv`) unless given in
        `secrets`; the run is pinned to the version whose secrets were resolved, so a deploy in
        between makes it fail rather than send them elsewhere. `metadata`: string labels
        stored with the session (e.g. a ticket id)."""
        ref = parse_agent_ref(agent)
        rc = await self._runtime()
        version = ref["version"]
        agent_pb = runtime_pb2.AgentRef(namespace=ref["namespace"], name=ref["name"])
        if not version:
            version = (await rc.get_active_version(runtime_pb2.GetActiveVersionRequest(agent_ref=agent_pb))).version
        pinned = runtime_pb2.AgentRef(namespace=ref["namespace"], name=ref["name"], version=version)
        stored = await rc.get_agent_version(runtime_pb2.GetAgentVersionRequest(agent_ref=pinned))
        resolved = resolve(declared_secrets(stored.manifest), secrets)
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"metadata must map str to str; {key!r}: {type(value).__name__}")
        started = await rc.run_session(
            agent_ref=pinned,
            input=input,
            resolved_secrets=resolved,
            metadata=metadata,
            mode=runtime_pb2.SESSION_MODE_CONVERSATION if conversation else runtime_pb2.SESSION_MODE_TASK,
        )
        return Session(
            self,
            started.session_id,
            started.agent_version_id,
            started.status,
            f"{ref['namespace']}/{ref['name']}@{version}",
        )

    def session(self, session_id: str) -> Session:
        """A handle on an existing session (to `wait()` for it or cancel it)."""
        return Session(self, session_id, "", "", "")
