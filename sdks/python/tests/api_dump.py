"""Prints the public API of the named modules of whichever `phrony` is importable, as JSON
(used by test_api_surface.py to compare the published 0.1.0 with this SDK)."""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import sys
from typing import Any


def params(fn: Any) -> list[dict[str, Any]] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append({"name": p.name, "kind": p.kind.name, "default": default})
    if out and out[0]["name"] in ("self", "cls"):
        out = out[1:]
    return out


def describe_function(fn: Any) -> dict[str, Any]:
    return {
        "kind": "function",
        "async": inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn),
        "params": params(fn),
    }


def describe_class(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_") and name not in ("__init__", "__aenter__", "__aexit__", "__aiter__", "__anext__"):
            continue
        raw = inspect.getattr_static(cls, name)
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner in (object, dict, Exception, BaseException, ValueError, enum.Enum) or owner is None:
            continue
        if owner.__module__.startswith(("typing", "builtins", "google.", "grpc")):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            members[name] = describe_function(raw.__func__) | {"kind": type(raw).__name__}
        elif isinstance(raw, property):
            members[name] = {"kind": "property", "async": False, "params": None}
        elif inspect.isfunction(raw):
            members[name] = describe_function(raw)
        else:
            members[name] = {"kind": "attribute", "async": False, "params": None}
    info: dict[str, Any] = {
        "kind": "class",
        "bases": sorted(b.__name__ for b in cls.__mro__[1:] if b.__name__ != "object"),
        "members": members,
    }
    if cls.__name__.endswith("Stub"):
        info["rpcs"] = sorted(n for n in vars(cls(_FakeChannel())) if not n.startswith("_"))
    return info


class _FakeChannel:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def describe(module_name: str) -> dict[str, Any]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and not inspect.ismodule(v)
            and (getattr(v, "__module__", module_name) == module_name or not callable(v))
        ]
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(module, name)
        if inspect.isclass(value):
            out[name] = describe_class(value)
        elif inspect.isfunction(value):
            out[name] = describe_function(value)
        elif callable(value) and not hasattr(value, "DESCRIPTOR"):
            out[name] = {"kind": "callable", "async": False, "params": None}
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[name] = {"kind": "value", "value": repr(value)}
        else:
            out[name] = {"kind": "object", "type": type(value).__name__}
    return out


if __name__ == "__main__":
    print(json.dumps({m: describe(m) for m in sys.argv[1:]}, indent=1, sort_keys=True))
