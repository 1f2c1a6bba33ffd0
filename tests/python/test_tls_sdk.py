"""The published `phrony` 0.1.0 SDK against a daemon serving TLS (`RUNTIME_TLS_CERT`/`_KEY`) in
`required` mode (`RUNTIME_AUTH=required`).

The SDK's `credentials=` argument takes gRPC channel credentials: SSL trusting the runtime's CA,
composed with access-token call credentials (`authorization: Bearer <token>`), as a deployment
would use them. Tokens come from `phrony-runtime tokens create` on the daemon's database. What
this pins: the transport (the TLS handshake, the CA check, no plaintext fallback) and that the
token travelling over it is checked (a wrong token is UNAUTHENTICATED, a viewer's write is
PERMISSION_DENIED, the right token works). Certificates are generated at test time with
`cryptography`.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from phrony import Phrony
from phrony.client.errors import PhronyRuntimeError
from phrony.client.runtime_client import RuntimeClient

from runtime_daemon import RuntimeDaemon


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_pki(directory: Path, ca_name: str = "phrony python CA") -> dict[str, Path | bytes]:
    """A CA and a server certificate for localhost / 127.0.0.1, written as PEM files."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("phrony-runtime"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    paths = {"ca": directory / "ca.crt", "cert": directory / "server.crt", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca_pem)
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_pem(key))
    return {**paths, "ca_pem": ca_pem}


GREETER = "tls/greeter"
GREETER_YAML = """apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: greeter
  namespace: tls
  version: 0.1.0
spec:
  purpose: Say hello over TLS.
  instructions:
    text: Greet the user.
  model:
    provider: stub
    name: scripted
"""


class TlsWorld:
    """A required-mode TLS daemon and what a test needs around it: its CA and API tokens."""

    def __init__(self, daemon: RuntimeDaemon, pki: dict[str, Path | bytes], runtime_binary: Path, work: Path):
        self.daemon = daemon
        self.pki = pki
        self.runtime_binary = runtime_binary
        self.work = work

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNTIME_", "PHRONY_"))}
        env.update(
            {
                "RUNTIME_DATABASE_URL": f"sqlite://{self.daemon.database}",
                "RUNTIME_LOG": "warn",
                "XDG_DATA_HOME": str(self.work / "xdg"),
                "NO_COLOR": "1",
            }
        )
        return env

    def token(self, name: str, *roles: str) -> str:
        args = [str(self.runtime_binary), "tokens", "create", "--name", name]
        for role in roles:
            args += ["--role", role]
        done = subprocess.run(args, env=self.env(), capture_output=True, text=True, check=True)
        secret = done.stdout.strip().splitlines()[-1]
        assert secret.startswith("phr_"), done.stdout
        return secret

    def credentials(self, token: str) -> grpc.ChannelCredentials:
        """SSL trusting the runtime's CA, with `token` as access-token call credentials."""
        return grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=self.pki["ca_pem"]),
            grpc.access_token_call_credentials(token),
        )


