"""Contract tests: the published `regent-control` SDK and `regent-receipt-verify`, unchanged,
against the real `mock-gate` binary."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import regent_receipt_verify
from regent_control import (
    AgentNotActive,
    AsyncRegentControl,
    ControlError,
    DuplicateRequest,
    Escalated,
    IdentityNotResolved,
    MandateExceeded,
    MandateNotFound,
    PolicyDenied,
    RegentControl,
    RiskThresholdExceeded,
    ToolNotAllowed,
    VelocityExceeded,
    guarded,
)
from regent_control.verify import ScopeError, TokenError, TokenVerifier

from gate_helpers import ADMIN_KEY, AGENT, AGENT_KEY, ORG_KEY, RunningGate, copy_walkthrough

REGENT_VERIFY = str(Path(sys.executable).parent / "regent-verify")
FLAGS_ADMIN_KEY = "rgnt_admin_flags_test_key"


def client(gate: RunningGate, api_key: str = ORG_KEY, agent_id: str = AGENT, **kw) -> RegentControl:
    return RegentControl(api_key=api_key, agent_id=agent_id, base_url=gate.url, **kw)


def refund(control, gate: RunningGate, *, charge: str, amount, original, status="active",
           ticket="T-1", rep: str | None = None, to_original=True, customer="cus_1", **extra):
    """The walkthrough's gated call. `reference`/`reference_amount` travel in `facts`: SDK
    0.12.1's `authorize` has no such keywords (the seed's code raises TypeError)."""
    return control.authorize(
        tool="payments", action="refund.create", op="refund.create",
        resource=f"charges/{charge}",
        amount_usd=amount, mandate_id="mnd_support_refunds",
        idempotency_key=f"{ticket}:{charge}",
        user_token=rep if rep is not None else gate.idp_token("alice@bank", "support_agent"),
        intent=f"refund the duplicate charge on ticket {ticket}",
        facts={"account_status": status, "refund_to_original": to_original,
               "reference": charge, "reference_amount": original, "customer_id": customer},
        **extra,
    )


def admin_get(gate: RunningGate, path: str):
    r = httpx.get(f"{gate.url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    return r.json()


def approve(gate: RunningGate, ref: str, manager: str, verb: str = "approve") -> subprocess.CompletedProcess:
    return gate.cli("approvals", verb, ref, "--url", gate.url, "--admin-key", ADMIN_KEY,
                    "--approver", "bob@bank", "--approver-token", manager, "--comment", "checked the account")


def regent_verify(tmp: Path, token: str, gate: RunningGate, *extra: str) -> dict:
    jwks = tmp / "jwks.json"
    jwks.write_text(json.dumps(httpx.get(f"{gate.url}/v1/control/.well-known/jwks.json").json()))
    out = subprocess.run([REGENT_VERIFY, token, "--jwks", str(jwks), "--json", *extra],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_walkthrough_five_outcomes(walkthrough: RunningGate, tmp_path: Path):
    gate = walkthrough
    control = client(gate)
    rep = gate.idp_token("alice@bank", "support_agent")
    manager = gate.idp_token("bob@bank", "manager")

    # $50 · active · to original → allow → act → complete.
    d = refund(control, gate, charge="ch_aaa", amount=50, original=80, rep=rep, ticket="T-100")
    assert d.decision == "allow", d
    assert d.decision_id.startswith("dec_") and d.token and d.expires_at
    verifier = TokenVerifier(jwks_url=f"{gate.url}/v1/control/.well-known/jwks.json")
    scoped = verifier.verify(d.token, expected_tool="payments", expected_action="refund.create")
    assert scoped.agent_id == AGENT and scoped.decision_id == d.decision_id
    assert scoped.claims["amount"] == 50.0 and scoped.claims["mandate_id"] == "mnd_support_refunds"
    done = control.complete(d.decision_id, status="success", downstream_ref="re_ch_aaa")
    assert done.recorded and done.mandate_reconciled

    # Account under review → escalate → a manager approves → the retry (same key) allows.
    e = refund(control, gate, charge="ch_bbb", amount=40, original=100, status="review", rep=rep,
               ticket="T-101")
    assert e.decision == "escalate" and e.code == "ESCALATION_REQUIRED"
    assert e.escalation.type == "manual" and e.escalation.approver == "manager"
    with pytest.raises(Escalated) as raised:
        e.raise_for_status()
    assert raised.value.escalation.ref == e.escalation.ref
    listed = gate.cli("approvals", "list", "--status", "pending", "--url", gate.url,
                      "--admin-key", ADMIN_KEY).stdout
    assert e.escalation.ref in listed and "alice@bank" in listed
    assert refund(control, gate, charge="ch_bbb", amount=40, original=100, status="review",
                  rep=rep, ticket="T-101").escalation.ref == e.escalation.ref
    out = approve(gate, e.escalation.ref, manager)
    assert "approved" in out.stdout
    retry = refund(control, gate, charge="ch_bbb", amount=40, original=100, status="review",
                   rep=rep, ticket="T-101")
    assert retry.decision == "allow", retry

    # Frozen account → PolicyDenied (acct-frozen).
    with pytest.raises(PolicyDenied) as frozen:
        refund(control, gate, charge="ch_ccc", amount=50, original=80, status="frozen", rep=rep,
               ticket="T-102").raise_for_status()
    assert frozen.value.code == "POLICY_DENIED" and "acct-frozen" in str(frozen.value)

    # $250 → MandateExceeded (over the $200 cap).
    with pytest.raises(MandateExceeded):
        refund(control, gate, charge="ch_ddd", amount=250, original=900, rep=rep,
               ticket="T-103").raise_for_status()

    # Refund > the original charge → EXCEEDS_REFERENCE (a PolicyDenied with the code kept).
    over = refund(control, gate, charge="ch_eee", amount=90, original=80, rep=rep, ticket="T-104")
    assert over.decision == "deny" and over.code == "EXCEEDS_REFERENCE"
    with pytest.raises(PolicyDenied) as rel:
        over.raise_for_status()
    assert rel.value.code == "EXCEEDS_REFERENCE"

    # Every decision is in the audit log, on behalf of alice@bank (support_agent).
    decisions = admin_get(gate, "/v1/admin/decisions")["decisions"]
    assert {x["decision"] for x in decisions} == {"allow", "deny", "escalate"}
    assert all(x["on_behalf_of"] == "alice@bank (support_agent)" for x in decisions)


def test_receipts_and_tokens_pass_the_published_verifiers(walkthrough: RunningGate, tmp_path: Path):
    gate = walkthrough
    control = client(gate)
    d = refund(control, gate, charge="ch_v", amount=19.99, original=50, ticket="T-7")
    assert d.allowed
    raw = httpx.post(f"{gate.url}/v1/control/decisions/{d.decision_id}/complete",
                     headers={"Authorization": f"Bearer {ORG_KEY}"},
                     json={"status": "success", "downstream_ref": "re_1", "error": None}).json()
    receipt = raw["receipt"]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"tool": "payments", "action": "refund.create",
                                   "resource": "charges/ch_v", "args": {}}))
    mandate = tmp_path / "mandate.json"
    mandate.write_text(json.dumps(admin_get(gate, "/v1/admin/mandates/mnd_support_refunds/reveal")))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(admin_get(gate, "/v1/admin/policy/reveal")))
    result = regent_verify(tmp_path, receipt, gate, "--request", str(request), "--mandate",
                           str(mandate), "--policy", str(policy))
    assert result["valid"] and result["kind"] == "receipt"
    assert result["args_hash_match"] and result["mandate_match"] and result["policy_match"]
    assert result["claims"]["status"] == "success" and result["claims"]["amount"] == 19.99
    assert result["claims"]["decision_id"] == d.decision_id
    # The allow token is evidence too.
    allow = regent_verify(tmp_path, d.token, gate, "--request", str(request))
    assert allow["kind"] == "allow" and allow["args_hash_match"] and not allow["warnings"]
    # A different request does not match the binding.
    request.write_text(json.dumps({"tool": "payments", "action": "refund.create",
                                   "resource": "charges/ch_other", "args": {}}))
    jwks = json.loads((tmp_path / "jwks.json").read_text())
    res = regent_receipt_verify.verify(receipt, jwks, request=json.loads(request.read_text()))
    assert res.valid and res.args_hash_match is False
    # Library-level checks; and a receipt is refused against another key.
    other = {"keys": [dict(jwks["keys"][0], n="sXch" + jwks["keys"][0]["n"][4:])]}
    assert not regent_receipt_verify.verify(receipt, other).valid

    verifier = TokenVerifier(jwks=jwks)
    with pytest.raises(ScopeError):
        verifier.verify(d.token, expected_tool="payments", expected_action="charge.create")
    with pytest.raises(TokenError):
        verifier.verify(d.token, expected_tool="stripe")


def test_typed_errors_for_every_code(gate_factory, tmp_path: Path):
    extra = """
