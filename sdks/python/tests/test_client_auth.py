"""`Client` in the runtime's `required` auth mode (real daemon, tokens from `phrony-runtime tokens
create`, the scripted `stub` model): a runner's token runs a session to its output; no token, a
viewer's token and a plaintext token to a non-loopback address each fail with their typed error;
`sessions.list/inspect/cancel` and `approvals.get` on the same daemon."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from runtime_daemon import RuntimeDaemon

from phrony import (
    Client,
    NotFoundError,
    PermissionDeniedError,
    PhronyError,
    PhronyRuntimeError,
    SessionCancelledError,
    UnauthenticatedError,
)

AGENT = "support/hello-agent"
AGENT_YAML = """apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: hello-agent
  namespace: support
  version: 0.1.0
spec:
  purpose: Greet.
  instructions:
    text: Answer briefly.
  model:
    provider: stub
    name: scripted
"""
ANSWER = "Hello from a verified runner."


class World:
    def __init__(self, daemon: RuntimeDaemon, runtime_binary: Path, cli_binary: Path, workdir: Path) -> None:
        self.daemon = daemon
        self.runtime_binary = runtime_binary
        self.cli_binary = cli_binary
        self.workdir = workdir

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "PHRONY_"))}
        env.update(
            {
                "RUNTIME_DATABASE_URL": f"sqlite://{self.daemon.database}",
                "RUNTIME_LOG": "warn",
                "XDG_DATA_HOME": str(self.workdir / "xdg"),
                "NO_COLOR": "1",
            }
        )
        return env

    def token(self, name: str, role: str, *extra: str) -> str:
        done = subprocess.run(
            [str(self.runtime_binary), "tokens", "create", "--name", name, "--role", role, *extra],
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip().splitlines()[-1]

    def cli(self, token: str, *args: str) -> None:
        env = {**self.env(), "PHRONY_RUNTIME_ADDR": self.daemon.address, "PHRONY_TOKEN": token}
        done = subprocess.run([str(self.cli_binary), *args], env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"phrony {args}: {done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def world(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("client-auth")
    agent_dir = workdir / "agent"
    agent_dir.mkdir()
    (agent_dir / "agent.yaml").write_text(AGENT_YAML)
    turns = [[{"type": "text_delta", "text": ANSWER}, {"type": "completed", "stop_reason": "end_turn"}]] * 8
    (agent_dir / "stub-script.json").write_text(json.dumps({"turns": turns}))
    extra = {"RUNTIME_AUTH": "required", "RUNTIME_ENABLE_STUB_PROVIDER": "1"}
    with RuntimeDaemon(runtime_binary, workdir, extra_env=extra) as daemon:
        w = World(daemon, runtime_binary, cli_binary, workdir)
        publisher = w.token("sdk-publisher", "publisher")
        w.cli(publisher, "agents", "publish", str(agent_dir / "agent.yaml"))
        w.cli(publisher, "agents", "deploy", f"{AGENT}@0.1.0")
        yield w


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PHRONY_TOKEN", "PHRONY_TLS_CA", "PHRONY_TLS_CERT", "PHRONY_TLS_KEY", "PHRONY_ACTOR"):
        monkeypatch.delenv(name, raising=False)


def test_a_runner_token_runs_a_session_to_its_output(world: World):
    client = Client(runtime_addr=world.daemon.address, token=world.token("runner-1", "runner"))

    async def scenario():
        session = await client.run(AGENT, input="hi", metadata={"ticket_id": "T-1"})
        result = await session.wait()
        listed = await client.sessions.list(metadata={"ticket_id": "T-1"})
        details = await client.sessions.inspect(session.id)
        return session, result, listed, details

    session, result, listed, details = run(scenario())
    assert result.output == ANSWER
    assert result.status == "completed" and result.metadata == {"ticket_id": "T-1"}
    assert session.agent_ref == "support/hello-agent@0.1.0"
    assert [s.id for s in listed] == [session.id]
    assert listed[0].agent_ref == "support/hello-agent@0.1.0"
    # The verified principal is recorded as the starter, not a name the client chose.
    assert details.started_by == "runner-1" and details.output == ANSWER


def test_the_token_can_come_from_PHRONY_TOKEN(world: World, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PHRONY_TOKEN", world.token("viewer-env", "viewer"))
    client = Client(runtime_addr=world.daemon.address)
    assert run(client.sessions.list()) is not None


def test_without_a_token_it_is_unauthenticated(world: World):
    client = Client(runtime_addr=world.daemon.address)
    with pytest.raises(UnauthenticatedError) as raised:
        run(client.approvals.list(status="pending"))
    assert raised.value.grpc_code == "UNAUTHENTICATED"
    assert isinstance(raised.value, PhronyRuntimeError)


def test_a_viewer_cannot_run_or_cancel(world: World):
    runner = Client(runtime_addr=world.daemon.address, token=world.token("runner-2", "runner"))
    viewer = Client(runtime_addr=world.daemon.address, token=world.token("viewer-1", "viewer"))
    with pytest.raises(PermissionDeniedError):
        run(viewer.run(AGENT, input="hi"))

    async def started_then_denied_cancel():
        session = await runner.run(AGENT, input="hi", conversation=True)
        try:
            await viewer.sessions.cancel(session.id)
        except PermissionDeniedError as error:
            denied = error
        else:
            denied = None
        await runner.sessions.cancel(session.id)
        try:
            await session.wait()
        except SessionCancelledError:
            return denied, "cancelled"
        return denied, "not cancelled"

    denied, outcome = run(started_then_denied_cancel())
    assert denied is not None and outcome == "cancelled"


def test_unknown_ids_are_not_found(world: World):
    client = Client(runtime_addr=world.daemon.address, token=world.token("viewer-2", "viewer"))
    with pytest.raises(NotFoundError):
        run(client.approvals.get("00000000-0000-0000-0000-000000000000"))
    with pytest.raises(NotFoundError):
        run(client.sessions.inspect("run_00000000-0000-0000-0000-000000000000"))


def test_a_token_is_never_sent_in_plaintext_off_loopback():
    with pytest.raises(PhronyError, match="plaintext"):
        Client(runtime_addr="10.1.2.3:7777", token="phr_secret")
    with pytest.raises(PhronyError, match="plaintext"):
        from phrony.worker import Worker

        Worker(worker_id="w", runtime_addr="runtime.internal:7777", token="phr_secret")
    # Loopback is fine (gRPC local credentials), and so is TLS.
    Client(runtime_addr="127.0.0.1:7777", token="phr_secret")
    Client(runtime_addr="https://runtime.internal:7777", token="phr_secret")


def test_a_worker_token_registers_and_no_token_ends_connect_unauthenticated(world: World):
    from phrony.worker import Worker

    async def scenario() -> None:
        worker = Worker(
            worker_id="sdk-auth-worker",
            runtime_addr=world.daemon.address,
            token=world.token("refund-worker", "worker", "--tool", "payments.issue-refund@1.*"),
            handle_signals=False,
        )

        @worker.tool("payments.issue-refund", version="1.0.0")
        async def refund(args: dict, ctx: Any) -> dict:
            return {}

        running = asyncio.ensure_future(worker.connect())
        for _ in range(200):
            if worker.registrations:
                break
            await asyncio.sleep(0.05)
        assert worker.registrations == 1, world.daemon.log()[-2000:]
        await worker.close()
        await asyncio.wait_for(running, 10)

        anonymous = Worker(worker_id="sdk-anon-worker", runtime_addr=world.daemon.address, handle_signals=False)
        anonymous.register_tool(tool="payments.issue-refund", version="1.0.0", handler=lambda a, c: {})
        with pytest.raises(UnauthenticatedError):
            await asyncio.wait_for(anonymous.connect(), 10)

    run(scenario())
