"""The runtime's approvals console (`/console/` on `RUNTIME_HTTP_ADDR`) in a real headless Chromium
(tests/python/browser.py, Debian's chromium and chromedriver).

- `local` auth mode, the tutorial's world (the refund agent published with the CLI, the tutorial's
  `worker.py`, a scripted OpenAI-compatible model): the console signs in as the local operator; a
  €400 refund appears in the pending list live (no reload), the operator opens it, sees the exact
  arguments, the deciding policy, the reason and the quorum, approves it with a comment and watches
  the session complete on its page; another €400 refund is rejected with a comment and the agent
  relays it.
- `required` auth mode (the scripted `stub` model, no worker): a viewer's token signs in, sees the
  pending refund without decide buttons, and the server refuses a vote from the page (403); an
  approver's token rejects it, recorded as the token's verified name.

Screenshots go to target/console-screenshots/<test>/ (printed; CARGO_TARGET_DIR respected)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from browser import Browser, screenshot_dir
from fake_openai import Text
from runtime_daemon import RuntimeDaemon, free_port
from tutorial_env import AGENT, TUTORIAL_DIR, PhronyCli, Tutorial, script_refund, wait_until

ARGS = {"order_id": "ORD-1", "amount": 400, "currency": "EUR", "reason": "item arrived damaged"}
APPROVAL_POLICY = "payments/refund-approval-boundary@1.0.0"
APPROVAL_REASON = "Refund amount above delegated limit."
APPROVE_COMMENT = "Damage claim verified in the console."
REJECT_COMMENT = "No damage claim on file; rejected in the console."
XSS = '<img src=x onerror="document.body.dataset.xss=1">'


@pytest.fixture
def browser(request, tmp_path: Path):
    with Browser.start(tmp_path / "browser", screenshot_dir(request.node.name)) as b:
        yield b


def row_of(browser: Browser, session: str):
    return next((r for r in browser.rows("#approvals-body") if r.get_attribute("data-session-id") == session), None)


def open_pending(browser: Browser, session: str) -> None:
    """From the list, opens the pending approval of `session`."""

    def click_open() -> bool:
        # Live updates re-render the list: a row found a moment ago may be gone (stale), so
        # finding and clicking are retried together.
        row = row_of(browser, session)
        if row is None:
            return False
        browser.click("a", within=row)
        return True

    browser.wait_for(click_open, f"the pending approval of {session} in the list")
    browser.wait_for(lambda: browser.visible("#approval-view") and browser.text("#approval-status") == "pending",
                     "the approval page")


def assert_shows_the_refund(browser: Browser) -> None:
    """The approval page shows the exact arguments, the deciding policy, the reason and the quorum."""
    assert json.loads(browser.text("#approval-args")) == ARGS
    assert '"amount": 400' in browser.text("#approval-args"), "pretty-printed JSON"
    assert browser.text("#approval-policy") == APPROVAL_POLICY
    assert browser.text("#approval-reason") == APPROVAL_REASON
    assert browser.text("#approval-quorum") == "0 of 1 approvals"
    assert browser.text("#approval-tool") == "payments.issue-refund@1.0.0"


def csp_violations(browser: Browser) -> list[dict]:
    return [e for e in browser.console_log() if "Content Security Policy" in e.get("message", "")]


# --- local mode: the tutorial's world --------------------------------------------------------------


@pytest.fixture(scope="module")
def world(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    http = f"127.0.0.1:{free_port()}"
    with Tutorial.started(runtime_binary, cli_binary, tmp_path_factory.mktemp("console"),
                          {"RUNTIME_HTTP_ADDR": http}) as tutorial:
        tutorial.console = f"http://{http}/console/"
        yield tutorial


def test_the_operator_approves_the_400_euro_refund_and_watches_the_session_complete(world, browser: Browser):
    message = "Refund €400 for ORD-1 — approved in the console."
    script_refund(world.fake, message, "ORD-1", ARGS,
                  lambda r: Text(f"Refund {json.loads(r.results_of('issue_refund')[0])['refund_id']} has been issued."))
    browser.open(world.console)
    browser.wait_for(lambda: browser.visible("#list-view"), "the pending list")
    browser.wait_for(lambda: browser.text("#live") == "live", "the live updates to connect")
    assert "local operator" in browser.text("#whoami")
    browser.script("window.notReloaded = true")

    # The refund appears without a reload: the live updates bring it.
    session = world.run(message)
    shown = browser.wait_for(lambda: (row := row_of(browser, session)) and row.text,
                             "the €400 refund to appear in the list")
    assert "amount=400" in shown and "payments.issue-refund@1.0.0" in shown, shown
    browser.screenshot("pending-list")
    open_pending(browser, session)
    assert_shows_the_refund(browser)
    approval_id = browser.text("#approval-id")
    assert browser.visible("#approve-button") and browser.visible("#reject-button")
    browser.screenshot("approval")

    browser.type("#comment", APPROVE_COMMENT)
    browser.click("#approve-button")
    browser.wait_for(lambda: browser.visible("#session-view"), "the session page")
    browser.wait_for(lambda: browser.text("#session-status") == "completed", "the session to complete")
    assert browser.script("return window.notReloaded") is True, "the page was not reloaded"
    assert browser.text("#message").startswith("Approved: approval approved"), browser.text("#message")
    assert browser.text("#session-output") == "Refund rf_2891 has been issued."
    kinds = [r.get_attribute("data-kind") for r in browser.rows("#timeline-body")]
    assert "approval.vote" in kinds and "invocation_completed" in kinds, kinds
    browser.screenshot("session-completed")

    shown = world.cli.json("approvals", "show", approval_id)
    assert shown["status"] == "approved", shown
    assert [(v["comment"], v["verification"]) for v in shown["votes"]] == [(APPROVE_COMMENT, "unverified")], shown
    (refund,) = [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == session]
    assert refund["args"] == ARGS
    assert csp_violations(browser) == []


def test_the_operator_rejects_a_refund_with_a_comment_the_agent_relays(world, browser: Browser):
    message = "Refund €400 for ORD-1 — rejected in the console."
    script_refund(world.fake, message, "ORD-1", ARGS,
                  lambda r: Text("The refund was not approved: " + r.results_of("issue_refund")[0]))
    session = world.run(message)
    world.wait_for_status(session, "awaiting_approval")
    browser.open(world.console)
    browser.type("#filter-session", session)
    browser.click("#apply-filters")
    open_pending(browser, session)
    assert_shows_the_refund(browser)
    # Hostile text from a person (or a model) is shown as text, never run.
    browser.type("#comment", REJECT_COMMENT + " " + XSS)
    browser.click("#reject-button")
    browser.wait_for(lambda: browser.text("#session-status") == "completed", "the session to complete")
    assert REJECT_COMMENT + " " + XSS in browser.text("#session-output")
    assert browser.script("return document.body.dataset.xss === undefined") is True
    browser.screenshot("session-after-reject")
    assert [i for i in world.worker.invocations("payments.issue-refund") if i["session_id"] == session] == []
    assert csp_violations(browser) == []


def test_edited_arguments_are_checked_in_the_page_and_by_the_runtime(world, browser: Browser):
    message = "Refund €400 for ORD-1 — edited in the console."
    script_refund(world.fake, message, "ORD-1", ARGS, lambda r: Text("Handled."))
    session = world.run(message)
    world.wait_for_status(session, "awaiting_approval")
    browser.open(world.console)
    open_pending(browser, session)
    browser.click("#edit-args")
    browser.type("#edited-args", "{not json")
    browser.click("#approve-button")
    browser.wait_for(lambda: "not valid JSON" in browser.text("#message"), "the page's JSON check")
    browser.type("#edited-args", json.dumps({**ARGS, "amount": "four hundred"}))
    browser.click("#approve-button")
    browser.wait_for(lambda: "input schema" in browser.text("#message"), "the runtime's schema check")
    assert "amount" in browser.text("#message")
    browser.screenshot("edited-args-refused")
    assert browser.text("#approval-status") == "pending", "nothing was recorded"
    # Leave nothing pending for the other tests.
    browser.type("#edited-args", json.dumps({**ARGS, "amount": 300}))
    browser.click("#reject-button")
    browser.wait_for(lambda: browser.text("#session-status") == "completed", "the session to complete")


# --- required mode: tokens and roles ---------------------------------------------------------------

STUB_TURNS = [
    [{"type": "tool_call", "name": "issue_refund", "args": ARGS}, {"type": "completed", "stop_reason": "tool_use"}],
    [{"type": "text_delta", "text": "The refund was reviewed."}, {"type": "completed", "stop_reason": "end_turn"}],
]


class Guarded:
    """A daemon in `required` mode with the tutorial's agent on the scripted stub model."""

    def __init__(self, daemon: RuntimeDaemon, runtime_binary: Path, cli: PhronyCli, http: str) -> None:
        self.daemon = daemon
        self.runtime_binary = runtime_binary
        self.cli = cli
        self.console = f"http://{http}/console/"

    def token(self, name: str, role: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "PHRONY_"))}
        env.update({"RUNTIME_DATABASE_URL": f"sqlite://{self.daemon.database}", "RUNTIME_LOG": "warn",
                    "XDG_DATA_HOME": str(self.daemon.workdir / "xdg"), "NO_COLOR": "1"})
        done = subprocess.run([str(self.runtime_binary), "tokens", "create", "--name", name, "--role", role],
                              env=env, capture_output=True, text=True, check=True)
        secret = done.stdout.strip().splitlines()[-1]
        assert secret.startswith("phr_"), done.stdout
        return secret

    def as_(self, token: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cli(*args, env={"PHRONY_TOKEN": token})


@pytest.fixture(scope="module")
def guarded(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("guarded")
    project = workdir / "refund-agent"
    shutil.copytree(TUTORIAL_DIR, project, ignore=shutil.ignore_patterns("cases.yaml", "__pycache__", "*.py"))
    manifest = project / "agent.yaml"
    text = manifest.read_text()
    text = text.replace("secrets:\n  openai:\n    fromEnv: OPENAI_API_KEY\n", "")
    text = text.replace("provider: openai\n    name: gpt-4o", "provider: stub\n    name: scripted")
    assert "provider: stub" in text and "OPENAI_API_KEY" not in text, text
    manifest.write_text(text)
    (project / "stub-script.json").write_text(json.dumps({"turns": STUB_TURNS}))
    http = f"127.0.0.1:{free_port()}"
    env = {"RUNTIME_AUTH": "required", "RUNTIME_ENABLE_STUB_PROVIDER": "1", "RUNTIME_HTTP_ADDR": http}
    (workdir / "runtime").mkdir()
    with RuntimeDaemon(runtime_binary, workdir / "runtime", extra_env=env) as daemon:
        cli = PhronyCli(cli_binary, daemon.address, workdir / "home", "unused")
        g = Guarded(daemon, runtime_binary, cli, http)
        admin = g.token("ops-admin", "admin")
        g.as_(admin, "agents", "publish", str(manifest))
        g.as_(admin, "agents", "deploy", f"{AGENT}@0.1.0")
        g.admin = admin
        yield g


def sign_in(browser: Browser, console: str, token: str) -> None:
    browser.open(console)
    browser.wait_for(lambda: browser.visible("#login-form"), "the sign-in form")
    browser.type("#token", token)
    browser.click("#login-button")
    browser.wait_for(lambda: browser.visible("#list-view"), "the pending list after signing in")


def approvals_of(g: Guarded, session: str) -> list[dict[str, Any]]:
    listed = json.loads(g.as_(g.admin, "approvals", "list", "--output", "json").stdout)
    return [a for a in listed["approvals"] if a["session_id"] == session]


def test_a_viewer_cannot_approve_and_an_approver_rejects_as_itself(guarded: Guarded, browser: Browser):
    g = guarded
    viewer = g.token("vera", "viewer")
    approver = g.token("emad", "approver")
    done = g.as_(g.admin, "run", AGENT, "--input", json.dumps({"message": "Refund €400 for ORD-1."}))
    session = done.stdout.split("session ", 1)[1].split()[0]
    wait_until(lambda: approvals_of(g, session), "the €400 refund to wait for an approval")

    # Without a token there is nothing but the sign-in form; a wrong token is refused.
    browser.open(g.console)
    browser.wait_for(lambda: browser.visible("#login-form"), "the sign-in form")
    assert not browser.visible("#app")
    assert browser.fetch_status("/console/api/approvals") == 401
    browser.screenshot("sign-in")
    browser.type("#token", "phr_" + "A" * 43)
    browser.click("#login-button")
    browser.wait_for(lambda: "unauthenticated" in browser.text("#message") or "token" in browser.text("#message"),
                     "the refusal of a wrong token")
    assert not browser.visible("#app")

    # A viewer sees the refund, without buttons; the server refuses a vote all the same.
    sign_in(browser, g.console, viewer)
    assert "vera" in browser.text("#whoami") and "viewer" in browser.text("#whoami")
    open_pending(browser, session)
    assert_shows_the_refund(browser)
    assert not browser.visible("#approve-button") and not browser.visible("#reject-button")
    assert "cannot decide" in browser.text("#cannot-decide")
    browser.screenshot("viewer-cannot-decide")
    status = browser.driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/console/api/session').then(r => r.json()).then(s => fetch("
        "'/console/api/approvals/' + arguments[0] + '/decide', {method: 'POST', credentials: 'same-origin',"
        " headers: {'Content-Type': 'application/json', 'X-Phrony-Csrf': s.csrf},"
        " body: JSON.stringify({decision: 'approve', comment: 'sneaky'})})).then(r => done(r.status), e => done(-1));",
        browser.text("#approval-id"),
    )
    assert status == 403
    (pending,) = approvals_of(g, session)
    assert pending["status"] == "pending" and pending["approvals_received"] == 0
    browser.click("#logout")
    browser.wait_for(lambda: browser.visible("#login-form"), "the sign-in form after signing out")

    # An approver rejects it; the vote is the token's verified name.
    sign_in(browser, g.console, approver)
    open_pending(browser, session)
    approval_id = browser.text("#approval-id")
    browser.type("#comment", REJECT_COMMENT)
    browser.click("#reject-button")
    browser.wait_for(lambda: browser.text("#session-status") == "completed", "the session to complete")
    browser.screenshot("approver-rejected")
    shown = json.loads(g.as_(g.admin, "approvals", "show", approval_id, "--output", "json").stdout)
    assert shown["status"] == "denied", shown
    assert (shown["decided_by"], shown["decided_by_verification"]) == ("emad", "token"), shown
    assert [(v["comment"], v["verification"]) for v in shown["votes"]] == [(REJECT_COMMENT, "token")], shown
    assert csp_violations(browser) == []
