"""The walkthrough's sidecar variant with the PUBLISHED SDK, unchanged: `SidecarSession`,
`AsyncSidecarSession` and the gateway client of `RegentControl` against the real `mock-gate`
binary (`policies-examples/regent-walkthrough/gate-sidecar.yaml`) and the real mock provider
(`mock-gate provider`). The agent never holds the payments key: the provider refuses every call
that did not come through the gate, and sees an idempotent retry exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from regent_control import (
    AsyncSidecarSession,
    ControlError,
    Escalated,
    MandateExceeded,
    PolicyDenied,
    RegentControl,
    SidecarSession,
)

from gate_helpers import ADMIN_KEY, AGENT, AGENT_KEY, WALKTHROUGH, RunningGate

PROVIDER_KEY = "sk_test_payments_" + secrets.token_hex(8)
ORIGINAL_CHARGES = {"ch_aaa": 80.00, "ch_bbb": 120.00, "ch_ccc": 60.00, "ch_ddd": 900.00, "ch_eee": 30.00}


class Provider:
    """A running `mock-gate provider`."""

    def __init__(self, binary: Path, cwd: Path):
        env = {**os.environ, "MOCK_PROVIDER_KEY": PROVIDER_KEY}
        self.process = subprocess.Popen(
            [str(binary), "provider", "--port", "0"], cwd=cwd, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = self.process.stdout.readline() if self.process.stdout else ""
        assert "listening on " in line, line
        self.url = line.split("listening on ", 1)[1].split()[0]

    def refunds(self) -> list[dict]:
        resp = httpx.get(f"{self.url}/refunds", headers={"X-Api-Key": PROVIDER_KEY}, timeout=5)
        resp.raise_for_status()
        return resp.json()["data"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def provider(mock_gate_bin: Path, tmp_path: Path):
    p = Provider(mock_gate_bin, tmp_path)
    yield p
    p.stop()


@pytest.fixture
def sidecar(gate_factory, provider: Provider, mock_gate_bin: Path, tmp_path: Path, monkeypatch) -> RunningGate:
    """`mock-gate --config gate-sidecar.yaml` routed to the provider, its key sealed in the vault."""
    dest = tmp_path / "walkthrough"
    dest.mkdir()
    shutil.copy(WALKTHROUGH / "policy.cedar", dest / "policy.cedar")
    text = (WALKTHROUGH / "gate-sidecar.yaml").read_text()
    assert "base_url: http://127.0.0.1:8010" in text
    text = text.replace("base_url: http://127.0.0.1:8010", f"base_url: {provider.url}")
    config = dest / "gate-sidecar.yaml"
    config.write_text(text)
    monkeypatch.setenv("MOCK_GATE_VAULT_KEY", secrets.token_hex(32))
    subprocess.run([str(mock_gate_bin), "vault", "put", "--config", str(config), "--name", "payments_api_key"],
                   input=PROVIDER_KEY + "\n", text=True, check=True, capture_output=True)
    vault = (dest / ".state-sidecar" / "vault.json").read_text()
    assert PROVIDER_KEY not in vault, "the key is sealed, not stored in clear"
    gate = gate_factory(["--config", str(config)], config)
    gate.extra["provider"] = provider
    return gate


def refund(session: SidecarSession, gate: RunningGate, rep: str, charge: str, amount: float, status: str,
           ticket: str) -> httpx.Response:
    return session.call(
        "payments", "refunds", method="POST", json={"charge": charge, "amount": amount},
        user_token=rep, intent=f"refund the duplicate charge on ticket {ticket}",
        facts={"account_status": status, "refund_to_original": True,
               "reference_amount": ORIGINAL_CHARGES[charge]},
        idempotency_key=f"{ticket}:{charge}",
    )


def approve_pending(gate: RunningGate) -> str:
    listed = gate.cli("approvals", "list", "--status", "pending", "--json", "--url", gate.url,
                      "--admin-key", ADMIN_KEY).stdout
    pending = json.loads(listed)
    assert len(pending) == 1, pending
    ref = pending[0]["ref"]
    out = gate.cli("approvals", "approve", ref, "--url", gate.url, "--admin-key", ADMIN_KEY,
                   "--approver", "bob@bank", "--approver-token", gate.idp_token("bob@bank", "manager"),
                   "--comment", "account reviewed")
    assert "approved" in out.stdout
    return ref


def test_the_five_outcomes_through_the_sidecar_and_a_retry_the_provider_sees_once(sidecar: RunningGate):
    gate, provider = sidecar, sidecar.extra["provider"]
    rep = gate.idp_token("alice@bank", "support_agent")
    with SidecarSession(base_url=gate.url, agent_id=AGENT) as session:
        # $50 · active · to original → ALLOW → the provider's refund re_ch_aaa, as is.
        resp = refund(session, gate, rep, "ch_aaa", 50, "active", "T-1001")
        assert resp.status_code == 200 and resp.json()["id"] == "re_ch_aaa"
        assert resp.headers["content-type"] == "application/json"

        # Under review → ESCALATE → a manager approves → the retry (same key) is forwarded once.
        with pytest.raises(Escalated) as escalated:
            refund(session, gate, rep, "ch_bbb", 40, "review", "T-1002")
        assert escalated.value.code == "ESCALATION_REQUIRED"
        assert escalated.value.decision_id.startswith("dec_")
        approve_pending(gate)
        first = refund(session, gate, rep, "ch_bbb", 40, "review", "T-1002")
        assert first.status_code == 200 and first.json()["id"] == "re_ch_bbb"
        again = refund(session, gate, rep, "ch_bbb", 40, "review", "T-1002")
        assert again.json() == first.json()
        assert again.headers["x-regent-replayed"] == "true"

        # Frozen → DENY → PolicyDenied (acct-frozen).
        with pytest.raises(PolicyDenied) as frozen:
            refund(session, gate, rep, "ch_ccc", 50, "frozen", "T-1003")
        assert frozen.value.code == "POLICY_DENIED" and "acct-frozen" in str(frozen.value)

        # $250 → DENY → MandateExceeded (the amount is the body's, not an asserted fact).
        with pytest.raises(MandateExceeded):
            refund(session, gate, rep, "ch_ddd", 250, "active", "T-1004")

        # Refund > the original charge → DENY → EXCEEDS_REFERENCE.
        with pytest.raises(PolicyDenied) as over:
            refund(session, gate, rep, "ch_eee", 45, "active", "T-1005")
        assert over.value.code == "EXCEEDS_REFERENCE"

        # The refusal is a 4xx, never a 2xx, when not raised.
        raw = session.call("payments", "refunds", method="POST", json={"charge": "ch_ccc", "amount": 50},
                           user_token=rep, facts={"account_status": "frozen", "refund_to_original": True,
                                                  "reference_amount": 60}, raise_on_deny=False)
        assert raw.status_code == 403 and raw.json()["decision"] == "deny"

    refunds = provider.refunds()
    assert [(r["id"], r["amount"]) for r in refunds] == [("re_ch_aaa", 50), ("re_ch_bbb", 40)]
    assert refunds[1]["idempotency_key"] == "T-1002:ch_bbb"
    for r in refunds:
        assert "x-api-key" in r["headers"]
        assert not [h for h in r["headers"] if h.startswith("x-agent-") or h in ("authorization", "cookie")], r

    # The audit log has each decision and the completion with the provider's id, never the key.
    audit = gate.cli("audit", "export", "--url", gate.url, "--admin-key", ADMIN_KEY).stdout
    assert "re_ch_bbb" in audit and "alice@bank" in audit
    assert PROVIDER_KEY not in audit
    assert PROVIDER_KEY not in gate.log.read_text()


def test_the_agent_never_holds_the_key(sidecar: RunningGate):
    provider = sidecar.extra["provider"]
    direct = httpx.post(f"{provider.url}/refunds", json={"charge": "ch_aaa", "amount": 50}, timeout=5)
    assert direct.status_code == 401
    # Whatever key the agent sends is stripped; the vaulted one is injected.
    rep = sidecar.idp_token("alice@bank", "support_agent")
    with SidecarSession(base_url=sidecar.url, agent_id=AGENT) as session:
        resp = session.call("payments", "refunds", method="POST", json={"charge": "ch_aaa", "amount": 10},
                            headers={"X-Api-Key": "agent-guess", "Authorization": "Bearer agent"},
                            user_token=rep, facts={"account_status": "active", "refund_to_original": True,
                                                   "reference_amount": 80})
    assert resp.status_code == 200
    assert len(provider.refunds()) == 1


def test_async_sidecar_session(sidecar: RunningGate):
    rep = sidecar.idp_token("alice@bank", "support_agent")

    async def main():
        session = AsyncSidecarSession(base_url=sidecar.url, agent_id=AGENT, user_token=rep,
                                      facts={"refund_to_original": True})
        try:
            ok = await session.call("payments", "refunds", method="POST", json={"charge": "ch_aaa", "amount": 20},
                                    facts={"account_status": "active", "reference_amount": 80},
                                    idempotency_key="A-1:ch_aaa")
            again = await session.call("payments", "refunds", method="POST",
                                       json={"charge": "ch_aaa", "amount": 20},
                                       facts={"account_status": "active", "reference_amount": 80},
                                       idempotency_key="A-1:ch_aaa")
            with pytest.raises(PolicyDenied):
                await session.call("payments", "refunds", method="POST", json={"charge": "ch_ccc", "amount": 5},
                                   facts={"account_status": "frozen", "reference_amount": 60})
            return ok, again
        finally:
            await session.aclose()

    ok, again = asyncio.run(main())
    assert ok.status_code == 200 and again.json() == ok.json()
    assert len(sidecar.extra["provider"].refunds()) == 1, "the idempotent retry reached the provider once"


def test_the_gateway_client_with_a_signed_agent_key(sidecar: RunningGate):
    rep = sidecar.idp_token("alice@bank", "support_agent")
    control = RegentControl(api_key=AGENT_KEY, agent_id=AGENT, base_url=sidecar.url, gateway_url=sidecar.url,
                            sign_requests=True)
    ok = control.gateway("payments", "refunds", body={"charge": "ch_aaa", "amount": 30}, user_token=rep,
                         facts={"account_status": "active", "refund_to_original": True, "reference_amount": 80},
                         idempotency_key="G-1:ch_aaa", intent="refund via the gateway")
    assert ok.ok and ok.decision == "allow" and ok.data["id"] == "re_ch_aaa"
    denied = control.gateway("payments", "refunds", body={"charge": "ch_ddd", "amount": 250}, user_token=rep,
                             facts={"account_status": "active", "refund_to_original": True,
                                    "reference_amount": 900})
    assert not denied.ok and denied.status == 403
    assert denied.decision == "deny" and denied.code == "MANDATE_LIMIT_EXCEEDED"
    assert denied.decision_id.startswith("dec_")
    # A key the gate does not know is refused before any decision.
    stranger = RegentControl(api_key="rgnt_agt_unknown", agent_id=AGENT, base_url=sidecar.url,
                             gateway_url=sidecar.url)
    refused = stranger.gateway("payments", "refunds", body={"charge": "ch_aaa", "amount": 1})
    assert refused.status == 401
    assert len(sidecar.extra["provider"].refunds()) == 1
    control.close()
    stranger.close()


def test_the_sidecar_binary_housekeeping_calls(sidecar: RunningGate):
    assert httpx.post(f"{sidecar.url}/v1/license/validate", json={}).json() == {"valid": True, "tier": "dev"}
    assert httpx.post(f"{sidecar.url}/v1/heartbeat", json={}).json() == {"ok": True, "tier": "dev"}
    # The control API is not shadowed by the routing routes.
    assert httpx.get(f"{sidecar.url}/healthz").json()["status"] == "ok"
    with pytest.raises(ControlError):
        RegentControl(api_key="rgnt_ctrl_nope", agent_id=AGENT, base_url=sidecar.url).authorize(
            tool="payments", action="refund.create")
