"""The tutorial's "Integrating with your backend" flow through the PUBLISHED Python SDK.

`phrony` 0.1.0 is the contract: a backend starts a refund session with
`Phrony(...).agent("support/refund-agent").run(...)`, which waits through the approval while the
"approval surface" polls `RuntimeClient.list_approvals(status="pending")` and decides with
`decide_approval(..., actor=..., comment=...)`; `run(wait=False)` returns a session id at once;
`list_sessions`, `inspect_session` and `cancel_session` operate it. The daemon, the tutorial's
worker and the fake model are the ones of `test_tutorial.py` (see `tutorial_env.py`).

The SDK's generated `Approval` predates the phrony-rs fields `agent_ref` and `policy_ref`
(protobuf keeps them as unknown fields it does not expose), so those are read through the CLI's
`approvals list --output json`, the same API underneath.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from google.protobuf.json_format import MessageToDict

from phrony import ApprovalDecision, Phrony
from phrony.client.runtime_client import RuntimeClient
from phrony.gen.phrony.runtime.v1 import runtime_pb2

from fake_openai import ChatRequest, Text, ToolCalls, after_tool, all_of, user_says
from tutorial_env import AGENT, AGENT_VERSION, PATIENCE, Tutorial, approvals_of

T = TypeVar("T")

APPROVAL_POLICY = "payments/refund-approval-boundary@1.0.0"
APPROVAL_REASON = "Refund amount above delegated limit."
DENY_REASON = "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
REFUND_ID = "rf_2891"
ARGS = {"order_id": "ORD-1", "amount": 400, "currency": "EUR", "reason": "item arrived damaged"}


def fresh(request: ChatRequest) -> bool:
    return not request.tool_results()


def script_refund(world: Tutorial, message: str) -> None:
    """Lookup ORD-1, refund €400, then confirm with the refund id the tool returned (or relay
    whatever outcome it got)."""
    conversation = user_says(message)
    world.fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})), when=all_of(conversation, fresh))
    world.fake.reply(ToolCalls.of(("issue_refund", ARGS)), when=all_of(conversation, after_tool("lookup_order")))

    def answer(request: ChatRequest) -> Text:
        (outcome,) = request.results_of("issue_refund")
        try:
            return Text(f"Refund {json.loads(outcome)['refund_id']} issued.")
        except (ValueError, KeyError, TypeError):
            return Text(f"Not refunded: {outcome}")

    world.fake.reply(answer, when=all_of(conversation, after_tool("issue_refund")))


async def poll(probe: Callable[[], Awaitable[T]], what: str, watch: asyncio.Task | None = None) -> T:
    """Awaits `probe` until it returns something truthy; fails at once if `watch` ends first."""
    deadline = asyncio.get_running_loop().time() + PATIENCE
    while True:
        value = await probe()
        if value:
            return value
        if watch is not None and watch.done():
            raise AssertionError(f"the task ended before {what}: {watch.result()!r}")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def pending_for(client: RuntimeClient, session_id: str | None = None) -> list[runtime_pb2.Approval]:
    reply = await client.list_approvals(status="pending")
    return [a for a in reply.approvals if session_id is None or a.session_id == session_id]


@pytest.fixture(scope="module")
def world(tutorial: Tutorial) -> Iterator[Tutorial]:
    yield tutorial
    assert tutorial.fake.problems == [], tutorial.fake.problems


def secrets_for(world: Tutorial) -> dict[str, str]:
    return {"openai": world.fake.api_key}


def test_run_waits_through_an_approval_decided_from_code(world):
    message = "Refund €400 for ORD-1 — the item arrived damaged."
    script_refund(world, message)

    async def scenario() -> tuple[Any, runtime_pb2.Approval, runtime_pb2.DecideApprovalResponse, list[Any], Any]:
        phrony = await Phrony.connect(runtime_addr=world.daemon.address)
        try:
            client = await phrony.runtime_client()
            run = asyncio.create_task(
                phrony.agent(AGENT).run(input=message, resolved_secrets=secrets_for(world))
            )
            (approval,) = await poll(lambda: pending_for(client), "a pending approval", watch=run)
            assert not run.done(), "run() returned while its session awaits approval"
            # The approval surface's view, through the CLI for the fields the SDK predates.
            cli_view = approvals_of(world.cli.json("approvals", "list"))
            decided = await client.decide_approval(
                approval_id=approval.id,
                decision=ApprovalDecision.APPROVAL_DECISION_APPROVE,
                actor="emad",
                comment="Damage claim verified, within policy.",
            )
            result = await asyncio.wait_for(run, PATIENCE)
            audited = await client.get_approval(approval_id=approval.id)
            return result, approval, decided, cli_view, audited
        finally:
            await phrony.close()

    result, approval, decided, cli_view, audited = asyncio.run(scenario())

    assert approval.tool == "payments.issue-refund" and approval.version == "1.0.0"
    assert json.loads(approval.args) == ARGS
    assert approval.reason == APPROVAL_REASON
    assert approval.policy_name == "refund-approval-boundary"
    assert approval.approvals_required == 1 and approval.status == "pending"
    (listed,) = [a for a in cli_view if a["id"] == approval.id]
    assert listed["agent"] == f"{AGENT}@{AGENT_VERSION}"
    assert listed["policy"] == APPROVAL_POLICY

    assert decided.status == "approved" and decided.approvals_received == 1
    assert audited.status == "approved" and audited.decided_by == "emad"
    assert [(v.decided_by, v.decision, v.comment) for v in audited.votes] == [
        ("emad", "approved", "Damage claim verified, within policy.")
    ]

    assert result.session_id == approval.session_id
    assert result.output["message"] == f"Refund {REFUND_ID} issued."
    assert result.stop_reason == "end_turn"
    (invoked,) = [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == result.session_id]
    assert invoked["args"] == ARGS


def test_run_without_waiting_then_list_inspect_and_cancel(world):
    message = "Refund €400 for ORD-1 — please hurry, the parcel was crushed."
    script_refund(world, message)

    async def scenario():
        phrony = Phrony(runtime_addr=world.daemon.address)
        try:
            started = await phrony.agent(AGENT).run(input=message, resolved_secrets=secrets_for(world), wait=False)
            client = await phrony.runtime_client()
            await poll(lambda: pending_for(client, started.session_id), "the session's approval")
            listed = await client.list_sessions(
                runtime_pb2.ListSessionsRequest(agent_ref=runtime_pb2.AgentRef(namespace="support", name="refund-agent"))
            )
            waiting = await client.list_sessions(runtime_pb2.ListSessionsRequest(status="awaiting_approval"))
            inspected = await client.inspect_session(session_id=started.session_id)
            await client.cancel_session(session_id=started.session_id)
            after = await client.inspect_session(session_id=started.session_id)
            still_pending = await pending_for(client, started.session_id)
            try:
                await client.cancel_session(session_id=started.session_id)
            except Exception as error:  # PhronyRuntimeError
                again = str(error)
            else:
                again = ""
            return started, listed, waiting, inspected, after, still_pending, again
        finally:
            await phrony.close()

    started, listed, waiting, inspected, after, still_pending, again = asyncio.run(scenario())

    assert started.session_id.startswith("run_")
    assert started.agent_version_id and started.status in {"pending", "running"}
    by_id = {s.id: s for s in listed.sessions}
    assert started.session_id in by_id
    assert by_id[started.session_id].agent_version_id == started.agent_version_id
    assert started.session_id in {s.id for s in waiting.sessions}
    assert {s.status for s in waiting.sessions} == {"awaiting_approval"}

    assert inspected.session.id == started.session_id
    assert inspected.session.status == "awaiting_approval"
    kinds = [e.kind for e in inspected.timeline]
    assert "approval_created" in kinds and "invocation_dispatched" in kinds, kinds
    assert MessageToDict(inspected.session.input) == {"message": message}

    assert after.session.status == "cancelled"
    # Cancelling a session closes its approval: nobody can release a call of a dead session.
    assert still_pending == []
    # A second cancel says why it cannot be done (the reference answered NotFound for both an
    # unknown and an ended session).
    assert f"session {started.session_id} is already cancelled and cannot be cancelled (FAILED_PRECONDITION)" in again
    assert [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == started.session_id] == []


def test_run_of_a_refund_over_the_ceiling_returns_the_denial(world):
    message = "Refund the full €14,000 for ORD-2 right now."
    refund = {"order_id": "ORD-2", "amount": 14000, "currency": "EUR"}
    conversation = user_says(message)
    world.fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-2"})), when=all_of(conversation, fresh))
    world.fake.reply(ToolCalls.of(("issue_refund", refund)), when=all_of(conversation, after_tool("lookup_order")))
    world.fake.reply(
        lambda r: Text("Not refunded: " + r.results_of("issue_refund")[0]),
        when=all_of(conversation, after_tool("issue_refund")),
    )

    async def scenario():
        phrony = await Phrony.connect(runtime_addr=world.daemon.address)
        try:
            result = await asyncio.wait_for(
                phrony.agent(f"{AGENT}@{AGENT_VERSION}").run(input=message, resolved_secrets=secrets_for(world)),
                PATIENCE,
            )
            client = await phrony.runtime_client()
            approvals = await client.list_approvals(session_id=result.session_id)
            return result, approvals
        finally:
            await phrony.close()

    result, approvals = asyncio.run(scenario())
    assert result.output["message"] == f"Not refunded: {DENY_REASON}"
    # Deny wins: no approval was ever opened, and the handler never ran.
    assert list(approvals.approvals) == []
    assert [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == result.session_id] == []


def test_a_session_with_megabytes_of_input_is_inspectable(world):
    """Issue 14 at the boundary, through the published SDK: a 3.5 MB input (under the runtime's
    4 MiB message limit, so accepted; it appears three times in the session, over 10 MB). The
    SDK, with grpcio's default 4 MiB receive limit, gets a response (not RESOURCE_EXHAUSTED)
    with the input shortened; the CLI says how to print it whole, and prints it whole. (A 3 MB
    tool result is covered by `a_session_with_megabytes_of_input_and_result_is_inspectable` in
    crates/phrony-grpc/tests/grpc/sessions.rs: the fake model streams tool arguments piecewise, too
    slowly for megabytes, and the tutorial's worker only echoes its arguments.)"""
    opening = "Look up ORD-1 for me, please."
    message = f"{opening} {'y' * 3_500_000}"
    conversation = user_says(opening)
    world.fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})), when=all_of(conversation, fresh))
    world.fake.reply(Text("ORD-1 is delivered."), when=all_of(conversation, after_tool("lookup_order")))

    async def scenario():
        phrony = Phrony(runtime_addr=world.daemon.address)
        try:
            result = await asyncio.wait_for(
                phrony.agent(AGENT).run(input=message, resolved_secrets=secrets_for(world)), PATIENCE
            )
            client = await phrony.runtime_client()
            return result, await client.inspect_session(session_id=result.session_id)
        finally:
            await phrony.close()

    result, inspected = asyncio.run(scenario())
    assert result.output["message"] == "ORD-1 is delivered."
    assert inspected.session.id == result.session_id
    assert inspected.session.status == "completed"
    assert inspected.ByteSize() <= 3 * 1024 * 1024
    kinds = [e.kind for e in inspected.timeline]
    assert "invocation_completed" in kinds and "session.completed" in kinds, kinds
    # The input object keeps its shape; its long message says how long it was.
    shown_input = MessageToDict(inspected.session.input)
    whole_message = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    assert list(shown_input) == ["message"]
    assert shown_input["message"].startswith(opening)
    assert shown_input["message"].endswith(f"… [truncated: {len(whole_message.encode())} bytes of JSON]")

    # The CLI: the text view names the command that prints a shortened payload whole.
    text = world.cli("sessions", "inspect", result.session_id).stdout
    assert text.startswith(f"=== Session {result.session_id} ===\n"), text[:300]
    (input_line,) = [line for line in text.splitlines() if line.startswith("input:")]
    command = re.search(r"\(3\.5 MB, truncated; (phrony sessions payload .*) to print it whole\)$", input_line)
    assert command, input_line
    assert command.group(1) == f"phrony sessions payload {result.session_id} --field input"
    printed = world.cli(*shlex.split(command.group(1))[1:]).stdout
    assert json.loads(printed) == {"message": message}
