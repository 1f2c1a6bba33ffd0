"""JSON documents travel as UTF-8 JSON `bytes` on the wire."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, cast

T = TypeVar("T")


def json_bytes(value: object) -> bytes:
    """`value` as compact UTF-8 JSON. Raises `TypeError` naming the value's type when it is not
    JSON-serialisable, and `ValueError` for NaN/Infinity (not JSON)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def parse_json_bytes(data: bytes | bytearray | memoryview) -> Any:
    """The JSON value of `data`; empty bytes are `None`. Raises `ValueError` for invalid JSON."""
    raw = bytes(data)
    if not raw:
        return None
    return json.loads(raw.decode("utf-8"))


def parse_json_bytes_as(data: bytes | bytearray | memoryview, typ: type[T]) -> T:
    """`parse_json_bytes`, checked to be an instance of `typ` (`TypeError` otherwise)."""
    value = parse_json_bytes(data)
    if not isinstance(value, typ):
        raise TypeError(f"expected JSON {typ.__name__}, got {type(value).__name__}")
    return cast(T, value)


def json_bytes_map(values: Mapping[str, object]) -> dict[str, bytes]:
    """Each value as UTF-8 JSON bytes."""
    return {k: json_bytes(v) for k, v in values.items()}


def resolved_secrets_map(values: Mapping[str, str | bytes]) -> dict[str, bytes]:
    """Secret values as bytes (strings are UTF-8 encoded, bytes kept as they are)."""
    out: dict[str, bytes] = {}
    for name, value in values.items():
        if isinstance(value, bytes):
            out[name] = value
        elif isinstance(value, str):
            out[name] = value.encode("utf-8")
        else:
            raise TypeError(f"secret {name!r} must be str or bytes, got {type(value).__name__}")
    return out
