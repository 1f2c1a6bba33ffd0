"""The seed's "Integrating with your backend" code, verbatim (`seed/app/refunds.py`,
`seed/app/approvals.py`), against the real daemon, the fake OpenAI server and the tutorial's
`worker.py` on this SDK.

`handle_refund_request` starts a €400 refund; the session pauses for approval; the approval is
listed by `pending_refund_approvals()` exactly as the seed's comments show it and decided with
`decide(…)`; `handle_refund_request` then returns the agent's answer.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import ChatRequest, Text, ToolCalls, after_tool, all_of, user_says

SEED_APP = Path(__file__).resolve().parent / "seed"
SEED_TEXT = Path(__file__).resolve().parents[4] / "shared" / "seeds" / "000_4ac377f2dba32096.txt"
REVIEWER = "reviewer-1"
ARGS = {"order_id": "ORD-1", "amount": 400, "currency": "EUR", "reason": "item arrived damaged"}


@pytest.fixture(scope="module")
def app(seed_world) -> Iterator[Any]:
    """The seed's `app` package, imported the way a backend does, with the environment it
    reads: PHRONY_RUNTIME_ADDR (refunds.py) and the agent's declared secret OPENAI_API_KEY."""
    env = {"PHRONY_RUNTIME_ADDR": seed_world.daemon.address, "OPENAI_API_KEY": seed_world.cli.env["OPENAI_API_KEY"]}
    saved = {k: os.environ.get(k) for k in [*env, "PHRONY_ACTOR", "PHRONY_TOKEN", "PHRONY_TLS_CA"]}
    os.environ.update(env)
    for name in ("PHRONY_ACTOR", "PHRONY_TOKEN", "PHRONY_TLS_CA"):
        os.environ.pop(name, None)
    sys.path.insert(0, str(SEED_APP))
    try:
        refunds = importlib.import_module("app.refunds")
        approvals = importlib.import_module("app.approvals")
        yield type("App", (), {"refunds": refunds, "approvals": approvals})
    finally:
        sys.path.remove(str(SEED_APP))
        for name in [n for n in sys.modules if n == "app" or n.startswith("app.")]:
            del sys.modules[name]
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def script_refund(world, message: str) -> None:
    """Lookup ORD-1, refund €400, then relay the refund's outcome in words."""
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


async def decide_when_pending(app, approve: bool, comment: str) -> dict[str, Any]:
    """Waits (polling the seed's own function) for the one pending approval and decides it."""
    for _ in range(600):
        pending = await app.approvals.pending_refund_approvals()
        if pending:
            (approval,) = pending
            await app.approvals.decide(approval["id"], approve, actor=REVIEWER, comment=comment)
            return approval
        await asyncio.sleep(0.1)
    raise TimeoutError("no approval became pending")


def run_ticket(app, ticket: str, message: str, approve: bool, comment: str) -> tuple[str, dict[str, Any]]:
    async def scenario() -> tuple[str, dict[str, Any]]:
        handling = asyncio.ensure_future(app.refunds.handle_refund_request(ticket, message))
        approval = await decide_when_pending(app, approve, comment)
        return await asyncio.wait_for(handling, 60), approval

    return asyncio.run(scenario())


def test_the_seed_files_are_verbatim_copies():
    if not SEED_TEXT.is_file():
        pytest.skip(f"the seed document is not beside the repository ({SEED_TEXT})")
    seed = SEED_TEXT.read_text(encoding="utf-8")
    for name in ("refunds.py", "approvals.py"):
        code = (SEED_APP / "app" / name).read_text(encoding="utf-8")
        assert code.rstrip("\n") in seed, f"seed/app/{name} differs from the seed"


def test_handle_refund_request_returns_the_output_after_an_approve(seed_world, app):
    message = "Refund €400 for ORD-1 — the item arrived damaged. Ticket T-100."
    script_refund(seed_world, message)

    output, approval = run_ticket(app, "T-100", message, True, "Damage claim verified, within policy.")

    assert output == "Refund rf_2891 issued."
    assert approval == {
        "id": approval["id"],
        "agent": "support/refund-agent@0.1.0",
        "tool": "payments.issue-refund",
        "args": ARGS,
        "policy": "payments/refund-approval-boundary@1.0.0",
        "reason": "Refund amount above delegated limit.",
    }
    # The worker ran the refund once, after the approval; the vote is attributed to the reviewer.
    refunds = [c for c in seed_world.worker.invocations("payments.issue-refund") if c["args"] == ARGS]
    assert len(refunds) == 1, refunds
    shown = seed_world.cli.json("approvals", "show", approval["id"])
    dumped = json.dumps(shown)
    assert REVIEWER in dumped and "Damage claim verified, within policy." in dumped, dumped
    # The session carries the ticket id the backend passed as metadata.
    session_id = refunds[0]["session_id"]
    assert seed_world.inspect(session_id)["session"]["metadata"] == {"ticket_id": "T-100"}


def test_a_reject_returns_the_agents_answer_and_the_refund_never_runs(seed_world, app):
    message = "Refund €400 for ORD-1 — damaged again. Ticket T-200."
    script_refund(seed_world, message)
    before = len(seed_world.worker.invocations("payments.issue-refund"))

    output, _ = run_ticket(app, "T-200", message, False, "No damage claim on file for this order.")

    assert output.startswith("Not refunded:"), output
    assert "No damage claim on file for this order." in output, output
    assert len(seed_world.worker.invocations("payments.issue-refund")) == before
