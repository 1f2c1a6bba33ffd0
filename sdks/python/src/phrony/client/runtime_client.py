"""`RuntimeClient`: one async method per RPC of `phrony.runtime.v1.Runtime`.

Each method takes the generated request message (and, for the common calls, keyword arguments
instead); every failed RPC raises the typed `PhronyRuntimeError` subclass for its status code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import grpc
from grpc import aio

from phrony.client.dial import ChannelOption, dial_runtime
from phrony.client.errors import wrap_rpc_error
from phrony.client.json_bytes import json_bytes, resolved_secrets_map
from phrony.gen.grpc.health.v1 import health_pb2_grpc
from phrony.gen.phrony.runtime.v1 import runtime_pb2, runtime_pb2_grpc
from phrony.types import AgentRefLike, BundleRefLike, coerce_agent_ref, coerce_bundle_ref

if TYPE_CHECKING:
    from phrony.session.interactive_session import InteractiveSession

Metadata = Sequence[tuple[str, str]]


class RuntimeClient:
    """A connected client; build it with `await RuntimeClient.connect(...)`."""

    def __init__(
        self,
        channel: aio.Channel,
        stub: runtime_pb2_grpc.RuntimeStub,
        health_stub: health_pb2_grpc.HealthStub,
        address: str,
        *,
        metadata: Metadata | None = None,
    ) -> None:
        self._channel = channel
        self._stub = stub
        self._health = health_stub
        self.address = address
        # Sent with every RPC (e.g. the `phrony-actor` header).
        self._metadata: tuple[tuple[str, str], ...] = tuple(metadata or ())

    @classmethod
    async def connect(
        cls,
        *,
        address: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[ChannelOption] | None = None,
        metadata: Metadata | None = None,
    ) -> RuntimeClient:
        """Opens a channel (lazily connected: the first RPC reports an unreachable runtime)."""
        dialed = dial_runtime(address=address, credentials=credentials, channel_options=channel_options)
        return cls(dialed.channel, dialed.runtime, dialed.health, dialed.address, metadata=metadata)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, action: str, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata or None)
        except aio.AioRpcError as error:
            raise wrap_rpc_error(action, error) from error

    # --- version, lifecycle -------------------------------------------------------------

    async def get_version(self, request: runtime_pb2.GetVersionRequest | None = None) -> runtime_pb2.GetVersionResponse:
        return await self._unary("get version", self._stub.GetVersion, request or runtime_pb2.GetVersionRequest())

    async def publish(self, request: runtime_pb2.PublishRequest) -> runtime_pb2.PublishResponse:
        return await self._unary("publish agent", self._stub.Publish, request)

    async def publish_bundle(self, request: runtime_pb2.PublishBundleRequest) -> runtime_pb2.PublishBundleResponse:
        return await self._unary("publish bundle", self._stub.PublishBundle, request)

    async def deploy(self, request: runtime_pb2.DeployRequest) -> runtime_pb2.DeployResponse:
        return await self._unary("deploy agent", self._stub.Deploy, request)

    async def deploy_bundle(self, request: runtime_pb2.DeployBundleRequest) -> runtime_pb2.DeployBundleResponse:
        return await self._unary("deploy bundle", self._stub.DeployBundle, request)

    async def rollback(self, request: runtime_pb2.RollbackRequest) -> runtime_pb2.RollbackResponse:
        return await self._unary("rollback deployment", self._stub.Rollback, request)

    async def get_active_version(
        self, request: runtime_pb2.GetActiveVersionRequest
    ) -> runtime_pb2.GetActiveVersionResponse:
        return await self._unary("get active version", self._stub.GetActiveVersion, request)

    async def get_active_bundle(self, request: runtime_pb2.GetActiveBundleRequest) -> runtime_pb2.GetActiveBundleResponse:
        return await self._unary("get active bundle", self._stub.GetActiveBundle, request)

    async def get_bundle_secret_requirements(
        self, request: runtime_pb2.GetBundleSecretRequirementsRequest
    ) -> runtime_pb2.GetBundleSecretRequirementsResponse:
        return await self._unary(
            "get bundle secret requirements", self._stub.GetBundleSecretRequirements, request
        )

    async def list_deployments(self, request: runtime_pb2.ListDeploymentsRequest) -> runtime_pb2.ListDeploymentsResponse:
        return await self._unary("list deployments", self._stub.ListDeployments, request)

    async def get_agent_version(self, request: runtime_pb2.GetAgentVersionRequest) -> runtime_pb2.GetAgentVersionResponse:
        return await self._unary("get agent version", self._stub.GetAgentVersion, request)

    async def retire_agent_version(
        self, request: runtime_pb2.RetireAgentVersionRequest
    ) -> runtime_pb2.RetireAgentVersionResponse:
        return await self._unary("retire agent version", self._stub.RetireAgentVersion, request)

    async def deprecate_agent_version(
        self, request: runtime_pb2.DeprecateAgentVersionRequest
    ) -> runtime_pb2.DeprecateAgentVersionResponse:
        return await self._unary("deprecate agent version", self._stub.DeprecateAgentVersion, request)

    async def archive_agent(self, request: runtime_pb2.ArchiveAgentRequest) -> runtime_pb2.ArchiveAgentResponse:
        return await self._unary("archive agent", self._stub.ArchiveAgent, request)

    async def list_agents(self, request: runtime_pb2.ListAgentsRequest | None = None) -> runtime_pb2.ListAgentsResponse:
        return await self._unary("list agents", self._stub.ListAgents, request or runtime_pb2.ListAgentsRequest())

    async def list_bundles(self, request: runtime_pb2.ListBundlesRequest | None = None) -> runtime_pb2.ListBundlesResponse:
        return await self._unary("list bundles", self._stub.ListBundles, request or runtime_pb2.ListBundlesRequest())

    async def list_agent_versions(
        self, request: runtime_pb2.ListAgentVersionsRequest
    ) -> runtime_pb2.ListAgentVersionsResponse:
        return await self._unary("list agent versions", self._stub.ListAgentVersions, request)

    async def list_bundle_versions(
        self, request: runtime_pb2.ListBundleVersionsRequest
    ) -> runtime_pb2.ListBundleVersionsResponse:
        return await self._unary("list bundle versions", self._stub.ListBundleVersions, request)

    async def list_bundle_deployments(
        self, request: runtime_pb2.ListBundleDeploymentsRequest
    ) -> runtime_pb2.ListBundleDeploymentsResponse:
        return await self._unary("list bundle deployments", self._stub.ListBundleDeployments, request)

    # --- sessions -----------------------------------------------------------------------

    async def run_session(
        self,
        request: runtime_pb2.RunSessionRequest | None = None,
        *,
        agent_ref: AgentRefLike | None = None,
        bundle_ref: BundleRefLike | None = None,
        input: Any = None,
        resolved_secrets: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        mode: runtime_pb2.SessionMode | None = None,
    ) -> runtime_pb2.RunSessionResponse:
        """Starts a session (`request`, or built from the keyword arguments: exactly one of
        `agent_ref` / `bundle_ref`; `input` any JSON value)."""
        if request is None:
            if (agent_ref is None) == (bundle_ref is None):
                raise ValueError("run_session needs exactly one of agent_ref and bundle_ref")
            request = runtime_pb2.RunSessionRequest(
                input=json_bytes(input) if input is not None else b"",
                resolved_secrets=resolved_secrets_map(resolved_secrets or {}),
                metadata=dict(metadata or {}),
                mode=mode or runtime_pb2.SESSION_MODE_UNSPECIFIED,
            )
            if agent_ref is not None:
                request.agent_ref.CopyFrom(coerce_agent_ref(agent_ref))
            else:
                assert bundle_ref is not None
                request.bundle_ref.CopyFrom(coerce_bundle_ref(bundle_ref))
        return await self._unary("run session", self._stub.RunSession, request)

    async def cancel_session(
        self, request: runtime_pb2.CancelSessionRequest | None = None, *, session_id: str | None = None
    ) -> runtime_pb2.CancelSessionResponse:
        request = request or runtime_pb2.CancelSessionRequest(session_id=_required("session_id", session_id))
        return await self._unary("cancel session", self._stub.CancelSession, request)

    async def complete_session(
        self, request: runtime_pb2.CompleteSessionRequest | None = None, *, session_id: str | None = None
    ) -> runtime_pb2.CompleteSessionResponse:
        request = request or runtime_pb2.CompleteSessionRequest(session_id=_required("session_id", session_id))
        return await self._unary("complete session", self._stub.CompleteSession, request)

    async def list_sessions(self, request: runtime_pb2.ListSessionsRequest) -> runtime_pb2.ListSessionsResponse:
        return await self._unary("list sessions", self._stub.ListSessions, request)

    async def inspect_session(
        self, request: runtime_pb2.InspectSessionRequest | None = None, *, session_id: str | None = None
    ) -> runtime_pb2.InspectSessionResponse:
        request = request or runtime_pb2.InspectSessionRequest(session_id=_required("session_id", session_id))
        return await self._unary("inspect session", self._stub.InspectSession, request)

    async def get_session_payload(self, ref: runtime_pb2.PayloadRef) -> bytes:
        """The whole payload a `TruncatedPayload` refers to (streamed in chunks)."""
        parts: list[bytes] = []
        try:
            async for chunk in self._stub.GetSessionPayload(
                runtime_pb2.GetSessionPayloadRequest(ref=ref), metadata=self._metadata or None
            ):
                parts.append(chunk.data)
        except aio.AioRpcError as error:
            raise wrap_rpc_error("get session payload", error) from error
        return b"".join(parts)

    # --- approvals ----------------------------------------------------------------------

    async def get_approval(
        self, request: runtime_pb2.GetApprovalRequest | None = None, *, approval_id: str | None = None
    ) -> runtime_pb2.Approval:
        request = request or runtime_pb2.GetApprovalRequest(approval_id=_required("approval_id", approval_id))
        return await self._unary("get approval", self._stub.GetApproval, request)

    async def list_approvals(
        self,
        request: runtime_pb2.ListApprovalsRequest | None = None,
        *,
        status: str | None = None,
        route: str | None = None,
        session_id: str | None = None,
        agent_namespace: str | None = None,
        agent_name: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> runtime_pb2.ListApprovalsResponse:
        request = request or runtime_pb2.ListApprovalsRequest(
            status=status or "",
            route=route or "",
            session_id=session_id or "",
            agent_namespace=agent_namespace or "",
            agent_name=agent_name or "",
            page_size=page_size or 0,
            page_token=page_token or "",
        )
        return await self._unary("list approvals", self._stub.ListApprovals, request)

    async def decide_approval(
        self,
        request: runtime_pb2.DecideApprovalRequest | None = None,
        *,
        approval_id: str | None = None,
        decision: runtime_pb2.ApprovalDecision | str | None = None,
        comment: str | None = None,
        args: Any = None,
        comprehension_acknowledged: bool = False,
        actor: str | None = None,
        resolution: str | None = None,
        result: Any = None,
    ) -> runtime_pb2.DecideApprovalResponse:
        """Votes on an approval. `decision`: `ApprovalDecision` or "approve"/"reject"."""
        if request is None:
            request = runtime_pb2.DecideApprovalRequest(
                approval_id=_required("approval_id", approval_id),
                decision=_decision(decision),
                comment=comment or "",
                args=json_bytes(args) if args is not None else b"",
                comprehension_acknowledged=comprehension_acknowledged,
                actor=actor or "",
                resolution=resolution or "",
                result=json_bytes(result) if result is not None else b"",
            )
        return await self._unary("decide approval", self._stub.DecideApproval, request)

    async def watch_approvals(
        self,
        request: runtime_pb2.WatchApprovalsRequest | None = None,
        *,
        status: str | None = None,
        route: str | None = None,
        session_id: str | None = None,
        agent_namespace: str | None = None,
        agent_name: str | None = None,
    ) -> AsyncIterator[runtime_pb2.ApprovalChange]:
        """`WatchApprovals`, streamed: the pending approvals (OPENED), one CURRENT_END, then each
        change as it happens. Ends the call when the iterator is closed."""
        request = request or runtime_pb2.WatchApprovalsRequest(
            status=status or "",
            route=route or "",
            session_id=session_id or "",
            agent_namespace=agent_namespace or "",
            agent_name=agent_name or "",
        )
        call = self._stub.WatchApprovals(request, metadata=self._metadata or None)
        try:
            async for change in call:
                yield change
        except aio.AioRpcError as error:
            raise wrap_rpc_error("watch approvals", error) from error
        finally:
            call.cancel()

    # --- audit --------------------------------------------------------------------------

    async def verify_audit(self, request: runtime_pb2.VerifyAuditRequest | None = None) -> runtime_pb2.VerifyAuditResponse:
        return await self._unary("verify audit", self._stub.VerifyAudit, request or runtime_pb2.VerifyAuditRequest())

    async def export_audit(
        self, request: runtime_pb2.ExportAuditRequest | None = None
    ) -> AsyncIterator[runtime_pb2.AuditEvent]:
        """The audit events, streamed."""
        try:
            async for event in self._stub.ExportAudit(
                request or runtime_pb2.ExportAuditRequest(), metadata=self._metadata or None
            ):
                yield event
        except aio.AioRpcError as error:
            raise wrap_rpc_error("export audit", error) from error

    # --- streams ------------------------------------------------------------------------

    def work(self, *, metadata: Sequence[tuple[str, str]] | None = None) -> aio.StreamStreamCall:
        """The raw `Work` stream (what `Worker` uses)."""
        return self._stub.Work(metadata=tuple(self._metadata) + tuple(metadata or ()) or None)

    def run_session_interactive(self, *, metadata: Sequence[tuple[str, str]] | None = None) -> InteractiveSession:
        """A `RunSessionInteractive` stream; call `start(...)` or `attach(...)` on it."""
        from phrony.session.interactive_session import InteractiveSession

        call = self._stub.RunSessionInteractive(metadata=tuple(self._metadata) + tuple(metadata or ()) or None)
        return InteractiveSession(call)

    def health(self) -> health_pb2_grpc.HealthStub:
        return self._health


def _required(name: str, value: str | None) -> str:
    if not value:
        raise ValueError(f"{name} is required")
    return value


def _decision(decision: runtime_pb2.ApprovalDecision | str | None) -> runtime_pb2.ApprovalDecision:
    if decision is None:
        return runtime_pb2.APPROVAL_DECISION_UNSPECIFIED
    if isinstance(decision, str):
        named = {
            "approve": runtime_pb2.APPROVAL_DECISION_APPROVE,
            "approved": runtime_pb2.APPROVAL_DECISION_APPROVE,
            "reject": runtime_pb2.APPROVAL_DECISION_REJECT,
            "rejected": runtime_pb2.APPROVAL_DECISION_REJECT,
            "deny": runtime_pb2.APPROVAL_DECISION_REJECT,
            "denied": runtime_pb2.APPROVAL_DECISION_REJECT,
        }
        key = decision.strip().lower()
        if key in named:
            return named[key]
        try:
            return cast(runtime_pb2.ApprovalDecision, runtime_pb2.ApprovalDecision.Value(decision))
        except ValueError:
            raise ValueError(f"unknown approval decision {decision!r} (use 'approve' or 'reject')") from None
    return decision