@pytest.fixture(scope="module")
def tls_daemon(runtime_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tls")
    pki = make_pki(work)
    env = {
        "RUNTIME_TLS_CERT": str(pki["cert"]),
        "RUNTIME_TLS_KEY": str(pki["key"]),
        "RUNTIME_ENABLE_STUB_PROVIDER": "1",
        "RUNTIME_AUTH": "required",
    }
    probe = grpc.ssl_channel_credentials(root_certificates=pki["ca_pem"])
    with RuntimeDaemon(runtime_binary, work, extra_env=env, credentials=probe) as daemon:
        yield TlsWorld(daemon, pki, runtime_binary, work)


def _code(err: BaseException) -> str:
    """The gRPC status code name of a failed SDK call."""
    if isinstance(err, PhronyRuntimeError):
        return err.grpc_code
    cause = err.__cause__ if isinstance(err.__cause__, grpc.RpcError) else err
    return cause.code().name if isinstance(cause, grpc.RpcError) else f"not a gRPC error: {err!r}"


def test_the_access_token_sent_over_ssl_is_checked(tls_daemon: TlsWorld) -> None:
    world = tls_daemon
    viewer = world.token("tls-viewer", "viewer")

    async def read(credentials: grpc.ChannelCredentials) -> str:
        client = await RuntimeClient.connect(address=world.daemon.address, credentials=credentials)
        try:
            version = await client.get_version()
            assert version.version, version
            agents = await client.list_agents()
            assert list(agents.agents) == []
            return "OK"
        except Exception as err:  # the SDK wraps grpc errors in its own type
            return _code(err)
        finally:
            await client.close()

    async def run(credentials: grpc.ChannelCredentials) -> str:
        phrony = Phrony(runtime_addr=world.daemon.address, credentials=credentials)
        try:
            await asyncio.wait_for(phrony.agent(GREETER).run(input="hi"), timeout=60)
            return "OK"
        except Exception as err:
            return _code(err)
        finally:
            await phrony.close()

    # A token the runtime never issued, and one shaped like no token at all.
    assert asyncio.run(read(world.credentials("phr_" + "x" * 43))) == "UNAUTHENTICATED"
    assert asyncio.run(read(world.credentials("not-a-token"))) == "UNAUTHENTICATED"
    # SSL alone (no token): the transport is fine, the call is not authenticated.
    ssl_only = grpc.ssl_channel_credentials(root_certificates=world.pki["ca_pem"])
    assert asyncio.run(read(ssl_only)) == "UNAUTHENTICATED"
    # The viewer's token reads, and its write (starting a session) is refused.
    assert asyncio.run(read(world.credentials(viewer))) == "OK"
    assert asyncio.run(run(world.credentials(viewer))) == "PERMISSION_DENIED"


def test_plaintext_and_an_untrusted_ca_get_no_answer(tls_daemon: TlsWorld, tmp_path: Path) -> None:
    daemon = tls_daemon.daemon
    rogue = make_pki(tmp_path, "rogue CA")

    async def attempt(credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
        client = await RuntimeClient.connect(address=daemon.address, credentials=credentials)
        try:
            await asyncio.wait_for(client.get_version(), timeout=10)
        except Exception as err:  # the SDK wraps grpc errors in its own type
            cause = err.__cause__ if isinstance(err.__cause__, grpc.RpcError) else err
            return cause.code() if isinstance(cause, grpc.RpcError) else grpc.StatusCode.UNKNOWN
        finally:
            await client.close()
        return grpc.StatusCode.OK

    assert asyncio.run(attempt(None)) != grpc.StatusCode.OK
    untrusted = grpc.ssl_channel_credentials(root_certificates=rogue["ca_pem"])
    assert asyncio.run(attempt(untrusted)) == grpc.StatusCode.UNAVAILABLE


def test_a_session_runs_over_tls_through_the_cli_and_the_published_sdk(
    tls_daemon: TlsWorld, cli_binary: Path, tmp_path: Path
) -> None:
    """Required mode over TLS: the CLI publishes and deploys with PHRONY_TLS_CA and a publisher
    token, the SDK runs a session to completion over the SSL channel with a runner token."""
    world = tls_daemon
    daemon, pki = world.daemon, world.pki
    publisher = world.token("tls-publisher", "publisher")
    runner = world.token("tls-runner", "runner")
    project = tmp_path / "greeter"
    project.mkdir()
    (project / "agent.yaml").write_text(GREETER_YAML)
    turns = [[{"type": "text_delta", "text": "Hello over TLS."}, {"type": "completed", "stop_reason": "end_turn"}]]
    (project / "stub-script.json").write_text(json.dumps({"turns": turns}))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PHRONY_", "RUNTIME_"))
    } | {
        "PHRONY_RUNTIME_ADDR": daemon.address,
        "PHRONY_TLS_CA": str(pki["ca"]),
        "PHRONY_TOKEN": publisher,
        "NO_COLOR": "1",
    }
    for args in (["agents", "publish", "./agent.yaml"], ["agents", "deploy", f"{GREETER}@0.1.0"]):
        done = subprocess.run(
            [str(cli_binary), *args], cwd=project, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"phrony {args}: {done.stdout}\n{done.stderr}"

    async def scenario():
        phrony = Phrony(runtime_addr=daemon.address, credentials=world.credentials(runner))
        try:
            return await asyncio.wait_for(phrony.agent(GREETER).run(input="hi"), timeout=60)
        finally:
            await phrony.close()

    result = asyncio.run(scenario())
    assert result.output["message"] == "Hello over TLS.", result
    # The session is recorded as the runner's (verified: the bare name).
    env["PHRONY_TOKEN"] = runner
    done = subprocess.run(
        [str(cli_binary), "sessions", "ls", "--output", "json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )
    (session,) = json.loads(done.stdout)["sessions"]
    assert session["started_by"] == {
        "actor": "tls-runner", "verification": "token", "via": None, "display": "tls-runner"
    }, session
