"""Agent references: `namespace/name[@version]`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phrony.ref_parse import parse_namespaced_ref

if TYPE_CHECKING:
    from phrony.types import AgentRef, AgentRefLike


class AgentRefParseError(ValueError):
    """An agent reference that is not `namespace/name[@version]`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_agent_ref(s: str) -> AgentRef:
    """`support/refund-agent@0.1.0` → `{"namespace": "support", "name": "refund-agent", "version": "0.1.0"}`."""
    parsed = parse_namespaced_ref(s, "agent ref", AgentRefParseError)
    return {"namespace": parsed["namespace"], "name": parsed["name"], "version": parsed["version"]}


def format_agent_ref(ref: AgentRefLike) -> str:
    """`namespace/name`, with `@version` when the reference has one."""
    from phrony.types import agent_ref_to_dict

    d = agent_ref_to_dict(ref)
    base = f"{d['namespace']}/{d['name']}"
    return f"{base}@{d['version']}" if d.get("version") else base
