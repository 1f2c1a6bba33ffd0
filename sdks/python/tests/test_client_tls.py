"""`Client` and `Worker` over TLS (`tls_ca=`, or `PHRONY_TLS_CA`) to a required-mode daemon that
serves TLS only (`RUNTIME_TLS_CERT` / `RUNTIME_TLS_KEY`): with the right CA and a token they
work; a CA that did not sign the runtime's certificate, or plaintext, gets no answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from phrony import Client, UnavailableError
from phrony.worker import Worker

from runtime_daemon import RuntimeDaemon
from test_tls_sdk import TlsWorld, make_pki


@pytest.fixture(scope="module")
def tls_world(runtime_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("client-tls")
    pki = make_pki(work)
    env = {"RUNTIME_TLS_CERT": str(pki["cert"]), "RUNTIME_TLS_KEY": str(pki["key"]), "RUNTIME_AUTH": "required"}
    probe = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
    with RuntimeDaemon(runtime_binary, work, extra_env=env, credentials=probe) as daemon:
        yield TlsWorld(daemon, pki, runtime_binary, work)


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PHRONY_TOKEN", "PHRONY_TLS_CA", "PHRONY_TLS_CERT", "PHRONY_TLS_KEY", "PHRONY_ACTOR"):
        monkeypatch.delenv(name, raising=False)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_right_ca_and_a_token_work(tls_world: TlsWorld, monkeypatch: pytest.MonkeyPatch):
    token = tls_world.token("tls-viewer", "viewer")
    client = Client(runtime_addr=tls_world.daemon.address, tls_ca=tls_world.pki["ca"], token=token)
    assert run(client.sessions.list()) == []
    # The same from the CLI's variables, with an https:// address.
    monkeypatch.setenv("PHRONY_TLS_CA", str(tls_world.pki["ca"]))
    monkeypatch.setenv("PHRONY_TOKEN", token)
    assert run(Client(runtime_addr=f"https://{tls_world.daemon.address}").approvals.list()) == []


def test_an_untrusted_ca_or_plaintext_gets_no_answer(tls_world: TlsWorld, tmp_path: Path):
    rogue = make_pki(tmp_path, "rogue CA")
    untrusted = Client(runtime_addr=tls_world.daemon.address, tls_ca=rogue["ca"], token="phr_x")
    with pytest.raises(UnavailableError):
        run(untrusted.sessions.list())
    plaintext = Client(runtime_addr=tls_world.daemon.address)
    with pytest.raises(UnavailableError):
        run(plaintext.sessions.list())


def test_a_worker_registers_over_tls(tls_world: TlsWorld):
    # TlsWorld.token takes roles only; a worker token needs its tool patterns.
    import subprocess

    done = subprocess.run(
        [str(tls_world.runtime_binary), "tokens", "create", "--name", "tls-worker", "--role", "worker",
         "--tool", "orders.lookup-order@1.*"],
        env=tls_world.env(), capture_output=True, text=True, check=True,
    )
    token = done.stdout.strip().splitlines()[-1]

    async def scenario() -> int:
        worker = Worker(
            worker_id="tls-worker-1",
            runtime_addr=tls_world.daemon.address,
            tls_ca=tls_world.pki["ca"],
            token=token,
            handle_signals=False,
        )
        worker.register_tool(tool="orders.lookup-order", version="1.0.0", handler=lambda a, c: {})
        running = asyncio.ensure_future(worker.connect())
        for _ in range(200):
            if worker.registrations or running.done():
                break
            await asyncio.sleep(0.05)
        registrations = worker.registrations
        await worker.close()
        await asyncio.wait_for(running, 10)
        return registrations

    assert run(scenario()) == 1, tls_world.daemon.log()[-2000:]
