"""The published SDK's worker side (`phrony.worker`) against the real `phrony-runtime` daemon.

Nothing can dispatch a tool call from outside the daemon until sessions exist, so the calls
themselves (result, tool error, internal error, cancel, late result) are exercised with the same
SDK worker by `crates/phrony-grpc/tests/grpc/sdk_worker.rs`, which runs the server in-process. Here the
real binary proves the rest of the contract: the SDK worker registers, keeps its lease alive with
its heartbeats, gets the reference's statuses for protocol errors, and returns cleanly from
`Worker.connect()` when the daemon is stopped.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from phrony.client.runtime_client import RuntimeClient
from phrony.gen.phrony.runtime.v1 import runtime_pb2

from runtime_daemon import RuntimeDaemon

WORKER = Path(__file__).resolve().parent / "workers" / "refund_worker.py"


def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_sdk_worker_stays_registered_and_daemon_shutdown_ends_it_cleanly(runtime_binary, tmp_path):
    # A 2 s lease: the SDK heartbeats every second, so staying registered for longer than the
    # lease proves the heartbeats renew it.
    with RuntimeDaemon(runtime_binary, tmp_path, {"RUNTIME_WORKER_LEASE_TTL": "2s"}) as daemon:
        worker = subprocess.Popen(
            [sys.executable, str(WORKER), "py-worker-1"],
            env={**os.environ, "PHRONY_RUNTIME_ADDR": daemon.address},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: "work stream open" in daemon.log() and "py-worker-1" in daemon.log(), "registration")
            time.sleep(3.5)
            assert worker.poll() is None, "the SDK worker ended while the daemon was running"
            log = daemon.log()
            assert "lease of worker" not in log and "tool worker removed" not in log, log

            assert daemon.stop() == 0, daemon.log()
            stdout, stderr = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    assert worker.returncode == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    assert stdout.splitlines()[-1:] == ["stream closed"], stdout
    assert "work stream closed: the runtime is stopping" in daemon.log()


async def first_reply(address: str, first: runtime_pb2.WorkClientMsg) -> tuple[str, str]:
    """Opens a Work stream with the SDK's client, sends `first`, and returns the final status."""
    client = await RuntimeClient.connect(address=address)
    try:
        stream = client.work()
        await stream.write(first)
        try:
            async for _ in stream:
                pass
        except grpc.aio.AioRpcError as error:
            return error.code().name, error.details()
        return "OK", ""
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("first", "code", "details"),
    [
        (
            runtime_pb2.WorkClientMsg(heartbeat=runtime_pb2.WorkHeartbeat()),
            "FAILED_PRECONDITION",
            "register before heartbeat",
        ),
        (
            runtime_pb2.WorkClientMsg(result=runtime_pb2.WorkToolResult(call_id="c1")),
            "FAILED_PRECONDITION",
            "register before result",
        ),
        (
            runtime_pb2.WorkClientMsg(register=runtime_pb2.WorkRegister(worker_id="")),
            "INVALID_ARGUMENT",
            "worker_id is required",
        ),
        (
            runtime_pb2.WorkClientMsg(),
            "INVALID_ARGUMENT",
            "register message is required",
        ),
    ],
    ids=["heartbeat-first", "result-first", "empty-worker-id", "empty-message"],
)
def test_protocol_errors_before_register_have_the_reference_statuses(runtime_daemon, first, code, details):
    assert asyncio.run(first_reply(runtime_daemon.address, first)) == (code, details)
