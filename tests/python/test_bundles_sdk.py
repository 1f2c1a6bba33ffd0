"""Bundles through the PUBLISHED Python SDK (`phrony` 0.1.0): `Phrony(...).bundle(ref)`.

The reference runtime refuses the SDK's bundle paths (an interactive start with `bundle_ref` is
`InvalidArgument`), so `PhronyBundle.run()` never worked there. Here the real CLI locks,
publishes and deploys the `refund-desk` bundle of `tests/fixtures/bundles/` (two agents on the
scripted `stub` model sharing the secret `crm`), and the SDK runs its root member three ways:
`run()` (an interactive start that waits for the end), `run(wait=False)` (`RunSession`) and
`run_interactive()`; `ListSessions` reports each as a bundle session of that version.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from pathlib import Path

import pytest

from phrony import Phrony
from phrony.client.errors import PhronyRuntimeError
from phrony.client.runtime_client import RuntimeClient
from phrony.gen.phrony.runtime.v1 import runtime_pb2

from runtime_daemon import RuntimeDaemon
from tutorial_env import PATIENCE, PhronyCli

REPO_ROOT = Path(__file__).resolve().parents[2]
DESK = REPO_ROOT / "tests" / "fixtures" / "bundles" / "refund-desk"
BUNDLE = "support/refund-desk"
SECRETS = {"crm": "crm-token-never-shown"}
FINAL_TEXT = "The refund specialist says ORD-7 can be refunded."


@pytest.fixture(scope="module")
def desk(runtime_binary: Path, cli_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    """A daemon with the bundle published and deployed by the CLI; yields (daemon, cli)."""
    workdir = tmp_path_factory.mktemp("bundles")
    project = workdir / "refund-desk"
    shutil.copytree(DESK, project)
    env = {"RUNTIME_ENABLE_STUB_PROVIDER": "1", "RUNTIME_SECRETS_ENCRYPTION_KEY": secrets.token_hex(32)}
    (workdir / "runtime").mkdir()
    with RuntimeDaemon(runtime_binary, workdir / "runtime", env) as daemon:
        cli = PhronyCli(cli_binary, daemon.address, workdir / "home", "unused")
        cli("bundles", "lock", "./bundle.yaml", cwd=project)
        published = cli("bundles", "publish", "./bundle.yaml", cwd=project, actor="release-bot")
        assert published.stdout.startswith(f"{BUNDLE} 1.0.0 (sha256:"), published.stdout
        cli("bundles", "deploy", f"{BUNDLE}@1.0.0", actor="ops")
        yield daemon


def sdk(address: str, scenario):
    async def main():
        phrony = Phrony(runtime_addr=address)
        try:
            return await asyncio.wait_for(scenario(phrony), PATIENCE)
        finally:
            await phrony.close()

    return asyncio.run(main())


def bundle_sessions(address: str) -> list[runtime_pb2.SessionSummary]:
    async def scenario(_phrony: Phrony):
        client = await RuntimeClient.connect(address=address)
        try:
            reply = await client.list_sessions(runtime_pb2.ListSessionsRequest(kind="bundle"))
        finally:
            await client.close()
        return list(reply.sessions)

    return sdk(address, scenario)


def test_run_waits_for_the_root_member_to_finish(desk: RuntimeDaemon):
    result = sdk(
        desk.address,
        lambda p: p.bundle(BUNDLE).run(input={"message": "Can I get a refund for ORD-7?"}, resolved_secrets=SECRETS),
    )
    assert result.output["message"] == FINAL_TEXT, result
    assert result.stop_reason == "end_turn"
    listed = {s.id: s for s in bundle_sessions(desk.address)}
    summary = listed[result.session_id]
    assert summary.kind == "bundle"
    assert (summary.bundle_ref.namespace, summary.bundle_ref.name, summary.bundle_ref.version) == (
        "support",
        "refund-desk",
        "1.0.0",
    )
    assert SECRETS["crm"] not in desk.log()


def test_run_without_waiting_and_an_explicit_version(desk: RuntimeDaemon):
    started = sdk(
        desk.address,
        lambda p: p.bundle(f"{BUNDLE}@1.0.0").run(input={"message": "ORD-7?"}, resolved_secrets=SECRETS, wait=False),
    )
    assert started.status == "running"
    assert started.session_id in {s.id for s in bundle_sessions(desk.address)}


def test_the_bundle_checks_apply_to_sdk_runs(desk: RuntimeDaemon):
    with pytest.raises(PhronyRuntimeError) as missing:
        sdk(desk.address, lambda p: p.bundle(BUNDLE).run(input={"message": "hi"}, resolved_secrets={}, wait=False))
    assert 'missing resolved secrets: "crm"' in str(missing.value)
    with pytest.raises(PhronyRuntimeError) as inactive:
        sdk(
            desk.address,
            lambda p: p.bundle(f"{BUNDLE}@2.0.0").run(input={"message": "hi"}, resolved_secrets=SECRETS, wait=False),
        )
    assert 'version "2.0.0" is not the active bundle deployment (active: "1.0.0")' in str(inactive.value)


def test_run_interactive_streams_the_root_members_turn(desk: RuntimeDaemon):
    async def scenario(phrony: Phrony):
        session = await phrony.bundle(BUNDLE).run_interactive(input={"message": "ORD-7?"}, resolved_secrets=SECRETS)
        seen = []
        try:
            async for event in session.events():
                seen.append(event)
                if event["type"] in ("completed", "failed", "cancelled", "awaiting_input"):
                    break
        finally:
            await session.close()
        return seen

    seen = sdk(desk.address, scenario)
    kinds = [e["type"] for e in seen if e["type"] != "text_delta"]
    assert kinds[0] == "session_started", kinds
    assert kinds[-1] == "completed", seen
    assert FINAL_TEXT in "".join(e["delta"] for e in seen if e["type"] == "text_delta")
