"""Opening a channel to the runtime."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from phrony.gen.grpc.health.v1 import health_pb2_grpc
from phrony.gen.phrony.runtime.v1 import runtime_pb2_grpc

DEFAULT_RUNTIME_ADDR = "127.0.0.1:7777"

# The runtime's message bound (4 MiB) for requests; answers up to 16 MiB are accepted, like the CLI.
MAX_SEND_BYTES = 4 * 1024 * 1024
MAX_RECEIVE_BYTES = 16 * 1024 * 1024

ChannelOption = tuple[str, Any]


def resolve_runtime_addr(address: str | None = None) -> str:
    """`address`, else `PHRONY_RUNTIME_ADDR`, else `127.0.0.1:7777`."""
    if address and address.strip():
        return address.strip()
    from_env = os.environ.get("PHRONY_RUNTIME_ADDR", "").strip()
    return from_env or DEFAULT_RUNTIME_ADDR


@dataclass
class DialResult:
    channel: aio.Channel
    runtime: runtime_pb2_grpc.RuntimeStub
    health: health_pb2_grpc.HealthStub
    address: str

    async def close(self) -> None:
        await self.channel.close(None)


def default_channel_options() -> list[ChannelOption]:
    return [
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ]


def dial_runtime(
    *,
    address: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    channel_options: Sequence[ChannelOption] | None = None,
) -> DialResult:
    """A channel (secure when `credentials` are given) and the stubs on it. An `http://` or
    `https://` prefix is stripped (the credentials decide whether TLS is used)."""
    target = resolve_runtime_addr(address)
    for scheme in ("http://", "https://"):
        target = target.removeprefix(scheme)
    target = target.rstrip("/")
    options = [*default_channel_options(), *(channel_options or [])]
    channel = (
        aio.secure_channel(target, credentials, options=options)
        if credentials is not None
        else aio.insecure_channel(target, options=options)
    )
    return DialResult(
        channel=channel,
        runtime=runtime_pb2_grpc.RuntimeStub(channel),
        health=health_pb2_grpc.HealthStub(channel),
        address=target,
    )
