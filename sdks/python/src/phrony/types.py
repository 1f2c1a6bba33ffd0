"""Plain-data types shared by the SDK, and conversions from/to the generated messages."""

from __future__ import annotations

from typing import Any, TypedDict

from phrony.gen.phrony.runtime.v1 import runtime_pb2


class AgentRef(TypedDict):
    namespace: str
    name: str
    version: str


class BundleRef(TypedDict):
    namespace: str
    name: str
    version: str


class GetVersionResponse(TypedDict):
    version: str
    schema_version: str


class RunSessionResponse(TypedDict, total=False):
    session_id: str
    agent_version_id: str
    status: str


AgentRefLike = str | AgentRef | runtime_pb2.AgentRef
BundleRefLike = str | BundleRef | runtime_pb2.BundleRef


def _ref_fields(value: Any, kind: str) -> tuple[str, str, str]:
    if isinstance(value, str):
        if kind == "agent":
            from phrony.agent_ref import parse_agent_ref

            d: Any = parse_agent_ref(value)
        else:
            from phrony.bundle_ref import parse_bundle_ref

            d = parse_bundle_ref(value)
        return d["namespace"], d["name"], d["version"]
    if isinstance(value, (runtime_pb2.AgentRef, runtime_pb2.BundleRef)):
        return value.namespace, value.name, value.version
    if isinstance(value, dict):
        try:
            return str(value["namespace"]), str(value["name"]), str(value.get("version") or "")
        except KeyError as missing:
            raise ValueError(f"{kind} ref {value!r} has no {missing.args[0]!r}") from None
    raise TypeError(f"{kind} ref must be a string, a dict or a runtime_pb2 message, got {type(value).__name__}")


def coerce_agent_ref(value: AgentRefLike) -> runtime_pb2.AgentRef:
    """Any agent reference form as the wire message."""
    namespace, name, version = _ref_fields(value, "agent")
    return runtime_pb2.AgentRef(namespace=namespace, name=name, version=version)


def coerce_bundle_ref(value: BundleRefLike) -> runtime_pb2.BundleRef:
    """Any bundle reference form as the wire message."""
    namespace, name, version = _ref_fields(value, "bundle")
    return runtime_pb2.BundleRef(namespace=namespace, name=name, version=version)


def agent_ref_to_dict(ref: AgentRefLike) -> AgentRef:
    namespace, name, version = _ref_fields(ref, "agent")
    return {"namespace": namespace, "name": name, "version": version}


def bundle_ref_to_dict(ref: BundleRefLike) -> BundleRef:
    namespace, name, version = _ref_fields(ref, "bundle")
    return {"namespace": namespace, "name": name, "version": version}


def _usage(u: runtime_pb2.TokenUsage) -> dict[str, Any]:
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "total_tokens": u.total_tokens,
        "estimated": u.estimated,
    }


def conversation_message_to_dict(msg: runtime_pb2.InteractiveConversationMessage) -> dict[str, Any]:
    """One history entry of `session_started` as a dict."""
    entry: dict[str, Any] = {"role": msg.role, "content": msg.content}
    if msg.stop_reason:
        entry["stop_reason"] = msg.stop_reason
    if msg.HasField("turn_usage"):
        entry["turn_usage"] = _usage(msg.turn_usage)
    if msg.turn_duration_ms:
        entry["turn_duration_ms"] = msg.turn_duration_ms
    return entry


def stats_to_dict(stats: runtime_pb2.InteractiveSessionStats) -> dict[str, Any]:
    return {"turn": stats.turn, "turn_usage": _usage(stats.turn_usage), "session_usage": _usage(stats.session_usage)}
