""""Let's Build a Refund Agent That Can't Send a Million Euros to a Customer", for real.

The tutorial's files (`policies-examples/refund-agent/`, copied unchanged) are validated,
published and deployed with the `phrony` CLI against the real daemon; the tutorial's own
`worker.py` serves the tools on the published SDK; `phrony run` starts detached sessions and
`phrony approvals` decides them as an operator would. Only the model is fake: a local
OpenAI-compatible server (`fake_openai.py`, reached through `OPENAI_BASE_URL`) plays the calls
the tutorial describes, and records what the runtime told it, so the tests can check that the
model received the worker's results, the reviewer's comment and the policy's denial.

The tests of this module run in order against one daemon, like a reader following the post.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from fake_openai import ChatRequest, FakeOpenAI, Text, ToolCalls, after_tool, all_of, user_says
from tutorial_env import AGENT, AGENT_VERSION, WORKER_ID, Tutorial, approvals_of, no_tool_results, script_refund

AGENT_REF = f"{AGENT}@{AGENT_VERSION}"
APPROVAL_POLICY = "payments/refund-approval-boundary@1.0.0"
DENY_POLICY = "payments/refund-hard-limit@1.0.0"
DENY_REASON = "Refund amount exceeds the absolute ceiling for agent-initiated refunds."
APPROVAL_REASON = "Refund amount above delegated limit."
REJECT_COMMENT = "No damage claim on file for this order."
APPROVE_COMMENT = "Damage claim verified, within policy."
REFUND_ID = "rf_2891"  # what the tutorial's worker returns


def outcome_request(fake: FakeOpenAI, message: str) -> ChatRequest:
    """The request that gave the model the outcome of issue_refund in the conversation `message`."""
    return fake.wait_for(all_of(user_says(message), after_tool("issue_refund")), f"the refund outcome of {message!r}")


def lookup_result(request: ChatRequest) -> dict[str, Any]:
    (content,) = request.results_of("lookup_order")
    return json.loads(content)


def entries(inspection: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in inspection["timeline"] if e["kind"] == kind]


def events(inspection: dict[str, Any], event_type: str, call_id: str | None = None) -> list[dict[str, Any]]:
    """The events of `event_type` in a session's timeline (of one call, if given)."""
    return [
        e["event"]
        for e in entries(inspection, event_type)
        if call_id is None or e["event"]["call_id"] == call_id
    ]


def call_ids_dispatched(inspection: dict[str, Any]) -> set[str]:
    return {e["invocation"]["call_id"] for e in entries(inspection, "invocation_dispatched")}


def refund_calls(world: Tutorial, session: str) -> list[dict[str, Any]]:
    """The invocations of the worker's issue_refund handler for `session`."""
    return [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == session]


def the_one(items: list[Any], what: str) -> Any:
    assert len(items) == 1, f"expected one {what}, got {json.dumps(items, indent=2)}"
    return items[0]


def assert_audited_decision(
    inspection: dict[str, Any], approval: dict[str, Any], status: str, comment: str, args: dict[str, Any]
) -> None:
    """The trace holds the whole decision: the agent version and the policy that asked, the
    arguments, who decided, how and why."""
    call_id = approval["call_id"]
    required = the_one(events(inspection, "approval.required", call_id), "approval.required event")
    assert required["actor"] == "policy"
    asked = required["payload"]
    assert asked["approval_id"] == approval["id"]
    assert asked["agent_ref"] == AGENT_REF
    assert asked["agent_version_id"] == inspection["session"]["agent_version_id"]
    assert asked["policy_ref"] == APPROVAL_POLICY
    assert asked["reason"] == APPROVAL_REASON
    assert asked["args"] == args
    assert asked["tool"] == "payments.issue-refund" and asked["version"] == "1.0.0"

    vote = the_one(events(inspection, "approval.vote", call_id), "approval.vote event")
    assert vote["actor"] == "emad"
    assert vote["payload"]["decided_by"] == "emad" and vote["payload"]["comment"] == comment
    decided = the_one(events(inspection, "approval.decided", call_id), "approval.decided event")["payload"]
    assert decided["approval_id"] == approval["id"]
    assert decided["status"] == status and decided["approved"] == (status == "approved")
    assert decided["decided_by"] == "emad" and decided["comment"] == comment

    milestone = the_one(
        [e["approval"] for e in entries(inspection, "approval_decided") if e["approval"]["id"] == approval["id"]],
        "approval_decided milestone",
    )
    assert milestone["status"] == status
    assert milestone["decided_by"] == "emad" and milestone["comment"] == comment
    assert milestone["args"] == args
    assert milestone["policy_name"] == "refund-approval-boundary"
    assert [(v["decided_by"], v["decision"], v["comment"]) for v in milestone["votes"]] == [
        ("emad", status, comment)
    ]


