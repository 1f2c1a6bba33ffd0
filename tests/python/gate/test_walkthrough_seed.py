"""The walkthrough seed's own agent code (section 2, `handle_refund`), run verbatim against
`mock-gate --config policies-examples/regent-walkthrough/gate.yaml`, gets the walkthrough's five
outcomes.

The function's source is read out of the seed listing, never retyped: from the seed file itself
when it is present (`PHRONY_SEED_WALKTHROUGH`, default `../shared/seeds/001_…` beside the
repository, where CI lays it), otherwise
from the committed copy `tests/python/fixtures/walkthrough-seed-agent.txt`; when both exist they
must be identical, so the copy cannot drift.

The seed's code sends no `customer_id`: the shipped mandate's per-customer sub-budget is the
walkthrough's *optional* one (`entity_optional: true`), so it is skipped, not failed closed.
What the test supplies is only what the listing leaves to its surroundings: `control`,
`original_charge_amount`, `notify_rep` and `payments`. `control` is the published SDK's
`RegentControl`; its one addition is the `reference=` / `reference_amount=` keywords the seed
calls and SDK 0.12.1 lacks (a `TypeError` otherwise, regent-gate.md "Discrepancies"), which it
sends where the SDK puts open context keys, `context.reference` / `context.reference_amount`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from regent_control import (
    ControlDenied,
    Escalated,
    MandateExceeded,
    PolicyDenied,
    RegentControl,
)
from regent_control.verify import TokenVerifier

from gate_helpers import ADMIN_KEY, AGENT, ORG_KEY, REPO_ROOT, RunningGate

SEED = Path(
    os.environ.get(
        "PHRONY_SEED_WALKTHROUGH",
        str(REPO_ROOT.parent / "shared" / "seeds" / "001_2f151c0802403920.txt"),
    )
)
COPY = REPO_ROOT / "tests" / "python" / "fixtures" / "walkthrough-seed-agent.txt"
# The walkthrough README's charges (what `original_charge_amount` looks up in a real system).
ORIGINAL_CHARGES = {"ch_aaa": 80.00, "ch_bbb": 120.00, "ch_ccc": 60.00, "ch_ddd": 900.00, "ch_eee": 30.00}


def function_source(text: str, name: str) -> str:
    """The source of top-level function `name` in a listing: its `def` line and every following
    line up to the first non-blank line that is not indented."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"def {name}(")), None)
    assert start is not None, f"no `def {name}(` in the listing"
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t"):
        end += 1
    return "\n".join(lines[start:end]).rstrip() + "\n"


def seed_handle_refund() -> str:
    copy = function_source(COPY.read_text(encoding="utf-8"), "handle_refund")
    if SEED.is_file():
        seed = function_source(SEED.read_text(encoding="utf-8"), "handle_refund")
        assert seed == copy, f"{COPY} drifted from the seed {SEED}"
        return seed
    return copy


class SeedControl(RegentControl):
    """`RegentControl` accepting the seed's `reference=` / `reference_amount=` keywords."""

    def authorize(self, tool, action, *, reference=None, reference_amount=None, context=None, **kwargs):
        extra = {k: v for k, v in (("reference", reference), ("reference_amount", reference_amount))
                 if v is not None}
        return super().authorize(tool, action, context={**(context or {}), **extra}, **kwargs)


class Payments:
    """The payments API the seed calls with the gate's scoped token."""

    def __init__(self, verifier: TokenVerifier):
        self.verifier = verifier
        self.refunds: list[tuple[str, float]] = []

    def refund(self, charge_id, amount_usd, *, token):
        # The downstream API accepts the call only with a valid token scoped to it.
        self.verifier.verify(token, expected_tool="payments", expected_action="refund.create")
        self.refunds.append((charge_id, amount_usd))
        return f"re_{charge_id}"


def test_the_seed_listing_is_extracted_verbatim():
    source = seed_handle_refund()
    assert source.startswith("def handle_refund(*, charge_id, amount_usd, ticket, rep_id_token, account_status):")
    assert 'facts={"account_status": account_status, "refund_to_original": True},' in source
    assert "customer_id" not in source
    assert source.rstrip().endswith("return refund_id")


def test_the_seed_handle_refund_unchanged_gets_the_five_outcomes(walkthrough: RunningGate):
    gate = walkthrough
    notes: list[str] = []
    payments = Payments(TokenVerifier(jwks_url=f"{gate.url}/v1/control/.well-known/jwks.json"))
    namespace = {
        "control": SeedControl(api_key=ORG_KEY, agent_id=AGENT, base_url=gate.url),
        "original_charge_amount": ORIGINAL_CHARGES.__getitem__,
        "notify_rep": notes.append,
        "payments": payments,
        "Escalated": Escalated,
        "ControlDenied": ControlDenied,
    }
    exec(compile(seed_handle_refund(), f"{SEED.name}:handle_refund", "exec"), namespace)
    handle_refund = namespace["handle_refund"]
    rep = gate.idp_token("alice@bank", "support_agent")

    def run(charge: str, amount: float, status: str, ticket: str):
        return handle_refund(charge_id=charge, amount_usd=amount, ticket=ticket, rep_id_token=rep,
                             account_status=status)

    # $50 · active · to original → ALLOW → refund re_ch_aaa, completed.
    assert run("ch_aaa", 50, "active", "T-1001") == "re_ch_aaa"
    assert payments.refunds == [("ch_aaa", 50)]

    # Account under review → ESCALATE → a manager approves → the retry (same key) allows.
    with pytest.raises(Escalated) as escalated:
        run("ch_bbb", 40, "review", "T-1002")
    ref = escalated.value.escalation.ref
    assert escalated.value.escalation.approver == "manager"
    assert notes == ["Sent to a manager — retry ticket T-1002 once approved"]
    approved = gate.cli("approvals", "approve", ref, "--url", gate.url, "--admin-key", ADMIN_KEY,
                        "--approver", "bob@bank", "--approver-token", gate.idp_token("bob@bank", "manager"),
                        "--comment", "account reviewed")
    assert "approved" in approved.stdout
    assert run("ch_bbb", 40, "review", "T-1002") == "re_ch_bbb"

    # Frozen account → DENY → PolicyDenied (acct-frozen).
    with pytest.raises(PolicyDenied) as frozen:
        run("ch_ccc", 50, "frozen", "T-1003")
    assert frozen.value.code == "POLICY_DENIED" and "acct-frozen" in str(frozen.value)

    # $250 → DENY → MandateExceeded (over the $200 cap).
    with pytest.raises(MandateExceeded) as over_cap:
        run("ch_ddd", 250, "active", "T-1004")
    assert "per-transaction limit 200.00" in str(over_cap.value)

    # Refund > the original charge → DENY → EXCEEDS_REFERENCE (relational cap).
    with pytest.raises(PolicyDenied) as over_reference:
        run("ch_eee", 45, "active", "T-1005")
    assert over_reference.value.code == "EXCEEDS_REFERENCE"

    # Only the two allowed refunds reached the payments API; no decision failed closed.
    assert payments.refunds == [("ch_aaa", 50), ("ch_bbb", 40)]
    audit = gate.cli("audit", "export", "--url", gate.url, "--admin-key", ADMIN_KEY).stdout
    assert "fail closed" not in audit
