"""The mock-gate web console in a real headless Chromium (tests/python/browser.py): decisions made
with the published `regent-control` SDK show up; a manager signs in, approves one escalation and
rejects another with comments in the page, and the admin API and the SDK see the result with the
manager recorded as approver; hostile text renders as text; the audit export downloads.

Screenshots go to target/console-screenshots/<test>/ (printed; CARGO_TARGET_DIR respected)."""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from regent_control import Escalated, PolicyDenied, RegentControl

from browser import Browser, screenshot_dir
from gate_helpers import ADMIN_KEY, AGENT, ORG_KEY, RunningGate, copy_walkthrough

MANAGER = "bob@bank"
MANAGER_PASSWORD = "correct horse battery staple"
XSS = '<img src=x onerror="document.body.dataset.xss=1">'


@pytest.fixture
def browser(request, tmp_path: Path):
    with Browser.start(tmp_path / "browser", screenshot_dir(request.node.name)) as b:
        yield b


@pytest.fixture
def console_gate(gate_factory, mock_gate_bin: Path, tmp_path: Path) -> RunningGate:
    """The walkthrough gate with a manager login for bob@bank (hash made by the binary)."""
    config = copy_walkthrough(tmp_path / "walkthrough")
    hashed = subprocess.run([str(mock_gate_bin), "console", "hash-password"], input=MANAGER_PASSWORD + "\n",
                            capture_output=True, text=True, check=True).stdout.strip()
    assert hashed.startswith("$argon2id$"), hashed
    with config.open("a") as f:
        f.write(f"\nconsole:\n  managers:\n    - username: {MANAGER}\n      password_hash: '{hashed}'\n"
                f"      role: manager\n")
    return gate_factory(["--config", str(config)], config)


def refund(control: RegentControl, gate: RunningGate, *, charge: str, amount, status="active",
           rep: str = "alice@bank", intent: str | None = None):
    return control.authorize(
        tool="payments", action="refund.create", op="refund.create", resource=f"charges/{charge}",
        amount_usd=amount, mandate_id="mnd_support_refunds", idempotency_key=f"T-{charge}",
        user_token=gate.idp_token(rep, "support_agent"),
        intent=intent or f"refund {charge}",
        facts={"account_status": status, "refund_to_original": True, "reference": charge,
               "reference_amount": 500, "customer_id": f"cus_{charge}"},
    )