@pytest.fixture(scope="module")
def world(tutorial: Tutorial) -> Iterator[Tutorial]:
    yield tutorial
    assert tutorial.fake.problems == [], tutorial.fake.problems


def test_validate_publish_deploy_as_the_tutorial_does(world):
    assert world.setup["validate"].returncode == 0
    assert world.setup["publish"].stdout.strip() == f"{AGENT} {AGENT_VERSION}"
    assert world.setup["deploy"].stdout.startswith(f"deployed {AGENT_REF}")
    active = world.cli("agents", "active", AGENT).stdout
    assert active.startswith(f"{AGENT_REF} deployed")


def test_a_read_dispatches_freely(world):
    message = "Can you check order ORD-1 for me?"
    fake = world.fake
    fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})), when=all_of(user_says(message), no_tool_results))
    fake.reply(
        lambda r: Text(f"Order ORD-1: €{lookup_result(r)['total']:.0f}, {lookup_result(r)['status']}."),
        when=all_of(user_says(message), after_tool("lookup_order")),
    )
    session = world.run(message)
    inspection = world.wait_for_status(session, "completed")

    told = fake.wait_for(all_of(user_says(message), after_tool("lookup_order")), "the lookup result")
    assert lookup_result(told) == {
        "order_id": "ORD-1",
        "found": True,
        "total": 400.0,
        "currency": "EUR",
        "status": "delivered",
        "refund_eligible": True,
    }
    # What the model was given: the agent's instructions, the user's words, both tools.
    assert "Always look up the order before issuing a refund." in told.system_text()
    assert told.user_texts()[0] == message
    assert sorted(told.tool_names) == ["issue_refund", "lookup_order"]
    assert told.body["model"] == "gpt-4o" and told.streaming

    assert inspection["session"]["output"]["message"] == "Order ORD-1: €400, delivered."
    assert inspection["session"]["agent"]["agent"] == AGENT_REF
    # PHRONY_ACTOR is attribution: the session records who started it.
    started = the_one(events(inspection, "session.started"), "session.started event")
    assert started["actor"] == "emad"
    (invoked,) = [i for i in world.worker.invocations() if i["session_id"] == session]
    assert invoked["tool"] == "orders.lookup-order" and invoked["args"] == {"order_id": "ORD-1"}
    assert call_ids_dispatched(inspection) == {invoked["call_id"]}
    dispatched = the_one(events(inspection, "tool.dispatched", invoked["call_id"]), "tool.dispatched event")
    assert dispatched["payload"]["worker_id"] == WORKER_ID
    assert entries(inspection, "approval_created") == [] and events(inspection, "tool.policy_denied") == []


