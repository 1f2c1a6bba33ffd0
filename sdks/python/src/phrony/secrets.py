"""The secrets a deployed agent version declares, resolved from the environment like the CLI does
(`secrets.<name>.fromEnv: VAR` → the value of `VAR`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from phrony.client.errors import PhronyError


class MissingSecretError(PhronyError):
    """A secret the agent declares has no value (its environment variable is unset or empty)."""

    def __init__(self, missing: list[tuple[str, str]]) -> None:
        self.missing = missing
        listed = ", ".join(f"{name!r} (environment variable {var})" for name, var in missing)
        super().__init__(f"secrets not set: {listed}; set them (or pass resolved_secrets=...) and retry")


@dataclass(frozen=True)
class DeclaredSecret:
    name: str
    from_env: str


def declared_secrets(manifest_json: bytes) -> list[DeclaredSecret]:
    """`secrets: {<name>: {fromEnv: VAR}}` of a stored manifest snapshot, sorted by name."""
    try:
        manifest = json.loads(manifest_json.decode("utf-8")) if manifest_json else {}
    except ValueError as error:
        raise PhronyError(f"the runtime returned a stored manifest that is not JSON: {error}") from None
    secrets = manifest.get("secrets") if isinstance(manifest, dict) else None
    if secrets is None:
        return []
    if not isinstance(secrets, dict):
        raise PhronyError("the stored manifest's `secrets` is not an object")
    out = []
    for name, definition in secrets.items():
        var = definition.get("fromEnv") if isinstance(definition, dict) else None
        if not isinstance(var, str) or not var:
            raise PhronyError(f"secret {name!r} of the stored manifest has no fromEnv")
        out.append(DeclaredSecret(name, var))
    return sorted(out, key=lambda s: s.name)


def resolve(
    declared: list[DeclaredSecret],
    given: Mapping[str, str] | None = None,
    env: Callable[[str], str | None] = os.environ.get,
) -> dict[str, str]:
    """Each declared secret's value: `given[name]` first, else its environment variable.
    Raises `MissingSecretError` listing every one without a value."""
    given = given or {}
    resolved: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    for secret in declared:
        value = given.get(secret.name) or env(secret.from_env)
        if value:
            resolved[secret.name] = value
        else:
            missing.append((secret.name, secret.from_env))
    if missing:
        raise MissingSecretError(missing)
    return resolved
