"""Parsing of `namespace/name[@version]` references (agents and bundles)."""

from __future__ import annotations

from collections.abc import Callable


def split_at_first(s: str, sep: str) -> tuple[str, str, bool]:
    """`(before, after, found)` around the first `sep` in `s` (`(s, "", False)` without one)."""
    before, found, after = s.partition(sep)
    return before, after, bool(found)


def parse_namespaced_ref(
    s: str,
    label: str,
    parse_error: Callable[[str], Exception] | type[Exception],
) -> dict[str, str]:
    """`{"namespace", "name", "version"}` of `namespace/name[@version]`; `version` is "" when
    absent. Raises `parse_error(message)` naming `label` and what is wrong."""
    if not isinstance(s, str):
        raise parse_error(f"{label} must be a string like namespace/name[@version], got {type(s).__name__}")
    text = s.strip()
    path, version, has_version = split_at_first(text, "@")
    namespace, name, has_slash = split_at_first(path, "/")
    if not has_slash:
        raise parse_error(f"{label} {s!r} must be namespace/name[@version] (no '/' found)")
    if not namespace:
        raise parse_error(f"{label} {s!r} has an empty namespace")
    if not name:
        raise parse_error(f"{label} {s!r} has an empty name")
    if "/" in name:
        raise parse_error(f"{label} {s!r} has more than one '/'")
    if has_version and not version:
        raise parse_error(f"{label} {s!r} has an empty version after '@'")
    if "@" in version:
        raise parse_error(f"{label} {s!r} has more than one '@'")
    for part in (namespace, name, version):
        if any(c.isspace() for c in part):
            raise parse_error(f"{label} {s!r} contains whitespace")
    return {"namespace": namespace, "name": name, "version": version}