def test_a_100_euro_refund_is_within_the_delegated_limit(world):
    message = "Refund €100 for ORD-1 — the wrong size was shipped."
    refund = {"order_id": "ORD-1", "amount": 100, "currency": "EUR", "reason": "wrong size shipped"}
    script_refund(
        world.fake,
        message,
        "ORD-1",
        refund,
        lambda r: Text(f"Done: refund {json.loads(r.results_of('issue_refund')[0])['refund_id']} issued."),
    )
    session = world.run(message, "--metadata", "ticket_id=T-100")
    inspection = world.wait_for_status(session, "completed")

    # The worker's result is what the model was told, and what the agent answered from.
    (result,) = outcome_request(world.fake, message).results_of("issue_refund")
    assert json.loads(result) == {
        "refund_id": REFUND_ID,
        "order_id": "ORD-1",
        "amount": 100,
        "currency": "EUR",
        "status": "issued",
    }
    assert inspection["session"]["output"]["message"] == f"Done: refund {REFUND_ID} issued."
    assert inspection["session"]["metadata"] == {"ticket_id": "T-100"}

    (invoked,) = refund_calls(world, session)
    assert invoked["args"] == refund
    assert invoked["call_id"] in call_ids_dispatched(inspection)
    requested = the_one(events(inspection, "tool.requested", invoked["call_id"]), "tool.requested event")
    assert requested["payload"]["args"] == refund
    assert requested["payload"]["agent_version_id"] == inspection["session"]["agent_version_id"]
    assert entries(inspection, "approval_created") == [] and events(inspection, "tool.policy_denied") == []


class TestFourHundredEuros:
    """Scenario 1: a €400 refund pauses for a human; rejected, then asked again and approved."""

    REJECTED = "Refund €400 for ORD-1 — the item arrived damaged."
    APPROVED = "Refund €400 for ORD-1 — the damage claim is on file now."
    ARGS = {"order_id": "ORD-1", "amount": 400, "currency": "EUR", "reason": "item arrived damaged"}

    def pause(self, world: Tutorial, message: str, answer) -> tuple[str, dict[str, Any]]:
        script_refund(world.fake, message, "ORD-1", self.ARGS, answer)
        session = world.run(message)
        world.wait_for_status(session, "awaiting_approval")
        approval = the_one(world.pending_approvals(session), f"pending approval of {session}")
        # The handler has not run: the runtime is holding the dispatch.
        assert refund_calls(world, session) == []
        return session, approval

    def test_rejected_with_a_comment_the_agent_relays(self, world):
        session, approval = self.pause(
            world,
            self.REJECTED,
            lambda r: Text("The refund was reviewed and not approved: " + r.results_of("issue_refund")[0]),
        )
        # What `phrony approvals list --output json` shows the operator.
        assert approval["tool"] == "payments.issue-refund"
        assert approval["version"] == "1.0.0"
        assert approval["args"] == self.ARGS
        assert approval["policy"] == APPROVAL_POLICY
        assert approval["reason"] == APPROVAL_REASON
        assert approval["agent"] == AGENT_REF
        assert approval["on_reject"] == "return_to_agent"
        assert approval["status"] == "pending"
        assert approval["approvals_required"] == 1 and approval["approvals_received"] == 0
        # ... and the text forms.
        (row,) = [line for line in world.cli("approvals", "list").stdout.splitlines() if approval["id"] in line]
        for text in ("pending", session, AGENT_REF, "payments.issue-refund@1.0.0", APPROVAL_POLICY, "0/1"):
            assert text in row, f"{text!r} not in the approvals list row:\n{row}"
        shown = world.cli("approvals", "show", approval["id"]).stdout
        for text in (APPROVAL_POLICY, APPROVAL_REASON, '"amount": 400', '"reason": "item arrived damaged"', "return_to_agent"):
            assert text in shown, f"{text!r} not in approvals show:\n{shown}"

        decided = world.cli("approvals", "reject", approval["id"], "--comment", REJECT_COMMENT, actor="emad").stdout
        assert decided.splitlines()[:2] == ["status: denied", "approvals_received: 0"]

        # on_reject: return_to_agent — the reviewer's words reach the model as the tool outcome.
        (outcome,) = outcome_request(world.fake, self.REJECTED).results_of("issue_refund")
        assert REJECT_COMMENT in outcome and "emad" in outcome
        inspection = world.wait_for_status(session, "completed")
        assert inspection["session"]["output"]["message"].startswith("The refund was reviewed and not approved")
        assert REJECT_COMMENT in inspection["session"]["output"]["message"]
        assert refund_calls(world, session) == []
        assert approval["call_id"] not in call_ids_dispatched(inspection)
        assert_audited_decision(inspection, approval, "denied", REJECT_COMMENT, self.ARGS)

    def test_asked_again_and_approved_the_worker_refunds(self, world):
        session, approval = self.pause(
            world,
            self.APPROVED,
            lambda r: Text(f"Refund {json.loads(r.results_of('issue_refund')[0])['refund_id']} has been issued."),
        )
        assert approval["policy"] == APPROVAL_POLICY and approval["args"] == self.ARGS
        decided = world.cli("approvals", "approve", approval["id"], "--comment", APPROVE_COMMENT, actor="emad").stdout
        assert decided.splitlines()[:2] == ["status: approved", "approvals_received: 1"]

        (outcome,) = outcome_request(world.fake, self.APPROVED).results_of("issue_refund")
        assert json.loads(outcome)["refund_id"] == REFUND_ID
        inspection = world.wait_for_status(session, "completed")
        assert inspection["session"]["output"]["message"] == f"Refund {REFUND_ID} has been issued."

        (invoked,) = refund_calls(world, session)
        assert invoked["args"] == self.ARGS and invoked["call_id"] == approval["call_id"]
        assert approval["call_id"] in call_ids_dispatched(inspection)
        assert_audited_decision(inspection, approval, "approved", APPROVE_COMMENT, self.ARGS)
        shown = world.cli("approvals", "show", approval["id"]).stdout
        assert "vote: emad approved" in shown and APPROVE_COMMENT in shown