def admin_get(gate: RunningGate, path: str):
    r = httpx.get(f"{gate.url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    r.raise_for_status()
    return r


def row_of(browser: Browser, tbody: str, attribute: str, value: str):
    return next((r for r in browser.rows(tbody) if r.get_attribute(attribute) == value), None)


def cells(row) -> list[str]:
    return [td.text for td in row.find_elements("css selector", "td")]


def sign_in(browser: Browser, gate: RunningGate, password: str = MANAGER_PASSWORD) -> None:
    browser.open(f"{gate.url}/console/")
    browser.wait_for(lambda: browser.visible("#login-form"), "the login form")
    browser.type("#username", MANAGER)
    browser.type("#password", password)
    browser.click("#login-button")


def test_a_manager_decides_escalations_in_the_console(console_gate: RunningGate, browser: Browser):
    gate = console_gate
    control = RegentControl(api_key=ORG_KEY, agent_id=AGENT, base_url=gate.url)

    # Decisions through the published SDK: allow (completed), allow (held), deny, three escalations.
    allowed = refund(control, gate, charge="ch_aaa", amount=50)
    control.complete(allowed.decision_id, status="success", downstream_ref="re_ch_aaa")
    refund(control, gate, charge="ch_ccc", amount=30)
    with pytest.raises(PolicyDenied):
        refund(control, gate, charge="ch_fff", amount=20, status="frozen").raise_for_status()
    refs = {}
    for charge, amount, rep, intent in [("ch_bbb", 40, "alice@bank", None), ("ch_ddd", 60, "alice@bank", None),
                                        ("ch_xss", 10, f"{XSS}@bank", XSS)]:
        with pytest.raises(Escalated) as escalated:
            refund(control, gate, charge=charge, amount=amount, status="review", rep=rep,
                   intent=intent).raise_for_status()
        refs[charge] = escalated.value.escalation.ref
    decisions = admin_get(gate, "/v1/admin/decisions").json()["decisions"]
    assert len(decisions) == 6

    # Not signed in: the page shows only the login form; a wrong password is refused (401).
    browser.open(f"{gate.url}/console/")
    browser.wait_for(lambda: browser.visible("#login-form"), "the login form")
    assert not browser.visible("#app")
    assert browser.fetch_status("/console/api/decisions") == 401
    browser.screenshot("login")
    sign_in(browser, gate, password="not the password")
    browser.wait_for(lambda: "wrong username or password" in browser.text("#message"), "the login error")
    assert not browser.visible("#app")
    browser.screenshot("wrong-password")

    sign_in(browser, gate)
    browser.wait_for(lambda: len(browser.rows("#decisions-body")) == 6, "six decision rows")
    assert f"Signed in as {MANAGER} (manager)" in browser.text("#whoami")
    browser.screenshot("signed-in")

    # The decisions log: on behalf of whom, amount, policy id, code.
    by_id = {d["decision_id"]: d for d in decisions}
    for row in browser.rows("#decisions-body"):
        d = by_id[row.get_attribute("data-decision-id")]
        text = cells(row)
        assert text[1] == AGENT
        assert text[4] == f"{d['amount']} USD"
        assert text[5] == d["decision"]
        assert text[6] == (d["code"] or "")
        assert text[7] == ", ".join(d["policies"])
    allow_row = cells(row_of(browser, "#decisions-body", "data-decision-id", allowed.decision_id))
    assert allow_row[2] == "on behalf of alice@bank (support_agent)"
    assert "support-agent-refunds" in allow_row[7]
    deny_row = next(cells(r) for r in browser.rows("#decisions-body") if cells(r)[5] == "deny")
    assert deny_row[6] == "POLICY_DENIED" and "acct-frozen" in deny_row[7]

    # Hostile text renders as text: no element is created from it, no handler runs.
    xss_rows = [r for r in browser.rows("#decisions-body") if XSS in r.text]
    assert len(xss_rows) == 1
    assert cells(xss_rows[0])[8] == XSS
    assert cells(xss_rows[0])[2] == f"on behalf of {XSS}@bank (support_agent)"
    assert browser.find_all("#app img") == []
    assert browser.script("return document.body.dataset.xss === undefined")
    assert XSS in row_of(browser, "#approvals-body", "data-ref", refs["ch_xss"]).text

    # Mandates: used (completed) and held (allowed, not completed) today, as the admin API says.
    mandate = admin_get(gate, "/v1/admin/mandates").json()["mandates"][0]
    assert Decimal(mandate["used_today"]) == 50 and Decimal(mandate["held_today"]) == 30
    mrow = cells(row_of(browser, "#mandates-body", "data-mandate-id", "mnd_support_refunds"))
    assert mrow[4] == mandate["used_today"] and mrow[5] == mandate["held_today"]

    # Approve ch_bbb with a comment typed in the page.
    row = row_of(browser, "#approvals-body", "data-ref", refs["ch_bbb"])
    browser.type("input.comment", "account reviewed in the console", within=row)
    browser.screenshot("approving")
    browser.click("button.approve", within=row)
    browser.wait_for(lambda: row_of(browser, "#decided-body", "data-ref", refs["ch_bbb"]), "the approval")
    done = cells(row_of(browser, "#decided-body", "data-ref", refs["ch_bbb"]))
    assert done[1] == "approved" and done[2] == f"{MANAGER} (manager)"
    assert done[3] == "account reviewed in the console"

    # Reject ch_ddd.
    row = row_of(browser, "#approvals-body", "data-ref", refs["ch_ddd"])
    browser.type("input.comment", "customer already refunded", within=row)
    browser.click("button.reject", within=row)
    browser.wait_for(lambda: row_of(browser, "#decided-body", "data-ref", refs["ch_ddd"]), "the rejection")
    browser.screenshot("decided")

    # The admin API records the manager as approver, and the SDK's retries see the decisions.
    approvals = {a["ref"]: a for a in admin_get(gate, "/v1/admin/approvals").json()["approvals"]}
    approved, rejected = approvals[refs["ch_bbb"]], approvals[refs["ch_ddd"]]
    assert approved["status"] == "approved" and rejected["status"] == "rejected"
    for a, comment in [(approved, "account reviewed in the console"), (rejected, "customer already refunded")]:
        assert a["decided_by"]["sub"] == MANAGER
        assert a["decided_by"]["role"] == "manager"
        assert a["decided_by"]["via"] == "console_login"
        assert a["comment"] == comment
    assert approvals[refs["ch_xss"]]["status"] == "pending"
    retried = refund(control, gate, charge="ch_bbb", amount=40, status="review")
    assert retried.decision == "allow"
    with pytest.raises(PolicyDenied) as denied:
        refund(control, gate, charge="ch_ddd", amount=60, status="review").raise_for_status()
    assert "reject" in str(denied.value).lower()

    # The audit export downloads the same hash-chained JSONL as the admin API.
    browser.click("#export-audit")
    download = browser.wait_for_download("mock-gate-audit.jsonl")
    exported = [json.loads(line) for line in download.read_text().splitlines() if line]
    assert exported == [json.loads(line) for line in admin_get(gate, "/v1/admin/audit").text.splitlines()
                        if line][: len(exported)]
    decided = [e for e in exported if e["type"] == "gate.approval_decided"]
    assert {e["payload"]["ref"] for e in decided} == {refs["ch_bbb"], refs["ch_ddd"]}
    assert all(e["actor"] == MANAGER and e["payload"]["approver"]["via"] == "console_login" for e in decided)

    # No CSP violation or script error on the page (the 401s of the expected refusals aside).
    errors = [m for m in browser.console_log() if m.get("level") == "SEVERE" and m.get("source") != "network"]
    assert errors == [], errors

    # Sign out: the session is gone.
    browser.click("#logout")
    browser.wait_for(lambda: browser.visible("#login-form"), "the login form after signing out")
    assert browser.fetch_status("/console/api/decisions") == 401
    browser.screenshot("signed-out")


def test_the_admin_key_signs_in_without_being_in_the_page(gate_factory, browser: Browser):
    """Flags mode has no manager logins: the operator types the admin key, decides naming the
    approver, and the page source never holds the key."""
    gate = gate_factory(["--escalate-over", "100", "--admin-key", ADMIN_KEY])
    control = RegentControl(api_key="any-key", agent_id="agent_flags", base_url=gate.url)
    with pytest.raises(Escalated) as escalated:
        control.authorize(tool="payments", action="refund.create", amount_usd=150,
                          intent="a big refund").raise_for_status()
    ref = escalated.value.escalation.ref

    browser.open(f"{gate.url}/console/")
    browser.wait_for(lambda: browser.visible("#login-form"), "the login form")
    browser.click("details summary")
    browser.type("#admin-key", "rgnt_admin_wrong_key")
    browser.click("#admin-login")
    browser.wait_for(lambda: "wrong admin key" in browser.text("#message"), "the admin key error")
    browser.type("#admin-key", ADMIN_KEY)
    browser.click("#admin-login")
    browser.wait_for(lambda: row_of(browser, "#approvals-body", "data-ref", ref), "the pending escalation")
    assert ADMIN_KEY not in browser.driver.page_source
    assert "with the admin key" in browser.text("#whoami")

    # Deciding without naming the approver is refused; naming one records it.
    row = row_of(browser, "#approvals-body", "data-ref", ref)
    browser.click("button.approve", within=row)
    browser.wait_for(lambda: "`approver`" in browser.text("#message"), "the missing approver error")
    browser.type("#approver-name", "carol@bank")
    row = row_of(browser, "#approvals-body", "data-ref", ref)
    browser.type("input.comment", "ok", within=row)
    browser.click("button.approve", within=row)
    browser.wait_for(lambda: row_of(browser, "#decided-body", "data-ref", ref), "the approval")
    browser.screenshot("admin-key-approved")
    approval = admin_get(gate, "/v1/admin/approvals").json()["approvals"][0]
    assert approval["decided_by"]["sub"] == "carol@bank"
    assert approval["decided_by"]["via"] == "admin_key"
    assert approval["comment"] == "ok"


def test_the_console_api_needs_a_login_a_csrf_token_and_a_json_body(console_gate: RunningGate):
    """Without the browser: the headers and refusals a cross-site page would meet."""
    gate = console_gate
    page = httpx.get(f"{gate.url}/console/")
    assert page.status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert "<script src=\"/console/assets/console.js\"" in page.text
    assert httpx.get(f"{gate.url}/console/api/approvals").status_code == 401
    wrong = httpx.post(f"{gate.url}/console/api/login", json={"username": MANAGER, "password": "nope nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "wrong username or password"
    unknown = httpx.post(f"{gate.url}/console/api/login", json={"username": "mallory", "password": "nope nope"})
    assert unknown.status_code == 401 and unknown.json()["detail"] == "wrong username or password"
    form = httpx.post(f"{gate.url}/console/api/login", data={"username": MANAGER, "password": MANAGER_PASSWORD})
    assert form.status_code == 415
    ok = httpx.post(f"{gate.url}/console/api/login", json={"username": MANAGER, "password": MANAGER_PASSWORD})
    assert ok.status_code == 200, ok.text
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    session = httpx.Client(base_url=gate.url, cookies=ok.cookies)
    assert session.get("/console/api/approvals").status_code == 200
    no_csrf = session.post("/console/api/approvals/esc_x/approve", json={})
    assert no_csrf.status_code == 403 and "x-console-csrf" in no_csrf.json()["detail"]
    csrf = {"X-Console-Csrf": ok.json()["csrf"]}
    cross = session.post("/console/api/approvals/esc_x/approve", json={},
                         headers={**csrf, "Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert session.post("/console/api/approvals/esc_x/approve", json={}, headers=csrf).status_code == 404
    assert session.post("/console/api/logout", headers=csrf).status_code == 204
    assert session.get("/console/api/approvals").status_code == 401
