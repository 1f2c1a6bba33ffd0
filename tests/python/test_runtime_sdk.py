"""The published Python SDK (`phrony` 0.1.0) drives the real daemon.

The SDK's `RuntimeClient` is the contract: every call below is made exactly the way an SDK user
makes it, against `phrony-runtime` on a free port with a fresh SQLite database. Publishing uses
the SDK's own generated request type with a snapshot our compiler produced
(`fixtures/refund-agent.snapshot.json`, kept in sync with `fixtures/refund-agent/` by
`bins/runtime/tests/sdk_fixture.rs`).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from proto_compat import compile_proto, wire_differences

from phrony.client.errors import PhronyRuntimeError
from phrony.client.runtime_client import RuntimeClient
from phrony.gen.grpc.health.v1 import health_pb2
from phrony.gen.phrony.runtime.v1 import runtime_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
HEALTH_PROTO_ROOT = REPO_ROOT / "crates" / "phrony-grpc" / "proto"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SNAPSHOT = FIXTURES / "refund-agent.snapshot.json"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def snapshot(name: str, version: str, purpose: str | None = None) -> bytes:
    """The fixture snapshot as agent `support/<name>@<version>`, still in canonical form.

    The canonical form is compact JSON with fields in the compiler's order; Python keeps key
    order, and the fixture has no characters the compiler escapes, so re-encoding it compactly
    reproduces the compiler's bytes.
    """
    document = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    document["metadata"]["name"] = name
    document["metadata"]["version"] = version
    if purpose is not None:
        document["spec"]["purpose"] = purpose
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def agent_ref(name: str, version: str = "") -> runtime_pb2.AgentRef:
    return runtime_pb2.AgentRef(namespace="support", name=name, version=version)


def run(address: str, scenario: Callable[[RuntimeClient], Awaitable[Any]]) -> Any:
    """Runs `scenario` with a connected SDK client."""

    async def main() -> Any:
        client = await RuntimeClient.connect(address=address)
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(main())


async def publish(client: RuntimeClient, manifest: bytes, actor: str = "sdk-test") -> runtime_pb2.PublishResponse:
    return await client.publish(runtime_pb2.PublishRequest(manifest=manifest, actor=actor))


def test_the_snapshot_fixture_is_canonical_json():
    raw = SNAPSHOT.read_bytes()
    assert snapshot("refund-agent", "0.1.0") == raw.rstrip(b"\n")


def test_get_version(runtime_daemon, runtime_binary):
    reply = run(runtime_daemon.address, lambda c: c.get_version())
    released = subprocess.run([str(runtime_binary), "--version"], capture_output=True, text=True, check=True)
    assert released.stdout.strip() == f"phrony-runtime {reply.version}"
    assert reply.schema_version.isdigit()


def test_our_health_proto_is_wire_compatible_with_the_sdk():
    ours = compile_proto(HEALTH_PROTO_ROOT, "grpc/health/v1/health.proto")
    assert wire_differences(health_pb2.DESCRIPTOR, ours) == []


def test_health_check_list_and_watch_through_the_sdk_stub(runtime_daemon):
    runtime_service = "phrony.runtime.v1.Runtime"

    async def scenario(client: RuntimeClient):
        health = client.health()
        whole = await health.Check(health_pb2.HealthCheckRequest(service=""))
        runtime = await health.Check(health_pb2.HealthCheckRequest(service=runtime_service))
        listed = await health.List(health_pb2.HealthListRequest())
        watch = health.Watch(health_pb2.HealthCheckRequest(service=runtime_service))
        first = await watch.read()
        watch.cancel()
        try:
            await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        except Exception as error:  # grpc.aio.AioRpcError
            unknown = error.code().name
        else:
            unknown = "OK"
        return whole.status, runtime.status, dict(listed.statuses), first.status, unknown

    serving = health_pb2.HealthCheckResponse.SERVING
    whole, runtime, listed, first, unknown = run(runtime_daemon.address, scenario)
    assert (whole, runtime, first) == (serving, serving, serving)
    assert listed == {"": serving, runtime_service: serving}
    assert unknown == "NOT_FOUND"


def test_publish_then_list_and_read_back(runtime_daemon):
    manifest = snapshot("catalog-agent", "1.2.0")

    async def scenario(client: RuntimeClient):
        published = await publish(client, manifest)
        again = await publish(client, manifest, actor="someone-else")
        agents = await client.list_agents()
        in_namespace = await client.list_agents(runtime_pb2.ListAgentsRequest(namespace="support"))
        elsewhere = await client.list_agents(runtime_pb2.ListAgentsRequest(namespace="billing"))
        versions = await client.list_agent_versions(
            runtime_pb2.ListAgentVersionsRequest(agent_ref=agent_ref("catalog-agent"))
        )
        stored = await client.get_agent_version(
            runtime_pb2.GetAgentVersionRequest(agent_ref=agent_ref("catalog-agent", "1.2.0"))
        )
        return published, again, agents, in_namespace, elsewhere, versions, stored

    published, again, agents, in_namespace, elsewhere, versions, stored = run(runtime_daemon.address, scenario)

    assert (published.namespace, published.name, published.version) == ("support", "catalog-agent", "1.2.0")
    assert SHA256_HEX.match(published.content_hash)
    assert published.agent_id and published.version_id
    # Re-publishing identical content is an idempotent success returning the same version.
    # (The two responses differ only in `created`, a phrony-rs addition the SDK does not know.)
    fields = lambda r: (r.agent_id, r.version_id, r.content_hash, r.namespace, r.name, r.version)
    assert fields(again) == fields(published)

    listed = {(a.namespace, a.name): a for a in agents.agents}
    agent = listed[("support", "catalog-agent")]
    assert agent.id == published.agent_id
    assert agent.owner == "payments-team"
    assert agent.archived_at == ""
    assert ("support", "catalog-agent") in {(a.namespace, a.name) for a in in_namespace.agents}
    assert list(elsewhere.agents) == []

    assert [(v.id, v.version, v.content_hash) for v in versions.versions] == [
        (published.version_id, "1.2.0", published.content_hash)
    ]
    assert TIMESTAMP.match(versions.versions[0].deployed_at)
    assert versions.versions[0].deprecated_at == "" and versions.versions[0].retired_at == ""

    assert stored.manifest == manifest
    assert json.loads(stored.manifest)["metadata"]["name"] == "catalog-agent"
    assert stored.content_hash == published.content_hash
    assert stored.version == "1.2.0"
    assert TIMESTAMP.match(stored.published_at)
    assert stored.deprecated_at == "" and stored.retired_at == ""


def test_deploy_and_rollback(runtime_daemon):
    name = "rollout-agent"

    async def scenario(client: RuntimeClient):
        for version in ("0.1.0", "0.2.0", "0.3.0"):
            await publish(client, snapshot(name, version, purpose=f"Refunds, release {version}."))
        first = await client.deploy(runtime_pb2.DeployRequest(agent_ref=agent_ref(name, "0.1.0"), actor="alice"))
        second = await client.deploy(runtime_pb2.DeployRequest(agent_ref=agent_ref(name, "0.2.0"), actor="bob"))
        active = await client.get_active_version(runtime_pb2.GetActiveVersionRequest(agent_ref=agent_ref(name)))
        back = await client.rollback(runtime_pb2.RollbackRequest(agent_ref=agent_ref(name), actor="carol"))
        forward = await client.rollback(
            runtime_pb2.RollbackRequest(agent_ref=agent_ref(name), to_version="0.3.0", actor="carol")
        )
        after = await client.get_active_version(runtime_pb2.GetActiveVersionRequest(agent_ref=agent_ref(name)))
        history = await client.list_deployments(runtime_pb2.ListDeploymentsRequest(agent_ref=agent_ref(name)))
        return first, second, active, back, forward, after, history

    first, second, active, back, forward, after, history = run(runtime_daemon.address, scenario)

    assert (first.namespace, first.name, first.version, first.previous_version) == ("support", name, "0.1.0", "")
    assert TIMESTAMP.match(first.deployed_at)
    assert (second.version, second.previous_version) == ("0.2.0", "0.1.0")
    assert (active.version, active.actor) == ("0.2.0", "bob")
    assert TIMESTAMP.match(active.deployed_at)
    assert (back.version, back.previous_version) == ("0.1.0", "0.2.0")
    assert (forward.version, forward.previous_version) == ("0.3.0", "0.1.0")
    assert (after.version, after.actor) == ("0.3.0", "carol")
    assert [(d.version, d.action, d.actor) for d in history.deployments] == [
        ("0.3.0", "rollback", "carol"),
        ("0.1.0", "rollback", "carol"),
        ("0.2.0", "deploy", "bob"),
        ("0.1.0", "deploy", "alice"),
    ]
    assert all(TIMESTAMP.match(d.created_at) for d in history.deployments)


def test_refusals_reach_the_sdk_with_their_grpc_codes(runtime_daemon):
    name = "strict-agent"

    async def expect_error(call: Awaitable[Any]) -> PhronyRuntimeError:
        with pytest.raises(PhronyRuntimeError) as caught:
            await call
        return caught.value

    async def scenario(client: RuntimeClient):
        await publish(client, snapshot(name, "1.0.0"))
        changed = await expect_error(publish(client, snapshot(name, "1.0.0", purpose="Something else.")))
        tampered = await expect_error(publish(client, snapshot(name, "1.1.0") + b" "))
        unknown = await expect_error(
            client.deploy(runtime_pb2.DeployRequest(agent_ref=agent_ref(name, "9.9.9"), actor="sdk-test"))
        )
        nothing_active = await expect_error(
            client.rollback(runtime_pb2.RollbackRequest(agent_ref=agent_ref(name), actor="sdk-test"))
        )
        undeployed = await expect_error(client.run_session(agent_ref=f"support/{name}", input={"message": "hi"}))
        return changed, tampered, unknown, nothing_active, undeployed

    changed, tampered, unknown, nothing_active, undeployed = run(runtime_daemon.address, scenario)
    assert changed.grpc_code == "ALREADY_EXISTS" and '"1.0.0"' in changed.details
    assert tampered.grpc_code == "INVALID_ARGUMENT" and "canonical form" in tampered.details
    assert unknown.grpc_code == "NOT_FOUND"
    assert unknown.details == f'no published version "9.9.9" for agent support/{name}'
    assert str(unknown) == f'deploy agent: no published version "9.9.9" for agent support/{name} (NOT_FOUND)'
    assert nothing_active.grpc_code == "FAILED_PRECONDITION"
    assert undeployed.grpc_code == "FAILED_PRECONDITION"
    assert undeployed.details == f"no active deployment for agent support/{name}"
