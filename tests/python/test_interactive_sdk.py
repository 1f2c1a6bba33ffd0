"""`RunSessionInteractive` through the PUBLISHED Python SDK (`phrony` 0.1.0).

`Phrony(...).agent(...).run_interactive(...)` starts a refund session on a stream and follows it:
the tool calls, the approval the €400 refund needs, a decision sent on the stream with its
comment, the result the model receives and the final `completed`. A second stream attaches by
session id to a session started elsewhere and gets the catch-up (the conversation so far, the
turn's tool activity, the pending approval and `awaiting_input` blocked by it) before it decides
the approval. The daemon, the tutorial's worker and the fake model are those of
`test_tutorial.py` (see `tutorial_env.py`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from phrony import Phrony

from fake_openai import ChatRequest, Text, ToolCalls, after_tool, all_of, user_says
from tutorial_env import AGENT, PATIENCE, Tutorial

ARGS = {"order_id": "ORD-1", "amount": 400, "currency": "EUR", "reason": "item arrived damaged"}
COMMENT = "No damage claim on file for this order."


@pytest.fixture(scope="module")
def world(tutorial: Tutorial) -> Iterator[Tutorial]:
    yield tutorial
    assert tutorial.fake.problems == [], tutorial.fake.problems


def script_refund(world: Tutorial, message: str) -> None:
    """Lookup ORD-1, refund €400, then relay the refund's outcome."""
    conversation = user_says(message)
    world.fake.reply(
        ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})),
        when=all_of(conversation, lambda r: not r.tool_results()),
    )
    world.fake.reply(ToolCalls.of(("issue_refund", ARGS)), when=all_of(conversation, after_tool("lookup_order")))

    def answer(request: ChatRequest) -> Text:
        (outcome,) = request.results_of("issue_refund")
        try:
            return Text(f"Refund {json.loads(outcome)['refund_id']} issued.")
        except (ValueError, KeyError, TypeError):
            return Text(f"Not refunded: {outcome}")

    world.fake.reply(answer, when=all_of(conversation, after_tool("issue_refund")))


async def until(events: AsyncIterator[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events up to and including the first of type `kind`."""
    seen: list[dict[str, Any]] = []

    async def read() -> list[dict[str, Any]]:
        async for event in events:
            seen.append(event)
            if event["type"] == kind:
                return seen
        raise AssertionError(f"the stream ended before {kind}: {seen}")

    return await asyncio.wait_for(read(), PATIENCE)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events if e["type"] != "text_delta"]


def text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "text_delta")


def test_a_session_run_interactively_is_decided_on_its_stream(world):
    message = "Refund €400 for ORD-1, decided on the stream."
    script_refund(world, message)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        phrony = await Phrony.connect(runtime_addr=world.daemon.address)
        try:
            session = await phrony.agent(AGENT).run_interactive(
                input=message, resolved_secrets={"openai": world.fake.api_key}
            )
            events = session.events()
            before = await until(events, "approval_required")
            approval = before[-1]
            await session.decide_tool_approval(
                approval_id=approval["approval_id"], approved=False, comment=COMMENT
            )
            after = await until(events, "completed")
            assert (await until(events, "stream_end"))[-1] == {"type": "stream_end"}
            await session.close()
            return before, after
        finally:
            await phrony.close()

    before, after = asyncio.run(scenario())

    started = before[0]
    assert started["type"] == "session_started"
    assert started["session_id"].startswith("run_")
    assert (started["model_provider"], started["model_name"]) == ("openai", "gpt-4o")
    assert types(before) == ["session_started", "tool_call", "tool_result", "tool_call", "approval_required"]
    lookup = before[1]
    assert (lookup["tool"], lookup["version"], lookup["args"]) == ("orders.lookup-order", "1.0.0", {"order_id": "ORD-1"})
    approval = before[-1]
    assert approval["tool"] == "payments.issue-refund"
    assert approval["args"] == ARGS
    assert approval["reason"] == "Refund amount above delegated limit."
    assert approval["policy_name"] == "refund-approval-boundary"
    assert approval["approvals_required"] == 1

    assert types(after) == ["tool_result", "completed"]
    rejected = after[0]
    assert rejected["call_id"] == approval["call_id"]
    assert rejected["payload"] is None
    assert COMMENT in rejected["error_message"]
    done = after[-1]
    assert done["output"]["message"] == text(after)
    assert done["output"]["message"].startswith("Not refunded: ") and COMMENT in done["output"]["message"]
    assert done["stop_reason"] == "end_turn"
    # The worker never ran the rejected refund.
    assert not [
        i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == started["session_id"]
    ]


def test_attaching_to_a_session_started_elsewhere_catches_up_then_decides(world):
    message = "Refund €400 for ORD-1, decided by an attached operator."
    script_refund(world, message)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        phrony = await Phrony.connect(runtime_addr=world.daemon.address)
        try:
            started = await phrony.agent(AGENT).run(
                input=message, resolved_secrets={"openai": world.fake.api_key}, wait=False
            )
            client = await phrony.runtime_client()
            deadline = asyncio.get_running_loop().time() + PATIENCE
            while not [
                a
                for a in (await client.list_approvals(status="pending")).approvals
                if a.session_id == started.session_id
            ]:
                assert asyncio.get_running_loop().time() < deadline, "no pending approval"
                await asyncio.sleep(0.05)
            session = client.run_session_interactive()
            await session.attach(session_id=started.session_id)
            events = session.events()
            catch_up = await until(events, "awaiting_input")
            await session.decide_tool_approval(approval_id=catch_up[-2]["approval_id"], approved=True)
            after = await until(events, "completed")
            await session.close()
            return catch_up, after
        finally:
            await phrony.close()

    catch_up, after = asyncio.run(scenario())

    started = catch_up[0]
    assert started["type"] == "session_started"
    assert [(h["role"], h["content"]) for h in started["history"]] == [("user", message)]
    assert types(catch_up) == [
        "session_started",
        "tool_call",
        "tool_result",
        "tool_call",
        "approval_required",
        "awaiting_input",
    ]
    assert catch_up[-1]["input_blocked_reason"] == "awaiting_approval"
    assert types(after) == ["tool_result", "completed"]
    assert after[0]["payload"]["refund_id"] == "rf_2891"
    assert after[-1]["output"]["message"] == "Refund rf_2891 issued."
    assert text(after) == "Refund rf_2891 issued."
