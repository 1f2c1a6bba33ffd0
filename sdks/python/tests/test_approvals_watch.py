"""`client.approvals.watch()` against the real daemon (the tutorial's world on 127.0.0.1:7777,
the fake OpenAI server and `worker.py` on this SDK): the current set, then each approval as it
opens, decisions with `include_decided=True`, and a daemon restart in the middle of a watch:
the watch reconnects and resumes without yielding an approval twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_seed_backend import ARGS, script_refund

from phrony import Approval, ApprovalChange, Client

PATIENCE = 60.0


async def next_of(changes: Any) -> Any:
    return await asyncio.wait_for(changes.__anext__(), PATIENCE)


def start_refund(world: Any, ticket: str) -> str:
    message = f"Refund €400 for ORD-1 — the item arrived damaged. Ticket {ticket}."
    script_refund(world, message)
    session_id = world.run(message)
    world.wait_for_status(session_id, "awaiting_approval")
    return session_id


def assert_seed_item(approval: Approval, session_id: str) -> None:
    """The fields the seed's `app/approvals.py` reads."""
    assert approval.session_id == session_id
    assert approval.status == "pending"
    assert approval.agent_ref == "support/refund-agent@0.1.0"
    assert approval.tool == "payments.issue-refund"
    assert approval.args == ARGS
    assert approval.policy_ref == "payments/refund-approval-boundary@1.0.0"
    assert approval.reason == "Refund amount above delegated limit."


def test_watch_yields_the_current_set_then_each_opening_and_decision(seed_world):
    first = start_refund(seed_world, "T-W1")

    async def scenario() -> None:
        client = Client(runtime_addr=seed_world.daemon.address, actor="reviewer-w")
        async with client:
            changes = client.approvals.watch(include_decided=True)
            current = await next_of(changes)
            assert isinstance(current, ApprovalChange) and current.kind == "opened"
            assert_seed_item(current.approval, first)

            second = await asyncio.to_thread(start_refund, seed_world, "T-W2")
            opened = await next_of(changes)
            assert opened.kind == "opened"
            assert_seed_item(opened.approval, second)

            await client.approvals.approve(current.approval.id, comment="Verified.")
            decided = await next_of(changes)
            assert decided.kind == "decided"
            assert decided.approval.id == current.approval.id
            assert decided.approval.status == "approved"
            assert decided.approval.decided_by == "reviewer-w"

            await client.approvals.reject(opened.approval.id, comment="No claim.")
            rejected = await next_of(changes)
            assert (rejected.kind, rejected.approval.id, rejected.approval.status) == (
                "decided",
                opened.approval.id,
                "denied",
            )
            await changes.aclose()

    asyncio.run(scenario())


def test_watch_resumes_after_a_daemon_restart_without_duplicates(seed_world):
    before_restart = start_refund(seed_world, "T-W3")

    async def scenario() -> None:
        client = Client(runtime_addr=seed_world.daemon.address, actor="reviewer-w")
        async with client:
            approvals = client.approvals.watch(agent="support/refund-agent")
            first = await next_of(approvals)
            assert isinstance(first, Approval)
            assert_seed_item(first, before_restart)

            # The daemon restarts under the open watch (UNAVAILABLE); the approval stays pending.
            await asyncio.to_thread(seed_world.daemon.stop)
            await asyncio.to_thread(seed_world.daemon.start)
            # worker.py reconnects with backoff: a refund started before it registered again
            # would fail for want of a handler.
            await asyncio.to_thread(seed_world._wait_for_worker)
            after_restart = await asyncio.to_thread(start_refund, seed_world, "T-W4")

            # The reconnected watch re-receives `first` in the current set and skips it.
            second = await next_of(approvals)
            assert_seed_item(second, after_restart)
            await approvals.aclose()

            for approval in (first, second):
                await client.approvals.reject(approval.id, comment="Test over.")

    asyncio.run(scenario())


def test_watch_refuses_a_status_other_than_pending(seed_world):
    from phrony import InvalidArgumentError

    async def scenario() -> None:
        async with Client(runtime_addr=seed_world.daemon.address) as client:
            with pytest.raises(InvalidArgumentError, match="status must be empty or \"pending\""):
                await next_of(client.approvals.watch(status="approved"))

    asyncio.run(scenario())
