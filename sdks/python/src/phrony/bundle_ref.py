"""Bundle references: `namespace/name[@version]` (a semver or a `sha256:` lock hash)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phrony.ref_parse import parse_namespaced_ref

if TYPE_CHECKING:
    from phrony.types import BundleRef, BundleRefLike


class BundleRefParseError(ValueError):
    """A bundle reference that is not `namespace/name[@version]`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def parse_bundle_ref(s: str) -> BundleRef:
    """`ops/triage@1.2.0` → `{"namespace": "ops", "name": "triage", "version": "1.2.0"}`."""
    parsed = parse_namespaced_ref(s, "bundle ref", BundleRefParseError)
    return {"namespace": parsed["namespace"], "name": parsed["name"], "version": parsed["version"]}


def parse_bundle_ref_version_required(s: str) -> BundleRef:
    """Like `parse_bundle_ref`, but the `@version` part must be present."""
    ref = parse_bundle_ref(s)
    if not ref["version"]:
        raise BundleRefParseError(f"bundle ref {s!r} needs a version (namespace/name@version)")
    return ref


def format_bundle_ref(ref: BundleRefLike) -> str:
    """`namespace/name`, with `@version` when the reference has one."""
    from phrony.types import bundle_ref_to_dict

    d = bundle_ref_to_dict(ref)
    base = f"{d['namespace']}/{d['name']}"
    return f"{base}@{d['version']}" if d.get("version") else base
