"""The walkthrough's refund agent, sidecar variant: the agent never holds the payments key.

    mock-gate provider --port 8010 &               # MOCK_PROVIDER_KEY=… (the provider's key)
    mock-gate --config gate-sidecar.yaml &         # MOCK_GATE_VAULT_KEY=… (see gate-sidecar.yaml)
    python refund_agent_sidecar.py                 # walks the five outcomes through the sidecar

`SidecarSession(...).call("payments", "refunds", ...)` sends the ordinary refunds request to the
sidecar. The gate maps `POST /refunds` to op `refund.create`, takes the amount and the charge
from the body, decides, and on allow forwards it to the provider with the vaulted `X-Api-Key`;
the provider's response comes back as is. A refusal raises the SDK's typed errors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from regent_control import ControlDenied, Escalated, SidecarSession

HERE = Path(__file__).resolve().parent
ORIGINAL_CHARGES = {"ch_aaa": 80.00, "ch_bbb": 120.00, "ch_ccc": 60.00, "ch_ddd": 900.00, "ch_eee": 30.00}


def mock_gate(*args: str) -> str:
    binary = os.environ.get("MOCK_GATE", "mock-gate")
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout.strip()


def idp_token(sub: str, role: str) -> str:
    return mock_gate("idp-token", "--config", str(HERE / "gate-sidecar.yaml"), "--sub", sub, "--role", role)


def handle_refund(sidecar: SidecarSession, *, charge_id, amount_usd, ticket, rep_id_token, account_status):
    resp = sidecar.call(
        "payments", "refunds", method="POST",
        json={"charge": charge_id, "amount": amount_usd},      # the provider's own request
        user_token=rep_id_token,                                # gate-verified → user_role
        intent=f"refund the duplicate charge on ticket {ticket}",
        facts={"account_status": account_status, "refund_to_original": True,
               "reference_amount": ORIGINAL_CHARGES[charge_id]},  # relational cap
        idempotency_key=f"{ticket}:{charge_id}",                # a retry never double-refunds
    )                                      # deny → MandateExceeded / PolicyDenied / Escalated …
    resp.raise_for_status()                # a provider error (e.g. 402) is the provider's own
    return resp.json()["id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    args = parser.parse_args()
    rep = idp_token("alice@bank", "support_agent")
    sidecar = SidecarSession(base_url=args.url, agent_id="agent_refund_bot")
    scenarios = [
        ("$50 · active · to original", "ch_aaa", 50, "active"),
        ("account under review", "ch_bbb", 40, "review"),
        ("frozen account", "ch_ccc", 50, "frozen"),
        ("$250", "ch_ddd", 250, "active"),
        ("refund > original charge", "ch_eee", 45, "active"),
    ]
    for label, charge, amount, status in scenarios:
        ticket = "T-2001"
        try:
            refund_id = handle_refund(sidecar, charge_id=charge, amount_usd=amount, ticket=ticket,
                                      rep_id_token=rep, account_status=status)
            print(f"{label:<30} → ALLOW    → refund {refund_id}")
        except Escalated as esc:
            # Through the sidecar the escalation object is not in the error (SDK 0.12.1): the
            # manager finds the pending approval in the queue.
            print(f"{label:<30} → ESCALATE → {esc.code}: waits for a manager")
            pending = mock_gate("approvals", "list", "--status", "pending", "--json", "--url", args.url,
                                "--config", str(HERE / "gate-sidecar.yaml"))
            ref = json.loads(pending)[0]["ref"]
            mock_gate("approvals", "approve", ref, "--url", args.url,
                      "--config", str(HERE / "gate-sidecar.yaml"), "--approver", "bob@bank",
                      "--approver-token", idp_token("bob@bank", "manager"), "--comment", "account reviewed")
            refund_id = handle_refund(sidecar, charge_id=charge, amount_usd=amount, ticket=ticket,
                                      rep_id_token=rep, account_status=status)
            print(f"{'':<30}   manager approved; the retry (same key) → ALLOW → refund {refund_id}")
        except ControlDenied as denied:
            print(f"{label:<30} → DENY     → {type(denied).__name__} {denied.code}: {denied.reason}")


if __name__ == "__main__":
    main()
