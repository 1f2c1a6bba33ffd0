"""The refund tutorial's world for end-to-end tests: the real `phrony-runtime` daemon, the real
`phrony` CLI, the tutorial's own `worker.py` on the published SDK, and a scripted fake OpenAI.

`Tutorial.started(...)` (a context manager) copies `policies-examples/refund-agent/` unchanged to
a temporary project, starts the fake model and a daemon whose `openai` provider talks to it
(`OPENAI_BASE_URL`), validates, publishes and deploys the agent with the CLI as the tutorial
does, then starts `worker.py` and waits until its tools are registered.

The worker runs with `workers/record_invocations/` on `PYTHONPATH`: its `sitecustomize` wraps
every handler the SDK registers and appends a JSON line per invocation to a log, so a test can
prove which handlers ran — and that a denied call's handler never did — without changing the
tutorial's code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from fake_openai import ChatRequest, FakeOpenAI, ToolCalls, after_tool, all_of, user_says
from runtime_daemon import RuntimeDaemon

REPO_ROOT = Path(__file__).resolve().parents[2]
TUTORIAL_DIR = REPO_ROOT / "policies-examples" / "refund-agent"
RECORDER = Path(__file__).resolve().parent / "workers" / "record_invocations"
AGENT = "support/refund-agent"
AGENT_VERSION = "0.1.0"
WORKER_ID = "refund-worker-1"
# The tutorial's operator (`export PHRONY_ACTOR=emad`).
OPERATOR = "emad"
# A generous guard for anything the tests wait for; never a synchronisation device.
PATIENCE = 60.0

T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float = PATIENCE, interval: float = 0.05) -> T:
    """Calls `probe` until it returns something truthy, and returns that."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what} (last: {value!r})")
        time.sleep(interval)


class PhronyCli:
    """Runs the `phrony` binary against one daemon, with a clean environment."""

    def __init__(self, binary: Path, address: str, home: Path, openai_api_key: str) -> None:
        self.binary = binary
        home.mkdir(parents=True, exist_ok=True)
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PHRONY_", "RUNTIME_", "OPENAI_", "ANTHROPIC_")) and k != "RUST_LOG"
        }
        self.env = {
            **base,
            "PHRONY_RUNTIME_ADDR": address,
            "OPENAI_API_KEY": openai_api_key,
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "NO_COLOR": "1",
            "PHRONY_NO_TUI": "1",
        }

    def __call__(
        self,
        *args: str,
        actor: str | None = None,
        check: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        unset: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        environment = dict(self.env)
        if actor is not None:
            environment["PHRONY_ACTOR"] = actor
        environment.update(env or {})
        for name in unset:
            environment.pop(name, None)
        done = subprocess.run(
            [str(self.binary), *args],
            env=environment,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PATIENCE,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"phrony {' '.join(args)} exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
            )
        return done

    def json(self, *args: str, actor: str | None = None) -> Any:
        """Runs a data command with `--output json` and parses its stdout."""
        done = self(*args, "--output", "json", actor=actor)
        try:
            return json.loads(done.stdout)
        except ValueError as error:
            raise AssertionError(f"phrony {' '.join(args)} --output json printed no JSON ({error}):\n{done.stdout}") from None


class TutorialWorker:
    """The tutorial's `worker.py`, run with the venv's Python and the invocation recorder."""

    def __init__(self, project: Path, address: str, log_dir: Path) -> None:
        self.invocation_log = log_dir / "invocations.jsonl"
        self.stdout_path = log_dir / "worker.out"
        self.invocation_log.touch()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PHRONY_")}
        env.update(
            {
                "PHRONY_RUNTIME_ADDR": address,
                "PHRONY_TEST_INVOCATION_LOG": str(self.invocation_log),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(RECORDER), env.get("PYTHONPATH", "")])),
                "PYTHONUNBUFFERED": "1",
            }
        )
        with open(self.stdout_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "worker.py"],
                cwd=project,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def invocations(self, tool: str | None = None, event: str = "invoked") -> list[dict[str, Any]]:
        lines = self.invocation_log.read_text(encoding="utf-8").splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if e["event"] == event and (tool is None or e["tool"] == tool)]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=PATIENCE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


SESSION_STARTED = re.compile(r"^session (\S+) started$", re.MULTILINE)