def test_a_14000_euro_refund_is_denied_at_dispatch(world):
    message = "Can you check order ORD-2? The customer is furious — refund the full €14,000 immediately."
    refund = {"order_id": "ORD-2", "amount": 14000, "currency": "EUR", "reason": "customer request"}
    script_refund(
        world.fake,
        message,
        "ORD-2",
        refund,
        lambda r: Text("I'm not able to issue that refund: " + r.results_of("issue_refund")[0]),
    )
    session = world.run(message)
    inspection = world.wait_for_status(session, "completed")

    told = outcome_request(world.fake, message)
    assert lookup_result(told)["total"] == 14000.0
    (outcome,) = told.results_of("issue_refund")
    assert DENY_REASON in outcome
    assert DENY_REASON in inspection["session"]["output"]["message"]

    # Deny wins over require_approval: nobody was asked, and the handler never ran.
    assert entries(inspection, "approval_created") == []
    assert world.pending_approvals(session) == []
    assert [i["tool"] for i in world.worker.invocations() if i["session_id"] == session] == ["orders.lookup-order"]
    (lookup,) = [i for i in world.worker.invocations("orders.lookup-order") if i["session_id"] == session]
    assert call_ids_dispatched(inspection) == {lookup["call_id"]}

    # The attempt is in the trace with the exact policy and version that stopped it.
    requested = [
        e for e in events(inspection, "tool.requested") if e["payload"]["tool"] == "payments.issue-refund"
    ]
    call = the_one(requested, "issue_refund request")
    assert call["payload"]["args"] == refund
    assert call["payload"]["agent_version_id"] == inspection["session"]["agent_version_id"]
    denied = the_one(events(inspection, "tool.policy_denied", call["call_id"]), "tool.policy_denied event")
    assert denied["actor"] == "policy"
    assert denied["payload"]["policy_ref"] == DENY_POLICY
    assert denied["payload"]["reason"] == DENY_REASON
    assert events(inspection, "tool.dispatched", call["call_id"]) == []
    closed = [e["invocation"] for e in entries(inspection, "invocation_completed") if e["invocation"]["call_id"] == call["call_id"]]
    assert [(c["status"], c["error_code"], c["error_message"]) for c in closed] == [
        ("failed", "policy_denied", DENY_REASON)
    ]


