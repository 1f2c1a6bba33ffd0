"""Shared fixtures of the Python contract tests (run from the repository root's .venv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto_compat import compile_proto

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def proto_root() -> Path:
    """The repository's `proto/` source tree."""
    return REPO_ROOT / "proto"


@pytest.fixture(scope="session")
def sdk_runtime_descriptor():
    """`phrony.runtime.v1` as the published `phrony` SDK was generated from it."""
    from phrony.gen.phrony.runtime.v1 import runtime_pb2

    return runtime_pb2.DESCRIPTOR


@pytest.fixture(scope="session")
def our_runtime_descriptor(proto_root: Path):
    """`phrony.runtime.v1` compiled from our `proto/`."""
    return compile_proto(proto_root)