class Tutorial:
    """The running tutorial; build it with `Tutorial.started`."""

    def __init__(self, fake: FakeOpenAI, daemon: RuntimeDaemon, cli: PhronyCli, project: Path) -> None:
        self.fake = fake
        self.daemon = daemon
        self.cli = cli
        self.project = project
        self.worker: TutorialWorker | None = None
        # The CLI's output of the tutorial's set-up steps, for the tests to check.
        self.setup: dict[str, subprocess.CompletedProcess[str]] = {}

    @classmethod
    @contextlib.contextmanager
    def started(
        cls, runtime_binary: Path, cli_binary: Path, workdir: Path, extra_env: dict[str, str] | None = None
    ) -> Iterator[Tutorial]:
        """`extra_env`: more of the daemon's environment (e.g. `RUNTIME_HTTP_ADDR`)."""
        project = workdir / "refund-agent"
        shutil.copytree(TUTORIAL_DIR, project, ignore=shutil.ignore_patterns("cases.yaml", "__pycache__"))
        api_key = "sk-test-" + secrets.token_hex(16)
        with contextlib.ExitStack() as stack:
            fake = stack.enter_context(FakeOpenAI(api_key=api_key))
            daemon_dir = workdir / "runtime"
            daemon_dir.mkdir()
            daemon = RuntimeDaemon(
                runtime_binary,
                daemon_dir,
                {
                    "OPENAI_BASE_URL": fake.base_url,
                    "RUNTIME_SECRETS_ENCRYPTION_KEY": secrets.token_hex(32),
                    **(extra_env or {}),
                },
            )
            stack.enter_context(daemon)
            cli = PhronyCli(cli_binary, daemon.address, workdir / "home", api_key)
            tutorial = cls(fake, daemon, cli, project)
            tutorial._publish()
            tutorial.worker = TutorialWorker(project, daemon.address, workdir)
            stack.callback(tutorial.worker.stop)
            tutorial._wait_for_worker()
            yield tutorial

    def _publish(self) -> None:
        """The tutorial's "Publish, deploy, run" steps, from the project directory."""
        cli, here = self.cli, self.project
        self.setup["validate"] = cli("agents", "validate", "./agent.yaml", cwd=here)
        self.setup["publish"] = cli("agents", "publish", "./agent.yaml", cwd=here)
        self.setup["deploy"] = cli("agents", "deploy", f"{AGENT}@{AGENT_VERSION}", cwd=here)

    def _wait_for_worker(self) -> None:
        assert self.worker is not None

        def registered() -> bool:
            if self.worker.process.poll() is not None:
                raise AssertionError(
                    f"worker.py exited with {self.worker.process.returncode}:\n{self.worker.output()}"
                )
            return any(
                "work stream open" in line and WORKER_ID in line and "payments.issue-refund" in line
                for line in self.daemon.log().splitlines()
            )

        wait_until(registered, "worker.py to register its tools")

    # Sessions

    def run(self, message: str, *extra: str, actor: str = OPERATOR, unset: tuple[str, ...] = ()) -> str:
        """`phrony run support/refund-agent --input {"message": …}` (detached) as `actor`, like
        the tutorial's `export PHRONY_ACTOR=emad`; the session id."""
        done = self.cli(
            "run",
            AGENT,
            "--input",
            json.dumps({"message": message}, ensure_ascii=False),
            *extra,
            actor=actor,
            unset=unset,
        )
        found = SESSION_STARTED.search(done.stdout)
        assert found, f"phrony run printed no `session <id> started`:\n{done.stdout}\n{done.stderr}"
        return found.group(1)

    def inspect(self, session_id: str) -> dict[str, Any]:
        return self.cli.json("sessions", "inspect", session_id)

    def status(self, session_id: str) -> str:
        return self.inspect(session_id)["session"]["status"]

    def wait_for_status(self, session_id: str, *statuses: str) -> dict[str, Any]:
        """Inspects the session until its status is one of `statuses`; returns that inspection."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            nonlocal last
            last = self.inspect(session_id)
            status = last["session"]["status"]
            if status in {"failed", "cancelled", "completed"} and status not in statuses:
                raise AssertionError(
                    f"session {session_id} ended {status}, not {statuses}:\n{json.dumps(last, indent=2)}\n"
                    f"fake model problems: {self.fake.problems}"
                )
            return last if status in statuses else None

        try:
            return wait_until(reached, f"session {session_id} to be {' or '.join(statuses)}")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{json.dumps(last, indent=2)}\n{self.daemon.log()[-5000:]}") from None

    def pending_approvals(self, session_id: str) -> list[dict[str, Any]]:
        listed = self.cli.json("approvals", "list")
        return [a for a in approvals_of(listed) if a["session_id"] == session_id]


def no_tool_results(request: ChatRequest) -> bool:
    return not request.tool_results()


def script_refund(fake: FakeOpenAI, message: str, order_id: str, refund: dict[str, Any], answer) -> None:
    """The model's side of a refund conversation, as the tutorial tells it: look the order up,
    call issue_refund with `refund`, then `answer` (a function of the request carrying the
    refund's outcome)."""
    conversation = user_says(message)
    fake.reply(
        ToolCalls.of(("lookup_order", {"order_id": order_id})),
        when=all_of(conversation, no_tool_results),
        label=f"{message!r}: lookup",
    )
    fake.reply(
        ToolCalls.of(("issue_refund", refund), text="Let me process that refund."),
        when=all_of(conversation, after_tool("lookup_order")),
        label=f"{message!r}: refund",
    )
    fake.reply(answer, when=all_of(conversation, after_tool("issue_refund")), label=f"{message!r}: answer")


def approvals_of(listed: dict[str, Any]) -> list[dict[str, Any]]:
    """The approvals of `approvals list --output json`, which must be the whole listing."""
    assert listed["next_page_token"] is None, listed
    return listed["approvals"]