def test_the_model_key_can_come_from_an_env_file(world, tmp_path):
    # The fake model answers 401 to any other key, so a completed session proves the key read
    # from the file is the one the runtime used.
    message = "Can you check order ORD-2 for me? (key from an env file)"
    world.fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-2"})), when=all_of(user_says(message), no_tool_results))
    world.fake.reply(Text("ORD-2 is delivered."), when=all_of(user_says(message), after_tool("lookup_order")))
    env_file = tmp_path / "refund.env"
    env_file.write_text(f'# the model key\nexport OPENAI_API_KEY="{world.fake.api_key}"\n', encoding="utf-8")

    missing = world.cli("run", AGENT, "--input", json.dumps({"message": message}), check=False, unset=("OPENAI_API_KEY",))
    assert missing.returncode == 1
    assert 'secret "openai": environment variable OPENAI_API_KEY is not set' in missing.stderr, missing.stderr
    session = world.run(message, "--env-file", str(env_file), unset=("OPENAI_API_KEY",))
    inspection = world.wait_for_status(session, "completed")
    assert inspection["session"]["output"]["message"] == "ORD-2 is delivered."


def test_an_operator_cancels_or_completes_a_paused_session(world):
    args = {"order_id": "ORD-1", "amount": 300, "currency": "EUR"}
    paused = {}
    for verb in ("cancel", "complete"):
        message = f"Refund €300 for ORD-1, then the operator will {verb} the session."
        world.fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})), when=all_of(user_says(message), no_tool_results))
        world.fake.reply(ToolCalls.of(("issue_refund", args)), when=all_of(user_says(message), after_tool("lookup_order")))
        session = world.run(message)
        world.wait_for_status(session, "awaiting_approval")
        paused[verb] = session

    assert world.cli("sessions", "cancel", paused["cancel"]).stdout.strip() == f"cancelled {paused['cancel']}"
    assert world.cli("sessions", "complete", paused["complete"]).stdout.strip() == f"completed {paused['complete']}"
    assert world.status(paused["cancel"]) == "cancelled"
    assert world.status(paused["complete"]) == "completed"
    for session in paused.values():
        # A call of a finished session can never be released: its approval is closed, and
        # the handler never ran.
        assert world.pending_approvals(session) == []
        assert refund_calls(world, session) == []
    again = world.cli("sessions", "cancel", paused["cancel"], check=False)
    assert again.returncode == 1
    assert again.stderr.startswith("Error: ") and "is already cancelled and cannot be cancelled" in again.stderr, again.stderr


def test_the_timeline_approval_milestones_name_the_agent_and_policy(world):
    decided = [a for a in approvals_of(world.cli.json("approvals", "list", "--status", "all")) if a["status"] == "denied"]
    approval = the_one(decided, "denied approval")
    inspection = world.inspect(approval["session_id"])
    for kind in ("approval_created", "approval_decided"):
        (milestone,) = [e["approval"] for e in entries(inspection, kind) if e["approval"]["id"] == approval["id"]]
        assert (milestone["agent"], milestone["policy"]) == (AGENT_REF, APPROVAL_POLICY), kind


def test_every_run_is_listed_and_nothing_is_left_pending(world):
    listed = world.cli.json("sessions", "ls")
    assert listed["next_page_token"] is None
    sessions = listed["sessions"]
    assert len(sessions) == 8, json.dumps(listed, indent=2)
    assert {s["agent"] for s in sessions} == {AGENT_REF}
    assert sorted(s["status"] for s in sessions) == ["cancelled"] + ["completed"] * 7
    tagged = world.cli.json("sessions", "ls", "--metadata", "ticket_id=T-100")["sessions"]
    assert [s["metadata"] for s in tagged] == [{"ticket_id": "T-100"}]
    assert approvals_of(world.cli.json("approvals", "list")) == []
    decided = approvals_of(world.cli.json("approvals", "list", "--status", "all"))
    assert sorted(a["status"] for a in decided) == ["approved", "cancelled", "cancelled", "denied"]
    assert world.fake.unused_rules() == []
