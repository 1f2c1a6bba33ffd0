"""The low-level runtime client (one method per RPC) and its helpers."""

from phrony.client.dial import DEFAULT_RUNTIME_ADDR, DialResult, dial_runtime, resolve_runtime_addr
from phrony.client.errors import PhronyRuntimeError, wrap_rpc_error
from phrony.client.json_bytes import json_bytes, json_bytes_map, parse_json_bytes, resolved_secrets_map
from phrony.client.runtime_client import RuntimeClient

__all__ = [
    "DEFAULT_RUNTIME_ADDR",
    "DialResult",
    "PhronyRuntimeError",
    "RuntimeClient",
    "dial_runtime",
    "json_bytes",
    "json_bytes_map",
    "parse_json_bytes",
    "resolve_runtime_addr",
    "resolved_secrets_map",
    "wrap_rpc_error",
]
