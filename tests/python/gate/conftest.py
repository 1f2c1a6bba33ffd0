"""Fixtures of the mock-gate contract tests: build the real binary once (respecting
CARGO_TARGET_DIR) and start gates that are stopped when the test ends."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gate_helpers import REPO_ROOT, RunningGate, copy_walkthrough, start_gate


@pytest.fixture(scope="session")
def mock_gate_bin() -> Path:
    """The `mock-gate` binary: `MOCK_GATE_BIN` if set (CI points it at the workspace build), else
    built with cargo."""
    prebuilt = os.environ.get("MOCK_GATE_BIN")
    if prebuilt:
        binary = Path(prebuilt)
        assert binary.is_file(), f"MOCK_GATE_BIN={prebuilt} does not exist"
        return binary
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO_ROOT / "target")
    if not target.is_absolute():
        target = REPO_ROOT / target
    subprocess.run(["cargo", "build", "--quiet", "-p", "mock-gate"], cwd=REPO_ROOT, check=True)
    binary = target / "debug" / "mock-gate"
    assert binary.is_file(), f"cargo did not produce {binary}"
    return binary


@pytest.fixture
def gate_factory(mock_gate_bin: Path, tmp_path: Path):
    """Starts gates that are stopped at the end of the test."""
    started: list[RunningGate] = []

    def factory(args: list[str], config: Path | None = None) -> RunningGate:
        gate = start_gate(mock_gate_bin, args, tmp_path, config)
        started.append(gate)
        return gate

    yield factory
    for gate in started:
        gate.stop()


@pytest.fixture
def walkthrough(gate_factory, tmp_path: Path) -> RunningGate:
    """A gate running the walkthrough configuration."""
    config = copy_walkthrough(tmp_path / "walkthrough")
    return gate_factory(["--config", str(config)], config)
