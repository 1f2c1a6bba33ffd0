"""`required` auth mode through the PUBLISHED Python SDK (`phrony` 0.1.0), unchanged.

The daemon runs with `RUNTIME_AUTH=required`; tokens come from `phrony-runtime tokens create`
on its database. The SDK sends a token the way gRPC does, with call credentials over a channel
that allows them on a loopback address:

    Phrony.connect(runtime_addr=..., credentials=grpc.composite_channel_credentials(
        grpc.local_channel_credentials(), grpc.access_token_call_credentials(token)))

A runner's session runs to completion; without a token (or with a viewer's) the runtime refuses
with UNAUTHENTICATED (PERMISSION_DENIED).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from phrony import Phrony
from phrony.client.errors import PhronyRuntimeError

from runtime_daemon import RuntimeDaemon

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


def token_credentials(token: str) -> grpc.ChannelCredentials:
    return grpc.composite_channel_credentials(
        grpc.local_channel_credentials(), grpc.access_token_call_credentials(token)
    )


class World:
    def __init__(self, daemon: RuntimeDaemon, runtime_binary: Path, cli_binary: Path, workdir: Path):
        self.daemon = daemon
        self.runtime_binary = runtime_binary
        self.cli_binary = cli_binary
        self.workdir = workdir

    def _env(self) -> dict[str, str]:
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

    def token(self, name: str, *roles: str) -> str:
        args = [str(self.runtime_binary), "tokens", "create", "--name", name]
        for role in roles:
            args += ["--role", role]
        done = subprocess.run(args, env=self._env(), capture_output=True, text=True, check=True)
        secret = done.stdout.strip().splitlines()[-1]
        assert secret.startswith("phr_"), done.stdout
        return secret

    def cli(self, token: str, *args: str) -> str:
        env = self._env()
        env.update({"PHRONY_RUNTIME_ADDR": self.daemon.address, "PHRONY_TOKEN": token})
        done = subprocess.run(
            [str(self.cli_binary), *args], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"phrony {args}: {done.stdout}\n{done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def world(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("access")
    agent_dir = workdir / "agent"
    agent_dir.mkdir()
    (agent_dir / "agent.yaml").write_text(AGENT_YAML)
    turns = [[{"type": "text_delta", "text": "Hello from a verified runner."},
              {"type": "completed", "stop_reason": "end_turn"}]] * 4
    (agent_dir / "stub-script.json").write_text(json.dumps({"turns": turns}))
    extra = {"RUNTIME_AUTH": "required", "RUNTIME_ENABLE_STUB_PROVIDER": "1"}
    with RuntimeDaemon(runtime_binary, workdir, extra_env=extra) as daemon:
        w = World(daemon, runtime_binary, cli_binary, workdir)
        publisher = w.token("sdk-publisher", "publisher")
        w.cli(publisher, "agents", "publish", str(agent_dir / "agent.yaml"))
        w.cli(publisher, "agents", "deploy", f"{AGENT}@0.1.0")
        yield w


def test_a_runner_token_runs_a_session_through_the_published_sdk(world: World):
    runner = world.token("sdk-runner", "runner")

    async def scenario():
        phrony = await Phrony.connect(runtime_addr=world.daemon.address, credentials=token_credentials(runner))
        try:
            return await asyncio.wait_for(phrony.agent(AGENT).run(input="hi"), 60)
        finally:
            await phrony.close()

    result = asyncio.run(scenario())
    assert "Hello from a verified runner." in json.dumps(str(result))
    listed = world.cli(runner, "sessions", "ls")
    assert "support/hello-agent@0.1.0" in listed


def test_no_token_is_unauthenticated_and_a_viewer_cannot_run(world: World):
    viewer = world.token("sdk-viewer", "viewer")

    async def attempt(credentials: grpc.ChannelCredentials | None) -> str:
        phrony = await Phrony.connect(runtime_addr=world.daemon.address, credentials=credentials)
        try:
            await phrony.agent(AGENT).run(input="hi")
        except PhronyRuntimeError as error:
            return error.grpc_code
        finally:
            await phrony.close()
        raise AssertionError("the runtime accepted the run")

    assert asyncio.run(attempt(None)) == "UNAUTHENTICATED"
    assert asyncio.run(attempt(token_credentials(viewer))) == "PERMISSION_DENIED"
    revoked = world.token("sdk-revoked", "runner")
    done = subprocess.run(
        [str(world.runtime_binary), "tokens", "revoke", "sdk-revoked"],
        env=world._env(), capture_output=True, text=True, check=True,
    )
    assert "revoked" in done.stdout
    assert asyncio.run(attempt(token_credentials(revoked))) == "UNAUTHENTICATED"
