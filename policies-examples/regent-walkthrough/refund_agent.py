"""The walkthrough's refund agent, run against mock-gate with the published SDK.

    mock-gate --config gate.yaml &                 # in this directory
    python refund_agent.py                         # walks the five outcomes

Differences from the seed's listing, forced by regent-control 0.12.1: `authorize` has no
`reference=`/`reference_amount=` keywords, so the relational-cap facts travel in `facts`
(the gate reads them from `context.reference` / `context.reference_amount`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from regent_control import ControlDenied, Escalated, RegentControl

HERE = Path(__file__).resolve().parent
ORIGINAL_CHARGES = {"ch_aaa": 80.00, "ch_bbb": 120.00, "ch_ccc": 60.00, "ch_ddd": 900.00, "ch_eee": 30.00}


def mock_gate(*args: str) -> str:
    binary = os.environ.get("MOCK_GATE", "mock-gate")
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout.strip()


def idp_token(sub: str, role: str) -> str:
    return mock_gate("idp-token", "--config", str(HERE / "gate.yaml"), "--sub", sub, "--role", role)


def handle_refund(control, *, charge_id, amount_usd, ticket, rep_id_token, account_status):
    d = control.authorize(
        tool="payments", action="refund.create", op="refund.create",
        resource=f"charges/{charge_id}",
        amount_usd=amount_usd, mandate_id="mnd_support_refunds",
        idempotency_key=f"{ticket}:{charge_id}",    # a retry never double-refunds
        user_token=rep_id_token,                    # gate-verified → user_role
        intent=f"refund the duplicate charge on ticket {ticket}",
        facts={"account_status": account_status, "refund_to_original": True,
               # relational cap; add "customer_id" to count against the per-customer sub-budget
               "reference": charge_id, "reference_amount": ORIGINAL_CHARGES[charge_id]},
    )
    if d.decision == "escalate":
        raise Escalated(d.reason, decision_id=d.decision_id, escalation=d.escalation)
    d.raise_for_status()                            # deny → MandateExceeded / PolicyDenied / …
    refund_id = f"re_{charge_id}"                   # payments.refund(charge_id, amount_usd, token=d.token)
    control.complete(d.decision_id, status="success", downstream_ref=refund_id)
    return refund_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8009")
    args = parser.parse_args()
    control = RegentControl(api_key="rgnt_ctrl_walkthrough_local", agent_id="agent_refund_bot",
                            base_url=args.url)
    rep = idp_token("alice@bank", "support_agent")
    scenarios = [
        ("$50 · active · to original", "ch_aaa", 50, "active"),
        ("account under review", "ch_bbb", 40, "review"),
        ("frozen account", "ch_ccc", 50, "frozen"),
        ("$250", "ch_ddd", 250, "active"),
        ("refund > original charge", "ch_eee", 45, "active"),
    ]
    for label, charge, amount, status in scenarios:
        ticket = "T-1001"
        try:
            refund_id = handle_refund(control, charge_id=charge, amount_usd=amount, ticket=ticket,
                                      rep_id_token=rep, account_status=status)
            print(f"{label:<30} → ALLOW    → refund {refund_id}")
        except Escalated as esc:
            print(f"{label:<30} → ESCALATE → {esc.escalation.ref} waits for a {esc.escalation.approver}")
            manager = idp_token("bob@bank", "manager")
            mock_gate("approvals", "approve", esc.escalation.ref, "--url", args.url,
                      "--config", str(HERE / "gate.yaml"), "--approver", "bob@bank",
                      "--approver-token", manager, "--comment", "account reviewed")
            refund_id = handle_refund(control, charge_id=charge, amount_usd=amount, ticket=ticket,
                                      rep_id_token=rep, account_status=status)
            print(f"{'':<30}   manager approved; the retry (same key) → ALLOW → refund {refund_id}")
        except ControlDenied as denied:
            print(f"{label:<30} → DENY     → {type(denied).__name__} {denied.code}: {denied.reason}")


if __name__ == "__main__":
    main()