risk:
  deny_above: 0.8
  signals:
    - {id: watchlist, fact_equals: {customer_id: cus_watchlist}, score: 0.9}
"""
    config = copy_walkthrough(tmp_path / "codes", extra, replace={
        "  agent_suspended_bot:\n": "  agent_fast:\n    tools: [payments]\n    velocity: {max: 2, window_seconds: 3600}\n  agent_suspended_bot:\n",
    })
    gate = gate_factory(["--config", str(config)], config)
    control = client(gate)
    rep = gate.idp_token("alice@bank", "support_agent")

    def expect(error, decision):
        with pytest.raises(error) as raised:
            decision.raise_for_status()
        return raised.value

    expect(IdentityNotResolved, refund(client(gate, agent_id="agent_ghost"), gate, charge="c1", amount=5, original=9, rep=rep))
    # A key bound to the refund bot cannot act for another agent.
    expect(IdentityNotResolved, refund(client(gate, api_key=AGENT_KEY, agent_id="agent_fast"), gate, charge="c1", amount=5, original=9, rep=rep))
    expect(IdentityNotResolved, refund(control, gate, charge="c1", amount=5, original=9, rep="not.a.jwt"))
    expect(AgentNotActive, refund(client(gate, agent_id="agent_suspended_bot"), gate, charge="c1", amount=5, original=9, rep=rep))
    expect(ToolNotAllowed, control.authorize("wire_transfer", "send", amount_usd=5))
    err = expect(MandateNotFound, control.authorize("payments", "refund.create", amount=5, currency="EUR",
                                                    user_token=rep, op="refund.create",
                                                    facts={"account_status": "active", "refund_to_original": True,
                                                           "reference": "c", "reference_amount": 9, "customer_id": "x"}))
    assert err.currency == "EUR" and "EUR" in err.hint
    expect(MandateExceeded, refund(control, gate, charge="c2", amount=500, original=900, rep=rep))
    expect(PolicyDenied, refund(control, gate, charge="c3", amount=5, original=9, rep=rep, to_original=False))
    expect(RiskThresholdExceeded, refund(control, gate, charge="c4", amount=5, original=9, rep=rep, customer="cus_watchlist"))
    fast = client(gate, agent_id="agent_fast")
    for _ in range(2):
        fast.authorize("payments", "refund.create", amount_usd=1)
    expect(VelocityExceeded, fast.authorize("payments", "refund.create", amount_usd=1))
    # Without an idempotency key an identical money request is refused as a duplicate.
    no_key = dict(tool="payments", action="refund.create", op="refund.create", amount_usd=7,
                  mandate_id="mnd_support_refunds", user_token=rep,
                  facts={"account_status": "active", "refund_to_original": True,
                         "reference": "c5", "reference_amount": 50, "customer_id": "cus_1"})
    assert control.authorize(**no_key).allowed
    expect(DuplicateRequest, control.authorize(**no_key))
    esc = expect(Escalated, refund(control, gate, charge="c6", amount=5, original=9, rep=rep, status="review"))
    assert esc.escalation.approver == "manager"
    over = refund(control, gate, charge="c7", amount=10, original=9, rep=rep)
    assert expect(PolicyDenied, over).code == "EXCEEDS_REFERENCE"
    # authorize_or_raise raises the same typed errors.
    with pytest.raises(MandateExceeded):
        control.authorize_or_raise("payments", "refund.create", amount_usd=999, user_token=rep,
                                   op="refund.create", idempotency_key="raise-1",
                                   facts={"account_status": "active", "refund_to_original": True,
                                          "reference": "c8", "reference_amount": 2000, "customer_id": "x"})
    # Not decisions: unknown key (401) and an idempotency key reused for another request (409).
    with pytest.raises(ControlError) as unknown:
        client(gate, api_key="rgnt_ctrl_nope_nope").authorize("payments", "refund.create")
    assert unknown.value.status_code == 401
    assert refund(control, gate, charge="c9", amount=5, original=50, rep=rep, ticket="K").allowed
    with pytest.raises(ControlError) as reused:
        refund(control, gate, charge="c9", amount=6, original=50, rep=rep, ticket="K")
    assert reused.value.status_code == 409 and "different request" in str(reused.value)


def test_guarded_releases_the_hold_when_the_action_fails(walkthrough: RunningGate):
    gate = walkthrough
    control = client(gate)
    rep = gate.idp_token("alice@bank", "support_agent")
    calls = []
    common = dict(op="refund.create", mandate_id="mnd_support_refunds", user_token=rep)

    def facts(key):
        return {"control_context": {"idempotency_key": key, "facts": {
            "account_status": "active", "refund_to_original": True, "reference": "ch_g",
            "reference_amount": 100, "customer_id": "cus_1"}}}

    @guarded(control, tool="payments", action="refund.create", amount_arg="amount_usd", **common)
    def issue_refund(*, amount_usd: float, fail: bool = False, scoped_token: str = "") -> str:
        calls.append(scoped_token)
        if fail:
            raise RuntimeError("provider said no")
        return "re_ok"

    with pytest.raises(RuntimeError):
        issue_refund(amount_usd=80, fail=True, **facts("g-1"))
    # The failed completion released the hold: 80 of 100 fits again.
    assert issue_refund(amount_usd=80, **facts("g-2")) == "re_ok"
    assert len(calls) == 2 and all(t.count(".") == 2 for t in calls)
    # Now committed: 30 more is above the original charge; the function never runs.
    with pytest.raises(PolicyDenied):
        issue_refund(amount_usd=30, **facts("g-3"))
    assert len(calls) == 2
    events = httpx.get(f"{gate.url}/v1/admin/audit", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    completed = [json.loads(line) for line in events.splitlines() if '"gate.completed"' in line]
    assert [c["payload"]["status"] for c in completed] == ["failed", "success"]
    assert completed[0]["payload"]["error"] == "provider said no"


def test_async_client(walkthrough: RunningGate):
    gate = walkthrough
    rep = gate.idp_token("alice@bank", "support_agent")

    async def main():
        async with AsyncRegentControl(api_key=ORG_KEY, agent_id=AGENT, base_url=gate.url) as control:
            d = await control.authorize_or_raise(
                "payments", "refund.create", op="refund.create", resource="charges/ch_async",
                amount_usd=12.5, mandate_id="mnd_support_refunds", idempotency_key="async-1",
                user_token=rep, facts={"account_status": "active", "refund_to_original": True,
                                       "reference": "ch_async", "reference_amount": 20, "customer_id": "c"})
            done = await control.complete(d.decision_id, status="aborted")
            denied = await control.authorize("payments", "refund.create", amount_usd=500, user_token=rep,
                                             op="refund.create", facts={"account_status": "active",
                                             "refund_to_original": True, "reference": "x",
                                             "reference_amount": 900, "customer_id": "c"})
            return d, done, denied

    d, done, denied = asyncio.run(main())
    assert d.allowed and done.recorded and done.mandate_reconciled
    assert denied.code == "MANDATE_LIMIT_EXCEEDED"


def test_signed_requests_hmac_and_rfc9421(gate_factory, tmp_path: Path):
    from regent_control.keys import generate_signing_key

    key = generate_signing_key()
    config = copy_walkthrough(tmp_path / "signed", replace={
        "      require: false": "      require: true",
        "      ed25519_keys: []": f"      ed25519_keys: [\"{key['public_key']}\"]",
    })
    gate = gate_factory(["--config", str(config)], config)
    rep = gate.idp_token("alice@bank", "support_agent")
    ask = dict(op="refund.create", amount_usd=5, user_token=rep,
               facts={"account_status": "active", "refund_to_original": True, "reference": "s",
                      "reference_amount": 100, "customer_id": "c"})

    with pytest.raises(ControlError) as unsigned:
        client(gate).authorize("payments", "refund.create", **ask)
    assert unsigned.value.status_code == 401 and "requires signed" in str(unsigned.value)

    hmac_client = client(gate, sign_requests=True)
    d = hmac_client.authorize("payments", "refund.create", idempotency_key="h1", **ask)
    assert d.allowed
    assert hmac_client.complete(d.decision_id, status="success").recorded
    with pytest.raises(ControlError) as wrong:
        client(gate, agent_secret="0" * 64).authorize("payments", "refund.create", **ask)
    assert wrong.value.status_code == 401

    ed = client(gate, signing_key=key["private_key"])
    d = ed.authorize("payments", "refund.create", idempotency_key="e1", **ask)
    assert d.allowed
    claims = TokenVerifier(jwks_url=f"{gate.url}/v1/control/.well-known/jwks.json").verify(d.token).claims
    assert claims["assertion_scheme"] == "rfc9421-ed25519" and claims["assertion_kid"] == key["kid"]
    assert claims["key_custody"] == "agent"
    assert ed.complete(d.decision_id, status="success").recorded
    stranger = generate_signing_key()
    with pytest.raises(ControlError) as unknown:
        client(gate, signing_key=stranger["private_key"]).authorize("payments", "refund.create", **ask)
    assert unknown.value.status_code == 401 and "not registered" in str(unknown.value)


def test_restart_with_a_pending_escalation(gate_factory, tmp_path: Path):
    config = copy_walkthrough(tmp_path / "restart")
    gate = gate_factory(["--config", str(config)], config)
    control = client(gate)
    rep = gate.idp_token("alice@bank", "support_agent")
    jwks_before = httpx.get(f"{gate.url}/v1/control/.well-known/jwks.json").json()
    e = refund(control, gate, charge="ch_r", amount=40, original=100, status="review", rep=rep, ticket="T-9")
    assert e.decision == "escalate"
    gate.stop()

    # The audit log can be exported while the gate is down, and it chains.
    out = gate.cli("audit", "export", "--config", str(config)).stdout.splitlines()
    events = [json.loads(line) for line in out]
    assert [e_["type"] for e_ in events] == ["gate.decision"]
    assert events[0]["payload"]["escalation"]["ref"] == e.escalation.ref

    again = gate_factory(["--config", str(config)], config)
    assert httpx.get(f"{again.url}/v1/control/.well-known/jwks.json").json() == jwks_before
    control = client(again)
    pending = again.cli("approvals", "list", "--status", "pending", "--json", "--url", again.url,
                        "--admin-key", ADMIN_KEY).stdout
    assert json.loads(pending)[0]["ref"] == e.escalation.ref
    # Same key while still pending: the same escalation.
    assert refund(control, again, charge="ch_r", amount=40, original=100, status="review", rep=rep,
                  ticket="T-9").escalation.ref == e.escalation.ref
    # A rep cannot approve; the manager can.
    denied = again.cli("approvals", "approve", e.escalation.ref, "--url", again.url, "--admin-key",
                       ADMIN_KEY, "--approver", "alice@bank", "--approver-token", rep, check=False)
    assert denied.returncode != 0 and "manager" in denied.stderr
    approve(again, e.escalation.ref, again.idp_token("bob@bank", "manager"))
    d = refund(control, again, charge="ch_r", amount=40, original=100, status="review", rep=rep, ticket="T-9")
    assert d.decision == "allow"
    # The approval is single-use: a later replay of the same key answers with the same allow.
    d2 = refund(control, again, charge="ch_r", amount=40, original=100, status="review", rep=rep, ticket="T-9")
    assert d2.decision_id == d.decision_id
    exported = again.cli("audit", "export", "--url", again.url, "--admin-key", ADMIN_KEY).stdout.splitlines()
    chain = [json.loads(line) for line in exported]
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(chain, chain[1:]))
    assert [c["type"] for c in chain][-3:] == ["gate.approval_decided", "gate.decision", "gate.decision_replayed"]


def test_flags_mode_is_a_drop_in_with_the_right_order(gate_factory):
    gate = gate_factory(["--deny-over", "200", "--escalate-over", "1000", "--deny-tool", "wire"])
    control = RegentControl(api_key="dev", agent_id="agent_refund_bot", base_url=gate.url)
    # The dev mock escalates $1500; a hard cap must not be sent to a human.
    with pytest.raises(MandateExceeded):
        control.authorize_or_raise("payments", "refund.create", amount_usd=1500)
    with pytest.raises(MandateExceeded):
        control.authorize_or_raise("payments", "refund.create", amount_usd=250)
    with pytest.raises(ToolNotAllowed):
        control.authorize_or_raise("wire", "send", amount_usd=1)
    a = control.authorize("payments", "refund.create", amount_usd=50)
    b = control.authorize("payments", "refund.create", amount_usd=50)
    assert a.allowed and b.allowed and a.decision_id != b.decision_id
    scoped = TokenVerifier(jwks_url=f"{gate.url}/v1/control/.well-known/jwks.json").verify(
        a.token, expected_tool="payments", expected_action="refund.create")
    assert scoped.claims["policy_source"] == "legacy"
    # The dev mock's args.amount fallback is kept.
    assert control.authorize("payments", "refund.create", args={"amount": 300}).code == "MANDATE_LIMIT_EXCEEDED"

    esc_gate = gate_factory(["--deny-over", "1000", "--escalate-over", "200", "--admin-key", FLAGS_ADMIN_KEY])
    control = RegentControl(api_key="dev", agent_id="a", base_url=esc_gate.url)
    e = control.authorize("payments", "refund.create", amount_usd=500, idempotency_key="k")
    assert e.decision == "escalate"
    esc_gate.cli("approvals", "approve", e.escalation.ref, "--url", esc_gate.url, "--admin-key",
                 FLAGS_ADMIN_KEY, "--approver", "ops@local")
    assert control.authorize("payments", "refund.create", amount_usd=500, idempotency_key="k").allowed

    deny_all = gate_factory(["--deny-all"])
    with pytest.raises(PolicyDenied):
        RegentControl(api_key="dev", agent_id="a", base_url=deny_all.url).authorize_or_raise("x", "y")


def test_flags_mode_fails_closed_on_an_amount_it_cannot_check(gate_factory):
    gate = gate_factory(["--deny-over", "200", "--admin-key", FLAGS_ADMIN_KEY])
    control = RegentControl(api_key="dev", agent_id="a", base_url=gate.url)
    # The dev mock reads a non-number amount as 0 and allows it; a numeric string included.
    for sent, shown in (("250", '"250"'), ("50", '"50"'), (None, "null")):
        d = control.authorize("payments", "refund.create", args={"amount": sent, "to": "x"})
        assert d.decision == "deny" and d.code == "POLICY_DENIED", d
        assert "fail closed" in d.reason and f"`args.amount` is {shown}" in d.reason, d.reason
    # No amount anywhere: nothing to hold against --deny-over, so it is refused too.
    missing = control.authorize("payments", "refund.create", args={"to": "x"})
    assert missing.decision == "deny" and "no amount" in missing.reason, missing.reason
    with pytest.raises(PolicyDenied):
        missing.raise_for_status()
    # Numbers are decided as before, in args or in context.
    assert control.authorize("payments", "refund.create", args={"amount": 50}).allowed
    assert control.authorize("payments", "refund.create", args={"amount": 250}).code == "MANDATE_LIMIT_EXCEEDED"
    assert control.authorize("payments", "refund.create", amount_usd=250).code == "MANDATE_LIMIT_EXCEEDED"
    # Without an amount rule, a request without an amount is still allowed (the drop-in).
    plain = gate_factory(["--deny-tool", "wire", "--admin-key", FLAGS_ADMIN_KEY])
    assert RegentControl(api_key="dev", agent_id="a", base_url=plain.url).authorize("search", "query").allowed


def generated_admin_key(gate: RunningGate) -> str:
    log = gate.log.read_text()
    keys = re.findall(r"admin key for this run[^\n]*: (\S+)\n", log)
    assert len(keys) == 1, log
    assert log.count(keys[0]) == 1, "the generated key is printed once"
    return keys[0]


def test_flags_mode_generates_its_admin_key_and_every_decision_names_its_approver(gate_factory):
    gate = gate_factory(["--escalate-over", "100"])
    key = generated_admin_key(gate)
    assert len(key) >= 32 and key != "dev-admin"
    assert generated_admin_key(gate_factory(["--escalate-over", "100"])) != key
    # The well-known key of the dev mock opens nothing.
    for well_known in ("dev-admin", "dev"):
        r = httpx.get(f"{gate.url}/v1/admin/approvals", headers={"Authorization": f"Bearer {well_known}"})
        assert r.status_code == 401
    assert gate.cli("approvals", "list", "--url", gate.url, check=False).returncode != 0

    control = RegentControl(api_key="dev", agent_id="a", base_url=gate.url)
    e = control.authorize("payments", "refund.create", amount_usd=500, idempotency_key="k")
    assert e.decision == "escalate"
    ref = e.escalation.ref
    admin = {"Authorization": f"Bearer {key}"}
    # A decision without an approver name is a 400 naming the field; so is a name that is not
    # printable or too long. Nothing is decided.
    for body in ({}, {"comment": "ok"}, {"approver": ""}, {"approver": "   "},
                 {"approver": "bob\u001b[31m"}, {"approver": "bob\u202e"}, {"approver": "x" * 200}):
        r = httpx.post(f"{gate.url}/v1/admin/approvals/{ref}/approve", headers=admin, json=body)
        assert r.status_code == 400, (body, r.text)
        assert "approver" in r.json()["detail"], r.text
    r = httpx.post(f"{gate.url}/v1/admin/approvals/{ref}/approve", headers=admin)
    assert r.status_code == 400 and "`approver`" in r.json()["detail"]
    missing = gate.cli("approvals", "approve", ref, "--url", gate.url, "--admin-key", key, check=False)
    assert missing.returncode != 0 and "--approver" in missing.stderr
    assert control.authorize("payments", "refund.create", amount_usd=500, idempotency_key="k").decision == "escalate"

    out = gate.cli("approvals", "approve", ref, "--url", gate.url, "--admin-key", key,
                   "--approver", "Ops Person <ops@local>", "--comment", "checked")
    assert "approved" in out.stdout
    assert control.authorize("payments", "refund.create", amount_usd=500, idempotency_key="k").allowed
    # The approver is in the hash-chained audit log.
    events = [json.loads(line) for line in
              gate.cli("audit", "export", "--url", gate.url, "--admin-key", key).stdout.splitlines()]
    decided = [ev for ev in events if ev["type"] == "gate.approval_decided"]
    assert len(decided) == 1 and decided[0]["actor"] == "Ops Person <ops@local>"
    assert decided[0]["payload"]["approver"]["name"] == "Ops Person <ops@local>"
    assert decided[0]["payload"]["approver"]["via"] == "admin_key"
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(events, events[1:]))
    listed = json.loads(gate.cli("approvals", "list", "--json", "--url", gate.url, "--admin-key", key).stdout)
    assert listed[0]["decided_by"]["name"] == "Ops Person <ops@local>"
